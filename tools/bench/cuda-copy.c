/*
 * cuda-copy: the bound of the GPU proxy path's copies, measured as the engine makes them
 * (lib/cuda/cuda.c): cudaMemcpyAsync on a blocking stream, an event recorded after it, and
 * cudaEventQuery polled until it says done; beside it the synchronous cudaMemcpy. Between a
 * cudaMalloc'd buffer and host memory that is pageable (malloc), pinned as the pool pins
 * its blocks (cudaHostRegister, portable), or a shared file mapping pinned so (a memfd,
 * MAP_SHARED: the shm backend's segments, where its pool blocks live), each direction, at
 * 8 B to 64 MiB; medians.
 * Then what single calls cost: launching an 8-byte copy, recording an event, querying a
 * finished one.
 *
 * usage: cuda-copy [REPS]   (default 21; 64 MiB takes a third of them)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "bench.h"

#define CHECK(x)                                                                            \
	do {                                                                                \
		cudaError_t e_ = (x);                                                       \
		if (e_ != cudaSuccess) {                                                    \
			fprintf(stderr, "cuda-copy: %s: %s\n", #x, cudaGetErrorString(e_)); \
			exit(1);                                                            \
		}                                                                           \
	} while (0)

int main(int argc, char **argv)
{
	static const size_t sizes[] = {8, 64 << 10, 1 << 20, 64 << 20};
	int reps = argc > 1 ? atoi(argv[1]) : 21;
	size_t max = 64 << 20;
	cudaStream_t st;
	cudaEvent_t ev;
	static const char *kinds[] = {"pageable", "pinned", "shared"};
	void *dev, *host[3];
	int fd;
	double *t;

	if (reps < 3 || !(t = calloc((size_t)reps, sizeof(*t))))
		return 2;
	CHECK(cudaMalloc(&dev, max));
	CHECK(cudaMemset(dev, 1, max));
	for (int k = 0; k < 2; k++) {
		host[k] = aligned_alloc(4096, max);
		if (!host[k])
			return 2;
		memset(host[k], 2, max);
	}
	fd = memfd_create("cuda-copy", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)max) ||
	    (host[2] = mmap(NULL, max, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
		return 2;
	memset(host[2], 2, max);
	CHECK(cudaHostRegister(host[1], max, cudaHostRegisterPortable));
	CHECK(cudaHostRegister(host[2], max, cudaHostRegisterPortable));
	CHECK(cudaStreamCreateWithFlags(&st, cudaStreamDefault));
	CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
	printf("%-9s %-8s %-4s %10s %10s %10s %10s\n", "bytes", "host", "dir", "async us",
	       "async GB/s", "sync us", "sync GB/s");
	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		size_t n = sizes[s];
		int r = n >= max ? (reps + 2) / 3 : reps;

		for (int k = 0; k < 3; k++) {
			for (int d = 0; d < 2; d++) {
				void *dst = d ? dev : host[k], *src = d ? host[k] : dev;
				double a, y;

				for (int i = 0; i < r; i++) {
					double t0 = bench_now_us();

					CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, st));
					CHECK(cudaEventRecord(ev, st));
					while (cudaEventQuery(ev) == cudaErrorNotReady)
						;
					t[i] = bench_now_us() - t0;
				}
				a = bench_median(t, r);
				for (int i = 0; i < r; i++) {
					double t0 = bench_now_us();

					CHECK(cudaMemcpy(dst, src, n, cudaMemcpyDefault));
					t[i] = bench_now_us() - t0;
				}
				y = bench_median(t, r);
				printf("%-9zu %-8s %-4s %10.1f %10.2f %10.1f %10.2f\n", n, kinds[k],
				       d ? "h2d" : "d2h", a, (double)n / a / 1e3, y,
				       (double)n / y / 1e3);
			}
		}
	}
	/* Single calls, each the median of reps batches of 100. */
	for (int c = 0; c < 3; c++) {
		for (int i = 0; i < reps; i++) {
			double t0 = bench_now_us();

			for (int j = 0; j < 100; j++) {
				if (c == 0)
					CHECK(cudaMemcpyAsync(host[1], dev, 8, cudaMemcpyDefault,
							      st));
				else if (c == 1)
					CHECK(cudaEventRecord(ev, st));
				else
					(void)cudaEventQuery(ev);
			}
			t[i] = (bench_now_us() - t0) / 100;
			CHECK(cudaStreamSynchronize(st));
		}
		printf("%s: %.2f us a call\n",
		       c == 0	? "cudaMemcpyAsync of 8 B to pinned memory (launch)"
		       : c == 1 ? "cudaEventRecord"
				: "cudaEventQuery of a finished event",
		       bench_median(t, reps));
	}
	CHECK(cudaHostUnregister(host[1]));
	CHECK(cudaHostUnregister(host[2]));
	munmap(host[2], max);
	close(fd);
	return 0;
}
