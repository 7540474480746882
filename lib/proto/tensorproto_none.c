/* TensorProto conversions in a build without protobuf-c: every call says so. */
#include <errno.h>

#include <tfab/tensorproto.h>

#include "proto/tensorproto.h"
#include "util/log.h"

static int none(void)
{
	TFAB_ERROR("tensorproto", "built without protobuf-c: no TensorProto or string tensors");
	return -EOPNOTSUPP;
}

int tfab_tensorproto_encode(const DLTensor *t, void *buf, size_t cap, size_t *len_p)
{
	(void)t, (void)buf, (void)cap, (void)len_p;
	return none();
}

int tfab_tensorproto_encode_strings(const struct tfab_string_tensor *t, void *buf, size_t cap,
				    size_t *len_p)
{
	(void)t, (void)buf, (void)cap, (void)len_p;
	return none();
}

int tfab_tensorproto_decode(const void *buf, size_t len, DLManagedTensor **tensor_p,
			    struct tfab_string_tensor **strings_p)
{
	(void)buf, (void)len, (void)tensor_p, (void)strings_p;
	return none();
}

int tfab_tensorproto_decode_max(const void *buf, size_t len, uint64_t max_bytes,
				DLManagedTensor **tensor_p, struct tfab_string_tensor **strings_p)
{
	(void)max_bytes;
	return tfab_tensorproto_decode(buf, len, tensor_p, strings_p);
}

int tfab__tensorproto_decode_shaped(const void *buf, size_t len, uint64_t max_bytes,
				    const char *max_name, int expect_ndim,
				    const int64_t *expect_shape, DLManagedTensor **tensor_p,
				    struct tfab_string_tensor **strings_p)
{
	(void)max_bytes, (void)max_name, (void)expect_ndim, (void)expect_shape;
	return tfab_tensorproto_decode(buf, len, tensor_p, strings_p);
}

void tfab_string_tensor_free(struct tfab_string_tensor *t)
{
	(void)t; /* no build without protobuf-c makes one */
}

int tfab__tensorproto_pack_strings(const struct tfab_string_tensor *t,
				   int (*alloc)(void *arg, size_t len, void **buf_p), void *arg,
				   void **buf_p, size_t *len_p)
{
	(void)t, (void)alloc, (void)arg, (void)buf_p, (void)len_p;
	return none();
}

struct tfab_string_tensor *tfab__strings_empty(int ndim, const int64_t *shape)
{
	(void)ndim, (void)shape;
	return NULL;
}
