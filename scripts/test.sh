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
echo "== bad input: every command, one clear line, non-zero exit, no hang (tests/bad-input.sh)"
bash "$top/tests/bad-input.sh" "$build"
echo "== valgrind: a few training steps, no invalid access and no definite leak"
rm -rf tests/out/valgrind
OMP_NUM_THREADS=1 timeout 900 valgrind --error-exitcode=1 --leak-check=full --show-leak-kinds=definite \
  --errors-for-leak-kinds=definite --suppressions=/usr/share/openmpi/openmpi-valgrind.supp \
  --suppressions="$top/tests/valgrind.supp" ./gptj train --data tests/out/bad/ok.h5 --steps 3 \
  --micro-batch 2 --seq-len 16 --run-dir tests/out/valgrind >tests/valgrind.log 2>&1 ||
  { tail -n 40 tests/valgrind.log >&2; echo "error: valgrind found errors" >&2; exit 1; }
grep -E 'ERROR SUMMARY' tests/valgrind.log
echo "== Slurm (a real one-node cluster from ../shared/tools/local-slurm)"
bash "$top/tests/slurm-test.sh" "$build"
echo "== multi-node: 2 Slurm nodes in network namespaces (tests/cluster/local-cluster, tests/cluster-test.sh)"
bash "$top/tests/cluster-test.sh" "$build"
echo "== fuzzing: each libFuzzer harness for ${GJ_FUZZ_SECONDS:-15} s (tests/fuzz/run.sh)"
bash "$top/tests/fuzz/run.sh" "${GJ_FUZZ_SECONDS:-15}" "$build/fuzz"
echo "== AddressSanitizer + UndefinedBehaviorSanitizer build: make check (./configure --enable-sanitizers)"
# Leak checking is left to valgrind above: LeakSanitizer cannot attribute Open MPI's never-freed
# init allocations, made in plugins it has unloaded by exit.
san=$build-sanitizers
rm -rf "$san" && mkdir -p "$san"
(cd "$san" && "$top/configure" -q --enable-sanitizers && make -s -j"$(nproc)" >/dev/null &&
 ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
   make -j"$(nproc)" check >check.log 2>&1) ||
  { grep -E '^(PASS|FAIL|ERROR)' "$san/check.log" >&2
    for t in $(grep -E '^(FAIL|ERROR):' "$san/check.log" | cut -d' ' -f2); do
      echo "--- $t.log" >&2; tail -n 40 "$san/$t.log" >&2 || true; done
    echo "error: the sanitizer build failed its tests (see $san)" >&2; exit 1; }
grep -E '^# (PASS|FAIL)' "$san/check.log"
echo "== make distcheck (the tarball builds and tests; the three longest tests, which ran twice above, left out)"
make -s -j"$(nproc)" distcheck TESTS="tests/test_kernels tests/test_optim tests/test_config tests/test_golden \
  tests/test_tokenizer tests/test_mpi_np2 tests/test_convert" >distcheck.log 2>&1 || { tail -n 60 distcheck.log >&2; echo "error: make distcheck failed" >&2; exit 1; }
echo "all tests passed in $(( $(date +%s) - start )) s"
