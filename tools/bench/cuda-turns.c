/*
 * cuda-turns: what two processes pay when they drive one GPU in turn, as tfab-perf's two
 * processes do with a GPU tensor (the sender's copy from the GPU, then the receiver's copy to
 * it). Two workers make 8-byte copies (device to pinned host memory, as the engine makes them:
 * cudaMemcpyAsync, an event, cudaEventQuery polled), each in its turn, the turn handed over
 * through a word in shared memory: first as two threads of one process (one CUDA context),
 * then as two processes (a context each). Medians of REPS runs of ROUNDS turns, us a turn.
 *
 * usage: cuda-turns [REPS] [ROUNDS]   (default 5, 2000)
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "bench.h"

struct turns {
	_Alignas(64) _Atomic long turn; /* even: worker 0's, odd: worker 1's; -1 before */
	_Alignas(64) _Atomic int ready; /* workers with their CUDA context made */
	_Atomic int failed;
	long rounds;
	_Atomic int w; /* the next thread's worker number */
};

/* Worker w: its context first, then a copy in each of its turns. */
static void worker(struct turns *t, int w)
{
	cudaStream_t st;
	cudaEvent_t ev;
	void *dev, *host;

	if (cudaMalloc(&dev, 8) != cudaSuccess || cudaMallocHost(&host, 8) != cudaSuccess ||
	    cudaStreamCreateWithFlags(&st, cudaStreamDefault) != cudaSuccess ||
	    cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
		atomic_store(&t->failed, 1);
		atomic_fetch_add(&t->ready, 1);
		return;
	}
	atomic_fetch_add(&t->ready, 1);
	for (long i = w; i < 2 * t->rounds && !atomic_load(&t->failed); i += 2) {
		while (atomic_load_explicit(&t->turn, memory_order_acquire) != i &&
		       !atomic_load(&t->failed))
			;
		if (cudaMemcpyAsync(host, dev, 8, cudaMemcpyDefault, st) != cudaSuccess ||
		    cudaEventRecord(ev, st) != cudaSuccess)
			atomic_store(&t->failed, 1);
		while (cudaEventQuery(ev) == cudaErrorNotReady)
			;
		atomic_store_explicit(&t->turn, i + 1, memory_order_release);
	}
	cudaEventDestroy(ev);
	cudaStreamDestroy(st);
	cudaFreeHost(host);
	cudaFree(dev);
}

static void *thread_main(void *arg)
{
	struct turns *t = arg;

	worker(t, atomic_fetch_add(&t->w, 1));
	return NULL;
}

/*
 * One run, us a turn, or -1: the workers are two children (this process never starts CUDA
 * before the last fork: CUDA does not survive one) or two threads.
 */
static double run(struct turns *t, int procs)
{
	pid_t pid[2] = {-1, -1};
	pthread_t th[2];
	double t0;
	int ok = 1;

	atomic_store(&t->turn, -1);
	atomic_store(&t->ready, 0);
	atomic_store(&t->failed, 0);
	atomic_store(&t->w, 0);
	for (int k = 0; k < 2; k++) {
		if (procs) {
			pid[k] = fork();
			if (pid[k] == 0) {
				worker(t, k);
				_exit(0);
			}
			ok &= pid[k] > 0;
		} else {
			ok &= pthread_create(&th[k], NULL, thread_main, t) == 0;
		}
	}
	if (!ok)
		return -1;
	while (atomic_load(&t->ready) < 2)
		;
	t0 = bench_now_us();
	atomic_store(&t->turn, 0);
	while (atomic_load(&t->turn) < 2 * t->rounds && !atomic_load(&t->failed))
		;
	t0 = (bench_now_us() - t0) / (2.0 * (double)t->rounds);
	for (int k = 0; k < 2; k++) {
		if (procs)
			waitpid(pid[k], NULL, 0);
		else
			pthread_join(th[k], NULL);
	}
	return atomic_load(&t->failed) ? -1 : t0;
}

int main(int argc, char **argv)
{
	int reps = argc > 1 ? atoi(argv[1]) : 5;
	struct turns *t =
	    mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	double *v;

	if (t == MAP_FAILED || reps < 1 || !(v = calloc((size_t)reps, sizeof(*v))))
		return 2;
	t->rounds = argc > 2 ? atol(argv[2]) : 2000;
	/* Processes first: this process starts CUDA only with its threads. */
	for (int procs = 1; procs >= 0; procs--) {
		for (int i = 0; i < reps; i++) {
			v[i] = run(t, procs);
			if (v[i] < 0) {
				fprintf(stderr, "cuda-turns: CUDA failed\n");
				return 1;
			}
		}
		qsort(v, (size_t)reps, sizeof(*v), bench_cmp);
		printf("two %s: %.1f us a turn (median of %d; %.1f to %.1f)\n",
		       procs ? "processes" : "threads of one process", v[reps / 2], reps, v[0],
		       v[reps - 1]);
	}
	return 0;
}
