"""ctypes binding of the C ABI (src/capi/nsa_capi.h): the structs, the library lookup, errors.

ctypes rather than a compiled extension so that one build of libnsa_capi works with any PyTorch
and Python version. The library is found through $NSA_CAPI_LIB, else in the repository's build
folders (build/, build-cpu/).
"""
import ctypes
import os
from pathlib import Path

import torch

NSA_CAPI_VERSION = 3
_LIB_NAME = "libnsa_capi.so"
_ERR_UNAVAILABLE = 3


class NsaError(ValueError):
    """An invalid argument: the message is nsa::Error's text and names the tensor or field."""


class NsaUnavailableError(RuntimeError):
    """The backend asked for is not there: a library built without CUDA, no GPU, not sm_90."""


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


def ref(t, device="cpu"):
    """A TensorRef of a contiguous tensor on `device`'s type (None: absent). The tensor must
    outlive the call."""
    r = TensorRef()
    fill(r, t, device)
    return r


def fill(r, t, device="cpu"):
    """Writes t into the TensorRef r in place (None: leaves r as it is, absent when fresh) – a
    struct's embedded refs are filled this way, without a temporary and its copy (~30 a call:
    the op's host time)."""
    if t is None:
        return
    shape = t.shape
    assert len(shape) <= 4 and t.is_contiguous() and t.is_cuda == (device == "cuda")
    r.data = t.data_ptr()
    r.ndim = len(shape)
    r.shape[:len(shape)] = shape  # one slice store


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
    lib.nsa_attention_forward_cpu_given_selection.argtypes = [
        P(AttnConfig), ctypes.c_int32, P(ctypes.c_int64), ctypes.c_int64, P(AttnTensors),
        P(TensorRef), P(AttnSaved)] + err
    lib.nsa_cuda_available.argtypes = err
    lib.nsa_cuda_compressed_rows.argtypes = [P(AttnConfig), ctypes.c_int64, ctypes.c_int64,
                                             P(ctypes.c_int64)] + err
    lib.nsa_cuda_workspace_bytes.argtypes = [P(AttnConfig), ctypes.c_int64, ctypes.c_int64,
                                             ctypes.c_int32, ctypes.c_int32,
                                             P(ctypes.c_size_t)] + err
    cuda_tail = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32, ctypes.c_void_p] + err
    lib.nsa_attention_forward_cuda.argtypes = [P(AttnConfig), ctypes.c_void_p, ctypes.c_int64,
                                               P(AttnTensors), P(AttnSaved)] + cuda_tail
    lib.nsa_attention_backward_cuda.argtypes = [
        P(AttnConfig), ctypes.c_void_p, ctypes.c_int64, P(AttnTensors), P(AttnSaved),
        P(TensorRef), P(AttnTensors)] + cuda_tail
    lib.nsa_attention_backward_cuda_bf16.argtypes = lib.nsa_attention_backward_cuda.argtypes
    for f in (lib.nsa_compressed_tokens, lib.nsa_attention_forward_cpu,
              lib.nsa_attention_backward_cpu, lib.nsa_attention_forward_cpu_given_selection,
              lib.nsa_cuda_available, lib.nsa_cuda_compressed_rows, lib.nsa_cuda_workspace_bytes,
              lib.nsa_attention_forward_cuda, lib.nsa_attention_backward_cuda,
              lib.nsa_attention_backward_cuda_bf16):
        f.restype = ctypes.c_int32
    return lib, path


LIB, LIB_PATH = _load()


def call(fn, *args):
    """Calls a C ABI entry point; raises NsaError (NsaUnavailableError when the backend is not
    there) with the library's message on failure."""
    buf = ctypes.create_string_buffer(4096)
    status = fn(*args, buf, len(buf))
    if status != 0:
        message = buf.value.decode("utf-8", "replace")
        raise (NsaUnavailableError if status == _ERR_UNAVAILABLE else NsaError)(message)


def cuda_available():
    """None when the library's CUDA entry points can run here, else the reason."""
    buf = ctypes.create_string_buffer(1024)
    if LIB.nsa_cuda_available(buf, len(buf)) == 0:
        return None
    return buf.value.decode("utf-8", "replace")


def dtype_code(dtype):
    return {torch.float32: 0, torch.float64: 1}[dtype]
