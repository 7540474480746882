/*
 * progress-idle: what a progress call costs when nothing comes, the loop every waiting rank
 * and every spinning receiver runs. Two contexts of this process, a peer of each connected to
 * the other through their blobs (TFAB_PROVIDER picks the path: shm by default here), then
 * CALLS tfab_progress calls on one of them with nothing in flight. Prints ns a call; run it
 * under `valgrind --tool=callgrind` for instructions a call.
 *
 * usage: progress-idle [CALLS]   (default 1,000,000)
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <tfab/tfab.h>

#include "bench.h"

int main(int argc, char **argv)
{
	struct tfab_context *c[2] = {NULL, NULL};
	struct tfab_peer *p[2] = {NULL, NULL};
	long calls = argc > 1 ? atol(argv[1]) : 1000000;
	struct timespec t0, t1;
	int rc;

	if (calls < 1) {
		fprintf(stderr, "usage: progress-idle [CALLS]\n");
		return 2;
	}
	setenv("TFAB_PROVIDER", "shm", 0);
	rc = bench_pair(c, p);
	if (rc) {
		fprintf(stderr, "progress-idle: %s\n", tfab_strerror(rc));
		return 1;
	}
	for (int i = 0; i < 1000; i++) { /* the connection's own traffic settles */
		tfab_progress(c[0]);
		tfab_progress(c[1]);
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long i = 0; i < calls; i++)
		tfab_progress(c[0]);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("{\"test\":\"progress_idle\",\"path\":\"%s\",\"calls\":%ld,\"ns_per_call\":%.1f}\n",
	       tfab_peer_path(p[0]), calls,
	       ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) /
		   (double)calls);
	for (int i = 0; i < 2; i++) {
		tfab_peer_destroy(p[i]);
		tfab_context_destroy(c[i]);
	}
	return 0;
}
