/*
 * tfab-info: the version, the backends built in, the fabrics usable on this machine with their
 * capabilities, the backend TFAB_PROVIDER selects first (and the fabric and domain a context
 * opens there), every path a context opens in TFAB_PROVIDER's order, and every setting with its default, current value and help. --json prints the same
 * as one object.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tfab/tfab.h>

#include "engine/engine.h"
#include "json.h"
#include "providers/provider.h"
#include "util/config.h"

struct fabric_list {
	struct tfab_fabric_desc d[64];
	int n;
};

static void collect(void *arg, const struct tfab_fabric_desc *d)
{
	struct fabric_list *fl = arg;

	if (fl->n < (int)(sizeof(fl->d) / sizeof(fl->d[0])))
		fl->d[fl->n++] = *d;
}

/* A path a context opens: its name, and the fabric and domain its backend picked. */
struct path_info {
	char name[32], fabric[64], domain[64];
};

/*
 * The paths a context would open, in TFAB_PROVIDER's order: selection names no fabric for
 * auto, or for a backend alone, and the backend picks one when it opens. Open each as
 * tfab_context_create does, and ask.
 */
static int opened(const struct tfab_config *cfg, struct path_info *out, int *n_p, char *errbuf,
		  size_t errlen)
{
	struct tfab_path_choice c[TFAB_MAX_PATHS];
	int n = 0, rc;

	rc = tfab__provider_select_list(cfg, c, TFAB_MAX_PATHS, &n, errbuf, errlen);
	for (int i = 0; i < n && rc == 0; i++) {
		struct tfab_open_args args = {.cfg = cfg,
					      .fabric = c[i].fabric[0] ? c[i].fabric : NULL};
		struct tfab_ep *ep;

		rc = c[i].ops->open(&args, &ep);
		if (rc) {
			snprintf(errbuf, errlen, "opening %s%s%s failed: %s", c[i].ops->name,
				 c[i].fabric[0] ? ":" : "", c[i].fabric, tfab_strerror(rc));
			break;
		}
		tfab__caps_path_name(tfab_ep_caps(ep), out[i].name, sizeof(out[i].name));
		snprintf(out[i].fabric, sizeof(out[i].fabric), "%s", tfab_ep_caps(ep)->fabric);
		snprintf(out[i].domain, sizeof(out[i].domain), "%s", tfab_ep_caps(ep)->domain);
		tfab_ep_close(ep);
		*n_p = i + 1;
	}
	return rc;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: tfab-info [--json]\n"
		   "Prints the version, backends, usable fabrics and settings of tfab.\n");
}

int main(int argc, char **argv)
{
	const struct tfab_provider_ops *const *provs = tfab__providers();
	const struct tfab_provider_ops *sel = NULL;
	struct fabric_list fl = {.n = 0};
	char cfgerr[256] = "", selerr[768] = "", fabric[64] = "";
	struct path_info paths[TFAB_MAX_PATHS];
	int npaths = 0;
	struct tfab_config cfg;
	size_t nset;
	const struct tfab_config_entry *table = tfab__config_table(&nset);
	int json = 0, cfg_rc, sel_rc;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0) {
			json = 1;
		} else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
			usage(stdout);
			return 0;
		} else {
			usage(stderr);
			return 2;
		}
	}

	cfg_rc = tfab__config_init(&cfg, cfgerr, sizeof(cfgerr));
	if (cfg_rc == 0) {
		/* the key as a context reads it: a short one (or a file that cannot be read) fails */
		uint8_t key[256];
		size_t klen;

		cfg_rc = tfab__auth_key_read(&cfg, key, sizeof(key), &klen, cfgerr, sizeof(cfgerr));
		explicit_bzero(key, sizeof(key));
	}
	tfab_log_set_level((enum tfab_log_level)cfg.log_level);
	for (size_t i = 0; provs[i]; i++)
		provs[i]->probe(&cfg, NULL, collect, &fl);
	sel_rc = tfab__provider_select(&cfg, &sel, fabric, sizeof(fabric), selerr, sizeof(selerr));
	if (sel_rc == 0)
		sel_rc = opened(&cfg, paths, &npaths, selerr, sizeof(selerr));

	if (json) {
		printf("{\"version\":");
		json_str(stdout, tfab_version());
		printf(",\"backends\":[");
		for (size_t i = 0; tfab__provider_known[i]; i++) {
			const char *name = tfab__provider_known[i];

			const struct tfab_provider_ops *ops = tfab__provider_find(name);
			char why[256] = "";

			if (ops)
				ops->explain(&cfg, why, sizeof(why));
			printf("%s{\"name\":", i ? "," : "");
			json_str(stdout, name);
			printf(",\"built\":%s,\"note\":", ops ? "true" : "false");
			json_str(stdout, why[0] ? why : NULL);
			printf("}");
		}
		printf("],\"fabrics\":[");
		for (int i = 0; i < fl.n; i++) {
			printf("%s{\"backend\":", i ? "," : "");
			json_str(stdout, fl.d[i].backend);
			printf(",\"fabric\":");
			json_str(stdout, fl.d[i].fabric);
			printf(",\"domain\":");
			json_str(stdout, fl.d[i].domain);
			printf(",\"caps\":");
			json_str(stdout, fl.d[i].detail);
			printf("}");
		}
		printf("],\"selected\":");
		if (sel_rc == 0) {
			printf("{\"backend\":");
			json_str(stdout, sel->name);
			printf(",\"fabric\":");
			json_str(stdout, paths[0].fabric);
			printf(",\"domain\":");
			json_str(stdout, paths[0].domain);
			printf("},\"paths\":[");
			for (int i = 0; i < npaths; i++) {
				printf("%s{\"name\":", i ? "," : "");
				json_str(stdout, paths[i].name);
				printf(",\"fabric\":");
				json_str(stdout, paths[i].fabric);
				printf(",\"domain\":");
				json_str(stdout, paths[i].domain);
				printf("}");
			}
			printf("]");
		} else {
			printf("null,\"error\":");
			json_str(stdout, selerr);
		}
		printf(",\"settings\":[");
		for (size_t i = 0; i < nset; i++) {
			const char *given = getenv(table[i].name);
			char cur[128], why[160];
			bool bad =
			    given && tfab__config_invalid(&table[i], given, why, sizeof(why));

			tfab__config_format(&cfg, &table[i], cur, sizeof(cur));
			printf("%s{\"name\":", i ? "," : "");
			json_str(stdout, table[i].name);
			printf(",\"default\":");
			json_str(stdout, table[i].dflt);
			printf(",\"value\":");
			json_str(stdout, cur);
			printf(",\"set\":%s,\"given\":", given ? "true" : "false");
			json_str(stdout, tfab__config_secret(&table[i]) ? NULL : given);
			printf(",\"invalid\":");
			json_str(stdout, bad ? why : NULL);
			printf(",\"help\":");
			json_str(stdout, table[i].help);
			printf("}");
		}
		printf("]}\n");
	} else {
		printf("tfab %s\n\nBackends:\n", tfab_version());
		for (size_t i = 0; tfab__provider_known[i]; i++) {
			const char *name = tfab__provider_known[i];
			const struct tfab_provider_ops *ops = tfab__provider_find(name);
			char why[256] = "";
			int devices = 0;

			for (int j = 0; j < fl.n; j++)
				devices += strcmp(fl.d[j].backend, name) == 0;
			if (ops && !devices)
				ops->explain(&cfg, why, sizeof(why));
			printf("  %-6s %s%s%s%s\n", name,
			       !ops	 ? "not built in"
			       : devices ? "built in"
					 : "built in, no usable device",
			       why[0] ? " (" : "", why, why[0] ? ")" : "");
		}
		printf("\nUsable fabrics:\n");
		if (!fl.n)
			printf("  none\n");
		for (int i = 0; i < fl.n; i++)
			printf("  %-6s %-14s %-10s %s\n", fl.d[i].backend, fl.d[i].fabric,
			       fl.d[i].domain, fl.d[i].detail);
		printf("\nSelected: ");
		if (sel_rc == 0)
			printf("%s%s%s\n  opens %s on %s\n", sel->name, fabric[0] ? ":" : "",
			       fabric, paths[0].fabric, paths[0].domain);
		else
			printf("none\n");
		printf("\nPaths (a context opens each; a peer takes the first that both sides have"
		       " and that reaches it):\n");
		if (sel_rc || !npaths)
			printf("  none\n");
		for (int i = 0; sel_rc == 0 && i < npaths; i++)
			printf("  %d. %-10s %s on %s\n", i + 1, paths[i].name, paths[i].fabric,
			       paths[i].domain);
		printf("\nSettings:\n");
		for (size_t i = 0; i < nset; i++) {
			const char *given = getenv(table[i].name);
			char cur[128], why[160];

			tfab__config_format(&cfg, &table[i], cur, sizeof(cur));
			/* an invalid value is shown as given, not as the default in its place */
			if (given && tfab__config_invalid(&table[i], given, why, sizeof(why)))
				printf("  %s='%s' (invalid: %s; using the default %s)\n      %s\n",
				       table[i].name,
				       tfab__config_secret(&table[i]) ? "(set)" : given, why,
				       cur[0] ? cur : "''", table[i].help);
			else
				printf("  %s=%s%s (default \"%s\")\n      %s\n", table[i].name, cur,
				       given ? " [set]" : "", table[i].dflt, table[i].help);
		}
	}
	if (cfg_rc)
		fprintf(stderr, "tfab-info: %s\n", cfgerr);
	if (sel_rc)
		fprintf(stderr, "tfab-info: %s\n", selerr);
	return (cfg_rc || sel_rc) ? 1 : 0;
}
