/*
 * Paths: the endpoints a context opens, one per entry of TFAB_PROVIDER, and the rule by which
 * a pair of peers takes one of them (doc/protocol.md, "Connecting two peers").
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <tfab/status.h>

#include "engine/engine.h"
#include "util/log.h"

#define SUBSYS "engine"

int tfab__paths_open(struct tfab_context *ctx, char *err, size_t errlen)
{
	struct tfab_path_choice c[TFAB_MAX_PATHS];
	struct tfab_ep *eps[TFAB_MAX_PATHS];
	int n = 0, rc;

	rc = tfab__provider_select_list(&ctx->cfg, c, TFAB_MAX_PATHS, &n, err, errlen);
	if (rc)
		return rc;
	for (int i = 0; i < n; i++) {
		struct tfab_path *p = &ctx->paths[ctx->npaths];
		struct tfab_open_args args = {.cfg = &ctx->cfg,
					      .fabric = c[i].fabric[0] ? c[i].fabric : NULL};

		rc = c[i].ops->open(&args, &p->ep);
		if (rc) {
			snprintf(err, errlen, "opening %s%s%s failed: %s", c[i].ops->name,
				 c[i].fabric[0] ? ":" : "", c[i].fabric, tfab_strerror(rc));
			return rc;
		}
		p->caps = tfab_ep_caps(p->ep);
		p->index = ctx->npaths++;
		tfab__caps_path_name(p->caps, p->name, sizeof(p->name));
		rc = tfab__mr_cache_create(p->ep->ops, p->ep, ctx->cfg.mr_cache_entries,
					   &p->mr_cache);
		if (rc) {
			snprintf(err, errlen, "registration cache: %s", tfab_strerror(rc));
			return rc;
		}
		eps[p->index] = p->ep;
	}
	rc = tfab__pool_create(eps, ctx->npaths, ctx->cfg.pool_cache, &ctx->pool);
	if (rc)
		snprintf(err, errlen, "pool: %s", tfab_strerror(rc));
	return rc;
}

int tfab__paths_close(struct tfab_context *ctx)
{
	int rc = 0;

	/* What peers still write lands before the memory they write into is freed. */
	for (unsigned i = 0; i < ctx->npaths; i++)
		tfab_ep_quiesce(ctx->paths[i].ep);
	if (ctx->pool) {
		tfab__pool_trim(ctx->pool);
		rc = tfab__pool_destroy(ctx->pool);
		if (rc)
			return rc;
		ctx->pool = NULL;
	}
	for (unsigned i = 0; i < ctx->npaths; i++) {
		if (ctx->paths[i].mr_cache && tfab__mr_cache_destroy(ctx->paths[i].mr_cache))
			return -EBUSY;
		ctx->paths[i].mr_cache = NULL;
	}
	while (ctx->npaths) {
		struct tfab_path *p = &ctx->paths[ctx->npaths - 1];

		rc = tfab_ep_close(p->ep);
		if (rc)
			return rc;
		ctx->npaths--;
	}
	return 0;
}

struct tfab_path *tfab__path_of_ep(struct tfab_context *ctx, const struct tfab_ep *ep)
{
	for (unsigned i = 0; i < ctx->npaths; i++)
		if (ctx->paths[i].ep == ep)
			return &ctx->paths[i];
	return NULL;
}

/*
 * The boot (a machine: its boot id) and the namespaces that shared memory between two
 * processes needs in common: mount (the same /dev/shm), IPC and PID (the peer's process).
 */
static char host_id[TFAB_WIRE_MAX_HOST];
static pthread_once_t host_id_once = PTHREAD_ONCE_INIT;

static void host_id_init(void)
{
	static const char *const ns[] = {"mnt", "ipc", "pid"};
	char boot[64] = "";
	size_t len;
	FILE *f;

	f = fopen("/proc/sys/kernel/random/boot_id", "r");
	if (f) {
		if (!fgets(boot, sizeof(boot), f))
			boot[0] = '\0';
		fclose(f);
	}
	boot[strcspn(boot, "\n")] = '\0';
	len = (size_t)snprintf(host_id, sizeof(host_id), "%s", boot[0] ? boot : "unknown-boot");
	for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]) && len < sizeof(host_id); i++) {
		char path[32];
		struct stat st;

		snprintf(path, sizeof(path), "/proc/self/ns/%s", ns[i]);
		len +=
		    (size_t)snprintf(host_id + len, sizeof(host_id) - len, "/%s:%llu", ns[i],
				     stat(path, &st) == 0 ? (unsigned long long)st.st_ino : 0ull);
	}
}

/* Worked out once per process: contexts in several threads may ask at once. */
const char *tfab__host_id(void)
{
	pthread_once(&host_id_once, host_id_init);
	return host_id;
}

/* The paths of a blob as "a, b, c" (for messages). */
static void list_theirs(const struct tfab_wire_blob *b, char *buf, size_t len)
{
	size_t at = 0;

	buf[0] = '\0';
	for (unsigned i = 0; i < b->npaths && at < len; i++)
		at += (size_t)snprintf(buf + at, len - at, "%s%.*s", i ? ", " : "",
				       (int)b->paths[i].name_len, b->paths[i].name);
}

int tfab__path_choose(struct tfab_context *ctx, const struct tfab_wire_blob *theirs,
		      const struct tfab_wire_path **their_path_p, char *why, size_t whylen)
{
	const char *host = tfab__host_id();
	/* No identity (an empty one) is no proof of the same host. */
	bool same_host = theirs->host_len > 0 && theirs->host_len == strlen(host) &&
			 memcmp(theirs->host, host, theirs->host_len) == 0;
	int best = -1;
	unsigned best_sum = 0;
	char mine[160] = "", their[160];
	size_t at = 0;

	for (unsigned i = 0; i < ctx->npaths; i++) {
		const struct tfab_path *p = &ctx->paths[i];

		if (at < sizeof(mine))
			at += (size_t)snprintf(mine + at, sizeof(mine) - at, "%s%s", i ? ", " : "",
					       p->name);
		for (unsigned j = 0; j < theirs->npaths; j++) {
			const struct tfab_wire_path *w = &theirs->paths[j];

			if (w->name_len != strlen(p->name) || memcmp(w->name, p->name, w->name_len))
				continue;
			if ((p->caps->same_host || w->same_host) && !same_host)
				continue;
			/* The smallest sum of positions; on a tie, the name that sorts first. */
			if (best < 0 || i + j < best_sum ||
			    (i + j == best_sum && strcmp(p->name, ctx->paths[best].name) < 0)) {
				best = (int)i;
				best_sum = i + j;
				*their_path_p = w;
			}
		}
	}
	if (best >= 0)
		return best;
	list_theirs(theirs, their, sizeof(their));
	snprintf(why, whylen, "no path in common: ours %s; the peer's %s (%s host)", mine, their,
		 same_host ? "same" : "another");
	return -TFAB_ERR_NO_FABRIC;
}
