/*
 * The reference of tfab-perf allreduce: Open MPI's MPI_Allreduce of float32 (sum) on the
 * same sizes, timed and reported the same way (the slowest rank's mean time of one
 * allreduce, each finished before the next starts, after a tenth as many to warm up and a
 * barrier; algbw = bytes / time, busbw = algbw x 2(N-1)/N), one JSON object per size with
 * the fields tfab-perf allreduce --json prints.
 *
 *   mpirun --allow-run-as-root --oversubscribe -np 4 mpi-allreduce [-s 8,64M] [-n ITERS]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const size_t DEFAULT_SIZES[] = {8, 64, 512, 4096, 32768, 262144, 1 << 20, 8 << 20, 64 << 20};

static size_t parse_size(const char *s)
{
	char *end;
	size_t v = strtoull(s, &end, 10);

	if (*end == 'K' || *end == 'k')
		v <<= 10;
	else if (*end == 'M' || *end == 'm')
		v <<= 20;
	return v;
}

/* As tfab-perf chooses them: about 2 GiB a size, 32 to 20,000. */
static unsigned iters_of(size_t size)
{
	size_t n = (2ull << 30) / (size ? size : 1);

	return (unsigned)(n < 32 ? 32 : n > 20000 ? 20000 : n);
}

int main(int argc, char **argv)
{
	size_t sizes[32], nsizes = 0, max = 4;
	unsigned iters = 0;
	int rank, n;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "-s") == 0 && i + 1 < argc) {
			char *list = argv[++i], *save = NULL;

			for (char *t = strtok_r(list, ",", &save); t && nsizes < 32;
			     t = strtok_r(NULL, ",", &save))
				sizes[nsizes++] = parse_size(t);
		} else if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
			iters = (unsigned)atoi(argv[++i]);
		} else {
			fprintf(stderr, "usage: mpi-allreduce [-s SIZES] [-n ITERS]\n");
			return 2;
		}
	}
	if (!nsizes) {
		nsizes = sizeof(DEFAULT_SIZES) / sizeof(DEFAULT_SIZES[0]);
		memcpy(sizes, DEFAULT_SIZES, sizeof(DEFAULT_SIZES));
	}
	for (size_t i = 0; i < nsizes; i++)
		max = sizes[i] > max ? sizes[i] : max;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	float *in = malloc(max), *out = malloc(max);

	for (size_t i = 0; i < max / 4; i++)
		in[i] = 1.0f;
	for (size_t k = 0; k < nsizes; k++) {
		int count = (int)(sizes[k] / 4 ? sizes[k] / 4 : 1);
		unsigned it = iters ? iters : iters_of((size_t)count * 4);
		unsigned warm = it / 10 ? it / 10 : 1;
		double t0, mine, slowest;

		for (unsigned i = 0; i < warm; i++)
			MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		MPI_Barrier(MPI_COMM_WORLD);
		t0 = MPI_Wtime();
		for (unsigned i = 0; i < it; i++)
			MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		mine = (MPI_Wtime() - t0) * 1e6 / it;
		MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
		if (out[0] != (float)n)
			fprintf(stderr, "mpi-allreduce: rank %d: %g, not %d\n", rank,
				(double)out[0], n);
		if (rank == 0) {
			double algbw = (double)count * 4 / slowest / 1e3;

			printf("{\"test\":\"mpi_allreduce\",\"path\":\"mpi\",\"algo\":\"mpi\","
			       "\"bytes\":%d,\"ranks\":%d,\"iters\":%u,\"lat_us\":%.3f,"
			       "\"algbw_GBps\":%.4f,\"busbw_GBps\":%.4f,\"verified\":null}\n",
			       count * 4, n, it, slowest, algbw, algbw * 2.0 * (n - 1) / n);
			fflush(stdout);
		}
	}
	free(in);
	free(out);
	MPI_Finalize();
	return 0;
}
