/*
 * tfab-perf internals shared by its tests: the connected pair (one endpoint, one peer, a
 * registered source and target on each side), options, and result reporting. The memcpy test
 * needs no pair.
 */
#ifndef TFAB_TOOLS_PERF_H
#define TFAB_TOOLS_PERF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "providers/provider.h"
#include "util/config.h"

#define PERF_MAX_SIZES 32

enum { PERF_RAW = 1, PERF_TENSOR = 2, PERF_MEMCPY = 4, PERF_ALLREDUCE = 8 };

/* The most ranks tfab-perf allreduce starts. */
#define PERF_MAX_RANKS 1024

struct perf_opts {
	unsigned tests; /* PERF_MEMCPY | PERF_RAW | PERF_TENSOR, or PERF_ALLREDUCE alone */
	int ranks;	/* allreduce: local ranks to start */
	size_t sizes[PERF_MAX_SIZES];
	int nsizes;
	unsigned iters;	 /* 0: chosen per size */
	unsigned window; /* 0: chosen per size */
	bool json;
	bool verify;
	bool cuda;		/* --device cuda: tensor test buffers in GPU memory */
	bool progress;		/* show progress on a terminal */
	bool heap_dst;		/* raw: destinations from malloc even where mem_alloc is offered */
	unsigned no_request;	/* tensor: requests kept standing ahead per key (0: off) */
	unsigned request_bytes; /* raw: a message of this many bytes each way per round (0: none) */
	bool breakdown;		/* tensor: each side's ping-pong round by call, on stderr */
	bool footprint;		/* allreduce: the world's join time and per-rank footprint */
	int timeout_ms;		/* bound of every wait */
	const char *listen_port; /* --listen */
	const char *connect_to;	 /* --connect */
};

/* One side of a run: the server is the target of bandwidth writes, the client reports. */
struct perf_pair {
	const struct tfab_provider_ops *ops;
	struct tfab_config cfg;
	struct tfab_ep *ep;
	const struct tfab_caps *caps;
	struct tfab_conn *peer;
	bool client;
	int sock; /* bootstrap connection, kept for the run */
	size_t buf_len;
	uint8_t *src, *dst; /* page-aligned, buf_len each */
	bool dst_shared;    /* dst is the backend's memory (mem_alloc) */
	struct tfab_mr *smr, *dmr;
	uint64_t remote_raddr, remote_rkey; /* the peer's dst */
	char peer_host[256];		    /* the server's host, for the tensor pair */
	/*
	 * A control immediate from the peer not yet consumed. It lives with the pair, not with
	 * one phase: the peer's next READY or DONE may land while this side still drains.
	 */
	uint32_t ctrl;
};

struct perf_result {
	size_t bytes;
	unsigned iters, window;
	double gbps;	 /* gigabits per second */
	double rate;	 /* transfers per second (tensor: fetches), in the bandwidth phase */
	double lat_us;	 /* one-way: half a round trip (memcpy: one copy) */
	bool verified;	 /* --verify: every byte arrived as sent */
	bool has_engine; /* tensor: the engine's counters below are set */
	uint64_t copies, meta_misses;
	double writes_per_fetch; /* fabric writes of both sides per tensor fetch */
};

/*
 * The bandwidth loops' clock. It starts at the first look that finds the warm-up done and
 * counts only the transfers that completed after that look: one wakeup may report several
 * completions, so the look can come after more than the warm-up. Where every transfer had
 * completed by that look (a window as deep as the run, completions reported together), no
 * later start can be timed, and it counts all of them from the loop's start, warm-up included.
 */
struct perf_bw_clock {
	uint64_t start_ns; /* the loop's start */
	uint64_t t0_ns;	   /* the first look with the warm-up done; 0: none yet */
	uint64_t done0;	   /* transfers done at that look */
};

static inline void perf_bw_look(struct perf_bw_clock *c, uint64_t now_ns, uint64_t done,
				uint64_t warm)
{
	if (!c->t0_ns && done >= warm) {
		c->t0_ns = now_ns;
		c->done0 = done;
	}
}

/* Gigabits per second over `total` transfers of `size` bytes, the last one done at t1_ns. */
static inline double perf_bw_gbps(const struct perf_bw_clock *c, size_t size, uint64_t total,
				  uint64_t t1_ns)
{
	bool all_before = !c->t0_ns || c->done0 >= total;
	uint64_t from = all_before ? c->start_ns : c->t0_ns;
	uint64_t n = all_before ? total : total - c->done0;
	uint64_t ns = t1_ns > from ? t1_ns - from : 1;

	return (double)size * (double)n * 8.0 / (double)ns;
}

/* Transfers per second over the same span as perf_bw_gbps (a size of 0 has a rate too). */
static inline double perf_bw_rate(const struct perf_bw_clock *c, uint64_t total, uint64_t t1_ns)
{
	return perf_bw_gbps(c, 1, total, t1_ns) * 1e9 / 8.0;
}

/* Runs the raw test over a connected pair; the client fills res. Returns 0 or a status. */
int perf_raw_run(struct perf_pair *p, const struct perf_opts *o, size_t size,
		 struct perf_result *res);

/* The end of a run, after the last size: both sides call it. */
int perf_raw_finish(struct perf_pair *p, const struct perf_opts *o);

/* Iterations for a size when --iters is not given. */
unsigned perf_default_iters(size_t size);

/* Writes in flight when --window is not given. */
unsigned perf_window_of(size_t size);
/*
 * Latency rounds of a size of `iters` transfers (raw and tensor alike): at most 10,000, some
 * 15 ms at 8 bytes on shared memory, so that one preemption does not decide the figure.
 */
unsigned perf_lat_iters(unsigned iters);

/* --verify: fill len bytes with the pattern of seed; whether buf holds that pattern. */
void perf_fill(uint8_t *buf, size_t len, uint64_t seed);
bool perf_check(const uint8_t *buf, size_t len, uint64_t seed);

/*
 * Runs the memcpy test in this process and prints its rows: 0, a status, or -EIO when --verify
 * found a copy unlike its source.
 */
int perf_memcpy_run(const struct perf_opts *o);

/*
 * Runs the allreduce test: o->ranks local processes joining a world; rank 0 prints the rows.
 * 0, or a status (-EIO: a rank failed, or --verify found a wrong result).
 */
int perf_allreduce_run(const struct perf_opts *o);

/* Runs the tensor test over the engine; both sides call it. */
int perf_tensor_run(struct perf_pair *p, const struct perf_opts *o);

/* One result row, or one JSON object. */
void perf_print_result(const struct perf_opts *o, const char *test, const char *path,
		       const char *backend, const char *fabric, const char *domain,
		       const struct perf_result *r);

#endif
