/*
 * Engine scenarios between processes: receives before and after sends, library and caller
 * destinations, meta-data changes (the re-request path), dead and empty tensors, every DLPack
 * dtype byte for byte, many keys and steps, several threads, all-to-all among four processes,
 * step cleanup, abort, and bad input. Each scenario runs in every rank (see mp.c).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mp.h"

#define WAIT_MS 60000

/* A compact row-major tensor over caller memory. */
struct tensor {
	DLTensor dl;
	int64_t shape[4];
	uint8_t *buf;
	size_t nbytes;
};

static void tensor_make(struct tensor *t, DLDataType dtype, int ndim, const int64_t *shape)
{
	size_t n = 1;

	memset(t, 0, sizeof(*t));
	for (int i = 0; i < ndim; i++) {
		t->shape[i] = shape[i];
		n *= (size_t)shape[i];
	}
	t->nbytes = n * ((dtype.bits * dtype.lanes + 7u) / 8u);
	t->buf = malloc(t->nbytes ? t->nbytes : 1);
	t->dl.data = t->buf;
	t->dl.device.device_type = kDLCPU;
	t->dl.ndim = ndim;
	t->dl.dtype = dtype;
	t->dl.shape = t->shape;
}

static void tensor_fill(struct tensor *t, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 7;

	for (size_t i = 0; i < t->nbytes; i++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		t->buf[i] = (uint8_t)(x >> 56);
	}
}

static bool bytes_match(const void *p, size_t n, uint64_t seed)
{
	struct tensor ref = {0};

	ref.nbytes = n;
	ref.buf = malloc(n ? n : 1);
	tensor_fill(&ref, seed);
	bool ok = memcmp(ref.buf, p, n) == 0;

	free(ref.buf);
	return ok;
}

static void tensor_free(struct tensor *t)
{
	free(t->buf);
	t->buf = NULL;
}

/* Completion records. */
struct done {
	volatile int n;
	volatile int errors;
	int last_status;
	DLManagedTensor *tensor;
	bool is_dead;
};

static void on_sent(void *arg, int status)
{
	struct done *d = arg;

	if (status) {
		d->errors++;
		d->last_status = status;
	}
	d->n++;
}

static void on_recv(void *arg, int status, DLManagedTensor *t, bool is_dead)
{
	struct done *d = arg;

	if (status) {
		d->errors++;
		d->last_status = status;
	}
	if (d->tensor && t)
		d->tensor->deleter(d->tensor);
	d->tensor = t;
	d->is_dead = is_dead;
	d->n++;
}

static int wait_n(struct mp *mp, struct done *d, int n)
{
	uint64_t spins = 0;

	(void)spins;
	for (int i = 0; i < WAIT_MS && d->n < n; i++) {
		for (int k = 0; k < 1000 && d->n < n; k++)
			tfab_progress(mp->ctx);
		if (d->n < n)
			usleep(i < 10 ? 0 : 100);
	}
	return d->n >= n;
}

static const DLDataType f32 = {kDLFloat, 32, 1};

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
		if (caller_dest) {
			CHECK(d.tensor == NULL);
			CHECK(bytes_match(t.buf, t.nbytes, 42));
		} else {
			DLTensor *r = &d.tensor->dl_tensor;

			CHECK(r->ndim == 2 && r->shape[0] == 33 && r->shape[1] == 17);
			CHECK(r->dtype.code == kDLFloat && r->dtype.bits == 32);
			CHECK(bytes_match(r->data, t.nbytes, 42));
			d.tensor->deleter(d.tensor);
		}
		CHECK_RC(tfab_get_stats(mp->ctx, &st), 0);
		CHECK(st.bytes_received - st0.bytes_received >= t.nbytes);
		CHECK(st.requests - st0.requests >= 1);
		CHECK(st.bytes_copied == 0);
	}
	tensor_free(&t);
	return 0;
}

static int sc_send_then_recv(struct mp *mp)
{
	return send_recv(mp, false, false, 1);
}

static int sc_recv_then_send(struct mp *mp)
{
	return send_recv(mp, true, false, 1);
}

static int sc_caller_dest(struct mp *mp)
{
	return send_recv(mp, false, true, 1) || send_recv(mp, true, true, 2);
}

static const struct mp_scenario scenarios[] = {
    {"send_then_recv", 2, sc_send_then_recv},
    {"recv_then_send", 2, sc_recv_then_send},
    {"caller_dest", 2, sc_caller_dest},
};

int main(int argc, char **argv)
{
	return mp_main(argc, argv, scenarios, (int)(sizeof(scenarios) / sizeof(scenarios[0])));
}
