"""nsa.attention: NSA attention as a torch.autograd.Function over the C++ CPU reference.

The math is not here: forward and backward call the reference through the C ABI
(src/capi/nsa_capi.h), which is also what `nsa attention` runs, so results are bitwise those of
the CLI. This file only shapes tensors, checks what Python can name better, and keeps the
forward's outputs for the backward (the library holds no state between calls).
"""
import ctypes

import torch

from . import _capi
from ._capi import NsaError

BRANCHES = ("cmp", "sel", "win")
PHI_FIELDS = ("pos", "w1", "b1", "w2", "b2")
# Slots of the flat tensor list the Function takes: q, k×3, v×3, g×3, phi_k×5, phi_v×5.
_K, _V, _G, _PHI_K, _PHI_V = 1, 4, 7, 10, 15


def _config(q, k, v, phi_k, n_sel, l, d, l_sel, w, scale, shared, mlp):
    c = _capi.AttnConfig()
    c.heads, c.dk = q.shape[-2], q.shape[-1]
    c.groups, c.dv = k.shape[-2], v.shape[-1]
    c.l, c.d, c.l_sel, c.n_sel, c.w = l, d, l_sel, n_sel, w
    c.phi_hidden = phi_k[1].shape[-1] if mlp and phi_k[1].dim() else 0  # w1 [l·dk, Hd]
    c.scale = 0.0 if scale is None else float(scale)
    c.phi, c.kv = int(mlp), int(shared)
    return c


def _refs(cls, tensors):
    """An AttnTensors (or gradient set) from the 20 slots; None → absent."""
    s = cls()
    s.q = _capi.ref(tensors[0])
    for c in range(3):
        s.k[c] = _capi.ref(tensors[_K + c])
        s.v[c] = _capi.ref(tensors[_V + c])
        s.g[c] = _capi.ref(tensors[_G + c])
    for i in range(5):
        s.phi_k[i] = _capi.ref(tensors[_PHI_K + i])
        s.phi_v[i] = _capi.ref(tensors[_PHI_V + i])
    return s


class NsaAttentionFunction(torch.autograd.Function):
    """Inputs: cfg (AttnConfig), cu_seqlens (int64 CPU tensor), then the slots above, each [T, ...]
    contiguous or None. Outputs: o [T, H, dv] and sel_idx [T, G, n_sel] (int32, no gradient)."""

    @staticmethod
    def forward(ctx, cfg, cu, *xs):
        T, H, G = xs[0].shape[0], cfg.heads, cfg.groups
        cu_ptr = ctypes.cast(cu.data_ptr(), ctypes.POINTER(ctypes.c_int64))
        n = cu.numel() - 1
        C = ctypes.c_int64()
        _capi.call(_capi.LIB.nsa_compressed_tokens, ctypes.byref(cfg), cu_ptr, n, ctypes.byref(C))
        new = lambda *shape: torch.empty(shape, dtype=xs[0].dtype)
        o, o_br, lse = new(T, H, cfg.dv), [new(T, H, cfg.dv) for _ in BRANCHES], [
            new(T, H) for _ in BRANCHES]
        k_cmp, v_cmp = new(C.value, G, cfg.dk), new(C.value, G, cfg.dv)
        sel_idx = torch.empty(T, G, cfg.n_sel, dtype=torch.int32)
        saved = _saved(o, o_br, lse, k_cmp, v_cmp, sel_idx)
        _capi.call(_capi.LIB.nsa_attention_forward_cpu, ctypes.byref(cfg),
                   _capi.dtype_code(xs[0].dtype), cu_ptr, n,
                   ctypes.byref(_refs(_capi.AttnTensors, xs)), ctypes.byref(saved))
        ctx.cfg = cfg
        ctx.save_for_backward(cu, o, *o_br, *lse, k_cmp, v_cmp, sel_idx, *xs)
        ctx.mark_non_differentiable(sel_idx)
        return o, sel_idx

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_o, _d_sel):
        cu, o, *rest = ctx.saved_tensors
        o_br, lse, (k_cmp, v_cmp, sel_idx), xs = rest[0:3], rest[3:6], rest[6:9], rest[9:]
        grads = [torch.empty_like(x) if x is not None and need else None
                 for x, need in zip(xs, ctx.needs_input_grad[2:])]
        d_o = d_o.contiguous()
        saved = _saved(o, o_br, lse, k_cmp, v_cmp, sel_idx)
        cu_ptr = ctypes.cast(cu.data_ptr(), ctypes.POINTER(ctypes.c_int64))
        _capi.call(_capi.LIB.nsa_attention_backward_cpu, ctypes.byref(ctx.cfg),
                   _capi.dtype_code(o.dtype), cu_ptr, cu.numel() - 1,
                   ctypes.byref(_refs(_capi.AttnTensors, xs)), ctypes.byref(saved),
                   ctypes.byref(_capi.ref(d_o)), ctypes.byref(_refs(_capi.AttnTensors, grads)))
        return (None, None, *grads)


def _saved(o, o_br, lse, k_cmp, v_cmp, sel_idx):
    s = _capi.AttnSaved()
    s.o, s.k_cmp, s.v_cmp, s.sel_idx = (_capi.ref(t) for t in (o, k_cmp, v_cmp, sel_idx))
    for c in range(3):
        s.o_branch[c], s.lse[c] = _capi.ref(o_br[c]), _capi.ref(lse[c])
    return s


def _check_tensor(name, t, dtype, ndim):
    if not isinstance(t, torch.Tensor):
        raise NsaError("'%s' must be a torch.Tensor, got %s" % (name, type(t).__name__))
    if t.device.type != "cpu":
        raise NsaError("'%s' is on %s; this build runs NSA attention on the CPU only"
                       % (name, t.device))
    if t.dtype != dtype:
        raise NsaError("'%s' has dtype %s, expected %s (the dtype of q; float32 or float64)"
                       % (name, t.dtype, dtype))
    if ndim is not None and t.dim() != ndim:
        raise NsaError("'%s' has %d dimensions %s, expected %d"
                       % (name, t.dim(), list(t.shape), ndim))


def _phi_list(name, p):
    if isinstance(p, dict):
        missing = [f for f in PHI_FIELDS if f not in p]
        if missing:
            raise NsaError("'%s' lacks %s (needs %s)" % (name, missing, ", ".join(PHI_FIELDS)))
        return [p[f] for f in PHI_FIELDS]
    if p is None or len(p) != 5:
        raise NsaError("'%s' must hold the 5 tensors %s for phi = mlp"
                       % (name, ", ".join(PHI_FIELDS)))
    return list(p)


def attention(q, k_cmp, v_cmp, k_sel=None, v_sel=None, k_win=None, v_win=None, g_cmp=None,
              g_sel=None, g_win=None, cu_seqlens=None, *, l, d, l_sel, n_sel, w, scale=None,
              kv=None, phi=None, phi_k=None, phi_v=None, return_sel_idx=False):
    """NSA attention (docs/nsa.md, docs/pytorch.md), differentiable in every floating input.

    q [B, S, H, dk] (or packed [T, H, dk]); k_* [.., G, dk], v_* [.., G, dv]; g_* [.., H] gate
    values. kv = "shared" (the default when k_sel, v_sel, k_win, v_win are all None) reads k_cmp
    and v_cmp as the one K/V of all branches. phi = "mlp" (the default when phi_k is given) takes
    phi_k / phi_v as (pos, w1, b1, w2, b2) or a dict of those names. cu_seqlens [N + 1] packs
    documents along the token dim (B must be 1). Returns o [.., H, dv], and with return_sel_idx
    also sel_idx [.., G, n_sel] (int32, ascending, -1 padded).
    """
    if not isinstance(q, torch.Tensor) or q.dim() not in (3, 4):
        raise NsaError("'q' must be a tensor [B, S, H, dk] or [T, H, dk]")
    dtype, batched = q.dtype, q.dim() == 4
    if dtype not in (torch.float32, torch.float64):
        raise NsaError("'q' has dtype %s; NSA attention takes float32 or float64" % dtype)
    separate = (k_sel, v_sel, k_win, v_win)
    if kv is None:
        kv = "shared" if all(t is None for t in separate) else "separate"
    if kv not in ("separate", "shared"):
        raise NsaError("kv = %r must be 'separate' or 'shared'" % (kv,))
    shared = kv == "shared"
    if phi is None:
        phi = "mlp" if phi_k is not None else "avg"
    if phi not in ("avg", "mlp"):
        raise NsaError("phi = %r must be 'avg' or 'mlp'" % (phi,))
    mlp = phi == "mlp"
    kname = ("k", "v") if shared else ("k_cmp", "v_cmp")
    named = [("q", q, q.dim()), (kname[0], k_cmp, q.dim()), (kname[1], v_cmp, q.dim())]
    if shared:
        for name, t in zip(("k_sel", "v_sel", "k_win", "v_win"), separate):
            if t is not None:
                raise NsaError("'%s' must be None with kv = 'shared'" % name)
    else:
        named += [(n, t, q.dim()) for n, t in zip(("k_sel", "v_sel", "k_win", "v_win"), separate)]
    gates = (g_cmp, g_sel, g_win)
    named += [(n, t, q.dim() - 1) for n, t in zip(("g_cmp", "g_sel", "g_win"), gates)]
    phis = []
    if mlp:
        for pname, p in (("phi_k", phi_k), ("phi_v", phi_v)):
            phis += [("%s_%s" % (pname, f), t, None)
                     for f, t in zip(PHI_FIELDS, _phi_list(pname, p))]
    elif phi_k is not None or phi_v is not None:
        raise NsaError("phi_k / phi_v are given but phi = 'avg'")
    for name, t, ndim in named + phis:
        _check_tensor(name, t, dtype, ndim)

    B, S = (q.shape[0], q.shape[1]) if batched else (1, q.shape[0])
    T = B * S
    for name, t, _ in named[1:]:
        if t.shape[: q.dim() - 2] != q.shape[: q.dim() - 2]:
            raise NsaError("'%s' has shape %s: its token dims must match q's %s"
                           % (name, list(t.shape), list(q.shape[: q.dim() - 2])))
    if cu_seqlens is None:
        cu = torch.arange(0, T + 1, S, dtype=torch.int64)
    else:
        if batched and B != 1:
            raise NsaError("cu_seqlens packs documents along the token dim: q's batch dim must "
                           "be 1, got %d" % B)
        cu = torch.as_tensor(cu_seqlens).to(device="cpu", dtype=torch.int64).contiguous()
        if cu.dim() != 1:
            raise NsaError("'cu_seqlens' must be 1-D [N + 1], got shape %s" % list(cu.shape))
    flat = lambda t: t.reshape(T, *t.shape[q.dim() - 2:]).contiguous()
    ks = [k_cmp] * 3 if shared else [k_cmp, k_sel, k_win]
    vs = [v_cmp] * 3 if shared else [v_cmp, v_sel, v_win]
    slots = [flat(q)]
    slots += [flat(ks[c]) if not (shared and c) else None for c in range(3)]
    slots += [flat(vs[c]) if not (shared and c) else None for c in range(3)]
    slots += [flat(g) for g in gates]
    slots += [t.contiguous() for _, t, _ in phis] if mlp else [None] * 10
    cfg = _config(q, k_cmp, v_cmp, [t for _, t, _ in phis[:5]], n_sel, l, d, l_sel, w, scale,
                  shared, mlp)
    o, sel_idx = NsaAttentionFunction.apply(cfg, cu, *slots)
    lead = q.shape[:-2]
    o = o.reshape(*lead, cfg.heads, cfg.dv)
    if return_sel_idx:
        return o, sel_idx.reshape(*lead, cfg.groups, cfg.n_sel)
    return o
