"""Plain-Python safetensors reading and writing (no extra dependency).

The format: an 8-byte little-endian header length N, N bytes of JSON mapping each tensor name to
its dtype, shape and [begin, end) byte offsets in the data that follows (plus an optional
"__metadata__" of strings), then the raw little-endian data. The reader validates what our C++
reader validates (src/io/safetensors.cpp): sizes against the file and against dtype × shape.
"""
import json
import struct

import numpy as np
import torch

_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
           "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


def read(path):
    """Returns ({name: torch.Tensor}, metadata dict). BF16 is widened to float32."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError("%s: %d bytes, too short for a safetensors header" % (path, len(blob)))
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ValueError("%s: header length %d runs past the end of the file (%d bytes)"
                         % (path, n, len(blob)))
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {}) or {}
    data = memoryview(blob)[8 + n:]
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        shape = [int(s) for s in info["shape"]]
        if not 0 <= begin <= end <= len(data):
            raise ValueError("%s: tensor '%s' has offsets [%d, %d) outside the data (%d bytes)"
                             % (path, name, begin, end, len(data)))
        raw = data[begin:end]
        count = int(np.prod(shape)) if shape else 1
        if info["dtype"] == "BF16":
            if end - begin != 2 * count:
                raise ValueError("%s: tensor '%s' has %d bytes for %s BF16"
                                 % (path, name, end - begin, shape))
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        elif info["dtype"] in _DTYPES:
            dt = np.dtype(_DTYPES[info["dtype"]]).newbyteorder("<")
            need = dt.itemsize * count
            if end - begin != need:
                raise ValueError("%s: tensor '%s' has %d bytes, but %s %s needs %d"
                                 % (path, name, end - begin, info["dtype"], shape, need))
            arr = np.frombuffer(raw, dtype=dt)
        else:
            raise ValueError("%s: tensor '%s' has unsupported dtype %s"
                             % (path, name, info["dtype"]))
        native = arr.astype(arr.dtype.newbyteorder("="), copy=True)
        out[name] = torch.from_numpy(native.reshape(shape))
    return out, meta


def write(path, tensors, metadata=None):
    """Writes {name: tensor} (float32/64, int32/64, ...) and string metadata to path."""
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        arr = np.ascontiguousarray(t.detach().cpu().numpy())
        raw = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": _NAMES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))
