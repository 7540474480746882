/*
 * The copier of cuda.h: the CUDA runtime API (never the driver API, whose library is absent
 * on machines without a GPU), or the emulation. Copies run on one blocking stream per
 * context (after the legacy default stream's work) and are tracked with events; device
 * pointers may be on any device (unified addressing, cudaMemcpyDefault).
 *
 * The runtime library is not linked: it is loaded (dlopen) at the first open that is not
 * emulated, that is at the first GPU tensor, once per process and never unloaded, so that
 * CPU-only users and machines without the runtime never load it. CUDA's headers still give
 * the types and the prototypes the functions are called through.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <tfab/status.h>

#include "cuda/cuda.h"
#include "util/config.h"
#include "util/log.h"

#ifdef TFAB_HAVE_CUDA
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>

#include <cuda_runtime_api.h>
#endif

#define SUBSYS "cuda"

/* Events of finished copies kept for the next ones: creating one costs a driver call. */
#define SPARE_EVENTS 64

struct tfab_cuda {
	bool emulate;
#ifdef TFAB_HAVE_CUDA
	cudaStream_t stream;
	cudaEvent_t spare[SPARE_EVENTS];
	unsigned nspare;
#endif
};

static const char *absent = "built without CUDA";

const char *tfab__cuda_absent_reason(void)
{
	return absent;
}

#ifdef TFAB_HAVE_CUDA
/*
 * The runtime functions used here. The names go through the header's macros (with a
 * per-thread default stream cudaMemcpyAsync is cudaMemcpyAsync_ptsz), so the symbols looked
 * up are those a linked build would call, and rt.cudaMemcpyAsync(...) reads like the call.
 */
#define CUDART_FUNCS(X)              \
	X(cudaGetDeviceCount)        \
	X(cudaGetErrorString)        \
	X(cudaStreamCreateWithFlags) \
	X(cudaStreamDestroy)         \
	X(cudaEventCreateWithFlags)  \
	X(cudaEventRecord)           \
	X(cudaEventQuery)            \
	X(cudaEventDestroy)          \
	X(cudaMemcpyAsync)           \
	X(cudaHostRegister)          \
	X(cudaHostUnregister)        \
	X(cudaGetLastError)          \
	X(cudaStreamSynchronize)

#define CUDART_STR_(x) #x
#define CUDART_STR(x) CUDART_STR_(x)
#define CUDART_FIELD(fn) __typeof__(fn) *fn;
#define CUDART_SYM(fn) {CUDART_STR(fn), offsetof(struct cudart, fn)},

struct cudart {
	CUDART_FUNCS(CUDART_FIELD)
};

static const struct {
	const char *name;
	size_t offset;
} cudart_syms[] = {CUDART_FUNCS(CUDART_SYM)};

/* POSIX: dlsym's object pointer holds a function pointer. */
_Static_assert(sizeof(void *) == sizeof(void (*)(void)), "dlsym cannot return functions");

/* Written once under cudart_once, read-only after: no lock on the copy path. */
static struct cudart rt;
static bool cudart_loaded;
static char cudart_absent[512];
static pthread_once_t cudart_once = PTHREAD_ONCE_INIT;

/*
 * The runtime of the toolkit's major version this was built with (CUDART_VERSION 13000:
 * libcudart.so.13), else whatever libcudart.so is. It stays loaded for the life of the
 * process: streams and events of any context may still use it.
 */
static void cudart_load(void)
{
	char soname[32], err[256];
	const char *name = soname, *e;
	void *h;

	snprintf(soname, sizeof(soname), "libcudart.so.%d", CUDART_VERSION / 1000);
	h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(err, sizeof(err), "%s", dlerror());
		name = "libcudart.so";
		h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
		if (!h) {
			TFAB_DEBUG(SUBSYS, "no %s either: %s", name, dlerror());
			snprintf(cudart_absent, sizeof(cudart_absent),
				 "the CUDA runtime %s could not be loaded: %s", soname, err);
			return;
		}
	}
	for (size_t i = 0; i < sizeof(cudart_syms) / sizeof(cudart_syms[0]); i++) {
		void *sym;

		dlerror();
		sym = dlsym(h, cudart_syms[i].name);
		if (!sym) {
			e = dlerror();
			snprintf(cudart_absent, sizeof(cudart_absent),
				 "the CUDA runtime %s could not be loaded: %s", name,
				 e ? e : "a function is NULL");
			memset(&rt, 0, sizeof(rt));
			dlclose(h); /* nothing holds a function of it yet */
			return;
		}
		memcpy((char *)&rt + cudart_syms[i].offset, &sym, sizeof(sym));
	}
	cudart_loaded = true;
	TFAB_INFO(SUBSYS, "loaded the CUDA runtime %s", name);
}
#endif

/*
 * An emulated copy: made on its second test, as the copy finishes, so that callers see a copy
 * in progress, and one that reads the destination before the copy ended, or lets the source
 * go, reads what a GPU's asynchronous copy would leave there (the old bytes), not the new.
 */
struct emu_copy {
	int tests;
	void *dst;
	const void *src;
	size_t n;
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
	cudaError_t e;

	pthread_once(&cudart_once, cudart_load);
	if (!cudart_loaded) {
		absent = cudart_absent;
		TFAB_INFO(SUBSYS, "%s", absent);
		return 0;
	}
	e = rt.cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0) {
		absent = "no CUDA device on this machine";
		TFAB_INFO(SUBSYS, "%s (%s)", absent,
			  e != cudaSuccess ? rt.cudaGetErrorString(e) : "0 devices");
		return 0;
	}
	cu = calloc(1, sizeof(*cu));
	if (!cu)
		return -ENOMEM;
	/*
	 * A blocking stream: its copies wait for the work queued before them on the legacy
	 * default stream (cudaMemcpy, and kernels launched there, PyTorch's default stream
	 * among them), so that a tensor made there is whole before it is staged. A non-blocking
	 * one raced them: on a GPU, a tensor just written by cudaMemcpy went out stale.
	 */
	e = rt.cudaStreamCreateWithFlags(&cu->stream, cudaStreamDefault);
	if (e != cudaSuccess) {
		TFAB_ERROR(SUBSYS, "cudaStreamCreateWithFlags: %s", rt.cudaGetErrorString(e));
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
	if (!cu->emulate) {
		while (cu->nspare)
			rt.cudaEventDestroy(cu->spare[--cu->nspare]);
		rt.cudaStreamDestroy(cu->stream);
	}
#endif
	free(cu);
}

#ifdef TFAB_HAVE_CUDA
static int cuda_status(cudaError_t e, const char *what)
{
	TFAB_ERROR(SUBSYS, "%s: %s", what, rt.cudaGetErrorString(e));
	return -EIO;
}

/* A finished copy's event goes back to the spares, or is destroyed when they are full. */
static void event_put(struct tfab_cuda *cu, cudaEvent_t ev)
{
	if (cu->nspare < SPARE_EVENTS)
		cu->spare[cu->nspare++] = ev;
	else
		rt.cudaEventDestroy(ev);
}
#endif

int tfab__cuda_pin(struct tfab_cuda *cu, void *buf, size_t n)
{
	if (cu->emulate)
		return 0;
#ifdef TFAB_HAVE_CUDA
	/* Portable: pinned for every device's context, wherever the tensor is. */
	cudaError_t e = rt.cudaHostRegister(buf, n, cudaHostRegisterPortable);

	if (e != cudaSuccess) {
		/*
		 * Cleared, or the application's next cudaGetLastError (PyTorch's check after
		 * each kernel launch) would take it for its own.
		 */
		rt.cudaGetLastError();
		TFAB_WARN(SUBSYS, "cudaHostRegister of %zu bytes: %s; copies through it are slower",
			  n, rt.cudaGetErrorString(e));
		return -EIO;
	}
	return 0;
#else
	(void)buf, (void)n;
	return -EOPNOTSUPP;
#endif
}

void tfab__cuda_unpin(struct tfab_cuda *cu, void *buf)
{
	if (cu->emulate)
		return;
#ifdef TFAB_HAVE_CUDA
	cudaError_t e = rt.cudaHostUnregister(buf);

	if (e != cudaSuccess) {
		rt.cudaGetLastError(); /* as in tfab__cuda_pin */
		TFAB_WARN(SUBSYS, "cudaHostUnregister: %s", rt.cudaGetErrorString(e));
	}
#else
	(void)buf;
#endif
}

int tfab__cuda_copy_start(struct tfab_cuda *cu, void *dst, const void *src, size_t n,
			  bool to_device, void **ev_p)
{
	if (cu->emulate) {
		struct emu_copy *c = calloc(1, sizeof(*c));

		if (!c)
			return -ENOMEM;
		*c = (struct emu_copy){.dst = dst, .src = src, .n = n};
		*ev_p = c;
		return 0;
	}
#ifdef TFAB_HAVE_CUDA
	cudaEvent_t ev;
	cudaError_t e = cudaSuccess;

	if (cu->nspare)
		ev = cu->spare[--cu->nspare];
	else
		e = rt.cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
	if (e != cudaSuccess)
		return cuda_status(e, "cudaEventCreateWithFlags");
	(void)to_device; /* unified addressing tells the direction */
	e = rt.cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, cu->stream);
	if (e == cudaSuccess)
		e = rt.cudaEventRecord(ev, cu->stream);
	if (e != cudaSuccess) {
		/*
		 * The copy may be queued (the record failed): the caller takes it for never
		 * started and may free or unpin its memory, so it ends first.
		 */
		rt.cudaStreamSynchronize(cu->stream);
		rt.cudaGetLastError();
		event_put(cu, ev); /* recorded on nothing, or on no copy that could fail */
		return cuda_status(e, "cudaMemcpyAsync or cudaEventRecord");
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
		memcpy(c->dst, c->src, c->n);
		free(c);
		return 1;
	}
#ifdef TFAB_HAVE_CUDA
	cudaError_t e = rt.cudaEventQuery((cudaEvent_t)ev);

	if (e == cudaErrorNotReady)
		return 0;
	if (e == cudaSuccess) {
		event_put(cu, (cudaEvent_t)ev);
		return 1;
	}
	rt.cudaEventDestroy((cudaEvent_t)ev); /* not reused after an error */
	return cuda_status(e, "a copy between GPU and host");
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
