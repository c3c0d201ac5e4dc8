#!/usr/bin/env bash
# Multi-node test on a real 2-node Slurm cluster in network namespaces (tests/cluster/
# local-cluster): train.sbatch with -N 2, 2 ranks per node and TP 2 puts each TP group inside a
# node and DP across the nodes, with the losses of the same job on one node; the same through
# scripts/launch.sh with a hostfile; USR1 requeue across nodes resumes exactly; a node lost in
# the middle of training ends the job within a bound, leaves the last checkpoint intact, and the
# next job on the remaining node resumes from it on another layout; checkpoints move between
# 2 nodes and 1. Skips (exit 0, with the reason) only where network namespaces cannot be made.
# Usage: tests/cluster-test.sh BUILD_DIR
set -euo pipefail
build=$(cd "${1:?usage: cluster-test.sh BUILD_DIR}" && pwd)
top=$(cd "$(dirname "$0")/.." && pwd)
lc=$top/tests/cluster/local-cluster
work=$build/tests/out/cluster
# its own cluster (not the default gjc one someone may have started by hand), one test at a time
export GJ_CLUSTER_DIR=${GJ_CLUSTER_DIR:-/tmp/gj-cluster-test} GJ_CLUSTER_PREFIX=${GJ_CLUSTER_PREFIX:-gjt}
P=$GJ_CLUSTER_PREFIX n1=$GJ_CLUSTER_PREFIX-n1 n2=$GJ_CLUSTER_PREFIX-n2
exec 9>"$GJ_CLUSTER_DIR.lock"
flock -w 900 9 || { echo "FAIL: cluster: another cluster test holds $GJ_CLUSTER_DIR.lock"; exit 1; }
# Seconds from the loss of the batch host to the end of its job. Measured 41-45 s: SlurmdTimeout
# (10 s) and a ping cycle until the node is DOWN (about 15 s), then about 25 s of COMPLETING while
# the surviving node's step reports its end toward the dead batch host, times out (MessageTimeout
# 5 s, retried) and falls back to slurmctld; KillWait 5 s. A lost node that is not the batch host
# ends its job in 23-25 s.
LOST_BOUND=90
pass=0 fail=0
# results also go to $work/results.log; on a failure the daemons' logs are kept in $work/logs
ok() { echo "PASS: cluster: $* [$((SECONDS - t_start)) s]" | tee -a "$work/results.log"; pass=$((pass + 1)); }
bad() { echo "FAIL: cluster: $* [$((SECONDS - t_start)) s]" | tee -a "$work/results.log"; fail=$((fail + 1)); }
keep_logs() { [ "$fail" -eq 0 ] || cp -r "$GJ_CLUSTER_DIR/log" "$work/logs" 2>/dev/null || true; }
t_start=$SECONDS

rm -rf "$work" && mkdir -p "$work"
# bad input: one line, exit 2, before anything is made
for args in "start 5" "start" "start two" "frobnicate"; do
  set +e
  # shellcheck disable=SC2086
  msg=$("$lc" $args 2>&1); rc=$?
  set -e
  if [ $rc -eq 2 ] && [ "$(printf '%s\n' "$msg" | wc -l)" -eq 1 ]; then ok "local-cluster $args: exit 2, '$msg'"
  else bad "local-cluster $args: exit $rc, output: $msg"; fi
done

set +e
"$lc" start 2 >"$work/start.log" 2>&1; rc=$?
set -e
if [ $rc -eq 3 ]; then
  echo "SKIP: cluster test: $(tail -n 1 "$work/start.log")"; exit 0
fi
trap 'keep_logs; "$lc" stop >/dev/null 2>&1 || true' EXIT
if [ $rc -ne 0 ]; then cat "$work/start.log"; bad "local-cluster start 2 failed (exit $rc)"; exit 1; fi
ok "$(tail -n 2 "$work/start.log" | head -n 1 | sed 's/^local-cluster: //')"

# a crashed cluster (slurmctld and a slurmd killed) is cleaned up and restarted by start
kill -KILL "$(cat "$GJ_CLUSTER_DIR/run/slurmctld.pid")" "$(cat "$GJ_CLUSTER_DIR/run/slurmd-$n2.pid")"
sleep 0.2
set +e
"$lc" status >/dev/null 2>&1; st=$?
"$lc" start 2 >"$work/restart.log" 2>&1; rc=$?
"$lc" status >"$work/status.log" 2>&1; st2=$?
set -e
if [ $st -eq 2 ] && [ $rc -eq 0 ] && grep -q "cleaning up" "$work/restart.log" && [ $st2 -eq 0 ]; then
  ok "after a crash, status says partly up (2) and start cleans up and restarts (status 0)"
else
  bad "crash recovery: status $st, start $rc, status after $st2"; cat "$work/restart.log" "$work/status.log"
fi

eval "$("$lc" env)"
# more ranks than cores (4 ranks, 2 cores): idle ranks yield instead of spinning (srun does not tell
# Open MPI that the node is oversubscribed)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
hx() { "$lc" exec -- "$@"; }   # a client command on the login node
state() { hx scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
restarts() { hx scontrol show job "$1" 2>/dev/null | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p'; }
wait_done() {   # JOB SECONDS [RESTARTS]: prints the final state
  local end=$((SECONDS + $2)) s
  while [ $SECONDS -lt $end ]; do
    s=$(state "$1")
    case $s in
      COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)
        if [ -z "${3:-}" ] || [ "$(restarts "$1")" -ge "$3" ]; then echo "$s"; return 0; fi ;;
    esac
    sleep 0.3
  done
  echo TIMEOUT_WAITING
}
losses() { sed -n 's/.*"step": \([0-9]*\), "loss": \([-0-9.e+]*\).*/\1 \2/p' "$1/metrics.jsonl" 2>/dev/null; }
nsteps() { losses "$1" | wc -l; }
# close A B [FIRST]: the losses of run dirs A and B agree from step FIRST (default 1) on, to the
# layout tolerance of tests/trainutil.h (relative 1e-5 at step 1, 1e-4 after), over B's steps
close() {
  awk -v first="${3:-1}" 'NR == FNR { a[$1] = $2; next }
    $1 >= first { n++; if (!($1 in a)) { print "step " $1 " missing"; bad = 1; next }
      r = (a[$1] - $2) / $2; if (r < 0) r = -r
      if (r > ($1 == 1 ? 1e-5 : 1e-4)) { printf "step %d: %s vs %s (rel %.2e)\n", $1, a[$1], $2, r; bad = 1 } }
    END { if (!n) { print "no steps"; bad = 1 } exit bad }' <(losses "$1") <(losses "$2")
}
# placement OUT TP NODES: the "placement:" line of gptj's output OUT puts every TP group of TP
# adjacent ranks on one host and spreads every DP group over NODES hosts
placement() {
  local line
  # (not anchored: stdout and stderr share the file, and a warning's pieces may land around it)
  line=$(grep -m1 -o 'placement: .* (TP groups' "$1" | sed 's/^placement: //; s/ (TP groups$//') || return 1
  awk -v tp="$2" -v want="$3" -v line="$line" 'BEGIN {
    nh = split(line, hs, "; ")
    for (i = 1; i <= nh; i++) { split(hs[i], f, " ranks "); nr = split(f[2], rs, ",")
      for (j = 1; j <= nr; j++) { host[rs[j]] = f[1]; size++ } }
    if (nh != want) { print "hosts: " nh ", want " want; exit 1 }
    for (r = 0; r < size; r++) {
      if (host[r - r % tp] != host[r]) { print "TP group of rank " r " spans " host[r - r % tp] " and " host[r]; exit 1 }
      seen[r % tp, host[r]] = 1 }
    for (t = 0; t < tp; t++) { n = 0; for (k in seen) { split(k, kk, SUBSEP); if (kk[1] == t) n++ }
      if (n != want) { print "DP group " t " spans " n " hosts, want " want; exit 1 } }
  }' && echo "$line"
}
out() { echo "$work/gptj-train-$1.out"; }
# submit RUN_DIR TP MICRO_BATCH STEPS SBATCH-OPTIONS...: prints the job id
submit() {
  local run=$1 tp=$2 mb=$3 steps=$4
  shift 4
  (cd "$work" && hx env RUN_DIR="$run" TP="$tp" TRAIN_ARGS="${common[*]} --micro-batch $mb --steps $steps" \
     sbatch --parsable "$@" "$top/scripts/slurm/train.sbatch")
}
job_ok() {   # JOB STATE RUN STEPS: a job that completed with STEPS losses
  [ "$2" = COMPLETED ] && [ "$(nsteps "$3")" -eq "$4" ]
}

"$build/gptj" tokenize --out "$work/data.h5" "$top/data/brown-valid.txt" >/dev/null
export GPTJ=$build/gptj DATA=$work/data.h5
common=(--seq-len 32 --lr 1e-3 --warmup 3 --decay-steps 200 --seed 7 --log-every 1)

# 1. sbatch -N 2, 2 ranks per node, TP 2: TP inside a node, DP across; the same job on one node
ja=$(submit "$work/a" 2 4 10 -N 2 --ntasks-per-node=2)
jr=$(submit "$work/r" 2 4 10 -N 1 --ntasks-per-node=4)
sa=$(wait_done "$ja" 180)
sr=$(wait_done "$jr" 180)
if job_ok "$ja" "$sa" "$work/a" 10 && p=$(placement "$(out "$ja")" 2 2); then
  ok "sbatch -N 2 --ntasks-per-node=2, TP 2 (job $ja): $p"
else
  bad "sbatch -N 2 job $ja: state $sa, $(nsteps "$work/a") steps, placement: ${p:-}"; tail -n 20 "$(out "$ja")"
fi
if job_ok "$jr" "$sr" "$work/r" 10 && p=$(placement "$(out "$jr")" 2 1) && d=$(close "$work/r" "$work/a"); then
  ok "the same job on one node (job $jr: $p) has the 2-node losses within the layout tolerance$(
    [ "$(losses "$work/a")" = "$(losses "$work/r")" ] && echo " (identical)")"
else
  bad "one-node job $jr: state $sr, $(nsteps "$work/r") steps: ${p:-} ${d:-}"; tail -n 20 "$(out "$jr")"
fi

# 2. scripts/launch.sh with the cluster's hostfile (mpirun starts its daemons through the
#    namespace agent, OMPI_MCA_plm_rsh_agent); 20 steps: the uninterrupted reference below
if timeout -k 10 300 "$lc" exec -- bash "$top/scripts/launch.sh" --hostfile "$GJ_CLUSTER_HOSTFILE" \
     --ranks-per-node 2 --tp 2 --gptj "$GPTJ" -- train --data "$DATA" --run-dir "$work/l" "${common[@]}" \
     --micro-batch 4 --steps 20 >"$work/launch.log" 2>&1 &&
   [ "$(nsteps "$work/l")" -eq 20 ] && p=$(placement "$work/launch.log" 2 2) && d=$(close "$work/l" "$work/r"); then
  ok "launch.sh --hostfile over $n1,$n2, 2 ranks per node, TP 2: $p; losses within tolerance of the one-node job"
else
  bad "launch.sh over the hostfile: $(nsteps "$work/l") steps, ${p:-} ${d:-}"; tail -n 20 "$work/launch.log"
fi

# 2b. a TP group across nodes (1 rank per node, TP 2) runs, and gptj says it should not
if timeout -k 10 120 "$lc" exec -- bash "$top/scripts/launch.sh" --hostfile "$GJ_CLUSTER_HOSTFILE" \
     --ranks-per-node 1 --tp 2 --gptj "$GPTJ" -- train --data "$DATA" --run-dir "$work/w" "${common[@]}" \
     --micro-batch 8 --steps 2 >"$work/span.log" 2>"$work/span.err" &&
   msg=$(grep -m1 "warning: 1 of 1 TP groups span hosts (ranks 0-1: $n1 and $n2)" "$work/span.err"); then
  ok "TP 2 over 1 rank per node: '${msg#*warning: }'"
else
  bad "TP across nodes: no warning"; tail -n 20 "$work/span.log" "$work/span.err"
fi

# 3. USR1 to the batch shell of a 2-node job: checkpoint, requeue, resume, the same trajectory
jq=$(submit "$work/q" 2 4 20 -N 2 --ntasks-per-node=2)
end=$((SECONDS + 120))
until [ "$(nsteps "$work/q")" -ge 5 ] || [ $SECONDS -ge $end ]; do sleep 0.2; done
hx scancel --signal=USR1 --batch "$jq" || bad "scancel --signal=USR1 --batch $jq failed"
sq=$(wait_done "$jq" 240 1)
stopped=$(sed -n 's/.*signal: stopped at step \([0-9]*\).*/\1/p' "$(out "$jq")" | head -n 1)
if [ "$sq" = COMPLETED ] && [ -n "$stopped" ] && grep -q "requeueing job $jq" "$(out "$jq")" &&
   grep -q "resumed from .*ckpt-$(printf %08d "$stopped").h5 at step $stopped" "$(out "$jq")" &&
   [ "$(grep -c "placement: $n1 ranks 0,1; $n2 ranks 2,3 (TP" "$(out "$jq")")" -eq 2 ] &&
   [ "$(losses "$work/q")" = "$(losses "$work/l")" ]; then
  ok "USR1 stopped 2-node job $jq at step $stopped; requeued on both nodes, resumed, the uninterrupted 20 losses exactly"
else
  bad "requeue across nodes, job $jq: state $sq, stopped at '${stopped:-}'"; tail -n 30 "$(out "$jq")"
  diff <(losses "$work/q") <(losses "$work/l") | head -n 5
fi

# 4. a checkpoint written on 2 nodes resumes on 1 (DP 2 x TP 2 -> DP 1 x TP 2), and one written
#    on 1 node resumes on 2 (DP 2 x TP 2 -> DP 2 x TP 1, one rank per node); same global batch
j21=$(submit "$work/a" 2 8 20 -N 1 --ntasks-per-node=2)
j12=$(submit "$work/r" 1 4 20 -N 2 --ntasks-per-node=1)
s21=$(wait_done "$j21" 180)
s12=$(wait_done "$j12" 180)
for c in "$j21 $s21 $work/a 2 1 2->1" "$j12 $s12 $work/r 1 2 1->2"; do
  read -r j s run tp nn what <<<"$c"
  p='' d=''
  if job_ok "$j" "$s" "$run" 20 && grep -q "resumed from .*ckpt-00000010.h5 at step 10" "$(out "$j")" &&
     p=$(placement "$(out "$j")" "$tp" "$nn") && d=$(close "$work/l" "$run" 11); then
    ok "checkpoint $what nodes: job $j resumed at step 10 ($p); steps 11-20 within tolerance of the reference"
  else
    bad "checkpoint $what nodes, job $j: state $s, $(nsteps "$run") steps, ${p:-} ${d:-}"; tail -n 20 "$(out "$j")"
  fi
done

# 5. a node lost mid-training: node 1, the job's batch host and rank 0's node, loses its link
#    and its processes die (slurmd, batch shell, steps, ranks). The job ends (NODE_FAIL) within
#    LOST_BOUND s, the last checkpoint is intact, and the next job on the remaining node 2
#    resumes from it (DP 2 x TP 2 -> DP 1 x TP 2). The dead rank 0's run-directory lock names
#    another host and the lost job: gptj asks Slurm (squeue) and, that job having ended, takes
#    the lock at once (without Slurm's word a lock of another host expires after 300 s).
jk=$(submit "$work/k" 2 4 "1000 --save-every 5" -N 2 --ntasks-per-node=2 --no-requeue)
end=$((SECONDS + 150))
until [ -f "$work/k/latest" ] && [ "$(nsteps "$work/k")" -ge 8 ] || [ $SECONDS -ge $end ]; do sleep 0.2; done
before=$(cat "$work/k/latest" 2>/dev/null || echo none)
t_lost=$SECONDS
"$lc" kill-node "$n1" >"$work/kill.log" 2>&1 || bad "kill-node: $(cat "$work/kill.log")"
sk=$(wait_done "$jk" $((LOST_BOUND + 30)))
took=$((SECONDS - t_lost))
latest=$(cat "$work/k/latest" 2>/dev/null || echo none)
if [ "$sk" = NODE_FAIL ] && [ $took -le $LOST_BOUND ]; then
  ok "node $n1 lost at step $(nsteps "$work/k") (checkpoint $before): job $jk ended $sk after ${took}s (bound ${LOST_BOUND}s)"
else
  bad "node lost: job $jk state $sk after ${took}s (bound ${LOST_BOUND}s)"; tail -n 20 "$(out "$jk")"
fi
if [ -f "$work/k/$latest" ] && [[ ! $latest < $before ]] &&
   msg=$(/usr/bin/python3 "$top/tests/ckpt-check.py" "$work/k/$latest" 2>&1); then
  ok "the last checkpoint $latest is intact (tests/ckpt-check.py: every dataset's CRC-32 matches its data)"
else
  bad "last checkpoint '$latest' (before the loss: $before): ${msg:-missing}"
fi
ystep=$(sed -n 's/^ckpt-0*\([0-9][0-9]*\)\.h5$/\1/p' <<<"$latest"); ystep=${ystep:-0}
tosteps=$((ystep + 6 > 20 ? 20 : ystep + 6))
jn=$(submit "$work/k" 2 8 "$tosteps" -N 1 --ntasks-per-node=2)
sn=$(wait_done "$jn" 180)
p='' d=''
if job_ok "$jn" "$sn" "$work/k" "$tosteps" && grep -q "resumed from .*$latest at step $ystep" "$(out "$jn")" &&
   grep -q "removed a stale lock .*job $jk.*its Slurm job has ended" "$(out "$jn")" &&
   p=$(placement "$(out "$jn")" 2 1) && [[ $p == "$n2 "* ]] && d=$(close "$work/l" "$work/k"); then
  ok "the next job $jn on the remaining node resumed from $latest with --resume auto ($p, DP 1 x TP 2), steps 1-$tosteps within tolerance of the reference"
else
  bad "resume after the loss, job $jn: state $sn, $(nsteps "$work/k") steps, ${p:-} ${d:-}"; tail -n 20 "$(out "$jn")"
fi

# 6. stop leaves nothing: no daemons, no namespaces, no directory
keep_logs
pids=$(cat "$GJ_CLUSTER_DIR"/run/*.pid 2>/dev/null | tr '\n' ' ')
"$lc" stop >"$work/stop.log" 2>&1
left=
for p in $pids; do   # alive: exists and not a zombie (PID 1 here may reap late)
  st=$(sed 's/.*) \(.\).*/\1/' "/proc/$p/stat" 2>/dev/null || echo gone)
  [ "$st" = gone ] || [ "$st" = Z ] || left="$left $p($st)"
done
if [ -z "$left" ] && ! grep -q "^$P-" <<<"$(ip netns list)" && [ ! -e "$GJ_CLUSTER_DIR" ] && ! "$lc" status >/dev/null 2>&1; then
  ok "stop: no daemon left (pids $pids), no $P-* namespace, $GJ_CLUSTER_DIR removed; $(sed 's/^local-cluster: //' "$work/stop.log")"
else
  bad "stop left: pids${left:- none}, namespaces: $(ip netns list | grep "^$P-" | tr '\n' ' ')"
fi
trap - EXIT
echo "cluster: $pass passed, $fail failed in $((SECONDS - t_start)) s"
[ $fail -eq 0 ]
