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
# (ob1: the PML Open MPI picks here anyway; naming it skips the probe for absent fabrics)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 \
  OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
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
# tokenize's streaming readers: a corrupt and a truncated .zst (a frame of one raw block), a
# corrupt .gz, a JSONL line without the key found by rank 1 in a byte range, an over-long
# document, an empty directory
printf '\x28\xb5\x2f\xfd\x04\x00garbage, not a zstd frame' > "$w/bad.jsonl.zst"
/usr/bin/python3 - "$w" <<'PY'
import sys, json
w = sys.argv[1]
body = b'{"text": "a document of a JSONL file, cut short by a truncated zstd frame"}\n' * 3
n = len(body)
frame = bytes([0x28, 0xb5, 0x2f, 0xfd, 0x20, n]) + ((n << 3) | 1).to_bytes(3, "little") + body
open(w + "/cut.jsonl.zst", "wb").write(frame[: len(frame) - 40])
with open(w + "/late.jsonl", "w") as f:
    for i in range(3000):
        f.write(json.dumps({"text": "document %d " % i * 10}) + "\n")
    f.write(json.dumps({"title": "no text"}) + "\n")
open(w + "/long.txt", "w").write("word " * 300000 + "\n")
PY
printf '\x1f\x8b\x08\x00garbage, not deflate data' > "$w/bad.txt.gz"
(printf 'some text\n' | gzip -c; head -c 100 /dev/zero; printf 'x') > "$w/padx.txt.gz"   # zero padding, then data
mkdir -p "$w/nocorpus" && : > "$w/nocorpus/README"
cp "$w/text.h5" "$w/text.h5.zst" && cp "$top/data/brown-valid.txt" "$w/ok.h5.txt"
printf 'n_embd = 64\nn_hed = 4\n' > "$w/typo.conf"
printf 'n_layer = -3\n' > "$w/neg.conf"
printf 'n_embd = 64\nrotary_dim = 32\n' > "$w/rot.conf"
printf 'n_embd 64\n' > "$w/noeq.conf"
printf 'a\0b\n' > "$w/nul.conf"
bn=$w/$'n\xffame.conf' && printf 'n_layer = 1\n' > "$bn"   # a file name that is not UTF-8
# vocabularies a token file cannot hold: 70,000 ids (uint16), <|endoftext|> renamed at 50256
/usr/bin/python3 - "$w" "$top/data/gpt2" <<'PY'
import json, os, shutil, sys
w, src = sys.argv[1], sys.argv[2]
enc = json.load(open(src + "/encoder.json", encoding="utf-8"))
for name, edit in (("v70k", lambda e: e.update({"<|x%d|>" % i: i for i in range(50257, 70000)})),
                   ("veot", lambda e: (e.pop("<|endoftext|>"), e.update({"<|eot|>": 50256})))):
    e = dict(enc); edit(e); os.makedirs(w + "/" + name, exist_ok=True)
    json.dump(e, open(w + "/" + name + "/encoder.json", "w", encoding="utf-8"), ensure_ascii=False)
    shutil.copy(src + "/vocab.bpe", w + "/" + name + "/vocab.bpe")
PY
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
# A small model (V 64, D 16, 1 layer: small.conf) with checkpoints and datasets written here,
# valid (s_good.h5, small.h5) or with one hostile size or type each.
printf 'vocab_size = 64\nn_positions = 32\nn_embd = 16\nn_layer = 1\nn_head = 2\nrotary_dim = 4\nn_inner = 32\n' > "$w/small.conf"
# a sharded random model, then a one-file one asked into the same directory (gptj would take its index)
"$g" random-hf --preset tiny --out "$w/rhf" --shard-gb 0.01 >/dev/null 2>&1
# and a one-file model, then a sharded one asked into its directory (transformers takes the file)
"$g" random-hf --preset tiny --out "$w/rh1" >/dev/null 2>&1
printf 'data = "unterminated\n' > "$w/quote.conf"
/usr/bin/python3 - "$w" <<'PY'
import sys, os, json, struct, zlib, h5py, numpy as np
w = sys.argv[1]
CFG = dict(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2, rotary_dim=4, n_inner=32)
def names(V=64, D=16, L=1, F=32):
    t = [("transformer.wte.weight", (V, D))]
    for i in range(L):
        p = "transformer.h.%d." % i
        t += [(p + "ln_1.weight", (D,)), (p + "ln_1.bias", (D,)), (p + "attn.q_proj.weight", (D, D)),
              (p + "attn.k_proj.weight", (D, D)), (p + "attn.v_proj.weight", (D, D)),
              (p + "attn.out_proj.weight", (D, D)), (p + "mlp.fc_in.weight", (F, D)), (p + "mlp.fc_in.bias", (F,)),
              (p + "mlp.fc_out.weight", (D, F)), (p + "mlp.fc_out.bias", (D,))]
    return t + [("transformer.ln_f.weight", (D,)), ("transformer.ln_f.bias", (D,)),
                ("lm_head.weight", (V, D)), ("lm_head.bias", (V,))]
def put(obj, k, v):
    if k in obj.attrs: del obj.attrs[k]
    if v is not None: obj.attrs[k] = v
def ckpt(name, attrs={}, optim={}, loader={}, dtype={}, tensors=True, crc={}):
    rng = np.random.default_rng(0)
    with h5py.File(os.path.join(w, name), "w") as f:
        f.attrs["format"] = np.bytes_("gptj-mpi-checkpoint")
        for k, v in dict(format_version=1, step=1, tokens_seen=16, written_tp=1, written_dp=1, has_optim=1, **CFG).items():
            f.attrs[k] = np.int64(v)
        f.attrs["layer_norm_epsilon"] = 1e-5
        for k, v in attrs.items(): put(f, k, v)
        go, gl = f.create_group("optim"), f.create_group("loader")
        for k, v in dict(lr=6e-4, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1, grad_clip=1.0, lr_floor=0.1).items():
            go.attrs[k] = np.float64(v)
        for k, v in dict(warmup=100, decay_steps=1000, step=1).items(): go.attrs[k] = np.int64(v)
        for k, v in dict(seed=1234, epoch=0, cursor=1).items(): gl.attrs[k] = np.int64(v)
        for k, v in optim.items(): put(go, k, v)
        for k, v in loader.items(): put(gl, k, v)
        if not tensors: return   # a few KB: the config alone decides
        for pre in ("model", "optim/exp_avg", "optim/exp_avg_sq"):
            for n, s in names():
                a = (rng.standard_normal(s) * 0.02).astype(np.float32)
                if pre != "model": a = np.abs(a) * 1e-3
                dt = dtype.get(n) if pre == "model" else None
                if dt: a = (a * 1000).astype(dt)   # its CRC: that of what a silent conversion gives
                d = f.create_dataset(pre + "/" + n, data=a)
                d.attrs["crc32"] = np.uint32(zlib.crc32(a.astype(np.float32).tobytes()))
                if pre == "model" and n in crc: put(d, "crc32", crc[n](int(d.attrs["crc32"])))
def tokens(name, toks, offs=None, offs_dtype=np.uint64, declared=0, **attrs):
    with h5py.File(os.path.join(w, name), "w") as f:
        if declared: f.create_dataset("tokens", shape=(declared,), dtype=np.uint16, chunks=(1 << 16,))  # never written
        else: f["tokens"] = toks
        n = f["tokens"].shape[0]
        f["doc_offsets"] = np.array([0, n] if offs is None else offs, dtype=offs_dtype)
        f.attrs["format"] = np.bytes_("gptj-mpi-tokens")
        for k, v in dict(format_version=1, vocab_size=64, eot_id=50256, n_docs=f["doc_offsets"].shape[0] - 1,
                         n_tokens=n, n_bytes=4 * n).items():
            f.attrs[k] = np.int64(v)
        for k, v in attrs.items(): put(f, k, v)
def hf(name, cfg={}, raw_cfg=None, header=None, extra={}, shards=False):
    d = os.path.join(w, name); os.makedirs(d, exist_ok=True)
    c = dict(CFG, layer_norm_epsilon=1e-5, activation_function="gelu_new")
    for k, v in cfg.items():
        if v is None: del c[k]
        else: c[k] = v
    with open(os.path.join(d, "config.json"), "w") as f: f.write(raw_cfg or json.dumps(c))
    def write(path, items):
        hdr, off = {}, 0
        for n, s in items:
            k = int(np.prod(s)) * 4
            hdr[n] = dict(dtype="F32", shape=list(s), data_offsets=[off, off + k]); off += k
        hdr.update(extra)
        txt = (header(hdr) if header else json.dumps(hdr)).encode()
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(txt))); f.write(txt); f.write(np.zeros(off // 4, np.float32).tobytes())
    if shards:   # every tensor in shard a, the first one in shard b too
        write(os.path.join(d, "a.safetensors"), names()); write(os.path.join(d, "b.safetensors"), names()[:1])
        wm = {n: "a.safetensors" for n, _ in names()}; wm["extra"] = "b.safetensors"
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f: json.dump(dict(weight_map=wm), f)
    else:
        write(os.path.join(d, "model.safetensors"), names())
I64, U64, F64 = np.int64, np.uint64, np.float64
ckpt("s_good.h5")
# config attributes: sizes whose products overflow (n_positions 2^62 made eval and generate
# write far past a heap buffer), values outside int64, fractions, non-finite numbers
ckpt("s_pos.h5", attrs=dict(n_positions=I64(1 << 62)), tensors=False)
ckpt("s_vocab.h5", attrs=dict(vocab_size=I64(1 << 40)), tensors=False)
ckpt("s_embd.h5", attrs=dict(n_embd=I64(1 << 33)), tensors=False)
ckpt("s_layer.h5", attrs=dict(n_layer=I64((1 << 32) + 1)), tensors=False)
ckpt("s_inner.h5", attrs=dict(n_inner=I64(1 << 61)), tensors=False)
ckpt("s_params.h5", attrs=dict(vocab_size=I64(1 << 24), n_embd=I64(1 << 16), n_head=I64(64), rotary_dim=I64(64)), tensors=False)
ckpt("s_rot0.h5", attrs=dict(rotary_dim=I64(0)))  # no rotary embedding: gptj runs it, transformers cannot
ckpt("s_u64.h5", attrs=dict(n_embd=U64((1 << 63) + 16)), tensors=False)
ckpt("s_frac.h5", attrs=dict(n_layer=F64(1.5)))
ckpt("s_fpos.h5", attrs=dict(n_positions=F64(32.75)))
ckpt("s_nan.h5", attrs=dict(n_embd=F64("nan")), tensors=False)
ckpt("s_eps.h5", attrs=dict(layer_norm_epsilon=F64("inf")))
ckpt("s_i32.h5", dtype={"transformer.h.0.attn.q_proj.weight": np.int32})
ckpt("s_tp0.h5", attrs=dict(written_tp=I64(0)), tensors=False)
# crc32 attributes that are not one unsigned 32-bit integer (the right value first in the arrays)
WTE = "transformer.wte.weight"
ckpt("s_crcarr.h5", crc={WTE: lambda c: np.array([c] + [0x41414141] * 15000, np.uint32)})
ckpt("s_crc2.h5", crc={WTE: lambda c: np.array([c, 7], np.uint32)})
ckpt("s_crcstr.h5", crc={WTE: lambda c: np.bytes_("%d" % c)})
ckpt("s_crcfrac.h5", crc={WTE: lambda c: np.float64(c + 0.5)})
ckpt("s_crcbig.h5", crc={WTE: lambda c: np.uint64(c + (1 << 32))})
# training state
ckpt("s_negstep.h5", attrs=dict(step=I64(-5)))
ckpt("s_bigstep.h5", attrs=dict(step=F64(1e300)))
ckpt("s_toks.h5", attrs=dict(tokens_seen=I64((1 << 63) - 1)))
ckpt("s_upd.h5", attrs=dict(updates=I64(5)))      # more AdamW updates than steps
ckpt("s_negupd.h5", attrs=dict(updates=I64(-1)))
ckpt("s_hasopt.h5", attrs=dict(has_optim=I64(2)))
ckpt("s_lr.h5", optim=dict(lr=F64(-0.1)))
ckpt("s_lrnan.h5", optim=dict(lr=F64("nan")))
ckpt("s_beta2.h5", optim=dict(beta2=F64(1.0)))
ckpt("s_eps0.h5", optim=dict(eps=F64(0.0)))
ckpt("s_wd.h5", optim=dict(weight_decay=F64(-1)))
ckpt("s_floor.h5", optim=dict(lr_floor=F64(2)))
ckpt("s_warm.h5", optim=dict(warmup=F64(2.5)))
ckpt("s_seed.h5", loader=dict(seed=I64(-7)))
ckpt("s_epoch.h5", loader=dict(epoch=I64(-1)))
ckpt("s_cursor.h5", loader=dict(cursor=U64(1 << 63)))
# token datasets: ids are uint16 or uint32; offsets unsigned, from 0 up to n_tokens
ids = np.random.default_rng(1).integers(1, 64, 4000)
tokens("small.h5", ids.astype(np.uint16))
pad = ids.copy(); pad[-500:] = -1
tokens("d_i64.h5", pad.astype(np.int64))
tokens("d_f32.h5", ids.astype(np.float32) + 0.7)
big = ids.astype(np.uint32); big[1000] = 70000   # uint32 ids load; one outside the vocabulary
tokens("d_u32.h5", big)
tokens("d_i16.h5", ids.astype(np.int16))
tokens("d_u8.h5", ids.astype(np.uint8))
tokens("d_u64.h5", ids.astype(np.uint64))
tokens("d_decr.h5", ids.astype(np.uint16), offs=[0, 3000, 2000, 4000])
tokens("d_end.h5", ids.astype(np.uint16), offs=[0, 1000, 3999])
tokens("d_start.h5", ids.astype(np.uint16), offs=[5, 4000])
tokens("d_offi.h5", ids.astype(np.uint16), offs_dtype=np.int64)
tokens("d_offf.h5", ids.astype(np.uint16), offs_dtype=np.float64)
tokens("d_len.h5", ids.astype(np.uint16), n_tokens=I64(5000))
tokens("d_ndocs.h5", ids.astype(np.uint16), n_docs=I64((1 << 63) - 1))
tokens("d_nbytes.h5", ids.astype(np.uint16), n_bytes=I64(0))
tokens("d_vfrac.h5", ids.astype(np.uint16), vocab_size=F64(64.5))
tokens("d_unwritten.h5", None, declared=1 << 26)
# Hugging Face directories: safetensors headers and config.json
# a weight in a dtype of the format that is not read (4 bytes, as F32), and a dtype not of the format
hf("h_i32", header=lambda h: json.dumps({**h, "lm_head.bias": {**h["lm_head.bias"], "dtype": "I32"}}))
hf("h_q4", header=lambda h: json.dumps({**h, "lm_head.bias": {**h["lm_head.bias"], "dtype": "Q4"}}))
hf("h_f8", header=lambda h: json.dumps({**h, "lm_head.bias": {**h["lm_head.bias"], "dtype": "F8_E4M3FNUZ",
                                                                "shape": [4 * h["lm_head.bias"]["shape"][0]]}}))
hf("h_offf", header=lambda h: json.dumps({**h, "lm_head.bias": {**h["lm_head.bias"],
                                                                  "data_offsets": [float(v) for v in h["lm_head.bias"]["data_offsets"]]}}))
hf("h_dup", header=lambda h: json.dumps(h)[:-1] + ', "lm_head.bias": ' + json.dumps(h["lm_head.bias"]) + "}")
hf("h_numel", extra={"transformer.h.0.attn.bias": dict(dtype="F32", shape=[1 << 40, 1 << 40, 1 << 40, 16], data_offsets=[0, 0])})
hf("h_shards", shards=True)
hf("h_huge", cfg=dict(n_embd=1 << 40))
hf("h_frac", cfg=dict(n_embd=16.5))
hf("h_frac0", cfg=dict(n_embd=16.0))
hf("h_neg", cfg=dict(n_inner=-1))
hf("h_str", cfg=dict(n_embd="16"))
hf("h_head0", cfg=dict(n_head=0, rotary_dim=None))
hf("h_rotnull", raw_cfg=json.dumps(dict(CFG, rotary_dim=None, activation_function="gelu_new")))  # several heads: transformers cannot run it
hf("h_eps", cfg=dict(layer_norm_epsilon="1e-5"))
hf("h_real", cfg=dict(vocab_size=1e30))
hf("h_dupkey", raw_cfg=json.dumps(dict(CFG, activation_function="gelu_new"))[:-1] + ', "n_layer": 1}')
PY
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
mkdir -p "$w/hfw" && "$g" convert --to-hf "$w/hfw" --checkpoint "$ck" >/dev/null && "$g" convert --from-hf "$w/hfw" --out "$w/run/w.h5" >/dev/null
mknod "$w/dev0" c 1 3                                      # a device where an output goes
cp -a "$w/run" "$w/fiforun" && rm -f "$w/fiforun/metrics.jsonl" "$w/fiforun/lock" && mkfifo "$w/fiforun/metrics.jsonl"
mkdir -p "$w/dirckpt/ckpt-00000009.h5" && mkfifo "$w/fifo.h5"
printf 'n_embd = 64\nn-embd = 128\n' > "$w/dup.conf"
/usr/bin/python3 - "$w" "$ck" <<'PY'
import sys, shutil, zlib, h5py, numpy as np
w, ck = sys.argv[1], sys.argv[2]
def tokens(f):
    f["doc_offsets"] = np.array([0, 4000], np.uint64); f.attrs["format"] = np.bytes_("gptj-mpi-tokens")
    for k, v in dict(format_version=1, vocab_size=50257, eot_id=50256, n_docs=1, n_tokens=4000, n_bytes=16000).items():
        f.attrs[k] = np.int64(v)
with h5py.File(w + "/extfile.h5", "w") as f:    # raw data in another file (a FIFO)
    f.create_dataset("tokens", shape=(4000,), dtype=np.uint16, external=[(w + "/fifo.h5", 0, 8000)]); tokens(f)
with h5py.File(w + "/extlink.h5", "w") as f:    # an external link to a FIFO
    f["tokens"] = h5py.ExternalLink(w + "/fifo.h5", "/tokens"); tokens(f)
with h5py.File(w + "/fmt.h5", "w") as f:        # another tool's format
    f["tokens"] = np.ones(4000, np.uint16); tokens(f); f.attrs["format"] = np.bytes_("something-else")
shutil.copy(ck, w + "/nan.h5")                  # a NaN weight with a valid CRC
with h5py.File(w + "/nan.h5", "r+") as f:
    d = f["model/transformer.ln_f.weight"]; a = d[...]; a[3] = np.nan; d[...] = a
    d.attrs["crc32"] = np.uint32(zlib.crc32(a.astype("<f4").tobytes()))
shutil.copy(ck, w + "/nanlm.h5")                # a NaN in the head's second TP half, row 30000
with h5py.File(w + "/nanlm.h5", "r+") as f:
    d = f["model/lm_head.weight"]; a = d[...]; a[30000, 5] = np.nan; d[...] = a
    d.attrs["crc32"] = np.uint32(zlib.crc32(a.astype("<f4").tobytes()))
    assert a.shape[1] == 64, a.shape
shutil.copy(ck, w + "/huge.h5")                 # finite weights whose logits overflow
with h5py.File(w + "/huge.h5", "r+") as f:
    for n in ("model/transformer.ln_f.bias", "model/lm_head.weight"):
        d = f[n]; a = np.full(d.shape, 1e30, np.float32); d[...] = a
        d.attrs["crc32"] = np.uint32(zlib.crc32(a.astype("<f4").tobytes()))
PY

# Megatron indexed datasets (MMIDIDX), written from the format's definition: 4000 uint16 ids
# in 4 sequences of 1 document (mg_ok), and one fault each
/usr/bin/python3 - "$w" <<'PY'
import sys, struct
w = sys.argv[1]
def mg(name, ids=None, code=8, fmt="<H", magic=b"MMIDIDX\x00\x00", lens=(1000,) * 4, ptr_shift=0, cut=0, bin=True, nseq=None):
    ids = ids or [(i * 7919 + 13) % 50257 for i in range(sum(lens))]
    if bin: open("%s/%s.bin" % (w, name), "wb").write(b"".join(struct.pack(fmt, v) for v in ids))
    sz = struct.calcsize(fmt); ptrs = [sum(lens[:i]) * sz for i in range(len(lens))]
    ptrs[-1] += ptr_shift
    idx = magic + struct.pack("<QBQQ", 1, code, nseq or len(lens), 2) + struct.pack("<%di" % len(lens), *lens) \
        + struct.pack("<%dq" % len(lens), *ptrs) + struct.pack("<2q", 0, len(lens))
    open("%s/%s.idx" % (w, name), "wb").write(idx[: len(idx) - cut] if cut else idx)
mg("mg_ok"); mg("mg_ptr", ptr_shift=2); mg("mg_magic", magic=b"MMIDIDY\x00\x00"); mg("mg_f64", code=6, fmt="<d")
mg("mg_nobin", bin=False); mg("mg_trunc", cut=10); mg("mg_head", cut=80); mg("mg_huge", nseq=1 << 62)
mg("mg_big", ids=[1, 2, 60000, 3] * 1000, code=4, fmt="<i")
PY
# a good index beside a FIFO (whose open would block) or a directory as the .bin, and the reverse
mkfifo "$w/mg_fifo.bin" && cp "$w/mg_ok.idx" "$w/mg_fifo.idx"
mkdir -p "$w/mg_dir.bin" && cp "$w/mg_ok.idx" "$w/mg_dir.idx"
cp "$w/mg_ok.bin" "$w/mg_fifx.bin" && mkfifo "$w/mg_fifx.idx"
# np | expected text in the error | command (after gptj)
rows=(
"0|unknown command 'trian'|trian"
"0|unknown option '--stepz'|train --data $w/ok.h5 --stepz 3"
"0|--steps: missing value|train --data $w/ok.h5 --steps"
"0|--steps: expected an integer, got 'ten'|train --data $w/ok.h5 --steps ten"
"0|--lr: -1 is out of range|train --data $w/ok.h5 --lr -1"
"0|--eps: 0 is out of range|train --data $w/ok.h5 --eps 0"
"0|--decay-steps 2 is below --warmup 3|train --data $w/ok.h5 --warmup 3 --decay-steps 2"
"0|--lr 10 x --weight-decay 0.1 = 1: the decoupled decay multiplies the weights by 1 - lr x wd|train --data $w/ok.h5 --lr 10"
"0|--run-dir: missing value before '--overwrite'|train --data $w/ok.h5 --run-dir --overwrite"
"0|quote.conf:1: a quoted value must end with '\"'|train --config $w/quote.conf"
"0|--checkpoint is an option of --to-hf, not of --from-hf|convert --from-hf $w/rhf --out $w/x.h5 --checkpoint $ck"
"0|--out is an option of --from-hf|convert --to-hf $w/hfo4 --checkpoint $ck --out $w/x.h5"
"0|--out $w/rhf: holds a sharded model (model.safetensors.index.json)|random-hf --preset tiny --out $w/rhf"
"0|--out $w/rh1: holds a single-file model (model.safetensors), which transformers would take|random-hf --preset tiny --out $w/rh1 --shard-gb 0.01"
"0|--vocab-dir $w/v70k: 70000 ids, more than the 65,536 a token file's uint16 ids hold|tokenize --vocab-dir $w/v70k --out $w/x.h5 $top/data/brown-valid.txt"
"0|--vocab-dir $w/veot: id 50256 is not <|tokenize --vocab-dir $w/veot --out $w/x.h5 $top/data/brown-valid.txt"
"0|--to-hf: the model has rotary_dim 0 (no rotary embedding), which transformers' GPT-J cannot run|convert --to-hf $w/hfr0 --checkpoint $w/s_rot0.h5"
"0|random-hf: the model has rotary_dim 0|random-hf --preset tiny --rotary_dim 0 --out $w/rh0"
"2|random-hf is a plain process: run it without mpirun (here 2 ranks would each write the same files)|random-hf --preset tiny --out $w/rhmpi"
"0|--shard-gb 0.001: 324 shards, more than the 256 a reader accepts; give --shard-gb 0.003 or more|random-hf --preset tiny --n_embd 512 --n_head 8 --n_inner 2048 --n_layer 40 --dtype float32 --shard-gb 0.001 --out $w/rh256"
"0|--micro-batch: 0 is out of range [1, 1048576]|train --data $w/ok.h5 --micro-batch 0"
"0|n_head: expected a positive integer, got '0'|train --data $w/ok.h5 --n_head 0"
"0|rotary_dim 32 is larger than the head dimension 16|train --data $w/ok.h5 --config $w/rot.conf"
"0|typo.conf:2: unknown key 'n_hed'|train --data $w/ok.h5 --config $w/typo.conf"
"0|neg.conf:1: n_layer: expected a positive integer|train --data $w/ok.h5 --config $w/neg.conf"
"0|noeq.conf:1: expected 'key = value'|train --data $w/ok.h5 --config $w/noeq.conf"
"0|nul.conf:1: NUL byte|train --data $w/ok.h5 --config $w/nul.conf"
"0|missing.conf: No such file|train --data $w/ok.h5 --config $w/missing.conf"
"0|unknown preset 'gpt5'|train --data $w/ok.h5 --preset gpt5"
"0|--data: required|train --steps 2"
"0|--optimizer-in-backward 1 needs --clip 0|train --data $w/ok.h5 --optimizer-in-backward 1"
"0|--optimizer-in-backward 1 and --zero 1 exclude each other|train --data $w/ok.h5 --optimizer-in-backward 1 --clip 0 --zero 1"
"0|--optimizer-in-backward: 2 is out of range|bench --preset tiny --optimizer-in-backward 2"
"0|--grad-reduce fp16: expected fp32 or bf16|train --data $w/ok.h5 --grad-reduce fp16"
"0|--grad-reduce x: expected fp32 or bf16|bench --preset tiny --grad-reduce x"
"0|--grad-reduce BF16: expected fp32 or bf16|plan --preset tiny --grad-reduce BF16"
"0|--zero-reduce all: expected allreduce or owner|train --data $w/ok.h5 --zero 1 --zero-reduce all"
"0|--zero-reduce owner needs --zero 1|train --data $w/ok.h5 --zero-reduce owner"
"0|--zero-reduce owner needs --zero 1|bench --preset tiny --zero 0 --zero-reduce owner"
"0|--zero-reduce Owner: expected allreduce or owner|plan --preset tiny --zero 1 --zero-reduce Owner"
"0|--zero-reduce owner needs --zero 1|plan --preset tiny --dp 2 --zero-reduce owner"
"0|--dp-poll-us: -1 is out of range [0, 1000000]|bench --preset tiny --dp-poll-us -1"
"0|--dp-poll-us: 2000000 is out of range [0, 1000000]|train --data $w/ok.h5 --dp-poll-us 2000000"
"0|--dp-poll-us: expected an integer, got '1e3'|train --data $w/ok.h5 --dp-poll-us 1e3"
"0|--optimizer-in-backward 1 and --zero 1 exclude each other|bench --preset tiny --seq-len 32 --optimizer-in-backward 1 --zero 1"
"0|missing.h5: No such file|train --data $w/missing.h5"
"0|nocorpus: no token datasets in the directory (*.h5, or Megatron PREFIX.bin + PREFIX.idx)|train --data $w/nocorpus"
"0|text.h5: not an HDF5 file|train --data $w/text.h5"
"0|trunc.h5|train --data $w/trunc.h5"
"0|mg_ptr.idx: sequence 3 starts at byte 6002 of $w/mg_ptr.bin, expected 6000 (the index does not match the .bin)|train --data $w/mg_ptr --steps 1"
"0|mg_magic.idx: not a Megatron index (the magic is not MMIDIDX)|train --data $w/mg_magic.bin --steps 1"
"0|mg_f64.idx: dtype code 6 (float64) cannot hold token ids|train --data $w/mg_f64.idx --steps 1"
"0|mg_nobin.bin: No such file|train --data $w/mg_nobin --steps 1"
"0|mg_trunc.idx: 88 bytes, but its 4 sequences and 2 document indices take 98 (truncated or corrupted)|train --data $w/mg_trunc --steps 1"
"0|mg_head.idx: 18 bytes, shorter than the 34-byte MMIDIDX header|info $w/mg_head"
"0|mg_huge.idx: 98 bytes, too few for its 4611686018427387904 sequences and 2 document indices|info $w/mg_huge.idx"
"2|mg_ptr.idx: sequence 3 starts at byte 6002|eval --checkpoint $ck --data $w/mg_ptr"
"0|mg_magic.idx: not a Megatron index|info $w/mg_magic"
"0|mg_fifo.bin: is a FIFO (pipe); it is read at random offsets|train --data $w/mg_fifo --steps 1"
"0|mg_fifx.idx: is a FIFO (pipe); it is read at random offsets|info $w/mg_fifx"
"0|mg_dir.bin: is a directory, expected a file|train --data 1:$w/ok.h5,1:$w/mg_dir --steps 1"
"0|mg_big.bin: token 386 has id 60000, not below the vocabulary size 50400|train --data $w/mg_big --seq-len 16 --micro-batch 1 --steps 1 --seed 2 --run-dir $w/rmg"
"0|bigid.h5: token 82 has id 60000, not below the vocabulary size 50400|train --data $w/bigid.h5 --seq-len 16 --micro-batch 1 --steps 1 --seed 2 --run-dir $w/rbig"
"2|has id 60000, not below the vocabulary size 50400|train --data $w/bigid.h5 --seq-len 16 --micro-batch 1 --steps 1 --run-dir $w/rbig"
"0|fewer than one window|train --data $w/short.h5 --seq-len 16"
"0|--data: 'half' in 'half:$w/ok.h5' is not a weight (WEIGHT:PATH, WEIGHT a positive decimal number)|train --data half:$w/ok.h5,0.5:$w/ok.h5 --steps 1"
"0|--data: '0x10' in '0x10:$w/ok.h5' is not a weight|train --data 0x10:$w/ok.h5,1:$w/ok.h5 --steps 1"
"0|--data: weight 0 of '$w/ok.h5' is not positive|train --data 0.5:$w/ok.h5,0:$w/ok.h5 --steps 1"
"0|missing-shard.h5|train --data 0.5:$w/ok.h5,0.5:$w/ok.h5+$w/missing-shard.h5 --steps 1"
"0|--data: an empty item|train --data 0.5:$w/ok.h5,,0.5:$w/ok.h5 --steps 1"
"0|nocorpus: no token datasets in the directory|train --data 1:$w/ok.h5,1:$w/nocorpus --steps 1"
"0|--data: corpus $w/short.h5 has 3 tokens, fewer than one window of seq_len + 1 = 17 in each shard|train --data 1:$w/ok.h5,1:$w/short.h5 --seq-len 16 --steps 1"
"2|--data: 'x' in 'x:$w/ok.h5' is not a weight|train --data x:$w/ok.h5 --steps 1"
"0|--data: weight 1e-300 of '$w/ok.h5' is too small beside the largest, 1e+300 (its share underflows to 0)|train --data 1e-300:$w/ok.h5,1e300:$w/ok.h5 --steps 1"
"0|--seq-len 4096 exceeds n_positions 128|train --data $w/ok.h5 --seq-len 4096"
"0|--precision fp16: unknown precision (fp32, bf16)|train --data $w/ok.h5 --precision fp16"
"0|--gemm mkl: unknown backend (auto, openblas, onednn)|train --data $w/ok.h5 --gemm mkl"
"2|--precision half: unknown precision|eval --checkpoint $ck --data $w/ok.h5 --precision half"
"0|--gemm blis: unknown backend|generate --checkpoint $ck --prompt-ids 1 --gemm blis"
"0|--precision: missing value|bench --precision"
"2|--tp 3 does not divide the number of ranks 2|train --data $w/ok.h5 --tp 3"
"0|checkpoint has n_layer = 2, this run has 3|train --data $w/ok.h5 --n_layer 3 --resume $ck --run-dir $w/r2"
"0|text.h5: not an HDF5 file|train --data $w/ok.h5 --resume $w/text.h5 --run-dir $w/r3"
"0|text.h5: Not a directory|train --data $w/ok.h5 --steps 1 --seq-len 16 --run-dir $w/text.h5/sub"
"2|the model needs|train --data $w/ok.h5 --preset gptj-6b --seq-len 16 --micro-batch 1 --run-dir $w/r4"
"0|give one of --checkpoint or --hf|eval --data $w/ok.h5"
"0|give one of --checkpoint or --hf|generate --checkpoint $ck --hf $w/h_neg --prompt-ids 1"
"0|tensor 'transformer.wte.weight' is also in|eval --hf $w/h_shards --data $w/ok.h5"
"0|config.json: n_embd = 1099511627776 is out of range [1, 65536]|generate --hf $w/h_huge --prompt-ids 1"
"2|config.json: 'n_inner' = -1 is negative|eval --hf $w/h_neg --data $w/ok.h5"
"0|missing.h5: No such file|eval --checkpoint $w/missing.h5 --data $w/ok.h5"
"0|--data $w/ok.h5,$w/ok.h5: eval scores one dataset (a file or a Megatron prefix), not a blend or list of shards|eval --checkpoint $ck --data $w/ok.h5,$w/ok.h5"
"0|--data $w/nocorpus: eval scores one dataset (a file or a Megatron prefix), not a directory|eval --checkpoint $ck --data $w/nocorpus"
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
"0|nocorpus: no input files in the directory|tokenize --out $w/x.h5 $w/nocorpus"
"0|bad.jsonl.zst: corrupt zstd data|tokenize --out $w/x.h5 $w/bad.jsonl.zst"
"2|bad.jsonl.zst: corrupt zstd data|tokenize --out $w/x.h5 $w/ok.h5.txt $w/bad.jsonl.zst"
"0|cut.jsonl.zst: truncated zstd data|tokenize --out $w/x.h5 $w/cut.jsonl.zst"
"0|bad.txt.gz: corrupt gzip data|tokenize --out $w/x.h5 $w/bad.txt.gz"
"0|padx.txt.gz: corrupt gzip data: data after the zero padding that follows it|tokenize --out $w/x.h5 $w/padx.txt.gz"
"0|text.h5.zst: not zstd data|tokenize --out $w/x.h5 $w/text.h5.zst"
"0|notext.jsonl:1: no \"body\" string field|tokenize --text-key body --out $w/x.h5 $w/notext.jsonl"
"2|late.jsonl:3001: no \"text\" string field|tokenize --part-bytes 20000 --out $w/x.h5 $w/late.jsonl"
"0|long.txt:1: a line longer than 1 MB (raise --max-doc-mb)|tokenize --max-doc-mb 1 --out $w/x.h5 $w/long.txt"
"0|encoder.json|encode --vocab-dir $w/vocab"
"0|id 50300 is outside the vocabulary|decode"
"0|missing.h5: No such file|info $w/missing.h5"
"0|text.h5: not an HDF5 file|info $w/text.h5"
"0|give one of --from-hf or --to-hf|convert"
"0|config.json|convert --from-hf $w/missing --out $w/x.h5"
"0|--dtype: expected float32 or bfloat16|convert --to-hf $w/hfo --checkpoint $ck --dtype int8"
"0|--tp 3 does not divide n_head 4|plan --tp 3"
"0|--tp 4 is larger than vocab_size 3|plan --tp 4 --vocab_size 3"
"0|--precision fp16: unknown precision (fp32, bf16)|plan --precision fp16"
"0|--gemm mkl: unknown backend (auto, openblas, onednn)|plan --gemm mkl"
# -- rows: sizes and types read from files
"0|s_pos.h5: n_positions = 4611686018427387904 is out of range [1, 1048576]|eval --checkpoint $w/s_pos.h5 --data $w/small.h5"
"0|s_pos.h5: n_positions = 4611686018427387904 is out of range|generate --checkpoint $w/s_pos.h5 --prompt-ids 1"
"2|s_pos.h5: n_positions = 4611686018427387904 is out of range|generate --checkpoint $w/s_pos.h5 --prompt-ids 1"
"0|s_pos.h5: n_positions = 4611686018427387904 is out of range|info $w/s_pos.h5"
"0|s_vocab.h5: vocab_size = 1099511627776 is out of range [1, 16777216]|eval --checkpoint $w/s_vocab.h5 --data $w/small.h5"
"0|s_embd.h5: n_embd = 8589934592 is out of range [1, 65536]|generate --checkpoint $w/s_embd.h5 --prompt-ids 1"
"0|s_layer.h5: n_layer = 4294967297 is out of range [1, 4096]|eval --checkpoint $w/s_layer.h5 --data $w/small.h5"
"0|s_inner.h5: n_inner = 2305843009213693952 is out of range [1, 262144]|convert --to-hf $w/hfo2 --checkpoint $w/s_inner.h5"
"0|s_params.h5: the model has 2216224423968 parameters, more than the limit|info $w/s_params.h5"
"0|s_params.h5: the model has 2216224423968 parameters|eval --checkpoint $w/s_params.h5 --data $w/small.h5"
"0|s_u64.h5: attribute 'n_embd' = 9223372036854775824 is out of the int64 range|eval --checkpoint $w/s_u64.h5 --data $w/small.h5"
"0|s_frac.h5: attribute 'n_layer' = 1.5 is not an integer|eval --checkpoint $w/s_frac.h5 --data $w/small.h5"
"0|s_frac.h5: attribute 'n_layer' = 1.5 is not an integer|train --config $w/small.conf --data $w/small.h5 --steps 2 --seq-len 16 --micro-batch 1 --run-dir $w/rs --resume $w/s_frac.h5"
"0|s_fpos.h5: attribute 'n_positions' = 32.75 is not an integer|generate --checkpoint $w/s_fpos.h5 --prompt-ids 1"
"0|s_nan.h5: attribute 'n_embd' = nan is not an integer|eval --checkpoint $w/s_nan.h5 --data $w/small.h5"
"0|s_eps.h5: attribute 'layer_norm_epsilon' = inf is not a finite number|eval --checkpoint $w/s_eps.h5 --data $w/small.h5"
"0|s_i32.h5: dataset '/model/transformer.h.0.attn.q_proj.weight' is int32, expected floating point|eval --checkpoint $w/s_i32.h5 --data $w/small.h5"
"2|s_i32.h5: dataset '/model/transformer.h.0.attn.q_proj.weight' is int32|generate --checkpoint $w/s_i32.h5 --prompt-ids 1"
"0|s_i32.h5: dataset '/model/transformer.h.0.attn.q_proj.weight' is int32|convert --to-hf $w/hfo3 --checkpoint $w/s_i32.h5"
"0|s_tp0.h5: attribute 'written_tp' = 0 is out of range|info $w/s_tp0.h5"
"0|s_crcarr.h5: /model/transformer.wte.weight has no crc32 attribute, or not one unsigned 32-bit integer|eval --checkpoint $w/s_crcarr.h5 --data $w/small.h5 --seq-len 16"
"2|s_crcarr.h5: /model/transformer.wte.weight has no crc32 attribute, or not one unsigned 32-bit integer|train --config $w/small.conf --data $w/small.h5 --steps 2 --seq-len 16 --micro-batch 1 --run-dir $w/rs --resume $w/s_crcarr.h5"
"0|s_crcarr.h5: /model/transformer.wte.weight has no crc32 attribute, or not one unsigned 32-bit integer|convert --to-hf $w/hfcrc --checkpoint $w/s_crcarr.h5"
"0|s_crc2.h5: /model/transformer.wte.weight has no crc32 attribute|eval --checkpoint $w/s_crc2.h5 --data $w/small.h5 --seq-len 16"
"0|s_crcstr.h5: /model/transformer.wte.weight has no crc32 attribute|generate --checkpoint $w/s_crcstr.h5 --prompt-ids 1"
"0|s_crcfrac.h5: /model/transformer.wte.weight has no crc32 attribute|eval --checkpoint $w/s_crcfrac.h5 --data $w/small.h5 --seq-len 16"
"0|s_crcbig.h5: /model/transformer.wte.weight has no crc32 attribute|eval --checkpoint $w/s_crcbig.h5 --data $w/small.h5 --seq-len 16"
"0|s_negstep.h5: attribute 'step' = -5 is out of range [0, 1000000000000]|train --config $w/small.conf --data $w/small.h5 --steps 2 --seq-len 16 --micro-batch 1 --run-dir $w/rs --resume $w/s_negstep.h5"
"2|s_negstep.h5: attribute 'step' = -5 is out of range|train --config $w/small.conf --data $w/small.h5 --steps 2 --seq-len 16 --micro-batch 1 --run-dir $w/rs --resume $w/s_negstep.h5"
"0|s_bigstep.h5: attribute 'step' = 1e+300 is not an integer in the int64 range|train --config $w/small.conf --data $w/small.h5 --steps 2 --seq-len 16 --micro-batch 1 --run-dir $w/rs --resume $w/s_bigstep.h5"
"0|s_toks.h5: attribute 'tokens_seen' = 9223372036854775807 is out of range|train --config $w/small.conf --data $w/small.h5 --steps 2 --seq-len 16 --micro-batch 1 --run-dir $w/rs --resume $w/s_toks.h5"
"0|s_upd.h5: updates = 5 is above step = 1 (a step applies one update at most)|train --config $w/small.conf --data $w/small.h5 --steps 2 --seq-len 16 --micro-batch 1 --run-dir $w/rs --resume $w/s_upd.h5"
"0|s_upd.h5: updates = 5 is above step = 1|info $w/s_upd.h5"
"2|s_negupd.h5: attribute 'updates' = -1 is out of range [0, 1000000000000]|train --config $w/small.conf --data $w/small.h5 --steps 2 --seq-len 16 --micro-batch 1 --run-dir $w/rs --resume $w/s_negupd.h5"
"0|s_hasopt.h5: attribute 'has_optim' = 2 is out of range [0, 1]|train --config $w/small.conf --data $w/small.h5 --steps 2 --seq-len 16 --micro-batch 1 --run-dir $w/rs --resume $w/s_hasopt.h5"
"0|s_lr.h5: attribute 'optim/lr' = -0.1 is out of range [0, 10]|train --config $w/small.conf --data $w/small.h5 --steps 2 --seq-len 16 --micro-batch 1 --run-dir $w/rs --resume $w/s_lr.h5"
"0|s_lrnan.h5: attribute 'optim/lr' = nan is not a finite number|train --config $w/small.conf --data $w/small.h5 --steps 2 --seq-len 16 --micro-batch 1 --run-dir $w/rs --resume $w/s_lrnan.h5"
"0|s_beta2.h5: attribute 'optim/beta2' = 1 is out of range [0, 1)|train --config $w/small.conf --data $w/small.h5 --steps 2 --seq-len 16 --micro-batch 1 --run-dir $w/rs --resume $w/s_beta2.h5"
"0|s_eps0.h5: attribute 'optim/eps' = 0 is out of range (0, 1]|train --config $w/small.conf --data $w/small.h5 --steps 2 --seq-len 16 --micro-batch 1 --run-dir $w/rs --resume $w/s_eps0.h5"
"0|s_wd.h5: attribute 'optim/weight_decay' = -1 is out of range [0, 10]|train --config $w/small.conf --data $w/small.h5 --steps 2 --seq-len 16 --micro-batch 1 --run-dir $w/rs --resume $w/s_wd.h5"
"0|s_floor.h5: attribute 'optim/lr_floor' = 2 is out of range [0, 1]|train --config $w/small.conf --data $w/small.h5 --steps 2 --seq-len 16 --micro-batch 1 --run-dir $w/rs --resume $w/s_floor.h5"
"0|s_warm.h5: attribute 'optim/warmup' = 2.5 is not an integer|train --config $w/small.conf --data $w/small.h5 --steps 2 --seq-len 16 --micro-batch 1 --run-dir $w/rs --resume $w/s_warm.h5"
"0|s_seed.h5: attribute 'loader/seed' = -7 is out of range|train --config $w/small.conf --data $w/small.h5 --steps 2 --seq-len 16 --micro-batch 1 --run-dir $w/rs --resume $w/s_seed.h5"
"0|s_epoch.h5: attribute 'loader/epoch' = -1 is out of range|train --config $w/small.conf --data $w/small.h5 --steps 2 --seq-len 16 --micro-batch 1 --run-dir $w/rs --resume $w/s_epoch.h5"
"0|s_cursor.h5: attribute 'loader/cursor' = 9223372036854775808 is out of the int64 range|train --config $w/small.conf --data $w/small.h5 --steps 2 --seq-len 16 --micro-batch 1 --run-dir $w/rs --resume $w/s_cursor.h5"
"0|d_i64.h5: /tokens is int64, expected uint16 token ids|train --config $w/small.conf --data $w/d_i64.h5 --steps 1 --seq-len 16 --micro-batch 1 --run-dir $w/rs"
"2|d_i64.h5: /tokens is int64, expected uint16 token ids|train --config $w/small.conf --data $w/d_i64.h5 --steps 1 --seq-len 16 --micro-batch 1 --run-dir $w/rs"
"0|d_f32.h5: /tokens is float32, expected uint16|eval --checkpoint $w/s_good.h5 --data $w/d_f32.h5"
"0|s_good.h5: attribute 'format' is 'gptj-mpi-checkpoint', not a gptj token dataset|eval --checkpoint $w/s_good.h5 --data $w/s_good.h5"
"0|s_good.h5: attribute 'format' is 'gptj-mpi-checkpoint', not a gptj token dataset|train --config $w/small.conf --data $w/s_good.h5 --steps 2 --seq-len 16 --micro-batch 1 --run-dir $w/rs"
"0|d_u32.h5: token 1000 has id 70000, not below the vocabulary size 64|eval --checkpoint $w/s_good.h5 --data $w/d_u32.h5"
"2|d_u32.h5: token 1000 has id 70000, not below the vocabulary size 64|eval --checkpoint $w/s_good.h5 --data $w/d_u32.h5"
"0|d_i16.h5: /tokens is int16, expected uint16|info $w/d_i16.h5"
"0|d_u8.h5: /tokens is uint8, expected uint16|info $w/d_u8.h5"
"0|d_u64.h5: /tokens is uint64, expected uint16|info $w/d_u64.h5"
"0|d_decr.h5: /doc_offsets decreases at entry 2 (2000 after 3000)|info $w/d_decr.h5"
"0|d_end.h5: /doc_offsets ends at 3999, expected n_tokens = 4000|eval --checkpoint $w/s_good.h5 --data $w/d_end.h5"
"0|d_start.h5: /doc_offsets[0] = 5, expected 0|info $w/d_start.h5"
"0|d_offi.h5: /doc_offsets is int64, expected unsigned integer|info $w/d_offi.h5"
"0|d_offf.h5: /doc_offsets is float64, expected unsigned integer|info $w/d_offf.h5"
"0|d_len.h5: /tokens does not hold n_tokens = 5000 entries|info $w/d_len.h5"
"0|d_ndocs.h5: attribute 'n_docs' = 9223372036854775807 is out of range|info $w/d_ndocs.h5"
"0|d_nbytes.h5: attribute 'n_bytes' = 0 for 4000 tokens|eval --checkpoint $w/s_good.h5 --data $w/d_nbytes.h5"
"0|d_vfrac.h5: attribute 'vocab_size' = 64.5 is not an integer|info $w/d_vfrac.h5"
"0|d_unwritten.h5: /tokens is not fully written|info $w/d_unwritten.h5"
"0|model.safetensors: header is not a JSON object without duplicate keys (duplicate object key|convert --from-hf $w/h_dup --out $w/x.h5"
"0|model.safetensors: tensor 'lm_head.bias': dtype I32 is not supported for weights (F32, F16, BF16)|convert --from-hf $w/h_i32 --out $w/x.h5"
"2|model.safetensors: tensor 'lm_head.bias': dtype I32 is not supported for weights (F32, F16, BF16)|eval --hf $w/h_i32 --data $w/ok.h5"
"0|model.safetensors: tensor 'lm_head.bias': dtype F8_E4M3FNUZ is not supported for weights (F32, F16, BF16)|convert --from-hf $w/h_f8 --out $w/x.h5"
"0|model.safetensors: tensor 'lm_head.bias': data_offsets must be integers|convert --from-hf $w/h_offf --out $w/x.h5"
"0|model.safetensors: tensor 'lm_head.bias': dtype Q4 is not a safetensors dtype|generate --hf $w/h_q4 --prompt-ids 1"
"0|tensor 'transformer.h.0.attn.bias': the shape's element count overflows|convert --from-hf $w/h_numel --out $w/x.h5"
"0|tensor 'transformer.wte.weight' is also in|convert --from-hf $w/h_shards --out $w/x.h5"
"0|config.json: n_embd = 1099511627776 is out of range [1, 65536]|convert --from-hf $w/h_huge --out $w/x.h5"
"0|config.json: 'n_embd' must be an integer, got 16.5|convert --from-hf $w/h_frac --out $w/x.h5"
"0|config.json: 'n_embd' must be an integer, got 16.0|convert --from-hf $w/h_frac0 --out $w/x.h5"
"0|config.json: 'n_inner' = -1 is negative|convert --from-hf $w/h_neg --out $w/x.h5"
"0|config.json: 'n_embd' must be an integer, got the string|convert --from-hf $w/h_str --out $w/x.h5"
"0|config.json: n_head = 0 is out of range [1, 65536]|convert --from-hf $w/h_head0 --out $w/x.h5"
"0|config.json: rotary_dim is null with n_head 2: transformers then builds its rotary table over n_embd (16)|convert --from-hf $w/h_rotnull --out $w/x.h5"
"0|config.json: 'layer_norm_epsilon' must be a number|convert --from-hf $w/h_eps --out $w/x.h5"
"0|config.json: 'vocab_size' must be an integer, got 1e+30|convert --from-hf $w/h_real --out $w/x.h5"
"0|config.json: duplicate object key|convert --from-hf $w/h_dupkey --out $w/x.h5"
"0|n_embd = 1000000 is out of range [1, 65536]|plan --n_embd 1000000 --n_head 8"
"0|n_layer = 5000 is out of range [1, 4096]|train --data $w/ok.h5 --n_layer 5000"
"0|activations of a micro-batch of 1048576 x 1048576 tokens exceed|plan --n_embd 8192 --n_head 64 --rotary_dim 64 --n_inner 64 --n_layer 2047 --n_positions 1048576 --micro-batch 1048576 --sgemm-gflops 100"
"0|the model has 3305170453728 parameters, more than the limit|plan --n_embd 65536 --n_head 64 --rotary_dim 64 --n_layer 64 --n_inner 262144 --sgemm-gflops 100"
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
"0|--prompt-ids: id 4294967297 outside the vocabulary|generate --checkpoint $ck --prompt-ids 1,4294967297"
"0|--prompt-ids: '1.5' is not a list of integers|generate --checkpoint $ck --prompt-ids 1.5"
"0|--valid-data $w/short.h5: 3 tokens, fewer than one window of seq_len + 1 = 17|train --data $w/ok.h5 --valid-data $w/short.h5 --seq-len 16 --run-dir $w/r5"
"0|holds a run (checkpoints up to step 1): continue it with --resume auto, or start over with --overwrite|train --data $w/ok.h5 --seq-len 16 --run-dir $w/run"
"0|has checkpoints past step 0 of --resume|train --data $w/ok.h5 --seq-len 16 --run-dir $w/run --resume $w/run/w.h5"
"0|characters, at most 4048 so that the paths of its files fit in PATH_MAX|train --data $w/ok.h5 --seq-len 16 --run-dir $w/$(printf 'd%.0s' {1..4100})"
"0|File name too long|eval --checkpoint $w/$(printf 'c%.0s' {1..4100}).h5 --data $w/ok.h5"
"2|the model needs 0.|eval --checkpoint $ck --data $w/ok.h5 --mem-per-rank-gb 0.001"
"0|the model needs 0.|generate --checkpoint $ck --prompt-ids 1 --mem-per-rank-gb 0.001"
"0|the model needs 0.|train --data $w/ok.h5 --seq-len 16 --run-dir $w/r6 --mem-per-rank-gb 0.001"
"0|dev0: exists and is not a regular file|tokenize --out $w/dev0 $top/data/brown-valid.txt"
"0|dev0: exists and is not a regular file|convert --from-hf $w/hfw --out $w/dev0"
"0|metrics.jsonl: is a FIFO, not a regular file|train --data $w/ok.h5 --seq-len 16 --run-dir $w/fiforun --resume auto"
"0|ckpt-00000009.h5: is a directory, not a regular file|train --data $w/ok.h5 --seq-len 16 --run-dir $w/dirckpt --resume auto"
"0|'/tokens' is an external link|info $w/extlink.h5"
"2|'/tokens' is an external link|train --data $w/extlink.h5 --seq-len 16 --run-dir $w/r8"
"0|'/tokens' keeps its data in external files|eval --checkpoint $ck --data $w/extfile.h5"
"0|attribute 'format' is 'something-else'|train --data $w/fmt.h5 --seq-len 16 --run-dir $w/r7"
"0|transformer.ln_f.weight holds a non-finite value|eval --checkpoint $w/nan.h5 --data $w/ok.h5"
"2|lm_head.weight holds a non-finite value (nan at element 1920005)|eval --checkpoint $w/nanlm.h5 --data $w/ok.h5 --tp 2"
"0|lm_head.weight holds a non-finite value (nan at element 1920005)|eval --checkpoint $w/nanlm.h5 --data $w/ok.h5"
"0|new token 1: the model's logit of token 0 is inf|generate --checkpoint $w/huge.h5 --prompt-ids 1 --temperature 0"
"2|nothing to sample from|generate --checkpoint $w/huge.h5 --prompt-ids 1,2 --tp 2"
"0|dup.conf:2: 'n-embd' is given again (first on line 1)|plan --config $w/dup.conf"
"0|--sgemm-gflops: 1e-300 is out of range|plan --sgemm-gflops 1e-300"
"0|the name is not UTF-8, and --json records it|bench --config $bn --json $w/bj.json"
)
for row in "${rows[@]}"; do
  np=${row%%|*}; rest=${row#*|}; want=${rest%%|*}; cmd=${rest#*|}
  err=$w/err.txt
  # shellcheck disable=SC2086
  if [ "$np" = 0 ]; then
    if [ "$cmd" = decode ]; then echo "15496 50300" | timeout -k 10 60 "$g" decode >/dev/null 2>"$err"; rc=$?
    else timeout -k 10 60 "$g" $cmd >/dev/null 2>"$err" </dev/null; rc=$?; fi
  else
    timeout -k 10 60 mpirun --quiet -np "$np" "$g" $cmd >/dev/null 2>"$err" </dev/null; rc=$?
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
# would ignore SIGINT; env: a harness started under nohup ignores SIGHUP, and the shell cannot
# undo that), wait until the temporary matching $pat exists (the write is under way), send $sig,
# and set krc to the exit status.
kill_while_writing() {
  local sig=$1 pat=$2; shift 2
  set -m
  env --default-signal=HUP,INT,TERM,PIPE "$@" >/dev/null 2>&1 &
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
# (b) tokenize of 40 MB stopped by SIGTERM, SIGINT and SIGPIPE (its output piped into a reader
# that went away) while it writes the dataset
for i in 1 2 3 4 5 6 7 8; do cat "$top/data/brown-train.txt"; done > "$fdir/big.txt"
for sig in TERM INT PIPE; do
  # exit 0: the write ended between the poll and the signal (a loaded machine): once more
  for attempt in 1 2 3; do
    rm -f "$fdir"/big.h5*
    kill_while_writing $sig "$fdir/big.h5.tmp*" "$g" tokenize --out "$fdir/big.h5" "$fdir/big.txt"
    [ $krc -ne 0 ] && break
  done
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
for sig in TERM HUP; do
  for attempt in 1 2 3; do # as above: exit 0 is a write that ended before the signal
    cp "$ck" "$fdir/conv.h5"
    kill_while_writing $sig "$fdir/conv.h5.tmp*" "$g" convert --from-hf "$fdir/hfbig" --out "$fdir/conv.h5"
    [ $krc -ne 0 ] && break
  done
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
