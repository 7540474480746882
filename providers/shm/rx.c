/*
 * The shm backend, the target's side: the consumer of its writers' rings. Each entry is
 * checked against this endpoint's registration table, inline and bounced bytes are copied into
 * place, a refusal goes back in the entry (a write taken leaves it as it was), and the slots
 * of writers that left or died are freed for others.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include <tfab/status.h>

#include "providers/shm/internal.h"
#include "util/log.h"

#define SUBSYS "shm"

/* A slot back to free, whatever it held: by its consumer only. */
static void rx_free_slot(struct tfab_shm_ep *ep, unsigned i)
{
	struct tfab_shm_slot *s = &ep->ctrl->slots[i];
	struct tfab_shm_rx *rx = &ep->rx[i];

	atomic_fetch_and_explicit(&ep->ctrl->active[i / 64], ~(1ull << (i % 64)),
				  memory_order_relaxed);
	for (unsigned k = 0; k < TFAB_SHM_RING_N; k++)
		atomic_store_explicit(&s->ring.e[k].seq, 0, memory_order_relaxed);
	atomic_store_explicit(&s->ring.tail, 0, memory_order_relaxed);
	if (rx->pidfd >= 0)
		close(rx->pidfd);
	rx->pidfd = -1;
	rx->live = false;
	rx->failed = false;
	atomic_store_explicit(&s->state, TFAB_SHM_SLOT_FREE, memory_order_release);
}

/* Where [raddr, raddr + len) lies in a region of regs open to remote writes, or NULL. */
static uint8_t *rx_check(struct tfab_shm_reg *regs, uint64_t rkey, uint64_t raddr, uint64_t len)
{
	struct reg_view v;

	if (!reg_read(regs, rkey, &v) || !reg_allows(&v, raddr, len))
		return NULL;
	return (uint8_t *)(uintptr_t)raddr;
}

void tfab_shm_entry_take(struct tfab_shm_ring *r, uint64_t i, struct tfab_shm_reg *regs,
			 uint8_t (*bounce)[TFAB_SHM_BOUNCE_SIZE], bool *failed,
			 struct tfab_shm_taken *t)
{
	/* Read once: the writer may change the entry while it is checked (ring.h). */
	const volatile struct tfab_shm_entry *e = tfab_shm_ring_at(r, i);
	uint8_t kind = e->kind, flags = e->flags;
	uint64_t len, total = e->total;
	uint32_t b = e->bounce;
	uint8_t *dst;

	memset(t, 0, sizeof(*t));
	t->imm = e->imm;
	t->raddr = e->raddr;
	t->rkey = e->rkey;
	t->claimed = len = e->len;
	t->nent = 1;
	t->report = true;
	if (kind == TFAB_SHM_E_INLINE) {
		/* The entries it spans follow from its length, at most the longest inline write. */
		if (len > TFAB_SHM_INLINE_MAX)
			len = TFAB_SHM_INLINE_MAX;
		t->nent = tfab_shm_inline_entries(len);
	}
	t->len = len;
	dst = rx_check(regs, t->rkey, t->raddr, t->claimed);
	if (!dst)
		t->status = -TFAB_ERR_REMOTE_ACCESS;
	switch (kind) {
	case TFAB_SHM_E_INLINE:
		if (dst && len == t->claimed)
			tfab_shm_ring_get_inline(r, i, dst, len);
		else
			t->status = -TFAB_ERR_REMOTE_ACCESS;
		break;
	case TFAB_SHM_E_DIRECT:
		break;
	case TFAB_SHM_E_BOUNCE:
		/* A chunk after a refused one lands nothing: the write has failed. */
		if (dst && !*failed && len <= TFAB_SHM_BOUNCE_SIZE)
			memcpy(dst, bounce[b % TFAB_SHM_NBOUNCE], len);
		else
			t->status = -TFAB_ERR_REMOTE_ACCESS;
		if (t->status)
			*failed = true;
		if (!(flags & TFAB_SHM_F_LAST)) {
			t->report = false;
		} else {
			if (*failed && !t->status)
				t->status = -TFAB_ERR_REMOTE_ACCESS;
			*failed = false;
			t->len = total;
		}
		break;
	default:
		t->status = -TFAB_ERR_PROTOCOL;
	}
	if (t->status)
		t->report = false;
	tfab_shm_ring_take(r, i, t->nent, t->status);
}

/*
 * A live connection of ours to the endpoint that owns slot s (REMOTE_WRITE's src): the writer
 * stamped its endpoint's id in the slot when it claimed it, and our connection to it mapped
 * that endpoint's segment, which says the same id. NULL while we have none.
 */
static struct tfab_conn *rx_src(struct tfab_shm_ep *ep, const struct tfab_shm_slot *s)
{
	for (struct tfab_shm_conn *c = ep->conns; c; c = c->next)
		if (!c->closing && c->peer && c->peer->ep_id == s->owner_ep)
			return &c->base;
	return NULL;
}

/* The target's side: takes one writer's entries, lands them, and gives its verdicts. */
static int rx_slot(struct tfab_shm_ep *ep, unsigned i, struct tfab_event *ev, int max)
{
	struct tfab_shm_slot *s = &ep->ctrl->slots[i];
	struct tfab_shm_rx *rx = &ep->rx[i];
	uint32_t state = atomic_load_explicit(&s->state, memory_order_acquire);
	uint64_t tail0 = atomic_load_explicit(&s->ring.tail, memory_order_relaxed), tail = tail0;
	struct tfab_conn *src = NULL;
	bool src_found = false;
	int n = 0;

	if (state != TFAB_SHM_SLOT_ACTIVE && state != TFAB_SHM_SLOT_CLOSING)
		return 0;
	if (!rx->live) {
		rx->live = true;
		rx->pid = s->owner_pid;
		rx->pidfd = tfab_shm_pidfd(rx->pid);
	}
	while (n < max && tfab_shm_ring_peek(&s->ring, tail) != NULL) {
		struct tfab_shm_taken t;

		tfab_shm_entry_take(&s->ring, tail, ep->ctrl->regs, s->bounce, &rx->failed, &t);
		if (t.status)
			TFAB_DEBUG(SUBSYS, "refused a write from %d: %llu bytes at %#llx key %#llx",
				   (int)rx->pid, (unsigned long long)t.claimed,
				   (unsigned long long)t.raddr, (unsigned long long)t.rkey);
		else if (t.report) {
			if (!src_found) {
				src = rx_src(ep, s);
				src_found = true;
			}
			memset(&ev[n], 0, sizeof(ev[n]));
			ev[n].type = TFAB_EV_REMOTE_WRITE;
			ev[n].src = src;
			ev[n].imm = t.imm;
			ev[n++].len = t.len;
		}
		tail += t.nent;
	}
	if (tail != tail0)
		tfab_shm_ring_release(&s->ring, tail);
	else if (state == TFAB_SHM_SLOT_CLOSING)
		rx_free_slot(ep, i); /* its writer left, and everything it wrote is taken */
	return n;
}

/* Frees the slots of writers whose process is gone (a SIGKILL leaves them claimed). */
void tfab_shm_rx_reap(struct tfab_shm_ep *ep)
{
	for (unsigned i = 0; i < TFAB_SHM_SLOTS; i++) {
		struct tfab_shm_rx *rx = &ep->rx[i];

		if (rx->live && tfab_shm_process_gone(rx->pidfd, rx->pid)) {
			TFAB_DEBUG(SUBSYS, "writer %d is gone: its slot %u is free", (int)rx->pid,
				   i);
			rx_free_slot(ep, i);
		}
	}
}

bool tfab_shm_rx_quiet(struct tfab_shm_ep *ep)
{
	for (unsigned w = 0; w < TFAB_SHM_SLOTS / 64; w++) {
		uint64_t bits = atomic_load_explicit(&ep->ctrl->active[w], memory_order_acquire);

		while (bits) {
			unsigned i = w * 64 + (unsigned)__builtin_ctzll(bits);
			struct tfab_shm_slot *s = &ep->ctrl->slots[i];

			bits &= bits - 1;
			/* rx_slot would start a writer up, or free a closing one's slot */
			if (atomic_load_explicit(&s->state, memory_order_acquire) !=
				TFAB_SHM_SLOT_ACTIVE ||
			    !ep->rx[i].live ||
			    tfab_shm_ring_peek(&s->ring, atomic_load_explicit(
							     &s->ring.tail, memory_order_relaxed)))
				return false;
		}
	}
	return true;
}

int tfab_shm_rx_poll(struct tfab_shm_ep *ep, struct tfab_event *ev, int max)
{
	int n = 0;

	for (unsigned w = 0; w < TFAB_SHM_SLOTS / 64 && n < max; w++) {
		uint64_t bits = atomic_load_explicit(&ep->ctrl->active[w], memory_order_acquire);

		while (bits && n < max) {
			unsigned b = (unsigned)__builtin_ctzll(bits);

			bits &= bits - 1;
			n += rx_slot(ep, w * 64 + b, ev + n, max - n);
		}
	}
	return n;
}
