/* Shared segments: memfd memory that other processes of this host open through /proc. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/log.h"
#include "util/segment.h"

#define SUBSYS "segment"

int tfab__seg_create(const char *name, size_t len, int *fd_p, uint64_t *ino_p, void **addr_p)
{
	struct stat st;
	void *addr;
	int fd, rc;

	fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		TFAB_ERROR(SUBSYS, "memfd_create: %s", strerror(-rc));
		return rc;
	}
	if (ftruncate(fd, (off_t)len) < 0 || fstat(fd, &st) < 0) {
		rc = -errno;
		TFAB_ERROR(SUBSYS, "sizing a %zu-byte segment: %s", len, strerror(-rc));
		close(fd);
		return rc;
	}
	addr = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (addr == MAP_FAILED) {
		rc = -errno;
		TFAB_ERROR(SUBSYS, "mapping a %zu-byte segment: %s", len, strerror(-rc));
		close(fd);
		return rc;
	}
	*fd_p = fd;
	*ino_p = (uint64_t)st.st_ino;
	*addr_p = addr;
	return 0;
}

int tfab__seg_open(pid_t pid, int fd, uint64_t ino, void **addr_p, size_t *len_p)
{
	char path[64];
	struct stat st;
	void *addr;
	int pfd, rc;

	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, fd);
	pfd = open(path, O_RDWR | O_CLOEXEC);
	if (pfd < 0) {
		rc = -errno;
		TFAB_ERROR(SUBSYS, "opening the peer's segment %s: %s", path, strerror(-rc));
		return rc;
	}
	if (fstat(pfd, &st) < 0) {
		rc = -errno;
		close(pfd);
		return rc;
	}
	if ((ino && (uint64_t)st.st_ino != ino) || st.st_size <= 0) {
		TFAB_ERROR(SUBSYS, "%s is not the segment the peer advertised", path);
		close(pfd);
		return -ESTALE;
	}
	addr = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
	rc = addr == MAP_FAILED ? -errno : 0;
	close(pfd);
	if (rc) {
		TFAB_ERROR(SUBSYS, "mapping %s: %s", path, strerror(-rc));
		return rc;
	}
	*addr_p = addr;
	*len_p = (size_t)st.st_size;
	return 0;
}
