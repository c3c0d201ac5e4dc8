#!/usr/bin/env bash
# Build the libFuzzer harnesses with clang (AddressSanitizer + UBSan) and run each for
# SECONDS (default 30). Usage: tests/fuzz/run.sh [SECONDS] [OUTDIR]
# A finding stops with a non-zero exit and leaves the crashing input in OUTDIR.
set -euo pipefail
secs=${1:-30}
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
out=${2:-$top/_build/fuzz}
command -v clang >/dev/null || { echo "fuzz: error: clang not found: apt-get install clang libclang-rt-14-dev" >&2; exit 1; }
mkdir -p "$out"
cflags="-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I$top/src -D_GNU_SOURCE \
  -DGJ_PKGDATADIR=\"$top/data\" -DGJ_SRCDATADIR=\"$top/data\" $(pkg-config --cflags jansson libpcre2-8 zlib libzstd)"
libs="$(pkg-config --libs jansson libpcre2-8 zlib libzstd) -lm"
common="$top/src/common.c $top/src/io/outfile.c"
declare -A srcs=(
  [config]="$top/src/io/kvconf.c $top/src/model/config.c"
  [jsonl]="$top/src/io/docstream.c $top/src/io/jsonscan.c"
  [jsonscan]="$top/src/io/jsonscan.c"
  [tokenizer]="$top/src/io/tokenizer.c"
  [safetensors]="$top/src/io/safetensors.c"
)
# common.c asks OpenBLAS for its core name; the harnesses do not need OpenBLAS
cat > "$out/blas_stub.c" <<'C'
char *openblas_get_corename(void) { return "none"; }
C
export GJ_VOCAB_DIR=$top/data/gpt2
# one harness: build it, run it for $secs s, leave its verdict line in $out/$name.verdict
fuzz_one() {
  local name=$1 bin=$out/fuzz_$1 corpus=$out/corpus-$1
  # shellcheck disable=SC2086
  if ! clang $cflags "$here/fuzz_$name.c" ${srcs[$name]} $common "$out/blas_stub.c" $libs -o "$bin" \
       >"$out/$name.log" 2>&1; then
    echo "FAIL: fuzz $name: the harness does not build: see $out/$name.log" >"$out/$name.verdict"; return
  fi
  mkdir -p "$corpus" "$out/crash-$name"
  cp -n "$here/seeds/$name"/* "$corpus/" 2>/dev/null || true
  if "$bin" -max_total_time="$secs" -max_len=65536 -timeout=20 -rss_limit_mb=2048 \
       -artifact_prefix="$out/crash-$name/" -print_final_stats=1 "$corpus" >"$out/$name.log" 2>&1; then
    echo "PASS: fuzz $name: $(grep -o 'stat::number_of_executed_units: *[0-9]*' "$out/$name.log" | grep -o '[0-9]*$') runs in ${secs} s, no finding" >"$out/$name.verdict"
  else
    echo "FAIL: fuzz $name: see $out/$name.log and $out/crash-$name/" >"$out/$name.verdict"
  fi
}
# Each harness is one process on one core: run as many at once as there are cores (each still
# fuzzes for its whole $secs s), then report in a fixed order.
names=(config jsonl jsonscan tokenizer safetensors)
width=$(nproc)
for name in "${names[@]}"; do
  rm -f "$out/$name.verdict"
  while [ "$(jobs -rp | wc -l)" -ge "$width" ]; do wait -n || true; done
  fuzz_one "$name" &
done
wait
status=0
for name in "${names[@]}"; do
  if [ -s "$out/$name.verdict" ]; then cat "$out/$name.verdict"; else echo "FAIL: fuzz $name: no verdict (see $out/$name.log)"; fi
  if ! grep -q '^PASS' "$out/$name.verdict" 2>/dev/null; then status=1; tail -n 30 "$out/$name.log"; fi
done
exit $status
