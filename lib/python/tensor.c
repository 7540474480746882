/*
 * Received tensors (tfab._tfab.Tensor) and DLPack in both directions: a Tensor hands out
 * capsules whose tensors keep it alive, and returns the library's memory to its pool when the
 * last view is gone; tfabpy_dlpack_import takes a tensor from anything with __dlpack__ or, for
 * what DLPack 0.6 cannot say (NumPy's bool), from the buffer protocol.
 */
#include "tfabpy.h"

#include <stdlib.h>
#include <string.h>

/* DLPack 0.8's kDLBool: the header here is older, the value is the same. */
#define TFABPY_DL_BOOL 6

/* A view handed to a DLPack consumer: keeps the Tensor alive until the consumer's deleter. */
struct export
{
	DLManagedTensor m;
	PyObject *tensor;
};

static void export_deleter(DLManagedTensor *m)
{
	struct export *e = m->manager_ctx;
	PyGILState_STATE g = PyGILState_Ensure();

	Py_DECREF(e->tensor);
	free(e);
	PyGILState_Release(g);
}

/* A capsule nobody consumed (still "dltensor") owns its tensor. */
static void capsule_destructor(PyObject *cap)
{
	DLManagedTensor *m;

	if (!PyCapsule_IsValid(cap, "dltensor"))
		return;
	m = PyCapsule_GetPointer(cap, "dltensor");
	if (m && m->deleter)
		m->deleter(m);
}

PyObject *tfabpy_tensor_new(struct tfabpy_context *owner, DLManagedTensor *m, PyObject *base)
{
	struct tfabpy_tensor *t = PyObject_GC_New(struct tfabpy_tensor, &tfabpy_tensor_type);

	if (!t) {
		{
			PyThreadState *ts = PyEval_SaveThread();

			m->deleter(m);
			PyEval_RestoreThread(ts);
		}
		if (owner)
			tfabpy_context_tensor_gone(owner);
		return NULL;
	}
	t->m = m;
	t->owner = owner;
	Py_XINCREF(owner);
	t->base = base;
	Py_XINCREF(base);
	t->weakrefs = NULL;
	PyObject_GC_Track(t);
	return (PyObject *)t;
}

static int tensor_traverse(struct tfabpy_tensor *t, visitproc visit, void *arg)
{
	Py_VISIT(t->owner);
	Py_VISIT(t->base);
	return 0;
}

static void tensor_dealloc(struct tfabpy_tensor *t)
{
	DLManagedTensor *m = t->m;

	PyObject_GC_UnTrack(t);
	if (t->weakrefs)
		PyObject_ClearWeakRefs((PyObject *)t);
	t->m = NULL;
	if (m && m->deleter) {
		{
			PyThreadState *ts = PyEval_SaveThread();

			m->deleter(m);
			PyEval_RestoreThread(ts);
		}
	}
	if (t->owner) {
		tfabpy_context_tensor_gone(t->owner);
		Py_CLEAR(t->owner);
	}
	Py_CLEAR(t->base);
	PyObject_GC_Del(t);
}

static PyObject *tensor_dlpack(struct tfabpy_tensor *t, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"stream", NULL};
	PyObject *stream = Py_None, *cap;
	struct export *e;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:__dlpack__", kwlist, &stream))
		return NULL;
	e = calloc(1, sizeof(*e));
	if (!e)
		return PyErr_NoMemory();
	e->m.dl_tensor = t->m->dl_tensor;
	e->m.manager_ctx = e;
	e->m.deleter = export_deleter;
	e->tensor = (PyObject *)t;
	Py_INCREF(t);
	cap = PyCapsule_New(&e->m, "dltensor", capsule_destructor);
	if (!cap) {
		Py_DECREF(t);
		free(e);
	}
	return cap;
}

static PyObject *tensor_dlpack_device(struct tfabpy_tensor *t, PyObject *unused)
{
	(void)unused;
	return Py_BuildValue("(ii)", (int)t->m->dl_tensor.device.device_type,
			     (int)t->m->dl_tensor.device.device_id);
}

static PyObject *tensor_get_dtype(struct tfabpy_tensor *t, void *closure)
{
	char buf[TFAB_DTYPE_NAME_MAX];

	(void)closure;
	return PyUnicode_FromString(tfab_dtype_name(t->m->dl_tensor.dtype, buf, sizeof(buf)));
}

static PyObject *tensor_get_shape(struct tfabpy_tensor *t, void *closure)
{
	const DLTensor *d = &t->m->dl_tensor;
	PyObject *shape = PyTuple_New(d->ndim);

	(void)closure;
	if (!shape)
		return NULL;
	for (int i = 0; i < d->ndim; i++) {
		PyObject *v = PyLong_FromLongLong(d->shape[i]);

		if (!v) {
			Py_DECREF(shape);
			return NULL;
		}
		PyTuple_SET_ITEM(shape, i, v);
	}
	return shape;
}

static uint64_t tensor_nbytes(const DLTensor *d)
{
	uint64_t n = ((uint64_t)d->dtype.bits * d->dtype.lanes + 7) / 8;

	for (int i = 0; i < d->ndim; i++)
		n *= (uint64_t)d->shape[i];
	return n;
}

static PyObject *tensor_get_nbytes(struct tfabpy_tensor *t, void *closure)
{
	(void)closure;
	return PyLong_FromUnsignedLongLong(tensor_nbytes(&t->m->dl_tensor));
}

static PyObject *tensor_get_data_ptr(struct tfabpy_tensor *t, void *closure)
{
	(void)closure;
	return PyLong_FromVoidPtr((char *)t->m->dl_tensor.data + t->m->dl_tensor.byte_offset);
}

static PyObject *tensor_get_ndim(struct tfabpy_tensor *t, void *closure)
{
	(void)closure;
	return PyLong_FromLong(t->m->dl_tensor.ndim);
}

/*
 * NumPy's array interface, zero copy as DLPack is, for what NumPy 1.24's from_dlpack refuses
 * (bool): numpy.asarray(tensor) is a view that keeps the tensor alive.
 */
static PyObject *tensor_get_array_interface(struct tfabpy_tensor *t, void *closure)
{
	const DLTensor *d = &t->m->dl_tensor;
	char typestr[16];
	char kind;
	PyObject *shape, *res;

	(void)closure;
	if (d->device.device_type != kDLCPU && d->device.device_type != kDLCUDAHost) {
		PyErr_SetString(PyExc_AttributeError, "not a CPU tensor: no __array_interface__");
		return NULL;
	}
	switch (d->dtype.code) {
	case kDLInt:
		kind = 'i';
		break;
	case kDLUInt:
		kind = 'u';
		break;
	case kDLFloat:
		kind = 'f';
		break;
	case kDLComplex:
		kind = 'c';
		break;
	case TFABPY_DL_BOOL:
		kind = 'b';
		break;
	default:
		PyErr_SetString(PyExc_AttributeError,
				"NumPy has no such dtype (bfloat16: use torch.from_dlpack)");
		return NULL;
	}
	if (d->dtype.lanes != 1) {
		PyErr_SetString(PyExc_AttributeError, "vector dtypes have no NumPy equivalent");
		return NULL;
	}
	snprintf(typestr, sizeof(typestr), "%c%c%u", d->dtype.bits == 8 ? '|' : '<', kind,
		 (unsigned)d->dtype.bits / 8);
	shape = tensor_get_shape(t, NULL);
	if (!shape)
		return NULL;
	res = Py_BuildValue("{s:N,s:s,s:(N,O),s:O,s:i}", "shape", shape, "typestr", typestr, "data",
			    PyLong_FromVoidPtr((char *)d->data + d->byte_offset), Py_False,
			    "strides", Py_None, "version", 3);
	return res;
}

static PyObject *tensor_numpy(struct tfabpy_tensor *t, PyObject *unused)
{
	PyObject *np, *res;

	(void)unused;
	np = PyImport_ImportModule("numpy");
	if (!np)
		return NULL;
	res = PyObject_CallMethod(np, "asarray", "O", (PyObject *)t);
	Py_DECREF(np);
	return res;
}

static PyObject *tensor_repr(struct tfabpy_tensor *t)
{
	PyObject *shape = tensor_get_shape(t, NULL), *dtype = tensor_get_dtype(t, NULL), *r = NULL;

	if (shape && dtype)
		r = PyUnicode_FromFormat("tfab.Tensor(shape=%R, dtype=%S)", shape, dtype);
	Py_XDECREF(shape);
	Py_XDECREF(dtype);
	return r;
}

static PyMethodDef tensor_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))tensor_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(stream=None) -> capsule: a DLPack view of the received memory; the tensor "
     "stays alive until its consumer lets it go."},
    {"__dlpack_device__", (PyCFunction)tensor_dlpack_device, METH_NOARGS,
     "__dlpack_device__() -> (device_type, device_id)"},
    {"numpy", (PyCFunction)tensor_numpy, METH_NOARGS,
     "numpy() -> numpy.ndarray: a view (no copy) of the received memory, any NumPy dtype "
     "(bool too, which NumPy 1.24's from_dlpack refuses)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef tensor_getset[] = {
    {"shape", (getter)tensor_get_shape, NULL, "The shape, a tuple of ints.", NULL},
    {"dtype", (getter)tensor_get_dtype, NULL,
     "NumPy's name of the dtype ('float32', 'bool', 'bfloat16').", NULL},
    {"ndim", (getter)tensor_get_ndim, NULL, "Number of dimensions.", NULL},
    {"nbytes", (getter)tensor_get_nbytes, NULL, "Bytes of content.", NULL},
    {"data_ptr", (getter)tensor_get_data_ptr, NULL, "Address of the first element.", NULL},
    {"__array_interface__", (getter)tensor_get_array_interface, NULL, "NumPy's array interface.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject tfabpy_tensor_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tfab.Tensor",
    .tp_basicsize = sizeof(struct tfabpy_tensor),
    .tp_dealloc = (destructor)tensor_dealloc,
    .tp_repr = (reprfunc)tensor_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A received tensor in the library's registered memory. numpy.from_dlpack(t), "
	      "torch.from_dlpack(t) and t.numpy() are views of it, no copy; the memory goes back "
	      "to the pool when the tensor and the last view are gone.",
    .tp_traverse = (traverseproc)tensor_traverse,
    .tp_weaklistoffset = offsetof(struct tfabpy_tensor, weakrefs),
    .tp_methods = tensor_methods,
    .tp_getset = tensor_getset,
};

bool tfabpy_is_compact(const DLTensor *t)
{
	int64_t want = 1;

	if (!t->strides)
		return true;
	for (int i = t->ndim - 1; i >= 0; i--) {
		/* A dimension of one (or an empty tensor) may have any stride. */
		if (t->shape[i] != 1 && t->strides[i] != want)
			return t->shape[i] == 0;
		want *= t->shape[i];
	}
	return true;
}

/* A tensor over a Py_buffer, for objects DLPack 0.6 cannot export (NumPy's bool). */
struct buffer_tensor {
	DLManagedTensor m;
	Py_buffer view;
	int64_t shape[];
};

static void buffer_deleter(DLManagedTensor *m)
{
	struct buffer_tensor *b = m->manager_ctx;
	PyGILState_STATE g = PyGILState_Ensure();

	PyBuffer_Release(&b->view);
	free(b);
	PyGILState_Release(g);
}

static int buffer_dtype(const Py_buffer *v, DLDataType *d)
{
	const char *f = v->format ? v->format : "B";
	uint8_t code;

	if (*f == '<' || *f == '=' || *f == '@' || *f == '|')
		f++;
	if (strcmp(f, "?") == 0)
		code = TFABPY_DL_BOOL;
	else if (strlen(f) == 1 && strchr("bhilqn", *f))
		code = kDLInt;
	else if (strlen(f) == 1 && strchr("BHILQN", *f))
		code = kDLUInt;
	else if (strcmp(f, "e") == 0 || strcmp(f, "f") == 0 || strcmp(f, "d") == 0)
		code = kDLFloat;
	else if (strcmp(f, "Zf") == 0 || strcmp(f, "Zd") == 0)
		code = kDLComplex;
	else
		return -1;
	d->code = code;
	d->bits = (uint8_t)(v->itemsize * 8);
	d->lanes = 1;
	return 0;
}

/* The error for a destination that cannot be written: what names it, and why. */
static void refuse_read_only(const char *what, PyObject *obj, const char *why)
{
	PyErr_Format(PyExc_ValueError,
		     "tfab: %s is read-only (%.200s%s%s): the destination of a receive or of a "
		     "collective must be writable; nothing was posted",
		     what, Py_TYPE(obj)->tp_name, why ? ": " : "", why ? why : "");
}

/*
 * A Py_buffer of obj: writable when want_writable (what, for the error: "out="), else a
 * read-only one may do (a source).
 */
/* What a buffer format the binding cannot take is, in NumPy's words where it has them. */
static const char *format_name(const char *format)
{
	const char *f = format ? format : "B";

	if (*f == '<' || *f == '>' || *f == '=' || *f == '@' || *f == '|' || *f == '!')
		f++;
	if (*f == 'w' || (*f >= '0' && *f <= '9' && strchr(f, 'w')))
		return "dtype str (NumPy's U: encode it to bytes)";
	if (*f == 'O')
		return "dtype object";
	if (strcmp(f, "g") == 0)
		return "dtype longdouble";
	if (strcmp(f, "Zg") == 0)
		return "dtype clongdouble";
	if (*f == 'T')
		return "a structured dtype";
	if (*f == 's' || (*f >= '0' && *f <= '9' && strchr(f, 's')))
		return "dtype bytes (NumPy's S: send it as a string tensor)";
	return "this dtype";
}

static int import_buffer(PyObject *obj, const char *what, bool want_writable, DLManagedTensor **m_p)
{
	struct buffer_tensor *b;
	Py_buffer view;
	int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT;

	if (PyObject_GetBuffer(obj, &view, flags | PyBUF_WRITABLE) < 0) {
		/* BufferError from bytes, ValueError from NumPy: asked again, the cause shows */
		PyErr_Clear();
		if (PyObject_GetBuffer(obj, &view, flags) < 0)
			return -1;
		if (want_writable) {
			/* It exports, but only for reading: never write into it. */
			PyBuffer_Release(&view);
			refuse_read_only(what, obj, NULL);
			return -1;
		}
	}
	b = calloc(1, sizeof(*b) + sizeof(int64_t) * (size_t)(view.ndim ? view.ndim : 1));
	if (!b) {
		PyBuffer_Release(&view);
		PyErr_NoMemory();
		return -1;
	}
	b->view = view;
	if (buffer_dtype(&view, &b->m.dl_tensor.dtype) < 0) {
		PyErr_Format(PyExc_TypeError,
			     "tfab: %s has no DLPack equivalent (buffer format '%s'): it cannot be "
			     "sent or received",
			     format_name(view.format), view.format ? view.format : "B");
		PyBuffer_Release(&b->view);
		free(b);
		return -1;
	}
	for (int i = 0; i < view.ndim; i++)
		b->shape[i] = view.shape ? view.shape[i] : view.len / view.itemsize;
	b->m.dl_tensor.data = view.buf;
	b->m.dl_tensor.device.device_type = kDLCPU;
	b->m.dl_tensor.ndim = view.ndim;
	b->m.dl_tensor.shape = b->shape;
	b->m.manager_ctx = b;
	b->m.deleter = buffer_deleter;
	*m_p = &b->m;
	return 0;
}

/* Whether the exception set says that an exporter refused to export read-only memory. */
static bool refused_read_only(void)
{
	PyObject *type, *value, *tb, *text;
	bool yes = false;

	if (!PyErr_ExceptionMatches(PyExc_BufferError))
		return false;
	PyErr_Fetch(&type, &value, &tb);
	text = value ? PyObject_Str(value) : NULL;
	if (text) {
		const char *s = PyUnicode_AsUTF8(text);

		yes = s && (strstr(s, "readonly") || strstr(s, "read-only"));
		Py_DECREF(text);
	}
	PyErr_Clear();
	PyErr_Restore(type, value, tb);
	return yes;
}

int tfabpy_dlpack_import(PyObject *obj, const char *dest, DLManagedTensor **m_p)
{
	PyObject *cap;
	DLManagedTensor *m;

	if (!PyObject_HasAttrString(obj, "__dlpack__")) {
		if (PyObject_CheckBuffer(obj)) {
			if (import_buffer(obj, dest, dest != NULL, m_p) == 0)
				return 0;
			/* A read-only destination, or a format without a dtype: that error. */
			if (!PyErr_ExceptionMatches(PyExc_BufferError))
				return -1;
		}
		PyErr_Clear();
		PyErr_Format(PyExc_TypeError,
			     "tfab: expected a tensor with __dlpack__ (a NumPy array, a torch "
			     "tensor), got %.200s",
			     Py_TYPE(obj)->tp_name);
		return -1;
	}
	cap = PyObject_CallMethod(obj, "__dlpack__", NULL);
	if (!cap) {
		/*
		 * NumPy 1.24 exports no bool through DLPack 0.6, nor a read-only array (DLPack
		 * cannot say read-only): its buffer says it all, and whether it may be written.
		 */
		if (PyErr_ExceptionMatches(PyExc_BufferError) && PyObject_CheckBuffer(obj)) {
			PyObject *type, *value, *tb;

			PyErr_Fetch(&type, &value, &tb);
			if (import_buffer(obj, dest, dest != NULL, m_p) == 0) {
				Py_XDECREF(type);
				Py_XDECREF(value);
				Py_XDECREF(tb);
				return 0;
			}
			if (!PyErr_ExceptionMatches(PyExc_BufferError)) {
				/* read-only, or no dtype: says more than the exporter's refusal */
				Py_XDECREF(type);
				Py_XDECREF(value);
				Py_XDECREF(tb);
				return -1;
			}
			PyErr_Clear();
			PyErr_Restore(type, value, tb);
		} else if (dest && refused_read_only()) {
			PyObject *type, *value, *tb, *text;

			PyErr_Fetch(&type, &value, &tb);
			PyErr_NormalizeException(&type, &value, &tb);
			text = value ? PyObject_Str(value) : NULL;
			refuse_read_only(dest, obj, text ? PyUnicode_AsUTF8(text) : NULL);
			Py_XDECREF(text);
			Py_XDECREF(type);
			Py_XDECREF(value);
			Py_XDECREF(tb);
		}
		return -1;
	}
	m = PyCapsule_GetPointer(cap, "dltensor");
	if (!m) {
		Py_DECREF(cap);
		return -1;
	}
	/* Consumed: the capsule's destructor leaves it to us now. */
	if (PyCapsule_SetName(cap, "used_dltensor") < 0) {
		Py_DECREF(cap);
		return -1;
	}
	Py_DECREF(cap);
	*m_p = m;
	return 0;
}

/* A tensor's shape for messages: "[2,8]". */
static const char *shape_text(const DLTensor *t, char *buf, size_t len)
{
	size_t n = (size_t)snprintf(buf, len, "[");

	for (int i = 0; i < t->ndim && n < len; i++)
		n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? "," : "",
				      (long long)t->shape[i]);
	if (n < len)
		snprintf(buf + n, len - n, "]");
	return buf;
}

/*
 * copy_into(dst, src): src's content into dst, of the same dtype and shape, both on the CPU:
 * for a receive into out= that finds its tensor taken by an earlier receive, interrupted, into
 * another array. Nothing is written unless all fits.
 */
PyObject *tfabpy_copy_into(PyObject *self, PyObject *args)
{
	PyObject *dstobj, *srcobj;
	DLManagedTensor *dst = NULL, *src = NULL;
	const DLTensor *d, *s;
	PyObject *res = NULL;
	char a[TFAB_DTYPE_NAME_MAX], b[TFAB_DTYPE_NAME_MAX];

	(void)self;
	if (!PyArg_ParseTuple(args, "OO:copy_into", &dstobj, &srcobj))
		return NULL;
	if (tfabpy_dlpack_import(dstobj, "out=", &dst) < 0 ||
	    tfabpy_dlpack_import(srcobj, NULL, &src) < 0)
		goto out;
	d = &dst->dl_tensor;
	s = &src->dl_tensor;
	if (d->dtype.code != s->dtype.code || d->dtype.bits != s->dtype.bits ||
	    d->dtype.lanes != s->dtype.lanes || d->ndim != s->ndim ||
	    (d->ndim && memcmp(d->shape, s->shape, sizeof(int64_t) * (size_t)d->ndim))) {
		char ds[160], ss[160];

		PyErr_Format(
		    PyExc_ValueError, "tfab: out= (%s%s) does not take the tensor received (%s%s)",
		    tfab_dtype_name(d->dtype, a, sizeof(a)), shape_text(d, ds, sizeof(ds)),
		    tfab_dtype_name(s->dtype, b, sizeof(b)), shape_text(s, ss, sizeof(ss)));
		goto out;
	}
	if (d->device.device_type != kDLCPU || s->device.device_type != kDLCPU ||
	    !tfabpy_is_compact(d) || !tfabpy_is_compact(s)) {
		PyErr_SetString(PyExc_ValueError,
				"tfab: out= must be contiguous and on the CPU to take a copy");
		goto out;
	}
	memcpy((char *)d->data + d->byte_offset, (const char *)s->data + s->byte_offset,
	       (size_t)tensor_nbytes(s));
	res = Py_None;
	Py_INCREF(res);
out:
	if (dst)
		dst->deleter(dst);
	if (src)
		src->deleter(src);
	return res;
}
