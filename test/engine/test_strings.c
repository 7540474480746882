/*
 * String tensors between processes: shapes from scalars to empty ones, empty strings and
 * non-UTF-8 bytes, a 64 MiB string, size changes between steps (the re-request path), dead
 * tensors, receives before and after sends, a key received as the wrong kind (a clear
 * error that leaves the send for the right receive), and a tensor past the receiver's
 * TFAB_STRING_MAX_BYTES (the same). Rank 1 sends, rank 0 receives.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "mp.h"

/* A bound on waits for one event: the stall bound (mp.h). */
#define WAIT_MS mp_stall_ms()
#define MAX_ELEMS 64

/* A string tensor whose bytes follow from (seed, element): lengths vary, bytes include 0x00
 * and 0xff. */
struct strings {
	struct tfab_string_tensor t;
	int64_t shape[4];
	struct tfab_string s[MAX_ELEMS];
	char *bytes[MAX_ELEMS];
};

static size_t len_of(uint64_t seed, int64_t i, size_t max_len)
{
	return max_len ? (size_t)((seed * 2654435761u + (uint64_t)i * 40503u) % (max_len + 1)) : 0;
}

static char byte_of(uint64_t seed, int64_t i, size_t k)
{
	return (char)(uint8_t)(seed * 31 + (uint64_t)i * 17 + k * 251);
}

static void strings_make(struct strings *s, int ndim, const int64_t *shape, uint64_t seed,
			 size_t max_len)
{
	int64_t n;

	memset(s, 0, sizeof(*s));
	s->t.ndim = ndim;
	memcpy(s->shape, shape, sizeof(int64_t) * (size_t)ndim);
	s->t.shape = s->shape;
	s->t.strings = s->s;
	n = tfab_string_tensor_count(&s->t);
	for (int64_t i = 0; i < n && i < MAX_ELEMS; i++) {
		size_t len = len_of(seed, i, max_len);

		s->bytes[i] = malloc(len ? len : 1);
		for (size_t k = 0; k < len; k++)
			s->bytes[i][k] = byte_of(seed, i, k);
		s->s[i].data = s->bytes[i];
		s->s[i].len = len;
	}
}

/* Overwrite and free the bytes: a sent tensor's memory is the caller's again at once. */
static void strings_free(struct strings *s)
{
	for (int i = 0; i < MAX_ELEMS; i++) {
		if (s->bytes[i])
			memset(s->bytes[i], 0x5a, s->s[i].len);
		free(s->bytes[i]);
	}
}

static bool strings_match(const struct tfab_string_tensor *got, int ndim, const int64_t *shape,
			  uint64_t seed, size_t max_len)
{
	int64_t n;

	if (!got || got->ndim != ndim || memcmp(got->shape, shape, sizeof(int64_t) * ndim) != 0)
		return false;
	n = tfab_string_tensor_count(got);
	for (int64_t i = 0; i < n; i++) {
		size_t len = len_of(seed, i, max_len);

		if (got->strings[i].len != len)
			return false;
		for (size_t k = 0; k < len; k++)
			if (got->strings[i].data[k] != byte_of(seed, i, k))
				return false;
	}
	return true;
}

/* Bytes of v as a protobuf varint. */
static size_t varint_len(uint64_t v)
{
	size_t n = 1;

	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

/*
 * The size of the TensorProto that t serializes to, worked out here from the message's fields
 * (tensorflow/core/framework/tensor.proto), not asked of the library: dtype (field 1,
 * DT_STRING), tensor_shape (field 2) with a dim (field 2) per dimension holding its size
 * (field 1), and a string_val (field 8) per element. A dead or empty tensor is not serialized.
 */
static size_t proto_size(const struct tfab_string_tensor *t, bool dead)
{
	int64_t count = tfab_string_tensor_count(t);
	size_t shape = 0, n = 2; /* dtype: a tag and 7 */

	if (dead || count <= 0)
		return 0;
	for (int i = 0; i < t->ndim; i++) {
		size_t dim = 1 + varint_len((uint64_t)t->shape[i]); /* sizes are nonzero here */

		shape += 1 + varint_len(dim) + dim;
	}
	n += 1 + varint_len(shape) + shape;
	for (int64_t i = 0; i < count; i++)
		n += 1 + varint_len(t->strings[i].len) + t->strings[i].len;
	return n;
}

/*
 * Strings are the path that copies: the sender counts what it serialized, the receiver what
 * it parsed, each exactly the TensorProto's size.
 */
static int check_copied(struct mp *mp, const struct tfab_stats *st0, size_t want)
{
	struct tfab_stats st;

	CHECK_RC(tfab_get_stats(mp->ctx, &st), 0);
	if (st.bytes_copied - st0->bytes_copied != want)
		fprintf(stderr, "rank %d: %llu bytes copied, the TensorProtos have %zu\n", mp->rank,
			(unsigned long long)(st.bytes_copied - st0->bytes_copied), want);
	CHECK(st.bytes_copied - st0->bytes_copied == want);
	return 0;
}

struct sent {
	volatile int n, all, errors;
	int want;
};

static void on_sent(void *arg, int status)
{
	struct sent *d = arg;

	if (status)
		d->errors++;
	if (++d->n == d->want)
		d->all = 1;
}

struct got {
	volatile int done;
	int status;
	struct tfab_string_tensor *t;
	bool is_dead;
};

static void on_strings(void *arg, int status, struct tfab_string_tensor *t, bool is_dead)
{
	struct got *g = arg;

	g->status = status;
	g->t = t;
	g->is_dead = is_dead;
	g->done = 1;
}

/* The steps of one key: shapes, lengths and deadness change from step to step. */
struct step_case {
	int ndim;
	int64_t shape[4];
	size_t max_len;
	bool dead;
};

static const struct step_case cases[] = {
    {0, {0}, 5, false},		  /* a scalar */
    {1, {3}, 0, false},		  /* three empty strings */
    {1, {3}, 40, false},	  /* same shape, other lengths: a re-request */
    {2, {2, 3}, 1000, false},	  /* a new shape */
    {2, {2, 3}, 1000, false},	  /* the same serialized size as before: direct */
    {1, {0}, 10, false},	  /* empty tensor: meta-data alone */
    {3, {4, 0, 2}, 10, false},	  /* empty in the middle */
    {1, {2}, 10, true},		  /* dead */
    {1, {MAX_ELEMS}, 300, false}, /* many elements */
    {1, {1}, 65536, false},	  /* a 64 KiB string */
};
#define NCASES ((int)(sizeof(cases) / sizeof(cases[0])))

/* Rank 1 sends every case under "words" (steps 1..), rank 0 receives; recv_first posts the
 * receives before the sends. */
static int steps(struct mp *mp, bool recv_first, int64_t base)
{
	struct tfab_stats st0;
	size_t copied = 0;

	CHECK_RC(tfab_get_stats(mp->ctx, &st0), 0);
	if (mp->rank == 1) {
		struct sent d = {.want = NCASES};

		if (recv_first)
			CHECK(mp_barrier(mp, base) == 0);
		for (int i = 0; i < NCASES; i++) {
			struct strings s;

			strings_make(&s, cases[i].ndim, cases[i].shape, (uint64_t)(base + i),
				     cases[i].max_len);
			CHECK_RC(tfab_send_strings(mp->ctx, "words", base + i, &s.t, cases[i].dead,
						   on_sent, &d),
				 0);
			copied += proto_size(&s.t, cases[i].dead);
			strings_free(&s);
		}
		if (!recv_first)
			CHECK(mp_barrier(mp, base) == 0);
		CHECK(mp_wait_flag(mp, &d.all, WAIT_MS));
		CHECK(d.errors == 0);
		return check_copied(mp, &st0, copied);
	}
	struct got g[NCASES];

	memset(g, 0, sizeof(g));
	if (!recv_first)
		CHECK(mp_barrier(mp, base) == 0);
	for (int i = 0; i < NCASES; i++)
		CHECK_RC(
		    tfab_recv_strings(mp->ctx, mp->peers[1], "words", base + i, on_strings, &g[i]),
		    0);
	if (recv_first)
		CHECK(mp_barrier(mp, base) == 0);
	for (int i = 0; i < NCASES; i++) {
		CHECK(mp_wait_flag(mp, &g[i].done, WAIT_MS));
		CHECK_RC(g[i].status, 0);
		CHECK(g[i].is_dead == cases[i].dead);
		if (cases[i].dead) {
			CHECK(g[i].t == NULL);
			continue;
		}
		CHECK(strings_match(g[i].t, cases[i].ndim, cases[i].shape, (uint64_t)(base + i),
				    cases[i].max_len));
		copied += proto_size(g[i].t, false);
		tfab_string_tensor_free(g[i].t);
	}
	return check_copied(mp, &st0, copied);
}

static int sc_strings_send_first(struct mp *mp)
{
	return steps(mp, false, 1);
}

static int sc_strings_recv_first(struct mp *mp)
{
	return steps(mp, true, 100);
}

/*
 * One key, one shape, steps whose serialized size changes or not: a change re-requests (the
 * meta-data reply), an equal size is written at once into the cached-size destination.
 */
static int sc_strings_resize(struct mp *mp)
{
	static const size_t lens[5] = {10, 10, 500, 500, 3};
	static const int64_t shape[1] = {1};
	struct tfab_stats st0, st;
	size_t copied = 0;

	CHECK_RC(tfab_get_stats(mp->ctx, &st0), 0);
	for (int i = 0; i < 5; i++) {
		char *b = malloc(lens[i]);
		struct tfab_string one = {b, lens[i]};
		struct tfab_string_tensor t = {1, shape, &one};

		memset(b, 'a' + i, lens[i]);
		copied += proto_size(&t, false);
		if (mp->rank == 1) {
			struct sent d = {.want = 1};

			CHECK_RC(tfab_send_strings(mp->ctx, "sized", i, &t, false, on_sent, &d), 0);
			CHECK(mp_wait_flag(mp, &d.all, WAIT_MS));
			CHECK(d.errors == 0);
		} else {
			struct tfab_string_tensor *got = NULL;

			CHECK_RC(tfab_recv_strings_sync(mp->ctx, mp->peers[1], "sized", i, WAIT_MS,
							&got, NULL),
				 0);
			CHECK(got && got->ndim == 1 && got->shape[0] == 1);
			CHECK(got->strings[0].len == lens[i]);
			CHECK(memcmp(got->strings[0].data, b, lens[i]) == 0);
			tfab_string_tensor_free(got);
		}
		free(b);
	}
	if (mp->rank == 0) {
		CHECK_RC(tfab_get_stats(mp->ctx, &st), 0);
		/*
		 * Step 0 learns the size, 2 outgrows the room its receive asked for; 4 shrinks,
		 * and fits (its length says how much landed).
		 */
		CHECK(st.rerequests - st0.rerequests == 2);
		CHECK(st.meta_misses - st0.meta_misses == 1);
	}
	return check_copied(mp, &st0, copied);
}

/*
 * A string tensor whose serialized size changes every step, by up to 20% either way (a
 * deterministic walk around 4,000 bytes), for STEPS steps, every tensor checked. With the
 * receive asking for 25% more room than the size it saw last (TFAB_STRINGS_HEADROOM, the
 * default) only the first step costs a re-request; with 0, every step that grew does.
 */
static int sc_strings_vary(struct mp *mp)
{
	enum { STEPS = 40 };
	static const int64_t shape[1] = {1};
	const char *env = getenv("TFAB_STRINGS_HEADROOM");
	unsigned headroom = env ? (unsigned)atoi(env) : 25;
	struct tfab_stats st0, st;
	size_t copied = 0, len = 4000, prev = 0;
	int grew = 0;

	CHECK_RC(tfab_get_stats(mp->ctx, &st0), 0);
	for (int i = 0; i < STEPS; i++) {
		/* -20% .. +20%, from the step */
		int pct = (int)((unsigned)(i * 7919 + 13) % 41) - 20;
		char *b;

		len = len * (size_t)(100 + pct) / 100;
		if (len < 1000 || len > 16000)
			len = 4000;
		grew += i > 0 && len > prev;
		prev = len;
		b = malloc(len);
		memset(b, 'a' + i % 26, len);
		struct tfab_string one = {b, len};
		struct tfab_string_tensor t = {1, shape, &one};

		copied += proto_size(&t, false);
		if (mp->rank == 1) {
			struct sent d = {.want = 1};

			CHECK_RC(tfab_send_strings(mp->ctx, "vary", i, &t, false, on_sent, &d), 0);
			CHECK(mp_wait_flag(mp, &d.all, WAIT_MS));
			CHECK(d.errors == 0);
		} else {
			struct tfab_string_tensor *got = NULL;

			CHECK_RC(tfab_recv_strings_sync(mp->ctx, mp->peers[1], "vary", i, WAIT_MS,
							&got, NULL),
				 0);
			CHECK(got && got->ndim == 1 && got->shape[0] == 1);
			CHECK(got->strings[0].len == len);
			CHECK(memcmp(got->strings[0].data, b, len) == 0);
			tfab_string_tensor_free(got);
		}
		free(b);
	}
	if (mp->rank == 0) {
		uint64_t rr;

		CHECK_RC(tfab_get_stats(mp->ctx, &st), 0);
		rr = st.rerequests - st0.rerequests;
		printf("strings_vary: %d steps, %d of them grew: %llu re-requests (%.3f a step; "
		       "TFAB_STRINGS_HEADROOM %u)\n",
		       STEPS, grew, (unsigned long long)rr, (double)rr / STEPS, headroom);
		if (headroom >= 25)
			CHECK(rr == 1);
		else if (headroom == 0)
			CHECK(rr == 1 + (uint64_t)grew);
	}
	return check_copied(mp, &st0, copied);
}

/* A single 64 MiB string of every byte value. */
static int sc_strings_big(struct mp *mp)
{
	const size_t len = 64u << 20;
	static const int64_t shape[1] = {1};
	char *b = malloc(len);
	struct tfab_string one = {b, len};
	struct tfab_string_tensor t = {1, shape, &one};
	struct tfab_stats st0;

	CHECK(b != NULL);
	CHECK_RC(tfab_get_stats(mp->ctx, &st0), 0);
	for (size_t k = 0; k < len; k++)
		b[k] = (char)(uint8_t)(k * 7 + (k >> 20));
	if (mp->rank == 1) {
		struct sent d = {.want = 1};

		CHECK_RC(tfab_send_strings(mp->ctx, "big", 1, &t, false, on_sent, &d), 0);
		CHECK(mp_wait_flag(mp, &d.all, WAIT_MS));
		CHECK(d.errors == 0);
	} else {
		struct tfab_string_tensor *got = NULL;

		CHECK_RC(
		    tfab_recv_strings_sync(mp->ctx, mp->peers[1], "big", 1, WAIT_MS, &got, NULL),
		    0);
		CHECK(got && got->ndim == 1 && got->shape[0] == 1 && got->strings[0].len == len);
		CHECK(memcmp(got->strings[0].data, b, len) == 0);
		tfab_string_tensor_free(got);
	}
	free(b);
	return check_copied(mp, &st0, proto_size(&t, false));
}

/*
 * The wrong kind of receive fails with -EPROTOTYPE and consumes nothing: the right receive
 * of the same key and step still gets the tensor.
 */
static int sc_strings_kind(struct mp *mp)
{
	static const int64_t shape[1] = {4};
	float f[4] = {1, 2, 3, 4};
	DLTensor num = {.data = f,
			.device = {kDLCPU, 0},
			.ndim = 1,
			.dtype = {kDLFloat, 32, 1},
			.shape = (int64_t *)shape};
	struct tfab_string words[4] = {{"w", 1}, {"x", 1}, {"", 0}, {"zz", 2}};
	struct tfab_string_tensor st = {1, shape, words};
	struct tfab_stats st0;

	CHECK_RC(tfab_get_stats(mp->ctx, &st0), 0);
	if (mp->rank == 1) {
		struct sent d = {.want = 2};

		CHECK_RC(tfab_send(mp->ctx, "numbers", 1, &num, false, on_sent, &d), 0);
		CHECK_RC(tfab_send_strings(mp->ctx, "text", 1, &st, false, on_sent, &d), 0);
		CHECK(mp_wait_flag(mp, &d.all, WAIT_MS));
		CHECK(d.errors == 0);
		return check_copied(mp, &st0, proto_size(&st, false));
	}
	struct tfab_string_tensor *got = NULL;
	DLManagedTensor *m = NULL;

	CHECK_RC(tfab_recv_strings_sync(mp->ctx, mp->peers[1], "numbers", 1, WAIT_MS, &got, NULL),
		 -EPROTOTYPE);
	CHECK_RC(tfab_recv_sync(mp->ctx, mp->peers[1], "text", 1, NULL, WAIT_MS, &m, NULL),
		 -EPROTOTYPE);
	/* The sends are still there for the right receives. */
	CHECK_RC(tfab_recv_sync(mp->ctx, mp->peers[1], "numbers", 1, NULL, WAIT_MS, &m, NULL), 0);
	CHECK(m && m->dl_tensor.ndim == 1 && memcmp(m->dl_tensor.data, f, sizeof(f)) == 0);
	m->deleter(m);
	CHECK_RC(tfab_recv_strings_sync(mp->ctx, mp->peers[1], "text", 1, WAIT_MS, &got, NULL), 0);
	CHECK(got && got->ndim == 1 && got->shape[0] == 4);
	for (int i = 0; i < 4; i++)
		CHECK(got->strings[i].len == words[i].len &&
		      (!words[i].len ||
		       memcmp(got->strings[i].data, words[i].data, words[i].len) == 0));
	tfab_string_tensor_free(got);
	/* Parsed once: the receive of the wrong kind copied nothing. */
	return check_copied(mp, &st0, proto_size(&st, false));
}

/* The request for key that the engine holds parked here, copied out (0), or -ENOENT. */
static int parked_request(struct tfab_context *ctx, const char *key, struct tfab_response *out)
{
	int rc = -ENOENT;

	tfab__ctx_lock(ctx);
	for (size_t i = 0; i < ctx->parked.nbuckets && rc; i++) {
		for (struct tfab_hnode *h = ctx->parked.buckets[i]; h && rc; h = h->next) {
			struct tfab_response *p = tfab_container_of(h, struct tfab_response, node);

			if (p->key_len == strlen(key) && memcmp(p->key, key, p->key_len) == 0) {
				*out = *p;
				rc = 0;
			}
		}
	}
	tfab__ctx_unlock(ctx);
	return rc;
}

/*
 * A sender that lies about a string tensor's length: rank 1 answers rank 0's request (with
 * room, after a first step) by writing content whose 8-byte length claims more than the
 * destination holds. Rank 0's receive fails with TFAB_ERR_PROTOCOL, nothing is read past the
 * destination, and the pair goes on: the next step arrives whole. Where the fabric reports
 * how much landed that alone catches the lie, so rank 0 first checks the bound itself
 * (tfab__strings_landed) on lengths at, past and far past the room.
 */
static int sc_strings_lying_length(struct mp *mp)
{
	static const int64_t shape[1] = {1};
	char text[100];
	struct tfab_string one = {text, sizeof(text)};
	struct tfab_string_tensor t = {1, shape, &one};

	memset(text, 'q', sizeof(text));
	if (mp->rank == 0) {
		/* The bound itself: a length must leave the 8 bytes and fit the room. */
		static const uint64_t claims[5] = {92, 93, 0, UINT64_MAX, 1};
		static const int want[5] = {0, -TFAB_ERR_PROTOCOL, -TFAB_ERR_PROTOCOL,
					    -TFAB_ERR_PROTOCOL, -TFAB_ERR_PROTOCOL};
		struct tfab_request *r = calloc(1, sizeof(*r));
		uint8_t room[100];
		uint64_t n = 0;

		CHECK(r != NULL);
		r->peer = mp->peers[1]; /* named in the refusals' messages */
		r->dest = room;
		for (int c = 0; c < 5; c++) {
			for (int i = 0; i < 8; i++)
				room[i] = (uint8_t)(claims[c] >> (8 * i));
			r->dest_cap = c == 4 ? 8 : sizeof(room);
			CHECK_RC(tfab__strings_landed(r, &n), want[c]);
		}
		r->dest_cap = sizeof(room);
		for (int i = 0; i < 8; i++)
			room[i] = (uint8_t)(claims[0] >> (8 * i));
		CHECK(tfab__strings_landed(r, &n) == 0 && n == sizeof(room));
		free(r);
	}
	for (int step = 1; step <= 3; step++) {
		if (mp->rank == 1 && step == 2) {
			struct tfab_peer *peer = mp->peers[0];
			struct tfab_response q;
			struct tfab_mr *mr = NULL;
			uint8_t *buf = aligned_alloc(4096, 4096);
			uint64_t until = 0;
			bool idle = false;

			CHECK(buf != NULL);
			for (int i = 0; i < 20000 && parked_request(mp->ctx, "lie", &q); i++) {
				tfab_progress(mp->ctx);
				usleep(100);
			}
			CHECK_RC(parked_request(mp->ctx, "lie", &q), 0);
			CHECK(q.dest_capacity > 8 && q.dest_capacity <= 4096);
			memset(buf, 0, 4096);
			for (int i = 0; i < 8; i++) /* far beyond the room */
				buf[i] = (uint8_t)((q.dest_capacity + (1u << 30)) >> (8 * i));
			tfab__ctx_lock(mp->ctx);
			int rc = tfab_mr_reg(peer->conn->ep, buf, 4096, TFAB_MR_LOCAL_WRITE, &mr);

			if (rc == 0)
				rc = tfab_conn_write_imm(peer->conn, buf, q.dest_capacity, mr,
							 q.dest_raddr, q.dest_rkey, q.req_index, 0,
							 &peer->credit_w);
			if (rc == 0)
				peer->users++; /* accounted as a credit write's completion */
			tfab__ctx_unlock(mp->ctx);
			CHECK_RC(rc, 0);
			until = (uint64_t)WAIT_MS * 10;
			while (!idle && until--) {
				tfab_progress(mp->ctx);
				tfab__ctx_lock(mp->ctx);
				idle = peer->users == 0;
				tfab__ctx_unlock(mp->ctx);
				if (!idle)
					usleep(100);
			}
			tfab__ctx_lock(mp->ctx);
			tfab_mr_dereg(mr);
			tfab__ctx_unlock(mp->ctx);
			free(buf);
			CHECK(idle);
		} else if (mp->rank == 1) {
			struct sent d = {.want = 1};

			CHECK_RC(tfab_send_strings(mp->ctx, "lie", step, &t, false, on_sent, &d),
				 0);
			CHECK(mp_wait_flag(mp, &d.all, WAIT_MS));
			CHECK(d.errors == 0);
		} else {
			struct tfab_string_tensor *got = NULL;
			int rc = tfab_recv_strings_sync(mp->ctx, mp->peers[1], "lie", step, WAIT_MS,
							&got, NULL);

			if (step == 2) {
				CHECK_RC(rc, -TFAB_ERR_PROTOCOL);
			} else {
				CHECK_RC(rc, 0);
				CHECK(got && got->strings[0].len == sizeof(text));
				CHECK(memcmp(got->strings[0].data, text, sizeof(text)) == 0);
			}
			tfab_string_tensor_free(got);
		}
		CHECK(mp_barrier(mp, 300 + step) == 0);
	}
	return 0;
}

/* Bad string tensors are refused at the call, and nothing is sent. */
static int sc_strings_bad(struct mp *mp)
{
	static const int64_t neg[1] = {-1}, two[1] = {2};
	struct tfab_string nul = {NULL, 3};
	struct tfab_string_tensor t_neg = {1, neg, NULL}, t_nul = {1, two, &nul},
				  t_none = {1, two, NULL}, t_dims = {33, two, NULL};
	struct sent d = {0};
	struct tfab_stats st0;

	CHECK_RC(tfab_get_stats(mp->ctx, &st0), 0);
	CHECK_RC(tfab_send_strings(mp->ctx, "bad", 1, &t_neg, false, on_sent, &d), -EINVAL);
	CHECK_RC(tfab_send_strings(mp->ctx, "bad", 1, &t_nul, false, on_sent, &d), -EINVAL);
	CHECK_RC(tfab_send_strings(mp->ctx, "bad", 1, &t_none, false, on_sent, &d), -EINVAL);
	CHECK_RC(tfab_send_strings(mp->ctx, "bad", 1, &t_dims, false, on_sent, &d), -EINVAL);
	CHECK_RC(tfab_send_strings(mp->ctx, "bad", 1, NULL, false, on_sent, &d), -EINVAL);
	CHECK_RC(tfab_recv_strings(mp->ctx, mp->peers[mp->rank ? 0 : 1], "bad", 1, NULL, NULL),
		 -EINVAL);
	CHECK(d.n == 0);
	return check_copied(mp, &st0, 0);
}

enum { THREAD_SENDS = 2000 };

struct strings_thread {
	struct mp *mp;
	int id;
	int failed;	  /* a send that returned an error */
	int status;	  /* the first failed callback's status */
	int sent, errors; /* atomic */
};

static void thread_sent(void *arg, int status)
{
	struct strings_thread *a = arg;

	if (status && __atomic_fetch_add(&a->errors, 1, __ATOMIC_RELAXED) == 0)
		a->status = status;
	__atomic_fetch_add(&a->sent, 1, __ATOMIC_RELEASE);
}

/* Serializes and sends THREAD_SENDS string tensors of growing sizes (new pool blocks). */
static void *strings_sender(void *p)
{
	struct strings_thread *a = p;
	static const int64_t shape[1] = {1};
	char *b = malloc(40000);
	char key[32];

	memset(b, 'a' + a->id, 40000);
	for (int i = 0; i < THREAD_SENDS && !a->failed; i++) {
		struct tfab_string one = {b, (size_t)(i * 19) % 40000};
		struct tfab_string_tensor t = {1, shape, &one};
		int rc;

		snprintf(key, sizeof(key), "thr/%d/%d", a->id, i);
		rc = tfab_send_strings(a->mp->ctx, key, 5, &t, false, thread_sent, a);
		if (rc) {
			fprintf(stderr, "thread %d: send %d: %s\n", a->id, i, tfab_strerror(rc));
			a->failed = 1;
		}
	}
	free(b);
	return NULL;
}

struct recv_count {
	int n, bad; /* atomic */
};

static void thread_got(void *arg, int status, struct tfab_string_tensor *t, bool is_dead)
{
	struct recv_count *c = arg;

	(void)is_dead;
	if (status || !t || t->ndim != 1)
		__atomic_fetch_add(&c->bad, 1, __ATOMIC_RELAXED);
	tfab_string_tensor_free(t);
	__atomic_fetch_add(&c->n, 1, __ATOMIC_RELEASE);
}

/*
 * Two threads post THREAD_SENDS string tensors each at once: serializing into new pool blocks
 * registers memory from both threads, which must not race (keys chosen twice: "Required key
 * not available"). Every send and receive succeeds.
 */
static int sc_strings_threads(struct mp *mp)
{
	static const int64_t shape[1] = {1};
	struct tfab_stats st0;
	size_t copied = 0;
	char key[32];

	/* What both sides copy: strings_sender's tensors, 'a' + id repeated. */
	for (int i = 0; i < THREAD_SENDS; i++) {
		struct tfab_string one = {NULL, (size_t)(i * 19) % 40000}; /* lengths alone count */
		struct tfab_string_tensor t = {1, shape, &one};

		copied += 2 * proto_size(&t, false);
	}
	CHECK_RC(tfab_get_stats(mp->ctx, &st0), 0);
	if (mp->rank == 0) {
		struct recv_count c = {0};

		for (int id = 0; id < 2; id++) {
			for (int i = 0; i < THREAD_SENDS; i++) {
				snprintf(key, sizeof(key), "thr/%d/%d", id, i);
				CHECK_RC(tfab_recv_strings(mp->ctx, mp->peers[1], key, 5,
							   thread_got, &c),
					 0);
			}
		}
		CHECK(mp_wait_count(mp, &c.n, 2 * THREAD_SENDS, WAIT_MS));
		CHECK(c.bad == 0);
		return check_copied(mp, &st0, copied);
	}
	struct strings_thread a[2] = {{.mp = mp, .id = 0}, {.mp = mp, .id = 1}};
	pthread_t th[2];

	for (int i = 0; i < 2; i++)
		CHECK(pthread_create(&th[i], NULL, strings_sender, &a[i]) == 0);
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	/*
	 * The receives take them all, or a check fails: then a[] stays for late callbacks. The
	 * flush goes on while sends keep completing.
	 */
	struct mp_watch w;
	int rc;

	mp_watch_start(&w, mp, NULL, "the flush", 0);
	while ((rc = tfab_flush(mp->ctx, 100)) == -ETIMEDOUT &&
	       !mp_watch_stalled(&w, __atomic_load_n(&a[0].sent, __ATOMIC_ACQUIRE) +
					 __atomic_load_n(&a[1].sent, __ATOMIC_ACQUIRE)))
		;
	CHECK_RC(rc, 0);
	for (int i = 0; i < 2; i++) {
		if (a[i].errors)
			fprintf(stderr, "thread %d: %d sends failed, the first with %s\n", i,
				a[i].errors, tfab_strerror(a[i].status));
		CHECK(!a[i].failed && a[i].errors == 0);
	}
	return check_copied(mp, &st0, copied);
}

/* The error lines rank 0 logs meanwhile. */
static char max_logged[2048];

static void max_capture(void *arg, enum tfab_log_level level, const char *subsys, const char *msg)
{
	size_t n = strlen(max_logged);

	(void)arg, (void)level, (void)subsys;
	snprintf(max_logged + n, sizeof(max_logged) - n, "%s\n", msg);
}

/*
 * TFAB_STRING_MAX_BYTES at the receiver: 64 KiB here. An empty string takes 2 bytes in the
 * TensorProto; parsed, 16 in the message, 32 or so in protobuf-c's scratch while it parses,
 * and 16 as an element. 1,000 of them fit; 3,000 do not: that receive fails with EMSGSIZE,
 * and the error names the setting, its value and the TensorProto's size. Nothing is lost:
 * the send stays for a receive that can take it, which one with a larger bound does, and the
 * next step arrives whole.
 */
static int sc_strings_max_bytes(struct mp *mp)
{
	static const int64_t counts[3] = {1000, 3000, 1000};
	static struct tfab_string empty[3000];

	if (mp->rank == 0) {
		tfab__ctx_lock(mp->ctx);
		mp->ctx->cfg.string_max_bytes = 64 << 10;
		tfab__ctx_unlock(mp->ctx);
	}
	CHECK(mp_barrier(mp, 1) == 0);
	for (int step = 0; step < 3; step++) {
		struct tfab_string_tensor t = {1, &counts[step], empty}, *got = NULL;

		if (mp->rank == 1) {
			struct sent d = {.want = 1};

			CHECK_RC(tfab_send_strings(mp->ctx, "max", step, &t, false, on_sent, &d),
				 0);
			CHECK(mp_wait_flag(mp, &d.all, WAIT_MS));
			CHECK(d.errors == 0);
			continue;
		}
		if (step == 1) {
			int rc;

			max_logged[0] = '\0';
			tfab_log_set_sink(max_capture, NULL);
			rc = tfab_recv_strings_sync(mp->ctx, mp->peers[1], "max", step, WAIT_MS,
						    &got, NULL);
			tfab_log_set_sink(NULL, NULL);
			CHECK_RC(rc, -EMSGSIZE);
			CHECK(got == NULL);
			CHECK(strstr(max_logged, "TFAB_STRING_MAX_BYTES (65536 bytes)"));
			CHECK(strstr(max_logged, "a TensorProto of 6009 bytes takes more"));
			tfab__ctx_lock(mp->ctx);
			mp->ctx->cfg.string_max_bytes = 1 << 20;
			tfab__ctx_unlock(mp->ctx);
		}
		CHECK_RC(
		    tfab_recv_strings_sync(mp->ctx, mp->peers[1], "max", step, WAIT_MS, &got, NULL),
		    0);
		CHECK(got && got->ndim == 1 && got->shape[0] == counts[step]);
		for (int64_t i = 0; i < counts[step]; i++)
			CHECK(got->strings[i].len == 0);
		tfab_string_tensor_free(got);
		if (step == 1) {
			tfab__ctx_lock(mp->ctx);
			mp->ctx->cfg.string_max_bytes = 64 << 10;
			tfab__ctx_unlock(mp->ctx);
		}
	}
	return 0;
}

static const struct mp_scenario scenarios[] = {
    {.name = "strings_send_first", .nranks = 2, .fn = sc_strings_send_first},
    {.name = "strings_recv_first", .nranks = 2, .fn = sc_strings_recv_first},
    {.name = "strings_resize", .nranks = 2, .fn = sc_strings_resize},
    {.name = "strings_vary", .nranks = 2, .fn = sc_strings_vary},
    {.name = "strings_lying_length", .nranks = 2, .fn = sc_strings_lying_length},
    {.name = "strings_big", .nranks = 2, .fn = sc_strings_big},
    {.name = "strings_kind", .nranks = 2, .fn = sc_strings_kind},
    {.name = "strings_max_bytes", .nranks = 2, .fn = sc_strings_max_bytes},
    {.name = "strings_bad", .nranks = 2, .fn = sc_strings_bad},
    {.name = "strings_threads", .nranks = 2, .fn = sc_strings_threads},
};

int main(int argc, char **argv)
{
	return mp_main(argc, argv, scenarios, (int)(sizeof(scenarios) / sizeof(scenarios[0])));
}
