/*
 * tfab-perf memcpy: the physical bound of a same-host transfer, one thread copying between two
 * buffers of each size inside this process. No fabric, no provider, no second process. Per
 * size: page-aligned buffers, all written first (so no page faults are timed), a tenth as
 * many warm-up copies, then `iters` timed copies on the monotonic clock. lat_us is the time of
 * one copy; with --verify each destination is compared with the source afterwards.
 *
 * With --window N the copies go into N destinations in turn (at most 256 MiB of them, and at
 * least one), as a receiver's tensors land in the N pool blocks of its N receives in flight:
 * the bound of `tensor` at a size whose destinations no longer stay in the copying core's
 * cache, where `raw` writes one destination again and again (README, "Tools").
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tfab/status.h>

#include "perf.h"
#include "util/time.h"

/*
 * Called through a volatile pointer, the copy is opaque to the compiler: it can neither
 * inline a small one, nor merge the copies of the loop into one, nor drop copies into a
 * buffer that is freed unread. The call reaches glibc's own memcpy, as a transport's would.
 */
static void *(*volatile copy_fn)(void *, const void *, size_t) = memcpy;

/* Destinations of --window n at a size: at most 256 MiB of them, and at least one. */
static unsigned dests_of(unsigned n, size_t size)
{
	size_t most = (256u << 20) / (size ? size : 1);

	if (!n)
		return 1;
	return n <= most ? n : most ? (unsigned)most : 1;
}

static int memcpy_size(const struct perf_opts *o, size_t size, struct perf_result *res)
{
	unsigned iters = o->iters ? o->iters : perf_default_iters(size);
	unsigned warm = iters / 10 ? iters / 10 : 1, ndst = dests_of(o->window, size);
	size_t len = size ? size : 1;
	uint8_t *src = NULL, **dst = calloc(ndst, sizeof(*dst));
	uint64_t t0, t1;
	int rc = 0;

	if (!dst || posix_memalign((void **)&src, 4096, len)) {
		rc = -ENOMEM;
		goto out;
	}
	for (unsigned d = 0; d < ndst; d++)
		if (posix_memalign((void **)&dst[d], 4096, len)) {
			rc = -ENOMEM;
			goto out;
		}
	/* Touch every page of all; with --verify the source carries a pattern and the
	 * destinations its complement, so that every byte must be copied to match. */
	if (o->verify)
		perf_fill(src, len, size);
	else
		memset(src, 0xa5, len);
	for (unsigned d = 0; d < ndst; d++) {
		if (o->verify)
			for (size_t i = 0; i < len; i++)
				dst[d][i] = (uint8_t)~src[i];
		else
			memset(dst[d], 0, len);
	}
	for (unsigned i = 0; i < warm; i++)
		copy_fn(dst[i % ndst], src, size);
	t0 = tfab__now_ns();
	for (unsigned i = 0; i < iters; i++)
		copy_fn(dst[i % ndst], src, size);
	t1 = tfab__now_ns();
#ifdef TFAB_PERF_DAMAGE
	/* the test build: every copy but an empty one ends spoiled, for --verify to find */
	if (size)
		dst[(iters - 1) % ndst][size / 2] ^= 1;
#endif

	memset(res, 0, sizeof(*res));
	res->bytes = size;
	res->iters = iters;
	res->window = ndst;
	if (t1 == t0)
		t1 = t0 + 1;
	res->gbps = (double)size * iters * 8.0 / (double)(t1 - t0);
	res->rate = (double)iters * 1e9 / (double)(t1 - t0);
	res->lat_us = (double)(t1 - t0) / 1000.0 / iters;
	if (o->verify) {
		/* a destination the copies never reached (fewer copies than destinations) stays
		 * the complement: only those reached are checked */
		unsigned reached = warm + iters < ndst ? warm + iters : ndst;

		res->verified = true;
		for (unsigned d = 0; d < reached && res->verified; d++)
			res->verified =
			    memcmp(dst[d], src, size) == 0 && perf_check(dst[d], size, size);
		if (!res->verified)
			fprintf(stderr,
				"tfab-perf memcpy: the %zu-byte copy differs from its source\n",
				size);
	}
out:
	if (rc)
		fprintf(stderr, "tfab-perf memcpy: no memory for %u %zu-byte buffers\n", ndst + 1,
			size);
	for (unsigned d = 0; dst && d < ndst; d++)
		free(dst[d]);
	free(dst);
	free(src);
	return rc;
}

int perf_memcpy_run(const struct perf_opts *o)
{
	bool failed = false;

	if (!o->json) {
		printf("tfab-perf memcpy: one thread, libc memcpy from one buffer into `window` "
		       "buffers in turn, in one process (the bound of a same-host transfer)\n");
		printf("%12s %9s %7s %10s %10s %10s %10s   %s\n", "bytes", "iters", "window",
		       "GB/s", "Gb/s", "Mmsg/s", "lat_us", "verified");
	}
	for (int i = 0; i < o->nsizes; i++) {
		struct perf_result r;
		int rc;

		if (o->progress)
			fprintf(stderr, "\r  running %zu bytes...", o->sizes[i]);
		rc = memcpy_size(o, o->sizes[i], &r);
		if (o->progress)
			fprintf(stderr, "\r%40s\r", "");
		if (rc)
			return rc;
		perf_print_result(o, "memcpy", "memcpy", "memcpy", "libc", "one thread", &r);
		failed |= o->verify && !r.verified;
	}
	return failed ? -EIO : 0;
}
