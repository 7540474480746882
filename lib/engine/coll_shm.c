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

#include "engine/engine.h"
#include "engine/world.h"
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
	int64_t desc[4];    /* what this rank tells the others: pid, fd, inode, max */
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

static int remaining(uint64_t deadline)
{
	uint64_t now = tfab__now_ms();

	return now >= deadline ? 0 : (int)(deadline - now);
}

/* Every rank's descriptor into all (this rank's its own), the round's step. */
static int trade(struct tfab_world *w, struct tfab_coll_shm *s, int64_t step, int64_t (*all)[4],
		 uint64_t deadline)
{
	struct tfab_context *ctx = w->ctx;
	int64_t four = 4;
	DLTensor t = {.data = s->desc,
		      .device = {kDLCPU, 0},
		      .ndim = 1,
		      .dtype = {kDLInt, 64, 1},
		      .shape = &four};
	int rc = 0;

	memcpy(all[w->rank], s->desc, sizeof(s->desc));
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
					    remaining(deadline), NULL, NULL);
		if (rc)
			TFAB_ERROR(SUBSYS, "rank %d: rank %d's collective segment: %s", w->rank, r,
				   tfab_strerror(rc));
	}
	/* Ours taken: the descriptor may go. */
	if (rc == 0)
		rc = tfab_flush(ctx, remaining(deadline));
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

		if (all[r][3] != s->desc[3]) {
			TFAB_ERROR(SUBSYS,
				   "rank %d: rank %d has TFAB_COLL_SHM=%lld, this rank %lld: every "
				   "rank of a world must have the same",
				   w->rank, r, (long long)all[r][3], (long long)s->desc[3]);
			return -TFAB_ERR_CONFIG;
		}
		if (r == w->rank)
			continue;
		rc = tfab__seg_open((pid_t)all[r][0], (int)all[r][1], (uint64_t)all[r][2], &addr,
				    &len);
		if (rc)
			return rc;
		s->segs[r] = addr;
		if (len != s->len || head_of(s, r)->magic != SHM_MAGIC ||
		    head_of(s, r)->rank != (uint32_t)r) {
			TFAB_ERROR(SUBSYS, "rank %d: rank %d's collective segment is not one",
				   w->rank, r);
			return -TFAB_ERR_PROTOCOL;
		}
	}
	return 0;
}

/*
 * Two rounds between every pair: the descriptors (pid, fd, inode, TFAB_COLL_SHM; 0 for the
 * last where the rank has no segment), then whether each rank mapped every other's. Every
 * rank so decides alike, and keeps its fd (which /proc opens) until every other has mapped
 * the segment; the mappings keep it after that.
 */
int tfab__coll_shm_join(struct tfab_world *w, uint64_t deadline)
{
	unsigned max = w->hooked ? w->ctx->cfg.coll_shm : 0; /* polled through the hooks */
	struct tfab_coll_shm *s;
	int64_t(*all)[4];
	uint64_t ino = 0;
	void *addr;
	int rc = 0, on;

	if (w->size < 2)
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
	if (max && one_host(w) && tfab__seg_create("tfab-coll", s->len, &s->fd, &ino, &addr) == 0) {
		struct seg_head *h = addr;

		s->segs[w->rank] = addr;
		h->magic = SHM_MAGIC;
		h->rank = (uint32_t)w->rank;
		h->max = max;
	}
	s->desc[0] = getpid();
	s->desc[1] = s->fd;
	s->desc[2] = (int64_t)ino;
	s->desc[3] = s->segs[w->rank] ? max : 0;
	rc = trade(w, s, 0, all, deadline);
	on = rc == 0 && s->desc[3];
	for (int r = 0; r < w->size && on; r++)
		on = all[r][3] != 0;
	if (on && (rc = map_all(w, s, all)) != 0) {
		on = 0;
		TFAB_WARN(SUBSYS, "rank %d: allreduces go as messages: %s", w->rank,
			  tfab_strerror(rc));
		rc = rc == -TFAB_ERR_CONFIG ? rc : 0;
	}
	if (rc == 0 && s->desc[3]) {
		s->desc[3] = on;
		rc = trade(w, s, 1, all, deadline);
		for (int r = 0; r < w->size && rc == 0; r++)
			on &= all[r][3] == 1;
	}
	w->shm_max = rc == 0 && on ? max : 0;
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
			TFAB_WARN(SUBSYS,
				  "rank %d: allreduce %llu through the segments: rank %d's operand "
				  "is %u bytes, this rank's %zu (do the ranks run the same "
				  "collectives?)",
				  w->rank, (unsigned long long)f, r, sl->len, len);
			*missing_p = r;
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
