/**
 * @file
 * Configuration settings. tfab reads its settings from TFAB_* environment variables, once,
 * when a context is created. This interface lists them with their defaults, help and the value
 * that the environment gives now, for tools such as tfab-info. Thread-safe.
 */
#ifndef TFAB_CONFIG_H
#define TFAB_CONFIG_H

#include <stddef.h>
#include <tfab/export.h>

#ifdef __cplusplus
extern "C" {
#endif

/** One setting, as tfab_setting_get describes it. */
struct tfab_setting_info {
	const char *name;  /**< environment variable, "TFAB_PROVIDER" */
	const char *dflt;  /**< default value as text */
	const char *help;  /**< one sentence */
	const char *value; /**< the value in the environment now, or NULL when unset */
};

/** The number of settings. */
TFAB_EXPORT size_t tfab_setting_count(void);

/** Fill *info_p for setting i (0 <= i < count). Returns 0, or -EINVAL for a bad index. */
TFAB_EXPORT int tfab_setting_get(size_t i, struct tfab_setting_info *info_p);

/**
 * Parse every setting from the environment and report the first that is invalid: returns 0,
 * or -TFAB_ERR_CONFIG with a message in errbuf (when errbuf is not NULL).
 */
TFAB_EXPORT int tfab_settings_check(char *errbuf, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
