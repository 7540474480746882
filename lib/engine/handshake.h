/*
 * Bootstrap handshakes, many at once (doc/security.md, "Who can connect"). Each connection of
 * the TCP bootstrap, in either role, is a state machine that poll() moves on and that never
 * blocks, with a deadline of its own (TFAB_HANDSHAKE_TIMEOUT_MS on the listening side), so
 * that a connection that is silent, slow, sends garbage or holds another key delays no other.
 * The authentication (auth.c) runs first; then the owner's messages (a peer's connection
 * blobs, peer.c; a world's records, lib/world/world.c), each followed by its tag where a key
 * is set.
 *
 * A set is not thread-safe: its owner serialises the calls (tfab_accept holds
 * ctx->accept_lock).
 */
#ifndef TFAB_ENGINE_HANDSHAKE_H
#define TFAB_ENGINE_HANDSHAKE_H

#include <poll.h>

#include "engine/auth.h"
#include "util/list.h"
#include "util/sock.h"

struct tfab_context;

/* Handshakes at once in a set; further connections wait in the listen queue. */
#define TFAB_HS_MAX 512
/* How long a refusal may take to reach the peer (and an answer to go out) after it is made. */
#define TFAB_HS_LINGER_MS 1000
/* How soon a wait in tfab__hs_drive sees tfab_abort: it polls no longer at a time. */
#define TFAB_HS_ABORT_POLL_MS 100

enum tfab_hs_state {
	TFAB_HS_AUTH,	/* authenticating (auth.c) */
	TFAB_HS_OWNER,	/* the owner's messages */
	TFAB_HS_FLUSH,	/* the owner's exchange is done, and its last messages are going out */
	TFAB_HS_LINGER, /* the last messages going out; closed once they are */
	TFAB_HS_DRAIN,	/* refused: the REFUSE goes out, then the peer is read until it closes */
	TFAB_HS_DONE,	/* the owner's exchange is done; the connection is the owner's */
	TFAB_HS_FAILED, /* failed (status, why); the connection is closed */
	TFAB_HS_CLOSED, /* lingered or drained, and closed */
};

struct tfab_hs_set;

struct tfab_hs {
	struct tfab_list link; /* in its set's live list while it is driven */
	struct tfab_hs_set *set;
	int fd;
	bool acceptor;
	bool report; /* its end, failed too, goes back to the caller (a connector's) */
	bool heard;  /* a byte came from the peer */
	bool shut;   /* DRAIN: our end is shut down */
	enum tfab_hs_state state;
	char addr[80]; /* the other side, "127.0.0.1:5000" */
	uint64_t deadline_ms;
	uint64_t until_ms; /* the end of LINGER or DRAIN */
	struct tfab_auth auth;
	struct tfab_frame_rx rx;
	uint8_t *buf; /* rx's room */
	uint32_t buf_cap;
	bool tagged;   /* the owner's next message comes with its tag */
	uint8_t *held; /* a tagged message that waits for its tag */
	uint32_t held_len;
	const char *awaited; /* what is due from the peer: "its connection blob" */
	struct tfab_frame_tx tx;
	int status;
	char why[384];
	/* the owner's */
	unsigned stage;
	void *data;
	int rank;
};

struct tfab_hs_ops {
	/* Authenticated (or no key): queue what goes first, and say what comes (expect). */
	int (*start)(struct tfab_hs *hs);
	/* A message of the owner's, its tag checked: 0 another is due, 1 done, < 0 failed (why). */
	int (*take)(struct tfab_hs *hs, const uint8_t *msg, uint32_t len);
	/* The handshake ended undone: let go of what it holds (ctx->lock held if set->locked). */
	void (*drop)(struct tfab_hs *hs);
};

struct tfab_hs_set {
	struct tfab_context *ctx;
	const struct tfab_hs_ops *ops;
	void *owner;
	const char *who;     /* the listening side, for the log: "tfab_accept" */
	unsigned timeout_ms; /* an accepted connection's deadline */
	bool locked;	     /* the caller holds ctx->lock (the liveness checks' reaping) */
	struct tfab_list live;
	unsigned n;
	uint64_t refused; /* accepted connections that ended undone, each logged */
	struct pollfd *pfd;
	struct tfab_hs **pfd_hs;
	unsigned pfd_cap;
};

void tfab__hs_set_init(struct tfab_hs_set *set, struct tfab_context *ctx,
		       const struct tfab_hs_ops *ops, void *owner, const char *who,
		       unsigned timeout_ms);
/*
 * Every handshake still in the set ends (closed, dropped); one still in its handshake is
 * refused with a warning that says what was due when `why` ("the meeting ended").
 */
void tfab__hs_set_fini(struct tfab_hs_set *set, const char *why);

/* A connector's handshake over connected fd, to addr, ending by deadline_ms; reported. */
int tfab__hs_connect(struct tfab_hs_set *set, int fd, const char *addr, uint64_t deadline_ms,
		     struct tfab_hs **hs_p);

/*
 * Moves every handshake of the set on, and takes new connections from lfd (>= 0) into it,
 * until one ends that goes back to the caller (*done_p, out of the set: DONE, or a reported
 * one FAILED), or until `until`: -ETIMEDOUT. -ENOENT when there is nothing to drive. Once
 * tfab_abort was called, the abort's status (seen within TFAB_HS_ABORT_POLL_MS).
 * Accepted connections that fail are logged (warn) with their address and why, and closed.
 */
int tfab__hs_drive(struct tfab_hs_set *set, int lfd, uint64_t until, struct tfab_hs **done_p);

/* Ends the handshakes past their deadline (the liveness checks, between tfab_accept calls). */
void tfab__hs_reap(struct tfab_hs_set *set);

/* The owner's next message: at most cap bytes, with its tag or not; `awaited` names it. */
int tfab__hs_expect(struct tfab_hs *hs, uint32_t cap, bool tagged, const char *awaited);
/* Queue a message of the owner's, with its tag where tagged and a key is set. */
int tfab__hs_put(struct tfab_hs *hs, const void *msg, uint32_t len, bool tagged);
/* A handshake that was DONE goes back into its set to send what is queued, then closes. */
void tfab__hs_linger(struct tfab_hs *hs, uint64_t until_ms);
/* Frees a handshake out of its set (closing its connection, unless the owner took it). */
void tfab__hs_free(struct tfab_hs *hs);

#endif
