/*
 * Authenticated bootstrap (TFAB_AUTH_KEY, TFAB_AUTH_KEY_FILE; doc/security.md): before any
 * connection blob is exchanged, each side of a bootstrap connection proves that it holds the
 * shared key, by HMAC-SHA256 over both sides' fresh nonces (OpenSSL's libcrypto), and each
 * blob then goes with a tag over it and the nonces. The connecting side proves itself first,
 * so a stranger that connects learns a nonce and nothing else.
 *
 *   connector                          acceptor
 *   HELLO(nonce C)           ───►
 *                            ◄───     HELLO(nonce A)        (REFUSE: not a HELLO)
 *   PROOF(HMAC(K, 'C', C, A)) ──►
 *                            ◄───     PROOF(HMAC(K, 'A', A, C)) (REFUSE: a wrong proof)
 *   blob, TAG(HMAC(K, 'C', C, A, blob)) ◄──► blob, TAG(...'A'...)
 *
 * Nothing here reads or writes a socket: each message of the peer's is handed in whole, and
 * what goes back is queued (engine/handshake.c moves the bytes), so that a side holds many
 * handshakes at once and the reading can be fuzzed (test/fuzz/fuzz_auth.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <tfab/status.h>

#include "engine/engine.h"
#include "util/sock.h"

#define MAGIC_LEN 4

static const char hello_magic[MAGIC_LEN] = {'T', 'F', 'A', 'U'};
static const char proof_magic[MAGIC_LEN] = {'T', 'F', 'A', 'P'};
static const char refuse_magic[MAGIC_LEN] = {'T', 'F', 'A', 'R'};
#define AUTH_VERSION 1
#define HELLO_LEN (MAGIC_LEN + 2 + TFAB_AUTH_NONCE)
#define PROOF_LEN (MAGIC_LEN + TFAB_AUTH_MAC)

_Static_assert(HELLO_LEN == TFAB_AUTH_MSG_MAX, "a HELLO is the longest message");

int tfab__auth_key_read(const struct tfab_config *cfg, uint8_t *key, size_t cap, size_t *len_p,
			char *err, size_t errlen)
{
	const char *name = cfg->auth_key[0] ? "TFAB_AUTH_KEY" : "TFAB_AUTH_KEY_FILE";
	size_t n = 0;

	*len_p = 0;
	if (cfg->auth_key[0] && cfg->auth_key_file[0]) {
		snprintf(err, errlen, "TFAB_AUTH_KEY and TFAB_AUTH_KEY_FILE are both set: set one");
		return -TFAB_ERR_CONFIG;
	}
	if (cfg->auth_key[0]) {
		n = strlen(cfg->auth_key);
		if (n > cap)
			n = cap; /* the setting holds fewer bytes than the key's room */
		memcpy(key, cfg->auth_key, n);
	} else if (cfg->auth_key_file[0]) {
		int fd = open(cfg->auth_key_file, O_RDONLY | O_CLOEXEC);
		ssize_t r = 0;

		if (fd >= 0) {
			r = read(fd, key, cap);
			close(fd);
		}
		if (fd < 0 || r < 0) {
			snprintf(err, errlen, "TFAB_AUTH_KEY_FILE=%s: %s", cfg->auth_key_file,
				 strerror(errno));
			return -TFAB_ERR_CONFIG;
		}
		n = (size_t)r;
		if (n == cap) {
			snprintf(err, errlen, "TFAB_AUTH_KEY_FILE=%s: longer than %zu bytes",
				 cfg->auth_key_file, cap - 1);
			OPENSSL_cleanse(key, cap);
			return -TFAB_ERR_CONFIG;
		}
		if (n && key[n - 1] == '\n')
			n--;
	} else {
		return 0;
	}
	if (n < TFAB_AUTH_MIN_KEY) {
		snprintf(err, errlen, "%s%s%s holds %zu bytes: a key needs at least %d", name,
			 cfg->auth_key[0] ? "" : "=", cfg->auth_key[0] ? "" : cfg->auth_key_file, n,
			 TFAB_AUTH_MIN_KEY);
		OPENSSL_cleanse(key, cap);
		return -TFAB_ERR_CONFIG;
	}
	*len_p = n;
	return 0;
}

int tfab__auth_load(struct tfab_context *ctx, char *err, size_t errlen)
{
	return tfab__auth_key_read(&ctx->cfg, ctx->auth_key, sizeof(ctx->auth_key),
				   &ctx->auth_key_len, err, errlen);
}

void tfab__auth_unload(struct tfab_context *ctx)
{
	OPENSSL_cleanse(ctx->auth_key, sizeof(ctx->auth_key));
	OPENSSL_cleanse(ctx->cfg.auth_key, sizeof(ctx->cfg.auth_key));
	ctx->auth_key_len = 0;
}

/* HMAC-SHA256(key, "tfab-auth-1" | what | role | nonce of role | the other | data). */
static int mac(const struct tfab_auth *a, const char *what, bool of_acceptor, const void *data,
	       size_t len, uint8_t out[TFAB_AUTH_MAC])
{
	static const char label[] = "tfab-auth-1";
	size_t wlen = strlen(what), n = sizeof(label) - 1 + wlen + 1 + 2 * TFAB_AUTH_NONCE + len;
	uint8_t *m = malloc(n), *p = m;
	unsigned int outlen = 0;
	bool ok;

	if (!m)
		return -ENOMEM;
	memcpy(p, label, sizeof(label) - 1);
	p += sizeof(label) - 1;
	memcpy(p, what, wlen);
	p += wlen;
	*p++ = of_acceptor ? 'A' : 'C';
	memcpy(p, of_acceptor == a->acceptor ? a->nonce_self : a->nonce_peer, TFAB_AUTH_NONCE);
	p += TFAB_AUTH_NONCE;
	memcpy(p, of_acceptor == a->acceptor ? a->nonce_peer : a->nonce_self, TFAB_AUTH_NONCE);
	p += TFAB_AUTH_NONCE;
	if (len)
		memcpy(p, data, len);
	ok = HMAC(EVP_sha256(), a->key, (int)a->key_len, m, n, out, &outlen) &&
	     outlen == TFAB_AUTH_MAC;
	free(m);
	return ok ? 0 : -ENOMEM;
}

static bool is(const uint8_t *msg, uint32_t len, const char magic[MAGIC_LEN])
{
	return msg && len >= MAGIC_LEN && memcmp(msg, magic, MAGIC_LEN) == 0;
}

/* We say no: a REFUSE goes out, and nothing more is taken. */
static int refuse(struct tfab_auth *a, struct tfab_frame_tx *out)
{
	a->stage = TFAB_AUTH_FAILED;
	a->refused = true;
	return tfab__frame_tx_put(out, refuse_magic, MAGIC_LEN) ? -ENOMEM : -TFAB_ERR_AUTH;
}

static int failed(struct tfab_auth *a, int status)
{
	a->stage = TFAB_AUTH_FAILED;
	return status;
}

static int hello_put(const struct tfab_auth *a, struct tfab_frame_tx *out)
{
	uint8_t msg[HELLO_LEN];

	memcpy(msg, hello_magic, MAGIC_LEN);
	msg[MAGIC_LEN] = AUTH_VERSION;
	msg[MAGIC_LEN + 1] = a->acceptor ? 'A' : 'C';
	memcpy(msg + MAGIC_LEN + 2, a->nonce_self, TFAB_AUTH_NONCE);
	return tfab__frame_tx_put(out, msg, HELLO_LEN);
}

static int proof_put(const struct tfab_auth *a, struct tfab_frame_tx *out)
{
	uint8_t msg[PROOF_LEN];
	int rc;

	memcpy(msg, proof_magic, MAGIC_LEN);
	rc = mac(a, "proof", a->acceptor, NULL, 0, msg + MAGIC_LEN);
	return rc ? rc : tfab__frame_tx_put(out, msg, PROOF_LEN);
}

int tfab__auth_start(struct tfab_auth *a, const uint8_t *key, size_t key_len, bool acceptor,
		     const uint8_t *nonce, struct tfab_frame_tx *out)
{
	memset(a, 0, sizeof(*a));
	a->acceptor = acceptor;
	a->stage = TFAB_AUTH_DONE;
	if (!key_len)
		return 0;
	a->on = true;
	a->key = key;
	a->key_len = key_len;
	a->stage = TFAB_AUTH_HELLO;
	if (nonce)
		memcpy(a->nonce_self, nonce, TFAB_AUTH_NONCE);
	else if (RAND_bytes(a->nonce_self, TFAB_AUTH_NONCE) != 1)
		return -EIO;
	/* The acceptor says hello only after the connector did: a stranger gets nothing first. */
	return acceptor ? 0 : hello_put(a, out);
}

/* A message where the peer's HELLO was due. */
static int take_hello(struct tfab_auth *a, const uint8_t *msg, uint32_t len,
		      struct tfab_frame_tx *out, char *why, size_t whylen)
{
	int rc;

	if (is(msg, len, refuse_magic)) {
		snprintf(why, whylen, "it refused us: it holds another TFAB_AUTH_KEY, or none");
		return failed(a, -TFAB_ERR_AUTH);
	}
	if (!msg || len != HELLO_LEN || !is(msg, len, hello_magic) ||
	    msg[MAGIC_LEN] != AUTH_VERSION || msg[MAGIC_LEN + 1] != (a->acceptor ? 'C' : 'A')) {
		if (!msg)
			snprintf(why, whylen,
				 "it sent a message of %u bytes where its HELLO (%d) was due", len,
				 HELLO_LEN);
		else if (!is(msg, len, hello_magic))
			snprintf(why, whylen,
				 "it sent %u bytes that are no HELLO where its HELLO was due", len);
		else
			snprintf(why, whylen,
				 "its HELLO is malformed (%u bytes, version %u, role %u)", len,
				 len > MAGIC_LEN ? msg[MAGIC_LEN] : 0,
				 len > MAGIC_LEN + 1 ? msg[MAGIC_LEN + 1] : 0);
		if (!a->acceptor) /* an acceptor that is no tfab peer: nothing to refuse */
			return failed(a, -TFAB_ERR_PROTOCOL);
		snprintf(why + strlen(why), whylen - strlen(why),
			 ": it did not authenticate (no TFAB_AUTH_KEY there?)");
		return refuse(a, out);
	}
	memcpy(a->nonce_peer, msg + MAGIC_LEN + 2, TFAB_AUTH_NONCE);
	a->stage = TFAB_AUTH_PROOF;
	/* The acceptor's hello answers the connector's; the connector then proves itself first. */
	rc = a->acceptor ? hello_put(a, out) : proof_put(a, out);
	return rc ? failed(a, rc) : 0;
}

/* A message where the peer's PROOF was due. */
static int take_proof(struct tfab_auth *a, const uint8_t *msg, uint32_t len,
		      struct tfab_frame_tx *out, char *why, size_t whylen)
{
	uint8_t want[TFAB_AUTH_MAC];
	int rc;

	if (is(msg, len, refuse_magic)) {
		snprintf(why, whylen, "it refused our proof: it holds another TFAB_AUTH_KEY");
		return failed(a, -TFAB_ERR_AUTH);
	}
	rc = mac(a, "proof", !a->acceptor, NULL, 0, want);
	if (rc)
		return failed(a, rc);
	/* Every byte counts: CRYPTO_memcmp over the whole MAC, in constant time. */
	if (!msg || len != PROOF_LEN || !is(msg, len, proof_magic) ||
	    CRYPTO_memcmp(msg + MAGIC_LEN, want, TFAB_AUTH_MAC) != 0) {
		snprintf(why, whylen, "a wrong proof of TFAB_AUTH_KEY (%u bytes)", len);
		return refuse(a, out);
	}
	a->stage = TFAB_AUTH_DONE;
	rc = a->acceptor ? proof_put(a, out) : 0;
	return rc ? failed(a, rc) : 1;
}

int tfab__auth_take(struct tfab_auth *a, const uint8_t *msg, uint32_t len,
		    struct tfab_frame_tx *out, char *why, size_t whylen)
{
	switch (a->stage) {
	case TFAB_AUTH_HELLO:
		return take_hello(a, msg, len, out, why, whylen);
	case TFAB_AUTH_PROOF:
		return take_proof(a, msg, len, out, why, whylen);
	case TFAB_AUTH_DONE:
		return 1;
	default:
		snprintf(why, whylen, "the handshake has already failed");
		return -TFAB_ERR_AUTH;
	}
}

int tfab__auth_tag_put(const struct tfab_auth *a, const void *data, uint32_t len,
		       struct tfab_frame_tx *out)
{
	uint8_t tag[TFAB_AUTH_MAC];
	int rc;

	if (!a->on)
		return 0;
	rc = mac(a, "blob", a->acceptor, data, len, tag);
	return rc ? rc : tfab__frame_tx_put(out, tag, sizeof(tag));
}

int tfab__auth_tag_check(struct tfab_auth *a, const void *data, uint32_t len, const uint8_t *tag,
			 uint32_t tlen, struct tfab_frame_tx *out, char *why, size_t whylen)
{
	uint8_t want[TFAB_AUTH_MAC];
	int rc;

	if (!a->on)
		return 0;
	if (a->stage != TFAB_AUTH_DONE) {
		snprintf(why, whylen, "a tag before the handshake was done");
		return refuse(a, out);
	}
	rc = mac(a, "blob", !a->acceptor, data, len, want);
	if (rc)
		return failed(a, rc);
	if (!tag || tlen != sizeof(want) || CRYPTO_memcmp(tag, want, sizeof(want)) != 0) {
		snprintf(why, whylen, "its message of %u bytes does not carry its key's tag", len);
		return refuse(a, out);
	}
	return 0;
}

int tfab__auth_unkeyed(struct tfab_auth *a, const uint8_t *msg, uint32_t len,
		       struct tfab_frame_tx *out, char *why, size_t whylen)
{
	if (a->on)
		return 0;
	if (is(msg, len, refuse_magic)) {
		snprintf(why, whylen,
			 "it refused us: it requires a TFAB_AUTH_KEY, and none is set "
			 "here");
		return failed(a, -TFAB_ERR_AUTH);
	}
	if (!is(msg, len, hello_magic))
		return 0;
	snprintf(why, whylen, "it asks for authentication (TFAB_AUTH_KEY), and no key is set here");
	/* A keyed connector waits for our hello: a refusal tells it why it gets none. */
	return a->acceptor ? refuse(a, out) : failed(a, -TFAB_ERR_AUTH);
}
