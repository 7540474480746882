/* Unpredictable numbers for remote keys (doc/security.md), from the kernel's generator. */
#ifndef TFAB_UTIL_RANDOM_H
#define TFAB_UTIL_RANDOM_H

#include <stdint.h>
#include <sys/random.h>
#include <time.h>

/*
 * 64 random bits. getrandom() does not fail once the kernel's pool is initialised (at boot);
 * should it, the clock's nanoseconds stand in (keys stay unique, if not unpredictable).
 */
static inline uint64_t tfab__random_u64(void)
{
	uint64_t v;
	struct timespec ts;

	if (getrandom(&v, sizeof(v), 0) == (ssize_t)sizeof(v))
		return v;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif
