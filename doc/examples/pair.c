/*
 * Two processes: a sender offers a 3x4 float tensor; a receiver takes it and checks it.
 *   pair send PORT        listens on PORT (0: any free port) and prints the port
 *   pair recv HOST PORT   connects to the sender and receives
 * Build: cc pair.c $(pkg-config --cflags --libs tfab). Exits 1 on any failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tfab/tfab.h>

#define TIMEOUT_MS 10000 /* every wait below gives up after this long */

/* Runs from progress (here: inside tfab_flush) once the receiver has the tensor. */
static void sent(void *arg, int status)
{
	*(int *)arg = status;
}

static int sender(struct tfab_context *ctx, uint16_t port)
{
	float weights[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
	int64_t shape[2] = {3, 4};
	DLTensor t = {.data = weights,
		      .device = {kDLCPU, 0},
		      .ndim = 2,
		      .dtype = {kDLFloat, 32, 1},
		      .shape = shape};
	struct tfab_peer *peer;
	int status = 1, rc = tfab_listen(ctx, NULL, port, &port);

	if (rc)
		return rc;
	printf("listening on port %u\n", port);
	fflush(stdout); /* a script may be waiting for that line */
	rc = tfab_accept(ctx, TIMEOUT_MS, &peer);
	/* Returns at once: weights is read in place, and must stay as it is until sent() runs. */
	if (rc == 0)
		rc = tfab_send(ctx, "weights", 1, &t, false, sent, &status);
	if (rc == 0)
		rc = tfab_flush(ctx, TIMEOUT_MS); /* every send so far taken, or failed */
	return rc ? rc : status;
}

static int receiver(struct tfab_context *ctx, const char *host, uint16_t port)
{
	struct tfab_peer *peer;
	DLManagedTensor *got;
	int rc = tfab_connect(ctx, host, port, TIMEOUT_MS, &peer);

	/* dest NULL: the tensor lands in the library's registered memory, no copy. */
	if (rc == 0)
		rc = tfab_recv_sync(ctx, peer, "weights", 1, NULL, TIMEOUT_MS, &got, NULL);
	if (rc)
		return rc;
	const DLTensor *t = &got->dl_tensor;
	int bad = t->ndim != 2 || t->shape[0] != 3 || t->shape[1] != 4;

	for (int i = 0; !bad && i < 12; i++)
		bad = ((const float *)t->data)[i] != (float)i;
	printf("receiver: 3x4 floats over %s, %s\n", tfab_peer_path(peer),
	       bad ? "WRONG" : "as sent");
	got->deleter(got); /* the tensor is ours until we free it */
	return bad;
}

int main(int argc, char **argv)
{
	struct tfab_context *ctx = NULL;
	int rc, is_sender = argc == 3 && strcmp(argv[1], "send") == 0;

	if (!is_sender && !(argc == 4 && strcmp(argv[1], "recv") == 0)) {
		fprintf(stderr, "usage: %s send PORT | recv HOST PORT\n", argv[0]);
		return 2;
	}
	rc = tfab_context_create(&ctx); /* TFAB_PROVIDER chooses the fabric (default: auto) */
	if (rc == 0)
		rc = is_sender ? sender(ctx, (uint16_t)atoi(argv[2]))
			       : receiver(ctx, argv[2], (uint16_t)atoi(argv[3]));
	if (rc < 0)
		fprintf(stderr, "pair %s: %s\n", argv[1], tfab_strerror(rc));
	tfab_context_destroy(ctx); /* closes the peer too */
	return rc ? 1 : 0;
}
