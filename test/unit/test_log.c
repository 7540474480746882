/*
 * Unit tests for logging: level parsing and names, the level read from TFAB_LOG_LEVEL, the
 * pluggable sink, and that a disabled message neither formats nor evaluates its arguments.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tfab/log.h>

#include "util/log.h"

struct capture {
	int calls;
	enum tfab_log_level level;
	char subsys[32];
	char msg[256];
	size_t msg_len; /* of the whole message, msg may hold less */
};

static void capture_sink(void *arg, enum tfab_log_level level, const char *subsys, const char *msg)
{
	struct capture *c = arg;

	c->calls++;
	c->level = level;
	snprintf(c->subsys, sizeof(c->subsys), "%s", subsys);
	snprintf(c->msg, sizeof(c->msg), "%s", msg);
	c->msg_len = strlen(msg);
}

static int side_effects;

static int bump(void)
{
	return ++side_effects;
}

/* Each test starts from a known level, the default sink and no TFAB_LOG_LEVEL. */
static int reset(void **state)
{
	(void)state;
	unsetenv("TFAB_LOG_LEVEL");
	tfab_log_set_sink(NULL, NULL);
	tfab_log_set_level(TFAB_LOG_WARN);
	side_effects = 0;
	return 0;
}

static void test_parse_names(void **state)
{
	static const struct {
		const char *text;
		enum tfab_log_level level;
	} ok[] = {
	    {"none", TFAB_LOG_NONE},	{"error", TFAB_LOG_ERROR}, {"warn", TFAB_LOG_WARN},
	    {"info", TFAB_LOG_INFO},	{"debug", TFAB_LOG_DEBUG}, {"trace", TFAB_LOG_TRACE},
	    {"warning", TFAB_LOG_WARN}, {"DEBUG", TFAB_LOG_DEBUG}, {"Warning", TFAB_LOG_WARN},
	    {"0", TFAB_LOG_NONE},	{"1", TFAB_LOG_ERROR},	   {"2", TFAB_LOG_WARN},
	    {"3", TFAB_LOG_INFO},	{"4", TFAB_LOG_DEBUG},	   {"5", TFAB_LOG_TRACE},
	};

	(void)state;
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		/* A value parse never produces, so a silent no-op cannot pass. */
		enum tfab_log_level level = (enum tfab_log_level)99;

		assert_int_equal(tfab__log_level_parse(ok[i].text, &level), 0);
		assert_int_equal(level, ok[i].level);
	}
}

static void test_parse_rejects(void **state)
{
	static const char *const bad[] = {"7", "6",  "-1",    "abc",
					  "",  "3x", "warnx", "99999999999999999999"};

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		enum tfab_log_level level = TFAB_LOG_INFO;

		assert_int_equal(tfab__log_level_parse(bad[i], &level), -EINVAL);
		/* Outputs are written only on success. */
		assert_int_equal(level, TFAB_LOG_INFO);
	}
}

static void test_level_names(void **state)
{
	(void)state;
	assert_string_equal(tfab_log_level_name(TFAB_LOG_NONE), "none");
	assert_string_equal(tfab_log_level_name(TFAB_LOG_ERROR), "error");
	assert_string_equal(tfab_log_level_name(TFAB_LOG_WARN), "warn");
	assert_string_equal(tfab_log_level_name(TFAB_LOG_INFO), "info");
	assert_string_equal(tfab_log_level_name(TFAB_LOG_DEBUG), "debug");
	assert_string_equal(tfab_log_level_name(TFAB_LOG_TRACE), "trace");
	assert_string_equal(tfab_log_level_name((enum tfab_log_level)6), "?");
	assert_string_equal(tfab_log_level_name((enum tfab_log_level) - 1), "?");
}

static void test_set_level_returns_previous(void **state)
{
	(void)state;
	assert_int_equal(tfab_log_set_level(TFAB_LOG_DEBUG), TFAB_LOG_WARN);
	assert_int_equal(tfab_log_get_level(), TFAB_LOG_DEBUG);
	assert_int_equal(tfab_log_set_level(TFAB_LOG_ERROR), TFAB_LOG_DEBUG);
	assert_int_equal(tfab_log_set_level(TFAB_LOG_TRACE), TFAB_LOG_ERROR);
	assert_int_equal(tfab_log_get_level(), TFAB_LOG_TRACE);
}

static void test_sink_receives_message(void **state)
{
	struct capture c = {0};

	(void)state;
	tfab_log_set_level(TFAB_LOG_INFO);
	tfab_log_set_sink(capture_sink, &c);
	TFAB_INFO("engine", "x=%d s=%s", 42, "hi");
	assert_int_equal(c.calls, 1);
	assert_int_equal(c.level, TFAB_LOG_INFO);
	assert_string_equal(c.subsys, "engine");
	assert_string_equal(c.msg, "x=42 s=hi");

	TFAB_ERROR("ofi", "code %u", 7u);
	assert_int_equal(c.calls, 2);
	assert_int_equal(c.level, TFAB_LOG_ERROR);
	assert_string_equal(c.subsys, "ofi");
	assert_string_equal(c.msg, "code 7");
}

static void test_disabled_not_evaluated(void **state)
{
	struct capture c = {0};

	(void)state;
	tfab_log_set_sink(capture_sink, &c);
	tfab_log_set_level(TFAB_LOG_ERROR);
	TFAB_WARN("t", "%d", bump());
	TFAB_INFO("t", "%d", bump());
	TFAB_DEBUG("t", "%d", bump());
	TFAB_TRACE("t", "%d", bump());
	assert_int_equal(side_effects, 0);
	assert_int_equal(c.calls, 0);

	tfab_log_set_level(TFAB_LOG_NONE);
	TFAB_ERROR("t", "%d", bump());
	assert_int_equal(side_effects, 0);
	assert_int_equal(c.calls, 0);

	/* The same statement at an enabled level does run: the check above can fail. */
	tfab_log_set_level(TFAB_LOG_DEBUG);
	TFAB_DEBUG("t", "%d", bump());
	assert_int_equal(side_effects, 1);
	assert_int_equal(c.calls, 1);
	assert_string_equal(c.msg, "1");
	TFAB_TRACE("t", "%d", bump());
	assert_int_equal(side_effects, 1);
	assert_int_equal(c.calls, 1);
}

static void test_env_read_on_first_use(void **state)
{
	(void)state;
	atomic_store(&tfab__log_level_cur, -1);
	setenv("TFAB_LOG_LEVEL", "debug", 1);
	assert_int_equal(tfab_log_get_level(), TFAB_LOG_DEBUG);
	/* Read once: a later change of the environment is not seen. */
	setenv("TFAB_LOG_LEVEL", "error", 1);
	assert_int_equal(tfab_log_get_level(), TFAB_LOG_DEBUG);

	atomic_store(&tfab__log_level_cur, -1);
	setenv("TFAB_LOG_LEVEL", "5", 1);
	assert_int_equal(tfab_log_get_level(), TFAB_LOG_TRACE);

	/* The macros' own check reads the environment too. */
	atomic_store(&tfab__log_level_cur, -1);
	setenv("TFAB_LOG_LEVEL", "info", 1);
	assert_true(tfab__log_enabled(TFAB_LOG_INFO));
	assert_false(tfab__log_enabled(TFAB_LOG_DEBUG));
}

static void test_env_unset_or_bad_gives_warn(void **state)
{
	(void)state;
	atomic_store(&tfab__log_level_cur, -1);
	unsetenv("TFAB_LOG_LEVEL");
	assert_int_equal(tfab_log_get_level(), TFAB_LOG_WARN);

	atomic_store(&tfab__log_level_cur, -1);
	setenv("TFAB_LOG_LEVEL", "", 1);
	assert_int_equal(tfab_log_get_level(), TFAB_LOG_WARN);

	atomic_store(&tfab__log_level_cur, -1);
	setenv("TFAB_LOG_LEVEL", "7", 1);
	assert_int_equal(tfab_log_get_level(), TFAB_LOG_WARN);
}

static void test_set_level_before_env(void **state)
{
	(void)state;
	/* A level set before the first use is not undone by the environment. */
	atomic_store(&tfab__log_level_cur, -1);
	setenv("TFAB_LOG_LEVEL", "trace", 1);
	tfab_log_set_level(TFAB_LOG_ERROR);
	assert_int_equal(tfab_log_get_level(), TFAB_LOG_ERROR);

	/* Before the first use, "previous" is what the environment gives, not a fixed warn. */
	atomic_store(&tfab__log_level_cur, -1);
	setenv("TFAB_LOG_LEVEL", "debug", 1);
	assert_int_equal(tfab_log_set_level(TFAB_LOG_ERROR), TFAB_LOG_DEBUG);
}

/* Run one message through the default sink with stderr sent to a file; returns its text. */
static void emit_to_stderr(char *out, size_t len)
{
	FILE *tmp = tmpfile();
	int saved;
	size_t n;

	assert_non_null(tmp);
	fflush(stderr);
	saved = dup(STDERR_FILENO);
	assert_true(saved >= 0);
	assert_int_equal(dup2(fileno(tmp), STDERR_FILENO), STDERR_FILENO);
	TFAB_ERROR("sub", "hello %d", 5);
	fflush(stderr);
	assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
	close(saved);

	rewind(tmp);
	n = fread(out, 1, len - 1, tmp);
	out[n] = '\0';
	fclose(tmp);
}

static void test_null_sink_restores_default(void **state)
{
	struct capture c = {0};
	char text[256];

	(void)state;
	tfab_log_set_level(TFAB_LOG_WARN);
	tfab_log_set_sink(capture_sink, &c);
	emit_to_stderr(text, sizeof(text));
	assert_int_equal(c.calls, 1);
	assert_string_equal(text, "");

	tfab_log_set_sink(NULL, NULL);
	emit_to_stderr(text, sizeof(text));
	assert_int_equal(c.calls, 1);
	assert_string_equal(text, "tfab error [sub]: hello 5\n");
}

static void test_long_message_truncated(void **state)
{
	struct capture c = {0};
	char big[4096];

	(void)state;
	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	tfab_log_set_sink(capture_sink, &c);
	/* Longer than the emitter's buffer: cut, terminated, still delivered. */
	TFAB_ERROR("t", "%s", big);
	assert_int_equal(c.calls, 1);
	assert_true(c.msg_len >= sizeof(c.msg) - 1);
	assert_true(c.msg_len < sizeof(big) - 1);
	assert_int_equal(strspn(c.msg, "a"), sizeof(c.msg) - 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_parse_names, reset, reset),
	    cmocka_unit_test_setup_teardown(test_parse_rejects, reset, reset),
	    cmocka_unit_test_setup_teardown(test_level_names, reset, reset),
	    cmocka_unit_test_setup_teardown(test_set_level_returns_previous, reset, reset),
	    cmocka_unit_test_setup_teardown(test_sink_receives_message, reset, reset),
	    cmocka_unit_test_setup_teardown(test_disabled_not_evaluated, reset, reset),
	    cmocka_unit_test_setup_teardown(test_env_read_on_first_use, reset, reset),
	    cmocka_unit_test_setup_teardown(test_env_unset_or_bad_gives_warn, reset, reset),
	    cmocka_unit_test_setup_teardown(test_set_level_before_env, reset, reset),
	    cmocka_unit_test_setup_teardown(test_null_sink_restores_default, reset, reset),
	    cmocka_unit_test_setup_teardown(test_long_message_truncated, reset, reset),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
