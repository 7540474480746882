/*
 * TensorProto compatibility: tfab's bytes against protoc's for the same tensors (every dtype,
 * strings), tfab's reading of protoc's bytes the way TensorFlow's Tensor::FromProto reads
 * them (tensor_content, the typed fields, a missing shape...), and refusals: what TensorFlow
 * refuses too, malformed bytes, the wrong kind, dtypes TensorFlow has no DataType for.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <tfab/status.h>
#include <tfab/tensorproto.h>

#include "proto/tensorproto.h"

#include "tensorproto_vectors.h"

#define NVEC (sizeof(tp_vectors) / sizeof(tp_vectors[0]))
#define NBAD (sizeof(tp_bad) / sizeof(tp_bad[0]))

static uint8_t pattern_byte(size_t i)
{
	return (uint8_t)(i * 37 + 11);
}

/* The tensor a vector describes, over content the caller frees. */
static DLTensor numeric_of(const struct tp_vector *v, int64_t *shape, uint8_t **content_p)
{
	DLTensor t = {0};
	uint8_t *c = malloc(v->content_len ? v->content_len : 1);

	memcpy(c, v->content, v->content_len);
	memcpy(shape, v->shape, sizeof(v->shape));
	t.data = c;
	t.device.device_type = kDLCPU;
	t.ndim = v->ndim;
	t.dtype.code = v->code;
	t.dtype.bits = v->bits;
	t.dtype.lanes = 1;
	t.shape = shape;
	*content_p = c;
	return t;
}

static void test_encode_matches_protoc(void **state)
{
	(void)state;
	for (size_t i = 0; i < NVEC; i++) {
		const struct tp_vector *v = &tp_vectors[i];
		uint8_t buf[4096];
		size_t len = 0;
		int rc;

		if (!v->encode)
			continue;
		if (v->strings) {
			struct tfab_string s[8];
			struct tfab_string_tensor t = {v->ndim, v->shape, s};

			for (size_t k = 0; k < v->nstrs; k++) {
				s[k].data = v->strs[k].data;
				s[k].len = v->strs[k].len;
			}
			/* the size first, as a caller sizing its buffer would */
			assert_int_equal(tfab_tensorproto_encode_strings(&t, NULL, 0, &len),
					 -ENOSPC);
			assert_int_equal(len, v->proto_len);
			rc = tfab_tensorproto_encode_strings(&t, buf, sizeof(buf), &len);
		} else {
			int64_t shape[4];
			uint8_t *c;
			DLTensor t = numeric_of(v, shape, &c);

			assert_int_equal(tfab_tensorproto_encode(&t, NULL, 0, &len), -ENOSPC);
			assert_int_equal(len, v->proto_len);
			rc = tfab_tensorproto_encode(&t, buf, sizeof(buf), &len);
			free(c);
		}
		if (rc || len != v->proto_len || memcmp(buf, v->proto, len) != 0)
			fail_msg("%s: tfab's TensorProto bytes differ from protoc's", v->name);
	}
}

/* tfab's reading of a vector's bytes is what the vector says; false (and why) if not. */
static bool decodes_as_said(const struct tp_vector *v)
{
	DLManagedTensor *m = NULL;
	struct tfab_string_tensor *s = NULL;
	const char *why = NULL;
	int rc = tfab_tensorproto_decode(v->proto, v->proto_len, &m, &s);

	if (rc) {
		print_error("%s: decode gave %d (%s)\n", v->name, rc, tfab_strerror(rc));
		return false;
	}
	if (v->strings) {
		if (m || !s)
			why = "not a string tensor";
		else if (s->ndim != v->ndim ||
			 memcmp(s->shape, v->shape, sizeof(int64_t) * (size_t)v->ndim) != 0)
			why = "wrong shape";
		else if (tfab_string_tensor_count(s) != (int64_t)v->nstrs)
			why = "wrong count";
		for (size_t k = 0; !why && k < v->nstrs; k++)
			if (s->strings[k].len != v->strs[k].len ||
			    (v->strs[k].len && /* data may be NULL when len is 0 */
			     memcmp(s->strings[k].data, v->strs[k].data, v->strs[k].len) != 0))
				why = "a string differs";
	} else if (s || !m) {
		why = "not a numeric tensor";
	} else if (m->dl_tensor.dtype.code != v->code || m->dl_tensor.dtype.bits != v->bits ||
		   m->dl_tensor.dtype.lanes != 1 || m->dl_tensor.ndim != v->ndim) {
		why = "wrong dtype or rank";
	} else if (memcmp(m->dl_tensor.shape, v->shape, sizeof(int64_t) * (size_t)v->ndim) != 0) {
		why = "wrong shape";
	} else if (v->content_len && memcmp(m->dl_tensor.data, v->content, v->content_len) != 0) {
		why = "wrong content";
	}
	tfab_string_tensor_free(s);
	if (m)
		m->deleter(m);
	if (why)
		print_error("%s: %s\n", v->name, why);
	return !why;
}

static void test_decode_protoc_bytes(void **state)
{
	size_t bad = 0;

	(void)state;
	for (size_t i = 0; i < NVEC; i++)
		bad += !decodes_as_said(&tp_vectors[i]);
	if (bad)
		fail_msg("%zu of %zu vectors decoded wrongly", bad, NVEC);
}

static bool has_prefix(const char *name, const char *prefix)
{
	return strncmp(name, prefix, strlen(prefix)) == 0;
}

/* The vectors whose names start with prefix (one at least) decode as they say. */
static void decode_group(const char *prefix)
{
	size_t n = 0, bad = 0;

	for (size_t i = 0; i < NVEC; i++)
		if (has_prefix(tp_vectors[i].name, prefix)) {
			bad += !decodes_as_said(&tp_vectors[i]);
			n++;
		}
	if (!n)
		fail_msg("no vector %s*", prefix);
	if (bad)
		fail_msg("%zu of the %zu vectors %s* decoded wrongly", bad, n, prefix);
}

/* The refusals whose names start with prefix (one at least) are refused, and cleanly. */
static void refuse_group(const char *prefix)
{
	size_t n = 0, bad = 0;

	for (size_t i = 0; i < NBAD; i++) {
		const struct tp_bad *b = &tp_bad[i];
		DLManagedTensor *m = NULL;
		struct tfab_string_tensor *s = NULL;
		int want = b->unsupported ? -EOPNOTSUPP : -TFAB_ERR_PROTOCOL, rc;

		if (!has_prefix(b->name, prefix))
			continue;
		n++;
		rc = tfab_tensorproto_decode(b->proto, b->proto_len, &m, &s);
		if (rc != want || m || s) {
			print_error("%s: decode gave %d (%s), not %d\n", b->name, rc,
				    tfab_strerror(rc), want);
			tfab_string_tensor_free(s);
			if (m)
				m->deleter(m);
			bad++;
		}
	}
	if (!n)
		fail_msg("no refusal %s*", prefix);
	if (bad)
		fail_msg("%zu of the %zu refusals %s* were accepted or refused wrongly", bad, n,
			 prefix);
}

/* More values than elements: TensorFlow reads the first ones (whole complex pairs). */
static void test_more_values_truncated(void **state)
{
	(void)state;
	decode_group("more_");
}

/* Fewer values than elements: TensorFlow repeats the last one. */
static void test_fewer_values_repeat_last(void **state)
{
	(void)state;
	decode_group("repeat_");
}

/* No values: TensorFlow fills the type's zero (empty strings). */
static void test_no_values_default(void **state)
{
	(void)state;
	decode_group("none_");
}

/* A tensor_content of any other size than the elements': TensorFlow refuses it. */
static void test_content_wrong_size_refused(void **state)
{
	(void)state;
	refuse_group("content_size_");
}

/* No tensor_shape: a scalar to TensorFlow, numeric or string. */
static void test_no_shape_is_scalar(void **state)
{
	(void)state;
	decode_group("no_shape_");
}

/* unknown_rank: TensorFlow's TensorShape ignores it (the dims, or none, are the shape). */
static void test_unknown_rank_ignored(void **state)
{
	(void)state;
	decode_group("unknown_rank_");
}

/* No elements: TensorFlow reads neither tensor_content (of any size) nor the values. */
static void test_empty_reads_nothing(void **state)
{
	(void)state;
	decode_group("empty_with_");
}

/* Strings in tensor_content, as TensorFlow writes them (varint lengths, then the bytes). */
static void test_string_content_read(void **state)
{
	(void)state;
	decode_group("string_content_");
}

/* ... and refused when the lengths do not describe the content exactly. */
static void test_string_content_refused(void **state)
{
	(void)state;
	refuse_group("string_content_");
}

/* A bool tensor_content byte other than 0 and 1: TensorFlow refuses it. */
static void test_bool_content_refused(void **state)
{
	(void)state;
	refuse_group("bool_content_");
}

/* Shapes TensorFlow refuses (a negative dimension, too many elements), and DT_INVALID. */
static void test_bad_shape_or_dtype_refused(void **state)
{
	(void)state;
	refuse_group("shape_");
	refuse_group("dtype_");
}

/*
 * A few bytes whose repeated value would fill more than TFAB_TENSORPROTO_MAX_DECODED: refused
 * with -EMSGSIZE before anything is allocated (the fuzzer found 64 bytes that took 1.25 GB and
 * seconds; this bound keeps a peer's few bytes from taking more than protobuf's 2 GiB).
 */
static void test_huge_fill_refused(void **state)
{
	/* DT_BOOL, shape [65536, 65536] (4 GiB of bools), bool_val true */
	static const uint8_t bools[] = {0x08, 0x0a, 0x12, 0x0c, 0x12, 0x04, 0x08, 0x80, 0x80,
					0x04, 0x12, 0x04, 0x08, 0x80, 0x80, 0x04, 0x58, 0x01};
	/* DT_STRING, shape [2^28]: 4 GiB of string entries, all empty */
	static const uint8_t strings[] = {0x08, 0x07, 0x12, 0x08, 0x12, 0x06,
					  0x08, 0x80, 0x80, 0x80, 0x80, 0x01};
	struct tfab_string_tensor *s = NULL;
	DLManagedTensor *t = NULL;

	(void)state;
	assert_int_equal(tfab_tensorproto_decode(bools, sizeof(bools), &t, &s), -EMSGSIZE);
	assert_null(t);
	assert_int_equal(tfab_tensorproto_decode(strings, sizeof(strings), &t, &s), -EMSGSIZE);
	assert_null(s);
}

/* The engine's decode of a string tensor refuses a shape other than the meta-data's first. */
static void test_shape_expected(void **state)
{
	/* DT_FLOAT, shape [3], float_val 1.0 */
	static const uint8_t f3[] = {0x08, 0x01, 0x12, 0x04, 0x12, 0x02, 0x08,
				     0x03, 0x2a, 0x04, 0x00, 0x00, 0x80, 0x3f};
	/* DT_BOOL, shape [65536, 65536]: refused for its shape, not decoded */
	static const uint8_t bools[] = {0x08, 0x0a, 0x12, 0x0c, 0x12, 0x04, 0x08, 0x80, 0x80,
					0x04, 0x12, 0x04, 0x08, 0x80, 0x80, 0x04, 0x58, 0x01};
	const int64_t three = 3, one = 1;
	DLManagedTensor *t = NULL;

	(void)state;
	assert_int_equal(tfab__tensorproto_decode_shaped(f3, sizeof(f3), 1, &one, &t, NULL),
			 -TFAB_ERR_PROTOCOL);
	assert_int_equal(tfab__tensorproto_decode_shaped(f3, sizeof(f3), 0, NULL, &t, NULL),
			 -TFAB_ERR_PROTOCOL);
	assert_int_equal(tfab__tensorproto_decode_shaped(bools, sizeof(bools), 1, &one, &t, NULL),
			 -TFAB_ERR_PROTOCOL);
	assert_int_equal(tfab__tensorproto_decode_shaped(f3, sizeof(f3), 1, &three, &t, NULL), 0);
	assert_non_null(t);
	assert_true(((float *)t->dl_tensor.data)[2] == 1.0f);
	t->deleter(t);
}

/* Round trip through tfab alone, with a larger tensor than the vectors hold. */
static void test_round_trip_large(void **state)
{
	int64_t shape[3] = {16, 64, 33};
	size_t n = 16 * 64 * 33 * 8, len;
	uint8_t *c = malloc(n), *buf;
	DLTensor t = {.data = c,
		      .device = {kDLCPU, 0},
		      .ndim = 3,
		      .dtype = {kDLFloat, 64, 1},
		      .shape = shape};
	DLManagedTensor *m;

	(void)state;
	for (size_t i = 0; i < n; i++)
		c[i] = pattern_byte(i);
	assert_int_equal(tfab_tensorproto_encode(&t, NULL, 0, &len), -ENOSPC);
	buf = malloc(len);
	assert_int_equal(tfab_tensorproto_encode(&t, buf, len, &len), 0);
	assert_int_equal(tfab_tensorproto_decode(buf, len, &m, NULL), 0);
	assert_int_equal(m->dl_tensor.ndim, 3);
	assert_memory_equal(m->dl_tensor.shape, shape, sizeof(shape));
	assert_memory_equal(m->dl_tensor.data, c, n);
	m->deleter(m);
	free(buf);
	free(c);
}

static const struct tp_vector *vector(const char *name)
{
	for (size_t i = 0; i < NVEC; i++)
		if (strcmp(tp_vectors[i].name, name) == 0)
			return &tp_vectors[i];
	fail_msg("no vector %s", name);
	return NULL;
}

static void test_refusals(void **state)
{
	const struct tp_vector *num = vector("content_float32"), *str = vector("strings_vector");
	DLManagedTensor *m = NULL;
	struct tfab_string_tensor *s = NULL;
	int64_t shape[1] = {4};
	float f[4] = {0};
	DLTensor lanes = {.data = f,
			  .device = {kDLCPU, 0},
			  .ndim = 1,
			  .dtype = {kDLFloat, 32, 4},
			  .shape = shape};
	DLTensor int4 = {
	    .data = f, .device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLInt, 4, 1}, .shape = shape};
	uint8_t buf[256];
	size_t len;

	(void)state;
	/* the wrong kind */
	assert_int_equal(tfab_tensorproto_decode(num->proto, num->proto_len, NULL, &s),
			 -EPROTOTYPE);
	assert_int_equal(tfab_tensorproto_decode(str->proto, str->proto_len, &m, NULL),
			 -EPROTOTYPE);
	/* a message cut inside its content (after the content's tag and length) */
	for (size_t cut = num->proto_len - num->content_len; cut < num->proto_len; cut++)
		if (tfab_tensorproto_decode(num->proto, cut, &m, &s) != -TFAB_ERR_PROTOCOL)
			fail_msg("a TensorProto cut at %zu of %zu bytes was not refused", cut,
				 num->proto_len);
	/* garbage, content that does not fit the shape, an unknown DataType */
	static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0xff};
	static const uint8_t short_content[] = {0x08, 0x01, 0x12, 0x04, 0x12, 0x02, 0x08,
						0x02, 0x22, 0x04, 1,	2,    3,    4};
	static const uint8_t resource[] = {0x08, 0x14, 0x12, 0x00};
	assert_int_equal(tfab_tensorproto_decode(garbage, sizeof(garbage), &m, &s),
			 -TFAB_ERR_PROTOCOL);
	assert_int_equal(tfab_tensorproto_decode(short_content, sizeof(short_content), &m, &s),
			 -TFAB_ERR_PROTOCOL);
	assert_int_equal(tfab_tensorproto_decode(resource, sizeof(resource), &m, &s), -EOPNOTSUPP);
	/* dtypes TensorFlow has no DataType for */
	assert_int_equal(tfab_tensorproto_encode(&lanes, buf, sizeof(buf), &len), -EOPNOTSUPP);
	assert_int_equal(tfab_tensorproto_encode(&int4, buf, sizeof(buf), &len), -EOPNOTSUPP);
	assert_null(m);
	assert_null(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_encode_matches_protoc),
	    cmocka_unit_test(test_decode_protoc_bytes),
	    cmocka_unit_test(test_round_trip_large),
	    cmocka_unit_test(test_refusals),
	    cmocka_unit_test(test_huge_fill_refused),
	    cmocka_unit_test(test_shape_expected),
	    cmocka_unit_test(test_no_shape_is_scalar),
	    cmocka_unit_test(test_unknown_rank_ignored),
	    cmocka_unit_test(test_more_values_truncated),
	    cmocka_unit_test(test_fewer_values_repeat_last),
	    cmocka_unit_test(test_no_values_default),
	    cmocka_unit_test(test_content_wrong_size_refused),
	    cmocka_unit_test(test_empty_reads_nothing),
	    cmocka_unit_test(test_string_content_read),
	    cmocka_unit_test(test_string_content_refused),
	    cmocka_unit_test(test_bool_content_refused),
	    cmocka_unit_test(test_bad_shape_or_dtype_refused),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
