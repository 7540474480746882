/*
 * hash-bench: the engine's key hash (tfab__hash_bytes, lib/util/hash.h) against byte-at-a-time
 * FNV-1a (what it replaced), in ns per hash, for keys of several lengths. The engine hashes a
 * tensor's key (and step) on the send, on the request, in the meta-data cache and in the
 * standing requests: TensorFlow's rendezvous keys run to 100 bytes and more (at most 512).
 * Medians of REPS rounds of 1,000,000 hashes, each round over 64 keys that differ in their
 * last digits, the result of each fed into the next (a chain, as a lookup waits for it).
 *
 * usage: hash-bench [REPS]   (default 9); prints one line per length.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/hash.h"

#include "bench.h"

static uint64_t fnv1a(const void *p, size_t len, uint64_t seed)
{
	const unsigned char *b = p;
	uint64_t h = seed ? seed : 0xcbf29ce484222325ull;

	for (size_t i = 0; i < len; i++) {
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

enum { NKEYS = 64, ROUND = 1000000 };

static double round_ns(uint64_t (*fn)(const void *, size_t, uint64_t), char keys[][513], size_t len,
		       uint64_t *sink)
{
	uint64_t h = 0;
	double t0 = bench_now_ns();

	for (int i = 0; i < ROUND; i++)
		h = fn(keys[(i + (h & 1)) % NKEYS], len, h | 1);
	*sink += h;
	return (bench_now_ns() - t0) / ROUND;
}

int main(int argc, char **argv)
{
	static const size_t lens[] = {8, 24, 64, 128, 512};
	static char keys[NKEYS][513];
	int reps = argc > 1 ? atoi(argv[1]) : 9;
	double *a = calloc((size_t)(reps > 0 ? reps : 1), sizeof(*a));
	double *b = calloc((size_t)(reps > 0 ? reps : 1), sizeof(*b));
	uint64_t sink = 0;

	if (reps < 1 || !a || !b) {
		fprintf(stderr, "usage: hash-bench [REPS]\n");
		return 2;
	}
	for (int k = 0; k < NKEYS; k++) {
		memset(keys[k], 'x', 512);
		memcpy(keys[k], "/job:worker/replica:0/task:1/device:CPU:0;", 42);
		for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++)
			snprintf(keys[k] + lens[l] - 4, 5, "%04d", k);
	}
	printf("%8s %14s %14s %8s\n", "key B", "tfab ns/hash", "FNV-1a ns/hash", "ratio");
	for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++) {
		for (int r = 0; r < reps; r++) {
			a[r] = round_ns(tfab__hash_bytes, keys, lens[l], &sink);
			b[r] = round_ns(fnv1a, keys, lens[l], &sink);
		}
		qsort(a, (size_t)reps, sizeof(*a), bench_cmp);
		qsort(b, (size_t)reps, sizeof(*b), bench_cmp);
		printf("%8zu %14.2f %14.2f %8.2f\n", lens[l], a[reps / 2], b[reps / 2],
		       a[reps / 2] / b[reps / 2]);
	}
	free(a);
	free(b);
	return sink == 42 ? 1 : 0; /* keeps the hashes computed */
}
