#!/usr/bin/env bash
# Slurm test on a real one-node cluster (../shared/tools/local-slurm): the batch scripts run a
# training job to completion; USR1 to the batch shell makes the job checkpoint, exit cleanly
# and requeue itself, and the requeued run resumes with the same loss trajectory as an
# uninterrupted run; a job stopped before its first step twice is not requeued again; eval.sbatch prints the perplexity. Skips (with a message, exit 0) only
# where Slurm cannot start. Usage: tests/slurm-test.sh BUILD_DIR
set -uo pipefail
build=$(cd "${1:?usage: slurm-test.sh BUILD_DIR}" && pwd)
top=$(cd "$(dirname "$0")/.." && pwd)
ls=${GJ_LOCAL_SLURM:-$top/../shared/tools/local-slurm}
work=$build/tests/out/slurm
pass=0 fail=0
ok() { echo "PASS: slurm: $*"; pass=$((pass + 1)); }
bad() { echo "FAIL: slurm: $*"; fail=$((fail + 1)); }

if [ "$(id -u)" -ne 0 ] || [ ! -x "$ls" ]; then
  echo "SKIP: slurm test: needs root and $ls"; exit 0
fi
rm -rf "$work" && mkdir -p "$work"
if ! "$ls" start >"$work/start.log" 2>&1; then
  echo "SKIP: slurm test: Slurm could not start here:"; tail -n 5 "$work/start.log"; "$ls" stop >/dev/null 2>&1; exit 0
fi
trap '"$ls" stop >/dev/null 2>&1' EXIT
eval "$("$ls" env)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
restarts() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p'; }
# Wait until job $1 is finished (and, if $3 is given, has restarted that often); $2 seconds.
wait_done() {
  local end=$((SECONDS + $2)) s
  while [ $SECONDS -lt $end ]; do
    s=$(state "$1")
    case $s in
      COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY)
        if [ -z "${3:-}" ] || [ "$(restarts "$1")" -ge "$3" ]; then echo "$s"; return 0; fi ;;
    esac
    sleep 0.3
  done
  echo TIMEOUT_WAITING; return 1
}
losses() { sed -n 's/.*"step": \([0-9]*\), "loss": \([-0-9.e+]*\).*/\1 \2/p' "$1"; }

"$build/gptj" tokenize --out "$work/data.h5" "$top/data/brown-valid.txt" >/dev/null || { bad "tokenize"; exit 1; }
export GPTJ=$build/gptj DATA=$work/data.h5
common="--seq-len 32 --micro-batch 4 --lr 1e-3 --warmup 3 --decay-steps 200 --seed 7 --log-every 1"

# 1. a job runs to the end and leaves a checkpoint and metrics

  jid=$(cd "$work" && RUN_DIR=$work/run1 TRAIN_ARGS="$common --steps 20 --save-every 10" sbatch --parsable --ntasks-per-node=2 "$top/scripts/slurm/train.sbatch")
s=$(wait_done "$jid" 300)
if [ "$s" = COMPLETED ] && [ -f "$work/run1/latest" ] && [ "$(losses "$work/run1/metrics.jsonl" | wc -l)" -eq 20 ]; then
  ok "train.sbatch completed 20 steps with a checkpoint ($(cat "$work/run1/latest"))"
else
  bad "train.sbatch job $jid: state $s"; cat "$work"/gptj-train-"$jid".out
fi

# 2. USR1 to the batch shell: checkpoint, clean exit, self-requeue, resume, same trajectory
jid=$(cd "$work" && RUN_DIR=$work/run2 TRAIN_ARGS="$common --steps 150" sbatch --parsable --ntasks-per-node=2 "$top/scripts/slurm/train.sbatch")
end=$((SECONDS + 120))
until [ -f "$work/run2/metrics.jsonl" ] && [ "$(wc -l < "$work/run2/metrics.jsonl")" -ge 5 ]; do
  [ $SECONDS -lt $end ] || break; sleep 0.2
done
scancel --signal=USR1 --batch "$jid"
s=$(wait_done "$jid" 400 1)
out=$work/gptj-train-$jid.out
stopped=$(sed -n 's/.*signal: stopped at step \([0-9]*\).*/\1/p' "$out" | head -1)
if [ "$s" = COMPLETED ] && [ "$(restarts "$jid")" -ge 1 ] && [ -n "$stopped" ] &&
   grep -q "requeueing job $jid" "$out" && grep -q "resumed from .*ckpt-$(printf %08d "$stopped").h5 at step $stopped" "$out"; then
  ok "USR1 stopped job $jid at step $stopped with a checkpoint; requeued and resumed from it"
else
  bad "USR1/requeue of job $jid: state $s, restarts $(restarts "$jid"), stopped at '${stopped}'"; tail -n 30 "$out"
fi
# the same training without interruption, on the same layout
timeout 600 mpirun -np 2 "$GPTJ" train --data "$DATA" --run-dir "$work/ref" $common --steps 150 >/dev/null 2>&1
if [ "$(losses "$work/run2/metrics.jsonl")" = "$(losses "$work/ref/metrics.jsonl")" ] &&
   [ "$(losses "$work/ref/metrics.jsonl" | wc -l)" -eq 150 ]; then
  ok "the interrupted and requeued run has the uninterrupted run's 150 losses exactly"
else
  bad "loss trajectories differ:"; diff <(losses "$work/run2/metrics.jsonl") <(losses "$work/ref/metrics.jsonl") | head
fi

# 2b. a trainer stopped by USR1 before its first step every time (a start-up longer than the
# job's time before USR1): requeued once, then the job fails saying why instead of requeueing
# for ever. The stand-in exits 0 at USR1 as gptj does when stopped during its start-up. Rank 0
# signals once every rank has set its trap (a rank without it would die by USR1).
cat > "$work/stall.sh" <<'STUB'
#!/bin/bash
trap 'echo "stand-in: stopped before the first step"; exit 0' USR1
r=$SLURM_SUBMIT_DIR/stall-ready.$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}
touch "$r.${SLURM_PROCID:-0}"
if [ "${SLURM_PROCID:-0}" = 0 ]; then
  for i in $(seq 300); do [ "$(ls "$r".* | wc -l)" -ge "${SLURM_NTASKS:-1}" ] && break; sleep 0.1; done
  scancel --signal=USR1 --batch "$SLURM_JOB_ID"
fi
for i in $(seq 600); do sleep 0.1; done
exit 1
STUB
chmod +x "$work/stall.sh"
jid=$(cd "$work" && GPTJ=$work/stall.sh RUN_DIR=$work/run3 TRAIN_ARGS="$common --steps 20" sbatch --parsable --ntasks-per-node=2 "$top/scripts/slurm/train.sbatch")
s=$(wait_done "$jid" 300 1)
out=$work/gptj-train-$jid.out
if [ "$s" = FAILED ] && [ "$(restarts "$jid")" -eq 1 ] && grep -q "requeueing job $jid once more" "$out" &&
   grep -q "stopped before its first step in 2 runs in a row" "$out" && [ ! -e "$work/run3/.requeue-stalls" ]; then
  ok "a job stopped twice before its first step was requeued once, then failed saying why"
else
  bad "stalled job $jid: state $s, restarts $(restarts "$jid")"; tail -n 20 "$out"
fi

# 3. eval.sbatch prints the perplexity of the checkpoint
jid=$(cd "$work" && CKPT=$work/run1 EVAL_ARGS="--seq-len 32 --max-windows 200" sbatch --parsable "$top/scripts/slurm/eval.sbatch")
s=$(wait_done "$jid" 300)
if [ "$s" = COMPLETED ] && grep -q "perplexity" "$work/gptj-eval-$jid.out"; then
  ok "eval.sbatch: $(grep -o 'perplexity [0-9.]*' "$work/gptj-eval-$jid.out")"
else
  bad "eval.sbatch job $jid: state $s"; cat "$work/gptj-eval-$jid.out"
fi
echo "slurm: $pass passed, $fail failed"
[ $fail -eq 0 ]
