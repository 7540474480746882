/* TCP bootstrap sockets with bounded waits. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/sock.h"
#include "util/time.h"

int tfab__sock_parse_hostport(const char *text, char *host, size_t hostlen, uint16_t *port_p)
{
	const char *colon, *hs = text, *he;
	unsigned long port;
	char *end;

	if (text[0] == '[') {
		he = strchr(text, ']');
		if (!he || he[1] != ':')
			return -EINVAL;
		hs = text + 1;
		colon = he + 1;
	} else {
		colon = strrchr(text, ':');
		if (!colon)
			return -EINVAL;
		he = colon;
	}
	if ((size_t)(he - hs) >= hostlen)
		return -EINVAL;
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	if (errno || end == colon + 1 || *end || port > 65535)
		return -EINVAL;
	memcpy(host, hs, (size_t)(he - hs));
	host[he - hs] = '\0';
	*port_p = (uint16_t)port;
	return 0;
}

static int remaining_ms(uint64_t deadline_ms)
{
	uint64_t now = tfab__now_ms();

	return now >= deadline_ms ? 0 : (int)(deadline_ms - now);
}

static int wait_fd(int fd, short events, uint64_t deadline_ms)
{
	struct pollfd pfd = {.fd = fd, .events = events};
	int rc;

	for (;;) {
		rc = poll(&pfd, 1, remaining_ms(deadline_ms));
		if (rc > 0)
			return 0;
		if (rc == 0)
			return -ETIMEDOUT;
		if (errno != EINTR)
			return -errno;
	}
}

static int resolve(const char *host, uint16_t port, int passive, struct addrinfo **res_p)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_family = AF_UNSPEC};
	char service[8];
	int rc;

	if (passive)
		hints.ai_flags = AI_PASSIVE;
	snprintf(service, sizeof(service), "%u", port);
	rc = getaddrinfo(host, service, &hints, res_p);
	if (rc)
		return rc == EAI_SYSTEM ? -errno : -EHOSTUNREACH;
	return 0;
}

int tfab__sock_listen(const char *host, uint16_t port, int *fd_p, uint16_t *port_p)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	struct addrinfo *res, *ai;
	int fd = -1, rc, one = 1;

	rc = resolve(host, port, 1, &res);
	if (rc)
		return rc;
	rc = -EADDRNOTAVAIL;
	for (ai = res; ai; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			rc = -errno;
			continue;
		}
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		/*
		 * The system's maximum backlog (Linux silently caps it at net.core.somaxconn):
		 * a connect that overflows the queue is dropped and waits out a SYN
		 * retransmission, seconds, when many ranks connect at once.
		 */
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, INT_MAX) == 0) {
			rc = 0;
			break;
		}
		rc = -errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (rc)
		return rc;
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 && port_p)
		*port_p = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
							 : ((struct sockaddr_in *)&ss)->sin_port);
	*fd_p = fd;
	return 0;
}

int tfab__sock_accept(int lfd, int timeout_ms, int *fd_p)
{
	uint64_t deadline = tfab__now_ms() + (uint64_t)timeout_ms;
	int fd, rc, one = 1;

	for (;;) {
		rc = wait_fd(lfd, POLLIN, deadline);
		if (rc)
			return rc;
		fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd >= 0)
			break;
		if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED)
			return -errno;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	*fd_p = fd;
	return 0;
}

/* One non-blocking connect attempt, bounded by the deadline. */
static int connect_once(const struct addrinfo *ai, uint64_t deadline, int *fd_p)
{
	int fd, rc, err = 0, flags;
	socklen_t el = sizeof(err);

	fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	flags = fcntl(fd, F_GETFL);
	fcntl(fd, F_SETFL, flags | O_NONBLOCK);
	rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
	if (rc < 0 && errno == EINPROGRESS) {
		rc = wait_fd(fd, POLLOUT, deadline);
		if (rc == 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err)
			rc = -err;
	} else if (rc < 0) {
		rc = -errno;
	}
	if (rc) {
		close(fd);
		return rc;
	}
	fcntl(fd, F_SETFL, flags);
	*fd_p = fd;
	return 0;
}

int tfab__sock_connect(const char *host, uint16_t port, int timeout_ms, int *fd_p)
{
	uint64_t deadline = tfab__now_ms() + (uint64_t)timeout_ms;
	struct addrinfo *res, *ai;
	int rc, fd = -1, one = 1;

	rc = resolve(host, port, 0, &res);
	if (rc)
		return rc;
	for (;;) {
		for (ai = res; ai; ai = ai->ai_next) {
			rc = connect_once(ai, deadline, &fd);
			if (rc == 0)
				break;
		}
		/* The listener may not be up yet: retry refusals until the deadline. */
		if (rc == 0 || (rc != -ECONNREFUSED && rc != -ECONNRESET) ||
		    remaining_ms(deadline) == 0)
			break;
		usleep(20000);
	}
	freeaddrinfo(res);
	if (rc)
		return rc == -EINPROGRESS ? -ETIMEDOUT : rc;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	*fd_p = fd;
	return 0;
}

static int xfer_all(int fd, void *buf, size_t len, int is_send, uint64_t deadline)
{
	char *p = buf;
	ssize_t n;
	int rc;

	while (len) {
		rc = wait_fd(fd, is_send ? POLLOUT : POLLIN, deadline);
		if (rc)
			return rc;
		if (is_send)
			n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
		else
			n = recv(fd, p, len, MSG_DONTWAIT);
		if (n == 0)
			return -ECONNRESET;
		if (n < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			return errno == EPIPE ? -ECONNRESET : -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int tfab__sock_send_msg(int fd, const void *buf, uint32_t len, int timeout_ms)
{
	uint64_t deadline = tfab__now_ms() + (uint64_t)timeout_ms;
	uint8_t hdr[4] = {(uint8_t)(len >> 24), (uint8_t)(len >> 16), (uint8_t)(len >> 8),
			  (uint8_t)len};
	int rc;

	rc = xfer_all(fd, hdr, sizeof(hdr), 1, deadline);
	if (rc == 0 && len)
		rc = xfer_all(fd, (void *)(uintptr_t)buf, len, 1, deadline);
	return rc;
}

int tfab__sock_recv_msg(int fd, void *buf, uint32_t cap, uint32_t *len_p, int timeout_ms)
{
	uint64_t deadline = tfab__now_ms() + (uint64_t)timeout_ms;
	uint8_t hdr[4];
	uint32_t len;
	int rc;

	rc = xfer_all(fd, hdr, sizeof(hdr), 0, deadline);
	if (rc)
		return rc;
	len = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
	if (len > cap)
		return -EMSGSIZE;
	if (len) {
		rc = xfer_all(fd, buf, len, 0, deadline);
		if (rc)
			return rc;
	}
	*len_p = len;
	return 0;
}
