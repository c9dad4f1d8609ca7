"""Mamba in torch, on the selective scan of kernels/ssm/, with transformers' parameter names.

A state dict of transformers' MambaModel / MambaForCausalLM loads as is, and a directory saved by either library is
read by the other (from_pretrained / save_pretrained). The math is reference/mamba.py's (see its glossary); the
structure follows transformers' modeling_mamba.py and the Mamba part of the RWKV/Mamba study notes:

    block:  x + out_proj(selective_scan(u = SiLU(conv1d(x_in)), delta, A, B, C, D) * SiLU(z)),
            x_in, z = in_proj(RMSNorm(x));  dt_low, B, C = x_proj(u);  delta = softplus(dt_proj(dt_low))
    model:  norm_f(blocks(embeddings[input_ids]));  causal LM: logits = lm_head(...) (tied to the embeddings by
            default)

Decoding: on a CPU, a call with one token of one sequence and no gradients runs as one C step (models/mamba/step.py,
mamba_step.c); any other call runs the torch ops below.

State: a list with one (conv window (B, D, K - 1), h (B, D, N)) per block, fp32 (float64 for a float64 model):
the last K - 1 inputs of the causal convolution and the SSM state. transformers keeps K inputs in its conv cache
(the oldest is never used again) and restarts the SSM from zero when a cached call has more than one token; here
any split of a sequence gives the result of the whole.
"""
from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ...kernels.shared import accumulation_dtype, check_tensor
from ...kernels.ssm import selective_scan
from ..base import (STATE_DTYPES, CausalLMMixin, ModelOutput, PretrainedMixin, check_bools,
                    check_positive_floats, check_positive_ints, check_state_dtype, check_token_ids)
from .. import decode
from . import step
from ..layers import Linear, linear

__all__ = ["MambaConfig", "MambaModel", "MambaForCausalLM"]


@dataclasses.dataclass
class MambaConfig:
    """The inference fields of transformers' MambaConfig, same names, meanings and defaults. intermediate_size
    (D) is expand * hidden_size; time_step_rank "auto" means ceil(hidden_size / 16). time_step_min/max/floor only
    shape the initial dt_proj bias. residual_in_fp32: the residual stream of an fp16/bf16 model stays in fp32.
    Only hidden_act = "silu" (every Mamba checkpoint's) is supported.

    gate, not a field of transformers' config (off the published model when False): False drops the block's gate,
    y = out_proj(selective_scan(u, ...)) without the SiLU(z) factor, and in_proj makes x_in alone; the "no gate" rows
    of the Mamba paper's Table 1, which the selective-copying experiment trains. The C decoding step refuses it."""
    model_type: ClassVar[str] = "mamba"

    vocab_size: int = 50280
    hidden_size: int = 768
    state_size: int = 16
    num_hidden_layers: int = 32
    layer_norm_epsilon: float = 1e-5
    pad_token_id: int = 0
    bos_token_id: int = 0
    eos_token_id: int = 0
    expand: int = 2
    conv_kernel: int = 4
    use_bias: bool = False
    use_conv_bias: bool = True
    hidden_act: str = "silu"
    residual_in_fp32: bool = True
    time_step_rank: int | str = "auto"
    time_step_min: float = 0.001
    time_step_max: float = 0.1
    time_step_floor: float = 1e-4
    use_cache: bool = True
    tie_word_embeddings: bool = True
    gate: bool = True
    intermediate_size: int = dataclasses.field(init=False)

    def __post_init__(self):
        self.intermediate_size = int(self.expand * self.hidden_size)
        if self.time_step_rank == "auto":
            self.time_step_rank = math.ceil(self.hidden_size / 16)
        check_positive_ints(self, ("vocab_size", "hidden_size", "state_size", "num_hidden_layers",
                                   "intermediate_size", "conv_kernel", "time_step_rank"))
        check_positive_floats(self, ("layer_norm_epsilon", "time_step_min", "time_step_max", "time_step_floor"))
        check_bools(self, ("use_bias", "use_conv_bias", "residual_in_fp32", "use_cache", "tie_word_embeddings",
                           "gate"))
        if self.hidden_act != "silu":
            raise ValueError(f"MambaConfig.hidden_act: only 'silu' is supported, got {self.hidden_act!r}")


class MambaRMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, computed in fp32 (or float64), returned in the input dtype."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        xf = x.to(accumulation_dtype(x.dtype))
        return self.weight * (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class MambaMixer(nn.Module):
    def __init__(self, config: MambaConfig):
        super().__init__()
        C, D, N, K = config.hidden_size, config.intermediate_size, config.state_size, config.conv_kernel
        self.time_step_rank = config.time_step_rank
        self.gate = config.gate
        self.in_proj = Linear(C, 2 * D if self.gate else D, bias=config.use_bias)     # (x_in, z) or x_in alone
        # Depthwise (groups = D); transformers' padding K - 1 is replaced by the conv window of the state.
        self.conv1d = nn.Conv1d(D, D, K, groups=D, bias=config.use_conv_bias)
        self.x_proj = Linear(D, self.time_step_rank + 2 * N, bias=False)
        self.dt_proj = Linear(self.time_step_rank, D, bias=True)
        self.A_log = nn.Parameter(torch.empty(D, N))          # A = -exp(A_log)
        self.D = nn.Parameter(torch.empty(D))                 # the skip term D * u
        self.out_proj = Linear(D, C, bias=config.use_bias)

    def forward(self, x, layer_state, backend):
        """x: (B, T, C) after the norm; layer_state: (conv window (B, D, K - 1), h (B, D, N))."""
        window, h = layer_state
        N = self.A_log.shape[1]
        xz = self.in_proj(x).transpose(1, 2)                                      # (B, 2D or D, T)
        x_in, z = xz.chunk(2, dim=1) if self.gate else (xz, None)                 # (B, D, T) each
        padded = torch.cat([window.to(x_in.dtype), x_in], dim=-1)                 # (B, D, K - 1 + T)
        u = F.silu(self._causal_conv(padded))                                    # (B, D, T)
        window = padded[..., padded.shape[-1] - window.shape[-1]:]                # the last K - 1 inputs
        dt_low, B, C = self.x_proj(u.transpose(1, 2)).split([self.time_step_rank, N, N], dim=-1)
        delta = linear(dt_low, self.dt_proj.weight).transpose(1, 2)              # (B, D, T); bias: in the scan
        # A, D and the step bias go in at the state's precision (fp32 for an fp16 model), as Mamba keeps them.
        A = -torch.exp(self.A_log.to(h.dtype))
        y, h = selective_scan(u, delta, A, B.transpose(1, 2), C.transpose(1, 2), D=self.D.to(h.dtype), z=z,
                              delta_bias=self.dt_proj.bias.to(h.dtype), delta_softplus=True, state=h, backend=backend)
        return self.out_proj(y.transpose(1, 2)), (window, h)

    def _causal_conv(self, padded):
        """The depthwise causal convolution over padded (B, D, K - 1 + T) -> (B, D, T). A decoding step's one output
        is the window weighted and summed: two ops, where conv1d's setup cost ten times as much (150 us a layer)."""
        weight, bias = self.conv1d.weight, self.conv1d.bias                      # (D, 1, K), (D,) or None
        if padded.shape[-1] > weight.shape[-1]:
            return F.conv1d(padded, weight, bias, groups=padded.shape[1])
        out = (padded * weight[:, 0]).sum(-1, keepdim=True)                      # (B, D, 1)
        return out if bias is None else out + bias[:, None]


class MambaBlock(nn.Module):
    def __init__(self, config: MambaConfig):
        super().__init__()
        self.residual_in_fp32 = config.residual_in_fp32
        self.norm = MambaRMSNorm(config.hidden_size, config.layer_norm_epsilon)
        self.mixer = MambaMixer(config)

    def forward(self, x, layer_state, backend):
        residual = x.to(accumulation_dtype(x.dtype)) if self.residual_in_fp32 else x
        out, layer_state = self.mixer(self.norm(x.to(self.norm.weight.dtype)), layer_state, backend)
        return residual + out, layer_state


class MambaModel(PretrainedMixin, nn.Module):
    """Embeddings, blocks (layers.i.norm, layers.i.mixer.*), norm_f; transformers' MambaModel names."""
    config_class = MambaConfig
    base_model_prefix = "backbone"
    # fp32 beside fp16/bf16 weights, as mamba_ssm and transformers compute with them: A = -exp(A_log), the skip D
    # and delta's bias (the scan's inputs that may stay fp32)
    keep_in_fp32 = ("A_log", "D", "dt_proj.bias")

    def __init__(self, config: MambaConfig):
        super().__init__()
        self.config = config
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([MambaBlock(config) for _ in range(config.num_hidden_layers)])
        self.norm_f = MambaRMSNorm(config.hidden_size, config.layer_norm_epsilon)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Mamba's initialization of the SSM part (S4D-real A = -(1, ..., N) per channel, D = 1, dt_proj bias such
        that softplus(bias) is log-uniform in [time_step_min, time_step_max]); torch's defaults elsewhere."""
        cfg = self.config
        for layer in self.layers:
            mixer = layer.mixer
            mixer.A_log.copy_(torch.log(torch.arange(1.0, cfg.state_size + 1)).expand_as(mixer.A_log))
            mixer.D.fill_(1.0)
            nn.init.uniform_(mixer.dt_proj.weight, -cfg.time_step_rank ** -0.5, cfg.time_step_rank ** -0.5)
            lo, hi = math.log(cfg.time_step_min), math.log(cfg.time_step_max)
            dt = torch.exp(torch.rand(cfg.intermediate_size) * (hi - lo) + lo).clamp(min=cfg.time_step_floor)
            mixer.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))          # softplus^-1(dt)

    def initial_state(self, batch: int, device=None, dtype=torch.float32) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The state before any token: zeros.

        Args:
            batch: B. device: where the tensors live (default the CPU). dtype: torch.float32 or torch.float64.

        Returns:
            per block (conv window (B, D, K - 1), h (B, D, N)).
        """
        check_state_dtype(dtype)
        cfg = self.config
        D, K, N = cfg.intermediate_size, cfg.conv_kernel, cfg.state_size
        return [(torch.zeros(batch, D, K - 1, device=device, dtype=dtype),
                 torch.zeros(batch, D, N, device=device, dtype=dtype)) for _ in range(cfg.num_hidden_layers)]

    def _check_state(self, state, batch: int) -> list:
        cfg = self.config
        L, D, K, N = cfg.num_hidden_layers, cfg.intermediate_size, cfg.conv_kernel, cfg.state_size
        if not isinstance(state, (list, tuple)) or len(state) != L or not all(
                isinstance(pair, (list, tuple)) and len(pair) == 2 for pair in state):
            raise ValueError(f"state must be a list of {L} (conv window, h) pairs, one per block")
        return [(check_tensor(f"state[{i}][0] (conv window)", window, (batch, D, K - 1), dtypes=STATE_DTYPES),
                 check_tensor(f"state[{i}][1] (h)", h, (batch, D, N), dtypes=STATE_DTYPES))
                for i, (window, h) in enumerate(state)]

    def forward(self, input_ids, state=None, use_cache: bool | None = None, output_hidden_states: bool = False,
                backend: str | None = None) -> ModelOutput:
        """Run the blocks over a sequence, from a state.

        Args:
            input_ids: (B, T) integer token ids in [0, vocab_size).
            state: None (the initial state) or the per-block (conv window, h) pairs of a previous call (fp32 or
                float64); never modified.
            use_cache: whether to return the state (default config.use_cache).
            output_hidden_states: whether to return each block's output, then norm_f's output.
            backend: the scan's backend, which kernels/backends.py dispatches (None: the first that takes the call).
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
        if decode.step_path(self, input_ids, state, backend, variant=step.variant(self.config),
                            limit=step.limit(self.config), output_hidden_states=output_hidden_states) == "c":
            x, state = step.mamba_step(self, input_ids, state)
            return ModelOutput(x, state if use_cache else None, None)
        x = self.embeddings(input_ids)
        state = self.initial_state(B, x.device, state_dtype) if state is None else state
        new_state, hidden_states = [], []
        for layer, (window, h) in zip(self.layers, state):
            x, (window, h) = layer(x, (window, h.to(state_dtype)), backend)
            new_state.append((window.to(state_dtype), h.to(state_dtype)))
            hidden_states.append(x)
        x = self.norm_f(x.to(self.norm_f.weight.dtype))
        hidden_states.append(x)
        return ModelOutput(x, new_state if use_cache else None, tuple(hidden_states) if output_hidden_states else None)


class MambaForCausalLM(CausalLMMixin, nn.Module):
    """MambaModel (as .backbone) and lm_head (tied to the embeddings when tie_word_embeddings, the default):
    transformers' MambaForCausalLM names. forward adds logits and the loss to MambaModel.forward; generate
    continues a prompt (models/base.py)."""
    config_class = MambaConfig
    base_model_class = MambaModel
    base_model_prefix = "backbone"
    head_name = "lm_head"
    keep_in_fp32 = MambaModel.keep_in_fp32
