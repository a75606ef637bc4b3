"""Native Sparse Attention for PyTorch, over the nsa C++ reference and CUDA kernels
(docs/pytorch.md).

nsa.attention is the op: over the C ABI (src/capi/nsa_capi.h), a torch.autograd.Function on CPU
tensors and custom ops (nsa/_cuda.py) on CUDA tensors.
NativeSparseAttention is our model's attention block, Transformer the whole model; load_model
builds one from a checkpoint of ours and evaluate_loss gives `nsa eval`'s validation loss.
"""
from ._capi import NsaError, NsaUnavailableError, LIB_PATH
from .ops import attention, NsaAttentionFunction
from .model import ModelConfig, NativeSparseAttention, Transformer
from .checkpoint import evaluate_loss, load_model

__all__ = ["attention", "NsaAttentionFunction", "NsaError", "NsaUnavailableError", "LIB_PATH",
           "ModelConfig", "NativeSparseAttention", "Transformer", "evaluate_loss", "load_model"]
