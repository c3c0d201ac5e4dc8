#include "cli/gemmopts.h"

#include "common.h"
#include "model/gemm.h"

int gj_cli_gemm_parse(const char *gemm, const char *precision, gj_gemm_backend *b, gj_precision *p) {
  if (gj_gemm_backend_parse(gemm, b))
    return GJ_FAIL("--gemm %s: unknown backend (auto, openblas, onednn)", gemm);
  if (gj_precision_parse(precision, p))
    return GJ_FAIL("--precision %s: unknown precision (fp32, bf16)", precision);
  return 0;
}

int gj_cli_gemm_setup(const char *gemm, const char *precision, gj_comm world) {
  gj_gemm_backend b;
  gj_precision p;
  GJ_TRY(gj_cli_gemm_parse(gemm, precision, &b, &p));
  int rc = gj_gemm_setup(b, p);
  GJ_AGREE(world, rc);
  int same;
  GJ_TRY(gj_same_int(world, (int)gj_gemm_backend_in_use(), &same));
  int chosen = b == GJ_GEMM_AUTO && same; /* auto's own pick on this rank's CPU */
  if (!same) {
    /* ranks on different CPUs chose differently: oneDNN runs everywhere */
    gj_warn("ranks chose different GEMM backends; all use oneDNN");
    rc = gj_gemm_setup(GJ_GEMM_ONEDNN, p);
    GJ_AGREE(world, rc);
  }
  if (gj_gemm_backend_in_use() == GJ_GEMM_OPENBLAS) {
    /* the same kernel on every rank, or the ranks' products round differently */
    unsigned h = 2166136261u;
    for (const char *c = gj_blas_core(); *c; c++) h = (h ^ (unsigned char)(*c | 0x20)) * 16777619u;
    GJ_TRY(gj_same_int(world, (int)(h & 0x7fffffff), &same));
    if (!same && gj_log_rank() == 0)
      gj_warn("ranks run different OpenBLAS kernels (this rank: %s; CPUs of different kinds?), so their "
              "products round differently; GJ_OPENBLAS_CORETYPE=NAME sets one kernel for all", gj_blas_core());
  }
  gj_cpu_features f;
  gj_cpu_detect(&f);
  if (p == GJ_PREC_BF16 && !f.amx_bf16 && gj_log_rank() == 0) {
    if (gj_gemm_backend_in_use() == GJ_GEMM_ONEDNN && chosen)
      gj_info("--precision bf16 without AMX: the products run on AVX512_BF16 dot products, whose "
              "peak here is above the fp32 FMA's (measured at start; --gemm openblas takes the FMA)");
    else if (gj_gemm_backend_in_use() == GJ_GEMM_ONEDNN)
      gj_warn("--precision bf16 without AMX runs on AVX512_BF16 dot products, which on this CPU may "
              "be slower than the fp32 FMA (--gemm auto measures and picks; compare with gptj bench)");
    else if (!f.avx512_bf16)
      gj_info("--precision bf16 on a CPU without AMX-BF16 or AVX512_BF16: the products run on the fp32 "
              "FMA units on bfloat16 values (same results as bf16 products, float32 sums), at fp32's "
              "speed at best (decoding, which reads each weight once, reads half its bytes), in less memory");
    else if (chosen)
      gj_info("--precision bf16 without AMX: the products run on the fp32 FMA units on bfloat16 "
              "values (same results as bf16 products, float32 sums), faster here than AVX512_BF16; "
              "--gemm onednn takes the dot products");
    else
      gj_info("--precision bf16 with --gemm openblas: the products run on the fp32 FMA units on bfloat16 "
              "values (same results as bf16 products, float32 sums); --gemm auto measures which is faster here");
  }
  return 0;
}
