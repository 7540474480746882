/*
 * TCP bootstrap: listen, accept and connect with bounded waits, and length-prefixed messages
 * (a 4-byte big-endian length, then the bytes). Used to swap endpoint blobs between two
 * processes; never on a data path.
 *
 * The framing is read by a pure parser (struct tfab_frame_rx, fed bytes as they come), so that
 * one side can hold many connections at once without blocking on any (engine/handshake.c), and
 * so that it can be fuzzed (test/fuzz/fuzz_sock_frame.c).
 */
#ifndef TFAB_UTIL_SOCK_H
#define TFAB_UTIL_SOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sockaddr;

/* Split "host:port" ("[v6]:port" too). Returns 0 or -EINVAL. */
int tfab__sock_parse_hostport(const char *text, char *host, size_t hostlen, uint16_t *port_p);

/*
 * Listen on host (NULL for any) and port (0 for any), with the system's maximum backlog; the
 * bound port goes to *port_p. The listening socket does not block (accept4 says EAGAIN when
 * nobody waits). A host that does not resolve is -ENXIO, and says so.
 */
int tfab__sock_listen(const char *host, uint16_t port, int *fd_p, uint16_t *port_p);

/* Accept one connection within timeout_ms. */
int tfab__sock_accept(int lfd, int timeout_ms, int *fd_p);

/*
 * Connect to host:port within timeout_ms, retrying refused connections until then (the
 * listener may not be up yet). Each failure is logged with the address: an unknown host is
 * -ENXIO (with getaddrinfo's reason), a connection still refused at the deadline
 * -ECONNREFUSED (with how long it tried), no answer in time -ETIMEDOUT.
 */
int tfab__sock_connect(const char *host, uint16_t port, int timeout_ms, int *fd_p);

/* "127.0.0.1:5000" or "[::1]:5000" for a socket address (sa NULL, or not IP: "?"). */
void tfab__sock_addr_text(const struct sockaddr *sa, char *buf, size_t len);
/* The address at the other end of fd, as text. */
void tfab__sock_peer_text(int fd, char *buf, size_t len);

/* Send one message; every wait bounded by timeout_ms. */
int tfab__sock_send_msg(int fd, const void *buf, uint32_t len, int timeout_ms);

/*
 * Receive one message into buf (capacity cap); its length goes to *len_p. A message longer
 * than cap is -EMSGSIZE; a peer that closed is -ECONNRESET; no message in time is -ETIMEDOUT.
 */
int tfab__sock_recv_msg(int fd, void *buf, uint32_t cap, uint32_t *len_p, int timeout_ms);

/* The length prefix of a message. */
#define TFAB_FRAME_HDR 4

/*
 * One message being read, byte by byte as they come. The parser asks for no byte past the
 * end of the message it reads, so what follows it on the stream stays there.
 */
struct tfab_frame_rx {
	uint8_t *buf; /* room for cap bytes: the message */
	uint32_t cap; /* the longest message taken */
	uint32_t len; /* the message's length, once its header is in */
	uint32_t got; /* bytes in so far, the header's included */
	uint8_t hdr[TFAB_FRAME_HDR];
};

/* Ready for a message of at most cap bytes into buf. */
void tfab__frame_rx_init(struct tfab_frame_rx *rx, void *buf, uint32_t cap);

/*
 * Where the next bytes go (*dst_p) and how many at most: never past the end of the message.
 * 0 once the message is whole or refused.
 */
size_t tfab__frame_rx_want(struct tfab_frame_rx *rx, uint8_t **dst_p);

/*
 * n bytes (at most what want said) went where want said. Returns 1 when the message is whole
 * (rx->len bytes in rx->buf), 0 while more are to come, -EMSGSIZE when its header says more
 * than cap (rx->len says how many).
 */
int tfab__frame_rx_got(struct tfab_frame_rx *rx, size_t n);

/* The same from memory: takes up to n bytes of in (*used_p says how many). */
int tfab__frame_rx_feed(struct tfab_frame_rx *rx, const uint8_t *in, size_t n, size_t *used_p);

/* Messages framed and waiting to go. */
struct tfab_frame_tx {
	uint8_t *buf;
	size_t len; /* bytes queued */
	size_t off; /* of which sent */
	size_t cap;
};

/* Queue one message (header and bytes). 0 or -ENOMEM. */
int tfab__frame_tx_put(struct tfab_frame_tx *tx, const void *msg, uint32_t len);
void tfab__frame_tx_free(struct tfab_frame_tx *tx);

static inline bool tfab__frame_tx_empty(const struct tfab_frame_tx *tx)
{
	return tx->off == tx->len;
}

/*
 * Without blocking (fd need not be O_NONBLOCK): read what has come of rx's message. Returns 1
 * when it is whole, 0 when the socket has nothing more now, -EMSGSIZE as
 * tfab__frame_rx_got, -ECONNRESET when the peer closed (rx->got says whether it had begun a
 * message), or another negative errno.
 */
int tfab__sock_rx(int fd, struct tfab_frame_rx *rx);

/* Without blocking: send what tx holds. 0 when all is out, -EAGAIN while some is left. */
int tfab__sock_tx(int fd, struct tfab_frame_tx *tx);

#endif
