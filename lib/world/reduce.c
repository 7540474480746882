/*
 * The collectives' arithmetic (reduce.h): one plain loop per type and operation, which gcc
 * vectorises at -O2 (with a check for overlap where out is a or b), and the fp16, bf16 and
 * int8 conversions of compression.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "world/reduce.h"

int tfab__rtype_of(DLDataType dt, enum tfab_rtype *rt_p)
{
	if (dt.lanes != 1)
		return -EINVAL;
	if (dt.code == kDLFloat && dt.bits == 32)
		*rt_p = TFAB_RT_F32;
	else if (dt.code == kDLFloat && dt.bits == 64)
		*rt_p = TFAB_RT_F64;
	else if (dt.code == kDLFloat && dt.bits == 16)
		*rt_p = TFAB_RT_F16;
	else if (dt.code == kDLBfloat && dt.bits == 16)
		*rt_p = TFAB_RT_BF16;
	else if (dt.code == kDLInt && dt.bits == 8)
		*rt_p = TFAB_RT_I8;
	else if (dt.code == kDLInt && dt.bits == 16)
		*rt_p = TFAB_RT_I16;
	else if (dt.code == kDLInt && dt.bits == 32)
		*rt_p = TFAB_RT_I32;
	else if (dt.code == kDLInt && dt.bits == 64)
		*rt_p = TFAB_RT_I64;
	else if (dt.code == kDLUInt && dt.bits == 8)
		*rt_p = TFAB_RT_U8;
	else if (dt.code == kDLUInt && dt.bits == 16)
		*rt_p = TFAB_RT_U16;
	else if (dt.code == kDLUInt && dt.bits == 32)
		*rt_p = TFAB_RT_U32;
	else if (dt.code == kDLUInt && dt.bits == 64)
		*rt_p = TFAB_RT_U64;
	else
		return -EINVAL;
	return 0;
}

size_t tfab__rtype_size(enum tfab_rtype rt)
{
	switch (rt) {
	case TFAB_RT_F64:
	case TFAB_RT_I64:
	case TFAB_RT_U64:
		return 8;
	case TFAB_RT_F16:
	case TFAB_RT_BF16:
	case TFAB_RT_I16:
	case TFAB_RT_U16:
		return 2;
	case TFAB_RT_I8:
	case TFAB_RT_U8:
		return 1;
	default:
		return 4;
	}
}

static uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

static float bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

float tfab__f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;

	if (exp == 0x1f)
		return bits_f32(sign | 0x7f800000u | (mant << 13));
	if (exp)
		return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
	/* zero or subnormal: mant x 2^-24, exactly representable in fp32 */
	return bits_f32(sign | f32_bits((float)mant * 0x1p-24f));
}

uint16_t tfab__f32_to_f16(float f)
{
	uint32_t u = f32_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;

	if (a > 0x7f800000u)
		return (uint16_t)(sign | 0x7e00u); /* NaN */
	if (a >= 0x47800000u)
		return (uint16_t)(sign | 0x7c00u); /* 2^16 and above: infinity */
	if (a < 0x38800000u) {
		/* below 2^-14: a subnormal half; adding 0.5 rounds the bits into place */
		float m = bits_f32(a) + 0.5f;

		return (uint16_t)(sign | (f32_bits(m) - f32_bits(0.5f)));
	}
	/* normal: rebias, round to nearest even (a carry may make it infinity: right) */
	a += 0xc8000fffu + ((a >> 13) & 1u); /* (15 - 127) << 23, plus the rounding */
	return (uint16_t)(sign | (a >> 13));
}

float tfab__bf16_to_f32(uint16_t h)
{
	return bits_f32((uint32_t)h << 16);
}

uint16_t tfab__f32_to_bf16(float f)
{
	uint32_t u = f32_bits(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40u); /* a quiet NaN */
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#define OP_SUM(x, y) ((x) + (y))
#define OP_PROD(x, y) ((x) * (y))
/* An integer product in uint32_t at least: uint8 and uint16 would multiply as int, and overflow. */
#define OP_PROD32(x, y) ((uint32_t)(x) * (uint32_t)(y))
#define OP_MIN(x, y) ((y) < (x) ? (y) : (x))
#define OP_MAX(x, y) ((y) > (x) ? (y) : (x))

/* out = a op b for a plain C type. */
#define REDUCE_PLAIN(T, OP)                    \
	do {                                   \
		T *o = out;                    \
		const T *x = a, *y = b;        \
		for (size_t i = 0; i < n; i++) \
			o[i] = OP(x[i], y[i]); \
	} while (0)

/* The same through fp32, for a 16-bit type with its two conversions. */
#define REDUCE_16(TO32, FROM32, OP)                                \
	do {                                                       \
		uint16_t *o = out;                                 \
		const uint16_t *x = a, *y = b;                     \
		for (size_t i = 0; i < n; i++)                     \
			o[i] = FROM32(OP(TO32(x[i]), TO32(y[i]))); \
	} while (0)

#define REDUCE_BY_OP(MACRO, ...)                     \
	do {                                         \
		switch (op) {                        \
		case TFAB_OP_MIN:                    \
			MACRO(__VA_ARGS__, OP_MIN);  \
			break;                       \
		case TFAB_OP_MAX:                    \
			MACRO(__VA_ARGS__, OP_MAX);  \
			break;                       \
		case TFAB_OP_PROD:                   \
			MACRO(__VA_ARGS__, OP_PROD); \
			break;                       \
		default:                             \
			MACRO(__VA_ARGS__, OP_SUM);  \
			break;                       \
		}                                    \
	} while (0)

/*
 * An integer type T (UT: its unsigned twin): sums and products wrap, computed in UT (no
 * undefined overflow; the same low bits as a wider signed computation truncated, which is
 * what torch and gloo give), PROD with the product macro PM; MIN and MAX compare as T.
 */
#define REDUCE_INT(T, UT, PM)                     \
	do {                                      \
		switch (op) {                     \
		case TFAB_OP_MIN:                 \
			REDUCE_PLAIN(T, OP_MIN);  \
			break;                    \
		case TFAB_OP_MAX:                 \
			REDUCE_PLAIN(T, OP_MAX);  \
			break;                    \
		case TFAB_OP_PROD:                \
			REDUCE_PLAIN(UT, PM);     \
			break;                    \
		default:                          \
			REDUCE_PLAIN(UT, OP_SUM); \
			break;                    \
		}                                 \
	} while (0)

void tfab__reduce(enum tfab_op op, enum tfab_rtype rt, void *out, const void *a, const void *b,
		  size_t n)
{
	switch (rt) {
	case TFAB_RT_F32:
		REDUCE_BY_OP(REDUCE_PLAIN, float);
		break;
	case TFAB_RT_F64:
		REDUCE_BY_OP(REDUCE_PLAIN, double);
		break;
	case TFAB_RT_I8:
		REDUCE_INT(int8_t, uint8_t, OP_PROD32);
		break;
	case TFAB_RT_U8:
		REDUCE_INT(uint8_t, uint8_t, OP_PROD32);
		break;
	case TFAB_RT_I16:
		REDUCE_INT(int16_t, uint16_t, OP_PROD32);
		break;
	case TFAB_RT_U16:
		REDUCE_INT(uint16_t, uint16_t, OP_PROD32);
		break;
	case TFAB_RT_I32:
		REDUCE_INT(int32_t, uint32_t, OP_PROD32);
		break;
	case TFAB_RT_U32:
		REDUCE_INT(uint32_t, uint32_t, OP_PROD32);
		break;
	case TFAB_RT_I64:
		REDUCE_INT(int64_t, uint64_t, OP_PROD);
		break;
	case TFAB_RT_U64:
		REDUCE_INT(uint64_t, uint64_t, OP_PROD);
		break;
	case TFAB_RT_F16:
		REDUCE_BY_OP(REDUCE_16, tfab__f16_to_f32, tfab__f32_to_f16);
		break;
	case TFAB_RT_BF16:
		REDUCE_BY_OP(REDUCE_16, tfab__bf16_to_f32, tfab__f32_to_bf16);
		break;
	}
}

/* x[i] /= d over n values of T (integers: toward zero; the narrow ones divide as int). */
#define DIV_PLAIN(T)                           \
	do {                                   \
		T *v = x;                      \
		for (size_t i = 0; i < n; i++) \
			v[i] /= d;             \
	} while (0)

void tfab__reduce_div(enum tfab_rtype rt, void *x, size_t n, int d)
{
	switch (rt) {
	case TFAB_RT_F32:
		DIV_PLAIN(float);
		break;
	case TFAB_RT_F64:
		DIV_PLAIN(double);
		break;
	case TFAB_RT_I8:
		DIV_PLAIN(int8_t);
		break;
	case TFAB_RT_U8:
		DIV_PLAIN(uint8_t);
		break;
	case TFAB_RT_I16:
		DIV_PLAIN(int16_t);
		break;
	case TFAB_RT_U16:
		DIV_PLAIN(uint16_t);
		break;
	case TFAB_RT_I32:
		DIV_PLAIN(int32_t);
		break;
	case TFAB_RT_U32:
		DIV_PLAIN(uint32_t);
		break;
	case TFAB_RT_I64:
		DIV_PLAIN(int64_t);
		break;
	case TFAB_RT_U64:
		DIV_PLAIN(uint64_t);
		break;
	case TFAB_RT_F16: {
		uint16_t *v = x;

		for (size_t i = 0; i < n; i++)
			v[i] = tfab__f32_to_f16(tfab__f16_to_f32(v[i]) / (float)d);
		break;
	}
	case TFAB_RT_BF16: {
		uint16_t *v = x;

		for (size_t i = 0; i < n; i++)
			v[i] = tfab__f32_to_bf16(tfab__bf16_to_f32(v[i]) / (float)d);
		break;
	}
	}
}

static size_t int8_blocks(size_t n)
{
	return (n + TFAB_INT8_BLOCK - 1) / TFAB_INT8_BLOCK;
}

size_t tfab__compressed_size(enum tfab_compress how, size_t n)
{
	switch (how) {
	case TFAB_COMPRESS_FP16:
	case TFAB_COMPRESS_BF16:
		return 2 * n;
	case TFAB_COMPRESS_INT8:
		return 4 * int8_blocks(n) + n;
	default:
		return 4 * n;
	}
}

/*
 * The step of a block whose largest |value| is m (finite, > 0): m / 127, rounded so that every
 * value lands within half a step. Where the step is subnormal its rounding is coarse: it goes
 * up a unit if m would lie beyond 127.5 steps (and so clip), and is never 0. Near FLT_MAX it
 * goes down a unit if 127 steps would overflow to infinity.
 */
static float int8_scale(float m)
{
	float scale = m / 127.0f;

	if ((double)scale * 127.5 < (double)m)
		scale = nextafterf(scale, INFINITY);
	if (isinf(127.0f * scale))
		scale = nextafterf(scale, 0.0f);
	return scale;
}

/* With resid: src + resid is quantized, and resid keeps what quantizing lost. */
static void int8_compress(uint8_t *dst, const float *src, float *resid, size_t n)
{
	for (size_t b = 0; b < n; b += TFAB_INT8_BLOCK) {
		size_t len = n - b < TFAB_INT8_BLOCK ? n - b : TFAB_INT8_BLOCK;
		const float *x = src + b;
		float *e = resid ? resid + b : NULL;
		int8_t *q = (int8_t *)(dst + 4);
		float m = 0.0f, scale, inv, pre;

		if (e) {
			for (size_t i = 0; i < len; i++)
				e[i] += x[i]; /* the value to send, for now */
			x = e;
		}
		for (size_t i = 0; i < len; i++) {
			float v = fabsf(x[i]);

			m = v > m ? v : m;
		}
		scale = isfinite(m) && m > 0.0f ? int8_scale(m) : 0.0f;
		/* a step below 2^-100 has no fp32 inverse: scale x and the inverse by 2^64 */
		pre = scale > 0.0f && scale < 0x1p-100f ? 0x1p64f : 1.0f;
		inv = scale > 0.0f ? 1.0f / (scale * pre) : 0.0f;
		memcpy(dst, &scale, 4);
		for (size_t i = 0; i < len; i++) {
			float v = rintf(x[i] * pre * inv);
			int8_t qi = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : (int)v);

			q[i] = qi;
			if (e)
				e[i] -= (float)qi * scale;
		}
		dst += 4 + len;
	}
}

static void int8_decompress_add(float *dst, const float *a, const uint8_t *c, size_t n)
{
	for (size_t b = 0; b < n; b += TFAB_INT8_BLOCK) {
		size_t len = n - b < TFAB_INT8_BLOCK ? n - b : TFAB_INT8_BLOCK;
		const int8_t *q = (const int8_t *)(c + 4);
		float scale;

		memcpy(&scale, c, 4);
		for (size_t i = 0; i < len; i++)
			dst[b + i] = (a ? a[b + i] : 0.0f) + (float)q[i] * scale;
		c += 4 + len;
	}
}

/* One 16-bit conversion with error feedback: e becomes what the conversion lost. */
#define COMPRESS_16(TO16, FROM16)                                     \
	do {                                                          \
		for (size_t i = 0; i < n; i++) {                      \
			float v = src[i] + (resid ? resid[i] : 0.0f); \
                                                                      \
			h[i] = TO16(v);                               \
			if (resid)                                    \
				resid[i] = v - FROM16(h[i]);          \
		}                                                     \
	} while (0)

void tfab__compress(enum tfab_compress how, void *dst, const float *src, float *resid, size_t n)
{
	uint16_t *h = dst;

	switch (how) {
	case TFAB_COMPRESS_FP16:
		COMPRESS_16(tfab__f32_to_f16, tfab__f16_to_f32);
		break;
	case TFAB_COMPRESS_BF16:
		COMPRESS_16(tfab__f32_to_bf16, tfab__bf16_to_f32);
		break;
	case TFAB_COMPRESS_INT8:
		int8_compress(dst, src, resid, n);
		break;
	default:
		memmove(dst, src, 4 * n);
		break;
	}
}

void tfab__decompress_add(enum tfab_compress how, float *dst, const float *a, const void *c,
			  size_t n)
{
	const uint16_t *h = c;

	switch (how) {
	case TFAB_COMPRESS_FP16:
		for (size_t i = 0; i < n; i++)
			dst[i] = (a ? a[i] : 0.0f) + tfab__f16_to_f32(h[i]);
		break;
	case TFAB_COMPRESS_BF16:
		for (size_t i = 0; i < n; i++)
			dst[i] = (a ? a[i] : 0.0f) + tfab__bf16_to_f32(h[i]);
		break;
	case TFAB_COMPRESS_INT8:
		int8_decompress_add(dst, a, c, n);
		break;
	default: {
		const float *v = c;

		for (size_t i = 0; i < n; i++)
			dst[i] = (a ? a[i] : 0.0f) + v[i];
		break;
	}
	}
}
