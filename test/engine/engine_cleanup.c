/*
 * Engine scenarios: operations ended early. Step cleanups and an abort fail what is pending;
 * a context's destroy is refused while the application holds a tensor. A receive that times
 * out leaves its send to a later receive, and a stale reply to a request that ended touches
 * nothing.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "test/common/fault_ops.h"
#include "engine_scenarios.h"
#include "engine_test.h"

/*
 * Destroying a context while the application holds one of its tensors: -EBUSY, and nothing
 * done (the progress thread, when on, still runs: the next receive completes).
 */
int sc_destroy_busy(struct mp *mp)
{
	static int32_t vals[2] = {5, 6};
	int64_t one = 1;
	DLTensor t[2] = {int32_scalar(&vals[0], &one), int32_scalar(&vals[1], &one)};
	DLManagedTensor *m = NULL, *m2 = NULL;

	if (mp->rank == 1) {
		struct done d = {0};

		CHECK_RC(tfab_send(mp->ctx, "busy/1", 14, &t[0], false, on_sent, &d), 0);
		CHECK_RC(tfab_send(mp->ctx, "busy/2", 14, &t[1], false, on_sent, &d), 0);
		CHECK(wait_n(mp, &d, 2));
		CHECK(d.errors == 0);
		return 0;
	}
	CHECK_RC(recv_one(mp, 1, "busy/1", 14, &m, NULL), 0);
	CHECK_RC(tfab_context_destroy(mp->ctx), -EBUSY);
	CHECK_RC(recv_one(mp, 1, "busy/2", 14, &m2, NULL), 0);
	CHECK(*(int32_t *)m->dl_tensor.data == 5 && *(int32_t *)m2->dl_tensor.data == 6);
	m->deleter(m);
	m2->deleter(m2);
	return 0;
}

/*
 * A step cleanup whose first message (a receive's cancel; on the sender, a parked request's
 * error reply) fails the peer, and with it the rest of what the cleanup walks: every receive
 * still ends once, and the walk survives the requests it has not reached yet ending under it.
 */
int sc_cleanup_fails_peer(struct mp *mp)
{
	/* Control messages (not credits) fail at once, as to a peer gone. */
	static const struct fault_rule ctrl_fails = {
	    .match = FAULT_CTRL, .status = -TFAB_ERR_PEER_FAILED, .first = 1};
	struct done d = {0};
	uint64_t deadline = ms_now() + WAIT_MS;
	int other = mp->rank ? 0 : 1;
	size_t parked = 0;
	char key[32];

	/* Rank 0 receives what rank 1 never sends: parked there, pending here. */
	for (int i = 0; i < 4 && mp->rank == 0; i++) {
		snprintf(key, sizeof(key), "doomed/%d", i);
		CHECK_RC(tfab_recv(mp->ctx, mp->peers[1], key, 21, NULL, on_recv, &d), 0);
	}
	CHECK(mp_barrier(mp, 21) == 0);
	while (mp->rank == 1 && parked < 4 && ms_now() < deadline) {
		tfab_progress(mp->ctx);
		tfab__ctx_lock(mp->ctx);
		parked = mp->ctx->parked.count;
		tfab__ctx_unlock(mp->ctx);
	}
	CHECK(mp->rank == 0 || parked == 4);
	fault_ops_install(mp->ctx);
	fault_ops_set(mp->ctx, &ctrl_fails, 1);
	CHECK_RC(tfab_step_cleanup(mp->ctx, 21), 0);
	CHECK(fault_ops_hits(mp->ctx, 0) >= 1);
	fault_ops_remove(mp->ctx);
	if (mp->rank == 0) {
		CHECK(wait_n(mp, &d, 4));
		CHECK(d.n == 4 && d.errors == 4);
	}
	CHECK_RC(tfab_recv(mp->ctx, mp->peers[other], "after", 1, NULL, on_recv, &d),
		 -TFAB_ERR_PEER_FAILED);
	return 0;
}

/*
 * Step cleanup: receives of a step nobody sends fail, sends of a step nobody receives fail,
 * and a receive whose request the sender cleans up gets the sender's status.
 */
int sc_step_cleanup(struct mp *mp)
{
	int64_t shape[1] = {8};
	struct tensor t;
	struct done d = {0}, d2 = {0};

	tensor_make(&t, f32, 1, shape);
	tensor_fill(&t, 1);
	if (mp->rank == 0) {
		CHECK_RC(tfab_recv(mp->ctx, mp->peers[1], "never/sent", 5, NULL, on_recv, &d), 0);
		CHECK_RC(
		    tfab_recv(mp->ctx, mp->peers[1], "cleaned/by/sender", 7, NULL, on_recv, &d2),
		    0);
		CHECK(mp_barrier(mp, 70) == 0);
		CHECK_RC(tfab_step_cleanup(mp->ctx, 5), 0);
		CHECK(wait_n(mp, &d, 1));
		CHECK(d.errors == 1 && d.last_status == -TFAB_ERR_ABORTED);
		/* the sender's cleanup of step 7 reaches this receive as an error */
		CHECK(wait_n(mp, &d2, 1));
		CHECK(d2.errors == 1 && d2.last_status == -TFAB_ERR_ABORTED);
	} else {
		CHECK_RC(tfab_send(mp->ctx, "never/received", 6, &t.dl, false, on_sent, &d), 0);
		CHECK(mp_barrier(mp, 70) == 0);
		CHECK_RC(tfab_step_cleanup(mp->ctx, 6), 0);
		CHECK(wait_n(mp, &d, 1));
		CHECK(d.errors == 1 && d.last_status == -TFAB_ERR_ABORTED);
		CHECK_RC(tfab_step_cleanup(mp->ctx, 7), 0);
		/* a cleaned-up step can be used again */
		d.n = d.errors = 0;
		CHECK_RC(tfab_send(mp->ctx, "never/received", 6, &t.dl, false, on_sent, &d), 0);
		CHECK_RC(tfab_step_cleanup(mp->ctx, 6), 0);
		CHECK(wait_n(mp, &d, 1));
	}
	CHECK(mp_barrier(mp, 71) == 0);
	tensor_free(&t);
	return 0;
}

/* Abort fails everything pending with its status, and every later call at once. */
int sc_abort(struct mp *mp)
{
	int64_t shape[1] = {8};
	struct tensor t;
	struct done d = {0};

	tensor_make(&t, f32, 1, shape);
	if (mp->rank == 0) {
		for (int i = 0; i < 10; i++)
			CHECK_RC(tfab_recv(mp->ctx, mp->peers[1], "pending", i, NULL, on_recv, &d),
				 0);
		CHECK_RC(tfab_send(mp->ctx, "unsent", 1, &t.dl, false, on_sent, &d), 0);
		CHECK_RC(tfab_abort(mp->ctx, -ECANCELED), 0);
		CHECK(wait_n(mp, &d, 11));
		CHECK(d.errors == 11 && d.last_status == -ECANCELED);
		CHECK_RC(tfab_recv(mp->ctx, mp->peers[1], "later", 1, NULL, on_recv, &d),
			 -ECANCELED);
		CHECK_RC(tfab_send(mp->ctx, "later", 1, &t.dl, false, on_sent, &d), -ECANCELED);
		/* An aborted context still answers: rank 1's request fails with the status. */
		CHECK_RC(mp_wait_note(mp, 1, "answered", WAIT_MS), 0);
	} else {
		/*
		 * Stay until rank 0 has aborted (no barrier: its context refuses everything then),
		 * and tell it outside the fabric when the answer came, so that the answer, not the
		 * peer's leaving, ends the receive (peer_exits tests a peer that leaves).
		 */
		CHECK_RC(tfab_recv(mp->ctx, mp->peers[0], "never", 1, NULL, on_recv, &d), 0);
		CHECK(wait_n(mp, &d, 1));
		CHECK(d.errors == 1 && d.last_status == -ECANCELED);
		CHECK_RC(mp_note(mp, "answered"), 0);
	}
	tensor_free(&t);
	return 0;
}

/*
 * A receive that timed out leaves the send to a later receive: rank 0's blocking receive gives
 * up; rank 1 then offers the tensor, having read rank 0's request and cancel while it waited
 * (poll), or not (both still unread when the send is posted). The send is not reported done
 * before rank 0's second receive has taken it, and that receive gets the data: into a pool
 * tensor and into a caller's buffer. A receive into a caller's buffer that gave up returns once
 * rank 1 has read its cancel (rank 1 may be writing into the buffer until then): so where rank
 * 1 reads nothing while it waits, it waits a time past the timeout, not for rank 0's word.
 */
int sc_recv_timeout(struct mp *mp)
{
	int64_t shape[1] = {256};
	struct tensor t;

	tensor_make(&t, f32, 1, shape);
	for (int round = 0; round < 4; round++) {
		bool poll = round & 1, caller = (round & 2) != 0;
		int64_t step = 40 + round;
		char timedout[32], checked[32];

		snprintf(timedout, sizeof(timedout), "timedout%d_", round);
		snprintf(checked, sizeof(checked), "checked%d_", round);
		if (mp->rank == 0) {
			DLManagedTensor *m = NULL;

			memset(t.buf, 0, t.nbytes);
			CHECK_RC(tfab_recv_sync(mp->ctx, mp->peers[1], "late", step,
						caller ? &t.dl : NULL, 300, &m, NULL),
				 -ETIMEDOUT);
			CHECK(m == NULL);
			/*
			 * The cancelled pool destination waits for rank 1's verdict on the CANCEL
			 * (its credits): rank 1 may still write into it, and a block back in the
			 * pool at once could be the next receive's. (Round 0's request had no
			 * destination: the key's meta-data was not cached yet.) A CANCEL's reader
			 * returns its credits at once, so with a progress thread they may be back
			 * already: then the CANCEL is no longer pending either. Read under the
			 * lock, as the progress thread releases both.
			 */
			if (round == 1) {
				uint32_t held, cancelled;

				tfab__ctx_lock(mp->ctx);
				held = mp->peers[1]->nheld_dests;
				cancelled = mp->peers[1]->ncancelled;
				tfab__ctx_unlock(mp->ctx);
				if (held != 1 && !(held == 0 && cancelled == 0))
					fprintf(stderr,
						"rank 0: %u destinations held, %u cancels unread\n",
						held, cancelled);
				CHECK(held == 1 || (held == 0 && cancelled == 0));
			}
			CHECK_RC(mp_note(mp, timedout), 0);
			CHECK_RC(mp_wait_note(mp, 1, checked, WAIT_MS), 0);
			CHECK_RC(tfab_recv_sync(mp->ctx, mp->peers[1], "late", step,
						caller ? &t.dl : NULL, WAIT_MS, &m, NULL),
				 0);
			if (m) {
				CHECK(bytes_match(m->dl_tensor.data, t.nbytes,
						  7000 + (uint64_t)round));
				m->deleter(m);
			} else {
				CHECK(caller &&
				      bytes_match(t.buf, t.nbytes, 7000 + (uint64_t)round));
			}
			continue;
		}
		struct done d = {0};
		uint64_t until;

		tensor_fill(&t, 7000 + (uint64_t)round);
		if (poll)
			CHECK_RC(mp_wait_note(mp, 0, timedout, WAIT_MS), 0);
		else if (caller)
			usleep(600 * 1000); /* rank 0's receive gives up meanwhile */
		else
			CHECK_RC(mp_wait_note_quiet(mp, 0, timedout, WAIT_MS), 0);
		CHECK_RC(tfab_send(mp->ctx, "late", step, &t.dl, false, on_sent, &d), 0);
		/* Nobody has taken it yet, however long this side drives progress. */
		for (until = ms_now() + 300; ms_now() < until;)
			tfab_progress(mp->ctx);
		if (done_n(&d))
			fprintf(stderr,
				"rank 1: round %d: the send ended with %s before a receive\n",
				round, tfab_strerror(d.last_status));
		CHECK(done_n(&d) == 0);
		CHECK_RC(mp_note(mp, checked), 0);
		CHECK(wait_n(mp, &d, 1));
		CHECK(d.errors == 0);
	}
	tensor_free(&t);
	return 0;
}

/*
 * A receive into the caller's buffer gives up after rank 1 has read (parked) its request, and
 * rank 1, which drives no progress for a while, then posts the send: it finds the request
 * parked and writes at once, before it reads the cancel. That write must not land in a buffer
 * rank 0 was given back (rank 0 fills it with a pattern after its receive returned, and finds
 * the pattern intact), nor break the connection (a write into a revoked region does on tcp and
 * verbs): the send goes to rank 0's next receive, into the same buffer, and ends delivered.
 * Rounds: the send posted while rank 0's receive still waits for rank 1's word (round 0);
 * long after (round 1: rank 1 progresses between its parking and its send, so it reads the
 * cancel first); and as round 0 with rank 0 asking again, into the same buffer, as soon as its
 * receive returned (round 2: on tcp, the write into the revoked buffer broke the connection).
 */
int sc_cancel_caller_dest(struct mp *mp)
{
	int64_t shape[1] = {262144};
	struct tensor t;

	tensor_make(&t, f32, 1, shape);
	for (int round = 0; round < 3; round++) {
		int64_t step = 70 + round;
		char returned[32], sent[32], checked[32];

		snprintf(returned, sizeof(returned), "ccd_returned%d", round);
		snprintf(sent, sizeof(sent), "ccd_sent%d", round);
		snprintf(checked, sizeof(checked), "ccd_checked%d", round);
		if (mp->rank == 0) {
			DLManagedTensor *m = NULL;
			uint64_t t0 = ms_now();

			/* the meta-data first, so that the request carries the destination */
			if (round == 0)
				CHECK_RC(tfab_recv_sync(mp->ctx, mp->peers[1], "ccd", 0, &t.dl,
							WAIT_MS, &m, NULL),
					 0);
			if (m)
				m->deleter(m);
			m = NULL;
			memset(t.buf, 0, t.nbytes);
			CHECK_RC(tfab_recv_sync(mp->ctx, mp->peers[1], "ccd", step, &t.dl, 300, &m,
						NULL),
				 -ETIMEDOUT);
			CHECK(m == NULL);
			fprintf(stderr, "rank 0: round %d: the receive gave up after %llu ms\n",
				round, (unsigned long long)(ms_now() - t0));
			/* The buffer is ours again: whatever rank 1 does now must not touch it. */
			memset(t.buf, 0xa5, t.nbytes);
			CHECK_RC(mp_note(mp, returned), 0);
			if (round != 2)
				CHECK_RC(mp_wait_note(mp, 1, sent, WAIT_MS), 0);
			for (size_t i = 0; i < t.nbytes && round != 2; i++) {
				if (((uint8_t *)t.buf)[i] != 0xa5) {
					fprintf(
					    stderr,
					    "rank 0: round %d: byte %zu of the buffer given back "
					    "was written (%#x)\n",
					    round, i, ((uint8_t *)t.buf)[i]);
					CHECK(false);
				}
			}
			CHECK_RC(tfab_recv_sync(mp->ctx, mp->peers[1], "ccd", step, &t.dl, WAIT_MS,
						&m, NULL),
				 0);
			CHECK(bytes_match(t.buf, t.nbytes, 9100 + (uint64_t)round));
			if (m)
				m->deleter(m);
			CHECK_RC(mp_note(mp, checked), 0);
			continue;
		}
		struct done d = {0};
		uint64_t until;

		if (round == 0) {
			tensor_fill(&t, 1);
			CHECK_RC(tfab_send(mp->ctx, "ccd", 0, &t.dl, false, on_sent, &d), 0);
			CHECK(wait_n(mp, &d, 1));
			d = (struct done){0};
		}
		tensor_fill(&t, 9100 + (uint64_t)round);
		/* rank 0's request arrives and is parked: no send of that step yet */
		for (until = ms_now() + 150; ms_now() < until;)
			tfab_progress(mp->ctx);
		if (round != 1) {
			usleep(600 * 1000); /* rank 0's receive gives up meanwhile */
		} else {
			CHECK_RC(mp_wait_note(mp, 0, returned, WAIT_MS), 0);
		}
		CHECK_RC(tfab_send(mp->ctx, "ccd", step, &t.dl, false, on_sent, &d), 0);
		for (until = ms_now() + 300; ms_now() < until;)
			tfab_progress(mp->ctx);
		/* (in round 2, rank 0 asked again as soon as its receive returned) */
		if (done_n(&d) && round != 2)
			fprintf(stderr,
				"rank 1: round %d: the send ended with %s before a receive\n",
				round, tfab_strerror(d.last_status));
		CHECK(done_n(&d) == 0 || round == 2);
		CHECK_RC(mp_note(mp, sent), 0);
		CHECK(wait_n(mp, &d, 1));
		if (d.errors)
			fprintf(stderr, "rank 1: round %d: the send ended with %s\n", round,
				tfab_strerror(d.last_status));
		CHECK(d.errors == 0);
		CHECK_RC(mp_wait_note(mp, 0, checked, WAIT_MS), 0);
	}
	tensor_free(&t);
	return 0;
}

/*
 * A stale reply for a request that ended here (a cleanup) and whose slot a new receive has
 * taken: rank 0's request for "stale/a" ends once rank 1 holds it, and its receive of
 * "stale/b" reuses the slot (the request table hands out the slot freed last). Rank 1 answers
 * the old request only now, not having read rank 0's cancel: with META_DATA (round 0: it posts
 * the send) or with ERROR (round 1: a step cleanup of its own). The reply names the old
 * request's index, whose generation differs: it must not touch the new receive, which then
 * completes normally.
 */
int sc_stale_reply(struct mp *mp)
{
	static int32_t vals[2] = {11, 22};
	int64_t one = 1;
	DLTensor ta = int32_scalar(&vals[0], &one), tb = int32_scalar(&vals[1], &one);

	for (int round = 0; round < 2; round++) {
		int64_t step_a = 60 + 2 * round, step_b = step_a + 1;
		const char *key = round ? "stale/a1" : "stale/a0";
		char parked[32], posted[32], answered[32], checked[32];

		snprintf(parked, sizeof(parked), "parked%d_", round);
		snprintf(posted, sizeof(posted), "posted%d_", round);
		snprintf(answered, sizeof(answered), "answered%d_", round);
		snprintf(checked, sizeof(checked), "checked%d_", round);
		if (mp->rank == 0) {
			struct done d = {0}, old = {0};
			struct tfab_stats st0, st;

			/* The old request ends here once rank 1 holds it: a cleanup of its step. */
			CHECK_RC(tfab_recv(mp->ctx, mp->peers[1], key, step_a, NULL, on_recv, &old),
				 0);
			CHECK_RC(mp_wait_note(mp, 1, parked, WAIT_MS), 0);
			CHECK_RC(tfab_step_cleanup(mp->ctx, step_a), 0);
			CHECK(wait_n(mp, &old, 1));
			CHECK(old.errors == 1 && old.last_status == -TFAB_ERR_ABORTED);
			CHECK_RC(tfab_get_stats(mp->ctx, &st0), 0);
			CHECK_RC(
			    tfab_recv(mp->ctx, mp->peers[1], "stale/b", step_b, NULL, on_recv, &d),
			    0);
			CHECK_RC(mp_note(mp, posted), 0);
			CHECK_RC(mp_wait_note(mp, 1, answered, WAIT_MS), 0);
			/* Long enough for the reply to land and be read here. */
			for (uint64_t until = ms_now() + 300; ms_now() < until;)
				tfab_progress(mp->ctx);
			CHECK_RC(tfab_get_stats(mp->ctx, &st), 0);
			CHECK(done_n(&d) == 0);
			CHECK(st.rerequests == st0.rerequests);
			CHECK_RC(mp_note(mp, checked), 0);
			CHECK(wait_n(mp, &d, 1));
			CHECK(d.errors == 0 && *(int32_t *)d.tensor->dl_tensor.data == 22);
			d.tensor->deleter(d.tensor);
			CHECK(mp_barrier(mp, 600 + round) == 0);
			continue;
		}
		struct done sa = {0}, sb = {0};
		size_t n = 0;

		/* Read rank 0's request, then stop reading until its new receive is out. */
		for (uint64_t until = ms_now() + WAIT_MS; n == 0 && ms_now() < until;) {
			tfab_progress(mp->ctx);
			tfab__ctx_lock(mp->ctx);
			n = mp->ctx->parked.count;
			tfab__ctx_unlock(mp->ctx);
		}
		CHECK(n == 1);
		CHECK_RC(mp_note(mp, parked), 0);
		CHECK_RC(mp_wait_note_quiet(mp, 0, posted, WAIT_MS), 0);
		if (round == 0)
			CHECK_RC(tfab_send(mp->ctx, key, step_a, &ta, false, on_sent, &sa), 0);
		else
			CHECK_RC(tfab_step_cleanup(mp->ctx, step_a), 0);
		CHECK_RC(mp_note(mp, answered), 0);
		CHECK_RC(mp_wait_note(mp, 0, checked, WAIT_MS), 0);
		CHECK_RC(tfab_send(mp->ctx, "stale/b", step_b, &tb, false, on_sent, &sb), 0);
		CHECK(wait_n(mp, &sb, 1));
		CHECK(sb.errors == 0);
		CHECK(mp_barrier(mp, 600 + round) == 0);
		if (round == 0) {
			/* Nobody took "stale/a0": a cleanup ends it. */
			CHECK_RC(tfab_step_cleanup(mp->ctx, step_a), 0);
			CHECK(wait_n(mp, &sa, 1));
			CHECK(sa.errors == 1 && sa.last_status == -TFAB_ERR_ABORTED);
		}
	}
	return 0;
}
