/*
 * The raw ibverbs backend: RC queue pairs, RDMA write with immediate for every write, one SRQ
 * of zero-length receives kept posted for the immediates, one CQ polled for everything.
 *
 * Signalling: a write the caller wants to hear about is signalled; an injected write
 * (TFAB_WRITE_INJECT, sent inline) is not, except every TFAB_VERBS_SIGNAL_EVERY-th and the one
 * that takes the last free slot, whose completion retires the unsignalled ones before it (an
 * RC queue pair completes in order). Every posted work request stays on its connection's ring
 * until retired, so a failure knows exactly which writes came after it.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <tfab/status.h>

#include "providers/verbs/verbs.h"
#include "util/config.h"
#include "util/log.h"
#include "util/time.h"

#define TFAB_VERBS_OP_CHUNK 64
#define TFAB_VERBS_SCAN_MS 2 /* how often connection timers are looked at, while any run */
#define TFAB_VERBS_CQ_SPARE 64

struct tfab_verbs_op *tfab_verbs_op_get(struct tfab_verbs_ep *ep)
{
	struct tfab_verbs_op *op = tfab__freelist_get(&ep->ops);

	if (!op)
		return NULL;
	op->next = NULL;
	op->conn = NULL;
	op->ctx = NULL;
	op->inject = false;
	op->nwr = 0;
	op->chunk_err = 0;
	op->status = 0;
	op->errmsg = NULL;
	op->lbuf = NULL;
	op->len = op->lkey = op->rkey = op->imm = 0;
	op->raddr = 0;
	return op;
}

void tfab_verbs_op_put(struct tfab_verbs_ep *ep, struct tfab_verbs_op *op)
{
	tfab__freelist_put(&ep->ops, op);
}

/* Queue an event for the next poll: WRITE_DONE (status 0) or ERROR. */
static void defer(struct tfab_verbs_ep *ep, struct tfab_verbs_op *op, int status,
		  const char *errmsg)
{
	op->status = status;
	op->errmsg = errmsg;
	op->conn = NULL;
	op->next = NULL;
	if (ep->deferred_tail)
		ep->deferred_tail->next = op;
	else
		ep->deferred = op;
	ep->deferred_tail = op;
}

void tfab_verbs_defer_error(struct tfab_verbs_ep *ep, struct tfab_verbs_op *op, int status,
			    const char *errmsg)
{
	if (op->inject || op->kind != TFAB_VERBS_OP_WRITE) {
		tfab_verbs_op_put(ep, op);
		return;
	}
	defer(ep, op, status, errmsg);
}

static int deliver_deferred(struct tfab_verbs_ep *ep, struct tfab_event *ev, int max)
{
	int n = 0;

	while (n < max && ep->deferred) {
		struct tfab_verbs_op *op = ep->deferred;

		ep->deferred = op->next;
		if (!ep->deferred)
			ep->deferred_tail = NULL;
		memset(&ev[n], 0, sizeof(ev[n]));
		ev[n].type = op->status ? TFAB_EV_ERROR : TFAB_EV_WRITE_DONE;
		ev[n].status = op->status;
		ev[n].ctx = op->ctx;
		ev[n].errmsg = op->errmsg;
		tfab_verbs_op_put(ep, op);
		n++;
	}
	return n;
}

/* Put a posted op on its connection's ring. */
static void ring_add(struct tfab_verbs_conn *conn, struct tfab_verbs_op *op, unsigned nwr)
{
	op->conn = conn;
	op->nwr = (uint16_t)nwr;
	conn->ring[(conn->head + conn->nops) % conn->cap] = op;
	conn->nops++;
	conn->count += nwr;
	conn->ep->sq_total += nwr;
}

int tfab_verbs_post(struct tfab_verbs_conn *conn, struct tfab_verbs_op *op)
{
	struct tfab_verbs_ep *ep = conn->ep;
	bool write = op->kind == TFAB_VERBS_OP_WRITE, signalled;
	unsigned nwr =
	    op->len > ep->wr_max ? (unsigned)((op->len + ep->wr_max - 1) / ep->wr_max) : 1;
	struct ibv_send_wr wr_small[8], *wr = wr_small, *bad;
	struct ibv_sge sge_small[8], *sge = sge_small;
	uint64_t off = 0;
	int rc;

	if (conn->count + nwr > conn->cap || (write && conn->count + nwr > ep->sq_depth) ||
	    (write && ep->sq_total + nwr > ep->sq_budget))
		return -EAGAIN;
	if (nwr > 8) {
		wr = calloc(nwr, sizeof(*wr));
		sge = calloc(nwr, sizeof(*sge));
		if (!wr || !sge) {
			rc = -ENOMEM;
			goto out;
		}
	}
	/*
	 * Signal what the caller waits for, and any write that fills the queue pair or the CQ
	 * budget: a completion must always be coming while a slot is held.
	 */
	signalled = !write || !op->inject || conn->unsignalled + 1 >= ep->signal_every ||
		    conn->count + nwr >= ep->sq_depth || ep->sq_total + nwr >= ep->sq_budget;
	/*
	 * A write longer than max_msg_sz goes in pieces, the immediate on the last: first the
	 * remainder, then full ones, so that a last piece shorter than max_msg_sz means the write
	 * was not split and the target may report its length.
	 */
	for (unsigned i = 0; i < nwr; i++) {
		uint32_t len =
		    i ? ep->wr_max : (uint32_t)(op->len - (uint64_t)(nwr - 1) * ep->wr_max);

		memset(&wr[i], 0, sizeof(wr[i]));
		wr[i].next = i + 1 < nwr ? &wr[i + 1] : NULL;
		wr[i].wr_id = (uintptr_t)op | (i + 1 < nwr ? TFAB_VERBS_TAG_CHUNK : 0);
		wr[i].opcode = !write	     ? IBV_WR_RDMA_WRITE
			       : i + 1 < nwr ? IBV_WR_RDMA_WRITE
					     : IBV_WR_RDMA_WRITE_WITH_IMM;
		if (len) {
			sge[i].addr = (uintptr_t)(op->inject ? op->data : op->lbuf) + off;
			sge[i].length = len;
			sge[i].lkey = op->lkey;
			wr[i].sg_list = &sge[i];
			wr[i].num_sge = 1;
			if (op->len <= ep->inline_size)
				wr[i].send_flags |= IBV_SEND_INLINE;
		}
		if (signalled && i + 1 == nwr)
			wr[i].send_flags |= IBV_SEND_SIGNALED;
		wr[i].imm_data = htonl(op->imm);
		wr[i].wr.rdma.remote_addr = op->raddr + off;
		wr[i].wr.rdma.rkey = op->rkey;
		off += len;
	}
	op->chunk_err = 0;
	rc = ibv_post_send(conn->qp, wr, &bad);
	if (rc && bad != wr) {
		/*
		 * Some pieces went and the rest did not (never seen: the slots are counted). The
		 * op stays on the ring and fails with the connection, whose queue pair is flushed.
		 */
		TFAB_ERROR(SUBSYS, "ibv_post_send took %u of %u pieces: %s", (unsigned)(bad - wr),
			   nwr, strerror(rc));
		op->chunk_err = IBV_WC_GENERAL_ERR;
		ring_add(conn, op, (unsigned)(bad - wr));
		tfab_verbs_conn_fail(conn, -TFAB_ERR_FABRIC, "a write was posted in part");
		tfab_verbs_conn_flush(conn);
		rc = 0;
		goto out;
	}
	if (rc) {
		rc = rc == ENOMEM ? -EAGAIN : tfab_verbs_rc(rc);
		goto out;
	}
	ring_add(conn, op, nwr);
	conn->unsignalled = signalled ? 0 : conn->unsignalled + 1;
out:
	if (wr != wr_small) {
		free(wr);
		free(sge);
	}
	return rc;
}

void tfab_verbs_post_backlog(struct tfab_verbs_conn *conn)
{
	unsigned done = 0;
	int rc = 0;

	while (done < conn->nretry) {
		rc = tfab_verbs_post(conn, conn->retry[done]);
		if (rc)
			break;
		done++;
	}
	memmove(conn->retry, conn->retry + done, (conn->nretry - done) * sizeof(*conn->retry));
	conn->nretry -= done;
	if (rc && rc != -EAGAIN) {
		TFAB_ERROR(SUBSYS, "posting a write again: %s", tfab_strerror(rc));
		tfab_verbs_conn_fail(conn, rc, "posting its writes again failed");
	} else if (conn->nretry) {
		conn->ep->backlog = true;
	}
}

/* Completions. */

static bool peer_lost(enum ibv_wc_status st)
{
	switch (st) {
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR:
	case IBV_WC_REM_ABORT_ERR:
	case IBV_WC_RESP_TIMEOUT_ERR:
	case IBV_WC_BAD_RESP_ERR:
	case IBV_WC_FATAL_ERR:
	case IBV_WC_GENERAL_ERR:
		return true;
	default:
		return false;
	}
}

static int wc_status(enum ibv_wc_status st)
{
	switch (st) {
	case IBV_WC_SUCCESS:
		return 0;
	case IBV_WC_REM_ACCESS_ERR:
	case IBV_WC_REM_INV_REQ_ERR:
		return -TFAB_ERR_REMOTE_ACCESS;
	case IBV_WC_REM_OP_ERR:
		return -TFAB_ERR_REMOTE;
	case IBV_WC_LOC_PROT_ERR:
	case IBV_WC_LOC_ACCESS_ERR:
		return -EFAULT;
	case IBV_WC_LOC_LEN_ERR:
		return -EMSGSIZE;
	case IBV_WC_WR_FLUSH_ERR:
		return -ECANCELED;
	default:
		return peer_lost(st) ? -TFAB_ERR_PEER_FAILED : -TFAB_ERR_FABRIC;
	}
}

/* Keep a flushed write to post again, after those flushed before it. */
static void retry_push(struct tfab_verbs_conn *conn, struct tfab_verbs_op *op)
{
	memmove(conn->retry + conn->retry_ins + 1, conn->retry + conn->retry_ins,
		(conn->nretry - conn->retry_ins) * sizeof(*conn->retry));
	conn->retry[conn->retry_ins++] = op;
	conn->nretry++;
}

/* A write that went before one whose completion came: done, or to be posted again. */
static void retire_quietly(struct tfab_verbs_conn *conn, struct tfab_verbs_op *op, bool ok)
{
	struct tfab_verbs_ep *ep = conn->ep;

	if (op->kind != TFAB_VERBS_OP_WRITE) {
		tfab_verbs_op_put(ep, op);
	} else if (!conn->zombie && conn->state == TFAB_VERBS_DRAINING) {
		retry_push(conn, op);
	} else if (op->inject) {
		tfab_verbs_op_put(ep, op);
	} else {
		/* Signalled writes complete on their own; this is only defensive. */
		defer(ep, op,
		      ok	     ? 0
		      : conn->failed ? conn->failed
				     : -ECANCELED,
		      ok ? NULL : "flushed");
	}
}

/* A completion on an RC send queue; returns the number of events written to out (0 or 1). */
static int on_send_wc(struct tfab_verbs_ep *ep, const struct ibv_wc *wc, struct tfab_event *out)
{
	struct tfab_verbs_op *op = (struct tfab_verbs_op *)(uintptr_t)wc->wr_id;
	struct tfab_verbs_conn *conn = op->conn;
	enum ibv_wc_status st = wc->status;
	int nev = 0, status;

	if (!conn) {
		tfab_verbs_op_put(ep, op); /* its queue pair is gone */
		return 0;
	}
	/* A leading piece that failed makes the whole write's failure. */
	if (st == IBV_WC_WR_FLUSH_ERR && op->chunk_err)
		st = (enum ibv_wc_status)op->chunk_err;
	/* Retire everything posted before it: unsignalled writes. */
	while (conn->nops) {
		struct tfab_verbs_op *e = conn->ring[conn->head];

		conn->head = (conn->head + 1) % conn->cap;
		conn->nops--;
		conn->count -= e->nwr;
		ep->sq_total -= e->nwr;
		if (e == op)
			break;
		retire_quietly(conn, e, st == IBV_WC_SUCCESS);
	}
	memset(out, 0, sizeof(*out));
	if (op->kind == TFAB_VERBS_OP_MARKER) {
		tfab_verbs_op_put(ep, op);
	} else if (st == IBV_WC_SUCCESS) {
		if (!op->inject) {
			out->type = TFAB_EV_WRITE_DONE;
			out->ctx = op->ctx;
			nev = 1;
		}
		tfab_verbs_op_put(ep, op);
	} else if (st == IBV_WC_WR_FLUSH_ERR && !conn->zombie &&
		   conn->state == TFAB_VERBS_DRAINING) {
		retry_push(conn, op);
	} else if (st == IBV_WC_WR_FLUSH_ERR) {
		if (!conn->zombie && conn->state == TFAB_VERBS_READY)
			tfab_verbs_conn_fail(conn, -TFAB_ERR_PEER_FAILED,
					     "its queue pair went into the error state");
		if (!op->inject) {
			out->type = TFAB_EV_ERROR;
			out->status = conn->failed ? conn->failed : -ECANCELED;
			out->ctx = op->ctx;
			out->errmsg = ibv_wc_status_str(st);
			nev = 1;
		}
		tfab_verbs_op_put(ep, op);
	} else {
		/* The write that failed: an injected one is reported too, marked so. */
		status = wc_status(st);
		TFAB_INFO(
		    SUBSYS, "a %llu-byte write on connection %u failed: %s (vendor error %#x)",
		    (unsigned long long)op->len, conn->id, ibv_wc_status_str(st), wc->vendor_err);
		out->type = TFAB_EV_ERROR;
		out->status = status;
		out->ctx = op->ctx;
		out->injected = op->inject;
		out->errmsg = ibv_wc_status_str(st);
		nev = 1;
		tfab_verbs_op_put(ep, op);
		if (!conn->zombie && conn->state == TFAB_VERBS_READY) {
			if (peer_lost(st))
				tfab_verbs_conn_fail(conn, -TFAB_ERR_PEER_FAILED,
						     ibv_wc_status_str(st));
			else
				tfab_verbs_conn_drain(conn); /* the peer is fine: reconnect */
		}
	}
	tfab_verbs_conn_after_retire(conn);
	return nev;
}

/*
 * A live connection of ours to the endpoint whose write completed on passive queue pair qpn
 * (REMOTE_WRITE's src): the passive end recorded the writer's endpoint id when the writer
 * connected to it. NULL while we have none.
 */
static struct tfab_conn *wc_src(struct tfab_verbs_ep *ep, uint32_t qpn)
{
	const struct tfab_verbs_passive *p = NULL;

	for (struct tfab_list *l = ep->passives.next; l != &ep->passives && !p; l = l->next) {
		const struct tfab_verbs_passive *q =
		    tfab_container_of(l, struct tfab_verbs_passive, link);

		if (q->qp && q->qp->qp_num == qpn)
			p = q;
	}
	if (!p)
		return NULL;
	for (struct tfab_list *l = ep->conns.next; l != &ep->conns; l = l->next) {
		struct tfab_verbs_conn *c = tfab_container_of(l, struct tfab_verbs_conn, link);

		if (!c->zombie && c->remote.ep_id == p->remote_ep)
			return &c->base;
	}
	return NULL;
}

static int on_wc(struct tfab_verbs_ep *ep, const struct ibv_wc *wc, struct tfab_event *out)
{
	unsigned slot = (unsigned)(wc->wr_id >> 3);

	switch (wc->wr_id & TFAB_VERBS_TAG_MASK) {
	case TFAB_VERBS_TAG_RECV:
		ep->rq_posted--;
		memset(out, 0, sizeof(*out));
		if (wc->status == IBV_WC_SUCCESS) {
			if (wc->opcode != IBV_WC_RECV_RDMA_WITH_IMM)
				return 0; /* nothing of ours sends */
			out->type = TFAB_EV_REMOTE_WRITE;
			out->imm = ntohl(wc->imm_data);
			out->src = wc_src(ep, wc->qp_num);
			/* The last piece of a split write: its whole length is not known here. */
			out->len = wc->byte_len < ep->len_exact_below ? wc->byte_len : 0;
			return 1;
		}
		if (wc->status == IBV_WC_WR_FLUSH_ERR)
			return 0;
		/* A peer's write that failed here (bad key, out of range): the writer is told. */
		TFAB_DEBUG(SUBSYS, "a peer's write failed on queue pair %u: %s", wc->qp_num,
			   ibv_wc_status_str(wc->status));
		out->type = TFAB_EV_ERROR;
		out->status = wc_status(wc->status);
		out->errmsg = ibv_wc_status_str(wc->status);
		return 1;
	case TFAB_VERBS_TAG_UD_RECV:
		if (wc->status == IBV_WC_SUCCESS)
			tfab_verbs_cm_on_recv(ep, slot, wc->byte_len);
		if (wc->status != IBV_WC_WR_FLUSH_ERR)
			tfab_verbs_ud_post_recv(ep, slot);
		return 0;
	case TFAB_VERBS_TAG_UD_SEND:
		if (slot < TFAB_VERBS_UD_TX)
			ep->ud_tx_busy[slot] = false;
		if (wc->status != IBV_WC_SUCCESS)
			TFAB_DEBUG(SUBSYS, "a connection datagram failed: %s",
				   ibv_wc_status_str(wc->status));
		return 0;
	case TFAB_VERBS_TAG_OP:
		return on_send_wc(ep, wc, out);
	case TFAB_VERBS_TAG_CHUNK: {
		/* Only failures complete (unsignalled); the write's last piece reports. */
		struct tfab_verbs_op *op =
		    (struct tfab_verbs_op *)(uintptr_t)(wc->wr_id & ~(uint64_t)TFAB_VERBS_TAG_MASK);

		if (wc->status != IBV_WC_SUCCESS && wc->status != IBV_WC_WR_FLUSH_ERR && op->conn &&
		    !op->chunk_err)
			op->chunk_err = (int)wc->status;
		return 0;
	}
	default:
		return 0;
	}
}

/* Keep the SRQ full: every write with immediate that lands takes one receive. */
static void srq_refill(struct tfab_verbs_ep *ep)
{
	struct ibv_recv_wr wr[64], *bad;

	while (ep->rq_posted < ep->rq_depth) {
		unsigned k = ep->rq_depth - ep->rq_posted;
		int rc;

		if (k > 64)
			k = 64;
		for (unsigned i = 0; i < k; i++) {
			memset(&wr[i], 0, sizeof(wr[i]));
			wr[i].wr_id = TFAB_VERBS_TAG_RECV;
			wr[i].next = i + 1 < k ? &wr[i + 1] : NULL;
		}
		rc = ibv_post_srq_recv(ep->srq, wr, &bad);
		if (rc) {
			ep->rq_posted += (unsigned)(bad - wr);
			TFAB_ERROR(SUBSYS, "ibv_post_srq_recv: %s", strerror(rc));
			return;
		}
		ep->rq_posted += k;
	}
}

/* Completion channel mode: take the events (never blocking) and acknowledge them in batches. */
static void read_channel(struct tfab_verbs_ep *ep)
{
	struct ibv_cq *cq;
	void *cq_ctx;

	while (ibv_get_cq_event(ep->channel, &cq, &cq_ctx) == 0) {
		ep->cq_events++;
		ep->cq_armed = false;
	}
	if (ep->cq_events >= 64) {
		ibv_ack_cq_events(ep->cq, ep->cq_events);
		ep->cq_events = 0;
	}
}

/*
 * Asynchronous events (a queue pair's last WQE, port changes) queue up in the kernel until
 * read: read them now and then, without blocking, and log them.
 */
static void read_async(struct tfab_verbs_ep *ep)
{
	struct ibv_async_event ae;

	while (ibv_get_async_event(ep->ctx, &ae) == 0) {
		switch (ae.event_type) {
		case IBV_EVENT_PORT_ERR:
		case IBV_EVENT_DEVICE_FATAL:
		case IBV_EVENT_CQ_ERR:
			TFAB_WARN(SUBSYS, "%s: %s", ep->port.dev,
				  ibv_event_type_str(ae.event_type));
			break;
		default:
			TFAB_DEBUG(SUBSYS, "%s: %s", ep->port.dev,
				   ibv_event_type_str(ae.event_type));
			break;
		}
		ibv_ack_async_event(&ae);
	}
}

static int tfab_verbs_poll(struct tfab_ep *base, struct tfab_event *ev, int max)
{
	struct tfab_verbs_ep *ep = verbs_ep(base);
	int n = deliver_deferred(ep, ev, max);

	if (ep->channel)
		read_channel(ep);
	while (n < max) {
		int want = max - n < TFAB_VERBS_POLL_BATCH ? max - n : TFAB_VERBS_POLL_BATCH;
		int got = ibv_poll_cq(ep->cq, want, ep->wc);

		if (got < 0) {
			TFAB_ERROR(SUBSYS, "ibv_poll_cq failed");
			return n ? n : -TFAB_ERR_FABRIC;
		}
		for (int i = 0; i < got; i++)
			n += on_wc(ep, &ep->wc[i], &ev[n]);
		if (got < want)
			break;
	}
	if (ep->rq_posted < ep->rq_depth)
		srq_refill(ep);
	if ((++ep->polls & 4095) == 0)
		read_async(ep);
	if (ep->ntimed) {
		uint64_t now = tfab__now_ms();

		if (now >= ep->next_scan_ms) {
			ep->next_scan_ms = now + TFAB_VERBS_SCAN_MS;
			tfab_verbs_timers(ep, now);
		}
	}
	if (ep->backlog) {
		struct tfab_list *l, *t;

		ep->backlog = false;
		tfab_list_for_each_safe(l, t, &ep->conns)
		{
			struct tfab_verbs_conn *c =
			    tfab_container_of(l, struct tfab_verbs_conn, link);

			if (!c->zombie && c->state == TFAB_VERBS_READY && c->nretry)
				tfab_verbs_post_backlog(c);
		}
	}
	if (n < max)
		n += deliver_deferred(ep, ev + n, max - n);
	/* Idle: arm, so that a completion wakes whoever waits on the channel. */
	if (ep->channel && n == 0 && !ep->cq_armed && ibv_req_notify_cq(ep->cq, 0) == 0)
		ep->cq_armed = true;
	return n;
}

/* Writes. */

static int tfab_verbs_write_imm(struct tfab_ep *base, struct tfab_conn *cbase, const void *lbuf,
				size_t len, struct tfab_mr *lmr, uint64_t raddr, uint64_t rkey,
				uint32_t imm, unsigned flags, void *ctx)
{
	struct tfab_verbs_ep *ep = verbs_ep(base);
	struct tfab_verbs_conn *conn = verbs_conn(cbase);
	bool inject = (flags & TFAB_WRITE_INJECT) != 0;
	struct tfab_verbs_op *op;
	int rc;

	if (conn->state == TFAB_VERBS_FAILED)
		return conn->failed;
	if (len > ep->caps.max_msg_size || (inject && len > ep->caps.inject_size))
		return -EMSGSIZE;
	if (rkey > UINT32_MAX || (len && !lbuf) ||
	    (len && !inject && len > ep->inline_size && !lmr))
		return -EINVAL;
	if (conn->zombie)
		return -ENOTCONN;
	if (conn->state != TFAB_VERBS_READY || conn->nretry)
		return -EAGAIN; /* connecting, or re-establishing after a failed write */
	op = tfab_verbs_op_get(ep);
	if (!op)
		return -ENOMEM;
	op->kind = TFAB_VERBS_OP_WRITE;
	op->ctx = ctx;
	op->inject = inject;
	op->lbuf = lbuf;
	op->len = len;
	op->lkey = lmr ? ((struct tfab_verbs_mr *)lmr->prov)->mr->lkey : 0;
	op->raddr = raddr;
	op->rkey = (uint32_t)rkey;
	op->imm = imm;
	if (inject && len)
		memcpy(op->data, lbuf, len); /* kept to post again after a recovery */
	rc = tfab_verbs_post(conn, op);
	if (rc) {
		tfab_verbs_op_put(ep, op);
		if (rc != -EAGAIN)
			TFAB_ERROR(SUBSYS, "ibv_post_send (%zu bytes): %s", len, tfab_strerror(rc));
	}
	return rc;
}

/* Memory. */

/*
 * GPU memory: a device that can reach CUDA memory registers it from a dma-buf file
 * (ibv_reg_dmabuf_mr with the fd cuMemGetHandleForAddressRange exports). tfab has no CUDA
 * driver API dependency yet, and rxe cannot do it: this reports false, and mr_reg takes host
 * memory only. This is the hook to change when a backend gets device pointers.
 */
static bool hmem_cuda_supported(const struct tfab_verbs_ep *ep)
{
	(void)ep;
	return false;
}

static int tfab_verbs_mr_reg(struct tfab_ep *base, void *addr, size_t len, unsigned access,
			     struct tfab_mr **mr_p)
{
	struct tfab_verbs_ep *ep = verbs_ep(base);
	int flags = IBV_ACCESS_LOCAL_WRITE;
	struct tfab_verbs_mr *vmr;
	int rc;

	if (!addr || !len)
		return -EINVAL;
	if (access & TFAB_MR_REMOTE_WRITE)
		flags |= IBV_ACCESS_REMOTE_WRITE;
	vmr = calloc(1, sizeof(*vmr));
	if (!vmr)
		return -ENOMEM;
	vmr->mr = ibv_reg_mr(ep->pd, addr, len, flags);
	if (!vmr->mr) {
		rc = tfab_verbs_errno(errno);
		TFAB_ERROR(SUBSYS, "ibv_reg_mr(%zu bytes): %s%s", len, tfab_strerror(rc),
			   rc == -ENOMEM || rc == -EPERM ? " (the locked-memory limit, ulimit -l?)"
							 : "");
		free(vmr);
		return rc;
	}
	vmr->ep = ep;
	vmr->pub.ep = base;
	vmr->pub.addr = addr;
	vmr->pub.len = len;
	vmr->pub.rkey = vmr->mr->rkey;
	vmr->pub.raddr = (uint64_t)(uintptr_t)addr;
	vmr->pub.desc = vmr->mr;
	vmr->pub.prov = vmr;
	ep->nmrs++;
	*mr_p = &vmr->pub;
	return 0;
}

static int tfab_verbs_mr_dereg(struct tfab_mr *mr)
{
	struct tfab_verbs_mr *vmr;
	int rc;

	if (!mr)
		return 0;
	vmr = mr->prov;
	rc = ibv_dereg_mr(vmr->mr);
	if (rc)
		TFAB_WARN(SUBSYS, "ibv_dereg_mr: %s", strerror(rc));
	vmr->ep->nmrs--;
	free(vmr);
	return 0;
}

/* Connections. */

static int tfab_verbs_get_addr(struct tfab_ep *base, void *buf, size_t *len_p)
{
	struct tfab_verbs_ep *ep = verbs_ep(base);
	struct tfab_verbs_addr a = {
	    .link_layer = ep->port.link_layer,
	    .port = ep->port.port,
	    .mtu = ep->port.mtu,
	    .lid = ep->port.lid,
	    .ud_qpn = ep->ud_qp->qp_num,
	    .ep_id = ep->ep_id,
	    .gid = ep->port.gid,
	};

	if (*len_p < TFAB_VERBS_ADDR_LEN)
		return -ENOSPC;
	tfab_verbs_addr_encode(&a, buf);
	*len_p = TFAB_VERBS_ADDR_LEN;
	return 0;
}

static int tfab_verbs_connect(struct tfab_ep *base, const void *addr, size_t len,
			      struct tfab_conn **conn_p)
{
	struct tfab_verbs_ep *ep = verbs_ep(base);
	struct tfab_verbs_conn *conn;
	int rc;

	conn = calloc(1, sizeof(*conn));
	if (!conn)
		return -ENOMEM;
	rc = tfab_verbs_addr_decode(addr, len, &conn->remote);
	if (rc) {
		TFAB_ERROR(SUBSYS, "connect: %s",
			   rc == -TFAB_ERR_VERSION ? "the peer's address is of another version"
						   : "not a verbs endpoint address");
		goto err;
	}
	if (conn->remote.link_layer != ep->port.link_layer) {
		TFAB_ERROR(SUBSYS, "connect: the peer is on %s, this endpoint on %s",
			   conn->remote.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE"
									      : "InfiniBand",
			   ep->port.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand");
		rc = -EINVAL;
		goto err;
	}
	conn->ep = ep;
	conn->cap = ep->sq_depth + 1; /* one more for a marker */
	conn->ring = calloc(conn->cap, sizeof(*conn->ring));
	conn->retry = calloc(conn->cap, sizeof(*conn->retry));
	if (!conn->ring || !conn->retry) {
		rc = -ENOMEM;
		goto err;
	}
	rc = tfab_verbs_qp_create(ep, conn->cap, ep->inline_size, &conn->qp, NULL);
	if (rc) {
		TFAB_ERROR(SUBSYS, "ibv_create_qp: %s", tfab_strerror(rc));
		goto err;
	}
	rc = tfab_verbs_qp_init(ep, conn->qp);
	if (rc) {
		TFAB_ERROR(SUBSYS, "queue pair to INIT: %s", tfab_strerror(rc));
		goto err_qp;
	}
	/* The address handle to the peer's UD queue pair. */
	rc = tfab_verbs_ah_get(ep, &conn->remote.gid, conn->remote.lid, &conn->ah);
	if (rc)
		goto err_qp;
	conn->id = ++ep->next_conn_id;
	tfab__list_add_tail(&ep->conns, &conn->link);
	ep->nconns++;
	conn->base.ep = base;
	tfab_verbs_conn_start(ep, conn);
	*conn_p = &conn->base;
	return 0;
err_qp:
	ibv_destroy_qp(conn->qp);
err:
	free(conn->ring);
	free(conn->retry);
	free(conn);
	return rc;
}

static int tfab_verbs_disconnect(struct tfab_conn *conn)
{
	if (conn)
		tfab_verbs_conn_close(verbs_conn(conn));
	return 0;
}

/* The endpoint. */

static int tfab_verbs_close(struct tfab_ep *base)
{
	struct tfab_verbs_ep *ep = base ? verbs_ep(base) : NULL;

	if (!ep)
		return 0;
	if (ep->nconns || ep->nmrs)
		return -EBUSY;
	while (!tfab__list_empty(&ep->conns))
		tfab_verbs_conn_destroy(
		    tfab_container_of(ep->conns.next, struct tfab_verbs_conn, link));
	while (!tfab__list_empty(&ep->passives))
		tfab_verbs_passive_destroy(
		    tfab_container_of(ep->passives.next, struct tfab_verbs_passive, link));
	tfab_verbs_ud_close(ep);
	if (ep->srq)
		ibv_destroy_srq(ep->srq);
	while (!tfab__list_empty(&ep->ahs)) {
		struct tfab_verbs_ah *a =
		    tfab_container_of(ep->ahs.next, struct tfab_verbs_ah, link);

		ibv_destroy_ah(a->ah);
		tfab__list_del(&a->link);
		free(a);
	}
	if (ep->cq) {
		if (ep->cq_events)
			ibv_ack_cq_events(ep->cq, ep->cq_events);
		ibv_destroy_cq(ep->cq);
	}
	if (ep->channel)
		ibv_destroy_comp_channel(ep->channel);
	if (ep->pd)
		ibv_dealloc_pd(ep->pd);
	if (ep->ctx)
		ibv_close_device(ep->ctx);
	tfab__freelist_fini(&ep->ops);
	free(ep);
	return 0;
}

struct open_pick {
	struct ibv_context *ctx;
	struct tfab_verbs_port port;
};

static bool pick_first(void *arg, struct ibv_context *ctx, const struct tfab_verbs_port *p)
{
	struct open_pick *pick = arg;

	pick->ctx = ctx;
	pick->port = *p;
	return true;
}

static uint64_t random_id(void)
{
	uint64_t id = 0;

	if (getrandom(&id, sizeof(id), 0) != (ssize_t)sizeof(id) || id == 0)
		id = tfab__now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&id;
	return id;
}

/* Queue depths from the settings, within what the device offers. */
static int set_limits(struct tfab_verbs_ep *ep, const struct tfab_config *cfg,
		      const struct ibv_device_attr *d, unsigned *cq_depth_p)
{
	unsigned cq_depth = cfg->verbs_cq_depth;

	if (d->max_srq == 0) {
		TFAB_ERROR(SUBSYS, "%s has no shared receive queues", ep->port.dev);
		return -TFAB_ERR_NO_FABRIC;
	}
	if (d->max_cqe > 0 && cq_depth > (unsigned)d->max_cqe)
		cq_depth = (unsigned)d->max_cqe;
	ep->rq_depth = cfg->verbs_rq_depth;
	if (d->max_srq_wr > 0 && ep->rq_depth > (unsigned)d->max_srq_wr)
		ep->rq_depth = (unsigned)d->max_srq_wr;
	ep->sq_depth = cfg->verbs_sq_depth;
	if (d->max_qp_wr > 1 && ep->sq_depth + 1 > (unsigned)d->max_qp_wr)
		ep->sq_depth = (unsigned)d->max_qp_wr - 1;
	if (cq_depth < ep->rq_depth + TFAB_VERBS_UD_RX + TFAB_VERBS_UD_TX + TFAB_VERBS_CQ_SPARE +
			   2 * ep->sq_depth) {
		TFAB_ERROR(SUBSYS,
			   "TFAB_VERBS_CQ_DEPTH=%u (device limit %d) leaves too little room "
			   "beside %u receives and %u-deep send queues",
			   cfg->verbs_cq_depth, d->max_cqe, ep->rq_depth, ep->sq_depth);
		return -TFAB_ERR_CONFIG;
	}
	/*
	 * Every posted work request may complete, flushed ones too: the CQ must hold them. The
	 * spare is for markers, which are posted whatever the budget (two per connection at most).
	 */
	ep->sq_budget =
	    cq_depth - ep->rq_depth - TFAB_VERBS_UD_RX - TFAB_VERBS_UD_TX - TFAB_VERBS_CQ_SPARE;
	ep->signal_every = cfg->verbs_signal_every;
	ep->timeout = (uint8_t)cfg->verbs_timeout;
	ep->retry_cnt = (uint8_t)cfg->verbs_retry_cnt;
	ep->rnr_retry = (uint8_t)cfg->verbs_rnr_retry;
	ep->connect_timeout_ms = cfg->connect_timeout_ms;
	*cq_depth_p = cq_depth;
	return 0;
}

/* The largest inline size the device takes, up to the setting: try, halving on refusal. */
static int find_inline(struct tfab_verbs_ep *ep, unsigned want)
{
	for (;;) {
		struct ibv_qp *qp;
		unsigned got = 0;
		int rc = tfab_verbs_qp_create(ep, ep->sq_depth + 1, want, &qp, &got);

		if (rc == 0) {
			ibv_destroy_qp(qp);
			ep->inline_size = got < want ? got : want;
			return 0;
		}
		if (want == 0) {
			TFAB_ERROR(SUBSYS, "ibv_create_qp: %s", tfab_strerror(rc));
			return rc;
		}
		want = want > 16 ? want / 2 : 0;
	}
}

static int tfab_verbs_open(const struct tfab_open_args *args, struct tfab_ep **ep_p)
{
	const struct tfab_config *cfg = args->cfg;
	struct open_pick pick = {0};
	struct ibv_srq_init_attr srq_attr;
	struct ibv_device_attr dattr;
	struct tfab_verbs_ep *ep;
	unsigned cq_depth = 0;
	char why[256], gid[64];
	int rc;

	/* One port per endpoint, by the settings; args->local_only changes nothing here. */
	ep = calloc(1, sizeof(*ep));
	if (!ep)
		return -ENOMEM;
	ep->base.ops = &tfab_verbs_ops;
	ep->ops = TFAB_FREELIST_INIT(struct tfab_verbs_op, TFAB_VERBS_OP_CHUNK);
	tfab__list_init(&ep->conns);
	tfab__list_init(&ep->passives);
	tfab__list_init(&ep->ahs);
	tfab_verbs_scan(cfg, pick_first, &pick, why, sizeof(why));
	if (!pick.ctx) {
		TFAB_ERROR(SUBSYS, "%s", why);
		rc = -TFAB_ERR_NO_FABRIC;
		goto err;
	}
	ep->ctx = pick.ctx;
	ep->port = pick.port;
	if (ibv_query_device(ep->ctx, &dattr)) {
		rc = -TFAB_ERR_FABRIC;
		TFAB_ERROR(SUBSYS, "ibv_query_device(%s) failed", ep->port.dev);
		goto err;
	}
	rc = set_limits(ep, cfg, &dattr, &cq_depth);
	if (rc)
		goto err;
	if (fcntl(ep->ctx->async_fd, F_SETFL, fcntl(ep->ctx->async_fd, F_GETFL) | O_NONBLOCK) < 0) {
		rc = tfab_verbs_errno(errno);
		goto err;
	}
	ep->pd = ibv_alloc_pd(ep->ctx);
	if (!ep->pd) {
		rc = tfab_verbs_errno(errno);
		TFAB_ERROR(SUBSYS, "ibv_alloc_pd: %s", tfab_strerror(rc));
		goto err;
	}
	if (cfg->verbs_cq_events) {
		ep->channel = ibv_create_comp_channel(ep->ctx);
		if (!ep->channel || fcntl(ep->channel->fd, F_SETFL,
					  fcntl(ep->channel->fd, F_GETFL) | O_NONBLOCK) < 0) {
			rc = tfab_verbs_errno(errno);
			TFAB_ERROR(SUBSYS, "completion channel: %s", tfab_strerror(rc));
			goto err;
		}
	}
	ep->cq = ibv_create_cq(ep->ctx, (int)cq_depth, ep, ep->channel, 0);
	if (!ep->cq) {
		rc = tfab_verbs_errno(errno);
		TFAB_ERROR(SUBSYS, "ibv_create_cq(%u): %s", cq_depth, tfab_strerror(rc));
		goto err;
	}
	memset(&srq_attr, 0, sizeof(srq_attr));
	srq_attr.attr.max_wr = ep->rq_depth;
	srq_attr.attr.max_sge = 1;
	ep->srq = ibv_create_srq(ep->pd, &srq_attr);
	if (!ep->srq) {
		rc = tfab_verbs_errno(errno);
		TFAB_ERROR(SUBSYS, "ibv_create_srq(%u): %s", ep->rq_depth, tfab_strerror(rc));
		goto err;
	}
	rc = find_inline(ep, cfg->verbs_inline);
	if (rc)
		goto err;
	rc = tfab_verbs_ud_open(ep);
	if (rc)
		goto err;
	srq_refill(ep);
	if (ep->rq_posted < ep->rq_depth) {
		rc = -TFAB_ERR_FABRIC;
		goto err;
	}
	ep->ep_id = random_id();
	ep->rand = random_id() | 1;

	ep->caps.backend = "verbs";
	snprintf(ep->caps.fabric, sizeof(ep->caps.fabric), "%s", ep->port.dev);
	snprintf(ep->caps.domain, sizeof(ep->caps.domain), "%.59s:%u", ep->port.dev, ep->port.port);
	ep->caps.imm_bytes = 4;
	ep->caps.mr_addr = TFAB_MR_ADDR_VIRT;
	ep->caps.key_bytes = 4;
	ep->caps.prov_keys = true; /* the device's */
	/* Longer writes go as several work requests, the immediate on the last. */
	ep->wr_max = ep->port.max_msg_sz ? ep->port.max_msg_sz : 1u << 30;
	ep->caps.max_msg_size = (uint64_t)ep->wr_max * (ep->sq_depth / 4 ? ep->sq_depth / 4 : 1);
	ep->len_exact_below = ep->wr_max;
	ep->caps.inject_size = ep->inline_size;
	ep->caps.addr_len = TFAB_VERBS_ADDR_LEN;
	ep->caps.hmem_cuda = hmem_cuda_supported(ep);
	ep->caps.manual_progress = false;
	ep->caps.mr_local = true;
	tfab_verbs_gid_str(&ep->port.gid, gid, sizeof(gid));
	TFAB_INFO(SUBSYS,
		  "opened %s port %u (%s, gid[%d] %s, mtu %d): sq %u, rq %u, cq %u, inline %u, "
		  "UD qp %u",
		  ep->port.dev, ep->port.port,
		  ep->port.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand",
		  ep->port.gid_index, gid, 128 << ep->port.mtu, ep->sq_depth, ep->rq_depth,
		  cq_depth, ep->inline_size, ep->ud_qp->qp_num);
	*ep_p = &ep->base;
	return 0;
err:
	tfab_verbs_close(&ep->base);
	return rc;
}

static const struct tfab_caps *tfab_verbs_caps(const struct tfab_ep *base)
{
	return &verbs_ep(base)->caps;
}

const struct tfab_provider_ops tfab_verbs_ops = {
    .size = sizeof(struct tfab_provider_ops),
    .name = "verbs",
    .probe = tfab_verbs_probe,
    .open = tfab_verbs_open,
    .close = tfab_verbs_close,
    .caps = tfab_verbs_caps,
    .get_addr = tfab_verbs_get_addr,
    .connect = tfab_verbs_connect,
    .disconnect = tfab_verbs_disconnect,
    .mr_reg = tfab_verbs_mr_reg,
    .mr_dereg = tfab_verbs_mr_dereg,
    .write_imm = tfab_verbs_write_imm,
    .poll = tfab_verbs_poll,
    .explain = tfab_verbs_explain,
};
