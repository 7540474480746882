/*
 * future.c: tfab._tfab.FutureBase, the C half of tfab.Future (tfab/__init__.py derives
 * Future from it and from concurrent.futures.Future, in that order).
 *
 * A fetch's future is made, completed and read once, mostly by one thread, and at 8 bytes
 * its Python frames cost more than the fetch. So those three steps run here: made with one
 * attribute set (the rest are class defaults); completed by the send's or receive's callback
 * in C, which writes _result and then _state; read by result(), whose wait drives progress
 * with the GIL released (tfabpy_progress_wait). What concurrent.futures.Future's own methods
 * need (_condition, _waiters, _done_callbacks) is made lazily by tfab.Future's properties, in
 * the instance attributes _cond, _waiter_list and _callbacks. Completion takes the fast way
 * only while none of those exist; otherwise it calls set_result(), which notifies them. Under
 * the GIL a thread that makes one before the write is notified, and one that makes it after
 * sees the state.
 */
#include "tfabpy.h"

static PyObject *finished;	     /* concurrent.futures._base.FINISHED */
static PyObject *cancelled;	     /* ... CANCELLED */
static PyObject *cancelled_notified; /* ... CANCELLED_AND_NOTIFIED */
static PyObject *base_result;	     /* concurrent.futures.Future.result */
static PyObject *base_exception;     /* concurrent.futures.Future.exception */
static PyObject *s_state, *s_result, *s_exception, *s_ctx, *s_c, *s_cond, *s_callbacks, *s_waiters,
    *s_yield_idle, *s_set_result;

/* 1 when the attribute is set on the instance (not None), 0 when not, -1 on error. */
static int attr_set(PyObject *o, PyObject *name)
{
	PyObject *v = PyObject_GetAttr(o, name);
	int set;

	if (!v)
		return -1;
	set = v != Py_None;
	Py_DECREF(v);
	return set;
}

static int state_is(PyObject *state, PyObject *which)
{
	return state == which || PyUnicode_Compare(state, which) == 0;
}

int tfabpy_future_done(PyObject *fut)
{
	PyObject *state, *r;
	int done;

	if (!tfabpy_is_future(fut)) {
		if (!(r = PyObject_CallMethod(fut, "done", NULL)))
			return -1;
		done = PyObject_IsTrue(r);
		Py_DECREF(r);
		return done;
	}
	if (!(state = PyObject_GetAttr(fut, s_state)))
		return -1;
	done = state_is(state, finished) || state_is(state, cancelled) ||
	       state_is(state, cancelled_notified);
	Py_DECREF(state);
	return done;
}

int tfabpy_future_set(PyObject *fut, PyObject *result)
{
	PyObject *state, *r;
	int running, slow;

	if (!(state = PyObject_GetAttr(fut, s_state)))
		return -1;
	running = !state_is(state, finished) && !state_is(state, cancelled) &&
		  !state_is(state, cancelled_notified);
	Py_DECREF(state);
	slow = !running;
	if (!slow) {
		int cond = attr_set(fut, s_cond), cbs = attr_set(fut, s_callbacks),
		    waiters = attr_set(fut, s_waiters);

		if (cond < 0 || cbs < 0 || waiters < 0)
			return -1;
		slow = cond || cbs || waiters;
	}
	if (slow) { /* something waits, or it is done already: set_result says what follows */
		if (!(r = PyObject_CallMethodOneArg(fut, s_set_result, result)))
			return -1;
		Py_DECREF(r);
		return 0;
	}
	if (PyObject_SetAttr(fut, s_result, result) < 0)
		return -1;
	return PyObject_SetAttr(fut, s_state, finished);
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
static PyObject *outcome(PyObject *fut, bool want_exception)
{
	PyObject *exc = PyObject_GetAttr(fut, s_exception);

	if (!exc)
		return NULL;
	if (want_exception)
		return exc;
	if (exc != Py_None) {
		PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
		Py_DECREF(exc);
		return NULL;
	}
	Py_DECREF(exc);
	return PyObject_GetAttr(fut, s_result);
}

/*
 * Wait for fut by driving its context's progress (none with a progress thread, or without a
 * context), at most timeout seconds (None: no limit). Whether the wait drove progress (then
 * the base class must not wait again: nothing would drive it), or -1 on error. A context
 * closed meanwhile is not an error: its operations end on their own.
 */
static int drive(PyObject *fut, PyObject *timeout)
{
	PyObject *ctx, *c = NULL, *y;
	double seconds = -1.0;
	int yield_idle, rc = 0;

	if (!(ctx = PyObject_GetAttr(fut, s_ctx)))
		return -1;
	if (ctx == Py_None)
		goto out;
	if (!(c = PyObject_GetAttr(ctx, s_c)))
		goto fail;
	if (!PyObject_TypeCheck(c, &tfabpy_context_type) ||
	    ((struct tfabpy_context *)c)->progress_thread)
		goto out;
	rc = 1;
	if (timeout != Py_None) {
		seconds = PyFloat_AsDouble(timeout);
		if (seconds == -1.0 && PyErr_Occurred())
			goto fail;
		if (seconds < 0)
			seconds = 0;
	}
	if (!(y = PyObject_GetAttr(fut, s_yield_idle)))
		goto fail;
	yield_idle = PyObject_IsTrue(y);
	Py_DECREF(y);
	if (yield_idle < 0)
		goto fail;
	if (tfabpy_progress_wait((struct tfabpy_context *)c, fut, seconds, yield_idle) < 0) {
		if (!PyErr_ExceptionMatches(PyExc_Exception))
			goto fail; /* an interrupt */
		PyErr_Clear();
	}
out:
	Py_XDECREF(c);
	Py_DECREF(ctx);
	return rc;
fail:
	Py_XDECREF(c);
	Py_DECREF(ctx);
	return -1;
}

/* result() and exception(): concurrent.futures' meaning, with the wait driving progress. */
static PyObject *wait_outcome(PyObject *fut, PyObject *args, PyObject *kw, bool want_exception)
{
	static char *kwlist[] = {"timeout", NULL};
	PyObject *timeout = Py_None, *state;
	int done, drove;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &timeout))
		return NULL;
	if (!(state = PyObject_GetAttr(fut, s_state)))
		return NULL;
	done = state_is(state, finished);
	Py_DECREF(state);
	if (!done) {
		if ((drove = drive(fut, timeout)) < 0)
			return NULL;
		if (!(state = PyObject_GetAttr(fut, s_state)))
			return NULL;
		done = state_is(state, finished);
		Py_DECREF(state);
		if (!done) { /* cancelled, timed out or driven elsewhere: the base class says */
			PyObject *t =
			    drove ? PyFloat_FromDouble(0.0) : (Py_INCREF(timeout), timeout);
			PyObject *r;

			if (!t)
				return NULL;
			r = PyObject_CallFunctionObjArgs(
			    want_exception ? base_exception : base_result, fut, t, NULL);
			Py_DECREF(t);
			return r;
		}
	}
	return outcome(fut, want_exception);
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
	return ctx == Py_None ? 0 : PyObject_SetAttr(fut, s_ctx, ctx);
}

static PyMethodDef future_methods[] = {
    {"result", (PyCFunction)(void (*)(void))future_result, METH_VARARGS | METH_KEYWORDS,
     "result(timeout=None): the result, waiting at most timeout seconds (driving the "
     "context's progress where no progress thread does); raises the operation's exception."},
    {"exception", (PyCFunction)(void (*)(void))future_exception, METH_VARARGS | METH_KEYWORDS,
     "exception(timeout=None): the operation's exception, or None; waits as result() does."},
    {"done", future_done, METH_NOARGS, "done(): whether the operation has ended."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject tfabpy_future_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tfab._tfab.FutureBase",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The C half of tfab.Future: made, completed and read without Python frames.",
    .tp_methods = future_methods,
    .tp_init = future_init,
    .tp_new = PyType_GenericNew,
};

int tfabpy_future_init(PyObject *module)
{
	PyObject *base = PyImport_ImportModule("concurrent.futures._base"), *cls = NULL;
	int rc = -1;

	if (!base)
		return -1;
	if (!(finished = PyObject_GetAttrString(base, "FINISHED")) ||
	    !(cancelled = PyObject_GetAttrString(base, "CANCELLED")) ||
	    !(cancelled_notified = PyObject_GetAttrString(base, "CANCELLED_AND_NOTIFIED")) ||
	    !(cls = PyObject_GetAttrString(base, "Future")) ||
	    !(base_result = PyObject_GetAttrString(cls, "result")) ||
	    !(base_exception = PyObject_GetAttrString(cls, "exception")))
		goto out;
#define INTERN(var, text)                                \
	if (!((var) = PyUnicode_InternFromString(text))) \
	goto out
	INTERN(s_state, "_state");
	INTERN(s_result, "_result");
	INTERN(s_exception, "_exception");
	INTERN(s_ctx, "_ctx");
	INTERN(s_c, "_c");
	INTERN(s_cond, "_cond");
	INTERN(s_callbacks, "_callbacks");
	INTERN(s_waiters, "_waiter_list");
	INTERN(s_yield_idle, "_yield_idle");
	INTERN(s_set_result, "set_result");
#undef INTERN
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
