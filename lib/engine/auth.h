/*
 * The authenticated bootstrap (auth.c, doc/security.md): the challenge-response that a
 * connection of the TCP bootstrap runs first when a key is set, and the tags its messages
 * carry afterwards. The handshakes (handshake.h) embed its state.
 */
#ifndef TFAB_ENGINE_AUTH_H
#define TFAB_ENGINE_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tfab_config;
struct tfab_context;
struct tfab_frame_tx;

#define TFAB_AUTH_NONCE 32
#define TFAB_AUTH_MAC 32     /* HMAC-SHA256 */
#define TFAB_AUTH_MIN_KEY 16 /* bytes */
#define TFAB_AUTH_MSG_MAX 38 /* the longest message of the handshake (a HELLO) */
enum tfab_auth_stage {
	TFAB_AUTH_HELLO, /* the peer's HELLO is due */
	TFAB_AUTH_PROOF, /* its PROOF */
	TFAB_AUTH_DONE,	 /* it proved it holds the key (or there is none) */
	TFAB_AUTH_FAILED,
};
struct tfab_auth {
	bool on;       /* a key is set: the handshake runs and messages carry tags */
	bool acceptor; /* this side accepted the connection */
	bool refused;  /* this side refused the peer: a REFUSE is queued */
	uint8_t stage; /* enum tfab_auth_stage */
	const uint8_t *key;
	size_t key_len;
	uint8_t nonce_self[TFAB_AUTH_NONCE], nonce_peer[TFAB_AUTH_NONCE];
};

/*
 * The key of TFAB_AUTH_KEY or TFAB_AUTH_KEY_FILE into key (cap bytes of room; *len_p 0 when
 * neither is set). A short key, both set, or a file that cannot be read: -TFAB_ERR_CONFIG
 * with err naming the setting.
 */
int tfab__auth_key_read(const struct tfab_config *cfg, uint8_t *key, size_t cap, size_t *len_p,
			char *err, size_t errlen);
/* Load the key into ctx (none set: no key). */
int tfab__auth_load(struct tfab_context *ctx, char *err, size_t errlen);
void tfab__auth_unload(struct tfab_context *ctx);
/*
 * A new connection's handshake: with a key (key_len > 0) draws this side's nonce (nonce NULL;
 * the fuzz target and its seeds give one), and a connector queues its HELLO into out;
 * without, a is off and done at once.
 */
int tfab__auth_start(struct tfab_auth *a, const uint8_t *key, size_t key_len, bool acceptor,
		     const uint8_t *nonce, struct tfab_frame_tx *out);
/*
 * One message of the peer's during the handshake (msg NULL: one of len bytes, too long for
 * the handshake, not read). 0: another is due; 1: the peer proved it holds the key (an
 * acceptor's proof is queued). Or a status, with why: -TFAB_ERR_AUTH for a wrong proof or a
 * refusal (a->refused: this side refused, a REFUSE is queued; else the peer refused us),
 * -TFAB_ERR_PROTOCOL for an acceptor whose first message is none of the handshake's.
 */
int tfab__auth_take(struct tfab_auth *a, const uint8_t *msg, uint32_t len,
		    struct tfab_frame_tx *out, char *why, size_t whylen);
/* After a message of ours, its tag (nothing when a is off). */
int tfab__auth_tag_put(const struct tfab_auth *a, const void *data, uint32_t len,
		       struct tfab_frame_tx *out);
/* The peer's tag over its message: 0, or -TFAB_ERR_AUTH with why and a REFUSE queued. */
int tfab__auth_tag_check(struct tfab_auth *a, const void *data, uint32_t len, const uint8_t *tag,
			 uint32_t tlen, struct tfab_frame_tx *out, char *why, size_t whylen);
/*
 * Without a key: a keyed peer's HELLO or REFUSE where a message of the bootstrap was due is
 * -TFAB_ERR_AUTH with why (an acceptor refuses: queued); anything else 0.
 */
int tfab__auth_unkeyed(struct tfab_auth *a, const uint8_t *msg, uint32_t len,
		       struct tfab_frame_tx *out, char *why, size_t whylen);

#endif
