/*
 * Whether a GPU test may run: the CUDA devices here, for the tests that skip without one
 * (test_cuda, test_coll's gpu case). A skip says exactly why; CUDA that is there but broken
 * is a failure, not a skip.
 */
#ifndef TFAB_TEST_GPU_COUNT_H
#define TFAB_TEST_GPU_COUNT_H

#include <unistd.h>

#ifdef TFAB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/*
 * The CUDA devices here; or 0 where there is none (no device, or no NVIDIA driver at all: the
 * runtime then says "insufficient driver"), or -1 where CUDA is there but broken, with *why_p
 * saying which.
 */
static inline int gpu_count(const char **why_p)
{
#ifdef TFAB_HAVE_CUDA
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);

	*why_p = "no CUDA device on this machine";
	if (e == cudaSuccess)
		return n;
	if (e == cudaErrorNoDevice || e == cudaErrorStubLibrary ||
	    (e == cudaErrorInsufficientDriver &&
	     access("/proc/driver/nvidia/version", F_OK) != 0)) {
		*why_p = "no CUDA device or driver on this machine";
		return 0;
	}
	*why_p = cudaGetErrorString(e);
	return -1;
#else
	*why_p = "built without CUDA";
	return 0;
#endif
}

#endif
