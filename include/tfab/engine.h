/**
 * @file
 * The tensor rendezvous: contexts, peers, sends and receives of DLPack tensors by key and
 * step id, with zero copies on the DMAable path.
 *
 * Threads: every function here is thread-safe. Callbacks run without any tfab lock held, so
 * they may call back into tfab, on a thread that calls into the context (mostly the one that
 * drives progress: tfab_progress, or the progress thread when TFAB_PROGRESS_THREAD is set).
 * A context's callbacks never run at the same time: one thread at a time runs them, in turn,
 * so state they share needs no lock among them. A callback that blocks holds up the other
 * callbacks of its context (not progress, nor blocking receives, which need no callback).
 */
#ifndef TFAB_ENGINE_H
#define TFAB_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>
#include <tfab/export.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Longest key, in bytes, not counting the terminating NUL. */
#define TFAB_MAX_KEY_LEN 512

/** Room for any name tfab_dtype_name writes, with its NUL. */
#define TFAB_DTYPE_NAME_MAX 48

/**
 * A dtype as users write it, into buf (len bytes, TFAB_DTYPE_NAME_MAX always suffices): int8,
 * uint16, float16, bfloat16, float32, complex64, bool, with lanes as a suffix (float32x4). A
 * code DLPack does not name reads "DLPack type code 7, 8 bits". Returns buf. Thread-safe.
 */
TFAB_EXPORT const char *tfab_dtype_name(DLDataType dtype, char *buf, size_t len);

struct tfab_context;
struct tfab_peer;

/**
 * A context per process: reads the TFAB_* settings, opens the selected fabric. Returns 0,
 * -TFAB_ERR_CONFIG or -TFAB_ERR_NO_FABRIC (the log says which choices exist), or -ENOMEM.
 */
TFAB_EXPORT int tfab_context_create(struct tfab_context **ctx_p);

/**
 * The same, with n settings given explicitly (names[i] such as "TFAB_PROVIDER", values[i] as
 * text, as the environment would give them) that win over the environment; the rest come from
 * the environment and the defaults. An unknown name or a bad value is -TFAB_ERR_CONFIG (the
 * log says which). For bindings and programs that hold several differently configured
 * contexts; the environment is left untouched. TFAB_LOG_LEVEL stays the process's (it is
 * read from the environment by the logger).
 */
TFAB_EXPORT int tfab_context_create_with(struct tfab_context **ctx_p, const char *const *names,
					 const char *const *values, size_t n);

/**
 * Aborts whatever is pending (callbacks get -TFAB_ERR_ABORTED), closes every peer and frees the
 * context. -EBUSY (and nothing done) while tensors the library allocated are still held by the
 * application: the receives completed before the call reach their callbacks first (those
 * another thread is running are waited for, up to 1 s), so that a tensor a callback dropped is
 * not counted. NULL is accepted.
 */
TFAB_EXPORT int tfab_context_destroy(struct tfab_context *ctx);

/** Drive progress: returns how many events were handled (0 if none), or a negative status. */
TFAB_EXPORT int tfab_progress(struct tfab_context *ctx);

/**
 * @name The TCP bootstrap
 * Peers through the built-in TCP bootstrap (no external service needed).
 * @{
 */

/**
 * Listen for peers on host (NULL: any) and port (0: any); the bound port goes to *port_p. A
 * second call replaces the listener (after a tfab_accept running in another thread returns).
 */
TFAB_EXPORT int tfab_listen(struct tfab_context *ctx, const char *host, uint16_t port,
			    uint16_t *port_p);
/**
 * Accept one peer that called tfab_connect, within timeout_ms: 0 and the peer, or -ETIMEDOUT.
 * Every connection's handshake runs at once, each bounded by TFAB_HANDSHAKE_TIMEOUT_MS: one
 * that is silent, sends garbage or holds another TFAB_AUTH_KEY is refused (a warning names its
 * address and why) and delays no other, and the call goes on. Handshakes still running when
 * it returns go on at the next call (and end by their deadline meanwhile). A signal does not
 * end the wait: an interrupted system call is retried, and -EINTR is never returned; a caller
 * that must react to signals runs it on another thread. tfab_abort from another thread ends
 * the wait within 100 ms, with the abort's status.
 */
TFAB_EXPORT int tfab_accept(struct tfab_context *ctx, int timeout_ms, struct tfab_peer **peer_p);
/**
 * Connect to a listening context at host:port, within timeout_ms (refused connections are
 * retried until then). Fails with -ENXIO for a host that does not resolve, -ECONNREFUSED when
 * nothing listens there by then, -TFAB_ERR_PROTOCOL when the other end is no tfab peer,
 * -TFAB_ERR_AUTH when one side refused the other's key, -ETIMEDOUT; the log says which, with
 * the address. Signals as tfab_accept.
 */
TFAB_EXPORT int tfab_connect(struct tfab_context *ctx, const char *host, uint16_t port,
			     int timeout_ms, struct tfab_peer **peer_p);
/** @} */

/**
 * @name Peers from blobs
 * Peers from blobs the application moves by its own means (MPI, a key-value store): each side
 * creates a peer, sends tfab_peer_blob() to the other, and passes what it receives to
 * tfab_peer_connect().
 * @{
 */

/** A new peer of ctx, not yet connected, in *peer_p. */
TFAB_EXPORT int tfab_peer_create(struct tfab_context *ctx, struct tfab_peer **peer_p);
/** The longest blob tfab_peer_blob writes (the blob of every path this context opened). */
#define TFAB_PEER_BLOB_MAX 4608
/** *len_p in: capacity; out: bytes. -ENOSPC when buf is too small. */
TFAB_EXPORT int tfab_peer_blob(struct tfab_peer *peer, void *buf, size_t *len_p);
/**
 * Connect peer with the blob (len bytes) that the other side's tfab_peer_blob wrote.
 * -EISCONN when peer is connected already. A blob that is malformed, of another protocol
 * version, or that offers no path this context has fails, and the log says why.
 */
TFAB_EXPORT int tfab_peer_connect(struct tfab_peer *peer, const void *blob, size_t len);
/** @} */

/**
 * The path a connected peer is on ("shm", "verbs", "ofi:tcp"): the first in TFAB_PROVIDER's
 * order that both sides have and that reaches between them; NULL before it is connected.
 */
TFAB_EXPORT const char *tfab_peer_path(const struct tfab_peer *peer);
/** Its path's backend, fabric and domain ("ofi", "tcp;ofi_rxm", "lo"); -ENOTCONN before. */
TFAB_EXPORT int tfab_peer_fabric(const struct tfab_peer *peer, const char **backend_p,
				 const char **fabric_p, const char **domain_p);
/**
 * 0 while the peer works; once it has failed, the status its operations fail with, such as
 * -TFAB_ERR_PEER_FAILED (it left or died) or -TFAB_ERR_TIMEOUT (silent past the stall
 * deadline: stopped, or cut off). Found by progress: this call drives none.
 */
TFAB_EXPORT int tfab_peer_status(struct tfab_peer *peer);
/**
 * 1 where the peer said that it leaves: its process destroyed it (tfab_peer_destroy, or its
 * world's leave or its context's destroy, which say so on the bootstrap connection first), 0
 * where it did not (it works, or it died, stopped or was cut off), or -EINVAL. So of the
 * peers that failed, those that left after a failure of their own (a rank that gave up on
 * a collective) are told apart from the one that died. Peers made from blobs have no
 * bootstrap connection: 1 only where their LEAVE came (doc/protocol.md).
 */
TFAB_EXPORT int tfab_peer_left(struct tfab_peer *peer);
/**
 * Fails the peer's pending operations with -TFAB_ERR_ABORTED and frees it. It may wait, up to
 * 2 s each, for the peer to read what we owe it and for our writes to it to end, but no
 * longer than 100 ms without either moving: a stopped peer costs about 200 ms. The context's
 * other threads go on meanwhile, and whatever they post for this peer then fails with it.
 */
TFAB_EXPORT int tfab_peer_destroy(struct tfab_peer *peer);

/**
 * @name Sends and receives
 * Keys and steps, in every send and receive below: a key is 1 to TFAB_MAX_KEY_LEN bytes, and a
 * step id is 0 or more. A negative step id is refused with -EINVAL and the message "step -1 is
 * negative: steps are >= 0": the world's collectives number their own steps from INT64_MIN up
 * (doc/world.md), so that they never meet the application's.
 * @{
 */

/** A send's callback: status 0 once a receive took the tensor, or why the send failed. */
typedef void (*tfab_send_cb)(void *arg, int status);

/**
 * Producer. Offers tensor t under (key, step_id); returns at once. The first receive of that
 * key and step, from any peer, takes it. t->data stays the caller's and must stay valid and
 * unchanged until cb reports that a receive took the tensor (status 0: the reader has it
 * whole), or that the send failed (-TFAB_ERR_ABORTED after an abort or a step cleanup,
 * -TFAB_ERR_PEER_FAILED when the peer it was being written to failed, ...). A receive that
 * gave up (a timeout, a cleanup) never takes it: the tensor stays for a later receive. A dead
 * tensor (is_dead) carries meta-data only. The tensor must be compact row-major on the CPU or
 * in CUDA host or device memory. One (key, step) is offered once to any peer, or once to each
 * of several peers (tfab_send_to): an overlapping send fails with -EEXIST. A call that returns
 * an error never calls cb.
 */
TFAB_EXPORT int tfab_send(struct tfab_context *ctx, const char *key, int64_t step_id,
			  const DLTensor *t, bool is_dead, tfab_send_cb cb, void *arg);

/**
 * The same, for peer's receives alone: other peers' requests for (key, step) wait for a send
 * of their own. One key can so feed several consumers, a tensor each. The send fails with the
 * peer's status if that peer fails or is destroyed first.
 */
TFAB_EXPORT int tfab_send_to(struct tfab_context *ctx, struct tfab_peer *peer, const char *key,
			     int64_t step_id, const DLTensor *t, bool is_dead, tfab_send_cb cb,
			     void *arg);

/**
 * Waits, at most timeout_ms (driving progress itself unless the progress thread does), until
 * every send posted before the call has ended (taken, or failed) and none of them is read by
 * the library any more: then a producer may free its tensors and leave. 0, or -ETIMEDOUT.
 * Their callbacks have been queued; they run before this returns unless another thread is
 * running the context's callbacks. Not from a send callback of this context (-EDEADLK).
 * A signal does not end the wait (-EINTR is never returned): a caller that must react to
 * signals calls it with short timeouts, again until it returns 0.
 */
TFAB_EXPORT int tfab_flush(struct tfab_context *ctx, int timeout_ms);

/**
 * A receive's callback: the status, the tensor received (NULL on failure and for a dead
 * tensor) and is_dead, as tfab_recv says.
 */
typedef void (*tfab_recv_cb)(void *arg, int status, DLManagedTensor *tensor, bool is_dead);

/**
 * Consumer: an asynchronous receive of (key, step_id) from peer, posted before or after the
 * matching send. cb gets the status, the tensor received, and is_dead; the tensor is NULL on
 * failure and for a dead tensor, and otherwise the application's, to release with its deleter:
 * - with dest NULL, a tensor the library allocated from its registered pool;
 * - with dest, the content is written straight into dest, which must stay valid until cb and
 *   have the sender's dtype and shape (-EINVAL otherwise; see tfab_recv_into for any shape
 *   that fits); the tensor is a view of dest (its data) saying what landed there, and its
 *   deleter frees the view alone.
 * A receive that fails (a wrong destination, a timeout, a cleanup) never takes the send: the
 * tensor stays for a later receive. One into dest that gives up once its request is out gets
 * its cb when the sender has read the cancel (at the sender's next progress call), or the
 * peer failed, or TFAB_OP_TIMEOUT_MS passed (dest's registration is then revoked): until then
 * the sender may still be writing into dest, and it stays the library's.
 */
TFAB_EXPORT int tfab_recv(struct tfab_context *ctx, struct tfab_peer *peer, const char *key,
			  int64_t step_id, DLTensor *dest, tfab_recv_cb cb, void *arg);

/** Flags of tfab_recv_into and tfab_recv_into_sync. */
enum {
	/**
	 * Accept a tensor of dest's dtype and any shape whose content fits dest's bytes, not
	 * only dest's own shape; the view handed back has the tensor's shape. A larger one fails
	 * with -EMSGSIZE.
	 */
	TFAB_RECV_ANY_SHAPE = 1u << 0,
};

/** A receive into dest (not NULL) with flags (TFAB_RECV_*); tfab_recv with dest is flags 0. */
TFAB_EXPORT int tfab_recv_into(struct tfab_context *ctx, struct tfab_peer *peer, const char *key,
			       int64_t step_id, DLTensor *dest, unsigned flags, tfab_recv_cb cb,
			       void *arg);

/**
 * No-request mode for key from peer: a receive of (key, N) into a library tensor (dest NULL),
 * once the key's meta-data is cached, keeps requests standing for steps N+1 .. N+depth (fewer
 * where they would hold more than 4 MiB or an eighth of TFAB_POOL_CACHE, one at least), so
 * the sender writes each of those tensors as soon as it is sent, and the receive of such a
 * step finds it landed, or landing. Receives are expected step after step: one of a step
 * below those standing cancels them. A changed meta-data costs the usual round trip; step
 * cleanup, abort and the peer's end cancel what stands. A send's completion (the receiver's
 * verdict) then waits for a control write to ride on: up to depth/2 receives later, or
 * TFAB_NO_REQUEST_TAKEN_US. depth 0 turns it off for the key; TFAB_NO_REQUEST sets the
 * depth of every key not named here. At most 1024; -EINVAL otherwise.
 */
TFAB_EXPORT int tfab_recv_ahead(struct tfab_context *ctx, struct tfab_peer *peer, const char *key,
				unsigned depth);

/**
 * A blocking receive on top: waits at most timeout_ms (driving progress itself unless the
 * progress thread does), then gives up with -ETIMEDOUT. Driving progress, it polls without a
 * pause for TFAB_SPIN_US after its last poll that found work (10 ms by default), then
 * gives the core up for a moment at each poll that finds nothing. *tensor_p gets the tensor
 * cb would get (with dest, a view of it); with tensor_p NULL the library releases it. It may
 * be called in a callback, on the progress thread too. With dest, giving up returns when cb would be
 * called (above): after timeout_ms, by as long as the sender takes to read the cancel, since
 * dest is never handed back while the sender may write into it. A signal does not end the
 * wait (-EINTR is never returned). Short timeouts in a loop are no way to watch for signals:
 * each one that ends cancels the receive, and a tensor whose content takes longer than it to
 * land is written again each time. Wait for tfab_recv's callback with tfab_progress in short
 * calls instead (an asynchronous receive ends by its callback, a step cleanup or an abort).
 */
TFAB_EXPORT int tfab_recv_sync(struct tfab_context *ctx, struct tfab_peer *peer, const char *key,
			       int64_t step_id, DLTensor *dest, int timeout_ms,
			       DLManagedTensor **tensor_p, bool *is_dead_p);
/** The blocking form of tfab_recv_into: as tfab_recv_sync, with flags (TFAB_RECV_*). */
TFAB_EXPORT int tfab_recv_into_sync(struct tfab_context *ctx, struct tfab_peer *peer,
				    const char *key, int64_t step_id, DLTensor *dest,
				    unsigned flags, int timeout_ms, DLManagedTensor **tensor_p,
				    bool *is_dead_p);

/**
 * Fails every pending send and receive of step_id with -TFAB_ERR_ABORTED and forgets them. A
 * negative step_id is -EINVAL (those are the collectives').
 */
TFAB_EXPORT int tfab_step_cleanup(struct tfab_context *ctx, int64_t step_id);
/** @} */

/**
 * Fails every pending operation with status (negative; -TFAB_ERR_ABORTED if 0) and makes
 * every later send and receive fail with it at once. A tfab_accept waiting in another thread
 * ends with it too (within 100 ms), as do the handshakes of a tfab_connect and of a world's
 * join; a tfab_connect still retrying a refused connection ends at its own timeout.
 */
TFAB_EXPORT int tfab_abort(struct tfab_context *ctx, int status);

/**
 * Forget cached memory registrations overlapping [addr, addr + len): call it before freeing
 * or remapping memory that was sent from or received into.
 */
TFAB_EXPORT int tfab_mr_invalidate(struct tfab_context *ctx, const void *addr, size_t len);

/** A context's counters, since it was created (tfab_get_stats). */
struct tfab_stats {
	uint64_t bytes_sent;	   /**< tensor content written to peers */
	uint64_t bytes_received;   /**< tensor content written here by peers */
	uint64_t sends;		   /**< sends completed */
	uint64_t requests;	   /**< receives completed */
	uint64_t meta_hits;	   /**< receives that found cached meta-data */
	uint64_t meta_misses;	   /**< receives that had none */
	uint64_t rerequests;	   /**< requests sent again after a meta-data reply */
	uint64_t mr_hits;	   /**< registration cache hits */
	uint64_t mr_misses;	   /**< and misses */
	uint64_t mr_registrations; /**< regions registered, cache and pool */
	uint64_t bytes_copied;	   /**< tensor bytes the library copied: 0 on the DMAable path */
	uint64_t ctrl_messages;	   /**< control messages sent (several may share a write) */
	/**
	 * @name Fabric writes
	 * Fabric writes this context posted: what a tensor fetch costs the fabric.
	 * @{
	 */
	uint64_t writes_content; /**< tensor content (each chunk of a staged one too) */
	uint64_t writes_ctrl;	 /**< control slots, each with one or more messages */
	uint64_t writes_credit;	 /**< credit returns */
	/** @} */
	uint64_t meta_evictions; /**< meta-data cache entries dropped for TFAB_META_CACHE_ENTRIES */
	uint64_t bytes_ctrl;	 /**< bytes of the control writes (writes_ctrl) */
	uint64_t requests_ahead; /**< requests posted ahead of their receives (no-request mode) */
	uint64_t ahead_taken;	 /**< receives that found theirs posted ahead */
	/**
	 * What peers sent that the protocol refused (doc/protocol.md, "What the receiver
	 * checks"): malformed or lying control messages, immediates naming no request of the
	 * writer's, another peer's or a stale one, credits never given, META_DATA storms,
	 * malformed connection blobs. Each fails its peer (TFAB_ERR_PROTOCOL) where it is known.
	 */
	uint64_t refused;
	/**
	 * Collectives (doc/world.md): the bytes their sends put on the wire, and what those
	 * bytes stand for (the same, but for a compressed allreduce's: its fp32 values).
	 */
	uint64_t coll_bytes_wire;
	/** What coll_bytes_wire's bytes stand for (see there). */
	uint64_t coll_bytes_logical;
	/**
	 * Pinnings of GPU tensors' host proxies (pool blocks) for their copies to and from the
	 * GPU: a block's once while the pool keeps it (one released and allocated again counts
	 * again; under TFAB_CUDA_EMULATE=1 they are counted, not made). Blocks larger than
	 * TFAB_POOL_CACHE are not pinned.
	 */
	uint64_t gpu_pins;
	/**
	 * Allreduces and barriers whose operands went through the world's shared segments
	 * (every rank on this host: TFAB_COLL_SHM) and ended well; their operands' bytes count
	 * in coll_bytes_wire and coll_bytes_logical once each, as put.
	 */
	uint64_t coll_shm;
	/**
	 * Peers let go while they might still have been writing to this context: a request of
	 * ours, or a CANCEL of ours it had not read, was out when it failed or was destroyed.
	 * Their connections are cut; on libfabric's tcp the endpoint then stays open until the
	 * process ends (libfabric 1.17 crashes closing one in the middle of a write). Leaving a
	 * live peer cancels our requests and waits for it to read the CANCELs: up to 2 s
	 * (tfab_peer_destroy), 1 s for all of them (tfab_context_destroy), and no longer than
	 * 100 ms without a credit from it.
	 */
	uint64_t peers_cut;
};

/** Copy ctx's counters into *stats_p. 0, or -EINVAL for a NULL argument. */
TFAB_EXPORT int tfab_get_stats(struct tfab_context *ctx, struct tfab_stats *stats_p);

/**
 * The paths the context opened, one per entry of TFAB_PROVIDER ("auto": every usable one),
 * in its order of preference: up to max names into names; returns how many there are.
 */
TFAB_EXPORT int tfab_context_paths(struct tfab_context *ctx, const char **names, int max);
/** What its first path runs on: "ofi", "tcp;ofi_rxm", "lo". Valid for the context's life. */
TFAB_EXPORT const char *tfab_context_backend(struct tfab_context *ctx);
/** The fabric of its first path ("tcp;ofi_rxm"), as tfab_context_backend. */
TFAB_EXPORT const char *tfab_context_fabric(struct tfab_context *ctx);
/** The domain of its first path ("lo"), as tfab_context_backend. */
TFAB_EXPORT const char *tfab_context_domain(struct tfab_context *ctx);

#ifdef __cplusplus
}
#endif

#endif
