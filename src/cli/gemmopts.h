/* --gemm and --precision, shared by train, eval, generate and bench. */
#ifndef GJ_CLI_GEMMOPTS_H
#define GJ_CLI_GEMMOPTS_H

#include "model/gemm.h"
#include "parallel/grid.h"

#define GJ_GEMM_HELP "GEMM backend: auto, openblas, onednn (auto: fp32 on OpenBLAS's AVX-512 or AVX2 kernel; bf16 on oneDNN with AMX, else on whichever of AVX512_BF16 (onednn) and the fp32 FMA on bf16 values (openblas) peaks higher here)"
#define GJ_PRECISION_HELP                                                                   \
  "fp32, or bf16: bfloat16 GEMM operands and activation copies, the rest float32 (needs AMX or " \
  "AVX512_BF16, or --gemm openblas on any CPU; without AMX about fp32's speed, on the fp32 FMA " \
  "units, in less memory; decoding, which reads each weight once, faster: half the bytes)"

/* Parse both flags (a clear error naming the flag). */
int gj_cli_gemm_parse(const char *gemm, const char *precision, gj_gemm_backend *b, gj_precision *p);
/* Parse both flags, choose and check the backend on every rank (gj_gemm_setup), and make
 * every rank use the same one. (gj_gemm_describe() names it.) */
int gj_cli_gemm_setup(const char *gemm, const char *precision, gj_comm world);

#endif
