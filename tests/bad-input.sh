#!/usr/bin/env bash
# Table-driven bad-input tests: each row runs a gptj command (plain, or on 2 ranks) on a bad
# input and requires a non-zero exit within the time limit (no hang), no death by a signal,
# exactly one line of error output naming the file/key/flag (the expected text), and no
# checkpoint or dataset left under a final name. Usage: tests/bad-input.sh BUILD_DIR
set -uo pipefail
build=$(cd "${1:?usage: bad-input.sh BUILD_DIR}" && pwd)
top=$(cd "$(dirname "$0")/.." && pwd)
g=$build/gptj
w=$build/tests/out/bad
rm -rf "$w" && mkdir -p "$w"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
pass=0 fail=0

# fixtures
"$g" tokenize --out "$w/ok.h5" "$top/data/brown-valid.txt" >/dev/null
"$g" train --data "$w/ok.h5" --steps 1 --seq-len 16 --micro-batch 1 --run-dir "$w/run" >/dev/null 2>&1
ck=$w/run/ckpt-00000001.h5
printf 'plain text, not HDF5\n' > "$w/text.h5"
head -c 3000 "$w/ok.h5" > "$w/trunc.h5"
: > "$w/empty.txt"
printf '{"text": "fine"}\nnot json\n' > "$w/bad.jsonl"
printf '{"text": "fine"}\n{"title": "no text"}\n' > "$w/notext.jsonl"
printf 'n_embd = 64\nn_hed = 4\n' > "$w/typo.conf"
printf 'n_layer = -3\n' > "$w/neg.conf"
printf 'n_embd = 64\nrotary_dim = 32\n' > "$w/rot.conf"
printf 'n_embd 64\n' > "$w/noeq.conf"
printf 'a\0b\n' > "$w/nul.conf"
/usr/bin/python3 - "$w" <<'PY'
import sys, h5py, numpy as np
w = sys.argv[1]
with h5py.File(w + "/bigid.h5", "w") as f:   # ids beyond the model's vocabulary
    f["tokens"] = np.array([1, 2, 60000, 3] * 100, dtype=np.uint16)
    f["doc_offsets"] = np.array([0, 400], dtype=np.uint64)
    for k, v in dict(n_tokens=400, n_docs=1, n_bytes=1000, vocab_size=65536, eot_id=50256).items():
        f.attrs[k] = np.int64(v)
with h5py.File(w + "/short.h5", "w") as f:   # fewer tokens than one window
    f["tokens"] = np.array([1, 2, 3], dtype=np.uint16)
    f["doc_offsets"] = np.array([0, 3], dtype=np.uint64)
    for k, v in dict(n_tokens=3, n_docs=1, n_bytes=10, vocab_size=50257, eot_id=50256).items():
        f.attrs[k] = np.int64(v)
PY
mkdir -p "$w/vocab" && echo '{"a": 0,' > "$w/vocab/encoder.json" && cp "$top/data/gpt2/vocab.bpe" "$w/vocab/"
# fixtures of the reliability classes (issue 15)
# -- fixtures: sizes and types read from files
# -- fixtures: outputs and inputs
cp "$top/data/brown-valid.txt" "$w/f.txt"
mkfifo "$w/fifo"
mkdir -p "$w/vcopy" "$w/vfifo" "$w/hfck" "$w/hfsh" "$w/hffifo"
cp "$top/data/gpt2/encoder.json" "$top/data/gpt2/vocab.bpe" "$w/vcopy/"
cp "$top/data/gpt2/vocab.bpe" "$w/vfifo/" && mkfifo "$w/vfifo/encoder.json"
"$g" convert --to-hf "$w/hf" --checkpoint "$ck" >/dev/null
cp "$ck" "$w/hfck/model.safetensors"                              # a checkpoint where the output goes
cp "$w/hf/config.json" "$w/hfsh/" && echo '{"weight_map": {}}' > "$w/hfsh/model.safetensors.index.json"
cp "$w/hf/config.json" "$w/hffifo/" && mkfifo "$w/hffifo/model.safetensors"
long=$w$(printf '/%0200d' $(seq 1 25))                             # 5000 characters
# -- fixtures: run directory, signals, memory, paths, start-up checks

# np | expected text in the error | command (after gptj)
rows=(
"0|unknown command 'trian'|trian"
"0|unknown option '--stepz'|train --data $w/ok.h5 --stepz 3"
"0|--steps: missing value|train --data $w/ok.h5 --steps"
"0|--steps: expected an integer, got 'ten'|train --data $w/ok.h5 --steps ten"
"0|--lr: -1 is out of range|train --data $w/ok.h5 --lr -1"
"0|--micro-batch: 0 is out of range|train --data $w/ok.h5 --micro-batch 0"
"0|n_head: expected a positive integer, got '0'|train --data $w/ok.h5 --n_head 0"
"0|rotary_dim 32 is larger than the head dimension 16|train --data $w/ok.h5 --config $w/rot.conf"
"0|typo.conf:2: unknown key 'n_hed'|train --data $w/ok.h5 --config $w/typo.conf"
"0|neg.conf:1: n_layer: expected a positive integer|train --data $w/ok.h5 --config $w/neg.conf"
"0|noeq.conf:1: expected 'key = value'|train --data $w/ok.h5 --config $w/noeq.conf"
"0|nul.conf:1: NUL byte|train --data $w/ok.h5 --config $w/nul.conf"
"0|missing.conf: No such file|train --data $w/ok.h5 --config $w/missing.conf"
"0|unknown preset 'gpt5'|train --data $w/ok.h5 --preset gpt5"
"0|--data: required|train --steps 2"
"0|missing.h5: No such file|train --data $w/missing.h5"
"0|is a directory|train --data $w"
"0|text.h5: not an HDF5 file|train --data $w/text.h5"
"0|trunc.h5|train --data $w/trunc.h5"
"0|id 60000, not below the vocabulary size 50400|train --data $w/bigid.h5"
"0|fewer than one window|train --data $w/short.h5 --seq-len 16"
"0|--seq-len 4096 exceeds n_positions 128|train --data $w/ok.h5 --seq-len 4096"
"0|--precision fp16: unknown precision (fp32, bf16)|train --data $w/ok.h5 --precision fp16"
"0|--gemm mkl: unknown backend (auto, openblas, onednn)|train --data $w/ok.h5 --gemm mkl"
"0|--gemm openblas: OpenBLAS has no bfloat16 GEMM|train --data $w/ok.h5 --gemm openblas --precision bf16"
"2|--precision half: unknown precision|eval --checkpoint $ck --data $w/ok.h5 --precision half"
"0|--gemm blis: unknown backend|generate --checkpoint $ck --prompt-ids 1 --gemm blis"
"0|--precision: missing value|bench --precision"
"2|--tp 3 does not divide the number of ranks 2|train --data $w/ok.h5 --tp 3"
"0|checkpoint has n_layer = 2, this run has 3|train --data $w/ok.h5 --n_layer 3 --resume $ck --run-dir $w/r2"
"0|text.h5: not an HDF5 file|train --data $w/ok.h5 --resume $w/text.h5 --run-dir $w/r3"
"0|text.h5: Not a directory|train --data $w/ok.h5 --steps 1 --seq-len 16 --run-dir $w/text.h5/sub"
"2|the model needs|train --data $w/ok.h5 --preset gptj-6b --seq-len 16 --micro-batch 1 --run-dir $w/r4"
"0|--checkpoint: required|eval --data $w/ok.h5"
"0|missing.h5: No such file|eval --checkpoint $w/missing.h5 --data $w/ok.h5"
"0|--stride 64 exceeds --seq-len 16|eval --checkpoint $ck --data $w/ok.h5 --seq-len 16 --stride 64"
"0|give one of --prompt or --prompt-ids|generate --checkpoint $ck"
"0|id 99999 outside|generate --checkpoint $ck --prompt-ids 1,99999"
"0|--out: required|tokenize $top/data/brown-valid.txt"
"0|no input files|tokenize --out $w/x.h5"
"0|missing.txt: No such file|tokenize --out $w/x.h5 $w/missing.txt"
"0|empty.txt: no documents|tokenize --out $w/x.h5 $w/empty.txt"
"0|bad.jsonl:2: not valid JSON|tokenize --out $w/x.h5 $w/bad.jsonl"
"0|notext.jsonl:2: no \"text\" string field|tokenize --out $w/x.h5 $w/notext.jsonl"
"2|bad.jsonl:2: not valid JSON|tokenize --out $w/x.h5 $w/bad.jsonl"
"0|is a directory|tokenize --out $w/x.h5 $w"
"0|encoder.json|encode --vocab-dir $w/vocab"
"0|id 50300 is outside the vocabulary|decode"
"0|missing.h5: No such file|info $w/missing.h5"
"0|text.h5: not an HDF5 file|info $w/text.h5"
"0|give one of --from-hf or --to-hf|convert"
"0|config.json|convert --from-hf $w/missing --out $w/x.h5"
"0|--dtype: expected float32 or bfloat16|convert --to-hf $w/hfo --checkpoint $ck --dtype int8"
"0|--tp 3 does not divide n_head 4|plan --tp 3"
# -- rows: sizes and types read from files
# -- rows: outputs and inputs
"0|--valid-out $w/y.h5: the same file as --out $w/y.h5|tokenize --out $w/y.h5 --valid-out $w/y.h5 --valid-fraction 0.1 $w/f.txt"
"0|the same file as --out $w/y.h5|tokenize --out $w/y.h5 --valid-out $w/../bad/./y.h5 --valid-fraction 0.1 $w/f.txt"
"0|--out $w/f.txt: the same file as the input $w/f.txt|tokenize --out $w/f.txt $w/f.txt"
"0|--valid-out $w/f.txt: the same file as the input|tokenize --out $w/y.h5 --valid-out $w/f.txt --valid-fraction 0.1 $w/f.txt"
"0|--out $w/ok.h5: the same file as the input $w/ok.h5|tokenize --out $w/ok.h5 $w/ok.h5"
"0|the same file as the vocabulary file $w/vcopy/vocab.bpe|tokenize --vocab-dir $w/vcopy --out $w/vcopy/vocab.bpe $w/f.txt"
"0|--out $w/nodir/x.h5: directory $w/nodir: No such file|tokenize --out $w/nodir/x.h5 $w/f.txt"
"0|--out $w: is a directory|tokenize --out $w $w/f.txt"
"0|path longer than 4096 characters|tokenize --out $long/x.h5 $w/f.txt"
"0|--out $w/hf/model.safetensors: the same file as the input|convert --from-hf $w/hf --out $w/hf/model.safetensors"
"0|--out $w/hf/config.json: the same file as the input|convert --from-hf $w/hf --out $w/hf/config.json"
"0|--out $w/nodir/x.h5: directory $w/nodir: No such file|convert --from-hf $w/hf --out $w/nodir/x.h5"
"0|model.safetensors: is a FIFO|convert --from-hf $w/hffifo --out $w/x.h5"
"0|the same file as --checkpoint $w/hfck/model.safetensors|convert --to-hf $w/hfck --checkpoint $w/hfck/model.safetensors"
"0|--to-hf $w/hfsh: holds a sharded model|convert --to-hf $w/hfsh --checkpoint $ck"
"0|--to-hf $w/f.txt: not a directory|convert --to-hf $w/f.txt --checkpoint $ck"
"0|--checkpoint $w/fifo: is a FIFO|convert --to-hf $w/hfo --checkpoint $w/fifo"
"0|path longer than 4096 characters|convert --to-hf $long --checkpoint $ck"
"2|$w/fifo: is a FIFO (pipe); under mpirun (2 ranks)|tokenize --out $w/x.h5 $w/fifo"
"2|/dev/stdin: is a|tokenize --out $w/x.h5 /dev/stdin"
"2|-: stdin reaches rank 0 only|tokenize --out $w/x.h5 -"
"2|vfifo/encoder.json: is a FIFO|tokenize --vocab-dir $w/vfifo --out $w/x.h5 $w/f.txt"
"2|$w/fifo: is a FIFO (pipe); under mpirun (2 ranks)|train --data $w/ok.h5 --config $w/fifo"
"2|--out $w/f.txt: the same file as the input|tokenize --out $w/f.txt $w/f.txt"
# -- rows: run directory, signals, memory, paths, start-up checks
)
for row in "${rows[@]}"; do
  np=${row%%|*}; rest=${row#*|}; want=${rest%%|*}; cmd=${rest#*|}
  err=$w/err.txt
  # shellcheck disable=SC2086
  if [ "$np" = 0 ]; then
    if [ "$cmd" = decode ]; then echo "15496 50300" | timeout 60 "$g" decode >/dev/null 2>"$err"; rc=$?
    else timeout 60 "$g" $cmd >/dev/null 2>"$err" </dev/null; rc=$?; fi
  else
    timeout 60 mpirun --quiet -np "$np" "$g" $cmd >/dev/null 2>"$err" </dev/null; rc=$?
  fi
  lines=$(grep -cv -e '^\[rank [0-9]*\] warning' -e '^$' "$err")
  if [ $rc -ne 0 ] && [ $rc -lt 124 ] && [ "$lines" -eq 1 ] && grep -qF -- "$want" "$err"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1)); echo "FAIL: bad input: gptj $cmd (np $np): exit $rc, $lines lines, wanted '$want':"; sed 's/^/    /' "$err" | head -5
  fi
done
# nothing left under a final name by the failed tokenize runs
if [ -e "$w/x.h5" ]; then fail=$((fail + 1)); echo "FAIL: bad input: a partial $w/x.h5 was left"; else pass=$((pass + 1)); fi
# -- fault tests: outputs and inputs (issue 15 class 6). Each run fails or is stopped while an
# output is being written; the file that was there before must be untouched, no temporary
# may remain and no partial output may appear under the final name.
fdir=$w/fault
mkdir -p "$fdir/hf"
fault() { # name, then a condition that must hold
  local name=$1; shift
  if "$@"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: fault: $name"; fi
}
no_tmp() { ! compgen -G "$1/*.tmp*" >/dev/null && ! compgen -G "$1/.gptj.*" >/dev/null; }
# Start "$@" with the default signal dispositions (job control: a background job of a script
# would ignore SIGINT), wait until the temporary matching $pat exists (the write is under way),
# send $sig, and set krc to the exit status.
kill_while_writing() {
  local sig=$1 pat=$2; shift 2
  set -m
  "$@" >/dev/null 2>&1 &
  local p=$! k
  set +m
  for ((k = 0; k < 3000; k++)); do
    compgen -G "$pat" >/dev/null && break
    kill -0 $p 2>/dev/null || break
    sleep 0.01
  done
  kill -"$sig" $p 2>/dev/null
  wait $p; krc=$?
}
# (a) convert --to-hf over a good model from a checkpoint whose last tensor (by name) fails its
# CRC: the error comes after most of model.safetensors is written
cp "$w/hf/model.safetensors" "$w/hf/config.json" "$fdir/hf/"
cp "$ck" "$fdir/bad.h5"
/usr/bin/python3 - "$fdir/bad.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    d = f["model/transformer.wte.weight"]
    d[5, 3] = d[5, 3] + 1.0   # the stored crc32 no longer matches
PY
timeout 60 "$g" convert --to-hf "$fdir/hf" --checkpoint "$fdir/bad.h5" >/dev/null 2>"$fdir/err"; rc=$?
fault "convert --to-hf of a corrupt checkpoint exits 1 naming the tensor (exit $rc)" \
  bash -c "[ $rc -eq 1 ] && grep -q 'transformer.wte.weight is corrupted' '$fdir/err'"
fault "convert --to-hf failing midway keeps the old model.safetensors" cmp -s "$w/hf/model.safetensors" "$fdir/hf/model.safetensors"
fault "convert --to-hf failing midway keeps the old config.json" cmp -s "$w/hf/config.json" "$fdir/hf/config.json"
fault "convert --to-hf failing midway leaves no temporaries" no_tmp "$fdir/hf"
# (b) tokenize of 40 MB stopped by SIGTERM and by SIGINT while it writes the dataset
for i in 1 2 3 4 5 6 7 8; do cat "$top/data/brown-train.txt"; done > "$fdir/big.txt"
for sig in TERM INT; do
  kill_while_writing $sig "$fdir/big.h5.tmp*" "$g" tokenize --out "$fdir/big.h5" "$fdir/big.txt"
  fault "tokenize stopped by SIG$sig ends by the signal (exit $krc)" [ $krc -gt 128 ]
  fault "tokenize stopped by SIG$sig leaves no temporary" no_tmp "$fdir"
  fault "tokenize stopped by SIG$sig leaves no output" [ ! -e "$fdir/big.h5" ]
  rm -f "$fdir"/big.h5*
done
rm -f "$fdir/big.txt"
# (c) convert --from-hf of a 21M-parameter model (F16, sparse zeros) stopped by SIGTERM and
# SIGHUP while it writes the checkpoint; an old checkpoint at --out stays as it was
mkdir -p "$fdir/hfbig"
/usr/bin/python3 - "$fdir/hfbig" <<'PY'
import sys, json, struct
d = sys.argv[1]; D = 192; L = 4; V = 50400; F = 4 * D
json.dump(dict(vocab_size=V, n_positions=128, n_embd=D, n_layer=L, n_head=4, rotary_dim=8, n_inner=F,
               activation_function="gelu_new", layer_norm_epsilon=1e-5), open(d + "/config.json", "w"))
sh = {"transformer.wte.weight": [V, D], "lm_head.weight": [V, D], "lm_head.bias": [V],
      "transformer.ln_f.weight": [D], "transformer.ln_f.bias": [D]}
for i in range(L):
    p = "transformer.h.%d." % i
    for n in ("q_proj", "k_proj", "v_proj", "out_proj"): sh[p + "attn." + n + ".weight"] = [D, D]
    sh[p + "ln_1.weight"] = [D]; sh[p + "ln_1.bias"] = [D]
    sh[p + "mlp.fc_in.weight"] = [F, D]; sh[p + "mlp.fc_in.bias"] = [F]
    sh[p + "mlp.fc_out.weight"] = [D, F]; sh[p + "mlp.fc_out.bias"] = [D]
hdr, off = {}, 0
for k, s in sh.items():
    n = 2 * s[0] * (s[1] if len(s) > 1 else 1)
    hdr[k] = dict(dtype="F16", shape=s, data_offsets=[off, off + n]); off += n
h = json.dumps(hdr).encode(); h += b" " * ((8 - len(h) % 8) % 8)
with open(d + "/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h))); f.write(h); f.truncate(8 + len(h) + off)
PY
cp "$ck" "$fdir/conv.h5"
for sig in TERM HUP; do
  kill_while_writing $sig "$fdir/conv.h5.tmp*" "$g" convert --from-hf "$fdir/hfbig" --out "$fdir/conv.h5"
  fault "convert --from-hf stopped by SIG$sig ends by the signal (exit $krc)" [ $krc -gt 128 ]
  fault "convert --from-hf stopped by SIG$sig leaves no temporary" no_tmp "$fdir"
  fault "convert --from-hf stopped by SIG$sig keeps the old checkpoint" cmp -s "$ck" "$fdir/conv.h5"
  rm -f "$fdir"/conv.h5.tmp*
done
rm -rf "$fdir/hfbig"
# and none of the failed runs above left a temporary
fault "no temporaries left by the failed commands" no_tmp "$w"
echo "bad input: $pass passed, $fail failed"
[ $fail -eq 0 ]
