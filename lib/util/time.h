/*
 * Monotonic time in nanoseconds and milliseconds; the coarse clock for checks in every poll
 * (a few nanoseconds to read, against about 25 for the precise one on a VM's TSC; it ticks
 * once a jiffy, 1 to 4 ms): compare its values only with each other.
 */
#ifndef TFAB_UTIL_TIME_H
#define TFAB_UTIL_TIME_H

#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

static inline uint64_t tfab__clock_ns(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t tfab__now_ns(void)
{
	return tfab__clock_ns(CLOCK_MONOTONIC);
}

static inline uint64_t tfab__now_ms(void)
{
	return tfab__now_ns() / 1000000ull;
}

static inline uint64_t tfab__coarse_ns(void)
{
	return tfab__clock_ns(CLOCK_MONOTONIC_COARSE);
}

static inline uint64_t tfab__coarse_ms(void)
{
	return tfab__coarse_ns() / 1000000ull;
}

/* Milliseconds left until deadline (tfab__now_ms's clock), as a timeout argument: 0 once past. */
static inline int tfab__ms_until(uint64_t deadline)
{
	uint64_t now = tfab__now_ms();

	if (now >= deadline)
		return 0;
	return deadline - now > INT_MAX ? INT_MAX : (int)(deadline - now);
}

/* A condition variable whose timed waits take CLOCK_MONOTONIC deadlines. */
static inline void tfab__cond_init_monotonic(pthread_cond_t *cond)
{
	pthread_condattr_t attr;

	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(cond, &attr);
	pthread_condattr_destroy(&attr);
}

#endif
