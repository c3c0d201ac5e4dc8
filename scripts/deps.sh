# Sourced by the set-up scripts: install the Debian 12 packages gptj-mpi needs (as root).
# Does nothing when they are all present.
GJ_PACKAGES="build-essential autoconf automake pkg-config libopenmpi-dev openmpi-bin
  libopenblas-openmp-dev libdnnl-dev libhdf5-openmpi-dev hdf5-tools zlib1g-dev libzstd-dev check libpcre2-dev
  libjansson-dev procps gnuplot-nox clang libclang-rt-14-dev valgrind python3-h5py python3-numpy iproute2"

gj_install_deps() {
  local missing=()
  for p in $GJ_PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing: ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "error: missing packages (${missing[*]}); run as root or: sudo apt-get install ${missing[*]}" >&2
    return 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null || { echo "error: apt-get update failed" >&2; return 1; }
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
    { echo "error: apt-get install ${missing[*]} failed" >&2; return 1; }
}

# Configure and build out of tree in $1 (wiped first when $2 is "fresh").
gj_build() {
  local top build
  build=$(realpath -m "$1")
  top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  (cd "$top" && autoreconf -fi >/dev/null 2>&1) || { echo "error: autoreconf failed in $top" >&2; return 1; }
  [ "${2:-}" = fresh ] && rm -rf "$build"
  mkdir -p "$build"
  # in a subshell: the caller's directory (and its relative paths) stay as they were
  (
    cd "$build" || exit 1
    [ -f Makefile ] || "$top/configure" -q || { echo "error: configure failed (see $build/config.log)" >&2; exit 1; }
    make -s -j"$(nproc)" || { echo "error: build failed" >&2; exit 1; }
  )
}
