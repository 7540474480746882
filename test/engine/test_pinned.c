/*
 * Engine behaviours as doc/design.md and doc/protocol.md state them, each pinned by a
 * scenario between two processes (mp.c) on a pair of contexts of its own, made with the
 * settings it needs:
 * - meta_lru: the meta-data cache's bound evicts the least recently used key, and a hit
 *   makes its key the most recently used (TFAB_META_CACHE_ENTRIES);
 * - ahead_bound: in no-request mode the requests standing for a key reach their bound and
 *   never pass it: the depth, 4 MiB of destinations, an eighth of TFAB_POOL_CACHE, one at
 *   least (tfab_recv_ahead);
 * - cancel_credits: a CANCEL makes its reader return the credits it holds at its next flush,
 *   fewer than a batch too, so the canceller lets the destination go (protocol.md, "Flow
 *   control");
 * - heartbeats: one byte on the bootstrap connection at once, then one each
 *   TFAB_HEARTBEAT_MS, whether the process calls progress or is busy; none with 0.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/ioctl.h>
#include <sys/socket.h>

#include "engine/engine.h"
#include "engine_test.h"
#include "mp.h"

/* A pair of contexts of the scenario's own: rank 0 listens and accepts, rank 1 connects. */
struct pair {
	struct tfab_context *ctx;
	struct tfab_peer *peer;
	const char *tag;
};

static int pair_open(struct mp *mp, struct pair *p, const char *tag, const char *const *env)
{
	char what[64];

	p->tag = tag;
	p->peer = NULL;
	CHECK_RC(context_with(&p->ctx, env), 0);
	snprintf(what, sizeof(what), "%s_port", tag);
	if (mp->rank == 0) {
		uint16_t port;

		CHECK_RC(tfab_listen(p->ctx, "127.0.0.1", 0, &port), 0);
		CHECK_RC(mp_put(mp, what, port), 0);
		CHECK_RC(tfab_accept(p->ctx, WAIT_MS, &p->peer), 0);
	} else {
		unsigned port;

		CHECK_RC(mp_get(mp, 0, what, &port), 0);
		CHECK_RC(tfab_connect(p->ctx, "127.0.0.1", (uint16_t)port, WAIT_MS, &p->peer), 0);
	}
	return 0;
}

/* Drive the pair's context until the other rank marked what (bounded). */
static int pair_progress_until(struct mp *mp, struct pair *p, const char *what)
{
	uint64_t until = ms_now() + (uint64_t)WAIT_MS;

	while (!mp_noted(mp, 1 - mp->rank, what)) {
		if (ms_now() > until) {
			fprintf(stderr, "rank %d: %s: rank %d never marked %s\n", mp->rank, p->tag,
				1 - mp->rank, what);
			return 1;
		}
		for (int k = 0; k < 100; k++)
			tfab_progress(p->ctx);
		usleep(200);
	}
	return 0;
}

/*
 * Both ranks done with the pair: each drives its context until the other is done too (so
 * that nothing either still owes, a TAKEN, a credit, is left unread), then both leave.
 */
static int pair_close(struct mp *mp, struct pair *p)
{
	char what[64];

	snprintf(what, sizeof(what), "%s_done", p->tag);
	CHECK_RC(mp_note(mp, what), 0);
	CHECK(pair_progress_until(mp, p, what) == 0);
	CHECK_RC(tfab_peer_destroy(p->peer), 0);
	CHECK_RC(tfab_context_destroy(p->ctx), 0);
	return 0;
}

/* Drive ctx until d counts n (bounded). */
static int wait_done(struct mp *mp, struct tfab_context *ctx, struct done *d, int n,
		     const char *what)
{
	uint64_t until = ms_now() + (uint64_t)WAIT_MS;

	while (__atomic_load_n(&d->n, __ATOMIC_ACQUIRE) < n) {
		if (ms_now() > until) {
			fprintf(stderr, "rank %d: %s: %d of %d done\n", mp->rank, what,
				__atomic_load_n(&d->n, __ATOMIC_ACQUIRE), n);
			return 1;
		}
		tfab_progress(ctx);
	}
	return 0;
}

/* A 1-D fp32 tensor of n values, value i = seed + i. */
struct vec {
	DLTensor dl;
	int64_t shape;
	float *v;
};

static void vec_make(struct vec *t, size_t n, float seed)
{
	t->shape = (int64_t)n;
	t->v = malloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		t->v[i] = seed + (float)i;
	t->dl = (DLTensor){.data = t->v,
			   .device = {kDLCPU, 0},
			   .ndim = 1,
			   .dtype = {kDLFloat, 32, 1},
			   .shape = &t->shape};
}

static bool vec_is(const DLManagedTensor *m, size_t n, float seed)
{
	const float *v = m ? m->dl_tensor.data : NULL;

	if (!m || m->dl_tensor.ndim != 1 || m->dl_tensor.shape[0] != (int64_t)n)
		return false;
	return v[0] == seed && v[n - 1] == seed + (float)(n - 1);
}

/*
 * The meta-data cache holds 4 keys. Keys a, b, c and d fill it (four misses); a is received
 * again (a hit, which makes it the most recently used); e comes (a miss: one key must go).
 * The one to go is b, the least recently used, not a, the oldest inserted: a's next receive
 * is a hit, b's a miss.
 */
static int sc_meta_lru(struct mp *mp)
{
	static const struct {
		const char *key;
		int64_t step;
		bool hit;   /* the receive finds the key's meta-data cached */
		int evicts; /* entries the cache lets go for it */
	} plan[] = {{"lru/a", 1, false, 0}, {"lru/b", 1, false, 0}, {"lru/c", 1, false, 0},
		    {"lru/d", 1, false, 0}, {"lru/a", 2, true, 0},  {"lru/e", 1, false, 1},
		    {"lru/a", 3, true, 0},  {"lru/b", 2, false, 1}};
	enum { N = sizeof(plan) / sizeof(plan[0]), COUNT = 16 };
	struct pair p;

	CHECK(pair_open(mp, &p, "lru",
			(const char *const[]){"TFAB_META_CACHE_ENTRIES", "4", "TFAB_NO_REQUEST",
					      "0", "TFAB_PROGRESS_THREAD", "0", NULL}) == 0);
	if (mp->rank == 1) {
		struct vec t[N];
		struct done d = {0};

		for (int i = 0; i < N; i++) {
			vec_make(&t[i], COUNT, (float)(100 * i));
			CHECK_RC(tfab_send(p.ctx, plan[i].key, plan[i].step, &t[i].dl, false,
					   on_sent, &d),
				 0);
		}
		CHECK(wait_done(mp, p.ctx, &d, N, "the sends") == 0);
		CHECK(d.errors == 0);
		for (int i = 0; i < N; i++)
			free(t[i].v);
		return pair_close(mp, &p);
	}
	for (int i = 0; i < N; i++) {
		struct tfab_stats st0, st;
		DLManagedTensor *m = NULL;

		CHECK_RC(tfab_get_stats(p.ctx, &st0), 0);
		CHECK_RC(tfab_recv_sync(p.ctx, p.peer, plan[i].key, plan[i].step, NULL, WAIT_MS, &m,
					NULL),
			 0);
		CHECK(vec_is(m, COUNT, (float)(100 * i)));
		m->deleter(m);
		CHECK_RC(tfab_get_stats(p.ctx, &st), 0);
		if (st.meta_hits - st0.meta_hits != (plan[i].hit ? 1u : 0u) ||
		    st.meta_misses - st0.meta_misses != (plan[i].hit ? 0u : 1u) ||
		    st.meta_evictions - st0.meta_evictions != (uint64_t)plan[i].evicts) {
			fprintf(stderr,
				"rank 0: receive %d ('%s' step %lld): %llu hits, %llu misses, %llu "
				"evictions; wanted a %s and %d eviction(s)%s\n",
				i, plan[i].key, (long long)plan[i].step,
				(unsigned long long)(st.meta_hits - st0.meta_hits),
				(unsigned long long)(st.meta_misses - st0.meta_misses),
				(unsigned long long)(st.meta_evictions - st0.meta_evictions),
				plan[i].hit ? "hit" : "miss", plan[i].evicts,
				i == 6 ? " (the hit on 'lru/a' at step 2 did not make it the most "
					 "recently used: it went, not 'lru/b')"
				       : "");
			return 1;
		}
	}
	return pair_close(mp, &p);
}

/*
 * Requests standing ahead for one key of count fp32 values at depth: the receiver takes
 * steps 1 to steps one by one (the sender sent them all first). Standing: requests posted
 * ahead and not yet taken (no step is skipped here, so none is cancelled). From step 2 (step
 * 1 learns the meta-data) they reach want and never pass it; the content of exactly want
 * steps lands ahead of its receives.
 */
static int ahead_key(struct mp *mp, struct pair *p, const char *key, size_t count, unsigned depth,
		     uint64_t want, int steps)
{
	size_t nbytes = count * sizeof(float);

	if (mp->rank == 1) {
		struct vec *t = calloc((size_t)steps, sizeof(*t));
		struct done d = {0};

		for (int s = 1; s <= steps; s++) {
			vec_make(&t[s - 1], count, (float)s);
			CHECK_RC(tfab_send(p->ctx, key, s, &t[s - 1].dl, false, on_sent, &d), 0);
		}
		CHECK(wait_done(mp, p->ctx, &d, steps, key) == 0);
		CHECK(d.errors == 0);
		for (int s = 0; s < steps; s++)
			free(t[s].v);
		free(t);
		return 0;
	}
	struct tfab_stats st0, st;
	uint64_t most = 0;

	CHECK_RC(tfab_recv_ahead(p->ctx, p->peer, key, depth), 0);
	CHECK_RC(tfab_get_stats(p->ctx, &st0), 0);
	for (int s = 1; s <= steps; s++) {
		DLManagedTensor *m = NULL;
		uint64_t standing;
		struct tfab_stats before;

		CHECK_RC(tfab_get_stats(p->ctx, &before), 0);
		CHECK_RC(tfab_recv_sync(p->ctx, p->peer, key, s, NULL, WAIT_MS, &m, NULL), 0);
		CHECK(vec_is(m, count, (float)s));
		m->deleter(m);
		CHECK_RC(tfab_get_stats(p->ctx, &st), 0);
		standing =
		    (st.requests_ahead - st0.requests_ahead) - (st.ahead_taken - st0.ahead_taken);
		most = standing > most ? standing : most;
		if (standing > want || (s == 2 && standing != want)) {
			fprintf(stderr,
				"rank 0: '%s' (%zu bytes, depth %u): %llu requests standing after "
				"the receive of step %d; the bound is %llu\n",
				key, nbytes, depth, (unsigned long long)standing, s,
				(unsigned long long)want);
			return 1;
		}
		if (s == 2) {
			/*
			 * What stands is written at once: want steps' content lands besides step
			 * 2's own (the first requests ahead went with its request), no more.
			 */
			uint64_t until = ms_now() + (uint64_t)WAIT_MS, landed = 0, idle_until;

			while (landed < want * nbytes && ms_now() < until) {
				tfab_progress(p->ctx);
				CHECK_RC(tfab_get_stats(p->ctx, &st), 0);
				landed = st.bytes_received - before.bytes_received - nbytes;
			}
			for (idle_until = ms_now() + 50; ms_now() < idle_until;)
				tfab_progress(p->ctx);
			CHECK_RC(tfab_get_stats(p->ctx, &st), 0);
			landed = st.bytes_received - before.bytes_received - nbytes;
			if (landed != want * nbytes) {
				fprintf(stderr,
					"rank 0: '%s': %llu bytes landed ahead of their receives, "
					"not %llu steps of %zu\n",
					key, (unsigned long long)landed, (unsigned long long)want,
					nbytes);
				return 1;
			}
		}
	}
	printf("ahead_bound: '%s', %zu bytes, depth %u: at most %llu standing (bound %llu)\n", key,
	       nbytes, depth, (unsigned long long)most, (unsigned long long)want);
	return 0;
}

/*
 * No-request mode's bounds (doc/design.md, "No-request mode"; tfab_recv_ahead): requests
 * stand for steps N+1 .. N+depth, fewer where their destinations would hold more than 4 MiB
 * or an eighth of TFAB_POOL_CACHE, one at least.
 * - the depth: 256-byte tensors at depth 8 (the default pool: 32 MiB an eighth): 8;
 * - 4 MiB: 512 KiB tensors at depth 16: 8;
 * - an eighth of TFAB_POOL_CACHE (6 MiB: 768 KiB): 128 KiB tensors at depth 16: 6;
 * - one at least: 1 MiB tensors at depth 16 with that pool: 1.
 */
static int sc_ahead_bound(struct mp *mp)
{
	struct pair p;

	CHECK(pair_open(mp, &p, "ahead",
			(const char *const[]){"TFAB_NO_REQUEST", "0", "TFAB_PROGRESS_THREAD", "0",
					      NULL}) == 0);
	CHECK(ahead_key(mp, &p, "ahead/depth", 64, 8, 8, 24) == 0);
	CHECK(ahead_key(mp, &p, "ahead/4MiB", 128 << 10, 16, 8, 14) == 0);
	CHECK(pair_close(mp, &p) == 0);
	CHECK(pair_open(mp, &p, "ahead_pool",
			(const char *const[]){"TFAB_NO_REQUEST", "0", "TFAB_PROGRESS_THREAD", "0",
					      "TFAB_POOL_CACHE", "6291456", NULL}) == 0);
	CHECK(ahead_key(mp, &p, "ahead/eighth", 32 << 10, 16, 6, 12) == 0);
	CHECK(ahead_key(mp, &p, "ahead/one", 256 << 10, 16, 1, 6) == 0);
	return pair_close(mp, &p);
}

/*
 * Credits come back after a CANCEL (doc/protocol.md, "Flow control"): rank 0 learns a key's
 * meta-data, asks for its step 2 into a pool destination (rank 1 has no send for it: the
 * request is parked), and gives the receive up (a step cleanup): its CANCEL goes, and the
 * destination is held until rank 1's credits cover it. Rank 1 has consumed a handful of
 * messages, fewer than the batch of a quarter ring (16) that credits otherwise wait for, and
 * writes nothing to rank 0: only the CANCEL's rule returns them, as a credit write of its
 * own. Rank 0 must then let the destination go.
 */
static int sc_cancel_credits(struct mp *mp)
{
	struct pair p;

	CHECK(pair_open(mp, &p, "cancel",
			(const char *const[]){"TFAB_NO_REQUEST", "0", "TFAB_PROGRESS_THREAD", "0",
					      "TFAB_RING_SLOTS", "64", NULL}) == 0);
	if (mp->rank == 1) {
		struct vec t;
		struct done d = {0};
		struct tfab_stats st0, st;

		vec_make(&t, 64, 1.0f);
		CHECK_RC(tfab_send(p.ctx, "cancel/k", 1, &t.dl, false, on_sent, &d), 0);
		CHECK(wait_done(mp, p.ctx, &d, 1, "the send") == 0 && d.errors == 0);
		CHECK_RC(tfab_get_stats(p.ctx, &st0), 0);
		CHECK_RC(mp_note(mp, "cancel_sent"), 0);
		CHECK(pair_progress_until(mp, &p, "cancel_released") == 0);
		CHECK_RC(tfab_get_stats(p.ctx, &st), 0);
		/* the credits went alone: no control message rode them */
		CHECK(st.writes_credit - st0.writes_credit >= 1);
		CHECK(st.writes_ctrl == st0.writes_ctrl);
		free(t.v);
		return pair_close(mp, &p);
	}
	DLManagedTensor *m = NULL;
	struct done d = {0};
	uint64_t until;

	CHECK_RC(tfab_recv_sync(p.ctx, p.peer, "cancel/k", 1, NULL, WAIT_MS, &m, NULL), 0);
	CHECK(vec_is(m, 64, 1.0f));
	m->deleter(m);
	CHECK(pair_progress_until(mp, &p, "cancel_sent") == 0);
	CHECK_RC(tfab_recv(p.ctx, p.peer, "cancel/k", 2, NULL, on_recv_drop, &d), 0);
	for (int k = 0; k < 100; k++)
		tfab_progress(p.ctx); /* the request goes */
	CHECK_RC(tfab_step_cleanup(p.ctx, 2), 0);
	CHECK(wait_done(mp, p.ctx, &d, 1, "the receive given up") == 0);
	CHECK(d.last_status == -TFAB_ERR_ABORTED);
	/* no progress thread: the fields are this thread's to read */
	CHECK(p.peer->nheld_dests == 1 && p.peer->ncancelled == 1);
	until = ms_now() + (uint64_t)WAIT_MS;
	while ((p.peer->nheld_dests || p.peer->ncancelled) && ms_now() < until) {
		tfab_progress(p.ctx);
		usleep(100);
	}
	if (p.peer->nheld_dests || p.peer->ncancelled) {
		fprintf(stderr,
			"rank 0: %d ms after the CANCEL, %u destination(s) still held and %u "
			"CANCEL(s) not covered by the peer's credits (%u of our %u messages "
			"acknowledged)\n",
			WAIT_MS, p.peer->nheld_dests, p.peer->ncancelled, p.peer->tx_acked,
			p.peer->tx_seq);
		return 1;
	}
	CHECK(p.peer->tx_acked == p.peer->tx_seq);
	CHECK_RC(mp_note(mp, "cancel_released"), 0);
	return pair_close(mp, &p);
}

/* Bytes waiting unread on the peer's bootstrap connection: heartbeats, nothing else. */
static int beats_waiting(struct mp *mp, struct tfab_peer *peer, int *n_p)
{
	char buf[256];
	int n = 0;
	ssize_t got;

	CHECK(peer->sock >= 0);
	CHECK(ioctl(peer->sock, FIONREAD, &n) == 0);
	CHECK(n >= 0 && (size_t)n <= sizeof(buf));
	got = n ? recv(peer->sock, buf, (size_t)n, MSG_PEEK | MSG_DONTWAIT) : 0;
	CHECK(got == n);
	for (int i = 0; i < n; i++)
		CHECK(buf[i] == 'H');
	*n_p = n;
	return 0;
}

/*
 * Heartbeats rank 1 writes in a window of about a second, counted on rank 0's end of the
 * bootstrap connection, which rank 0 leaves unread (it calls no progress on that context),
 * while rank 1 does what `what` says until rank 0 marks its end.
 */
static int beats_in_window(struct mp *mp, struct pair *p, const char *what, unsigned interval,
			   int *n_p, double *expected_p)
{
	char end[64];
	uint64_t t0, t1;
	int c0, c1;

	snprintf(end, sizeof(end), "beat_%s_end", what);
	CHECK_RC(mp_note(mp, what), 0);
	CHECK_RC(mp_wait_note_quiet(mp, 1, what, 0), 0); /* rank 1 has begun */
	usleep(50000);
	CHECK(beats_waiting(mp, p->peer, &c0) == 0);
	t0 = ms_now();
	usleep(1000000);
	CHECK(beats_waiting(mp, p->peer, &c1) == 0);
	t1 = ms_now();
	CHECK_RC(mp_note(mp, end), 0);
	*n_p = c1 - c0;
	*expected_p = (double)(t1 - t0) / interval;
	return 0;
}

/*
 * Heartbeats (doc/design.md, "Liveness"; TFAB_HEARTBEAT_MS): rank 1 beats, rank 0 (which
 * sends none: TFAB_HEARTBEAT_MS=0) counts the bytes on its end of the bootstrap connection.
 * - the first goes at once: one byte right after connecting, and no more within the
 *   interval (60 s here);
 * - then one each interval (100 ms here), whether rank 1 calls progress all the time (idle)
 *   or not at all (busy: spinning): over a window of about a second, the window's length over
 *   the interval, give or take one at each edge;
 * - none at all with TFAB_HEARTBEAT_MS=0.
 */
static int sc_heartbeats(struct mp *mp)
{
	static const char *const phases[] = {"idle", "busy"};
	const char *mine = mp->rank == 1 ? "60000" : "0";
	struct pair p;
	int n;

	/* the first beat */
	CHECK(pair_open(mp, &p, "beat_first",
			(const char *const[]){"TFAB_HEARTBEAT_MS", mine, "TFAB_PROGRESS_THREAD",
					      "0", NULL}) == 0);
	if (mp->rank == 0) {
		uint64_t until = ms_now() + (uint64_t)WAIT_MS;

		for (;;) {
			CHECK(beats_waiting(mp, p.peer, &n) == 0);
			if (n > 0 || ms_now() > until)
				break;
			usleep(1000);
		}
		usleep(300000);
		CHECK(beats_waiting(mp, p.peer, &n) == 0);
		if (n != 1) {
			fprintf(
			    stderr,
			    "rank 0: %d heartbeat(s) within 300 ms of connecting, at an interval "
			    "of 60 s: not the one that goes at once\n",
			    n);
			return 1;
		}
	}
	CHECK(pair_close(mp, &p) == 0);

	/* one each interval, idle or busy */
	mine = mp->rank == 1 ? "100" : "0";
	CHECK(pair_open(mp, &p, "beat_rate",
			(const char *const[]){"TFAB_HEARTBEAT_MS", mine, "TFAB_PROGRESS_THREAD",
					      "0", "TFAB_OP_TIMEOUT_MS", "0", NULL}) == 0);
	for (int ph = 0; ph < 2; ph++) {
		char end[64];

		snprintf(end, sizeof(end), "beat_%s_end", phases[ph]);
		if (mp->rank == 1) {
			uint64_t until = ms_now() + 4 * (uint64_t)WAIT_MS;
			volatile uint64_t spin = 0;

			CHECK_RC(mp_wait_note_quiet(mp, 0, phases[ph], 0), 0);
			CHECK_RC(mp_note(mp, phases[ph]), 0);
			while (!mp_noted(mp, 0, end) && ms_now() < until) {
				if (ph == 0) {
					tfab_progress(p.ctx);
					continue;
				}
				for (int k = 0; k < 100000; k++)
					spin += (uint64_t)k;
			}
			(void)spin;
			CHECK(mp_noted(mp, 0, end));
		} else {
			double expected;

			CHECK(beats_in_window(mp, &p, phases[ph], 100, &n, &expected) == 0);
			printf("heartbeats: %d in %.0f ms at 100 ms, rank 1 %s\n", n,
			       expected * 100, phases[ph]);
			/* the beats the window spans, one more or fewer at either edge */
			int lo = (int)expected - 1,
			    hi = (int)expected + (expected > (int)expected) + 1;

			if (n < lo || n > hi) {
				fprintf(stderr,
					"rank 0: %d heartbeats in %.0f ms from rank 1 (%s), at "
					"an interval of 100 ms: not one each interval\n",
					n, expected * 100, phases[ph]);
				return 1;
			}
		}
	}
	CHECK(pair_close(mp, &p) == 0);

	/* none */
	CHECK(pair_open(mp, &p, "beat_none",
			(const char *const[]){"TFAB_HEARTBEAT_MS", "0", "TFAB_PROGRESS_THREAD", "0",
					      NULL}) == 0);
	usleep(300000);
	CHECK(beats_waiting(mp, p.peer, &n) == 0);
	if (n != 0) {
		fprintf(stderr, "rank %d: %d heartbeat(s) with TFAB_HEARTBEAT_MS=0\n", mp->rank, n);
		return 1;
	}
	return pair_close(mp, &p);
}

static const struct mp_scenario scenarios[] = {
    {.name = "meta_lru", .nranks = 2, .fn = sc_meta_lru},
    {.name = "ahead_bound", .nranks = 2, .fn = sc_ahead_bound},
    {.name = "cancel_credits", .nranks = 2, .fn = sc_cancel_credits},
    {.name = "heartbeats", .nranks = 2, .fn = sc_heartbeats},
};

int main(int argc, char **argv)
{
	return mp_main(argc, argv, scenarios, (int)(sizeof(scenarios) / sizeof(scenarios[0])));
}
