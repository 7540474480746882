/* The host identity and process handles for the shm backend (its segments: util/segment.c). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "providers/shm/segment.h"
#include "util/log.h"

#define SUBSYS "shm"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static int ns_inode(const char *path, uint64_t *ino_p)
{
	struct stat st;

	if (stat(path, &st) < 0)
		return -errno;
	*ino_p = (uint64_t)st.st_ino;
	return 0;
}

int tfab_shm_host_self(struct tfab_shm_host *host_p)
{
	struct tfab_shm_host h;
	char text[64] = "";
	FILE *f;
	int rc, k = 0;

	memset(&h, 0, sizeof(h));
	f = fopen("/proc/sys/kernel/random/boot_id", "re");
	if (!f) {
		rc = -errno;
		TFAB_ERROR(SUBSYS, "reading the boot id: %s", strerror(-rc));
		return rc;
	}
	if (!fgets(text, sizeof(text), f))
		text[0] = '\0';
	fclose(f);
	/* "xxxxxxxx-xxxx-...": 32 hex digits with dashes. */
	for (const char *p = text; *p && k < 32; p++) {
		int v = hexval(*p);

		if (v < 0)
			continue;
		h.boot_id[k / 2] |= (uint8_t)(k % 2 ? v : v << 4);
		k++;
	}
	if (k != 32) {
		TFAB_ERROR(SUBSYS, "unreadable boot id '%s'", text);
		return -EINVAL;
	}
	rc = ns_inode("/proc/self/ns/pid", &h.pid_ns);
	if (rc == 0)
		rc = ns_inode("/proc/self/ns/mnt", &h.mnt_ns);
	if (rc) {
		TFAB_ERROR(SUBSYS, "reading the namespaces: %s", strerror(-rc));
		return rc;
	}
	*host_p = h;
	return 0;
}

int tfab_shm_pidfd(pid_t pid)
{
	long fd = syscall(SYS_pidfd_open, pid, 0);

	return fd < 0 ? -errno : (int)fd;
}

bool tfab_shm_process_gone(int pidfd, pid_t pid)
{
	if (pidfd >= 0) {
		struct pollfd p = {.fd = pidfd, .events = POLLIN};

		/* Readable once the process has exited (a zombie included, unlike kill(pid, 0)). */
		return poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR));
	}
	return kill(pid, 0) < 0 && errno == ESRCH;
}
