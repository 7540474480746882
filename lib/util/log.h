/* Internal logging macros; the level is tested before any formatting. */
#ifndef TFAB_UTIL_LOG_H
#define TFAB_UTIL_LOG_H

#include <stdatomic.h>

#include <tfab/log.h>

extern atomic_int tfab__log_level_cur;

int tfab__log_level_init(void);
void tfab__log_emit(enum tfab_log_level level, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Parse "warn" or "2" into a level; returns 0 or -EINVAL. */
int tfab__log_level_parse(const char *text, enum tfab_log_level *level_p);

static inline int tfab__log_enabled(enum tfab_log_level level)
{
	int cur = atomic_load_explicit(&tfab__log_level_cur, memory_order_relaxed);

	if (cur < 0)
		cur = tfab__log_level_init();
	return (int)level <= cur;
}

#define tfab__log(level, subsys, ...)                               \
	do {                                                        \
		if (tfab__log_enabled(level))                       \
			tfab__log_emit(level, subsys, __VA_ARGS__); \
	} while (0)

#define TFAB_ERROR(subsys, ...) tfab__log(TFAB_LOG_ERROR, subsys, __VA_ARGS__)
#define TFAB_WARN(subsys, ...) tfab__log(TFAB_LOG_WARN, subsys, __VA_ARGS__)
#define TFAB_INFO(subsys, ...) tfab__log(TFAB_LOG_INFO, subsys, __VA_ARGS__)
#define TFAB_DEBUG(subsys, ...) tfab__log(TFAB_LOG_DEBUG, subsys, __VA_ARGS__)
#define TFAB_TRACE(subsys, ...) tfab__log(TFAB_LOG_TRACE, subsys, __VA_ARGS__)

#endif
