/*
 * The TensorProto decoder (lib/proto/tensorproto.c), which reads what a peer wrote into a
 * string tensor's destination. Properties: no read outside the input, no leak; a tensor it
 * returns (strings or numbers) encodes, and that decodes again to the same tensor.
 */
#include <errno.h>
#include <string.h>

#include <tfab/tensorproto.h>

#include "fuzz.h"

/*
 * A few bytes can claim a tensor whose values repeat, up to the bound: legitimate, and
 * checked by test_tensorproto, but a decode of 256 MiB would stall the search. Inputs are
 * decoded within this bound. A string tensor is written again (each string once per element)
 * when that takes at most FUZZ_MAX_AGAIN, and decodes again within the default bound (256
 * MiB): room for those bytes and protobuf-c's parse of one string_val entry per element
 * (about 128 bytes each at most, against the 16 that FUZZ_MAX_DECODED counts).
 */
#define FUZZ_MAX_DECODED (4u << 20)
#define FUZZ_MAX_AGAIN (32u << 20)

static void check_strings(const struct tfab_string_tensor *s)
{
	struct tfab_string_tensor *again = NULL;
	DLManagedTensor *t = NULL;
	int64_t n = tfab_string_tensor_count(s);
	size_t len = 0;
	uint8_t *buf;
	int rc;

	FUZZ_CHECK(n >= 0);
	rc = tfab_tensorproto_encode_strings(s, NULL, 0, &len);
	FUZZ_CHECK(rc == -ENOSPC || rc == -EMSGSIZE);
	/* A long string repeated writes each copy: past 2 GiB, or too long to write here. */
	if (rc == -EMSGSIZE || len > FUZZ_MAX_AGAIN)
		return;
	buf = malloc(len ? len : 1);
	if (!buf)
		return;
	FUZZ_CHECK(tfab_tensorproto_encode_strings(s, buf, len, &len) == 0);
	FUZZ_CHECK(tfab_tensorproto_decode(buf, len, &t, &again) == 0);
	FUZZ_CHECK(again && !t && again->ndim == s->ndim);
	FUZZ_CHECK(s->ndim == 0 || memcmp(again->shape, s->shape, sizeof(int64_t) * s->ndim) == 0);
	for (int64_t i = 0; i < n; i++)
		FUZZ_CHECK(again->strings[i].len == s->strings[i].len &&
			   (!s->strings[i].len || memcmp(again->strings[i].data, s->strings[i].data,
							 s->strings[i].len) == 0));
	tfab_string_tensor_free(again);
	free(buf);
}

static void check_numbers(const DLTensor *t)
{
	struct tfab_string_tensor *s = NULL;
	DLManagedTensor *again = NULL;
	size_t len = 0, nbytes = (t->dtype.bits * (size_t)t->dtype.lanes + 7) / 8;
	uint8_t *buf;

	for (int i = 0; i < t->ndim; i++)
		nbytes *= (size_t)t->shape[i];
	FUZZ_CHECK(tfab_tensorproto_encode(t, NULL, 0, &len) == -ENOSPC);
	buf = malloc(len ? len : 1);
	if (!buf)
		return;
	FUZZ_CHECK(tfab_tensorproto_encode(t, buf, len, &len) == 0);
	FUZZ_CHECK(tfab_tensorproto_decode(buf, len, &again, &s) == 0);
	FUZZ_CHECK(again && !s && again->dl_tensor.ndim == t->ndim);
	FUZZ_CHECK(memcmp(&again->dl_tensor.dtype, &t->dtype, sizeof(t->dtype)) == 0);
	FUZZ_CHECK(t->ndim == 0 ||
		   memcmp(again->dl_tensor.shape, t->shape, sizeof(int64_t) * t->ndim) == 0);
	FUZZ_CHECK(!nbytes || memcmp(again->dl_tensor.data, t->data, nbytes) == 0);
	again->deleter(again);
	free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tfab_string_tensor *s = NULL;
	DLManagedTensor *t = NULL;

	fuzz_quiet();

	if (tfab_tensorproto_decode_max(data, size, FUZZ_MAX_DECODED, &t, &s) != 0) {
		FUZZ_CHECK(!t && !s);
		return 0;
	}
	FUZZ_CHECK(!t != !s);
	if (t) {
		check_numbers(&t->dl_tensor);
		t->deleter(t);
	}
	if (s) {
		check_strings(s);
		tfab_string_tensor_free(s);
	}
	return 0;
}
