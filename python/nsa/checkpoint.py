"""load_model: a PyTorch model from one of our checkpoints, and the validation loss of `nsa eval`.

A checkpoint folder (ckpt_*, see src/train/checkpoint.cpp) holds state.json (the model config as
text fields) and model.safetensors (the weights under their checkpoint names). The validation
batches are those of src/train/token_loader.cpp: the val shards (llm.c format) that the folder's
meta.json lists (nsa prepare's folders), else every val_*.bin in name order, concatenated, each
batch the next B·S + 1 contiguous tokens, wrapping at the end.
"""
import json
from pathlib import Path

import numpy as np
import torch

from . import safetensors
from .model import ModelConfig, Transformer

SHARD_MAGIC = 20240520
SHARD_HEADER_BYTES = 1024


def resolve_checkpoint(path):
    """A ckpt_* folder as is; a run folder → its newest complete checkpoint."""
    path = Path(path)
    if (path / "state.json").is_file():
        if not (path / "COMPLETE").exists():
            raise ValueError("checkpoint '%s' is incomplete (no COMPLETE marker)" % path)
        return path
    done = sorted(p for p in path.glob("ckpt_*")
                  if p.is_dir() and "." not in p.name and (p / "COMPLETE").exists())
    if not done:
        raise ValueError("'%s' is neither a checkpoint nor a run with a complete checkpoint" % path)
    return done[-1]


def load_model(run_dir, dtype=torch.float32):
    """Builds our architecture from a checkpoint (or a run's newest one); returns the model in
    eval mode with its config at model.cfg and the checkpoint's step at model.step."""
    ckpt = resolve_checkpoint(run_dir)
    state = json.loads((ckpt / "state.json").read_text())
    cfg = ModelConfig.from_fields(state["model_config"])
    model = Transformer(cfg)
    weights, _ = safetensors.read(ckpt / "model.safetensors")
    expected = set(model.state_dict())
    missing, extra = expected - set(weights), set(weights) - expected
    if missing or extra:
        raise ValueError("checkpoint '%s' does not match its config: missing %s, unexpected %s"
                         % (ckpt, sorted(missing), sorted(extra)))
    model.load_state_dict({k: v.to(torch.float32) for k, v in weights.items()})
    model.step = state.get("step", 0)
    return model.to(dtype).eval()


def read_shard(path):
    """Tokens of one llm.c-format shard: 256 int32 header (magic, version, count), then uint16
    (version 1) or uint32 (version 2) tokens."""
    blob = Path(path).read_bytes()
    header = np.frombuffer(blob[:SHARD_HEADER_BYTES], dtype="<i4")
    if len(blob) < SHARD_HEADER_BYTES or header[0] != SHARD_MAGIC or header[1] not in (1, 2):
        raise ValueError("'%s' is not a token shard (magic %d, version 1 or 2)"
                         % (path, SHARD_MAGIC))
    width = 2 if header[1] == 1 else 4
    body = blob[SHARD_HEADER_BYTES:]
    if len(body) != width * int(header[2]):
        raise ValueError("token shard '%s' holds %d bytes of tokens, its header promises %d"
                         % (path, len(body), width * int(header[2])))
    return np.frombuffer(body, dtype="<u2" if width == 2 else "<u4").astype(np.int64)


def validation_shards(data_dir):
    """The val shards as the loader takes them: meta.json's list (by file name, in data_dir) where
    there is one, else every val_*.bin in name order."""
    folder = Path(data_dir)
    meta = folder / "meta.json"
    if not meta.exists():
        return sorted(folder.glob("val_*.bin"))
    try:
        listed = json.loads(meta.read_text())["val_shards"]
    except (ValueError, KeyError, TypeError):
        raise ValueError("'%s' has no 'val_shards' list (is it nsa prepare's?)" % meta)
    shards = [folder / Path(name).name for name in listed]
    for s in shards:
        if not s.is_file():
            raise ValueError("shard '%s', listed in '%s', is missing: prepare the folder again"
                             % (s, meta))
    return shards


def validation_batches(data_dir, batches, batch, seq_len):
    """The (inputs, targets) [B, S] pairs of nsa eval, in order."""
    shards = validation_shards(data_dir)
    if not shards:
        raise ValueError("'%s' has no val_*.bin shards" % data_dir)
    tokens = torch.from_numpy(np.concatenate([read_shard(s) for s in shards]))
    n, pos = batch * seq_len, 0
    if len(tokens) <= n:
        raise ValueError("the split has %d tokens, fewer than one batch of %d"
                         % (len(tokens), n + 1))
    for _ in range(batches):
        if pos + n + 1 > len(tokens):
            pos = 0
        yield (tokens[pos:pos + n].view(batch, seq_len),
               tokens[pos + 1:pos + n + 1].view(batch, seq_len))
        pos += n


@torch.no_grad()
def evaluate_loss(model, data_dir, batches=20, batch=8, seq_len=None):
    """The mean over batches of the mean token cross-entropy: `nsa eval --task loss`'s val loss
    with the same --batches, --batch and --seq-len (default: the config's)."""
    S = seq_len or model.cfg.seq_len
    losses = [model.loss(x, y).item() for x, y in validation_batches(data_dir, batches, batch, S)]
    return sum(losses) / len(losses)
