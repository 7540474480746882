/*
 * memcpy-bw: single-thread copy bandwidth between two buffers, the reference that shm-bench.sh
 * sets the shm backend's large writes against: glibc's memcpy, and the backend's streaming
 * copy (non-temporal stores, for writes of TFAB_SHM_NT_MIN and more). Medians of REPS copies
 * of SIZE bytes.
 *
 * usage: memcpy-bw [SIZE_BYTES] [REPS]   (default 64 MiB, 9); prints JSON lines.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "providers/shm/copy.h"

#include "bench.h"

static double median_gbps(void (*copy)(void *, const void *, size_t), void *dst, const void *src,
			  size_t len, int reps)
{
	double *r = calloc((size_t)reps, sizeof(*r)), m;

	for (int i = 0; i < reps; i++) {
		double t0 = (bench_now_ns() / 1e9);

		copy(dst, src, len);
		r[i] = (double)len / ((bench_now_ns() / 1e9) - t0) / 1e9;
	}
	qsort(r, (size_t)reps, sizeof(*r), bench_cmp);
	m = r[reps / 2];
	free(r);
	return m;
}

static void libc_copy(void *d, const void *s, size_t n)
{
	memcpy(d, s, n);
}

static void stream_copy(void *d, const void *s, size_t n)
{
	tfab_shm_copy(d, s, n, true);
}

int main(int argc, char **argv)
{
	size_t len = argc > 1 ? strtoull(argv[1], NULL, 0) : (64u << 20);
	int reps = argc > 2 ? atoi(argv[2]) : 9;
	/* Shared mappings, as the backend's segments are. */
	void *src = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	void *dst = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	if (src == MAP_FAILED || dst == MAP_FAILED || reps < 1)
		return 1;
	memset(src, 1, len);
	memset(dst, 2, len);
	printf("{\"test\":\"memcpy\",\"bytes\":%zu,\"GBps\":%.3f}\n", len,
	       median_gbps(libc_copy, dst, src, len, reps));
	printf("{\"test\":\"stream\",\"bytes\":%zu,\"GBps\":%.3f}\n", len,
	       median_gbps(stream_copy, dst, src, len, reps));
	return 0;
}
