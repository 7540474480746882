/*
 * future.c: tfab._tfab.FutureBase, the C half of tfab.Future (tfab/__init__.py derives
 * Future from it and from concurrent.futures.Future, in that order).
 *
 * A fetch's future is made, completed and read once, mostly by one thread, and at 8 bytes
 * its Python frames cost more than the fetch. So those three steps run here, on fields of the
 * object rather than attributes in its dictionary: concurrent.futures.Future's own methods
 * reach the same fields as _state, _result, _exception (member descriptors, which come before
 * the instance dictionary). A send's or receive's callback completes the future in C, writing
 * the result and then the state; result() reads them, its wait driving progress with the GIL
 * released (tfabpy_progress_wait). What else concurrent.futures needs (_condition, _waiters,
 * _done_callbacks) tfab.Future's properties make lazily, in the fields _cond, _waiter_list and
 * _callbacks. Completion takes the fast way only while none of those exist; otherwise it calls
 * set_result(), which notifies them. Under the GIL a thread that makes one before the write is
 * notified, and one that makes it after sees the state.
 */
#include "tfabpy.h"

#include <structmember.h>

struct tfabpy_future {
	PyObject_HEAD PyObject *state; /* _state: a concurrent.futures state (RUNNING at first) */
	PyObject *result;	       /* _result */
	PyObject *exception;	       /* _exception */
	PyObject *ctx;		       /* _ctx: the tfab.Context whose progress a wait drives */
	PyObject *cond;		       /* _cond, _waiter_list, _callbacks: made when needed */
	PyObject *waiters;
	PyObject *callbacks;
	char yield_idle; /* _yield_idle: a wait yields the core on idle polls (collectives) */
};

static PyObject *running;	     /* concurrent.futures._base.RUNNING */
static PyObject *finished;	     /* ... FINISHED */
static PyObject *cancelled;	     /* ... CANCELLED */
static PyObject *cancelled_notified; /* ... CANCELLED_AND_NOTIFIED */
static PyObject *base_result;	     /* concurrent.futures.Future.result */
static PyObject *base_exception;     /* concurrent.futures.Future.exception */
static PyObject *s_c, *s_set_result;

#define FUT(o) ((struct tfabpy_future *)(o))

/* Whether state is which: the module's own objects, or an equal string. */
static bool state_is(PyObject *state, PyObject *which)
{
	return state == which ||
	       (state && PyUnicode_Check(state) && PyUnicode_Compare(state, which) == 0);
}

static bool done_state(PyObject *state)
{
	return state_is(state, finished) || state_is(state, cancelled) ||
	       state_is(state, cancelled_notified);
}

bool tfabpy_future_done(PyObject *fut)
{
	return done_state(FUT(fut)->state);
}

/* Field *slot takes a new reference to v. */
static void field_set(PyObject **slot, PyObject *v)
{
	PyObject *old = *slot;

	Py_INCREF(v);
	*slot = v;
	Py_XDECREF(old);
}

int tfabpy_future_set(PyObject *fut, PyObject *result)
{
	struct tfabpy_future *f = FUT(fut);
	PyObject *r;

	if (state_is(f->state, running) && !f->cond && !f->waiters && !f->callbacks) {
		field_set(&f->result, result);
		field_set(&f->state, finished);
		return 0;
	}
	/* something waits, or it is done already: set_result says what follows */
	if (!(r = PyObject_CallMethodOneArg(fut, s_set_result, result)))
		return -1;
	Py_DECREF(r);
	return 0;
}

int tfabpy_future_fail(PyObject *fut, int status, const char *what)
{
	PyObject *r = PyObject_CallMethod(fut, "_fail", "is", status, what);

	if (!r)
		return -1;
	Py_DECREF(r);
	return 0;
}

/* What a finished future holds: its result, or its exception raised. */
static PyObject *outcome(struct tfabpy_future *f, bool want_exception)
{
	PyObject *exc = f->exception && f->exception != Py_None ? f->exception : NULL;

	if (want_exception) {
		exc = exc ? exc : Py_None;
		Py_INCREF(exc);
		return exc;
	}
	if (exc) {
		PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
		return NULL;
	}
	exc = f->result ? f->result : Py_None;
	Py_INCREF(exc);
	return exc;
}

/*
 * Wait for fut by driving its context's progress (none with a progress thread, or without a
 * context), at most timeout seconds (None: no limit). Whether the wait drove progress (then
 * the base class must not wait again: nothing would drive it), or -1 on error. A context
 * closed meanwhile is not an error: its operations end on their own.
 */
static int drive(struct tfabpy_future *f, PyObject *timeout)
{
	PyObject *c;
	double seconds = -1.0;
	int rc = 0;

	if (!f->ctx || f->ctx == Py_None)
		return 0;
	if (!(c = PyObject_GetAttr(f->ctx, s_c)))
		return -1;
	if (!PyObject_TypeCheck(c, &tfabpy_context_type) ||
	    ((struct tfabpy_context *)c)->progress_thread)
		goto out;
	rc = 1;
	if (timeout != Py_None) {
		seconds = PyFloat_AsDouble(timeout);
		if (seconds == -1.0 && PyErr_Occurred()) {
			rc = -1;
			goto out;
		}
		if (seconds < 0) /* concurrent.futures' meaning: do not wait */
			seconds = 0;
	}
	if (tfabpy_progress_wait((struct tfabpy_context *)c, (PyObject *)f, seconds,
				 f->yield_idle) < 0) {
		if (!PyErr_ExceptionMatches(PyExc_Exception))
			rc = -1; /* an interrupt */
		else
			PyErr_Clear();
	}
out:
	Py_DECREF(c);
	return rc;
}

/*
 * The base class's wait, in slices of TFABPY_SLICE_MS: a signal that another thread took (the
 * progress thread's) wakes no wait, so the signal handlers (Ctrl-C) run between slices.
 */
static PyObject *base_wait(PyObject *fut, PyObject *timeout, bool want_exception)
{
	PyObject *base = want_exception ? base_exception : base_result;
	double seconds = -1.0;
	uint64_t deadline;

	if (timeout != Py_None) {
		seconds = PyFloat_AsDouble(timeout);
		if (seconds == -1.0 && PyErr_Occurred())
			return NULL;
		if (seconds < 0) /* concurrent.futures' meaning: do not wait */
			seconds = 0;
	}
	deadline = tfabpy_deadline(seconds);
	for (;;) {
		int slice = tfabpy_slice_ms(deadline);
		PyObject *t = PyFloat_FromDouble(slice / 1000.0), *r;

		if (!t)
			return NULL;
		r = PyObject_CallFunctionObjArgs(base, fut, t, NULL);
		Py_DECREF(t);
		/* a finished future's own TimeoutError is its outcome, not the wait's end */
		if (r || !PyErr_ExceptionMatches(PyExc_TimeoutError) ||
		    done_state(FUT(fut)->state) || tfabpy_now_ns() >= deadline)
			return r;
		PyErr_Clear();
		if (PyErr_CheckSignals() < 0)
			return NULL;
	}
}

/* result() and exception(): concurrent.futures' meaning, with the wait driving progress. */
static PyObject *wait_outcome(PyObject *fut, PyObject *args, PyObject *kw, bool want_exception)
{
	static char *kwlist[] = {"timeout", NULL};
	struct tfabpy_future *f = FUT(fut);
	PyObject *timeout = Py_None, *t, *r;
	int drove;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &timeout))
		return NULL;
	if (timeout != Py_None && PyFloat_Check(timeout) &&
	    PyFloat_AS_DOUBLE(timeout) != PyFloat_AS_DOUBLE(timeout))
		return PyErr_Format(PyExc_ValueError,
				    "tfab: timeout must be a number (seconds) or None, got nan");
	if (state_is(f->state, finished))
		return outcome(f, want_exception);
	if ((drove = drive(f, timeout)) < 0)
		return NULL;
	if (state_is(f->state, finished))
		return outcome(f, want_exception);
	if (!drove)
		return base_wait(fut, timeout, want_exception);
	/* cancelled or timed out while driving: the base class says */
	t = PyFloat_FromDouble(0.0);
	if (!t)
		return NULL;
	r = PyObject_CallFunctionObjArgs(want_exception ? base_exception : base_result, fut, t,
					 NULL);
	Py_DECREF(t);
	return r;
}

static PyObject *future_result(PyObject *fut, PyObject *args, PyObject *kw)
{
	return wait_outcome(fut, args, kw, false);
}

static PyObject *future_exception(PyObject *fut, PyObject *args, PyObject *kw)
{
	return wait_outcome(fut, args, kw, true);
}

static PyObject *future_done(PyObject *fut, PyObject *unused)
{
	int done = tfabpy_future_done(fut);

	(void)unused;
	return done < 0 ? NULL : PyBool_FromLong(done);
}

/* Future(ctx=None): the context whose progress its waits drive. */
static int future_init(PyObject *fut, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"ctx", NULL};
	PyObject *ctx = Py_None;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:Future", kwlist, &ctx))
		return -1;
	if (ctx != Py_None)
		field_set(&FUT(fut)->ctx, ctx);
	return 0;
}

static PyObject *future_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	PyObject *fut = type->tp_alloc(type, 0);

	(void)args;
	(void)kw;
	if (fut)
		field_set(&FUT(fut)->state, running);
	return fut;
}

static int future_traverse(PyObject *fut, visitproc visit, void *arg)
{
	struct tfabpy_future *f = FUT(fut);

	Py_VISIT(f->state);
	Py_VISIT(f->result);
	Py_VISIT(f->exception);
	Py_VISIT(f->ctx);
	Py_VISIT(f->cond);
	Py_VISIT(f->waiters);
	Py_VISIT(f->callbacks);
	return 0;
}

static int future_clear(PyObject *fut)
{
	struct tfabpy_future *f = FUT(fut);

	Py_CLEAR(f->state);
	Py_CLEAR(f->result);
	Py_CLEAR(f->exception);
	Py_CLEAR(f->ctx);
	Py_CLEAR(f->cond);
	Py_CLEAR(f->waiters);
	Py_CLEAR(f->callbacks);
	return 0;
}

static void future_dealloc(PyObject *fut)
{
	PyObject_GC_UnTrack(fut);
	future_clear(fut);
	Py_TYPE(fut)->tp_free(fut);
}

static PyMemberDef future_members[] = {
    {"_state", T_OBJECT, offsetof(struct tfabpy_future, state), 0, NULL},
    {"_result", T_OBJECT, offsetof(struct tfabpy_future, result), 0, NULL},
    {"_exception", T_OBJECT, offsetof(struct tfabpy_future, exception), 0, NULL},
    {"_ctx", T_OBJECT, offsetof(struct tfabpy_future, ctx), 0, NULL},
    {"_cond", T_OBJECT, offsetof(struct tfabpy_future, cond), 0, NULL},
    {"_waiter_list", T_OBJECT, offsetof(struct tfabpy_future, waiters), 0, NULL},
    {"_callbacks", T_OBJECT, offsetof(struct tfabpy_future, callbacks), 0, NULL},
    {"_yield_idle", T_BOOL, offsetof(struct tfabpy_future, yield_idle), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

/*
 * _setdefault(i, value): field i (0 _cond, 1 _waiter_list, 2 _callbacks) set to value unless
 * it holds one already; what it holds. One step under the GIL: two threads that make the
 * condition at once end up with the same one.
 */
static PyObject *future_setdefault(PyObject *fut, PyObject *args)
{
	struct tfabpy_future *f = FUT(fut);
	PyObject **slots[] = {&f->cond, &f->waiters, &f->callbacks}, *value, **slot;
	int i;

	if (!PyArg_ParseTuple(args, "iO:_setdefault", &i, &value))
		return NULL;
	if (i < 0 || i > 2)
		return PyErr_Format(PyExc_ValueError, "tfab: no field %d", i);
	slot = slots[i];
	if (!*slot || *slot == Py_None)
		field_set(slot, value);
	Py_INCREF(*slot);
	return *slot;
}

static PyMethodDef future_methods[] = {
    {"result", (PyCFunction)(void (*)(void))future_result, METH_VARARGS | METH_KEYWORDS,
     "result(timeout=None): the result, waiting at most timeout seconds (driving the "
     "context's progress where no progress thread does); raises the operation's exception."},
    {"exception", (PyCFunction)(void (*)(void))future_exception, METH_VARARGS | METH_KEYWORDS,
     "exception(timeout=None): the operation's exception, or None; waits as result() does."},
    {"done", future_done, METH_NOARGS, "done(): whether the operation has ended."},
    {"_setdefault", future_setdefault, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject tfabpy_future_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tfab._tfab.FutureBase",
    .tp_basicsize = sizeof(struct tfabpy_future),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The C half of tfab.Future: made, completed and read without Python frames.",
    .tp_methods = future_methods,
    .tp_members = future_members,
    .tp_traverse = future_traverse,
    .tp_clear = future_clear,
    .tp_dealloc = future_dealloc,
    .tp_init = future_init,
    .tp_new = future_new,
};

int tfabpy_future_init(PyObject *module)
{
	PyObject *base = PyImport_ImportModule("concurrent.futures._base"), *cls = NULL;
	int rc = -1;

	if (!base)
		return -1;
	if (!(running = PyObject_GetAttrString(base, "RUNNING")) ||
	    !(finished = PyObject_GetAttrString(base, "FINISHED")) ||
	    !(cancelled = PyObject_GetAttrString(base, "CANCELLED")) ||
	    !(cancelled_notified = PyObject_GetAttrString(base, "CANCELLED_AND_NOTIFIED")) ||
	    !(cls = PyObject_GetAttrString(base, "Future")) ||
	    !(base_result = PyObject_GetAttrString(cls, "result")) ||
	    !(base_exception = PyObject_GetAttrString(cls, "exception")) ||
	    !(s_c = PyUnicode_InternFromString("_c")) ||
	    !(s_set_result = PyUnicode_InternFromString("set_result")))
		goto out;
	if (PyType_Ready(&tfabpy_future_type) < 0)
		goto out;
	Py_INCREF(&tfabpy_future_type);
	if (PyModule_AddObject(module, "FutureBase", (PyObject *)&tfabpy_future_type) < 0) {
		Py_DECREF(&tfabpy_future_type);
		goto out;
	}
	rc = 0;
out:
	Py_XDECREF(cls);
	Py_DECREF(base);
	return rc;
}
