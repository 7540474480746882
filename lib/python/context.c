/*
 * tfab._tfab.Context and Peer: thin objects over tfab_context and tfab_peer. Every call into
 * the library runs with the GIL released; callbacks (on the progress thread, or inside
 * whichever call drives progress) take the GIL to hand results to Python. A send keeps its
 * tensor (the exporter's DLManagedTensor) until its callback; a receive's tensor becomes a
 * Tensor that keeps the context open.
 */
#include "tfabpy.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Set while this thread runs one of our callbacks: a context cannot be destroyed from there. */
_Thread_local int tfabpy_in_callback;
atomic_ulong tfabpy_completions;

bool tfabpy_context_usable(struct tfabpy_context *c)
{
	if (!c->ctx || c->closed) {
		PyErr_SetString(PyExc_ValueError, "tfab: the context is closed");
		return false;
	}
	return true;
}

static void *destroy_main(void *arg)
{
	tfab_context_destroy(arg);
	return NULL;
}

/* Destroy c's library context: here, or on a thread of its own when inside a callback. */
static void context_destroy_now(struct tfabpy_context *c)
{
	struct tfab_context *ctx = c->ctx;
	pthread_t thread;
	int rc;

	if (!ctx)
		return;
	c->ctx = NULL;
	if (tfabpy_in_callback && pthread_create(&thread, NULL, destroy_main, ctx) == 0) {
		pthread_detach(thread);
		return;
	}
	{
		PyThreadState *ts = PyEval_SaveThread();

		rc = tfab_context_destroy(ctx);
		PyEval_RestoreThread(ts);
	}
	(void)rc;
}

void tfabpy_context_tensor_gone(struct tfabpy_context *c)
{
	c->tensors--;
}

/* A library call: the context is open and counted busy while the GIL is released. */
#define ENTER(c)                               \
	do {                                   \
		if (!tfabpy_context_usable(c)) \
			return NULL;           \
		(c)->busy++;                   \
		tfabpy_clear_last_error();     \
	} while (0)
#define LEAVE(c) ((c)->busy--)

static int context_init(struct tfabpy_context *c, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"settings", NULL};
	PyObject *settings = NULL, *seq = NULL;
	const char **names = NULL, **values = NULL;
	Py_ssize_t n = 0;
	struct tfab_context *ctx = NULL;
	int rc = -1, status;

	if (c->ctx) {
		PyErr_SetString(PyExc_RuntimeError, "tfab: context already initialised");
		return -1;
	}
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:Context", kwlist, &settings))
		return -1;
	if (settings && settings != Py_None) {
		seq = PySequence_Fast(settings, "settings: a sequence of (name, value) pairs");
		if (!seq)
			return -1;
		n = PySequence_Fast_GET_SIZE(seq);
		names = calloc((size_t)n + 1, sizeof(*names));
		values = calloc((size_t)n + 1, sizeof(*values));
		if (!names || !values) {
			PyErr_NoMemory();
			goto out;
		}
		for (Py_ssize_t i = 0; i < n; i++) {
			PyObject *pair = PySequence_Fast_GET_ITEM(seq, i);

			if (!PyTuple_Check(pair) ||
			    !PyArg_ParseTuple(pair, "ss", &names[i], &values[i])) {
				if (!PyErr_Occurred())
					PyErr_SetString(PyExc_TypeError,
							"settings: (name, value) string pairs");
				goto out;
			}
		}
	}
	tfabpy_clear_last_error();
	{
		PyThreadState *ts = PyEval_SaveThread();

		status = tfab_context_create_with(&ctx, names, values, (size_t)n);
		PyEval_RestoreThread(ts);
	}
	if (status) {
		tfabpy_raise(status, "creating a context");
		goto out;
	}
	c->ctx = ctx;
	c->closed = false;
	tfabpy_link_init(&c->sends);
	/* The setting as the library read it: the environment's, unless given here. */
	{
		const char *pt = getenv("TFAB_PROGRESS_THREAD");

		for (Py_ssize_t i = 0; i < n; i++)
			if (strcmp(names[i], "TFAB_PROGRESS_THREAD") == 0)
				pt = values[i];
		c->progress_thread = pt && strtoul(pt, NULL, 0) == 1;
	}
	rc = 0;
out:
	free(names);
	free(values);
	Py_XDECREF(seq);
	return rc;
}

static void context_dealloc(struct tfabpy_context *c)
{
	if (c->weakrefs)
		PyObject_ClearWeakRefs((PyObject *)c);
	tfabpy_world_context_closing(c);
	context_destroy_now(c);
	Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *context_close(struct tfabpy_context *c, PyObject *unused)
{
	struct tfab_context *ctx = c->ctx;

	(void)unused;
	if (!ctx || c->closed)
		Py_RETURN_NONE;
	c->closed = true;
	/* Pending operations end (their futures fail) and blocking calls return. */
	{
		PyThreadState *ts = PyEval_SaveThread();

		tfab_abort(ctx, -TFAB_ERR_ABORTED);
		PyEval_RestoreThread(ts);
	}
	while (c->busy > 0) {
		PyThreadState *ts = PyEval_SaveThread();
		struct timespec pause = {0, 1000000};

		nanosleep(&pause, NULL);
		PyEval_RestoreThread(ts);
	}
	/* Its world first: the library context must not go before it. */
	tfabpy_world_context_closing(c);
	/* Received tensors still held: the context goes with the last of them (dealloc). */
	if (c->tensors == 0)
		context_destroy_now(c);
	Py_RETURN_NONE;
}

static PyObject *peer_new_of(struct tfabpy_context *c, struct tfab_peer *peer)
{
	struct tfabpy_peer *p = PyObject_New(struct tfabpy_peer, &tfabpy_peer_type);

	if (!p) {
		tfab_peer_destroy(peer);
		return NULL;
	}
	p->owner = c;
	Py_INCREF(c);
	p->peer = peer;
	p->world = NULL;
	return (PyObject *)p;
}

PyObject *tfabpy_peer_of_world(struct tfabpy_context *c, struct tfab_peer *peer, PyObject *world)
{
	struct tfabpy_peer *p = PyObject_New(struct tfabpy_peer, &tfabpy_peer_type);

	if (!p)
		return NULL;
	p->owner = c;
	Py_INCREF(c);
	p->peer = peer;
	p->world = world;
	Py_INCREF(world);
	return (PyObject *)p;
}

static PyObject *context_listen(struct tfabpy_context *c, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"host", "port", NULL};
	const char *host = NULL;
	int port = 0, rc;
	uint16_t bound = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|zi:listen", kwlist, &host, &port))
		return NULL;
	if (port < 0 || port > 65535)
		return PyErr_Format(PyExc_ValueError, "port %d out of range", port);
	ENTER(c);
	{
		PyThreadState *ts = PyEval_SaveThread();

		rc = tfab_listen(c->ctx, host, (uint16_t)port, &bound);
		PyEval_RestoreThread(ts);
	}
	LEAVE(c);
	if (rc)
		return tfabpy_raise(rc, "listen");
	return PyLong_FromLong(bound);
}

static PyObject *context_accept(struct tfabpy_context *c, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"timeout", NULL};
	PyObject *timeout = Py_None;
	int timeout_ms, rc;
	struct tfab_peer *peer = NULL;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:accept", kwlist, &timeout) ||
	    tfabpy_timeout_ms(timeout, INT_MAX / 2, &timeout_ms) < 0)
		return NULL;
	ENTER(c);
	{
		PyThreadState *ts = PyEval_SaveThread();

		rc = tfab_accept(c->ctx, timeout_ms, &peer);
		PyEval_RestoreThread(ts);
	}
	LEAVE(c);
	if (rc)
		return tfabpy_raise(rc, "accept");
	return peer_new_of(c, peer);
}

static PyObject *context_connect(struct tfabpy_context *c, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"host", "port", "timeout", NULL};
	PyObject *timeout = Py_None;
	const char *host;
	int port, timeout_ms, rc;
	struct tfab_peer *peer = NULL;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "si|O:connect", kwlist, &host, &port,
					 &timeout) ||
	    tfabpy_timeout_ms(timeout, INT_MAX / 2, &timeout_ms) < 0)
		return NULL;
	if (port <= 0 || port > 65535)
		return PyErr_Format(PyExc_ValueError, "port %d out of range", port);
	ENTER(c);
	{
		PyThreadState *ts = PyEval_SaveThread();

		rc = tfab_connect(c->ctx, host, (uint16_t)port, timeout_ms, &peer);
		PyEval_RestoreThread(ts);
	}
	LEAVE(c);
	if (rc)
		return tfabpy_raise(rc, "connect");
	return peer_new_of(c, peer);
}

static PyObject *context_peer_create(struct tfabpy_context *c, PyObject *unused)
{
	struct tfab_peer *peer = NULL;
	int rc;

	(void)unused;
	ENTER(c);
	{
		PyThreadState *ts = PyEval_SaveThread();

		rc = tfab_peer_create(c->ctx, &peer);
		PyEval_RestoreThread(ts);
	}
	LEAVE(c);
	if (rc)
		return tfabpy_raise(rc, "peer_create");
	return peer_new_of(c, peer);
}

static PyObject *context_progress(struct tfabpy_context *c, PyObject *unused)
{
	int rc;

	(void)unused;
	ENTER(c);
	{
		PyThreadState *ts = PyEval_SaveThread();

		rc = tfab_progress(c->ctx);
		PyEval_RestoreThread(ts);
	}
	LEAVE(c);
	if (rc < 0)
		return tfabpy_raise(rc, "progress");
	return PyLong_FromLong(rc);
}

uint64_t tfabpy_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t tfabpy_deadline(double s)
{
	/* past some 30 years: for ever */
	if (s < 0 || s > 1e9)
		return UINT64_MAX;
	return tfabpy_now_ns() + (uint64_t)(s * 1e9);
}

int tfabpy_slice_ms(uint64_t deadline)
{
	uint64_t now = tfabpy_now_ns(), left;

	if (now >= deadline)
		return 0;
	left = (deadline - now + 999999) / 1000000;
	return left < TFABPY_SLICE_MS ? (int)left : TFABPY_SLICE_MS;
}

/*
 * Drive progress until the future is done or the timeout passes. The polling runs in C with
 * the GIL released (a completion's callback takes it to complete the future), and the future
 * is asked only after progress handled something, or every IDLE_CHECK idle polls (another
 * thread may complete it): a fetch costs no Python-level loop. yield_idle: an idle poll
 * yields the core (sched_yield), as tfab_world_wait does: a collective waits for every rank,
 * and ranks that outnumber the cores must not be kept off them by the ones that wait.
 */
#define IDLE_CHECK 256
int tfabpy_progress_wait(struct tfabpy_context *c, PyObject *future, double timeout, int yield_idle)
{
	uint64_t deadline = tfabpy_deadline(timeout);
	int rc = 0;
	bool done;

	for (;;) {
		done = tfabpy_future_done(future);
		if (done || tfabpy_now_ns() >= deadline)
			return done;
		if (!tfabpy_context_usable(c))
			return -1;
		c->busy++; /* ENTER's, for a function that returns an int */
		tfabpy_clear_last_error();
		{
			PyThreadState *ts = PyEval_SaveThread();
			/* yielding polls may take long on busy cores: the signals wait no slice */
			uint64_t until = tfabpy_now_ns() + (uint64_t)TFABPY_SLICE_MS * 500000;

			unsigned long seen =
			    atomic_load_explicit(&tfabpy_completions, memory_order_acquire);

			for (unsigned i = 0; i < IDLE_CHECK && rc == 0; i++) {
				if (atomic_load_explicit(&tfabpy_completions,
							 memory_order_acquire) != seen)
					break;
				rc = tfab_progress(c->ctx);
				if (rc == 0 && yield_idle)
					sched_yield();
				if ((i & 15) == 15 && tfabpy_now_ns() >= until)
					break;
			}
			PyEval_RestoreThread(ts);
		}
		LEAVE(c);
		if (rc < 0) {
			tfabpy_raise(rc, "progress");
			return -1;
		}
		rc = 0;
		if (PyErr_CheckSignals() < 0)
			return -1;
	}
}

/* The peer argument: None, or a Peer of this context. */
static int peer_arg(struct tfabpy_context *c, PyObject *obj, struct tfab_peer **peer_p,
		    bool required)
{
	struct tfabpy_peer *p;

	if (obj == Py_None && !required) {
		*peer_p = NULL;
		return 0;
	}
	if (!PyObject_TypeCheck(obj, &tfabpy_peer_type)) {
		PyErr_Format(PyExc_TypeError, "expected a tfab.Peer, got %.200s",
			     Py_TYPE(obj)->tp_name);
		return -1;
	}
	p = (struct tfabpy_peer *)obj;
	if (p->owner != c) {
		PyErr_SetString(PyExc_ValueError, "tfab: that peer belongs to another context");
		return -1;
	}
	if (!p->peer) {
		PyErr_SetString(PyExc_ValueError, "tfab: that peer is closed");
		return -1;
	}
	*peer_p = p->peer;
	return 0;
}

static int key_arg(PyObject *obj, const char **key_p)
{
	Py_ssize_t len;

	if (PyUnicode_Check(obj))
		*key_p = PyUnicode_AsUTF8AndSize(obj, &len);
	else if (PyBytes_Check(obj))
		PyBytes_AsStringAndSize(obj, (char **)key_p, &len);
	else {
		PyErr_SetString(PyExc_TypeError, "tfab: a key is str or bytes");
		return -1;
	}
	if (!*key_p)
		return -1;
	if ((size_t)len > TFAB_MAX_KEY_LEN || strlen(*key_p) != (size_t)len) {
		PyErr_Format(PyExc_ValueError,
			     "tfab: a key is at most %d bytes, without NUL (got %zd bytes)",
			     TFAB_MAX_KEY_LEN, len);
		return -1;
	}
	return 0;
}

/* An operation in flight: what it keeps alive until its callback. */
struct op {
	struct tfabpy_context *owner;
	PyObject *callback;
	DLManagedTensor *tensor; /* a send's source, a receive's out= */
	PyObject *out;
	char what[128];		 /* its failure's words: "recv of 'k' step 3" */
	struct tfabpy_link link; /* a send's, in owner->sends */
};

/* What an operation is, for its exception: "send of 'k' step 3". */
static void op_what(char *buf, size_t len, const char *call, const char *key, long long step)
{
	snprintf(buf, len, "%s of '%.64s' step %lld", call, key, step);
}

static struct op *op_new(struct tfabpy_context *c, PyObject *callback, DLManagedTensor *tensor,
			 PyObject *out)
{
	struct op *op = calloc(1, sizeof(*op));

	if (!op) {
		PyErr_NoMemory();
		return NULL;
	}
	op->owner = c;
	Py_INCREF(c);
	op->callback = callback;
	Py_INCREF(callback);
	op->tensor = tensor;
	op->out = out;
	Py_XINCREF(out);
	return op;
}

/* With the GIL. */
static void op_free(struct op *op)
{
	tfabpy_link_del(&op->link);
	if (op->tensor && op->tensor->deleter)
		op->tensor->deleter(op->tensor);
	Py_XDECREF(op->out);
	Py_DECREF(op->callback);
	Py_DECREF(op->owner);
	free(op);
}

static void op_call(struct op *op, PyObject *args)
{
	PyObject *res;

	if (!args) {
		PyErr_WriteUnraisable(op->callback);
		return;
	}
	res = PyObject_CallObject(op->callback, args);
	Py_DECREF(args);
	if (!res)
		PyErr_WriteUnraisable(op->callback);
	Py_XDECREF(res);
}

/* An operation whose callback is a tfab.Future: result on success, else the exception. */
static void op_settle(struct op *op, int status, PyObject *result, const char *what)
{
	if ((status ? tfabpy_future_fail(op->callback, status, what)
		    : tfabpy_future_set(op->callback, result)) < 0)
		PyErr_WriteUnraisable(op->callback);
}

static void on_sent(void *arg, int status)
{
	struct op *op = arg;
	PyGILState_STATE g = PyGILState_Ensure();

	tfabpy_in_callback++;
	/* The tensor goes first: the future's waiters may free what it points into. */
	if (op->tensor && op->tensor->deleter)
		op->tensor->deleter(op->tensor);
	op->tensor = NULL;
	if (tfabpy_is_future(op->callback))
		op_settle(op, status, Py_None, op->what);
	else
		op_call(op, Py_BuildValue("(i)", status));
	op_free(op);
	tfabpy_in_callback--;
	atomic_fetch_add_explicit(&tfabpy_completions, 1, memory_order_release);
	PyGILState_Release(g);
}

static PyObject *context_send(struct tfabpy_context *c, PyObject *args)
{
	PyObject *keyobj, *obj, *peerobj, *callback;
	long long step;
	int is_dead, rc;
	const char *key;
	struct tfab_peer *peer;
	DLManagedTensor *m = NULL;
	struct op *op;

	if (!PyArg_ParseTuple(args, "OLOpOO:send", &keyobj, &step, &obj, &is_dead, &peerobj,
			      &callback))
		return NULL;
	if (tfabpy_step_arg(step) < 0)
		return NULL;
	if (key_arg(keyobj, &key) < 0 || peer_arg(c, peerobj, &peer, false) < 0)
		return NULL;
	if (!tfabpy_context_usable(c))
		return NULL;
	if (tfabpy_dlpack_import(obj, NULL, &m) < 0)
		return NULL;
	if (!tfabpy_is_compact(&m->dl_tensor)) {
		m->deleter(m);
		return PyErr_Format(PyExc_ValueError,
				    "tfab: send() takes a contiguous (row-major) tensor; make one "
				    "with numpy.ascontiguousarray() or .contiguous()");
	}
	op = op_new(c, callback, m, NULL);
	if (!op) {
		m->deleter(m);
		return NULL;
	}
	op_what(op->what, sizeof(op->what), "send", key, step);
	tfabpy_link_add(&c->sends, &op->link, ++c->sends_seq);
	ENTER(c);
	{
		PyThreadState *ts = PyEval_SaveThread();

		if (peer)
			rc = tfab_send_to(c->ctx, peer, key, step, &m->dl_tensor, is_dead, on_sent,
					  op);
		else
			rc = tfab_send(c->ctx, key, step, &m->dl_tensor, is_dead, on_sent, op);
		PyEval_RestoreThread(ts);
	}
	LEAVE(c);
	if (rc) {
		op_free(op);
		return tfabpy_raise(rc, "send");
	}
	Py_RETURN_NONE;
}

/* Strings: (shape, a flat sequence of bytes) in, the same out. */
static PyObject *context_send_strings(struct tfabpy_context *c, PyObject *args)
{
	PyObject *keyobj, *shapeobj, *items, *peerobj, *callback, *seq = NULL, *shseq = NULL;
	long long step;
	int is_dead, rc = 0;
	const char *key;
	struct tfab_peer *peer;
	struct tfab_string *strings = NULL;
	int64_t *shape = NULL;
	struct tfab_string_tensor t;
	struct op *op = NULL;
	Py_ssize_t n, ndim;
	PyObject *result = NULL;

	if (!PyArg_ParseTuple(args, "OLOOpOO:send_strings", &keyobj, &step, &shapeobj, &items,
			      &is_dead, &peerobj, &callback))
		return NULL;
	if (tfabpy_step_arg(step) < 0)
		return NULL;
	if (key_arg(keyobj, &key) < 0 || peer_arg(c, peerobj, &peer, false) < 0)
		return NULL;
	if (!tfabpy_context_usable(c))
		return NULL;
	shseq = PySequence_Fast(shapeobj, "shape: a sequence of ints");
	seq = PySequence_Fast(items, "strings: a sequence of bytes");
	if (!shseq || !seq)
		goto out;
	ndim = PySequence_Fast_GET_SIZE(shseq);
	n = PySequence_Fast_GET_SIZE(seq);
	shape = calloc((size_t)ndim + 1, sizeof(*shape));
	strings = calloc((size_t)n + 1, sizeof(*strings));
	if (!shape || !strings) {
		PyErr_NoMemory();
		goto out;
	}
	for (Py_ssize_t i = 0; i < ndim; i++) {
		shape[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(shseq, i));
		if (shape[i] == -1 && PyErr_Occurred())
			goto out;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *s = PySequence_Fast_GET_ITEM(seq, i);
		char *data;
		Py_ssize_t len;

		if (!PyBytes_Check(s)) {
			PyErr_Format(PyExc_TypeError,
				     "tfab: string tensors hold bytes; element %zd is %.200s", i,
				     Py_TYPE(s)->tp_name);
			goto out;
		}
		PyBytes_AsStringAndSize(s, &data, &len);
		strings[i].data = data;
		strings[i].len = (size_t)len;
	}
	t.ndim = (int32_t)ndim;
	t.shape = shape;
	t.strings = strings;
	if (tfab_string_tensor_count(&t) != n) {
		PyErr_SetString(PyExc_ValueError, "tfab: the shape does not match the strings");
		goto out;
	}
	op = op_new(c, callback, NULL, NULL);
	if (!op)
		goto out;
	op_what(op->what, sizeof(op->what), "send_strings", key, step);
	tfabpy_link_add(&c->sends, &op->link, ++c->sends_seq);
	/* Serialized before the call returns: the bytes objects are not needed after. */
	ENTER(c);
	{
		PyThreadState *ts = PyEval_SaveThread();

		if (peer)
			rc =
			    tfab_send_strings_to(c->ctx, peer, key, step, &t, is_dead, on_sent, op);
		else
			rc = tfab_send_strings(c->ctx, key, step, &t, is_dead, on_sent, op);
		PyEval_RestoreThread(ts);
	}
	LEAVE(c);
	if (rc) {
		op_free(op);
		tfabpy_raise(rc, "send");
		goto out;
	}
	result = Py_None;
	Py_INCREF(result);
out:
	free(shape);
	free(strings);
	Py_XDECREF(seq);
	Py_XDECREF(shseq);
	return result;
}

/* The destination out= (None: a library tensor), as a DLManagedTensor the caller owns. */
static int out_arg(PyObject *out, DLManagedTensor **m_p)
{
	DLManagedTensor *m;

	*m_p = NULL;
	if (out == Py_None)
		return 0;
	if (tfabpy_dlpack_import(out, "out=", &m) < 0)
		return -1;
	if (!tfabpy_is_compact(&m->dl_tensor)) {
		m->deleter(m);
		PyErr_SetString(PyExc_ValueError,
				"tfab: out= must be contiguous (row-major): a strided view cannot "
				"take a tensor in place");
		return -1;
	}
	*m_p = m;
	return 0;
}

/* The Python side of a received tensor: a Tensor (library memory, or a view of out=). */
static PyObject *received(struct tfabpy_context *c, DLManagedTensor *t, PyObject *out)
{
	if (!t)
		Py_RETURN_NONE;
	if (out != Py_None && out)
		return tfabpy_tensor_new(NULL, t, out);
	c->tensors++;
	return tfabpy_tensor_new(c, t, NULL);
}

int tfabpy_timeout_seconds(PyObject *obj, double *s_p)
{
	double s;

	if (obj == Py_None) {
		*s_p = -1.0;
		return 0;
	}
	if (!PyNumber_Check(obj) || PyComplex_Check(obj)) {
		PyErr_Format(PyExc_TypeError,
			     "tfab: timeout must be a number >= 0 (seconds) or None, got %.200R",
			     obj);
		return -1;
	}
	s = PyFloat_AsDouble(obj);
	if (s == -1.0 && PyErr_Occurred())
		return -1;
	if (!(s >= 0)) { /* NaN too */
		PyErr_Format(PyExc_ValueError,
			     "tfab: timeout must be a number >= 0 (seconds) or None, got %.200R",
			     obj);
		return -1;
	}
	*s_p = s;
	return 0;
}

int tfabpy_timeout_ms(PyObject *obj, int none_ms, int *ms_p)
{
	double s;

	if (tfabpy_timeout_seconds(obj, &s) < 0)
		return -1;
	if (s < 0) {
		*ms_p = none_ms;
		return 0;
	}
	*ms_p = s * 1000.0 > INT_MAX / 2 ? INT_MAX / 2 : (int)(s * 1000.0 + 0.5);
	return 0;
}

int tfabpy_step_arg(long long step)
{
	if (step >= 0)
		return 0;
	PyErr_Format(PyExc_ValueError, "tfab: step %lld is negative: steps are >= 0", step);
	return -1;
}

/* A timeout in seconds, None for none: some 12 days, which is for ever to a receive. */
static int timeout_arg(PyObject *obj, int *ms_p)
{
	return tfabpy_timeout_ms(obj, INT_MAX / 2, ms_p);
}

static const char *recv_what(int rc, bool has_out, const char *what)
{
	if (has_out && (rc == -EINVAL || rc == -EMSGSIZE))
		return "recv into out=: its dtype or shape (or size) does not match the tensor "
		       "sent";
	return what;
}

static PyObject *context_recv(struct tfabpy_context *c, PyObject *args)
{
	PyObject *peerobj, *keyobj, *out, *timeout, *tensor;
	long long step;
	int any_shape, timeout_ms, rc;
	const char *key;
	struct tfab_peer *peer;
	DLManagedTensor *dest = NULL, *t = NULL;
	bool is_dead = false;
	char what[128];

	if (!PyArg_ParseTuple(args, "OOLOpO:recv", &peerobj, &keyobj, &step, &out, &any_shape,
			      &timeout))
		return NULL;
	if (tfabpy_step_arg(step) < 0)
		return NULL;
	if (peer_arg(c, peerobj, &peer, true) < 0 || key_arg(keyobj, &key) < 0 ||
	    timeout_arg(timeout, &timeout_ms) < 0)
		return NULL;
	if (!tfabpy_context_usable(c) || out_arg(out, &dest) < 0)
		return NULL;
	ENTER(c);
	{
		PyThreadState *ts = PyEval_SaveThread();

		if (dest)
			rc = tfab_recv_into_sync(c->ctx, peer, key, step, &dest->dl_tensor,
						 any_shape ? TFAB_RECV_ANY_SHAPE : 0, timeout_ms,
						 &t, &is_dead);
		else
			rc =
			    tfab_recv_sync(c->ctx, peer, key, step, NULL, timeout_ms, &t, &is_dead);
		PyEval_RestoreThread(ts);
	}
	LEAVE(c);
	if (rc) {
		if (dest)
			dest->deleter(dest);
		op_what(what, sizeof(what), "recv", key, step);
		return tfabpy_raise(rc, recv_what(rc, dest != NULL, what));
	}
	tensor = received(c, t, out);
	if (dest)
		dest->deleter(dest);
	if (!tensor)
		return NULL;
	return Py_BuildValue("(NO)", tensor, is_dead ? Py_True : Py_False);
}

static void on_recv(void *arg, int status, DLManagedTensor *t, bool is_dead)
{
	struct op *op = arg;
	PyGILState_STATE g = PyGILState_Ensure();
	PyObject *tensor;

	tfabpy_in_callback++;
	if (status == 0) {
		tensor = received(op->owner, t, op->out);
		if (!tensor) {
			PyErr_WriteUnraisable(op->callback);
			tensor = Py_None;
			Py_INCREF(tensor);
		}
	} else {
		tensor = Py_None;
		Py_INCREF(tensor);
	}
	if (tfabpy_is_future(op->callback)) { /* with out=, the future's result is out itself */
		op_settle(op, status,
			  is_dead   ? Py_None
			  : op->out ? op->out
				    : tensor,
			  recv_what(status, op->out != NULL, op->what));
		Py_DECREF(tensor);
	} else {
		op_call(op, Py_BuildValue("(iNO)", status, tensor, is_dead ? Py_True : Py_False));
	}
	op_free(op);
	tfabpy_in_callback--;
	atomic_fetch_add_explicit(&tfabpy_completions, 1, memory_order_release);
	PyGILState_Release(g);
}

static PyObject *context_recv_async(struct tfabpy_context *c, PyObject *args)
{
	PyObject *peerobj, *keyobj, *out, *callback;
	long long step;
	int any_shape, rc;
	const char *key;
	struct tfab_peer *peer;
	DLManagedTensor *dest = NULL;
	struct op *op;

	if (!PyArg_ParseTuple(args, "OOLOpO:recv_async", &peerobj, &keyobj, &step, &out, &any_shape,
			      &callback))
		return NULL;
	if (tfabpy_step_arg(step) < 0)
		return NULL;
	if (peer_arg(c, peerobj, &peer, true) < 0 || key_arg(keyobj, &key) < 0)
		return NULL;
	if (!tfabpy_context_usable(c) || out_arg(out, &dest) < 0)
		return NULL;
	op = op_new(c, callback, dest, out == Py_None ? NULL : out);
	if (!op) {
		if (dest)
			dest->deleter(dest);
		return NULL;
	}
	op_what(op->what, sizeof(op->what), "recv", key, step);
	ENTER(c);
	{
		PyThreadState *ts = PyEval_SaveThread();

		if (dest)
			rc = tfab_recv_into(c->ctx, peer, key, step, &dest->dl_tensor,
					    any_shape ? TFAB_RECV_ANY_SHAPE : 0, on_recv, op);
		else
			rc = tfab_recv(c->ctx, peer, key, step, NULL, on_recv, op);
		PyEval_RestoreThread(ts);
	}
	LEAVE(c);
	if (rc) {
		char what[sizeof(op->what)];

		snprintf(what, sizeof(what), "%s", op->what);
		op_free(op);
		return tfabpy_raise(rc, recv_what(rc, dest != NULL, what));
	}
	Py_RETURN_NONE;
}

/* (shape, [bytes]) of a string tensor; frees it. */
static PyObject *strings_result(struct tfab_string_tensor *t)
{
	PyObject *shape, *list;
	int64_t n;

	if (!t)
		return Py_BuildValue("(OO)", Py_None, Py_None);
	n = tfab_string_tensor_count(t);
	shape = PyTuple_New(t->ndim);
	list = PyList_New(n < 0 ? 0 : n);
	if (!shape || !list)
		goto err;
	for (int i = 0; i < t->ndim; i++) {
		PyObject *v = PyLong_FromLongLong(t->shape[i]);

		if (!v)
			goto err;
		PyTuple_SET_ITEM(shape, i, v);
	}
	for (int64_t i = 0; i < n; i++) {
		PyObject *s = PyBytes_FromStringAndSize(
		    t->strings[i].data ? t->strings[i].data : "", (Py_ssize_t)t->strings[i].len);

		if (!s)
			goto err;
		PyList_SET_ITEM(list, i, s);
	}
	tfab_string_tensor_free(t);
	return Py_BuildValue("(NN)", shape, list);
err:
	tfab_string_tensor_free(t);
	Py_XDECREF(shape);
	Py_XDECREF(list);
	return NULL;
}

static PyObject *context_recv_strings(struct tfabpy_context *c, PyObject *args)
{
	PyObject *peerobj, *keyobj, *timeout, *res;
	long long step;
	int timeout_ms, rc;
	const char *key;
	struct tfab_peer *peer;
	struct tfab_string_tensor *t = NULL;
	bool is_dead = false;
	char what[128];

	if (!PyArg_ParseTuple(args, "OOLO:recv_strings", &peerobj, &keyobj, &step, &timeout))
		return NULL;
	if (tfabpy_step_arg(step) < 0)
		return NULL;
	if (peer_arg(c, peerobj, &peer, true) < 0 || key_arg(keyobj, &key) < 0 ||
	    timeout_arg(timeout, &timeout_ms) < 0)
		return NULL;
	ENTER(c);
	{
		PyThreadState *ts = PyEval_SaveThread();

		rc = tfab_recv_strings_sync(c->ctx, peer, key, step, timeout_ms, &t, &is_dead);
		PyEval_RestoreThread(ts);
	}
	LEAVE(c);
	if (rc) {
		op_what(what, sizeof(what), "recv_strings", key, step);
		return tfabpy_raise(rc, what);
	}
	res = strings_result(t);
	if (!res)
		return NULL;
	return Py_BuildValue("(NO)", res, is_dead ? Py_True : Py_False);
}

static void on_recv_strings(void *arg, int status, struct tfab_string_tensor *t, bool is_dead)
{
	struct op *op = arg;
	PyGILState_STATE g = PyGILState_Ensure();
	PyObject *res;

	tfabpy_in_callback++;
	res = strings_result(status == 0 ? t : NULL);
	if (!res) {
		PyErr_WriteUnraisable(op->callback);
		res = Py_BuildValue("(OO)", Py_None, Py_None);
	}
	op_call(op, Py_BuildValue("(iNO)", status, res, is_dead ? Py_True : Py_False));
	op_free(op);
	tfabpy_in_callback--;
	atomic_fetch_add_explicit(&tfabpy_completions, 1, memory_order_release);
	PyGILState_Release(g);
}

static PyObject *context_recv_strings_async(struct tfabpy_context *c, PyObject *args)
{
	PyObject *peerobj, *keyobj, *callback;
	long long step;
	int rc;
	const char *key;
	struct tfab_peer *peer;
	struct op *op;

	if (!PyArg_ParseTuple(args, "OOLO:recv_strings_async", &peerobj, &keyobj, &step, &callback))
		return NULL;
	if (tfabpy_step_arg(step) < 0)
		return NULL;
	if (peer_arg(c, peerobj, &peer, true) < 0 || key_arg(keyobj, &key) < 0)
		return NULL;
	if (!tfabpy_context_usable(c))
		return NULL;
	op = op_new(c, callback, NULL, NULL);
	if (!op)
		return NULL;
	ENTER(c);
	{
		PyThreadState *ts = PyEval_SaveThread();

		rc = tfab_recv_strings(c->ctx, peer, key, step, on_recv_strings, op);
		PyEval_RestoreThread(ts);
	}
	LEAVE(c);
	if (rc) {
		op_free(op);
		return tfabpy_raise(rc, "recv_strings");
	}
	Py_RETURN_NONE;
}

static PyObject *context_recv_ahead(struct tfabpy_context *c, PyObject *args)
{
	PyObject *peerobj, *keyobj;
	unsigned depth;
	const char *key;
	struct tfab_peer *peer;
	int rc;

	if (!PyArg_ParseTuple(args, "OOI:recv_ahead", &peerobj, &keyobj, &depth))
		return NULL;
	if (peer_arg(c, peerobj, &peer, true) < 0 || key_arg(keyobj, &key) < 0)
		return NULL;
	ENTER(c);
	{
		PyThreadState *ts = PyEval_SaveThread();

		rc = tfab_recv_ahead(c->ctx, peer, key, depth);
		PyEval_RestoreThread(ts);
	}
	LEAVE(c);
	if (rc)
		return tfabpy_raise(rc, "recv_ahead");
	Py_RETURN_NONE;
}

/*
 * Waits until the sends posted before the call have ended, in slices of the library's flush:
 * each slice returns to run the signal handlers (Ctrl-C), and the wait ends when the library
 * flushed all it had, or when none of those sends is left (sends posted since do not count).
 */
static PyObject *context_flush(struct tfabpy_context *c, PyObject *args)
{
	PyObject *timeout = Py_None;
	uint64_t deadline, seq = c->sends_seq;
	double seconds;
	int rc;

	if (!PyArg_ParseTuple(args, "|O:flush", &timeout) ||
	    tfabpy_timeout_seconds(timeout, &seconds) < 0)
		return NULL;
	deadline = tfabpy_deadline(seconds);
	for (;;) {
		int slice = tfabpy_slice_ms(deadline);

		ENTER(c);
		{
			PyThreadState *ts = PyEval_SaveThread();

			rc = tfab_flush(c->ctx, slice);
			PyEval_RestoreThread(ts);
		}
		LEAVE(c);
		if (rc == 0 || (rc == -ETIMEDOUT && !tfabpy_link_pending(&c->sends, seq)))
			Py_RETURN_NONE;
		if (rc != -ETIMEDOUT || tfabpy_now_ns() >= deadline)
			return tfabpy_raise(rc, "flush");
		if (PyErr_CheckSignals() < 0)
			return NULL;
	}
}

static PyObject *context_step_cleanup(struct tfabpy_context *c, PyObject *arg)
{
	long long step = PyLong_AsLongLong(arg);
	int rc;

	if ((step == -1 && PyErr_Occurred()) || tfabpy_step_arg(step) < 0)
		return NULL;
	ENTER(c);
	{
		PyThreadState *ts = PyEval_SaveThread();

		rc = tfab_step_cleanup(c->ctx, step);
		PyEval_RestoreThread(ts);
	}
	LEAVE(c);
	if (rc)
		return tfabpy_raise(rc, "step_cleanup");
	Py_RETURN_NONE;
}

static PyObject *context_abort(struct tfabpy_context *c, PyObject *args)
{
	int status = 0, rc;

	if (!PyArg_ParseTuple(args, "|i:abort", &status))
		return NULL;
	if (status > 0)
		status = -status;
	ENTER(c);
	{
		PyThreadState *ts = PyEval_SaveThread();

		rc = tfab_abort(c->ctx, status);
		PyEval_RestoreThread(ts);
	}
	LEAVE(c);
	if (rc)
		return tfabpy_raise(rc, "abort");
	Py_RETURN_NONE;
}

static PyObject *context_stats(struct tfabpy_context *c, PyObject *unused)
{
	struct tfab_stats s;
	int rc;

	(void)unused;
	ENTER(c);
	{
		PyThreadState *ts = PyEval_SaveThread();

		rc = tfab_get_stats(c->ctx, &s);
		PyEval_RestoreThread(ts);
	}
	LEAVE(c);
	if (rc)
		return tfabpy_raise(rc, "stats");
#define S(f) #f, (unsigned long long)s.f
	return Py_BuildValue(
	    "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,"
	    "s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}",
	    S(bytes_sent), S(bytes_received), S(sends), S(requests), S(meta_hits), S(meta_misses),
	    S(rerequests), S(mr_hits), S(mr_misses), S(mr_registrations), S(bytes_copied),
	    S(ctrl_messages), S(writes_content), S(writes_ctrl), S(writes_credit),
	    S(meta_evictions), S(bytes_ctrl), S(requests_ahead), S(ahead_taken), S(refused),
	    S(coll_bytes_wire), S(coll_bytes_logical), S(gpu_pins), S(coll_shm), S(peers_cut));
#undef S
}

static PyObject *context_paths(struct tfabpy_context *c, PyObject *unused)
{
	const char *names[16];
	int n;
	PyObject *list;

	(void)unused;
	if (!tfabpy_context_usable(c))
		return NULL;
	n = tfab_context_paths(c->ctx, names, 16);
	if (n < 0)
		return tfabpy_raise(n, "paths");
	list = PyList_New(0);
	for (int i = 0; list && i < n && i < 16; i++) {
		PyObject *s = PyUnicode_FromString(names[i]);

		if (!s || PyList_Append(list, s) < 0) {
			Py_XDECREF(s);
			Py_CLEAR(list);
			break;
		}
		Py_DECREF(s);
	}
	return list;
}

static PyObject *context_get_closed(struct tfabpy_context *c, void *closure)
{
	(void)closure;
	return PyBool_FromLong(!c->ctx || c->closed);
}

static PyObject *context_get_progress_thread(struct tfabpy_context *c, void *closure)
{
	(void)closure;
	return PyBool_FromLong(c->progress_thread);
}

static PyObject *context_get_fabric(struct tfabpy_context *c, void *closure)
{
	(void)closure;
	if (!tfabpy_context_usable(c))
		return NULL;
	return Py_BuildValue("(sss)", tfab_context_backend(c->ctx), tfab_context_fabric(c->ctx),
			     tfab_context_domain(c->ctx));
}

static PyMethodDef context_methods[] = {
    {"close", (PyCFunction)context_close, METH_NOARGS, NULL},
    {"listen", (PyCFunction)(void (*)(void))context_listen, METH_VARARGS | METH_KEYWORDS, NULL},
    {"accept", (PyCFunction)(void (*)(void))context_accept, METH_VARARGS | METH_KEYWORDS, NULL},
    {"connect", (PyCFunction)(void (*)(void))context_connect, METH_VARARGS | METH_KEYWORDS, NULL},
    {"peer_create", (PyCFunction)context_peer_create, METH_NOARGS, NULL},
    {"progress", (PyCFunction)context_progress, METH_NOARGS, NULL},
    {"send", (PyCFunction)context_send, METH_VARARGS, NULL},
    {"send_strings", (PyCFunction)context_send_strings, METH_VARARGS, NULL},
    {"recv", (PyCFunction)context_recv, METH_VARARGS, NULL},
    {"recv_async", (PyCFunction)context_recv_async, METH_VARARGS, NULL},
    {"recv_strings", (PyCFunction)context_recv_strings, METH_VARARGS, NULL},
    {"recv_strings_async", (PyCFunction)context_recv_strings_async, METH_VARARGS, NULL},
    {"recv_ahead", (PyCFunction)context_recv_ahead, METH_VARARGS, NULL},
    {"flush", (PyCFunction)context_flush, METH_VARARGS, NULL},
    {"step_cleanup", (PyCFunction)context_step_cleanup, METH_O, NULL},
    {"abort", (PyCFunction)context_abort, METH_VARARGS, NULL},
    {"stats", (PyCFunction)context_stats, METH_NOARGS, NULL},
    {"paths", (PyCFunction)context_paths, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef context_getset[] = {
    {"closed", (getter)context_get_closed, NULL, NULL, NULL},
    {"progress_thread", (getter)context_get_progress_thread, NULL, NULL, NULL},
    {"fabric", (getter)context_get_fabric, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject tfabpy_context_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tfab._tfab.Context",
    .tp_basicsize = sizeof(struct tfabpy_context),
    .tp_dealloc = (destructor)context_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The C context; tfab.Context is the one to use.",
    .tp_weaklistoffset = offsetof(struct tfabpy_context, weakrefs),
    .tp_methods = context_methods,
    .tp_getset = context_getset,
    .tp_init = (initproc)context_init,
    .tp_new = PyType_GenericNew,
};

/* Peers. */

static bool peer_usable(struct tfabpy_peer *p)
{
	if (!p->peer || !p->owner->ctx || (p->world && !((struct tfabpy_world *)p->world)->w)) {
		PyErr_SetString(PyExc_ValueError, "tfab: the peer is closed");
		return false;
	}
	return true;
}

static void peer_dealloc(struct tfabpy_peer *p)
{
	/* The library peer stays (a sender's peer is often dropped): the context closes it. */
	Py_XDECREF(p->world);
	Py_XDECREF(p->owner);
	PyObject_Del(p);
}

static PyObject *peer_blob(struct tfabpy_peer *p, PyObject *unused)
{
	unsigned char buf[TFAB_PEER_BLOB_MAX];
	size_t len = sizeof(buf);
	int rc;

	(void)unused;
	if (!peer_usable(p))
		return NULL;
	tfabpy_clear_last_error();
	{
		PyThreadState *ts = PyEval_SaveThread();

		rc = tfab_peer_blob(p->peer, buf, &len);
		PyEval_RestoreThread(ts);
	}
	if (rc)
		return tfabpy_raise(rc, "peer blob");
	return PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)len);
}

static PyObject *peer_connect(struct tfabpy_peer *p, PyObject *arg)
{
	Py_buffer blob;
	int rc;

	if (!peer_usable(p))
		return NULL;
	if (PyObject_GetBuffer(arg, &blob, PyBUF_SIMPLE) < 0)
		return NULL;
	tfabpy_clear_last_error();
	p->owner->busy++;
	{
		PyThreadState *ts = PyEval_SaveThread();

		rc = tfab_peer_connect(p->peer, blob.buf, (size_t)blob.len);
		PyEval_RestoreThread(ts);
	}
	p->owner->busy--;
	PyBuffer_Release(&blob);
	if (rc)
		return tfabpy_raise(rc, "peer connect");
	Py_RETURN_NONE;
}

static PyObject *peer_close(struct tfabpy_peer *p, PyObject *unused)
{
	struct tfab_peer *peer = p->peer;

	(void)unused;
	if (p->world) {
		PyErr_SetString(
		    PyExc_ValueError,
		    "tfab: a world's peer goes with the world: leave the world instead");
		return NULL;
	}
	if (!peer || !p->owner->ctx)
		Py_RETURN_NONE;
	p->peer = NULL;
	{
		PyThreadState *ts = PyEval_SaveThread();

		tfab_peer_destroy(peer);
		PyEval_RestoreThread(ts);
	}
	Py_RETURN_NONE;
}

static PyObject *peer_get_path(struct tfabpy_peer *p, void *closure)
{
	const char *path;

	(void)closure;
	if (!peer_usable(p))
		return NULL;
	path = tfab_peer_path(p->peer);
	if (!path)
		Py_RETURN_NONE;
	return PyUnicode_FromString(path);
}

static PyObject *peer_get_status(struct tfabpy_peer *p, void *closure)
{
	(void)closure;
	if (!peer_usable(p))
		return NULL;
	return PyLong_FromLong(tfab_peer_status(p->peer));
}

static PyObject *peer_get_left(struct tfabpy_peer *p, void *closure)
{
	int rc;

	(void)closure;
	if (!peer_usable(p))
		return NULL;
	rc = tfab_peer_left(p->peer);
	if (rc < 0)
		return tfabpy_raise(rc, "peer left");
	return PyBool_FromLong(rc);
}

static PyObject *peer_get_fabric(struct tfabpy_peer *p, void *closure)
{
	const char *backend, *fabric, *domain;
	int rc;

	(void)closure;
	if (!peer_usable(p))
		return NULL;
	rc = tfab_peer_fabric(p->peer, &backend, &fabric, &domain);
	if (rc)
		return tfabpy_raise(rc, "peer fabric");
	return Py_BuildValue("(sss)", backend, fabric, domain);
}

/* The library's peer as a number: one peer's Peer objects (World.peer makes new ones) share it. */
static PyObject *peer_get_id(struct tfabpy_peer *p, void *closure)
{
	(void)closure;
	return PyLong_FromVoidPtr(p->peer);
}

static PyObject *peer_get_context(struct tfabpy_peer *p, void *closure)
{
	(void)closure;
	Py_INCREF(p->owner);
	return (PyObject *)p->owner;
}

static PyMethodDef peer_methods[] = {
    {"blob", (PyCFunction)peer_blob, METH_NOARGS,
     "blob() -> bytes: what the other side passes to its peer's connect()."},
    {"connect", (PyCFunction)peer_connect, METH_O,
     "connect(blob): connect to the peer whose blob() this is."},
    {"close", (PyCFunction)peer_close, METH_NOARGS,
     "close(): fail the peer's pending operations and leave it."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef peer_getset[] = {
    {"path", (getter)peer_get_path, NULL,
     "The path the peer is on ('shm', 'verbs', 'ofi:tcp'), None before it is connected.", NULL},
    {"status", (getter)peer_get_status, NULL,
     "0 while the peer works, else the (negative) status its operations fail with.", NULL},
    {"left", (getter)peer_get_left, NULL,
     "Whether the peer said that it leaves (its side destroyed it, its world or its context), "
     "where a peer that died or stopped says nothing.",
     NULL},
    {"fabric", (getter)peer_get_fabric, NULL, "(backend, fabric, domain) of its path.", NULL},
    {"_context", (getter)peer_get_context, NULL, NULL, NULL},
    {"_id", (getter)peer_get_id, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject tfabpy_peer_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tfab.Peer",
    .tp_basicsize = sizeof(struct tfabpy_peer),
    .tp_dealloc = (destructor)peer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A peer of a context: from Context.accept(), connect() or peer() (blobs).",
    .tp_methods = peer_methods,
    .tp_getset = peer_getset,
};
