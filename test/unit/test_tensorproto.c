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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <tfab/log.h>
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
 * A few bytes whose repeated value would fill more than the bound: refused with -EMSGSIZE
 * before anything is allocated (the fuzzer found 64 bytes that took 1.25 GB and seconds).
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

/* A TensorProto written here, field by field. */
struct proto {
	uint8_t b[1024];
	size_t len;
};

static void put_byte(struct proto *p, uint8_t v)
{
	assert_true(p->len < sizeof(p->b));
	p->b[p->len++] = v;
}

static size_t varint_size(uint64_t v)
{
	size_t n = 1;

	for (; v > 0x7f; v >>= 7)
		n++;
	return n;
}

static void put_varint(struct proto *p, uint64_t v)
{
	for (; v > 0x7f; v >>= 7)
		put_byte(p, (uint8_t)(v | 0x80));
	put_byte(p, (uint8_t)v);
}

/* dtype (field 1) and tensor_shape (field 2), one dim (field 2, its size field 1) each. */
static void put_head(struct proto *p, unsigned dtype, int ndim, const int64_t *shape)
{
	size_t body = 0;

	p->len = 0;
	put_byte(p, 0x08);
	put_varint(p, dtype);
	for (int i = 0; i < ndim; i++)
		body += 2 + 1 + varint_size((uint64_t)shape[i]);
	put_byte(p, 0x12);
	put_varint(p, body);
	for (int i = 0; i < ndim; i++) {
		put_byte(p, 0x12);
		put_varint(p, 1 + varint_size((uint64_t)shape[i]));
		put_byte(p, 0x08);
		put_varint(p, (uint64_t)shape[i]);
	}
}

/* A length-delimited field: bytes, or a packed repeated one. */
static void put_field(struct proto *p, unsigned field, const void *data, size_t len)
{
	put_byte(p, (uint8_t)(field << 3 | 2));
	put_varint(p, len);
	for (size_t i = 0; i < len; i++)
		put_byte(p, ((const uint8_t *)data)[i]);
}

enum { DT_FLOAT = 1, DT_INT8 = 6, DT_STRING = 7, DT_BOOL = 10, DT_COMPLEX128 = 18 };

/* The error lines logged meanwhile, one after another. */
static char logged[4096];

static void log_capture(void *arg, enum tfab_log_level level, const char *subsys, const char *msg)
{
	size_t n = strlen(logged);

	(void)arg, (void)level, (void)subsys;
	snprintf(logged + n, sizeof(logged) - n, "%s\n", msg);
}

static void capture_start(void)
{
	logged[0] = '\0';
	tfab_log_set_sink(log_capture, NULL);
}

/*
 * Inputs of 11 to 77 bytes that claim 1 to 1.5 GB of repeated values (strings empty or
 * repeating one, bools, floats, complex pairs, zeros): 2 GiB was the bound, and each took
 * that memory and seconds of CPU. Refused with -EMSGSIZE by the default bound, and through the
 * engine's decode by TFAB_STRING_MAX_BYTES, whose refusal names the setting, the limit and
 * the sizes.
 */
static void test_amplifying_refused(void **state)
{
	static const char text61[] =
	    "one string of 61 bytes that every element of it repeats......";
	const int64_t strings_1_5g[1] = {3ll << 25}, strings_1g[2] = {8192, 8192};
	const int64_t bools_1_5g[1] = {1500000000}, floats_1g[1] = {1ll << 28};
	const int64_t complex_1_5g[1] = {3ll << 25}, int8_1g[1] = {1ll << 30};
	const uint8_t yes = 1;
	const float f = 1.5f;
	const double pair[2] = {1, -2};
	struct proto p[6];
	char want[128];

	(void)state;
	put_head(&p[0], DT_STRING, 1, strings_1_5g);
	put_head(&p[1], DT_STRING, 2, strings_1g);
	put_field(&p[1], 8, text61, sizeof(text61) - 1);
	put_head(&p[2], DT_BOOL, 1, bools_1_5g);
	put_byte(&p[2], 0x58); /* bool_val */
	put_byte(&p[2], yes);
	put_head(&p[3], DT_FLOAT, 1, floats_1g);
	put_field(&p[3], 5, &f, sizeof(f));
	put_head(&p[4], DT_COMPLEX128, 1, complex_1_5g);
	put_field(&p[4], 12, pair, sizeof(pair));
	put_head(&p[5], DT_INT8, 1, int8_1g);
	assert_int_equal(p[1].len, 77);
	for (int i = 0; i < 6; i++) {
		struct tfab_string_tensor *s = NULL;
		DLManagedTensor *t = NULL;

		capture_start();
		if (tfab_tensorproto_decode(p[i].b, p[i].len, &t, &s) != -EMSGSIZE || t || s)
			fail_msg("case %d (%zu bytes) was not refused", i, p[i].len);
		snprintf(want, sizeof(want), "tfab_tensorproto_decode's bound (%llu bytes)",
			 (unsigned long long)TFAB_TENSORPROTO_DEFAULT_MAX);
		if (!strstr(logged, want))
			fail_msg("case %d: no '%s' in: %s", i, want, logged);
	}
	/* The engine's decode of a received string tensor: its setting named, and the sizes. */
	for (int i = 0; i < 2; i++) {
		struct tfab_string_tensor *s = NULL;

		capture_start();
		assert_int_equal(tfab__tensorproto_decode_shaped(p[i].b, p[i].len, 256u << 20,
								 "TFAB_STRING_MAX_BYTES", -1, NULL,
								 NULL, &s),
				 -EMSGSIZE);
		assert_null(s);
		assert_non_null(strstr(logged, "TFAB_STRING_MAX_BYTES (268435456 bytes)"));
		snprintf(want, sizeof(want), "a TensorProto of %zu bytes and %llu elements",
			 p[i].len, i ? 8192ull * 8192 : 3ull << 25);
		if (!strstr(logged, want))
			fail_msg("case %d: no '%s' in: %s", i, want, logged);
	}
	tfab_log_set_sink(NULL, NULL);
}

/*
 * At the bound: a tensor whose decoding takes a little less than max_bytes decodes, whole;
 * one that would take max_bytes is refused. Its parse counts too: a few hundred empty strings
 * given one by one take 2 bytes each in the TensorProto, 16 in the message as parsed, and
 * more while protobuf-c parses them.
 */
static void test_bound_edge(void **state)
{
	const uint64_t max = 1u << 20, slack = 8192;
	const int64_t under_s[1] = {(int64_t)((max - slack) / 16)}, over_s[1] = {max / 16};
	const int64_t under_f[1] = {(int64_t)((max - slack) / 4)}, over_f[1] = {max / 4};
	const int64_t under_d[1] = {(int64_t)((TFAB_TENSORPROTO_DEFAULT_MAX - slack) / 16)};
	const int64_t over_d[1] = {TFAB_TENSORPROTO_DEFAULT_MAX / 16}, many[1] = {300};
	const float f = 2.5f;
	struct tfab_string_tensor *s = NULL;
	DLManagedTensor *t = NULL;
	struct proto p;

	(void)state;
	/* strings: "ab" repeated */
	put_head(&p, DT_STRING, 1, under_s);
	put_field(&p, 8, "ab", 2);
	assert_int_equal(tfab_tensorproto_decode_max(p.b, p.len, max, NULL, &s), 0);
	assert_int_equal(tfab_string_tensor_count(s), under_s[0]);
	for (int64_t i = 0; i < under_s[0]; i++)
		if (s->strings[i].len != 2 || memcmp(s->strings[i].data, "ab", 2) != 0)
			fail_msg("string %lld of %lld is not \"ab\"", (long long)i,
				 (long long)under_s[0]);
	tfab_string_tensor_free(s);
	s = NULL;
	put_head(&p, DT_STRING, 1, over_s);
	put_field(&p, 8, "ab", 2);
	assert_int_equal(tfab_tensorproto_decode_max(p.b, p.len, max, NULL, &s), -EMSGSIZE);
	assert_null(s);
	/* numbers: 2.5 repeated */
	put_head(&p, DT_FLOAT, 1, under_f);
	put_field(&p, 5, &f, sizeof(f));
	assert_int_equal(tfab_tensorproto_decode_max(p.b, p.len, max, &t, NULL), 0);
	assert_int_equal(t->dl_tensor.shape[0], under_f[0]);
	for (int64_t i = 0; i < under_f[0]; i++)
		if (((const float *)t->dl_tensor.data)[i] != 2.5f)
			fail_msg("float %lld of %lld is not 2.5", (long long)i,
				 (long long)under_f[0]);
	t->deleter(t);
	t = NULL;
	put_head(&p, DT_FLOAT, 1, over_f);
	put_field(&p, 5, &f, sizeof(f));
	assert_int_equal(tfab_tensorproto_decode_max(p.b, p.len, max, &t, NULL), -EMSGSIZE);
	assert_null(t);
	/* the default bound: empty strings (zeroed memory, not written) */
	put_head(&p, DT_STRING, 1, under_d);
	assert_int_equal(tfab_tensorproto_decode(p.b, p.len, NULL, &s), 0);
	assert_int_equal(tfab_string_tensor_count(s), under_d[0]);
	assert_int_equal(s->strings[0].len + s->strings[under_d[0] - 1].len, 0);
	tfab_string_tensor_free(s);
	s = NULL;
	put_head(&p, DT_STRING, 1, over_d);
	assert_int_equal(tfab_tensorproto_decode(p.b, p.len, NULL, &s), -EMSGSIZE);
	assert_null(s);
	/* the parse: 300 empty strings given, 600 bytes, take 4800 in the message alone */
	put_head(&p, DT_STRING, 1, many);
	for (int i = 0; i < many[0]; i++)
		put_field(&p, 8, NULL, 0);
	capture_start();
	assert_int_equal(tfab_tensorproto_decode_max(p.b, p.len, 4096, NULL, &s), -EMSGSIZE);
	assert_null(s);
	assert_non_null(strstr(logged, "more than max_bytes (4096 bytes) to parse"));
	tfab_log_set_sink(NULL, NULL);
	assert_int_equal(tfab_tensorproto_decode_max(p.b, p.len, 64 << 10, NULL, &s), 0);
	assert_int_equal(tfab_string_tensor_count(s), 300);
	tfab_string_tensor_free(s);
}

/* Exactly 32 dimensions decode, numbers and strings; 33 are refused. */
static void test_dims_32_33(void **state)
{
	int64_t ones[33];
	const float f = -1.0f;
	struct tfab_string_tensor *s = NULL;
	DLManagedTensor *t = NULL;
	struct proto p;

	(void)state;
	for (int i = 0; i < 33; i++)
		ones[i] = 1;
	ones[31] = 2; /* two elements, the last dimension's */
	put_head(&p, DT_STRING, 32, ones);
	put_field(&p, 8, "x", 1);
	assert_int_equal(tfab_tensorproto_decode(p.b, p.len, &t, &s), 0);
	assert_non_null(s);
	assert_int_equal(s->ndim, 32);
	assert_memory_equal(s->shape, ones, 32 * sizeof(int64_t));
	assert_int_equal(tfab_string_tensor_count(s), 2);
	assert_true(s->strings[1].len == 1 && s->strings[1].data[0] == 'x');
	tfab_string_tensor_free(s);
	s = NULL;
	put_head(&p, DT_FLOAT, 32, ones);
	put_field(&p, 5, &f, sizeof(f));
	assert_int_equal(tfab_tensorproto_decode(p.b, p.len, &t, &s), 0);
	assert_non_null(t);
	assert_int_equal(t->dl_tensor.ndim, 32);
	assert_memory_equal(t->dl_tensor.shape, ones, 32 * sizeof(int64_t));
	assert_true(((const float *)t->dl_tensor.data)[1] == -1.0f);
	t->deleter(t);
	t = NULL;
	put_head(&p, DT_STRING, 33, ones);
	put_field(&p, 8, "x", 1);
	assert_int_equal(tfab_tensorproto_decode(p.b, p.len, &t, &s), -TFAB_ERR_PROTOCOL);
	put_head(&p, DT_FLOAT, 33, ones);
	assert_int_equal(tfab_tensorproto_decode(p.b, p.len, &t, &s), -TFAB_ERR_PROTOCOL);
	assert_null(t);
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
	assert_int_equal(
	    tfab__tensorproto_decode_shaped(f3, sizeof(f3), 1u << 20, "bound", 1, &one, &t, NULL),
	    -TFAB_ERR_PROTOCOL);
	assert_int_equal(
	    tfab__tensorproto_decode_shaped(f3, sizeof(f3), 1u << 20, "bound", 0, NULL, &t, NULL),
	    -TFAB_ERR_PROTOCOL);
	assert_int_equal(tfab__tensorproto_decode_shaped(bools, sizeof(bools), 1u << 20, "bound", 1,
							 &one, &t, NULL),
			 -TFAB_ERR_PROTOCOL);
	assert_int_equal(
	    tfab__tensorproto_decode_shaped(f3, sizeof(f3), 1u << 20, "bound", 1, &three, &t, NULL),
	    0);
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
	    cmocka_unit_test(test_amplifying_refused),
	    cmocka_unit_test(test_bound_edge),
	    cmocka_unit_test(test_dims_32_33),
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
