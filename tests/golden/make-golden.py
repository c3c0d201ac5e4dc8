#!/usr/bin/python3
"""make-golden.py - golden files of any GPT-J shape, from a float64 NumPy reference of our own.

The shared golden (tests/golden/gptj-tiny.h5) holds one configuration. This script writes files
of the same layout (tests/golden/README.md of ../shared) for others: full-head or no rotary,
odd T, other head counts, head dimensions and vocabularies. It is written from the model's
semantics, not from gptj's C code, and it must first reproduce the shared golden (--check): its
logits, loss, hidden states, every gradient, three AdamW steps and the greedy tokens, from that
file's weights and inputs, to float64 rounding (rel <= 1e-12). Only then are its other files a
reference.

  make-golden.py --check tests/golden/gptj-tiny.h5
  make-golden.py --kappa tests/golden/gptj-tiny.h5     (the bf16 bound of test_golden.c)
  make-golden.py --out F.h5 --V 257 --D 64 --layers 2 --heads 4 --rotary 16 --F 192 --B 3 --T 13 \
      --seed 7
Needs Debian's python3-numpy and python3-h5py; run with /usr/bin/python3.
"""
import argparse
import os
import sys

import h5py
import numpy as np

ADAMW = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip_norm=1.0, steps=3)
N_NEW, PROMPT = 12, 5


def names(L):
    out = ["transformer.wte.weight"]
    for i in range(L):
        p = "transformer.h.%d." % i
        out += [p + "ln_1.weight", p + "ln_1.bias"]
        out += [p + "attn.%s_proj.weight" % s for s in ("q", "k", "v", "out")]
        out += [p + "mlp.fc_in.weight", p + "mlp.fc_in.bias", p + "mlp.fc_out.weight", p + "mlp.fc_out.bias"]
    return out + ["transformer.ln_f.weight", "transformer.ln_f.bias", "lm_head.weight", "lm_head.bias"]


def shapes(c):
    V, D, F = c["V"], c["D"], c["F"]
    s = {}
    for n in names(c["L"]):
        if n.endswith("wte.weight") or n == "lm_head.weight":
            s[n] = (V, D)
        elif n == "lm_head.bias":
            s[n] = (V,)
        elif "ln_" in n:
            s[n] = (D,)
        elif "_proj" in n:
            s[n] = (D, D)
        elif "fc_in.weight" in n:
            s[n] = (F, D)
        elif "fc_in.bias" in n:
            s[n] = (F,)
        elif "fc_out.weight" in n:
            s[n] = (D, F)
        else:
            s[n] = (D,)
    return s


# ---- the pieces, each with its backward ----

def ln_fwd(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    xh = (x - mu) * rstd
    return xh * w + b, (xh, rstd, w)


def ln_bwd(dy, cache):
    xh, rstd, w = cache
    dw = (dy * xh).reshape(-1, xh.shape[-1]).sum(0)
    db = dy.reshape(-1, xh.shape[-1]).sum(0)
    dxh = dy * w
    dx = rstd * (dxh - dxh.mean(-1, keepdims=True) - xh * (dxh * xh).mean(-1, keepdims=True))
    return dx, dw, db


GC = np.sqrt(2.0 / np.pi)


def gelu(a):
    return 0.5 * a * (1.0 + np.tanh(GC * (a + 0.044715 * a ** 3)))


def gelu_grad(a):
    t = np.tanh(GC * (a + 0.044715 * a ** 3))
    return 0.5 * (1.0 + t) + 0.5 * a * (1.0 - t * t) * GC * (1.0 + 3 * 0.044715 * a * a)


def rot_table(T, R):
    i = np.arange(R // 2, dtype=np.float64)
    inv = 1.0 / (10000.0 ** (2.0 * i / R))
    th = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(th), np.sin(th)  # [T, R/2]


def rotate(x, R, sign):
    """x [B,T,H,hd]: the interleaved pairs (2i, 2i+1) of the first R dims turned by +theta (sign 1)
    or back by -theta (sign -1, the backward of the turn: its transpose)."""
    if R == 0:
        return x
    cos, sin = rot_table(x.shape[1], R)
    cos, sin = cos[None, :, None, :], sign * sin[None, :, None, :]
    y = x.copy()
    e, o = x[..., 0:R:2], x[..., 1:R:2]
    y[..., 0:R:2] = e * cos - o * sin
    y[..., 1:R:2] = o * cos + e * sin
    return y


def forward(c, P, ids, keep=False):
    """ids [B,T] -> logits [B,T,V], hidden states, and (keep) what backward needs."""
    B, T = ids.shape
    D, H, R, eps = c["D"], c["H"], c["R"], c["eps"]
    hd = D // H
    x = P["transformer.wte.weight"][ids]
    hidden, caches = [], []
    mask = np.triu(np.ones((T, T), dtype=bool), 1)
    for i in range(c["L"]):
        p = "transformer.h.%d." % i
        h, lnc = ln_fwd(x, P[p + "ln_1.weight"], P[p + "ln_1.bias"], eps)
        q = rotate((h @ P[p + "attn.q_proj.weight"].T).reshape(B, T, H, hd), R, 1).transpose(0, 2, 1, 3)
        k = rotate((h @ P[p + "attn.k_proj.weight"].T).reshape(B, T, H, hd), R, 1).transpose(0, 2, 1, 3)
        v = (h @ P[p + "attn.v_proj.weight"].T).reshape(B, T, H, hd).transpose(0, 2, 1, 3)
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
        s[..., mask] = -np.inf
        pr = np.exp(s - s.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        o = (pr @ v).transpose(0, 2, 1, 3).reshape(B, T, D)
        a = h @ P[p + "mlp.fc_in.weight"].T + P[p + "mlp.fc_in.bias"]
        g = gelu(a)
        x = x + o @ P[p + "attn.out_proj.weight"].T + g @ P[p + "mlp.fc_out.weight"].T + P[p + "mlp.fc_out.bias"]
        hidden.append(x)
        if keep:
            caches.append((h, lnc, q, k, v, pr, o, a, g))
    hf, lnf = ln_fwd(x, P["transformer.ln_f.weight"], P["transformer.ln_f.bias"], eps)
    logits = hf @ P["lm_head.weight"].T + P["lm_head.bias"]
    return logits, hidden, (caches, hf, lnf)


def loss_of(logits, ids):
    z = logits[:, :-1, :]
    m = z.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(z - m).sum(-1, keepdims=True)))[..., 0]
    tgt = np.take_along_axis(z, ids[:, 1:, None], -1)[..., 0]
    return (lse - tgt).mean()


def backward(c, P, ids, logits, saved, kappa=None):
    """The gradients; kappa (a list) gets each layer's softmax-backward cancellation, from the
    last layer to the first: ||P (|dP| + |r|)|| / ||dS||, where dS = P (dP - r), r = rowsum(P dP).
    A rounding error relative to dP becomes kappa times as large relative to dS, and so in the
    gradients of the q and k projections."""
    B, T = ids.shape
    D, H, R = c["D"], c["H"], c["R"]
    hd = D // H
    caches, hf, lnf = saved
    G = {n: np.zeros_like(P[n]) for n in P}
    z = logits[:, :-1, :]
    pz = np.exp(z - z.max(-1, keepdims=True))
    pz /= pz.sum(-1, keepdims=True)
    np.put_along_axis(pz, ids[:, 1:, None], np.take_along_axis(pz, ids[:, 1:, None], -1) - 1.0, -1)
    dz = np.zeros_like(logits)
    dz[:, :-1, :] = pz / (B * (T - 1))
    G["lm_head.weight"] = dz.reshape(-1, c["V"]).T @ hf.reshape(-1, D)
    G["lm_head.bias"] = dz.reshape(-1, c["V"]).sum(0)
    dx, G["transformer.ln_f.weight"], G["transformer.ln_f.bias"] = ln_bwd(dz @ P["lm_head.weight"], lnf)
    for i in reversed(range(c["L"])):
        p = "transformer.h.%d." % i
        h, lnc, q, k, v, pr, o, a, g = caches[i]
        h2, dx2 = h.reshape(-1, D), dx.reshape(-1, D)
        # MLP
        G[p + "mlp.fc_out.weight"] = dx2.T @ g.reshape(-1, c["F"])
        G[p + "mlp.fc_out.bias"] = dx2.sum(0)
        da = (dx @ P[p + "mlp.fc_out.weight"]) * gelu_grad(a)
        G[p + "mlp.fc_in.weight"] = da.reshape(-1, c["F"]).T @ h2
        G[p + "mlp.fc_in.bias"] = da.reshape(-1, c["F"]).sum(0)
        dh = da @ P[p + "mlp.fc_in.weight"]
        # attention
        G[p + "attn.out_proj.weight"] = dx2.T @ o.reshape(-1, D)
        do = (dx @ P[p + "attn.out_proj.weight"]).reshape(B, T, H, hd).transpose(0, 2, 1, 3)
        dpr = do @ v.transpose(0, 1, 3, 2)
        dv = pr.transpose(0, 1, 3, 2) @ do
        r = (dpr * pr).sum(-1, keepdims=True)
        ds = pr * (dpr - r) / np.sqrt(hd)
        if kappa is not None:
            kappa.append(np.linalg.norm(pr * (np.abs(dpr) + np.abs(r))) / np.sqrt(hd) / np.linalg.norm(ds))
        dq = rotate((ds @ k).transpose(0, 2, 1, 3), R, -1).reshape(B, T, D)
        dk = rotate((ds.transpose(0, 1, 3, 2) @ q).transpose(0, 2, 1, 3), R, -1).reshape(B, T, D)
        dv = dv.transpose(0, 2, 1, 3).reshape(B, T, D)
        for s, d in (("q", dq), ("k", dk), ("v", dv)):
            G[p + "attn.%s_proj.weight" % s] = d.reshape(-1, D).T @ h2
            dh = dh + d @ P[p + "attn.%s_proj.weight" % s]
        dln, G[p + "ln_1.weight"], G[p + "ln_1.bias"] = ln_bwd(dh, lnc)
        dx = dx + dln
    np.add.at(G["transformer.wte.weight"], ids.reshape(-1), dx.reshape(-1, D))
    return G


def loss_and_grads(c, P, ids):
    logits, hidden, saved = forward(c, P, ids, keep=True)
    return logits, hidden, loss_of(logits, ids), backward(c, P, ids, logits, saved)


def adamw(c, P, ids):
    """ADAMW["steps"] steps of torch.optim.AdamW with clip_grad_norm_ on the same ids."""
    A = ADAMW
    P = {n: w.copy() for n, w in P.items()}
    m = {n: np.zeros_like(w) for n, w in P.items()}
    v = {n: np.zeros_like(w) for n, w in P.items()}
    steps = []
    for t in range(1, A["steps"] + 1):
        _, _, loss, G = loss_and_grads(c, P, ids)
        total = np.sqrt(sum((g * g).sum() for g in G.values()))
        coef = min(1.0, A["grad_clip_norm"] / (total + 1e-6))
        steps.append((loss, total, coef))
        for n in P:
            g = G[n] * coef
            m[n] = A["beta1"] * m[n] + (1 - A["beta1"]) * g
            v[n] = A["beta2"] * v[n] + (1 - A["beta2"]) * g * g
            if P[n].ndim == 2:
                P[n] = P[n] * (1 - A["lr"] * A["weight_decay"])
            den = np.sqrt(v[n]) / np.sqrt(1 - A["beta2"] ** t) + A["eps"]
            P[n] = P[n] - (A["lr"] / (1 - A["beta1"] ** t)) * m[n] / den
    return steps, P


def greedy(c, P, prompt):
    """Greedy decoding by full recompute: the first index wins a tie."""
    seq, margin = list(prompt), np.inf
    for _ in range(N_NEW):
        last = forward(c, P, np.array([seq]))[0][0, -1]
        top = np.argsort(-last, kind="stable")
        margin = min(margin, last[top[0]] - last[top[1]])
        seq.append(int(np.argmax(last)))
    return np.array(seq, dtype=np.int32), margin


def everything(c, P, ids):
    logits, hidden, loss, G = loss_and_grads(c, P, ids)
    steps, after = adamw(c, P, ids)
    gen, margin = greedy(c, P, ids[0, :PROMPT])
    return dict(logits=logits, hidden=hidden, loss=loss, grads=G, steps=steps, after=after, gen=gen,
                margin=margin)


def rel(a, r):
    a, r = np.asarray(a, dtype=np.float64), np.asarray(r, dtype=np.float64)
    den = np.linalg.norm(r)
    return np.linalg.norm(a - r) / den if den > 0 else np.linalg.norm(a - r)


def config_of(f):
    at = f.attrs
    return dict(V=int(at["vocab_size"]), D=int(at["n_embd"]), L=int(at["n_layer"]), H=int(at["n_head"]),
                R=int(at["rotary_dim"]), F=int(at["n_inner"]), eps=float(at["layer_norm_epsilon"]))


def load(path):
    """A golden file's config, weights (float64) and input ids."""
    f = h5py.File(path, "r")
    c = config_of(f)
    P = {n: f["weights"][n][...].astype(np.float64) for n in names(c["L"])}
    return f, c, P, f["inputs/input_ids"][...].astype(np.int64)


def kappa(path):
    """Print each layer's softmax-backward cancellation (see backward) at the file's weights."""
    _, c, P, ids = load(path)
    logits, _, saved = forward(c, P, ids, keep=True)
    k = []
    backward(c, P, ids, logits, saved, k)
    print("kappa:", " ".join("%.4f" % x for x in reversed(k)))
    return 0


def check(path):
    f, c, P, ids = load(path)
    r = everything(c, P, ids)
    worst, tol = 0.0, 1e-12
    pairs = [("outputs/logits", r["logits"]), ("outputs/loss", r["loss"])]
    pairs += [("outputs/hidden_after_layer_%d" % i, h) for i, h in enumerate(r["hidden"])]
    pairs += [("grads/" + n, g) for n, g in r["grads"].items()]
    for k, (loss, norm, _) in enumerate(r["steps"], 1):
        pairs += [("adamw/step_%d/loss" % k, loss), ("adamw/step_%d/grad_norm" % k, norm)]
    pairs += [("adamw/after_step_%d/%s" % (ADAMW["steps"], n), w) for n, w in r["after"].items()]
    triples = [(name, mine, f[name][...]) for name, mine in pairs]
    triples += [("adamw/step_%d clip_coef" % k, coef, f["adamw/step_%d" % k].attrs["clip_coef"])
                for k, (_, _, coef) in enumerate(r["steps"], 1) if "clip_coef" in f["adamw/step_%d" % k].attrs]
    bad = []
    for name, mine, ref in triples:
        e = rel(mine, ref)
        worst = max(worst, e)
        if not e <= tol:
            bad.append("%s rel %.3g" % (name, e))
    ref_gen = f["generate/greedy_ids"][...]
    if not np.array_equal(ref_gen, r["gen"]):
        bad.append("generate/greedy_ids %s, reference %s" % (r["gen"].tolist(), ref_gen.tolist()))
    if bad:
        print("make-golden.py: %s: the reference differs: %s" % (path, "; ".join(bad)), file=sys.stderr)
        return 1
    print("make-golden.py: %s reproduced: %d tensors, max rel %.2e (bound %g); greedy ids equal"
          % (path, len(triples), worst, tol))
    return 0


def write(path, c, B, T, seed):
    rng = np.random.default_rng(seed)
    f32 = lambda a: a.astype(np.float32).astype(np.float64)  # every weight exactly a float32
    P = {}
    for n, s in shapes(c).items():
        if "ln_" in n and n.endswith("weight"):
            P[n] = f32(1.0 + 0.1 * rng.standard_normal(s))
        elif "ln_" in n:
            P[n] = f32(0.1 * rng.standard_normal(s))
        else:
            P[n] = f32(0.02 * rng.standard_normal(s))
    ids = rng.integers(0, c["V"], size=(B, T)).astype(np.int32)
    r = everything(c, P, ids.astype(np.int64))
    if not r["margin"] > 1e-3:
        print("make-golden.py: seed %d: a greedy step's top two logits are %.2g apart, too near a tie "
              "for a float32 candidate; take another seed" % (seed, r["margin"]), file=sys.stderr)
        return 1
    z = dict(compression="gzip", shuffle=True)
    with h5py.File(path + ".tmp", "w", libver=("v108", "v110")) as f:
        for k, v in (("vocab_size", c["V"]), ("n_positions", 2048), ("n_embd", c["D"]), ("n_layer", c["L"]),
                     ("n_head", c["H"]), ("rotary_dim", c["R"]), ("n_inner", c["F"]), ("seed", seed),
                     ("head_dim", c["D"] // c["H"]), ("batch_size", B), ("seq_len", T), ("format_version", 1)):
            f.attrs[k] = np.int64(v)
        f.attrs["layer_norm_epsilon"] = np.float64(c["eps"])
        f.attrs["activation_function"] = np.bytes_("gelu_new")
        f.attrs["generator"] = np.bytes_("gptj-mpi tests/golden/make-golden.py (float64 NumPy %s)" % np.__version__)
        for n, w in P.items():
            f.create_dataset("weights/" + n, data=w, **z)
        f.create_dataset("inputs/input_ids", data=ids, **z)
        f.create_dataset("outputs/logits", data=r["logits"], **z)
        f.create_dataset("outputs/loss", data=np.float64(r["loss"]))
        for i, h in enumerate(r["hidden"]):
            f.create_dataset("outputs/hidden_after_layer_%d" % i, data=h, **z)
        for n, g in r["grads"].items():
            f.create_dataset("grads/" + n, data=g, **z)
        ga = f.create_group("adamw")
        for k, v in ADAMW.items():
            ga.attrs[k] = np.int64(v) if k == "steps" else np.float64(v)
        for k, (loss, norm, coef) in enumerate(r["steps"], 1):
            f.create_dataset("adamw/step_%d/loss" % k, data=np.float64(loss))
            f.create_dataset("adamw/step_%d/grad_norm" % k, data=np.float64(norm))
            f["adamw/step_%d" % k].attrs["clip_coef"] = np.float64(coef)
        for n, w in r["after"].items():
            f.create_dataset("adamw/after_step_%d/%s" % (ADAMW["steps"], n), data=w, **z)
        f.create_dataset("generate/prompt_ids", data=ids[0, :PROMPT])
        f.create_dataset("generate/greedy_ids", data=r["gen"])
        f["generate"].attrs["n_new_tokens"] = np.int64(N_NEW)
        f["generate"].attrs["min_top1_top2_logit_margin"] = np.float64(r["margin"])
    os.replace(path + ".tmp", path)
    print("make-golden.py: %s: V %d D %d layers %d heads %d rotary %d F %d, B %d T %d, seed %d; loss %.6f, "
          "greedy margin %.3g" % (path, c["V"], c["D"], c["L"], c["H"], c["R"], c["F"], B, T, seed, r["loss"],
                                  r["margin"]))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", metavar="GOLDEN.h5", help="reproduce this golden file, or exit 1")
    ap.add_argument("--out", metavar="FILE.h5", help="write a golden file of the shape below")
    ap.add_argument("--kappa", metavar="GOLDEN.h5", help="print each layer's softmax-backward cancellation")
    for k, d in (("V", 256), ("D", 64), ("layers", 2), ("heads", 4), ("rotary", 8), ("F", 256), ("B", 2),
                 ("T", 16), ("seed", 1)):
        ap.add_argument("--" + k, type=int, default=d)
    ap.add_argument("--eps", type=float, default=1e-5)
    a = ap.parse_args()
    if (a.check is not None) + (a.out is not None) + (a.kappa is not None) != 1:
        ap.error("give one of --check, --out or --kappa")
    if a.kappa:
        return kappa(a.kappa)
    if a.check:
        return check(a.check)
    c = dict(V=a.V, D=a.D, L=a.layers, H=a.heads, R=a.rotary, F=a.F, eps=a.eps)
    if a.D % a.heads or a.rotary % 2 or a.rotary > a.D // a.heads or a.T < PROMPT:
        ap.error("need D divisible by heads, rotary even and at most D/heads, T >= %d" % PROMPT)
    return write(a.out, c, a.B, a.T, a.seed)


if __name__ == "__main__":
    sys.exit(main())
