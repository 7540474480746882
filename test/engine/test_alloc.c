/*
 * test_alloc: a small fetch, once warm, takes nothing from the heap. Two contexts of this
 * process (TFAB_PROVIDER from the environment: native shm in the suite), a peer of each
 * connected to the other through their blobs; 8-byte tensors sent by one and received by the
 * other, with the receive posted before the send and after it, into a library tensor and into
 * the caller's; after a warm-up, every malloc, calloc, realloc and aligned allocation of the
 * process is counted while more fetches run, and must be none. This program's own allocator
 * (below) counts them: it hands each call on to glibc's. Under AddressSanitizer or
 * ThreadSanitizer, whose allocators this one would stand in front of, it skips.
 */
#include <dlfcn.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <tfab/tfab.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif

/* Allocations counted while counting is on; the first one's caller. */
static atomic_bool counting;
static atomic_long allocations;
static void *first_caller;

#ifndef SANITIZED
/* glibc's own entry points, which its malloc and friends are. */
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t align, size_t n);
extern void __libc_free(void *p);

/* The build hides symbols by default: these must be seen by the library to stand in. */
#define INTERPOSE __attribute__((visibility("default")))

static void count(void *caller)
{
	if (!atomic_load_explicit(&counting, memory_order_relaxed))
		return;
	if (atomic_fetch_add(&allocations, 1) == 0)
		first_caller = caller;
}

INTERPOSE void *malloc(size_t n)
{
	count(__builtin_return_address(0));
	return __libc_malloc(n);
}

INTERPOSE void *calloc(size_t n, size_t size)
{
	count(__builtin_return_address(0));
	return __libc_calloc(n, size);
}

INTERPOSE void *realloc(void *p, size_t n)
{
	count(__builtin_return_address(0));
	return __libc_realloc(p, n);
}

INTERPOSE int posix_memalign(void **p, size_t align, size_t n)
{
	count(__builtin_return_address(0));
	*p = __libc_memalign(align, n);
	return *p ? 0 : ENOMEM;
}

INTERPOSE void *aligned_alloc(size_t align, size_t n)
{
	count(__builtin_return_address(0));
	return __libc_memalign(align, n);
}

INTERPOSE void *memalign(size_t align, size_t n)
{
	count(__builtin_return_address(0));
	return __libc_memalign(align, n);
}

INTERPOSE void free(void *p)
{
	__libc_free(p);
}
#endif

#define TIMEOUT_MS 10000

struct fetch {
	int sends, recvs; /* callbacks seen */
	int status;	  /* the first failure */
};

static void sent(void *arg, int status)
{
	struct fetch *f = arg;

	f->sends++;
	if (status && !f->status)
		f->status = status;
}

static void received(void *arg, int status, DLManagedTensor *t, bool is_dead)
{
	struct fetch *f = arg;

	(void)is_dead;
	f->recvs++;
	if (status && !f->status)
		f->status = status;
	if (t) {
		if (*(double *)t->dl_tensor.data != 8.0 && !f->status)
			f->status = -EBADMSG;
		t->deleter(t);
	}
}

struct pair {
	struct tfab_context *c[2];
	struct tfab_peer *p[2];
};

static int setup(void **state)
{
	static struct pair pr;
	unsigned char blob[2][1024];
	size_t len[2] = {sizeof(blob[0]), sizeof(blob[1])};
	int rc = 0;

	memset(&pr, 0, sizeof(pr));
	for (int i = 0; i < 2 && rc == 0; i++)
		rc = tfab_context_create(&pr.c[i]);
	for (int i = 0; i < 2 && rc == 0; i++)
		rc = tfab_peer_create(pr.c[i], &pr.p[i]);
	for (int i = 0; i < 2 && rc == 0; i++)
		rc = tfab_peer_blob(pr.p[i], blob[i], &len[i]);
	for (int i = 0; i < 2 && rc == 0; i++)
		rc = tfab_peer_connect(pr.p[i], blob[1 - i], len[1 - i]);
	if (rc) {
		fprintf(stderr, "setup: %s\n", tfab_strerror(rc));
		return -1;
	}
	*state = &pr;
	return 0;
}

static int teardown(void **state)
{
	struct pair *pr = *state;

	for (int i = 0; i < 2; i++) {
		tfab_peer_destroy(pr->p[i]);
		tfab_context_destroy(pr->c[i]);
	}
	return 0;
}

/* A one-element float64 tensor over *v. */
static DLTensor f64_scalar(double *v, int64_t *one)
{
	*one = 1;
	return (DLTensor){
	    .data = v, .device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLFloat, 64, 1}, .shape = one};
}

/*
 * n fetches of "k" from step *step on: c[1] sends, c[0] receives, the receive first when
 * recv_first; into dest when not NULL. Both contexts' progress is driven here.
 */
static void fetches(struct pair *pr, int64_t *step, int n, bool recv_first, DLTensor *dest)
{
	static double value = 8.0;
	int64_t one;
	DLTensor t = f64_scalar(&value, &one);

	for (int i = 0; i < n; i++, (*step)++) {
		struct fetch f = {0};
		uint64_t polls = 0;

		for (int k = 0; k < 2; k++) {
			int rc =
			    k == recv_first
				? tfab_send_to(pr->c[1], pr->p[1], "k", *step, &t, false, sent, &f)
				: tfab_recv(pr->c[0], pr->p[0], "k", *step, dest, received, &f);

			assert_int_equal(rc, 0);
		}
		while ((f.sends < 1 || f.recvs < 1) && polls++ < 100000000ull) {
			tfab_progress(pr->c[0]);
			tfab_progress(pr->c[1]);
		}
		assert_int_equal(f.status, 0);
		assert_int_equal(f.sends, 1);
		assert_int_equal(f.recvs, 1);
	}
}

static void expect_no_allocations(struct pair *pr, bool recv_first, DLTensor *dest)
{
	static int64_t step;
	struct tfab_stats st;
	long n;

	fetches(pr, &step, 200, recv_first, dest); /* warm: caches, free lists, the pool */
	atomic_store(&allocations, 0);
	atomic_store(&counting, true);
	fetches(pr, &step, 1000, recv_first, dest);
	atomic_store(&counting, false);
	n = atomic_load(&allocations);
	if (n) {
		Dl_info info = {0};

		dladdr(first_caller, &info);
		fprintf(stderr,
			"%ld allocations in 1000 warm 8-byte fetches; the first from %s+%#lx in %s "
			"(addr2line -f -e FILE OFFSET)\n",
			n, info.dli_sname ? info.dli_sname : "?",
			(unsigned long)((char *)first_caller - (char *)info.dli_fbase),
			info.dli_fname ? info.dli_fname : "?");
	}
	assert_int_equal(n, 0);
	assert_int_equal(tfab_get_stats(pr->c[0], &st), 0);
	assert_true(st.requests >= 1200);
}

static void test_recv_first_library_tensor(void **state)
{
	expect_no_allocations(*state, true, NULL);
}

static void test_send_first_library_tensor(void **state)
{
	expect_no_allocations(*state, false, NULL);
}

static void test_recv_first_caller_tensor(void **state)
{
	static double into;
	int64_t one;
	DLTensor dest = f64_scalar(&into, &one);

	expect_no_allocations(*state, true, &dest);
}

int main(void)
{
#ifdef SANITIZED
	puts("SKIP: a sanitizer's allocator stands where this test's counting one would");
	return 77;
#endif
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_recv_first_library_tensor),
	    cmocka_unit_test(test_send_first_library_tensor),
	    cmocka_unit_test(test_recv_first_caller_tensor),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
