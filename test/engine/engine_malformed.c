/*
 * Engine scenarios: malformed control messages, and well-formed ones that lie, written raw
 * into a peer's inbox. The receiver fails that peer with TFAB_ERR_PROTOCOL and keeps working
 * with its other peer.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine_scenarios.h"
#include "engine_test.h"

/* Write raw bytes into the peer's inbox slot as a control message, bypassing the codec. */
static int inject_raw(struct mp *mp, struct tfab_peer *peer, const uint8_t *bytes, size_t len,
		      uint32_t slot)
{
	struct tfab_context *ctx = mp->ctx;
	uint8_t *buf = aligned_alloc(4096, 4096);
	struct tfab_mr *mr = NULL;
	bool idle = false;
	int rc;

	memcpy(buf, bytes, len);
	tfab__ctx_lock(ctx); /* registrations are serialised with the progress thread's */
	rc = tfab_mr_reg(peer->conn->ep, buf, 4096, TFAB_MR_LOCAL_WRITE, &mr);
	if (rc == 0)
		rc = tfab_conn_write_imm(
		    peer->conn, buf, len, mr, peer->remote_raddr + slot * peer->remote_slot_size,
		    peer->remote_rkey, tfab__imm_msg(peer->remote_id, slot), 0, &peer->credit_w);
	/* The engine accounts the completion like a credit write's: wait for it. */
	if (rc == 0)
		peer->users++;
	tfab__ctx_unlock(ctx);
	/*
	 * Until nothing is in flight to the peer: other writes (a TAKEN of the barrier) may
	 * complete around this one, so no count short of zero says that this one has.
	 */
	for (uint64_t until = ms_now() + WAIT_MS; rc == 0 && !idle && ms_now() < until;) {
		tfab_progress(ctx);
		tfab__ctx_lock(ctx);
		idle = peer->users == 0;
		tfab__ctx_unlock(ctx);
		if (!idle)
			usleep(100);
	}
	tfab__ctx_lock(ctx);
	if (mr)
		tfab_mr_dereg(mr);
	tfab__ctx_unlock(ctx);
	free(buf);
	return rc ? rc : idle ? 0 : -ETIMEDOUT;
}

/*
 * Malformed control messages (a bad header, an unknown type, a truncated request, an
 * out-of-window sequence), and well-formed ones that lie (a request by a key index never
 * announced, the RETIRE of one): the receiving side fails that peer with TFAB_ERR_PROTOCOL, its
 * operations with that peer fail, and it keeps working with its other peer.
 */
static int malformed(struct mp *mp, int k)
{
	static const uint8_t garbage[4][16] = {
	    {9, 1, 0, 0, 0, 0, 0, 0},	    /* version 9 */
	    {1, 77, 0, 0, 4, 0, 0, 0},	    /* unknown type 77 */
	    {1, 1, 0, 0, 200, 0, 0, 0},	    /* a request claiming 200 bytes, holding none */
	    {1, 4, 0, 0, 4, 0, 0, 0, 9, 9}, /* a cancel, sequence 2313 (out of the window) */
	};
	int victim_of = 0;
	struct done d = {0};

	/* rank 1 sends one bad message to rank 0, once per run of this scenario */
	if (mp->rank == 1 && k >= 4) {
		/*
		 * Well formed, in its place in the sequence, and lying: a request naming a key
		 * index that rank 0 never announced (k 4), a RETIRE of one (k 5).
		 */
		struct tfab_peer *peer = mp->peers[0];
		struct tfab_wire_msg m = {.type = TFAB_MSG_TENSOR_REQUEST,
					  .flags = TFAB_MSGF_KEY_INDEX,
					  .req_index = 7,
					  .step_id = 1,
					  .key_index = 4242};
		uint8_t buf[128];
		size_t len = 0;
		uint32_t slot;

		if (k == 5)
			m = (struct tfab_wire_msg){
			    .type = TFAB_MSG_RETIRE, .req_index = 4242, .ntaken = 1};
		/* k 6: a collective's operand where no world was joined */
		if (k == 6)
			m = (struct tfab_wire_msg){.type = TFAB_MSG_COLL_DATA,
						   .step_id = INT64_MIN,
						   .coll_tag = 'd',
						   .data_len = 4,
						   .data = (const uint8_t *)"1234"};
		CHECK(mp_barrier(mp, 90) == 0);
		tfab__ctx_lock(mp->ctx);
		m.seq = peer->tx_seq++;
		slot = m.seq % peer->remote_slots;
		tfab__ctx_unlock(mp->ctx);
		CHECK_RC(tfab__wire_msg_encode(&m, buf, sizeof(buf), &len), 0);
		CHECK_RC(inject_raw(mp, peer, buf, len, slot), 0);
	} else if (mp->rank == 1) {
		CHECK(mp_barrier(mp, 90) == 0);
		CHECK_RC(inject_raw(mp, mp->peers[0], garbage[k & 3], 16, 0), 0);
	}
	if (mp->rank == 1) {
		/*
		 * Stay until rank 0 has dealt with it and gone: this receive then fails (or is
		 * refused at once, if rank 0 was already gone).
		 */
		int rc = tfab_recv(mp->ctx, mp->peers[0], "never", 1, NULL, on_recv, &d);

		CHECK(rc == 0 || rc == -TFAB_ERR_PEER_FAILED);
		if (rc == 0) {
			CHECK(wait_n(mp, &d, 1));
			CHECK(d.errors == 1);
		}
		return 0;
	}
	if (mp->rank == 2)
		CHECK(mp_barrier(mp, 90) == 0);
	if (mp->rank == 0) {
		CHECK_RC(tfab_recv(mp->ctx, mp->peers[1], "from/evil", 1, NULL, on_recv, &d), 0);
		CHECK(mp_barrier(mp, 90) == 0);
		CHECK(wait_n(mp, &d, 1));
		CHECK(d.errors == 1 && d.last_status == -TFAB_ERR_PROTOCOL);
		victim_of = 1;
	}
	/* ranks 0 and 2 still talk */
	if (mp->rank != 1) {
		int64_t shape[1] = {64};
		struct tensor t;
		struct done s = {0}, r = {0};
		int other = mp->rank == 0 ? 2 : 0;

		tensor_make(&t, f32, 1, shape);
		tensor_fill(&t, 77);
		CHECK_RC(
		    tfab_send(mp->ctx, mp->rank == 0 ? "a" : "b", 1, &t.dl, false, on_sent, &s), 0);
		CHECK_RC(tfab_recv(mp->ctx, mp->peers[other], mp->rank == 0 ? "b" : "a", 1, NULL,
				   on_recv, &r),
			 0);
		CHECK(wait_n(mp, &r, 1) && wait_n(mp, &s, 1));
		CHECK(r.errors == 0 && s.errors == 0);
		CHECK(bytes_match(r.tensor->dl_tensor.data, t.nbytes, 77));
		r.tensor->deleter(r.tensor);
		tensor_free(&t);
	}
	(void)victim_of;
	return 0;
}

int sc_malformed_version(struct mp *mp)
{
	return malformed(mp, 0);
}

int sc_malformed_type(struct mp *mp)
{
	return malformed(mp, 1);
}

int sc_malformed_truncated(struct mp *mp)
{
	return malformed(mp, 2);
}

int sc_malformed_sequence(struct mp *mp)
{
	return malformed(mp, 3);
}

int sc_forged_key_index(struct mp *mp)
{
	return malformed(mp, 4);
}

int sc_forged_retire(struct mp *mp)
{
	return malformed(mp, 5);
}

int sc_forged_coll_data(struct mp *mp)
{
	return malformed(mp, 6);
}
