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
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <tfab/status.h>

#include "engine/engine.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/time.h"

#define SUBSYS "engine"
#define MIN_KEY 16
#define MAGIC_LEN 4

static const char hello_magic[MAGIC_LEN] = {'T', 'F', 'A', 'U'};
static const char proof_magic[MAGIC_LEN] = {'T', 'F', 'A', 'P'};
static const char refuse_magic[MAGIC_LEN] = {'T', 'F', 'A', 'R'};
#define AUTH_VERSION 1
#define HELLO_LEN (MAGIC_LEN + 2 + TFAB_AUTH_NONCE)
#define PROOF_LEN (MAGIC_LEN + TFAB_AUTH_MAC)

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
	if (n < MIN_KEY) {
		snprintf(err, errlen, "%s%s%s holds %zu bytes: a key needs at least %d", name,
			 cfg->auth_key[0] ? "" : "=", cfg->auth_key[0] ? "" : cfg->auth_key_file, n,
			 MIN_KEY);
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
static int mac(const struct tfab_context *ctx, const struct tfab_auth *a, const char *what,
	       bool of_acceptor, const void *data, size_t len, uint8_t out[TFAB_AUTH_MAC])
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
	ok = HMAC(EVP_sha256(), ctx->auth_key, (int)ctx->auth_key_len, m, n, out, &outlen) &&
	     outlen == TFAB_AUTH_MAC;
	free(m);
	return ok ? 0 : -ENOMEM;
}

/* Who is at the other end of fd, for the log. */
static void who(int fd, char *buf, size_t len)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char host[64] = "?";
	unsigned port = 0;

	if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0) {
		if (ss.ss_family == AF_INET) {
			struct sockaddr_in *in = (struct sockaddr_in *)&ss;

			inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
			port = ntohs(in->sin_port);
		} else if (ss.ss_family == AF_INET6) {
			struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;

			inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
			port = ntohs(in6->sin6_port);
		}
	}
	snprintf(buf, len, "%s:%u", host, port);
}

/*
 * Tell the peer no, and read what it still sends until it closes (for at most a second):
 * closing with its bytes unread would reset the connection, and the refusal with it.
 */
static int refuse(int fd, int timeout_ms, const char *why)
{
	uint64_t until = tfab__now_ms() + 1000;
	char peer[96], sink[4096];

	who(fd, peer, sizeof(peer));
	TFAB_WARN(SUBSYS, "refused a peer at %s: %s", peer, why);
	(void)tfab__sock_send_msg(fd, refuse_magic, MAGIC_LEN, timeout_ms);
	shutdown(fd, SHUT_WR);
	for (uint64_t now = tfab__now_ms(); now < until; now = tfab__now_ms()) {
		struct pollfd p = {.fd = fd, .events = POLLIN};

		if (poll(&p, 1, (int)(until - now)) <= 0 || read(fd, sink, sizeof(sink)) <= 0)
			break;
	}
	return -TFAB_ERR_AUTH;
}

/* What a first message that is not ours says. */
static int unexpected(int fd, const uint8_t *m, uint32_t len, int timeout_ms, bool keyed)
{
	if (len >= MAGIC_LEN && memcmp(m, refuse_magic, MAGIC_LEN) == 0) {
		TFAB_ERROR(SUBSYS, "the peer refused us: %s",
			   keyed ? "it holds another TFAB_AUTH_KEY"
				 : "it requires a TFAB_AUTH_KEY, and none is set here");
		return -TFAB_ERR_AUTH;
	}
	if (!keyed) {
		TFAB_ERROR(SUBSYS, "the peer requires authentication (TFAB_AUTH_KEY), and no key "
				   "is set here");
		return -TFAB_ERR_AUTH;
	}
	return refuse(fd, timeout_ms, "it did not authenticate (no TFAB_AUTH_KEY there?)");
}

static int hello_send(int fd, const struct tfab_auth *a, int timeout_ms)
{
	uint8_t msg[HELLO_LEN];

	memcpy(msg, hello_magic, MAGIC_LEN);
	msg[MAGIC_LEN] = AUTH_VERSION;
	msg[MAGIC_LEN + 1] = a->acceptor ? 'A' : 'C';
	memcpy(msg + MAGIC_LEN + 2, a->nonce_self, TFAB_AUTH_NONCE);
	return tfab__sock_send_msg(fd, msg, HELLO_LEN, timeout_ms);
}

/* The other side's hello, its nonce into a; anything else is refused. */
static int hello_recv(int fd, struct tfab_auth *a, int timeout_ms)
{
	uint8_t msg[HELLO_LEN];
	uint32_t len;
	int rc = tfab__sock_recv_msg(fd, msg, sizeof(msg), &len, timeout_ms);

	if (rc == -EMSGSIZE) /* a blob: a peer without a key */
		return unexpected(fd, msg, 0, timeout_ms, true);
	if (rc)
		return rc;
	if (len != HELLO_LEN || memcmp(msg, hello_magic, MAGIC_LEN) ||
	    msg[MAGIC_LEN] != AUTH_VERSION || msg[MAGIC_LEN + 1] != (a->acceptor ? 'C' : 'A'))
		return unexpected(fd, msg, len, timeout_ms, true);
	memcpy(a->nonce_peer, msg + MAGIC_LEN + 2, TFAB_AUTH_NONCE);
	return 0;
}

static int proof_send(const struct tfab_context *ctx, int fd, const struct tfab_auth *a,
		      int timeout_ms)
{
	uint8_t msg[PROOF_LEN];
	int rc;

	memcpy(msg, proof_magic, MAGIC_LEN);
	rc = mac(ctx, a, "proof", a->acceptor, NULL, 0, msg + MAGIC_LEN);
	return rc ? rc : tfab__sock_send_msg(fd, msg, PROOF_LEN, timeout_ms);
}

int tfab__auth_handshake(struct tfab_context *ctx, int fd, bool acceptor, int timeout_ms,
			 struct tfab_auth *a)
{
	uint8_t msg[PROOF_LEN], want[TFAB_AUTH_MAC];
	uint32_t len;
	int rc;

	memset(a, 0, sizeof(*a));
	a->acceptor = acceptor;
	if (!ctx->auth_key_len)
		return 0;
	a->on = true;
	if (RAND_bytes(a->nonce_self, TFAB_AUTH_NONCE) != 1)
		return -EIO;
	if (acceptor) {
		/* The connector's hello first: a stranger gets nothing until it sent one. */
		rc = hello_recv(fd, a, timeout_ms);
		if (rc == 0)
			rc = hello_send(fd, a, timeout_ms);
		if (rc)
			return rc;
	} else {
		rc = hello_send(fd, a, timeout_ms);
		if (rc == 0)
			rc = hello_recv(fd, a, timeout_ms);
		if (rc)
			return rc;
		rc = proof_send(ctx, fd, a, timeout_ms); /* ours first */
		if (rc)
			return rc;
	}
	/* The peer's proof: the connector's (acceptor), then the acceptor's (connector). */
	rc = tfab__sock_recv_msg(fd, msg, sizeof(msg), &len, timeout_ms);
	if (rc == -EMSGSIZE)
		return refuse(fd, timeout_ms, "a wrong proof of TFAB_AUTH_KEY");
	if (rc)
		return rc;
	if (len >= MAGIC_LEN && memcmp(msg, refuse_magic, MAGIC_LEN) == 0)
		return unexpected(fd, msg, len, timeout_ms, true);
	rc = mac(ctx, a, "proof", !acceptor, NULL, 0, want);
	if (rc)
		return rc;
	if (len != PROOF_LEN || memcmp(msg, proof_magic, MAGIC_LEN) ||
	    CRYPTO_memcmp(msg + MAGIC_LEN, want, TFAB_AUTH_MAC) != 0)
		return refuse(fd, timeout_ms, "a wrong proof of TFAB_AUTH_KEY");
	return acceptor ? proof_send(ctx, fd, a, timeout_ms) : 0;
}

int tfab__auth_blob_send(struct tfab_context *ctx, int fd, const struct tfab_auth *a,
			 const void *blob, uint32_t len, int timeout_ms)
{
	uint8_t tag[TFAB_AUTH_MAC];
	int rc = tfab__sock_send_msg(fd, blob, len, timeout_ms);

	if (rc || !a->on)
		return rc;
	rc = mac(ctx, a, "blob", a->acceptor, blob, len, tag);
	if (rc == 0)
		rc = tfab__sock_send_msg(fd, tag, sizeof(tag), timeout_ms);
	return rc;
}

int tfab__auth_blob_recv(struct tfab_context *ctx, int fd, const struct tfab_auth *a, void *blob,
			 uint32_t cap, uint32_t *len_p, int timeout_ms)
{
	uint8_t tag[TFAB_AUTH_MAC], want[TFAB_AUTH_MAC];
	uint32_t tlen;
	int rc = tfab__sock_recv_msg(fd, blob, cap, len_p, timeout_ms);

	if (rc)
		return rc;
	if (!a->on) {
		/* A keyed peer's hello, or its refusal, where a blob was due. */
		if (*len_p >= MAGIC_LEN && (memcmp(blob, hello_magic, MAGIC_LEN) == 0 ||
					    memcmp(blob, refuse_magic, MAGIC_LEN) == 0))
			return unexpected(fd, blob, *len_p, timeout_ms, false);
		return 0;
	}
	rc = tfab__sock_recv_msg(fd, tag, sizeof(tag), &tlen, timeout_ms);
	if (rc == 0)
		rc = mac(ctx, a, "blob", !a->acceptor, blob, *len_p, want);
	if (rc)
		return rc;
	if (tlen != sizeof(tag) || CRYPTO_memcmp(tag, want, sizeof(tag)) != 0)
		return refuse(fd, timeout_ms, "its connection blob does not carry its key's tag");
	return 0;
}
