/*
 * libfabric's shm leaves a killed process's region in /dev/shm, named after its pid; a later
 * process given the same pid then cannot open shm (EBUSY). Tests that kill a child call this.
 */
#ifndef TFAB_TEST_SHM_CLEANUP_H
#define TFAB_TEST_SHM_CLEANUP_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

/* Removes the process's regions; returns how many there were. */
static inline int remove_shm_of(pid_t pid)
{
	char prefix[32], path[300];
	struct dirent *e;
	DIR *d = opendir("/dev/shm");
	int n = 0;

	if (!d)
		return 0;
	snprintf(prefix, sizeof(prefix), "%d:", (int)pid);
	while ((e = readdir(d)) != NULL) {
		if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
			snprintf(path, sizeof(path), "/dev/shm/%s", e->d_name);
			n += unlink(path) == 0;
		}
	}
	closedir(d);
	return n;
}

#endif
