"""Test set-up: the package from this checkout, the CLI binary, small random NSA problems.

ctest passes NSA_CAPI_LIB (the library) and NSA_BINARY (the `nsa` CLI); without them the
repository's build/ or build-cpu/ folders are used.
"""
import os
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))


def nsa_binary():
    env = os.environ.get("NSA_BINARY")
    if env:
        return env
    for b in ("build", "build-cpu"):
        if (REPO / b / "nsa").is_file():
            return str(REPO / b / "nsa")
    pytest.fail("the nsa binary was not found: build it (cmake --build build) or set NSA_BINARY")


def random_problem(T, H, G, dk, dv, *, shared=False, mlp=False, hidden=None, l=4,
                   dtype=torch.float64, seed=0, lead=None):
    """Inputs of nsa.attention as a dict of keyword arguments (tensors only): q, k/v per branch
    (or k_cmp/v_cmp alone when shared), sigmoid gates, φ = mlp parameters."""
    g = torch.Generator().manual_seed(seed)
    lead = list(lead) if lead is not None else [T]
    rnd = lambda *s, std=1.0: (torch.randn(*s, generator=g, dtype=dtype) * std)
    x = {"q": rnd(*lead, H, dk)}
    for c in ("cmp",) if shared else ("cmp", "sel", "win"):
        x["k_" + c], x["v_" + c] = rnd(*lead, G, dk), rnd(*lead, G, dv)
    for c in ("cmp", "sel", "win"):
        x["g_" + c] = torch.sigmoid(rnd(*lead, H))
    if mlp:
        hid = hidden or dk
        for name, D in (("phi_k", dk), ("phi_v", dv)):
            x[name] = {"pos": rnd(l, D, std=0.1), "w1": rnd(l * D, hid, std=(l * D) ** -0.5),
                       "b1": rnd(hid, std=0.1), "w2": rnd(hid, D, std=hid ** -0.5),
                       "b2": rnd(D, std=0.1)}
    return x


def leaves(x):
    """Every tensor of a random_problem dict, in a fixed order (with the φ dicts flattened)."""
    out = []
    for v in x.values():
        out += list(v.values()) if isinstance(v, dict) else [v]
    return out
