/* Large copies with non-temporal stores (SSE2, baseline on x86-64), memcpy elsewhere. */
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "providers/shm/copy.h"

#if defined(__x86_64__)
static void copy_stream(uint8_t *d, const uint8_t *s, size_t len)
{
	size_t head = (16 - ((uintptr_t)d & 15)) & 15;

	memcpy(d, s, head);
	d += head;
	s += head;
	len -= head;
	for (; len >= 64; d += 64, s += 64, len -= 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)s);
		__m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
		__m128i e = _mm_loadu_si128((const __m128i *)(s + 48));

		_mm_stream_si128((__m128i *)d, a);
		_mm_stream_si128((__m128i *)(d + 16), b);
		_mm_stream_si128((__m128i *)(d + 32), c);
		_mm_stream_si128((__m128i *)(d + 48), e);
	}
	memcpy(d, s, len);
	/* Streaming stores are weakly ordered: the entry that publishes them must come after. */
	_mm_sfence();
}
#endif

void tfab_shm_copy(void *dst, const void *src, size_t len, bool stream)
{
#if defined(__x86_64__)
	if (stream && len >= 64) {
		copy_stream(dst, src, len);
		return;
	}
#else
	(void)stream;
#endif
	memcpy(dst, src, len);
#if defined(__x86_64__)
	/* glibc's memcpy streams above its own threshold, and fences; this is cheap if not. */
	_mm_sfence();
#endif
}
