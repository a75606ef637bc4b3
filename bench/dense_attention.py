#!/usr/bin/env python3
"""Dense causal attention baseline for `nsa bench attention --device cuda` (benchmarks only).

Times PyTorch's scaled_dot_product_attention (cuDNN backend by default) forward and backward in
bf16 for one NSA attention shape over a sweep of sequence lengths, on the same GPU, and prints
JSON lines: {"bench":"dense_attention", "config", "S", "fwd_ms", "bwd_ms", "peak_bytes", "backend"}.
GQA is handled by repeating K/V to H heads inside the timed region, as a model would.

  python3 bench/dense_attention.py --config m7c_125m --seq-lens 2048,4096 [--backend cudnn|flash|efficient]
"""
import argparse
import json
import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = {  # H, G, dk, dv (configs/*.yaml)
    "tiny": (4, 2, 16, 16),
    "small": (8, 2, 32, 32),
    "m7c_125m": (12, 2, 64, 64),
    "paper_attn": (64, 4, 192, 128),
}
BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def time_one(H, G, dk, dv, S, backend, reps):
    dev = torch.device("cuda")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    q = torch.randn(1, H, S, dk, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, G, S, dk, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, G, S, dv, device=dev, dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(1, H, S, dv, device=dev, dtype=torch.bfloat16)
    rep = H // G

    def fwd():
        with sdpa_kernel([BACKENDS[backend]]):
            return torch.nn.functional.scaled_dot_product_attention(
                q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1), is_causal=True)

    out = fwd()
    out.backward(do)
    torch.cuda.synchronize()
    f_ms, b_ms = [], []
    for _ in range(reps):
        e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        e0.record()
        out = fwd()
        e1.record()
        out.backward(do)
        e2.record()
        torch.cuda.synchronize()
        f_ms.append(e0.elapsed_time(e1))
        b_ms.append(e1.elapsed_time(e2))
        q.grad = k.grad = v.grad = None
    return statistics.median(f_ms), statistics.median(b_ms), torch.cuda.max_memory_allocated()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="m7c_125m", choices=SHAPES)
    ap.add_argument("--seq-lens", default="2048,4096,8192,16384,32768,65536")
    ap.add_argument("--backend", default="cudnn", choices=BACKENDS)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    H, G, dk, dv = SHAPES[a.config]
    for S in (int(s) for s in a.seq_lens.split(",")):
        try:
            f, b, peak = time_one(H, G, dk, dv, S, a.backend, a.reps)
            rec = {"bench": "dense_attention", "config": a.config, "S": S, "fwd_ms": f,
                   "bwd_ms": b, "peak_bytes": peak, "backend": a.backend}
        except RuntimeError as e:  # e.g. out of memory or backend unavailable for the shape
            rec = {"bench": "dense_attention", "config": a.config, "S": S, "error": str(e)[:200]}
        print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
