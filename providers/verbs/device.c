/*
 * verbs: choosing a device, a port and a GID from the settings, and explaining why none is
 * usable (no kernel RDMA support, no device, no active port, no GID).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tfab/status.h>

#include "providers/verbs/verbs.h"
#include "util/config.h"
#include "util/log.h"

int tfab_verbs_rc(int rc)
{
	if (rc == 0)
		return 0;
	if (rc > 0)
		return -rc;
	return errno > 0 ? -errno : -TFAB_ERR_FABRIC; /* the few that return -1 and set errno */
}

int tfab_verbs_errno(int err)
{
	return err > 0 ? -err : -TFAB_ERR_FABRIC;
}

void tfab_verbs_gid_str(const union ibv_gid *gid, char *buf, size_t len)
{
	if (!inet_ntop(AF_INET6, gid->raw, buf, (socklen_t)len))
		snprintf(buf, len, "?");
}

static bool gid_zero(const union ibv_gid *gid)
{
	static const union ibv_gid zero;

	return memcmp(gid, &zero, sizeof(zero)) == 0;
}

static bool gid_ipv4_mapped(const union ibv_gid *gid)
{
	static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

	return memcmp(gid->raw, prefix, sizeof(prefix)) == 0;
}

/* How much a RoCE GID is wanted: v2 with an IPv4-mapped address, v2, v1, anything. */
static int gid_rank(const struct ibv_gid_entry *e)
{
	if (gid_zero(&e->gid))
		return -1;
	if (e->gid_type == IBV_GID_TYPE_ROCE_V2)
		return gid_ipv4_mapped(&e->gid) ? 3 : 2;
	return e->gid_type == IBV_GID_TYPE_ROCE_V1 ? 1 : 0;
}

static const char *gid_type_str(uint32_t type)
{
	switch (type) {
	case IBV_GID_TYPE_IB:
		return "IB";
	case IBV_GID_TYPE_ROCE_V1:
		return "RoCE v1";
	case IBV_GID_TYPE_ROCE_V2:
		return "RoCE v2";
	default:
		return "?";
	}
}

/* The best RoCE GID of a port: the whole table in one call, else entry by entry. */
static int choose_roce_gid(struct ibv_context *ctx, const struct ibv_device_attr *dattr,
			   const struct ibv_port_attr *pattr, struct tfab_verbs_port *p)
{
	size_t max = (size_t)pattr->gid_tbl_len * dattr->phys_port_cnt;
	struct ibv_gid_entry *tab = calloc(max ? max : 1, sizeof(*tab));
	struct ibv_gid_entry best = {0};
	int best_rank = -1;
	ssize_t n;

	if (!tab)
		return -ENOMEM;
	n = ibv_query_gid_table(ctx, tab, max, 0);
	if (n < 0) {
		/* Older kernels: one entry at a time (sysfs underneath). */
		n = 0;
		for (int i = 0; i < pattr->gid_tbl_len; i++)
			if (ibv_query_gid_ex(ctx, p->port, (uint32_t)i, &tab[n], 0) == 0)
				n++;
	}
	for (ssize_t i = 0; i < n; i++) {
		int rank;

		/* An address handle's sgid_index has 8 bits. */
		if (tab[i].port_num != p->port || tab[i].gid_index > 255)
			continue;
		rank = gid_rank(&tab[i]);
		if (rank > best_rank || (rank == best_rank && tab[i].gid_index < best.gid_index)) {
			best = tab[i];
			best_rank = rank;
		}
	}
	free(tab);
	if (best_rank < 0)
		return -ENOENT;
	p->gid_index = (int)best.gid_index;
	p->gid_type = best.gid_type;
	p->gid = best.gid;
	return 0;
}

/* Fill p's GID from TFAB_VERBS_GID_INDEX, or choose one. why says what went wrong. */
static int choose_gid(const struct tfab_config *cfg, struct ibv_context *ctx,
		      const struct ibv_device_attr *dattr, const struct ibv_port_attr *pattr,
		      struct tfab_verbs_port *p, char *why, size_t whylen)
{
	struct ibv_gid_entry e;
	int rc;

	if (cfg->verbs_gid_index >= 0) {
		rc = ibv_query_gid_ex(ctx, p->port, (uint32_t)cfg->verbs_gid_index, &e, 0);
		if (rc || gid_zero(&e.gid)) {
			snprintf(why, whylen, "TFAB_VERBS_GID_INDEX=%d: %s port %u has no such GID",
				 cfg->verbs_gid_index, p->dev, p->port);
			return -ENOENT;
		}
		p->gid_index = cfg->verbs_gid_index;
		p->gid_type = e.gid_type;
		p->gid = e.gid;
		return 0;
	}
	if (p->link_layer != IBV_LINK_LAYER_ETHERNET) {
		/* InfiniBand: the port GID; LIDs route within the subnet. */
		if (ibv_query_gid(ctx, p->port, 0, &p->gid)) {
			snprintf(why, whylen, "%s port %u: reading GID 0 failed", p->dev, p->port);
			return -EIO;
		}
		p->gid_index = 0;
		p->gid_type = IBV_GID_TYPE_IB;
		return 0;
	}
	rc = choose_roce_gid(ctx, dattr, pattr, p);
	if (rc)
		snprintf(why, whylen, "%s port %u has no GID (is its network interface up?)",
			 p->dev, p->port);
	return rc;
}

static const char *link_layer_str(uint8_t ll)
{
	return ll == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand";
}

/* Scan one open device's ports; returns how many were usable, *kept when cb took ctx. */
static int scan_ports(const struct tfab_config *cfg, struct ibv_context *ctx, const char *name,
		      tfab_verbs_port_cb cb, void *arg, bool *kept, char *why, size_t whylen)
{
	struct ibv_device_attr dattr;
	int found = 0;

	if (ibv_query_device(ctx, &dattr)) {
		snprintf(why, whylen, "%s: ibv_query_device failed", name);
		return 0;
	}
	for (unsigned port = 1; port <= dattr.phys_port_cnt; port++) {
		struct ibv_port_attr pattr;
		struct tfab_verbs_port p;

		if (cfg->verbs_port >= 0 && (unsigned)cfg->verbs_port != port)
			continue;
		memset(&p, 0, sizeof(p));
		snprintf(p.dev, sizeof(p.dev), "%s", name);
		p.port = (uint8_t)port;
		if (ibv_query_port(ctx, (uint8_t)port, &pattr)) {
			snprintf(why, whylen, "%s port %u: ibv_query_port failed", name, port);
			continue;
		}
		if (pattr.state != IBV_PORT_ACTIVE) {
			snprintf(why, whylen, "%s port %u is %s, not active", name, port,
				 ibv_port_state_str(pattr.state));
			continue;
		}
		p.link_layer = pattr.link_layer == IBV_LINK_LAYER_ETHERNET
				   ? IBV_LINK_LAYER_ETHERNET
				   : IBV_LINK_LAYER_INFINIBAND;
		p.mtu = (uint8_t)pattr.active_mtu;
		p.lid = pattr.lid;
		p.max_msg_sz = pattr.max_msg_sz;
		if (choose_gid(cfg, ctx, &dattr, &pattr, &p, why, whylen))
			continue;
		found++;
		if (cb(arg, ctx, &p)) {
			*kept = true;
			break;
		}
	}
	if (cfg->verbs_port > dattr.phys_port_cnt && !found)
		snprintf(why, whylen, "TFAB_VERBS_PORT=%d: %s has %u port%s", cfg->verbs_port, name,
			 dattr.phys_port_cnt, dattr.phys_port_cnt == 1 ? "" : "s");
	return found;
}

int tfab_verbs_scan(const struct tfab_config *cfg, tfab_verbs_port_cb cb, void *arg, char *why,
		    size_t whylen)
{
	struct ibv_device **list;
	char names[128] = "";
	size_t nlen = 0;
	int n = 0, found = 0, matched = 0;
	bool kept = false;

	snprintf(why, whylen, "no RDMA device");
	errno = 0;
	list = ibv_get_device_list(&n);
	if (!list) {
		int err = errno;

		/* No kernel RDMA support at all (no /sys/class/infiniband_verbs): not an error. */
		snprintf(why, whylen, "no RDMA device: %s (ibv_get_device_list: %s)",
			 err == ENOSYS ? "this kernel has no RDMA support"
				       : "the device list cannot be read",
			 strerror(err ? err : EIO));
		return 0;
	}
	if (n == 0)
		snprintf(
		    why, whylen,
		    "no RDMA device (for soft-RoCE: modprobe rdma_rxe; rdma link add rxe0 type "
		    "rxe netdev eth0)");
	for (int i = 0; i < n && !kept; i++) {
		const char *name = ibv_get_device_name(list[i]);
		struct ibv_context *ctx;

		if (nlen < sizeof(names))
			nlen += (size_t)snprintf(names + nlen, sizeof(names) - nlen, "%s%s",
						 nlen ? ", " : "", name);
		if (cfg->verbs_device[0] && strcmp(cfg->verbs_device, name) != 0)
			continue;
		matched++;
		ctx = ibv_open_device(list[i]);
		if (!ctx) {
			snprintf(why, whylen, "%s cannot be opened: %s", name, strerror(errno));
			continue;
		}
		found += scan_ports(cfg, ctx, name, cb, arg, &kept, why, whylen);
		if (!kept)
			ibv_close_device(ctx);
	}
	if (n && cfg->verbs_device[0] && !matched)
		snprintf(why, whylen, "TFAB_VERBS_DEVICE=%s matches no device; there are: %s",
			 cfg->verbs_device, names);
	ibv_free_device_list(list);
	if (found)
		why[0] = '\0';
	return found;
}

struct probe_arg {
	tfab_probe_cb cb;
	void *arg;
};

static bool probe_one(void *arg, struct ibv_context *ctx, const struct tfab_verbs_port *p)
{
	struct probe_arg *pa = arg;
	struct tfab_fabric_desc d;
	char gid[64];

	(void)ctx;
	memset(&d, 0, sizeof(d));
	d.backend = "verbs";
	snprintf(d.fabric, sizeof(d.fabric), "%s", p->dev);
	snprintf(d.domain, sizeof(d.domain), "%.59s:%u", p->dev, p->port);
	tfab_verbs_gid_str(&p->gid, gid, sizeof(gid));
	snprintf(d.detail, sizeof(d.detail),
		 "%s lid=%u gid[%d]=%s (%s) mtu=%d mr=virt imm=4B key=4B max_msg=%u",
		 link_layer_str(p->link_layer), p->lid, p->gid_index, gid,
		 gid_type_str(p->gid_type), 128 << p->mtu, p->max_msg_sz);
	pa->cb(pa->arg, &d);
	return false;
}

int tfab_verbs_probe(const struct tfab_config *cfg, const char *fabric, tfab_probe_cb cb, void *arg)
{
	struct probe_arg pa = {cb, arg};
	char why[256];

	/* The verbs backend takes no fabric name: TFAB_VERBS_DEVICE chooses. */
	if (fabric)
		return 0;
	return tfab_verbs_scan(cfg, probe_one, &pa, why, sizeof(why));
}

static bool count_one(void *arg, struct ibv_context *ctx, const struct tfab_verbs_port *p)
{
	(void)arg;
	(void)ctx;
	(void)p;
	return false;
}

void tfab_verbs_explain(const struct tfab_config *cfg, char *buf, size_t len)
{
	char why[256];

	if (tfab_verbs_scan(cfg, count_one, NULL, why, sizeof(why)) > 0)
		why[0] = '\0';
	snprintf(buf, len, "%s", why);
}
