/*
 * Unit tests for int8 compression (lib/world/reduce.h, doc/world.md "Compression"): blocks of
 * TFAB_INT8_BLOCK values, each with its fp32 scale in front (max-abs scaling), and every
 * value's error within half a quantization step of that scale: for random data of many
 * magnitudes and both signs, with and without error feedback, and at the edges of fp32 (all
 * equal, one huge outlier, zeros, subnormal blocks, blocks near FLT_MAX).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "world/reduce.h"

/*
 * Half a step, and the rounding of fp32 arithmetic on top: x times the scale's inverse, and
 * the step times the scale, each off by at most 127 steps' 2^-24 (about 1e-5 of a step).
 */
#define HALF_STEP (0.5 + 1e-4)

static uint64_t rng = 0x9e3779b97f4a7c15ull;

/* Uniform in [-1, 1). */
static double uniform(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) / (double)(1ull << 52) - 1.0;
}

/* The largest |x| of a block. */
static double max_abs(const float *x, size_t n)
{
	double m = 0;

	for (size_t i = 0; i < n; i++)
		m = fabs((double)x[i]) > m ? fabs((double)x[i]) : m;
	return m;
}

/*
 * Compresses n values of x (with resid, error feedback: x + resid is what is compressed) and
 * checks every block: its scale is max-abs scaling (the block's largest |value| over 127, to
 * within the scale's own rounding), and every value decompresses within
 * half a step of what was compressed; with resid, what is left in it is that error. Returns the
 * largest error seen, in steps.
 */
static double check_int8(const char *what, const float *x, float *resid, size_t n)
{
	size_t size = tfab__compressed_size(TFAB_COMPRESS_INT8, n);
	uint8_t *c = malloc(size);
	float *d = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
	const uint8_t *at = c;
	double worst = 0;

	assert_non_null(c);
	assert_non_null(d);
	assert_non_null(want);
	assert_int_equal(size, n + 4 * ((n + TFAB_INT8_BLOCK - 1) / TFAB_INT8_BLOCK));
	for (size_t i = 0; i < n; i++)
		want[i] = resid ? x[i] + resid[i] : x[i];
	tfab__compress(TFAB_COMPRESS_INT8, c, x, resid, n);
	tfab__decompress_add(TFAB_COMPRESS_INT8, d, NULL, c, n);
	for (size_t b = 0; b < n; b += TFAB_INT8_BLOCK) {
		size_t len = n - b < TFAB_INT8_BLOCK ? n - b : TFAB_INT8_BLOCK;
		double m = max_abs(want + b, len), step;
		float scale;

		memcpy(&scale, at, 4);
		at += 4 + len;
		step = scale;
		/* max-abs scaling: the largest value over 127, within two units of the scale */
		if (m == 0 ? scale != 0.0f
			   : !(fabs(step - m / 127.0) <=
			       2.0 * ((double)nextafterf(scale, INFINITY) - step))) {
			fprintf(
			    stderr,
			    "%s: block at %zu: scale %a for a largest |value| of %a: not max-abs "
			    "scaling\n",
			    what, b, step, m);
			fail();
		}
		for (size_t i = b; i < b + len; i++) {
			double err = fabs((double)d[i] - (double)want[i]);
			bool ok = step > 0 ? err <= HALF_STEP * step : err == 0;

			if (!ok) {
				fprintf(
				    stderr,
				    "%s: value %zu: %a decompressed as %a: off by %a, %.4g steps "
				    "of %a (at most half a step)\n",
				    what, i, (double)want[i], (double)d[i], err, err / step, step);
				fail();
			}
			if (step > 0 && err / step > worst)
				worst = err / step;
			/* error feedback keeps exactly what was lost, to within its own rounding */
			if (resid && fabs((double)resid[i] - ((double)want[i] - (double)d[i])) >
					 1e-6 * step + FLT_TRUE_MIN) {
				fprintf(stderr,
					"%s: value %zu: residual %a, but %a was compressed and %a "
					"came back\n",
					what, i, (double)resid[i], (double)want[i], (double)d[i]);
				fail();
			}
		}
	}
	free(c);
	free(d);
	free(want);
	return worst;
}

enum { N = 2 * TFAB_INT8_BLOCK + 1000 }; /* two whole blocks and a short one */

/* Random data of many magnitudes and both signs: within half a step everywhere. */
static void test_random_scales(void **state)
{
	static const double scales[] = {1e-30, 1e-3, 0.5, 1.0, 7.0, 1e3, 1e30};
	float *x = malloc(N * sizeof(float));
	double worst = 0;

	(void)state;
	assert_non_null(x);
	for (size_t s = 0; s < sizeof(scales) / sizeof(scales[0]); s++) {
		char what[64];
		double w;

		for (size_t i = 0; i < N; i++)
			x[i] = (float)(uniform() * scales[s]);
		snprintf(what, sizeof(what), "random data of scale %g", scales[s]);
		w = check_int8(what, x, NULL, N);
		worst = w > worst ? w : worst;
	}
	/* rounded to nearest: the random values come close to half a step, never beyond */
	assert_true(worst > 0.45);
	free(x);
}

/* With error feedback: what was compressed (input plus residual) is within half a step. */
static void test_error_feedback(void **state)
{
	float *x = malloc(N * sizeof(float)), *resid = calloc(N, sizeof(float));

	(void)state;
	assert_non_null(x);
	assert_non_null(resid);
	for (int round = 0; round < 4; round++) {
		for (size_t i = 0; i < N; i++)
			x[i] = (float)(uniform() * (round + 1) * 3.0);
		check_int8("error feedback", x, resid, N);
	}
	free(x);
	free(resid);
}

/* Blocks of one shape each: the edges of max-abs scaling. */
static void fill_case(float *x, size_t n, int k)
{
	for (size_t i = 0; i < n; i++) {
		switch (k) {
		case 0: /* all equal */
			x[i] = 3.25f;
			break;
		case 1: /* all equal, negative */
			x[i] = -7.5f;
			break;
		case 2: /* small values and one huge outlier */
			x[i] = i == 17 ? 1e6f : (float)uniform();
			break;
		case 3: /* negative only */
			x[i] = -(float)fabs(uniform()) * 40.0f;
			break;
		case 4: /* zeros */
			x[i] = 0.0f;
			break;
		case 5: /* zeros and one value */
			x[i] = i == 4000 ? -2.0f : 0.0f;
			break;
		case 6: /* subnormal values: the step's inverse is beyond fp32 */
			x[i] = (float)uniform() * 1e-39f;
			break;
		case 7: /* small normal values whose step is subnormal */
			x[i] = (float)(uniform() * 1e-37);
			break;
		case 8: /* values of a few subnormal units: a step below the smallest float */
			x[i] = (float)((int)(uniform() * 60.0)) * FLT_TRUE_MIN;
			break;
		case 9: /* values near FLT_MAX: 127 steps must not overflow */
			x[i] = i == 5 ? -FLT_MAX : (float)(uniform() * 3e38);
			break;
		case 10: /* FLT_MAX alone */
			x[i] = FLT_MAX;
			break;
		}
	}
}

static void test_edges(void **state)
{
	static const char *const names[] = {"all equal",
					    "all equal, negative",
					    "one huge outlier",
					    "negative",
					    "zeros",
					    "zeros and one value",
					    "subnormal values",
					    "values with a subnormal step",
					    "a few subnormal units",
					    "values near FLT_MAX",
					    "FLT_MAX alone"};
	float *x = malloc(N * sizeof(float));
	size_t size = tfab__compressed_size(TFAB_COMPRESS_INT8, N);
	uint8_t *c = malloc(size);
	float *d = malloc(N * sizeof(float));

	(void)state;
	assert_non_null(x);
	assert_non_null(c);
	assert_non_null(d);
	for (int k = 0; k < (int)(sizeof(names) / sizeof(names[0])); k++) {
		fill_case(x, N, k);
		check_int8(names[k], x, NULL, N);
	}
	/* all equal comes back equal, and zeros come back zeros, exactly */
	fill_case(x, N, 0);
	tfab__compress(TFAB_COMPRESS_INT8, c, x, NULL, N);
	tfab__decompress_add(TFAB_COMPRESS_INT8, d, NULL, c, N);
	for (size_t i = 1; i < N; i++)
		assert_true(d[i] == d[0]);
	assert_true(fabs(d[0] - 3.25) <= 3.25 * 1e-6);
	fill_case(x, N, 4);
	tfab__compress(TFAB_COMPRESS_INT8, c, x, NULL, N);
	tfab__decompress_add(TFAB_COMPRESS_INT8, d, NULL, c, N);
	for (size_t i = 0; i < N; i++)
		assert_true(d[i] == 0.0f);
	free(x);
	free(c);
	free(d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_random_scales),
	    cmocka_unit_test(test_error_feedback),
	    cmocka_unit_test(test_edges),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
