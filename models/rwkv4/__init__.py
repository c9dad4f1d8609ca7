"""RWKV-4 in torch, on the WKV op of kernels/wkv4/, with transformers' parameter names and state layout.

A state dict of transformers' RwkvModel / RwkvForCausalLM loads as is, and a directory saved by either library is
read by the other (from_pretrained / save_pretrained). The math is reference/rwkv4.py's; the structure and the
names follow the Hugging Face RWKV page (https://huggingface.co/docs/transformers/model_doc/rwkv) and
transformers' modeling_rwkv.py:

    block i:  x = pre_ln(x) (i = 0 only);  x += time_mix(ln1(x));  x += channel_mix(ln2(x))
    model:    ln_out(blocks(embeddings[input_ids]));  causal LM: logits = head(...)

Decoding: on a CPU, a call with one token of one sequence and no gradients runs as one C step (models/rwkv4/step.py,
rwkv4_step.c); any other call runs the torch ops below.

State: five tensors of shape (B, C, L), transformers' order: ffn_x_prev, att_x_prev, att_num, att_den, att_max
(att_* are (B, attention_hidden_size, L)); fp32 (float64 for a float64 model). Unlike transformers, the state
passed in is never modified, and attention_hidden_size != hidden_size works with a state.

Rescaling (rescale_every = n > 0) happens in eval mode, as in transformers: the outputs of attention.output and
feed_forward.value in block i are divided by 2^(i // n), and the residual stream by 2 after every n-th block.
transformers divides the weights themselves in place; dividing the inputs of those two layers instead is exact
(a power of two) and leaves the parameters, hence state_dict() and save_pretrained(), untouched.
"""
from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import torch
from torch import nn

from ...kernels.shared import accumulation_dtype, check_tensor
from ...kernels.wkv4 import INITIAL_MAX, wkv4
from ..base import (STATE_DTYPES, CausalLMMixin, ModelOutput, PretrainedMixin, check_bools,
                    check_positive_floats, check_positive_ints, check_state_dtype, check_token_ids)
from .. import decode
from . import step
from ..layers import Linear, token_shift

__all__ = ["RwkvConfig", "RwkvModel", "RwkvForCausalLM", "STATE_NAMES"]

STATE_NAMES = ("ffn_x_prev", "att_x_prev", "att_num", "att_den", "att_max")


@dataclasses.dataclass
class RwkvConfig:
    """The fields of transformers' RwkvConfig, same names, meanings and defaults (RWKV-4 169M-like defaults).
    attention_hidden_size defaults to hidden_size, intermediate_size to 4 * hidden_size. context_length only
    bounds transformers' CUDA kernel; here it is informational. use_cache: whether forward returns the state."""
    model_type: ClassVar[str] = "rwkv"

    vocab_size: int = 50277
    context_length: int = 1024
    hidden_size: int = 4096
    num_hidden_layers: int = 32
    attention_hidden_size: int | None = None
    intermediate_size: int | None = None
    layer_norm_epsilon: float = 1e-5
    bos_token_id: int = 0
    eos_token_id: int = 0
    rescale_every: int = 6
    tie_word_embeddings: bool = False
    use_cache: bool = True

    def __post_init__(self):
        if self.attention_hidden_size is None:
            self.attention_hidden_size = self.hidden_size
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        check_positive_ints(self, ("vocab_size", "hidden_size", "num_hidden_layers", "attention_hidden_size",
                                   "intermediate_size"))
        check_positive_floats(self, ("layer_norm_epsilon",))
        check_bools(self, ("tie_word_embeddings", "use_cache"))
        if not isinstance(self.rescale_every, int) or isinstance(self.rescale_every, bool) or self.rescale_every < 0:
            raise ValueError(f"RwkvConfig.rescale_every must be an int >= 0 (0: never), got {self.rescale_every!r}")


def _mix(x, xx, mu):
    """mu * x_t + (1 - mu) * x_{t-1} as x_{t-1} + mu (x_t - x_{t-1}), one op (decoding is bound by op count):
    transformers' time_mix_* parameters have shape (1, 1, C)."""
    return torch.lerp(xx, x, mu)


class RwkvSelfAttention(nn.Module):
    """Time mix: W_o (sigmoid(r) * WKV(w, u, k, v)), r, k, v from the token-shifted input."""

    def __init__(self, config: RwkvConfig):
        super().__init__()
        C, A = config.hidden_size, config.attention_hidden_size
        self.time_decay = nn.Parameter(torch.empty(A))       # w = -exp(time_decay), the per-step log decay
        self.time_first = nn.Parameter(torch.empty(A))       # u, the current token's bonus
        self.time_mix_key = nn.Parameter(torch.empty(1, 1, C))
        self.time_mix_value = nn.Parameter(torch.empty(1, 1, C))
        self.time_mix_receptance = nn.Parameter(torch.empty(1, 1, C))
        self.key = Linear(C, A, bias=False)
        self.value = Linear(C, A, bias=False)
        self.receptance = Linear(C, A, bias=False)
        self.output = Linear(A, C, bias=False)

    def forward(self, x, x_prev, wkv_state, out_scale: float, backend):
        xx = token_shift(x, x_prev)
        r = self.receptance(_mix(x, xx, self.time_mix_receptance))
        k = self.key(_mix(x, xx, self.time_mix_key))
        v = self.value(_mix(x, xx, self.time_mix_value))
        # w and u at the state's precision (fp32 beside fp16/bf16 k, v): -exp(time_decay) overflows fp16 from 11.09
        w = -torch.exp(self.time_decay.to(wkv_state[0].dtype))
        wkv, wkv_state = wkv4(w, self.time_first.to(wkv_state[0].dtype), k, v, state=wkv_state, backend=backend)
        return self.output(torch.sigmoid(r) * wkv * out_scale), x[:, -1], wkv_state


class RwkvFeedForward(nn.Module):
    """Channel mix: sigmoid(r) * W_v relu(k)^2, r and k from the token-shifted input."""

    def __init__(self, config: RwkvConfig):
        super().__init__()
        C, F_ = config.hidden_size, config.intermediate_size
        self.time_mix_key = nn.Parameter(torch.empty(1, 1, C))
        self.time_mix_receptance = nn.Parameter(torch.empty(1, 1, C))
        self.key = Linear(C, F_, bias=False)
        self.receptance = Linear(C, C, bias=False)
        self.value = Linear(F_, C, bias=False)

    def forward(self, x, x_prev, out_scale: float):
        xx = token_shift(x, x_prev)
        k = torch.square(torch.relu(self.key(_mix(x, xx, self.time_mix_key))))
        r = torch.sigmoid(self.receptance(_mix(x, xx, self.time_mix_receptance)))
        return r * self.value(k * out_scale), x[:, -1]


class RwkvBlock(nn.Module):
    def __init__(self, config: RwkvConfig, layer_id: int):
        super().__init__()
        C, eps = config.hidden_size, config.layer_norm_epsilon
        # Only block 0 normalizes the embeddings first (transformers' pre_ln).
        self.pre_ln = nn.LayerNorm(C, eps=eps) if layer_id == 0 else None
        self.ln1 = nn.LayerNorm(C, eps=eps)
        self.ln2 = nn.LayerNorm(C, eps=eps)
        self.attention = RwkvSelfAttention(config)
        self.feed_forward = RwkvFeedForward(config)

    def forward(self, x, layer_state, out_scale: float, backend):
        """layer_state: (ffn_x_prev, att_x_prev, att_num, att_den, att_max) of this block, each (B, C or A)."""
        ffn_prev, att_prev, *wkv_state = layer_state
        if self.pre_ln is not None:
            x = self.pre_ln(x)
        dx, att_prev, wkv_state = self.attention(self.ln1(x), att_prev, tuple(wkv_state), out_scale, backend)
        x = x + dx
        dx, ffn_prev = self.feed_forward(self.ln2(x), ffn_prev, out_scale)
        return x + dx, (ffn_prev, att_prev, *wkv_state)


class RwkvModel(PretrainedMixin, nn.Module):
    """Embeddings, blocks, ln_out; transformers' RwkvModel names (embeddings.weight, blocks.i...., ln_out.*)."""
    config_class = RwkvConfig
    base_model_prefix = "rwkv"
    # fp32 beside fp16/bf16 weights, as transformers keeps them (_keep_in_fp32_modules): -exp(time_decay) overflows
    # fp16 from 11.09, and bf16's 8 bits would move each channel's half-life
    keep_in_fp32 = ("time_decay", "time_first")

    def __init__(self, config: RwkvConfig):
        super().__init__()
        self.config = config
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList([RwkvBlock(config, i) for i in range(config.num_hidden_layers)])
        # transformers builds ln_out with the default eps (1e-5), not layer_norm_epsilon; so do we.
        self.ln_out = nn.LayerNorm(config.hidden_size)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """A simple start for training from scratch (load a checkpoint for real use): torch's default Linear and
        LayerNorm, N(0, 1) embeddings; decays spread from slow (time_decay = -5) to fast (+3) across channels,
        bonus log(0.3), and token-shift mixes growing from 0 to 1 across channels."""
        C = self.config.hidden_size
        for block in self.blocks:
            att, ffn = block.attention, block.feed_forward
            att.time_decay.copy_(torch.linspace(-5, 3, att.time_decay.numel()))
            att.time_first.fill_(math.log(0.3))
            for mu in (att.time_mix_key, att.time_mix_value, att.time_mix_receptance, ffn.time_mix_key,
                       ffn.time_mix_receptance):
                mu.copy_(torch.linspace(0, 1, C).view(1, 1, C))

    def _state_widths(self) -> tuple:
        return (self.config.hidden_size,) * 2 + (self.config.attention_hidden_size,) * 3

    def initial_state(self, batch: int, device=None, dtype=torch.float32) -> list[torch.Tensor]:
        """The state before any token: zeros, and the WKV max at INITIAL_MAX.

        Args:
            batch: B. device: where the tensors live (default the CPU).
            dtype: torch.float32 or torch.float64 (fp16 would turn INITIAL_MAX into -inf).

        Returns:
            the five tensors of the module docstring, each (B, C or attention_hidden_size, L).
        """
        check_state_dtype(dtype)
        L = self.config.num_hidden_layers
        state = [torch.zeros(batch, c, L, device=device, dtype=dtype) for c in self._state_widths()]
        state[4].fill_(INITIAL_MAX)
        return state

    def _check_state(self, state, batch: int) -> list[torch.Tensor]:
        if not isinstance(state, (list, tuple)) or len(state) != 5:
            raise ValueError(f"state must be a list of 5 tensors {STATE_NAMES}, got {type(state).__name__}"
                             f"{' of length ' + str(len(state)) if isinstance(state, (list, tuple)) else ''}")
        L = self.config.num_hidden_layers
        return [check_tensor(f"state[{i}] ({STATE_NAMES[i]})", s, (batch, c, L), dtypes=STATE_DTYPES)
                for i, (s, c) in enumerate(zip(state, self._state_widths()))]

    def forward(self, input_ids, state=None, use_cache: bool | None = None, output_hidden_states: bool = False,
                backend: str | None = None) -> ModelOutput:
        """Run the blocks over a sequence, from a state.

        Args:
            input_ids: (B, T) integer token ids in [0, vocab_size).
            state: None (the initial state) or the five (B, C, L) fp32/float64 tensors of a previous call; never
                modified.
            use_cache: whether to return the state (default config.use_cache).
            output_hidden_states: whether to return each block's output (after rescaling), then ln_out's output.
            backend: the WKV op's backend, which kernels/backends.py dispatches (None: the first that takes the call).
                The forward itself: A call takes the first path that takes it, in this order: "c" (one token of one
                sequence on a CPU, fp32 or bf16 weights and state, no gradient, backend None or "c"), "ops" (any other
                call: the torch modules, each op on its own backend). The step_path of models/decode.py decides.

        Returns:
            ModelOutput(last_hidden_state (B, T, C), state or None, hidden_states or None).
        """
        input_ids = check_token_ids(input_ids, self.config.vocab_size)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        B, state_dtype = input_ids.shape[0], accumulation_dtype(self.embeddings.weight.dtype)
        state = None if state is None else self._check_state(state, B)
        every = self.config.rescale_every if not self.training else 0
        if decode.step_path(self, input_ids, state, backend, variant=step.variant(self.config),
                            limit=step.limit(self.config), output_hidden_states=output_hidden_states) == "c":
            x, state = step.rwkv4_step(self, input_ids, state, every)
            return ModelOutput(x, state if use_cache else None, None)
        x = self.embeddings(input_ids)
        if state is None:
            state = self.initial_state(B, x.device, state_dtype)
        new_state, hidden_states = [], []
        for i, block in enumerate(self.blocks):
            out_scale = 0.5 ** (i // every) if every > 0 else 1.0
            x, layer_state = block(x, [s[..., i].to(state_dtype) for s in state], out_scale, backend)
            new_state.append(layer_state)
            if every > 0 and (i + 1) % every == 0:
                x = x / 2
            hidden_states.append(x)
        x = self.ln_out(x)
        hidden_states.append(x)
        state = [torch.stack([s.to(state_dtype) for s in per_name], dim=-1) for per_name in zip(*new_state)]
        return ModelOutput(x, state if use_cache else None, tuple(hidden_states) if output_hidden_states else None)


class RwkvForCausalLM(CausalLMMixin, nn.Module):
    """RwkvModel (as .rwkv) and the language-model head (.head): transformers' RwkvForCausalLM names. forward adds
    logits and the loss to RwkvModel.forward; generate continues a prompt (models/base.py)."""
    config_class = RwkvConfig
    base_model_class = RwkvModel
    base_model_prefix = "rwkv"
    head_name = "head"
    keep_in_fp32 = RwkvModel.keep_in_fp32
