/*
 * A world's collective segment (doc/world.md, "Small allreduces on one host"): where every
 * rank's peer is on the native shm path (one host), each rank keeps a segment that every other
 * rank maps, and a small direct allreduce moves its operands through it instead of messages.
 *
 * A segment (util/segment.h: a memfd, nothing left in /dev/shm) has one writer, its rank, and
 * holds SLOTS slots. The allreduce numbered f among the world's segment allreduces (every rank
 * numbers them alike, as it does all collectives) puts this rank's operand in slot f % SLOTS
 * and then publishes f + 1 as the slot's `seq` (release); a reader that sees f + 1 there
 * (acquire) reads the operand. A rank that has read f's operands, or given up on f, publishes
 * f + 1 as its segment's `done`. A slot is written again, for f + SLOTS, only once every rank's
 * `done` is past f: no reader ever meets a slot being rewritten under it.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <tfab/status.h>

#include "engine/engine_world.h"
#include "world/world.h"
#include "util/log.h"
#include "util/segment.h"
#include "util/time.h"

#define SUBSYS "coll"

#define SHM_MAGIC 0x5446435348u /* "TFCSH" */
#define SLOTS 16
#define LINE 64
static const char SEG_KEY[] = "tfab.world.coll-shm";

/* A segment's first two lines: what it is, and its rank's progress (read by every other). */
struct seg_head {
	uint64_t magic;
	uint32_t rank, max; /* the slots' size: TFAB_COLL_SHM */
	_Alignas(LINE) _Atomic uint64_t done;
};

struct slot_head {
	_Atomic uint64_t seq;
	uint32_t len;
};

struct tfab_coll_shm {
	size_t stride, len; /* a slot's bytes (head line and data), the segment's */
	int fd;		    /* this rank's segment */
	uint8_t **segs;	    /* by rank; this rank's own included */
};

static struct seg_head *head_of(const struct tfab_coll_shm *s, int rank)
{
	return (struct seg_head *)s->segs[rank];
}

static struct slot_head *slot_of(const struct tfab_coll_shm *s, int rank, uint64_t f)
{
	return (struct slot_head *)(s->segs[rank] + 2 * LINE + (f % SLOTS) * s->stride);
}

static void on_desc_sent(void *arg, int status)
{
	(void)arg;
	(void)status;
}

/* Every rank's descriptor into all (this rank's its own), the round's step. */
static int trade(struct tfab_world *w, int64_t step, int64_t (*all)[4], uint64_t deadline)
{
	struct tfab_context *ctx = w->ctx;
	int64_t four = 4;
	DLTensor t = {.data = w->shm_desc,
		      .device = {kDLCPU, 0},
		      .ndim = 1,
		      .dtype = {kDLInt, 64, 1},
		      .shape = &four};
	int rc = 0;

	memcpy(all[w->rank], w->shm_desc, sizeof(w->shm_desc));
	for (int r = 0; r < w->size && rc == 0; r++) {
		if (r != w->rank)
			rc = tfab_send_to(ctx, w->peers[r], SEG_KEY, step, &t, false, on_desc_sent,
					  NULL);
	}
	for (int r = 0; r < w->size && rc == 0; r++) {
		int64_t one = 4;
		DLTensor d = {.data = all[r],
			      .device = {kDLCPU, 0},
			      .ndim = 1,
			      .dtype = {kDLInt, 64, 1},
			      .shape = &one};

		if (r != w->rank)
			rc = tfab_recv_sync(ctx, w->peers[r], SEG_KEY, step, &d,
					    tfab__ms_until(deadline), NULL, NULL);
		if (rc)
			TFAB_ERROR(SUBSYS, "rank %d: rank %d's collective segment: %s", w->rank, r,
				   tfab_strerror(rc));
	}
	/* Ours taken: the descriptor may go. */
	if (rc == 0)
		rc = tfab_flush(ctx, tfab__ms_until(deadline));
	return rc == -ETIMEDOUT ? -TFAB_ERR_TIMEOUT : rc;
}

/* Whether every peer of this rank is on the native shm path. */
static bool one_host(const struct tfab_world *w)
{
	for (int r = 0; r < w->size; r++) {
		const char *path = r == w->rank ? "shm" : tfab_peer_path(w->peers[r]);

		if (!path || strcmp(path, "shm") != 0)
			return false;
	}
	return true;
}

void tfab__coll_shm_free(struct tfab_world *w)
{
	struct tfab_coll_shm *s = w->shm;

	if (!s)
		return;
	for (int r = 0; r < w->size; r++) {
		if (s->segs[r])
			munmap(s->segs[r], s->len);
	}
	if (s->fd >= 0)
		close(s->fd);
	free(s->segs);
	free(s);
	w->shm = NULL;
}

/* Maps every other rank's segment from its descriptor; 0, or why not. */
static int map_all(struct tfab_world *w, struct tfab_coll_shm *s, int64_t (*all)[4])
{
	for (int r = 0; r < w->size; r++) {
		size_t len = 0;
		void *addr;
		int rc;

		if (r == w->rank)
			continue;
		rc = tfab__seg_open((pid_t)all[r][0], (int)all[r][1], (uint64_t)all[r][2], &addr,
				    &len);
		if (rc)
			return rc;
		if (len != s->len || ((struct seg_head *)addr)->magic != SHM_MAGIC ||
		    ((struct seg_head *)addr)->rank != (uint32_t)r) {
			TFAB_ERROR(SUBSYS, "rank %d: rank %d's collective segment is not one",
				   w->rank, r);
			munmap(addr, len);
			return -TFAB_ERR_PROTOCOL;
		}
		s->segs[r] = addr;
	}
	return 0;
}

/*
 * Where TFAB_COLL_SHM (the same on every rank: the join compared it) is not 0, two rounds
 * between every pair: the descriptors (pid, fd, inode, and 1; 0 where the rank has no
 * segment: a peer off the shm path, another world holding the hooks, or no memory), then,
 * where every rank has one, whether each mapped every other's. Every rank so decides alike,
 * and keeps its fd (which /proc opens) until every other has mapped the segment; the mappings
 * keep it after that.
 */
int tfab__coll_shm_join(struct tfab_world *w, uint64_t deadline)
{
	unsigned max = tfab__ctx_config(w->ctx)->coll_shm;
	struct tfab_coll_shm *s;
	int64_t(*all)[4];
	uint64_t ino = 0;
	void *addr;
	bool every = true, mapped = true;
	int rc;

	w->shm_max = 0;
	if (w->size < 2 || max == 0)
		return 0;
	s = calloc(1, sizeof(*s));
	all = calloc((size_t)w->size, sizeof(*all));
	if (!s || !all || !(s->segs = calloc((size_t)w->size, sizeof(*s->segs)))) {
		free(all);
		free(s);
		return -ENOMEM;
	}
	w->shm = s;
	s->fd = -1;
	s->stride = LINE + (max + LINE - 1) / LINE * LINE;
	s->len = 2 * LINE + SLOTS * s->stride;
	/* Polled through the hooks: not where another world of this context has them. */
	if (w->hooked && one_host(w) &&
	    tfab__seg_create("tfab-coll", s->len, &s->fd, &ino, &addr) == 0) {
		struct seg_head *h = addr;

		s->segs[w->rank] = addr;
		h->magic = SHM_MAGIC;
		h->rank = (uint32_t)w->rank;
		h->max = max;
	}
	w->shm_desc[0] = getpid();
	w->shm_desc[1] = s->fd;
	w->shm_desc[2] = (int64_t)ino;
	w->shm_desc[3] = s->segs[w->rank] != NULL;
	rc = trade(w, 0, all, deadline);
	for (int r = 0; r < w->size; r++)
		every &= all[r][3] == 1;
	if (rc == 0 && every) {
		rc = map_all(w, s, all);
		if (rc)
			TFAB_WARN(SUBSYS, "rank %d: allreduces go as messages: %s", w->rank,
				  tfab_strerror(rc));
		w->shm_desc[3] = rc == 0;
		rc = trade(w, 1, all, deadline);
		for (int r = 0; r < w->size; r++)
			mapped &= all[r][3] == 1;
	}
	w->shm_max = rc == 0 && every && mapped ? max : 0;
	free(all);
	if (!w->shm_max) {
		tfab__coll_shm_free(w);
	} else {
		close(s->fd);
		s->fd = -1;
		TFAB_DEBUG(SUBSYS, "rank %d: allreduces of up to %u bytes through the segments",
			   w->rank, max);
	}
	return rc;
}

bool tfab__coll_shm_put(struct tfab_world *w, uint64_t f, const void *data, size_t len,
			int *behind_p)
{
	struct tfab_coll_shm *s = w->shm;
	struct slot_head *sl = slot_of(s, w->rank, f);

	/* The slot's last allreduce, f - SLOTS, read by every rank. */
	for (int r = 0; f >= SLOTS && r < w->size; r++) {
		if (atomic_load_explicit(&head_of(s, r)->done, memory_order_acquire) <
		    f - SLOTS + 1) {
			*behind_p = r;
			return false;
		}
	}
	memcpy((uint8_t *)sl + LINE, data, len);
	sl->len = (uint32_t)len;
	atomic_store_explicit(&sl->seq, f + 1, memory_order_release);
	return true;
}

int tfab__coll_shm_ready(struct tfab_world *w, uint64_t f, size_t len, int *missing_p)
{
	struct tfab_coll_shm *s = w->shm;

	for (int r = 0; r < w->size; r++) {
		struct slot_head *sl = slot_of(s, r, f);
		uint64_t seq = atomic_load_explicit(&sl->seq, memory_order_acquire);

		if (seq != f + 1) {
			*missing_p = r;
			return 0;
		}
		if (sl->len != len) {
			*missing_p = r;
			/* What a rank that failed left there is not its part of this one. */
			if (w->rank_failed[r])
				return w->rank_failed[r];
			TFAB_WARN(SUBSYS,
				  "rank %d: allreduce %llu through the segments: rank %d's operand "
				  "is %u bytes, this rank's %zu (do the ranks run the same "
				  "collectives?)",
				  w->rank, (unsigned long long)f, r, sl->len, len);
			return -TFAB_ERR_PROTOCOL;
		}
	}
	return 1;
}

const void *tfab__coll_shm_operand(struct tfab_world *w, int rank, uint64_t f)
{
	return (const uint8_t *)slot_of(w->shm, rank, f) + LINE;
}

void tfab__coll_shm_done(struct tfab_world *w, uint64_t f)
{
	atomic_store_explicit(&head_of(w->shm, w->rank)->done, f + 1, memory_order_release);
}

bool tfab__coll_shm_waits_on(struct tfab_world *w, uint64_t f, bool put, int rank)
{
	struct tfab_coll_shm *s = w->shm;

	if (put)
		return atomic_load_explicit(&slot_of(s, rank, f)->seq, memory_order_acquire) !=
		       f + 1;
	return f >= SLOTS &&
	       atomic_load_explicit(&head_of(s, rank)->done, memory_order_acquire) < f - SLOTS + 1;
}
