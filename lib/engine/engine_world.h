/*
 * The engine as the world layer sees it: everything of the protocol engine that the world
 * and its collectives (lib/world/) use, and nothing more. lib/world/ includes this header and
 * no other of lib/engine/; the headers it brings in are the engine's small ones that the
 * world needs whole: the bootstrap handshakes (handshake.h), which the world's meeting at
 * rank 0 runs; the registered pool (pool.h), whose blocks hold operands; and the wire format
 * (wire.h), for the COLL_DATA messages that carry eager operands.
 *
 * The context and its peers are opaque here. The world holds pointers to them and passes
 * them back, and reads or changes what it needs through the functions below; it never
 * touches their fields (engine.h), and it calls nothing else of the engine but the public
 * API (tfab/engine.h). Its only state inside the context is struct tfab_coll_counts.
 *
 * The engine, in turn, knows nothing of worlds: it calls the collectives only through the
 * hooks they install (struct tfab_coll_hooks), and reads only the counters they keep.
 *
 * engine.h includes this header, so that the engine's definitions are checked against these
 * declarations.
 */
#ifndef TFAB_ENGINE_ENGINE_WORLD_H
#define TFAB_ENGINE_ENGINE_WORLD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <tfab/engine.h>
#include <tfab/strings.h>

#include "engine/handshake.h"
#include "engine/pool.h"
#include "engine/wire.h"
#include "util/config.h"

struct tfab_context;
struct tfab_peer;
struct tfab_cuda;

/*
 * The world's collectives (lib/world/coll.c), which the engine tells what concerns their
 * eager operands (COLL_DATA messages). The first three run under the context's lock, which
 * they keep: they record what happened and say whether the collectives have work to do
 * (true), which `kick` then does, outside the lock, on the thread that delivers callbacks
 * (tfab__ctx_unlock).
 */
struct tfab_coll_hooks {
	/* A COLL_DATA from peer: 1 (work), 0, or < 0 to refuse the peer (a protocol error). */
	int (*on_data)(void *arg, struct tfab_peer *peer, const struct tfab_wire_msg *m);
	/* peer failed with status, or (peer NULL) the context aborted with it */
	bool (*on_fail)(void *arg, struct tfab_peer *peer, int status);
	bool (*on_tick)(void *arg, uint64_t now_ms); /* the stall deadline's check */
	void (*kick)(void *arg);
};

/*
 * Counters that the collectives keep in the context, and that the engine reads without its
 * lock. polls: collectives that wait on the world's segments (lib/world/coll.c, fast_poll);
 * while there are some, every progress call kicks the collectives. shm, shm_bytes: the
 * allreduces done through the segments, and their operands' bytes (tfab_stats.coll_shm;
 * the bytes count in coll_bytes_wire and coll_bytes_logical).
 */
struct tfab_coll_counts {
	_Atomic unsigned polls;
	_Atomic uint64_t shm, shm_bytes;
};

/* context.c */
void tfab__ctx_lock(struct tfab_context *ctx);
/* Drops the lock, then runs every callback that became due, unless another thread does. */
void tfab__ctx_unlock(struct tfab_context *ctx);
/* 0, or the status of the tfab_abort that ended the context; safe without the lock. */
int tfab__ctx_aborted(struct tfab_context *ctx);
/* The settings read when the context was made: fixed for its life, read without the lock. */
const struct tfab_config *tfab__ctx_config(const struct tfab_context *ctx);
/* Its counters, which the caller adds to with the lock held. */
struct tfab_stats *tfab__ctx_stats(struct tfab_context *ctx);
/* Its pool of registered blocks (pool.h): taken and pinned under the lock. */
struct tfab_pool *tfab__ctx_pool(struct tfab_context *ctx);
/* Its copier for GPU tensors: NULL until tfab__check_gpu opened it (lock held). */
struct tfab_cuda *tfab__ctx_cuda(struct tfab_context *ctx);
/* The collectives' counters in it, the same for its whole life. */
struct tfab_coll_counts *tfab__ctx_coll_counts(struct tfab_context *ctx);
/*
 * Whether a wait for callbacks may block this thread: -EDEADLK on the thread that runs them
 * (what it waits for would run after them), else 0, with *thread_p whether a progress thread
 * drives the context (else the waiter calls tfab_progress). Takes the lock.
 */
int tfab__ctx_may_wait(struct tfab_context *ctx, bool *thread_p);
/*
 * Install (hooks) or remove (NULL) the collectives' hooks; removing waits for a kick running
 * on another thread to end.
 */
void tfab__ctx_set_coll(struct tfab_context *ctx, const struct tfab_coll_hooks *hooks, void *arg);
/* Whether some world's collectives have the hooks. Takes the lock. */
bool tfab__ctx_coll_taken(struct tfab_context *ctx);

/* peer.c */
/* 0, or the status the peer's operations fail with (lock held). */
int tfab__peer_failed(const struct tfab_peer *peer);
/* Write m to the peer now, or queue it behind what waits for credit (lock held). */
int tfab__peer_send_msg(struct tfab_peer *peer, const struct tfab_wire_msg *m);
/*
 * Writes what waits for credit, TAKEN messages and credit returns. hold_new: TAKEN messages
 * for receives this progress call completed wait for the next flush (progress's own: the
 * application's writes after its callbacks go first).
 */
bool tfab__peers_flush(struct tfab_context *ctx, bool hold_new); /* nothing left waiting */

/* recv.c */
/* What a receive is: a DLPack one (into dest, or the pool) with cb, or a string tensor's. */
struct tfab_recv_args {
	DLTensor *dest; /* the caller's destination, or NULL for a pool tensor */
	/*
	 * With dest NULL: the dtype and shape the pool tensor will have (its data unused), asked
	 * for at once, with no META_DATA round trip where the key's meta-data is not cached
	 * (the collectives, lib/world/coll.c, whose keys serve tensors of every size).
	 */
	const DLTensor *like;
	unsigned flags;		  /* TFAB_RECV_* */
	bool strings;		  /* a string tensor's receive: scb, no dest */
	tfab_recv_cb cb;	  /* NULL for a blocking receive */
	tfab_recv_strings_cb scb; /* likewise */
	void *arg;
};
/* Post a receive. */
int tfab__recv_post(struct tfab_context *ctx, struct tfab_peer *peer, const char *key, int64_t step,
		    const struct tfab_recv_args *a);

/* send.c */
/* tfab__send_start's flags */
enum {
	TFAB_SEND_DATA_POOL = 1, /* data is a pool block that the send owns from here on, even
				  * when this fails (registered on the path of the peer that takes
				  * it) */
	TFAB_SEND_GPU = 2,	 /* data is on the GPU: through a host proxy */
	/*
	 * The wait for the receiver's request is bounded by TFAB_OP_TIMEOUT_MS, from when the
	 * send began to wait (its posting, a META_DATA reply, a re-offer): a collective's send,
	 * whose receiver posts the receive once the collective reaches it, or has given up on
	 * the collective; an application's send waits for its receive as long as the step lives.
	 */
	TFAB_SEND_BOUNDED = 4,
};
/* tfab_send_to with tfab__send_start's flags (TFAB_SEND_BOUNDED). */
int tfab__send_to(struct tfab_context *ctx, struct tfab_peer *peer, const char *key, int64_t step,
		  const DLTensor *t, bool is_dead, unsigned flags, tfab_send_cb cb, void *arg);

/* tensor.c */
int tfab__meta_from_dltensor(const DLTensor *t, bool is_dead, struct tfab_wire_meta *meta,
			     void **data_p);
/*
 * A tensor in CUDA device memory. check (engine lock held) opens the copier at the first one,
 * and returns -EOPNOTSUPP (logged) when the context cannot copy it.
 */
static inline bool tfab__on_gpu(const DLTensor *t)
{
	return t && t->device.device_type == kDLCUDA;
}
int tfab__check_gpu(struct tfab_context *ctx, const DLTensor *t);

#endif
