/*
 * The registration cache for caller-provided buffers (see mr_cache.h).
 *
 * Lookup: one interval tree per access mask (TFAB_MR_* has two bits, so four trees). Each
 * tree is an AVL tree ordered by span start (ties broken by entry address) and augmented with
 * the largest span end in each subtree, so "some span contains [a, b)" and "some span overlaps
 * [a, b)" are each answered in O(log n) even when spans overlap. A get searches the trees whose
 * mask holds the bits asked for (at most four O(log n) searches); insert and remove are
 * O(log n). A chained hash keyed by the provider's struct tfab_mr pointer finds the entry again
 * in put, O(1) on average; it also holds entries that were invalidated while in use, which are
 * in no tree.
 *
 * Unused live entries sit on an LRU list (least recently used at the head): eviction pops the
 * head, O(1). Entries in use are on no list and are never evicted.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include <tfab/status.h>

#include "engine/mr_cache.h"
#include "util/log.h"

#define SUBSYS "mr_cache"

#define ACCESS_ALL (TFAB_MR_LOCAL_WRITE | TFAB_MR_REMOTE_WRITE)
#define NTREES (ACCESS_ALL + 1)

struct mrc_entry {
	/* Interval tree (while live). */
	struct mrc_entry *left, *right;
	int height;
	uintptr_t max_end; /* largest end in this subtree */

	uintptr_t start, end; /* the registered span, page-aligned */
	unsigned access;
	unsigned refs;
	bool live; /* in a tree; false once invalidated */
	struct tfab_mr *mr;

	/* LRU list (while live and unused). */
	struct mrc_entry *lru_prev, *lru_next;

	/* Hash by mr (always). */
	struct mrc_entry *hnext;
};

struct tfab_mr_cache {
	const struct tfab_provider_ops *ops;
	struct tfab_ep *ep;
	size_t max_entries;
	uintptr_t page_mask;
	unsigned access_union;

	struct mrc_entry *root[NTREES];
	struct mrc_entry *lru_head, *lru_tail;

	struct mrc_entry **buckets;
	size_t nbuckets; /* a power of two */
	size_t nhashed;	 /* live entries plus invalidated ones still in use */

	struct tfab_mr_cache_stats st;
};

/* ---- the interval tree ---- */

static int height(const struct mrc_entry *n)
{
	return n ? n->height : 0;
}

static void update(struct mrc_entry *n)
{
	int hl = height(n->left), hr = height(n->right);

	n->height = (hl > hr ? hl : hr) + 1;
	n->max_end = n->end;
	if (n->left && n->left->max_end > n->max_end)
		n->max_end = n->left->max_end;
	if (n->right && n->right->max_end > n->max_end)
		n->max_end = n->right->max_end;
}

static struct mrc_entry *rotate_right(struct mrc_entry *n)
{
	struct mrc_entry *l = n->left;

	n->left = l->right;
	l->right = n;
	update(n);
	update(l);
	return l;
}

static struct mrc_entry *rotate_left(struct mrc_entry *n)
{
	struct mrc_entry *r = n->right;

	n->right = r->left;
	r->left = n;
	update(n);
	update(r);
	return r;
}

static struct mrc_entry *rebalance(struct mrc_entry *n)
{
	int bal;

	update(n);
	bal = height(n->left) - height(n->right);
	if (bal > 1) {
		if (height(n->left->left) < height(n->left->right))
			n->left = rotate_left(n->left);
		return rotate_right(n);
	}
	if (bal < -1) {
		if (height(n->right->right) < height(n->right->left))
			n->right = rotate_right(n->right);
		return rotate_left(n);
	}
	return n;
}

/* Order by start, then by address so that equal spans are distinct keys. */
static bool key_less(const struct mrc_entry *a, const struct mrc_entry *b)
{
	if (a->start != b->start)
		return a->start < b->start;
	return (uintptr_t)a < (uintptr_t)b;
}

static struct mrc_entry *tree_insert(struct mrc_entry *n, struct mrc_entry *e)
{
	if (!n) {
		e->left = e->right = NULL;
		e->height = 1;
		e->max_end = e->end;
		return e;
	}
	if (key_less(e, n))
		n->left = tree_insert(n->left, e);
	else
		n->right = tree_insert(n->right, e);
	return rebalance(n);
}

static struct mrc_entry *tree_remove_min(struct mrc_entry *n, struct mrc_entry **min_p)
{
	if (!n->left) {
		*min_p = n;
		return n->right;
	}
	n->left = tree_remove_min(n->left, min_p);
	return rebalance(n);
}

static struct mrc_entry *tree_remove(struct mrc_entry *n, struct mrc_entry *e)
{
	struct mrc_entry *min;

	if (!n)
		return NULL; /* not reached: e is in this tree */
	if (n == e) {
		if (!n->left)
			return n->right;
		if (!n->right)
			return n->left;
		n->right = tree_remove_min(n->right, &min);
		min->left = n->left;
		min->right = n->right;
		return rebalance(min);
	}
	if (key_less(e, n))
		n->left = tree_remove(n->left, e);
	else
		n->right = tree_remove(n->right, e);
	return rebalance(n);
}

/* An entry with start <= a and end >= b, or NULL. */
static struct mrc_entry *tree_find_containing(struct mrc_entry *n, uintptr_t a, uintptr_t b)
{
	while (n && n->max_end >= b) {
		if (n->start > a) {
			n = n->left;
			continue;
		}
		/* Everything on the left starts at or before n, hence before a. */
		if (n->left && n->left->max_end >= b) {
			n = n->left;
			continue;
		}
		if (n->end >= b)
			return n;
		n = n->right;
	}
	return NULL;
}

/* An entry with start < b and end > a, or NULL. */
static struct mrc_entry *tree_find_overlapping(struct mrc_entry *n, uintptr_t a, uintptr_t b)
{
	while (n && n->max_end > a) {
		/*
		 * If the left subtree reaches past a but holds no overlap, its far-reaching entry
		 * starts at or after b, and so do n and everything on its right.
		 */
		if (n->left && n->left->max_end > a) {
			n = n->left;
			continue;
		}
		if (n->start >= b)
			return NULL;
		if (n->end > a)
			return n;
		n = n->right;
	}
	return NULL;
}

/* ---- the hash by mr ---- */

static size_t hash_mr(const struct tfab_mr *mr, size_t nbuckets)
{
	uint64_t x = (uint64_t)(uintptr_t)mr;

	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return (size_t)x & (nbuckets - 1);
}

/* Make room for one more entry; the only allocation besides the entry itself. */
static int hash_reserve(struct tfab_mr_cache *c)
{
	struct mrc_entry **nb, *e, *next;
	size_t n, i, h;

	if (c->nhashed + 1 <= c->nbuckets)
		return 0;
	n = c->nbuckets * 2;
	nb = calloc(n, sizeof(*nb));
	if (!nb)
		return -ENOMEM;
	for (i = 0; i < c->nbuckets; i++) {
		for (e = c->buckets[i]; e; e = next) {
			next = e->hnext;
			h = hash_mr(e->mr, n);
			e->hnext = nb[h];
			nb[h] = e;
		}
	}
	free(c->buckets);
	c->buckets = nb;
	c->nbuckets = n;
	return 0;
}

static void hash_add(struct tfab_mr_cache *c, struct mrc_entry *e)
{
	size_t h = hash_mr(e->mr, c->nbuckets);

	e->hnext = c->buckets[h];
	c->buckets[h] = e;
	c->nhashed++;
}

static struct mrc_entry *hash_find(const struct tfab_mr_cache *c, const struct tfab_mr *mr)
{
	struct mrc_entry *e;

	for (e = c->buckets[hash_mr(mr, c->nbuckets)]; e; e = e->hnext)
		if (e->mr == mr)
			return e;
	return NULL;
}

static void hash_del(struct tfab_mr_cache *c, struct mrc_entry *e)
{
	struct mrc_entry **pp = &c->buckets[hash_mr(e->mr, c->nbuckets)];

	while (*pp != e)
		pp = &(*pp)->hnext;
	*pp = e->hnext;
	c->nhashed--;
}

/* ---- the LRU list of unused live entries ---- */

static void lru_append(struct tfab_mr_cache *c, struct mrc_entry *e)
{
	e->lru_next = NULL;
	e->lru_prev = c->lru_tail;
	if (c->lru_tail)
		c->lru_tail->lru_next = e;
	else
		c->lru_head = e;
	c->lru_tail = e;
}

static void lru_del(struct tfab_mr_cache *c, struct mrc_entry *e)
{
	if (e->lru_prev)
		e->lru_prev->lru_next = e->lru_next;
	else
		c->lru_head = e->lru_next;
	if (e->lru_next)
		e->lru_next->lru_prev = e->lru_prev;
	else
		c->lru_tail = e->lru_prev;
	e->lru_prev = e->lru_next = NULL;
}

/* ---- entries ---- */

static void entry_release(struct tfab_mr_cache *c, struct mrc_entry *e)
{
	int rc;

	hash_del(c, e);
	rc = c->ops->mr_dereg(e->mr);
	if (rc)
		TFAB_WARN(SUBSYS, "deregistering %zu bytes: %s", (size_t)(e->end - e->start),
			  tfab_strerror(rc));
	free(e);
}

/* Take a live entry out of lookup; release it now when unused. */
static void entry_unlink(struct tfab_mr_cache *c, struct mrc_entry *e)
{
	c->root[e->access] = tree_remove(c->root[e->access], e);
	e->live = false;
	c->st.entries--;
	if (e->refs == 0) {
		lru_del(c, e);
		entry_release(c, e);
	}
}

static void evict_over_bound(struct tfab_mr_cache *c)
{
	while (c->st.entries > c->max_entries && c->lru_head) {
		entry_unlink(c, c->lru_head);
		c->st.evictions++;
	}
}

int tfab__mr_cache_create(const struct tfab_provider_ops *ops, struct tfab_ep *ep,
			  size_t max_entries, struct tfab_mr_cache **cache_p)
{
	struct tfab_mr_cache *c;
	long pg;

	if (!ops || !ops->mr_reg || !ops->mr_dereg || !cache_p)
		return -EINVAL;
	pg = sysconf(_SC_PAGESIZE);
	if (pg <= 0 || (pg & (pg - 1)))
		pg = 4096;
	c = calloc(1, sizeof(*c));
	if (!c)
		goto err_cache;
	c->nbuckets = 64;
	c->buckets = calloc(c->nbuckets, sizeof(*c->buckets));
	if (!c->buckets)
		goto err_buckets;
	c->ops = ops;
	c->ep = ep;
	c->max_entries = max_entries;
	c->page_mask = (uintptr_t)pg - 1;
	*cache_p = c;
	return 0;

err_buckets:
	free(c);
err_cache:
	return -ENOMEM;
}

int tfab__mr_cache_destroy(struct tfab_mr_cache *c)
{
	struct mrc_entry *e, *next;
	size_t i;

	if (!c)
		return 0;
	for (i = 0; i < c->nbuckets; i++)
		for (e = c->buckets[i]; e; e = e->hnext)
			if (e->refs)
				return -EBUSY;
	for (i = 0; i < c->nbuckets; i++) {
		for (e = c->buckets[i]; e; e = next) {
			next = e->hnext;
			if (c->ops->mr_dereg(e->mr))
				TFAB_WARN(SUBSYS, "deregistering %zu bytes failed",
					  (size_t)(e->end - e->start));
			free(e);
		}
	}
	free(c->buckets);
	free(c);
	return 0;
}

static struct mrc_entry *lookup(struct tfab_mr_cache *c, uintptr_t a, uintptr_t b, unsigned access)
{
	struct mrc_entry *e;

	for (unsigned m = 0; m < NTREES; m++) {
		if ((m & access) != access)
			continue;
		e = tree_find_containing(c->root[m], a, b);
		if (e)
			return e;
	}
	return NULL;
}

int tfab__mr_cache_get(struct tfab_mr_cache *c, void *addr, size_t len, unsigned access,
		       struct tfab_mr **mr_p)
{
	uintptr_t a = (uintptr_t)addr, b, start, end;
	struct mrc_entry *e;
	unsigned want;
	int rc;

	if (!c || !addr || !len || (access & ~(unsigned)ACCESS_ALL) || !mr_p)
		return -EINVAL;
	if (len > UINTPTR_MAX - a)
		return -EINVAL;
	b = a + len;

	e = lookup(c, a, b, access);
	if (e) {
		if (e->refs++ == 0)
			lru_del(c, e);
		c->st.hits++;
		*mr_p = e->mr;
		return 0;
	}

	start = a & ~c->page_mask;
	if (b > UINTPTR_MAX - c->page_mask)
		return -EINVAL;
	end = (b + c->page_mask) & ~c->page_mask;
	want = c->access_union | access;

	e = calloc(1, sizeof(*e));
	if (!e) {
		rc = -ENOMEM;
		goto err_entry;
	}
	rc = hash_reserve(c);
	if (rc)
		goto err_hash;
	rc = c->ops->mr_reg(c->ep, (void *)start, end - start, want, &e->mr);
	if (rc)
		goto err_reg;

	e->start = start;
	e->end = end;
	e->access = want;
	e->refs = 1;
	e->live = true;
	c->root[want] = tree_insert(c->root[want], e);
	hash_add(c, e);
	c->access_union = want;
	c->st.misses++;
	c->st.registrations++;
	c->st.entries++;
	evict_over_bound(c);
	*mr_p = e->mr;
	return 0;

err_reg:
err_hash:
	free(e);
err_entry:
	return rc;
}

void tfab__mr_cache_put(struct tfab_mr_cache *c, struct tfab_mr *mr)
{
	struct mrc_entry *e;

	if (!c || !mr)
		return;
	e = hash_find(c, mr);
	if (!e || e->refs == 0) {
		TFAB_ERROR(SUBSYS, "put of a registration that is not in use (%p)", (void *)mr);
		return;
	}
	if (--e->refs)
		return;
	if (!e->live) {
		entry_release(c, e);
		return;
	}
	lru_append(c, e);
	evict_over_bound(c);
}

int tfab__mr_cache_invalidate(struct tfab_mr_cache *c, const void *addr, size_t len)
{
	uintptr_t a = (uintptr_t)addr, b;
	struct mrc_entry *e;
	int n = 0;

	if (!c || !len)
		return 0;
	b = len > UINTPTR_MAX - a ? UINTPTR_MAX : a + len;
	for (unsigned m = 0; m < NTREES; m++) {
		while ((e = tree_find_overlapping(c->root[m], a, b))) {
			entry_unlink(c, e);
			n++;
		}
	}
	return n;
}

void tfab__mr_cache_get_stats(const struct tfab_mr_cache *c, struct tfab_mr_cache_stats *s)
{
	if (!c) {
		*s = (struct tfab_mr_cache_stats){0};
		return;
	}
	*s = c->st;
}
