#!/usr/bin/env bash
# Install dependencies, build from scratch out of tree, run every test (make check), then
# make distcheck. Usage: scripts/test.sh   (as root on Debian 12; idempotent)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/deps.sh"
# ranks that wait yield the core: the valgrind run and the suites share the 2 cores with them;
# ob1 is the PML Open MPI picks on these machines, named to skip probing for absent fabrics
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1 \
  OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
build=$(realpath -m "${GJ_TEST_BUILD:-$top/_build/test}")
start=$(date +%s)
# each stage's heading says when it began (seconds since the start): CI has 30 minutes
stage() { echo "== [$(( $(date +%s) - start )) s] $*"; }
gj_install_deps
gj_build "$build" fresh
cd "$build"
stage "make check"
if ! make -j"$(nproc)" check; then
  echo "error: make check failed; logs:" >&2
  for f in $(find tests -name '*.log' -newer Makefile); do echo "--- $f" >&2; tail -n 40 "$f" >&2; done
  exit 1
fi
cat tests/*.log | grep -E '^(golden|[0-9]+%)' || true
stage "valgrind (in the background, one core): a few training steps, no invalid access and no definite leak"
# A GPT-J of the tiny preset's shape with a vocabulary of 512 on random ids: every code path
# of a training step, the checkpoint and the start-up, at a cost valgrind can run in a minute
# (the 50,400-row vocabulary head would take it several).
rm -rf tests/out/valgrind && mkdir -p tests/out/valgrind
/usr/bin/python3 - tests/out/valgrind/v512.h5 <<'PY'
import sys, h5py, numpy as np
ids = np.random.default_rng(1).integers(0, 500, 4000).astype(np.uint16)
with h5py.File(sys.argv[1], "w") as f:
    f["tokens"] = ids
    f["doc_offsets"] = np.array([0, 2000, 4000], dtype=np.uint64)
    for k, v in dict(n_tokens=4000, n_docs=2, n_bytes=16000, vocab_size=512, eot_id=0).items():
        f.attrs[k] = np.int64(v)
PY
OMP_NUM_THREADS=1 timeout 900 valgrind --error-exitcode=1 --leak-check=full --show-leak-kinds=definite \
  --errors-for-leak-kinds=definite --suppressions=/usr/share/openmpi/openmpi-valgrind.supp \
  --suppressions="$top/tests/valgrind.supp" ./gptj train --data tests/out/valgrind/v512.h5 --vocab_size 512 \
  --steps 3 --micro-batch 2 --seq-len 16 --run-dir tests/out/valgrind/run >tests/valgrind.log 2>&1 &
vg=$!
trap 'kill $vg 2>/dev/null || true' EXIT # a stage that fails below does not leave it running
stage "bad input: every command, one clear line, non-zero exit, no hang (tests/bad-input.sh)"
bash "$top/tests/bad-input.sh" "$build"
stage "valgrind: waiting for it"
wait $vg || { tail -n 40 tests/valgrind.log >&2; echo "error: valgrind found errors" >&2; exit 1; }
trap - EXIT
grep -E 'ERROR SUMMARY' tests/valgrind.log
stage "Slurm (a real one-node cluster from ../shared/tools/local-slurm)"
bash "$top/tests/slurm-test.sh" "$build"
stage "multi-node: 2 Slurm nodes in network namespaces (tests/cluster/local-cluster, tests/cluster-test.sh)"
bash "$top/tests/cluster-test.sh" "$build"
stage "fuzzing: each libFuzzer harness for ${GJ_FUZZ_SECONDS:-15} s (tests/fuzz/run.sh)"
bash "$top/tests/fuzz/run.sh" "${GJ_FUZZ_SECONDS:-15}" "$build/fuzz"
stage "AddressSanitizer + UndefinedBehaviorSanitizer build: make check (./configure --enable-sanitizers), but the \"long\" cases"
# Leak checking is left to valgrind above: LeakSanitizer cannot attribute Open MPI's never-freed
# init allocations, made in plugins it has unloaded by exit. Every suite runs, but the cases
# tagged "long" in test_train, test_resume and test_faults (the many-layout and whole-process ones: the
# plain build ran them above, and their code is reached by the cases that run here), so that
# CI stays within its 30 minutes.
san=$build-sanitizers
rm -rf "$san" && mkdir -p "$san"
(cd "$san" && "$top/configure" -q --enable-sanitizers && make -s -j"$(nproc)" >/dev/null &&
 ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 CK_EXCLUDE_TAGS=long \
   make -j"$(nproc)" check >check.log 2>&1) ||
  { grep -E '^(PASS|FAIL|ERROR)' "$san/check.log" >&2 || true # no log: the build itself failed
    for t in $(grep -E '^(FAIL|ERROR):' "$san/check.log" 2>/dev/null | cut -d' ' -f2); do
      echo "--- $t.log" >&2; tail -n 40 "$san/$t.log" >&2 || true; done
    echo "error: the sanitizer build failed its tests (see $san)" >&2; exit 1; }
grep -E '^# (PASS|FAIL)' "$san/check.log"
stage "make distcheck (the tarball builds and runs the unit suites; the process-level ones ran twice above)"
make -s -j"$(nproc)" distcheck TESTS="tests/test_kernels tests/test_optim tests/test_config tests/test_golden \
  tests/test_tokenizer" >distcheck.log 2>&1 || { tail -n 60 distcheck.log >&2; echo "error: make distcheck failed" >&2; exit 1; }
echo "all tests passed in $(( $(date +%s) - start )) s"
