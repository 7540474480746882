/*
 * Unit tests for the TCP bootstrap sockets: host:port parsing, listen/connect/accept on
 * loopback, framed messages both ways (empty to 1 MiB), that every wait ends in its bound, and
 * that a listener queues as many connections as the system allows.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/sock.h"
#include "util/time.h"

/* Generous, so that a run under valgrind does not time out; a hang still ends. */
#define LONG_MS 10000
/* Slack allowed past a bound before a wait counts as overrunning it. */
#define SLACK_MS 1500

struct pair {
	int lfd; /* listener */
	int a;	 /* connecting side */
	int b;	 /* accepted side */
	uint16_t port;
};

static int pair_open(void **state)
{
	struct pair *p = calloc(1, sizeof(*p));

	if (!p)
		return -1;
	p->lfd = p->a = p->b = -1;
	*state = p;
	if (tfab__sock_listen("127.0.0.1", 0, &p->lfd, &p->port) != 0 || p->port == 0)
		return -1;
	if (tfab__sock_connect("127.0.0.1", p->port, LONG_MS, &p->a) != 0)
		return -1;
	if (tfab__sock_accept(p->lfd, LONG_MS, &p->b) != 0)
		return -1;
	return 0;
}

static int pair_close(void **state)
{
	struct pair *p = *state;

	if (!p)
		return 0;
	if (p->a >= 0)
		close(p->a);
	if (p->b >= 0)
		close(p->b);
	if (p->lfd >= 0)
		close(p->lfd);
	free(p);
	return 0;
}

/*
 * A port that nothing listens on, below the ephemeral range: a connect to an ephemeral port
 * on loopback can, rarely, pick that same port as its source and connect to itself.
 */
static uint16_t free_port(void)
{
	unsigned low = 32768, high = 60999;
	uint16_t port;
	FILE *f;
	int fd;

	f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
	if (f) {
		if (fscanf(f, "%u %u", &low, &high) != 2)
			low = 32768;
		fclose(f);
	}
	if (low <= 2048)
		low = 32768;
	/* Start apart from other runs of this test on the same machine. */
	port = (uint16_t)(low - 1 - (unsigned)getpid() % (low / 2));
	for (int i = 0; i < 1000; i++, port--) {
		if (port < 1024)
			port = (uint16_t)(low - 1);
		if (tfab__sock_listen("127.0.0.1", port, &fd, NULL) == 0) {
			close(fd);
			return port;
		}
	}
	fail_msg("no free port below %u", low);
	return 0;
}

static void test_parse_ok(void **state)
{
	char host[64];
	uint16_t port;

	(void)state;
	assert_int_equal(tfab__sock_parse_hostport("127.0.0.1:80", host, sizeof(host), &port), 0);
	assert_string_equal(host, "127.0.0.1");
	assert_int_equal(port, 80);

	assert_int_equal(tfab__sock_parse_hostport("[::1]:9", host, sizeof(host), &port), 0);
	assert_string_equal(host, "::1");
	assert_int_equal(port, 9);

	assert_int_equal(tfab__sock_parse_hostport("host:65535", host, sizeof(host), &port), 0);
	assert_string_equal(host, "host");
	assert_int_equal(port, 65535);

	assert_int_equal(tfab__sock_parse_hostport("h:0", host, sizeof(host), &port), 0);
	assert_string_equal(host, "h");
	assert_int_equal(port, 0);
}

static void test_parse_rejects(void **state)
{
	static const char *const bad[] = {
	    "nohost", "h:70000", "h:",	   "[::1]9", "[::1",
	    "h:80x",  "h:65536", "[::1]:", "",	     "h:99999999999999999999"};

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char host[64] = "untouched";
		uint16_t port = 1234;

		assert_int_equal(tfab__sock_parse_hostport(bad[i], host, sizeof(host), &port),
				 -EINVAL);
		/* Outputs are written only on success. */
		assert_string_equal(host, "untouched");
		assert_int_equal(port, 1234);
	}
}

static void test_parse_host_too_long(void **state)
{
	char host[4] = "abc";
	uint16_t port = 7;

	(void)state;
	/* Three characters and the terminator fit; four do not. */
	assert_int_equal(tfab__sock_parse_hostport("xyz:1", host, sizeof(host), &port), 0);
	assert_string_equal(host, "xyz");
	assert_int_equal(tfab__sock_parse_hostport("wxyz:1", host, sizeof(host), &port), -EINVAL);
	assert_int_equal(tfab__sock_parse_hostport("[wxyz]:1", host, sizeof(host), &port), -EINVAL);
	assert_string_equal(host, "xyz");
	assert_int_equal(port, 1);
}

static void test_small_both_ways(void **state)
{
	struct pair *p = *state;
	char buf[64];
	uint32_t len = 0;

	assert_int_equal(tfab__sock_send_msg(p->a, "hello", 5, LONG_MS), 0);
	assert_int_equal(tfab__sock_recv_msg(p->b, buf, sizeof(buf), &len, LONG_MS), 0);
	assert_int_equal(len, 5);
	assert_memory_equal(buf, "hello", 5);

	assert_int_equal(tfab__sock_send_msg(p->b, "world!", 6, LONG_MS), 0);
	assert_int_equal(tfab__sock_recv_msg(p->a, buf, sizeof(buf), &len, LONG_MS), 0);
	assert_int_equal(len, 6);
	assert_memory_equal(buf, "world!", 6);

	/* Messages keep their boundaries when queued back to back. */
	assert_int_equal(tfab__sock_send_msg(p->a, "one", 3, LONG_MS), 0);
	assert_int_equal(tfab__sock_send_msg(p->a, "three", 5, LONG_MS), 0);
	assert_int_equal(tfab__sock_recv_msg(p->b, buf, sizeof(buf), &len, LONG_MS), 0);
	assert_int_equal(len, 3);
	assert_memory_equal(buf, "one", 3);
	assert_int_equal(tfab__sock_recv_msg(p->b, buf, sizeof(buf), &len, LONG_MS), 0);
	assert_int_equal(len, 5);
	assert_memory_equal(buf, "three", 5);
}

static void test_wire_format(void **state)
{
	struct pair *p = *state;
	unsigned char raw[7];
	uint32_t len = 0;
	char buf[8];

	/* A 4-byte big-endian length, then the bytes: peers in other languages rely on it. */
	assert_int_equal(tfab__sock_send_msg(p->a, "abc", 3, LONG_MS), 0);
	assert_int_equal(recv(p->b, raw, sizeof(raw), MSG_WAITALL), (ssize_t)sizeof(raw));
	assert_memory_equal(raw, "\0\0\0\3abc", sizeof(raw));

	memcpy(raw, "\0\0\0\2xy", 6);
	assert_int_equal(send(p->b, raw, 6, 0), 6);
	assert_int_equal(tfab__sock_recv_msg(p->a, buf, sizeof(buf), &len, LONG_MS), 0);
	assert_int_equal(len, 2);
	assert_memory_equal(buf, "xy", 2);
}

static void test_zero_length(void **state)
{
	struct pair *p = *state;
	char buf[8];
	uint32_t len = 99;

	assert_int_equal(tfab__sock_send_msg(p->a, NULL, 0, LONG_MS), 0);
	assert_int_equal(tfab__sock_recv_msg(p->b, buf, sizeof(buf), &len, LONG_MS), 0);
	assert_int_equal(len, 0);

	len = 99;
	assert_int_equal(tfab__sock_send_msg(p->b, "", 0, LONG_MS), 0);
	/* An empty message fits even a zero capacity. */
	assert_int_equal(tfab__sock_recv_msg(p->a, buf, 0, &len, LONG_MS), 0);
	assert_int_equal(len, 0);

	/* And the stream stays in step after it. */
	assert_int_equal(tfab__sock_send_msg(p->a, "z", 1, LONG_MS), 0);
	assert_int_equal(tfab__sock_recv_msg(p->b, buf, sizeof(buf), &len, LONG_MS), 0);
	assert_int_equal(len, 1);
	assert_int_equal(buf[0], 'z');
}

#define BIG (1u << 20)

struct sender {
	int fd;
	const unsigned char *buf;
	uint32_t len;
	int rc;
};

static void *send_thread(void *arg)
{
	struct sender *s = arg;

	s->rc = tfab__sock_send_msg(s->fd, s->buf, s->len, LONG_MS);
	return NULL;
}

/* The sender runs in a thread: 1 MiB does not fit the socket buffers. */
static void big_one_way(int from, int to, unsigned seed)
{
	unsigned char *out = malloc(BIG), *in = malloc(BIG);
	struct sender s = {.fd = from, .len = BIG, .rc = 1};
	uint32_t len = 0;
	pthread_t t;

	assert_non_null(out);
	assert_non_null(in);
	for (uint32_t i = 0; i < BIG; i++)
		out[i] = (unsigned char)(i * 31u + seed + (i >> 12));
	memset(in, 0, BIG);
	s.buf = out;

	assert_int_equal(pthread_create(&t, NULL, send_thread, &s), 0);
	assert_int_equal(tfab__sock_recv_msg(to, in, BIG, &len, LONG_MS), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(s.rc, 0);
	assert_int_equal(len, BIG);
	assert_memory_equal(in, out, BIG);
	free(out);
	free(in);
}

static void test_big_both_ways(void **state)
{
	struct pair *p = *state;

	big_one_way(p->a, p->b, 1);
	big_one_way(p->b, p->a, 7);
}

static void test_too_big_for_cap(void **state)
{
	struct pair *p = *state;
	char msg[100], buf[10];
	uint32_t len = 1234;

	memset(msg, 'm', sizeof(msg));
	assert_int_equal(tfab__sock_send_msg(p->a, msg, sizeof(msg), LONG_MS), 0);
	assert_int_equal(tfab__sock_recv_msg(p->b, buf, sizeof(buf), &len, LONG_MS), -EMSGSIZE);
	assert_int_equal(len, 1234);

	/* One byte over is still too big; exactly the capacity fits. */
	assert_int_equal(tfab__sock_send_msg(p->b, msg, 11, LONG_MS), 0);
	assert_int_equal(tfab__sock_recv_msg(p->a, buf, 10, &len, LONG_MS), -EMSGSIZE);
}

static void test_exact_cap(void **state)
{
	struct pair *p = *state;
	char buf[10];
	uint32_t len = 0;

	assert_int_equal(tfab__sock_send_msg(p->a, "0123456789", 10, LONG_MS), 0);
	assert_int_equal(tfab__sock_recv_msg(p->b, buf, sizeof(buf), &len, LONG_MS), 0);
	assert_int_equal(len, 10);
	assert_memory_equal(buf, "0123456789", 10);
}

static void test_peer_closed(void **state)
{
	struct pair *p = *state;
	char buf[16];
	uint32_t len = 0;

	close(p->a);
	p->a = -1;
	assert_int_equal(tfab__sock_recv_msg(p->b, buf, sizeof(buf), &len, LONG_MS), -ECONNRESET);
}

static void test_peer_closed_mid_message(void **state)
{
	struct pair *p = *state;
	char buf[128];
	uint32_t len = 0;

	/* The header promises 100 bytes; only 3 come before the close. */
	assert_int_equal(send(p->a, "\0\0\0\144abc", 7, 0), 7);
	close(p->a);
	p->a = -1;
	assert_int_equal(tfab__sock_recv_msg(p->b, buf, sizeof(buf), &len, LONG_MS), -ECONNRESET);
}

static void test_send_to_closed(void **state)
{
	struct pair *p = *state;
	static unsigned char chunk[64 * 1024];
	uint64_t t0;
	int rc = 0;

	close(p->b);
	p->b = -1;
	/* No SIGPIPE: the error comes back as a status, within a bounded number of tries. */
	t0 = tfab__now_ms();
	for (int i = 0; i < 1000 && rc == 0; i++)
		rc = tfab__sock_send_msg(p->a, chunk, sizeof(chunk), 1000);
	assert_int_equal(rc, -ECONNRESET);
	assert_true(tfab__now_ms() - t0 < 1000 + SLACK_MS);
}

static void test_recv_timeout(void **state)
{
	struct pair *p = *state;
	uint32_t len = 1234;
	uint64_t t0, dt;
	char buf[8];

	t0 = tfab__now_ms();
	assert_int_equal(tfab__sock_recv_msg(p->b, buf, sizeof(buf), &len, 200), -ETIMEDOUT);
	dt = tfab__now_ms() - t0;
	assert_true(dt >= 150);
	assert_true(dt < 200 + SLACK_MS);
	assert_int_equal(len, 1234);
}

static void test_recv_timeout_partial(void **state)
{
	struct pair *p = *state;
	uint32_t len = 1234;
	uint64_t t0, dt;
	char buf[64];

	/* A header and part of the body, then silence: the deadline covers the whole message. */
	assert_int_equal(send(p->a, "\0\0\0\50abc", 7, 0), 7);
	t0 = tfab__now_ms();
	assert_int_equal(tfab__sock_recv_msg(p->b, buf, sizeof(buf), &len, 200), -ETIMEDOUT);
	dt = tfab__now_ms() - t0;
	assert_true(dt >= 150);
	assert_true(dt < 200 + SLACK_MS);
}

static void test_accept_timeout(void **state)
{
	struct pair *p = *state;
	uint64_t t0, dt;
	int fd = -1;

	t0 = tfab__now_ms();
	assert_int_equal(tfab__sock_accept(p->lfd, 200, &fd), -ETIMEDOUT);
	dt = tfab__now_ms() - t0;
	assert_true(dt >= 150);
	assert_true(dt < 200 + SLACK_MS);
	assert_int_equal(fd, -1);
}

static void test_connect_no_listener(void **state)
{
	uint16_t port = free_port();
	uint64_t t0, dt;
	int fd = -1, rc;

	(void)state;
	t0 = tfab__now_ms();
	rc = tfab__sock_connect("127.0.0.1", port, 300, &fd);
	dt = tfab__now_ms() - t0;
	assert_true(rc == -ECONNREFUSED || rc == -ETIMEDOUT);
	assert_int_equal(fd, -1);
	/* Refusals are retried until the bound, and no longer. */
	assert_true(dt >= 250);
	assert_true(dt < 300 + SLACK_MS);
}

struct late_listener {
	uint16_t port;
	int lfd;
	int rc;
};

static void *listen_late(void *arg)
{
	struct late_listener *l = arg;

	usleep(150 * 1000);
	l->rc = tfab__sock_listen("127.0.0.1", l->port, &l->lfd, NULL);
	return NULL;
}

static void test_connect_waits_for_listener(void **state)
{
	struct late_listener l = {.port = free_port(), .lfd = -1, .rc = 1};
	int fd = -1, afd = -1;
	char buf[8];
	uint32_t len = 0;
	pthread_t t;

	(void)state;
	assert_int_equal(pthread_create(&t, NULL, listen_late, &l), 0);
	/* Refused at first; a retry finds the listener once it is up. */
	assert_int_equal(tfab__sock_connect("127.0.0.1", l.port, LONG_MS, &fd), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(l.rc, 0);
	assert_int_equal(tfab__sock_accept(l.lfd, LONG_MS, &afd), 0);
	assert_int_equal(tfab__sock_send_msg(fd, "hi", 2, LONG_MS), 0);
	assert_int_equal(tfab__sock_recv_msg(afd, buf, sizeof(buf), &len, LONG_MS), 0);
	assert_int_equal(len, 2);
	assert_memory_equal(buf, "hi", 2);
	close(fd);
	close(afd);
	close(l.lfd);
}

static void test_listen_any(void **state)
{
	uint16_t port = 0;
	int lfd = -1, fd = -1, afd = -1;

	(void)state;
	assert_int_equal(tfab__sock_listen(NULL, 0, &lfd, &port), 0);
	assert_true(lfd >= 0);
	assert_true(port != 0);
	assert_int_equal(tfab__sock_connect("127.0.0.1", port, LONG_MS, &fd), 0);
	assert_int_equal(tfab__sock_accept(lfd, LONG_MS, &afd), 0);
	close(fd);
	close(afd);
	close(lfd);
}

/* net.core.somaxconn: the most listen() queues, whatever backlog it is asked for; -1 unknown. */
static int somaxconn(void)
{
	FILE *f = fopen("/proc/sys/net/core/somaxconn", "r");
	int v = -1;

	if (f) {
		if (fscanf(f, "%d", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

/* For a LISTEN socket, TCP_INFO reports the accept queue's length and its bound. */
static void accept_queue(int lfd, unsigned *len_p, unsigned *max_p)
{
	struct tcp_info ti;
	socklen_t tl = sizeof(ti);

	memset(&ti, 0, sizeof(ti));
	assert_int_equal(getsockopt(lfd, IPPROTO_TCP, TCP_INFO, &ti, &tl), 0);
	*len_p = ti.tcpi_unacked;
	*max_p = ti.tcpi_sacked;
}

#define BURST 200

/*
 * Many ranks connect at once: with a short backlog the kernel drops the SYNs that overflow
 * the accept queue, and each of those connects waits out a retransmission (1 s, 3 s, ...).
 * The listener asks for the system's maximum, and all of a burst of connects, none of them
 * accepted yet, wait in its queue.
 */
static void test_listen_backlog(void **state)
{
	int lfd = -1, max = somaxconn(), fds[BURST];
	unsigned len = 0, bound = 0;
	uint16_t port = 0;
	uint64_t deadline;

	(void)state;
	if (max < 0) {
		print_message("no /proc/sys/net/core/somaxconn: the system maximum is unknown\n");
		skip();
	}
	assert_int_equal(tfab__sock_listen("127.0.0.1", 0, &lfd, &port), 0);
	accept_queue(lfd, &len, &bound);
	assert_int_equal(len, 0);
	assert_int_equal(bound, (unsigned)max);
	if (max < BURST) {
		print_message("net.core.somaxconn is %d: a burst of %d does not fit\n", max, BURST);
		close(lfd);
		skip();
	}

	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};

	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	for (int i = 0; i < BURST; i++) {
		fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		assert_true(fds[i] >= 0);
		assert_true(connect(fds[i], (struct sockaddr *)&sin, sizeof(sin)) == 0 ||
			    errno == EINPROGRESS);
	}
	/* On loopback every handshake completes at once; a dropped SYN would wait a second. */
	deadline = tfab__now_ms() + 5000;
	do {
		accept_queue(lfd, &len, &bound);
		if (len < BURST)
			usleep(10 * 1000);
	} while (len < BURST && tfab__now_ms() < deadline);
	assert_int_equal(len, BURST);

	for (int i = 0; i < BURST; i++) {
		struct pollfd pfd = {.fd = fds[i], .events = POLLOUT};
		int err = -1, afd = -1;
		socklen_t el = sizeof(err);

		assert_int_equal(poll(&pfd, 1, LONG_MS), 1);
		assert_int_equal(getsockopt(fds[i], SOL_SOCKET, SO_ERROR, &err, &el), 0);
		assert_int_equal(err, 0);
		assert_int_equal(tfab__sock_accept(lfd, LONG_MS, &afd), 0);
		close(afd);
	}
	accept_queue(lfd, &len, &bound);
	assert_int_equal(len, 0);
	for (int i = 0; i < BURST; i++)
		close(fds[i]);
	close(lfd);
}

static int nonlocal_bind(void)
{
	FILE *f = fopen("/proc/sys/net/ipv4/ip_nonlocal_bind", "r");
	int v = 0;

	if (f) {
		if (fscanf(f, "%d", &v) != 1)
			v = 0;
		fclose(f);
	}
	return v;
}

static void test_listen_bad_address(void **state)
{
	uint16_t port = 4321;
	int fd = -1;

	(void)state;
	if (nonlocal_bind()) {
		print_message("net.ipv4.ip_nonlocal_bind is set: any address binds\n");
		skip();
	}
	/* TEST-NET-1 (RFC 5737) is never a local address. */
	assert_true(tfab__sock_listen("192.0.2.1", 0, &fd, &port) < 0);
	assert_int_equal(fd, -1);
	assert_int_equal(port, 4321);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_parse_ok),
	    cmocka_unit_test(test_parse_rejects),
	    cmocka_unit_test(test_parse_host_too_long),
	    cmocka_unit_test_setup_teardown(test_small_both_ways, pair_open, pair_close),
	    cmocka_unit_test_setup_teardown(test_wire_format, pair_open, pair_close),
	    cmocka_unit_test_setup_teardown(test_zero_length, pair_open, pair_close),
	    cmocka_unit_test_setup_teardown(test_big_both_ways, pair_open, pair_close),
	    cmocka_unit_test_setup_teardown(test_too_big_for_cap, pair_open, pair_close),
	    cmocka_unit_test_setup_teardown(test_exact_cap, pair_open, pair_close),
	    cmocka_unit_test_setup_teardown(test_peer_closed, pair_open, pair_close),
	    cmocka_unit_test_setup_teardown(test_peer_closed_mid_message, pair_open, pair_close),
	    cmocka_unit_test_setup_teardown(test_send_to_closed, pair_open, pair_close),
	    cmocka_unit_test_setup_teardown(test_recv_timeout, pair_open, pair_close),
	    cmocka_unit_test_setup_teardown(test_recv_timeout_partial, pair_open, pair_close),
	    cmocka_unit_test_setup_teardown(test_accept_timeout, pair_open, pair_close),
	    cmocka_unit_test(test_connect_no_listener),
	    cmocka_unit_test(test_connect_waits_for_listener),
	    cmocka_unit_test(test_listen_any),
	    cmocka_unit_test(test_listen_backlog),
	    cmocka_unit_test(test_listen_bad_address),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
