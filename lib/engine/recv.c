/*
 * The receiver: a request holds the whole receive cycle. It starts from the meta-data cache
 * (allocate the destination, send TENSOR_REQUEST), takes a META_DATA reply (update the cache,
 * reallocate, request again), and ends when the content write's immediate names it, or with a
 * status (an ERROR reply, the peer's failure, a cleanup, an abort, a timeout).
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tfab/status.h>

#include "engine/engine.h"
#include "util/log.h"
#include "util/time.h"

#define SUBSYS TFAB_ENGINE_SUBSYS
#define REQ_SLOT_BITS 20
#define REQ_SLOT_MASK ((1u << REQ_SLOT_BITS) - 1)
#define REQ_GEN_MASK 0x7ffu
#define AHEAD_BYTES (4u << 20) /* the most the requests standing for one key hold */
#define AHEAD_PER_MSG 64u      /* the most standing requests one TENSOR_REQUEST posts */
/* The bytes of a control slot that one message of standing requests may fill. */
#define AHEAD_SLOT (TFAB_WIRE_MIN_SLOT * 3 / 4)

static int index_alloc(struct tfab_context *ctx, struct tfab_request *r)
{
	uint32_t slot;

	if (!ctx->req_nfree) {
		uint32_t cap = ctx->req_cap ? ctx->req_cap * 2 : 1024, old = ctx->req_cap;
		struct tfab_request **reqs;
		uint16_t *gen;
		uint32_t *fr, *owner;

		if (cap > REQ_SLOT_MASK + 1)
			cap = REQ_SLOT_MASK + 1;
		if (cap == old)
			return -ENOSPC;
		reqs = realloc(ctx->reqs, cap * sizeof(*reqs));
		if (!reqs)
			return -ENOMEM;
		ctx->reqs = reqs;
		gen = realloc(ctx->req_gen, cap * sizeof(*gen));
		if (!gen)
			return -ENOMEM;
		ctx->req_gen = gen;
		owner = realloc(ctx->req_owner, cap * sizeof(*owner));
		if (!owner)
			return -ENOMEM;
		ctx->req_owner = owner;
		fr = realloc(ctx->req_free, cap * sizeof(*fr));
		if (!fr)
			return -ENOMEM;
		ctx->req_free = fr;
		for (uint32_t i = old; i < cap; i++) {
			ctx->reqs[i] = NULL;
			ctx->req_gen[i] = 0;
			ctx->req_owner[i] = TFAB_NO_PEER;
		}
		/* Hand out low slots first. */
		for (uint32_t i = cap; i > old; i--)
			ctx->req_free[ctx->req_nfree++] = i - 1;
		ctx->req_cap = cap;
	}
	slot = ctx->req_free[--ctx->req_nfree];
	ctx->req_gen[slot] = (uint16_t)((ctx->req_gen[slot] + 1) & REQ_GEN_MASK);
	ctx->reqs[slot] = r;
	ctx->req_owner[slot] = r->peer->id;
	r->index = (uint32_t)ctx->req_gen[slot] << REQ_SLOT_BITS | slot;
	return 0;
}

static void index_free(struct tfab_context *ctx, struct tfab_request *r)
{
	uint32_t slot = r->index & REQ_SLOT_MASK;

	if (slot < ctx->req_cap && ctx->reqs[slot] == r) {
		ctx->reqs[slot] = NULL;
		ctx->req_free[ctx->req_nfree++] = slot;
	}
}

static struct tfab_request *request_find(struct tfab_context *ctx, uint32_t index)
{
	uint32_t slot = index & REQ_SLOT_MASK;
	struct tfab_request *r;

	if (index & TFAB_IMM_CTRL || slot >= ctx->req_cap)
		return NULL;
	r = ctx->reqs[slot];
	return r && r->index == index && r->state == TFAB_REQ_REQUESTED ? r : NULL;
}

/*
 * Release the destination; discard=true when the peer may still write into it (a request
 * just cancelled): a pool block waits for the peer's verdict, a caller's buffer is
 * deregistered.
 */
/*
 * A pool destination of n bytes for r, within what the requests to its peer may hold
 * (TFAB_PEER_MAX_INFLIGHT): the peer's meta-data sizes it, so a peer cannot make us take more.
 */
static int pool_dest(struct tfab_request *r, uint64_t n)
{
	struct tfab_context *ctx = r->ctx;
	struct tfab_peer *peer = r->peer;
	int rc;

	if (n > ctx->inflight_limit - peer->inflight) {
		TFAB_ERROR(SUBSYS,
			   "receive of '%s' step %lld from %s: a %llu-byte destination would put "
			   "%llu bytes in flight to the peer, past TFAB_PEER_MAX_INFLIGHT (%llu)",
			   r->key, (long long)r->step, tfab__peer_name(peer), (unsigned long long)n,
			   (unsigned long long)(peer->inflight + n),
			   (unsigned long long)ctx->inflight_limit);
		return -EMSGSIZE;
	}
	rc = tfab__pool_alloc_owned(ctx->pool, peer->path->index, n, &r->dest, &r->dest_mr,
				    &r->dest_owner);
	if (rc)
		return rc;
	r->dest_pool = true;
	r->dest_cap = n;
	peer->inflight += n;
	return 0;
}

static void dest_release(struct tfab_request *r, bool discard)
{
	struct tfab_context *ctx = r->ctx;

	if (r->dest_pool && r->dest)
		r->peer->inflight -= r->dest_cap;
	if (r->dest_pool && r->dest) {
		/*
		 * A failed peer returns no credits: its block is never reused (its writes may
		 * land), unless it left (LEAVE): all it wrote has landed
		 */
		if (discard && r->peer->left)
			tfab__pool_free(ctx->pool, r->dest);
		else if (discard && r->peer->failed)
			tfab__pool_discard(ctx->pool, r->dest);
		else if (discard)
			tfab__peer_hold_dest(r->peer, r->dest);
		else
			tfab__pool_free(ctx->pool, r->dest);
	} else if (r->dest_mr) {
		struct tfab_mr_cache *c = tfab__mr_cache_of(ctx, r->dest_mr);

		if (discard)
			tfab__mr_cache_invalidate(c, r->dest, r->dest_cap);
		tfab__mr_cache_put(c, r->dest_mr);
	}
	r->dest = NULL;
	r->dest_mr = NULL;
	r->dest_pool = false;
	r->dest_cap = 0;
	r->gpu_dest = NULL;
}

static void request_done(struct tfab_request *r, int status)
{
	struct tfab_context *ctx = r->ctx;

	r->state = TFAB_REQ_DONE;
	r->status = status;
	tfab__list_del(&r->link);
	tfab__list_del(&r->ahead_link); /* standing, it leaves its key's */
	tfab__list_init(&r->ahead_link);
	index_free(ctx, r);
	if (r->sync) {
		/* The waiter takes the result here: it depends on no thread delivering callbacks. */
		if (status == 0 && r->view_due) {
			r->out = tfab__view_new(&r->meta, r->user_dest);
			status = r->out ? 0 : -ENOMEM;
			r->view_due = false;
		}
		r->sync->status = status;
		r->sync->tensor = r->out;
		r->sync->strings = r->sout;
		r->sync->is_dead = r->is_dead;
		r->sync->done = true;
		r->sync = NULL;
		pthread_cond_broadcast(&ctx->cond);
	}
	/* Freed by tfab__ctx_unlock (after its callback, if it has one). */
	tfab__list_add_tail(&ctx->done_reqs, &r->done_link);
}

void tfab__request_fail(struct tfab_request *r, int status, bool tell_sender)
{
	/* Content that landed is all the sender writes: only a waiting destination is exposed. */
	bool exposed = r->dest_mr != NULL && r->state == TFAB_REQ_REQUESTED;

	if (r->state == TFAB_REQ_DONE)
		return;
	if (r->state == TFAB_REQ_CANCELLING) {
		/* given up already: only the peer's end can end it early */
		if (!tell_sender)
			tfab__request_cancelled(r, !r->peer->left);
		return;
	}
	TFAB_DEBUG(SUBSYS, "receive of '%s' step %lld from peer %u fails: %s%s", r->key,
		   (long long)r->step, r->peer->id, tfab_strerror(status),
		   tell_sender && !r->peer->failed ? " (cancel sent)" : "");
	if (tell_sender && !r->peer->failed) {
		struct tfab_wire_msg m = {.type = TFAB_MSG_CANCEL, .req_index = r->index};

		tfab__peer_send_msg(r->peer, &m);
		if (r->state == TFAB_REQ_DONE)
			return; /* the send failed the peer, and the peer this request */
		/* its content (or empty write) may be on its way: no lie until the CANCEL is read */
		if (r->state == TFAB_REQ_REQUESTED)
			tfab__peer_cancelled(r->peer, r->index);
		/*
		 * The application's own memory is not the library's to discard as a pool block
		 * is, nor to hand back while the peer may write into it: the receive ends once
		 * the peer has read the CANCEL (whatever it wrote before has landed then, and
		 * it writes nothing after), or with the peer.
		 */
		if (exposed && !r->dest_pool && !r->peer->failed) {
			r->status = status;
			tfab__peer_hold_request(r->peer, r);
			return;
		}
	}
	/*
	 * The sender may already be writing, a failed one too (a partition, a silence past the
	 * deadline: its connection outlives our verdict): never hand this memory out again
	 * registered.
	 */
	dest_release(r, exposed);
	request_done(r, status);
}

void tfab__request_cancelled(struct tfab_request *r, bool revoke)
{
	TFAB_DEBUG(SUBSYS, "receive of '%s' step %lld from peer %u: %s; ends: %s", r->key,
		   (long long)r->step, r->peer->id,
		   revoke ? "the peer may still write into its destination, which is revoked"
			  : "the peer read its CANCEL",
		   tfab_strerror(r->status));
	dest_release(r, revoke);
	request_done(r, r->status);
}

/* A shape in words for messages: "[2,8]". */
static const char *shape_str(const struct tfab_wire_meta *m, char *buf, size_t len)
{
	size_t n = (size_t)snprintf(buf, len, "[");

	for (unsigned i = 0; i < m->ndim && n < len; i++)
		n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? "," : "",
				      (long long)m->shape[i]);
	if (n < len)
		snprintf(buf + n, len - n, "]");
	return buf;
}

/*
 * Whether the caller's destination (its meta-data um) takes the tensor r->meta: the same dtype,
 * and the same shape unless TFAB_RECV_ANY_SHAPE, which asks only for room. Logged here.
 */
static int dest_fits(struct tfab_request *r, const struct tfab_wire_meta *um)
{
	const struct tfab_wire_meta *m = &r->meta;
	char a[400], b[400];

	if (um->dtype_code != m->dtype_code || um->dtype_bits != m->dtype_bits ||
	    um->dtype_lanes != m->dtype_lanes) {
		TFAB_ERROR(SUBSYS,
			   "receive of '%s' step %lld: the destination is %s, the tensor sent is "
			   "%s",
			   r->key, (long long)r->step, tfab__meta_dtype_name(um, a, sizeof(a)),
			   tfab__meta_dtype_name(m, b, sizeof(b)));
		return -EINVAL;
	}
	if (!(r->flags & TFAB_RECV_ANY_SHAPE) &&
	    (um->ndim != m->ndim ||
	     memcmp(um->shape, m->shape, sizeof(int64_t) * (size_t)m->ndim) != 0)) {
		TFAB_ERROR(SUBSYS,
			   "receive of '%s' step %lld: the destination's shape %s is not the "
			   "tensor's %s (TFAB_RECV_ANY_SHAPE takes any shape that fits)",
			   r->key, (long long)r->step, shape_str(um, a, sizeof(a)),
			   shape_str(m, b, sizeof(b)));
		return -EINVAL;
	}
	if (um->nbytes < m->nbytes) {
		TFAB_ERROR(SUBSYS,
			   "receive of '%s' step %lld: the destination holds %llu bytes, the "
			   "tensor %s has %llu",
			   r->key, (long long)r->step, (unsigned long long)um->nbytes,
			   shape_str(m, b, sizeof(b)), (unsigned long long)m->nbytes);
		return -EMSGSIZE;
	}
	return 0;
}

/* Check the caller's destination against r->meta and size it; r->meta_valid must be set. */
static int dest_prepare(struct tfab_request *r)
{
	struct tfab_context *ctx = r->ctx;
	uint64_t n = r->strings ? tfab__strings_capacity(ctx, r->meta.nbytes) : r->meta.nbytes;
	int rc;

	if (r->meta.is_dead)
		return 0;
	/* A destination is registered on the peer's path, which connecting chose. */
	if (!r->peer->path)
		return -ENOTCONN;
	if (r->user_dest) {
		struct tfab_wire_meta um;
		void *data;

		rc = tfab__meta_from_dltensor(r->user_dest, false, &um, &data);
		if (rc == 0)
			rc = dest_fits(r, &um);
		if (rc || n == 0)
			return rc;
		if (tfab__on_gpu(r->user_dest)) {
			/* Through a registered host proxy, copied to the GPU when it is full. */
			rc = pool_dest(r, n);
			if (rc == 0) {
				r->gpu_dest = data;
				tfab__pool_pin(ctx->pool, r->dest, ctx->cuda);
			}
			return rc;
		}
		rc = tfab__mr_cache_get(r->peer->path->mr_cache, data, um.nbytes,
					TFAB_MR_REMOTE_WRITE, &r->dest_mr);
		if (rc)
			return rc;
		r->dest = data;
		r->dest_cap = um.nbytes;
		return 0;
	}
	if (n == 0)
		return 0;
	rc = pool_dest(r, n);
	if (rc)
		return rc;
	return 0;
}

/* Where r's content goes, as the sender sees it. */
static struct tfab_wire_ahead request_dest(const struct tfab_request *r)
{
	struct tfab_wire_ahead d = {.req_index = r->index};

	if (r->dest_mr) {
		d.dest_raddr =
		    r->dest_mr->raddr + (uint64_t)((char *)r->dest - (char *)r->dest_mr->addr);
		d.dest_rkey = r->dest_mr->rkey;
	}
	return d;
}

/*
 * r's TENSOR_REQUEST into *m. e: the key's meta-data entry, or NULL (then the request names
 * the key in full); its key index names the key where it can.
 */
static void request_msg(struct tfab_request *r, struct tfab_meta_entry *e, struct tfab_wire_msg *m)
{
	struct tfab_wire_ahead d = request_dest(r);

	tfab__wire_msg_init(m, TFAB_MSG_TENSOR_REQUEST);
	m->req_index = r->index;
	m->step_id = r->step;
	m->key_len = r->key_len;
	m->key = (const uint8_t *)r->key;
	m->dest_raddr = d.dest_raddr;
	m->dest_rkey = d.dest_rkey;
	m->dest_capacity = r->dest_mr ? r->dest_cap : 0;
	if (r->meta_valid) {
		m->flags |= TFAB_MSGF_META_VALID;
		tfab__meta_copy(&m->meta, &r->meta);
	}
	tfab__key_index_request(r->peer, e, m);
}

/*
 * Send m, which request_msg made for e's key; or queue it (queue), for the next flush to write
 * with the others queued.
 */
static int request_msg_send(struct tfab_peer *peer, const struct tfab_wire_msg *m,
			    struct tfab_meta_entry *e, bool queue)
{
	int rc = queue ? tfab__peer_queue_msg(peer, m) : tfab__peer_send_msg(peer, m);

	if (rc && m->key_len && (m->flags & TFAB_MSGF_KEY_INDEX))
		e->key_index = 0; /* not announced after all */
	return rc;
}

static int request_send(struct tfab_request *r, bool rerequest, struct tfab_meta_entry *e)
{
	struct tfab_wire_msg m;

	request_msg(r, e, &m);
	if (rerequest) {
		m.flags |= TFAB_MSGF_REREQUEST;
		r->ctx->stats.rerequests++;
	}
	return request_msg_send(r->peer, &m, e, false);
}

/*
 * The sender answered r (content, or meta-data that completes it) and waits for our verdict:
 * a receive that succeeds took the tensor (TAKEN); one that fails here after all leaves it to
 * a later receive (CANCEL).
 */
static void request_answered(struct tfab_request *r, int status)
{
	struct tfab_peer *peer = r->peer;

	if (status == 0) {
		request_done(r, 0);
		return;
	}
	if (!peer->failed) {
		struct tfab_wire_msg m = {.type = TFAB_MSG_CANCEL, .req_index = r->index};

		tfab__peer_send_msg(peer, &m);
		if (r->state == TFAB_REQ_DONE)
			return; /* the send failed the peer, and the peer this request */
	}
	request_done(r, status);
}

/* The receive takes what landed for r: the sender's verdict, and r's result. */
static void request_take(struct tfab_request *r, uint64_t nbytes)
{
	struct tfab_context *ctx = r->ctx;
	bool queued;
	int rc;

	r->is_dead = r->meta.is_dead;
	/* The verdict first: past this point the receive cannot fail for want of room for it. */
	rc = tfab__peer_taken(r->peer, r->index, r->lazy_taken);
	queued = rc == 0;
	if (rc) {
		TFAB_ERROR(SUBSYS, "receive of '%s' step %lld from %s: no memory for its verdict",
			   r->key, (long long)r->step, tfab__peer_name(r->peer));
	} else if (r->strings) {
		rc = tfab__strings_complete(r, r->dest, nbytes);
	} else if (!r->is_dead) {
		if (r->gpu_dest && nbytes) {
			rc = tfab__cuda_copy(ctx->cuda, r->gpu_dest, r->dest, nbytes, true);
			ctx->stats.bytes_copied += nbytes;
		}
		/*
		 * The pool block handed over; or, for the caller's tensor, a view of what
		 * landed in it (its shape may be another), made when the result is handed out
		 * (request_done, deliver) so that a burst of completions allocates no burst of
		 * views.
		 */
		if (rc == 0 && r->user_dest)
			r->view_due = true;
		else if (rc == 0)
			r->out = r->dest_pool
				     ? tfab__managed_new(ctx, &r->meta, r->dest, r->dest_owner)
				     : tfab__managed_new(ctx, &r->meta, NULL, NULL);
		if (rc == 0 && !r->out && !r->view_due)
			rc = -ENOMEM;
		if (r->out && !r->user_dest) {
			/* The managed tensor owns the block now: the application's, not in flight. */
			r->peer->inflight -= r->dest_cap;
			r->dest = NULL;
			r->dest_mr = NULL;
			r->dest_pool = false;
			r->dest_owner = NULL;
		}
	}
	if (rc == 0)
		ctx->stats.requests++;
	else if (queued)
		r->peer->ntaken--; /* not taken after all: still the last one queued */
	TFAB_DEBUG(SUBSYS, "receive of '%s' step %lld from peer %u: %s (%llu bytes)", r->key,
		   (long long)r->step, r->peer->id, rc ? tfab_strerror(rc) : "done",
		   (unsigned long long)nbytes);
	dest_release(r, false);
	request_answered(r, rc);
}

/* r's content (or its absence) landed: its receive takes it, or, standing, waits for one. */
static void request_complete(struct tfab_request *r, uint64_t nbytes)
{
	struct tfab_meta_entry *e = tfab__peer_meta_find(r->peer, r->key, r->key_len);

	/* A caller's layout the sender confirmed by writing is the key's meta-data now. */
	if (!e || !tfab__wire_meta_equal(&e->meta, &r->meta)) {
		tfab__peer_meta_store(r->peer, r->key, r->key_len, &r->meta);
		if (r->state == TFAB_REQ_DONE)
			return; /* an eviction's cancel failed the peer, and r with it */
	}
	r->ctx->stats.bytes_received += nbytes;
	if (r->standing) {
		r->state = TFAB_REQ_LANDED;
		return;
	}
	request_take(r, nbytes);
}

/*
 * A content write for index that names no request waiting for the writer's content (src; NULL
 * where the backend cannot tell). A request of ours that we cancelled may still be written
 * until the writer read the CANCEL; anything else is refused: an index of no request,
 * another peer's, a stale generation, or a request that has its content. Whether it was.
 */
static bool content_refused(struct tfab_context *ctx, uint32_t index, struct tfab_peer *src,
			    struct tfab_request *live)
{
	uint32_t slot = index & REQ_SLOT_MASK;
	uint32_t owner = slot < ctx->req_cap ? ctx->req_owner[slot] : TFAB_NO_PEER;
	struct tfab_peer *o = owner < ctx->peer_cap ? ctx->peer_by_id[owner] : NULL;
	const char *why;
	char what[160];

	if (live && src && !tfab__peer_same_endpoint(live->peer, src)) {
		why = "another peer's request";
	} else if (live && src) {
		why = "a request not waiting for content";
	} else if (src ? tfab__peer_was_cancelled(src, index)
		       : !live && o && tfab__peer_was_cancelled(o, index)) {
		TFAB_DEBUG(SUBSYS, "content for request %#x, which we cancelled: dropped", index);
		return false;
	} else if (!live && !o && owner != TFAB_NO_PEER) {
		TFAB_DEBUG(SUBSYS, "content for request %#x of a peer gone: dropped", index);
		return false;
	} else if (!src) {
		/* no writer to refuse: counted and dropped */
		ctx->stats.refused++;
		TFAB_DEBUG(SUBSYS, "content for request %#x, which is not waiting: refused", index);
		return true;
	} else if (o && !tfab__peer_same_endpoint(o, src)) {
		why = "another peer's request (a stale one)";
	} else if (o) {
		why = "a stale generation of its request";
	} else {
		why = "no request";
	}
	snprintf(what, sizeof(what), "a content write naming %s (index %#x)", why, index);
	tfab__peer_refuse(src, what);
	return true;
}

void tfab__recv_on_content(struct tfab_context *ctx, uint32_t index, uint64_t len, uint32_t src_id)
{
	struct tfab_request *r = request_find(ctx, index);
	struct tfab_peer *src = src_id < ctx->peer_cap ? ctx->peer_by_id[src_id] : NULL;
	uint32_t slot = index & REQ_SLOT_MASK;
	/* (one cancelling is no longer waiting: what lands for it is a write before the CANCEL) */
	struct tfab_request *live = slot < ctx->req_cap && ctx->reqs[slot] &&
					    ctx->reqs[slot]->index == index &&
					    ctx->reqs[slot]->state != TFAB_REQ_CANCELLING
					? ctx->reqs[slot]
					: NULL;
	/* a tensor with no content is answered by a zero-byte write, into no destination */
	bool empty = r && r->meta_valid && (r->meta.is_dead || r->meta.nbytes == 0) && len == 0 &&
		     !r->dest_mr && r->state == TFAB_REQ_REQUESTED;

	if (src_id != TFAB_NO_PEER && !src)
		return; /* from a peer destroyed since */
	if (src && src->failed)
		return; /* nothing more is taken from it */
	if (r && src && !tfab__peer_same_endpoint(r->peer, src))
		r = NULL; /* another peer's request: refused below */
	if (!r || (!r->dest_mr && !empty)) {
		content_refused(ctx, index, src, live);
		return;
	}
	TFAB_TRACE(SUBSYS, "content for '%s' step %lld from peer %u landed: %llu bytes", r->key,
		   (long long)r->step, r->peer->id, (unsigned long long)len);
	/* A string tensor's may be smaller or larger than asked for: its length says. */
	if (r->strings && !empty) {
		uint64_t n;

		if (tfab__strings_landed(r, &n)) {
			tfab__request_fail(r, -TFAB_ERR_PROTOCOL, true);
			return;
		}
		r->meta.nbytes = n;
	}
	if (len && len != r->meta.nbytes) {
		TFAB_ERROR(SUBSYS,
			   "receive of '%s' step %lld from %s: %llu bytes landed, %llu "
			   "expected",
			   r->key, (long long)r->step, tfab__peer_name(r->peer),
			   (unsigned long long)len, (unsigned long long)r->meta.nbytes);
		tfab__request_fail(r, -TFAB_ERR_PROTOCOL, true);
		return;
	}
	request_complete(r, r->meta.nbytes);
}

/*
 * The key's meta-data changed to meta at r's step: the requests standing for later steps
 * were sized for the old one. They are cancelled, for the next receive to post anew, rather
 * than each costing the sender a META_DATA reply.
 */
static void ahead_stale(struct tfab_request *r, const struct tfab_wire_meta *meta)
{
	struct tfab_meta_entry *e = tfab__peer_meta_find(r->peer, r->key, r->key_len);
	struct tfab_list *l, *t;

	if (!e)
		return;
	tfab_list_for_each_safe(l, t, &e->ahead)
	{
		struct tfab_request *s = tfab_container_of(l, struct tfab_request, ahead_link);

		if (s != r && s->step > r->step && s->state == TFAB_REQ_REQUESTED &&
		    !tfab__wire_meta_equal(&s->meta, meta)) {
			tfab__request_fail(s, -ECANCELED, true);
			if (r->peer->failed)
				return;
		}
	}
}

void tfab__recv_on_msg(struct tfab_peer *peer, const struct tfab_wire_msg *m)
{
	struct tfab_request *r = request_find(peer->ctx, m->req_index);
	int rc;

	if (r && !tfab__peer_same_endpoint(r->peer, peer)) {
		char what[96];

		snprintf(what, sizeof(what), "a %s naming another peer's request (index %#x)",
			 m->type == TFAB_MSG_ERROR ? "ERROR" : "META_DATA", m->req_index);
		tfab__peer_refuse(peer, what);
		return;
	}
	if (!r || r->peer != peer) {
		TFAB_DEBUG(SUBSYS, "a reply for request %#x, which is not waiting: dropped",
			   m->req_index);
		return;
	}
	if (m->type == TFAB_MSG_ERROR) {
		TFAB_WARN(SUBSYS,
			  "receive of '%s' step %lld from %s: the sender failed it: %s (%.*s)",
			  r->key, (long long)r->step, tfab__peer_name(peer),
			  tfab_strerror(m->status), (int)m->errmsg_len, m->errmsg ? m->errmsg : "");
		tfab__request_fail(r, m->status, false);
		return;
	}
	/* A sender's tensor is fixed per step: it needs one META_DATA, not a stream of them. */
	if (!(m->flags & TFAB_MSGF_COMPLETE) && ++r->meta_replies > TFAB_MAX_META_REPLIES) {
		char what[TFAB_MAX_KEY + 160];

		snprintf(what, sizeof(what),
			 "META_DATA storm: receive of '%s' step %lld answered with meta-data %u "
			 "times (at most %u)",
			 r->key, (long long)r->step, (unsigned)r->meta_replies,
			 TFAB_MAX_META_REPLIES);
		tfab__peer_refuse(peer, what);
		return;
	}
	r->since_ms = tfab__coarse_ms(); /* an answer: the peer is working on it */
	/* META_DATA: the sender's tensor differs from what we asked for, or needs no content. */
	if ((m->meta.dtype_code == TFAB_WIRE_DTYPE_STRING) != r->strings) {
		TFAB_ERROR(SUBSYS,
			   "receive of '%s' step %lld from %s: the sender has a %s tensor: "
			   "use %s",
			   r->key, (long long)r->step, tfab__peer_name(peer),
			   r->strings ? "DLPack" : "string",
			   r->strings ? "tfab_recv" : "tfab_recv_strings");
		/* Our cancel leaves the send to a receive of the right kind. */
		tfab__request_fail(r, -EPROTOTYPE, true);
		return;
	}
	rc = tfab__peer_meta_store(peer, r->key, r->key_len, &m->meta);
	if (r->state == TFAB_REQ_DONE)
		return; /* an eviction's cancel failed the peer, and r with it */
	if (rc) {
		tfab__request_fail(r, rc, true);
		return;
	}
	ahead_stale(r, &m->meta);
	if (r->state == TFAB_REQ_DONE)
		return;		/* a cancel failed the peer, and r with it */
	dest_release(r, false); /* the sender does not write into a mismatched destination */
	tfab__meta_copy(&r->meta, &m->meta);
	r->meta_valid = true;
	TFAB_DEBUG(SUBSYS, "receive of '%s' step %lld: meta-data from peer %u%s", r->key,
		   (long long)r->step, peer->id,
		   (m->flags & TFAB_MSGF_COMPLETE) ? " (complete: no content)" : "");
	/* A caller's destination is checked even where no content comes (an empty tensor). */
	rc = dest_prepare(r);
	if (rc == 0 && (m->flags & TFAB_MSGF_COMPLETE)) {
		request_complete(r, 0);
		return;
	}
	if (rc == 0)
		rc = request_send(r, true, tfab__peer_meta_find(peer, r->key, r->key_len));
	if (rc)
		tfab__request_fail(r, rc, true);
}

/* A new request of (key, step) from peer, with its index: the rest is the caller's to fill. */
static int request_new(struct tfab_context *ctx, struct tfab_peer *peer, const char *key,
		       uint16_t key_len, int64_t step, struct tfab_request **r_p)
{
	struct tfab_request *r = tfab__freelist_get(&ctx->req_fl);
	int rc;

	if (!r)
		return -ENOMEM;
	memset(r, 0, offsetof(struct tfab_request, meta));
	r->ctx = ctx;
	r->peer = peer;
	r->step = step;
	r->key_len = key_len;
	memcpy(r->key, key, key_len);
	r->key[key_len] = '\0';
	r->state = TFAB_REQ_REQUESTED;
	r->since_ms = tfab__coarse_ms();
	tfab__list_init(&r->link);
	tfab__list_init(&r->done_link);
	tfab__list_init(&r->ahead_link);
	rc = index_alloc(ctx, r);
	if (rc) {
		tfab__freelist_put(&ctx->req_fl, r);
		return rc;
	}
	*r_p = r;
	return 0;
}

/* A request that never went: its destination and index back. */
static void request_discard(struct tfab_request *r)
{
	dest_release(r, false);
	index_free(r->ctx, r);
	tfab__freelist_put(&r->ctx->req_fl, r);
}

/*
 * No-request mode (doc/design.md): requests posted ahead of their receives, standing on the
 * key's meta-data entry until a receive of their step takes one over.
 */

/* A standing request for step of e's key, sized from e, not yet sent. */
static int ahead_new(struct tfab_peer *peer, struct tfab_meta_entry *e, int64_t step,
		     struct tfab_request **r_p)
{
	struct tfab_request *r;
	int rc = request_new(peer->ctx, peer, e->key, e->key_len, step, &r);

	if (rc)
		return rc;
	r->standing = true;
	r->lazy_taken = true;
	tfab__meta_copy(&r->meta, &e->meta);
	r->meta_valid = true;
	rc = dest_prepare(r);
	if (rc) {
		request_discard(r);
		return rc;
	}
	*r_p = r;
	return 0;
}

/*
 * Post n standing requests of consecutive steps (rs[0] first) in one TENSOR_REQUEST with
 * AHEAD, queued for the next flush; each stands on e once it went. Those that could not go
 * are discarded.
 */
static int ahead_send(struct tfab_peer *peer, struct tfab_meta_entry *e, struct tfab_request **rs,
		      struct tfab_wire_ahead *dests, unsigned n)
{
	struct tfab_wire_msg m;
	int rc;

	request_msg(rs[0], e, &m);
	for (unsigned i = 1; i < n; i++)
		dests[i - 1] = request_dest(rs[i]);
	if (n > 1) {
		m.flags |= TFAB_MSGF_AHEAD;
		m.nahead = (uint16_t)(n - 1);
		m.ahead = dests;
	}
	rc = request_msg_send(peer, &m, e, true);
	for (unsigned i = 0; i < n; i++) {
		if (rc) {
			request_discard(rs[i]);
			continue;
		}
		tfab__list_add_tail(&peer->requests, &rs[i]->link);
		tfab__list_add_tail(&e->ahead, &rs[i]->ahead_link);
		peer->ctx->stats.requests_ahead++;
	}
	return rc;
}

/*
 * A receive of step came for e's key: the standing request of that step, if a receive into
 * a library tensor (take) may have it, else NULL. Those of earlier steps (skipped), and one
 * of this step that the receive cannot take, are cancelled.
 */
static struct tfab_request *ahead_find(struct tfab_peer *peer, struct tfab_meta_entry *e,
				       int64_t step, bool take)
{
	struct tfab_list *l, *t;

	tfab_list_for_each_safe(l, t, &e->ahead)
	{
		struct tfab_request *s = tfab_container_of(l, struct tfab_request, ahead_link);

		if (s->step > step)
			break; /* posted in step order */
		if (s->step == step && take)
			return s;
		tfab__request_fail(s, -ECANCELED, true);
		if (peer->failed)
			return NULL;
	}
	return NULL;
}

/*
 * How many standing requests, rs[0]'s step first, go in one message: as many as fit a control
 * slot with room left for the TAKEN indexes that ride on it (the first at its longest: the
 * whole key, announcing an index).
 */
static unsigned ahead_room(const struct tfab_request *r)
{
	struct tfab_wire_msg m = {
	    .type = TFAB_MSG_TENSOR_REQUEST,
	    .flags = TFAB_MSGF_META_VALID | TFAB_MSGF_KEY_INDEX,
	    .key_len = r->key_len,
	    .key = (const uint8_t *)r->key,
	    .meta = r->meta,
	};
	size_t fit = tfab__wire_ahead_room(&m, AHEAD_SLOT) + 1;

	return fit < AHEAD_PER_MSG ? (unsigned)fit : AHEAD_PER_MSG;
}

/*
 * After a receive of step: keep depth requests standing beyond it (fewer for large tensors),
 * posting the next half of them at once when half have been taken (one control write for
 * them all, the waiting TAKEN indexes riding on it). What cannot be posted leaves its receive
 * to request as usual.
 */
static void ahead_refill(struct tfab_peer *peer, struct tfab_meta_entry *e, int64_t step,
			 unsigned depth)
{
	uint64_t bytes = peer->ctx->cfg.pool_cache / 8, nbytes = e->meta.nbytes;
	struct tfab_request *rs[AHEAD_PER_MSG];
	struct tfab_wire_ahead dests[AHEAD_PER_MSG];
	int64_t last = step;
	unsigned n = 0, k = 0, per_msg = 1;
	struct tfab_list *l;
	int rc = 0;

	/*
	 * What stands for one key holds at most AHEAD_BYTES and an eighth of the pool's cache,
	 * and at least one tensor: a large tensor's write outlasts a request's round trip, so
	 * one or two standing hide it, and more only spread the receiver over cold memory.
	 */
	if (bytes > AHEAD_BYTES)
		bytes = AHEAD_BYTES;
	if (nbytes && depth > bytes / nbytes)
		depth = bytes / nbytes ? (unsigned)(bytes / nbytes) : 1;

	for (l = e->ahead.next; l != &e->ahead; l = l->next) {
		int64_t at = tfab_container_of(l, struct tfab_request, ahead_link)->step;

		n += at > step;
		last = at > last ? at : last;
	}
	if (n > depth / 2)
		return;
	for (unsigned i = 1; i <= depth && step <= INT64_MAX - (int64_t)i; i++) {
		int64_t s = step + (int64_t)i;

		if (s <= last)
			continue;
		rc = ahead_new(peer, e, s, &rs[k]);
		if (rc)
			break;
		if (k++ == 0)
			per_msg = ahead_room(rs[0]);
		if (k == per_msg) {
			rc = ahead_send(peer, e, rs, dests, k);
			k = 0;
			if (rc)
				break;
		}
	}
	if (k) {
		int sr = ahead_send(peer, e, rs, dests, k);

		rc = rc ? rc : sr;
	}
	if (rc)
		TFAB_DEBUG(SUBSYS, "'%.*s' from peer %u: fewer steps requested ahead: %s",
			   (int)e->key_len, e->key, peer->id, tfab_strerror(rc));
}

/* A receive takes over the standing request r: its owner now, and the tensor if it landed. */
static void ahead_adopt(struct tfab_request *r, const struct tfab_recv_args *a,
			struct tfab_sync_wait *sync)
{
	struct tfab_context *ctx = r->ctx;

	tfab__list_del(&r->ahead_link);
	tfab__list_init(&r->ahead_link);
	r->standing = false;
	r->since_ms = tfab__coarse_ms(); /* an operation from now */
	r->cb = a->cb;
	r->arg = a->arg;
	r->sync = sync;
	ctx->stats.meta_hits++;
	ctx->stats.ahead_taken++;
	TFAB_DEBUG(SUBSYS, "receive of '%s' step %lld from peer %u: request %#x, posted ahead%s",
		   r->key, (long long)r->step, r->peer->id, r->index,
		   r->state == TFAB_REQ_LANDED ? ", landed" : "");
	if (r->state == TFAB_REQ_LANDED)
		request_take(r, r->meta.nbytes);
}

void tfab__recv_deadlines(struct tfab_peer *peer, uint64_t now_ms)
{
	uint64_t limit = peer->ctx->cfg.op_timeout_ms;
	struct tfab_list *l, *t;

	if (!limit || peer->failed)
		return;
	tfab_list_for_each_safe(l, t, &peer->cancelling)
	{
		struct tfab_request *r = tfab_container_of(l, struct tfab_request, link);

		if (now_ms - r->since_ms < limit)
			continue;
		TFAB_WARN(SUBSYS,
			  "receive of '%s' step %lld from peer %u: the peer has not read its "
			  "CANCEL in %llu ms (TFAB_OP_TIMEOUT_MS); the destination is revoked (a "
			  "write into it now fails the peer)",
			  r->key, (long long)r->step, peer->id,
			  (unsigned long long)(now_ms - r->since_ms));
		tfab__request_cancelled(r, true);
	}
	tfab_list_for_each_safe(l, t, &peer->requests)
	{
		struct tfab_request *r = tfab_container_of(l, struct tfab_request, link);

		/* Standing requests are no operation yet; blocking receives have their own. */
		if (r->standing || r->sync || r->state != TFAB_REQ_REQUESTED ||
		    now_ms - r->since_ms < limit)
			continue;
		TFAB_WARN(SUBSYS,
			  "receive of '%s' step %lld from %s: nothing from the peer for %llu ms "
			  "(waiting for the tensor: its content, or meta-data); failed "
			  "(TFAB_OP_TIMEOUT_MS)",
			  r->key, (long long)r->step, tfab__peer_name(peer),
			  (unsigned long long)(now_ms - r->since_ms));
		tfab__request_fail(r, -TFAB_ERR_TIMEOUT, true);
		if (peer->failed)
			return;
	}
}

void tfab__ahead_drop(struct tfab_meta_entry *e)
{
	while (!tfab__list_empty(&e->ahead))
		tfab__request_fail(
		    tfab_container_of(e->ahead.next, struct tfab_request, ahead_link), -ECANCELED,
		    true);
}

/* Start a receive: the request and its first TENSOR_REQUEST, or the one posted ahead. */
static int recv_start(struct tfab_context *ctx, struct tfab_peer *peer, const char *key,
		      int64_t step, const struct tfab_recv_args *a, struct tfab_sync_wait *sync,
		      struct tfab_request **r_p)
{
	struct tfab_meta_entry *e;
	struct tfab_request *r;
	struct tfab_wire_meta um;
	size_t key_len;
	unsigned depth = 0;
	void *data;
	int rc;

	if (!ctx || !peer || peer->ctx != ctx || !(a->cb || a->scb || sync) ||
	    (a->strings ? a->cb || a->dest : a->scb != NULL) ||
	    (a->flags & ~(unsigned)TFAB_RECV_ANY_SHAPE))
		return -EINVAL;
	rc = tfab__check_key(key, &key_len);
	if (rc)
		return rc;
	if (a->dest) {
		rc = tfab__meta_from_dltensor(a->dest, false, &um, &data);
		if (rc == 0)
			rc = tfab__check_gpu(ctx, a->dest);
		if (rc)
			return rc;
	} else if (a->like) {
		/* like has no data: read as a dead tensor's, which needs none */
		rc = tfab__meta_from_dltensor(a->like, true, &um, &data);
		if (rc)
			return rc;
		um.is_dead = false;
	}
	if (ctx->abort_status)
		return ctx->abort_status;
	if (peer->failed)
		return peer->failed;
	e = tfab__peer_meta_find(peer, key, (uint16_t)key_len);
	if (e && !tfab__list_empty(&e->ahead)) {
		/* Only a receive into a library tensor takes what was posted ahead. */
		r = ahead_find(peer, e, step, !a->dest && !a->like && !a->strings);
		if (peer->failed)
			return peer->failed;
		if (r) {
			ahead_adopt(r, a, sync);
			ahead_refill(peer, e, step,
				     tfab__ahead_depth(peer, key, (uint16_t)key_len));
			if (r_p)
				*r_p = r;
			return 0;
		}
	}
	/* A key that changed kind is a miss: never size a string for a DLPack receive. */
	if (e && (e->meta.dtype_code == TFAB_WIRE_DTYPE_STRING) != a->strings)
		e = NULL;
	rc = request_new(ctx, peer, key, (uint16_t)key_len, step, &r);
	if (rc)
		return rc;
	r->user_dest = a->dest;
	r->flags = a->flags;
	r->cb = a->cb;
	r->scb = a->scb;
	r->strings = a->strings;
	r->arg = a->arg;
	r->sync = sync;
	if (e) {
		ctx->stats.meta_hits++;
		tfab__meta_copy(&r->meta, &e->meta);
		r->meta_valid = true;
		if (!a->dest && !a->like && !a->strings)
			depth = tfab__ahead_depth(peer, key, (uint16_t)key_len);
	} else {
		ctx->stats.meta_misses++;
		memset(&r->meta, 0, offsetof(struct tfab_wire_meta, shape));
	}
	/*
	 * A caller's destination says what it expects: ask for exactly that, or, taking any
	 * shape that fits, for what the key had last if it fits (else the round trip tells).
	 */
	if (a->dest) {
		r->meta_valid = true;
		if (!e || !(r->flags & TFAB_RECV_ANY_SHAPE) || e->meta.is_dead ||
		    e->meta.dtype_code != um.dtype_code || e->meta.dtype_bits != um.dtype_bits ||
		    e->meta.dtype_lanes != um.dtype_lanes || e->meta.nbytes > um.nbytes)
			tfab__meta_copy(&r->meta, &um);
	} else if (a->like) {
		r->meta_valid = true;
		tfab__meta_copy(&r->meta, &um);
	}
	rc = r->meta_valid ? dest_prepare(r) : 0;
	if (rc == 0)
		rc = request_send(r, false, e);
	if (rc) {
		request_discard(r);
		return rc;
	}
	TFAB_DEBUG(SUBSYS, "receive of '%s' step %lld from peer %u: request %#x%s", r->key,
		   (long long)step, peer->id, r->index,
		   r->meta_valid ? "" : " (no meta-data cached: a META_DATA reply first)");
	tfab__list_add_tail(&peer->requests, &r->link);
	if (depth)
		ahead_refill(peer, e, step, depth);
	if (r_p)
		*r_p = r;
	return 0;
}

int tfab__recv_post(struct tfab_context *ctx, struct tfab_peer *peer, const char *key, int64_t step,
		    const struct tfab_recv_args *a)
{
	int rc;

	if (!ctx)
		return -EINVAL;
	tfab__ctx_lock(ctx);
	rc = recv_start(ctx, peer, key, step, a, NULL, NULL);
	if (rc == 0)
		tfab__peers_flush(ctx, false);
	tfab__ctx_unlock(ctx);
	return rc;
}

int tfab_recv(struct tfab_context *ctx, struct tfab_peer *peer, const char *key, int64_t step_id,
	      DLTensor *dest, tfab_recv_cb cb, void *arg)
{
	struct tfab_recv_args a = {.dest = dest, .cb = cb, .arg = arg};

	if (!cb)
		return -EINVAL;
	if (tfab__check_step("receive", key, step_id))
		return -EINVAL;
	return tfab__recv_post(ctx, peer, key, step_id, &a);
}

int tfab_recv_into(struct tfab_context *ctx, struct tfab_peer *peer, const char *key,
		   int64_t step_id, DLTensor *dest, unsigned flags, tfab_recv_cb cb, void *arg)
{
	struct tfab_recv_args a = {.dest = dest, .flags = flags, .cb = cb, .arg = arg};

	if (!cb || !dest)
		return -EINVAL;
	if (tfab__check_step("receive", key, step_id))
		return -EINVAL;
	return tfab__recv_post(ctx, peer, key, step_id, &a);
}

int tfab__recv_wait(struct tfab_context *ctx, struct tfab_peer *peer, const char *key, int64_t step,
		    const struct tfab_recv_args *a, int timeout_ms, DLManagedTensor **tensor_p,
		    struct tfab_string_tensor **strings_p, bool *is_dead_p)
{
	struct tfab_sync_wait w = {0};
	struct tfab_request *r = NULL;
	struct tfab_spin spin;
	bool gave_up = false, found = false;
	uint64_t deadline;
	int rc;

	if (!ctx || timeout_ms < 0)
		return -EINVAL;
	deadline = tfab__now_ms() + (uint64_t)timeout_ms;
	tfab__ctx_lock(ctx);
	rc = recv_start(ctx, peer, key, step, a, &w, &r);
	if (rc) {
		tfab__ctx_unlock(ctx);
		return rc;
	}
	tfab__peers_flush(ctx, false);
	tfab__spin_init(&spin, ctx->cfg.spin_us);
	/* w is written under the lock; r lives at least until w.done. */
	while (!w.done) {
		uint64_t now = tfab__now_ms();

		if (!gave_up && now >= deadline) {
			TFAB_DEBUG(SUBSYS, "receive of '%s' step %lld: gave up after %d ms", r->key,
				   (long long)step, timeout_ms);
			/*
			 * Done here, unless the peer may still write into the caller's memory:
			 * then once it has read the CANCEL (at its next progress call), or
			 * with it (tfab__peer_hold_request).
			 */
			tfab__request_fail(r, -ETIMEDOUT, true);
			gave_up = true;
			continue;
		}
		/* In a callback on the progress thread, no other thread drives progress. */
		if (ctx->thread_running && !pthread_equal(pthread_self(), ctx->progress_thread)) {
			tfab__cond_wait_until(ctx, gave_up ? now + 100 : deadline);
		} else {
			/* past TFAB_SPIN_US without work (or given up), each idle turn pauses */
			unsigned pause_us =
			    gave_up ? TFAB_IDLE_PAUSE_US : tfab__spin_pause(&spin, found);

			found = tfab__progress_turn(ctx, pause_us) > 0;
		}
	}
	tfab__peers_flush(ctx, false); /* the TAKEN that progress held: nothing follows it here */
	tfab__ctx_unlock(ctx);
	if (w.status == 0) {
		if (tensor_p)
			*tensor_p = w.tensor;
		else if (w.tensor)
			w.tensor->deleter(w.tensor);
		if (strings_p)
			*strings_p = w.strings;
		else
			tfab_string_tensor_free(w.strings);
		if (is_dead_p)
			*is_dead_p = w.is_dead;
	}
	return w.status;
}

int tfab_recv_sync(struct tfab_context *ctx, struct tfab_peer *peer, const char *key,
		   int64_t step_id, DLTensor *dest, int timeout_ms, DLManagedTensor **tensor_p,
		   bool *is_dead_p)
{
	struct tfab_recv_args a = {.dest = dest};

	if (tfab__check_step("receive", key, step_id))
		return -EINVAL;
	return tfab__recv_wait(ctx, peer, key, step_id, &a, timeout_ms, tensor_p, NULL, is_dead_p);
}

int tfab_recv_into_sync(struct tfab_context *ctx, struct tfab_peer *peer, const char *key,
			int64_t step_id, DLTensor *dest, unsigned flags, int timeout_ms,
			DLManagedTensor **tensor_p, bool *is_dead_p)
{
	struct tfab_recv_args a = {.dest = dest, .flags = flags};

	if (!dest)
		return -EINVAL;
	if (tfab__check_step("receive", key, step_id))
		return -EINVAL;
	return tfab__recv_wait(ctx, peer, key, step_id, &a, timeout_ms, tensor_p, NULL, is_dead_p);
}
