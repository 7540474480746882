/*
 * A world: N ranks of one job, each pair connected by a peer on its best path (doc/world.md).
 * The ranks meet through rank 0 over TCP (a torchrun-style environment: TFAB_RANK,
 * TFAB_WORLD_SIZE, TFAB_MASTER_ADDR, TFAB_MASTER_PORT) or through the application's own
 * allgather; then every rank connects to every lower rank with the context's TCP bootstrap, so
 * each pair has its heartbeats and its liveness as any bootstrapped pair does.
 */
#ifndef TFAB_WORLD_H
#define TFAB_WORLD_H

#include <stddef.h>

#include <tfab/engine.h>
#include <tfab/export.h>

#ifdef __cplusplus
extern "C" {
#endif

struct tfab_world;

/* The longest rank name, in bytes without the terminator. */
#define TFAB_WORLD_NAME_MAX 255

/*
 * The application's allgather: each rank's len bytes at mine go, in rank order, to all (size x
 * len bytes), on every rank. 0, or a negative status that fails the join.
 */
typedef int (*tfab_allgather_fn)(const void *mine, void *all, size_t len, void *arg);

struct tfab_world_args {
	/* This rank and the number of ranks; -1: from TFAB_RANK and TFAB_WORLD_SIZE. */
	int rank, size;
	/* This rank's name ("/job:worker/task:3"); NULL: TFAB_WORLD_NAME, else "rank N". */
	const char *name;
	/*
	 * The address the other ranks reach this one at; NULL: TFAB_WORLD_HOST, else the address
	 * rank 0 saw this rank's rendezvous come from (with allgather: this host's name).
	 */
	const char *host;
	/* The whole join's bound; < 0: TFAB_WORLD_TIMEOUT_MS. */
	int timeout_ms;
	/* Set: the ranks meet through it, not through rank 0. */
	tfab_allgather_fn allgather;
	void *allgather_arg;
};

/*
 * Joins the world: returns when every rank is connected to every other, or fails them all
 * with -TFAB_ERR_TIMEOUT (a rank that did not arrive; the log names it), -TFAB_ERR_PROTOCOL (a
 * rank that arrived twice, or with another size), -TFAB_ERR_CONFIG (no rank or size given, or
 * a bad one), or the status of the connection that failed. args NULL: all from the
 * environment. The context listens for the world's connections: a context has one world, and
 * the application does not tfab_listen on it.
 */
TFAB_EXPORT int tfab_world_join(struct tfab_context *ctx, const struct tfab_world_args *args,
				struct tfab_world **world_p);
TFAB_EXPORT int tfab_world_rank(const struct tfab_world *w);
TFAB_EXPORT int tfab_world_size(const struct tfab_world *w);
/* The name rank gave, or NULL for a rank out of range. */
TFAB_EXPORT const char *tfab_world_name(const struct tfab_world *w, int rank);
/* The peer that connects this rank to rank; NULL for this rank or one out of range. */
TFAB_EXPORT struct tfab_peer *tfab_world_peer(struct tfab_world *w, int rank);
/* Destroys the world's peers (their pending operations fail, -TFAB_ERR_ABORTED) and frees it. */
TFAB_EXPORT int tfab_world_leave(struct tfab_world *w);

#ifdef __cplusplus
}
#endif

#endif
