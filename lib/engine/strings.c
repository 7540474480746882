/*
 * String tensors over the engine: the one path that is not zero-copy. The sender serializes
 * the strings as a TensorProto into a registered pool block (the send owns it), after an
 * 8-byte length (protocol.md, "String tensors"), and the usual request/response cycle moves
 * those bytes, the meta-data carrying their size. The receiver asks with room to spare
 * (TFAB_STRINGS_HEADROOM), so that a tensor whose serialized size changed but fits is
 * written at once; the length says how much landed, and the receiver parses that into a
 * tfab_string_tensor. Both copies count in bytes_copied (the TensorProto's bytes).
 */
#include <errno.h>
#include <string.h>

#include <tfab/status.h>
#include <tfab/tensorproto.h>

#include "engine/engine.h"
#include "proto/tensorproto.h"
#include "util/log.h"

#define SUBSYS TFAB_ENGINE_SUBSYS

#ifdef TFAB_HAVE_PROTOBUF
#define HAVE_PROTOBUF true
#else
#define HAVE_PROTOBUF false
#endif

int64_t tfab_string_tensor_count(const struct tfab_string_tensor *t)
{
	int64_t n = 1;

	if (!t || t->ndim < 0 || t->ndim > TFAB_MAX_DIMS || (t->ndim && !t->shape))
		return -EINVAL;
	for (int i = 0; i < t->ndim; i++) {
		if (t->shape[i] < 0)
			return -EINVAL;
		if (t->shape[i] && n > INT64_MAX / t->shape[i])
			return -EOVERFLOW;
		n *= t->shape[i];
	}
	return n;
}

/*
 * Serialize straight into a pool block (registered on the receiver's path when it asks), past
 * the room for the length: block is the block, the TensorProto starts STRING_LEN_BYTES in.
 */
struct pool_out {
	struct tfab_context *ctx;
	uint8_t *block;
};

static int pool_out_alloc(void *arg, size_t len, void **buf_p)
{
	struct pool_out *o = arg;
	void *block;
	int rc;

	/* The pool's allocator (shared memory) is the engine's: its lock serialises it. */
	tfab__ctx_lock(o->ctx);
	rc = tfab__pool_alloc(o->ctx->pool, 0, len + TFAB_WIRE_STRING_LEN, &block, NULL);
	tfab__ctx_unlock(o->ctx);
	if (rc == 0) {
		o->block = block;
		*buf_p = o->block + TFAB_WIRE_STRING_LEN;
	}
	return rc;
}

static void count_copied(struct tfab_context *ctx, uint64_t n)
{
	tfab__ctx_lock(ctx);
	ctx->stats.bytes_copied += n;
	tfab__ctx_unlock(ctx);
}

static int send_strings(struct tfab_context *ctx, struct tfab_peer *to, const char *key,
			int64_t step_id, const struct tfab_string_tensor *t, bool is_dead,
			tfab_send_cb cb, void *arg)
{
	struct tfab_wire_meta meta = {.dtype_code = TFAB_WIRE_DTYPE_STRING};
	void *buf = NULL;
	int64_t count;
	size_t len;
	int rc;

	if (!HAVE_PROTOBUF)
		return tfab_tensorproto_encode_strings(t, NULL, 0, &len); /* says why */
	if (!ctx || !t || !cb)
		return -EINVAL;
	count = tfab_string_tensor_count(t);
	if (count < 0)
		return (int)count;
	meta.is_dead = is_dead;
	meta.ndim = (uint8_t)t->ndim;
	memcpy(meta.shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
	if (!is_dead && count > 0) {
		struct pool_out o = {ctx, NULL};

		rc = tfab__tensorproto_pack_strings(t, pool_out_alloc, &o, &buf, &len);
		if (rc)
			return rc;
		tfab__wire_string_len_put(o.block, len);
		buf = o.block; /* the content: the length, then the TensorProto */
		meta.nbytes = len + TFAB_WIRE_STRING_LEN;
		count_copied(ctx, len);
	}
	return tfab__send_start(ctx, to, key, step_id, &meta, buf, buf ? TFAB_SEND_DATA_POOL : 0,
				cb, arg);
}

int tfab_send_strings(struct tfab_context *ctx, const char *key, int64_t step_id,
		      const struct tfab_string_tensor *t, bool is_dead, tfab_send_cb cb, void *arg)
{
	int rc = tfab__check_step("send", key, step_id);

	return rc ? rc : send_strings(ctx, NULL, key, step_id, t, is_dead, cb, arg);
}

int tfab_send_strings_to(struct tfab_context *ctx, struct tfab_peer *peer, const char *key,
			 int64_t step_id, const struct tfab_string_tensor *t, bool is_dead,
			 tfab_send_cb cb, void *arg)
{
	if (!peer || tfab__check_step("send", key, step_id))
		return -EINVAL;
	return send_strings(ctx, peer, key, step_id, t, is_dead, cb, arg);
}

uint64_t tfab__strings_capacity(const struct tfab_context *ctx, uint64_t nbytes)
{
	/* nbytes fits the meta-data (< 2^31), headroom is at most 1000: no overflow */
	uint64_t room = nbytes * ctx->cfg.strings_headroom / 100;

	return nbytes + room > TFAB_WIRE_MAX_STRING_BYTES ? nbytes : nbytes + room;
}

int tfab__strings_landed(struct tfab_request *r, uint64_t *nbytes_p)
{
	uint64_t len;

	if (r->dest_cap < TFAB_WIRE_STRING_LEN + 1) {
		TFAB_ERROR(SUBSYS,
			   "receive of '%s' step %lld from %s: a string tensor's content into %llu "
			   "bytes",
			   r->key, (long long)r->step, tfab__peer_name(r->peer),
			   (unsigned long long)r->dest_cap);
		return -TFAB_ERR_PROTOCOL;
	}
	len = tfab__wire_string_len_get(r->dest);
	if (len == 0 || len > r->dest_cap - TFAB_WIRE_STRING_LEN) {
		TFAB_ERROR(
		    SUBSYS,
		    "receive of '%s' step %lld from %s: a TensorProto of %llu bytes claimed, "
		    "room for %llu",
		    r->key, (long long)r->step, tfab__peer_name(r->peer), (unsigned long long)len,
		    (unsigned long long)(r->dest_cap - TFAB_WIRE_STRING_LEN));
		return -TFAB_ERR_PROTOCOL;
	}
	*nbytes_p = len + TFAB_WIRE_STRING_LEN;
	return 0;
}

int tfab__strings_complete(struct tfab_request *r, const void *content, uint64_t nbytes)
{
	struct tfab_string_tensor *t = NULL;
	int rc;

	r->sout = NULL;
	if (r->is_dead)
		return 0;
	if (nbytes == 0) {
		r->sout = tfab__strings_empty(r->meta.ndim, r->meta.shape);
		return r->sout ? 0 : -ENOMEM;
	}
	if (nbytes <= TFAB_WIRE_STRING_LEN)
		return -TFAB_ERR_PROTOCOL;
	nbytes -= TFAB_WIRE_STRING_LEN;
	/* The bytes must describe the tensor the meta-data announced: checked before decoding. */
	rc = tfab__tensorproto_decode_shaped(
	    (const uint8_t *)content + TFAB_WIRE_STRING_LEN, nbytes, r->ctx->cfg.string_max_bytes,
	    "TFAB_STRING_MAX_BYTES", r->meta.ndim, r->meta.shape, NULL, &t);
	if (rc) {
		TFAB_ERROR(SUBSYS,
			   "receive of '%s' step %lld from %s: its TensorProto is refused: %s",
			   r->key, (long long)r->step, tfab__peer_name(r->peer), tfab_strerror(rc));
		return rc;
	}
	r->ctx->stats.bytes_copied += nbytes;
	r->sout = t;
	return 0;
}

int tfab_recv_strings(struct tfab_context *ctx, struct tfab_peer *peer, const char *key,
		      int64_t step_id, tfab_recv_strings_cb cb, void *arg)
{
	if (!HAVE_PROTOBUF)
		return tfab_tensorproto_decode(NULL, 0, NULL, NULL);
	if (!cb || tfab__check_step("receive", key, step_id))
		return -EINVAL;
	struct tfab_recv_args a = {.strings = true, .scb = cb, .arg = arg};

	return tfab__recv_post(ctx, peer, key, step_id, &a);
}

int tfab_recv_strings_sync(struct tfab_context *ctx, struct tfab_peer *peer, const char *key,
			   int64_t step_id, int timeout_ms, struct tfab_string_tensor **tensor_p,
			   bool *is_dead_p)
{
	if (!HAVE_PROTOBUF)
		return tfab_tensorproto_decode(NULL, 0, NULL, NULL);
	if (tfab__check_step("receive", key, step_id))
		return -EINVAL;
	struct tfab_recv_args a = {.strings = true};

	return tfab__recv_wait(ctx, peer, key, step_id, &a, timeout_ms, NULL, tensor_p, is_dead_p);
}
