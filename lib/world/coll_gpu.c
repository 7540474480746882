/*
 * GPU operands of the collectives (world.h), through host proxies as the engine's own sends
 * and receives take GPU tensors (doc/design.md, "GPU tensors"): the input is copied into a
 * pinned pool block when the collective is called, the collective runs on host views of the
 * blocks (coll.c, unchanged: its writes, its vectorised reductions), and the result is copied
 * to the caller's GPU memory before the caller's callback runs. The copies are the context's
 * (lib/cuda), made under its lock; the first GPU operand opens the copier.
 */
#include <errno.h>
#include <stdlib.h>

#include <tfab/status.h>

#include "cuda/cuda.h"
#include "engine/engine_world.h"
#include "world/world.h"
#include "util/log.h"

#define SUBSYS "coll"

struct tfab_coll_gpu {
	struct tfab_world *w;
	tfab_coll_cb cb; /* the caller's */
	void *arg;
	DLTensor in, out; /* the host views the collective runs on */
	void *hin, *hout; /* their pool blocks (one for a tensor both read and written), or NULL */
	size_t nin, nout;
	void *dev_out; /* the caller's GPU output, or NULL */
};

/* A pool block for GPU tensor t (engine lock held): pinned, t's bytes in it if copy_in. */
static int proxy_open(struct tfab_context *ctx, const DLTensor *t, bool copy_in, DLTensor *view,
		      void **host_p, size_t *n_p, void **dev_p)
{
	struct tfab_pool *pool = tfab__ctx_pool(ctx);
	struct tfab_wire_meta m;
	void *data, *host = NULL;
	int rc = tfab__meta_from_dltensor(t, false, &m, &data);

	if (rc == 0)
		rc = tfab__check_gpu(ctx, t);
	if (rc == 0)
		rc = tfab__pool_alloc(pool, 0, (size_t)m.nbytes, &host, NULL);
	if (rc)
		return rc;
	tfab__pool_pin(pool, host, tfab__ctx_cuda(ctx));
	if (copy_in && m.nbytes) {
		rc = tfab__cuda_copy(tfab__ctx_cuda(ctx), host, data, (size_t)m.nbytes, false);
		if (rc) {
			tfab__pool_free(pool, host);
			return rc;
		}
		tfab__ctx_stats(ctx)->bytes_copied += m.nbytes;
	}
	*view = *t;
	view->data = host;
	view->byte_offset = 0;
	view->device = (DLDevice){kDLCPU, 0};
	*host_p = host;
	*n_p = (size_t)m.nbytes;
	*dev_p = data;
	return 0;
}

/*
 * The blocks back to the pool (no lock held). The collective's sends and receives registered
 * them as caller memory (the registration cache): forgotten first, since the pool may free
 * the memory and the heap hand the addresses out again.
 */
static void gpu_free(struct tfab_coll_gpu *g)
{
	struct tfab_context *ctx = g->w->ctx;

	if (g->hin) {
		tfab_mr_invalidate(ctx, g->hin, g->nin);
		tfab__pool_free(tfab__ctx_pool(ctx), g->hin);
	}
	if (g->hout && g->hout != g->hin) {
		tfab_mr_invalidate(ctx, g->hout, g->nout);
		tfab__pool_free(tfab__ctx_pool(ctx), g->hout);
	}
	free(g);
}

/* The collective ended: its result to the GPU, then the caller's callback. */
static void gpu_done(void *arg, int status)
{
	struct tfab_coll_gpu *g = arg;
	struct tfab_context *ctx = g->w->ctx;
	tfab_coll_cb cb = g->cb;
	void *cb_arg = g->arg;

	if (status == 0 && g->dev_out && g->nout) {
		tfab__ctx_lock(ctx);
		status = tfab__cuda_copy(tfab__ctx_cuda(ctx), g->dev_out, g->hout, g->nout, true);
		if (status == 0)
			tfab__ctx_stats(ctx)->bytes_copied += g->nout;
		tfab__ctx_unlock(ctx);
		if (status)
			TFAB_ERROR(SUBSYS,
				   "rank %d: a collective's result could not be copied to "
				   "the GPU: %s",
				   g->w->rank, tfab_strerror(status));
	}
	gpu_free(g);
	cb(cb_arg, status);
}

int tfab__coll_gpu_open(struct tfab_world *w, const DLTensor **in_p, DLTensor **out_p,
			tfab_coll_cb *cb_p, void **arg_p, struct tfab_coll_gpu **g_p)
{
	const DLTensor *in = in_p ? *in_p : NULL;
	DLTensor *out = out_p ? *out_p : NULL;
	bool one = in && in == out; /* one tensor, read and written (broadcast) */
	struct tfab_coll_gpu *g;
	void *dev_in;
	int rc = 0;

	*g_p = NULL;
	/* Not on a GPU, or a call the collective itself refuses (it says why). */
	if (!w || !*cb_p || (!tfab__on_gpu(in) && !tfab__on_gpu(out)))
		return 0;
	g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	g->w = w;
	tfab__ctx_lock(w->ctx);
	if (tfab__on_gpu(in))
		rc = proxy_open(w->ctx, in, true, &g->in, &g->hin, &g->nin, &dev_in);
	if (rc == 0 && one) {
		g->out = g->in;
		g->hout = g->hin;
		g->nout = g->nin;
		g->dev_out = dev_in;
	} else if (rc == 0 && tfab__on_gpu(out)) {
		rc = proxy_open(w->ctx, out, false, &g->out, &g->hout, &g->nout, &g->dev_out);
	}
	tfab__ctx_unlock(w->ctx);
	if (rc) {
		TFAB_ERROR(SUBSYS, "rank %d: a CUDA tensor in a collective, but %s", w->rank,
			   rc == -EOPNOTSUPP ? tfab__cuda_absent_reason() : tfab_strerror(rc));
		gpu_free(g);
		return rc;
	}
	if (g->hin)
		*in_p = &g->in;
	if (g->hout)
		*out_p = &g->out;
	g->cb = *cb_p;
	g->arg = *arg_p;
	*cb_p = gpu_done;
	*arg_p = g;
	*g_p = g;
	return 0;
}

int tfab__coll_gpu_started(struct tfab_coll_gpu *g, int rc)
{
	if (g && rc)
		gpu_free(g);
	return rc;
}
