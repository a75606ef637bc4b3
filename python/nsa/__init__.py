"""Native Sparse Attention for PyTorch, over the nsa C++ reference (docs/pytorch.md).

nsa.attention is the op: a torch.autograd.Function over the C ABI (src/capi/nsa_capi.h).
"""
from ._capi import NsaError, LIB_PATH
from .ops import attention, NsaAttentionFunction

__all__ = ["attention", "NsaAttentionFunction", "NsaError", "LIB_PATH"]
