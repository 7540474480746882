/*
 * The configuration table: one declarative row per TFAB_* setting (name, default, help, field
 * offset, parser). tfab__config_init() fills a struct tfab_config from the defaults and then
 * the environment, once, when a context (or a tool) starts.
 */
#ifndef TFAB_UTIL_CONFIG_H
#define TFAB_UTIL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct tfab_config {
	char provider[64];	       /* TFAB_PROVIDER */
	int log_level;		       /* TFAB_LOG_LEVEL */
	unsigned connect_timeout_ms;   /* TFAB_CONNECT_TIMEOUT_MS */
	unsigned handshake_timeout_ms; /* TFAB_HANDSHAKE_TIMEOUT_MS */
	unsigned op_timeout_ms;	       /* TFAB_OP_TIMEOUT_MS, 0 for none */
	unsigned heartbeat_ms;	       /* TFAB_HEARTBEAT_MS, 0 for none */
	/* A world (lib/world/world.c): a torchrun-style environment, "" where unset */
	char rank[16];	     /* TFAB_RANK, RANK, OMPI_COMM_WORLD_RANK */
	char world_size[16]; /* TFAB_WORLD_SIZE, WORLD_SIZE, OMPI_COMM_WORLD_SIZE */
	char local_rank[16]; /* TFAB_LOCAL_RANK, LOCAL_RANK, OMPI_..._LOCAL_RANK */
	char
	    local_world_size[16]; /* TFAB_LOCAL_WORLD_SIZE, LOCAL_WORLD_SIZE, OMPI_..._LOCAL_SIZE */
	char master_addr[256];	  /* TFAB_MASTER_ADDR, MASTER_ADDR */
	unsigned master_port;	  /* TFAB_MASTER_PORT */
	/*
	 * MASTER_PORT where TFAB_MASTER_PORT is not given: torch's store listens there (torchrun's
	 * or init_process_group's), so it is never the world's; "" where unset.
	 */
	char torch_port[16];
	/* Where the launcher settings above came from: the variable read, NULL for the default. */
	const char *rank_from, *world_size_from, *local_rank_from, *local_world_size_from;
	const char *master_addr_from, *master_port_from;
	char world_name[256];	   /* TFAB_WORLD_NAME */
	char world_host[256];	   /* TFAB_WORLD_HOST */
	unsigned world_timeout_ms; /* TFAB_WORLD_TIMEOUT_MS */
	unsigned allreduce_small;  /* TFAB_ALLREDUCE_SMALL: the direct algorithm's bound */
	unsigned coll_piece;	   /* TFAB_COLL_PIECE: bytes per write of a collective */
	unsigned coll_eager;	   /* TFAB_COLL_EAGER: most bytes of an operand in a message */
	unsigned coll_shm;	   /* TFAB_COLL_SHM: most bytes of an allreduce through segments */
	char ofi_domain[64];	   /* TFAB_OFI_DOMAIN */
	unsigned ofi_cq_size;	   /* TFAB_OFI_CQ_SIZE */
	unsigned ofi_rx_depth;	   /* TFAB_OFI_RX_DEPTH */
	unsigned ofi_poll_batch;   /* TFAB_OFI_POLL_BATCH */
	char verbs_device[64];	   /* TFAB_VERBS_DEVICE */
	int verbs_port;		   /* TFAB_VERBS_PORT, -1 for auto */
	int verbs_gid_index;	   /* TFAB_VERBS_GID_INDEX, -1 for auto */
	unsigned verbs_sq_depth;   /* TFAB_VERBS_SQ_DEPTH */
	unsigned verbs_rq_depth;   /* TFAB_VERBS_RQ_DEPTH */
	unsigned verbs_cq_depth;   /* TFAB_VERBS_CQ_DEPTH */
	unsigned verbs_inline;	   /* TFAB_VERBS_INLINE */
	unsigned verbs_signal_every; /* TFAB_VERBS_SIGNAL_EVERY */
	unsigned verbs_timeout;	     /* TFAB_VERBS_TIMEOUT */
	unsigned verbs_retry_cnt;    /* TFAB_VERBS_RETRY_CNT */
	unsigned verbs_rnr_retry;    /* TFAB_VERBS_RNR_RETRY */
	unsigned verbs_cq_events;    /* TFAB_VERBS_CQ_EVENTS */
	unsigned ring_slots;	     /* TFAB_RING_SLOTS */
	unsigned progress_thread;    /* TFAB_PROGRESS_THREAD */
	unsigned spin_us;	     /* TFAB_SPIN_US */
	unsigned progress_spin_us;   /* TFAB_PROGRESS_SPIN_US */
	unsigned ctrl_batch;	     /* TFAB_CTRL_BATCH */
	unsigned key_index;	     /* TFAB_KEY_INDEX */
	unsigned strings_headroom;   /* TFAB_STRINGS_HEADROOM */
	uint64_t string_max_bytes;   /* TFAB_STRING_MAX_BYTES */
	unsigned empty_write;	     /* TFAB_EMPTY_WRITE */
	unsigned no_request;	     /* TFAB_NO_REQUEST */
	unsigned ahead_taken_us;     /* TFAB_NO_REQUEST_TAKEN_US */
	unsigned meta_cache_entries; /* TFAB_META_CACHE_ENTRIES */
	unsigned mr_cache_entries;   /* TFAB_MR_CACHE_ENTRIES */
	unsigned pool_cache;	     /* TFAB_POOL_CACHE */
	unsigned cuda_chunk;	     /* TFAB_CUDA_CHUNK */
	unsigned cuda_emulate;	     /* TFAB_CUDA_EMULATE */
	uint64_t peer_max_inflight;  /* TFAB_PEER_MAX_INFLIGHT: UINT64_MAX auto, 0 none */
	char auth_key[256];	     /* TFAB_AUTH_KEY (a secret: formatted as "(set)") */
	char auth_key_file[256];     /* TFAB_AUTH_KEY_FILE */
};

struct tfab_config_parser {
	const char *kind; /* "string", "uint", "auto|uint", "level", "secret" */
	int (*parse)(const char *text, void *field, size_t size, unsigned long min,
		     unsigned long max);
	void (*format)(const void *field, char *buf, size_t len);
};

struct tfab_config_entry {
	const char *name;
	const char *dflt;
	const char *help;
	size_t offset;
	size_t size;
	const struct tfab_config_parser *parser;
	unsigned long min, max; /* bounds for numbers */
};

/*
 * An unsigned number with an optional binary suffix: "64", "4K", "1M", "2G", "0x100".
 * Returns 0, -EINVAL or -ERANGE.
 */
int tfab__parse_size(const char *text, uint64_t *value_p);

/* The table and its length. */
const struct tfab_config_entry *tfab__config_table(size_t *count_p);

/* Find a row by variable name; NULL when there is none. */
const struct tfab_config_entry *tfab__config_find(const char *name);

/*
 * Defaults, then the environment. Returns 0, or -TFAB_ERR_CONFIG naming the bad variable in
 * errbuf; cfg then holds defaults for everything that failed.
 */
int tfab__config_init(struct tfab_config *cfg, char *errbuf, size_t errlen);

/*
 * Defaults, then the environment, then n explicit settings (names[i] = values[i]) over both.
 * Returns 0, or -TFAB_ERR_CONFIG naming the first bad variable or unknown name in errbuf.
 */
int tfab__config_init_with(struct tfab_config *cfg, const char *const *names,
			   const char *const *values, size_t n, char *errbuf, size_t errlen);

/* Set one field from text; returns 0, -ENOENT for an unknown name, or -TFAB_ERR_CONFIG. */
int tfab__config_set(struct tfab_config *cfg, const char *name, const char *value, char *errbuf,
		     size_t errlen);

/* A secret's value is never shown (TFAB_AUTH_KEY): whether e is one. */
static inline bool tfab__config_secret(const struct tfab_config_entry *e)
{
	return strcmp(e->parser->kind, "secret") == 0;
}

/*
 * Whether value is one that e's setting refuses, so that the default stands in its place: true
 * with the reason in why ("out of range (1..3600000)"). Nothing is set.
 */
bool tfab__config_invalid(const struct tfab_config_entry *e, const char *value, char *why,
			  size_t len);

/*
 * Warn about each TFAB_* variable of env (as environ: "NAME=value", NULL-terminated; the prefix
 * in any case) that is no setting, naming it and the setting it is a slip of a few letters
 * from, if one is. Variables of the project's own (its tests', benchmarks') are known. Returns
 * how many. tfab__config_init does this once a process, at the first read.
 */
unsigned tfab__config_warn_unknown(char *const *env);

/* The current value of a field as text. */
void tfab__config_format(const struct tfab_config *cfg, const struct tfab_config_entry *e,
			 char *buf, size_t len);

#endif
