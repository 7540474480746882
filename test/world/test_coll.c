/*
 * The collectives, checked (doc/world.md, "Collectives"):
 *
 *   test_coll threads N   N ranks as threads of this process, each with its own context:
 *                         allreduce (every dtype and operation, both algorithms, odd counts,
 *                         in place), several in flight completing out of order, broadcast,
 *                         allgather, reduce-scatter, barrier, and the calls refused
 *   test_coll env [ITERS] one rank from the environment (TFAB_RANK, ...): a 4 MiB allreduce
 *                         again and again (or ITERS times), each result checked, printing
 *                         ITER n; the first failure prints COLL_FAILED status=<name>
 *                         at_ms=<CLOCK_MONOTONIC> and exits 4 (test_world.py kills or stops
 *                         a rank in the middle)
 *
 * Every result is compared bit for bit with a reference computed here in the order the
 * algorithm documents: integers exactly, floats in the same order of operations, fp16 and
 * bf16 through conversions of this file's own.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tfab/tfab.h>

#include "ranks.h"
#include "../common/gpu_count.h"

#ifdef TFAB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define WAIT_MS 60000

enum kind { K_F32, K_F64, K_F16, K_BF16, K_INT };

struct dtype {
	const char *name;
	enum kind k;
	DLDataType dl;
	size_t size;
};

static const struct dtype DTYPES[] = {
    {"float32", K_F32, {kDLFloat, 32, 1}, 4}, {"float64", K_F64, {kDLFloat, 64, 1}, 8},
    {"float16", K_F16, {kDLFloat, 16, 1}, 2}, {"bfloat16", K_BF16, {kDLBfloat, 16, 1}, 2},
    {"int32", K_INT, {kDLInt, 32, 1}, 4},     {"int64", K_INT, {kDLInt, 64, 1}, 8},
    {"int8", K_INT, {kDLInt, 8, 1}, 1},	      {"uint8", K_INT, {kDLUInt, 8, 1}, 1},
    {"int16", K_INT, {kDLInt, 16, 1}, 2},     {"uint16", K_INT, {kDLUInt, 16, 1}, 2},
    {"uint32", K_INT, {kDLUInt, 32, 1}, 4},   {"uint64", K_INT, {kDLUInt, 64, 1}, 8},
};
#define NDTYPES (sizeof(DTYPES) / sizeof(DTYPES[0]))

static const char *const OP_NAMES[] = {"sum", "avg", "min", "max", "prod"};
#define NOPS 5

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* bfloat16 from float, to nearest even: written here apart from the library's. */
static uint16_t bf16_of(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float bf16_value(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/*
 * IEEE half from float, to nearest even, by another road than the library's: the mantissa
 * scaled to an integer in double and rounded by nearbyint.
 */
static uint16_t f16_of(float f)
{
	double a = fabs((double)f);
	uint16_t sign = signbit(f) ? 0x8000u : 0;
	int e, E;
	double q;

	if (a >= 65520.0)
		return sign | 0x7c00u;
	frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
	E = e - 1 < -14 ? -14 : e - 1;
	q = nearbyint(ldexp(a, 10 - E)); /* 10 bits of fraction */
	if (q >= 2048.0) {
		q = 1024.0;
		E++;
	}
	if (q < 1024.0) /* subnormal (E is -14) */
		return sign | (uint16_t)q;
	return sign | (uint16_t)(((E + 15) << 10) | ((int)q - 1024));
}

static float f16_value(uint16_t h)
{
	int e = (h >> 10) & 0x1f, m = h & 0x3ff;
	double v = e == 31  ? (m ? NAN : INFINITY) /* a product can overflow */
		   : e == 0 ? ldexp(m, -24)
			    : ldexp(1024 + m, e - 25);

	return (float)(h & 0x8000u ? -v : v);
}

/*
 * Rank r's element i: floats of magnitudes from 0.001 to 500, so that the order of a sum
 * changes its rounding; integers of both signs.
 */
static double value(int r, size_t i)
{
	static const double scale[] = {0.01, 0.3, 1.0, 7.0, 100.0};

	return ((double)((r * 37 + (int)(i % 1000003) * 11) % 97) - 48.3) * 0.1 *
		   scale[((size_t)r + i) % 5] +
	       r * 0.001;
}

static int64_t ivalue(int r, size_t i)
{
	return (int64_t)(((uint64_t)r * 7919u + i * 104729u) % 20011u) - 10005;
}

static void fill(const struct dtype *d, void *buf, int r, size_t start, size_t count)
{
	for (size_t j = 0; j < count; j++) {
		size_t i = start + j;

		switch (d->k) {
		case K_F32:
			((float *)buf)[j] = (float)value(r, i);
			break;
		case K_F64:
			((double *)buf)[j] = value(r, i);
			break;
		case K_F16:
			((uint16_t *)buf)[j] = f16_of((float)value(r, i));
			break;
		case K_BF16:
			((uint16_t *)buf)[j] = bf16_of((float)value(r, i));
			break;
		case K_INT: {
			/* 32 and 64 bits: spread over their range; narrower ones wrap ivalue */
			uint64_t v = (uint64_t)ivalue(r, i);

			if (d->size == 4)
				v *= 100003u;
			else if (d->size == 8)
				v = (v << 40) + (uint64_t)r;
			memcpy((char *)buf + j * d->size, &v, d->size); /* the low bytes */
			break;
		}
		}
	}
}

/* v truncated to d's width and extended as d's sign says: what d holds, in 64 bits. */
static uint64_t int_wrap(const struct dtype *d, uint64_t v)
{
	unsigned bits = d->dl.bits;
	uint64_t mask = bits == 64 ? ~(uint64_t)0 : ((uint64_t)1 << bits) - 1;

	v &= mask;
	if (d->dl.code == kDLInt && (v >> (bits - 1)) & 1)
		v |= ~mask;
	return v;
}

static bool int_less(const struct dtype *d, uint64_t a, uint64_t b)
{
	return d->dl.code == kDLInt ? (int64_t)a < (int64_t)b : a < b;
}

#define FOLD(acc, x, op)                                      \
	((op) == TFAB_OP_MIN	? ((x) < (acc) ? (x) : (acc)) \
	 : (op) == TFAB_OP_MAX	? ((x) > (acc) ? (x) : (acc)) \
	 : (op) == TFAB_OP_PROD ? (acc) * (x)                 \
				: (acc) + (x))

/* acc = acc op x, one element of d, as the library reduces two operands. */
static void combine(const struct dtype *d, enum tfab_op op, void *acc, const void *x)
{
	switch (d->k) {
	case K_F32: {
		float a, b;

		memcpy(&a, acc, 4);
		memcpy(&b, x, 4);
		a = FOLD(a, b, op);
		memcpy(acc, &a, 4);
		break;
	}
	case K_F64: {
		double a, b;

		memcpy(&a, acc, 8);
		memcpy(&b, x, 8);
		a = FOLD(a, b, op);
		memcpy(acc, &a, 8);
		break;
	}
	case K_F16:
	case K_BF16: {
		bool f16 = d->k == K_F16;
		uint16_t a, b;
		float fa, fb;

		memcpy(&a, acc, 2);
		memcpy(&b, x, 2);
		fa = f16 ? f16_value(a) : bf16_value(a);
		fb = f16 ? f16_value(b) : bf16_value(b);
		a = f16 ? f16_of(FOLD(fa, fb, op)) : bf16_of(FOLD(fa, fb, op));
		memcpy(acc, &a, 2);
		break;
	}
	case K_INT: {
		/* in 64 bits, truncated to the width after each step */
		uint64_t a = 0, b = 0;

		memcpy(&a, acc, d->size);
		memcpy(&b, x, d->size);
		a = int_wrap(d, a);
		b = int_wrap(d, b);
		if (op == TFAB_OP_MIN)
			a = int_less(d, b, a) ? b : a;
		else if (op == TFAB_OP_MAX)
			a = int_less(d, a, b) ? b : a;
		else
			a = int_wrap(d, op == TFAB_OP_PROD ? a * b : a + b);
		memcpy(acc, &a, d->size);
		break;
	}
	}
}

/* An average's end: acc, the sum of n ranks' elements, divided by n as the library does. */
static void average(const struct dtype *d, void *acc, int n)
{
	switch (d->k) {
	case K_F32:
		*(float *)acc /= (float)n;
		break;
	case K_F64:
		*(double *)acc /= (double)n;
		break;
	case K_F16:
		*(uint16_t *)acc = f16_of(f16_value(*(uint16_t *)acc) / (float)n);
		break;
	case K_BF16:
		*(uint16_t *)acc = bf16_of(bf16_value(*(uint16_t *)acc) / (float)n);
		break;
	case K_INT: {
		uint64_t a = 0;

		memcpy(&a, acc, d->size);
		a = int_wrap(d, a);
		a = int_wrap(d,
			     d->dl.code == kDLInt ? (uint64_t)((int64_t)a / n) : a / (uint64_t)n);
		memcpy(acc, &a, d->size);
		break;
	}
	}
}

/*
 * Element i of the reduction of every rank's tensor (element i of each, as fill makes it),
 * folded in rank order from rank first around the ring, written to out[j].
 */
static void reduce_one(const struct dtype *d, enum tfab_op op, int n, int first, size_t i,
		       void *out, size_t j)
{
	char acc[8], x[8];

	fill(d, acc, first % n, i, 1);
	for (int k = 1; k < n; k++) {
		fill(d, x, (first + k) % n, i, 1);
		combine(d, op, acc, x);
	}
	if (op == TFAB_OP_AVG)
		average(d, acc, n);
	memcpy((char *)out + j * d->size, acc, d->size);
}

/*
 * The same by recursive doubling (coll.c, build_doubling_allreduce): p = the largest power of
 * two <= n ranks take part; the first 2(n - p) pair up, the odd one of each taking the even
 * one's element first; then at each step every place combines with the place whose number
 * differs in that bit.
 */
static void doubling_one(const struct dtype *d, enum tfab_op op, int n, size_t i, void *out,
			 size_t j)
{
	char v[64][8], x[8];
	int p = 1, extra;

	while (p * 2 <= n)
		p *= 2;
	extra = n - p;
	for (int place = 0; place < p; place++) {
		int r = place < extra ? 2 * place + 1 : place + extra;

		fill(d, v[place], r, i, 1);
		if (place < extra) {
			fill(d, x, r - 1, i, 1);
			combine(d, op, x, v[place]);
			memcpy(v[place], x, sizeof(x));
		}
	}
	for (int bit = 1; bit < p; bit *= 2) {
		char w[64][8];

		for (int place = 0; place < p; place++) {
			memcpy(w[place], v[place ^ bit], sizeof(w[place]));
			combine(d, op, w[place], v[place]);
		}
		memcpy(v, w, sizeof(v[0]) * (size_t)p);
	}
	if (op == TFAB_OP_AVG)
		average(d, v[0], n);
	memcpy((char *)out + j * d->size, v[0], d->size);
}

/* The part (of n) that element i of count falls in, as the library splits them. */
static int part_of(size_t count, int n, size_t i)
{
	for (int c = 0; c < n; c++) {
		if (i < count * (size_t)(c + 1) / (size_t)n)
			return c;
	}
	return n - 1;
}

/*
 * The allreduce's reference: direct folds from rank 0, the ring part c from rank c, doubling
 * as doubling_one.
 */
static void allreduce_reference(const struct dtype *d, enum tfab_op op, enum tfab_coll_algo algo,
				int n, size_t count, void *out)
{
	for (size_t i = 0; i < count; i++) {
		if (algo == TFAB_ALGO_DOUBLING)
			doubling_one(d, op, n, i, out, i);
		else
			reduce_one(d, op, n, algo == TFAB_ALGO_RING ? part_of(count, n, i) : 0, i,
				   out, i);
	}
}

static DLTensor tensor_of(const struct dtype *d, void *data, int64_t *shape)
{
	return (DLTensor){
	    .data = data, .device = {kDLCPU, 0}, .ndim = 1, .dtype = d->dl, .shape = shape};
}

/* A rank's view of one collective it started. */
struct job {
	int status;	/* 1 while pending */
	int done_order; /* when it called back, among this rank's */
	atomic_int *order;
};

static void on_done(void *arg, int status)
{
	struct job *j = arg;

	j->status = status;
	j->done_order = atomic_fetch_add(j->order, 1);
}

static int wait_all(struct tfab_world *w, const char *what)
{
	int rc = tfab_world_wait(w, WAIT_MS);

	if (rc)
		printf("rank %d: %s: waiting: %s\n", tfab_world_rank(w), what, tfab_strerror(rc));
	return rc ? 1 : 0;
}

/* First difference of a and b (elements of size es), printed; 0 if none. */
static int compare(int rank, const char *what, const void *got, const void *want, size_t count,
		   size_t es)
{
	for (size_t i = 0; i < count; i++) {
		const unsigned char *g = (const unsigned char *)got + i * es;
		const unsigned char *x = (const unsigned char *)want + i * es;

		if (memcmp(g, x, es) != 0) {
			uint64_t gv = 0, xv = 0;

			memcpy(&gv, g, es);
			memcpy(&xv, x, es);
			printf("rank %d: %s: element %zu of %zu is %#" PRIx64 ", not %#" PRIx64
			       "\n",
			       rank, what, i, count, gv, xv);
			return 1;
		}
	}
	return 0;
}

struct case_ar {
	const struct dtype *d;
	enum tfab_op op;
	enum tfab_coll_algo algo;
	size_t count;
	bool in_place;
	void *in, *out;
	int64_t shape;
	struct job job;
};

static const char *const ALGO_NAMES[] = {"auto", "direct", "ring", "doubling"};

/* Every operation and the three algorithms for one dtype, all in flight at once. */
static int allreduce_dtype(struct tfab_world *w, const struct dtype *d)
{
	static const size_t counts[] = {1, 5, 1031, 70001};
	enum { NC = NOPS * 3 * (sizeof(counts) / sizeof(counts[0])) };
	struct case_ar cs[NC];
	int rank = tfab_world_rank(w), n = tfab_world_size(w), bad = 0, ncase = 0;
	atomic_int order = 0;

	for (int op = 0; op < NOPS; op++) {
		for (int a = TFAB_ALGO_DIRECT; a <= TFAB_ALGO_DOUBLING; a++) {
			for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
				struct case_ar *c = &cs[ncase++];
				struct tfab_coll_opts o = {.algo = (enum tfab_coll_algo)a};
				DLTensor tin, tout;
				int rc;

				*c = (struct case_ar){.d = d,
						      .op = (enum tfab_op)op,
						      .algo = o.algo,
						      .count = counts[ci],
						      .in_place = (op + (int)ci) % 2 == 0,
						      .shape = (int64_t)counts[ci],
						      .job = {1, -1, &order}};
				c->in = malloc(c->count * d->size);
				c->out = c->in_place ? c->in : malloc(c->count * d->size);
				fill(d, c->in, rank, 0, c->count);
				tin = tensor_of(d, c->in, &c->shape);
				tout = tensor_of(d, c->out, &c->shape);
				rc = tfab_allreduce(w, &tin, &tout, c->op, &o, on_done, &c->job);
				if (rc) {
					printf("rank %d: allreduce %s %s: %s\n", rank, d->name,
					       OP_NAMES[op], tfab_strerror(rc));
					return 1;
				}
			}
		}
	}
	bad |= wait_all(w, "allreduce");
	for (int i = 0; i < ncase; i++) {
		struct case_ar *c = &cs[i];
		void *want = malloc(c->count * d->size);
		char what[128];

		snprintf(what, sizeof(what), "allreduce %s %s %s of %zu%s", d->name,
			 OP_NAMES[c->op], ALGO_NAMES[c->algo], c->count,
			 c->in_place ? " in place" : "");
		allreduce_reference(d, c->op, c->algo, n, c->count, want);
		if (c->job.status) {
			printf("rank %d: %s: %s\n", rank, what, tfab_strerror(c->job.status));
			bad = 1;
		} else {
			bad |= compare(rank, what, c->out, want, c->count, d->size);
		}
		free(want);
		if (!c->in_place)
			free(c->out);
		free(c->in);
	}
	return bad;
}

/* A large allreduce started first, then small ones: the small ones end before it. */
/*
 * The ranks (threads) through out_of_order, and those whose large allreduce ended after a
 * small one: out of order on every rank is not assured (a rank's thread that loses its core
 * between the large one's start and the small ones' lets the large one finish first there,
 * which a CI rehearsal saw once on ofi:tcp with the progress thread), on none is a failure.
 */
static atomic_int ooo_done, ooo_seen;

static int out_of_order(struct tfab_world *w)
{
	const struct dtype *d = &DTYPES[0];
	enum { SMALL = 6 };
	int rank = tfab_world_rank(w), n = tfab_world_size(w), bad = 0;
	int64_t big_n = 1 << 21, one = 3;
	float *big = malloc((size_t)big_n * 4), small[SMALL][3], want[3];
	atomic_int order = 0;
	struct job jobs[SMALL + 1];
	DLTensor t = tensor_of(d, big, &big_n);
	float *want_big = malloc((size_t)big_n * 4);

	fill(d, big, rank, 0, (size_t)big_n);
	for (int i = 0; i <= SMALL; i++)
		jobs[i] = (struct job){1, -1, &order};
	if (tfab_allreduce(w, &t, &t, TFAB_OP_SUM, NULL, on_done, &jobs[0]))
		return 1;
	for (int i = 0; i < SMALL; i++) {
		DLTensor s = tensor_of(d, small[i], &one);

		fill(d, small[i], rank, 0, 3);
		if (tfab_allreduce(w, &s, &s, TFAB_OP_SUM, NULL, on_done, &jobs[i + 1]))
			return 1;
	}
	bad |= wait_all(w, "out of order");
	allreduce_reference(d, TFAB_OP_SUM, TFAB_ALGO_RING, n, (size_t)big_n, want_big);
	allreduce_reference(d, TFAB_OP_SUM, TFAB_ALGO_DIRECT, n, 3, want);
	for (int i = 0; i <= SMALL; i++) {
		if (jobs[i].status) {
			printf("rank %d: out of order, allreduce %d: %s\n", rank, i,
			       tfab_strerror(jobs[i].status));
			bad = 1;
		}
	}
	bad |= compare(rank, "out of order, the large one", big, want_big, (size_t)big_n, 4);
	for (int i = 0; i < SMALL; i++)
		bad |= compare(rank, "out of order, a small one", small[i], want, 3, 4);
	if (jobs[0].done_order == 0)
		printf("rank %d: the 8 MiB allreduce started first ended first here\n", rank);
	else
		atomic_fetch_add(&ooo_seen, 1);
	/* The last rank through judges all. */
	if (atomic_fetch_add(&ooo_done, 1) == n - 1 && atomic_load(&ooo_seen) == 0) {
		printf("rank %d: on no rank did a small allreduce end before the 8 MiB one started "
		       "first: not out of order\n",
		       rank);
		bad = 1;
	}
	free(big);
	free(want_big);
	return bad;
}

/*
 * Whether small allreduces go through the ranks' segments here: every peer on native shm, and
 * TFAB_COLL_SHM not 0.
 */
static bool segments_expected(struct tfab_world *w)
{
	const char *v = getenv("TFAB_COLL_SHM");

	if (v && atol(v) == 0)
		return false;
	for (int r = 0; r < tfab_world_size(w); r++) {
		const char *path = tfab_peer_path(tfab_world_peer(w, r));

		if (r != tfab_world_rank(w) && (!path || strcmp(path, "shm") != 0))
			return false;
	}
	return true;
}

/*
 * Small allreduces, more in flight at once than the segments have slots (16), so that later
 * ones wait for slots that every rank has read: each sum checked exactly, and the way they
 * went (tfab_stats.coll_shm: through the segments where segments_expected, else none).
 */
static int many_small(struct tfab_context *ctx, struct tfab_world *w)
{
	enum { M = 40, COUNT = 3 };
	int rank = tfab_world_rank(w), n = tfab_world_size(w), bad = 0;
	int32_t in[M][COUNT], out[M][COUNT];
	int64_t count = COUNT;
	struct job jobs[M];
	atomic_int order = 0;
	struct tfab_stats s0, s1;
	uint64_t got;
	bool expect = segments_expected(w);

	tfab_get_stats(ctx, &s0);
	for (int m = 0; m < M; m++) {
		DLTensor tin = tensor_of(&DTYPES[4], in[m], &count);
		DLTensor tout = tensor_of(&DTYPES[4], out[m], &count);

		for (int i = 0; i < COUNT; i++)
			in[m][i] = rank * 1000 + m * 10 + i;
		jobs[m] = (struct job){1, -1, &order};
		if (tfab_allreduce(w, &tin, m % 2 ? &tin : &tout, TFAB_OP_SUM, NULL, on_done,
				   &jobs[m])) {
			printf("rank %d: small allreduce %d not started\n", rank, m);
			return 1;
		}
	}
	bad |= wait_all(w, "many small");
	for (int m = 0; m < M && !bad; m++) {
		const int32_t *res = m % 2 ? in[m] : out[m];

		if (jobs[m].status) {
			printf("rank %d: small allreduce %d: %s\n", rank, m,
			       tfab_strerror(jobs[m].status));
			bad = 1;
		}
		for (int i = 0; i < COUNT && !bad; i++) {
			int32_t want = 1000 * n * (n - 1) / 2 + n * (m * 10 + i);

			if (res[i] != want) {
				printf("rank %d: small allreduce %d [%d]: %d, not %d\n", rank, m, i,
				       res[i], want);
				bad = 1;
			}
		}
	}
	tfab_get_stats(ctx, &s1);
	got = s1.coll_shm - s0.coll_shm;
	if (got != (expect ? (uint64_t)M : 0)) {
		printf("rank %d: %llu of %d small allreduces went through the segments, where %s "
		       "were expected to\n",
		       rank, (unsigned long long)got, M, expect ? "all" : "none");
		bad = 1;
	}
	if (rank == 0)
		printf("many small (%s): %s\n", expect ? "through the segments" : "as messages",
		       bad ? "FAILED" : "ok");
	return bad;
}

static uint8_t byte_of(int r, size_t i)
{
	return (uint8_t)(r * 31 + i * 7 + (i >> 8));
}

static int broadcast(struct tfab_world *w)
{
	static const size_t sizes[] = {1, 100, 300001};
	const struct dtype u8 = {"uint8", K_INT, {kDLUInt, 8, 1}, 1};
	int rank = tfab_world_rank(w), n = tfab_world_size(w), bad = 0;

	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
		for (int root = 0; root<n; root += n - 1> 0 ? n - 1 : 1) {
			int64_t shape = (int64_t)sizes[si];
			uint8_t *b = calloc(sizes[si], 1);
			DLTensor t = tensor_of(&u8, b, &shape);
			atomic_int order = 0;
			struct job j = {1, -1, &order};

			for (size_t i = 0; rank == root && i < sizes[si]; i++)
				b[i] = byte_of(root, i);
			if (tfab_broadcast(w, &t, root, on_done, &j) || wait_all(w, "broadcast"))
				return 1;
			for (size_t i = 0; i < sizes[si] && !j.status; i++) {
				if (b[i] != byte_of(root, i)) {
					printf("rank %d: broadcast of %zu from %d: byte %zu is %u, "
					       "not "
					       "%u\n",
					       rank, sizes[si], root, i, b[i], byte_of(root, i));
					bad = 1;
					break;
				}
			}
			if (j.status) {
				printf("rank %d: broadcast: %s\n", rank, tfab_strerror(j.status));
				bad = 1;
			}
			free(b);
			if (n == 1)
				break;
		}
	}
	return bad;
}

static int allgather(struct tfab_world *w)
{
	static const size_t counts[] = {1, 1000, 70001};
	const struct dtype *d = &DTYPES[4];
	int rank = tfab_world_rank(w), n = tfab_world_size(w), bad = 0;

	for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
		for (int in_place = 0; in_place < 2; in_place++) {
			size_t m = counts[ci];
			int64_t sin = (int64_t)m, sout = (int64_t)m * n;
			int32_t *out = calloc(m * (size_t)n, 4), *want = malloc(m * (size_t)n * 4);
			int32_t *in = in_place ? out + m * (size_t)rank : malloc(m * 4);
			DLTensor tin = tensor_of(d, in, &sin), tout = tensor_of(d, out, &sout);
			atomic_int order = 0;
			struct job j = {1, -1, &order};
			char what[64];

			fill(d, in, rank, 0, m);
			for (int k = 0; k < n; k++)
				fill(d, want + m * (size_t)k, k, 0, m);
			if (tfab_allgather(w, &tin, &tout, on_done, &j) || wait_all(w, "allgather"))
				return 1;
			snprintf(what, sizeof(what), "allgather of %zu%s", m,
				 in_place ? " in place" : "");
			if (j.status) {
				printf("rank %d: %s: %s\n", rank, what, tfab_strerror(j.status));
				bad = 1;
			} else {
				bad |= compare(rank, what, out, want, m * (size_t)n, 4);
			}
			if (!in_place)
				free(in);
			free(out);
			free(want);
		}
	}
	return bad;
}

static int reduce_scatter(struct tfab_world *w)
{
	static const size_t counts[] = {1, 777, 40000};
	static const int dts[] = {0, 5, 2, 7};
	int rank = tfab_world_rank(w), n = tfab_world_size(w), bad = 0;

	for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
		for (int di = 0; di < 4; di++) {
			for (int op = 0; op < NOPS; op += 1 + di % 3) {
				const struct dtype *d = &DTYPES[dts[di]];
				size_t m = counts[ci];
				int64_t sin = (int64_t)m * n, sout = (int64_t)m;
				void *in = malloc(m * (size_t)n * d->size),
				     *out = malloc(m * d->size);
				void *want = malloc(m * d->size);
				DLTensor tin = tensor_of(d, in, &sin),
					 tout = tensor_of(d, out, &sout);
				atomic_int order = 0;
				struct job j = {1, -1, &order};
				char what[96];

				fill(d, in, rank, 0, m * (size_t)n);
				/* part c folds from rank c + 1 around to rank c */
				for (size_t i = 0; i < m; i++)
					reduce_one(d, (enum tfab_op)op, n, (rank + 1) % n,
						   m * (size_t)rank + i, want, i);
				if (tfab_reduce_scatter(w, &tin, &tout, (enum tfab_op)op, on_done,
							&j) ||
				    wait_all(w, "reduce_scatter"))
					return 1;
				snprintf(what, sizeof(what), "reduce_scatter %s %s of %zu", d->name,
					 OP_NAMES[op], m);
				if (j.status) {
					printf("rank %d: %s: %s\n", rank, what,
					       tfab_strerror(j.status));
					bad = 1;
				} else {
					bad |= compare(rank, what, out, want, m, d->size);
				}
				free(in);
				free(out);
				free(want);
			}
		}
	}
	return bad;
}

/*
 * Reduce to a root: every dtype of five and every operation, all in flight at once, roots
 * and sizes varied, in place on the root or not; out NULL off the root, or one the library
 * must leave alone. Folded in rank order: the direct allreduce's reference.
 */
static int reduce_root(struct tfab_world *w)
{
	static const size_t counts[] = {1, 1031, 70001};
	static const int dts[] = {0, 2, 6, 7, 5}; /* float32, float16, int8, uint8, int64 */
	enum { NC = 5 * NOPS };
	struct {
		const struct dtype *d;
		int op, root;
		size_t count;
		bool in_place;
		void *in, *out;
		int64_t shape;
		struct job job;
	} cs[NC];
	int rank = tfab_world_rank(w), n = tfab_world_size(w), bad = 0, nc = 0;
	atomic_int order = 0;

	for (int di = 0; di < 5; di++) {
		for (int op = 0; op < NOPS; op++) {
			const struct dtype *d = &DTYPES[dts[di]];
			size_t m = counts[(size_t)(di + op) % 3];
			int root = (di + op) % n;
			bool in_place = op % 2 == 1, is_root = rank == root;
			DLTensor tin, tout;

			cs[nc].d = d;
			cs[nc].op = op;
			cs[nc].root = root;
			cs[nc].count = m;
			cs[nc].in_place = in_place;
			cs[nc].shape = (int64_t)m;
			cs[nc].job = (struct job){1, -1, &order};
			cs[nc].in = malloc(m * d->size);
			/* off the root: an out the library must not touch, or NULL */
			cs[nc].out = in_place && is_root      ? cs[nc].in
				     : is_root || op % 2 == 0 ? malloc(m * d->size)
							      : NULL;
			if (cs[nc].out && cs[nc].out != cs[nc].in)
				memset(cs[nc].out, 0x5a, m * d->size);
			fill(d, cs[nc].in, rank, 0, m);
			tin = tensor_of(d, cs[nc].in, &cs[nc].shape);
			tout = tensor_of(d, cs[nc].out, &cs[nc].shape);
			if (tfab_reduce(w, &tin, cs[nc].out ? &tout : NULL, (enum tfab_op)op, root,
					on_done, &cs[nc].job)) {
				printf("rank %d: reduce %s %s not started\n", rank, d->name,
				       OP_NAMES[op]);
				return 1;
			}
			nc++;
		}
	}
	bad |= wait_all(w, "reduce");
	for (int i = 0; i < nc; i++) {
		const struct dtype *d = cs[i].d;
		size_t m = cs[i].count;
		void *want = malloc(m * d->size);
		char what[128];

		snprintf(what, sizeof(what), "reduce %s %s of %zu to %d%s", d->name,
			 OP_NAMES[cs[i].op], m, cs[i].root, cs[i].in_place ? " in place" : "");
		if (rank == cs[i].root) {
			for (size_t e = 0; e < m; e++)
				reduce_one(d, (enum tfab_op)cs[i].op, n, 0, e, want, e);
		} else if (cs[i].out) {
			memset(want, 0x5a, m * d->size); /* untouched */
		}
		if (cs[i].job.status) {
			printf("rank %d: %s: %s\n", rank, what, tfab_strerror(cs[i].job.status));
			bad = 1;
		} else if (cs[i].out) {
			bad |= compare(rank, what, cs[i].out, want, m, d->size);
		}
		if (rank != cs[i].root || !cs[i].in_place) {
			/* the input as it was */
			fill(d, want, rank, 0, m);
			bad |= compare(rank, what, cs[i].in, want, m, d->size);
		}
		if (cs[i].out != cs[i].in)
			free(cs[i].out);
		free(cs[i].in);
		free(want);
	}
	if (rank == 0)
		printf("reduce: %s\n", bad ? "FAILED" : "ok");
	return bad;
}

/*
 * Gather and scatter at three sizes (eager, a tensor, a large tensor), from the first and the
 * last rank, the root's part in its place in the whole or apart; NULL where the tensor is the
 * root's only. Rank k's part is fill's pattern of k (gather) or of 100 + k (scatter).
 */
static int gather_scatter(struct tfab_world *w)
{
	static const size_t counts[] = {3, 1000, 70001};
	const struct dtype *d = &DTYPES[1]; /* float64: any dtype moves as bytes */
	int rank = tfab_world_rank(w), n = tfab_world_size(w), bad = 0;

	for (size_t ci = 0; ci < 3; ci++) {
		for (int root = 0; root<n; root += n - 1> 0 ? n - 1 : 1) {
			for (int in_place = 0; in_place < 2; in_place++) {
				size_t m = counts[ci], es = d->size;
				int64_t sp = (int64_t)m, sw = (int64_t)m * n;
				bool is_root = rank == root, apart = !(is_root && in_place);
				uint8_t *whole = is_root ? malloc(m * (size_t)n * es) : NULL;
				uint8_t *part =
				    apart ? malloc(m * es) : whole + (size_t)root * m * es;
				uint8_t *want = malloc(m * (size_t)n * es);
				DLTensor tp = tensor_of(d, part, &sp),
					 tw = tensor_of(d, whole, &sw);
				atomic_int order = 0;
				struct job j = {1, -1, &order};
				char what[96];

				/* gather */
				fill(d, part, rank, 0, m);
				snprintf(what, sizeof(what), "gather of %zu to %d%s", m, root,
					 in_place ? " in place" : "");
				if (tfab_gather(w, &tp, is_root ? &tw : NULL, root, on_done, &j) ||
				    wait_all(w, what))
					return 1;
				for (int k = 0; k < n; k++)
					fill(d, want + (size_t)k * m * es, k, 0, m);
				if (j.status) {
					printf("rank %d: %s: %s\n", rank, what,
					       tfab_strerror(j.status));
					bad = 1;
				} else if (is_root) {
					bad |= compare(rank, what, whole, want, m * (size_t)n, es);
				}
				/* scatter */
				j = (struct job){1, -1, &order};
				for (int k = 0; is_root && k < n; k++)
					fill(d, whole + (size_t)k * m * es, 100 + k, 0, m);
				if (apart)
					memset(part, 0, m * es);
				snprintf(what, sizeof(what), "scatter of %zu from %d%s", m, root,
					 in_place ? " in place" : "");
				if (tfab_scatter(w, is_root ? &tw : NULL, &tp, root, on_done, &j) ||
				    wait_all(w, what))
					return 1;
				fill(d, want, 100 + rank, 0, m);
				if (j.status) {
					printf("rank %d: %s: %s\n", rank, what,
					       tfab_strerror(j.status));
					bad = 1;
				} else {
					bad |= compare(rank, what, part, want, m, es);
				}
				if (apart)
					free(part);
				free(whole);
				free(want);
			}
		}
	}
	if (rank == 0)
		printf("gather and scatter: %s\n", bad ? "FAILED" : "ok");
	return bad;
}

/* Elements rank `from` sends rank `to` in alltoallv case v: some none, some large. */
static size_t a2a_count(int from, int to, int v)
{
	static const size_t scale[] = {1, 300, 20000};

	if (v == 3)
		return 50; /* equal pieces, passed as NULL */
	return (size_t)((from * 7 + to * 3 + v) % 5) * scale[v];
}

/*
 * One alltoallv of case v with dtype d (counts given, or NULL for v = 3): rank from's piece for
 * rank to is fill's pattern of from * 1000 + to. Its status, or INT_MIN (said); *bad_p set
 * where out is not what it must be. With skew, rank 0 sends rank 1 one element more than rank 1
 * expects (its in one larger): the pair must fail, and rank 1's out keep its bytes where rank
 * 0's piece would go.
 */
static int a2a_one(struct tfab_world *w, const struct dtype *d, int v, bool skew, int *bad_p)
{
	int rank = tfab_world_rank(w), n = tfab_world_size(w);
	size_t *sc = calloc((size_t)n, sizeof(size_t)), *rc = calloc((size_t)n, sizeof(size_t));
	size_t tin = 0, tout = 0, off = 0, es = d->size;
	uint8_t *in, *out, *want;
	int64_t sin, sout;
	atomic_int order = 0;
	struct job j = {1, -1, &order};
	DLTensor ti, to;
	char what[96];

	for (int k = 0; k < n; k++) {
		sc[k] = a2a_count(rank, k, v);
		rc[k] = a2a_count(k, rank, v);
	}
	if (skew && rank == 0)
		sc[1]++;
	for (int k = 0; k < n; k++) {
		tin += sc[k];
		tout += rc[k];
	}
	in = malloc(tin * es + 1);
	out = malloc(tout * es + 1);
	want = malloc(tout * es + 1);
	memset(out, 0x77, tout * es);
	for (int k = 0; k < n; k++) {
		fill(d, in + off * es, rank * 1000 + k, 0, sc[k]);
		off += sc[k];
	}
	off = 0;
	for (int k = 0; k < n; k++) {
		if (skew && rank == 1 && k == 0)
			memset(want + off * es, 0x77, rc[k] * es);
		else
			fill(d, want + off * es, k * 1000 + rank, 0, rc[k]);
		off += rc[k];
	}
	sin = (int64_t)tin;
	sout = (int64_t)tout;
	ti = tensor_of(d, in, &sin);
	to = tensor_of(d, out, &sout);
	snprintf(what, sizeof(what), "alltoallv %s case %d%s", d->name, v, skew ? " skewed" : "");
	if (tfab_alltoallv(w, &ti, v == 3 ? NULL : sc, &to, v == 3 ? NULL : rc, on_done, &j) ||
	    wait_all(w, what)) {
		printf("rank %d: %s not started or not ended\n", rank, what);
		j.status = INT_MIN;
	} else if (j.status == 0) {
		*bad_p |= compare(rank, what, out, want, tout, es);
	} else if (skew && rank == 1) {
		/* nothing from rank 0 (the others' pieces may have come or not) */
		*bad_p |= compare(rank, what, out, want, rc[0], es);
	}
	free(sc);
	free(rc);
	free(in);
	free(out);
	free(want);
	return j.status;
}

/* How many times alltoallv tries counts that differ (argv[3] of "threads"). */
static int a2a_skews = 1;

/*
 * All to all: uneven pieces (some empty, some large enough to go as tensors in pieces' ways),
 * equal ones (NULL counts), three dtypes; then counts that differ between ranks 0 and 1: both
 * fail with -EINVAL, the others end well or with a failure passed on, and the next alltoallv
 * is right everywhere.
 */
static int alltoallv(struct tfab_world *w)
{
	static const int dts[] = {4, 7, 2}; /* int32, uint8, float16 */
	int rank = tfab_world_rank(w), n = tfab_world_size(w), bad = 0, st;

	for (int v = 0; v < 4; v++) {
		for (int di = 0; di < 3; di++) {
			st = a2a_one(w, &DTYPES[dts[di]], v, false, &bad);
			if (st) {
				printf("rank %d: alltoallv case %d %s: %s\n", rank, v,
				       DTYPES[dts[di]].name,
				       st == INT_MIN ? "not run" : tfab_strerror(st));
				bad = 1;
			}
		}
	}
	/*
	 * rank 0 sends rank 1 1201 elements for 1200 (case 1), then 1 for none (case 2), each
	 * a2a_skews times: what each rank sees first (the counts, the failure passed on, the
	 * data) is an order of messages on three connections
	 */
	for (int i = 0; i < 2 * a2a_skews && n > 1; i++) {
		int v = 1 + i % 2;

		st = a2a_one(w, &DTYPES[4], v, true, &bad);
		if (rank <= 1 ? st != -EINVAL : st != 0 && st != -TFAB_ERR_PEER_FAILED) {
			printf("rank %d: alltoallv with counts that differ between ranks 0 and 1: "
			       "%s, not %s\n",
			       rank, st == INT_MIN ? "not run" : tfab_strerror(st),
			       rank <= 1 ? "EINVAL" : "success or TFAB_ERR_PEER_FAILED");
			bad = 1;
		}
		st = a2a_one(w, &DTYPES[4], 2, false, &bad);
		if (st) {
			printf("rank %d: alltoallv after the one that failed: %s\n", rank,
			       st == INT_MIN ? "not run" : tfab_strerror(st));
			bad = 1;
		}
	}
	if (rank == 0)
		printf("alltoallv: %s\n", bad ? "FAILED" : "ok");
	return bad;
}

/* Shared by the threads: who has entered the barrier. */
static atomic_int entered[64];

static int barrier(struct tfab_context *ctx, struct tfab_world *w)
{
	int rank = tfab_world_rank(w), n = tfab_world_size(w), bad = 0;
	atomic_int order = 0;
	struct job j = {1, -1, &order};
	struct tfab_stats s0, s1;
	uint64_t want = segments_expected(w) ? 1 : 0;

	tfab_get_stats(ctx, &s0);
	usleep((useconds_t)rank * 30000);
	atomic_store(&entered[rank], 1);
	if (tfab_barrier(w, on_done, &j) || wait_all(w, "barrier"))
		return 1;
	for (int k = 0; k < n && k < 64; k++) {
		if (!atomic_load(&entered[k])) {
			printf("rank %d: left the barrier before rank %d entered it\n", rank, k);
			bad = 1;
		}
	}
	if (j.status) {
		printf("rank %d: barrier: %s\n", rank, tfab_strerror(j.status));
		bad = 1;
	}
	/* the way it went: through the segments where small allreduces go that way */
	tfab_get_stats(ctx, &s1);
	if (s1.coll_shm - s0.coll_shm != want) {
		printf("rank %d: the barrier went through the segments %llu times, not %llu\n",
		       rank, (unsigned long long)(s1.coll_shm - s0.coll_shm),
		       (unsigned long long)want);
		bad = 1;
	}
	return bad;
}

static int called_back;

static void must_not_call(void *arg, int status)
{
	(void)arg;
	(void)status;
	called_back = 1;
}

/* Calls refused at once, with no callback; leaving with a collective in flight. */
/*
 * A callback that waits for the world: -EDEADLK at once, wherever the callback runs (inside
 * the tfab_allreduce of the last rank to start it, as through the segments, or in progress).
 */
struct waiting_cb {
	struct tfab_world *w;
	int rc, status;
	bool called;
};

static void wait_in_callback(void *arg, int status)
{
	struct waiting_cb *c = arg;

	c->status = status;
	c->rc = tfab_world_wait(c->w, 2000);
	c->called = true;
}

static int wait_from_callback(struct tfab_world *w)
{
	int rank = tfab_world_rank(w);
	int32_t v[2] = {rank, 1};
	int64_t two = 2;
	DLTensor t = tensor_of(&DTYPES[4], v, &two);
	struct waiting_cb c = {w, 1, 1, false};

	if (tfab_allreduce(w, &t, &t, TFAB_OP_SUM, NULL, wait_in_callback, &c))
		return 1;
	if (wait_all(w, "a callback that waits"))
		return 1;
	if (!c.called || c.status || c.rc != -EDEADLK) {
		printf("rank %d: tfab_world_wait in a collective's callback: %s (the "
		       "allreduce: %s), not EDEADLK\n",
		       rank, c.called ? tfab_strerror(c.rc) : "never called",
		       tfab_strerror(c.status));
		return 1;
	}
	return 0;
}

/* The last error the library logged on this thread (every rank is a thread here). */
static _Thread_local char last_error[512];

static void keep_error(void *arg, enum tfab_log_level level, const char *subsys, const char *msg)
{
	(void)arg;
	if (level == TFAB_LOG_ERROR)
		snprintf(last_error, sizeof(last_error), "%s", msg);
	fprintf(stderr, "tfab %s [%s]: %s\n", tfab_log_level_name(level), subsys, msg);
}

/* A refusal's message names the dtypes as users write them: has, or else bad. */
static int refusal_says(struct tfab_world *w, const char *what, int rc, const char *has)
{
	if (rc == -EINVAL && strstr(last_error, has))
		return 0;
	printf("rank %d: %s: %s, and the log said \"%s\", not \"%s\"\n", tfab_world_rank(w), what,
	       tfab_strerror(rc), last_error, has);
	return 1;
}

static int refused(struct tfab_world *w)
{
	const struct dtype *d = &DTYPES[0];
	int rank = tfab_world_rank(w), n = tfab_world_size(w), bad = 0, rc;
	float a[4] = {0}, b[4] = {0};
	uint8_t u[4] = {0};
	int64_t four = 4, three = 3;
	DLTensor ta = tensor_of(d, a, &four), tb = tensor_of(d, b, &three);
	/* bool (DLPack's kDLBool, 6): not reduced */
	DLTensor tu = {.data = u,
		       .device = {kDLCPU, 0},
		       .ndim = 1,
		       .dtype = {(uint8_t)6, 8, 1},
		       .shape = &four};
	atomic_int order = 0;
	struct job j = {1, -1, &order};
	size_t fives[64] = {5, 5, 5, 5, 5, 5, 5, 5}; /* worlds of up to 8 */
	struct {
		const char *what;
		int rc;
	} cases[] = {
	    {"sizes that differ",
	     tfab_allreduce(w, &ta, &tb, TFAB_OP_SUM, NULL, must_not_call, NULL)},
	    {"bool, which allreduce does not reduce",
	     tfab_allreduce(w, &tu, &tu, TFAB_OP_SUM, NULL, must_not_call, NULL)},
	    {"an unknown operation", tfab_allreduce(w, &ta, &ta, (enum tfab_op)(TFAB_OP_PROD + 1),
						    NULL, must_not_call, NULL)},
	    {"no callback", tfab_allreduce(w, &ta, &ta, TFAB_OP_SUM, NULL, NULL, NULL)},
	    {"a root out of the world", tfab_broadcast(w, &ta, n, must_not_call, NULL)},
	    {"an allgather whose out is not size times in",
	     tfab_allgather(w, &ta, &ta, must_not_call, NULL)},
	    {"a reduce to a root out of the world",
	     tfab_reduce(w, &ta, &ta, TFAB_OP_SUM, n, must_not_call, NULL)},
	    {"a reduce of bool", tfab_reduce(w, &tu, &tu, TFAB_OP_SUM, rank, must_not_call, NULL)},
	    {"a reduce whose root has no out",
	     tfab_reduce(w, &ta, NULL, TFAB_OP_SUM, rank, must_not_call, NULL)},
	    {"a gather to a root out of the world",
	     tfab_gather(w, &ta, &ta, -1, must_not_call, NULL)},
	    {"a gather whose out is not size times in",
	     tfab_gather(w, &ta, &tb, rank, must_not_call, NULL)},
	    {"a scatter whose root has no in",
	     tfab_scatter(w, NULL, &ta, rank, must_not_call, NULL)},
	    {"a scatter whose out is missing",
	     tfab_scatter(w, &ta, NULL, rank, must_not_call, NULL)},
	    {"an alltoallv whose counts do not add up to its tensors",
	     tfab_alltoallv(w, &ta, fives, &tb, fives, must_not_call, NULL)},
	    {"an alltoallv in place", tfab_alltoallv(w, &ta, NULL, &ta, NULL, must_not_call, NULL)},
	    {"an alltoallv of float32 into uint8",
	     tfab_alltoallv(w, &ta, NULL, &tu, NULL, must_not_call, NULL)},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		if (cases[i].rc != -EINVAL && !(n == 1 && i == 5)) {
			printf("rank %d: %s: %s, not EINVAL\n", rank, cases[i].what,
			       tfab_strerror(cases[i].rc));
			bad = 1;
		}
	}
	tfab_log_set_sink(keep_error, NULL);
	{
		int32_t i32[4] = {0};
		DLTensor ti = tensor_of(&DTYPES[4], i32, &four);

		rc = tfab_allreduce(w, &tu, &tu, TFAB_OP_SUM, NULL, must_not_call, NULL);
		bad |= refusal_says(w, "allreduce of bool", rc,
				    "allreduce: bool tensors are not reduced");
		rc = tfab_allreduce(w, &ta, &ti, TFAB_OP_SUM, NULL, must_not_call, NULL);
		bad |= refusal_says(w, "allreduce of float32 into int32", rc,
				    "allreduce: in is float32 and out int32");
		rc = tfab_reduce(w, &ta, &ta, TFAB_OP_SUM, n, must_not_call, NULL);
		bad |= refusal_says(w, "reduce to a root out of the world", rc, "reduce: root ");
		rc = tfab_alltoallv(w, &ta, fives, &tb, fives, must_not_call, NULL);
		bad |= refusal_says(w, "alltoallv whose counts do not add up", rc,
				    "alltoallv: send_counts add up to ");
	}
	bad |= wait_from_callback(w);
	/* Rank 0 alone in a barrier: leaving the world must wait for it. */
	if (rank == 0 && n > 1) {
		if (tfab_barrier(w, on_done, &j))
			return 1;
		rc = tfab_world_leave(w);
		if (rc != -EBUSY) {
			printf("rank 0: leaving with a barrier in flight: %s, not EBUSY\n",
			       tfab_strerror(rc));
			return 1;
		}
		if (tfab_world_wait(w, 0) != -ETIMEDOUT) {
			printf("rank 0: a barrier no other rank entered ended\n");
			bad = 1;
		}
	}
	usleep(100000);
	if (rank != 0 && tfab_barrier(w, on_done, &j))
		return 1;
	bad |= wait_all(w, "the barrier after the refusals");
	if (j.status || called_back) {
		printf("rank %d: %s\n", rank,
		       called_back ? "a refused call called back" : tfab_strerror(j.status));
		bad = 1;
	}
	return bad;
}

/* Shared by the threads: rank 0's result of a compressed allreduce, for the others. */
static float *z_result;
static pthread_barrier_t z_barrier;

/* What the ranks' inputs sum to (fp32 values, summed in double). */
static void exact_sum(int n, size_t count, double *sum, double *maxabs)
{
	*maxabs = 0;
	for (size_t i = 0; i < count; i++) {
		sum[i] = 0;
		for (int r = 0; r < n; r++)
			sum[i] += (float)value(r, i);
		*maxabs = fabs(sum[i]) > *maxabs ? fabs(sum[i]) : *maxabs;
	}
}

/* The largest |got - want| over count values. */
static double max_err(const float *got, const double *want, size_t count)
{
	double e = 0;

	for (size_t i = 0; i < count; i++)
		e = fabs(got[i] - want[i]) > e ? fabs(got[i] - want[i]) : e;
	return e;
}

/*
 * Compressed allreduces (fp32 sum on the ring): within the compression's error of the exact
 * sum, the same bits on every rank, fewer bytes on the wire by the compression's ratio; and
 * error feedback: the mean of 16 allreduces of one tensor under one key comes far closer to
 * the exact sum than one allreduce does (the rounding error does not accumulate).
 */
static int compressed(struct tfab_context *ctx, struct tfab_world *w)
{
	static const struct {
		const char *name;
		enum tfab_compress how;
		double eps, ratio; /* relative precision of one rounding; wire/logical at most */
	} zs[] = {{"fp16", TFAB_COMPRESS_FP16, 1.0 / 2048, 0.51},
		  {"bf16", TFAB_COMPRESS_BF16, 1.0 / 256, 0.51},
		  {"int8", TFAB_COMPRESS_INT8, 1.0 / 127, 0.26}};
	enum { STEPS = 16 };
	const struct dtype *d = &DTYPES[0];
	int rank = tfab_world_rank(w), n = tfab_world_size(w), bad = 0;
	size_t count = 70001;
	int64_t shape = (int64_t)count;
	float *out = malloc(count * 4), *in = malloc(count * 4);
	double *sum = malloc(count * sizeof(double)), *mean = malloc(count * sizeof(double));
	double maxabs;

	fill(d, in, rank, 0, count);
	exact_sum(n, count, sum, &maxabs);
	for (size_t z = 0; z < sizeof(zs) / sizeof(zs[0]); z++) {
		struct tfab_coll_opts o = {.compress = zs[z].how};
		DLTensor ti = tensor_of(d, in, &shape), to = tensor_of(d, out, &shape);
		struct tfab_stats s0, s1;
		atomic_int order = 0;
		struct job j = {1, -1, &order};
		double tol = 2.0 * n * zs[z].eps * maxabs, err, ratio, err1 = 0, errk;

		tfab_get_stats(ctx, &s0);
		if (tfab_allreduce(w, &ti, &to, TFAB_OP_SUM, &o, on_done, &j) ||
		    wait_all(w, "compressed allreduce") || j.status) {
			printf("rank %d: allreduce compressed %s: %s\n", rank, zs[z].name,
			       tfab_strerror(j.status));
			return 1;
		}
		tfab_get_stats(ctx, &s1);
		err = max_err(out, sum, count);
		ratio = (double)(s1.coll_bytes_wire - s0.coll_bytes_wire) /
			(double)(s1.coll_bytes_logical - s0.coll_bytes_logical);
		if (err > tol || ratio > zs[z].ratio || s1.coll_bytes_wire == s0.coll_bytes_wire) {
			printf(
			    "rank %d: allreduce compressed %s: error %g (bound %g), wire/logical "
			    "%.3f (at most %.2f)\n",
			    rank, zs[z].name, err, tol, ratio, zs[z].ratio);
			bad = 1;
		}
		/* every rank the same bits */
		if (rank == 0)
			memcpy(z_result, out, count * 4);
		pthread_barrier_wait(&z_barrier);
		if (memcmp(z_result, out, count * 4) != 0) {
			printf("rank %d: allreduce compressed %s: not rank 0's bits\n", rank,
			       zs[z].name);
			bad = 1;
		}
		pthread_barrier_wait(&z_barrier);
		/* error feedback: the mean of STEPS allreduces under one key */
		o.key = zs[z].name;
		for (size_t i = 0; i < count; i++)
			mean[i] = 0;
		for (int k = 0; k < STEPS; k++) {
			j.status = 1;
			if (tfab_allreduce(w, &ti, &to, TFAB_OP_SUM, &o, on_done, &j) ||
			    wait_all(w, "compressed allreduce") || j.status)
				return 1;
			if (k == 0)
				err1 = max_err(out, sum, count);
			for (size_t i = 0; i < count; i++)
				mean[i] += out[i] / (double)STEPS;
		}
		errk = 0;
		for (size_t i = 0; i < count; i++)
			errk = fabs(mean[i] - sum[i]) > errk ? fabs(mean[i] - sum[i]) : errk;
		if (errk > err1 / 4) {
			printf("rank %d: allreduce compressed %s with error feedback: the mean of "
			       "%d is "
			       "%g off, one alone %g\n",
			       rank, zs[z].name, STEPS, errk, err1);
			bad = 1;
		}
		if (rank == 0)
			printf(
			    "compressed %s: error %.3g (bound %.3g), wire/logical %.3f; with error "
			    "feedback, mean of %d off by %.3g (one: %.3g)\n",
			    zs[z].name, err, tol, ratio, STEPS, errk, err1);
	}
	free(in);
	free(out);
	free(sum);
	free(mean);
	return bad;
}

static int thread_body(struct tfab_context *ctx, struct tfab_world *w, void *arg)
{
	int bad = 0, rank = tfab_world_rank(w);

	(void)arg;
	for (size_t i = 0; i < NDTYPES; i++)
		bad |= allreduce_dtype(w, &DTYPES[i]);
	if (rank == 0)
		printf("allreduce: %s\n", bad ? "FAILED" : "ok");
	if (getenv("TEST_COLL_ONLY_COMPRESSED"))
		return compressed(ctx, w);
	bad |= out_of_order(w);
	bad |= many_small(ctx, w);
	bad |= broadcast(w);
	bad |= allgather(w);
	bad |= reduce_scatter(w);
	bad |= reduce_root(w);
	bad |= gather_scatter(w);
	bad |= alltoallv(w);
	bad |= barrier(ctx, w);
	bad |= compressed(ctx, w);
	bad |= refused(w);
	if (rank == 0)
		printf("rank 0: %s\n", bad ? "FAILED" : "every collective right");
	return bad;
}

/*
 * "Device" memory for the GPU case: cudaMalloc'd on a GPU, or host memory standing in for it
 * under TFAB_CUDA_EMULATE=1 (the engine then takes it as such).
 */
static bool gpu_emulated;

static void *dev_alloc(size_t n)
{
	void *p = NULL;

	if (gpu_emulated)
		return calloc(n ? n : 1, 1);
#ifdef TFAB_HAVE_CUDA
	if (cudaMalloc(&p, n ? n : 1) != cudaSuccess || cudaMemset(p, 0, n ? n : 1) != cudaSuccess)
		return NULL;
#endif
	return p;
}

static void dev_copy(void *dst, const void *src, size_t n, bool to_dev)
{
	if (gpu_emulated) {
		memcpy(dst, src, n);
		return;
	}
#ifdef TFAB_HAVE_CUDA
	if (cudaMemcpy(dst, src, n, to_dev ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost) !=
	    cudaSuccess)
		memset(to_dev ? (void *)src : dst, 0xee, n); /* the check fails, not the test */
#else
	(void)to_dev;
#endif
}

static void dev_free(void *p)
{
	if (gpu_emulated)
		free(p);
#ifdef TFAB_HAVE_CUDA
	else
		cudaFree(p);
#endif
}

static DLTensor gpu_tensor_of(const struct dtype *d, void *data, int64_t *shape)
{
	DLTensor t = tensor_of(d, data, shape);

	t.device = (DLDevice){kDLCUDA, 0};
	return t;
}

/* Start a collective (a call of one of them) and wait for it: its status, or 1 (said). */
#define RUN(w, what, call, j) ((call) || wait_all(w, what) ? 1 : (j).status)

/*
 * GPU tensors (kDLCUDA) in every collective, through host proxies (coll_gpu.c): int32
 * allreduce on both algorithms, in place and not, a broadcast, an allgather, a
 * reduce-scatter, a reduce (no out off the root) and an all-to-all, each result copied back
 * and checked; the proxies' copies are counted in bytes_copied.
 */
static int gpu_body(struct tfab_context *ctx, struct tfab_world *w, void *arg)
{
	static const size_t counts[] = {5, 70001}; /* direct (eager), ring in pieces */
	const struct dtype *d = &DTYPES[4];	   /* int32: exact in any order */
	int rank = tfab_world_rank(w), n = tfab_world_size(w), bad = 0, st;
	struct tfab_stats s0, s1;
	atomic_int order = 0;

	(void)arg;
	tfab_get_stats(ctx, &s0);
	for (size_t ci = 0; ci < 2; ci++) {
		for (int in_place = 0; in_place < 2; in_place++) {
			size_t m = counts[ci];
			int64_t shape = (int64_t)m;
			int32_t *h = malloc(m * 4), *want = malloc(m * 4);
			void *din = dev_alloc(m * 4), *dout = in_place ? din : dev_alloc(m * 4);
			DLTensor tin = gpu_tensor_of(d, din, &shape),
				 tout = gpu_tensor_of(d, dout, &shape);
			struct job j = {1, -1, &order};
			char what[64];

			if (!h || !want || !din || !dout)
				return 1;
			fill(d, h, rank, 0, m);
			dev_copy(din, h, m * 4, true);
			for (size_t i = 0; i < m; i++)
				reduce_one(d, TFAB_OP_SUM, n, 0, i, want, i);
			snprintf(what, sizeof(what), "GPU allreduce of %zu%s", m,
				 in_place ? " in place" : "");
			st = RUN(w, what,
				 tfab_allreduce(w, &tin, &tout, TFAB_OP_SUM, NULL, on_done, &j), j);
			if (st) {
				printf("rank %d: %s: %s\n", rank, what, tfab_strerror(st));
				bad = 1;
			} else {
				dev_copy(h, dout, m * 4, false);
				bad |= compare(rank, what, h, want, m, 4);
			}
			if (!in_place)
				dev_free(dout);
			dev_free(din);
			free(h);
			free(want);
		}
	}
	{ /* broadcast of 300,001 bytes from the last rank */
		const struct dtype u8 = {"uint8", K_INT, {kDLUInt, 8, 1}, 1};
		size_t nb = 300001;
		int64_t shape = (int64_t)nb;
		uint8_t *h = malloc(nb), *db = dev_alloc(nb);
		DLTensor t = gpu_tensor_of(&u8, db, &shape);
		struct job j = {1, -1, &order};
		int root = n - 1;

		if (!h || !db)
			return 1;
		for (size_t i = 0; i < nb; i++)
			h[i] = byte_of(root, i);
		if (rank == root)
			dev_copy(db, h, nb, true);
		st = RUN(w, "GPU broadcast", tfab_broadcast(w, &t, root, on_done, &j), j);
		if (st) {
			printf("rank %d: GPU broadcast: %s\n", rank, tfab_strerror(st));
			bad = 1;
		} else {
			uint8_t *got = malloc(nb);

			dev_copy(got, db, nb, false);
			bad |= compare(rank, "GPU broadcast", got, h, nb, 1);
			free(got);
		}
		dev_free(db);
		free(h);
	}
	{ /* allgather of 1,000 and reduce-scatter of 777 a rank */
		size_t m = 1000, p = 777;
		int64_t sm = (int64_t)m, sall = (int64_t)m * n, sp = (int64_t)p,
			spall = (int64_t)p * n;
		int32_t *h = malloc(m * (size_t)n * 4), *want = malloc(m * (size_t)n * 4);
		void *din = dev_alloc(m * 4), *dout = dev_alloc(m * (size_t)n * 4);
		void *rin = dev_alloc(p * (size_t)n * 4), *rout = dev_alloc(p * 4);
		DLTensor ti = gpu_tensor_of(d, din, &sm), to = gpu_tensor_of(d, dout, &sall);
		DLTensor ri = gpu_tensor_of(d, rin, &spall), ro = gpu_tensor_of(d, rout, &sp);
		struct job j = {1, -1, &order}, k = {1, -1, &order};

		if (!h || !want || !din || !dout || !rin || !rout)
			return 1;
		fill(d, h, rank, 0, m);
		dev_copy(din, h, m * 4, true);
		for (int r = 0; r < n; r++)
			fill(d, want + m * (size_t)r, r, 0, m);
		st = RUN(w, "GPU allgather", tfab_allgather(w, &ti, &to, on_done, &j), j);
		if (st) {
			printf("rank %d: GPU allgather: %s\n", rank, tfab_strerror(st));
			bad = 1;
		} else {
			dev_copy(h, dout, m * (size_t)n * 4, false);
			bad |= compare(rank, "GPU allgather", h, want, m * (size_t)n, 4);
		}
		fill(d, h, rank, 0, p * (size_t)n);
		dev_copy(rin, h, p * (size_t)n * 4, true);
		for (size_t i = 0; i < p; i++) /* part c folds from rank c + 1 around to rank c */
			reduce_one(d, TFAB_OP_SUM, n, (rank + 1) % n, p * (size_t)rank + i, want,
				   i);
		st = RUN(w, "GPU reduce_scatter",
			 tfab_reduce_scatter(w, &ri, &ro, TFAB_OP_SUM, on_done, &k), k);
		if (st) {
			printf("rank %d: GPU reduce_scatter: %s\n", rank, tfab_strerror(st));
			bad = 1;
		} else {
			dev_copy(h, rout, p * 4, false);
			bad |= compare(rank, "GPU reduce_scatter", h, want, p, 4);
		}
		dev_free(din);
		dev_free(dout);
		dev_free(rin);
		dev_free(rout);
		free(h);
		free(want);
	}
	{ /* reduce of 777 to the last rank (out NULL elsewhere), and an all-to-all of 3 each */
		size_t m = 777, e = 3;
		int64_t sm = (int64_t)m, se = (int64_t)e * n;
		int32_t *h = malloc(m * 4), *want = malloc(m * 4);
		void *din = dev_alloc(m * 4), *dout = dev_alloc(m * 4);
		void *ain = dev_alloc(e * (size_t)n * 4), *aout = dev_alloc(e * (size_t)n * 4);
		DLTensor ti = gpu_tensor_of(d, din, &sm), to = gpu_tensor_of(d, dout, &sm);
		DLTensor ai = gpu_tensor_of(d, ain, &se), ao = gpu_tensor_of(d, aout, &se);
		struct job j = {1, -1, &order}, k = {1, -1, &order};
		int root = n - 1;

		if (!h || !want || !din || !dout || !ain || !aout)
			return 1;
		fill(d, h, rank, 0, m);
		dev_copy(din, h, m * 4, true);
		for (size_t i = 0; i < m; i++)
			reduce_one(d, TFAB_OP_SUM, n, 0, i, want, i);
		st = RUN(
		    w, "GPU reduce",
		    tfab_reduce(w, &ti, rank == root ? &to : NULL, TFAB_OP_SUM, root, on_done, &j),
		    j);
		if (st) {
			printf("rank %d: GPU reduce: %s\n", rank, tfab_strerror(st));
			bad = 1;
		} else if (rank == root) {
			dev_copy(h, dout, m * 4, false);
			bad |= compare(rank, "GPU reduce", h, want, m, 4);
		}
		for (int r = 0; r < n; r++)
			fill(d, h + e * (size_t)r, rank * 1000 + r, 0, e);
		dev_copy(ain, h, e * (size_t)n * 4, true);
		for (int r = 0; r < n; r++)
			fill(d, want + e * (size_t)r, r * 1000 + rank, 0, e);
		st = RUN(w, "GPU alltoallv", tfab_alltoallv(w, &ai, NULL, &ao, NULL, on_done, &k),
			 k);
		if (st) {
			printf("rank %d: GPU alltoallv: %s\n", rank, tfab_strerror(st));
			bad = 1;
		} else {
			dev_copy(h, aout, e * (size_t)n * 4, false);
			bad |= compare(rank, "GPU alltoallv", h, want, e * (size_t)n, 4);
		}
		dev_free(din);
		dev_free(dout);
		dev_free(ain);
		dev_free(aout);
		free(h);
		free(want);
	}
	tfab_get_stats(ctx, &s1);
	if (s1.bytes_copied == s0.bytes_copied) {
		printf("rank %d: GPU collectives copied nothing through proxies\n", rank);
		bad = 1;
	}
	if (rank == 0)
		printf("rank 0: GPU collectives %s\n", bad ? "FAILED" : "right");
	return bad;
}

/* TFAB_OP_TIMEOUT_MS for the deadline cases, which need a short one; -1 (said) otherwise. */
static long short_deadline_ms(const char *what)
{
	const char *limit = getenv("TFAB_OP_TIMEOUT_MS");
	long ms = limit ? atol(limit) : 0;

	if (ms <= 0 || ms > 5000) {
		printf("%s: needs a TFAB_OP_TIMEOUT_MS of at most 5 s\n", what);
		return -1;
	}
	return ms;
}

/*
 * The deadline cases' allreduce: the sum of two floats, this rank's pattern in v. Its status,
 * or INT_MIN (said) where it could not be posted or waited for.
 */
static int sum2(struct tfab_world *w, float v[2], const char *what)
{
	int64_t count = 2;
	DLTensor t = tensor_of(&DTYPES[0], v, &count);
	atomic_int order = 0;
	struct job j = {1, -1, &order};

	fill(&DTYPES[0], v, tfab_world_rank(w), 0, 2);
	if (tfab_allreduce(w, &t, &t, TFAB_OP_SUM, NULL, on_done, &j) || wait_all(w, what))
		return INT_MIN;
	return j.status;
}

static const char *sum2_status(int status)
{
	return status == INT_MIN ? "not posted or not waited for" : ranks_status_name(status);
}

/* A sum2 that had to end well (status): 0, or 1 said. */
static int sum2_ok(struct tfab_world *w, int status, const float v[2], const char *what, int round)
{
	float want[2];

	if (status) {
		printf("rank %d: %s round %d: %s\n", tfab_world_rank(w), what, round,
		       sum2_status(status));
		return 1;
	}
	allreduce_reference(&DTYPES[0], TFAB_OP_SUM, TFAB_ALGO_DIRECT, tfab_world_size(w), 2, want);
	return compare(tfab_world_rank(w), what, v, want, 2, 4);
}

/*
 * A straggler (run with a short TFAB_OP_TIMEOUT_MS): rank 0 allreduces 8 bytes alone while
 * the others, alive, hold back for three deadlines. Its receives fail by the stall deadline
 * (TFAB_ERR_TIMEOUT). Then the others run that allreduce:
 * - eager operands (the default): rank 0's went out, so they get the right sum;
 * - tensors (TFAB_COLL_EAGER=0): rank 0's sends waited for requests a deadline too (nobody
 *   asked), and their sends to rank 0 wait for receives that gave up; every one of those
 *   waits is bounded, so they fail with TFAB_ERR_TIMEOUT within two deadlines, not hang.
 * A second allreduce, which rank 0 starts once the others have ended the first, ends well
 * everywhere (what came late for rank 0's failed one was dropped).
 */
static atomic_int straggler_failed, straggler_late_done;

static int straggler(struct tfab_context *ctx, struct tfab_world *w, void *arg)
{
	int rank = tfab_world_rank(w), n = tfab_world_size(w), bad = 0, status;
	const char *eager = getenv("TFAB_COLL_EAGER");
	long deadline_ms = short_deadline_ms("straggler");
	bool tensors = eager && atol(eager) == 0;
	float v[2];

	(void)ctx;
	(void)arg;
	if (deadline_ms < 0)
		return 1;
	for (int round = 0; round < 2; round++) {
		uint64_t t0;

		if (round == 0 && rank != 0) {
			/* until rank 0's has failed, and no longer than three deadlines */
			for (t0 = now_ms(); !atomic_load(&straggler_failed) &&
					    now_ms() - t0 < 3 * (uint64_t)deadline_ms;)
				usleep(1000);
		}
		if (round == 1 && rank == 0) {
			/* until the others have ended the first, and no longer than four deadlines */
			for (t0 = now_ms(); atomic_load(&straggler_late_done) < n - 1 &&
					    now_ms() - t0 < 4 * (uint64_t)deadline_ms;)
				usleep(1000);
		}
		t0 = now_ms();
		status = sum2(w, v, "straggler");
		if (round == 0 && rank == 0) {
			atomic_store(&straggler_failed, 1);
			if (status != -TFAB_ERR_TIMEOUT) {
				printf("rank 0: alone, the allreduce ended with %s, not "
				       "TFAB_ERR_TIMEOUT\n",
				       sum2_status(status));
				bad = 1;
			}
			/* the library reads the coarse clock, a tick behind this one */
			if (now_ms() - t0 + 10 < (uint64_t)deadline_ms) {
				printf("rank 0: alone, it failed before the deadline\n");
				bad = 1;
			}
			continue;
		}
		if (round == 0)
			atomic_fetch_add(&straggler_late_done, 1);
		if (round == 0 && tensors) {
			if (status != -TFAB_ERR_TIMEOUT ||
			    now_ms() - t0 > 2 * (uint64_t)deadline_ms + 500) {
				printf("rank %d: straggler round 0 on tensors: %s after %" PRIu64
				       " ms, not TFAB_ERR_TIMEOUT within two deadlines\n",
				       rank, sum2_status(status), now_ms() - t0);
				bad = 1;
			}
			continue;
		}
		bad |= sum2_ok(w, status, v, "straggler", round);
	}
	if (rank == 0)
		printf("rank 0: straggler %s\n", bad ? "FAILED" : "ok");
	return bad;
}

/*
 * Late, but within the deadline (run with a short TFAB_OP_TIMEOUT_MS, on tensors): in each of
 * two allreduces rank 0 starts alone and the others half a deadline later. Rank 0's sends
 * wait that long for their requests, under the bound (the deadline, no less): every rank's
 * allreduce ends well, with the right sum.
 */
static int late(struct tfab_context *ctx, struct tfab_world *w, void *arg)
{
	long deadline_ms = short_deadline_ms("late");
	int bad = 0;
	float v[2];

	(void)ctx;
	(void)arg;
	if (deadline_ms < 0)
		return 1;
	for (int round = 0; round < 2 && !bad; round++) {
		if (tfab_world_rank(w) != 0)
			usleep((useconds_t)deadline_ms * 500);
		bad |= sum2_ok(w, sum2(w, v, "late"), v, "late", round);
	}
	return bad;
}

/*
 * A rank gone while another is alive and late (3 ranks; run with a long TFAB_OP_TIMEOUT_MS):
 * rank 2 leaves at once, rank 1 starts its 8-byte allreduce only after two seconds. Rank 0's
 * fails with TFAB_ERR_PEER_FAILED as soon as the engine has seen rank 2 go, before rank 1
 * starts: not when rank 1 comes, nor by the deadline. Then rank 1's fails too.
 */
static atomic_int gone_late_started;

static int gone(struct tfab_context *ctx, struct tfab_world *w, void *arg)
{
	int rank = tfab_world_rank(w), status;
	float v[2];

	(void)ctx;
	(void)arg;
	if (rank == 2)
		return 0; /* leaves the world, and its context goes */
	if (rank == 1) {
		usleep(2000000);
		atomic_store(&gone_late_started, 1);
	}
	status = sum2(w, v, "gone");
	if (status != -TFAB_ERR_PEER_FAILED) {
		printf("rank %d: with rank 2 gone, the allreduce ended with %s, not "
		       "TFAB_ERR_PEER_FAILED\n",
		       rank, sum2_status(status));
		return 1;
	}
	if (rank == 0 && atomic_load(&gone_late_started)) {
		printf("rank 0: its allreduce failed only once rank 1 had started: rank 2's "
		       "leaving was not enough\n");
		return 1;
	}
	if (rank == 0)
		printf("rank 0: gone ok\n");
	return 0;
}

/*
 * One rank of a world from the environment: allreduce after allreduce, checked: of 4 MiB
 * around the ring, or with TEST_COLL_COUNT of that many floats by the algorithm the size
 * picks (a few: direct, their operands eager), or with TEST_COLL_RING too around the ring.
 */
static int run_env(long iters)
{
	const struct dtype *d = &DTYPES[0];
	const char *count_env = getenv("TEST_COLL_COUNT");
	int64_t count = count_env ? atoll(count_env) : 1 << 20;
	bool ring = !count_env || getenv("TEST_COLL_RING");
	struct tfab_context *ctx;
	struct tfab_world *w;
	float *in = malloc((size_t)count * 4), *out = malloc((size_t)count * 4);
	float *want = malloc((size_t)count * 4);
	int rc = tfab_context_create(&ctx);

	if (rc) {
		printf("context: %s\n", tfab_strerror(rc));
		return 1;
	}
	rc = tfab_world_join(ctx, NULL, &w);
	if (rc) {
		printf("JOIN_FAILED status=%s\n", ranks_status_name(rc));
		tfab_context_destroy(ctx);
		return 3;
	}
	printf("JOINED rank=%d size=%d\n", tfab_world_rank(w), tfab_world_size(w));
	for (int r = 0; r < tfab_world_size(w); r++) {
		if (r != tfab_world_rank(w))
			printf("PATH %d-%d=%s\n", tfab_world_rank(w), r,
			       tfab_peer_path(tfab_world_peer(w, r)));
	}
	fill(d, in, tfab_world_rank(w), 0, (size_t)count);
	allreduce_reference(d, TFAB_OP_SUM, ring ? TFAB_ALGO_RING : TFAB_ALGO_DIRECT,
			    tfab_world_size(w), (size_t)count, want);
	for (long it = 0; iters < 0 || it < iters; it++) {
		DLTensor ti = tensor_of(d, in, &count), to = tensor_of(d, out, &count);
		struct tfab_coll_opts o = {.algo = ring ? TFAB_ALGO_RING : TFAB_ALGO_AUTO};
		atomic_int order = 0;
		struct job j = {1, -1, &order};

		memset(out, 0, (size_t)count * 4);
		rc = tfab_allreduce(w, &ti, &to, TFAB_OP_SUM, &o, on_done, &j);
		if (rc == 0)
			rc = tfab_world_wait(w, -1);
		if (rc == 0)
			rc = j.status;
		if (rc) {
			printf("COLL_FAILED status=%s at_ms=%" PRIu64 "\n", ranks_status_name(rc),
			       now_ms());
			/*
			 * Staying a while, and going on with the collectives (each fails): the
			 * others, at this one or the next, must learn of the failure from this
			 * rank's draining collectives, not from its end.
			 */
			if (getenv("TEST_COLL_LINGER_MS")) {
				uint64_t until =
				    now_ms() + (uint64_t)atol(getenv("TEST_COLL_LINGER_MS"));

				while (now_ms() < until) {
					j = (struct job){1, -1, &order};
					if (tfab_allreduce(w, &ti, &to, TFAB_OP_SUM, &o, on_done,
							   &j) ||
					    tfab_world_wait(w, 1000))
						usleep(1000);
				}
			}
			rc = 4;
			break;
		}
		if (compare(tfab_world_rank(w), "allreduce", out, want, (size_t)count, 4)) {
			rc = 1;
			break;
		}
		if (it < 10 || it % 1000 == 0)
			printf("ITER %ld\n", it);
	}
	if (tfab_world_leave(w))
		rc = 1;
	tfab_context_destroy(ctx);
	free(in);
	free(out);
	free(want);
	if (rc == 0)
		printf("OK\n");
	return rc;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if ((argc == 3 || argc == 4) && strcmp(argv[1], "threads") == 0) {
		int rc;

		if (argc == 4)
			a2a_skews = atoi(argv[3]) > 0 ? atoi(argv[3]) : 1;
		z_result = malloc(70001 * 4);
		pthread_barrier_init(&z_barrier, NULL, (unsigned)atoi(argv[2]));
		rc = ranks_run_threads(atoi(argv[2]), WAIT_MS, thread_body, NULL);
		pthread_barrier_destroy(&z_barrier);
		free(z_result);

		if (rc == 0)
			printf("OK\n");
		return rc;
	}
	if (argc == 3 && (strcmp(argv[1], "straggler") == 0 || strcmp(argv[1], "late") == 0 ||
			  strcmp(argv[1], "gone") == 0)) {
		int rc = ranks_run_threads(atoi(argv[2]), WAIT_MS,
					   argv[1][0] == 's'   ? straggler
					   : argv[1][0] == 'l' ? late
							       : gone,
					   NULL);

		if (rc == 0)
			printf("OK\n");
		return rc;
	}
	if (argc == 3 && strcmp(argv[1], "gpu") == 0) {
		const char *emu = getenv("TFAB_CUDA_EMULATE"), *why = "";
		int rc, gpus;

		gpu_emulated = emu && strcmp(emu, "1") == 0;
		gpus = gpu_emulated ? 1 : gpu_count(&why);
		if (gpus < 0) {
			printf("FAIL: CUDA is here but unusable: cudaGetDeviceCount: %s\n", why);
			return 1;
		}
		if (gpus == 0) {
			printf("SKIP: %s (TFAB_CUDA_EMULATE=1 runs the proxies on host memory)\n",
			       why);
			return 77;
		}
		rc = ranks_run_threads(atoi(argv[2]), WAIT_MS, gpu_body, NULL);
		if (rc == 0)
			printf("OK\n");
		return rc;
	}
	if (argc >= 2 && strcmp(argv[1], "env") == 0)
		return run_env(argc == 3 ? atol(argv[2]) : -1);
	fprintf(
	    stderr,
	    "usage: %s threads N [SKEWS] | straggler N | late N | gone 3 | gpu N | env [ITERS]\n",
	    argv[0]);
	return 2;
}
