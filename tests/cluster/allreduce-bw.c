/* DP all-reduce bandwidth, the way gptj's DP reduces gradients (src/parallel/dp.c): in-place
 * MPI_Iallreduce of float buckets (16 MB by default) over one block, all posted, then waited
 * for, with libnbc's Rabenseifner algorithm as gptj chooses it (gj_comm_before_init; the
 * variable OMPI_MCA_coll_libnbc_iallreduce_algorithm, when set, wins: 2 is the binomial Open MPI
 * picks by itself for in-place calls). Prints the per-rank bandwidth in the sense of `gptj plan
 * --net-gbps`: bytes each rank sends in a ring all-reduce, 2 (p-1)/p of the block, over the time
 * (median of the runs), and checks every sum.
 *   mpicc -O2 -o allreduce-bw tests/cluster/allreduce-bw.c
 *   mpirun -np 2 ./allreduce-bw [MB of the block, 256] [MB per bucket, 16] [runs, 5] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", 0);
  MPI_Init(&argc, &argv);
  int rank, p;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  double mb = argc > 1 ? atof(argv[1]) : 256, bmb = argc > 2 ? atof(argv[2]) : 16;
  int runs = argc > 3 ? atoi(argv[3]) : 5;
  if (!(mb > 0) || !(bmb > 0) || runs < 1 || runs > 100) {
    if (rank == 0) fprintf(stderr, "allreduce-bw: error: usage: allreduce-bw [MB > 0] [bucket MB > 0] [runs 1..100]\n");
    MPI_Finalize();
    return 2;
  }
  size_t n = (size_t)(mb * 1e6 / 4), bucket = (size_t)(bmb * 1e6 / 4);
  if (bucket > n) bucket = n;
  size_t nb = (n + bucket - 1) / bucket;
  float *buf = malloc(n * sizeof *buf);
  MPI_Request *req = malloc(nb * sizeof *req);
  double *t = malloc((size_t)(runs + 1) * sizeof *t);
  if (!buf || !req || !t) {
    fprintf(stderr, "allreduce-bw: error: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  long wrong = 0;
  for (int r = 0; r <= runs; r++) { /* run 0 warms up */
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i % 7 + (size_t)rank); /* every page touched */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (size_t b = 0; b < nb; b++) {
      size_t lo = b * bucket, len = lo + bucket > n ? n - lo : bucket;
      MPI_Iallreduce(MPI_IN_PLACE, buf + lo, (int)len, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req[b]);
    }
    MPI_Waitall((int)nb, req, MPI_STATUSES_IGNORE);
    double dt = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    t[r] = dt;
    for (size_t i = 0; i < n; i++) /* integers: the sum is exact */
      wrong += buf[i] != (float)((double)p * (double)(i % 7) + p * (p - 1) / 2.0);
  }
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (wrong) {
    if (rank == 0) fprintf(stderr, "allreduce-bw: error: %ld sums wrong\n", wrong);
    MPI_Finalize();
    return 1;
  }
  qsort(t + 1, (size_t)runs, sizeof *t, cmp);
  double med = t[1 + runs / 2], bytes = (double)n * 4, sent = 2.0 * (p - 1) / p * bytes;
  if (rank == 0)
    printf("allreduce-bw: %d ranks, %.0f MB in %.0f MB buckets: %.3f s (median of %d), %.3f GB/s per rank "
           "(sent %.0f MB each), algorithm bandwidth %.3f GB/s (libnbc iallreduce algorithm %s)\n",
           p, bytes / 1e6, (double)bucket * 4 / 1e6, med, runs, sent / med / 1e9, sent / 1e6, bytes / med / 1e9,
           getenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm"));
  free(t);
  free(req);
  free(buf);
  MPI_Finalize();
  return 0;
}
