"""nsa.attention against `nsa attention` (docs/interop.md) on the same file: bitwise on the CPU.

Both run the fp32 CPU reference, one through the C ABI and one through the CLI's file mapping;
the outputs, the selected blocks and every gradient must be identical bit for bit.
"""
import subprocess

import pytest
import torch

import nsa
from nsa import safetensors
from conftest import nsa_binary, random_problem

HP = dict(l=8, d=4, l_sel=8, n_sel=4, w=16)


@pytest.mark.parametrize("shared,mlp,cu", [(False, False, None), (True, False, None),
                                           (False, True, [0, 37, 40, 100]), (True, True, [0, 100])])
def test_op_equals_cli(tmp_path, shared, mlp, cu):
    x = random_problem(0, 4, 2, 16, 8, shared=shared, mlp=mlp, hidden=12, l=HP["l"],
                       dtype=torch.float32, seed=11, lead=(1, 100))
    d_o = torch.randn(1, 100, 4, 8, generator=torch.Generator().manual_seed(12))
    file_in = {("k" if k == "k_cmp" else "v" if k == "v_cmp" else k) if shared else k: v
               for k, v in x.items() if not isinstance(v, dict)}
    for name in ("phi_k", "phi_v") if mlp else ():
        file_in.update({"%s_%s" % (name, f): t for f, t in x[name].items()})
    file_in["do"] = d_o
    if cu is not None:
        file_in["cu_seqlens"] = torch.tensor(cu, dtype=torch.int64)
    meta = dict(HP, phi="mlp" if mlp else "avg", kv="shared" if shared else "separate")
    safetensors.write(tmp_path / "in.safetensors", file_in, meta)
    subprocess.run([nsa_binary(), "attention", "--in", str(tmp_path / "in.safetensors"),
                    "--out", str(tmp_path / "out.safetensors")], check=True, capture_output=True)
    cli, _ = safetensors.read(tmp_path / "out.safetensors")

    inputs = {k: v for k, v in file_in.items() if k not in ("do", "cu_seqlens")}
    for t in inputs.values():
        t.requires_grad_()
    args = {k: v for k, v in x.items() if k != "q"}
    for k in list(args):
        if isinstance(args[k], dict):
            args[k] = {f: inputs["%s_%s" % (k, f)] for f in args[k]}
        else:
            args[k] = inputs[("k" if k == "k_cmp" else "v" if k == "v_cmp" else k) if shared else k]
    o, sel = nsa.attention(inputs["q"], args.pop("k_cmp"), args.pop("v_cmp"), **args,
                           cu_seqlens=cu, return_sel_idx=True, **HP)
    o.backward(d_o)

    assert torch.equal(o, cli["o"]), "o differs from the CLI's"
    assert torch.equal(sel, cli["sel_idx"]), "sel_idx differs from the CLI's"
    for name, t in inputs.items():
        assert torch.equal(t.grad, cli["d" + name]), "d%s differs from the CLI's" % name
