#!/usr/bin/env python3
"""Dense-attention baseline for `nsa bench train` (benchmarks only, never used at run time).

The `m7c_125m` model of configs/ with dense causal attention instead of NSA, in plain PyTorch:
token embedding (tied LM head), pre-norm blocks (RMSNorm, q/k/v projections with RoPE, dense
GQA attention through SDPA's cuDNN backend, output projection, SwiGLU MLP), final RMSNorm, mean
cross-entropy; bf16 autocast with fp32 weights and a fused AdamW. Full optimizer steps on random
tokens, wall-clock median after warm-up; prints JSON lines
{"bench":"dense_train", "S", "batch", "step_ms", "tokens_per_s", "peak_bytes"}.

  python3 bench/dense_model_train.py --seq-lens 2048,65536 [--tokens-per-step 65536]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# m7c_125m (configs/m7c_125m.yaml) with the byte vocabulary.
DIM, LAYERS, HEADS, GROUPS, HEAD_DIM, VOCAB = 768, 12, 12, 2, 64, 256
HIDDEN = ((8 * DIM + 2) // 3 + 63) // 64 * 64


def rope(x, base=10000.0):  # x [B, heads, S, D]; pairs (2i, 2i+1) as in src/cpu/ops/rope.cpp
    S, D = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D)
    ang = torch.arange(S, device=x.device, dtype=torch.float32)[:, None] * inv[None, :]
    c, s = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.n1, self.n2 = torch.nn.RMSNorm(DIM, eps=1e-5), torch.nn.RMSNorm(DIM, eps=1e-5)
        self.wq = torch.nn.Linear(DIM, HEADS * HEAD_DIM, bias=False)
        self.wkv = torch.nn.Linear(DIM, 2 * GROUPS * HEAD_DIM, bias=False)
        self.wo = torch.nn.Linear(HEADS * HEAD_DIM, DIM, bias=False)
        self.w13 = torch.nn.Linear(DIM, 2 * HIDDEN, bias=False)
        self.w2 = torch.nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x):
        B, S, _ = x.shape
        h = self.n1(x)
        q = self.wq(h).view(B, S, HEADS, HEAD_DIM).transpose(1, 2)
        k, v = self.wkv(h).view(B, S, 2, GROUPS, HEAD_DIM).permute(2, 0, 3, 1, 4)
        q, k = rope(q), rope(k)
        rep = HEADS // GROUPS
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            o = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1),
                                               v.repeat_interleave(rep, 1), is_causal=True)
        x = x + self.wo(o.transpose(1, 2).reshape(B, S, HEADS * HEAD_DIM))
        a, b = self.w13(self.n2(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(a) * b)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = torch.nn.RMSNorm(DIM, eps=1e-5)

    def forward(self, tokens, targets):
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x)
        logits = F.linear(self.norm(x), self.emb.weight).float()
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-lens", default="2048,8192,16384,32768,65536")
    ap.add_argument("--tokens-per-step", type=int, default=65536)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    dev = torch.device("cuda")
    for S in (int(s) for s in args.seq_lens.split(",")):
        B = max(1, args.tokens_per_step // S)
        torch.manual_seed(0)
        model = Model().to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
        tokens = torch.randint(0, VOCAB, (B, S), device=dev)
        targets = torch.randint(0, VOCAB, (B, S), device=dev)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for step in range(args.warmup + args.steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(tokens, targets)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            if step >= args.warmup:
                times.append((time.perf_counter() - t0) * 1e3)
        ms = statistics.median(times)
        print(json.dumps({"bench": "dense_train", "S": S, "batch": B, "step_ms": round(ms, 2),
                          "tokens_per_s": round(B * S / (ms / 1e3)),
                          "peak_bytes": torch.cuda.max_memory_allocated()}), flush=True)
        del model, opt


if __name__ == "__main__":
    main()
