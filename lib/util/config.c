/*
 * The configuration table and its parsers, and the warning about TFAB_* variables that no
 * setting knows.
 */
#include <ctype.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <tfab/config.h>
#include <tfab/status.h>

#include "util/config.h"
#include "util/log.h"

static int parse_string(const char *text, void *field, size_t size, unsigned long min,
			unsigned long max)
{
	(void)min;
	(void)max;
	if (strlen(text) >= size)
		return -ENAMETOOLONG;
	memcpy(field, text, strlen(text) + 1);
	return 0;
}

static void format_string(const void *field, char *buf, size_t len)
{
	snprintf(buf, len, "%s", (const char *)field);
}

int tfab__parse_size(const char *text, uint64_t *value_p)
{
	unsigned long long v, mult = 1;
	char *end;

	if (*text == '-' || *text == '\0')
		return -EINVAL;
	errno = 0;
	v = strtoull(text, &end, 0);
	if (errno || end == text)
		return -EINVAL;
	switch (*end) {
	case 'k':
	case 'K':
		mult = 1ull << 10;
		end++;
		break;
	case 'm':
	case 'M':
		mult = 1ull << 20;
		end++;
		break;
	case 'g':
	case 'G':
		mult = 1ull << 30;
		end++;
		break;
	}
	if (*end)
		return -EINVAL;
	if (v > ~0ull / mult)
		return -ERANGE;
	*value_p = v * mult;
	return 0;
}

/* A number with K, M, G suffixes within [min, max]: what both integer kinds read. */
static int parse_bounded(const char *text, unsigned long min, unsigned long max, uint64_t *v_p)
{
	int rc = tfab__parse_size(text, v_p);

	if (rc)
		return rc;
	return *v_p < min || *v_p > max ? -ERANGE : 0;
}

static int parse_uint(const char *text, void *field, size_t size, unsigned long min,
		      unsigned long max)
{
	uint64_t v;
	int rc = parse_bounded(text, min, max, &v);

	(void)size;
	if (rc == 0)
		*(unsigned *)field = (unsigned)v;
	return rc;
}

static void format_uint(const void *field, char *buf, size_t len)
{
	snprintf(buf, len, "%u", *(const unsigned *)field);
}

/* "auto" (stored as -1) or a number within the bounds, into an int. */
static int parse_auto_uint(const char *text, void *field, size_t size, unsigned long min,
			   unsigned long max)
{
	unsigned v;
	int rc;

	if (strcmp(text, "auto") == 0) {
		*(int *)field = -1;
		return 0;
	}
	rc = parse_uint(text, &v, size, min, max);
	if (rc == 0)
		*(int *)field = (int)v;
	return rc;
}

static void format_auto_uint(const void *field, char *buf, size_t len)
{
	int v = *(const int *)field;

	if (v < 0)
		snprintf(buf, len, "auto");
	else
		snprintf(buf, len, "%d", v);
}

static int parse_level(const char *text, void *field, size_t size, unsigned long min,
		       unsigned long max)
{
	enum tfab_log_level level;
	int rc;

	(void)size;
	(void)min;
	(void)max;
	/* A level that is none is warn, and the logger says so once (util/log.c), not both. */
	rc = tfab__log_level_parse(text, &level);
	*(int *)field = rc == 0 ? (int)level : TFAB_LOG_WARN;
	return 0;
}

static void format_level(const void *field, char *buf, size_t len)
{
	snprintf(buf, len, "%s", tfab_log_level_name((enum tfab_log_level) * (const int *)field));
}

/* Bytes as a 64-bit number (K, M, G suffixes), or "auto" (stored as UINT64_MAX). */
static int parse_bytes(const char *text, void *field, size_t size, unsigned long min,
		       unsigned long max)
{
	(void)size;
	(void)min;
	(void)max;
	if (strcmp(text, "auto") == 0) {
		*(uint64_t *)field = UINT64_MAX;
		return 0;
	}
	return tfab__parse_size(text, (uint64_t *)field) ? -EINVAL : 0;
}

static void format_bytes(const void *field, char *buf, size_t len)
{
	uint64_t v = *(const uint64_t *)field;

	if (v == UINT64_MAX)
		snprintf(buf, len, "auto");
	else
		snprintf(buf, len, "%llu", (unsigned long long)v);
}

/* Bytes as a 64-bit number (K, M, G suffixes) within the bounds. */
static int parse_size(const char *text, void *field, size_t size, unsigned long min,
		      unsigned long max)
{
	uint64_t v;
	int rc = parse_bounded(text, min, max, &v);

	(void)size;
	if (rc == 0)
		*(uint64_t *)field = v;
	return rc;
}

static void format_size(const void *field, char *buf, size_t len)
{
	snprintf(buf, len, "%llu", (unsigned long long)*(const uint64_t *)field);
}

/*
 * A secret of at least min bytes, or none (""). Too short is -EKEYREJECTED: entry_set says
 * so without the value, which it never shows.
 */
static int parse_secret(const char *text, void *field, size_t size, unsigned long min,
			unsigned long max)
{
	size_t n = strlen(text);

	(void)max;
	if (n && n < min)
		return -EKEYREJECTED;
	return parse_string(text, field, size, 0, 0);
}

/* A secret is never shown: tfab-info and the logs see whether it is set, not what it is. */
static void format_secret(const void *field, char *buf, size_t len)
{
	snprintf(buf, len, "%s", *(const char *)field ? "(set)" : "");
}

static const struct tfab_config_parser parser_string = {"string", parse_string, format_string};
static const struct tfab_config_parser parser_secret = {"secret", parse_secret, format_secret};
static const struct tfab_config_parser parser_bytes = {"auto|bytes", parse_bytes, format_bytes};
static const struct tfab_config_parser parser_size = {"bytes", parse_size, format_size};
static const struct tfab_config_parser parser_uint = {"uint", parse_uint, format_uint};
static const struct tfab_config_parser parser_auto_uint = {"auto|uint", parse_auto_uint,
							   format_auto_uint};
static const struct tfab_config_parser parser_level = {"level", parse_level, format_level};

#define FIELD(f) offsetof(struct tfab_config, f), sizeof(((struct tfab_config *)0)->f)

static const struct tfab_config_entry table[] = {
    {"TFAB_PROVIDER", "auto",
     "Paths to open, in order of preference, comma-separated: auto (shm for peers on this "
     "host, then verbs when a device has an active port, else libfabric), shm, verbs, ofi, or "
     "ofi:<libfabric provider>; each peer takes the first that both sides have",
     FIELD(provider), &parser_string, 0, 0},
    {"TFAB_LOG_LEVEL", "warn",
     "Log level: none, error, warn, info, debug or trace (or 0..5). From Python, unset: the "
     "level of the logger \"tfab\" at import, whose handlers take the lines",
     FIELD(log_level), &parser_level, 0, 0},
    {"TFAB_CONNECT_TIMEOUT_MS", "10000",
     "Longest wait for a peer while connecting or bootstrapping, in milliseconds",
     FIELD(connect_timeout_ms), &parser_uint, 1, 3600000},
    {"TFAB_HANDSHAKE_TIMEOUT_MS", "10000",
     "Longest a connection to a listening side (tfab_accept, a world's rank 0) may take over "
     "its bootstrap handshake, in milliseconds: one that is silent, slow, sends garbage or "
     "holds another key is refused (a warning with its address) and closed by then. Many "
     "handshakes run at once, so such a connection delays no other",
     FIELD(handshake_timeout_ms), &parser_uint, 1, 3600000},
    {"TFAB_OP_TIMEOUT_MS", "60000",
     "A receive that gets nothing from its peer for this long (no content, no meta-data), "
     "a send whose receiver gives no verdict on content it has for this long, and a "
     "collective's send that its receiver does not ask for in this long, fail with "
     "TFAB_ERR_TIMEOUT and a warning naming the peer, key and step; 0 waits for ever. "
     "Blocking receives keep their own timeout",
     FIELD(op_timeout_ms), &parser_uint, 0, 86400000},
    {"TFAB_HEARTBEAT_MS", "1000",
     "A thread writes a heartbeat on every peer's bootstrap connection this often, whether "
     "or not the application calls progress; a peer that has sent one and then nothing for "
     "TFAB_OP_TIMEOUT_MS (at least three heartbeats) fails with TFAB_ERR_TIMEOUT: a stopped "
     "process or a cut link. 0 sends none",
     FIELD(heartbeat_ms), &parser_uint, 0, 3600000},
    {"TFAB_RANK", "",
     "This process's rank in its world (doc/world.md); unset: torchrun's RANK, else Open MPI's "
     "OMPI_COMM_WORLD_RANK (under mpirun, PMIx goes before it where tfab has PMIx)",
     FIELD(rank), &parser_string, 0, 0},
    {"TFAB_WORLD_SIZE", "",
     "The number of ranks in the world; unset: torchrun's WORLD_SIZE, else Open MPI's "
     "OMPI_COMM_WORLD_SIZE",
     FIELD(world_size), &parser_string, 0, 0},
    {"TFAB_LOCAL_RANK", "",
     "This process's rank among the world's ranks on this host, for the log; unset: "
     "torchrun's LOCAL_RANK, else Open MPI's OMPI_COMM_WORLD_LOCAL_RANK",
     FIELD(local_rank), &parser_string, 0, 0},
    {"TFAB_LOCAL_WORLD_SIZE", "",
     "The number of the world's ranks on this host, for the log; unset: torchrun's "
     "LOCAL_WORLD_SIZE, else Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE",
     FIELD(local_world_size), &parser_string, 0, 0},
    {"TFAB_MASTER_ADDR", "",
     "Where rank 0 listens for the other ranks when a world is joined (its host name or "
     "address); unset: torchrun's MASTER_ADDR",
     FIELD(master_addr), &parser_string, 0, 0},
    {"TFAB_MASTER_PORT", "29650",
     "The port rank 0 listens on when a world is joined without an allgather. Never "
     "torchrun's MASTER_PORT, where torch's store listens: with MASTER_PORT set and this one "
     "not, the join through rank 0 is refused (TFAB_ERR_CONFIG; tfab.World meets through "
     "torch's store instead). The default is clear of torchrun's 29500 and 29400",
     FIELD(master_port), &parser_uint, 1, 65535},
    {"TFAB_WORLD_NAME", "", "This rank's name in its world, such as /job:worker/task:3",
     FIELD(world_name), &parser_string, 0, 0},
    {"TFAB_WORLD_HOST", "",
     "The address the other ranks reach this one at; empty: the address rank 0 saw it come "
     "from",
     FIELD(world_host), &parser_string, 0, 0},
    {"TFAB_WORLD_TIMEOUT_MS", "60000",
     "How long joining a world waits for every rank; a rank that does not arrive fails the "
     "join with TFAB_ERR_TIMEOUT, and the log names it",
     FIELD(world_timeout_ms), &parser_uint, 1, 86400000},
    {"TFAB_ALLREDUCE_SMALL", "65536",
     "An allreduce of at most this many bytes goes directly from every rank to every rank (one "
     "round), or from 16 ranks by recursive doubling (log2(N) steps with a partner each); a "
     "larger one around the ring (reduce-scatter, then allgather)",
     FIELD(allreduce_small), &parser_uint, 0, 1u << 30},
    {"TFAB_COLL_PIECE", "1048576",
     "Bytes per write of a collective: a ring moves each rank's part in pieces of this size, "
     "so that reducing one piece overlaps the writes of the next",
     FIELD(coll_piece), &parser_uint, 4096, 1u << 30},
    {"TFAB_COLL_EAGER", "960",
     "A collective's operand of at most this many bytes travels in a control message (eager: "
     "no request, no verdict), a larger one as a tensor; 0 sends every one as a tensor. Every "
     "rank of a world must have the same value",
     FIELD(coll_eager), &parser_uint, 0, 960},
    {"TFAB_COLL_SHM", "4096",
     "Where every rank of a world is on this host (native shm), a direct allreduce of at most "
     "this many bytes goes through shared segments that every rank maps, not messages; 0 "
     "turns that off. Every rank of a world must have the same value",
     FIELD(coll_shm), &parser_uint, 0, 65536},
    {"TFAB_OFI_DOMAIN", "",
     "libfabric domain (interface) to open, such as lo or eth0 (shm has none); empty takes "
     "libfabric's first",
     FIELD(ofi_domain), &parser_string, 0, 0},
    {"TFAB_OFI_CQ_SIZE", "4096", "libfabric completion queue depth, in entries", FIELD(ofi_cq_size),
     &parser_uint, 16, 1u << 20},
    {"TFAB_OFI_RX_DEPTH", "512",
     "Receives kept posted for remote writes on providers that need them (FI_RX_CQ_DATA mode)",
     FIELD(ofi_rx_depth), &parser_uint, 1, 65536},
    {"TFAB_OFI_POLL_BATCH", "32", "Completions read from the libfabric queue per call",
     FIELD(ofi_poll_batch), &parser_uint, 1, 1024},
    {"TFAB_VERBS_DEVICE", "",
     "RDMA device for the verbs backend, such as mlx5_0 or rxe0; empty takes the first with an "
     "active port",
     FIELD(verbs_device), &parser_string, 0, 0},
    {"TFAB_VERBS_PORT", "auto", "Port of the verbs device: auto (the first active one) or a number",
     FIELD(verbs_port), &parser_auto_uint, 1, 255},
    {"TFAB_VERBS_GID_INDEX", "auto",
     "GID table index for verbs: auto (on RoCE a RoCE v2 GID with an IPv4-mapped address "
     "first; on InfiniBand 0) or a number",
     FIELD(verbs_gid_index), &parser_auto_uint, 0, 255},
    {"TFAB_VERBS_SQ_DEPTH", "256", "Send work requests per verbs queue pair (writes in flight)",
     FIELD(verbs_sq_depth), &parser_uint, 16, 32768},
    {"TFAB_VERBS_RQ_DEPTH", "1024",
     "Receives kept posted in the verbs shared receive queue (each remote write uses one)",
     FIELD(verbs_rq_depth), &parser_uint, 16, 65536},
    {"TFAB_VERBS_CQ_DEPTH", "8192", "verbs completion queue depth, in entries",
     FIELD(verbs_cq_depth), &parser_uint, 256, 1u << 20},
    {"TFAB_VERBS_INLINE", "256",
     "Largest verbs write sent inline (IBV_SEND_INLINE; also TFAB_WRITE_INJECT's limit), capped "
     "by the device; 0 sends nothing inline",
     FIELD(verbs_inline), &parser_uint, 0, 256},
    {"TFAB_VERBS_SIGNAL_EVERY", "32",
     "Unsignalled injected writes in a row before one is signalled to free send queue slots",
     FIELD(verbs_signal_every), &parser_uint, 1, 4096},
    {"TFAB_VERBS_TIMEOUT", "14",
     "verbs local ACK timeout exponent: 4.096 us * 2^N before a retransmission (0 waits "
     "forever)",
     FIELD(verbs_timeout), &parser_uint, 0, 31},
    {"TFAB_VERBS_RETRY_CNT", "6",
     "verbs retransmissions after an ACK timeout before the peer is declared lost (rxe takes 7 "
     "as without limit)",
     FIELD(verbs_retry_cnt), &parser_uint, 0, 7},
    {"TFAB_VERBS_RNR_RETRY", "7",
     "verbs retries when the target has no receive posted (7: without limit)",
     FIELD(verbs_rnr_retry), &parser_uint, 0, 7},
    {"TFAB_VERBS_CQ_EVENTS", "0",
     "0 busy-polls the verbs completion queue; 1 also arms it on a completion channel and reads "
     "its events without blocking",
     FIELD(verbs_cq_events), &parser_uint, 0, 1},
    {"TFAB_RING_SLOTS", "64", "Control message slots per peer and direction (the credit window)",
     FIELD(ring_slots), &parser_uint, 2, 1024},
    {"TFAB_PROGRESS_THREAD", "0",
     "1 starts a progress thread per context; 0 leaves progress to tfab_progress() and blocking "
     "receives",
     FIELD(progress_thread), &parser_uint, 0, 1},
    {"TFAB_SPIN_US", "10000",
     "Microseconds a blocking receive keeps polling without a pause after its last poll that "
     "found work; past them each poll that finds nothing gives the core up for 20 us. The "
     "default, 10 ms, frees the core in longer waits; 0 pauses at once (least CPU); "
     "3600000000 (an hour) never pauses in practice (least latency, a core while it waits)",
     FIELD(spin_us), &parser_uint, 0, 3600000000u},
    {"TFAB_PROGRESS_SPIN_US", "0",
     "The same for the progress thread (TFAB_PROGRESS_THREAD=1): microseconds it keeps "
     "polling without a pause after a poll that found work; 0 pauses at every idle poll",
     FIELD(progress_spin_us), &parser_uint, 0, 3600000000u},
    {"TFAB_CTRL_BATCH", "1",
     "1 lets a control write carry several messages (those queued for credit, the TAKEN "
     "indexes waiting) and the credits due, except to peers on libfabric sockets, which it "
     "can stall (doc/design.md); 0 writes each message alone and credits apart",
     FIELD(ctrl_batch), &parser_uint, 0, 1},
    {"TFAB_KEY_INDEX", "1",
     "1 names a key whose meta-data the receiver caches by a 32-bit index in its requests after "
     "the first (the key travels once); 0 sends the whole key in every request",
     FIELD(key_index), &parser_uint, 0, 1},
    {"TFAB_STRINGS_HEADROOM", "25",
     "Percent of room a string tensor's receive asks for beyond the size the key had last: a "
     "tensor that grew within it is written at once, one that outgrew it costs a META_DATA "
     "round trip",
     FIELD(strings_headroom), &parser_uint, 0, 1000},
    {"TFAB_STRING_MAX_BYTES", "268435456",
     "The most memory a received string tensor may take decoded: its TensorProto as parsed "
     "(the strings stay in it; protobuf-c's scratch while it parses counts too) and an entry "
     "of 16 bytes per element. A few bytes can claim "
     "millions of elements that repeat the last string; a claim past this is refused with "
     "EMSGSIZE before anything is allocated for it, and the error names this setting",
     FIELD(string_max_bytes), &parser_size, 4096, 1ul << 40},
    {"TFAB_EMPTY_WRITE", "1",
     "1 answers a request for an empty or dead tensor whose meta-data the receiver has cached "
     "with a zero-byte write; 0 with a META_DATA message, as for a changed tensor",
     FIELD(empty_write), &parser_uint, 0, 1},
    {"TFAB_NO_REQUEST", "0",
     "No-request mode for every key (tfab_recv_ahead sets it per key): a receive of step N "
     "whose meta-data is cached, into a library tensor, keeps requests standing for steps N+1 "
     "to N+this many, so the sender writes each at once; 0 requests each step when it is received",
     FIELD(no_request), &parser_uint, 0, 1024},
    {"TFAB_NO_REQUEST_TAKEN_US", "200",
     "Microseconds at most that the verdict (TAKEN) of a receive posted ahead waits for a "
     "control write to ride on: the sender's completion of such a send can lag by this much",
     FIELD(ahead_taken_us), &parser_uint, 0, 1000000},
    {"TFAB_META_CACHE_ENTRIES", "65536",
     "Keys whose meta-data a context keeps (all peers together) before the least recently used "
     "go; a key that went costs its next receive a META_DATA round trip",
     FIELD(meta_cache_entries), &parser_uint, 1, 1u << 26},
    {"TFAB_MR_CACHE_ENTRIES", "4096",
     "Registrations of caller buffers kept for reuse before the least recently used go",
     FIELD(mr_cache_entries), &parser_uint, 16, 1u << 24},
    {"TFAB_POOL_CACHE", "268435456", "Bytes of free, registered destination blocks the pool keeps",
     FIELD(pool_cache), &parser_uint, 0, 4095u << 20},
    {"TFAB_CUDA_CHUNK", "4194304",
     "Bytes per chunk of a GPU tensor staged through host memory: each chunk's copy overlaps "
     "the write of the one before",
     FIELD(cuda_chunk), &parser_uint, 4096, 1u << 30},
    {"TFAB_CUDA_EMULATE", "0",
     "Tests only: 1 takes CUDA tensors as host memory, to run the GPU proxy path without a GPU",
     FIELD(cuda_emulate), &parser_uint, 0, 1},
    {"TFAB_PEER_MAX_INFLIGHT", "auto",
     "Bytes of library-allocated destinations that the requests to one peer may hold at once "
     "(the peer's meta-data sizes them): a receive past it fails with EMSGSIZE and says why; "
     "auto is half this machine's memory, 0 no limit. Tensors the caller provides do not count",
     FIELD(peer_max_inflight), &parser_bytes, 0, 0},
    {"TFAB_AUTH_KEY", "",
     "A shared secret of at least 16 bytes: peers prove they hold it (HMAC-SHA256) before "
     "anything else is exchanged, and one without it is refused (doc/security.md); shown as "
     "(set)",
     FIELD(auth_key), &parser_secret, 16, 0},
    {"TFAB_AUTH_KEY_FILE", "",
     "A file holding the shared secret instead (its bytes, less one trailing newline); "
     "keeps it out of the environment of child processes",
     FIELD(auth_key_file), &parser_string, 0, 0},
};

#define TABLE_LEN (sizeof(table) / sizeof(table[0]))

/*
 * Launchers' names for the world's settings, read where the TFAB_* variable is not set, first
 * found wins: torchrun's, then Open MPI's. Each setting records the variable it came from.
 */
static const struct launcher_alias {
	const char *name;    /* the setting */
	const char *also[3]; /* the launchers' names for it, in order, NULL-terminated */
	size_t from;	     /* offset of the const char * that names its source */
} aliases[] = {
    {"TFAB_RANK", {"RANK", "OMPI_COMM_WORLD_RANK"}, offsetof(struct tfab_config, rank_from)},
    {"TFAB_WORLD_SIZE",
     {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"},
     offsetof(struct tfab_config, world_size_from)},
    {"TFAB_LOCAL_RANK",
     {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"},
     offsetof(struct tfab_config, local_rank_from)},
    {"TFAB_LOCAL_WORLD_SIZE",
     {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"},
     offsetof(struct tfab_config, local_world_size_from)},
    {"TFAB_MASTER_ADDR", {"MASTER_ADDR"}, offsetof(struct tfab_config, master_addr_from)},
    /* MASTER_PORT is no name for it: torch's store listens there (torch_port) */
    {"TFAB_MASTER_PORT", {NULL}, offsetof(struct tfab_config, master_port_from)},
};

#define TORCH_PORT "MASTER_PORT"
/* Where a setting came from when the application gave it to the context. */
static const char GIVEN[] = "the context's settings";

static const struct launcher_alias *alias_of(const char *name)
{
	for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++)
		if (strcmp(aliases[i].name, name) == 0)
			return &aliases[i];
	return NULL;
}

/* The value of e in the environment and the variable it is in: e's, else a launcher's. */
static const char *env_value(const struct tfab_config_entry *e, const char **var_p)
{
	const struct launcher_alias *a = alias_of(e->name);
	const char *v = getenv(e->name);

	*var_p = e->name;
	for (size_t i = 0; !v && a && i < sizeof(a->also) / sizeof(a->also[0]) && a->also[i]; i++) {
		v = getenv(a->also[i]);
		*var_p = a->also[i];
	}
	return v;
}

static void set_from(struct tfab_config *cfg, const struct tfab_config_entry *e, const char *var)
{
	const struct launcher_alias *a = alias_of(e->name);

	if (a)
		memcpy((char *)cfg + a->from, &var, sizeof(var));
}

/*
 * TFAB_* variables that are no setting of the library but that other parts of the project
 * read: its test suites', benchmarks' and test VM's. The warning about unknown variables
 * leaves them alone, and every TFAB_TEST_* variable too (the tests' own knobs).
 */
static const char *const not_settings[] = {
    "TFAB_FAULTS_SLACK_MS", "TFAB_FAULTS_RDMA_ADDR", "TFAB_PY_LOOP",	"TFAB_FUZZ_SECONDS",
    "TFAB_VM_KERNEL_DEB",   "TFAB_VM_EXTRA_ENV",     "TFAB_VM_RUN_DIR",
};
#define TEST_PREFIX "TFAB_TEST_"

const struct tfab_config_entry *tfab__config_table(size_t *count_p)
{
	*count_p = TABLE_LEN;
	return table;
}

const struct tfab_config_entry *tfab__config_find(const char *name)
{
	for (size_t i = 0; i < TABLE_LEN; i++)
		if (strcmp(table[i].name, name) == 0)
			return &table[i];
	return NULL;
}

/* Why e refused a value, its parser having said rc: "out of range (1..3600000)". */
static void entry_why(const struct tfab_config_entry *e, int rc, char *why, size_t len)
{
	if (rc == -ERANGE)
		snprintf(why, len, "out of range (%lu..%lu)", e->min, e->max);
	else if (rc == -ENAMETOOLONG)
		snprintf(why, len, "longer than %zu bytes", e->size - 1);
	else if (rc == -EKEYREJECTED)
		snprintf(why, len, "shorter than %lu bytes, the least a key may be", e->min);
	else
		snprintf(why, len, "not a valid %s value: %s", e->parser->kind, tfab_strerror(rc));
}

/* Set e from value, which came from the variable var (NULL: e's own name). */
static int entry_set(struct tfab_config *cfg, const struct tfab_config_entry *e, const char *var,
		     const char *value, char *errbuf, size_t errlen)
{
	int rc = e->parser->parse(value, (char *)cfg + e->offset, e->size, e->min, e->max);
	char why[128];

	if (rc == 0)
		return 0;
	if (errbuf && errlen) {
		if (rc == -EKEYREJECTED) { /* a secret: its length, never its value */
			snprintf(errbuf, errlen, "%s holds %zu bytes: a key needs at least %lu",
				 var ? var : e->name, strlen(value), e->min);
		} else {
			entry_why(e, rc, why, sizeof(why));
			/* a secret never goes into a message, not even a wrong one */
			snprintf(errbuf, errlen, "%s=%s is %s", var ? var : e->name,
				 tfab__config_secret(e) ? "(set)" : value, why);
		}
	}
	return -TFAB_ERR_CONFIG;
}

bool tfab__config_invalid(const struct tfab_config_entry *e, const char *value, char *why,
			  size_t len)
{
	struct tfab_config scratch;
	enum tfab_log_level level;
	int rc;

	/* A level that is none is warn (its parser takes anything, util/log.c says so) */
	if (e->parser == &parser_level) {
		if (tfab__log_level_parse(value, &level) == 0)
			return false;
		snprintf(why, len, "not a level: none, error, warn, info, debug, trace or 0..5");
		return true;
	}
	rc = e->parser->parse(value, (char *)&scratch + e->offset, e->size, e->min, e->max);
	if (rc == 0)
		return false;
	entry_why(e, rc, why, len);
	return true;
}

/* The edit distance of a and b (at most 63 bytes each are compared), letters in any case. */
static unsigned distance(const char *a, const char *b)
{
	unsigned row[64], n = (unsigned)strnlen(b, 63), m = (unsigned)strnlen(a, 63);

	for (unsigned j = 0; j <= n; j++)
		row[j] = j;
	for (unsigned i = 1; i <= m; i++) {
		unsigned diag = row[0];

		row[0] = i;
		for (unsigned j = 1; j <= n; j++) {
			unsigned up = row[j], cost = toupper((unsigned char)a[i - 1]) !=
						     toupper((unsigned char)b[j - 1]);
			unsigned best = diag + cost;

			if (up + 1 < best)
				best = up + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			diag = up;
			row[j] = best;
		}
	}
	return row[n];
}

/* Whether name (up to its '=' or end) is a setting, or a variable of the project's own. */
static bool known(const char *name, size_t len)
{
	for (size_t i = 0; i < TABLE_LEN; i++)
		if (strlen(table[i].name) == len && strncmp(table[i].name, name, len) == 0)
			return true;
	for (size_t i = 0; i < sizeof(not_settings) / sizeof(not_settings[0]); i++)
		if (strlen(not_settings[i]) == len && strncmp(not_settings[i], name, len) == 0)
			return true;
	return len > strlen(TEST_PREFIX) && strncmp(name, TEST_PREFIX, strlen(TEST_PREFIX)) == 0;
}

unsigned tfab__config_warn_unknown(char *const *env)
{
	unsigned n = 0;

	for (; env && *env; env++) {
		const char *eq = strchr(*env, '='), *close = NULL;
		char name[64];
		size_t len;
		unsigned best = ~0u;

		if (!eq || strncasecmp(*env, "TFAB_", 5) != 0)
			continue;
		len = (size_t)(eq - *env);
		if (known(*env, len))
			continue;
		snprintf(name, sizeof(name), "%.*s", (int)(len < 63 ? len : 63), *env);
		/* the nearest setting, if a slip of a few letters away */
		for (size_t i = 0; i < TABLE_LEN; i++) {
			unsigned d = distance(name, table[i].name);

			if (d < best) {
				best = d;
				close = table[i].name;
			}
		}
		if (best > 3 || 3 * best > strlen(name) - 5)
			close = NULL;
		TFAB_WARN("config", "%s is not a tfab setting: ignored%s%s%s", name,
			  close ? " (did you mean " : " (tfab-info lists the settings)",
			  close ? close : "", close ? "?)" : "");
		n++;
	}
	return n;
}

int tfab__config_set(struct tfab_config *cfg, const char *name, const char *value, char *errbuf,
		     size_t errlen)
{
	const struct tfab_config_entry *e = tfab__config_find(name);
	int rc;

	if (!e) {
		if (errbuf && errlen)
			snprintf(errbuf, errlen, "%s is not a tfab setting", name);
		return -ENOENT;
	}
	rc = entry_set(cfg, e, NULL, value, errbuf, errlen);
	if (rc == 0)
		set_from(cfg, e, GIVEN);
	return rc;
}

int tfab__config_init(struct tfab_config *cfg, char *errbuf, size_t errlen)
{
	return tfab__config_init_with(cfg, NULL, NULL, 0, errbuf, errlen);
}

int tfab__config_init_with(struct tfab_config *cfg, const char *const *names,
			   const char *const *values, size_t n, char *errbuf, size_t errlen)
{
	static atomic_flag warned = ATOMIC_FLAG_INIT;
	int first_rc = 0;

	/* Once a process, at the first read: a misspelt variable is otherwise silently ignored. */
	if (!atomic_flag_test_and_set(&warned))
		tfab__config_warn_unknown(environ);
	memset(cfg, 0, sizeof(*cfg));
	for (size_t i = 0; i < TABLE_LEN; i++) {
		/* The defaults are ours; one that does not parse is a bug caught by the tests. */
		if (entry_set(cfg, &table[i], NULL, table[i].dflt, NULL, 0) != 0)
			abort();
	}
	for (size_t i = 0; i < TABLE_LEN; i++) {
		const char *var, *env = env_value(&table[i], &var);
		int rc;

		if (!env)
			continue;
		rc = entry_set(cfg, &table[i], var, env, first_rc ? NULL : errbuf,
			       first_rc ? 0 : errlen);
		if (rc && !first_rc)
			first_rc = rc;
		if (rc)
			entry_set(cfg, &table[i], NULL, table[i].dflt, NULL, 0);
		else
			set_from(cfg, &table[i], var);
	}
	/* torch's port is never the world's: the join refuses it rather than guess another */
	if (!cfg->master_port_from && getenv(TORCH_PORT))
		snprintf(cfg->torch_port, sizeof(cfg->torch_port), "%s", getenv(TORCH_PORT));
	/* Explicit settings last: they win over the environment (and over torch's port). */
	for (size_t i = 0; i < n; i++) {
		int rc = -TFAB_ERR_CONFIG;

		if (!names || !values || !names[i] || !values[i]) {
			if (!first_rc && errbuf && errlen)
				snprintf(errbuf, errlen, "setting %zu has no name or no value", i);
		} else {
			rc = tfab__config_set(cfg, names[i], values[i], first_rc ? NULL : errbuf,
					      first_rc ? 0 : errlen);
			if (rc == -ENOENT)
				rc = -TFAB_ERR_CONFIG;
		}
		if (rc && !first_rc)
			first_rc = rc;
	}
	if (cfg->master_port_from == GIVEN)
		cfg->torch_port[0] = '\0';
	return first_rc;
}

void tfab__config_format(const struct tfab_config *cfg, const struct tfab_config_entry *e,
			 char *buf, size_t len)
{
	e->parser->format((const char *)cfg + e->offset, buf, len);
}

/* Public introspection. */

size_t tfab_setting_count(void)
{
	return TABLE_LEN;
}

int tfab_setting_get(size_t i, struct tfab_setting_info *info_p)
{
	if (i >= TABLE_LEN)
		return -EINVAL;
	info_p->name = table[i].name;
	info_p->dflt = table[i].dflt;
	info_p->help = table[i].help;
	info_p->value = getenv(table[i].name);
	return 0;
}

int tfab_settings_check(char *errbuf, size_t errlen)
{
	struct tfab_config cfg;

	return tfab__config_init(&cfg, errbuf, errlen);
}
