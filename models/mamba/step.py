"""Mamba's decoding step in C: one token of one sequence through MambaModel in one call (mamba_step.c), its
weights' layout, its library and its binding. models/decode.py is the machinery every model's step shares and
says when the forward takes this path."""
from __future__ import annotations

from pathlib import Path

import torch

from .. import decode
from ..decode import Layout, weight

__all__ = ["LAYOUT", "SOURCES", "variant", "limit", "mamba_step"]

HERE = Path(__file__).parent

# The step's sizes (BF16: the embedding's dtype) and its weights in the order it reads them (transformers' names);
# the conv weight and A_log, read by element, are contiguous
LAYOUT = Layout("M", "layers", dims=("C", "D", "N", "K", "R", "L", "BF16"), head=(),
                block=(weight("NORM", "norm.weight"), weight("IN_PROJ", "mixer.in_proj.weight"),
                       weight("IN_PROJ_B", "mixer.in_proj.bias"),
                       weight("CONV", "mixer.conv1d.weight", contiguous=True), weight("CONV_B", "mixer.conv1d.bias"),
                       weight("X_PROJ", "mixer.x_proj.weight"), weight("DT_PROJ", "mixer.dt_proj.weight"),
                       weight("DT_PROJ_B", "mixer.dt_proj.bias"), weight("A_LOG", "mixer.A_log", contiguous=True),
                       weight("D", "mixer.D"), weight("OUT_PROJ", "mixer.out_proj.weight"),
                       weight("OUT_PROJ_B", "mixer.out_proj.bias")),
                tail=(weight("NORM_F_W", "norm_f.weight"),))
SOURCES = decode.step_sources("mamba_step", HERE / "mamba_step.h", (HERE / "mamba_step.c",), (LAYOUT,))


def variant(config) -> str | None:
    """Why the C step does not compute this configuration (None: it does)."""
    if getattr(config, "gate", True) is False:
        return "computes Mamba's gated block only, not gate=False"
    return None


def limit(config) -> str | None:
    """A size the C step does not take (None: none)."""
    return None


def mamba_step(model, token: torch.Tensor, state: list | None) -> tuple[torch.Tensor, list]:
    """One token through MambaModel (models/mamba/) in C, up to norm_f.

    Args:
        model: the MambaModel. token: (1, 1) token id. state: per block (conv window (1, D, K - 1), h (1, D, N)),
            fp32, or None.

    Returns:
        (norm_f's output (1, 1, C) in the model's dtype, the new state: new tensors, the same layout).
    """
    cfg = model.config
    state = model.initial_state(1) if state is None else state
    weights = LAYOUT.pack(model)
    embedding = model.embeddings.weight[token.reshape(())].contiguous()
    dims = LAYOUT.sizes(C=cfg.hidden_size, D=cfg.intermediate_size, N=cfg.state_size, K=cfg.conv_kernel,
                        R=cfg.time_step_rank, L=cfg.num_hidden_layers, BF16=decode.DTYPES[embedding.dtype])
    state, new_state = decode.step_states([s for layer in state for s in layer], [torch.float32] * 2 * len(state))
    hidden = decode.call_step(SOURCES, "mamba_decode", dims, dict(eps=cfg.layer_norm_epsilon), weights, embedding,
                              state, new_state)
    return hidden, [tuple(new_state[i:i + 2]) for i in range(0, len(new_state), 2)]
