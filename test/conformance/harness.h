/*
 * Conformance harness: two endpoints of the backend that TFAB_PROVIDER selects, opened in one
 * process and connected both ways, an event tracker per side, and bounded waits that drive
 * both sides' progress (manual-progress fabrics move data only while the target polls too).
 */
#ifndef TFAB_TEST_HARNESS_H
#define TFAB_TEST_HARNESS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "providers/provider.h"
#include "util/config.h"
#include "util/time.h"

#define HARNESS_MAX_IMM (1u << 16) /* immediates tracked one by one */

struct tracker {
	uint64_t writes_done;
	uint64_t remote_writes;
	uint64_t errors;
	uint64_t errors_no_ctx; /* ERROR events that name no write */
	uint64_t errors_injected;
	int last_status;
	void *last_error_ctx;
	char last_errmsg[256];
	uint32_t last_imm;
	uint64_t last_len;
	uint32_t imm_count[HARNESS_MAX_IMM]; /* remote writes seen per immediate (< MAX_IMM) */
	/* One write followed by its context, unaffected by other writes' late events. */
	void *watch_ctx;
	bool watch_done;
	int watch_status;
};

struct side {
	struct tfab_ep *ep;
	const struct tfab_caps *caps;
	struct tfab_conn *peer; /* the other side */
	struct tracker t;
};

struct harness {
	const struct tfab_provider_ops *ops;
	struct tfab_config cfg;
	char name[256]; /* "ofi:tcp (tcp;ofi_rxm on lo)" */
	struct side a, b;
};

extern struct harness H;

/*
 * Select and open both sides. Returns 0; or 77 after printing why when no provider is named
 * (TFAB_PROVIDER unset or auto) and none is usable (meson shows it as SKIP); or 1 on a failure,
 * a named provider that is missing or unusable included.
 */
int harness_open(void);
void harness_close(void);

/* Poll both sides once, feeding the trackers. Unknown events fail the test. */
void harness_pump(void);

/* Pump until cond holds or timeout_ms passes; ok is set to whether cond held. */
#define WAIT_FOR(ok, cond, timeout_ms)                                        \
	do {                                                                  \
		uint64_t deadline_ = tfab__now_ms() + (uint64_t)(timeout_ms); \
		while (!(cond) && tfab__now_ms() < deadline_)                 \
			harness_pump();                                       \
		(ok) = (cond);                                                \
	} while (0)

/*
 * Post a write from src (inside lmr) to dst_mr at offset on the side's peer, retrying -EAGAIN
 * while pumping for at most timeout_ms. Returns the last status.
 */
int harness_write(struct side *from, const void *src, size_t len, struct tfab_mr *lmr,
		  const struct tfab_mr *dst_mr, uint64_t offset, uint32_t imm, void *ctx,
		  int timeout_ms);

/* Register a buffer on a side, failing the test on error. */
struct tfab_mr *harness_reg(struct side *s, void *buf, size_t len);

/* Fill with a pattern derived from seed; check it. */
void fill_pattern(void *buf, size_t len, uint64_t seed);
bool check_pattern(const void *buf, size_t len, uint64_t seed, size_t *bad_off_p);

#endif
