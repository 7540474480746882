/*
 * The one copy of the shm backend's shared-segment path: straight into the receiver's
 * destination, with non-temporal stores for large copies so that the destination's lines are
 * not read for ownership and the writer's cache is not flushed by data it never reads again.
 */
#ifndef TFAB_SHM_COPY_H
#define TFAB_SHM_COPY_H

#include <stdbool.h>
#include <stddef.h>

/*
 * Writes at least this long stream. Measured on the 2-core machine (memcpy-bw): streaming
 * copies run at 26-28 GB/s whatever the size, memcpy at 45-48 GB/s up to 4 MiB (in cache),
 * 35 at 8 MiB, 16-17 from 16 MiB on (glibc streams only past a threshold set from the L3
 * size the VM reports, 320 MiB, so never here). Below, the receiver also finds the bytes in
 * cache.
 */
#define TFAB_SHM_NT_MIN (16u << 20)

/*
 * memcpy, or streaming stores when stream (a write of at least TFAB_SHM_NT_MIN, copied in
 * pieces); either way ordered before a later release store (fenced).
 */
void tfab_shm_copy(void *dst, const void *src, size_t len, bool stream);

#endif
