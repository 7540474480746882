/*
 * The native shm backend's own cases, beyond the conformance suite: its SPSC ring between two
 * threads (inline payloads across continuation entries and the ring's wrap), a refused write's
 * verdict not read again for the good writes of the ring's next lap, addresses of
 * another host or namespace refused, a poll's own completions left for later while peers'
 * writes arrive, within a bound, each path between two processes (one copy into a shared
 * segment from mem_alloc or by process_vm_writev, short writes bounced) with its statistics,
 * the bounce path when a real seccomp filter makes the kernel refuse process_vm_writev
 * (installed before the endpoint opens, and after, so that the first write meets the
 * refusal), and a receiver killed with SIGKILL in the middle of a 256 MiB write: the writer's
 * error within a bound, nothing in /dev/shm, the dead peer's mappings gone after disconnect,
 * and a killed writer's slot freed at the target.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#endif

#include <tfab/status.h>

#include "providers/shm/internal.h"
#include "providers/shm/shm.h"
#include "util/config.h"
#include "util/sock.h"
#include "util/time.h"

#define WAIT_MS 20000

static struct tfab_config cfg;

static struct tfab_ep *open_ep(void)
{
	struct tfab_open_args args = {.cfg = &cfg, .local_only = true};
	struct tfab_ep *ep = NULL;

	assert_int_equal(tfab_shm_ops.open(&args, &ep), 0);
	return ep;
}

/* Whole-word pattern from a seed: a shifted or truncated copy does not pass. */
static void fill(void *buf, size_t len, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
	uint8_t *p = buf;

	for (size_t i = 0; i < len; i += 8) {
		x ^= x >> 12;
		x ^= x << 25;
		x ^= x >> 27;
		uint64_t w = x * 2685821657736338717ull;

		memcpy(p + i, &w, len - i < 8 ? len - i : 8);
	}
}

static bool check(const void *buf, size_t len, uint64_t seed)
{
	uint8_t *ref = malloc(len ? len : 1);
	bool ok;

	assert_non_null(ref);
	fill(ref, len, seed);
	ok = memcmp(ref, buf, len) == 0;
	free(ref);
	return ok;
}

/* ---- the ring alone, between two threads ---- */

enum { RING_WRITES = 20000 }; /* about 230 laps of the ring */

static size_t ring_len_of(uint64_t k)
{
	/* 0 to the inline maximum, many crossing into continuation entries. */
	return (size_t)((k * 2654435761u) % (TFAB_SHM_INLINE_MAX + 1));
}

/* A broken ring may stall rather than corrupt: both sides give up after this. */
static uint64_t ring_deadline;

static void *ring_consumer(void *arg)
{
	struct tfab_shm_ring *r = arg;
	static uint8_t buf[TFAB_SHM_INLINE_MAX];
	uint64_t tail = 0, k = 0, bad = 0;

	while (k < RING_WRITES) {
		struct tfab_shm_entry *e = tfab_shm_ring_peek(r, tail);
		unsigned n;

		if (!e) {
			if (tfab__now_ms() > ring_deadline)
				return (void *)(uintptr_t)(RING_WRITES - k);
			sched_yield(); /* two cores, or valgrind's one thread at a time */
			continue;
		}
		n = tfab_shm_inline_entries(e->len);
		if (e->imm != (uint32_t)k || e->len != ring_len_of(k))
			bad++;
		tfab_shm_ring_get_inline(r, tail, buf, e->len);
		if (!check(buf, e->len, k))
			bad++;
		tfab_shm_ring_take(r, tail, n, (int32_t) - (int64_t)(k & 7));
		tail += n;
		tfab_shm_ring_release(r, tail);
		k++;
	}
	return (void *)(uintptr_t)bad;
}

static void test_ring_threads(void **state)
{
	struct tfab_shm_ring *r = aligned_alloc(64, sizeof(*r));
	uint64_t head = 0, acked = 0, k = 0, acks = 0;
	uint64_t *starts = calloc(TFAB_SHM_RING_N, sizeof(*starts));
	uint8_t buf[TFAB_SHM_INLINE_MAX];
	pthread_t t;
	void *bad;

	(void)state;
	assert_non_null(r);
	memset(r, 0, sizeof(*r));
	ring_deadline = tfab__now_ms() + 3 * WAIT_MS; /* valgrind runs one thread at a time */
	assert_int_equal(pthread_create(&t, NULL, ring_consumer, r), 0);
	while (acks < RING_WRITES && tfab__now_ms() < ring_deadline) {
		uint64_t tail = tfab_shm_ring_tail(r);

		/* Verdicts come back in order, each in its write's first entry. */
		while (acked < tail) {
			uint64_t j = starts[acked % TFAB_SHM_RING_N];

			assert_int_equal(tfab_shm_ring_at(r, acked)->status, -(int32_t)(j & 7));
			acked += tfab_shm_inline_entries(ring_len_of(j));
			acks++;
		}
		if (k < RING_WRITES) {
			size_t len = ring_len_of(k);
			unsigned n = tfab_shm_inline_entries(len);
			struct tfab_shm_entry *e;

			if (!tfab_shm_ring_room(head, acked, n)) {
				sched_yield();
				continue;
			}
			fill(buf, len, k);
			e = tfab_shm_ring_at(r, head);
			e->kind = TFAB_SHM_E_INLINE;
			e->imm = (uint32_t)k;
			e->len = len;
			e->status = 0; /* the consumer writes only a refusal */
			tfab_shm_ring_put_inline(r, head, buf, len);
			starts[head % TFAB_SHM_RING_N] = k;
			tfab_shm_ring_publish(r, head);
			head += n;
			k++;
		}
	}
	assert_int_equal(pthread_join(t, &bad), 0);
	free(starts);
	free(r);
	assert_int_equal((uintptr_t)bad, 0);
	assert_int_equal(acks, RING_WRITES);
	assert_int_equal(head, acked);
}

/*
 * Continuation entries hold raw bytes where a header's sequence word would be. Once taken,
 * a slot must not pass for published on the next lap whatever bytes it last held: here a
 * payload whose bytes at the continuation slot's sequence word read as exactly the number
 * the consumer will look for there one lap later.
 */
static void test_ring_stale_slot(void **state)
{
	struct tfab_shm_ring *r = aligned_alloc(64, sizeof(*r));
	uint8_t buf[TFAB_SHM_INLINE_HEAD + 8], out[sizeof(buf)];
	uint64_t forged = 1 + TFAB_SHM_RING_N + 1; /* slot 1's sequence one lap on */
	uint64_t tail = 0;

	(void)state;
	assert_non_null(r);
	memset(r, 0, sizeof(*r));
	memset(buf, 0, sizeof(buf));
	memcpy(buf + TFAB_SHM_INLINE_HEAD, &forged, sizeof(forged));
	tfab_shm_ring_at(r, 0)->len = sizeof(buf);
	tfab_shm_ring_put_inline(r, 0, buf, sizeof(buf));
	tfab_shm_ring_publish(r, 0);
	assert_non_null(tfab_shm_ring_peek(r, 0));
	tfab_shm_ring_get_inline(r, 0, out, sizeof(out));
	assert_memory_equal(out, buf, sizeof(buf));
	tfab_shm_ring_take(r, 0, 2, 0);
	tail = 2;
	/* One-entry writes round the ring up to the slot before the forged one. */
	for (uint64_t i = 2; i < TFAB_SHM_RING_N + 1; i++) {
		tfab_shm_ring_at(r, i)->len = 0;
		tfab_shm_ring_publish(r, i);
		assert_non_null(tfab_shm_ring_peek(r, tail));
		tfab_shm_ring_take(r, tail, 1, 0);
		tail++;
	}
	tfab_shm_ring_release(r, tail);
	/* Nothing is published at slot 1 this lap: the consumer must see nothing. */
	assert_null(tfab_shm_ring_peek(r, tail));
	free(r);
}

/* ---- addresses ---- */

static void test_foreign_address(void **state)
{
	struct tfab_ep *a = open_ep(), *b = open_ep();
	struct tfab_shm_addr addr, forged;
	struct tfab_conn *conn = NULL;
	size_t len = sizeof(addr);

	(void)state;
	assert_int_equal(tfab_ep_get_addr(b, &addr, &len), 0);
	assert_int_equal(len, sizeof(addr));

	forged = addr;
	forged.host.boot_id[3] ^= 1; /* another boot: another host */
	assert_int_equal(tfab_ep_connect(a, &forged, len, &conn), -EHOSTUNREACH);
	forged = addr;
	forged.host.pid_ns++;
	assert_int_equal(tfab_ep_connect(a, &forged, len, &conn), -EHOSTUNREACH);
	forged = addr;
	forged.host.mnt_ns++;
	assert_int_equal(tfab_ep_connect(a, &forged, len, &conn), -EHOSTUNREACH);
	forged = addr;
	forged.magic ^= 1;
	assert_int_equal(tfab_ep_connect(a, &forged, len, &conn), -EINVAL);
	assert_int_equal(tfab_ep_connect(a, &addr, len - 1, &conn), -EINVAL);
	forged = addr;
	forged.ep_id ^= 1; /* the segment is not the endpoint advertised */
	assert_int_equal(tfab_ep_connect(a, &forged, len, &conn), -TFAB_ERR_PEER_FAILED);
	assert_null(conn);
	assert_int_equal(tfab_ep_connect(a, &addr, len, &conn), 0);
	assert_int_equal(tfab_conn_disconnect(conn), 0);
	assert_int_equal(tfab_ep_close(a), 0);
	assert_int_equal(tfab_ep_close(b), 0);
}

struct outcome {
	int writes_done, errors, remote_writes, status;
	uint32_t imm;
	uint64_t len;
};

static void pump(struct tfab_ep *ep, struct outcome *o)
{
	struct tfab_event ev[16];
	int n = tfab_ep_poll(ep, ev, 16);

	assert_true(n >= 0);
	for (int i = 0; i < n; i++) {
		if (ev[i].type == TFAB_EV_WRITE_DONE)
			o->writes_done++;
		else if (ev[i].type == TFAB_EV_REMOTE_WRITE) {
			o->remote_writes++;
			o->imm = ev[i].imm;
			o->len = ev[i].len;
		} else {
			o->errors++;
			o->status = ev[i].status;
		}
	}
}

/*
 * The target writes its verdict into an entry only when it refuses the write, so the writer
 * clears it in every entry it publishes: a refused write, then more than a lap of good ones
 * through the same slot, each of them done and none taken for a refusal.
 */
static void test_refused_then_lap(void **state)
{
	enum { WRITES = TFAB_SHM_RING_N + 8 };
	struct tfab_ep *a = open_ep(), *b = open_ep();
	uint64_t bbuf[2] = {0}, word;
	struct tfab_mr *bmr;
	struct tfab_conn *conn;
	struct tfab_shm_addr addr;
	size_t alen = sizeof(addr);
	struct outcome oa = {0}, ob = {0};

	(void)state;
	assert_int_equal(tfab_mr_reg(b, bbuf, sizeof(bbuf), TFAB_MR_REMOTE_WRITE, &bmr), 0);
	assert_int_equal(tfab_ep_get_addr(b, &addr, &alen), 0);
	assert_int_equal(tfab_ep_connect(a, &addr, alen, &conn), 0);
	word = 7;
	assert_int_equal(tfab_conn_write_imm(conn, &word, sizeof(word), NULL, bmr->raddr,
					     bmr->rkey + 0x10000, 1, 0, &word),
			 0);
	for (uint64_t deadline = tfab__now_ms() + WAIT_MS;
	     !oa.errors && !oa.writes_done && tfab__now_ms() < deadline;) {
		pump(b, &ob);
		pump(a, &oa);
	}
	assert_int_equal(oa.errors, 1);
	assert_int_equal(oa.status, -TFAB_ERR_REMOTE_ACCESS);
	assert_int_equal(ob.remote_writes, 0);
	/* one write at a time, so that every entry of the ring is taken and completed in turn */
	for (uint64_t k = 0; k < WRITES; k++) {
		int done = oa.writes_done;

		word = 100 + k;
		assert_int_equal(tfab_conn_write_imm(conn, &word, sizeof(word), NULL, bmr->raddr,
						     bmr->rkey, (uint32_t)k, 0, &word),
				 0);
		for (uint64_t deadline = tfab__now_ms() + WAIT_MS;
		     oa.errors == 1 && oa.writes_done == done && tfab__now_ms() < deadline;) {
			pump(b, &ob);
			pump(a, &oa);
		}
		if (oa.errors != 1 || oa.writes_done != done + 1)
			fail_msg("write %llu: %d errors (%s), %d done, %d landed",
				 (unsigned long long)k, oa.errors, tfab_strerror(oa.status),
				 oa.writes_done, ob.remote_writes);
		assert_int_equal(bbuf[0], 100 + k);
	}
	assert_int_equal(ob.remote_writes, WRITES);
	assert_int_equal(tfab_conn_disconnect(conn), 0);
	assert_int_equal(tfab_mr_dereg(bmr), 0);
	assert_int_equal(tfab_ep_close(a), 0);
	assert_int_equal(tfab_ep_close(b), 0);
}

/*
 * A poll that finds peers' writes leaves its own completions for later, but for at most
 * TFAB_SHM_TX_DEFER polls in a row: with a write of b's arriving before every poll of a's, a's
 * own write completes after the first poll and within TFAB_SHM_TX_DEFER + 1 (never, were the
 * deferral unbounded); a poll that finds nothing arriving reads the completion at once.
 */
static void test_completions_not_starved(void **state)
{
	enum { ROUNDS = 4 * TFAB_SHM_TX_DEFER };
	struct tfab_ep *a = open_ep(), *b = open_ep();
	uint64_t abuf = 0, bbuf = 0, word = 42;
	struct tfab_mr *amr, *bmr;
	struct tfab_conn *ca, *cb;
	struct tfab_shm_addr addr;
	size_t alen = sizeof(addr);

	(void)state;
	assert_int_equal(tfab_mr_reg(a, &abuf, sizeof(abuf), TFAB_MR_REMOTE_WRITE, &amr), 0);
	assert_int_equal(tfab_mr_reg(b, &bbuf, sizeof(bbuf), TFAB_MR_REMOTE_WRITE, &bmr), 0);
	assert_int_equal(tfab_ep_get_addr(b, &addr, &alen), 0);
	assert_int_equal(tfab_ep_connect(a, &addr, alen, &ca), 0);
	alen = sizeof(addr);
	assert_int_equal(tfab_ep_get_addr(a, &addr, &alen), 0);
	assert_int_equal(tfab_ep_connect(b, &addr, alen, &cb), 0);
	for (int quiet = 0; quiet < 2; quiet++) {
		struct outcome oa = {0}, ob = {0};
		int polls = 0;

		assert_int_equal(tfab_conn_write_imm(ca, &word, sizeof(word), NULL, bmr->raddr,
						     bmr->rkey, 1, 0, &word),
				 0);
		/* b takes it (and releases its tail): a's completion is there to be read */
		for (uint64_t deadline = tfab__now_ms() + WAIT_MS;
		     !ob.remote_writes && tfab__now_ms() < deadline;)
			pump(b, &ob);
		assert_int_equal(ob.remote_writes, 1);
		while (!oa.writes_done && polls < ROUNDS) {
			struct outcome before = oa;

			if (!quiet)
				assert_int_equal(tfab_conn_write_imm(cb, &word, sizeof(word), NULL,
								     amr->raddr, amr->rkey, 2,
								     TFAB_WRITE_INJECT, NULL),
						 0);
			pump(a, &oa);
			polls++;
			if (!quiet)
				assert_int_equal(oa.remote_writes, before.remote_writes + 1);
		}
		assert_int_equal(oa.errors, 0);
		/* arriving: left for later (the first poll reads only what arrived), but bounded */
		if (oa.writes_done != 1 || polls > (quiet ? 1 : (int)TFAB_SHM_TX_DEFER + 1) ||
		    (!quiet && polls == 1))
			fail_msg("%s: completion after %d polls (%d seen)",
				 quiet ? "nothing arriving" : "a write arriving before each poll",
				 polls, oa.writes_done);
		/* b's own injected writes are done with as a reads them: b's ring is drained */
		for (int k = 0; k < 4; k++)
			pump(b, &ob);
		assert_int_equal(ob.errors, 0);
	}
	assert_int_equal(tfab_conn_disconnect(ca), 0);
	assert_int_equal(tfab_conn_disconnect(cb), 0);
	assert_int_equal(tfab_mr_dereg(amr), 0);
	assert_int_equal(tfab_mr_dereg(bmr), 0);
	assert_int_equal(tfab_ep_close(a), 0);
	assert_int_equal(tfab_ep_close(b), 0);
}

/*
 * Writes too long for the ring are placed by the writer itself, so it checks the target's
 * registration first: a bad key, a range past the region, or a region not open to remote
 * writes is an ERROR event for that write and not one byte lands. (The conformance suite's
 * bad writes are short enough to travel inline, checked by the target.)
 */
static void test_bad_long_write(void **state)
{
	enum { LEN = 1 << 20 };
	struct tfab_ep *a = open_ep(), *b = open_ep();
	uint8_t *src = malloc(LEN), *dst = calloc(1, 2 * LEN);
	struct tfab_mr *smr, *dmr, *ro;
	struct tfab_conn *conn;
	struct tfab_shm_addr addr;
	size_t alen = sizeof(addr);
	struct {
		uint64_t raddr, rkey;
		const char *what;
	} bad[3];

	(void)state;
	assert_non_null(src);
	assert_non_null(dst);
	memset(src, 0x77, LEN);
	assert_int_equal(tfab_mr_reg(a, src, LEN, TFAB_MR_LOCAL_WRITE, &smr), 0);
	assert_int_equal(tfab_mr_reg(b, dst, LEN, TFAB_MR_REMOTE_WRITE, &dmr), 0);
	assert_int_equal(tfab_mr_reg(b, dst + LEN, LEN, TFAB_MR_LOCAL_WRITE, &ro), 0);
	assert_int_equal(tfab_ep_get_addr(b, &addr, &alen), 0);
	assert_int_equal(tfab_ep_connect(a, &addr, alen, &conn), 0);
	bad[0].raddr = dmr->raddr, bad[0].rkey = dmr->rkey + 0x10000, bad[0].what = "bad key";
	bad[1].raddr = dmr->raddr + 64, bad[1].rkey = dmr->rkey, bad[1].what = "past the end";
	bad[2].raddr = ro->raddr, bad[2].rkey = ro->rkey, bad[2].what = "not remote-writable";
	for (int i = 0; i < 3; i++) {
		struct outcome oa = {0}, ob = {0};

		assert_int_equal(
		    tfab_conn_write_imm(conn, src, LEN, smr, bad[i].raddr, bad[i].rkey, 9, 0, src),
		    0);
		for (uint64_t deadline = tfab__now_ms() + WAIT_MS;
		     !oa.errors && !oa.writes_done && tfab__now_ms() < deadline;) {
			pump(a, &oa);
			pump(b, &ob);
		}
		if (oa.errors != 1 || oa.status != -TFAB_ERR_REMOTE_ACCESS)
			fail_msg("%s: %d errors (%s), %d done", bad[i].what, oa.errors,
				 tfab_strerror(oa.status), oa.writes_done);
		assert_int_equal(ob.remote_writes, 0);
		for (size_t k = 0; k < 2 * LEN; k++)
			if (dst[k])
				fail_msg("%s: byte %zu landed", bad[i].what, k);
	}
	assert_int_equal(tfab_conn_disconnect(conn), 0);
	assert_int_equal(tfab_mr_dereg(smr), 0);
	assert_int_equal(tfab_mr_dereg(dmr), 0);
	assert_int_equal(tfab_mr_dereg(ro), 0);
	assert_int_equal(tfab_ep_close(a), 0);
	assert_int_equal(tfab_ep_close(b), 0);
	free(src);
	free(dst);
}

/* ---- two processes ---- */

/* A target endpoint's address and region, as handed to a writer. */
struct target {
	struct tfab_shm_addr addr;
	uint64_t raddr, rkey;
};

#if defined(__x86_64__)
/* process_vm_writev fails with EPERM in this process from now on, as under a container's. */
static int refuse_cma(void)
{
	struct sock_filter f[] = {
	    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
	    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
	    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
	    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_writev, 0, 1),
	    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
	    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = {.len = sizeof(f) / sizeof(f[0]), .filter = f};

	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
		return -errno;
	return 0;
}
#endif

enum cma_mode { CMA_ALLOWED, CMA_REFUSED_BEFORE_OPEN, CMA_REFUSED_AFTER_OPEN };

/*
 * The writer, in a child: one write of len bytes to the target, then its statistics checked
 * against the path it should have taken. Exit status 0 when all held.
 */
static int writer_child(const struct target *t, size_t len, enum cma_mode mode, int want_path)
{
	struct tfab_ep *ep;
	struct tfab_conn *conn;
	struct tfab_shm_stats st;
	struct outcome o = {0};
	uint8_t *src = malloc(len);
	uint64_t deadline = tfab__now_ms() + WAIT_MS;
	struct tfab_open_args args = {.cfg = &cfg, .local_only = true};
	int rc;

	alarm(60);
	if (!src)
		return 10;
	fill(src, len, len);
#if defined(__x86_64__)
	if (mode == CMA_REFUSED_BEFORE_OPEN && refuse_cma())
		return 11;
#endif
	if (tfab_shm_ops.open(&args, &ep))
		return 12;
	if (mode == CMA_REFUSED_BEFORE_OPEN && strcmp(tfab_ep_caps(ep)->domain, "bounce") != 0)
		return 13; /* the caps say which */
#if defined(__x86_64__)
	if (mode == CMA_REFUSED_AFTER_OPEN && refuse_cma())
		return 11;
#endif
	if (tfab_ep_connect(ep, &t->addr, sizeof(t->addr), &conn))
		return 14;
	do {
		rc = tfab_conn_write_imm(conn, src, len, NULL, t->raddr, t->rkey, 0x5eed, 0, src);
		pump(ep, &o);
	} while (rc == -EAGAIN && tfab__now_ms() < deadline);
	if (rc)
		return 15;
	while (!o.writes_done && !o.errors && tfab__now_ms() < deadline)
		pump(ep, &o);
	if (o.writes_done != 1 || o.errors)
		return 16;
	tfab_shm_get_stats(ep, &st);
	if (want_path == 'b' && (st.bounce_writes != 1 || st.bounce_bytes != len || st.cma_writes))
		return 17;
	if (want_path == 'c' && (st.cma_writes != 1 || st.cma_bytes != len || st.bounce_writes))
		return 18;
	if (want_path == 's' &&
	    (st.seg_writes != 1 || st.seg_bytes != len || st.cma_writes || st.bounce_writes))
		return 19;
	if (mode != CMA_ALLOWED && strcmp(tfab_ep_caps(ep)->domain, "bounce") != 0)
		return 20;
	tfab_conn_disconnect(conn);
	if (tfab_ep_close(ep))
		return 21;
	free(src);
	return 0;
}

/* This process is the target; a child writes len bytes into its region. */
static void one_write(size_t len, bool shared, enum cma_mode mode, int want_path)
{
	struct tfab_ep *ep = open_ep();
	struct target t;
	struct tfab_mr *mr;
	struct outcome o = {0};
	size_t alen = sizeof(t.addr), total = len + 4096;
	uint8_t *dst, verdict = 255;
	int status, fds[2];
	pid_t pid;

	if (shared)
		assert_int_equal(tfab_shm_ops.mem_alloc(ep, total, (void **)&dst), 0);
	else
		dst = malloc(total);
	assert_non_null(dst);
	memset(dst, 0xa5, total);
	assert_int_equal(tfab_mr_reg(ep, dst, total, TFAB_MR_REMOTE_WRITE, &mr), 0);
	assert_int_equal(tfab_ep_get_addr(ep, &t.addr, &alen), 0);
	t.raddr = mr->raddr + 7; /* not aligned: the copies must not care */
	t.rkey = mr->rkey;
	/*
	 * The child's verdict comes through a pipe, not its exit status: under valgrind a forked
	 * child's exit runs a leak check over the parent's memory it inherited.
	 */
	assert_int_equal(pipe(fds), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		uint8_t code = (uint8_t)writer_child(&t, len, mode, want_path);

		close(fds[0]);
		_exit(write(fds[1], &code, 1) == 1 ? 0 : 99);
	}
	close(fds[1]);
	for (uint64_t deadline = tfab__now_ms() + WAIT_MS;
	     !o.remote_writes && tfab__now_ms() < deadline;)
		pump(ep, &o);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	if (read(fds[0], &verdict, 1) != 1 || verdict)
		fail_msg("the writer failed: %d (which check: writer_child), status %#x", verdict,
			 status);
	close(fds[0]);
	assert_int_equal(o.remote_writes, 1);
	assert_int_equal(o.imm, 0x5eed);
	assert_int_equal(o.len, len);
	assert_int_equal(o.errors, 0);
	if (!check(dst + 7, len, len))
		fail_msg("the %zu bytes that landed differ", len);
	for (size_t i = 0; i < 7; i++)
		assert_int_equal(dst[i], 0xa5);
	for (size_t i = len + 7; i < total; i++)
		assert_int_equal(dst[i], 0xa5);
	assert_int_equal(tfab_mr_dereg(mr), 0);
	if (shared)
		tfab_shm_ops.mem_free(ep, dst, total);
	else
		free(dst);
	assert_int_equal(tfab_ep_close(ep), 0);
}

static void test_cma(void **state)
{
	(void)state;
	one_write((8u << 20) + 13, false, CMA_ALLOWED, 'c');
}

/* Short writes bounce even where CMA works: cheaper than a system call. */
static void test_short_bounce(void **state)
{
	(void)state;
	one_write(4096 + 3, false, CMA_ALLOWED, 'b');
}

static void test_shared_segment(void **state)
{
	(void)state;
	one_write((64u << 20) + 5, true, CMA_ALLOWED, 's');
}

static void test_bounce_refused_before_open(void **state)
{
	(void)state;
#if defined(__x86_64__)
	one_write((8u << 20) + 13, false, CMA_REFUSED_BEFORE_OPEN, 'b');
#else
	print_message("SKIP: the seccomp filter names x86-64 system call numbers\n");
	skip();
#endif
}

static void test_bounce_refused_at_first_write(void **state)
{
	(void)state;
#if defined(__x86_64__)
	one_write((3u << 20) + 1, false, CMA_REFUSED_AFTER_OPEN, 'b');
#else
	print_message("SKIP: the seccomp filter names x86-64 system call numbers\n");
	skip();
#endif
}

/* ---- a receiver killed mid-transfer ---- */

/*
 * Names in /dev/shm that a process left there: ours would carry "tfab" or its pid (as
 * libfabric's do). Others' names are not counted, since other tests may run beside this one.
 */
static int count_dev_shm(pid_t pid)
{
	DIR *d = opendir("/dev/shm");
	struct dirent *e;
	char p[32];
	int n = 0;

	if (!d)
		return 0;
	snprintf(p, sizeof(p), "%d", (int)pid);
	while ((e = readdir(d)) != NULL)
		n += strstr(e->d_name, "tfab") != NULL || strstr(e->d_name, p) != NULL;
	closedir(d);
	return n;
}

/* Mappings in this process of shared segments of our kind (memfd:tfab-shm-...). */
static int count_maps(const char *what)
{
	FILE *f = fopen("/proc/self/maps", "re");
	char line[512];
	int n = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, what) != NULL;
	fclose(f);
	return n;
}

/* The receiver, in a child: a target region, its address to the parent, then polls. */
static void receiver_child(int fd, size_t len, bool shared)
{
	struct tfab_ep *ep;
	struct tfab_mr *mr;
	struct target t;
	struct outcome o = {0};
	size_t alen = sizeof(t.addr);
	void *dst;
	struct tfab_open_args args = {.cfg = &cfg, .local_only = true};

	alarm(60);
	if (tfab_shm_ops.open(&args, &ep))
		_exit(3);
	if (shared ? tfab_shm_ops.mem_alloc(ep, len, &dst) : !(dst = malloc(len)))
		_exit(4);
	if (tfab_mr_reg(ep, dst, len, TFAB_MR_REMOTE_WRITE, &mr) ||
	    tfab_ep_get_addr(ep, &t.addr, &alen))
		_exit(5);
	t.raddr = mr->raddr;
	t.rkey = mr->rkey;
	if (tfab__sock_send_msg(fd, &t, sizeof(t), 5000))
		_exit(6);
	for (;;)
		pump(ep, &o);
}

static void killed_mid_transfer(bool shared)
{
	const size_t len = 256u << 20;
	struct tfab_ep *ep = open_ep();
	struct tfab_conn *conn;
	struct tfab_shm_stats st;
	struct tfab_mr *smr;
	struct outcome o = {0};
	struct target t;
	uint8_t *src = malloc(len);
	int sv[2], status, shm_before;
	int maps_before = count_maps("tfab-shm-data"), ctrl_before = count_maps("tfab-shm-ctrl");
	uint64_t killed_at, seen_at;
	uint32_t got;
	pid_t pid;

	assert_non_null(src);
	memset(src, 0x42, len);
	assert_int_equal(tfab_mr_reg(ep, src, len, TFAB_MR_LOCAL_WRITE, &smr), 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(sv[0]);
		receiver_child(sv[1], len, shared);
	}
	close(sv[1]);
	shm_before = count_dev_shm(pid);
	assert_int_equal(tfab__sock_recv_msg(sv[0], &t, sizeof(t), &got, WAIT_MS), 0);
	close(sv[0]);
	assert_int_equal(got, sizeof(t));
	assert_int_equal(tfab_ep_connect(ep, &t.addr, sizeof(t.addr), &conn), 0);
	/* The write copies a few MiB per poll: the receiver dies with most of it to go. */
	assert_int_equal(tfab_conn_write_imm(conn, src, len, smr, t.raddr, t.rkey, 1, 0, src), 0);
	pump(ep, &o);
	assert_int_equal(kill(pid, SIGKILL), 0);
	killed_at = tfab__now_ms();
	assert_int_equal(waitpid(pid, &status, 0), pid);
	while (!o.errors && !o.writes_done && tfab__now_ms() < killed_at + WAIT_MS)
		pump(ep, &o);
	seen_at = tfab__now_ms();
	print_message("receiver killed mid-way (%s): error %s after %llu ms\n",
		      shared ? "shared segment" : "cma", tfab_strerror(o.status),
		      (unsigned long long)(seen_at - killed_at));
	assert_int_equal(o.writes_done, 0);
	assert_int_equal(o.errors, 1);
	assert_int_equal(o.status, -TFAB_ERR_PEER_FAILED);
	/* Seen within the bound (1 ms between checks, a coarse clock), with room for a busy CI. */
	assert_true(seen_at - killed_at < 1000);
	tfab_shm_get_stats(ep, &st);
	/* Later writes are refused at once, and nothing hangs. */
	assert_int_equal(tfab_conn_write_imm(conn, src, 8, smr, t.raddr, t.rkey, 2, 0, src),
			 -TFAB_ERR_PEER_FAILED);
	assert_int_equal(tfab_conn_disconnect(conn), 0);
	/* Nothing of the dead process in /dev/shm, nor mapped here once disconnected. */
	assert_int_equal(count_dev_shm(pid), shm_before);
	assert_int_equal(count_maps("tfab-shm-data"), maps_before);
	assert_int_equal(count_maps("tfab-shm-ctrl"), ctrl_before); /* our own endpoint's */
	assert_int_equal(tfab_mr_dereg(smr), 0);
	assert_int_equal(tfab_ep_close(ep), 0);
	assert_int_equal(count_maps("tfab-shm-ctrl"), ctrl_before - 1);
	free(src);
}

static void test_killed_mid_transfer_cma(void **state)
{
	(void)state;
	killed_mid_transfer(false);
}

static void test_killed_mid_transfer_shared(void **state)
{
	(void)state;
	killed_mid_transfer(true);
}

/* A writer killed: its slot at the target is freed, so that writers never run out. */
static void test_writer_killed_slot_freed(void **state)
{
	struct tfab_ep *ep = open_ep();
	struct tfab_shm_addr addr;
	size_t alen = sizeof(addr);
	struct tfab_shm_stats st;
	struct outcome o = {0};
	int status;
	pid_t pid;

	(void)state;
	assert_int_equal(tfab_ep_get_addr(ep, &addr, &alen), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct tfab_ep *w;
		struct tfab_conn *c;
		struct tfab_open_args args = {.cfg = &cfg, .local_only = true};

		if (tfab_shm_ops.open(&args, &w) || tfab_ep_connect(w, &addr, alen, &c))
			_exit(3);
		raise(SIGKILL);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFSIGNALED(status));
	tfab_shm_get_stats(ep, &st);
	assert_int_equal(st.writers, 1);
	for (uint64_t deadline = tfab__now_ms() + 2000; tfab__now_ms() < deadline && st.writers;) {
		pump(ep, &o);
		tfab_shm_get_stats(ep, &st);
	}
	assert_int_equal(st.writers, 0);
	assert_int_equal(tfab_ep_close(ep), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_ring_threads),
	    cmocka_unit_test(test_ring_stale_slot),
	    cmocka_unit_test(test_foreign_address),
	    cmocka_unit_test(test_bad_long_write),
	    cmocka_unit_test(test_refused_then_lap),
	    cmocka_unit_test(test_completions_not_starved),
	    cmocka_unit_test(test_cma),
	    cmocka_unit_test(test_short_bounce),
	    cmocka_unit_test(test_shared_segment),
	    cmocka_unit_test(test_bounce_refused_before_open),
	    cmocka_unit_test(test_bounce_refused_at_first_write),
	    cmocka_unit_test(test_killed_mid_transfer_cma),
	    cmocka_unit_test(test_killed_mid_transfer_shared),
	    cmocka_unit_test(test_writer_killed_slot_freed),
	};
	char err[512];

	if (tfab__config_init(&cfg, err, sizeof(err))) {
		fprintf(stderr, "configuration: %s\n", err);
		return 1;
	}
	return cmocka_run_group_tests_name("shm backend", tests, NULL, NULL) ? 1 : 0;
}
