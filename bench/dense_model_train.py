#!/usr/bin/env python3
"""Dense-attention baseline for `nsa bench train` (benchmarks only, never used at run time).

Our model (by default `m7c_125m` of configs/ with the byte vocabulary; the shape flags give
another) with dense causal attention instead of NSA, in plain PyTorch: token embedding (tied LM
head), pre-norm blocks (RMSNorm, q/k/v projections with RoPE, dense GQA attention through SDPA's
cuDNN backend, output projection, SwiGLU MLP), final RMSNorm, mean cross-entropy; bf16 autocast
with fp32 weights and a fused AdamW. Full optimizer steps on random tokens, wall-clock median
after warm-up; prints JSON lines
{"bench":"dense_train", "S", "batch", "step_ms", "tokens_per_s", "peak_bytes"}.
`nsa bench train` runs it in the same call for its dense column (apps/dense_train_baseline.h),
passing the model's shape. Started by torchrun with more than one process, it is PyTorch's data
parallelism (DistributedDataParallel over NCCL, one GPU a process, `--tokens-per-step` tokens a
rank): the outside baseline for `nsa train --nproc` (scripts/two_gpu_check.sh); rank 0 prints,
with "world", the slowest rank's median step, "batch" a rank and "tokens_per_s" of all ranks.

  python3 -m torch.distributed.run --nproc_per_node 2 bench/dense_model_train.py --seq-lens 8192

  python3 bench/dense_model_train.py --seq-lens 2048,65536 [--tokens-per-step 65536]
      [--dim 768 --layers 12 --heads 12 --groups 2 --head-dim 64 --vocab 256 --hidden 2048
       --rope-base 10000 --norm-eps 1e-5]
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# m7c_125m (configs/m7c_125m.yaml) with the byte vocabulary; main() sets them from the flags.
DIM, LAYERS, HEADS, GROUPS, HEAD_DIM, VOCAB = 768, 12, 12, 2, 64, 256
HIDDEN = ((8 * DIM + 2) // 3 + 63) // 64 * 64
ROPE_BASE, NORM_EPS = 10000.0, 1e-5


def rope(x, base=None):  # x [B, heads, S, D]; pairs (2i, 2i+1) as in src/cpu/ops/rope.cpp
    S, D = x.shape[-2], x.shape[-1]
    base = ROPE_BASE if base is None else base
    inv = base ** (-torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D)
    ang = torch.arange(S, device=x.device, dtype=torch.float32)[:, None] * inv[None, :]
    c, s = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.n1, self.n2 = torch.nn.RMSNorm(DIM, eps=NORM_EPS), torch.nn.RMSNorm(DIM, eps=NORM_EPS)
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
        self.norm = torch.nn.RMSNorm(DIM, eps=NORM_EPS)

    def forward(self, tokens, targets):
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x)
        logits = F.linear(self.norm(x), self.emb.weight).float()
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def main():
    global DIM, LAYERS, HEADS, GROUPS, HEAD_DIM, VOCAB, HIDDEN, ROPE_BASE, NORM_EPS
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-lens", default="2048,8192,16384,32768,65536")
    ap.add_argument("--tokens-per-step", type=int, default=65536)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--dim", type=int, default=DIM)
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--heads", type=int, default=HEADS)
    ap.add_argument("--groups", type=int, default=GROUPS)
    ap.add_argument("--head-dim", type=int, default=HEAD_DIM)
    ap.add_argument("--vocab", type=int, default=VOCAB)
    ap.add_argument("--hidden", type=int, default=0, help="SwiGLU hidden size (0: 8/3·dim, "
                    "rounded up to a multiple of 64, as the model's default)")
    ap.add_argument("--rope-base", type=float, default=ROPE_BASE)
    ap.add_argument("--norm-eps", type=float, default=NORM_EPS)
    args = ap.parse_args()
    DIM, LAYERS, HEADS, GROUPS = args.dim, args.layers, args.heads, args.groups
    HEAD_DIM, VOCAB, ROPE_BASE, NORM_EPS = args.head_dim, args.vocab, args.rope_base, args.norm_eps
    HIDDEN = args.hidden or ((8 * DIM + 2) // 3 + 63) // 64 * 64
    if HEADS % GROUPS:
        ap.error("--heads %d is not a multiple of --groups %d" % (HEADS, GROUPS))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:  # torchrun: one GPU a process, the gradients averaged over NCCL by DDP
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
    dev = torch.device("cuda", torch.cuda.current_device())
    for S in (int(s) for s in args.seq_lens.split(",")):
        B = max(1, args.tokens_per_step // S)
        torch.manual_seed(0)  # the same weights on every rank, as DDP's broadcast leaves them
        model = Model().to(dev)
        step_model = model
        if world > 1:
            step_model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[dev.index], gradient_as_bucket_view=True)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
        torch.manual_seed(1 + rank)  # each rank its own batch
        tokens = torch.randint(0, VOCAB, (B, S), device=dev)
        targets = torch.randint(0, VOCAB, (B, S), device=dev)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for step in range(args.warmup + args.steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = step_model(tokens, targets)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            if step >= args.warmup:
                times.append((time.perf_counter() - t0) * 1e3)
        ms = statistics.median(times)
        peak = torch.cuda.max_memory_allocated()
        if world > 1:  # the slowest rank's median, the largest peak
            both = torch.tensor([ms, float(peak)], device=dev, dtype=torch.float64)
            dist.all_reduce(both, op=dist.ReduceOp.MAX)
            ms, peak = both[0].item(), int(both[1].item())
        if rank == 0:
            row = {"bench": "dense_train", "S": S, "batch": B, "step_ms": round(ms, 2),
                   "tokens_per_s": round(world * B * S / (ms / 1e3)), "peak_bytes": peak}
            if world > 1:
                row["world"] = world
            print(json.dumps(row), flush=True)
        del step_model, model, opt
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
