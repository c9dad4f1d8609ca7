"""RWKV-4's decoding step in C: one token of one sequence through RwkvModel in one call (rwkv4_step.c), its
weights' layout, its library and its binding. models/decode.py is the machinery every model's step shares and
says when the forward takes this path."""
from __future__ import annotations

from pathlib import Path

import torch

from .. import decode
from ..decode import Layout, weight

__all__ = ["LAYOUT", "SOURCES", "variant", "limit", "rwkv4_step"]

HERE = Path(__file__).parent

# The step's sizes (BF16: the embedding's dtype) and its weights in the order it reads them (transformers' names)
LAYOUT = Layout("R4", "blocks", dims=("C", "A", "F", "L", "RESCALE_EVERY", "BF16"),
                head=(weight("PRE_LN_W", "blocks.0.pre_ln.weight"), weight("PRE_LN_B", "blocks.0.pre_ln.bias")),
                block=(weight("LN1_W", "ln1.weight"), weight("LN1_B", "ln1.bias"), weight("LN2_W", "ln2.weight"),
                       weight("LN2_B", "ln2.bias"), weight("DECAY", "attention.time_decay"),
                       weight("FIRST", "attention.time_first"), weight("MIX_K", "attention.time_mix_key"),
                       weight("MIX_V", "attention.time_mix_value"), weight("MIX_R", "attention.time_mix_receptance"),
                       weight("KEY", "attention.key.weight"), weight("VALUE", "attention.value.weight"),
                       weight("RECEPTANCE", "attention.receptance.weight"), weight("OUTPUT", "attention.output.weight"),
                       weight("FFN_MIX_K", "feed_forward.time_mix_key"),
                       weight("FFN_MIX_R", "feed_forward.time_mix_receptance"),
                       weight("FFN_KEY", "feed_forward.key.weight"),
                       weight("FFN_RECEPTANCE", "feed_forward.receptance.weight"),
                       weight("FFN_VALUE", "feed_forward.value.weight")),
                tail=(weight("LN_OUT_W", "ln_out.weight"), weight("LN_OUT_B", "ln_out.bias")))
SOURCES = decode.step_sources("rwkv4_step", HERE / "rwkv4_step.h", (HERE / "rwkv4_step.c",), (LAYOUT,))


def variant(config) -> str | None:
    """Why the C step does not compute this configuration (None: it does): it computes every RwkvConfig."""
    return None


def limit(config) -> str | None:
    """A size the C step does not take (None: none)."""
    return None


def rwkv4_step(model, token: torch.Tensor, state: list[torch.Tensor] | None, rescale_every: int
               ) -> tuple[torch.Tensor, list]:
    """One token through RwkvModel (models/rwkv4/) in C.

    Args:
        model: the RwkvModel. token: (1, 1) token id. state: the five (1, C or A, L) fp32 tensors, or None.
        rescale_every: as the forward rescales (0 in training mode: never).

    Returns:
        (ln_out's output (1, 1, C) in the model's dtype, the new state: five new tensors).
    """
    cfg = model.config
    state = model.initial_state(1) if state is None else state
    weights = LAYOUT.pack(model)
    embedding = model.embeddings.weight[token.reshape(())].contiguous()
    dims = LAYOUT.sizes(C=cfg.hidden_size, A=cfg.attention_hidden_size, F=cfg.intermediate_size,
                        L=cfg.num_hidden_layers, RESCALE_EVERY=rescale_every, BF16=decode.DTYPES[embedding.dtype])
    state, new_state = decode.step_states(state, [torch.float32] * len(state))
    hidden = decode.call_step(SOURCES, "rwkv4_decode", dims, dict(eps=cfg.layer_norm_epsilon), weights, embedding,
                              state, new_state)
    return hidden, new_state
