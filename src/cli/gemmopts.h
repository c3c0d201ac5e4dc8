/* --gemm and --precision, shared by train, eval, generate and bench. */
#ifndef GJ_CLI_GEMMOPTS_H
#define GJ_CLI_GEMMOPTS_H

#include "parallel/grid.h"

#define GJ_GEMM_HELP "GEMM backend: auto, openblas, onednn (auto: OpenBLAS's AVX-512 or AVX2 kernel for fp32, oneDNN for bf16)"
#define GJ_PRECISION_HELP                                                                   \
  "fp32, or bf16: bfloat16 GEMM operands, the rest float32 (AMX; without AMX, AVX512_BF16 is "  \
  "slower than fp32)"

/* Parse both flags, choose and check the backend on every rank (gj_gemm_setup), and make
 * every rank use the same one. (gj_gemm_describe() names it.) */
int gj_cli_gemm_setup(const char *gemm, const char *precision, gj_comm world);

#endif
