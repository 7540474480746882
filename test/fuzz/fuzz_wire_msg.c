/*
 * The control message decoder (lib/engine/wire.c): a slot of any bytes, read as the engine
 * reads one (tfab__wire_slot_next). Properties: no read outside the slot; a message that
 * decodes encodes back to exactly its bytes (every message has one encoding); its accessors
 * stay inside it.
 */
#include <string.h>

#include "engine/wire.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tfab_wire_slot_reader rd;
	struct tfab_wire_msg m;
	static uint8_t out[TFAB_WIRE_MIN_SLOT * 8];
	size_t off = 0, len;
	int rc;

	fuzz_quiet();

	if (size > sizeof(out))
		return 0; /* no slot is larger */
	(void)tfab__wire_msg_decode(data, size, &m);
	tfab__wire_slot_start(&rd, data, size);
	while ((rc = tfab__wire_slot_next(&rd, &m)) == 1) {
		uint32_t sum = 0;

		FUZZ_CHECK(rd.off > off && rd.off <= size);
		FUZZ_CHECK(tfab__wire_msg_encode(&m, out, sizeof(out), &len) == 0);
		FUZZ_CHECK(len == rd.off - off && memcmp(out, data + off, len) == 0);
		for (unsigned i = 0; i < m.ntaken; i++)
			sum += tfab__wire_taken_at(&m, i);
		for (unsigned i = 0; i < m.nahead; i++)
			sum += tfab__wire_ahead_at(&m, i).req_index;
		if (m.key_len)
			FUZZ_CHECK(m.key >= data && m.key + m.key_len <= data + size);
		if (m.errmsg_len)
			FUZZ_CHECK((const uint8_t *)m.errmsg >= data &&
				   (const uint8_t *)m.errmsg + m.errmsg_len <= data + size);
		(void)sum;
		off = rd.off;
	}
	FUZZ_CHECK(rc == 0 || rc < 0);
	return 0;
}
