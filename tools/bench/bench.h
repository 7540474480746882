/*
 * What the bench programs share: a monotonic clock and sorting their samples for medians.
 * Header-only, so that each program stays one file to build and read.
 */
#ifndef TFAB_BENCH_H
#define TFAB_BENCH_H

#include <stdlib.h>
#include <time.h>

static inline double bench_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static inline double bench_now_us(void)
{
	return bench_now_ns() / 1e3;
}

static inline int bench_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* v sorted in place; its median (the upper one of an even count). */
static inline double bench_median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), bench_cmp);
	return v[n / 2];
}

#endif
