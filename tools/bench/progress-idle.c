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

/* Contexts c[0] and c[1], each with a peer p[i] connected to the other's through their blobs. */
static int pair(struct tfab_context *c[2], struct tfab_peer *p[2])
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
	rc = pair(c, p);
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
