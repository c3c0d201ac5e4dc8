/* Shared error handling and small helpers.
 *
 * Setup and I/O functions return 0 on success and -1 on error, after recording one line of
 * text (naming the file, key or flag) with GJ_FAIL. Callers propagate with GJ_TRY. Only main
 * turns the recorded message into output and an exit code. Kernels use assert only. */
#ifndef GJ_COMMON_H
#define GJ_COMMON_H

#include <stddef.h>
#include <stdint.h>

/* Longest path gptj handles (PATH_MAX), and buffers for a path plus a suffix. A path that
 * does not fit is refused with gj_path_join's error, never truncated. */
#define GJ_PATH_MAX 4096
#define GJ_PATH_BUF (GJ_PATH_MAX + 64)
/* out = a "/" b (b alone if a is NULL); -1 with an error naming the path if it is longer
 * than GJ_PATH_MAX. */
int gj_path_join(char *out, size_t n, const char *a, const char *b);

#define GJ_ERRMSG_MAX 8192 /* room for a path of PATH_MAX and the reason */

/* Record an error message (printf-style) with the source location; returns -1. */
int gj_fail_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define GJ_FAIL(...) gj_fail_at(__FILE__, __LINE__, __VA_ARGS__)
/* Propagate an error code. */
#define GJ_TRY(expr)                                                                         \
  do {                                                                                       \
    int gj_rc_ = (expr);                                                                     \
    if (gj_rc_) return gj_rc_;                                                               \
  } while (0)

const char *gj_errmsg(void);   /* last message ("" if none) */
/* Prefix the recorded message with "<prefix>: "; returns -1. */
int gj_err_prefix(const char *prefix);
const char *gj_errwhere(void); /* "file.c:123" of the last GJ_FAIL */
void gj_err_clear(void);

/* Logging: info goes to stdout on rank 0 only (to stderr after gj_info_to_stderr(): commands
 * whose stdout is their data, such as generate's text); warnings/errors to stderr on any rank. */
void gj_info_to_stderr(void);
void gj_log_set_rank(int rank);
int gj_log_rank(void); /* the rank given to gj_log_set_rank (0 by default) */
void gj_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void gj_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Aligned allocation (64 bytes) of n bytes, zeroed; NULL on failure. Free with free(). */
void *gj_alloc(size_t n);

/* Parse whole-string numbers; return 0 on success, -1 if not a valid number. */
int gj_parse_i64(const char *s, int64_t *out);
int gj_parse_f64(const char *s, double *out);

double gj_now(void); /* monotonic seconds */
/* Available memory in bytes: /proc/meminfo's MemAvailable, or less where the process's cgroup
 * (v1 or v2; what Slurm's --mem sets) limits it (0 if unknown). GJ_CGROUP_ROOT replaces
 * /sys/fs/cgroup (tests). */
double gj_mem_available_bytes(void);
/* This process's resident memory now (VmRSS), bytes; 0 if /proc cannot tell. */
double gj_self_rss_bytes(void);
/* Its peak resident memory so far (VmHWM), bytes; 0 if /proc cannot tell. */
double gj_self_hwm_bytes(void);
/* The ranks of this job on this node (main sets it under MPI; 1 by default), and
 * gj_mem_available_bytes() divided by them: what one rank may hold. */
void gj_set_node_ranks(int n);
double gj_mem_share_bytes(void);
/* Which bound gj_mem_available_bytes used, for messages. */
void gj_mem_describe(char *out, size_t n);
/* The tightest memory limit of the cgroups (and their ancestors) listed in proc_cgroup (the
 * format of /proc/self/cgroup), in the cgroup file systems under root: limit and what is
 * left under it, in bytes, and the directory of that cgroup. -1 (limit -1) if none. */
typedef struct {
  double limit, available;
  char path[GJ_PATH_BUF];
} gj_cgroup_mem;
int gj_cgroup_memory(const char *proc_cgroup, const char *root, gj_cgroup_mem *out);

/* Sizes: n = a * b (and n = a + b) for sizes read from files or flags; -1 on overflow. */
int gj_mul_size(size_t *n, size_t a, size_t b);
int gj_add_size(size_t *n, size_t a, size_t b);

/* Signals. gj_signals_install is the first thing main does. In the default mode SIGINT,
 * SIGTERM, SIGHUP and SIGUSR1 remove the registered temporary files and end the process by
 * the signal. In graceful mode (gptj train) they only record a stop request, read with
 * gj_stop_signal(), and the program stops at its next stop point; a second SIGINT or SIGTERM
 * removes the temporaries and ends the process at once (after a SIGUSR1 the first SIGINT or
 * SIGTERM is a stop request still: a scheduler's checkpoint request, then its SIGTERM). */
void gj_signals_install(int graceful);
int gj_stop_signal(void); /* the stop signal received (SIGUSR1's replaced by a later SIGINT or SIGTERM), 0 if none */
/* Hold the stop signals (1) until released (0): around the renames of outputs that belong
 * together, so that a signal leaves all of them old or all new. */
void gj_signals_hold(int on);
/* While they are held: the stop signal waiting (one the process ignores, as nohup's SIGHUP, is
 * not a stop), or the one received before; 0 if none. */
int gj_stop_pending(void);
const char *gj_signal_name(int sig); /* "SIGUSR1", ... */
/* Return code of a command stopped cleanly by a signal before it did anything (main exits 0
 * with the recorded message). */
#define GJ_STOPPED (-2)
/* Temporary files to remove if a signal ends the process (up to 16 at once). */
void gj_tmp_register(const char *path);
void gj_tmp_unregister(const char *path);
/* A directory made for the outputs (NULL: none): a stop signal that ends the process removes it
 * after the temporaries, if it is then empty. */
void gj_tmp_register_dir(const char *path);

/* The world's size, for checks that depend on it (gj_log_set_world; 1 by default). */
void gj_log_set_world(int rank, int size);
int gj_log_world(void);

/* A hot elementwise kernel: GCC compiles it (and the OpenMP bodies outlined from it) twice, for
 * the build's target (x86-64-v3: AVX2) and for x86-64-v4 (AVX-512, 16 floats a vector), and
 * picks one when the program loads, by the CPU it runs on. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GJ_HOT __attribute__((target_clones("arch=x86-64-v4", "default")))
#else
#define GJ_HOT
#endif

#define GJ_MIN(a, b) ((a) < (b) ? (a) : (b))
#define GJ_MAX(a, b) ((a) > (b) ? (a) : (b))
/* TP rank k's part of n rows (or columns) split over p ranks: n / p each, and one more on the
 * first n % p ranks (the vocabulary, which TP need not divide; heads and n_inner it must).
 * Returns the count, *first the global index of the first. */
static inline int64_t gj_split(int64_t n, int p, int k, int64_t *first) {
  int64_t q = n / p, r = n % p;
  if (first) *first = q * k + (k < r ? k : r);
  return q + (k < r);
}

/* SplitMix64 (Steele, Lea, Flood 2014): advance *state by the golden-ratio increment and
 * return the mixed value. The one generator of the program's pseudo-randomness (parameter
 * initialisation, the loader's shuffle, sampling); its output sequences are part of the
 * tests' expected results. */
static inline uint64_t gj_splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
/* The same as a counter-based hash: the value SplitMix64 draws from state z. */
static inline uint64_t gj_mix64(uint64_t z) { return gj_splitmix64(&z); }

#endif
