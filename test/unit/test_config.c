/*
 * Unit tests for the configuration table: defaults, TFAB_* environment overrides, rejection of
 * bad values (reported by name, field left at its default), the public settings API, the
 * warning about TFAB_* variables no setting knows (once a process, with the setting meant), and
 * what an invalid value is said to be.
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

#include <tfab/config.h>
#include <tfab/log.h>
#include <tfab/status.h>

#include "util/config.h"

/* Launchers' variables that the world's settings read where the TFAB_* ones are unset. */
static const char *const launcher_vars[] = {
    "RANK",
    "OMPI_COMM_WORLD_RANK",
    "WORLD_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
};

/* No TFAB_* setting (nor launcher variable) in the environment, before and after every test. */
static int clean_env(void **state)
{
	const struct tfab_config_entry *table;
	size_t n;

	(void)state;
	table = tfab__config_table(&n);
	for (size_t i = 0; i < n; i++)
		unsetenv(table[i].name);
	for (size_t i = 0; i < sizeof(launcher_vars) / sizeof(launcher_vars[0]); i++)
		unsetenv(launcher_vars[i]);
	return 0;
}

/* Warnings logged: how many, and the last. */
static struct {
	int n;
	char last[512];
} warned;

static void count_warnings(void *arg, enum tfab_log_level level, const char *subsys,
			   const char *msg)
{
	(void)arg;
	if (level != TFAB_LOG_WARN || strcmp(subsys, "config") != 0)
		return;
	warned.n++;
	snprintf(warned.last, sizeof(warned.last), "%s", msg);
}

/*
 * First in the run: the process's first read of the settings warns about a misspelt variable,
 * naming the setting meant; later reads say nothing more.
 */
static void test_unknown_warned_once(void **state)
{
	struct tfab_config cfg;

	(void)state;
	tfab_log_set_sink(count_warnings, NULL);
	tfab_log_set_level(TFAB_LOG_WARN);
	setenv("TFAB_OP_TIMOUT_MS", "5", 1);
	assert_int_equal(tfab__config_init(&cfg, NULL, 0), 0);
	assert_int_equal(warned.n, 1);
	assert_string_equal(warned.last, "TFAB_OP_TIMOUT_MS is not a tfab setting: ignored (did "
					 "you mean TFAB_OP_TIMEOUT_MS?)");
	assert_int_equal(cfg.op_timeout_ms, 60000);
	assert_int_equal(tfab__config_init(&cfg, NULL, 0), 0);
	assert_int_equal(tfab_settings_check(NULL, 0), 0);
	assert_int_equal(warned.n, 1);
	unsetenv("TFAB_OP_TIMOUT_MS");
	tfab_log_set_sink(NULL, NULL);
}

/*
 * Which variables are warned about: every TFAB_* one (any case) no setting knows, with the
 * setting it is a slip from where there is one; not the settings, not the variables of the
 * project's tests and tools, not other variables.
 */
static void test_unknown_names(void **state)
{
	static char *const env[] = {
	    "TFAB_PROVIDERS=shm",
	    "tfab_ring_slots=4",
	    "TFAB_TIMEOUT_MS=3",
	    "TFAB_FOO=1",
	    "TFAB_=1",
	    "TFAB_RANK=0",
	    "TFAB_MASTER_ADDR=h",
	    "TFAB_PROVIDER=shm",
	    "TFAB_TEST_STALL_MS=1",
	    "TFAB_TEST_ANYTHING=1",
	    "TFAB_FAULTS_SLACK_MS=1",
	    "TFAB_PY_LOOP=1",
	    "TFAB_VM_EXTRA_ENV=x",
	    "PATH=/bin",
	    "TFABX=1",
	    NULL,
	};
	static const struct {
		char *const env[2];
		const char *said;
	} one[] = {
	    {{"TFAB_PROVIDERS=shm"},
	     "TFAB_PROVIDERS is not a tfab setting: ignored (did you mean "
	     "TFAB_PROVIDER?)"},
	    {{"tfab_ring_slots=4"},
	     "tfab_ring_slots is not a tfab setting: ignored (did you mean "
	     "TFAB_RING_SLOTS?)"},
	    {{"TFAB_TIMEOUT_MS=3"},
	     "TFAB_TIMEOUT_MS is not a tfab setting: ignored (did you mean "
	     "TFAB_OP_TIMEOUT_MS?)"},
	    {{"TFAB_FOO=1"},
	     "TFAB_FOO is not a tfab setting: ignored (tfab-info lists the "
	     "settings)"},
	};

	(void)state;
	tfab_log_set_sink(count_warnings, NULL);
	tfab_log_set_level(TFAB_LOG_WARN);
	warned.n = 0;
	assert_int_equal(tfab__config_warn_unknown(env), 5);
	assert_int_equal(warned.n, 5);
	for (size_t i = 0; i < sizeof(one) / sizeof(one[0]); i++) {
		assert_int_equal(tfab__config_warn_unknown(one[i].env), 1);
		assert_string_equal(warned.last, one[i].said);
	}
	assert_int_equal(tfab__config_warn_unknown(NULL), 0);
	tfab_log_set_sink(NULL, NULL);
}

/* What an invalid value is said to be, for tfab-info; valid ones are not. */
static void test_invalid_values(void **state)
{
	static const struct {
		const char *name, *value, *why;
	} cases[] = {
	    {"TFAB_RING_SLOTS", "abc", "not a valid uint value: Invalid argument"},
	    {"TFAB_RING_SLOTS", "1", "out of range (2..1024)"},
	    {"TFAB_LOG_LEVEL", "loud",
	     "not a level: none, error, warn, info, debug, trace or 0..5"},
	    {"TFAB_VERBS_PORT", "first", "not a valid auto|uint value: Invalid argument"},
	    {"TFAB_PEER_MAX_INFLIGHT", "lots", "not a valid auto|bytes value: Invalid argument"},
	    {"TFAB_OFI_DOMAIN", "0123456789012345678901234567890123456789012345678901234567890123",
	     "longer than 63 bytes"},
	};
	static const char *const valid[][2] = {
	    {"TFAB_RING_SLOTS", "4"},	 {"TFAB_LOG_LEVEL", "debug"},
	    {"TFAB_VERBS_PORT", "auto"}, {"TFAB_PEER_MAX_INFLIGHT", "4G"},
	    {"TFAB_OFI_DOMAIN", "lo"},
	};
	char why[160];

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		why[0] = '\0';
		assert_true(tfab__config_invalid(tfab__config_find(cases[i].name), cases[i].value,
						 why, sizeof(why)));
		assert_string_equal(why, cases[i].why);
	}
	for (size_t i = 0; i < sizeof(valid) / sizeof(valid[0]); i++)
		assert_false(tfab__config_invalid(tfab__config_find(valid[i][0]), valid[i][1], why,
						  sizeof(why)));
}

/* A secret that is refused is named, never shown. */
static void test_secret_never_shown(void **state)
{
	char key[300], err[512];
	struct tfab_config cfg;

	(void)state;
	memset(key, 's', sizeof(key) - 1);
	key[sizeof(key) - 1] = '\0';
	setenv("TFAB_AUTH_KEY", key, 1);
	assert_int_equal(tfab__config_init(&cfg, err, sizeof(err)), -TFAB_ERR_CONFIG);
	assert_string_equal(err, "TFAB_AUTH_KEY=(set) is longer than 255 bytes");
}

static void assert_field_is(const struct tfab_config *cfg, const char *name, const char *want)
{
	const struct tfab_config_entry *e = tfab__config_find(name);
	char buf[128];

	assert_non_null(e);
	tfab__config_format(cfg, e, buf, sizeof(buf));
	assert_string_equal(buf, want);
}

static void test_defaults(void **state)
{
	const struct tfab_config_entry *table;
	struct tfab_config cfg;
	char err[128] = "untouched";
	size_t n;

	(void)state;
	table = tfab__config_table(&n);
	assert_true(n > 0);
	memset(&cfg, 0xa5, sizeof(cfg));
	assert_int_equal(tfab__config_init(&cfg, err, sizeof(err)), 0);
	assert_string_equal(err, "untouched");
	for (size_t i = 0; i < n; i++) {
		char buf[128];

		assert_non_null(table[i].name);
		assert_non_null(table[i].dflt);
		assert_non_null(table[i].help);
		assert_non_null(table[i].parser);
		assert_int_equal(strncmp(table[i].name, "TFAB_", 5), 0);
		tfab__config_format(&cfg, &table[i], buf, sizeof(buf));
		assert_string_equal(buf, table[i].dflt);
	}
	/* The typed fields too, not just their text. */
	assert_string_equal(cfg.provider, "auto");
	assert_int_equal(cfg.log_level, TFAB_LOG_WARN);
	assert_int_equal(cfg.connect_timeout_ms, 10000);
	assert_string_equal(cfg.ofi_domain, "");
	assert_int_equal(cfg.ofi_cq_size, 4096);
	assert_int_equal(cfg.ofi_rx_depth, 512);
	assert_int_equal(cfg.ofi_poll_batch, 32);
}

/* Every default goes through its own parser, one row at a time. */
static void test_defaults_parse_each(void **state)
{
	const struct tfab_config_entry *table;
	size_t n;

	(void)state;
	table = tfab__config_table(&n);
	for (size_t i = 0; i < n; i++) {
		struct tfab_config cfg = {0};
		char err[128] = "";

		assert_int_equal(
		    tfab__config_set(&cfg, table[i].name, table[i].dflt, err, sizeof(err)), 0);
		assert_ptr_equal(tfab__config_find(table[i].name), &table[i]);
	}
}

static void test_names_unique(void **state)
{
	const struct tfab_config_entry *table;
	size_t n;

	(void)state;
	table = tfab__config_table(&n);
	for (size_t i = 0; i < n; i++)
		for (size_t j = i + 1; j < n; j++)
			assert_string_not_equal(table[i].name, table[j].name);
	assert_null(tfab__config_find("TFAB_NO_SUCH_SETTING"));
}

static void test_env_overrides(void **state)
{
	struct tfab_config cfg;
	char err[128] = "";

	(void)state;
	setenv("TFAB_OFI_CQ_SIZE", "8K", 1);
	setenv("TFAB_PROVIDER", "ofi:tcp", 1);
	setenv("TFAB_LOG_LEVEL", "debug", 1);
	setenv("TFAB_CONNECT_TIMEOUT_MS", "250", 1);
	setenv("TFAB_OFI_RX_DEPTH", "0x100", 1);
	setenv("TFAB_OFI_DOMAIN", "lo", 1);
	assert_int_equal(tfab__config_init(&cfg, err, sizeof(err)), 0);
	assert_string_equal(err, "");
	assert_int_equal(cfg.ofi_cq_size, 8192);
	assert_string_equal(cfg.provider, "ofi:tcp");
	assert_int_equal(cfg.log_level, TFAB_LOG_DEBUG);
	assert_int_equal(cfg.connect_timeout_ms, 250);
	assert_int_equal(cfg.ofi_rx_depth, 256);
	assert_string_equal(cfg.ofi_domain, "lo");
	/* Untouched by the environment. */
	assert_int_equal(cfg.ofi_poll_batch, 32);
	assert_field_is(&cfg, "TFAB_OFI_CQ_SIZE", "8192");
	assert_field_is(&cfg, "TFAB_LOG_LEVEL", "debug");
}

/*
 * The world's settings read torchrun's variables, then Open MPI's, where the TFAB_* one is
 * unset; TFAB_* always wins; each records the variable it came from.
 */
static void test_launcher_names(void **state)
{
	struct tfab_config cfg;
	char err[128] = "";

	(void)state;
	assert_int_equal(tfab__config_init(&cfg, err, sizeof(err)), 0);
	assert_string_equal(cfg.rank, "");
	assert_null(cfg.rank_from);
	assert_null(cfg.master_port_from);
	assert_int_equal(cfg.master_port, 29650); /* clear of torchrun's 29500 and 29400 */
	assert_string_equal(cfg.torch_port, "");

	setenv("OMPI_COMM_WORLD_RANK", "3", 1);
	setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
	setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
	setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
	assert_int_equal(tfab__config_init(&cfg, err, sizeof(err)), 0);
	assert_string_equal(cfg.rank, "3");
	assert_string_equal(cfg.rank_from, "OMPI_COMM_WORLD_RANK");
	assert_string_equal(cfg.world_size, "8");
	assert_string_equal(cfg.local_rank, "1");
	assert_string_equal(cfg.local_world_size_from, "OMPI_COMM_WORLD_LOCAL_SIZE");

	setenv("RANK", "5", 1);
	setenv("WORLD_SIZE", "6", 1);
	setenv("LOCAL_RANK", "0", 1);
	setenv("LOCAL_WORLD_SIZE", "4", 1);
	setenv("MASTER_ADDR", "10.0.0.1", 1);
	assert_int_equal(tfab__config_init(&cfg, err, sizeof(err)), 0);
	assert_string_equal(cfg.rank, "5");
	assert_string_equal(cfg.rank_from, "RANK");
	assert_string_equal(cfg.world_size, "6");
	assert_string_equal(cfg.world_size_from, "WORLD_SIZE");
	assert_string_equal(cfg.local_rank, "0");
	assert_string_equal(cfg.local_world_size, "4");
	assert_string_equal(cfg.master_addr, "10.0.0.1");
	assert_string_equal(cfg.master_addr_from, "MASTER_ADDR");

	setenv("TFAB_RANK", "1", 1);
	setenv("TFAB_WORLD_SIZE", "2", 1);
	setenv("TFAB_LOCAL_RANK", "1", 1);
	setenv("TFAB_MASTER_ADDR", "127.0.0.1", 1);
	assert_int_equal(tfab__config_init(&cfg, err, sizeof(err)), 0);
	assert_string_equal(cfg.rank, "1");
	assert_string_equal(cfg.rank_from, "TFAB_RANK");
	assert_string_equal(cfg.world_size, "2");
	assert_string_equal(cfg.local_rank, "1");
	assert_string_equal(cfg.local_rank_from, "TFAB_LOCAL_RANK");
	assert_string_equal(cfg.local_world_size, "4"); /* TFAB_LOCAL_WORLD_SIZE unset */
	assert_string_equal(cfg.master_addr, "127.0.0.1");
	assert_string_equal(cfg.master_addr_from, "TFAB_MASTER_ADDR");

	/* A launcher's value that a setting refuses is named as the launcher's variable. */
	setenv("MASTER_ADDR", "x", 1);
	unsetenv("TFAB_MASTER_ADDR");
	setenv("LOCAL_WORLD_SIZE", "12345678901234567890", 1);
	assert_int_equal(tfab__config_init(&cfg, err, sizeof(err)), -TFAB_ERR_CONFIG);
	assert_non_null(strstr(err, "LOCAL_WORLD_SIZE=12345678901234567890"));
	assert_null(strstr(err, "TFAB_LOCAL_WORLD_SIZE"));
}

/* MASTER_PORT is torch's store's: recorded apart, never the world's port, unless TFAB's given. */
static void test_master_port_is_torchs(void **state)
{
	static const char *const names[] = {"TFAB_MASTER_PORT"};
	static const char *const values[] = {"29777"};
	struct tfab_config cfg;
	char err[128] = "";

	(void)state;
	setenv("MASTER_PORT", "29500", 1);
	assert_int_equal(tfab__config_init(&cfg, err, sizeof(err)), 0);
	assert_int_equal(cfg.master_port, 29650);
	assert_null(cfg.master_port_from);
	assert_string_equal(cfg.torch_port, "29500");
	/* Given to the context: the world's own port, and torch's left alone. */
	assert_int_equal(tfab__config_init_with(&cfg, names, values, 1, err, sizeof(err)), 0);
	assert_int_equal(cfg.master_port, 29777);
	assert_non_null(cfg.master_port_from);
	assert_string_equal(cfg.torch_port, "");
	/* In the environment: the same. */
	setenv("TFAB_MASTER_PORT", "29600", 1);
	assert_int_equal(tfab__config_init(&cfg, err, sizeof(err)), 0);
	assert_int_equal(cfg.master_port, 29600);
	assert_string_equal(cfg.master_port_from, "TFAB_MASTER_PORT");
	assert_string_equal(cfg.torch_port, "");
}

/* Explicit settings win over the environment; unknown names and bad values are refused. */
static void test_init_with(void **state)
{
	static const char *const names[] = {"TFAB_PROVIDER", "TFAB_OFI_CQ_SIZE"};
	static const char *const values[] = {"shm", "2K"};
	static const char *const bad_names[] = {"TFAB_NO_SUCH_SETTING"};
	static const char *const bad_values[] = {"1"};
	static const char *const range_names[] = {"TFAB_PROGRESS_THREAD"};
	static const char *const range_values[] = {"7"};
	struct tfab_config cfg;
	char err[128] = "";

	(void)state;
	setenv("TFAB_PROVIDER", "ofi:tcp", 1);
	setenv("TFAB_OFI_DOMAIN", "lo", 1);
	assert_int_equal(tfab__config_init_with(&cfg, names, values, 2, err, sizeof(err)), 0);
	assert_string_equal(cfg.provider, "shm");
	assert_int_equal(cfg.ofi_cq_size, 2048);
	/* The environment still gives what is not named. */
	assert_string_equal(cfg.ofi_domain, "lo");
	/* None given: the environment's. */
	assert_int_equal(tfab__config_init_with(&cfg, NULL, NULL, 0, err, sizeof(err)), 0);
	assert_string_equal(cfg.provider, "ofi:tcp");
	assert_int_equal(tfab__config_init_with(&cfg, bad_names, bad_values, 1, err, sizeof(err)),
			 -TFAB_ERR_CONFIG);
	assert_non_null(strstr(err, "TFAB_NO_SUCH_SETTING"));
	assert_int_equal(
	    tfab__config_init_with(&cfg, range_names, range_values, 1, err, sizeof(err)),
	    -TFAB_ERR_CONFIG);
	assert_non_null(strstr(err, "TFAB_PROGRESS_THREAD=7"));
	assert_int_equal(tfab__config_init_with(&cfg, names, NULL, 1, err, sizeof(err)),
			 -TFAB_ERR_CONFIG);
	/* The environment was left alone. */
	assert_string_equal(getenv("TFAB_PROVIDER"), "ofi:tcp");
}

static void test_suffixes(void **state)
{
	struct tfab_config cfg = {0};

	(void)state;
	assert_int_equal(tfab__config_set(&cfg, "TFAB_OFI_CQ_SIZE", "1M", NULL, 0), 0);
	assert_int_equal(cfg.ofi_cq_size, 1u << 20);
	assert_int_equal(tfab__config_set(&cfg, "TFAB_OFI_CQ_SIZE", "16k", NULL, 0), 0);
	assert_int_equal(cfg.ofi_cq_size, 16u << 10);
	assert_int_equal(tfab__config_set(&cfg, "TFAB_OFI_CQ_SIZE", "16", NULL, 0), 0);
	assert_int_equal(cfg.ofi_cq_size, 16);
	/* Above the maximum once multiplied. */
	assert_int_equal(tfab__config_set(&cfg, "TFAB_OFI_CQ_SIZE", "2M", NULL, 0),
			 -TFAB_ERR_CONFIG);
	assert_int_equal(tfab__config_set(&cfg, "TFAB_OFI_CQ_SIZE", "1G", NULL, 0),
			 -TFAB_ERR_CONFIG);
	/* Big enough to overflow when multiplied. */
	assert_int_equal(
	    tfab__config_set(&cfg, "TFAB_OFI_CQ_SIZE", "18446744073709551615K", NULL, 0),
	    -TFAB_ERR_CONFIG);
	assert_int_equal(cfg.ofi_cq_size, 16);
}

static void test_env_invalid(void **state)
{
	static const char *const bad[] = {"abc", "-1", "0",   "15",	"99999999999",
					  "",	 "8Q", "8KK", "1048577"};

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct tfab_config cfg;
		char err[256] = "";

		setenv("TFAB_OFI_CQ_SIZE", bad[i], 1);
		/* A good setting beside the bad one still applies. */
		setenv("TFAB_PROVIDER", "ofi:tcp", 1);
		assert_int_equal(tfab__config_init(&cfg, err, sizeof(err)), -TFAB_ERR_CONFIG);
		assert_non_null(strstr(err, "TFAB_OFI_CQ_SIZE"));
		assert_int_equal(cfg.ofi_cq_size, 4096);
		assert_string_equal(cfg.provider, "ofi:tcp");
	}
}

static void test_first_error_reported(void **state)
{
	struct tfab_config cfg;
	char err[256] = "";

	(void)state;
	/* Table order: TFAB_CONNECT_TIMEOUT_MS comes before TFAB_OFI_POLL_BATCH. */
	setenv("TFAB_OFI_POLL_BATCH", "0", 1);
	setenv("TFAB_CONNECT_TIMEOUT_MS", "soon", 1);
	assert_int_equal(tfab__config_init(&cfg, err, sizeof(err)), -TFAB_ERR_CONFIG);
	assert_non_null(strstr(err, "TFAB_CONNECT_TIMEOUT_MS"));
	assert_null(strstr(err, "TFAB_OFI_POLL_BATCH"));
	assert_int_equal(cfg.connect_timeout_ms, 10000);
	assert_int_equal(cfg.ofi_poll_batch, 32);
}

/*
 * A TFAB_LOG_LEVEL that is no level is warn: a warning from the logger (once, where the level
 * is read), not a configuration error besides.
 */
static void test_log_level_invalid_is_warn(void **state)
{
	struct tfab_config cfg = {0};
	char err[128] = "";

	(void)state;
	setenv("TFAB_LOG_LEVEL", "loud", 1);
	assert_int_equal(tfab__config_init(&cfg, err, sizeof(err)), 0);
	assert_int_equal(cfg.log_level, TFAB_LOG_WARN);
	assert_string_equal(err, "");
	assert_int_equal(tfab__config_set(&cfg, "TFAB_LOG_LEVEL", "debug", NULL, 0), 0);
	assert_int_equal(cfg.log_level, TFAB_LOG_DEBUG);
	assert_int_equal(tfab__config_set(&cfg, "TFAB_LOG_LEVEL", "7", err, sizeof(err)), 0);
	assert_int_equal(cfg.log_level, TFAB_LOG_WARN);
}

static void test_errbuf_optional_and_bounded(void **state)
{
	struct tfab_config cfg;
	char err[8];

	(void)state;
	setenv("TFAB_OFI_CQ_SIZE", "abc", 1);
	assert_int_equal(tfab__config_init(&cfg, NULL, 0), -TFAB_ERR_CONFIG);
	assert_int_equal(cfg.ofi_cq_size, 4096);

	memset(err, 'x', sizeof(err));
	assert_int_equal(tfab__config_init(&cfg, err, sizeof(err)), -TFAB_ERR_CONFIG);
	assert_int_equal(strlen(err), sizeof(err) - 1);
	assert_memory_equal(err, "TFAB_OF", sizeof(err));
}

static void test_set_unknown(void **state)
{
	struct tfab_config cfg = {0};
	char err[128] = "";

	(void)state;
	assert_int_equal(tfab__config_set(&cfg, "TFAB_NO_SUCH", "1", err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "TFAB_NO_SUCH"));
	assert_int_equal(tfab__config_set(&cfg, "TFAB_NO_SUCH", "1", NULL, 0), -ENOENT);
}

static void test_set_invalid_keeps_field(void **state)
{
	struct tfab_config cfg = {0};
	char err[128] = "";

	(void)state;
	assert_int_equal(tfab__config_set(&cfg, "TFAB_OFI_RX_DEPTH", "64", NULL, 0), 0);
	assert_int_equal(tfab__config_set(&cfg, "TFAB_OFI_RX_DEPTH", "65537", err, sizeof(err)),
			 -TFAB_ERR_CONFIG);
	assert_non_null(strstr(err, "TFAB_OFI_RX_DEPTH"));
	assert_int_equal(cfg.ofi_rx_depth, 64);
}

static void test_string_too_long(void **state)
{
	struct tfab_config cfg = {0};
	char fits[sizeof(cfg.provider)];
	char too_long[sizeof(cfg.provider) + 1];
	char err[256] = "";

	(void)state;
	memset(fits, 'p', sizeof(fits) - 1);
	fits[sizeof(fits) - 1] = '\0';
	memset(too_long, 'q', sizeof(too_long) - 1);
	too_long[sizeof(too_long) - 1] = '\0';

	assert_int_equal(tfab__config_set(&cfg, "TFAB_PROVIDER", fits, NULL, 0), 0);
	assert_string_equal(cfg.provider, fits);
	assert_int_equal(tfab__config_set(&cfg, "TFAB_PROVIDER", too_long, err, sizeof(err)),
			 -TFAB_ERR_CONFIG);
	assert_non_null(strstr(err, "TFAB_PROVIDER"));
	/* The field keeps its previous value, terminated. */
	assert_string_equal(cfg.provider, fits);

	/* From the environment, the field falls back to its default. */
	setenv("TFAB_OFI_DOMAIN", too_long, 1);
	assert_int_equal(tfab__config_init(&cfg, err, sizeof(err)), -TFAB_ERR_CONFIG);
	assert_non_null(strstr(err, "TFAB_OFI_DOMAIN"));
	assert_string_equal(cfg.ofi_domain, "");
}

/*
 * TFAB_AUTH_KEY shorter than 16 bytes is refused where the settings are read (so tfab-info and
 * tfab_settings_check say so, not only a context), with the setting's name and the minimum,
 * and never the key itself; none ("") and 16 bytes are taken.
 */
static void test_auth_key_short(void **state)
{
	struct tfab_config cfg = {0};
	char err[256] = "";

	(void)state;
	assert_int_equal(tfab__config_set(&cfg, "TFAB_AUTH_KEY", "0123456789abcdef", NULL, 0), 0);
	assert_int_equal(
	    tfab__config_set(&cfg, "TFAB_AUTH_KEY", "sec-ret-15bytes", err, sizeof(err)),
	    -TFAB_ERR_CONFIG);
	assert_non_null(strstr(err, "TFAB_AUTH_KEY holds 15 bytes: a key needs at least 16"));
	assert_null(strstr(err, "sec-ret"));
	assert_string_equal(cfg.auth_key, "0123456789abcdef"); /* kept */
	assert_int_equal(tfab__config_set(&cfg, "TFAB_AUTH_KEY", "", NULL, 0), 0);
	setenv("TFAB_AUTH_KEY", "short", 1);
	err[0] = '\0';
	assert_int_equal(tfab_settings_check(err, sizeof(err)), -TFAB_ERR_CONFIG);
	assert_non_null(strstr(err, "TFAB_AUTH_KEY holds 5 bytes: a key needs at least 16"));
	assert_null(strstr(err, "short"));
}

/* "auto" or a number: auto is stored as -1, numbers keep their bounds. */
static void test_auto_or_number(void **state)
{
	struct tfab_config cfg;
	char err[256] = "";

	(void)state;
	assert_int_equal(tfab__config_init(&cfg, err, sizeof(err)), 0);
	assert_int_equal(cfg.verbs_gid_index, -1);
	assert_int_equal(cfg.verbs_port, -1);
	assert_int_equal(tfab__config_set(&cfg, "TFAB_VERBS_GID_INDEX", "3", NULL, 0), 0);
	assert_int_equal(cfg.verbs_gid_index, 3);
	assert_field_is(&cfg, "TFAB_VERBS_GID_INDEX", "3");
	assert_int_equal(tfab__config_set(&cfg, "TFAB_VERBS_GID_INDEX", "0", NULL, 0), 0);
	assert_int_equal(cfg.verbs_gid_index, 0);
	assert_int_equal(tfab__config_set(&cfg, "TFAB_VERBS_GID_INDEX", "auto", NULL, 0), 0);
	assert_int_equal(cfg.verbs_gid_index, -1);
	assert_field_is(&cfg, "TFAB_VERBS_GID_INDEX", "auto");
	/* Ports count from 1; a refused value leaves the field alone. */
	assert_int_equal(tfab__config_set(&cfg, "TFAB_VERBS_PORT", "2", NULL, 0), 0);
	assert_int_equal(tfab__config_set(&cfg, "TFAB_VERBS_PORT", "0", err, sizeof(err)),
			 -TFAB_ERR_CONFIG);
	assert_non_null(strstr(err, "TFAB_VERBS_PORT=0"));
	assert_int_equal(cfg.verbs_port, 2);
	assert_int_equal(tfab__config_set(&cfg, "TFAB_VERBS_GID_INDEX", "-1", NULL, 0),
			 -TFAB_ERR_CONFIG);
	assert_int_equal(tfab__config_set(&cfg, "TFAB_VERBS_GID_INDEX", "256", NULL, 0),
			 -TFAB_ERR_CONFIG);
	assert_int_equal(tfab__config_set(&cfg, "TFAB_VERBS_GID_INDEX", "Auto", NULL, 0),
			 -TFAB_ERR_CONFIG);
	assert_int_equal(cfg.verbs_gid_index, -1);
	setenv("TFAB_VERBS_GID_INDEX", "1", 1);
	assert_int_equal(tfab__config_init(&cfg, err, sizeof(err)), 0);
	assert_int_equal(cfg.verbs_gid_index, 1);
}

static void test_public_settings(void **state)
{
	const struct tfab_config_entry *table;
	struct tfab_setting_info info;
	size_t n, count = tfab_setting_count();

	(void)state;
	table = tfab__config_table(&n);
	assert_int_equal(count, n);
	for (size_t i = 0; i < count; i++) {
		memset(&info, 0, sizeof(info));
		assert_int_equal(tfab_setting_get(i, &info), 0);
		assert_string_equal(info.name, table[i].name);
		assert_string_equal(info.dflt, table[i].dflt);
		assert_non_null(info.help);
		assert_true(strlen(info.help) > 0);
		assert_null(info.value);
	}

	/* A bad index leaves the output alone. */
	info.name = "sentinel";
	assert_int_equal(tfab_setting_get(count, &info), -EINVAL);
	assert_int_equal(tfab_setting_get(SIZE_MAX, &info), -EINVAL);
	assert_string_equal(info.name, "sentinel");
}

static void test_public_value_reflects_env(void **state)
{
	struct tfab_setting_info info;
	size_t i, count = tfab_setting_count();

	(void)state;
	for (i = 0; i < count; i++) {
		assert_int_equal(tfab_setting_get(i, &info), 0);
		if (strcmp(info.name, "TFAB_OFI_CQ_SIZE") == 0)
			break;
	}
	assert_true(i < count);
	assert_null(info.value);
	setenv("TFAB_OFI_CQ_SIZE", "8K", 1);
	assert_int_equal(tfab_setting_get(i, &info), 0);
	assert_non_null(info.value);
	assert_string_equal(info.value, "8K");
	unsetenv("TFAB_OFI_CQ_SIZE");
	assert_int_equal(tfab_setting_get(i, &info), 0);
	assert_null(info.value);
}

static void test_settings_check(void **state)
{
	char err[256] = "untouched";

	(void)state;
	assert_int_equal(tfab_settings_check(err, sizeof(err)), 0);
	assert_string_equal(err, "untouched");
	assert_int_equal(tfab_settings_check(NULL, 0), 0);

	setenv("TFAB_CONNECT_TIMEOUT_MS", "soon", 1);
	assert_int_equal(tfab_settings_check(err, sizeof(err)), -TFAB_ERR_CONFIG);
	assert_non_null(strstr(err, "TFAB_CONNECT_TIMEOUT_MS"));
	assert_int_equal(tfab_settings_check(NULL, 0), -TFAB_ERR_CONFIG);

	setenv("TFAB_CONNECT_TIMEOUT_MS", "500", 1);
	assert_int_equal(tfab_settings_check(err, sizeof(err)), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    /* first: the process's first read of the settings */
	    cmocka_unit_test_setup_teardown(test_unknown_warned_once, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_unknown_names, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_invalid_values, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_secret_never_shown, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_defaults, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_defaults_parse_each, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_names_unique, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_env_overrides, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_init_with, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_launcher_names, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_master_port_is_torchs, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_suffixes, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_env_invalid, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_first_error_reported, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_log_level_invalid_is_warn, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_errbuf_optional_and_bounded, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_set_unknown, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_set_invalid_keeps_field, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_string_too_long, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_auth_key_short, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_auto_or_number, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_public_settings, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_public_value_reflects_env, clean_env, clean_env),
	    cmocka_unit_test_setup_teardown(test_settings_check, clean_env, clean_env),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
