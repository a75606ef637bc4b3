"""Trains a small NSA language model in plain PyTorch with nsa.attention, on the CPU.

The task is copying: each row's second half repeats its first, which a model can only learn by
attending far back (the `repeat` source of `nsa train`). The loss falls from ln(vocab) toward
half of it (the first half is random and unpredictable) within a few hundred steps.

    python3 python/examples/train_tiny.py [--steps 300] [--phi mlp] [--kv shared]
"""
import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import nsa  # noqa: E402


def copy_batch(batch, seq_len, vocab, gen):
    half = (seq_len + 2) // 2
    first = torch.randint(0, vocab, (batch, half), generator=gen)
    rows = torch.cat([first, first], dim=1)[:, : seq_len + 1]
    return rows[:, :-1], rows[:, 1:]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--phi", default="avg", choices=["avg", "mlp"])
    p.add_argument("--kv", default="separate", choices=["separate", "shared"])
    a = p.parse_args()
    torch.manual_seed(0)
    cfg = nsa.ModelConfig(vocab_size=32, dim=64, n_layers=2, seq_len=a.seq_len, heads=4, groups=2,
                          dk=16, dv=16, l=8, d=4, l_sel=8, n_sel=4, w=8, phi=a.phi, kv=a.kv)
    model = nsa.Transformer(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    # Linear warm-up over 20 steps, then a cosine down to a tenth of the peak.
    cosine = lambda s: 0.1 + 0.45 * (1 + math.cos(math.pi * s / a.steps))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * cosine(s))
    gen = torch.Generator().manual_seed(1)
    print("%d parameters; chance loss ln(%d) = %.3f, a perfect copier reaches about %.3f"
          % (sum(t.numel() for t in model.parameters()), cfg.vocab_size, math.log(cfg.vocab_size),
             math.log(cfg.vocab_size) * (a.seq_len // 2) / a.seq_len))
    t0 = time.time()
    for step in range(a.steps):
        x, y = copy_batch(a.batch, a.seq_len, cfg.vocab_size, gen)
        loss = model.loss(x, y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 25 == 0 or step == a.steps - 1:
            print("step %4d  loss %.4f  (%.1f s)" % (step, loss.item(), time.time() - t0),
                  flush=True)


if __name__ == "__main__":
    main()
