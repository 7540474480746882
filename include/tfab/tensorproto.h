/**
 * @file
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
#include <stdint.h>

#include <dlpack/dlpack.h>
#include <tfab/export.h>
#include <tfab/strings.h>

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Serialize t into buf (cap bytes); *len_p gets the length. With a buf too small (or NULL),
 * -ENOSPC and *len_p the length needed.
 */
TFAB_EXPORT int tfab_tensorproto_encode(const DLTensor *t, void *buf, size_t cap, size_t *len_p);
/** The same for a string tensor, its strings written as string_val. */
TFAB_EXPORT int tfab_tensorproto_encode_strings(const struct tfab_string_tensor *t, void *buf,
						size_t cap, size_t *len_p);

/**
 * Parse len bytes. A numeric tensor goes to *tensor_p (a CPU DLManagedTensor; release it with
 * its deleter), a string tensor to *strings_p (release with tfab_string_tensor_free); the other
 * is set to NULL. Passing NULL for one refuses that kind with -EPROTOTYPE. Malformed bytes,
 * or a shape or content TensorFlow refuses (above): -TFAB_ERR_PROTOCOL; an unsupported
 * DataType (DT_INVALID, a message with no dtype, included): -EOPNOTSUPP. A tensor that would
 * take more than TFAB_TENSORPROTO_DEFAULT_MAX: -EMSGSIZE (below).
 */
TFAB_EXPORT int tfab_tensorproto_decode(const void *buf, size_t len, DLManagedTensor **tensor_p,
					struct tfab_string_tensor **strings_p);

/**
 * The same, with the memory the decode may hold at once bounded by max_bytes instead: the
 * message as protobuf-c parses it (with its scratch while it parses, about 32 bytes a value
 * of a repeated field; a string tensor's strings stay in the message), and the decoded
 * tensor (its elements' bytes; a string tensor's element entries, 16 bytes each, besides
 * its strings), each allocation counted as glibc's malloc takes it. A few bytes of TensorProto
 * can claim a tensor of any size whose values repeat (TensorFlow fills with the last value
 * given, or zeros): the claim is checked before anything is allocated for it, and one past
 * the bound fails with -EMSGSIZE and an error line with the sizes. Within the bound, the time
 * a decode takes is that of writing what it returns.
 */
TFAB_EXPORT int tfab_tensorproto_decode_max(const void *buf, size_t len, uint64_t max_bytes,
					    DLManagedTensor **tensor_p,
					    struct tfab_string_tensor **strings_p);

/**
 * tfab_tensorproto_decode's bound: 256 MiB, the default of TFAB_STRING_MAX_BYTES, the setting
 * that bounds a string tensor a context receives.
 */
#define TFAB_TENSORPROTO_DEFAULT_MAX (256ull << 20)

#ifdef __cplusplus
}
#endif

#endif
