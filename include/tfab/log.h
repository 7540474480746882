/**
 * @file
 * Logging. Messages at or below the current level go to the sink: standard error by default,
 * or a function of the application's. The level starts from TFAB_LOG_LEVEL (error, warn, info,
 * debug, trace, or 0..5) and can be changed at run time. The level is tested before any
 * formatting, so a disabled message costs one comparison. All functions are thread-safe; the
 * sink may be called from any thread that calls into tfab, including the progress thread.
 */
#ifndef TFAB_LOG_H
#define TFAB_LOG_H

#include <tfab/export.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Log levels: a message goes out when its level is at or below the current one. */
enum tfab_log_level {
	TFAB_LOG_NONE = 0,  /**< nothing is logged */
	TFAB_LOG_ERROR = 1, /**< failures */
	TFAB_LOG_WARN = 2,  /**< and warnings */
	TFAB_LOG_INFO = 3,  /**< and information */
	TFAB_LOG_DEBUG = 4, /**< and debugging messages */
	TFAB_LOG_TRACE = 5, /**< and tracing, the most detailed */
};

/** A log sink: level, the subsystem ("ofi", "engine", ...) and the formatted message. */
typedef void (*tfab_log_fn)(void *arg, enum tfab_log_level level, const char *subsys,
			    const char *msg);

/** Replace the sink; NULL restores the default (standard error). */
TFAB_EXPORT void tfab_log_set_sink(tfab_log_fn fn, void *arg);

/** Set the level; returns the previous one. */
TFAB_EXPORT enum tfab_log_level tfab_log_set_level(enum tfab_log_level level);

/** The current level. */
TFAB_EXPORT enum tfab_log_level tfab_log_get_level(void);

/** The name of a level ("warn"), or "?" for an unknown one. */
TFAB_EXPORT const char *tfab_log_level_name(enum tfab_log_level level);

#ifdef __cplusplus
}
#endif

#endif
