/* Unit tests for the hash of keys (lib/util/hash.h) and the chained table it keys. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/hash.h"

/*
 * Keys that differ in one byte, at every place of every length up to 40 (both sides of the
 * eight-byte steps), hash apart; so do keys that differ only by trailing zero bytes (the last
 * partial word is zero-padded: the length must count).
 */
static void test_every_byte_counts(void **state)
{
	unsigned char a[40], b[40];

	(void)state;
	for (size_t len = 1; len <= sizeof(a); len++) {
		for (size_t i = 0; i < len; i++)
			a[i] = (unsigned char)(i * 7 + 1);
		for (size_t at = 0; at < len; at++) {
			memcpy(b, a, len);
			b[at] ^= 0x01;
			assert_true(tfab__hash_bytes(a, len, 0) != tfab__hash_bytes(b, len, 0));
		}
		memset(b, 0, sizeof(b));
		memcpy(b, a, len);
		for (size_t more = len + 1; more <= sizeof(b); more++)
			assert_true(tfab__hash_bytes(a, len, 0) != tfab__hash_bytes(b, more, 0));
	}
	assert_true(tfab__hash_bytes("", 0, 0) != tfab__hash_bytes("\0", 1, 0));
}

/* A seed continues a hash: the same bytes under two seeds hash apart (a key, then its step). */
static void test_seed(void **state)
{
	int64_t step = 7;

	(void)state;
	assert_true(tfab__hash_bytes(&step, sizeof(step), tfab__hash_bytes("a", 1, 0)) !=
		    tfab__hash_bytes(&step, sizeof(step), tfab__hash_bytes("b", 1, 0)));
	assert_int_equal(tfab__hash_bytes("key", 3, 99), tfab__hash_bytes("key", 3, 99));
}

/*
 * Keys as TensorFlow names them, which differ only in a few digits, spread over a table's
 * buckets (its low bits): 65,536 keys in 65,536 buckets, as a uniform hash would (the longest
 * chain of such a spread is about 8; 16 would mean the low bits miss some bytes).
 */
static void test_spread(void **state)
{
	enum { N = 1 << 16 };
	unsigned *count = calloc(N, sizeof(*count));
	unsigned longest = 0, empty = 0;
	char key[128];

	(void)state;
	assert_non_null(count);
	for (int i = 0; i < N; i++) {
		int len = snprintf(key, sizeof(key),
				   "/job:worker/replica:0/task:%d/device:CPU:0;edge_%d_grad;0:0",
				   i % 8, i / 8);
		uint64_t h = tfab__hash_bytes(key, (size_t)len, 0);
		unsigned c = ++count[h & (N - 1)];

		if (c > longest)
			longest = c;
	}
	for (int i = 0; i < N; i++)
		empty += count[i] == 0;
	free(count);
	print_message("longest chain %u, empty buckets %u of %d\n", longest, empty, N);
	assert_true(longest <= 12);
	/* a uniform spread leaves about 1/e of them empty: 24,109 */
	assert_in_range(empty, 22000, 26500);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_every_byte_counts),
	    cmocka_unit_test(test_seed),
	    cmocka_unit_test(test_spread),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
