/*
 * Copies between CUDA device memory and registered host memory, for the proxy path of GPU
 * tensors (the fabric cannot reach GPU memory, so the content goes through a host block). One
 * small interface over three implementations: the CUDA runtime (a build with CUDA, the runtime
 * library loadable and a device present), an emulation that treats device pointers as host
 * memory (TFAB_CUDA_EMULATE=1: tests of the proxy pipeline on machines without a GPU), or none.
 * The runtime library is loaded at the first tfab__cuda_open that is not emulated, once per
 * process, and stays loaded.
 *
 * Not thread-safe, but for that load: the engine calls it under the context lock.
 */
#ifndef TFAB_CUDA_CUDA_H
#define TFAB_CUDA_CUDA_H

#include <stdbool.h>
#include <stddef.h>

struct tfab_config;
struct tfab_cuda;

/*
 * The copier for this context: *cu_p gets NULL (and 0 comes back) when the build has no CUDA,
 * the CUDA runtime cannot be loaded, or no device is present, and emulation is off; the reason
 * is logged at info level.
 */
int tfab__cuda_open(const struct tfab_config *cfg, struct tfab_cuda **cu_p);
void tfab__cuda_close(struct tfab_cuda *cu);

/*
 * Why there is no copier ("built without CUDA", "the CUDA runtime libcudart.so.13 could not be
 * loaded: ...", "no CUDA device on this machine"), for error messages.
 */
const char *tfab__cuda_absent_reason(void);

/*
 * Pin [buf, buf + n) for copies (cudaHostRegister): a copy from or to pageable host memory
 * goes through the driver's own bounce buffer, synchronously and at a fraction of the bus's
 * speed; one to pinned memory is a DMA that runs while the caller goes on. Pinning costs a
 * page walk, so it is made once per pool block and kept with it. 0, or a negative status
 * (the memory stays usable, unpinned). Emulated: nothing to pin, 0.
 */
int tfab__cuda_pin(struct tfab_cuda *cu, void *buf, size_t n);
void tfab__cuda_unpin(struct tfab_cuda *cu, void *buf);

/* Start copying n bytes, to the device or from it; *ev_p gets the copy to test. */
int tfab__cuda_copy_start(struct tfab_cuda *cu, void *dst, const void *src, size_t n,
			  bool to_device, void **ev_p);

/* 1 when the copy finished, 0 while it runs, or a negative status; ev is gone unless 0. */
int tfab__cuda_copy_test(struct tfab_cuda *cu, void *ev);

/* Copy and wait. */
int tfab__cuda_copy(struct tfab_cuda *cu, void *dst, const void *src, size_t n, bool to_device);

#endif
