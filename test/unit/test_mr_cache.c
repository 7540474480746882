/*
 * Unit tests for the registration cache, over a fake provider that records every region it
 * registers and checks that each is deregistered exactly once; one test over the real
 * libfabric tcp backend when it opens.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tfab/log.h>
#include <tfab/status.h>

#include "engine/mr_cache.h"
#include "util/config.h"

/* ---- the fake provider ---- */

struct fake_region {
	uintptr_t start, end;
	unsigned access;
	bool live;
	struct tfab_mr *mr;
};

static struct {
	struct fake_region *r;
	size_t n, cap;
	size_t live;
	unsigned long deregs;
	unsigned long bad_deregs; /* unknown or already deregistered */
	int fail_next;		  /* error for the next mr_reg */
	long last_dereg;	  /* region index, -1 for none */
} F;

static int fake_mr_reg(struct tfab_ep *ep, void *addr, size_t len, unsigned access,
		       struct tfab_mr **mr_p)
{
	struct tfab_mr *mr;
	int rc;

	(void)ep;
	if (F.fail_next) {
		rc = F.fail_next;
		F.fail_next = 0;
		return rc;
	}
	if (F.n == F.cap) {
		size_t cap = F.cap ? F.cap * 2 : 64;
		struct fake_region *r = realloc(F.r, cap * sizeof(*r));

		if (!r)
			return -ENOMEM;
		F.r = r;
		F.cap = cap;
	}
	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return -ENOMEM;
	mr->addr = addr;
	mr->len = len;
	mr->rkey = 1000 + F.n;
	mr->prov = (void *)(uintptr_t)F.n;
	F.r[F.n] = (struct fake_region){(uintptr_t)addr, (uintptr_t)addr + len, access, true, mr};
	F.n++;
	F.live++;
	*mr_p = mr;
	return 0;
}

static int fake_mr_dereg(struct tfab_mr *mr)
{
	size_t i = (size_t)(uintptr_t)mr->prov;

	if (i >= F.n || F.r[i].mr != mr || !F.r[i].live) {
		F.bad_deregs++;
		return -EINVAL;
	}
	F.r[i].live = false;
	F.r[i].mr = NULL;
	F.live--;
	F.deregs++;
	F.last_dereg = (long)i;
	free(mr);
	return 0;
}

static const struct tfab_provider_ops fake_ops = {
    .size = sizeof(struct tfab_provider_ops),
    .name = "fake",
    .mr_reg = fake_mr_reg,
    .mr_dereg = fake_mr_dereg,
};

static long region_of(const struct tfab_mr *mr)
{
	return (long)(uintptr_t)mr->prov;
}

static bool region_live(long i)
{
	return F.r[i].live;
}

/* Errors logged, counted by a sink so that tests can expect them quietly. */
static int logged_errors;

static void count_sink(void *arg, enum tfab_log_level level, const char *subsys, const char *msg)
{
	(void)arg;
	(void)subsys;
	(void)msg;
	if (level == TFAB_LOG_ERROR)
		logged_errors++;
}

static int setup(void **state)
{
	(void)state;
	memset(&F, 0, sizeof(F));
	F.last_dereg = -1;
	logged_errors = 0;
	tfab_log_set_sink(count_sink, NULL);
	tfab_log_set_level(TFAB_LOG_WARN);
	return 0;
}

/* Every registration was deregistered exactly once. */
static int teardown(void **state)
{
	(void)state;
	assert_int_equal(F.live, 0);
	assert_int_equal(F.deregs, F.n);
	assert_int_equal(F.bad_deregs, 0);
	free(F.r);
	memset(&F, 0, sizeof(F));
	tfab_log_set_sink(NULL, NULL);
	return 0;
}

static size_t page(void)
{
	return (size_t)sysconf(_SC_PAGESIZE);
}

/* A fake address: the cache never touches the memory, and neither does the fake provider. */
static void *at(uintptr_t base_pages, size_t off)
{
	return (void *)((base_pages + 16) * page() + off);
}

static struct tfab_mr_cache *mk(size_t max)
{
	struct tfab_mr_cache *c = NULL;

	assert_int_equal(tfab__mr_cache_create(&fake_ops, NULL, max, &c), 0);
	assert_non_null(c);
	return c;
}

static struct tfab_mr_cache_stats stats(struct tfab_mr_cache *c)
{
	struct tfab_mr_cache_stats s;

	tfab__mr_cache_get_stats(c, &s);
	return s;
}

static struct tfab_mr *get_ok(struct tfab_mr_cache *c, void *addr, size_t len, unsigned access)
{
	struct tfab_mr *mr = NULL;

	assert_int_equal(tfab__mr_cache_get(c, addr, len, access, &mr), 0);
	assert_non_null(mr);
	/* Covers the request. */
	assert_true((uintptr_t)mr->addr <= (uintptr_t)addr);
	assert_true((uintptr_t)mr->addr + mr->len >= (uintptr_t)addr + len);
	assert_int_equal(F.r[region_of(mr)].access & access, access);
	return mr;
}

static void test_miss_then_hit(void **state)
{
	struct tfab_mr_cache *c = mk(16);
	struct tfab_mr *a, *b;
	struct tfab_mr_cache_stats s;

	(void)state;
	a = get_ok(c, at(0, 100), 200, TFAB_MR_LOCAL_WRITE);
	s = stats(c);
	assert_int_equal(s.misses, 1);
	assert_int_equal(s.hits, 0);
	assert_int_equal(s.registrations, 1);
	assert_int_equal(s.entries, 1);

	/* The same range, a sub-range, and a part of the page outside what was asked: hits. */
	b = get_ok(c, at(0, 100), 200, TFAB_MR_LOCAL_WRITE);
	assert_ptr_equal(a, b);
	b = get_ok(c, at(0, 150), 10, TFAB_MR_LOCAL_WRITE);
	assert_ptr_equal(a, b);
	b = get_ok(c, at(0, 0), page(), TFAB_MR_LOCAL_WRITE);
	assert_ptr_equal(a, b);
	s = stats(c);
	assert_int_equal(s.hits, 3);
	assert_int_equal(s.misses, 1);
	assert_int_equal(s.registrations, 1);
	for (int i = 0; i < 4; i++)
		tfab__mr_cache_put(c, a);
	/* Unused now but kept registered for the next user. */
	assert_int_equal(F.live, 1);
	b = get_ok(c, at(0, 4000 % page()), 1, TFAB_MR_LOCAL_WRITE);
	assert_ptr_equal(a, b);
	tfab__mr_cache_put(c, b);
	assert_int_equal(stats(c).hits, 4);
	assert_int_equal(tfab__mr_cache_destroy(c), 0);
}

static void test_page_alignment(void **state)
{
	struct tfab_mr_cache *c = mk(16);
	struct tfab_mr *mr;
	size_t pg = page();

	(void)state;
	/* Crosses one page boundary: two pages registered. */
	mr = get_ok(c, at(0, pg - 10), 20, TFAB_MR_LOCAL_WRITE);
	assert_ptr_equal(mr->addr, at(0, 0));
	assert_int_equal(mr->len, 2 * pg);
	assert_int_equal((uintptr_t)mr->addr % pg, 0);
	assert_int_equal(mr->len % pg, 0);
	tfab__mr_cache_put(c, mr);

	/* Exactly one page, aligned: one page. */
	mr = get_ok(c, at(10, 0), pg, TFAB_MR_LOCAL_WRITE);
	assert_ptr_equal(mr->addr, at(10, 0));
	assert_int_equal(mr->len, pg);
	tfab__mr_cache_put(c, mr);

	/* One byte at the end of a page. */
	mr = get_ok(c, at(20, pg - 1), 1, TFAB_MR_LOCAL_WRITE);
	assert_ptr_equal(mr->addr, at(20, 0));
	assert_int_equal(mr->len, pg);
	tfab__mr_cache_put(c, mr);

	/* A range one byte past a registered page is a miss. */
	mr = get_ok(c, at(20, 0), pg + 1, TFAB_MR_LOCAL_WRITE);
	assert_ptr_equal(mr->addr, at(20, 0));
	assert_int_equal(mr->len, 2 * pg);
	tfab__mr_cache_put(c, mr);
	assert_int_equal(stats(c).misses, 4);
	assert_int_equal(stats(c).hits, 0);
	assert_int_equal(tfab__mr_cache_destroy(c), 0);
}

static void test_bad_arguments(void **state)
{
	struct tfab_mr_cache *c = mk(16);
	struct tfab_mr *mr = (struct tfab_mr *)&mr;

	(void)state;
	assert_int_equal(tfab__mr_cache_get(c, at(0, 0), 0, TFAB_MR_LOCAL_WRITE, &mr), -EINVAL);
	assert_int_equal(tfab__mr_cache_get(c, NULL, 10, TFAB_MR_LOCAL_WRITE, &mr), -EINVAL);
	assert_int_equal(tfab__mr_cache_get(c, at(0, 0), 10, 1u << 7, &mr), -EINVAL);
	assert_int_equal(
	    tfab__mr_cache_get(c, (void *)(UINTPTR_MAX - 10), 100, TFAB_MR_LOCAL_WRITE, &mr),
	    -EINVAL);
	assert_ptr_equal(mr, (struct tfab_mr *)&mr);
	assert_int_equal(F.n, 0);
	assert_int_equal(stats(c).misses, 0);
	assert_int_equal(tfab__mr_cache_create(NULL, NULL, 1, &c), -EINVAL);
	assert_int_equal(tfab__mr_cache_destroy(c), 0);
	assert_int_equal(tfab__mr_cache_destroy(NULL), 0);
}

static void test_overlapping_spans(void **state)
{
	struct tfab_mr_cache *c = mk(16);
	struct tfab_mr *a, *b, *m, *w, *got[8];
	size_t pg = page();
	int n = 0;

	(void)state;
	a = got[n++] = get_ok(c, at(0, 0), 4 * pg, TFAB_MR_LOCAL_WRITE); /* pages 0..3 */
	b = got[n++] = get_ok(c, at(2, 0), 4 * pg, TFAB_MR_LOCAL_WRITE); /* pages 2..5: a miss */
	assert_ptr_not_equal(a, b);
	assert_int_equal(stats(c).misses, 2);

	/* Inside a only, inside both, inside b only: hits on a container. */
	m = got[n++] = get_ok(c, at(1, 0), pg, TFAB_MR_LOCAL_WRITE);
	assert_ptr_equal(m, a);
	m = got[n++] = get_ok(c, at(2, 5), 2 * pg - 10, TFAB_MR_LOCAL_WRITE);
	assert_true(m == a || m == b);
	m = got[n++] = get_ok(c, at(4, 0), 2 * pg, TFAB_MR_LOCAL_WRITE);
	assert_ptr_equal(m, b);
	assert_int_equal(stats(c).hits, 3);
	assert_int_equal(stats(c).misses, 2);

	/* Covered by the union of a and b but by neither alone: a miss. */
	w = got[n++] = get_ok(c, at(1, 0), 4 * pg, TFAB_MR_LOCAL_WRITE);
	assert_ptr_not_equal(w, a);
	assert_ptr_not_equal(w, b);
	assert_ptr_equal(w->addr, at(1, 0));
	assert_int_equal(w->len, 4 * pg);
	assert_int_equal(stats(c).misses, 3);
	assert_int_equal(stats(c).entries, 3);

	/* Nested spans: either container may answer. */
	m = got[n++] = get_ok(c, at(1, 10), 10, TFAB_MR_LOCAL_WRITE);
	assert_true(m == a || m == w);
	/* Past every span's end: a miss. */
	m = got[n++] = get_ok(c, at(5, 0), pg + 1, TFAB_MR_LOCAL_WRITE);
	assert_int_equal(stats(c).misses, 4);
	assert_int_equal(stats(c).hits, 4);

	assert_int_equal(tfab__mr_cache_destroy(c), -EBUSY);
	while (n > 0)
		tfab__mr_cache_put(c, got[--n]);
	assert_int_equal(F.live, 4);
	assert_int_equal(tfab__mr_cache_destroy(c), 0);
}

/* A registration lacking an access bit asked for is not a hit; the new one has the union. */
static void test_access_bits(void **state)
{
	struct tfab_mr_cache *c = mk(16);
	struct tfab_mr *l, *r, *m;

	(void)state;
	l = get_ok(c, at(0, 0), 100, TFAB_MR_LOCAL_WRITE);
	r = get_ok(c, at(0, 0), 100, TFAB_MR_REMOTE_WRITE);
	assert_ptr_not_equal(l, r);
	assert_int_equal(F.r[region_of(r)].access, TFAB_MR_LOCAL_WRITE | TFAB_MR_REMOTE_WRITE);
	assert_int_equal(stats(c).misses, 2);
	m = get_ok(c, at(0, 0), 100, TFAB_MR_LOCAL_WRITE | TFAB_MR_REMOTE_WRITE);
	assert_ptr_equal(m, r);
	tfab__mr_cache_put(c, m);
	m = get_ok(c, at(0, 0), 100, TFAB_MR_LOCAL_WRITE);
	assert_true(m == l || m == r);
	tfab__mr_cache_put(c, m);
	m = get_ok(c, at(0, 0), 100, 0);
	tfab__mr_cache_put(c, m);
	assert_int_equal(stats(c).hits, 3);
	tfab__mr_cache_put(c, l);
	tfab__mr_cache_put(c, r);
	assert_int_equal(tfab__mr_cache_destroy(c), 0);
}

static void test_lru_eviction(void **state)
{
	struct tfab_mr_cache *c = mk(3);
	struct tfab_mr *mr[5];
	long reg[5];

	(void)state;
	for (int i = 0; i < 3; i++) {
		mr[i] = get_ok(c, at((uintptr_t)i * 10, 0), 10, TFAB_MR_LOCAL_WRITE);
		reg[i] = region_of(mr[i]);
		tfab__mr_cache_put(c, mr[i]);
	}
	/* Use 0 again: 1 becomes the least recently used. */
	tfab__mr_cache_put(c, get_ok(c, at(0, 0), 10, TFAB_MR_LOCAL_WRITE));
	assert_int_equal(F.deregs, 0);

	mr[3] = get_ok(c, at(30, 0), 10, TFAB_MR_LOCAL_WRITE);
	reg[3] = region_of(mr[3]);
	assert_int_equal(F.deregs, 1);
	assert_false(region_live(reg[1]));
	assert_int_equal(stats(c).entries, 3);
	assert_int_equal(stats(c).evictions, 1);
	tfab__mr_cache_put(c, mr[3]);

	/* Then 2, then 0, in the order they were last used. */
	mr[4] = get_ok(c, at(40, 0), 10, TFAB_MR_LOCAL_WRITE);
	reg[4] = region_of(mr[4]);
	assert_false(region_live(reg[2]));
	assert_true(region_live(reg[0]));
	tfab__mr_cache_put(c, mr[4]);
	tfab__mr_cache_put(c, get_ok(c, at(50, 0), 10, TFAB_MR_LOCAL_WRITE));
	assert_false(region_live(reg[0]));
	assert_true(region_live(reg[3]));
	assert_true(region_live(reg[4]));
	assert_int_equal(stats(c).entries, 3);
	assert_int_equal(stats(c).evictions, 3);

	/* An evicted range is a miss again. */
	tfab__mr_cache_put(c, get_ok(c, at(10, 0), 10, TFAB_MR_LOCAL_WRITE));
	assert_int_equal(stats(c).misses, 7);
	assert_int_equal(stats(c).registrations, 7);
	assert_int_equal(tfab__mr_cache_destroy(c), 0);
}

static void test_in_use_never_evicted(void **state)
{
	struct tfab_mr_cache *c = mk(2);
	struct tfab_mr *mr[5];
	long reg[5];

	(void)state;
	for (int i = 0; i < 5; i++) {
		mr[i] = get_ok(c, at((uintptr_t)i * 10, 0), 10, TFAB_MR_LOCAL_WRITE);
		reg[i] = region_of(mr[i]);
	}
	/* Over the bound, but everything is in use. */
	assert_int_equal(stats(c).entries, 5);
	assert_int_equal(F.deregs, 0);
	assert_int_equal(stats(c).evictions, 0);

	/* Each put brings the count back towards the bound, evicting what was just put. */
	tfab__mr_cache_put(c, mr[3]);
	assert_false(region_live(reg[3]));
	assert_int_equal(stats(c).entries, 4);
	tfab__mr_cache_put(c, mr[1]);
	tfab__mr_cache_put(c, mr[0]);
	assert_false(region_live(reg[1]));
	assert_false(region_live(reg[0]));
	assert_int_equal(stats(c).entries, 2);
	assert_true(region_live(reg[2]));
	assert_true(region_live(reg[4]));
	/* At the bound: kept. */
	tfab__mr_cache_put(c, mr[4]);
	assert_true(region_live(reg[4]));
	assert_int_equal(stats(c).evictions, 3);

	/* A miss while 2 is in use evicts 4, the only unused one. */
	mr[0] = get_ok(c, at(60, 0), 10, TFAB_MR_LOCAL_WRITE);
	assert_false(region_live(reg[4]));
	assert_true(region_live(reg[2]));
	tfab__mr_cache_put(c, mr[0]);
	tfab__mr_cache_put(c, mr[2]);
	assert_int_equal(stats(c).entries, 2);
	assert_int_equal(tfab__mr_cache_destroy(c), 0);
}

static void test_invalidate_unused(void **state)
{
	struct tfab_mr_cache *c = mk(16);
	struct tfab_mr *a, *b, *d;
	long ra, rb, rd;
	size_t pg = page();

	(void)state;
	a = get_ok(c, at(0, 0), 2 * pg, TFAB_MR_LOCAL_WRITE);
	b = get_ok(c, at(1, 0), 2 * pg, TFAB_MR_LOCAL_WRITE); /* overlaps a */
	d = get_ok(c, at(10, 0), pg, TFAB_MR_LOCAL_WRITE);    /* elsewhere */
	ra = region_of(a);
	rb = region_of(b);
	rd = region_of(d);
	tfab__mr_cache_put(c, a);
	tfab__mr_cache_put(c, b);
	tfab__mr_cache_put(c, d);

	/* One byte of page 1 touches both a and b, not d. */
	assert_int_equal(tfab__mr_cache_invalidate(c, at(1, 7), 1), 2);
	assert_false(region_live(ra));
	assert_false(region_live(rb));
	assert_true(region_live(rd));
	assert_int_equal(stats(c).entries, 1);
	assert_int_equal(stats(c).evictions, 0);

	/* Touching ends exactly: no overlap. */
	assert_int_equal(tfab__mr_cache_invalidate(c, at(9, 0), pg), 0);
	assert_int_equal(tfab__mr_cache_invalidate(c, at(11, 0), pg), 0);
	assert_int_equal(tfab__mr_cache_invalidate(c, at(10, 0), 0), 0);
	assert_true(region_live(rd));

	/* A later get of the range is a miss. */
	a = get_ok(c, at(0, 0), 10, TFAB_MR_LOCAL_WRITE);
	assert_int_not_equal(region_of(a), ra);
	assert_int_equal(stats(c).misses, 4);
	tfab__mr_cache_put(c, a);

	/* Everything. */
	assert_int_equal(tfab__mr_cache_invalidate(c, (void *)1, SIZE_MAX), 2);
	assert_int_equal(stats(c).entries, 0);
	assert_int_equal(F.live, 0);
	assert_int_equal(tfab__mr_cache_destroy(c), 0);
}

static void test_invalidate_in_use(void **state)
{
	struct tfab_mr_cache *c = mk(16);
	struct tfab_mr *a, *a2, *n;
	long ra;

	(void)state;
	a = get_ok(c, at(0, 0), 100, TFAB_MR_LOCAL_WRITE);
	a2 = get_ok(c, at(0, 0), 100, TFAB_MR_LOCAL_WRITE);
	assert_ptr_equal(a, a2);
	ra = region_of(a);

	assert_int_equal(tfab__mr_cache_invalidate(c, at(0, 50), 1), 1);
	assert_true(region_live(ra)); /* still in use */
	assert_int_equal(stats(c).entries, 0);

	/* No later get returns it. */
	n = get_ok(c, at(0, 0), 100, TFAB_MR_LOCAL_WRITE);
	assert_ptr_not_equal(n, a);
	/* Invalidating again does not count it twice. */
	tfab__mr_cache_put(c, n);
	assert_int_equal(tfab__mr_cache_invalidate(c, at(0, 0), 100), 1);

	/* Busy until the last put, which deregisters it. */
	assert_int_equal(tfab__mr_cache_destroy(c), -EBUSY);
	tfab__mr_cache_put(c, a);
	assert_true(region_live(ra));
	tfab__mr_cache_put(c, a2);
	assert_false(region_live(ra));
	assert_int_equal(F.live, 0);
	assert_int_equal(stats(c).evictions, 0);
	assert_int_equal(tfab__mr_cache_destroy(c), 0);
}

static void test_destroy_busy(void **state)
{
	struct tfab_mr_cache *c = mk(16);
	struct tfab_mr *a, *b;

	(void)state;
	a = get_ok(c, at(0, 0), 100, TFAB_MR_LOCAL_WRITE);
	b = get_ok(c, at(5, 0), 100, TFAB_MR_LOCAL_WRITE);
	tfab__mr_cache_put(c, b);
	assert_int_equal(tfab__mr_cache_destroy(c), -EBUSY);
	/* Nothing was done: both still registered and usable. */
	assert_int_equal(F.live, 2);
	assert_int_equal(stats(c).entries, 2);
	tfab__mr_cache_put(c, get_ok(c, at(5, 0), 100, TFAB_MR_LOCAL_WRITE));
	assert_int_equal(stats(c).hits, 1);
	tfab__mr_cache_put(c, a);
	assert_int_equal(tfab__mr_cache_destroy(c), 0);
	assert_int_equal(F.live, 0);
}

static void test_reg_failure_unchanged(void **state)
{
	struct tfab_mr_cache *c = mk(1);
	struct tfab_mr *a, *mr = (struct tfab_mr *)&mr;
	struct tfab_mr_cache_stats s0, s1;

	(void)state;
	a = get_ok(c, at(0, 0), 100, TFAB_MR_LOCAL_WRITE);
	tfab__mr_cache_put(c, a);
	s0 = stats(c);

	F.fail_next = -ENOSPC;
	assert_int_equal(tfab__mr_cache_get(c, at(10, 0), 100, TFAB_MR_REMOTE_WRITE, &mr), -ENOSPC);
	assert_ptr_equal(mr, (struct tfab_mr *)&mr);
	s1 = stats(c);
	assert_memory_equal(&s0, &s1, sizeof(s0));
	/* The unused entry was not evicted to make room, and is still a hit. */
	assert_true(region_live(region_of(a)));
	assert_ptr_equal(get_ok(c, at(0, 0), 100, TFAB_MR_LOCAL_WRITE), a);
	tfab__mr_cache_put(c, a);
	/* The access asked for in the failed call was not remembered. */
	a = get_ok(c, at(20, 0), 100, TFAB_MR_LOCAL_WRITE);
	assert_int_equal(F.r[region_of(a)].access, TFAB_MR_LOCAL_WRITE);
	tfab__mr_cache_put(c, a);
	assert_int_equal(tfab__mr_cache_destroy(c), 0);
}

static void test_put_foreign(void **state)
{
	struct tfab_mr_cache *c = mk(16);
	struct tfab_mr other = {0}, *a;

	(void)state;
	tfab__mr_cache_put(c, &other);
	assert_int_equal(logged_errors, 1);
	a = get_ok(c, at(0, 0), 100, TFAB_MR_LOCAL_WRITE);
	tfab__mr_cache_put(c, a);
	tfab__mr_cache_put(c, a); /* one put too many */
	assert_int_equal(logged_errors, 2);
	assert_int_equal(tfab__mr_cache_destroy(c), 0);
}

/* ---- many entries ---- */

static void test_many_entries(void **state)
{
	enum { N = 20000 };
	struct tfab_mr_cache *c = mk(N);
	struct tfab_mr_cache_stats s;
	size_t pg = page();

	(void)state;
	/* N disjoint one-page spans, a page apart, then every one is a hit in any order. */
	for (uintptr_t i = 0; i < N; i++)
		tfab__mr_cache_put(c, get_ok(c, at(2 * i, 8), 8, TFAB_MR_LOCAL_WRITE));
	for (uintptr_t i = 0; i < N; i++) {
		uintptr_t k = (i * 7919) % N;
		struct tfab_mr *mr = get_ok(c, at(2 * k, 0), pg, TFAB_MR_LOCAL_WRITE);

		assert_int_equal(region_of(mr), (long)k);
		tfab__mr_cache_put(c, mr);
	}
	s = stats(c);
	assert_int_equal(s.entries, N);
	assert_int_equal(s.hits, N);
	assert_int_equal(s.misses, N);
	assert_int_equal(s.evictions, 0);

	/* The gaps between them, and ranges across two spans, are misses. */
	tfab__mr_cache_put(c, get_ok(c, at(1, 0), 1, TFAB_MR_LOCAL_WRITE));
	tfab__mr_cache_put(c, get_ok(c, at(4, pg - 1), pg + 2, TFAB_MR_LOCAL_WRITE));
	assert_int_equal(stats(c).misses, N + 2);
	/* Two over the bound: the two least recently used went. */
	assert_int_equal(stats(c).entries, N);
	assert_int_equal(stats(c).evictions, 2);

	/* Drop the upper half in one call. */
	assert_int_equal(tfab__mr_cache_invalidate(c, at(N, 0), N * pg), N / 2);
	assert_int_equal(stats(c).entries, N / 2);
	assert_int_equal(tfab__mr_cache_destroy(c), 0);
}

/* ---- random use in a small space, against a brute-force model ---- */

static uint64_t rng = 88172645463325252ull;

static uint64_t xorshift(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* Regions the model believes are in lookup: registered, not invalidated, not evicted. */
static long *model;
static size_t model_n;

static void model_prune(void)
{
	size_t j = 0;

	for (size_t i = 0; i < model_n; i++)
		if (F.r[model[i]].live)
			model[j++] = model[i];
	model_n = j;
}

static bool model_has(long reg)
{
	for (size_t i = 0; i < model_n; i++)
		if (model[i] == reg)
			return true;
	return false;
}

static bool model_contains(uintptr_t a, uintptr_t b, unsigned access)
{
	model_prune();
	for (size_t i = 0; i < model_n; i++) {
		const struct fake_region *r = &F.r[model[i]];

		if (r->start <= a && r->end >= b && (r->access & access) == access)
			return true;
	}
	return false;
}

static int model_invalidate(uintptr_t a, uintptr_t b)
{
	size_t j = 0;
	int n = 0;

	model_prune();
	for (size_t i = 0; i < model_n; i++) {
		const struct fake_region *r = &F.r[model[i]];

		if (r->start < b && r->end > a)
			n++;
		else
			model[j++] = model[i];
	}
	model_n = j;
	return n;
}

static void test_random_against_model(void **state)
{
	enum { MAX = 100, HELD = 16, ROUNDS = 20000, PAGES = 160 };
	struct tfab_mr_cache *c = mk(MAX);
	struct tfab_mr *held[HELD] = {0};
	struct tfab_mr_cache_stats s;
	size_t pg = page();
	uint64_t hits;

	(void)state;
	model = calloc(MAX + HELD + 1, sizeof(*model));
	assert_non_null(model);
	model_n = 0;
	for (int r = 0; r < ROUNDS; r++) {
		uintptr_t a = (uintptr_t)at(xorshift() % PAGES, xorshift() % pg);
		size_t len = 1 + xorshift() % ((xorshift() % 4 == 0 ? 12 : 2) * pg);
		unsigned access = (unsigned)(xorshift() % 4 == 0 ? TFAB_MR_REMOTE_WRITE : 0) |
				  (unsigned)(xorshift() % 2 ? TFAB_MR_LOCAL_WRITE : 0);
		int slot = (int)(xorshift() % HELD);
		bool expect_hit;
		long reg;

		if (xorshift() % 64 == 0) {
			uintptr_t ia = (uintptr_t)at(xorshift() % PAGES, xorshift() % pg);
			size_t ilen = 1 + xorshift() % (4 * pg);

			assert_int_equal(tfab__mr_cache_invalidate(c, (void *)ia, ilen),
					 model_invalidate(ia, ia + ilen));
		}
		/* Puts may evict; the model notices through the fake provider. */
		if (held[slot])
			tfab__mr_cache_put(c, held[slot]);
		held[slot] = NULL;
		expect_hit = model_contains(a, a + len, access);
		hits = stats(c).hits;
		held[slot] = get_ok(c, (void *)a, len, access);
		reg = region_of(held[slot]);
		if (expect_hit) {
			assert_int_equal(stats(c).hits - hits, 1);
			assert_true(model_has(reg));
		} else {
			assert_int_equal(stats(c).hits - hits, 0);
			model[model_n++] = reg;
		}
		/* The bound holds unless everything unused has gone. */
		model_prune();
		assert_int_equal(stats(c).entries, model_n);
		assert_true(model_n <= MAX);
	}
	s = stats(c);
	assert_true(s.hits > ROUNDS / 10);
	assert_true(s.misses > ROUNDS / 10);
	assert_true(s.evictions > 0);
	for (int i = 0; i < HELD; i++)
		if (held[i])
			tfab__mr_cache_put(c, held[i]);
	assert_true(stats(c).entries <= MAX);
	assert_int_equal(tfab__mr_cache_destroy(c), 0);
	free(model);
	model = NULL;
}

/* ---- the real libfabric backend ---- */

static void test_real_ofi(void **state)
{
	const struct tfab_provider_ops *ops;
	struct tfab_mr_cache_stats s;
	struct tfab_mr_cache *c;
	struct tfab_mr *a, *b;
	struct tfab_config cfg;
	struct tfab_ep *ep;
	char err[512];
	size_t len = 3 * page() + 123;
	char *buf;

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
	buf = malloc(len);
	assert_non_null(buf);
	memset(buf, 0, len);
	assert_int_equal(tfab__mr_cache_create(ops, ep, 4, &c), 0);
	assert_int_equal(tfab__mr_cache_get(c, buf + 100, len - 200, TFAB_MR_LOCAL_WRITE, &a), 0);
	assert_true((char *)a->addr <= buf + 100);
	assert_true((char *)a->addr + a->len >= buf + len - 100);
	assert_int_equal((uintptr_t)a->addr % page(), 0);
	assert_int_equal(tfab__mr_cache_get(c, buf + 200, 10, TFAB_MR_LOCAL_WRITE, &b), 0);
	assert_ptr_equal(a, b);
	tfab__mr_cache_get_stats(c, &s);
	assert_int_equal(s.hits, 1);
	assert_int_equal(s.registrations, 1);
	/* The endpoint refuses to close while a region is registered. */
	assert_int_equal(ops->close(ep), -EBUSY);
	tfab__mr_cache_put(c, a);
	tfab__mr_cache_put(c, b);
	assert_int_equal(tfab__mr_cache_destroy(c), 0);
	assert_int_equal(ops->close(ep), 0);
	free(buf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_miss_then_hit, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_page_alignment, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_bad_arguments, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_overlapping_spans, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_access_bits, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_lru_eviction, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_in_use_never_evicted, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_invalidate_unused, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_invalidate_in_use, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_destroy_busy, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_reg_failure_unchanged, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_put_foreign, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_many_entries, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_random_against_model, setup, teardown),
	    cmocka_unit_test(test_real_ofi),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
