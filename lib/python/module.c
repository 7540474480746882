/*
 * The tfab._tfab extension module: its types (Context, Peer, Tensor, World, FutureBase), the
 * errors it raises (classes from tfab.errors) and the log sink, which remembers each thread's
 * last library error for the exception's text and hands every line to Python's logging
 * through a bounded queue (tfab/__init__.py's pump thread takes them).
 */
#include "tfabpy.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static PyObject *from_status; /* tfab.errors._from_status */

/*
 * The last error and the last warning the library logged, from any thread (a receive's failure
 * is often found by the progress thread): a call's exception quotes the error when one was
 * logged during the call, else the warning (a timeout, a peer's failure: they name the key,
 * step, peer address and path).
 */
static pthread_mutex_t last_lock = PTHREAD_MUTEX_INITIALIZER;
static char last_error[512], last_warn[512];
static unsigned long last_gen, warn_gen;
static _Thread_local unsigned long call_gen, call_warn_gen;

/*
 * The lines on their way to logging: the sink, on any of the library's threads, never takes
 * the GIL (a heartbeat must not wait for the interpreter); it copies the line here, or counts
 * it dropped when the queue is full. While nothing bridges (no handler configured, or the
 * interpreter is ending) the sink writes to stderr itself, as the library's default sink.
 */
#define QUEUE_LINES 512

struct queued_line {
	int level;
	char subsys[16];
	char msg[1024];
};

static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queue_cond = PTHREAD_COND_INITIALIZER;
static struct queued_line queue[QUEUE_LINES];
static unsigned queue_head, queue_len;
static unsigned long queue_dropped;
static bool bridging, bridge_stopped;

/* Whether the line went to the queue (or was dropped there): false, it is the caller's. */
static bool queue_put(enum tfab_log_level level, const char *subsys, const char *msg)
{
	bool taken;

	pthread_mutex_lock(&queue_lock);
	taken = bridging;
	if (taken && queue_len == QUEUE_LINES) {
		queue_dropped++;
	} else if (taken) {
		struct queued_line *l = &queue[(queue_head + queue_len++) % QUEUE_LINES];

		l->level = (int)level;
		snprintf(l->subsys, sizeof(l->subsys), "%s", subsys);
		snprintf(l->msg, sizeof(l->msg), "%s", msg);
		pthread_cond_signal(&queue_cond);
	}
	pthread_mutex_unlock(&queue_lock);
	return taken;
}

static void log_sink(void *arg, enum tfab_log_level level, const char *subsys, const char *msg)
{
	(void)arg;
	if (level == TFAB_LOG_ERROR) {
		pthread_mutex_lock(&last_lock);
		snprintf(last_error, sizeof(last_error), "%s", msg);
		last_gen++;
		pthread_mutex_unlock(&last_lock);
	} else if (level == TFAB_LOG_WARN) {
		pthread_mutex_lock(&last_lock);
		snprintf(last_warn, sizeof(last_warn), "%s", msg);
		warn_gen++;
		pthread_mutex_unlock(&last_lock);
	}
	if (queue_put(level, subsys, msg))
		return;
	/* The default sink's format: the library's messages look the same from Python. */
	fprintf(stderr, "tfab %s [%s]: %s\n", tfab_log_level_name(level), subsys, msg);
}

/* _log_bridge(on): lines to the queue (True) or to stderr (False); nothing once stopped. */
static PyObject *py_log_bridge(PyObject *self, PyObject *arg)
{
	int on = PyObject_IsTrue(arg);

	(void)self;
	if (on < 0)
		return NULL;
	pthread_mutex_lock(&queue_lock);
	bridging = on && !bridge_stopped;
	pthread_mutex_unlock(&queue_lock);
	Py_RETURN_NONE;
}

/*
 * _log_take(timeout) -> ([(level, subsys, msg), ...], dropped so far), waiting with the GIL
 * released up to timeout seconds (None: until a line comes) for one; None once stopped and
 * empty.
 */
static PyObject *py_log_take(PyObject *self, PyObject *arg)
{
	struct queued_line *lines = malloc(sizeof(queue));
	double timeout = arg == Py_None ? -1.0 : PyFloat_AsDouble(arg);
	unsigned n = 0, dropped_n;
	unsigned long dropped;
	bool stopped;
	PyObject *list;
	struct timespec until;

	(void)self;
	if (!lines)
		return PyErr_NoMemory();
	if (timeout == -1.0 && PyErr_Occurred()) {
		free(lines);
		return NULL;
	}
	clock_gettime(CLOCK_REALTIME, &until);
	if (timeout >= 0) {
		until.tv_sec += (time_t)timeout;
		until.tv_nsec += (long)((timeout - (double)(time_t)timeout) * 1e9);
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
	}
	Py_BEGIN_ALLOW_THREADS;
	pthread_mutex_lock(&queue_lock);
	while (!queue_len && !bridge_stopped) {
		if (timeout < 0)
			pthread_cond_wait(&queue_cond, &queue_lock);
		else if (pthread_cond_timedwait(&queue_cond, &queue_lock, &until) == ETIMEDOUT)
			break;
	}
	for (; queue_len; queue_len--, queue_head = (queue_head + 1) % QUEUE_LINES)
		lines[n++] = queue[queue_head];
	dropped = queue_dropped;
	stopped = bridge_stopped;
	/* the lock is let go before the GIL is taken back: a thread may end there at exit */
	pthread_mutex_unlock(&queue_lock);
	Py_END_ALLOW_THREADS;
	dropped_n = (unsigned)dropped;
	if (!n && stopped) {
		free(lines);
		Py_RETURN_NONE;
	}
	list = PyList_New(n);
	for (unsigned i = 0; list && i < n; i++) {
		PyObject *t = Py_BuildValue("(iss)", lines[i].level, lines[i].subsys, lines[i].msg);

		if (!t) {
			Py_CLEAR(list);
			break;
		}
		PyList_SET_ITEM(list, i, t);
	}
	free(lines);
	return list ? Py_BuildValue("(NI)", list, dropped_n) : NULL;
}

/* _log_stop(): lines to stderr from now on, and _log_take returns None once it has all. */
static PyObject *py_log_stop(PyObject *self, PyObject *unused)
{
	(void)self;
	(void)unused;
	pthread_mutex_lock(&queue_lock);
	bridging = false;
	bridge_stopped = true;
	pthread_cond_broadcast(&queue_cond);
	pthread_mutex_unlock(&queue_lock);
	Py_RETURN_NONE;
}

/* _log_level(level=None) -> the library's level (0 none .. 5 trace), set first if given. */
static PyObject *py_log_level(PyObject *self, PyObject *args)
{
	int level = -1;

	(void)self;
	if (!PyArg_ParseTuple(args, "|i:_log_level", &level))
		return NULL;
	if (level > TFAB_LOG_TRACE) {
		PyErr_Format(PyExc_ValueError, "tfab: log level %d is not 0..5", level);
		return NULL;
	}
	if (level >= 0)
		tfab_log_set_level((enum tfab_log_level)level);
	return PyLong_FromLong((long)tfab_log_get_level());
}

void tfabpy_log_init(void)
{
	tfab_log_set_sink(log_sink, NULL);
}

void tfabpy_clear_last_error(void)
{
	pthread_mutex_lock(&last_lock);
	call_gen = last_gen;
	call_warn_gen = warn_gen;
	pthread_mutex_unlock(&last_lock);
}

PyObject *tfabpy_raise(int status, const char *what)
{
	PyObject *exc;

	char logged[sizeof(last_error)] = "";

	pthread_mutex_lock(&last_lock);
	if (last_gen != call_gen)
		snprintf(logged, sizeof(logged), "%s", last_error);
	else if (warn_gen != call_warn_gen)
		snprintf(logged, sizeof(logged), "%s", last_warn);
	pthread_mutex_unlock(&last_lock);
	exc = PyObject_CallFunction(from_status, "iss", status, what ? what : "", logged);
	if (!exc)
		return NULL;
	PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
	Py_DECREF(exc);
	return NULL;
}

int tfabpy_errors_init(PyObject *module)
{
	PyObject *errors = PyImport_ImportModule("tfab.errors");

	(void)module;
	if (!errors)
		return -1;
	from_status = PyObject_GetAttrString(errors, "_from_status");
	Py_DECREF(errors);
	return from_status ? 0 : -1;
}

static PyObject *py_strerror(PyObject *self, PyObject *arg)
{
	long status = PyLong_AsLong(arg);

	(void)self;
	if (status == -1 && PyErr_Occurred())
		return NULL;
	return PyUnicode_FromString(tfab_strerror((int)status));
}

static PyObject *py_version(PyObject *self, PyObject *unused)
{
	(void)self;
	(void)unused;
	return PyUnicode_FromString(tfab_version());
}

static PyObject *py_settings(PyObject *self, PyObject *unused)
{
	size_t n = tfab_setting_count();
	PyObject *list = PyList_New(0);

	(void)self;
	(void)unused;
	if (!list)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		struct tfab_setting_info info;
		PyObject *row;

		if (tfab_setting_get(i, &info))
			continue;
		row = Py_BuildValue("(sss)", info.name, info.dflt, info.help);
		if (!row || PyList_Append(list, row)) {
			Py_XDECREF(row);
			Py_DECREF(list);
			return NULL;
		}
		Py_DECREF(row);
	}
	return list;
}

static PyMethodDef module_methods[] = {
    {"strerror", py_strerror, METH_O, "strerror(status) -> str: the library's text for a status."},
    {"version", py_version, METH_NOARGS, "version() -> str: the C library's version."},
    {"settings", py_settings, METH_NOARGS,
     "settings() -> list of (name, default, help): every TFAB_* setting."},
    {"_log_bridge", py_log_bridge, METH_O,
     "_log_bridge(on): the library's log lines to the queue for logging, or to stderr."},
    {"_log_take", py_log_take, METH_O,
     "_log_take(timeout) -> (lines, dropped) or None: the queued log lines."},
    {"_log_stop", py_log_stop, METH_NOARGS,
     "_log_stop(): log lines to stderr from now on; _log_take ends once it has all."},
    {"_log_level", py_log_level, METH_VARARGS,
     "_log_level(level=None) -> int: the library's log level, set first if given."},
    {"copy_into", tfabpy_copy_into, METH_VARARGS,
     "copy_into(dst, src): src's content into dst, of the same dtype and shape, on the CPU."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "tfab._tfab",
    "The C part of tfab: contexts, peers, received tensors and worlds over libtfab.",
    -1,
    module_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__tfab(void);

PyMODINIT_FUNC PyInit__tfab(void)
{
	PyObject *m;

	if (PyType_Ready(&tfabpy_context_type) < 0 || PyType_Ready(&tfabpy_peer_type) < 0 ||
	    PyType_Ready(&tfabpy_tensor_type) < 0 || PyType_Ready(&tfabpy_world_type) < 0)
		return NULL;
	m = PyModule_Create(&module_def);
	if (!m)
		return NULL;
	if (tfabpy_errors_init(m) < 0 || tfabpy_future_init(m) < 0)
		goto err;
	Py_INCREF(&tfabpy_context_type);
	if (PyModule_AddObject(m, "Context", (PyObject *)&tfabpy_context_type) < 0)
		goto err;
	Py_INCREF(&tfabpy_peer_type);
	if (PyModule_AddObject(m, "Peer", (PyObject *)&tfabpy_peer_type) < 0)
		goto err;
	Py_INCREF(&tfabpy_tensor_type);
	if (PyModule_AddObject(m, "Tensor", (PyObject *)&tfabpy_tensor_type) < 0)
		goto err;
	Py_INCREF(&tfabpy_world_type);
	if (PyModule_AddObject(m, "World", (PyObject *)&tfabpy_world_type) < 0)
		goto err;
	if (PyModule_AddIntConstant(m, "MAX_KEY_LEN", TFAB_MAX_KEY_LEN) < 0)
		goto err;
	tfabpy_log_init();
	return m;
err:
	Py_DECREF(m);
	return NULL;
}
