/*
 * The fault-injecting provider wrapper of fault_ops.h: the real provider's table with
 * write_imm replaced, put in place of the endpoint's own (its base object's ops).
 */
#include <errno.h>
#include <string.h>

#include "engine/engine.h"
#include "test/common/fault_ops.h"

/* Per path of the context: its endpoint, its real table and the wrapper put in its place. */
static struct {
	struct tfab_ep *ep;
	const struct tfab_provider_ops *real;
	struct tfab_provider_ops wrapped;
} paths[TFAB_MAX_PATHS];
static unsigned npaths;
static struct fault_rule rules[FAULT_MAX_RULES];
static uint64_t calls[FAULT_MAX_RULES], hits[FAULT_MAX_RULES];
static int nrules;

static unsigned kind_of(uint32_t imm)
{
	if (!tfab__imm_is_ctrl(imm))
		return FAULT_CONTENT;
	if (!tfab__imm_is_credit(imm))
		return FAULT_CTRL;
	return tfab__imm_low(imm) ? FAULT_CREDIT : FAULT_CONTENT; /* 0: a partial chunk */
}

static bool in_window(const struct fault_rule *r, uint64_t n)
{
	uint64_t every = r->every ? r->every : 1;

	if (n < r->first || (r->count && n - r->first >= r->count))
		return false;
	return (n - r->first) % every == 0;
}

static int fault_write_imm(struct tfab_ep *ep, struct tfab_conn *peer, const void *lbuf, size_t len,
			   struct tfab_mr *lmr, uint64_t raddr, uint64_t rkey, uint32_t imm,
			   unsigned flags, void *ctx)
{
	unsigned kind = kind_of(imm);
	int status = 0;

	for (int i = 0; i < nrules; i++) {
		if (!(rules[i].match & kind))
			continue;
		if (in_window(&rules[i], ++calls[i]) && status == 0) {
			status = rules[i].status;
			hits[i]++;
		}
	}
	if (status)
		return status;
	for (unsigned i = 0; i < npaths; i++)
		if (paths[i].ep == ep)
			return paths[i].real->write_imm(ep, peer, lbuf, len, lmr, raddr, rkey, imm,
							flags, ctx);
	return -EINVAL;
}

void fault_ops_install(struct tfab_context *ctx)
{
	tfab__ctx_lock(ctx);
	if (!npaths) {
		for (unsigned i = 0; i < ctx->npaths; i++) {
			paths[i].ep = ctx->paths[i].ep;
			paths[i].real = paths[i].ep->ops;
			paths[i].wrapped = *paths[i].real;
			paths[i].wrapped.write_imm = fault_write_imm;
			paths[i].ep->ops = &paths[i].wrapped;
		}
		npaths = ctx->npaths;
	}
	nrules = 0;
	tfab__ctx_unlock(ctx);
}

void fault_ops_remove(struct tfab_context *ctx)
{
	tfab__ctx_lock(ctx);
	for (unsigned i = 0; i < npaths; i++)
		paths[i].ep->ops = paths[i].real;
	npaths = 0;
	nrules = 0;
	tfab__ctx_unlock(ctx);
}

void fault_ops_set(struct tfab_context *ctx, const struct fault_rule *r, int n)
{
	tfab__ctx_lock(ctx);
	nrules = n < FAULT_MAX_RULES ? n : FAULT_MAX_RULES;
	memcpy(rules, r, sizeof(*r) * (size_t)nrules);
	memset(calls, 0, sizeof(calls));
	memset(hits, 0, sizeof(hits));
	tfab__ctx_unlock(ctx);
}

/* Rule i's count in one of the tables, read under the lock that guards them. */
static uint64_t count_of(struct tfab_context *ctx, const uint64_t *table, int i)
{
	uint64_t n;

	tfab__ctx_lock(ctx);
	n = i >= 0 && i < nrules ? table[i] : 0;
	tfab__ctx_unlock(ctx);
	return n;
}

uint64_t fault_ops_hits(struct tfab_context *ctx, int i)
{
	return count_of(ctx, hits, i);
}

uint64_t fault_ops_calls(struct tfab_context *ctx, int i)
{
	return count_of(ctx, calls, i);
}
