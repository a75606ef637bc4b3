"""Native Sparse Attention for PyTorch, over the nsa C++ reference (docs/pytorch.md).

nsa.attention is the op: a torch.autograd.Function over the C ABI (src/capi/nsa_capi.h).
NativeSparseAttention is our model's attention block, Transformer the whole model.
"""
from ._capi import NsaError, LIB_PATH
from .ops import attention, NsaAttentionFunction
from .model import ModelConfig, NativeSparseAttention, Transformer

__all__ = ["attention", "NsaAttentionFunction", "NsaError", "LIB_PATH", "ModelConfig",
           "NativeSparseAttention", "Transformer"]
