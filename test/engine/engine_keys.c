/*
 * Engine scenarios: many keys. A request names its key by index once it may; indexes are
 * retired when the meta-data cache evicts their keys, and start anew on a new connection.
 * Thousands of keys over many steps keep resident memory flat, and 100,000 keys pass through
 * a bounded meta-data cache.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine_scenarios.h"
#include "engine_test.h"

/* Whether control writes to rank `to` carry several messages (TFAB_CTRL_BATCH and the path). */
static bool batching(struct mp *mp, int to)
{
	const char *env = getenv("TFAB_CTRL_BATCH");

	return (!env || strcmp(env, "0") != 0) && !mp->peers[to]->path->caps->no_ctrl_batch;
}

/* Whether TFAB_KEY_INDEX is on (the default). */
static bool key_index_on(void)
{
	const char *env = getenv("TFAB_KEY_INDEX");

	return !env || strcmp(env, "0") != 0;
}

/*
 * Keys as indexes: KEYS keys of about 300 bytes for STEPS steps, receives posted before the
 * sends on even steps and after them on odd ones, key 0 changing shape at step 6 and a step
 * cleanup after step 4; every tensor checked. After the first two steps (the first learns
 * the meta-data, the second announces the indexes) a request names its key by index: the
 * receiver's control bytes per fetch stay below the key's length, where with TFAB_KEY_INDEX=0
 * every request carries the whole key.
 */
int sc_key_index(struct mp *mp)
{
	enum { KEYS = 6, STEPS = 12 };
	static const int64_t small[1] = {16}, big[1] = {48};
	char keys[KEYS][320];
	struct tfab_stats st0 = {0}, st;
	size_t key_len = 0;

	for (int k = 0; k < KEYS; k++) {
		memset(keys[k], 'k', 300);
		snprintf(keys[k] + 300, 20, "/%d", k);
		key_len = strlen(keys[k]);
	}
	for (int step = 1; step <= STEPS; step++) {
		struct tensor t[KEYS];
		struct done s = {0}, r[KEYS] = {{0}};
		bool recv_first = step % 2 == 0;

		if (step == 3)
			CHECK_RC(tfab_get_stats(mp->ctx, &st0), 0);
		if (mp->rank == 0 && recv_first)
			for (int k = 0; k < KEYS; k++)
				CHECK_RC(tfab_recv(mp->ctx, mp->peers[1], keys[k], step, NULL,
						   on_recv, &r[k]),
					 0);
		CHECK(mp_barrier(mp, 100 + step) == 0);
		if (mp->rank == 1) {
			for (int k = 0; k < KEYS; k++) {
				tensor_make(&t[k], f32, 1, k == 0 && step >= 6 ? big : small);
				tensor_fill(&t[k], (uint64_t)(step * 10 + k));
				CHECK_RC(
				    tfab_send(mp->ctx, keys[k], step, &t[k].dl, false, on_sent, &s),
				    0);
			}
			CHECK(wait_n(mp, &s, KEYS));
			CHECK(s.errors == 0);
			for (int k = 0; k < KEYS; k++)
				tensor_free(&t[k]);
		} else {
			if (!recv_first)
				for (int k = 0; k < KEYS; k++)
					CHECK_RC(tfab_recv(mp->ctx, mp->peers[1], keys[k], step,
							   NULL, on_recv, &r[k]),
						 0);
			for (int k = 0; k < KEYS; k++) {
				DLManagedTensor *m;
				int64_t n = k == 0 && step >= 6 ? big[0] : small[0];

				CHECK(wait_n(mp, &r[k], 1));
				CHECK(r[k].errors == 0 && r[k].tensor);
				m = r[k].tensor;
				CHECK(m->dl_tensor.shape[0] == n);
				CHECK(bytes_match(m->dl_tensor.data, (size_t)n * 4,
						  (uint64_t)(step * 10 + k)));
				m->deleter(m);
			}
		}
		if (step == 4)
			CHECK_RC(tfab_step_cleanup(mp->ctx, 4), 0);
	}
	CHECK(mp_barrier(mp, 200) == 0);
	if (mp->rank == 0) {
		double per_fetch;

		CHECK_RC(tfab_get_stats(mp->ctx, &st), 0);
		per_fetch = (double)(st.bytes_ctrl - st0.bytes_ctrl) / (KEYS * (STEPS - 2));
		printf("key_index: keys of %zu bytes: %.1f control bytes per fetch (TFAB_KEY_INDEX "
		       "%s)\n",
		       key_len, per_fetch, key_index_on() ? "on" : "off");
		if (key_index_on())
			CHECK(per_fetch < (double)key_len);
		else
			CHECK(per_fetch > (double)key_len);
	}
	return 0;
}

/* A key of about 300 bytes, so that requests name it by index once they may. */
static void long_key(char *key, size_t len, const char *name)
{
	memset(key, 'r', 300);
	snprintf(key + 300, len - 300, "/%s", name);
}

/*
 * Key indexes across a reconnect, on a pair of contexts of its own: on the first connection
 * key A is fetched three times (its index announced and used); the sender then leaves and
 * connects again, and on the new connection key B is fetched first, then A. Indexes start
 * anew per connection, so B's index is the one A had: the sender must resolve it to B
 * (every tensor is checked against its key's pattern), and hold only the names of the
 * connection it is on.
 */
int sc_key_index_reconnect(struct mp *mp)
{
	static const struct {
		int conn;
		const char *name;
		uint64_t seed;
	} plan[] = {{0, "A", 1},  {0, "A", 2},	{0, "A", 3}, {1, "B", 11},
		    {1, "B", 12}, {1, "B", 13}, {1, "A", 4}, {1, "A", 5}};
	enum { N = sizeof(plan) / sizeof(plan[0]) };
	struct tfab_context *ctx;
	struct tfab_peer *peer = NULL;
	char key[320];
	unsigned port;

	CHECK_RC(tfab_context_create(&ctx), 0);
	if (mp->rank == 0) {
		uint16_t p16;

		CHECK_RC(tfab_listen(ctx, "127.0.0.1", 0, &p16), 0);
		CHECK_RC(mp_put(mp, "kr_port", p16), 0);
		for (int i = 0; i < N; i++) {
			DLManagedTensor *m = NULL;

			if (i > 0 && plan[i].conn != plan[i - 1].conn)
				CHECK_RC(progress_until_note(mp, ctx, "kr_sent0"), 0);
			if (i == 0 || plan[i].conn != plan[i - 1].conn)
				CHECK_RC(tfab_accept(ctx, WAIT_MS, &peer), 0);
			long_key(key, sizeof(key), plan[i].name);
			CHECK_RC(tfab_recv_sync(ctx, peer, key, i, NULL, WAIT_MS, &m, NULL), 0);
			CHECK(m && m->dl_tensor.shape[0] == 32);
			if (!bytes_match(m->dl_tensor.data, 128, plan[i].seed))
				fprintf(
				    stderr,
				    "rank 0: fetch %d ('%s' on connection %d) is not its key's\n",
				    i, plan[i].name, plan[i].conn);
			CHECK(bytes_match(m->dl_tensor.data, 128, plan[i].seed));
			m->deleter(m);
		}
		CHECK_RC(progress_until_note(mp, ctx, "kr_sent1"), 0);
		CHECK_RC(mp_note(mp, "kr_done"), 0);
		CHECK_RC(mp_wait_note(mp, 1, "kr_left", WAIT_MS), 0);
		CHECK_RC(tfab_context_destroy(ctx), 0);
		return 0;
	}
	CHECK_RC(mp_get(mp, 0, "kr_port", &port), 0);
	for (int i = 0; i < N; i++) {
		if (i == 0 || plan[i].conn != plan[i - 1].conn) {
			if (peer) {
				/* the names of the first connection: A's alone */
				CHECK(peer->key_names.count == (key_index_on() ? 1 : 0));
				CHECK_RC(mp_note(mp, "kr_sent0"), 0);
				CHECK_RC(tfab_peer_destroy(peer), 0);
			}
			CHECK_RC(tfab_connect(ctx, "127.0.0.1", (uint16_t)port, WAIT_MS, &peer), 0);
			CHECK(peer->key_names.count == 0);
		}
		long_key(key, sizeof(key), plan[i].name);
		CHECK(send_one(mp, ctx, key, i, plan[i].seed) == 0);
	}
	CHECK(peer->key_names.count == (key_index_on() ? 2 : 0)); /* B's and A's, anew */
	CHECK_RC(mp_note(mp, "kr_sent1"), 0);
	CHECK_RC(mp_wait_note(mp, 0, "kr_done", WAIT_MS), 0);
	CHECK_RC(tfab_peer_destroy(peer), 0);
	CHECK_RC(tfab_context_destroy(ctx), 0);
	CHECK_RC(mp_note(mp, "kr_left"), 0);
	return 0;
}

/*
 * Key indexes retired: KEYS keys, each fetched twice in a row (the second request announces
 * its index), in two rounds. With the meta-data cache bounded (TFAB_META_CACHE_ENTRIES, 256
 * in engine-shm-meta-bounded), the entries of a round's first keys are gone by its end, their
 * indexes retired (RETIRE messages); the second round names them in full again and announces
 * new indexes. Every tensor checked; the sender never holds more names than the receiver's
 * cache and one RETIRE message.
 */
int sc_key_index_evict(struct mp *mp)
{
	enum { KEYS = 700, ROUNDS = 2, FETCHES = KEYS * ROUNDS * 2 };
	static const int64_t shape[1] = {16};
	const char *cap_env = getenv("TFAB_META_CACHE_ENTRIES");
	unsigned cap = cap_env ? (unsigned)atoi(cap_env) : 0;
	struct tfab_stats st0, st;
	char key[32];

	CHECK_RC(tfab_get_stats(mp->ctx, &st0), 0);
	if (mp->rank == 1) {
		struct tensor *t = calloc(FETCHES, sizeof(*t));
		struct done s = {0};
		size_t names;

		CHECK(t != NULL);
		for (int i = 0; i < FETCHES; i++) {
			int k = (i / 2) % KEYS, step = i % 2 + 1 + 2 * (i / (2 * KEYS));

			snprintf(key, sizeof(key), "evict/%d", k);
			tensor_make(&t[i], f32, 1, shape);
			tensor_fill(&t[i], (uint64_t)(k + step) & 0xff);
			CHECK_RC(tfab_send(mp->ctx, key, step, &t[i].dl, false, on_sent, &s), 0);
		}
		CHECK(wait_n(mp, &s, FETCHES));
		CHECK(s.errors == 0);
		for (int i = 0; i < FETCHES; i++)
			tensor_free(&t[i]);
		free(t);
		tfab__ctx_lock(mp->ctx);
		names = mp->peers[0]->key_names.count;
		tfab__ctx_unlock(mp->ctx);
		printf("key_index_evict: the sender holds %zu key names\n", names);
		if (cap && key_index_on())
			CHECK(names <= cap + TFAB_WIRE_MAX_TAKEN);
		return 0;
	}
	for (int i = 0; i < FETCHES; i++) {
		int k = (i / 2) % KEYS, step = i % 2 + 1 + 2 * (i / (2 * KEYS));
		DLManagedTensor *m = NULL;

		snprintf(key, sizeof(key), "evict/%d", k);
		CHECK_RC(recv_one(mp, 1, key, step, &m, NULL), 0);
		CHECK(m && m->dl_tensor.shape[0] == shape[0]);
		CHECK(bytes_match(m->dl_tensor.data, 64, (uint64_t)(k + step) & 0xff));
		m->deleter(m);
	}
	CHECK_RC(tfab_get_stats(mp->ctx, &st), 0);
	if (cap && cap < KEYS)
		CHECK(st.meta_evictions - st0.meta_evictions >= KEYS - cap);
	return 0;
}

static long rss_kib(void)
{
	FILE *f = fopen("/proc/self/statm", "r");
	long pages = 0, resident = 0;

	if (f) {
		if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
			resident = 0;
		fclose(f);
	}
	return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static int env_int(const char *name, int dflt)
{
	const char *v = getenv(name);

	return v && *v ? atoi(v) : dflt;
}

/*
 * Many keys: TFAB_TEST_KEYS distinct keys (10,000) in one step, then TFAB_TEST_STEPS steps of
 * them (the default is small for CI; tools/bench runs 1,000). Resident memory must not grow
 * by more than 10% between step 100 and the last.
 */

/*
 * Steps of many keys, every tensor checked; resident memory flat from step 100 on; control
 * writes per receive below 0.75 where a slot may carry several messages (TFAB_CTRL_BATCH=1: a
 * step's requests queue behind the credit window and go many to a write), one or more where
 * it may not (0). How many share a write depends on how far the queue runs ahead of the
 * writes: about 0.1 a receive when the caller drives progress, and from 0.1 to 0.51 with a
 * progress thread writing as soon as a request is queued (seen under ASan on 2 busy cores);
 * unbatched is 1.0 and more.
 */
int sc_many_keys(struct mp *mp)
{
	int nkeys = env_int("TFAB_TEST_KEYS", 10000), steps = env_int("TFAB_TEST_STEPS", 3);
	int64_t shape[1] = {16}; /* 64 bytes a key */
	DLTensor *t = calloc((size_t)nkeys, sizeof(*t));
	float *data = calloc((size_t)nkeys, 16 * sizeof(float));
	struct done d = {0};
	struct tfab_stats st0, st;
	long rss100 = 0, rss_end;
	uint64_t t0 = 0;
	char key[32];

	CHECK(t && data);
	CHECK_RC(tfab_get_stats(mp->ctx, &st0), 0);
	for (int k = 0; k < nkeys; k++) {
		t[k] = (DLTensor){.data = data + 16 * k,
				  .device = {kDLCPU, 0},
				  .ndim = 1,
				  .dtype = {kDLFloat, 32, 1},
				  .shape = shape};
	}
	for (int step = 1; step <= steps; step++) {
		int bad = 0;

		if (step == 2)
			t0 = ms_now();
		d.n = 0;
		for (int k = 0; k < nkeys; k++) {
			snprintf(key, sizeof(key), "layer/%d", k);
			if (mp->rank == 1) {
				data[16 * k] = (float)step;
				data[16 * k + 15] = (float)k;
				CHECK_RC(tfab_send(mp->ctx, key, step, &t[k], false, on_sent, &d),
					 0);
			} else {
				CHECK_RC(
				    tfab_recv(mp->ctx, mp->peers[1], key, step, &t[k], on_recv, &d),
				    0);
			}
		}
		CHECK(wait_n(mp, &d, nkeys));
		CHECK(d.errors == 0);
		if (mp->rank == 0) {
			for (int k = 0; k < nkeys; k++)
				bad += data[16 * k] != (float)step || data[16 * k + 15] != (float)k;
			CHECK(bad == 0);
		}
		if (step == 100)
			rss100 = rss_kib();
	}
	rss_end = rss_kib();
	CHECK_RC(tfab_get_stats(mp->ctx, &st), 0);
	if (mp->rank == 0) {
		double fetches = (double)nkeys * steps;
		double cw = (double)(st.writes_ctrl - st0.writes_ctrl) / fetches;
		bool batch = batching(mp, 1);

		printf("many_keys: %d keys x %d steps, %.1f ms a step after the first; rss %ld KiB "
		       "at step 100, %ld KiB at the end; per receive: %.2f control messages, %.3f "
		       "control writes, %.3f fabric writes\n",
		       nkeys, steps, steps > 1 ? (double)(ms_now() - t0) / (steps - 1) : 0.0,
		       rss100, rss_end, (double)(st.ctrl_messages - st0.ctrl_messages) / fetches,
		       cw,
		       (double)(st.writes_ctrl + st.writes_credit + st.writes_content -
				st0.writes_ctrl - st0.writes_credit - st0.writes_content) /
			   fetches);
		if (nkeys >= 1000 && batch)
			CHECK(cw < 0.75);
		else if (nkeys >= 1000)
			CHECK(cw >= 1.0);
	}
#if defined(__SANITIZE_ADDRESS__)
	/*
	 * ASan holds freed memory in its quarantine (up to 256 MiB), so resident memory grows with
	 * any churn and says nothing about ours; LSan checks for leaks there instead.
	 */
	rss100 = 0;
#endif
	if (rss100)
		CHECK(rss_end <= rss100 + rss100 / 10);
	if (d.tensor)
		d.tensor->deleter(d.tensor); /* the last receive's view */
	free(t);
	free(data);
	return 0;
}

/*
 * Keys that are never seen again (their names hold the step, as some jobs' do): with the
 * meta-data cache bounded (TFAB_META_CACHE_ENTRIES, 256 in this scenario's test), the
 * receiver's resident memory stays flat while it receives TFAB_TEST_KEYS of them (100,000
 * by default), and evictions are counted. Every tensor is checked.
 */
int sc_meta_bounded(struct mp *mp)
{
	enum { BATCH = 1000 };
	int nkeys = env_int("TFAB_TEST_KEYS", 100000);
	int64_t shape[1] = {4};
	static float vals[BATCH][4];
	DLTensor t[BATCH];
	struct done d = {0};
	struct tfab_stats st0, st;
	long rss_early = 0, rss_end;
	char key[32];

	CHECK_RC(tfab_get_stats(mp->ctx, &st0), 0);
	for (int base = 0; base < nkeys; base += BATCH) {
		int n = nkeys - base < BATCH ? nkeys - base : BATCH;

		d.n = 0;
		for (int k = 0; k < n; k++) {
			snprintf(key, sizeof(key), "step%d/w", base + k);
			t[k] = (DLTensor){.data = vals[k],
					  .device = {kDLCPU, 0},
					  .ndim = 1,
					  .dtype = {kDLFloat, 32, 1},
					  .shape = shape};
			if (mp->rank == 1) {
				vals[k][0] = (float)(base + k);
				CHECK_RC(tfab_send(mp->ctx, key, 1, &t[k], false, on_sent, &d), 0);
			} else {
				vals[k][0] = -1;
				CHECK_RC(
				    tfab_recv(mp->ctx, mp->peers[1], key, 1, &t[k], on_recv, &d),
				    0);
			}
		}
		CHECK(wait_n(mp, &d, n) && d.errors == 0);
		for (int k = 0; k < n && mp->rank == 0; k++)
			CHECK(vals[k][0] == (float)(base + k));
		if (base / BATCH == nkeys / BATCH / 10)
			rss_early = rss_kib();
	}
	rss_end = rss_kib();
	CHECK_RC(tfab_get_stats(mp->ctx, &st), 0);
	if (mp->rank == 0) {
		printf("meta_bounded: %d keys; rss %ld KiB after a tenth, %ld KiB at the end; %llu "
		       "evictions\n",
		       nkeys, rss_early, rss_end,
		       (unsigned long long)(st.meta_evictions - st0.meta_evictions));
		CHECK(st.meta_evictions - st0.meta_evictions >= (uint64_t)nkeys - 256);
#if !defined(__SANITIZE_ADDRESS__)
		if (nkeys >= 10 * BATCH)
			CHECK(rss_end <= rss_early + rss_early / 10);
#endif
	}
	if (d.tensor)
		d.tensor->deleter(d.tensor);
	return 0;
}
