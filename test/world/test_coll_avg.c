/*
 * A compressed average divides exactly once (doc/world.md, "Compression" and "Collectives":
 * the sum divided by the size, once, at the end).
 *
 *   test_coll_avg N   N ranks as threads of this process, each with its own context
 *
 * Rank r's value i is 8 (r + 1) (1 + i % 4): the mean over N ranks is 4 (N + 1) (1 + i % 4),
 * while the sum is N times that and the mean divided again N times less, so a result off by
 * a factor of N is told apart from the compression's rounding. fp16 and bf16 hold every
 * partial sum and the mean exactly (multiples of 8 below 512): their results must be exact;
 * int8 within 2 % of the largest mean (its rounding stays below 1 % here). Each compression
 * is run without error feedback, then three times under a key (the residual must not
 * change the scale), on counts that cut the ring's parts into several pieces.
 */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tfab/tfab.h>

#include "ranks.h"

#define WAIT_MS 60000

static float value(int rank, size_t i)
{
	return 8.0f * (float)(rank + 1) * (float)(1 + i % 4);
}

struct done {
	atomic_int status; /* 1 while pending */
};

static void on_done(void *arg, int status)
{
	struct done *d = arg;

	atomic_store(&d->status, status);
}

/* What a wrong result looks like, for the message. */
static const char *looks_like(double got, double mean, int n)
{
	if (fabs(got - mean * n) <= 0.05 * mean * n)
		return " (the sum: not divided)";
	if (fabs(got - mean / n) <= 0.05 * mean / n)
		return " (the mean divided again)";
	return "";
}

static int avg_once(struct tfab_world *w, enum tfab_compress how, const char *name, const char *key,
		    int round)
{
	enum { COUNT = 9001 }; /* parts of about 3,000 values: pieces of 1,024 (TFAB_COLL_PIECE) */
	int rank = tfab_world_rank(w), n = tfab_world_size(w);
	struct tfab_coll_opts o = {.compress = how, .key = key};
	float *in = malloc(COUNT * sizeof(float)), *out = malloc(COUNT * sizeof(float));
	int64_t shape = COUNT;
	DLTensor ti = {.data = in,
		       .device = {kDLCPU, 0},
		       .ndim = 1,
		       .dtype = {kDLFloat, 32, 1},
		       .shape = &shape};
	DLTensor to = ti;
	struct done d = {1};
	double tol = how == TFAB_COMPRESS_INT8 ? 0.02 * 4.0 * 4.0 * (n + 1) : 0.0;
	int rc, bad = 0;

	to.data = out;
	for (size_t i = 0; i < COUNT; i++) {
		in[i] = value(rank, i);
		out[i] = -1.0f;
	}
	rc = tfab_allreduce(w, &ti, &to, TFAB_OP_AVG, &o, on_done, &d);
	if (rc == 0)
		rc = tfab_world_wait(w, WAIT_MS);
	if (rc == 0)
		rc = atomic_load(&d.status);
	if (rc) {
		printf("rank %d: allreduce avg, %s compression: %s\n", rank, name,
		       tfab_strerror(rc));
		bad = 1;
	}
	for (size_t i = 0; i < COUNT && !bad; i++) {
		double mean = 4.0 * (n + 1) * (double)(1 + i % 4);

		if (!(fabs((double)out[i] - mean) <= tol)) {
			printf("rank %d: allreduce avg of %d ranks, %s compression%s%s, round %d: "
			       "value %zu is %g, not the mean %g (within %g)%s\n",
			       rank, n, name, key ? ", error feedback under " : "", key ? key : "",
			       round, i, (double)out[i], mean, tol, looks_like(out[i], mean, n));
			bad = 1;
		}
	}
	free(in);
	free(out);
	return bad;
}

static int body(struct tfab_context *ctx, struct tfab_world *w, void *arg)
{
	static const struct {
		const char *name;
		enum tfab_compress how;
	} zs[] = {{"fp16", TFAB_COMPRESS_FP16},
		  {"bf16", TFAB_COMPRESS_BF16},
		  {"int8", TFAB_COMPRESS_INT8}};
	int bad = 0;

	(void)ctx;
	(void)arg;
	for (size_t z = 0; z < sizeof(zs) / sizeof(zs[0]); z++) {
		bad |= avg_once(w, zs[z].how, zs[z].name, NULL, 0);
		for (int round = 1; round <= 3; round++)
			bad |= avg_once(w, zs[z].how, zs[z].name, zs[z].name, round);
	}
	if (tfab_world_rank(w) == 0)
		printf("compressed averages of %d ranks: %s\n", tfab_world_size(w),
		       bad ? "FAILED" : "each the mean");
	return bad;
}

int main(int argc, char **argv)
{
	int n = argc == 2 ? atoi(argv[1]) : 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (n < 2 || n > 16) {
		fprintf(stderr, "usage: %s N (2 to 16 ranks)\n", argv[0]);
		return 2;
	}
	return ranks_run_threads(n, WAIT_MS, body, NULL);
}
