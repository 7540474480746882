/*
 * The helpers that the engine scenarios share; engine_test.h says what each does.
 */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine_test.h"

const DLDataType f32 = {kDLFloat, 32, 1};

struct log_capture logged = {.lock = PTHREAD_MUTEX_INITIALIZER};

void tensor_make(struct tensor *t, DLDataType dtype, int ndim, const int64_t *shape)
{
	size_t n = 1;

	memset(t, 0, sizeof(*t));
	for (int i = 0; i < ndim; i++) {
		t->shape[i] = shape[i];
		n *= (size_t)shape[i];
	}
	t->nbytes = (n * dtype.bits * dtype.lanes + 7u) / 8u; /* packed, as DLPack sub-byte types */
	t->buf = malloc(t->nbytes ? t->nbytes : 1);
	t->dl.data = t->buf;
	t->dl.device.device_type = kDLCPU;
	t->dl.ndim = ndim;
	t->dl.dtype = dtype;
	t->dl.shape = t->shape;
}

void tensor_fill(struct tensor *t, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 7;

	for (size_t i = 0; i < t->nbytes; i++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		t->buf[i] = (uint8_t)(x >> 56);
	}
}

bool bytes_match(const void *p, size_t n, uint64_t seed)
{
	struct tensor ref = {0};

	ref.nbytes = n;
	ref.buf = malloc(n ? n : 1);
	tensor_fill(&ref, seed);
	bool ok = memcmp(ref.buf, p, n) == 0;

	free(ref.buf);
	return ok;
}

void tensor_free(struct tensor *t)
{
	free(t->buf);
	t->buf = NULL;
}

void on_sent(void *arg, int status)
{
	struct done *d = arg;

	if (status) {
		d->errors++;
		d->last_status = status;
	}
	__atomic_fetch_add(&d->n, 1, __ATOMIC_RELEASE);
}

void on_recv(void *arg, int status, DLManagedTensor *t, bool is_dead)
{
	struct done *d = arg;

	if (status) {
		d->errors++;
		d->last_status = status;
	}
	if (d->tensor)
		d->tensor->deleter(d->tensor); /* only the last one is kept */
	d->tensor = t;
	d->is_dead = is_dead;
	__atomic_fetch_add(&d->n, 1, __ATOMIC_RELEASE);
}

void on_recv_drop(void *arg, int status, DLManagedTensor *t, bool is_dead)
{
	struct done *d = arg;

	(void)is_dead;
	if (t)
		t->deleter(t);
	if (status) {
		d->errors++;
		d->last_status = status;
	}
	__atomic_fetch_add(&d->n, 1, __ATOMIC_RELEASE);
}

void capture(void *arg, enum tfab_log_level level, const char *subsys, const char *msg)
{
	(void)arg;
	(void)subsys;
	pthread_mutex_lock(&logged.lock);
	if (logged.n < LOG_LINES) {
		logged.level[logged.n] = level;
		snprintf(logged.text[logged.n], sizeof(logged.text[0]), "%s", msg);
		logged.n++;
	}
	pthread_mutex_unlock(&logged.lock);
}

int lines_with(int level, const char *a, const char *b, const char *c)
{
	int n = 0;

	pthread_mutex_lock(&logged.lock);
	for (int i = 0; i < logged.n; i++)
		n += (level < 0 || (int)logged.level[i] == level) && strstr(logged.text[i], a) &&
		     (!b || strstr(logged.text[i], b)) && (!c || strstr(logged.text[i], c));
	pthread_mutex_unlock(&logged.lock);
	return n;
}

int done_n(struct done *d)
{
	return __atomic_load_n(&d->n, __ATOMIC_ACQUIRE);
}

int wait_n(struct mp *mp, struct done *d, int n)
{
	struct mp_watch w;

	mp_watch_start(&w, mp, NULL, "completions", done_n(d));
	for (int i = 0; done_n(d) < n; i++) {
		for (int k = 0; k < 1000 && done_n(d) < n; k++)
			tfab_progress(mp->ctx);
		if (done_n(d) < n && mp_watch_stalled(&w, done_n(d)))
			return 0;
		if (done_n(d) < n)
			usleep(i < 10 ? 0 : 100);
	}
	return 1;
}

int recv_one(struct mp *mp, int from, const char *key, int64_t step, DLManagedTensor **t_p,
	     bool *dead_p)
{
	return tfab_recv_sync(mp->ctx, mp->peers[from], key, step, NULL, WAIT_MS, t_p, dead_p);
}

int context_with(struct tfab_context **ctx_p, const char *const *env)
{
	char *was[16];
	size_t n = 0;
	int rc;

	for (; env[2 * n]; n++) {
		const char *v = getenv(env[2 * n]);

		assert(n < sizeof(was) / sizeof(was[0]));
		was[n] = v ? strdup(v) : NULL;
		if (env[2 * n + 1])
			setenv(env[2 * n], env[2 * n + 1], 1);
		else
			unsetenv(env[2 * n]);
	}
	rc = tfab_context_create(ctx_p);
	for (size_t i = 0; i < n; i++) {
		if (was[i])
			setenv(env[2 * i], was[i], 1);
		else
			unsetenv(env[2 * i]);
		free(was[i]);
	}
	return rc;
}

int progress_until_note(struct mp *mp, struct tfab_context *ctx, const char *what)
{
	uint64_t until = ms_now() + (uint64_t)WAIT_MS;

	while (mp_wait_note_quiet(mp, 1, what, 1) != 0) {
		if (ms_now() > until)
			return -ETIMEDOUT;
		for (int k = 0; k < 100; k++)
			tfab_progress(ctx);
	}
	return 0;
}

int send_one(struct mp *mp, struct tfab_context *ctx, const char *key, int64_t step, uint64_t seed)
{
	int64_t shape[1] = {32};
	struct tensor t;
	struct done d = {0};
	struct mp_watch w;

	tensor_make(&t, f32, 1, shape);
	tensor_fill(&t, seed);
	CHECK_RC(tfab_send(ctx, key, step, &t.dl, false, on_sent, &d), 0);
	mp_watch_start(&w, mp, ctx, "a send on the reconnected pair", 0);
	while (done_n(&d) < 1) {
		tfab_progress(ctx);
		CHECK(!mp_watch_stalled(&w, done_n(&d)));
	}
	CHECK(d.errors == 0);
	tensor_free(&t);
	return 0;
}

int own_pair_end(struct mp *mp, struct tfab_context *ctx, struct tfab_peer *peer, const char *tag)
{
	char done[40], left[40];

	snprintf(done, sizeof(done), "%s_done", tag);
	snprintf(left, sizeof(left), "%s_left", tag);
	if (mp->rank == 0) {
		CHECK_RC(mp_note(mp, done), 0);
		CHECK_RC(mp_wait_note(mp, 1, left, WAIT_MS), 0);
		CHECK_RC(tfab_context_destroy(ctx), 0);
		return 0;
	}
	CHECK_RC(mp_wait_note(mp, 0, done, WAIT_MS), 0);
	if (peer)
		CHECK_RC(tfab_peer_destroy(peer), 0);
	CHECK_RC(tfab_context_destroy(ctx), 0);
	CHECK_RC(mp_note(mp, left), 0);
	return 0;
}

bool wait_ctx(struct mp *mp, struct tfab_context *ctx, struct done *d, int n)
{
	struct mp_watch w;

	mp_watch_start(&w, mp, ctx, "completions", done_n(d));
	while (done_n(d) < n) {
		tfab_progress(ctx);
		if (mp_watch_stalled(&w, done_n(d)))
			return false;
	}
	return true;
}

uint64_t ms_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

DLTensor int32_scalar(int32_t *v, int64_t *one)
{
	return (DLTensor){
	    .data = v, .device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLInt, 32, 1}, .shape = one};
}
