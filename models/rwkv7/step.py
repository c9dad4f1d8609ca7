"""RWKV-7's C path: its decoding step (one token of one sequence through Rwkv7 in one call, rwkv7_step.c) and its
time mix after the matrix products (rwkv7_time_mix.c, which the prompts take on a CPU without gradients, and
the step runs too), their weights' layout, their library and their binding, beside the torch modules that
compute the same (models/rwkv7/__init__.py: TimeMix._mix is the time mix's torch form). models/decode.py is the
machinery every model's step shares and says when the forward takes this path."""
from __future__ import annotations

from pathlib import Path

import torch

from ...kernels.shared import new_output
from ...kernels.wkv7.c import MAX_HEAD as WKV7_MAX_HEAD
from .. import decode
from ..decode import Layout, Weight, weight

__all__ = ["TIME_MIX", "LAYOUT", "SOURCES", "TIME_MIX_PATH", "variant", "limit", "time_mix_path", "rwkv7_step",
           "rwkv7_time_mix"]

HERE = Path(__file__).parent

TIME_MIX = (weight("W0", "w0", contiguous=True), weight("A0", "a0", contiguous=True),
            weight("V0", "v0", optional=True, contiguous=True), weight("K_K", "k_k", contiguous=True),
            weight("K_A", "k_a", contiguous=True), weight("R_K", "r_k", contiguous=True),
            weight("LN_X_W", "ln_x.weight", contiguous=True), weight("LN_X_B", "ln_x.bias", contiguous=True))

# The step's sizes (BF16: the embedding's dtype, the activations' and the x_prev states') and its weights in the
# order it reads them (BlinkDL's names); r_k, read by element, is contiguous
LAYOUT = Layout("R7", "blocks", dims=("C", "H", "N", "F", "L", "DW", "DA", "DV", "DG", "BF16"),
                head=(weight("LN0_W", "blocks.0.ln0.weight"), weight("LN0_B", "blocks.0.ln0.bias")),
                block=(weight("LN1_W", "ln1.weight"), weight("LN1_B", "ln1.bias"), weight("LN2_W", "ln2.weight"),
                       weight("LN2_B", "ln2.bias"), weight("X_R", "att.x_r"), weight("X_W", "att.x_w"),
                       weight("X_K", "att.x_k"), weight("X_V", "att.x_v"), weight("X_A", "att.x_a"),
                       weight("X_G", "att.x_g"),
                       *(Weight(w.name, "att." + w.path, w.optional, w.transposed, w.contiguous)
                         for w in TIME_MIX),
                       weight("W1", "att.w1", transposed=True), weight("W2", "att.w2", transposed=True),
                       weight("A1", "att.a1", transposed=True), weight("A2", "att.a2", transposed=True),
                       weight("V1", "att.v1", optional=True, transposed=True),
                       weight("V2", "att.v2", optional=True, transposed=True),
                       weight("G1", "att.g1", transposed=True), weight("G2", "att.g2", transposed=True),
                       weight("RECEPTANCE", "att.receptance.weight"), weight("KEY", "att.key.weight"),
                       weight("VALUE", "att.value.weight"), weight("OUTPUT", "att.output.weight"),
                       weight("FFN_X_K", "ffn.x_k"), weight("FFN_KEY", "ffn.key.weight"),
                       weight("FFN_VALUE", "ffn.value.weight")),
                tail=(weight("LN_OUT_W", "ln_out.weight"), weight("LN_OUT_B", "ln_out.bias")))
SOURCES = decode.step_sources("rwkv7_step", HERE / "rwkv7_step.h", (HERE / "rwkv7_step.c", HERE / "rwkv7_time_mix.c"),
                              (LAYOUT,), {"MIX": TIME_MIX})
TIME_MIX_PATH = decode.PART      # the time mix: "c" (rwkv7_time_mix) or "ops" (TimeMix._mix)


def variant(config) -> str | None:
    """Why the C code does not compute this configuration (None: it does)."""
    if getattr(config, "time_mix_variant", None):           # another time mix on RWKV-7's frame (experiments)
        return f"computes RWKV-7's own time mix, not {config.time_mix_variant}"
    if getattr(config, "wide_in_context_rate", False):
        return "computes the published RWKV-7 only, not wide_in_context_rate"
    return None


def limit(head_size: int) -> str | None:
    """A head size the C code does not take (None: it takes it): the WKV-7 loop's."""
    if head_size > WKV7_MAX_HEAD:
        return f"takes head sizes N <= {WKV7_MAX_HEAD}, got N = {head_size}"
    return None


def time_mix_path(att: torch.nn.Module, backend, *inputs: torch.Tensor) -> str:
    """Which path RWKV-7's time mix ``att`` takes after its matrix products: "c" (rwkv7_time_mix) or "ops"
    (TimeMix._mix); models/decode.py's part_path decides.

    Args:
        att: the TimeMix. backend: the forward's backend argument. inputs: every tensor the C code would read
            besides the parameters (None skipped), the state's kv included.

    Returns:
        "c" or "ops".
    """
    return decode.part_path("rwkv7_time_mix", att, backend, *inputs,
                            variant=variant(att), limit=limit(att.r_k.shape[1]))


def rwkv7_time_mix(att, r, k, v, v_first, wl, al, vl, g, state) -> tuple[torch.Tensor, torch.Tensor]:
    """RWKV-7's time mix between its matrix products (models/rwkv7/'s TimeMix._mix, the same arguments) in C: one
    pass per (batch row, head) over its tokens, the recurrence included, on torch's thread count.

    Args:
        att: the TimeMix. r, k, v, wl, al, g: (B, T, C), read in r's dtype; v_first, vl: the same, or None in
            block 0. state: (B, H, N, N) fp32.

    Returns:
        (GroupNorm(y) + bonus, times g: (B, T, C) in the model's dtype; the new state (B, H, N, N) fp32).
    """
    B, T, C = r.shape
    H, N = att.r_k.shape
    acts = [None if t is None else t.to(r.dtype).contiguous() for t in (r, k, v, v_first, wl, al, vl, g)]
    new_state = decode.native.initial_state(state, state.shape)
    out, params = new_output(r.shape, r.dtype, r.device), [w.of(att) for w in TIME_MIX]   # params: held for the call
    decode.invoke(SOURCES, "rwkv7_time_mix", f"r_k of shape {tuple(att.r_k.shape)}", threads=torch.get_num_threads(),
                  B=B, T=T, H=H, N=N, act_bf16=decode.DTYPES[r.dtype],
                  **dict(zip(("r", "k", "v", "v_first", "wl", "al", "vl", "g"), acts)),
                  params=decode.pointers(params), params_bf16=decode.bf16_flags(params), group_eps=att.ln_x.eps,
                  state=new_state, out=out)
    return out, new_state


def rwkv7_step(model, token: torch.Tensor, state: list | None) -> tuple[torch.Tensor, list]:
    """One token through Rwkv7 (models/rwkv7/) in C, up to ln_out.

    Args:
        model: the Rwkv7. token: (1, 1) token id. state: per layer (att_x_prev (1, C) in the model's dtype, att_kv
            (1, H, N, N) fp32, ffn_x_prev (1, C)), or None.

    Returns:
        (ln_out's output (1, 1, C) in the model's dtype, the new state: new tensors, the same layout).
    """
    cfg = model.config
    state = model.initial_state(1) if state is None else state
    weights = LAYOUT.pack(model)
    embedding = model.emb.weight[token.reshape(())].contiguous()
    dims = LAYOUT.sizes(C=cfg.n_embd, H=cfg.n_head, N=cfg.head_size, F=cfg.dim_ffn, L=cfg.n_layer,
                        DW=cfg.decay_lora, DA=cfg.a_lora, DV=cfg.v_lora, DG=cfg.gate_lora,
                        BF16=decode.DTYPES[embedding.dtype])
    # att_x_prev, ffn_x_prev in the activations' dtype (the embedding's), att_kv fp32
    state, new_state = decode.step_states([s for layer in state for s in layer],
                               [embedding.dtype, torch.float32, embedding.dtype] * len(state))
    hidden = decode.call_step(SOURCES, "rwkv7_decode", dims,
                              dict(eps=cfg.layer_norm_epsilon, group_eps=cfg.group_norm_epsilon), weights,
                   embedding, state, new_state)
    return hidden, [tuple(new_state[i:i + 3]) for i in range(0, len(new_state), 3)]
