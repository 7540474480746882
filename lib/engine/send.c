/*
 * The sender: sends wait in a table by (key, step); requests that come before their send are
 * parked by the same key. When both are there, the request's cached meta-data decides: equal,
 * and the content is written straight from the source tensor into the receiver's destination
 * with the request index as immediate; different (or a first request), and META_DATA goes
 * back instead. Dead and empty tensors complete with META_DATA alone.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tfab/status.h>

#include "engine/engine.h"
#include "util/log.h"
#include "util/time.h"

#define SUBSYS TFAB_ENGINE_SUBSYS

uint64_t tfab__send_hash(const char *key, uint16_t key_len, int64_t step)
{
	/* the step seeds the key's hash: one pass */
	return tfab__hash_bytes(key, key_len, (uint64_t)step ^ 0x2545f4914f6cdd1dull);
}

static uint64_t index_hash(uint32_t req_index)
{
	return (uint64_t)req_index * 0x9e3779b97f4a7c15ull;
}

static bool same_key(const char *a, uint16_t alen, int64_t astep, const char *b, uint16_t blen,
		     int64_t bstep)
{
	return astep == bstep && alen == blen && memcmp(a, b, alen) == 0;
}

/*
 * The send of (key, step) that a request from peer may take: one for any peer, or for that
 * one (at most one matches: tfab__send_start refuses overlaps).
 */
static struct tfab_send *send_match(struct tfab_context *ctx, uint64_t h, const char *key,
				    uint16_t key_len, int64_t step, const struct tfab_peer *peer)
{
	for (struct tfab_hnode *n = tfab__htable_first(&ctx->sends, h); n;
	     n = tfab__htable_next(n, h)) {
		struct tfab_send *s = tfab_container_of(n, struct tfab_send, node);

		if (same_key(s->key, s->key_len, s->step, key, key_len, step) &&
		    (!s->to || s->to == peer))
			return s;
	}
	return NULL;
}

/* Whether a send of (key, step) for `to` would overlap one already offered. */
static bool send_overlaps(struct tfab_context *ctx, uint64_t h, const char *key, uint16_t key_len,
			  int64_t step, const struct tfab_peer *to)
{
	for (struct tfab_hnode *n = tfab__htable_first(&ctx->sends, h); n;
	     n = tfab__htable_next(n, h)) {
		struct tfab_send *s = tfab_container_of(n, struct tfab_send, node);

		if (same_key(s->key, s->key_len, s->step, key, key_len, step) &&
		    (!s->to || !to || s->to == to))
			return true;
	}
	return false;
}

/* The oldest parked request for (key, step) that a send for `to` (NULL: any) may take. */
static struct tfab_response *parked_find(struct tfab_context *ctx, uint64_t h, const char *key,
					 uint16_t key_len, int64_t step, const struct tfab_peer *to)
{
	struct tfab_response *found = NULL;

	/* Chains are newest first: the last match is the oldest request. */
	for (struct tfab_hnode *n = tfab__htable_first(&ctx->parked, h); n;
	     n = tfab__htable_next(n, h)) {
		struct tfab_response *p = tfab_container_of(n, struct tfab_response, node);

		if (same_key(p->key, p->key_len, p->step, key, key_len, step) &&
		    (!to || p->peer == to))
			found = p;
	}
	return found;
}

/* A request of peer's we hold (parked, or answered and waiting for its verdict). */
static struct tfab_response *answer_find(struct tfab_peer *peer, uint32_t req_index)
{
	uint64_t h = index_hash(req_index);

	for (struct tfab_hnode *n = tfab__htable_first(&peer->answers, h); n;
	     n = tfab__htable_next(n, h)) {
		struct tfab_response *q = tfab_container_of(n, struct tfab_response, inode);

		if (q->req_index == req_index)
			return q;
	}
	return NULL;
}

static void parked_free(struct tfab_context *ctx, struct tfab_response *p)
{
	tfab__htable_remove(&ctx->parked, &p->node);
	tfab__htable_remove(&p->peer->answers, &p->inode);
	tfab__freelist_put(&ctx->parked_fl, p);
}

/* The send answers s->resp with content or a complete META_DATA: the verdict will name it. */
static int track(struct tfab_send *s)
{
	struct tfab_response *q = &s->resp;
	int rc = tfab__htable_insert(&q->peer->answers, &q->inode, index_hash(q->req_index));

	s->tracked = rc == 0;
	return rc;
}

static void untrack(struct tfab_send *s)
{
	if (s->tracked)
		tfab__htable_remove(&s->resp.peer->answers, &s->resp.inode);
	s->tracked = false;
}

static void reply_error(struct tfab_peer *peer, uint32_t req_index, int status, const char *why)
{
	struct tfab_wire_msg m = {
	    .type = TFAB_MSG_ERROR,
	    .req_index = req_index,
	    .status = status < 0 ? status : -TFAB_ERR_REMOTE,
	    .errmsg = why,
	    .errmsg_len = (uint16_t)strnlen(why, TFAB_WIRE_MAX_ERRMSG),
	};

	if (!peer->failed)
		tfab__peer_send_msg(peer, &m);
}

static void send_finish(struct tfab_context *ctx, struct tfab_send *s, int status);

/*
 * Answering s failed here (a write the fabric refused to post, a registration): the send
 * fails, and the receive with it; a peer that is gone fails whole.
 */
static void answer_failed(struct tfab_context *ctx, struct tfab_send *s, int rc, const char *why)
{
	struct tfab_peer *peer = s->resp.peer;

	if (rc == -TFAB_ERR_PEER_FAILED) {
		tfab__peer_fail(peer, rc); /* ends s too */
		return;
	}
	reply_error(peer, s->resp.req_index, rc, why);
	send_finish(ctx, s, rc);
}

/* A GPU send's copies into its proxy end before the block may be reused or freed. */
static void stage_drain(struct tfab_context *ctx, struct tfab_send *s)
{
	for (uint32_t i = 0; i < s->nchunks; i++) {
		while (s->chunk_copy[i] && tfab__cuda_copy_test(ctx->cuda, s->chunk_copy[i]) == 0)
			;
		s->chunk_copy[i] = NULL;
	}
	tfab__list_del(&s->stage_link);
}

/* The send no longer reads its data: tfab_flush may stop waiting for it. */
static void send_settle(struct tfab_context *ctx, struct tfab_send *s)
{
	tfab__list_del(&s->live_link);
	if (ctx->flushers)
		pthread_cond_broadcast(&ctx->cond);
}

/*
 * Take s out of the table and queue its callback. A send failed while its write is in
 * flight stays allocated until the write completes (see tfab__ctx_unlock and
 * tfab__send_on_write_done); its registration is released then. A send whose TAKEN has come
 * ends delivered, whatever ends it: a live receive has it. Its TAKEN may come before its
 * write's own completion (fabrics report the two on different queues; shm reads its
 * completions after what arrived), and its peer's failure or LEAVE, a step cleanup or an
 * abort, before that completion or instead of it.
 */
static void send_finish(struct tfab_context *ctx, struct tfab_send *s, int status)
{
	if (s->state == TFAB_SEND_DONE)
		return;
	if (s->taken)
		status = 0;
	tfab__htable_remove(&ctx->sends, &s->node);
	tfab__list_del(&s->link);
	stage_drain(ctx, s);
	untrack(s);
	s->state = TFAB_SEND_DONE;
	s->status = status;
	if (status == 0)
		ctx->stats.sends++;
	if (s->mr && !s->in_flight && !s->data_pool && !s->gpu) {
		tfab__mr_cache_put(tfab__mr_cache_of(ctx, s->mr), s->mr);
		s->mr = NULL;
	}
	if (!s->in_flight)
		send_settle(ctx, s);
	TFAB_DEBUG(SUBSYS, "send of '%s' step %lld ended: %s", s->key, (long long)s->step,
		   tfab_strerror(status));
	tfab__list_add_tail(&ctx->done_sends, &s->done_link);
}

void tfab__send_free(struct tfab_context *ctx, struct tfab_send *s)
{
	/* A serialized tensor's block: the receiver may still be reading it only if in flight. */
	if (s->data_pool && s->data)
		tfab__pool_free(ctx->pool, s->data);
	if (s->proxy)
		tfab__pool_free(ctx->pool, s->proxy);
	free(s->chunk_copy);
	tfab__freelist_put(&ctx->send_fl, s);
}

static void answer(struct tfab_context *ctx, struct tfab_send *s);

/* Move a parked request into s->resp; s answers it next. */
static void take_parked(struct tfab_context *ctx, struct tfab_send *s, struct tfab_response *p)
{
	tfab__htable_remove(&ctx->parked, &p->node);
	tfab__htable_remove(&p->peer->answers, &p->inode);
	/* all but its key (the send's own), the shape as far as it goes */
	memcpy(&s->resp, p, offsetof(struct tfab_response, meta));
	tfab__meta_copy(&s->resp.meta, &p->meta);
	s->resp.send = s;
	tfab__freelist_put(&ctx->parked_fl, p);
}

/*
 * The request s answered was given up by the receiver (a CANCEL, or a destination it no longer
 * lets us write): s waits again, for a later request or one already parked.
 */
static void send_reoffer(struct tfab_context *ctx, struct tfab_send *s)
{
	struct tfab_response *p;

	TFAB_DEBUG(SUBSYS, "send of '%s' step %lld: peer %u gave up request %#x; offered again",
		   s->key, (long long)s->step, s->resp.peer->id, s->resp.req_index);
	untrack(s);
	if (s->mr && !s->data_pool && !s->gpu) {
		tfab__mr_cache_put(tfab__mr_cache_of(ctx, s->mr), s->mr);
		s->mr = NULL;
	}
	s->state = TFAB_SEND_WAITING;
	s->waiting_ms = tfab__coarse_ms();
	s->taken = s->cancelled = false;
	s->write_err = 0;
	p = parked_find(ctx, s->node.hash, s->key, s->key_len, s->step, s->to);
	if (p) {
		take_parked(ctx, s, p);
		answer(ctx, s);
	}
}

/*
 * Content the fabric copies out at once (at most its inject size, from host memory) needs no
 * registration and no completion: the send ends on the receiver's TAKEN or CANCEL as ever,
 * and a failure of the write fails the peer (peer->inject_w).
 */
static bool content_injects(const struct tfab_send *s)
{
	return !s->gpu && s->meta.nbytes <= s->resp.peer->path->caps->inject_size;
}

static void writes_settled(struct tfab_context *ctx, struct tfab_send *s);

static int post_content(struct tfab_send *s)
{
	struct tfab_peer *peer = s->resp.peer;
	int rc;

	if (content_injects(s)) {
		rc = tfab_conn_write_imm(peer->conn, s->data, s->meta.nbytes, NULL,
					 s->resp.dest_raddr, s->resp.dest_rkey, s->resp.req_index,
					 TFAB_WRITE_INJECT, &peer->inject_w);
		if (rc == 0) {
			peer->ctx->stats.writes_content++;
			TFAB_TRACE(SUBSYS,
				   "write of '%s' step %lld: %llu bytes injected to peer %u",
				   s->key, (long long)s->step, (unsigned long long)s->meta.nbytes,
				   peer->id);
			writes_settled(peer->ctx, s); /* done with at once: the verdict is next */
		}
		return rc;
	}
	rc = tfab_conn_write_imm(peer->conn, s->data, s->meta.nbytes, s->mr, s->resp.dest_raddr,
				 s->resp.dest_rkey, s->resp.req_index, 0, &s->w);
	if (rc == 0) {
		s->in_flight = true;
		peer->users++;
		peer->ctx->stats.writes_content++;
		TFAB_TRACE(SUBSYS, "write of '%s' step %lld: %llu bytes to peer %u, request %#x",
			   s->key, (long long)s->step, (unsigned long long)s->meta.nbytes, peer->id,
			   s->resp.req_index);
	}
	return rc;
}

/*
 * A GPU source goes through a registered host proxy (no backend here registers GPU memory):
 * every chunk's copy to the proxy starts at once, and tfab__sends_stage writes each chunk as
 * its copy finishes, so the copies of later chunks overlap the writes of earlier ones.
 */
static int stage_start(struct tfab_context *ctx, struct tfab_send *s)
{
	uint64_t chunk = ctx->cfg.cuda_chunk, n = s->meta.nbytes;
	int rc;

	if (!s->proxy) {
		rc = tfab__pool_alloc(ctx->pool, s->resp.peer->path->index, n, &s->proxy, &s->mr);
		if (rc)
			return rc;
		tfab__pool_pin(ctx->pool, s->proxy, ctx->cuda);
	}
	s->nchunks = (uint32_t)((n + chunk - 1) / chunk);
	s->posted = 0;
	free(s->chunk_copy);
	s->chunk_copy = calloc(s->nchunks, sizeof(*s->chunk_copy));
	if (!s->chunk_copy) {
		s->nchunks = 0;
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < s->nchunks; i++) {
		uint64_t off = (uint64_t)i * chunk, len = n - off < chunk ? n - off : chunk;

		rc = tfab__cuda_copy_start(ctx->cuda, (char *)s->proxy + off,
					   (const char *)s->data + off, len, false,
					   &s->chunk_copy[i]);
		if (rc)
			return rc; /* send_finish drains the copies started */
	}
	ctx->stats.bytes_copied += n;
	tfab__list_add_tail(&ctx->staging, &s->stage_link);
	return 0;
}

/*
 * Post the chunks of s whose copies finished, each with the partial-content immediate, then,
 * once they have all completed, a zero-length write with the request index: it completes the
 * receive, lands after the content even where the fabric does not order writes, and reports
 * no length that the receiver could mistake for the tensor's. A negative status fails s.
 * Nothing more is posted once the request was cancelled or a chunk failed.
 */
static int stage_post(struct tfab_context *ctx, struct tfab_send *s)
{
	struct tfab_peer *peer = s->resp.peer;
	uint64_t chunk = ctx->cfg.cuda_chunk, n = s->meta.nbytes;

	while (s->posted <= s->nchunks && !s->cancelled && !s->write_err) {
		uint32_t i = s->posted;
		bool last = i == s->nchunks;
		uint64_t off = last ? 0 : (uint64_t)i * chunk;
		uint64_t len = last ? 0 : n - off < chunk ? n - off : chunk;
		int rc;

		if (!last && s->chunk_copy[i]) {
			rc = tfab__cuda_copy_test(ctx->cuda, s->chunk_copy[i]);
			if (rc <= 0) {
				if (rc < 0)
					s->chunk_copy[i] = NULL;
				return rc;
			}
			s->chunk_copy[i] = NULL;
		}
		if (last && s->writes_out)
			return 0;
		rc = tfab_conn_write_imm(
		    peer->conn, (char *)s->proxy + off, len, s->mr, s->resp.dest_raddr + off,
		    s->resp.dest_rkey,
		    last ? s->resp.req_index : tfab__imm_partial(peer->remote_id), 0, &s->w);
		if (rc == -EAGAIN)
			return 0;
		if (rc)
			return rc;
		s->posted++;
		s->writes_out++;
		s->in_flight = true;
		peer->users++;
		ctx->stats.writes_content++;
	}
	return 0;
}

/* Whether a GPU send has nothing more to post and nothing in flight. */
static bool stage_over(const struct tfab_send *s)
{
	return s->writes_out == 0 && (s->posted > s->nchunks || s->cancelled || s->write_err);
}

void tfab__sends_stage(struct tfab_context *ctx)
{
	struct tfab_list *l, *t;

	tfab_list_for_each_safe(l, t, &ctx->staging)
	{
		struct tfab_send *s = tfab_container_of(l, struct tfab_send, stage_link);
		int rc = stage_post(ctx, s);

		if (rc) {
			answer_failed(ctx, s, rc, "the content write failed");
		} else if (s->posted > s->nchunks) {
			tfab__list_del(&s->stage_link);
		} else if (stage_over(s)) {
			/* Cancelled before its first write, or stopped by a failed chunk. */
			stage_drain(ctx, s);
			writes_settled(ctx, s);
		}
	}
}

/*
 * A tensor with no content (empty or dead) whose meta-data the receiver has right: a write of
 * zero bytes with the request's index completes its receive (protocol.md, empty tensors). It
 * lands in the peer's inbox, a region that is always there, and writes nothing. Like injected
 * content it is done with at once, or (a fabric without inject) when it completes.
 */
static int post_empty(struct tfab_context *ctx, struct tfab_send *s)
{
	struct tfab_peer *peer = s->resp.peer;
	bool inject = peer->path->caps->inject_size > 0;
	int rc;

	s->state = TFAB_SEND_WRITING;
	rc = track(s);
	if (rc)
		return rc;
	rc = tfab_conn_write_imm(peer->conn, peer->outbox, 0, peer->outbox_mr, peer->remote_raddr,
				 peer->remote_rkey, s->resp.req_index,
				 inject ? TFAB_WRITE_INJECT : 0, inject ? &peer->inject_w : &s->w);
	if (rc)
		return rc;
	ctx->stats.writes_content++;
	TFAB_DEBUG(SUBSYS, "send of '%s' step %lld: no content, a zero-byte write for request %#x",
		   s->key, (long long)s->step, s->resp.req_index);
	if (inject) {
		writes_settled(ctx, s);
	} else {
		s->in_flight = true;
		peer->users++;
	}
	return 0;
}

/* Answer the request in s->resp. */
static void answer(struct tfab_context *ctx, struct tfab_send *s)
{
	struct tfab_response *q = &s->resp;
	struct tfab_peer *peer = q->peer;
	bool no_content = s->meta.is_dead || s->meta.nbytes == 0;
	int rc;

	if ((q->flags & TFAB_MSGF_META_VALID) && tfab__wire_meta_equal(&q->meta, &s->meta) &&
	    no_content && !s->gpu && ctx->cfg.empty_write) {
		rc = post_empty(ctx, s);
		if (rc == -EAGAIN) {
			/* as META_DATA instead: it queues behind the credit window */
			untrack(s);
		} else {
			if (rc)
				answer_failed(ctx, s, rc, "the sender could not answer");
			return;
		}
	}
	if ((q->flags & TFAB_MSGF_META_VALID) &&
	    tfab__wire_meta_takes(&q->meta, &s->meta, q->dest_capacity) && !no_content) {
		s->state = TFAB_SEND_WRITING;
		rc = track(s);
		if (rc == 0 && s->gpu)
			rc = stage_start(ctx, s);
		else if (rc == 0 && !content_injects(s))
			rc = s->data_pool
				 ? tfab__pool_mr(ctx->pool, s->data, peer->path->index, &s->mr)
				 : tfab__mr_cache_get(peer->path->mr_cache, s->data, s->meta.nbytes,
						      TFAB_MR_LOCAL_WRITE, &s->mr);
		if (rc == 0 && !s->gpu) {
			rc = post_content(s);
			if (rc == -EAGAIN) {
				tfab__list_add_tail(&ctx->writes_pending, &s->link);
				return;
			}
		}
		if (rc)
			answer_failed(ctx, s, rc,
				      s->gpu ? "the sender could not stage its GPU tensor"
					     : "the sender could not write the tensor");
		return;
	}
	/* Meta-data first: the receiver (re)allocates and asks again, or is done. */
	struct tfab_wire_msg m = {
	    .type = TFAB_MSG_META_DATA,
	    .req_index = q->req_index,
	    .meta = s->meta,
	    .flags = no_content ? TFAB_MSGF_COMPLETE : 0,
	};

	TFAB_DEBUG(SUBSYS, "send of '%s' step %lld: meta-data to peer %u for request %#x%s", s->key,
		   (long long)s->step, peer->id, q->req_index,
		   no_content ? " (complete: no content)" : "");
	rc = tfab__peer_send_msg(peer, &m);
	if (rc == 0 && no_content) {
		/* Delivered once the receive takes it, like content. */
		s->state = TFAB_SEND_ANSWERED;
		s->answered_ms = tfab__coarse_ms();
		rc = track(s);
	} else if (rc == 0) {
		s->state = TFAB_SEND_WAITING; /* for the re-request */
		s->waiting_ms = tfab__coarse_ms();
	}
	if (rc)
		send_finish(ctx, s, rc);
}

/* Park m (h: its key and step's tfab__send_hash) until a send for it comes. */
static void park(struct tfab_context *ctx, struct tfab_peer *peer, const struct tfab_wire_msg *m,
		 uint64_t h)
{
	struct tfab_response *p = tfab__freelist_get(&ctx->parked_fl);

	if (!p) {
		reply_error(peer, m->req_index, -ENOMEM, "the sender is out of memory");
		return;
	}
	memset(p, 0, offsetof(struct tfab_response, meta)); /* the rest is set below */
	p->peer = peer;
	p->req_index = m->req_index;
	p->flags = m->flags;
	p->step = m->step_id;
	p->dest_raddr = m->dest_raddr;
	p->dest_rkey = m->dest_rkey;
	p->dest_capacity = m->dest_capacity;
	tfab__meta_copy(&p->meta, &m->meta);
	p->key_len = m->key_len;
	memcpy(p->key, m->key, m->key_len);
	if (tfab__htable_insert(&peer->answers, &p->inode, index_hash(p->req_index))) {
		tfab__freelist_put(&ctx->parked_fl, p);
		reply_error(peer, m->req_index, -ENOMEM, "the sender is out of memory");
		return;
	}
	if (tfab__htable_insert(&ctx->parked, &p->node, h)) {
		tfab__htable_remove(&peer->answers, &p->inode);
		tfab__freelist_put(&ctx->parked_fl, p);
		reply_error(peer, m->req_index, -ENOMEM, "the sender is out of memory");
		return;
	}
	TFAB_DEBUG(SUBSYS, "request %#x of peer %u for '%.*s' step %lld parked: no send yet",
		   p->req_index, peer->id, (int)p->key_len, p->key, (long long)p->step);
}

void tfab__send_on_request(struct tfab_peer *peer, const struct tfab_wire_msg *m)
{
	struct tfab_context *ctx = peer->ctx;
	struct tfab_send *s;
	uint64_t h;

	TFAB_DEBUG(SUBSYS, "request %#x of peer %u for '%.*s' step %lld%s", m->req_index, peer->id,
		   (int)m->key_len, (const char *)m->key, (long long)m->step_id,
		   (m->flags & TFAB_MSGF_REREQUEST) ? " (again, after meta-data)" : "");
	if (ctx->abort_status) {
		reply_error(peer, m->req_index, ctx->abort_status, "the sender aborted");
		return;
	}
	if (answer_find(peer, m->req_index)) {
		TFAB_ERROR(SUBSYS, "%s: request %#x is already being answered",
			   tfab__peer_name(peer), m->req_index);
		tfab__peer_fail(peer, -TFAB_ERR_PROTOCOL);
		return;
	}
	h = tfab__send_hash((const char *)m->key, m->key_len, m->step_id);
	s = send_match(ctx, h, (const char *)m->key, m->key_len, m->step_id, peer);
	if (!s || s->state != TFAB_SEND_WAITING) {
		park(ctx, peer, m, h);
		return;
	}
	s->resp.peer = peer;
	s->resp.send = s;
	s->resp.req_index = m->req_index;
	s->resp.flags = m->flags;
	s->resp.step = m->step_id;
	s->resp.dest_raddr = m->dest_raddr;
	s->resp.dest_rkey = m->dest_rkey;
	s->resp.dest_capacity = m->dest_capacity;
	tfab__meta_copy(&s->resp.meta, &m->meta);
	answer(ctx, s);
}

void tfab__send_on_cancel(struct tfab_peer *peer, uint32_t req_index)
{
	struct tfab_context *ctx = peer->ctx;
	struct tfab_response *q = answer_find(peer, req_index);
	struct tfab_send *s;

	TFAB_DEBUG(SUBSYS, "peer %u cancelled request %#x%s", peer->id, req_index,
		   !q	      ? " (not held here)"
		   : !q->send ? " (parked)"
			      : "");
	if (!q)
		return;
	if (!q->send) {
		parked_free(ctx, q);
		return;
	}
	s = q->send;
	if (s->state == TFAB_SEND_ANSWERED) {
		send_reoffer(ctx, s);
	} else if (!s->gpu && !s->in_flight) {
		/* Queued behind -EAGAIN, never posted. */
		tfab__list_del(&s->link);
		send_reoffer(ctx, s);
	} else {
		/* Offered again once what is posted has completed (see writes_settled). */
		s->cancelled = true;
	}
}

void tfab__send_on_taken(struct tfab_peer *peer, uint32_t req_index)
{
	struct tfab_context *ctx = peer->ctx;
	struct tfab_response *q = answer_find(peer, req_index);

	if (q && !q->send) {
		TFAB_ERROR(SUBSYS, "%s: TAKEN for request %#x, which was never answered",
			   tfab__peer_name(peer), req_index);
		tfab__peer_fail(peer, -TFAB_ERR_PROTOCOL);
		return;
	}
	if (!q) {
		TFAB_DEBUG(SUBSYS, "peer %u took request %#x, which no send waits for", peer->id,
			   req_index);
		return;
	}
	TFAB_DEBUG(SUBSYS, "peer %u took '%s' step %lld (request %#x)", peer->id, q->send->key,
		   (long long)q->send->step, req_index);
	if (q->send->state == TFAB_SEND_ANSWERED)
		send_finish(ctx, q->send, 0);
	else
		q->send->taken = true; /* finished when its write completes */
}

/*
 * Every write of s has completed (one, or a GPU send's chunks), with s->write_err the first
 * failure: the send waits for its verdict, is offered again, or ends.
 */
static void writes_settled(struct tfab_context *ctx, struct tfab_send *s)
{
	struct tfab_peer *peer = s->resp.peer;
	int status = s->write_err;

	if (status) {
		TFAB_DEBUG(SUBSYS, "writing '%s' step %lld to peer %u failed: %s", s->key,
			   (long long)s->step, peer->id, tfab_strerror(status));
		if (tfab__peer_write_status(peer, status) == -TFAB_ERR_PEER_FAILED) {
			tfab__peer_write_failed(peer, status); /* ends s too */
			return;
		}
		/*
		 * A destination the receiver no longer lets us write: it gave the request up,
		 * and its CANCEL is on the way (or it will fail the request on our ERROR). The
		 * tensor stays for a later receive.
		 */
		reply_error(peer, s->resp.req_index, status, "the content write failed");
		send_reoffer(ctx, s);
		return;
	}
	ctx->stats.bytes_sent += s->meta.nbytes;
	if (s->taken)
		send_finish(ctx, s, 0);
	else if (s->cancelled)
		send_reoffer(ctx, s);
	else {
		s->state = TFAB_SEND_ANSWERED;
		s->answered_ms = tfab__coarse_ms();
	}
}

void tfab__send_deadlines(struct tfab_context *ctx, uint64_t now_ms)
{
	uint64_t limit = ctx->cfg.op_timeout_ms;
	struct tfab_list *l, *t;

	if (!limit)
		return;
	tfab_list_for_each_safe(l, t, &ctx->sends_live)
	{
		struct tfab_send *s = tfab_container_of(l, struct tfab_send, live_link);
		bool verdict = s->state == TFAB_SEND_ANSWERED;
		uint64_t since = verdict ? s->answered_ms : s->waiting_ms;

		/* since may be a tick past now_ms, read before it */
		if (!(verdict || (s->bounded && s->state == TFAB_SEND_WAITING)) ||
		    since >= now_ms || now_ms - since < limit)
			continue;
		if (verdict)
			TFAB_WARN(SUBSYS,
				  "send of '%s' step %lld to %s: no verdict from the peer for %llu "
				  "ms (waiting for its receive to take what it has); failed "
				  "(TFAB_OP_TIMEOUT_MS)",
				  s->key, (long long)s->step, tfab__peer_name(s->resp.peer),
				  (unsigned long long)(now_ms - since));
		else
			TFAB_WARN(SUBSYS,
				  "send of '%s' step %lld to %s: no request from the peer for %llu "
				  "ms (its receive gave up, or never came); failed "
				  "(TFAB_OP_TIMEOUT_MS)",
				  s->key, (long long)s->step, tfab__peer_name(s->to),
				  (unsigned long long)(now_ms - since));
		send_finish(ctx, s, -TFAB_ERR_TIMEOUT);
	}
}

static void send_write_done(struct tfab_context *ctx, struct tfab_send *s, int status)
{
	if (status && !s->write_err)
		s->write_err = status;
	if (s->gpu) {
		/* One of several chunk writes: the send goes on with the last of them. */
		s->writes_out--;
		s->in_flight = s->writes_out != 0;
	} else {
		s->in_flight = false;
	}
	if (s->state == TFAB_SEND_DONE) {
		/* Failed while in flight: its callback has run (orphan) or is queued. */
		if (s->in_flight)
			return;
		if (s->mr && !s->data_pool && !s->gpu) {
			tfab__mr_cache_put(tfab__mr_cache_of(ctx, s->mr), s->mr);
			s->mr = NULL;
		}
		send_settle(ctx, s);
		if (s->orphan) {
			ctx->orphans--;
			tfab__send_free(ctx, s);
		}
		return;
	}
	if (s->gpu) {
		if (!stage_over(s))
			return;
		stage_drain(ctx, s);
	}
	writes_settled(ctx, s);
}

void tfab__send_on_write_done(struct tfab_send *s, int status)
{
	struct tfab_peer *peer = s->resp.peer;

	send_write_done(peer->ctx, s, status); /* may free s */
	tfab__peer_unuse(peer);
}

unsigned tfab__sends_abandon(struct tfab_context *ctx)
{
	unsigned n = 0;

	while (!tfab__list_empty(&ctx->sends_live)) {
		struct tfab_send *s =
		    tfab_container_of(ctx->sends_live.next, struct tfab_send, live_link);

		/* Only failed sends whose callbacks have run are left (tfab_context_destroy). */
		send_settle(ctx, s);
		if (s->mr && !s->data_pool && !s->gpu)
			tfab__mr_cache_put(tfab__mr_cache_of(ctx, s->mr), s->mr);
		s->mr = NULL;
		if (s->orphan) {
			ctx->orphans--;
			tfab__send_free(ctx, s);
		}
		n++;
	}
	return n;
}

void tfab__sends_retry(struct tfab_context *ctx)
{
	while (!tfab__list_empty(&ctx->writes_pending)) {
		struct tfab_send *s =
		    tfab_container_of(ctx->writes_pending.next, struct tfab_send, link);
		int rc = post_content(s);

		if (rc == -EAGAIN)
			return;
		tfab__list_del(&s->link);
		if (rc)
			answer_failed(ctx, s, rc, "the content write failed");
	}
}

/* Every send matching the filter ends with status. */
static void sends_for_each(struct tfab_context *ctx, bool (*match)(struct tfab_send *, void *),
			   void *arg, int status)
{
	for (size_t i = 0; i < ctx->sends.nbuckets; i++) {
		struct tfab_hnode *n = ctx->sends.buckets[i], *next;

		for (; n; n = next) {
			struct tfab_send *s = tfab_container_of(n, struct tfab_send, node);

			next = n->next;
			if (match(s, arg))
				send_finish(ctx, s, status);
		}
	}
}

/* Sends answering the peer, and those for it alone. */
static bool bound_to(struct tfab_send *s, void *arg)
{
	struct tfab_peer *peer = arg;

	return ((s->state == TFAB_SEND_WRITING || s->state == TFAB_SEND_ANSWERED) &&
		s->resp.peer == peer) ||
	       s->to == peer;
}

unsigned tfab__sends_bound(struct tfab_context *ctx, struct tfab_peer *peer,
			   struct tfab_op_names *names)
{
	unsigned n = 0;

	for (size_t i = 0; i < ctx->sends.nbuckets; i++)
		for (struct tfab_hnode *h = ctx->sends.buckets[i]; h; h = h->next) {
			struct tfab_send *s = tfab_container_of(h, struct tfab_send, node);

			if (!bound_to(s, peer) || s->taken) /* a taken one is delivered */
				continue;
			n++;
			if (names)
				tfab__op_names_add(names, s->key, s->step);
		}
	return n;
}

void tfab__sends_fail_peer(struct tfab_context *ctx, struct tfab_peer *peer, int status)
{
	sends_for_each(ctx, bound_to, peer, status);
	for (size_t i = 0; i < ctx->parked.nbuckets; i++) {
		struct tfab_hnode *n = ctx->parked.buckets[i], *next;

		for (; n; n = next) {
			struct tfab_response *p = tfab_container_of(n, struct tfab_response, node);

			next = n->next;
			if (p->peer == peer)
				parked_free(ctx, p);
		}
	}
}

struct step_filter {
	bool all;
	int64_t step;
};

static bool of_step(struct tfab_send *s, void *arg)
{
	struct step_filter *f = arg;

	/* A send whose write is in flight ends too: it is freed when the write completes. */
	return f->all || s->step == f->step;
}

void tfab__sends_cleanup(struct tfab_context *ctx, bool all, int64_t step, int status)
{
	struct step_filter f = {all, step};

	struct tfab_hnode *doomed = NULL;

	sends_for_each(ctx, of_step, &f, status);
	/*
	 * Out of the tables first, answered after: a reply that fails its peer frees that peer's
	 * parked requests, the walk's next one among them.
	 */
	for (size_t i = 0; i < ctx->parked.nbuckets; i++) {
		struct tfab_hnode *n = ctx->parked.buckets[i], *next;

		for (; n; n = next) {
			struct tfab_response *p = tfab_container_of(n, struct tfab_response, node);

			next = n->next;
			if (all || p->step == step) {
				tfab__htable_remove(&ctx->parked, n);
				tfab__htable_remove(&p->peer->answers, &p->inode);
				n->next = doomed;
				doomed = n;
			}
		}
	}
	while (doomed) {
		struct tfab_response *p = tfab_container_of(doomed, struct tfab_response, node);

		doomed = doomed->next;
		reply_error(p->peer, p->req_index, status,
			    "the sender cleaned up or aborted the step");
		tfab__freelist_put(&ctx->parked_fl, p);
	}
}

int tfab__send_start(struct tfab_context *ctx, struct tfab_peer *to, const char *key,
		     int64_t step_id, const struct tfab_wire_meta *meta, void *data, unsigned flags,
		     tfab_send_cb cb, void *arg)
{
	bool data_pool = flags & TFAB_SEND_DATA_POOL;
	struct tfab_response *p;
	struct tfab_send *s;
	size_t key_len;
	uint64_t h;
	int rc;

	rc = tfab__check_key(key, &key_len);
	if (rc == 0 && ((to && to->ctx != ctx) || (!to && (flags & TFAB_SEND_BOUNDED))))
		rc = -EINVAL; /* a bounded send waits for one peer's request */
	if (rc)
		goto err_data;
	tfab__ctx_lock(ctx);
	if (ctx->abort_status) {
		rc = ctx->abort_status;
		goto err_locked;
	}
	if (to && to->failed) {
		rc = to->failed;
		goto err_locked;
	}
	s = tfab__freelist_get(&ctx->send_fl);
	if (!s) {
		rc = -ENOMEM;
		goto err_locked;
	}
	memset(s, 0, offsetof(struct tfab_send, meta));
	memset(&s->resp, 0, offsetof(struct tfab_response, meta));
	s->w.kind = TFAB_WCTX_CONTENT;
	s->to = to;
	s->step = step_id;
	s->key_len = (uint16_t)key_len;
	memcpy(s->key, key, key_len);
	s->key[key_len] = '\0';
	s->data = data;
	s->data_pool = data_pool;
	s->gpu = flags & TFAB_SEND_GPU;
	s->bounded = flags & TFAB_SEND_BOUNDED;
	s->waiting_ms = tfab__coarse_ms();
	tfab__list_init(&s->stage_link);
	tfab__list_init(&s->live_link);
	tfab__meta_copy(&s->meta, meta);
	s->cb = cb;
	s->arg = arg;
	s->state = TFAB_SEND_WAITING;
	tfab__list_init(&s->link);
	tfab__list_init(&s->done_link);

	h = tfab__send_hash(key, (uint16_t)key_len, step_id);
	if (send_overlaps(ctx, h, key, (uint16_t)key_len, step_id, to)) {
		TFAB_ERROR(SUBSYS, "'%s' step %lld is already being sent%s", key,
			   (long long)step_id, to ? " to that peer, or to any" : "");
		rc = -EEXIST;
		goto err;
	}
	rc = tfab__htable_insert(&ctx->sends, &s->node, h);
	if (rc)
		goto err;
	s->seq = ++ctx->send_seq;
	tfab__list_add_tail(&ctx->sends_live, &s->live_link);
	TFAB_DEBUG(SUBSYS, "send of '%s' step %lld (%llu bytes%s) posted", key, (long long)step_id,
		   (unsigned long long)meta->nbytes, meta->is_dead ? ", dead" : "");
	p = parked_find(ctx, h, key, (uint16_t)key_len, step_id, to);
	if (!p && ctx->nheld) {
		/* The request may be among the messages the last progress call held back. */
		tfab__held_dispatch(ctx);
		if (s->state == TFAB_SEND_WAITING)
			p = parked_find(ctx, h, key, (uint16_t)key_len, step_id, to);
	}
	if (p) {
		take_parked(ctx, s, p);
		answer(ctx, s);
		/* TAKEN held by the last progress call goes with the next one: the peer reads
		 * this content without it in front */
		tfab__peers_flush(ctx, true);
	}
	tfab__ctx_unlock(ctx);
	return 0;
err:
	tfab__send_free(ctx, s);
	tfab__ctx_unlock(ctx);
	return rc;
err_locked:
	tfab__ctx_unlock(ctx);
err_data:
	if (data_pool && data)
		tfab__pool_free(ctx->pool, data);
	return rc;
}

static int send_dltensor(struct tfab_context *ctx, struct tfab_peer *to, const char *key,
			 int64_t step_id, const DLTensor *t, bool is_dead, unsigned flags,
			 tfab_send_cb cb, void *arg)
{
	struct tfab_wire_meta meta;
	void *data;
	int rc;

	if (!ctx || !t || !cb)
		return -EINVAL;
	rc = tfab__meta_from_dltensor(t, is_dead, &meta, &data);
	if (rc)
		return rc;
	if (tfab__on_gpu(t)) {
		tfab__ctx_lock(ctx);
		rc = tfab__check_gpu(ctx, t);
		tfab__ctx_unlock(ctx);
		if (rc)
			return rc;
	}
	if (tfab__on_gpu(t))
		flags |= TFAB_SEND_GPU;
	return tfab__send_start(ctx, to, key, step_id, &meta, data, flags, cb, arg);
}

int tfab_send(struct tfab_context *ctx, const char *key, int64_t step_id, const DLTensor *t,
	      bool is_dead, tfab_send_cb cb, void *arg)
{
	int rc = tfab__check_step("send", key, step_id);

	return rc ? rc : send_dltensor(ctx, NULL, key, step_id, t, is_dead, 0, cb, arg);
}

int tfab_send_to(struct tfab_context *ctx, struct tfab_peer *peer, const char *key, int64_t step_id,
		 const DLTensor *t, bool is_dead, tfab_send_cb cb, void *arg)
{
	int rc = tfab__check_step("send", key, step_id);

	return rc ? rc : tfab__send_to(ctx, peer, key, step_id, t, is_dead, 0, cb, arg);
}

int tfab__send_to(struct tfab_context *ctx, struct tfab_peer *peer, const char *key, int64_t step,
		  const DLTensor *t, bool is_dead, unsigned flags, tfab_send_cb cb, void *arg)
{
	if (!peer)
		return -EINVAL;
	return send_dltensor(ctx, peer, key, step, t, is_dead, flags & TFAB_SEND_BOUNDED, cb, arg);
}
