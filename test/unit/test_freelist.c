/* Unit tests for the chunked free list of fixed-size items (lib/util/freelist.c). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdalign.h>
#include <stdbool.h>
#include <string.h>

#include "util/freelist.h"

struct item {
	void *first; /* where a free item keeps its link */
	uint32_t tag;
	char payload[37]; /* an odd size: items must still come out aligned */
};

/* Every item of three chunks' worth is distinct, aligned and whole; put back, they come out again
 * without a new chunk. */
static void test_get_put(void **state)
{
	enum { PER = 16, N = 3 * PER };
	struct tfab_freelist fl = TFAB_FREELIST_INIT(struct item, PER);
	struct item *it[N];
	void *chunks;

	(void)state;
	for (int i = 0; i < N; i++) {
		it[i] = tfab__freelist_get(&fl);
		assert_non_null(it[i]);
		assert_int_equal((uintptr_t)it[i] % alignof(max_align_t), 0);
		it[i]->tag = 0xab000000u + (uint32_t)i;
		memset(it[i]->payload, i, sizeof(it[i]->payload));
	}
	for (int i = 0; i < N; i++) {
		assert_int_equal(it[i]->tag, 0xab000000u + (uint32_t)i);
		for (size_t b = 0; b < sizeof(it[i]->payload); b++)
			assert_int_equal(it[i]->payload[b], (char)i);
		for (int j = i + 1; j < N; j++) {
			/* no two items overlap */
			uintptr_t a = (uintptr_t)it[i], c = (uintptr_t)it[j];
			assert_true(a + sizeof(struct item) <= c || c + sizeof(struct item) <= a);
		}
	}
	assert_null(fl.free); /* exactly three chunks, all handed out */
	chunks = fl.chunks;
	for (int i = 0; i < N; i++)
		tfab__freelist_put(&fl, it[i]);
	for (int i = 0; i < N; i++) {
		struct item *again = tfab__freelist_get(&fl);
		bool known = false;

		for (int j = 0; j < N; j++)
			known |= again == it[j];
		assert_true(known);
	}
	assert_ptr_equal(fl.chunks, chunks); /* no chunk was added */
	tfab__freelist_fini(&fl);
	assert_null(fl.chunks);
	assert_null(fl.free);
}

#ifdef TFAB_FREELIST_ASAN
/* Under AddressSanitizer (CI's sanitizer pass) a free item is poisoned past its link, so that
 * a use after put is reported, and an item handed out is whole again. */
static void test_asan_poison(void **state)
{
	struct tfab_freelist fl = TFAB_FREELIST_INIT(struct item, 4);
	struct item *a = tfab__freelist_get(&fl);

	assert_false(__asan_region_is_poisoned(a, sizeof(*a)));
	tfab__freelist_put(&fl, a);
	assert_false(__asan_address_is_poisoned(&a->first)); /* the link */
	assert_true(__asan_address_is_poisoned(&a->tag));
	assert_true(__asan_address_is_poisoned(&a->payload[36]));
	assert_ptr_equal(tfab__freelist_get(&fl), a);
	assert_false(__asan_region_is_poisoned(a, sizeof(*a)));
	(void)state;
	tfab__freelist_fini(&fl);
}
#endif

/* The last item put back is the first handed out (the hot one stays in cache). */
static void test_lifo(void **state)
{
	struct tfab_freelist fl = TFAB_FREELIST_INIT(struct item, 4);
	void *a, *b;

	(void)state;
	a = tfab__freelist_get(&fl);
	b = tfab__freelist_get(&fl);
	tfab__freelist_put(&fl, a);
	tfab__freelist_put(&fl, b);
	assert_ptr_equal(tfab__freelist_get(&fl), b);
	assert_ptr_equal(tfab__freelist_get(&fl), a);
	tfab__freelist_fini(&fl);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_get_put),
	    cmocka_unit_test(test_lifo),
#ifdef TFAB_FREELIST_ASAN
	    cmocka_unit_test(test_asan_poison),
#endif
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
