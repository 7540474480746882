/*
 * The tfab._tfab extension module: its types (Context, Peer, Tensor, World, FutureBase), the
 * errors it
 * raises (classes from tfab.errors) and the log sink that remembers each thread's last library
 * error for the exception's text.
 */
#include "tfabpy.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

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
	/* The default sink's format: the library's messages look the same from Python. */
	fprintf(stderr, "tfab %s [%s]: %s\n", tfab_log_level_name(level), subsys, msg);
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
