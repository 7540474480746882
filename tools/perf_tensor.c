/*
 * tfab-perf tensor: whole tensor transfers through the public engine (request, meta-data
 * cache, content write), between a server that sends and a client that receives and reports.
 * Per size, after a warm-up that fills the meta-data cache:
 *   bandwidth: the server keeps `window` sends posted, the client `window` receives into a
 *     caller destination, each (key "bw", step i) transferred once. Like raw (and
 *     ib_write_bw), each side uses one buffer for every transfer, so both tests have the
 *     same memory footprint and their ratio measures the protocol, not the caches;
 *   latency: ping-pong of one tensor each way, as a pipeline runs it: the receives of the
 *     next round posted ahead (their requests travel during the round before), and a send's
 *     completion (the receiver's TAKEN) waited for a round later;
 *     the one-way latency is half a round trip.
 * copies reports the library's bytes_copied (0 on this path), meta_misses its cache misses.
 * With --verify the sender fills every tensor with a pattern of its key and step, and the
 * receiver checks every byte of it, in a buffer of its own per bandwidth slot (so the timings
 * include the filling and checking). The server's verdict on the pings it received goes to
 * the client after each size, in a tensor of its own.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tfab/tfab.h>

#include "perf.h"
#include "util/sock.h"
#include "util/time.h"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

#ifdef TFAB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/*
 * Buffers for --device cuda: GPU memory from cudaMalloc, or host memory standing in for it
 * under TFAB_CUDA_EMULATE=1 (the engine then takes it as such).
 */
static bool emulated(void)
{
	const char *e = getenv("TFAB_CUDA_EMULATE");

	return e && strcmp(e, "1") == 0;
}

static int buf_alloc(bool cuda, size_t n, int fill, uint8_t **buf_p)
{
	if (!cuda || emulated()) {
		if (posix_memalign((void **)buf_p, 4096, n))
			return -ENOMEM;
		memset(*buf_p, fill, n);
		return 0;
	}
#ifdef TFAB_HAVE_CUDA
	int count = 0;

	if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
		fprintf(stderr, "tfab-perf: --device cuda: no CUDA device on this machine\n");
		return -ENODEV;
	}
	if (cudaMalloc((void **)buf_p, n) != cudaSuccess)
		return -ENOMEM;
	cudaMemset(*buf_p, fill, n);
	return 0;
#else
	fprintf(stderr, "tfab-perf: --device cuda: built without CUDA\n");
	return -EOPNOTSUPP;
#endif
}

/* Copy n bytes between the host and a buffer from buf_alloc (to_buf: into it). */
static int buf_copy(bool cuda, uint8_t *buf, uint8_t *host, size_t n, bool to_buf)
{
	if (!cuda || emulated()) {
		memmove(to_buf ? buf : host, to_buf ? host : buf, n);
		return 0;
	}
#ifdef TFAB_HAVE_CUDA
	if (cudaMemcpy(to_buf ? buf : host, to_buf ? host : buf, n,
		       to_buf ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost) != cudaSuccess)
		return -EIO;
	return 0;
#else
	return -EOPNOTSUPP;
#endif
}

static void buf_release(bool cuda, uint8_t *buf)
{
#ifdef TFAB_HAVE_CUDA
	if (cuda && !emulated()) {
		cudaFree(buf);
		return;
	}
#endif
	(void)cuda;
	free(buf);
}

/* What --breakdown splits a ping-pong round into. */
enum { BD_PROGRESS_WORK, BD_PROGRESS_IDLE, BD_SEND, BD_RECV, BD_N };

/*
 * --breakdown's clock: the time-stamp counter where there is one (a few nanoseconds a read;
 * a round is a few hundred), else the monotonic clock. Its ticks become time by the timed
 * loop's own length, as the shares they are of it.
 */
static inline uint64_t ticks(void)
{
#if defined(__x86_64__) || defined(__i386__)
	return __rdtsc();
#else
	return tfab__now_ns();
#endif
}

/* One transfer's tensor: a bandwidth slot, a ping-pong side, or a control tensor. */
struct xfer {
	struct tstate *s;
	DLTensor t;
	int64_t shape;
	const char *key;
	int64_t step;
	uint64_t seed; /* --verify: of the pattern sent, or due to arrive */
	bool check;    /* --verify: the receive is checked against the pattern */
	bool busy;     /* posted and not completed */
};

/*
 * The run. The transfers live here, not on a stack, because the callbacks of those a failed
 * run leaves posted come when the context is destroyed.
 */
struct tstate {
	struct tfab_context *ctx;
	struct tfab_peer *peer;
	uint64_t deadline;
	bool verify, cuda;
	uint8_t *host; /* --verify: a tensor's bytes on the host (its buffer itself on the CPU) */
	volatile uint64_t sent, received;
	unsigned damaged; /* --verify: tensors received this size unlike their pattern */
	bool pool_dest;	  /* receives into tensors the library allocates (not --heap-dst) */
	volatile int err;
	struct xfer slots[64]; /* bandwidth */
	/* the ping-pong: sends of `lag` rounds (the verdict of one is waited for then), receives
	 * of two */
	struct xfer tx[2 + 64 / 2], rx[2];
	unsigned no_request; /* --no-request: its depth */
	/*
	 * --breakdown: the ticks (and calls) of the ping-pong's timed rounds by what this side's
	 * thread was in; counted while timing is set
	 */
	bool breakdown, timing;
	uint64_t ticks[BD_N], calls[BD_N];
	struct xfer ctl; /* the verdict, the last barrier */
	uint8_t ctl_byte;
	/* the report of a size: the server's fabric writes, then its verdict (one byte) */
	uint8_t report[9];
#ifdef TFAB_PERF_DAMAGE
	int size_index;	      /* the test build: of the size running */
	uint64_t damage_seed; /* the tensor whose pattern its sender spoils */
#endif
};

/* The pattern of the pong of a step differs from its ping's. */
#define PONG_SEED(step) ((uint64_t)(step) | 1ull << 63)

/* --verify: the sender's pattern, or before a receive its complement (every byte differs). */
static int xfer_fill(struct xfer *x, bool complement)
{
	struct tstate *s = x->s;
	size_t n = (size_t)x->shape;
	uint8_t *h = s->host ? s->host : x->t.data;

	perf_fill(h, n, x->seed);
	if (complement)
		for (size_t i = 0; i < n; i++)
			h[i] = (uint8_t)~h[i];
#ifdef TFAB_PERF_DAMAGE
	if (!complement && n && x->seed == s->damage_seed)
		h[n / 2] ^= 1;
#endif
	return s->host ? buf_copy(s->cuda, x->t.data, h, n, true) : 0;
}

/*
 * --verify: whether a received tensor (at data: the caller's, or one the library allocated)
 * holds its pattern; says so once a size if not.
 */
static void xfer_check(struct xfer *x, void *data)
{
	struct tstate *s = x->s;
	size_t n = (size_t)x->shape;
	uint8_t *h = s->host ? s->host : data;

	if ((s->host && buf_copy(s->cuda, data, h, n, false)) || !perf_check(h, n, x->seed)) {
		if (!s->damaged++)
			fprintf(stderr,
				"tfab-perf: a %zu-byte tensor (%s, step %lld) arrived unlike "
				"what was sent\n",
				n, x->key, (long long)x->step);
	}
}

static void on_sent(void *arg, int status)
{
	struct xfer *x = arg;
	struct tstate *s = x->s;

	if (status && !s->err)
		s->err = status;
	x->busy = false;
	s->sent++;
}

static void on_recv(void *arg, int status, DLManagedTensor *t, bool is_dead)
{
	struct xfer *x = arg;
	struct tstate *s = x->s;

	if (status && !s->err)
		s->err = status;
	if (status == 0 && x->check && s->verify && !is_dead)
		xfer_check(x, t ? t->dl_tensor.data : x->t.data);
	if (t)
		t->deleter(t);
	x->busy = false;
	s->received++;
}

/* --breakdown: a call of kind k, which began at t0, has returned. */
static void tally(struct tstate *s, int k, uint64_t t0)
{
	s->ticks[k] += ticks() - t0;
	s->calls[k]++;
}

/* Progress until *count reaches want; false on an error or the deadline. */
static bool wait_count(struct tstate *s, volatile uint64_t *count, uint64_t want)
{
	/* the clock every 64 polls: reading it costs about as much as an idle poll */
	for (unsigned polls = 0; *count < want && !s->err; polls++) {
		uint64_t t = s->timing ? ticks() : 0;
		int n = tfab_progress(s->ctx);

		if (s->timing)
			tally(s, n > 0 ? BD_PROGRESS_WORK : BD_PROGRESS_IDLE, t);
		if (n < 0 || (polls % 64 == 63 && tfab__now_ms() > s->deadline)) {
			if (!s->err)
				s->err = -ETIMEDOUT;
			break;
		}
	}
	return *count >= want && !s->err;
}

static void xfer_init(struct xfer *x, struct tstate *s, void *data, size_t size, bool cuda)
{
	/* bytes as uint8 [size]; a zero-size tensor has shape [0] */
	memset(x, 0, sizeof(*x));
	x->s = s;
	x->shape = (int64_t)size;
	x->t.data = data;
	x->t.device.device_type = cuda ? kDLCUDA : kDLCPU;
	x->t.ndim = 1;
	x->t.dtype.code = kDLUInt;
	x->t.dtype.bits = 8;
	x->t.dtype.lanes = 1;
	x->t.shape = &x->shape;
}

/* Post x as (key, step): a send (filled first with --verify) or a receive. */
static int xfer_post(struct xfer *x, bool send, const char *key, int64_t step, uint64_t seed)
{
	struct tstate *s = x->s;
	uint64_t t;
	int rc = 0;

	x->key = key;
	x->step = step;
	x->seed = seed;
	x->check = !send;
	if (s->verify)
		rc = xfer_fill(x, !send);
	if (rc)
		return rc;
	x->busy = true;
	t = s->timing ? ticks() : 0;
	rc = send ? tfab_send(s->ctx, key, step, &x->t, false, on_sent, x)
		  : tfab_recv(s->ctx, s->peer, key, step, s->pool_dest ? NULL : &x->t, on_recv, x);
	if (s->timing)
		tally(s, send ? BD_SEND : BD_RECV, t);
	if (rc) {
		x->busy = false;
		fprintf(stderr, "tfab-perf: posting: %s\n", tfab_strerror(rc));
	}
	return rc;
}

/* The fabric writes this side's context has posted. */
static uint64_t writes_of(struct tfab_context *ctx)
{
	struct tfab_stats st;

	if (tfab_get_stats(ctx, &st))
		return 0;
	return st.writes_content + st.writes_ctrl + st.writes_credit;
}

/*
 * After a size, the server reports to the client the fabric writes it posted for the size
 * (writes) and, with --verify, its verdict on the pings it received: the client adds both to
 * its own. *writes_p: the server's count (client), *ok_p: the verdicts together.
 */
static int exchange_report(struct tstate *s, bool client, int64_t step, uint64_t writes,
			   uint64_t *writes_p, bool *ok_p)
{
	struct xfer *x = &s->ctl;
	int rc;

	for (int i = 0; i < 8; i++)
		s->report[i] = (uint8_t)(writes >> (8 * i));
	s->report[8] = s->damaged == 0;
	xfer_init(x, s, s->report, sizeof(s->report), false);
	s->sent = s->received = 0;
	if (client)
		rc = tfab_recv(s->ctx, s->peer, "report", step, &x->t, on_recv, x);
	else
		rc = tfab_send(s->ctx, "report", step, &x->t, false, on_sent, x);
	if (rc == 0 && !wait_count(s, client ? &s->received : &s->sent, 1))
		rc = s->err;
	if (rc == 0) {
		*writes_p = 0;
		for (int i = 0; i < 8; i++)
			*writes_p |= (uint64_t)s->report[i] << (8 * i);
		*ok_p = s->damaged == 0 && s->report[8] == 1;
	}
	return rc;
}

/*
 * --breakdown: where this side's thread spent the ping-pong's rounds (round_us each, total
 * ticks in all), as shares of the round, with the calls a round of each kind.
 */
static void breakdown_print(const struct tstate *s, bool client, size_t size, unsigned rounds,
			    double round_us, uint64_t total)
{
	static const char *const what[BD_N] = {
	    [BD_PROGRESS_WORK] = "progress that found work",
	    [BD_PROGRESS_IDLE] = "progress that found none",
	    [BD_SEND] = "tfab_send",
	    [BD_RECV] = "tfab_recv",
	};
	char line[512];
	size_t off = 0;
	uint64_t rest = total;

	if (!total || !rounds)
		return;
	off += (size_t)snprintf(line, sizeof(line),
				"tfab-perf: breakdown, %s, %zu bytes: a round %.3f us:",
				client ? "client" : "server", size, round_us);
	for (int k = 0; k < BD_N; k++) {
		rest -= s->ticks[k] < rest ? s->ticks[k] : rest;
		off += (size_t)snprintf(
		    line + off, sizeof(line) - off, " %s %.0f%% (%.2f a round);", what[k],
		    100.0 * (double)s->ticks[k] / (double)total, (double)s->calls[k] / rounds);
	}
	fprintf(stderr, "%s the tool's loop %.0f%%\n", line, 100.0 * (double)rest / (double)total);
}

/*
 * One size. bufs[0] to bufs[3]: the shared buffer of the bandwidth slots and the first
 * ping-pong send, the ping-pong receives', the second send's; slot_bufs: with --verify, a
 * buffer per bandwidth slot instead.
 */
static int run_size(struct tstate *s, bool client, size_t size, unsigned iters, unsigned window,
		    uint8_t **bufs, uint8_t **slot_bufs, int64_t step_base, struct perf_result *res)
{
	unsigned depth = s->no_request < window ? s->no_request : window;
	/*
	 * The warm-ups: a tenth of the run, and at least twice the receives a phase keeps out,
	 * so that every pool block of their rotation has been faulted in on both sides (the
	 * receiver's pages and the sender's mapping of them) before the clock starts. At 64 MiB
	 * with -n 32, three warm-up transfers left the fourth and fifth block's first touch in
	 * the timed loop (shm: 8 GB/s instead of 30), and three rounds of the ping-pong, with
	 * requests standing, the first touch of its blocks (6.1 ms one way instead of 2.5).
	 * Bandwidth keeps `window` receives out; the ping-pong two a side, and `depth` standing.
	 */
	unsigned warm = iters / 10 > 2 * window ? iters / 10 : 2 * window, total = warm + iters;
	unsigned lat_n = perf_lat_iters(iters), lat_warm = 2 * (2 + depth);
	struct xfer *tx = s->tx, *rx = s->rx;
	uint64_t posted = 0, t0 = 0, tk0 = 0, writes = writes_of(s->ctx), peer_writes = 0;

	if (lat_n / 10 > lat_warm)
		lat_warm = lat_n / 10;
	/*
	 * In no-request mode a receive's verdict waits for the next control write (up to depth/2
	 * receives later): the ping-pong waits for a send's that much later too. Even, so that
	 * each round's send keeps its buffer (of two).
	 */
	unsigned lag = depth ? (depth / 2 + 3) & ~1u : 2;
	int rc;

	if (s->no_request) {
		rc = client ? tfab_recv_ahead(s->ctx, s->peer, "bw", depth)
			    : tfab_recv_ahead(s->ctx, s->peer, "ping", depth);
		if (rc == 0 && client)
			rc = tfab_recv_ahead(s->ctx, s->peer, "pong", depth);
		if (rc)
			return rc;
	}

	for (unsigned w = 0; w < window; w++)
		xfer_init(&s->slots[w], s, s->verify ? slot_bufs[w] : bufs[0], size, s->cuda);
	/* the ping-pong: a receive must not land in what this side sends */
	for (unsigned k = 0; k < lag; k++)
		xfer_init(&tx[k], s, k % 2 ? bufs[3] : bufs[0], size, s->cuda);
	xfer_init(&rx[0], s, bufs[1], size, s->cuda);
	xfer_init(&rx[1], s, bufs[2], size, s->cuda);
	s->sent = s->received = 0;
	s->damaged = 0;
#ifdef TFAB_PERF_DAMAGE
	/* a bandwidth tensor (the client sees it) at one size, a ping (the server) at the next */
	s->damage_seed = s->size_index % 2 == 0 ? (uint64_t)step_base + warm
						: (uint64_t)step_base + total + lat_warm;
#endif
	/* Bandwidth. */
	struct perf_bw_clock bw = {.start_ns = tfab__now_ns()};

	while ((client ? s->received : s->sent) < total) {
		volatile uint64_t *done = client ? &s->received : &s->sent;

		while (posted < total && posted - *done < window) {
			struct xfer *x = &s->slots[posted % window];
			int64_t step = step_base + (int64_t)posted;

			/* completions in another order than posts: wait for this slot's */
			if (x->busy)
				break;
			rc = xfer_post(x, !client, "bw", step, (uint64_t)step);
			if (rc)
				return rc;
			posted++;
		}
		if (!wait_count(s, done, *done + 1))
			return s->err;
		perf_bw_look(&bw, tfab__now_ns(), *done, warm);
	}
	uint64_t t1 = tfab__now_ns();
	res->gbps = perf_bw_gbps(&bw, size, total, t1);
	res->rate = perf_bw_rate(&bw, total, t1);

	/*
	 * Latency: ping (client to server) and pong, as a pipeline runs them: each side keeps
	 * the receives of this round and the next posted (the request for a round's tensor
	 * travels during the round before) and sends from two tensors in turn (a send's TAKEN
	 * is waited for a round later), so a round is one content write each way.
	 */
	step_base += total;
	s->sent = s->received = 0;
	for (unsigned k = 0; k < 2 && k < lat_n + lat_warm; k++)
		if ((rc = xfer_post(&rx[k], false, client ? "pong" : "ping", step_base + k,
				    client ? PONG_SEED(step_base + k) : (uint64_t)step_base + k)))
			return rc;
	for (unsigned i = 0; i < lat_n + lat_warm; i++) {
		int64_t step = step_base + i;

		if (i == lat_warm) {
			memset(s->ticks, 0, sizeof(s->ticks));
			memset(s->calls, 0, sizeof(s->calls));
			s->timing = s->breakdown;
			tk0 = ticks();
			t0 = tfab__now_ns();
		}
		/* the send of `lag` rounds ago is done with its tensor */
		if (!client && !wait_count(s, &s->received, i + 1))
			return s->err;
		if (i >= lag && !wait_count(s, &s->sent, i - lag + 1))
			return s->err;
		if (client) {
			/* the ping first, then the receive the last pong freed */
			rc = xfer_post(&tx[i % lag], true, "ping", step, (uint64_t)step);
			if (rc == 0 && i > 0 && i + 1 < lat_n + lat_warm)
				rc = xfer_post(&rx[(i + 1) % 2], false, "pong", step + 1,
					       PONG_SEED(step + 1));
			if (rc == 0 && !wait_count(s, &s->received, i + 1))
				return s->err;
		} else {
			rc = xfer_post(&tx[i % lag], true, "pong", step, PONG_SEED(step));
			if (rc == 0 && i + 2 < lat_n + lat_warm)
				rc = xfer_post(&rx[i % 2], false, "ping", step + 2,
					       (uint64_t)step + 2);
		}
		if (rc)
			return rc;
	}
	res->lat_us = (double)(tfab__now_ns() - t0) / 1000.0 / (2.0 * lat_n);
	if (s->timing)
		breakdown_print(s, client, size, lat_n, res->lat_us * 2.0, ticks() - tk0);
	s->timing = false;
	if (!wait_count(s, &s->sent, lat_n + lat_warm))
		return s->err;
	res->iters = iters;
	res->window = window;
	res->bytes = size;
	writes = writes_of(s->ctx) - writes;
	rc = exchange_report(s, client, step_base + lat_n + lat_warm, writes, &peer_writes,
			     &res->verified);
	/* every fetch of the size, warm-ups included: the bandwidth slots and both ways of each round */
	res->writes_per_fetch =
	    (double)(writes + peer_writes) / (double)(total + 2 * (lat_n + lat_warm));
	return rc;
}

/* --verify: free the bandwidth slots' buffers, after the context has forgotten them. */
static void release_slots(struct tstate *s, uint8_t **slot_bufs, size_t len)
{
	for (unsigned w = 0; w < 64; w++) {
		if (!slot_bufs[w])
			continue;
		if (s->ctx)
			tfab_mr_invalidate(s->ctx, slot_bufs[w], len);
		buf_release(s->cuda, slot_bufs[w]);
		slot_bufs[w] = NULL;
	}
}

int perf_tensor_run(struct perf_pair *p, const struct perf_opts *o)
{
	struct tstate s = {.verify = o->verify,
			   .cuda = o->cuda,
			   .pool_dest = !o->cuda && !o->heap_dst,
			   .no_request = o->no_request,
			   .breakdown = o->breakdown};
	struct tfab_stats st;
	uint8_t *bufs[4] = {0}, *slot_bufs[64] = {0};
	size_t maxsize = 1, slot_len = 0;
	uint16_t port = 0;
	uint32_t mlen;
	int rc, tmo = (int)p->cfg.connect_timeout_ms;
	const char *backend = "", *fabric = "", *domain = "";
	bool failed = false;
	int64_t step_base = 0;

	for (int i = 0; i < o->nsizes; i++)
		if (o->sizes[i] > maxsize)
			maxsize = o->sizes[i];
	rc = tfab_context_create(&s.ctx);
	if (rc) {
		fprintf(stderr, "tfab-perf: context: %s\n", tfab_strerror(rc));
		return rc;
	}
	/* The server listens on a port of its own and tells the client over the plan socket. */
	if (!p->client) {
		rc = tfab_listen(s.ctx, NULL, 0, &port);
		if (rc == 0)
			rc = tfab__sock_send_msg(p->sock, &port, sizeof(port), tmo);
		if (rc == 0)
			rc = tfab_accept(s.ctx, tmo, &s.peer);
	} else {
		rc = tfab__sock_recv_msg(p->sock, &port, sizeof(port), &mlen, tmo);
		if (rc == 0)
			rc = tfab_connect(s.ctx, p->peer_host, port, tmo, &s.peer);
	}
	if (rc) {
		fprintf(stderr, "tfab-perf: connecting the tensor pair: %s\n", tfab_strerror(rc));
		goto out;
	}
	tfab_peer_fabric(s.peer, &backend, &fabric, &domain);
	if (p->client)
		if (p->client && !o->json) {
			printf("tfab-perf tensor: path %s (%s %s on %s)\n", tfab_peer_path(s.peer),
			       backend, fabric, domain);
			printf("%12s %9s %7s %10s %10s %10s %10s   %-18s %12s %s\n", "bytes",
			       "iters", "window", "GB/s", "Gb/s", "Mfetch/s", "lat_us",
			       "copies/meta_misses", "writes/fetch", "verified");
		}
	for (unsigned w = 0; w < 4 && rc == 0; w++)
		rc = buf_alloc(o->cuda, maxsize, (int)w, &bufs[w]);
	/* GPU memory is filled and checked through the host. */
	if (rc == 0 && o->verify && o->cuda && !emulated()) {
		s.host = malloc(maxsize);
		rc = s.host ? 0 : -ENOMEM;
	}
	for (int i = 0; i < o->nsizes && rc == 0; i++) {
		size_t size = o->sizes[i];
		unsigned iters = o->iters ? o->iters : perf_default_iters(size);
		unsigned window = o->window ? o->window : perf_window_of(size);
		struct perf_result r = {0};

		if (window > 64)
			window = 64;
		if (o->verify && (size > slot_len || !slot_bufs[window - 1])) {
			release_slots(&s, slot_bufs, slot_len);
			slot_len = size ? size : 1;
			for (unsigned w = 0; w < window && rc == 0; w++)
				rc = buf_alloc(o->cuda, slot_len, 0, &slot_bufs[w]);
			if (rc)
				break;
		}
		s.deadline = tfab__now_ms() + (uint64_t)o->timeout_ms;
#ifdef TFAB_PERF_DAMAGE
		s.size_index = i;
#endif
		rc = run_size(&s, p->client, size, iters, window, bufs, slot_bufs, step_base, &r);
		step_base += 10 * (int64_t)(iters + 2000);
		if (rc == 0 && p->client) {
			tfab_get_stats(s.ctx, &st);
			r.copies = st.bytes_copied;
			r.meta_misses = st.meta_misses;
			r.has_engine = true;
			perf_print_result(o, "tensor", tfab_peer_path(s.peer), backend, fabric,
					  domain, &r);
			failed |= o->verify && !r.verified;
		}
	}
	/* Both sides are done when the client has everything: a last barrier of one tensor. */
	if (rc == 0) {
		s.ctl_byte = 1;
		xfer_init(&s.ctl, &s, &s.ctl_byte, 1, false);
		s.sent = s.received = 0;
		s.deadline = tfab__now_ms() + (uint64_t)o->timeout_ms;
		if (p->client) {
			if (tfab_send(s.ctx, "done", 0, &s.ctl.t, false, on_sent, &s.ctl) ||
			    !wait_count(&s, &s.sent, 1))
				rc = s.err ? s.err : -EIO;
		} else if (tfab_recv(s.ctx, s.peer, "done", 0, NULL, on_recv, &s.ctl) ||
			   !wait_count(&s, &s.received, 1)) {
			rc = s.err ? s.err : -EIO;
		}
	}
	if (rc)
		fprintf(stderr, "tfab-perf tensor (%s): %s\n", p->client ? "client" : "server",
			tfab_strerror(rc));
	else if (failed)
		rc = -EIO;
out:
	tfab_peer_destroy(s.peer);
	tfab_context_destroy(s.ctx);
	s.ctx = NULL;
	release_slots(&s, slot_bufs, slot_len);
	for (int w = 0; w < 4; w++)
		if (bufs[w])
			buf_release(o->cuda, bufs[w]);
	free(s.host);
	return rc;
}
