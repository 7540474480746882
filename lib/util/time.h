/* Monotonic time in nanoseconds and milliseconds. */
#ifndef TFAB_UTIL_TIME_H
#define TFAB_UTIL_TIME_H

#include <stdint.h>
#include <time.h>

static inline uint64_t tfab__now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t tfab__now_ms(void)
{
	return tfab__now_ns() / 1000000ull;
}

#endif
