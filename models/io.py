"""Weights I/O: state dicts and pretrained directories, without transformers or the safetensors package.

    load_state_dict(path) -> dict          .safetensors (parsed here), .bin/.pt/.pth (torch.load, weights_only)
    save_state_dict(state_dict, path)      .safetensors
    check_state_dict(expected_shapes, sd)  KeyError / ValueError naming a missing, unexpected or misshapen tensor
    load_pretrained_dir(local_dir)         (config dict, state dict) of a saved Hugging Face model directory
    save_pretrained_dir(local_dir, config, state_dict)

The safetensors layout (https://huggingface.co/docs/safetensors): an 8-byte little-endian unsigned header length
n, then n bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the
raw little-endian tensor bytes; offsets count from the end of the header.
"""
from __future__ import annotations

import json
import os
import struct
import sys

import torch

__all__ = ["load_state_dict", "save_state_dict", "check_state_dict", "load_pretrained_dir", "save_pretrained_dir"]

SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
_DTYPE_NAMES = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}
# Weight files of a saved Hugging Face model directory, in the order they are looked for.
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_MAX_HEADER = 100 * 2**20   # the format's own limit on the JSON header (100 MB)


def _check_little_endian():
    if sys.byteorder != "little":
        raise RuntimeError("reading/writing safetensors here assumes a little-endian machine")


def _load_safetensors(path: str) -> dict[str, torch.Tensor]:
    _check_little_endian()
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: too short to be a safetensors file ({len(data)} bytes)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > min(_MAX_HEADER, len(data) - 8):
        raise ValueError(f"{path}: header length {n} does not fit the file ({len(data)} bytes)")
    try:
        header = json.loads(data[8:8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: the header is not valid JSON ({e})") from None
    body = memoryview(data)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info.get('dtype')!r}")
        shape, (begin, end) = tuple(info["shape"]), info["data_offsets"]
        numel = 1
        for s in shape:
            numel *= s
        itemsize = torch.empty((), dtype=dtype).element_size()
        if not 0 <= begin <= end <= len(body) or end - begin != numel * itemsize:
            raise ValueError(f"{path}: tensor {name!r} of dtype {info['dtype']} and shape {list(shape)} needs "
                             f"{numel * itemsize} bytes, its data_offsets are [{begin}, {end}] in a body of "
                             f"{len(body)} bytes")
        # A copy per tensor: each owns writable, suitably aligned memory (frombuffer refuses an empty buffer).
        flat = torch.frombuffer(bytearray(body[begin:end]), dtype=dtype) if end > begin else torch.empty(0, dtype=dtype)
        out[name] = flat.reshape(shape)
    return out


def load_state_dict(path) -> dict[str, torch.Tensor]:
    """name -> tensor from a .safetensors file (parsed here) or a torch pickle (.bin, .pt, .pth; loaded with
    weights_only=True, so a pickle cannot run code). Tensors are on the CPU, in their stored dtype."""
    path = os.fspath(path)
    if path.endswith(".safetensors"):
        return _load_safetensors(path)
    state_dict = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state_dict, dict) or not all(isinstance(v, torch.Tensor) for v in state_dict.values()):
        raise ValueError(f"{path}: expected a dict of name -> tensor, got {type(state_dict).__name__}")
    return dict(state_dict)


def save_state_dict(state_dict: dict[str, torch.Tensor], path) -> None:
    """Write name -> tensor as a .safetensors file (metadata {"format": "pt"}, as transformers writes).
    Tensors that share memory (tied weights) are written once each, under every name: pass only the names wanted."""
    _check_little_endian()
    header, chunks, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in state_dict.items():
        if t.dtype not in _DTYPE_NAMES:
            raise TypeError(f"tensor {name!r}: dtype {t.dtype} has no safetensors name")
        raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)          # pad so that the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for raw in chunks:
            f.write(raw)


def check_state_dict(expected_shapes: dict[str, tuple], state_dict: dict[str, torch.Tensor]) -> None:
    """Raise KeyError naming the first missing or unexpected tensor, or ValueError naming a tensor whose shape
    differs from expected_shapes[name] (and both shapes)."""
    for name, shape in expected_shapes.items():
        if name not in state_dict:
            raise KeyError(f"checkpoint is missing tensor {name!r} (expected shape {tuple(shape)})")
        if tuple(state_dict[name].shape) != tuple(shape):
            raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(state_dict[name].shape)}, expected "
                             f"{tuple(shape)}")
    extra = sorted(set(state_dict) - set(expected_shapes))
    if extra:
        raise KeyError(f"checkpoint has unexpected tensor(s) {extra[:5]}{' ...' if len(extra) > 5 else ''}")


def load_pretrained_dir(local_dir) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json as a dict, state dict) of a directory written by save_pretrained (ours or transformers'):
    model.safetensors or pytorch_model.bin, or shards listed in model.safetensors.index.json /
    pytorch_model.bin.index.json."""
    local_dir = os.fspath(local_dir)
    config_path = os.path.join(local_dir, "config.json")
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"{local_dir}: no config.json")
    with open(config_path) as f:
        config = json.load(f)
    for weights in WEIGHT_FILES:
        if os.path.isfile(os.path.join(local_dir, weights)):
            return config, load_state_dict(os.path.join(local_dir, weights))
        index = os.path.join(local_dir, weights + ".index.json")
        if os.path.isfile(index):
            with open(index) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
            state_dict = {}
            for shard in shards:
                state_dict.update(load_state_dict(os.path.join(local_dir, shard)))
            return config, state_dict
    raise FileNotFoundError(f"{local_dir}: none of {list(WEIGHT_FILES)} (or their .index.json) found")


def save_pretrained_dir(local_dir, config: dict, state_dict: dict[str, torch.Tensor]) -> None:
    """Write config.json and model.safetensors into local_dir (created if needed)."""
    local_dir = os.fspath(local_dir)
    os.makedirs(local_dir, exist_ok=True)
    with open(os.path.join(local_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    save_state_dict(state_dict, os.path.join(local_dir, "model.safetensors"))
