/*
 * The shm backend's private objects, shared by shm.c (the operations), tx.c (the writer's
 * side: routing, copies, the ring's producer, completions) and rx.c (the target's side: the
 * rings' consumer, dead writers' slots).
 */
#ifndef TFAB_SHM_INTERNAL_H
#define TFAB_SHM_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "providers/shm/shm.h"
#include "util/freelist.h"
#include "util/list.h"
#include "util/time.h"

#define TFAB_SHM_MAX_PENDING 1024u	  /* queued writes per connection, then -EAGAIN */
#define TFAB_SHM_BUDGET (4u << 20)	  /* bytes one poll copies, to keep polls short */
#define TFAB_SHM_CHECK_NS 1000000ull	  /* a peer's death is seen within this (and a jiffy) */
#define TFAB_SHM_RX_CHECK_NS 100000000ull /* dead writers' slots are freed this often */
#define TFAB_SHM_TX_DEFER 8u /* polls in a row that may leave our completions for later */
#define TFAB_SHM_MAX_MSG (1ull << 40)
/*
 * Shorter writes to memory outside a shared segment go through the bounce buffers even where
 * CMA works: two copies of a few KiB in cache cost less than process_vm_writev's system call
 * and page pinning. Measured (tfab-perf raw --heap-dst, one way): 2 KiB 0.35 us bounced, 1.8
 * us by CMA; 8 KiB 1.2 against 2.1; 32 KiB 4.6 against 3.9 (see doc/providers.md).
 */
#define TFAB_SHM_CMA_MIN (32u << 10)

enum tfab_shm_path { PATH_INLINE = 1, PATH_MAPPED, PATH_CMA, PATH_BOUNCE };

/* A write not yet wholly in the ring: queued behind others, or being copied. */
struct tfab_shm_op {
	struct tfab_shm_op *next;
	void *ctx;
	const uint8_t *src;
	size_t len, done; /* bytes, and bytes copied (or chunks posted) so far */
	uint64_t raddr, rkey;
	uint8_t *dst; /* PATH_MAPPED: where raddr is in this process */
	uint32_t imm;
	int path;
	int status; /* a local failure: reported without a ring entry */
	bool inject;
	uint8_t copy[TFAB_SHM_INLINE_MAX]; /* an injected payload queued behind others */
};

/* What the writer remembers of each ring entry until the target takes it. */
struct tfab_shm_rec {
	void *ctx;
	uint16_t nent; /* entries it spans */
	bool inject;
	bool bounce; /* holds a bounce buffer */
	bool last;   /* the write's last entry: its verdict is reported */
};

/* A peer's shared segment, mapped here. */
struct tfab_shm_map {
	struct tfab_shm_map *next;
	uint64_t ino;
	void *addr;
	size_t len;
};

struct tfab_shm_conn {
	struct tfab_conn base;
	struct tfab_shm_conn *next; /* on the endpoint's list, zombies included */
	pid_t pid;
	int pidfd;
	bool self; /* the peer is this process: its addresses are ours */
	bool dead;
	bool closing; /* disconnected with writes in flight */
	struct tfab_shm_ctrl *peer;
	size_t peer_len;
	struct tfab_shm_slot *slot;
	uint64_t head, acked;
	uint64_t bounce_posted, bounce_acked;
	int chunk_status; /* the first failed chunk of the bounced write being acked */
	struct tfab_shm_op *pend, *pend_tail;
	unsigned npending;
	struct tfab_shm_map *maps;
	uint64_t last_check;
	struct tfab_shm_rec recs[TFAB_SHM_RING_N];
};

/* This endpoint's view of one of its slots (as consumer). */
struct tfab_shm_rx {
	bool live;   /* seen active since it was last freed */
	bool failed; /* a chunk of the bounced write being taken failed */
	int pidfd;
	pid_t pid;
};

/* A segment from mem_alloc. */
struct tfab_shm_seg {
	struct tfab_shm_seg *next;
	uint8_t *addr;
	size_t len;
	int fd;
	uint64_t ino;
};

struct tfab_shm_ep {
	struct tfab_ep base;
	struct tfab_caps caps;
	struct tfab_shm_ctrl *ctrl;
	size_t ctrl_len;
	int ctrl_fd;
	uint64_t ctrl_ino;
	uint64_t ep_id;
	struct tfab_shm_host host;
	pid_t pid;
	uint32_t *free_regs; /* a stack of free registration indexes */
	uint32_t nfree_regs;
	int nconns, nmrs, nsegs;
	struct tfab_shm_conn *conns;
	struct tfab_shm_seg *segs;
	struct tfab_freelist ops;
	struct tfab_shm_op *failed, *failed_tail; /* failed before reaching the ring */
	uint64_t next_rx_check;
	unsigned tx_deferred; /* polls in a row that found peers' writes and left ours */
	bool no_cma;
	struct tfab_shm_stats stats;
	char errmsg[256];
	struct tfab_shm_rx rx[TFAB_SHM_SLOTS];
};

static inline struct tfab_shm_ep *shm_ep(struct tfab_ep *base)
{
	return tfab_container_of(base, struct tfab_shm_ep, base);
}

static inline struct tfab_shm_conn *shm_conn(struct tfab_conn *base)
{
	return tfab_container_of(base, struct tfab_shm_conn, base);
}

/*
 * A peer's registration as the writer sees it, read as a seqlock: the key before and after
 * the fields, so that a registration replaced meanwhile is not mistaken for the one asked.
 */
struct reg_view {
	uint64_t addr, len, seg_ino, seg_off;
	int32_t seg_fd;
	uint32_t access;
};
static inline bool reg_read(struct tfab_shm_reg *regs, uint64_t rkey, struct reg_view *v)
{
	struct tfab_shm_reg *r = &regs[rkey & (TFAB_SHM_NREGS - 1)];

	if (!rkey || atomic_load_explicit(&r->key, memory_order_acquire) != rkey)
		return false;
	v->addr = atomic_load_explicit(&r->addr, memory_order_relaxed);
	v->len = atomic_load_explicit(&r->len, memory_order_relaxed);
	v->seg_ino = atomic_load_explicit(&r->seg_ino, memory_order_relaxed);
	v->seg_off = atomic_load_explicit(&r->seg_off, memory_order_relaxed);
	v->seg_fd = atomic_load_explicit(&r->seg_fd, memory_order_relaxed);
	v->access = atomic_load_explicit(&r->access, memory_order_relaxed);
	atomic_thread_fence(memory_order_acquire);
	return atomic_load_explicit(&r->key, memory_order_relaxed) == rkey;
}

/* Whether [raddr, raddr + len) lies in a region open to remote writes. */
static inline bool reg_allows(const struct reg_view *v, uint64_t raddr, uint64_t len)
{
	return (v->access & TFAB_MR_REMOTE_WRITE) && raddr >= v->addr && len <= v->len &&
	       raddr - v->addr <= v->len - len;
}

static inline bool conn_busy(const struct tfab_shm_conn *c)
{
	return c->head != c->acked || c->pend;
}

/* tx.c: the writer's side. */
int tfab_shm_write_imm(struct tfab_ep *base, struct tfab_conn *peer, const void *lbuf, size_t len,
		       struct tfab_mr *lmr, uint64_t raddr, uint64_t rkey, uint32_t imm,
		       unsigned flags, void *ctx);
/* Writes that failed before reaching a ring, as events. */
int tfab_shm_tx_failed(struct tfab_shm_ep *ep, struct tfab_event *ev, int max);
/* Copies, posts, completions and peer checks of every busy connection; *now_p: the clock. */
int tfab_shm_tx_poll(struct tfab_shm_ep *ep, struct tfab_event *ev, int max, uint64_t *now_p);
void tfab_shm_conn_free(struct tfab_shm_conn *c);
void tfab_shm_conn_release(struct tfab_shm_ep *ep, struct tfab_shm_conn *c);

/* rx.c: the target's side. */

/* What the target made of one writer's entry. */
struct tfab_shm_taken {
	unsigned nent;	/* entries it took: the head and its continuation entries */
	int32_t status; /* 0, or the refusal written back into the entry */
	bool report;	/* a REMOTE_WRITE event: a whole write landed (its last chunk) */
	uint32_t imm;	/* the event's immediate */
	uint64_t len;	/* the event's length: the write's, or a bounced write's total */
	uint64_t raddr; /* the entry's, as read once */
	uint64_t rkey;
	uint64_t claimed; /* the entry's length as the writer put it */
};

/*
 * The target's reading of the published entry at i of ring r, whose writer it does not trust:
 * any bytes in the entry, in the entries after it and in its bounce buffers. The header is
 * read once; the write is checked against regs (this endpoint's registrations), its bytes
 * land where the check allows, a refusal goes back into the entry, and the continuation
 * entries' sequence words are cleared (tfab_shm_ring_take). *failed is the slot's state: a
 * chunk of the bounced write being taken was refused. Moving the tail is the caller's.
 */
void tfab_shm_entry_take(struct tfab_shm_ring *r, uint64_t i, struct tfab_shm_reg *regs,
			 uint8_t (*bounce)[TFAB_SHM_BOUNCE_SIZE], bool *failed,
			 struct tfab_shm_taken *t);

int tfab_shm_rx_poll(struct tfab_shm_ep *ep, struct tfab_event *ev, int max);
/* Whether rx_poll would find nothing and change nothing: every writer's ring empty. */
bool tfab_shm_rx_quiet(struct tfab_shm_ep *ep);
void tfab_shm_rx_reap(struct tfab_shm_ep *ep);

#endif
