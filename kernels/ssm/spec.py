"""Mamba's selective scan's declaration: what the registry (kernels/registry.py) names of it besides its function and
reference. ``BACKENDS``: its backends in the order backend=None tries them, with their limits; ``SELECTIVE_SCAN``:
its battery declaration (inputs, cases, budgets: kernels/declarations.py says what each field means); ``BENCHMARK``:
what the GPU benchmarks and the cost model read of it.
"""
from __future__ import annotations

import math

import torch

from .. import inputs as make
from ..backends import RECURRENCES
from ..declarations import Case, Inputs, Op, given
from ..registry import Benchmark

__all__ = ["SELECTIVE_SCAN", "BACKENDS", "BENCHMARK"]

BACKENDS = RECURRENCES


def timed_inputs(generator, device, B, T, D, N):
    """Selective-scan inputs with Mamba's initialization of A and delta's bias (benchmarks/run.py's too)."""
    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=device)
    dt = torch.exp(torch.rand(D, generator=generator, device=device) * (math.log(0.1) - math.log(1e-3))
                   + math.log(1e-3))
    return dict(u=randn(B, D, T), delta=0.5 * randn(B, D, T),
                A=-torch.arange(1, N + 1, dtype=torch.float32, device=device).expand(D, N).contiguous(),
                B=randn(B, N, T), C=randn(B, N, T), D=torch.ones(D, device=device),
                z=randn(B, D, T), delta_bias=torch.log(torch.expm1(dt)))   # Mamba's initialization


def _softplus(shape):
    return {"delta_softplus": True}       # as Mamba calls it


def _checked_inputs(rng, T, width):
    return [*rng.normal(size=(2, 2, width, T)), make.log_decays(rng, (width, 16)),
            *rng.normal(size=(2, 2, 16, T))], _softplus(None)


BENCHMARK = Benchmark(dict(B=1, T=2048, D=1536, N=16), dict(B=1, T=16, D=16, N=4),
                      {"triton": ("selective_scan_fwd", ("selective_scan_",))}, timed_inputs, _checked_inputs,
                      fp32=("A", "D", "delta_bias"), options=_softplus)

def _scan_inputs(rng, B, D, N, T, extras=(), softplus=None, delta_scale=1.0):
    x = make.scan_inputs(rng, B, D, N, T, extras, delta_scale)
    state = x.pop("state", None)
    return Inputs(x, given(delta_softplus=softplus), state)


# No conditioning rule: exp(delta A) is formed from delta A of at most 800 (delta ~50), whose e^-800 is 0 in any
# arithmetic, or from small products (delta ~1e-4) rounded to u relative; transformers' fp32 scan passes the
# design's budget at every case (tests/conformance/test_conformance_peers.py).
_ALL_EXTRAS = ("D", "z", "delta_bias", "state")
SELECTIVE_SCAN = Op(
    "selective_scan", ("u", "delta", "A", "B", "C"), _scan_inputs, head="N", conditioning=None,
    time_axes=dict(u=2, delta=2, B=2, C=2, z=2), y_time_axis=2, interpreter=dict(max_len=19),
    tiny=dict(B=1, D=3, N=4, extras=("D", "z", "delta_bias", "state"), softplus=True),
    fp32_params=("A", "D", "delta_bias"), cases=(
        Case(dict(B=1, D=3, N=16, T=1, extras=("D", "z"))),
        Case(dict(B=1, D=4, N=16, T=19)),
        Case(dict(B=2, D=18, N=5, T=21, extras=_ALL_EXTRAS, softplus=True), low_precision=True),
        Case(dict(B=1, D=4, N=16, T=70, extras=("D", "state"), softplus=True)),
        Case(dict(B=2, D=3, N=8, T=37, extras=("state",)), low_precision=True),
        Case(dict(B=1, D=4, N=16, T=13, extras=("delta_bias",), softplus=True, delta_scale=50.0), "delta~50",
             "extreme"),
        Case(dict(B=1, D=4, N=16, T=40, extras=("D", "state"), delta_scale=1e-4), "delta~1e-4", "extreme"),
    ), split=Case(dict(B=2, D=3, N=16, T=37, extras=_ALL_EXTRAS, softplus=True), group="split"))
