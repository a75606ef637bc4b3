"""nsa.attention: gradients by finite differences (float64, every input), shapes, errors.

Every configuration the op offers is checked with torch.autograd.gradcheck: shared and separate
K/V, φ avg and mlp (the MLP's parameters included), group sizes 1, 2 and 3 heads per group, dk ≠
dv, batched and varlen (cu_seqlens). Sizes are tiny so each check takes about a second.
"""
import pytest
import torch

import nsa
from conftest import leaves, random_problem

HP = dict(l=4, d=2, l_sel=4, n_sel=3, w=5)


def run(x, **kw):
    """Calls nsa.attention with a random_problem dict (whose tensors may be replaced by ones that
    require grad)."""
    args = dict(x)
    return nsa.attention(args.pop("q"), args.pop("k_cmp"), args.pop("v_cmp"), **args, **kw)


def gradcheck(x, **kw):
    ts = [t.requires_grad_() for t in leaves(x)]
    fn = lambda *unused: run(x, **kw)
    assert torch.autograd.gradcheck(fn, ts, eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("H,G,dk,dv", [(4, 2, 4, 4), (3, 3, 4, 2), (6, 2, 2, 4)])
def test_gradcheck_separate_avg(H, G, dk, dv):
    gradcheck(random_problem(20, H, G, dk, dv, seed=H), **HP)


def test_gradcheck_shared_kv():
    gradcheck(random_problem(20, 4, 2, 4, 4, shared=True, seed=1), **HP)


@pytest.mark.parametrize("shared", [False, True])
def test_gradcheck_phi_mlp(shared):
    gradcheck(random_problem(18, 4, 2, 4, 2, shared=shared, mlp=True, hidden=3, seed=2), **HP)


def test_gradcheck_varlen():
    x = random_problem(23, 4, 2, 4, 4, mlp=True, seed=3)
    gradcheck(x, cu_seqlens=torch.tensor([0, 9, 9, 23]), **HP)


def test_gradcheck_batched():
    gradcheck(random_problem(0, 2, 1, 4, 4, lead=(2, 12), seed=4), **HP)


def test_batched_equals_varlen():
    """A padded batch [B, S] is the layout cu_seqlens = {0, S, 2S}: same outputs, same gradients."""
    x = random_problem(0, 2, 2, 4, 4, lead=(2, 13), seed=5)
    flat = {k: v.reshape(26, *v.shape[2:]) for k, v in x.items()}
    o_b, sel_b = run(x, return_sel_idx=True, **HP)
    o_v, sel_v = run(flat, cu_seqlens=[0, 13, 26], return_sel_idx=True, **HP)
    assert torch.equal(o_b.reshape(26, 2, 4), o_v)
    assert torch.equal(sel_b.reshape(26, 2, 3), sel_v)


def test_selected_blocks():
    """sel_idx: ascending, −1 padded, forced blocks 0, c − 1, c always there (docs/nsa.md)."""
    x = random_problem(40, 4, 2, 4, 4, dtype=torch.float32, seed=6)
    o, sel = run(x, return_sel_idx=True, **HP)
    assert o.shape == (40, 4, 4) and sel.shape == (40, 2, 3) and sel.dtype == torch.int32
    for t in range(40):
        c = t // HP["l_sel"]
        for g in range(2):
            chosen = [b for b in sel[t, g].tolist() if b >= 0]
            assert chosen == sorted(set(chosen))
            assert {0, max(c - 1, 0), c} <= set(chosen)


def test_float32_and_float64_agree():
    x = random_problem(30, 4, 2, 8, 8, mlp=True, seed=7)
    x32 = {k: ({f: t.float() for f, t in v.items()} if isinstance(v, dict) else v.float())
           for k, v in x.items()}
    torch.testing.assert_close(run(x32, **HP).double(), run(x, **HP), atol=1e-5, rtol=1e-4)


def test_errors_name_the_argument():
    x = random_problem(20, 4, 2, 4, 4, dtype=torch.float32)
    bad = dict(x, v_win=torch.zeros(20, 2, 5))
    with pytest.raises(nsa.NsaError, match="v_win"):
        run(bad, **HP)
    with pytest.raises(nsa.NsaError, match="n_sel"):
        run(x, **dict(HP, n_sel=2))
    with pytest.raises(nsa.NsaError, match="'g_sel' has dtype"):
        run(dict(x, g_sel=x["g_sel"].double()), **HP)
    with pytest.raises(nsa.NsaError, match="cu_seqlens"):
        run(x, cu_seqlens=[0, 5, 19], **HP)
    with pytest.raises(nsa.NsaError, match="phi_k_w1"):
        phi = {"pos": torch.zeros(4, 4), "w1": torch.zeros(15, 4), "b1": torch.zeros(4),
               "w2": torch.zeros(4, 4), "b2": torch.zeros(4)}
        run(x, phi_k=phi, phi_v=phi, **HP)


def test_forward_on_given_selection():
    """The reference's forward on given selected blocks (what test_cuda.py compares the GPU with):
    its own choice given back gives the same bits; another valid choice for one row changes that
    row only; a selection without the forced blocks is rejected."""
    from nsa.ops import attn_config, cpu_forward
    x = random_problem(40, 4, 2, 4, 4, mlp=True, dtype=torch.float32, seed=8)
    slots = [x["q"], x["k_cmp"], x["k_sel"], x["k_win"], x["v_cmp"], x["v_sel"], x["v_win"],
             x["g_cmp"], x["g_sel"], x["g_win"]]
    slots += [x[p][f] for p in ("phi_k", "phi_v") for f in ("pos", "w1", "b1", "w2", "b2")]
    hp = dict(HP, n_sel=4)
    cfg = attn_config([4, 2, 4, 4, hp["l"], hp["d"], hp["l_sel"], hp["n_sel"], hp["w"], 4, 1, 0],
                      None)
    cu = torch.tensor([0, 17, 40])
    own = cpu_forward(cfg, cu, slots)
    again = cpu_forward(cfg, cu, slots, sel_idx=own[5])
    assert torch.equal(own[0], again[0]) and torch.equal(own[5], again[5])
    row = 37  # sequence 1, t = 20: block 5 with 4 and 0 forced, one of 1..3 chosen
    chosen = set(own[5][row, 0].tolist()) - {0, 4, 5}
    other = ({1, 2, 3} - chosen).pop()
    given = own[5].clone()
    given[row, 0] = torch.tensor(sorted({0, 4, 5, other}), dtype=torch.int32)
    moved = cpu_forward(cfg, cu, slots, sel_idx=given)
    assert torch.equal(moved[5], given)
    differs = (moved[0] != own[0]).any(-1).any(-1).nonzero().flatten().tolist()
    assert differs == [row]
    bad = own[5].clone()
    bad[row, 0] = torch.tensor([1, 2, 3, -1], dtype=torch.int32)  # lacks the forced blocks
    with pytest.raises(nsa.NsaError, match="selection"):
        cpu_forward(cfg, cu, slots, sel_idx=bad)


@pytest.mark.parametrize("cu", [None, [0, 3, 3, 9]])
def test_sequences_shorter_than_l(cu):
    """Sequences of fewer than l tokens have no compressed token (o_cmp = 0, its gate gets no
    gradient): empty compressed K/V pass through the C ABI, and the gradients stay finite."""
    T = 3 if cu is None else cu[-1]
    x = random_problem(T, 4, 2, 4, 4, mlp=True, l=8, seed=9)
    for t in leaves(x):
        t.requires_grad_()
    o = run(x, cu_seqlens=cu, **dict(HP, l=8, d=4, l_sel=8))
    o.sum().backward()
    assert torch.isfinite(o).all()
    if cu is None:
        assert torch.equal(x["g_cmp"].grad, torch.zeros_like(x["g_cmp"]))
