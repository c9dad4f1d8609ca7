"""Weights I/O: state dicts, pretrained directories (single file or sharded), recurrent states.

    load_state_dict(path)                  name -> tensor from .safetensors, .pth/.pt/.bin, memory-mapped
    save_state_dict(state_dict, path)      .safetensors (through the safetensors library)
    check_state_dict(expected_shapes, sd)  KeyError / ValueError naming a missing, unexpected or misshapen tensor
    load_pretrained_dir(local_dir)         (config dict, state dict) of a Hugging Face model directory
    save_pretrained_dir(local_dir, config, state_dict)
    save_state(state, path), load_state(path)   a model's recurrent state on disk, to resume from later
    atomic_write(path), write_text_atomically(path, text)   every writer's way to replace a file (see below)

Loading costs about the file's own size: safetensors files are memory-mapped by the safetensors library
(https://huggingface.co/docs/safetensors) and torch's zip checkpoints by torch.load(mmap=True, weights_only=True),
so a tensor is a view of the file's pages until something writes to it. The models build their modules on the
meta device and take these tensors as their parameters (models/base.py), so the weights are never held twice.
A sharded directory (model.safetensors.index.json or pytorch_model.bin.index.json, as transformers writes every
checkpoint above a few GB) lists its shards in "weight_map"; a shard name that leaves the directory is refused.

Every file the project writes goes through atomic_write: a temporary file in the same folder, then os.replace. A
reader sees the old file or the new one, never half of one; a run that fails part-way leaves the old file; and a
save over the very file a model was memory-mapped from works, because the old file's pages live on (unlinked)
until nothing maps them. torch.save(model.state_dict(), path) onto the checkpoint the model was loaded from does
not: it truncates the file whose pages it is about to read (SIGBUS, and the checkpoint is lost). Save with
save_state_dict, which writes a .pth/.pt/.bin in torch's format and anything else as .safetensors, atomically.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
import warnings
import zipfile

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

__all__ = ["load_state_dict", "save_state_dict", "check_state_dict", "load_pretrained_dir", "save_pretrained_dir",
           "read_json", "save_state", "load_state", "atomic_write", "write_text_atomically", "WEIGHT_FILES"]

# Weight files of a saved Hugging Face model directory, in the order they are looked for; each may instead be
# sharded, with an index "<name>.index.json" beside its shards.
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_ZIP_MAGIC = b"PK\x03\x04"           # torch.save's format since torch 1.6 is a zip archive
TORCH_SUFFIXES = (".pth", ".pt", ".bin")


@contextlib.contextmanager
def atomic_write(path):
    """Replace ``path`` atomically: yields a temporary file name in the same folder (the same file system, so the
    rename cannot copy); write the new content there. When the block ends without an error the file is moved
    onto ``path`` with os.replace and takes the old file's permissions (or the umask's, for a new file); on an
    error it is removed and ``path`` is untouched.

    Raises:
        NotADirectoryError / FileNotFoundError naming the folder when it is not an existing folder;
        IsADirectoryError when ``path`` is a folder.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise (NotADirectoryError if os.path.exists(folder) else FileNotFoundError)(
            f"{path}: cannot write it, {folder} is not an existing folder")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: is a folder, not a file name")
    with _temporary_file(folder, os.path.splitext(path)[1]) as tmp:
        yield tmp
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)


def _mode_for(path: str) -> int:
    """The permissions a replaced file keeps: the old file's, or what open() would give a new one (mkstemp's
    temporary files are 0600, which would hide a shared results file from its readers)."""
    if os.path.exists(path):
        return os.stat(path).st_mode & 0o7777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_text_atomically(path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through atomic_write."""
    with atomic_write(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


def read_json(path, what: str = "a JSON object") -> dict:
    """The JSON object in ``path``. Raises ValueError naming the file when it is not JSON or not an object."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{os.fspath(path)}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{os.fspath(path)}: expected {what}, got a JSON {type(data).__name__}")
    return data


def _load_torch_file(path: str) -> dict:
    with open(path, "rb") as f:
        is_zip = f.read(4) == _ZIP_MAGIC
    if is_zip and not zipfile.is_zipfile(path):
        raise ValueError(f"{path}: a torch zip checkpoint that is truncated or damaged (no central directory)")
    if not is_zip:
        warnings.warn(f"{path}: a legacy (pre-zip) torch checkpoint: it is read whole into memory, without mmap; "
                      f"re-save it with torch.save or as .safetensors to load it memory-mapped", stacklevel=3)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=is_zip)
    except Exception as e:                     # torch raises RuntimeError, EOFError, UnpicklingError, OSError, ...
        raise ValueError(f"{path}: cannot be read as a torch checkpoint ({type(e).__name__}: {e})") from None


def load_state_dict(path) -> dict[str, torch.Tensor]:
    """Read the tensors of a checkpoint file, memory-mapped, in their stored dtype, on the CPU.

    Args:
        path: a ``.safetensors`` file, or a torch checkpoint (``.pth``, ``.pt``, ``.bin``) holding a dict of
            name -> tensor. Torch's zip format is memory-mapped (``torch.load(mmap=True, weights_only=True)``); a
            legacy (pre-zip) file is read whole, with a warning. ``weights_only`` means a pickle cannot run code.

    Returns:
        dict name -> tensor; each tensor is a copy-on-write view of the file's pages.

    Raises:
        FileNotFoundError if the file does not exist; ValueError naming the file if it is damaged, truncated or
        not a dict of tensors (for safetensors: a header that is not a JSON object, overlapping or out-of-range
        data offsets, ...).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such checkpoint file")
    if path.endswith(".safetensors"):
        try:
            return load_file(path)
        except SafetensorError as e:
            raise ValueError(f"{path}: not a valid safetensors file ({e})") from None
    state_dict = _load_torch_file(path)
    if not isinstance(state_dict, dict) or not all(isinstance(v, torch.Tensor) for v in state_dict.values()):
        raise ValueError(f"{path}: expected a dict of name -> tensor, got {type(state_dict).__name__}")
    return dict(state_dict)


def save_state_dict(state_dict: dict[str, torch.Tensor], path) -> None:
    """Write tensors as a torch checkpoint (a path ending in .pth, .pt or .bin: torch.save's zip format, what
    BlinkDL's RWKV-7 checkpoints are) or else as ``.safetensors`` (metadata {"format": "pt"}, as transformers
    writes), atomically (atomic_write): saving over the file the tensors are memory-mapped from is safe.

    Args:
        state_dict: name -> tensor. Tensors that share memory (tied weights) must be passed under one name only.
        path: the file to write (replaced if it exists).
    """
    tensors = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
    with atomic_write(path) as tmp:
        if os.fspath(path).endswith(TORCH_SUFFIXES):
            torch.save(tensors, tmp)
        else:
            save_file(tensors, tmp, metadata={"format": "pt"})


def check_state_dict(expected_shapes: dict[str, tuple], state_dict: dict[str, torch.Tensor]) -> None:
    """Check a state dict's names and shapes against a model's.

    Args:
        expected_shapes: name -> shape, every tensor the model needs.
        state_dict: name -> tensor, as read from a checkpoint.

    Raises:
        KeyError naming the first missing tensor or the unexpected ones; ValueError naming a tensor whose shape
        differs from the expected one (and both shapes); TypeError naming a tensor that is not floating point
        (every model weight is: integer weights are a quantized or a damaged checkpoint, not something to cast).
    """
    for name, shape in expected_shapes.items():
        if name not in state_dict:
            raise KeyError(f"checkpoint is missing tensor {name!r} (expected shape {tuple(shape)})")
        if not state_dict[name].is_floating_point():
            raise TypeError(f"checkpoint tensor {name!r} has dtype {state_dict[name].dtype}, expected a floating-point "
                            f"dtype")
        if tuple(state_dict[name].shape) != tuple(shape):
            raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(state_dict[name].shape)}, expected "
                             f"{tuple(shape)}")
    extra = sorted(set(state_dict) - set(expected_shapes))
    if extra:
        raise KeyError(f"checkpoint has unexpected tensor(s) {extra[:5]}{' ...' if len(extra) > 5 else ''}")


def _shard_path(local_dir: str, index_path: str, shard) -> str:
    """The path of a shard named in an index, refused unless it is a relative name inside local_dir."""
    if not isinstance(shard, str) or not shard:
        raise ValueError(f"{index_path}: shard names must be non-empty strings, got {shard!r}")
    path = os.path.normpath(os.path.join(local_dir, shard))
    if os.path.isabs(shard) or os.path.commonpath([os.path.abspath(local_dir), os.path.abspath(path)]) != \
            os.path.abspath(local_dir):
        raise ValueError(f"{index_path}: shard {shard!r} lies outside the model directory {local_dir}")
    return path


def _index_shards(local_dir: str, index_path: str) -> dict[str, list[str]]:
    """shard path -> the tensor names the index assigns to it."""
    weight_map = read_json(index_path, "a sharded checkpoint index (an object with a weight_map)").get("weight_map")
    if not isinstance(weight_map, dict):
        raise ValueError(f"{index_path}: no \"weight_map\" object of tensor name -> shard file")
    shards: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        shards.setdefault(_shard_path(local_dir, index_path, shard), []).append(name)
    return shards


def _load_sharded(local_dir: str, index_path: str) -> dict[str, torch.Tensor]:
    """The tensors the index lists, each from the shard it names: the index is the checkpoint's list of tensors
    (as for transformers), so a tensor a shard holds but the index does not list is not read."""
    state_dict = {}
    for shard, names in _index_shards(local_dir, index_path).items():
        tensors = load_state_dict(shard)
        missing = sorted(set(names) - set(tensors))
        if missing:
            raise KeyError(f"{shard}: missing tensor(s) {missing[:5]} that {os.path.basename(index_path)} "
                           f"places in it")
        state_dict.update({k: tensors[k] for k in names})
    return state_dict


def load_pretrained_dir(local_dir) -> tuple[dict, dict[str, torch.Tensor]]:
    """Read a saved Hugging Face model directory (ours, transformers' or flash-linear-attention's).

    Args:
        local_dir: a directory with config.json and model.safetensors or pytorch_model.bin, or the shards listed in
            model.safetensors.index.json / pytorch_model.bin.index.json.

    Returns:
        (config.json as a dict, state dict name -> tensor, memory-mapped, in the stored dtypes).

    Raises:
        FileNotFoundError when the directory, config.json or every weight file is missing; ValueError naming the
        file when one is damaged or an index names a shard outside the directory.
    """
    local_dir = os.fspath(local_dir)
    if not os.path.isdir(local_dir):
        raise FileNotFoundError(f"{local_dir}: not a directory (from_pretrained reads a saved model directory)")
    config_path = os.path.join(local_dir, "config.json")
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"{local_dir}: no config.json")
    config = read_json(config_path, "a config object")
    for weights in WEIGHT_FILES:
        if os.path.isfile(os.path.join(local_dir, weights)):
            return config, load_state_dict(os.path.join(local_dir, weights))
        index = os.path.join(local_dir, weights + ".index.json")
        if os.path.isfile(index):
            return config, _load_sharded(local_dir, index)
    raise FileNotFoundError(f"{local_dir}: none of {list(WEIGHT_FILES)} (or their .index.json) found")


@contextlib.contextmanager
def _temporary_file(directory: str, suffix: str):
    """A fresh file name in ``directory``, removed on the way out unless it was moved away."""
    fd, path = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=suffix)
    os.close(fd)
    try:
        yield path
    finally:
        if os.path.exists(path):
            os.remove(path)


def _superseded_files(local_dir: str) -> list[str]:
    """What an older save may have left that a new model.safetensors replaces: pytorch_model.bin, and every index
    with the shards it lists (only those inside the directory), never the two files the save itself writes (an
    index may name model.safetensors as its shard; removing it would delete the weights just written)."""
    found = [os.path.join(local_dir, "pytorch_model.bin")]
    for weights in WEIGHT_FILES:
        index = os.path.join(local_dir, weights + ".index.json")
        if os.path.isfile(index):
            with contextlib.suppress(ValueError):          # a damaged index: remove it, keep the files it names
                found += list(_index_shards(local_dir, index))
            found.append(index)
    written = {os.path.realpath(os.path.join(local_dir, name)) for name in ("model.safetensors", "config.json")}
    return [path for path in found if os.path.isfile(path) and os.path.realpath(path) not in written]


def save_pretrained_dir(local_dir, config: dict, state_dict: dict[str, torch.Tensor]) -> None:
    """Write config.json and model.safetensors into local_dir (created if needed), atomically.

    Both files are written to temporary files in the directory first, then moved into place with os.replace,
    weights first: a save that fails part-way (an unsupported dtype, a full disk, Ctrl-C) leaves the directory as it
    was, loadable. Weight files of an older save that the new model.safetensors supersedes (pytorch_model.bin,
    sharded indexes and their shards) are removed afterwards; other files (README, tokenizer) are kept.

    Args:
        local_dir: the model directory.
        config: what config.json should hold (JSON-serializable).
        state_dict: name -> tensor, tied weights under one name only.
    """
    local_dir = os.fspath(local_dir)
    os.makedirs(local_dir, exist_ok=True)
    stale = _superseded_files(local_dir)
    # Nested: the inner block (the weights) is moved into place first, then the config.
    with atomic_write(os.path.join(local_dir, "config.json")) as config_tmp, \
            atomic_write(os.path.join(local_dir, "model.safetensors")) as weights_tmp:
        with open(config_tmp, "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, sort_keys=True)
        save_state_dict(state_dict, weights_tmp)       # a .safetensors name: that format
    for path in stale:
        os.remove(path)


def save_state(state, path) -> None:
    """Save a model's recurrent state (as returned by forward or generate) to a file, to resume from it later.

    Args:
        state: a list of tensors or of tuples of tensors (RWKV-4, RWKV-7, Mamba).
        path: the file to write (torch's format), replaced atomically (atomic_write): saving over the state file
            the run started from is safe.
    """
    with atomic_write(path) as tmp:
        torch.save(state, tmp)


def load_state(path):
    """A state saved by save_state, on the CPU (weights_only: the file cannot run code).

    Args:
        path: the file written by save_state.

    Returns:
        the state, to pass as ``state=`` to the same model's forward or generate.
    """
    path = os.fspath(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"{path}: cannot be read as a saved state ({type(e).__name__}: {e})") from None
