/*
 * fetch-cost: what the engine's work for one small tensor fetch costs, both sides together, on
 * one core. Two contexts of this process, a peer of each connected to the other through their
 * blobs (TFAB_PROVIDER picks the path: shm by default here); one thread keeps WINDOW sends
 * posted on the first and WINDOW receives on the second (into library tensors), and calls
 * tfab_progress on each in turn until FETCHES have completed. No second core, no scheduler and
 * no waiting for a line another core holds: the time is the CPU work of a fetch, the figure
 * that bounds the message rate of two processes on two cores (at best half of it a side).
 * Prints one JSON object per run: ns a fetch, and progress calls and fabric writes a fetch.
 *
 * usage: fetch-cost [FETCHES [WINDOW [DEPTH [SIZE]]]]
 *   (defaults 200000, 64, 0: requests as usual (DEPTH > 0: no-request mode, tfab_recv_ahead),
 *   8 bytes)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tfab/tfab.h>
#include "bench.h"

struct run {
	struct tfab_context *c[2];
	struct tfab_peer *p[2];
	long sent, received;
	int err;
};

static void on_sent(void *arg, int status)
{
	struct run *r = arg;

	if (status && !r->err)
		r->err = status;
	r->sent++;
}

static void on_recv(void *arg, int status, DLManagedTensor *t, bool is_dead)
{
	struct run *r = arg;

	(void)is_dead;
	if (status && !r->err)
		r->err = status;
	if (t)
		t->deleter(t);
	r->received++;
}

static long writes_of(struct tfab_context *c)
{
	struct tfab_stats st;

	if (tfab_get_stats(c, &st))
		return 0;
	return (long)(st.writes_content + st.writes_ctrl + st.writes_credit);
}

/*
 * Steps [from, from + n) through, WINDOW in flight: sends of the step posted on c[0] and
 * receives on c[1], each side topped up after each of its progress calls. Returns the progress
 * calls made, or -1 on an error.
 */
static long fetches(struct run *r, const DLTensor *t, long from, long n, long window)
{
	long posted_s = from, posted_r = from, end = from + n, calls = 0;

	/* r->sent and r->received count from step 0: both are `from` here */
	while ((r->sent < end || r->received < end) && !r->err) {
		while (posted_r < end && posted_r - r->received < window && !r->err) {
			r->err = tfab_recv(r->c[1], r->p[1], "fc", posted_r, NULL, on_recv, r);
			posted_r++;
		}
		while (posted_s < end && posted_s - r->sent < window && !r->err) {
			r->err = tfab_send(r->c[0], "fc", posted_s, t, false, on_sent, r);
			posted_s++;
		}
		if (r->err)
			break;
		tfab_progress(r->c[1]);
		tfab_progress(r->c[0]);
		calls += 2;
	}
	return r->err ? -1 : calls;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 200000, window = argc > 2 ? atol(argv[2]) : 64;
	long depth = argc > 3 ? atol(argv[3]) : 0, size = argc > 4 ? atol(argv[4]) : 8;
	struct run r = {0};
	int64_t shape;
	uint8_t *data;
	DLTensor t = {0};
	double t0, t1;
	long warm, calls, w0;
	int rc;

	if (n < 1 || window < 1 || depth < 0 || depth > 1024 || size < 1) {
		fprintf(stderr, "usage: fetch-cost [FETCHES [WINDOW [DEPTH [SIZE]]]]\n");
		return 2;
	}
	setenv("TFAB_PROVIDER", "shm", 0);
	rc = bench_pair(r.c, r.p);
	if (rc == 0 && depth)
		rc = tfab_recv_ahead(r.c[1], r.p[1], "fc", (unsigned)depth);
	data = calloc(1, (size_t)size);
	if (rc || !data) {
		fprintf(stderr, "fetch-cost: %s\n", rc ? tfab_strerror(rc) : "out of memory");
		return 1;
	}
	shape = size;
	t.data = data;
	t.device.device_type = kDLCPU;
	t.ndim = 1;
	t.dtype.code = kDLUInt;
	t.dtype.bits = 8;
	t.dtype.lanes = 1;
	t.shape = &shape;
	/* the meta-data cached, the pool's blocks and the request slots in use */
	warm = n / 10 > 4 * window ? n / 10 : 4 * window;
	if (fetches(&r, &t, 0, warm, window) < 0) {
		fprintf(stderr, "fetch-cost: warming up: %s\n", tfab_strerror(r.err));
		return 1;
	}
	w0 = writes_of(r.c[0]) + writes_of(r.c[1]);
	t0 = bench_now_ns();
	calls = fetches(&r, &t, warm, n, window);
	t1 = bench_now_ns();
	if (calls < 0) {
		fprintf(stderr, "fetch-cost: %s\n", tfab_strerror(r.err));
		return 1;
	}
	printf("{\"test\":\"fetch_cost\",\"path\":\"%s\",\"bytes\":%ld,\"window\":%ld,"
	       "\"depth\":%ld,\"fetches\":%ld,\"ns_per_fetch\":%.1f,\"calls_per_fetch\":%.2f,"
	       "\"writes_per_fetch\":%.2f}\n",
	       tfab_peer_path(r.p[0]), size, window, depth, n, (t1 - t0) / (double)n,
	       (double)calls / (double)n,
	       (double)(writes_of(r.c[0]) + writes_of(r.c[1]) - w0) / (double)n);
	for (int i = 0; i < 2; i++) {
		tfab_peer_destroy(r.p[i]);
		tfab_context_destroy(r.c[i]);
	}
	free(data);
	return 0;
}
