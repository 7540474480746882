/*
 * Tests of the shared libtfab as an application sees it: the public header alone, the
 * version, and that only tfab_* symbols are exported (internal tfab__* stay hidden).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <tfab/tfab.h>

static void test_version(void **state)
{
	char want[32];

	(void)state;
	snprintf(want, sizeof(want), "%d.%d.%d", TFAB_VERSION_MAJOR, TFAB_VERSION_MINOR,
		 TFAB_VERSION_PATCH);
	assert_non_null(tfab_version());
	assert_string_equal(tfab_version(), want);
}

static void test_strerror(void **state)
{
	(void)state;
	assert_string_equal(tfab_strerror(0), "Success");
	assert_string_equal(tfab_strerror(-TFAB_ERR_CONFIG), "Invalid configuration setting");
	assert_string_equal(tfab_strerror(-ENOMEM), strerror(ENOMEM));
	assert_non_null(tfab_strerror(1 << 20));
}

static void test_settings(void **state)
{
	struct tfab_setting_info info;

	(void)state;
	assert_true(tfab_setting_count() > 0);
	assert_int_equal(tfab_setting_get(0, &info), 0);
	assert_non_null(info.name);
	assert_int_equal(tfab_setting_get(tfab_setting_count(), &info), -EINVAL);
}

/* The calls above must reach the shared library, not a copy linked into the test. */
static void test_from_shared_library(void **state)
{
	void *sym = dlsym(RTLD_DEFAULT, "tfab_strerror");
	Dl_info where;

	(void)state;
	assert_non_null(sym);
	assert_int_not_equal(dladdr(sym, &where), 0);
	assert_non_null(where.dli_fname);
	assert_non_null(strstr(where.dli_fname, "libtfab.so"));
}

static void test_exports(void **state)
{
	static const char *const public[] = {
	    "tfab_strerror",	  "tfab_version",	"tfab_log_set_sink",
	    "tfab_log_set_level", "tfab_log_get_level", "tfab_log_level_name",
	    "tfab_setting_count", "tfab_setting_get",	"tfab_settings_check",
	};
	static const char *const internal[] = {
	    "tfab__config_init",  "tfab__config_set",	 "tfab__config_table",
	    "tfab__log_emit",	  "tfab__log_level_cur", "tfab__log_level_parse",
	    "tfab__sock_connect", "tfab__sock_listen",	 "tfab__sock_recv_msg",
	};

	(void)state;
	for (size_t i = 0; i < sizeof(public) / sizeof(public[0]); i++)
		if (!dlsym(RTLD_DEFAULT, public[i]))
			fail_msg("%s is not exported", public[i]);
	for (size_t i = 0; i < sizeof(internal) / sizeof(internal[0]); i++)
		if (dlsym(RTLD_DEFAULT, internal[i]))
			fail_msg("%s is exported", internal[i]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_version),  cmocka_unit_test(test_strerror),
	    cmocka_unit_test(test_settings), cmocka_unit_test(test_from_shared_library),
	    cmocka_unit_test(test_exports),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
