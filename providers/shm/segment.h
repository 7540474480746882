/*
 * Shared segments of the shm backend (util/segment.h: memfd memory, opened by peers through
 * /proc/<pid>/fd/<n>); the host identity that tells a peer
 * on this host and in these namespaces from one that is not; and process handles (pidfd) that
 * tell a peer's death without polling its pid.
 */
#ifndef TFAB_SHM_SEGMENT_H
#define TFAB_SHM_SEGMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "util/segment.h"

/* Where a process runs: same boot, same pid and mount namespaces, or no shared memory. */
struct tfab_shm_host {
	uint8_t boot_id[16];
	uint64_t pid_ns;
	uint64_t mnt_ns;
};

/* This process's identity (read once, cached). */
int tfab_shm_host_self(struct tfab_shm_host *host_p);

/* A handle on a process whose exit poll() reports (pidfd), or -errno. */
int tfab_shm_pidfd(pid_t pid);

/* Whether the process behind a pidfd (or, where pidfd is missing, a pid) has exited. */
bool tfab_shm_process_gone(int pidfd, pid_t pid);

#endif
