/* Megatron-LM / GPT-NeoX indexed datasets (the MMIDIDX format) read as a gptj token dataset:
 * PREFIX.idx (the index) and PREFIX.bin (the token ids of every sequence, one after another).
 *
 * PREFIX.idx, little-endian, as Megatron's indexed_dataset.py writes it:
 *   magic    9 bytes  "MMIDIDX\0\0"
 *   version  uint64   1
 *   dtype    uint8    1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32,
 *                     8 uint16 (read: 1, 3, 4, 5, 8; the others are refused)
 *   S        uint64   sequence count
 *   D        uint64   document count (document boundaries: number of documents + 1)
 *   lengths  int32[S] tokens of each sequence
 *   pointers int64[S] byte offset of each sequence in PREFIX.bin
 *   docs     int64[D] sequence index where each document starts, 0 first and S last
 * The token stream read is the concatenation of the sequences (n_tokens = sum of lengths);
 * nothing is added between them (a preprocessor that appended EOD left it in the .bin).
 * Every count and offset is checked against the sizes of both files before use: the .idx is
 * exactly 34 + 12 S + 8 D bytes, the pointers are those of sequences laid end to end from 0,
 * and they end exactly at the end of PREFIX.bin. The .bin is memory-mapped. */
#ifndef GJ_IO_MEGATRON_H
#define GJ_IO_MEGATRON_H

#include <stddef.h>
#include <stdint.h>

#include "io/dataset.h"

/* Whether path names a Megatron dataset, and its prefix (prefix[n]): path ends in ".bin" or
 * ".idx" (the prefix is path without it), or path is a prefix, PATH.idx existing. */
int gj_megatron_is(const char *path, char *prefix, size_t n);
/* Open the dataset PREFIX.bin + PREFIX.idx into d (as gj_dataset_open). */
int gj_megatron_open(gj_dataset *d, const char *prefix, int64_t max_vocab);

#endif
