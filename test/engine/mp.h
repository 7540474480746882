/*
 * Multi-process engine tests. A test binary runs as the coordinator (rank 0, under cmocka) and
 * re-executes itself for ranks 1..n-1 ("--rank R --port P --test NAME"), so every process starts
 * fresh: no fork after libfabric is initialised. Rank 0 listens; every other rank connects to
 * rank 0, and for more than two ranks the others connect to each other through rank 0's
 * listener... (see mp.c). A scenario is one function run by every rank with its peers.
 */
#ifndef TFAB_TEST_MP_H
#define TFAB_TEST_MP_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <tfab/tfab.h>

#include "test/common/named_provider.h"

#define MP_MAX_RANKS 8

struct mp {
	int rank, nranks;
	struct tfab_context *ctx;
	struct tfab_peer *peers[MP_MAX_RANKS]; /* peers[rank] is NULL */
	const char *test;
};

typedef int (*mp_fn)(struct mp *mp);

struct mp_scenario {
	const char *name;
	int nranks;
	mp_fn fn;
	bool no_barrier; /* the scenario breaks a peer or the context: no closing barrier */
	unsigned killed; /* ranks the scenario kills (1u << rank; SIGKILL is their success) */
	/* TFAB_PROVIDER of a rank's context, or NULL for the run's (NULL: every rank's). */
	const char *(*provider)(int rank);
	bool only_named; /* runs only where MP_ONLY names it (it needs its own environment) */
	/* TFAB_PROVIDER values (comma-separated) where it is a cmocka skip, and why */
	const char *not_on, *not_on_why;
};

/* A failed check in any rank: print where and return 1 from the scenario. */
#define CHECK(cond)                                                                               \
	do {                                                                                      \
		if (!(cond)) {                                                                    \
			fprintf(stderr, "rank %d: %s:%d: check failed: %s\n", mp->rank, __FILE__, \
				__LINE__, #cond);                                                 \
			return 1;                                                                 \
		}                                                                                 \
	} while (0)

#define CHECK_RC(expr, want)                                                                      \
	do {                                                                                      \
		int rc_ = (expr);                                                                 \
		if (rc_ != (want)) {                                                              \
			fprintf(stderr, "rank %d: %s:%d: %s gave %d (%s), wanted %d\n", mp->rank, \
				__FILE__, __LINE__, #expr, rc_, tfab_strerror(rc_), (int)(want)); \
			return 1;                                                                 \
		}                                                                                 \
	} while (0)

/*
 * The test binary's main: runs every scenario of the table as a cmocka test (rank 0), or one
 * rank of one scenario when started with --rank.
 */
int mp_main(int argc, char **argv, const struct mp_scenario *scenarios, int n);

/*
 * Every wait gives up when nothing has progressed for a stall bound, never after a total
 * time: a hang fails in seconds, a slow run that keeps progressing (sockets, sanitizers) does
 * not. The bound is TFAB_TEST_STALL_MS, 10 s by default, times 3 under ASan, 10 under TSan and
 * 20 under valgrind. Progress is what the wait counts moving, or any send or receive
 * completing in the context.
 */
int mp_stall_ms(void);

struct mp_watch {
	struct mp *mp;
	struct tfab_context *ctx;
	const char *what;
	long count;
	uint64_t completions, since_ms, next_ms;
	int stall_ms;
};

/* Start watching a wait for `what` on ctx (mp->ctx if NULL); count is its progress so far. */
void mp_watch_start(struct mp_watch *w, struct mp *mp, struct tfab_context *ctx, const char *what,
		    long count);
/* Whether the wait should give up: nothing has moved for the bound. It says so on stderr. */
bool mp_watch_stalled(struct mp_watch *w, long count);

/*
 * Drive progress until *flag becomes nonzero; returns the flag (0: it stalled). stall_ms
 * overrides the bound (0: mp_stall_ms()).
 */
int mp_wait_flag(struct mp *mp, const volatile int *flag, int stall_ms);

/* Drive progress until the counter (read with acquire) reaches want; whether it did. */
bool mp_wait_count(struct mp *mp, const int *count, int want, int stall_ms);

/*
 * Notes outside the fabric (files in the run's folder), for scenarios that break the fabric:
 * mp_note marks `what` done by this rank; mp_wait_note drives progress until rank marked it,
 * or -ETIMEDOUT once nothing has progressed here for the stall bound (stall_ms, 0: default).
 */
int mp_note(struct mp *mp, const char *what);
int mp_wait_note(struct mp *mp, int rank, const char *what, int stall_ms);
/* The same without driving progress: what the peer writes meanwhile stays unread. */
int mp_wait_note_quiet(struct mp *mp, int rank, const char *what, int stall_ms);
/* Whether rank has marked what, now: no wait, no progress. */
bool mp_noted(struct mp *mp, int rank, const char *what);

/* A number published by this rank outside the fabric (a port), and one read from rank's. */
int mp_put(struct mp *mp, const char *what, unsigned value);
int mp_get(struct mp *mp, int rank, const char *what, unsigned *value_p);

/* A barrier among all ranks through the fabric (a tensor per pair). 0 on success. */
int mp_barrier(struct mp *mp, int64_t tag);

#endif
