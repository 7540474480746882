/*
 * ofi-ref: a plain libfabric reference for `tfab-perf raw`, with no tfab code in it, so that
 * one run can report tfab's figures as a ratio of what libfabric itself gets on this machine.
 *
 * Build: gcc -O2 -std=c11 -D_GNU_SOURCE tools/bench/ofi-ref.c -lfabric -o ofi-ref
 *
 * It forks a local pair: the parent is the client, the child the server. A socketpair carries
 * the fi_getname addresses and each side's target region (address and key) once, then stays
 * quiet until the end, so data or EOF on it means the other side went away.
 *   1. bandwidth: the client streams WARMUP fi_writedata (immediate = index) with WINDOW in
 *      flight and waits for all of them to complete; the clock starts there. It then streams
 *      ITERS more the same way; the server counts WARMUP+ITERS remote CQ data completions and
 *      answers with a zero-length ACK write; the clock stops when the ACK lands.
 *   2. latency: ping-pong of the same size (fi_inject_writedata when it fits the inject size),
 *      WARMUP/10 rounds (at least 1) untimed, then LAT_ITERS timed (default min(ITERS, 1000),
 *      as tfab-perf does); one-way latency is half a round trip.
 *   3. the client drains its own writes and says so on the socket; the server writes DONE,
 *      waits for that write's completion and closes the socket; the client polls its CQ until
 *      it has seen DONE and the socket's EOF. tcp and shm are manual progress: a write only
 *      finishes while its target polls, hence this order.
 * Every wait gives up after -t seconds (60) with no completion, or when the other side goes away.
 * Both sides use what tfab's ofi backend uses: FI_EP_RDM, FI_RMA|FI_WRITE|FI_REMOTE_WRITE,
 * the FI_CONTEXT modes, FI_THREAD_DOMAIN, an AV table, one FI_CQ_FORMAT_DATA CQ for transmit
 * and receive; buffers from posix_memalign(4096), written before registration.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#define REF_VERSION FI_VERSION(1, 9)
#define REF_MAX_ADDR 256
#define REF_CQ_BATCH 32
#define REF_CTX_SPARE 64 /* contexts beyond the window: control writes, pongs */

#define IMM_ACK 0xffffff02u
#define IMM_DONE 0xffffff04u
#define IMM_PING 0x80000000u /* | round; bandwidth indices stay below it */

struct ref_opts {
	const char *prov;
	const char *domain;
	size_t size;
	unsigned iters, window, warmup, lat_iters;
	int timeout_s;
	bool json;
};

/* What each side sends the other over the socketpair. */
struct ref_hello {
	uint64_t raddr, rkey;
	uint32_t addrlen;
	uint8_t addr[REF_MAX_ADDR];
};

struct ref_side {
	const struct ref_opts *o;
	bool client;
	int sock;
	struct fi_info *infos, *fi;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_av *av;
	struct fid_cq *cq;
	struct fid_ep *ep;
	struct fid_mr *smr, *dmr;
	void *sdesc;
	uint8_t *src, *dst;
	size_t buf_len;
	fi_addr_t peer;
	uint64_t remote_raddr, remote_rkey;
	bool virt_addr;

	/* Free contexts for signalled writes; FI_CONTEXT modes need one live per write. */
	struct fi_context2 *ctx;
	struct fi_context2 **ctx_free;
	unsigned nctx, ctx_top;

	uint64_t posted, done; /* signalled writes posted, and their local completions */
	uint64_t bw_seen;      /* bandwidth writes landed here */
	int64_t ping_seen;     /* last ping or pong round landed here, -1 before */
	uint32_t ctrl;	       /* last control immediate, 0 when none pending */
	uint64_t deadline;
	unsigned polls;
	bool sock_quiet; /* nothing may arrive on the socket now */
	const char *who;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void arm(struct ref_side *s)
{
	s->deadline = now_ns() + (uint64_t)s->o->timeout_s * 1000000000ull;
}

static int fail(struct ref_side *s, const char *what, int fi_rc)
{
	fprintf(stderr, "ofi-ref %s: %s: %s\n", s->who, what, fi_strerror(-fi_rc));
	return -1;
}

static int parse_size(const char *text, uint64_t *value_p)
{
	unsigned long long v, mult = 1;
	char *end;

	if (*text == '-' || *text == '\0')
		return -1;
	errno = 0;
	v = strtoull(text, &end, 0);
	if (errno || end == text)
		return -1;
	switch (*end) {
	case 'k':
	case 'K':
		mult = 1ull << 10;
		end++;
		break;
	case 'm':
	case 'M':
		mult = 1ull << 20;
		end++;
		break;
	case 'g':
	case 'G':
		mult = 1ull << 30;
		end++;
		break;
	}
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end != '\0' || v > UINT64_MAX / mult)
		return -1;
	*value_p = v * mult;
	return 0;
}

/* Data or EOF on the socket while it should be quiet: the other side went away. */
static bool peer_gone(struct ref_side *s)
{
	struct pollfd pfd = {.fd = s->sock, .events = POLLIN};

	if (!s->sock_quiet || (++s->polls & 255))
		return false;
	return poll(&pfd, 1, 0) > 0;
}

/* Poll the CQ once; -1 when an error, the deadline or a vanished peer ends the run. */
static int cq_poll(struct ref_side *s)
{
	struct fi_cq_data_entry e[REF_CQ_BATCH];
	ssize_t got = fi_cq_read(s->cq, e, REF_CQ_BATCH);

	if (got == -FI_EAVAIL) {
		struct fi_cq_err_entry err = {0};
		char buf[256];
		const char *msg;

		if (fi_cq_readerr(s->cq, &err, 0) < 0)
			return fail(s, "fi_cq_readerr", (int)got);
		msg = fi_cq_strerror(s->cq, err.prov_errno, err.err_data, buf, sizeof(buf));
		fprintf(stderr, "ofi-ref %s: completion error: %s (%s)\n", s->who,
			fi_strerror(err.err), msg ? msg : "");
		return -1;
	}
	if (got < 0 && got != -FI_EAGAIN)
		return fail(s, "fi_cq_read", (int)got);
	for (ssize_t i = 0; i < got; i++) {
		/* sockets flags its own writes FI_REMOTE_CQ_DATA too: local ones first. */
		if (e[i].flags & (FI_WRITE | FI_SEND | FI_READ)) {
			struct fi_context2 *c = e[i].op_context;

			if (c >= s->ctx && c < s->ctx + s->nctx) {
				s->ctx_free[s->ctx_top++] = c;
				s->done++;
			}
		} else if (e[i].flags & FI_REMOTE_CQ_DATA) {
			uint32_t imm = (uint32_t)e[i].data;

			if (imm >= IMM_ACK)
				s->ctrl = imm;
			else if (imm & IMM_PING)
				s->ping_seen = imm & ~IMM_PING;
			else
				s->bw_seen++;
		}
	}
	/* The bound is on silence, not on a whole phase. */
	if (got > 0) {
		arm(s);
	} else if (now_ns() > s->deadline) {
		fprintf(stderr, "ofi-ref %s: no completion for %d s\n", s->who, s->o->timeout_s);
		return -1;
	}
	if (peer_gone(s)) {
		fprintf(stderr, "ofi-ref %s: the other process went away\n", s->who);
		return -1;
	}
	return 0;
}

/*
 * Post one write to the peer's region at offset 0. Returns 0, 1 for "busy, poll and retry"
 * (only when may_busy), or -1.
 */
static int post(struct ref_side *s, size_t len, uint32_t imm, bool inject, bool may_busy)
{
	ssize_t rc;

	for (;;) {
		if (inject) {
			rc = fi_inject_writedata(s->ep, s->src, len, imm, s->peer, s->remote_raddr,
						 s->remote_rkey);
		} else if (s->ctx_top == 0) {
			rc = -FI_EAGAIN;
		} else {
			struct fi_context2 *c = s->ctx_free[s->ctx_top - 1];

			rc = fi_writedata(s->ep, s->src, len, s->sdesc, imm, s->peer,
					  s->remote_raddr, s->remote_rkey, c);
			if (rc == 0) {
				s->ctx_top--;
				s->posted++;
			}
		}
		if (rc == 0)
			return 0;
		if (rc != -FI_EAGAIN)
			return fail(s, inject ? "fi_inject_writedata" : "fi_writedata", (int)rc);
		if (may_busy)
			return 1;
		if (cq_poll(s))
			return -1;
	}
}

static int drain(struct ref_side *s)
{
	while (s->done < s->posted)
		if (cq_poll(s))
			return -1;
	return 0;
}

/* Stream n bandwidth writes, indices from first, `window` in flight; wait for all. */
static int stream(struct ref_side *s, uint64_t first, uint64_t n)
{
	uint64_t base = s->done, sent = 0;

	while (s->done - base < n) {
		while (sent < n && s->posted - s->done < s->o->window) {
			int rc = post(s, s->o->size, (uint32_t)(first + sent), false, true);

			if (rc < 0)
				return -1;
			if (rc > 0)
				break;
			sent++;
		}
		if (cq_poll(s))
			return -1;
	}
	return 0;
}

static int wait_ctrl(struct ref_side *s, uint32_t want)
{
	while (!s->ctrl)
		if (cq_poll(s))
			return -1;
	if (s->ctrl != want) {
		fprintf(stderr, "ofi-ref %s: expected control 0x%x, got 0x%x\n", s->who, want,
			s->ctrl);
		return -1;
	}
	s->ctrl = 0;
	return 0;
}

static int wait_ping(struct ref_side *s, int64_t round)
{
	while (s->ping_seen < round)
		if (cq_poll(s))
			return -1;
	return 0;
}

static unsigned lat_warmup(const struct ref_opts *o)
{
	return o->warmup / 10 ? o->warmup / 10 : 1;
}

static int run_client(struct ref_side *s, double *gbps_p, double *lat_us_p)
{
	const struct ref_opts *o = s->o;
	bool inject = o->size <= s->fi->tx_attr->inject_size;
	unsigned lw = lat_warmup(o);
	uint64_t t0, t1;

	arm(s);
	if (stream(s, 0, o->warmup))
		return -1;
	t0 = now_ns();
	if (stream(s, o->warmup, o->iters) || wait_ctrl(s, IMM_ACK))
		return -1;
	t1 = now_ns();
	*gbps_p = (double)o->size * o->iters * 8.0 / (double)(t1 - t0);

	arm(s);
	for (unsigned i = 0; i < lw + o->lat_iters; i++) {
		if (i == lw)
			t0 = now_ns();
		if (post(s, o->size, IMM_PING | i, inject, false) || wait_ping(s, i))
			return -1;
	}
	t1 = now_ns();
	*lat_us_p = (double)(t1 - t0) / 1000.0 / (2.0 * o->lat_iters);
	return 0;
}

static int run_server(struct ref_side *s)
{
	const struct ref_opts *o = s->o;
	bool inject = o->size <= s->fi->tx_attr->inject_size;
	unsigned lw = lat_warmup(o);

	arm(s);
	while (s->bw_seen < (uint64_t)o->warmup + o->iters)
		if (cq_poll(s))
			return -1;
	if (post(s, 0, IMM_ACK, false, false))
		return -1;
	arm(s);
	for (unsigned i = 0; i < lw + o->lat_iters; i++) {
		if (wait_ping(s, i) || post(s, o->size, IMM_PING | i, inject, false))
			return -1;
	}
	return 0;
}

/* The end; see the header comment. */
static int finish(struct ref_side *s)
{
	struct pollfd pfd = {.fd = s->sock, .events = POLLIN};
	char byte = 'F';

	arm(s);
	if (drain(s))
		return -1;
	s->sock_quiet = false;
	if (s->client) {
		bool eof = false;

		if (write(s->sock, &byte, 1) != 1) {
			perror("ofi-ref client: socket");
			return -1;
		}
		while (!s->ctrl || !eof) {
			if (cq_poll(s))
				return -1;
			if (!eof && poll(&pfd, 1, 0) > 0)
				eof = read(s->sock, &byte, 1) <= 0;
		}
		return s->ctrl == IMM_DONE ? 0 : -1;
	}
	for (;;) {
		if (cq_poll(s))
			return -1;
		if (poll(&pfd, 1, 0) > 0) {
			if (read(s->sock, &byte, 1) != 1) {
				fprintf(stderr, "ofi-ref server: the client went away\n");
				return -1;
			}
			break;
		}
	}
	if (post(s, 0, IMM_DONE, false, false) || drain(s))
		return -1;
	close(s->sock);
	s->sock = -1;
	return 0;
}

static int sock_io(int fd, void *buf, size_t len, bool out, int timeout_s)
{
	uint8_t *p = buf;
	struct pollfd pfd = {.fd = fd, .events = out ? POLLOUT : POLLIN};

	while (len) {
		ssize_t n;

		if (poll(&pfd, 1, timeout_s * 1000) <= 0)
			return -1;
		n = out ? write(fd, p, len) : read(fd, p, len);
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* The info to open: -d if given, else "lo" when there is one, else the first. */
static struct fi_info *pick_info(struct ref_side *s)
{
	const char *want = s->o->domain;
	struct fi_info *lo = NULL;

	for (struct fi_info *fi = s->infos; fi; fi = fi->next) {
		const char *name = fi->domain_attr->name ? fi->domain_attr->name : "";

		if (want && strcmp(name, want) == 0)
			return fi;
		if (!want && !lo && strcmp(name, "lo") == 0)
			lo = fi;
	}
	if (want) {
		fprintf(stderr, "ofi-ref %s: no domain named %s; there are:", s->who, want);
		for (struct fi_info *fi = s->infos; fi; fi = fi->next) {
			struct fi_info *prev = fi == s->infos ? NULL : s->infos;

			/* IPv4 and IPv6 variants repeat a domain: name each once. */
			while (prev && prev != fi &&
			       strcmp(prev->domain_attr->name, fi->domain_attr->name))
				prev = prev->next;
			if (!prev || prev == fi)
				fprintf(stderr, " %s/%s", fi->fabric_attr->prov_name,
					fi->domain_attr->name);
		}
		fprintf(stderr, "\n");
		return NULL;
	}
	return lo ? lo : s->infos;
}

static int side_open(struct ref_side *s)
{
	struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_DATA, .wait_obj = FI_WAIT_NONE};
	struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
	struct fi_info *hints = fi_allocinfo();
	struct ref_hello me = {0}, peer;
	size_t addrlen = sizeof(me.addr);
	int rc;

	if (!hints)
		return -1;
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE;
	hints->mode = FI_CONTEXT | FI_CONTEXT2;
	hints->domain_attr->mr_mode =
	    FI_MR_VIRT_ADDR | FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	hints->domain_attr->threading = FI_THREAD_DOMAIN;
	if (s->o->prov)
		hints->fabric_attr->prov_name = strdup(s->o->prov);
	rc = fi_getinfo(REF_VERSION, NULL, NULL, 0, hints, &s->infos);
	fi_freeinfo(hints);
	if (rc)
		return fail(s, "fi_getinfo", rc);
	s->fi = pick_info(s);
	if (!s->fi)
		return -1;
	if (s->o->size > s->fi->ep_attr->max_msg_size) {
		fprintf(stderr, "ofi-ref %s: %zu bytes is over the max message size %zu\n", s->who,
			s->o->size, s->fi->ep_attr->max_msg_size);
		return -1;
	}
	if (s->fi->domain_attr->cq_data_size < 4) {
		fprintf(stderr, "ofi-ref %s: cq_data_size %zu is under 4 bytes\n", s->who,
			s->fi->domain_attr->cq_data_size);
		return -1;
	}
	s->virt_addr = (s->fi->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;

	if ((rc = fi_fabric(s->fi->fabric_attr, &s->fabric, NULL)))
		return fail(s, "fi_fabric", rc);
	if ((rc = fi_domain(s->fabric, s->fi, &s->domain, NULL)))
		return fail(s, "fi_domain", rc);
	if ((rc = fi_av_open(s->domain, &av_attr, &s->av, NULL)))
		return fail(s, "fi_av_open", rc);
	if ((rc = fi_cq_open(s->domain, &cq_attr, &s->cq, NULL)))
		return fail(s, "fi_cq_open", rc);
	if ((rc = fi_endpoint(s->domain, s->fi, &s->ep, NULL)))
		return fail(s, "fi_endpoint", rc);
	if ((rc = fi_ep_bind(s->ep, &s->av->fid, 0)))
		return fail(s, "fi_ep_bind(av)", rc);
	if ((rc = fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV)))
		return fail(s, "fi_ep_bind(cq)", rc);
	if ((rc = fi_enable(s->ep)))
		return fail(s, "fi_enable", rc);
	if ((rc = fi_getname(&s->ep->fid, me.addr, &addrlen)))
		return fail(s, "fi_getname", rc);
	me.addrlen = (uint32_t)addrlen;

	s->buf_len = s->o->size ? s->o->size : 1;
	if (posix_memalign((void **)&s->src, 4096, s->buf_len) ||
	    posix_memalign((void **)&s->dst, 4096, s->buf_len)) {
		fprintf(stderr, "ofi-ref %s: out of memory for %zu bytes\n", s->who, s->buf_len);
		return -1;
	}
	memset(s->src, 0, s->buf_len);
	memset(s->dst, 0, s->buf_len);
	/* Keys: ours unless FI_MR_PROV_KEY, then fi_mr_key() has the provider's. */
	if ((rc = fi_mr_reg(s->domain, s->src, s->buf_len, FI_WRITE, 0, 1, 0, &s->smr, NULL)))
		return fail(s, "fi_mr_reg(src)", rc);
	rc = fi_mr_reg(s->domain, s->dst, s->buf_len, FI_REMOTE_WRITE, 0, 2, 0, &s->dmr, NULL);
	if (rc)
		return fail(s, "fi_mr_reg(dst)", rc);
	s->sdesc = fi_mr_desc(s->smr);
	me.raddr = s->virt_addr ? (uint64_t)(uintptr_t)s->dst : 0;
	me.rkey = fi_mr_key(s->dmr);

	s->nctx = s->o->window + REF_CTX_SPARE;
	s->ctx = calloc(s->nctx, sizeof(*s->ctx));
	s->ctx_free = calloc(s->nctx, sizeof(*s->ctx_free));
	if (!s->ctx || !s->ctx_free)
		return -1;
	for (unsigned i = 0; i < s->nctx; i++)
		s->ctx_free[s->ctx_top++] = &s->ctx[i];

	if (sock_io(s->sock, &me, sizeof(me), true, s->o->timeout_s) ||
	    sock_io(s->sock, &peer, sizeof(peer), false, s->o->timeout_s)) {
		fprintf(stderr, "ofi-ref %s: exchanging addresses failed\n", s->who);
		return -1;
	}
	if (peer.addrlen == 0 || peer.addrlen > REF_MAX_ADDR)
		return -1;
	s->remote_raddr = peer.raddr;
	s->remote_rkey = peer.rkey;
	rc = fi_av_insert(s->av, peer.addr, 1, &s->peer, 0, NULL);
	if (rc != 1)
		return fail(s, "fi_av_insert", rc < 0 ? rc : -FI_EINVAL);
	s->sock_quiet = true;
	return 0;
}

static void side_close(struct ref_side *s)
{
	/* MRs before the endpoint: the other order crashes tcp;ofi_rxm (1.17) after a failure. */
	if (s->smr)
		fi_close(&s->smr->fid);
	if (s->dmr)
		fi_close(&s->dmr->fid);
	if (s->ep)
		fi_close(&s->ep->fid);
	if (s->av)
		fi_close(&s->av->fid);
	if (s->cq)
		fi_close(&s->cq->fid);
	if (s->domain)
		fi_close(&s->domain->fid);
	if (s->fabric)
		fi_close(&s->fabric->fid);
	if (s->infos)
		fi_freeinfo(s->infos);
	if (s->sock >= 0)
		close(s->sock);
	free(s->ctx);
	free(s->ctx_free);
	free(s->src);
	free(s->dst);
}

static void report(const struct ref_side *s, double gbps, double lat_us)
{
	const struct ref_opts *o = s->o;
	const char *prov = s->fi->fabric_attr->prov_name;
	const char *dom = s->fi->domain_attr->name;

	if (o->json)
		printf("{\"test\":\"ofi-ref\",\"fabric\":\"%s\",\"domain\":\"%s\",\"bytes\":%zu,"
		       "\"iters\":%u,\"window\":%u,\"gbps\":%.4f,\"GBps\":%.4f,\"lat_us\":%.3f}\n",
		       prov, dom, o->size, o->iters, o->window, gbps, gbps / 8.0, lat_us);
	else
		printf("ofi-ref %s on %s: %zu bytes, %u iters, window %u: %.4f GB/s (%.3f Gb/s), "
		       "%.3f us one-way\n",
		       prov, dom, o->size, o->iters, o->window, gbps / 8.0, gbps, lat_us);
	fflush(stdout);
}

/* Wait for the server child, at most 10 s, then kill it. */
static int reap(pid_t pid)
{
	uint64_t deadline = now_ns() + 10000000000ull;
	int status;

	for (;;) {
		pid_t r = waitpid(pid, &status, WNOHANG);

		if (r == pid)
			return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
		if (r < 0)
			return -1;
		if (now_ns() > deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			fprintf(stderr, "ofi-ref: the server process did not exit; killed it\n");
			return -1;
		}
		usleep(10000);
	}
}

static void usage(FILE *f)
{
	fprintf(f, "usage: ofi-ref [options]\n"
		   "  Plain libfabric write-with-immediate bandwidth and latency, local pair.\n"
		   "  -p NAME      libfabric provider (hints prov_name), e.g. shm, tcp\n"
		   "  -d NAME      domain, e.g. lo (default: lo when present, else the first)\n"
		   "  -s SIZE      bytes per write, K/M/G suffixes (default 8)\n"
		   "  -n ITERS     timed bandwidth writes (default 1000)\n"
		   "  -w WINDOW    writes in flight (default 16)\n"
		   "  -W WARMUP    untimed writes first (default ITERS/10, at least 1)\n"
		   "  -l N         timed ping-pong rounds (default min(ITERS, 1000))\n"
		   "  -t SECONDS   longest wait with no completion (default 60)\n"
		   "  --json       one JSON object\n");
}

static int parse_args(int argc, char **argv, struct ref_opts *o)
{
	static const struct option longs[] = {
	    {"json", no_argument, NULL, 'j'}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
	long warmup = -1, lat = -1;
	uint64_t v;
	int c;

	while ((c = getopt_long(argc, argv, "p:d:s:n:w:W:l:t:h", longs, NULL)) != -1) {
		switch (c) {
		case 'p':
			o->prov = optarg;
			break;
		case 'd':
			o->domain = optarg;
			break;
		case 's':
			if (parse_size(optarg, &v) || v > (1ull << 34))
				goto bad;
			o->size = (size_t)v;
			break;
		case 'n':
		case 'w':
		case 'W':
		case 'l':
		case 't':
			if (parse_size(optarg, &v) || v > 0x7fffffff || (v == 0 && c != 'W'))
				goto bad;
			if (c == 'n')
				o->iters = (unsigned)v;
			else if (c == 'w')
				o->window = (unsigned)v;
			else if (c == 'W')
				warmup = (long)v;
			else if (c == 'l')
				lat = (long)v;
			else
				o->timeout_s = (int)v;
			break;
		case 'j':
			o->json = true;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			return -1;
		}
	}
	if (optind != argc)
		goto bad;
	if (o->window > 65536)
		goto bad;
	o->warmup = warmup >= 0 ? (unsigned)warmup : o->iters / 10;
	if (o->warmup < 1)
		o->warmup = 1;
	o->lat_iters = lat > 0 ? (unsigned)lat : (o->iters < 1000 ? o->iters : 1000);
	if ((uint64_t)o->warmup + o->iters >= IMM_PING || o->warmup + o->lat_iters >= IMM_PING)
		goto bad;
	return 0;
bad:
	fprintf(stderr, "ofi-ref: bad argument%s%s\n", optarg ? " " : "", optarg ? optarg : "");
	usage(stderr);
	return -1;
}

int main(int argc, char **argv)
{
	struct ref_opts o = {.size = 8, .iters = 1000, .window = 16, .timeout_s = 60};
	struct ref_side s = {.o = &o, .sock = -1, .ping_seen = -1};
	double gbps = 0, lat_us = 0;
	int sv[2], rc;
	pid_t pid;

	if (parse_args(argc, argv, &o))
		return 2;
	/* Both sides open libfabric after the fork: nothing of it is shared. */
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) {
		perror("ofi-ref: socketpair");
		return 1;
	}
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		perror("ofi-ref: fork");
		return 1;
	}
	s.client = pid > 0;
	s.who = s.client ? "client" : "server";
	s.sock = sv[s.client ? 0 : 1];
	close(sv[s.client ? 1 : 0]);

	rc = side_open(&s);
	if (rc == 0)
		rc = s.client ? run_client(&s, &gbps, &lat_us) : run_server(&s);
	if (rc == 0)
		rc = finish(&s);
	if (rc == 0 && s.client)
		report(&s, gbps, lat_us);
	side_close(&s);
	if (!s.client)
		_exit(rc ? 1 : 0);
	if (reap(pid) != 0) {
		fprintf(stderr, "ofi-ref: the server side failed\n");
		rc = -1;
	}
	return rc ? 1 : 0;
}
