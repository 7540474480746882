/*
 * tfab._tfab.World: a world of ranks on a context (tfab_world_join) and its collectives. The
 * join and every wait run with the GIL released; the application's allgather (a Python
 * callable) and each collective's completion take it, on whichever thread calls them. A
 * collective keeps its tensors (the exporters' DLManagedTensors), its key and the world alive
 * until its completion; nothing is copied: the library reads and writes the caller's memory.
 */
#include "tfabpy.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/*
 * A call into the library with the GIL released: the world and its context are counted busy.
 * BUSY after the checks (world_usable) that ENTER makes first.
 */
#define BUSY(W)                            \
	do {                               \
		(W)->busy++;               \
		(W)->owner->busy++;        \
		tfabpy_clear_last_error(); \
	} while (0)
#define ENTER(W)                      \
	do {                          \
		if (!world_usable(W)) \
			return NULL;  \
		BUSY(W);              \
	} while (0)
#define LEAVE(W) ((W)->busy--, (W)->owner->busy--)

static bool world_usable(struct tfabpy_world *self)
{
	if (!self->w) {
		PyErr_SetString(PyExc_ValueError,
				"tfab: the world was left (or its context closed)");
		return false;
	}
	return tfabpy_context_usable(self->owner);
}

/* Leaves w (no collective in flight, not inside a callback); the GIL released. */
static int world_leave_now(struct tfab_world *w)
{
	PyThreadState *ts = PyEval_SaveThread();
	int rc = tfab_world_leave(w);

	PyEval_RestoreThread(ts);
	return rc;
}

/* The context's world, left by a World that went inside a callback: leave it now. */
static void leave_parked(struct tfabpy_context *c)
{
	if (c->world && !c->world_obj && !tfabpy_in_callback && c->ctx) {
		if (world_leave_now(c->world) == 0)
			c->world = NULL;
	}
}

void tfabpy_world_context_closing(struct tfabpy_context *c)
{
	struct tfab_world *w = c->world;
	struct tfabpy_world *self = c->world_obj;

	if (!w)
		return;
	if (self)
		self->w = NULL;
	c->world_obj = NULL;
	c->world = NULL;
	/*
	 * Inside a callback the world is still running it: it is left behind (the context's
	 * destruction closes its peers).
	 */
	if (tfabpy_in_callback || !c->ctx)
		return;
	{
		PyThreadState *ts = PyEval_SaveThread();

		/* Aborted: what is in flight ends at once, each callback taking the GIL. */
		tfab_world_wait(w, 10000);
		tfab_world_leave(w);
		PyEval_RestoreThread(ts);
	}
}

/* The application's allgather, called inside tfab_world_join (GIL released). */
struct gather {
	PyObject *fn;
	PyObject *type, *value, *tb; /* what it raised, raised again by the join */
};

/*
 * The world's size, from this rank's record (world.c's rec_pack, doc/world.md: magic, 4
 * bytes; version, 2; rank, 4; then the size, 4 in network order): how many entries the
 * callable must return. The record's version 1; a new layout would change this.
 */
static uint32_t record_size(const uint8_t *rec)
{
	return (uint32_t)rec[10] << 24 | (uint32_t)rec[11] << 16 | (uint32_t)rec[12] << 8 |
	       (uint32_t)rec[13];
}

static int gather_call(const void *mine, void *all, size_t len, void *arg)
{
	struct gather *g = arg;
	PyGILState_STATE st = PyGILState_Ensure();
	uint32_t size = record_size(mine);
	PyObject *res, *seq = NULL;
	int rc = -EINVAL;

	res = PyObject_CallFunction(g->fn, "y#", (const char *)mine, (Py_ssize_t)len);
	if (!res) {
		rc = -ECANCELED;
		goto out;
	}
	seq = PySequence_Fast(res, "tfab: allgather= must return a list of bytes, one per rank");
	if (!seq)
		goto out;
	if (PySequence_Fast_GET_SIZE(seq) != (Py_ssize_t)size) {
		PyErr_Format(PyExc_ValueError,
			     "tfab: allgather= returned %zd entries for a world of %u ranks",
			     PySequence_Fast_GET_SIZE(seq), size);
		goto out;
	}
	for (uint32_t i = 0; i < size; i++) {
		Py_buffer b;

		if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, i), &b, PyBUF_SIMPLE) < 0)
			goto out;
		if ((size_t)b.len != len) {
			PyErr_Format(
			    PyExc_ValueError,
			    "tfab: allgather= entry %u has %zd bytes, not %zu: each rank's "
			    "bytes as it gave them, in rank order",
			    i, b.len, len);
			PyBuffer_Release(&b);
			goto out;
		}
		memcpy((uint8_t *)all + (size_t)i * len, b.buf, len);
		PyBuffer_Release(&b);
	}
	rc = 0;
out:
	if (rc && !g->type)
		PyErr_Fetch(&g->type, &g->value, &g->tb);
	PyErr_Clear();
	Py_XDECREF(seq);
	Py_XDECREF(res);
	PyGILState_Release(st);
	return rc;
}

static int world_init(struct tfabpy_world *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"context", "rank",	  "size",      "name",
				 "host",    "timeout_ms", "allgather", NULL};
	PyObject *ctxobj, *fn = Py_None;
	struct tfabpy_context *c;
	struct tfab_world_args a = {.rank = -1, .size = -1, .timeout_ms = -1};
	struct gather g = {0};
	struct tfab_world *w = NULL;
	int rc;

	if (self->owner) {
		PyErr_SetString(PyExc_RuntimeError, "tfab: world already initialised");
		return -1;
	}
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|iizziO:World", kwlist, &tfabpy_context_type,
					 &ctxobj, &a.rank, &a.size, &a.name, &a.host, &a.timeout_ms,
					 &fn))
		return -1;
	c = (struct tfabpy_context *)ctxobj;
	if (fn != Py_None && !PyCallable_Check(fn)) {
		PyErr_SetString(PyExc_TypeError, "tfab: allgather= takes a callable");
		return -1;
	}
	if (a.size == 0 || a.size < -1 || a.rank < -1 || (a.size > 0 && a.rank >= a.size)) {
		PyErr_Format(PyExc_ValueError, "tfab: rank %d of a world of %d", a.rank, a.size);
		return -1;
	}
	if (!tfabpy_context_usable(c))
		return -1;
	leave_parked(c);
	if (c->world) {
		PyErr_SetString(PyExc_ValueError,
				"tfab: the context has a world already (one per context): leave it "
				"first");
		return -1;
	}
	if (fn != Py_None) {
		g.fn = fn;
		a.allgather = gather_call;
		a.allgather_arg = &g;
	}
	c->busy++;
	tfabpy_clear_last_error();
	{
		PyThreadState *ts = PyEval_SaveThread();

		rc = tfab_world_join(c->ctx, &a, &w);
		PyEval_RestoreThread(ts);
	}
	c->busy--;
	if (rc) {
		if (g.type) {
			/* What the callable raised (or why its answer was refused) says more. */
			PyErr_Restore(g.type, g.value, g.tb);
			return -1;
		}
		tfabpy_raise(rc, "joining the world");
		return -1;
	}
	Py_XDECREF(g.type);
	Py_XDECREF(g.value);
	Py_XDECREF(g.tb);
	self->owner = c;
	Py_INCREF(c);
	self->w = w;
	tfabpy_link_init(&self->colls);
	c->world = w;
	c->world_obj = self;
	return 0;
}

static void world_dealloc(struct tfabpy_world *self)
{
	struct tfabpy_context *c = self->owner;

	if (self->weakrefs)
		PyObject_ClearWeakRefs((PyObject *)self);
	if (c && self->w) {
		/*
		 * Nothing in flight (each holds the world). Inside a callback the world is still
		 * running it: the context leaves it later.
		 */
		c->world_obj = NULL;
		if (!tfabpy_in_callback && world_leave_now(self->w) == 0)
			c->world = NULL;
		self->w = NULL;
	}
	Py_XDECREF(c);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

/*
 * tfab_world_wait in slices, each returning to run the signal handlers (Ctrl-C): 0 once the
 * collectives started before the call (those of sequence number seq or below) have called
 * back, or when the library found none in flight at all (leave's wait: all); else the
 * library's status, or -ETIMEDOUT at the deadline. -EINTR with an exception set.
 */
static int wait_sliced(struct tfabpy_world *self, uint64_t seq, bool all, uint64_t deadline)
{
	int rc;

	for (;;) {
		int slice = tfabpy_slice_ms(deadline);

		if (!world_usable(self))
			return -EINTR;
		BUSY(self);
		{
			PyThreadState *ts = PyEval_SaveThread();

			rc = tfab_world_wait(self->w, slice);
			PyEval_RestoreThread(ts);
		}
		LEAVE(self);
		if (rc == 0 ||
		    (rc == -ETIMEDOUT && !all && !tfabpy_link_pending(&self->colls, seq)))
			return 0;
		if (rc != -ETIMEDOUT || tfabpy_now_ns() >= deadline)
			return rc;
		if (PyErr_CheckSignals() < 0)
			return -EINTR;
	}
}

static PyObject *world_wait(struct tfabpy_world *self, PyObject *args)
{
	PyObject *timeout = Py_None;
	double seconds;
	int rc;

	if (!PyArg_ParseTuple(args, "|O:wait", &timeout) ||
	    tfabpy_timeout_seconds(timeout, &seconds) < 0)
		return NULL;
	rc = wait_sliced(self, self->colls_seq, false, tfabpy_deadline(seconds));
	if (rc == -EINTR)
		return NULL;
	if (rc)
		return tfabpy_raise(rc, "waiting for the world's collectives");
	Py_RETURN_NONE;
}

static PyObject *world_leave(struct tfabpy_world *self, PyObject *args)
{
	PyObject *timeout = Py_None;
	struct tfabpy_context *c = self->owner;
	double seconds;
	int rc;

	if (!PyArg_ParseTuple(args, "|O:leave", &timeout) ||
	    tfabpy_timeout_seconds(timeout, &seconds) < 0)
		return NULL;
	if (!self->w || !c || !c->ctx)
		Py_RETURN_NONE;
	if (tfabpy_in_callback) {
		PyErr_SetString(PyExc_RuntimeError,
				"tfab: a world cannot be left from a completion callback");
		return NULL;
	}
	if (self->busy) {
		PyErr_SetString(PyExc_RuntimeError,
				"tfab: another thread is in a call on this world");
		return NULL;
	}
	/* What is in flight first, in slices (Ctrl-C leaves the world joined, as a timeout). */
	rc = wait_sliced(self, self->colls_seq, true, tfabpy_deadline(seconds));
	if (rc == -EINTR)
		return NULL;
	if (rc == 0) {
		if (self->busy) {
			PyErr_SetString(PyExc_RuntimeError,
					"tfab: another thread is in a call on this world");
			return NULL;
		}
		ENTER(self);
		{
			PyThreadState *ts = PyEval_SaveThread();

			rc = tfab_world_wait(self->w, 0);
			if (rc == 0)
				rc = tfab_world_leave(self->w);
			PyEval_RestoreThread(ts);
		}
		LEAVE(self);
	}
	if (rc)
		return tfabpy_raise(rc, rc == -ETIMEDOUT ? "leave: collectives still in flight"
							 : "leave");
	self->w = NULL;
	c->world = NULL;
	c->world_obj = NULL;
	Py_RETURN_NONE;
}

static PyObject *world_name(struct tfabpy_world *self, PyObject *arg)
{
	long rank = PyLong_AsLong(arg);
	const char *name;

	if (rank == -1 && PyErr_Occurred())
		return NULL;
	if (!world_usable(self))
		return NULL;
	name = rank < INT_MIN || rank > INT_MAX ? NULL : tfab_world_name(self->w, (int)rank);
	if (!name)
		return PyErr_Format(PyExc_IndexError, "tfab: no rank %ld in a world of %d", rank,
				    tfab_world_size(self->w));
	return PyUnicode_FromString(name);
}

static PyObject *world_peer(struct tfabpy_world *self, PyObject *arg)
{
	long rank = PyLong_AsLong(arg);
	struct tfab_peer *peer;

	if (rank == -1 && PyErr_Occurred())
		return NULL;
	if (!world_usable(self))
		return NULL;
	if (rank < 0 || rank >= tfab_world_size(self->w))
		return PyErr_Format(PyExc_IndexError, "tfab: no rank %ld in a world of %d", rank,
				    tfab_world_size(self->w));
	peer = tfab_world_peer(self->w, (int)rank);
	if (!peer)
		Py_RETURN_NONE; /* this rank's own */
	return tfabpy_peer_of_world(self->owner, peer, (PyObject *)self);
}

/* A collective in flight: what it keeps alive until its completion. */
struct coll {
	struct tfabpy_world *world;
	PyObject *callback;
	PyObject *key;
	DLManagedTensor *in, *out; /* out NULL: in place */
	struct tfabpy_link link;   /* in world->colls once started */
};

static struct coll *coll_new(struct tfabpy_world *world, PyObject *callback)
{
	struct coll *co = calloc(1, sizeof(*co));

	if (!co) {
		PyErr_NoMemory();
		return NULL;
	}
	co->world = world;
	Py_INCREF(world);
	co->callback = callback;
	Py_INCREF(callback);
	return co;
}

static void coll_release_tensors(struct coll *co)
{
	if (co->in && co->in->deleter)
		co->in->deleter(co->in);
	if (co->out && co->out->deleter)
		co->out->deleter(co->out);
	co->in = co->out = NULL;
}

/* With the GIL; the last reference to the world may go here. */
static void coll_free(struct coll *co)
{
	tfabpy_link_del(&co->link);
	coll_release_tensors(co);
	Py_XDECREF(co->key);
	Py_DECREF(co->callback);
	Py_DECREF(co->world);
	free(co);
}

static void on_coll(void *arg, int status)
{
	struct coll *co = arg;
	PyGILState_STATE g = PyGILState_Ensure();
	PyObject *res;

	tfabpy_in_callback++;
	/* The tensors go first: the future's waiters may free what they point into. */
	coll_release_tensors(co);
	co->world->inflight--;
	res = PyObject_CallFunction(co->callback, "i", status);
	if (!res)
		PyErr_WriteUnraisable(co->callback);
	Py_XDECREF(res);
	coll_free(co);
	tfabpy_in_callback--;
	atomic_fetch_add_explicit(&tfabpy_completions, 1, memory_order_release);
	PyGILState_Release(g);
}

/*
 * A collective's tensor: imported through DLPack (or the buffer protocol), compact, on the CPU
 * or a CUDA GPU (the library takes that through host proxies, or says why it cannot); dest
 * names one the collective writes (it must be writable), NULL for one it only reads. The
 * caller owns *m_p. -1 with an exception set.
 */
static int coll_tensor(PyObject *obj, const char *what, const char *dest, DLManagedTensor **m_p)
{
	DLManagedTensor *m;

	if (tfabpy_dlpack_import(obj, dest, &m) < 0)
		return -1;
	if (m->dl_tensor.device.device_type != kDLCPU &&
	    m->dl_tensor.device.device_type != kDLCUDA) {
		m->deleter(m);
		PyErr_Format(PyExc_ValueError,
			     "tfab: %s takes CPU or CUDA tensors (device type %d)", what,
			     (int)m->dl_tensor.device.device_type);
		return -1;
	}
	if (!tfabpy_is_compact(&m->dl_tensor)) {
		m->deleter(m);
		PyErr_Format(PyExc_ValueError,
			     "tfab: %s takes contiguous (row-major) tensors; make one with "
			     "numpy.ascontiguousarray() or .contiguous()",
			     what);
		return -1;
	}
	*m_p = m;
	return 0;
}

static uint64_t nbytes_of(const DLTensor *t)
{
	uint64_t n = ((uint64_t)t->dtype.bits * t->dtype.lanes + 7) / 8;

	for (int i = 0; i < t->ndim; i++)
		n *= (uint64_t)t->shape[i];
	return n;
}

static bool same_dtype(const DLTensor *a, const DLTensor *b)
{
	return a->dtype.code == b->dtype.code && a->dtype.bits == b->dtype.bits &&
	       a->dtype.lanes == b->dtype.lanes;
}

/* A TypeError: out's dtype is not in's. */
static void dtype_differs(const char *what, const DLTensor *in, const DLTensor *out)
{
	char a[TFAB_DTYPE_NAME_MAX], b[TFAB_DTYPE_NAME_MAX];

	PyErr_Format(PyExc_TypeError, "tfab: %s's out= is %s, its input %s: both of one dtype",
		     what, tfab_dtype_name(out->dtype, b, sizeof(b)),
		     tfab_dtype_name(in->dtype, a, sizeof(a)));
}

/* out= of a reduction: in's dtype and element count, or -1 with the exception set. */
static int out_like_in(const char *what, const DLTensor *in, const DLTensor *out)
{
	if (!same_dtype(in, out)) {
		dtype_differs(what, in, out);
		return -1;
	}
	if (nbytes_of(in) != nbytes_of(out)) {
		PyErr_Format(PyExc_ValueError, "tfab: %s's out= has another number of elements",
			     what);
		return -1;
	}
	return 0;
}

/* The dtypes the library reduces: float16/32/64, bfloat16, int8 to int64, uint8 to uint64. */
static bool reducible(DLDataType d)
{
	if (d.lanes != 1)
		return false;
	if (d.code == kDLFloat)
		return d.bits == 16 || d.bits == 32 || d.bits == 64;
	if (d.code == kDLBfloat)
		return d.bits == 16;
	if (d.code == kDLInt || d.code == kDLUInt)
		return d.bits == 8 || d.bits == 16 || d.bits == 32 || d.bits == 64;
	return false;
}

static int check_reducible(const char *what, const DLTensor *t)
{
	char name[TFAB_DTYPE_NAME_MAX];

	if (reducible(t->dtype))
		return 0;
	PyErr_Format(PyExc_TypeError,
		     "tfab: %s reduces float16, bfloat16, float32, float64 and integer (int8 to "
		     "int64, uint8 to uint64) tensors, not %s",
		     what, tfab_dtype_name(t->dtype, name, sizeof(name)));
	return -1;
}

/* After the library refused a collective (its callback will not come). */
static PyObject *coll_failed(struct tfabpy_world *self, struct coll *co, int rc, const char *what)
{
	self->inflight--;
	coll_free(co);
	return tfabpy_raise(rc, what);
}

static int op_arg(int op)
{
	if (op < TFAB_OP_SUM || op > TFAB_OP_PROD) {
		PyErr_Format(PyExc_ValueError, "tfab: no reduction operation %d", op);
		return -1;
	}
	return 0;
}

static PyObject *world_allreduce(struct tfabpy_world *self, PyObject *args)
{
	PyObject *inobj, *outobj, *keyobj, *callback;
	int op, algo, compress, rc;
	struct tfab_coll_opts o = {0};
	DLManagedTensor *in = NULL, *out = NULL;
	struct coll *co;

	if (!PyArg_ParseTuple(args, "OOiiiOO:allreduce", &inobj, &outobj, &op, &algo, &compress,
			      &keyobj, &callback))
		return NULL;
	if (op_arg(op) < 0)
		return NULL;
	if (algo < TFAB_ALGO_AUTO || algo > TFAB_ALGO_DOUBLING || compress < TFAB_COMPRESS_NONE ||
	    compress > TFAB_COMPRESS_INT8)
		return PyErr_Format(PyExc_ValueError, "tfab: no algorithm %d or compression %d",
				    algo, compress);
	if (keyobj != Py_None && !PyUnicode_Check(keyobj) && !PyBytes_Check(keyobj))
		return PyErr_Format(PyExc_TypeError, "tfab: key= is str, bytes or None");
	if (!world_usable(self))
		return NULL;
	if (coll_tensor(inobj, "allreduce",
			outobj == Py_None ? "allreduce's tensor (reduced in place)" : NULL,
			&in) < 0)
		return NULL;
	if (outobj != Py_None && coll_tensor(outobj, "allreduce", "allreduce's out=", &out) < 0)
		goto err;
	if (check_reducible("allreduce", &in->dl_tensor) < 0)
		goto err;
	if (out && out_like_in("allreduce", &in->dl_tensor, &out->dl_tensor) < 0)
		goto err;
	co = coll_new(self, callback);
	if (!co)
		goto err;
	co->in = in;
	co->out = out;
	o.algo = (enum tfab_coll_algo)algo;
	o.compress = (enum tfab_compress)compress;
	if (keyobj != Py_None) {
		co->key = PyUnicode_Check(keyobj) ? PyUnicode_AsUTF8String(keyobj) : keyobj;
		if (co->key == keyobj)
			Py_INCREF(keyobj);
		if (!co->key) {
			coll_free(co);
			return NULL;
		}
		o.key = PyBytes_AS_STRING(co->key);
		if (strlen(o.key) != (size_t)PyBytes_GET_SIZE(co->key)) {
			coll_free(co);
			return PyErr_Format(PyExc_ValueError, "tfab: a key has no NUL");
		}
	}
	self->inflight++;
	tfabpy_link_add(&self->colls, &co->link, ++self->colls_seq);
	BUSY(self);
	{
		PyThreadState *ts = PyEval_SaveThread();

		rc = tfab_allreduce(self->w, &in->dl_tensor, out ? &out->dl_tensor : &in->dl_tensor,
				    (enum tfab_op)op, &o, on_coll, co);
		PyEval_RestoreThread(ts);
	}
	LEAVE(self);
	if (rc)
		return coll_failed(self, co, rc, "allreduce");
	Py_RETURN_NONE;
err:
	if (in)
		in->deleter(in);
	if (out)
		out->deleter(out);
	return NULL;
}

static PyObject *world_broadcast(struct tfabpy_world *self, PyObject *args)
{
	PyObject *obj, *callback;
	int root, rc;
	DLManagedTensor *t = NULL;
	struct coll *co;

	if (!PyArg_ParseTuple(args, "OiO:broadcast", &obj, &root, &callback))
		return NULL;
	if (!world_usable(self))
		return NULL;
	if (root < 0 || root >= tfab_world_size(self->w))
		return PyErr_Format(PyExc_ValueError, "tfab: no root %d in a world of %d", root,
				    tfab_world_size(self->w));
	if (coll_tensor(obj, "broadcast",
			root == tfab_world_rank(self->w) ? NULL : "broadcast's tensor", &t) < 0)
		return NULL;
	co = coll_new(self, callback);
	if (!co) {
		t->deleter(t);
		return NULL;
	}
	co->in = t;
	self->inflight++;
	tfabpy_link_add(&self->colls, &co->link, ++self->colls_seq);
	BUSY(self);
	{
		PyThreadState *ts = PyEval_SaveThread();

		rc = tfab_broadcast(self->w, &t->dl_tensor, root, on_coll, co);
		PyEval_RestoreThread(ts);
	}
	LEAVE(self);
	if (rc)
		return coll_failed(self, co, rc, "broadcast");
	Py_RETURN_NONE;
}

/* allgather (reduce = false) and reduce_scatter: in and out with out = size x in or in / size. */
static PyObject *gather_scatter(struct tfabpy_world *self, PyObject *inobj, PyObject *outobj,
				int op, PyObject *callback, bool reduce)
{
	const char *what = reduce ? "reduce_scatter" : "allgather";
	DLManagedTensor *in = NULL, *out = NULL;
	uint64_t inb, outb, size;
	struct coll *co;
	int rc;

	if (!world_usable(self))
		return NULL;
	size = (uint64_t)tfab_world_size(self->w);
	if (coll_tensor(inobj, what, NULL, &in) < 0)
		return NULL;
	if (coll_tensor(outobj, what, reduce ? "reduce_scatter's out" : "allgather's out", &out) <
	    0)
		goto err;
	if (reduce && check_reducible(what, &in->dl_tensor) < 0)
		goto err;
	if (!same_dtype(&in->dl_tensor, &out->dl_tensor)) {
		dtype_differs(what, &in->dl_tensor, &out->dl_tensor);
		goto err;
	}
	inb = nbytes_of(&in->dl_tensor);
	outb = nbytes_of(&out->dl_tensor);
	if (reduce ? inb != outb * size : outb != inb * size) {
		PyErr_Format(PyExc_ValueError,
			     reduce ? "tfab: reduce_scatter's input holds the world's size (%llu) "
				      "times out's elements"
				    : "tfab: allgather's out holds the world's size (%llu) times "
				      "the input's elements",
			     (unsigned long long)size);
		goto err;
	}
	co = coll_new(self, callback);
	if (!co)
		goto err;
	co->in = in;
	co->out = out;
	self->inflight++;
	tfabpy_link_add(&self->colls, &co->link, ++self->colls_seq);
	BUSY(self);
	{
		PyThreadState *ts = PyEval_SaveThread();

		if (reduce)
			rc = tfab_reduce_scatter(self->w, &in->dl_tensor, &out->dl_tensor,
						 (enum tfab_op)op, on_coll, co);
		else
			rc = tfab_allgather(self->w, &in->dl_tensor, &out->dl_tensor, on_coll, co);
		PyEval_RestoreThread(ts);
	}
	LEAVE(self);
	if (rc)
		return coll_failed(self, co, rc, what);
	Py_RETURN_NONE;
err:
	if (in)
		in->deleter(in);
	if (out)
		out->deleter(out);
	return NULL;
}

static PyObject *world_allgather(struct tfabpy_world *self, PyObject *args)
{
	PyObject *in, *out, *callback;

	if (!PyArg_ParseTuple(args, "OOO:allgather", &in, &out, &callback))
		return NULL;
	return gather_scatter(self, in, out, 0, callback, false);
}

static PyObject *world_reduce_scatter(struct tfabpy_world *self, PyObject *args)
{
	PyObject *in, *out, *callback;
	int op;

	if (!PyArg_ParseTuple(args, "OOiO:reduce_scatter", &in, &out, &op, &callback))
		return NULL;
	if (op_arg(op) < 0)
		return NULL;
	return gather_scatter(self, in, out, op, callback, true);
}

/* root as a rank of the world (ValueError where not). */
static int root_arg(struct tfabpy_world *self, int root)
{
	if (root >= 0 && root < tfab_world_size(self->w))
		return 0;
	PyErr_Format(PyExc_ValueError, "tfab: no root %d in a world of %d", root,
		     tfab_world_size(self->w));
	return -1;
}

/* Start co (holding its tensors) with start(); its failure raised as what's. */
#define COLL_START(self, co, what, call)                                           \
	do {                                                                       \
		int rc_;                                                           \
		(self)->inflight++;                                                \
		tfabpy_link_add(&(self)->colls, &(co)->link, ++(self)->colls_seq); \
		BUSY(self);                                                        \
		{                                                                  \
			PyThreadState *ts_ = PyEval_SaveThread();                  \
                                                                                   \
			rc_ = (call);                                              \
			PyEval_RestoreThread(ts_);                                 \
		}                                                                  \
		LEAVE(self);                                                       \
		if (rc_)                                                           \
			return coll_failed(self, co, rc_, what);                   \
		Py_RETURN_NONE;                                                    \
	} while (0)

/* reduce(in, out or None, op, root, callback): out is the root's only (None: in place). */
static PyObject *world_reduce(struct tfabpy_world *self, PyObject *args)
{
	PyObject *inobj, *outobj, *callback;
	DLManagedTensor *in = NULL, *out = NULL;
	int op, root;
	bool is_root;
	struct coll *co;

	if (!PyArg_ParseTuple(args, "OOiiO:reduce", &inobj, &outobj, &op, &root, &callback))
		return NULL;
	if (op_arg(op) < 0 || !world_usable(self) || root_arg(self, root) < 0)
		return NULL;
	is_root = root == tfab_world_rank(self->w);
	if (coll_tensor(inobj, "reduce",
			is_root && outobj == Py_None ? "reduce's tensor (reduced in place)" : NULL,
			&in) < 0)
		return NULL;
	if (is_root && outobj != Py_None &&
	    coll_tensor(outobj, "reduce", "reduce's out=", &out) < 0)
		goto err;
	if (check_reducible("reduce", &in->dl_tensor) < 0)
		goto err;
	if (out && out_like_in("reduce", &in->dl_tensor, &out->dl_tensor) < 0)
		goto err;
	co = coll_new(self, callback);
	if (!co)
		goto err;
	co->in = in;
	co->out = out;
	COLL_START(self, co, "reduce",
		   tfab_reduce(self->w, &in->dl_tensor,
			       !is_root ? NULL
			       : out	? &out->dl_tensor
					: &in->dl_tensor,
			       (enum tfab_op)op, root, on_coll, co));
err:
	if (in)
		in->deleter(in);
	if (out)
		out->deleter(out);
	return NULL;
}

/*
 * gather(in, out, root, callback) and scatter(in, out, root, callback): the whole (gather's
 * out, scatter's in) is the root's only, each rank's part (gather's in, scatter's out) every
 * rank's; the whole holds size parts.
 */
static PyObject *root_parts(struct tfabpy_world *self, PyObject *args, bool scatter)
{
	const char *what = scatter ? "scatter" : "gather";
	PyObject *inobj, *outobj, *callback, *wholeobj, *partobj;
	DLManagedTensor *whole = NULL, *part = NULL;
	int root;
	bool is_root;
	struct coll *co;

	if (!PyArg_ParseTuple(args, scatter ? "OOiO:scatter" : "OOiO:gather", &inobj, &outobj,
			      &root, &callback))
		return NULL;
	if (!world_usable(self) || root_arg(self, root) < 0)
		return NULL;
	is_root = root == tfab_world_rank(self->w);
	wholeobj = scatter ? inobj : outobj;
	partobj = scatter ? outobj : inobj;
	if (coll_tensor(partobj, what, scatter ? "scatter's out" : NULL, &part) < 0)
		return NULL;
	if (is_root) {
		if (wholeobj == Py_None) {
			PyErr_Format(PyExc_ValueError, "tfab: %s's root needs its %s", what,
				     scatter ? "tensor of size parts" : "out");
			goto err;
		}
		if (coll_tensor(wholeobj, what, scatter ? NULL : "gather's out", &whole) < 0)
			goto err;
		if (!same_dtype(&part->dl_tensor, &whole->dl_tensor)) {
			if (scatter)
				dtype_differs(what, &whole->dl_tensor, &part->dl_tensor);
			else
				dtype_differs(what, &part->dl_tensor, &whole->dl_tensor);
			goto err;
		}
		if (nbytes_of(&whole->dl_tensor) !=
		    nbytes_of(&part->dl_tensor) * (uint64_t)tfab_world_size(self->w)) {
			PyErr_Format(PyExc_ValueError,
				     scatter
					 ? "tfab: scatter's input holds the world's size (%d) "
					   "times out's elements"
					 : "tfab: gather's out holds the world's size (%d) times "
					   "the input's elements",
				     tfab_world_size(self->w));
			goto err;
		}
	}
	co = coll_new(self, callback);
	if (!co)
		goto err;
	co->in = scatter ? whole : part;
	co->out = scatter ? part : whole;
	if (scatter)
		COLL_START(self, co, what,
			   tfab_scatter(self->w, whole ? &whole->dl_tensor : NULL, &part->dl_tensor,
					root, on_coll, co));
	COLL_START(self, co, what,
		   tfab_gather(self->w, &part->dl_tensor, whole ? &whole->dl_tensor : NULL, root,
			       on_coll, co));
err:
	if (whole)
		whole->deleter(whole);
	if (part)
		part->deleter(part);
	return NULL;
}

static PyObject *world_gather(struct tfabpy_world *self, PyObject *args)
{
	return root_parts(self, args, false);
}

static PyObject *world_scatter(struct tfabpy_world *self, PyObject *args)
{
	return root_parts(self, args, true);
}

/* counts: None (NULL, *n_p untouched), or a sequence of size ints >= 0 into a new array. */
static int counts_arg(PyObject *obj, const char *name, int size, size_t **n_p)
{
	PyObject *seq;

	if (obj == Py_None)
		return 0;
	seq = PySequence_Fast(obj, "tfab: alltoall's counts are a list of ints or None");
	if (!seq)
		return -1;
	if (PySequence_Fast_GET_SIZE(seq) != size) {
		PyErr_Format(PyExc_ValueError,
			     "tfab: alltoall's %s has %zd entries, not %d (one "
			     "per rank)",
			     name, PySequence_Fast_GET_SIZE(seq), size);
		goto err;
	}
	*n_p = calloc((size_t)size, sizeof(**n_p));
	if (!*n_p) {
		PyErr_NoMemory();
		goto err;
	}
	for (int k = 0; k < size; k++) {
		long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, k));

		if (v == -1 && PyErr_Occurred())
			goto err;
		if (v < 0) {
			PyErr_Format(PyExc_ValueError,
				     "tfab: alltoall's %s[%d] is %lld: counts "
				     "are >= 0",
				     name, k, v);
			goto err;
		}
		(*n_p)[k] = (size_t)v;
	}
	Py_DECREF(seq);
	return 0;
err:
	free(*n_p);
	*n_p = NULL;
	Py_DECREF(seq);
	return -1;
}

/* alltoallv(in, out, send_counts or None, recv_counts or None, callback). */
static PyObject *world_alltoallv(struct tfabpy_world *self, PyObject *args)
{
	PyObject *inobj, *outobj, *scobj, *rcobj, *callback;
	DLManagedTensor *in = NULL, *out = NULL;
	size_t *sc = NULL, *rc = NULL;
	struct coll *co;
	int ret;

	if (!PyArg_ParseTuple(args, "OOOOO:alltoallv", &inobj, &outobj, &scobj, &rcobj, &callback))
		return NULL;
	if (!world_usable(self))
		return NULL;
	if (counts_arg(scobj, "send_counts", tfab_world_size(self->w), &sc) < 0 ||
	    counts_arg(rcobj, "recv_counts", tfab_world_size(self->w), &rc) < 0)
		goto err;
	if (coll_tensor(inobj, "alltoall", NULL, &in) < 0 ||
	    coll_tensor(outobj, "alltoall", "alltoall's out", &out) < 0)
		goto err;
	if (!same_dtype(&in->dl_tensor, &out->dl_tensor)) {
		dtype_differs("alltoall", &in->dl_tensor, &out->dl_tensor);
		goto err;
	}
	co = coll_new(self, callback);
	if (!co)
		goto err;
	co->in = in;
	co->out = out;
	in = out = NULL;
	self->inflight++;
	tfabpy_link_add(&self->colls, &co->link, ++self->colls_seq);
	BUSY(self);
	{
		PyThreadState *ts = PyEval_SaveThread();

		ret = tfab_alltoallv(self->w, &co->in->dl_tensor, sc, &co->out->dl_tensor, rc,
				     on_coll, co);
		PyEval_RestoreThread(ts);
	}
	LEAVE(self);
	free(sc);
	free(rc);
	if (ret)
		return coll_failed(self, co, ret, "alltoall");
	Py_RETURN_NONE;
err:
	free(sc);
	free(rc);
	if (in)
		in->deleter(in);
	if (out)
		out->deleter(out);
	return NULL;
}

static PyObject *world_barrier(struct tfabpy_world *self, PyObject *callback)
{
	struct coll *co;
	int rc;

	if (!world_usable(self))
		return NULL;
	co = coll_new(self, callback);
	if (!co)
		return NULL;
	self->inflight++;
	tfabpy_link_add(&self->colls, &co->link, ++self->colls_seq);
	BUSY(self);
	{
		PyThreadState *ts = PyEval_SaveThread();

		rc = tfab_barrier(self->w, on_coll, co);
		PyEval_RestoreThread(ts);
	}
	LEAVE(self);
	if (rc)
		return coll_failed(self, co, rc, "barrier");
	Py_RETURN_NONE;
}

static PyObject *world_get_rank(struct tfabpy_world *self, void *closure)
{
	(void)closure;
	if (!world_usable(self))
		return NULL;
	return PyLong_FromLong(tfab_world_rank(self->w));
}

static PyObject *world_get_size(struct tfabpy_world *self, void *closure)
{
	(void)closure;
	if (!world_usable(self))
		return NULL;
	return PyLong_FromLong(tfab_world_size(self->w));
}

/* The ranks failed, in the order this rank learned it; None where the engine tells another world. */
static PyObject *world_get_failed(struct tfabpy_world *self, void *closure)
{
	PyObject *list;
	int *ranks;
	int size, n;

	(void)closure;
	if (!world_usable(self))
		return NULL;
	size = tfab_world_size(self->w);
	ranks = PyMem_Malloc((size_t)size * sizeof(*ranks));
	if (!ranks)
		return PyErr_NoMemory();
	n = tfab_world_failed(self->w, ranks, size);
	if (n == -EOPNOTSUPP) {
		PyMem_Free(ranks);
		Py_RETURN_NONE;
	}
	if (n < 0) {
		PyMem_Free(ranks);
		return tfabpy_raise(n, "world failed");
	}
	list = PyList_New(0);
	for (int i = 0; list && i < n && i < size; i++) {
		PyObject *r = PyLong_FromLong(ranks[i]);

		if (!r || PyList_Append(list, r) < 0)
			Py_CLEAR(list);
		Py_XDECREF(r);
	}
	PyMem_Free(ranks);
	return list;
}

static PyObject *world_get_joined(struct tfabpy_world *self, void *closure)
{
	(void)closure;
	return PyBool_FromLong(self->w != NULL);
}

static PyObject *world_get_inflight(struct tfabpy_world *self, void *closure)
{
	(void)closure;
	return PyLong_FromLong(self->inflight);
}

static PyMethodDef world_methods[] = {
    {"wait", (PyCFunction)world_wait, METH_VARARGS, NULL},
    {"leave", (PyCFunction)world_leave, METH_VARARGS, NULL},
    {"name", (PyCFunction)world_name, METH_O, NULL},
    {"peer", (PyCFunction)world_peer, METH_O, NULL},
    {"allreduce", (PyCFunction)world_allreduce, METH_VARARGS, NULL},
    {"broadcast", (PyCFunction)world_broadcast, METH_VARARGS, NULL},
    {"allgather", (PyCFunction)world_allgather, METH_VARARGS, NULL},
    {"reduce_scatter", (PyCFunction)world_reduce_scatter, METH_VARARGS, NULL},
    {"reduce", (PyCFunction)world_reduce, METH_VARARGS, NULL},
    {"gather", (PyCFunction)world_gather, METH_VARARGS, NULL},
    {"scatter", (PyCFunction)world_scatter, METH_VARARGS, NULL},
    {"alltoallv", (PyCFunction)world_alltoallv, METH_VARARGS, NULL},
    {"barrier", (PyCFunction)world_barrier, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef world_getset[] = {
    {"rank", (getter)world_get_rank, NULL, NULL, NULL},
    {"size", (getter)world_get_size, NULL, NULL, NULL},
    {"joined", (getter)world_get_joined, NULL, NULL, NULL},
    {"failed", (getter)world_get_failed, NULL, NULL, NULL},
    {"inflight", (getter)world_get_inflight, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject tfabpy_world_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tfab._tfab.World",
    .tp_basicsize = sizeof(struct tfabpy_world),
    .tp_dealloc = (destructor)world_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The C world; tfab.World is the one to use.",
    .tp_weaklistoffset = offsetof(struct tfabpy_world, weakrefs),
    .tp_methods = world_methods,
    .tp_getset = world_getset,
    .tp_init = (initproc)world_init,
    .tp_new = PyType_GenericNew,
};
