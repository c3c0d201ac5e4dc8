#include "cli/memcheck.h"

#include <stdio.h>

#include "common.h"
#include "parallel/grid.h"

int gj_mem_check(gj_comm world, double need, const char *detail, const char *hint, double mem_gb,
                 int *local) {
  int n = 1, rc = 0;
  if (gj_comm_node_size(world, &n)) n = 1;
  if (local) *local = n;
  double avail = mem_gb > 0 ? mem_gb * 1e9 : gj_mem_available_bytes() / n;
  if (avail > 0 && need > avail) {
    char how[GJ_PATH_BUF + 64];
    if (mem_gb > 0) snprintf(how, sizeof how, "given by --mem-per-rank-gb");
    else gj_mem_describe(how, sizeof how);
    rc = GJ_FAIL("the model needs %.2f GB per rank (%s) but %.2f GB are available per rank (%d "
                 "on this node, %s)%s%s", need / 1e9, detail, avail / 1e9, n, how, hint ? ": " : "",
                 hint ? hint : "");
  }
  return gj_agree(world, rc);
}

int gj_mem_check_local(double need, const char *detail) {
  double avail = gj_mem_available_bytes();
  if (avail <= 0 || need <= avail) return 0;
  char how[GJ_PATH_BUF + 64];
  gj_mem_describe(how, sizeof how);
  return GJ_FAIL("%s needs %.2f GB but %.2f GB are available (%s)", detail, need / 1e9, avail / 1e9, how);
}
