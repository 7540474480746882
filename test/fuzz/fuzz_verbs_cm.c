/*
 * The verbs connection manager's datagrams (providers/verbs/cm.c, tfab_verbs_cm_parse): what
 * lands in a UD receive buffer, its routing header and then the datagram, from anyone who can
 * reach the endpoint's UD queue pair. Properties: no read outside the input; a datagram that
 * parses has a known type, an MTU in range, 24-bit queue pair numbers and PSN and a longest
 * work request; it encodes back to the bytes it came from (those the parse reads: not the
 * spare bytes nor the high byte of the 24-bit fields), and that parses to the same message.
 */
#include <string.h>

#include "fuzz.h"
#include "providers/verbs/verbs.h"

/* The datagram's bytes that the parse does not read, cleared. */
static void read_bytes_only(uint8_t *d)
{
	static const unsigned ignored[] = {7, 32, 36, 40, 46, 47};

	for (size_t i = 0; i < sizeof(ignored) / sizeof(ignored[0]); i++)
		d[ignored[i]] = 0;
}

static bool same(const struct tfab_verbs_cm *a, const struct tfab_verbs_cm *b)
{
	return a->type == b->type && a->src_ep == b->src_ep && a->dst_ep == b->dst_ep &&
	       a->conn_id == b->conn_id && a->gen == b->gen && a->qpn == b->qpn &&
	       a->psn == b->psn && a->wr_max == b->wr_max && a->mtu == b->mtu && a->lid == b->lid &&
	       a->ud_qpn == b->ud_qpn && memcmp(a->gid.raw, b->gid.raw, sizeof(a->gid.raw)) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t in[TFAB_VERBS_CM_LEN], out[TFAB_VERBS_GRH + TFAB_VERBS_CM_LEN];
	struct tfab_verbs_cm m, again;

	fuzz_quiet();
	if (tfab_verbs_cm_parse(data, size, &m) != 0)
		return 0;
	FUZZ_CHECK(size >= TFAB_VERBS_GRH + TFAB_VERBS_CM_LEN);
	FUZZ_CHECK(m.type >= TFAB_VERBS_CM_REQ && m.type <= TFAB_VERBS_CM_DISC);
	FUZZ_CHECK(m.mtu >= IBV_MTU_256 && m.mtu <= IBV_MTU_4096 && m.wr_max != 0);
	FUZZ_CHECK(m.qpn <= 0xffffff && m.psn <= 0xffffff && m.ud_qpn <= 0xffffff);
	memset(out, 0, TFAB_VERBS_GRH);
	tfab_verbs_cm_encode(&m, out + TFAB_VERBS_GRH);
	memcpy(in, data + TFAB_VERBS_GRH, sizeof(in));
	read_bytes_only(in);
	FUZZ_CHECK(memcmp(out + TFAB_VERBS_GRH, in, sizeof(in)) == 0);
	FUZZ_CHECK(tfab_verbs_cm_parse(out, sizeof(out), &again) == 0 && same(&m, &again));
	return 0;
}
