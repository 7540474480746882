/* Unit tests for tfab_strerror(): success, tfab's own codes, errno values, unknown codes. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <string.h>

#include <tfab/status.h>

static void test_success(void **state)
{
	(void)state;
	assert_string_equal(tfab_strerror(0), "Success");
	assert_string_equal(tfab_strerror(TFAB_OK), "Success");
}

/* A new code added to the enum without a text would leave a NULL hole in the table. */
static void test_own_codes_named(void **state)
{
	(void)state;
	for (int c = TFAB_ERR_FIRST; c < TFAB_ERR_LAST; c++) {
		const char *neg = tfab_strerror(-c);
		const char *pos = tfab_strerror(c);

		assert_non_null(neg);
		assert_non_null(pos);
		assert_true(strlen(neg) > 0);
		assert_string_equal(neg, pos);
		/* Not the fallbacks: every own code has its own text. */
		assert_string_not_equal(neg, "Unknown status");
		assert_string_not_equal(neg, "Success");
	}
}

static void test_own_codes_distinct(void **state)
{
	(void)state;
	for (int a = TFAB_ERR_FIRST; a < TFAB_ERR_LAST; a++)
		for (int b = a + 1; b < TFAB_ERR_LAST; b++)
			assert_string_not_equal(tfab_strerror(-a), tfab_strerror(-b));
}

static void test_own_codes_not_errno(void **state)
{
	(void)state;
	/* Own codes must not be mistaken for errno values (glibc says "Unknown error 256"). */
	assert_string_equal(tfab_strerror(-TFAB_ERR_CONFIG), "Invalid configuration setting");
	assert_null(strstr(tfab_strerror(-TFAB_ERR_FIRST), "Unknown error"));
}

static void test_errno(void **state)
{
	static const int codes[] = {ENOMEM, EINVAL, EAGAIN, ETIMEDOUT, ECONNRESET, EMSGSIZE};

	(void)state;
	for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
		char want[256];

		/* strerror's buffer may be shared: copy before the next call. */
		strncpy(want, strerror(codes[i]), sizeof(want) - 1);
		want[sizeof(want) - 1] = '\0';
		assert_string_equal(tfab_strerror(-codes[i]), want);
		assert_string_equal(tfab_strerror(codes[i]), want);
	}
}

static void test_unknown(void **state)
{
	static const int codes[] = {TFAB_ERR_LAST, TFAB_ERR_LAST + 1, 100000, INT_MAX,
				    -100000,	   -INT_MAX,	      INT_MIN};

	(void)state;
	for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
		const char *s = tfab_strerror(codes[i]);

		assert_non_null(s);
		assert_true(strlen(s) > 0);
	}
	/* An errno that glibc does not know still gets a text. */
	assert_non_null(tfab_strerror(-200));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_success),
	    cmocka_unit_test(test_own_codes_named),
	    cmocka_unit_test(test_own_codes_distinct),
	    cmocka_unit_test(test_own_codes_not_errno),
	    cmocka_unit_test(test_errno),
	    cmocka_unit_test(test_unknown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
