#!/usr/bin/env python3
"""Dense decode attention baseline for `nsa bench decode --device cuda` (benchmarks only).

One new token per sequence against a cache of S keys (B sequences, H query heads, G key/value
groups, head dim d, bf16), timed with PyTorch's scaled_dot_product_attention on the same GPU:
`--layers` calls per step (one layer's cache called once per layer, as `nsa bench decode` times
its own attention; `--distinct-layers` gives every call its own cache), captured in a CUDA graph
and replayed, so host launch overhead is not counted (`--no-graph` times eager calls instead);
mean ms per step over --steps replays after --warmup.

GQA without copying K/V: the H/G query heads of a group are packed as the query rows of that
group's K/V (q [B, G, H/G, d] against k, v [B, G, S, d], no mask – a new token sees every cached
key), which every backend runs; `--layouts` adds `gqa` (q [B, H, 1, d] with enable_gqa=True)
where the backend supports it. Each backend × layout that runs is one JSON line
{"bench":"dense_decode", "S", "B", "backend", "layout", "ms", ...} (or "error"); after each
(S, B) a {"bench":"dense_decode_best", ...} line names the fastest, which `nsa bench decode`
reads.

  python3 bench/dense_decode.py --contexts 65536,131072 --batches 1,16 [--backends cudnn,flash]
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def ints(text):
    return [int(x) for x in text.split(",") if x]


def time_one(a, S, B, backend, layout):
    dev = torch.device("cuda")
    torch.cuda.empty_cache()
    H, G, d = a.heads, a.groups, a.head_dim
    n_kv = a.layers if a.distinct_layers else 1
    ks = [torch.randn(B, G, S, d, device=dev, dtype=torch.bfloat16) for _ in range(n_kv)]
    vs = [torch.randn(B, G, S, d, device=dev, dtype=torch.bfloat16) for _ in range(n_kv)]
    if layout == "packed":
        q = torch.randn(B, G, H // G, d, device=dev, dtype=torch.bfloat16)
        extra = {}
    else:
        q = torch.randn(B, H, 1, d, device=dev, dtype=torch.bfloat16)
        extra = {"enable_gqa": True}

    def step():
        out = None
        for i in range(a.layers):
            out = F.scaled_dot_product_attention(q, ks[i % n_kv], vs[i % n_kv], **extra)
        return out

    with sdpa_kernel([BACKENDS[backend]]):
        step()  # raises when the backend cannot run this shape
        torch.cuda.synchronize()
        run, graphed = step, False
        if a.graph:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    step()
                run, graphed = graph.replay, True
            except RuntimeError:  # a backend that cannot be captured: timed eagerly, and said so
                torch.cuda.synchronize()
        for _ in range(a.warmup):
            run()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(a.steps):
            run()
        e1.record()
        torch.cuda.synchronize()
    return e0.elapsed_time(e1) / a.steps, graphed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=ints, default=ints("65536,131072"), help="S, comma-separated")
    ap.add_argument("--batches", type=ints, default=ints("1,16"), help="B, comma-separated")
    ap.add_argument("--heads", type=int, default=12, help="H query heads (m7c_125m: 12)")
    ap.add_argument("--groups", type=int, default=2, help="G key/value groups (m7c_125m: 2)")
    ap.add_argument("--head-dim", type=int, default=64, help="d = dk = dv (m7c_125m: 64)")
    ap.add_argument("--layers", type=int, default=12, help="attention calls per step")
    ap.add_argument("--backends", default="cudnn,flash", help="of " + ",".join(BACKENDS))
    ap.add_argument("--layouts", default="packed,gqa", help="packed and/or gqa (see above)")
    ap.add_argument("--steps", type=int, default=50, help="timed steps (mean reported)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    ap.add_argument("--distinct-layers", action="store_true", help="a cache per layer")
    ap.add_argument("--no-graph", dest="graph", action="store_false", help="eager calls")
    a = ap.parse_args()
    backends = [b for b in a.backends.split(",") if b]
    layouts = [x for x in a.layouts.split(",") if x]
    for b in backends:
        if b not in BACKENDS:
            ap.error(f"--backends: unknown backend '{b}' (known: {', '.join(BACKENDS)})")
    for x in layouts:
        if x not in ("packed", "gqa"):
            ap.error(f"--layouts: unknown layout '{x}' (known: packed, gqa)")
    if a.heads % a.groups != 0:
        ap.error(f"--heads {a.heads} must be a multiple of --groups {a.groups}")
    if not torch.cuda.is_available():
        print(json.dumps({"bench": "dense_decode", "error": "no CUDA device visible to PyTorch"}))
        raise SystemExit(1)
    common = {"H": a.heads, "G": a.groups, "d": a.head_dim, "layers": a.layers,
              "graph": a.graph, "distinct_layers": a.distinct_layers,
              "torch": torch.__version__, "device": torch.cuda.get_device_name()}
    for S in a.contexts:
        for B in a.batches:
            best = None
            for backend in backends:
                for layout in layouts:
                    rec = {"bench": "dense_decode", "S": S, "B": B, "backend": backend,
                           "layout": layout, **common}
                    try:
                        rec["ms"], rec["graph"] = time_one(a, S, B, backend, layout)
                        if best is None or rec["ms"] < best["ms"]:
                            best = rec
                    except (RuntimeError, TypeError) as e:  # unsupported shape, out of memory
                        rec["error"] = str(e).splitlines()[0][:200] if str(e) else repr(e)
                    print(json.dumps(rec), flush=True)
            if best is not None:
                print(json.dumps({**best, "bench": "dense_decode_best"}), flush=True)
            else:
                print(json.dumps({"bench": "dense_decode_best", "S": S, "B": B,
                                  "error": "no backend ran this shape", **common}), flush=True)


if __name__ == "__main__":
    main()
