/*
 * TensorProto bytes (tfab/tensorproto.h) with protobuf-c and the message declared in
 * lib/proto/tensor.proto: DLPack dtypes to TensorFlow DataTypes and back, numeric tensors
 * written as tensor_content, string tensors as string_val, and any TensorProto read the way
 * TensorFlow's Tensor::FromProto (tensorflow/core/framework/tensor.cc) reads it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <tfab/status.h>
#include <tfab/tensorproto.h>

#include "engine/engine.h"
#include "proto/tensor.pb-c.h"
#include "proto/tensorproto.h"
#include "util/log.h"

#define SUBSYS "tensorproto"
#define MAX_PROTO_BYTES 0x7fffffffu /* TensorFlow refuses protos of 2 GiB and more */

/* DLPack codes newer than Debian's dlpack.h (DLPack 0.6). */
enum {
	DL_BOOL = 6,
	DL_F8_E4M3B11FNUZ = 9,
	DL_F8_E4M3FN = 10,
	DL_F8_E4M3FNUZ = 11,
	DL_F8_E5M2 = 12,
	DL_F8_E5M2FNUZ = 13,
};

struct dtype_map {
	uint8_t code, bits;
	Tensorflow__DataType tf;
};

/* First match wins when decoding, so each DataType's preferred DLPack type comes first. */
static const struct dtype_map dtypes[] = {
    {kDLFloat, 32, TENSORFLOW__DATA_TYPE__DT_FLOAT},
    {kDLFloat, 64, TENSORFLOW__DATA_TYPE__DT_DOUBLE},
    {kDLFloat, 16, TENSORFLOW__DATA_TYPE__DT_HALF},
    {kDLBfloat, 16, TENSORFLOW__DATA_TYPE__DT_BFLOAT16},
    {kDLInt, 8, TENSORFLOW__DATA_TYPE__DT_INT8},
    {kDLInt, 16, TENSORFLOW__DATA_TYPE__DT_INT16},
    {kDLInt, 32, TENSORFLOW__DATA_TYPE__DT_INT32},
    {kDLInt, 64, TENSORFLOW__DATA_TYPE__DT_INT64},
    {kDLUInt, 8, TENSORFLOW__DATA_TYPE__DT_UINT8},
    {kDLUInt, 16, TENSORFLOW__DATA_TYPE__DT_UINT16},
    {kDLUInt, 32, TENSORFLOW__DATA_TYPE__DT_UINT32},
    {kDLUInt, 64, TENSORFLOW__DATA_TYPE__DT_UINT64},
    {kDLComplex, 64, TENSORFLOW__DATA_TYPE__DT_COMPLEX64},
    {kDLComplex, 128, TENSORFLOW__DATA_TYPE__DT_COMPLEX128},
    {DL_BOOL, 8, TENSORFLOW__DATA_TYPE__DT_BOOL},
    {DL_F8_E5M2, 8, TENSORFLOW__DATA_TYPE__DT_FLOAT8_E5M2},
    {DL_F8_E4M3FN, 8, TENSORFLOW__DATA_TYPE__DT_FLOAT8_E4M3FN},
    {DL_F8_E4M3FNUZ, 8, TENSORFLOW__DATA_TYPE__DT_FLOAT8_E4M3FNUZ},
    {DL_F8_E4M3B11FNUZ, 8, TENSORFLOW__DATA_TYPE__DT_FLOAT8_E4M3B11FNUZ},
    {DL_F8_E5M2FNUZ, 8, TENSORFLOW__DATA_TYPE__DT_FLOAT8_E5M2FNUZ},
    /* quantized: decoded as the plain integer of their width */
    {kDLInt, 8, TENSORFLOW__DATA_TYPE__DT_QINT8},
    {kDLUInt, 8, TENSORFLOW__DATA_TYPE__DT_QUINT8},
    {kDLInt, 16, TENSORFLOW__DATA_TYPE__DT_QINT16},
    {kDLUInt, 16, TENSORFLOW__DATA_TYPE__DT_QUINT16},
    {kDLInt, 32, TENSORFLOW__DATA_TYPE__DT_QINT32},
};

static int tf_of_dl(DLDataType dt, Tensorflow__DataType *tf_p)
{
	if (dt.lanes == 1)
		for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
			if (dtypes[i].code == dt.code && dtypes[i].bits == dt.bits) {
				*tf_p = dtypes[i].tf;
				return 0;
			}
	TFAB_ERROR(SUBSYS, "DLPack dtype (code %u, %u bits, %u lanes) has no TensorFlow DataType",
		   dt.code, dt.bits, dt.lanes);
	return -EOPNOTSUPP;
}

static int dl_of_tf(Tensorflow__DataType tf, DLDataType *dt_p)
{
	for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
		if (dtypes[i].tf == tf) {
			dt_p->code = dtypes[i].code;
			dt_p->bits = dtypes[i].bits;
			dt_p->lanes = 1;
			return 0;
		}
	TFAB_ERROR(SUBSYS, "TensorFlow DataType %d is not supported", (int)tf);
	return -EOPNOTSUPP;
}

/* A shape message over dims[] (storage the caller keeps alive while it is packed). */
struct shape_msg {
	Tensorflow__TensorShapeProto shape;
	Tensorflow__TensorShapeProto__Dim dims[TFAB_MAX_DIMS];
	Tensorflow__TensorShapeProto__Dim *ptrs[TFAB_MAX_DIMS];
};

static void shape_fill(struct shape_msg *s, int ndim, const int64_t *shape)
{
	tensorflow__tensor_shape_proto__init(&s->shape);
	for (int i = 0; i < ndim; i++) {
		tensorflow__tensor_shape_proto__dim__init(&s->dims[i]);
		s->dims[i].size = shape[i];
		s->ptrs[i] = &s->dims[i];
	}
	s->shape.n_dim = (size_t)ndim;
	s->shape.dim = ndim ? s->ptrs : NULL;
}

static int pack(const Tensorflow__TensorProto *m, void *buf, size_t cap, size_t *len_p)
{
	size_t need = tensorflow__tensor_proto__get_packed_size(m);

	if (need > MAX_PROTO_BYTES) {
		TFAB_ERROR(SUBSYS, "a TensorProto of %zu bytes: TensorFlow's limit is 2 GiB - 1",
			   need);
		return -EMSGSIZE;
	}
	*len_p = need;
	if (!buf || cap < need)
		return -ENOSPC;
	tensorflow__tensor_proto__pack(m, buf);
	return 0;
}

int tfab_tensorproto_encode(const DLTensor *t, void *buf, size_t cap, size_t *len_p)
{
	Tensorflow__TensorProto m = TENSORFLOW__TENSOR_PROTO__INIT;
	struct tfab_wire_meta meta;
	struct shape_msg shape;
	void *data;
	int rc;

	if (!len_p)
		return -EINVAL;
	if (tfab__on_gpu(t)) {
		TFAB_ERROR(SUBSYS, "a CUDA device tensor: TensorProto reads host memory only");
		return -EOPNOTSUPP;
	}
	rc = tfab__meta_from_dltensor(t, false, &meta, &data);
	if (rc == 0)
		rc = tf_of_dl(t->dtype, &m.dtype);
	if (rc)
		return rc;
	shape_fill(&shape, t->ndim, t->shape);
	m.tensor_shape = &shape.shape;
	m.tensor_content.len = meta.nbytes;
	m.tensor_content.data = meta.nbytes ? data : NULL;
	return pack(&m, buf, cap, len_p);
}

int tfab__tensorproto_pack_strings(const struct tfab_string_tensor *t,
				   int (*alloc)(void *arg, size_t len, void **buf_p), void *arg,
				   void **buf_p, size_t *len_p)
{
	Tensorflow__TensorProto m = TENSORFLOW__TENSOR_PROTO__INIT;
	struct shape_msg shape;
	ProtobufCBinaryData *vals;
	int64_t n = tfab_string_tensor_count(t);
	int rc;

	if (n < 0)
		return (int)n;
	if (!len_p || (n && !t->strings))
		return -EINVAL;
	if ((uint64_t)n > MAX_PROTO_BYTES / 2) /* each element takes 2 bytes at least */
		return -EMSGSIZE;
	vals = malloc(sizeof(*vals) * (size_t)(n ? n : 1));
	if (!vals)
		return -ENOMEM;
	for (int64_t i = 0; i < n; i++) {
		if (t->strings[i].len && !t->strings[i].data) {
			free(vals);
			return -EINVAL;
		}
		vals[i].len = t->strings[i].len;
		vals[i].data = (uint8_t *)t->strings[i].data;
	}
	m.dtype = TENSORFLOW__DATA_TYPE__DT_STRING;
	shape_fill(&shape, t->ndim, t->shape);
	m.tensor_shape = &shape.shape;
	m.n_string_val = (size_t)n;
	m.string_val = vals;
	rc = pack(&m, NULL, 0, len_p);
	if (rc == -ENOSPC) {
		rc = alloc(arg, *len_p, buf_p);
		if (rc == 0)
			tensorflow__tensor_proto__pack(&m, *buf_p);
	}
	free(vals);
	return rc;
}

/* The caller's buffer as an allocator: -ENOSPC when it is too small. */
struct fixed_buf {
	void *buf;
	size_t cap;
};

static int fixed_alloc(void *arg, size_t len, void **buf_p)
{
	struct fixed_buf *f = arg;

	if (!f->buf || f->cap < len)
		return -ENOSPC;
	*buf_p = f->buf;
	return 0;
}

int tfab_tensorproto_encode_strings(const struct tfab_string_tensor *t, void *buf, size_t cap,
				    size_t *len_p)
{
	struct fixed_buf f = {buf, cap};
	void *out;

	if (!len_p)
		return -EINVAL;
	return tfab__tensorproto_pack_strings(t, fixed_alloc, &f, &out, len_p);
}

/* ---- Decoding ---- */

/* A string tensor the library made: the public part first, its strings point into msg. */
struct owned_strings {
	struct tfab_string_tensor pub;
	Tensorflow__TensorProto *msg;
	int64_t shape[TFAB_MAX_DIMS];
	struct tfab_string strings[];
};

void tfab_string_tensor_free(struct tfab_string_tensor *t)
{
	struct owned_strings *o = (struct owned_strings *)t;

	if (!o)
		return;
	if (o->msg)
		tensorflow__tensor_proto__free_unpacked(o->msg, NULL);
	free(o);
}

struct tfab_string_tensor *tfab__strings_empty(int ndim, const int64_t *shape)
{
	struct owned_strings *o = calloc(1, sizeof(*o));

	if (!o)
		return NULL;
	memcpy(o->shape, shape, sizeof(int64_t) * (size_t)ndim);
	o->pub.ndim = ndim;
	o->pub.shape = o->shape;
	o->pub.strings = o->strings;
	return &o->pub;
}

/* A DLManagedTensor of plain heap memory. */
struct owned_tensor {
	DLManagedTensor dl;
	int64_t shape[TFAB_MAX_DIMS];
	uint8_t *data;
};

static void owned_tensor_delete(DLManagedTensor *dl)
{
	struct owned_tensor *o = dl->manager_ctx;

	free(o->data);
	free(o);
}

static int bad(const char *why)
{
	TFAB_ERROR(SUBSYS, "a malformed TensorProto: %s", why);
	return -TFAB_ERR_PROTOCOL;
}

/* A few bytes can describe a tensor of any size, its values repeated: bounded here. */
static int too_big(uint64_t count, uint64_t bytes)
{
	TFAB_ERROR(SUBSYS,
		   "a TensorProto of %llu elements would take %llu bytes decoded, more than "
		   "TFAB_TENSORPROTO_MAX_DECODED (%llu)",
		   (unsigned long long)count, (unsigned long long)bytes,
		   (unsigned long long)TFAB_TENSORPROTO_MAX_DECODED);
	return -EMSGSIZE;
}

/*
 * TensorFlow's reading of a typed field (FromProtoField in its tensor.cc): n values for count
 * elements, the last one repeated when there are fewer, zeros when there are none, and only
 * the first count read when there are more.
 */
static void fill_values(uint8_t *dst, uint64_t count, size_t width, const void *src, size_t n,
			size_t src_width, void (*conv)(uint8_t *dst, const void *src))
{
	for (uint64_t i = 0; i < count; i++) {
		uint8_t *d = dst + i * width;

		if (n == 0)
			memset(d, 0, width);
		else if (i < n)
			conv(d, (const uint8_t *)src + i * src_width);
		else
			memcpy(d, d - width, width);
	}
}

#define CONV(name, from, to)                            \
	static void name(uint8_t *dst, const void *src) \
	{                                               \
		from v;                                 \
		to w;                                   \
		memcpy(&v, src, sizeof(v));             \
		w = (to)v;                              \
		memcpy(dst, &w, sizeof(w));             \
	}
CONV(conv_i32_i8, int32_t, int8_t)
CONV(conv_i32_i16, int32_t, int16_t)
CONV(conv_i32_i32, int32_t, int32_t)
CONV(conv_i32_u16, int32_t, uint16_t)
CONV(conv_i32_u8, int32_t, uint8_t)
CONV(conv_f32, float, float)
CONV(conv_f64, double, double)
CONV(conv_i64, int64_t, int64_t)
CONV(conv_u32, uint32_t, uint32_t)
CONV(conv_u64, uint64_t, uint64_t)
CONV(conv_bool, protobuf_c_boolean, uint8_t)
CONV(conv_u8, uint8_t, uint8_t)

static void conv_c64(uint8_t *dst, const void *src)
{
	memcpy(dst, src, 2 * sizeof(float));
}

static void conv_c128(uint8_t *dst, const void *src)
{
	memcpy(dst, src, 2 * sizeof(double));
}

static void decode_values(const Tensorflow__TensorProto *m, DLDataType dt, uint8_t *dst,
			  uint64_t count)
{
	size_t w = dt.bits / 8;

	switch (m->dtype) {
	case TENSORFLOW__DATA_TYPE__DT_FLOAT:
		fill_values(dst, count, w, m->float_val, m->n_float_val, 4, conv_f32);
		break;
	case TENSORFLOW__DATA_TYPE__DT_DOUBLE:
		fill_values(dst, count, w, m->double_val, m->n_double_val, 8, conv_f64);
		break;
	case TENSORFLOW__DATA_TYPE__DT_HALF:
	case TENSORFLOW__DATA_TYPE__DT_BFLOAT16:
		fill_values(dst, count, w, m->half_val, m->n_half_val, 4, conv_i32_u16);
		break;
	case TENSORFLOW__DATA_TYPE__DT_INT64:
		fill_values(dst, count, w, m->int64_val, m->n_int64_val, 8, conv_i64);
		break;
	case TENSORFLOW__DATA_TYPE__DT_UINT32:
		fill_values(dst, count, w, m->uint32_val, m->n_uint32_val, 4, conv_u32);
		break;
	case TENSORFLOW__DATA_TYPE__DT_UINT64:
		fill_values(dst, count, w, m->uint64_val, m->n_uint64_val, 8, conv_u64);
		break;
	case TENSORFLOW__DATA_TYPE__DT_BOOL:
		fill_values(dst, count, w, m->bool_val, m->n_bool_val, sizeof(protobuf_c_boolean),
			    conv_bool);
		break;
	/* whole (real, imaginary) pairs: an odd last part is not a value */
	case TENSORFLOW__DATA_TYPE__DT_COMPLEX64:
		fill_values(dst, count, w, m->scomplex_val, m->n_scomplex_val / 2, 8, conv_c64);
		break;
	case TENSORFLOW__DATA_TYPE__DT_COMPLEX128:
		fill_values(dst, count, w, m->dcomplex_val, m->n_dcomplex_val / 2, 16, conv_c128);
		break;
	case TENSORFLOW__DATA_TYPE__DT_FLOAT8_E5M2:
	case TENSORFLOW__DATA_TYPE__DT_FLOAT8_E4M3FN:
	case TENSORFLOW__DATA_TYPE__DT_FLOAT8_E4M3FNUZ:
	case TENSORFLOW__DATA_TYPE__DT_FLOAT8_E4M3B11FNUZ:
	case TENSORFLOW__DATA_TYPE__DT_FLOAT8_E5M2FNUZ:
		fill_values(dst, count, w, m->float8_val.data, m->float8_val.len, 1, conv_u8);
		break;
	default: /* the int_val types */
		if (dt.bits == 32)
			fill_values(dst, count, w, m->int_val, m->n_int_val, 4, conv_i32_i32);
		else if (dt.bits == 16)
			fill_values(dst, count, w, m->int_val, m->n_int_val, 4,
				    dt.code == kDLInt ? conv_i32_i16 : conv_i32_u16);
		else
			fill_values(dst, count, w, m->int_val, m->n_int_val, 4,
				    dt.code == kDLInt ? conv_i32_i8 : conv_i32_u8);
	}
}

static int decode_numeric(Tensorflow__TensorProto *m, int ndim, const int64_t *shape,
			  uint64_t count, DLManagedTensor **tensor_p)
{
	struct owned_tensor *o;
	DLDataType dt;
	uint64_t nbytes;
	int rc = dl_of_tf(m->dtype, &dt);

	if (rc)
		return rc;
	if (count > UINT64_MAX / 16)
		return bad("too many elements");
	nbytes = count * (dt.bits / 8);
	if (nbytes > TFAB_TENSORPROTO_MAX_DECODED)
		return too_big(count, nbytes);
	/* With no elements TensorFlow reads neither tensor_content nor the values. */
	if (nbytes && m->tensor_content.len) {
		if (m->tensor_content.len != nbytes)
			return bad("tensor_content does not match the shape");
		if (m->dtype == TENSORFLOW__DATA_TYPE__DT_BOOL)
			for (uint64_t i = 0; i < nbytes; i++)
				if (m->tensor_content.data[i] > 1)
					return bad("a bool that is neither 0 nor 1");
	}
	o = calloc(1, sizeof(*o));
	if (!o)
		return -ENOMEM;
	if (nbytes) {
		o->data = malloc(nbytes);
		if (!o->data) {
			free(o);
			return -ENOMEM;
		}
		if (m->tensor_content.len)
			memcpy(o->data, m->tensor_content.data, nbytes);
		else
			decode_values(m, dt, o->data, count);
	}
	memcpy(o->shape, shape, sizeof(int64_t) * (size_t)ndim);
	o->dl.dl_tensor.data = o->data;
	o->dl.dl_tensor.device.device_type = kDLCPU;
	o->dl.dl_tensor.ndim = ndim;
	o->dl.dl_tensor.dtype = dt;
	o->dl.dl_tensor.shape = o->shape;
	o->dl.manager_ctx = o;
	o->dl.deleter = owned_tensor_delete;
	*tensor_p = &o->dl;
	return 0;
}

/*
 * Strings in tensor_content, as TensorFlow's port::EncodeStringList writes them: count
 * lengths as varints of 5 bytes at most, then the bytes, which the lengths must cover
 * exactly. The strings point into the content.
 */
static int string_list(const ProtobufCBinaryData *c, uint64_t count, struct tfab_string *out)
{
	const uint8_t *p = c->data, *end = c->data + c->len;
	uint64_t total = 0;

	for (uint64_t i = 0; i < count; i++) {
		uint32_t len = 0;
		unsigned shift = 0;
		uint8_t b;

		do {
			if (p == end)
				return bad("string lengths cut short in tensor_content");
			if (shift > 28)
				return bad("a string length of more than 5 bytes");
			b = *p++;
			len |= (uint32_t)(b & 0x7f) << shift; /* bits past 32 are dropped */
			shift += 7;
		} while (b & 0x80);
		out[i].len = len;
		total += len;
	}
	if (total != (uint64_t)(end - p))
		return bad("string lengths that do not add up to the tensor_content");
	for (uint64_t i = 0; i < count; i++) {
		out[i].data = (const char *)p;
		p += out[i].len;
	}
	return 0;
}

static int decode_strings(Tensorflow__TensorProto *m, int ndim, const int64_t *shape,
			  uint64_t count, struct tfab_string_tensor **strings_p)
{
	struct owned_strings *o;
	int rc = 0;

	if (count > (SIZE_MAX - sizeof(*o)) / sizeof(struct tfab_string))
		return bad("too many elements");
	if (count > TFAB_TENSORPROTO_MAX_DECODED / sizeof(struct tfab_string))
		return too_big(count, count * sizeof(struct tfab_string));
	/* Each length takes a byte at least: refuse before allocating for them. */
	if (count && m->tensor_content.len && count > m->tensor_content.len)
		return bad("string lengths cut short in tensor_content");
	o = calloc(1, sizeof(*o) + sizeof(struct tfab_string) * count);
	if (!o)
		return -ENOMEM;
	/*
	 * As numeric tensors: tensor_content first, else string_val with TensorFlow's rule (the
	 * last string repeats, none means empty strings, extra ones are not read); with no
	 * elements, neither is read.
	 */
	if (count && m->tensor_content.len) {
		rc = string_list(&m->tensor_content, count, o->strings);
		if (rc) {
			free(o);
			return rc;
		}
	} else {
		for (uint64_t i = 0; i < count; i++) {
			if (i < m->n_string_val) {
				o->strings[i].data = (const char *)m->string_val[i].data;
				o->strings[i].len = m->string_val[i].len;
			} else if (i) {
				o->strings[i] = o->strings[i - 1];
			}
		}
	}
	memcpy(o->shape, shape, sizeof(int64_t) * (size_t)ndim);
	o->pub.ndim = ndim;
	o->pub.shape = o->shape;
	o->pub.strings = o->strings;
	o->msg = m;
	*strings_p = &o->pub;
	return 0;
}

int tfab_tensorproto_decode(const void *buf, size_t len, DLManagedTensor **tensor_p,
			    struct tfab_string_tensor **strings_p)
{
	return tfab__tensorproto_decode_shaped(buf, len, -1, NULL, tensor_p, strings_p);
}

int tfab__tensorproto_decode_shaped(const void *buf, size_t len, int expect_ndim,
				    const int64_t *expect_shape, DLManagedTensor **tensor_p,
				    struct tfab_string_tensor **strings_p)
{
	Tensorflow__TensorProto *m;
	int64_t shape[TFAB_MAX_DIMS];
	uint64_t count = 1;
	int ndim, rc;

	if ((!buf && len) || (!tensor_p && !strings_p))
		return -EINVAL;
	if (tensor_p)
		*tensor_p = NULL;
	if (strings_p)
		*strings_p = NULL;
	m = tensorflow__tensor_proto__unpack(NULL, len, buf);
	if (!m)
		return bad("protobuf-c could not parse it");
	/*
	 * As TensorFlow's TensorShape reads it: no tensor_shape is one with no dimensions (a
	 * scalar), and unknown_rank is ignored (the dimensions given are the shape).
	 */
	ndim = m->tensor_shape ? (int)m->tensor_shape->n_dim : 0;
	if (m->tensor_shape && m->tensor_shape->n_dim > TFAB_MAX_DIMS) {
		rc = bad("more than 32 dimensions");
		goto out;
	}
	for (int i = 0; i < ndim; i++) {
		int64_t d = m->tensor_shape->dim[i]->size;

		if (d < 0) {
			rc = bad("a negative dimension");
			goto out;
		}
		shape[i] = d;
		if (d && count > UINT64_MAX / (uint64_t)d) {
			rc = bad("too many elements");
			goto out;
		}
		count *= (uint64_t)d;
	}
	/* Before anything is allocated for it. */
	if (expect_ndim >= 0 &&
	    (ndim != expect_ndim ||
	     (ndim && memcmp(shape, expect_shape, sizeof(int64_t) * (size_t)ndim) != 0))) {
		rc = bad("its shape is not the one expected");
		goto out;
	}
	if (m->dtype == TENSORFLOW__DATA_TYPE__DT_STRING) {
		if (!strings_p) {
			TFAB_ERROR(SUBSYS, "a string TensorProto where a numeric one was expected");
			rc = -EPROTOTYPE;
			goto out;
		}
		rc = decode_strings(m, ndim, shape, count, strings_p);
		if (rc == 0)
			return 0; /* the string tensor owns m */
		goto out;
	}
	if (!tensor_p) {
		TFAB_ERROR(SUBSYS, "a numeric TensorProto where a string one was expected");
		rc = -EPROTOTYPE;
		goto out;
	}
	rc = decode_numeric(m, ndim, shape, count, tensor_p);
out:
	tensorflow__tensor_proto__free_unpacked(m, NULL);
	return rc;
}
