/*
 * The world tests' ranks as threads of one process (world_rank.c, test_coll.c): each has a
 * context of its own and joins through an allgather of the threads'.
 */
#ifndef TFAB_TEST_WORLD_RANKS_H
#define TFAB_TEST_WORLD_RANKS_H

#include <tfab/tfab.h>

/* A rank's work once joined: 0 if all went right. */
typedef int (*rank_body_fn)(struct tfab_context *ctx, struct tfab_world *w, void *arg);

/*
 * Runs n ranks as threads, each joining a world of n ("/job:worker/task:R") within
 * timeout_ms, then body; prints JOIN_FAILED status=<name> for a join that fails. 0 if every
 * rank joined and its body returned 0.
 */
int ranks_run_threads(int n, int timeout_ms, rank_body_fn body, void *arg);

/* TFAB_ERR_* names for the statuses the tests expect, else tfab_strerror's text. */
const char *ranks_status_name(int status);

#endif
