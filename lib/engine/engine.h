/*
 * The protocol engine's internal state: the context, peers with their control channels,
 * receive requests (the receiver's whole cycle) and sends with their responses (the sender's).
 * Everything here is protected by ctx->lock; callbacks are queued and run after it is dropped.
 * The part the world layer (lib/world/) may use is declared apart, in engine_world.h, which
 * this header includes.
 */
#ifndef TFAB_ENGINE_ENGINE_H
#define TFAB_ENGINE_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <tfab/engine.h>
#include <tfab/strings.h>

#include "engine/auth.h"
#include "engine/engine_world.h"
#include "engine/mr_cache.h"
#include "engine/pool.h"
#include "cuda/cuda.h"
#include "engine/wire.h"
#include "providers/provider.h"
#include "util/config.h"
#include "util/freelist.h"
#include "util/hash.h"
#include "util/list.h"
#include "util/time.h"

/* What a write's context points at: the first member of each such object. */
enum tfab_wctx_kind {
	TFAB_WCTX_CTRL = 1, /* an outbox slot */
	TFAB_WCTX_CONTENT,  /* a send's content write */
	TFAB_WCTX_CREDIT,   /* a credit return (peer->credit_w) */
	TFAB_WCTX_INJECTED, /* content written by inject (peer->inject_w): only failures */
};

struct tfab_wctx {
	enum tfab_wctx_kind kind;
};

/* A control message waiting for credit or a free outbox slot. */
struct tfab_pending_msg {
	struct tfab_list link;
	size_t len;
	uint8_t bytes[];
};

struct tfab_outbox_slot {
	struct tfab_wctx w; /* TFAB_WCTX_CTRL */
	struct tfab_peer *peer;
	bool busy;
};

/* Cached meta-data of one key from one peer. */
struct tfab_meta_entry {
	struct tfab_hnode node; /* its peer's meta, by key */
	struct tfab_list lru;	/* ctx->meta_lru: the least recently used first */
	struct tfab_peer *peer;
	struct tfab_wire_meta meta;
	uint32_t key_index;	/* the name we announced to the peer for it, or 0 (key_index.c) */
	struct tfab_list ahead; /* its standing requests (no-request mode), by step */
	uint16_t key_len;
	char key[];
};

/*
 * One path: an open endpoint of one backend (and fabric), with the registrations made on it.
 * A context opens one per entry of TFAB_PROVIDER; each peer goes over one of them.
 */
struct tfab_path {
	struct tfab_ep *ep;
	const struct tfab_caps *caps;
	struct tfab_mr_cache *mr_cache;
	unsigned index;				/* in ctx->paths, and the pool's */
	char name[TFAB_WIRE_MAX_PATH_NAME + 1]; /* "shm", "verbs", "ofi:tcp" */
	uint64_t peers;				/* connected over it, ever */
};

/*
 * A request we cancelled, whose content the peer may still write (it wrote before it read the
 * CANCEL): such a write is no lie until the peer's credits cover the CANCEL.
 */
struct tfab_cancelled {
	uint32_t index;
	uint32_t seq; /* forgotten once tx_acked reaches it */
};

/* A cancelled request's pool destination, until the peer's verdict (tfab__peer_hold_dest). */
struct tfab_held_dest {
	void *buf;
	uint32_t seq; /* back to the pool once tx_acked reaches it */
};

/*
 * Leaving a live peer waits for it to read our CANCELs (tfab_peer_destroy, destroying the
 * context), but no longer than this without a credit from it: one cut off or stopped never
 * answers, and the leave must not hold back the failures it reports.
 */
#define TFAB_LEAVE_QUIET_MS 100
/* How long a thread that waits and found nothing to do lets others have the lock and core. */
#define TFAB_IDLE_PAUSE_US 20

/*
 * The clock of such a wait (one peer's leave, or every peer's at the context's end): a bound
 * in all, and the quiet bound, renewed whenever the count of credits seen (any count that
 * moves as credits come) moved since the last look.
 */
struct tfab_leave_clock {
	uint64_t deadline, quiet, credits;
};

static inline void tfab__leave_clock_start(struct tfab_leave_clock *c, uint64_t now_ms,
					   uint64_t bound_ms, uint64_t credits)
{
	c->deadline = now_ms + bound_ms;
	c->quiet = now_ms + TFAB_LEAVE_QUIET_MS;
	c->credits = credits;
}

/* At now_ms, with `credits` seen so far: whether CANCELs are still worth waiting for. */
static inline bool tfab__leave_clock_hopeful(struct tfab_leave_clock *c, uint64_t now_ms,
					     uint64_t credits)
{
	if (credits != c->credits) {
		c->credits = credits;
		c->quiet = now_ms + TFAB_LEAVE_QUIET_MS;
	}
	return now_ms < c->quiet;
}

/* Room for a peer's address in words, and for its name in messages (tfab__peer_name). */
#define TFAB_PEER_ADDR_LEN 96
#define TFAB_PEER_NAME_LEN (TFAB_PEER_ADDR_LEN + TFAB_WIRE_MAX_PATH_NAME + 32)

struct tfab_peer {
	struct tfab_context *ctx;
	struct tfab_list link; /* ctx->peers */
	uint32_t id;	       /* ours: the peer writes it into its immediates to us */
	/*
	 * Its address in words: host:port of its bootstrap connection, else the backend's
	 * (addr_str of providers.md), else empty; and its name in messages, "peer 3 at
	 * 127.0.0.1:4000 over ofi:tcp" (tfab__peer_name).
	 */
	char addr[TFAB_PEER_ADDR_LEN];
	char name[TFAB_PEER_NAME_LEN];
	uint32_t remote_id;	/* the peer's id for us */
	struct tfab_path *path; /* the path it is on, once connected */
	struct tfab_conn *conn;
	bool connected;
	bool blob_out;	       /* our blob (every path's address and keys) went out for it */
	int failed;	       /* 0, or the status its operations fail with */
	int sock;	       /* bootstrap connection watched for the peer's death, or -1 */
	uint64_t inflight;     /* bytes of pool destinations its requests hold */
	uint64_t closed_at_ms; /* when the bootstrap connection closed, or 0 */
	uint64_t heard_ms;     /* when its last heartbeat came, or 0 before the first */
	bool said_bye;	       /* its goodbye came on that connection: it destroyed us */
	/* Our inbox: the peer writes messages into it. */
	uint8_t *inbox;
	size_t rings_len;	  /* bytes of the inbox, and of the outbox */
	struct tfab_ep *mem_ep;	  /* whose mem_alloc they came from, or NULL: the heap */
	struct tfab_mr *inbox_mr; /* on the peer's path, once connected */
	struct tfab_mr *inbox_mrs[TFAB_MAX_PATHS]; /* until then, on every path */
	uint32_t rx_next;	/* next sequence number of the contiguous prefix */
	uint32_t rx_unreturned; /* consumed, credit not yet returned */
	/*
	 * One past the slot of the last CANCEL read: credits up to it go back at the next flush,
	 * not by the batch (its writer waits for them to let a destination go, or to leave).
	 */
	uint32_t credit_due_seq;
	uint8_t *rx_consumed; /* per slot: consumed out of order */
	/* Our outbox: the source of our messages to the peer. */
	uint8_t *outbox;
	struct tfab_mr *outbox_mr;
	struct tfab_mr *outbox_mrs[TFAB_MAX_PATHS];
	struct tfab_outbox_slot *oslots;
	uint32_t tx_seq;	  /* next message number */
	uint32_t tx_acked;	  /* credits returned by the peer, cumulative */
	struct tfab_list pending; /* struct tfab_pending_msg */
	/* The peer's inbox. */
	uint64_t remote_raddr, remote_rkey;
	uint32_t remote_slots, remote_slot_size;
	struct tfab_htable meta;	   /* struct tfab_meta_entry by key */
	struct tfab_meta_entry *meta_last; /* the one found last: a fetch looks it up 2-3 times */
	struct tfab_list requests;	   /* struct tfab_request, ours to this peer */
	/*
	 * The peer's requests we hold, by request index (struct tfab_response, inode): parked
	 * ones, and those a send has answered with content (or a complete META_DATA) and whose
	 * verdict, TAKEN or CANCEL, has not come.
	 */
	struct tfab_htable answers;
	/*
	 * Our requests a receive completed: the next TAKEN message reports them. taken_gen: the
	 * progress call in which the first of them completed.
	 */
	uint32_t *taken;
	uint32_t ntaken, taken_cap;
	uint64_t taken_gen;
	/*
	 * All of them are for requests posted ahead (no-request mode): they wait for a control
	 * write that goes anyway, at the latest until taken_due_ns.
	 */
	bool taken_lazy;
	uint64_t taken_due_ns;
	struct tfab_htable ahead_keys; /* struct tfab_ahead_key by key (tfab_recv_ahead) */
	/*
	 * Pool destinations of requests we cancelled, which the peer may still be writing
	 * into: each held until the peer's credits show it consumed the CANCEL (tfab__peer_hold).
	 */
	struct tfab_held_dest *held_dests;
	uint32_t nheld_dests, held_dests_cap;
	/*
	 * Our receives into the application's own memory that gave up while the peer could
	 * still write into it (struct tfab_request, TFAB_REQ_CANCELLING, by link): each ends once
	 * the peer's credits cover its CANCEL, or with the peer (tfab__peer_hold_request).
	 */
	struct tfab_list cancelling;
	/*
	 * Our requests to the peer we cancelled, in seq order, until its credits cover the
	 * CANCEL (tfab__peer_cancelled); cancelled_lost: one could not be recorded, so a write
	 * for a request of the peer's that is gone is dropped rather than refused.
	 */
	struct tfab_cancelled *cancelled;
	uint32_t ncancelled, cancelled_cap;
	bool cancelled_lost;
	/* Its endpoint (path and address): peers of one remote endpoint are told apart by ids. */
	uint64_t endpoint_hash;
	/*
	 * Key indexes (key_index.c): the last we announced, ours retired and not yet told, and
	 * the names the peer announced (struct tfab_key_name by index).
	 */
	uint32_t next_key_index;
	uint32_t *retired;
	uint32_t nretired, retired_cap;
	struct tfab_htable key_names;
	unsigned users; /* in-flight writes to this peer not yet completed */
	bool zombie;	/* freed by the application with users: on ctx->zombies until they end */
	/*
	 * Failed with requests of ours out, or CANCELs of ours it had not read: it may stop in
	 * the middle of a write to us.
	 */
	bool cut;
	/*
	 * LEAVE (protocol.md): ours went (leave_sent: nothing more is written to the peer);
	 * the peer's came in slot leave_seq (leave_due), and once every slot before it was read,
	 * it has left (left): it writes nothing more, and all it wrote has landed.
	 */
	bool leave_sent, leave_due, left;
	uint32_t leave_seq;
	struct tfab_wctx credit_w; /* TFAB_WCTX_CREDIT: context of credit returns */
	struct tfab_wctx inject_w; /* TFAB_WCTX_INJECTED: of content written by inject */
};

enum tfab_req_state {
	TFAB_REQ_REQUESTED = 1, /* a request is out; content or meta-data will come */
	TFAB_REQ_LANDED,	/* standing, and its content landed: it waits for its receive */
	/*
	 * Given up with the application's memory as the destination, which the peer may still
	 * be writing: it ends when the peer has read the CANCEL (peer->cancelling)
	 */
	TFAB_REQ_CANCELLING,
	TFAB_REQ_DONE,
};

/* A blocking receive's result, written under the lock when its request ends. */
struct tfab_sync_wait {
	bool done;
	int status;
	DLManagedTensor *tensor;
	struct tfab_string_tensor *strings;
	bool is_dead;
};

/* The receiver's cycle for one receive. */
struct tfab_request {
	struct tfab_list link;	    /* peer->requests */
	struct tfab_list done_link; /* ctx->done */
	struct tfab_context *ctx;
	uint32_t index;
	struct tfab_peer *peer;
	int64_t step;
	uint16_t key_len;
	DLTensor *user_dest;
	unsigned flags; /* TFAB_RECV_* */
	bool meta_valid;
	uint8_t meta_replies; /* META_DATA replies without COMPLETE (TFAB_MAX_META_REPLIES) */
	/* the destination */
	void *dest;
	size_t dest_cap;
	struct tfab_mr *dest_mr;
	bool dest_pool;
	void *dest_owner; /* a pool block's holder storage: its managed tensor goes there */
	void *gpu_dest;	  /* a GPU destination: dest is its host proxy, copied in at the end */
	enum tfab_req_state state;
	int status;
	bool is_dead;
	DLManagedTensor *out;
	bool view_due;	 /* done into the caller's tensor: out is its view, made when handed out */
	tfab_recv_cb cb; /* NULL for a blocking receive */
	/* a string tensor's receive (tfab_recv_strings): these instead of cb and out */
	bool strings;
	tfab_recv_strings_cb scb;
	struct tfab_string_tensor *sout;
	void *arg;
	struct tfab_sync_wait *sync; /* a blocking receive's waiter, until the request ends */
	/*
	 * Posted ahead (no-request mode): standing while no receive owns it yet, on its key's
	 * meta-data entry (ahead_link); its TAKEN waits for a write that goes anyway.
	 */
	bool standing;
	bool lazy_taken;
	struct tfab_list ahead_link;
	uint64_t since_ms; /* TFAB_OP_TIMEOUT_MS counts from here: posted, the last answer, or
			      the CANCEL of a request cancelling */
	uint32_t
	    cancel_seq; /* cancelling: the slot of its CANCEL, which the peer's credits cover */
	/* The large members last: a new request zeroes only what comes before them. */
	struct tfab_wire_meta meta; /* what the destination was sized for */
	char key[TFAB_MAX_KEY + 1];
};

enum tfab_send_state {
	TFAB_SEND_WAITING = 1, /* offered, no matching request yet (or meta-data sent) */
	TFAB_SEND_WRITING,     /* content write posted or queued */
	TFAB_SEND_ANSWERED,    /* written (or complete from meta-data): the verdict is due */
	TFAB_SEND_DONE,
};

struct tfab_send;

/* A request a peer sent us that waits for its send (parked), or is being answered. */
struct tfab_response {
	struct tfab_hnode node;	 /* ctx->parked by (key, step), while parked */
	struct tfab_hnode inode; /* peer->answers by req_index, while parked or answered */
	struct tfab_send *send;	 /* the send answering it, or NULL while parked */
	struct tfab_peer *peer;
	uint32_t req_index;
	uint16_t flags;
	int64_t step;
	uint64_t dest_raddr, dest_rkey, dest_capacity;
	struct tfab_wire_meta meta;
	uint16_t key_len;
	char key[TFAB_MAX_KEY + 1];
};

/* The sender's side of one send. */
struct tfab_send {
	struct tfab_wctx w;	    /* TFAB_WCTX_CONTENT */
	struct tfab_hnode node;	    /* ctx->sends by (key, step) */
	struct tfab_list link;	    /* ctx->writes_pending while queued for -EAGAIN */
	struct tfab_list done_link; /* ctx->done */
	struct tfab_list live_link; /* ctx->sends_live until it no longer reads data */
	uint64_t seq;		    /* in posting order, for tfab_flush */
	struct tfab_peer *to;	    /* the one peer it is for, or NULL for any */
	int64_t step;
	uint16_t key_len;
	void *data;
	bool data_pool; /* data is a pool block of ours (a serialized tensor), mr its region */
	struct tfab_mr *mr;
	enum tfab_send_state state;
	bool in_flight;	      /* a content write is posted and not completed */
	bool orphan;	      /* failed while in flight: freed when the write completes */
	bool taken;	      /* TAKEN came before the write's completion */
	bool cancelled;	      /* CANCEL came while writing: offered again once the write is done */
	bool tracked;	      /* resp is in its peer's answers */
	int write_err;	      /* the first failure among the writes of this answer */
	uint64_t answered_ms; /* since when the verdict is due (TFAB_OP_TIMEOUT_MS) */
	/* TFAB_SEND_BOUNDED: its wait for a request is bounded too, from waiting_ms */
	bool bounded;
	uint64_t waiting_ms; /* since when it is TFAB_SEND_WAITING */
	/* A GPU source through a host proxy (data is on the GPU, mr the proxy's region). */
	bool gpu;
	void *proxy;
	void **chunk_copy;	     /* per chunk: its copy to the proxy while it runs, else NULL */
	uint32_t nchunks;	     /* 0 until staging starts */
	uint32_t posted;	     /* chunks written or being written */
	unsigned writes_out;	     /* chunk writes not completed */
	struct tfab_list stage_link; /* ctx->staging while chunks wait for their copies */
	int status;
	tfab_send_cb cb;
	void *arg;
	/*
	 * The large members last: a new send zeroes only what comes before meta, and the head
	 * of resp (tfab__send_start), not kilobytes of key and shape.
	 */
	struct tfab_wire_meta meta;
	struct tfab_response resp; /* the request being answered, while WRITING */
	char key[TFAB_MAX_KEY + 1];
};

#define TFAB_POLL_EVENTS 64 /* events one poll of a path takes */

struct tfab_context {
	pthread_mutex_t lock;
	struct tfab_config cfg;
	struct tfab_path paths[TFAB_MAX_PATHS]; /* in TFAB_PROVIDER's order */
	unsigned npaths;
	struct tfab_pool *pool;
	struct tfab_list peers;
	struct tfab_list zombies; /* peers freed with writes in flight (tfab__peer_free) */
	uint32_t next_peer_id;
	struct tfab_peer **peer_by_id; /* by our id */
	uint32_t peer_cap;
	/* receive requests by index: slot in the low 20 bits, generation above */
	struct tfab_request **reqs;
	uint16_t *req_gen;
	uint32_t *req_owner; /* per slot: the id of the peer of its latest request */
	uint32_t *req_free;
	uint32_t req_cap, req_nfree;
	/* sends by (key, step), and requests that came before their send */
	struct tfab_htable sends;
	struct tfab_freelist send_fl;	 /* struct tfab_send, taken and put under the lock */
	struct tfab_freelist parked_fl;	 /* struct tfab_response (parked), the same way */
	struct tfab_freelist req_fl;	 /* struct tfab_request, the same way */
	struct tfab_htable parked;	 /* struct tfab_response by (key, step) */
	struct tfab_list writes_pending; /* content writes that met -EAGAIN */
	struct tfab_list staging;	 /* GPU sends whose chunks are being staged */
	struct tfab_cuda *cuda;		 /* copies for GPU tensors, or NULL */
	bool cuda_tried;		 /* tfab__cuda_open ran (at the first GPU tensor) */
	struct tfab_list done_reqs;	 /* requests whose callbacks are due */
	struct tfab_list done_sends;	 /* sends whose callbacks are due */
	struct tfab_list sends_live;	 /* sends not yet settled, in posting order */
	uint64_t send_seq;		 /* the last send's seq */
	unsigned flushers;		 /* threads in tfab_flush waiting on cond */
	uint64_t orphans;		 /* failed sends whose writes are still in flight */
	int abort_status; /* set once, atomically (read unlocked: tfab__ctx_aborted) */
	int listen_fd;
	/*
	 * Connections to listen_fd in their bootstrap handshakes (handshake.h), many at once,
	 * kept from one tfab_accept to the next; accept_lock serialises the calls that move
	 * them (tfab_accept, and the liveness checks' reaping of those past their deadline).
	 */
	pthread_mutex_t accept_lock;
	struct tfab_hs_set *accepts;
	uint64_t next_liveness_ms;
	struct tfab_heartbeat *heartbeat; /* TFAB_HEARTBEAT_MS, or NULL for none */
	uint8_t auth_key[256]; /* TFAB_AUTH_KEY(_FILE): auth_key_len bytes, 0 when unset */
	size_t auth_key_len;
	uint64_t inflight_limit; /* TFAB_PEER_MAX_INFLIGHT resolved: UINT64_MAX for none */
	uint64_t progress_gen;	 /* progress calls so far */
	/*
	 * The last progress call found nothing and left nothing to do, and nobody has taken the
	 * lock since (tfab__ctx_lock clears it): the next call needs only to see its paths quiet
	 * (tfab_ep_quiet) and no deadline due, not to run the whole of progress (tfab_progress).
	 */
	bool quiet;
	/* Every peer's meta-data cache entries, least recently used first; at most the bound. */
	struct tfab_list meta_lru;
	size_t meta_count;
	/* Control messages a progress call held back (tfab__progress_locked). */
	struct tfab_event held[TFAB_POLL_EVENTS];
	uint32_t held_src[TFAB_POLL_EVENTS]; /* their writers' peer ids (TFAB_NO_PEER: unknown) */
	unsigned nheld;
	struct tfab_stats stats;
	uint64_t managed_out; /* library-allocated tensors the application holds */
	pthread_t progress_thread;
	bool thread_running, thread_stop;
	/* The thread running callbacks (see tfab__ctx_unlock), while cb_depth > 0. */
	pthread_t cb_thread;
	unsigned cb_depth;   /* its nested deliveries */
	pthread_cond_t cond; /* broadcast when a blocking receive's request ends, or a send
				settles while someone flushes, or a kick ends */
	/* The world's collectives (tfab__ctx_set_coll): their hooks, whether a kick is due, kicks running. */
	const struct tfab_coll_hooks *coll;
	void *coll_arg;
	bool coll_due;
	bool coll_left; /* a world was left: a late COLL_DATA is dropped, not refused */
	unsigned coll_kicking;
	struct tfab_coll_counts coll_counts; /* kept by the world's collectives */
};

/* heartbeat.c: the thread that writes a heartbeat to every bootstrapped peer */
struct tfab_heartbeat;
/* NULL in *hb_p for interval 0 (none); the thread starts with the first peer. */
int tfab__heartbeat_open(unsigned interval_ms, struct tfab_heartbeat **hb_p);
void tfab__heartbeat_close(struct tfab_heartbeat *hb);
int tfab__heartbeat_add(struct tfab_heartbeat *hb, int fd);
/* Before the socket closes. */
void tfab__heartbeat_remove(struct tfab_heartbeat *hb, int fd);
/* Tells the other side of a bootstrap connection that we destroy the peer (before its end). */
void tfab__heartbeat_bye(int fd);
/*
 * Reads what came on a bootstrap connection, without waiting: heartbeats, a goodbye, or its
 * end. Where beats came, *heard_ms_p (in: the last one's, or 0) gets when the last of them
 * arrived, in tfab__coarse_ms's clock, as the kernel stamped it; where the goodbye came,
 * *bye_p is set. Whether the connection has ended.
 */
bool tfab__heartbeat_hear(int fd, uint64_t *heard_ms_p, bool *bye_p);
/*
 * When a beat stamped stamp_ns (CLOCK_REALTIME) arrived, in tfab__coarse_ms's clock, read at
 * now_ms (that clock) and real_now_ns; now_ms where that would come before floor_ms (the beat
 * before it: the wall clock stepped meanwhile, or the stamp is of another clock).
 */
uint64_t tfab__heartbeat_arrival_ms(uint64_t now_ms, uint64_t real_now_ns, uint64_t stamp_ns,
				    uint64_t floor_ms);

/* context.c */
int tfab__progress_locked(struct tfab_context *ctx);
/*
 * One turn of a wait made with the lock held (a blocking receive, a flush, a peer's leave): a
 * progress call, then the lock let go, for pause_us microseconds if it found nothing (0: not
 * at all), and taken back. The callbacks it made due run meanwhile, and other threads' calls
 * get in: a wait of seconds must not hold every other thread of the application up.
 */
int tfab__progress_turn(struct tfab_context *ctx, unsigned pause_us);

/*
 * The polling policy of a thread that waits (TFAB_SPIN_US for a blocking receive,
 * TFAB_PROGRESS_SPIN_US for the progress thread): it polls without a pause for spin_us after
 * its last poll that found work, then pauses TFAB_IDLE_PAUSE_US at each poll that finds
 * nothing. tfab__spin_pause says, given whether the last poll found work, how long to pause
 * at the next idle one (0: none).
 */
struct tfab_spin {
	uint64_t spin_ns;  /* TFAB_SPIN_US, in ns */
	uint64_t until_ns; /* polling without a pause until then */
};

static inline void tfab__spin_init(struct tfab_spin *s, unsigned spin_us)
{
	s->spin_ns = (uint64_t)spin_us * 1000;
	s->until_ns = 0; /* the window opens at the first poll that finds nothing */
}

static inline unsigned tfab__spin_pause(struct tfab_spin *s, bool found_work)
{
	if (found_work) {
		/* the clock only where a pause would come soon: a busy loop reads it rarely */
		s->until_ns = 0;
		return 0;
	}
	uint64_t now = tfab__now_ns();

	if (!s->until_ns)
		s->until_ns = now + s->spin_ns;
	return now < s->until_ns ? 0 : TFAB_IDLE_PAUSE_US;
}
/* Dispatch the control messages a progress call held back; how many. */
int tfab__held_dispatch(struct tfab_context *ctx);
/* With the lock held: wait for a broadcast of ctx->cond, at most until deadline (ms). */
void tfab__cond_wait_until(struct tfab_context *ctx, uint64_t deadline);

/* path.c */
/* Open the paths TFAB_PROVIDER names (ctx->cfg), in its order; on failure says why in err. */
int tfab__paths_open(struct tfab_context *ctx, char *err, size_t errlen);
/* Close them; -EBUSY (leaving them) while registrations remain. */
int tfab__paths_close(struct tfab_context *ctx);
/* The path whose endpoint is ep (a region's mr->ep), or NULL. */
struct tfab_path *tfab__path_of_ep(struct tfab_context *ctx, const struct tfab_ep *ep);
/* The registration cache a region of it came from. */
static inline struct tfab_mr_cache *tfab__mr_cache_of(struct tfab_context *ctx,
						      const struct tfab_mr *mr)
{
	return tfab__path_of_ep(ctx, mr->ep)->mr_cache;
}
/* This host's identity, as the connection blob carries it (NUL-terminated). */
const char *tfab__host_id(void);
/*
 * The path a pair takes, the same on both sides (doc/protocol.md): the index of ours in
 * ctx->paths, with the peer's entry for it in *their_path_p; or -TFAB_ERR_NO_FABRIC with
 * both lists in why.
 */
int tfab__path_choose(struct tfab_context *ctx, const struct tfab_wire_blob *theirs,
		      const struct tfab_wire_path **their_path_p, char *why, size_t whylen);

/* peer.c */
void tfab__peer_fail(struct tfab_peer *peer, int status);
/*
 * The same, saying why in the warning (NULL: nothing more to say): "its bootstrap connection
 * closed", "no heartbeat for 1500 ms". The warning names the peer and the operations that fail
 * with it.
 */
void tfab__peer_fail_why(struct tfab_peer *peer, int status, const char *why);
/* The peer in messages: "peer 3 at 127.0.0.1:4000 over ofi:tcp" (its id, address and path). */
static inline const char *tfab__peer_name(const struct tfab_peer *peer)
{
	return peer->name;
}
/*
 * Operations named in a message: the first few as "'key' step N", separated by commas, then
 * how many more (tfab__op_names_add, tfab__op_names_end).
 */
struct tfab_op_names {
	char buf[320];
	size_t len;
	unsigned n;
	char out[320 + 32];
};
void tfab__op_names_add(struct tfab_op_names *o, const char *key, int64_t step);
/* " ('a' step 1, 'b' step 2 and 3 more)", or "" for none. */
const char *tfab__op_names_end(struct tfab_op_names *o);
/* Our LEAVE to the peer, the last thing we write to it (queued behind what waits for credit). */
void tfab__peer_send_leave(struct tfab_peer *peer);
/*
 * The status of a failed write to the peer: -TFAB_ERR_REMOTE_ACCESS while the peer is there
 * (it refused one region), else -TFAB_ERR_PEER_FAILED, whatever the fabric called it.
 */
int tfab__peer_write_status(struct tfab_peer *peer, int status);
/* A write to the peer failed: the peer fails, with the status above. */
void tfab__peer_write_failed(struct tfab_peer *peer, int status);
/* No peer: a write whose source the backend cannot tell. */
#define TFAB_NO_PEER UINT32_MAX
/* A control write with immediate imm from peer src (TFAB_NO_PEER: take the immediate's word). */
void tfab__peer_on_ctrl(struct tfab_context *ctx, uint32_t imm, uint32_t src);
/*
 * The peer sent what the protocol refuses: counted (stats.refused), logged with what, and the
 * peer (only) fails with TFAB_ERR_PROTOCOL.
 */
void tfab__peer_refuse(struct tfab_peer *peer, const char *what);
/* Two peers reach the same remote endpoint (its writes cannot say which of them wrote). */
bool tfab__peer_same_endpoint(const struct tfab_peer *a, const struct tfab_peer *b);
/* Our request index to the peer was cancelled (its CANCEL sent or queued). */
void tfab__peer_cancelled(struct tfab_peer *peer, uint32_t index);
/* Whether a write from the peer for index is one it may make: a request of ours cancelled. */
bool tfab__peer_was_cancelled(const struct tfab_peer *peer, uint32_t index);
void tfab__peer_on_write_done(struct tfab_outbox_slot *slot, int status);
/*
 * Our receive of the peer's request completed: a TAKEN tells the peer (peers_flush sends it).
 * lazy: it may wait for a control write that goes anyway, TFAB_NO_REQUEST_TAKEN_US at most.
 */
int tfab__peer_taken(struct tfab_peer *peer, uint32_t req_index, bool lazy);
/*
 * buf, the pool destination of a request just cancelled (its CANCEL sent or queued), may
 * still be written by the peer: it goes back to the pool once the peer's credits cover the
 * CANCEL (the peer read it, and wrote before that: writes on a connection land in order),
 * or, with the peer, discarded. Never fails: without memory to hold it, it is discarded.
 */
void tfab__peer_hold_dest(struct tfab_peer *peer, void *buf);
/*
 * r, a receive into the application's memory just cancelled (its CANCEL sent or queued), may
 * still be written by the peer: it stays registered, and r ends (tfab__request_cancelled) once
 * the peer's credits cover the CANCEL, or with the peer, or past TFAB_OP_TIMEOUT_MS.
 */
void tfab__peer_hold_request(struct tfab_peer *peer, struct tfab_request *r);
/* Queue m behind the messages waiting: the next flush writes them, several to a slot. */
int tfab__peer_queue_msg(struct tfab_peer *peer, const struct tfab_wire_msg *m);
void tfab__peers_check_liveness(struct tfab_context *ctx);
/* The bootstrap's handshakes to listen_fd (ctx->accepts): made with the context, ended with it. */
int tfab__accepts_open(struct tfab_context *ctx);
void tfab__accepts_close(struct tfab_context *ctx);
/* Frees the peer, or, while writes of ours to it are in flight, what they do not use. */
void tfab__peer_free(struct tfab_peer *peer);
/* A write to the peer completed: the last of a freed peer's frees the rest. */
void tfab__peer_unuse(struct tfab_peer *peer);
/* At the context's end, once no write can complete: what freed peers kept. */
void tfab__peers_release_zombies(struct tfab_context *ctx);
struct tfab_meta_entry *tfab__peer_meta_find(struct tfab_peer *peer, const char *key,
					     uint16_t key_len);
int tfab__peer_meta_store(struct tfab_peer *peer, const char *key, uint16_t key_len,
			  const struct tfab_wire_meta *meta);

/* key_index.c */
/*
 * The most names one peer may have announced and not retired: the largest meta-data cache
 * (TFAB_META_CACHE_ENTRIES) and one RETIRE message's worth not yet sent.
 */
#define TFAB_MAX_KEY_NAMES ((1u << 26) + TFAB_WIRE_MAX_TAKEN)
/* A request of ours for e's key (e: its meta-data entry, or NULL): its index, or its name and
 * a new index, when TFAB_KEY_INDEX is on. */
void tfab__key_index_request(struct tfab_peer *peer, struct tfab_meta_entry *e,
			     struct tfab_wire_msg *m);
/* e leaves the cache: its index is retired (told in full RETIRE messages). */
void tfab__key_index_drop(struct tfab_peer *peer, struct tfab_meta_entry *e);
void tfab__key_index_flush(struct tfab_peer *peer);
/* A request in: learn the name it announces, or find the one its index names (m->key). */
int tfab__key_index_resolve(struct tfab_peer *peer, struct tfab_wire_msg *m);
void tfab__key_index_on_retire(struct tfab_peer *peer, const struct tfab_wire_msg *m);
void tfab__key_index_free(struct tfab_peer *peer);

/* ahead.c */
/* How many requests receives of the key from peer keep standing ahead (0: none). */
unsigned tfab__ahead_depth(struct tfab_peer *peer, const char *key, uint16_t key_len);
void tfab__ahead_free(struct tfab_peer *peer);

/*
 * TFAB_OP_TIMEOUT_MS (called with the liveness checks): receives from peer that got nothing
 * from it, and sends whose verdict has not come, for that long fail with TFAB_ERR_TIMEOUT.
 */
void tfab__recv_deadlines(struct tfab_peer *peer, uint64_t now_ms);
void tfab__send_deadlines(struct tfab_context *ctx, uint64_t now_ms);

/* strings.c */
/* The destination a string tensor last nbytes long gets: TFAB_STRINGS_HEADROOM more. */
uint64_t tfab__strings_capacity(const struct tfab_context *ctx, uint64_t nbytes);
/* Content landed for string receive r: its size, from its length (checked against the room). */
int tfab__strings_landed(struct tfab_request *r, uint64_t *nbytes_p);

/* recv.c */
/* The blocking receive of either kind (a->cb and a->scb NULL). */
int tfab__recv_wait(struct tfab_context *ctx, struct tfab_peer *peer, const char *key, int64_t step,
		    const struct tfab_recv_args *a, int timeout_ms, DLManagedTensor **tensor_p,
		    struct tfab_string_tensor **strings_p, bool *is_dead_p);
/*
 * The most META_DATA replies (without COMPLETE) one request takes: an honest sender's tensor
 * is fixed per step, so it needs one; more is a storm, and the peer is refused.
 */
#define TFAB_MAX_META_REPLIES 4
/* Content for request index landed, len bytes, written by peer src (TFAB_NO_PEER: unknown). */
void tfab__recv_on_content(struct tfab_context *ctx, uint32_t index, uint64_t len, uint32_t src);
void tfab__recv_on_msg(struct tfab_peer *peer, const struct tfab_wire_msg *m);
void tfab__request_fail(struct tfab_request *r, int status, bool tell_sender);
/*
 * A cancelling request ends with the status it gave up with. revoke: the peer may still write
 * (it failed, or did not read the CANCEL in time): the destination's registration goes.
 */
void tfab__request_cancelled(struct tfab_request *r, bool revoke);
void tfab__request_release(struct tfab_request *r);
/* e leaves the cache: its standing requests are cancelled. */
void tfab__ahead_drop(struct tfab_meta_entry *e);

/* send.c */
void tfab__send_on_request(struct tfab_peer *peer, const struct tfab_wire_msg *m);
void tfab__send_on_cancel(struct tfab_peer *peer, uint32_t req_index);
/* The peer's receive took what we wrote for its request: the send is delivered. */
void tfab__send_on_taken(struct tfab_peer *peer, uint32_t req_index);
void tfab__send_on_write_done(struct tfab_send *s, int status);
void tfab__sends_retry(struct tfab_context *ctx);
/*
 * At destroy, once writes to live peers have drained: the sends whose writes are still in
 * flight (to dead peers) let go of their registrations and are freed; closing the endpoint
 * ends the writes. Returns how many.
 */
unsigned tfab__sends_abandon(struct tfab_context *ctx);
/* Write the chunks of GPU sends whose copies to host memory finished. */
void tfab__sends_stage(struct tfab_context *ctx);
/* The sends answering peer, and those for it alone, fail (those it took end delivered). */
void tfab__sends_fail_peer(struct tfab_context *ctx, struct tfab_peer *peer, int status);
/*
 * Sends that fail with the peer: those answering it (not those it took), and those for it;
 * named into names where it is not NULL.
 */
unsigned tfab__sends_bound(struct tfab_context *ctx, struct tfab_peer *peer,
			   struct tfab_op_names *names);
void tfab__sends_cleanup(struct tfab_context *ctx, bool all, int64_t step, int status);

uint64_t tfab__send_hash(const char *key, uint16_t key_len, int64_t step);
/* Offer data with meta under (key, step), to peer `to` alone or (NULL) to any. */
int tfab__send_start(struct tfab_context *ctx, struct tfab_peer *to, const char *key, int64_t step,
		     const struct tfab_wire_meta *meta, void *data, unsigned flags, tfab_send_cb cb,
		     void *arg);
/* Free a finished send and what it owns, under the lock. */
void tfab__send_free(struct tfab_context *ctx, struct tfab_send *s);

/* strings.c */
/* A string request's content (or its absence) became its tensor; 0 or a status. */
int tfab__strings_complete(struct tfab_request *r, const void *content, uint64_t nbytes);

/* tensor.c */
/*
 * A step of the application's: 0 or more, else -EINVAL, logged naming what (the call) and key
 * (or none). The world's collectives number theirs from INT64_MIN up (doc/world.md): they go
 * through the internal entry points, which take any step.
 */
int tfab__check_step(const char *what, const char *key, int64_t step);
/* A key's length: 1..512 bytes, else -EINVAL or -ENAMETOOLONG. */
int tfab__check_key(const char *key, size_t *len_p);
uint64_t tfab__meta_nbytes(const struct tfab_wire_meta *meta, bool *overflow_p);
/* The dtype of meta in words (tfab_dtype_name; "string" for a string tensor's). Returns buf. */
const char *tfab__meta_dtype_name(const struct tfab_wire_meta *meta, char *buf, size_t len);
/*
 * The DLManagedTensor that hands data (a pool block, or NULL) to the application, with meta's
 * dtype and shape; in owner, the block's holder storage (tfab__pool_alloc_owned), where given.
 */
DLManagedTensor *tfab__managed_new(struct tfab_context *ctx, const struct tfab_wire_meta *meta,
				   void *data, void *owner);
/* A view of the caller's tensor dest with meta's shape: its deleter frees the view alone. */
DLManagedTensor *tfab__view_new(const struct tfab_wire_meta *meta, const DLTensor *dest);

#define TFAB_ENGINE_SUBSYS "engine"

#endif
