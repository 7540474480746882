/*
 * The bootstrap's handshakes: the framing parser fed in pieces, the authentication's
 * messages read by each side (a proof or a tag wrong in its last byte only is refused), a
 * world's records and rank 0's answer read as rank 0 and a rank read them (a rank >= the
 * world's size is refused), strangers on a listening context (silent, sending garbage,
 * holding another key) that delay no peer and are closed by their deadline (between calls
 * to tfab_accept too), tfab_abort ending a waiting tfab_accept or tfab_connect, and what
 * tfab_connect says when the other end is no tfab peer, no host, or refuses.
 *
 * The contexts are on the native shm backend (TFAB_PROVIDER=shm, set by meson).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <tfab/tfab.h>

#include "engine/engine.h"
#include "engine/handshake.h"
#include "world/world.h"
#include "util/sock.h"
#include "util/time.h"

/* A bound on waits that should end at once; a hang still ends. */
#define LONG_MS 30000
/* Slack allowed past a deadline on a loaded 2-core machine. */
#define SLACK_MS 1500

static const char KEY[] = "0123456789abcdef-bootstrap-test";

/* Every log line, so that a test can check what was said (and where). */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_text[1 << 16];
static size_t log_len;

static void log_sink(void *arg, enum tfab_log_level level, const char *subsys, const char *msg)
{
	(void)arg;
	pthread_mutex_lock(&log_lock);
	if (log_len < sizeof(log_text) - 1)
		log_len +=
		    (size_t)snprintf(log_text + log_len, sizeof(log_text) - log_len, "%s [%s] %s\n",
				     tfab_log_level_name(level), subsys, msg);
	if (log_len > sizeof(log_text) - 1)
		log_len = sizeof(log_text) - 1;
	pthread_mutex_unlock(&log_lock);
	fprintf(stderr, "tfab %s [%s] %s\n", tfab_log_level_name(level), subsys, msg);
}

static void log_clear(void)
{
	pthread_mutex_lock(&log_lock);
	log_len = 0;
	log_text[0] = '\0';
	pthread_mutex_unlock(&log_lock);
}

/* Whether a line holding all of a and b (b may be NULL) was logged. */
static bool logged(const char *a, const char *b)
{
	bool found = false;
	char *line, *save = NULL, *copy;

	pthread_mutex_lock(&log_lock);
	copy = strdup(log_text);
	pthread_mutex_unlock(&log_lock);
	assert_non_null(copy);
	for (line = strtok_r(copy, "\n", &save); line && !found; line = strtok_r(NULL, "\n", &save))
		found = strstr(line, a) && (!b || strstr(line, b));
	free(copy);
	return found;
}

/* The framing parser, fed from memory. */

static void test_frame_pieces(void **state)
{
	static const uint8_t stream[] = {0, 0, 0, 3, 'a', 'b', 'c', 0, 0, 0, 0, 0, 0, 0, 2, 'x'};
	uint8_t buf[8];
	struct tfab_frame_rx rx;
	size_t used;

	(void)state;
	/* byte by byte: the parser never takes a byte past its message */
	tfab__frame_rx_init(&rx, buf, sizeof(buf));
	for (size_t i = 0; i < 6; i++) {
		assert_int_equal(tfab__frame_rx_feed(&rx, stream + i, 1, &used), 0);
		assert_int_equal(used, 1);
	}
	assert_int_equal(tfab__frame_rx_feed(&rx, stream + 6, 10, &used), 1);
	assert_int_equal(used, 1);
	assert_int_equal(rx.len, 3);
	assert_memory_equal(buf, "abc", 3);
	/* an empty message, then one cut short */
	tfab__frame_rx_init(&rx, buf, sizeof(buf));
	assert_int_equal(tfab__frame_rx_feed(&rx, stream + 7, 9, &used), 1);
	assert_int_equal(used, 4);
	assert_int_equal(rx.len, 0);
	tfab__frame_rx_init(&rx, buf, sizeof(buf));
	assert_int_equal(tfab__frame_rx_feed(&rx, stream + 11, 5, &used), 0);
	assert_int_equal(used, 5);
	assert_int_equal(rx.got, 5);
}

static void test_frame_too_long(void **state)
{
	static const uint8_t big[] = {0x47, 0x45, 0x54, 0x20, 'x', 'y'}; /* "GET " */
	static const uint8_t nine[] = {0, 0, 0, 9, 1, 2, 3};
	uint8_t buf[8] = {0};
	struct tfab_frame_rx rx;
	size_t used;

	(void)state;
	/* refused on its header: none of its body is read, none written */
	tfab__frame_rx_init(&rx, buf, sizeof(buf));
	assert_int_equal(tfab__frame_rx_feed(&rx, big, sizeof(big), &used), -EMSGSIZE);
	assert_int_equal(used, 4);
	assert_int_equal(rx.len, 0x47455420u);
	tfab__frame_rx_init(&rx, buf, sizeof(buf));
	assert_int_equal(tfab__frame_rx_feed(&rx, nine, sizeof(nine), &used), -EMSGSIZE);
	assert_int_equal(used, 4);
	for (size_t i = 0; i < sizeof(buf); i++)
		assert_int_equal(buf[i], 0);
	/* one byte less fits exactly */
	tfab__frame_rx_init(&rx, buf, 9);
	assert_int_equal(tfab__frame_rx_feed(&rx, nine, sizeof(nine), &used), 0);
}

/* The authentication's messages, between two sides in memory. */

struct side {
	struct tfab_auth a;
	struct tfab_frame_tx out;
	char why[256];
};

/* The next message side s queued, into msg; its length. */
static uint32_t next_msg(struct side *s, uint8_t *msg, uint32_t cap)
{
	struct tfab_frame_rx rx;
	size_t used;

	tfab__frame_rx_init(&rx, msg, cap);
	assert_int_equal(
	    tfab__frame_rx_feed(&rx, s->out.buf + s->out.off, s->out.len - s->out.off, &used), 1);
	s->out.off += used;
	return rx.len;
}

static void sides_start(struct side *c, struct side *a)
{
	memset(c, 0, sizeof(*c));
	memset(a, 0, sizeof(*a));
	assert_int_equal(
	    tfab__auth_start(&c->a, (const uint8_t *)KEY, strlen(KEY), false, NULL, &c->out), 0);
	assert_int_equal(
	    tfab__auth_start(&a->a, (const uint8_t *)KEY, strlen(KEY), true, NULL, &a->out), 0);
}

static void sides_free(struct side *c, struct side *a)
{
	tfab__frame_tx_free(&c->out);
	tfab__frame_tx_free(&a->out);
}

/* Hellos both ways; the connector's proof is then queued. */
static void hellos(struct side *c, struct side *a)
{
	uint8_t msg[64];
	uint32_t len;

	assert_true(tfab__frame_tx_empty(&a->out)); /* the acceptor says nothing first */
	len = next_msg(c, msg, sizeof(msg));
	assert_int_equal(tfab__auth_take(&a->a, msg, len, &a->out, a->why, sizeof(a->why)), 0);
	len = next_msg(a, msg, sizeof(msg));
	assert_int_equal(tfab__auth_take(&c->a, msg, len, &c->out, c->why, sizeof(c->why)), 0);
}

/* What a refusal leaves: -TFAB_ERR_AUTH, a reason, REFUSE queued, and nothing taken after. */
static void refused(struct side *s, int rc, const uint8_t *again, uint32_t len)
{
	uint8_t msg[64];

	assert_int_equal(rc, -TFAB_ERR_AUTH);
	assert_true(s->a.refused);
	assert_true(s->why[0] != '\0');
	assert_int_equal(next_msg(s, msg, sizeof(msg)), 4);
	assert_memory_equal(msg, "TFAR", 4);
	assert_int_equal(tfab__auth_take(&s->a, again, len, &s->out, s->why, sizeof(s->why)),
			 -TFAB_ERR_AUTH);
}

static void test_auth_both_ways(void **state)
{
	struct side c, a;
	uint8_t msg[64], blob[] = "a connection blob";
	uint32_t len;

	(void)state;
	sides_start(&c, &a);
	hellos(&c, &a);
	len = next_msg(&c, msg, sizeof(msg));
	assert_int_equal(tfab__auth_take(&a.a, msg, len, &a.out, a.why, sizeof(a.why)), 1);
	len = next_msg(&a, msg, sizeof(msg));
	assert_int_equal(tfab__auth_take(&c.a, msg, len, &c.out, c.why, sizeof(c.why)), 1);
	/* a tag over a blob, checked by the other side; its last byte changed, refused */
	assert_int_equal(tfab__auth_tag_put(&c.a, blob, sizeof(blob), &c.out), 0);
	len = next_msg(&c, msg, sizeof(msg));
	assert_int_equal(len, TFAB_AUTH_MAC);
	assert_int_equal(
	    tfab__auth_tag_check(&a.a, blob, sizeof(blob), msg, len, &a.out, a.why, sizeof(a.why)),
	    0);
	msg[len - 1] ^= 1;
	refused(
	    &a,
	    tfab__auth_tag_check(&a.a, blob, sizeof(blob), msg, len, &a.out, a.why, sizeof(a.why)),
	    msg, len);
	sides_free(&c, &a);
}

/*
 * A proof that differs from the right one only in its last byte (or its first) is refused,
 * by either side: the whole MAC is compared.
 */
static void test_auth_proof_last_byte(void **state)
{
	for (int flip = 0; flip < 3; flip++) {
		struct side c, a;
		uint8_t msg[64];
		uint32_t len;
		int rc;

		(void)state;
		sides_start(&c, &a);
		hellos(&c, &a);
		len = next_msg(&c, msg, sizeof(msg));
		assert_int_equal(len, 4 + TFAB_AUTH_MAC);
		if (flip < 2) {
			/* the connector's proof, wrong in its last byte, then its first */
			msg[flip == 0 ? len - 1 : 4] ^= 0x80;
			rc = tfab__auth_take(&a.a, msg, len, &a.out, a.why, sizeof(a.why));
			assert_non_null(strstr(a.why, "a wrong proof of TFAB_AUTH_KEY"));
			refused(&a, rc, msg, len);
		} else {
			/* the acceptor's, wrong in its last byte */
			assert_int_equal(
			    tfab__auth_take(&a.a, msg, len, &a.out, a.why, sizeof(a.why)), 1);
			len = next_msg(&a, msg, sizeof(msg));
			msg[len - 1] ^= 0x01;
			refused(&c, tfab__auth_take(&c.a, msg, len, &c.out, c.why, sizeof(c.why)),
				msg, len);
		}
		sides_free(&c, &a);
	}
}

static void test_auth_not_a_hello(void **state)
{
	static const uint8_t junk[] = "GET / HTTP/1.0";
	struct side c, a;
	uint8_t msg[64];

	(void)state;
	sides_start(&c, &a);
	/* an acceptor refuses what is no HELLO, and a message too long to be one */
	refused(&a, tfab__auth_take(&a.a, junk, sizeof(junk), &a.out, a.why, sizeof(a.why)), junk,
		sizeof(junk));
	tfab__frame_tx_free(&a.out);
	assert_int_equal(
	    tfab__auth_start(&a.a, (const uint8_t *)KEY, strlen(KEY), true, NULL, &a.out), 0);
	refused(&a, tfab__auth_take(&a.a, NULL, 4096, &a.out, a.why, sizeof(a.why)), junk,
		sizeof(junk));
	/* a connector answered with no HELLO: not a tfab peer, nothing to refuse */
	(void)next_msg(&c, msg, sizeof(msg));
	assert_int_equal(tfab__auth_take(&c.a, junk, sizeof(junk), &c.out, c.why, sizeof(c.why)),
			 -TFAB_ERR_PROTOCOL);
	assert_false(c.a.refused);
	assert_true(tfab__frame_tx_empty(&c.out));
	sides_free(&c, &a);
}

/* A world's records. */

static struct rank_rec rec_of(uint32_t rank, uint32_t size)
{
	struct rank_rec r = {.rank = rank, .size = size, .port = 4000, .eager = 960};

	snprintf(r.host, sizeof(r.host), "127.0.0.1");
	snprintf(r.name, sizeof(r.name), "/job:worker/task:%u", rank);
	return r;
}

static void test_world_rec_rank(void **state)
{
	uint8_t buf[TFAB_WORLD_REC_LEN];
	bool have[4] = {true, false, false, false};
	struct rank_rec r, got;
	char why[256];

	(void)state;
	/* the last rank of a world of 4 is taken */
	r = rec_of(3, 4);
	tfab__world_rec_pack(&r, buf);
	assert_int_equal(tfab__world_rec_parse(buf, sizeof(buf), &got, why, sizeof(why)), 0);
	assert_int_equal(got.rank, 3);
	assert_string_equal(got.name, "/job:worker/task:3");
	assert_int_equal(tfab__world_rec_check(&got, 4, have, why, sizeof(why)), 0);
	/* a rank equal to the size, or above it, or rank 0 itself, is refused and named */
	for (uint32_t rank = 4; rank < 7; rank++) {
		r = rec_of(rank, 4);
		tfab__world_rec_pack(&r, buf);
		assert_int_equal(tfab__world_rec_parse(buf, sizeof(buf), &got, why, sizeof(why)),
				 0);
		assert_int_equal(tfab__world_rec_check(&got, 4, have, why, sizeof(why)),
				 -TFAB_ERR_PROTOCOL);
		assert_non_null(strstr(why, "is not a rank of a world of 4"));
	}
	r = rec_of(UINT32_MAX, 4);
	assert_int_equal(tfab__world_rec_check(&r, 4, have, why, sizeof(why)), -TFAB_ERR_PROTOCOL);
	r = rec_of(0, 4);
	assert_int_equal(tfab__world_rec_check(&r, 4, have, why, sizeof(why)), -TFAB_ERR_PROTOCOL);
	/* another size, and a rank that came before */
	r = rec_of(2, 5);
	assert_int_equal(tfab__world_rec_check(&r, 4, have, why, sizeof(why)), -TFAB_ERR_PROTOCOL);
	assert_non_null(strstr(why, "says the world has 5 ranks"));
	have[2] = true;
	r = rec_of(2, 4);
	assert_int_equal(tfab__world_rec_check(&r, 4, have, why, sizeof(why)), -TFAB_ERR_PROTOCOL);
	assert_non_null(strstr(why, "arrived twice"));
}

static void test_world_rec_exact(void **state)
{
	uint8_t buf[TFAB_WORLD_REC_LEN + 1];
	struct rank_rec r = rec_of(1, 2), got = {.rank = 77};
	char why[256];

	(void)state;
	tfab__world_rec_pack(&r, buf);
	/* a byte short or long, a wrong magic, a host with bytes after its end, no terminator */
	assert_int_equal(tfab__world_rec_parse(buf, sizeof(buf) - 2, &got, why, sizeof(why)),
			 -TFAB_ERR_PROTOCOL);
	assert_int_equal(tfab__world_rec_parse(buf, sizeof(buf), &got, why, sizeof(why)),
			 -TFAB_ERR_PROTOCOL);
	buf[0] ^= 1;
	assert_int_equal(tfab__world_rec_parse(buf, TFAB_WORLD_REC_LEN, &got, why, sizeof(why)),
			 -TFAB_ERR_PROTOCOL);
	buf[0] ^= 1;
	buf[16 + 20] = 'x';
	assert_int_equal(tfab__world_rec_parse(buf, TFAB_WORLD_REC_LEN, &got, why, sizeof(why)),
			 -TFAB_ERR_PROTOCOL);
	memset(buf + 16, 'h', TFAB_WORLD_REC_HOST);
	assert_int_equal(tfab__world_rec_parse(buf, TFAB_WORLD_REC_LEN, &got, why, sizeof(why)),
			 -TFAB_ERR_PROTOCOL);
	assert_int_equal(got.rank, 77); /* untouched */
}

static void test_world_answer(void **state)
{
	uint8_t msg[1 + 3 * TFAB_WORLD_REC_LEN], err[32] = {'E'};
	struct rank_rec recs[3], got[3];
	char why[600];

	(void)state;
	msg[0] = 'T';
	for (uint32_t r = 0; r < 3; r++) {
		recs[r] = rec_of(r, 3);
		tfab__world_rec_pack(&recs[r], msg + 1 + r * TFAB_WORLD_REC_LEN);
	}
	assert_int_equal(tfab__world_answer_parse(msg, sizeof(msg), 3, got, why, sizeof(why)), 0);
	assert_string_equal(got[2].name, "/job:worker/task:2");
	/* a table whose record 2 says rank 1 is refused, and leaves recs alone */
	memset(got, 0, sizeof(got));
	recs[2].rank = 1;
	tfab__world_rec_pack(&recs[2], msg + 1 + 2 * TFAB_WORLD_REC_LEN);
	assert_int_equal(tfab__world_answer_parse(msg, sizeof(msg), 3, got, why, sizeof(why)),
			 -TFAB_ERR_PROTOCOL);
	assert_int_equal(got[0].size, 0);
	/* an error: its status, or a protocol error where the status is none of ours */
	err[4] = TFAB_ERR_TIMEOUT - 256; /* 0x0000010a, big-endian */
	err[3] = 1;
	memcpy(err + 5, "why", 3);
	assert_int_equal(tfab__world_answer_parse(err, 8, 3, got, why, sizeof(why)),
			 -TFAB_ERR_TIMEOUT);
	assert_string_equal(why, "why");
	memcpy(err + 1, "\x80\0\0\0", 4);
	assert_int_equal(tfab__world_answer_parse(err, 5, 3, got, why, sizeof(why)),
			 -TFAB_ERR_PROTOCOL);
	memcpy(err + 1, "\0\0\0\0", 4);
	assert_int_equal(tfab__world_answer_parse(err, 5, 3, got, why, sizeof(why)),
			 -TFAB_ERR_PROTOCOL);
}

/* Strangers on a listening context. */

enum kind { SILENT, GARBAGE, JUNK, WRONG_KEY, NKINDS };
static const char *const kind_name[] = {"silent", "garbage", "junk", "wrong_key"};

struct stranger {
	enum kind kind;
	uint16_t port;
	char addr[64];	   /* its own address, as the listener logs it */
	sem_t ready;	   /* connected, and its first bytes sent */
	int64_t closed_ms; /* from its connect to the listener's close; -1: not within LONG_MS */
	bool refused;	   /* wrong_key: it got a HELLO, then a REFUSE */
	pthread_t thread;
};

static void *stranger_main(void *arg)
{
	static const char get[] = "\0\0\2\20GET / HTTP/1.0\r\nGET / HTTP/1.0\r\n";
	struct stranger *s = arg;
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(s->port)};
	uint8_t hello[38] = {'T', 'F', 'A', 'U', 1, 'C'}, proof[36] = {'T', 'F', 'A', 'P'};
	uint8_t msg[64], sink[512];
	struct sockaddr_in me;
	socklen_t ml = sizeof(me);
	uint64_t t0;
	uint32_t len;
	int fd;

	s->closed_ms = -1;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sin, sizeof(sin))) {
		sem_post(&s->ready);
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	getsockname(fd, (struct sockaddr *)&me, &ml);
	tfab__sock_addr_text((struct sockaddr *)&me, s->addr, sizeof(s->addr));
	t0 = tfab__now_ms();
	if (s->kind == GARBAGE)
		(void)send(fd, get, sizeof(get) - 1, MSG_NOSIGNAL);
	else if (s->kind == JUNK)
		(void)tfab__sock_send_msg(fd, "0123456789", 10, LONG_MS);
	else if (s->kind == WRONG_KEY)
		(void)tfab__sock_send_msg(fd, hello, sizeof(hello), LONG_MS);
	sem_post(&s->ready);
	if (s->kind == WRONG_KEY && tfab__sock_recv_msg(fd, msg, sizeof(msg), &len, LONG_MS) == 0 &&
	    len == 38 && memcmp(msg, "TFAU", 4) == 0 && msg[5] == 'A' &&
	    tfab__sock_send_msg(fd, proof, sizeof(proof), LONG_MS) == 0 &&
	    tfab__sock_recv_msg(fd, msg, sizeof(msg), &len, LONG_MS) == 0 && len == 4)
		s->refused = memcmp(msg, "TFAR", 4) == 0;
	/* until the listener closes it: then the time it took */
	for (;;) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		int left = (int)(t0 + LONG_MS - tfab__now_ms());
		ssize_t n;

		if (left <= 0 || poll(&p, 1, left) <= 0)
			break;
		n = recv(fd, sink, sizeof(sink), 0);
		if (n <= 0) {
			s->closed_ms = (int64_t)(tfab__now_ms() - t0);
			break;
		}
	}
	close(fd);
	return NULL;
}

static void strangers_start(struct stranger *s, uint16_t port)
{
	for (int k = 0; k < NKINDS; k++) {
		s[k] = (struct stranger){.kind = (enum kind)k, .port = port};
		assert_int_equal(sem_init(&s[k].ready, 0, 0), 0);
		assert_int_equal(pthread_create(&s[k].thread, NULL, stranger_main, &s[k]), 0);
	}
	for (int k = 0; k < NKINDS; k++)
		assert_int_equal(sem_wait(&s[k].ready), 0);
}

/* Each closed by the listener within bound_ms of its connect, its refusal logged. */
static void strangers_check(struct stranger *s, int64_t bound_ms)
{
	for (int k = 0; k < NKINDS; k++) {
		assert_int_equal(pthread_join(s[k].thread, NULL), 0);
		sem_destroy(&s[k].ready);
		print_message("%s stranger %s: closed after %lld ms\n", kind_name[k], s[k].addr,
			      (long long)s[k].closed_ms);
		assert_true(s[k].addr[0]);
		assert_true(s[k].closed_ms >= 0 && s[k].closed_ms <= bound_ms);
		assert_true(logged("warn [bootstrap] tfab_accept: refused ", s[k].addr));
	}
	assert_true(s[WRONG_KEY].refused);
}

static struct tfab_context *keyed_context(const char *handshake_ms)
{
	const char *names[] = {"TFAB_AUTH_KEY", "TFAB_HANDSHAKE_TIMEOUT_MS"};
	const char *values[] = {KEY, handshake_ms};
	struct tfab_context *ctx = NULL;

	assert_int_equal(tfab_context_create_with(&ctx, names, values, 2), 0);
	return ctx;
}

struct connector {
	struct tfab_context *ctx;
	uint16_t port;
	struct tfab_peer *peer;
	int rc;
};

static void *connector_main(void *arg)
{
	struct connector *c = arg;

	c->rc = tfab_connect(c->ctx, "127.0.0.1", c->port, LONG_MS, &c->peer);
	return NULL;
}

/*
 * A silent stranger, two sending garbage and one with another key connect first; then a
 * peer with the key. With a handshake deadline of 20 s, tfab_accept with a timeout of 5 s
 * must give that peer (a bound on the call, not a measure of speed): the strangers are in
 * hand at once, and none is waited for. The three that spoke are refused at once; the
 * silent one when the context ends.
 */
static void test_strangers_delay_no_peer(void **state)
{
	struct tfab_context *lctx = keyed_context("20000"), *cctx = keyed_context("20000");
	struct connector c = {.ctx = cctx, .rc = 1};
	struct stranger s[NKINDS];
	struct tfab_peer *peer = NULL;
	pthread_t t;

	(void)state;
	log_clear();
	assert_int_equal(tfab_listen(lctx, "127.0.0.1", 0, &c.port), 0);
	strangers_start(s, c.port);
	assert_int_equal(pthread_create(&t, NULL, connector_main, &c), 0);
	assert_int_equal(tfab_accept(lctx, 5000, &peer), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(c.rc, 0);
	assert_int_equal(tfab_peer_status(peer), 0);
	/* the strangers that spoke are refused as the listener goes on; the silent one stays */
	for (uint64_t end = tfab__now_ms() + 10000; tfab__now_ms() < end;) {
		uint64_t refused;

		assert_int_equal(tfab_accept(lctx, 100, &peer), -ETIMEDOUT);
		pthread_mutex_lock(&lctx->accept_lock);
		refused = lctx->accepts->refused;
		pthread_mutex_unlock(&lctx->accept_lock);
		if (refused == NKINDS - 1)
			break;
	}
	assert_int_equal(tfab_context_destroy(cctx), 0);
	assert_int_equal(tfab_context_destroy(lctx), 0);
	strangers_check(s, 10000);
	assert_true(logged("tfab_accept: refused ", "the context ended"));
}

/* With a deadline of 300 ms, every stranger is closed by then, while tfab_accept waits. */
static void test_strangers_closed_by_deadline(void **state)
{
	struct tfab_context *lctx = keyed_context("300");
	struct stranger s[NKINDS];
	struct tfab_peer *peer = NULL;
	uint16_t port;

	(void)state;
	log_clear();
	assert_int_equal(tfab_listen(lctx, "127.0.0.1", 0, &port), 0);
	strangers_start(s, port);
	assert_int_equal(tfab_accept(lctx, 300 + SLACK_MS + 500, &peer), -ETIMEDOUT);
	assert_null(peer);
	strangers_check(s, 300 + SLACK_MS);
	assert_true(logged("tfab_accept: refused ", "sent nothing within 300 ms"));
	assert_int_equal(tfab_context_destroy(lctx), 0);
}

/*
 * Between calls to tfab_accept, the connections still in hand end by their deadline too, as
 * long as someone drives progress (the liveness checks reap them).
 */
static void test_strangers_reaped_between_calls(void **state)
{
	struct tfab_context *lctx = keyed_context("300");
	struct stranger s = {.kind = SILENT};
	struct tfab_peer *peer = NULL;
	uint64_t end;

	(void)state;
	log_clear();
	assert_int_equal(tfab_listen(lctx, "127.0.0.1", 0, &s.port), 0);
	assert_int_equal(sem_init(&s.ready, 0, 0), 0);
	assert_int_equal(pthread_create(&s.thread, NULL, stranger_main, &s), 0);
	assert_int_equal(sem_wait(&s.ready), 0);
	/* taken in hand, not done: the call returns without it */
	assert_int_equal(tfab_accept(lctx, 100, &peer), -ETIMEDOUT);
	end = tfab__now_ms() + 300 + SLACK_MS;
	while (tfab__now_ms() < end && !logged("tfab_accept: refused ", s.addr)) {
		assert_true(tfab_progress(lctx) >= 0);
		usleep(1000);
	}
	assert_int_equal(pthread_join(s.thread, NULL), 0);
	sem_destroy(&s.ready);
	print_message("silent stranger %s: closed after %lld ms\n", s.addr, (long long)s.closed_ms);
	assert_true(s.closed_ms >= 0 && s.closed_ms <= 300 + SLACK_MS);
	assert_true(logged("tfab_accept: refused ", "sent nothing within 300 ms"));
	assert_int_equal(tfab_context_destroy(lctx), 0);
}

/* What tfab_connect says. */

/* A port that nothing listens on, below the ephemeral range (test_sock.c's way). */
static uint16_t free_port(void)
{
	uint16_t port = (uint16_t)(20000 + (unsigned)getpid() % 10000);
	int fd;

	for (int i = 0; i < 1000; i++, port++) {
		if (tfab__sock_listen("127.0.0.1", port, &fd, NULL) == 0) {
			close(fd);
			return port;
		}
	}
	fail_msg("no free port");
	return 0;
}

struct server {
	int lfd;
	uint16_t port;
	const void *says; /* what it sends to whoever connects (NULL: nothing) */
	size_t len;
	pthread_t thread;
};

/* Accepts one connection, says its piece, and waits for the other side to close. */
static void *server_main(void *arg)
{
	struct server *sv = arg;
	char sink[4096];
	int fd;

	if (tfab__sock_accept(sv->lfd, LONG_MS, &fd))
		return NULL;
	if (sv->says)
		(void)send(fd, sv->says, sv->len, MSG_NOSIGNAL);
	for (;;) {
		struct pollfd p = {.fd = fd, .events = POLLIN};

		if (poll(&p, 1, LONG_MS) <= 0 || recv(fd, sink, sizeof(sink), 0) <= 0)
			break;
	}
	close(fd);
	return NULL;
}

static void server_start(struct server *sv, const void *says, size_t len)
{
	*sv = (struct server){.says = says, .len = len};
	assert_int_equal(tfab__sock_listen("127.0.0.1", 0, &sv->lfd, &sv->port), 0);
	assert_int_equal(pthread_create(&sv->thread, NULL, server_main, sv), 0);
}

static void server_stop(struct server *sv)
{
	assert_int_equal(pthread_join(sv->thread, NULL), 0);
	close(sv->lfd);
}

static void test_connect_not_a_peer(void **state)
{
	static const char http[] = "HTTP/1.0 400 Bad Request\r\n\r\n";
	static const char frame[] = "\0\0\0\5hello";
	const void *says[] = {http, frame};
	size_t lens[] = {sizeof(http) - 1, sizeof(frame) - 1};

	(void)state;
	for (int i = 0; i < 2; i++) {
		struct tfab_context *ctx = NULL;
		struct tfab_peer *peer = NULL;
		struct server sv;
		char addr[64];

		log_clear();
		assert_int_equal(tfab_context_create(&ctx), 0);
		server_start(&sv, says[i], lens[i]);
		snprintf(addr, sizeof(addr), "127.0.0.1:%u is not a tfab peer (", sv.port);
		assert_int_equal(tfab_connect(ctx, "127.0.0.1", sv.port, 5000, &peer),
				 -TFAB_ERR_PROTOCOL);
		assert_null(peer);
		assert_true(logged("error [engine] tfab_connect: ", addr));
		server_stop(&sv);
		assert_int_equal(tfab_context_destroy(ctx), 0);
	}
}

static void test_connect_silent(void **state)
{
	struct tfab_context *ctx = NULL;
	struct tfab_peer *peer = NULL;
	struct server sv;
	char addr[64];

	(void)state;
	log_clear();
	assert_int_equal(tfab_context_create(&ctx), 0);
	server_start(&sv, NULL, 0);
	snprintf(addr, sizeof(addr), "tfab_connect: 127.0.0.1:%u: ", sv.port);
	assert_int_equal(tfab_connect(ctx, "127.0.0.1", sv.port, 300, &peer), -ETIMEDOUT);
	assert_true(logged(addr, "did not come within 300 ms"));
	server_stop(&sv);
	assert_int_equal(tfab_context_destroy(ctx), 0);
}

static void test_connect_unknown_host(void **state)
{
	struct tfab_context *ctx = NULL;
	struct tfab_peer *peer = NULL;

	(void)state;
	log_clear();
	assert_int_equal(tfab_context_create(&ctx), 0);
	/* .invalid never resolves (RFC 2606) */
	assert_int_equal(tfab_connect(ctx, "no-such-host.invalid", 5000, 2000, &peer), -ENXIO);
	assert_true(logged("error [bootstrap] unknown host 'no-such-host.invalid': ", NULL));
	assert_int_equal(tfab_context_destroy(ctx), 0);
}

static void test_connect_refused(void **state)
{
	struct tfab_context *ctx = NULL;
	struct tfab_peer *peer = NULL;
	uint16_t port = free_port();
	uint64_t t0;
	char addr[64];

	(void)state;
	log_clear();
	assert_int_equal(tfab_context_create(&ctx), 0);
	snprintf(addr, sizeof(addr), "connection to 127.0.0.1:%u refused (tried for ", port);
	/* refusals are retried until the timeout (a listener may be starting), then said */
	t0 = tfab__now_ms();
	assert_int_equal(tfab_connect(ctx, "127.0.0.1", port, 300, &peer), -ECONNREFUSED);
	assert_true(tfab__now_ms() - t0 >= 250);
	assert_true(logged(addr, " ms)"));
	assert_int_equal(tfab_context_destroy(ctx), 0);
}

struct aborter {
	struct tfab_context *ctx;
	int delay_ms;
};

static void *aborter_main(void *arg)
{
	struct aborter *a = arg;

	usleep((useconds_t)a->delay_ms * 1000);
	tfab_abort(a->ctx, -ECANCELED);
	return NULL;
}

/*
 * tfab_abort from another thread ends a tfab_accept waiting for a peer that never comes (a
 * silent stranger in hand), and a tfab_connect waiting on a silent server's handshake, with
 * the abort's status, long before their timeouts (a bound on the calls, not a measure).
 */
static void test_abort_ends_bootstrap_waits(void **state)
{
	struct tfab_context *ctx = keyed_context("20000");
	struct stranger s = {.kind = SILENT};
	struct tfab_peer *peer = NULL;
	struct aborter a = {.ctx = ctx, .delay_ms = 200};
	struct server sv;
	pthread_t t;
	uint64_t t0;
	uint16_t port;

	(void)state;
	log_clear();
	assert_int_equal(tfab_listen(ctx, "127.0.0.1", 0, &port), 0);
	s.port = port;
	assert_int_equal(sem_init(&s.ready, 0, 0), 0);
	assert_int_equal(pthread_create(&s.thread, NULL, stranger_main, &s), 0);
	assert_int_equal(sem_wait(&s.ready), 0);
	assert_int_equal(pthread_create(&t, NULL, aborter_main, &a), 0);
	t0 = tfab__now_ms();
	assert_int_equal(tfab_accept(ctx, LONG_MS, &peer), -ECANCELED);
	print_message("tfab_accept ended %llu ms after it began (abort at 200 ms)\n",
		      (unsigned long long)(tfab__now_ms() - t0));
	assert_true(tfab__now_ms() - t0 < 200 + SLACK_MS);
	assert_null(peer);
	assert_int_equal(pthread_join(t, NULL), 0);
	/* an accept after the abort fails at once */
	assert_int_equal(tfab_accept(ctx, LONG_MS, &peer), -ECANCELED);
	assert_int_equal(tfab_context_destroy(ctx), 0);
	assert_int_equal(pthread_join(s.thread, NULL), 0);
	sem_destroy(&s.ready);

	assert_int_equal(tfab_context_create(&ctx), 0);
	a.ctx = ctx;
	server_start(&sv, NULL, 0);
	assert_int_equal(pthread_create(&t, NULL, aborter_main, &a), 0);
	t0 = tfab__now_ms();
	assert_int_equal(tfab_connect(ctx, "127.0.0.1", sv.port, LONG_MS, &peer), -ECANCELED);
	assert_true(tfab__now_ms() - t0 < 200 + SLACK_MS);
	assert_int_equal(pthread_join(t, NULL), 0);
	server_stop(&sv);
	assert_int_equal(tfab_context_destroy(ctx), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_frame_pieces),
	    cmocka_unit_test(test_frame_too_long),
	    cmocka_unit_test(test_auth_both_ways),
	    cmocka_unit_test(test_auth_proof_last_byte),
	    cmocka_unit_test(test_auth_not_a_hello),
	    cmocka_unit_test(test_world_rec_rank),
	    cmocka_unit_test(test_world_rec_exact),
	    cmocka_unit_test(test_world_answer),
	    cmocka_unit_test(test_strangers_delay_no_peer),
	    cmocka_unit_test(test_strangers_closed_by_deadline),
	    cmocka_unit_test(test_strangers_reaped_between_calls),
	    cmocka_unit_test(test_connect_not_a_peer),
	    cmocka_unit_test(test_connect_silent),
	    cmocka_unit_test(test_connect_unknown_host),
	    cmocka_unit_test(test_connect_refused),
	    cmocka_unit_test(test_abort_ends_bootstrap_waits),
	};

	tfab_log_set_sink(log_sink, NULL);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
