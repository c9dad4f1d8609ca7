"""What the three torch models share: outputs, configs, token and state checks, the loss, and the mixins that give
them from_pretrained / save_pretrained / generate / generate_text.

    ModelOutput, CausalLMOutput            what the models return
    config_from_dict(cls, d), config_to_dict(config)   dataclass configs <-> config.json dicts
    check_positive_ints, check_positive_floats, check_bools   ValueError naming a config field that is nonsense
    check_token_ids(input_ids, vocab_size), check_state_dtype(dtype), causal_lm_loss(logits, labels)
    resolve_dtype(dtype, state_dict, kept) the dtype a model is built in (None: the checkpoint's own)
    kept_name(name, kept), kept_dtype      the parameters a half-precision model keeps fp32 (decays), and their dtype
    PretrainedMixin                        from_pretrained / save_pretrained / load_checkpoint (weights: models/io.py)
    GenerateMixin                          generate (models/generation.py) and generate_text (models/text.py)
    CausalLMMixin                          PretrainedMixin and GenerateMixin, with forward over a base model
"""
from __future__ import annotations

import dataclasses
import math
import numbers

import torch
import torch.nn.functional as F

from . import generation, text
from .io import check_state_dict, load_pretrained_dir, save_pretrained_dir
from .layers import Linear

__all__ = ["ModelOutput", "CausalLMOutput", "config_from_dict", "config_to_dict", "check_positive_ints",
           "check_positive_floats", "check_bools", "check_token_ids", "check_state_dtype", "check_logits_to_keep",
           "causal_lm_loss", "kept_name", "resolve_dtype", "kept_dtype", "PretrainedMixin", "GenerateMixin",
           "CausalLMMixin"]

# The dtypes a model can be built in; from_pretrained also takes their names ("bfloat16", ...).
MODEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
STATE_DTYPES = (torch.float32, torch.float64)


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
    """An instance of the dataclass ``cls`` from a config.json dict.

    Args:
        cls: a config dataclass with a ``model_type`` class variable.
        config: the parsed config.json. Keys that are not constructor fields of cls (transformers' bookkeeping:
            architectures, transformers_version, dtype, ...; derived fields such as Mamba's intermediate_size) are
            ignored.

    Returns:
        cls(**the known fields); its own checks refuse nonsense values.

    Raises:
        ValueError for a config of another model type.
    """
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
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{type(config).__name__}.{name} must be a positive int, got {value!r}")


def check_positive_floats(config, names) -> None:
    """Raise ValueError naming the first of config's fields ``names`` that is not a finite number > 0 (an epsilon
    of -1 makes every logit NaN; a string fails only at the first forward)."""
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{type(config).__name__}.{name} must be a finite number > 0, got {value!r}")


def check_bools(config, names) -> None:
    """Raise ValueError naming the first of config's fields ``names`` that is not a bool."""
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, bool):
            raise ValueError(f"{type(config).__name__}.{name} must be true or false, got {value!r}")


def check_token_ids(input_ids, vocab_size: int, name: str = "input_ids") -> torch.Tensor:
    """Check token ids and return them as int64 (what nn.Embedding takes).

    Args:
        input_ids: an integer tensor (any integer dtype: int8, uint8, int16, int32, int64) of shape (B, T),
            B >= 1, T >= 1, every id in [0, vocab_size).
        vocab_size: the model's vocabulary size.
        name: the argument's name, for the error messages.

    Returns:
        input_ids as int64.

    Raises:
        TypeError for a non-tensor or a non-integer dtype; ValueError for a bad shape or an id out of range.
    """
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(input_ids).__name__}")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {input_ids.dtype}")
    if input_ids.dim() != 2 or min(input_ids.shape) < 1:
        raise ValueError(f"{name} must have shape (B, T) with B >= 1 and T >= 1, got {tuple(input_ids.shape)}")
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"{name} must lie in [0, {vocab_size}), got values in [{lo}, {hi}]")
    return input_ids.long()


def check_state_dtype(dtype) -> torch.dtype:
    """States are fp32 (float64 for a float64 model): -1e38, RWKV-4's "nothing seen yet", is -inf in fp16."""
    if dtype not in STATE_DTYPES:
        raise TypeError(f"state dtype must be torch.float32 or torch.float64, got {dtype}")
    return dtype


def check_logits_to_keep(logits_to_keep) -> int:
    """logits_to_keep: 0 (every position) or a positive number of last positions."""
    if not isinstance(logits_to_keep, int) or isinstance(logits_to_keep, bool) or logits_to_keep < 0:
        raise ValueError(f"logits_to_keep must be an int >= 0 (0: every position), got {logits_to_keep!r}")
    return logits_to_keep


def causal_lm_loss(logits: torch.Tensor, labels) -> torch.Tensor:
    """Next-token cross-entropy, computed in fp32.

    Args:
        logits: (B, T, V).
        labels: (B, T) token ids, or -100 where a position is ignored; shifted here (position t predicts
            labels[:, t + 1]), so labels = input_ids is the usual call.

    Returns:
        the mean over the positions not ignored of -log softmax(logits[:, t])[labels[:, t + 1]].
    """
    B, T, V = logits.shape
    if not isinstance(labels, torch.Tensor) or labels.shape != (B, T):
        raise ValueError(f"labels must be a tensor of shape ({B}, {T}), got "
                         f"{tuple(labels.shape) if isinstance(labels, torch.Tensor) else type(labels).__name__}")
    if not ((labels == -100) | ((labels >= 0) & (labels < V))).all():
        raise ValueError(f"labels must lie in [0, {V}) or be -100 (ignored)")
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, V), labels[:, 1:].reshape(-1).long(), ignore_index=-100)


def kept_name(name: str, kept) -> bool:
    """Whether the parameter ``name`` is one of ``kept``, names matched as the last parts of a state-dict name
    ("time_decay" matches "rwkv.blocks.0.attention.time_decay", "dt_proj.bias" matches "...mixer.dt_proj.bias")."""
    return any(name == k or name.endswith("." + k) for k in kept)


def resolve_dtype(dtype, state_dict: dict[str, torch.Tensor], kept=()) -> torch.dtype:
    """The dtype a model is built in.

    Args:
        dtype: None or "auto" (the checkpoint's own: the floating dtype holding most of its elements, the kept
            parameters not counted), a floating torch.dtype, or its name ("float32", "float16", "bfloat16",
            "float64").
        state_dict: the checkpoint's tensors.
        kept: the model's keep_in_fp32 names (kept_name): parameters a half-precision checkpoint stores fp32
            beside its weights, which would otherwise outvote them in a small model.

    Returns:
        a torch.dtype of MODEL_DTYPES.
    """
    if dtype is None or dtype == "auto":
        sizes: dict[torch.dtype, int] = {}
        for name, t in state_dict.items():
            if t.dtype in MODEL_DTYPES and not kept_name(name, kept):
                sizes[t.dtype] = sizes.get(t.dtype, 0) + t.numel()
        if not sizes:           # nothing but kept parameters: their dtype
            sizes = {t.dtype: t.numel() for t in state_dict.values() if t.dtype in MODEL_DTYPES}
        return max(sizes, key=sizes.get) if sizes else torch.float32
    named = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if named not in MODEL_DTYPES:
        raise TypeError(f"dtype must be None ('auto': as stored), one of {[str(d) for d in MODEL_DTYPES]} or its "
                        f"name ('bfloat16', ...), got {dtype!r}")
    return named


def kept_dtype(stored: torch.dtype, model_dtype: torch.dtype, as_stored: bool) -> torch.dtype:
    """The dtype of a kept (keep_in_fp32) parameter in a model of ``model_dtype``: its accumulation dtype (fp32 for
    fp16/bf16, as the peers keep decays; the model's own for fp32 and float64), or, loading as stored
    (``as_stored``), the stored dtype where it is one of those two (a bf16 checkpoint's bf16 decays stay bf16)."""
    wide = torch.float64 if model_dtype == torch.float64 else torch.float32
    return stored if as_stored and stored in (model_dtype, wide) else wide


class PretrainedMixin:
    """from_pretrained / save_pretrained / load_checkpoint for an nn.Module built as cls(config).

    Class attributes: config_class, a dataclass with a model_type class variable; base_model_prefix, the base
    model's attribute in the causal LM ("rwkv", "backbone"), so that a base model reads a causal-LM checkpoint;
    tied_weights, the names that share the embedding when config.tie_word_embeddings (transformers leaves them out
    of saved checkpoints, and so do we); keep_in_fp32, the names (last parts, kept_name) of the parameters a
    half-precision model keeps fp32, as the peers keep them (transformers' _keep_in_fp32_modules): the decays, which
    the ops take fp32 beside fp16/bf16 inputs (design.md's dtype rule). A model whose files use other names or
    another config (RWKV-7 in flash-linear-attention's layout) overrides the four _..._file hooks.

    Dtypes on loading (from_pretrained, from_checkpoint): the model's dtype is the one asked for, or the stored
    weights' majority (the kept parameters not counted); every parameter takes it except the kept ones, which stay
    as stored when that is the model's dtype or fp32 (a bf16 checkpoint with fp32 decays loads as it is), and are
    fp32 in an fp16/bf16 model otherwise (asked for bf16, a model keeps its decays fp32).
    """
    config_class: type
    base_model_prefix: str = ""
    tied_weights: tuple = ()
    keep_in_fp32: tuple = ()
    tokenizer = None                  # set by from_pretrained when the directory ships one (models/text.py)

    @classmethod
    def from_pretrained(cls, local_dir, dtype=None):
        """The model saved in a directory, built without allocating its weights twice.

        The modules are built on the meta device; the checkpoint's tensors (memory-mapped, models/io.py) then
        become the parameters, converted only where ``dtype`` differs from the stored one.

        Args:
            local_dir: config.json + model.safetensors or pytorch_model.bin, or a sharded index and its shards, as
                written by our save_pretrained or transformers' (needs no transformers).
            dtype: None or "auto" for the stored dtype, else a torch.dtype or its name ("bfloat16").

        Returns:
            the model in eval mode; ``model.tokenizer`` is the directory's tokenizer (tokenizer.json or RWKV's
            World vocabulary, models/text.py) or None.
        """
        config, state_dict = load_pretrained_dir(local_dir)
        model = cls._from_state_dict(cls._config_from_file(config), cls._state_dict_from_file(state_dict), dtype)
        model.tokenizer = text.find_tokenizer(local_dir)
        return model

    @classmethod
    def keeps_fp32(cls, name: str) -> bool:
        """Whether the parameter ``name`` (a state-dict name) is one that a half-precision model keeps fp32."""
        return kept_name(name, cls.keep_in_fp32)

    @classmethod
    def _from_state_dict(cls, config, state_dict: dict, dtype):
        as_stored = dtype is None or dtype == "auto"
        dtype = resolve_dtype(dtype, state_dict, cls.keep_in_fp32)
        with torch.device("meta"):
            model = cls(config)
        model.load_checkpoint(state_dict, assign_dtype=dtype, as_stored=as_stored)
        return model.eval()

    def save_pretrained(self, local_dir) -> None:
        """Write config.json + model.safetensors, readable by from_pretrained and by the peer library.

        Args:
            local_dir: the directory (created if needed). The save is atomic (models/io.py): a save that fails
                leaves an existing directory loadable; an older pytorch_model.bin or sharded set is removed.
        """
        tied = self._tied_names()
        save_pretrained_dir(local_dir, self._config_to_file(),
                            self._state_dict_to_file({k: v for k, v in self.state_dict().items() if k not in tied}))

    @classmethod
    def _config_from_file(cls, config: dict):
        return config_from_dict(cls.config_class, config)

    def _config_to_file(self) -> dict:
        return config_to_dict(self.config, type(self).__name__)

    @classmethod
    def _state_dict_from_file(cls, state_dict: dict) -> dict:
        return state_dict

    def _state_dict_to_file(self, state_dict: dict) -> dict:
        return state_dict

    def _tied_names(self) -> set:
        return set(self.tied_weights) if getattr(self.config, "tie_word_embeddings", False) else set()

    def tie_weights(self) -> None:
        """Make the tied parameters one tensor again (after load_state_dict(assign=True) replaced one of them)."""

    def load_checkpoint(self, state_dict: dict, assign_dtype: torch.dtype | None = None,
                        as_stored: bool = False) -> None:
        """Load a state dict after checking every name and shape.

        Args:
            state_dict: name -> tensor in this model's names (a causal-LM checkpoint also loads into its base
                model; tied names are ignored).
            assign_dtype: None: copy into the existing parameters (converting dtypes). A dtype: the tensors,
                converted to it where they differ, become the parameters themselves (no copy when the dtype is the
                stored one), as from_pretrained does for a model built on the meta device; the kept parameters
                (keep_in_fp32) take kept_dtype: fp32 in an fp16/bf16 model.
            as_stored: with assign_dtype, whether the dtype is the checkpoint's own (dtype None): then a kept
                parameter stored in assign_dtype stays in it (kept_dtype).

        Raises:
            KeyError / ValueError naming a missing, unexpected or misshapen tensor.
        """
        tied = self._tied_names()
        expected = {k: tuple(v.shape) for k, v in self.state_dict().items() if k not in tied}
        prefix = self.base_model_prefix + "."
        if not any(k.startswith(prefix) for k in expected) and any(k.startswith(prefix) for k in state_dict):
            # A base model reading a causal-LM checkpoint keeps the base model's part.
            state_dict = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        state_dict = {k: v for k, v in state_dict.items() if k not in tied}
        check_state_dict(expected, state_dict)
        if assign_dtype is None:
            self.load_state_dict(state_dict, strict=False)   # strict checking done above; tied names are absent
            return
        self.load_state_dict({k: v.to(kept_dtype(v.dtype, assign_dtype, as_stored) if self.keeps_fp32(k) else
                                      assign_dtype) for k, v in state_dict.items()}, strict=False, assign=True)
        self.tie_weights()


class GenerateMixin:
    """generate and generate_text for a model with a method step(input_ids (B, t), state, backend) -> (logits of
    the last position (B, V), state after the last token)."""
    tokenizer = None

    def step(self, input_ids, state, backend):
        """One step of generation: (logits of the last position (B, V), state after input_ids (B, t))."""
        raise NotImplementedError

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, state=None, temperature: float = 0.0,
                 top_p: float = 1.0, stop_sequences=(), generator: torch.Generator | None = None,
                 backend: str | None = None):
        """Continue a batch of prompts token by token through the recurrent state.

        The prompt is read once, then one forward of one token per new token (models/generation.py).

        Args:
            input_ids: (B, T) integer token ids, B >= 1, T >= 1.
            max_new_tokens: how many tokens to add at most (>= 0).
            state: the state to start from (e.g. one saved with models.io.save_state), None for the initial one.
            temperature: 0 for greedy decoding, else sampling from softmax(logits / temperature).
            top_p: nucleus sampling: the smallest set of most likely tokens whose probability reaches top_p.
            stop_sequences: a list of token-id lists (e.g. [[187, 187]], "\\n\\n" in the GPT-NeoX tokenizer); a row
                ends right after producing one (it is kept) and is padded with its last token while others go on.
            generator: a torch.Generator for reproducible sampling.
            backend: the ops' backend (None: the first that takes the call, kernels/backends.py).

        Returns:
            (tokens (B, T + n) int64, the state after the last token).
        """
        return generation.generate(self._bound_step(backend), input_ids, max_new_tokens, state, temperature, top_p,
                                   stop_sequences, generator)

    def generate_text(self, prompt: str, tokenizer=None, backend: str | None = None, **kwargs) -> "text.TextStream":
        """Continue a text prompt, streaming the decoded text as the tokens arrive.

        Args:
            prompt: the text to continue.
            tokenizer: a tokenizer of models/text.py (load_tokenizer("world"), a tokenizer.json, ...); default
                the one from_pretrained found beside the weights.
            backend: the ops' backend (None: the first that takes the call, kernels/backends.py).
            **kwargs: max_new_tokens, temperature, top_p, stop (a string matched on the decoded text), state,
                generator: as for models.text.TextStream.

        Returns:
            a TextStream: iterate it for the text pieces; afterwards .state, .text, .tokens and the speeds.
        """
        tokenizer = tokenizer or self.tokenizer
        if tokenizer is None:
            raise ValueError("generate_text needs a tokenizer: none was found beside the weights; pass "
                             "tokenizer=seqmix.models.text.load_tokenizer('world' or a tokenizer.json path)")
        return text.TextStream(self._bound_step(backend), tokenizer, prompt, **kwargs)

    def _bound_step(self, backend):
        def step(input_ids, state):
            return self.step(input_ids, state, backend)
        return step


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
        setattr(self, self.base_model_prefix, self.base_model_class(config))
        setattr(self, self.head_name, Linear(config.hidden_size, config.vocab_size, bias=False))
        self.tie_weights()

    @property
    def tied_weights(self) -> tuple:
        return (self.head_name + ".weight",)

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            getattr(self, self.head_name).weight = getattr(self, self.base_model_prefix).embeddings.weight

    def initial_state(self, batch: int, device=None, dtype=torch.float32):
        """The base model's initial_state (the state before any token).

        Args:
            batch: B. device: where the tensors live. dtype: torch.float32 or torch.float64.

        Returns:
            the state, as the base model's forward takes it.
        """
        return getattr(self, self.base_model_prefix).initial_state(batch, device, dtype)

    def forward(self, input_ids, state=None, labels=None, use_cache: bool | None = None,
                output_hidden_states: bool = False, logits_to_keep: int = 0,
                backend: str | None = None) -> CausalLMOutput:
        """The base model's forward, then the logits and (with labels) the next-token loss.

        Args:
            input_ids: (B, T) integer token ids in [0, vocab_size).
            state: None or the state of a previous call.
            labels: (B, T) targets for the loss (shifted inside; -100 ignored), usually input_ids.
            use_cache: whether to return the state (default config.use_cache).
            output_hidden_states: whether to return every block's output.
            logits_to_keep: 0 for the logits of every position, n > 0 for the last n only (generation).
            backend: the ops' backend (None: the first that takes the call, kernels/backends.py).

        Returns:
            CausalLMOutput(logits (B, T or logits_to_keep, V), loss, state, hidden_states).
        """
        if check_logits_to_keep(logits_to_keep) and labels is not None:
            raise ValueError("labels need the logits of every position: pass logits_to_keep=0")
        out = getattr(self, self.base_model_prefix)(input_ids, state, use_cache, output_hidden_states, backend)
        hidden = out.last_hidden_state[:, -logits_to_keep:] if logits_to_keep else out.last_hidden_state
        head = getattr(self, self.head_name)
        logits = head(hidden.to(head.weight.dtype))
        loss = causal_lm_loss(logits, labels) if labels is not None else None
        return CausalLMOutput(logits, loss, out.state, out.hidden_states)

    def step(self, input_ids, state, backend):
        out = self(input_ids, state=state, use_cache=True, logits_to_keep=1, backend=backend)
        return out.logits[:, -1], out.state
