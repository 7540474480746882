/*
 * The provider conformance suite, written once and run against every backend and fabric
 * (TFAB_PROVIDER picks which): capabilities, registration in the fabric's MR mode, writes with
 * immediate (integrity, immediates, many in flight, zero length, 64 MiB, back-pressure), bad
 * remote keys and addresses, and a peer killed mid-run.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tfab/tfab.h>

#include "harness.h"
#include "test/common/shm_cleanup.h"
#include "util/sock.h"

#define WAIT_MS 20000 /* generous: sockets on 2 busy cores takes milliseconds per write */

static void reset_trackers(void)
{
	memset(&H.a.t, 0, sizeof(H.a.t));
	memset(&H.b.t, 0, sizeof(H.b.t));
}

static void *xmalloc(size_t len)
{
	void *p = malloc(len);

	assert_non_null(p);
	return p;
}

static void test_caps(void **state)
{
	const struct tfab_caps *c = H.a.caps;
	char addr[512];
	size_t len = sizeof(addr), small = 1;

	(void)state;
	assert_true(c->imm_bytes >= 4);
	assert_true(c->key_bytes >= 4 && c->key_bytes <= 8);
	assert_true(c->max_msg_size >= (64u << 20));
	assert_true(c->mr_addr == TFAB_MR_ADDR_VIRT || c->mr_addr == TFAB_MR_ADDR_OFFSET);
	assert_non_null(c->backend);
	assert_true(c->fabric[0] != '\0');
	assert_int_equal(H.ops->get_addr(H.a.ep, addr, &len), 0);
	assert_int_equal(len, c->addr_len);
	assert_true(len > 0);
	/* A buffer too small is refused, and says so. */
	assert_int_equal(H.ops->get_addr(H.a.ep, addr, &small), -ENOSPC);
	/* Distinct endpoints have distinct addresses. */
	{
		char other[512];
		size_t olen = sizeof(other);

		assert_int_equal(H.ops->get_addr(H.b.ep, other, &olen), 0);
		assert_false(olen == len && memcmp(addr, other, len) == 0);
	}
	print_message("caps: backend=%s fabric=%s domain=%s mr=%s key=%uB inject=%zu manual=%d\n",
		      c->backend, c->fabric, c->domain,
		      c->mr_addr == TFAB_MR_ADDR_VIRT ? "virt" : "offset", c->key_bytes,
		      c->inject_size, c->manual_progress);
}

static void test_mr_modes(void **state)
{
	enum { N = 8 };
	struct tfab_mr *mr[N];
	char *buf[N];

	(void)state;
	for (int i = 0; i < N; i++) {
		buf[i] = xmalloc(4096 * (size_t)(i + 1));
		mr[i] = harness_reg(&H.b, buf[i], 4096 * (size_t)(i + 1));
		assert_ptr_equal(mr[i]->addr, buf[i]);
		assert_int_equal(mr[i]->len, 4096 * (size_t)(i + 1));
		/* The advertised address follows the fabric's mode. */
		if (H.b.caps->mr_addr == TFAB_MR_ADDR_VIRT)
			assert_int_equal(mr[i]->raddr, (uint64_t)(uintptr_t)buf[i]);
		else
			assert_int_equal(mr[i]->raddr, 0);
		for (int j = 0; j < i; j++)
			assert_false(mr[j]->rkey == mr[i]->rkey);
	}
	/* Registration of nothing is refused, and an endpoint with live regions won't close. */
	{
		struct tfab_mr *bad = NULL;

		assert_int_equal(H.ops->mr_reg(H.b.ep, NULL, 16, TFAB_MR_REMOTE_WRITE, &bad),
				 -EINVAL);
		assert_int_equal(H.ops->mr_reg(H.b.ep, buf[0], 0, TFAB_MR_REMOTE_WRITE, &bad),
				 -EINVAL);
		assert_null(bad);
	}
	assert_int_equal(H.ops->close(H.b.ep), -EBUSY);
	for (int i = 0; i < N; i++) {
		assert_int_equal(H.ops->mr_dereg(mr[i]), 0);
		free(buf[i]);
	}
}

/*
 * Remote keys the backend chooses are unpredictable (doc/security.md): the same buffer
 * registered again and again gets keys that are distinct and far apart in the key's space
 * (a counter's would be 1 or one slot's step apart). Keys the fabric chooses are its own.
 */
static void test_rkeys_unpredictable(void **state)
{
	enum { N = 16 };
	uint64_t key[N], space_bits, near;
	char *buf = xmalloc(4096);

	(void)state;
	if (H.b.caps->prov_keys) {
		print_message("rkeys: chosen by the fabric (%s), not checked\n", H.b.caps->fabric);
		free(buf);
		return;
	}
	space_bits = H.b.caps->key_bytes && H.b.caps->key_bytes < 8 ? 8u * H.b.caps->key_bytes : 64;
	/* A random pair lands this near one time in 2^20. */
	near = space_bits > 20 ? 1ull << (space_bits - 20) : 0;
	for (int i = 0; i < N; i++) {
		struct tfab_mr *mr = harness_reg(&H.b, buf, 4096);

		key[i] = mr->rkey;
		assert_int_equal(H.ops->mr_dereg(mr), 0);
		for (int j = 0; j < i; j++) {
			uint64_t d = key[i] > key[j] ? key[i] - key[j] : key[j] - key[i];

			if (d <= near)
				fail_msg("keys %#llx and %#llx are %llu apart",
					 (unsigned long long)key[j], (unsigned long long)key[i],
					 (unsigned long long)d);
		}
	}
	free(buf);
}

/* One write of len bytes at offset into a larger target, with imm; checks all of it. */
static void write_and_check(size_t len, size_t offset, uint32_t imm)
{
	size_t total = offset + len + 64, bad = 0;
	uint8_t *src = xmalloc(len ? len : 1), *dst = xmalloc(total);
	struct tfab_mr *smr = harness_reg(&H.a, src, len ? len : 1);
	struct tfab_mr *dmr = harness_reg(&H.b, dst, total);
	uint64_t seed = len * 31 + offset + imm;
	bool ok;

	reset_trackers();
	H.a.t.watch_ctx = src;
	fill_pattern(src, len, seed);
	memset(dst, 0xa5, total);
	assert_int_equal(harness_write(&H.a, src, len, smr, dmr, offset, imm, src, WAIT_MS), 0);
	WAIT_FOR(ok, H.a.t.watch_done && H.b.t.remote_writes == 1, WAIT_MS);
	assert_true(ok);
	assert_int_equal(H.a.t.watch_status, 0);
	assert_int_equal(H.b.t.last_imm, imm);
	if (H.b.t.last_len)
		assert_int_equal(H.b.t.last_len, len);
	if (!check_pattern(dst + offset, len, seed, &bad))
		fail_msg("%zu-byte write differs at byte %zu", len, bad);
	for (size_t i = 0; i < offset; i++)
		assert_int_equal(dst[i], 0xa5);
	for (size_t i = offset + len; i < total; i++)
		assert_int_equal(dst[i], 0xa5);
	assert_int_equal(H.ops->mr_dereg(smr), 0);
	assert_int_equal(H.ops->mr_dereg(dmr), 0);
	free(src);
	free(dst);
}

static void test_write_integrity(void **state)
{
	static const size_t sizes[] = {1, 7, 64, 4096, 65537, (1u << 20) + 3};
	static const uint32_t imms[] = {0, 1, 0x7fffffff, 0x80000000u, 0xfffffffeu, 0xffffffffu};

	(void)state;
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		write_and_check(sizes[i], i * 13, imms[i]);
}

static void test_zero_length(void **state)
{
	(void)state;
	write_and_check(0, 0, 0xabcdef01u);
	write_and_check(0, 16, 0);
}

static void test_64mib(void **state)
{
	(void)state;
	write_and_check(64u << 20, 0, 0x64646464u);
}

/* Many writes in flight to distinct slots, every one with its own immediate. */
static void test_many_in_flight(void **state)
{
	enum { N = 512, SLOT = 4096 };
	uint8_t *src = xmalloc((size_t)N * SLOT), *dst = xmalloc((size_t)N * SLOT);
	struct tfab_mr *smr = harness_reg(&H.a, src, (size_t)N * SLOT);
	struct tfab_mr *dmr = harness_reg(&H.b, dst, (size_t)N * SLOT);
	bool ok;

	(void)state;
	reset_trackers();
	memset(dst, 0, (size_t)N * SLOT);
	for (int i = 0; i < N; i++)
		fill_pattern(src + (size_t)i * SLOT, SLOT, 1000 + (uint64_t)i);
	for (int i = 0; i < N; i++)
		assert_int_equal(harness_write(&H.a, src + (size_t)i * SLOT, SLOT, smr, dmr,
					       (uint64_t)i * SLOT, 100 + (uint32_t)i, NULL,
					       WAIT_MS),
				 0);
	WAIT_FOR(ok, H.a.t.writes_done == N && H.b.t.remote_writes == N, WAIT_MS);
	assert_true(ok);
	assert_int_equal(H.a.t.errors, 0);
	for (int i = 0; i < N; i++) {
		assert_int_equal(H.b.t.imm_count[100 + i], 1);
		assert_true(check_pattern(dst + (size_t)i * SLOT, SLOT, 1000 + (uint64_t)i, NULL));
	}
	assert_int_equal(H.ops->mr_dereg(smr), 0);
	assert_int_equal(H.ops->mr_dereg(dmr), 0);
	free(src);
	free(dst);
}

/*
 * A deep window: post far more writes than any queue holds without waiting between them.
 * -EAGAIN must come back as back-pressure (never a block or a loss), and every write lands.
 */
static void test_back_pressure(void **state)
{
	enum { N = 20000, LEN = 64 };
	uint8_t *src = xmalloc(LEN), *dst = xmalloc(LEN);
	struct tfab_mr *smr = harness_reg(&H.a, src, LEN);
	struct tfab_mr *dmr = harness_reg(&H.b, dst, LEN);
	uint64_t eagain = 0, deadline = tfab__now_ms() + 60000;
	int posted = 0;
	bool ok;

	(void)state;
	reset_trackers();
	memset(src, 7, LEN);
	while (posted < N && tfab__now_ms() < deadline) {
		int rc = H.ops->write_imm(H.a.ep, H.a.peer, src, LEN, smr, dmr->raddr, dmr->rkey,
					  (uint32_t)posted % HARNESS_MAX_IMM, 0, NULL);

		if (rc == -EAGAIN) {
			eagain++;
			harness_pump();
			continue;
		}
		assert_int_equal(rc, 0);
		posted++;
	}
	assert_int_equal(posted, N);
	WAIT_FOR(ok, H.a.t.writes_done == N && H.b.t.remote_writes == N, 60000);
	print_message("back-pressure: %d writes, %llu -EAGAIN, done %llu, landed %llu\n", N,
		      (unsigned long long)eagain, (unsigned long long)H.a.t.writes_done,
		      (unsigned long long)H.b.t.remote_writes);
	assert_true(ok);
	assert_int_equal(H.a.t.errors, 0);
	assert_int_equal(H.ops->mr_dereg(smr), 0);
	assert_int_equal(H.ops->mr_dereg(dmr), 0);
	free(src);
	free(dst);
}

/*
 * A write the target must refuse. It must end in an error event for that write, or (where the
 * fabric cannot tell the writer) never land in the target; never a crash or a hang. Either way
 * the endpoints keep working afterwards.
 */
static void bad_write(uint64_t rkey_delta, uint64_t off, size_t len, const char *what)
{
	enum { SZ = 4096 };
	uint8_t *src = xmalloc(SZ), *dst = xmalloc(SZ);
	struct tfab_mr *smr = harness_reg(&H.a, src, SZ);
	struct tfab_mr *dmr = harness_reg(&H.b, dst, SZ);
	struct tfab_mr forged = *dmr;
	int marker = 0, rc;
	bool ok;

	reset_trackers();
	H.a.t.watch_ctx = &marker;
	memset(src, 0x5a, SZ);
	memset(dst, 0, SZ);
	forged.rkey += rkey_delta;
	rc = harness_write(&H.a, src, len, smr, &forged, off, 0xbad, &marker, WAIT_MS);
	if (rc == 0) {
		WAIT_FOR(ok, H.a.t.watch_done, WAIT_MS);
		assert_true(ok);
		/* Give a wrongly accepted write time to show up at the target. */
		WAIT_FOR(ok, H.b.t.remote_writes > 0, 200);
		print_message("%s: %s%s%s, target saw %llu writes, %llu errors\n", what,
			      H.a.t.errors ? "error event: " : "completed without error",
			      H.a.t.errors ? tfab_strerror(H.a.t.last_status) : "",
			      H.a.t.errors ? "" : "", (unsigned long long)H.b.t.remote_writes,
			      (unsigned long long)H.b.t.errors);
		if (H.a.t.errors)
			assert_true(H.a.t.watch_status < 0);
		assert_int_equal(H.b.t.remote_writes, 0);
	} else {
		print_message("%s: refused at post: %s\n", what, tfab_strerror(rc));
		assert_true(rc < 0);
	}
	for (size_t i = 0; i < SZ; i++)
		assert_int_equal(dst[i], 0);
	assert_int_equal(H.ops->mr_dereg(smr), 0);
	assert_int_equal(H.ops->mr_dereg(dmr), 0);
	free(src);
	free(dst);
	/* The pair still works. */
	write_and_check(4096, 8, 77);
}

static void test_bad_rkey(void **state)
{
	(void)state;
	bad_write(0x10000, 0, 256, "bad remote key");
}

static void test_out_of_range(void **state)
{
	(void)state;
	bad_write(0, 4096 - 64, 1024, "write past the region's end");
}

/* The child of the peer-death test: an endpoint with a target region, polled until killed. */
static void dead_peer_child(int fd)
{
	static uint8_t region[1 << 20];
	struct tfab_ep *ep;
	struct tfab_mr *mr;
	struct tfab_event ev[16];
	const struct tfab_provider_ops *ops;
	char err[512], msg[600];
	size_t len = 512;

	alarm(60); /* never outlive the test */
	if (tfab__provider_open(&H.cfg, true, &ops, &ep, err, sizeof(err)) ||
	    ops->mr_reg(ep, region, sizeof(region), TFAB_MR_REMOTE_WRITE, &mr))
		_exit(3);
	memcpy(msg, &mr->raddr, 8);
	memcpy(msg + 8, &mr->rkey, 8);
	if (ops->get_addr(ep, msg + 16, &len) ||
	    tfab__sock_send_msg(fd, msg, (uint32_t)(16 + len), 5000))
		_exit(4);
	for (;;)
		ops->poll(ep, ev, 16);
}

/* A child with a target region, as dead_peer_child, and the connection to it. */
static pid_t start_child(struct tfab_conn **peer_p, struct tfab_mr *target)
{
	char msg[600];
	uint32_t mlen;
	int sv[2];
	pid_t pid;

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(sv[0]);
		dead_peer_child(sv[1]);
	}
	close(sv[1]);
	assert_int_equal(tfab__sock_recv_msg(sv[0], msg, sizeof(msg), &mlen, 20000), 0);
	close(sv[0]);
	memset(target, 0, sizeof(*target));
	memcpy(&target->raddr, msg, 8);
	memcpy(&target->rkey, msg + 8, 8);
	assert_int_equal(H.ops->connect(H.a.ep, msg + 16, mlen - 16, peer_p), 0);
	return pid;
}

/*
 * Injected writes report nothing while they succeed; once their peer is dead, each failure
 * that comes back names its write (its context, marked injected), so that the engine can tell
 * whose it was. A fabric may refuse the posts instead, or say nothing within the bound.
 */
static void test_inject_to_dead_peer(void **state)
{
	static uint8_t src[8];
	static int marker;
	struct tfab_mr *smr = harness_reg(&H.a, src, sizeof(src));
	struct tfab_mr target;
	struct tfab_conn *peer;
	uint64_t deadline;
	int status, post_err = 0;
	pid_t pid;
	bool ok;

	(void)state;
	if (H.a.caps->inject_size == 0) {
		print_message("SKIP: this fabric offers no injected writes (inject_size 0)\n");
		skip();
	}
	reset_trackers();
	pid = start_child(&peer, &target);
	for (int i = 0; i < 64; i++) {
		int rc = H.ops->write_imm(H.a.ep, peer, src, 0, smr, target.raddr, target.rkey, 3,
					  TFAB_WRITE_INJECT, &marker);

		assert_true(rc == 0 || rc == -EAGAIN);
		harness_pump();
	}
	WAIT_FOR(ok, 0, 200);
	(void)ok;
	assert_int_equal(H.a.t.writes_done, 0); /* injects report nothing */
	assert_int_equal(H.a.t.errors, 0);
	kill(pid, SIGKILL);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	remove_shm_of(pid);
	deadline = tfab__now_ms() + 10000;
	while (H.a.t.errors == 0 && post_err == 0 && tfab__now_ms() < deadline) {
		int rc = H.ops->write_imm(H.a.ep, peer, src, 0, smr, target.raddr, target.rkey, 4,
					  TFAB_WRITE_INJECT, &marker);

		if (rc && rc != -EAGAIN)
			post_err = rc;
		harness_pump();
		usleep(1000);
	}
	WAIT_FOR(ok, 0, 500);
	print_message(
	    "injects to a dead peer: %llu error events (%llu marked injected, %llu naming "
	    "no write); post error %s\n",
	    (unsigned long long)H.a.t.errors, (unsigned long long)H.a.t.errors_injected,
	    (unsigned long long)H.a.t.errors_no_ctx, post_err ? tfab_strerror(post_err) : "none");
	/* A fabric may say nothing within the bound (libfabric's verbs over rxe retries on). */
	assert_int_equal(H.a.t.errors_no_ctx, 0);
	assert_int_equal(H.a.t.errors_injected, H.a.t.errors);
	if (H.a.t.errors)
		assert_ptr_equal(H.a.t.last_error_ctx, &marker);
	assert_int_equal(H.ops->disconnect(peer), 0);
	assert_int_equal(H.ops->mr_dereg(smr), 0);
	write_and_check(2048, 0, 4244);
}

static void test_peer_killed(void **state)
{
	enum { LEN = 256 << 10, WINDOW = 4 };
	uint8_t *src = xmalloc(LEN);
	struct tfab_mr *smr = harness_reg(&H.a, src, LEN);
	struct tfab_mr target;
	struct tfab_conn *peer;
	int status, posted = 0, post_err = 0;
	uint64_t done_at_kill, deadline;
	pid_t pid;
	bool ok;

	(void)state;
	reset_trackers();
	memset(src, 0x3c, LEN);
	pid = start_child(&peer, &target);

	/* Stream writes until some have landed, then kill the peer with writes outstanding. */
	deadline = tfab__now_ms() + WAIT_MS;
	while (H.a.t.writes_done < 16 && tfab__now_ms() < deadline) {
		if (posted - (int)H.a.t.writes_done < WINDOW &&
		    H.ops->write_imm(H.a.ep, peer, src, LEN, smr, target.raddr, target.rkey, 1, 0,
				     NULL) == 0)
			posted++;
		harness_pump();
	}
	assert_true(H.a.t.writes_done >= 16);
	kill(pid, SIGKILL);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	remove_shm_of(pid);
	done_at_kill = H.a.t.writes_done;

	/* Keep writing to the dead peer: errors must come back, or writes stop completing. */
	deadline = tfab__now_ms() + 15000;
	while (H.a.t.errors == 0 && post_err == 0 && tfab__now_ms() < deadline) {
		if (posted - (int)(H.a.t.writes_done + H.a.t.errors) < WINDOW) {
			int rc = H.ops->write_imm(H.a.ep, peer, src, LEN, smr, target.raddr,
						  target.rkey, 2, 0, NULL);

			if (rc == 0)
				posted++;
			else if (rc != -EAGAIN)
				post_err = rc;
		}
		harness_pump();
	}
	print_message(
	    "peer killed: %llu writes done before, %llu after; %llu error events (%s: "
	    "%s); post error %s\n",
	    (unsigned long long)done_at_kill,
	    (unsigned long long)(H.a.t.writes_done - done_at_kill),
	    (unsigned long long)H.a.t.errors, H.a.t.errors ? tfab_strerror(H.a.t.last_status) : "-",
	    H.a.t.errors ? H.a.t.last_errmsg : "-", post_err ? tfab_strerror(post_err) : "none");
	/* A fabric that never reports it must at least stop completing writes to the dead. */
	if (!H.a.t.errors && !post_err)
		assert_true(H.a.t.writes_done - done_at_kill <= (uint64_t)WINDOW * 2);
	if (H.a.t.errors)
		assert_true(H.a.t.last_status < 0);

	/* Let whatever is in flight to the dead peer drain, then the other peer still works. */
	WAIT_FOR(ok, 0, 500);
	(void)ok;
	assert_int_equal(H.ops->disconnect(peer), 0);
	assert_int_equal(H.ops->mr_dereg(smr), 0);
	free(src);
	write_and_check(2048, 0, 4242);
	/*
	 * A fabric that failed the writes in flight to the dead peer must have let go of them.
	 * One that did not (libfabric 1.17 shm: a write awaiting the dead peer's answer holds
	 * back the endpoint's later large-write completions; the backend only refuses new posts)
	 * may keep them; doc/providers.md lists that, and the engine finds dead peers by its own
	 * means.
	 */
	if (H.a.t.errors)
		write_and_check(1 << 20, 0, 4243);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_caps),
	    cmocka_unit_test(test_mr_modes),
	    cmocka_unit_test(test_rkeys_unpredictable),
	    cmocka_unit_test(test_write_integrity),
	    cmocka_unit_test(test_zero_length),
	    cmocka_unit_test(test_64mib),
	    cmocka_unit_test(test_many_in_flight),
	    cmocka_unit_test(test_back_pressure),
	    cmocka_unit_test(test_bad_rkey),
	    cmocka_unit_test(test_out_of_range),
	    cmocka_unit_test(test_peer_killed),
	    cmocka_unit_test(test_inject_to_dead_peer),
	};
	int rc = harness_open();

	if (rc)
		return rc;
	rc = cmocka_run_group_tests_name(H.name, tests, NULL, NULL);
	harness_close();
	return rc ? 1 : 0;
}
