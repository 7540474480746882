/*
 * The one copy of the shm backend's shared-segment path: straight into the receiver's
 * destination, with non-temporal stores for large copies so that the destination's lines are
 * not read for ownership and the writer's cache is not flushed by data it never reads again.
 */
#ifndef TFAB_SHM_COPY_H
#define TFAB_SHM_COPY_H

#include <stddef.h>

/* Copies at least this long stream (measured on the 2-core machine: see doc/providers.md). */
#define TFAB_SHM_NT_MIN (256u << 10)

/* memcpy, streaming when long; ordered before a later release store (fenced). */
void tfab_shm_copy(void *dst, const void *src, size_t len);

#endif
