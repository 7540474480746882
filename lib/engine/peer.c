/*
 * Peers and their control channels: connection blobs, the TCP bootstrap, the inbox ring the
 * peer writes our messages into, the outbox our messages are written from, credits, and the
 * peer's death (fabric errors, or its bootstrap connection closing).
 */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <tfab/status.h>

#include "engine/engine.h"
#include "engine/handshake.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/time.h"

#define SUBSYS TFAB_ENGINE_SUBSYS
#define SLOT_SIZE TFAB_WIRE_MIN_SLOT
#define LIVENESS_MS 50
/* A closed bootstrap connection fails the peer after this: its last writes may still land. */
#define CLOSE_GRACE_MS 200

static size_t slots_of(const struct tfab_context *ctx)
{
	return ctx->cfg.ring_slots;
}

static int register_peer_id(struct tfab_context *ctx, struct tfab_peer *peer)
{
	if (ctx->next_peer_id > TFAB_WIRE_MAX_PEER_ID)
		return -ENOSPC;
	if (ctx->next_peer_id >= ctx->peer_cap) {
		uint32_t cap = ctx->peer_cap ? ctx->peer_cap * 2 : 16;
		struct tfab_peer **p = realloc(ctx->peer_by_id, cap * sizeof(*p));

		if (!p)
			return -ENOMEM;
		memset(p + ctx->peer_cap, 0, (cap - ctx->peer_cap) * sizeof(*p));
		ctx->peer_by_id = p;
		ctx->peer_cap = cap;
	}
	peer->id = ctx->next_peer_id++;
	ctx->peer_by_id[peer->id] = peer;
	return 0;
}

/* The peer's name in messages, from its id, address and path (as far as they are known). */
static void peer_label(struct tfab_peer *peer)
{
	snprintf(peer->name, sizeof(peer->name), "peer %u%s%s%s%s", peer->id,
		 peer->addr[0] ? " at " : "", peer->addr, peer->path ? " over " : "",
		 peer->path ? peer->path->name : "");
}

/* Its address: host:port of the bootstrap connection fd, which names it as users know it. */
static void peer_addr_of_sock(struct tfab_peer *peer, int fd)
{
	char host[NI_MAXHOST], port[NI_MAXSERV];
	struct sockaddr_storage sa;
	socklen_t salen = sizeof(sa);

	if (getpeername(fd, (struct sockaddr *)&sa, &salen) != 0 ||
	    getnameinfo((struct sockaddr *)&sa, salen, host, sizeof(host), port, sizeof(port),
			NI_NUMERICHOST | NI_NUMERICSERV) != 0)
		return;
	snprintf(peer->addr, sizeof(peer->addr), sa.ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s",
		 host, port);
	peer_label(peer);
}

void tfab__op_names_add(struct tfab_op_names *o, const char *key, int64_t step)
{
	int n;

	if (o->n++ >= 4 || o->len >= sizeof(o->buf))
		return;
	n = snprintf(o->buf + o->len, sizeof(o->buf) - o->len, "%s'%.64s' step %lld",
		     o->len ? ", " : "", key, (long long)step);
	if (n > 0)
		o->len += (size_t)n;
}

const char *tfab__op_names_end(struct tfab_op_names *o)
{
	if (!o->n)
		return "";
	if (o->n > 4)
		snprintf(o->out, sizeof(o->out), " (%s and %u more)", o->buf, o->n - 4);
	else
		snprintf(o->out, sizeof(o->out), " (%s)", o->buf);
	return o->out;
}

/*
 * The inbox and outbox: from a path's shared memory where one offers it (a peer on that path
 * then writes our inbox in one copy; other paths register it like any memory), else the heap.
 */
static int peer_rings_alloc(struct tfab_peer *peer, size_t bytes)
{
	struct tfab_context *ctx = peer->ctx;

	for (unsigned i = 0; i < ctx->npaths; i++) {
		struct tfab_ep *ep = ctx->paths[i].ep;

		if (!ep->ops->mem_alloc || !ep->ops->mem_free)
			continue;
		if (ep->ops->mem_alloc(ep, bytes, (void **)&peer->inbox))
			break;
		if (ep->ops->mem_alloc(ep, bytes, (void **)&peer->outbox)) {
			ep->ops->mem_free(ep, peer->inbox, bytes);
			peer->inbox = NULL;
			break;
		}
		peer->mem_ep = ep;
		peer->rings_len = bytes;
		return 0;
	}
	if (posix_memalign((void **)&peer->inbox, 4096, bytes) ||
	    posix_memalign((void **)&peer->outbox, 4096, bytes)) {
		free(peer->inbox);
		peer->inbox = NULL;
		return -ENOMEM;
	}
	peer->rings_len = bytes;
	return 0;
}

static void peer_rings_free(struct tfab_peer *peer)
{
	if (peer->mem_ep) {
		if (peer->inbox)
			peer->mem_ep->ops->mem_free(peer->mem_ep, peer->inbox, peer->rings_len);
		if (peer->outbox)
			peer->mem_ep->ops->mem_free(peer->mem_ep, peer->outbox, peer->rings_len);
	} else {
		free(peer->inbox);
		free(peer->outbox);
	}
	peer->inbox = peer->outbox = NULL;
}

/* What writes in flight may still use: the outbox they read, the slots they complete on. */
static void peer_release(struct tfab_peer *peer)
{
	for (unsigned i = 0; i < TFAB_MAX_PATHS; i++) {
		tfab_mr_dereg(peer->inbox_mrs[i]);
		tfab_mr_dereg(peer->outbox_mrs[i]);
	}
	peer_rings_free(peer);
	free(peer->oslots);
	free(peer->rx_consumed);
	free(peer);
}

static void cancelling_release(struct tfab_peer *peer, bool all, bool revoke);

void tfab__peer_free(struct tfab_peer *peer)
{
	struct tfab_context *ctx;
	bool cut;

	if (!peer)
		return;
	ctx = peer->ctx;
	/*
	 * It may be in the middle of a write to us, never to end: requests of ours were out to
	 * it when it failed, or, still working, it has requests of ours now, or cancelled ones
	 * it has not said it read (what it wrote before the CANCEL may still be coming). A peer
	 * that left with nothing of ours out finished its writes first.
	 */
	cut = peer->cut ||
	      (!peer->failed && (!tfab__list_empty(&peer->requests) || peer->ncancelled ||
				 peer->cancelled_lost || peer->nheld_dests));
	/* (a freed peer has failed first, which ended these: none is left to point at it) */
	cancelling_release(peer, true, true);
	if (ctx->peer_by_id && peer->id < ctx->peer_cap && ctx->peer_by_id[peer->id] == peer)
		ctx->peer_by_id[peer->id] = NULL;
	tfab__list_del(&peer->link);
	while (!tfab__list_empty(&peer->pending)) {
		struct tfab_list *l = peer->pending.next;

		tfab__list_del(l);
		free(tfab_container_of(l, struct tfab_pending_msg, link));
	}
	if (peer->meta.buckets) {
		for (size_t i = 0; i < peer->meta.nbuckets; i++) {
			struct tfab_hnode *n = peer->meta.buckets[i], *next;

			for (; n; n = next) {
				struct tfab_meta_entry *e =
				    tfab_container_of(n, struct tfab_meta_entry, node);

				next = n->next;
				tfab__list_del(&e->lru);
				ctx->meta_count--;
				free(e);
			}
		}
		tfab__htable_fini(&peer->meta);
		peer->meta_last = NULL;
	}
	tfab__htable_fini(&peer->answers); /* its entries belong to sends and parked requests */
	tfab__key_index_free(peer);
	tfab__ahead_free(peer);
	/* The peer is gone, but what it wrote last is not known to have landed: never reused. */
	for (uint32_t i = 0; i < peer->nheld_dests; i++)
		tfab__pool_discard(ctx->pool, peer->held_dests[i].buf);
	free(peer->held_dests);
	peer->held_dests = NULL;
	peer->nheld_dests = 0;
	free(peer->cancelled);
	peer->cancelled = NULL;
	peer->ncancelled = 0;
	free(peer->taken);
	peer->taken = NULL;
	peer->ntaken = 0;
	if (peer->conn && cut) {
		ctx->stats.peers_cut++;
		tfab_conn_cut(peer->conn);
	}
	if (peer->conn)
		tfab_conn_disconnect(peer->conn);
	/* Never on a path of ours, it had the keys of all: it may have written on any. */
	for (unsigned i = 0; peer->blob_out && !peer->path && i < ctx->npaths; i++)
		tfab_ep_expose(ctx->paths[i].ep);
	peer->conn = NULL;
	if (peer->sock >= 0) {
		tfab__heartbeat_remove(ctx->heartbeat, peer->sock);
		if (!peer->failed)
			tfab__heartbeat_bye(peer->sock); /* destroyed with its context */
		close(peer->sock);
		peer->sock = -1;
	}
	if (!peer->users) {
		peer_release(peer);
		return;
	}
	/*
	 * Writes of ours to it are still in flight (a peer that stopped reading): their
	 * completions point into it. It waits, failed and unreachable, for the last of them
	 * (tfab__peer_unuse), or for the context's end, which closes the endpoints first.
	 */
	if (!peer->failed)
		peer->failed = -TFAB_ERR_ABORTED;
	peer->zombie = true;
	tfab__list_add_tail(&ctx->zombies, &peer->link);
}

void tfab__peer_unuse(struct tfab_peer *peer)
{
	if (--peer->users == 0 && peer->zombie) {
		tfab__list_del(&peer->link);
		peer_release(peer);
	}
}

void tfab__peers_release_zombies(struct tfab_context *ctx)
{
	while (!tfab__list_empty(&ctx->zombies)) {
		struct tfab_peer *peer =
		    tfab_container_of(ctx->zombies.next, struct tfab_peer, link);

		tfab__list_del(&peer->link);
		peer_release(peer);
	}
}

static int peer_new(struct tfab_context *ctx, struct tfab_peer **peer_p)
{
	size_t r = slots_of(ctx);
	struct tfab_peer *peer;
	int rc;

	peer = calloc(1, sizeof(*peer));
	if (!peer)
		return -ENOMEM;
	peer->ctx = ctx;
	peer->sock = -1;
	peer->credit_w.kind = TFAB_WCTX_CREDIT;
	peer->inject_w.kind = TFAB_WCTX_INJECTED;
	tfab__list_init(&peer->link);
	tfab__list_init(&peer->pending);
	tfab__list_init(&peer->requests);
	tfab__list_init(&peer->cancelling);
	rc = tfab__htable_init(&peer->meta, 64);
	if (rc == 0)
		rc = tfab__htable_init(&peer->answers, 64);
	if (rc == 0)
		rc = tfab__htable_init(&peer->key_names, 64);
	if (rc)
		goto err;
	rc = peer_rings_alloc(peer, r * SLOT_SIZE);
	if (rc)
		goto err;
	rc = -ENOMEM;
	memset(peer->inbox, 0, r * SLOT_SIZE);
	memset(peer->outbox, 0, r * SLOT_SIZE);
	peer->oslots = calloc(r, sizeof(*peer->oslots));
	peer->rx_consumed = calloc(r, 1);
	if (!peer->oslots || !peer->rx_consumed)
		goto err;
	for (size_t i = 0; i < r; i++) {
		peer->oslots[i].w.kind = TFAB_WCTX_CTRL;
		peer->oslots[i].peer = peer;
	}
	/* On every path until the peer's is known (its blob offers them all). */
	for (unsigned i = 0; i < ctx->npaths; i++) {
		rc = tfab_mr_reg(ctx->paths[i].ep, peer->inbox, r * SLOT_SIZE, TFAB_MR_REMOTE_WRITE,
				 &peer->inbox_mrs[i]);
		if (rc)
			goto err;
		rc = tfab_mr_reg(ctx->paths[i].ep, peer->outbox, r * SLOT_SIZE, TFAB_MR_LOCAL_WRITE,
				 &peer->outbox_mrs[i]);
		if (rc)
			goto err;
		ctx->stats.mr_registrations += 2;
	}
	rc = register_peer_id(ctx, peer);
	if (rc)
		goto err;
	peer_label(peer);
	tfab__list_add_tail(&ctx->peers, &peer->link);
	*peer_p = peer;
	return 0;
err:
	tfab__peer_free(peer);
	return rc;
}

static int peer_blob(struct tfab_peer *peer, void *buf, size_t *len_p)
{
	struct tfab_context *ctx = peer->ctx;
	uint8_t addr[TFAB_MAX_PATHS][TFAB_WIRE_MAX_ADDR];
	const char *host = tfab__host_id();
	struct tfab_wire_blob b = {
	    .ring_slots = (uint32_t)slots_of(ctx),
	    .slot_size = SLOT_SIZE,
	    .peer_id = peer->id,
	    .host_len = (uint16_t)strlen(host),
	    .host = host,
	    .npaths = (uint16_t)ctx->npaths,
	};

	if (peer->connected)
		return -EISCONN;
	for (unsigned i = 0; i < ctx->npaths; i++) {
		const struct tfab_path *p = &ctx->paths[i];
		struct tfab_wire_path *w = &b.paths[i];
		size_t alen = sizeof(addr[i]);
		int rc = tfab_ep_get_addr(p->ep, addr[i], &alen);

		if (rc)
			return rc;
		*w = (struct tfab_wire_path){
		    .ring_raddr = peer->inbox_mrs[i]->raddr,
		    .ring_rkey = peer->inbox_mrs[i]->rkey,
		    .name_len = (uint8_t)strlen(p->name),
		    .same_host = p->caps->same_host,
		    .addr_len = (uint16_t)alen,
		    .name = p->name,
		    .addr = addr[i],
		};
	}
	peer->blob_out = true;
	return tfab__wire_blob_encode(&b, buf, *len_p, len_p);
}

/* The peer is on path i now: its regions on the other paths go. */
static void peer_bind(struct tfab_peer *peer, unsigned i)
{
	struct tfab_context *ctx = peer->ctx;

	peer->path = &ctx->paths[i];
	peer->path->peers++;
	peer->inbox_mr = peer->inbox_mrs[i];
	peer->outbox_mr = peer->outbox_mrs[i];
	for (unsigned j = 0; j < TFAB_MAX_PATHS; j++) {
		if (j == i)
			continue;
		tfab_mr_dereg(peer->inbox_mrs[j]);
		tfab_mr_dereg(peer->outbox_mrs[j]);
		peer->inbox_mrs[j] = peer->outbox_mrs[j] = NULL;
	}
}

static int peer_connect(struct tfab_peer *peer, const void *blob, size_t len)
{
	struct tfab_context *ctx = peer->ctx;
	struct tfab_wire_blob b;
	const struct tfab_wire_path *w = NULL;
	char why[512];
	int rc, i;

	if (peer->connected)
		return -EISCONN;
	rc = tfab__wire_blob_decode(blob, len, &b);
	if (rc) {
		TFAB_ERROR(SUBSYS, "peer %u: its connection blob (%zu bytes) is %s", peer->id, len,
			   rc == -TFAB_ERR_VERSION ? "of another protocol version"
						   : "malformed (a length or field out of range)");
		ctx->stats.refused += rc == -TFAB_ERR_PROTOCOL;
		return rc;
	}
	i = tfab__path_choose(ctx, &b, &w, why, sizeof(why));
	if (i < 0) {
		TFAB_ERROR(SUBSYS, "peer %u: %s", peer->id, why);
		return i;
	}
	rc = tfab_ep_connect(ctx->paths[i].ep, w->addr, w->addr_len, &peer->conn);
	if (rc)
		return rc;
	peer_bind(peer, (unsigned)i);
	peer->conn->owner = peer;
	tfab_ep_addr_str(peer->path->ep, w->addr, w->addr_len, peer->addr, sizeof(peer->addr));
	peer_label(peer);
	peer->endpoint_hash = tfab__hash_bytes(w->addr, w->addr_len, (uint64_t)i + 1);
	peer->remote_raddr = w->ring_raddr;
	peer->remote_rkey = w->ring_rkey;
	peer->remote_slots = b.ring_slots;
	peer->remote_slot_size = b.slot_size;
	peer->remote_id = b.peer_id;
	peer->connected = true;
	TFAB_DEBUG(SUBSYS, "%s: connected (%s; its inbox: %u slots; its id for us: %u)",
		   tfab__peer_name(peer), peer->path->caps->fabric, b.ring_slots, b.peer_id);
	tfab__peers_flush(ctx, false);
	return 0;
}

int tfab_peer_create(struct tfab_context *ctx, struct tfab_peer **peer_p)
{
	int rc;

	if (!ctx || !peer_p)
		return -EINVAL;
	tfab__ctx_lock(ctx);
	rc = peer_new(ctx, peer_p);
	tfab__ctx_unlock(ctx);
	return rc;
}

int tfab_peer_blob(struct tfab_peer *peer, void *buf, size_t *len_p)
{
	int rc;

	if (!peer || !buf || !len_p)
		return -EINVAL;
	tfab__ctx_lock(peer->ctx);
	rc = peer_blob(peer, buf, len_p);
	tfab__ctx_unlock(peer->ctx);
	return rc;
}

int tfab_peer_connect(struct tfab_peer *peer, const void *blob, size_t len)
{
	int rc;

	if (!peer || !blob)
		return -EINVAL;
	tfab__ctx_lock(peer->ctx);
	rc = peer_connect(peer, blob, len);
	tfab__ctx_unlock(peer->ctx);
	return rc;
}

/*
 * Wait (driving progress) until no write of ours to the peer is in flight: at most 2 s, and
 * no longer than TFAB_LEAVE_QUIET_MS without one of them completing. A stopped peer takes
 * none, and the caller, often the thread that answers every other peer, must not stop for
 * seconds: what is left waits as a zombie (tfab__peer_free), and the peer was told first
 * (LEAVE, after those writes) or has failed. Other threads' calls go on meanwhile
 * (tfab__progress_turn).
 */
static bool peer_drain(struct tfab_peer *peer)
{
	struct tfab_leave_clock clock;
	uint64_t now = tfab__now_ms();

	tfab__leave_clock_start(&clock, now, 2000, peer->users);
	while (peer->users && now < clock.deadline &&
	       tfab__leave_clock_hopeful(&clock, now, peer->users)) {
		tfab__progress_turn(peer->ctx, TFAB_IDLE_PAUSE_US);
		now = tfab__now_ms();
	}
	return peer->users == 0;
}

static void peer_send_taken(struct tfab_peer *peer);
static void peer_flush(struct tfab_peer *peer);

/*
 * Our messages queued behind the credit window, and our TAKEN messages for what the peer
 * sent, go before we leave it: its sends are delivered only on TAKEN (a receive that
 * completed in the application's last progress call holds its TAKEN), and a collective's
 * eager operand (COLL_DATA) has ended at our end once it is queued. At most 2 s, waiting for
 * credit. Our requests to it end with a CANCEL (those posted ahead of their receives too,
 * which no-request mode keeps standing), and we wait until it has read them, as its credits
 * tell: from then on it writes nothing more to us, and its connection closes as any other's
 * (not cut). Every one of these waits ends too once no credit has come for
 * TFAB_LEAVE_QUIET_MS: a peer cut off or stopped never answers, and what is left here fails
 * now, not 2 s later (a peer busy that long without progress loses the TAKENs still queued:
 * its sends fail, though we took them). Then a
 * LEAVE, the last thing we write to it: it may have requests of its own standing here, whose
 * CANCELs we would never read (both sides of a no-request pair end so), and it cuts nothing
 * once it knows that we write nothing more. Other threads' calls go on during these waits
 * (tfab__progress_turn): what they post for this peer meanwhile fails with it.
 */
static void peer_leave(struct tfab_peer *peer)
{
	struct tfab_leave_clock clock;
	uint64_t now;
	bool hopeful;

	if (!peer->connected || peer->failed)
		return;
	tfab__leave_clock_start(&clock, tfab__now_ms(), 2000, peer->tx_acked);
	while (!tfab__list_empty(&peer->requests) && !peer->failed)
		tfab__request_fail(
		    tfab_container_of(peer->requests.next, struct tfab_request, link),
		    -TFAB_ERR_ABORTED, true);
	while ((peer->ntaken || !tfab__list_empty(&peer->pending) || peer->ncancelled) &&
	       peer->connected && !peer->failed) {
		peer_flush(peer);
		if (peer->ntaken)
			peer_send_taken(peer);
		now = tfab__now_ms();
		hopeful = tfab__leave_clock_hopeful(&clock, now, peer->tx_acked);
		if ((!peer->ntaken && tfab__list_empty(&peer->pending) && !peer->ncancelled) ||
		    !hopeful || now >= clock.deadline)
			break;
		tfab__progress_turn(peer->ctx, TFAB_IDLE_PAUSE_US);
	}
	/* Last, our LEAVE: the peer, which may be leaving us too, then cuts nothing. */
	tfab__peer_send_leave(peer);
	while (peer->leave_sent && !tfab__list_empty(&peer->pending) && peer->connected &&
	       !peer->failed) {
		now = tfab__now_ms();
		if (!tfab__leave_clock_hopeful(&clock, now, peer->tx_acked) ||
		    now >= clock.deadline)
			break;
		peer_flush(peer);
		tfab__progress_turn(peer->ctx, TFAB_IDLE_PAUSE_US);
	}
}

int tfab_peer_destroy(struct tfab_peer *peer)
{
	struct tfab_context *ctx;

	if (!peer)
		return 0;
	ctx = peer->ctx;
	tfab__ctx_lock(ctx);
	peer_leave(peer);
	/* before the connection's end: the peer tells that we left from that we died */
	if (peer->sock >= 0 && !peer->failed)
		tfab__heartbeat_bye(peer->sock);
	tfab__peer_fail(peer, -TFAB_ERR_ABORTED);
	if (!peer_drain(peer))
		TFAB_INFO(SUBSYS,
			  "%s: %u writes to it still in flight, none ending: they end with the "
			  "connection",
			  tfab__peer_name(peer), peer->users);
	tfab__peer_free(peer);
	tfab__ctx_unlock(ctx);
	return 0;
}

/*
 * The TCP bootstrap: swap blobs over a connected socket, then a "connected" message each way,
 * and keep the socket to watch the peer. Each connection is a handshake of handshake.h, so an
 * acceptor moves every connection to its port on at once: a stranger delays no peer.
 *
 * The connector's blob goes first; the acceptor makes a peer (an inbox registered on every
 * path) only for a blob that decodes, and sends its own then.
 *
 * The second exchange means that neither side leaves the bootstrap (and so neither can close
 * its endpoint) before the other has connected to it. libfabric 1.17's shm maps a peer's
 * region when its address is inserted; a peer whose region is already gone by then (it
 * connected to us, wrote to us, and closed its endpoint while we were still inserting it)
 * is kept unmapped without an error, and its first write's connection request then crashes
 * our fi_cq_read (smr_progress_connreq reads the region through a NULL pointer).
 */
enum { BOOT_BLOB, BOOT_CONNECTED };

static const uint8_t boot_connected = 'C';

static void boot_lock(struct tfab_hs *hs)
{
	if (!hs->set->locked)
		tfab__ctx_lock(hs->set->ctx);
}

static void boot_unlock(struct tfab_hs *hs)
{
	if (!hs->set->locked)
		tfab__ctx_unlock(hs->set->ctx);
}

/* A peer of ours for the other side, its blob queued. */
static int boot_offer(struct tfab_hs *hs)
{
	struct tfab_context *ctx = hs->set->ctx;
	uint8_t mine[TFAB_PEER_BLOB_MAX];
	size_t mlen = sizeof(mine);
	struct tfab_peer *peer = NULL;
	int rc;

	boot_lock(hs);
	rc = peer_new(ctx, &peer);
	if (rc == 0)
		rc = peer_blob(peer, mine, &mlen);
	if (rc && peer)
		tfab__peer_free(peer);
	boot_unlock(hs);
	if (rc) {
		snprintf(hs->why, sizeof(hs->why), "no peer of ours for it: %s", tfab_strerror(rc));
		return rc;
	}
	hs->data = peer;
	return tfab__hs_put(hs, mine, (uint32_t)mlen, true);
}

static int boot_start(struct tfab_hs *hs)
{
	int rc = hs->acceptor ? 0 : boot_offer(hs);

	hs->stage = BOOT_BLOB;
	return rc ? rc : tfab__hs_expect(hs, TFAB_PEER_BLOB_MAX, true, "its connection blob");
}

static int boot_take(struct tfab_hs *hs, const uint8_t *msg, uint32_t len)
{
	struct tfab_wire_blob b;
	int rc;

	if (hs->stage == BOOT_CONNECTED) {
		if (len == 1 && msg[0] == boot_connected)
			return 1;
		snprintf(hs->why, sizeof(hs->why),
			 "it sent %u bytes where its one-byte connected message was due", len);
		return -TFAB_ERR_PROTOCOL;
	}
	rc = tfab__wire_blob_decode(msg, len, &b);
	if (rc) {
		snprintf(hs->why, sizeof(hs->why), "%s (%u bytes)",
			 rc == -TFAB_ERR_VERSION ? "its connection blob is of another protocol "
						   "version"
						 : "its first message is no connection blob",
			 len);
		return rc;
	}
	if (hs->acceptor) {
		rc = boot_offer(hs);
		if (rc)
			return rc;
	}
	boot_lock(hs);
	rc = peer_connect(hs->data, msg, len);
	boot_unlock(hs);
	if (rc) {
		snprintf(hs->why, sizeof(hs->why), "cannot connect to its blob: %s",
			 tfab_strerror(rc));
		return rc;
	}
	hs->stage = BOOT_CONNECTED;
	rc = tfab__hs_put(hs, &boot_connected, 1, false);
	return rc ? rc : tfab__hs_expect(hs, 1, false, "its connected message");
}

static void boot_drop(struct tfab_hs *hs)
{
	if (!hs->data)
		return;
	boot_lock(hs);
	tfab__peer_free(hs->data);
	boot_unlock(hs);
	hs->data = NULL;
}

static const struct tfab_hs_ops boot_ops = {
    .start = boot_start, .take = boot_take, .drop = boot_drop};

/* The handshake is done: its peer keeps the connection, to watch it. */
static struct tfab_peer *boot_done(struct tfab_hs *hs)
{
	struct tfab_context *ctx = hs->set->ctx;
	struct tfab_peer *peer = hs->data;
	int rc;

	tfab__ctx_lock(ctx);
	peer->sock = hs->fd;
	peer_addr_of_sock(peer, hs->fd);
	rc = tfab__heartbeat_add(ctx->heartbeat, peer->sock);
	if (rc)
		TFAB_WARN(SUBSYS, "%s: no heartbeats to it: %s", tfab__peer_name(peer),
			  tfab_strerror(rc));
	TFAB_DEBUG(SUBSYS, "peer %u: bootstrap with %s done", peer->id, hs->addr);
	tfab__ctx_unlock(ctx);
	hs->fd = -1;
	hs->data = NULL;
	tfab__hs_free(hs);
	return peer;
}

int tfab__accepts_open(struct tfab_context *ctx)
{
	pthread_mutex_init(&ctx->accept_lock, NULL);
	ctx->accepts = malloc(sizeof(*ctx->accepts));
	if (!ctx->accepts)
		return -ENOMEM;
	tfab__hs_set_init(ctx->accepts, ctx, &boot_ops, NULL, "tfab_accept",
			  ctx->cfg.handshake_timeout_ms);
	return 0;
}

void tfab__accepts_close(struct tfab_context *ctx)
{
	if (!ctx->accepts)
		return;
	pthread_mutex_lock(&ctx->accept_lock);
	tfab__hs_set_fini(ctx->accepts, "the context ended");
	pthread_mutex_unlock(&ctx->accept_lock);
	free(ctx->accepts);
	ctx->accepts = NULL;
	pthread_mutex_destroy(&ctx->accept_lock);
}

/* Called with ctx->lock held: handshakes between tfab_accept calls end by their deadline. */
static void accepts_reap(struct tfab_context *ctx)
{
	if (!ctx->accepts || pthread_mutex_trylock(&ctx->accept_lock))
		return; /* a tfab_accept is moving them */
	ctx->accepts->locked = true;
	tfab__hs_reap(ctx->accepts);
	ctx->accepts->locked = false;
	pthread_mutex_unlock(&ctx->accept_lock);
}

/* The accept lock, waited for until deadline (another thread's tfab_accept holds it). */
static int accept_lock(struct tfab_context *ctx, uint64_t deadline)
{
	while (pthread_mutex_trylock(&ctx->accept_lock)) {
		if (tfab__now_ms() >= deadline)
			return -ETIMEDOUT;
		usleep(1000);
	}
	return 0;
}

int tfab_listen(struct tfab_context *ctx, const char *host, uint16_t port, uint16_t *port_p)
{
	int fd, rc;

	if (!ctx)
		return -EINVAL;
	rc = tfab__sock_listen(host, port, &fd, port_p);
	if (rc)
		return rc;
	/* not under a tfab_accept polling the one it replaces */
	pthread_mutex_lock(&ctx->accept_lock);
	tfab__ctx_lock(ctx);
	if (ctx->listen_fd >= 0)
		close(ctx->listen_fd);
	ctx->listen_fd = fd;
	tfab__ctx_unlock(ctx);
	pthread_mutex_unlock(&ctx->accept_lock);
	return 0;
}

int tfab_accept(struct tfab_context *ctx, int timeout_ms, struct tfab_peer **peer_p)
{
	uint64_t deadline;
	struct tfab_hs *hs;
	int rc;

	if (!ctx || !peer_p || timeout_ms < 0)
		return -EINVAL;
	deadline = tfab__now_ms() + (uint64_t)timeout_ms;
	rc = accept_lock(ctx, deadline);
	if (rc)
		return rc;
	if (ctx->listen_fd < 0) {
		rc = -EINVAL;
	} else {
		ctx->accepts->timeout_ms = ctx->cfg.handshake_timeout_ms;
		rc = tfab__hs_drive(ctx->accepts, ctx->listen_fd, deadline, &hs);
		if (rc == 0)
			*peer_p = boot_done(hs);
	}
	pthread_mutex_unlock(&ctx->accept_lock);
	return rc;
}

int tfab_connect(struct tfab_context *ctx, const char *host, uint16_t port, int timeout_ms,
		 struct tfab_peer **peer_p)
{
	uint64_t deadline;
	struct tfab_hs_set set;
	struct tfab_hs *hs = NULL;
	char addr[300];
	int fd, rc;

	if (!ctx || !host || !peer_p || timeout_ms < 0)
		return -EINVAL;
	deadline = tfab__now_ms() + (uint64_t)timeout_ms;
	snprintf(addr, sizeof(addr), strchr(host, ':') ? "[%s]:%u" : "%s:%u", host, port);
	rc = tfab__sock_connect(host, port, timeout_ms, &fd); /* says why it failed */
	if (rc)
		return rc;
	tfab__hs_set_init(&set, ctx, &boot_ops, NULL, "tfab_connect",
			  ctx->cfg.handshake_timeout_ms);
	rc = tfab__hs_connect(&set, fd, addr, deadline, &hs);
	if (rc) {
		close(fd);
		return rc;
	}
	/* a refusal of ours may still be going out: a little past the deadline */
	rc = tfab__hs_drive(&set, -1, deadline + TFAB_HS_LINGER_MS, &hs);
	if (rc == 0 && hs->state == TFAB_HS_DONE) {
		*peer_p = boot_done(hs);
		tfab__hs_set_fini(&set, "tfab_connect returned");
		return 0;
	}
	if (rc == 0) {
		rc = hs->status;
		if (rc == -TFAB_ERR_PROTOCOL)
			TFAB_ERROR(SUBSYS, "tfab_connect: %s is not a tfab peer (%s)", addr,
				   hs->why);
		else if (rc == -ETIMEDOUT)
			TFAB_ERROR(SUBSYS, "tfab_connect: %s: %s within %d ms (is it a tfab peer?)",
				   addr, hs->why, timeout_ms);
		else
			TFAB_ERROR(SUBSYS, "tfab_connect: %s: %s", addr, hs->why);
		tfab__hs_free(hs);
	} else {
		TFAB_ERROR(SUBSYS, "tfab_connect: %s: %s", addr, tfab_strerror(rc));
	}
	tfab__hs_set_fini(&set, "tfab_connect returned");
	return rc;
}

/* Control messages out. */

static int post_slot(struct tfab_peer *peer, uint8_t *src, size_t len, unsigned nmsgs);

/* Whether control writes to the peer carry several messages and credits (TFAB_CTRL_BATCH). */
static bool batches(const struct tfab_peer *peer)
{
	return peer->ctx->cfg.ctrl_batch && peer->path && !peer->path->caps->no_ctrl_batch;
}

/* A control slot being filled: encoded messages back to back (protocol.md, "Message slot"). */
struct slot_fill {
	uint8_t *src;
	size_t len;
	unsigned n;
	uint16_t off[SLOT_SIZE / TFAB_WIRE_MSG_HDR];
	uint32_t riding; /* TAKEN indexes it took from the end of peer->taken */
};

static void fill_push(struct slot_fill *f, size_t len)
{
	f->off[f->n++] = (uint16_t)f->len;
	f->len += len;
}

/*
 * The TAKEN indexes waiting (held or not) ride at the end of a slot that goes anyway, as many
 * as fit, taken from the end of peer->taken (fill_post gives them back if it is not posted).
 */
static void fill_taken(struct tfab_peer *peer, struct slot_fill *f)
{
	size_t room = SLOT_SIZE - f->len, n, tlen;
	struct tfab_wire_msg t;

	if (!batches(peer) || !peer->ntaken || room < TFAB_WIRE_MSG_HDR + 6)
		return;
	tfab__wire_msg_init(&t, TFAB_MSG_TAKEN);
	n = (room - TFAB_WIRE_MSG_HDR - 6) / 4 + 1;
	if (n > peer->ntaken)
		n = peer->ntaken;
	if (n > TFAB_WIRE_MAX_TAKEN)
		n = TFAB_WIRE_MAX_TAKEN;
	t.ntaken = (uint16_t)n;
	t.req_index = peer->taken[peer->ntaken - n];
	t.taken = peer->taken + peer->ntaken - n + 1;
	if (tfab__wire_msg_encode(&t, f->src + f->len, room, &tlen))
		return;
	fill_push(f, tlen);
	peer->ntaken -= (uint32_t)n;
	f->riding = (uint32_t)n;
}

/* Seq and `more` into every header, then the write: as post_slot. */
static int fill_post(struct tfab_peer *peer, struct slot_fill *f)
{
	int rc;

	for (unsigned k = 0; k < f->n; k++) {
		tfab__wire_msg_set_seq(f->src + f->off[k], peer->tx_seq);
		tfab__wire_msg_set_more(f->src + f->off[k], (uint16_t)(f->n - 1 - k));
	}
	rc = post_slot(peer, f->src, f->len, f->n);
	if (rc == -EAGAIN)
		peer->ntaken += f->riding; /* still at the end of peer->taken */
	return rc;
}

/* Whether a slot can go now: credit, and the outbox slot's last write completed. */
static bool slot_free(struct tfab_peer *peer)
{
	return peer->tx_seq - peer->tx_acked < peer->remote_slots &&
	       !peer->oslots[peer->tx_seq % slots_of(peer->ctx)].busy;
}

static uint8_t *slot_src(struct tfab_peer *peer)
{
	return peer->outbox + (size_t)(peer->tx_seq % slots_of(peer->ctx)) * SLOT_SIZE;
}

int tfab__peer_send_msg(struct tfab_peer *peer, const struct tfab_wire_msg *m)
{
	size_t len;
	int rc;

	if (peer->failed)
		return peer->failed;
	if (peer->leave_sent)
		return -TFAB_ERR_ABORTED; /* nothing goes after our LEAVE */
	/* The common case: credit, a free slot, nothing queued: encode in place and post. */
	if (peer->connected && tfab__list_empty(&peer->pending) && slot_free(peer)) {
		struct slot_fill f = {.src = slot_src(peer)};

		rc = tfab__wire_msg_encode(m, f.src, SLOT_SIZE, &len);
		if (rc)
			return rc;
		fill_push(&f, len);
		if (m->type != TFAB_MSG_TAKEN)
			fill_taken(peer, &f);
		rc = fill_post(peer, &f);
		if (rc != -EAGAIN)
			return rc;
		/* back-pressure: queue the encoded bytes below */
	}
	return tfab__peer_queue_msg(peer, m);
}

int tfab__peer_queue_msg(struct tfab_peer *peer, const struct tfab_wire_msg *m)
{
	/*
	 * Queued at its encoded size (tens of bytes, not a slot): a step's requests can queue by
	 * the thousand behind the credit window, and how many do depends on timing.
	 */
	uint8_t buf[SLOT_SIZE];
	struct tfab_pending_msg *pm;
	size_t len;
	int rc;

	if (peer->failed)
		return peer->failed;
	if (peer->leave_sent && m->type != TFAB_MSG_LEAVE)
		return -TFAB_ERR_ABORTED;
	rc = tfab__wire_msg_encode(m, buf, SLOT_SIZE, &len);
	if (rc)
		return rc;
	pm = malloc(sizeof(*pm) + len);
	if (!pm)
		return -ENOMEM;
	memcpy(pm->bytes, buf, len);
	pm->len = len;
	tfab__list_add_tail(&peer->pending, &pm->link);
	TFAB_TRACE(SUBSYS, "peer %u: message of type %u queued", peer->id, m->type);
	return 0;
}

/*
 * Write the message at src (an outbox slot, its seq already tfab_peer->tx_seq) to the peer's
 * inbox. 0, -EAGAIN (nothing done), or an error that has failed the peer.
 */
static int post_slot(struct tfab_peer *peer, uint8_t *src, size_t len, unsigned nmsgs)
{
	struct tfab_context *ctx = peer->ctx;
	uint32_t rslot = peer->tx_seq % peer->remote_slots;
	struct tfab_outbox_slot *os = &peer->oslots[peer->tx_seq % slots_of(ctx)];
	/* The credits due ride along (protocol.md, "Message slot"). */
	uint32_t credits = batches(peer) ? peer->rx_unreturned : 0;
	int rc;

	if (credits > TFAB_WIRE_MAX_SLOTS)
		credits = TFAB_WIRE_MAX_SLOTS;
	tfab__wire_msg_set_credits(src, (uint16_t)credits);
	rc = tfab_conn_write_imm(peer->conn, src, len, peer->outbox_mr,
				 peer->remote_raddr + (uint64_t)rslot * peer->remote_slot_size,
				 peer->remote_rkey, tfab__imm_msg(peer->remote_id, rslot), 0,
				 &os->w);
	if (rc == -EAGAIN)
		return rc;
	if (rc) {
		tfab__peer_write_failed(peer, rc);
		return rc;
	}
	os->busy = true;
	peer->users++;
	TFAB_TRACE(SUBSYS, "peer %u: message of type %u, %zu bytes, seq %u into slot %u", peer->id,
		   src[1], len, peer->tx_seq, rslot);
	peer->tx_seq++;
	peer->rx_unreturned -= credits;
	ctx->stats.ctrl_messages += nmsgs;
	ctx->stats.writes_ctrl++;
	ctx->stats.bytes_ctrl += len;
	return 0;
}

/*
 * The queued messages, in order, as many to a slot as fit (one with TFAB_CTRL_BATCH=0), with
 * the waiting TAKEN indexes behind the last ones.
 */
static void peer_flush(struct tfab_peer *peer)
{
	bool batch = batches(peer);

	if (!peer->connected || peer->failed)
		return;
	while (!tfab__list_empty(&peer->pending)) {
		struct slot_fill f = {.src = slot_src(peer)};
		struct tfab_list *l = peer->pending.next;
		unsigned packed;

		if (!slot_free(peer))
			return; /* no credit, or the slot's last write has not completed */
		for (; l != &peer->pending; l = l->next) {
			struct tfab_pending_msg *pm =
			    tfab_container_of(l, struct tfab_pending_msg, link);

			if (f.n && (!batch || f.len + pm->len > SLOT_SIZE))
				break;
			memcpy(f.src + f.len, pm->bytes, pm->len);
			fill_push(&f, pm->len);
		}
		packed = f.n;
		fill_taken(peer, &f);
		if (fill_post(peer, &f))
			return;
		while (packed--) {
			l = peer->pending.next;
			tfab__list_del(l);
			free(tfab_container_of(l, struct tfab_pending_msg, link));
		}
	}
}

int tfab__peer_taken(struct tfab_peer *peer, uint32_t req_index, bool lazy)
{
	if (peer->ntaken == peer->taken_cap) {
		uint32_t cap = peer->taken_cap ? peer->taken_cap * 2 : 64;
		uint32_t *t = realloc(peer->taken, cap * sizeof(*t));

		if (!t)
			return -ENOMEM;
		peer->taken = t;
		peer->taken_cap = cap;
	}
	if (!peer->ntaken) {
		peer->taken_gen = peer->ctx->progress_gen;
		peer->taken_lazy = lazy;
		if (lazy)
			peer->taken_due_ns =
			    tfab__now_ns() + (uint64_t)peer->ctx->cfg.ahead_taken_us * 1000;
	}
	peer->taken_lazy &= lazy;
	peer->taken[peer->ntaken++] = req_index;
	return 0;
}

/*
 * Report the receives completed, as TAKEN messages of up to 251 each, written straight into
 * free slots: while messages wait for credit the indexes wait in peer->taken rather than as
 * many small queued messages (a busy peer gets a few full ones), until a full message's worth
 * has come, which queues behind them (so that receives posted without end starve no verdict).
 */
static void peer_send_taken(struct tfab_peer *peer)
{
	uint32_t done = 0;

	while (done < peer->ntaken && !peer->failed) {
		uint32_t n = peer->ntaken - done;
		struct tfab_wire_msg m;
		bool now = tfab__list_empty(&peer->pending) && slot_free(peer);

		if (!now && n < TFAB_WIRE_MAX_TAKEN)
			break;
		if (n > TFAB_WIRE_MAX_TAKEN)
			n = TFAB_WIRE_MAX_TAKEN;
		tfab__wire_msg_init(&m, TFAB_MSG_TAKEN);
		m.req_index = peer->taken[done];
		m.ntaken = (uint16_t)n;
		m.taken = peer->taken + done + 1;
		if (tfab__peer_send_msg(peer, &m))
			break; /* the peer failed, and with it what waited for this */
		done += n;
	}
	if (peer->failed)
		done = peer->ntaken;
	memmove(peer->taken, peer->taken + done, (peer->ntaken - done) * sizeof(*peer->taken));
	peer->ntaken -= done;
}

/* Credits back for what we consumed, as a zero-length write carrying the count. */
static void peer_return_credits(struct tfab_peer *peer)
{
	struct tfab_context *ctx = peer->ctx;
	uint32_t batch = (uint32_t)slots_of(ctx) / 4;

	/*
	 * In batches of a quarter ring: never a deadlock, since a sender out of credit means
	 * this side has consumed (or will) a whole ring and so holds at least a batch.
	 */
	/* credits returned so far, against those through the last CANCEL read */
	bool due = (int32_t)(peer->credit_due_seq - (peer->rx_next - peer->rx_unreturned)) > 0;

	if (peer->rx_unreturned < (batch ? batch : 1) && !(due && peer->rx_unreturned))
		return;
	while (peer->rx_unreturned && peer->connected && !peer->failed && !peer->leave_sent) {
		uint32_t n = peer->rx_unreturned > 1023 ? 1023 : peer->rx_unreturned;
		bool inject = peer->path->caps->inject_size > 0;
		int rc = tfab_conn_write_imm(peer->conn, peer->outbox, 0, peer->outbox_mr,
					     peer->remote_raddr, peer->remote_rkey,
					     tfab__imm_credit(peer->remote_id, n),
					     inject ? TFAB_WRITE_INJECT : 0, &peer->credit_w);

		if (rc == -EAGAIN)
			return;
		if (rc) {
			tfab__peer_write_failed(peer, rc);
			return;
		}
		if (!inject)
			peer->users++;
		ctx->stats.writes_credit++;
		peer->rx_unreturned -= n;
		TFAB_TRACE(SUBSYS, "peer %u: %u credits returned", peer->id, n);
	}
}

/*
 * Whether the TAKEN indexes waiting may wait longer: all of them are lazy (receives posted
 * ahead, whose senders expect no prompt verdict), fewer than a message's worth, not due, and
 * the context is not ending (abort, destroy).
 */
static bool taken_waits(const struct tfab_peer *peer)
{
	return peer->taken_lazy && peer->ntaken < TFAB_WIRE_MAX_TAKEN && !peer->ctx->abort_status &&
	       tfab__now_ns() < peer->taken_due_ns;
}

bool tfab__peers_flush(struct tfab_context *ctx, bool hold_new)
{
	uint32_t batch = (uint32_t)slots_of(ctx) / 4;
	struct tfab_list *l, *t;
	bool idle = true;

	tfab_list_for_each_safe(l, t, &ctx->peers)
	{
		struct tfab_peer *peer = tfab_container_of(l, struct tfab_peer, link);

		if (peer->nretired >= TFAB_WIRE_MAX_TAKEN)
			tfab__key_index_flush(peer);
		peer_flush(peer);
		if (peer->ntaken && peer->connected &&
		    !(hold_new && peer->taken_gen == ctx->progress_gen) && !taken_waits(peer))
			peer_send_taken(peer);
		peer_return_credits(peer);
		/* what a later flush would still write (as peer_return_credits reckons) */
		idle &= tfab__list_empty(&peer->pending) && !peer->ntaken &&
			peer->nretired < TFAB_WIRE_MAX_TAKEN &&
			peer->rx_unreturned < (batch ? batch : 1);
	}
	return idle;
}

void tfab__peer_on_write_done(struct tfab_outbox_slot *slot, int status)
{
	slot->busy = false;
	if (status)
		tfab__peer_write_failed(slot->peer, status);
	tfab__peer_unuse(slot->peer);
}

/*
 * One past the slot the message just sent or queued goes in, which the peer's credits reach
 * once it has read it: the slot before tx_seq, or, queued, the last of the slots the queue
 * takes, packed as peer_flush packs them (as many messages to a slot as fit, in order, with
 * batching; one each without). A count of one slot per queued message would name slots
 * never sent, whose credits never come.
 */
static uint32_t last_msg_seq(const struct tfab_peer *peer)
{
	bool batch = batches(peer);
	uint32_t slots = 0;
	size_t len = 0;

	for (const struct tfab_list *l = peer->pending.next; l != &peer->pending; l = l->next) {
		const struct tfab_pending_msg *pm =
		    tfab_container_of(l, const struct tfab_pending_msg, link);

		if (!slots || !batch || len + pm->len > SLOT_SIZE) {
			slots++;
			len = 0;
		}
		len += pm->len;
	}
	return peer->tx_seq + slots;
}

/* Destinations held for the peer's verdict on their CANCEL. */

void tfab__peer_hold_dest(struct tfab_peer *peer, void *buf)
{
	struct tfab_held_dest *h;
	uint32_t seq = last_msg_seq(peer);

	if (peer->nheld_dests == peer->held_dests_cap) {
		uint32_t cap = peer->held_dests_cap ? peer->held_dests_cap * 2 : 16;

		h = realloc(peer->held_dests, cap * sizeof(*h));
		if (!h) {
			tfab__pool_discard(peer->ctx->pool, buf);
			return;
		}
		peer->held_dests = h;
		peer->held_dests_cap = cap;
	}
	peer->held_dests[peer->nheld_dests++] = (struct tfab_held_dest){.buf = buf, .seq = seq};
}

void tfab__peer_hold_request(struct tfab_peer *peer, struct tfab_request *r)
{
	r->state = TFAB_REQ_CANCELLING;
	r->cancel_seq = last_msg_seq(peer);
	r->since_ms = tfab__coarse_ms();
	tfab__list_del(&r->link);
	tfab__list_add_tail(&peer->cancelling, &r->link);
}

/*
 * Credits came back: the cancelling receives whose CANCEL they cover end (the peer read it,
 * and what it wrote before has landed); all of them with the peer (revoke: it may still
 * write, unless it left).
 */
static void cancelling_release(struct tfab_peer *peer, bool all, bool revoke)
{
	struct tfab_list *l, *t;

	tfab_list_for_each_safe(l, t, &peer->cancelling)
	{
		struct tfab_request *r = tfab_container_of(l, struct tfab_request, link);

		if (all || (int32_t)(peer->tx_acked - r->cancel_seq) >= 0)
			tfab__request_cancelled(r, revoke);
	}
}

void tfab__peer_cancelled(struct tfab_peer *peer, uint32_t index)
{
	if (peer->ncancelled == peer->cancelled_cap) {
		uint32_t cap = peer->cancelled_cap ? peer->cancelled_cap * 2 : 16;
		struct tfab_cancelled *c = realloc(peer->cancelled, cap * sizeof(*c));

		if (!c) {
			peer->cancelled_lost = true;
			return;
		}
		peer->cancelled = c;
		peer->cancelled_cap = cap;
	}
	peer->cancelled[peer->ncancelled++] =
	    (struct tfab_cancelled){.index = index, .seq = last_msg_seq(peer)};
}

bool tfab__peer_was_cancelled(const struct tfab_peer *peer, uint32_t index)
{
	if (peer->cancelled_lost)
		return true;
	for (uint32_t i = 0; i < peer->ncancelled; i++)
		if (peer->cancelled[i].index == index)
			return true;
	return false;
}

/* Credits came back: the CANCELs they cover were read, and what was written before landed. */
static void cancelled_release(struct tfab_peer *peer)
{
	uint32_t n = 0;

	/* in seq order: the covered ones are a prefix */
	while (n < peer->ncancelled && (int32_t)(peer->tx_acked - peer->cancelled[n].seq) >= 0)
		n++;
	if (!n)
		return;
	memmove(peer->cancelled, peer->cancelled + n,
		(peer->ncancelled - n) * sizeof(*peer->cancelled));
	peer->ncancelled -= n;
}

bool tfab__peer_same_endpoint(const struct tfab_peer *a, const struct tfab_peer *b)
{
	return a == b || (a->path == b->path && a->endpoint_hash == b->endpoint_hash);
}

/*
 * Credits came back, or the peer left: the destinations whose CANCEL they cover (all, once it
 * left) go back to the pool.
 */
static void held_dests_release(struct tfab_peer *peer)
{
	uint32_t kept = 0;

	for (uint32_t i = 0; i < peer->nheld_dests; i++) {
		struct tfab_held_dest h = peer->held_dests[i];

		/* its credits cover the CANCEL, or it left (LEAVE): it writes nothing more */
		if (peer->left || (int32_t)(peer->tx_acked - h.seq) >= 0)
			tfab__pool_free(peer->ctx->pool, h.buf);
		else
			peer->held_dests[kept++] = h;
	}
	peer->nheld_dests = kept;
}

void tfab__peer_send_leave(struct tfab_peer *peer)
{
	struct tfab_wire_msg m = {.type = TFAB_MSG_LEAVE};

	/*
	 * Only a peer with requests here (parked, or answered and waiting for their verdict)
	 * cancels them when it leaves, and waits to hear that we read them: the others need no
	 * LEAVE, and its write may wait for their progress to complete (sockets), which would
	 * hold our leaving up to 2 s (key_index_reconnect).
	 */
	if (!peer->connected || peer->failed || peer->leave_sent || !peer->answers.count)
		return;
	/* the TAKENs still waiting go first, in the slot or before it */
	if (peer->ntaken)
		peer_send_taken(peer);
	if (tfab__peer_send_msg(peer, &m) == 0)
		peer->leave_sent = true;
	TFAB_DEBUG(SUBSYS, "peer %u: leaving it%s", peer->id,
		   peer->leave_sent ? "" : " without a LEAVE (it failed)");
}

/* Control messages in. */

/*
 * The peer's LEAVE, every slot before it read: what it wrote has landed, and it writes
 * nothing more. Our CANCELs it has not read, and our requests standing at it, can be let go
 * without its credits: it is not cut.
 */
static void on_leave(struct tfab_peer *peer)
{
	TFAB_DEBUG(SUBSYS, "peer %u has left (LEAVE)", peer->id);
	peer->left = true;
	peer->ncancelled = 0;
	peer->cancelled_lost = false;
	held_dests_release(peer);
	cancelling_release(peer, true, false);
	tfab__peer_fail_why(peer, -TFAB_ERR_PEER_FAILED, "it left");
}

void tfab__peer_refuse(struct tfab_peer *peer, const char *what)
{
	peer->ctx->stats.refused++;
	if (peer->failed)
		return;
	TFAB_ERROR(SUBSYS, "%s: refused: %s", tfab__peer_name(peer), what);
	tfab__peer_fail(peer, -TFAB_ERR_PROTOCOL);
}

static void protocol_error(struct tfab_peer *peer, const char *what)
{
	tfab__peer_refuse(peer, what);
}

/*
 * A TENSOR_REQUEST, and with AHEAD the requests for the steps after it, each to the sender
 * as a request of its own.
 */
static void on_requests(struct tfab_peer *peer, const struct tfab_wire_msg *m)
{
	struct tfab_wire_msg one;

	if (!(m->flags & TFAB_MSGF_AHEAD)) {
		tfab__send_on_request(peer, m); /* one request: as it came */
		return;
	}
	tfab__wire_msg_copy(&one, m);
	one.flags &= (uint16_t)~TFAB_MSGF_AHEAD;
	one.nahead = 0;
	tfab__send_on_request(peer, &one);
	for (unsigned i = 0; i < m->nahead && !peer->failed; i++) {
		struct tfab_wire_ahead a = tfab__wire_ahead_at(m, i);

		one.req_index = a.req_index;
		one.step_id = m->step_id + 1 + (int64_t)i;
		one.dest_raddr = a.dest_raddr;
		one.dest_rkey = a.dest_rkey;
		tfab__send_on_request(peer, &one);
	}
}

/* m: decoded from the slot; a request by key index gets its key filled in. */
static void on_msg(struct tfab_peer *peer, struct tfab_wire_msg *m)
{
	switch (m->type) {
	case TFAB_MSG_TENSOR_REQUEST:
		if (tfab__key_index_resolve(peer, m) == 0)
			on_requests(peer, m);
		break;
	case TFAB_MSG_RETIRE:
		tfab__key_index_on_retire(peer, m);
		break;
	case TFAB_MSG_CANCEL:
		tfab__send_on_cancel(peer, m->req_index);
		/* its writer may be waiting to let the destination go, or to leave */
		if ((int32_t)(m->seq + 1 - peer->credit_due_seq) > 0)
			peer->credit_due_seq = m->seq + 1;
		break;
	case TFAB_MSG_LEAVE:
		/* handled once every slot before it has been read (tfab__peer_on_ctrl) */
		peer->leave_due = true;
		peer->leave_seq = m->seq;
		break;
	case TFAB_MSG_TAKEN:
		for (unsigned i = 0; i < m->ntaken && !peer->failed; i++)
			tfab__send_on_taken(peer, tfab__wire_taken_at(m, i));
		break;
	case TFAB_MSG_META_DATA:
	case TFAB_MSG_ERROR:
		tfab__recv_on_msg(peer, m);
		break;
	case TFAB_MSG_COLL_DATA: {
		struct tfab_context *ctx = peer->ctx;
		int rc = ctx->coll	  ? ctx->coll->on_data(ctx->coll_arg, peer, m)
			 : ctx->coll_left ? 0
					  : -TFAB_ERR_PROTOCOL;

		if (!ctx->coll && ctx->coll_left)
			TFAB_DEBUG(SUBSYS,
				   "peer %u: collective data after the world was left, dropped",
				   peer->id);
		if (rc < 0)
			protocol_error(
			    peer, ctx->coll ? "collective data no collective of the world expects"
					    : "collective data where no world was joined");
		else if (rc > 0)
			ctx->coll_due = true;
		break;
	}
	default:
		protocol_error(peer, "an unknown message type");
	}
}

void tfab__peer_on_ctrl(struct tfab_context *ctx, uint32_t imm, uint32_t src_id)
{
	uint32_t id = tfab__imm_peer(imm), low = tfab__imm_low(imm);
	size_t r = slots_of(ctx);
	struct tfab_peer *peer = id < ctx->peer_cap ? ctx->peer_by_id[id] : NULL;
	struct tfab_peer *src = src_id < ctx->peer_cap ? ctx->peer_by_id[src_id] : NULL;
	struct tfab_wire_slot_reader rd;
	struct tfab_wire_msg m;
	int rc;

	/*
	 * The writer is known: its immediate must name it (or a peer of the same endpoint),
	 * never another peer, nor one that never was. A peer destroyed since is no lie: a late
	 * write of its connection may come from an endpoint we reach again.
	 */
	if (src && ((peer && !tfab__peer_same_endpoint(peer, src)) ||
		    (!peer && id >= ctx->next_peer_id))) {
		char what[96];

		snprintf(what, sizeof(what), "a control write naming peer %u, not its own id %u",
			 id, src->id);
		tfab__peer_refuse(src, what);
		return;
	}
	if (!peer) {
		TFAB_DEBUG(SUBSYS, "a control write for unknown peer %u (destroyed?), dropped", id);
		return;
	}
	/* After our LEAVE nothing of it matters here, and nothing may answer it. */
	if (peer->failed || peer->leave_sent)
		return;
	if (tfab__imm_is_credit(imm)) {
		if (low == 0)
			return; /* a chunk of content before its last (protocol.md): nothing to do */
		if (peer->tx_seq - peer->tx_acked < low) {
			protocol_error(peer, "credits returned for messages never sent");
			return;
		}
		peer->tx_acked += low;
		if (peer->nheld_dests)
			held_dests_release(peer);
		if (!tfab__list_empty(&peer->cancelling))
			cancelling_release(peer, false, false);
		if (peer->ncancelled)
			cancelled_release(peer);
		TFAB_TRACE(SUBSYS, "peer %u: %u credits back", peer->id, low);
		return;
	}
	if (low >= r) {
		protocol_error(peer, "a message beyond the inbox");
		return;
	}
	tfab__wire_slot_start(&rd, peer->inbox + (size_t)low * SLOT_SIZE, SLOT_SIZE);
	rc = tfab__wire_slot_next(&rd, &m);
	if (rc != 1) {
		protocol_error(peer, "a malformed control message");
		return;
	}
	if (m.seq % r != low || m.seq - peer->rx_next >= r || peer->rx_consumed[low]) {
		protocol_error(peer, "a control message out of its window");
		return;
	}
	if (m.credits > peer->tx_seq - peer->tx_acked) {
		protocol_error(peer, "credits returned for messages never sent");
		return;
	}
	peer->tx_acked += m.credits;
	if (m.credits && peer->nheld_dests)
		held_dests_release(peer);
	if (m.credits && !tfab__list_empty(&peer->cancelling))
		cancelling_release(peer, false, false);
	if (m.credits && peer->ncancelled)
		cancelled_release(peer);
	peer->rx_consumed[low] = 1;
	/* The slot's messages in order (it may hold several: protocol.md, "Message slot"). */
	do {
		/* LEAVE is the last message its writer writes: in its slot, and in seq */
		if (peer->leave_due && (int32_t)(m.seq - peer->leave_seq) >= 0) {
			protocol_error(peer, "a message after a LEAVE");
			return;
		}
		on_msg(peer, &m);
		if (peer->failed)
			return;
		rc = tfab__wire_slot_next(&rd, &m);
	} while (rc == 1);
	if (rc) {
		protocol_error(peer, "a malformed control message");
		return;
	}
	while (peer->rx_consumed[peer->rx_next % r]) {
		peer->rx_consumed[peer->rx_next % r] = 0;
		peer->rx_next++;
		peer->rx_unreturned++;
	}
	if (peer->leave_due && (int32_t)(peer->rx_next - peer->leave_seq) > 0)
		on_leave(peer);
}

/*
 * Reads what came on the peer's bootstrap connection: heartbeats (heartbeat.c), which say
 * it is alive, or its end, which says it has left. Whether it has left.
 */
static bool bootstrap_closed(struct tfab_peer *peer)
{
	if (peer->sock < 0)
		return false;
	if (!peer->closed_at_ms &&
	    tfab__heartbeat_hear(peer->sock, &peer->heard_ms, &peer->said_bye))
		peer->closed_at_ms = tfab__coarse_ms();
	return peer->closed_at_ms != 0;
}

int tfab_peer_left(struct tfab_peer *peer)
{
	int left;

	if (!peer)
		return -EINVAL;
	tfab__ctx_lock(peer->ctx);
	/* A failed peer's connection is read no more: its goodbye may have come since. */
	if (peer->failed && !peer->left && !peer->said_bye)
		(void)bootstrap_closed(peer);
	left = peer->left || peer->said_bye;
	tfab__ctx_unlock(peer->ctx);
	return left;
}

int tfab__peer_write_status(struct tfab_peer *peer, int status)
{
	/*
	 * A refused access is the peer's own answer about one region, unless the peer has gone
	 * (sockets reports writes into a connection the peer closed that way too). Anything
	 * else means the write did not reach the peer, whatever the fabric calls it (tcp cancels
	 * the writes of a connection that broke, sockets reports an I/O error, verbs exhausted
	 * retries): one event, one status.
	 */
	if (status == 0 || (status == -TFAB_ERR_REMOTE_ACCESS && !bootstrap_closed(peer)))
		return status;
	return -TFAB_ERR_PEER_FAILED;
}

void tfab__peer_write_failed(struct tfab_peer *peer, int status)
{
	char why[128];

	if (peer->failed)
		return;
	/* the backend's word that the peer is gone says nothing the warning does not */
	snprintf(why, sizeof(why), "a write to it failed%s%s%s",
		 status == -TFAB_ERR_PEER_FAILED ? "" : ": ",
		 status == -TFAB_ERR_PEER_FAILED ? "" : tfab_strerror(status),
		 bootstrap_closed(peer) ? "; its bootstrap connection closed" : "");
	tfab__peer_fail_why(peer, tfab__peer_write_status(peer, status), why);
}

int tfab__peer_failed(const struct tfab_peer *peer)
{
	return peer->failed;
}

void tfab__peer_fail(struct tfab_peer *peer, int status)
{
	tfab__peer_fail_why(peer, status, NULL);
}

void tfab__peer_fail_why(struct tfab_peer *peer, int status, const char *why)
{
	struct tfab_context *ctx = peer->ctx;
	struct tfab_op_names rnames = {.len = 0}, snames = {.len = 0};
	struct tfab_list *l, *t;
	unsigned recvs = 0, sends;

	if (peer->failed)
		return;
	peer->failed = status ? status : -TFAB_ERR_PEER_FAILED;
	/* as tfab__peer_free reckons for a peer that has not failed */
	peer->cut = !peer->left && (!tfab__list_empty(&peer->requests) || peer->ncancelled ||
				    peer->cancelled_lost || peer->nheld_dests);
	/* No more heartbeats, and the end of the connection: the peer learns it too. */
	if (peer->sock >= 0) {
		tfab__heartbeat_remove(ctx->heartbeat, peer->sock);
		shutdown(peer->sock, SHUT_WR);
	}
	/*
	 * Worth a warning only where something of the application's fails with it: a peer that
	 * leaves (or is destroyed) with nothing pending is news, not trouble.
	 */
	tfab_list_for_each_safe(l, t, &peer->requests)
	{
		struct tfab_request *r = tfab_container_of(l, struct tfab_request, link);

		/* requests posted ahead that no receive owns yet are the library's own */
		if (r->standing)
			continue;
		recvs++;
		tfab__op_names_add(&rnames, r->key, r->step);
	}
	sends = tfab__sends_bound(ctx, peer, &snames);
	if (status != -TFAB_ERR_ABORTED && (recvs || sends))
		TFAB_WARN(SUBSYS, "%s failed: %s%s%s%s; %u receives%s and %u sends%s with it fail",
			  tfab__peer_name(peer), tfab_strerror(peer->failed), why ? " (" : "",
			  why ? why : "", why ? ")" : "", recvs, tfab__op_names_end(&rnames), sends,
			  tfab__op_names_end(&snames));
	else if (status == -TFAB_ERR_TIMEOUT)
		/* a silent peer is trouble with nothing pending too: it may be a stopped host */
		TFAB_WARN(SUBSYS, "%s failed: %s%s%s%s; nothing was pending with it",
			  tfab__peer_name(peer), tfab_strerror(peer->failed), why ? " (" : "",
			  why ? why : "", why ? ")" : "");
	else
		TFAB_INFO(SUBSYS, "%s is gone: %s%s%s%s; nothing was pending with it",
			  tfab__peer_name(peer), tfab_strerror(peer->failed), why ? " (" : "",
			  why ? why : "", why ? ")" : "");
	tfab_list_for_each_safe(l, t, &peer->requests)
	{
		tfab__request_fail(tfab_container_of(l, struct tfab_request, link), peer->failed,
				   false);
	}
	cancelling_release(peer, true, !peer->left);
	tfab__sends_fail_peer(ctx, peer, peer->failed);
	if (ctx->coll && ctx->coll->on_fail(ctx->coll_arg, peer, peer->failed))
		ctx->coll_due = true;
	while (!tfab__list_empty(&peer->pending)) {
		struct tfab_list *p = peer->pending.next;

		tfab__list_del(p);
		free(tfab_container_of(p, struct tfab_pending_msg, link));
	}
}

/*
 * A peer that has sent a heartbeat and then nothing for the stall deadline (at least three
 * heartbeats) has stopped, or the link to it is cut: 0 while it is not judged so.
 */
static uint64_t silence_limit_ms(const struct tfab_context *ctx)
{
	uint64_t limit = ctx->cfg.op_timeout_ms, beats = 3 * (uint64_t)ctx->cfg.heartbeat_ms;

	if (!ctx->heartbeat || !limit)
		return 0;
	return limit > beats ? limit : beats;
}

void tfab__peers_check_liveness(struct tfab_context *ctx)
{
	uint64_t now = tfab__coarse_ms(), silence = silence_limit_ms(ctx);
	struct tfab_list *l, *t;

	if (now < ctx->next_liveness_ms)
		return;
	ctx->next_liveness_ms = now + LIVENESS_MS;
	tfab__pool_trim(ctx->pool); /* blocks the application returned, beyond the bound */
	accepts_reap(ctx);
	tfab_list_for_each_safe(l, t, &ctx->peers)
	{
		struct tfab_peer *peer = tfab_container_of(l, struct tfab_peer, link);

		if (peer->sock < 0 || peer->failed)
			continue;
		if (bootstrap_closed(peer)) {
			if (now >= peer->closed_at_ms + CLOSE_GRACE_MS)
				tfab__peer_fail_why(peer, -TFAB_ERR_PEER_FAILED,
						    peer->said_bye
							? "it left: its bootstrap connection "
							  "closed after its goodbye"
							: "its bootstrap connection closed: its "
							  "process ended, or it left");
			continue;
		}
		if (silence && peer->heard_ms && now > peer->heard_ms + silence) {
			char why[160];

			snprintf(why, sizeof(why),
				 "no heartbeat for %llu ms: it has stopped, or the link to it is "
				 "cut",
				 (unsigned long long)(now - peer->heard_ms));
			tfab__peer_fail_why(peer, -TFAB_ERR_TIMEOUT, why);
		}
	}
	tfab_list_for_each_safe(l, t, &ctx->peers)
	{
		tfab__recv_deadlines(tfab_container_of(l, struct tfab_peer, link), now);
	}
	tfab__send_deadlines(ctx, now);
	if (ctx->coll && ctx->coll->on_tick(ctx->coll_arg, now))
		ctx->coll_due = true;
}

/* The meta-data cache: per peer, by key. */

static uint64_t key_hash(const char *key, uint16_t len)
{
	return tfab__hash_bytes(key, len, 0);
}

/* e, found for a lookup: the most recently used now, and the peer's first guess next time. */
static struct tfab_meta_entry *meta_used(struct tfab_peer *peer, struct tfab_meta_entry *e)
{
	struct tfab_list *lru = &peer->ctx->meta_lru;

	if (e->lru.next != lru) {
		tfab__list_del(&e->lru);
		tfab__list_add_tail(lru, &e->lru);
	}
	peer->meta_last = e;
	return e;
}

struct tfab_meta_entry *tfab__peer_meta_find(struct tfab_peer *peer, const char *key,
					     uint16_t key_len)
{
	struct tfab_meta_entry *e = peer->meta_last;
	uint64_t h;

	/* A receive looks its key up as it starts and as it completes, a fetch of one key
	 * after another the same: the string compared, not hashed and chased in the table. */
	if (e && e->key_len == key_len && memcmp(e->key, key, key_len) == 0)
		return meta_used(peer, e);
	h = key_hash(key, key_len);
	for (struct tfab_hnode *n = tfab__htable_first(&peer->meta, h); n;
	     n = tfab__htable_next(n, h)) {
		e = tfab_container_of(n, struct tfab_meta_entry, node);
		if (e->key_len == key_len && memcmp(e->key, key, key_len) == 0)
			return meta_used(peer, e);
	}
	return NULL;
}

int tfab__peer_meta_store(struct tfab_peer *peer, const char *key, uint16_t key_len,
			  const struct tfab_wire_meta *meta)
{
	struct tfab_context *ctx = peer->ctx;
	struct tfab_meta_entry *e = tfab__peer_meta_find(peer, key, key_len);
	int rc;

	if (e) {
		if (!tfab__wire_meta_equal(&e->meta, meta))
			TFAB_DEBUG(SUBSYS,
				   "peer %u: the meta-data of '%.*s' changed: %u dims, %llu bytes "
				   "-> %u dims, %llu bytes",
				   peer->id, (int)key_len, key, e->meta.ndim,
				   (unsigned long long)e->meta.nbytes, meta->ndim,
				   (unsigned long long)meta->nbytes);
		tfab__meta_copy(&e->meta, meta);
		return 0;
	}
	e = malloc(sizeof(*e) + key_len);
	if (!e)
		return -ENOMEM;
	tfab__list_init(&e->ahead);
	tfab__meta_copy(&e->meta, meta);
	e->key_index = 0;
	e->key_len = key_len;
	e->peer = peer;
	memcpy(e->key, key, key_len);
	rc = tfab__htable_insert(&peer->meta, &e->node, key_hash(key, key_len));
	if (rc) {
		free(e);
		return rc;
	}
	tfab__list_add_tail(&ctx->meta_lru, &e->lru);
	if (++ctx->meta_count > ctx->cfg.meta_cache_entries) {
		/* The least recently used goes: its key's next receive asks without meta-data. */
		struct tfab_meta_entry *old =
		    tfab_container_of(ctx->meta_lru.next, struct tfab_meta_entry, lru);

		tfab__ahead_drop(old);
		tfab__htable_remove(&old->peer->meta, &old->node);
		if (old->peer->meta_last == old)
			old->peer->meta_last = NULL;
		tfab__list_del(&old->lru);
		tfab__key_index_drop(old->peer, old);
		ctx->meta_count--;
		ctx->stats.meta_evictions++;
		free(old);
	}
	return 0;
}
