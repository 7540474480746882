/*
 * tfab-perf tensor: whole tensor transfers through the public engine (request, meta-data
 * cache, content write), between a server that sends and a client that receives and reports.
 * Per size, after a warm-up that fills the meta-data cache:
 *   bandwidth: the server keeps `window` sends posted, the client `window` receives into a
 *     caller destination, each (key "bw", step i) transferred once. Like raw (and
 *     ib_write_bw), each side uses one buffer for every transfer, so both tests have the
 *     same memory footprint and their ratio measures the protocol, not the caches;
 *   latency: ping-pong of one tensor each way, receives posted ahead as a pipeline would;
 *     the one-way latency is half a round trip.
 * copies reports the library's bytes_copied (0 on this path), meta_misses its cache misses.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tfab/tfab.h>

#include "perf.h"
#include "util/config.h"
#include "util/sock.h"
#include "util/time.h"

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

/*
 * The domain the context runs on, or "" when unknown. The engine names its backend and fabric
 * only; an endpoint opened as tfab_context_create opens its own (the settings read from the
 * environment, not local-only) is on the same domain: the one it reports, if it is on the
 * same fabric.
 */
static void context_domain(struct tfab_context *ctx, char *buf, size_t len)
{
	const struct tfab_provider_ops *ops;
	const struct tfab_caps *caps;
	struct tfab_config cfg;
	struct tfab_ep *ep;
	char err[1024];

	buf[0] = '\0';
	if (tfab__config_init(&cfg, err, sizeof(err)) ||
	    tfab__provider_open(&cfg, false, &ops, &ep, err, sizeof(err)))
		return;
	caps = ops->caps(ep);
	if (strcmp(caps->backend, tfab_context_backend(ctx)) == 0 &&
	    strcmp(caps->fabric, tfab_context_fabric(ctx)) == 0)
		snprintf(buf, len, "%s", caps->domain);
	ops->close(ep);
}

struct tstate {
	struct tfab_context *ctx;
	struct tfab_peer *peer;
	uint64_t deadline;
	volatile uint64_t sent, received;
	volatile int err;
};

static void on_sent(void *arg, int status)
{
	struct tstate *s = arg;

	if (status && !s->err)
		s->err = status;
	s->sent++;
}

static void on_recv(void *arg, int status, DLManagedTensor *t, bool is_dead)
{
	struct tstate *s = arg;

	(void)is_dead;
	if (t)
		t->deleter(t);
	if (status && !s->err)
		s->err = status;
	s->received++;
}

/* Progress until *count reaches want; false on an error or the deadline. */
static bool wait_count(struct tstate *s, volatile uint64_t *count, uint64_t want)
{
	while (*count < want && !s->err) {
		if (tfab_progress(s->ctx) < 0 || tfab__now_ms() > s->deadline) {
			if (!s->err)
				s->err = -ETIMEDOUT;
			break;
		}
	}
	return *count >= want && !s->err;
}

static void tensor_of(DLTensor *t, int64_t *shape, void *data, size_t size, bool cuda)
{
	/* bytes as uint8 [size]; a zero-size tensor has shape [0] */
	memset(t, 0, sizeof(*t));
	*shape = (int64_t)size;
	t->data = data;
	t->device.device_type = cuda ? kDLCUDA : kDLCPU;
	t->ndim = 1;
	t->dtype.code = kDLUInt;
	t->dtype.bits = 8;
	t->dtype.lanes = 1;
	t->shape = shape;
}

static int run_size(struct tstate *s, bool client, size_t size, unsigned iters, unsigned window,
		    uint8_t **bufs, bool cuda, int64_t step_base, struct perf_result *res)
{
	unsigned warm = iters / 10 ? iters / 10 : 1, total = warm + iters;
	unsigned lat_n = iters < 1000 ? iters : 1000, lat_warm = lat_n / 10 ? lat_n / 10 : 1;
	int64_t shapes[64];
	DLTensor t[64];
	uint64_t posted = 0, t0 = 0, t1;

	for (unsigned w = 0; w < window; w++)
		tensor_of(&t[w], &shapes[w], bufs[0], size, cuda);
	/* the ping-pong's second buffer: its receive must not land in what it sends */
	tensor_of(&t[1 % window], &shapes[1 % window], bufs[1], size, cuda);
	s->sent = s->received = 0;
	/* Bandwidth. */
	while ((client ? s->received : s->sent) < total) {
		volatile uint64_t *done = client ? &s->received : &s->sent;

		while (posted < total && posted - *done < window) {
			int64_t step = step_base + (int64_t)posted;
			int rc = client ? tfab_recv(s->ctx, s->peer, "bw", step,
						    &t[posted % window], on_recv, s)
					: tfab_send(s->ctx, "bw", step, &t[posted % window], false,
						    on_sent, s);

			if (rc) {
				fprintf(stderr, "tfab-perf: posting: %s\n", tfab_strerror(rc));
				return rc;
			}
			posted++;
		}
		if (!wait_count(s, done, *done + 1))
			return s->err;
		if (!t0 && *done >= warm)
			t0 = tfab__now_ns();
	}
	t1 = tfab__now_ns();
	res->gbps = (double)size * iters * 8.0 / (double)(t1 - t0 ? t1 - t0 : 1);

	/* Latency: ping (client to server) and pong, each receive posted one round ahead. */
	step_base += total;
	s->sent = s->received = 0;
	if (!client && tfab_recv(s->ctx, s->peer, "ping", step_base, &t[1 % window], on_recv, s))
		return -EIO;
	for (unsigned i = 0; i < lat_n + lat_warm; i++) {
		int64_t step = step_base + i;

		if (i == lat_warm)
			t0 = tfab__now_ns();
		if (client) {
			if (tfab_recv(s->ctx, s->peer, "pong", step, &t[1 % window], on_recv, s) ||
			    tfab_send(s->ctx, "ping", step, &t[0], false, on_sent, s))
				return -EIO;
			if (!wait_count(s, &s->received, i + 1) || !wait_count(s, &s->sent, i + 1))
				return s->err;
		} else {
			if (!wait_count(s, &s->received, i + 1))
				return s->err;
			/* the pong first: the next request is off the critical path */
			if (tfab_send(s->ctx, "pong", step, &t[0], false, on_sent, s))
				return -EIO;
			if (i + 1 < lat_n + lat_warm && tfab_recv(s->ctx, s->peer, "ping", step + 1,
								  &t[1 % window], on_recv, s))
				return -EIO;
			if (!wait_count(s, &s->sent, i + 1))
				return s->err;
		}
	}
	res->lat_us = (double)(tfab__now_ns() - t0) / 1000.0 / (2.0 * lat_n);
	res->iters = iters;
	res->window = window;
	res->bytes = size;
	return 0;
}

int perf_tensor_run(struct perf_pair *p, const struct perf_opts *o)
{
	struct tstate s = {0};
	struct tfab_stats st;
	uint8_t *bufs[64] = {0};
	char domain[64];
	size_t maxsize = 1;
	uint16_t port = 0;
	uint32_t mlen;
	int rc, tmo = (int)p->cfg.connect_timeout_ms;
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
	if (p->client)
		context_domain(s.ctx, domain, sizeof(domain));
	if (p->client && !o->json) {
		printf("tfab-perf tensor: %s %s on %s\n", tfab_context_backend(s.ctx),
		       tfab_context_fabric(s.ctx), domain[0] ? domain : "?");
		printf("%12s %9s %7s %10s %10s %10s   %s\n", "bytes", "iters", "window", "GB/s",
		       "Gb/s", "lat_us", "copies/meta_misses");
	}
	for (int i = 0; i < o->nsizes && rc == 0; i++) {
		size_t size = o->sizes[i];
		unsigned iters = o->iters ? o->iters : perf_default_iters(size);
		unsigned window = o->window ? o->window : perf_window_of(size);
		struct perf_result r = {0};

		if (window > 64)
			window = 64;
		for (unsigned w = 0; w < 2 && rc == 0; w++)
			if (!bufs[w])
				rc = buf_alloc(o->cuda, maxsize, (int)w, &bufs[w]);
		if (rc)
			break;
		s.deadline = tfab__now_ms() + (uint64_t)o->timeout_ms;
		rc = run_size(&s, p->client, size, iters, window, bufs, o->cuda, step_base, &r);
		step_base += 10 * (int64_t)(iters + 2000);
		if (rc == 0 && p->client) {
			tfab_get_stats(s.ctx, &st);
			r.copies = st.bytes_copied;
			r.meta_misses = st.meta_misses;
			r.has_engine = true;
			perf_print_result(o, "tensor", tfab_context_backend(s.ctx),
					  tfab_context_fabric(s.ctx), domain[0] ? domain : NULL,
					  &r);
		}
	}
	/* Both sides are done when the client has everything: a last barrier of one tensor. */
	if (rc == 0) {
		uint8_t one = 1;
		int64_t shape;
		DLTensor t;

		tensor_of(&t, &shape, &one, 1, false);
		s.sent = s.received = 0;
		s.deadline = tfab__now_ms() + (uint64_t)o->timeout_ms;
		if (p->client) {
			if (tfab_send(s.ctx, "done", -1, &t, false, on_sent, &s) ||
			    !wait_count(&s, &s.sent, 1))
				rc = s.err ? s.err : -EIO;
		} else if (tfab_recv(s.ctx, s.peer, "done", -1, NULL, on_recv, &s) ||
			   !wait_count(&s, &s.received, 1)) {
			rc = s.err ? s.err : -EIO;
		}
	}
	if (rc)
		fprintf(stderr, "tfab-perf tensor (%s): %s\n", p->client ? "client" : "server",
			tfab_strerror(rc));
out:
	tfab_peer_destroy(s.peer);
	tfab_context_destroy(s.ctx);
	for (int w = 0; w < 2; w++)
		if (bufs[w])
			buf_release(o->cuda, bufs[w]);
	return rc;
}
