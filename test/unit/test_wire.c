/*
 * Unit tests for the wire protocol (lib/engine/wire.c against doc/protocol.md): round trips of
 * the connection blob and every message type, byte layouts pinned by hand-written arrays,
 * every rejection rule of the decoders and encoders, truncation at every length, a fixed-seed
 * fuzz loop, and the immediate helpers.
 *
 * Inputs to the decoders are copied into buffers of exactly the length given, so that a read
 * past the end shows up under valgrind or ASan.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <tfab/status.h>

#include "engine/wire.h"

#define SLOT 1024
#define FUZZ_MSG_ITERS 200000
#define FUZZ_BLOB_ITERS 50000
#define FUZZ_RANDOM_ITERS 100000

/* ---- Helpers ---- */

static uint64_t rng_state;

static uint64_t rng(void)
{
	/* splitmix64: fixed seed, same sequence everywhere. */
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static size_t rng_below(size_t n)
{
	return n ? (size_t)(rng() % n) : 0;
}

/* An exact-size heap copy, so that overreads are caught; never NULL. */
static uint8_t *dup_exact(const void *src, size_t len)
{
	uint8_t *p = malloc(len ? len : 1);

	assert_non_null(p);
	if (len)
		memcpy(p, src, len);
	return p;
}

/*
 * A decoded message points into the copy it was decoded from, so the copies of the last few
 * decodes are kept alive; older ones are freed as new ones are made.
 */
#define KEEP 4
static uint8_t *kept[KEEP];
static size_t kept_next;

static uint8_t *dup_kept(const void *src, size_t len)
{
	uint8_t *p = dup_exact(src, len);

	free(kept[kept_next]);
	kept[kept_next] = p;
	kept_next = (kept_next + 1) % KEEP;
	return p;
}

static int release_kept(void **state)
{
	(void)state;
	for (size_t i = 0; i < KEEP; i++) {
		free(kept[i]);
		kept[i] = NULL;
	}
	return 0;
}

static int decode_exact(const void *buf, size_t len, struct tfab_wire_msg *m)
{
	return tfab__wire_msg_decode(dup_kept(buf, len), len, m);
}

static int blob_decode_exact(const void *buf, size_t len, struct tfab_wire_blob *b)
{
	return tfab__wire_blob_decode(dup_kept(buf, len), len, b);
}

/* A decode that fails must return exactly rc and leave the output alone. */
static void expect_msg_reject(const void *buf, size_t len, int rc)
{
	struct tfab_wire_msg m, before;

	memset(&m, 0xa5, sizeof(m));
	before = m;
	assert_int_equal(decode_exact(buf, len, &m), rc);
	assert_memory_equal(&m, &before, sizeof(m));
}

static void expect_blob_reject(const void *buf, size_t len, int rc)
{
	struct tfab_wire_blob b, before;

	memset(&b, 0xa5, sizeof(b));
	before = b;
	assert_int_equal(blob_decode_exact(buf, len, &b), rc);
	assert_memory_equal(&b, &before, sizeof(b));
}

static uint64_t elems_of(const struct tfab_wire_meta *mt)
{
	uint64_t n = 1;

	for (unsigned i = 0; i < mt->ndim; i++)
		n *= (uint64_t)mt->shape[i];
	return n;
}

/* float32 (or another byte-sized dtype) with a small shape of ndim dims. */
static void make_meta(struct tfab_wire_meta *mt, unsigned ndim, bool dead)
{
	memset(mt, 0, sizeof(*mt));
	mt->dtype_code = 2;
	mt->dtype_bits = 32;
	mt->dtype_lanes = 1;
	mt->is_dead = dead;
	mt->ndim = (uint8_t)ndim;
	for (unsigned i = 0; i < ndim; i++)
		mt->shape[i] = (int64_t)(i % 3) + 1;
	mt->nbytes = elems_of(mt) * 4;
}

static bool has_meta(const struct tfab_wire_msg *m)
{
	return m->type == TFAB_MSG_META_DATA ||
	       (m->type == TFAB_MSG_TENSOR_REQUEST && (m->flags & TFAB_MSGF_META_VALID));
}

/* Every field the message's type carries. */
static void assert_msg_equal(const struct tfab_wire_msg *a, const struct tfab_wire_msg *b)
{
	assert_int_equal(a->type, b->type);
	assert_int_equal(a->flags, b->flags);
	assert_int_equal(a->seq, b->seq);
	assert_int_equal(a->req_index, b->req_index);
	if (a->type == TFAB_MSG_TENSOR_REQUEST) {
		assert_true(a->step_id == b->step_id);
		assert_true(a->dest_raddr == b->dest_raddr);
		assert_true(a->dest_rkey == b->dest_rkey);
		assert_true(a->dest_capacity == b->dest_capacity);
		assert_int_equal(a->key_len, b->key_len);
		if (a->key_len)
			assert_memory_equal(a->key, b->key, a->key_len);
		if (a->flags & TFAB_MSGF_KEY_INDEX)
			assert_int_equal(a->key_index, b->key_index);
		assert_int_equal(a->nahead, b->nahead);
		for (unsigned i = 0; i < a->nahead; i++) {
			struct tfab_wire_ahead x = tfab__wire_ahead_at(a, i);
			struct tfab_wire_ahead y = tfab__wire_ahead_at(b, i);

			assert_int_equal(x.req_index, y.req_index);
			assert_true(x.dest_raddr == y.dest_raddr);
			assert_true(x.dest_rkey == y.dest_rkey);
		}
	}
	if (has_meta(a)) {
		assert_true(tfab__wire_meta_equal(&a->meta, &b->meta));
		assert_true(tfab__wire_meta_equal(&b->meta, &a->meta));
	}
	if (a->type == TFAB_MSG_ERROR) {
		assert_int_equal(a->status, b->status);
		assert_int_equal(a->errmsg_len, b->errmsg_len);
		if (a->errmsg_len)
			assert_memory_equal(a->errmsg, b->errmsg, a->errmsg_len);
	}
	if (a->type == TFAB_MSG_COLL_DATA) {
		assert_true(a->step_id == b->step_id);
		assert_int_equal(a->key_index, b->key_index);
		assert_int_equal(a->coll_tag, b->coll_tag);
		assert_int_equal(a->data_len, b->data_len);
		if (a->data_len)
			assert_memory_equal(a->data, b->data, a->data_len);
	}
	if (a->type == TFAB_MSG_TAKEN || a->type == TFAB_MSG_RETIRE) {
		assert_int_equal(a->ntaken, b->ntaken);
		for (unsigned i = 0; i < a->ntaken; i++)
			assert_int_equal(tfab__wire_taken_at(a, i), tfab__wire_taken_at(b, i));
	}
}

/* Encode, check the length, decode from an exact buffer and compare; returns the length. */
static size_t msg_round_trip(const struct tfab_wire_msg *m, size_t expect_len)
{
	uint8_t slot[SLOT];
	struct tfab_wire_msg d;
	size_t len = 0;
	uint8_t *p;

	assert_int_equal(tfab__wire_msg_encode(m, slot, sizeof(slot), &len), 0);
	assert_int_equal(len, expect_len);
	/* The payload length in the header is the whole less the header. */
	assert_int_equal(slot[4] | slot[5] << 8 | slot[6] << 16 | (uint32_t)slot[7] << 24,
			 len - TFAB_WIRE_MSG_HDR);

	p = dup_exact(slot, len);
	assert_int_equal(tfab__wire_msg_decode(p, len, &d), 0);
	assert_msg_equal(m, &d);
	/* Pointers point into the slot. */
	if (m->type == TFAB_MSG_TENSOR_REQUEST && m->key_len)
		assert_true(d.key > p && d.key + d.key_len <= p + len);
	if (m->type == TFAB_MSG_ERROR)
		assert_true((const uint8_t *)d.errmsg >= p &&
			    (const uint8_t *)d.errmsg + d.errmsg_len <= p + len);
	free(p);

	/* Stale bytes after the message in a bigger slot do not matter. */
	memset(slot + len, 0xee, sizeof(slot) - len);
	assert_int_equal(tfab__wire_msg_decode(slot, sizeof(slot), &d), 0);
	assert_msg_equal(m, &d);
	return len;
}

/* A little-endian writer for hand-built, possibly invalid, encodings. */
struct raw {
	uint8_t b[8192];
	size_t n;
};

static void raw_le(struct raw *r, uint64_t v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		r->b[r->n++] = (uint8_t)(v >> (8 * i));
}

static void raw_fill(struct raw *r, uint8_t c, size_t n)
{
	memset(r->b + r->n, c, n);
	r->n += n;
}

static void raw_hdr(struct raw *r, uint8_t type, uint16_t flags)
{
	r->n = 0;
	raw_le(r, TFAB_WIRE_VERSION, 1);
	raw_le(r, type, 1);
	raw_le(r, flags, 2);
	raw_le(r, 0, 4); /* length, set by raw_fix_len */
	raw_le(r, 42, 4);
	raw_le(r, 0, 2); /* more */
	raw_le(r, 0, 2);
}

static void raw_fix_len(struct raw *r)
{
	uint32_t len = (uint32_t)(r->n - TFAB_WIRE_MSG_HDR);

	for (int i = 0; i < 4; i++)
		r->b[4 + i] = (uint8_t)(len >> (8 * i));
}

static void raw_meta(struct raw *r, uint8_t code, uint8_t bits, uint16_t lanes, uint8_t dead,
		     uint8_t ndim, uint64_t nbytes, const int64_t *shape)
{
	raw_le(r, code, 1);
	raw_le(r, bits, 1);
	raw_le(r, lanes, 2);
	raw_le(r, dead, 1);
	raw_le(r, ndim, 1);
	raw_le(r, 0, 2);
	raw_le(r, nbytes, 8);
	for (unsigned i = 0; i < ndim; i++)
		raw_le(r, (uint64_t)shape[i], 8);
}

/* A TENSOR_REQUEST up to the key, with key_len and that many key bytes. */
static void raw_request(struct raw *r, uint16_t flags, uint16_t key_len)
{
	raw_hdr(r, TFAB_MSG_TENSOR_REQUEST, flags);
	raw_le(r, 7, 4);
	raw_le(r, 100, 8);
	raw_le(r, 0x10000, 8);
	raw_le(r, 0x55, 8);
	raw_le(r, 4096, 8);
	raw_le(r, key_len, 2);
	raw_fill(r, 'k', key_len);
}

static void raw_meta_data(struct raw *r)
{
	raw_hdr(r, TFAB_MSG_META_DATA, 0);
	raw_le(r, 7, 4);
}

/* ---- Connection blob ---- */

/* The largest blob: the largest host and the most paths, each with its longest name and address. */
#define BLOB_MAX                                   \
	(TFAB_WIRE_BLOB_HDR + TFAB_WIRE_MAX_HOST + \
	 TFAB_WIRE_MAX_PATHS *                     \
	     (TFAB_WIRE_PATH_HDR + TFAB_WIRE_MAX_PATH_NAME + TFAB_WIRE_MAX_ADDR))

/* Offsets in the header and in a path entry. */
enum {
	B_VERSION = 4,
	B_NPATHS = 6,
	B_SLOTS = 8,
	B_SIZE = 12,
	B_PEER = 16,
	B_HOST_LEN = 20,
	B_RESERVED = 22,
	P_NAME_LEN = 0,
	P_FLAGS = 1,
	P_ADDR_LEN = 2,
};

/* Pinned against the tables in doc/protocol.md, "Connecting two peers". */
static const uint8_t blob_bytes[] = {
    /* header */
    0x54, 0x46, 0x41, 0x42,	  /* magic "TFAB" */
    0x07, 0x00,			  /* version */
    0x02, 0x00,			  /* npaths */
    0x40, 0x00, 0x00, 0x00,	  /* ring_slots 64 */
    0x00, 0x04, 0x00, 0x00,	  /* slot_size 1024 */
    0xde, 0xbc, 0x0a, 0x00,	  /* peer_id 0xabcde */
    0x05, 0x00,			  /* host_len */
    0x00, 0x00,			  /* reserved */
    0x68, 0x6f, 0x73, 0x74, 0x31, /* host "host1" */
    /* path 0 */
    0x03,					    /* name_len */
    0x01,					    /* flags: same host only */
    0x02, 0x00,					    /* addr_len */
    0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, /* ring_raddr */
    0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, /* ring_rkey */
    0x73, 0x68, 0x6d,				    /* name "shm" */
    0xaa, 0xbb,					    /* addr */
    /* path 1 */
    0x07,					    /* name_len */
    0x00,					    /* flags */
    0x03, 0x00,					    /* addr_len */
    0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* ring_raddr 0x1000 */
    0xdd, 0xcc, 0xbb, 0xaa, 0x00, 0x00, 0x00, 0x00, /* ring_rkey 0xaabbccdd */
    0x6f, 0x66, 0x69, 0x3a, 0x74, 0x63, 0x70,	    /* name "ofi:tcp" */
    0xde, 0xad, 0xbe,				    /* addr */
};

/* Where blob_bytes' path entries begin. */
#define PATH0 (TFAB_WIRE_BLOB_HDR + 5)
#define PATH1 (PATH0 + TFAB_WIRE_PATH_HDR + 3 + 2)

/* A version 1 blob: addr_len, ring_raddr, ring_rkey, ring_slots, slot_size, peer_id, addr. */
static const uint8_t v1_blob_bytes[] = {
    0x54, 0x46, 0x41, 0x42,			    /* magic "TFAB" */
    0x01, 0x00,					    /* version */
    0x03, 0x00,					    /* addr_len */
    0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, /* ring_raddr */
    0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, /* ring_rkey */
    0x40, 0x00, 0x00, 0x00,			    /* ring_slots 64 */
    0x00, 0x04, 0x00, 0x00,			    /* slot_size 1024 */
    0xde, 0xbc, 0x0a, 0x00,			    /* peer_id 0xabcde */
    0x00, 0x00, 0x00, 0x00,			    /* reserved */
    0xde, 0xad, 0xbe,				    /* addr */
};

static const uint8_t shm_addr[2] = {0xaa, 0xbb};
static const uint8_t tcp_addr[3] = {0xde, 0xad, 0xbe};

/* The blob of blob_bytes. */
static void sample_blob(struct tfab_wire_blob *b)
{
	memset(b, 0, sizeof(*b));
	b->ring_slots = 64;
	b->slot_size = 1024;
	b->peer_id = 0xabcde;
	b->host_len = 5;
	b->host = "host1";
	b->npaths = 2;
	b->paths[0].ring_raddr = 0x1122334455667788ull;
	b->paths[0].ring_rkey = 0x0102030405060708ull;
	b->paths[0].name_len = 3;
	b->paths[0].same_host = true;
	b->paths[0].addr_len = sizeof(shm_addr);
	b->paths[0].name = "shm";
	b->paths[0].addr = shm_addr;
	b->paths[1].ring_raddr = 0x1000;
	b->paths[1].ring_rkey = 0xaabbccdd;
	b->paths[1].name_len = 7;
	b->paths[1].same_host = false;
	b->paths[1].addr_len = sizeof(tcp_addr);
	b->paths[1].name = "ofi:tcp";
	b->paths[1].addr = tcp_addr;
}

/* The bytes the blob encodes to. */
static size_t blob_len(const struct tfab_wire_blob *b)
{
	size_t n = TFAB_WIRE_BLOB_HDR + b->host_len;

	for (unsigned i = 0; i < b->npaths; i++)
		n += TFAB_WIRE_PATH_HDR + b->paths[i].name_len + b->paths[i].addr_len;
	return n;
}

/* Every field of the header and of each path, in order; contents by value. */
static void assert_blob_equal(const struct tfab_wire_blob *a, const struct tfab_wire_blob *b)
{
	assert_int_equal(a->ring_slots, b->ring_slots);
	assert_int_equal(a->slot_size, b->slot_size);
	assert_int_equal(a->peer_id, b->peer_id);
	assert_int_equal(a->host_len, b->host_len);
	if (a->host_len)
		assert_memory_equal(a->host, b->host, a->host_len);
	assert_int_equal(a->npaths, b->npaths);
	for (unsigned i = 0; i < a->npaths; i++) {
		const struct tfab_wire_path *x = &a->paths[i], *y = &b->paths[i];

		assert_true(x->ring_raddr == y->ring_raddr);
		assert_true(x->ring_rkey == y->ring_rkey);
		assert_int_equal(x->same_host, y->same_host);
		assert_int_equal(x->name_len, y->name_len);
		assert_memory_equal(x->name, y->name, x->name_len);
		assert_int_equal(x->addr_len, y->addr_len);
		assert_memory_equal(x->addr, y->addr, x->addr_len);
	}
}

static bool points_into(const void *p, size_t n, const uint8_t *buf, size_t len)
{
	const uint8_t *q = p;

	return q >= buf && q <= buf + len && n <= (size_t)(buf + len - q);
}

/* Decoded pointers point into the input, at their own bytes. */
static void assert_blob_within(const struct tfab_wire_blob *d, const uint8_t *buf, size_t len)
{
	if (d->host_len)
		assert_true(points_into(d->host, d->host_len, buf, len));
	for (unsigned i = 0; i < d->npaths; i++) {
		assert_true(points_into(d->paths[i].name, d->paths[i].name_len, buf, len));
		assert_true(points_into(d->paths[i].addr, d->paths[i].addr_len, buf, len));
	}
}

/* Encode (into exactly the room it needs, too), decode from an exact copy, compare. */
static void blob_round_trip(const struct tfab_wire_blob *b)
{
	static uint8_t buf[BLOB_MAX + 16];
	struct tfab_wire_blob d;
	size_t len = 0, len2 = 0;
	uint8_t *p;

	assert_int_equal(tfab__wire_blob_encode(b, buf, sizeof(buf), &len), 0);
	assert_int_equal(len, blob_len(b));
	p = dup_exact(buf, len);
	assert_int_equal(tfab__wire_blob_encode(b, p, len, &len2), 0);
	assert_int_equal(len2, len);
	assert_memory_equal(p, buf, len);

	assert_int_equal(tfab__wire_blob_decode(p, len, &d), 0);
	assert_blob_equal(b, &d);
	assert_blob_within(&d, p, len);
	free(p);
}

static void test_blob_known_bytes(void **state)
{
	struct tfab_wire_blob b, d;
	uint8_t buf[128];
	size_t len = 0;

	(void)state;
	assert_int_equal(sizeof(blob_bytes),
			 TFAB_WIRE_BLOB_HDR + 5 + 2 * TFAB_WIRE_PATH_HDR + 3 + 2 + 7 + 3);
	assert_int_equal(PATH1 + TFAB_WIRE_PATH_HDR + 7 + 3, sizeof(blob_bytes));
	assert_memory_equal(blob_bytes, "TFAB", 4);
	sample_blob(&b);
	/* Paths past npaths are not looked at. */
	memset(&b.paths[2], 0, 2 * sizeof(b.paths[0]));
	b.paths[3].name_len = 200;
	assert_int_equal(tfab__wire_blob_encode(&b, buf, sizeof(buf), &len), 0);
	assert_int_equal(len, sizeof(blob_bytes));
	assert_memory_equal(buf, blob_bytes, sizeof(blob_bytes));

	assert_int_equal(blob_decode_exact(blob_bytes, sizeof(blob_bytes), &d), 0);
	assert_blob_equal(&b, &d);
	assert_true(d.paths[0].same_host);
	assert_false(d.paths[1].same_host);
	assert_memory_equal(d.paths[1].name, "ofi:tcp", 7);
}

static void test_blob_round_trip(void **state)
{
	static const uint16_t host_lens[] = {0, 1, 64, TFAB_WIRE_MAX_HOST};
	static const uint8_t name_lens[] = {1, 3, TFAB_WIRE_MAX_PATH_NAME};
	static const uint16_t addr_lens[] = {1, 255, 256, TFAB_WIRE_MAX_ADDR};
	static const uint32_t slots[] = {1, 64, TFAB_WIRE_MAX_SLOTS};
	static const uint32_t sizes[] = {TFAB_WIRE_MIN_SLOT, 4096, UINT32_MAX};
	static const uint32_t peers[] = {0, 1, TFAB_WIRE_MAX_PEER_ID};
	static uint8_t addr[TFAB_WIRE_MAX_ADDR + TFAB_WIRE_MAX_PATHS];
	static char names[TFAB_WIRE_MAX_PATH_NAME + TFAB_WIRE_MAX_PATHS];
	static char host[TFAB_WIRE_MAX_HOST];
	struct tfab_wire_blob b;

	(void)state;
	for (size_t i = 0; i < sizeof(addr); i++)
		addr[i] = (uint8_t)(i * 7 + 3);
	for (size_t i = 0; i < sizeof(names); i++)
		names[i] = (char)('a' + i % 26);
	for (size_t i = 0; i < sizeof(host); i++)
		host[i] = (char)(i * 13 + 1);

	/* Every header limit, with the sample's paths. */
	for (size_t s = 0; s < 3; s++)
		for (size_t z = 0; z < 3; z++)
			for (size_t p = 0; p < 3; p++) {
				sample_blob(&b);
				b.ring_slots = slots[s];
				b.slot_size = sizes[z];
				b.peer_id = peers[p];
				blob_round_trip(&b);
			}

	/*
	 * 1 to 4 paths, each host length; over v, every path position sees every name and
	 * address length (12 is a multiple of 3 and 4) and both values of same_host.
	 */
	for (unsigned np = 1; np <= TFAB_WIRE_MAX_PATHS; np++)
		for (size_t h = 0; h < sizeof(host_lens) / sizeof(host_lens[0]); h++)
			for (unsigned v = 0; v < 12; v++) {
				memset(&b, 0, sizeof(b));
				b.ring_slots = slots[v % 3];
				b.slot_size = sizes[(v + 1) % 3];
				b.peer_id = peers[(v + 2) % 3];
				b.host_len = host_lens[h];
				b.host = b.host_len ? host : NULL;
				b.npaths = (uint16_t)np;
				for (unsigned i = 0; i < np; i++) {
					struct tfab_wire_path *w = &b.paths[i];

					w->ring_raddr = i ? UINT64_MAX - v : 0;
					w->ring_rkey = 0x8000000000000000ull | (v * 4 + i);
					w->name_len = name_lens[(v + i) % 3];
					w->name = names + i;
					w->addr_len = addr_lens[(v + i) % 4];
					w->addr = addr + i;
					w->same_host = ((v >> 1) + i) & 1;
				}
				blob_round_trip(&b);
			}
}

/* The decode API returns no length, so a blob may sit in a bigger buffer of the caller's. */
static void test_blob_trailing_bytes_ignored(void **state)
{
	uint8_t buf[sizeof(blob_bytes) + 16];
	struct tfab_wire_blob b, d;

	(void)state;
	memcpy(buf, blob_bytes, sizeof(blob_bytes));
	memset(buf + sizeof(blob_bytes), 0xff, 16);
	sample_blob(&b);
	assert_int_equal(blob_decode_exact(buf, sizeof(buf), &d), 0);
	assert_blob_equal(&b, &d);

	/* With npaths 1, the second path is such bytes. */
	buf[B_NPATHS] = 1;
	b.npaths = 1;
	assert_int_equal(blob_decode_exact(buf, sizeof(buf), &d), 0);
	assert_blob_equal(&b, &d);
}

static void patch_le(uint8_t *p, uint64_t v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void blob_reject_patched(size_t off, uint64_t v, size_t n, int rc)
{
	uint8_t buf[sizeof(blob_bytes)];

	memcpy(buf, blob_bytes, sizeof(buf));
	patch_le(buf + off, v, n);
	expect_blob_reject(buf, sizeof(buf), rc);
}

/* A hand-built blob: the sample's header fields, host_len bytes of host. */
static void raw_blob(struct raw *r, uint16_t npaths, uint16_t host_len)
{
	r->n = 0;
	raw_le(r, TFAB_WIRE_MAGIC, 4);
	raw_le(r, TFAB_WIRE_VERSION, 2);
	raw_le(r, npaths, 2);
	raw_le(r, 64, 4);
	raw_le(r, 1024, 4);
	raw_le(r, 0xabcde, 4);
	raw_le(r, host_len, 2);
	raw_le(r, 0, 2);
	raw_fill(r, 'h', host_len);
}

/* A hand-built path entry with name_len name bytes and addr_len address bytes. */
static void raw_path(struct raw *r, uint8_t name_len, uint8_t flags, uint16_t addr_len)
{
	raw_le(r, name_len, 1);
	raw_le(r, flags, 1);
	raw_le(r, addr_len, 2);
	raw_le(r, 0x10000, 8);
	raw_le(r, 0x55, 8);
	raw_fill(r, 'n', name_len);
	raw_fill(r, 0xa5, addr_len);
}

/*
 * npaths paths, all valid but path bad, which has the fields given; every byte the fields
 * declare is there, so only the field's own range can refuse it.
 */
static void raw_paths(struct raw *r, unsigned npaths, unsigned bad, uint8_t name_len, uint8_t flags,
		      uint16_t addr_len)
{
	raw_blob(r, (uint16_t)npaths, 5);
	for (unsigned i = 0; i < npaths; i++) {
		if (i == bad)
			raw_path(r, name_len, flags, addr_len);
		else
			raw_path(r, 3, 0, 2);
	}
}

/* Refused in every position of 1 to 4 paths. */
static void path_reject(uint8_t name_len, uint8_t flags, uint16_t addr_len)
{
	struct raw r;

	for (unsigned np = 1; np <= TFAB_WIRE_MAX_PATHS; np++)
		for (unsigned bad = 0; bad < np; bad++) {
			raw_paths(&r, np, bad, name_len, flags, addr_len);
			expect_blob_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
		}
}

/* Accepted in every position of 1 to 4 paths, and decoded as given. */
static void path_accept(uint8_t name_len, uint8_t flags, uint16_t addr_len)
{
	struct tfab_wire_blob d;
	struct raw r;

	for (unsigned np = 1; np <= TFAB_WIRE_MAX_PATHS; np++)
		for (unsigned at = 0; at < np; at++) {
			raw_paths(&r, np, at, name_len, flags, addr_len);
			assert_int_equal(blob_decode_exact(r.b, r.n, &d), 0);
			assert_int_equal(d.npaths, np);
			assert_int_equal(d.paths[at].name_len, name_len);
			assert_int_equal(d.paths[at].same_host, flags);
			assert_int_equal(d.paths[at].addr_len, addr_len);
		}
}

static void test_blob_reject_header(void **state)
{
	struct tfab_wire_blob d;
	uint8_t buf[sizeof(blob_bytes)];
	struct raw r;

	(void)state;
	/* Magic. */
	blob_reject_patched(0, 0x42414655, 4, -TFAB_ERR_PROTOCOL);
	blob_reject_patched(0, 0x54464142, 4, -TFAB_ERR_PROTOCOL); /* big-endian "TFAB" */
	blob_reject_patched(0, 0, 4, -TFAB_ERR_PROTOCOL);

	/* Version: another version with a good magic is a version mismatch... */
	blob_reject_patched(B_VERSION, 0, 2, -TFAB_ERR_VERSION);
	blob_reject_patched(B_VERSION, 1, 2, -TFAB_ERR_VERSION);
	blob_reject_patched(B_VERSION, 2, 2, -TFAB_ERR_VERSION); /* one slot, one message */
	blob_reject_patched(B_VERSION, 3, 2, -TFAB_ERR_VERSION); /* no key indexes */
	blob_reject_patched(B_VERSION, 4, 2, -TFAB_ERR_VERSION); /* no requests ahead */
	blob_reject_patched(B_VERSION, 5, 2, -TFAB_ERR_VERSION); /* no COLL_DATA */
	blob_reject_patched(B_VERSION, 6, 2, -TFAB_ERR_VERSION); /* no LEAVE */
	blob_reject_patched(B_VERSION, 8, 2, -TFAB_ERR_VERSION);
	blob_reject_patched(B_VERSION, 0x200, 2, -TFAB_ERR_VERSION);
	blob_reject_patched(B_VERSION, 0xffff, 2, -TFAB_ERR_VERSION);
	/* ...a version 1 blob too, whole or cut anywhere after its version... */
	for (size_t len = 6; len <= sizeof(v1_blob_bytes); len++)
		expect_blob_reject(v1_blob_bytes, len, -TFAB_ERR_VERSION);
	expect_blob_reject(v1_blob_bytes, 5, -TFAB_ERR_PROTOCOL);
	/* ...but with a bad magic it is not our protocol at all, whatever the version. */
	memcpy(buf, v1_blob_bytes, sizeof(v1_blob_bytes));
	buf[0] ^= 1;
	expect_blob_reject(buf, sizeof(v1_blob_bytes), -TFAB_ERR_PROTOCOL);
	memcpy(buf, blob_bytes, sizeof(buf));
	buf[3] ^= 0x80;
	expect_blob_reject(buf, sizeof(buf), -TFAB_ERR_PROTOCOL);

	/* npaths: none, over the maximum, more than the blob holds. */
	blob_reject_patched(B_NPATHS, 0, 2, -TFAB_ERR_PROTOCOL);
	blob_reject_patched(B_NPATHS, TFAB_WIRE_MAX_PATHS + 1, 2, -TFAB_ERR_PROTOCOL);
	blob_reject_patched(B_NPATHS, 0x102, 2, -TFAB_ERR_PROTOCOL);
	blob_reject_patched(B_NPATHS, 0xffff, 2, -TFAB_ERR_PROTOCOL);
	blob_reject_patched(B_NPATHS, 3, 2, -TFAB_ERR_PROTOCOL);
	/* Five whole paths are there: only the limit refuses them. */
	raw_blob(&r, TFAB_WIRE_MAX_PATHS + 1, 0);
	for (unsigned i = 0; i < TFAB_WIRE_MAX_PATHS + 1; i++)
		raw_path(&r, 3, 0, 2);
	expect_blob_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);

	/* ring_slots. */
	blob_reject_patched(B_SLOTS, 0, 4, -TFAB_ERR_PROTOCOL);
	blob_reject_patched(B_SLOTS, TFAB_WIRE_MAX_SLOTS + 1, 4, -TFAB_ERR_PROTOCOL);
	blob_reject_patched(B_SLOTS, UINT32_MAX, 4, -TFAB_ERR_PROTOCOL);
	/* slot_size. */
	blob_reject_patched(B_SIZE, 0, 4, -TFAB_ERR_PROTOCOL);
	blob_reject_patched(B_SIZE, TFAB_WIRE_MIN_SLOT - 1, 4, -TFAB_ERR_PROTOCOL);
	/* peer_id. */
	blob_reject_patched(B_PEER, TFAB_WIRE_MAX_PEER_ID + 1, 4, -TFAB_ERR_PROTOCOL);
	blob_reject_patched(B_PEER, UINT32_MAX, 4, -TFAB_ERR_PROTOCOL);
	/* reserved. */
	for (size_t i = 0; i < 2; i++)
		for (unsigned v = 1; v < 0x100; v <<= 1)
			blob_reject_patched(B_RESERVED + i, v, 1, -TFAB_ERR_PROTOCOL);

	/* host_len: over the maximum with every byte there, then beyond the buffer. */
	raw_blob(&r, 1, TFAB_WIRE_MAX_HOST + 1);
	raw_path(&r, 3, 0, 2);
	expect_blob_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
	raw_blob(&r, 1, TFAB_WIRE_MAX_HOST);
	raw_path(&r, 3, 0, 2);
	assert_int_equal(blob_decode_exact(r.b, r.n, &d), 0);
	assert_int_equal(d.host_len, TFAB_WIRE_MAX_HOST);
	blob_reject_patched(B_HOST_LEN, 0xffff, 2, -TFAB_ERR_PROTOCOL);
	raw_blob(&r, 1, TFAB_WIRE_MAX_HOST);
	expect_blob_reject(r.b, r.n - 1, -TFAB_ERR_PROTOCOL);
	blob_reject_patched(B_HOST_LEN, sizeof(blob_bytes), 2, -TFAB_ERR_PROTOCOL);
}

static void test_blob_reject_paths(void **state)
{
	uint8_t big[BLOB_MAX];
	struct tfab_wire_blob d;
	struct raw r;

	(void)state;
	/* Each field of each path of blob_bytes, patched. */
	for (size_t p = 0; p < 2; p++) {
		size_t at = p ? PATH1 : PATH0;

		/* name_len. */
		blob_reject_patched(at + P_NAME_LEN, 0, 1, -TFAB_ERR_PROTOCOL);
		blob_reject_patched(at + P_NAME_LEN, TFAB_WIRE_MAX_PATH_NAME + 1, 1,
				    -TFAB_ERR_PROTOCOL);
		blob_reject_patched(at + P_NAME_LEN, 0xff, 1, -TFAB_ERR_PROTOCOL);
		/* flags: bit 0 only. */
		for (unsigned v = 2; v < 0x100; v++)
			blob_reject_patched(at + P_FLAGS, v, 1, -TFAB_ERR_PROTOCOL);
		/* addr_len. */
		blob_reject_patched(at + P_ADDR_LEN, 0, 2, -TFAB_ERR_PROTOCOL);
		blob_reject_patched(at + P_ADDR_LEN, TFAB_WIRE_MAX_ADDR + 1, 2, -TFAB_ERR_PROTOCOL);
		blob_reject_patched(at + P_ADDR_LEN, 0xffff, 2, -TFAB_ERR_PROTOCOL);
	}
	/* The last path's name or address running past the end. */
	blob_reject_patched(PATH1 + P_NAME_LEN, 8, 1, -TFAB_ERR_PROTOCOL);
	blob_reject_patched(PATH1 + P_ADDR_LEN, 4, 2, -TFAB_ERR_PROTOCOL);

	/* Each bad field in every position of 1 to 4 paths, with every declared byte there. */
	path_reject(0, 0, 2);
	path_reject(TFAB_WIRE_MAX_PATH_NAME + 1, 0, 2);
	path_reject(0xff, 0, 2);
	path_reject(3, 2, 2);
	path_reject(3, 3, 2);
	path_reject(3, 0x80, 2);
	path_reject(3, 0xff, 2);
	path_reject(3, 0, 0);
	path_reject(3, 0, TFAB_WIRE_MAX_ADDR + 1);
	path_reject(TFAB_WIRE_MAX_PATH_NAME + 1, 1, TFAB_WIRE_MAX_ADDR + 1);
	/* ...and the limits themselves in the same positions. */
	path_accept(1, 0, 1);
	path_accept(TFAB_WIRE_MAX_PATH_NAME, 1, 2);
	path_accept(3, 1, TFAB_WIRE_MAX_ADDR);

	/* The longest address, one byte short. */
	raw_blob(&r, 1, 0);
	raw_path(&r, 3, 0, TFAB_WIRE_MAX_ADDR);
	assert_int_equal(blob_decode_exact(r.b, r.n, &d), 0);
	expect_blob_reject(r.b, r.n - 1, -TFAB_ERR_PROTOCOL);
	/* An address over the maximum, with its bytes there and more. */
	memset(big, 0x33, sizeof(big));
	raw_blob(&r, 1, 0);
	raw_path(&r, 3, 0, TFAB_WIRE_MAX_ADDR + 1);
	memcpy(big, r.b, r.n);
	expect_blob_reject(big, sizeof(big), -TFAB_ERR_PROTOCOL);
}

/* The largest blob, hand-built with every field at its limit. */
static void raw_max_blob(struct raw *r)
{
	r->n = 0;
	raw_le(r, TFAB_WIRE_MAGIC, 4);
	raw_le(r, TFAB_WIRE_VERSION, 2);
	raw_le(r, TFAB_WIRE_MAX_PATHS, 2);
	raw_le(r, TFAB_WIRE_MAX_SLOTS, 4);
	raw_le(r, TFAB_WIRE_MIN_SLOT, 4);
	raw_le(r, TFAB_WIRE_MAX_PEER_ID, 4);
	raw_le(r, TFAB_WIRE_MAX_HOST, 2);
	raw_le(r, 0, 2);
	raw_fill(r, 'h', TFAB_WIRE_MAX_HOST);
	for (unsigned i = 0; i < TFAB_WIRE_MAX_PATHS; i++) {
		raw_le(r, TFAB_WIRE_MAX_PATH_NAME, 1);
		raw_le(r, 1, 1);
		raw_le(r, TFAB_WIRE_MAX_ADDR, 2);
		raw_le(r, UINT64_MAX - i, 8);
		raw_le(r, i, 8);
		raw_fill(r, (uint8_t)('A' + i), TFAB_WIRE_MAX_PATH_NAME);
		raw_fill(r, (uint8_t)(0x30 + i), TFAB_WIRE_MAX_ADDR);
	}
}

/* The limits themselves are accepted, and re-encode to the same bytes. */
static void test_blob_accept_limits(void **state)
{
	static struct raw r;
	uint8_t out[BLOB_MAX];
	struct tfab_wire_blob d;
	size_t n = 0;

	(void)state;
	raw_max_blob(&r);
	assert_int_equal(r.n, BLOB_MAX);
	assert_int_equal(blob_decode_exact(r.b, r.n, &d), 0);
	assert_int_equal(d.npaths, TFAB_WIRE_MAX_PATHS);
	assert_int_equal(d.ring_slots, TFAB_WIRE_MAX_SLOTS);
	assert_int_equal(d.slot_size, TFAB_WIRE_MIN_SLOT);
	assert_int_equal(d.peer_id, TFAB_WIRE_MAX_PEER_ID);
	assert_int_equal(d.host_len, TFAB_WIRE_MAX_HOST);
	assert_int_equal(d.host[TFAB_WIRE_MAX_HOST - 1], 'h');
	for (unsigned i = 0; i < TFAB_WIRE_MAX_PATHS; i++) {
		assert_int_equal(d.paths[i].name_len, TFAB_WIRE_MAX_PATH_NAME);
		assert_int_equal(d.paths[i].addr_len, TFAB_WIRE_MAX_ADDR);
		assert_true(d.paths[i].same_host);
		assert_true(d.paths[i].ring_raddr == UINT64_MAX - i);
		assert_true(d.paths[i].ring_rkey == i);
		assert_int_equal(d.paths[i].name[TFAB_WIRE_MAX_PATH_NAME - 1], 'A' + i);
		assert_int_equal(d.paths[i].addr[TFAB_WIRE_MAX_ADDR - 1], 0x30 + i);
	}
	assert_int_equal(tfab__wire_blob_encode(&d, out, sizeof(out), &n), 0);
	assert_int_equal(n, r.n);
	assert_memory_equal(out, r.b, n);

	/* The other ends: one path, no host, one-byte name and address, slot_size UINT32_MAX. */
	raw_blob(&r, 1, 0);
	patch_le(r.b + B_SLOTS, 1, 4);
	patch_le(r.b + B_SIZE, UINT32_MAX, 4);
	patch_le(r.b + B_PEER, 0, 4);
	raw_path(&r, 1, 0, 1);
	assert_int_equal(r.n, TFAB_WIRE_BLOB_HDR + TFAB_WIRE_PATH_HDR + 2);
	assert_int_equal(blob_decode_exact(r.b, r.n, &d), 0);
	assert_int_equal(d.npaths, 1);
	assert_int_equal(d.ring_slots, 1);
	assert_int_equal(d.slot_size, UINT32_MAX);
	assert_int_equal(d.peer_id, 0);
	assert_int_equal(d.host_len, 0);
	assert_int_equal(d.paths[0].name_len, 1);
	assert_int_equal(d.paths[0].addr_len, 1);
	assert_false(d.paths[0].same_host);
	assert_int_equal(tfab__wire_blob_encode(&d, out, sizeof(out), &n), 0);
	assert_int_equal(n, r.n);
	assert_memory_equal(out, r.b, n);
}

static void test_blob_truncated(void **state)
{
	static struct raw r;

	(void)state;
	for (size_t len = 0; len < sizeof(blob_bytes); len++)
		expect_blob_reject(blob_bytes, len, -TFAB_ERR_PROTOCOL);
	raw_max_blob(&r);
	for (size_t len = 0; len < r.n; len++)
		expect_blob_reject(r.b, len, -TFAB_ERR_PROTOCOL);
}

static void blob_encode_fails(const struct tfab_wire_blob *b, size_t cap, int rc)
{
	static uint8_t buf[BLOB_MAX], before[BLOB_MAX];
	size_t len = 12345;

	assert_true(cap <= sizeof(buf));
	memset(buf, 0x5a, sizeof(buf));
	memcpy(before, buf, sizeof(buf));
	assert_int_equal(tfab__wire_blob_encode(b, buf, cap, &len), rc);
	assert_int_equal(len, 12345);
	assert_memory_equal(buf, before, sizeof(buf));
}

static void test_blob_encode_invalid(void **state)
{
	struct tfab_wire_blob b;

	(void)state;
	sample_blob(&b);
	b.npaths = 0;
	blob_encode_fails(&b, 128, -EINVAL);
	sample_blob(&b);
	b.npaths = TFAB_WIRE_MAX_PATHS + 1;
	blob_encode_fails(&b, 128, -EINVAL);
	sample_blob(&b);
	b.host_len = TFAB_WIRE_MAX_HOST + 1;
	blob_encode_fails(&b, BLOB_MAX, -EINVAL);
	sample_blob(&b);
	b.host = NULL;
	blob_encode_fails(&b, 128, -EINVAL);
	sample_blob(&b);
	b.ring_slots = 0;
	blob_encode_fails(&b, 128, -EINVAL);
	sample_blob(&b);
	b.ring_slots = TFAB_WIRE_MAX_SLOTS + 1;
	blob_encode_fails(&b, 128, -EINVAL);
	sample_blob(&b);
	b.slot_size = TFAB_WIRE_MIN_SLOT - 1;
	blob_encode_fails(&b, 128, -EINVAL);
	sample_blob(&b);
	b.peer_id = TFAB_WIRE_MAX_PEER_ID + 1;
	blob_encode_fails(&b, 128, -EINVAL);

	/* Each path field, in the first path and the last. */
	for (unsigned i = 0; i < 2; i++) {
		sample_blob(&b);
		b.paths[i].name = NULL;
		blob_encode_fails(&b, 128, -EINVAL);
		sample_blob(&b);
		b.paths[i].addr = NULL;
		blob_encode_fails(&b, 128, -EINVAL);
		sample_blob(&b);
		b.paths[i].name_len = 0;
		blob_encode_fails(&b, 128, -EINVAL);
		sample_blob(&b);
		b.paths[i].name_len = TFAB_WIRE_MAX_PATH_NAME + 1;
		blob_encode_fails(&b, BLOB_MAX, -EINVAL);
		sample_blob(&b);
		b.paths[i].addr_len = 0;
		blob_encode_fails(&b, 128, -EINVAL);
		sample_blob(&b);
		b.paths[i].addr_len = TFAB_WIRE_MAX_ADDR + 1;
		blob_encode_fails(&b, BLOB_MAX, -EINVAL);
	}
}

static void test_blob_encode_nospace(void **state)
{
	static struct raw r;
	struct tfab_wire_blob b;
	uint8_t buf[sizeof(blob_bytes)];
	size_t len = 0;

	(void)state;
	/* Too small a buffer, by any amount. */
	sample_blob(&b);
	for (size_t cap = 0; cap < sizeof(blob_bytes); cap++)
		blob_encode_fails(&b, cap, -ENOSPC);
	assert_int_equal(tfab__wire_blob_encode(&b, buf, sizeof(buf), &len), 0);
	assert_int_equal(len, sizeof(blob_bytes));

	/* The largest blob: one byte short. */
	raw_max_blob(&r);
	assert_int_equal(blob_decode_exact(r.b, r.n, &b), 0);
	blob_encode_fails(&b, BLOB_MAX - 1, -ENOSPC);
}

/* ---- Messages: known bytes ---- */

/* Pinned against doc/protocol.md: header, TENSOR_REQUEST, then the meta-data table. */
static const uint8_t request_bytes[] = {
    /* header */
    0x07,		    /* version */
    0x01,		    /* type TENSOR_REQUEST */
    0x03, 0x00,		    /* flags META_VALID | REREQUEST */
    0x48, 0x00, 0x00, 0x00, /* length 72 */
    0x04, 0x03, 0x02, 0x01, /* seq */
    0x00, 0x00, 0x00, 0x00, /* more 0, reserved */
    /* payload */
    0x56, 0x34, 0x12, 0x00,			    /* req_index */
    0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* step_id -2 */
    0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* dest_raddr */
    0xdd, 0xcc, 0xbb, 0xaa, 0x00, 0x00, 0x00, 0x00, /* dest_rkey */
    0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* dest_capacity 24 */
    0x02, 0x00,					    /* key_len */
    0x61, 0x62,					    /* key "ab" */
    /* meta */
    0x02,					    /* dtype_code float */
    0x20,					    /* dtype_bits 32 */
    0x01, 0x00,					    /* dtype_lanes */
    0x00,					    /* is_dead */
    0x02,					    /* ndim */
    0x00, 0x00,					    /* reserved */
    0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* nbytes 24 */
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* shape[0] */
    0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* shape[1] */
};

static const uint8_t meta_data_bytes[] = {
    0x07, 0x02, 0x04, 0x00,			    /* version, META_DATA, COMPLETE */
    0x14, 0x00, 0x00, 0x00,			    /* length 20 */
    0x07, 0x00, 0x00, 0x00,			    /* seq */
    0x00, 0x00, 0x00, 0x00,			    /* more 0, reserved */
    0x09, 0x00, 0x00, 0x00,			    /* req_index */
    0x02, 0x20, 0x01, 0x00,			    /* float32, 1 lane */
    0x01, 0x00, 0x00, 0x00,			    /* dead, ndim 0, reserved */
    0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* nbytes 4: a scalar */
};

static const uint8_t error_bytes[] = {
    0x07, 0x03, 0x00, 0x00, /* version, ERROR, no flags */
    0x0c, 0x00, 0x00, 0x00, /* length 12 */
    0x01, 0x00, 0x00, 0x00, /* seq */
    0x00, 0x00, 0x00, 0x00, /* more 0, reserved */
    0x02, 0x00, 0x00, 0x00, /* req_index */
    0xfd, 0xfe, 0xff, 0xff, /* status -259 */
    0x02, 0x00,		    /* msg_len */
    0x6e, 0x6f,		    /* "no" */
};

/* LEAVE (version 7): its reserved req_index is 0; anything else is refused. */
static const uint8_t leave_bytes[] = {
    0x07, 0x08, 0x00, 0x00, /* version, LEAVE, no flags */
    0x04, 0x00, 0x00, 0x00, /* length 4 */
    0x05, 0x00, 0x00, 0x00, /* seq */
    0x00, 0x00, 0x00, 0x00, /* more 0, reserved */
    0x00, 0x00, 0x00, 0x00, /* reserved */
};

static const uint8_t cancel_bytes[] = {
    0x07, 0x04, 0x00, 0x00, /* version, CANCEL, no flags */
    0x04, 0x00, 0x00, 0x00, /* length 4 */
    0xff, 0xff, 0xff, 0xff, /* seq */
    0x00, 0x00, 0x00, 0x00, /* more 0, reserved */
    0xff, 0xff, 0xff, 0x7f, /* req_index */
};

static const uint8_t taken_bytes[] = {
    0x07, 0x05, 0x00, 0x00, /* version, TAKEN, no flags */
    0x0e, 0x00, 0x00, 0x00, /* length 14 */
    0x03, 0x00, 0x00, 0x00, /* seq */
    0x00, 0x00, 0x00, 0x00, /* more 0, reserved */
    0x01, 0x00, 0x10, 0x00, /* req_index: the first taken */
    0x02, 0x00,		    /* two more */
    0x02, 0x00, 0x20, 0x00, /* the second */
    0xff, 0xff, 0xff, 0x7f, /* the third */
};

static const uint8_t coll_data_bytes[] = {
    0x07, 0x07, 0x00, 0x00,			    /* version, COLL_DATA, no flags */
    0x1b, 0x00, 0x00, 0x00,			    /* length 27: 19 and 8 bytes */
    0x09, 0x00, 0x00, 0x00,			    /* seq */
    0x00, 0x00, 0x00, 0x00,			    /* more 0, credits 0 */
    0x02, 0x00, 0x00, 0x00,			    /* req_index: the operation's step 2 */
    0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80, /* step_id INT64_MIN + 5 */
    0x01, 0x00, 0x00, 0x00,			    /* key_index: piece 1 */
    0x64,					    /* tag 'd' */
    0x08, 0x00,					    /* 8 bytes */
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,
};

/* COLL_DATA (version 6): its bytes, its round trip and what a decode refuses. */
static void test_coll_data(void **state)
{
	static const uint8_t eight[8] = {1, 2, 3, 4, 5, 6, 7, 8};
	uint8_t big[TFAB_WIRE_MAX_COLL_DATA + 1] = {0}, slot[SLOT], buf[64];
	struct tfab_wire_msg m = {.type = TFAB_MSG_COLL_DATA,
				  .seq = 9,
				  .req_index = 2,
				  .step_id = INT64_MIN + 5,
				  .key_index = 1,
				  .coll_tag = 'd',
				  .data_len = 8,
				  .data = eight};
	size_t len;

	(void)state;
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), 0);
	assert_int_equal(len, sizeof(coll_data_bytes));
	assert_memory_equal(slot, coll_data_bytes, sizeof(coll_data_bytes));
	msg_round_trip(&m, sizeof(coll_data_bytes));
	/* The largest fits a slot of the minimum size, with room for a TAKEN behind it. */
	m.data = big;
	m.data_len = TFAB_WIRE_MAX_COLL_DATA;
	assert_true(msg_round_trip(&m, TFAB_WIRE_MSG_HDR + TFAB_WIRE_COLL_FIXED +
					   TFAB_WIRE_MAX_COLL_DATA) <= TFAB_WIRE_MIN_SLOT - 16);
	/* A dead operand: no bytes. */
	m.flags = TFAB_MSGF_DEAD;
	m.data_len = 0;
	m.data = NULL;
	msg_round_trip(&m, TFAB_WIRE_MSG_HDR + TFAB_WIRE_COLL_FIXED);
	/* The encoder refuses what the decoder would. */
	m.data_len = 1;
	m.data = eight;
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), -EINVAL);
	m.flags = 0;
	m.data_len = 0;
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), -EINVAL);
	m.data_len = TFAB_WIRE_MAX_COLL_DATA + 1;
	m.data = big;
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), -EINVAL);
	m.flags = TFAB_MSGF_AHEAD;
	m.data_len = 8;
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), -EINVAL);

	/* Decoding: DEAD with bytes, no bytes without DEAD, a length unlike the payload. */
	memcpy(buf, coll_data_bytes, sizeof(coll_data_bytes));
	buf[2] = TFAB_MSGF_DEAD;
	expect_msg_reject(buf, sizeof(coll_data_bytes), -TFAB_ERR_PROTOCOL);
	memcpy(buf, coll_data_bytes, sizeof(coll_data_bytes));
	buf[2] = TFAB_MSGF_AHEAD;
	expect_msg_reject(buf, sizeof(coll_data_bytes), -TFAB_ERR_PROTOCOL);
	memcpy(buf, coll_data_bytes, sizeof(coll_data_bytes));
	buf[4] = 19; /* the payload ends before its bytes */
	expect_msg_reject(buf, 16 + 19, -TFAB_ERR_PROTOCOL);
	memcpy(buf, coll_data_bytes, sizeof(coll_data_bytes));
	buf[33] = 9; /* one byte more than the payload holds */
	expect_msg_reject(buf, sizeof(coll_data_bytes), -TFAB_ERR_PROTOCOL);
	memcpy(buf, coll_data_bytes, sizeof(coll_data_bytes));
	buf[33] = 7; /* one byte fewer: a trailing byte */
	expect_msg_reject(buf, sizeof(coll_data_bytes), -TFAB_ERR_PROTOCOL);
	memcpy(buf, coll_data_bytes, sizeof(coll_data_bytes));
	buf[4] = 19;
	buf[33] = 0; /* no bytes, not DEAD */
	expect_msg_reject(buf, 16 + 19, -TFAB_ERR_PROTOCOL);
}

static void sample_request(struct tfab_wire_msg *m)
{
	memset(m, 0, sizeof(*m));
	m->type = TFAB_MSG_TENSOR_REQUEST;
	m->flags = TFAB_MSGF_META_VALID | TFAB_MSGF_REREQUEST;
	m->seq = 0x01020304;
	m->req_index = 0x123456;
	m->step_id = -2;
	m->dest_raddr = 0x1000;
	m->dest_rkey = 0xaabbccdd;
	m->dest_capacity = 24;
	m->key_len = 2;
	m->key = (const uint8_t *)"ab";
	make_meta(&m->meta, 2, false);
	m->meta.shape[0] = 2;
	m->meta.shape[1] = 3;
	m->meta.nbytes = 24;
}

static void sample_meta_data(struct tfab_wire_msg *m)
{
	memset(m, 0, sizeof(*m));
	m->type = TFAB_MSG_META_DATA;
	m->flags = TFAB_MSGF_COMPLETE;
	m->seq = 7;
	m->req_index = 9;
	make_meta(&m->meta, 0, true);
}

static void sample_error(struct tfab_wire_msg *m)
{
	memset(m, 0, sizeof(*m));
	m->type = TFAB_MSG_ERROR;
	m->seq = 1;
	m->req_index = 2;
	m->status = -TFAB_ERR_ABORTED;
	m->errmsg_len = 2;
	m->errmsg = "no";
}

static void sample_cancel(struct tfab_wire_msg *m)
{
	memset(m, 0, sizeof(*m));
	m->type = TFAB_MSG_CANCEL;
	m->seq = UINT32_MAX;
	m->req_index = 0x7fffffff;
}

static const uint32_t sample_more[] = {0x200002, 0x7fffffff};

static void sample_taken(struct tfab_wire_msg *m)
{
	memset(m, 0, sizeof(*m));
	m->type = TFAB_MSG_TAKEN;
	m->seq = 3;
	m->req_index = 0x100001;
	m->ntaken = 3;
	m->taken = sample_more;
}

static void msg_encode_fails(const struct tfab_wire_msg *m, size_t cap, int rc);

static void check_known(const struct tfab_wire_msg *m, const uint8_t *bytes, size_t n)
{
	uint8_t slot[SLOT];
	struct tfab_wire_msg d;
	size_t len = 0;

	assert_int_equal(tfab__wire_msg_encode(m, slot, sizeof(slot), &len), 0);
	assert_int_equal(len, n);
	assert_memory_equal(slot, bytes, n);
	assert_int_equal(decode_exact(bytes, n, &d), 0);
	assert_msg_equal(m, &d);
}

static void test_msg_known_bytes(void **state)
{
	struct tfab_wire_msg m;

	(void)state;
	sample_request(&m);
	check_known(&m, request_bytes, sizeof(request_bytes));
	sample_meta_data(&m);
	check_known(&m, meta_data_bytes, sizeof(meta_data_bytes));
	sample_error(&m);
	check_known(&m, error_bytes, sizeof(error_bytes));
	sample_taken(&m);
	check_known(&m, taken_bytes, sizeof(taken_bytes));
	sample_cancel(&m);
	check_known(&m, cancel_bytes, sizeof(cancel_bytes));
	memset(&m, 0, sizeof(m));
	m.type = TFAB_MSG_LEAVE;
	m.seq = 5;
	check_known(&m, leave_bytes, sizeof(leave_bytes));
	/* its reserved field set, a flag, or a byte more: refused either way */
	m.req_index = 1;
	msg_encode_fails(&m, SLOT, -EINVAL);
	{
		uint8_t buf[sizeof(leave_bytes) + 1] = {0};

		memcpy(buf, leave_bytes, sizeof(leave_bytes));
		buf[16] = 1;
		expect_msg_reject(buf, sizeof(leave_bytes), -TFAB_ERR_PROTOCOL);
		memcpy(buf, leave_bytes, sizeof(leave_bytes));
		buf[2] = 1;
		expect_msg_reject(buf, sizeof(leave_bytes), -TFAB_ERR_PROTOCOL);
		memcpy(buf, leave_bytes, sizeof(leave_bytes));
		buf[4] = 5;
		expect_msg_reject(buf, sizeof(buf), -TFAB_ERR_PROTOCOL);
	}
}

/* ---- Messages: round trips ---- */

static void test_request_round_trip(void **state)
{
	static const unsigned ndims[] = {0, 1, 2, TFAB_MAX_DIMS};
	static const uint16_t key_lens[] = {1, 2, 100, TFAB_MAX_KEY};
	static const uint16_t flag_sets[] = {0, TFAB_MSGF_META_VALID, TFAB_MSGF_REREQUEST,
					     TFAB_MSGF_META_VALID | TFAB_MSGF_REREQUEST};
	uint8_t key[TFAB_MAX_KEY];
	struct tfab_wire_msg m;

	(void)state;
	for (size_t i = 0; i < sizeof(key); i++)
		key[i] = (uint8_t)(255 - i); /* any bytes, NULs included */
	for (size_t f = 0; f < 4; f++)
		for (size_t k = 0; k < 4; k++)
			for (size_t d = 0; d < 4; d++) {
				bool meta = flag_sets[f] & TFAB_MSGF_META_VALID;
				size_t expect = TFAB_WIRE_MSG_HDR + 38 + key_lens[k] +
						(meta ? 16 + 8 * ndims[d] : 0);

				memset(&m, 0, sizeof(m));
				m.type = TFAB_MSG_TENSOR_REQUEST;
				m.flags = flag_sets[f];
				m.seq = (uint32_t)(f * 1000 + k * 10 + d);
				m.req_index = 0x7fffffff - (uint32_t)d;
				m.step_id = d & 1 ? INT64_MIN : INT64_MAX;
				m.dest_raddr = UINT64_MAX - k;
				m.dest_rkey = 0x1234567890abcdefull;
				m.dest_capacity = 1ull << 40;
				m.key_len = key_lens[k];
				m.key = key;
				make_meta(&m.meta, ndims[d], false);
				msg_round_trip(&m, expect);
			}
}

/*
 * Keys as indexes: a request that announces an index (its key, then the index), one that
 * names its key by the index alone, and a RETIRE of indexes; no key without KEY_INDEX is
 * refused both ways.
 */
static void test_key_index_round_trip(void **state)
{
	static const uint8_t key[5] = "grad";
	uint32_t more[2] = {7, 0xffffffffu};
	uint8_t slot[SLOT];
	struct tfab_wire_msg m, d;
	size_t len = 0;

	(void)state;
	sample_request(&m);
	m.flags |= TFAB_MSGF_KEY_INDEX;
	m.key = key;
	m.key_len = 4;
	m.key_index = 0x89abcdefu;
	msg_round_trip(&m, TFAB_WIRE_MSG_HDR + 38 + 4 + 4 + 16 + 8 * m.meta.ndim);
	m.key = NULL;
	m.key_len = 0;
	len = msg_round_trip(&m, TFAB_WIRE_MSG_HDR + 38 + 4 + 16 + 8 * m.meta.ndim);
	/* The index's bytes, little-endian, right after the (empty) key. */
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), 0);
	assert_int_equal(slot[TFAB_WIRE_MSG_HDR + 38], 0xef);
	assert_int_equal(slot[TFAB_WIRE_MSG_HDR + 41], 0x89);
	/* No key and no index: refused by the encoder, and by the decoder. */
	m.flags &= (uint16_t)~TFAB_MSGF_KEY_INDEX;
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), -EINVAL);
	m.flags |= TFAB_MSGF_KEY_INDEX;
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), 0);
	slot[2] &= (uint8_t)~TFAB_MSGF_KEY_INDEX; /* flags; the index's 4 bytes now trail */
	assert_int_equal(tfab__wire_msg_decode(slot, len, &d), -TFAB_ERR_PROTOCOL);

	memset(&m, 0, sizeof(m));
	m.type = TFAB_MSG_RETIRE;
	m.seq = 5;
	m.req_index = 1;
	m.ntaken = 3;
	m.taken = more;
	msg_round_trip(&m, TFAB_WIRE_MSG_HDR + 6 + 8);
	m.ntaken = 0;
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), -EINVAL);
	m.ntaken = TFAB_WIRE_MAX_TAKEN + 1;
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), -EINVAL);
}

/* Standing requests for the next steps, carried by one TENSOR_REQUEST (flag AHEAD). */
static void test_ahead_round_trip(void **state)
{
	struct tfab_wire_ahead more[3] = {
	    {.req_index = 0x10, .dest_raddr = 0x2000, .dest_rkey = 0x1122334455667788u},
	    {.req_index = 0xffffffffu, .dest_raddr = UINT64_MAX, .dest_rkey = 0},
	    {.req_index = 0x12, .dest_raddr = 0x4000, .dest_rkey = 7},
	};
	size_t base = TFAB_WIRE_MSG_HDR + 38 + 2 + 16 + 8 * 2, len = 0;
	uint8_t slot[SLOT];
	struct tfab_wire_msg m, d;

	(void)state;
	sample_request(&m);
	m.flags = TFAB_MSGF_META_VALID | TFAB_MSGF_AHEAD;
	m.nahead = 3;
	m.ahead = more;
	len = msg_round_trip(&m, base + 2 + 3 * TFAB_WIRE_AHEAD_ENTRY);
	/* After the meta-data: the count, then each request's index, address and key. */
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), 0);
	assert_int_equal(slot[base] | slot[base + 1] << 8, 3);
	assert_int_equal(slot[base + 2], 0x10);
	assert_int_equal(slot[base + 2 + 4 + 8], 0x88);
	assert_int_equal(slot[base + 2 + TFAB_WIRE_AHEAD_ENTRY], 0xff);
	assert_int_equal(tfab__wire_msg_decode(slot, len, &d), 0);
	assert_int_equal(tfab__wire_ahead_at(&d, 2).dest_rkey, 7);
	/* With a key index, and by index alone. */
	m.flags |= TFAB_MSGF_KEY_INDEX;
	m.key_index = 5;
	msg_round_trip(&m, base + 4 + 2 + 3 * TFAB_WIRE_AHEAD_ENTRY);
	m.key_len = 0;
	m.key = NULL;
	msg_round_trip(&m, base - 2 + 4 + 2 + 3 * TFAB_WIRE_AHEAD_ENTRY);

	/* What fits beside a request: whole entries within the room given. */
	sample_request(&m);
	m.flags = TFAB_MSGF_META_VALID;
	assert_int_equal(tfab__wire_ahead_room(&m, base + 2 + 3 * TFAB_WIRE_AHEAD_ENTRY), 3);
	assert_int_equal(tfab__wire_ahead_room(&m, base + 1 + 3 * TFAB_WIRE_AHEAD_ENTRY), 2);
	assert_int_equal(tfab__wire_ahead_room(&m, base), 0);

	/* Refused by the encoder: none, no meta-data, a re-request, steps past int64, none given. */
	m.flags = TFAB_MSGF_META_VALID | TFAB_MSGF_AHEAD;
	m.ahead = more;
	m.nahead = 0;
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), -EINVAL);
	m.nahead = 3;
	m.flags = TFAB_MSGF_AHEAD;
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), -EINVAL);
	m.flags = TFAB_MSGF_META_VALID | TFAB_MSGF_AHEAD | TFAB_MSGF_REREQUEST;
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), -EINVAL);
	m.flags = TFAB_MSGF_META_VALID | TFAB_MSGF_AHEAD;
	m.step_id = INT64_MAX - 2;
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), -EINVAL);
	m.step_id = INT64_MAX - 3;
	msg_round_trip(&m, base + 2 + 3 * TFAB_WIRE_AHEAD_ENTRY);
	m.ahead = NULL;
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), -EINVAL);

	/* Refused by the decoder: a count of 0, more entries than the payload holds, or fewer. */
	m.ahead = more;
	m.step_id = 4;
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), 0);
	slot[base] = 0;
	assert_int_equal(tfab__wire_msg_decode(slot, len, &d), -TFAB_ERR_PROTOCOL);
	slot[base] = 4;
	assert_int_equal(tfab__wire_msg_decode(slot, sizeof(slot), &d), -TFAB_ERR_PROTOCOL);
	slot[base] = 2;
	assert_int_equal(tfab__wire_msg_decode(slot, sizeof(slot), &d), -TFAB_ERR_PROTOCOL);
	slot[base] = 3;
	assert_int_equal(tfab__wire_msg_decode(slot, len, &d), 0);
	/* A step that the entries would carry past int64. */
	for (unsigned i = 0; i < 8; i++)
		slot[TFAB_WIRE_MSG_HDR + 4 + i] = i == 7 ? 0x7f : 0xff;
	assert_int_equal(tfab__wire_msg_decode(slot, len, &d), -TFAB_ERR_PROTOCOL);
}

static void test_meta_data_round_trip(void **state)
{
	struct tfab_wire_msg m;

	(void)state;
	for (unsigned ndim = 0; ndim <= TFAB_MAX_DIMS; ndim++)
		for (int dead = 0; dead < 2; dead++)
			for (int complete = 0; complete < 2; complete++) {
				memset(&m, 0, sizeof(m));
				m.type = TFAB_MSG_META_DATA;
				m.flags = complete ? TFAB_MSGF_COMPLETE : 0;
				m.seq = ndim;
				m.req_index = ndim << 20 | 5;
				make_meta(&m.meta, ndim, dead);
				msg_round_trip(&m, TFAB_WIRE_MSG_HDR + 4 + 16 + 8 * ndim);
			}

	/* An empty tensor, other dtypes, and limits of the fields. */
	memset(&m, 0, sizeof(m));
	m.type = TFAB_MSG_META_DATA;
	m.flags = TFAB_MSGF_COMPLETE;
	m.meta.dtype_code = 5;
	m.meta.dtype_bits = 64;
	m.meta.dtype_lanes = 2;
	m.meta.ndim = 3;
	m.meta.shape[0] = INT64_MAX;
	m.meta.shape[1] = 0;
	m.meta.shape[2] = INT64_MAX;
	m.meta.nbytes = 0;
	msg_round_trip(&m, TFAB_WIRE_MSG_HDR + 4 + 16 + 24);

	m.meta.dtype_code = 254;
	m.meta.dtype_bits = 8;
	m.meta.dtype_lanes = 1;
	m.meta.ndim = 1;
	m.meta.shape[0] = INT64_MAX;
	m.meta.nbytes = INT64_MAX;
	msg_round_trip(&m, TFAB_WIRE_MSG_HDR + 4 + 16 + 8);

	/* A string tensor: nbytes is its TensorProto's size, up to 2 GiB - 1, not the shape's. */
	m.flags = 0;
	m.meta.dtype_code = TFAB_WIRE_DTYPE_STRING;
	m.meta.dtype_bits = 0;
	m.meta.dtype_lanes = 0;
	m.meta.shape[0] = 3;
	m.meta.nbytes = TFAB_WIRE_MAX_STRING_BYTES;
	msg_round_trip(&m, TFAB_WIRE_MSG_HDR + 4 + 16 + 8);
}

/* String meta-data that breaks its rules is refused. */
static void test_reject_string_meta(void **state)
{
	struct tfab_wire_msg m;
	uint8_t slot[SLOT];
	size_t len;

	(void)state;
	for (int k = 0; k < 5; k++) {
		memset(&m, 0, sizeof(m));
		m.type = TFAB_MSG_META_DATA;
		m.meta.dtype_code = TFAB_WIRE_DTYPE_STRING;
		m.meta.ndim = 1;
		m.meta.shape[0] = 2;
		m.meta.nbytes = 10;
		switch (k) {
		case 0: /* bits of a DLPack type */
			m.meta.dtype_bits = 8;
			break;
		case 1: /* lanes */
			m.meta.dtype_lanes = 1;
			break;
		case 2: /* content for an empty tensor */
			m.meta.shape[0] = 0;
			break;
		case 3: /* content for a dead tensor */
			m.meta.is_dead = 1;
			break;
		default: /* over TensorFlow's 2 GiB */
			m.meta.nbytes = (uint64_t)TFAB_WIRE_MAX_STRING_BYTES + 1;
			break;
		}
		assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), -EINVAL);
	}
}

static void test_error_round_trip(void **state)
{
	static const uint16_t lens[] = {0, 1, 100, TFAB_WIRE_MAX_ERRMSG};
	static const int32_t statuses[] = {-1, -TFAB_ERR_ABORTED, -TFAB_ERR_REMOTE, INT32_MIN};
	char text[TFAB_WIRE_MAX_ERRMSG];
	struct tfab_wire_msg m;

	(void)state;
	for (size_t i = 0; i < sizeof(text); i++)
		text[i] = (char)('a' + i % 26);
	for (size_t l = 0; l < 4; l++)
		for (size_t s = 0; s < 4; s++) {
			memset(&m, 0, sizeof(m));
			m.type = TFAB_MSG_ERROR;
			m.seq = (uint32_t)s;
			m.req_index = (uint32_t)l;
			m.status = statuses[s];
			m.errmsg_len = lens[l];
			m.errmsg = lens[l] ? text : NULL;
			msg_round_trip(&m, TFAB_WIRE_MSG_HDR + 10 + lens[l]);
		}
}

static void test_cancel_round_trip(void **state)
{
	struct tfab_wire_msg m;

	(void)state;
	sample_cancel(&m);
	msg_round_trip(&m, TFAB_WIRE_MSG_HDR + 4);
	m.seq = 0;
	m.req_index = 0;
	msg_round_trip(&m, TFAB_WIRE_MSG_HDR + 4);
}

static void test_taken_round_trip(void **state)
{
	uint32_t more[TFAB_WIRE_MAX_TAKEN - 1];
	struct tfab_wire_msg m;

	(void)state;
	sample_taken(&m);
	msg_round_trip(&m, TFAB_WIRE_MSG_HDR + 6 + 8);
	m.ntaken = 1;
	msg_round_trip(&m, TFAB_WIRE_MSG_HDR + 6);
	/* As many as a message holds, and it fits the smallest slot. */
	for (unsigned i = 0; i < TFAB_WIRE_MAX_TAKEN - 1; i++)
		more[i] = 0x40000000u + i;
	m.ntaken = TFAB_WIRE_MAX_TAKEN;
	m.taken = more;
	msg_round_trip(&m, TFAB_WIRE_MSG_HDR + 6 + 4 * (TFAB_WIRE_MAX_TAKEN - 1));
	assert_true(TFAB_WIRE_MSG_HDR + 6 + 4 * (TFAB_WIRE_MAX_TAKEN - 1) <= TFAB_WIRE_MIN_SLOT);
}

/* A slot of a request with a TAKEN after it, as the engine sends one (more, seq as given). */
static size_t two_message_slot(uint8_t *slot, size_t cap, uint16_t more1, uint16_t more2,
			       uint32_t seq2)
{
	size_t n = sizeof(request_bytes);

	memset(slot, 0, cap);
	memcpy(slot, request_bytes, n);
	tfab__wire_msg_set_more(slot, more1);
	memcpy(slot + n, taken_bytes, sizeof(taken_bytes));
	tfab__wire_msg_set_more(slot + n, more2);
	patch_le(slot + n + 8, seq2, 4);
	return n + sizeof(taken_bytes);
}

/* A slot's messages are read in order, and the end is seen. */
static void test_slot_messages(void **state)
{
	uint8_t slot[TFAB_WIRE_MIN_SLOT];
	struct tfab_wire_slot_reader rd;
	struct tfab_wire_msg m;

	(void)state;
	/* One message, as every slot of version 2 was. */
	memset(slot, 0, sizeof(slot));
	memcpy(slot, cancel_bytes, sizeof(cancel_bytes));
	tfab__wire_slot_start(&rd, slot, sizeof(slot));
	assert_int_equal(tfab__wire_slot_next(&rd, &m), 1);
	assert_int_equal(m.type, TFAB_MSG_CANCEL);
	assert_int_equal(m.more, 0);
	assert_int_equal(tfab__wire_slot_next(&rd, &m), 0);
	assert_int_equal(tfab__wire_slot_next(&rd, &m), 0);

	/* Two: a request, then a TAKEN with the same seq. */
	two_message_slot(slot, sizeof(slot), 1, 0, 0x01020304);
	tfab__wire_slot_start(&rd, slot, sizeof(slot));
	assert_int_equal(tfab__wire_slot_next(&rd, &m), 1);
	assert_int_equal(m.type, TFAB_MSG_TENSOR_REQUEST);
	assert_int_equal(m.more, 1);
	assert_memory_equal(m.key, "ab", 2);
	assert_int_equal(tfab__wire_slot_next(&rd, &m), 1);
	assert_int_equal(m.type, TFAB_MSG_TAKEN);
	assert_int_equal(m.seq, 0x01020304);
	assert_int_equal(m.ntaken, 3);
	assert_int_equal(tfab__wire_taken_at(&m, 2), 0x7fffffff);
	assert_int_equal(tfab__wire_slot_next(&rd, &m), 0);

	/* The encoder writes `more`, and tfab__wire_msg_set_more changes it in place. */
	sample_taken(&m);
	m.more = 7;
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &(size_t){0}), 0);
	assert_int_equal(slot[12], 7);
	tfab__wire_msg_set_more(slot, 0x102);
	assert_int_equal(slot[12] | slot[13] << 8, 0x102);
	assert_int_equal(slot[14] | slot[15], 0);
}

/* A message after the first unlike it (seq, count) or not there is a protocol error. */
static void test_slot_reject(void **state)
{
	uint8_t slot[TFAB_WIRE_MIN_SLOT];
	struct tfab_wire_slot_reader rd;
	struct tfab_wire_msg m;
	size_t used;
	struct {
		uint16_t more1, more2;
		uint32_t seq2;
	} bad[] = {
	    {1, 0, 0x01020305}, /* another seq */
	    {1, 0, 0},		/* seq 0 */
	    {1, 1, 0x01020304}, /* the second says one more follows: none does */
	    {2, 0, 0x01020304}, /* the first says two follow, the second none */
	    {2, 2, 0x01020304}, /* a count that does not go down */
	};
	size_t n;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		two_message_slot(slot, sizeof(slot), bad[i].more1, bad[i].more2, bad[i].seq2);
		tfab__wire_slot_start(&rd, slot, sizeof(slot));
		assert_int_equal(tfab__wire_slot_next(&rd, &m), 1);
		assert_int_equal(tfab__wire_slot_next(&rd, &m), -TFAB_ERR_PROTOCOL);
	}
	/* Credits in a message after the first. */
	n = two_message_slot(slot, sizeof(slot), 1, 0, 0x01020304);
	tfab__wire_msg_set_credits(slot + sizeof(request_bytes), 3);
	tfab__wire_slot_start(&rd, slot, n);
	assert_int_equal(tfab__wire_slot_next(&rd, &m), 1);
	assert_int_equal(tfab__wire_slot_next(&rd, &m), -TFAB_ERR_PROTOCOL);
	/* ...but in the first they are the slot's. */
	two_message_slot(slot, sizeof(slot), 1, 0, 0x01020304);
	tfab__wire_msg_set_credits(slot, 3);
	tfab__wire_slot_start(&rd, slot, n);
	assert_int_equal(tfab__wire_slot_next(&rd, &m), 1);
	assert_int_equal(m.credits, 3);
	assert_int_equal(tfab__wire_slot_next(&rd, &m), 1);
	assert_int_equal(tfab__wire_slot_next(&rd, &m), 0);
	/* The first says one follows, and the rest of the slot is zeros. */
	two_message_slot(slot, sizeof(slot), 1, 0, 0x01020304);
	memset(slot + sizeof(request_bytes), 0, sizeof(taken_bytes));
	tfab__wire_slot_start(&rd, slot, sizeof(slot));
	assert_int_equal(tfab__wire_slot_next(&rd, &m), 1);
	assert_int_equal(tfab__wire_slot_next(&rd, &m), -TFAB_ERR_PROTOCOL);
	/* The second runs past the end of the slot, by any amount. */
	used = two_message_slot(slot, sizeof(slot), 1, 0, 0x01020304);
	for (size_t len = sizeof(request_bytes); len < used; len++) {
		tfab__wire_slot_start(&rd, slot, len);
		assert_int_equal(tfab__wire_slot_next(&rd, &m), 1);
		assert_int_equal(tfab__wire_slot_next(&rd, &m), -TFAB_ERR_PROTOCOL);
	}
	tfab__wire_slot_start(&rd, slot, used);
	assert_int_equal(tfab__wire_slot_next(&rd, &m), 1);
	assert_int_equal(tfab__wire_slot_next(&rd, &m), 1);
	assert_int_equal(tfab__wire_slot_next(&rd, &m), 0);
}

/* The largest message of each type fits the smallest slot. */
static void test_largest_fits_min_slot(void **state)
{
	uint8_t key[TFAB_MAX_KEY], slot[TFAB_WIRE_MIN_SLOT];
	char text[TFAB_WIRE_MAX_ERRMSG];
	struct tfab_wire_msg m;
	size_t len;

	(void)state;
	memset(key, 'x', sizeof(key));
	memset(text, 'y', sizeof(text));
	memset(&m, 0, sizeof(m));
	m.type = TFAB_MSG_TENSOR_REQUEST;
	m.flags = TFAB_MSGF_META_VALID | TFAB_MSGF_REREQUEST;
	m.key_len = TFAB_MAX_KEY;
	m.key = key;
	make_meta(&m.meta, TFAB_MAX_DIMS, false);
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), 0);
	assert_int_equal(len, 16 + 38 + 512 + 16 + 256);

	memset(&m, 0, sizeof(m));
	m.type = TFAB_MSG_ERROR;
	m.status = -1;
	m.errmsg_len = TFAB_WIRE_MAX_ERRMSG;
	m.errmsg = text;
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), 0);
}

/* ---- Messages: rejection ---- */

static void test_reject_header(void **state)
{
	uint8_t buf[64];
	struct tfab_wire_msg m;
	struct raw r;

	(void)state;
	/* Version. */
	for (unsigned v = 0; v < 256; v++) {
		if (v == TFAB_WIRE_VERSION)
			continue;
		memcpy(buf, cancel_bytes, sizeof(cancel_bytes));
		buf[0] = (uint8_t)v;
		expect_msg_reject(buf, sizeof(cancel_bytes), -TFAB_ERR_PROTOCOL);
	}
	/* Unknown type. */
	for (unsigned t = 0; t < 256; t++) {
		if (t >= TFAB_MSG_TENSOR_REQUEST && t <= TFAB_MSG_TAKEN)
			continue;
		memcpy(buf, cancel_bytes, sizeof(cancel_bytes));
		buf[1] = (uint8_t)t;
		expect_msg_reject(buf, sizeof(cancel_bytes), -TFAB_ERR_PROTOCOL);
	}
	/* Payload length beyond the slot. */
	memcpy(buf, cancel_bytes, sizeof(cancel_bytes));
	patch_le(buf + 4, 5, 4);
	expect_msg_reject(buf, sizeof(cancel_bytes), -TFAB_ERR_PROTOCOL);
	patch_le(buf + 4, UINT32_MAX, 4);
	expect_msg_reject(buf, sizeof(cancel_bytes), -TFAB_ERR_PROTOCOL);
	patch_le(buf + 4, 0x80000004u, 4);
	expect_msg_reject(buf, sizeof(cancel_bytes), -TFAB_ERR_PROTOCOL);
	/* Credits (bytes 14 and 15): at most the largest ring; `more` (12, 13): test_slot_*. */
	memcpy(buf, cancel_bytes, sizeof(cancel_bytes));
	patch_le(buf + 14, TFAB_WIRE_MAX_SLOTS, 2);
	assert_int_equal(decode_exact(buf, sizeof(cancel_bytes), &m), 0);
	assert_int_equal(m.credits, TFAB_WIRE_MAX_SLOTS);
	patch_le(buf + 14, TFAB_WIRE_MAX_SLOTS + 1, 2);
	expect_msg_reject(buf, sizeof(cancel_bytes), -TFAB_ERR_PROTOCOL);
	patch_le(buf + 14, 0xffff, 2);
	expect_msg_reject(buf, sizeof(cancel_bytes), -TFAB_ERR_PROTOCOL);
	/* Unknown flags, and flags of another type. */
	for (unsigned bit = 0; bit < 16; bit++) {
		uint16_t f = (uint16_t)(1u << bit);

		memcpy(buf, cancel_bytes, sizeof(cancel_bytes));
		patch_le(buf + 2, f, 2);
		expect_msg_reject(buf, sizeof(cancel_bytes), -TFAB_ERR_PROTOCOL);

		memcpy(buf, error_bytes, sizeof(error_bytes));
		patch_le(buf + 2, f, 2);
		expect_msg_reject(buf, sizeof(error_bytes), -TFAB_ERR_PROTOCOL);

		if (f != TFAB_MSGF_COMPLETE) {
			memcpy(buf, meta_data_bytes, sizeof(meta_data_bytes));
			patch_le(buf + 2, f | TFAB_MSGF_COMPLETE, 2);
			expect_msg_reject(buf, sizeof(meta_data_bytes), -TFAB_ERR_PROTOCOL);
		}
		if (f != TFAB_MSGF_META_VALID && f != TFAB_MSGF_REREQUEST) {
			raw_request(&r, f, 4);
			raw_fix_len(&r);
			expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
		}
	}
}

static void test_reject_request(void **state)
{
	int64_t shape[TFAB_MAX_DIMS + 1];
	struct tfab_wire_msg m;
	struct raw r;

	(void)state;
	for (size_t i = 0; i < TFAB_MAX_DIMS + 1; i++)
		shape[i] = 1;

	/* The raw builder itself makes valid messages. */
	raw_request(&r, 0, 4);
	raw_fix_len(&r);
	assert_int_equal(decode_exact(r.b, r.n, &m), 0);
	raw_request(&r, TFAB_MSGF_META_VALID, TFAB_MAX_KEY);
	raw_meta(&r, 2, 32, 1, 0, TFAB_MAX_DIMS, 4, shape);
	raw_fix_len(&r);
	assert_int_equal(decode_exact(r.b, r.n, &m), 0);
	assert_int_equal(m.key_len, TFAB_MAX_KEY);

	/* key_len 0, over the maximum, beyond the payload. */
	raw_request(&r, 0, 0);
	raw_fix_len(&r);
	expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
	raw_request(&r, 0, TFAB_MAX_KEY + 1);
	raw_fix_len(&r);
	expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
	raw_request(&r, 0, 8);
	raw_fix_len(&r);
	patch_le(r.b + r.n - 10, 9, 2);
	expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
	patch_le(r.b + r.n - 10, 0xffff, 2);
	expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);

	/* Trailing bytes inside the payload, without and with meta-data. */
	raw_request(&r, 0, 4);
	raw_le(&r, 0, 1);
	raw_fix_len(&r);
	expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
	raw_request(&r, TFAB_MSGF_META_VALID, 4);
	raw_meta(&r, 2, 32, 1, 0, 1, 4, shape);
	raw_le(&r, 0, 8);
	raw_fix_len(&r);
	expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
	/* A meta-data block without META_VALID is trailing garbage too. */
	raw_request(&r, 0, 4);
	raw_meta(&r, 2, 32, 1, 0, 1, 4, shape);
	raw_fix_len(&r);
	expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);

	/* META_VALID without the meta-data, or with part of it. */
	raw_request(&r, TFAB_MSGF_META_VALID, 4);
	raw_fix_len(&r);
	expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
	raw_request(&r, TFAB_MSGF_META_VALID, 4);
	raw_meta(&r, 2, 32, 1, 0, 2, 4, shape);
	r.n -= 8;
	raw_fix_len(&r);
	expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);

	/* The meta-data rules, as checked in META_DATA, apply here too. */
	raw_request(&r, TFAB_MSGF_META_VALID, 4);
	raw_meta(&r, 2, 32, 1, 0, TFAB_MAX_DIMS + 1, 4, shape);
	raw_fix_len(&r);
	expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
	raw_request(&r, TFAB_MSGF_META_VALID, 4);
	raw_meta(&r, 2, 32, 1, 0, 1, 8, shape);
	raw_fix_len(&r);
	expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
}

/* A META_DATA message around a meta-data block; returns the decode status. */
static int meta_case(uint8_t code, uint8_t bits, uint16_t lanes, uint8_t dead, uint8_t ndim,
		     uint64_t nbytes, const int64_t *shape)
{
	struct tfab_wire_msg m;
	struct raw r;
	int rc;

	raw_meta_data(&r);
	raw_meta(&r, code, bits, lanes, dead, ndim, nbytes, shape);
	raw_fix_len(&r);
	rc = decode_exact(r.b, r.n, &m);
	if (rc)
		expect_msg_reject(r.b, r.n, rc);
	return rc;
}

static void test_reject_meta(void **state)
{
	int64_t shape[256]; /* room for any ndim the byte can say */
	int64_t big[3] = {INT64_MAX, 2, 1};
	const int P = -TFAB_ERR_PROTOCOL;
	struct raw r;

	(void)state;
	for (size_t i = 0; i < 256; i++)
		shape[i] = 2;

	/* Valid to begin with, live and dead. */
	assert_int_equal(meta_case(2, 32, 1, 0, 3, 32, shape), 0);
	assert_int_equal(meta_case(2, 32, 1, 1, 3, 32, shape), 0);
	assert_int_equal(meta_case(2, 32, 1, 0, TFAB_MAX_DIMS, 4ull << 32, shape), 0);

	/* ndim over the maximum (with or without room for the dims). */
	assert_int_equal(meta_case(2, 32, 1, 0, TFAB_MAX_DIMS + 1, 4ull << 33, shape), P);
	assert_int_equal(meta_case(2, 32, 1, 0, 255, 0, shape), P);

	/* Negative dimensions, including alongside a zero one. */
	shape[1] = -1;
	assert_int_equal(meta_case(2, 32, 1, 0, 3, 0, shape), P);
	assert_int_equal(meta_case(2, 32, 1, 0, 3, (uint64_t)-16, shape), P);
	shape[1] = INT64_MIN;
	assert_int_equal(meta_case(2, 32, 1, 0, 3, 0, shape), P);
	shape[0] = 0;
	assert_int_equal(meta_case(2, 32, 1, 0, 3, 0, shape), P);
	shape[1] = -1;
	assert_int_equal(meta_case(2, 32, 1, 0, 3, 0, shape), P);
	shape[0] = 2;
	shape[1] = 2;

	/* nbytes off by one either way, live and dead. */
	for (uint8_t dead = 0; dead < 2; dead++) {
		assert_int_equal(meta_case(2, 32, 1, dead, 3, 31, shape), P);
		assert_int_equal(meta_case(2, 32, 1, dead, 3, 33, shape), P);
		assert_int_equal(meta_case(2, 32, 1, dead, 3, 0, shape), P);
		assert_int_equal(meta_case(2, 32, 1, dead, 0, 0, shape), P);
		assert_int_equal(meta_case(2, 32, 1, dead, 0, 4, shape), 0);
	}
	/* Lanes count. */
	assert_int_equal(meta_case(5, 32, 2, 0, 3, 64, shape), 0);
	assert_int_equal(meta_case(5, 32, 2, 0, 3, 32, shape), P);
	/* Sub-byte dtypes round the total up to whole bytes. */
	shape[0] = 3;
	assert_int_equal(meta_case(0, 4, 1, 0, 1, 2, shape), 0);
	assert_int_equal(meta_case(0, 4, 1, 0, 1, 1, shape), P);
	assert_int_equal(meta_case(6, 1, 1, 0, 1, 1, shape), 0);
	shape[0] = 2;
	/* A dtype of no bits holds nothing. */
	assert_int_equal(meta_case(0, 0, 0, 1, 3, 0, shape), 0);
	assert_int_equal(meta_case(0, 0, 1, 1, 3, 1, shape), P);

	/* Sizes up to what nbytes holds are fine, whatever the bits would come to... */
	assert_int_equal(meta_case(0, 8, 1, 0, 1, INT64_MAX, big), 0);
	assert_int_equal(meta_case(0, 8, 1, 0, 2, (uint64_t)INT64_MAX * 2, big), 0);
	assert_int_equal(meta_case(0, 16, 1, 0, 1, (uint64_t)INT64_MAX * 2, big), 0);
	assert_int_equal(meta_case(0, 4, 2, 0, 2, (uint64_t)INT64_MAX * 2, big), 0);
	assert_int_equal(meta_case(0, 1, 3, 0, 2, 3ull << 61, big), 0);
	/* ...and beyond it the tensor is refused, not wrapped: of the size, and of the shape. */
	assert_int_equal(meta_case(0, 16, 1, 0, 2, (uint64_t)INT64_MAX * 4, big), P);
	assert_int_equal(meta_case(0, 16, 1, 0, 2, 0, big), P);
	assert_int_equal(meta_case(0, 8, 2, 0, 2, (uint64_t)INT64_MAX * 4, big), P);
	assert_int_equal(meta_case(0, 255, 65535, 0, 2, 0, big), P);
	/* 9-bit elements, where the whole bytes fit and the leftover bits tip the sum over. */
	{
		int64_t edge[2] = {3, 5465701947765793071}; /* 8 * ((2^64 - 1) / 9) + 5 */

		assert_int_equal(meta_case(0, 9, 1, 0, 2, UINT64_MAX, edge), 0);
		edge[0] = 2;
		edge[1] = 8198552921648689607; /* 8 * ((2^64 - 1) / 9) + 6 */
		assert_int_equal(meta_case(0, 9, 1, 0, 2, 0, edge), P);
		assert_int_equal(meta_case(0, 9, 1, 0, 2, UINT64_MAX, edge), P);
	}
	big[2] = INT64_MAX;
	assert_int_equal(meta_case(0, 8, 1, 0, 3, 0, big), P);
	assert_int_equal(meta_case(0, 8, 1, 0, 3, (uint64_t)INT64_MAX * INT64_MAX * 2, big), P);
	/* ...but a zero dimension makes the tensor empty, whatever the others are. */
	big[1] = 0;
	assert_int_equal(meta_case(0, 8, 1, 0, 3, 0, big), 0);
	assert_int_equal(meta_case(0, 8, 1, 1, 3, 0, big), 0);

	/* is_dead is 0 or 1. */
	assert_int_equal(meta_case(2, 32, 1, 2, 3, 32, shape), P);
	assert_int_equal(meta_case(2, 32, 1, 255, 3, 32, shape), P);

	/* Reserved bytes of the meta-data. */
	for (size_t i = 0; i < 2; i++) {
		raw_meta_data(&r);
		raw_meta(&r, 2, 32, 1, 0, 3, 32, shape);
		r.b[TFAB_WIRE_MSG_HDR + 4 + 6 + i] = 1;
		raw_fix_len(&r);
		expect_msg_reject(r.b, r.n, P);
	}

	/* Missing, short, and trailing bytes in META_DATA. */
	raw_meta_data(&r);
	raw_fix_len(&r);
	expect_msg_reject(r.b, r.n, P);
	raw_meta_data(&r);
	raw_meta(&r, 2, 32, 1, 0, 3, 32, shape);
	r.n--;
	raw_fix_len(&r);
	expect_msg_reject(r.b, r.n, P);
	raw_meta_data(&r);
	raw_meta(&r, 2, 32, 1, 0, 3, 32, shape);
	raw_le(&r, 0, 1);
	raw_fix_len(&r);
	expect_msg_reject(r.b, r.n, P);
}

static void raw_error(struct raw *r, int32_t status, uint16_t msg_len, size_t bytes)
{
	raw_hdr(r, TFAB_MSG_ERROR, 0);
	raw_le(r, 3, 4);
	raw_le(r, (uint32_t)status, 4);
	raw_le(r, msg_len, 2);
	raw_fill(r, 'e', bytes);
	raw_fix_len(r);
}

static void test_reject_error(void **state)
{
	struct tfab_wire_msg m;
	struct raw r;

	(void)state;
	raw_error(&r, -1, TFAB_WIRE_MAX_ERRMSG, TFAB_WIRE_MAX_ERRMSG);
	assert_int_equal(decode_exact(r.b, r.n, &m), 0);
	raw_error(&r, INT32_MIN, 0, 0);
	assert_int_equal(decode_exact(r.b, r.n, &m), 0);
	assert_int_equal(m.status, INT32_MIN);

	raw_error(&r, -1, TFAB_WIRE_MAX_ERRMSG + 1, TFAB_WIRE_MAX_ERRMSG + 1);
	expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
	raw_error(&r, -1, 0xffff, 0);
	expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
	/* msg_len beyond the payload, or short of it. */
	raw_error(&r, -1, 10, 9);
	expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
	raw_error(&r, -1, 10, 11);
	expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
	/* A status that is not a failure. */
	raw_error(&r, 0, 2, 2);
	expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
	raw_error(&r, 1, 2, 2);
	expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
	raw_error(&r, TFAB_ERR_ABORTED, 2, 2);
	expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
	raw_error(&r, INT32_MAX, 2, 2);
	expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
	/* Payload cut before msg_len. */
	raw_error(&r, -1, 0, 0);
	r.n -= 1;
	raw_fix_len(&r);
	expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
}

static void test_reject_cancel(void **state)
{
	struct raw r;

	(void)state;
	for (size_t n = 0; n < 12; n++) {
		if (n == 4)
			continue;
		raw_hdr(&r, TFAB_MSG_CANCEL, 0);
		raw_fill(&r, 0x11, n);
		raw_fix_len(&r);
		expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
	}
}

/* A count beyond what a slot holds, or one the payload does not carry exactly. */
static void test_reject_taken(void **state)
{
	struct raw r;
	struct tfab_wire_msg m;
	uint8_t slot[SLOT];
	size_t len;

	(void)state;
	for (unsigned more = 0; more < 4; more++) {
		for (unsigned have = 0; have < 4; have++) {
			if (have == more)
				continue;
			raw_hdr(&r, TFAB_MSG_TAKEN, 0);
			raw_fill(&r, 0x11, 4);
			raw_fill(&r, (uint8_t)more, 1);
			raw_fill(&r, 0, 1);
			raw_fill(&r, 0x22, 4 * have);
			raw_fix_len(&r);
			expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
		}
	}
	/* 251 more would not fit a slot: refused even where the bytes are there. */
	raw_hdr(&r, TFAB_MSG_TAKEN, 0);
	raw_fill(&r, 0x11, 4);
	raw_fill(&r, TFAB_WIRE_MAX_TAKEN & 0xff, 1);
	raw_fill(&r, TFAB_WIRE_MAX_TAKEN >> 8, 1);
	raw_fill(&r, 0x22, 4 * TFAB_WIRE_MAX_TAKEN);
	raw_fix_len(&r);
	expect_msg_reject(r.b, r.n, -TFAB_ERR_PROTOCOL);
	/* And the encoder refuses none, or more than that. */
	sample_taken(&m);
	m.ntaken = 0;
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), -EINVAL);
	m.ntaken = TFAB_WIRE_MAX_TAKEN + 1;
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), -EINVAL);
}

/* Cut anywhere short of its end, every message is refused: the header claims more. */
static void truncate_all(const struct tfab_wire_msg *m)
{
	uint8_t slot[SLOT];
	struct tfab_wire_msg d;
	size_t len;

	assert_int_equal(tfab__wire_msg_encode(m, slot, sizeof(slot), &len), 0);
	for (size_t n = 0; n < len; n++)
		expect_msg_reject(slot, n, -TFAB_ERR_PROTOCOL);
	assert_int_equal(decode_exact(slot, len, &d), 0);
	assert_msg_equal(m, &d);
}

static void test_truncated(void **state)
{
	uint8_t key[TFAB_MAX_KEY];
	char text[TFAB_WIRE_MAX_ERRMSG];
	struct tfab_wire_msg m;

	(void)state;
	memset(key, 'k', sizeof(key));
	memset(text, 't', sizeof(text));
	sample_request(&m);
	truncate_all(&m);
	m.flags = 0;
	truncate_all(&m);
	m.flags = TFAB_MSGF_META_VALID;
	m.key = key;
	m.key_len = TFAB_MAX_KEY;
	make_meta(&m.meta, TFAB_MAX_DIMS, false);
	truncate_all(&m);
	sample_meta_data(&m);
	truncate_all(&m);
	make_meta(&m.meta, TFAB_MAX_DIMS, false);
	truncate_all(&m);
	sample_error(&m);
	truncate_all(&m);
	m.errmsg_len = TFAB_WIRE_MAX_ERRMSG;
	m.errmsg = text;
	truncate_all(&m);
	m.errmsg_len = 0;
	m.errmsg = NULL;
	truncate_all(&m);
	sample_cancel(&m);
	truncate_all(&m);
}

/* ---- Messages: encoder ---- */

static void msg_encode_fails(const struct tfab_wire_msg *m, size_t cap, int rc)
{
	uint8_t slot[SLOT], before[SLOT];
	size_t len = 12345;

	memset(slot, 0x5a, sizeof(slot));
	memcpy(before, slot, sizeof(slot));
	assert_int_equal(tfab__wire_msg_encode(m, slot, cap, &len), rc);
	assert_int_equal(len, 12345);
	assert_memory_equal(slot, before, sizeof(slot));
}

static void test_encode_invalid(void **state)
{
	struct tfab_wire_msg m;
	size_t len;
	uint8_t slot[SLOT];

	(void)state;
	/* Type. */
	sample_cancel(&m);
	m.type = 0;
	msg_encode_fails(&m, SLOT, -EINVAL);
	m.type = 5;
	msg_encode_fails(&m, SLOT, -EINVAL);
	m.type = TFAB_MSG_LEAVE + 1;
	msg_encode_fails(&m, SLOT, -EINVAL);
	m.type = 255;
	msg_encode_fails(&m, SLOT, -EINVAL);

	/* Flags of another type, or unknown. */
	sample_cancel(&m);
	m.flags = TFAB_MSGF_META_VALID;
	msg_encode_fails(&m, SLOT, -EINVAL);
	sample_error(&m);
	m.flags = TFAB_MSGF_COMPLETE;
	msg_encode_fails(&m, SLOT, -EINVAL);
	sample_meta_data(&m);
	m.flags = TFAB_MSGF_META_VALID;
	msg_encode_fails(&m, SLOT, -EINVAL);
	sample_request(&m);
	m.flags |= TFAB_MSGF_COMPLETE;
	msg_encode_fails(&m, SLOT, -EINVAL);
	sample_request(&m);
	m.flags |= 0x100;
	msg_encode_fails(&m, SLOT, -EINVAL);

	/* Key. */
	sample_request(&m);
	m.key_len = 0;
	msg_encode_fails(&m, SLOT, -EINVAL);
	m.key_len = TFAB_MAX_KEY + 1;
	msg_encode_fails(&m, SLOT, -EINVAL);
	sample_request(&m);
	m.key = NULL;
	msg_encode_fails(&m, SLOT, -EINVAL);

	/* Meta-data, in a request with META_VALID and in META_DATA. */
	for (int t = 0; t < 2; t++) {
		if (t == 0)
			sample_request(&m);
		else
			sample_meta_data(&m);
		m.meta.ndim = TFAB_MAX_DIMS + 1;
		msg_encode_fails(&m, SLOT, -EINVAL);
		make_meta(&m.meta, 3, false);
		m.meta.shape[2] = -1;
		msg_encode_fails(&m, SLOT, -EINVAL);
		make_meta(&m.meta, 3, false);
		m.meta.nbytes++;
		msg_encode_fails(&m, SLOT, -EINVAL);
		make_meta(&m.meta, 3, true);
		m.meta.nbytes = 0;
		msg_encode_fails(&m, SLOT, -EINVAL);
		make_meta(&m.meta, 3, false);
		m.meta.is_dead = 2;
		msg_encode_fails(&m, SLOT, -EINVAL);
		make_meta(&m.meta, 2, false);
		m.meta.shape[0] = INT64_MAX;
		m.meta.shape[1] = INT64_MAX;
		m.meta.nbytes = 0;
		msg_encode_fails(&m, SLOT, -EINVAL);
	}
	/* Without META_VALID the meta-data is not sent, so it is not checked. */
	sample_request(&m);
	m.flags = 0;
	m.meta.ndim = 200;
	assert_int_equal(tfab__wire_msg_encode(&m, slot, sizeof(slot), &len), 0);
	assert_int_equal(len, TFAB_WIRE_MSG_HDR + 38 + 2);

	/* Error. */
	sample_error(&m);
	m.errmsg_len = TFAB_WIRE_MAX_ERRMSG + 1;
	msg_encode_fails(&m, SLOT, -EINVAL);
	sample_error(&m);
	m.errmsg = NULL;
	msg_encode_fails(&m, SLOT, -EINVAL);
	sample_error(&m);
	m.status = 0;
	msg_encode_fails(&m, SLOT, -EINVAL);
	m.status = TFAB_ERR_ABORTED;
	msg_encode_fails(&m, SLOT, -EINVAL);

	/* Invalid is reported before too small. */
	sample_error(&m);
	m.status = 0;
	msg_encode_fails(&m, 0, -EINVAL);
}

static void test_encode_nospace(void **state)
{
	struct tfab_wire_msg msgs[4];
	uint8_t slot[SLOT];
	size_t len;

	(void)state;
	sample_request(&msgs[0]);
	sample_meta_data(&msgs[1]);
	sample_error(&msgs[2]);
	sample_cancel(&msgs[3]);
	for (size_t i = 0; i < 4; i++) {
		assert_int_equal(tfab__wire_msg_encode(&msgs[i], slot, sizeof(slot), &len), 0);
		for (size_t cap = 0; cap < len; cap++)
			msg_encode_fails(&msgs[i], cap, -ENOSPC);
		/* Exactly enough is enough. */
		assert_int_equal(tfab__wire_msg_encode(&msgs[i], slot, len, &len), 0);
	}
}

/* ---- Meta-data comparison ---- */

static void test_meta_equal(void **state)
{
	struct tfab_wire_meta a, b;

	(void)state;
	make_meta(&a, 4, false);
	b = a;
	assert_true(tfab__wire_meta_equal(&a, &b));
	/* Dimensions past ndim do not count. */
	b.shape[4] = 99;
	b.shape[TFAB_MAX_DIMS - 1] = -5;
	assert_true(tfab__wire_meta_equal(&a, &b));

	b = a;
	b.dtype_code = 0;
	assert_false(tfab__wire_meta_equal(&a, &b));
	b = a;
	b.dtype_bits = 16;
	assert_false(tfab__wire_meta_equal(&a, &b));
	b = a;
	b.dtype_lanes = 2;
	assert_false(tfab__wire_meta_equal(&a, &b));
	b = a;
	b.is_dead = 1;
	assert_false(tfab__wire_meta_equal(&a, &b));
	b = a;
	b.ndim = 3;
	assert_false(tfab__wire_meta_equal(&a, &b));
	b = a;
	b.nbytes++;
	assert_false(tfab__wire_meta_equal(&a, &b));
	for (unsigned i = 0; i < 4; i++) {
		b = a;
		b.shape[i]++;
		assert_false(tfab__wire_meta_equal(&a, &b));
	}
	/* The same shape with ndim 0. */
	make_meta(&a, 0, true);
	make_meta(&b, 0, true);
	b.shape[0] = 7;
	assert_true(tfab__wire_meta_equal(&a, &b));
}

/* ---- Fuzzing ---- */

/*
 * A decoded message re-encodes, within the slot it came from, to the very bytes it was decoded
 * from (the encoding is canonical), and those decode to an equal message.
 */
static void check_reencode(const uint8_t *buf, size_t len, const struct tfab_wire_msg *m)
{
	uint8_t out[SLOT];
	struct tfab_wire_msg d;
	size_t n = 0, used;

	assert_true(len >= TFAB_WIRE_MSG_HDR);
	used = TFAB_WIRE_MSG_HDR + (buf[4] | buf[5] << 8 | buf[6] << 16 | (size_t)buf[7] << 24);
	assert_true(used <= len && used <= SLOT);
	assert_int_equal(tfab__wire_msg_encode(m, out, used, &n), 0);
	assert_int_equal(n, used);
	assert_memory_equal(out, buf, n);
	assert_int_equal(decode_exact(out, n, &d), 0);
	assert_msg_equal(m, &d);
	assert_msg_equal(&d, m);
}

/* A decoded blob re-encodes to the bytes it was decoded from (the rest of them are ignored). */
static void check_blob_reencode(const uint8_t *buf, size_t len, const struct tfab_wire_blob *b)
{
	static uint8_t out[BLOB_MAX];
	struct tfab_wire_blob d;
	size_t n = 0;

	assert_int_equal(tfab__wire_blob_encode(b, out, sizeof(out), &n), 0);
	assert_int_equal(n, blob_len(b));
	assert_true(n <= len);
	assert_memory_equal(out, buf, n);
	assert_int_equal(blob_decode_exact(out, n, &d), 0);
	assert_blob_equal(b, &d);
}

static const uint8_t interesting[] = {0, 1, 2, 3, 4, 5, 0x7f, 0x80, 0xff, 0x20, 0x21, 0xfe};

static void mutate(uint8_t *buf, size_t span)
{
	size_t flips = 1 + rng_below(4);

	if (!span)
		return;
	for (size_t i = 0; i < flips; i++) {
		size_t at = rng_below(span);

		switch (rng_below(3)) {
		case 0:
			buf[at] ^= (uint8_t)(1u << rng_below(8));
			break;
		case 1:
			buf[at] = interesting[rng_below(sizeof(interesting))];
			break;
		default:
			buf[at] = (uint8_t)rng();
			break;
		}
	}
}

struct seed {
	uint8_t b[SLOT];
	size_t n;
};

static void add_seed(struct seed *s, size_t *count, const struct tfab_wire_msg *m)
{
	assert_int_equal(tfab__wire_msg_encode(m, s[*count].b, SLOT, &s[*count].n), 0);
	(*count)++;
}

static void test_fuzz_messages(void **state)
{
	static struct seed seeds[16];
	uint8_t key[TFAB_MAX_KEY], buf[SLOT];
	char text[TFAB_WIRE_MAX_ERRMSG];
	struct tfab_wire_msg m, d;
	size_t count = 0, ok = 0;

	(void)state;
	rng_state = 0x7466616277697265ull;
	for (size_t i = 0; i < sizeof(key); i++)
		key[i] = (uint8_t)rng();
	memset(text, '!', sizeof(text));

	sample_request(&m);
	add_seed(seeds, &count, &m);
	m.flags = 0;
	add_seed(seeds, &count, &m);
	m.flags = TFAB_MSGF_META_VALID;
	m.key = key;
	m.key_len = 300;
	make_meta(&m.meta, 7, false);
	add_seed(seeds, &count, &m);
	make_meta(&m.meta, TFAB_MAX_DIMS, true);
	add_seed(seeds, &count, &m);
	sample_meta_data(&m);
	add_seed(seeds, &count, &m);
	make_meta(&m.meta, 5, false);
	m.meta.shape[1] = 0;
	m.meta.nbytes = 0;
	add_seed(seeds, &count, &m);
	m.meta.dtype_bits = 4;
	m.meta.ndim = 1;
	m.meta.shape[0] = 5;
	m.meta.nbytes = 3;
	add_seed(seeds, &count, &m);
	sample_error(&m);
	add_seed(seeds, &count, &m);
	m.errmsg_len = TFAB_WIRE_MAX_ERRMSG;
	m.errmsg = text;
	add_seed(seeds, &count, &m);
	m.errmsg_len = 0;
	add_seed(seeds, &count, &m);
	sample_cancel(&m);
	add_seed(seeds, &count, &m);
	sample_taken(&m);
	add_seed(seeds, &count, &m);

	for (size_t it = 0; it < FUZZ_MSG_ITERS; it++) {
		const struct seed *s = &seeds[rng_below(count)];
		size_t len;
		int rc;

		/* The rest of the slot holds stale bytes. */
		for (size_t i = s->n; i < SLOT; i++)
			buf[i] = (uint8_t)rng();
		memcpy(buf, s->b, s->n);
		mutate(buf, rng_below(4) ? s->n : SLOT);
		switch (rng_below(4)) {
		case 0:
			len = SLOT;
			break;
		case 1:
			len = rng_below(s->n + 17);
			break;
		default:
			len = s->n;
			break;
		}
		rc = decode_exact(buf, len, &m);
		if (rc == 0) {
			ok++;
			check_reencode(buf, len, &m);
		} else {
			assert_int_equal(rc, -TFAB_ERR_PROTOCOL);
		}
	}
	/* The mutations leave some messages valid, so the property was exercised. */
	assert_true(ok > FUZZ_MSG_ITERS / 100);

	/* Purely random bytes, then random bytes behind a plausible header. */
	for (size_t it = 0; it < FUZZ_RANDOM_ITERS; it++) {
		size_t len = rng_below(SLOT + 1);
		int rc;

		for (size_t i = 0; i < len; i++)
			buf[i] = (uint8_t)rng();
		if ((it & 1) && len >= TFAB_WIRE_MSG_HDR) {
			buf[0] = TFAB_WIRE_VERSION;
			buf[1] = (uint8_t)(1 + rng_below(4));
			buf[2] = (uint8_t)(rng() & 7);
			buf[3] = 0;
			patch_le(buf + 4, rng_below(len - TFAB_WIRE_MSG_HDR + 1), 4);
			memset(buf + 12, 0, 4);
		}
		rc = decode_exact(buf, len, &d);
		if (rc == 0)
			check_reencode(buf, len, &d);
		else
			assert_int_equal(rc, -TFAB_ERR_PROTOCOL);
	}
}

static void test_fuzz_blobs(void **state)
{
	static struct seed seeds[3];
	static uint8_t buf[SLOT + 16];
	uint8_t addr[64];
	char host[16];
	struct tfab_wire_blob b;
	size_t count = 3, ok = 0;

	(void)state;
	rng_state = 0x626c6f62ull;
	for (size_t i = 0; i < sizeof(addr); i++)
		addr[i] = (uint8_t)rng();
	for (size_t i = 0; i < sizeof(host); i++)
		host[i] = (char)rng();
	/* The sample, four paths with a host, one path without. */
	memcpy(seeds[0].b, blob_bytes, sizeof(blob_bytes));
	seeds[0].n = sizeof(blob_bytes);
	sample_blob(&b);
	b.host_len = sizeof(host);
	b.host = host;
	b.npaths = TFAB_WIRE_MAX_PATHS;
	for (unsigned i = 0; i < TFAB_WIRE_MAX_PATHS; i++) {
		b.paths[i] = b.paths[i % 2];
		b.paths[i].addr_len = (uint16_t)(16 * (i + 1));
		b.paths[i].addr = addr;
	}
	assert_int_equal(tfab__wire_blob_encode(&b, seeds[1].b, SLOT, &seeds[1].n), 0);
	sample_blob(&b);
	b.host_len = 0;
	b.npaths = 1;
	b.paths[0].same_host = false;
	assert_int_equal(tfab__wire_blob_encode(&b, seeds[2].b, SLOT, &seeds[2].n), 0);

	for (size_t it = 0; it < FUZZ_BLOB_ITERS; it++) {
		const struct seed *s = &seeds[rng_below(count)];
		size_t len;
		int rc;

		for (size_t i = 0; i < sizeof(buf); i++)
			buf[i] = (uint8_t)rng();
		memcpy(buf, s->b, s->n);
		mutate(buf, rng_below(4) ? s->n : TFAB_WIRE_BLOB_HDR);
		len = rng_below(2) ? s->n : rng_below(s->n + 17);
		rc = blob_decode_exact(buf, len, &b);
		if (rc == 0) {
			ok++;
			check_blob_reencode(buf, len, &b);
		} else {
			assert_true(rc == -TFAB_ERR_PROTOCOL || rc == -TFAB_ERR_VERSION);
			if (rc == -TFAB_ERR_VERSION)
				assert_memory_equal(buf, "TFAB", 4);
		}
	}
	assert_true(ok > FUZZ_BLOB_ITERS / 100);

	/* Purely random bytes, then random bytes behind a plausible header. */
	for (size_t it = 0; it < FUZZ_RANDOM_ITERS / 2; it++) {
		size_t len = rng_below(sizeof(buf) + 1);
		int rc;

		for (size_t i = 0; i < len; i++)
			buf[i] = (uint8_t)rng();
		if ((it & 1) && len >= TFAB_WIRE_BLOB_HDR) {
			memcpy(buf, "TFAB\2\0", 6);
			patch_le(buf + B_NPATHS, 1 + rng_below(TFAB_WIRE_MAX_PATHS), 2);
			patch_le(buf + B_SLOTS, 1 + rng_below(TFAB_WIRE_MAX_SLOTS), 4);
			patch_le(buf + B_SIZE, TFAB_WIRE_MIN_SLOT + rng_below(4096), 4);
			patch_le(buf + B_PEER, rng_below(TFAB_WIRE_MAX_PEER_ID + 1), 4);
			patch_le(buf + B_HOST_LEN, rng_below(len - TFAB_WIRE_BLOB_HDR + 1), 2);
			patch_le(buf + B_RESERVED, 0, 2);
		}
		rc = blob_decode_exact(buf, len, &b);
		if (rc == 0)
			check_blob_reencode(buf, len, &b);
		else
			assert_true(rc == -TFAB_ERR_PROTOCOL || rc == -TFAB_ERR_VERSION);
	}
}

/* ---- Immediates ---- */

static void check_imm_msg(uint32_t peer, uint32_t slot)
{
	uint32_t imm = tfab__imm_msg(peer, slot);

	assert_true(tfab__imm_is_ctrl(imm));
	assert_false(tfab__imm_is_credit(imm));
	assert_int_equal(tfab__imm_peer(imm), peer);
	assert_int_equal(tfab__imm_low(imm), slot);
}

static void check_imm_credit(uint32_t peer, uint32_t n)
{
	uint32_t imm = tfab__imm_credit(peer, n);

	assert_true(tfab__imm_is_ctrl(imm));
	assert_true(tfab__imm_is_credit(imm));
	assert_int_equal(tfab__imm_peer(imm), peer);
	assert_int_equal(tfab__imm_low(imm), n);
}

static void test_immediates(void **state)
{
	static const uint32_t edge_peers[] = {0, 1, 0x3ff, 0x400, 0x80000, TFAB_WIRE_MAX_PEER_ID};

	(void)state;
	/* Pinned bit positions. */
	assert_int_equal(tfab__imm_msg(1, 2), 0x80000402u);
	assert_int_equal(tfab__imm_credit(TFAB_WIRE_MAX_PEER_ID, 1023), 0xffffffffu);
	assert_int_equal(tfab__imm_msg(TFAB_WIRE_MAX_PEER_ID, 1023), 0xbfffffffu);

	/* Every peer id, with slots and credit counts cycling through their range. */
	for (uint32_t peer = 0; peer <= TFAB_WIRE_MAX_PEER_ID; peer++) {
		check_imm_msg(peer, peer % 1024);
		check_imm_credit(peer, 1 + peer % 1023);
	}
	/* Every slot and credit count, with the edge peer ids. */
	for (size_t p = 0; p < sizeof(edge_peers) / sizeof(edge_peers[0]); p++)
		for (uint32_t v = 0; v < 1024; v++) {
			check_imm_msg(edge_peers[p], v);
			if (v)
				check_imm_credit(edge_peers[p], v);
		}

	/* A request index (bit 31 clear) is never control, whatever its other bits. */
	assert_false(tfab__imm_is_ctrl(0));
	assert_false(tfab__imm_is_ctrl(0x7fffffffu));
	assert_false(tfab__imm_is_ctrl(TFAB_IMM_CREDIT));
	assert_false(tfab__imm_is_credit(TFAB_IMM_CREDIT));
	assert_false(tfab__imm_is_credit(0x7fffffffu));
	rng_state = 42;
	for (int i = 0; i < 1000000; i++) {
		uint32_t idx = (uint32_t)rng() & 0x7fffffffu;

		assert_false(tfab__imm_is_ctrl(idx));
		assert_false(tfab__imm_is_credit(idx));
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_key_index_round_trip),
	    cmocka_unit_test(test_coll_data),
	    cmocka_unit_test(test_ahead_round_trip),
	    cmocka_unit_test(test_blob_known_bytes),
	    cmocka_unit_test(test_blob_round_trip),
	    cmocka_unit_test(test_blob_trailing_bytes_ignored),
	    cmocka_unit_test(test_blob_reject_header),
	    cmocka_unit_test(test_blob_reject_paths),
	    cmocka_unit_test(test_blob_accept_limits),
	    cmocka_unit_test(test_blob_truncated),
	    cmocka_unit_test(test_blob_encode_invalid),
	    cmocka_unit_test(test_blob_encode_nospace),
	    cmocka_unit_test(test_msg_known_bytes),
	    cmocka_unit_test(test_request_round_trip),
	    cmocka_unit_test(test_meta_data_round_trip),
	    cmocka_unit_test(test_error_round_trip),
	    cmocka_unit_test(test_cancel_round_trip),
	    cmocka_unit_test(test_taken_round_trip),
	    cmocka_unit_test(test_largest_fits_min_slot),
	    cmocka_unit_test(test_slot_messages),
	    cmocka_unit_test(test_slot_reject),
	    cmocka_unit_test(test_reject_header),
	    cmocka_unit_test(test_reject_request),
	    cmocka_unit_test(test_reject_meta),
	    cmocka_unit_test(test_reject_string_meta),
	    cmocka_unit_test(test_reject_error),
	    cmocka_unit_test(test_reject_cancel),
	    cmocka_unit_test(test_reject_taken),
	    cmocka_unit_test(test_truncated),
	    cmocka_unit_test(test_encode_invalid),
	    cmocka_unit_test(test_encode_nospace),
	    cmocka_unit_test(test_meta_equal),
	    cmocka_unit_test(test_fuzz_messages),
	    cmocka_unit_test(test_fuzz_blobs),
	    cmocka_unit_test(test_immediates),
	};

	return cmocka_run_group_tests(tests, NULL, release_kept);
}
