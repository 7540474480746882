/*
 * The native shared-memory backend: the provider operations. An endpoint is a control segment
 * (a memfd: registration table, one SPSC ring and bounce buffers per writer) that its peers
 * map through /proc/<pid>/fd. A write travels inline in the ring (small), or is copied once by
 * the writer straight into the destination (a peer's shared segment from mem_alloc, or any
 * registered memory by process_vm_writev) and announced by a ring entry, or goes through the
 * bounce buffers in chunks when the kernel refuses cross-memory attach. The target checks
 * every entry against its own table when it takes it; the writer's WRITE_DONE or ERROR comes
 * from that verdict. Layout and protocol: doc/providers.md, "The shm backend".
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <tfab/status.h>

#include "providers/shm/copy.h"
#include "providers/shm/shm.h"
#include "util/config.h"
#include "util/freelist.h"
#include "util/list.h"
#include "util/log.h"

#define SUBSYS "shm"
#define TFAB_SHM_MAX_PENDING 1024u	  /* queued writes per connection, then -EAGAIN */
#define TFAB_SHM_BUDGET (4u << 20)	  /* bytes one poll copies, to keep polls short */
#define TFAB_SHM_CHECK_NS 1000000ull	  /* a peer's death is seen within this of a poll */
#define TFAB_SHM_RX_CHECK_NS 100000000ull /* dead writers' slots are freed this often */
#define TFAB_SHM_MAX_MSG (1ull << 40)
/*
 * Shorter writes to memory outside a shared segment go through the bounce buffers even where
 * CMA works: two copies of a few KiB in cache cost less than process_vm_writev's system call
 * and page pinning. Measured (tfab-perf raw --heap-dst, one way): 2 KiB 0.35 us bounced, 1.8
 * us by CMA; 8 KiB 1.2 against 2.1; 32 KiB 4.6 against 3.9 (see doc/providers.md).
 */
#define TFAB_SHM_CMA_MIN (32u << 10)

enum tfab_shm_path { PATH_INLINE = 1, PATH_MAPPED, PATH_CMA, PATH_BOUNCE };

/* A write not yet wholly in the ring: queued behind others, or being copied. */
struct tfab_shm_op {
	struct tfab_shm_op *next;
	void *ctx;
	const uint8_t *src;
	size_t len, done; /* bytes, and bytes copied (or chunks posted) so far */
	uint64_t raddr, rkey;
	uint8_t *dst; /* PATH_MAPPED: where raddr is in this process */
	uint32_t imm;
	int path;
	int status; /* a local failure: reported without a ring entry */
	bool inject;
	uint8_t copy[TFAB_SHM_INLINE_MAX]; /* an injected payload queued behind others */
};

/* What the writer remembers of each ring entry until the target takes it. */
struct tfab_shm_rec {
	void *ctx;
	uint16_t nent; /* entries it spans */
	bool inject;
	bool bounce; /* holds a bounce buffer */
	bool last;   /* the write's last entry: its verdict is reported */
};

/* A peer's shared segment, mapped here. */
struct tfab_shm_map {
	struct tfab_shm_map *next;
	uint64_t ino;
	void *addr;
	size_t len;
};

struct tfab_shm_conn {
	struct tfab_conn base;
	struct tfab_shm_conn *next; /* on the endpoint's list, zombies included */
	pid_t pid;
	int pidfd;
	bool self; /* the peer is this process: its addresses are ours */
	bool dead;
	bool closing; /* disconnected with writes in flight */
	struct tfab_shm_ctrl *peer;
	size_t peer_len;
	struct tfab_shm_slot *slot;
	uint64_t head, acked;
	uint64_t bounce_posted, bounce_acked;
	int chunk_status; /* the first failed chunk of the bounced write being acked */
	struct tfab_shm_op *pend, *pend_tail;
	unsigned npending;
	struct tfab_shm_map *maps;
	uint64_t last_check;
	struct tfab_shm_rec recs[TFAB_SHM_RING_N];
};

/* This endpoint's view of one of its slots (as consumer). */
struct tfab_shm_rx {
	bool live;   /* seen active since it was last freed */
	bool failed; /* a chunk of the bounced write being taken failed */
	int pidfd;
	pid_t pid;
};

/* A segment from mem_alloc. */
struct tfab_shm_seg {
	struct tfab_shm_seg *next;
	uint8_t *addr;
	size_t len;
	int fd;
	uint64_t ino;
};

struct tfab_shm_ep {
	struct tfab_ep base;
	struct tfab_caps caps;
	struct tfab_shm_ctrl *ctrl;
	size_t ctrl_len;
	int ctrl_fd;
	uint64_t ctrl_ino;
	uint64_t ep_id;
	struct tfab_shm_host host;
	pid_t pid;
	uint64_t next_gen;
	uint32_t *free_regs; /* a stack of free registration indexes */
	uint32_t nfree_regs;
	int nconns, nmrs, nsegs;
	struct tfab_shm_conn *conns;
	struct tfab_shm_seg *segs;
	struct tfab_freelist ops;
	struct tfab_shm_op *failed, *failed_tail; /* failed before reaching the ring */
	uint64_t next_rx_check;
	bool no_cma;
	struct tfab_shm_stats stats;
	char errmsg[256];
	struct tfab_shm_rx rx[TFAB_SHM_SLOTS];
};

static struct tfab_shm_ep *shm_ep(struct tfab_ep *base)
{
	return tfab_container_of(base, struct tfab_shm_ep, base);
}

static struct tfab_shm_conn *shm_conn(struct tfab_conn *base)
{
	return tfab_container_of(base, struct tfab_shm_conn, base);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	/* The coarse clock costs a few nanoseconds: cheap enough for every poll. */
	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/*
 * Whether cross-memory attach works from this process, and why not: a write to ourselves
 * meets seccomp filters and kernels without CMA (ptrace restrictions such as Yama's apply only
 * between processes, and are met per peer, at the first write).
 */
static bool cma_works(char *why, size_t len)
{
	char a[8] = "tfab", b[8] = "";
	struct iovec l = {.iov_base = a, .iov_len = sizeof(a)};
	struct iovec r = {.iov_base = b, .iov_len = sizeof(b)};

	if (process_vm_writev(getpid(), &l, 1, &r, 1, 0) == (ssize_t)sizeof(a))
		return true;
	snprintf(why, len, "process_vm_writev: %s", strerror(errno));
	return false;
}

static void describe(struct tfab_fabric_desc *d)
{
	char why[96];
	FILE *f;
	int scope = 0;

	memset(d, 0, sizeof(*d));
	d->backend = "shm";
	snprintf(d->fabric, sizeof(d->fabric), "shm");
	/* As caps.domain says: how writes outside shared segments travel. */
	snprintf(d->domain, sizeof(d->domain), "%s",
		 cma_works(why, sizeof(why)) ? "cma" : "bounce");
	f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
	if (f) {
		if (fscanf(f, "%d", &scope) != 1)
			scope = 0;
		fclose(f);
	}
	if (!cma_works(why, sizeof(why)))
		snprintf(d->detail, sizeof(d->detail),
			 "mr=virt imm=4B key=8B inject=%u progress=manual copy=bounce: %s",
			 TFAB_SHM_INLINE_MAX, why);
	else
		snprintf(d->detail, sizeof(d->detail),
			 "mr=virt imm=4B key=8B inject=%u progress=manual copy=cma%s",
			 TFAB_SHM_INLINE_MAX,
			 scope ? " (yama ptrace_scope set: bounce where a peer refuses)" : "");
}

static int tfab_shm_probe(const struct tfab_config *cfg, const char *fabric, tfab_probe_cb cb,
			  void *arg)
{
	struct tfab_fabric_desc d;
	struct tfab_shm_host h;

	(void)cfg;
	if (fabric && strcmp(fabric, "shm") != 0)
		return 0;
	if (tfab_shm_host_self(&h))
		return 0;
	describe(&d);
	cb(arg, &d);
	return 1;
}

static void tfab_shm_explain(const struct tfab_config *cfg, char *buf, size_t len)
{
	struct tfab_shm_host h;

	(void)cfg;
	if (!len)
		return;
	buf[0] = '\0';
	if (tfab_shm_host_self(&h))
		snprintf(buf, len, "cannot read this host's identity (/proc)");
}

/* A slot back to free, whatever it held: by its consumer only. */
static void rx_free_slot(struct tfab_shm_ep *ep, unsigned i)
{
	struct tfab_shm_slot *s = &ep->ctrl->slots[i];
	struct tfab_shm_rx *rx = &ep->rx[i];

	atomic_fetch_and_explicit(&ep->ctrl->active[i / 64], ~(1ull << (i % 64)),
				  memory_order_relaxed);
	for (unsigned k = 0; k < TFAB_SHM_RING_N; k++)
		atomic_store_explicit(&s->ring.e[k].seq, 0, memory_order_relaxed);
	atomic_store_explicit(&s->ring.tail, 0, memory_order_relaxed);
	if (rx->pidfd >= 0)
		close(rx->pidfd);
	rx->pidfd = -1;
	rx->live = false;
	rx->failed = false;
	atomic_store_explicit(&s->state, TFAB_SHM_SLOT_FREE, memory_order_release);
}

static int tfab_shm_close(struct tfab_ep *base)
{
	struct tfab_shm_ep *ep;

	if (!base)
		return 0;
	ep = shm_ep(base);
	if (ep->nconns || ep->nmrs || ep->nsegs)
		return -EBUSY;
	while (ep->conns) {
		/* Zombies: disconnected, their writes never taken (the peer is gone). */
		struct tfab_shm_conn *c = ep->conns;

		ep->conns = c->next;
		while (c->maps) {
			struct tfab_shm_map *m = c->maps;

			c->maps = m->next;
			munmap(m->addr, m->len);
			free(m);
		}
		if (c->peer)
			munmap(c->peer, c->peer_len);
		if (c->pidfd >= 0)
			close(c->pidfd);
		free(c);
	}
	while (ep->failed) {
		struct tfab_shm_op *op = ep->failed;

		ep->failed = op->next;
		tfab__freelist_put(&ep->ops, op);
	}
	if (ep->ctrl) {
		atomic_store_explicit(&ep->ctrl->closed, 1, memory_order_release);
		for (unsigned i = 0; i < TFAB_SHM_SLOTS; i++)
			if (ep->rx[i].pidfd >= 0)
				close(ep->rx[i].pidfd);
		munmap(ep->ctrl, ep->ctrl_len);
	}
	if (ep->ctrl_fd >= 0)
		close(ep->ctrl_fd);
	tfab__freelist_fini(&ep->ops);
	free(ep->free_regs);
	free(ep);
	return 0;
}

static int tfab_shm_open(const struct tfab_open_args *args, struct tfab_ep **ep_p)
{
	struct tfab_shm_ep *ep;
	char why[96];
	void *addr;
	int rc;

	if (args->fabric && strcmp(args->fabric, "shm") != 0)
		return -TFAB_ERR_NO_FABRIC;
	ep = calloc(1, sizeof(*ep));
	if (!ep)
		return -ENOMEM;
	ep->base.ops = &tfab_shm_ops;
	ep->ctrl_fd = -1;
	for (unsigned i = 0; i < TFAB_SHM_SLOTS; i++)
		ep->rx[i].pidfd = -1;
	ep->ops = TFAB_FREELIST_INIT(struct tfab_shm_op, 64);
	ep->pid = getpid();
	rc = tfab_shm_host_self(&ep->host);
	if (rc)
		goto err;
	if (getrandom(&ep->ep_id, sizeof(ep->ep_id), 0) != sizeof(ep->ep_id))
		ep->ep_id = now_ns() ^ ((uint64_t)ep->pid << 32) ^ (uintptr_t)ep;
	ep->free_regs = malloc(TFAB_SHM_NREGS * sizeof(*ep->free_regs));
	if (!ep->free_regs) {
		rc = -ENOMEM;
		goto err;
	}
	/* Index 0 is never used, so that no key is 0. */
	for (uint32_t i = TFAB_SHM_NREGS - 1; i > 0; i--)
		ep->free_regs[ep->nfree_regs++] = i;
	ep->ctrl_len = sizeof(struct tfab_shm_ctrl);
	rc = tfab_shm_seg_create("tfab-shm-ctrl", ep->ctrl_len, &ep->ctrl_fd, &ep->ctrl_ino, &addr);
	if (rc)
		goto err;
	ep->ctrl = addr;
	ep->ctrl->ep_id = ep->ep_id;
	ep->ctrl->pid = ep->pid;
	ep->ctrl->version = TFAB_SHM_VERSION;
	ep->ctrl->nslots = TFAB_SHM_SLOTS;
	atomic_store_explicit((_Atomic uint64_t *)&ep->ctrl->magic, TFAB_SHM_MAGIC,
			      memory_order_release);
	ep->no_cma = !cma_works(why, sizeof(why));
	if (ep->no_cma)
		TFAB_INFO(SUBSYS, "cross-memory attach refused (%s): writes bounce", why);

	ep->caps.backend = "shm";
	snprintf(ep->caps.fabric, sizeof(ep->caps.fabric), "shm");
	snprintf(ep->caps.domain, sizeof(ep->caps.domain), "%s", ep->no_cma ? "bounce" : "cma");
	ep->caps.imm_bytes = 4;
	ep->caps.mr_addr = TFAB_MR_ADDR_VIRT;
	ep->caps.key_bytes = 8;
	ep->caps.max_msg_size = TFAB_SHM_MAX_MSG;
	ep->caps.inject_size = TFAB_SHM_INLINE_MAX;
	ep->caps.addr_len = sizeof(struct tfab_shm_addr);
	ep->caps.hmem_cuda = false;
	ep->caps.same_host = true;
	ep->caps.manual_progress = true;
	ep->caps.mr_local = false;
	TFAB_INFO(SUBSYS, "opened: control segment fd %d, %zu bytes", ep->ctrl_fd, ep->ctrl_len);
	*ep_p = &ep->base;
	return 0;
err:
	tfab_shm_close(&ep->base);
	return rc;
}

static const struct tfab_caps *tfab_shm_caps(const struct tfab_ep *base)
{
	return &tfab_container_of(base, const struct tfab_shm_ep, base)->caps;
}

static int tfab_shm_get_addr(struct tfab_ep *base, void *buf, size_t *len_p)
{
	struct tfab_shm_ep *ep = shm_ep(base);
	struct tfab_shm_addr a;

	if (*len_p < sizeof(a))
		return -ENOSPC;
	memset(&a, 0, sizeof(a));
	a.magic = (uint32_t)TFAB_SHM_MAGIC;
	a.version = TFAB_SHM_VERSION;
	a.len = sizeof(a);
	a.pid = ep->pid;
	a.ctrl_fd = ep->ctrl_fd;
	a.ctrl_ino = ep->ctrl_ino;
	a.ep_id = ep->ep_id;
	a.host = ep->host;
	memcpy(buf, &a, sizeof(a));
	*len_p = sizeof(a);
	return 0;
}

static void conn_free(struct tfab_shm_conn *c)
{
	while (c->maps) {
		struct tfab_shm_map *m = c->maps;

		c->maps = m->next;
		munmap(m->addr, m->len);
		free(m);
	}
	if (c->peer)
		munmap(c->peer, c->peer_len);
	if (c->pidfd >= 0)
		close(c->pidfd);
	free(c);
}

static int tfab_shm_connect(struct tfab_ep *base, const void *addr, size_t len,
			    struct tfab_conn **peer_p)
{
	struct tfab_shm_ep *ep = shm_ep(base);
	struct tfab_shm_addr a;
	struct tfab_shm_conn *c;
	void *map;
	int rc;

	if (len != sizeof(a))
		return -EINVAL;
	memcpy(&a, addr, sizeof(a));
	if (a.magic != (uint32_t)TFAB_SHM_MAGIC || a.len != sizeof(a) || a.pid <= 0)
		return -EINVAL;
	if (a.version != TFAB_SHM_VERSION)
		return -TFAB_ERR_VERSION;
	if (memcmp(a.host.boot_id, ep->host.boot_id, sizeof(a.host.boot_id)) != 0) {
		TFAB_ERROR(SUBSYS,
			   "the peer's address is of another host (boot id differs): shared "
			   "memory reaches only this host");
		return -EHOSTUNREACH;
	}
	if (a.host.pid_ns != ep->host.pid_ns || a.host.mnt_ns != ep->host.mnt_ns) {
		TFAB_ERROR(SUBSYS,
			   "the peer runs in another %s namespace of this host: shared "
			   "memory needs the same pid and mount namespaces",
			   a.host.pid_ns != ep->host.pid_ns ? "pid" : "mount");
		return -EHOSTUNREACH;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->base.ep = base;
	c->pid = a.pid;
	c->self = a.pid == ep->pid;
	/* Taken before the segment is opened: a pid reused after that cannot fool it. */
	c->pidfd = tfab_shm_pidfd(a.pid);
	if (c->pidfd < 0 && c->pidfd != -ENOSYS) {
		rc = c->pidfd == -ESRCH ? -TFAB_ERR_PEER_FAILED : c->pidfd;
		TFAB_ERROR(SUBSYS, "the peer's process %d: %s", (int)a.pid, strerror(-c->pidfd));
		c->pidfd = -1;
		goto err;
	}
	rc = tfab_shm_seg_open(a.pid, a.ctrl_fd, a.ctrl_ino, &map, &c->peer_len);
	if (rc) {
		if (rc == -ENOENT)
			rc = -TFAB_ERR_PEER_FAILED;
		goto err;
	}
	c->peer = map;
	if (c->peer_len < sizeof(struct tfab_shm_ctrl) ||
	    atomic_load_explicit((_Atomic uint64_t *)&c->peer->magic, memory_order_acquire) !=
		TFAB_SHM_MAGIC ||
	    c->peer->ep_id != a.ep_id) {
		TFAB_ERROR(SUBSYS, "process %d's segment is not the endpoint advertised",
			   (int)a.pid);
		rc = -TFAB_ERR_PEER_FAILED;
		goto err;
	}
	if (atomic_load_explicit(&c->peer->closed, memory_order_acquire)) {
		rc = -TFAB_ERR_PEER_FAILED;
		goto err;
	}
	for (unsigned i = 0; i < TFAB_SHM_SLOTS && !c->slot; i++) {
		struct tfab_shm_slot *s = &c->peer->slots[i];
		uint32_t want = TFAB_SHM_SLOT_FREE;

		if (!atomic_compare_exchange_strong_explicit(
			&s->state, &want, TFAB_SHM_SLOT_CLAIMED, memory_order_acquire,
			memory_order_relaxed))
			continue;
		s->owner_pid = ep->pid;
		s->owner_ep = ep->ep_id;
		atomic_store_explicit(&s->state, TFAB_SHM_SLOT_ACTIVE, memory_order_release);
		atomic_fetch_or_explicit(&c->peer->active[i / 64], 1ull << (i % 64),
					 memory_order_release);
		c->slot = s;
	}
	if (!c->slot) {
		TFAB_ERROR(SUBSYS, "the peer takes no more writers (%u at once)", TFAB_SHM_SLOTS);
		rc = -EBUSY;
		goto err;
	}
	c->last_check = now_ns();
	c->next = ep->conns;
	ep->conns = c;
	ep->nconns++;
	*peer_p = &c->base;
	return 0;
err:
	conn_free(c);
	return rc;
}

static bool conn_busy(const struct tfab_shm_conn *c)
{
	return c->head != c->acked || c->pend;
}

/* A connection whose writes are all accounted for, disconnected: its slot goes back. */
static void conn_release(struct tfab_shm_ep *ep, struct tfab_shm_conn *c)
{
	struct tfab_shm_conn **pp = &ep->conns;

	while (*pp && *pp != c)
		pp = &(*pp)->next;
	if (*pp)
		*pp = c->next;
	atomic_store_explicit(&c->slot->state, TFAB_SHM_SLOT_CLOSING, memory_order_release);
	conn_free(c);
}

static int tfab_shm_disconnect(struct tfab_conn *base)
{
	struct tfab_shm_conn *c;
	struct tfab_shm_ep *ep;

	if (!base)
		return 0;
	c = shm_conn(base);
	ep = shm_ep(base->ep);
	ep->nconns--;
	/* Writes in flight still end in their events; the slot goes when they have. */
	c->closing = true;
	if (!conn_busy(c))
		conn_release(ep, c);
	return 0;
}

static struct tfab_shm_seg *seg_of(struct tfab_shm_ep *ep, const void *addr, size_t len)
{
	const uint8_t *p = addr;

	for (struct tfab_shm_seg *s = ep->segs; s; s = s->next)
		if (p >= s->addr && len <= s->len && (size_t)(p - s->addr) <= s->len - len)
			return s;
	return NULL;
}

static int tfab_shm_mr_reg(struct tfab_ep *base, void *addr, size_t len, unsigned access,
			   struct tfab_mr **mr_p)
{
	struct tfab_shm_ep *ep = shm_ep(base);
	struct tfab_shm_seg *seg;
	struct tfab_shm_reg *r;
	struct tfab_mr *mr;
	uint32_t idx;
	uint64_t key;

	if (!addr || !len)
		return -EINVAL;
	if (!ep->nfree_regs) {
		TFAB_ERROR(SUBSYS, "no more registrations (%u at once)", TFAB_SHM_NREGS - 1);
		return -ENOSPC;
	}
	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return -ENOMEM;
	idx = ep->free_regs[--ep->nfree_regs];
	key = (++ep->next_gen << 16) | idx;
	r = &ep->ctrl->regs[idx];
	seg = seg_of(ep, addr, len);
	atomic_store_explicit(&r->addr, (uintptr_t)addr, memory_order_relaxed);
	atomic_store_explicit(&r->len, len, memory_order_relaxed);
	atomic_store_explicit(&r->access, access, memory_order_relaxed);
	atomic_store_explicit(&r->seg_ino, seg ? seg->ino : 0, memory_order_relaxed);
	atomic_store_explicit(&r->seg_off, seg ? (uint64_t)((uint8_t *)addr - seg->addr) : 0,
			      memory_order_relaxed);
	atomic_store_explicit(&r->seg_fd, seg ? seg->fd : -1, memory_order_relaxed);
	atomic_store_explicit(&r->key, key, memory_order_release);
	mr->ep = base;
	mr->addr = addr;
	mr->len = len;
	mr->rkey = key;
	mr->raddr = (uintptr_t)addr;
	mr->prov = r;
	ep->nmrs++;
	*mr_p = mr;
	return 0;
}

static int tfab_shm_mr_dereg(struct tfab_mr *mr)
{
	struct tfab_shm_ep *ep;
	struct tfab_shm_reg *r;

	if (!mr)
		return 0;
	ep = shm_ep(mr->ep);
	r = mr->prov;
	atomic_store_explicit(&r->key, 0, memory_order_release);
	ep->free_regs[ep->nfree_regs++] = (uint32_t)(r - ep->ctrl->regs);
	ep->nmrs--;
	free(mr);
	return 0;
}

static int tfab_shm_mem_alloc(struct tfab_ep *base, size_t len, void **addr_p)
{
	struct tfab_shm_ep *ep = shm_ep(base);
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	struct tfab_shm_seg *s;
	void *addr;
	int rc;

	if (!len)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->len = (len + page - 1) / page * page;
	rc = tfab_shm_seg_create("tfab-shm-data", s->len, &s->fd, &s->ino, &addr);
	if (rc) {
		free(s);
		return rc;
	}
	s->addr = addr;
	s->next = ep->segs;
	ep->segs = s;
	ep->nsegs++;
	*addr_p = addr;
	return 0;
}

static void tfab_shm_mem_free(struct tfab_ep *base, void *addr, size_t len)
{
	struct tfab_shm_ep *ep = shm_ep(base);
	struct tfab_shm_seg **pp = &ep->segs;

	(void)len;
	while (*pp && (*pp)->addr != addr)
		pp = &(*pp)->next;
	if (!*pp) {
		TFAB_WARN(SUBSYS, "mem_free of %p: not from mem_alloc", addr);
		return;
	}
	struct tfab_shm_seg *s = *pp;

	*pp = s->next;
	munmap(s->addr, s->len);
	close(s->fd);
	free(s);
	ep->nsegs--;
}

/*
 * A peer's registration as the writer sees it, read as a seqlock: the key before and after
 * the fields, so that a registration replaced meanwhile is not mistaken for the one asked.
 */
struct reg_view {
	uint64_t addr, len, seg_ino, seg_off;
	int32_t seg_fd;
	uint32_t access;
};

static bool reg_read(struct tfab_shm_reg *regs, uint64_t rkey, struct reg_view *v)
{
	struct tfab_shm_reg *r = &regs[rkey & (TFAB_SHM_NREGS - 1)];

	if (!rkey || atomic_load_explicit(&r->key, memory_order_acquire) != rkey)
		return false;
	v->addr = atomic_load_explicit(&r->addr, memory_order_relaxed);
	v->len = atomic_load_explicit(&r->len, memory_order_relaxed);
	v->seg_ino = atomic_load_explicit(&r->seg_ino, memory_order_relaxed);
	v->seg_off = atomic_load_explicit(&r->seg_off, memory_order_relaxed);
	v->seg_fd = atomic_load_explicit(&r->seg_fd, memory_order_relaxed);
	v->access = atomic_load_explicit(&r->access, memory_order_relaxed);
	atomic_thread_fence(memory_order_acquire);
	return atomic_load_explicit(&r->key, memory_order_relaxed) == rkey;
}

/* Whether [raddr, raddr + len) lies in a region open to remote writes. */
static bool reg_allows(const struct reg_view *v, uint64_t raddr, uint64_t len)
{
	return (v->access & TFAB_MR_REMOTE_WRITE) && raddr >= v->addr && len <= v->len &&
	       raddr - v->addr <= v->len - len;
}

/* The peer's segment mapped here (mapped at first use, kept until disconnect). */
static uint8_t *seg_map(struct tfab_shm_conn *c, const struct reg_view *v)
{
	struct tfab_shm_map *m;
	void *addr;
	size_t len;

	for (m = c->maps; m; m = m->next)
		if (m->ino == v->seg_ino)
			return m->addr;
	if (tfab_shm_seg_open(c->pid, v->seg_fd, v->seg_ino, &addr, &len))
		return NULL;
	m = malloc(sizeof(*m));
	if (!m) {
		munmap(addr, len);
		return NULL;
	}
	m->ino = v->seg_ino;
	m->addr = addr;
	m->len = len;
	m->next = c->maps;
	c->maps = m;
	return addr;
}

/* An op that failed before reaching the ring: reported at the next poll. */
static void op_fail(struct tfab_shm_ep *ep, struct tfab_shm_op *op, int status)
{
	op->status = status;
	op->next = NULL;
	if (ep->failed_tail)
		ep->failed_tail->next = op;
	else
		ep->failed = op;
	ep->failed_tail = op;
}

/*
 * Where a write too long for the ring goes: straight into a mapping (the peer is this
 * process, or the destination is in its shared segment), by CMA, or bounced. The writer checks
 * the peer's table first, since it places the bytes itself; the target checks again.
 */
static int op_route(struct tfab_shm_ep *ep, struct tfab_shm_conn *c, struct tfab_shm_op *op)
{
	struct reg_view v;

	if (!reg_read(c->peer->regs, op->rkey, &v) || !reg_allows(&v, op->raddr, op->len))
		return -TFAB_ERR_REMOTE_ACCESS;
	if (c->self) {
		op->path = PATH_MAPPED;
		op->dst = (uint8_t *)(uintptr_t)op->raddr;
	} else if (v.seg_ino) {
		uint8_t *base = seg_map(c, &v);

		if (!base)
			return -TFAB_ERR_REMOTE_ACCESS;
		op->path = PATH_MAPPED;
		op->dst = base + v.seg_off + (op->raddr - v.addr);
	} else {
		op->path = ep->no_cma || op->len < TFAB_SHM_CMA_MIN ? PATH_BOUNCE : PATH_CMA;
	}
	return 0;
}

/* Fills the common fields of the entry at the conn's head. */
static struct tfab_shm_entry *entry_start(struct tfab_shm_conn *c, int kind, uint64_t raddr,
					  uint64_t rkey, uint64_t len, uint32_t imm)
{
	struct tfab_shm_entry *e = tfab_shm_ring_at(&c->slot->ring, c->head);

	e->kind = (uint8_t)kind;
	e->flags = 0;
	e->ncont = 0;
	e->imm = imm;
	e->raddr = raddr;
	e->rkey = rkey;
	e->len = len;
	e->total = len;
	e->status = 0;
	return e;
}

static void entry_post(struct tfab_shm_conn *c, unsigned nent, void *ctx, bool inject, bool bounce,
		       bool last)
{
	struct tfab_shm_rec *rec = &c->recs[c->head & (TFAB_SHM_RING_N - 1)];

	rec->ctx = ctx;
	rec->nent = (uint16_t)nent;
	rec->inject = inject;
	rec->bounce = bounce;
	rec->last = last;
	tfab_shm_ring_publish(&c->slot->ring, c->head);
	c->head += nent;
}

static bool post_inline(struct tfab_shm_ep *ep, struct tfab_shm_conn *c, const void *src,
			size_t len, uint64_t raddr, uint64_t rkey, uint32_t imm, void *ctx,
			bool inject)
{
	unsigned n = tfab_shm_inline_entries(len);

	if (!tfab_shm_ring_room(c->head, c->acked, n))
		return false;
	entry_start(c, TFAB_SHM_E_INLINE, raddr, rkey, len, imm);
	tfab_shm_ring_put_inline(&c->slot->ring, c->head, src, len);
	entry_post(c, n, ctx, inject, false, true);
	ep->stats.inline_writes++;
	return true;
}

static void pend_pop(struct tfab_shm_ep *ep, struct tfab_shm_conn *c, bool put)
{
	struct tfab_shm_op *op = c->pend;

	c->pend = op->next;
	if (!c->pend)
		c->pend_tail = NULL;
	c->npending--;
	if (put)
		tfab__freelist_put(&ep->ops, op);
}

/* Copies by CMA: 0 when done or out of budget, 1 to bounce instead, else a status. */
static int copy_cma(struct tfab_shm_ep *ep, struct tfab_shm_conn *c, struct tfab_shm_op *op,
		    size_t *budget)
{
	while (op->done < op->len && *budget) {
		size_t n = op->len - op->done < *budget ? op->len - op->done : *budget;
		struct iovec l = {.iov_base = (void *)(op->src + op->done), .iov_len = n};
		struct iovec r = {.iov_base = (void *)(uintptr_t)(op->raddr + op->done),
				  .iov_len = n};
		ssize_t got = process_vm_writev(c->pid, &l, 1, &r, 1, 0);

		if (got < 0) {
			int err = errno;

			if (err == EINTR)
				continue;
			if (err == EPERM || err == ENOSYS || err == EACCES) {
				/* Refused for this process (ptrace rules, seccomp): bounce from now. */
				if (!ep->no_cma)
					TFAB_INFO(SUBSYS,
						  "process_vm_writev to %d refused (%s): writes "
						  "bounce",
						  (int)c->pid, strerror(err));
				ep->no_cma = true;
				snprintf(ep->caps.domain, sizeof(ep->caps.domain), "bounce");
				return 1;
			}
			if (err == ESRCH) {
				c->dead = true;
				return -TFAB_ERR_PEER_FAILED;
			}
			TFAB_DEBUG(SUBSYS, "process_vm_writev: %s", strerror(err));
			return -TFAB_ERR_REMOTE_ACCESS;
		}
		if (got == 0)
			return -TFAB_ERR_REMOTE_ACCESS;
		op->done += (size_t)got;
		*budget -= (size_t)got < *budget ? (size_t)got : *budget;
	}
	return 0;
}

/* Moves the head write along: 0 when it is wholly in the ring, -EAGAIN when it must wait. */
static int op_progress(struct tfab_shm_ep *ep, struct tfab_shm_conn *c, struct tfab_shm_op *op,
		       size_t *budget)
{
	int rc;

	switch (op->path) {
	case PATH_INLINE:
		return post_inline(ep, c, op->src, op->len, op->raddr, op->rkey, op->imm, op->ctx,
				   op->inject)
			   ? 0
			   : -EAGAIN;
	case PATH_MAPPED:
		while (op->done < op->len && *budget) {
			size_t n = op->len - op->done < *budget ? op->len - op->done : *budget;

			tfab_shm_copy(op->dst + op->done, op->src + op->done, n,
				      op->len >= TFAB_SHM_NT_MIN);
			op->done += n;
			*budget -= n;
		}
		if (op->done < op->len || !tfab_shm_ring_room(c->head, c->acked, 1))
			return -EAGAIN;
		entry_start(c, TFAB_SHM_E_DIRECT, op->raddr, op->rkey, op->len, op->imm);
		entry_post(c, 1, op->ctx, op->inject, false, true);
		ep->stats.seg_writes++;
		ep->stats.seg_bytes += op->len;
		return 0;
	case PATH_CMA:
		rc = copy_cma(ep, c, op, budget);
		if (rc == 1) {
			op->path = PATH_BOUNCE;
			/* Bytes CMA placed already stay; the rest bounces. */
			return op_progress(ep, c, op, budget);
		}
		if (rc)
			return rc;
		if (op->done < op->len || !tfab_shm_ring_room(c->head, c->acked, 1))
			return -EAGAIN;
		entry_start(c, TFAB_SHM_E_DIRECT, op->raddr, op->rkey, op->len, op->imm);
		entry_post(c, 1, op->ctx, op->inject, false, true);
		ep->stats.cma_writes++;
		ep->stats.cma_bytes += op->len;
		return 0;
	case PATH_BOUNCE:
		while (op->done < op->len) {
			size_t n = op->len - op->done;
			unsigned b = (unsigned)(c->bounce_posted % TFAB_SHM_NBOUNCE);
			struct tfab_shm_entry *e;
			bool last;

			if (n > TFAB_SHM_BOUNCE_SIZE)
				n = TFAB_SHM_BOUNCE_SIZE;
			last = op->done + n == op->len;
			if (!*budget || c->bounce_posted - c->bounce_acked >= TFAB_SHM_NBOUNCE ||
			    !tfab_shm_ring_room(c->head, c->acked, 1))
				return -EAGAIN;
			memcpy(c->slot->bounce[b], op->src + op->done, n);
			e = entry_start(c, TFAB_SHM_E_BOUNCE, op->raddr + op->done, op->rkey, n,
					op->imm);
			e->total = op->len;
			e->bounce = b;
			e->flags = last ? TFAB_SHM_F_LAST : 0;
			entry_post(c, 1, last ? op->ctx : NULL, op->inject, true, last);
			c->bounce_posted++;
			op->done += n;
			*budget -= n < *budget ? n : *budget;
		}
		ep->stats.bounce_writes++;
		ep->stats.bounce_bytes += op->len;
		return 0;
	default:
		return -EINVAL;
	}
}

static void tx_progress(struct tfab_shm_ep *ep, struct tfab_shm_conn *c, size_t *budget)
{
	while (c->pend && !c->dead) {
		struct tfab_shm_op *op = c->pend;
		int rc = op_progress(ep, c, op, budget);

		if (rc == -EAGAIN)
			return;
		if (c->dead)
			return; /* the op stays queued and fails with the others */
		pend_pop(ep, c, rc == 0);
		if (rc)
			op_fail(ep, op, rc);
	}
}

static void ev_error(struct tfab_shm_ep *ep, struct tfab_event *ev, void *ctx, bool inject,
		     int status)
{
	memset(ev, 0, sizeof(*ev));
	ev->type = TFAB_EV_ERROR;
	ev->ctx = ctx;
	ev->injected = inject;
	ev->status = status;
	snprintf(ep->errmsg, sizeof(ep->errmsg), "%s",
		 status == -TFAB_ERR_PEER_FAILED ? "the peer process is gone or closed its endpoint"
		 : status == -TFAB_ERR_REMOTE_ACCESS
		     ? "remote access refused: bad key, or outside the region"
		     : tfab_strerror(status));
	ev->errmsg = ep->errmsg;
}

/* The writer's side: entries the target took become WRITE_DONE or ERROR events. */
static int tx_acks(struct tfab_shm_ep *ep, struct tfab_shm_conn *c, struct tfab_event *ev, int max)
{
	uint64_t tail = c->dead ? c->head : tfab_shm_ring_tail(&c->slot->ring);
	int n = 0;

	while (c->acked < tail && n < max) {
		struct tfab_shm_rec *rec = &c->recs[c->acked & (TFAB_SHM_RING_N - 1)];
		int status = c->dead ? -TFAB_ERR_PEER_FAILED
				     : tfab_shm_ring_at(&c->slot->ring, c->acked)->status;

		c->acked += rec->nent;
		if (rec->bounce)
			c->bounce_acked++;
		if (!rec->last) {
			if (status && !c->chunk_status)
				c->chunk_status = status;
			continue;
		}
		if (!status)
			status = c->chunk_status;
		c->chunk_status = 0;
		if (status)
			ev_error(ep, &ev[n++], rec->ctx, rec->inject, status);
		else if (!rec->inject) {
			memset(&ev[n], 0, sizeof(ev[n]));
			ev[n].type = TFAB_EV_WRITE_DONE;
			ev[n++].ctx = rec->ctx;
		}
	}
	/* A dead peer's queued writes fail too, in order, after those in the ring. */
	while (c->dead && c->acked == c->head && c->pend && n < max) {
		struct tfab_shm_op *op = c->pend;

		ev_error(ep, &ev[n++], op->ctx, op->inject, -TFAB_ERR_PEER_FAILED);
		c->chunk_status = 0;
		pend_pop(ep, c, true);
	}
	return n;
}

static bool peer_gone(struct tfab_shm_conn *c)
{
	return atomic_load_explicit(&c->peer->closed, memory_order_acquire) ||
	       tfab_shm_process_gone(c->pidfd, c->pid);
}

static int tfab_shm_write_imm(struct tfab_ep *base, struct tfab_conn *peer, const void *lbuf,
			      size_t len, struct tfab_mr *lmr, uint64_t raddr, uint64_t rkey,
			      uint32_t imm, unsigned flags, void *ctx)
{
	struct tfab_shm_ep *ep = shm_ep(base);
	struct tfab_shm_conn *c = shm_conn(peer);
	bool inject = (flags & TFAB_WRITE_INJECT) != 0;
	struct tfab_shm_op *op;
	size_t budget = TFAB_SHM_BUDGET;
	int rc;

	(void)lmr;
	if (len > TFAB_SHM_MAX_MSG || (inject && len > TFAB_SHM_INLINE_MAX))
		return -EMSGSIZE;
	if (c->dead || atomic_load_explicit(&c->peer->closed, memory_order_relaxed)) {
		c->dead = true;
		return -TFAB_ERR_PEER_FAILED;
	}
	/* The fast path: nothing queued, room in the ring, no allocation. */
	if (!c->pend && len <= TFAB_SHM_INLINE_MAX) {
		if (post_inline(ep, c, lbuf, len, raddr, rkey, imm, ctx, inject))
			return 0;
		return -EAGAIN;
	}
	if (c->npending >= TFAB_SHM_MAX_PENDING)
		return -EAGAIN;
	op = tfab__freelist_get(&ep->ops);
	if (!op)
		return -ENOMEM;
	op->next = NULL;
	op->ctx = ctx;
	op->len = len;
	op->done = 0;
	op->raddr = raddr;
	op->rkey = rkey;
	op->imm = imm;
	op->inject = inject;
	op->status = 0;
	op->dst = NULL;
	op->src = lbuf;
	if (len <= TFAB_SHM_INLINE_MAX) {
		op->path = PATH_INLINE;
		if (inject) {
			memcpy(op->copy, lbuf, len);
			op->src = op->copy;
		}
	} else {
		rc = op_route(ep, c, op);
		if (rc) {
			op_fail(ep, op, rc);
			return 0;
		}
	}
	if (c->pend_tail)
		c->pend_tail->next = op;
	else
		c->pend = op;
	c->pend_tail = op;
	c->npending++;
	tx_progress(ep, c, &budget);
	return 0;
}

/* Checks an entry against this endpoint's own table; where the bytes go, or NULL. */
static uint8_t *rx_check(struct tfab_shm_ep *ep, const struct tfab_shm_entry *e)
{
	struct reg_view v;

	if (!reg_read(ep->ctrl->regs, e->rkey, &v) || !reg_allows(&v, e->raddr, e->len))
		return NULL;
	return (uint8_t *)(uintptr_t)e->raddr;
}

/* The target's side: takes one writer's entries, lands them, and gives its verdicts. */
static int rx_slot(struct tfab_shm_ep *ep, unsigned i, struct tfab_event *ev, int max)
{
	struct tfab_shm_slot *s = &ep->ctrl->slots[i];
	struct tfab_shm_rx *rx = &ep->rx[i];
	uint32_t state = atomic_load_explicit(&s->state, memory_order_acquire);
	uint64_t tail0 = atomic_load_explicit(&s->ring.tail, memory_order_relaxed), tail = tail0;
	struct tfab_shm_entry *e;
	int n = 0;

	if (state != TFAB_SHM_SLOT_ACTIVE && state != TFAB_SHM_SLOT_CLOSING)
		return 0;
	if (!rx->live) {
		rx->live = true;
		rx->pid = s->owner_pid;
		rx->pidfd = tfab_shm_pidfd(rx->pid);
	}
	while (n < max && (e = tfab_shm_ring_peek(&s->ring, tail)) != NULL) {
		uint64_t len = e->len;
		unsigned nent = 1;
		int status = 0;
		uint8_t *dst;
		bool report = true;

		if (e->kind == TFAB_SHM_E_INLINE) {
			if (len > TFAB_SHM_INLINE_MAX)
				len = TFAB_SHM_INLINE_MAX;
			nent = tfab_shm_inline_entries(len);
		}
		dst = rx_check(ep, e);
		if (!dst)
			status = -TFAB_ERR_REMOTE_ACCESS;
		switch (e->kind) {
		case TFAB_SHM_E_INLINE:
			if (dst && len == e->len)
				tfab_shm_ring_get_inline(&s->ring, tail, dst, len);
			else
				status = -TFAB_ERR_REMOTE_ACCESS;
			break;
		case TFAB_SHM_E_DIRECT:
			break;
		case TFAB_SHM_E_BOUNCE:
			/* A chunk after a refused one lands nothing: the write has failed. */
			if (dst && !rx->failed && len <= TFAB_SHM_BOUNCE_SIZE)
				memcpy(dst, s->bounce[e->bounce % TFAB_SHM_NBOUNCE], len);
			else
				status = -TFAB_ERR_REMOTE_ACCESS;
			if (status)
				rx->failed = true;
			if (!(e->flags & TFAB_SHM_F_LAST)) {
				report = false;
			} else {
				if (rx->failed && !status)
					status = -TFAB_ERR_REMOTE_ACCESS;
				rx->failed = false;
				len = e->total;
			}
			break;
		default:
			status = -TFAB_ERR_PROTOCOL;
		}
		if (status)
			TFAB_DEBUG(SUBSYS, "refused a write from %d: %zu bytes at %#llx key %#llx",
				   (int)rx->pid, (size_t)e->len, (unsigned long long)e->raddr,
				   (unsigned long long)e->rkey);
		else if (report) {
			memset(&ev[n], 0, sizeof(ev[n]));
			ev[n].type = TFAB_EV_REMOTE_WRITE;
			ev[n].imm = e->imm;
			ev[n++].len = len;
		}
		tfab_shm_ring_take(&s->ring, tail, nent, status);
		tail += nent;
	}
	if (tail != tail0)
		tfab_shm_ring_release(&s->ring, tail);
	else if (state == TFAB_SHM_SLOT_CLOSING)
		rx_free_slot(ep, i); /* its writer left, and everything it wrote is taken */
	return n;
}

/* Frees the slots of writers whose process is gone (a SIGKILL leaves them claimed). */
static void rx_reap(struct tfab_shm_ep *ep)
{
	for (unsigned i = 0; i < TFAB_SHM_SLOTS; i++) {
		struct tfab_shm_rx *rx = &ep->rx[i];

		if (rx->live && tfab_shm_process_gone(rx->pidfd, rx->pid)) {
			TFAB_DEBUG(SUBSYS, "writer %d is gone: its slot %u is free", (int)rx->pid,
				   i);
			rx_free_slot(ep, i);
		}
	}
}

static void reverse(struct tfab_event *ev, int n)
{
	for (int i = 0, j = n - 1; i < j; i++, j--) {
		struct tfab_event t = ev[i];

		ev[i] = ev[j];
		ev[j] = t;
	}
}

/* [a events][b events] -> [b events][a events], in place. */
static void rotate(struct tfab_event *ev, int a, int b)
{
	reverse(ev, a);
	reverse(ev + a, b);
	reverse(ev, a + b);
}

static int tfab_shm_poll(struct tfab_ep *base, struct tfab_event *ev, int max)
{
	struct tfab_shm_ep *ep = shm_ep(base);
	struct tfab_shm_conn *c, *next;
	size_t budget = TFAB_SHM_BUDGET;
	uint64_t now = 0;
	int n = 0, n0, nrx;

	while (ep->failed && n < max) {
		struct tfab_shm_op *op = ep->failed;

		ep->failed = op->next;
		if (!ep->failed)
			ep->failed_tail = NULL;
		ev_error(ep, &ev[n++], op->ctx, op->inject, op->status);
		tfab__freelist_put(&ep->ops, op);
	}
	n0 = nrx = n;
	for (unsigned w = 0; w < TFAB_SHM_SLOTS / 64 && n < max; w++) {
		uint64_t bits = atomic_load_explicit(&ep->ctrl->active[w], memory_order_acquire);

		while (bits && n < max) {
			unsigned b = (unsigned)__builtin_ctzll(bits);

			bits &= bits - 1;
			n += rx_slot(ep, w * 64 + b, ev + n, max - n);
		}
	}
	nrx = n - nrx;
	for (c = ep->conns; c; c = next) {
		next = c->next;
		if (!conn_busy(c))
			continue;
		tx_progress(ep, c, &budget);
		if (n < max)
			n += tx_acks(ep, c, ev + n, max - n);
		if (conn_busy(c) && !c->dead) {
			/* Waiting on the peer: is it still there? At most once a millisecond. */
			if (!now)
				now = now_ns();
			if (now - c->last_check >= TFAB_SHM_CHECK_NS) {
				c->last_check = now;
				if (peer_gone(c)) {
					TFAB_DEBUG(SUBSYS, "peer %d is gone", (int)c->pid);
					c->dead = true;
				}
			}
		} else if (!conn_busy(c)) {
			/* Idle again: the next wait is timed from here, not from long ago. */
			c->last_check = now ? now : now_ns();
		}
		if (c->closing && !conn_busy(c))
			conn_release(ep, c);
	}
	/*
	 * Our writes' completions go before the peers' writes read in this poll: a peer that took
	 * our write and then wrote to us (the engine's TAKEN for a tensor we wrote) released its
	 * tail before it published that write, so the completion is here by now, and an engine
	 * that sees the message first would find the write still in flight.
	 */
	if (nrx && n > n0 + nrx)
		rotate(ev + n0, nrx, n - n0 - nrx);
	/*
	 * The copy budget went: the first connection goes last, so that a long write to one peer
	 * does not hold back the long writes to the others poll after poll.
	 */
	if (!budget && ep->conns && ep->conns->next) {
		struct tfab_shm_conn *first = ep->conns, *last = first;

		while (last->next)
			last = last->next;
		ep->conns = first->next;
		first->next = NULL;
		last->next = first;
	}
	if (!now)
		now = now_ns();
	if (now >= ep->next_rx_check) {
		ep->next_rx_check = now + TFAB_SHM_RX_CHECK_NS;
		rx_reap(ep);
	}
	return n;
}

int tfab_shm_get_stats(struct tfab_ep *base, struct tfab_shm_stats *stats_p)
{
	struct tfab_shm_ep *ep;

	if (!base || base->ops != &tfab_shm_ops)
		return -EINVAL;
	ep = shm_ep(base);
	*stats_p = ep->stats;
	stats_p->writers = 0;
	for (unsigned w = 0; w < TFAB_SHM_SLOTS / 64; w++)
		stats_p->writers += (unsigned)__builtin_popcountll(
		    atomic_load_explicit(&ep->ctrl->active[w], memory_order_relaxed));
	return 0;
}

const struct tfab_provider_ops tfab_shm_ops = {
    .size = sizeof(struct tfab_provider_ops),
    .name = "shm",
    .same_host = true,
    .probe = tfab_shm_probe,
    .open = tfab_shm_open,
    .close = tfab_shm_close,
    .caps = tfab_shm_caps,
    .get_addr = tfab_shm_get_addr,
    .connect = tfab_shm_connect,
    .disconnect = tfab_shm_disconnect,
    .mr_reg = tfab_shm_mr_reg,
    .mr_dereg = tfab_shm_mr_dereg,
    .write_imm = tfab_shm_write_imm,
    .poll = tfab_shm_poll,
    .mem_alloc = tfab_shm_mem_alloc,
    .mem_free = tfab_shm_mem_free,
    .explain = tfab_shm_explain,
};
