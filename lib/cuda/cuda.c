/*
 * The copier of cuda.h: the CUDA runtime API (never the driver API, whose library is absent
 * on machines without a GPU), or the emulation. Copies run on one non-blocking stream per
 * context and are tracked with events; device pointers may be on any device (unified
 * addressing, cudaMemcpyDefault).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <tfab/status.h>

#include "cuda/cuda.h"
#include "util/config.h"
#include "util/log.h"

#ifdef TFAB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define SUBSYS "cuda"

struct tfab_cuda {
	bool emulate;
#ifdef TFAB_HAVE_CUDA
	cudaStream_t stream;
#endif
};

static const char *absent = "built without CUDA";

const char *tfab__cuda_absent_reason(void)
{
	return absent;
}

/* An emulated copy: done on its second test, so callers see a copy in progress too. */
struct emu_copy {
	int tests;
};

int tfab__cuda_open(const struct tfab_config *cfg, struct tfab_cuda **cu_p)
{
	struct tfab_cuda *cu;

	*cu_p = NULL;
	if (cfg->cuda_emulate) {
		cu = calloc(1, sizeof(*cu));
		if (!cu)
			return -ENOMEM;
		cu->emulate = true;
		TFAB_WARN(SUBSYS, "TFAB_CUDA_EMULATE=1: CUDA tensors are taken as host memory "
				  "(for tests only)");
		*cu_p = cu;
		return 0;
	}
#ifdef TFAB_HAVE_CUDA
	int n = 0; /* left untouched when the driver is missing */
	cudaError_t e = cudaGetDeviceCount(&n);

	if (e != cudaSuccess || n == 0) {
		absent = "no CUDA device on this machine";
		TFAB_INFO(SUBSYS, "%s (%s)", absent,
			  e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
		return 0;
	}
	cu = calloc(1, sizeof(*cu));
	if (!cu)
		return -ENOMEM;
	e = cudaStreamCreateWithFlags(&cu->stream, cudaStreamNonBlocking);
	if (e != cudaSuccess) {
		TFAB_ERROR(SUBSYS, "cudaStreamCreateWithFlags: %s", cudaGetErrorString(e));
		free(cu);
		return -EIO;
	}
	*cu_p = cu;
#endif
	return 0;
}

void tfab__cuda_close(struct tfab_cuda *cu)
{
	if (!cu)
		return;
#ifdef TFAB_HAVE_CUDA
	if (!cu->emulate)
		cudaStreamDestroy(cu->stream);
#endif
	free(cu);
}

#ifdef TFAB_HAVE_CUDA
static int cuda_status(cudaError_t e, const char *what)
{
	TFAB_ERROR(SUBSYS, "%s: %s", what, cudaGetErrorString(e));
	return -EIO;
}
#endif

int tfab__cuda_copy_start(struct tfab_cuda *cu, void *dst, const void *src, size_t n,
			  bool to_device, void **ev_p)
{
	if (cu->emulate) {
		struct emu_copy *c = calloc(1, sizeof(*c));

		if (!c)
			return -ENOMEM;
		memcpy(dst, src, n);
		*ev_p = c;
		return 0;
	}
#ifdef TFAB_HAVE_CUDA
	cudaEvent_t ev;
	cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);

	if (e != cudaSuccess)
		return cuda_status(e, "cudaEventCreateWithFlags");
	(void)to_device; /* unified addressing tells the direction */
	e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, cu->stream);
	if (e == cudaSuccess)
		e = cudaEventRecord(ev, cu->stream);
	if (e != cudaSuccess) {
		cudaEventDestroy(ev);
		return cuda_status(e, "cudaMemcpyAsync");
	}
	*ev_p = ev;
	return 0;
#else
	(void)dst, (void)src, (void)n, (void)to_device, (void)ev_p;
	return -EOPNOTSUPP;
#endif
}

int tfab__cuda_copy_test(struct tfab_cuda *cu, void *ev)
{
	if (cu->emulate) {
		struct emu_copy *c = ev;

		if (c->tests++ == 0)
			return 0;
		free(c);
		return 1;
	}
#ifdef TFAB_HAVE_CUDA
	cudaError_t e = cudaEventQuery((cudaEvent_t)ev);

	if (e == cudaErrorNotReady)
		return 0;
	cudaEventDestroy((cudaEvent_t)ev);
	return e == cudaSuccess ? 1 : cuda_status(e, "a copy between GPU and host");
#else
	(void)ev;
	return -EOPNOTSUPP;
#endif
}

int tfab__cuda_copy(struct tfab_cuda *cu, void *dst, const void *src, size_t n, bool to_device)
{
	void *ev = NULL; /* gcc cannot see that a 0 from copy_start set it */
	int rc = tfab__cuda_copy_start(cu, dst, src, n, to_device, &ev);

	while (rc == 0)
		rc = tfab__cuda_copy_test(cu, ev);
	return rc < 0 ? rc : 0;
}
