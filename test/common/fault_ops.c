/*
 * The fault-injecting provider wrapper of fault_ops.h: the real provider's table with
 * write_imm replaced, put in place of the endpoint's own (its base object's ops).
 */
#include <string.h>

#include "engine/engine.h"
#include "test/common/fault_ops.h"

static struct tfab_provider_ops wrapped;
static const struct tfab_provider_ops *real;
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
	return real->write_imm(ep, peer, lbuf, len, lmr, raddr, rkey, imm, flags, ctx);
}

void fault_ops_install(struct tfab_context *ctx)
{
	tfab__ctx_lock(ctx);
	if (ctx->ep->ops != &wrapped) {
		real = ctx->ep->ops;
		wrapped = *real;
		wrapped.write_imm = fault_write_imm;
		ctx->ep->ops = &wrapped;
	}
	nrules = 0;
	tfab__ctx_unlock(ctx);
}

void fault_ops_remove(struct tfab_context *ctx)
{
	tfab__ctx_lock(ctx);
	if (ctx->ep->ops == &wrapped)
		ctx->ep->ops = real;
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

uint64_t fault_ops_hits(struct tfab_context *ctx, int i)
{
	uint64_t n;

	tfab__ctx_lock(ctx);
	n = i >= 0 && i < nrules ? hits[i] : 0;
	tfab__ctx_unlock(ctx);
	return n;
}

uint64_t fault_ops_calls(struct tfab_context *ctx, int i)
{
	uint64_t n;

	tfab__ctx_lock(ctx);
	n = i >= 0 && i < nrules ? calls[i] : 0;
	tfab__ctx_unlock(ctx);
	return n;
}
