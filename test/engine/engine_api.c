/*
 * Engine scenarios: the edges of the API. Sends for one peer, tfab_flush, caller
 * destinations of another shape, what TFAB_LOG_LEVEL shows, and bad input, refused with a
 * clear error and nothing else disturbed.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine/engine.h"
#include "engine_scenarios.h"
#include "engine_test.h"

/*
 * Sends for one peer: one key and step feeds ranks 1 and 2 a tensor each; overlapping sends
 * are refused; a request from another peer does not take a send that is not for it, even
 * when it comes first.
 */
int sc_send_to(struct mp *mp)
{
	static int32_t vals[3] = {101, 102, 103};
	int64_t one = 1;
	DLTensor t[3] = {int32_scalar(&vals[0], &one), int32_scalar(&vals[1], &one),
			 int32_scalar(&vals[2], &one)};

	if (mp->rank == 0) {
		struct done d = {0}, never = {0};

		CHECK_RC(tfab_send_to(mp->ctx, mp->peers[1], "feed", 1, &t[1], false, on_sent, &d),
			 0);
		CHECK_RC(tfab_send_to(mp->ctx, mp->peers[2], "feed", 1, &t[2], false, on_sent, &d),
			 0);
		CHECK_RC(
		    tfab_send_to(mp->ctx, mp->peers[1], "feed", 1, &t[0], false, on_sent, &never),
		    -EEXIST);
		CHECK_RC(tfab_send(mp->ctx, "feed", 1, &t[0], false, on_sent, &never), -EEXIST);
		CHECK_RC(tfab_send_to(mp->ctx, NULL, "feed", 2, &t[0], false, on_sent, &never),
			 -EINVAL);
		/* Rank 2 asks for "only1" first; it is rank 1's. */
		CHECK_RC(mp_wait_note(mp, 2, "asked", WAIT_MS), 0);
		CHECK_RC(tfab_send_to(mp->ctx, mp->peers[1], "only1", 1, &t[1], false, on_sent, &d),
			 0);
		CHECK(wait_n(mp, &d, 3));
		CHECK(d.errors == 0 && never.n == 0);
		CHECK_RC(mp_wait_note(mp, 2, "checked", WAIT_MS), 0);
		/* And an any-peer send overlaps a send for one peer, the other way round too. */
		CHECK_RC(tfab_send(mp->ctx, "any", 1, &t[0], false, on_sent, &d), 0);
		CHECK_RC(
		    tfab_send_to(mp->ctx, mp->peers[2], "any", 1, &t[0], false, on_sent, &never),
		    -EEXIST);
		CHECK_RC(tfab_step_cleanup(mp->ctx, 1), 0);
		CHECK(wait_n(mp, &d, 4));
		CHECK(d.errors == 1 && d.last_status == -TFAB_ERR_ABORTED);
		return 0;
	}
	DLManagedTensor *m = NULL;

	CHECK_RC(recv_one(mp, 0, "feed", 1, &m, NULL), 0);
	CHECK(*(int32_t *)m->dl_tensor.data == vals[mp->rank]);
	m->deleter(m);
	if (mp->rank == 2) {
		struct done d = {0};

		CHECK_RC(tfab_recv(mp->ctx, mp->peers[0], "only1", 1, NULL, on_recv, &d), 0);
		tfab_progress(mp->ctx);
		CHECK_RC(mp_note(mp, "asked"), 0);
		CHECK_RC(mp_wait_note(mp, 1, "got", WAIT_MS), 0);
		CHECK(done_n(&d) == 0);
		CHECK_RC(mp_note(mp, "checked"), 0);
		CHECK_RC(tfab_step_cleanup(mp->ctx, 1), 0);
		CHECK(wait_n(mp, &d, 1));
		CHECK(d.errors == 1);
		return 0;
	}
	CHECK_RC(recv_one(mp, 0, "only1", 1, &m, NULL), 0);
	CHECK(*(int32_t *)m->dl_tensor.data == vals[1]);
	m->deleter(m);
	CHECK_RC(mp_note(mp, "got"), 0);
	return 0;
}

struct flush_arg {
	struct mp *mp;
	int rc;
	int n; /* atomic */
};

static void flush_in_callback(void *arg, int status)
{
	struct flush_arg *f = arg;

	(void)status;
	f->rc = tfab_flush(f->mp->ctx, 1000);
	__atomic_fetch_add(&f->n, 1, __ATOMIC_RELEASE);
}

/*
 * tfab_flush: with nothing posted it returns at once; it waits until every send posted
 * before it has been taken, and (without the progress thread) their callbacks have run; a
 * send nobody takes makes it time out; from a send's callback it refuses.
 */
int sc_flush(struct mp *mp)
{
	enum { N = 50 };
	static int32_t vals[N + 2];
	int64_t one = 1;
	char key[32];

	if (mp->rank == 0) {
		for (int i = 0; i < N + 1; i++) {
			DLManagedTensor *m = NULL;

			snprintf(key, sizeof(key), "flush/%d", i);
			CHECK_RC(recv_one(mp, 1, key, i < N ? 2 : 3, &m, NULL), 0);
			CHECK(*(int32_t *)m->dl_tensor.data == i);
			m->deleter(m);
		}
		return 0;
	}
	struct done d = {0}, orphan = {0};
	struct flush_arg f = {.mp = mp};
	DLTensor t;

	CHECK_RC(tfab_flush(mp->ctx, 0), 0);
	for (int i = 0; i < N; i++) {
		vals[i] = i;
		t = int32_scalar(&vals[i], &one);
		snprintf(key, sizeof(key), "flush/%d", i);
		CHECK_RC(tfab_send(mp->ctx, key, 2, &t, false, on_sent, &d), 0);
	}
	CHECK_RC(tfab_flush(mp->ctx, WAIT_MS), 0);
	if (!mp->ctx->thread_running)
		CHECK(done_n(&d) == N);
	CHECK(wait_n(mp, &d, N));
	CHECK(d.errors == 0);
	/* Nobody receives this one. */
	t = int32_scalar(&vals[N + 1], &one);
	CHECK_RC(tfab_send(mp->ctx, "flush/never", 4, &t, false, on_sent, &orphan), 0);
	CHECK_RC(tfab_flush(mp->ctx, 200), -ETIMEDOUT);
	CHECK_RC(tfab_step_cleanup(mp->ctx, 4), 0);
	CHECK(wait_n(mp, &orphan, 1));
	/* A flush inside a send's callback refuses rather than waiting for itself. */
	vals[N] = N;
	t = int32_scalar(&vals[N], &one);
	snprintf(key, sizeof(key), "flush/%d", N);
	CHECK_RC(tfab_send(mp->ctx, key, 3, &t, false, flush_in_callback, &f), 0);
	for (uint64_t until = ms_now() + WAIT_MS;
	     !__atomic_load_n(&f.n, __ATOMIC_ACQUIRE) && ms_now() < until;)
		tfab_progress(mp->ctx);
	CHECK(__atomic_load_n(&f.n, __ATOMIC_ACQUIRE) == 1);
	CHECK_RC(f.rc, -EDEADLK);
	return 0;
}

#define D TFAB_LOG_DEBUG

/*
 * What TFAB_LOG_LEVEL shows. At debug, one line per event with the peer, key and step: the
 * connection, each request, a request parked for its send, a meta-data reply and the cache's
 * change, a receive that gave up and its cancel, the verdict; at trace, each write as well; at
 * info, none of them. A clean exchange, the peer leaving at the end included, warns of
 * nothing. Each rank makes a pair of contexts of its own under a capturing sink.
 */
int sc_debug_log(struct mp *mp)
{
	enum tfab_log_level before = tfab_log_set_level(TFAB_LOG_DEBUG);
	int32_t v = 5;
	int64_t one = 1;
	DLTensor t = int32_scalar(&v, &one);
	struct tfab_context *ctx;
	struct tfab_peer *peer;
	struct done d = {0};
	unsigned port;

	logged.n = 0;
	tfab_log_set_sink(capture, NULL);
	CHECK_RC(tfab_context_create(&ctx), 0);
	if (mp->rank == 0) {
		DLManagedTensor *m = NULL;
		uint16_t p16;

		CHECK_RC(tfab_listen(ctx, "127.0.0.1", 0, &p16), 0);
		CHECK_RC(mp_put(mp, "dbg_port", p16), 0);
		CHECK_RC(tfab_accept(ctx, 20000, &peer), 0);
		CHECK_RC(tfab_recv_sync(ctx, peer, "dbg/a", 1, NULL, WAIT_MS, &m, NULL), 0);
		m->deleter(m);
		CHECK_RC(tfab_recv_sync(ctx, peer, "dbg/never", 2, NULL, 100, &m, NULL),
			 -ETIMEDOUT);
		tfab_log_set_level(TFAB_LOG_TRACE);
		CHECK_RC(tfab_recv_sync(ctx, peer, "dbg/b", 3, NULL, WAIT_MS, &m, NULL), 0);
		m->deleter(m);
		tfab_log_set_level(TFAB_LOG_INFO);
		CHECK_RC(tfab_recv_sync(ctx, peer, "dbg/c", 4, NULL, WAIT_MS, &m, NULL), 0);
		m->deleter(m);
		/* Rank 1 leaves with nothing pending: news, not a warning. */
		for (uint64_t until = ms_now() + WAIT_MS;
		     !lines_with(TFAB_LOG_INFO, "is gone", NULL, NULL) && ms_now() < until;)
			tfab_progress(ctx);
		CHECK(lines_with(TFAB_LOG_INFO, "is gone", "nothing was pending", NULL) == 1);
		CHECK_RC(tfab_peer_destroy(peer), 0);
		CHECK_RC(tfab_context_destroy(ctx), 0);
		CHECK(lines_with(D, "connected", "peer 0", NULL) == 1);
		CHECK(lines_with(D, "request", "'dbg/a' step 1", "peer 0") >= 1);
		CHECK(lines_with(D, "meta-data from peer 0", "'dbg/a' step 1", NULL) == 1);
		CHECK(lines_with(D, "'dbg/never' step 2", "fails", "cancel sent") == 1);
		CHECK(lines_with(D, "'dbg/b' step 3", NULL, NULL) >= 1);
		CHECK(lines_with(TFAB_LOG_TRACE, "'dbg/b' step 3", "landed", NULL) == 1);
		CHECK(lines_with(TFAB_LOG_TRACE, "'dbg/a'", NULL, NULL) == 0);
		CHECK(lines_with(-1, "'dbg/c'", NULL, NULL) == 0);
	} else {
		size_t parked = 0;

		CHECK_RC(mp_get(mp, 0, "dbg_port", &port), 0);
		CHECK_RC(tfab_connect(ctx, "127.0.0.1", (uint16_t)port, 20000, &peer), 0);
		/* Wait for the request, so that it is parked before the send. */
		for (uint64_t until = ms_now() + WAIT_MS; parked == 0 && ms_now() < until;) {
			tfab_progress(ctx);
			tfab__ctx_lock(ctx);
			parked = ctx->parked.count;
			tfab__ctx_unlock(ctx);
		}
		CHECK_RC(tfab_send(ctx, "dbg/a", 1, &t, false, on_sent, &d), 0);
		CHECK_RC(tfab_send(ctx, "dbg/b", 3, &t, false, on_sent, &d), 0);
		CHECK_RC(tfab_send(ctx, "dbg/c", 4, &t, false, on_sent, &d), 0);
		CHECK_RC(tfab_flush(ctx, WAIT_MS), 0);
		CHECK(d.errors == 0);
		CHECK_RC(tfab_peer_destroy(peer), 0);
		CHECK_RC(tfab_context_destroy(ctx), 0);
		CHECK(lines_with(D, "'dbg/a' step 1", "parked", "peer 0") == 1);
		CHECK(lines_with(D, "meta-data to peer 0", "'dbg/a' step 1", NULL) == 1);
		CHECK(lines_with(D, "peer 0 took 'dbg/a' step 1", NULL, NULL) == 1);
		CHECK(lines_with(D, "peer 0 cancelled request", NULL, NULL) == 1);
	}
	tfab_log_set_sink(NULL, NULL);
	tfab_log_set_level(before);
	CHECK(lines_with(TFAB_LOG_WARN, "", NULL, NULL) == 0);
	CHECK(lines_with(TFAB_LOG_ERROR, "", NULL, NULL) == 0);
	return 0;
}

/* Whether m is a view of the caller's buffer buf with the given shape. */
static bool view_of(const DLManagedTensor *m, const void *buf, int ndim, const int64_t *shape)
{
	if (!m || m->dl_tensor.data != buf || m->dl_tensor.ndim != ndim)
		return false;
	for (int i = 0; i < ndim; i++)
		if (m->dl_tensor.shape[i] != shape[i])
			return false;
	return true;
}

/*
 * A caller's destination of another shape: refused (-EINVAL) when it differs, even with the
 * same bytes ([32,32] for [1024]) or more room ([2048]), and of another dtype; taken with
 * TFAB_RECV_ANY_SHAPE when the bytes fit (the view says the tensor's shape), refused with
 * -EMSGSIZE when they do not. Every refusal leaves the send to the next receive; every
 * success reports the tensor's dtype and shape.
 */
int sc_dest_shape(struct mp *mp)
{
	int64_t s1024[1] = {1024}, s2048[1] = {2048}, s32x32[2] = {32, 32}, s512[1] = {512};
	struct tensor src, d2048, d32x32, dint, d512, d1024;

	tensor_make(&src, f32, 1, s1024);
	if (mp->rank == 1) {
		struct done d = {0};

		tensor_fill(&src, 33);
		for (int64_t step = 1; step <= 4; step++)
			CHECK_RC(tfab_send(mp->ctx, "shaped", step, &src.dl, false, on_sent, &d),
				 0);
		CHECK(wait_n(mp, &d, 4));
		CHECK(d.errors == 0);
		tensor_free(&src);
		return 0;
	}
	struct tfab_peer *p = mp->peers[1];
	DLManagedTensor *m = NULL;
	int rc;

	tensor_make(&d2048, f32, 1, s2048);
	tensor_make(&d32x32, f32, 2, s32x32);
	tensor_make(&dint, (DLDataType){kDLInt, 32, 1}, 1, s1024);
	tensor_make(&d512, f32, 1, s512);
	tensor_make(&d1024, f32, 1, s1024);
	/* Step 1: three wrong destinations, then the right one. */
	CHECK_RC(tfab_recv_sync(mp->ctx, p, "shaped", 1, &d2048.dl, WAIT_MS, &m, NULL), -EINVAL);
	CHECK_RC(tfab_recv_sync(mp->ctx, p, "shaped", 1, &d32x32.dl, WAIT_MS, &m, NULL), -EINVAL);
	/* the refusal names both dtypes as users write them */
	logged.n = 0;
	tfab_log_set_sink(capture, NULL);
	rc = tfab_recv_into_sync(mp->ctx, p, "shaped", 1, &dint.dl, TFAB_RECV_ANY_SHAPE, WAIT_MS,
				 &m, NULL);
	tfab_log_set_sink(NULL, NULL);
	CHECK_RC(rc, -EINVAL);
	CHECK(lines_with(TFAB_LOG_ERROR, "'shaped' step 1",
			 "the destination is int32, the tensor sent is float32", NULL) == 1);
	CHECK(m == NULL);
	CHECK_RC(tfab_recv_sync(mp->ctx, p, "shaped", 1, &d1024.dl, WAIT_MS, &m, NULL), 0);
	CHECK(view_of(m, d1024.buf, 1, s1024) && bytes_match(d1024.buf, d1024.nbytes, 33));
	CHECK(m->dl_tensor.dtype.code == kDLFloat && m->dl_tensor.dtype.bits == 32);
	m->deleter(m);
	/* Steps 2 and 3: any shape that fits, more room or the same bytes otherwise shaped. */
	CHECK_RC(tfab_recv_into_sync(mp->ctx, p, "shaped", 2, &d2048.dl, TFAB_RECV_ANY_SHAPE,
				     WAIT_MS, &m, NULL),
		 0);
	CHECK(view_of(m, d2048.buf, 1, s1024) && bytes_match(d2048.buf, src.nbytes, 33));
	m->deleter(m);
	CHECK_RC(tfab_recv_into_sync(mp->ctx, p, "shaped", 3, &d512.dl, TFAB_RECV_ANY_SHAPE,
				     WAIT_MS, &m, NULL),
		 -EMSGSIZE);
	CHECK_RC(tfab_recv_into_sync(mp->ctx, p, "shaped", 3, &d32x32.dl, TFAB_RECV_ANY_SHAPE,
				     WAIT_MS, &m, NULL),
		 0);
	CHECK(view_of(m, d32x32.buf, 1, s1024) && bytes_match(d32x32.buf, src.nbytes, 33));
	m->deleter(m);
	/* Step 4: asynchronously, the callback gets the view. */
	struct done d = {0};

	CHECK_RC(
	    tfab_recv_into(mp->ctx, p, "shaped", 4, &d2048.dl, TFAB_RECV_ANY_SHAPE, on_recv, &d),
	    0);
	CHECK(wait_n(mp, &d, 1));
	CHECK(d.errors == 0 && view_of(d.tensor, d2048.buf, 1, s1024));
	d.tensor->deleter(d.tensor);
	CHECK_RC(tfab_recv_into(mp->ctx, p, "shaped", 5, NULL, 0, on_recv, &d), -EINVAL);
	CHECK_RC(tfab_recv_into(mp->ctx, p, "shaped", 5, &d2048.dl, 1u << 7, on_recv, &d), -EINVAL);
	tensor_free(&src);
	tensor_free(&d2048);
	tensor_free(&d32x32);
	tensor_free(&dint);
	tensor_free(&d512);
	tensor_free(&d1024);
	return 0;
}

static void on_strings(void *arg, int status, struct tfab_string_tensor *t, bool is_dead)
{
	(void)arg;
	(void)status;
	(void)is_dead;
	tfab_string_tensor_free(t);
}

/*
 * Negative steps are the world's collectives' (doc/world.md): every public entry point that
 * takes a step refuses one with -EINVAL and says so, once a call, naming the call and key; a
 * call that fails never calls back.
 */
static int negative_steps(struct mp *mp, struct tensor *t, struct done *d)
{
	struct tfab_peer *peer = mp->peers[1 - mp->rank];
	static const struct tfab_string one = {"s", 1};
	int64_t shape[1] = {1};
	struct tfab_string_tensor st = {1, shape, &one};
	DLManagedTensor *m = NULL;
	struct tfab_string_tensor *sm = NULL;
	int rc[11], n = 0;

	logged.n = 0;
	tfab_log_set_sink(capture, NULL);
	rc[n++] = tfab_send(mp->ctx, "neg", -1, &t->dl, false, on_sent, d);
	rc[n++] = tfab_send_to(mp->ctx, peer, "neg", -1, &t->dl, false, on_sent, d);
	rc[n++] = tfab_recv(mp->ctx, peer, "neg", -1, NULL, on_recv, d);
	rc[n++] = tfab_recv_into(mp->ctx, peer, "neg", -1, &t->dl, 0, on_recv, d);
	rc[n++] = tfab_recv_sync(mp->ctx, peer, "neg", -1, NULL, 10, &m, NULL);
	rc[n++] = tfab_recv_into_sync(mp->ctx, peer, "neg", -1, &t->dl, 0, 10, &m, NULL);
	rc[n++] = tfab_send_strings(mp->ctx, "neg", -1, &st, false, on_sent, d);
	rc[n++] = tfab_send_strings_to(mp->ctx, peer, "neg", -1, &st, false, on_sent, d);
	rc[n++] = tfab_recv_strings(mp->ctx, peer, "neg", -1, on_strings, NULL);
	rc[n++] = tfab_recv_strings_sync(mp->ctx, peer, "neg", -1, 10, &sm, NULL);
	rc[n++] = tfab_step_cleanup(mp->ctx, INT64_MIN);
	tfab_log_set_sink(NULL, NULL);
	for (int i = 0; i < n; i++) {
		if (rc[i] != -EINVAL)
			fprintf(stderr, "rank %d: call %d of a negative step: %s\n", mp->rank, i,
				tfab_strerror(rc[i]));
		CHECK(rc[i] == -EINVAL);
	}
	CHECK(m == NULL && sm == NULL && d->n == 0);
	CHECK(lines_with(TFAB_LOG_ERROR, "send of 'neg': step -1 is negative: steps are >= 0", NULL,
			 NULL) == 4);
	CHECK(lines_with(TFAB_LOG_ERROR, "receive of 'neg': step -1 is negative: steps are >= 0",
			 NULL, NULL) == 6);
	CHECK(lines_with(TFAB_LOG_ERROR,
			 "step cleanup: step -9223372036854775808 is negative: steps are >= 0",
			 NULL, NULL) == 1);
	CHECK(logged.n == n);
	return 0;
}

/* Bad input at the API: clear errors, nothing else disturbed. */
int sc_bad_input(struct mp *mp)
{
	char longkey[TFAB_MAX_KEY_LEN + 2];
	int64_t shape[1] = {100}, small[1] = {10}, strides[2] = {1, 4}, shape2[2] = {4, 4};
	struct tensor t, dst_small, dst_int, strided;
	struct done d = {0};

	memset(longkey, 'k', sizeof(longkey) - 1);
	longkey[sizeof(longkey) - 1] = '\0';
	tensor_make(&t, f32, 1, shape);
	tensor_fill(&t, 3);
	tensor_make(&dst_small, f32, 1, small);
	tensor_make(&dst_int, (DLDataType){kDLInt, 32, 1}, 1, shape);
	tensor_make(&strided, f32, 2, shape2);
	strided.dl.strides = strides;
	CHECK_RC(tfab_send(mp->ctx, longkey, 1, &t.dl, false, on_sent, &d), -ENAMETOOLONG);
	CHECK_RC(tfab_send(mp->ctx, "", 1, &t.dl, false, on_sent, &d), -EINVAL);
	CHECK_RC(tfab_send(mp->ctx, "strided", 1, &strided.dl, false, on_sent, &d), -EINVAL);
	t.dl.device.device_type = kDLCUDA;
	CHECK_RC(tfab_send(mp->ctx, "gpu", 1, &t.dl, false, on_sent, &d), -EOPNOTSUPP);
	t.dl.device.device_type = kDLCPU;
	CHECK(negative_steps(mp, &t, &d) == 0);
	CHECK(d.n == 0); /* a call that fails never calls back */
	if (mp->rank == 0) {
		struct done r = {0};

		CHECK_RC(tfab_recv(mp->ctx, mp->peers[1], longkey, 1, NULL, on_recv, &r),
			 -ENAMETOOLONG);
		CHECK_RC(tfab_recv(mp->ctx, mp->peers[1], "x", 1, NULL, NULL, &r), -EINVAL);
		/* a destination too small (for any shape), and one of another dtype */
		CHECK_RC(tfab_recv_into(mp->ctx, mp->peers[1], "big", 1, &dst_small.dl,
					TFAB_RECV_ANY_SHAPE, on_recv, &r),
			 0);
		CHECK(wait_n(mp, &r, 1));
		CHECK(r.errors == 1 && r.last_status == -EMSGSIZE);
		CHECK_RC(tfab_recv(mp->ctx, mp->peers[1], "big", 1, &dst_int.dl, on_recv, &r), 0);
		CHECK(wait_n(mp, &r, 2));
		CHECK(r.errors == 2 && r.last_status == -EINVAL);
		/* and then the right one still gets the tensor */
		CHECK_RC(tfab_recv(mp->ctx, mp->peers[1], "big", 1, &t.dl, on_recv, &r), 0);
		CHECK(wait_n(mp, &r, 3));
		CHECK(r.errors == 2 && bytes_match(t.buf, t.nbytes, 3));
		CHECK(r.tensor && r.tensor->dl_tensor.data == t.buf);
		r.tensor->deleter(r.tensor);
	} else {
		CHECK_RC(tfab_send(mp->ctx, "big", 1, &t.dl, false, on_sent, &d), 0);
		CHECK(wait_n(mp, &d, 1));
		CHECK(d.errors == 0);
	}
	tensor_free(&t);
	tensor_free(&dst_small);
	tensor_free(&dst_int);
	tensor_free(&strided);
	return 0;
}
