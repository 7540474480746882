/*
 * The CPython binding's shared declarations: the objects (Context, Peer, Tensor, World), the
 * error raising and the DLPack helpers that the module's files share.
 */
#ifndef TFAB_PYTHON_TFABPY_H
#define TFAB_PYTHON_TFABPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>

#include <tfab/tfab.h>
#include <tfab/world.h>

struct tfabpy_world;

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
/* A dtype's name as users write it ("int8", "bfloat16"; else "dlpack(code,bits,lanes)"). */
const char *tfabpy_dtype_name(DLDataType d, char *buf, size_t len);
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
