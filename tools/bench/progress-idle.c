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

static int pair(struct tfab_context *a, struct tfab_context *b, struct tfab_peer **pa_p,
		struct tfab_peer **pb_p)
{
	unsigned char blob_a[1024], blob_b[1024];
	size_t la = sizeof(blob_a), lb = sizeof(blob_b);
	int rc = tfab_peer_create(a, pa_p);

	if (rc == 0)
		rc = tfab_peer_create(b, pb_p);
	if (rc == 0)
		rc = tfab_peer_blob(*pa_p, blob_a, &la);
	if (rc == 0)
		rc = tfab_peer_blob(*pb_p, blob_b, &lb);
	if (rc == 0)
		rc = tfab_peer_connect(*pa_p, blob_b, lb);
	if (rc == 0)
		rc = tfab_peer_connect(*pb_p, blob_a, la);
	return rc;
}

int main(int argc, char **argv)
{
	struct tfab_context *a = NULL, *b = NULL;
	struct tfab_peer *pa = NULL, *pb = NULL;
	long calls = argc > 1 ? atol(argv[1]) : 1000000;
	struct timespec t0, t1;
	int rc;

	if (calls < 1) {
		fprintf(stderr, "usage: progress-idle [CALLS]\n");
		return 2;
	}
	setenv("TFAB_PROVIDER", "shm", 0);
	rc = tfab_context_create(&a);
	if (rc == 0)
		rc = tfab_context_create(&b);
	if (rc == 0)
		rc = pair(a, b, &pa, &pb);
	if (rc) {
		fprintf(stderr, "progress-idle: %s\n", tfab_strerror(rc));
		return 1;
	}
	for (int i = 0; i < 1000; i++) { /* the connection's own traffic settles */
		tfab_progress(a);
		tfab_progress(b);
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long i = 0; i < calls; i++)
		tfab_progress(a);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("{\"test\":\"progress_idle\",\"path\":\"%s\",\"calls\":%ld,\"ns_per_call\":%.1f}\n",
	       tfab_peer_path(pa), calls,
	       ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) /
		   (double)calls);
	tfab_peer_destroy(pa);
	tfab_peer_destroy(pb);
	tfab_context_destroy(a);
	tfab_context_destroy(b);
	return 0;
}
