/*
 * A world (doc/world.md): N ranks meet, then every pair connects through the TCP bootstrap.
 *
 * Meeting: each rank has a record (its rank, the world's size, the port its context listens
 * on, the address the others reach it at, its name). Rank 0 collects them over TCP (a
 * torchrun-style environment), every connection at once, and answers each rank with all of
 * them, or with why not; or the application's allgather moves them. Connecting: rank i connects to every rank below it (a
 * rank accepts only once it has connected to those below it, so nothing waits in a circle),
 * and says who it is in a one-int32 tensor on the new peer; then each rank takes the hellos of
 * the ranks it accepted, which tells it which peer is which.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <tfab/status.h>
#include <tfab/world.h>

#include "engine/engine_world.h"
#include "world/world.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/time.h"

#define SUBSYS "world"

#define REC_MAGIC 0x54465752u /* "TFWR" */
#define REC_VERSION 3
#define REC_HOST TFAB_WORLD_REC_HOST
#define REC_NAME TFAB_WORLD_REC_NAME
#define REC_SHARED TFAB_WORLD_REC_SHARED
#define REC_LEN TFAB_WORLD_REC_LEN
/* Rank 0's answer: 'T' and every record in rank order, or 'E', a status and why. */
#define ANSWER_TABLE 'T'
#define ANSWER_ERROR 'E'
#define ANSWER_WHY TFAB_WORLD_ANSWER_WHY

static const char HELLO_KEY[] = "tfab.world.hello";

static void put32(uint8_t *p, uint32_t v)
{
	v = htonl(v);
	memcpy(p, &v, 4);
}

static uint32_t get32(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return ntohl(v);
}

void tfab__world_rec_pack(const struct rank_rec *r, uint8_t *out)
{
	uint16_t v;

	memset(out, 0, REC_LEN);
	put32(out, REC_MAGIC);
	v = htons(REC_VERSION);
	memcpy(out + 4, &v, 2);
	put32(out + 6, r->rank);
	put32(out + 10, r->size);
	v = htons(r->port);
	memcpy(out + 14, &v, 2);
	memcpy(out + 16, r->host, strnlen(r->host, REC_HOST - 1));
	memcpy(out + 16 + REC_HOST, r->name, strnlen(r->name, REC_NAME - 1));
	put32(out + REC_SHARED, r->small);
	put32(out + REC_SHARED + 4, r->eager);
	put32(out + REC_SHARED + 8, r->shm);
}

/* A string field: text, then NULs to its end (at least one), as rec_pack writes it. */
static bool padded(const uint8_t *p, size_t len)
{
	size_t n = strnlen((const char *)p, len);

	if (n == len)
		return false;
	for (size_t i = n; i < len; i++) {
		if (p[i])
			return false;
	}
	return true;
}

int tfab__world_rec_parse(const uint8_t *msg, size_t len, struct rank_rec *r, char *why,
			  size_t whylen)
{
	uint16_t v;

	if (len != REC_LEN) {
		snprintf(why, whylen, "%zu bytes where a record of %d was due", len, REC_LEN);
		return -TFAB_ERR_PROTOCOL;
	}
	memcpy(&v, msg + 4, 2);
	if (get32(msg) != REC_MAGIC || ntohs(v) != REC_VERSION) {
		snprintf(why, whylen, "no record of this version (magic 0x%08x, version %u)",
			 get32(msg), ntohs(v));
		return -TFAB_ERR_PROTOCOL;
	}
	if (!padded(msg + 16, REC_HOST) || !padded(msg + 16 + REC_HOST, REC_NAME)) {
		snprintf(why, whylen, "a record whose host or name is not a NUL-padded string");
		return -TFAB_ERR_PROTOCOL;
	}
	r->rank = get32(msg + 6);
	r->size = get32(msg + 10);
	memcpy(&v, msg + 14, 2);
	r->port = ntohs(v);
	memcpy(r->host, msg + 16, REC_HOST);
	memcpy(r->name, msg + 16 + REC_HOST, REC_NAME);
	r->small = get32(msg + REC_SHARED);
	r->eager = get32(msg + REC_SHARED + 4);
	r->shm = get32(msg + REC_SHARED + 8);
	return 0;
}

int tfab__world_rec_check(const struct rank_rec *r, int size, const bool *have, char *why,
			  size_t whylen)
{
	if (r->size != (uint32_t)size)
		snprintf(why, whylen, "rank %u says the world has %u ranks; rank 0 says %d",
			 r->rank, r->size, size);
	else if (r->rank == 0 || r->rank >= (uint32_t)size)
		snprintf(why, whylen, "rank %u is not a rank of a world of %d", r->rank, size);
	else if (have[r->rank])
		snprintf(why, whylen, "rank %u arrived twice", r->rank);
	else
		return 0;
	return -TFAB_ERR_PROTOCOL;
}

/* Rank 0's words, as text that is safe to print (a stranger may have written them). */
static void words(const uint8_t *p, size_t n, char *out, size_t outlen)
{
	size_t i;

	for (i = 0; i < n && i + 1 < outlen; i++)
		out[i] = p[i] >= 0x20 && p[i] < 0x7f ? (char)p[i] : '?';
	if (outlen)
		out[i < outlen ? i : outlen - 1] = '\0';
}

int tfab__world_answer_parse(const uint8_t *msg, size_t len, int size, struct rank_rec *recs,
			     char *why, size_t whylen)
{
	struct rank_rec rec;

	if (len >= 5 && len <= 5 + ANSWER_WHY && msg[0] == ANSWER_ERROR) {
		uint32_t status = get32(msg + 1);

		words(msg + 5, len - 5, why, whylen);
		/* a status of ours or an errno, never 0: anything else is a protocol error */
		return status > 0 && status < TFAB_ERR_LAST ? -(int)status : -TFAB_ERR_PROTOCOL;
	}
	if (size < 1 || len != 1 + (size_t)size * REC_LEN || msg[0] != ANSWER_TABLE) {
		snprintf(why, whylen,
			 "rank 0's answer (%zu bytes) is neither the table of %d records "
			 "nor an error",
			 len, size);
		return -TFAB_ERR_PROTOCOL;
	}
	/* every record checked before any is kept */
	for (int pass = 0; pass < 2; pass++) {
		for (int r = 0; r < size; r++) {
			int rc = tfab__world_rec_parse(msg + 1 + (size_t)r * REC_LEN, REC_LEN, &rec,
						       why, whylen);

			if (rc == 0 && (rec.rank != (uint32_t)r || rec.size != (uint32_t)size)) {
				snprintf(
				    why, whylen,
				    "rank 0's table has rank %u of %u where rank %d of %d is due",
				    rec.rank, rec.size, r, size);
				rc = -TFAB_ERR_PROTOCOL;
			}
			if (rc)
				return rc;
			if (pass)
				recs[r] = rec;
		}
	}
	return 0;
}

/*
 * Whether every rank has this one's settings that the collectives' ways depend on (both ends
 * of an operation must take the same): -TFAB_ERR_CONFIG, naming the first that differs.
 */
static int same_settings(const struct tfab_world *w)
{
	const struct rank_rec *me = &w->recs[w->rank];

	for (int r = 0; r < w->size; r++) {
		const struct rank_rec *o = &w->recs[r];

		if (o->small == me->small && o->eager == me->eager && o->shm == me->shm)
			continue;
		TFAB_ERROR(SUBSYS,
			   "rank %d: rank %d (%s) has TFAB_ALLREDUCE_SMALL=%u, TFAB_COLL_EAGER=%u "
			   "and TFAB_COLL_SHM=%u, this rank %u, %u and %u: every rank of a world "
			   "must have the same",
			   w->rank, r, o->name, o->small, o->eager, o->shm, me->small, me->eager,
			   me->shm);
		return -TFAB_ERR_CONFIG;
	}
	return 0;
}

/* A whole decimal number in [lo, hi] from text; -1 where there is none. */
static int parse_int(const char *text, int lo, int hi)
{
	char *end;
	long v;

	if (!text || !*text)
		return -1;
	errno = 0;
	v = strtol(text, &end, 10);
	if (errno || *end || v < lo || v > hi)
		return -1;
	return (int)v;
}

/* The ranks not in have[], as text: "2, 5, 7". */
static void missing_text(const bool *have, int size, char *buf, size_t len)
{
	size_t used = 0;

	buf[0] = 0;
	for (int r = 0; r < size && used + 16 < len; r++) {
		if (!have[r])
			used +=
			    (size_t)snprintf(buf + used, len - used, "%s%d", used ? ", " : "", r);
	}
}

/*
 * The meeting, on both sides, as handshakes (handshake.h): rank 0 takes the records of every
 * connection at once, each bounded by TFAB_HANDSHAKE_TIMEOUT_MS, so that a stranger holds no
 * rank up; each rank sends its record and waits for rank 0's answer.
 */
struct meeting {
	struct tfab_world *w;
	bool *have;		/* rank 0: the ranks whose records came */
	struct tfab_hs **ranks; /* rank 0: their connections, by rank */
	uint8_t *answer;	/* a rank: rank 0's answer */
	uint32_t answer_cap, answer_len;
};

/* Rank 0's answer of an error to a rank: its status, and why. */
static int answer_error(struct tfab_hs *hs, int status, const char *why)
{
	uint8_t msg[1 + 4 + ANSWER_WHY] = {ANSWER_ERROR};
	size_t n = strnlen(why, ANSWER_WHY);

	put32(msg + 1, (uint32_t)-status);
	memcpy(msg + 5, why, n);
	return tfab__hs_put(hs, msg, (uint32_t)(5 + n), true);
}

static int root_start(struct tfab_hs *hs)
{
	return tfab__hs_expect(hs, REC_LEN, true, "its record");
}

static int root_take(struct tfab_hs *hs, const uint8_t *msg, uint32_t len)
{
	struct meeting *m = hs->set->owner;
	struct rank_rec rec;
	char why[256];
	int rc;

	rc = tfab__world_rec_parse(msg, len, &rec, why, sizeof(why));
	if (rc) {
		snprintf(hs->why, sizeof(hs->why), "a connection that is no rank of the world: %s",
			 why);
		return rc;
	}
	rc = tfab__world_rec_check(&rec, m->w->size, m->have, why, sizeof(why));
	if (rc) {
		/* a rank, but not one of this world: it is told why (the answer lingers) */
		snprintf(hs->why, sizeof(hs->why), "%s", why);
		return answer_error(hs, rc, why) ? -ENOMEM : rc;
	}
	if (!rec.host[0]) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);

		if (getpeername(hs->fd, (struct sockaddr *)&ss, &sl) == 0) {
			void *addr = ss.ss_family == AF_INET6
					 ? (void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
					 : (void *)&((struct sockaddr_in *)&ss)->sin_addr;

			inet_ntop(ss.ss_family, addr, rec.host, sizeof(rec.host));
		}
	}
	m->w->recs[rec.rank] = rec;
	m->have[rec.rank] = true;
	hs->rank = (int)rec.rank;
	return 1;
}

static const struct tfab_hs_ops root_ops = {.start = root_start, .take = root_take};

/* Rank 0: takes every rank's record, then answers each with all of them. */
static int meet_as_root(struct tfab_world *w, uint64_t deadline)
{
	struct tfab_context *ctx = w->ctx;
	const struct tfab_config *cfg = tfab__ctx_config(ctx);
	int size = w->size, lfd = -1, rc, arrived = 1;
	struct meeting m = {.w = w};
	uint8_t *msg = malloc(1 + (size_t)size * REC_LEN);
	uint32_t msg_len = 0;
	struct tfab_hs_set set;
	char why[ANSWER_WHY];

	m.have = calloc((size_t)size, sizeof(*m.have));
	m.ranks = calloc((size_t)size, sizeof(*m.ranks));
	tfab__hs_set_init(&set, ctx, &root_ops, &m, "rank 0", cfg->handshake_timeout_ms);
	rc = msg && m.have && m.ranks ? 0 : -ENOMEM;
	if (rc == 0)
		rc = tfab__sock_listen(NULL, (uint16_t)cfg->master_port, &lfd, NULL);
	if (rc) {
		TFAB_ERROR(SUBSYS, "rank 0 cannot listen on port %u for the world: %s",
			   cfg->master_port, tfab_strerror(rc));
		goto out_free;
	}
	m.have[0] = true;
	while (arrived < size) {
		struct tfab_hs *hs;

		rc = tfab__hs_drive(&set, lfd, deadline, &hs);
		if (rc)
			break;
		m.ranks[hs->rank] = hs;
		arrived++;
	}
	close(lfd);
	/* Connections still in their handshakes are no ranks of this world: closed. */
	tfab__hs_set_fini(&set, "the meeting ended");
	if (arrived < size) {
		char missing[ANSWER_WHY - 64];

		missing_text(m.have, size, missing, sizeof(missing));
		snprintf(why, sizeof(why), "rank(s) %s of %d did not arrive within %d ms", missing,
			 size, w->timeout_ms);
		TFAB_ERROR(SUBSYS, "rank 0: %s", why);
		rc = -TFAB_ERR_TIMEOUT;
	} else {
		rc = 0;
		msg[0] = ANSWER_TABLE;
		for (int r = 0; r < size; r++)
			tfab__world_rec_pack(&w->recs[r], msg + 1 + (size_t)r * REC_LEN);
		msg_len = (uint32_t)(1 + (size_t)size * REC_LEN);
	}
	/* Every rank's answer goes out at once; one that does not read it holds no other up. */
	for (int r = 1; r < size; r++) {
		struct tfab_hs *hs = m.ranks[r];

		if (!hs)
			continue;
		if ((rc ? answer_error(hs, rc, why) : tfab__hs_put(hs, msg, msg_len, true)) == 0) {
			tfab__hs_linger(hs, tfab__now_ms() + (uint64_t)tfab__ms_until(deadline) +
						TFAB_HS_LINGER_MS);
		} else {
			TFAB_WARN(SUBSYS, "rank 0: no memory for rank %d's answer", r);
			tfab__hs_free(hs);
		}
	}
	{
		struct tfab_hs *none;

		/* until the last answer is out: each ends in the set, none comes back */
		while (tfab__hs_drive(&set, -1, UINT64_MAX, &none) == 0)
			tfab__hs_free(none);
	}
out_free:
	tfab__hs_set_fini(&set, "the meeting ended");
	free(m.have);
	free(m.ranks);
	free(msg);
	return rc;
}

static int rank_start(struct tfab_hs *hs)
{
	struct meeting *m = hs->set->owner;
	int rc = tfab__hs_put(hs, m->answer, REC_LEN, true); /* this rank's record, packed there */

	return rc ? rc : tfab__hs_expect(hs, m->answer_cap, true, "rank 0's answer");
}

static int rank_take(struct tfab_hs *hs, const uint8_t *msg, uint32_t len)
{
	struct meeting *m = hs->set->owner;

	memcpy(m->answer, msg, len);
	m->answer_len = len;
	return 1;
}

static const struct tfab_hs_ops rank_ops = {.start = rank_start, .take = rank_take};

/* Rank 1 and up: its record to rank 0, and every rank's back. */
static int meet_through_root(struct tfab_world *w, const uint8_t *mine, uint64_t deadline)
{
	struct tfab_context *ctx = w->ctx;
	const struct tfab_config *cfg = tfab__ctx_config(ctx);
	uint32_t cap = (uint32_t)(1 + (size_t)w->size * REC_LEN + 4 + ANSWER_WHY);
	struct meeting m = {.w = w, .answer = malloc(cap), .answer_cap = cap};
	/* Rank 0 answers when all have come, or when it gave up waiting: a little after us. */
	uint64_t until = deadline + 2000;
	const char *host = cfg->master_addr;
	struct tfab_hs_set set;
	struct tfab_hs *hs = NULL;
	char addr[300], why[ANSWER_WHY];
	int fd = -1, rc;

	if (!m.answer)
		return -ENOMEM;
	memcpy(m.answer, mine, REC_LEN);
	snprintf(addr, sizeof(addr), strchr(host, ':') ? "[%s]:%u" : "%s:%u", host,
		 cfg->master_port);
	tfab__hs_set_init(&set, ctx, &rank_ops, &m, "rank", cfg->handshake_timeout_ms);
	rc = tfab__sock_connect(host, (uint16_t)cfg->master_port, tfab__ms_until(deadline), &fd);
	if (rc == 0) {
		rc = tfab__hs_connect(&set, fd, addr, until, &hs);
		if (rc)
			close(fd);
	}
	if (rc == 0)
		rc = tfab__hs_drive(&set, -1, until + TFAB_HS_LINGER_MS, &hs);
	if (rc == 0 && hs->state != TFAB_HS_DONE) {
		rc = hs->status;
		TFAB_ERROR(SUBSYS, "rank %d: no answer from rank 0 at %s: %s", w->rank, addr,
			   hs->why);
	} else if (rc == 0) {
		rc = tfab__world_answer_parse(m.answer, m.answer_len, w->size, w->recs, why,
					      sizeof(why));
		if (rc == -TFAB_ERR_PROTOCOL && m.answer_len && m.answer[0] == ANSWER_TABLE)
			TFAB_ERROR(SUBSYS, "rank %d: %s", w->rank, why);
		else if (rc)
			TFAB_ERROR(SUBSYS, "rank %d: rank 0 says: %s", w->rank, why);
	} else {
		TFAB_ERROR(SUBSYS, "rank %d: no answer from rank 0 at %s: %s", w->rank, addr,
			   tfab_strerror(rc));
	}
	tfab__hs_free(hs);
	tfab__hs_set_fini(&set, "the meeting ended");
	free(m.answer);
	return rc == -ETIMEDOUT || rc == -ECONNREFUSED ? -TFAB_ERR_TIMEOUT : rc;
}

/* The application's allgather moves the records. */
static int meet_by_allgather(struct tfab_world *w, const struct tfab_world_args *args,
			     const uint8_t *mine)
{
	uint8_t *all = malloc((size_t)w->size * REC_LEN);
	int rc;

	if (!all)
		return -ENOMEM;
	rc = args->allgather(mine, all, REC_LEN, args->allgather_arg);
	if (rc > 0)
		rc = -TFAB_ERR_PROTOCOL;
	for (int r = 0; r < w->size && rc == 0; r++) {
		char why[128];

		rc = tfab__world_rec_parse(all + (size_t)r * REC_LEN, REC_LEN, &w->recs[r], why,
					   sizeof(why));
		if (rc)
			TFAB_ERROR(SUBSYS, "rank %d: the allgather's entry %d: %s", w->rank, r,
				   why);
		if (rc == 0 &&
		    (w->recs[r].rank != (uint32_t)r || w->recs[r].size != (uint32_t)w->size)) {
			TFAB_ERROR(SUBSYS, "rank %d: the allgather's entry %d says rank %u of %u",
				   w->rank, r, w->recs[r].rank, w->recs[r].size);
			rc = -TFAB_ERR_PROTOCOL;
		}
	}
	free(all);
	return rc;
}

/*
 * Under mpirun: the job's PMIx server moves the records (put, fence, get), an allgather like
 * any other; rank and size are the job's. Open MPI's mpirun serves PMIx to every process it
 * starts (PMIX_RANK in the environment), whether or not the job initialises MPI.
 */
#ifdef TFAB_HAVE_PMIX
#include <pmix.h>

#define PMIX_KEY "tfab.world.rec"

struct pmix_job {
	pmix_proc_t me;
};

static int pmix_status(pmix_status_t st, const char *what)
{
	TFAB_ERROR(SUBSYS, "PMIx: %s: %s", what, PMIx_Error_string(st));
	return -TFAB_ERR_CONFIG;
}

static int pmix_open(struct pmix_job *job, int *rank_p, int *size_p)
{
	pmix_proc_t wild;
	pmix_value_t *v = NULL;
	pmix_status_t st = PMIx_Init(&job->me, NULL, 0);

	if (st != PMIX_SUCCESS)
		return pmix_status(st, "PMIx_Init (is this process started by mpirun?)");
	PMIX_LOAD_PROCID(&wild, job->me.nspace, PMIX_RANK_WILDCARD);
	st = PMIx_Get(&wild, PMIX_JOB_SIZE, NULL, 0, &v);
	if (st != PMIX_SUCCESS || !v || v->type != PMIX_UINT32) {
		PMIx_Finalize(NULL, 0);
		return pmix_status(st, "the job's size");
	}
	*rank_p = (int)job->me.rank;
	*size_p = (int)v->data.uint32;
	PMIX_VALUE_RELEASE(v);
	return 0;
}

static int pmix_allgather(const void *mine, void *all, size_t len, void *arg)
{
	struct pmix_job *job = arg;
	pmix_value_t val;
	pmix_proc_t wild;
	pmix_info_t info;
	bool collect = true;
	pmix_status_t st;
	uint32_t size = 0;

	PMIX_VALUE_CONSTRUCT(&val);
	val.type = PMIX_BYTE_OBJECT;
	val.data.bo.bytes = (char *)mine;
	val.data.bo.size = len;
	st = PMIx_Put(PMIX_GLOBAL, PMIX_KEY, &val);
	if (st == PMIX_SUCCESS)
		st = PMIx_Commit();
	if (st != PMIX_SUCCESS)
		return pmix_status(st, "putting this rank's record");
	PMIX_LOAD_PROCID(&wild, job->me.nspace, PMIX_RANK_WILDCARD);
	PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
	st = PMIx_Fence(&wild, 1, &info, 1);
	PMIX_INFO_DESTRUCT(&info);
	if (st != PMIX_SUCCESS)
		return pmix_status(st, "the fence of every rank's record");
	{
		pmix_value_t *v = NULL;

		if (PMIx_Get(&wild, PMIX_JOB_SIZE, NULL, 0, &v) == PMIX_SUCCESS && v)
			size = v->data.uint32;
		if (v)
			PMIX_VALUE_RELEASE(v);
	}
	for (uint32_t r = 0; r < size; r++) {
		pmix_proc_t p;
		pmix_value_t *v = NULL;

		PMIX_LOAD_PROCID(&p, job->me.nspace, r);
		st = PMIx_Get(&p, PMIX_KEY, NULL, 0, &v);
		if (st != PMIX_SUCCESS || !v || v->type != PMIX_BYTE_OBJECT ||
		    v->data.bo.size != len) {
			if (v)
				PMIX_VALUE_RELEASE(v);
			return pmix_status(st, "a rank's record");
		}
		memcpy((uint8_t *)all + (size_t)r * len, v->data.bo.bytes, len);
		PMIX_VALUE_RELEASE(v);
	}
	return 0;
}
#endif

/*
 * Nothing to record: a hello that fails fails its peer, which the join checks after its flush.
 * (A callback that wrote into the world could run after a failed join has freed it.)
 */
static void on_hello_sent(void *arg, int status)
{
	(void)arg;
	(void)status;
}

/* Every pair connected; each accepted peer named by its hello. */
static int connect_all(struct tfab_world *w, uint64_t deadline)
{
	struct tfab_context *ctx = w->ctx;
	int64_t one = 1;
	DLTensor hello = {.data = &w->hello,
			  .device = {kDLCPU, 0},
			  .ndim = 1,
			  .dtype = {kDLInt, 32, 1},
			  .shape = &one};
	int n_accept = w->size - 1 - w->rank, rc = 0;
	struct tfab_peer **accepted =
	    calloc((size_t)(n_accept > 0 ? n_accept : 1), sizeof(*accepted));

	if (!accepted)
		return -ENOMEM;
	w->hello = w->rank;
	for (int j = 0; j < w->rank && rc == 0; j++) {
		rc = tfab_connect(ctx, w->recs[j].host, w->recs[j].port, tfab__ms_until(deadline),
				  &w->peers[j]);
		if (rc == 0)
			rc = tfab_send_to(ctx, w->peers[j], HELLO_KEY, 0, &hello, false,
					  on_hello_sent, NULL);
		if (rc)
			TFAB_ERROR(SUBSYS, "rank %d: cannot connect to rank %d at %s:%u: %s",
				   w->rank, j, w->recs[j].host, w->recs[j].port, tfab_strerror(rc));
	}
	for (int k = 0; k < n_accept && rc == 0; k++) {
		rc = tfab_accept(ctx, tfab__ms_until(deadline), &accepted[k]);
		if (rc)
			TFAB_ERROR(SUBSYS, "rank %d: %d of the %d ranks above it connected: %s",
				   w->rank, k, n_accept, tfab_strerror(rc));
	}
	for (int k = 0; k < n_accept && rc == 0; k++) {
		DLManagedTensor *t = NULL;
		int r = -1;

		rc = tfab_recv_sync(ctx, accepted[k], HELLO_KEY, 0, NULL, tfab__ms_until(deadline),
				    &t, NULL);
		if (rc == 0 && t && t->dl_tensor.ndim == 1 && t->dl_tensor.shape[0] == 1 &&
		    t->dl_tensor.dtype.code == kDLInt && t->dl_tensor.dtype.bits == 32)
			r = *(int32_t *)t->dl_tensor.data;
		if (t)
			t->deleter(t);
		if (rc == 0 && (r <= w->rank || r >= w->size || w->peers[r])) {
			TFAB_ERROR(SUBSYS, "rank %d: a peer said it is rank %d", w->rank, r);
			rc = -TFAB_ERR_PROTOCOL;
		}
		if (rc == 0) {
			w->peers[r] = accepted[k];
			accepted[k] = NULL;
		}
	}
	/* Our hellos taken: nothing of the join is left in flight. */
	if (rc == 0)
		rc = tfab_flush(ctx, tfab__ms_until(deadline));
	for (int j = 0; j < w->rank && rc == 0; j++)
		rc = tfab_peer_status(w->peers[j]);
	for (int k = 0; k < n_accept; k++) {
		if (accepted[k])
			tfab_peer_destroy(accepted[k]);
	}
	free(accepted);
	return rc == -ETIMEDOUT ? -TFAB_ERR_TIMEOUT : rc;
}

/* Where a launcher setting came from, for the log. */
static const char *from(const char *var)
{
	return var ? var : "its default";
}

/* This rank's settings from args, else the context's (the environment). */
static int settings(struct tfab_world *w, const struct tfab_world_args *args, struct rank_rec *me)
{
	const struct tfab_config *cfg = tfab__ctx_config(w->ctx);
	const char *name = args && args->name ? args->name : cfg->world_name;
	const char *host = args && args->host ? args->host : cfg->world_host;
	bool gather = args && args->allgather;
	bool own_size = args && args->size >= 0, own_rank = args && args->rank >= 0;

	w->size = own_size ? args->size : parse_int(cfg->world_size, 1, 1 << 20);
	w->rank = own_rank ? args->rank : parse_int(cfg->rank, 0, 1 << 20);
	w->timeout_ms =
	    args && args->timeout_ms >= 0 ? args->timeout_ms : (int)cfg->world_timeout_ms;
	if (w->size < 1 || w->rank < 0 || w->rank >= w->size) {
		TFAB_ERROR(SUBSYS,
			   "no world to join: rank %d of %d (rank '%s' from %s, size '%s' from %s)",
			   w->rank, w->size, cfg->rank,
			   cfg->rank_from ? cfg->rank_from
					  : "none of TFAB_RANK, RANK, OMPI_COMM_WORLD_RANK",
			   cfg->world_size,
			   cfg->world_size_from
			       ? cfg->world_size_from
			       : "none of TFAB_WORLD_SIZE, WORLD_SIZE, OMPI_COMM_WORLD_SIZE");
		return -TFAB_ERR_CONFIG;
	}
	if (strlen(name) > TFAB_WORLD_NAME_MAX || strlen(host) >= REC_HOST) {
		TFAB_ERROR(SUBSYS, "rank %d: its name or host is too long", w->rank);
		return -TFAB_ERR_CONFIG;
	}
	if (!gather && w->size > 1 && cfg->torch_port[0]) {
		TFAB_ERROR(
		    SUBSYS,
		    "rank %d: MASTER_PORT=%s belongs to torch's store (torchrun's or "
		    "init_process_group's), never to tfab's rendezvous: set TFAB_MASTER_PORT "
		    "to a port of the world's own, or join from Python (tfab.World meets "
		    "through torch's store), or give an allgather",
		    w->rank, cfg->torch_port);
		return -TFAB_ERR_CONFIG;
	}
	if (!gather && w->size > 1 && !cfg->master_addr[0]) {
		TFAB_ERROR(SUBSYS,
			   "rank %d: no TFAB_MASTER_ADDR (nor MASTER_ADDR), and no allgather",
			   w->rank);
		return -TFAB_ERR_CONFIG;
	}
	TFAB_INFO(
	    SUBSYS,
	    "rank %d (from %s) of %d (from %s), local rank '%s' (from %s) of '%s' (from %s) "
	    "on this host; %s%s%s%u (address from %s, port from %s)",
	    w->rank, own_rank ? "the application" : from(cfg->rank_from), w->size,
	    own_size ? "the application" : from(cfg->world_size_from), cfg->local_rank,
	    from(cfg->local_rank_from), cfg->local_world_size, from(cfg->local_world_size_from),
	    gather ? "meeting through an allgather, not at " : "meeting at ", cfg->master_addr, ":",
	    cfg->master_port, from(cfg->master_addr_from), from(cfg->master_port_from));
	memset(me, 0, sizeof(*me));
	me->rank = (uint32_t)w->rank;
	me->size = (uint32_t)w->size;
	snprintf(me->name, sizeof(me->name), "%s", name);
	if (!me->name[0])
		snprintf(me->name, sizeof(me->name), "rank %d", w->rank);
	snprintf(me->host, sizeof(me->host), "%s", host);
	me->small = cfg->allreduce_small;
	me->eager = w->eager; /* 0 where another world has the hooks */
	me->shm = cfg->coll_shm;
	/* Rank 0 is reached where it said it listens; with an allgather, at this host's name. */
	if (!me->host[0] && w->rank == 0 && !gather)
		snprintf(me->host, sizeof(me->host), "%s", cfg->master_addr);
	if (!me->host[0] && gather && gethostname(me->host, sizeof(me->host)))
		return -errno;
	return 0;
}

static void world_free(struct tfab_world *w)
{
	if (!w)
		return;
	tfab__coll_fini(w);
	for (int r = 0; w->peers && r < w->size; r++) {
		if (w->peers[r])
			tfab_peer_destroy(w->peers[r]);
	}
	free(w->peers);
	free(w->recs);
	free(w->rank_failed);
	free(w->failed_order);
	free(w);
}

static int world_join(struct tfab_context *ctx, const struct tfab_world_args *args,
		      struct tfab_world **world_p)
{
	struct tfab_world *w;
	struct rank_rec me;
	uint8_t mine[REC_LEN];
	uint64_t deadline;
	int rc;
	uint16_t port = 0;

	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->ctx = ctx;
	rc = tfab__coll_init(w);
	if (rc) {
		free(w);
		return rc;
	}
	rc = settings(w, args, &me);
	if (rc) {
		world_free(w);
		return rc;
	}
	deadline = tfab__now_ms() + (uint64_t)w->timeout_ms;
	w->recs = calloc((size_t)w->size, sizeof(*w->recs));
	w->peers = calloc((size_t)w->size, sizeof(*w->peers));
	w->rank_failed = calloc((size_t)w->size, sizeof(*w->rank_failed));
	w->failed_order = calloc((size_t)w->size, sizeof(*w->failed_order));
	if (!w->recs || !w->peers || !w->rank_failed || !w->failed_order) {
		world_free(w);
		return -ENOMEM;
	}
	/* The port the ranks above this one connect to. */
	rc = w->size > 1 ? tfab_listen(ctx, NULL, 0, &port) : 0;
	me.port = port;
	w->recs[w->rank] = me;
	tfab__world_rec_pack(&me, mine);
	if (rc == 0 && w->size > 1) {
		if (args && args->allgather)
			rc = meet_by_allgather(w, args, mine);
		else if (w->rank == 0)
			rc = meet_as_root(w, deadline);
		else
			rc = meet_through_root(w, mine, deadline);
	}
	if (rc == 0 && w->size > 1)
		rc = same_settings(w);
	if (rc == 0 && w->size > 1)
		rc = connect_all(w, deadline);
	if (rc == 0 && w->size > 1)
		rc = tfab__coll_shm_join(w, deadline);
	if (rc) {
		TFAB_ERROR(SUBSYS, "rank %d of %d did not join the world: %s", w->rank, w->size,
			   tfab_strerror(rc));
		world_free(w);
		return rc;
	}
	tfab__coll_joined(w);
	TFAB_INFO(SUBSYS, "rank %d of %d (%s) joined the world", w->rank, w->size, me.name);
	*world_p = w;
	return 0;
}

/* Whether TFAB_RANK or torchrun's RANK names this rank (not Open MPI's variable, nor none). */
static bool rank_named(const struct tfab_config *cfg)
{
	return cfg->rank[0] && cfg->rank_from && strncmp(cfg->rank_from, "OMPI_", 5) != 0;
}

int tfab_world_join(struct tfab_context *ctx, const struct tfab_world_args *args,
		    struct tfab_world **world_p)
{
	if (!ctx || !world_p)
		return -EINVAL;
	*world_p = NULL;
	/*
	 * Under mpirun, where neither the application nor TFAB_RANK or RANK says otherwise: PMIx,
	 * whose meeting needs no master address (OMPI_COMM_WORLD_RANK names the same rank).
	 */
	if (!(args && (args->allgather || args->rank >= 0)) && !rank_named(tfab__ctx_config(ctx)) &&
	    getenv("PMIX_RANK")) {
#ifdef TFAB_HAVE_PMIX
		struct tfab_world_args a =
		    args ? *args : (struct tfab_world_args){.timeout_ms = -1};
		struct pmix_job job;
		int rc = pmix_open(&job, &a.rank, &a.size);

		if (rc)
			return rc;
		a.allgather = pmix_allgather;
		a.allgather_arg = &job;
		rc = world_join(ctx, &a, world_p);
		PMIx_Finalize(NULL, 0); /* the records have met: PMIx is done with */
		return rc;
#else
		/* Open MPI's variables name the rank: it meets through rank 0, given an address */
		if (!tfab__ctx_config(ctx)->rank[0]) {
			TFAB_ERROR(
			    SUBSYS,
			    "started by mpirun (PMIX_RANK), but this tfab was built without "
			    "PMIx (libpmix-dev): set TFAB_RANK and TFAB_WORLD_SIZE, or give an "
			    "allgather");
			return -TFAB_ERR_CONFIG;
		}
#endif
	}
	return world_join(ctx, args, world_p);
}

int tfab_world_rank(const struct tfab_world *w)
{
	return w ? w->rank : -EINVAL;
}

int tfab_world_size(const struct tfab_world *w)
{
	return w ? w->size : -EINVAL;
}

const char *tfab_world_name(const struct tfab_world *w, int rank)
{
	return w && rank >= 0 && rank < w->size ? w->recs[rank].name : NULL;
}

struct tfab_peer *tfab_world_peer(struct tfab_world *w, int rank)
{
	return w && rank >= 0 && rank < w->size ? w->peers[rank] : NULL;
}

int tfab_world_leave(struct tfab_world *w)
{
	if (!w)
		return -EINVAL;
	if (tfab__coll_fini(w) == -EBUSY) {
		TFAB_ERROR(SUBSYS,
			   "rank %d: cannot leave the world while collectives are in flight",
			   w->rank);
		return -EBUSY;
	}
	world_free(w);
	return 0;
}
