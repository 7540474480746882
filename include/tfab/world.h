/**
 * @file
 * A world: N ranks of one job, each pair connected by a peer on its best path (doc/world.md).
 * The ranks meet through rank 0 over TCP (a torchrun-style environment: TFAB_RANK,
 * TFAB_WORLD_SIZE, TFAB_MASTER_ADDR, TFAB_MASTER_PORT, or the launchers' RANK, WORLD_SIZE,
 * MASTER_ADDR, OMPI_COMM_WORLD_*; never torch's MASTER_PORT) or through the application's own
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

/** The longest rank name, in bytes without the terminator. */
#define TFAB_WORLD_NAME_MAX 255

/**
 * The application's allgather: each rank's len bytes at mine go, in rank order, to all (size x
 * len bytes), on every rank. 0, or a negative status that fails the join.
 */
typedef int (*tfab_allgather_fn)(const void *mine, void *all, size_t len, void *arg);

/** How tfab_world_join joins: what a field leaves unset comes from the environment. */
struct tfab_world_args {
	/** This rank; -1: from TFAB_RANK (or RANK, OMPI_COMM_WORLD_RANK). */
	int rank;
	/** The number of ranks; -1: from TFAB_WORLD_SIZE (or WORLD_SIZE, OMPI_COMM_WORLD_SIZE). */
	int size;
	/** This rank's name ("/job:worker/task:3"); NULL: TFAB_WORLD_NAME, else "rank N". */
	const char *name;
	/**
	 * The address the other ranks reach this one at; NULL: TFAB_WORLD_HOST, else the address
	 * rank 0 saw this rank's rendezvous come from (with allgather: this host's name).
	 */
	const char *host;
	/** The whole join's bound; < 0: TFAB_WORLD_TIMEOUT_MS. */
	int timeout_ms;
	/** Set: the ranks meet through it, not through rank 0. */
	tfab_allgather_fn allgather;
	/** The last argument of every call of allgather. */
	void *allgather_arg;
};

/**
 * Joins the world: returns when every rank is connected to every other, or fails them all
 * with -TFAB_ERR_TIMEOUT (a rank that did not arrive; the log names it), -TFAB_ERR_PROTOCOL (a
 * rank that arrived twice, or with another size), -TFAB_ERR_CONFIG (no rank or size given, or
 * a bad one; or, without an allgather, MASTER_PORT set and TFAB_MASTER_PORT not: torch's
 * store listens there), or the status of the connection that failed. args NULL: all from the
 * environment. The context listens for the world's connections: a context has one world, and
 * the application does not tfab_listen on it. A signal does not end the join (-EINTR is never
 * returned: interrupted system calls are retried); a caller that must react to signals runs it
 * on another thread.
 */
TFAB_EXPORT int tfab_world_join(struct tfab_context *ctx, const struct tfab_world_args *args,
				struct tfab_world **world_p);
/** This rank, from 0. */
TFAB_EXPORT int tfab_world_rank(const struct tfab_world *w);
/** The number of ranks. */
TFAB_EXPORT int tfab_world_size(const struct tfab_world *w);
/** The name rank gave, or NULL for a rank out of range. */
TFAB_EXPORT const char *tfab_world_name(const struct tfab_world *w, int rank);
/** The peer that connects this rank to rank; NULL for this rank or one out of range. */
TFAB_EXPORT struct tfab_peer *tfab_world_peer(struct tfab_world *w, int rank);
/**
 * Destroys the world's peers (their pending operations fail, -TFAB_ERR_ABORTED) and frees it;
 * -EBUSY (nothing done) while a collective of the world has not called back.
 */
TFAB_EXPORT int tfab_world_leave(struct tfab_world *w);
/**
 * The ranks whose peers have failed, in the order this rank learned of their failures: the
 * first n of them in ranks, and how many there are. So the rank that died is told from those
 * that failed after it, whichever their numbers: a rank that gave up on a collective with
 * this one and left (tfab_peer_left() tells those) may come before this rank's own verdict
 * on the dead one, but never before a verdict already given. Ranks already failed when the
 * join ended come first, in rank order. -EOPNOTSUPP for a context's second world (the
 * engine reports failures to the first only), -EINVAL.
 */
TFAB_EXPORT int tfab_world_failed(struct tfab_world *w, int *ranks, int n);

/**
 * @name Collectives
 * Collectives (doc/world.md). Each returns at once; cb(arg, status) runs from progress (any
 * thread that drives it, as the engine's callbacks do) once the collective ended on this rank
 * and none of its tensors is read or written by the library any more. Several may be in
 * flight and complete out of order; every rank starts the same collectives in the same order,
 * with the same dtype, count and options (the order numbers them). A rank that fails, dies or
 * stops makes the collective fail on the others too: with its status where it can tell them,
 * -TFAB_ERR_PEER_FAILED for a failure passed on by a neighbour, within TFAB_OP_TIMEOUT_MS at
 * worst. Tensors are compact, on the CPU or a CUDA GPU: a GPU tensor goes through a pinned host
 * proxy (its input copied there at the call, its result copied back before cb; the copies
 * follow the work queued on the legacy default stream, other streams are the caller's to
 * synchronize). A call that returns an error never calls cb.
 * @{
 */

/** A collective's callback: status 0 once it ended well on this rank, or why it failed. */
typedef void (*tfab_coll_cb)(void *arg, int status);

/**
 * A reduction's operation. Integer sums and products wrap (the low bits of the exact result,
 * as torch's and gloo's); new operations come at the end, so that the values stay.
 */
enum tfab_op {
	TFAB_OP_SUM,  /**< the sum */
	TFAB_OP_AVG,  /**< the sum divided by the world's size (integers: toward zero) */
	TFAB_OP_MIN,  /**< the smallest */
	TFAB_OP_MAX,  /**< the largest */
	TFAB_OP_PROD, /**< the product */
};

/** Compression of an fp32 allreduce's traffic (doc/world.md, "Compression"). */
enum tfab_compress {
	TFAB_COMPRESS_NONE, /**< fp32 values travel as they are */
	TFAB_COMPRESS_FP16, /**< as IEEE half-precision values */
	TFAB_COMPRESS_BF16, /**< as bfloat16 values */
	TFAB_COMPRESS_INT8, /**< int8 with one fp32 scale per 4096 values */
};

/** How an allreduce moves its data; AUTO chooses by size (TFAB_ALLREDUCE_SMALL). */
enum tfab_coll_algo {
	TFAB_ALGO_AUTO,	  /**< by size, count and ranks: RING, DIRECT, or DOUBLING from 16 ranks */
	TFAB_ALGO_DIRECT, /**< every rank sends all to every rank, each reduces in rank order */
	TFAB_ALGO_RING,	  /**< reduce-scatter, then allgather, around the ring of ranks */
	TFAB_ALGO_DOUBLING, /**< recursive doubling: log2(N) steps, each with one partner */
};

/** A collective's options (tfab_allreduce's; NULL: all zero). */
struct tfab_coll_opts {
	enum tfab_coll_algo algo;    /**< how the data moves */
	enum tfab_compress compress; /**< what its traffic is compressed to */
	/**
	 * With compression: the name of the tensor, under which this rank keeps what rounding
	 * lost and adds it to the tensor's next allreduce (error feedback); NULL: no feedback.
	 */
	const char *key;
};

/**
 * out = in[rank 0] op in[rank 1] op ...: same dtype (fp32, fp64, fp16, bf16, and integers of
 * 8, 16, 32 and 64 bits, signed or not) and element count on every rank; in == out reduces in
 * place. opts may be NULL.
 */
TFAB_EXPORT int tfab_allreduce(struct tfab_world *w, const DLTensor *in, DLTensor *out,
			       enum tfab_op op, const struct tfab_coll_opts *opts, tfab_coll_cb cb,
			       void *arg);
/** t of rank root to every rank's t (same dtype and size everywhere; any dtype). */
TFAB_EXPORT int tfab_broadcast(struct tfab_world *w, DLTensor *t, int root, tfab_coll_cb cb,
			       void *arg);
/** out = every rank's in, in rank order: out holds size times in's bytes (any dtype). */
TFAB_EXPORT int tfab_allgather(struct tfab_world *w, const DLTensor *in, DLTensor *out,
			       tfab_coll_cb cb, void *arg);
/**
 * out = part `rank` of the reduction of every rank's in, in holding size parts of out's
 * element count each.
 */
TFAB_EXPORT int tfab_reduce_scatter(struct tfab_world *w, const DLTensor *in, DLTensor *out,
				    enum tfab_op op, tfab_coll_cb cb, void *arg);
/**
 * out on rank root = in[rank 0] op in[rank 1] op ..., folded in rank order as a direct
 * allreduce folds (the same bits): every other rank sends its in to root. Same dtype (those
 * tfab_allreduce takes) and element count on every rank; out is root's only (same dtype and
 * size as in; in == out reduces in place), and ignored, NULL or not, on the other ranks.
 */
TFAB_EXPORT int tfab_reduce(struct tfab_world *w, const DLTensor *in, DLTensor *out,
			    enum tfab_op op, int root, tfab_coll_cb cb, void *arg);
/**
 * out on rank root = every rank's in, in rank order (size times in's bytes, of in's dtype);
 * any dtype, the same size on every rank. out is ignored, NULL or not, on the other ranks;
 * root's in may be its own place in out.
 */
TFAB_EXPORT int tfab_gather(struct tfab_world *w, const DLTensor *in, DLTensor *out, int root,
			    tfab_coll_cb cb, void *arg);
/**
 * out on rank r = part r of root's in, which holds size parts of out's bytes, in rank order;
 * any dtype, the same size of out on every rank. in is ignored, NULL or not, on the other
 * ranks; root's out may be its own place in in.
 */
TFAB_EXPORT int tfab_scatter(struct tfab_world *w, const DLTensor *in, DLTensor *out, int root,
			     tfab_coll_cb cb, void *arg);
/**
 * All to all: in holds this rank's pieces for ranks 0 .. size-1 in rank order, send_counts[k]
 * elements for rank k; out gets rank k's piece for this rank, recv_counts[k] elements, in rank
 * order (counts: size entries each, adding up to in's and out's element counts; NULL: equal
 * pieces). Rank i's send_counts[j] must be rank j's recv_counts[i] and every rank's dtype one
 * (any dtype): where they differ, both ranks of the pair fail the collective with -EINVAL
 * (the log says what differs) and nothing lands in out from the other. in and out do not
 * overlap. Each pair trades its counts first, then its pieces, directly.
 */
TFAB_EXPORT int tfab_alltoallv(struct tfab_world *w, const DLTensor *in, const size_t *send_counts,
			       DLTensor *out, const size_t *recv_counts, tfab_coll_cb cb,
			       void *arg);
/** Calls back once every rank has called it (an allreduce of one int32). */
TFAB_EXPORT int tfab_barrier(struct tfab_world *w, tfab_coll_cb cb, void *arg);
/**
 * Drives progress (unless the progress thread does) until every collective of the world
 * started before the call has called back: 0, or -ETIMEDOUT after timeout_ms (< 0: no
 * bound). Not from a callback of the world's context (-EDEADLK). A signal does not end the
 * wait (-EINTR is never returned): a caller that must react to signals calls it with short
 * timeouts, again until it returns 0.
 */
TFAB_EXPORT int tfab_world_wait(struct tfab_world *w, int timeout_ms);
/** @} */

#ifdef __cplusplus
}
#endif

#endif
