/*
 * One rank of a world: every rank adds its tensor into everyone's with an allreduce, and
 * checks the sum. Start one process per rank, as torchrun would:
 *   TFAB_RANK=0 TFAB_WORLD_SIZE=2 TFAB_MASTER_ADDR=127.0.0.1 TFAB_MASTER_PORT=29500 ./allreduce
 *   TFAB_RANK=1 TFAB_WORLD_SIZE=2 TFAB_MASTER_ADDR=127.0.0.1 TFAB_MASTER_PORT=29500 ./allreduce
 * Build: cc allreduce.c $(pkg-config --cflags --libs tfab). Exits 1 on any failure.
 */
#include <stdio.h>

#include <tfab/tfab.h>

#define N 1000

/* Runs from progress (here: inside tfab_world_wait) once this rank's part is done. */
static void reduced(void *arg, int status)
{
	*(int *)arg = status;
}

int main(void)
{
	static float grad[N];
	int64_t shape[1] = {N};
	DLTensor t = {.data = grad,
		      .device = {kDLCPU, 0},
		      .ndim = 1,
		      .dtype = {kDLFloat, 32, 1},
		      .shape = shape};
	struct tfab_context *ctx = NULL;
	struct tfab_world *w = NULL;
	int rc, rank, size, status = 1, bad = 0;

	rc = tfab_context_create(&ctx);
	/* Waits for every rank, at most TFAB_WORLD_TIMEOUT_MS (60 s unless set). */
	if (rc == 0)
		rc = tfab_world_join(ctx, NULL, &w);
	if (rc)
		goto out;
	rank = tfab_world_rank(w);
	size = tfab_world_size(w);
	for (int i = 0; i < N; i++)
		grad[i] = (float)(rank + i);
	/* In place; returns at once, and grad stays the library's until reduced() runs. */
	rc = tfab_allreduce(w, &t, &t, TFAB_OP_SUM, NULL, reduced, &status);
	if (rc == 0)
		rc = tfab_world_wait(w, 10000);
	if (rc == 0)
		rc = status;
	/* Element i is now the sum over ranks r of (r + i): small integers, exact in float. */
	for (int i = 0; rc == 0 && i < N; i++)
		bad |= grad[i] != (float)(size * i + size * (size - 1) / 2);
	if (rc == 0)
		printf("rank %d of %d: %s\n", rank, size, bad ? "WRONG sum" : "sum as expected");
	if (tfab_world_leave(w))
		return 1; /* a collective still runs: leave the context to the exit */
out:
	if (rc)
		fprintf(stderr, "allreduce: %s\n", tfab_strerror(rc));
	tfab_context_destroy(ctx);
	return rc || bad ? 1 : 0;
}
