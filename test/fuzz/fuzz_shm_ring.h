/*
 * The shm_ring fuzz target's input, shared with seeds.c: a writer's ring as the target finds
 * it. Little-endian:
 *   8 bytes   the ring's tail (where the target takes from: any value, it trusts its own)
 *   1 byte    bit 0: a chunk of the bounced write being taken was refused before
 *   then      whole entries of 256 bytes (a last one cut short is padded with zeros), the
 *             first at the tail. An entry's raddr is an offset into a region of
 *             FUZZ_SHM_REGION bytes registered twice: as FUZZ_SHM_KEY_W, open to remote
 *             writes, and as FUZZ_SHM_KEY_RO, not; the target adds the region's address.
 *             Its sequence word is made the published one (index + 1) where its low bit is
 *             set, and left as it is otherwise.
 */
#ifndef TFAB_TEST_FUZZ_SHM_RING_H
#define TFAB_TEST_FUZZ_SHM_RING_H

#define FUZZ_SHM_HDR 9u
#define FUZZ_SHM_REGION (64u << 10)
#define FUZZ_SHM_KEY_W 0x5ea1000000010005ull  /* registration index 5 */
#define FUZZ_SHM_KEY_RO 0x5ea1000000020006ull /* index 6 */

#endif
