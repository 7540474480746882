/*
 * One rank of the world tests (test_world.py), or a whole world in one process:
 *
 *   world_rank env      join from the environment (TFAB_RANK, TFAB_WORLD_SIZE, ...), then
 *                       trade a tensor with every other rank
 *   world_rank threads N  N ranks as threads of this process, each with its own context,
 *                       meeting through an allgather of their own, then the same trade
 *
 * It prints JOINED rank=R size=N, NAME r=<name> for each rank, and OK once every tensor came
 * right; a join that fails prints JOIN_FAILED status=<name> and exits 3; any other failure
 * prints why and exits 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tfab/tfab.h>

#include "ranks.h"

#define TIMEOUT_MS 20000

/* What rank `from` sends rank `to`: a value that names both. */
static int32_t value(int from, int to)
{
	return from * 1000 + to;
}

static void on_sent(void *arg, int status)
{
	*(int *)arg = status;
}

/* A tensor to every other rank, and one from each, checked. */
static int trade(struct tfab_context *ctx, struct tfab_world *w)
{
	int rank = tfab_world_rank(w), size = tfab_world_size(w);
	int32_t *out = calloc((size_t)size, sizeof(*out));
	int *status = calloc((size_t)size, sizeof(*status));
	int64_t one = 1;
	int rc = out && status ? 0 : -1;

	for (int r = 0; r < size && rc == 0; r++) {
		DLTensor t = {.data = &out[r],
			      .device = {kDLCPU, 0},
			      .ndim = 1,
			      .dtype = {kDLInt, 32, 1},
			      .shape = &one};

		if (r == rank)
			continue;
		if (!tfab_world_peer(w, r)) {
			printf("rank %d: no peer for rank %d\n", rank, r);
			rc = 1;
			break;
		}
		out[r] = value(rank, r);
		status[r] = 1;
		rc = tfab_send_to(ctx, tfab_world_peer(w, r), "x", 1, &t, false, on_sent,
				  &status[r]);
	}
	for (int r = 0; r < size && rc == 0; r++) {
		DLManagedTensor *t = NULL;

		if (r == rank)
			continue;
		rc = tfab_recv_sync(ctx, tfab_world_peer(w, r), "x", 1, NULL, TIMEOUT_MS, &t, NULL);
		if (rc == 0 && *(int32_t *)t->dl_tensor.data != value(r, rank)) {
			printf("rank %d: from rank %d came %d, not %d\n", rank, r,
			       *(int32_t *)t->dl_tensor.data, value(r, rank));
			rc = 1;
		}
		if (t)
			t->deleter(t);
	}
	if (rc == 0)
		rc = tfab_flush(ctx, TIMEOUT_MS);
	for (int r = 0; r < size && rc == 0; r++)
		rc = r == rank ? 0 : status[r];
	if (rc)
		printf("rank %d: the trade failed: %s\n", rank, tfab_strerror(rc));
	free(out);
	free(status);
	return rc ? 1 : 0;
}

/* Says who joined and who the others are, then trades. */
static int joined_only(struct tfab_context *ctx, struct tfab_world *w)
{
	printf("JOINED rank=%d size=%d\n", tfab_world_rank(w), tfab_world_size(w));
	for (int r = 0; r < tfab_world_size(w); r++)
		printf("NAME %d=%s\n", r, tfab_world_name(w, r));
	return trade(ctx, w);
}

static int joined(struct tfab_context *ctx, struct tfab_world *w)
{
	int rc = joined_only(ctx, w);

	tfab_world_leave(w);
	return rc;
}

static int run_env(void)
{
	struct tfab_context *ctx;
	struct tfab_world *w;
	int rc = tfab_context_create(&ctx);

	if (rc) {
		printf("context: %s\n", tfab_strerror(rc));
		return 1;
	}
	rc = tfab_world_join(ctx, NULL, &w);
	if (rc) {
		printf("JOIN_FAILED status=%s\n", ranks_status_name(rc));
		tfab_context_destroy(ctx);
		return 3;
	}
	rc = joined(ctx, w);
	if (rc == 0)
		printf("OK\n");
	tfab_context_destroy(ctx);
	return rc;
}

static int thread_body(struct tfab_context *ctx, struct tfab_world *w, void *arg)
{
	(void)arg;
	return joined_only(ctx, w);
}

static int run_threads(int n)
{
	int rc = ranks_run_threads(n, TIMEOUT_MS, thread_body, NULL);

	if (rc == 0)
		printf("OK\n");
	return rc;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 2 && strcmp(argv[1], "env") == 0)
		return run_env();
	if (argc == 3 && strcmp(argv[1], "threads") == 0)
		return run_threads(atoi(argv[2]));
	fprintf(stderr, "usage: %s env | threads N\n", argv[0]);
	return 2;
}
