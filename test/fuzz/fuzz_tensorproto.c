/*
 * The TensorProto decoder (lib/proto/tensorproto.c), which reads what a peer wrote into a
 * string tensor's destination. Properties: no read outside the input, no leak; a tensor it
 * returns (strings or numbers) encodes, and that decodes again to the same tensor.
 */
#include <errno.h>
#include <string.h>

#include <tfab/tensorproto.h>

#include "fuzz.h"
#include "proto/tensor.pb-c.h"

/*
 * A few bytes can describe a tensor of up to TFAB_TENSORPROTO_MAX_DECODED (2 GiB) whose values
 * repeat: legitimate, and checked by test_tensorproto, but seconds of filling that would stall
 * the search. Inputs that decode to more than this are left out here.
 */
#define FUZZ_MAX_DECODED (64u << 20)

static bool too_big_to_fuzz(const uint8_t *data, size_t size)
{
	Tensorflow__TensorProto *m = tensorflow__tensor_proto__unpack(NULL, size, data);
	uint64_t count = 16; /* the widest element, or a string's entry */
	bool big = false;

	if (!m)
		return false;
	for (size_t i = 0; m->tensor_shape && i < m->tensor_shape->n_dim && !big; i++) {
		int64_t d = m->tensor_shape->dim[i]->size;

		if (d > 0 && count > FUZZ_MAX_DECODED / (uint64_t)d)
			big = true;
		else if (d > 0)
			count *= (uint64_t)d;
	}
	tensorflow__tensor_proto__free_unpacked(m, NULL);
	return big;
}

static void check_strings(const struct tfab_string_tensor *s)
{
	struct tfab_string_tensor *again = NULL;
	DLManagedTensor *t = NULL;
	int64_t n = tfab_string_tensor_count(s);
	size_t len = 0;
	uint8_t *buf;

	FUZZ_CHECK(n >= 0);
	FUZZ_CHECK(tfab_tensorproto_encode_strings(s, NULL, 0, &len) == -ENOSPC);
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

	if (too_big_to_fuzz(data, size))
		return 0;
	if (tfab_tensorproto_decode(data, size, &t, &s) != 0) {
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
