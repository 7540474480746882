/*
 * Helpers for the engine's scenarios between processes (engine_common.c): tensors over caller
 * memory, completion records and their callbacks, captured log lines, waits, and contexts of
 * a scenario's own.
 */
#ifndef TFAB_TEST_ENGINE_TEST_H
#define TFAB_TEST_ENGINE_TEST_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mp.h"

/* A bound on waits for one event: the stall bound (mp.h). */
#define WAIT_MS mp_stall_ms()

/* A compact row-major tensor over caller memory. */
struct tensor {
	DLTensor dl;
	int64_t shape[4];
	uint8_t *buf;
	size_t nbytes;
};

extern const DLDataType f32;

void tensor_make(struct tensor *t, DLDataType dtype, int ndim, const int64_t *shape);
void tensor_fill(struct tensor *t, uint64_t seed);
/* Whether n bytes at p are what tensor_fill writes from seed. */
bool bytes_match(const void *p, size_t n, uint64_t seed);
void tensor_free(struct tensor *t);
/* A one-element int32 tensor over v (shape: one). */
DLTensor int32_scalar(int32_t *v, int64_t *one);

/* Completion records: n is written last, with release, and read with acquire. */
struct done {
	int n;
	volatile int errors;
	int last_status;
	DLManagedTensor *tensor;
	bool is_dead;
};

void on_sent(void *arg, int status);
/* Keeps the last tensor in d->tensor, giving back the one before. */
void on_recv(void *arg, int status, DLManagedTensor *t, bool is_dead);
/* A completion counted, its tensor (if any) given back at once. */
void on_recv_drop(void *arg, int status, DLManagedTensor *t, bool is_dead);
int done_n(struct done *d);
/* Drive progress until d counts n completions; 0 once nothing progressed for the bound. */
int wait_n(struct mp *mp, struct done *d, int n);
/* Progress ctx until d has n completions; false when nothing moves for the stall limit. */
bool wait_ctx(struct mp *mp, struct tfab_context *ctx, struct done *d, int n);

/* Log lines captured by a sink: level and text, the first LOG_LINES of them. */
enum { LOG_LINES = 4096 };
struct log_capture {
	pthread_mutex_t lock;
	int n;
	enum tfab_log_level level[LOG_LINES];
	char text[LOG_LINES][400];
};
extern struct log_capture logged;

/* The sink that fills logged (tfab_log_set_sink(capture, NULL)). */
void capture(void *arg, enum tfab_log_level level, const char *subsys, const char *msg);
/* How many captured lines at level (or any level: -1) hold all of the words given. */
int lines_with(int level, const char *a, const char *b, const char *c);

/* Milliseconds on the monotonic clock. */
uint64_t ms_now(void);

/* Receive one tensor synchronously into a library-allocated destination. */
int recv_one(struct mp *mp, int from, const char *key, int64_t step, DLManagedTensor **t_p,
	     bool *dead_p);

/*
 * A context made with some settings of its own: env is name, value pairs ending in NULL (a
 * NULL value unsets). The run's own values (the variant's) are restored after, so the
 * scenarios after this one still run the variant.
 */
int context_with(struct tfab_context **ctx_p, const char *const *env);

/*
 * Drive ctx (a context of the scenario's own) until rank 1 marks what: the receiver's verdicts
 * go out only while it drives progress.
 */
int progress_until_note(struct mp *mp, struct tfab_context *ctx, const char *what);

/* Send (key, step) of 32 floats from seed and wait until the receive took it. */
int send_one(struct mp *mp, struct tfab_context *ctx, const char *key, int64_t step, uint64_t seed);

/*
 * The end of a scenario on a pair of contexts of its own (rank 0 receives, rank 1 sends):
 * rank 0 stops writing to rank 1 before rank 1 closes, and closes only after it. libfabric
 * 1.17's rxm crashes a process that closes with a peer's writes unread
 * (test/verbs/known_crash.sh), which would turn the verbs run into a skip.
 */
int own_pair_end(struct mp *mp, struct tfab_context *ctx, struct tfab_peer *peer, const char *tag);

#endif
