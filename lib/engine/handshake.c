/*
 * Bootstrap handshakes, many at once: see handshake.h. One poll() over the listening socket
 * and every connection in its handshake; each connection's bytes go through the framing
 * parser (util/sock.c), the authentication (auth.c) and the owner's messages, and what goes
 * back is queued and sent as the socket takes it. Nothing here waits on one connection.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <tfab/status.h>

#include "engine/engine.h"
#include "engine/handshake.h"
#include "util/log.h"
#include "util/time.h"

#define SUBSYS "bootstrap"
/* New connections taken per wake-up, so that a flood does not starve the ones in hand. */
#define ACCEPT_BATCH 64
/* Messages read from one connection per wake-up, for the same reason. */
#define READ_BATCH 8

void tfab__hs_set_init(struct tfab_hs_set *set, struct tfab_context *ctx,
		       const struct tfab_hs_ops *ops, void *owner, const char *who,
		       unsigned timeout_ms)
{
	*set = (struct tfab_hs_set){
	    .ctx = ctx, .ops = ops, .owner = owner, .who = who, .timeout_ms = timeout_ms};
	tfab__list_init(&set->live);
}

static void hs_unlink(struct tfab_hs *hs)
{
	if (hs->link.next != &hs->link) {
		tfab__list_del(&hs->link);
		hs->set->n--;
	}
}

void tfab__hs_free(struct tfab_hs *hs)
{
	if (!hs)
		return;
	hs_unlink(hs);
	if (hs->state != TFAB_HS_DONE && hs->set->ops->drop)
		hs->set->ops->drop(hs);
	if (hs->fd >= 0)
		close(hs->fd);
	tfab__frame_tx_free(&hs->tx);
	free(hs->buf);
	free(hs->held);
	free(hs);
}

int tfab__hs_expect(struct tfab_hs *hs, uint32_t cap, bool tagged, const char *awaited)
{
	uint32_t room = cap > TFAB_AUTH_MAC ? cap : TFAB_AUTH_MAC;

	if (room > hs->buf_cap) {
		uint8_t *p = realloc(hs->buf, room);

		if (!p)
			return -ENOMEM;
		hs->buf = p;
		hs->buf_cap = room;
	}
	hs->tagged = tagged;
	hs->awaited = awaited;
	tfab__frame_rx_init(&hs->rx, hs->buf, cap);
	return 0;
}

int tfab__hs_put(struct tfab_hs *hs, const void *msg, uint32_t len, bool tagged)
{
	int rc = tfab__frame_tx_put(&hs->tx, msg, len);

	if (rc == 0 && tagged)
		rc = tfab__auth_tag_put(&hs->auth, msg, len, &hs->tx);
	return rc;
}

static uint64_t min_u64(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

/* Closed: its end, reported or not. */
static void hs_close(struct tfab_hs *hs, enum tfab_hs_state state)
{
	if (hs->fd >= 0)
		close(hs->fd);
	hs->fd = -1;
	hs->state = state;
}

/*
 * The handshake failed with status (hs->why says why): an accepted one is logged as refused.
 * A refusal of ours still goes out (DRAIN), and so do answers queued (LINGER), within a
 * second and never past its deadline; else the connection closes now.
 */
static void hs_fail(struct tfab_hs *hs, int status)
{
	uint64_t now = tfab__now_ms(), until = min_u64(now + TFAB_HS_LINGER_MS, hs->deadline_ms);

	if (!hs->why[0])
		snprintf(hs->why, sizeof(hs->why), "%s", tfab_strerror(status));
	hs->status = status;
	free(hs->held);
	hs->held = NULL;
	if (!hs->report) {
		hs->set->refused++;
		TFAB_WARN(SUBSYS, "%s: refused %s: %s", hs->set->who, hs->addr, hs->why);
	}
	if (hs->auth.refused && until > now) {
		hs->state = TFAB_HS_DRAIN;
		hs->until_ms = until;
	} else if (!tfab__frame_tx_empty(&hs->tx) && until > now) {
		hs->state = TFAB_HS_LINGER;
		hs->until_ms = until;
	} else {
		hs_close(hs, TFAB_HS_FAILED);
	}
}

static void hs_failf(struct tfab_hs *hs, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void hs_failf(struct tfab_hs *hs, int status, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(hs->why, sizeof(hs->why), fmt, ap);
	va_end(ap);
	hs_fail(hs, status);
}

static bool hs_reading(const struct tfab_hs *hs)
{
	return hs->state == TFAB_HS_AUTH || hs->state == TFAB_HS_OWNER;
}

static bool hs_over(const struct tfab_hs *hs)
{
	return hs->state == TFAB_HS_DONE || hs->state == TFAB_HS_FAILED ||
	       hs->state == TFAB_HS_CLOSED;
}

static const char *hs_awaited(const struct tfab_hs *hs)
{
	if (hs->state == TFAB_HS_AUTH)
		return hs->auth.stage == TFAB_AUTH_HELLO ? "its HELLO" : "its PROOF";
	if (hs->held)
		return "its message's tag";
	return hs->awaited ? hs->awaited : "its next message";
}

/* Authenticated, or no key: the owner's part begins. */
static void hs_start(struct tfab_hs *hs)
{
	int rc;

	hs->state = TFAB_HS_OWNER;
	hs->why[0] = '\0';
	rc = hs->set->ops->start(hs);
	if (rc)
		hs_fail(hs, rc);
}

/* One whole message from the peer (msg NULL: one of len bytes, too long to read). */
static void hs_take(struct tfab_hs *hs, const uint8_t *msg, uint32_t len)
{
	uint8_t *held = NULL;
	int rc;

	if (hs->state == TFAB_HS_AUTH) {
		rc = tfab__auth_take(&hs->auth, msg, len, &hs->tx, hs->why, sizeof(hs->why));
		if (rc < 0)
			hs_fail(hs, rc);
		else if (rc == 1)
			hs_start(hs);
		else
			tfab__frame_rx_init(&hs->rx, hs->buf, TFAB_AUTH_MSG_MAX);
		return;
	}
	if (hs->tagged && hs->auth.on && !hs->held) {
		if (!msg) {
			hs_failf(hs, -TFAB_ERR_PROTOCOL,
				 "it sent a message of %u bytes where %s (at most %u) was due", len,
				 hs_awaited(hs), hs->rx.cap);
			return;
		}
		/* the message waits for its tag, which comes next */
		hs->held = malloc(len ? len : 1);
		if (!hs->held) {
			hs_fail(hs, -ENOMEM);
			return;
		}
		memcpy(hs->held, msg, len);
		hs->held_len = len;
		tfab__frame_rx_init(&hs->rx, hs->buf, TFAB_AUTH_MAC);
		return;
	}
	if (hs->held) {
		rc = tfab__auth_tag_check(&hs->auth, hs->held, hs->held_len, msg, msg ? len : 0,
					  &hs->tx, hs->why, sizeof(hs->why));
		if (rc) {
			hs_fail(hs, rc);
			return;
		}
		held = hs->held;
		msg = held;
		len = hs->held_len;
		hs->held = NULL;
	} else if (!msg) {
		hs_failf(hs, -TFAB_ERR_PROTOCOL,
			 "it sent a message of %u bytes where %s (at most %u) was due", len,
			 hs_awaited(hs), hs->rx.cap);
		return;
	} else if (hs->tagged) {
		rc = tfab__auth_unkeyed(&hs->auth, msg, len, &hs->tx, hs->why, sizeof(hs->why));
		if (rc) {
			hs_fail(hs, rc);
			return;
		}
	}
	hs->why[0] = '\0';
	rc = hs->set->ops->take(hs, msg, len);
	free(held);
	if (rc < 0)
		hs_fail(hs, rc);
	else if (rc == 1) /* done once what it queued is out: the connection is the owner's then */
		hs->state = tfab__frame_tx_empty(&hs->tx) ? TFAB_HS_DONE : TFAB_HS_FLUSH;
}

/* Sends what is queued: false when the connection broke (hs has ended). */
static bool hs_flush(struct tfab_hs *hs)
{
	int rc;

	if (tfab__frame_tx_empty(&hs->tx))
		return true;
	rc = tfab__sock_tx(hs->fd, &hs->tx);
	if (rc == 0 || rc == -EAGAIN)
		return true;
	if (hs_reading(hs) || hs->state == TFAB_HS_FLUSH)
		hs_failf(hs, rc, "the connection broke: %s", tfab_strerror(rc));
	else
		hs_close(hs, TFAB_HS_CLOSED);
	return false;
}

/* Moves hs on with what its socket allows now. */
static void hs_step(struct tfab_hs *hs)
{
	uint8_t sink[4096];
	int rc;

	if (!hs_flush(hs))
		return;
	switch (hs->state) {
	case TFAB_HS_FLUSH:
		/* nothing is read: what follows is the owner's (heartbeats) */
		if (tfab__frame_tx_empty(&hs->tx))
			hs->state = TFAB_HS_DONE;
		return;
	case TFAB_HS_LINGER:
		if (tfab__frame_tx_empty(&hs->tx))
			hs_close(hs, hs->status ? TFAB_HS_FAILED : TFAB_HS_CLOSED);
		return;
	case TFAB_HS_DRAIN:
		if (!tfab__frame_tx_empty(&hs->tx))
			return;
		if (!hs->shut)
			shutdown(hs->fd, SHUT_WR);
		hs->shut = true;
		/* closing with its bytes unread would reset the connection, the refusal with it */
		for (int i = 0; i < READ_BATCH; i++) {
			ssize_t n = recv(hs->fd, sink, sizeof(sink), MSG_DONTWAIT);

			if (n > 0)
				continue;
			if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
				hs_close(hs, TFAB_HS_FAILED);
			return;
		}
		return;
	case TFAB_HS_AUTH:
	case TFAB_HS_OWNER:
		break;
	default:
		return;
	}
	for (int i = 0; i < READ_BATCH && hs_reading(hs); i++) {
		uint32_t got = hs->rx.got;

		rc = tfab__sock_rx(hs->fd, &hs->rx);
		hs->heard |= hs->rx.got > got;
		if (rc == 0)
			break;
		if (rc == 1)
			hs_take(hs, hs->rx.buf, hs->rx.len);
		else if (rc == -EMSGSIZE)
			hs_take(hs, NULL, hs->rx.len);
		else if (rc == -ECONNRESET && hs->rx.got)
			hs_failf(hs, rc, "it closed the connection in the middle of %s",
				 hs_awaited(hs));
		else if (rc == -ECONNRESET)
			hs_failf(hs, rc, "it closed the connection where %s was due",
				 hs_awaited(hs));
		else
			hs_failf(hs, rc, "the connection broke: %s", tfab_strerror(rc));
	}
	/* what the messages read called for goes at once, not at the next wake-up */
	if (!hs_flush(hs) || !tfab__frame_tx_empty(&hs->tx))
		return;
	if (hs->state == TFAB_HS_FLUSH) {
		hs->state = TFAB_HS_DONE;
	} else if (hs->state == TFAB_HS_LINGER) {
		hs_close(hs, hs->status ? TFAB_HS_FAILED : TFAB_HS_CLOSED);
	} else if (hs->state == TFAB_HS_DRAIN && !hs->shut) {
		/* the refusal is out: our end, so that the peer sees it whole and closes */
		shutdown(hs->fd, SHUT_WR);
		hs->shut = true;
	}
}

/* Past its deadline (or its lingering's end): it ends. */
static void hs_expire(struct tfab_hs *hs, uint64_t now)
{
	unsigned ms = hs->set->timeout_ms;

	if ((hs_reading(hs) || hs->state == TFAB_HS_FLUSH) && now >= hs->deadline_ms) {
		if (hs->state == TFAB_HS_FLUSH)
			hs_failf(hs, -ETIMEDOUT, "it did not take our last messages in time");
		else if (hs->acceptor && !hs->heard)
			hs_failf(hs, -ETIMEDOUT,
				 "it sent nothing within %u ms "
				 "(TFAB_HANDSHAKE_TIMEOUT_MS)",
				 ms);
		else if (hs->acceptor)
			hs_failf(hs, -ETIMEDOUT,
				 "%s did not come within %u ms "
				 "(TFAB_HANDSHAKE_TIMEOUT_MS)",
				 hs_awaited(hs), ms);
		else
			hs_failf(hs, -ETIMEDOUT, "%s did not come", hs_awaited(hs));
		if (hs->state == TFAB_HS_LINGER || hs->state == TFAB_HS_DRAIN)
			hs_close(hs, TFAB_HS_FAILED); /* its time is up: nothing more goes */
	} else if ((hs->state == TFAB_HS_LINGER || hs->state == TFAB_HS_DRAIN) &&
		   now >= hs->until_ms) {
		hs_close(hs, hs->status ? TFAB_HS_FAILED : TFAB_HS_CLOSED);
	}
}

static uint64_t hs_wake(const struct tfab_hs *hs)
{
	return hs_reading(hs) || hs->state == TFAB_HS_FLUSH ? hs->deadline_ms : hs->until_ms;
}

static struct tfab_hs *hs_new(struct tfab_hs_set *set, int fd, bool acceptor, const char *addr,
			      uint64_t deadline)
{
	struct tfab_hs *hs = calloc(1, sizeof(*hs));
	struct tfab_context *ctx = set->ctx;
	int flags = fcntl(fd, F_GETFL);

	if (!hs)
		return NULL;
	hs->set = set;
	hs->fd = fd;
	hs->acceptor = acceptor;
	hs->deadline_ms = deadline;
	hs->report = !acceptor;
	snprintf(hs->addr, sizeof(hs->addr), "%s", addr);
	tfab__list_init(&hs->link);
	if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) ||
	    tfab__hs_expect(hs, TFAB_AUTH_MSG_MAX, false, NULL) ||
	    tfab__auth_start(&hs->auth, ctx->auth_key, ctx->auth_key_len, acceptor, NULL,
			     &hs->tx)) {
		hs->fd = -1;
		tfab__hs_free(hs);
		return NULL;
	}
	hs->state = TFAB_HS_AUTH;
	tfab__list_add_tail(&set->live, &hs->link);
	set->n++;
	if (!hs->auth.on)
		hs_start(hs);
	return hs;
}

int tfab__hs_connect(struct tfab_hs_set *set, int fd, const char *addr, uint64_t deadline_ms,
		     struct tfab_hs **hs_p)
{
	struct tfab_hs *hs = hs_new(set, fd, false, addr, deadline_ms);

	if (!hs)
		return -ENOMEM;
	*hs_p = hs;
	return 0;
}

/* New connections on lfd, each a handshake of its own with its own deadline. */
static void accept_new(struct tfab_hs_set *set, int lfd)
{
	for (int i = 0; i < ACCEPT_BATCH && set->n < TFAB_HS_MAX; i++) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		char addr[80];
		int fd, one = 1;

		fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				TFAB_WARN(SUBSYS, "%s: accept: %s", set->who, strerror(errno));
			return;
		}
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		tfab__sock_addr_text((struct sockaddr *)&ss, addr, sizeof(addr));
		TFAB_DEBUG(SUBSYS, "%s: %s connected", set->who, addr);
		if (!hs_new(set, fd, true, addr, tfab__now_ms() + set->timeout_ms)) {
			TFAB_WARN(SUBSYS, "%s: %s: no memory for its handshake", set->who, addr);
			close(fd);
		}
	}
}

/* hs ended: out of the set; returned where the caller takes it, else freed. */
static struct tfab_hs *hs_leave(struct tfab_hs *hs)
{
	hs_unlink(hs);
	if (hs->state == TFAB_HS_DONE || hs->report)
		return hs;
	tfab__hs_free(hs);
	return NULL;
}

static int pfd_room(struct tfab_hs_set *set, unsigned n)
{
	struct pollfd *pfd;
	struct tfab_hs **hss;

	if (n <= set->pfd_cap)
		return 0;
	pfd = realloc(set->pfd, n * sizeof(*pfd));
	if (pfd)
		set->pfd = pfd;
	hss = realloc(set->pfd_hs, n * sizeof(*hss));
	if (hss)
		set->pfd_hs = hss;
	if (!pfd || !hss)
		return -ENOMEM;
	set->pfd_cap = n;
	return 0;
}

int tfab__hs_drive(struct tfab_hs_set *set, int lfd, uint64_t until, struct tfab_hs **done_p)
{
	for (;;) {
		uint64_t now = tfab__now_ms(), wake = until;
		struct tfab_list *l, *t;
		struct tfab_hs *ended;
		unsigned n = 0, first;
		int rc;

		tfab_list_for_each_safe(l, t, &set->live)
		{
			struct tfab_hs *hs = tfab_container_of(l, struct tfab_hs, link);

			hs_expire(hs, now);
			if (hs_over(hs)) {
				ended = hs_leave(hs);
				if (ended) {
					*done_p = ended;
					return 0;
				}
				continue;
			}
			wake = min_u64(wake, hs_wake(hs));
		}
		if (now >= until)
			return -ETIMEDOUT;
		rc = tfab__ctx_aborted(set->ctx);
		if (rc)
			return rc;
		wake = min_u64(wake, now + TFAB_HS_ABORT_POLL_MS);
		if (lfd < 0 && !set->n)
			return -ENOENT;
		rc = pfd_room(set, set->n + 1);
		if (rc)
			return rc;
		if (lfd >= 0 && set->n < TFAB_HS_MAX)
			set->pfd[n++] = (struct pollfd){.fd = lfd, .events = POLLIN};
		first = n;
		tfab_list_for_each_safe(l, t, &set->live)
		{
			struct tfab_hs *hs = tfab_container_of(l, struct tfab_hs, link);
			short ev = 0;

			if (hs->state != TFAB_HS_LINGER && hs->state != TFAB_HS_FLUSH)
				ev |= POLLIN;
			if (!tfab__frame_tx_empty(&hs->tx))
				ev |= POLLOUT;
			set->pfd_hs[n] = hs;
			set->pfd[n++] = (struct pollfd){.fd = hs->fd, .events = ev};
		}
		rc = poll(set->pfd, n, wake > now ? (int)min_u64(wake - now, 1u << 30) : 0);
		if (rc < 0 && errno != EINTR)
			return -errno;
		if (rc <= 0)
			continue;
		for (unsigned i = first; i < n; i++) {
			struct tfab_hs *hs = set->pfd_hs[i];

			if (!set->pfd[i].revents)
				continue;
			hs_step(hs);
			if (hs_over(hs)) {
				ended = hs_leave(hs);
				if (ended) {
					/* the others' events stay with their sockets for the next call */
					*done_p = ended;
					return 0;
				}
			}
		}
		if (first && set->pfd[0].revents)
			accept_new(set, lfd);
	}
}

void tfab__hs_reap(struct tfab_hs_set *set)
{
	uint64_t now = tfab__now_ms();
	struct tfab_list *l, *t;

	tfab_list_for_each_safe(l, t, &set->live)
	{
		struct tfab_hs *hs = tfab_container_of(l, struct tfab_hs, link);

		hs_expire(hs, now);
		if (hs_over(hs) && hs->state != TFAB_HS_DONE && !hs->report)
			tfab__hs_free(hs);
	}
}

void tfab__hs_linger(struct tfab_hs *hs, uint64_t until_ms)
{
	hs->state = TFAB_HS_LINGER;
	hs->status = 0;
	hs->until_ms = until_ms;
	hs->report = false;
	tfab__list_add_tail(&hs->set->live, &hs->link);
	hs->set->n++;
}

void tfab__hs_set_fini(struct tfab_hs_set *set, const char *why)
{
	while (!tfab__list_empty(&set->live)) {
		struct tfab_hs *hs = tfab_container_of(set->live.next, struct tfab_hs, link);

		if (hs->acceptor && hs_reading(hs)) {
			set->refused++;
			TFAB_WARN(SUBSYS, "%s: refused %s: %s was due when %s", set->who, hs->addr,
				  hs_awaited(hs), why);
		}
		tfab__hs_free(hs);
	}
	free(set->pfd);
	free(set->pfd_hs);
	set->pfd = NULL;
	set->pfd_hs = NULL;
	set->pfd_cap = 0;
}
