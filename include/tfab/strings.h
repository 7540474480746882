/**
 * @file
 * String tensors: arrays of byte strings, TensorFlow's DT_STRING. DLPack has no such type, so
 * they have their own type and calls. They are not DMAable: the sender serializes them as a
 * TensorProto (tfab/tensorproto.h) into registered memory, the content write carries those
 * bytes, and the receiver parses them. Keys, steps, meta-data caching, dead tensors, cleanup
 * and abort behave as for DLPack tensors; a key sent as strings must be received as strings.
 *
 * Threads: every function here is thread-safe, with the callback rules of tfab/engine.h.
 * Builds without protobuf-c return -EOPNOTSUPP from every call.
 */
#ifndef TFAB_STRINGS_H
#define TFAB_STRINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tfab/engine.h>
#include <tfab/export.h>

#ifdef __cplusplus
extern "C" {
#endif

/** One element: len bytes of any value (empty, binary, not UTF-8: all fine). */
struct tfab_string {
	const char *data; /**< may be NULL when len is 0 */
	size_t len;	  /**< bytes at data */
};

/**
 * A string tensor: ndim dimensions (0..32), compact row-major, one tfab_string per element
 * (the product of shape; 1 for a scalar, 0 when a dimension is 0).
 */
struct tfab_string_tensor {
	int32_t ndim;			   /**< number of dimensions, 0 for a scalar */
	const int64_t *shape;		   /**< ndim sizes */
	const struct tfab_string *strings; /**< the elements, in row-major order */
};

/** Elements of t: the product of its shape, or -EINVAL/-EOVERFLOW. */
TFAB_EXPORT int64_t tfab_string_tensor_count(const struct tfab_string_tensor *t);

/** Frees a string tensor that the library made (a receive, a decode). NULL is accepted. */
TFAB_EXPORT void tfab_string_tensor_free(struct tfab_string_tensor *t);

/**
 * Producer: like tfab_send (keys and steps as there: a negative step is -EINVAL), but the
 * strings are serialized before it returns, so t and its bytes may be reused at once. cb
 * reports when the reader has the tensor, or the failure. A serialized tensor is at most
 * 2 GiB - 1 bytes (TensorFlow's limit): beyond, -EMSGSIZE.
 */
TFAB_EXPORT int tfab_send_strings(struct tfab_context *ctx, const char *key, int64_t step_id,
				  const struct tfab_string_tensor *t, bool is_dead, tfab_send_cb cb,
				  void *arg);

/** The same for one peer's receives alone, as tfab_send_to. */
TFAB_EXPORT int tfab_send_strings_to(struct tfab_context *ctx, struct tfab_peer *peer,
				     const char *key, int64_t step_id,
				     const struct tfab_string_tensor *t, bool is_dead,
				     tfab_send_cb cb, void *arg);

/**
 * A string receive's callback: the status, the tensor (NULL on failure or when dead) and
 * is_dead, as tfab_recv_strings says.
 */
typedef void (*tfab_recv_strings_cb)(void *arg, int status, struct tfab_string_tensor *tensor,
				     bool is_dead);

/**
 * Consumer: like tfab_recv with a library-allocated destination. cb gets the status, the
 * tensor (NULL on failure or when dead; the application frees it with
 * tfab_string_tensor_free) and is_dead. A key whose sender sent a DLPack tensor fails with
 * -EPROTOTYPE, and so does a tfab_recv of a key sent as strings; the send is not consumed.
 */
TFAB_EXPORT int tfab_recv_strings(struct tfab_context *ctx, struct tfab_peer *peer, const char *key,
				  int64_t step_id, tfab_recv_strings_cb cb, void *arg);

/** The blocking form: waits at most timeout_ms, as tfab_recv_sync (signals as there too). */
TFAB_EXPORT int tfab_recv_strings_sync(struct tfab_context *ctx, struct tfab_peer *peer,
				       const char *key, int64_t step_id, int timeout_ms,
				       struct tfab_string_tensor **tensor_p, bool *is_dead_p);

#ifdef __cplusplus
}
#endif

#endif
