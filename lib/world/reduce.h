/*
 * The arithmetic of the collectives (doc/world.md): element-wise reduction of two arrays of
 * one dtype, the final division of an average, and the conversions of compression. Plain
 * loops, one per type and operation, that the compiler vectorises. No state, any thread.
 */
#ifndef TFAB_WORLD_REDUCE_H
#define TFAB_WORLD_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#include <tfab/world.h>

/* The element types the collectives reduce. */
enum tfab_rtype {
	TFAB_RT_F32,
	TFAB_RT_F64,
	TFAB_RT_F16,
	TFAB_RT_BF16,
	TFAB_RT_I32,
	TFAB_RT_I64,
	TFAB_RT_I8,
	TFAB_RT_U8,
	TFAB_RT_I16,
	TFAB_RT_U16,
	TFAB_RT_U32,
	TFAB_RT_U64,
};

/* The reduction type of a DLPack dtype: 0, or -EINVAL for one the collectives do not reduce. */
int tfab__rtype_of(DLDataType dt, enum tfab_rtype *rt_p);
size_t tfab__rtype_size(enum tfab_rtype rt);

/*
 * out[i] = a[i] op b[i] for n elements, a first (the order matters for floats). out may be a
 * or b. TFAB_OP_AVG sums: the division comes once, at the end (tfab__reduce_div). fp16 and
 * bf16 are computed in fp32 and rounded once per call. Integer sums and products wrap: the
 * low bits of the exact result, as a wider computation truncated gives them (torch's, gloo's).
 */
void tfab__reduce(enum tfab_op op, enum tfab_rtype rt, void *out, const void *a, const void *b,
		  size_t n);

/* x[i] /= d, for an average over d ranks (integers: truncated toward zero). */
void tfab__reduce_div(enum tfab_rtype rt, void *x, size_t n, int d);

/* IEEE half and bfloat16 to and from float, rounding to nearest even. */
float tfab__f16_to_f32(uint16_t h);
uint16_t tfab__f32_to_f16(float f);
float tfab__bf16_to_f32(uint16_t h);
uint16_t tfab__f32_to_bf16(float f);

/*
 * Compression of fp32 (allreduce's opts.compress). The size in bytes of n values compressed,
 * the compression of src into dst, and dst = a + decompressed(c) where a may be NULL (then
 * dst = decompressed(c)). INT8 keeps one fp32 scale per TFAB_INT8_BLOCK values, in front of
 * the block's bytes (max-abs scaling, rounded to nearest).
 */
#define TFAB_INT8_BLOCK 4096
size_t tfab__compressed_size(enum tfab_compress how, size_t n);
/*
 * With resid (error feedback): src + resid is compressed, and resid becomes what the
 * compression lost of it, to be added to the next compression of the same values.
 */
void tfab__compress(enum tfab_compress how, void *dst, const float *src, float *resid, size_t n);
void tfab__decompress_add(enum tfab_compress how, float *dst, const float *a, const void *c,
			  size_t n);

#endif
