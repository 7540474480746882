/*
 * The shm backend's control ring: one lock-free single-producer/single-consumer ring per
 * (writer, target endpoint) pair, living in the target's shared control segment. The writer
 * produces entries (one per write, or per chunk of a bounced write); the target consumes them
 * in its poll, checks each against its registration table, lands inline bytes, writes a
 * refusal back into the entry, and moves the tail past it. The writer reads the tail to learn
 * which entries were taken (its WRITE_DONE) and their verdicts (its ERROR events).
 *
 * No system call and no lock: an entry is published by a release store of its sequence number
 * (index + 1), seen by an acquire load of it, and the tail goes back the same way. An inline
 * write of up to 16 bytes lies wholly in the entry's first cache line (the header's), so an
 * 8-byte write is one line transfer. A head entry's sequence number names its lap, so an
 * earlier lap's never passes for it; continuation entries hold raw bytes where a sequence
 * word would be, so the consumer zeroes theirs as it takes them. The consumer writes into a
 * head entry only a refusal (the writer clears the verdict as it fills the entry): the line
 * goes back to the writer as it left it.
 */
#ifndef TFAB_SHM_RING_H
#define TFAB_SHM_RING_H

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#define TFAB_SHM_ENTRY_SIZE 256u
#define TFAB_SHM_RING_N 256u /* entries per ring: a power of two */
#define TFAB_SHM_HDR_SIZE 48u
#define TFAB_SHM_INLINE_HEAD (TFAB_SHM_ENTRY_SIZE - TFAB_SHM_HDR_SIZE)
/*
 * Longest write carried in the ring itself (and the inject size): the engine's control
 * messages (at most 1 KiB) travel inline, with no system call and no mapping. Bytes past the
 * head entry's room continue through the following whole entries.
 */
#define TFAB_SHM_INLINE_MAX 1024u

enum tfab_shm_entry_kind {
	TFAB_SHM_E_INLINE = 1, /* bytes in the entry (and continuation entries): consumer copies */
	TFAB_SHM_E_DIRECT,     /* bytes already placed by the writer (shared segment, CMA) */
	TFAB_SHM_E_BOUNCE,     /* one chunk in a bounce buffer of the slot: consumer copies */
};

enum {
	TFAB_SHM_F_LAST = 1u << 0, /* bounce: the write's last chunk (carries its immediate) */
};

struct tfab_shm_entry {
	_Atomic uint64_t seq; /* index + 1 once published; 0 once taken */
	uint8_t kind;
	uint8_t flags;
	uint16_t ncont; /* inline: whole entries of continuation bytes that follow */
	uint32_t imm;
	uint64_t raddr;
	uint64_t rkey;
	uint64_t len;	 /* bytes this entry lands (inline, one chunk, or the direct write) */
	int32_t status;	 /* the consumer's verdict: 0 or a negative status */
	uint32_t bounce; /* bounce: which buffer of the slot */
	/*
	 * Inline bytes start in the header's cache line: a write of up to 16 bytes (an 8-byte
	 * tensor's content, a credit) is one line.
	 */
	union {
		uint64_t total; /* bounce: bytes of the whole write, reported with the last chunk */
		uint8_t data[TFAB_SHM_INLINE_HEAD]; /* inline */
	};
};

_Static_assert(sizeof(struct tfab_shm_entry) == TFAB_SHM_ENTRY_SIZE, "entry size");
_Static_assert(offsetof(struct tfab_shm_entry, data) == TFAB_SHM_HDR_SIZE, "entry header");

struct tfab_shm_ring {
	_Alignas(64) _Atomic uint64_t tail; /* consumer: entries [0, tail) are taken */
	uint8_t pad[56];
	struct tfab_shm_entry e[TFAB_SHM_RING_N];
};

static inline struct tfab_shm_entry *tfab_shm_ring_at(struct tfab_shm_ring *r, uint64_t i)
{
	return &r->e[i & (TFAB_SHM_RING_N - 1)];
}

/* Entries a write of len inline bytes takes. */
static inline unsigned tfab_shm_inline_entries(size_t len)
{
	if (len <= TFAB_SHM_INLINE_HEAD)
		return 1;
	return 1 + (unsigned)((len - TFAB_SHM_INLINE_HEAD + TFAB_SHM_ENTRY_SIZE - 1) /
			      TFAB_SHM_ENTRY_SIZE);
}

/* Producer: room for n more entries, given its head and the tail it last read. */
static inline int tfab_shm_ring_room(uint64_t head, uint64_t acked, unsigned n)
{
	return head - acked + n <= TFAB_SHM_RING_N;
}

/* Producer: inline bytes into entry i and its continuation entries (ncont set here). */
static inline void tfab_shm_ring_put_inline(struct tfab_shm_ring *r, uint64_t i, const void *src,
					    size_t len)
{
	struct tfab_shm_entry *e = tfab_shm_ring_at(r, i);
	const uint8_t *p = src;
	size_t n = len < TFAB_SHM_INLINE_HEAD ? len : TFAB_SHM_INLINE_HEAD;

	memcpy(e->data, p, n);
	e->ncont = (uint16_t)(tfab_shm_inline_entries(len) - 1);
	for (uint64_t k = 1; n < len; k++) {
		size_t m = len - n < TFAB_SHM_ENTRY_SIZE ? len - n : TFAB_SHM_ENTRY_SIZE;

		memcpy((void *)tfab_shm_ring_at(r, i + k), p + n, m);
		n += m;
	}
}

/* Producer: make entry i visible; everything written to it (and before it) goes with it. */
static inline void tfab_shm_ring_publish(struct tfab_shm_ring *r, uint64_t i)
{
	atomic_store_explicit(&tfab_shm_ring_at(r, i)->seq, i + 1, memory_order_release);
}

/* Producer: how far the consumer has taken. */
static inline uint64_t tfab_shm_ring_tail(struct tfab_shm_ring *r)
{
	return atomic_load_explicit(&r->tail, memory_order_acquire);
}

/* Consumer: the entry at its tail if published, else NULL. */
static inline struct tfab_shm_entry *tfab_shm_ring_peek(struct tfab_shm_ring *r, uint64_t tail)
{
	struct tfab_shm_entry *e = tfab_shm_ring_at(r, tail);

	if (atomic_load_explicit(&e->seq, memory_order_acquire) != tail + 1)
		return NULL;
	return e;
}

/* Consumer: inline bytes of the entry at i into dst. */
static inline void tfab_shm_ring_get_inline(struct tfab_shm_ring *r, uint64_t i, void *dst,
					    size_t len)
{
	struct tfab_shm_entry *e = tfab_shm_ring_at(r, i);
	uint8_t *p = dst;
	size_t n = len < TFAB_SHM_INLINE_HEAD ? len : TFAB_SHM_INLINE_HEAD;

	memcpy(p, e->data, n);
	for (uint64_t k = 1; n < len; k++) {
		size_t m = len - n < TFAB_SHM_ENTRY_SIZE ? len - n : TFAB_SHM_ENTRY_SIZE;

		memcpy(p + n, (const void *)tfab_shm_ring_at(r, i + k), m);
		n += m;
	}
}

/*
 * Consumer: the entry at i (and its n - 1 continuation entries) is taken with this verdict,
 * written only where it is a refusal (the writer published it as 0). Zeroing the
 * continuation entries' sequence words keeps their bytes from looking published on the next
 * lap; the caller then moves the tail with tfab_shm_ring_release, once per batch.
 */
static inline void tfab_shm_ring_take(struct tfab_shm_ring *r, uint64_t i, unsigned n,
				      int32_t status)
{
	if (status)
		tfab_shm_ring_at(r, i)->status = status;
	for (unsigned k = 1; k < n; k++)
		atomic_store_explicit(&tfab_shm_ring_at(r, i + k)->seq, 0, memory_order_relaxed);
}

static inline void tfab_shm_ring_release(struct tfab_shm_ring *r, uint64_t tail)
{
	atomic_store_explicit(&r->tail, tail, memory_order_release);
}

#endif
