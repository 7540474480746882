/*
 * The native shared-memory backend ("shm"): the layout of an endpoint's shared control
 * segment, its address blob, and its statistics (for tests and tools). See doc/providers.md,
 * "The shm backend".
 */
#ifndef TFAB_SHM_H
#define TFAB_SHM_H

#include <stdatomic.h>
#include <stdint.h>

#include "providers/provider.h"
#include "providers/shm/ring.h"
#include "providers/shm/segment.h"

#define TFAB_SHM_MAGIC 0x316d687362616674ull /* "tfabshm1" */
/* 2: an entry's inline bytes begin in its header's cache line (ring.h) */
#define TFAB_SHM_VERSION 2u
#define TFAB_SHM_SLOTS 128u /* writers one endpoint takes at once */
#define TFAB_SHM_NBOUNCE 4u /* bounce buffers per slot: the pipeline's depth */
#define TFAB_SHM_BOUNCE_SIZE (256u << 10)
#define TFAB_SHM_NREGS 65536u /* registrations per endpoint (the low 16 bits of a key) */

enum tfab_shm_slot_state {
	TFAB_SHM_SLOT_FREE = 0, /* the consumer left it clean */
	TFAB_SHM_SLOT_CLAIMED,	/* a writer is setting it up */
	TFAB_SHM_SLOT_ACTIVE,
	TFAB_SHM_SLOT_CLOSING, /* the writer disconnected: the consumer frees it */
};

/* One writer's way into an endpoint: its ring and its bounce buffers. */
struct tfab_shm_slot {
	_Alignas(64) _Atomic uint32_t state;
	int32_t owner_pid;
	uint64_t owner_ep;
	struct tfab_shm_ring ring;
	_Alignas(4096) uint8_t bounce[TFAB_SHM_NBOUNCE][TFAB_SHM_BOUNCE_SIZE];
};

/*
 * A registration, read by writers (to check and place a write before they copy) and by the
 * owner (to check every entry it takes). key 0 is free; fields change only while it is 0.
 */
struct tfab_shm_reg {
	_Atomic uint64_t key;
	_Atomic uint64_t addr;
	_Atomic uint64_t len;
	_Atomic uint64_t seg_ino; /* the shared segment holding it (mem_alloc), else 0 */
	_Atomic uint64_t seg_off; /* where addr is in that segment */
	_Atomic int32_t seg_fd;	  /* the segment's fd in the owner's process */
	_Atomic uint32_t access;
	uint64_t reserved[2];
};

/* An endpoint's control segment (a memfd): what its writers map. */
struct tfab_shm_ctrl {
	uint64_t magic;
	uint64_t ep_id;
	int32_t pid;
	uint32_t version;
	_Atomic uint32_t closed; /* the endpoint closed: writers fail their writes */
	uint32_t nslots;
	_Alignas(64) _Atomic uint64_t active[TFAB_SHM_SLOTS / 64]; /* slots to poll */
	_Alignas(4096) struct tfab_shm_reg regs[TFAB_SHM_NREGS];
	struct tfab_shm_slot slots[TFAB_SHM_SLOTS];
};

/* The address blob: everything a peer on this host needs to reach the endpoint. */
struct tfab_shm_addr {
	uint32_t magic; /* low half of TFAB_SHM_MAGIC */
	uint16_t version;
	uint16_t len;
	int32_t pid;
	int32_t ctrl_fd;
	uint64_t ctrl_ino;
	uint64_t ep_id;
	struct tfab_shm_host host;
};

/*
 * A peer's address from its connection blob (len bytes at addr) into *a: -EINVAL if it is not
 * one, -TFAB_ERR_VERSION for another version. Whether it is of this host is the caller's.
 */
int tfab_shm_addr_decode(const void *addr, size_t len, struct tfab_shm_addr *a);

/* What went which way, per endpoint (writes it made, bytes of them). */
struct tfab_shm_stats {
	uint64_t inline_writes;
	uint64_t seg_writes, seg_bytes;	      /* into a peer's shared segment, one copy */
	uint64_t cma_writes, cma_bytes;	      /* process_vm_writev */
	uint64_t bounce_writes, bounce_bytes; /* through the bounce buffers (CMA refused) */
	unsigned writers;		      /* slots that writers hold on this endpoint now */
};

/* The endpoint's statistics; -EINVAL when ep is not an shm endpoint. */
int tfab_shm_get_stats(struct tfab_ep *ep, struct tfab_shm_stats *stats_p);

extern const struct tfab_provider_ops tfab_shm_ops;

#endif
