/*
 * verbs: connection setup. The endpoint blob names a UD queue pair; connect() creates an RC
 * queue pair and sends a request (REQ) to it; the peer's poll() creates the matching passive
 * queue pair, brings it to RTS and answers (REP); our poll() then brings ours to RTS. Requests
 * are sent again with back-off until answered or TFAB_CONNECT_TIMEOUT_MS passes. The same
 * exchange, with the next generation number, re-establishes a connection after a write failed
 * by its own fault (bad key, out of range), which moves both queue pairs to the error state.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tfab/status.h>

#include "providers/verbs/verbs.h"
#include "util/log.h"
#include "util/time.h"

#define TFAB_VERBS_MAGIC 0x54465642u /* "TFVB" */
#define TFAB_VERBS_VERSION 1
#define TFAB_VERBS_DRAIN_MS 2000
#define TFAB_VERBS_BACKOFF_MS 50
#define TFAB_VERBS_BACKOFF_MAX_MS 1000
#define UD_RX_SLOT (TFAB_VERBS_GRH + TFAB_VERBS_CM_LEN)

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

static void put32(uint8_t *p, uint32_t v)
{
	put16(p, (uint16_t)(v >> 16));
	put16(p + 2, (uint16_t)v);
}

static void put64(uint8_t *p, uint64_t v)
{
	put32(p, (uint32_t)(v >> 32));
	put32(p + 4, (uint32_t)v);
}

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)get16(p) << 16 | get16(p + 2);
}

static uint64_t get64(const uint8_t *p)
{
	return (uint64_t)get32(p) << 32 | get32(p + 4);
}

/*
 * The blob: magic, version, link layer, port, MTU (0..7), LID, 2 spare bytes, UD queue pair
 * number, endpoint id, GID: 40 bytes, big-endian.
 */
void tfab_verbs_addr_encode(const struct tfab_verbs_addr *a, uint8_t *buf)
{
	memset(buf, 0, TFAB_VERBS_ADDR_LEN);
	put32(buf, TFAB_VERBS_MAGIC);
	buf[4] = TFAB_VERBS_VERSION;
	buf[5] = a->link_layer;
	buf[6] = a->port;
	buf[7] = a->mtu;
	put16(buf + 8, a->lid);
	put32(buf + 12, a->ud_qpn);
	put64(buf + 16, a->ep_id);
	memcpy(buf + 24, a->gid.raw, 16);
}

int tfab_verbs_addr_decode(const uint8_t *buf, size_t len, struct tfab_verbs_addr *a)
{
	if (len != TFAB_VERBS_ADDR_LEN || get32(buf) != TFAB_VERBS_MAGIC)
		return -EINVAL;
	if (buf[4] != TFAB_VERBS_VERSION)
		return -TFAB_ERR_VERSION;
	if (buf[7] < IBV_MTU_256 || buf[7] > IBV_MTU_4096)
		return -EINVAL;
	a->link_layer = buf[5];
	a->port = buf[6];
	a->mtu = buf[7];
	a->lid = get16(buf + 8);
	a->ud_qpn = get32(buf + 12) & 0xffffff;
	a->ep_id = get64(buf + 16);
	memcpy(a->gid.raw, buf + 24, 16);
	return 0;
}

/*
 * A datagram: magic, version, type, MTU, spare, source and destination endpoints, connection
 * id, generation, queue pair, PSN, UD queue pair, LID, 2 spare bytes, GID, longest work
 * request; 68 bytes, big-endian.
 */
void tfab_verbs_cm_encode(const struct tfab_verbs_cm *m, uint8_t *buf)
{
	memset(buf, 0, TFAB_VERBS_CM_LEN);
	put32(buf, TFAB_VERBS_MAGIC);
	buf[4] = TFAB_VERBS_VERSION;
	buf[5] = m->type;
	buf[6] = m->mtu;
	put64(buf + 8, m->src_ep);
	put64(buf + 16, m->dst_ep);
	put32(buf + 24, m->conn_id);
	put32(buf + 28, m->gen);
	put32(buf + 32, m->qpn);
	put32(buf + 36, m->psn);
	put32(buf + 40, m->ud_qpn);
	put16(buf + 44, m->lid);
	memcpy(buf + 48, m->gid.raw, 16);
	put32(buf + 64, m->wr_max);
}

int tfab_verbs_cm_parse(const uint8_t *buf, size_t len, struct tfab_verbs_cm *m)
{
	const uint8_t *p = buf + TFAB_VERBS_GRH;

	if (len < TFAB_VERBS_GRH + TFAB_VERBS_CM_LEN || get32(p) != TFAB_VERBS_MAGIC)
		return -EINVAL;
	if (p[4] != TFAB_VERBS_VERSION)
		return -TFAB_ERR_VERSION;
	if (p[5] < TFAB_VERBS_CM_REQ || p[5] > TFAB_VERBS_CM_DISC || p[6] < IBV_MTU_256 ||
	    p[6] > IBV_MTU_4096 || get32(p + 64) == 0)
		return -EINVAL;
	m->type = p[5];
	m->mtu = p[6];
	m->src_ep = get64(p + 8);
	m->dst_ep = get64(p + 16);
	m->conn_id = get32(p + 24);
	m->gen = get32(p + 28);
	m->qpn = get32(p + 32) & 0xffffff;
	m->psn = get32(p + 36) & 0xffffff;
	m->ud_qpn = get32(p + 40) & 0xffffff;
	m->lid = get16(p + 44);
	memcpy(m->gid.raw, p + 48, 16);
	m->wr_max = get32(p + 64);
	return 0;
}

static uint32_t new_psn(struct tfab_verbs_ep *ep)
{
	/* xorshift, seeded at random: PSNs differ between connections and runs. */
	ep->rand ^= ep->rand << 13;
	ep->rand ^= ep->rand >> 7;
	ep->rand ^= ep->rand << 17;
	return (uint32_t)(ep->rand >> 20) & 0xffffff;
}

static void fill_ah_attr(const struct tfab_verbs_ep *ep, struct ibv_ah_attr *ah,
			 const union ibv_gid *gid, uint16_t lid)
{
	memset(ah, 0, sizeof(*ah));
	ah->dlid = lid;
	ah->port_num = ep->port.port;
	/* RoCE always routes by GID; InfiniBand needs a GRH only without a LID. */
	if (ep->port.link_layer == IBV_LINK_LAYER_ETHERNET || lid == 0) {
		ah->is_global = 1;
		ah->grh.dgid = *gid;
		ah->grh.sgid_index = (uint8_t)ep->port.gid_index;
		ah->grh.hop_limit = 64;
	}
}

int tfab_verbs_ah_get(struct tfab_verbs_ep *ep, const union ibv_gid *gid, uint16_t lid,
		      struct ibv_ah **ah_p)
{
	struct tfab_verbs_ah *a;
	struct ibv_ah_attr attr;
	struct tfab_list *l;

	for (l = ep->ahs.next; l != &ep->ahs; l = l->next) {
		a = tfab_container_of(l, struct tfab_verbs_ah, link);
		if (a->lid == lid && memcmp(&a->gid, gid, sizeof(*gid)) == 0) {
			*ah_p = a->ah;
			return 0;
		}
	}
	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	fill_ah_attr(ep, &attr, gid, lid);
	a->ah = ibv_create_ah(ep->pd, &attr);
	if (!a->ah) {
		char g[64];
		int rc = tfab_verbs_errno(errno);

		tfab_verbs_gid_str(gid, g, sizeof(g));
		TFAB_ERROR(SUBSYS, "ibv_create_ah to %s (lid %u): %s", g, lid, tfab_strerror(rc));
		free(a);
		return rc;
	}
	a->gid = *gid;
	a->lid = lid;
	tfab__list_add_tail(&ep->ahs, &a->link);
	*ah_p = a->ah;
	return 0;
}

int tfab_verbs_qp_create(struct tfab_verbs_ep *ep, unsigned send_wr, unsigned inline_size,
			 struct ibv_qp **qp_p, unsigned *inline_p)
{
	struct ibv_qp_init_attr a;
	struct ibv_qp *qp;

	memset(&a, 0, sizeof(a));
	a.send_cq = ep->cq;
	a.recv_cq = ep->cq;
	a.srq = ep->srq;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = 0;
	a.cap.max_send_wr = send_wr;
	a.cap.max_send_sge = 1;
	a.cap.max_inline_data = inline_size;
	qp = ibv_create_qp(ep->pd, &a);
	if (!qp)
		return tfab_verbs_errno(errno);
	if (inline_p)
		*inline_p = a.cap.max_inline_data;
	*qp_p = qp;
	return 0;
}

int tfab_verbs_qp_init(struct tfab_verbs_ep *ep, struct ibv_qp *qp)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = ep->port.port;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	return tfab_verbs_rc(ibv_modify_qp(
	    qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
}

/* INIT to RTR to RTS, towards the remote queue pair rqpn that starts at rpsn. */
static int qp_connect(struct tfab_verbs_ep *ep, struct ibv_qp *qp, uint32_t psn, uint32_t rqpn,
		      uint32_t rpsn, uint8_t rmtu, const union ibv_gid *gid, uint16_t lid)
{
	struct ibv_qp_attr a;
	int rc;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = (enum ibv_mtu)(rmtu < ep->port.mtu ? rmtu : ep->port.mtu);
	a.dest_qp_num = rqpn;
	a.rq_psn = rpsn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12; /* 0.64 ms */
	fill_ah_attr(ep, &a.ah_attr, gid, lid);
	rc = ibv_modify_qp(qp, &a,
			   IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (rc) {
		TFAB_ERROR(SUBSYS, "queue pair %u to RTR: %s", qp->qp_num, strerror(rc));
		return tfab_verbs_rc(rc);
	}
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = ep->timeout;
	a.retry_cnt = ep->retry_cnt;
	a.rnr_retry = ep->rnr_retry;
	a.sq_psn = psn;
	a.max_rd_atomic = 1;
	rc = ibv_modify_qp(qp, &a,
			   IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			       IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	if (rc) {
		TFAB_ERROR(SUBSYS, "queue pair %u to RTS: %s", qp->qp_num, strerror(rc));
		return tfab_verbs_rc(rc);
	}
	return 0;
}

static int qp_to(struct ibv_qp *qp, enum ibv_qp_state state)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = state;
	return tfab_verbs_rc(ibv_modify_qp(qp, &a, IBV_QP_STATE));
}

/* The UD queue pair. */

static uint8_t *ud_tx_buf(struct tfab_verbs_ep *ep, unsigned slot)
{
	return ep->ud_buf + TFAB_VERBS_UD_RX * UD_RX_SLOT + slot * TFAB_VERBS_CM_LEN;
}

int tfab_verbs_ud_post_recv(struct tfab_verbs_ep *ep, unsigned slot)
{
	struct ibv_sge sge = {
	    .addr = (uintptr_t)(ep->ud_buf + slot * UD_RX_SLOT),
	    .length = UD_RX_SLOT,
	    .lkey = ep->ud_mr->lkey,
	};
	struct ibv_recv_wr wr = {
	    .wr_id = (uint64_t)slot << 3 | TFAB_VERBS_TAG_UD_RECV,
	    .sg_list = &sge,
	    .num_sge = 1,
	};
	struct ibv_recv_wr *bad;
	int rc = ibv_post_recv(ep->ud_qp, &wr, &bad);

	if (rc)
		TFAB_ERROR(SUBSYS, "ibv_post_recv on the UD queue pair: %s", strerror(rc));
	return tfab_verbs_rc(rc);
}

int tfab_verbs_ud_open(struct tfab_verbs_ep *ep)
{
	size_t len = TFAB_VERBS_UD_RX * UD_RX_SLOT + TFAB_VERBS_UD_TX * TFAB_VERBS_CM_LEN;
	struct ibv_qp_init_attr init;
	struct ibv_qp_attr a;
	int rc;

	if (posix_memalign((void **)&ep->ud_buf, 4096, len))
		return -ENOMEM;
	memset(ep->ud_buf, 0, len);
	ep->ud_mr = ibv_reg_mr(ep->pd, ep->ud_buf, len, IBV_ACCESS_LOCAL_WRITE);
	if (!ep->ud_mr) {
		rc = tfab_verbs_errno(errno);
		TFAB_ERROR(SUBSYS, "registering the connection buffers: %s", tfab_strerror(rc));
		return rc;
	}
	memset(&init, 0, sizeof(init));
	init.send_cq = ep->cq;
	init.recv_cq = ep->cq;
	init.qp_type = IBV_QPT_UD;
	init.sq_sig_all = 1;
	init.cap.max_send_wr = TFAB_VERBS_UD_TX;
	init.cap.max_recv_wr = TFAB_VERBS_UD_RX;
	init.cap.max_send_sge = 1;
	init.cap.max_recv_sge = 1;
	ep->ud_qp = ibv_create_qp(ep->pd, &init);
	if (!ep->ud_qp) {
		rc = tfab_verbs_errno(errno);
		TFAB_ERROR(SUBSYS, "creating the UD queue pair: %s", tfab_strerror(rc));
		return rc;
	}
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = ep->port.port;
	a.qkey = TFAB_VERBS_QKEY;
	rc = ibv_modify_qp(ep->ud_qp, &a,
			   IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
	if (!rc) {
		a.qp_state = IBV_QPS_RTR;
		rc = ibv_modify_qp(ep->ud_qp, &a, IBV_QP_STATE);
	}
	if (!rc) {
		a.qp_state = IBV_QPS_RTS;
		a.sq_psn = 0;
		rc = ibv_modify_qp(ep->ud_qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	}
	if (rc) {
		TFAB_ERROR(SUBSYS, "bringing the UD queue pair up: %s", strerror(rc));
		return tfab_verbs_rc(rc);
	}
	for (unsigned i = 0; i < TFAB_VERBS_UD_RX; i++) {
		rc = tfab_verbs_ud_post_recv(ep, i);
		if (rc)
			return rc;
	}
	return 0;
}

void tfab_verbs_ud_close(struct tfab_verbs_ep *ep)
{
	if (ep->ud_qp)
		ibv_destroy_qp(ep->ud_qp);
	if (ep->ud_mr)
		ibv_dereg_mr(ep->ud_mr);
	free(ep->ud_buf);
	ep->ud_qp = NULL;
	ep->ud_mr = NULL;
	ep->ud_buf = NULL;
}

/* Send a datagram; -EAGAIN when every send buffer is busy (the requester sends again). */
static int cm_send(struct tfab_verbs_ep *ep, struct ibv_ah *ah, uint32_t ud_qpn,
		   const struct tfab_verbs_cm *m)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;
	unsigned slot;
	int rc;

	for (slot = 0; slot < TFAB_VERBS_UD_TX && ep->ud_tx_busy[slot]; slot++)
		;
	if (slot == TFAB_VERBS_UD_TX)
		return -EAGAIN;
	tfab_verbs_cm_encode(m, ud_tx_buf(ep, slot));
	sge.addr = (uintptr_t)ud_tx_buf(ep, slot);
	sge.length = TFAB_VERBS_CM_LEN;
	sge.lkey = ep->ud_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uint64_t)slot << 3 | TFAB_VERBS_TAG_UD_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = ud_qpn;
	wr.wr.ud.remote_qkey = TFAB_VERBS_QKEY;
	rc = ibv_post_send(ep->ud_qp, &wr, &bad);
	if (rc) {
		TFAB_WARN(SUBSYS, "sending a connection datagram: %s", strerror(rc));
		return tfab_verbs_rc(rc);
	}
	ep->ud_tx_busy[slot] = true;
	return 0;
}

/* A datagram from this endpoint, its own part filled in. */
static void cm_mine(const struct tfab_verbs_ep *ep, struct tfab_verbs_cm *m, uint8_t type)
{
	memset(m, 0, sizeof(*m));
	m->type = type;
	m->src_ep = ep->ep_id;
	m->mtu = ep->port.mtu;
	m->lid = ep->port.lid;
	m->ud_qpn = ep->ud_qp->qp_num;
	m->gid = ep->port.gid;
	m->wr_max = ep->wr_max;
}

static void send_req(struct tfab_verbs_conn *conn, uint8_t type)
{
	struct tfab_verbs_ep *ep = conn->ep;
	struct tfab_verbs_cm m;

	cm_mine(ep, &m, type);
	m.dst_ep = conn->remote.ep_id;
	m.conn_id = conn->id;
	m.gen = conn->gen;
	m.qpn = conn->qp->qp_num;
	m.psn = conn->psn;
	cm_send(ep, conn->ah, conn->remote.ud_qpn, &m);
}

static void set_timed(struct tfab_verbs_conn *conn, bool on)
{
	if (conn->timed == on)
		return;
	conn->timed = on;
	if (on)
		conn->ep->ntimed++;
	else
		conn->ep->ntimed--;
}

/* Connection states. */

int tfab_verbs_conn_start(struct tfab_verbs_ep *ep, struct tfab_verbs_conn *conn)
{
	uint64_t now = tfab__now_ms();

	conn->state = TFAB_VERBS_CONNECTING;
	conn->gen++;
	conn->psn = new_psn(ep);
	conn->deadline_ms = now + ep->connect_timeout_ms;
	conn->backoff_ms = TFAB_VERBS_BACKOFF_MS;
	conn->next_tx_ms = now + conn->backoff_ms;
	set_timed(conn, true);
	send_req(conn, TFAB_VERBS_CM_REQ);
	return 0;
}

/* Writes kept for posting again get their ERROR events instead (injected ones just go). */
static void drop_backlog(struct tfab_verbs_conn *conn, int status, const char *why)
{
	for (unsigned i = 0; i < conn->nretry; i++)
		tfab_verbs_defer_error(conn->ep, conn->retry[i], status, why);
	conn->nretry = 0;
}

void tfab_verbs_conn_fail(struct tfab_verbs_conn *conn, int status, const char *why)
{
	if (conn->state == TFAB_VERBS_FAILED)
		return;
	TFAB_WARN(SUBSYS, "connection %u (queue pair %u) to endpoint %016llx failed: %s", conn->id,
		  conn->qp->qp_num, (unsigned long long)conn->remote.ep_id, why);
	conn->state = TFAB_VERBS_FAILED;
	conn->failed = status;
	if (!conn->zombie)
		set_timed(conn, false);
	drop_backlog(conn, status, why);
}

/*
 * Post a marker: a signalled write to a queue pair in the error state, flushed at once. Its
 * completion comes after every earlier work request's, so the ring is empty once it is reaped.
 */
static int post_marker(struct tfab_verbs_conn *conn)
{
	struct tfab_verbs_op *op = tfab_verbs_op_get(conn->ep);
	int rc;

	if (!op)
		return -ENOMEM;
	op->kind = TFAB_VERBS_OP_MARKER;
	op->conn = conn;
	rc = tfab_verbs_post(conn, op);
	if (rc)
		tfab_verbs_op_put(conn->ep, op);
	return rc;
}

void tfab_verbs_conn_drain(struct tfab_verbs_conn *conn)
{
	conn->state = TFAB_VERBS_DRAINING;
	conn->retry_ins = 0;
	conn->deadline_ms = tfab__now_ms() + TFAB_VERBS_DRAIN_MS;
	set_timed(conn, true);
	/* The failed work request has put it in the error state; make sure of it. */
	tfab_verbs_conn_flush(conn);
}

void tfab_verbs_conn_flush(struct tfab_verbs_conn *conn)
{
	if (qp_to(conn->qp, IBV_QPS_ERR) == 0 && conn->nops)
		post_marker(conn);
}

/* After a completion of conn's took work requests off its ring. */
void tfab_verbs_conn_after_retire(struct tfab_verbs_conn *conn)
{
	if (conn->nops)
		return;
	if (conn->zombie) {
		tfab_verbs_conn_destroy(conn);
		return;
	}
	if (conn->state != TFAB_VERBS_DRAINING)
		return;
	/* Everything after the failed write is back in the backlog: start again. */
	if (qp_to(conn->qp, IBV_QPS_RESET) || tfab_verbs_qp_init(conn->ep, conn->qp)) {
		tfab_verbs_conn_fail(conn, -TFAB_ERR_FABRIC, "resetting its queue pair failed");
		return;
	}
	TFAB_INFO(SUBSYS, "connection %u: re-establishing after a failed write (%u to post again)",
		  conn->id, conn->nretry);
	tfab_verbs_conn_start(conn->ep, conn);
}

void tfab_verbs_conn_destroy(struct tfab_verbs_conn *conn)
{
	struct tfab_verbs_ep *ep = conn->ep;

	/* Completions that may still come for what is left are dropped. */
	for (unsigned i = 0; i < conn->nops; i++)
		conn->ring[(conn->head + i) % conn->cap]->conn = NULL;
	ep->sq_total -= conn->count;
	drop_backlog(conn, -ECANCELED, "connection closed");
	if (conn->qp)
		ibv_destroy_qp(conn->qp);
	set_timed(conn, false);
	tfab__list_del(&conn->link);
	free(conn->ring);
	free(conn->retry);
	free(conn);
}

void tfab_verbs_conn_close(struct tfab_verbs_conn *conn)
{
	struct tfab_verbs_ep *ep = conn->ep;

	ep->nconns--;
	conn->zombie = true;
	if (conn->gen)
		send_req(conn, TFAB_VERBS_CM_DISC); /* best effort: frees the peer's end */
	drop_backlog(conn, -ECANCELED, "connection closed");
	if (conn->nops == 0 || qp_to(conn->qp, IBV_QPS_ERR) || post_marker(conn)) {
		tfab_verbs_conn_destroy(conn);
		return;
	}
	conn->deadline_ms = tfab__now_ms() + TFAB_VERBS_DRAIN_MS;
	set_timed(conn, true);
}

void tfab_verbs_passive_destroy(struct tfab_verbs_passive *p)
{
	if (p->qp)
		ibv_destroy_qp(p->qp);
	tfab__list_del(&p->link);
	free(p);
}

/* Datagrams in. */

static struct tfab_verbs_passive *passive_find(struct tfab_verbs_ep *ep, uint64_t remote_ep,
					       uint32_t conn_id)
{
	for (struct tfab_list *l = ep->passives.next; l != &ep->passives; l = l->next) {
		struct tfab_verbs_passive *p =
		    tfab_container_of(l, struct tfab_verbs_passive, link);

		if (p->remote_ep == remote_ep && p->conn_id == conn_id)
			return p;
	}
	return NULL;
}

static struct tfab_verbs_conn *conn_find(struct tfab_verbs_ep *ep, uint32_t id)
{
	for (struct tfab_list *l = ep->conns.next; l != &ep->conns; l = l->next) {
		struct tfab_verbs_conn *c = tfab_container_of(l, struct tfab_verbs_conn, link);

		if (c->id == id && !c->zombie)
			return c;
	}
	return NULL;
}

static void answer(struct tfab_verbs_ep *ep, const struct tfab_verbs_cm *req, uint8_t type,
		   const struct tfab_verbs_passive *p)
{
	struct tfab_verbs_cm m;
	struct ibv_ah *ah;

	if (tfab_verbs_ah_get(ep, &req->gid, req->lid, &ah))
		return;
	cm_mine(ep, &m, type);
	m.dst_ep = req->src_ep;
	m.conn_id = req->conn_id;
	m.gen = req->gen;
	if (p) {
		m.qpn = p->qp->qp_num;
		m.psn = p->psn;
	}
	cm_send(ep, ah, req->ud_qpn, &m);
}

static void on_req(struct tfab_verbs_ep *ep, const struct tfab_verbs_cm *m)
{
	struct tfab_verbs_passive *p = passive_find(ep, m->src_ep, m->conn_id);
	int rc;

	if (p && p->gen == m->gen) {
		answer(ep, m, TFAB_VERBS_CM_REP, p); /* our answer was lost */
		return;
	}
	if (p && p->gen > m->gen)
		return; /* a stale request */
	if (m->wr_max < ep->len_exact_below)
		ep->len_exact_below = m->wr_max;
	if (p)
		tfab_verbs_passive_destroy(p); /* the requester starts over */
	p = calloc(1, sizeof(*p));
	if (!p) {
		answer(ep, m, TFAB_VERBS_CM_REJ, NULL);
		return;
	}
	p->remote_ep = m->src_ep;
	p->conn_id = m->conn_id;
	p->gen = m->gen;
	p->psn = new_psn(ep);
	tfab__list_add_tail(&ep->passives, &p->link);
	/* It only receives: one send slot, nothing inline. */
	rc = tfab_verbs_qp_create(ep, 1, 0, &p->qp, NULL);
	if (rc)
		TFAB_ERROR(SUBSYS, "creating a queue pair for a peer: %s", tfab_strerror(rc));
	if (rc == 0)
		rc = tfab_verbs_qp_init(ep, p->qp);
	if (rc == 0)
		rc = qp_connect(ep, p->qp, p->psn, m->qpn, m->psn, m->mtu, &m->gid, m->lid);
	if (rc) {
		tfab_verbs_passive_destroy(p);
		answer(ep, m, TFAB_VERBS_CM_REJ, NULL);
		return;
	}
	TFAB_DEBUG(SUBSYS, "queue pair %u answers endpoint %016llx's connection %u (qp %u)",
		   p->qp->qp_num, (unsigned long long)m->src_ep, m->conn_id, m->qpn);
	answer(ep, m, TFAB_VERBS_CM_REP, p);
}

static void on_rep(struct tfab_verbs_ep *ep, const struct tfab_verbs_cm *m)
{
	struct tfab_verbs_conn *conn = conn_find(ep, m->conn_id);

	if (!conn || conn->state != TFAB_VERBS_CONNECTING || conn->gen != m->gen ||
	    conn->remote.ep_id != m->src_ep)
		return; /* a duplicate, or for a connection since closed */
	if (m->type == TFAB_VERBS_CM_REJ) {
		tfab_verbs_conn_fail(conn, -TFAB_ERR_PEER_FAILED,
				     "the peer refused it (no resources there)");
		return;
	}
	if (qp_connect(ep, conn->qp, conn->psn, m->qpn, m->psn, m->mtu, &conn->remote.gid,
		       conn->remote.lid)) {
		tfab_verbs_conn_fail(conn, -TFAB_ERR_FABRIC, "its queue pair cannot be connected");
		return;
	}
	TFAB_DEBUG(SUBSYS, "connection %u: queue pair %u to %u ready", conn->id, conn->qp->qp_num,
		   m->qpn);
	conn->state = TFAB_VERBS_READY;
	conn->unsignalled = 0;
	set_timed(conn, false);
	if (conn->nretry)
		tfab_verbs_post_backlog(conn);
}

void tfab_verbs_cm_on_recv(struct tfab_verbs_ep *ep, unsigned slot, uint32_t len)
{
	struct tfab_verbs_cm m;
	struct tfab_verbs_passive *p;
	/* The device's length, never past the slot it landed in. */
	int rc = tfab_verbs_cm_parse(ep->ud_buf + slot * UD_RX_SLOT,
				     len < UD_RX_SLOT ? len : UD_RX_SLOT, &m);

	if (rc) {
		TFAB_DEBUG(SUBSYS, "a connection datagram of %u bytes is not one of ours: %s", len,
			   tfab_strerror(rc));
		return;
	}
	if (m.dst_ep != ep->ep_id)
		return; /* for an endpoint that was here before */
	switch (m.type) {
	case TFAB_VERBS_CM_REQ:
		on_req(ep, &m);
		break;
	case TFAB_VERBS_CM_REP:
	case TFAB_VERBS_CM_REJ:
		on_rep(ep, &m);
		break;
	case TFAB_VERBS_CM_DISC:
		p = passive_find(ep, m.src_ep, m.conn_id);
		if (p)
			tfab_verbs_passive_destroy(p);
		break;
	default:
		break;
	}
}

void tfab_verbs_timers(struct tfab_verbs_ep *ep, uint64_t now)
{
	struct tfab_list *l, *t;

	tfab_list_for_each_safe(l, t, &ep->conns)
	{
		struct tfab_verbs_conn *c = tfab_container_of(l, struct tfab_verbs_conn, link);

		if (!c->timed)
			continue;
		if (c->zombie) {
			if (now >= c->deadline_ms)
				tfab_verbs_conn_destroy(c);
		} else if (c->state == TFAB_VERBS_CONNECTING) {
			if (now >= c->deadline_ms) {
				tfab_verbs_conn_fail(c, -TFAB_ERR_PEER_FAILED,
						     "no answer from the peer's endpoint within "
						     "TFAB_CONNECT_TIMEOUT_MS");
			} else if (now >= c->next_tx_ms) {
				send_req(c, TFAB_VERBS_CM_REQ);
				c->backoff_ms = c->backoff_ms * 2 > TFAB_VERBS_BACKOFF_MAX_MS
						    ? TFAB_VERBS_BACKOFF_MAX_MS
						    : c->backoff_ms * 2;
				c->next_tx_ms = now + c->backoff_ms;
			}
		} else if (c->state == TFAB_VERBS_DRAINING && now >= c->deadline_ms) {
			tfab_verbs_conn_fail(c, -TFAB_ERR_FABRIC,
					     "its flushed work requests did not come back");
		}
	}
}
