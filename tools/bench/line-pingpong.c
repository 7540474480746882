/*
 * line-pingpong: the floor of any same-host latency here: two processes hand one word back
 * and forth through shared memory (one cache line each way, spinning), as the shm backend's
 * ring does with its entries. One way is half a round. Medians of REPS runs of ROUNDS rounds;
 * with --two the receiver also reads a second line the sender wrote (an entry's header and
 * its data), as an 8-byte inline write needs.
 *
 * usage: line-pingpong [REPS] [ROUNDS] [--two]   (default 7, 1000000); prints ns one way.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

struct line {
	_Alignas(64) _Atomic unsigned long v;
	char pad[56];
};

/* One run: ns one way. l[0]: ping, l[1]: pong, l[2]: the second line of --two. */
static double run(struct line *l, long rounds, int two)
{
	double t0;
	pid_t pid;

	for (int i = 0; i < 3; i++)
		atomic_store(&l[i].v, 0);
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		for (long i = 1; i <= rounds; i++) {
			while (atomic_load_explicit(&l[0].v, memory_order_acquire) !=
			       (unsigned long)i)
				;
			if (two)
				(void)atomic_load_explicit(&l[2].v, memory_order_relaxed);
			atomic_store_explicit(&l[1].v, (unsigned long)i, memory_order_release);
		}
		_exit(0);
	}
	t0 = bench_now_ns();
	for (long i = 1; i <= rounds; i++) {
		if (two)
			atomic_store_explicit(&l[2].v, (unsigned long)i, memory_order_relaxed);
		atomic_store_explicit(&l[0].v, (unsigned long)i, memory_order_release);
		while (atomic_load_explicit(&l[1].v, memory_order_acquire) != (unsigned long)i)
			;
	}
	t0 = (bench_now_ns() - t0) / (double)rounds / 2;
	waitpid(pid, NULL, 0);
	return t0;
}

int main(int argc, char **argv)
{
	int reps = argc > 1 ? atoi(argv[1]) : 7, two = argc > 3 && strcmp(argv[3], "--two") == 0;
	long rounds = argc > 2 ? atol(argv[2]) : 1000000;
	struct line *l =
	    mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	double *t;

	if (l == MAP_FAILED || reps < 1 || rounds < 1 || !(t = calloc((size_t)reps, sizeof(*t))))
		return 2;
	for (int i = 0; i < reps; i++) {
		t[i] = run(l, rounds, two);
		if (t[i] < 0)
			return 1;
	}
	qsort(t, (size_t)reps, sizeof(*t), bench_cmp);
	printf("{\"test\":\"line-pingpong\",\"lines\":%d,\"ns_one_way\":%.1f,\"min\":%.1f,"
	       "\"max\":%.1f}\n",
	       two ? 2 : 1, t[reps / 2], t[0], t[reps - 1]);
	return 0;
}
