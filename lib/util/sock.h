/*
 * TCP bootstrap: listen, accept and connect with bounded waits, and length-prefixed messages
 * (a 4-byte big-endian length, then the bytes). Used to swap endpoint blobs between two
 * processes; never on a data path.
 */
#ifndef TFAB_UTIL_SOCK_H
#define TFAB_UTIL_SOCK_H

#include <stddef.h>
#include <stdint.h>

/* Split "host:port" ("[v6]:port" too). Returns 0 or -EINVAL. */
int tfab__sock_parse_hostport(const char *text, char *host, size_t hostlen, uint16_t *port_p);

/*
 * Listen on host (NULL for any) and port (0 for any), with the system's maximum backlog; the
 * bound port goes to *port_p.
 */
int tfab__sock_listen(const char *host, uint16_t port, int *fd_p, uint16_t *port_p);

/* Accept one connection within timeout_ms. */
int tfab__sock_accept(int lfd, int timeout_ms, int *fd_p);

/* Connect to host:port, retrying refused connections until timeout_ms has passed. */
int tfab__sock_connect(const char *host, uint16_t port, int timeout_ms, int *fd_p);

/* Send one message; every wait bounded by timeout_ms. */
int tfab__sock_send_msg(int fd, const void *buf, uint32_t len, int timeout_ms);

/*
 * Receive one message into buf (capacity cap); its length goes to *len_p. A message longer
 * than cap is -EMSGSIZE; a peer that closed is -ECONNRESET; no message in time is -ETIMEDOUT.
 */
int tfab__sock_recv_msg(int fd, void *buf, uint32_t cap, uint32_t *len_p, int timeout_ms);

#endif
