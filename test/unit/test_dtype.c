/*
 * Unit tests for dtype names in messages (tfab_dtype_name): every dtype as users write it,
 * lanes as a suffix, codes DLPack does not name, short buffers, and a string tensor's.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include <tfab/engine.h>

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

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_names),
	    cmocka_unit_test(test_bounds),
	    cmocka_unit_test(test_meta),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
