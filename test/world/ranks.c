/* The world tests' ranks as threads of one process (ranks.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ranks.h"

const char *ranks_status_name(int status)
{
	switch (-status) {
	case TFAB_ERR_TIMEOUT:
		return "TFAB_ERR_TIMEOUT";
	case TFAB_ERR_PROTOCOL:
		return "TFAB_ERR_PROTOCOL";
	case TFAB_ERR_CONFIG:
		return "TFAB_ERR_CONFIG";
	case TFAB_ERR_PEER_FAILED:
		return "TFAB_ERR_PEER_FAILED";
	case TFAB_ERR_ABORTED:
		return "TFAB_ERR_ABORTED";
	default:
		return tfab_strerror(status);
	}
}

/* The threads' allgather: each writes its entry, waits for all, reads them all. */
#define GATHER_MAX 4096 /* room for each rank's entry */

struct gather {
	pthread_barrier_t in, out;
	unsigned char *buf;
};

struct rank_thread {
	struct gather *g;
	int rank, size, timeout_ms, rc;
	rank_body_fn body;
	void *arg;
	pthread_t thread;
};

static int allgather(const void *mine, void *all, size_t len, void *arg)
{
	struct rank_thread *t = arg;
	struct gather *g = t->g;

	if (len > GATHER_MAX)
		return -1; /* every thread says so: none waits at the barrier */
	memcpy(g->buf + (size_t)t->rank * GATHER_MAX, mine, len);
	pthread_barrier_wait(&g->in);
	for (int r = 0; r < t->size; r++)
		memcpy((unsigned char *)all + (size_t)r * len, g->buf + (size_t)r * GATHER_MAX,
		       len);
	pthread_barrier_wait(&g->out);
	return 0;
}

static void *thread_main(void *arg)
{
	struct rank_thread *t = arg;
	char name[64];
	struct tfab_world_args args = {.rank = t->rank,
				       .size = t->size,
				       .name = name,
				       .host = "127.0.0.1",
				       .timeout_ms = t->timeout_ms,
				       .allgather = allgather,
				       .allgather_arg = t};
	struct tfab_context *ctx;
	struct tfab_world *w;

	snprintf(name, sizeof(name), "/job:worker/task:%d", t->rank);
	t->rc = tfab_context_create(&ctx);
	if (t->rc) {
		printf("rank %d: no context: %s\n", t->rank, tfab_strerror(t->rc));
		return NULL;
	}
	t->rc = tfab_world_join(ctx, &args, &w);
	if (t->rc) {
		printf("JOIN_FAILED status=%s\n", ranks_status_name(t->rc));
	} else {
		t->rc = t->body(ctx, w, t->arg);
		if (tfab_world_leave(w)) {
			/* collectives still in flight use the context: leave both (a failed run) */
			t->rc = 1;
			return NULL;
		}
	}
	tfab_context_destroy(ctx);
	return NULL;
}

int ranks_run_threads(int n, int timeout_ms, rank_body_fn body, void *arg)
{
	struct gather g;
	struct rank_thread *t = calloc((size_t)n, sizeof(*t));
	int rc = 0;

	g.buf = calloc((size_t)n, GATHER_MAX);
	if (!t || !g.buf) {
		free(t);
		free(g.buf);
		return 1;
	}
	pthread_barrier_init(&g.in, NULL, (unsigned)n);
	pthread_barrier_init(&g.out, NULL, (unsigned)n);
	for (int i = 0; i < n; i++) {
		t[i] = (struct rank_thread){.g = &g,
					    .rank = i,
					    .size = n,
					    .timeout_ms = timeout_ms,
					    .body = body,
					    .arg = arg};
		pthread_create(&t[i].thread, NULL, thread_main, &t[i]);
	}
	for (int i = 0; i < n; i++) {
		pthread_join(t[i].thread, NULL);
		rc |= t[i].rc;
	}
	pthread_barrier_destroy(&g.in);
	pthread_barrier_destroy(&g.out);
	free(g.buf);
	free(t);
	return rc ? 1 : 0;
}
