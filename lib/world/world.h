/*
 * A world's state (world.c joins it, coll.c runs its collectives). The collectives' part is
 * guarded by coll_lock, never held across a call into the engine.
 */
#ifndef TFAB_WORLD_WORLD_H
#define TFAB_WORLD_WORLD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tfab/world.h>

#include "util/hash.h"
#include "util/list.h"

struct tfab_coll;

/*
 * A rank's record on the wire (world.c): magic, version, rank, size, port, host and name
 * (NUL-padded), then the settings every rank must share (TFAB_ALLREDUCE_SMALL,
 * TFAB_COLL_EAGER, TFAB_COLL_SHM).
 */
#define TFAB_WORLD_REC_HOST 256
#define TFAB_WORLD_REC_NAME (TFAB_WORLD_NAME_MAX + 1)
#define TFAB_WORLD_REC_SHARED (16 + TFAB_WORLD_REC_HOST + TFAB_WORLD_REC_NAME)
#define TFAB_WORLD_REC_LEN (TFAB_WORLD_REC_SHARED + 4 + 4 + 4)
/* The longest error rank 0 explains to a rank. */
#define TFAB_WORLD_ANSWER_WHY 512

struct rank_rec {
	uint32_t rank, size;
	uint32_t small, eager, shm; /* TFAB_ALLREDUCE_SMALL, TFAB_COLL_EAGER, TFAB_COLL_SHM */
	uint16_t port;
	char host[TFAB_WORLD_REC_HOST];
	char name[TFAB_WORLD_REC_NAME];
};

/* The record's TFAB_WORLD_REC_LEN bytes. */
void tfab__world_rec_pack(const struct rank_rec *r, uint8_t *out);
/*
 * Rank 0 reading what a connection sent as its record: 0 and *r, or -TFAB_ERR_PROTOCOL (why)
 * for bytes that are not exactly a record's (length, magic, version, a string not NUL-padded).
 */
int tfab__world_rec_parse(const uint8_t *msg, size_t len, struct rank_rec *r, char *why,
			  size_t whylen);
/*
 * Whether the rank of record r may join a world of size whose ranks have[] have come: 0, or
 * -TFAB_ERR_PROTOCOL with why, which rank 0 answers it (another size, rank 0 or a rank >= size,
 * a rank that came before).
 */
int tfab__world_rec_check(const struct rank_rec *r, int size, const bool *have, char *why,
			  size_t whylen);
/*
 * A rank reading rank 0's answer: 0 with the world's size records in recs (each the rank of
 * its place, of that size; recs untouched otherwise); the status rank 0 answered, with its
 * words in why; or -TFAB_ERR_PROTOCOL (why) for an answer that is neither.
 */
int tfab__world_answer_parse(const uint8_t *msg, size_t len, int size, struct rank_rec *recs,
			     char *why, size_t whylen);

struct tfab_world {
	struct tfab_context *ctx;
	int rank, size;
	int timeout_ms; /* the join's */
	struct rank_rec *recs;
	struct tfab_peer **peers;
	int32_t hello; /* the tensor this rank says hello with */

	/* Collectives (coll.c); coll_up while the lock and the table below exist. */
	bool coll_up;
	pthread_mutex_t coll_lock;
	pthread_cond_t coll_cond;  /* broadcast when a collective ends */
	uint64_t coll_seq;	   /* collectives started so far: the next one's number */
	struct tfab_list colls;	   /* started and not yet called back, by number */
	struct tfab_list runnable; /* those with operations to post or a verdict to give */
	bool driving;		   /* a thread is posting for them (coll.c, drive) */
	pthread_t driver;	   /* that thread, while driving */
	unsigned small, piece;	   /* TFAB_ALLREDUCE_SMALL, TFAB_COLL_PIECE */
	unsigned eager;		   /* TFAB_COLL_EAGER, 0 where the hooks are another world's */
	bool hooked;		   /* this world has the context's collective hooks */
	struct tfab_list early;	   /* COLL_DATA operands before their receive (coll.c) */
	unsigned nearly;
	/*
	 * Once joined (tfab__coll_joined): each rank's peer's failure, and the context's abort,
	 * as the engine reported them (coll.c, on_fail), so that an eager receive fails at once;
	 * the nfailed ranks failed, in the order reported (tfab_world_failed).
	 */
	bool joined;
	int *rank_failed;
	int *failed_order;
	int nfailed;
	int aborted;
	struct tfab_htable residuals; /* error feedback of compressed allreduces, by key */
	/*
	 * Allreduces through the ranks' segments (coll_shm.c), where every rank is on this host:
	 * shm_max (TFAB_COLL_SHM, 0 where there are none) bytes at most; fast: those started
	 * and not yet read, in their order (shm_seq numbers them).
	 */
	struct tfab_coll_shm *shm;
	int64_t shm_desc[4]; /* what the join sends of it (kept here until the peers go) */
	unsigned shm_max;
	uint64_t shm_seq;
	struct tfab_list fast;
	_Atomic uint64_t ended; /* collectives called back so far (tfab_world_wait) */
};

/* coll.c */
/* The algorithm an allreduce of nbytes (count elements) takes when `asked` is given. */
enum tfab_coll_algo tfab__coll_algo(const struct tfab_world *w, size_t nbytes, size_t count,
				    enum tfab_coll_algo asked);
int tfab__coll_init(struct tfab_world *w);
/* The world's peers are all there: from now on the engine's reports of failures name ranks. */
void tfab__coll_joined(struct tfab_world *w);
/* -EBUSY while collectives are in flight (nothing done); else frees what they kept. */
int tfab__coll_fini(struct tfab_world *w);

/* coll_shm.c: the segments (the caller keeps their order, and holds coll_lock). */
/* Once every peer is there: segments made and traded where all ranks are on this host. */
int tfab__coll_shm_join(struct tfab_world *w, uint64_t deadline_ms);
void tfab__coll_shm_free(struct tfab_world *w);
/* Allreduce f's operand into this rank's slot; false (*behind_p: a rank) until it is free. */
bool tfab__coll_shm_put(struct tfab_world *w, uint64_t f, const void *data, size_t len,
			int *behind_p);
/* 1 when every rank's operand of f is there; 0 (*missing_p: a rank's is not), or < 0. */
int tfab__coll_shm_ready(struct tfab_world *w, uint64_t f, size_t len, int *missing_p);
const void *tfab__coll_shm_operand(struct tfab_world *w, int rank, uint64_t f);
/* This rank is done with f's operands (read, or given up on). */
void tfab__coll_shm_done(struct tfab_world *w, uint64_t f);
/* Whether f waits on rank: its operand not there (put), or f's slot not yet free of it. */
bool tfab__coll_shm_waits_on(struct tfab_world *w, uint64_t f, bool put, int rank);

/* coll_gpu.c: GPU operands of a collective, through host proxies. */
struct tfab_coll_gpu;
/*
 * Where *in_p or *out_p (either may be NULL, or both the same tensor, read and written) is a
 * GPU tensor: it is replaced by a host view of a pinned pool block (in's content copied there
 * now), and *cb_p, *arg_p by a callback that copies out's result to the GPU before it calls
 * the caller's. *g_p: NULL where no operand is on a GPU (nothing changed).
 */
int tfab__coll_gpu_open(struct tfab_world *w, const DLTensor **in_p, DLTensor **out_p,
			tfab_coll_cb *cb_p, void **arg_p, struct tfab_coll_gpu **g_p);
/* The collective's start returned rc: a failure frees g (its callback never runs). rc. */
int tfab__coll_gpu_started(struct tfab_coll_gpu *g, int rc);

#endif
