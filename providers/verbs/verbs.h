/*
 * The raw ibverbs backend's internal state, shared by its three files: device.c (device, port
 * and GID selection, probe), cm.c (connection setup over a UD queue pair, queue pair states,
 * recovery) and verbs.c (the provider operations, writes and completions).
 *
 * One endpoint is one device port with one PD, one CQ for everything, one SRQ that every RC
 * queue pair receives from, and one UD queue pair that carries connection requests. A
 * connection is one RC queue pair that this side writes on; the peer's end of it is a
 * "passive" queue pair that the peer created when our request came, and only ever receives.
 * Two endpoints that connect to each other therefore use two RC queue pairs, one each way.
 */
#ifndef TFAB_VERBS_H
#define TFAB_VERBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <infiniband/verbs.h>

#include "providers/provider.h"
#include "util/freelist.h"
#include "util/list.h"

#define SUBSYS "verbs"

#define TFAB_VERBS_MAX_INLINE 256 /* bytes an op keeps of an injected write, to post it again */
#define TFAB_VERBS_ADDR_LEN 40	  /* the endpoint blob */
#define TFAB_VERBS_CM_LEN 68	  /* a connection-setup datagram */
#define TFAB_VERBS_GRH 40	  /* what a UD receive buffer holds before the datagram */
#define TFAB_VERBS_UD_RX 64
#define TFAB_VERBS_UD_TX 16
#define TFAB_VERBS_QKEY 0x74666162u /* "tfab" */
#define TFAB_VERBS_POLL_BATCH 32

/* The low bits of a wr_id: an op pointer (8-byte aligned, tag 0) or a tagged index. */
enum tfab_verbs_tag {
	TFAB_VERBS_TAG_OP = 0,
	TFAB_VERBS_TAG_RECV = 1,    /* an SRQ receive */
	TFAB_VERBS_TAG_UD_RECV = 2, /* index << 3 */
	TFAB_VERBS_TAG_UD_SEND = 3, /* index << 3 */
	TFAB_VERBS_TAG_CHUNK = 4,   /* op | 4: a leading piece of a write longer than max_msg_sz */
	TFAB_VERBS_TAG_MASK = 7,
};

/* What the settings select on this machine: one port of one device. */
struct tfab_verbs_port {
	char dev[64];
	uint8_t port;
	uint8_t link_layer; /* IBV_LINK_LAYER_* */
	uint8_t mtu;	    /* enum ibv_mtu, the port's active MTU */
	uint16_t lid;
	int gid_index;
	uint32_t gid_type; /* enum ibv_gid_type */
	union ibv_gid gid;
	uint32_t max_msg_sz;
};

/* The endpoint blob: what get_addr hands out and connect takes. Big-endian on the wire. */
struct tfab_verbs_addr {
	uint8_t link_layer;
	uint8_t port;
	uint8_t mtu;
	uint16_t lid;
	uint32_t ud_qpn;
	uint64_t ep_id; /* random, tells endpoints (and their processes) apart */
	union ibv_gid gid;
};

enum tfab_verbs_cm_type {
	TFAB_VERBS_CM_REQ = 1, /* connect to me: my queue pair, PSN and address */
	TFAB_VERBS_CM_REP,     /* done: the passive queue pair that answers it */
	TFAB_VERBS_CM_REJ,     /* refused (no resources) */
	TFAB_VERBS_CM_DISC,    /* the requester closed the connection */
};

/* A connection-setup datagram. */
struct tfab_verbs_cm {
	uint8_t type;
	uint64_t src_ep, dst_ep;
	uint32_t conn_id, gen; /* the requester's connection, and its setup generation */
	uint32_t qpn, psn;     /* the sender's RC queue pair */
	uint32_t wr_max;       /* the sender's longest work request */
	uint8_t mtu;
	uint16_t lid;
	uint32_t ud_qpn; /* where to answer */
	union ibv_gid gid;
};

enum tfab_verbs_op_kind {
	TFAB_VERBS_OP_WRITE = 1,
	TFAB_VERBS_OP_MARKER, /* a signalled write posted to a queue pair in error: its flush
				 completion comes after every earlier work request's */
};

/* One posted work request; kept until its completion (or a later signalled one) retires it. */
struct tfab_verbs_op {
	struct tfab_verbs_op *next;   /* free list, or the deferred-event list */
	struct tfab_verbs_conn *conn; /* NULL once its queue pair is gone: drop the completion */
	void *ctx;
	uint8_t kind;
	bool inject;
	uint16_t nwr;  /* work requests it was posted as (a long write goes in pieces) */
	int chunk_err; /* enum ibv_wc_status of a failed leading piece, else 0 */
	int status;    /* deferred ERROR events */
	const char *errmsg;
	const void *lbuf;
	uint64_t len, raddr;
	uint32_t lkey, rkey, imm;
	uint8_t data[TFAB_VERBS_MAX_INLINE]; /* an injected write's payload */
};

enum tfab_verbs_conn_state {
	TFAB_VERBS_CONNECTING = 1, /* INIT; REQ sent, waiting for REP */
	TFAB_VERBS_READY,	   /* RTS */
	TFAB_VERBS_DRAINING,	   /* a write failed by its own fault: waiting for the flushes */
	TFAB_VERBS_FAILED,	   /* the peer is lost: writes fail */
};

struct tfab_verbs_conn {
	struct tfab_conn base;
	struct tfab_verbs_ep *ep;
	struct tfab_list link; /* ep->conns */
	enum tfab_verbs_conn_state state;
	bool zombie; /* disconnected, waiting for its work requests to retire */
	bool timed;  /* counted in ep->ntimed */
	int failed;  /* FAILED: the status writes return */
	uint32_t id, gen, psn;
	struct ibv_qp *qp;
	struct tfab_verbs_addr remote;
	struct ibv_ah *ah; /* to the peer's UD queue pair; owned by ep's cache */
	/* posted ops in order, ring[(head + i) % cap] for i < nops, using count send slots */
	struct tfab_verbs_op **ring;
	unsigned cap, head, nops, count;
	unsigned unsignalled; /* injected writes posted unsignalled since the last signalled one */
	/*
	 * Writes flushed by another write's failure, posted again in order once reconnected.
	 * Flushed writes go in at retry_ins: before any still waiting from an earlier recovery.
	 */
	struct tfab_verbs_op **retry;
	unsigned nretry, retry_ins;
	uint64_t next_tx_ms, deadline_ms;
	unsigned backoff_ms;
};

/* Our end of a peer's connection: receives only. */
struct tfab_verbs_passive {
	struct tfab_list link; /* ep->passives */
	uint64_t remote_ep;
	uint32_t conn_id, gen;
	struct ibv_qp *qp;
	uint32_t psn;
};

/* An address handle to a port (GID, LID), shared by everything that talks to it. */
struct tfab_verbs_ah {
	struct tfab_list link;
	union ibv_gid gid;
	uint16_t lid;
	struct ibv_ah *ah;
};

struct tfab_verbs_mr {
	struct tfab_mr pub;
	struct tfab_verbs_ep *ep;
	struct ibv_mr *mr;
};

struct tfab_verbs_chunk;

struct tfab_verbs_ep {
	struct tfab_ep base;
	struct tfab_caps caps;
	struct tfab_verbs_port port;
	uint64_t ep_id;
	uint64_t rand; /* PSNs */
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *channel;
	struct ibv_cq *cq;
	struct ibv_srq *srq;
	bool cq_armed;
	unsigned cq_events; /* read from the channel, not yet acknowledged */
	/* settings, clamped to the device */
	unsigned sq_depth, rq_depth, inline_size, signal_every;
	uint32_t wr_max; /* longest single work request: the port's max_msg_sz */
	/*
	 * The smallest wr_max of this endpoint and of every peer that connected to it: a write
	 * that lands shorter than that was not split, so its byte_len is the whole write's.
	 */
	uint32_t len_exact_below;
	uint8_t timeout, retry_cnt, rnr_retry;
	unsigned connect_timeout_ms;
	unsigned rq_posted;
	/* work requests that may still produce a completion, bounded so the CQ never overflows */
	unsigned sq_total, sq_budget;
	/* connection setup */
	struct ibv_qp *ud_qp;
	struct ibv_mr *ud_mr;
	uint8_t *ud_buf;
	bool ud_tx_busy[TFAB_VERBS_UD_TX];
	struct tfab_list conns;	   /* struct tfab_verbs_conn, zombies included */
	struct tfab_list passives; /* struct tfab_verbs_passive */
	struct tfab_list ahs;	   /* struct tfab_verbs_ah */
	uint32_t next_conn_id;
	unsigned nconns, nmrs;
	unsigned ntimed; /* connections with a timer running */
	bool backlog;	 /* a READY connection may have writes to post again */
	uint64_t next_scan_ms;
	unsigned polls; /* async events are read every so many polls */
	/* ERROR events decided outside a completion, delivered by the next polls */
	struct tfab_verbs_op *deferred, *deferred_tail;
	struct tfab_freelist ops; /* of struct tfab_verbs_op */
	struct ibv_wc wc[TFAB_VERBS_POLL_BATCH];
};

extern const struct tfab_provider_ops tfab_verbs_ops;

static inline struct tfab_verbs_ep *verbs_ep(const struct tfab_ep *base)
{
	return tfab_container_of(base, struct tfab_verbs_ep, base);
}

static inline struct tfab_verbs_conn *verbs_conn(struct tfab_conn *base)
{
	return tfab_container_of(base, struct tfab_verbs_conn, base);
}

/* device.c */

/*
 * Called for each usable port that the settings allow, with the device open. Returns true to
 * keep ctx (the scan then stops and the callee owns it), false to go on.
 */
typedef bool (*tfab_verbs_port_cb)(void *arg, struct ibv_context *ctx,
				   const struct tfab_verbs_port *port);

/*
 * Walk the devices and ports the settings allow (TFAB_VERBS_DEVICE, _PORT, _GID_INDEX) and
 * call cb for each usable one. Returns how many were found; when none, why holds the reason.
 */
int tfab_verbs_scan(const struct tfab_config *cfg, tfab_verbs_port_cb cb, void *arg, char *why,
		    size_t whylen);

int tfab_verbs_probe(const struct tfab_config *cfg, const char *fabric, tfab_probe_cb cb,
		     void *arg);
void tfab_verbs_explain(const struct tfab_config *cfg, char *buf, size_t len);

/* "::ffff:127.0.0.1" */
void tfab_verbs_gid_str(const union ibv_gid *gid, char *buf, size_t len);

/* A verbs call's return value (0, or a positive errno) as a tfab status. */
int tfab_verbs_rc(int rc);
/* errno after a verbs call returned NULL, as a tfab status (never 0). */
int tfab_verbs_errno(int err);

/* cm.c */

int tfab_verbs_ud_open(struct tfab_verbs_ep *ep);
void tfab_verbs_ud_close(struct tfab_verbs_ep *ep);
int tfab_verbs_ud_post_recv(struct tfab_verbs_ep *ep, unsigned slot);
void tfab_verbs_cm_on_recv(struct tfab_verbs_ep *ep, unsigned slot, uint32_t len);

void tfab_verbs_addr_encode(const struct tfab_verbs_addr *a, uint8_t *buf);
int tfab_verbs_addr_decode(const uint8_t *buf, size_t len, struct tfab_verbs_addr *a);

/* A connection-setup datagram into buf (TFAB_VERBS_CM_LEN bytes). */
void tfab_verbs_cm_encode(const struct tfab_verbs_cm *m, uint8_t *buf);

/*
 * A UD receive as it landed, len bytes at buf (TFAB_VERBS_GRH bytes of routing header, then
 * the datagram), from anyone who can reach the UD queue pair: the datagram into *m, or
 * -EINVAL if it is not one of ours (short, another magic, a type or MTU out of range, no
 * longest work request), -TFAB_ERR_VERSION for another version. Bytes past the datagram, its
 * spare bytes and the high byte of its 24-bit fields are not read. Reads nothing else.
 */
int tfab_verbs_cm_parse(const uint8_t *buf, size_t len, struct tfab_verbs_cm *m);

/* The cached address handle for a port (GID and LID); the endpoint owns it. */
int tfab_verbs_ah_get(struct tfab_verbs_ep *ep, const union ibv_gid *gid, uint16_t lid,
		      struct ibv_ah **ah_p);

/* An RC queue pair receiving from the SRQ (in RESET); *inline_p gets its inline size. */
int tfab_verbs_qp_create(struct tfab_verbs_ep *ep, unsigned send_wr, unsigned inline_size,
			 struct ibv_qp **qp_p, unsigned *inline_p);
/* RESET to INIT on the endpoint's port, taking remote writes. */
int tfab_verbs_qp_init(struct tfab_verbs_ep *ep, struct ibv_qp *qp);

int tfab_verbs_conn_start(struct tfab_verbs_ep *ep, struct tfab_verbs_conn *conn);
void tfab_verbs_conn_fail(struct tfab_verbs_conn *conn, int status, const char *why);
void tfab_verbs_conn_drain(struct tfab_verbs_conn *conn);
/* Move the queue pair to ERR and post a marker: everything on the ring completes, flushed. */
void tfab_verbs_conn_flush(struct tfab_verbs_conn *conn);
void tfab_verbs_conn_after_retire(struct tfab_verbs_conn *conn);
void tfab_verbs_conn_close(struct tfab_verbs_conn *conn);
void tfab_verbs_conn_destroy(struct tfab_verbs_conn *conn);
void tfab_verbs_passive_destroy(struct tfab_verbs_passive *p);
void tfab_verbs_timers(struct tfab_verbs_ep *ep, uint64_t now);

/* verbs.c */

struct tfab_verbs_op *tfab_verbs_op_get(struct tfab_verbs_ep *ep);
void tfab_verbs_op_put(struct tfab_verbs_ep *ep, struct tfab_verbs_op *op);
/* Queue an ERROR event for op (an inject's op is just freed). */
void tfab_verbs_defer_error(struct tfab_verbs_ep *ep, struct tfab_verbs_op *op, int status,
			    const char *errmsg);
/* Post op on conn's queue pair and append it to the ring. 0, -EAGAIN, or an error. */
int tfab_verbs_post(struct tfab_verbs_conn *conn, struct tfab_verbs_op *op);
/* Post again, in order, the writes a recovery kept. */
void tfab_verbs_post_backlog(struct tfab_verbs_conn *conn);

#endif
