/*
 * spin-cost: what the polling policy (doc/design.md "Waiting") costs and buys, for the values
 * in the environment: TFAB_SPIN_US for the blocking receives, TFAB_PROGRESS_SPIN_US for the
 * progress thread. Two contexts of this process, a peer of each connected to
 * the other through their blobs (native shm), then:
 *   - idle receive: a blocking receive (tfab_recv_sync) for which nothing comes, 300 ms: the
 *     CPU its thread burns, as a share of one core;
 *   - late send: a blocking receive whose send another thread posts DELAY us later (and then
 *     drives the sender's progress): from the send's post to the receive's return, median of
 *     ROUNDS, in us; the wake-up a pause costs;
 *   - idle progress thread: a context with TFAB_PROGRESS_THREAD=1 and a connected peer, idle
 *     for 300 ms: the process's CPU, as a share of one core.
 * One JSON object. usage: spin-cost [DELAY_US [ROUNDS]]   (default 2000 and 50)
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <tfab/tfab.h>

#include "bench.h"

/* This thread's CPU time, us. */
static double thread_cpu_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

struct late {
	struct tfab_context *ctx;
	struct tfab_peer *peer;
	unsigned delay_us;
	int64_t step;
	double posted_us; /* CLOCK_MONOTONIC */
	volatile int done;
	int status;
};

static void sent(void *arg, int status)
{
	struct late *l = arg;

	l->status = status;
	l->done = 1;
}

/* Posts the send delay_us after it starts, then drives the sender's context until it ends. */
static void *late_sender(void *arg)
{
	struct late *l = arg;
	static float v = 1.0f;
	int64_t shape[1] = {1};
	DLTensor t = {.data = &v,
		      .device = {kDLCPU, 0},
		      .ndim = 1,
		      .dtype = {kDLFloat, 32, 1},
		      .shape = shape};
	struct timespec d = {0, (long)l->delay_us * 1000};
	int rc;

	nanosleep(&d, NULL);
	l->posted_us = bench_now_us();
	rc = tfab_send_to(l->ctx, l->peer, "late", l->step, &t, false, sent, l);
	if (rc) {
		l->status = rc;
		return NULL;
	}
	while (!l->done)
		tfab_progress(l->ctx);
	return NULL;
}

int main(int argc, char **argv)
{
	unsigned delay_us = argc > 1 ? (unsigned)atoi(argv[1]) : 2000;
	int rounds = argc > 2 ? atoi(argv[2]) : 50;
	struct tfab_context *c[2] = {NULL, NULL};
	struct tfab_peer *p[2] = {NULL, NULL};
	double *wake = calloc((size_t)(rounds > 0 ? rounds : 1), sizeof(double));
	double cpu0, wall0, idle_share, thread_share;
	const char *spin = getenv("TFAB_SPIN_US"), *pspin = getenv("TFAB_PROGRESS_SPIN_US");
	int rc;

	if (rounds < 1 || !wake) {
		fprintf(stderr, "usage: spin-cost [DELAY_US [ROUNDS]]\n");
		return 2;
	}
	setenv("TFAB_PROVIDER", "shm", 0);
	unsetenv("TFAB_PROGRESS_THREAD");
	rc = bench_pair(c, p);
	if (rc) {
		fprintf(stderr, "spin-cost: %s\n", tfab_strerror(rc));
		return 1;
	}
	for (int i = 0; i < 1000; i++) { /* the connection's own traffic settles */
		tfab_progress(c[0]);
		tfab_progress(c[1]);
	}

	/* A blocking receive for which nothing comes. */
	cpu0 = thread_cpu_us();
	wall0 = bench_now_us();
	rc = tfab_recv_sync(c[0], p[0], "never", 0, NULL, 300, NULL, NULL);
	if (rc != -TFAB_ERR_TIMEOUT && rc != -ETIMEDOUT) {
		fprintf(stderr, "spin-cost: the idle receive ended with %s, not a timeout\n",
			tfab_strerror(rc));
		return 1;
	}
	idle_share = (thread_cpu_us() - cpu0) / (bench_now_us() - wall0);

	/* Blocking receives whose sends come delay_us late. */
	for (int r = 0; r < rounds; r++) {
		struct late l = {.ctx = c[1], .peer = p[1], .delay_us = delay_us, .step = r};
		DLManagedTensor *t = NULL;
		pthread_t th;

		pthread_create(&th, NULL, late_sender, &l);
		rc = tfab_recv_sync(c[0], p[0], "late", r, NULL, 10000, &t, NULL);
		wake[r] = bench_now_us();
		pthread_join(th, NULL);
		if (rc || l.status) {
			fprintf(stderr, "spin-cost: late send %d: %s\n", r,
				tfab_strerror(rc ? rc : l.status));
			return 1;
		}
		wake[r] -= l.posted_us;
		t->deleter(t);
	}
	bench_median(wake, rounds);
	for (int i = 0; i < 2; i++) {
		tfab_peer_destroy(p[i]);
		tfab_context_destroy(c[i]);
	}

	/* An idle progress thread. */
	setenv("TFAB_PROGRESS_THREAD", "1", 1);
	rc = bench_pair(c, p);
	if (rc) {
		fprintf(stderr, "spin-cost: %s\n", tfab_strerror(rc));
		return 1;
	}
	{
		struct timespec settle = {0, 50 * 1000 * 1000}, idle = {0, 300 * 1000 * 1000};
		struct rusage u0, u1;

		nanosleep(&settle, NULL);
		getrusage(RUSAGE_SELF, &u0);
		wall0 = bench_now_us();
		nanosleep(&idle, NULL);
		getrusage(RUSAGE_SELF, &u1);
		thread_share = ((double)(u1.ru_utime.tv_sec - u0.ru_utime.tv_sec) * 1e6 +
				(double)(u1.ru_utime.tv_usec - u0.ru_utime.tv_usec) +
				(double)(u1.ru_stime.tv_sec - u0.ru_stime.tv_sec) * 1e6 +
				(double)(u1.ru_stime.tv_usec - u0.ru_stime.tv_usec)) /
			       (bench_now_us() - wall0);
	}
	for (int i = 0; i < 2; i++) {
		tfab_peer_destroy(p[i]);
		tfab_context_destroy(c[i]);
	}
	printf("{\"test\":\"spin_cost\",\"spin_us\":\"%s\",\"progress_spin_us\":\"%s\","
	       "\"idle_recv_cpu\":%.3f,"
	       "\"late_send_delay_us\":%u,\"wake_us_median\":%.1f,\"wake_us_p90\":%.1f,"
	       "\"idle_thread_cpu\":%.3f}\n",
	       spin ? spin : "default", pspin ? pspin : "default", idle_share, delay_us,
	       wake[rounds / 2], wake[rounds * 9 / 10], thread_share);
	free(wake);
	return 0;
}
