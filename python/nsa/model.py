"""Our model's architecture in PyTorch: the NSA attention block and the Llama-style decoder.

The math follows the CPU model (src/model/model_layer_cpu.cpp, model_cpu.cpp) step for step, and
parameter names are those of our checkpoints (src/model/model_params.h), so a checkpoint's
state dict loads as is. Attention itself is nsa.attention (the C++ reference); the layers around
it (RMSNorm, RoPE, gates, the MLP) are plain PyTorch.
"""
import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from .ops import BRANCHES, attention


@dataclass
class ModelConfig:
    """include/nsa/model_config.h; the attention fields as in include/nsa/config.h."""
    vocab_size: int = 256
    dim: int = 64
    n_layers: int = 2
    seq_len: int = 256
    heads: int = 4
    groups: int = 2
    dk: int = 16
    dv: int = 16
    l: int = 16
    d: int = 8
    l_sel: int = 32
    n_sel: int = 4
    w: int = 64
    scale: float = 0.0
    phi: str = "avg"
    kv: str = "separate"
    gate: str = "sigmoid"
    phi_hidden: int = 0
    mlp: str = "swiglu"
    mlp_hidden: int = 0
    tie_embeddings: bool = True
    branches: str = "cmp,sel,win"
    attention: str = "nsa"
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02
    seed: int = 1337

    @classmethod
    def from_fields(cls, values):
        """From the text fields a checkpoint's state.json holds (model_config_fields); checkpoints
        written before `attention` existed are nsa."""
        kinds = {f.name: f.type for f in fields(cls)}
        out = {}
        for k, v in values.items():
            if k not in kinds:
                raise ValueError("model config field '%s' is unknown" % k)
            kind = kinds[k]
            out[k] = (v in ("true", "1")) if kind in (bool, "bool") else type(getattr(cls, k))(v)
        return cls(**out)

    def ffn_hidden(self):
        if self.mlp_hidden > 0:
            return self.mlp_hidden
        if self.mlp == "silu":
            return 4 * self.dim
        return ((8 * self.dim + 2) // 3 + 63) // 64 * 64


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def positions(T, S, cu_seqlens, device=None):
    """Each token's position inside its sequence: batch rows of S, or the documents of cu (on
    `device`; a device cu_seqlens stays there, with no host synchronisation)."""
    if cu_seqlens is None:
        return torch.arange(T, device=device) % S
    cu = torch.as_tensor(cu_seqlens, dtype=torch.int64).to(device)
    starts = torch.repeat_interleave(cu[:-1], cu[1:] - cu[:-1], output_size=T)
    return torch.arange(T, device=device) - starts


def rope(x, pos, base):
    """Rotates x [T, n, D] in pairs (2i, 2i + 1) by pos · base^(−2i/D) (src/cpu/ops/rope.cpp)."""
    D = x.shape[-1]
    inv = torch.pow(torch.tensor(base, dtype=torch.float64, device=x.device),
                    -2.0 * torch.arange(D // 2, dtype=torch.float64, device=x.device) / D)
    theta = pos.to(torch.float64)[:, None] * inv[None, :]
    c, s = torch.cos(theta).to(x.dtype)[:, None, :], torch.sin(theta).to(x.dtype)[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).reshape(x.shape)


class PhiMlp(nn.Module):
    """The φ = mlp compressor of one tensor kind (docs/nsa.md): pos, w1, b1, w2, b2."""

    def __init__(self, l, D, hidden):
        super().__init__()
        self.pos = nn.Parameter(torch.zeros(l, D))
        self.w1 = nn.Parameter(torch.zeros(l * D, hidden))
        self.b1 = nn.Parameter(torch.zeros(hidden))
        self.w2 = nn.Parameter(torch.zeros(hidden, D))
        self.b2 = nn.Parameter(torch.zeros(D))

    def reset_parameters(self, std):
        nn.init.normal_(self.pos, std=std)
        nn.init.normal_(self.w1, std=self.w1.shape[0] ** -0.5)
        nn.init.normal_(self.w2, std=self.w2.shape[0] ** -0.5)
        nn.init.zeros_(self.b1)
        nn.init.zeros_(self.b2)

    def params(self):
        return (self.pos, self.w1, self.b1, self.w2, self.b2)


class NativeSparseAttention(nn.Module):
    """Projections, RoPE, gates, NSA, output projection: `layers.{i}.attention` of our model.

    forward(x [B, S, dim] or packed [T, dim] with cu_seqlens) → [same leading dims, dim].
    attention: nsa (all branches), full (the window branch alone, its window covering every
    position: causal dense attention) or window (the window branch alone), as in
    include/nsa/model_config.h; the other branches' gates are 0.
    """

    def __init__(self, dim, heads, groups, dk, dv, *, l, d, l_sel, n_sel, w, scale=0.0,
                 phi="avg", kv="separate", gate="sigmoid", phi_hidden=0, rope_base=10000.0,
                 branches="cmp,sel,win", attention="nsa"):
        super().__init__()
        if attention not in ("nsa", "full", "window"):
            raise ValueError("attention = '%s' is not one of: nsa, full, window" % attention)
        self.heads, self.groups, self.dk, self.dv = heads, groups, dk, dv
        self.hp = dict(l=l, d=d, l_sel=l_sel, n_sel=n_sel, w=w, scale=scale or None)
        self.phi, self.kv, self.gate, self.rope_base = phi, kv, gate, rope_base
        self.mode = attention
        self.enabled = [c in branches.split(",") if attention == "nsa" else c == "win"
                        for c in BRANCHES]
        self.wq = nn.Linear(dim, heads * dk, bias=False)
        for c in ("",) if kv == "shared" else ("_cmp", "_sel", "_win"):
            setattr(self, "wk" + c, nn.Linear(dim, groups * dk, bias=False))
            setattr(self, "wv" + c, nn.Linear(dim, groups * dv, bias=False))
        self.wg = nn.Linear(dim, 3 * heads)  # rows h·3 + c
        self.wo = nn.Linear(heads * dv, dim, bias=False)
        if phi == "mlp":
            self.phi_k = PhiMlp(l, dk, phi_hidden or dk)
            self.phi_v = PhiMlp(l, dv, phi_hidden or dk)  # one width for both: mlp_hidden()

    @classmethod
    def from_config(cls, cfg):
        return cls(cfg.dim, cfg.heads, cfg.groups, cfg.dk, cfg.dv, l=cfg.l, d=cfg.d,
                   l_sel=cfg.l_sel, n_sel=cfg.n_sel, w=cfg.w, scale=cfg.scale, phi=cfg.phi,
                   kv=cfg.kv, gate=cfg.gate, phi_hidden=cfg.phi_hidden, rope_base=cfg.rope_base,
                   branches=cfg.branches, attention=cfg.attention)

    def reset_parameters(self, std=0.02, residual_std=None):
        """model_params.cpp's initialisation: N(0, std) matrices, wo at residual_std, zero bias."""
        for name, p in self.named_parameters():
            if name.startswith("phi_"):
                continue
            if name == "wg.bias":
                nn.init.zeros_(p)
            elif name == "wo.weight" and residual_std:
                nn.init.normal_(p, std=residual_std)
            else:
                nn.init.normal_(p, std=std)
        if self.phi == "mlp":
            self.phi_k.reset_parameters(std)
            self.phi_v.reset_parameters(std)

    def forward(self, x, cu_seqlens=None, return_sel_idx=False):
        lead = x.shape[:-1]
        T, S = lead.numel(), lead[-1]
        h = x.reshape(T, x.shape[-1])
        pos = positions(T, S, cu_seqlens, x.device)
        q = rope(self.wq(h).view(T, self.heads, self.dk), pos, self.rope_base)
        kv = {}
        for c in ("",) if self.kv == "shared" else ("_cmp", "_sel", "_win"):
            k = getattr(self, "wk" + c)(h).view(T, self.groups, self.dk)
            kv["k" + (c or "_cmp")] = rope(k, pos, self.rope_base)
            kv["v" + (c or "_cmp")] = getattr(self, "wv" + c)(h).view(T, self.groups, self.dv)
        logits = self.wg(h).view(T, self.heads, 3)
        gates = torch.sigmoid(logits) if self.gate == "sigmoid" else torch.softmax(logits, -1)
        g = {"g_" + c: gates[..., i] if self.enabled[i] else torch.zeros_like(gates[..., i])
             for i, c in enumerate(BRANCHES)}
        phi = {}
        if self.phi == "mlp":
            phi = dict(phi_k=self.phi_k.params(), phi_v=self.phi_v.params())
        cu = torch.arange(0, T + 1, S, device=x.device) if cu_seqlens is None else cu_seqlens
        hp = dict(self.hp)
        if self.mode == "full":  # the window covers every sequence (ModelConfig::layer_attention)
            hp["w"] = max(hp["w"], int(T))
        o, sel = attention(q, kv.pop("k_cmp"), kv.pop("v_cmp"), **kv, **g, cu_seqlens=cu,
                           kv=self.kv, phi=self.phi, **phi, return_sel_idx=True, **hp)
        out = self.wo(o.reshape(T, self.heads * self.dv)).reshape(*lead, -1)
        return (out, sel.reshape(*lead, self.groups, -1)) if return_sel_idx else out


class FeedForward(nn.Module):
    def __init__(self, dim, hidden, swiglu):
        super().__init__()
        self.swiglu = swiglu
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        if swiglu:
            self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        u = F.silu(self.w1(x))
        return self.w2(u * self.w3(x) if self.swiglu else u)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = NativeSparseAttention.from_config(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg.dim, cfg.ffn_hidden(), cfg.mlp == "swiglu")

    def forward(self, x, cu_seqlens=None):
        x = x + self.attention(self.attention_norm(x), cu_seqlens)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    """Embedding → blocks → final norm → head (tied to the embedding unless tie_embeddings is
    false); forward(tokens [B, S]) → logits [B, S, vocab]; loss(tokens, targets) → mean CE."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        if not cfg.tie_embeddings:
            self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self):
        std = self.cfg.init_std
        residual = std / math.sqrt(2.0 * self.cfg.n_layers)
        nn.init.normal_(self.tok_embeddings.weight, std=std)
        for layer in self.layers:
            layer.attention.reset_parameters(std, residual)
            nn.init.normal_(layer.feed_forward.w1.weight, std=std)
            nn.init.normal_(layer.feed_forward.w2.weight, std=residual)
            if layer.feed_forward.swiglu:
                nn.init.normal_(layer.feed_forward.w3.weight, std=std)
        if not self.cfg.tie_embeddings:
            nn.init.normal_(self.output.weight, std=std)

    def forward(self, tokens, cu_seqlens=None):
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, cu_seqlens)
        head = self.tok_embeddings.weight if self.cfg.tie_embeddings else self.output.weight
        return F.linear(self.norm(x), head)

    def loss(self, tokens, targets, cu_seqlens=None):
        logits = self.forward(tokens, cu_seqlens)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
