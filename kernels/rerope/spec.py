"""ReRoPE (prefill and decode)'s declaration: what the registry (kernels/registry.py) names of it besides its function
and reference. ``BACKENDS``: its backends in the order backend=None tries them, with their limits;
``REROPE_ATTENTION``, ``REROPE_DECODE``: its battery declaration (inputs, cases, budgets: kernels/declarations.py
says what each field means); ``PREFILL_BENCHMARK``, ``DECODE_BENCHMARK``: what the GPU benchmarks and the cost model
read of each.
"""
from __future__ import annotations

import torch

from .. import inputs as make
from .._flash import FLASH, MAX_TRITON_HEAD_DIM, SATURATED
from ..backends import Triton
from ..declarations import Case, Inputs, Op, given
from ..registry import Benchmark

__all__ = ["REROPE_ATTENTION", "REROPE_DECODE", "BACKENDS", "DECODE_BACKENDS", "PREFILL_BENCHMARK",
           "DECODE_BENCHMARK"]

BACKENDS = FLASH


def _merged_head_dim(call):
    d = call.facts.get("d", MAX_TRITON_HEAD_DIM)      # not given (default_backend): taken as met
    if d > MAX_TRITON_HEAD_DIM:   # a key tile and a value tile of d columns in registers, built up to 128
        return f"takes head dims d <= {MAX_TRITON_HEAD_DIM}, got d = {d}"
    return None


# Decode's: first the one-launch kernel (decode.py: no tl.dot, so any even d up to 128), then the prefill's
# kernels with one query row ("triton", which None no longer picks where "triton_merged" takes the call), then torch
DECODE_BACKENDS = (Triton(_merged_head_dim, f"CUDA tensors, d <= {MAX_TRITON_HEAD_DIM}", name="triton_merged"),
                   *FLASH)
# The benchmark shapes (benchmarks/README.md, the cost model's defaults), and tiny ones for gpu_check --dry-run: one
# for both ops, which share their kernels' module
_SHAPES = dict(shape=dict(B=1, H=4, T=8192, d=64, w=512), dry_shape=dict(B=1, H=2, T=32, d=16, w=8))


def _timed_prefill(generator, device, B, H, T, d, w):
    return {n: torch.randn(B, H, T, d, generator=generator, device=device) for n in "qkv"}


def _timed_decode(generator, device, B, H, T, d, w):
    """The prefill's inputs, the last query against the whole cache."""
    x = _timed_prefill(generator, device, B, H, T, d, w)
    return {"q": x["q"][:, :, -1:], "k_cache": x["k"], "v_cache": x["v"]}


def _window(shape):
    return {"window": shape["w"]}


def _checked_prefill(rng, T, width):
    return list(rng.normal(size=(3, 2, 4, T, width))), {"window": 8}


def _checked_decode(rng, T, width):
    q = rng.normal(size=(2, 4, 1, width))
    return [q, *rng.normal(size=(2, 2, 4, T, width))], {"window": 8}


PREFILL_BENCHMARK = Benchmark(**_SHAPES, kernels={"triton": ("rerope_fwd", ("rerope_fwd", "rerope_bwd"))},
                              inputs=_timed_prefill, check=_checked_prefill, options=_window)
DECODE_BENCHMARK = Benchmark(**_SHAPES, kernels={"triton_merged": ("rerope_decode_merged", ()),
                                                  "triton": ("rerope_decode ", ())},
                             inputs=_timed_decode, check=_checked_decode, options=_window)

def _rerope_inputs(rng, B, H, T, d, window, leaky_k=None, train_length=None, spread=1.0, decode=False):
    q, k, v = make.qkv_inputs(rng, (B, H, T, d), spread)
    options = dict(window=window, **given(leaky_k=leaky_k, train_length=train_length))
    if decode:
        return Inputs(dict(q=q[:, :, -1:], k_cache=k, v_cache=v), options)
    return Inputs(dict(q=q, k=k, v=v), options)


def _rerope_cases(decode):
    """T = cache length for decode; w < 16-row tiles, w > tile, w > T, w = 1; ReRoPE and Leaky; log-n scaling."""
    def case(label="", group="shapes", low_precision=False, ungraded=(), **params):
        return Case(dict(params, decode=decode), label, group, low_precision, ungraded)
    return (case(B=1, H=1, T=1, d=16, window=3),
            case(B=1, H=2, T=7, d=16, window=2, leaky_k=2.0, low_precision=True),
            case(B=2, H=1, T=37, d=16, window=5, low_precision=True),
            case(B=1, H=2, T=37, d=32, window=20, leaky_k=4.0, train_length=16),
            case(B=1, H=1, T=23, d=16, window=40, leaky_k=2.0, train_length=8),
            case(B=1, H=1, T=70, d=64, window=16, train_length=32),
            case(B=1, H=1, T=33, d=16, window=1, train_length=8, group="extreme"),
            case(B=1, H=1, T=30, d=16, window=6, train_length=4, spread=12.0, label="scores~200", **SATURATED))


_REROPE_COMMON = dict(make=_rerope_inputs, head="d", conditioning=None, interpreter=dict(max_len=7))
# tiny: a window shorter than T, so that both the near and the far pieces are used
REROPE_ATTENTION = Op("rerope_attention", ("q", "k", "v"), cases=_rerope_cases(False),
                      tiny=dict(B=1, H=1, d=16, window=3), **_REROPE_COMMON)
REROPE_DECODE = Op("rerope_decode", ("q", "k_cache", "v_cache"), cases=_rerope_cases(True),
                   tiny=dict(B=1, H=1, d=16, window=3, decode=True), **_REROPE_COMMON)
