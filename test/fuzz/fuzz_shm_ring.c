/*
 * The shm backend's target reading its writers' ring entries (providers/shm/rx.c,
 * tfab_shm_entry_take), which another process writes: a ring whose tail, entries and
 * sequence words come from the input (fuzz_shm_ring.h), taken as rx_slot takes one writer's
 * slot, against a table of two registrations of one region. Properties: no access outside
 * the ring, the bounce buffers and the region; an entry spans 1 to 5 entries; a write lands
 * only when it is accepted, only inside the writable registration, and with exactly the bytes
 * the writer gave (the inline bytes, or the bounce buffer's); nothing else in the region
 * changes; a refusal is written back into the entry and reports no event; the continuation
 * entries taken are no longer published.
 */
#include <string.h>

#include <tfab/status.h>

#include "fuzz.h"
#include "fuzz_shm_ring.h"
#include "providers/shm/internal.h"

static struct tfab_shm_reg regs[TFAB_SHM_NREGS];
static uint8_t bounce[TFAB_SHM_NBOUNCE][TFAB_SHM_BOUNCE_SIZE];
static struct tfab_shm_ring ring;
static uint8_t *region, shadow[FUZZ_SHM_REGION], bytes[TFAB_SHM_INLINE_MAX];

static void reg_set(uint64_t key, uint32_t access)
{
	struct tfab_shm_reg *r = &regs[key & (TFAB_SHM_NREGS - 1)];

	atomic_store(&r->addr, (uint64_t)(uintptr_t)region);
	atomic_store(&r->len, FUZZ_SHM_REGION);
	atomic_store(&r->access, access);
	atomic_store(&r->key, key);
}

static void setup(void)
{
	/* on the heap, of its exact size: a sanitizer sees a write past it */
	region = malloc(FUZZ_SHM_REGION);
	FUZZ_CHECK(region != NULL);
	reg_set(FUZZ_SHM_KEY_W, TFAB_MR_REMOTE_WRITE | TFAB_MR_LOCAL_WRITE);
	reg_set(FUZZ_SHM_KEY_RO, TFAB_MR_LOCAL_WRITE);
	for (unsigned b = 0; b < TFAB_SHM_NBOUNCE; b++)
		for (size_t k = 0; k < TFAB_SHM_BOUNCE_SIZE; k++)
			bounce[b][k] = (uint8_t)(b * 77 + k * 13 + (k >> 8));
}

static uint64_t get_le64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* The ring as the input describes it; returns its tail. */
static uint64_t ring_load(const uint8_t *data, size_t size, bool *failed)
{
	uint64_t tail = get_le64(data);
	size_t nent = (size - FUZZ_SHM_HDR + TFAB_SHM_ENTRY_SIZE - 1) / TFAB_SHM_ENTRY_SIZE;

	memset(&ring, 0, sizeof(ring));
	*failed = data[8] & 1;
	if (nent > TFAB_SHM_RING_N)
		nent = TFAB_SHM_RING_N;
	for (size_t k = 0; k < nent; k++) {
		struct tfab_shm_entry *e = tfab_shm_ring_at(&ring, tail + k);
		size_t off = FUZZ_SHM_HDR + k * TFAB_SHM_ENTRY_SIZE;
		size_t n = size - off < TFAB_SHM_ENTRY_SIZE ? size - off : TFAB_SHM_ENTRY_SIZE;
		uint64_t seq;

		memcpy((void *)e, data + off, n);
		e->raddr += (uint64_t)(uintptr_t)region;
		seq = atomic_load_explicit(&e->seq, memory_order_relaxed);
		if (seq & 1)
			atomic_store_explicit(&e->seq, tail + k + 1, memory_order_relaxed);
	}
	atomic_store_explicit(&ring.tail, tail, memory_order_relaxed);
	return tail;
}

/*
 * Entry i as it was before the take (*e), and what it asks the target to land (its inline
 * bytes, or its bounce buffer's), into *src_p; NULL for a direct write (the writer placed it).
 */
static void before_take(uint64_t i, struct tfab_shm_entry *e, const uint8_t **src_p)
{
	memcpy(e, (const void *)tfab_shm_ring_at(&ring, i), sizeof(*e));
	*src_p = NULL;
	if (e->kind == TFAB_SHM_E_INLINE && e->len <= TFAB_SHM_INLINE_MAX) {
		tfab_shm_ring_get_inline(&ring, i, bytes, e->len);
		*src_p = bytes;
	} else if (e->kind == TFAB_SHM_E_BOUNCE) {
		*src_p = bounce[e->bounce % TFAB_SHM_NBOUNCE];
	}
}

static void check_take(uint64_t i, const struct tfab_shm_entry *e, const uint8_t *src,
		       const struct tfab_shm_taken *t)
{
	uint64_t base = (uint64_t)(uintptr_t)region, off = t->raddr - base;

	FUZZ_CHECK(t->nent >= 1 && t->nent <= tfab_shm_inline_entries(TFAB_SHM_INLINE_MAX));
	FUZZ_CHECK(t->nent == 1 || e->kind == TFAB_SHM_E_INLINE);
	FUZZ_CHECK(t->status == 0 || t->status == -TFAB_ERR_REMOTE_ACCESS ||
		   t->status == -TFAB_ERR_PROTOCOL);
	FUZZ_CHECK(!t->report || t->status == 0);
	FUZZ_CHECK(t->raddr == e->raddr && t->rkey == e->rkey && t->claimed == e->len);
	/* the verdict, back in the entry; continuation entries no longer published */
	FUZZ_CHECK(tfab_shm_ring_at(&ring, i)->status == (t->status ? t->status : e->status));
	for (unsigned k = 1; k < t->nent; k++)
		FUZZ_CHECK(atomic_load(&tfab_shm_ring_at(&ring, i + k)->seq) == 0);
	if (t->status)
		return;
	/* accepted: inside the writable registration, and the bytes are the writer's */
	FUZZ_CHECK(t->rkey == FUZZ_SHM_KEY_W && t->raddr >= base && t->claimed <= FUZZ_SHM_REGION &&
		   off <= FUZZ_SHM_REGION - t->claimed);
	FUZZ_CHECK(e->kind != TFAB_SHM_E_INLINE || (src && t->len == t->claimed));
	if (!src)
		return;
	FUZZ_CHECK(memcmp(region + off, src, t->claimed) == 0);
	memcpy(shadow + off, src, t->claimed);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	bool failed;
	uint64_t tail;

	fuzz_quiet();
	if (!region)
		setup();
	if (size < FUZZ_SHM_HDR)
		return 0;
	tail = ring_load(data, size, &failed);
	memset(region, 0, FUZZ_SHM_REGION);
	memset(shadow, 0, sizeof(shadow));
	/* As rx_slot: while the entry at the tail is published, at most one lap. */
	for (unsigned taken = 0; taken < TFAB_SHM_RING_N && tfab_shm_ring_peek(&ring, tail);) {
		struct tfab_shm_entry e;
		struct tfab_shm_taken t;
		const uint8_t *src;

		before_take(tail, &e, &src);
		tfab_shm_entry_take(&ring, tail, regs, bounce, &failed, &t);
		check_take(tail, &e, src, &t);
		tail += t.nent;
		taken += t.nent;
	}
	/* nothing landed where no accepted write went */
	FUZZ_CHECK(memcmp(region, shadow, FUZZ_SHM_REGION) == 0);
	return 0;
}
