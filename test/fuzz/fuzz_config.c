/*
 * The settings parser (lib/util/config.c): NAME, a NUL byte, then a value, any bytes (an
 * environment variable can hold any but NUL). Properties: no read outside the input; a value
 * refused leaves the setting as it was and says why; one taken formats back to a value that
 * is taken again and formats the same (a secret formats as "(set)", never as itself).
 */
#include <string.h>

#include "fuzz.h"
#include "util/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct tfab_config cfg, before;
	static int ready;
	char *text, *value, err[512], f1[256], f2[256];
	const struct tfab_config_entry *e;
	uint64_t v;

	fuzz_quiet();

	if (!ready) {
		(void)tfab__config_init(&cfg, err,
					sizeof(err)); /* the environment's, or defaults */
		ready = 1;
	}
	if (size > 4096)
		return 0;
	text = malloc(size + 1);
	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';
	(void)tfab__parse_size(text, &v);
	value = memchr(text, '\0', size) ? text + strlen(text) + 1 : NULL;
	e = value ? tfab__config_find(text) : NULL;
	if (e) {
		before = cfg;
		err[0] = '\0';
		if (tfab__config_set(&cfg, text, value, err, sizeof(err)) != 0) {
			FUZZ_CHECK(memcmp(&cfg, &before, sizeof(cfg)) == 0);
			FUZZ_CHECK(err[0] != '\0');
		} else if (strcmp(e->parser->kind, "secret") == 0) {
			/* a secret is never shown: it formats as whether it is set */
			tfab__config_format(&cfg, e, f1, sizeof(f1));
			FUZZ_CHECK(strcmp(f1, value[0] ? "(set)" : "") == 0);
		} else {
			tfab__config_format(&cfg, e, f1, sizeof(f1));
			FUZZ_CHECK(tfab__config_set(&cfg, text, f1, err, sizeof(err)) == 0);
			tfab__config_format(&cfg, e, f2, sizeof(f2));
			FUZZ_CHECK(strcmp(f1, f2) == 0);
		}
	}
	free(text);
	return 0;
}
