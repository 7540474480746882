/*
 * The internal provider interface: what the protocol engine needs from a fabric, and no more.
 *
 * A backend ("ofi", "verbs") is a const table of operations. It opens an endpoint on one
 * fabric, hands out the endpoint's address as an opaque blob, connects to peers from their
 * blobs, registers memory, posts RDMA writes that carry a 32-bit immediate, and returns every
 * completion as one event type. Control messages travel the same way (writes with immediate
 * into a registered ring), so there is no separate send path.
 *
 * Threading: operations on one endpoint (and its peers and memory regions) are not thread-safe;
 * the engine serialises them. Different endpoints are independent.
 *
 * Errors: 0 or a negative status (tfab/status.h). -EAGAIN from write_imm means "no resources
 * now": drive poll() and retry later. A call that returns an error produces no event.
 */
#ifndef TFAB_PROVIDER_H
#define TFAB_PROVIDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tfab_config;
struct tfab_provider_ops;

/*
 * The base of every backend object, its first member (as libfabric's fid and UCX's
 * uct_base_ep): each object carries its backend, so one process holds endpoints of several
 * backends at once and the wrappers below dispatch without being told which. A backend
 * defines its own struct beginning with the base and converts with tfab_container_of.
 */
struct tfab_ep { /* an open endpoint: domain, queues, address */
	const struct tfab_provider_ops *ops;
};

struct tfab_conn { /* a connection to a remote endpoint */
	struct tfab_ep *ep;
	void *owner; /* the engine's (its peer), set after connect: backends leave it alone */
};

/* How a remote address that the target advertises is formed. */
enum tfab_mr_addr_mode {
	TFAB_MR_ADDR_VIRT,   /* the target's virtual address (verbs, shm, FI_MR_VIRT_ADDR) */
	TFAB_MR_ADDR_OFFSET, /* an offset from the region's start (tcp, sockets) */
};

/* What an endpoint can do: data, read by the engine after open. */
struct tfab_caps {
	const char *backend; /* "ofi", "verbs" */
	char fabric[64];     /* "tcp;ofi_rxm", "shm", "rxe0" */
	char domain[64];     /* "lo", "rxe0" */
	unsigned imm_bytes;  /* width of the immediate the engine may use (4) */
	enum tfab_mr_addr_mode mr_addr;
	unsigned key_bytes; /* significant bytes of a remote key */
	/*
	 * The fabric chooses remote keys (verbs, FI_MR_PROV_KEY); otherwise the backend does, at
	 * random (doc/security.md).
	 */
	bool prov_keys;
	uint64_t max_msg_size; /* longest single write */
	size_t inject_size;    /* longest write that may use TFAB_WRITE_INJECT */
	size_t addr_len;       /* bytes of the endpoint blob */
	bool hmem_cuda;	       /* CUDA device memory can be registered */
	bool same_host;	       /* reaches only processes on this host (shm) */
	bool manual_progress;  /* data moves only while both sides poll */
	bool mr_local;	       /* local buffers must be registered (always done anyway) */
	/*
	 * Several control messages a write (TFAB_CTRL_BATCH) can stall it: libfabric sockets,
	 * whose TCP connections it leaves at a zero window (doc/design.md). The engine writes
	 * one message a write to peers on such a path.
	 */
	bool no_ctrl_batch;
	/*
	 * REMOTE_WRITE events carry no src: the backend cannot tell who wrote (libfabric's rxm,
	 * whose completions name a wrong address; verbs, not wired yet). The engine then takes
	 * an immediate's own claim (doc/security.md).
	 */
	bool src_unknown;
};

/* A registered memory region, on one endpoint. */
struct tfab_mr {
	struct tfab_ep *ep;
	void *addr; /* start of the region in this process */
	size_t len;
	uint64_t rkey;	/* remote key to advertise */
	uint64_t raddr; /* remote address of addr to advertise (virtual or offset 0) */
	void *desc;	/* local descriptor for writes from this region */
	void *prov;	/* the backend's own handle */
};

/* Access a region is registered for. */
enum {
	TFAB_MR_LOCAL_WRITE = 1u << 0,	/* source of writes */
	TFAB_MR_REMOTE_WRITE = 1u << 1, /* target of peers' writes */
};

/* Flags of write_imm. */
enum {
	/*
	 * Copy the payload out before returning (len <= caps.inject_size). No WRITE_DONE event
	 * follows; a failure comes back as an ERROR event with the write's ctx and `injected`
	 * set (or with a NULL ctx from a backend that cannot tell which write failed).
	 */
	TFAB_WRITE_INJECT = 1u << 0,
};

enum tfab_event_type {
	TFAB_EV_WRITE_DONE = 1, /* a local write finished; ctx is the caller's */
	TFAB_EV_REMOTE_WRITE,	/* a peer's write with immediate landed: imm, len */
	TFAB_EV_ERROR,		/* an operation failed: ctx (may be NULL), status, errmsg */
};

struct tfab_event {
	enum tfab_event_type type;
	int status;	    /* 0, or negative for TFAB_EV_ERROR */
	void *ctx;	    /* the write's context */
	uint32_t imm;	    /* REMOTE_WRITE: the immediate */
	uint64_t len;	    /* REMOTE_WRITE: bytes written, where the fabric reports it, else 0 */
	const char *errmsg; /* ERROR: the fabric's own words; valid until the next poll */
	bool injected;	    /* ERROR: of a TFAB_WRITE_INJECT write (no WRITE_DONE was due) */
	/*
	 * REMOTE_WRITE: a live connection of ours to the endpoint that wrote (any one of them
	 * where several reach it), or NULL where the backend cannot tell (caps.src_unknown, or
	 * a writer that no live connection of ours reaches).
	 */
	struct tfab_conn *src;
};

/* Arguments of open. */
struct tfab_open_args {
	const struct tfab_config *cfg;
	const char *fabric; /* backend-specific fabric name (ofi: "tcp"), NULL for any */
	bool local_only;    /* prefer the loopback interface: both ends are on this host */
};

/* One usable fabric on this machine, as listed by probe. */
struct tfab_fabric_desc {
	const char *backend;
	char fabric[64];
	char domain[64];
	char detail[192]; /* capabilities in words */
};

typedef void (*tfab_probe_cb)(void *arg, const struct tfab_fabric_desc *desc);

struct tfab_provider_ops {
	size_t size;	  /* sizeof(struct tfab_provider_ops), for version checks */
	const char *name; /* "ofi", "verbs" */
	bool same_host;	  /* its endpoints reach processes of this host only (shm) */

	/* Report each usable fabric through cb; returns how many, or a negative status. */
	int (*probe)(const struct tfab_config *cfg, const char *fabric, tfab_probe_cb cb,
		     void *arg);

	int (*open)(const struct tfab_open_args *args, struct tfab_ep **ep_p);
	/* -EBUSY while peers or regions remain. Safe after a failed open (NULL). */
	int (*close)(struct tfab_ep *ep);
	/*
	 * Optional: the endpoint is about to close, and the memory its peers write is about to
	 * be freed: let what live peers are still writing land first (a backend whose writes
	 * go on landing after their region is deregistered). Nothing polls it after this.
	 */
	void (*quiesce)(struct tfab_ep *ep);
	/*
	 * Optional: a peer had this endpoint's address and keys (the engine's blob) and is gone
	 * without a connection of ours to it; it may have connected and written all the same (a
	 * backend that accepts connections by itself): quiesce and close as if it had been ours.
	 */
	void (*expose)(struct tfab_ep *ep);
	/*
	 * Optional: whether a poll now would report nothing (no entry published to us, no write
	 * of ours in progress or unacknowledged), read far more cheaply than a poll; where it is
	 * NULL, the engine always polls. False when unsure. Timed housekeeping may wait: the
	 * engine polls in full at least every 50 ms (its liveness checks).
	 */
	bool (*quiet)(struct tfab_ep *ep);
	const struct tfab_caps *(*caps)(const struct tfab_ep *ep);

	/* The endpoint's address blob; *len_p in: capacity, out: length. */
	int (*get_addr)(struct tfab_ep *ep, void *buf, size_t *len_p);
	/*
	 * Optional: a peer's address (len bytes, as connect takes it) in words, for messages
	 * ("fi_sockaddr_in://127.0.0.1:4000", "pid 812"); an empty string where it
	 * cannot say. NULL: messages name such a peer by its path alone.
	 */
	void (*addr_str)(struct tfab_ep *ep, const void *addr, size_t len, char *buf,
			 size_t buflen);
	int (*connect)(struct tfab_ep *ep, const void *addr, size_t len, struct tfab_conn **peer_p);
	int (*disconnect)(struct tfab_conn *peer);
	/*
	 * Optional (NULL where a backend needs no word of it): the connection's peer failed, and
	 * disconnect follows; a write of the peer's may have stopped half landed, and never end.
	 */
	void (*cut)(struct tfab_conn *peer);

	int (*mr_reg)(struct tfab_ep *ep, void *addr, size_t len, unsigned access,
		      struct tfab_mr **mr_p);
	int (*mr_dereg)(struct tfab_mr *mr);

	/*
	 * Write len bytes from lbuf (inside lmr) to raddr/rkey on peer, with imm as immediate.
	 * raddr is the advertised raddr of the target region plus an offset. ctx comes back in
	 * the WRITE_DONE or ERROR event. Returns 0, -EAGAIN (back-pressure), or an error.
	 */
	int (*write_imm)(struct tfab_ep *ep, struct tfab_conn *peer, const void *lbuf, size_t len,
			 struct tfab_mr *lmr, uint64_t raddr, uint64_t rkey, uint32_t imm,
			 unsigned flags, void *ctx);

	/* Drive progress and return up to max events (0 when there are none). Never blocks. */
	int (*poll)(struct tfab_ep *ep, struct tfab_event *ev, int max);

	/*
	 * Optional (NULL where a backend has none): memory that this endpoint's peers can write
	 * with one copy (shm: a shared segment they map). The engine's pool takes its blocks
	 * from here when a peer is on such a path; they can still be registered anywhere.
	 */
	int (*mem_alloc)(struct tfab_ep *ep, size_t len, void **addr_p);
	void (*mem_free)(struct tfab_ep *ep, void *addr, size_t len);

	/*
	 * Why probe finds nothing usable, in words, for messages ("no RDMA device: this kernel
	 * has no RDMA support"); an empty string when there is nothing to add. Opens nothing
	 * that stays open.
	 */
	void (*explain)(const struct tfab_config *cfg, char *buf, size_t len);
};

/* Each object's operations, through its backend. */
static inline int tfab_ep_close(struct tfab_ep *ep)
{
	return ep ? ep->ops->close(ep) : 0;
}

static inline void tfab_ep_quiesce(struct tfab_ep *ep)
{
	if (ep && ep->ops->quiesce)
		ep->ops->quiesce(ep);
}

static inline void tfab_ep_expose(struct tfab_ep *ep)
{
	if (ep && ep->ops->expose)
		ep->ops->expose(ep);
}

static inline bool tfab_ep_quiet(struct tfab_ep *ep)
{
	return ep->ops->quiet && ep->ops->quiet(ep);
}

static inline const struct tfab_caps *tfab_ep_caps(const struct tfab_ep *ep)
{
	return ep->ops->caps(ep);
}

static inline int tfab_ep_get_addr(struct tfab_ep *ep, void *buf, size_t *len_p)
{
	return ep->ops->get_addr(ep, buf, len_p);
}

/* A peer's address in words into buf (see addr_str): empty where the backend cannot say. */
static inline void tfab_ep_addr_str(struct tfab_ep *ep, const void *addr, size_t len, char *buf,
				    size_t buflen)
{
	if (buflen)
		buf[0] = '\0';
	if (ep->ops->addr_str && buflen)
		ep->ops->addr_str(ep, addr, len, buf, buflen);
}

static inline int tfab_ep_connect(struct tfab_ep *ep, const void *addr, size_t len,
				  struct tfab_conn **conn_p)
{
	return ep->ops->connect(ep, addr, len, conn_p);
}

static inline int tfab_conn_disconnect(struct tfab_conn *conn)
{
	return conn ? conn->ep->ops->disconnect(conn) : 0;
}

static inline void tfab_conn_cut(struct tfab_conn *conn)
{
	if (conn && conn->ep->ops->cut)
		conn->ep->ops->cut(conn);
}

static inline int tfab_mr_reg(struct tfab_ep *ep, void *addr, size_t len, unsigned access,
			      struct tfab_mr **mr_p)
{
	return ep->ops->mr_reg(ep, addr, len, access, mr_p);
}

static inline int tfab_mr_dereg(struct tfab_mr *mr)
{
	return mr ? mr->ep->ops->mr_dereg(mr) : 0;
}

/* A write on conn's endpoint (see write_imm). */
static inline int tfab_conn_write_imm(struct tfab_conn *conn, const void *lbuf, size_t len,
				      struct tfab_mr *lmr, uint64_t raddr, uint64_t rkey,
				      uint32_t imm, unsigned flags, void *ctx)
{
	return conn->ep->ops->write_imm(conn->ep, conn, lbuf, len, lmr, raddr, rkey, imm, flags,
					ctx);
}

static inline int tfab_ep_poll(struct tfab_ep *ep, struct tfab_event *ev, int max)
{
	return ep->ops->poll(ep, ev, max);
}

/* Stubs for operations a backend lacks: each returns -EOPNOTSUPP. */
int tfab__no_probe(const struct tfab_config *cfg, const char *fabric, tfab_probe_cb cb, void *arg);
int tfab__no_open(const struct tfab_open_args *args, struct tfab_ep **ep_p);
void tfab__no_explain(const struct tfab_config *cfg, char *buf, size_t len);

/* The backends built in, in auto-selection order; NULL-terminated. */
const struct tfab_provider_ops *const *tfab__providers(void);

/* A backend by name, or NULL when it is not built in. */
const struct tfab_provider_ops *tfab__provider_find(const char *name);

/* Names of every backend this code knows, built in or not (for messages). */
extern const char *const tfab__provider_known[];

/* A path's name for caps: "ofi:tcp" for libfabric's "tcp;ofi_rxm", else the backend's. */
void tfab__caps_path_name(const struct tfab_caps *caps, char *buf, size_t len);

/* The most paths (endpoints) a context opens. */
#define TFAB_MAX_PATHS 4

/* A path to open: a backend and its fabric ("" for the backend's first). */
struct tfab_path_choice {
	const struct tfab_provider_ops *ops;
	char fabric[64];
};

/*
 * Resolve TFAB_PROVIDER, an ordered comma-separated list ("shm,ofi:tcp"; "auto" stands for
 * the usable same-host backends, then the first usable network backend, in auto-selection
 * order: shm, verbs, ofi), to the paths to open, at most max, in that
 * order, each once. A named entry that is unusable fails the whole with a message in errbuf.
 */
int tfab__provider_select_list(const struct tfab_config *cfg, struct tfab_path_choice *out, int max,
			       int *n_p, char *errbuf, size_t errlen);

/*
 * Resolve TFAB_PROVIDER (cfg->provider) to a backend and fabric name: the list's first. On failure returns
 * -TFAB_ERR_NO_FABRIC or -TFAB_ERR_CONFIG with a message in errbuf that names the choices
 * available on this machine.
 */
int tfab__provider_select(const struct tfab_config *cfg, const struct tfab_provider_ops **ops_p,
			  char *fabric, size_t fabric_len, char *errbuf, size_t errlen);

/* Select and open in one step. */
int tfab__provider_open(const struct tfab_config *cfg, bool local_only,
			const struct tfab_provider_ops **ops_p, struct tfab_ep **ep_p, char *errbuf,
			size_t errlen);

#endif
