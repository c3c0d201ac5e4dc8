/* zlib's CRC-32 (the gzip/PNG polynomial, reflected), fast on x86-64 with PCLMULQDQ. */
#ifndef GJ_CRC32_H
#define GJ_CRC32_H

#include <stddef.h>
#include <stdint.h>

/* Same contract and values as zlib's crc32(crc, p, n): start with crc = 0, pass the previous
 * result to continue. Carry-less multiplication folds 64 bytes per step when the CPU has it;
 * zlib's own routine handles the rest and other CPUs. */
uint32_t gj_crc32(uint32_t crc, const void *p, size_t n);

#endif
