#include "parallel/gather.h"

#include <limits.h>
#include <stdlib.h>

#include "common.h"

gj_comm_info gj_comm_info_none(void) { return MPI_INFO_NULL; }

gj_replicas gj_replicas_of(const gj_grid *g, int tp_sharded) {
  if (tp_sharded) return (gj_replicas){g->dp, g->dp_size, g->dp_rank};
  return (gj_replicas){g->world, g->size, g->rank};
}

/* Each block from its owner, in pieces of GJ_CHUNK elements: for buffers whose offsets do not
 * fit MPI's int. */
static int gather_by_bcast(gj_comm c, char *buf, size_t esize, MPI_Datatype t, const size_t *cnt,
                           const size_t *dsp, int n) {
  for (int r = 0; r < n; r++)
    for (size_t off = 0; off < cnt[r]; off += GJ_CHUNK) {
      int m = (int)GJ_MIN(GJ_CHUNK, cnt[r] - off);
      GJ_MPI_TRY(MPI_Bcast(buf + (dsp[r] + off) * esize, m, t, r, c), "MPI_Bcast(gather)");
    }
  return 0;
}

static int allgatherv(gj_comm c, void *buf, size_t esize, MPI_Datatype t, const size_t *cnt,
                      const size_t *dsp) {
  int n = gj_comm_size(c);
  if (n == 1) return 0;
  size_t end = 0;
  for (int r = 0; r < n; r++) end = GJ_MAX(end, dsp[r] + cnt[r]);
  if (end > (size_t)INT_MAX) return gather_by_bcast(c, buf, esize, t, cnt, dsp, n);
  int *ic = malloc(2 * (size_t)n * sizeof(int)), *id = ic + n;
  if (!ic) return GJ_FAIL("out of memory");
  for (int r = 0; r < n; r++) ic[r] = (int)cnt[r], id[r] = (int)dsp[r];
  int e = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, ic, id, t, c);
  free(ic);
  GJ_MPI_TRY(e, "MPI_Allgatherv");
  return 0;
}

int gj_allgather_u32(gj_comm c, uint32_t *buf, size_t each) {
  int n = gj_comm_size(c);
  if (n == 1) return 0;
  if (each * (size_t)n <= (size_t)INT_MAX) {
    GJ_MPI_TRY(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (int)each, MPI_UINT32_T, c),
               "MPI_Allgather");
    return 0;
  }
  size_t *cnt = malloc(2 * (size_t)n * sizeof(size_t)), *dsp = cnt + n;
  if (!cnt) return GJ_FAIL("out of memory");
  for (int r = 0; r < n; r++) cnt[r] = each, dsp[r] = (size_t)r * each;
  int rc = gather_by_bcast(c, (char *)buf, sizeof(uint32_t), MPI_UINT32_T, cnt, dsp, n);
  free(cnt);
  return rc;
}

int gj_allgatherv_u32(gj_comm c, uint32_t *buf, const size_t *cnt, const size_t *dsp) {
  return allgatherv(c, buf, sizeof(uint32_t), MPI_UINT32_T, cnt, dsp);
}

int gj_allgatherv_f32(gj_comm c, float *buf, const size_t *cnt, const size_t *dsp) {
  return allgatherv(c, buf, sizeof(float), MPI_FLOAT, cnt, dsp);
}
