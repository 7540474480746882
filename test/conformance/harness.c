/* Conformance harness: two connected endpoints in one process and their event trackers. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <tfab/tfab.h>

#include "harness.h"
#include "test/common/named_provider.h"

struct harness H;

static int open_side(struct side *s, char *err, size_t errlen)
{
	const struct tfab_provider_ops *ops;
	int rc;

	rc = tfab__provider_open(&H.cfg, true, &ops, &s->ep, err, errlen);
	if (rc)
		return rc;
	H.ops = ops;
	s->caps = ops->caps(s->ep);
	return 0;
}

static int connect_to(struct side *from, struct side *to)
{
	char addr[512];
	size_t len = sizeof(addr);
	int rc;

	rc = H.ops->get_addr(to->ep, addr, &len);
	if (rc)
		return rc;
	return H.ops->connect(from->ep, addr, len, &from->peer);
}

int harness_open(void)
{
	char err[1024];
	int rc;

	rc = tfab__config_init(&H.cfg, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "configuration: %s\n", err);
		return 1;
	}
	tfab_log_set_level((enum tfab_log_level)H.cfg.log_level);
	rc = open_side(&H.a, err, sizeof(err));
	if (rc == -TFAB_ERR_NO_FABRIC && !named_provider()) {
		printf("SKIP: no usable fabric on this machine (TFAB_PROVIDER=auto): %s\n", err);
		return 77;
	}
	if (rc == 0)
		rc = open_side(&H.b, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "FAIL: open: %s%s\n", err,
			rc == -TFAB_ERR_NO_FABRIC ? " (the test names this provider: not a skip)"
						  : "");
		return 1;
	}
	rc = connect_to(&H.a, &H.b);
	if (rc == 0)
		rc = connect_to(&H.b, &H.a);
	if (rc) {
		fprintf(stderr, "connect: %s\n", tfab_strerror(rc));
		return 1;
	}
	snprintf(H.name, sizeof(H.name), "%s (%s on %s, mr=%s)", H.cfg.provider, H.a.caps->fabric,
		 H.a.caps->domain, H.a.caps->mr_addr == TFAB_MR_ADDR_VIRT ? "virt" : "offset");
	printf("conformance: provider %s\n", H.name);
	return 0;
}

void harness_close(void)
{
	struct side *sides[] = {&H.a, &H.b};

	for (int i = 0; i < 2; i++) {
		H.ops->disconnect(sides[i]->peer);
		sides[i]->peer = NULL;
		if (H.ops->close(sides[i]->ep))
			fprintf(stderr, "close: endpoint still busy\n");
		sides[i]->ep = NULL;
	}
}

static void track(struct tracker *t, const struct tfab_event *ev)
{
	switch (ev->type) {
	case TFAB_EV_WRITE_DONE:
		t->writes_done++;
		if (t->watch_ctx && ev->ctx == t->watch_ctx)
			t->watch_done = true;
		break;
	case TFAB_EV_REMOTE_WRITE:
		t->remote_writes++;
		t->last_imm = ev->imm;
		t->last_len = ev->len;
		if (ev->imm < HARNESS_MAX_IMM)
			t->imm_count[ev->imm]++;
		break;
	case TFAB_EV_ERROR:
		t->errors++;
		t->errors_no_ctx += ev->ctx == NULL;
		t->errors_injected += ev->injected;
		t->last_status = ev->status;
		t->last_error_ctx = ev->ctx;
		if (t->watch_ctx && ev->ctx == t->watch_ctx) {
			t->watch_done = true;
			t->watch_status = ev->status;
		}
		snprintf(t->last_errmsg, sizeof(t->last_errmsg), "%s",
			 ev->errmsg ? ev->errmsg : "");
		break;
	default:
		fail_msg("unknown event type %d", (int)ev->type);
	}
}

static void pump_side(struct side *s)
{
	struct tfab_event ev[32];
	int n;

	if (!s->ep)
		return;
	n = H.ops->poll(s->ep, ev, 32);
	assert_true(n >= 0);
	for (int i = 0; i < n; i++)
		track(&s->t, &ev[i]);
}

void harness_pump(void)
{
	pump_side(&H.a);
	pump_side(&H.b);
}

int harness_write(struct side *from, const void *src, size_t len, struct tfab_mr *lmr,
		  const struct tfab_mr *dst_mr, uint64_t offset, uint32_t imm, void *ctx,
		  int timeout_ms)
{
	uint64_t deadline = tfab__now_ms() + (uint64_t)timeout_ms;
	int rc;

	for (;;) {
		rc = H.ops->write_imm(from->ep, from->peer, src, len, lmr, dst_mr->raddr + offset,
				      dst_mr->rkey, imm, 0, ctx);
		if (rc != -EAGAIN || tfab__now_ms() >= deadline)
			return rc;
		harness_pump();
	}
}

struct tfab_mr *harness_reg(struct side *s, void *buf, size_t len)
{
	struct tfab_mr *mr = NULL;
	int rc = H.ops->mr_reg(s->ep, buf, len, TFAB_MR_LOCAL_WRITE | TFAB_MR_REMOTE_WRITE, &mr);

	assert_int_equal(rc, 0);
	assert_non_null(mr);
	return mr;
}

/* xorshift64*: cheap, and a shifted or truncated copy does not pass for the original. */
static uint64_t next_word(uint64_t *x)
{
	*x ^= *x >> 12;
	*x ^= *x << 25;
	*x ^= *x >> 27;
	return *x * 2685821657736338717ull;
}

void fill_pattern(void *buf, size_t len, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
	uint8_t *p = buf;

	for (size_t i = 0; i < len; i += 8) {
		uint64_t w = next_word(&x);

		memcpy(p + i, &w, len - i < 8 ? len - i : 8);
	}
}

bool check_pattern(const void *buf, size_t len, uint64_t seed, size_t *bad_off_p)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
	const uint8_t *p = buf;

	for (size_t i = 0; i < len; i += 8) {
		uint64_t w = next_word(&x);
		size_t n = len - i < 8 ? len - i : 8;

		if (memcmp(p + i, &w, n) != 0) {
			if (bad_off_p)
				*bad_off_p = i;
			return false;
		}
	}
	return true;
}
