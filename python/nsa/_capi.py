"""ctypes binding of the C ABI (src/capi/nsa_capi.h): the structs, the library lookup, errors.

ctypes rather than a compiled extension so that one build of libnsa_capi works with any PyTorch
and Python version. The library is found through $NSA_CAPI_LIB, else in the repository's build
folders (build/, build-cpu/).
"""
import ctypes
import os
from pathlib import Path

import torch

NSA_CAPI_VERSION = 1
_LIB_NAME = "libnsa_capi.so"


class NsaError(ValueError):
    """An invalid argument: the message is nsa::Error's text and names the tensor or field."""


class TensorRef(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("ndim", ctypes.c_int64), ("shape", ctypes.c_int64 * 4)]


class AttnConfig(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in
                ("heads", "groups", "dk", "dv", "l", "d", "l_sel", "n_sel", "w", "phi_hidden")] + [
        ("scale", ctypes.c_double), ("phi", ctypes.c_int32), ("kv", ctypes.c_int32)]


class AttnTensors(ctypes.Structure):
    _fields_ = [("q", TensorRef), ("k", TensorRef * 3), ("v", TensorRef * 3),
                ("g", TensorRef * 3), ("phi_k", TensorRef * 5), ("phi_v", TensorRef * 5)]


class AttnSaved(ctypes.Structure):
    _fields_ = [("o", TensorRef), ("o_branch", TensorRef * 3), ("lse", TensorRef * 3),
                ("k_cmp", TensorRef), ("v_cmp", TensorRef), ("sel_idx", TensorRef)]


def ref(t):
    """A TensorRef of a contiguous CPU tensor (None: absent). The tensor must outlive the call."""
    r = TensorRef()
    if t is None:
        return r
    assert t.is_contiguous() and t.device.type == "cpu" and t.dim() <= 4
    r.data = t.data_ptr()
    r.ndim = t.dim()
    for i, s in enumerate(t.shape):
        r.shape[i] = s
    return r


def _candidates():
    env = os.environ.get("NSA_CAPI_LIB")
    if env:
        return [Path(env)]
    repo = Path(__file__).resolve().parents[2]
    return [Path(__file__).resolve().parent / _LIB_NAME] + [
        repo / b / _LIB_NAME for b in ("build", "build-cpu")]


def _load():
    tried = _candidates()
    for path in tried:
        if path.is_file():
            lib = ctypes.CDLL(str(path))
            break
    else:
        raise ImportError(
            "nsa: the C library %s was not found (tried %s); build it with "
            "'cmake --build build --target nsa_capi' or set NSA_CAPI_LIB to its path"
            % (_LIB_NAME, ", ".join(str(p) for p in tried)))
    lib.nsa_capi_version.restype = ctypes.c_int32
    if lib.nsa_capi_version() != NSA_CAPI_VERSION:
        raise ImportError("nsa: %s has C ABI version %d, this package needs %d; rebuild it"
                          % (path, lib.nsa_capi_version(), NSA_CAPI_VERSION))
    P = ctypes.POINTER
    err = [ctypes.c_char_p, ctypes.c_size_t]
    lib.nsa_compressed_tokens.argtypes = [P(AttnConfig), P(ctypes.c_int64), ctypes.c_int64,
                                          P(ctypes.c_int64)] + err
    lib.nsa_attention_forward_cpu.argtypes = [P(AttnConfig), ctypes.c_int32, P(ctypes.c_int64),
                                              ctypes.c_int64, P(AttnTensors), P(AttnSaved)] + err
    lib.nsa_attention_backward_cpu.argtypes = [
        P(AttnConfig), ctypes.c_int32, P(ctypes.c_int64), ctypes.c_int64, P(AttnTensors),
        P(AttnSaved), P(TensorRef), P(AttnTensors)] + err
    for f in (lib.nsa_compressed_tokens, lib.nsa_attention_forward_cpu,
              lib.nsa_attention_backward_cpu):
        f.restype = ctypes.c_int32
    return lib, path


LIB, LIB_PATH = _load()


def call(fn, *args):
    """Calls a C ABI entry point; raises NsaError with the library's message on failure."""
    buf = ctypes.create_string_buffer(4096)
    status = fn(*args, buf, len(buf))
    if status != 0:
        raise NsaError(buf.value.decode("utf-8", "replace"))


def dtype_code(dtype):
    return {torch.float32: 0, torch.float64: 1}[dtype]
