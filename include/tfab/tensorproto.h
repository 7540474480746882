/*
 * TensorProto bytes, compatible with TensorFlow's (tensorflow/core/framework/tensor.proto):
 * the same message, field numbers and DataType values, so that tfab tensors can be handed to
 * and taken from TensorFlow. Numeric tensors are written as tensor_content (TensorFlow's own
 * choice for them), string tensors as string_val.
 *
 * Reading accepts what TensorFlow's Tensor::FromProto accepts, and reads it the same way:
 *  - no tensor_shape is a scalar; unknown_rank is ignored (the dims given are the shape);
 *  - a non-empty tensor_content is the whole content and must be exactly the elements'
 *    bytes (bools 0 or 1); for strings, one varint length per element, then the bytes;
 *  - otherwise the typed *_val field of the dtype (string_val for strings): fewer values
 *    than elements repeat the last one, none means zeros (empty strings), values beyond the
 *    element count are not read (complex fields count whole real, imaginary pairs);
 *  - with no elements (a dimension is 0) neither tensor_content nor the values are read.
 * Refused as TensorFlow refuses them: a negative dimension, more elements than int64 holds,
 * a tensor_content of another size, DT_INVALID. tfab refuses more than 32 dimensions too.
 *
 * DLPack to DataType: int8/16/32/64, uint8/16/32/64, float16 (DT_HALF), float32, float64,
 * bfloat16, complex64/128, bool (DLPack code 6, 8 bits), and the float8 kinds TensorFlow has
 * (e5m2, e4m3fn, e4m3fnuz, e4m3b11fnuz, e5m2fnuz). Vector lanes, sub-byte ints and opaque
 * handles have no DataType: -EOPNOTSUPP. Quantized DataTypes decode as the integer of their
 * width. Only CPU (and CUDA host) memory is read.
 *
 * Threads: these functions keep no state and are thread-safe.
 */
#ifndef TFAB_TENSORPROTO_H
#define TFAB_TENSORPROTO_H

#include <stddef.h>

#include <dlpack/dlpack.h>
#include <tfab/export.h>
#include <tfab/strings.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Serialize t into buf (cap bytes); *len_p gets the length. With a buf too small (or NULL),
 * -ENOSPC and *len_p the length needed.
 */
TFAB_EXPORT int tfab_tensorproto_encode(const DLTensor *t, void *buf, size_t cap, size_t *len_p);
TFAB_EXPORT int tfab_tensorproto_encode_strings(const struct tfab_string_tensor *t, void *buf,
						size_t cap, size_t *len_p);

/*
 * Parse len bytes. A numeric tensor goes to *tensor_p (a CPU DLManagedTensor; release it with
 * its deleter), a string tensor to *strings_p (release with tfab_string_tensor_free); the other
 * is set to NULL. Passing NULL for one refuses that kind with -EPROTOTYPE. Malformed bytes,
 * or a shape or content TensorFlow refuses (above): -TFAB_ERR_PROTOCOL; an unsupported
 * DataType (DT_INVALID, a message with no dtype, included): -EOPNOTSUPP.
 */
TFAB_EXPORT int tfab_tensorproto_decode(const void *buf, size_t len, DLManagedTensor **tensor_p,
					struct tfab_string_tensor **strings_p);

/*
 * The most a decoded tensor may take: its elements' bytes (a string tensor: 16 bytes an
 * element, besides the strings). A few bytes of TensorProto can describe a tensor of any size
 * whose values repeat (TensorFlow fills with the last value given); one past this bound fails
 * with -EMSGSIZE instead of taking the memory. It is protobuf's own limit on a message.
 */
#define TFAB_TENSORPROTO_MAX_DECODED 0x7fffffffull

#ifdef __cplusplus
}
#endif

#endif
