#!/usr/bin/env bash
# Install dependencies, build from scratch out of tree, run every test (make check), then
# make distcheck. Usage: scripts/test.sh   (as root on Debian 12; idempotent)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/deps.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
build=${GJ_TEST_BUILD:-$top/_build/test}
start=$(date +%s)
gj_install_deps
gj_build "$build" fresh
cd "$build"
echo "== make check"
if ! make -j"$(nproc)" check; then
  echo "error: make check failed; logs:" >&2
  for f in $(find tests -name '*.log' -newer Makefile); do echo "--- $f" >&2; tail -n 40 "$f" >&2; done
  exit 1
fi
cat tests/*.log | grep -E '^(golden|[0-9]+%)' || true
echo "== Slurm (a real one-node cluster from ../shared/tools/local-slurm)"
bash "$top/tests/slurm-test.sh" "$build"
echo "== fuzzing: each libFuzzer harness for ${GJ_FUZZ_SECONDS:-30} s (tests/fuzz/run.sh)"
bash "$top/tests/fuzz/run.sh" "${GJ_FUZZ_SECONDS:-30}" "$build/fuzz"
echo "== make distcheck"
make -s -j"$(nproc)" distcheck >distcheck.log 2>&1 || { tail -n 60 distcheck.log >&2; echo "error: make distcheck failed" >&2; exit 1; }
echo "all tests passed in $(( $(date +%s) - start )) s"
