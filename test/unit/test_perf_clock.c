/*
 * Unit tests for tfab-perf's bandwidth clock (tools/perf.h): it counts the transfers it timed.
 * A GPU run of `tfab-perf tensor -n 4` reported 18,808 GB/s at 1 MiB: its window held the whole
 * run, all five completions came in one wakeup, and the clock, started at that wakeup, divided
 * four transfers by the few nanoseconds left.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "../../tools/perf.h"

/* 1,000 bytes per transfer: gigabits per second = 8,000 * transfers / nanoseconds. */
#define SIZE 1000

/* Completions one by one: timed from the warm-up's end, over the transfers after it. */
static void test_one_by_one(void **state)
{
	struct perf_bw_clock c = {.start_ns = 1000};

	(void)state;
	perf_bw_look(&c, 1500, 0, 1); /* warm-up not done */
	perf_bw_look(&c, 2000, 1, 1); /* warm-up done: the start */
	perf_bw_look(&c, 3000, 3, 1); /* later looks leave it */
	assert_int_equal(c.t0_ns, 2000);
	assert_int_equal(c.done0, 1);
	/* 4 transfers (5 - 1) in 4,000 ns: 8 Gb/s */
	assert_true(perf_bw_gbps(&c, SIZE, 5, 6000) == 8.0);
}

/* The first look after the warm-up found three done: those three are not timed. */
static void test_several_per_wakeup(void **state)
{
	struct perf_bw_clock c = {.start_ns = 0};

	(void)state;
	perf_bw_look(&c, 1000, 3, 1);
	/* 7 transfers (10 - 3) in 7,000 ns: 8 Gb/s, not 9 (10 - 1 in 7,000 ns) */
	assert_true(perf_bw_gbps(&c, SIZE, 10, 8000) == 8.0);
}

/* Every transfer done at the first look: all of them from the loop's start. */
static void test_all_at_once(void **state)
{
	struct perf_bw_clock c = {.start_ns = 10000};

	(void)state;
	perf_bw_look(&c, 15000, 5, 1);
	/* 5 transfers in 5,000 ns (the loop's start to the end at the look): 8 Gb/s, not 4
	 * transfers in the 0 ns from the look to the end */
	assert_true(perf_bw_gbps(&c, SIZE, 5, 15000) == 8.0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_one_by_one),
	    cmocka_unit_test(test_several_per_wakeup),
	    cmocka_unit_test(test_all_at_once),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
