/*
 * Every entry point from several threads at once, on both ranks: DLPack sends (to any peer
 * and to one), string sends, asynchronous and blocking receives of both kinds into pool and
 * caller tensors, progress, statistics, registration invalidation, step cleanups, flushes,
 * and peers created and destroyed beside the traffic. Each rank's threads send to the other
 * rank and receive from it; every tensor's bytes are checked. CI runs it under
 * ThreadSanitizer (a data race is a failure there), with and without the progress thread.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mp.h"

/* A bound on waits for one event: the stall bound (mp.h). */
#define WAIT_MS mp_stall_ms()
#define THREADS 4

static int env_int(const char *name, int dflt)
{
	const char *v = getenv(name);

	return v && *v ? atoi(v) : dflt;
}

static uint64_t ms_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The value of element k of thread t's tensor i, as sent by rank r. */
static int32_t value_of(int r, int t, int i, int k)
{
	return r * 1000000 + t * 100000 + i * 10 + k;
}

struct counter {
	int n, errors; /* atomic */
};

static void count(struct counter *c, bool ok)
{
	if (!ok)
		__atomic_fetch_add(&c->errors, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&c->n, 1, __ATOMIC_RELEASE);
}

static void on_sent(void *arg, int status)
{
	count(arg, status == 0);
}

/* An asynchronous receive's record: the checks run in the callback. */
struct arecv {
	struct counter *c;
	int from, t, i;
};

static void on_recv(void *arg, int status, DLManagedTensor *m, bool is_dead)
{
	struct arecv *a = arg;
	bool ok =
	    status == 0 && m && !is_dead && m->dl_tensor.ndim == 1 && m->dl_tensor.shape[0] == 4;

	for (int k = 0; ok && k < 4; k++)
		ok = ((int32_t *)m->dl_tensor.data)[k] == value_of(a->from, a->t, a->i, k);
	if (m)
		m->deleter(m);
	count(a->c, ok);
	free(a);
}

static void on_strings(void *arg, int status, struct tfab_string_tensor *s, bool is_dead)
{
	struct arecv *a = arg;
	bool ok = status == 0 && s && !is_dead && s->ndim == 1 && s->shape[0] == 1 &&
		  s->strings[0].len == (size_t)a->i % 300;

	for (size_t k = 0; ok && k < s->strings[0].len; k++)
		ok = s->strings[0].data[k] == (char)('a' + a->t);
	tfab_string_tensor_free(s);
	count(a->c, ok);
	free(a);
}

struct worker {
	struct mp *mp;
	int t, iters;
	int32_t (*vals)[4]; /* iters tensors of this thread's, sent */
	int32_t dest[4];    /* a caller destination for blocking receives */
	char *text;
	struct counter sent, got;
	int failed;
	char why[160];
};

static int fail(struct worker *w, const char *what, int i, int rc)
{
	snprintf(w->why, sizeof(w->why), "thread %d, tensor %d: %s: %s", w->t, i, what,
		 tfab_strerror(rc));
	w->failed = 1;
	return 1;
}

static DLTensor int32_of(int32_t *data, int64_t *shape)
{
	return (DLTensor){.data = data,
			  .device = {kDLCPU, 0},
			  .ndim = 1,
			  .dtype = {kDLInt, 32, 1},
			  .shape = shape};
}

static struct arecv *arecv_new(struct counter *c, int from, int t, int i)
{
	struct arecv *a = malloc(sizeof(*a));

	if (a)
		*a = (struct arecv){c, from, t, i};
	return a;
}

/* Tensor i of this rank goes as a DLPack tensor (even i; to the peer by name when i % 4 == 2)
 * or as strings (odd i). */
static int send_one(struct worker *w, int i, const char *key, int64_t step)
{
	struct mp *mp = w->mp;
	int64_t four = 4, one = 1;
	int rc;

	if (i % 2 == 0) {
		DLTensor t = int32_of(w->vals[i], &four);

		for (int k = 0; k < 4; k++)
			w->vals[i][k] = value_of(mp->rank, w->t, i, k);
		rc = i % 4 == 2 ? tfab_send_to(mp->ctx, mp->peers[1 - mp->rank], key, step, &t,
					       false, on_sent, &w->sent)
				: tfab_send(mp->ctx, key, step, &t, false, on_sent, &w->sent);
	} else {
		struct tfab_string s = {w->text, (size_t)i % 300};
		struct tfab_string_tensor st = {1, &one, &s};

		rc = tfab_send_strings(mp->ctx, key, step, &st, false, on_sent, &w->sent);
	}
	return rc ? fail(w, "send", i, rc) : 0;
}

/*
 * The peer's tensor i of this thread, received the matching way: asynchronously into a pool
 * tensor when i % 3 == 0, else blocking (into a caller destination for a DLPack one).
 */
static int recv_one(struct worker *w, int i, const char *key, int64_t step)
{
	struct mp *mp = w->mp;
	int other = 1 - mp->rank;
	struct tfab_peer *peer = mp->peers[other];
	int64_t four = 4;
	int rc;

	if (i % 3 == 0) {
		struct arecv *a = arecv_new(&w->got, other, w->t, i);

		if (!a)
			return fail(w, "receive", i, -ENOMEM);
		rc = i % 2 == 0 ? tfab_recv(mp->ctx, peer, key, step, NULL, on_recv, a)
				: tfab_recv_strings(mp->ctx, peer, key, step, on_strings, a);
		if (rc)
			free(a);
		return rc ? fail(w, "receive", i, rc) : 0;
	}
	if (i % 2 == 0) {
		DLTensor d = int32_of(w->dest, &four);
		bool ok = true;

		rc = tfab_recv_sync(mp->ctx, peer, key, step, &d, WAIT_MS, NULL, NULL);
		if (rc)
			return fail(w, "blocking receive", i, rc);
		for (int k = 0; k < 4; k++)
			ok &= w->dest[k] == value_of(other, w->t, i, k);
		count(&w->got, ok);
		/* A caller buffer about to be reused differently: forget its registration. */
		if (i % 8 == 0)
			tfab_mr_invalidate(mp->ctx, w->dest, sizeof(w->dest));
		return 0;
	}
	struct tfab_string_tensor *s = NULL;
	bool ok;

	rc = tfab_recv_strings_sync(mp->ctx, peer, key, step, WAIT_MS, &s, NULL);
	if (rc)
		return fail(w, "blocking string receive", i, rc);
	ok = s->ndim == 1 && s->strings[0].len == (size_t)i % 300;
	for (size_t k = 0; ok && k < s->strings[0].len; k++)
		ok = s->strings[0].data[k] == (char)('a' + w->t);
	tfab_string_tensor_free(s);
	count(&w->got, ok);
	return 0;
}

/*
 * A receive and a send nobody matches, on a step of this thread's alone, cleaned up; and a
 * peer made and destroyed beside the traffic.
 */
static int side_work(struct worker *w, int i)
{
	struct mp *mp = w->mp;
	int64_t lonely = 1000 + w->t, four = 4;
	struct counter c = {0};
	DLTensor t = int32_of(w->dest, &four);
	struct arecv *a = arecv_new(&c, 1 - mp->rank, w->t, i);
	struct tfab_peer *extra = NULL;
	uint8_t blob[2048];
	size_t len = sizeof(blob);
	int rc;

	if (!a)
		return fail(w, "cleanup", i, -ENOMEM);
	rc = tfab_recv(mp->ctx, mp->peers[1 - mp->rank], "nobody/sends", lonely, NULL, on_recv, a);
	if (rc) {
		free(a);
		return fail(w, "a receive to clean up", i, rc);
	}
	rc = tfab_send(mp->ctx, "nobody/receives", lonely, &t, false, on_sent, &c);
	if (rc == 0)
		rc = tfab_step_cleanup(mp->ctx, lonely);
	if (rc)
		return fail(w, "a send to clean up", i, rc);
	for (uint64_t until = ms_now() + WAIT_MS;
	     __atomic_load_n(&c.n, __ATOMIC_ACQUIRE) < 2 && ms_now() < until;)
		tfab_progress(mp->ctx);
	if (__atomic_load_n(&c.n, __ATOMIC_ACQUIRE) != 2 || c.errors != 2)
		return fail(w, "the cleanup's callbacks", i, -EIO);
	rc = tfab_peer_create(mp->ctx, &extra);
	if (rc == 0)
		rc = tfab_peer_blob(extra, blob, &len);
	tfab_peer_destroy(extra);
	return rc ? fail(w, "a peer of its own", i, rc) : 0;
}

static void *worker_main(void *p)
{
	struct worker *w = p;
	char key[48];

	for (int i = 0; i < w->iters; i++) {
		int64_t step = 1 + i % 7;

		snprintf(key, sizeof(key), "stress/%d/%d", w->t, i);
		if (send_one(w, i, key, step) || recv_one(w, i, key, step))
			break;
		if (i % 5 == 0) {
			struct tfab_stats st;

			tfab_progress(w->mp->ctx);
			if (tfab_get_stats(w->mp->ctx, &st) || !tfab_context_backend(w->mp->ctx)) {
				fail(w, "statistics", i, -EIO);
				break;
			}
		}
		if (i % 50 == 0 && side_work(w, i))
			break;
	}
	return NULL;
}

static int sc_stress(struct mp *mp)
{
	int iters = env_int("TFAB_TEST_ITERS", 400);
	struct worker *w = calloc(THREADS, sizeof(*w));
	pthread_t th[THREADS];
	int rc = 0;

	CHECK(w);
	for (int t = 0; t < THREADS; t++) {
		w[t].mp = mp;
		w[t].t = t;
		w[t].iters = iters;
		w[t].vals = calloc((size_t)iters, sizeof(*w[t].vals));
		w[t].text = malloc(300);
		CHECK(w[t].vals && w[t].text);
		memset(w[t].text, 'a' + t, 300);
	}
	for (int t = 0; t < THREADS; t++)
		CHECK(pthread_create(&th[t], NULL, worker_main, &w[t]) == 0);
	for (int t = 0; t < THREADS; t++)
		pthread_join(th[t], NULL);
	/* Every send taken (flush), and every asynchronous receive in. */
	rc = tfab_flush(mp->ctx, WAIT_MS);
	for (int t = 0; t < THREADS; t++) {
		if (w[t].failed) {
			fprintf(stderr, "rank %d: %s\n", mp->rank, w[t].why);
			return 1;
		}
		CHECK(mp_wait_count(mp, &w[t].sent.n, iters, WAIT_MS));
		CHECK(mp_wait_count(mp, &w[t].got.n, iters, WAIT_MS));
		CHECK(w[t].sent.errors == 0 && w[t].got.errors == 0);
	}
	CHECK_RC(rc, 0);
	for (int t = 0; t < THREADS; t++) {
		free(w[t].vals);
		free(w[t].text);
	}
	free(w);
	return 0;
}

static const struct mp_scenario scenarios[] = {
    {.name = "stress", .nranks = 2, .fn = sc_stress},
};

int main(int argc, char **argv)
{
	return mp_main(argc, argv, scenarios, (int)(sizeof(scenarios) / sizeof(scenarios[0])));
}
