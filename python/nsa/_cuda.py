"""nsa.attention on CUDA tensors: the C ABI's CUDA entry points (src/capi/nsa_capi.h) as PyTorch
custom ops.

Two ops, `nsa::attention_fwd` and `nsa::attention_bwd`, each one call into the library with device
pointers on the current CUDA stream: the inputs are passed as they are (no copies beyond a float32
→ bfloat16 cast the caller asked for), the outputs are allocated here, and the library's scratch is
a workspace tensor from PyTorch's caching allocator – so nothing inside allocates, frees or waits
for the host, and a forward + backward can be captured into a CUDA graph. With
torch.library.custom_op (PyTorch ≥ 2.4) they carry fake implementations and an autograd formula,
so torch.compile keeps them opaque; eagerly (and on an older PyTorch) the same two functions run
under a torch.autograd.Function, without the dispatcher's Python round trips.

Op arguments: xs, the present slots of ops.py's 20 (q, k×3, v×3, g×3, φ_k×5, φ_v×5: shared K/V
drops k/v of sel and win, φ = avg drops the φ parameters) as bfloat16, φ parameters float32;
cu_seqlens, an int64 device tensor or None (then num_seqs sequences of equal length); cfg, the
config as a list of ints (CFG_FIELDS); scale (0: 1/sqrt(dk)). The forward returns o, o_branch×3,
lse×3, k_cmp, v_cmp, sel_idx; the backward the gradients of all x in two buffers – the bfloat16
ones (q, K/V, gates), written in bfloat16 by the library's kernels, and the float32 φ ones.
"""
import ctypes
import functools
from typing import List, Optional

import torch
from torch import Tensor

from . import _capi
from ._capi import NsaError
from .ops import CFG_FIELDS, NUM_SLOTS, _PHI_K, attn_config, refs, saved_refs

_SHARED_ABSENT = (2, 3, 5, 6)  # k_sel, k_win, v_sel, v_win with kv = shared
HAS_CUSTOM_OP = hasattr(torch, "library") and hasattr(torch.library, "custom_op")


def present_slots(cfg):
    """The slots (0..19) that hold a tensor for this config, in order."""
    f = dict(zip(CFG_FIELDS, cfg))
    return [s for s in range(NUM_SLOTS)
            if not (f["kv"] and s in _SHARED_ABSENT) and not (not f["phi"] and s >= _PHI_K)]


def compressed_rows(cfg, T):
    """Rows of the compressed K/V outputs: T / d (nsa_cuda_compressed_rows; a bound on the real
    count for every cu_seqlens, rows past it are padding)."""
    return T // dict(zip(CFG_FIELDS, cfg))["d"]


def _new_outputs(q, cfg):
    f = dict(zip(CFG_FIELDS, cfg))
    T, H, G, dv = q.shape[0], f["heads"], f["groups"], f["dv"]
    C = compressed_rows(cfg, T)
    new = lambda dtype, *shape: torch.empty(shape, dtype=dtype, device=q.device)
    return ([new(torch.bfloat16, T, H, dv)] + [new(torch.bfloat16, T, H, dv) for _ in range(3)]
            + [new(torch.float32, T, H) for _ in range(3)]
            + [new(torch.float32, C, G, f["dk"]), new(torch.float32, C, G, dv),
               new(torch.int32, T, G, f["n_sel"])])


def _ready(t):
    """t as the library takes it: contiguous, and 16-byte aligned (the kernels' vector loads) –
    a copy only where it is not (a view at an odd offset, strides a compiler chose)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _slots(cfg, xs):
    slots = [None] * NUM_SLOTS
    for s, x in zip(present_slots(cfg), xs):
        slots[s] = x
    return slots


@functools.lru_cache(maxsize=256)
def _workspace_bytes(cfg, scale, T, num_seqs, backward, device):
    out = ctypes.c_size_t()
    _capi.call(_capi.LIB.nsa_cuda_workspace_bytes, ctypes.byref(attn_config(cfg, scale)), T,
               num_seqs, int(backward), device, ctypes.byref(out))
    return out.value


def _call_args(cfg, scale, q, num_seqs, backward):
    """(workspace tensor, device index, stream handle) of a call on q's device; backward: 0
    forward, 1 backward, 2 backward with bfloat16 gradients (nsa_cuda_workspace_bytes)."""
    device = q.device.index if q.device.index is not None else torch.cuda.current_device()
    nbytes = _workspace_bytes(tuple(cfg), float(scale), q.shape[0], num_seqs, backward, device)
    ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=q.device)
    return ws, device, torch.cuda.current_stream(q.device).cuda_stream


def forward_impl(xs, cu_seqlens, num_seqs, cfg, scale):
    """One forward call: [o, o_cmp, o_sel, o_win, lse×3, k_cmp, v_cmp, sel_idx]."""
    outs = _new_outputs(xs[0], cfg)
    if xs[0].shape[0] == 0:
        return outs
    xs = [_ready(x) for x in xs]
    o, o_br, lse, (k_cmp, v_cmp, sel_idx) = outs[0], outs[1:4], outs[4:7], outs[7:]
    ws, device, stream = _call_args(cfg, scale, xs[0], num_seqs, 0)
    _capi.call(_capi.LIB.nsa_attention_forward_cuda, ctypes.byref(attn_config(cfg, scale)),
               None if cu_seqlens is None else cu_seqlens.data_ptr(), num_seqs,
               ctypes.byref(refs(_capi.AttnTensors, _slots(cfg, xs), "cuda")),
               ctypes.byref(saved_refs(o, o_br, lse, k_cmp, v_cmp, sel_idx, "cuda")),
               ws.data_ptr(), ws.numel(), device, stream)
    return outs


def _grad_layout(xs):
    """Element offsets of xs' gradients in one buffer and its size: each gradient starts on a
    multiple of 8 elements (16-byte aligned in float32 and bfloat16 alike, as the library wants)."""
    offs, end = [], 0
    for x in xs:
        offs.append(end)
        end += (x.numel() + 7) // 8 * 8
    return offs, end


def _grad_views(flat, xs, offs):
    """The gradients of xs as views of one buffer, at _grad_layout's offsets."""
    return [flat[o:o + x.numel()].view(x.shape) for o, x in zip(offs, xs)]


def _backward_call(xs, saved, d_o, cu_seqlens, num_seqs, cfg, scale, grads, bf16_grads):
    """One backward call into the library, writing grads (shaped as xs; the bfloat16 inputs'
    gradients in bfloat16 with bf16_grads, else all float32)."""
    xs, saved = [_ready(x) for x in xs], [_ready(t) for t in saved]
    o_br, lse, (k_cmp, v_cmp, sel_idx) = saved[0:3], saved[3:6], saved[6:9]
    ws, device, stream = _call_args(cfg, scale, xs[0], num_seqs, 2 if bf16_grads else 1)
    entry = (_capi.LIB.nsa_attention_backward_cuda_bf16 if bf16_grads
             else _capi.LIB.nsa_attention_backward_cuda)
    _capi.call(entry, ctypes.byref(attn_config(cfg, scale)),
               None if cu_seqlens is None else cu_seqlens.data_ptr(), num_seqs,
               ctypes.byref(refs(_capi.AttnTensors, _slots(cfg, xs), "cuda")),
               ctypes.byref(saved_refs(None, o_br, lse, k_cmp, v_cmp, sel_idx, "cuda")),
               ctypes.byref(_capi.ref(_ready(d_o), "cuda")),
               ctypes.byref(refs(_capi.AttnTensors, _slots(cfg, grads), "cuda")),
               ws.data_ptr(), ws.numel(), device, stream)


def backward_flat(xs, saved, d_o, cu_seqlens, num_seqs, cfg, scale):
    """One backward call: the float32 gradients of all xs, in order, in one buffer (the tests
    compare these with the CPU op's)."""
    offs, size = _grad_layout(xs)
    flat = torch.empty(size, dtype=torch.float32, device=xs[0].device)
    if xs[0].shape[0] == 0:
        return flat.zero_()
    _backward_call(xs, saved, d_o, cu_seqlens, num_seqs, cfg, scale,
                   _grad_views(flat, xs, offs), False)
    return flat


def _n_bf16(xs):
    """How many of xs (slot order) are bfloat16: q, the K/V and the gates come first."""
    n = 0
    while n < len(xs) and xs[n].dtype == torch.bfloat16:
        n += 1
    return n


def _packed_layout(xs):
    """backward_packed's two buffers: how many of xs lead in bfloat16, and _grad_layout's
    (offsets, size) of that part and of the float32 rest."""
    n_bf = _n_bf16(xs)
    return n_bf, _grad_layout(xs[:n_bf]), _grad_layout(xs[n_bf:])


def _packed_sizes(xs):
    """Elements of backward_packed's two buffers."""
    _, (_, size_bf), (_, size_32) = _packed_layout(xs)
    return size_bf, size_32


def _packed_buffers(xs):
    """backward_packed's two buffers – the bfloat16 inputs' gradients in one bfloat16 buffer, the
    float32 φ parameters' in one float32 buffer, each at _grad_layout's offsets of its part of xs
    – and the gradients of xs as views of them (one allocation each)."""
    n_bf, (offs_bf, size_bf), (offs_32, size_32) = _packed_layout(xs)
    flat_bf = torch.empty(size_bf, dtype=torch.bfloat16, device=xs[0].device)
    flat32 = torch.empty(size_32, dtype=torch.float32, device=xs[0].device)
    grads = _grad_views(flat_bf, xs[:n_bf], offs_bf) + _grad_views(flat32, xs[n_bf:], offs_32)
    return flat_bf, flat32, grads


def _backward_into(xs, saved, d_o, cu_seqlens, num_seqs, cfg, scale):
    """One backward call into _packed_buffers' buffers (no float32 → bfloat16 pass here: the
    library's kernels write the bfloat16 gradients themselves): (flat_bf, flat32, views)."""
    flat_bf, flat32, grads = _packed_buffers(xs)
    if xs[0].shape[0] == 0:
        flat_bf.zero_()
        flat32.zero_()
    else:
        _backward_call(xs, saved, d_o, cu_seqlens, num_seqs, cfg, scale, grads, True)
    return flat_bf, flat32, grads


def backward_packed(xs, saved, d_o, cu_seqlens, num_seqs, cfg, scale):
    """One backward call with the gradients as the custom op returns them: [flat_bf, flat32]."""
    return list(_backward_into(xs, saved, d_o, cu_seqlens, num_seqs, cfg, scale)[:2])


def backward_impl(xs, saved, d_o, cu_seqlens, num_seqs, cfg, scale):
    """backward_flat's gradients as a list (float32, shaped as xs)."""
    flat = backward_flat(xs, saved, d_o, cu_seqlens, num_seqs, cfg, scale)
    return _grad_views(flat, xs, _grad_layout(xs)[0])


def _input_grads(xs, flat_bf, flat32, needs):
    """The gradients in the inputs' dtypes from backward_packed's buffers: views of the bfloat16
    one for q, K/V and the gates (no cast), the φ parameters' from the float32 one."""
    n_bf, (offs_bf, _), (offs_32, _) = _packed_layout(xs)
    grads = _grad_views(flat_bf, xs[:n_bf], offs_bf)
    rest = xs[n_bf:]  # float32 φ parameters: their views as they are
    grads += [g.to(x.dtype) for g, x in zip(_grad_views(flat32, rest, offs_32), rest)]
    return [g if need else None for g, need in zip(grads, needs)]


if HAS_CUSTOM_OP:
    @torch.library.custom_op("nsa::attention_fwd", mutates_args=(), device_types="cuda")
    def attention_fwd(xs: List[Tensor], cu_seqlens: Optional[Tensor], num_seqs: int,
                      cfg: List[int], scale: float) -> List[Tensor]:
        return forward_impl(xs, cu_seqlens, num_seqs, cfg, scale)

    @attention_fwd.register_fake
    def _attention_fwd_fake(xs, cu_seqlens, num_seqs, cfg, scale):
        return _new_outputs(xs[0], cfg)

    @torch.library.custom_op("nsa::attention_bwd", mutates_args=(), device_types="cuda")
    def attention_bwd(xs: List[Tensor], saved: List[Tensor], d_o: Tensor,
                      cu_seqlens: Optional[Tensor], num_seqs: int, cfg: List[int],
                      scale: float) -> List[Tensor]:
        return backward_packed(xs, saved, d_o, cu_seqlens, num_seqs, cfg, scale)

    @attention_bwd.register_fake
    def _attention_bwd_fake(xs, saved, d_o, cu_seqlens, num_seqs, cfg, scale):
        size_bf, size_32 = _packed_sizes(xs)
        return [torch.empty(size_bf, dtype=torch.bfloat16, device=xs[0].device),
                torch.empty(size_32, dtype=torch.float32, device=xs[0].device)]

    def _setup_context(ctx, inputs, output):
        xs, cu_seqlens, num_seqs, cfg, scale = inputs
        ctx.n, ctx.num_seqs, ctx.cfg, ctx.scale = len(xs), num_seqs, list(cfg), scale
        ctx.save_for_backward(*xs, *output[1:], cu_seqlens)
        ctx.mark_non_differentiable(*output[1:])
        if hasattr(ctx, "set_materialize_grads"):  # no zero gradients for the nine side outputs
            ctx.set_materialize_grads(False)

    def _backward(ctx, grads):
        saved = ctx.saved_tensors
        xs, outs, cu_seqlens = list(saved[:ctx.n]), list(saved[ctx.n:ctx.n + 9]), saved[-1]
        if grads[0] is None:  # o did not reach the loss
            return [None] * ctx.n, None, None, None, None
        flat_bf, flat32 = torch.ops.nsa.attention_bwd(xs, outs, grads[0].contiguous(), cu_seqlens,
                                                      ctx.num_seqs, ctx.cfg, ctx.scale)
        return (_input_grads(xs, flat_bf, flat32, ctx.needs_input_grad[0]), None, None, None,
                None)

    torch.library.register_autograd("nsa::attention_fwd", _backward, setup_context=_setup_context)


class AttentionFunction(torch.autograd.Function):
    """The same two calls outside torch.compile (and on a PyTorch without torch.library.custom_op,
    which then has no torch.compile path)."""

    @staticmethod
    def forward(ctx, cu_seqlens, num_seqs, cfg, scale, *xs):
        outs = forward_impl(list(xs), cu_seqlens, num_seqs, cfg, scale)
        ctx.n, ctx.num_seqs, ctx.cfg, ctx.scale = len(xs), num_seqs, cfg, scale
        ctx.save_for_backward(*xs, *outs[1:], cu_seqlens)
        ctx.mark_non_differentiable(*outs[1:])
        ctx.set_materialize_grads(False)  # no zero gradients for the nine side outputs
        return tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_o, *unused):
        if d_o is None:  # o did not reach the loss (gradients are not materialised)
            return (None,) * (4 + ctx.n)
        saved = ctx.saved_tensors
        xs, outs, cu_seqlens = list(saved[:ctx.n]), list(saved[ctx.n:ctx.n + 9]), saved[-1]
        # The gradients as the views the call wrote (built once; their dtypes are the inputs').
        _, _, grads = _backward_into(xs, outs, d_o.contiguous(), cu_seqlens, ctx.num_seqs,
                                     ctx.cfg, ctx.scale)
        return (None, None, None, None,
                *(g if need else None for g, need in zip(grads, ctx.needs_input_grad[4:])))


_compiler = getattr(torch, "compiler", None)
_is_compiling = getattr(_compiler, "is_compiling", None) or (lambda: False)


def run_forward(xs, cu_seqlens, num_seqs, cfg, scale):
    """The forward op: the list of forward_impl's outputs. Under torch.compile the custom op (opaque
    to it); eagerly the same two calls under AttentionFunction, which skips the dispatcher's round
    trips through Python (the custom ops' Python wrapper was the op's largest host cost under
    cProfile at PyTorch 2.11; docs/perf.md has what that changed)."""
    if HAS_CUSTOM_OP and _is_compiling():
        return torch.ops.nsa.attention_fwd(xs, cu_seqlens, num_seqs, cfg, scale)
    return list(AttentionFunction.apply(cu_seqlens, num_seqs, cfg, scale, *xs))


def _device_cu_seqlens(cu_seqlens, q):
    """cu_seqlens as an int64 tensor on q's device, and N. A device tensor is taken as it is (no
    host check, no synchronisation; the library clamps a broken one into a valid layout); a host
    one (tensor or list) is checked here, then copied to the device."""
    if isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.device.type == "cuda":
        if cu_seqlens.device != q.device:
            raise NsaError("'cu_seqlens' is on %s, q on %s" % (cu_seqlens.device, q.device))
        if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
            raise NsaError("'cu_seqlens' must be 1-D [N + 1] with N >= 1, got shape %s"
                           % list(cu_seqlens.shape))
        if cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise NsaError("'cu_seqlens' has dtype %s, expected int32 or int64" % cu_seqlens.dtype)
        return cu_seqlens.to(torch.int64).contiguous(), cu_seqlens.shape[0] - 1
    cu = torch.as_tensor(cu_seqlens).to(device="cpu", dtype=torch.int64).reshape(-1)
    T, values = q.shape[0], cu.tolist()
    if torch.as_tensor(cu_seqlens).dim() != 1 or len(values) < 2:
        raise NsaError("'cu_seqlens' must be 1-D [N + 1] with N >= 1, got %s" % values)
    if values[0] != 0 or values[-1] != T or any(b < a for a, b in zip(values, values[1:])):
        raise NsaError("'cu_seqlens' = %s must rise from 0 to the token count %d" % (values, T))
    return cu.to(q.device), len(values) - 1


def attention(cfg, scale, slots, cu_seqlens, batch):
    """ops.attention's CUDA path: (o [T, H, dv] in q's dtype, sel_idx [T, G, n_sel]). cfg: the
    config list (CFG_FIELDS); slots: the 20 slots; batch: the number of equal-length rows when
    cu_seqlens is None. Plain tensor code and the custom op (no ctypes), so that torch.compile
    traces it whole when cu_seqlens is None or on the device."""
    q = slots[0]
    xs = [slots[s].float() if s >= _PHI_K else slots[s].to(torch.bfloat16)
          for s in present_slots(cfg)]
    if cu_seqlens is None:
        cu, num_seqs = None, batch
    else:
        cu, num_seqs = _device_cu_seqlens(cu_seqlens, q)
    outs = run_forward(xs, cu, num_seqs, cfg, scale)
    return outs[0].to(q.dtype), outs[9]
