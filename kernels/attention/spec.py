"""Softmax attention's declaration: what the registry (kernels/registry.py) names of it besides its function and
reference. ``BACKENDS``: its backends in the order backend=None tries them, with their limits; ``ATTENTION``: its
battery declaration (inputs, cases, budgets: kernels/declarations.py says what each field means); ``BENCHMARK``:
what the GPU benchmarks and the cost model read of it.
"""
from __future__ import annotations

import torch

from .. import inputs as make
from .._flash import FLASH, SATURATED
from ..declarations import Case, Inputs, Op, given
from ..registry import Benchmark

__all__ = ["ATTENTION", "BACKENDS", "BENCHMARK"]

BACKENDS = FLASH


def _timed_inputs(generator, device, B, H, T, d):
    return {n: torch.randn(B, H, T, d, generator=generator, device=device) for n in "qkv"}


def _checked_inputs(rng, T, width):
    return list(rng.normal(size=(3, 2, 4, T, width))), {}


# the goal: d = 64 and 128; gpu_check --dry-run's tiny shapes beside each
BENCHMARK = Benchmark(dict(B=1, H=4, T=8192, d=64), dict(B=1, H=2, T=32, d=16),
                      {"triton": ("attention_fwd", ("attention_",))}, _timed_inputs, _checked_inputs,
                      variants={"d=128": (dict(d=128), dict(d=32))})


def _attention_inputs(rng, B, H, T, d, causal=None, scale=None, spread=1.0):
    q, k, v = make.qkv_inputs(rng, (B, H, T, d), spread)
    return Inputs(dict(q=q, k=k, v=v), given(causal=causal, scale=scale))


ATTENTION = Op(
    "attention", ("q", "k", "v"), _attention_inputs, head="d", conditioning=None, interpreter=dict(max_len=7),
    tiny=dict(B=1, H=1, d=16), cases=(
        Case(dict(B=1, H=1, T=1, d=16)),
        Case(dict(B=1, H=2, T=7, d=16), low_precision=True),
        Case(dict(B=2, H=1, T=37, d=16), low_precision=True),
        Case(dict(B=1, H=1, T=70, d=64)),
        Case(dict(B=1, H=2, T=20, d=24)),
        Case(dict(B=1, H=2, T=19, d=16, causal=False)),
        Case(dict(B=1, H=1, T=19, d=16, scale=0.3)),
        Case(dict(B=1, H=1, T=23, d=16, spread=12.0), "scores~200", **SATURATED),
    ))


# No conditioning rule: a score is rounded to u |s| (1.2e-5 at scores of 200), but where scores are that large the
# softmax is nearly one-hot and y moves only with the few scores near each row's top; dq and dk, which that
# rounding does dominate, are not compared there (SATURATED). fla's naive fp32 attention passes the design's budget
# at every case, scores of 200 included (tests/conformance/test_conformance_peers.py). The same holds for ReRoPE below.
