/*
 * tfab-perf: transfer benchmarks between two processes. By default it forks a local pair
 * (over a socketpair for the bootstrap); --listen PORT and --connect HOST:PORT run the two
 * sides on two machines. The client drives: it sends the plan (test, sizes, iterations,
 * window) to the server, and prints one row (or one JSON object) per size. The memcpy test,
 * the bound of the others on one host, runs in the client's process alone, before the pair.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tfab/tfab.h>

#include "json.h"
#include "perf.h"
#include "util/config.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/time.h"

#define PLAN_MAGIC 0x74666270u /* "tfbp" */
#define HELLO_MAGIC 0x74666268u
#define MSG_MAX 4096

/* Little-endian encoding for the bootstrap messages. */
struct wire {
	uint8_t buf[MSG_MAX];
	size_t len, pos;
	bool bad;
};

static void put(struct wire *w, uint64_t v, int bytes)
{
	if (w->len + (size_t)bytes > sizeof(w->buf)) {
		w->bad = true;
		return;
	}
	for (int i = 0; i < bytes; i++)
		w->buf[w->len++] = (uint8_t)(v >> (8 * i));
}

static uint64_t get(struct wire *w, int bytes)
{
	uint64_t v = 0;

	if (w->pos + (size_t)bytes > w->len) {
		w->bad = true;
		return 0;
	}
	for (int i = 0; i < bytes; i++)
		v |= (uint64_t)w->buf[w->pos++] << (8 * i);
	return v;
}

static int send_wire(int fd, struct wire *w, int timeout_ms)
{
	return w->bad ? -EMSGSIZE : tfab__sock_send_msg(fd, w->buf, (uint32_t)w->len, timeout_ms);
}

static int recv_wire(int fd, struct wire *w, int timeout_ms)
{
	uint32_t len = 0;
	int rc = tfab__sock_recv_msg(fd, w->buf, sizeof(w->buf), &len, timeout_ms);

	w->len = len;
	w->pos = 0;
	w->bad = false;
	return rc;
}

static void usage(FILE *f)
{
	/* Two strings: C99 promises only 4095 characters of one. */
	fputs(
	    "usage: tfab-perf [memcpy|raw|tensor|all|allreduce] [options]\n"
	    "  Measures bandwidth and latency between two processes:\n"
	    "    memcpy   one thread copying between two buffers in one process: the bound of\n"
	    "             a same-host transfer (no fabric, no second process)\n"
	    "    raw      writes with immediate through the provider interface\n"
	    "    tensor   whole tensors through the engine (request, meta-data, content write)\n"
	    "    all      memcpy, raw, then tensor (the default)\n"
	    "  A comma-separated list (memcpy,raw) runs those, always in the order above.\n"
	    "  Without --listen/--connect it starts a local pair of processes itself.\n"
	    "    allreduce  --ranks N local processes in a world allreduce float32 (sum), as\n"
	    "             nccl-tests reports it: algorithm, lat_us (one allreduce), algbw_GBps\n"
	    "             (bytes / time) and busbw_GBps (algbw x 2(N-1)/N); sizes default\n"
	    "             8,64,512,4K,32K,256K,1M,8M,64M; run alone\n\n"
	    "  -s, --sizes LIST     sizes to run, e.g. 8,4K,1M,64M (default 8,4K,64K,1M,64M)\n"
	    "  -n, --iters N        transfers per size (default about 2 GiB per size, at least 32\n"
	    "                       and at most 100000), after a tenth as many to warm up\n"
	    "                       (tensor: at least twice the receives a phase keeps out,\n"
	    "                       so that the pool's blocks are all in use before the clock\n"
	    "                       starts)\n"
	    "  -w, --window N       transfers in flight for bandwidth (default 16, but at most\n"
	    "                       256 MiB and at least 2 in flight; tensor: at most 64);\n"
	    "                       memcpy: destinations copied into in turn (default 1, at\n"
	    "                       most 256 MiB of them)\n"
	    "  -p, --provider P     TFAB_PROVIDER for this run: auto, verbs, ofi, ofi:<name>\n"
	    "                       (default: TFAB_PROVIDER from the environment, else auto)\n"
	    "      --verify         check every byte that arrives (default off): raw checks the\n"
	    "                       data and every immediate, tensor every tensor against the\n"
	    "                       pattern its sender filled it with, memcpy the destination\n"
	    "                       against the source after the copies\n",
	    f);
	fputs(
	    "      --device D       tensor test buffers: cpu (default) or cuda (GPU memory, sent\n"
	    "                       and received through the host proxy path)\n"
	    "      --heap-dst       write into malloc'd destinations: raw even where the backend\n"
	    "                       offers memory that peers write with one copy (mem_alloc:\n"
	    "                       shm), tensor into the caller's tensors rather than ones the\n"
	    "                       library allocates from its pool (--device cuda always does)\n"
	    "                       (default off)\n"
	    "      --no-request[=D] tensor: no-request mode (tfab_recv_ahead): the receives keep\n"
	    "                       D requests standing ahead (default 16, at most the window),\n"
	    "                       so senders write at once; the ping-pong then waits for a\n"
	    "                       send's verdict D/2 + 2 rounds later; receives into library\n"
	    "                       tensors only (not --heap-dst, --device cuda) (default off)\n"
	    "      --request-bytes N raw: each side also writes an N-byte message per ping-pong\n"
	    "                       round, after its ping, as a tensor fetch's request goes\n"
	    "                       after the send: the fabric's own bound for the tensor\n"
	    "                       ping-pong (at most 1024; default 0: none)\n"
	    "      --breakdown      tensor: each side prints, per size, where its thread spent\n"
	    "                       the ping-pong's rounds: progress calls that found work\n"
	    "                       (callbacks included), those that found none, tfab_send,\n"
	    "                       tfab_recv, and the tool's own loop (on stderr)\n"
	    "      --ranks N        allreduce: local ranks to start (default 4, at most 1024)\n"
	    "      --footprint      allreduce: after the sizes, a row for the world: the\n"
	    "                       slowest rank's join (ms) and per rank the memory of its\n"
	    "                       own and its share of shared memory (kB), fds and peers\n"
	    "                       connected (means) (default off)\n"
	    "      --timeout MS     bound of every wait (default 120000)\n"
	    "      --json           one JSON object per size (default: a table)\n"
	    "      --listen PORT    be the server, on this TCP port (default: a local pair)\n"
	    "      --connect H:P    be the client of a server at host:port\n"
	    "  -h, --help\n\n"
	    "JSON fields: test, path, backend, fabric, domain, bytes, iters, window, gbps "
	    "(gigabits per\n"
	    "second), GBps (gigabytes per second), rate (transfers per second, tensor: fetches,\n"
	    "in the bandwidth phase), lat_us (one-way: half a round trip), verified\n"
	    "(null without --verify); tensor adds copies, meta_misses and writes_per_fetch (fabric "
	    "writes of\n"
	    "both sides per tensor fetch, over the size's fetches). memcpy rows have\n"
	    "backend memcpy, window the destinations and lat_us the time of one copy; -n, -s,\n"
	    "-w and --verify apply to them, the fabric's options do not. allreduce objects\n"
	    "have test, path, algo, bytes, ranks, iters, lat_us, algbw_GBps, busbw_GBps and\n"
	    "verified; --footprint's has test \"world\", path, ranks, join_ms, rss_kb, shm_kb,\n"
	    "fds, peers and peers_max.\n",
	    f);
}

static int parse_sizes(const char *text, struct perf_opts *o)
{
	char *copy = strdup(text), *save = NULL, *tok;
	int rc = 0;

	if (!copy)
		return -ENOMEM;
	o->nsizes = 0;
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		uint64_t v;

		if (o->nsizes == PERF_MAX_SIZES || tfab__parse_size(tok, &v) || v > (1ull << 34)) {
			rc = -EINVAL;
			break;
		}
		o->sizes[o->nsizes++] = (size_t)v;
	}
	free(copy);
	return rc || o->nsizes == 0 ? -EINVAL : 0;
}

/* A test, or a comma-separated list of them. */
static int parse_tests(const char *text, unsigned *tests_p)
{
	static const struct {
		const char *name;
		unsigned tests;
	} names[] = {
	    {"memcpy", PERF_MEMCPY},	   {"raw", PERF_RAW},
	    {"tensor", PERF_TENSOR},	   {"all", PERF_MEMCPY | PERF_RAW | PERF_TENSOR},
	    {"allreduce", PERF_ALLREDUCE},
	};
	const char *p = text;
	unsigned tests = 0;

	for (;;) {
		size_t len = strcspn(p, ",");
		unsigned t = 0;

		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
			if (strlen(names[i].name) == len && strncmp(p, names[i].name, len) == 0)
				t = names[i].tests;
		if (!t) {
			fprintf(stderr,
				"tfab-perf: unknown test '%.*s' (tests: memcpy, raw, tensor, all, "
				"allreduce)\n",
				(int)len, p);
			return -EINVAL;
		}
		tests |= t;
		if (!p[len])
			break;
		p += len + 1;
	}
	*tests_p = tests;
	return 0;
}

static int parse_args(int argc, char **argv, struct perf_opts *o, const char **provider_p)
{
	enum {
		OPT_VERIFY = 256,
		OPT_TIMEOUT,
		OPT_JSON,
		OPT_LISTEN,
		OPT_CONNECT,
		OPT_DEVICE,
		OPT_HEAP_DST,
		OPT_NO_REQUEST,
		OPT_REQUEST_BYTES,
		OPT_BREAKDOWN,
		OPT_RANKS,
		OPT_FOOTPRINT
	};
	static const struct option longopts[] = {
	    {"sizes", required_argument, NULL, 's'},
	    {"iters", required_argument, NULL, 'n'},
	    {"window", required_argument, NULL, 'w'},
	    {"provider", required_argument, NULL, 'p'},
	    {"verify", no_argument, NULL, OPT_VERIFY},
	    {"heap-dst", no_argument, NULL, OPT_HEAP_DST},
	    {"no-request", optional_argument, NULL, OPT_NO_REQUEST},
	    {"request-bytes", required_argument, NULL, OPT_REQUEST_BYTES},
	    {"breakdown", no_argument, NULL, OPT_BREAKDOWN},
	    {"device", required_argument, NULL, OPT_DEVICE},
	    {"timeout", required_argument, NULL, OPT_TIMEOUT},
	    {"ranks", required_argument, NULL, OPT_RANKS},
	    {"footprint", no_argument, NULL, OPT_FOOTPRINT},
	    {"json", no_argument, NULL, OPT_JSON},
	    {"listen", required_argument, NULL, OPT_LISTEN},
	    {"connect", required_argument, NULL, OPT_CONNECT},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	bool sizes_given = false;
	uint64_t v;
	int c;

	parse_sizes("8,4K,64K,1M,64M", o);
	o->tests = PERF_MEMCPY | PERF_RAW | PERF_TENSOR;
	o->timeout_ms = 120000;
	while ((c = getopt_long(argc, argv, "s:n:w:p:h", longopts, NULL)) != -1) {
		switch (c) {
		case 's':
			sizes_given = true;
			if (parse_sizes(optarg, o)) {
				fprintf(stderr, "tfab-perf: bad size list '%s'\n", optarg);
				return 2;
			}
			break;
		case 'n':
		case 'w':
		case OPT_TIMEOUT:
			if (tfab__parse_size(optarg, &v) || v == 0 || v > 0x7fffffff) {
				fprintf(stderr, "tfab-perf: bad number '%s'\n", optarg);
				return 2;
			}
			if (c == 'n')
				o->iters = (unsigned)v;
			else if (c == 'w')
				o->window = (unsigned)v;
			else
				o->timeout_ms = (int)v;
			break;
		case 'p':
			*provider_p = optarg;
			break;
		case OPT_VERIFY:
			o->verify = true;
			break;
		case OPT_HEAP_DST:
			o->heap_dst = true;
			break;
		case OPT_BREAKDOWN:
			o->breakdown = true;
			break;
		case OPT_FOOTPRINT:
			o->footprint = true;
			break;
		case OPT_NO_REQUEST:
			v = 16;
			if (optarg && (tfab__parse_size(optarg, &v) || v == 0 || v > 64)) {
				fprintf(stderr, "tfab-perf: bad depth '%s' (1 to 64)\n", optarg);
				return 2;
			}
			o->no_request = (unsigned)v;
			break;
		case OPT_REQUEST_BYTES:
			if (tfab__parse_size(optarg, &v) || v > 1024) {
				fprintf(stderr, "tfab-perf: bad request size '%s' (0 to 1024)\n",
					optarg);
				return 2;
			}
			o->request_bytes = (unsigned)v;
			break;
		case OPT_RANKS:
			if (tfab__parse_size(optarg, &v) || v < 1 || v > PERF_MAX_RANKS) {
				fprintf(stderr, "tfab-perf: bad rank count '%s' (1 to %d)\n",
					optarg, PERF_MAX_RANKS);
				return 2;
			}
			o->ranks = (int)v;
			break;
		case OPT_DEVICE:
			if (strcmp(optarg, "cpu") != 0 && strcmp(optarg, "cuda") != 0) {
				fprintf(stderr, "tfab-perf: unknown device '%s' (cpu, cuda)\n",
					optarg);
				return 2;
			}
			o->cuda = strcmp(optarg, "cuda") == 0;
			break;
		case OPT_JSON:
			o->json = true;
			break;
		case OPT_LISTEN:
			o->listen_port = optarg;
			break;
		case OPT_CONNECT:
			o->connect_to = optarg;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc && parse_tests(argv[optind++], &o->tests))
		return 2;
	if (optind < argc || (o->listen_port && o->connect_to)) {
		usage(stderr);
		return 2;
	}
	if ((o->tests & PERF_ALLREDUCE) &&
	    (o->tests != PERF_ALLREDUCE || o->listen_port || o->connect_to || o->cuda)) {
		fprintf(stderr, "tfab-perf: allreduce runs alone, with local ranks on the CPU\n");
		return 2;
	}
	if (o->tests == PERF_ALLREDUCE && !sizes_given)
		parse_sizes("8,64,512,4K,32K,256K,1M,8M,64M", o);
	if (!o->ranks)
		o->ranks = 4;
	if (o->tests == PERF_MEMCPY && (o->listen_port || o->connect_to)) {
		fprintf(stderr, "tfab-perf: memcpy runs in one process: --listen and --connect "
				"need raw or tensor\n");
		return 2;
	}
	o->progress = !o->json && isatty(STDERR_FILENO);
	return 0;
}

static void send_plan(struct wire *w, const struct perf_opts *o)
{
	w->len = 0;
	w->bad = false;
	put(w, PLAN_MAGIC, 4);
	put(w, o->tests & (PERF_RAW | PERF_TENSOR), 1);
	put(w, o->iters, 4);
	put(w, o->window, 4);
	put(w, o->verify, 1);
	put(w, o->heap_dst, 1);
	put(w, o->no_request, 1);
	put(w, o->request_bytes, 2);
	put(w, (uint64_t)o->timeout_ms, 4);
	put(w, (uint64_t)o->nsizes, 4);
	for (int i = 0; i < o->nsizes; i++)
		put(w, o->sizes[i], 8);
}

static int take_plan(struct wire *w, struct perf_opts *o)
{
	if (get(w, 4) != PLAN_MAGIC)
		return -TFAB_ERR_PROTOCOL;
	o->tests = (unsigned)get(w, 1);
	o->iters = (unsigned)get(w, 4);
	o->window = (unsigned)get(w, 4);
	o->verify = get(w, 1) != 0;
	o->heap_dst = get(w, 1) != 0;
	o->no_request = (unsigned)get(w, 1);
	o->request_bytes = (unsigned)get(w, 2);
	o->timeout_ms = (int)get(w, 4);
	o->nsizes = (int)get(w, 4);
	if (o->nsizes <= 0 || o->nsizes > PERF_MAX_SIZES)
		return -TFAB_ERR_PROTOCOL;
	for (int i = 0; i < o->nsizes; i++)
		o->sizes[i] = (size_t)get(w, 8);
	return w->bad ? -TFAB_ERR_PROTOCOL : 0;
}

/* Close the raw test's endpoint, keeping the bootstrap socket. */
static void pair_teardown(struct perf_pair *p)
{
	if (p->ops) {
		p->ops->disconnect(p->peer);
		p->ops->mr_dereg(p->smr);
		p->ops->mr_dereg(p->dmr);
		if (p->dst_shared)
			p->ops->mem_free(p->ep, p->dst, p->buf_len);
		p->ops->close(p->ep);
	}
	p->ops = NULL;
	p->peer = NULL;
	p->smr = p->dmr = NULL;
	p->ep = NULL;
	free(p->src);
	if (!p->dst_shared)
		free(p->dst);
	p->dst_shared = false;
	p->src = p->dst = NULL;
}

static void pair_close(struct perf_pair *p)
{
	pair_teardown(p);
	if (p->sock >= 0)
		close(p->sock);
	p->sock = -1;
}

/* Open, register and connect to the peer over the bootstrap socket. */
static int pair_setup(struct perf_pair *p, const struct perf_opts *o, bool local)
{
	int tmo = (int)p->cfg.connect_timeout_ms;
	char err[1024], addr[512];
	size_t addrlen = sizeof(addr), page = 4096;
	struct wire w = {.len = 0};
	uint32_t peer_len;
	int rc;

	p->buf_len = 1;
	for (int i = 0; i < o->nsizes; i++)
		if (o->sizes[i] > p->buf_len)
			p->buf_len = o->sizes[i];
	p->buf_len += o->request_bytes; /* --request-bytes' messages land past the pings */
	rc = tfab__provider_open(&p->cfg, local, &p->ops, &p->ep, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "tfab-perf: %s\n", err);
		p->ops = NULL;
		return rc;
	}
	p->caps = p->ops->caps(p->ep);
	/* Where the backend offers memory that peers write in one copy, the engine's pool uses it. */
	if (p->ops->mem_alloc && !o->heap_dst) {
		rc = p->ops->mem_alloc(p->ep, p->buf_len, (void **)&p->dst);
		if (rc)
			return rc;
		p->dst_shared = true;
	} else if (posix_memalign((void **)&p->dst, page, p->buf_len)) {
		return -ENOMEM;
	}
	if (posix_memalign((void **)&p->src, page, p->buf_len))
		return -ENOMEM;
	memset(p->src, 0, p->buf_len);
	memset(p->dst, 0, p->buf_len);
	rc = p->ops->mr_reg(p->ep, p->src, p->buf_len, TFAB_MR_LOCAL_WRITE, &p->smr);
	if (rc == 0)
		rc = p->ops->mr_reg(p->ep, p->dst, p->buf_len, TFAB_MR_REMOTE_WRITE, &p->dmr);
	if (rc == 0)
		rc = p->ops->get_addr(p->ep, addr, &addrlen);
	if (rc) {
		fprintf(stderr, "tfab-perf: registering %zu bytes: %s\n", p->buf_len,
			tfab_strerror(rc));
		return rc;
	}

	put(&w, HELLO_MAGIC, 4);
	put(&w, p->dmr->raddr, 8);
	put(&w, p->dmr->rkey, 8);
	put(&w, (uint64_t)addrlen, 4);
	for (size_t i = 0; i < addrlen; i++)
		put(&w, (uint8_t)addr[i], 1);
	rc = send_wire(p->sock, &w, tmo);
	if (rc == 0)
		rc = recv_wire(p->sock, &w, tmo);
	if (rc) {
		fprintf(stderr, "tfab-perf: exchanging addresses: %s\n", tfab_strerror(rc));
		return rc;
	}
	if (get(&w, 4) != HELLO_MAGIC)
		return -TFAB_ERR_PROTOCOL;
	p->remote_raddr = get(&w, 8);
	p->remote_rkey = get(&w, 8);
	peer_len = (uint32_t)get(&w, 4);
	if (w.bad || peer_len > sizeof(addr) || w.pos + peer_len > w.len)
		return -TFAB_ERR_PROTOCOL;
	rc = p->ops->connect(p->ep, w.buf + w.pos, peer_len, &p->peer);
	if (rc)
		fprintf(stderr, "tfab-perf: connecting to the peer: %s\n", tfab_strerror(rc));
	return rc;
}

void perf_print_result(const struct perf_opts *o, const char *test, const char *path,
		       const char *backend, const char *fabric, const char *domain,
		       const struct perf_result *r)
{
	if (o->json) {
		printf("{\"test\":");
		json_str(stdout, test);
		printf(",\"path\":");
		json_str(stdout, path);
		printf(",\"backend\":");
		json_str(stdout, backend);
		printf(",\"fabric\":");
		json_str(stdout, fabric);
		printf(",\"domain\":");
		json_str(stdout, domain);
		printf(",\"bytes\":%zu,\"iters\":%u,\"window\":%u,\"gbps\":%.6g,\"GBps\":%.6g,"
		       "\"rate\":%.0f,\"lat_us\":%.3f,\"verified\":%s",
		       r->bytes, r->iters, r->window, r->gbps, r->gbps / 8.0, r->rate, r->lat_us,
		       o->verify ? (r->verified ? "true" : "false") : "null");
		if (r->has_engine)
			printf(",\"copies\":%llu,\"meta_misses\":%llu,\"writes_per_fetch\":%.3f",
			       (unsigned long long)r->copies, (unsigned long long)r->meta_misses,
			       r->writes_per_fetch);
		printf("}\n");
	} else if (r->has_engine) {
		char cm[48];

		snprintf(cm, sizeof(cm), "%llu/%llu", (unsigned long long)r->copies,
			 (unsigned long long)r->meta_misses);
		printf("%12zu %9u %7u %10.3f %10.3f %10.3f %10.2f   %-18s %12.2f %s\n", r->bytes,
		       r->iters, r->window, r->gbps / 8.0, r->gbps, r->rate / 1e6, r->lat_us, cm,
		       r->writes_per_fetch, o->verify ? (r->verified ? "yes" : "NO") : "-");
	} else {
		printf("%12zu %9u %7u %10.3f %10.3f %10.3f %10.2f   %s\n", r->bytes, r->iters,
		       r->window, r->gbps / 8.0, r->gbps, r->rate / 1e6, r->lat_us,
		       o->verify ? (r->verified ? "yes" : "NO") : "-");
	}
	fflush(stdout);
}

/* Run every size of the plan; the client reports. */
static int run(struct perf_pair *p, const struct perf_opts *o)
{
	int rc = 0, failed = 0;
	char path[32];

	tfab__caps_path_name(p->caps, path, sizeof(path));
	if (p->client && !o->json) {
		printf("tfab-perf raw: path %s (%s %s on %s)%s\n", path, p->caps->backend,
		       p->caps->fabric, p->caps->domain,
		       p->dst_shared ? ", destinations from mem_alloc" : "");
		printf("%12s %9s %7s %10s %10s %10s %10s   %s\n", "bytes", "iters", "window",
		       "GB/s", "Gb/s", "Mmsg/s", "lat_us", "verified");
	}
	for (int i = 0; i < o->nsizes && rc == 0; i++) {
		struct perf_result r;

		if (p->client && o->progress)
			fprintf(stderr, "\r  running %zu bytes...", o->sizes[i]);
		rc = perf_raw_run(p, o, o->sizes[i], &r);
		if (p->client && o->progress)
			fprintf(stderr, "\r%40s\r", "");
		if (rc == 0 && p->client) {
			perf_print_result(o, "raw", path, p->caps->backend, p->caps->fabric,
					  p->caps->domain, &r);
			failed |= o->verify && !r.verified;
		}
	}
	if (rc == 0)
		rc = perf_raw_finish(p, o);
	if (rc)
		fprintf(stderr, "tfab-perf: %s: %s\n", p->client ? "client" : "server",
			tfab_strerror(rc));
	return rc ? rc : failed ? -EIO : 0;
}

/*
 * Both ends of a local pair are on this host: the engine's contexts (which read
 * TFAB_OFI_DOMAIN) should use the loopback interface, as the raw test does, when the fabric
 * has one and the user chose nothing.
 */
static void prefer_local_domain(struct perf_pair *p)
{
	const struct tfab_provider_ops *ops;
	struct tfab_ep *ep;
	char err[512];

	if (getenv("TFAB_OFI_DOMAIN"))
		return;
	if (tfab__provider_open(&p->cfg, true, &ops, &ep, err, sizeof(err)) == 0) {
		if (strcmp(ops->name, "ofi") == 0)
			setenv("TFAB_OFI_DOMAIN", ops->caps(ep)->domain, 0);
		ops->close(ep);
	}
}

static int side_main(struct perf_pair *p, struct perf_opts *o, bool local)
{
	struct wire w = {.len = 0};
	int rc, tmo = (int)p->cfg.connect_timeout_ms;

	if (p->client) {
		send_plan(&w, o);
		rc = send_wire(p->sock, &w, tmo);
	} else {
		rc = recv_wire(p->sock, &w, tmo);
		if (rc == 0)
			rc = take_plan(&w, o);
	}
	if (rc) {
		fprintf(stderr, "tfab-perf: exchanging the plan: %s\n", tfab_strerror(rc));
		return rc;
	}
	if (local)
		prefer_local_domain(p);
	if (o->tests & PERF_RAW) {
		rc = pair_setup(p, o, local);
		if (rc == 0)
			rc = run(p, o);
		pair_teardown(p);
		if (rc)
			return rc;
	}
	if (o->tests & PERF_TENSOR)
		rc = perf_tensor_run(p, o);
	return rc;
}

/* Wait for the local server child, at most timeout_ms, then kill it. */
static int reap(pid_t pid, int timeout_ms)
{
	uint64_t deadline = tfab__now_ms() + (uint64_t)timeout_ms;
	int status;

	for (;;) {
		pid_t r = waitpid(pid, &status, WNOHANG);

		if (r == pid)
			return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
		if (r < 0)
			return -1;
		if (tfab__now_ms() > deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			fprintf(stderr, "tfab-perf: the server process did not exit; killed it\n");
			return -1;
		}
		usleep(10000);
	}
}

/*
 * Whether TFAB_PROVIDER selects a usable fabric, asked in a throw-away child: libfabric's
 * verbs provider, once initialised by a probe, does not work in the children forked after it
 * (ofi:verbs pairs timed out at their first write), so the pair's parent probes nothing.
 */
static int check_provider(const struct tfab_config *cfg, char *err, size_t errlen)
{
	int fds[2], status = 0;
	ssize_t n;
	pid_t pid;

	if (pipe(fds))
		return snprintf(err, errlen, "pipe: %s", strerror(errno)), -1;
	pid = fork();
	if (pid < 0) {
		snprintf(err, errlen, "fork: %s", strerror(errno));
		close(fds[0]);
		close(fds[1]);
		return -1;
	}
	if (pid == 0) {
		const struct tfab_provider_ops *ops;
		char fabric[64], why[1024] = "";
		int rc;

		close(fds[0]);
		rc = tfab__provider_select(cfg, &ops, fabric, sizeof(fabric), why, sizeof(why));
		if (rc && write(fds[1], why, strlen(why)) < 0)
			_exit(2);
		_exit(rc ? 1 : 0);
	}
	close(fds[1]);
	n = read(fds[0], err, errlen - 1);
	err[n > 0 ? n : 0] = '\0';
	close(fds[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return 0;
	if (!err[0])
		snprintf(err, errlen, "the provider check exited with status %d", status);
	return -1;
}

int main(int argc, char **argv)
{
	struct perf_opts o = {.tests = PERF_MEMCPY | PERF_RAW | PERF_TENSOR};
	struct perf_pair p = {.sock = -1};
	const char *provider = NULL;
	bool memcpy_failed = false;
	char err[1024];
	int rc;

	rc = parse_args(argc, argv, &o, &provider);
	if (rc)
		return rc;
	/* memcpy alone: no settings, no provider, no pair. */
	if (o.tests == PERF_MEMCPY)
		return perf_memcpy_run(&o) ? 1 : 0;
	/* allreduce: its ranks read their settings (and -p) from the environment. */
	if (o.tests == PERF_ALLREDUCE) {
		if (provider)
			setenv("TFAB_PROVIDER", provider, 1);
		return perf_allreduce_run(&o) ? 1 : 0;
	}
	if (tfab__config_init(&p.cfg, err, sizeof(err))) {
		fprintf(stderr, "tfab-perf: %s\n", err);
		return 1;
	}
	if (provider) {
		if (tfab__config_set(&p.cfg, "TFAB_PROVIDER", provider, err, sizeof(err))) {
			fprintf(stderr, "tfab-perf: %s\n", err);
			return 2;
		}
		/* The tensor test's contexts read their settings from the environment. */
		setenv("TFAB_PROVIDER", provider, 1);
	}
	tfab_log_set_level((enum tfab_log_level)p.cfg.log_level);
	/* Checked once, here: both processes of a pair would say why otherwise. */
	if (check_provider(&p.cfg, err, sizeof(err))) {
		fprintf(stderr, "tfab-perf: %s\n", err);
		return 1;
	}
	/* The bound first, on the reporting side, while no other process of ours runs. */
	if ((o.tests & PERF_MEMCPY) && !o.listen_port) {
		rc = perf_memcpy_run(&o);
		if (rc && rc != -EIO)
			return 1;
		memcpy_failed = rc != 0;
	}

	if (o.listen_port || o.connect_to) {
		char host[256];
		uint16_t port;
		int lfd;

		if (o.listen_port) {
			if (tfab__sock_parse_hostport(o.listen_port, host, sizeof(host), &port)) {
				char hp[300];

				snprintf(hp, sizeof(hp), ":%s", o.listen_port);
				if (tfab__sock_parse_hostport(hp, host, sizeof(host), &port)) {
					fprintf(stderr, "tfab-perf: bad port '%s'\n",
						o.listen_port);
					return 2;
				}
			}
			rc = tfab__sock_listen(host[0] ? host : NULL, port, &lfd, &port);
			if (rc == 0) {
				fprintf(stderr, "tfab-perf: listening on port %u\n", port);
				rc = tfab__sock_accept(lfd, (int)p.cfg.connect_timeout_ms * 30,
						       &p.sock);
				close(lfd);
			}
		} else {
			p.client = true;
			if (tfab__sock_parse_hostport(o.connect_to, host, sizeof(host), &port)) {
				fprintf(stderr, "tfab-perf: bad address '%s'\n", o.connect_to);
				return 2;
			}
			rc = tfab__sock_connect(host, port, (int)p.cfg.connect_timeout_ms, &p.sock);
			snprintf(p.peer_host, sizeof(p.peer_host), "%s", host);
		}
		if (rc) {
			fprintf(stderr, "tfab-perf: bootstrap connection: %s\n", tfab_strerror(rc));
			return 1;
		}
		rc = side_main(&p, &o, false);
		pair_close(&p);
		return rc || memcpy_failed ? 1 : 0;
	}

	/* A local pair: the child serves, the parent drives and reports. */
	int sv[2];
	pid_t pid;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) {
		perror("tfab-perf: socketpair");
		return 1;
	}
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		perror("tfab-perf: fork");
		return 1;
	}
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(sv[0]);
		p.sock = sv[1];
		rc = side_main(&p, &o, true);
		pair_close(&p);
		_exit(rc ? 1 : 0);
	}
	close(sv[1]);
	p.sock = sv[0];
	p.client = true;
	snprintf(p.peer_host, sizeof(p.peer_host), "127.0.0.1");
	rc = side_main(&p, &o, true);
	pair_close(&p); /* closes the socket: a waiting server sees it and exits */
	if (reap(pid, rc ? 2000 : o.timeout_ms) != 0 && rc == 0) {
		fprintf(stderr, "tfab-perf: the server process failed\n");
		rc = -EIO;
	}
	return rc || memcpy_failed ? 1 : 0;
}
