/*
 * Unit tests for the registered pool, over a fake provider that records every block it
 * registers, checks that each is deregistered exactly once and that only the engine's thread
 * calls it; one test over the real libfabric tcp backend when it opens.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tfab/log.h>
#include <tfab/status.h>

#include "engine/pool.h"
#include "util/config.h"

/* ---- the fake provider ---- */

#define MAX_REGIONS 8192

struct fake_region {
	void *addr;
	size_t len;
	unsigned access;
	bool live;
	struct tfab_mr *mr;
};

static struct {
	struct fake_region r[MAX_REGIONS];
	size_t n, live;
	unsigned long deregs, bad_deregs;
	int fail_next;
	pthread_t engine; /* the only thread allowed to call the provider */
	atomic_int wrong_thread;
} F;

static int fake_mr_reg(struct tfab_ep *ep, void *addr, size_t len, unsigned access,
		       struct tfab_mr **mr_p)
{
	struct tfab_mr *mr;
	int rc;

	(void)ep;
	if (!pthread_equal(pthread_self(), F.engine))
		atomic_fetch_add(&F.wrong_thread, 1);
	if (F.fail_next) {
		rc = F.fail_next;
		F.fail_next = 0;
		return rc;
	}
	if (F.n == MAX_REGIONS)
		return -ENOSPC;
	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return -ENOMEM;
	mr->addr = addr;
	mr->len = len;
	mr->prov = (void *)(uintptr_t)F.n;
	F.r[F.n] = (struct fake_region){addr, len, access, true, mr};
	F.n++;
	F.live++;
	*mr_p = mr;
	return 0;
}

static int fake_mr_dereg(struct tfab_mr *mr)
{
	size_t i = (size_t)(uintptr_t)mr->prov;

	if (!pthread_equal(pthread_self(), F.engine))
		atomic_fetch_add(&F.wrong_thread, 1);
	if (i >= F.n || F.r[i].mr != mr || !F.r[i].live) {
		F.bad_deregs++;
		return -EINVAL;
	}
	F.r[i].live = false;
	F.r[i].mr = NULL;
	F.live--;
	F.deregs++;
	free(mr);
	return 0;
}

static const struct tfab_provider_ops fake_ops = {
    .size = sizeof(struct tfab_provider_ops),
    .name = "fake",
    .mr_reg = fake_mr_reg,
    .mr_dereg = fake_mr_dereg,
};

static struct tfab_ep fake_ep = {.ops = &fake_ops};
static struct tfab_ep *const fake_eps[] = {&fake_ep};

static long region_of(const struct tfab_mr *mr)
{
	return (long)(uintptr_t)mr->prov;
}

static atomic_int logged_errors;

static void count_sink(void *arg, enum tfab_log_level level, const char *subsys, const char *msg)
{
	(void)arg;
	(void)subsys;
	(void)msg;
	if (level == TFAB_LOG_ERROR)
		atomic_fetch_add(&logged_errors, 1);
}

static int setup(void **state)
{
	(void)state;
	memset(&F, 0, sizeof(F));
	F.engine = pthread_self();
	atomic_store(&logged_errors, 0);
	tfab_log_set_sink(count_sink, NULL);
	tfab_log_set_level(TFAB_LOG_WARN);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	assert_int_equal(F.live, 0);
	assert_int_equal(F.deregs, F.n);
	assert_int_equal(F.bad_deregs, 0);
	assert_int_equal(atomic_load(&F.wrong_thread), 0);
	tfab_log_set_sink(NULL, NULL);
	return 0;
}

static struct tfab_pool *mk(size_t max_cached)
{
	struct tfab_pool *p = NULL;

	assert_int_equal(tfab__pool_create(fake_eps, 1, max_cached, &p), 0);
	assert_non_null(p);
	return p;
}

static struct tfab_pool_stats stats(struct tfab_pool *p)
{
	struct tfab_pool_stats s;

	tfab__pool_get_stats(p, &s);
	return s;
}

static void *alloc_ok(struct tfab_pool *p, size_t len, size_t want_size)
{
	struct tfab_mr *mr = NULL;
	void *buf = NULL;

	assert_int_equal(tfab__pool_alloc(p, 0, len, &buf, &mr), 0);
	assert_non_null(buf);
	assert_non_null(mr);
	assert_int_equal((uintptr_t)buf % (uintptr_t)sysconf(_SC_PAGESIZE), 0);
	assert_ptr_equal(mr->addr, buf);
	assert_int_equal(mr->len, want_size);
	assert_int_equal(F.r[region_of(mr)].access, TFAB_MR_REMOTE_WRITE | TFAB_MR_LOCAL_WRITE);
	return buf;
}

static void test_class_rounding(void **state)
{
	static const struct {
		size_t len, size;
	} cases[] = {
	    {0, 4096},
	    {1, 4096},
	    {4096, 4096},
	    {4097, 8192},
	    {8192, 8192},
	    {12288, 16384},
	    {(1u << 20) + 1, 2u << 20},
	    {3u << 20, 4u << 20},
	};
	struct tfab_pool *p = mk(64u << 20);
	void *bufs[8];

	(void)state;
	for (size_t i = 0; i < 8; i++) {
		bufs[i] = alloc_ok(p, cases[i].len, cases[i].size);
		/* The whole block is the caller's. */
		memset(bufs[i], 0xa5, cases[i].size);
	}
	assert_int_equal(stats(p).registrations, 8);
	assert_int_equal(stats(p).blocks_out, 8);
	for (size_t i = 0; i < 8; i++)
		tfab__pool_free(p, bufs[i]);
	assert_int_equal(stats(p).blocks_out, 0);
	assert_int_equal(stats(p).bytes_cached,
			 4096 * 3 + 8192 * 2 + 16384 + (2u << 20) + (4u << 20));
	assert_int_equal(tfab__pool_destroy(p), 0);
}

static void test_reuse(void **state)
{
	struct tfab_pool *p = mk(1u << 20);
	struct tfab_pool_stats s;
	struct tfab_mr *mr;
	void *a, *b, *c;

	(void)state;
	a = alloc_ok(p, 5000, 8192);
	tfab__pool_free(p, a);
	/* The same class: the same block, registered once. */
	b = alloc_ok(p, 8000, 8192);
	assert_ptr_equal(a, b);
	/* Another class: a new block. */
	c = alloc_ok(p, 100, 4096);
	assert_ptr_not_equal(c, b);
	s = stats(p);
	assert_int_equal(s.allocs, 3);
	assert_int_equal(s.reuses, 1);
	assert_int_equal(s.registrations, 2);
	assert_int_equal(s.blocks_out, 2);
	assert_int_equal(s.bytes_cached, 0);
	tfab__pool_free(p, c);
	tfab__pool_free(p, b);
	s = stats(p);
	assert_int_equal(s.blocks_out, 0);
	assert_int_equal(s.bytes_cached, 8192 + 4096);
	/* Most recently freed first; the registration comes back with it. */
	assert_int_equal(tfab__pool_alloc(p, 0, 1, &a, &mr), 0);
	assert_ptr_equal(a, c);
	assert_ptr_equal(mr->addr, c);
	tfab__pool_free(p, a);
	assert_int_equal(stats(p).reuses, 2);
	assert_int_equal(tfab__pool_destroy(p), 0);
}

/*
 * A block's holder storage (what a receive's managed tensor lives in) goes with the block:
 * the same storage when the block comes back, writable across all of it, and returning it by
 * that storage is a free as by address (twice is refused, as a double free is).
 */
static void test_owned(void **state)
{
	struct tfab_pool *p = mk(1u << 20);
	void *a, *b, *c, *oa, *ob, *oc;
	struct tfab_mr *mr;

	(void)state;
	assert_int_equal(tfab__pool_alloc_owned(p, 0, 5000, &a, &mr, &oa), 0);
	assert_non_null(oa);
	assert_true((uintptr_t)oa % _Alignof(max_align_t) == 0);
	memset(oa, 0xa5, TFAB_POOL_OWNER_BYTES);
	assert_int_equal(tfab__pool_alloc_owned(p, 0, 5000, &b, &mr, &ob), 0);
	assert_ptr_not_equal(oa, ob);
	tfab__pool_free_owned(p, oa);
	assert_int_equal(stats(p).blocks_out, 1);
	assert_int_equal(stats(p).bytes_cached, 8192);
	/* The block comes back with its storage; a plain alloc takes it too. */
	assert_int_equal(tfab__pool_alloc_owned(p, 0, 8000, &c, &mr, &oc), 0);
	assert_ptr_equal(c, a);
	assert_ptr_equal(oc, oa);
	tfab__pool_free_owned(p, oc);
	tfab__pool_free_owned(p, oc); /* twice */
	assert_int_equal(atomic_load(&logged_errors), 1);
	assert_int_equal(stats(p).blocks_out, 1);
	tfab__pool_free_owned(p, NULL); /* like free(NULL) */
	tfab__pool_free(p, b);		/* by address, though taken with storage */
	assert_int_equal(stats(p).blocks_out, 0);
	assert_int_equal(stats(p).bytes_cached, 2 * 8192);
	assert_int_equal(atomic_load(&logged_errors), 1);
	assert_int_equal(tfab__pool_destroy(p), 0);
}

static void test_trim(void **state)
{
	struct tfab_pool *p = mk(16384);
	struct tfab_mr *mr;
	void *b4, *b8a, *b8b, *b16, *b32, *buf;
	const long r4 = 0, r8a = 1, r8b = 2, r16 = 3, r32 = 4; /* regions, in order */

	(void)state;
	b4 = alloc_ok(p, 4096, 4096);
	b8a = alloc_ok(p, 8192, 8192);
	b8b = alloc_ok(p, 8192, 8192);
	b16 = alloc_ok(p, 16384, 16384);
	b32 = alloc_ok(p, 32768, 32768);

	/* Nothing free: nothing to trim, even though blocks out exceed the bound. */
	tfab__pool_trim(p);
	assert_int_equal(F.deregs, 0);

	tfab__pool_free(p, b4);
	tfab__pool_free(p, b8a);
	tfab__pool_free(p, b8b);
	tfab__pool_free(p, b16);
	tfab__pool_free(p, b32);
	assert_int_equal(stats(p).bytes_cached, 4096 + 2 * 8192 + 16384 + 32768);
	/* Freeing never deregisters. */
	assert_int_equal(F.deregs, 0);

	/* Largest first: 32K (36K left), 16K (20K left), one 8K (12K left). */
	tfab__pool_trim(p);
	assert_int_equal(stats(p).bytes_cached, 12288);
	assert_false(F.r[r32].live);
	assert_false(F.r[r16].live);
	assert_true(F.r[r8a].live != F.r[r8b].live);
	assert_true(F.r[r4].live);
	assert_int_equal(F.deregs, 3);

	/* Under the bound: a second trim keeps everything. */
	tfab__pool_trim(p);
	assert_int_equal(F.deregs, 3);

	/* What is left is still reused. */
	assert_int_equal(tfab__pool_alloc(p, 0, 4096, &buf, &mr), 0);
	assert_ptr_equal(buf, b4);
	tfab__pool_free(p, buf);
	/* A trimmed block's address is foreign now. */
	tfab__pool_free(p, b32);
	assert_int_equal(atomic_load(&logged_errors), 1);
	assert_int_equal(tfab__pool_destroy(p), 0);
}

static void test_trim_to_zero(void **state)
{
	struct tfab_pool *p = mk(0);
	void *a, *b;

	(void)state;
	a = alloc_ok(p, 1, 4096);
	b = alloc_ok(p, 1u << 20, 1u << 20);
	tfab__pool_free(p, a);
	tfab__pool_free(p, b);
	tfab__pool_trim(p);
	assert_int_equal(stats(p).bytes_cached, 0);
	assert_int_equal(F.live, 0);
	assert_int_equal(tfab__pool_destroy(p), 0);
}

static void test_foreign_pointer(void **state)
{
	struct tfab_pool *p = mk(1u << 20);
	struct tfab_pool_stats s0, s1;
	char local[64];
	char *a, *heap;

	(void)state;
	a = alloc_ok(p, 4096, 4096);
	heap = malloc(4096);
	assert_non_null(heap);
	s0 = stats(p);
	tfab__pool_free(p, local);
	tfab__pool_free(p, heap);
	tfab__pool_free(p, a + 1); /* inside a block, not its start */
	tfab__pool_free(p, a + 4096);
	s1 = stats(p);
	assert_memory_equal(&s0, &s1, sizeof(s0));
	assert_int_equal(atomic_load(&logged_errors), 4);

	tfab__pool_free(p, a);
	tfab__pool_free(p, a); /* twice */
	assert_int_equal(atomic_load(&logged_errors), 5);
	assert_int_equal(stats(p).blocks_out, 0);
	assert_int_equal(stats(p).bytes_cached, 4096);
	tfab__pool_free(p, NULL); /* like free(NULL) */
	assert_int_equal(atomic_load(&logged_errors), 5);
	free(heap);
	assert_int_equal(tfab__pool_destroy(p), 0);
}

static void test_alloc_failure(void **state)
{
	struct tfab_pool *p = mk(1u << 20);
	struct tfab_pool_stats s0, s1;
	struct tfab_mr *mr = (struct tfab_mr *)&mr;
	void *buf = &buf;

	(void)state;
	tfab__pool_free(p, alloc_ok(p, 1, 4096));
	s0 = stats(p);
	F.fail_next = -ENOSPC;
	assert_int_equal(tfab__pool_alloc(p, 0, 8192, &buf, &mr), -ENOSPC);
	assert_ptr_equal(buf, &buf);
	assert_ptr_equal(mr, (struct tfab_mr *)&mr);
	s1 = stats(p);
	assert_memory_equal(&s0, &s1, sizeof(s0));
	/* Larger than any class: refused before allocating (sanitizers abort on huge sizes). */
	assert_int_equal(tfab__pool_alloc(p, 0, SIZE_MAX, &buf, &mr), -ENOMEM);
	assert_ptr_equal(buf, &buf);
	assert_int_equal(F.n, 1);
	assert_int_equal(tfab__pool_alloc(NULL, 0, 1, &buf, &mr), -EINVAL);
	assert_int_equal(tfab__pool_create(NULL, 0, 0, &p), -EINVAL);
	assert_int_equal(tfab__pool_destroy(p), 0);
	assert_int_equal(tfab__pool_destroy(NULL), 0);
}

static void test_destroy_busy(void **state)
{
	struct tfab_pool *p = mk(1u << 20);
	void *a, *b;

	(void)state;
	a = alloc_ok(p, 1, 4096);
	b = alloc_ok(p, 10000, 16384);
	tfab__pool_free(p, a);
	assert_int_equal(tfab__pool_destroy(p), -EBUSY);
	/* Nothing done: the pool still works. */
	assert_int_equal(F.live, 2);
	assert_int_equal(stats(p).blocks_out, 1);
	assert_ptr_equal(alloc_ok(p, 1, 4096), a);
	tfab__pool_free(p, a);
	tfab__pool_free(p, b);
	assert_int_equal(tfab__pool_destroy(p), 0);
	assert_int_equal(F.live, 0);
}

/* ---- frees from other threads ---- */

#define NTHREADS 4
#define QCAP 64

struct handoff {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	void *q[QCAP];
	unsigned head, count;
	bool done;
	struct tfab_pool *pool;
	atomic_uint freed;
};

static void *freer(void *arg)
{
	struct handoff *h = arg;
	void *buf;

	for (;;) {
		pthread_mutex_lock(&h->lock);
		while (!h->count && !h->done)
			pthread_cond_wait(&h->cond, &h->lock);
		if (!h->count) {
			pthread_mutex_unlock(&h->lock);
			return NULL;
		}
		buf = h->q[h->head];
		h->head = (h->head + 1) % QCAP;
		h->count--;
		pthread_cond_broadcast(&h->cond);
		pthread_mutex_unlock(&h->lock);
		/* The block is the caller's until freed: scribble on all of it. */
		memset(buf, 0x5a, 4096);
		tfab__pool_free(h->pool, buf);
		atomic_fetch_add(&h->freed, 1);
	}
}

static void test_concurrent_free(void **state)
{
	enum { ALLOCS = 4000 };
	static struct handoff h;
	pthread_t th[NTHREADS];
	struct tfab_pool_stats s;
	struct tfab_pool *p = mk(256u << 10);
	struct tfab_mr *mr;
	void *buf;

	(void)state;
	memset(&h, 0, sizeof(h));
	assert_int_equal(pthread_mutex_init(&h.lock, NULL), 0);
	assert_int_equal(pthread_cond_init(&h.cond, NULL), 0);
	h.pool = p;
	for (int i = 0; i < NTHREADS; i++)
		assert_int_equal(pthread_create(&th[i], NULL, freer, &h), 0);

	for (unsigned i = 0; i < ALLOCS; i++) {
		size_t len = (size_t)4096 << (i % 5);

		assert_int_equal(tfab__pool_alloc(p, 0, len, &buf, &mr), 0);
		assert_ptr_equal(mr->addr, buf);
		assert_true(mr->len >= len);
		pthread_mutex_lock(&h.lock);
		while (h.count == QCAP)
			pthread_cond_wait(&h.cond, &h.lock);
		h.q[(h.head + h.count) % QCAP] = buf;
		h.count++;
		pthread_cond_broadcast(&h.cond);
		pthread_mutex_unlock(&h.lock);
		/* The engine trims now and then, while frees go on. */
		if (i % 97 == 0)
			tfab__pool_trim(p);
	}
	pthread_mutex_lock(&h.lock);
	h.done = true;
	pthread_cond_broadcast(&h.cond);
	pthread_mutex_unlock(&h.lock);
	for (int i = 0; i < NTHREADS; i++)
		assert_int_equal(pthread_join(th[i], NULL), 0);

	assert_int_equal(atomic_load(&h.freed), ALLOCS);
	assert_int_equal(atomic_load(&logged_errors), 0);
	s = stats(p);
	assert_int_equal(s.allocs, ALLOCS);
	assert_int_equal(s.blocks_out, 0);
	assert_int_equal(s.allocs, s.reuses + s.registrations);
	assert_true(s.reuses > 0);
	assert_int_equal(s.registrations, F.n);
	tfab__pool_trim(p);
	assert_true(stats(p).bytes_cached <= (256u << 10));
	assert_int_equal(tfab__pool_destroy(p), 0);
	pthread_cond_destroy(&h.cond);
	pthread_mutex_destroy(&h.lock);
}

/* ---- the real libfabric backend ---- */

static void test_real_ofi(void **state)
{
	const struct tfab_provider_ops *ops;
	struct tfab_pool *p;
	struct tfab_config cfg;
	struct tfab_ep *ep;
	struct tfab_mr *mr, *mr2;
	char err[512];
	void *buf, *buf2;

	(void)state;
#ifndef TFAB_HAVE_OFI
	print_message("SKIP: built without the ofi backend\n");
	skip();
#endif
	/* Where ofi is built in, tcp is there: any error fails. */
	setenv("TFAB_PROVIDER", "ofi:tcp", 1);
	setenv("FI_PROVIDER", "tcp", 1);
	if (tfab__config_init(&cfg, err, sizeof(err)))
		fail_msg("configuration: %s", err);
	tfab_log_set_sink(NULL, NULL);
	tfab_log_set_level(TFAB_LOG_NONE);
	if (tfab__provider_open(&cfg, true, &ops, &ep, err, sizeof(err)))
		fail_msg("%s", err);
	assert_int_equal(tfab__pool_create(&ep, 1, 1u << 20, &p), 0);
	assert_int_equal(tfab__pool_alloc(p, 0, 100000, &buf, &mr), 0);
	assert_ptr_equal(mr->addr, buf);
	assert_int_equal(mr->len, 128u << 10);
	memset(buf, 1, mr->len);
	tfab__pool_free(p, buf);
	assert_int_equal(tfab__pool_alloc(p, 0, 70000, &buf2, &mr2), 0);
	assert_ptr_equal(buf2, buf);
	assert_ptr_equal(mr2, mr);
	assert_int_equal(tfab__pool_destroy(p), -EBUSY);
	tfab__pool_free(p, buf2);
	assert_int_equal(tfab__pool_destroy(p), 0);
	assert_int_equal(ops->close(ep), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_class_rounding, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_reuse, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_owned, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_trim, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_trim_to_zero, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_foreign_pointer, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_alloc_failure, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_destroy_busy, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_concurrent_free, setup, teardown),
	    cmocka_unit_test(test_real_ofi),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
