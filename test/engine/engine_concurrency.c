/*
 * Engine scenarios: several things at once. Four threads send and receive on each side.
 * Callbacks never overlap, whichever threads drive progress, and one may call a blocking
 * receive. Four processes each send to every other, and one context holds peers on two paths.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine_scenarios.h"
#include "engine_test.h"

struct thread_arg {
	struct mp *mp;
	int id, n, failed;
};

static void *recv_thread(void *p)
{
	struct thread_arg *a = p;
	char key[32];

	for (int i = 0; i < a->n; i++) {
		DLManagedTensor *m = NULL;
		int rc;

		snprintf(key, sizeof(key), "thr/%d/%d", a->id, i);
		rc = tfab_recv_sync(a->mp->ctx, a->mp->peers[1], key, 9, NULL, WAIT_MS, &m, NULL);
		if (rc || !m || *(int32_t *)m->dl_tensor.data != a->id * 100000 + i) {
			a->failed = 1;
			fprintf(stderr, "thread %d key %d: %s\n", a->id, i, tfab_strerror(rc));
		}
		if (m)
			m->deleter(m);
	}
	return NULL;
}

static void *send_thread(void *p)
{
	struct thread_arg *a = p;
	int32_t *vals = malloc(sizeof(int32_t) * (size_t)a->n);
	int64_t one = 1;
	struct done *d = calloc(1, sizeof(*d)); /* left to late callbacks if the sends stall */
	struct mp_watch w;
	char key[32];

	for (int i = 0; i < a->n; i++) {
		DLTensor t = {.data = &vals[i],
			      .device = {kDLCPU, 0},
			      .ndim = 1,
			      .dtype = {kDLInt, 32, 1},
			      .shape = &one};

		vals[i] = a->id * 100000 + i;
		snprintf(key, sizeof(key), "thr/%d/%d", a->id, i);
		if (tfab_send(a->mp->ctx, key, 9, &t, false, on_sent, d))
			a->failed = 1;
	}
	mp_watch_start(&w, a->mp, NULL, "the sends", 0);
	while (done_n(d) < a->n && !mp_watch_stalled(&w, done_n(d)))
		tfab_progress(a->mp->ctx);
	if (done_n(d) < a->n) {
		a->failed = 1;
		return NULL;
	}
	a->failed |= d->errors != 0;
	free(d);
	free(vals);
	return NULL;
}

/* Sends and receives from four threads at once on each side. */
int sc_threads(struct mp *mp)
{
	pthread_t th[4];
	struct thread_arg a[4];

	for (int i = 0; i < 4; i++) {
		a[i] = (struct thread_arg){.mp = mp, .id = i, .n = 300};
		CHECK(pthread_create(&th[i], NULL, mp->rank ? send_thread : recv_thread, &a[i]) ==
		      0);
	}
	/* every thread joined before any check: they use a[] and the context */
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < 4; i++)
		CHECK(!a[i].failed);
	return 0;
}

enum { SERIAL_OPS = 1000, SERIAL_DRIVERS = 3 };

struct serial {
	struct mp *mp;
	int posted;
	int inside;   /* atomic: a callback is running */
	int overlaps; /* atomic: callbacks that found another one running */
	int finished; /* atomic: callbacks run, for the drivers */
	int count;    /* plain: callbacks never run at once */
	int errors;
};

static void serial_done(struct serial *s, int status)
{
	if (__atomic_exchange_n(&s->inside, 1, __ATOMIC_ACQUIRE))
		__atomic_fetch_add(&s->overlaps, 1, __ATOMIC_RELAXED);
	/* let the other threads run: the window a callback run at the same time would hit */
	sched_yield();
	s->count++;
	s->errors += status != 0;
	__atomic_store_n(&s->inside, 0, __ATOMIC_RELEASE);
	__atomic_fetch_add(&s->finished, 1, __ATOMIC_RELEASE); /* the last touch of s */
}

static void serial_sent(void *arg, int status)
{
	serial_done(arg, status);
}

static void serial_recv(void *arg, int status, DLManagedTensor *t, bool is_dead)
{
	(void)is_dead;
	if (t)
		t->deleter(t);
	serial_done(arg, status || !t);
}

static void *serial_driver(void *p)
{
	struct serial *s = p;
	struct mp_watch w;
	int n;

	mp_watch_start(&w, s->mp, NULL, "the callbacks", 0);
	while ((n = __atomic_load_n(&s->finished, __ATOMIC_ACQUIRE)) < s->posted &&
	       !mp_watch_stalled(&w, n))
		tfab_progress(s->mp->ctx);
	return NULL;
}

/*
 * A context's callbacks never run at the same time, whichever threads drive progress: three
 * threads (and the progress thread, when on) drive it while 1,000 sends (rank 1) or receives
 * (rank 0) complete. Each callback checks that no other one is running, and counts with a
 * plain increment. A blocking receive that gives up says so.
 */
int sc_callbacks_serial(struct mp *mp)
{
	struct serial *s = calloc(1, sizeof(*s));
	int32_t *vals = calloc(SERIAL_OPS, sizeof(*vals));
	pthread_t th[SERIAL_DRIVERS];
	int64_t one = 1;
	char key[32];
	int rc = 0;

	CHECK(s && vals);
	s->mp = mp;
	if (mp->rank == 0) {
		DLManagedTensor *m = NULL;

		CHECK_RC(
		    tfab_recv_sync(mp->ctx, mp->peers[1], "serial/never", 12, NULL, 200, &m, NULL),
		    -ETIMEDOUT);
		CHECK(m == NULL);
	}
	for (int i = 0; i < SERIAL_OPS && rc == 0; i++) {
		DLTensor t = {.data = &vals[i],
			      .device = {kDLCPU, 0},
			      .ndim = 1,
			      .dtype = {kDLInt, 32, 1},
			      .shape = &one};

		snprintf(key, sizeof(key), "serial/%d", i);
		vals[i] = i;
		if (mp->rank == 1)
			rc = tfab_send(mp->ctx, key, 12, &t, false, serial_sent, s);
		else
			rc = tfab_recv(mp->ctx, mp->peers[1], key, 12, NULL, serial_recv, s);
		if (rc == 0)
			s->posted++;
	}
	for (int i = 0; i < SERIAL_DRIVERS; i++)
		CHECK(pthread_create(&th[i], NULL, serial_driver, s) == 0);
	for (int i = 0; i < SERIAL_DRIVERS; i++)
		pthread_join(th[i], NULL);
	CHECK_RC(rc, 0);
	/* s and vals stay allocated while callbacks may still come */
	CHECK(__atomic_load_n(&s->finished, __ATOMIC_ACQUIRE) == SERIAL_OPS);
	CHECK(s->overlaps == 0);
	CHECK(s->count == SERIAL_OPS && s->errors == 0);
	free(s);
	free(vals);
	return 0;
}

struct nested {
	struct mp *mp;
	int rc;
	int32_t value;
	int done; /* atomic */
};

static void nested_cb(void *arg, int status, DLManagedTensor *t, bool is_dead)
{
	struct nested *n = arg;
	DLManagedTensor *m = NULL;

	(void)is_dead;
	if (t)
		t->deleter(t);
	n->rc =
	    tfab_recv_sync(n->mp->ctx, n->mp->peers[1], "nested/inner", 13, NULL, 5000, &m, NULL);
	if (status && n->rc == 0)
		n->rc = status;
	if (m) {
		n->value = *(int32_t *)m->dl_tensor.data;
		m->deleter(m);
	}
	__atomic_store_n(&n->done, 1, __ATOMIC_RELEASE); /* the last touch of n */
}

/*
 * A callback that calls a blocking receive: it completes wherever the callback runs, on the
 * progress thread too (which then drives progress itself).
 */
int sc_callback_recv_sync(struct mp *mp)
{
	static int32_t vals[2] = {7, 8};
	int64_t one = 1;
	DLTensor t[2] = {int32_scalar(&vals[0], &one), int32_scalar(&vals[1], &one)};

	if (mp->rank == 1) {
		struct done d = {0};

		CHECK_RC(tfab_send(mp->ctx, "nested/outer", 13, &t[0], false, on_sent, &d), 0);
		CHECK_RC(tfab_send(mp->ctx, "nested/inner", 13, &t[1], false, on_sent, &d), 0);
		CHECK(wait_n(mp, &d, 2));
		CHECK(d.errors == 0);
		return 0;
	}
	struct nested *n = calloc(1, sizeof(*n));
	uint64_t deadline = ms_now() + WAIT_MS;

	CHECK(n);
	n->mp = mp;
	CHECK_RC(tfab_recv(mp->ctx, mp->peers[1], "nested/outer", 13, NULL, nested_cb, n), 0);
	/* With the progress thread, leave the callback to it. */
	while (!__atomic_load_n(&n->done, __ATOMIC_ACQUIRE) && ms_now() < deadline) {
		if (mp->ctx->thread_running)
			usleep(1000);
		else
			tfab_progress(mp->ctx);
	}
	CHECK(__atomic_load_n(&n->done, __ATOMIC_ACQUIRE)); /* else n is left to the callback */
	CHECK_RC(n->rc, 0);
	CHECK(n->value == 8);
	free(n);
	return 0;
}

/* Four processes, each sending to and receiving from every other. */
int sc_all_to_all(struct mp *mp)
{
	enum { N = 20 };
	struct tensor t[MP_MAX_RANKS][N];
	struct done sent = {0}, got = {0};
	DLManagedTensor *m[MP_MAX_RANKS][N] = {{0}};
	char key[64];
	int expect = 0;

	for (int r = 0; r < mp->nranks; r++) {
		if (r == mp->rank)
			continue;
		for (int i = 0; i < N; i++) {
			int64_t shape[1] = {1 + i * 97};

			tensor_make(&t[r][i], f32, 1, shape);
			tensor_fill(&t[r][i], (uint64_t)(mp->rank * 1000 + r * 100 + i));
			snprintf(key, sizeof(key), "a2a/%d/%d/%d", mp->rank, r, i);
			CHECK_RC(tfab_send(mp->ctx, key, 4, &t[r][i].dl, false, on_sent, &sent), 0);
			snprintf(key, sizeof(key), "a2a/%d/%d/%d", r, mp->rank, i);
			CHECK_RC(tfab_recv_sync(mp->ctx, mp->peers[r], key, 4, NULL, WAIT_MS,
						&m[r][i], NULL),
				 0);
			expect++;
		}
	}
	(void)got;
	CHECK(wait_n(mp, &sent, expect));
	CHECK(sent.errors == 0);
	for (int r = 0; r < mp->nranks; r++) {
		if (r == mp->rank)
			continue;
		for (int i = 0; i < N; i++) {
			CHECK(bytes_match(m[r][i]->dl_tensor.data, t[r][i].nbytes,
					  (uint64_t)(r * 1000 + mp->rank * 100 + i)));
			m[r][i]->deleter(m[r][i]);
			tensor_free(&t[r][i]);
		}
	}
	return 0;
}

/*
 * Mixed paths: rank 3 has only the network path (TFAB_TEST_NET_PATH, e.g. ofi:tcp), the
 * others the same-host path first (TFAB_PROVIDER, e.g. "shm,ofi:tcp"); so ranks 0-2 talk over
 * the same-host path, and every rank talks to rank 3 over the network one, in one context.
 * Each rank checks each peer's path, then all of them send to and receive from all, into
 * library and caller destinations, data checked.
 */
const char *mixed_provider(int rank)
{
	return rank == 3 ? getenv("TFAB_TEST_NET_PATH") : NULL;
}

int sc_mixed_paths(struct mp *mp)
{
	const char *net = getenv("TFAB_TEST_NET_PATH"), *names[TFAB_MAX_PATHS];
	int n = tfab_context_paths(mp->ctx, names, TFAB_MAX_PATHS);
	int64_t shape[1] = {1 << 16};
	struct tensor t[MP_MAX_RANKS], into;
	struct done sent = {0};
	char key[64];

	CHECK(net && n >= 1);
	for (int r = 0; r < mp->nranks; r++) {
		const char *want = (r == 3 || mp->rank == 3) ? net : names[0];
		const char *path = r == mp->rank ? NULL : tfab_peer_path(mp->peers[r]);

		if (r == mp->rank)
			continue;
		printf("mixed_paths: rank %d to rank %d on %s\n", mp->rank, r, path ? path : "?");
		CHECK(path && strcmp(path, want) == 0);
	}
	/* rank 3 is on one path, the others on two: both are really used below. */
	CHECK(mp->rank == 3 ? n == 1 : n >= 2);
	CHECK(mp->rank == 3 || strcmp(names[0], net) != 0);
	tensor_make(&into, f32, 1, shape);
	for (int r = 0; r < mp->nranks; r++) {
		DLManagedTensor *m = NULL;

		if (r == mp->rank)
			continue;
		tensor_make(&t[r], f32, 1, shape);
		tensor_fill(&t[r], (uint64_t)(mp->rank * 10 + r));
		snprintf(key, sizeof(key), "mixed/%d/%d", mp->rank, r);
		CHECK_RC(
		    tfab_send_to(mp->ctx, mp->peers[r], key, 5, &t[r].dl, false, on_sent, &sent),
		    0);
		snprintf(key, sizeof(key), "mixed/%d/%d", r, mp->rank);
		CHECK_RC(tfab_recv_into_sync(mp->ctx, mp->peers[r], key, 5, &into.dl, 0, WAIT_MS,
					     &m, NULL),
			 0);
		CHECK(bytes_match(into.dl.data, into.nbytes, (uint64_t)(r * 10 + mp->rank)));
		m->deleter(m);
	}
	CHECK(wait_n(mp, &sent, mp->nranks - 1));
	CHECK(sent.errors == 0);
	for (int r = 0; r < mp->nranks; r++)
		if (r != mp->rank)
			tensor_free(&t[r]);
	tensor_free(&into);
	fflush(stdout);
	return sc_all_to_all(mp);
}
