"""nsa.attention: NSA attention for PyTorch over the C++ CPU reference and the CUDA kernels.

The math is not here. CPU tensors go to the reference through the C ABI (src/capi/nsa_capi.h) –
what `nsa attention` runs, so results are bitwise those of the CLI – under NsaAttentionFunction, a
torch.autograd.Function. CUDA tensors go to the Hopper kernels through the C ABI's CUDA entry
points as custom ops (nsa/_cuda.py). This file checks the arguments (naming them), shapes tensors
into the C ABI's 20 slots, and dispatches on q's device.
"""
import ctypes

import torch

from . import _capi
from ._capi import NsaError

BRANCHES = ("cmp", "sel", "win")
PHI_FIELDS = ("pos", "w1", "b1", "w2", "b2")
# Slots of the flat tensor list the Function takes: q, k×3, v×3, g×3, phi_k×5, phi_v×5.
_K, _V, _G, _PHI_K, _PHI_V = 1, 4, 7, 10, 15
NUM_SLOTS = 20


# The config as plain ints (what the CUDA custom ops take) in this order; attn_config makes the
# C ABI's struct of it.
CFG_FIELDS = ("heads", "groups", "dk", "dv", "l", "d", "l_sel", "n_sel", "w", "phi_hidden",
              "phi", "kv")


def _config(q, k, v, phi_k, n_sel, l, d, l_sel, w, shared, mlp):
    hidden = phi_k[1].shape[-1] if mlp and phi_k[1].dim() else 0  # w1 [l·dk, Hd]
    return [q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1], l, d, l_sel, n_sel, w, hidden,
            int(mlp), int(shared)]


def attn_config(cfg, scale):
    """The C ABI's NsaAttnConfig of a config list (CFG_FIELDS) and a scale (None or 0: default)."""
    c = _capi.AttnConfig()
    for name, value in zip(CFG_FIELDS, cfg):
        setattr(c, name, int(value))
    c.scale = 0.0 if scale is None else float(scale)
    return c


def refs(cls, tensors, device="cpu"):
    """An AttnTensors (or gradient set) from the 20 slots; None → absent."""
    s = cls()
    _capi.fill(s.q, tensors[0], device)
    for c in range(3):
        _capi.fill(s.k[c], tensors[_K + c], device)
        _capi.fill(s.v[c], tensors[_V + c], device)
        _capi.fill(s.g[c], tensors[_G + c], device)
    for i in range(5):
        _capi.fill(s.phi_k[i], tensors[_PHI_K + i], device)
        _capi.fill(s.phi_v[i], tensors[_PHI_V + i], device)
    return s


def saved_refs(o, o_br, lse, k_cmp, v_cmp, sel_idx, device="cpu"):
    """An AttnSaved of the forward's outputs (o may be None where the backward does not read it)."""
    s = _capi.AttnSaved()
    for r, t in ((s.o, o), (s.k_cmp, k_cmp), (s.v_cmp, v_cmp), (s.sel_idx, sel_idx)):
        _capi.fill(r, t, device)
    for c in range(3):
        _capi.fill(s.o_branch[c], o_br[c], device)
        _capi.fill(s.lse[c], lse[c], device)
    return s


def _cu_ptr(cu):
    return ctypes.cast(cu.data_ptr(), ctypes.POINTER(ctypes.c_int64))


def cpu_forward(cfg, cu, xs, sel_idx=None):
    """The reference's forward on the 20 slots: (o, o_branch[3], lse[3], k_cmp, v_cmp, sel_idx).
    sel_idx (int32 [T, G, n_sel]): use these selected blocks instead of choosing (tests compare
    backends on identical selections with it)."""
    T, H, G = xs[0].shape[0], cfg.heads, cfg.groups
    n = cu.numel() - 1
    C = ctypes.c_int64()
    _capi.call(_capi.LIB.nsa_compressed_tokens, ctypes.byref(cfg), _cu_ptr(cu), n, ctypes.byref(C))
    new = lambda *shape: torch.empty(shape, dtype=xs[0].dtype)
    o, o_br, lse = new(T, H, cfg.dv), [new(T, H, cfg.dv) for _ in BRANCHES], [
        new(T, H) for _ in BRANCHES]
    k_cmp, v_cmp = new(C.value, G, cfg.dk), new(C.value, G, cfg.dv)
    sel_out = torch.empty(T, G, cfg.n_sel, dtype=torch.int32)
    saved = saved_refs(o, o_br, lse, k_cmp, v_cmp, sel_out)
    args = [ctypes.byref(cfg), _capi.dtype_code(xs[0].dtype), _cu_ptr(cu), n,
            ctypes.byref(refs(_capi.AttnTensors, xs))]
    if sel_idx is None:
        _capi.call(_capi.LIB.nsa_attention_forward_cpu, *args, ctypes.byref(saved))
    else:
        given = sel_idx.to(torch.int32).contiguous()
        _capi.call(_capi.LIB.nsa_attention_forward_cpu_given_selection, *args,
                   ctypes.byref(_capi.ref(given)), ctypes.byref(saved))
    return o, o_br, lse, k_cmp, v_cmp, sel_out


def cpu_backward(cfg, cu, xs, o, o_br, lse, k_cmp, v_cmp, sel_idx, d_o, needs=None):
    """The reference's backward: the gradient of every slot (None where absent or not needed)."""
    needs = needs or [True] * NUM_SLOTS
    grads = [torch.empty_like(x) if x is not None and need else None for x, need in zip(xs, needs)]
    saved = saved_refs(o, o_br, lse, k_cmp, v_cmp, sel_idx)
    _capi.call(_capi.LIB.nsa_attention_backward_cpu, ctypes.byref(cfg), _capi.dtype_code(o.dtype),
               _cu_ptr(cu), cu.numel() - 1, ctypes.byref(refs(_capi.AttnTensors, xs)),
               ctypes.byref(saved), ctypes.byref(_capi.ref(d_o.contiguous())),
               ctypes.byref(refs(_capi.AttnTensors, grads)))
    return grads


class NsaAttentionFunction(torch.autograd.Function):
    """CPU: inputs cfg (AttnConfig), cu_seqlens (int64 CPU tensor), then the slots above, each
    [T, ...] contiguous or None. Outputs: o [T, H, dv] and sel_idx [T, G, n_sel] (int32, no
    gradient)."""

    @staticmethod
    def forward(ctx, cfg, cu, *xs):
        o, o_br, lse, k_cmp, v_cmp, sel_idx = cpu_forward(cfg, cu, xs)
        ctx.cfg = cfg
        ctx.save_for_backward(cu, o, *o_br, *lse, k_cmp, v_cmp, sel_idx, *xs)
        ctx.mark_non_differentiable(sel_idx)
        return o, sel_idx

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_o, _d_sel):
        cu, o, *rest = ctx.saved_tensors
        o_br, lse, (k_cmp, v_cmp, sel_idx), xs = rest[0:3], rest[3:6], rest[6:9], rest[9:]
        grads = cpu_backward(ctx.cfg, cu, xs, o, o_br, lse, k_cmp, v_cmp, sel_idx, d_o,
                             ctx.needs_input_grad[2:])
        return (None, None, *grads)


def _check_tensor(name, t, device, dtypes, ndim, why):
    if not isinstance(t, torch.Tensor):
        raise NsaError("'%s' must be a torch.Tensor, got %s" % (name, type(t).__name__))
    if t.device != device:
        raise NsaError("'%s' is on %s, q on %s: every tensor must be on q's device"
                       % (name, t.device, device))
    if t.dtype not in dtypes:
        raise NsaError("'%s' has dtype %s, expected %s (%s)"
                       % (name, t.dtype, " or ".join(str(d) for d in dtypes), why))
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


def _dtype_rules(q):
    """(dtypes of q, K/V and gates; dtypes of the φ parameters; why) for q's device."""
    if q.device.type == "cpu":
        if q.dtype not in (torch.float32, torch.float64):
            raise NsaError("'q' has dtype %s; NSA attention on the CPU takes float32 or float64"
                           % q.dtype)
        return (q.dtype,), (q.dtype,), "the dtype of q; float32 or float64 on the CPU"
    if q.device.type == "cuda":
        if q.dtype not in (torch.bfloat16, torch.float32):
            raise NsaError("'q' has dtype %s; NSA attention on CUDA takes bfloat16 (the kernels' "
                           "input type) or float32 (rounded to bfloat16 first)" % q.dtype)
        return ((q.dtype,), (q.dtype, torch.float32),
                "the dtype of q; on CUDA bfloat16 or float32, φ parameters also float32")
    raise NsaError("'q' is on %s; NSA attention runs on the CPU or on CUDA" % q.device)


def _cpu_cu_seqlens(cu_seqlens, T, B, S):
    if cu_seqlens is None:
        return torch.arange(0, T + 1, S, dtype=torch.int64)
    cu = torch.as_tensor(cu_seqlens).to(device="cpu", dtype=torch.int64).contiguous()
    if cu.dim() != 1:
        raise NsaError("'cu_seqlens' must be 1-D [N + 1], got shape %s" % list(cu.shape))
    return cu


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

    CPU tensors (float32 / float64) run the C++ reference; CUDA tensors (bfloat16, or float32
    rounded to bfloat16) the Hopper kernels on the current stream, with cu_seqlens best on the
    same device (then nothing synchronises with the host).
    """
    if not isinstance(q, torch.Tensor) or q.dim() not in (3, 4):
        raise NsaError("'q' must be a tensor [B, S, H, dk] or [T, H, dk]")
    batched = q.dim() == 4
    dtypes, phi_dtypes, why = _dtype_rules(q)
    separate = (k_sel, v_sel, k_win, v_win)
    if kv is None:
        kv = "shared" if all([t is None for t in separate]) else "separate"
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
    for name, t, ndim in named:
        _check_tensor(name, t, q.device, dtypes, ndim, why)
    for name, t, ndim in phis:
        _check_tensor(name, t, q.device, phi_dtypes, ndim, why)

    B, S = (q.shape[0], q.shape[1]) if batched else (1, q.shape[0])
    T = B * S
    for name, t, _ in named[1:]:
        if t.shape[: q.dim() - 2] != q.shape[: q.dim() - 2]:
            raise NsaError("'%s' has shape %s: its token dims must match q's %s"
                           % (name, list(t.shape), list(q.shape[: q.dim() - 2])))
    if cu_seqlens is not None and batched and B != 1:
        raise NsaError("cu_seqlens packs documents along the token dim: q's batch dim must "
                       "be 1, got %d" % B)
    # [T, ...] inputs pass as they are: a reshape to the same shape would still add a view node
    # to the autograd graph (and its backward a reshape) – host time of the op.
    flat = lambda t: (t.reshape(T, *t.shape[q.dim() - 2:]) if batched else t).contiguous()
    ks = [k_cmp] * 3 if shared else [k_cmp, k_sel, k_win]
    vs = [v_cmp] * 3 if shared else [v_cmp, v_sel, v_win]
    slots = [flat(q)]
    slots += [flat(ks[c]) if not (shared and c) else None for c in range(3)]
    slots += [flat(vs[c]) if not (shared and c) else None for c in range(3)]
    slots += [flat(g) for g in gates]
    slots += [t.contiguous() for _, t, _ in phis] if mlp else [None] * 10
    cfg = _config(q, k_cmp, v_cmp, [t for _, t, _ in phis[:5]], n_sel, l, d, l_sel, w, shared,
                  mlp)
    scale = 0.0 if scale is None else float(scale)
    if q.device.type == "cuda":
        o, sel_idx = _cuda.attention(cfg, scale, slots, cu_seqlens,
                                     B if cu_seqlens is None else None)
    else:
        cu = _cpu_cu_seqlens(cu_seqlens, T, B, S)
        o, sel_idx = NsaAttentionFunction.apply(attn_config(cfg, scale), cu, *slots)
    lead = q.shape[:-2]
    H, G, _, dv = cfg[:4]
    if batched:
        o = o.reshape(*lead, H, dv)
    if return_sel_idx:
        return o, sel_idx.reshape(*lead, G, cfg[CFG_FIELDS.index("n_sel")])
    return o


# The CUDA custom ops (they use the helpers above, so they come last).
from . import _cuda  # noqa: E402
