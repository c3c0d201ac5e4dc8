#!/usr/bin/env bash
# Does bf16 train as well as float32? The same runs, same seed and data, in both precisions:
#   1. the quickstart's job: tiny GPT-J, 2 ranks, 300 steps, global batch 16 x 128 tokens;
#   2. gptj-125m, 1 rank x 2 threads, 200 steps of 4 x 128 tokens;
# both on the bundled Brown corpus, then the final validation loss of each (the whole
# validation split) and their relative difference, which must be within 1%.
# Usage: scripts/bf16-vs-fp32.sh [--gptj PATH] [--out DIR] [--only quickstart|125m]
# (default: both jobs; gptj: --gptj, else $GPTJ, else the build tree or PATH, as scripts/gptj-bin.sh)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
gptj='' out=${TMPDIR:-/tmp}/gptj-bf16-vs-fp32 only=''
while [ $# -gt 0 ]; do
  case $1 in
    --gptj|--out|--only)
      [ $# -ge 2 ] || { echo "bf16-vs-fp32: error: $1: missing value" >&2; exit 2; } ;;&
    --gptj) gptj=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "bf16-vs-fp32: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case $only in
  ''|quickstart|125m) ;;
  *) echo "bf16-vs-fp32: error: --only must be quickstart or 125m, got '$only'" >&2; exit 2 ;;
esac
# shellcheck source=scripts/gptj-bin.sh
. "$top/scripts/gptj-bin.sh"
gj_gptj bf16-vs-fp32 "$top" "$gptj" || exit 2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# A CPU with neither AMX-BF16 nor AVX512_BF16 runs bf16 only on the fp32 FMA units, asked for by name
bf16_gemm=
if ! grep -qw -e avx512_bf16 -e amx_bf16 /proc/cpuinfo; then
  bf16_gemm="--gemm openblas"
  echo "note: this CPU has neither AMX-BF16 nor AVX512_BF16: bf16 runs with --gemm openblas (bf16 values on the fp32 FMA units)"
fi
flags() { [ "$1" = bf16 ] && echo "--precision bf16 $bf16_gemm" || echo "--precision $1"; }
mkdir -p "$out/data"
for s in train valid; do
  [ -f "$out/data/brown-$s.h5" ] || "$gptj" tokenize --out "$out/data/brown-$s.h5" "$top/data/brown-$s.txt" >/dev/null
done
final_val() { grep '"val_loss"' "$1/metrics.jsonl" | tail -n 1 | sed 's/.*"val_loss": \([^,}]*\).*/\1/'; }
compare() { # name dir-fp32 dir-bf16
  local a b
  a=$(final_val "$2") b=$(final_val "$3")
  /usr/bin/python3 - "$1" "$a" "$b" <<'PY'
import math, sys
name, va, vb = sys.argv[1:]
def num(v):
    try:
        x = float(v)
    except ValueError:
        return None
    return x if math.isfinite(x) and x > 0 else None
a, b = num(va), num(vb)
if a is None or b is None:
    print(f"{name}: FAILED: no final validation loss to compare (fp32: {va or 'none'}, bf16: {vb or 'none'}; "
          "null = not finite, the run diverged)")
    sys.exit(1)
rel = abs(b - a) / a
print(f"{name}: final validation loss fp32 {a:.4f}, bf16 {b:.4f}, relative difference {100 * rel:.2f}%",
      "(within 1%)" if rel <= 0.01 else "(MORE THAN 1%)")
sys.exit(0 if rel <= 0.01 else 1)
PY
}
status=0
if [ -z "$only" ] || [ "$only" = quickstart ]; then
  for p in fp32 bf16; do
    echo "== quickstart job, $p"
    rm -rf "$out/quick-$p"
    OMP_NUM_THREADS=1 mpirun --oversubscribe -np 2 "$gptj" train --preset tiny --data "$out/data/brown-train.h5" \
      --valid-data "$out/data/brown-valid.h5" --micro-batch 8 --seq-len 128 --steps 300 --lr 2e-3 \
      --warmup 30 --eval-every 300 --log-every 50 --save-every 0 --seed 1234 $(flags "$p") \
      --run-dir "$out/quick-$p" | grep -E '^step (50|100|150|200|250|300)/|validation'
  done
  compare "quickstart (tiny, 300 steps)" "$out/quick-fp32" "$out/quick-bf16" || status=1
fi
if [ -z "$only" ] || [ "$only" = 125m ]; then
  for p in fp32 bf16; do
    echo "== gptj-125m, $p"
    rm -rf "$out/125m-$p"
    OMP_NUM_THREADS=2 "$gptj" train --preset gptj-125m --data "$out/data/brown-train.h5" \
      --valid-data "$out/data/brown-valid.h5" --micro-batch 4 --seq-len 128 --steps 200 --lr 6e-4 \
      --warmup 20 --eval-every 200 --log-every 25 --save-every 0 --seed 1234 $(flags "$p") \
      --run-dir "$out/125m-$p" | grep -E '^step (25|50|75|100|125|150|175|200)/|validation'
  done
  compare "gptj-125m (200 steps)" "$out/125m-fp32" "$out/125m-bf16" || status=1
fi
exit $status
