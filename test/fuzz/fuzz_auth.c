/*
 * The authentication's reading of the other side's messages (lib/engine/auth.c), as the
 * listener (acceptor) and as the connector read them, with a fixed key and fixed nonces.
 *
 * Input: a byte that picks the side (bit 0: acceptor), then records: a byte of kind and a byte
 * of length, then that many bytes. Kinds: 0, a message of the handshake; 1, one too long to
 * read (length × 64 bytes, as the framing refuses it); 2, a tag over FUZZ_BLOB; 3, a
 * message where a blob is due, read by a side without a key.
 *
 * Properties: the side is authenticated only by a proof that is HMAC-SHA256 over the
 * documented fields (computed here with OpenSSL, not with auth.c), and a tag is taken only
 * when it is that HMAC; once the handshake failed nothing is taken; every failure says why;
 * a refusal of ours leaves a REFUSE last in what goes out, and nothing else is ever sent but
 * a HELLO, a PROOF or a REFUSE.
 */
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <tfab/status.h>

#include "engine/engine.h"
#include "fuzz.h"
#include "fuzz_bootstrap.h"
#include "util/sock.h"

#define KEY FUZZ_AUTH_KEY
#define NONCE_C FUZZ_NONCE_C
#define NONCE_A FUZZ_NONCE_A

/* HMAC(K, "tfab-auth-1" | what | role | nonce of role | the other's | data), as documented. */
static void reference(const char *what, char role, const uint8_t *own, const uint8_t *other,
		      const uint8_t *data, size_t len, uint8_t out[TFAB_AUTH_MAC])
{
	uint8_t m[11 + 5 + 1 + 2 * TFAB_AUTH_NONCE + 64];
	size_t n = 0, wl = strlen(what);
	unsigned int ol = 0;

	memcpy(m, "tfab-auth-1", 11);
	n = 11;
	memcpy(m + n, what, wl);
	n += wl;
	m[n++] = (uint8_t)role;
	memcpy(m + n, own, TFAB_AUTH_NONCE);
	n += TFAB_AUTH_NONCE;
	memcpy(m + n, other, TFAB_AUTH_NONCE);
	n += TFAB_AUTH_NONCE;
	FUZZ_CHECK(len <= 64);
	if (len)
		memcpy(m + n, data, len);
	n += len;
	FUZZ_CHECK(HMAC(EVP_sha256(), KEY, (int)strlen(KEY), m, n, out, &ol) &&
		   ol == TFAB_AUTH_MAC);
}

/* Every frame queued so far is one of ours; whether the last is a REFUSE. */
static bool sent_ok(const struct tfab_frame_tx *out)
{
	size_t off = 0;
	bool refuse = false;

	while (off < out->len) {
		uint8_t buf[64];
		struct tfab_frame_rx rx;
		size_t used;

		tfab__frame_rx_init(&rx, buf, sizeof(buf));
		FUZZ_CHECK(tfab__frame_rx_feed(&rx, out->buf + off, out->len - off, &used) == 1);
		off += used;
		FUZZ_CHECK(rx.len >= 4);
		FUZZ_CHECK(memcmp(buf, "TFAU", 4) == 0 || memcmp(buf, "TFAP", 4) == 0 ||
			   memcmp(buf, "TFAR", 4) == 0);
		refuse = memcmp(buf, "TFAR", 4) == 0;
	}
	return refuse;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *blob = FUZZ_BLOB;
	struct tfab_frame_tx out = {0};
	struct tfab_auth a, plain;
	uint8_t peer_nonce[TFAB_AUTH_NONCE], want[TFAB_AUTH_MAC];
	bool acceptor, failed = false, done = false, have_nonce = false;
	char why[512];
	size_t i = 1;

	fuzz_quiet();
	if (size < 1)
		return 0;
	acceptor = data[0] & 1;
	FUZZ_CHECK(tfab__auth_start(&a, (const uint8_t *)KEY, strlen(KEY), acceptor,
				    acceptor ? NONCE_A : NONCE_C, &out) == 0);
	FUZZ_CHECK(tfab__auth_start(&plain, NULL, 0, acceptor, NULL, &out) == 0);
	FUZZ_CHECK(plain.stage == TFAB_AUTH_DONE && !plain.on);
	while (i + 2 <= size) {
		uint8_t kind = data[i] & 3, len = data[i + 1];
		const uint8_t *msg = data + i + 2;
		int rc;

		if (i + 2 + len > size)
			break;
		i += 2 + (size_t)len;
		why[0] = '\0';
		if (kind == 3) {
			rc = tfab__auth_unkeyed(&plain, msg, len, &out, why, sizeof(why));
			FUZZ_CHECK(rc == 0 || rc == -TFAB_ERR_AUTH);
			FUZZ_CHECK(rc == 0 || why[0]);
			FUZZ_CHECK(rc == 0 || (len >= 4 && (memcmp(msg, "TFAU", 4) == 0 ||
							    memcmp(msg, "TFAR", 4) == 0)));
			if (rc)
				break;
			continue;
		}
		if (kind == 2) {
			rc = tfab__auth_tag_check(&a, blob, sizeof(FUZZ_BLOB), msg, len, &out, why,
						  sizeof(why));
			if (rc == 0) {
				/* only the other side's tag over the blob, once authenticated */
				FUZZ_CHECK(done && len == TFAB_AUTH_MAC);
				reference("blob", acceptor ? 'C' : 'A', peer_nonce,
					  acceptor ? NONCE_A : NONCE_C, blob, sizeof(FUZZ_BLOB),
					  want);
				FUZZ_CHECK(memcmp(msg, want, TFAB_AUTH_MAC) == 0);
			} else {
				FUZZ_CHECK(why[0] && a.stage == TFAB_AUTH_FAILED);
				failed = true;
			}
			continue;
		}
		rc = tfab__auth_take(&a, kind == 1 ? NULL : msg,
				     kind == 1 ? (uint32_t)len * 64u : len, &out, why, sizeof(why));
		if (failed || a.stage == TFAB_AUTH_FAILED)
			FUZZ_CHECK(rc < 0 && why[0]);
		if (rc < 0) {
			FUZZ_CHECK(rc == -TFAB_ERR_AUTH || rc == -TFAB_ERR_PROTOCOL);
			FUZZ_CHECK(why[0]);
			FUZZ_CHECK(!a.refused || sent_ok(&out));
			failed = true;
			continue;
		}
		if (rc == 0 && !have_nonce) {
			/* a HELLO of the other role was taken: its nonce is the peer's from now on */
			FUZZ_CHECK(kind == 0 && len == TFAB_AUTH_MSG_MAX);
			FUZZ_CHECK(memcmp(msg, "TFAU\x01", 5) == 0 &&
				   msg[5] == (acceptor ? 'C' : 'A'));
			memcpy(peer_nonce, msg + 6, TFAB_AUTH_NONCE);
			FUZZ_CHECK(memcmp(a.nonce_peer, peer_nonce, TFAB_AUTH_NONCE) == 0);
			have_nonce = true;
		} else if (rc == 1 && !done) {
			/* authenticated: by the proof that HMAC makes of the two nonces, and none other */
			FUZZ_CHECK(have_nonce && kind == 0 && len == 4 + TFAB_AUTH_MAC);
			reference("proof", acceptor ? 'C' : 'A', peer_nonce,
				  acceptor ? NONCE_A : NONCE_C, NULL, 0, want);
			FUZZ_CHECK(memcmp(msg, "TFAP", 4) == 0 &&
				   memcmp(msg + 4, want, TFAB_AUTH_MAC) == 0);
			done = true;
		} else {
			FUZZ_CHECK(rc == 1 && done);
		}
		FUZZ_CHECK(!sent_ok(&out));
	}
	tfab__frame_tx_free(&out);
	return 0;
}
