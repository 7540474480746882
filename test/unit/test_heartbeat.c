/*
 * Unit tests for the reading side of heartbeats (lib/engine/heartbeat.c): a beat counts as heard
 * when it arrived, as the kernel stamped it, not when progress got round to reading it; a stamp
 * older than the beat before it (the wall clock stepped) counts as now; a connection's end is
 * told, and a goodbye before it (the peer was destroyed, not its process). And the writing side: after a stall (a stopped process) the beats go on one an
 * interval, not in a burst of the ones missed.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <signal.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h"
#include "util/time.h"

#define MS 1000000ull

/* The conversion from the kernel's wall-clock stamp, with the clocks driven by hand. */
static void test_arrival(void **state)
{
	const uint64_t real = 1800000000000ull * MS; /* some wall-clock time, in ns */

	(void)state;
	/* arrived 300 ms before this read: heard then */
	assert_int_equal(tfab__heartbeat_arrival_ms(10000, real, real - 300 * MS, 9500), 9700);
	/* the first beat (nothing heard before) */
	assert_int_equal(tfab__heartbeat_arrival_ms(10000, real, real - 300 * MS, 0), 9700);
	/* stamped after now (the wall clock stepped back meanwhile): heard now */
	assert_int_equal(tfab__heartbeat_arrival_ms(10000, real, real + 5000 * MS, 9500), 10000);
	/* the wall clock stepped forward 10 s meanwhile (before the beat before it): now */
	assert_int_equal(tfab__heartbeat_arrival_ms(100000, real, real - 10300 * MS, 99500),
			 100000);
	/* a stamp of another clock (a monotonic time read as a wall-clock one): now */
	assert_int_equal(tfab__heartbeat_arrival_ms(100000, real, 5000 * MS, 99500), 100000);
	assert_int_equal(tfab__heartbeat_arrival_ms(100000, real, 5000 * MS, 0), 100000);
	/* older than the clock itself: now, never time 0 (which means "never heard") */
	assert_int_equal(tfab__heartbeat_arrival_ms(100, real, real - 200 * MS, 0), 100);
	assert_int_equal(tfab__heartbeat_arrival_ms(100, real, real - 100 * MS, 0), 100);
}

/* A connected pair of TCP sockets on loopback: *a_p writes, *b_p reads. */
static void tcp_pair(int *a_p, int *b_p)
{
	struct sockaddr_in addr = {.sin_family = AF_INET,
				   .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(addr);
	int l = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(l >= 0);
	assert_int_equal(bind(l, (struct sockaddr *)&addr, sizeof(addr)), 0);
	assert_int_equal(listen(l, 1), 0);
	assert_int_equal(getsockname(l, (struct sockaddr *)&addr, &len), 0);
	*a_p = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(*a_p >= 0);
	assert_int_equal(connect(*a_p, (struct sockaddr *)&addr, sizeof(addr)), 0);
	*b_p = accept(l, NULL, NULL);
	assert_true(*b_p >= 0);
	close(l);
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

/*
 * A beat read 300 ms after it came was heard when it came: the silence that the liveness
 * checks judge does not start late because the application was busy when it arrived.
 */
static void test_heard_when_it_came(void **state)
{
	struct tfab_heartbeat *hb;
	uint64_t heard = 0, sent;
	bool bye = false;
	int a, b;

	(void)state;
	tcp_pair(&a, &b);
	/* as the engine watches a bootstrap connection (the beats it writes go to a) */
	assert_int_equal(tfab__heartbeat_open(60000, &hb), 0);
	assert_int_equal(tfab__heartbeat_add(hb, b), 0);
	/* the first stamps may wait for the kernel to switch them on (deferred work) */
	assert_int_equal(write(a, "H", 1), 1);
	sleep_ms(100);
	assert_false(tfab__heartbeat_hear(b, &heard, &bye));
	assert_true(heard != 0);

	sent = tfab__coarse_ms();
	assert_int_equal(write(a, "HH", 2), 2);
	sleep_ms(300);
	assert_false(tfab__heartbeat_hear(b, &heard, &bye));
	/* the coarse clock ticks every few ms; the read came 300 ms later */
	assert_true(heard + 20 >= sent);
	assert_true(heard <= sent + 100);

	/* nothing more: nothing changes */
	sent = heard;
	assert_false(tfab__heartbeat_hear(b, &heard, &bye));
	assert_int_equal(heard, sent);

	/* beats are no goodbye; the peer's goodbye, then its end, are told */
	assert_false(bye);
	tfab__heartbeat_bye(a);
	close(a);
	assert_true(tfab__heartbeat_hear(b, &heard, &bye));
	assert_true(bye);
	tfab__heartbeat_remove(hb, b);
	tfab__heartbeat_close(hb);
	close(b);

	/* an end without one (the process died) */
	bye = false;
	tcp_pair(&a, &b);
	assert_int_equal(write(a, "H", 1), 1);
	close(a);
	assert_true(tfab__heartbeat_hear(b, &heard, &bye));
	assert_false(bye);
	close(b);
}

/* Beats waiting on fd, read off: how many. */
static int beats_read(int fd)
{
	char buf[256];
	int n = 0;
	ssize_t got;

	while ((got = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
		n += (int)got;
	return n;
}

/*
 * The process stops for 600 ms (SIGSTOP, as a debugger or a job control stop does) while its
 * thread beats every 20 ms. Once it runs again, the beats go on one an interval from the first
 * one after the stop: not 30 at once for the intervals the stop took, which a peer would read
 * as a burst of life and the documented rate ("one each interval") does not allow.
 */
static void test_no_burst_after_a_stop(void **state)
{
	const unsigned interval = 20, stop_ms = 600;
	struct tfab_heartbeat *hb;
	uint64_t t0, elapsed;
	int sv[2], n, allowed, status;
	pid_t child;

	(void)state;
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	assert_int_equal(tfab__heartbeat_open(interval, &hb), 0);
	assert_int_equal(tfab__heartbeat_add(hb, sv[0]), 0);
	sleep_ms(100);
	(void)beats_read(sv[1]);
	t0 = tfab__now_ms();
	child = fork();
	assert_true(child >= 0);
	if (child == 0) {
		kill(getppid(), SIGSTOP);
		sleep_ms(stop_ms);
		kill(getppid(), SIGCONT);
		_exit(0);
	}
	assert_int_equal(waitpid(child, &status, 0), child);
	sleep_ms(3 * interval);
	n = beats_read(sv[1]);
	elapsed = tfab__now_ms() - t0;
	/* what the time it ran allows: its intervals, and one at each edge and one beat more */
	allowed = (int)((elapsed - (stop_ms - 100)) / interval) + 3;
	print_message("%d beats in %llu ms, %u of them stopped; at most %d allowed\n", n,
		      (unsigned long long)elapsed, stop_ms, allowed);
	assert_true(n >= 1);
	assert_true(n <= allowed);
	tfab__heartbeat_remove(hb, sv[0]);
	tfab__heartbeat_close(hb);
	close(sv[0]);
	close(sv[1]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_arrival),
	    cmocka_unit_test(test_heard_when_it_came),
	    cmocka_unit_test(test_no_burst_after_a_stop),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
