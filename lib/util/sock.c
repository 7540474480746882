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

#include <arpa/inet.h>

#include "util/log.h"
#include "util/sock.h"
#include "util/time.h"

#define SUBSYS "bootstrap"

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

/* A host that does not resolve is -ENXIO: no such address, which no retry will change. */
static int resolve(const char *host, uint16_t port, int passive, struct addrinfo **res_p)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_family = AF_UNSPEC};
	char service[8];
	int rc;

	if (passive)
		hints.ai_flags = AI_PASSIVE;
	snprintf(service, sizeof(service), "%u", port);
	rc = getaddrinfo(host, service, &hints, res_p);
	if (rc == 0)
		return 0;
	if (rc == EAI_SYSTEM && errno) {
		rc = -errno;
		TFAB_ERROR(SUBSYS, "cannot look up host '%s': %s", host ? host : "*",
			   strerror(-rc));
		return rc;
	}
	TFAB_ERROR(SUBSYS, "unknown host '%s': %s", host ? host : "*", gai_strerror(rc));
	return -ENXIO;
}

void tfab__sock_addr_text(const struct sockaddr *sa, char *buf, size_t len)
{
	char host[INET6_ADDRSTRLEN] = "?";

	if (sa && sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)sa;

		inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
		snprintf(buf, len, "%s:%u", host, ntohs(in->sin_port));
	} else if (sa && sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;

		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
		snprintf(buf, len, "[%s]:%u", host, ntohs(in6->sin6_port));
	} else {
		snprintf(buf, len, "?");
	}
}

void tfab__sock_peer_text(int fd, char *buf, size_t len)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);

	if (getpeername(fd, (struct sockaddr *)&ss, &sl))
		snprintf(buf, len, "?");
	else
		tfab__sock_addr_text((struct sockaddr *)&ss, buf, len);
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
	if (rc) {
		TFAB_ERROR(SUBSYS, "cannot listen on %s port %u: %s", host ? host : "any address",
			   port, strerror(-rc));
		return rc;
	}
	/* accept4 answers EAGAIN, not a wait, when the connection it was told of went away */
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
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
	uint64_t start = tfab__now_ms(), deadline = start + (uint64_t)timeout_ms;
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
	if (rc == -EINPROGRESS)
		rc = -ETIMEDOUT;
	if (rc == -ECONNRESET)
		rc = -ECONNREFUSED;
	if (rc == -ECONNREFUSED)
		TFAB_ERROR(SUBSYS,
			   "connection to %s:%u refused (tried for %llu ms): nothing listens "
			   "there",
			   host, port, (unsigned long long)(tfab__now_ms() - start));
	else if (rc == -ETIMEDOUT)
		TFAB_ERROR(SUBSYS, "no answer from %s:%u within %d ms", host, port, timeout_ms);
	else if (rc)
		TFAB_ERROR(SUBSYS, "cannot connect to %s:%u: %s", host, port, strerror(-rc));
	if (rc)
		return rc;
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
	struct tfab_frame_rx rx;
	int rc;

	tfab__frame_rx_init(&rx, buf, cap);
	for (;;) {
		rc = tfab__sock_rx(fd, &rx);
		if (rc == 1) {
			*len_p = rx.len;
			return 0;
		}
		if (rc)
			return rc;
		rc = wait_fd(fd, POLLIN, deadline);
		if (rc)
			return rc;
	}
}

void tfab__frame_rx_init(struct tfab_frame_rx *rx, void *buf, uint32_t cap)
{
	*rx = (struct tfab_frame_rx){.buf = buf, .cap = cap};
}

/* Whether the header is in and says more than cap: then nothing more is taken. */
static bool rx_refused(const struct tfab_frame_rx *rx)
{
	return rx->got >= TFAB_FRAME_HDR && rx->len > rx->cap;
}

size_t tfab__frame_rx_want(struct tfab_frame_rx *rx, uint8_t **dst_p)
{
	if (rx->got < TFAB_FRAME_HDR) {
		*dst_p = rx->hdr + rx->got;
		return TFAB_FRAME_HDR - rx->got;
	}
	if (rx_refused(rx) || rx->got - TFAB_FRAME_HDR >= rx->len)
		return 0;
	*dst_p = rx->buf + (rx->got - TFAB_FRAME_HDR);
	return rx->len - (rx->got - TFAB_FRAME_HDR);
}

int tfab__frame_rx_got(struct tfab_frame_rx *rx, size_t n)
{
	uint8_t *dst;

	if (n > tfab__frame_rx_want(rx, &dst))
		return -EINVAL;
	rx->got += (uint32_t)n;
	if (rx->got < TFAB_FRAME_HDR)
		return 0;
	if (rx->got == TFAB_FRAME_HDR && n)
		rx->len = (uint32_t)rx->hdr[0] << 24 | (uint32_t)rx->hdr[1] << 16 |
			  (uint32_t)rx->hdr[2] << 8 | rx->hdr[3];
	if (rx_refused(rx))
		return -EMSGSIZE;
	return rx->got - TFAB_FRAME_HDR == rx->len;
}

int tfab__frame_rx_feed(struct tfab_frame_rx *rx, const uint8_t *in, size_t n, size_t *used_p)
{
	size_t used = 0;
	int rc = 0;

	for (;;) {
		uint8_t *dst;
		size_t want = tfab__frame_rx_want(rx, &dst);

		if (want > n - used)
			want = n - used;
		memcpy(want ? dst : rx->hdr, in + used, want);
		used += want;
		rc = tfab__frame_rx_got(rx, want);
		if (rc || used == n)
			break;
	}
	*used_p = used;
	return rc;
}

int tfab__frame_tx_put(struct tfab_frame_tx *tx, const void *msg, uint32_t len)
{
	size_t need;
	uint8_t *p;

	if (tx->off == tx->len)
		tx->off = tx->len = 0;
	need = tx->len + TFAB_FRAME_HDR + len;
	if (need > tx->cap) {
		size_t cap = tx->cap ? tx->cap : 256;

		while (cap < need)
			cap *= 2;
		p = realloc(tx->buf, cap);
		if (!p)
			return -ENOMEM;
		tx->buf = p;
		tx->cap = cap;
	}
	p = tx->buf + tx->len;
	p[0] = (uint8_t)(len >> 24);
	p[1] = (uint8_t)(len >> 16);
	p[2] = (uint8_t)(len >> 8);
	p[3] = (uint8_t)len;
	if (len)
		memcpy(p + TFAB_FRAME_HDR, msg, len);
	tx->len = need;
	return 0;
}

void tfab__frame_tx_free(struct tfab_frame_tx *tx)
{
	free(tx->buf);
	*tx = (struct tfab_frame_tx){0};
}

int tfab__sock_rx(int fd, struct tfab_frame_rx *rx)
{
	for (;;) {
		uint8_t *dst;
		size_t want = tfab__frame_rx_want(rx, &dst);
		ssize_t n;
		int rc;

		if (!want)
			return rx_refused(rx) ? -EMSGSIZE : 1;
		n = recv(fd, dst, want, MSG_DONTWAIT);
		if (n == 0)
			return -ECONNRESET;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			return errno == EPIPE ? -ECONNRESET : -errno;
		}
		rc = tfab__frame_rx_got(rx, (size_t)n);
		if (rc)
			return rc;
	}
}

int tfab__sock_tx(int fd, struct tfab_frame_tx *tx)
{
	while (tx->off < tx->len) {
		ssize_t n =
		    send(fd, tx->buf + tx->off, tx->len - tx->off, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return -EAGAIN;
			return errno == EPIPE ? -ECONNRESET : -errno;
		}
		tx->off += (size_t)n;
	}
	tx->off = tx->len = 0;
	return 0;
}
