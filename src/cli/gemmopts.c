#include "cli/gemmopts.h"

#include "common.h"
#include "model/gemm.h"

int gj_cli_gemm_setup(const char *gemm, const char *precision, gj_comm world) {
  gj_gemm_backend b;
  gj_precision p;
  if (gj_gemm_backend_parse(gemm, &b))
    return GJ_FAIL("--gemm %s: unknown backend (auto, openblas, onednn)", gemm);
  if (gj_precision_parse(precision, &p))
    return GJ_FAIL("--precision %s: unknown precision (fp32, bf16)", precision);
  int rc = gj_gemm_setup(b, p);
  GJ_AGREE(world, rc);
  int same;
  GJ_TRY(gj_same_int(world, (int)gj_gemm_backend_in_use(), &same));
  if (!same) {
    /* ranks on different CPUs chose differently: oneDNN runs everywhere */
    gj_warn("ranks chose different GEMM backends; all use oneDNN");
    rc = gj_gemm_setup(GJ_GEMM_ONEDNN, p);
    GJ_AGREE(world, rc);
  }
  gj_cpu_features f;
  gj_cpu_detect(&f);
  if (p == GJ_PREC_BF16 && !f.amx_bf16 && gj_log_rank() == 0)
    gj_warn("--precision bf16 without AMX runs on AVX512_BF16 dot products, about half the fp32 "
            "FMA rate: fp32 is likely faster on this CPU (compare with gptj bench)");
  return 0;
}
