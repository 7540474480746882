/*
 * Keys as indexes (protocol.md, "Key indexes"), both sides of one peer.
 *
 * Ours (the receiver's): a key whose meta-data we cache gets a 32-bit index the first time we
 * request it again; that request carries the key and announces the index, and every later one
 * carries the index alone. When the cache lets the entry go, the index is retired: RETIRE
 * messages of up to 251 tell the peer, and the index is never used again on this connection.
 * The peer's (the sender's): the names it announced, by index, until it retires them; a
 * request naming an index it never announced, or one it retired, fails the peer
 * (-TFAB_ERR_PROTOCOL), never serves another key's tensor.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <tfab/status.h>

#include "engine/engine.h"
#include "util/log.h"

#define SUBSYS TFAB_ENGINE_SUBSYS

/* A name the peer announced. */
struct tfab_key_name {
	struct tfab_hnode node; /* peer->key_names, by index */
	uint32_t index;
	uint16_t key_len;
	char key[];
};

static uint64_t index_hash(uint32_t index)
{
	return tfab__hash_bytes(&index, sizeof(index), 0);
}

static struct tfab_key_name *name_find(struct tfab_peer *peer, uint32_t index)
{
	uint64_t h = index_hash(index);

	for (struct tfab_hnode *n = tfab__htable_first(&peer->key_names, h); n;
	     n = tfab__htable_next(n, h)) {
		struct tfab_key_name *k = tfab_container_of(n, struct tfab_key_name, node);

		if (k->index == index)
			return k;
	}
	return NULL;
}

static int refuse(struct tfab_peer *peer, const char *what, uint32_t index)
{
	TFAB_ERROR(SUBSYS, "peer %u: %s key index %u", peer->id, what, index);
	tfab__peer_fail(peer, -TFAB_ERR_PROTOCOL);
	return -TFAB_ERR_PROTOCOL;
}

void tfab__key_index_request(struct tfab_peer *peer, struct tfab_meta_entry *e,
			     struct tfab_wire_msg *m)
{
	if (!peer->ctx->cfg.key_index || !e)
		return;
	if (e->key_index) {
		m->flags |= TFAB_MSGF_KEY_INDEX;
		m->key_index = e->key_index;
		m->key_len = 0;
		m->key = NULL;
		return;
	}
	if (peer->next_key_index == UINT32_MAX)
		return; /* 4 billion announced on this connection: full keys from here on */
	e->key_index = ++peer->next_key_index;
	m->flags |= TFAB_MSGF_KEY_INDEX;
	m->key_index = e->key_index;
}

void tfab__key_index_drop(struct tfab_peer *peer, struct tfab_meta_entry *e)
{
	if (!e->key_index || peer->failed)
		return;
	if (peer->nretired == peer->retired_cap) {
		uint32_t cap = peer->retired_cap ? peer->retired_cap * 2 : 64;
		uint32_t *t = realloc(peer->retired, cap * sizeof(*t));

		if (!t) {
			/* The peer keeps a name it no longer needs: memory, never a wrong key. */
			TFAB_WARN(SUBSYS, "peer %u: no memory to retire key index %u", peer->id,
				  e->key_index);
			return;
		}
		peer->retired = t;
		peer->retired_cap = cap;
	}
	peer->retired[peer->nretired++] = e->key_index; /* told by the next peers_flush */
}

void tfab__key_index_flush(struct tfab_peer *peer)
{
	uint32_t done = 0;

	/* Full messages only: a retired name costs the peer memory, not correctness. */
	while (peer->nretired - done >= TFAB_WIRE_MAX_TAKEN && !peer->failed) {
		struct tfab_wire_msg m = {.type = TFAB_MSG_RETIRE, .ntaken = TFAB_WIRE_MAX_TAKEN};

		m.req_index = peer->retired[done];
		m.taken = peer->retired + done + 1;
		if (tfab__peer_send_msg(peer, &m))
			break;
		done += TFAB_WIRE_MAX_TAKEN;
	}
	memmove(peer->retired, peer->retired + done, (peer->nretired - done) * sizeof(uint32_t));
	peer->nretired -= done;
}

int tfab__key_index_resolve(struct tfab_peer *peer, struct tfab_wire_msg *m)
{
	struct tfab_key_name *k;

	if (!(m->flags & TFAB_MSGF_KEY_INDEX))
		return 0;
	if (m->key_index == 0)
		return refuse(peer, "a request with", 0);
	k = name_find(peer, m->key_index);
	if (m->key_len == 0) {
		if (!k)
			return refuse(peer,
				      "a request for an unknown (never announced, or retired)",
				      m->key_index);
		m->key = (const uint8_t *)k->key;
		m->key_len = k->key_len;
		return 0;
	}
	if (k)
		return refuse(peer, "a request announcing the taken", m->key_index);
	if (peer->key_names.count >= TFAB_MAX_KEY_NAMES)
		return refuse(peer, "a request announcing one too many:", m->key_index);
	k = malloc(sizeof(*k) + m->key_len);
	if (!k) {
		TFAB_ERROR(SUBSYS, "peer %u: no memory for key index %u", peer->id, m->key_index);
		tfab__peer_fail(peer, -ENOMEM);
		return -ENOMEM;
	}
	k->index = m->key_index;
	k->key_len = m->key_len;
	memcpy(k->key, m->key, m->key_len);
	if (tfab__htable_insert(&peer->key_names, &k->node, index_hash(k->index))) {
		free(k);
		tfab__peer_fail(peer, -ENOMEM);
		return -ENOMEM;
	}
	return 0;
}

void tfab__key_index_on_retire(struct tfab_peer *peer, const struct tfab_wire_msg *m)
{
	for (unsigned i = 0; i < m->ntaken && !peer->failed; i++) {
		uint32_t index = tfab__wire_taken_at(m, i);
		struct tfab_key_name *k = name_find(peer, index);

		if (!k) {
			refuse(peer, "a RETIRE of the unknown", index);
			return;
		}
		tfab__htable_remove(&peer->key_names, &k->node);
		free(k);
	}
}

void tfab__key_index_free(struct tfab_peer *peer)
{
	tfab__htable_fini_free(&peer->key_names); /* node is each name's first member */
	free(peer->retired);
}
