/*
 * Collectives on a world (doc/world.md, "Collectives"): allreduce, broadcast, allgather,
 * reduce-scatter, barrier, reduce, gather, scatter and all-to-all as ordinary sends and
 * receives between the world's peers.
 *
 * A collective is a small program of operations, each a send to or a receive from one rank,
 * with the operations it waits for: a ring's step waits for the piece it forwards to have
 * come and been reduced. Every operation's callback marks it ended and posts what it freed;
 * one thread at a time posts (drive: the others leave their work to it), never holding the
 * world's lock across a call into the engine, whose callbacks may run inside that call.
 *
 * A failure drains: the collective posts at once every receive it has not posted (into pool
 * blocks it drops) and a dead tensor for every send it has not posted, so that the
 * neighbours waiting for them fail at once, and theirs in turn; it ends when every operation
 * it posted has ended. So every rank, failed or not, takes every send addressed to it that
 * it has not given up on; a send that its rank gave up on by the stall deadline (or never
 * asks for) fails by the same deadline (TFAB_SEND_BOUNDED), and nothing waits for ever on a
 * rank that gave up.
 */
#include <errno.h>
#include <stddef.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tfab/status.h>
#include <tfab/world.h>

#include "engine/engine_world.h"
#include "world/reduce.h"
#include "world/world.h"
#include "util/log.h"
#include "util/time.h"

#define SUBSYS "coll"

/*
 * A collective's step id: numbered from INT64_MIN up, below any step an application uses, so
 * that its (key, step) pairs never meet the application's.
 */
#define COLL_STEP(seq) (INT64_MIN + (int64_t)(seq))
/*
 * From this many ranks an allreduce of at most TFAB_ALLREDUCE_SMALL bytes takes recursive
 * doubling, log2(N) steps with a partner each, rather than N-1 messages a rank at once.
 */
#define DOUBLING_RANKS 16

enum op_kind {
	OP_SEND,
	OP_RECV_POOL, /* into a pool tensor, then its action */
	OP_RECV_INTO, /* straight into the collective's tensor */
};

enum op_act {
	ACT_NONE,
	ACT_REDUCE, /* buf = tensor op local; an average divides at the last */
	ACT_ACCUM,  /* tensor = tensor op local, kept for the send that forwards it */
	ACT_HOLD,   /* kept whole until the collective folds them (direct allreduce) */
	/* Compressed allreduce (fp32): */
	ACT_ZREDUCE, /* buf = local + decompressed tensor; the last finishes the part (zfinish) */
	ACT_ZCOPY,   /* buf = decompressed tensor, kept for the send that forwards it */
	ACT_CHECK,   /* the tensor must be len bytes equal to local's; else the op fails */
};

enum op_state {
	ST_WAIT,  /* for the operations it depends on */
	ST_READY, /* queued to be posted */
	ST_POSTED,
	ST_ENDED,
};

/*
 * A COLL_DATA message's operand, copied out of the control slot: until the operation it is
 * for is posted (on the world's early list), and then kept by it where its action keeps the
 * bytes (as a pool tensor is kept: held).
 */
struct eager_msg {
	struct tfab_list link; /* w->early */
	struct tfab_peer *from;
	uint64_t seq; /* the collective's */
	uint32_t step, piece;
	char tag;
	bool dead;
	uint16_t len;
	_Alignas(max_align_t) uint8_t bytes[]; /* as aligned as any element type */
};

struct coll_op {
	struct tfab_coll *c;
	uint8_t kind, act, state;
	bool last;  /* ACT_REDUCE: the part's last reduction */
	bool eager; /* its bytes travel in a COLL_DATA message (len <= TFAB_COLL_EAGER) */
	/*
	 * Gated: it waits for the operations before it even while the collective drains, and
	 * goes (posted, or drained) only if each of them passed its check (ACT_CHECK); else it
	 * ends unposted (skip). For operations whose way both ends must agree on first: a check
	 * that fails on one end fails on the other too, and neither posts.
	 */
	bool gated, skip;
	bool passed; /* ACT_CHECK: its tensor came and was right */
	/*
	 * A send of what the other end's check reads: it goes as it is even in a drain (not as
	 * a dead tensor). A dead one would fail that check where this end's passed, and the
	 * two ends would disagree on what their gated operations do: one would wait for a
	 * tensor the other skipped, until the stall deadline.
	 */
	bool verdict;
	char tag; /* the key: "tfab.c/<tag><step>.<piece>" */
	uint8_t nnext;
	uint16_t ndeps; /* operations still to end before this one is posted */
	uint32_t step, piece;
	uint32_t next[2];     /* the operations that wait for this one */
	int rank;	      /* the peer's */
	int32_t from;	      /* OP_SEND: sends the tensor that receive `from` keeps (-1: buf) */
	uint8_t *buf;	      /* OP_SEND: the bytes sent; OP_RECV_INTO: where they land;
			     ACT_REDUCE: where the result goes */
	const uint8_t *local; /* ACT_REDUCE, ACT_ACCUM: this rank's operand */
	size_t len;	      /* bytes */
	/*
	 * Compression: a send with zsrc compresses its nelem values (plus resid, the error
	 * feedback of this range) into buf just before it is posted; ACT_ZREDUCE's last
	 * compresses the finished part into zdst (the owner's send) and takes it back.
	 */
	size_t nelem;
	const float *zsrc;
	float *resid;
	uint8_t *zdst;
	DLManagedTensor *held;	/* OP_RECV_POOL: its tensor, while it is needed */
	struct eager_msg *kept; /* the same, for an eager one */
	uint64_t posted_ms;	/* an eager receive: when it was posted (the stall deadline) */
	int64_t shape;		/* of view */
	DLTensor view;		/* what is sent or received: len bytes */
};

struct tfab_coll {
	struct tfab_list link;	   /* w->colls */
	struct tfab_list run_link; /* w->runnable, while queued */
	bool queued;
	struct tfab_world *w;
	const char *what;
	uint64_t seq;
	int64_t step;
	enum tfab_op op;
	enum tfab_rtype rt;
	size_t esize;
	int status; /* the first failure */
	bool draining;
	bool fold; /* direct allreduce, reduce: reduce the kept tensors in rank order at the end */
	uint8_t
	    fold_stride; /* the receive of the k-th other rank is operation stride k + stride - 1 */
	enum tfab_compress compress;
	void *zbuf; /* compressed allreduce: a pool block holding every piece it sends */
	uint64_t bytes_logical, bytes_wire; /* of its sends as tensors (eager ones: eager_send) */
	bool tensors;			    /* some of its operations go as tensors, not eager */
	uint8_t *out;
	const uint8_t *in;
	size_t nbytes;
	uint32_t nops, unended;
	uint32_t *ready, ready_head, ready_tail;
	/* A direct allreduce through the segments (coll_shm.c): no operations. */
	bool fast, put;		    /* through them; its operand put */
	uint64_t fseq;		    /* its number among those */
	uint64_t started_ms;	    /* the stall deadline's start */
	struct tfab_list fast_link; /* w->fast, until its operands are read or given up on */
	struct coll_op *ops;
	int64_t *words; /* alltoallv: the counts that each pair checks (alltoallv_check) */
	tfab_coll_cb cb;
	void *arg;
	int32_t barrier[1];
};

static const DLDataType BYTES = {kDLUInt, 8, 1};

static int mod(int a, int n)
{
	return ((a % n) + n) % n;
}

static const struct tfab_coll_hooks hooks;

int tfab__coll_init(struct tfab_world *w)
{
	const struct tfab_config *cfg = tfab__ctx_config(w->ctx);
	pthread_condattr_t ca;
	int rc;

	tfab__list_init(&w->colls);
	tfab__list_init(&w->runnable);
	tfab__list_init(&w->early);
	tfab__list_init(&w->fast);
	w->small = cfg->allreduce_small;
	w->piece = cfg->coll_piece;
	w->eager = cfg->coll_eager;
	rc = tfab__htable_init(&w->residuals, 16);
	if (rc)
		return rc;
	pthread_mutex_init(&w->coll_lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&w->coll_cond, &ca);
	pthread_condattr_destroy(&ca);
	w->coll_up = true;
	/*
	 * One world per context takes the hooks; another one sends its operands as tensors, and
	 * has no segments (nothing would poll them).
	 */
	w->hooked = !tfab__ctx_coll_taken(w->ctx);
	if (w->hooked)
		tfab__ctx_set_coll(w->ctx, &hooks, w);
	else
		w->eager = 0;
	return 0;
}

void tfab__coll_joined(struct tfab_world *w)
{
	struct tfab_context *ctx = w->ctx;

	/* Under both locks, so that no report of the engine's (on_fail) falls between. */
	tfab__ctx_lock(ctx);
	pthread_mutex_lock(&w->coll_lock);
	w->joined = true;
	w->aborted = tfab__ctx_aborted(ctx);
	for (int r = 0; r < w->size; r++) {
		w->rank_failed[r] = w->peers[r] ? tfab__peer_failed(w->peers[r]) : 0;
		if (w->rank_failed[r])
			w->failed_order[w->nfailed++] = r; /* in the join: no order known */
	}
	pthread_mutex_unlock(&w->coll_lock);
	tfab__ctx_unlock(ctx);
}

int tfab__coll_fini(struct tfab_world *w)
{
	if (!w->coll_up)
		return 0;
	pthread_mutex_lock(&w->coll_lock);
	if (!tfab__list_empty(&w->colls)) {
		pthread_mutex_unlock(&w->coll_lock);
		return -EBUSY;
	}
	/* A thread that ended the last one may still be in drive: it touches w until it leaves. */
	while (w->driving)
		pthread_cond_wait(&w->coll_cond, &w->coll_lock);
	pthread_mutex_unlock(&w->coll_lock);
	tfab__htable_fini_free(&w->residuals);
	if (w->hooked)
		tfab__ctx_set_coll(w->ctx, NULL, NULL);
	tfab__coll_shm_free(w);
	while (!tfab__list_empty(&w->early)) {
		struct tfab_list *l = w->early.next;

		tfab__list_del(l);
		free(tfab_container_of(l, struct eager_msg, link));
	}
	pthread_cond_destroy(&w->coll_cond);
	pthread_mutex_destroy(&w->coll_lock);
	w->coll_up = false;
	return 0;
}

static struct tfab_coll *coll_new(struct tfab_world *w, const char *what, uint32_t nops,
				  tfab_coll_cb cb, void *arg)
{
	/* One allocation: the collective, its operations, then its ready queue. */
	struct tfab_coll *c = calloc(1, sizeof(*c) + nops * (sizeof(*c->ops) + sizeof(*c->ready)));

	if (!c)
		return NULL;
	c->ops = (struct coll_op *)(c + 1);
	c->ready = (uint32_t *)(c->ops + nops);
	tfab__list_init(&c->link);
	tfab__list_init(&c->run_link);
	c->w = w;
	c->what = what;
	c->nops = c->unended = nops;
	c->cb = cb;
	c->arg = arg;
	for (uint32_t i = 0; i < nops; i++) {
		c->ops[i].c = c;
		c->ops[i].from = -1;
	}
	return c;
}

static void coll_free(struct tfab_coll *c)
{
	for (uint32_t i = 0; i < c->nops; i++) {
		if (c->ops[i].held)
			c->ops[i].held->deleter(c->ops[i].held);
		free(c->ops[i].kept);
	}
	if (c->zbuf)
		tfab__pool_free(tfab__ctx_pool(c->w->ctx), c->zbuf);
	free(c->words);
	free(c);
}

/* Operation i of c is `kind` with `rank`, keyed tag/step/piece, over len bytes at buf. */
static struct coll_op *op_set(struct tfab_coll *c, uint32_t i, enum op_kind kind, int rank,
			      char tag, uint32_t step, uint32_t piece, uint8_t *buf, size_t len)
{
	struct coll_op *op = &c->ops[i];

	op->kind = (uint8_t)kind;
	op->rank = rank;
	op->tag = tag;
	op->step = step;
	op->piece = piece;
	op->buf = buf;
	op->len = len;
	return op;
}

/* Operation `after` is posted only once `before` has ended. */
static void op_after(struct tfab_coll *c, uint32_t before, uint32_t after)
{
	struct coll_op *b = &c->ops[before];

	b->next[b->nnext++] = after;
	c->ops[after].ndeps++;
}

static void coll_queue(struct tfab_coll *c)
{
	if (!c->queued) {
		c->queued = true;
		tfab__list_add_tail(&c->w->runnable, &c->run_link);
	}
}

static void op_ready(struct tfab_coll *c, struct coll_op *op)
{
	op->state = ST_READY;
	c->ready[c->ready_tail++] = (uint32_t)(op - c->ops);
	coll_queue(c);
}

static const char *status_text(int status)
{
	return status == -TFAB_ERR_PEER_FAILED ? "a rank failed" : tfab_strerror(status);
}

static void op_ended(struct tfab_coll *c, struct coll_op *op, int status);

/* Whether op is a receive whose operand comes in a COLL_DATA message. */
static bool eager_recv(const struct coll_op *op)
{
	return op->eager && op->kind != OP_SEND;
}

/*
 * The first failure decides, but for one: a check's own verdict (an alltoallv's counts that
 * differ, -EINVAL) goes before a failure passed on. The rank across the pair fails on the
 * same mismatch and passes it on at once, and what it passes on through a third rank may come
 * before its counts: the pair's own verdict is the one that says what to fix. Every operation
 * not posted yet is posted at once (drain).
 */
static void coll_fail(struct tfab_coll *c, struct coll_op *op, int status)
{
	if (!c->status ||
	    (op->act == ACT_CHECK && status == -EINVAL && c->status == -TFAB_ERR_PEER_FAILED)) {
		c->status = status;
		TFAB_WARN(SUBSYS,
			  "rank %d: %s %" PRIu64 " failed (%s, with rank %d on tfab.c/%c%u.%u): "
			  "it ends once what it posted has ended",
			  c->w->rank, c->what, c->seq, status_text(status), op->rank, op->tag,
			  op->step, op->piece);
	}
	if (c->draining)
		return;
	c->draining = true;
	for (uint32_t i = 0; i < c->nops; i++) {
		struct coll_op *o = &c->ops[i];

		if (o->state == ST_WAIT && !(o->gated && o->ndeps))
			op_ready(c, o);
		/*
		 * An eager receive holds nothing of its sender's: it need not wait. A check's
		 * verdict is awaited: the operations it gates go or not by it.
		 */
		else if (o->state == ST_POSTED && eager_recv(o) && o->act != ACT_CHECK)
			op_ended(c, o, 0);
	}
}

/* op ended with status (lock held): what waited for it may go. */
static void op_ended(struct tfab_coll *c, struct coll_op *op, int status)
{
	op->state = ST_ENDED;
	c->unended--;
	if (status)
		coll_fail(c, op, status);
	for (unsigned k = 0; k < op->nnext; k++) {
		struct coll_op *n = &c->ops[op->next[k]];

		if (n->gated && !op->passed)
			n->skip = true;
		if (c->draining && !n->gated)
			continue; /* the drain made it ready */
		if (--n->ndeps == 0 && n->state == ST_WAIT)
			op_ready(c, n);
	}
	if (c->unended == 0)
		coll_queue(c);
}

static void drive(struct tfab_world *w);

/* The bytes a receive keeps (for a send that forwards them, or the fold), or NULL. */
static uint8_t *kept_data(const struct coll_op *op)
{
	if (op->held)
		return op->held->dl_tensor.data;
	return op->kept ? op->kept->bytes : NULL;
}

/* Whether a receive into a pool tensor keeps it after its action. */
static bool keeps_bytes(const struct coll_op *op)
{
	return op->kind == OP_RECV_POOL &&
	       (op->act == ACT_ACCUM || op->act == ACT_HOLD || (op->act == ACT_ZCOPY && op->nnext));
}

/*
 * A send (lock held) no longer needs the bytes it forwards: an eager operand is freed, a pool
 * tensor returned for the caller to delete once the lock is dropped.
 */
static DLManagedTensor *release_from(struct tfab_coll *c, struct coll_op *op)
{
	DLManagedTensor *t = NULL;

	if (op->from >= 0) {
		struct coll_op *f = &c->ops[op->from];

		t = f->held;
		f->held = NULL;
		free(f->kept);
		f->kept = NULL;
	}
	return t;
}

static void on_sent(void *arg, int status)
{
	struct coll_op *op = arg;
	struct tfab_coll *c = op->c;
	struct tfab_world *w = c->w;
	DLManagedTensor *t = NULL;

	pthread_mutex_lock(&w->coll_lock);
	t = release_from(c, op);
	op_ended(c, op, status);
	drive(w);
	pthread_mutex_unlock(&w->coll_lock);
	if (t)
		t->deleter(t);
}

static int alltoallv_check(struct tfab_coll *c, struct coll_op *op, const int64_t *got);

/*
 * What a receive's tensor is for, done as it lands (no lock: nothing else touches it). 0, or
 * the failure of a check.
 */
static int op_act(struct tfab_coll *c, struct coll_op *op, void *data)
{
	size_t n = op->len / c->esize;

	switch (op->act) {
	case ACT_REDUCE:
		tfab__reduce(c->op, c->rt, op->buf, data, op->local, n);
		if (op->last && c->op == TFAB_OP_AVG)
			tfab__reduce_div(c->rt, op->buf, n, c->w->size);
		break;
	case ACT_ACCUM:
		tfab__reduce(c->op, c->rt, data, data, op->local, n);
		break;
	case ACT_ZREDUCE:
		tfab__decompress_add(c->compress, (float *)op->buf, (const float *)op->local, data,
				     op->nelem);
		if (!op->last)
			break;
		/* this rank's part is whole: what it sends on, and keeps, is its compression */
		if (c->op == TFAB_OP_AVG)
			tfab__reduce_div(c->rt, op->buf, op->nelem, c->w->size);
		tfab__compress(c->compress, op->zdst, (const float *)op->buf, op->resid, op->nelem);
		tfab__decompress_add(c->compress, (float *)op->buf, NULL, op->zdst, op->nelem);
		break;
	case ACT_ZCOPY:
		tfab__decompress_add(c->compress, (float *)op->buf, NULL, data, op->nelem);
		break;
	case ACT_CHECK:
		return alltoallv_check(c, op, data);
	default:
		break;
	}
	return 0;
}

static void on_recv(void *arg, int status, DLManagedTensor *t, bool is_dead)
{
	struct coll_op *op = arg;
	struct tfab_coll *c = op->c;
	struct tfab_world *w = c->w;

	if (status == 0 && is_dead)
		status = -TFAB_ERR_PEER_FAILED; /* the rank before gave up: pass it on */
	if (status == 0 && t && op->kind == OP_RECV_POOL)
		status = op_act(c, op, t->dl_tensor.data);
	pthread_mutex_lock(&w->coll_lock);
	if (status == 0 && t && keeps_bytes(op) && !c->draining) {
		op->held = t;
		t = NULL;
	}
	op_ended(c, op, status);
	drive(w);
	pthread_mutex_unlock(&w->coll_lock);
	if (t)
		t->deleter(t);
}

static void on_dead_sent(void *arg, int status)
{
	(void)arg;
	(void)status;
}

/* Decimal digits of v at p; the end. */
static char *put_decimal(char *p, uint32_t v)
{
	char tmp[10];
	int n = 0;

	do {
		tmp[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	while (n)
		*p++ = tmp[--n];
	return p;
}

/* op's key, "tfab.c/<tag><step>.<piece>" (snprintf cost a collective of 8 bytes 5%). */
static void op_key(const struct coll_op *op, char *key)
{
	char *p = key;

	memcpy(p, "tfab.c/", 7);
	p += 7;
	*p++ = op->tag;
	p = put_decimal(p, op->step);
	*p++ = '.';
	p = put_decimal(p, op->piece);
	*p = '\0';
}

/*
 * An eager send (the context's lock held): its bytes (none, and the flag DEAD, when
 * draining) in a COLL_DATA control message, which the engine writes now or queues; either
 * way the bytes are copied, and the operation has ended.
 */
static int eager_send(struct tfab_coll *c, struct coll_op *op, bool drain, const uint8_t *src)
{
	struct tfab_context *ctx = c->w->ctx;
	struct tfab_wire_msg m = {.type = TFAB_MSG_COLL_DATA,
				  .flags = drain ? TFAB_MSGF_DEAD : 0,
				  .step_id = c->step,
				  .req_index = op->step,
				  .key_index = op->piece,
				  .coll_tag = (uint8_t)op->tag,
				  .data_len = drain ? 0 : (uint16_t)op->len,
				  .data = src};
	int rc;

	rc = tfab__ctx_aborted(ctx);
	if (rc == 0)
		rc = tfab__peer_send_msg(c->w->peers[op->rank], &m);
	if (rc == 0 && !drain) {
		struct tfab_stats *stats = tfab__ctx_stats(ctx);

		stats->coll_bytes_wire += op->len;
		stats->coll_bytes_logical += c->compress ? op->nelem * 4 : op->len;
	}
	return rc;
}

#define EAGER_BATCH 16

/*
 * Post op, an eager send, and the eager sends queued right behind it (up to EAGER_BATCH), in
 * one hold of the context's lock (coll_lock held on entry and on return). coll_lock is
 * dropped around the writes: one that fails at once fails its peer, whose report (on_fail)
 * takes coll_lock. The operations are posted meanwhile, so the collective cannot end.
 */
static void eager_sends(struct tfab_coll *c, struct coll_op *op, bool drain)
{
	struct tfab_world *w = c->w;
	struct tfab_context *ctx = w->ctx;
	struct coll_op *ops[EAGER_BATCH];
	uint8_t *srcs[EAGER_BATCH];
	int rcs[EAGER_BATCH];
	DLManagedTensor *held[EAGER_BATCH];
	unsigned n = 0, nheld = 0;

	for (;;) {
		uint8_t *src = op->from >= 0 ? kept_data(&c->ops[op->from]) : op->buf;

		op->state = ST_POSTED;
		if (!drain && src && op->zsrc)
			tfab__compress(c->compress, src, op->zsrc, op->resid, op->nelem);
		srcs[n] = src;
		ops[n++] = op;
		if (n == EAGER_BATCH || c->ready_head == c->ready_tail)
			break;
		op = &c->ops[c->ready[c->ready_head]];
		if (!op->eager || op->kind != OP_SEND || op->skip)
			break;
		c->ready_head++;
	}
	pthread_mutex_unlock(&w->coll_lock);
	tfab__ctx_lock(ctx);
	for (unsigned i = 0; i < n; i++) {
		bool dead = drain && !ops[i]->verdict;

		rcs[i] = dead || srcs[i] ? eager_send(c, ops[i], dead, srcs[i]) : -EINVAL;
	}
	tfab__ctx_unlock(ctx);
	pthread_mutex_lock(&w->coll_lock);
	for (unsigned i = 0; i < n; i++) {
		/* What it forwards came eager too (the same bytes): a pool tensor is not expected. */
		DLManagedTensor *t = release_from(c, ops[i]);

		if (t)
			held[nheld++] = t;
		op_ended(c, ops[i], rcs[i]);
	}
	if (nheld) {
		pthread_mutex_unlock(&w->coll_lock);
		for (unsigned i = 0; i < nheld; i++)
			held[i]->deleter(held[i]);
		pthread_mutex_lock(&w->coll_lock);
	}
}

/* Post op (no lock held); src: the bytes a send reads. 0 or why it could not be posted. */
static int op_post(struct tfab_coll *c, struct coll_op *op, bool drain, uint8_t *src)
{
	struct tfab_world *w = c->w;
	struct tfab_context *ctx = w->ctx;
	struct tfab_peer *peer = w->peers[op->rank];
	struct tfab_recv_args a = {.cb = on_recv, .arg = op};
	static uint8_t none;
	char key[48];

	op_key(op, key);
	op->shape = (int64_t)op->len;
	op->view = (DLTensor){.data = op->kind == OP_SEND ? src : op->buf,
			      .device = {kDLCPU, 0},
			      .ndim = 1,
			      .dtype = BYTES,
			      .shape = &op->shape};
	if (op->kind == OP_SEND) {
		if (!drain && op->zsrc)
			tfab__compress(c->compress, src, op->zsrc, op->resid, op->nelem);
		if (!drain) {
			c->bytes_wire += op->len;
			c->bytes_logical += c->compress ? op->nelem * 4 : op->len;
		}
		if (drain) {
			op->view.data = &none;
			return tfab__send_to(ctx, peer, key, c->step, &op->view, true,
					     TFAB_SEND_BOUNDED, on_dead_sent, NULL);
		}
		return tfab__send_to(ctx, peer, key, c->step, &op->view, false, TFAB_SEND_BOUNDED,
				     on_sent, op);
	}
	if (op->kind == OP_RECV_INTO && !drain)
		a.dest = &op->view;
	else
		a.like = &op->view;
	return tfab__recv_post(ctx, peer, key, c->step, &a);
}

/* Rank k's operand of a fold: this rank's input, or what the receive from rank k keeps. */
static const uint8_t *fold_operand(const struct tfab_coll *c, int k)
{
	int r = c->w->rank;
	uint32_t i = (uint32_t)(k < r ? k : k - 1); /* among the other ranks */

	return k == r ? c->in : kept_data(&c->ops[c->fold_stride * i + c->fold_stride - 1]);
}

/*
 * The end of a direct allreduce or a reduce on its root: every rank's tensor reduced in rank
 * order into out.
 */
static void coll_fold(struct tfab_coll *c)
{
	struct tfab_world *w = c->w;
	const uint8_t *x[2];
	uint8_t *acc = NULL;
	size_t n = c->nbytes / c->esize;
	int r = w->rank;

	for (int k = 0; k < 2; k++)
		x[k] = fold_operand(c, k);
	acc = (uint8_t *)x[r == 0 ? 1 : 0]; /* a pool tensor's, or an eager operand's */
	tfab__reduce(c->op, c->rt, acc, x[0], x[1], n);
	for (int k = 2; k < w->size; k++)
		tfab__reduce(c->op, c->rt, acc, acc, fold_operand(c, k), n);
	if (c->op == TFAB_OP_AVG)
		tfab__reduce_div(c->rt, acc, n, w->size);
	memcpy(c->out, acc, c->nbytes);
}

/*
 * An eager receive's operand has come (lock held, op posted): its bytes land, its action runs,
 * and it ends. m is the operation's from now on (kept or freed).
 */
static void eager_land(struct tfab_coll *c, struct coll_op *op, struct eager_msg *m)
{
	int status = 0;

	if (m->dead) {
		status = -TFAB_ERR_PEER_FAILED; /* the rank before gave up: pass it on */
	} else if (m->len != op->len) {
		TFAB_WARN(SUBSYS,
			  "rank %d: %s %" PRIu64 ": rank %d sent %u bytes for tfab.c/%c%u.%u, "
			  "where this rank expects %zu (do the ranks run the same collectives?)",
			  c->w->rank, c->what, c->seq, op->rank, m->len, op->tag, op->step,
			  op->piece, op->len);
		status = -TFAB_ERR_PROTOCOL;
	} else if (!c->draining || op->act == ACT_CHECK) {
		if (op->kind == OP_RECV_INTO)
			memcpy(op->buf, m->bytes, op->len);
		else
			status = op_act(c, op, m->bytes);
		if (status == 0 && keeps_bytes(op)) {
			op->kept = m;
			m = NULL;
		}
	}
	free(m);
	op_ended(c, op, status);
}

/* The operand that came for op before it was posted, taken off the early list; or NULL. */
static struct eager_msg *early_take(struct tfab_world *w, const struct coll_op *op)
{
	struct tfab_list *l;

	for (l = w->early.next; l != &w->early; l = l->next) {
		struct eager_msg *m = tfab_container_of(l, struct eager_msg, link);

		if (m->seq == op->c->seq && m->from == w->peers[op->rank] && m->tag == op->tag &&
		    m->step == op->step && m->piece == op->piece) {
			tfab__list_del(&m->link);
			w->nearly--;
			return m;
		}
	}
	return NULL;
}

/* Operands that came for c and were never taken (it drained), dropped as it ends. */
static void early_drop(struct tfab_world *w, uint64_t seq)
{
	struct tfab_list *l, *t;

	tfab_list_for_each_safe(l, t, &w->early)
	{
		struct eager_msg *m = tfab_container_of(l, struct eager_msg, link);

		if (m->seq == seq) {
			tfab__list_del(&m->link);
			w->nearly--;
			free(m);
		}
	}
}

/*
 * Post an eager receive (lock held): it lands what came before it; else it fails as a posted
 * receive would if the peer failed or the context aborted, or waits for its operand
 * (on_data), the peer's failure (on_fail) or its deadline (on_tick).
 */
static void eager_recv_post(struct tfab_coll *c, struct coll_op *op, bool drain)
{
	struct tfab_world *w = c->w;
	struct eager_msg *m;
	int rc = w->aborted ? w->aborted : w->rank_failed[op->rank];

	op->state = ST_POSTED;
	/*
	 * Draining, nothing to take: its sender's send has ended. But a check waits for its
	 * verdict, as the other end's does (its sender's counts go even in a drain).
	 */
	if (drain && op->act != ACT_CHECK) {
		op_ended(c, op, 0);
		return;
	}
	/* What came is good even if its sender has failed (or left) since. */
	m = early_take(w, op);
	if (m)
		eager_land(c, op, m);
	else if (rc)
		op_ended(c, op, rc);
	else
		op->posted_ms = tfab__coarse_ms();
}

/*
 * Post what is ready, and end what has ended, until nothing is left to do (lock held; it is
 * dropped around every call into the engine and every callback of the application). A
 * thread that finds another one driving leaves its work to it.
 */
static void drive(struct tfab_world *w)
{
	if (w->driving)
		return;
	w->driving = true;
	w->driver = pthread_self();
	while (!tfab__list_empty(&w->runnable)) {
		struct tfab_coll *c =
		    tfab_container_of(w->runnable.next, struct tfab_coll, run_link);

		tfab__list_del(&c->run_link);
		c->queued = false;
		while (c->ready_head < c->ready_tail) {
			struct coll_op *op = &c->ops[c->ready[c->ready_head++]];
			bool drain = c->draining;
			uint8_t *src = op->buf;
			int rc;

			if (op->skip) {
				op->state = ST_POSTED;
				op_ended(c, op, 0);
				continue;
			}
			if (op->eager) {
				if (op->kind == OP_SEND)
					eager_sends(c, op, drain);
				else
					eager_recv_post(c, op, drain);
				continue;
			}
			if (op->from >= 0)
				src = kept_data(&c->ops[op->from]);
			drain = drain && !op->verdict;
			if (!drain && op->kind == OP_SEND && !src) {
				op_ended(c, op, -EINVAL);
				continue;
			}
			op->state = ST_POSTED;
			pthread_mutex_unlock(&w->coll_lock);
			rc = op_post(c, op, drain, src);
			pthread_mutex_lock(&w->coll_lock);
			/* A dead tensor is fire and forget: the rank after takes it, or fails. */
			if (rc || (drain && op->kind == OP_SEND)) {
				DLManagedTensor *t = release_from(c, op);

				op_ended(c, op, rc);
				if (t) {
					pthread_mutex_unlock(&w->coll_lock);
					t->deleter(t);
					pthread_mutex_lock(&w->coll_lock);
				}
			}
		}
		if (c->unended == 0 && !c->queued) {
			/* It stays listed until its callback returned: tfab_world_wait waits for that. */
			early_drop(w, c->seq);
			pthread_mutex_unlock(&w->coll_lock);
			if (c->fold && !c->status)
				coll_fold(c);
			if (c->status)
				TFAB_DEBUG(SUBSYS, "rank %d: %s %" PRIu64 " ended: %s", w->rank,
					   c->what, c->seq, tfab_strerror(c->status));
			/*
			 * The verdicts of its receives go now, not with the next write or call: the
			 * application may compute for a while before its next call, and the ranks
			 * that sent to this one are waiting for them.
			 */
			if (c->tensors) {
				struct tfab_stats *stats = tfab__ctx_stats(w->ctx);

				tfab__ctx_lock(w->ctx);
				stats->coll_bytes_wire += c->bytes_wire;
				stats->coll_bytes_logical += c->bytes_logical;
				tfab__peers_flush(w->ctx, false);
				tfab__ctx_unlock(w->ctx);
			}
			c->cb(c->arg, c->status);
			pthread_mutex_lock(&w->coll_lock);
			tfab__list_del(&c->link);
			atomic_fetch_add_explicit(&w->ended, 1, memory_order_relaxed);
			pthread_cond_broadcast(&w->coll_cond);
			pthread_mutex_unlock(&w->coll_lock);
			coll_free(c);
			pthread_mutex_lock(&w->coll_lock);
		}
	}
	w->driving = false;
	pthread_cond_broadcast(&w->coll_cond); /* for tfab__coll_fini */
}

/* A direct allreduce through the segments: every rank's operand, reduced in rank order. */
static void fast_fold(struct tfab_coll *c)
{
	struct tfab_world *w = c->w;
	size_t n = c->nbytes / c->esize;

	tfab__reduce(c->op, c->rt, c->out, tfab__coll_shm_operand(w, 0, c->fseq),
		     tfab__coll_shm_operand(w, 1, c->fseq), n);
	for (int k = 2; k < w->size; k++)
		tfab__reduce(c->op, c->rt, c->out, c->out, tfab__coll_shm_operand(w, k, c->fseq),
			     n);
	if (c->op == TFAB_OP_AVG)
		tfab__reduce_div(c->rt, c->out, n, w->size);
}

/* c is done with the segments (lock held): drive calls it back. */
static void fast_end(struct tfab_world *w, struct tfab_coll *c, int status)
{
	struct tfab_coll_counts *counts = tfab__ctx_coll_counts(w->ctx);

	tfab__coll_shm_done(w, c->fseq);
	if (c->put)
		atomic_fetch_add_explicit(&counts->shm_bytes, c->nbytes, memory_order_relaxed);
	if (!status)
		atomic_fetch_add_explicit(&counts->shm, 1, memory_order_relaxed);
	tfab__list_del(&c->fast_link);
	atomic_fetch_sub_explicit(&counts->polls, 1, memory_order_relaxed);
	c->status = status;
	coll_queue(c);
}

/*
 * The allreduces through the segments (lock held): their operands put in their order as far
 * as slots are free, their results folded in that order as every rank's operands are there.
 * The first that waits stops the rest; it fails where the rank it waits for failed, the context
 * aborted, or the stall deadline (TFAB_OP_TIMEOUT_MS) passed. Whether any ended.
 */
static bool fast_poll(struct tfab_world *w)
{
	uint64_t limit = tfab__ctx_config(w->ctx)->op_timeout_ms, now;
	bool any = false, ended = true;

	while (ended && !tfab__list_empty(&w->fast)) {
		struct tfab_coll *c = tfab_container_of(w->fast.next, struct tfab_coll, fast_link);
		int behind = w->rank, who, rc = 0;
		struct tfab_list *l;

		/* Not after an abort, as no message goes then. */
		for (l = w->fast.next; l != &w->fast && !w->aborted; l = l->next) {
			struct tfab_coll *p = tfab_container_of(l, struct tfab_coll, fast_link);

			if (!p->put &&
			    !(p->put = tfab__coll_shm_put(w, p->fseq, p->in, p->nbytes, &behind)))
				break;
		}
		who = behind;
		if (c->put)
			rc = tfab__coll_shm_ready(w, c->fseq, c->nbytes, &who);
		if (rc == 1) {
			fast_fold(c);
			fast_end(w, c, 0);
			any = true;
			continue;
		}
		if (rc == 0)
			rc = w->aborted;
		/* Any failed rank it waits on, not only the first (who may be alive, and late). */
		for (int r = 0; rc == 0 && r < w->size; r++) {
			if (w->rank_failed[r] && tfab__coll_shm_waits_on(w, c->fseq, c->put, r)) {
				rc = w->rank_failed[r];
				who = r;
			}
		}
		now = tfab__coarse_ms();
		if (rc == 0 && limit && now > c->started_ms && now - c->started_ms >= limit) {
			TFAB_WARN(SUBSYS,
				  "rank %d: %s %" PRIu64 ": nothing from rank %d for %" PRIu64
				  " ms (through the segments); failed (TFAB_OP_TIMEOUT_MS)",
				  w->rank, c->what, c->seq, who, now - c->started_ms);
			rc = -TFAB_ERR_TIMEOUT;
		}
		ended = rc != 0;
		if (!ended)
			break;
		if (rc != -TFAB_ERR_TIMEOUT)
			TFAB_WARN(SUBSYS, "rank %d: %s %" PRIu64 " failed (%s, with rank %d)",
				  w->rank, c->what, c->seq, status_text(rc), who);
		fast_end(w, c, rc);
		any = true;
	}
	return any;
}

/* Whether a direct allreduce of nbytes goes through the segments (the same on every rank). */
static bool via_segments(const struct tfab_world *w, size_t nbytes)
{
	return w->size > 1 && nbytes >= 1 && nbytes <= w->shm_max;
}

/* Number c, and post what needs nothing first. */
static void coll_start(struct tfab_coll *c)
{
	struct tfab_world *w = c->w;

	pthread_mutex_lock(&w->coll_lock);
	c->seq = w->coll_seq++;
	c->step = COLL_STEP(c->seq);
	tfab__list_add_tail(&w->colls, &c->link);
	if (c->fast) {
		c->fseq = w->shm_seq++;
		c->started_ms = tfab__coarse_ms();
		tfab__list_add_tail(&w->fast, &c->fast_link);
		atomic_fetch_add_explicit(&tfab__ctx_coll_counts(w->ctx)->polls, 1,
					  memory_order_relaxed);
		fast_poll(w);
		drive(w);
		pthread_mutex_unlock(&w->coll_lock);
		return;
	}
	for (uint32_t i = 0; i < c->nops; i++) {
		/* Both ends of an operation reckon the same len, so they agree on its way. */
		c->ops[i].eager = c->ops[i].len >= 1 && c->ops[i].len <= w->eager;
		c->tensors |= !c->ops[i].eager;
		if (c->ops[i].ndeps == 0)
			op_ready(c, &c->ops[i]);
	}
	coll_queue(c);
	drive(w);
	pthread_mutex_unlock(&w->coll_lock);
}

/* A CPU tensor's bytes and where they are; -EINVAL for anything else (coll_gpu.c gives GPU
 * tensors' host views). */
static int tensor_bytes(const DLTensor *t, uint8_t **data_p, size_t *nbytes_p)
{
	struct tfab_wire_meta m;
	void *data;
	int rc;

	if (!t || t->device.device_type != kDLCPU)
		return -EINVAL;
	rc = tfab__meta_from_dltensor(t, false, &m, &data);
	if (rc)
		return rc;
	*data_p = data;
	*nbytes_p = (size_t)m.nbytes;
	return 0;
}

/* in's and out's bytes (tensor_bytes of each). */
static int in_out_bytes(const DLTensor *in, const DLTensor *out, uint8_t **ib_p, size_t *inb_p,
			uint8_t **ob_p, size_t *onb_p)
{
	int rc = tensor_bytes(in, ib_p, inb_p);

	return rc ? rc : tensor_bytes(out, ob_p, onb_p);
}

/* The element range [*start, *end) of part i of n parts of count elements. */
static void part(size_t count, int n, int i, size_t *start, size_t *end)
{
	*start = count * (size_t)i / (size_t)n;
	*end = count * (size_t)(i + 1) / (size_t)n;
}

/* Pieces per part: the largest part over TFAB_COLL_PIECE bytes, at least 1. */
static uint32_t pieces_of(const struct tfab_world *w, size_t part_bytes)
{
	size_t p = (part_bytes + w->piece - 1) / w->piece;

	return p ? (uint32_t)(p > UINT32_MAX / 8 ? UINT32_MAX / 8 : p) : 1;
}

/* Bytes [*off, *off + *len) of piece p of P of the element range [start, end). */
static void piece(size_t start, size_t end, uint32_t p, uint32_t P, size_t esize, size_t *off,
		  size_t *len)
{
	size_t n = end - start, a = start + n * p / P, b = start + n * (p + 1) / P;

	*off = a * esize;
	*len = (b - a) * esize;
}

static int check_world(const struct tfab_world *w, tfab_coll_cb cb)
{
	return w && cb ? 0 : -EINVAL;
}

/*
 * Whether in and out (inb and onb bytes) make a reduction into parts parts (an allreduce 1, a
 * reduce-scatter the world's size) with op: its type in *rt_p, or -EINVAL, logged here with
 * what is wrong.
 */
static int reduce_args(const char *what, const DLTensor *in, const DLTensor *out, size_t inb,
		       size_t onb, size_t parts, enum tfab_op op, enum tfab_rtype *rt_p)
{
	char a[TFAB_DTYPE_NAME_MAX], b[TFAB_DTYPE_NAME_MAX];

	if (in->dtype.code != out->dtype.code || in->dtype.bits != out->dtype.bits ||
	    in->dtype.lanes != out->dtype.lanes) {
		TFAB_ERROR(SUBSYS, "%s: in is %s and out %s: both must be of one dtype", what,
			   tfab_dtype_name(in->dtype, a, sizeof(a)),
			   tfab_dtype_name(out->dtype, b, sizeof(b)));
		return -EINVAL;
	}
	if (inb != onb * parts) {
		TFAB_ERROR(SUBSYS, "%s: in has %zu bytes and out %zu: in must have %s", what, inb,
			   onb, parts == 1 ? "out's" : "out's times the world's size");
		return -EINVAL;
	}
	if (tfab__rtype_of(in->dtype, rt_p)) {
		TFAB_ERROR(SUBSYS,
			   "%s: %s tensors are not reduced (float16, bfloat16, float32, float64, "
			   "and int8 to int64 and uint8 to uint64 are)",
			   what, tfab_dtype_name(in->dtype, a, sizeof(a)));
		return -EINVAL;
	}
	if ((unsigned)op > TFAB_OP_PROD) {
		TFAB_ERROR(SUBSYS, "%s: no operation %d", what, (int)op);
		return -EINVAL;
	}
	return 0;
}

/*
 * The ring allreduce: per piece p and step s (0 .. N-2), with next = rank + 1 and prev =
 * rank - 1: S[s] sends part rank - s (the input at s = 0, then what R[s-1] reduced); R[s]
 * receives part rank - s - 1 and reduces it into out (it, then this rank's); after N-1 steps
 * this rank holds part rank + 1 whole: G[0] sends it, G[s] forwards what A[s-1] received;
 * A[s] receives part rank - s into out, once S[s] (which read that part) has ended.
 */
static void build_ring_allreduce(struct tfab_coll *c, size_t count, uint32_t P)
{
	struct tfab_world *w = c->w;
	int N = w->size, r = w->rank, next = mod(r + 1, N), prev = mod(r - 1, N);
	uint32_t k = (uint32_t)N - 1;

	for (uint32_t p = 0; p < P; p++) {
		uint32_t base = p * 4 * k;

		for (uint32_t s = 0; s < k; s++) {
			size_t st, en, off, len;
			struct coll_op *op;

			part(count, N, mod(r - (int)s, N), &st, &en);
			piece(st, en, p, P, c->esize, &off, &len);
			op_set(c, base + s, OP_SEND, next, 'r', s, p,
			       (s == 0 ? (uint8_t *)c->in : c->out) + off, len);
			part(count, N, mod(r - (int)s - 1, N), &st, &en);
			piece(st, en, p, P, c->esize, &off, &len);
			op = op_set(c, base + k + s, OP_RECV_POOL, prev, 'r', s, p, c->out + off,
				    len);
			op->act = ACT_REDUCE;
			op->local = c->in + off;
			op->last = s == k - 1;
			part(count, N, mod(r + 1 - (int)s, N), &st, &en);
			piece(st, en, p, P, c->esize, &off, &len);
			op_set(c, base + 2 * k + s, OP_SEND, next, 'g', s, p, c->out + off, len);
			part(count, N, mod(r - (int)s, N), &st, &en);
			piece(st, en, p, P, c->esize, &off, &len);
			op_set(c, base + 3 * k + s, OP_RECV_INTO, prev, 'g', s, p, c->out + off,
			       len);
		}
		for (uint32_t s = 0; s < k; s++) {
			if (s > 0) {
				op_after(c, base + k + s - 1, base + k + s); /* R[s-1] -> R[s] */
				op_after(c, base + k + s - 1, base + s);     /* R[s-1] -> S[s] */
				op_after(c, base + 3 * k + s - 1, base + 2 * k + s); /* A -> G */
			}
			op_after(c, base + s, base + 3 * k + s); /* S[s] -> A[s] */
		}
		op_after(c, base + 2 * k - 1, base + 2 * k); /* R[N-2] -> G[0] */
	}
}

/*
 * The compressed ring (fp32): the same schedule, but every piece travels compressed. Each
 * rank compresses every part once: part rank - s at S[s] (from its input, then from what it
 * reduced) and its own whole part rank + 1 at R[N-2], which also takes that part back from
 * its compression so that every rank ends with the same bits; each compression adds the error
 * the last one of the same range left (resid, with opts.key). Receives land compressed in
 * pool blocks: R[s] adds the decompressed piece to this rank's, A[s] decompresses it into out
 * and keeps it for G[s+1], which forwards those same bytes.
 */
static void build_ring_zallreduce(struct tfab_coll *c, size_t count, uint32_t P, float *resid,
				  const size_t *zoff)
{
	struct tfab_world *w = c->w;
	int N = w->size, r = w->rank, next = mod(r + 1, N), prev = mod(r - 1, N);
	uint32_t k = (uint32_t)N - 1;
	uint8_t *zb = c->zbuf;

	for (uint32_t p = 0; p < P; p++) {
		uint32_t base = p * 4 * k;

		for (uint32_t s = 0; s < k; s++) {
			size_t st, en, off, len, n;
			int pc;
			struct coll_op *op;

			pc = mod(r - (int)s, N);
			part(count, N, pc, &st, &en);
			piece(st, en, p, P, 4, &off, &len);
			n = len / 4;
			op = op_set(c, base + s, OP_SEND, next, 'r', s, p,
				    zb + zoff[(size_t)pc * P + p],
				    tfab__compressed_size(c->compress, n));
			op->zsrc = (const float *)((s == 0 ? c->in : c->out) + off);
			op->nelem = n;
			op->resid = resid ? resid + off / 4 : NULL;

			pc = mod(r - (int)s - 1, N);
			part(count, N, pc, &st, &en);
			piece(st, en, p, P, 4, &off, &len);
			n = len / 4;
			op = op_set(c, base + k + s, OP_RECV_POOL, prev, 'r', s, p, c->out + off,
				    tfab__compressed_size(c->compress, n));
			op->act = ACT_ZREDUCE;
			op->local = c->in + off;
			op->nelem = n;
			op->last = s == k - 1;
			op->zdst = zb + zoff[(size_t)pc * P + p];
			op->resid = resid ? resid + off / 4 : NULL;

			pc = mod(r + 1 - (int)s, N);
			part(count, N, pc, &st, &en);
			piece(st, en, p, P, 4, &off, &len);
			n = len / 4;
			op = op_set(c, base + 2 * k + s, OP_SEND, next, 'g', s, p,
				    zb + zoff[(size_t)pc * P + p],
				    tfab__compressed_size(c->compress, n));
			op->nelem = n;
			if (s > 0)
				op->from = (int32_t)(base + 3 * k + s - 1);

			pc = mod(r - (int)s, N);
			part(count, N, pc, &st, &en);
			piece(st, en, p, P, 4, &off, &len);
			n = len / 4;
			op = op_set(c, base + 3 * k + s, OP_RECV_POOL, prev, 'g', s, p,
				    c->out + off, tfab__compressed_size(c->compress, n));
			op->act = ACT_ZCOPY;
			op->nelem = n;
		}
		for (uint32_t s = 0; s < k; s++) {
			if (s > 0) {
				op_after(c, base + k + s - 1, base + k + s); /* R[s-1] -> R[s] */
				op_after(c, base + k + s - 1, base + s);     /* R[s-1] -> S[s] */
				op_after(c, base + 3 * k + s - 1, base + 2 * k + s); /* A -> G */
			}
			op_after(c, base + s, base + 3 * k + s); /* S[s] -> A[s] */
		}
		op_after(c, base + 2 * k - 1, base + 2 * k); /* R[N-2] -> G[0] */
	}
}

/*
 * Where each piece's compression goes in one block: offsets zoff[c * P + p] for part c of N
 * and piece p of P; the block's size in *total_p. NULL without memory.
 */
static size_t *zlayout(enum tfab_compress how, size_t count, int N, uint32_t P, size_t *total_p)
{
	size_t *zoff = calloc((size_t)N * P, sizeof(*zoff)), total = 0;

	for (int pc = 0; zoff && pc < N; pc++) {
		size_t st, en;

		part(count, N, pc, &st, &en);
		for (uint32_t p = 0; p < P; p++) {
			size_t off, len;

			piece(st, en, p, P, 4, &off, &len);
			zoff[(size_t)pc * P + p] = total;
			total += (tfab__compressed_size(how, len / 4) + 63) & ~(size_t)63;
		}
	}
	*total_p = total;
	return zoff;
}

/* A rank's error feedback for the tensor named key: count floats, zero at first. */
struct residual {
	struct tfab_hnode node; /* w->residuals: freed whole with the table */
	size_t count;
	const char *key; /* after the values, in the same allocation */
	float r[];
};

static float *residual_of(struct tfab_world *w, const char *key, size_t count)
{
	uint64_t h = tfab__hash_bytes(key, strlen(key), 0);
	struct residual *e;

	for (struct tfab_hnode *n = tfab__htable_first(&w->residuals, h); n;
	     n = tfab__htable_next(n, h)) {
		e = tfab_container_of(n, struct residual, node);
		if (strcmp(e->key, key) != 0)
			continue;
		if (e->count == count)
			return e->r;
		TFAB_DEBUG(SUBSYS, "error feedback of '%s': %zu values now, %zu before: reset", key,
			   count, e->count);
		tfab__htable_remove(&w->residuals, n);
		free(e);
		break;
	}
	if (count > (SIZE_MAX - sizeof(*e) - strlen(key) - 1) / sizeof(float))
		return NULL;
	e = calloc(1, sizeof(*e) + count * sizeof(float) + strlen(key) + 1);
	if (!e)
		return NULL;
	e->count = count;
	e->key = strcpy((char *)(e->r + count), key);
	if (tfab__htable_insert(&w->residuals, &e->node, h)) {
		free(e);
		return NULL;
	}
	return e->r;
}

/* The direct allreduce: to every other rank the whole input, and from each its own. */
static void build_direct_allreduce(struct tfab_coll *c)
{
	struct tfab_world *w = c->w;
	uint32_t i = 0;

	for (int k = 0; k < w->size; k++) {
		if (k == w->rank)
			continue;
		op_set(c, i++, OP_SEND, k, 'd', 0, 0, (uint8_t *)c->in, c->nbytes);
		op_set(c, i++, OP_RECV_POOL, k, 'd', 0, 0, NULL, c->nbytes)->act = ACT_HOLD;
	}
	c->fold = true;
	c->fold_stride = 2; /* a send and a receive per other rank */
}

/*
 * Recursive doubling: p ranks (the largest power of two <= N) take part, in log2(p) steps; at
 * step s each exchanges its whole partial result with the one whose place differs in bit s,
 * and both reduce the two (the same two operands, so the same bits on both: the operations
 * are commutative). The first 2(N - p) ranks pair up first: the even one of each pair hands
 * its tensor to the odd one, which takes part with the two reduced, and takes the result back
 * at the end. Each rank talks to log2(p) peers at most, and one more.
 */
static bool overlap(const uint8_t *a, size_t na, const uint8_t *b, size_t nb);

static int doubling_place(int r, int extra)
{
	return r < 2 * extra ? (r % 2 ? r / 2 : -1) : r - extra;
}

static int doubling_rank(int place, int extra)
{
	return place < extra ? 2 * place + 1 : place + extra;
}

/* The ranks that take part (a power of two) and log2 of it. */
static int doubling_width(int n, int *log_p)
{
	int p = 1;

	*log_p = 0;
	while (p * 2 <= n) {
		p *= 2;
		++*log_p;
	}
	return p;
}

static uint32_t doubling_nops(const struct tfab_world *w)
{
	int L, extra = w->size - doubling_width(w->size, &L);

	if (w->rank < 2 * extra)
		return w->rank % 2 ? 2 + 2 * (uint32_t)L : 2;
	return 2 * (uint32_t)L;
}

/*
 * The schedule: S[s] sends this rank's partial, R[s] reduces the partner's with it into the
 * next one. Partials alternate between out and a pool block so that the last is out; the block
 * a step writes is the one the step before it sent, hence S[s-1] -> R[s] besides R[s-1] -> S[s]
 * and R[s-1] -> R[s]. An input that out overlaps is copied first, as the first send reads it
 * while the first reduction may write out.
 */
static int build_doubling_allreduce(struct tfab_coll *c)
{
	struct tfab_world *w = c->w;
	struct tfab_context *ctx = w->ctx;
	int L, r = w->rank, extra = w->size - doubling_width(w->size, &L);
	int place = doubling_place(r, extra);
	uint32_t i = 0, pre = UINT32_MAX;
	const uint8_t *src = c->in;
	uint8_t *part[2];
	struct coll_op *op;
	bool copy;
	int rc;

	if (place < 0) { /* the even one of a pair: its tensor in, the result back */
		op_set(c, 0, OP_SEND, r + 1, 'h', 0, 0, (uint8_t *)c->in, c->nbytes);
		op_set(c, 1, OP_RECV_INTO, r + 1, 'h', 1, 0, c->out, c->nbytes);
		op_after(c, 0, 1);
		return 0;
	}
	/* a block for the partials not in out, and for a copy of an input that out overlaps */
	copy = overlap(c->in, c->nbytes, c->out, c->nbytes);
	tfab__ctx_lock(ctx);
	rc = tfab__pool_alloc(tfab__ctx_pool(ctx), 0, (copy ? 2 : 1) * c->nbytes, &c->zbuf, NULL);
	tfab__ctx_unlock(ctx);
	if (rc)
		return rc;
	/* part[k]: where the partial of a step s with (L - 1 - s) % 2 == k goes */
	part[0] = c->out;
	part[1] = c->zbuf;
	if (copy) {
		memcpy(part[1] + c->nbytes, c->in, c->nbytes);
		src = part[1] + c->nbytes;
	}
	if (r < 2 * extra) { /* the odd one of a pair: the two reduced first */
		op = op_set(c, i, OP_RECV_POOL, r - 1, 'h', 0, 0, part[L % 2], c->nbytes);
		op->act = ACT_REDUCE;
		op->local = src;
		src = op->buf;
		pre = i++;
	}
	for (int s = 0; s < L; s++) {
		int peer = doubling_rank(place ^ (1 << s), extra);
		uint32_t S = i++, R = i++;

		op_set(c, S, OP_SEND, peer, 'b', (uint32_t)s, 0, (uint8_t *)src, c->nbytes);
		op = op_set(c, R, OP_RECV_POOL, peer, 'b', (uint32_t)s, 0, part[(L - 1 - s) % 2],
			    c->nbytes);
		op->act = ACT_REDUCE;
		op->local = src;
		op->last = s == L - 1;
		if (s > 0) {
			op_after(c, R - 2, S);
			op_after(c, R - 2, R);
			op_after(c, S - 2, R);
		} else if (pre != UINT32_MAX) {
			op_after(c, pre, S);
			op_after(c, pre, R);
		}
		src = op->buf;
	}
	if (r < 2 * extra) { /* the result back to the even one */
		op_set(c, i, OP_SEND, r - 1, 'h', 1, 0, c->out, c->nbytes);
		op_after(c, i - 1, i);
		i++;
	}
	return 0;
}

/* A compressed ring's block of compressed pieces, its error feedback and its schedule. */
static int zallreduce(struct tfab_coll *c, size_t count, uint32_t P, const char *key)
{
	struct tfab_world *w = c->w;
	struct tfab_context *ctx = w->ctx;
	size_t total, *zoff = zlayout(c->compress, count, w->size, P, &total);
	float *resid = NULL;
	int rc;

	if (!zoff)
		return -ENOMEM;
	tfab__ctx_lock(ctx);
	rc = tfab__pool_alloc(tfab__ctx_pool(ctx), 0, total, &c->zbuf, NULL);
	tfab__ctx_unlock(ctx);
	if (rc == 0 && key) {
		pthread_mutex_lock(&w->coll_lock);
		resid = residual_of(w, key, count);
		pthread_mutex_unlock(&w->coll_lock);
		rc = resid ? 0 : -ENOMEM;
	}
	if (rc == 0)
		build_ring_zallreduce(c, count, P, resid, zoff);
	free(zoff);
	return rc;
}

enum tfab_coll_algo tfab__coll_algo(const struct tfab_world *w, size_t nbytes, size_t count,
				    enum tfab_coll_algo asked)
{
	if (asked != TFAB_ALGO_AUTO)
		return asked;
	if (nbytes > w->small && count >= (size_t)w->size)
		return TFAB_ALGO_RING;
	/* through the segments, every rank's operand is read from there: direct */
	return w->size >= DOUBLING_RANKS && !via_segments(w, nbytes) ? TFAB_ALGO_DOUBLING
								     : TFAB_ALGO_DIRECT;
}

static int allreduce_host(struct tfab_world *w, const DLTensor *in, DLTensor *out, enum tfab_op op,
			  const struct tfab_coll_opts *opts, tfab_coll_cb cb, void *arg)
{
	struct tfab_coll_opts o = opts ? *opts : (struct tfab_coll_opts){0};
	enum tfab_rtype rt;
	uint8_t *ib, *ob;
	size_t inb, onb, count, esize;
	uint32_t nops = 0, P = 1;
	enum tfab_coll_algo algo;
	struct tfab_coll *c;
	bool ring, fast;
	int rc;

	rc = check_world(w, cb);
	if (rc == 0)
		rc = in_out_bytes(in, out, &ib, &inb, &ob, &onb);
	if (rc) {
		TFAB_ERROR(SUBSYS, "allreduce: a bad argument (a world, a callback, and CPU or GPU "
				   "tensors of row-major layout)");
		return rc;
	}
	rc = reduce_args("allreduce", in, out, inb, onb, 1, op, &rt);
	if (rc)
		return rc;
	if ((unsigned)o.algo > TFAB_ALGO_DOUBLING || (unsigned)o.compress > TFAB_COMPRESS_INT8 ||
	    (o.compress && (rt != TFAB_RT_F32 || (op != TFAB_OP_SUM && op != TFAB_OP_AVG) ||
			    o.algo == TFAB_ALGO_DIRECT))) {
		char a[TFAB_DTYPE_NAME_MAX];

		TFAB_ERROR(SUBSYS,
			   "allreduce: algorithm %d with compression %d does not apply to %s with "
			   "operation %d (compression takes float32 sums and averages, on the "
			   "ring)",
			   (int)o.algo, (int)o.compress, tfab_dtype_name(in->dtype, a, sizeof(a)),
			   (int)op);
		return -EINVAL;
	}
	esize = tfab__rtype_size(rt);
	count = inb / esize;
	/* compression asks for the ring, which a tensor of fewer values than ranks cannot take */
	if (o.compress && count >= (size_t)w->size)
		o.algo = TFAB_ALGO_RING;
	else
		o.compress = TFAB_COMPRESS_NONE;
	algo = tfab__coll_algo(w, inb, count, o.algo);
	ring = algo == TFAB_ALGO_RING;
	/* through the segments where it may: but for doubling asked for by name */
	fast = !ring && o.algo != TFAB_ALGO_DOUBLING && !o.compress && via_segments(w, inb);
	if (fast) {
		nops = 0;
	} else if (w->size > 1 && ring) {
		P = pieces_of(w, (count + (size_t)w->size - 1) / (size_t)w->size * esize);
		nops = P * 4 * ((uint32_t)w->size - 1);
	} else if (w->size > 1 && algo == TFAB_ALGO_DOUBLING) {
		nops = doubling_nops(w);
	} else if (w->size > 1) {
		nops = 2 * ((uint32_t)w->size - 1);
	}
	c = coll_new(w, "allreduce", nops, cb, arg);
	if (!c)
		return -ENOMEM;
	c->op = op;
	c->rt = rt;
	c->esize = esize;
	c->in = ib;
	c->out = ob;
	c->nbytes = inb;
	c->compress = w->size > 1 ? o.compress : TFAB_COMPRESS_NONE;
	if (c->compress) {
		rc = zallreduce(c, count, P, o.key);
		if (rc) {
			coll_free(c);
			return rc;
		}
	} else if (w->size == 1 && ib != ob) {
		memmove(ob, ib, inb);
	} else if (fast) {
		c->fast = true;
	} else if (w->size > 1 && ring) {
		build_ring_allreduce(c, count, P);
	} else if (w->size > 1 && algo == TFAB_ALGO_DOUBLING) {
		rc = build_doubling_allreduce(c);
		if (rc) {
			coll_free(c);
			return rc;
		}
	} else if (w->size > 1) {
		build_direct_allreduce(c);
	}
	coll_start(c);
	return 0;
}

int tfab_allreduce(struct tfab_world *w, const DLTensor *in, DLTensor *out, enum tfab_op op,
		   const struct tfab_coll_opts *opts, tfab_coll_cb cb, void *arg)
{
	struct tfab_coll_gpu *g;
	int rc = tfab__coll_gpu_open(w, &in, &out, &cb, &arg, &g);

	return rc ? rc : tfab__coll_gpu_started(g, allreduce_host(w, in, out, op, opts, cb, arg));
}

int tfab_barrier(struct tfab_world *w, tfab_coll_cb cb, void *arg)
{
	struct tfab_coll *c;
	int rc = check_world(w, cb);
	bool fast; /* through the segments, as a small allreduce */

	if (rc)
		return rc;
	fast = via_segments(w, sizeof(c->barrier));
	c = coll_new(w, "barrier", w->size > 1 && !fast ? 2 * ((uint32_t)w->size - 1) : 0, cb, arg);
	if (!c)
		return -ENOMEM;
	c->op = TFAB_OP_SUM;
	c->rt = TFAB_RT_I32;
	c->esize = 4;
	c->in = c->out = (uint8_t *)c->barrier;
	c->nbytes = sizeof(c->barrier);
	c->fast = fast;
	if (w->size > 1 && !fast)
		build_direct_allreduce(c);
	coll_start(c);
	return 0;
}

static int broadcast_host(struct tfab_world *w, DLTensor *t, int root, tfab_coll_cb cb, void *arg)
{
	struct tfab_coll *c;
	uint8_t *b;
	size_t nb;
	uint32_t P = 1, nops = 0;
	int rc = check_world(w, cb);
	int N, r, q;
	bool ring;

	if (rc == 0)
		rc = tensor_bytes(t, &b, &nb);
	if (rc == 0 && (root < 0 || root >= w->size))
		rc = -EINVAL;
	if (rc) {
		TFAB_ERROR(SUBSYS,
			   "broadcast: a bad argument (a CPU or GPU tensor, a root in the world)");
		return rc;
	}
	N = w->size;
	r = w->rank;
	q = mod(r - root, N); /* this rank's place in the ring from root */
	ring = nb > w->small && N > 2;
	if (ring) {
		P = pieces_of(w, nb);
		nops = P * (q == 0 ? 1 : q == N - 1 ? 1 : 2);
	} else if (N > 1) {
		nops = r == root ? (uint32_t)N - 1 : 1;
	}
	c = coll_new(w, "broadcast", nops, cb, arg);
	if (!c)
		return -ENOMEM;
	c->esize = 1;
	c->out = b;
	c->nbytes = nb;
	if (ring) {
		/* a pipeline around the ring from root: receive piece p, forward it */
		for (uint32_t p = 0, i = 0; p < P; p++) {
			size_t off, len;

			piece(0, nb, p, P, 1, &off, &len);
			if (q > 0)
				op_set(c, i++, OP_RECV_INTO, mod(r - 1, N), 'b', 0, p, b + off,
				       len);
			if (q < N - 1) {
				op_set(c, i, OP_SEND, mod(r + 1, N), 'b', 0, p, b + off, len);
				if (q > 0)
					op_after(c, i - 1, i);
				i++;
			}
		}
	} else if (N > 1 && r == root) {
		for (int k = 0, i = 0; k < N; k++) {
			if (k != root)
				op_set(c, (uint32_t)i++, OP_SEND, k, 'B', 0, 0, b, nb);
		}
	} else if (N > 1) {
		op_set(c, 0, OP_RECV_INTO, root, 'B', 0, 0, b, nb);
	}
	coll_start(c);
	return 0;
}

int tfab_broadcast(struct tfab_world *w, DLTensor *t, int root, tfab_coll_cb cb, void *arg)
{
	const DLTensor *in = t;
	struct tfab_coll_gpu *g;
	int rc = tfab__coll_gpu_open(w, &in, &t, &cb, &arg, &g);

	return rc ? rc : tfab__coll_gpu_started(g, broadcast_host(w, t, root, cb, arg));
}

/*
 * A ring collective over parts of part_bytes, in pieces (*P_p of them): a send and a receive
 * per piece and step, N-1 steps.
 */
static struct tfab_coll *ring_new(struct tfab_world *w, const char *what, size_t part_bytes,
				  const uint8_t *in, uint8_t *out, tfab_coll_cb cb, void *arg,
				  uint32_t *P_p)
{
	uint32_t P = pieces_of(w, part_bytes);
	struct tfab_coll *c = coll_new(w, what, P * 2 * ((uint32_t)w->size - 1), cb, arg);

	if (c) {
		c->in = in;
		c->out = out;
		*P_p = P;
	}
	return c;
}

/*
 * The ring allgather: this rank's part goes into out, and around the ring: G[s] sends part
 * rank - s (its own from in at s = 0, then what A[s-1] received), A[s] receives part
 * rank - s - 1 into out.
 */
static int allgather_host(struct tfab_world *w, const DLTensor *in, DLTensor *out, tfab_coll_cb cb,
			  void *arg)
{
	struct tfab_coll *c;
	uint8_t *ib, *ob;
	size_t inb, onb;
	uint32_t P, k;
	int rc = check_world(w, cb);
	int N, r;

	if (rc == 0)
		rc = in_out_bytes(in, out, &ib, &inb, &ob, &onb);
	if (rc == 0 && onb != inb * (size_t)w->size)
		rc = -EINVAL;
	if (rc) {
		TFAB_ERROR(SUBSYS,
			   "allgather: a bad argument (CPU or GPU tensors, out of size times "
			   "in's bytes)");
		return rc;
	}
	N = w->size;
	r = w->rank;
	k = (uint32_t)N - 1;
	c = ring_new(w, "allgather", inb, ib, ob, cb, arg, &P);
	if (!c)
		return -ENOMEM;
	c->esize = 1;
	c->nbytes = inb;
	if (ib != ob + (size_t)r * inb)
		memmove(ob + (size_t)r * inb, ib, inb);
	for (uint32_t p = 0; p < P && k; p++) {
		uint32_t base = p * 2 * k;
		size_t off, len;

		piece(0, inb, p, P, 1, &off, &len);
		for (uint32_t s = 0; s < k; s++) {
			uint8_t *src =
			    s == 0 ? ib + off : ob + (size_t)mod(r - (int)s, N) * inb + off;

			op_set(c, base + s, OP_SEND, mod(r + 1, N), 'a', s, p, src, len);
			op_set(c, base + k + s, OP_RECV_INTO, mod(r - 1, N), 'a', s, p,
			       ob + (size_t)mod(r - (int)s - 1, N) * inb + off, len);
			if (s > 0)
				op_after(c, base + k + s - 1, base + s); /* A[s-1] -> G[s] */
		}
	}
	coll_start(c);
	return 0;
}

/*
 * The ring reduce-scatter: S[s] sends part rank - s - 1 (from in at s = 0, then the pool
 * tensor R[s-1] accumulated), R[s] receives part rank - s - 2 and accumulates this rank's
 * into it; at the last step that part is this rank's own, reduced into out.
 */
int tfab_allgather(struct tfab_world *w, const DLTensor *in, DLTensor *out, tfab_coll_cb cb,
		   void *arg)
{
	struct tfab_coll_gpu *g;
	int rc = tfab__coll_gpu_open(w, &in, &out, &cb, &arg, &g);

	return rc ? rc : tfab__coll_gpu_started(g, allgather_host(w, in, out, cb, arg));
}

static int reduce_scatter_host(struct tfab_world *w, const DLTensor *in, DLTensor *out,
			       enum tfab_op op, tfab_coll_cb cb, void *arg)
{
	enum tfab_rtype rt;
	struct tfab_coll *c;
	uint8_t *ib, *ob;
	size_t inb, onb;
	uint32_t P, k;
	int rc = check_world(w, cb);
	int N, r;

	if (rc == 0)
		rc = in_out_bytes(in, out, &ib, &inb, &ob, &onb);
	if (rc) {
		TFAB_ERROR(SUBSYS, "reduce_scatter: a bad argument (a world, a callback, and CPU "
				   "or GPU tensors of row-major layout)");
		return rc;
	}
	rc = reduce_args("reduce_scatter", in, out, inb, onb, (size_t)w->size, op, &rt);
	if (rc)
		return rc;
	N = w->size;
	r = w->rank;
	k = (uint32_t)N - 1;
	c = ring_new(w, "reduce_scatter", onb, ib, ob, cb, arg, &P);
	if (!c)
		return -ENOMEM;
	c->op = op;
	c->rt = rt;
	c->esize = tfab__rtype_size(rt);
	c->nbytes = onb;
	if (N == 1 && ib != ob)
		memmove(ob, ib, onb);
	for (uint32_t p = 0; p < P && k; p++) {
		uint32_t base = p * 2 * k;
		size_t off, len;

		piece(0, onb / c->esize, p, P, c->esize, &off, &len);
		for (uint32_t s = 0; s < k; s++) {
			size_t src = (size_t)mod(r - (int)s - 1, N) * onb + off;
			size_t dst = (size_t)mod(r - (int)s - 2, N) * onb + off;
			struct coll_op *o;

			o = op_set(c, base + s, OP_SEND, mod(r + 1, N), 's', s, p, ib + src, len);
			if (s > 0) {
				o->from = (int32_t)(base + k + s - 1);
				op_after(c, base + k + s - 1, base + s);     /* R[s-1] -> S[s] */
				op_after(c, base + k + s - 1, base + k + s); /* R[s-1] -> R[s] */
			}
			o = op_set(c, base + k + s, OP_RECV_POOL, mod(r - 1, N), 's', s, p,
				   ob + off, len);
			o->local = ib + dst;
			o->act = s == k - 1 ? ACT_REDUCE : ACT_ACCUM;
			o->last = s == k - 1;
		}
	}
	coll_start(c);
	return 0;
}

int tfab_reduce_scatter(struct tfab_world *w, const DLTensor *in, DLTensor *out, enum tfab_op op,
			tfab_coll_cb cb, void *arg)
{
	struct tfab_coll_gpu *g;
	int rc = tfab__coll_gpu_open(w, &in, &out, &cb, &arg, &g);

	return rc ? rc : tfab__coll_gpu_started(g, reduce_scatter_host(w, in, out, op, cb, arg));
}

/* Whether byte ranges [a, a + na) and [b, b + nb) share a byte. */
static bool overlap(const uint8_t *a, size_t na, const uint8_t *b, size_t nb)
{
	return na && nb && a < b + nb && b < a + na;
}

/* Whether root names a rank of w (said where not). */
static int root_arg(const struct tfab_world *w, const char *what, int root)
{
	if (root >= 0 && root < w->size)
		return 0;
	TFAB_ERROR(SUBSYS, "%s: root %d is no rank of a world of %d", what, root, w->size);
	return -EINVAL;
}

/*
 * The reduce: every other rank sends its whole input to the root, which keeps them and folds
 * them in rank order into out at the end (as the direct allreduce does: the same bits).
 */
static int reduce_host(struct tfab_world *w, const DLTensor *in, DLTensor *out, enum tfab_op op,
		       int root, tfab_coll_cb cb, void *arg)
{
	enum tfab_rtype rt;
	struct tfab_coll *c;
	uint8_t *ib, *ob = NULL;
	size_t inb, onb = 0;
	int rc = check_world(w, cb);
	bool is_root;

	if (rc == 0)
		rc = root_arg(w, "reduce", root);
	if (rc)
		return rc;
	is_root = w->rank == root;
	rc = tensor_bytes(in, &ib, &inb);
	if (rc == 0 && is_root)
		rc = tensor_bytes(out, &ob, &onb);
	if (rc) {
		TFAB_ERROR(SUBSYS,
			   "reduce: a bad argument (CPU or GPU tensors of row-major layout: "
			   "in, and out on the root)");
		return rc;
	}
	rc = reduce_args("reduce", in, is_root ? out : in, inb, is_root ? onb : inb, 1, op, &rt);
	if (rc)
		return rc;
	c = coll_new(w, "reduce", w->size == 1 ? 0 : is_root ? (uint32_t)w->size - 1 : 1, cb, arg);
	if (!c)
		return -ENOMEM;
	c->op = op;
	c->rt = rt;
	c->esize = tfab__rtype_size(rt);
	c->in = ib;
	c->out = ob;
	c->nbytes = inb;
	if (w->size == 1 && ib != ob) {
		memmove(ob, ib, inb);
	} else if (w->size > 1 && is_root) {
		for (int k = 0, i = 0; k < w->size; k++) {
			if (k != root)
				op_set(c, (uint32_t)i++, OP_RECV_POOL, k, 'R', 0, 0, NULL, inb)
				    ->act = ACT_HOLD;
		}
		c->fold = true;
		c->fold_stride = 1; /* a receive per other rank */
	} else if (w->size > 1) {
		op_set(c, 0, OP_SEND, root, 'R', 0, 0, ib, inb);
	}
	coll_start(c);
	return 0;
}

int tfab_reduce(struct tfab_world *w, const DLTensor *in, DLTensor *out, enum tfab_op op, int root,
		tfab_coll_cb cb, void *arg)
{
	struct tfab_coll_gpu *g;
	int rc;

	if (w && w->rank != root)
		out = NULL; /* only the root's is written (a GPU one copied back) */
	rc = tfab__coll_gpu_open(w, &in, &out, &cb, &arg, &g);
	return rc ? rc : tfab__coll_gpu_started(g, reduce_host(w, in, out, op, root, cb, arg));
}

/*
 * Gather (scatter = false) and scatter: between the root's tensor of size parts (gather's
 * out, scatter's in) and every rank's part (gather's in, scatter's out), each part going
 * straight between the root and its rank; the root's own part is copied at the call.
 */
static int gather_scatter_host(struct tfab_world *w, const DLTensor *in, DLTensor *out, int root,
			       bool scatter, tfab_coll_cb cb, void *arg)
{
	const char *what = scatter ? "scatter" : "gather";
	const DLTensor *whole = scatter ? in : out, *part = scatter ? out : in;
	char a[TFAB_DTYPE_NAME_MAX], b[TFAB_DTYPE_NAME_MAX];
	uint8_t *wb = NULL, *pb;
	size_t wnb = 0, pnb;
	struct tfab_coll *c;
	int rc = check_world(w, cb);
	bool is_root;

	if (rc == 0)
		rc = root_arg(w, what, root);
	if (rc)
		return rc;
	is_root = w->rank == root;
	rc = tensor_bytes(part, &pb, &pnb);
	if (rc == 0 && is_root)
		rc = tensor_bytes(whole, &wb, &wnb);
	if (rc) {
		TFAB_ERROR(SUBSYS,
			   "%s: a bad argument (CPU or GPU tensors of row-major layout: %s, and "
			   "%s on the root)",
			   what, scatter ? "out" : "in", scatter ? "in" : "out");
		return rc;
	}
	if (is_root &&
	    (whole->dtype.code != part->dtype.code || whole->dtype.bits != part->dtype.bits ||
	     whole->dtype.lanes != part->dtype.lanes)) {
		TFAB_ERROR(SUBSYS, "%s: in is %s and out %s: both must be of one dtype", what,
			   tfab_dtype_name(in->dtype, a, sizeof(a)),
			   tfab_dtype_name(out->dtype, b, sizeof(b)));
		return -EINVAL;
	}
	if (is_root && wnb != pnb * (size_t)w->size) {
		TFAB_ERROR(SUBSYS,
			   "%s: %s has %zu bytes and %s %zu: %s must have %s's times the "
			   "world's size (%d)",
			   what, scatter ? "in" : "out", wnb, scatter ? "out" : "in", pnb,
			   scatter ? "in" : "out", scatter ? "out" : "in", w->size);
		return -EINVAL;
	}
	/* the part may be the root's place in the whole, and nowhere else in it */
	if (is_root && pb != wb + (size_t)root * pnb && overlap(pb, pnb, wb, wnb)) {
		TFAB_ERROR(SUBSYS, "%s: in and out overlap (other than at the root's part)", what);
		return -EINVAL;
	}
	c = coll_new(w, what, w->size == 1 ? 0 : is_root ? (uint32_t)w->size - 1 : 1, cb, arg);
	if (!c)
		return -ENOMEM;
	c->esize = 1;
	c->nbytes = pnb;
	if (is_root) {
		uint8_t *mine = wb + (size_t)root * pnb;

		if (pb != mine)
			memmove(scatter ? pb : mine, scatter ? mine : pb, pnb);
		for (int k = 0, i = 0; k < w->size; k++) {
			if (k != root)
				op_set(c, (uint32_t)i++, scatter ? OP_SEND : OP_RECV_INTO, k,
				       scatter ? 'S' : 'G', 0, 0, wb + (size_t)k * pnb, pnb);
		}
	} else {
		op_set(c, 0, scatter ? OP_RECV_INTO : OP_SEND, root, scatter ? 'S' : 'G', 0, 0, pb,
		       pnb);
	}
	coll_start(c);
	return 0;
}

int tfab_gather(struct tfab_world *w, const DLTensor *in, DLTensor *out, int root, tfab_coll_cb cb,
		void *arg)
{
	struct tfab_coll_gpu *g;
	int rc;

	if (w && w->rank != root)
		out = NULL;
	rc = tfab__coll_gpu_open(w, &in, &out, &cb, &arg, &g);
	return rc ? rc
		  : tfab__coll_gpu_started(g,
					   gather_scatter_host(w, in, out, root, false, cb, arg));
}

int tfab_scatter(struct tfab_world *w, const DLTensor *in, DLTensor *out, int root, tfab_coll_cb cb,
		 void *arg)
{
	struct tfab_coll_gpu *g;
	int rc;

	if (w && w->rank != root)
		in = NULL;
	rc = tfab__coll_gpu_open(w, &in, &out, &cb, &arg, &g);
	return rc ? rc
		  : tfab__coll_gpu_started(g, gather_scatter_host(w, in, out, root, true, cb, arg));
}

/*
 * The counts that the pair of this rank and rank k checks before either moves data: what
 * this rank sends k (its send count for k, its receive count from k, its dtype) at words
 * 6k, and what it expects from k (the same seen from k) at 6k + 3.
 */
#define CHECK_WORDS 3

static int64_t dtype_word(DLDataType dt)
{
	return (int64_t)dt.code | (int64_t)dt.bits << 8 | (int64_t)dt.lanes << 16;
}

/* An alltoallv's check of what rank op->rank sent (ACT_CHECK): 0, or -EINVAL said. */
static int alltoallv_check(struct tfab_coll *c, struct coll_op *op, const int64_t *got)
{
	const int64_t *want = (const int64_t *)op->local;
	int64_t g[CHECK_WORDS];

	memcpy(g, got, sizeof(g));
	if (memcmp(g, want, sizeof(g)) == 0) {
		op->passed = true;
		return 0;
	}
	if (g[2] != want[2]) {
		char a[TFAB_DTYPE_NAME_MAX], b[TFAB_DTYPE_NAME_MAX];
		DLDataType ga = {(uint8_t)g[2], (uint8_t)(g[2] >> 8), (uint16_t)(g[2] >> 16)};
		DLDataType wa = {(uint8_t)want[2], (uint8_t)(want[2] >> 8),
				 (uint16_t)(want[2] >> 16)};

		TFAB_ERROR(SUBSYS, "rank %d: %s %" PRIu64 ": rank %d has %s tensors, this rank %s",
			   c->w->rank, c->what, c->seq, op->rank, tfab_dtype_name(ga, a, sizeof(a)),
			   tfab_dtype_name(wa, b, sizeof(b)));
	} else {
		TFAB_ERROR(SUBSYS,
			   "rank %d: %s %" PRIu64 ": rank %d sends %" PRId64
			   " elements to this rank and expects %" PRId64
			   " from it, where this rank expects %" PRId64 " and sends %" PRId64
			   " (rank i's send_counts[j] must be rank j's recv_counts[i])",
			   c->w->rank, c->what, c->seq, op->rank, g[0], g[1], want[0], want[1]);
	}
	return -EINVAL;
}

/* counts, or count / size each where counts is NULL, into n (size entries); -EINVAL said. */
static int counts_of(struct tfab_world *w, const char *name, const size_t *counts, size_t count,
		     size_t *n)
{
	size_t sum = 0;

	for (int k = 0; k < w->size; k++) {
		n[k] = counts ? counts[k] : count / (size_t)w->size;
		if (n[k] > INT64_MAX || sum + n[k] < sum) {
			TFAB_ERROR(SUBSYS, "alltoallv: %s[%d] is %zu: too many", name, k, n[k]);
			return -EINVAL;
		}
		sum += n[k];
	}
	if (sum != count) {
		TFAB_ERROR(SUBSYS,
			   "alltoallv: %s add up to %zu elements, where its tensor has %zu%s", name,
			   sum, count, counts ? "" : " (NULL: the world's size must divide it)");
		return -EINVAL;
	}
	return 0;
}

/*
 * The all-to-all: this rank's piece for rank k (send counts, in rank order in `in`) goes
 * straight to k, and k's for this rank into out (receive counts, in rank order). Each pair
 * first trades its counts (tag 'v', ACT_CHECK): the data of a pair (tag 'V') waits for that
 * check and goes only if it passed, so that counts that differ fail the collective on both
 * ends, with what differs said, and no byte lands where it should not.
 */
static int alltoallv_host(struct tfab_world *w, const DLTensor *in, const size_t *send_counts,
			  DLTensor *out, const size_t *recv_counts, tfab_coll_cb cb, void *arg)
{
	char a[TFAB_DTYPE_NAME_MAX], b[TFAB_DTYPE_NAME_MAX];
	size_t *sn = NULL, *rn, inb, onb, es, soff = 0, roff = 0;
	uint8_t *ib, *ob;
	uint32_t nops = 0, i = 0;
	struct tfab_coll *c = NULL;
	int rc = check_world(w, cb), r, N;

	if (rc == 0)
		rc = in_out_bytes(in, out, &ib, &inb, &ob, &onb);
	if (rc) {
		TFAB_ERROR(SUBSYS, "alltoallv: a bad argument (a world, a callback, and CPU or GPU "
				   "tensors of row-major layout)");
		return rc;
	}
	N = w->size;
	r = w->rank;
	es = ((size_t)in->dtype.bits * in->dtype.lanes) / 8;
	if (in->dtype.code != out->dtype.code || in->dtype.bits != out->dtype.bits ||
	    in->dtype.lanes != out->dtype.lanes || es == 0 ||
	    ((size_t)in->dtype.bits * in->dtype.lanes) % 8) {
		TFAB_ERROR(SUBSYS,
			   "alltoallv: in is %s and out %s: both must be of one dtype, of "
			   "whole bytes",
			   tfab_dtype_name(in->dtype, a, sizeof(a)),
			   tfab_dtype_name(out->dtype, b, sizeof(b)));
		return -EINVAL;
	}
	if (overlap(ib, inb, ob, onb)) {
		TFAB_ERROR(SUBSYS, "alltoallv: in and out overlap");
		return -EINVAL;
	}
	sn = calloc(2 * (size_t)N, sizeof(*sn));
	if (!sn)
		return -ENOMEM;
	rn = sn + N;
	rc = counts_of(w, "send_counts", send_counts, inb / es, sn);
	if (rc == 0)
		rc = counts_of(w, "recv_counts", recv_counts, onb / es, rn);
	if (rc == 0 && sn[r] != rn[r]) {
		TFAB_ERROR(SUBSYS,
			   "alltoallv: rank %d sends %zu elements to itself and receives %zu: "
			   "send_counts[rank] must be recv_counts[rank]",
			   r, sn[r], rn[r]);
		rc = -EINVAL;
	}
	if (rc)
		goto out;
	for (int k = 0; k < N; k++) {
		if (k != r)
			nops += 2 + (sn[k] > 0) + (rn[k] > 0);
	}
	rc = -ENOMEM;
	c = coll_new(w, "alltoallv", nops, cb, arg);
	if (!c)
		goto out;
	c->words = calloc(2 * CHECK_WORDS * (size_t)N, sizeof(*c->words));
	if (!c->words)
		goto out;
	c->esize = es;
	c->in = ib;
	c->out = ob;
	c->nbytes = inb;
	for (int k = 0; k < N; k++) {
		int64_t *mine = c->words + 2 * CHECK_WORDS * (size_t)k,
			*theirs = mine + CHECK_WORDS;
		uint32_t check;
		struct coll_op *op;

		if (k == r) {
			memmove(ob + roff * es, ib + soff * es, sn[k] * es);
		} else {
			mine[0] = (int64_t)sn[k];
			mine[1] = (int64_t)rn[k];
			theirs[0] = (int64_t)rn[k];
			theirs[1] = (int64_t)sn[k];
			mine[2] = theirs[2] = dtype_word(in->dtype);
			op = op_set(c, i++, OP_SEND, k, 'v', 0, 0, (uint8_t *)mine,
				    sizeof(*mine) * 3);
			op->verdict = true;
			check = i++;
			op = op_set(c, check, OP_RECV_POOL, k, 'v', 0, 0, NULL, sizeof(*mine) * 3);
			op->act = ACT_CHECK;
			op->local = (const uint8_t *)theirs;
			if (sn[k]) {
				op =
				    op_set(c, i, OP_SEND, k, 'V', 0, 0, ib + soff * es, sn[k] * es);
				op->gated = true;
				op_after(c, check, i++);
			}
			if (rn[k]) {
				op = op_set(c, i, OP_RECV_INTO, k, 'V', 0, 0, ob + roff * es,
					    rn[k] * es);
				op->gated = true;
				op_after(c, check, i++);
			}
		}
		soff += sn[k];
		roff += rn[k];
	}
	coll_start(c);
	c = NULL;
	rc = 0;
out:
	if (c)
		coll_free(c);
	free(sn);
	return rc;
}

int tfab_alltoallv(struct tfab_world *w, const DLTensor *in, const size_t *send_counts,
		   DLTensor *out, const size_t *recv_counts, tfab_coll_cb cb, void *arg)
{
	struct tfab_coll_gpu *g;
	int rc = tfab__coll_gpu_open(w, &in, &out, &cb, &arg, &g);

	return rc ? rc
		  : tfab__coll_gpu_started(
			g, alltoallv_host(w, in, send_counts, out, recv_counts, cb, arg));
}

/* The engine's hooks (tfab_coll_hooks): under the context's lock, then coll_lock. */

/* Bounds on operands that come before their collective: how far ahead, and how many. */
#define EARLY_AHEAD (1u << 20)
#define EARLY_MAX 65536u

static struct tfab_coll *coll_by_seq(struct tfab_world *w, uint64_t seq)
{
	struct tfab_list *l;

	for (l = w->colls.next; l != &w->colls; l = l->next) {
		struct tfab_coll *c = tfab_container_of(l, struct tfab_coll, link);

		if (c->seq == seq)
			return c;
	}
	return NULL;
}

/* c's eager receive from peer for m's operation, in any state; NULL if it has none. */
static struct coll_op *eager_recv_of(struct tfab_coll *c, const struct tfab_peer *peer,
				     const struct eager_msg *m)
{
	for (uint32_t i = 0; i < c->nops; i++) {
		struct coll_op *op = &c->ops[i];

		if (eager_recv(op) && c->w->peers[op->rank] == peer && op->tag == m->tag &&
		    op->step == m->step && op->piece == m->piece)
			return op;
	}
	return NULL;
}

/* Whether peer is one of the world's ranks' (once joined). */
static bool world_peer(const struct tfab_world *w, const struct tfab_peer *peer)
{
	for (int r = 0; r < w->size; r++) {
		if (w->peers[r] == peer)
			return true;
	}
	return false;
}

static int on_data(void *arg, struct tfab_peer *peer, const struct tfab_wire_msg *wm)
{
	struct tfab_world *w = arg;
	struct eager_msg *m = malloc(sizeof(*m) + wm->data_len);
	struct tfab_coll *c;
	struct coll_op *op;
	int rc = 0;

	if (!m)
		return 0; /* lost: the receive fails by its deadline */
	*m = (struct eager_msg){.from = peer,
				.seq = (uint64_t)wm->step_id - (uint64_t)INT64_MIN,
				.step = wm->req_index,
				.piece = wm->key_index,
				.tag = (char)wm->coll_tag,
				.dead = (wm->flags & TFAB_MSGF_DEAD) != 0,
				.len = wm->data_len};
	if (wm->data_len)
		memcpy(m->bytes, wm->data, wm->data_len);
	pthread_mutex_lock(&w->coll_lock);
	if (w->joined && !world_peer(w, peer)) {
		TFAB_ERROR(SUBSYS, "rank %d: collective data from a peer outside the world",
			   w->rank);
		rc = -TFAB_ERR_PROTOCOL;
	} else if (m->seq >= w->coll_seq) {
		/* a collective this rank has not started yet */
		if (m->seq - w->coll_seq >= EARLY_AHEAD || w->nearly >= EARLY_MAX) {
			TFAB_ERROR(SUBSYS,
				   "rank %d: collective data for collective %" PRIu64
				   " while this rank is at %" PRIu64 " with %u operands waiting",
				   w->rank, m->seq, w->coll_seq, w->nearly);
			rc = -TFAB_ERR_PROTOCOL;
		} else {
			tfab__list_add_tail(&w->early, &m->link);
			w->nearly++;
			m = NULL;
		}
	} else if ((c = coll_by_seq(w, m->seq)) != NULL) {
		op = eager_recv_of(c, peer, m);
		if (!op) {
			TFAB_ERROR(SUBSYS,
				   "rank %d: %s %" PRIu64 " has no operation tfab.c/%c%u.%u",
				   w->rank, c->what, c->seq, m->tag, m->step, m->piece);
			rc = -TFAB_ERR_PROTOCOL;
		} else if (op->state == ST_POSTED) {
			eager_land(c, op, m);
			m = NULL;
			rc = 1;
		} else if (op->state != ST_ENDED) {
			tfab__list_add_tail(&w->early, &m->link); /* taken when it is posted */
			w->nearly++;
			m = NULL;
		}
	} /* else for a collective that has ended (it failed): nothing waits for it */
	pthread_mutex_unlock(&w->coll_lock);
	free(m);
	return rc;
}

/* End c's posted eager receives that `fails` picks, with status; whether any ended. */
static bool fail_posted(struct tfab_world *w, const struct tfab_peer *peer, int status,
			uint64_t now_ms, uint64_t limit)
{
	struct tfab_list *l;
	bool any = false;

	for (l = w->colls.next; l != &w->colls; l = l->next) {
		struct tfab_coll *c = tfab_container_of(l, struct tfab_coll, link);

		for (uint32_t i = 0; i < c->nops; i++) {
			struct coll_op *op = &c->ops[i];

			if (!eager_recv(op) || op->state != ST_POSTED)
				continue;
			if (limit) {
				/* posted_ms may be a tick past now_ms, read before it */
				if (op->posted_ms >= now_ms || now_ms - op->posted_ms < limit)
					continue;
				TFAB_WARN(SUBSYS,
					  "rank %d: %s %" PRIu64
					  ": nothing from rank %d for %" PRIu64
					  " ms (tfab.c/%c%u.%u); failed (TFAB_OP_TIMEOUT_MS)",
					  w->rank, c->what, c->seq, op->rank,
					  now_ms - op->posted_ms, op->tag, op->step, op->piece);
			} else if (peer && w->peers[op->rank] != peer) {
				continue;
			}
			op_ended(c, op, status);
			any = true;
		}
	}
	return any;
}

static bool on_fail(void *arg, struct tfab_peer *peer, int status)
{
	struct tfab_world *w = arg;
	bool any;

	pthread_mutex_lock(&w->coll_lock);
	if (!peer && !w->aborted)
		w->aborted = status;
	for (int r = 0; peer && w->joined && r < w->size; r++) {
		if (w->peers[r] == peer && !w->rank_failed[r]) {
			w->rank_failed[r] = status;
			w->failed_order[w->nfailed++] = r;
		}
	}
	any = fail_posted(w, peer, status, 0, 0) || !tfab__list_empty(&w->fast);
	pthread_mutex_unlock(&w->coll_lock);
	return any;
}

static bool on_tick(void *arg, uint64_t now_ms)
{
	struct tfab_world *w = arg;
	uint64_t limit = tfab__ctx_config(w->ctx)->op_timeout_ms;
	bool any;

	/* Only eager receives have a deadline here (the segments' is fast_poll's). */
	if (!limit || !w->eager)
		return false;
	pthread_mutex_lock(&w->coll_lock);
	any = fail_posted(w, NULL, -TFAB_ERR_TIMEOUT, now_ms, limit);
	pthread_mutex_unlock(&w->coll_lock);
	return any;
}

static void kick(void *arg)
{
	struct tfab_world *w = arg;

	pthread_mutex_lock(&w->coll_lock);
	fast_poll(w);
	drive(w);
	pthread_mutex_unlock(&w->coll_lock);
}

static const struct tfab_coll_hooks hooks = {
    .on_data = on_data, .on_fail = on_fail, .on_tick = on_tick, .kick = kick};

static bool started_before(struct tfab_world *w, uint64_t seq)
{
	struct tfab_list *l, *t;

	tfab_list_for_each_safe(l, t, &w->colls)
	{
		if (tfab_container_of(l, struct tfab_coll, link)->seq < seq)
			return true;
	}
	return false;
}

int tfab_world_failed(struct tfab_world *w, int *ranks, int n)
{
	int nfailed;

	if (!w || n < 0 || (n && !ranks))
		return -EINVAL;
	if (!w->hooked)
		return -EOPNOTSUPP; /* the engine reports failures to another world */
	pthread_mutex_lock(&w->coll_lock);
	nfailed = w->nfailed;
	for (int i = 0; i < n && i < nfailed; i++)
		ranks[i] = w->failed_order[i];
	pthread_mutex_unlock(&w->coll_lock);
	return nfailed;
}

int tfab_world_wait(struct tfab_world *w, int timeout_ms)
{
	struct tfab_context *ctx;
	uint64_t seq, deadline;
	bool thread;
	int rc = 0;

	if (!w)
		return -EINVAL;
	ctx = w->ctx;
	rc = tfab__ctx_may_wait(ctx, &thread);
	if (rc)
		return rc;
	/* The coarse clock: a deadline in ms, read at every turn of a loop that polls. */
	deadline = timeout_ms < 0 ? UINT64_MAX : tfab__coarse_ms() + (uint64_t)timeout_ms;
	pthread_mutex_lock(&w->coll_lock);
	/*
	 * From a collective's callback (or anything else drive runs), nothing it waits for could
	 * end: drive, which ends them, is up this thread's stack.
	 */
	if (w->driving && pthread_equal(w->driver, pthread_self())) {
		pthread_mutex_unlock(&w->coll_lock);
		return -EDEADLK;
	}
	seq = w->coll_seq;
	while (started_before(w, seq)) {
		uint64_t ended = atomic_load_explicit(&w->ended, memory_order_relaxed);

		if (deadline != UINT64_MAX && tfab__coarse_ms() >= deadline) {
			rc = -ETIMEDOUT;
			break;
		}
		if (thread) {
			struct timespec ts;

			clock_gettime(CLOCK_MONOTONIC, &ts);
			ts.tv_nsec += 1000000; /* a bound, in case a broadcast came before */
			if (ts.tv_nsec >= 1000000000) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&w->coll_cond, &w->coll_lock, &ts);
			continue;
		}
		pthread_mutex_unlock(&w->coll_lock);
		/*
		 * Progress until something came (a collective ends inside such a call, or not at
		 * all), or for a few idle turns (another thread's call may end it), yielding the
		 * core at each idle one to a rank that shares it (oversubscribed hosts).
		 */
		for (int idle = 0; idle < 16; idle++) {
			/* The segments first: a progress call kicks them too, but after a poll. */
			if (atomic_load_explicit(&tfab__ctx_coll_counts(ctx)->polls,
						 memory_order_relaxed) &&
			    w->hooked) {
				kick(w);
				if (atomic_load_explicit(&w->ended, memory_order_relaxed) != ended)
					break;
			}
			if (tfab_progress(ctx) != 0 ||
			    atomic_load_explicit(&w->ended, memory_order_relaxed) != ended)
				break;
			sched_yield();
			if (deadline != UINT64_MAX && tfab__coarse_ms() >= deadline)
				break;
		}
		pthread_mutex_lock(&w->coll_lock);
	}
	pthread_mutex_unlock(&w->coll_lock);
	return rc;
}
