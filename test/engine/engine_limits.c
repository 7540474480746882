/*
 * Engine scenarios: what a context lets a peer do, each on contexts of its own. A peer with
 * the wrong key is refused at connect (TFAB_AUTH_KEY). An operation that stalls fails at its
 * deadline (TFAB_OP_TIMEOUT_MS). The requests to one peer hold a bounded number of bytes
 * (TFAB_PEER_MAX_INFLIGHT).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/handshake.h"
#include "util/sock.h"
#include "util/time.h"
#include "engine_scenarios.h"
#include "engine_test.h"

/* A context created with TFAB_AUTH_KEY (key, or NULL) or TFAB_AUTH_KEY_FILE (file). */
static int auth_context(const char *key, const char *file, struct tfab_context **ctx_p)
{
	int rc;

	if (key)
		setenv("TFAB_AUTH_KEY", key, 1);
	if (file)
		setenv("TFAB_AUTH_KEY_FILE", file, 1);
	rc = tfab_context_create(ctx_p);
	unsetenv("TFAB_AUTH_KEY");
	unsetenv("TFAB_AUTH_KEY_FILE");
	return rc;
}

/* The handshakes to ctx's port: how many were refused so far, and how many are in hand. */
static void accepts_seen(struct tfab_context *ctx, uint64_t *refused_p, unsigned *live_p)
{
	pthread_mutex_lock(&ctx->accept_lock);
	*refused_p = ctx->accepts->refused;
	*live_p = ctx->accepts->n;
	pthread_mutex_unlock(&ctx->accept_lock);
}

/*
 * A stranger on the port of a context with a key: it says hello as a tfab peer would, then
 * sends a proof it made up. It must get the acceptor's hello (a nonce), then a refusal, and
 * nothing else: no blob.
 */
static int auth_stranger(struct mp *mp, unsigned port)
{
	uint8_t msg[TFAB_PEER_BLOB_MAX], hello[38] = {'T', 'F', 'A', 'U', 1, 'C'};
	uint8_t proof[36] = {'T', 'F', 'A', 'P'};
	uint32_t len;
	int fd;

	for (unsigned i = 6; i < sizeof(hello); i++)
		hello[i] = (uint8_t)(i * 37);
	CHECK_RC(tfab__sock_connect("127.0.0.1", (uint16_t)port, WAIT_MS, &fd), 0);
	CHECK_RC(tfab__sock_send_msg(fd, hello, sizeof(hello), WAIT_MS), 0);
	CHECK_RC(tfab__sock_recv_msg(fd, msg, sizeof(msg), &len, WAIT_MS), 0);
	CHECK(len == sizeof(hello) && memcmp(msg, "TFAU", 4) == 0 && msg[5] == 'A');
	CHECK_RC(tfab__sock_send_msg(fd, proof, sizeof(proof), WAIT_MS), 0);
	CHECK_RC(tfab__sock_recv_msg(fd, msg, sizeof(msg), &len, WAIT_MS), 0);
	CHECK(len == 4 && memcmp(msg, "TFAR", 4) == 0);
	/* and then the connection closes */
	CHECK(tfab__sock_recv_msg(fd, msg, sizeof(msg), &len, WAIT_MS) != 0);
	close(fd);
	return 0;
}

/*
 * Authenticated peers (TFAB_AUTH_KEY, doc/security.md), on contexts of its own on the
 * variant's path; rank 1 connects to rank 0 in rounds:
 * 0. the same key on both sides (rank 1's from TFAB_AUTH_KEY_FILE): connected, a tensor
 *    fetched;
 * 1. rank 1 with another key, 2. rank 1 with none, 3. rank 0 with none and rank 1 with a
 *    key: rank 1's connect fails with TFAB_ERR_AUTH, and rank 0 refuses it (counted) and goes
 *    on waiting for a peer that holds the key: its accept gives none;
 * 4. rank 1 as a stranger (auth_stranger) is refused, and the same call to tfab_accept then
 *    accepts rank 1 with the key and serves it a tensor.
 * A key shorter than 16 bytes, or both settings at once, fail the context with
 * TFAB_ERR_CONFIG.
 */
int sc_auth_refused(struct mp *mp)
{
	static const char good[] = "0123456789abcdef-shared", bad[] = "0123456789abcdef-other";
	static const char *const rank0[] = {good, good, good, NULL, good};
	static const char from_file[] = "(TFAB_AUTH_KEY_FILE)";
	static const char *const rank1[] = {from_file, bad, NULL, good, good};
	char file[] = "/tmp/tfab-auth-XXXXXX", what[32];
	struct tfab_context *ctx;
	struct tfab_peer *peer;
	int fd;

	CHECK_RC(auth_context("short", NULL, &ctx), -TFAB_ERR_CONFIG);
	setenv("TFAB_AUTH_KEY_FILE", "/nonexistent/key", 1);
	CHECK_RC(auth_context(good, NULL, &ctx), -TFAB_ERR_CONFIG);
	fd = mkstemp(file);
	CHECK(fd >= 0);
	CHECK(write(fd, good, strlen(good)) == (ssize_t)strlen(good) && write(fd, "\n", 1) == 1);
	close(fd);
	for (int round = 0; round < 5; round++) {
		bool ok = round == 0 || round == 4;
		unsigned port;
		int rc;

		snprintf(what, sizeof(what), "au_port%d", round);
		if (mp->rank == 0) {
			uint16_t p16;

			CHECK_RC(auth_context(rank0[round], NULL, &ctx), 0);
			CHECK_RC(tfab_listen(ctx, "127.0.0.1", 0, &p16), 0);
			CHECK_RC(mp_put(mp, what, p16), 0);
			if (!ok) {
				uint64_t end = tfab__now_ms() + (uint64_t)WAIT_MS;
				unsigned live;
				uint64_t refused;

				/* until rank 1 is refused and its connection closed: no peer */
				do {
					CHECK_RC(tfab_accept(ctx, 100, &peer), -ETIMEDOUT);
					accepts_seen(ctx, &refused, &live);
				} while ((!refused || live) && tfab__now_ms() < end);
				CHECK(refused == 1 && live == 0);
				snprintf(what, sizeof(what), "au_refused%d", round);
				CHECK_RC(mp_wait_note_quiet(mp, 1, what, 0), 0);
			} else {
				unsigned live;
				uint64_t refused;

				/* round 4: rank 1 is the stranger first, refused within this call */
				rc = tfab_accept(ctx, WAIT_MS, &peer);
				if (rc)
					fprintf(stderr, "rank 0: round %d: accept gave %s\n", round,
						tfab_strerror(rc));
				CHECK_RC(rc, 0);
				accepts_seen(ctx, &refused, &live);
				CHECK(refused == (round == 4));
			}
			if (ok) {
				DLManagedTensor *m = NULL;

				CHECK_RC(tfab_recv_sync(ctx, peer, "auth/t", round, NULL, WAIT_MS,
							&m, NULL),
					 0);
				CHECK(m && bytes_match(m->dl_tensor.data, 128, 70 + round));
				m->deleter(m);
				snprintf(what, sizeof(what), "au_sent%d", round);
				CHECK_RC(progress_until_note(mp, ctx, what), 0);
				snprintf(what, sizeof(what), "au%d", round);
				CHECK(own_pair_end(mp, ctx, peer, what) == 0);
			} else {
				CHECK_RC(tfab_context_destroy(ctx), 0);
			}
			continue;
		}
		if (rank1[round] == from_file)
			CHECK_RC(auth_context(NULL, file, &ctx), 0);
		else
			CHECK_RC(auth_context(rank1[round], NULL, &ctx), 0);
		CHECK_RC(mp_get(mp, 0, what, &port), 0);
		if (round == 4)
			CHECK(auth_stranger(mp, port) == 0);
		rc = tfab_connect(ctx, "127.0.0.1", (uint16_t)port, WAIT_MS, &peer);
		if (rc != (ok ? 0 : -TFAB_ERR_AUTH))
			fprintf(stderr, "rank 1: round %d: connect gave %s\n", round,
				tfab_strerror(rc));
		CHECK_RC(rc, ok ? 0 : -TFAB_ERR_AUTH);
		if (!ok) {
			snprintf(what, sizeof(what), "au_refused%d", round);
			CHECK_RC(mp_note(mp, what), 0);
		}
		if (ok) {
			CHECK(send_one(mp, ctx, "auth/t", round, 70 + (uint64_t)round) == 0);
			snprintf(what, sizeof(what), "au_sent%d", round);
			CHECK_RC(mp_note(mp, what), 0);
			snprintf(what, sizeof(what), "au%d", round);
			CHECK(own_pair_end(mp, ctx, peer, what) == 0);
		} else {
			CHECK_RC(tfab_context_destroy(ctx), 0);
		}
	}
	unlink(file);
	CHECK(mp_barrier(mp, 90) == 0);
	return 0;
}

/*
 * The stall deadline (TFAB_OP_TIMEOUT_MS, 300 here), on contexts of its own:
 * - rank 0's receive of a tensor rank 1 never sends fails with TFAB_ERR_TIMEOUT, not before
 *   the deadline; a blocking receive keeps its own timeout (-ETIMEDOUT);
 * - rank 1's send of step 3 of "v" lands on a request rank 0 posted ahead (no-request mode)
 *   that no receive takes for longer than the deadline: the send fails with
 *   TFAB_ERR_TIMEOUT. Rank 0's receive of it later still gets the tensor;
 * - the peer itself is not failed: a tensor sent after all this arrives.
 */
int sc_op_timeout(struct mp *mp)
{
	enum { LIMIT_MS = 300 };
	struct tfab_context *ctx;
	struct tfab_peer *peer;
	DLManagedTensor *m = NULL;
	struct done d = {0};
	uint64_t t0;
	unsigned port;

	CHECK_RC(context_with(&ctx, (const char *const[]){"TFAB_OP_TIMEOUT_MS", "300", NULL}), 0);
	if (mp->rank == 0) {
		uint16_t p16;

		CHECK_RC(tfab_listen(ctx, "127.0.0.1", 0, &p16), 0);
		CHECK_RC(mp_put(mp, "ot_port", p16), 0);
		CHECK_RC(tfab_accept(ctx, WAIT_MS, &peer), 0);
		CHECK_RC(tfab_recv_ahead(ctx, peer, "v", 2), 0);
		for (int step = 1; step <= 2; step++) {
			CHECK_RC(tfab_recv_sync(ctx, peer, "v", step, NULL, WAIT_MS, &m, NULL), 0);
			CHECK(bytes_match(m->dl_tensor.data, 128, 80 + (uint64_t)step));
			m->deleter(m);
		}
		t0 = ms_now();
		CHECK_RC(tfab_recv(ctx, peer, "never", 1, NULL, on_recv, &d), 0);
		CHECK_RC(tfab_recv_sync(ctx, peer, "never/sync", 1, NULL, LIMIT_MS * 2, &m, NULL),
			 -ETIMEDOUT);
		CHECK(wait_ctx(mp, ctx, &d, 1));
		if (d.last_status != -TFAB_ERR_TIMEOUT)
			fprintf(stderr, "rank 0: the receive ended with %s\n",
				tfab_strerror(d.last_status));
		CHECK(d.errors == 1 && d.last_status == -TFAB_ERR_TIMEOUT);
		CHECK(ms_now() - t0 >= LIMIT_MS);
		CHECK_RC(progress_until_note(mp, ctx, "ot_v3"), 0);
		CHECK_RC(tfab_recv_sync(ctx, peer, "v", 3, NULL, WAIT_MS, &m, NULL), 0);
		CHECK(bytes_match(m->dl_tensor.data, 128, 83));
		m->deleter(m);
		CHECK_RC(tfab_recv_sync(ctx, peer, "after", 4, NULL, WAIT_MS, &m, NULL), 0);
		CHECK(bytes_match(m->dl_tensor.data, 128, 84));
		m->deleter(m);
		CHECK_RC(progress_until_note(mp, ctx, "ot_sent"), 0);
		CHECK(own_pair_end(mp, ctx, peer, "ot") == 0);
		CHECK(mp_barrier(mp, 91) == 0);
		return 0;
	}
	CHECK_RC(mp_get(mp, 0, "ot_port", &port), 0);
	CHECK_RC(tfab_connect(ctx, "127.0.0.1", (uint16_t)port, WAIT_MS, &peer), 0);
	for (int step = 1; step <= 2; step++)
		CHECK(send_one(mp, ctx, "v", step, 80 + (uint64_t)step) == 0);
	{
		int64_t shape[1] = {32};
		struct tensor t;

		tensor_make(&t, f32, 1, shape);
		tensor_fill(&t, 83);
		CHECK_RC(tfab_send(ctx, "v", 3, &t.dl, false, on_sent, &d), 0);
		CHECK(wait_ctx(mp, ctx, &d, 1));
		if (d.last_status != -TFAB_ERR_TIMEOUT)
			fprintf(stderr, "rank 1: the send ended with %s\n",
				tfab_strerror(d.last_status));
		CHECK(d.errors == 1 && d.last_status == -TFAB_ERR_TIMEOUT);
		tensor_free(&t);
	}
	CHECK_RC(mp_note(mp, "ot_v3"), 0);
	CHECK(send_one(mp, ctx, "after", 4, 84) == 0);
	CHECK_RC(mp_note(mp, "ot_sent"), 0);
	CHECK(own_pair_end(mp, ctx, peer, "ot") == 0);
	CHECK(mp_barrier(mp, 91) == 0);
	return 0;
}

/*
 * What the requests to one peer may hold (TFAB_PEER_MAX_INFLIGHT, 1 MiB on rank 0, the
 * receiver, with no-request mode off), on contexts of its own:
 * - a 2 MiB tensor, its size learned from the sender's meta-data: the receive fails with
 *   EMSGSIZE, and the send stays offered; a receive into the caller's 2 MiB tensor (not
 *   counted) then takes it;
 * - 600 KiB tensors: one receive pending holds 600 KiB, so a second posted beside it fails
 *   at once with EMSGSIZE; once the first is done (its tensor the application's), the next
 *   receive is taken.
 * Every tensor checked.
 */
int sc_peer_max_inflight(struct mp *mp)
{
	enum { BIG = 2 << 20, MID = 600 << 10 };
	static const DLDataType u8 = {kDLUInt, 8, 1};
	struct tfab_context *ctx;
	struct tfab_peer *peer;
	unsigned port;

	/* no progress thread: a receive completes only in our calls, not between two posts */
	CHECK_RC(
	    context_with(&ctx, (const char *const[]){"TFAB_NO_REQUEST", "0", "TFAB_PROGRESS_THREAD",
						     "0", "TFAB_PEER_MAX_INFLIGHT",
						     mp->rank == 0 ? "1M" : NULL, NULL}),
	    0);
	if (mp->rank == 0) {
		int64_t shape[1] = {BIG};
		DLManagedTensor *m = NULL;
		struct done d = {0}, d2 = {0};
		struct tensor t;
		uint16_t p16;

		CHECK_RC(tfab_listen(ctx, "127.0.0.1", 0, &p16), 0);
		CHECK_RC(mp_put(mp, "pm_port", p16), 0);
		CHECK_RC(tfab_accept(ctx, WAIT_MS, &peer), 0);
		CHECK_RC(tfab_recv(ctx, peer, "big", 1, NULL, on_recv, &d), 0);
		CHECK(wait_ctx(mp, ctx, &d, 1));
		CHECK(d.errors == 1 && d.last_status == -EMSGSIZE);
		tensor_make(&t, u8, 1, shape);
		CHECK_RC(tfab_recv_into_sync(ctx, peer, "big", 1, &t.dl, 0, WAIT_MS, NULL, NULL),
			 0);
		CHECK(bytes_match(t.buf, BIG, 90));
		tensor_free(&t);
		CHECK_RC(tfab_recv_sync(ctx, peer, "mid", 1, NULL, WAIT_MS, &m, NULL), 0);
		CHECK(bytes_match(m->dl_tensor.data, MID, 91));
		m->deleter(m);
		d.n = d.errors = 0;
		CHECK_RC(tfab_recv(ctx, peer, "mid", 2, NULL, on_recv, &d), 0);
		CHECK_RC(tfab_recv(ctx, peer, "mid", 3, NULL, on_recv, &d2), -EMSGSIZE);
		CHECK(wait_ctx(mp, ctx, &d, 1));
		CHECK(d.errors == 0 && bytes_match(d.tensor->dl_tensor.data, MID, 92));
		CHECK_RC(tfab_recv_sync(ctx, peer, "mid", 3, NULL, WAIT_MS, &m, NULL), 0);
		CHECK(bytes_match(m->dl_tensor.data, MID, 93));
		m->deleter(m);
		d.tensor->deleter(d.tensor);
		CHECK(peer->inflight == 0); /* every destination the application's, or released */
		CHECK_RC(progress_until_note(mp, ctx, "pm_sent"), 0);
	} else {
		int64_t big[1] = {BIG}, mid[1] = {MID};
		struct tensor t[4];
		struct done d = {0};

		CHECK_RC(mp_get(mp, 0, "pm_port", &port), 0);
		CHECK_RC(tfab_connect(ctx, "127.0.0.1", (uint16_t)port, WAIT_MS, &peer), 0);
		tensor_make(&t[0], u8, 1, big);
		tensor_fill(&t[0], 90);
		CHECK_RC(tfab_send(ctx, "big", 1, &t[0].dl, false, on_sent, &d), 0);
		for (int i = 1; i < 4; i++) {
			tensor_make(&t[i], u8, 1, mid);
			tensor_fill(&t[i], 90 + (uint64_t)i);
			CHECK_RC(tfab_send(ctx, "mid", i, &t[i].dl, false, on_sent, &d), 0);
		}
		CHECK(wait_ctx(mp, ctx, &d, 4));
		CHECK(d.errors == 0);
		for (int i = 0; i < 4; i++)
			tensor_free(&t[i]);
		CHECK_RC(mp_note(mp, "pm_sent"), 0);
	}
	CHECK(own_pair_end(mp, ctx, peer, "pm") == 0);
	CHECK(mp_barrier(mp, 92) == 0);
	return 0;
}
