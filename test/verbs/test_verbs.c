/*
 * The verbs backend's own tests, beyond the conformance suite (run in the VM on soft-RoCE with
 * TFAB_PROVIDER=verbs): writes posted behind one that fails by its own fault all land, once
 * and in order, after the backend re-establishes the connection; thousands of injected writes
 * with selective signalling; a write split in pieces; a connection to an endpoint that is gone
 * fails after TFAB_CONNECT_TIMEOUT_MS; a disconnect with writes in flight accounts for each;
 * blobs that are not verbs addresses are refused.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>
#include <tfab/tfab.h>

#include "harness.h"

#define WAIT_MS 30000

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

/* Post, pumping through -EAGAIN; the write's status. */
static int post(struct side *s, struct tfab_conn *conn, const void *src, size_t len,
		struct tfab_mr *lmr, uint64_t raddr, uint64_t rkey, uint32_t imm, unsigned flags,
		void *ctx)
{
	uint64_t deadline = tfab__now_ms() + WAIT_MS;
	int rc;

	for (;;) {
		rc = H.ops->write_imm(s->ep, conn, src, len, lmr, raddr, rkey, imm, flags, ctx);
		if (rc != -EAGAIN || tfab__now_ms() >= deadline)
			return rc;
		harness_pump();
	}
}

/*
 * A write with a bad key, and right behind it (no wait) writes that are fine, plain and
 * injected: the bad one gets its error; every other lands exactly once with its data, and the
 * plain ones complete.
 */
static void test_writes_behind_a_failure(void **state)
{
	enum { N = 96, SLOT = 512 };
	uint8_t *src = xmalloc((size_t)N * SLOT), *dst = xmalloc((size_t)N * SLOT);
	struct tfab_mr *smr = harness_reg(&H.a, src, (size_t)N * SLOT);
	struct tfab_mr *dmr = harness_reg(&H.b, dst, (size_t)N * SLOT);
	unsigned plain = 0;
	int bad_ctx = 0;
	bool ok;

	(void)state;
	for (int round = 0; round < 3; round++) {
		reset_trackers();
		plain = 0;
		memset(dst, 0, (size_t)N * SLOT);
		for (int i = 0; i < N; i++)
			fill_pattern(src + (size_t)i * SLOT, SLOT, 7000 + (uint64_t)i + round);
		assert_int_equal(post(&H.a, H.a.peer, src, 64, smr, dmr->raddr, dmr->rkey + 0x10000,
				      0xbad, 0, &bad_ctx),
				 0);
		for (int i = 0; i < N; i++) {
			/* Every third one injected (small enough), the rest plain. */
			bool inject = i % 3 == 0 && H.a.caps->inject_size >= 64;
			size_t len = inject ? 64 : SLOT;

			assert_int_equal(post(&H.a, H.a.peer, src + (size_t)i * SLOT, len, smr,
					      dmr->raddr + (uint64_t)i * SLOT, dmr->rkey,
					      1000 + (uint32_t)i, inject ? TFAB_WRITE_INJECT : 0,
					      NULL),
					 0);
			plain += !inject;
		}
		WAIT_FOR(
		    ok, H.a.t.errors == 1 && H.a.t.writes_done == plain && H.b.t.remote_writes == N,
		    WAIT_MS);
		print_message("round %d: %llu errors (%s), %llu of %u done, %llu of %d landed\n",
			      round, (unsigned long long)H.a.t.errors,
			      tfab_strerror(H.a.t.last_status),
			      (unsigned long long)H.a.t.writes_done, plain,
			      (unsigned long long)H.b.t.remote_writes, N);
		assert_true(ok);
		assert_ptr_equal(H.a.t.last_error_ctx, &bad_ctx);
		assert_int_equal(H.a.t.last_status, -TFAB_ERR_REMOTE_ACCESS);
		assert_int_equal(H.b.t.imm_count[0xbad], 0);
		for (int i = 0; i < N; i++) {
			bool inject = i % 3 == 0 && H.a.caps->inject_size >= 64;

			assert_int_equal(H.b.t.imm_count[1000 + i], 1);
			assert_true(check_pattern(dst + (size_t)i * SLOT, inject ? 64 : SLOT,
						  7000 + (uint64_t)i + round, NULL));
		}
	}
	assert_int_equal(H.ops->mr_dereg(smr), 0);
	assert_int_equal(H.ops->mr_dereg(dmr), 0);
	free(src);
	free(dst);
}

/* Injected writes produce no events, and selective signalling never stalls the queue. */
static void test_many_injected(void **state)
{
	enum { N = 5000, LEN = 8 };
	uint8_t *src = xmalloc(LEN), *dst = xmalloc(LEN);
	struct tfab_mr *smr = harness_reg(&H.a, src, LEN);
	struct tfab_mr *dmr = harness_reg(&H.b, dst, LEN);
	int last = 0;
	bool ok;

	(void)state;
	/* A skip only where TFAB_VERBS_INLINE turns injection off; rxe has inline data. */
	if (H.a.caps->inject_size < LEN && H.cfg.verbs_inline >= LEN)
		fail_msg("inject_size %zu with TFAB_VERBS_INLINE=%u", H.a.caps->inject_size,
			 H.cfg.verbs_inline);
	if (H.a.caps->inject_size < LEN) {
		print_message("TFAB_VERBS_INLINE=%u turns injection off\n", H.cfg.verbs_inline);
		skip();
	}
	reset_trackers();
	for (int i = 0; i < N; i++) {
		src[0] = (uint8_t)i;
		assert_int_equal(post(&H.a, H.a.peer, src, LEN, NULL, dmr->raddr, dmr->rkey,
				      (uint32_t)i, TFAB_WRITE_INJECT, NULL),
				 0);
	}
	/* The source is ours again at once: a plain write after them completes. */
	assert_int_equal(
	    post(&H.a, H.a.peer, src, LEN, smr, dmr->raddr, dmr->rkey, 60000, 0, &last), 0);
	WAIT_FOR(ok, H.a.t.writes_done == 1 && H.b.t.remote_writes == N + 1, WAIT_MS);
	assert_true(ok);
	assert_int_equal(H.a.t.errors, 0);
	for (int i = 0; i < N; i++)
		assert_int_equal(H.b.t.imm_count[i], 1);
	assert_int_equal(H.ops->mr_dereg(smr), 0);
	assert_int_equal(H.ops->mr_dereg(dmr), 0);
	free(src);
	free(dst);
}

/* A write longer than the port's max_msg_sz lands whole, its immediate after every byte. */
static void test_split_write(void **state)
{
	size_t len = (20u << 20) + 12345, bad = 0;
	uint8_t *src = xmalloc(len), *dst = xmalloc(len + 4096);
	struct tfab_mr *smr = harness_reg(&H.a, src, len);
	struct tfab_mr *dmr = harness_reg(&H.b, dst, len + 4096);
	bool ok;

	(void)state;
	reset_trackers();
	fill_pattern(src, len, 99);
	memset(dst, 0, len + 4096);
	assert_int_equal(
	    post(&H.a, H.a.peer, src, len, smr, dmr->raddr + 4096, dmr->rkey, 77, 0, src), 0);
	WAIT_FOR(ok, H.a.t.writes_done == 1 && H.b.t.remote_writes == 1, WAIT_MS);
	assert_true(ok);
	assert_int_equal(H.b.t.last_imm, 77);
	/* The exact length, or 0 where the target cannot know it. */
	assert_true(H.b.t.last_len == 0 || H.b.t.last_len == len);
	if (!check_pattern(dst + 4096, len, 99, &bad))
		fail_msg("differs at byte %zu", bad);
	for (size_t i = 0; i < 4096; i++)
		assert_int_equal(dst[i], 0);
	assert_int_equal(H.ops->mr_dereg(smr), 0);
	assert_int_equal(H.ops->mr_dereg(dmr), 0);
	free(src);
	free(dst);
}

/* An endpoint that closed before anyone connected: writes wait, then fail. */
static void test_connect_to_gone(void **state)
{
	const struct tfab_provider_ops *ops;
	struct tfab_conn *conn;
	struct tfab_ep *gone;
	char addr[512], err[512];
	size_t len = sizeof(addr);
	uint64_t start, deadline;
	uint8_t byte = 1;
	int rc, eagain = 0;

	(void)state;
	assert_int_equal(tfab__provider_open(&H.cfg, true, &ops, &gone, err, sizeof(err)), 0);
	assert_int_equal(ops->get_addr(gone, addr, &len), 0);
	assert_int_equal(ops->close(gone), 0);
	assert_int_equal(H.ops->connect(H.a.ep, addr, len, &conn), 0);
	start = tfab__now_ms();
	deadline = start + H.cfg.connect_timeout_ms + 10000;
	for (;;) {
		rc = H.ops->write_imm(H.a.ep, conn, &byte, 1, NULL, 0, 0, 1, TFAB_WRITE_INJECT,
				      NULL);
		if (rc != -EAGAIN || tfab__now_ms() > deadline)
			break;
		eagain++;
		harness_pump();
	}
	print_message("gone: %s after %llu ms (%d -EAGAIN)\n", tfab_strerror(rc),
		      (unsigned long long)(tfab__now_ms() - start), eagain);
	assert_int_equal(rc, -TFAB_ERR_PEER_FAILED);
	assert_true(tfab__now_ms() - start + 50 >= H.cfg.connect_timeout_ms);
	assert_int_equal(H.ops->disconnect(conn), 0);
}

/* A disconnect with writes in flight: each still ends in exactly one event, or none at all. */
static void test_disconnect_in_flight(void **state)
{
	enum { N = 64, LEN = 64 << 10 };
	const struct tfab_provider_ops *ops;
	struct tfab_ep *ep;
	struct tfab_conn *conn;
	uint8_t *src = xmalloc(LEN), *dst = xmalloc(LEN);
	struct tfab_mr *smr, *dmr = harness_reg(&H.b, dst, LEN);
	char addr[512], err[512];
	size_t len = sizeof(addr);
	struct tfab_event ev[32];
	unsigned seen[N] = {0}, ends = 0;
	uint64_t deadline;
	bool ok;

	(void)state;
	reset_trackers();
	assert_int_equal(tfab__provider_open(&H.cfg, true, &ops, &ep, err, sizeof(err)), 0);
	assert_int_equal(ops->mr_reg(ep, src, LEN, TFAB_MR_LOCAL_WRITE, &smr), 0);
	assert_int_equal(H.ops->get_addr(H.b.ep, addr, &len), 0);
	assert_int_equal(ops->connect(ep, addr, len, &conn), 0);
	for (int i = 0; i < N; i++) {
		int rc;

		do {
			rc = ops->write_imm(ep, conn, src, LEN, smr, dmr->raddr, dmr->rkey,
					    (uint32_t)i, 0, &seen[i]);
			if (rc == -EAGAIN) {
				int n = ops->poll(ep, ev, 32);

				for (int j = 0; j < n; j++)
					if (ev[j].type != TFAB_EV_REMOTE_WRITE && ev[j].ctx) {
						(*(unsigned *)ev[j].ctx)++;
						ends++;
					}
				harness_pump();
			}
		} while (rc == -EAGAIN);
		assert_int_equal(rc, 0);
	}
	assert_int_equal(ops->disconnect(conn), 0);
	assert_int_equal(ops->close(ep), -EBUSY); /* the region */
	deadline = tfab__now_ms() + WAIT_MS;
	while (ends < N && tfab__now_ms() < deadline) {
		int n = ops->poll(ep, ev, 32);

		assert_true(n >= 0);
		for (int j = 0; j < n; j++) {
			assert_true(ev[j].type == TFAB_EV_WRITE_DONE ||
				    ev[j].type == TFAB_EV_ERROR);
			assert_non_null(ev[j].ctx);
			(*(unsigned *)ev[j].ctx)++;
			ends++;
		}
		harness_pump();
	}
	print_message("disconnect: %u of %d writes ended, %llu landed\n", ends, N,
		      (unsigned long long)H.b.t.remote_writes);
	assert_int_equal(ends, N);
	for (int i = 0; i < N; i++)
		assert_int_equal(seen[i], 1);
	assert_int_equal(ops->mr_dereg(smr), 0);
	assert_int_equal(ops->close(ep), 0);
	/* The target is unaffected. */
	WAIT_FOR(ok, 0, 100);
	(void)ok;
	assert_int_equal(H.ops->mr_dereg(dmr), 0);
	free(src);
	free(dst);
}

static void test_bad_blobs(void **state)
{
	char addr[512];
	size_t len = sizeof(addr);
	struct tfab_conn *conn = NULL;

	(void)state;
	assert_int_equal(H.ops->get_addr(H.b.ep, addr, &len), 0);
	assert_int_equal(H.ops->connect(H.a.ep, addr, len - 1, &conn), -EINVAL);
	addr[0] ^= 1; /* magic */
	assert_int_equal(H.ops->connect(H.a.ep, addr, len, &conn), -EINVAL);
	addr[0] ^= 1;
	addr[4]++; /* version */
	assert_int_equal(H.ops->connect(H.a.ep, addr, len, &conn), -TFAB_ERR_VERSION);
	addr[4]--;
	addr[5] = addr[5] == IBV_LINK_LAYER_ETHERNET ? IBV_LINK_LAYER_INFINIBAND
						     : IBV_LINK_LAYER_ETHERNET;
	assert_int_equal(H.ops->connect(H.a.ep, addr, len, &conn), -EINVAL);
	assert_null(conn);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_writes_behind_a_failure),
	    cmocka_unit_test(test_many_injected),
	    cmocka_unit_test(test_split_write),
	    cmocka_unit_test(test_connect_to_gone),
	    cmocka_unit_test(test_disconnect_in_flight),
	    cmocka_unit_test(test_bad_blobs),
	};
	int rc = harness_open();

	if (rc)
		return rc;
	if (strcmp(H.a.caps->backend, "verbs") != 0) {
		printf("SKIP: these tests are for the verbs backend (TFAB_PROVIDER=verbs)\n");
		harness_close();
		return 77;
	}
	rc = cmocka_run_group_tests_name(H.name, tests, NULL, NULL);
	harness_close();
	return rc ? 1 : 0;
}
