/*
 * Engine scenarios: writes the fabric refuses, through test/common/fault_ops. Writes that
 * meet -EAGAIN are queued and retried, and every tensor arrives intact. A content write that
 * fails with an error fails that send and its receive, and nothing else.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine/engine.h"
#include "test/common/fault_ops.h"
#include "engine_scenarios.h"
#include "engine_test.h"

enum { FAULT_KEYS = 200 };

/* Key i's tensor: 1 to 2,000 floats, filled from seed + i. */
static void fault_tensor(struct tensor *t, int i, uint64_t seed)
{
	int64_t shape[1] = {1 + (i * 397) % 2000};

	tensor_make(t, f32, 1, shape);
	tensor_fill(t, seed + (uint64_t)i);
}

/*
 * FAULT_KEYS tensors from `from` to `to` (every other one into a caller's buffer, the others
 * into pool tensors), under rules installed on both sides. The receives are posted last key
 * first, half the sends before them and half after: every tensor arrives intact whatever the
 * order. Each rule must have hit at least once; 0 or 1.
 */
static int fault_transfer(struct mp *mp, int from, int to, const char *prefix, uint64_t seed,
			  const struct fault_rule *rules, int nrules)
{
	struct tensor t[FAULT_KEYS];
	struct done d = {0};
	char key[32];

	for (int i = 0; i < FAULT_KEYS; i++)
		fault_tensor(&t[i], i, seed);
	fault_ops_install(mp->ctx);
	fault_ops_set(mp->ctx, rules, nrules);
	if (mp->rank == from) {
		for (int i = 0; i < FAULT_KEYS; i += 2) {
			snprintf(key, sizeof(key), "%s/%d", prefix, i);
			CHECK_RC(tfab_send(mp->ctx, key, 1, &t[i].dl, false, on_sent, &d), 0);
		}
		CHECK(mp_barrier(mp, (int64_t)seed) == 0);
		for (int i = 1; i < FAULT_KEYS; i += 2) {
			snprintf(key, sizeof(key), "%s/%d", prefix, i);
			CHECK_RC(tfab_send(mp->ctx, key, 1, &t[i].dl, false, on_sent, &d), 0);
		}
		CHECK(wait_n(mp, &d, FAULT_KEYS));
		CHECK(d.errors == 0);
	} else if (mp->rank == to) {
		struct done r[FAULT_KEYS];

		memset(r, 0, sizeof(r));
		for (int i = FAULT_KEYS - 1; i >= 0; i--) {
			snprintf(key, sizeof(key), "%s/%d", prefix, i);
			if (i & 1)
				memset(t[i].buf, 0, t[i].nbytes);
			CHECK_RC(tfab_recv(mp->ctx, mp->peers[from], key, 1,
					   i & 1 ? &t[i].dl : NULL, on_recv, &r[i]),
				 0);
		}
		CHECK(mp_barrier(mp, (int64_t)seed) == 0);
		for (int i = 0; i < FAULT_KEYS; i++) {
			CHECK(wait_n(mp, &r[i], 1));
			CHECK_RC(r[i].last_status, 0);
			/* a pool tensor, or a view of the caller's buffer */
			CHECK(r[i].tensor->dl_tensor.shape[0] == t[i].dl.shape[0]);
			CHECK(r[i].tensor->dl_tensor.data == t[i].buf || !(i & 1));
			CHECK(bytes_match(r[i].tensor->dl_tensor.data, t[i].nbytes,
					  seed + (uint64_t)i));
			r[i].tensor->deleter(r[i].tensor);
		}
	}
	for (int i = 0; i < nrules; i++) {
		printf("%s: rank %d: rule %d refused %llu of %llu calls\n", prefix, mp->rank, i,
		       (unsigned long long)fault_ops_hits(mp->ctx, i),
		       (unsigned long long)fault_ops_calls(mp->ctx, i));
		/*
		 * Every rule whose window the writes reached refused some. Credits ride in the
		 * control slots that go the other way (TFAB_CTRL_BATCH=1), so a side that sends
		 * requests may have none to return apart: no call, and nothing to refuse.
		 */
		CHECK(fault_ops_hits(mp->ctx, i) > 0 ||
		      fault_ops_calls(mp->ctx, i) < rules[i].first);
	}
	fault_ops_remove(mp->ctx);
	for (int i = 0; i < FAULT_KEYS; i++)
		tensor_free(&t[i]);
	return 0;
}

/*
 * Content writes that meet -EAGAIN, often (every other call) and for a while (2,000 calls in
 * a row): the engine queues them and retries, and every tensor arrives intact.
 */
int sc_eagain_content(struct mp *mp)
{
	static const struct fault_rule rules[] = {
	    {.match = FAULT_CONTENT, .status = -EAGAIN, .first = 2, .every = 2},
	    {.match = FAULT_CONTENT, .status = -EAGAIN, .first = 50, .count = 2000},
	};

	return fault_transfer(mp, 1, 0, "eagain/content", 1000, rules, mp->rank == 1 ? 2 : 0);
}

/*
 * Control messages and credit returns that meet -EAGAIN, often and for a while, on both
 * sides, with tensors going one way, then the other: every message goes out in the end, and
 * every tensor arrives intact.
 */
int sc_eagain_ctrl(struct mp *mp)
{
	static const struct fault_rule rules[] = {
	    {.match = FAULT_CTRL, .status = -EAGAIN, .first = 3, .every = 3},
	    {.match = FAULT_CTRL, .status = -EAGAIN, .first = 40, .count = 500},
	    {.match = FAULT_CREDIT, .status = -EAGAIN, .first = 2, .every = 2},
	    /* from the first: a side may return its credits only a few times */
	    {.match = FAULT_CREDIT, .status = -EAGAIN, .first = 1, .count = 50},
	};

	CHECK(fault_transfer(mp, 1, 0, "eagain/ctrl/a", 2000, rules, 4) == 0);
	CHECK(fault_transfer(mp, 0, 1, "eagain/ctrl/b", 3000, rules, 4) == 0);
	return 0;
}

/* Requests parked here for keys that start with prefix. */
static long parked_with(struct tfab_context *ctx, const char *prefix)
{
	size_t len = strlen(prefix);
	long n = 0;

	tfab__ctx_lock(ctx);
	for (size_t i = 0; i < ctx->parked.nbuckets; i++) {
		for (struct tfab_hnode *h = ctx->parked.buckets[i]; h; h = h->next) {
			struct tfab_response *p = tfab_container_of(h, struct tfab_response, node);

			n += p->key_len >= len && memcmp(p->key, prefix, len) == 0;
		}
	}
	tfab__ctx_unlock(ctx);
	return n;
}

/* Drive progress until n requests for keys that start with prefix are parked here. */
static int wait_parked(struct mp *mp, const char *prefix, long n)
{
	struct mp_watch w;
	long parked = 0;

	mp_watch_start(&w, mp, NULL, "parked requests", 0);
	while ((parked = parked_with(mp->ctx, prefix)) < n && !mp_watch_stalled(&w, parked))
		tfab_progress(mp->ctx);
	return parked == n;
}

/*
 * A content write the fabric refuses with an error fails that send and its receive, both with
 * the error, and nothing else: once when the write is first posted (the 4th of 10, each answering
 * a parked request), once when it is retried after -EAGAIN. The other tensors arrive, and the
 * pair goes on working.
 */
int sc_content_error(struct mp *mp)
{
	static const struct fault_rule fourth = {
	    .match = FAULT_CONTENT, .status = -EIO, .first = 4, .count = 1};
	static const struct fault_rule retried[] = {
	    {.match = FAULT_CONTENT, .status = -EAGAIN, .first = 1, .count = 5},
	    {.match = FAULT_CONTENT, .status = -EIO, .first = 6, .count = 1},
	};
	enum { N = 10, RETRIED = N, AFTER = N + 1 };
	struct tensor t[N + 2];
	struct done d[N + 2];
	char key[32];

	memset(d, 0, sizeof(d));
	for (int i = 0; i < N + 2; i++)
		fault_tensor(&t[i], i, 4000);
	if (mp->rank == 0) {
		/* 0..9 before barrier 1, 10 after barrier 2, 11 after barrier 3 */
		for (int i = 0; i < N + 2; i++) {
			if (i == RETRIED)
				CHECK(mp_barrier(mp, 1) == 0 && mp_barrier(mp, 2) == 0);
			if (i == AFTER)
				CHECK(mp_barrier(mp, 3) == 0);
			snprintf(key, sizeof(key), "refused/%d", i);
			memset(t[i].buf, 0, t[i].nbytes);
			CHECK_RC(tfab_recv(mp->ctx, mp->peers[1], key, 1, &t[i].dl, on_recv, &d[i]),
				 0);
		}
		for (int i = 0; i < N + 2; i++) {
			bool refused = i == 3 || i == RETRIED;

			CHECK(wait_n(mp, &d[i], 1));
			if (d[i].last_status != (refused ? -EIO : 0))
				fprintf(stderr, "rank 0: receive %d ended with %s\n", i,
					tfab_strerror(d[i].last_status));
			CHECK_RC(d[i].last_status, refused ? -EIO : 0);
			if (refused) {
				CHECK(d[i].tensor == NULL);
				continue;
			}
			CHECK(bytes_match(t[i].buf, t[i].nbytes, 4000 + (uint64_t)i));
			d[i].tensor->deleter(d[i].tensor); /* a view of t[i] */
		}
	} else {
		fault_ops_install(mp->ctx);
		CHECK(mp_barrier(mp, 1) == 0);
		CHECK(wait_parked(mp, "refused/", N));
		fault_ops_set(mp->ctx, &fourth, 1);
		for (int i = 0; i < N; i++) {
			snprintf(key, sizeof(key), "refused/%d", i);
			CHECK_RC(tfab_send(mp->ctx, key, 1, &t[i].dl, false, on_sent, &d[i]), 0);
		}
		CHECK(fault_ops_hits(mp->ctx, 0) == 1);
		CHECK(mp_barrier(mp, 2) == 0);
		CHECK(wait_parked(mp, "refused/", 1));
		fault_ops_set(mp->ctx, retried, 2);
		CHECK_RC(tfab_send(mp->ctx, "refused/10", 1, &t[RETRIED].dl, false, on_sent,
				   &d[RETRIED]),
			 0);
		CHECK(wait_n(mp, &d[RETRIED], 1));
		CHECK(fault_ops_hits(mp->ctx, 0) == 5 && fault_ops_hits(mp->ctx, 1) == 1);
		fault_ops_remove(mp->ctx);
		CHECK(mp_barrier(mp, 3) == 0);
		CHECK_RC(
		    tfab_send(mp->ctx, "refused/11", 1, &t[AFTER].dl, false, on_sent, &d[AFTER]),
		    0);
		for (int i = 0; i < N + 2; i++) {
			bool refused = i == 3 || i == RETRIED;

			CHECK(wait_n(mp, &d[i], 1));
			CHECK_RC(d[i].last_status, refused ? -EIO : 0);
		}
	}
	for (int i = 0; i < N + 2; i++)
		tensor_free(&t[i]);
	return 0;
}
