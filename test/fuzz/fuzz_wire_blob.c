/*
 * The connection blob (lib/engine/wire.c) and, inside it, every backend's address that tfab
 * parses itself: shm's (tfab_shm_addr_decode) and verbs' (tfab_verbs_addr_decode). libfabric's
 * addresses go to fi_av_insert, libfabric's own parser. Properties: no read outside the
 * input; a blob that decodes encodes back to the bytes it was decoded from (what follows it is
 * ignored).
 */
#include <string.h>

#include "engine/wire.h"
#include "fuzz.h"
#include "providers/shm/shm.h"
#ifdef TFAB_HAVE_VERBS
#include "providers/verbs/verbs.h"
#endif

static void path_addr(const struct tfab_wire_path *p)
{
	if (p->name_len == 3 && memcmp(p->name, "shm", 3) == 0) {
		struct tfab_shm_addr a;

		(void)tfab_shm_addr_decode(p->addr, p->addr_len, &a);
	}
#ifdef TFAB_HAVE_VERBS
	if (p->name_len == 5 && memcmp(p->name, "verbs", 5) == 0) {
		struct tfab_verbs_addr a;

		(void)tfab_verbs_addr_decode(p->addr, p->addr_len, &a);
	}
#endif
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t out[TFAB_WIRE_MAX_BLOB];
	struct tfab_wire_blob b;
	size_t len;

	fuzz_quiet();

	/* Each path's address alone too, so that the parsers see inputs the blob never holds. */
	if (size > 0) {
		struct tfab_wire_path p = {.addr = data + 1, .addr_len = (uint16_t)(size - 1)};

		p.name = data[0] & 1 ? "verbs" : "shm";
		p.name_len = data[0] & 1 ? 5 : 3;
		if (size - 1 <= TFAB_WIRE_MAX_ADDR)
			path_addr(&p);
	}
	if (tfab__wire_blob_decode(data, size, &b) != 0)
		return 0;
	FUZZ_CHECK(b.npaths >= 1 && b.npaths <= TFAB_WIRE_MAX_PATHS);
	FUZZ_CHECK(tfab__wire_blob_encode(&b, out, sizeof(out), &len) == 0);
	FUZZ_CHECK(len <= size && memcmp(out, data, len) == 0);
	for (unsigned i = 0; i < b.npaths; i++) {
		const struct tfab_wire_path *p = &b.paths[i];

		FUZZ_CHECK(p->addr >= data && p->addr + p->addr_len <= data + size);
		path_addr(p);
	}
	return 0;
}
