/*
 * Writes the fuzz targets' seed corpora (test/fuzz/corpus/TARGET/) from the library's own
 * encoders (the shm ring's from ring.h's producer), so that they follow the wire when it
 * changes:
 *   build/test/fuzz/fuzz-seeds test/fuzz/corpus
 */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include <tfab/status.h>
#include <tfab/tensorproto.h>

#include "engine/engine.h"
#include "engine/wire.h"
#include "world/world.h"
#include "fuzz.h"
#include "fuzz_shm_ring.h"
#include "fuzz_bootstrap.h"
#include "util/sock.h"
#include "providers/shm/shm.h"
#ifdef TFAB_HAVE_VERBS
#include "providers/verbs/verbs.h"
#endif

static const char *root;

static void put(const char *target, const char *name, const void *buf, size_t len)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", root, target);
	if (mkdir(path, 0755) && errno != EEXIST) {
		perror(path);
		exit(1);
	}
	snprintf(path, sizeof(path), "%s/%s/%s", root, target, name);
	f = fopen(path, "wb");
	if (!f || fwrite(buf, 1, len, f) != len || fclose(f)) {
		perror(path);
		exit(1);
	}
}

/* Messages one after another in one slot, as the engine batches them. */
static size_t slot_of(const struct tfab_wire_msg *ms, unsigned n, uint8_t *slot, size_t cap)
{
	size_t off = 0, len;

	for (unsigned i = 0; i < n; i++) {
		struct tfab_wire_msg m = ms[i];

		m.seq = 9;
		m.more = (uint16_t)(n - 1 - i);
		m.credits = i == 0 ? 3 : 0;
		FUZZ_CHECK(tfab__wire_msg_encode(&m, slot + off, cap - off, &len) == 0);
		off += len;
	}
	return off;
}

static void wire_msgs(void)
{
	static const uint32_t taken[] = {2, 3, 4};
	struct tfab_wire_ahead ahead[3] = {{5, 0x2000, 11}, {6, 0x3000, 11}, {7, 0x4000, 11}};
	struct tfab_wire_msg req = {
	    .type = TFAB_MSG_TENSOR_REQUEST,
	    .flags = TFAB_MSGF_META_VALID,
	    .req_index = 1,
	    .step_id = 42,
	    .dest_raddr = 0x1000,
	    .dest_rkey = 11,
	    .dest_capacity = 24,
	    .key_len = 6,
	    .key = (const uint8_t *)"grad/w",
	    .meta = {.dtype_code = 2,
		     .dtype_bits = 32,
		     .dtype_lanes = 1,
		     .ndim = 2,
		     .nbytes = 24,
		     .shape = {2, 3}},
	};
	struct tfab_wire_msg ms[11];
	uint8_t slot[TFAB_WIRE_MIN_SLOT];
	char name[32];
	unsigned n = 0;

	ms[n++] = req;
	ms[n] = req; /* by key index, with requests ahead */
	ms[n].flags |= TFAB_MSGF_KEY_INDEX | TFAB_MSGF_AHEAD;
	ms[n].key_len = 0;
	ms[n].key = NULL;
	ms[n].key_index = 1;
	ms[n].nahead = 3;
	ms[n++].ahead = ahead;
	ms[n] =
	    (struct tfab_wire_msg){.type = TFAB_MSG_META_DATA, .req_index = 1, .meta = req.meta};
	ms[n].meta.shape[1] = 4;
	ms[n++].meta.nbytes = 32;
	ms[n++] = (struct tfab_wire_msg){
	    .type = TFAB_MSG_META_DATA,
	    .flags = TFAB_MSGF_COMPLETE,
	    .req_index = 2,
	    .meta = {
		.dtype_code = 2, .dtype_bits = 32, .dtype_lanes = 1, .is_dead = 1, .nbytes = 4}};
	ms[n++] = (struct tfab_wire_msg){.type = TFAB_MSG_ERROR,
					 .req_index = 3,
					 .status = -5,
					 .errmsg_len = 10,
					 .errmsg = "the sender"};
	ms[n++] = (struct tfab_wire_msg){.type = TFAB_MSG_CANCEL, .req_index = 4};
	ms[n++] = (struct tfab_wire_msg){
	    .type = TFAB_MSG_TAKEN, .req_index = 1, .ntaken = 4, .taken = taken};
	ms[n++] = (struct tfab_wire_msg){
	    .type = TFAB_MSG_RETIRE, .req_index = 1, .ntaken = 2, .taken = taken};
	ms[n++] = (struct tfab_wire_msg){.type = TFAB_MSG_COLL_DATA,
					 .req_index = 1,
					 .step_id = INT64_MIN + 3,
					 .key_index = 2,
					 .coll_tag = 'r',
					 .data_len = 8,
					 .data = (const uint8_t *)"\1\2\3\4\5\6\7\10"};
	ms[n++] = (struct tfab_wire_msg){.type = TFAB_MSG_COLL_DATA,
					 .flags = TFAB_MSGF_DEAD,
					 .step_id = INT64_MIN,
					 .coll_tag = 'd'};
	/* last, as its writer sends it */
	ms[n++] = (struct tfab_wire_msg){.type = TFAB_MSG_LEAVE};
	for (unsigned i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "type%u-%u", ms[i].type, i);
		put("wire_msg", name, slot, slot_of(&ms[i], 1, slot, sizeof(slot)));
	}
	put("wire_msg", "slot-batch", slot, slot_of(ms, n, slot, sizeof(slot)));
}

static void wire_blobs(void)
{
	uint8_t shm_addr[sizeof(struct tfab_shm_addr)], buf[TFAB_WIRE_MAX_BLOB];
	struct tfab_shm_addr sa = {.magic = (uint32_t)TFAB_SHM_MAGIC,
				   .version = TFAB_SHM_VERSION,
				   .len = sizeof(sa),
				   .pid = 1234,
				   .ctrl_fd = 5,
				   .ctrl_ino = 99,
				   .ep_id = 7};
	struct tfab_wire_blob b = {
	    .ring_slots = 64, .slot_size = 1024, .peer_id = 3, .host_len = 5, .host = "node1"};
	static const uint8_t ofi_addr[16] = {2, 0, 0x30, 0x39, 127, 0, 0, 1};
	size_t len;

	memcpy(shm_addr, &sa, sizeof(sa));
	b.paths[b.npaths++] = (struct tfab_wire_path){.ring_raddr = 0x1000,
						      .ring_rkey = 1,
						      .name_len = 3,
						      .same_host = true,
						      .addr_len = sizeof(shm_addr),
						      .name = "shm",
						      .addr = shm_addr};
#ifdef TFAB_HAVE_VERBS
	{
		static uint8_t va[64];
		struct tfab_verbs_addr a = {.link_layer = 2, .port = 1, .mtu = 3, .ep_id = 8};

		tfab_verbs_addr_encode(&a, va);
		b.paths[b.npaths++] =
		    (struct tfab_wire_path){.ring_raddr = 0x2000,
					    .ring_rkey = 2,
					    .name_len = 5,
					    .name = "verbs",
					    .addr_len = (uint16_t)TFAB_VERBS_ADDR_LEN,
					    .addr = va};
	}
#endif
	b.paths[b.npaths++] = (struct tfab_wire_path){.ring_raddr = 0x3000,
						      .ring_rkey = 3,
						      .name_len = 7,
						      .addr_len = sizeof(ofi_addr),
						      .name = "ofi:tcp",
						      .addr = ofi_addr};
	FUZZ_CHECK(tfab__wire_blob_encode(&b, buf, sizeof(buf), &len) == 0);
	put("wire_blob", "three-paths", buf, len);
	b.npaths = 1;
	FUZZ_CHECK(tfab__wire_blob_encode(&b, buf, sizeof(buf), &len) == 0);
	put("wire_blob", "shm-only", buf, len);
}

static void tensorprotos(void)
{
	static const struct tfab_string strs[3] = {{"a", 1}, {NULL, 0}, {"tensor", 6}};
	static const int64_t shape[2] = {3, 1}, fshape[1] = {2};
	static float f[2] = {1.5f, -2};
	struct tfab_string_tensor st = {.ndim = 2, .shape = shape, .strings = strs};
	DLTensor t = {.data = f,
		      .device = {kDLCPU, 0},
		      .ndim = 1,
		      .dtype = {kDLFloat, 32, 1},
		      .shape = (int64_t *)fshape};
	uint8_t buf[256];
	size_t len;

	FUZZ_CHECK(tfab_tensorproto_encode_strings(&st, buf, sizeof(buf), &len) == 0);
	put("tensorproto", "strings-3x1", buf, len);
	FUZZ_CHECK(tfab_tensorproto_encode(&t, buf, sizeof(buf), &len) == 0);
	put("tensorproto", "float-2", buf, len);
}

/* A writer's ring for the shm_ring target (fuzz_shm_ring.h): entries made by ring.h's producer. */
static struct tfab_shm_ring seed_ring;
static uint64_t seed_head;

static struct tfab_shm_entry *seed_entry(uint8_t kind, uint64_t key, uint64_t off, uint64_t len)
{
	struct tfab_shm_entry *e = tfab_shm_ring_at(&seed_ring, seed_head);

	memset((void *)e, 0, sizeof(*e));
	e->kind = kind;
	e->imm = (uint32_t)(seed_head * 7 + 1);
	e->raddr = off;
	e->rkey = key;
	e->len = len;
	return e;
}

static void seed_inline(uint64_t key, uint64_t off, size_t len)
{
	uint8_t src[TFAB_SHM_INLINE_MAX];

	for (size_t k = 0; k < len; k++)
		src[k] = (uint8_t)(k * 5 + 3);
	seed_entry(TFAB_SHM_E_INLINE, key, off, len);
	tfab_shm_ring_put_inline(&seed_ring, seed_head, src, len);
	tfab_shm_ring_publish(&seed_ring, seed_head);
	seed_head += tfab_shm_inline_entries(len);
}

static void seed_bounce(uint64_t key, uint64_t off, uint64_t len, unsigned b, bool last,
			uint64_t total)
{
	struct tfab_shm_entry *e = seed_entry(TFAB_SHM_E_BOUNCE, key, off, len);

	e->bounce = b;
	e->flags = last ? TFAB_SHM_F_LAST : 0;
	e->total = total;
	tfab_shm_ring_publish(&seed_ring, seed_head++);
}

static void seed_other(uint8_t kind, uint64_t key, uint64_t off, uint64_t len)
{
	seed_entry(kind, key, off, len);
	tfab_shm_ring_publish(&seed_ring, seed_head++);
}

/* The ring from tail to the head (its first entry at the tail), under name. */
static void seed_put(const char *name, uint64_t tail, bool failed)
{
	static uint8_t buf[FUZZ_SHM_HDR + TFAB_SHM_RING_N * TFAB_SHM_ENTRY_SIZE];
	size_t len = FUZZ_SHM_HDR;

	for (int i = 0; i < 8; i++)
		buf[i] = (uint8_t)(tail >> (8 * i));
	buf[8] = failed;
	for (uint64_t i = tail; i < seed_head; i++, len += TFAB_SHM_ENTRY_SIZE)
		memcpy(buf + len, (const void *)tfab_shm_ring_at(&seed_ring, i),
		       TFAB_SHM_ENTRY_SIZE);
	put("shm_ring", name, buf, len);
}

static void seed_start(uint64_t tail)
{
	memset(&seed_ring, 0, sizeof(seed_ring));
	seed_head = tail;
}

static void shm_rings(void)
{
	const uint64_t w = FUZZ_SHM_KEY_W, ro = FUZZ_SHM_KEY_RO;

	seed_start(0);
	seed_inline(w, 64, 8);
	seed_put("inline-8", 0, false);
	/* the longest inline write, its continuation entries past the ring's end */
	seed_start(253);
	seed_inline(w, 1000, TFAB_SHM_INLINE_MAX);
	seed_put("inline-1024-wrap", 253, false);
	/* taken, refused (no remote write; past the region), direct, of no kind */
	seed_start(7);
	seed_inline(w, 0, 16);
	seed_inline(ro, 0, 300);
	seed_inline(w, FUZZ_SHM_REGION - 4, 8);
	seed_other(TFAB_SHM_E_DIRECT, w, 4096, FUZZ_SHM_REGION - 4096);
	seed_other(9, w, 0, 8);
	seed_put("batch", 7, false);
	/* a bounced write in three chunks; one whose first chunk is refused */
	seed_start(100);
	seed_bounce(w, 0, 16384, 0, false, 49152);
	seed_bounce(w, 16384, 16384, 1, false, 49152);
	seed_bounce(w, 32768, 16384, 2, true, 49152);
	seed_bounce(ro, 0, 4096, 3, false, 8192);
	seed_bounce(w, 4096, 4096, 0, true, 8192);
	seed_put("bounce", 100, false);
	/* the slot's state: a chunk of this write was refused before */
	seed_start(40);
	seed_bounce(w, 8192, 512, 1, true, 1024);
	seed_put("bounce-failed-before", 40, true);
}

#ifdef TFAB_HAVE_VERBS
/* Connection datagrams as a UD receive holds them: a routing header, then the datagram. */
static void verbs_cms(void)
{
	static const char *const names[] = {NULL, "req", "rep", "rej", "disc"};
	struct tfab_verbs_cm m = {.src_ep = 0x1122334455667788ull,
				  .dst_ep = 0x8877665544332211ull,
				  .conn_id = 3,
				  .gen = 2,
				  .qpn = 0x123,
				  .psn = 0xabcdef,
				  .wr_max = 1u << 30,
				  .mtu = IBV_MTU_1024,
				  .lid = 0,
				  .ud_qpn = 0x456};
	uint8_t buf[TFAB_VERBS_GRH + TFAB_VERBS_CM_LEN];

	m.gid.raw[10] = m.gid.raw[11] = 0xff; /* ::ffff:127.0.0.1, RoCE v2 */
	m.gid.raw[12] = 127;
	m.gid.raw[15] = 1;
	memset(buf, 0, TFAB_VERBS_GRH);
	for (uint8_t t = TFAB_VERBS_CM_REQ; t <= TFAB_VERBS_CM_DISC; t++) {
		m.type = t;
		tfab_verbs_cm_encode(&m, buf + TFAB_VERBS_GRH);
		put("verbs_cm", names[t], buf, sizeof(buf));
	}
	/* refused: a type that is none of them */
	m.type = TFAB_VERBS_CM_DISC + 1;
	tfab_verbs_cm_encode(&m, buf + TFAB_VERBS_GRH);
	put("verbs_cm", "type-5", buf, sizeof(buf));
}
#endif

static void settings(void)
{
	static const char *const s[][2] = {
	    {"TFAB_PROVIDER", "shm,ofi:tcp"}, {"TFAB_LOG_LEVEL", "debug"},
	    {"TFAB_POOL_CACHE", "1G"},	      {"TFAB_RING_SLOTS", "64"},
	    {"TFAB_NO_REQUEST", "32"},	      {"TFAB_VERBS_INLINE", "auto"},
	};
	char buf[128], name[32];

	for (size_t i = 0; i < sizeof(s) / sizeof(s[0]); i++) {
		size_t a = strlen(s[i][0]), b = strlen(s[i][1]);

		memcpy(buf, s[i][0], a + 1);
		memcpy(buf + a + 1, s[i][1], b);
		snprintf(name, sizeof(name), "setting-%zu", i);
		put("config", name, buf, a + 1 + b);
	}
}

/* Records of the authentication's target: a kind, a length, the bytes. */
struct records {
	uint8_t buf[1024];
	size_t len;
};

static void record(struct records *r, uint8_t kind, const void *msg, size_t len)
{
	FUZZ_CHECK(len < 256 && r->len + 2 + len <= sizeof(r->buf));
	r->buf[r->len++] = kind;
	r->buf[r->len++] = (uint8_t)len;
	memcpy(r->buf + r->len, msg, len);
	r->len += len;
}

/* The next message side `out` queued, into msg; its length. */
static uint32_t next_out(struct tfab_frame_tx *out, uint8_t *msg)
{
	struct tfab_frame_rx rx;
	size_t used;

	tfab__frame_rx_init(&rx, msg, 64);
	FUZZ_CHECK(tfab__frame_rx_feed(&rx, out->buf + out->off, out->len - out->off, &used) == 1);
	out->off += used;
	return rx.len;
}

/* Both sides of a handshake, by the library, with the target's key and nonces. */
static void auth(void)
{
	static const uint8_t zeros[200];
	const uint8_t *key = (const uint8_t *)FUZZ_AUTH_KEY;
	struct records acc = {.buf = {1}, .len = 1}, con = {.buf = {0}, .len = 1}, bad;
	struct tfab_frame_tx co = {0}, ao = {0};
	struct tfab_auth c, a;
	uint8_t msg[64];
	uint32_t len;
	char why[256];

	FUZZ_CHECK(tfab__auth_start(&c, key, strlen(FUZZ_AUTH_KEY), false, FUZZ_NONCE_C, &co) == 0);
	FUZZ_CHECK(tfab__auth_start(&a, key, strlen(FUZZ_AUTH_KEY), true, FUZZ_NONCE_A, &ao) == 0);
	len = next_out(&co, msg); /* the connector's hello */
	record(&acc, 0, msg, len);
	FUZZ_CHECK(tfab__auth_take(&a, msg, len, &ao, why, sizeof(why)) == 0);
	len = next_out(&ao, msg); /* the acceptor's */
	record(&con, 0, msg, len);
	FUZZ_CHECK(tfab__auth_take(&c, msg, len, &co, why, sizeof(why)) == 0);
	len = next_out(&co, msg); /* the connector's proof */
	bad = acc;
	record(&acc, 0, msg, len);
	msg[len - 1] ^= 1;
	record(&bad, 0, msg, len);
	put("auth", "acceptor-proof-last-byte", bad.buf, bad.len);
	msg[len - 1] ^= 1;
	FUZZ_CHECK(tfab__auth_take(&a, msg, len, &ao, why, sizeof(why)) == 1);
	len = next_out(&ao, msg); /* the acceptor's proof */
	record(&con, 0, msg, len);
	FUZZ_CHECK(tfab__auth_take(&c, msg, len, &co, why, sizeof(why)) == 1);
	FUZZ_CHECK(tfab__auth_tag_put(&c, FUZZ_BLOB, sizeof(FUZZ_BLOB), &co) == 0);
	len = next_out(&co, msg);
	record(&acc, 2, msg, len);
	FUZZ_CHECK(tfab__auth_tag_put(&a, FUZZ_BLOB, sizeof(FUZZ_BLOB), &ao) == 0);
	len = next_out(&ao, msg);
	record(&con, 2, msg, len);
	put("auth", "acceptor-whole", acc.buf, acc.len);
	put("auth", "connector-whole", con.buf, con.len);
	/* strangers: junk, a message too long, a keyed peer's hello to a side without a key */
	bad = (struct records){.buf = {1}, .len = 1};
	record(&bad, 0, "GET / HTTP/1.0\r\n", 16);
	record(&bad, 1, zeros, sizeof(zeros)); /* read as one of 200 × 64 bytes */
	put("auth", "acceptor-junk", bad.buf, bad.len);
	bad = (struct records){.buf = {1}, .len = 1};
	record(&bad, 3, acc.buf + 3, 38);
	put("auth", "unkeyed-hello", bad.buf, bad.len);
	tfab__frame_tx_free(&co);
	tfab__frame_tx_free(&ao);
	/* the settings' target: a key too short, and one long enough (never shown) */
	put("config", "auth-key-short", "TFAB_AUTH_KEY\0short", 19);
	put("config", "auth-key-16",
	    "TFAB_AUTH_KEY\0"
	    "0123456789abcdef",
	    30);
}

static void sock_frames(void)
{
	static const uint8_t two[] = {64, 7, 0, 0, 0, 5, 'h', 'e', 'l', 'l', 'o',
				      0,  0, 0, 0, 0, 0, 0,   9,   'p', 'a', 'r'};
	static const uint8_t big[] = {1, 3, 'G', 'E', 'T', ' ', '/', ' ', 'H', 'T', 'T', 'P'};

	put("sock_frame", "two-and-a-part", two, sizeof(two));
	put("sock_frame", "too-long", big, sizeof(big));
}

static struct rank_rec seed_rec(uint32_t rank, uint32_t size)
{
	struct rank_rec r = {.rank = rank, .size = size, .port = (uint16_t)(40000 + rank)};

	r.small = 65536;
	r.eager = 960;
	r.shm = 4096;
	snprintf(r.host, sizeof(r.host), "10.0.0.%u", rank + 1);
	snprintf(r.name, sizeof(r.name), "/job:worker/task:%u", rank);
	return r;
}

static void world_recs(void)
{
	static uint8_t buf[2 + 1 + 3 * TFAB_WORLD_REC_LEN];
	static const char why[] = "rank(s) 2 of 3 did not arrive within 3000 ms";
	struct rank_rec r = seed_rec(2, 4);

	buf[0] = 0x02; /* a record; rank 0 has rank 1 */
	buf[1] = 3;    /* a world of 4 */
	tfab__world_rec_pack(&r, buf + 2);
	put("world_rec", "record-rank-2-of-4", buf, 2 + TFAB_WORLD_REC_LEN);
	r = seed_rec(4, 4); /* a rank equal to the size: refused */
	tfab__world_rec_pack(&r, buf + 2);
	put("world_rec", "record-rank-4-of-4", buf, 2 + TFAB_WORLD_REC_LEN);
	buf[0] = 1; /* rank 0's answer */
	buf[1] = 2; /* a world of 3 */
	buf[2] = 'T';
	for (uint32_t i = 0; i < 3; i++) {
		r = seed_rec(i, 3);
		tfab__world_rec_pack(&r, buf + 3 + i * TFAB_WORLD_REC_LEN);
	}
	put("world_rec", "table-of-3", buf, sizeof(buf));
	buf[2] = 'E';
	buf[3] = buf[4] = buf[5] = 0;
	buf[6] = TFAB_ERR_TIMEOUT - 256;
	buf[5] = 1;
	memcpy(buf + 7, why, sizeof(why) - 1);
	put("world_rec", "error-timeout", buf, 7 + sizeof(why) - 1);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: fuzz-seeds CORPUS_DIR\n");
		return 2;
	}
	root = argv[1];
	wire_msgs();
	wire_blobs();
	tensorprotos();
	settings();
	shm_rings();
#ifdef TFAB_HAVE_VERBS
	verbs_cms();
#endif
	auth();
	sock_frames();
	world_recs();
	return 0;
}
