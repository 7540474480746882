/*
 * The CPython binding's shared declarations: the objects (Context, Peer, Tensor, World), the
 * error raising and the DLPack helpers that the module's files share.
 */
#ifndef TFAB_PYTHON_TFABPY_H
#define TFAB_PYTHON_TFABPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdatomic.h>
#include <stdbool.h>

#include <tfab/tfab.h>
#include <tfab/world.h>

struct tfabpy_world;

/*
 * How long a blocking call from Python waits inside the library at most before it takes the
 * GIL back to run the signal handlers (PyErr_CheckSignals: Ctrl-C), in milliseconds.
 */
#define TFABPY_SLICE_MS 100

/*
 * Operations in flight in the order they started (a send's, a collective's): a wait for those
 * started before it (flush, World.wait) is called in slices, and ends when none of them is
 * left, whatever started since. Under the GIL.
 */
struct tfabpy_link {
	struct tfabpy_link *prev, *next; /* NULL: not linked */
	uint64_t seq;
};

static inline void tfabpy_link_init(struct tfabpy_link *head)
{
	head->prev = head->next = head;
}

static inline void tfabpy_link_add(struct tfabpy_link *head, struct tfabpy_link *l, uint64_t seq)
{
	l->seq = seq;
	l->prev = head->prev;
	l->next = head;
	head->prev->next = l;
	head->prev = l;
}

static inline void tfabpy_link_del(struct tfabpy_link *l)
{
	if (!l->next)
		return;
	l->prev->next = l->next;
	l->next->prev = l->prev;
	l->prev = l->next = NULL;
}

/* Whether an operation of sequence number seq or below is still in flight. */
static inline bool tfabpy_link_pending(const struct tfabpy_link *head, uint64_t seq)
{
	return head->next != head && head->next->seq <= seq;
}

struct tfabpy_context {
	PyObject_HEAD struct tfab_context *ctx;
	/* close() was called: every later call fails; destroyed when the last user is gone. */
	bool closed;
	bool progress_thread;
	/* Calls inside the library with the GIL released, and received tensors alive. */
	long busy;
	long tensors;
	PyObject *weakrefs;
	/*
	 * The world joined on this context (one at most), until it is left; world_obj is the
	 * World that has it (borrowed), NULL when that one went inside a callback (then the
	 * context leaves it, at close or at the next join).
	 */
	struct tfab_world *world;
	struct tfabpy_world *world_obj;
	/* Sends in flight, for flush (sends_seq: the last one's number). */
	struct tfabpy_link sends;
	uint64_t sends_seq;
};

struct tfabpy_peer {
	PyObject_HEAD struct tfabpy_context *owner;
	struct tfab_peer *peer;
	PyObject *world; /* a world's peer: the World that owns it (it cannot be closed) */
};

/* A world of ranks on a context, and its collectives in flight. */
struct tfabpy_world {
	PyObject_HEAD struct tfabpy_context *owner;
	struct tfab_world *w; /* NULL once left */
	long inflight;	      /* collectives started that have not called back */
	long busy;	      /* calls inside the library with the GIL released */
	PyObject *weakrefs;
	struct tfabpy_link colls; /* those collectives, for wait (colls_seq: the last one's) */
	uint64_t colls_seq;
};

/* A received tensor: the library's DLManagedTensor, returned to the pool at the last view. */
struct tfabpy_tensor {
	PyObject_HEAD struct tfabpy_context *owner; /* NULL for a view of the caller's out= array */
	DLManagedTensor *m;
	PyObject *base; /* out=: the caller's array */
	PyObject *weakrefs;
};

extern PyTypeObject tfabpy_context_type;
extern PyTypeObject tfabpy_peer_type;
extern PyTypeObject tfabpy_tensor_type;
extern PyTypeObject tfabpy_world_type;
extern PyTypeObject tfabpy_future_type; /* FutureBase: tfab.Future's C half (future.c) */

/* Nonzero while this thread runs one of the binding's callbacks. */
extern _Thread_local int tfabpy_in_callback;
/*
 * Completions the callbacks made, from any thread: a wait that drives progress with the GIL
 * released looks at its future again once this moves (a collective may end inside a progress
 * call that reports no work done: the shm collectives' segments).
 */
extern atomic_ulong tfabpy_completions;

/* Raise tfab's exception for status (negative), with what the call was. NULL always. */
PyObject *tfabpy_raise(int status, const char *what);
/* Forget the last library error logged by this thread (before a call that may fail). */
void tfabpy_clear_last_error(void);
int tfabpy_errors_init(PyObject *module);
void tfabpy_log_init(void);

/* A Tensor owning m (a received tensor); steals m. NULL with an exception set on failure. */
PyObject *tfabpy_tensor_new(struct tfabpy_context *owner, DLManagedTensor *m, PyObject *base);

/*
 * Import obj's tensor through __dlpack__: *m_p gets its DLManagedTensor (the caller owns it:
 * call its deleter when done), the capsule marked used. dest NULL: a source, which may be
 * read-only; else a destination, named so in errors ("out="), which must be writable (a
 * ValueError otherwise: bytes, a read-only array or memoryview). -1 with an exception set.
 */
int tfabpy_dlpack_import(PyObject *obj, const char *dest, DLManagedTensor **m_p);
/* _tfab.copy_into(dst, src): src's bytes into dst, of the same dtype and shape, on the CPU. */
PyObject *tfabpy_copy_into(PyObject *self, PyObject *args);
/* Whether t is compact row-major (strides NULL or those of its shape). */
bool tfabpy_is_compact(const DLTensor *t);

/* The context is open; raises and returns false otherwise. */
bool tfabpy_context_usable(struct tfabpy_context *c);
/* After the library gave back a tensor of c's: once none are left, a closed c is destroyed. */
void tfabpy_context_tensor_gone(struct tfabpy_context *c);
/* A Peer object for a world's peer (owned by the world, not closable). */
PyObject *tfabpy_peer_of_world(struct tfabpy_context *c, struct tfab_peer *peer, PyObject *world);

/*
 * Before c's library context goes (close, dealloc): leave its world once its collectives have
 * ended (after an abort they end at once). Called with the GIL, which it releases to wait.
 */
void tfabpy_world_context_closing(struct tfabpy_context *c);

/* Whether o is a tfab.Future: a send's or receive's callback that future.c completes. */
static inline bool tfabpy_is_future(PyObject *o)
{
	return PyObject_TypeCheck(o, &tfabpy_future_type);
}
/* Complete fut with result (set_result, without a Python frame where nothing waits on it). */
int tfabpy_future_set(PyObject *fut, PyObject *result);
/* Fail fut with tfab's exception for status (negative), what naming the operation. */
int tfabpy_future_fail(PyObject *fut, int status, const char *what);
/* fut.done(), for a tfab.Future. */
bool tfabpy_future_done(PyObject *fut);
int tfabpy_future_init(PyObject *module);
/*
 * Drive c's progress with the GIL released until fut is done or timeout seconds (negative:
 * no limit) pass, yield_idle yielding the core on idle polls: 1 when done, 0 when not, -1
 * with an exception set.
 */
int tfabpy_progress_wait(struct tfabpy_context *c, PyObject *fut, double timeout, int yield_idle);

/* Monotonic nanoseconds. */
uint64_t tfabpy_now_ns(void);
/*
 * The deadline of a timeout of s seconds (< 0: none, UINT64_MAX), and the milliseconds left
 * to it for the next call into the library: at most TFABPY_SLICE_MS.
 */
uint64_t tfabpy_deadline(double s);
int tfabpy_slice_ms(uint64_t deadline);

/*
 * A timeout argument in seconds: a number >= 0 (*s_p), or None (*s_p = -1); NaN, a negative
 * number or anything else raise (ValueError, TypeError) naming what was given. 0 or -1.
 */
int tfabpy_timeout_seconds(PyObject *obj, double *s_p);
/* The same as milliseconds (None: none_ms; long ones capped at INT_MAX / 2). */
int tfabpy_timeout_ms(PyObject *obj, int none_ms, int *ms_p);
/* A step from Python: >= 0 (the library's negative steps are its own); ValueError else. */
int tfabpy_step_arg(long long step);

#endif
