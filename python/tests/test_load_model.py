"""nsa.load_model: a tiny model trained by `nsa train`, evaluated by `nsa eval` and by PyTorch on
the same validation shard; the losses agree to 1e-5 relative.
"""
import json
import subprocess

import numpy as np
import pytest
import torch

import nsa
from nsa.checkpoint import SHARD_MAGIC
from conftest import REPO, nsa_binary


def write_shard(path, tokens):
    header = np.zeros(256, dtype="<i4")
    header[:3] = (SHARD_MAGIC, 2, len(tokens))
    path.write_bytes(header.tobytes() + np.asarray(tokens, dtype="<u4").tobytes())


def make_data(folder):
    """Learnable tokens: short random phrases repeated with noise."""
    rng = np.random.default_rng(0)
    phrases = rng.integers(0, 256, size=(16, 12))
    seq = np.concatenate([phrases[i] for i in rng.integers(0, 16, size=900)])
    write_shard(folder / "train_000.bin", seq[:9000])
    write_shard(folder / "val_000.bin", seq[9000:])


@pytest.mark.parametrize("sets", [["phi=mlp"],
                                  ["kv=shared", "gate=softmax", "mlp=silu", "tie_embeddings=false",
                                   "branches=sel,win"],
                                  ["attention=full"], ["attention=window"]])
def test_load_model_reproduces_nsa_eval(tmp_path, sets):
    make_data(tmp_path)
    run = tmp_path / "run"
    args = ["--config", str(REPO / "configs" / "tiny.yaml"),
            "--data", str(tmp_path), "--out", str(run), "--steps", "12", "--batch", "2",
            "--seq-len", "96", "--val-every", "0", "--lr", "3e-3"]
    for s in sets:
        args += ["--set", s]
    subprocess.run([nsa_binary(), "train"] + args, check=True, capture_output=True)
    out = subprocess.run([nsa_binary(), "eval", "--run", str(run), "--data", str(tmp_path),
                          "--batches", "3", "--batch", "2", "--seq-len", "96"],
                         check=True, capture_output=True, text=True).stdout
    cli = json.loads(out.strip().splitlines()[-1])["val_loss"]

    model = nsa.load_model(run)
    assert model.step == 12
    loss = nsa.evaluate_loss(model, tmp_path, batches=3, batch=2, seq_len=96)
    rel = abs(loss - cli) / cli
    print("nsa eval %.6f, PyTorch %.6f, relative difference %.2e (bound 1e-5)" % (cli, loss, rel))
    assert abs(loss - cli) <= 1e-5 * abs(cli)


def test_validation_shards_follow_meta_json(tmp_path):
    """As the C++ loader: meta.json's val list where there is one (a stray val_*.bin is not read),
    every val_*.bin without it, and a listed shard that is missing is named."""
    from nsa.checkpoint import validation_shards
    write_shard(tmp_path / "val_000000.bin", [1, 2, 3])
    write_shard(tmp_path / "val_999999.bin", [4, 5])
    assert [p.name for p in validation_shards(tmp_path)] == ["val_000000.bin", "val_999999.bin"]
    (tmp_path / "meta.json").write_text(json.dumps({"val_shards": ["elsewhere/val_000000.bin"]}))
    assert [p.name for p in validation_shards(tmp_path)] == ["val_000000.bin"]
    (tmp_path / "val_000000.bin").unlink()
    with pytest.raises(ValueError, match="listed in .* is missing"):
        validation_shards(tmp_path)
