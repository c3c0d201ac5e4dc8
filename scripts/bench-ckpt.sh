#!/usr/bin/env bash
# Checkpoint write and read throughput against dd on the same disk, interleaved round by round
# (the disk and the machine are shared and noisy: medians over the rounds are what to quote).
#   scripts/bench-ckpt.sh --data brown-train.h5 [--dir D] [--preset gptj-125m] [--ranks 2]
#                         [--rounds 5] [--compress LEVEL] [--gptj PATH] [--no-drop]
# A round: gptj trains 3 steps saving after each with --keep-checkpoints 1 (the "saved" time:
# CRCs, parallel HDF5 write, fsync, rename); dd writes a file of the same size twice
# (conv=fdatasync). "Steady" compares the third save with the second dd (each written after an
# earlier file was removed, as in a training run that rotates checkpoints), "first" the first of
# each. Then dd reads the checkpoint and gptj resumes from it ("loaded in"), each "cold": as
# root, the script drops the page cache (sync; echo 3 > /proc/sys/vm/drop_caches) before each:
# that empties the cache of EVERY process on the machine (on a shared machine, everyone's files
# are read from disk again); --no-drop, or not root, keeps the cache and labels the reads "warm"
# (they may come from memory). Files go to a directory of its own inside --dir (default
# $TMPDIR/gptj-bench-ckpt), removed at the end, on error and on Ctrl-C. gptj: --gptj, else
# $GPTJ, else the build tree or PATH (scripts/gptj-bin.sh).
set -euo pipefail
dir=${TMPDIR:-/tmp}/gptj-bench-ckpt preset=gptj-125m ranks=2 rounds=5 compress=0 data='' gptj='' nodrop=0
while [ $# -gt 0 ]; do
  case $1 in
    --data|--dir|--preset|--ranks|--rounds|--compress|--gptj)
      [ $# -ge 2 ] || { echo "bench-ckpt.sh: error: $1: missing value" >&2; exit 2; } ;;&
    --data) data=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --preset) preset=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --compress) compress=$2; shift 2 ;;
    --gptj) gptj=$2; shift 2 ;;
    --no-drop) nodrop=1; shift ;;
    -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "bench-ckpt.sh: error: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$data" ] || { echo "bench-ckpt.sh: error: --data FILE (a token dataset) is required" >&2; exit 2; }
[ -f "$data" ] || { echo "bench-ckpt.sh: error: --data $data: no such file" >&2; exit 2; }
for v in ranks rounds; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "bench-ckpt.sh: error: --$v must be a positive integer" >&2; exit 2; }
done
[[ $compress =~ ^[0-9]$ ]] || { echo "bench-ckpt.sh: error: --compress must be 0..9" >&2; exit 2; }
top=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/gptj-bin.sh
. "$top/scripts/gptj-bin.sh"
gj_gptj bench-ckpt.sh "$top" "$gptj" || exit 2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mkdir -p "$dir" 2>/dev/null || { echo "bench-ckpt.sh: error: --dir $dir: cannot create it" >&2; exit 2; }
# its files go to a directory of its own inside --dir: only that is removed, whatever --dir holds
work=$(mktemp -d "$dir/bench-ckpt.XXXXXX" 2>/dev/null) || { echo "bench-ckpt.sh: error: --dir $dir: cannot create a directory in it" >&2; exit 2; }
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT; trap 'exit 143' TERM; trap 'exit 129' HUP
read_kind=cold
if [ "$nodrop" = 1 ]; then
  read_kind=warm
  echo "note: --no-drop: the page cache is kept: read figures may come from memory (\"warm\")"
elif [ -w /proc/sys/vm/drop_caches ]; then
  echo "note: dropping the page cache before each read (echo 3 > /proc/sys/vm/drop_caches): this empties it for every process on this machine (--no-drop to keep it)"
else
  read_kind=warm
  echo "note: cannot drop the page cache (not root): read figures may come from memory (\"warm\")"
fi
drop() {
  sync
  [ "$read_kind" = cold ] || return 0
  { echo 3 > /proc/sys/vm/drop_caches; } 2>/dev/null ||
    { echo "bench-ckpt.sh: error: cannot write /proc/sys/vm/drop_caches here: run with --no-drop (warm reads)" >&2; exit 1; }
}
secs() { sed -n 's/.* copied, \([0-9.e+-]*\) s.*/\1/p'; }
run() { mpirun --oversubscribe -np "$ranks" "$gptj" train --preset "$preset" --data "$data" \
          --seq-len 64 --micro-batch 1 --run-dir "$work/run" --ckpt-compress "$compress" \
          --keep-checkpoints 1 "$@" 2>&1; }
w_dd=() w_ck=() f_dd=() f_ck=() r_dd=() r_ck=()
mb=0 bytes=0
ddw() { rm -f "$work/dd.bin"; dd if=/dev/zero of="$work/dd.bin" bs=1M count="$1" conv=fdatasync 2>&1 | secs; }
for ((i = 1; i <= rounds; i++)); do
  rm -rf "$work/run" "$work/dd.bin"
  # three saves, the oldest removed after each: the third is the steady state of a training run
  out=$(run --steps 3 --save-every 1) || { echo "$out" >&2; exit 1; }
  mapfile -t ws < <(sed -n 's/.*saved .* (\([0-9.]*\) s).*/\1/p' <<<"$out")
  ck=$work/run/ckpt-00000003.h5
  bytes=$(stat -c %s "$ck")
  [ "$mb" -gt 0 ] || mb=$(( (bytes + 1048575) / 1048576 ))
  # dd likewise: a first file, then one written after the previous one is removed
  fd=$(ddw "$mb")
  wd=$(ddw "$mb")
  rm -f "$work/dd.bin"
  drop
  rd=$(dd if="$ck" of=/dev/null bs=1M 2>&1 | secs)
  drop
  out=$(run --resume auto --steps 4) || { echo "$out" >&2; exit 1; }
  rs=$(sed -n 's/.*(loaded in \([0-9.]*\) s).*/\1/p' <<<"$out")
  f_dd+=("$fd") f_ck+=("${ws[0]}") w_dd+=("$wd") w_ck+=("${ws[2]}") r_dd+=("$rd") r_ck+=("$rs")
  printf 'round %d: write dd %.2f s, gptj %.2f s (first: dd %.2f s, gptj %.2f s); read dd %.2f s, gptj %.2f s\n' \
    "$i" "$wd" "${ws[2]}" "$fd" "${ws[0]}" "$rd" "$rs"
done
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
rate() { awk -v a="$1" -v b="$2" -v n="$bytes" -v mb="$mb" 'BEGIN {print (n / b) / (mb * 1048576 / a)}'; }
wr=() fr=() rr=()
for ((i = 0; i < rounds; i++)); do
  wr+=("$(rate "${w_dd[i]}" "${w_ck[i]}")") fr+=("$(rate "${f_dd[i]}" "${f_ck[i]}")")
  rr+=("$(awk -v a="${r_dd[i]}" -v b="${r_ck[i]}" 'BEGIN {print a / b}')")
done
awk -v n="$bytes" -v mb="$mb" -v ranks="$ranks" -v preset="$preset" -v c="$compress" -v k="$rounds" \
    -v rk="$read_kind" -v wd="$(med "${w_dd[@]}")" -v wc="$(med "${w_ck[@]}")" -v wr="$(med "${wr[@]}")" \
    -v fd="$(med "${f_dd[@]}")" -v fc="$(med "${f_ck[@]}")" -v fr="$(med "${fr[@]}")" \
    -v rd="$(med "${r_dd[@]}")" -v rc="$(med "${r_ck[@]}")" -v rr="$(med "${rr[@]}")" 'BEGIN {
  printf "%s, %d ranks, compress %d: checkpoint %.0f MB (dd: %d MiB); medians of %d rounds\n", preset, ranks, c, n / 1e6, mb, k
  printf "write, steady: gptj %.2f s = %.0f MB/s, dd %.2f s = %.0f MB/s; ratio %.2f\n", wc, n / 1e6 / wc, wd, mb * 1.048576 / wd, wr
  printf "write, first:  gptj %.2f s = %.0f MB/s, dd %.2f s = %.0f MB/s; ratio %.2f\n", fc, n / 1e6 / fc, fd, mb * 1.048576 / fd, fr
  printf "read, %s:    gptj %.2f s = %.0f MB/s, dd %.2f s = %.0f MB/s; ratio %.2f\n", rk, rc, n / 1e6 / rc, rd, n / 1e6 / rd, rr
}'
