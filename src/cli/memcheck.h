/* The memory check every command makes before it allocates a model: what the layout needs
 * per rank against what this node offers per rank (MemAvailable, or the cgroup limit that
 * Slurm's --mem sets, over the ranks on the node; or --mem-per-rank-gb). */
#ifndef GJ_CLI_MEMCHECK_H
#define GJ_CLI_MEMCHECK_H

#include "parallel/comm.h"

/* Collective over world. need: bytes per rank; detail: what they are ("parameters 1.2, ...");
 * hint: what the user can do. mem_gb > 0 replaces the measured memory. Refuses, on every
 * rank, if any rank lacks the memory. *local: ranks on this node (may be NULL). */
int gj_mem_check(gj_comm world, double need, const char *detail, const char *hint, double mem_gb,
                 int *local);

/* The same for a command of one process (no MPI): need against this process's memory. */
int gj_mem_check_local(double need, const char *detail);

#endif
