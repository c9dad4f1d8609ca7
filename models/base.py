"""What the three torch models share: outputs, configs, token checks, the loss, and the mixins that give them
from_pretrained / save_pretrained / generate.

    ModelOutput, CausalLMOutput            what the models return
    config_from_dict(cls, d), config_to_dict(config)   dataclass configs <-> config.json dicts
    check_positive_ints(config, names)     ValueError naming a config field that is not a positive int
    check_token_ids(input_ids, vocab_size), causal_lm_loss(logits, labels)
    PretrainedMixin                        from_pretrained / save_pretrained / load_checkpoint (weights: models/io.py)
    GenerateMixin                          generate (models/generation.py) over a model's _step
    CausalLMMixin                          PretrainedMixin and GenerateMixin, with forward over a base model
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from seqmix.models import generation
from seqmix.models.io import check_state_dict, load_pretrained_dir, save_pretrained_dir

__all__ = ["ModelOutput", "CausalLMOutput", "config_from_dict", "config_to_dict", "check_positive_ints", "check_token_ids", "causal_lm_loss", "PretrainedMixin", "GenerateMixin", "CausalLMMixin"]

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
        -> (tokens (B, T + n), state after the last token). See models/generation.py."""
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
