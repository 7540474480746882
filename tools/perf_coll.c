/*
 * tfab-perf allreduce: N local ranks (processes this one starts, joining a world from a
 * torchrun-style environment on 127.0.0.1) allreduce fp32 tensors of each size, as
 * nccl-tests reports it: per size the algorithm, the time of one allreduce (lat_us, the
 * slowest rank's mean over the timed ones), the algorithm bandwidth (bytes / time) and the
 * bus bandwidth (algbw x 2(N-1)/N, what each rank's links carried). Each allreduce is waited
 * for before the next starts; a barrier comes before the timed ones. With --verify every
 * result is checked (small integers in fp32: exact sums).
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tfab/tfab.h>

#include "world/world.h"
#include "json.h"
#include "perf.h"
#include "util/sock.h"
#include "util/time.h"

static void on_done(void *arg, int status)
{
	*(int *)arg = status;
}

/* One allreduce, waited for. */
static int allreduce(struct tfab_world *w, DLTensor *in, DLTensor *out, enum tfab_op op,
		     int timeout_ms)
{
	int status = 1, rc = tfab_allreduce(w, in, out, op, NULL, on_done, &status);

	if (rc == 0)
		rc = tfab_world_wait(w, timeout_ms);
	return rc ? rc : status;
}

static unsigned iters_of(const struct perf_opts *o, size_t size)
{
	unsigned n = o->iters ? o->iters : perf_default_iters(size);

	return o->iters || n < 20000 ? n : 20000;
}

/* What rank r holds at element i (--verify): small integers, whose fp32 sums are exact. */
static float verify_value(int r, size_t i)
{
	return (float)((r + 1) * 3 + (int)(i % 13));
}

static int rank_size(struct tfab_world *w, const struct perf_opts *o, size_t size, float *in,
		     float *out, const char *path)
{
	int rank = tfab_world_rank(w), n = tfab_world_size(w), rc;
	int64_t count = (int64_t)(size / 4 ? size / 4 : 1), one = 1;
	DLTensor ti = {.data = in,
		       .device = {kDLCPU, 0},
		       .ndim = 1,
		       .dtype = {kDLFloat, 32, 1},
		       .shape = &count};
	DLTensor to = ti;
	unsigned iters = iters_of(o, (size_t)count * 4), warm = iters / 10 ? iters / 10 : 1;
	double elapsed[1];
	DLTensor te = {.data = elapsed,
		       .device = {kDLCPU, 0},
		       .ndim = 1,
		       .dtype = {kDLFloat, 64, 1},
		       .shape = &one};
	uint64_t t0;
	bool verified = true;

	to.data = out;
	for (int64_t i = 0; i < count; i++)
		in[i] = o->verify ? verify_value(rank, (size_t)i) : 1.0f;
	for (unsigned i = 0; i < warm; i++) {
		rc = allreduce(w, &ti, &to, TFAB_OP_SUM, o->timeout_ms);
		if (rc)
			return rc;
	}
	rc = allreduce(w, &te, &te, TFAB_OP_MAX, o->timeout_ms); /* as a barrier */
	if (rc)
		return rc;
	t0 = tfab__now_ns();
	for (unsigned i = 0; i < iters && rc == 0; i++)
		rc = allreduce(w, &ti, &to, TFAB_OP_SUM, o->timeout_ms);
	elapsed[0] = (double)(tfab__now_ns() - t0) / 1e3 / iters;
	if (rc)
		return rc;
	for (int64_t i = 0; o->verify && i < count; i++) {
		float want = 0;

		for (int r = 0; r < n; r++)
			want += verify_value(r, (size_t)i);
		if (out[i] != want) {
			fprintf(stderr,
				"tfab-perf allreduce: rank %d, %zu bytes: element %lld is %g, "
				"not %g\n",
				rank, size, (long long)i, (double)out[i], (double)want);
			verified = false;
			break;
		}
	}
	/* the slowest rank's time */
	rc = allreduce(w, &te, &te, TFAB_OP_MAX, o->timeout_ms);
	if (rc)
		return rc;
	if (rank == 0) {
		static const char *const names[] = {"auto", "direct", "ring", "doubling"};
		const char *algo =
		    names[tfab__coll_algo(w, (size_t)count * 4, (size_t)count, TFAB_ALGO_AUTO)];
		double lat = elapsed[0], algbw = (double)count * 4 / lat / 1e3;
		double busbw = algbw * 2.0 * (n - 1) / n;

		if (o->json) {
			printf("{\"test\":\"allreduce\",\"path\":");
			json_str(stdout, path);
			printf(",\"algo\":\"%s\",\"bytes\":%lld,\"ranks\":%d,\"iters\":%u,"
			       "\"lat_us\":%.3f,\"algbw_GBps\":%.4f,\"busbw_GBps\":%.4f,"
			       "\"verified\":%s}\n",
			       algo, (long long)count * 4, n, iters, lat, algbw, busbw,
			       o->verify ? (verified ? "true" : "false") : "null");
		} else {
			printf("%12lld %6d %-7s %8u %12.2f %11.3f %11.3f   %s\n",
			       (long long)count * 4, n, algo, iters, lat, algbw, busbw,
			       o->verify ? (verified ? "yes" : "NO") : "-");
		}
		fflush(stdout);
	}
	return verified ? 0 : -EIO;
}

/*
 * What this rank holds, for the world's footprint row: its proportional share (Pss) of its
 * memory, of what it alone holds (anonymous memory and mapped files: the libraries' pages
 * count a share to each process that maps them) and of shared memory (the rings and segments
 * it maps with other ranks: a ring two ranks map counts half to each), in kB; its open file
 * descriptors; and the world's peers it has connected.
 */
struct footprint {
	double rss_kb, shm_kb, fds, peers;
};

/* A field of /proc/self/smaps_rollup, kB (0 where the kernel has none). */
static double rollup_kb(const char *text, const char *field)
{
	const char *at = strstr(text, field);

	return at ? strtod(at + strlen(field), NULL) : 0;
}

static void footprint_of(struct tfab_world *w, struct footprint *fp)
{
	DIR *d = opendir("/proc/self/fd");
	FILE *f = fopen("/proc/self/smaps_rollup", "r");
	char text[4096];
	size_t n = f ? fread(text, 1, sizeof(text) - 1, f) : 0;

	text[n] = '\0';
	if (f)
		fclose(f);
	fp->rss_kb = rollup_kb(text, "\nPss_Anon:") + rollup_kb(text, "\nPss_File:");
	fp->shm_kb = rollup_kb(text, "\nPss_Shmem:");
	fp->fds = 0;
	while (d && readdir(d))
		fp->fds++;
	if (d) {
		fp->fds -= 3; /* ".", ".." and the directory's own */
		closedir(d);
	}
	fp->peers = 0;
	for (int r = 0; r < tfab_world_size(w); r++)
		fp->peers += r != tfab_world_rank(w) && w->peers[r];
}

/*
 * The world's row: the slowest rank's join and, per rank, the mean footprint (and the most
 * peers one rank connected), gathered by two allreduces.
 */
static int footprint_report(struct tfab_world *w, const struct perf_opts *o, double join_ms,
			    const char *path)
{
	struct footprint fp;
	double sum[5], max[5];
	int64_t five = 5;
	DLTensor ts = {.data = sum,
		       .device = {kDLCPU, 0},
		       .ndim = 1,
		       .dtype = {kDLFloat, 64, 1},
		       .shape = &five};
	DLTensor tm = ts;
	int n = tfab_world_size(w), rc;

	footprint_of(w, &fp);
	sum[0] = max[0] = join_ms;
	sum[1] = max[1] = fp.rss_kb;
	sum[2] = max[2] = fp.shm_kb;
	sum[3] = max[3] = fp.fds;
	sum[4] = max[4] = fp.peers;
	tm.data = max;
	rc = allreduce(w, &ts, &ts, TFAB_OP_SUM, o->timeout_ms);
	if (rc == 0)
		rc = allreduce(w, &tm, &tm, TFAB_OP_MAX, o->timeout_ms);
	if (rc || tfab_world_rank(w) != 0)
		return rc;
	if (o->json) {
		printf("{\"test\":\"world\",\"path\":");
		json_str(stdout, path);
		printf(",\"ranks\":%d,\"join_ms\":%.1f,\"rss_kb\":%.0f,\"shm_kb\":%.0f,"
		       "\"fds\":%.1f,\"peers\":%.1f,\"peers_max\":%.0f}\n",
		       n, max[0], sum[1] / n, sum[2] / n, sum[3] / n, sum[4] / n, max[4]);
	} else {
		printf("# world of %d: join %.1f ms (the slowest rank); per rank %.0f kB of its "
		       "own, %.0f kB of shared memory, %.1f fds, %.1f peers connected (at most "
		       "%.0f)\n",
		       n, max[0], sum[1] / n, sum[2] / n, sum[3] / n, sum[4] / n, max[4]);
	}
	fflush(stdout);
	return 0;
}

/* One rank: join, then every size, then (--footprint) the world's footprint. */
static int rank_main(const struct perf_opts *o)
{
	size_t max = 4;
	struct tfab_context *ctx;
	struct tfab_world *w;
	float *in = NULL, *out = NULL;
	const char *path = "self";
	uint64_t join_ns;
	int rc;

	for (int i = 0; i < o->nsizes; i++)
		max = o->sizes[i] > max ? o->sizes[i] : max;
	rc = tfab_context_create(&ctx);
	if (rc) {
		fprintf(stderr, "tfab-perf allreduce: context: %s\n", tfab_strerror(rc));
		return rc;
	}
	join_ns = tfab__now_ns();
	rc = tfab_world_join(ctx, NULL, &w);
	join_ns = tfab__now_ns() - join_ns;
	if (rc) {
		fprintf(stderr, "tfab-perf allreduce: joining the world: %s\n", tfab_strerror(rc));
		tfab_context_destroy(ctx);
		return rc;
	}
	if (tfab_world_size(w) > 1)
		path = tfab_peer_path(tfab_world_peer(w, tfab_world_rank(w) == 0 ? 1 : 0));
	if (posix_memalign((void **)&in, 4096, max) || posix_memalign((void **)&out, 4096, max))
		rc = -ENOMEM;
	if (rc == 0 && tfab_world_rank(w) == 0 && !o->json)
		printf(
		    "# allreduce of float32 (sum) on %d ranks, path %s\n"
		    "#      bytes  ranks algo       iters       lat_us  algbw_GBps  busbw_GBps   "
		    "verified\n",
		    tfab_world_size(w), path);
	for (int i = 0; i < o->nsizes && rc == 0; i++)
		rc = rank_size(w, o, o->sizes[i], in, out, path);
	if (rc == 0 && o->footprint)
		rc = footprint_report(w, o, (double)join_ns / 1e6, path);
	if (rc && rc != -EIO)
		fprintf(stderr, "tfab-perf allreduce: rank %d: %s\n", tfab_world_rank(w),
			tfab_strerror(rc));
	tfab_world_leave(w);
	tfab_context_destroy(ctx);
	free(in);
	free(out);
	return rc;
}

int perf_allreduce_run(const struct perf_opts *o)
{
	pid_t pids[PERF_MAX_RANKS];
	char port[16];
	uint16_t p = 0;
	int lfd, bad = 0;

	/* A free port for rank 0's rendezvous: taken and given back (the ranks start at once). */
	if (tfab__sock_listen("127.0.0.1", 0, &lfd, &p)) {
		fprintf(stderr, "tfab-perf allreduce: no free port on 127.0.0.1\n");
		return -EADDRNOTAVAIL;
	}
	close(lfd);
	snprintf(port, sizeof(port), "%u", p);
	fflush(NULL);
	for (int r = 0; r < o->ranks; r++) {
		pids[r] = fork();
		if (pids[r] < 0) {
			perror("tfab-perf allreduce: fork");
			for (int k = 0; k < r; k++)
				kill(pids[k], SIGKILL);
			return -errno;
		}
		if (pids[r] == 0) {
			char rank[16], size[16];

			prctl(PR_SET_PDEATHSIG, SIGKILL);
			snprintf(rank, sizeof(rank), "%d", r);
			snprintf(size, sizeof(size), "%d", o->ranks);
			setenv("TFAB_RANK", rank, 1);
			setenv("TFAB_WORLD_SIZE", size, 1);
			setenv("TFAB_MASTER_ADDR", "127.0.0.1", 1);
			setenv("TFAB_MASTER_PORT", port, 1);
			fflush(NULL);
			_exit(rank_main(o) ? 1 : 0);
		}
	}
	for (int r = 0; r < o->ranks; r++) {
		int status = 0;

		while (waitpid(pids[r], &status, 0) < 0 && errno == EINTR)
			;
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
			bad = 1;
	}
	return bad ? -EIO : 0;
}
