"""The CUDA op's gradient buffer (nsa._cuda): one float32 allocation for all of the backward's
gradients and one bfloat16 cast of them. Pure tensor bookkeeping, so it is checked here on the
CPU: the library refuses tensors that are not 16-byte aligned, and the gradients must come back
with their inputs' shapes, dtypes and values.
"""
import torch

from nsa import _cuda


def inputs():
    """Slot-ordered inputs as the op passes them: bf16 q, K/V and gates of sizes that are not
    multiples of 8 elements, then float32 φ parameters."""
    bf = torch.bfloat16
    xs = [torch.zeros(5, 3, 7, dtype=bf)]  # q
    xs += [torch.zeros(5, 2, 3, dtype=bf) for _ in range(6)]  # k, v per branch
    xs += [torch.zeros(5, 3, dtype=bf) for _ in range(3)]  # gates
    xs += [torch.zeros(2, 3), torch.zeros(7)]  # φ parameters
    return xs


def test_every_gradient_starts_32_byte_aligned_in_one_buffer():
    xs = inputs()
    offs, end = _cuda._grad_layout(xs)
    assert end >= sum(x.numel() for x in xs)
    flat = torch.empty(end, dtype=torch.float32)
    views = _cuda._grad_views(flat, xs, offs)
    for x, v, o in zip(xs, views, offs):
        assert v.shape == x.shape and v.dtype == torch.float32 and v.is_contiguous()
        assert o % 8 == 0 and v.data_ptr() - flat.data_ptr() == 4 * o
    spans = sorted((o, o + x.numel()) for o, x in zip(offs, xs))
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "gradients overlap"


def test_input_grads_casts_the_bf16_ones_and_keeps_shapes_and_values():
    xs = inputs()
    offs, end = _cuda._grad_layout(xs)
    flat = torch.randn(end, generator=torch.Generator().manual_seed(3))
    views = _cuda._grad_views(flat, xs, offs)
    needs = [True] * len(xs)
    needs[4] = False
    out = _cuda._input_grads(xs, flat, needs)
    assert out[4] is None
    for i, (x, v, g) in enumerate(zip(xs, views, out)):
        if i == 4:
            continue
        assert g.shape == x.shape and g.dtype == x.dtype
        assert torch.equal(g, v.to(x.dtype))
