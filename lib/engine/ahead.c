/*
 * No-request mode's setting (doc/design.md, "No-request mode"): how many requests receives of
 * a key keep standing ahead, per peer and key where tfab_recv_ahead named it, else the
 * context's TFAB_NO_REQUEST. The standing requests themselves are receive requests (recv.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

#define MAX_DEPTH 1024

/* A key tfab_recv_ahead named. */
struct tfab_ahead_key {
	struct tfab_hnode node; /* peer->ahead_keys, by key */
	unsigned depth;
	uint16_t key_len;
	char key[];
};

static uint64_t key_hash(const char *key, uint16_t len)
{
	return tfab__hash_bytes(key, len, 0);
}

static struct tfab_ahead_key *ahead_key_find(struct tfab_peer *peer, const char *key,
					     uint16_t key_len)
{
	uint64_t h = key_hash(key, key_len);

	if (!peer->ahead_keys.buckets)
		return NULL;
	for (struct tfab_hnode *n = tfab__htable_first(&peer->ahead_keys, h); n;
	     n = tfab__htable_next(n, h)) {
		struct tfab_ahead_key *k = tfab_container_of(n, struct tfab_ahead_key, node);

		if (k->key_len == key_len && memcmp(k->key, key, key_len) == 0)
			return k;
	}
	return NULL;
}

unsigned tfab__ahead_depth(struct tfab_peer *peer, const char *key, uint16_t key_len)
{
	struct tfab_ahead_key *k =
	    peer->ahead_keys.count ? ahead_key_find(peer, key, key_len) : NULL;

	return k ? k->depth : peer->ctx->cfg.no_request;
}

int tfab_recv_ahead(struct tfab_context *ctx, struct tfab_peer *peer, const char *key,
		    unsigned depth)
{
	struct tfab_ahead_key *k;
	size_t key_len;
	int rc;

	if (!ctx || !peer || peer->ctx != ctx || depth > MAX_DEPTH)
		return -EINVAL;
	rc = tfab__check_key(key, &key_len);
	if (rc)
		return rc;
	tfab__ctx_lock(ctx);
	k = ahead_key_find(peer, key, (uint16_t)key_len);
	if (k) {
		k->depth = depth;
		tfab__ctx_unlock(ctx);
		return 0;
	}
	if (!peer->ahead_keys.buckets)
		rc = tfab__htable_init(&peer->ahead_keys, 16);
	if (rc == 0 && !(k = malloc(sizeof(*k) + key_len)))
		rc = -ENOMEM;
	if (rc == 0) {
		k->depth = depth;
		k->key_len = (uint16_t)key_len;
		memcpy(k->key, key, key_len);
		rc = tfab__htable_insert(&peer->ahead_keys, &k->node, key_hash(key, k->key_len));
		if (rc)
			free(k);
	}
	tfab__ctx_unlock(ctx);
	return rc;
}

void tfab__ahead_free(struct tfab_peer *peer)
{
	tfab__htable_fini_free(&peer->ahead_keys); /* node is each key's first member */
}
