/* Logging: the level (from TFAB_LOG_LEVEL), the sink, and formatting. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util/log.h"

/* -1 until the environment has been read. */
atomic_int tfab__log_level_cur = -1;

static pthread_mutex_t sink_lock = PTHREAD_MUTEX_INITIALIZER;
static tfab_log_fn sink_fn;
static void *sink_arg;

static const char *const level_names[] = {"none", "error", "warn", "info", "debug", "trace"};

const char *tfab_log_level_name(enum tfab_log_level level)
{
	if ((unsigned)level >= sizeof(level_names) / sizeof(level_names[0]))
		return "?";
	return level_names[level];
}

int tfab__log_level_parse(const char *text, enum tfab_log_level *level_p)
{
	char *end;
	long v;

	for (unsigned i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++) {
		if (strcasecmp(text, level_names[i]) == 0) {
			*level_p = (enum tfab_log_level)i;
			return 0;
		}
	}
	if (strcasecmp(text, "warning") == 0) {
		*level_p = TFAB_LOG_WARN;
		return 0;
	}
	errno = 0;
	v = strtol(text, &end, 10);
	if (errno || end == text || *end || v < TFAB_LOG_NONE || v > TFAB_LOG_TRACE)
		return -EINVAL;
	*level_p = (enum tfab_log_level)v;
	return 0;
}

static enum tfab_log_level env_level(void)
{
	enum tfab_log_level level = TFAB_LOG_WARN;
	const char *env = getenv("TFAB_LOG_LEVEL");

	if (env && *env && tfab__log_level_parse(env, &level) != 0) {
		static atomic_flag warned = ATOMIC_FLAG_INIT;

		/* Once a process, whoever reads it first: the level itself is set once too. */
		if (!atomic_flag_test_and_set(&warned))
			fprintf(
			    stderr,
			    "tfab warn [log]: TFAB_LOG_LEVEL=%s is not a level (none, error, warn, "
			    "info, debug, trace or 0..5): using warn\n",
			    env);
		level = TFAB_LOG_WARN;
	}
	return level;
}

int tfab__log_level_init(void)
{
	int expected = -1;

	/* Whoever set the level first wins, so a tfab_log_set_level() is never undone. */
	atomic_compare_exchange_strong(&tfab__log_level_cur, &expected, (int)env_level());
	return atomic_load(&tfab__log_level_cur);
}

enum tfab_log_level tfab_log_set_level(enum tfab_log_level level)
{
	int old = atomic_exchange(&tfab__log_level_cur, (int)level);

	/* Not read yet: the previous level is the one the environment would have given. */
	if (old < 0)
		old = (int)env_level();
	return (enum tfab_log_level)old;
}

enum tfab_log_level tfab_log_get_level(void)
{
	int cur = atomic_load(&tfab__log_level_cur);

	return (enum tfab_log_level)(cur < 0 ? tfab__log_level_init() : cur);
}

void tfab_log_set_sink(tfab_log_fn fn, void *arg)
{
	pthread_mutex_lock(&sink_lock);
	sink_fn = fn;
	sink_arg = arg;
	pthread_mutex_unlock(&sink_lock);
}

void tfab__log_emit(enum tfab_log_level level, const char *subsys, const char *fmt, ...)
{
	char msg[1024];
	tfab_log_fn fn;
	void *arg;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);

	pthread_mutex_lock(&sink_lock);
	fn = sink_fn;
	arg = sink_arg;
	pthread_mutex_unlock(&sink_lock);

	if (fn)
		fn(arg, level, subsys, msg);
	else
		fprintf(stderr, "tfab %s [%s]: %s\n", tfab_log_level_name(level), subsys, msg);
}
