/*
 * tfab-perf raw: RDMA write-with-immediate bandwidth and latency straight through the provider
 * interface, like ib_write_bw / ib_write_lat. Per size, in lockstep:
 *   1. the server clears its target and writes READY;
 *   2. bandwidth: the client streams warm-up writes and then `iters` timed writes
 *      (immediate = index) with `window` in flight; the server counts them, checks the data
 *      with --verify, and answers ACK; the clock runs from the last warm-up completion to ACK;
 *   3. latency: ping-pong of the same size, warm-up rounds first; the one-way latency is half
 *      a round trip. With --request-bytes, each side writes a message of that size after its
 *      ping (immediate IMM_REQUEST), as the tensor ping-pong posts its next receive's request
 *      after its send: the fabric's share of that ping-pong's time.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tfab/status.h>

#include "perf.h"
#include "util/time.h"

#define IMM_READY 0xffffff01u
#define IMM_ACK_OK 0xffffff02u
#define IMM_ACK_BAD 0xffffff03u
#define IMM_DONE 0xffffff04u
#define IMM_PING 0x80000000u	/* | iteration; bandwidth writes stay below it */
#define IMM_REQUEST 0x40000000u /* | iteration: --request-bytes' messages */

struct raw_state {
	struct perf_pair *p;
	uint64_t done;		/* local write completions */
	uint64_t bw_seen;	/* bandwidth writes landed here */
	uint8_t *bw_map;	/* --verify: how often each index landed */
	unsigned iters;		/* timed */
	unsigned warmup;	/* untimed, before them */
	int64_t ping_seen;	/* last ping-pong index landed, -1 before */
	uint64_t requests_seen; /* --request-bytes' messages landed */
	int err;
	uint64_t deadline;
	unsigned polls;
	bool sock_quiet; /* the bootstrap socket carries nothing while this runs */
};

/*
 * Nothing travels on the bootstrap socket during a run, so data or EOF there means the other
 * process went away: fail now rather than at the deadline.
 */
static bool peer_gone(struct raw_state *s)
{
	struct pollfd pfd = {.fd = s->p->sock, .events = POLLIN};

	if (!s->sock_quiet || (++s->polls & 255) || s->p->sock < 0)
		return false;
	return poll(&pfd, 1, 0) > 0;
}

unsigned perf_default_iters(size_t size)
{
	/* About 2 GiB per size, at least 32 and at most 100000 writes. */
	size_t n = (2ull << 30) / (size ? size : 1);

	if (n < 32)
		n = 32;
	if (n > 100000)
		n = 100000;
	return (unsigned)n;
}

void perf_fill(uint8_t *buf, size_t len, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;

	for (size_t i = 0; i < len; i++) {
		if ((i & 7) == 0)
			x = x * 6364136223846793005ull + 1442695040888963407ull;
		buf[i] = (uint8_t)(x >> (8 * (i & 7)));
	}
}

bool perf_check(const uint8_t *buf, size_t len, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;

	for (size_t i = 0; i < len; i++) {
		if ((i & 7) == 0)
			x = x * 6364136223846793005ull + 1442695040888963407ull;
		if (buf[i] != (uint8_t)(x >> (8 * (i & 7))))
			return false;
	}
	return true;
}

/* Poll once; returns false once an error or the deadline has ended the run. */
static bool raw_poll(struct raw_state *s)
{
	struct tfab_event ev[64];
	int n = s->p->ops->poll(s->p->ep, ev, 64);

	if (n < 0) {
		s->err = n;
		return false;
	}
	for (int i = 0; i < n; i++) {
		switch (ev[i].type) {
		case TFAB_EV_WRITE_DONE:
			s->done++;
			break;
		case TFAB_EV_REMOTE_WRITE:
			if (ev[i].imm >= IMM_READY) {
				/* One control message at a time is the protocol. */
				if (s->p->ctrl) {
					s->err = -TFAB_ERR_PROTOCOL;
					return false;
				}
				s->p->ctrl = ev[i].imm;
			} else if (ev[i].imm & IMM_REQUEST) {
				s->requests_seen++;
			} else if (ev[i].imm & IMM_PING) {
				s->ping_seen = ev[i].imm & ~IMM_PING;
			} else {
				s->bw_seen++;
				if (s->bw_map && ev[i].imm < s->warmup + s->iters &&
				    s->bw_map[ev[i].imm] < 255)
					s->bw_map[ev[i].imm]++;
			}
			break;
		case TFAB_EV_ERROR:
			fprintf(stderr, "tfab-perf: write failed: %s (%s)\n",
				tfab_strerror(ev[i].status), ev[i].errmsg ? ev[i].errmsg : "");
			s->err = ev[i].status ? ev[i].status : -EIO;
			return false;
		}
	}
	if (tfab__now_ms() > s->deadline) {
		s->err = -ETIMEDOUT;
		return false;
	}
	if (peer_gone(s)) {
		fprintf(stderr, "tfab-perf: the other process went away\n");
		s->err = -TFAB_ERR_PEER_FAILED;
		return false;
	}
	return true;
}

/* Write len bytes at off in the source to off in the peer's region, waiting out -EAGAIN. */
static int post_at(struct raw_state *s, size_t off, size_t len, uint32_t imm, bool inject)
{
	struct perf_pair *p = s->p;
	unsigned flags = inject ? TFAB_WRITE_INJECT : 0;
	int rc;

	for (;;) {
		rc = p->ops->write_imm(p->ep, p->peer, p->src + off, len, p->smr,
				       p->remote_raddr + off, p->remote_rkey, imm, flags, NULL);
		if (rc != -EAGAIN)
			break;
		if (!raw_poll(s))
			return s->err;
	}
	if (rc)
		fprintf(stderr, "tfab-perf: posting a write: %s\n", tfab_strerror(rc));
	return rc;
}

/*
 * --request-bytes: the message a side writes after its ping of round i, as a tensor fetch's
 * request goes after the send; it lands past the pings' bytes, at the region's end.
 */
static int post_request(struct raw_state *s, const struct perf_opts *o, unsigned i,
			uint64_t *signaled)
{
	struct perf_pair *p = s->p;
	size_t len = o->request_bytes, off = p->buf_len - len;
	bool inject = len <= p->caps->inject_size;
	int rc;

	if (!len)
		return 0;
	rc = post_at(s, off, len, IMM_REQUEST | i, inject);
	if (rc == 0 && !inject)
		(*signaled)++;
	return rc;
}

/* Wait for a control immediate from the peer. */
static int wait_ctrl(struct raw_state *s, uint32_t *imm_p)
{
	while (!s->p->ctrl)
		if (!raw_poll(s))
			return s->err;
	*imm_p = s->p->ctrl;
	s->p->ctrl = 0;
	return 0;
}

static int drain(struct raw_state *s, uint64_t posted)
{
	while (s->done < posted)
		if (!raw_poll(s))
			return s->err;
	return 0;
}

unsigned perf_lat_iters(unsigned iters)
{
	return iters < 10000 ? iters : 10000;
}

/* Writes in flight when --window is not given: 16, but at most 256 MiB in flight. */
unsigned perf_window_of(size_t size)
{
	size_t w = (256u << 20) / (size ? size : 1);

	return w > 16 ? 16 : w < 2 ? 2 : (unsigned)w;
}

static unsigned warmup_of(unsigned iters)
{
	return iters / 10 ? iters / 10 : 1;
}

static int client(struct raw_state *s, const struct perf_opts *o, size_t size,
		  struct perf_result *res)
{
	struct perf_pair *p = s->p;
	bool inject = size <= p->caps->inject_size;
	uint64_t posted = 0, posted_signaled = 0, t0 = 0, t1;
	unsigned li = perf_lat_iters(s->iters);
	uint32_t imm = 0;
	int rc;

	if (o->verify)
		perf_fill(p->src, size, size);
	rc = wait_ctrl(s, &imm);
	if (rc)
		return rc;
	if (imm != IMM_READY)
		return -TFAB_ERR_PROTOCOL;

	/* Bandwidth: keep `window` writes in flight; time from the last warm-up completion. */
	uint64_t total = (uint64_t)s->warmup + s->iters;

	struct perf_bw_clock bw = {.start_ns = tfab__now_ns()};

	while (s->done < total) {
		while (posted < total && posted - s->done < res->window) {
			rc =
			    p->ops->write_imm(p->ep, p->peer, p->src, size, p->smr, p->remote_raddr,
					      p->remote_rkey, (uint32_t)posted, 0, NULL);
			if (rc == -EAGAIN)
				break;
			if (rc) {
				fprintf(stderr, "tfab-perf: posting a write: %s\n",
					tfab_strerror(rc));
				return rc;
			}
			posted++;
		}
		if (!raw_poll(s))
			return s->err;
		perf_bw_look(&bw, tfab__now_ns(), s->done, s->warmup);
	}
	rc = wait_ctrl(s, &imm);
	if (rc)
		return rc;
	posted_signaled = posted;
	t1 = tfab__now_ns();
	res->gbps = perf_bw_gbps(&bw, size, total, t1);
	res->rate = perf_bw_rate(&bw, total, t1);
	res->verified = imm == IMM_ACK_OK;
	if (imm != IMM_ACK_OK && imm != IMM_ACK_BAD)
		return -TFAB_ERR_PROTOCOL;

	/* Latency: ping-pong, the clock started after the warm-up rounds. */
	unsigned lw = warmup_of(li);

	for (unsigned i = 0; i < li + lw; i++) {
		if (i == lw)
			t0 = tfab__now_ns();
		rc = post_at(s, 0, size, IMM_PING | i, inject);
		if (rc)
			return rc;
		if (!inject)
			posted_signaled++;
		rc = post_request(s, o, i, &posted_signaled);
		if (rc)
			return rc;
		while (s->ping_seen != (int64_t)i)
			if (!raw_poll(s))
				return s->err;
	}
	t1 = tfab__now_ns();
	res->lat_us = (double)(t1 - t0) / 1000.0 / (2.0 * li);
	if (o->verify && !perf_check(p->dst, size, size + 1))
		res->verified = false;
	/* --request-bytes: every round's message from the server, the last one too */
	while (o->request_bytes && s->requests_seen < (uint64_t)li + lw)
		if (!raw_poll(s))
			return s->err;
	return drain(s, posted_signaled);
}

static int server(struct raw_state *s, const struct perf_opts *o, size_t size)
{
	struct perf_pair *p = s->p;
	bool inject = size <= p->caps->inject_size, ok = true;
	uint64_t posted = 0;
	unsigned li = perf_lat_iters(s->iters);
	int rc;

	if (o->verify) {
		memset(p->dst, 0, size);
		perf_fill(p->src, size, size + 1);
	}
	rc = post_at(s, 0, 0, IMM_READY, false);
	if (rc)
		return rc;
	posted++;
	while (s->bw_seen < (uint64_t)s->warmup + s->iters)
		if (!raw_poll(s))
			return s->err;
	if (o->verify) {
		ok = perf_check(p->dst, size, size);
		for (unsigned i = 0; i < s->warmup + s->iters && ok; i++)
			ok = s->bw_map[i] == 1;
		if (!ok)
			fprintf(stderr, "tfab-perf: %zu-byte writes arrived damaged or repeated\n",
				size);
	}
	rc = post_at(s, 0, 0, ok ? IMM_ACK_OK : IMM_ACK_BAD, false);
	if (rc)
		return rc;
	posted++;
	for (unsigned i = 0; i < li + warmup_of(li); i++) {
		while (s->ping_seen != (int64_t)i)
			if (!raw_poll(s))
				return s->err;
		rc = post_at(s, 0, size, IMM_PING | i, inject);
		if (rc)
			return rc;
		if (!inject)
			posted++;
		rc = post_request(s, o, i, &posted);
		if (rc)
			return rc;
	}
	return drain(s, posted);
}

int perf_raw_run(struct perf_pair *p, const struct perf_opts *o, size_t size,
		 struct perf_result *res)
{
	struct raw_state s = {
	    .p = p,
	    .iters = o->iters ? o->iters : perf_default_iters(size),
	    .ping_seen = -1,
	    .sock_quiet = true,
	};

	s.warmup = warmup_of(s.iters);
	int rc;

	if (size > p->buf_len || size > p->caps->max_msg_size)
		return -EMSGSIZE;
	/* Bound the whole size: the configured wait, plus time for slow fabrics to move it. */
	s.deadline = tfab__now_ms() + (uint64_t)o->timeout_ms;
	if (o->verify) {
		s.bw_map = calloc((size_t)s.warmup + s.iters, 1);
		if (!s.bw_map)
			return -ENOMEM;
	}
	memset(res, 0, sizeof(*res));
	res->bytes = size;
	res->iters = s.iters;
	res->window = o->window ? o->window : perf_window_of(size);
	rc = p->client ? client(&s, o, size, res) : server(&s, o, size);
	free(s.bw_map);
	if (rc == -ETIMEDOUT)
		fprintf(stderr, "tfab-perf: %s side timed out at %zu bytes after %d ms\n",
			p->client ? "client" : "server", size, o->timeout_ms);
	return rc;
}

/*
 * The end of a run. On a manual-progress fabric a write completes only while its target
 * polls, so the client keeps polling until the server has seen its last write complete and
 * said so by closing the bootstrap socket.
 */
int perf_raw_finish(struct perf_pair *p, const struct perf_opts *o)
{
	struct raw_state s = {.p = p, .ping_seen = -1};
	uint32_t imm = 0;
	int rc;

	s.deadline = tfab__now_ms() + (uint64_t)o->timeout_ms;
	if (!p->client) {
		rc = post_at(&s, 0, 0, IMM_DONE, false);
		if (rc == 0)
			rc = drain(&s, 1);
		return rc;
	}
	rc = wait_ctrl(&s, &imm);
	if (rc == 0 && imm != IMM_DONE)
		rc = -TFAB_ERR_PROTOCOL;
	while (rc == 0) {
		struct pollfd pfd = {.fd = p->sock, .events = POLLIN};

		if (poll(&pfd, 1, 0) > 0)
			break;
		if (!raw_poll(&s))
			rc = s.err;
	}
	return rc;
}
