/*
 * The context: configuration, the fabric endpoint, the lock, progress (polling the fabric and
 * dispatching its events), the optional progress thread, callbacks run outside the lock, step
 * cleanup, abort and statistics.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tfab/log.h>
#include <tfab/status.h>

#include "engine/engine.h"
#include "util/log.h"
#include "util/time.h"

#define SUBSYS TFAB_ENGINE_SUBSYS
#define POLL_EVENTS TFAB_POLL_EVENTS
#define POLL_ROUNDS 8 /* batches per progress call, so one call never runs for long */

void tfab__ctx_lock(struct tfab_context *ctx)
{
	pthread_mutex_lock(&ctx->lock);
	ctx->quiet = false; /* whoever takes it may leave work for progress */
}

void tfab__cond_wait_until(struct tfab_context *ctx, uint64_t deadline)
{
	struct timespec ts = {.tv_sec = (time_t)(deadline / 1000),
			      .tv_nsec = (long)(deadline % 1000) * 1000000};

	pthread_cond_timedwait(&ctx->cond, &ctx->lock, &ts); /* ctx->cond is on CLOCK_MONOTONIC */
	ctx->quiet = false;				     /* the lock was another's meanwhile */
}

static bool callbacks_due(const struct tfab_context *ctx)
{
	return !tfab__list_empty(&ctx->done_reqs) || !tfab__list_empty(&ctx->done_sends) ||
	       ctx->coll_due;
}

void tfab__ctx_set_coll(struct tfab_context *ctx, const struct tfab_coll_hooks *hooks, void *arg)
{
	pthread_t self = pthread_self();

	tfab__ctx_lock(ctx);
	ctx->coll = hooks;
	ctx->coll_arg = arg;
	ctx->coll_due = false;
	ctx->coll_left |= !hooks;
	/* A kick up this thread's own stack is not waited for (it cannot end meanwhile). */
	while (!hooks && ctx->coll_kicking &&
	       !(ctx->cb_depth && pthread_equal(ctx->cb_thread, self)))
		pthread_cond_wait(&ctx->cond, &ctx->lock);
	pthread_mutex_unlock(&ctx->lock);
}

bool tfab__ctx_coll_taken(struct tfab_context *ctx)
{
	bool taken;

	tfab__ctx_lock(ctx);
	taken = ctx->coll != NULL;
	tfab__ctx_unlock(ctx);
	return taken;
}

/* The world layer's view of the context (engine_world.h). */
int tfab__ctx_aborted(struct tfab_context *ctx)
{
	return __atomic_load_n(&ctx->abort_status, __ATOMIC_ACQUIRE);
}

const struct tfab_config *tfab__ctx_config(const struct tfab_context *ctx)
{
	return &ctx->cfg;
}

struct tfab_stats *tfab__ctx_stats(struct tfab_context *ctx)
{
	return &ctx->stats;
}

struct tfab_pool *tfab__ctx_pool(struct tfab_context *ctx)
{
	return ctx->pool;
}

struct tfab_cuda *tfab__ctx_cuda(struct tfab_context *ctx)
{
	return ctx->cuda;
}

struct tfab_coll_counts *tfab__ctx_coll_counts(struct tfab_context *ctx)
{
	return &ctx->coll_counts;
}

int tfab__ctx_may_wait(struct tfab_context *ctx, bool *thread_p)
{
	int rc = 0;

	tfab__ctx_lock(ctx);
	*thread_p = ctx->thread_running;
	if (ctx->cb_depth && pthread_equal(ctx->cb_thread, pthread_self()))
		rc = -EDEADLK;
	tfab__ctx_unlock(ctx);
	return rc;
}

/* Take the due callbacks, run them with the lock dropped, free their objects under it. */
static void deliver(struct tfab_context *ctx)
{
	struct tfab_list reqs, sends, *l, *t;

	/* Move the lists out whole, so callbacks may post more work. */
	tfab__list_init(&reqs);
	tfab__list_init(&sends);
	if (!tfab__list_empty(&ctx->done_reqs)) {
		reqs = ctx->done_reqs;
		reqs.next->prev = &reqs;
		reqs.prev->next = &reqs;
		tfab__list_init(&ctx->done_reqs);
	}
	if (!tfab__list_empty(&ctx->done_sends)) {
		sends = ctx->done_sends;
		sends.next->prev = &sends;
		sends.prev->next = &sends;
		tfab__list_init(&ctx->done_sends);
	}
	pthread_mutex_unlock(&ctx->lock);

	tfab_list_for_each_safe(l, t, &reqs)
	{
		struct tfab_request *r = tfab_container_of(l, struct tfab_request, done_link);

		/* without a callback, a blocking receive, whose waiter has its result */
		if (r->strings && r->scb) {
			r->scb(r->arg, r->status, r->sout, r->is_dead);
		} else if (!r->strings && r->cb) {
			int status = r->status;

			/* One view at a time: the callback before frees its own. */
			if (r->view_due) {
				r->out = tfab__view_new(&r->meta, r->user_dest);
				status = r->out ? 0 : -ENOMEM;
			}
			r->cb(r->arg, status, r->out, r->is_dead);
		}
	}
	tfab_list_for_each_safe(l, t, &sends)
	{
		struct tfab_send *s = tfab_container_of(l, struct tfab_send, done_link);

		s->cb(s->arg, s->status);
	}

	/* Free under the lock: a send's write may still be in flight. */
	tfab__ctx_lock(ctx);
	/*
	 * The collectives' work, after the callbacks: the hooks are read under the lock now, so
	 * that a callback that left the world (removing them) is seen.
	 */
	if (ctx->coll_due) {
		const struct tfab_coll_hooks *coll = ctx->coll;
		void *coll_arg = ctx->coll_arg;

		ctx->coll_due = false;
		if (coll) {
			ctx->coll_kicking++;
			pthread_mutex_unlock(&ctx->lock);
			coll->kick(coll_arg);
			tfab__ctx_lock(ctx);
			if (--ctx->coll_kicking == 0)
				pthread_cond_broadcast(&ctx->cond);
		}
	}
	tfab_list_for_each_safe(l, t, &reqs)
	{
		tfab__freelist_put(&ctx->req_fl,
				   tfab_container_of(l, struct tfab_request, done_link));
	}
	tfab_list_for_each_safe(l, t, &sends)
	{
		struct tfab_send *s = tfab_container_of(l, struct tfab_send, done_link);

		if (s->in_flight) {
			s->orphan = true; /* freed when its write completes */
			ctx->orphans++;
		} else {
			tfab__send_free(ctx, s);
		}
	}
}

/*
 * Drop the lock, then run the callbacks that became due. One thread at a time runs a
 * context's callbacks, so two never run at once (the progress thread and callers that drive
 * progress, or post, all get here): a thread that finds another one delivering leaves its
 * callbacks to it, and the deliverer goes on until none are due. A callback's own calls
 * into tfab deliver on its thread, nested.
 */
void tfab__ctx_unlock(struct tfab_context *ctx)
{
	pthread_t self = pthread_self();

	if (!callbacks_due(ctx) || (ctx->cb_depth && !pthread_equal(ctx->cb_thread, self))) {
		pthread_mutex_unlock(&ctx->lock);
		return;
	}
	ctx->cb_thread = self;
	ctx->cb_depth++;
	while (callbacks_due(ctx))
		deliver(ctx);
	ctx->cb_depth--;
	pthread_mutex_unlock(&ctx->lock);
}

/*
 * The id of the peer a remote write came from, as its backend tells (TFAB_NO_PEER where it
 * cannot): an id, not the peer, so that a write held back finds a peer destroyed meanwhile
 * gone (ids are never reused).
 */
static uint32_t src_of(const struct tfab_event *ev)
{
	const struct tfab_peer *peer = ev->src ? ev->src->owner : NULL;

	return peer ? peer->id : TFAB_NO_PEER;
}

static void dispatch(struct tfab_context *ctx, const struct tfab_event *ev, uint32_t src)
{
	struct tfab_wctx *w = ev->ctx;

	switch (ev->type) {
	case TFAB_EV_REMOTE_WRITE:
		if (tfab__imm_is_ctrl(ev->imm))
			tfab__peer_on_ctrl(ctx, ev->imm, src);
		else
			tfab__recv_on_content(ctx, ev->imm, ev->len, src);
		return;
	case TFAB_EV_WRITE_DONE:
	case TFAB_EV_ERROR:
		break;
	}
	if (!w) {
		if (ev->type == TFAB_EV_ERROR)
			TFAB_WARN(SUBSYS, "a fabric error not tied to an operation: %s (%s)",
				  tfab_strerror(ev->status), ev->errmsg ? ev->errmsg : "");
		return;
	}
	switch (w->kind) {
	case TFAB_WCTX_CTRL:
		tfab__peer_on_write_done((struct tfab_outbox_slot *)w, ev->status);
		break;
	case TFAB_WCTX_CONTENT:
		tfab__send_on_write_done((struct tfab_send *)w, ev->status);
		break;
	case TFAB_WCTX_CREDIT: {
		struct tfab_peer *peer = tfab_container_of(w, struct tfab_peer, credit_w);

		if (ev->status)
			tfab__peer_write_failed(peer, ev->status);
		if (!ev->injected)
			tfab__peer_unuse(peer); /* an injected credit was never counted in flight */
		break;
	}
	case TFAB_WCTX_INJECTED: {
		struct tfab_peer *peer = tfab_container_of(w, struct tfab_peer, inject_w);

		/*
		 * A destination the receiver revoked comes with its CANCEL, which offers the
		 * send again; anything else lost the connection.
		 */
		if (tfab__peer_write_status(peer, ev->status) != -TFAB_ERR_REMOTE_ACCESS &&
		    ev->status)
			tfab__peer_write_failed(peer, ev->status);
		break;
	}
	}
}

int tfab__held_dispatch(struct tfab_context *ctx)
{
	unsigned n = ctx->nheld;

	/* Dispatching may post writes but never polls: nothing is added meanwhile. */
	ctx->nheld = 0;
	for (unsigned i = 0; i < n; i++)
		dispatch(ctx, &ctx->held[i], ctx->held_src[i]);
	return (int)n;
}

/*
 * Whether a receive has completed in this progress call (fresh: none was due at its start;
 * callbacks another thread is running keep theirs due).
 */
static bool completed_here(const struct tfab_context *ctx, bool fresh)
{
	return fresh && !tfab__list_empty(&ctx->done_reqs);
}

/*
 * Dispatch a batch of events in order, except that once a receive has completed in this
 * progress call the control messages after it (not credit returns) wait in ctx->held for the
 * next call (or for a send that finds no request), so that its callback, and the
 * application's reply, come first.
 * Content may pass control messages: none of them concerns a request content is landing for.
 */
static void batch_dispatch(struct tfab_context *ctx, struct tfab_event *ev, int n, bool fresh)
{
	for (int i = 0; i < n; i++) {
		/* credits are not held: they let our own messages go */
		uint32_t src = ev[i].type == TFAB_EV_REMOTE_WRITE ? src_of(&ev[i]) : TFAB_NO_PEER;

		if (ev[i].type == TFAB_EV_REMOTE_WRITE && tfab__imm_is_ctrl(ev[i].imm) &&
		    !tfab__imm_is_credit(ev[i].imm) && completed_here(ctx, fresh)) {
			ctx->held_src[ctx->nheld] = src;
			ctx->held[ctx->nheld++] = ev[i];
		} else {
			dispatch(ctx, &ev[i], src);
		}
	}
}

/* Progress, the whole; *quiet_p: whether it found nothing and left nothing to do. */
static int progress_locked(struct tfab_context *ctx, bool *quiet_p)
{
	struct tfab_event ev[POLL_EVENTS];
	bool fresh = tfab__list_empty(&ctx->done_reqs);
	bool idle;
	int total;

	*quiet_p = false;
	ctx->progress_gen++;
	total = tfab__held_dispatch(ctx);
	for (int round = 0; round < POLL_ROUNDS && !completed_here(ctx, fresh); round++) {
		bool more = false;

		/*
		 * After a batch that held messages back, no other: ctx->held has room for one. A
		 * path no peer ever took has nothing to report: not polled (libfabric tcp's poll
		 * is a system call, which a job of same-host peers would pay at every call). A
		 * round that found anything is followed by another, until a receive completes:
		 * what came while its batch was dispatched (a peer's content right behind its
		 * request) is taken in this call, not after its housekeeping, its callbacks and
		 * the caller's next call.
		 */
		for (unsigned p = 0; p < ctx->npaths && !ctx->nheld; p++) {
			int n;

			if (!ctx->paths[p].peers)
				continue;
			n = tfab_ep_poll(ctx->paths[p].ep, ev, POLL_EVENTS);

			if (n < 0)
				return n;
			batch_dispatch(ctx, ev, n, fresh);
			total += n;
			more |= n > 0;
		}
		if (!more)
			break;
	}
	tfab__sends_retry(ctx);
	tfab__sends_stage(ctx);
	/*
	 * The TAKEN of a receive completed here waits for the next flush: the application's
	 * reply to it (a send that its callback or its caller makes) goes first, and the
	 * peer, which may be waiting for that reply, reads it first.
	 */
	idle = tfab__peers_flush(ctx, true);
	tfab__peers_check_liveness(ctx);
	*quiet_p = idle && total == 0 && !ctx->nheld && tfab__list_empty(&ctx->writes_pending) &&
		   tfab__list_empty(&ctx->staging) && !callbacks_due(ctx);
	return total;
}

int tfab__progress_locked(struct tfab_context *ctx)
{
	bool quiet;

	ctx->quiet = false; /* a caller that goes on under the lock may leave work */
	return progress_locked(ctx, &quiet);
}

int tfab__progress_turn(struct tfab_context *ctx, unsigned pause_us)
{
	int n = tfab__progress_locked(ctx);

	tfab__ctx_unlock(ctx);
	if (n == 0 && pause_us) {
		/* a thread blocked on the lock needs a moment to take it: a wake-up is no turn */
		struct timespec ts = {0, (long)pause_us * 1000};

		nanosleep(&ts, NULL);
	}
	tfab__ctx_lock(ctx);
	return n;
}

/*
 * Whether a progress call now would only poll paths that have nothing for it (lock held):
 * the last one left nothing to do (ctx->quiet), no deadline is due, and every path a peer
 * took says it is quiet. An idle poll of the whole costs several hundred instructions per
 * peer (the paths, the flush, the liveness checks); this, a few dozen.
 */
static bool progress_idle(struct tfab_context *ctx)
{
	if (!ctx->quiet || tfab__coarse_ms() >= ctx->next_liveness_ms)
		return false;
	for (unsigned p = 0; p < ctx->npaths; p++) {
		if (ctx->paths[p].peers && !tfab_ep_quiet(ctx->paths[p].ep))
			return false;
	}
	return true;
}

/* A progress call: the whole, unless it would find and do nothing. */
static int progress_call(struct tfab_context *ctx)
{
	int rc;

	bool polls;

	pthread_mutex_lock(&ctx->lock);
	polls = atomic_load_explicit(&ctx->coll_counts.polls, memory_order_relaxed) && ctx->coll;
	if (progress_idle(ctx) && !polls) {
		pthread_mutex_unlock(&ctx->lock);
		return 0;
	}
	rc = progress_locked(ctx, &ctx->quiet);
	/* Allreduces through the segments: the collectives look at them (kick) as this ends. */
	ctx->coll_due |= polls;
	tfab__ctx_unlock(ctx);
	return rc;
}

int tfab_progress(struct tfab_context *ctx)
{
	return ctx ? progress_call(ctx) : -EINVAL;
}

static void *progress_main(void *arg)
{
	struct tfab_context *ctx = arg;
	struct tfab_spin spin;

	tfab__spin_init(&spin, ctx->cfg.progress_spin_us);
	for (;;) {
		unsigned pause_us;
		int n;

		pthread_mutex_lock(&ctx->lock);
		if (ctx->thread_stop) {
			pthread_mutex_unlock(&ctx->lock);
			return NULL;
		}
		pthread_mutex_unlock(&ctx->lock);
		n = progress_call(ctx);
		/* Idle past TFAB_SPIN_US: yield the core (CI machines have two). */
		pause_us = tfab__spin_pause(&spin, n > 0);
		if (pause_us) {
			struct timespec ts = {0, (long)pause_us * 1000};

			nanosleep(&ts, NULL);
		}
	}
}

int tfab_context_create(struct tfab_context **ctx_p)
{
	return tfab_context_create_with(ctx_p, NULL, NULL, 0);
}

int tfab_context_create_with(struct tfab_context **ctx_p, const char *const *names,
			     const char *const *values, size_t n)
{
	struct tfab_context *ctx;
	char err[1024];
	int rc;

	if (!ctx_p)
		return -EINVAL;
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return -ENOMEM;
	pthread_mutex_init(&ctx->lock, NULL);
	/* A send is kilobytes (its key, twice): beyond what malloc keeps at hand per size. */
	ctx->send_fl = TFAB_FREELIST_INIT(struct tfab_send, 16);
	ctx->parked_fl = TFAB_FREELIST_INIT(struct tfab_response, 16);
	ctx->req_fl = TFAB_FREELIST_INIT(struct tfab_request, 16);
	/* Blocking receives wait on it with deadlines from tfab__now_ms(). */
	tfab__cond_init_monotonic(&ctx->cond);
	tfab__list_init(&ctx->peers);
	tfab__list_init(&ctx->zombies);
	tfab__list_init(&ctx->writes_pending);
	tfab__list_init(&ctx->staging);
	tfab__list_init(&ctx->done_reqs);
	tfab__list_init(&ctx->done_sends);
	tfab__list_init(&ctx->sends_live);
	tfab__list_init(&ctx->meta_lru);
	ctx->listen_fd = -1;
	rc = tfab__config_init_with(&ctx->cfg, names, values, n, err, sizeof(err));
	if (tfab__accepts_open(ctx) && rc == 0) {
		snprintf(err, sizeof(err), "no memory for the bootstrap's handshakes");
		rc = -ENOMEM;
	}
	if (rc == 0)
		rc = tfab__auth_load(ctx, err, sizeof(err));
	if (rc == 0)
		rc = tfab__heartbeat_open(ctx->cfg.heartbeat_ms, &ctx->heartbeat);
	ctx->inflight_limit = ctx->cfg.peer_max_inflight;
	if (ctx->inflight_limit == UINT64_MAX) {
		long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);

		ctx->inflight_limit =
		    pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 2 : UINT64_MAX;
	} else if (ctx->inflight_limit == 0) {
		ctx->inflight_limit = UINT64_MAX;
	}
	if (rc) {
		TFAB_ERROR(SUBSYS, "%s", err);
		goto err;
	}
	rc = tfab__paths_open(ctx, err, sizeof(err));
	if (rc) {
		TFAB_ERROR(SUBSYS, "%s", err);
		goto err;
	}
	rc = tfab__htable_init(&ctx->sends, 1024);
	if (rc)
		goto err;
	rc = tfab__htable_init(&ctx->parked, 1024);
	if (rc)
		goto err;
	if (ctx->cfg.progress_thread) {
		rc = -pthread_create(&ctx->progress_thread, NULL, progress_main, ctx);
		if (rc)
			goto err;
		ctx->thread_running = true;
	}
	for (unsigned i = 0; i < ctx->npaths; i++)
		TFAB_INFO(SUBSYS, "context path %u: %s (%s on %s)", i, ctx->paths[i].name,
			  ctx->paths[i].caps->fabric, ctx->paths[i].caps->domain);
	*ctx_p = ctx;
	return 0;
err:
	tfab__htable_fini(&ctx->sends);
	tfab__htable_fini(&ctx->parked);
	tfab__freelist_fini(&ctx->send_fl);
	tfab__freelist_fini(&ctx->parked_fl);
	tfab__freelist_fini(&ctx->req_fl);
	tfab__paths_close(ctx);
	tfab__cuda_close(ctx->cuda);
	tfab__accepts_close(ctx);
	tfab__auth_unload(ctx);
	tfab__heartbeat_close(ctx->heartbeat);
	pthread_cond_destroy(&ctx->cond);
	pthread_mutex_destroy(&ctx->lock);
	free(ctx);
	return rc;
}

/* Fail every request (of one step, or all) on every peer. */
static void requests_cleanup(struct tfab_context *ctx, bool all, int64_t step, int status)
{
	struct tfab_list *pl, *pt;

	tfab_list_for_each_safe(pl, pt, &ctx->peers)
	{
		struct tfab_peer *peer = tfab_container_of(pl, struct tfab_peer, link);
		struct tfab_list doomed, *l, *t;

		/*
		 * Taken off the peer first: a cancel that fails the peer fails the requests
		 * still on it, which would pull the walk's next one out from under it.
		 */
		tfab__list_init(&doomed);
		tfab_list_for_each_safe(l, t, &peer->requests)
		{
			struct tfab_request *r = tfab_container_of(l, struct tfab_request, link);

			if (all || r->step == step) {
				tfab__list_del(l);
				tfab__list_add_tail(&doomed, l);
			}
		}
		/* Each one ends, and so leaves the list. */
		while (!tfab__list_empty(&doomed))
			tfab__request_fail(
			    tfab_container_of(doomed.next, struct tfab_request, link), status,
			    true);
	}
}

int tfab_step_cleanup(struct tfab_context *ctx, int64_t step_id)
{
	if (!ctx || tfab__check_step("step cleanup", NULL, step_id))
		return -EINVAL;
	tfab__ctx_lock(ctx);
	requests_cleanup(ctx, false, step_id, -TFAB_ERR_ABORTED);
	tfab__sends_cleanup(ctx, false, step_id, -TFAB_ERR_ABORTED);
	tfab__peers_flush(ctx, false);
	tfab__ctx_unlock(ctx);
	return 0;
}

int tfab_abort(struct tfab_context *ctx, int status)
{
	if (!ctx || status > 0)
		return -EINVAL;
	if (status == 0)
		status = -TFAB_ERR_ABORTED;
	tfab__ctx_lock(ctx);
	if (!ctx->abort_status)
		__atomic_store_n(&ctx->abort_status, status, __ATOMIC_RELEASE);
	requests_cleanup(ctx, true, 0, status);
	tfab__sends_cleanup(ctx, true, 0, status);
	if (ctx->coll && ctx->coll->on_fail(ctx->coll_arg, NULL, status))
		ctx->coll_due = true;
	tfab__peers_flush(ctx, false);
	tfab__ctx_unlock(ctx);
	return 0;
}

/* The credits every peer has returned, summed (lock held): it moves when any come. */
static uint64_t credits_seen(struct tfab_context *ctx)
{
	uint64_t n = 0;

	for (struct tfab_list *l = ctx->peers.next; l != &ctx->peers; l = l->next)
		n += tfab_container_of(l, struct tfab_peer, link)->tx_acked;
	return n;
}

/*
 * With the lock held: the receives completed so far handed to the application, their callbacks
 * run (here, or by the thread running callbacks now, waited for), so that what the application
 * holds can be told: a tensor in a callback still due or running is not yet the application's
 * to keep or drop. At most a second: another thread may keep a context busy without end.
 */
static void callbacks_settle(struct tfab_context *ctx)
{
	pthread_t self = pthread_self();
	uint64_t deadline = tfab__now_ms() + 1000;

	while (tfab__now_ms() < deadline) {
		if (ctx->cb_depth && !pthread_equal(ctx->cb_thread, self)) {
			tfab__cond_wait_until(ctx, tfab__now_ms() + 1);
		} else if (!ctx->cb_depth && callbacks_due(ctx)) {
			tfab__ctx_unlock(ctx); /* runs them */
			tfab__ctx_lock(ctx);
		} else {
			return;
		}
	}
}

int tfab_context_destroy(struct tfab_context *ctx)
{
	struct tfab_leave_clock clock;
	uint64_t out;
	unsigned n;

	if (!ctx)
		return 0;
	/*
	 * Tensors are handed out under the lock: checked under it, and the progress thread
	 * stopped in the same hold, none can be handed out after the check.
	 */
	tfab__ctx_lock(ctx);
	callbacks_settle(ctx);
	out = __atomic_load_n(&ctx->managed_out, __ATOMIC_ACQUIRE);
	if (!out)
		ctx->thread_stop = true;
	pthread_mutex_unlock(&ctx->lock);
	if (out) {
		TFAB_ERROR(SUBSYS,
			   "destroying a context while the application holds %llu of its "
			   "tensors",
			   (unsigned long long)out);
		return -EBUSY;
	}
	if (ctx->thread_running) {
		pthread_join(ctx->progress_thread, NULL);
		ctx->thread_running = false;
	}
	/* Connections still in their handshakes close (and their peers go) first. */
	tfab__accepts_close(ctx);
	tfab_abort(ctx, -TFAB_ERR_ABORTED);
	tfab__ctx_lock(ctx);
	/*
	 * Let control messages already posted (cancels, errors, TAKEN) and writes in flight
	 * finish.
	 */
	tfab__leave_clock_start(&clock, tfab__now_ms(), 1000, credits_seen(ctx));
	for (;;) {
		bool busy = ctx->orphans != 0;
		uint64_t now = tfab__now_ms();
		/* CANCELs wait for their reading only while credits keep coming (peer_leave) */
		bool hopeful = tfab__leave_clock_hopeful(&clock, now, credits_seen(ctx));
		struct tfab_list *l;

		for (l = ctx->peers.next; l != &ctx->peers; l = l->next) {
			struct tfab_peer *peer = tfab_container_of(l, struct tfab_peer, link);
			bool live = peer->connected && !peer->failed;
			/*
			 * our TAKEN messages (its sends are delivered on them), our messages
			 * queued for credit (a collective's eager operands), and the CANCELs of
			 * our requests (the abort's), until it has read them: then it writes
			 * nothing more to us, and its connection is not cut
			 */
			bool owes = live && !peer->leave_sent &&
				    (peer->ntaken || !tfab__list_empty(&peer->pending) ||
				     (peer->ncancelled && hopeful));

			/* then our LEAVE, last (peer_leave), once no content write of ours waits */
			if (!owes && !ctx->orphans)
				tfab__peer_send_leave(peer);
			busy |=
			    peer->users != 0 || owes || (live && !tfab__list_empty(&peer->pending));
		}
		if (!busy || now > clock.deadline)
			break;
		tfab__progress_locked(ctx);
	}
	/* Callbacks the drain made due run now, so that every failed send is an orphan. */
	tfab__ctx_unlock(ctx);
	tfab__ctx_lock(ctx);
	while (!tfab__list_empty(&ctx->peers))
		tfab__peer_free(tfab_container_of(ctx->peers.next, struct tfab_peer, link));
	/*
	 * Writes still in flight now can only be to dead peers (a fabric such as libfabric's shm
	 * never completes a write its target died before reading): their sends let go, so that
	 * the registrations and the endpoint close, and closing the endpoint ends the writes.
	 */
	n = tfab__sends_abandon(ctx);
	tfab__peers_release_zombies(ctx); /* their writes end with the endpoints */
	tfab__ctx_unlock(ctx);
	if (n)
		TFAB_WARN(SUBSYS, "%u writes to gone peers still in flight at destroy: abandoned",
			  n);
	tfab__heartbeat_close(ctx->heartbeat); /* its peers' sockets left it as they closed */
	if (ctx->listen_fd >= 0)
		close(ctx->listen_fd);
	if (tfab__paths_close(ctx))
		TFAB_WARN(SUBSYS, "registrations still in use at destroy");
	tfab__cuda_close(ctx->cuda);
	tfab__htable_fini(&ctx->sends);
	tfab__htable_fini(&ctx->parked);
	tfab__freelist_fini(&ctx->send_fl);
	tfab__freelist_fini(&ctx->parked_fl);
	tfab__freelist_fini(&ctx->req_fl);
	free(ctx->peer_by_id);
	free(ctx->reqs);
	free(ctx->req_gen);
	free(ctx->req_owner);
	free(ctx->req_free);
	pthread_cond_destroy(&ctx->cond);
	tfab__auth_unload(ctx);
	pthread_mutex_destroy(&ctx->lock);
	free(ctx);
	return 0;
}

/* Whether every send up to seq has settled (live sends are in posting order). */
static bool flushed(struct tfab_context *ctx, uint64_t seq)
{
	return tfab__list_empty(&ctx->sends_live) ||
	       tfab_container_of(ctx->sends_live.next, struct tfab_send, live_link)->seq > seq;
}

int tfab_flush(struct tfab_context *ctx, int timeout_ms)
{
	uint64_t deadline, seq;
	int rc = 0;

	if (!ctx || timeout_ms < 0)
		return -EINVAL;
	deadline = tfab__now_ms() + (uint64_t)timeout_ms;
	tfab__ctx_lock(ctx);
	/* The sends of the callbacks being run are freed after them: waiting would never end. */
	if (ctx->cb_depth && pthread_equal(ctx->cb_thread, pthread_self())) {
		tfab__ctx_unlock(ctx);
		return -EDEADLK;
	}
	seq = ctx->send_seq;
	tfab__peers_flush(ctx, false);
	while (!flushed(ctx, seq)) {
		if (tfab__now_ms() >= deadline) {
			rc = -ETIMEDOUT;
			break;
		}
		if (ctx->thread_running) {
			ctx->flushers++;
			tfab__cond_wait_until(ctx, deadline);
			ctx->flushers--;
		} else {
			tfab__progress_turn(ctx, 0);
		}
	}
	tfab__ctx_unlock(ctx);
	return rc;
}

int tfab_mr_invalidate(struct tfab_context *ctx, const void *addr, size_t len)
{
	int rc;

	if (!ctx || !addr || !len)
		return -EINVAL;
	tfab__ctx_lock(ctx);
	rc = 0;
	for (unsigned i = 0; i < ctx->npaths && rc >= 0; i++)
		rc = tfab__mr_cache_invalidate(ctx->paths[i].mr_cache, addr, len);
	tfab__ctx_unlock(ctx);
	return rc < 0 ? rc : 0;
}

int tfab_get_stats(struct tfab_context *ctx, struct tfab_stats *stats_p)
{
	struct tfab_mr_cache_stats mc;
	struct tfab_pool_stats ps;

	if (!ctx || !stats_p)
		return -EINVAL;
	tfab__ctx_lock(ctx);
	*stats_p = ctx->stats;
	stats_p->mr_hits = stats_p->mr_misses = 0;
	for (unsigned i = 0; i < ctx->npaths; i++) {
		tfab__mr_cache_get_stats(ctx->paths[i].mr_cache, &mc);
		stats_p->mr_hits += mc.hits;
		stats_p->mr_misses += mc.misses;
		stats_p->mr_registrations += mc.registrations;
	}
	tfab__pool_get_stats(ctx->pool, &ps);
	stats_p->mr_registrations += ps.registrations;
	stats_p->gpu_pins = ps.pins;
	stats_p->coll_shm = atomic_load_explicit(&ctx->coll_counts.shm, memory_order_relaxed);
	stats_p->coll_bytes_wire +=
	    atomic_load_explicit(&ctx->coll_counts.shm_bytes, memory_order_relaxed);
	stats_p->coll_bytes_logical +=
	    atomic_load_explicit(&ctx->coll_counts.shm_bytes, memory_order_relaxed);
	tfab__ctx_unlock(ctx);
	return 0;
}

/* The first path's, as before a context had several. */
const char *tfab_context_backend(struct tfab_context *ctx)
{
	return ctx ? ctx->paths[0].caps->backend : NULL;
}

const char *tfab_context_fabric(struct tfab_context *ctx)
{
	return ctx ? ctx->paths[0].caps->fabric : NULL;
}

const char *tfab_context_domain(struct tfab_context *ctx)
{
	return ctx ? ctx->paths[0].caps->domain : NULL;
}

int tfab_context_paths(struct tfab_context *ctx, const char **names, int max)
{
	if (!ctx || max < 0 || (max && !names))
		return -EINVAL;
	for (unsigned i = 0; i < ctx->npaths && (int)i < max; i++)
		names[i] = ctx->paths[i].name;
	return (int)ctx->npaths;
}

const char *tfab_peer_path(const struct tfab_peer *peer)
{
	return peer && peer->path ? peer->path->name : NULL;
}

int tfab_peer_status(struct tfab_peer *peer)
{
	int status;

	if (!peer)
		return -EINVAL;
	tfab__ctx_lock(peer->ctx);
	status = peer->failed;
	tfab__ctx_unlock(peer->ctx);
	return status;
}

int tfab_peer_fabric(const struct tfab_peer *peer, const char **backend_p, const char **fabric_p,
		     const char **domain_p)
{
	if (!peer || !backend_p || !fabric_p || !domain_p)
		return -EINVAL;
	if (!peer->path)
		return -ENOTCONN;
	*backend_p = peer->path->caps->backend;
	*fabric_p = peer->path->caps->fabric;
	*domain_p = peer->path->caps->domain;
	return 0;
}
