/*
 * A provider wrapper for tests: a struct tfab_provider_ops that forwards every operation to a
 * context's real provider, except that the writes chosen by the test's rules fail at the call,
 * with -EAGAIN (back-pressure: the engine must retry) or an error, as a real fabric's would.
 * A write the wrapper refuses never reaches the fabric and produces no event.
 *
 * Writes are told apart by their immediate (doc/protocol.md): content (a request index, or a
 * partial-content chunk), control messages, and credit returns. A rule counts the calls of the
 * kinds it matches, from 1, and hits those in its window: from call `first` on, `count` calls
 * (0: no end), every `every`-th of them (0 or 1: each one). So the Nth call is {first N,
 * count 1}, every Kth call is {first K, every K}, and a stretch is {first A, count B}. A call
 * is refused by the first rule that hits it; every rule counts it.
 *
 * One context per process at a time. The rules and counts are kept under the context's lock,
 * which the engine holds around its provider calls.
 */
#ifndef TFAB_TEST_FAULT_OPS_H
#define TFAB_TEST_FAULT_OPS_H

#include <stdint.h>

struct tfab_context;

enum {
	FAULT_CONTENT = 1u << 0, /* tensor content (request index, or a partial chunk) */
	FAULT_CTRL = 1u << 1,	 /* control messages */
	FAULT_CREDIT = 1u << 2,	 /* credit returns */
};

#define FAULT_MAX_RULES 8

struct fault_rule {
	unsigned match; /* FAULT_* kinds the rule counts */
	int status;	/* what a hit returns: -EAGAIN, or an error */
	uint64_t first, count, every;
};

/* Route ctx's provider operations through the wrapper, with no rules (a pass-through). */
void fault_ops_install(struct tfab_context *ctx);
/* Back to the real provider; the rules are dropped. */
void fault_ops_remove(struct tfab_context *ctx);
/* Replace the rules (at most FAULT_MAX_RULES); the counts start again from 0. */
void fault_ops_set(struct tfab_context *ctx, const struct fault_rule *rules, int n);
/* How many calls rule i has refused, and how many it has counted. */
uint64_t fault_ops_hits(struct tfab_context *ctx, int i);
uint64_t fault_ops_calls(struct tfab_context *ctx, int i);

#endif
