#!/usr/bin/python3
"""torch-gptj-infer.py - the peer of `gptj eval` / `gptj generate` in PyTorch, bfloat16, no_grad.

A GPT-J of the given shape (random weights, created in bfloat16: about 2 bytes a parameter)
runs (1) one forward over B x T tokens with the loss, as `gptj eval` does (tokens/s), and
(2) a greedy decode with a KV cache: a prompt of P tokens, then N new tokens one at a time,
as `gptj generate` does (latency per new token). GPT-J's block: h = ln_1(x);
x = x + attn(h) + mlp(h), rotary (every two) on the first rotary_dim dims of q and k, gelu_new.
Prints one JSON line. Debian's python3-torch; run with /usr/bin/python3.

Usage: /usr/bin/python3 scripts/torch-gptj-infer.py --preset gptj-6b --T 2048 --prompt 512 --new 16
"""
import argparse
import json
import math
import resource
import time

import torch
import torch.nn.functional as F

PRESETS = {
    "tiny": dict(D=64, L=2, H=4, rot=8, F=256, V=50400),
    "gptj-125m": dict(D=768, L=12, H=12, rot=16, F=3072, V=50400),
    "gptj-350m": dict(D=1024, L=24, H=16, rot=16, F=4096, V=50400),
    "gptj-6b": dict(D=4096, L=28, H=16, rot=64, F=16384, V=50400),
}


def rotate_every_two(x):
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


class GPTJ:
    def __init__(self, c, maxT, dt):
        self.c, self.dt = c, dt
        D, Fi, V = c["D"], c["F"], c["V"]
        g = torch.Generator().manual_seed(0)

        def w(*shape):  # created in bfloat16 directly: no float32 copy of the model
            t = torch.empty(*shape, dtype=dt)
            return t.normal_(0.0, 0.02, generator=g)

        self.wte = w(V, D)
        self.blocks = []
        for _ in range(c["L"]):
            self.blocks.append(dict(ln_w=torch.ones(D, dtype=dt), ln_b=torch.zeros(D, dtype=dt),
                                    qkv=w(3 * D, D), out=w(D, D), fc_in=w(Fi, D),
                                    fc_in_b=torch.zeros(Fi, dtype=dt), fc_out=w(D, Fi),
                                    fc_out_b=torch.zeros(D, dtype=dt)))
        self.lnf_w, self.lnf_b = torch.ones(D, dtype=dt), torch.zeros(D, dtype=dt)
        self.lm_w, self.lm_b = w(V, D), torch.zeros(V, dtype=dt)
        r = c["rot"]
        inv = 1.0 / (10000 ** (torch.arange(0, r, 2, dtype=torch.float32) / r))
        s = torch.outer(torch.arange(maxT, dtype=torch.float32), inv)
        self.sin = torch.sin(s).repeat_interleave(2, dim=-1).to(dt)  # maxT, r
        self.cos = torch.cos(s).repeat_interleave(2, dim=-1).to(dt)

    def params(self):
        n = self.wte.numel() + self.lm_w.numel() + self.lm_b.numel() + 2 * self.lnf_w.numel()
        return n + sum(t.numel() for b in self.blocks for t in b.values())

    def block(self, b, x, pos0, cache):
        B, T, D = x.shape
        H, hd, r = self.c["H"], D // self.c["H"], self.c["rot"]
        h = F.layer_norm(x, (D,), b["ln_w"], b["ln_b"], 1e-5)
        q, k, v = F.linear(h, b["qkv"]).split(D, dim=-1)
        q, k, v = (t.view(B, T, H, hd) for t in (q, k, v))
        sin = self.sin[pos0:pos0 + T][None, :, None, :]
        cos = self.cos[pos0:pos0 + T][None, :, None, :]
        q = torch.cat([q[..., :r] * cos + rotate_every_two(q[..., :r]) * sin, q[..., r:]], dim=-1)
        k = torch.cat([k[..., :r] * cos + rotate_every_two(k[..., :r]) * sin, k[..., r:]], dim=-1)
        if cache is not None:
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], dim=1), torch.cat([cache["v"], v], dim=1)
            cache["k"], cache["v"] = k, v
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        att = torch.matmul(q.float(), k.float().transpose(-1, -2)) * (1.0 / math.sqrt(hd))
        Tk = k.shape[2]
        mask = torch.ones(T, Tk, dtype=torch.bool).triu(diagonal=Tk - T + 1)
        att = torch.softmax(att.masked_fill(mask, float("-inf")), dim=-1).to(self.dt)
        y = torch.matmul(att, v).transpose(1, 2).reshape(B, T, D)
        mlp = F.linear(F.gelu(F.linear(h, b["fc_in"], b["fc_in_b"]), approximate="tanh"), b["fc_out"], b["fc_out_b"])
        return x + F.linear(y, b["out"]) + mlp

    def forward(self, idx, pos0=0, caches=None, last_only=False):
        x = F.embedding(idx, self.wte)
        for i, b in enumerate(self.blocks):
            x = self.block(b, x, pos0, caches[i] if caches is not None else None)
        if last_only:
            x = x[:, -1:]
        x = F.layer_norm(x, (self.c["D"],), self.lnf_w, self.lnf_b, 1e-5)
        return F.linear(x, self.lm_w, self.lm_b).float()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="gptj-6b", choices=sorted(PRESETS))
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--T", type=int, default=2048, help="eval window")
    ap.add_argument("--prompt", type=int, default=512, help="decode: prompt tokens")
    ap.add_argument("--new", type=int, default=16, help="decode: new tokens")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    c = PRESETS[a.preset]
    t0 = time.time()
    m = GPTJ(c, max(a.T, a.prompt + a.new), torch.bfloat16)
    t_make = time.time() - t0
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 50257, (a.B, a.T + 1), generator=g)
    out = dict(preset=a.preset, torch=torch.__version__, threads=torch.get_num_threads(), params=m.params(),
               make_s=round(t_make, 2))
    with torch.no_grad():
        t0 = time.time()
        logits = m.forward(idx[:, :-1])
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), idx[:, 1:].reshape(-1))
        t_eval = time.time() - t0
        out.update(eval_T=a.T, eval_B=a.B, eval_s=round(t_eval, 3), eval_tokens_per_s=round(a.B * a.T / t_eval, 2),
                   loss=round(loss.item(), 4))
        del logits
        caches = [dict() for _ in m.blocks]
        ids = idx[:1, :a.prompt]
        t0 = time.time()
        nxt = m.forward(ids, 0, caches, last_only=True)[:, -1].argmax(-1, keepdim=True)
        t_prefill = time.time() - t0
        t0 = time.time()
        for s in range(a.new):
            nxt = m.forward(nxt, a.prompt + s, caches, last_only=True)[:, -1].argmax(-1, keepdim=True)
        t_dec = time.time() - t0
        out.update(prompt=a.prompt, new=a.new, prefill_s=round(t_prefill, 3),
                   decode_s_per_token=round(t_dec / max(a.new, 1), 4))
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
