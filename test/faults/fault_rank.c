/*
 * One process of the fault suite (test/faults/faults.py): a hub that serves every spoke that
 * connects, or a spoke that trades tensors with the hub, round after round, until a wall-clock
 * end, while the driver breaks the link or the process under it.
 *
 *   fault_rank hub   PORT
 *   fault_rank spoke HOST PORT BYTES
 *
 * Each prints READY once its context is up (the hub's listening), then reads END_MS from its
 * standard input: CLOCK_REALTIME in milliseconds, when every process of a case stops starting
 * rounds. The driver sends it once all are ready, so that a slow start (a VM under emulation)
 * does not eat the case's time. Later lines "FAULT MS" say when the case's fault began. A
 * round of a spoke is a send of "up" (BYTES) and a receive of "down"; the hub receives "up"
 * and answers with "down" of the same size. Every tensor is checked word by word, with a
 * progress call every 4 MiB checked or filled: the library finds failures and answers its
 * peers only in its calls, and a rank that spent seconds in its own work without one would
 * measure itself. A spoke whose connection fails connects again until the end.
 *
 * What it prints, for the driver to judge:
 *   FAIL op=recv|send step=N status=NAME post_ms=T fail_ms=T   (an operation that failed)
 *   HUNG op=... step=N post_ms=T from_ms=T                    (pending past the bound)
 *   STALL in=app|progress|destroy|send|recv|status|release from_ms=T to_ms=T
 *                                                            (long outside or in one call)
 *   tfab LEVEL [SUBSYS] @T: ...                              (the library's log, stamped)
 *   SUMMARY role=R completed=N failed=N corrupt=N hung=N connections=N
 * The bound on any operation is TFAB_OP_TIMEOUT_MS plus TFAB_HEARTBEAT_MS plus
 * TFAB_TEST_SLACK_MS (every process gets the same environment), counted from its post, or
 * from the fault where that began later (from_ms): the deadlines bound how long a peer may
 * stay silent, not how long a live one may take. It counts time this process ran: a stopped
 * one's operations do not hang while it is stopped.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tfab/tfab.h>

#define MAX_CONNS 16

static uint64_t realtime_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static const char *status_name(int status)
{
	static char buf[32];

	switch (-status) {
	case TFAB_ERR_PEER_FAILED:
		return "TFAB_ERR_PEER_FAILED";
	case TFAB_ERR_TIMEOUT:
		return "TFAB_ERR_TIMEOUT";
	case TFAB_ERR_ABORTED:
		return "TFAB_ERR_ABORTED";
	case TFAB_ERR_PROTOCOL:
		return "TFAB_ERR_PROTOCOL";
	case TFAB_ERR_FABRIC:
		return "TFAB_ERR_FABRIC";
	case TFAB_ERR_REMOTE:
		return "TFAB_ERR_REMOTE";
	case TFAB_ERR_REMOTE_ACCESS:
		return "TFAB_ERR_REMOTE_ACCESS";
	default:
		if (status < 0 && -status < TFAB_ERR_FIRST && strerrorname_np(-status))
			return strerrorname_np(-status);
		snprintf(buf, sizeof(buf), "status%d", status);
		return buf;
	}
}

/* The content of step's tensor in one direction: a word per 8 bytes. */
static uint64_t word(int64_t step, int dir, size_t i)
{
	return ((uint64_t)step << 40) ^ ((uint64_t)dir << 36) ^ (i * 0x9e3779b97f4a7c15ull);
}

/* A progress call between chunks of this many words checked or filled (4 MiB). */
enum { CHUNK_WORDS = 1 << 19 };
static void chunk_done(void);

static void fill(uint64_t *w, size_t bytes, int64_t step, int dir)
{
	for (size_t i = 0; i < bytes / 8; i++) {
		if (i % CHUNK_WORDS == CHUNK_WORDS - 1)
			chunk_done();
		w[i] = word(step, dir, i);
	}
}

static bool intact(const uint64_t *w, size_t bytes, int64_t step, int dir)
{
	for (size_t i = 0; i < bytes / 8; i++) {
		if (i % CHUNK_WORDS == CHUNK_WORDS - 1)
			chunk_done();
		if (w[i] != word(step, dir, i)) {
			size_t bad = 0;

			for (size_t k = i; k < bytes / 8; k++)
				bad += w[k] != word(step, dir, k);
			printf("CORRUPT step=%lld bytes=%zu first_bad_word=%zu bad_words=%zu "
			       "got=%#llx "
			       "want=%#llx\n",
			       (long long)step, bytes, i, bad, (unsigned long long)w[i],
			       (unsigned long long)word(step, dir, i));
			return false;
		}
	}
	return true;
}

enum { UP = 1, DOWN = 2 };

struct totals {
	long completed, failed, corrupt, hung, connections;
};

static struct totals totals;
static uint64_t bound_ms;

/*
 * Time this process did not run (a SIGSTOP): its operations cannot be said to hang then.
 * A gap of more than PAUSE_MS between two turns of a loop counts as such.
 */
enum { PAUSE_MS = 500 };
static uint64_t paused_ms, last_turn_ms;

static void turn(void)
{
	uint64_t now = realtime_ms();

	if (last_turn_ms && now > last_turn_ms + PAUSE_MS)
		paused_ms += now - last_turn_ms;
	last_turn_ms = now;
}

/*
 * When the case's fault began (CLOCK_REALTIME ms), once the driver has said so on standard
 * input (a thread of its own reads it); 0 before.
 */
static _Atomic uint64_t fault_ms;

static void *driver_main(void *arg)
{
	unsigned long long ms;
	char line[64];

	(void)arg;
	while (fgets(line, sizeof(line), stdin)) {
		if (sscanf(line, "FAULT %llu", &ms) == 1)
			atomic_store(&fault_ms, ms);
	}
	return NULL;
}

/*
 * Spells of the main thread longer than STALL_MS outside the library (its own work) or in
 * one call of it, said for whoever reads a failure: what the library finds waits for a call.
 */
enum { STALL_MS = 300 };
static uint64_t left_lib_ms; /* when the main thread's last library call returned */

static uint64_t lib_enter(void)
{
	uint64_t now = realtime_ms();

	if (left_lib_ms && now > left_lib_ms + STALL_MS)
		printf("STALL in=app from_ms=%llu to_ms=%llu\n", (unsigned long long)left_lib_ms,
		       (unsigned long long)now);
	return now;
}

static void lib_leave(const char *call, uint64_t entered)
{
	uint64_t now = realtime_ms();

	if (now > entered + STALL_MS)
		printf("STALL in=%s from_ms=%llu to_ms=%llu\n", call, (unsigned long long)entered,
		       (unsigned long long)now);
	left_lib_ms = now;
}

static void progress(struct tfab_context *ctx)
{
	uint64_t entered = lib_enter();

	turn();
	tfab_progress(ctx);
	lib_leave("progress", entered);
}

static void peer_destroy(struct tfab_peer *peer)
{
	uint64_t entered = lib_enter();

	tfab_peer_destroy(peer);
	lib_leave("destroy", entered);
}

static struct tfab_context *the_ctx; /* for the progress calls between chunks */

static void chunk_done(void)
{
	if (the_ctx)
		progress(the_ctx);
}

/* One operation of a round. */
struct op {
	const char *name; /* "send" or "recv" */
	bool pending, reported_hung;
	bool dead; /* a receive's tensor was the spoke's goodbye */
	int status;
	uint64_t post_ms, paused_at_post;
	int64_t step;
	DLManagedTensor *got; /* a receive's tensor */
};

struct conn {
	struct tfab_peer *peer;
	int64_t step;
	struct op send, recv;
	uint64_t *buf; /* what this side sends */
	size_t bytes, cap;
	int64_t shape;
	bool live;
};

static void op_post(struct op *op, const char *name, int64_t step)
{
	turn();
	memset(op, 0, sizeof(*op));
	op->name = name;
	op->pending = true;
	op->step = step;
	op->post_ms = realtime_ms();
	op->paused_at_post = paused_ms;
}

/* An operation ended: counted, and its failure printed. */
static void op_end(struct op *op, int status)
{
	op->pending = false;
	op->status = status;
	if (status == 0) {
		totals.completed++;
		return;
	}
	totals.failed++;
	printf("FAIL op=%s step=%lld status=%s post_ms=%llu fail_ms=%llu\n", op->name,
	       (long long)op->step, status_name(status), (unsigned long long)op->post_ms,
	       (unsigned long long)realtime_ms());
	fflush(stdout);
}

static void on_sent(void *arg, int status)
{
	op_end(arg, status);
}

static void on_recv(void *arg, int status, DLManagedTensor *t, bool is_dead)
{
	struct op *op = arg;

	op->dead = is_dead;
	op->got = t;
	op_end(op, status);
}

/* The main thread's other library calls, each named in a STALL line when it is one. */
static int send_to(struct tfab_context *ctx, struct tfab_peer *peer, const char *key, int64_t step,
		   const DLTensor *t, bool is_dead, void *arg)
{
	uint64_t entered = lib_enter();
	int rc = tfab_send_to(ctx, peer, key, step, t, is_dead, on_sent, arg);

	lib_leave("send", entered);
	return rc;
}

static int recv_post(struct tfab_context *ctx, struct tfab_peer *peer, const char *key,
		     int64_t step, void *arg)
{
	uint64_t entered = lib_enter();
	int rc = tfab_recv(ctx, peer, key, step, NULL, on_recv, arg);

	lib_leave("recv", entered);
	return rc;
}

static int peer_status(struct tfab_peer *peer)
{
	uint64_t entered = lib_enter();
	int rc = tfab_peer_status(peer);

	lib_leave("status", entered);
	return rc;
}

static void release(DLManagedTensor *t)
{
	uint64_t entered = lib_enter();

	t->deleter(t);
	lib_leave("release", entered);
}

static void check_hung(struct op *op)
{
	turn(); /* a stop inside the last progress call counts as a pause too */

	uint64_t fault = atomic_load(&fault_ms);
	uint64_t from = fault > op->post_ms ? fault : op->post_ms;
	uint64_t span = realtime_ms() - from, paused = paused_ms - op->paused_at_post;
	uint64_t ran = span > paused ? span - paused : 0;

	if (op->pending && !op->reported_hung && ran > bound_ms) {
		op->reported_hung = true;
		totals.hung++;
		printf("HUNG op=%s step=%lld post_ms=%llu from_ms=%llu\n", op->name,
		       (long long)op->step, (unsigned long long)op->post_ms,
		       (unsigned long long)from);
		fflush(stdout);
	}
}

/* Checks and releases a receive's tensor; whether it was the one due. */
static void take_received(struct op *op, int dir)
{
	DLManagedTensor *t = op->got;
	size_t bytes;

	op->got = NULL;
	if (!t)
		return;
	bytes = (size_t)t->dl_tensor.shape[0] * 8;
	if (t->dl_tensor.dtype.bits != 64 || !intact(t->dl_tensor.data, bytes, op->step, dir)) {
		totals.corrupt++;
		fflush(stdout);
	}
	release(t);
}

static int conn_send(struct tfab_context *ctx, struct conn *c, const char *key, int dir,
		     size_t bytes)
{
	DLTensor t = {.data = NULL,
		      .device = {kDLCPU, 0},
		      .ndim = 1,
		      .dtype = {kDLUInt, 64, 1},
		      .shape = &c->shape};

	if (bytes > c->cap) {
		free(c->buf);
		c->buf = malloc(bytes);
		if (!c->buf)
			return -ENOMEM;
		c->cap = bytes;
	}
	fill(c->buf, bytes, c->step, dir);
	c->shape = (int64_t)(bytes / 8);
	t.data = c->buf;
	op_post(&c->send, "send", c->step);
	return send_to(ctx, c->peer, key, c->step, &t, false, &c->send);
}

/* A post that returned an error: the failure is seen now, which may be well after post_ms. */
static void conn_post_failed(struct op *op, int rc)
{
	op_end(op, rc);
}

/* READY, then the end of the case from the driver; 0 where none came. */
static uint64_t ready_wait(void)
{
	unsigned long long end_ms;
	pthread_t thread;

	printf("READY\n");
	fflush(stdout);
	if (scanf("%llu", &end_ms) != 1) {
		fprintf(stderr, "fault_rank: no END_MS on standard input\n");
		return 0;
	}
	/* what comes next on standard input is the fault's start */
	if (pthread_create(&thread, NULL, driver_main, NULL) == 0)
		pthread_detach(thread);
	return end_ms;
}

/* The hub: accepts on a thread of its own (a handshake may take a while through loss). */
struct hub {
	struct tfab_context *ctx;
	pthread_mutex_t lock;
	struct tfab_peer *fresh[MAX_CONNS];
	int nfresh;
	volatile bool stop;
};

static void *accept_main(void *arg)
{
	struct hub *h = arg;

	while (!h->stop) {
		struct tfab_peer *peer;

		if (tfab_accept(h->ctx, 500, &peer) != 0)
			continue;
		pthread_mutex_lock(&h->lock);
		if (h->nfresh < MAX_CONNS)
			h->fresh[h->nfresh++] = peer;
		else
			tfab_peer_destroy(peer);
		pthread_mutex_unlock(&h->lock);
	}
	return NULL;
}

/* The hub's side of one connection: receive "up" of a step, answer "down", next step. */
static void hub_step(struct tfab_context *ctx, struct conn *c)
{
	struct op *last = c->send.step == c->step ? &c->send : &c->recv;
	int rc;

	if (c->recv.pending || c->send.pending)
		return;
	if ((last->name && last->status) || peer_status(c->peer)) {
		/* this connection is over; the spoke makes another */
		peer_destroy(c->peer);
		c->live = false;
		return;
	}
	if (last == &c->recv && c->recv.dead) {
		/* the spoke's goodbye: the connection ends well */
		peer_destroy(c->peer);
		c->live = false;
		return;
	}
	if (last == &c->recv && c->recv.step == c->step && c->recv.name) {
		/* "up" of this step came whole: answer it with "down" of its size */
		c->bytes = c->recv.got ? (size_t)c->recv.got->dl_tensor.shape[0] * 8 : 0;
		take_received(&c->recv, UP);
		rc = conn_send(ctx, c, "down", DOWN, c->bytes);
		if (rc)
			conn_post_failed(&c->send, rc);
		return;
	}
	if (last == &c->send)
		c->step++;
	/* posted after the end too: the spoke ends its connection (a goodbye) */
	op_post(&c->recv, "recv", c->step);
	rc = recv_post(ctx, c->peer, "up", c->step, &c->recv);
	if (rc)
		conn_post_failed(&c->recv, rc);
}

static int run_hub(struct tfab_context *ctx, uint16_t port)
{
	struct conn conns[MAX_CONNS] = {0};
	struct hub h = {.ctx = ctx};
	pthread_t thread;
	uint64_t end_ms;

	if (tfab_listen(ctx, "0.0.0.0", port, NULL))
		return 1;
	end_ms = ready_wait();
	if (!end_ms)
		return 1;
	pthread_mutex_init(&h.lock, NULL);
	pthread_create(&thread, NULL, accept_main, &h);
	for (;;) {
		uint64_t now = realtime_ms();
		bool busy = false;

		progress(ctx);
		pthread_mutex_lock(&h.lock);
		for (int i = 0; i < MAX_CONNS && h.nfresh; i++) {
			if (!conns[i].live) {
				struct conn *c = &conns[i];

				c->peer = h.fresh[--h.nfresh];
				c->live = true;
				c->step = 0; /* a step 0 "sent": the next is step 1's receive */
				memset(&c->recv, 0, sizeof(c->recv));
				memset(&c->send, 0, sizeof(c->send));
				totals.connections++;
			}
		}
		pthread_mutex_unlock(&h.lock);
		for (int i = 0; i < MAX_CONNS; i++) {
			struct conn *c = &conns[i];

			if (!c->live)
				continue;
			check_hung(&c->recv);
			check_hung(&c->send);
			hub_step(ctx, c);
			busy |= c->live;
		}
		/* every spoke says goodbye; one that does not is waited for to the bound */
		if (now >= end_ms + bound_ms || (now >= end_ms && !busy))
			break;
	}
	h.stop = true;
	pthread_join(thread, NULL);
	pthread_mutex_destroy(&h.lock);
	for (int i = 0; i < MAX_CONNS; i++) {
		if (conns[i].live)
			peer_destroy(conns[i].peer);
		take_received(&conns[i].recv, UP);
		free(conns[i].buf);
	}
	for (int i = 0; i < h.nfresh; i++)
		peer_destroy(h.fresh[i]);
	return 0;
}

/* Drives progress until both operations ended or were reported hung. */
static void spoke_wait(struct tfab_context *ctx, struct conn *c)
{
	while ((c->send.pending && !c->send.reported_hung) ||
	       (c->recv.pending && !c->recv.reported_hung)) {
		progress(ctx);
		check_hung(&c->send);
		check_hung(&c->recv);
	}
}

/* A dead tensor for the hub's next receive: the connection ends well. */
static void spoke_goodbye(struct tfab_context *ctx, struct conn *c)
{
	DLTensor t = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLUInt, 64, 1}};

	c->shape = 0;
	t.shape = &c->shape;
	op_post(&c->send, "send", c->step);
	if (send_to(ctx, c->peer, "up", c->step, &t, true, &c->send) == 0)
		spoke_wait(ctx, c);
	else
		c->send.pending = false;
}

static int run_spoke(struct tfab_context *ctx, const char *host, uint16_t port, size_t bytes)
{
	struct conn c = {0};
	int last_connect_rc = 0;
	uint64_t end_ms = ready_wait();

	if (!end_ms)
		return 1;

	while (realtime_ms() < end_ms) {
		int rc;

		if (!c.live) {
			rc = tfab_connect(ctx, host, port, 1000, &c.peer);
			if (rc) {
				/* said once per kind: the driver shows it where nothing connected */
				if (rc != last_connect_rc)
					printf("CONNECT %s: %s\n", host, tfab_strerror(rc));
				last_connect_rc = rc;
				continue;
			}
			c.live = true;
			c.step = 1;
			totals.connections++;
		}
		rc = conn_send(ctx, &c, "up", UP, bytes);
		if (rc)
			conn_post_failed(&c.send, rc);
		op_post(&c.recv, "recv", c.step);
		rc = recv_post(ctx, c.peer, "down", c.step, &c.recv);
		if (rc)
			conn_post_failed(&c.recv, rc);
		spoke_wait(ctx, &c);
		take_received(&c.recv, DOWN);
		if (c.send.pending || c.recv.pending || c.send.status || c.recv.status ||
		    peer_status(c.peer)) {
			peer_destroy(c.peer); /* fails what is left, at once */
			progress(ctx);
			take_received(&c.recv, DOWN);
			c.live = false;
			continue;
		}
		c.step++;
	}
	if (c.live) {
		spoke_goodbye(ctx, &c);
		peer_destroy(c.peer);
	}
	free(c.buf);
	return 0;
}

/*
 * The library's log lines, stamped with this clock (the driver's, and the one of FAIL and
 * HUNG): "tfab LEVEL [SUBSYS] @MS: message".
 */
static void log_sink(void *arg, enum tfab_log_level level, const char *subsys, const char *msg)
{
	(void)arg;
	printf("tfab %s [%s] @%llu: %s\n", tfab_log_level_name(level), subsys,
	       (unsigned long long)realtime_ms(), msg);
}

static unsigned env_ms(const char *name, unsigned dflt)
{
	const char *v = getenv(name);

	return v && *v ? (unsigned)strtoul(v, NULL, 10) : dflt;
}

int main(int argc, char **argv)
{
	struct tfab_context *ctx;
	int rc;

	setvbuf(stdout, NULL, _IOLBF, 0);
	tfab_log_set_sink(log_sink, NULL);
	bound_ms = env_ms("TFAB_OP_TIMEOUT_MS", 60000) + env_ms("TFAB_HEARTBEAT_MS", 1000) +
		   env_ms("TFAB_TEST_SLACK_MS", 1000);
	if (argc == 3 && strcmp(argv[1], "hub") == 0) {
		rc = tfab_context_create(&ctx);
		if (rc) {
			fprintf(stderr, "hub: context: %s\n", tfab_strerror(rc));
			return 1;
		}
		the_ctx = ctx;
		rc = run_hub(ctx, (uint16_t)atoi(argv[2]));
	} else if (argc == 5 && strcmp(argv[1], "spoke") == 0) {
		rc = tfab_context_create(&ctx);
		if (rc) {
			fprintf(stderr, "spoke: context: %s\n", tfab_strerror(rc));
			return 1;
		}
		the_ctx = ctx;
		rc = run_spoke(ctx, argv[2], (uint16_t)atoi(argv[3]),
			       strtoull(argv[4], NULL, 10) & ~(size_t)7);
	} else {
		fprintf(stderr, "usage: %s hub PORT | spoke HOST PORT BYTES (END_MS on stdin)\n",
			argv[0]);
		return 2;
	}
	the_ctx = NULL;
	tfab_context_destroy(ctx);
	printf("SUMMARY role=%s completed=%ld failed=%ld corrupt=%ld hung=%ld connections=%ld\n",
	       argv[1], totals.completed, totals.failed, totals.corrupt, totals.hung,
	       totals.connections);
	return rc;
}
