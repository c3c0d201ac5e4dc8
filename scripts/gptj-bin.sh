# Sourced (by sh or bash) by the scripts that run gptj: which gptj binary to use. The order:
#   1. the script's --gptj PATH, when it has that flag and it was given;
#   2. $GPTJ, when set and not empty;
#   3. the first executable of, in the source tree: _build/release/gptj (scripts/quickstart.sh),
#      _build/gptj (the README's build by hand), _build/rel/gptj, _build/test/gptj (scripts/test.sh);
#   4. gptj on PATH.
# The sanitizer build (_build/test-sanitizers, from scripts/test.sh) is never chosen: give it by
# --gptj or $GPTJ. scripts/bench-vs-torch (Python) follows the same order.
#
# gj_gptj NAME TOP [FLAG_VALUE]: sets gptj to the binary and says which on stderr
# ("NAME: gptj: PATH (from ...)"); or prints "NAME: error: ..." and returns 1. A script with a
# --gptj flag passes its value (even empty) as FLAG_VALUE.
gj_gptj() {
  _gj_name=$1 _gj_top=$2 _gj_flag=${3:-} _gj_from='' gptj='' _gj_hint="GPTJ=PATH"
  [ $# -ge 3 ] && _gj_hint="--gptj PATH or GPTJ=PATH"
  if [ -n "$_gj_flag" ]; then
    gptj=$_gj_flag _gj_from=--gptj
  elif [ -n "${GPTJ:-}" ]; then
    gptj=$GPTJ _gj_from=GPTJ
  fi
  if [ -n "$_gj_from" ]; then
    # a bare name (GPTJ=gptj): the one on PATH
    case $gptj in */*) ;; *) _gj_p=$(command -v "$gptj" 2>/dev/null) && [ -n "$_gj_p" ] && gptj=$_gj_p ;; esac
    if [ ! -f "$gptj" ] || [ ! -x "$gptj" ]; then
      if [ "$_gj_from" = GPTJ ]; then
        echo "$_gj_name: error: GPTJ=$gptj: not an executable file" >&2
      else
        echo "$_gj_name: error: --gptj $gptj: not an executable file" >&2
      fi
      return 1
    fi
    echo "$_gj_name: gptj: $gptj (from $_gj_from)" >&2
    return 0
  fi
  for gptj in "$_gj_top/_build/release/gptj" "$_gj_top/_build/gptj" "$_gj_top/_build/rel/gptj" \
              "$_gj_top/_build/test/gptj"; do
    if [ -f "$gptj" ] && [ -x "$gptj" ]; then
      echo "$_gj_name: gptj: $gptj (the build tree)" >&2
      return 0
    fi
  done
  if gptj=$(command -v gptj 2>/dev/null) && [ -n "$gptj" ]; then
    echo "$_gj_name: gptj: $gptj (PATH)" >&2
    return 0
  fi
  gptj=
  echo "$_gj_name: error: no gptj found (none in $_gj_top/_build/release, _build, _build/rel or _build/test, none on PATH): build it (scripts/quickstart.sh), or give $_gj_hint" >&2
  return 1
}
