/* Run directories (DESIGN.md §5): checkpoints ckpt-NNNNNNNN.h5, `latest` (the name of the
 * newest complete one), config.conf, metrics.jsonl and `lock`. Plain POSIX; in a parallel
 * job rank 0 does this work and the results are agreed on.
 *
 * The lock is a file created with O_EXCL (atomic on local file systems and on NFS v3+,
 * Lustre and GPFS), holding the holder's pid, host, Slurm job and start time. A thread of the
 * holder touches it every GJ_LOCK_STALE_S / 5 seconds. A lock is stale, and is taken over
 * with a warning, when its holder is a dead process on this host, or when it has not been
 * touched for GJ_LOCK_STALE_S seconds (default 300; a holder on another host that crashed).
 * A lock removed under its holder is created again by it (unless the holder had not touched it
 * for GJ_LOCK_STALE_S / 2: then it stops); a holder that finds another's text in it, or cannot
 * refresh it for GJ_LOCK_STALE_S / 2, stops without saving. It is removed when the holder exits, also after an error or a second interrupt. */
#ifndef GJ_IO_RUNDIR_H
#define GJ_IO_RUNDIR_H

#include <stddef.h>
#include <stdint.h>

/* dir/ckpt-%08lld.h5; -1 if the path would be longer than GJ_PATH_MAX. */
int gj_ckpt_path(char *out, size_t n, const char *dir, int64_t step);

/* Create dir and its parents (mkdir -p); a component that is not a directory is an error. */
int gj_rundir_create(const char *dir);
/* Remove the directories gj_rundir_create made, if they are still empty (a run that failed
 * before writing anything leaves no empty --run-dir behind). */
void gj_rundir_discard_new(void);

/* The steps of dir's checkpoints, newest first (*steps malloc'd, *n of them; 0 if the
 * directory does not exist). */
int gj_rundir_steps(const char *dir, int64_t **steps, int *n);
/* The step of the checkpoint `latest` names (-1 if there is no usable `latest`). */
int64_t gj_rundir_latest(const char *dir);
/* Point dir/latest at the checkpoint path (written, synced, renamed). */
int gj_ckpt_set_latest(const char *dir, const char *path);
/* Steps to resume from, newest first: `latest`'s first, then the others by step. */
int gj_ckpt_candidates(const char *dir, int64_t **steps, int *n);
/* Keep the newest `keep` checkpoints by step (0: all), never deleting the one `latest` names
 * or `just_written`. */
int gj_ckpt_rotate(const char *dir, int keep, int64_t just_written);
/* Delete the checkpoints of dir with a step above `after` (all with after < 0), and `latest`
 * if it named one of them (--overwrite). *deleted: how many. */
int gj_rundir_drop_after(const char *dir, int64_t after, int *deleted);

/* metrics.jsonl of a run resumed at `step`: the records of later steps (written after that
 * checkpoint by a run that did not save again) are dropped, atomically. */
int gj_rundir_trim_metrics(const char *path, int64_t step);

/* The run directory's own names (checkpoints, latest, config.conf, metrics.jsonl, lock) are
 * regular files where they exist (a directory or a FIFO there would stop the run after hours,
 * or block it): refused at start, naming the entry. */
int gj_rundir_check(const char *dir);

/* Remove the temporaries a killed run left in dir (its checkpoint, latest, config.conf and
 * metrics.jsonl being written); only with the lock held. *removed: how many. */
int gj_rundir_clean_tmp(const char *dir, int *removed);

/* Take dir's lock for this process (refused with the holder named), and release it. */
int gj_rundir_lock(const char *dir);
void gj_rundir_unlock(void);
/* 0 while this process holds the lock (or holds none); 1 when another process has taken it;
 * 2 when it could not be read or touched for GJ_LOCK_STALE_S / 2 (anyone may take it soon);
 * 3 when it was gone after this process had not touched it for GJ_LOCK_STALE_S / 2 (stopped:
 * another process may have taken it over, and released it, since). */
int gj_rundir_lock_lost(void);

#endif
