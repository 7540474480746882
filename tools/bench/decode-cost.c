/*
 * decode-cost: what a lying TensorProto of at most 100 bytes costs the process that decodes it.
 * A few bytes can claim a tensor of any size whose values repeat (TensorFlow fills with the
 * last value given, or zeros), so each case claims a shape that takes CLAIM MiB decoded, and
 * is decoded by tfab_tensorproto_decode (the default bound) in a child process of its own:
 * getrusage around the decode gives the peak resident memory it added (ru_maxrss) and the
 * CPU time it took (user + system, and system alone), and the CPU time of freeing what it made.
 * Each case runs RUNS times (3) in turn with the others; a line gives the median and the
 * largest of each figure. The first large allocation after a pause can cost several times
 * the others on a VM (the host backs the memory again): the largest shows it.
 *
 * usage: decode-cost [-r RUNS] [CLAIM_MIB...]   (default: 255 2047)
 * Prints one line per case and claim.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tfab/log.h>
#include <tfab/status.h>
#include <tfab/tensorproto.h>

#define MAX_INPUT 100

struct msg {
	uint8_t b[MAX_INPUT];
	size_t len;
};

static void put_byte(struct msg *m, uint8_t v)
{
	if (m->len == MAX_INPUT) {
		fprintf(stderr, "decode-cost: a case is longer than %d bytes\n", MAX_INPUT);
		exit(1);
	}
	m->b[m->len++] = v;
}

static void put_varint(struct msg *m, uint64_t v)
{
	do {
		put_byte(m, (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0)));
		v >>= 7;
	} while (v);
}

static size_t varint_len(uint64_t v)
{
	size_t n = 1;

	while (v > 0x7f) {
		v >>= 7;
		n++;
	}
	return n;
}

/* dtype (field 1), then tensor_shape (field 2) with one dimension of n elements. */
static void put_head(struct msg *m, unsigned dtype, uint64_t n)
{
	size_t dim = 1 + varint_len(n); /* Dim: size (field 1) */

	put_byte(m, 0x08);
	put_varint(m, dtype);
	put_byte(m, 0x12);
	put_varint(m, 2 + dim);
	put_byte(m, 0x12); /* TensorShapeProto: dim (field 2) */
	put_varint(m, dim);
	put_byte(m, 0x08);
	put_varint(m, n);
}

static void put_bytes(struct msg *m, unsigned field, const void *p, size_t len)
{
	put_byte(m, (uint8_t)(field << 3 | 2));
	put_varint(m, len);
	for (size_t i = 0; i < len; i++)
		put_byte(m, ((const uint8_t *)p)[i]);
}

enum { DT_FLOAT = 1, DT_INT8 = 6, DT_STRING = 7, DT_BOOL = 10, DT_COMPLEX128 = 18 };

struct kase {
	const char *name;
	unsigned elem; /* bytes an element takes decoded */
	void (*build)(struct msg *m, uint64_t n);
};

static void strings_empty(struct msg *m, uint64_t n)
{
	put_head(m, DT_STRING, n);
}

static void strings_repeat(struct msg *m, uint64_t n)
{
	put_head(m, DT_STRING, n);
	put_bytes(m, 8, "a string that every element repeats....", 40);
}

static void bool_fill(struct msg *m, uint64_t n)
{
	put_head(m, DT_BOOL, n);
	put_byte(m, 0x58); /* bool_val (field 11): true */
	put_byte(m, 1);
}

static void float_fill(struct msg *m, uint64_t n)
{
	float f = 1.5f;

	put_head(m, DT_FLOAT, n);
	put_bytes(m, 5, &f, sizeof(f)); /* float_val, packed */
}

static void complex_fill(struct msg *m, uint64_t n)
{
	double d[2] = {1.5, -2};

	put_head(m, DT_COMPLEX128, n);
	put_bytes(m, 12, d, sizeof(d)); /* dcomplex_val, packed: one pair */
}

static void int8_zeros(struct msg *m, uint64_t n)
{
	put_head(m, DT_INT8, n);
}

static const struct kase cases[] = {
    {"strings-empty", 16, strings_empty},  {"strings-repeat", 16, strings_repeat},
    {"bool-fill", 1, bool_fill},	   {"float-fill", 4, float_fill},
    {"complex128-fill", 16, complex_fill}, {"int8-zeros", 1, int8_zeros},
};

static double tv_ms(const struct timeval *a, const struct timeval *b)
{
	return (double)(b->tv_sec - a->tv_sec) * 1e3 + (double)(b->tv_usec - a->tv_usec) / 1e3;
}

static double cpu_ms(const struct rusage *a, const struct rusage *b)
{
	return tv_ms(&a->ru_utime, &b->ru_utime) + tv_ms(&a->ru_stime, &b->ru_stime);
}

/* One decode's figures. */
struct cost {
	int rc;
	double peak_mib, cpu, sys, free_cpu;
};

/* In a child of its own, so that its peak is its own; the figures come back through a pipe. */
static int run(const struct kase *k, uint64_t claim_mib, struct cost *c)
{
	uint64_t n = (claim_mib << 20) / k->elem;
	struct msg m = {.len = 0};
	struct rusage r0, r1, r2;
	struct tfab_string_tensor *s = NULL;
	DLManagedTensor *t = NULL;
	int fd[2], status;
	pid_t pid;

	k->build(&m, n);
	if (pipe(fd))
		return -errno;
	fflush(stdout);
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid > 0) {
		ssize_t got;

		close(fd[1]);
		got = read(fd[0], c, sizeof(*c));
		close(fd[0]);
		if (waitpid(pid, &status, 0) != pid || got != (ssize_t)sizeof(*c))
			return -EIO;
		return 0;
	}
	close(fd[0]);
	getrusage(RUSAGE_SELF, &r0);
	c->rc = tfab_tensorproto_decode(m.b, m.len, &t, &s);
	getrusage(RUSAGE_SELF, &r1);
	tfab_string_tensor_free(s);
	if (t)
		t->deleter(t);
	getrusage(RUSAGE_SELF, &r2);
	c->peak_mib = (double)(r1.ru_maxrss - r0.ru_maxrss) / 1024;
	c->cpu = cpu_ms(&r0, &r1);
	c->sys = tv_ms(&r0.ru_stime, &r1.ru_stime);
	c->free_cpu = cpu_ms(&r1, &r2);
	_exit(write(fd[1], c, sizeof(*c)) == (ssize_t)sizeof(*c) ? 0 : 1);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* The median and the largest of n figures, field by field (their order is lost). */
static void stats(double *v, int n, double *med_p, double *max_p)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	*med_p = v[n / 2];
	*max_p = v[n - 1];
}

#define MAX_RUNS 99
#define NCASES (sizeof(cases) / sizeof(cases[0]))

int main(int argc, char **argv)
{
	static const char *const dflt[] = {"255", "2047"};
	static struct cost costs[NCASES][MAX_RUNS];
	const char *const *claims = dflt;
	int nclaims = 2, runs = 3, a = 1;

	if (argc > 2 && strcmp(argv[1], "-r") == 0) {
		runs = atoi(argv[2]);
		a = 3;
	}
	if (runs < 1 || runs > MAX_RUNS) {
		fprintf(stderr, "decode-cost: RUNS: 1 to %d\n", MAX_RUNS);
		return 2;
	}
	if (argc > a) {
		claims = (const char *const *)argv + a;
		nclaims = argc - a;
	}
	tfab_log_set_level(TFAB_LOG_NONE);
	printf("%d runs of each case; median (largest)\n", runs);
	for (int c = 0; c < nclaims; c++) {
		char *end;
		unsigned long long mib;

		errno = 0;
		mib = strtoull(claims[c], &end, 0);
		if (errno || *end || mib == 0 || mib > (1ull << 40)) {
			fprintf(stderr, "decode-cost: CLAIM_MIB: a number of MiB, not %s\n",
				claims[c]);
			return 2;
		}
		for (int r = 0; r < runs; r++)
			for (size_t i = 0; i < NCASES; i++)
				if (run(&cases[i], mib, &costs[i][r])) {
					fprintf(stderr, "decode-cost: %s: the child failed\n",
						cases[i].name);
					return 1;
				}
		for (size_t i = 0; i < NCASES; i++) {
			double v[4][MAX_RUNS], med[4], max[4];
			struct msg m = {.len = 0};

			cases[i].build(&m, (mib << 20) / cases[i].elem);
			for (int r = 0; r < runs; r++) {
				v[0][r] = costs[i][r].peak_mib;
				v[1][r] = costs[i][r].cpu;
				v[2][r] = costs[i][r].sys;
				v[3][r] = costs[i][r].free_cpu;
			}
			for (int f = 0; f < 4; f++)
				stats(v[f], runs, &med[f], &max[f]);
			printf(
			    "%-15s claim %4llu MiB  input %2zu B  %-17s peak +%6.1f MiB (%6.1f)  "
			    "cpu %6.1f ms (%6.1f), sys %6.1f (%6.1f)  free %5.1f ms (%5.1f)\n",
			    cases[i].name, mib, m.len,
			    costs[i][0].rc ? tfab_strerror(costs[i][0].rc) : "decoded", med[0],
			    max[0], med[1], max[1], med[2], max[2], med[3], max[3]);
		}
	}
	return 0;
}
