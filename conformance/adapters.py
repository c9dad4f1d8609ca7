"""Adapters: the conventions people's kernels actually have, turned into seqmix's, so that a function plugs in
unchanged. Each takes the function under test and returns one with the signature of seqmix.kernels' op; each says
which versions of the peer it was written against (a later version that changes a convention needs a new one).

seqmix's conventions, for comparison: WKV-7 tensors (B, T, H, N), log_w the log decay (decay = exp(log_w)), y_t =
S_t r_t unscaled, state (B, H, N, N) indexed [value, key]; WKV-4 w = -exp(time_decay), state (num, den, max);
attention (B, H, T, d). Conversions of a decay (log, exp) are done in fp32 (float64 for float64 inputs); at fp16 and
bf16 the rounding of the converted decay, where the peer takes it in the input dtype, is counted against the kernel.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from ..kernels.shared import accumulation_dtype

__all__ = ["Adapter", "ADAPTERS", "fla", "fla_attention", "blinkdl", "rwkv7_hf", "transformers_rwkv4",
           "transformers_mamba"]


def _exact(x):
    """x in the dtype conversions are computed in: fp32, float64 for float64."""
    return x.to(accumulation_dtype(x.dtype))


def _transposed(state):
    return None if state is None else state.transpose(-1, -2).contiguous()


def _y_and_state(out):
    return tuple(out[:2]) if isinstance(out, (tuple, list)) else (out, None)


def fla(fn, *, order="rwkv7", head_first=False, scale=1.0):
    """fla's (flash-linear-attention) delta-rule layout, written against fla-core 0.6.0.

    The function is called as fn(*tensors, [scale=scale,] initial_state=S, output_final_state=True) and returns
    (o, final_state), with the state indexed [key, value] (seqmix's transposed) and w (gk) the log decay.

    Args:
        fn: the function under test.
        order: "rwkv7": tensors (r, w, k, v, a, b), as fla.ops.rwkv7.chunk_rwkv7 and fused_recurrent_rwkv7;
            "dplr": (q, k, v, a, b, gk), as the generalized delta rule ops (fla.ops.generalized_delta_rule:
            chunk_dplr_delta_rule, fused_recurrent_dplr_delta_rule, and dplr.naive's dplr_recurrence and
            dplr_chunkwise).
        head_first: tensors are [B, H, T, K] (the naive forms) instead of [B, T, H, K].
        scale: the ``scale=`` passed (RWKV-7 reads y = S r unscaled: 1.0; several fla ops default to K^-0.5);
            "inside" for a function that takes no scale and multiplies q by K^-0.5 itself (dplr.naive): r is then
            multiplied by sqrt(K) first.
    Returns:
        fn with the signature of seqmix.kernels.wkv7.wkv7.
    """
    if order not in ("rwkv7", "dplr"):
        raise ValueError(f"order must be 'rwkv7' or 'dplr', got {order!r}")

    def adapted(r, log_w, k, v, a, b, state=None):
        if scale == "inside":
            r = r * math.sqrt(r.shape[-1])
        r, log_w, k, v, a, b = (t.transpose(1, 2) if head_first else t for t in (r, log_w, k, v, a, b))
        tensors = (r, log_w, k, v, a, b) if order == "rwkv7" else (r, k, v, a, b, log_w)
        options = {} if scale == "inside" else {"scale": scale}
        o, S = _y_and_state(fn(*tensors, **options, initial_state=_transposed(state), output_final_state=True))
        return (o.transpose(1, 2) if head_first else o), _transposed(S)

    return adapted


def fla_attention(fn):
    """fla's attention layout, written against fla-core 0.6.0 (fla.ops.attn: naive.naive_parallel_attn,
    parallel_attn): fn(q, k, v, scale=None, causal=True) on [B, T, H, K] tensors, returning o or (o, extras).

    Returns:
        fn with the signature of seqmix.kernels.attention.attention ((B, H, T, d) tensors).
    """
    def adapted(q, k, v, causal=True, scale=None):
        o, _ = _y_and_state(fn(*(x.transpose(1, 2) for x in (q, k, v)), scale=scale, causal=causal))
        return o.transpose(1, 2)

    return adapted


def blinkdl(fn):
    """BlinkDL's RWKV-7 convention, written against RWKV-LM's v7 reference (RWKV7_OP in rwkv_v7_demo.py) and the
    ``rwkv`` package 0.8: fn(r, w, k, v, a, b) on (B, T, C) tensors, C = H * N (the function knows its HEAD_SIZE N:
    run the battery with that head size only), w raw: the decay is exp(-exp(w)), so log_w = -exp(w); a and b as
    the model passes them (a = -kk, b = kk * a_iclr), which are seqmix's a and b. When the function takes an
    initial state it gets ``state=`` (B, H, N, N) indexed [value, key], as seqmix's; it returns y or (y, state).

    Returns:
        fn with the signature of seqmix.kernels.wkv7.wkv7.
    """
    def adapted(r, log_w, k, v, a, b, state=None):
        B, T, H, N = r.shape
        w = torch.log(-_exact(log_w)).to(log_w.dtype)                    # log_w = -exp(w)
        out = fn(*(x.reshape(B, T, H * N) for x in (r, w, k, v, a, b)), **({} if state is None else {"state": state}))
        y, S = _y_and_state(out)
        return y.reshape(B, T, H, N), S

    return adapted


def rwkv7_hf(fn):
    """rwkv7-hf's operator boundary, written against rwkv7-hf 0.9.0 (rwkv7_hf.ops_rwkv7.rwkv7_recurrent):
    fn(receptance, decay, key, value, a, b, initial_state) on [B, T, H, K] tensors, decay multiplicative (exp of
    seqmix's log_w, passed in fp32 as its state is), the state [B, H, K, V] (key, value) and required.

    Returns:
        fn with the signature of seqmix.kernels.wkv7.wkv7.
    """
    def adapted(r, log_w, k, v, a, b, state=None):
        B, _, H, N = r.shape
        if state is None:
            state = torch.zeros(B, H, N, N, dtype=accumulation_dtype(r.dtype), device=r.device)
        y, S = fn(r, _exact(log_w).exp(), k, v, a, b, _transposed(state))
        return y, _transposed(S)

    return adapted


def transformers_rwkv4(fn):
    """transformers' RWKV-4 CPU loop, written against transformers 5.23 (models.rwkv.modeling_rwkv.
    rwkv_linear_attention_cpu): fn(time_decay, time_first, key, value, state=[num, den, max], return_state=True)
    -> (output, [num, den, max]), time_decay the raw parameter (w = -exp(time_decay)), time_first seqmix's u, the
    state in seqmix's order and meaning (seqmix took it from there).

    Returns:
        fn with the signature of seqmix.kernels.wkv4.wkv4.
    """
    def adapted(w, u, k, v, state=None):
        time_decay = torch.log(-_exact(w)).to(w.dtype)                   # w = -exp(time_decay); w = 0 gives -inf
        y, S = fn(time_decay, u, k, v, state=None if state is None else list(state), return_state=True)
        return y, tuple(S)

    return adapted


def transformers_mamba(fn):
    """transformers' Mamba scan, written against transformers 5.23 (models.mamba.modeling_mamba.
    mamba_selective_scan): fn(hidden_states, dt, A, B, C, D=, z=, delta_bias=, delta_softplus=,
    return_last_state=True) -> (y, last_state), seqmix's layout; it takes no initial state, so the battery runs
    without one (Options.state=False).

    Returns:
        fn with the signature of seqmix.kernels.ssm.selective_scan (without ``state=``).
    """
    def adapted(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
        return fn(u, delta, A, B, C, D=D, z=z, delta_bias=delta_bias, delta_softplus=delta_softplus,
                  return_last_state=True)

    adapted.conformance_options = {"state": False}
    return adapted


@dataclass(frozen=True)
class Adapter:
    """A named convention for the CLI's --adapter: the op it serves and the wrapper."""
    op: str
    wrap: Callable
    summary: str


ADAPTERS = {
    "fla": Adapter("wkv7", fla, "fla's rwkv7 ops: (r, w, k, v, a, b, scale=1.0, initial_state=, "
                   "output_final_state=), [B, T, H, K], state [K, V]"),
    "fla-dplr": Adapter("wkv7", lambda fn: fla(fn, order="dplr", head_first=True, scale="inside"),
                        "fla's naive generalized delta rule: (q, k, v, a, b, gk, initial_state=, "
                        "output_final_state=), [B, H, T, K], q scaled by K^-0.5 inside"),
    "fla-attn": Adapter("attention", fla_attention, "fla's attention: (q, k, v, scale=, causal=), [B, T, H, K]"),
    "blinkdl": Adapter("wkv7", blinkdl, "BlinkDL's RWKV7_OP: (r, w, k, v, a, b) on (B, T, C), decay exp(-exp(w))"),
    "rwkv7-hf": Adapter("wkv7", rwkv7_hf, "rwkv7-hf's rwkv7_recurrent: multiplicative decay, state [K, V]"),
    "transformers-rwkv4": Adapter("wkv4", transformers_rwkv4, "transformers' rwkv_linear_attention_cpu: "
                                  "(time_decay, time_first, key, value, state=, return_state=)"),
    "transformers-mamba": Adapter("selective_scan", transformers_mamba, "transformers' mamba_selective_scan: no "
                                  "initial state, return_last_state=True"),
}
