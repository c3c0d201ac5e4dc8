#!/usr/bin/env bash
# The main job, from a fresh Debian 12 (as root): install dependencies, build, and run it.
# Usage: scripts/quickstart.sh
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/deps.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
build=${GJ_BUILD:-$top/_build/release}
gj_install_deps
gj_build "$build"
cd "$build"
make -s tests/golden-run
echo "== golden check: forward, gradients, greedy decoding and 3 AdamW steps of the tiny GPT-J"
./tests/golden-run "$top/tests/golden/gptj-tiny.h5" "$build/golden-out.h5"
