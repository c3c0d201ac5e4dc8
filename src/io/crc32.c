#include "io/crc32.h"

#include <zlib.h>

/* zlib over any length (its length argument is 32-bit). */
static uint32_t zlib_crc(uint32_t crc, const unsigned char *p, size_t n) {
  uLong c = crc;
  for (size_t o = 0; o < n; o += (size_t)1 << 30) {
    size_t k = n - o < ((size_t)1 << 30) ? n - o : (size_t)1 << 30;
    c = crc32(c, p + o, (uInt)k);
  }
  return (uint32_t)c;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* The CRC register after the data equals the register after any other data congruent to it
 * modulo the polynomial, so 128-bit blocks are folded forward by multiplying with
 * x^(512±32) or x^(128±32) mod P (bit-reflected; the constants of Intel's "Fast CRC computation
 * for generic polynomials using PCLMULQDQ", also in Linux's crc32-pclmul). The last 16-byte
 * remainder is then run through zlib from a zero register, and the tail after it. */
__attribute__((target("pclmul,sse4.1"))) static inline __m128i fold(__m128i x, __m128i k, __m128i d) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), d);
}

__attribute__((target("pclmul,sse4.1"))) static uint32_t clmul_crc(uint32_t crc, const unsigned char *p, size_t n) {
  const __m128i k512 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL);
  const __m128i k128 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);
  __m128i x0 = _mm_loadu_si128((const __m128i *)p), x1 = _mm_loadu_si128((const __m128i *)(p + 16));
  __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 32)), x3 = _mm_loadu_si128((const __m128i *)(p + 48));
  x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128((int)~crc)); /* the register enters the first bytes */
  p += 64, n -= 64;
  for (; n >= 64; p += 64, n -= 64) {
    x0 = fold(x0, k512, _mm_loadu_si128((const __m128i *)p));
    x1 = fold(x1, k512, _mm_loadu_si128((const __m128i *)(p + 16)));
    x2 = fold(x2, k512, _mm_loadu_si128((const __m128i *)(p + 32)));
    x3 = fold(x3, k512, _mm_loadu_si128((const __m128i *)(p + 48)));
  }
  __m128i x = fold(fold(fold(x0, k128, x1), k128, x2), k128, x3);
  for (; n >= 16; p += 16, n -= 16) x = fold(x, k128, _mm_loadu_si128((const __m128i *)p));
  unsigned char rem[16];
  _mm_storeu_si128((__m128i *)rem, x);
  uint32_t reg = ~zlib_crc(0xffffffffu, rem, 16); /* register from zero over the remainder */
  return zlib_crc(~reg, p, n);
}

uint32_t gj_crc32(uint32_t crc, const void *p, size_t n) {
  /* __builtin_cpu_supports reads flags set once at start-up: cheap, and safe from threads */
  if (n < 256 || !__builtin_cpu_supports("pclmul") || !__builtin_cpu_supports("sse4.1"))
    return zlib_crc(crc, p, n);
  return clmul_crc(crc, p, n);
}
#else
uint32_t gj_crc32(uint32_t crc, const void *p, size_t n) { return zlib_crc(crc, p, n); }
#endif
