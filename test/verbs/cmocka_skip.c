/*
 * LD_PRELOAD helper for the VM tests: leaves out the cmocka tests named in TFAB_TEST_SKIP
 * (comma-separated names), and says so, so that a suite runs on a fabric that cannot pass some
 * of its tests. test/verbs/meson.build gives the reason next to each name it lists.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*run_group_fn)(const char *, const struct CMUnitTest *const, const size_t,
			    CMFixtureFunction, CMFixtureFunction);

/* Whether name is one of the comma-separated names in list. */
static int listed(const char *list, const char *name)
{
	size_t n = strlen(name);

	for (const char *p = list; *p;) {
		size_t len = strcspn(p, ",");

		if (len == n && strncmp(p, name, n) == 0)
			return 1;
		p += len;
		if (*p == ',')
			p++;
	}
	return 0;
}

/* A listed name that is no test of this group is an error: the list has gone stale. */
static int check_names(const char *list, const struct CMUnitTest *tests, size_t num_tests)
{
	int bad = 0;

	for (const char *p = list; *p;) {
		size_t len = strcspn(p, ","), i;

		for (i = 0; i < num_tests; i++)
			if (strlen(tests[i].name) == len && strncmp(tests[i].name, p, len) == 0)
				break;
		if (len && i == num_tests) {
			fprintf(stderr, "cmocka_skip: TFAB_TEST_SKIP names no test '%.*s'\n",
				(int)len, p);
			bad = 1;
		}
		p += len;
		if (*p == ',')
			p++;
	}
	return bad;
}

__attribute__((visibility("default"))) int
_cmocka_run_group_tests(const char *group_name, const struct CMUnitTest *const tests,
			const size_t num_tests, CMFixtureFunction group_setup,
			CMFixtureFunction group_teardown)
{
	run_group_fn real;
	const char *skip = getenv("TFAB_TEST_SKIP");
	struct CMUnitTest *kept;
	size_t n = 0;
	int rc;

	*(void **)&real = dlsym(RTLD_NEXT, "_cmocka_run_group_tests");
	if (!real) {
		fprintf(stderr, "cmocka_skip: no _cmocka_run_group_tests to call\n");
		return 1;
	}
	if (!skip || !*skip)
		return real(group_name, tests, num_tests, group_setup, group_teardown);
	if (check_names(skip, tests, num_tests))
		return 1;
	kept = calloc(num_tests ? num_tests : 1, sizeof(*kept));
	if (!kept)
		return 1;
	for (size_t i = 0; i < num_tests; i++) {
		if (listed(skip, tests[i].name))
			printf("[ LEFT OUT] %s (TFAB_TEST_SKIP)\n", tests[i].name);
		else
			kept[n++] = tests[i];
	}
	fflush(stdout);
	rc = real(group_name, kept, n, group_setup, group_teardown);
	free(kept);
	return rc;
}
