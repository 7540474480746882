/* The backend registry, TFAB_PROVIDER selection, and the shared -EOPNOTSUPP stubs. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tfab/status.h>

#include "providers/provider.h"
#include "util/config.h"
#include "util/log.h"

#ifdef TFAB_HAVE_OFI
extern const struct tfab_provider_ops tfab_ofi_ops;
#endif
#ifdef TFAB_HAVE_VERBS
extern const struct tfab_provider_ops tfab_verbs_ops;
#endif
/* The native shm backend needs no package: it is built always. */
extern const struct tfab_provider_ops tfab_shm_ops;

/*
 * Auto-selection order: the same-host paths (shm: peers on this host take it), then the fast
 * network path first.
 */
static const struct tfab_provider_ops *const builtin[] = {
    &tfab_shm_ops,
#ifdef TFAB_HAVE_VERBS
    &tfab_verbs_ops,
#endif
#ifdef TFAB_HAVE_OFI
    &tfab_ofi_ops,
#endif
    NULL,
};

const char *const tfab__provider_known[] = {"verbs", "ofi", "shm", NULL};

int tfab__no_probe(const struct tfab_config *cfg, const char *fabric, tfab_probe_cb cb, void *arg)
{
	(void)cfg;
	(void)fabric;
	(void)cb;
	(void)arg;
	return -EOPNOTSUPP;
}

int tfab__no_open(const struct tfab_open_args *args, struct tfab_ep **ep_p)
{
	(void)args;
	(void)ep_p;
	return -EOPNOTSUPP;
}

void tfab__no_explain(const struct tfab_config *cfg, char *buf, size_t len)
{
	(void)cfg;
	if (len)
		buf[0] = '\0';
}

void tfab__caps_path_name(const struct tfab_caps *caps, char *buf, size_t len)
{
	if (strcmp(caps->backend, "ofi") == 0)
		snprintf(buf, len, "ofi:%.*s", (int)strcspn(caps->fabric, ";"), caps->fabric);
	else
		snprintf(buf, len, "%s", caps->backend);
}

const struct tfab_provider_ops *const *tfab__providers(void)
{
	return builtin;
}

const struct tfab_provider_ops *tfab__provider_find(const char *name)
{
	for (size_t i = 0; builtin[i]; i++)
		if (strcmp(builtin[i]->name, name) == 0)
			return builtin[i];
	return NULL;
}

/* Collects "backend:fabric" names of what probe reports, without repeats. */
struct choice_list {
	char text[512];
	size_t len;
	int count;
};

static void add_choice(void *arg, const struct tfab_fabric_desc *d)
{
	struct choice_list *cl = arg;
	char name[96];
	size_t n;

	if (strcmp(d->backend, "ofi") == 0) {
		/* "tcp;ofi_rxm" is chosen as ofi:tcp. */
		n = strcspn(d->fabric, ";");
		snprintf(name, sizeof(name), "ofi:%.*s", (int)n, d->fabric);
	} else {
		snprintf(name, sizeof(name), "%s", d->backend);
	}
	/* Match whole, comma-separated entries only. */
	for (const char *p = cl->text; (p = strstr(p, name)) != NULL; p += strlen(name)) {
		char end = p[strlen(name)];

		if ((p == cl->text || p[-1] == ' ') && (end == ',' || end == '\0'))
			return;
	}
	if (cl->len < sizeof(cl->text))
		cl->len += (size_t)snprintf(cl->text + cl->len, sizeof(cl->text) - cl->len, "%s%s",
					    cl->count ? ", " : "", name);
	cl->count++;
}

static void available_choices(const struct tfab_config *cfg, struct choice_list *cl)
{
	memset(cl, 0, sizeof(*cl));
	for (size_t i = 0; builtin[i]; i++)
		builtin[i]->probe(cfg, NULL, add_choice, cl);
	if (!cl->count)
		snprintf(cl->text, sizeof(cl->text), "none");
}

static void count_cb(void *arg, const struct tfab_fabric_desc *d)
{
	(void)d;
	(*(int *)arg)++;
}

static int usable(const struct tfab_provider_ops *ops, const struct tfab_config *cfg,
		  const char *fabric)
{
	int n = 0;

	return ops->probe(cfg, fabric, count_cb, &n) > 0 && n > 0;
}

/* A failure message naming the choices, with the backend's own words on why (ops, if any). */
static int fail_why(int rc, char *errbuf, size_t errlen, const struct tfab_config *cfg,
		    const char *what, const struct tfab_provider_ops *ops)
{
	struct choice_list cl;
	const char *fi = getenv("FI_PROVIDER");
	char why[256] = "";

	if (ops)
		ops->explain(cfg, why, sizeof(why));
	available_choices(cfg, &cl);
	snprintf(
	    errbuf, errlen,
	    "TFAB_PROVIDER=%s: %s%s%s%s. Choices: auto, verbs, ofi, ofi:<libfabric provider>, shm; "
	    "usable on this machine: %s%s%s",
	    cfg->provider, what, why[0] ? " (" : "", why, why[0] ? ")" : "", cl.text,
	    fi ? " (FI_PROVIDER=" : "", fi ? fi : "");
	if (fi)
		strncat(errbuf, ")", errlen - strlen(errbuf) - 1);
	return rc;
}

static int fail(int rc, char *errbuf, size_t errlen, const struct tfab_config *cfg,
		const char *what)
{
	return fail_why(rc, errbuf, errlen, cfg, what, NULL);
}

/* One entry of the list: a backend, "ofi:<provider>", or "auto" (every usable backend). */
static int select_entry(const struct tfab_config *cfg, const char *want, size_t wlen,
			struct tfab_path_choice *out, int max, int *n, char *errbuf, size_t errlen)
{
	const struct tfab_provider_ops *ops;
	const char *colon = memchr(want, ':', wlen);
	char backend[16];
	size_t blen = colon ? (size_t)(colon - want) : wlen;
	size_t flen = colon ? wlen - blen - 1 : 0;

	if ((wlen == 4 && memcmp(want, "auto", 4) == 0) || wlen == 0) {
		int found = 0;

		/* The same-host paths, then the first network backend usable here. */
		for (size_t i = 0; builtin[i]; i++) {
			if (!usable(builtin[i], cfg, NULL))
				continue;
			found++;
			if (*n < max)
				out[(*n)++] = (struct tfab_path_choice){.ops = builtin[i]};
			if (!builtin[i]->same_host)
				break;
		}
		return found ? 0
			     : fail(-TFAB_ERR_NO_FABRIC, errbuf, errlen, cfg, "no usable fabric");
	}
	if (blen >= sizeof(backend))
		return fail(-TFAB_ERR_CONFIG, errbuf, errlen, cfg, "not a known backend");
	memcpy(backend, want, blen);
	backend[blen] = '\0';

	int known = 0;
	for (size_t i = 0; tfab__provider_known[i]; i++)
		known |= strcmp(tfab__provider_known[i], backend) == 0;
	if (!known || (colon && (strcmp(backend, "ofi") != 0 || flen == 0)))
		return fail(-TFAB_ERR_CONFIG, errbuf, errlen, cfg, "not a known choice");

	ops = tfab__provider_find(backend);
	if (!ops)
		return fail(-TFAB_ERR_NO_FABRIC, errbuf, errlen, cfg,
			    "that backend is not built into this tfab");
	if (flen >= sizeof(out->fabric))
		return fail(-TFAB_ERR_CONFIG, errbuf, errlen, cfg, "provider name too long");

	struct tfab_path_choice c = {.ops = ops};

	memcpy(c.fabric, colon ? colon + 1 : "", flen);
	c.fabric[flen] = '\0';
	if (!usable(ops, cfg, colon ? c.fabric : NULL))
		return fail_why(-TFAB_ERR_NO_FABRIC, errbuf, errlen, cfg,
				colon ? "libfabric offers no usable endpoint with that provider"
				      : "that backend finds no usable device or provider here",
				ops);
	if (*n < max)
		out[(*n)++] = c;
	return 0;
}

int tfab__provider_select_list(const struct tfab_config *cfg, struct tfab_path_choice *out, int max,
			       int *n_p, char *errbuf, size_t errlen)
{
	const char *p = cfg->provider;
	int n = 0;

	for (;;) {
		size_t len = strcspn(p, ",");
		int before = n, rc;

		while (len && *p == ' ')
			p++, len--;
		while (len && p[len - 1] == ' ')
			len--;
		rc = select_entry(cfg, p, len, out, max, &n, errbuf, errlen);
		if (rc)
			return rc;
		/* A path named twice ("ofi:tcp,auto") is opened once, where it came first. */
		for (int i = before; i < n; i++) {
			for (int j = 0; j < before; j++) {
				if (out[j].ops == out[i].ops &&
				    strcmp(out[j].fabric, out[i].fabric) == 0) {
					memmove(&out[i], &out[i + 1],
						sizeof(*out) * (size_t)(n - i - 1));
					n--, i--;
					break;
				}
			}
		}
		p += strcspn(p, ",");
		if (*p != ',')
			break;
		p++;
	}
	*n_p = n;
	return 0;
}

int tfab__provider_select(const struct tfab_config *cfg, const struct tfab_provider_ops **ops_p,
			  char *fabric, size_t fabric_len, char *errbuf, size_t errlen)
{
	struct tfab_path_choice c[TFAB_MAX_PATHS];
	int n = 0;
	int rc = tfab__provider_select_list(cfg, c, TFAB_MAX_PATHS, &n, errbuf, errlen);

	if (rc)
		return rc;
	*ops_p = c[0].ops;
	snprintf(fabric, fabric_len, "%s", c[0].fabric);
	return 0;
}

int tfab__provider_open(const struct tfab_config *cfg, bool local_only,
			const struct tfab_provider_ops **ops_p, struct tfab_ep **ep_p, char *errbuf,
			size_t errlen)
{
	const struct tfab_provider_ops *ops = NULL;
	struct tfab_open_args args = {.cfg = cfg, .local_only = local_only};
	char fabric[64];
	int rc;

	rc = tfab__provider_select(cfg, &ops, fabric, sizeof(fabric), errbuf, errlen);
	if (rc)
		return rc;
	args.fabric = fabric[0] ? fabric : NULL;
	rc = ops->open(&args, ep_p);
	if (rc) {
		snprintf(errbuf, errlen, "opening %s%s%s failed: %s", ops->name,
			 fabric[0] ? ":" : "", fabric, tfab_strerror(rc));
		return rc;
	}
	*ops_p = ops;
	return 0;
}
