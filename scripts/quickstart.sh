#!/usr/bin/env bash
# The main job, from a fresh Debian 12 (as root): install dependencies, build, then tokenize
# the bundled Brown corpus, train the tiny GPT-J on 2 ranks for 300 steps (about 3 minutes
# on 2 cores) with validation, evaluate test perplexity, generate a sample and plot the metrics.
# Usage: scripts/quickstart.sh
# Training stops after GJ_TRAIN_SECONDS seconds (train --max-time; default 600, 0: no cap) even
# before step 300; the script then warns that the figures are those of a shorter run.
# Uses the gptj it builds in GJ_BUILD (default _build/release); runs go to GJ_RUNS (default runs).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/deps.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
build=$(realpath -m "${GJ_BUILD:-$top/_build/release}")
runs=$(realpath -m "${GJ_RUNS:-$top/runs}")
seconds=${GJ_TRAIN_SECONDS:-600}
[[ $seconds =~ ^[0-9]+([.][0-9]+)?$ ]] ||
  { echo "quickstart: error: GJ_TRAIN_SECONDS must be a number of seconds (0: no cap), got '$seconds'" >&2; exit 2; }
gj_install_deps
gj_build "$build"
gptj="$build/gptj"
data="$runs/data"
run="$runs/quickstart"
mkdir -p "$data"
step() { echo; echo "== $*"; }

step "tokenize the Brown corpus (train / valid / test)"
for s in train valid test; do
  "$gptj" tokenize --out "$data/brown-$s.h5" "$top/data/brown-$s.txt"
done

steps=300
step "train the tiny GPT-J on 2 ranks (1 thread each): $steps steps (at most ${seconds} s), validating every 50"
rm -rf "$run"
mpirun --oversubscribe -np 2 "$gptj" train --preset tiny --data "$data/brown-train.h5" \
  --valid-data "$data/brown-valid.h5" --micro-batch 8 --seq-len 128 --steps "$steps" \
  --lr 2e-3 --warmup 30 --eval-every 50 --eval-batches 8 \
  --log-every 10 --save-every 100 --max-time "$seconds" --run-dir "$run"

ckpt="$run/$(cat "$run/latest")"
# --max-time stops with a checkpoint before --steps: then the figures below are not the README's
done_steps=$(sed -n 's/^ckpt-0*\([0-9][0-9]*\)\.h5$/\1/p' "$run/latest")
early=
if [ "${done_steps:-0}" -lt "$steps" ]; then
  early="training stopped at step ${done_steps:-?} of $steps, at the GJ_TRAIN_SECONDS=$seconds cap (train --max-time): the loss and perplexities are a shorter run's, above the README's (loss about 6.2, validation perplexity about 620); for all $steps steps rerun with a larger GJ_TRAIN_SECONDS, or 0 for no cap"
  echo "quickstart: warning: $early" >&2
fi
step "evaluate $ckpt on the test split"
mpirun --oversubscribe -np 2 "$gptj" eval --checkpoint "$ckpt" --data "$data/brown-test.h5" --seq-len 128

step "generate"
"$gptj" generate --checkpoint "$ckpt" --prompt "The committee said that" --max-new-tokens 40 \
  --temperature 0.8 --top-p 0.95 --seed 1

step "plot"
"$top/scripts/plot_metrics" "$run/metrics.jsonl" "$run/metrics.png"
echo
echo "done: run directory $run (config.conf, metrics.jsonl, metrics.png, checkpoints)"
[ -z "$early" ] || echo "quickstart: warning: $early" >&2
