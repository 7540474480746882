/*
 * The wire protocol (doc/protocol.md): connection blobs, immediates, message slots. Encoding
 * and decoding only; no state. Every decoder checks every length against the bytes it was
 * given and returns -TFAB_ERR_PROTOCOL for anything malformed.
 */
#ifndef TFAB_ENGINE_WIRE_H
#define TFAB_ENGINE_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define TFAB_WIRE_VERSION 7
#define TFAB_WIRE_MAGIC 0x42414654u
#define TFAB_WIRE_BLOB_HDR 24
#define TFAB_WIRE_PATH_HDR 20 /* each path entry, before its name and address */
#define TFAB_WIRE_MAX_PATHS 4
#define TFAB_WIRE_MAX_PATH_NAME 31
#define TFAB_WIRE_MAX_HOST 128
/* The longest blob: every field at its limit. */
#define TFAB_WIRE_MAX_BLOB                         \
	(TFAB_WIRE_BLOB_HDR + TFAB_WIRE_MAX_HOST + \
	 TFAB_WIRE_MAX_PATHS *                     \
	     (TFAB_WIRE_PATH_HDR + TFAB_WIRE_MAX_PATH_NAME + TFAB_WIRE_MAX_ADDR))
#define TFAB_WIRE_MAX_ADDR 1024
#define TFAB_WIRE_MSG_HDR 16
#define TFAB_WIRE_MIN_SLOT 1024
#define TFAB_WIRE_MAX_SLOTS 1024
#define TFAB_MAX_KEY 512
#define TFAB_MAX_DIMS 32
#define TFAB_WIRE_MAX_ERRMSG 256
#define TFAB_WIRE_MAX_PEER_ID ((1u << 20) - 1)

/* Immediates. */
#define TFAB_IMM_CTRL 0x80000000u
#define TFAB_IMM_CREDIT 0x40000000u

static inline uint32_t tfab__imm_msg(uint32_t peer_id, uint32_t slot)
{
	return TFAB_IMM_CTRL | peer_id << 10 | slot;
}

static inline uint32_t tfab__imm_credit(uint32_t peer_id, uint32_t n)
{
	return TFAB_IMM_CTRL | TFAB_IMM_CREDIT | peer_id << 10 | n;
}

/* A chunk of tensor content that is not the last: the receiver ignores its immediate. */
static inline uint32_t tfab__imm_partial(uint32_t peer_id)
{
	return tfab__imm_credit(peer_id, 0);
}

static inline bool tfab__imm_is_ctrl(uint32_t imm)
{
	return (imm & TFAB_IMM_CTRL) != 0;
}

static inline bool tfab__imm_is_credit(uint32_t imm)
{
	return (imm & (TFAB_IMM_CTRL | TFAB_IMM_CREDIT)) == (TFAB_IMM_CTRL | TFAB_IMM_CREDIT);
}

static inline uint32_t tfab__imm_peer(uint32_t imm)
{
	return (imm >> 10) & TFAB_WIRE_MAX_PEER_ID;
}

static inline uint32_t tfab__imm_low(uint32_t imm)
{
	return imm & 0x3ffu;
}

/* One path a side offers in its connection blob: a backend's endpoint and our inbox on it. */
struct tfab_wire_path {
	uint64_t ring_raddr;
	uint64_t ring_rkey;
	uint8_t name_len;
	bool same_host; /* reaches only processes on the same host (flags bit 0) */
	uint16_t addr_len;
	const char *name;    /* "shm", "verbs", "ofi:tcp"; not NUL-terminated */
	const uint8_t *addr; /* the endpoint's address; decode: both point into the input */
};

/* The connection blob: what is common to every path, then each path in the side's order. */
struct tfab_wire_blob {
	uint32_t ring_slots;
	uint32_t slot_size;
	uint32_t peer_id;
	uint16_t host_len;
	uint16_t npaths;
	const char
	    *host; /* the host's identity (same_host paths need it equal); not NUL-terminated */
	struct tfab_wire_path paths[TFAB_WIRE_MAX_PATHS];
};

/* Encode into buf (cap bytes); the length goes to *len_p. -ENOSPC if it does not fit. */
int tfab__wire_blob_encode(const struct tfab_wire_blob *b, void *buf, size_t cap, size_t *len_p);
/* -TFAB_ERR_VERSION for another version, -TFAB_ERR_PROTOCOL for anything malformed. */
int tfab__wire_blob_decode(const void *buf, size_t len, struct tfab_wire_blob *b);

enum tfab_wire_type {
	TFAB_MSG_TENSOR_REQUEST = 1,
	TFAB_MSG_META_DATA = 2,
	TFAB_MSG_ERROR = 3,
	TFAB_MSG_CANCEL = 4,
	TFAB_MSG_TAKEN = 5,
	TFAB_MSG_RETIRE = 6,	/* key indexes the receiver gave up (protocol.md, "Key indexes") */
	TFAB_MSG_COLL_DATA = 7, /* a collective's small operand, eager (protocol.md) */
	TFAB_MSG_LEAVE = 8,	/* the writer writes nothing more (protocol.md) */
};

/* Request indexes one TAKEN message carries: its req_index and up to 250 more. */
#define TFAB_WIRE_MAX_TAKEN 251

enum {
	TFAB_MSGF_META_VALID = 1,
	TFAB_MSGF_REREQUEST = 2,
	TFAB_MSGF_COMPLETE = 4,
	TFAB_MSGF_KEY_INDEX = 8, /* TENSOR_REQUEST: key_index follows the key (or replaces it) */
	TFAB_MSGF_AHEAD = 16, /* TENSOR_REQUEST: requests for the next steps follow the meta-data */
	TFAB_MSGF_DEAD = 32,  /* COLL_DATA: no bytes; the sender's collective failed */
};

/* COLL_DATA: its fields before the bytes, and the most bytes one carries (in the 1024-byte slot). */
#define TFAB_WIRE_COLL_FIXED 19
#define TFAB_WIRE_MAX_COLL_DATA 960

/*
 * One more request that a TENSOR_REQUEST with AHEAD carries: for the step after the one
 * before it, with the first's key, capacity and meta-data (protocol.md, "No-request mode").
 */
struct tfab_wire_ahead {
	uint32_t req_index;
	uint64_t dest_raddr, dest_rkey;
};
#define TFAB_WIRE_AHEAD_ENTRY 20 /* its encoded bytes */

/*
 * dtype_code of a string tensor (bits and lanes 0): its content is a TensorProto, nbytes its
 * serialized size, 0 when the tensor is empty or dead.
 */
#define TFAB_WIRE_DTYPE_STRING 0xffu
/* A string tensor's content: this many bytes of length (little-endian), then the TensorProto. */
#define TFAB_WIRE_STRING_LEN 8u
void tfab__wire_string_len_put(void *content, uint64_t len);
uint64_t tfab__wire_string_len_get(const void *content);
#define TFAB_WIRE_MAX_STRING_BYTES 0x7fffffffu

struct tfab_wire_meta {
	uint8_t dtype_code;
	uint8_t dtype_bits;
	uint16_t dtype_lanes;
	uint8_t is_dead;
	uint8_t ndim;
	uint64_t nbytes;
	int64_t shape[TFAB_MAX_DIMS];
};

/* A decoded message; pointers point into the slot it was decoded from. */
struct tfab_wire_msg {
	uint8_t type;
	uint16_t flags;
	uint32_t seq;
	uint16_t more;	  /* messages after this one in its slot */
	uint16_t credits; /* the first of a slot: credits returned with it */
	uint32_t req_index;
	/* TENSOR_REQUEST */
	int64_t step_id;
	uint64_t dest_raddr, dest_rkey, dest_capacity;
	uint16_t key_len;
	const uint8_t *key;
	/*
	 * With KEY_INDEX: a key (key_len > 0) announces key_index as its name from now on; no
	 * key (key_len 0) names it by key_index alone.
	 */
	uint32_t key_index;
	/*
	 * TENSOR_REQUEST with AHEAD: nahead more requests, for steps step_id + 1 on; from ahead
	 * (encode) or little-endian at ahead_le (decode); tfab__wire_ahead_at reads either.
	 */
	uint16_t nahead;
	const struct tfab_wire_ahead *ahead;
	const uint8_t *ahead_le;
	/* ERROR */
	int32_t status;
	uint16_t errmsg_len;
	const char *errmsg;
	/*
	 * TAKEN: ntaken request indexes in all (RETIRE: key indexes, the same way), req_index the first. The others come from
	 * taken (encode) or lie little-endian at taken_le (decode); tfab__wire_taken_at reads
	 * either.
	 */
	uint16_t ntaken;
	const uint32_t *taken;
	const uint8_t *taken_le;
	/*
	 * COLL_DATA: the collective's step in step_id, the operation's step in req_index and its
	 * piece in key_index, its tag (a letter) in coll_tag; data_len bytes at data.
	 */
	uint8_t coll_tag;
	uint16_t data_len;
	const uint8_t *data;
	/*
	 * TENSOR_REQUEST (with META_VALID) and META_DATA. Last, so that a decode writes no
	 * more of the shape than meta.ndim entries: those after them are left as they were.
	 */
	struct tfab_wire_meta meta;
};

/*
 * *m as a message of this type with every other field 0, but for the shape, whose entries past
 * meta.ndim (0 here) nothing reads: a whole message is some 420 bytes, 256 of them the shape,
 * and clearing it cost a small fetch about what encoding it does.
 */
static inline void tfab__wire_msg_init(struct tfab_wire_msg *m, uint8_t type)
{
	memset(m, 0, offsetof(struct tfab_wire_msg, meta.shape));
	m->type = type;
}

/* *dst = *src as far as the shape's meta.ndim entries (as tfab__meta_copy). */
static inline void tfab__wire_msg_copy(struct tfab_wire_msg *dst, const struct tfab_wire_msg *src)
{
	unsigned ndim = src->meta.ndim < TFAB_MAX_DIMS ? src->meta.ndim : TFAB_MAX_DIMS;

	memcpy(dst, src,
	       offsetof(struct tfab_wire_msg, meta.shape) + sizeof(src->meta.shape[0]) * ndim);
}

/* The i-th request index (0 <= i < ntaken) of a TAKEN message. */
static inline uint32_t tfab__wire_taken_at(const struct tfab_wire_msg *m, unsigned i)
{
	const uint8_t *p;

	if (i == 0)
		return m->req_index;
	if (m->taken)
		return m->taken[i - 1];
	p = m->taken_le + 4 * (size_t)(i - 1);
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The i-th (0 <= i < nahead) request after the first of a TENSOR_REQUEST with AHEAD. */
struct tfab_wire_ahead tfab__wire_ahead_at(const struct tfab_wire_msg *m, unsigned i);

/* How many AHEAD entries fit beside request m (its own nahead aside) in cap bytes. */
size_t tfab__wire_ahead_room(const struct tfab_wire_msg *m, size_t cap);

/*
 * Encode a message into a slot of cap bytes; the whole length goes to *len_p. A slot may hold
 * several messages back to back: each after the first starts where the one before ended, with
 * the same seq, and each says in `more` how many follow it.
 */
int tfab__wire_msg_encode(const struct tfab_wire_msg *m, void *slot, size_t cap, size_t *len_p);
/* Set `seq`, `more`, or `credits`, in the header of the encoded message at msg. */
void tfab__wire_msg_set_seq(void *msg, uint32_t seq);
void tfab__wire_msg_set_more(void *msg, uint16_t more);
void tfab__wire_msg_set_credits(void *msg, uint16_t credits);

/* Decode the first message of a slot of len bytes (the header says how much is used). */
int tfab__wire_msg_decode(const void *slot, size_t len, struct tfab_wire_msg *m);

/* Reads a slot's messages in order (tfab__wire_slot_next). */
struct tfab_wire_slot_reader {
	const uint8_t *slot;
	size_t len, off;
	unsigned left; /* messages still to read, once the first is read */
	uint32_t seq;
	bool started;
};

static inline void tfab__wire_slot_start(struct tfab_wire_slot_reader *rd, const void *slot,
					 size_t len)
{
	*rd = (struct tfab_wire_slot_reader){.slot = slot, .len = len};
}

/*
 * The slot's next message into *m: 1, 0 once its last was read, or -TFAB_ERR_PROTOCOL (a
 * message that does not decode, or a seq or `more` unlike the messages before it).
 */
int tfab__wire_slot_next(struct tfab_wire_slot_reader *rd, struct tfab_wire_msg *m);

/* Whether two meta-data are the same tensor layout (dtype, is_dead, shape, nbytes). */
bool tfab__wire_meta_equal(const struct tfab_wire_meta *a, const struct tfab_wire_meta *b);

/*
 * *dst = *src as far as the shape's ndim entries: those past them are never read (a decode
 * leaves them as they were too), and a whole meta-data is 272 bytes, copied several times a
 * fetch, where most tensors have a few dimensions.
 */
static inline void tfab__meta_copy(struct tfab_wire_meta *dst, const struct tfab_wire_meta *src)
{
	unsigned ndim = src->ndim < TFAB_MAX_DIMS ? src->ndim : TFAB_MAX_DIMS;

	memcpy(dst, src, offsetof(struct tfab_wire_meta, shape) + sizeof(src->shape[0]) * ndim);
}
/*
 * Whether a request that gave asked, with room for capacity bytes, can take content of have:
 * the same layout, or string tensors of the same shape whose serialized size changed and
 * fits (the content says its length).
 */
bool tfab__wire_meta_takes(const struct tfab_wire_meta *asked, const struct tfab_wire_meta *have,
			   uint64_t capacity);

#endif
