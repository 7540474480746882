/*
 * Shared segments: memfd-backed memory with no name in /dev/shm (a process that dies, SIGKILL
 * included, leaves nothing behind: the kernel frees a memfd with its last reference), opened
 * by other processes of this host, in its pid and mount namespaces, through
 * /proc/<pid>/fd/<n>. The shm backend's endpoints and a world's collective segment
 * (lib/world/coll_shm.c) are such segments.
 */
#ifndef TFAB_UTIL_SEGMENT_H
#define TFAB_UTIL_SEGMENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* A new segment of len bytes, zero-filled, mapped shared; its fd is close-on-exec. */
int tfab__seg_create(const char *name, size_t len, int *fd_p, uint64_t *ino_p, void **addr_p);

/*
 * Maps another process's segment: its fd number there, opened through /proc/<pid>/fd. ino
 * (when nonzero) must match, so that a reused fd number is refused. Returns the mapping and
 * its length.
 */
int tfab__seg_open(pid_t pid, int fd, uint64_t ino, void **addr_p, size_t *len_p);

#endif
