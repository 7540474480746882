/*
 * Engine scenario: a peer that speaks the protocol wrongly on purpose. The victim fails the
 * liar alone, counts each refusal, and serves its honest peer untouched.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine/engine.h"
#include "engine_scenarios.h"
#include "engine_test.h"

/*
 * A peer that lies: on contexts of its own, rank 0's victim context serves
 * an honest peer (rank 2) and, round after round, a fresh liar connection from rank 1, which
 * speaks the protocol wrongly on purpose through the engine's internals: a zero-byte write
 * into the victim's inbox whose immediate names no request (LIE_NONE), the honest peer's
 * request (LIE_OTHERS), a stale generation of its own (LIE_STALE), a control write naming the
 * honest peer's id (LIE_CTRL_ID), credits never given (LIE_CREDITS), and META_DATA answering
 * one request again and again (LIE_STORM). The victim fails the liar alone, with
 * TFAB_ERR_PROTOCOL, and counts each refusal (stats.refused); the honest peer's receive, into
 * a caller's tensor holding a sentinel, is neither completed nor touched by the lie, and then
 * gets the honest peer's tensor intact. Where the victim's path cannot tell a write's source
 * (caps.src_unknown: libfabric's rxm), an immediate is taken at its word: a content write
 * naming no request or a stale one is counted and dropped, and the lies that only a source
 * can expose (another peer's request or id) are not told (doc/security.md). Last, connection
 * blobs of the wrong length are refused and counted.
 */
enum lie { LIE_NONE, LIE_OTHERS, LIE_STALE, LIE_CTRL_ID, LIE_CREDITS, LIE_STORM, LIE_N };

static const char *const lie_names[LIE_N] = {"no request",	    "another peer's request",
					     "stale generation",    "control naming another id",
					     "credits never given", "META_DATA storm"};

/* Drive ctx until rank has noted what; -ETIMEDOUT once the stall bound passed. */
static int liar_wait_note(struct mp *mp, struct tfab_context *ctx, int rank, const char *what)
{
	uint64_t until = ms_now() + (uint64_t)WAIT_MS;

	while (mp_wait_note_quiet(mp, rank, what, 1) != 0) {
		if (ms_now() > until)
			return -ETIMEDOUT;
		for (int k = 0; k < 100; k++)
			tfab_progress(ctx);
	}
	return 0;
}

/* A zero-byte write with imm into the peer's inbox, as the engine's credit returns go. */
static int liar_write(struct mp *mp, struct tfab_context *ctx, struct tfab_peer *peer, uint32_t imm)
{
	uint64_t until = ms_now() + WAIT_MS;
	bool idle = false;
	int rc;

	do { /* -EAGAIN: the fabric's queue is full for now (tcp, libfabric's shm) */
		tfab_progress(ctx);
		tfab__ctx_lock(ctx);
		rc = tfab_conn_write_imm(peer->conn, peer->outbox, 0, peer->outbox_mr,
					 peer->remote_raddr, peer->remote_rkey, imm, 0,
					 &peer->credit_w);
		if (rc == 0)
			peer->users++;
		tfab__ctx_unlock(ctx);
	} while (rc == -EAGAIN && ms_now() < until);
	while (rc == 0 && !idle && ms_now() < until) {
		tfab_progress(ctx);
		tfab__ctx_lock(ctx);
		idle = peer->users == 0;
		tfab__ctx_unlock(ctx);
	}
	(void)mp;
	return rc ? rc : idle ? 0 : -ETIMEDOUT;
}

/* The index of the request the newest receive from peer posted. */
static uint32_t newest_request(struct tfab_context *ctx, struct tfab_peer *peer)
{
	uint32_t index;

	tfab__ctx_lock(ctx);
	index = tfab_container_of(peer->requests.prev, struct tfab_request, link)->index;
	tfab__ctx_unlock(ctx);
	return index;
}

static uint64_t refused_count(struct tfab_context *ctx)
{
	struct tfab_stats st;

	return tfab_get_stats(ctx, &st) == 0 ? st.refused : 0;
}

/* Whether the victim can tell the liar's lie apart (the source of a write is known). */
static bool lie_told(enum lie k, bool src_unknown)
{
	return !src_unknown || (k != LIE_OTHERS && k != LIE_CTRL_ID);
}

/* Whether telling the lie fails the liar (else it is counted and dropped). */
static bool lie_fails(enum lie k, bool src_unknown)
{
	return !src_unknown || k == LIE_CREDITS || k == LIE_STORM;
}

static int liar_victim(struct mp *mp, struct tfab_context *ctx)
{
	int64_t shape[1] = {32};
	struct tfab_peer *honest, *liar;
	char note[32];
	uint16_t port;

	CHECK_RC(tfab_listen(ctx, "127.0.0.1", 0, &port), 0);
	CHECK_RC(mp_put(mp, "liar_port", port), 0);
	CHECK_RC(tfab_accept(ctx, WAIT_MS, &honest), 0);
	CHECK_RC(mp_put(mp, "liar_honest_id", honest->id), 0);
	for (int k = 0; k < LIE_N; k++) {
		struct done never = {0}, storm = {0}, old = {0}, h = {0};
		struct tensor t;
		bool src_unknown;
		uint64_t before;

		CHECK_RC(tfab_accept(ctx, WAIT_MS, &liar), 0);
		src_unknown = liar->path->caps->src_unknown;
		/* the honest peer's receive, into a sentinel, waiting for its send */
		tensor_make(&t, f32, 1, shape);
		memset(t.buf, 0xa5, t.nbytes);
		CHECK_RC(tfab_recv(ctx, honest, "honest", k, &t.dl, on_recv, &h), 0);
		CHECK_RC(mp_put(mp, "liar_honest_req", newest_request(ctx, honest)), 0);
		if (k == LIE_STALE) {
			CHECK_RC(tfab_recv(ctx, liar, "old", 1, NULL, on_recv, &old), 0);
			CHECK_RC(mp_put(mp, "liar_stale_req", newest_request(ctx, liar)), 0);
			CHECK(wait_ctx(mp, ctx, &old, 1));
			CHECK(old.errors == 0);
			old.tensor->deleter(old.tensor);
		}
		if (k == LIE_STORM) {
			CHECK_RC(tfab_recv(ctx, liar, "storm", 1, NULL, on_recv, &storm), 0);
			CHECK_RC(mp_put(mp, "liar_storm_req", newest_request(ctx, liar)), 0);
		}
		CHECK_RC(tfab_recv(ctx, liar, "never", 1, NULL, on_recv, &never), 0);
		before = refused_count(ctx);
		snprintf(note, sizeof(note), "liar_ready_%d", k);
		CHECK_RC(mp_note(mp, note), 0);
		snprintf(note, sizeof(note), "liar_sent_%d", k);
		CHECK_RC(liar_wait_note(mp, ctx, 1, note), 0);
		if (lie_fails(k, src_unknown) && lie_told(k, src_unknown)) {
			CHECK(wait_ctx(mp, ctx, &never, 1));
			CHECK_RC(never.last_status, -TFAB_ERR_PROTOCOL);
			CHECK_RC(liar->failed, -TFAB_ERR_PROTOCOL);
			if (k == LIE_STORM) {
				CHECK(wait_ctx(mp, ctx, &storm, 1));
				CHECK_RC(storm.last_status, -TFAB_ERR_PROTOCOL);
			}
		} else if (lie_told(k, src_unknown)) {
			struct mp_watch w;

			mp_watch_start(&w, mp, ctx, "a refusal", 0);
			while (refused_count(ctx) == before && !mp_watch_stalled(&w, 0))
				tfab_progress(ctx);
			CHECK(liar->failed == 0);
		}
		if (lie_told(k, src_unknown))
			CHECK(refused_count(ctx) - before == 1);
		fprintf(stderr, "rank 0: lie %d (%s) %s%s\n", k, lie_names[k],
			lie_told(k, src_unknown) ? "refused" : "not told (source unknown)",
			lie_fails(k, src_unknown) ? ", the liar failed" : "");
		/* the honest receive: neither completed nor touched, and then served */
		for (int i = 0; i < 100; i++)
			tfab_progress(ctx);
		CHECK(done_n(&h) == 0 && honest->failed == 0);
		for (size_t i = 0; i < t.nbytes; i++)
			CHECK(t.buf[i] == 0xa5);
		/*
		 * The honest content lands once its peer, told through a file, sends it: with a
		 * progress thread, ThreadSanitizer sees that this read came first only through the
		 * context's lock, which a progress call takes (a race report without it, once).
		 */
		tfab_progress(ctx);
		snprintf(note, sizeof(note), "liar_seen_%d", k);
		CHECK_RC(mp_note(mp, note), 0);
		CHECK(wait_ctx(mp, ctx, &h, 1));
		CHECK(h.errors == 0 && bytes_match(t.buf, t.nbytes, 500 + (uint64_t)k));
		h.tensor->deleter(h.tensor);
		tensor_free(&t);
		snprintf(note, sizeof(note), "liar_left_%d", k);
		CHECK_RC(liar_wait_note(mp, ctx, 1, note), 0);
		CHECK_RC(tfab_peer_destroy(liar), 0);
	}
	/* connection blobs of the wrong length: refused, counted */
	{
		uint8_t blob[TFAB_PEER_BLOB_MAX];
		size_t len = sizeof(blob);
		struct tfab_peer *p, *q;
		uint64_t before = refused_count(ctx);

		CHECK_RC(tfab_peer_create(ctx, &p), 0);
		CHECK_RC(tfab_peer_create(ctx, &q), 0);
		CHECK_RC(tfab_peer_blob(p, blob, &len), 0);
		CHECK_RC(tfab_peer_connect(q, blob, len - 1), -TFAB_ERR_PROTOCOL);
		CHECK_RC(tfab_peer_connect(q, blob, TFAB_WIRE_BLOB_HDR), -TFAB_ERR_PROTOCOL);
		blob[20] = 0xff; /* host_len past the end */
		blob[21] = 0xff;
		CHECK_RC(tfab_peer_connect(q, blob, len), -TFAB_ERR_PROTOCOL);
		CHECK(refused_count(ctx) - before == 3);
		CHECK_RC(tfab_peer_destroy(q), 0);
		CHECK_RC(tfab_peer_destroy(p), 0);
	}
	CHECK_RC(mp_note(mp, "liar_all"), 0);
	CHECK_RC(liar_wait_note(mp, ctx, 2, "liar_honest_left"), 0);
	CHECK_RC(tfab_peer_destroy(honest), 0);
	return 0;
}

static int liar_lies(struct mp *mp, unsigned port)
{
	unsigned honest_id, honest_req, req;
	char note[32];

	CHECK_RC(mp_get(mp, 0, "liar_honest_id", &honest_id), 0);
	for (int k = 0; k < LIE_N; k++) {
		struct tfab_context *ctx;
		struct tfab_peer *peer;
		struct done d = {0};
		struct tensor t;
		int64_t shape[1] = {4};
		uint32_t imm = 0;

		/* undriven between its calls (no progress thread): its own engine would fail
		 * the victim for answering the lies (the storm's re-requests) while it tells them */
		CHECK_RC(
		    context_with(&ctx, (const char *const[]){"TFAB_NO_REQUEST", "0",
							     "TFAB_PROGRESS_THREAD", "0", NULL}),
		    0);
		CHECK_RC(tfab_connect(ctx, "127.0.0.1", (uint16_t)port, WAIT_MS, &peer), 0);
		tensor_make(&t, f32, 1, shape);
		tensor_fill(&t, 9);
		/* honest first: the victim receives it before it is ready for the lie */
		if (k == LIE_STALE)
			CHECK_RC(tfab_send(ctx, "old", 1, &t.dl, false, on_sent, &d), 0);
		snprintf(note, sizeof(note), "liar_ready_%d", k);
		CHECK_RC(liar_wait_note(mp, ctx, 0, note), 0);
		CHECK_RC(mp_get(mp, 0, "liar_honest_req", &honest_req), 0);
		switch (k) {
		case LIE_NONE:
			imm = 0x7ffffffeu; /* the last slot, never handed out */
			break;
		case LIE_OTHERS:
			imm = honest_req;
			break;
		case LIE_STALE:
			CHECK_RC(mp_get(mp, 0, "liar_stale_req", &req), 0);
			CHECK(wait_ctx(mp, ctx, &d, 1));
			CHECK(d.errors == 0);
			imm = req; /* taken: its generation is gone */
			break;
		case LIE_CTRL_ID:
			imm = tfab__imm_msg(honest_id, 0);
			break;
		case LIE_CREDITS:
			imm = tfab__imm_credit(peer->remote_id, 500);
			break;
		case LIE_STORM: {
			struct tfab_wire_msg m = {.type = TFAB_MSG_META_DATA};

			CHECK_RC(mp_get(mp, 0, "liar_storm_req", &req), 0);
			m.req_index = req;
			m.meta = (struct tfab_wire_meta){.dtype_code = kDLFloat,
							 .dtype_bits = 32,
							 .dtype_lanes = 1,
							 .ndim = 1,
							 .nbytes = 16,
							 .shape = {4}};
			/* one past the cap, and no more: the victim fails this peer on that
			 * one, and a send after it may already find the peer failed (the
			 * progress thread reads the victim's end) */
			for (unsigned i = 0; i <= TFAB_MAX_META_REPLIES; i++) {
				int rc;

				tfab__ctx_lock(ctx);
				rc = tfab__peer_send_msg(peer, &m);
				tfab__ctx_unlock(ctx);
				CHECK_RC(rc, 0);
			}
			break;
		}
		}
		/* where the victim cannot expose it (both ends of a path alike), it is not told */
		if (k != LIE_STORM && lie_told(k, peer->path->caps->src_unknown))
			CHECK_RC(liar_write(mp, ctx, peer, imm), 0);
		snprintf(note, sizeof(note), "liar_sent_%d", k);
		CHECK_RC(mp_note(mp, note), 0);
		snprintf(note, sizeof(note), "liar_seen_%d", k);
		CHECK_RC(liar_wait_note(mp, ctx, 0, note), 0);
		CHECK_RC(tfab_peer_destroy(peer), 0);
		CHECK_RC(tfab_context_destroy(ctx), 0);
		tensor_free(&t);
		snprintf(note, sizeof(note), "liar_left_%d", k);
		CHECK_RC(mp_note(mp, note), 0);
	}
	return 0;
}

int sc_liar(struct mp *mp)
{
	struct tfab_context *ctx;
	unsigned port;

	if (mp->rank == 1) {
		CHECK_RC(mp_get(mp, 0, "liar_port", &port), 0);
		CHECK(liar_lies(mp, port) == 0);
		CHECK(mp_barrier(mp, 95) == 0);
		return 0;
	}
	CHECK_RC(context_with(&ctx, (const char *const[]){"TFAB_NO_REQUEST", "0", NULL}), 0);
	if (mp->rank == 0) {
		CHECK(liar_victim(mp, ctx) == 0);
	} else {
		struct tfab_peer *peer;

		CHECK_RC(mp_get(mp, 0, "liar_port", &port), 0);
		CHECK_RC(tfab_connect(ctx, "127.0.0.1", (uint16_t)port, WAIT_MS, &peer), 0);
		for (int k = 0; k < LIE_N; k++) {
			int64_t shape[1] = {32};
			struct tensor t;
			struct done d = {0};
			char note[32];

			snprintf(note, sizeof(note), "liar_seen_%d", k);
			CHECK_RC(liar_wait_note(mp, ctx, 0, note), 0);
			tensor_make(&t, f32, 1, shape);
			tensor_fill(&t, 500 + (uint64_t)k);
			CHECK_RC(tfab_send(ctx, "honest", k, &t.dl, false, on_sent, &d), 0);
			CHECK(wait_ctx(mp, ctx, &d, 1));
			CHECK(d.errors == 0);
			tensor_free(&t);
		}
		CHECK_RC(liar_wait_note(mp, ctx, 0, "liar_all"), 0);
		CHECK_RC(tfab_peer_destroy(peer), 0);
		CHECK_RC(mp_note(mp, "liar_honest_left"), 0);
	}
	CHECK_RC(tfab_context_destroy(ctx), 0);
	CHECK(mp_barrier(mp, 95) == 0);
	return 0;
}
