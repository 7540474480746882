/*
 * Unit tests for dtype names in messages (tfab_dtype_name): every dtype as users write it,
 * lanes as a suffix, codes DLPack does not name, short buffers, and a string tensor's; and the
 * refusals of a tensor that is none, each saying what is wrong with the dtype named.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <tfab/engine.h>
#include <tfab/log.h>

#include "engine/engine.h"

static void test_names(void **state)
{
	static const struct {
		uint8_t code, bits;
		uint16_t lanes;
		const char *name;
	} cases[] = {
	    {kDLInt, 8, 1, "int8"},
	    {kDLInt, 16, 1, "int16"},
	    {kDLInt, 32, 1, "int32"},
	    {kDLInt, 64, 1, "int64"},
	    {kDLUInt, 8, 1, "uint8"},
	    {kDLUInt, 16, 1, "uint16"},
	    {kDLUInt, 32, 1, "uint32"},
	    {kDLUInt, 64, 1, "uint64"},
	    {kDLFloat, 16, 1, "float16"},
	    {kDLFloat, 32, 1, "float32"},
	    {kDLFloat, 64, 1, "float64"},
	    {kDLBfloat, 16, 1, "bfloat16"},
	    {kDLComplex, 64, 1, "complex64"},
	    {kDLComplex, 128, 1, "complex128"},
	    {6, 8, 1, "bool"},
	    {kDLInt, 4, 1, "int4"},
	    {kDLFloat, 32, 4, "float32x4"},
	    {kDLInt, 8, 16, "int8x16"},
	    {6, 8, 2, "boolx2"},
	    {kDLOpaqueHandle, 64, 1, "handle64"},
	    {9, 8, 1, "DLPack type code 9, 8 bits"},
	    {200, 16, 4, "DLPack type code 200, 16 bits x4"},
	};

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		DLDataType dt = {cases[i].code, cases[i].bits, cases[i].lanes};
		char buf[TFAB_DTYPE_NAME_MAX];

		memset(buf, 'z', sizeof(buf));
		assert_ptr_equal(tfab_dtype_name(dt, buf, sizeof(buf)), buf);
		assert_string_equal(buf, cases[i].name);
	}
}

/* The longest name fits TFAB_DTYPE_NAME_MAX; a short buffer is cut, never overrun. */
static void test_bounds(void **state)
{
	DLDataType worst = {255, 255, 65535}, f32x4 = {kDLFloat, 32, 4};
	char buf[TFAB_DTYPE_NAME_MAX + 8], small[8];

	(void)state;
	tfab_dtype_name(worst, buf, sizeof(buf));
	assert_string_equal(buf, "DLPack type code 255, 255 bits x65535");
	assert_true(strlen(buf) < TFAB_DTYPE_NAME_MAX);
	memset(small, 'z', sizeof(small));
	tfab_dtype_name(f32x4, small, 6);
	assert_string_equal(small, "float");
	assert_int_equal(small[6], 'z');
	assert_null(tfab_dtype_name(f32x4, NULL, 8));
}

/* What the wire meta-data says: a string tensor's code is no DLPack code. */
static void test_meta(void **state)
{
	struct tfab_wire_meta m = {.dtype_code = TFAB_WIRE_DTYPE_STRING};
	char buf[TFAB_DTYPE_NAME_MAX];

	(void)state;
	assert_string_equal(tfab__meta_dtype_name(&m, buf, sizeof(buf)), "string");
	m.dtype_code = kDLBfloat;
	m.dtype_bits = 16;
	m.dtype_lanes = 1;
	assert_string_equal(tfab__meta_dtype_name(&m, buf, sizeof(buf)), "bfloat16");
}

static char last[512];
static int logged;

static void keep(void *arg, enum tfab_log_level level, const char *subsys, const char *msg)
{
	(void)arg;
	(void)level;
	(void)subsys;
	logged++;
	snprintf(last, sizeof(last), "%s", msg);
}

/* A tensor refused says why, once, naming its dtype; a good one says nothing. */
static void test_tensor_refusals(void **state)
{
	float data[6];
	int64_t shape[2] = {2, 3}, negative[2] = {2, -3}, huge[2] = {INT64_MAX, 4};
	static const struct {
		DLDataType dtype;
		int ndim, shape; /* 0: shape, 1: negative, 2: huge, 3: none */
		bool data;
		int rc;
		const char *said;
	} cases[] = {
	    {{kDLFloat, 0, 1},
	     2,
	     0,
	     true,
	     -EINVAL,
	     "a tensor of dtype float0: a dtype has 1 bit and 1 lane at least"},
	    {{kDLInt, 32, 0},
	     2,
	     0,
	     true,
	     -EINVAL,
	     "a tensor of dtype int32x0: a dtype has 1 bit and 1 lane at least"},
	    {{kDLInt, 32, 1},
	     2,
	     3,
	     true,
	     -EINVAL,
	     "a tensor (int32) of 2 dimensions without a shape"},
	    {{kDLInt, 32, 1},
	     2,
	     1,
	     true,
	     -EINVAL,
	     "a tensor (int32) whose dimension 1 is negative (-3)"},
	    {{kDLBfloat, 16, 1},
	     2,
	     2,
	     true,
	     -EOVERFLOW,
	     "a tensor (bfloat16) whose size overflows 64 bits"},
	    {{kDLFloat, 32, 1},
	     2,
	     0,
	     false,
	     -EINVAL,
	     "a tensor (float32) of 24 bytes without data"},
	    {{kDLFloat, 32, 1}, 2, 0, true, 0, ""},
	};
	struct tfab_wire_meta meta;
	void *out;

	(void)state;
	tfab_log_set_sink(keep, NULL);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int64_t *const shapes[] = {shape, negative, huge, NULL};
		DLTensor t = {.data = cases[i].data ? data : NULL,
			      .device = {kDLCPU, 0},
			      .ndim = cases[i].ndim,
			      .dtype = cases[i].dtype,
			      .shape = shapes[cases[i].shape]};

		logged = 0;
		last[0] = '\0';
		assert_int_equal(tfab__meta_from_dltensor(&t, false, &meta, &out), cases[i].rc);
		assert_int_equal(logged, cases[i].rc ? 1 : 0);
		assert_string_equal(last, cases[i].said);
	}
	tfab_log_set_sink(NULL, NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_names),
	    cmocka_unit_test(test_bounds),
	    cmocka_unit_test(test_meta),
	    cmocka_unit_test(test_tensor_refusals),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
