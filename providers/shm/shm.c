/*
 * The native shared-memory backend: the provider operations (the writer's side of a write is in
 * tx.c, the target's in rx.c). An endpoint is a control segment
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

#include "providers/shm/internal.h"
#include "util/config.h"
#include "util/freelist.h"
#include "util/list.h"
#include "util/log.h"
#include "util/random.h"

#define SUBSYS "shm"

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
		tfab_shm_conn_free(c);
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
		ep->ep_id = tfab__now_ns() ^ ((uint64_t)ep->pid << 32) ^ (uintptr_t)ep;
	ep->free_regs = malloc(TFAB_SHM_NREGS * sizeof(*ep->free_regs));
	if (!ep->free_regs) {
		rc = -ENOMEM;
		goto err;
	}
	/* Index 0 is never used, so that no key is 0. */
	for (uint32_t i = TFAB_SHM_NREGS - 1; i > 0; i--)
		ep->free_regs[ep->nfree_regs++] = i;
	ep->ctrl_len = sizeof(struct tfab_shm_ctrl);
	rc = tfab__seg_create("tfab-shm-ctrl", ep->ctrl_len, &ep->ctrl_fd, &ep->ctrl_ino, &addr);
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

/* A peer of this host: its process, as users know it. */
static void tfab_shm_addr_str(struct tfab_ep *base, const void *addr, size_t len, char *buf,
			      size_t buflen)
{
	struct tfab_shm_addr a;

	(void)base;
	if (tfab_shm_addr_decode(addr, len, &a) == 0)
		snprintf(buf, buflen, "pid %d", (int)a.pid);
}

int tfab_shm_addr_decode(const void *addr, size_t len, struct tfab_shm_addr *a)
{
	if (len != sizeof(*a))
		return -EINVAL;
	memcpy(a, addr, sizeof(*a));
	if (a->magic != (uint32_t)TFAB_SHM_MAGIC || a->len != sizeof(*a) || a->pid <= 0)
		return -EINVAL;
	if (a->version != TFAB_SHM_VERSION)
		return -TFAB_ERR_VERSION;
	return 0;
}

static int tfab_shm_connect(struct tfab_ep *base, const void *addr, size_t len,
			    struct tfab_conn **peer_p)
{
	struct tfab_shm_ep *ep = shm_ep(base);
	struct tfab_shm_addr a;
	struct tfab_shm_conn *c;
	void *map;
	int rc;

	rc = tfab_shm_addr_decode(addr, len, &a);
	if (rc)
		return rc;
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
	rc = tfab__seg_open(a.pid, a.ctrl_fd, a.ctrl_ino, &map, &c->peer_len);
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
	c->last_check = tfab__coarse_ns();
	c->next = ep->conns;
	ep->conns = c;
	ep->nconns++;
	*peer_p = &c->base;
	return 0;
err:
	tfab_shm_conn_free(c);
	return rc;
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
		tfab_shm_conn_release(ep, c);
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
	r = &ep->ctrl->regs[idx];
	/* Unpredictable above the slot (doc/security.md), and never the slot's last key. */
	do
		key = (tfab__random_u64() << 16) | idx;
	while (key == 0 || key == atomic_load_explicit(&r->key, memory_order_relaxed));
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
	rc = tfab__seg_create("tfab-shm-data", s->len, &s->fd, &s->ino, &addr);
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
	uint64_t now = 0;
	int n, n0, nrx;

	n0 = n = tfab_shm_tx_failed(ep, ev, max);
	nrx = tfab_shm_rx_poll(ep, ev + n, max - n);
	n += nrx;
	/*
	 * A poll that found peers' writes leaves our own writes (their copies and completions)
	 * to the next, for at most TFAB_SHM_TX_DEFER polls in a row: their completions are read
	 * from lines the peers wrote (the rings' tails; a refused entry's verdict), a cache miss
	 * or two that what arrived, most often what the application waits for, should not wait
	 * behind (an 8-byte tensor ping-pong one way: 0.38 us leaving them, 0.40 reading them;
	 * doc/providers.md).
	 */
	if (!nrx || ep->tx_deferred >= TFAB_SHM_TX_DEFER) {
		ep->tx_deferred = 0;
		n += tfab_shm_tx_poll(ep, ev + n, max - n, &now);
	} else {
		ep->tx_deferred++;
	}
	/*
	 * Where read in one poll, our writes' completions go before the peers' writes: a peer that
	 * took our write and then wrote to us (the engine's TAKEN for a tensor we wrote) released
	 * its tail before it published that write, so the completion is here by now. (Deferred,
	 * it comes after: the engine takes a TAKEN before its write's completion, as other
	 * fabrics, which report the two on different queues, may give them.)
	 */
	if (nrx && n > n0 + nrx)
		rotate(ev + n0, nrx, n - n0 - nrx);
	if (!now)
		now = tfab__coarse_ns();
	if (now >= ep->next_rx_check) {
		ep->next_rx_check = now + TFAB_SHM_RX_CHECK_NS;
		tfab_shm_rx_reap(ep);
	}
	return n;
}

/*
 * What tfab_shm_poll would report, read without doing it (tfab_ep_quiet). The reaping of
 * dead writers' slots (every TFAB_SHM_RX_CHECK_NS) waits for the next full poll, which the
 * engine's liveness checks make at least every 50 ms.
 */
static bool tfab_shm_quiet(struct tfab_ep *base)
{
	struct tfab_shm_ep *ep = shm_ep(base);

	if (ep->failed)
		return false;
	for (const struct tfab_shm_conn *c = ep->conns; c; c = c->next) {
		if (conn_busy(c)) /* tx_poll's only work: a write to land, or its ack */
			return false;
	}
	return tfab_shm_rx_quiet(ep);
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
    .addr_str = tfab_shm_addr_str,
    .connect = tfab_shm_connect,
    .disconnect = tfab_shm_disconnect,
    .mr_reg = tfab_shm_mr_reg,
    .mr_dereg = tfab_shm_mr_dereg,
    .write_imm = tfab_shm_write_imm,
    .poll = tfab_shm_poll,
    .quiet = tfab_shm_quiet,
    .mem_alloc = tfab_shm_mem_alloc,
    .mem_free = tfab_shm_mem_free,
    .explain = tfab_shm_explain,
};
