/*
 * Engine scenarios: one tensor at a time between two ranks. Receives posted before and after
 * the send, into library and caller destinations; meta-data changes between steps (the
 * re-request path); empty and dead tensors; every DLPack dtype, byte for byte; registrations
 * invalidated under a buffer; the longest key; and shape changes at one byte count.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/mman.h>

#include "engine_scenarios.h"
#include "engine_test.h"

/* Rank 1 sends, rank 0 receives; order decided by `recv_first`. */
static int send_recv(struct mp *mp, bool recv_first, bool caller_dest, int64_t step)
{
	int64_t shape[2] = {33, 17};
	struct tensor t;
	struct done d = {0};
	struct tfab_stats st, st0;

	CHECK_RC(tfab_get_stats(mp->ctx, &st0), 0);
	tensor_make(&t, f32, 2, shape);
	if (mp->rank == 1) {
		tensor_fill(&t, 42);
		if (recv_first)
			CHECK(mp_barrier(mp, step) == 0);
		CHECK_RC(tfab_send(mp->ctx, "weights", step, &t.dl, false, on_sent, &d), 0);
		if (!recv_first)
			CHECK(mp_barrier(mp, step) == 0);
		CHECK(wait_n(mp, &d, 1));
		CHECK(d.errors == 0);
		CHECK_RC(tfab_get_stats(mp->ctx, &st), 0);
		CHECK(st.bytes_sent - st0.bytes_sent >= t.nbytes);
		CHECK(st.bytes_copied == 0);
	} else {
		if (!recv_first)
			CHECK(mp_barrier(mp, step) == 0);
		CHECK_RC(tfab_recv(mp->ctx, mp->peers[1], "weights", step,
				   caller_dest ? &t.dl : NULL, on_recv, &d),
			 0);
		if (recv_first)
			CHECK(mp_barrier(mp, step) == 0);
		CHECK(wait_n(mp, &d, 1));
		CHECK(d.errors == 0);
		CHECK(!d.is_dead);
		/* A pool tensor, or a view of the caller's: what landed, and where. */
		DLTensor *r = &d.tensor->dl_tensor;

		CHECK(r->ndim == 2 && r->shape[0] == 33 && r->shape[1] == 17);
		CHECK(r->dtype.code == kDLFloat && r->dtype.bits == 32);
		CHECK(bytes_match(r->data, t.nbytes, 42));
		CHECK(!caller_dest || (r->data == t.buf && bytes_match(t.buf, t.nbytes, 42)));
		d.tensor->deleter(d.tensor);
		CHECK_RC(tfab_get_stats(mp->ctx, &st), 0);
		CHECK(st.bytes_received - st0.bytes_received >= t.nbytes);
		CHECK(st.requests - st0.requests >= 1);
		CHECK(st.bytes_copied == 0);
	}
	tensor_free(&t);
	return 0;
}

int sc_send_then_recv(struct mp *mp)
{
	return send_recv(mp, false, false, 1);
}

int sc_recv_then_send(struct mp *mp)
{
	return send_recv(mp, true, false, 1);
}

int sc_caller_dest(struct mp *mp)
{
	return send_recv(mp, false, true, 1) || send_recv(mp, true, true, 2);
}

/*
 * Meta-data changes between steps: a first request learns the meta-data (a miss and a
 * re-request), equal steps go straight, a shape change re-requests, empty and dead tensors
 * complete from meta-data alone, and a change back re-requests again.
 */
int sc_meta_change(struct mp *mp)
{
	static const int64_t shapes[7][2] = {{10, 1}, {10, 1}, {20, 3}, {20, 3},
					     {0, 4},  {10, 1}, {10, 1}};
	static const bool dead[7] = {false, false, false, false, false, true, false};
	struct tensor t[7];
	struct done d = {0};
	struct tfab_stats st0, st;

	CHECK_RC(tfab_get_stats(mp->ctx, &st0), 0);
	if (mp->rank == 1) {
		for (int i = 0; i < 7; i++) {
			tensor_make(&t[i], f32, 2, shapes[i]);
			tensor_fill(&t[i], 100 + (uint64_t)i);
			CHECK_RC(tfab_send(mp->ctx, "grad", i + 1, &t[i].dl, dead[i], on_sent, &d),
				 0);
		}
		CHECK(wait_n(mp, &d, 7));
		CHECK(d.errors == 0);
		for (int i = 0; i < 7; i++)
			tensor_free(&t[i]);
		return 0;
	}
	for (int i = 0; i < 7; i++) {
		DLManagedTensor *m = NULL;
		bool is_dead = false;

		CHECK_RC(recv_one(mp, 1, "grad", i + 1, &m, &is_dead), 0);
		CHECK(is_dead == dead[i]);
		if (dead[i]) {
			CHECK(m == NULL);
			continue;
		}
		CHECK(m != NULL);
		CHECK(m->dl_tensor.ndim == 2 && m->dl_tensor.shape[0] == shapes[i][0] &&
		      m->dl_tensor.shape[1] == shapes[i][1]);
		if (shapes[i][0]) {
			struct tensor ref;

			tensor_make(&ref, f32, 2, shapes[i]);
			CHECK(bytes_match(m->dl_tensor.data, ref.nbytes, 100 + (uint64_t)i));
			tensor_free(&ref);
		}
		m->deleter(m);
	}
	CHECK_RC(tfab_get_stats(mp->ctx, &st), 0);
	/* step 1 learns; 3 changes shape; 7 follows a dead tensor */
	CHECK(st.rerequests - st0.rerequests == 3);
	CHECK(st.meta_misses - st0.meta_misses == 1);
	CHECK(st.meta_hits - st0.meta_hits == 6);
	CHECK(st.bytes_copied == 0);
	return 0;
}

/*
 * Empty and dead tensors whose meta-data the receiver has cached, receives posted before the
 * sends (steps 2, 3) and after (4, 5): each arrives with its shape and is_dead. The sender
 * answers them with zero-byte writes and no control message (TFAB_EMPTY_WRITE=1, the
 * default), or with META_DATA messages (0).
 */
int sc_empty_cached(struct mp *mp)
{
	static const int64_t shape[2] = {0, 4}, one[1] = {3};
	const char *env = getenv("TFAB_EMPTY_WRITE");
	bool by_write = !env || strcmp(env, "0") != 0;
	struct tensor e, dead;
	struct done d = {0}, got = {0};
	struct tfab_stats st0, st;
	DLManagedTensor *m = NULL;
	bool is_dead = false;
	char key[16];

	tensor_make(&e, f32, 2, shape);
	tensor_make(&dead, f32, 1, one);
	/* Step 1: the meta-data is learnt (META_DATA with COMPLETE, as ever). */
	if (mp->rank == 1) {
		CHECK_RC(tfab_send(mp->ctx, "empty", 1, &e.dl, false, on_sent, &d), 0);
		CHECK_RC(tfab_send(mp->ctx, "dead", 1, &dead.dl, true, on_sent, &d), 0);
		CHECK(wait_n(mp, &d, 2) && d.errors == 0);
	} else {
		CHECK_RC(recv_one(mp, 1, "empty", 1, &m, &is_dead), 0);
		CHECK(m && !is_dead && m->dl_tensor.shape[0] == 0 && m->dl_tensor.shape[1] == 4);
		m->deleter(m);
		CHECK_RC(recv_one(mp, 1, "dead", 1, &m, &is_dead), 0);
		CHECK(!m && is_dead);
		for (int step = 2; step <= 3; step++) {
			CHECK_RC(
			    tfab_recv(mp->ctx, mp->peers[1], "empty", step, NULL, on_recv, &got),
			    0);
			CHECK_RC(
			    tfab_recv(mp->ctx, mp->peers[1], "dead", step, NULL, on_recv, &got), 0);
		}
	}
	CHECK(mp_barrier(mp, 31) == 0);
	if (mp->rank == 1) {
		/* Between the two counts, this side writes only the answers. */
		CHECK_RC(tfab_get_stats(mp->ctx, &st0), 0);
		d.n = 0;
		for (int step = 2; step <= 5; step++) {
			CHECK_RC(tfab_send(mp->ctx, "empty", step, &e.dl, false, on_sent, &d), 0);
			CHECK_RC(tfab_send(mp->ctx, "dead", step, &dead.dl, true, on_sent, &d), 0);
		}
		CHECK(wait_n(mp, &d, 8) && d.errors == 0);
		CHECK_RC(tfab_get_stats(mp->ctx, &st), 0);
		if (by_write) {
			CHECK(st.ctrl_messages == st0.ctrl_messages);
			CHECK(st.writes_content - st0.writes_content == 8);
		} else {
			CHECK(st.ctrl_messages - st0.ctrl_messages == 8);
			CHECK(st.writes_content == st0.writes_content);
		}
	} else {
		for (int i = 0; i < 4; i++) {
			bool dead_one;

			CHECK(wait_n(mp, &got, i + 1) && got.errors == 0);
			/* each callback kept its tensor in got.tensor: dead ones have none */
			dead_one = got.is_dead;
			CHECK(dead_one == (got.tensor == NULL));
			if (!dead_one)
				CHECK(got.tensor->dl_tensor.ndim == 2 &&
				      got.tensor->dl_tensor.shape[0] == 0);
		}
		/* The sends of 4 and 5 are posted by now: these receives come after them. */
		for (int step = 4; step <= 5; step++) {
			snprintf(key, sizeof(key), "empty");
			CHECK_RC(recv_one(mp, 1, key, step, &m, &is_dead), 0);
			CHECK(m && !is_dead && m->dl_tensor.shape[0] == 0 &&
			      m->dl_tensor.shape[1] == 4);
			m->deleter(m);
			CHECK_RC(recv_one(mp, 1, "dead", step, &m, &is_dead), 0);
			CHECK(!m && is_dead);
		}
		if (got.tensor)
			got.tensor->deleter(got.tensor);
	}
	tensor_free(&e);
	tensor_free(&dead);
	return 0;
}

/* Every DLPack dtype, byte for byte. */
static const DLDataType all_dtypes[] = {
    {kDLInt, 8, 1},
    {kDLInt, 16, 1},
    {kDLInt, 32, 1},
    {kDLInt, 64, 1},
    {kDLUInt, 8, 1},
    {kDLUInt, 16, 1},
    {kDLUInt, 32, 1},
    {kDLUInt, 64, 1},
    {kDLFloat, 16, 1},
    {kDLFloat, 32, 1},
    {kDLFloat, 64, 1},
    {kDLBfloat, 16, 1},
    {kDLComplex, 64, 1},
    {kDLComplex, 128, 1},
    {6 /* kDLBool, newer than Debian's dlpack.h */, 8, 1},
    {kDLFloat, 32, 4},
    {kDLInt, 4, 1},
    {kDLUInt, 1, 1},
};
#define NDTYPES ((int)(sizeof(all_dtypes) / sizeof(all_dtypes[0])))

int sc_dtypes(struct mp *mp)
{
	int64_t shape[2] = {3, 5};
	struct tensor t[NDTYPES];
	struct done d = {0};
	char key[32];

	for (int i = 0; i < NDTYPES; i++) {
		tensor_make(&t[i], all_dtypes[i], 2, shape);
		tensor_fill(&t[i], 500 + (uint64_t)i);
	}
	if (mp->rank == 1) {
		for (int i = 0; i < NDTYPES; i++) {
			snprintf(key, sizeof(key), "dtype/%d", i);
			CHECK_RC(tfab_send(mp->ctx, key, 3, &t[i].dl, false, on_sent, &d), 0);
		}
		CHECK(wait_n(mp, &d, NDTYPES));
		CHECK(d.errors == 0);
	} else {
		for (int i = 0; i < NDTYPES; i++) {
			DLManagedTensor *m = NULL;

			snprintf(key, sizeof(key), "dtype/%d", i);
			CHECK_RC(recv_one(mp, 1, key, 3, &m, NULL), 0);
			CHECK(m->dl_tensor.dtype.code == all_dtypes[i].code &&
			      m->dl_tensor.dtype.bits == all_dtypes[i].bits &&
			      m->dl_tensor.dtype.lanes == all_dtypes[i].lanes);
			CHECK(bytes_match(m->dl_tensor.data, t[i].nbytes, 500 + (uint64_t)i));
			m->deleter(m);
		}
	}
	for (int i = 0; i < NDTYPES; i++)
		tensor_free(&t[i]);
	return 0;
}

/*
 * tfab_mr_invalidate, on both sides: three steps of one key from and into one buffer each.
 * The first registers the buffer (a miss), the second finds it registered (a hit); then the
 * buffer is invalidated and its pages replaced by fresh ones at the same address, as memory
 * freed and mapped again, and the third registers again (a miss) and moves the right data.
 */
int sc_mr_invalidate(struct mp *mp)
{
	enum { N = 4096 }; /* four pages */
	const size_t len = N * sizeof(float);
	int64_t shape[1] = {N};
	float *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	DLTensor t = {.data = buf, .device = {kDLCPU, 0}, .ndim = 1, .dtype = f32, .shape = shape};
	struct tensor ref = {.nbytes = len};

	CHECK(buf != MAP_FAILED);
	for (int step = 1; step <= 3; step++) {
		struct tfab_stats st0, st;

		if (step == 3) {
			CHECK_RC(tfab_mr_invalidate(mp->ctx, buf, len), 0);
			CHECK(mmap(buf, len, PROT_READ | PROT_WRITE,
				   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == buf);
		}
		CHECK_RC(tfab_get_stats(mp->ctx, &st0), 0);
		if (mp->rank == 1) {
			struct done d = {0};

			ref.buf = (uint8_t *)buf;
			tensor_fill(&ref, 900 + (uint64_t)step);
			CHECK_RC(tfab_send(mp->ctx, "inv", step, &t, false, on_sent, &d), 0);
			CHECK(wait_n(mp, &d, 1));
			CHECK(d.errors == 0);
		} else {
			memset(buf, 0, len);
			CHECK_RC(tfab_recv_sync(mp->ctx, mp->peers[1], "inv", step, &t, WAIT_MS,
						NULL, NULL),
				 0);
			CHECK(bytes_match(buf, len, 900 + (uint64_t)step));
		}
		CHECK_RC(tfab_get_stats(mp->ctx, &st), 0);
		if (st.mr_misses - st0.mr_misses != (step == 2 ? 0 : 1) ||
		    st.mr_hits - st0.mr_hits != (step == 2 ? 1 : 0))
			fprintf(stderr, "rank %d: step %d: %llu registration misses, %llu hits\n",
				mp->rank, step, (unsigned long long)(st.mr_misses - st0.mr_misses),
				(unsigned long long)(st.mr_hits - st0.mr_hits));
		CHECK(st.mr_misses - st0.mr_misses == (step == 2 ? 0 : 1));
		CHECK(st.mr_hits - st0.mr_hits == (step == 2 ? 1 : 0));
	}
	munmap(buf, len);
	return 0;
}

/*
 * The longest key (TFAB_MAX_KEY_LEN bytes, every byte value but 0) with the most dimensions
 * (32): the largest control message there is (doc/protocol.md), into a pool tensor (a request,
 * meta-data, the request again with the meta-data) and into a caller's buffer (one request
 * with it). A second key that differs only in its last byte is a key of its own. A key one
 * byte longer is refused (bad_input).
 */
int sc_key_max(struct mp *mp)
{
	char key[2][TFAB_MAX_KEY_LEN + 1];
	int64_t shape[32];
	float data[2][24], got[24];
	DLTensor t[2], dest;

	for (int i = 0; i < TFAB_MAX_KEY_LEN; i++)
		key[0][i] = key[1][i] = (char)(1 + i % 255);
	key[0][TFAB_MAX_KEY_LEN] = key[1][TFAB_MAX_KEY_LEN] = '\0';
	key[1][TFAB_MAX_KEY_LEN - 1] = '~';
	CHECK(strlen(key[0]) == TFAB_MAX_KEY_LEN && strcmp(key[0], key[1]) != 0);
	for (int i = 0; i < 32; i++)
		shape[i] = i < 3 ? 2 + i : 1; /* 2 x 3 x 4 x 1 x ... */
	for (int k = 0; k < 2; k++) {
		for (int i = 0; i < 24; i++)
			data[k][i] = (float)(k * 100 + i);
		t[k] = (DLTensor){.data = data[k],
				  .device = {kDLCPU, 0},
				  .ndim = 32,
				  .dtype = f32,
				  .shape = shape};
	}
	dest = t[0];
	dest.data = got;
	if (mp->rank == 1) {
		struct done d = {0};

		for (int step = 1; step <= 2; step++)
			for (int k = 0; k < 2; k++)
				CHECK_RC(
				    tfab_send(mp->ctx, key[k], step, &t[k], false, on_sent, &d), 0);
		CHECK(wait_n(mp, &d, 4));
		CHECK(d.errors == 0);
		return 0;
	}
	for (int k = 0; k < 2; k++) {
		DLManagedTensor *m = NULL;

		CHECK_RC(recv_one(mp, 1, key[k], 1, &m, NULL), 0);
		CHECK(m->dl_tensor.ndim == 32);
		CHECK(memcmp(m->dl_tensor.shape, shape, sizeof(shape)) == 0);
		CHECK(memcmp(m->dl_tensor.data, data[k], sizeof(data[k])) == 0);
		m->deleter(m);
		memset(got, 0, sizeof(got));
		CHECK_RC(
		    tfab_recv_sync(mp->ctx, mp->peers[1], key[k], 2, &dest, WAIT_MS, NULL, NULL),
		    0);
		CHECK(memcmp(got, data[k], sizeof(got)) == 0);
	}
	return 0;
}

/*
 * Shape changes at one byte count: steps of one key as float32 [2,8], [2,8], [4,4], [16],
 * [16], then int32 [16] and [16,1], then float32 [2,8] again, all 64 bytes, received into pool
 * tensors. Each step's tensor has the sender's shape and dtype, never the cached one: every
 * change is a meta-data reply and a re-request (besides the first step's), and an equal step
 * goes straight.
 */
int sc_shape_change(struct mp *mp)
{
	enum { STEPS = 8 };
	static const int ndims[STEPS] = {2, 2, 2, 1, 1, 1, 2, 2};
	static const int64_t shapes[STEPS][2] = {{2, 8}, {2, 8}, {4, 4},  {16},
						 {16},	 {16},	 {16, 1}, {2, 8}};
	const DLDataType i32 = {kDLInt, 32, 1};
	struct tensor t[STEPS];
	struct tfab_stats st0, st;

	for (int i = 0; i < STEPS; i++) {
		tensor_make(&t[i], i == 5 || i == 6 ? i32 : f32, ndims[i], shapes[i]);
		tensor_fill(&t[i], 300 + (uint64_t)i);
	}
	CHECK_RC(tfab_get_stats(mp->ctx, &st0), 0);
	if (mp->rank == 1) {
		struct done d = {0};

		for (int i = 0; i < STEPS; i++)
			CHECK_RC(
			    tfab_send(mp->ctx, "reshaped", i + 1, &t[i].dl, false, on_sent, &d), 0);
		CHECK(wait_n(mp, &d, STEPS));
		CHECK(d.errors == 0);
	} else {
		for (int i = 0; i < STEPS; i++) {
			DLManagedTensor *m = NULL;
			DLTensor *r;

			CHECK_RC(recv_one(mp, 1, "reshaped", i + 1, &m, NULL), 0);
			r = &m->dl_tensor;
			if (r->ndim != ndims[i] || r->shape[0] != shapes[i][0] ||
			    (ndims[i] == 2 && r->shape[1] != shapes[i][1]))
				fprintf(stderr,
					"rank 0: step %d: shape [%lld%s], wanted [%lld,%lld]\n",
					i + 1, (long long)r->shape[0], r->ndim == 2 ? ",.." : "",
					(long long)shapes[i][0], (long long)shapes[i][1]);
			CHECK(r->ndim == ndims[i]);
			CHECK(memcmp(r->shape, shapes[i], sizeof(int64_t) * (size_t)ndims[i]) == 0);
			CHECK(r->dtype.code == t[i].dl.dtype.code);
			CHECK(bytes_match(r->data, 64, 300 + (uint64_t)i));
			m->deleter(m);
		}
		CHECK_RC(tfab_get_stats(mp->ctx, &st), 0);
		/* step 1 learns; 3, 4, 6, 7 and 8 change */
		CHECK(st.rerequests - st0.rerequests == 6);
		CHECK(st.meta_misses - st0.meta_misses == 1);
		CHECK(st.meta_hits - st0.meta_hits == STEPS - 1);
	}
	for (int i = 0; i < STEPS; i++)
		tensor_free(&t[i]);
	return 0;
}
