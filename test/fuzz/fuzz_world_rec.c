/*
 * A world's join records (lib/world/world.c): rank 0 reading what a connection sent as its
 * record, and a rank reading rank 0's answer (the table of every record, or an error).
 *
 * Input: a byte (bit 0: rank 0's answer, else a rank's record; bits 1 to 7: the ranks rank 0
 * already has), a byte for the world's size (1 to 8, its low 3 bits), then the message.
 *
 * Properties: a record taken is exactly the bytes its fields pack to (one encoding); one that
 * passes the check is of this world's size, a rank from 1 to size - 1 that was not there
 * yet; a table taken packs back to the message, each record the rank of its place; an error
 * answered is a status of tfab's or an errno, never 0, with printable words; what is refused
 * says why and leaves the records as they were.
 */
#include <string.h>

#include <tfab/status.h>

#include "engine/engine.h"
#include "world/world.h"
#include "fuzz.h"

#define MAX_SIZE 8

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t packed[1 + MAX_SIZE * TFAB_WORLD_REC_LEN];
	static struct rank_rec recs[MAX_SIZE], before[MAX_SIZE];
	const uint8_t *msg;
	bool have[MAX_SIZE];
	char why[1024];
	int ranks, rc;
	size_t len;

	fuzz_quiet();
	if (size < 2)
		return 0;
	ranks = 1 + (data[1] & 7);
	for (int r = 0; r < MAX_SIZE; r++)
		have[r] = r == 0 || (data[0] >> r & 1);
	msg = data + 2;
	len = size - 2;
	memset(why, 0, sizeof(why));
	if (!(data[0] & 1)) {
		struct rank_rec r;

		memset(&r, 0x5a, sizeof(r));
		rc = tfab__world_rec_parse(msg, len, &r, why, sizeof(why));
		if (rc) {
			FUZZ_CHECK(rc == -TFAB_ERR_PROTOCOL && why[0]);
			return 0;
		}
		tfab__world_rec_pack(&r, packed);
		FUZZ_CHECK(len == TFAB_WORLD_REC_LEN && memcmp(packed, msg, len) == 0);
		why[0] = '\0';
		rc = tfab__world_rec_check(&r, ranks, have, why, sizeof(why));
		if (rc == 0)
			FUZZ_CHECK(r.size == (uint32_t)ranks && r.rank >= 1 &&
				   r.rank < (uint32_t)ranks && !have[r.rank]);
		else
			FUZZ_CHECK(rc == -TFAB_ERR_PROTOCOL && why[0]);
		return 0;
	}
	memset(recs, 0xa5, sizeof(recs));
	memcpy(before, recs, sizeof(recs));
	rc = tfab__world_answer_parse(msg, len, ranks, recs, why, sizeof(why));
	FUZZ_CHECK(memchr(why, '\0', sizeof(why)));
	if (rc) {
		FUZZ_CHECK(rc < 0 && rc > -TFAB_ERR_LAST);
		FUZZ_CHECK(memcmp(recs, before, sizeof(recs)) == 0);
		for (const char *p = why; *p; p++)
			FUZZ_CHECK(*p >= 0x20 && *p < 0x7f);
		return 0;
	}
	packed[0] = 'T';
	for (int r = 0; r < ranks; r++) {
		FUZZ_CHECK(recs[r].rank == (uint32_t)r && recs[r].size == (uint32_t)ranks);
		tfab__world_rec_pack(&recs[r], packed + 1 + (size_t)r * TFAB_WORLD_REC_LEN);
	}
	FUZZ_CHECK(len == 1 + (size_t)ranks * TFAB_WORLD_REC_LEN && memcmp(packed, msg, len) == 0);
	return 0;
}
