/*
 * The shm backend, the writer's side: where a write goes (inline, straight into a mapping, by
 * CMA, bounced), its copies in budgeted pieces, the ring's producer, and completions from the
 * target's verdicts; a peer that is gone fails what is in flight to it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <tfab/status.h>

#include "providers/shm/copy.h"
#include "providers/shm/internal.h"
#include "util/log.h"

#define SUBSYS "shm"

void tfab_shm_conn_free(struct tfab_shm_conn *c)
{
	while (c->maps) {
		struct tfab_shm_map *m = c->maps;

		c->maps = m->next;
		munmap(m->addr, m->len);
		free(m);
	}
	if (c->peer)
		munmap(c->peer, c->peer_len);
	if (c->pidfd >= 0)
		close(c->pidfd);
	free(c);
}

/* A connection whose writes are all accounted for, disconnected: its slot goes back. */
void tfab_shm_conn_release(struct tfab_shm_ep *ep, struct tfab_shm_conn *c)
{
	struct tfab_shm_conn **pp = &ep->conns;

	while (*pp && *pp != c)
		pp = &(*pp)->next;
	if (*pp)
		*pp = c->next;
	atomic_store_explicit(&c->slot->state, TFAB_SHM_SLOT_CLOSING, memory_order_release);
	tfab_shm_conn_free(c);
}

/* The peer's segment mapped here (mapped at first use, kept until disconnect). */
static uint8_t *seg_map(struct tfab_shm_conn *c, const struct reg_view *v)
{
	struct tfab_shm_map *m;
	void *addr;
	size_t len;

	for (m = c->maps; m; m = m->next)
		if (m->ino == v->seg_ino)
			return m->addr;
	if (tfab__seg_open(c->pid, v->seg_fd, v->seg_ino, &addr, &len))
		return NULL;
	m = malloc(sizeof(*m));
	if (!m) {
		munmap(addr, len);
		return NULL;
	}
	m->ino = v->seg_ino;
	m->addr = addr;
	m->len = len;
	m->next = c->maps;
	c->maps = m;
	return addr;
}

/* An op that failed before reaching the ring: reported at the next poll. */
static void op_fail(struct tfab_shm_ep *ep, struct tfab_shm_op *op, int status)
{
	op->status = status;
	op->next = NULL;
	if (ep->failed_tail)
		ep->failed_tail->next = op;
	else
		ep->failed = op;
	ep->failed_tail = op;
}

/*
 * Where a write too long for the ring goes: straight into a mapping (the peer is this
 * process, or the destination is in its shared segment), by CMA, or bounced. The writer checks
 * the peer's table first, since it places the bytes itself; the target checks again.
 */
static int op_route(struct tfab_shm_ep *ep, struct tfab_shm_conn *c, struct tfab_shm_op *op)
{
	struct reg_view v;

	if (!reg_read(c->peer->regs, op->rkey, &v) || !reg_allows(&v, op->raddr, op->len))
		return -TFAB_ERR_REMOTE_ACCESS;
	if (c->self) {
		op->path = PATH_MAPPED;
		op->dst = (uint8_t *)(uintptr_t)op->raddr;
	} else if (v.seg_ino) {
		uint8_t *base = seg_map(c, &v);

		if (!base)
			return -TFAB_ERR_REMOTE_ACCESS;
		op->path = PATH_MAPPED;
		op->dst = base + v.seg_off + (op->raddr - v.addr);
	} else {
		op->path = ep->no_cma || op->len < TFAB_SHM_CMA_MIN ? PATH_BOUNCE : PATH_CMA;
	}
	return 0;
}

/* Fills the common fields of the entry at the conn's head. */
static struct tfab_shm_entry *entry_start(struct tfab_shm_conn *c, int kind, uint64_t raddr,
					  uint64_t rkey, uint64_t len, uint32_t imm)
{
	struct tfab_shm_entry *e = tfab_shm_ring_at(&c->slot->ring, c->head);

	e->kind = (uint8_t)kind;
	e->flags = 0;
	e->ncont = 0;
	e->imm = imm;
	e->raddr = raddr;
	e->rkey = rkey;
	e->len = len;
	e->status = 0;
	return e;
}

static void entry_post(struct tfab_shm_conn *c, unsigned nent, void *ctx, bool inject, bool bounce,
		       bool last)
{
	struct tfab_shm_rec *rec = &c->recs[c->head & (TFAB_SHM_RING_N - 1)];

	rec->ctx = ctx;
	rec->nent = (uint16_t)nent;
	rec->inject = inject;
	rec->bounce = bounce;
	rec->last = last;
	tfab_shm_ring_publish(&c->slot->ring, c->head);
	c->head += nent;
}

static bool post_inline(struct tfab_shm_ep *ep, struct tfab_shm_conn *c, const void *src,
			size_t len, uint64_t raddr, uint64_t rkey, uint32_t imm, void *ctx,
			bool inject)
{
	unsigned n = tfab_shm_inline_entries(len);

	if (!tfab_shm_ring_room(c->head, c->acked, n))
		return false;
	entry_start(c, TFAB_SHM_E_INLINE, raddr, rkey, len, imm);
	tfab_shm_ring_put_inline(&c->slot->ring, c->head, src, len);
	entry_post(c, n, ctx, inject, false, true);
	ep->stats.inline_writes++;
	return true;
}

static void pend_pop(struct tfab_shm_ep *ep, struct tfab_shm_conn *c, bool put)
{
	struct tfab_shm_op *op = c->pend;

	c->pend = op->next;
	if (!c->pend)
		c->pend_tail = NULL;
	c->npending--;
	if (put)
		tfab__freelist_put(&ep->ops, op);
}

/* Copies by CMA: 0 when done or out of budget, 1 to bounce instead, else a status. */
static int copy_cma(struct tfab_shm_ep *ep, struct tfab_shm_conn *c, struct tfab_shm_op *op,
		    size_t *budget)
{
	while (op->done < op->len && *budget) {
		size_t n = op->len - op->done < *budget ? op->len - op->done : *budget;
		struct iovec l = {.iov_base = (void *)(op->src + op->done), .iov_len = n};
		struct iovec r = {.iov_base = (void *)(uintptr_t)(op->raddr + op->done),
				  .iov_len = n};
		ssize_t got = process_vm_writev(c->pid, &l, 1, &r, 1, 0);

		if (got < 0) {
			int err = errno;

			if (err == EINTR)
				continue;
			if (err == EPERM || err == ENOSYS || err == EACCES) {
				/* Refused for this process (ptrace rules, seccomp): bounce from now. */
				if (!ep->no_cma)
					TFAB_INFO(SUBSYS,
						  "process_vm_writev to %d refused (%s): writes "
						  "bounce",
						  (int)c->pid, strerror(err));
				ep->no_cma = true;
				snprintf(ep->caps.domain, sizeof(ep->caps.domain), "bounce");
				return 1;
			}
			if (err == ESRCH) {
				c->dead = true;
				return -TFAB_ERR_PEER_FAILED;
			}
			TFAB_DEBUG(SUBSYS, "process_vm_writev: %s", strerror(err));
			return -TFAB_ERR_REMOTE_ACCESS;
		}
		if (got == 0)
			return -TFAB_ERR_REMOTE_ACCESS;
		op->done += (size_t)got;
		*budget -= (size_t)got < *budget ? (size_t)got : *budget;
	}
	return 0;
}

/* Moves the head write along: 0 when it is wholly in the ring, -EAGAIN when it must wait. */
static int op_progress(struct tfab_shm_ep *ep, struct tfab_shm_conn *c, struct tfab_shm_op *op,
		       size_t *budget)
{
	int rc;

	switch (op->path) {
	case PATH_INLINE:
		return post_inline(ep, c, op->src, op->len, op->raddr, op->rkey, op->imm, op->ctx,
				   op->inject)
			   ? 0
			   : -EAGAIN;
	case PATH_MAPPED:
		while (op->done < op->len && *budget) {
			size_t n = op->len - op->done < *budget ? op->len - op->done : *budget;

			tfab_shm_copy(op->dst + op->done, op->src + op->done, n,
				      op->len >= TFAB_SHM_NT_MIN);
			op->done += n;
			*budget -= n;
		}
		if (op->done < op->len || !tfab_shm_ring_room(c->head, c->acked, 1))
			return -EAGAIN;
		entry_start(c, TFAB_SHM_E_DIRECT, op->raddr, op->rkey, op->len, op->imm);
		entry_post(c, 1, op->ctx, op->inject, false, true);
		ep->stats.seg_writes++;
		ep->stats.seg_bytes += op->len;
		return 0;
	case PATH_CMA:
		rc = copy_cma(ep, c, op, budget);
		if (rc == 1) {
			op->path = PATH_BOUNCE;
			/* Bytes CMA placed already stay; the rest bounces. */
			return op_progress(ep, c, op, budget);
		}
		if (rc)
			return rc;
		if (op->done < op->len || !tfab_shm_ring_room(c->head, c->acked, 1))
			return -EAGAIN;
		entry_start(c, TFAB_SHM_E_DIRECT, op->raddr, op->rkey, op->len, op->imm);
		entry_post(c, 1, op->ctx, op->inject, false, true);
		ep->stats.cma_writes++;
		ep->stats.cma_bytes += op->len;
		return 0;
	case PATH_BOUNCE:
		while (op->done < op->len) {
			size_t n = op->len - op->done;
			unsigned b = (unsigned)(c->bounce_posted % TFAB_SHM_NBOUNCE);
			struct tfab_shm_entry *e;
			bool last;

			if (n > TFAB_SHM_BOUNCE_SIZE)
				n = TFAB_SHM_BOUNCE_SIZE;
			last = op->done + n == op->len;
			if (!*budget || c->bounce_posted - c->bounce_acked >= TFAB_SHM_NBOUNCE ||
			    !tfab_shm_ring_room(c->head, c->acked, 1))
				return -EAGAIN;
			memcpy(c->slot->bounce[b], op->src + op->done, n);
			e = entry_start(c, TFAB_SHM_E_BOUNCE, op->raddr + op->done, op->rkey, n,
					op->imm);
			e->total = op->len;
			e->bounce = b;
			e->flags = last ? TFAB_SHM_F_LAST : 0;
			entry_post(c, 1, last ? op->ctx : NULL, op->inject, true, last);
			c->bounce_posted++;
			op->done += n;
			*budget -= n < *budget ? n : *budget;
		}
		ep->stats.bounce_writes++;
		ep->stats.bounce_bytes += op->len;
		return 0;
	default:
		return -EINVAL;
	}
}

static void tx_progress(struct tfab_shm_ep *ep, struct tfab_shm_conn *c, size_t *budget)
{
	while (c->pend && !c->dead) {
		struct tfab_shm_op *op = c->pend;
		int rc = op_progress(ep, c, op, budget);

		if (rc == -EAGAIN)
			return;
		if (c->dead)
			return; /* the op stays queued and fails with the others */
		pend_pop(ep, c, rc == 0);
		if (rc)
			op_fail(ep, op, rc);
	}
}

static void ev_error(struct tfab_shm_ep *ep, struct tfab_event *ev, void *ctx, bool inject,
		     int status)
{
	memset(ev, 0, sizeof(*ev));
	ev->type = TFAB_EV_ERROR;
	ev->ctx = ctx;
	ev->injected = inject;
	ev->status = status;
	snprintf(ep->errmsg, sizeof(ep->errmsg), "%s",
		 status == -TFAB_ERR_PEER_FAILED ? "the peer process is gone or closed its endpoint"
		 : status == -TFAB_ERR_REMOTE_ACCESS
		     ? "remote access refused: bad key, or outside the region"
		     : tfab_strerror(status));
	ev->errmsg = ep->errmsg;
}

/* The writer's side: entries the target took become WRITE_DONE or ERROR events. */
static int tx_acks(struct tfab_shm_ep *ep, struct tfab_shm_conn *c, struct tfab_event *ev, int max)
{
	uint64_t tail = c->dead ? c->head : tfab_shm_ring_tail(&c->slot->ring);
	int n = 0;

	while (c->acked < tail && n < max) {
		struct tfab_shm_rec *rec = &c->recs[c->acked & (TFAB_SHM_RING_N - 1)];
		int status = c->dead ? -TFAB_ERR_PEER_FAILED
				     : tfab_shm_ring_at(&c->slot->ring, c->acked)->status;

		c->acked += rec->nent;
		if (rec->bounce)
			c->bounce_acked++;
		if (!rec->last) {
			if (status && !c->chunk_status)
				c->chunk_status = status;
			continue;
		}
		if (!status)
			status = c->chunk_status;
		c->chunk_status = 0;
		if (status)
			ev_error(ep, &ev[n++], rec->ctx, rec->inject, status);
		else if (!rec->inject) {
			memset(&ev[n], 0, sizeof(ev[n]));
			ev[n].type = TFAB_EV_WRITE_DONE;
			ev[n++].ctx = rec->ctx;
		}
	}
	/* A dead peer's queued writes fail too, in order, after those in the ring. */
	while (c->dead && c->acked == c->head && c->pend && n < max) {
		struct tfab_shm_op *op = c->pend;

		ev_error(ep, &ev[n++], op->ctx, op->inject, -TFAB_ERR_PEER_FAILED);
		c->chunk_status = 0;
		pend_pop(ep, c, true);
	}
	return n;
}

static bool peer_gone(struct tfab_shm_conn *c)
{
	return atomic_load_explicit(&c->peer->closed, memory_order_acquire) ||
	       tfab_shm_process_gone(c->pidfd, c->pid);
}

int tfab_shm_write_imm(struct tfab_ep *base, struct tfab_conn *peer, const void *lbuf, size_t len,
		       struct tfab_mr *lmr, uint64_t raddr, uint64_t rkey, uint32_t imm,
		       unsigned flags, void *ctx)
{
	struct tfab_shm_ep *ep = shm_ep(base);
	struct tfab_shm_conn *c = shm_conn(peer);
	bool inject = (flags & TFAB_WRITE_INJECT) != 0;
	struct tfab_shm_op *op;
	size_t budget = TFAB_SHM_BUDGET;
	int rc;

	(void)lmr;
	if (len > TFAB_SHM_MAX_MSG || (inject && len > TFAB_SHM_INLINE_MAX))
		return -EMSGSIZE;
	if (c->dead || atomic_load_explicit(&c->peer->closed, memory_order_relaxed)) {
		c->dead = true;
		return -TFAB_ERR_PEER_FAILED;
	}
	/* The fast path: nothing queued, room in the ring, no allocation. */
	if (!c->pend && len <= TFAB_SHM_INLINE_MAX) {
		if (post_inline(ep, c, lbuf, len, raddr, rkey, imm, ctx, inject))
			return 0;
		return -EAGAIN;
	}
	if (c->npending >= TFAB_SHM_MAX_PENDING)
		return -EAGAIN;
	op = tfab__freelist_get(&ep->ops);
	if (!op)
		return -ENOMEM;
	op->next = NULL;
	op->ctx = ctx;
	op->len = len;
	op->done = 0;
	op->raddr = raddr;
	op->rkey = rkey;
	op->imm = imm;
	op->inject = inject;
	op->status = 0;
	op->dst = NULL;
	op->src = lbuf;
	if (len <= TFAB_SHM_INLINE_MAX) {
		op->path = PATH_INLINE;
		if (inject) {
			memcpy(op->copy, lbuf, len);
			op->src = op->copy;
		}
	} else {
		rc = op_route(ep, c, op);
		if (rc) {
			op_fail(ep, op, rc);
			return 0;
		}
	}
	if (c->pend_tail)
		c->pend_tail->next = op;
	else
		c->pend = op;
	c->pend_tail = op;
	c->npending++;
	tx_progress(ep, c, &budget);
	return 0;
}

int tfab_shm_tx_failed(struct tfab_shm_ep *ep, struct tfab_event *ev, int max)
{
	int n = 0;

	while (ep->failed && n < max) {
		struct tfab_shm_op *op = ep->failed;

		ep->failed = op->next;
		if (!ep->failed)
			ep->failed_tail = NULL;
		ev_error(ep, &ev[n++], op->ctx, op->inject, op->status);
		tfab__freelist_put(&ep->ops, op);
	}
	return n;
}

int tfab_shm_tx_poll(struct tfab_shm_ep *ep, struct tfab_event *ev, int max, uint64_t *now_p)
{
	struct tfab_shm_conn *c, *next;
	size_t budget = TFAB_SHM_BUDGET;
	uint64_t now = *now_p;
	int n = 0;

	for (c = ep->conns; c; c = next) {
		next = c->next;
		if (!conn_busy(c))
			continue;
		tx_progress(ep, c, &budget);
		if (n < max)
			n += tx_acks(ep, c, ev + n, max - n);
		if (conn_busy(c) && !c->dead) {
			/* Waiting on the peer: is it still there? At most once a millisecond. */
			if (!now)
				now = tfab__coarse_ns();
			if (now - c->last_check >= TFAB_SHM_CHECK_NS) {
				c->last_check = now;
				if (peer_gone(c)) {
					TFAB_DEBUG(SUBSYS, "peer %d is gone", (int)c->pid);
					c->dead = true;
				}
			}
		} else if (!conn_busy(c)) {
			/* Idle again: the next wait is timed from here, not from long ago. */
			c->last_check = now ? now : tfab__coarse_ns();
		}
		if (c->closing && !conn_busy(c))
			tfab_shm_conn_release(ep, c);
	}
	/*
	 * The copy budget went: the first connection goes last, so that a long write to one peer
	 * does not hold back the long writes to the others poll after poll.
	 */
	if (!budget && ep->conns && ep->conns->next) {
		struct tfab_shm_conn *first = ep->conns, *last = first;

		while (last->next)
			last = last->next;
		ep->conns = first->next;
		first->next = NULL;
		last->next = first;
	}
	*now_p = now;
	return n;
}
