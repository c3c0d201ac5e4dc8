#!/usr/bin/env bash
# Launch gptj over plain mpirun with a hostfile. Prints the command it runs.
#   scripts/launch.sh --hostfile hosts --ranks-per-node 8 --threads 6 --tp 8 -- train --data d.h5 ...
# Options: --hostfile FILE (default: this machine only), --nodes N (default: lines of the
# hostfile), --ranks-per-node M (default 1), --threads T (OMP/OpenBLAS threads per rank,
# default 1), --tp N (passed to gptj when given), --gptj PATH (default: $GPTJ, else the build
# tree, else gptj on PATH: scripts/gptj-bin.sh). Without --hostfile only this machine: --nodes 1.
set -euo pipefail
hostfile='' nodes='' rpn=1 threads=1 tp='' gptj=''
while [ $# -gt 0 ]; do
  case $1 in
    --hostfile|--nodes|--ranks-per-node|--threads|--tp|--gptj)
      [ $# -ge 2 ] || { echo "launch.sh: error: $1: missing value" >&2; exit 2; } ;;&
    --hostfile) hostfile=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --ranks-per-node) rpn=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --tp) tp=$2; shift 2 ;;
    --gptj) gptj=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "launch.sh: error: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "launch.sh: error: give the gptj command after --" >&2; exit 2; }
for v in rpn threads tp nodes; do
  [ -z "${!v}" ] || [[ ${!v} =~ ^[1-9][0-9]*$ ]] ||
    { echo "launch.sh: error: --${v/rpn/ranks-per-node} must be a positive integer, got '${!v}'" >&2; exit 2; }
done
if [ -z "$hostfile" ] && [ -n "$nodes" ] && [ "$nodes" -gt 1 ]; then
  echo "launch.sh: error: --nodes $nodes needs --hostfile (without one, only this machine: 1 node)" >&2; exit 2
fi
top=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/gptj-bin.sh
. "$top/scripts/gptj-bin.sh"
gj_gptj launch.sh "$top" "$gptj" || exit 2
if [ -n "$hostfile" ]; then
  [ -r "$hostfile" ] || { echo "launch.sh: error: $hostfile: cannot read" >&2; exit 2; }
  [ -n "$nodes" ] || nodes=$(grep -cv '^\s*\(#\|$\)' "$hostfile" || true)
  [ "$nodes" -gt 0 ] || { echo "launch.sh: error: $hostfile: no host in it (only comments or blank lines)" >&2; exit 2; }
fi
nodes=${nodes:-1}
np=$((nodes * rpn))
tpn=${tp:-1}
(( np % tpn == 0 )) || { echo "launch.sh: error: --tp $tpn does not divide $np ranks" >&2; exit 2; }
if (( rpn % tpn != 0 && tpn % rpn != 0 )); then
  echo "launch.sh: warning: TP $tpn spans nodes unevenly; keep TP within a node" >&2
elif (( tpn > rpn && nodes > 1 )); then
  echo "launch.sh: warning: TP $tpn spans $((tpn / rpn)) nodes of $rpn ranks: its all-reduces cross the network; keep TP <= --ranks-per-node" >&2
fi
cmd=(mpirun -np "$np" --map-by "ppr:$rpn:node:PE=$threads" --bind-to core
     -x OMP_NUM_THREADS="$threads" -x OPENBLAS_NUM_THREADS="$threads")
[ -n "$hostfile" ] && cmd+=(--hostfile "$hostfile")
[ "$(id -u)" -eq 0 ] && cmd+=(--allow-run-as-root)
# --tp only when given: tokenize, info and convert have none
cmd+=("$gptj" "$1" ${tp:+--tp "$tp"} "${@:2}")
printf '+'; printf ' %q' "${cmd[@]}"; echo
exec "${cmd[@]}"
