/*
 * TensorProto bytes (tfab/tensorproto.h) with protobuf-c and the message declared in
 * lib/proto/tensor.proto: DLPack dtypes to TensorFlow DataTypes and back, numeric tensors
 * written as tensor_content, string tensors as string_val, and any TensorProto read the way
 * TensorFlow's Tensor::FromProto (tensorflow/core/framework/tensor.cc) reads it.
 */
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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
	char name[TFAB_DTYPE_NAME_MAX];

	if (dt.lanes == 1)
		for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
			if (dtypes[i].code == dt.code && dtypes[i].bits == dt.bits) {
				*tf_p = dtypes[i].tf;
				return 0;
			}
	TFAB_ERROR(SUBSYS, "dtype %s has no TensorFlow DataType",
		   tfab_dtype_name(dt, name, sizeof(name)));
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

/*
 * What one decode may hold at once, against its bound: protobuf-c's allocations for the message
 * (counted as it parses, through this allocator: the strings of a string tensor point into it)
 * and the decoded tensor's. A few bytes can claim a tensor of any size whose values repeat;
 * the claim is checked against what is left before anything is allocated for it.
 */
struct budget {
	ProtobufCAllocator pa; /* what protobuf-c is given; its allocator_data is the budget */
	uint64_t max, used;
	const char *name; /* the bound's name, for the refusal */
	bool over;	  /* an allocation of the parse was refused */
};

/* What glibc's malloc takes for size bytes: an 8-byte header, rounded up to 16 (32 at least). */
static uint64_t malloc_cost(uint64_t size)
{
	uint64_t c;

	if (size > UINT64_MAX - 64)
		return UINT64_MAX;
	c = (size + 8 + 15) & ~(uint64_t)15;
	return c < 32 ? 32 : c;
}

static uint64_t budget_left(const struct budget *b)
{
	return b->max - b->used;
}

/* What glibc's malloc holds for the block p: its usable size and an 8-byte header. */
static uint64_t held(void *p)
{
	return malloc_usable_size(p) + 8;
}

/*
 * The parse's allocations, counted while they are held: protobuf-c's scratch for repeated
 * fields (freed before it returns) is counted while it lives, not after.
 */
static void *budget_alloc(void *data, size_t size)
{
	struct budget *b = data;
	void *p;

	if (malloc_cost(size) > budget_left(b)) {
		b->over = true;
		return NULL;
	}
	p = malloc(size);
	if (p && held(p) > budget_left(b)) {
		free(p);
		b->over = true;
		return NULL;
	}
	if (p)
		b->used += held(p);
	return p;
}

/* The message itself is freed with protobuf-c's default allocator (free) once it is out. */
static void budget_free(void *data, void *p)
{
	struct budget *b = data;

	if (p)
		b->used -= held(p);
	free(p);
}

static void budget_init(struct budget *b, uint64_t max, const char *name)
{
	b->pa.alloc = budget_alloc;
	b->pa.free = budget_free;
	b->pa.allocator_data = b;
	b->max = max;
	b->used = 0;
	b->name = name;
	b->over = false;
}

static int too_big(const struct budget *b, size_t len, uint64_t count, uint64_t bytes)
{
	TFAB_ERROR(SUBSYS,
		   "a TensorProto of %zu bytes and %llu elements would take %llu bytes decoded "
		   "(%llu of them its parse), more than %s (%llu bytes)",
		   len, (unsigned long long)count, (unsigned long long)bytes,
		   (unsigned long long)b->used, b->name, (unsigned long long)b->max);
	return -EMSGSIZE;
}

/* Saturating, for the refusal's figure: what count elements of width bytes would take. */
static uint64_t wanted(const struct budget *b, uint64_t count, uint64_t width, uint64_t fixed)
{
	if (width && count > (UINT64_MAX - fixed - b->used - 64) / width)
		return UINT64_MAX;
	return b->used + fixed + count * width;
}

/*
 * Zeroed memory for a decoded tensor's elements. Where the system lends transparent huge
 * pages on request, a large block asks for them before it is touched: filling 256 MiB in
 * 4 KiB pages costs 65,536 page faults, most of the decode's time (tools/bench/decode-cost.c).
 */
static void *zalloc(size_t size)
{
	const uintptr_t huge = 2u << 20;
	void *p = calloc(1, size);

#ifdef MADV_HUGEPAGE
	if (p && size >= 2 * huge) {
		uintptr_t a = ((uintptr_t)p + huge - 1) & ~(huge - 1);
		uintptr_t e = ((uintptr_t)p + size) & ~(huge - 1);

		/* a hint: the pages are small where it is refused */
		if (e > a)
			(void)madvise((void *)a, e - a, MADV_HUGEPAGE);
	}
#endif
	return p;
}

/*
 * Elements [given, count) of dst become copies of element given - 1 (given >= 1): memcpy of a
 * run of copies that doubles, up to 256 KiB, so that filling costs what writing it does.
 */
static void repeat_last(uint8_t *dst, size_t width, uint64_t given, uint64_t count)
{
	uint8_t *run = dst + (given - 1) * width;
	uint64_t have = 1, left = count - given, cap = (256u << 10) / width;

	while (left) {
		uint64_t k = have < left ? have : left;

		if (k > cap)
			k = cap;
		memcpy(run + have * width, run, k * width);
		have += k;
		left -= k;
	}
}

/*
 * TensorFlow's reading of a typed field (FromProtoField in its tensor.cc): n values for count
 * elements, the last one repeated when there are fewer, zeros when there are none (dst comes
 * zeroed), and only the first count read when there are more.
 */
static void fill_values(uint8_t *dst, uint64_t count, size_t width, const void *src, size_t n,
			size_t src_width, void (*conv)(uint8_t *dst, const void *src))
{
	uint64_t given = n < count ? n : count;

	for (uint64_t i = 0; i < given; i++)
		conv(dst + i * width, (const uint8_t *)src + i * src_width);
	if (given)
		repeat_last(dst, width, given, count);
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

static int decode_numeric(Tensorflow__TensorProto *m, struct budget *b, size_t len, int ndim,
			  const int64_t *shape, uint64_t count, DLManagedTensor **tensor_p)
{
	struct owned_tensor *o;
	DLDataType dt;
	uint64_t nbytes, w;
	int rc = dl_of_tf(m->dtype, &dt);

	if (rc)
		return rc;
	w = dt.bits / 8;
	/* Before any loop over the elements or allocation for them: the claim against the bound. */
	if (count > budget_left(b) / w || malloc_cost(count * w) > budget_left(b) ||
	    malloc_cost(sizeof(*o)) > budget_left(b) - malloc_cost(count * w))
		return too_big(b, len, count, wanted(b, count, w, malloc_cost(sizeof(*o))));
	nbytes = count * w;
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
		/* zeroed: what TensorFlow fills with when no values are given */
		o->data = zalloc(nbytes);
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

static int decode_strings(Tensorflow__TensorProto *m, struct budget *b, size_t len, int ndim,
			  const int64_t *shape, uint64_t count,
			  struct tfab_string_tensor **strings_p)
{
	const uint64_t w = sizeof(struct tfab_string);
	struct owned_strings *o;
	uint64_t given;
	int rc = 0;

	/* An element's entry, besides the message its bytes are in: bounded before anything. */
	if (count > (SIZE_MAX - sizeof(*o)) / w || count > budget_left(b) / w ||
	    malloc_cost(sizeof(*o) + count * w) > budget_left(b))
		return too_big(b, len, count, wanted(b, count, w, sizeof(*o) + 16));
	/* Each length takes a byte at least: refuse before allocating for them. */
	if (count && m->tensor_content.len && count > m->tensor_content.len)
		return bad("string lengths cut short in tensor_content");
	/* zeroed: empty strings, what TensorFlow fills with when no values are given */
	o = zalloc(sizeof(*o) + w * count);
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
		given = m->n_string_val < count ? m->n_string_val : count;
		for (uint64_t i = 0; i < given; i++) {
			o->strings[i].data = (const char *)m->string_val[i].data;
			o->strings[i].len = m->string_val[i].len;
		}
		/* An empty last string repeats as the zeroed entries already are. */
		if (given && o->strings[given - 1].len)
			repeat_last((uint8_t *)o->strings, w, given, count);
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
	return tfab__tensorproto_decode_shaped(buf, len, TFAB_TENSORPROTO_DEFAULT_MAX,
					       "tfab_tensorproto_decode's bound", -1, NULL,
					       tensor_p, strings_p);
}

int tfab_tensorproto_decode_max(const void *buf, size_t len, uint64_t max_bytes,
				DLManagedTensor **tensor_p, struct tfab_string_tensor **strings_p)
{
	return tfab__tensorproto_decode_shaped(buf, len, max_bytes, "max_bytes", -1, NULL, tensor_p,
					       strings_p);
}

int tfab__tensorproto_decode_shaped(const void *buf, size_t len, uint64_t max_bytes,
				    const char *max_name, int expect_ndim,
				    const int64_t *expect_shape, DLManagedTensor **tensor_p,
				    struct tfab_string_tensor **strings_p)
{
	Tensorflow__TensorProto *m;
	int64_t shape[TFAB_MAX_DIMS];
	struct budget b;
	uint64_t count = 1;
	int ndim, rc;

	if ((!buf && len) || (!tensor_p && !strings_p))
		return -EINVAL;
	if (tensor_p)
		*tensor_p = NULL;
	if (strings_p)
		*strings_p = NULL;
	budget_init(&b, max_bytes, max_name);
	m = tensorflow__tensor_proto__unpack(&b.pa, len, buf);
	if (!m && b.over) {
		TFAB_ERROR(SUBSYS,
			   "a TensorProto of %zu bytes takes more than %s (%llu bytes) to parse",
			   len, max_name, (unsigned long long)max_bytes);
		return -EMSGSIZE;
	}
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
		if (d && count > INT64_MAX / (uint64_t)d) { /* as TensorFlow: an int64 */
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
		rc = decode_strings(m, &b, len, ndim, shape, count, strings_p);
		if (rc == 0)
			return 0; /* the string tensor owns m */
		goto out;
	}
	if (!tensor_p) {
		TFAB_ERROR(SUBSYS, "a numeric TensorProto where a string one was expected");
		rc = -EPROTOTYPE;
		goto out;
	}
	rc = decode_numeric(m, &b, len, ndim, shape, count, tensor_p);
out:
	tensorflow__tensor_proto__free_unpacked(m, NULL);
	return rc;
}
