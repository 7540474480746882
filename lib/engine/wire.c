/*
 * The wire protocol of doc/protocol.md: explicit little-endian packing of connection blobs and
 * message slots. The decoders trust nothing they are given: every field is read through a
 * bounded cursor, and a decoded message must pass the same validation the encoder applies, so
 * whatever decodes re-encodes to the same bytes.
 *
 * Resolved details the document leaves open: reserved fields must be zero; each message type
 * allows only its own flags; is_dead is 0 or 1; nbytes of a sub-byte dtype rounds the total
 * bits up to whole bytes; a blob may be followed by bytes of the caller's (they are ignored).
 */
#include <errno.h>
#include <string.h>

#include <tfab/engine.h>
#include <tfab/status.h>

#include "engine/wire.h"

#define META_HDR 16
#define REQ_FIXED 38
#define ERR_FIXED 10
#define TAKEN_FIXED 6

static const uint16_t allowed_flags[] = {
    [TFAB_MSG_TENSOR_REQUEST] =
	TFAB_MSGF_META_VALID | TFAB_MSGF_REREQUEST | TFAB_MSGF_KEY_INDEX | TFAB_MSGF_AHEAD,
    [TFAB_MSG_META_DATA] = TFAB_MSGF_COMPLETE,
    [TFAB_MSG_ERROR] = 0,
    [TFAB_MSG_CANCEL] = 0,
    [TFAB_MSG_TAKEN] = 0,
    [TFAB_MSG_RETIRE] = 0,
    [TFAB_MSG_COLL_DATA] = TFAB_MSGF_DEAD,
    [TFAB_MSG_LEAVE] = 0,
};

/* Writing: the caller has checked the room, so the cursor only advances. */

/*
 * The widths the codec writes, spelled out as le_at's below are, so that the compiler merges
 * each into one store: a byte loop (about 40 instructions for an 8-byte field) was half of a
 * request's encoding.
 */
static inline void st_le(uint8_t *p, uint64_t v, size_t n)
{
	switch (n) {
	case 8:
		p[4] = (uint8_t)(v >> 32);
		p[5] = (uint8_t)(v >> 40);
		p[6] = (uint8_t)(v >> 48);
		p[7] = (uint8_t)(v >> 56);
		/* fall through */
	case 4:
		p[2] = (uint8_t)(v >> 16);
		p[3] = (uint8_t)(v >> 24);
		/* fall through */
	case 2:
		p[1] = (uint8_t)(v >> 8);
		/* fall through */
	case 1:
		p[0] = (uint8_t)v;
		break;
	default:
		for (size_t i = 0; i < n; i++)
			p[i] = (uint8_t)(v >> (8 * i));
	}
}

static uint8_t *put_le(uint8_t *p, uint64_t v, size_t n)
{
	st_le(p, v, n);
	return p + n;
}

static uint8_t *put_bytes(uint8_t *p, const void *src, size_t n)
{
	if (n)
		memcpy(p, src, n);
	return p + n;
}

/* Reading: a short read marks the cursor bad and yields zeros from then on. */

struct rd {
	const uint8_t *p;
	size_t left;
	bool bad;
};

/*
 * The widths the codec reads, spelled out so that the compiler makes each one load (a byte
 * loop per field was most of a control message's decoding).
 */
static inline uint64_t le_at(const uint8_t *p, size_t n)
{
	uint64_t v = 0;

	switch (n) {
	case 1:
		return p[0];
	case 2:
		return (uint64_t)p[0] | (uint64_t)p[1] << 8;
	case 4:
		return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 |
		       (uint64_t)p[3] << 24;
	case 8:
		return le_at(p, 4) | le_at(p + 4, 4) << 32;
	default:
		for (size_t i = 0; i < n; i++)
			v |= (uint64_t)p[i] << (8 * i);
		return v;
	}
}

static inline uint64_t get_le(struct rd *r, size_t n)
{
	uint64_t v;

	if (r->bad || r->left < n) {
		r->bad = true;
		return 0;
	}
	v = le_at(r->p, n);
	r->p += n;
	r->left -= n;
	return v;
}

static inline const uint8_t *get_bytes(struct rd *r, size_t n)
{
	const uint8_t *p = r->p;

	if (r->bad || r->left < n) {
		r->bad = true;
		return NULL;
	}
	r->p += n;
	r->left -= n;
	return p;
}

/* Two's complement without relying on implementation-defined conversions. */
static int64_t to_s64(uint64_t v)
{
	return v <= INT64_MAX ? (int64_t)v : -(int64_t)(~v) - 1;
}

static int32_t to_s32(uint32_t v)
{
	return v <= INT32_MAX ? (int32_t)v : -(int32_t)(~v) - 1;
}

static bool mul_u64(uint64_t a, uint64_t b, uint64_t *r_p)
{
	if (a != 0 && b > UINT64_MAX / a)
		return false;
	*r_p = a * b;
	return true;
}

/* ---- Connection blob ---- */

_Static_assert(TFAB_WIRE_MAX_BLOB <= TFAB_PEER_BLOB_MAX, "a blob fits the public bound");

static bool blob_valid(const struct tfab_wire_blob *b)
{
	if (b->ring_slots < 1 || b->ring_slots > TFAB_WIRE_MAX_SLOTS ||
	    b->slot_size < TFAB_WIRE_MIN_SLOT || b->peer_id > TFAB_WIRE_MAX_PEER_ID ||
	    b->host_len > TFAB_WIRE_MAX_HOST || b->npaths < 1 || b->npaths > TFAB_WIRE_MAX_PATHS)
		return false;
	for (unsigned i = 0; i < b->npaths; i++) {
		const struct tfab_wire_path *w = &b->paths[i];

		if (w->name_len < 1 || w->name_len > TFAB_WIRE_MAX_PATH_NAME || w->addr_len < 1 ||
		    w->addr_len > TFAB_WIRE_MAX_ADDR)
			return false;
	}
	return true;
}

int tfab__wire_blob_encode(const struct tfab_wire_blob *b, void *buf, size_t cap, size_t *len_p)
{
	size_t need = TFAB_WIRE_BLOB_HDR + b->host_len;
	uint8_t *p = buf;

	if (!blob_valid(b) || (b->host_len && !b->host))
		return -EINVAL;
	for (unsigned i = 0; i < b->npaths; i++) {
		if (!b->paths[i].name || !b->paths[i].addr)
			return -EINVAL;
		need += TFAB_WIRE_PATH_HDR + b->paths[i].name_len + b->paths[i].addr_len;
	}
	if (cap < need)
		return -ENOSPC;

	p = put_le(p, TFAB_WIRE_MAGIC, 4);
	p = put_le(p, TFAB_WIRE_VERSION, 2);
	p = put_le(p, b->npaths, 2);
	p = put_le(p, b->ring_slots, 4);
	p = put_le(p, b->slot_size, 4);
	p = put_le(p, b->peer_id, 4);
	p = put_le(p, b->host_len, 2);
	p = put_le(p, 0, 2);
	p = put_bytes(p, b->host, b->host_len);
	for (unsigned i = 0; i < b->npaths; i++) {
		const struct tfab_wire_path *w = &b->paths[i];

		p = put_le(p, w->name_len, 1);
		p = put_le(p, w->same_host ? 1 : 0, 1);
		p = put_le(p, w->addr_len, 2);
		p = put_le(p, w->ring_raddr, 8);
		p = put_le(p, w->ring_rkey, 8);
		p = put_bytes(p, w->name, w->name_len);
		p = put_bytes(p, w->addr, w->addr_len);
	}
	*len_p = need;
	return 0;
}

int tfab__wire_blob_decode(const void *buf, size_t len, struct tfab_wire_blob *b)
{
	struct rd r = {.p = buf, .left = len};
	struct tfab_wire_blob out = {0};
	uint32_t magic, reserved;
	uint16_t version;

	/* The magic and version come first, so that a peer of another version is named as such
	 * even when its blob is shaped differently. */
	magic = (uint32_t)get_le(&r, 4);
	if (r.bad || magic != TFAB_WIRE_MAGIC)
		return -TFAB_ERR_PROTOCOL;
	version = (uint16_t)get_le(&r, 2);
	if (r.bad)
		return -TFAB_ERR_PROTOCOL;
	if (version != TFAB_WIRE_VERSION)
		return -TFAB_ERR_VERSION;

	out.npaths = (uint16_t)get_le(&r, 2);
	out.ring_slots = (uint32_t)get_le(&r, 4);
	out.slot_size = (uint32_t)get_le(&r, 4);
	out.peer_id = (uint32_t)get_le(&r, 4);
	out.host_len = (uint16_t)get_le(&r, 2);
	reserved = (uint32_t)get_le(&r, 2);
	if (r.bad || reserved != 0 || out.npaths < 1 || out.npaths > TFAB_WIRE_MAX_PATHS ||
	    out.host_len > TFAB_WIRE_MAX_HOST)
		return -TFAB_ERR_PROTOCOL;
	out.host = (const char *)get_bytes(&r, out.host_len);
	for (unsigned i = 0; i < out.npaths && !r.bad; i++) {
		struct tfab_wire_path *w = &out.paths[i];
		uint8_t flags;

		w->name_len = (uint8_t)get_le(&r, 1);
		flags = (uint8_t)get_le(&r, 1);
		w->addr_len = (uint16_t)get_le(&r, 2);
		w->ring_raddr = get_le(&r, 8);
		w->ring_rkey = get_le(&r, 8);
		if (r.bad || flags > 1 || w->name_len < 1 ||
		    w->name_len > TFAB_WIRE_MAX_PATH_NAME || w->addr_len < 1 ||
		    w->addr_len > TFAB_WIRE_MAX_ADDR)
			return -TFAB_ERR_PROTOCOL;
		w->same_host = flags & 1;
		w->name = (const char *)get_bytes(&r, w->name_len);
		w->addr = get_bytes(&r, w->addr_len);
	}
	if (r.bad || !blob_valid(&out))
		return -TFAB_ERR_PROTOCOL;
	*b = out;
	return 0;
}

/* ---- Meta-data ---- */

static size_t meta_size(const struct tfab_wire_meta *mt)
{
	return META_HDR + 8 * (size_t)mt->ndim;
}

static bool meta_valid(const struct tfab_wire_meta *mt)
{
	uint64_t elems = 1, bits, whole, rest;
	bool empty = false;

	if (mt->is_dead > 1 || mt->ndim > TFAB_MAX_DIMS)
		return false;
	for (unsigned i = 0; i < mt->ndim; i++) {
		if (mt->shape[i] < 0)
			return false;
		if (mt->shape[i] == 0)
			empty = true;
	}
	/* An empty tensor holds nothing, however large its other dimensions. */
	if (empty) {
		elems = 0;
	} else {
		for (unsigned i = 0; i < mt->ndim; i++)
			if (!mul_u64(elems, (uint64_t)mt->shape[i], &elems))
				return false;
	}
	/* Strings: the serialized TensorProto's size, none when empty or dead. */
	if (mt->dtype_code == TFAB_WIRE_DTYPE_STRING)
		return mt->dtype_bits == 0 && mt->dtype_lanes == 0 &&
		       mt->nbytes <= TFAB_WIRE_MAX_STRING_BYTES && (elems || mt->nbytes == 0) &&
		       (!mt->is_dead || mt->nbytes == 0);
	/* ceil(elems * bits / 8) without overflowing on the way to a result that fits. */
	bits = (uint64_t)mt->dtype_bits * mt->dtype_lanes;
	if (!mul_u64(elems / 8, bits, &whole))
		return false;
	rest = (elems % 8 * bits + 7) / 8;
	if (whole > UINT64_MAX - rest)
		return false;
	return mt->nbytes == whole + rest;
}

static uint8_t *put_meta(uint8_t *p, const struct tfab_wire_meta *mt)
{
	p = put_le(p, mt->dtype_code, 1);
	p = put_le(p, mt->dtype_bits, 1);
	p = put_le(p, mt->dtype_lanes, 2);
	p = put_le(p, mt->is_dead, 1);
	p = put_le(p, mt->ndim, 1);
	p = put_le(p, 0, 2);
	p = put_le(p, mt->nbytes, 8);
	for (unsigned i = 0; i < mt->ndim; i++)
		p = put_le(p, (uint64_t)mt->shape[i], 8);
	return p;
}

static void get_meta(struct rd *r, struct tfab_wire_meta *mt)
{
	mt->dtype_code = (uint8_t)get_le(r, 1);
	mt->dtype_bits = (uint8_t)get_le(r, 1);
	mt->dtype_lanes = (uint16_t)get_le(r, 2);
	mt->is_dead = (uint8_t)get_le(r, 1);
	mt->ndim = (uint8_t)get_le(r, 1);
	if (get_le(r, 2) != 0 || mt->ndim > TFAB_MAX_DIMS) {
		r->bad = true;
		return;
	}
	mt->nbytes = get_le(r, 8);
	for (unsigned i = 0; i < mt->ndim; i++)
		mt->shape[i] = to_s64(get_le(r, 8));
}

bool tfab__wire_meta_equal(const struct tfab_wire_meta *a, const struct tfab_wire_meta *b)
{
	if (a->dtype_code != b->dtype_code || a->dtype_bits != b->dtype_bits ||
	    a->dtype_lanes != b->dtype_lanes || a->is_dead != b->is_dead || a->ndim != b->ndim ||
	    a->nbytes != b->nbytes)
		return false;
	for (unsigned i = 0; i < a->ndim && i < TFAB_MAX_DIMS; i++)
		if (a->shape[i] != b->shape[i])
			return false;
	return true;
}

void tfab__wire_string_len_put(void *content, uint64_t len)
{
	put_le(content, len, TFAB_WIRE_STRING_LEN);
}

uint64_t tfab__wire_string_len_get(const void *content)
{
	struct rd r = {.p = content, .left = TFAB_WIRE_STRING_LEN};

	return get_le(&r, TFAB_WIRE_STRING_LEN);
}

bool tfab__wire_meta_takes(const struct tfab_wire_meta *asked, const struct tfab_wire_meta *have,
			   uint64_t capacity)
{
	struct tfab_wire_meta a;

	if (capacity < have->nbytes)
		return false;
	if (tfab__wire_meta_equal(asked, have))
		return true;
	if (asked->dtype_code != TFAB_WIRE_DTYPE_STRING || !asked->nbytes || !have->nbytes)
		return false;
	a = *asked;
	a.nbytes = have->nbytes;
	return tfab__wire_meta_equal(&a, have);
}

/* ---- Messages ---- */

static bool has_meta(const struct tfab_wire_msg *m)
{
	return m->type == TFAB_MSG_META_DATA ||
	       (m->type == TFAB_MSG_TENSOR_REQUEST && (m->flags & TFAB_MSGF_META_VALID));
}

/* The rules both sides apply; pointers are checked by the encoder only. */
static bool msg_valid(const struct tfab_wire_msg *m)
{
	if (m->type < TFAB_MSG_TENSOR_REQUEST || m->type > TFAB_MSG_LEAVE)
		return false;
	if (m->flags & ~allowed_flags[m->type] || m->credits > TFAB_WIRE_MAX_SLOTS)
		return false;
	if (has_meta(m) && !meta_valid(&m->meta))
		return false;
	switch (m->type) {
	case TFAB_MSG_TENSOR_REQUEST:
		/*
		 * Requests ahead: sized from meta-data, never a re-request, at least one, and
		 * their steps within int64.
		 */
		if ((m->flags & TFAB_MSGF_AHEAD) &&
		    ((m->flags & (TFAB_MSGF_META_VALID | TFAB_MSGF_REREQUEST)) !=
			 TFAB_MSGF_META_VALID ||
		     m->nahead == 0 || m->step_id > INT64_MAX - (int64_t)m->nahead))
			return false;
		/* A key, or (KEY_INDEX) none: then the index alone names it. */
		return (m->key_len >= 1 && m->key_len <= TFAB_MAX_KEY) ||
		       (m->key_len == 0 && (m->flags & TFAB_MSGF_KEY_INDEX));
	case TFAB_MSG_ERROR:
		return m->status < 0 && m->errmsg_len <= TFAB_WIRE_MAX_ERRMSG;
	case TFAB_MSG_TAKEN:
	case TFAB_MSG_RETIRE:
		return m->ntaken >= 1 && m->ntaken <= TFAB_WIRE_MAX_TAKEN;
	case TFAB_MSG_COLL_DATA:
		/* a dead operand carries no bytes; a live one at least one */
		return (m->flags & TFAB_MSGF_DEAD)
			   ? m->data_len == 0
			   : m->data_len >= 1 && m->data_len <= TFAB_WIRE_MAX_COLL_DATA;
	case TFAB_MSG_LEAVE:
		return m->req_index == 0; /* reserved */
	default:
		return true;
	}
}

static size_t msg_payload(const struct tfab_wire_msg *m)
{
	size_t n = has_meta(m) ? meta_size(&m->meta) : 0;

	switch (m->type) {
	case TFAB_MSG_TENSOR_REQUEST:
		return REQ_FIXED + (size_t)m->key_len + n +
		       ((m->flags & TFAB_MSGF_KEY_INDEX) ? 4 : 0) +
		       ((m->flags & TFAB_MSGF_AHEAD) ? 2 + TFAB_WIRE_AHEAD_ENTRY * (size_t)m->nahead
						     : 0);
	case TFAB_MSG_META_DATA:
		return 4 + n;
	case TFAB_MSG_ERROR:
		return ERR_FIXED + (size_t)m->errmsg_len;
	case TFAB_MSG_TAKEN:
	case TFAB_MSG_RETIRE:
		return TAKEN_FIXED + 4 * (size_t)(m->ntaken - 1);
	case TFAB_MSG_COLL_DATA:
		return TFAB_WIRE_COLL_FIXED + (size_t)m->data_len;
	default:
		return 4;
	}
}

int tfab__wire_msg_encode(const struct tfab_wire_msg *m, void *slot, size_t cap, size_t *len_p)
{
	uint8_t *p = slot;
	size_t payload, need;

	if (!msg_valid(m))
		return -EINVAL;
	if (m->type == TFAB_MSG_TENSOR_REQUEST && m->key_len && !m->key)
		return -EINVAL;
	if (m->type == TFAB_MSG_ERROR && m->errmsg_len && !m->errmsg)
		return -EINVAL;
	if ((m->type == TFAB_MSG_TAKEN || m->type == TFAB_MSG_RETIRE) && m->ntaken > 1 &&
	    !m->taken && !m->taken_le)
		return -EINVAL;
	if ((m->flags & TFAB_MSGF_AHEAD) && !m->ahead && !m->ahead_le)
		return -EINVAL;
	if (m->type == TFAB_MSG_COLL_DATA && m->data_len && !m->data)
		return -EINVAL;
	payload = msg_payload(m);
	need = TFAB_WIRE_MSG_HDR + payload;
	if (cap < need)
		return -ENOSPC;

	p = put_le(p, TFAB_WIRE_VERSION, 1);
	p = put_le(p, m->type, 1);
	p = put_le(p, m->flags, 2);
	p = put_le(p, payload, 4);
	p = put_le(p, m->seq, 4);
	p = put_le(p, m->more, 2);
	p = put_le(p, m->credits, 2);
	p = put_le(p, m->req_index, 4);
	switch (m->type) {
	case TFAB_MSG_TENSOR_REQUEST:
		p = put_le(p, (uint64_t)m->step_id, 8);
		p = put_le(p, m->dest_raddr, 8);
		p = put_le(p, m->dest_rkey, 8);
		p = put_le(p, m->dest_capacity, 8);
		p = put_le(p, m->key_len, 2);
		p = put_bytes(p, m->key, m->key_len);
		if (m->flags & TFAB_MSGF_KEY_INDEX)
			p = put_le(p, m->key_index, 4);
		if (m->flags & TFAB_MSGF_META_VALID)
			p = put_meta(p, &m->meta);
		if (m->flags & TFAB_MSGF_AHEAD) {
			p = put_le(p, m->nahead, 2);
			for (unsigned i = 0; i < m->nahead; i++) {
				struct tfab_wire_ahead a = tfab__wire_ahead_at(m, i);

				p = put_le(p, a.req_index, 4);
				p = put_le(p, a.dest_raddr, 8);
				p = put_le(p, a.dest_rkey, 8);
			}
		}
		break;
	case TFAB_MSG_META_DATA:
		put_meta(p, &m->meta);
		break;
	case TFAB_MSG_ERROR:
		p = put_le(p, (uint32_t)m->status, 4);
		p = put_le(p, m->errmsg_len, 2);
		put_bytes(p, m->errmsg, m->errmsg_len);
		break;
	case TFAB_MSG_TAKEN:
	case TFAB_MSG_RETIRE:
		p = put_le(p, m->ntaken - 1u, 2);
		for (unsigned i = 1; i < m->ntaken; i++)
			p = put_le(p, tfab__wire_taken_at(m, i), 4);
		break;
	case TFAB_MSG_COLL_DATA:
		p = put_le(p, (uint64_t)m->step_id, 8);
		p = put_le(p, m->key_index, 4);
		p = put_le(p, m->coll_tag, 1);
		p = put_le(p, m->data_len, 2);
		put_bytes(p, m->data, m->data_len);
		break;
	default:
		break;
	}
	*len_p = need;
	return 0;
}

struct tfab_wire_ahead tfab__wire_ahead_at(const struct tfab_wire_msg *m, unsigned i)
{
	struct rd r = {.p = m->ahead_le + (size_t)i * TFAB_WIRE_AHEAD_ENTRY,
		       .left = TFAB_WIRE_AHEAD_ENTRY};
	struct tfab_wire_ahead a;

	if (m->ahead)
		return m->ahead[i];
	a.req_index = (uint32_t)get_le(&r, 4);
	a.dest_raddr = get_le(&r, 8);
	a.dest_rkey = get_le(&r, 8);
	return a;
}

size_t tfab__wire_ahead_room(const struct tfab_wire_msg *m, size_t cap)
{
	struct tfab_wire_msg base = *m;
	size_t need;

	base.flags |= TFAB_MSGF_AHEAD;
	base.nahead = 0;
	need = TFAB_WIRE_MSG_HDR + msg_payload(&base);
	return cap > need ? (cap - need) / TFAB_WIRE_AHEAD_ENTRY : 0;
}

void tfab__wire_msg_set_seq(void *msg, uint32_t seq)
{
	put_le((uint8_t *)msg + 8, seq, 4);
}

void tfab__wire_msg_set_more(void *msg, uint16_t more)
{
	put_le((uint8_t *)msg + 12, more, 2);
}

void tfab__wire_msg_set_credits(void *msg, uint16_t credits)
{
	put_le((uint8_t *)msg + 14, credits, 2);
}

/* One message at slot (len bytes left there); its encoded length goes to *used_p. */
static int msg_decode(const void *slot, size_t len, struct tfab_wire_msg *m, size_t *used_p)
{
	struct rd r = {.p = slot, .left = len};
	struct tfab_wire_msg out;
	uint32_t payload;

	/* All but the shape, which get_meta fills as far as ndim (0 without meta-data). */
	tfab__wire_msg_init(&out, 0);

	if (get_le(&r, 1) != TFAB_WIRE_VERSION)
		return -TFAB_ERR_PROTOCOL;
	out.type = (uint8_t)get_le(&r, 1);
	out.flags = (uint16_t)get_le(&r, 2);
	payload = (uint32_t)get_le(&r, 4);
	out.seq = (uint32_t)get_le(&r, 4);
	out.more = (uint16_t)get_le(&r, 2);
	out.credits = (uint16_t)get_le(&r, 2);
	if (r.bad || payload > r.left)
		return -TFAB_ERR_PROTOCOL;
	*used_p = TFAB_WIRE_MSG_HDR + payload;
	/* From here on only the declared payload counts; the rest of the slot is stale. */
	r.left = payload;

	out.req_index = (uint32_t)get_le(&r, 4);
	switch (out.type) {
	case TFAB_MSG_TENSOR_REQUEST:
		out.step_id = to_s64(get_le(&r, 8));
		out.dest_raddr = get_le(&r, 8);
		out.dest_rkey = get_le(&r, 8);
		out.dest_capacity = get_le(&r, 8);
		out.key_len = (uint16_t)get_le(&r, 2);
		out.key = out.key_len ? get_bytes(&r, out.key_len) : NULL;
		if (out.flags & TFAB_MSGF_KEY_INDEX)
			out.key_index = (uint32_t)get_le(&r, 4);
		if (out.flags & TFAB_MSGF_META_VALID)
			get_meta(&r, &out.meta);
		if (out.flags & TFAB_MSGF_AHEAD) {
			out.nahead = (uint16_t)get_le(&r, 2);
			out.ahead_le = get_bytes(&r, TFAB_WIRE_AHEAD_ENTRY * (size_t)out.nahead);
		}
		break;
	case TFAB_MSG_META_DATA:
		get_meta(&r, &out.meta);
		break;
	case TFAB_MSG_ERROR:
		out.status = to_s32((uint32_t)get_le(&r, 4));
		out.errmsg_len = (uint16_t)get_le(&r, 2);
		out.errmsg = (const char *)get_bytes(&r, out.errmsg_len);
		break;
	case TFAB_MSG_CANCEL:
	case TFAB_MSG_LEAVE:
		break;
	case TFAB_MSG_TAKEN:
	case TFAB_MSG_RETIRE: {
		size_t more = (size_t)get_le(&r, 2);

		if (more >= TFAB_WIRE_MAX_TAKEN)
			return -TFAB_ERR_PROTOCOL;
		out.ntaken = (uint16_t)(more + 1);
		out.taken_le = get_bytes(&r, 4 * more);
		break;
	}
	case TFAB_MSG_COLL_DATA:
		out.step_id = to_s64(get_le(&r, 8));
		out.key_index = (uint32_t)get_le(&r, 4);
		out.coll_tag = (uint8_t)get_le(&r, 1);
		out.data_len = (uint16_t)get_le(&r, 2);
		out.data = out.data_len ? get_bytes(&r, out.data_len) : NULL;
		break;
	default:
		return -TFAB_ERR_PROTOCOL;
	}
	/* The payload length must be exactly what the fields need: no trailing bytes. */
	if (r.bad || r.left != 0 || !msg_valid(&out))
		return -TFAB_ERR_PROTOCOL;
	tfab__wire_msg_copy(m, &out);
	return 0;
}

int tfab__wire_msg_decode(const void *slot, size_t len, struct tfab_wire_msg *m)
{
	size_t used;

	return msg_decode(slot, len, m, &used);
}

int tfab__wire_slot_next(struct tfab_wire_slot_reader *rd, struct tfab_wire_msg *m)
{
	size_t used;
	int rc;

	if (rd->started && rd->left == 0)
		return 0;
	rc = msg_decode(rd->slot + rd->off, rd->len - rd->off, m, &used);
	if (rc)
		return rc;
	if (!rd->started) {
		rd->started = true;
		rd->seq = m->seq;
	} else if (m->seq != rd->seq || m->more != rd->left - 1 || m->credits) {
		/* credits ride in the first message of a slot only */
		return -TFAB_ERR_PROTOCOL;
	}
	rd->left = m->more;
	rd->off += used;
	return 1;
}
