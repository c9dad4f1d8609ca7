"""Checkpoints, configs and the plumbing the torch models share (RWKV-4, Mamba, RWKV-7).

Weights, without transformers or the safetensors package:
    load_state_dict(path) -> dict          .safetensors (parsed here), .bin/.pt/.pth (torch.load, weights_only)
    save_state_dict(state_dict, path)      .safetensors
    check_state_dict(expected_shapes, sd)  KeyError / ValueError naming a missing, unexpected or misshapen tensor
    load_pretrained_dir(local_dir)         (config dict, state dict) of a saved Hugging Face model directory
    save_pretrained_dir(local_dir, config, state_dict)
Models:
    config_from_dict(cls, d), config_to_dict(config)   dataclass configs <-> config.json dicts
    check_positive_ints(config, names)     ValueError naming a config field that is not a positive int
    PretrainedMixin                        from_pretrained / save_pretrained / load_checkpoint
    GenerateMixin                          generate (kernels/models/generation.py) over a model's _step
    CausalLMMixin                          PretrainedMixin and GenerateMixin, with forward over a base model
    check_token_ids(input_ids, vocab_size), causal_lm_loss(logits, labels)
    token_shift(x, x_prev)                 x_{t-1} for every t, x_prev before the first
    ModelOutput, CausalLMOutput            what the models return

The safetensors layout (https://huggingface.co/docs/safetensors): an 8-byte little-endian unsigned header length
n, then n bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the
raw little-endian tensor bytes; offsets count from the end of the header.
"""
from __future__ import annotations

import dataclasses
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F

from kernels.models import generation

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


# ---------------------------------------------------------------------------------------------------------------
# What the models share.

@dataclasses.dataclass
class ModelOutput:
    """A base model's result. last_hidden_state: (B, T, C), after the final norm. state: the recurrent state after
    the last token (None when use_cache=False). hidden_states (on request): the output of every block, then the
    final norm's output, as transformers' RWKV and Mamba models return them."""
    last_hidden_state: torch.Tensor
    state: object = None
    hidden_states: tuple | None = None


@dataclasses.dataclass
class CausalLMOutput:
    """A causal LM's result: logits (B, T', V) (T' = T, or logits_to_keep), loss (when labels were given), and
    the base model's state and hidden_states."""
    logits: torch.Tensor
    loss: torch.Tensor | None = None
    state: object = None
    hidden_states: tuple | None = None


def config_from_dict(cls, config: dict):
    """An instance of the dataclass ``cls`` from a config.json dict. Keys that are not constructor fields of cls
    (transformers' bookkeeping: architectures, transformers_version, dtype, ...; derived fields such as Mamba's
    intermediate_size) are ignored; a config of another model type is refused."""
    model_type = config.get("model_type", cls.model_type)
    if model_type != cls.model_type:
        raise ValueError(f"config is for model_type {model_type!r}, expected {cls.model_type!r}")
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    return cls(**{k: v for k, v in config.items() if k in names})


def config_to_dict(config, architecture: str) -> dict:
    """config.json contents that transformers reads too (model_type, architectures)."""
    return dataclasses.asdict(config) | {"model_type": config.model_type, "architectures": [architecture]}


def check_positive_ints(config, names) -> None:
    """Raise ValueError naming the first of config's fields ``names`` that is not a positive int."""
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{type(config).__name__}.{name} must be a positive int, got {value!r}")


def token_shift(x: torch.Tensor, x_prev: torch.Tensor) -> torch.Tensor:
    """x_{t-1} for every t, with x_prev (B, C) standing before x_0 (cast to x's dtype). x: (B, T, C)."""
    return torch.cat([x_prev[:, None].to(x.dtype), x[:, :-1]], dim=1)


def check_token_ids(input_ids, vocab_size: int, name: str = "input_ids") -> torch.Tensor:
    """input_ids must be an integer tensor of shape (B, T), T >= 1, with every id in [0, vocab_size)."""
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(input_ids).__name__}")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {input_ids.dtype}")
    if input_ids.dim() != 2 or input_ids.shape[1] < 1:
        raise ValueError(f"{name} must have shape (B, T) with T >= 1, got {tuple(input_ids.shape)}")
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"{name} must lie in [0, {vocab_size}), got values in [{lo}, {hi}]")
    return input_ids


def causal_lm_loss(logits: torch.Tensor, labels) -> torch.Tensor:
    """Next-token cross-entropy: the mean over t of -log softmax(logits[:, t])[labels[:, t + 1]], skipping labels
    equal to -100 (labels are shifted here, so labels = input_ids is the usual call). Computed in fp32."""
    B, T, V = logits.shape
    if not isinstance(labels, torch.Tensor) or labels.shape != (B, T):
        raise ValueError(f"labels must be a tensor of shape ({B}, {T}), got "
                         f"{tuple(labels.shape) if isinstance(labels, torch.Tensor) else type(labels).__name__}")
    if not ((labels == -100) | ((labels >= 0) & (labels < V))).all():
        raise ValueError(f"labels must lie in [0, {V}) or be -100 (ignored)")
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, V), labels[:, 1:].reshape(-1).long(), ignore_index=-100)


class PretrainedMixin:
    """from_pretrained / save_pretrained / load_checkpoint for an nn.Module built as cls(config).

    Class attributes: config_class, a dataclass with a model_type class variable; base_model_prefix, the base
    model's attribute in the causal LM ("rwkv", "backbone"), so that a base model reads a causal-LM checkpoint;
    tied_weights, the names that share the embedding when config.tie_word_embeddings (transformers leaves them out
    of saved checkpoints, and so do we).
    """
    config_class: type
    base_model_prefix: str
    tied_weights: tuple = ()

    @classmethod
    def from_pretrained(cls, local_dir, dtype: torch.dtype = torch.float32):
        """The model saved in local_dir (config.json + model.safetensors or pytorch_model.bin, as written by our
        save_pretrained or transformers'), in eval mode, with parameters in dtype. Needs no transformers."""
        config, state_dict = load_pretrained_dir(local_dir)
        model = cls(config_from_dict(cls.config_class, config))
        model.load_checkpoint(state_dict)
        return model.to(dtype).eval()

    def save_pretrained(self, local_dir) -> None:
        """config.json + model.safetensors, readable by from_pretrained and by transformers."""
        tied = self._tied_names()
        save_pretrained_dir(local_dir, config_to_dict(self.config, type(self).__name__),
                            {k: v for k, v in self.state_dict().items() if k not in tied})

    def _tied_names(self) -> set:
        return set(self.tied_weights) if self.config.tie_word_embeddings else set()

    def load_checkpoint(self, state_dict: dict) -> None:
        """Copy a state dict into the parameters (converting dtypes) after checking every name and shape."""
        tied = self._tied_names()
        expected = {k: tuple(v.shape) for k, v in self.state_dict().items() if k not in tied}
        prefix = self.base_model_prefix + "."
        if not any(k.startswith(prefix) for k in expected) and any(k.startswith(prefix) for k in state_dict):
            # A base model reading a causal-LM checkpoint keeps the base model's part.
            state_dict = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        state_dict = {k: v for k, v in state_dict.items() if k not in tied}
        check_state_dict(expected, state_dict)
        self.load_state_dict(state_dict, strict=False)   # strict checking done above; tied names are absent


class GenerateMixin:
    """generate for a model with a method _step(tokens (B, t), state, backend) -> (logits of the last position
    (B, V), state after the last token)."""

    def _step(self, tokens, state, backend):
        raise NotImplementedError

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, state=None, temperature: float = 0.0,
                 top_p: float = 1.0, stop_sequences=(), generator: torch.Generator | None = None,
                 backend: str | None = None):
        """Continue input_ids (B, T) by up to max_new_tokens: greedy when temperature is 0, else sampling with
        temperature and top-p; a row ends after one of stop_sequences (e.g. [[187, 187]], "\\n\\n" in the GPT-NeoX
        tokenizer). The prompt is read once, then one forward of one token per new token, through the state.
        -> (tokens (B, T + n), state after the last token). See kernels/models/generation.py."""
        def step(tokens, step_state):
            return self._step(tokens, step_state, backend)
        return generation.generate(step, input_ids, max_new_tokens, state, temperature, top_p, stop_sequences,
                                   generator)


class CausalLMMixin(GenerateMixin, PretrainedMixin):
    """A causal LM over a base model: .<base_model_prefix> (an instance of base_model_class) then a bias-free
    linear head .<head_name> (tied to the embeddings when config.tie_word_embeddings), with forward, generate and
    the PretrainedMixin methods. The base model's forward takes (input_ids, state, use_cache,
    output_hidden_states, backend) and returns a ModelOutput. Subclasses set base_model_class, base_model_prefix,
    head_name, config_class."""
    base_model_class: type
    head_name: str

    def __init__(self, config):
        super().__init__()
        self.config = config
        base = self.base_model_class(config)
        setattr(self, self.base_model_prefix, base)
        setattr(self, self.head_name, torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False))
        if config.tie_word_embeddings:
            getattr(self, self.head_name).weight = base.embeddings.weight

    @property
    def tied_weights(self) -> tuple:
        return (self.head_name + ".weight",)

    def forward(self, input_ids, state=None, labels=None, use_cache: bool | None = None,
                output_hidden_states: bool = False, logits_to_keep: int = 0,
                backend: str | None = None) -> CausalLMOutput:
        """The base model's forward, plus logits (B, T, V) (of the last logits_to_keep positions if > 0) and, when
        labels (B, T) are given, the next-token loss (labels shifted inside, -100 ignored)."""
        if labels is not None and logits_to_keep:
            raise ValueError("labels need the logits of every position: pass logits_to_keep=0")
        out = getattr(self, self.base_model_prefix)(input_ids, state, use_cache, output_hidden_states, backend)
        hidden = out.last_hidden_state[:, -logits_to_keep:] if logits_to_keep else out.last_hidden_state
        head = getattr(self, self.head_name)
        logits = head(hidden.to(head.weight.dtype))
        loss = causal_lm_loss(logits, labels) if labels is not None else None
        return CausalLMOutput(logits, loss, out.state, out.hidden_states)

    def _step(self, tokens, state, backend):
        out = self(tokens, state=state, use_cache=True, logits_to_keep=1, backend=backend)
        return out.logits[:, -1], out.state
