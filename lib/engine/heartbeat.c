/*
 * Heartbeats (doc/design.md, "Liveness"): a thread of the context's own writes one byte on
 * every peer's bootstrap connection each TFAB_HEARTBEAT_MS, whether or not the application
 * calls progress, so that a peer which stopped (SIGSTOP, a hung host, a partition) falls
 * silent while one that is merely busy does not. The judging side is in peer.c: the liveness
 * checks of progress read what came (tfab__heartbeat_hear) and judge the silence since.
 *
 * The thread touches nothing but its own set of descriptors, under its own lock: a socket
 * leaves the set (tfab__heartbeat_remove) before the engine closes it.
 *
 * A process that destroys a peer says goodbye on its connection first (tfab__heartbeat_bye),
 * so that the other side can tell a peer that left from one that died, whose connection ends
 * as well (tfab_peer_left).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "engine/engine.h"
#include "util/time.h"

#define SUBSYS TFAB_ENGINE_SUBSYS

/* What a heartbeat is on the wire: any byte would do; this one reads well in a capture. */
static const uint8_t BEAT = 'H';
/* The last byte before a connection's end where the peer was destroyed, not its process. */
static const uint8_t BYE = 'B';

struct tfab_heartbeat {
	pthread_mutex_t lock;
	pthread_cond_t cond; /* signalled to stop the thread */
	pthread_t thread;
	bool running, stop;
	unsigned interval_ms;
	int *fds;
	unsigned nfds, cap;
};

static void beat_all(struct tfab_heartbeat *hb)
{
	for (unsigned i = 0; i < hb->nfds; i++) {
		/* A full buffer (a peer that reads nothing) is silence on our side too: no wait. */
		(void)send(hb->fds[i], &BEAT, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
	}
}

static void *heartbeat_main(void *arg)
{
	struct tfab_heartbeat *hb = arg;
	const uint64_t interval = (uint64_t)hb->interval_ms * 1000000ull;
	uint64_t at = tfab__now_ns(), now;

	pthread_mutex_lock(&hb->lock);
	/* An interval first: each connection had its first beat when it was added. */
	for (;;) {
		struct timespec ts;

		at += interval;
		ts.tv_sec = (time_t)(at / 1000000000ull);
		ts.tv_nsec = (long)(at % 1000000000ull);
		while (!hb->stop && pthread_cond_timedwait(&hb->cond, &hb->lock, &ts) != ETIMEDOUT)
			;
		if (hb->stop)
			break;
		beat_all(hb);
		/*
		 * Late by more than an interval (the process was stopped, or had no CPU): the next
		 * beat goes an interval from now. Keeping the old schedule would send every beat
		 * the stall missed at once, a burst; a beat late by less keeps it, so beats do not
		 * drift.
		 */
		now = tfab__now_ns();
		if (now > at + interval)
			at = now;
	}
	pthread_mutex_unlock(&hb->lock);
	return NULL;
}

int tfab__heartbeat_open(unsigned interval_ms, struct tfab_heartbeat **hb_p)
{
	struct tfab_heartbeat *hb;

	*hb_p = NULL;
	if (!interval_ms)
		return 0;
	hb = calloc(1, sizeof(*hb));
	if (!hb)
		return -ENOMEM;
	pthread_mutex_init(&hb->lock, NULL);
	tfab__cond_init_monotonic(&hb->cond);
	hb->interval_ms = interval_ms;
	*hb_p = hb;
	return 0;
}

void tfab__heartbeat_close(struct tfab_heartbeat *hb)
{
	if (!hb)
		return;
	pthread_mutex_lock(&hb->lock);
	hb->stop = true;
	pthread_cond_signal(&hb->cond);
	pthread_mutex_unlock(&hb->lock);
	if (hb->running)
		pthread_join(hb->thread, NULL);
	pthread_cond_destroy(&hb->cond);
	pthread_mutex_destroy(&hb->lock);
	free(hb->fds);
	free(hb);
}

int tfab__heartbeat_add(struct tfab_heartbeat *hb, int fd)
{
	int rc = 0;

	if (!hb)
		return 0;
	/* The kernel stamps what arrives: the silence counts from there (tfab__heartbeat_hear). */
	(void)setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &(int){1}, sizeof(int));
	pthread_mutex_lock(&hb->lock);
	if (hb->nfds == hb->cap) {
		unsigned cap = hb->cap ? 2 * hb->cap : 16;
		int *fds = realloc(hb->fds, cap * sizeof(*fds));

		if (!fds) {
			rc = -ENOMEM;
			goto out;
		}
		hb->fds = fds;
		hb->cap = cap;
	}
	hb->fds[hb->nfds++] = fd;
	/* The first beat goes now: the peer judges us only once it has heard one. */
	(void)send(fd, &BEAT, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
	/* Started with the first peer: a context without bootstrapped peers has no thread. */
	if (!hb->running) {
		rc = -pthread_create(&hb->thread, NULL, heartbeat_main, hb);
		if (rc) {
			hb->nfds--;
			goto out;
		}
		hb->running = true;
	}
out:
	pthread_mutex_unlock(&hb->lock);
	return rc;
}

void tfab__heartbeat_remove(struct tfab_heartbeat *hb, int fd)
{
	if (!hb || fd < 0)
		return;
	pthread_mutex_lock(&hb->lock);
	for (unsigned i = 0; i < hb->nfds; i++) {
		if (hb->fds[i] == fd) {
			hb->fds[i] = hb->fds[--hb->nfds];
			break;
		}
	}
	pthread_mutex_unlock(&hb->lock);
}

uint64_t tfab__heartbeat_arrival_ms(uint64_t now_ms, uint64_t real_now_ns, uint64_t stamp_ns,
				    uint64_t floor_ms)
{
	uint64_t age_ms = real_now_ns > stamp_ns ? (real_now_ns - stamp_ns) / 1000000u : 0;

	/*
	 * Older than the beat before it: the wall clock stepped forward meanwhile, or the stamp
	 * is of another clock. Heard now, then, as if unstamped: never judged sooner for it.
	 */
	if (age_ms >= now_ms || now_ms - age_ms < floor_ms)
		return now_ms;
	return now_ms - age_ms;
}

/* The kernel's stamp (CLOCK_REALTIME, in ns) of what a read returned, or 0 where it has none. */
static uint64_t stamp_of(struct msghdr *msg)
{
	for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS &&
		    c->cmsg_len >= CMSG_LEN(sizeof(struct timespec))) {
			struct timespec ts;

			memcpy(&ts, CMSG_DATA(c), sizeof(ts));
			return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
		}
	}
	return 0;
}

void tfab__heartbeat_bye(int fd)
{
	(void)send(fd, &BYE, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

bool tfab__heartbeat_hear(int fd, uint64_t *heard_ms_p, bool *bye_p)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(struct timespec))];
	} ctl;
	uint8_t buf[256];
	uint64_t stamp = 0;
	bool heard = false, more = false;

	/* Bounded: a peer that streams bytes at us does not hold progress here. */
	for (int reads = 0; reads < 16; reads++) {
		struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf)};
		struct msghdr msg = {.msg_iov = &iov,
				     .msg_iovlen = 1,
				     .msg_control = ctl.buf,
				     .msg_controllen = sizeof(ctl.buf)};
		ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT);

		if (n > 0) {
			heard = true;
			more = n == (ssize_t)sizeof(buf);
			stamp = stamp_of(&msg);
			if (memchr(buf, BYE, (size_t)n))
				*bye_p = true;
		} else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
			if (heard)
				*heard_ms_p = tfab__coarse_ms();
			return true;
		} else if (errno != EINTR) {
			more = false;
			break;
		}
	}
	if (!heard)
		return false;
	/*
	 * When the last beat arrived, not when this read it: an application busy when it came
	 * (a progress call late) starts no silence late. Bytes left unread (a flood), or
	 * unstamped, count as heard now.
	 */
	if (stamp && !more)
		*heard_ms_p = tfab__heartbeat_arrival_ms(
		    tfab__coarse_ms(), tfab__clock_ns(CLOCK_REALTIME), stamp, *heard_ms_p);
	else
		*heard_ms_p = tfab__coarse_ms();
	return false;
}
