#!/usr/bin/env python3
"""The PyTorch op's cost over the C++ kernels: nsa.attention forward + backward from PyTorch
against `nsa bench attention --device cuda` (same GPU, same shapes) and against dense SDPA
(benchmarks only; docs/pytorch.md, docs/perf.md).

For each config (configs/*.yaml attention shapes: separate K/V, φ = avg, as `nsa bench attention`)
and sequence length, one sequence of S tokens:
  - nsa C++: `nsa bench attention --device cuda` run from here (--nsa-binary), or its --json lines
    given with --cpp-json; CUDA events around NsaCudaLayer::forward and ::backward, median.
  - op, per call: CUDA events around nsa.attention and around torch.autograd.grad of its output
    (the gradients of q, K/V and gates, in bf16 like the inputs), median of --reps after warm-up –
    the C++ benchmark's method, so the difference is what the op adds: ctypes and argument checks
    on the host while the GPU waits, output and workspace allocation, the fp32 → bf16 casts of the
    gradients.
  - op, back to back: --reps forward + backward passes with no synchronisation in between, total
    time / reps – a training step's situation, where the host runs ahead of the GPU; --windows
    such windows, the median reported (one slow pass – a collection, the allocator – moves a
    single window's mean by a percent at these lengths). "op host" is the host's time to issue
    one forward + backward after a synchronisation (an empty launch queue; inside a window the
    queue fills and launches block, so the time to issue there follows the GPU's): while it
    stays below "op b2b" the host runs ahead.
  - op, CUDA graph: forward + backward captured once (torch.cuda.graph) and replayed, the median
    of --reps replays: the op without the host (torch.compile's "reduce-overhead" situation).
  - with --profile: torch.profiler over one back-to-back window, every GPU kernel's time per pass
    (what the op launches beyond the C++ benchmark's kernels shows there); with --host-profile,
    the host's own CPU time per pass by operator (passes issued on an idle GPU).
  - SDPA: bench/dense_attention.py's timing (K/V repeated to H heads) with the cuDNN and the flash
    backends, the faster of the two.
Prints a table (overhead % = op / C++ − 1) and, with --json, one JSON line per row.

  python3 bench/pytorch_op.py --nsa-binary build/nsa [--configs m7c_125m,paper_attn]
      [--seq-lens 16384] [--reps 20] [--windows 5] [--profile] [--host-profile] [--json out.jsonl]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))
import nsa  # noqa: E402
from dense_attention import time_one as sdpa_time  # noqa: E402

SHAPES = {  # H, G, dk, dv, l, d, l_sel, n_sel, w (configs/*.yaml, src/core/presets.cpp)
    "tiny": (4, 2, 16, 16, 16, 8, 32, 4, 64),
    "small": (8, 2, 32, 32, 16, 8, 32, 8, 256),
    "m7c_125m": (12, 2, 64, 64, 32, 16, 64, 16, 512),
    "paper_attn": (64, 4, 192, 128, 32, 16, 64, 16, 512),
}


def cpp_times(binary, config, S, reps):
    """(fwd_ms, bwd_ms, graph_ms) of `nsa bench attention --device cuda` for one shape (graph_ms:
    forward + backward replayed from CUDA graphs; None from a build that did not time them)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "nsa.jsonl")
        subprocess.run([binary, "bench", "attention", "--device", "cuda", "--config", config,
                        "--seq-lens", str(S), "--reps", str(reps), "--json", out], check=True,
                       stdout=subprocess.DEVNULL)
        rec = json.loads(Path(out).read_text().splitlines()[0])
    return rec["fwd_ms"], rec["bwd_ms"], rec.get("graph_ms")


def cpp_times_from_files(paths):
    """{(config, S): (fwd_ms, bwd_ms, graph_ms)} from `nsa bench attention --json` files."""
    out = {}
    for p in paths:
        for line in Path(p).read_text().splitlines():
            rec = json.loads(line)
            if rec.get("device") == "cuda":
                out[(rec["config"], rec["S"])] = (rec["fwd_ms"], rec["bwd_ms"], rec.get("graph_ms"))
    return out


def op_inputs(config, S):
    """Random bf16 inputs of nsa.attention (separate K/V, sigmoid gates) that require grad."""
    H, G, dk, dv, *_ = SHAPES[config]
    dev, bf = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(1234)
    rnd = lambda *s: torch.randn(*s, device=dev, generator=gen).to(bf).requires_grad_()
    x = {"q": rnd(S, H, dk)}
    for c in ("cmp", "sel", "win"):
        x["k_" + c], x["v_" + c] = rnd(S, G, dk), rnd(S, G, dv)
    for c in ("cmp", "sel", "win"):
        x["g_" + c] = torch.sigmoid(torch.randn(S, H, device=dev, generator=gen)).to(
            bf).requires_grad_()
    d_o = torch.randn(S, H, dv, device=dev, generator=gen).to(bf)
    return x, d_o


def op_times(config, S, reps, windows, profile, host_profile=False):
    """(fwd_ms, bwd_ms) per call (events, median) and the back-to-back time per pass (the median
    of `windows` windows of `reps` passes)."""
    _, _, _, _, l, d, l_sel, n_sel, w = SHAPES[config]
    hp = dict(l=l, d=d, l_sel=l_sel, n_sel=n_sel, w=w)
    x, d_o = op_inputs(config, S)
    leaves = list(x.values())

    def fwd():
        args = dict(x)
        return nsa.attention(args.pop("q"), args.pop("k_cmp"), args.pop("v_cmp"), **args, **hp)

    def bwd(o):
        return torch.autograd.grad(o, leaves, d_o)

    for _ in range(3):  # warm-up: module load, the caching allocator's pools, workspace sizes
        bwd(fwd())
    torch.cuda.synchronize()
    f_ms, b_ms, hosts = [], [], []
    for _ in range(reps):
        e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        e0.record()
        t0 = time.perf_counter()
        o = fwd()
        e1.record()
        bwd(o)
        e2.record()
        hosts.append((time.perf_counter() - t0) * 1e3)  # issue only, on an empty launch queue
        torch.cuda.synchronize()
        f_ms.append(e0.elapsed_time(e1))
        b_ms.append(e1.elapsed_time(e2))
    del o
    loops = []
    for _ in range(windows):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            bwd(fwd())
        b.record()
        torch.cuda.synchronize()
        loops.append(a.elapsed_time(b) / reps)
    if profile:
        print_profile(lambda: bwd(fwd()), reps, "%s S=%d" % (config, S))
    if host_profile:
        print_profile(lambda: bwd(fwd()), reps, "%s S=%d" % (config, S), host=True)
    return (statistics.median(f_ms), statistics.median(b_ms), statistics.median(loops),
            statistics.median(hosts), graph_ms(fwd, bwd, reps))


def graph_ms(fwd, bwd, reps):
    """Forward + backward captured once into a CUDA graph and replayed: the median of `reps`
    replays (what torch.compile's "reduce-overhead" mode or a hand-captured training step gets:
    no host time, no launch gaps)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph wants
        for _ in range(2):
            bwd(fwd())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        bwd(fwd())
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    del graph
    return statistics.median(times)


def print_profile(step, reps, title, host=False):
    """torch.profiler over `reps` passes, per pass and by name: the GPU kernels' time of back-to-back
    passes, or (host) the host's own CPU time of each operator, each pass issued on an idle GPU –
    where the op's host time goes."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU if host else ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            step()
            if host:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
    time_of = (lambda e: e.self_cpu_time_total) if host else (lambda e: e.device_time_total)
    rows = [(time_of(e) / reps, e.count / reps, e.key) for e in prof.key_averages()
            if time_of(e) > 0]
    rows.sort(reverse=True)
    print("%s per pass, %s (µs, calls per pass, name):"
          % ("host CPU time by operator" if host else "GPU kernels", title))
    for us, n, name in rows[:25] if host else rows:
        print("  %9.1f %6.1f  %s" % (us, n, name[:110]))
    print("  %9.1f         total" % sum(r[0] for r in rows))


def sdpa_best(config, S, reps):
    """(total ms, backend) of the faster of SDPA's cuDNN and flash backends (None if neither)."""
    H, G, dk, dv, *_ = SHAPES[config]
    best = None
    for backend in ("cudnn", "flash"):
        try:
            f, b, _ = sdpa_time(H, G, dk, dv, S, backend, reps)
        except RuntimeError as e:  # a backend that does not take the shape (flash: dk != dv)
            print("  (SDPA %s at %s S=%d: %s)" % (backend, config, S, str(e).splitlines()[0][:100]))
            continue
        if best is None or f + b < best[0]:
            best = (f + b, backend)
        torch.cuda.empty_cache()
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="m7c_125m,paper_attn")
    ap.add_argument("--seq-lens", default="16384")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--windows", type=int, default=5, help="back-to-back windows (median)")
    ap.add_argument("--profile", action="store_true", help="print the GPU kernels per pass")
    ap.add_argument("--host-profile", action="store_true",
                    help="print the host's time per pass by operator (torch.profiler, CPU)")
    ap.add_argument("--nsa-binary", help="the nsa binary to run `nsa bench attention` with")
    ap.add_argument("--cpp-json", nargs="*", default=[],
                    help="or: files of `nsa bench attention --device cuda --json` lines")
    ap.add_argument("--json", help="also write one JSON line per row to this file")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("pytorch_op.py: needs a CUDA device")
    given = cpp_times_from_files(a.cpp_json)
    rows = []
    for config in a.configs.split(","):
        if config not in SHAPES:
            sys.exit("pytorch_op.py: unknown config '%s'; known: %s" % (config, ", ".join(SHAPES)))
        for S in (int(s) for s in a.seq_lens.split(",")):
            if (config, S) in given:
                cf, cb, cg = given[(config, S)]
            elif a.nsa_binary:
                cf, cb, cg = cpp_times(a.nsa_binary, config, S, a.reps)
            else:
                sys.exit("pytorch_op.py: no C++ numbers for %s S=%d: pass --nsa-binary or "
                         "--cpp-json" % (config, S))
            of, ob, loop, host, graph = op_times(config, S, a.reps, a.windows, a.profile,
                                                 a.host_profile)
            torch.cuda.empty_cache()
            sdpa = sdpa_best(config, S, a.reps)
            rows.append(dict(bench="pytorch_op", config=config, S=S, cpp_fwd_ms=cf, cpp_bwd_ms=cb,
                             cpp_graph_ms=cg,
                             op_fwd_ms=of, op_bwd_ms=ob, op_loop_ms=loop, op_host_ms=host,
                             op_graph_ms=graph,
                             sdpa_ms=sdpa[0] if sdpa else None,
                             sdpa_backend=sdpa[1] if sdpa else None,
                             device=torch.cuda.get_device_name(),
                             torch=torch.__version__))
    head = ("config", "S", "C++ fwd", "C++ bwd", "C++ total", "op fwd", "op bwd", "op total",
            "overhead", "op b2b", "overhead", "op host", "C++ graph", "op graph", "overhead",
            "SDPA", "backend", "op/SDPA")
    print(("%-11s %6s" + " %9s" * 14 + " %8s %8s") % head)
    for r in rows:
        cpp, op = r["cpp_fwd_ms"] + r["cpp_bwd_ms"], r["op_fwd_ms"] + r["op_bwd_ms"]
        sd = r["sdpa_ms"]
        cg = r["cpp_graph_ms"]
        print(("%-11s %6d" + " %9.3f" * 6 + " %8.1f%% %9.3f %8.1f%% %9.3f %9s %9.3f %8s %9s"
               " %8s %8s")
              % (r["config"], r["S"], r["cpp_fwd_ms"], r["cpp_bwd_ms"], cpp, r["op_fwd_ms"],
                 r["op_bwd_ms"], op, 100 * (op / cpp - 1), r["op_loop_ms"],
                 100 * (r["op_loop_ms"] / cpp - 1), r["op_host_ms"], "%.3f" % cg if cg else "-",
                 r["op_graph_ms"], "%.1f%%" % (100 * (r["op_graph_ms"] / cg - 1)) if cg else "-",
                 "%.3f" % sd if sd else "-",
                 r["sdpa_backend"] or "-", "%.2fx" % (op / sd) if sd else "-"))
    print("(ms; overhead = op / C++ − 1; op b2b = forward + backward passes back to back; "
          "op host = the host's time to issue one of them (empty launch queue); "
          "op graph = forward + backward replayed from a CUDA graph, its overhead against C++ "
          "graph (nsa bench attention's replay); "
          "op/SDPA > 1: the op is slower than dense)")
    if a.json:
        with open(a.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
