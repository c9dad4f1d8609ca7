"""RWKV-7 "Goose" as a torch module with BlinkDL's parameter names, so a BlinkDL RWKV-7 `.pth` loads as it is.

    Rwkv7Config                  sizes: vocab, n_embd, n_layer, head_size, dim_ffn and the four LoRA widths; eps
    Rwkv7(config)                emb -> blocks.0.ln0 -> L x (ln1 -> att, ln2 -> ffn) -> ln_out -> head
    Rwkv7.from_checkpoint(p)     a BlinkDL `.pth` (or .safetensors); the sizes come from the tensors (head size from
                                 r_k, which is (H, N))
    Rwkv7.from_pretrained(dir)   flash-linear-attention's Hugging Face layout (config.json + safetensors, names
                                 like model.layers.0.attn.r_proj.weight; the map: models/rwkv7_fla.py);
                                 save_pretrained writes it
    model(input_ids, state=None, logits_to_keep=0, backend=None) -> (logits (B, T, V), state)
    model.generate(...), model.generate_text(...)   continuation through the state (models/base.py)

GPT mode: a call with T tokens runs the whole sequence through the WKV-7 op (kernels/wkv7/) in each layer.
RNN mode: calls with one token each, the returned state passed back in; both give the same logits. On a CPU, a call
with one token of one sequence and no gradients runs as one C step (models/rwkv7/step.py, rwkv7_step.c).
State: a list of L tuples (att_x_prev (B, C), att_kv (B, H, N, N) fp32 indexed [value, key], ffn_x_prev (B, C)).

Where Rwkv7 differs from RwkvForCausalLM and MambaForCausalLM, on purpose: forward returns the pair (logits, state)
as BlinkDL's runtime does, not a CausalLMOutput (no labels or hidden_states: the loss is causal_lm_loss of
models/base.py on the logits); there is no separate base model (BlinkDL's checkpoints have none); the token-shift
parts of the state take the model's dtype (only att_kv is fp32), as in BlinkDL's runtime.

The math is that of reference/rwkv7.py (whose docstring has the glossary); sources: the RWKV-7 architecture post
https://www.cnblogs.com/Ctrl-cCtrl-v/p/18906192 and arXiv:2503.14456.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...kernels.shared import accumulation_dtype, check_devices, check_tensor
from ...kernels.wkv7 import wkv7
from .. import decode, rwkv7_fla
from ..base import (STATE_DTYPES, GenerateMixin, PretrainedMixin, check_logits_to_keep,
                    check_positive_floats, check_positive_ints, check_state_dtype, check_token_ids)
from ..io import load_state_dict
from ..layers import Linear, token_shift
from . import step

__all__ = ["Rwkv7Config", "Rwkv7", "UNUSED_CHECKPOINT_KEYS", "log_decay"]

# Some BlinkDL checkpoints carry a value-residual LoRA for block 0, which makes v_first and never uses it.
UNUSED_CHECKPOINT_KEYS = ("blocks.0.att.v0", "blocks.0.att.v1", "blocks.0.att.v2")


def _suggested_lora(C: int, scale: float, power: float) -> int:
    return max(32, int(round(scale * C ** power / 32)) * 32)


@dataclass
class Rwkv7Config:
    """Sizes of an RWKV-7 model. The LoRA widths default to one of the suggestions in BlinkDL's RWKV-7 training
    code (it has changed between versions); `Rwkv7.from_checkpoint` reads the actual ones from the tensors.
    layer_norm_epsilon: the layer norms' eps (BlinkDL: torch's default 1e-5); group_norm_epsilon: the per-head
    group norm's (BlinkDL: 64e-5; flash-linear-attention: head_size * norm_eps, the same for head size 64).
    wide_in_context_rate: not the published model: the in-context rate a = (1 + w) sigmoid(a0 + xa a1 a2), in
    (0, 1 + w) per channel, so that the transition's eigenvalues reach -1 (reference.rwkv7.in_context_rate; the
    state-tracking experiment). With it, the time mix runs in torch ops around the WKV-7 op of the chosen backend
    (which takes a and b as they come); the C time mix and decoding step compute the published a and are not used."""
    vocab_size: int = 65536
    n_embd: int = 768
    n_layer: int = 12
    head_size: int = 64
    dim_ffn: int | None = None        # 4 * n_embd
    decay_lora: int | None = None     # w1, w2
    a_lora: int | None = None         # a1, a2 (in-context learning rate)
    v_lora: int | None = None         # v1, v2 (value residual, blocks 1 ...)
    gate_lora: int | None = None      # g1, g2
    layer_norm_epsilon: float = 1e-5
    group_norm_epsilon: float = 64e-5
    wide_in_context_rate: bool = False   # a in (0, 1 + w) instead of (0, 1): reference.rwkv7.in_context_rate

    def __post_init__(self):
        check_positive_ints(self, ("vocab_size", "n_embd", "n_layer", "head_size"))     # before C ** 0.5 below
        C = self.n_embd
        defaults = dict(dim_ffn=4 * C, decay_lora=_suggested_lora(C, 1.8, 0.5), a_lora=_suggested_lora(C, 1.8, 0.5),
                        v_lora=_suggested_lora(C, 1.3, 0.5), gate_lora=_suggested_lora(C, 0.6, 0.8))
        for name, value in defaults.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        check_positive_ints(self, ("dim_ffn", "decay_lora", "a_lora", "v_lora", "gate_lora"))
        check_positive_floats(self, ("layer_norm_epsilon", "group_norm_epsilon"))
        if C % self.head_size:
            raise ValueError(f"n_embd ({C}) must be a multiple of head_size ({self.head_size})")

    @property
    def n_head(self) -> int:
        return self.n_embd // self.head_size

    @classmethod
    def from_state_dict(cls, state_dict: dict[str, torch.Tensor]) -> "Rwkv7Config":
        """The sizes of a BlinkDL checkpoint, read from its tensors.

        Args:
            state_dict: name -> tensor in BlinkDL's names: emb.weight (V, C), blocks.0.att.r_k (H, N),
                blocks.0.ffn.key.weight (F, C), the LoRA matrices w1, a1, g1 (C, D) and v1 (block 1).

        Returns:
            the Rwkv7Config (the epsilons at BlinkDL's values, which a .pth does not record).

        Raises:
            KeyError / ValueError naming a tensor that is missing or not 2-D.
        """
        def shape(key):
            if key not in state_dict:
                raise KeyError(f"checkpoint is missing tensor {key!r}")
            if state_dict[key].dim() != 2:
                raise ValueError(f"checkpoint tensor {key!r} must be 2-D, got shape {tuple(state_dict[key].shape)}")
            return tuple(state_dict[key].shape)

        blocks = [int(m.group(1)) for m in map(re.compile(r"blocks\.(\d+)\.").match, state_dict) if m]
        if not blocks:
            raise KeyError("checkpoint has no blocks.<i>.* tensors")
        n_layer = max(blocks) + 1
        vocab_size, n_embd = shape("emb.weight")
        _, head_size = shape("blocks.0.att.r_k")
        return cls(vocab_size=vocab_size, n_embd=n_embd, n_layer=n_layer, head_size=head_size,
                   dim_ffn=shape("blocks.0.ffn.key.weight")[0], decay_lora=shape("blocks.0.att.w1")[1],
                   a_lora=shape("blocks.0.att.a1")[1], gate_lora=shape("blocks.0.att.g1")[1],
                   v_lora=shape("blocks.1.att.v1")[1] if n_layer > 1 else None)


def log_decay(w0, wl):
    """RWKV-7's log decay per channel from w0 and the decay LoRA's product wl = tanh(xw w1) w2:
    w = -softplus(-(w0 + wl)) - 0.5, soft-clamped to (-inf, -0.5); the decay is exp(-exp(w)), so
    log_w = -exp(w) = -exp(-0.5) sigmoid(w0 + wl), since exp(-softplus(-z)) = sigmoid(z). In (-0.61, 0)."""
    return -math.exp(-0.5) * torch.sigmoid(w0 + wl)


def _channel_vector(C: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(1, 1, C))


def _lora(x, m1, m2, act=None):
    """(act(x m1)) m2, each matrix cast to the activations' dtype where it is stored in another (w1, w2 kept fp32
    beside bf16 weights: Rwkv7.keep_in_fp32), as the reference implementations' products run under autocast."""
    h = x @ m1.to(x.dtype)
    return (h if act is None else act(h)) @ m2.to(x.dtype)


class TimeMix(nn.Module):
    """RWKV_Tmix_x070: the six token-shift mixes, r, w, k, v, a, g, the WKV-7 op, GroupNorm per head, bonus."""

    def __init__(self, config: Rwkv7Config, layer_id: int):
        super().__init__()
        C, H, N = config.n_embd, config.n_head, config.head_size
        for c in "rwkvag":
            setattr(self, f"x_{c}", _channel_vector(C))
        lora = dict(w=config.decay_lora, a=config.a_lora, g=config.gate_lora)
        if layer_id > 0:                       # layer 0 makes v_first and has no value residual
            lora["v"] = config.v_lora
        for c, D in lora.items():
            if c != "g":
                setattr(self, f"{c}0", _channel_vector(C))
            setattr(self, f"{c}1", nn.Parameter(torch.empty(C, D)))
            setattr(self, f"{c}2", nn.Parameter(torch.empty(D, C)))
        self.k_k, self.k_a = _channel_vector(C), _channel_vector(C)
        self.r_k = nn.Parameter(torch.empty(H, N))
        self.receptance, self.key, self.value, self.output = (Linear(C, C, bias=False) for _ in range(4))
        self.ln_x = nn.GroupNorm(H, C, eps=config.group_norm_epsilon)
        self.wide_in_context_rate = config.wide_in_context_rate

    def forward(self, x, x_prev, kv, v_first, backend=None):
        """x: layer-normed input (B, T, C); x_prev (B, C); kv (B, H, N, N) fp32; v_first (B, T, C) or None in
        layer 0. Returns (out (B, T, C), x_prev, kv, v_first) for the next call / layer."""
        # x + (x_{t-1} - x) mix for the six mixes at once: one pass over x, not eighteen
        mixes = torch.stack((self.x_r, self.x_w, self.x_k, self.x_v, self.x_a, self.x_g))
        xr, xw, xk, xv, xa, xg = torch.lerp(x, token_shift(x, x_prev), mixes).unbind(0)
        r, k, v = self.receptance(xr), self.key(xk), self.value(xv)
        wl = _lora(xw, self.w1, self.w2, torch.tanh)                            # the LoRA products
        al = _lora(xa, self.a1, self.a2)
        vl = None if v_first is None else _lora(xv, self.v1, self.v2)
        g = _lora(xg, self.g1, self.g2, torch.sigmoid)
        # on a CPU without gradients: the rest in one C pass (every tensor it reads counts, the state's kv included);
        # not with the wide in-context rate, which the C pass does not compute (step.variant says so)
        if step.time_mix_path(self, backend, r, k, v, v_first, wl, al, vl, g, kv) == "c":
            y, kv = step.rwkv7_time_mix(self, r, k, v, v_first, wl, al, vl, g, kv)
        else:
            y, kv = self._mix(r, k, v, v_first, wl, al, vl, g, kv, backend)
        return self.output(y), x[:, -1], kv, v if v_first is None else v_first

    def _mix(self, r, k, v, v_first, wl, al, vl, g, kv, backend):
        """From r, k, v (B, T, C) and the LoRA products wl, al, vl (None in layer 0), g on: the decay, the value
        residual, the in-context rate, the normalized key, the WKV-7 op, GroupNorm per head, the bonus, the gate.
        Returns (y * g (B, T, C), kv)."""
        B, T, C = r.shape
        H, N = self.r_k.shape
        heads = lambda z: z.reshape(B, T, H, N)                               # noqa: E731
        log_w = log_decay(self.w0, wl)
        if vl is not None:                                                    # layer 0's v is v_first itself
            v = v + (v_first - v) * torch.sigmoid(self.v0 + vl)
        a = torch.sigmoid(self.a0 + al)                                       # in-context learning rate
        if self.wide_in_context_rate:                                         # (0, 1 + w): eigenvalues to -1
            a = a * (1 + torch.exp(log_w)).to(a.dtype)                        # log_w fp32 beside bf16 a: a's dtype
        kk = F.normalize(heads(k * self.k_k), dim=-1)                            # (B, T, H, N), unit per head
        k = k * (1 + (a - 1) * self.k_a)
        y, kv = wkv7(heads(r), heads(log_w), heads(k), heads(v), -kk, kk * heads(a), state=kv, backend=backend)
        # torch's op rather than the module's call, which refuses one value per group (head size 1 at B * T = 1);
        # the normalized value there is just the bias.
        ln_x = self.ln_x
        y = torch.group_norm(y.reshape(B * T, C), ln_x.num_groups, ln_x.weight, ln_x.bias, ln_x.eps).view(B, T, C)
        # the bonus in r's dtype: an r_k stored in another (fp32 beside bf16 weights) would promote y past the output
        y = y + ((heads(r) * heads(k) * self.r_k.to(r.dtype)).sum(-1, keepdim=True) * heads(v)).view(B, T, C)
        return y * g, kv


class ChannelMix(nn.Module):
    """RWKV_CMix_x070: value(relu(key(x + (x_{t-1} - x) * x_k))^2)."""

    def __init__(self, config: Rwkv7Config):
        super().__init__()
        self.x_k = _channel_vector(config.n_embd)
        self.key = Linear(config.n_embd, config.dim_ffn, bias=False)
        self.value = Linear(config.dim_ffn, config.n_embd, bias=False)

    def forward(self, x, x_prev):
        k = torch.relu(self.key(torch.lerp(x, token_shift(x, x_prev), self.x_k))).square()   # square: 1.9x pow's speed
        return self.value(k), x[:, -1]


class Block(nn.Module):
    def __init__(self, config: Rwkv7Config, layer_id: int):
        super().__init__()
        if layer_id == 0:
            self.ln0 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)    # normalizes the embeddings
        self.ln1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.ln2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.att = TimeMix(config, layer_id)
        self.ffn = ChannelMix(config)

    def forward(self, x, layer_state, v_first, backend=None):
        att_x_prev, att_kv, ffn_x_prev = layer_state
        dx, att_x_prev, att_kv, v_first = self.att(self.ln1(x), att_x_prev, att_kv, v_first, backend)
        x = x + dx
        dx, ffn_x_prev = self.ffn(self.ln2(x), ffn_x_prev)
        return x + dx, (att_x_prev, att_kv, ffn_x_prev), v_first


class Rwkv7(GenerateMixin, PretrainedMixin, nn.Module):
    """The RWKV-7 language model; `state_dict()` keys and shapes are those of a BlinkDL RWKV-7 `.pth`. See the
    module docstring for where it differs from the other two models."""
    config_class = Rwkv7Config
    # fp32 beside fp16/bf16 weights: the decay w0 and its LoRA w1, w2, whose sum the log decay log_w is made of
    # (the WKV-7 op takes log_w fp32 beside half-precision r, k, v); the time mix casts w1, w2 to the activations'
    # dtype for their matrix products, and adds w0 in fp32
    keep_in_fp32 = ("w0", "w1", "w2")

    def __init__(self, config: Rwkv7Config):
        super().__init__()
        self.config = config
        self.emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.ln_out = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.head = Linear(config.n_embd, config.vocab_size, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """A plain starting point, not BlinkDL's training initialization: norms weight 1 and bias 0, every other
        tensor N(0, std^2) (so the decays start near exp(-exp(-softplus(0) - 0.5)) = 0.74).

        Args:
            std: the standard deviation of the random tensors.
        """
        for module in self.modules():
            if isinstance(module, (nn.LayerNorm, nn.GroupNorm)):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            else:
                for p in module.parameters(recurse=False):
                    nn.init.normal_(p, std=std)

    @classmethod
    def from_checkpoint(cls, path, dtype=None) -> "Rwkv7":
        """A model with the weights of a BlinkDL RWKV-7 checkpoint, built without allocating them twice.

        Args:
            path: a `.pth` (read memory-mapped with torch.load(mmap=True, weights_only=True)) or `.safetensors`
                in BlinkDL's names; the sizes are read from the tensors.
            dtype: None or "auto" for the stored dtype, else a torch.dtype or its name ("bfloat16").

        Returns:
            the model, in eval mode.

        Raises:
            KeyError / ValueError naming a missing, unexpected or misshapen tensor, or the damaged file.
        """
        state_dict = {k: v for k, v in load_state_dict(path).items() if k not in UNUSED_CHECKPOINT_KEYS}
        return cls._from_state_dict(Rwkv7Config.from_state_dict(state_dict), state_dict, dtype)

    # from_pretrained / save_pretrained (models/base.py) read and write flash-linear-attention's layout:
    @classmethod
    def _config_from_file(cls, config: dict) -> Rwkv7Config:
        return Rwkv7Config(**rwkv7_fla.config_from_fla(config))

    def _config_to_file(self) -> dict:
        if self.config.wide_in_context_rate:
            raise ValueError("save_pretrained writes flash-linear-attention's layout, which has no field for "
                             "wide_in_context_rate: a model with it would load back as the published one")
        return rwkv7_fla.config_to_fla(self.config)

    @classmethod
    def _state_dict_from_file(cls, state_dict: dict) -> dict:
        return rwkv7_fla.fla_to_blink(state_dict)

    def _state_dict_to_file(self, state_dict: dict) -> dict:
        return rwkv7_fla.blink_to_fla(state_dict)

    @property
    def kv_dtype(self) -> torch.dtype:
        """The WKV state is fp32 (float64 for a float64 model); the token-shift states take the model's dtype."""
        return accumulation_dtype(self.emb.weight.dtype)

    def initial_state(self, batch: int, device=None, dtype=torch.float32) -> list:
        """The state before any token: zeros.

        Args:
            batch: B. device: where the tensors live (default: the model's).
            dtype: att_kv's dtype, torch.float32 or torch.float64 (forward computes in kv_dtype); the token-shift
                parts take the model's dtype.

        Returns:
            per layer (att_x_prev (B, C), att_kv (B, H, N, N), ffn_x_prev (B, C)).
        """
        check_state_dtype(dtype)
        c, p = self.config, self.emb.weight
        device = p.device if device is None else device
        return [(p.new_zeros(batch, c.n_embd, device=device),
                 torch.zeros(batch, c.n_head, c.head_size, c.head_size, dtype=dtype, device=device),
                 p.new_zeros(batch, c.n_embd, device=device)) for _ in range(c.n_layer)]

    def _check_state(self, state, B: int) -> list:
        c, p = self.config, self.emb.weight
        H, N, C = c.n_head, c.head_size, c.n_embd
        if not isinstance(state, (list, tuple)) or len(state) != c.n_layer:
            raise ValueError(f"state must be a list of {c.n_layer} tuples (att_x_prev, att_kv, ffn_x_prev), "
                             f"got {type(state).__name__} of length {len(state) if hasattr(state, '__len__') else '-'}")
        checked = []
        for i, layer in enumerate(state):
            if not isinstance(layer, (list, tuple)) or len(layer) != 3:
                raise ValueError(f"state[{i}] must be (att_x_prev, att_kv, ffn_x_prev), got {type(layer).__name__}")
            for name, x, shape, dtypes in zip(("att_x_prev", "att_kv", "ffn_x_prev"), layer,
                                              ((B, C), (B, H, N, N), (B, C)), ((p.dtype,), STATE_DTYPES, (p.dtype,))):
                label = f"state[{i}] ({name})"
                check_devices(**{label: check_tensor(label, x, shape, dtypes=dtypes), "emb.weight": p})
            checked.append((layer[0], layer[1].to(self.kv_dtype), layer[2]))
        return checked

    def forward(self, input_ids: torch.Tensor, state=None, logits_to_keep: int = 0, backend: str | None = None):
        """Run the model over a sequence, from a state.

        Args:
            input_ids: (B, T) integer token ids in [0, vocab_size).
            state: as returned by a previous call (never modified), or None for initial_state.
            logits_to_keep: 0 for the logits of every position, n > 0 for the last n only (generation: the head
                is the largest matrix).
            backend: the WKV-7 op's backend, which kernels/backends.py dispatches (None: Triton on CUDA; on CPU the C
                loop, with or without gradients, where it takes the call). The forward itself: A call takes the first
                path that takes it, in this order: "c" (one token of one sequence on a CPU, fp32 or bf16 weights and
                state, no gradient, backend None or "c"), "ops" (any other call: the torch modules, each op on its own
                backend). The step_path of models/decode.py decides.

        Returns:
            (logits (B, T or logits_to_keep, V) in the model's dtype, state after the last token).
        """
        input_ids = check_token_ids(input_ids, self.config.vocab_size)
        check_logits_to_keep(logits_to_keep)
        B = input_ids.shape[0]
        state = None if state is None else self._check_state(state, B)
        if decode.step_path(self, input_ids, state, backend, variant=step.variant(self.config),
                            limit=step.limit(self.config.head_size)) == "c":   # one token: one C call
            x, state = step.rwkv7_step(self, input_ids, state)
            return self.head(x), state
        state = self.initial_state(B, dtype=self.kv_dtype) if state is None else state
        x = self.blocks[0].ln0(self.emb(input_ids))
        v_first, new_state = None, []
        for block, layer_state in zip(self.blocks, state):
            x, layer_state, v_first = block(x, layer_state, v_first, backend)
            new_state.append(layer_state)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        return self.head(self.ln_out(x)), new_state

    def step(self, input_ids, state, backend):
        logits, state = self(input_ids, state, logits_to_keep=1, backend=backend)
        return logits[:, -1], state
