/* Internal companions of tfab/tensorproto.h for the engine. */
#ifndef TFAB_PROTO_TENSORPROTO_H
#define TFAB_PROTO_TENSORPROTO_H

#include <stdint.h>

#include <dlpack/dlpack.h>

#include <tfab/strings.h>

/*
 * Serialize t in one pass: alloc(arg, len, buf_p) is asked for the buffer once the size is
 * known; *buf_p and *len_p get it. Errors of alloc come back as they are.
 */
int tfab__tensorproto_pack_strings(const struct tfab_string_tensor *t,
				   int (*alloc)(void *arg, size_t len, void **buf_p), void *arg,
				   void **buf_p, size_t *len_p);

/*
 * tfab_tensorproto_decode_max, its bound named max_name in a refusal (the setting it comes
 * from), and refusing (-TFAB_ERR_PROTOCOL) a shape other than expect_ndim dimensions of
 * expect_shape before it allocates anything; expect_ndim -1 takes any.
 */
int tfab__tensorproto_decode_shaped(const void *buf, size_t len, uint64_t max_bytes,
				    const char *max_name, int expect_ndim,
				    const int64_t *expect_shape, DLManagedTensor **tensor_p,
				    struct tfab_string_tensor **strings_p);

/* A string tensor with no elements (a dimension is 0), of that shape; NULL without memory. */
struct tfab_string_tensor *tfab__strings_empty(int ndim, const int64_t *shape);

#endif
