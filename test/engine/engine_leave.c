/*
 * Engine scenarios: peers that leave normally. A peer exits while asked for tensors; a
 * receiver leaves right after a receive; receivers in no-request mode leave with requests
 * standing; a send is taken just before its receiver leaves; a peer is forgotten while its
 * request is unread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine_scenarios.h"
#include "engine_test.h"

/* n floats in host memory, as one dimension */
static DLTensor float_vector(float *v, int64_t *n)
{
	return (DLTensor){
	    .data = v, .device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLFloat, 32, 1}, .shape = n};
}

/*
 * A peer that leaves normally, destroying its context right after asking this process for
 * tensors, while this process waits on a receive from it: the receive fails with
 * TFAB_ERR_PEER_FAILED (or the peer's abort status, if it answered first), and this process
 * neither crashes nor hangs. Each round (TFAB_TEST_ROUNDS, 8) is a fresh pair of contexts,
 * since timing decides what the leaving peer leaves behind: on shm its first write to us, which
 * may be read after its endpoint has closed; on tcp our credit returns, injected into its
 * closing connection.
 */
int sc_peer_exits(struct mp *mp)
{
	const char *env = getenv("TFAB_TEST_ROUNDS");
	int rounds = env ? atoi(env) : 8;

	for (int round = 0; round < rounds; round++) {
		struct tfab_context *ctx;
		struct tfab_peer *peer;
		struct done d = {0};
		char what[32];
		unsigned port;
		int rc;

		snprintf(what, sizeof(what), "px_port%d_", round);
		CHECK_RC(tfab_context_create(&ctx), 0);
		if (mp->rank == 0) {
			uint16_t p16;

			CHECK_RC(tfab_listen(ctx, "127.0.0.1", 0, &p16), 0);
			CHECK_RC(mp_put(mp, what, p16), 0);
			CHECK_RC(tfab_accept(ctx, 20000, &peer), 0); /* rank 1 may have died */
			/* More requests than a credit batch, so that credits come back late. */
			for (int i = 0; i < 24; i++)
				CHECK_RC(tfab_recv(ctx, peer, "wanted", i, NULL, on_recv, &d), 0);
			CHECK_RC(tfab_context_destroy(ctx), 0);
			continue;
		}
		CHECK_RC(mp_get(mp, 0, what, &port), 0);
		CHECK_RC(tfab_connect(ctx, "127.0.0.1", (uint16_t)port, 20000, &peer), 0);
		rc = tfab_recv(ctx, peer, "never", 1, NULL, on_recv, &d);
		if (rc == 0) {
			struct mp_watch w;

			mp_watch_start(&w, mp, ctx, "the receive's end", 0);
			for (int i = 0; done_n(&d) < 1 && !mp_watch_stalled(&w, 0); i++) {
				tfab_progress(ctx);
				if (done_n(&d) < 1)
					usleep(i < 10 ? 0 : 100);
			}
			CHECK(done_n(&d) == 1 && d.errors == 1);
			rc = d.last_status;
		}
		if (rc != -TFAB_ERR_PEER_FAILED && rc != -TFAB_ERR_ABORTED) {
			fprintf(stderr, "rank 1: round %d: the receive ended with %s\n", round,
				tfab_strerror(rc));
			return 1;
		}
		CHECK_RC(tfab_peer_destroy(peer), 0);
		CHECK_RC(tfab_context_destroy(ctx), 0);
	}
	return 0;
}

/*
 * A receiver that leaves its peer as soon as a receive has completed: the progress call that
 * completed it held the TAKEN back for a reply that never comes, and leaving sends it, so the
 * send is delivered (not failed with the peer).
 */
int sc_leave_after_recv(struct mp *mp)
{
	static int32_t val = 7;
	int64_t one = 1;
	struct done d = {0};

	if (mp->rank == 0) {
		DLTensor t = int32_scalar(&val, &one);

		CHECK_RC(tfab_send(mp->ctx, "leave", 1, &t, false, on_sent, &d), 0);
		CHECK(wait_n(mp, &d, 1));
		CHECK_RC(d.last_status, 0);
		return 0;
	}
	CHECK_RC(tfab_recv(mp->ctx, mp->peers[0], "leave", 1, NULL, on_recv, &d), 0);
	CHECK(wait_n(mp, &d, 1));
	CHECK_RC(d.last_status, 0);
	CHECK(d.tensor && *(int32_t *)d.tensor->dl_tensor.data == 7);
	d.tensor->deleter(d.tensor);
	CHECK_RC(tfab_peer_destroy(mp->peers[0]), 0);
	mp->peers[0] = NULL;
	return 0;
}

/*
 * A receiver in no-request mode leaves its peer (tfab_peer_destroy) while requests stand
 * ahead at it, the peer alive and polling: leaving cancels them and waits for the peer to
 * read the CANCELs, so the peer is known to write nothing more and its connection is not cut
 * (tfab_stats.peers_cut; on libfabric's tcp a cut one leaves the endpoint open until the
 * process ends, with a warning at every tfab-perf --no-request run's end). Eight keys of
 * eight standing: their CANCELs outrun the credit window (64 slots), and those queued share
 * slots, so each one's slot must be reckoned as the queue is packed (counted one slot each,
 * the credits for slots never sent never came, and the peer was cut after 2 s).
 */
int sc_leave_standing(struct mp *mp)
{
	enum { KEYS = 8, DEPTH = 8 };
	static int32_t vals[KEYS];
	int64_t one = 1;
	char key[32];

	if (mp->rank == 1) {
		struct done d = {0};

		for (int k = 0; k < KEYS; k++) {
			DLTensor t;

			vals[k] = 100 + k;
			t = int32_scalar(&vals[k], &one);
			snprintf(key, sizeof(key), "standing%d", k);
			for (int step = 1; step <= 2; step++)
				CHECK_RC(tfab_send(mp->ctx, key, step, &t, false, on_sent, &d), 0);
		}
		CHECK(wait_n(mp, &d, 2 * KEYS));
		CHECK(d.errors == 0);
		/* polling (reading the CANCELs) until rank 0 has left */
		CHECK_RC(mp_wait_note(mp, 0, "left", 0), 0);
		return 0;
	}
	struct tfab_stats s0, s1, s2;
	DLManagedTensor *m = NULL;

	CHECK_RC(tfab_get_stats(mp->ctx, &s0), 0);
	for (int k = 0; k < KEYS; k++) {
		snprintf(key, sizeof(key), "standing%d", k);
		CHECK_RC(tfab_recv_ahead(mp->ctx, mp->peers[1], key, DEPTH), 0);
		/* step 1 learns the meta-data, 2 posts the steps after it ahead */
		for (int step = 1; step <= 2; step++) {
			CHECK_RC(recv_one(mp, 1, key, step, &m, NULL), 0);
			CHECK(*(int32_t *)m->dl_tensor.data == 100 + k);
			m->deleter(m);
		}
	}
	CHECK_RC(tfab_get_stats(mp->ctx, &s1), 0);
	CHECK(s1.requests_ahead - s0.requests_ahead >= KEYS * DEPTH);
	CHECK_RC(tfab_peer_destroy(mp->peers[1]), 0);
	mp->peers[1] = NULL;
	CHECK_RC(tfab_get_stats(mp->ctx, &s2), 0);
	if (s2.peers_cut != s1.peers_cut) {
		fprintf(stderr, "rank 0: the peer left with requests standing was cut\n");
		return 1;
	}
	CHECK_RC(mp_note(mp, "left"), 0);
	return 0;
}

/*
 * Both sides of a pair in no-request mode, each with requests standing at the other, leave
 * one after the other, as tfab-perf --no-request ends: the first leaves while the second's
 * requests stand at it, and so never reads the CANCELs the second sends as it leaves. The
 * first's LEAVE tells the second that nothing more comes: neither is cut
 * (tfab_stats.peers_cut). Before LEAVE the second waited 100 ms for credits that could not
 * come and cut the peer: on libfabric's tcp with a warning and its endpoint left open.
 */
int sc_leave_both_standing(struct mp *mp)
{
	enum { STEPS = 6, DEPTH = 4, N = 1 << 18 }; /* 1 MiB tensors */
	static float vals[N];
	int64_t shape = N;
	DLTensor t = float_vector(vals, &shape);
	int other = 1 - mp->rank;
	const char *mine = mp->rank ? "both1" : "both0", *theirs = mp->rank ? "both0" : "both1";
	struct tfab_stats s1, s2;
	struct done d = {0};
	DLManagedTensor *m = NULL;

	for (int i = 0; i < N; i++)
		vals[i] = (float)(i % 1000) + (float)mp->rank;
	CHECK_RC(tfab_recv_ahead(mp->ctx, mp->peers[other], theirs, DEPTH), 0);
	for (int step = 1; step <= STEPS; step++)
		CHECK_RC(tfab_send(mp->ctx, mine, step, &t, false, on_sent, &d), 0);
	for (int step = 1; step <= STEPS; step++) {
		CHECK_RC(recv_one(mp, other, theirs, step, &m, NULL), 0);
		CHECK(((float *)m->dl_tensor.data)[N - 1] == (float)((N - 1) % 1000 + other));
		m->deleter(m);
	}
	CHECK(wait_n(mp, &d, STEPS));
	CHECK(d.errors == 0);
	CHECK_RC(tfab_get_stats(mp->ctx, &s1), 0);
	CHECK(s1.requests_ahead >= DEPTH);
	/* rank 1 leaves first; rank 0 while its requests still stand there */
	if (mp->rank == 0)
		CHECK_RC(mp_wait_note(mp, 1, "left", 0), 0);
	CHECK_RC(tfab_peer_destroy(mp->peers[other]), 0);
	mp->peers[other] = NULL;
	CHECK_RC(tfab_get_stats(mp->ctx, &s2), 0);
	if (s2.peers_cut != s1.peers_cut) {
		fprintf(stderr, "rank %d: the peer was cut as both left with requests standing\n",
			mp->rank);
		return 1;
	}
	if (mp->rank == 1) {
		CHECK_RC(mp_note(mp, "left"), 0);
		CHECK_RC(mp_wait_note(mp, 0, "left0", 0), 0);
	} else {
		CHECK_RC(mp_note(mp, "left0"), 0);
	}
	return 0;
}

/*
 * A send the receiver reported taken (TAKEN) is delivered, even where the receiver fails or
 * leaves before the write's own completion is read: rank 1 takes rank 0's 1 MiB tensor and
 * leaves (its TAKEN, then a LEAVE: rank 0 has a request standing there), while rank 0 does not
 * poll; on shm rank 0 then reads both before its write's completion (shm reads completions
 * after what arrived, a few polls later), and the send must end delivered, not with the
 * peer's failure (it did: "0 receives and 1 sends with it fail").
 */
int sc_taken_then_left(struct mp *mp)
{
	enum { N = 1 << 18 }; /* 1 MiB: written, not injected, so it has a completion */
	static float vals[N];
	int64_t shape = N;
	DLTensor t = float_vector(vals, &shape);
	struct done d = {0}, never = {0};

	if (mp->rank == 0) {
		struct tfab_stats st = {0};
		struct mp_watch w;

		for (int i = 0; i < N; i++)
			vals[i] = (float)(i % 977);
		/* a request standing at rank 1, so that rank 1 leaves with a LEAVE */
		CHECK_RC(tfab_recv(mp->ctx, mp->peers[1], "never", 1, NULL, on_recv, &never), 0);
		CHECK_RC(tfab_send(mp->ctx, "taken", 1, &t, false, on_sent, &d), 0);
		mp_watch_start(&w, mp, NULL, "the content write", 0);
		while (st.writes_content == 0) {
			tfab_progress(mp->ctx);
			CHECK_RC(tfab_get_stats(mp->ctx, &st), 0);
			CHECK(!mp_watch_stalled(&w, st.writes_content));
		}
		/*
		 * shm placed the bytes as the write was posted, and the target's polls take them;
		 * elsewhere they move only while this side polls (sockets, tcp), and its
		 * completion is then most often read first: the scenario checks that order too.
		 */
		if (strcmp(tfab_peer_path(mp->peers[1]), "shm") != 0)
			CHECK_RC(mp_wait_note(mp, 1, "received", 0), 0);
		CHECK_RC(mp_note(mp, "written"), 0);
		/* not polling: rank 1's TAKEN and LEAVE wait, unread, with the completion */
		CHECK_RC(mp_wait_note_quiet(mp, 1, "left", 0), 0);
		CHECK(wait_n(mp, &d, 1));
		CHECK_RC(d.last_status, 0);
		CHECK(wait_n(mp, &never, 1)); /* failed with the peer that left */
		CHECK(never.errors == 1);
		CHECK_RC(mp_note(mp, "checked"), 0);
		return 0;
	}
	CHECK_RC(tfab_recv(mp->ctx, mp->peers[0], "taken", 1, NULL, on_recv, &d), 0);
	CHECK(wait_n(mp, &d, 1));
	CHECK_RC(mp_note(mp, "received"), 0);
	CHECK_RC(d.last_status, 0);
	CHECK(d.tensor && ((float *)d.tensor->dl_tensor.data)[N - 1] == (float)((N - 1) % 977));
	d.tensor->deleter(d.tensor);
	CHECK_RC(mp_wait_note(mp, 0, "written", 0), 0); /* rank 0's request is read by now */
	CHECK_RC(tfab_peer_destroy(mp->peers[0]), 0);
	mp->peers[0] = NULL;
	CHECK_RC(mp_note(mp, "left"), 0);
	CHECK_RC(mp_wait_note_quiet(mp, 0, "checked", 0), 0);
	return 0;
}

/*
 * This process destroys its peer object for a process that has just asked it for a tensor,
 * and that then leaves; this process goes on polling. Its request, the first write it made to
 * us and still unread, must be dropped quietly (on shm it carries a connection request for a
 * region that is gone by the time it is read).
 */
int sc_peer_forgotten(struct mp *mp)
{
	struct tfab_context *ctx;
	struct tfab_peer *peer;
	struct done d = {0};
	unsigned port;

	CHECK_RC(tfab_context_create(&ctx), 0);
	if (mp->rank == 0) {
		uint16_t p16;

		CHECK_RC(tfab_listen(ctx, "127.0.0.1", 0, &p16), 0);
		CHECK_RC(mp_put(mp, "pf_port", p16), 0);
		CHECK_RC(tfab_accept(ctx, 20000, &peer), 0);
		CHECK_RC(tfab_recv(ctx, peer, "wanted", 1, NULL, on_recv, &d), 0);
		tfab_progress(ctx);
		CHECK_RC(mp_note(mp, "asked"), 0);
		CHECK_RC(mp_wait_note(mp, 1, "forgot", 20000), 0);
		CHECK_RC(tfab_context_destroy(ctx), 0);
		CHECK_RC(mp_note(mp, "left"), 0);
		return 0;
	}
	CHECK_RC(mp_get(mp, 0, "pf_port", &port), 0);
	CHECK_RC(tfab_connect(ctx, "127.0.0.1", (uint16_t)port, 20000, &peer), 0);
	/* Not polling ctx meanwhile: the request stays unread in the fabric. */
	CHECK_RC(mp_wait_note(mp, 0, "asked", 20000), 0);
	CHECK_RC(tfab_peer_destroy(peer), 0);
	CHECK_RC(mp_note(mp, "forgot"), 0);
	CHECK_RC(mp_wait_note(mp, 0, "left", 20000), 0);
	for (int i = 0; i < 1000; i++)
		CHECK(tfab_progress(ctx) >= 0);
	CHECK_RC(tfab_context_destroy(ctx), 0);
	return 0;
}
