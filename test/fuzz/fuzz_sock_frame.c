/*
 * The bootstrap socket's framing (lib/util/sock.c): a 4-byte big-endian length, then that many
 * bytes, read by tfab__frame_rx as bytes come, in pieces of any size.
 *
 * Input: a byte for the capacity (its value × 8), a byte seeding the sizes of the pieces the
 * stream is fed in (1 to 16 bytes each), then the stream.
 *
 * Properties, against a reading of the stream written here: each message comes out whole,
 * with its bytes, as soon as its last byte is fed, and not before; a length beyond the
 * capacity is refused on its header, none of its body taken; the parser never takes a byte
 * past the message it reads; and the messages framed again (tfab__frame_tx_put) are the
 * stream's bytes.
 */
#include <errno.h>
#include <string.h>

#include "fuzz.h"
#include "util/sock.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tfab_frame_tx tx = {0};
	const uint8_t *s;
	uint32_t cap, seed;
	size_t n, pos = 0;
	uint8_t *buf;

	fuzz_quiet();
	if (size < 2)
		return 0;
	cap = (uint32_t)data[0] * 8u;
	seed = data[1] * 2654435761u + 1;
	s = data + 2;
	n = size - 2;
	buf = malloc(cap ? cap : 1);
	FUZZ_CHECK(buf);
	while (pos < n) {
		struct tfab_frame_rx rx;
		uint32_t len = 0;
		size_t end, fed = pos;
		int rc = 0;

		/* the reference: where this message ends, if it does */
		if (n - pos >= 4)
			len = (uint32_t)s[pos] << 24 | (uint32_t)s[pos + 1] << 16 |
			      (uint32_t)s[pos + 2] << 8 | s[pos + 3];
		end = n - pos >= 4 && len <= cap && n - pos - 4 >= len ? pos + 4 + len : 0;
		tfab__frame_rx_init(&rx, buf, cap);
		while (fed < n && rc == 0) {
			size_t piece, used;

			seed = seed * 1103515245u + 12345u;
			piece = 1 + (seed >> 16) % 16;
			if (piece > n - fed)
				piece = n - fed;
			rc = tfab__frame_rx_feed(&rx, s + fed, piece, &used);
			FUZZ_CHECK(used <= piece);
			fed += used;
			/* whole exactly when its last byte is in, not before */
			FUZZ_CHECK((rc == 1) == (end && fed == end));
			FUZZ_CHECK(rc == 1 || rc == 0 || rc == -EMSGSIZE);
			FUZZ_CHECK(rc != 0 || used == piece);
		}
		if (rc == -EMSGSIZE) {
			/* refused on its header */
			FUZZ_CHECK(n - pos >= 4 && len > cap && fed == pos + 4 && rx.len == len);
			break;
		}
		if (rc == 0) {
			/* the stream ended inside it */
			FUZZ_CHECK(!end && fed == n);
			break;
		}
		FUZZ_CHECK(rx.len == len && memcmp(buf, s + pos + 4, len) == 0);
		FUZZ_CHECK(tfab__frame_tx_put(&tx, buf, len) == 0);
		pos = end;
	}
	/* the messages read, framed again, are the stream's bytes up to where they end */
	FUZZ_CHECK(tx.len <= n && memcmp(tx.buf ? tx.buf : s, s, tx.len) == 0);
	tfab__frame_tx_free(&tx);
	free(buf);
	return 0;
}
