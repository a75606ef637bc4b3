"""The CUDA op's gradient buffers (nsa._cuda): one bfloat16 allocation for the gradients of q,
K/V and the gates (the library writes them in bfloat16) and one float32 allocation for the φ
parameters'. Pure tensor bookkeeping, so it is checked here on the CPU: the library refuses
tensors that are not 16-byte aligned, and the gradients must come back with their inputs' shapes,
dtypes and values.
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


def test_packed_buffers_hold_each_part_16_byte_aligned():
    xs = inputs()
    size_bf, size_32 = _cuda._packed_sizes(xs)
    assert _cuda._n_bf16(xs) == 10
    assert size_bf == _cuda._grad_layout(xs[:10])[1] and size_32 == _cuda._grad_layout(xs[10:])[1]
    flat_bf = torch.empty(size_bf, dtype=torch.bfloat16)
    for x, v, o in zip(xs, _cuda._grad_views(flat_bf, xs[:10], _cuda._grad_layout(xs[:10])[0]),
                       _cuda._grad_layout(xs[:10])[0]):
        assert v.shape == x.shape and (v.data_ptr() - flat_bf.data_ptr()) % 16 == 0


def test_input_grads_are_views_of_the_bf16_buffer_and_keep_shapes_and_values():
    xs = inputs()
    size_bf, size_32 = _cuda._packed_sizes(xs)
    gen = torch.Generator().manual_seed(3)
    flat_bf = torch.randn(size_bf, generator=gen).to(torch.bfloat16)
    flat32 = torch.randn(size_32, generator=gen)
    views = (_cuda._grad_views(flat_bf, xs[:10], _cuda._grad_layout(xs[:10])[0])
             + _cuda._grad_views(flat32, xs[10:], _cuda._grad_layout(xs[10:])[0]))
    needs = [True] * len(xs)
    needs[4] = False
    out = _cuda._input_grads(xs, flat_bf, flat32, needs)
    assert out[4] is None
    for i, (x, v, g) in enumerate(zip(xs, views, out)):
        if i == 4:
            continue
        assert g.shape == x.shape and g.dtype == x.dtype
        assert torch.equal(g, v)
        if x.dtype == torch.bfloat16:  # no copy: a view of the library's output
            assert g.data_ptr() == v.data_ptr()
