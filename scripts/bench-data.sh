#!/usr/bin/env bash
# Corpus-scale data, measured: builds a corpus of --size GB from the bundled Brown text, varied
# (every document a fresh random draw of 3..40 of its 48,866 sentences, in random order, so no
# two documents are alike), as one JSONL file; tokenizes it on 1 and on 2 ranks (wall time,
# MB/s of input, peak RSS per rank, whether the two outputs are byte-identical); then trains
# --steps steps from it and from a small dataset (the Brown validation text), the same run
# otherwise (step time and peak RSS side by side).
#   scripts/bench-data.sh [--size GB] [--dir D] [--steps 20] [--preset tiny] [--seq-len N]
#                         [--micro-batch 8] [--gptj PATH] [--keep]
# Needs about 2.1 x --size GB free in --dir (the text, one token dataset, tokenize's spool);
# it works in a directory of its own inside --dir, removed at the end (also on error and on
# Ctrl-C) unless --keep. --seq-len defaults to the preset's n_positions. Prints a Markdown table.
# gptj: --gptj, else $GPTJ, else the build tree or PATH (scripts/gptj-bin.sh).
set -euo pipefail
size=4 dir=${TMPDIR:-/tmp}/gptj-bench-data steps=20 preset=tiny seq='' mb=8 gptj='' keep=0
while [ $# -gt 0 ]; do
  case $1 in
    --size|--dir|--steps|--preset|--seq-len|--micro-batch|--gptj)
      [ $# -ge 2 ] || { echo "bench-data.sh: error: $1: missing value" >&2; exit 2; } ;;&
    --size) size=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --preset) preset=$2; shift 2 ;;
    --seq-len) seq=$2; shift 2 ;;
    --micro-batch) mb=$2; shift 2 ;;
    --gptj) gptj=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "bench-data.sh: error: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $size =~ ^[0-9]+(\.[0-9]+)?$ ]] && [ "$(echo "$size > 0" | bc)" = 1 ] ||
  { echo "bench-data.sh: error: --size must be a positive number of GB, got '$size'" >&2; exit 2; }
[ -z "$seq" ] || [[ $seq =~ ^[1-9][0-9]*$ ]] || { echo "bench-data.sh: error: --seq-len must be a positive integer" >&2; exit 2; }
for v in steps mb; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "bench-data.sh: error: --${v/mb/micro-batch} must be a positive integer" >&2; exit 2; }
done
top=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/gptj-bin.sh
. "$top/scripts/gptj-bin.sh"
gj_gptj bench-data.sh "$top" "$gptj" || exit 2
[ -x /usr/bin/time ] || { echo "bench-data.sh: error: /usr/bin/time is needed (apt-get install time)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p "$dir"
# KiB, rounded up
need=$(awk -v s="$size" 'BEGIN {n = s * 2.1 * 1048576; c = int(n); if (c < n) c++; printf "%.0f", c}')
free=$(df -Pk "$dir" | awk 'NR == 2 {print $4}')
[ "$free" -gt "$need" ] || { echo "bench-data.sh: error: --dir $dir has $(awk -v k="$free" 'BEGIN {printf "%.1f", k / 1048576}') GB free, $(awk -v k="$need" 'BEGIN {printf "%.1f", k / 1048576}') GB needed (2.1 x --size)" >&2; exit 2; }
# its files go to a directory of its own inside --dir: only that is removed, whatever --dir holds
work=$(mktemp -d "$dir/bench-data.XXXXXX")
[ "$keep" = 1 ] || trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT; trap 'exit 143' TERM; trap 'exit 129' HUP

# 1. the corpus
corpus=$work/corpus.jsonl
echo "building a $size GB corpus in $corpus ..." >&2
/usr/bin/python3 - "$corpus" "$size" "$top/data" <<'PY'
import json, random, re, sys, time
out, size, data = sys.argv[1], float(sys.argv[2]), sys.argv[3]
text = "".join(open("%s/brown-%s.txt" % (data, s), encoding="utf-8").read() for s in ("train", "valid", "test"))
sents = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.strip()) > 2]
rng, target, n, docs, t0 = random.Random(1234), int(size * 1e9), 0, 0, time.time()
with open(out, "w", encoding="utf-8") as f:
    while n < target:
        lines = []
        for _ in range(256):
            body = " ".join(rng.choices(sents, k=rng.randint(3, 40)))
            lines.append(json.dumps({"id": docs, "text": body}))
            docs += 1
        chunk = "\n".join(lines) + "\n"
        f.write(chunk)
        n += len(chunk.encode("utf-8"))
print("%d documents, %.2f GB, from %d sentences, in %.0f s" % (docs, n / 1e9, len(sents), time.time() - t0), file=sys.stderr)
PY
bytes=$(stat -c %s "$corpus")

# 2. tokenize on 1 and on 2 ranks: wall time and each rank's peak RSS (from /usr/bin/time)
tok() { # ranks out
  local r=$1 out=$2 t0 t1
  rm -f "$out" "$work"/rss.*
  t0=$(date +%s.%N)
  if [ "$r" = 1 ]; then
    OMP_NUM_THREADS=1 /usr/bin/time -f %M -o "$work/rss.0" "$gptj" tokenize --out "$out" "$corpus" >/dev/null 2>"$work/tok$r.log"
  else
    OMP_NUM_THREADS=1 mpirun -np "$r" bash -c '/usr/bin/time -f %M -o "$0/rss.$OMPI_COMM_WORLD_RANK" "$@"' \
      "$work" "$gptj" tokenize --out "$out" "$corpus" >/dev/null 2>"$work/tok$r.log"
  fi || { tail -n 5 "$work/tok$r.log" >&2; echo "bench-data.sh: error: tokenize on $r ranks failed" >&2; exit 1; }
  t1=$(date +%s.%N)
  tok_s[$r]=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}')
  tok_rss[$r]=$(cat "$work"/rss.* | sort -n | tail -n 1)
}
declare -A tok_s tok_rss
echo "tokenizing on 1 rank ..." >&2
tok 1 "$work/big.h5"
sum1=$(md5sum < "$work/big.h5")
echo "tokenizing on 2 ranks ..." >&2
tok 2 "$work/big.h5"
sum2=$(md5sum < "$work/big.h5")
same=$([ "$sum1" = "$sum2" ] && echo "byte-identical" || echo "DIFFERENT")
ntok=$("$gptj" info "$work/big.h5" | awk '/^tokens:/ {print $2}')
"$gptj" tokenize --out "$work/small.h5" "$top/data/brown-valid.txt" >/dev/null 2>&1

# 3. the same training run from the small and the large dataset
train() { # data name
  rm -rf "$work/run-$2"
  OMP_NUM_THREADS=2 /usr/bin/time -f %M -o "$work/rss-$2" "$gptj" train --data "$1" --preset "$preset" \
    ${seq:+--seq-len "$seq"} --micro-batch "$mb" --steps "$steps" --warmup 2 --save-every 0 --run-dir "$work/run-$2" \
    >"$work/train-$2.log" 2>&1 || { tail -n 5 "$work/train-$2.log" >&2; echo "bench-data.sh: error: training from $1 failed" >&2; exit 1; }
  # median step time over the steps after the first (metrics.jsonl: step_s)
  /usr/bin/python3 -c 'import json,sys,statistics as s; t=[json.loads(l)["step_s"] for l in open(sys.argv[1]) if "step_s" in l]; print("%.4f" % s.median(t[1:] or t))' \
    "$work/run-$2/metrics.jsonl"
}
echo "training $steps steps from each dataset ..." >&2
st_small=$(train "$work/small.h5" small); st_big=$(train "$work/big.h5" big)
rss_small=$(cat "$work/rss-small"); rss_big=$(cat "$work/rss-big")
small_tok=$("$gptj" info "$work/small.h5" | awk '/^tokens:/ {print $2}')

# awk, not bc: figures below 1 keep their leading zero (0.65, not .65)
mbs1=$(awk -v n="$bytes" -v t="${tok_s[1]}" 'BEGIN {printf "%.1f", n / 1e6 / t}')
mbs2=$(awk -v n="$bytes" -v t="${tok_s[2]}" 'BEGIN {printf "%.1f", n / 1e6 / t}')
eff=$(awk -v a="$mbs1" -v b="$mbs2" 'BEGIN {printf "%.2f", b / (2 * a)}')
cat <<EOF

## bench-data: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores

corpus: $(printf "%.2f" "$(echo "$bytes / 1000000000" | bc -l)") GB of JSONL, $ntok tokens

| tokenize | wall time (s) | MB/s | peak RSS per rank (MB) |
| --- | --- | --- | --- |
| 1 rank | ${tok_s[1]} | $mbs1 | $(( ${tok_rss[1]} / 1024 )) |
| 2 ranks | ${tok_s[2]} | $mbs2 | $(( ${tok_rss[2]} / 1024 )) |

2 ranks / (2 x 1 rank) = $eff; outputs $same.

| train ($preset, seq ${seq:-n_positions}, micro-batch $mb, $steps steps, 2 threads) | tokens in dataset | median step (s) | peak RSS (MB) |
| --- | --- | --- | --- |
| small dataset (Brown validation) | $small_tok | $st_small | $(( rss_small / 1024 )) |
| $size GB corpus | $ntok | $st_big | $(( rss_big / 1024 )) |
EOF
