/* DLPack tensors: validation, meta-data, and the library-allocated DLManagedTensor. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tfab/status.h>

#include "engine/engine.h"
#include "util/log.h"

/* Packed: count x bits x lanes, rounded up to whole bytes once (two int4 per byte). */
uint64_t tfab__meta_nbytes(const struct tfab_wire_meta *meta, bool *overflow_p)
{
	uint64_t bits = (uint64_t)meta->dtype_bits * meta->dtype_lanes, count = 1;

	*overflow_p = false;
	for (unsigned i = 0; i < meta->ndim; i++) {
		uint64_t d = (uint64_t)meta->shape[i];

		if (meta->shape[i] < 0) {
			*overflow_p = true;
			return 0;
		}
		if (d == 0)
			return 0;
		if (count > UINT64_MAX / d) {
			*overflow_p = true;
			return 0;
		}
		count *= d;
	}
	if (bits && count > (UINT64_MAX - 7) / bits) {
		*overflow_p = true;
		return 0;
	}
	return (count * bits + 7) / 8;
}

int tfab__meta_from_dltensor(const DLTensor *t, bool is_dead, struct tfab_wire_meta *meta,
			     void **data_p)
{
	char name[TFAB_DTYPE_NAME_MAX];
	uint64_t expect = 1; /* the row-major stride; wraps where the size overflows (refused) */
	bool overflow;

	if (!t)
		return -EINVAL;
	if (t->device.device_type != kDLCPU && t->device.device_type != kDLCUDAHost &&
	    t->device.device_type != kDLCUDA) {
		TFAB_ERROR(TFAB_ENGINE_SUBSYS,
			   "a tensor on device type %d: only CPU, CUDA host and CUDA device "
			   "memory are supported",
			   (int)t->device.device_type);
		return -EOPNOTSUPP;
	}
	if (t->ndim < 0 || t->ndim > TFAB_MAX_DIMS) {
		TFAB_ERROR(TFAB_ENGINE_SUBSYS, "a tensor of %d dimensions (at most %d)", t->ndim,
			   TFAB_MAX_DIMS);
		return -EINVAL;
	}
	if (t->dtype.bits == 0 || t->dtype.lanes == 0) {
		TFAB_ERROR(TFAB_ENGINE_SUBSYS,
			   "a tensor of dtype %s: a dtype has 1 bit and 1 lane at least",
			   tfab_dtype_name(t->dtype, name, sizeof(name)));
		return -EINVAL;
	}
	if (t->ndim && !t->shape) {
		TFAB_ERROR(TFAB_ENGINE_SUBSYS, "a tensor (%s) of %d dimensions without a shape",
			   tfab_dtype_name(t->dtype, name, sizeof(name)), t->ndim);
		return -EINVAL;
	}
	/* the shape is written as far as ndim, below: the rest is never read */
	memset(meta, 0, offsetof(struct tfab_wire_meta, shape));
	meta->dtype_code = t->dtype.code;
	meta->dtype_bits = t->dtype.bits;
	meta->dtype_lanes = t->dtype.lanes;
	meta->is_dead = is_dead;
	meta->ndim = (uint8_t)t->ndim;
	for (int i = t->ndim - 1; i >= 0; i--) {
		if (t->shape[i] < 0) {
			TFAB_ERROR(TFAB_ENGINE_SUBSYS,
				   "a tensor (%s) whose dimension %d is negative (%lld)",
				   tfab_dtype_name(t->dtype, name, sizeof(name)), i,
				   (long long)t->shape[i]);
			return -EINVAL;
		}
		meta->shape[i] = t->shape[i];
		/* Compact row-major only: strides NULL, or exactly the row-major ones. */
		if (t->strides && t->shape[i] != 1 && (uint64_t)t->strides[i] != expect) {
			TFAB_ERROR(
			    TFAB_ENGINE_SUBSYS,
			    "a tensor with strides: only compact row-major tensors are supported");
			return -EINVAL;
		}
		expect *= (uint64_t)t->shape[i];
	}
	meta->nbytes = tfab__meta_nbytes(meta, &overflow);
	if (overflow) {
		TFAB_ERROR(TFAB_ENGINE_SUBSYS, "a tensor (%s) whose size overflows 64 bits",
			   tfab_dtype_name(t->dtype, name, sizeof(name)));
		return -EOVERFLOW;
	}
	if (meta->nbytes && !t->data && !is_dead) {
		TFAB_ERROR(TFAB_ENGINE_SUBSYS, "a tensor (%s) of %llu bytes without data",
			   tfab_dtype_name(t->dtype, name, sizeof(name)),
			   (unsigned long long)meta->nbytes);
		return -EINVAL;
	}
	*data_p = t->data ? (char *)t->data + t->byte_offset : NULL;
	return 0;
}

int tfab__check_gpu(struct tfab_context *ctx, const DLTensor *t)
{
	int rc;

	if (!tfab__on_gpu(t) || ctx->cuda)
		return 0;
	/* CUDA starts with the first GPU tensor: CPU-only users never load it. */
	if (!ctx->cuda_tried) {
		ctx->cuda_tried = true;
		rc = tfab__cuda_open(&ctx->cfg, &ctx->cuda);
		if (rc)
			return rc;
		if (ctx->cuda)
			return 0;
	}
	TFAB_ERROR(TFAB_ENGINE_SUBSYS, "a CUDA device tensor, but %s", tfab__cuda_absent_reason());
	return -EOPNOTSUPP;
}

/*
 * A DLManagedTensor and its shape in one piece: in its pool block's holder storage
 * (tfab__pool_alloc_owned), else allocated. Its deleter returns the block.
 */
struct tfab_managed {
	DLManagedTensor dl;
	struct tfab_context *ctx;
	bool in_block; /* the block's holder storage: returned with the block */
	int64_t shape[TFAB_MAX_DIMS];
};

_Static_assert(sizeof(struct tfab_managed) <= TFAB_POOL_OWNER_BYTES,
	       "a managed tensor fits its pool block's holder storage");

static void managed_delete(DLManagedTensor *dl)
{
	struct tfab_managed *m = (struct tfab_managed *)dl;
	struct tfab_context *ctx = m->ctx;

	if (m->in_block) {
		tfab__pool_free_owned(ctx->pool, m); /* m is the pool's again */
	} else {
		if (m->dl.dl_tensor.data)
			tfab__pool_free(ctx->pool, m->dl.dl_tensor.data);
		free(m);
	}
	/* after the block's return: a context destroyed once this reads 0 has no pool */
	__atomic_fetch_sub(&ctx->managed_out, 1, __ATOMIC_RELEASE);
}

/* t's dtype, shape (into shape, the tensor's own storage) and data, from meta. */
static void tensor_of_meta(DLTensor *t, const struct tfab_wire_meta *meta, int64_t *shape,
			   void *data)
{
	memcpy(shape, meta->shape, sizeof(int64_t) * meta->ndim);
	t->data = data;
	t->ndim = meta->ndim;
	t->dtype.code = meta->dtype_code;
	t->dtype.bits = meta->dtype_bits;
	t->dtype.lanes = meta->dtype_lanes;
	t->shape = shape;
}

DLManagedTensor *tfab__managed_new(struct tfab_context *ctx, const struct tfab_wire_meta *meta,
				   void *data, void *owner)
{
	struct tfab_managed *m = owner ? owner : malloc(sizeof(*m));

	if (!m)
		return NULL;
	/* The shape's storage is written as far as ndim, not zeroed: one per receive. */
	memset(m, 0, offsetof(struct tfab_managed, shape));
	m->ctx = ctx;
	m->in_block = owner != NULL;
	tensor_of_meta(&m->dl.dl_tensor, meta, m->shape, data);
	m->dl.dl_tensor.device.device_type = kDLCPU;
	m->dl.manager_ctx = m;
	m->dl.deleter = managed_delete;
	__atomic_fetch_add(&ctx->managed_out, 1, __ATOMIC_RELAXED);
	return &m->dl;
}

/* A view and its shape in one allocation; the data is the caller's. */
struct tfab_view {
	DLManagedTensor dl;
	int64_t shape[TFAB_MAX_DIMS];
};

/*
 * Views freed are kept for the next receives, up to VIEW_CACHE, in one cache for the process:
 * their deleter may run on any thread, after their context is gone. A receive into the
 * caller's tensor then takes nothing from the heap once warm (test_alloc).
 */
#define VIEW_CACHE 64
static struct {
	pthread_mutex_t lock;
	unsigned n;
	struct tfab_view *free[VIEW_CACHE];
} views = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void view_delete(DLManagedTensor *dl)
{
	struct tfab_view *v = (struct tfab_view *)dl;

	pthread_mutex_lock(&views.lock);
	if (views.n < VIEW_CACHE) {
		views.free[views.n++] = v;
		v = NULL;
	}
	pthread_mutex_unlock(&views.lock);
	free(v);
}

DLManagedTensor *tfab__view_new(const struct tfab_wire_meta *meta, const DLTensor *dest)
{
	struct tfab_view *v = NULL;

	pthread_mutex_lock(&views.lock);
	if (views.n)
		v = views.free[--views.n];
	pthread_mutex_unlock(&views.lock);
	if (!v)
		v = malloc(sizeof(*v));
	if (!v)
		return NULL;
	memset(v, 0, offsetof(struct tfab_view, shape));
	tensor_of_meta(&v->dl.dl_tensor, meta, v->shape, dest->data);
	v->dl.dl_tensor.byte_offset = dest->byte_offset;
	v->dl.dl_tensor.device = dest->device;
	v->dl.manager_ctx = v;
	v->dl.deleter = view_delete;
	return &v->dl;
}

/* DLPack 0.8's kDLBool, newer than the header Debian ships. */
#define DL_BOOL 6

const char *tfab_dtype_name(DLDataType dtype, char *buf, size_t len)
{
	const char *kind;
	int n;

	if (!buf || !len)
		return buf;
	switch (dtype.code) {
	case kDLInt:
		kind = "int";
		break;
	case kDLUInt:
		kind = "uint";
		break;
	case kDLFloat:
		kind = "float";
		break;
	case kDLBfloat:
		kind = "bfloat";
		break;
	case kDLComplex:
		kind = "complex";
		break;
	case kDLOpaqueHandle:
		kind = "handle";
		break;
	case DL_BOOL:
		kind = "bool";
		break;
	default:
		kind = NULL;
	}
	if (!kind)
		n = snprintf(buf, len, "DLPack type code %u, %u bits", (unsigned)dtype.code,
			     (unsigned)dtype.bits);
	else if (dtype.code == DL_BOOL && dtype.bits == 8)
		n = snprintf(buf, len, "bool");
	else
		n = snprintf(buf, len, "%s%u", kind, (unsigned)dtype.bits);
	if (dtype.lanes != 1 && n > 0 && (size_t)n < len)
		snprintf(buf + n, len - (size_t)n, "%sx%u", kind ? "" : " ", (unsigned)dtype.lanes);
	return buf;
}

const char *tfab__meta_dtype_name(const struct tfab_wire_meta *meta, char *buf, size_t len)
{
	DLDataType dt = {meta->dtype_code, meta->dtype_bits, meta->dtype_lanes};

	if (meta->dtype_code == TFAB_WIRE_DTYPE_STRING) {
		snprintf(buf, len, "string");
		return buf;
	}
	return tfab_dtype_name(dt, buf, len);
}

int tfab__check_step(const char *what, const char *key, int64_t step)
{
	if (step >= 0)
		return 0;
	if (key)
		TFAB_ERROR(TFAB_ENGINE_SUBSYS,
			   "%s of '%.200s': step %lld is negative: steps are >= 0", what, key,
			   (long long)step);
	else
		TFAB_ERROR(TFAB_ENGINE_SUBSYS, "%s: step %lld is negative: steps are >= 0", what,
			   (long long)step);
	return -EINVAL;
}

int tfab__check_key(const char *key, size_t *len_p)
{
	size_t len;

	if (!key)
		return -EINVAL;
	len = strnlen(key, TFAB_MAX_KEY + 1);
	if (len == 0)
		return -EINVAL;
	if (len > TFAB_MAX_KEY) {
		TFAB_ERROR(TFAB_ENGINE_SUBSYS, "a key longer than %d bytes", TFAB_MAX_KEY);
		return -ENAMETOOLONG;
	}
	*len_p = len;
	return 0;
}
