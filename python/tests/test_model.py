"""nsa.NativeSparseAttention and nsa.Transformer: checkpoint names, gradients, layouts.

That the math equals the C++ CPU model is test_load_model.py's job (the loss of a trained
checkpoint against `nsa eval`); here the module's own contract.
"""
import pytest
import torch

import nsa

SMALL = dict(vocab_size=50, dim=32, n_layers=2, seq_len=40, heads=4, groups=2, dk=8, dv=8, l=8,
             d=4, l_sel=8, n_sel=3, w=16)


@pytest.mark.parametrize("kv,phi", [("separate", "avg"), ("shared", "mlp")])
def test_parameter_names_are_the_checkpoint_names(kv, phi):
    m = nsa.Transformer(nsa.ModelConfig(**SMALL, kv=kv, phi=phi))
    names = set(m.state_dict())
    wk = ["wk", "wv"] if kv == "shared" else ["wk_cmp", "wv_cmp", "wk_sel", "wv_sel", "wk_win",
                                                "wv_win"]
    expected = {"layers.1.attention.%s.weight" % n for n in wk + ["wq", "wg", "wo"]}
    expected |= {"tok_embeddings.weight", "norm.weight", "layers.1.attention.wg.bias",
                 "layers.0.attention_norm.weight", "layers.0.ffn_norm.weight"}
    expected |= {"layers.0.feed_forward.w%d.weight" % i for i in (1, 2, 3)}
    if phi == "mlp":
        expected |= {"layers.0.attention.phi_v.%s" % f for f in ("pos", "w1", "b1", "w2", "b2")}
    assert expected <= names
    assert not any(n.startswith("output") for n in names)  # tied head


def test_every_parameter_gets_a_gradient():
    cfg = nsa.ModelConfig(**SMALL, phi="mlp", gate="softmax", mlp="silu", tie_embeddings=False)
    m = nsa.Transformer(cfg)
    tokens = torch.randint(0, 50, (2, 40), generator=torch.Generator().manual_seed(0))
    m.loss(tokens[:, :-1], tokens[:, 1:]).backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_block_packed_equals_batched():
    """Two rows of a batch and the same rows packed with cu_seqlens: positions restart per
    sequence (RoPE) and attention stays inside each, so outputs are equal."""
    torch.manual_seed(1)
    attn = nsa.NativeSparseAttention(32, 4, 2, 8, 8, l=8, d=4, l_sel=8, n_sel=3, w=16)
    attn.reset_parameters(0.2)
    x = torch.randn(2, 30, 32)
    y_batched, sel_b = attn(x, return_sel_idx=True)
    y_packed, sel_p = attn(x.reshape(60, 32), cu_seqlens=[0, 30, 60], return_sel_idx=True)
    torch.testing.assert_close(y_packed, y_batched.reshape(60, 32), atol=1e-6, rtol=1e-5)
    assert torch.equal(sel_p, sel_b.reshape(60, 2, 3))


def test_branches_off_zero_their_gates():
    torch.manual_seed(2)
    attn = nsa.NativeSparseAttention(16, 2, 1, 8, 8, l=4, d=4, l_sel=4, n_sel=3, w=4,
                                     branches="win")
    attn.reset_parameters(0.2)
    win_only = nsa.NativeSparseAttention(16, 2, 1, 8, 8, l=4, d=4, l_sel=4, n_sel=3, w=4)
    win_only.load_state_dict(attn.state_dict())
    with torch.no_grad():  # gate logits −∞ for cmp and sel: sigmoid 0
        win_only.wg.bias.view(2, 3)[:, :2] = -float("inf")
    x = torch.randn(1, 12, 16)
    torch.testing.assert_close(attn(x), win_only(x))
