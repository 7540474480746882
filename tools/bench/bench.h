/*
 * What the bench programs share: a monotonic clock, sorting their samples for medians, and
 * (for those that include <tfab/tfab.h> first) two contexts of one process connected to each
 * other. Header-only, so that each program stays one file to build and read.
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

#ifdef TFAB_TFAB_H
/* Contexts c[0] and c[1], each with a peer p[i] connected to the other's through their blobs. */
static inline int bench_pair(struct tfab_context *c[2], struct tfab_peer *p[2])
{
	unsigned char blob[2][1024];
	size_t len[2] = {sizeof(blob[0]), sizeof(blob[1])};
	int rc = 0;

	for (int i = 0; i < 2 && rc == 0; i++)
		rc = tfab_context_create(&c[i]);
	for (int i = 0; i < 2 && rc == 0; i++)
		rc = tfab_peer_create(c[i], &p[i]);
	for (int i = 0; i < 2 && rc == 0; i++)
		rc = tfab_peer_blob(p[i], blob[i], &len[i]);
	for (int i = 0; i < 2 && rc == 0; i++)
		rc = tfab_peer_connect(p[i], blob[1 - i], len[1 - i]);
	return rc;
}
#endif

#endif
