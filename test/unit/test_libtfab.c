/*
 * Tests of the shared libtfab as an application sees it: the public header alone, the
 * version, that only tfab_* symbols are exported (internal tfab__* stay hidden), and that
 * CPU-only use never loads CUDA.
 *
 * With --cpu-only (a separate test: it needs a fabric, and exits 77 without one), tensors go
 * between two contexts of this process, and CUDA must stay unloaded until a CUDA tensor comes.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
	    "tfab_strerror",	   "tfab_version",
	    "tfab_log_set_sink",   "tfab_log_set_level",
	    "tfab_log_get_level",  "tfab_log_level_name",
	    "tfab_setting_count",  "tfab_setting_get",
	    "tfab_settings_check", "tfab_context_create_with",
	    "tfab_dtype_name",	   "tfab_reduce",
	    "tfab_gather",	   "tfab_scatter",
	    "tfab_alltoallv",
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

/* A context with explicit settings: they win over the environment, which stays as it was. */
static void test_context_create_with(void **state)
{
	static const char *const names[] = {"TFAB_PROVIDER", "TFAB_HEARTBEAT_MS"};
	static const char *const values[] = {"shm", "0"};
	static const char *const bad[] = {"TFAB_NOT_A_SETTING"};
	struct tfab_context *ctx = NULL;
	const char *paths[4];

	(void)state;
	setenv("TFAB_PROVIDER", "no-such-path", 1);
	assert_int_equal(tfab_context_create_with(&ctx, names, values, 2), 0);
	assert_int_equal(tfab_context_paths(ctx, paths, 4), 1);
	assert_string_equal(paths[0], "shm");
	assert_int_equal(tfab_context_destroy(ctx), 0);
	ctx = NULL;
	assert_int_equal(tfab_context_create_with(&ctx, bad, values, 1), -TFAB_ERR_CONFIG);
	assert_null(ctx);
	assert_string_equal(getenv("TFAB_PROVIDER"), "no-such-path");
	unsetenv("TFAB_PROVIDER");
}

static int find_cuda(struct dl_phdr_info *info, size_t size, void *arg)
{
	const char *base = strrchr(info->dlpi_name, '/');

	(void)size;
	base = base ? base + 1 : info->dlpi_name;
	if (strncmp(base, "libcudart.", 10) != 0 && strncmp(base, "libcuda.", 8) != 0)
		return 0;
	snprintf(arg, 256, "%s", info->dlpi_name);
	return 1;
}

/* The CUDA runtime or driver library mapped into this process, or NULL. */
static const char *cuda_loaded(void)
{
	static char name[256];

	return dl_iterate_phdr(find_cuda, name) ? name : NULL;
}

/* CPU-only users never load CUDA: loading libtfab must not bring the CUDA runtime. */
static void test_no_cuda_at_load(void **state)
{
	const char *name = cuda_loaded();

	(void)state;
	if (name)
		fail_msg("%s is loaded with libtfab", name);
}

static bool no_cuda(void)
{
	const char *name = cuda_loaded();

	if (name)
		fprintf(stderr, "%s is loaded\n", name);
	return !name;
}

#define CHECK(cond)                                                                \
	do {                                                                       \
		if (!(cond)) {                                                     \
			fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #cond); \
			goto out;                                                  \
		}                                                                  \
	} while (0)

struct flag {
	int done, status;
	DLManagedTensor *m;
};

static void on_sent(void *arg, int status)
{
	struct flag *f = arg;

	f->status = status;
	f->done = 1;
}

static void on_recv(void *arg, int status, DLManagedTensor *m, bool is_dead)
{
	struct flag *f = arg;

	(void)is_dead;
	f->status = status;
	f->m = m;
	f->done = 1;
}

/* Drive both contexts until both flags are up, at most 20 s. */
static bool wait_both(struct tfab_context *a, struct tfab_context *b, const struct flag *fa,
		      const struct flag *fb)
{
	struct timespec start, now;

	clock_gettime(CLOCK_MONOTONIC, &start);
	while (!fa->done || !fb->done) {
		if (tfab_progress(a) < 0 || tfab_progress(b) < 0)
			return false;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec - start.tv_sec > 20)
			return false;
	}
	return true;
}

/* The last error the library logged: why a CUDA tensor was refused. */
static char last_error[512];

static void log_sink(void *arg, enum tfab_log_level level, const char *subsys, const char *msg)
{
	(void)arg;
	if (level == TFAB_LOG_ERROR)
		snprintf(last_error, sizeof(last_error), "%s", msg);
	fprintf(stderr, "tfab %s [%s] %s\n", tfab_log_level_name(level), subsys, msg);
}

/* Connect a peer of a and one of b through their blobs. */
static int pair(struct tfab_context *a, struct tfab_context *b, struct tfab_peer **pa_p,
		struct tfab_peer **pb_p)
{
	unsigned char blob_a[1024], blob_b[1024];
	size_t la = sizeof(blob_a), lb = sizeof(blob_b);
	int rc;

	rc = tfab_peer_create(a, pa_p);
	if (rc == 0)
		rc = tfab_peer_create(b, pb_p);
	if (rc == 0)
		rc = tfab_peer_blob(*pa_p, blob_a, &la);
	if (rc == 0)
		rc = tfab_peer_blob(*pb_p, blob_b, &lb);
	if (rc == 0)
		rc = tfab_peer_connect(*pa_p, blob_b, lb);
	if (rc == 0)
		rc = tfab_peer_connect(*pb_p, blob_a, la);
	return rc;
}

/*
 * CPU tensors from a to b, into a destination of the library's and into one of ours; then a
 * CUDA tensor under TFAB_CUDA_EMULATE=1, which loads nothing either; and last a real CUDA
 * tensor, which loads the runtime or is refused with the reason why.
 */
static int cpu_only(void)
{
	struct tfab_context *a = NULL, *b = NULL, *emu = NULL;
	struct tfab_peer *pa = NULL, *pb = NULL;
	float src[256], dst[256] = {0};
	int64_t shape = 256;
	DLTensor t = {.data = src,
		      .device = {kDLCPU, 0},
		      .ndim = 1,
		      .dtype = {kDLFloat, 32, 1},
		      .shape = &shape};
	DLTensor d = t;
	struct flag fs = {0}, fr = {0};
	const char *name;
	int rc, ret = 1;

	tfab_log_set_sink(log_sink, NULL);
	CHECK(no_cuda());
	rc = tfab_context_create(&a);
	if (rc == -TFAB_ERR_NO_FABRIC) {
		printf("SKIP: no fabric for this test (%s)\n", tfab_strerror(rc));
		return 77;
	}
	CHECK(rc == 0);
	CHECK(tfab_context_create(&b) == 0);
	CHECK(pair(a, b, &pa, &pb) == 0);
	for (int i = 0; i < 256; i++)
		src[i] = (float)i / 4;

	CHECK(tfab_send(a, "cpu", 1, &t, false, on_sent, &fs) == 0);
	CHECK(tfab_recv(b, pb, "cpu", 1, NULL, on_recv, &fr) == 0);
	CHECK(wait_both(a, b, &fs, &fr));
	CHECK(fs.status == 0 && fr.status == 0 && fr.m);
	CHECK(memcmp(fr.m->dl_tensor.data, src, sizeof(src)) == 0);
	fr.m->deleter(fr.m);
	fs = (struct flag){0}, fr = (struct flag){0};
	d.data = dst;
	CHECK(tfab_send(a, "cpu", 2, &t, false, on_sent, &fs) == 0);
	CHECK(tfab_recv(b, pb, "cpu", 2, &d, on_recv, &fr) == 0);
	CHECK(wait_both(a, b, &fs, &fr));
	CHECK(fs.status == 0 && fr.status == 0 && memcmp(dst, src, sizeof(src)) == 0);
	CHECK(fr.m && fr.m->dl_tensor.data == dst); /* a view of the caller's tensor */
	fr.m->deleter(fr.m);
	CHECK(no_cuda());

	/* Emulation takes the "device" memory as host memory: no runtime to load. */
	setenv("TFAB_CUDA_EMULATE", "1", 1);
	rc = tfab_context_create(&emu);
	unsetenv("TFAB_CUDA_EMULATE");
	CHECK(rc == 0);
	t.device.device_type = kDLCUDA;
	fs = (struct flag){0};
	CHECK(tfab_send(emu, "emulated", 3, &t, false, on_sent, &fs) == 0);
	CHECK(tfab_context_destroy(emu) == 0);
	emu = NULL;
	CHECK(fs.done && fs.status == -TFAB_ERR_ABORTED);
	CHECK(no_cuda());

	/* A CUDA tensor for real: now the runtime is loaded, or the refusal says why not. */
	d.device.device_type = kDLCUDA;
	last_error[0] = '\0';
	fr = (struct flag){0};
	rc = tfab_recv(b, pb, "gpu", 4, &d, on_recv, &fr);
	name = cuda_loaded();
	printf("a receive into a CUDA tensor: %s; %s%s\n", tfab_strerror(rc),
	       name ? "loaded " : "nothing loaded: ", name ? name : last_error);
	CHECK(rc == 0 || rc == -EOPNOTSUPP);
	CHECK(rc == 0 || *last_error);
	CHECK(name || strstr(last_error, "could not be loaded") ||
	      strstr(last_error, "built without CUDA"));
	ret = 0;
out:
	tfab_peer_destroy(pa);
	tfab_peer_destroy(pb);
	tfab_context_destroy(emu);
	tfab_context_destroy(b);
	tfab_context_destroy(a);
	return ret;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_version),	    cmocka_unit_test(test_strerror),
	    cmocka_unit_test(test_settings),	    cmocka_unit_test(test_from_shared_library),
	    cmocka_unit_test(test_exports),	    cmocka_unit_test(test_context_create_with),
	    cmocka_unit_test(test_no_cuda_at_load),
	};

	if (argc == 2 && strcmp(argv[1], "--cpu-only") == 0)
		return cpu_only();

	return cmocka_run_group_tests(tests, NULL, NULL);
}
