"""RWKV-4's WKV's declaration: what the registry (kernels/registry.py) names of it besides its function and reference.
``BACKENDS``: its backends in the order backend=None tries them, with their limits; ``WKV4``: its battery
declaration (inputs, cases, budgets: kernels/declarations.py says what each field means); ``BENCHMARK``: what the
GPU benchmarks and the cost model read of it.
"""
from __future__ import annotations

import numpy as np
import torch

from .. import inputs as make
from ..backends import RECURRENCES
from ..declarations import Case, Inputs, Op
from ..registry import Benchmark

__all__ = ["WKV4", "BACKENDS", "BENCHMARK"]

BACKENDS = RECURRENCES


def timed_inputs(generator, device, B, T, C):
    """RWKV-4 WKV inputs of B rows and C channels (benchmarks/run.py's too)."""
    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=device)
    time_decay = torch.linspace(-5.0, 3.0, C, device=device)        # the range transformers initializes
    return dict(w=-torch.exp(time_decay), u=0.5 * randn(C), k=randn(B, T, C), v=randn(B, T, C))


def _checked_inputs(rng, T, width):
    return [make.log_decays(rng, width), rng.normal(size=width), *rng.normal(size=(2, 2, T, width))], {}


BENCHMARK = Benchmark(dict(B=4, T=2048, C=768), dict(B=1, T=16, C=16),
                      {"triton": ("wkv4_fwd ", ("wkv4_fwd_save", "wkv4_bwd"))}, timed_inputs, _checked_inputs,
                      fp32=("w", "u"))

def _wkv4_inputs(rng, B, T, C, state=False, key_scale=1.0, decay_scale=1.0, keys=None, decays=None):
    """keys: "offset" (250 + uniform +-1) or "spikes" (about 1, 3% of them +-300); decays: "steep" (one channel at
    w = -1e4, a decay of 0 per step) or "near 1" (|w| ~ 1e-6)."""
    x, s = make.wkv4_inputs(rng, B, T, C, key_scale=key_scale, decay_scale=decay_scale, state=state)
    if keys == "offset":
        x["k"] = 250.0 + rng.uniform(-1, 1, size=(B, T, C))
    elif keys == "spikes":
        x["k"] = make.spiky_keys(rng, (B, T, C))
    if decays == "steep":
        x["w"][-1] = -1e4
    elif decays == "near 1":
        x["w"] *= 1e-6 / np.abs(x["w"]).mean()
    return Inputs(x, {}, s)


def _wkv4_conditioning(tensors, state) -> float:
    """T M: the relative error, in units of the unit roundoff u (2^-24 in fp32), that fp32 arithmetic of the formula
    must be allowed at these inputs. M is the largest exponent the recurrence forms, max |k_t|, |u + k_t| and
    |max0| (the running max stays within them); T the tokens.

    Why: an exponent x is an fp32 number, held to u |x|; that absolute error in x is a relative error u |x| of the
    term e^x it weighs (keys of 300: 1.8e-5, over the design's 1e-5 from one rounding). The max-tracked recurrence
    (transformers' CUDA kernel and CPU loop, reference/wkv4.py) rounds its running max once per token (max + w), so
    the state's scale drifts by up to T such roundings, and the outputs and gradients that read it with it. Keys of
    +-300 over 40 tokens: 40 * 300 * 2^-24 = 7.2e-4 (the textbook fp32 loop measures up to 2.3e-4 there, at ten
    seeds). Keys of +-1 keep T M u below 1e-5 up to T ~ 80: the design's budget."""
    k, u = tensors["k"], tensors["u"]
    largest = max(np.abs(k).max(initial=0.0), np.abs(u + k).max(initial=0.0),
                  0.0 if state is None else np.abs(state[2]).max(initial=0.0))
    return k.shape[1] * largest


def _wkv4_state_rows(actual, expected):
    """num and den rescaled to the reference's max (a max rounded differently rescales num and den without
    changing the sums they stand for, num e^max and den e^max), then max itself."""
    num, den, mx = actual
    rescale = np.exp(mx - expected[2])                                   # 1 up to the rounding of max
    return [("num", num * rescale, expected[0]), ("den", den * rescale, expected[1]), ("max", mx, expected[2])]


def _wkv4_loss_terms(state):
    """What the state represents, independent of how max was rounded: num / den and max + log den."""
    num, den, mx = state
    return [num / den, mx + torch.log(den)]


# Keys of several hundred swamp an initial state of max ~1: its terms weigh e^-250 against the keys', so the
# gradients of num0, den0 and max0 are ~e^-250, below fp32's range (an fp32 kernel's best answer is 0, and d/dmax0 is
# formed from O(1) terms that cancel): they are not compared there, and are on every other case.
_LARGE_KEYS = dict(group="extreme", ungraded=("num0", "den0", "max0"))
WKV4 = Op(
    "wkv4", ("w", "u", "k", "v"), _wkv4_inputs, head="C",
    conditioning=_wkv4_conditioning,
    time_axes=dict(k=1, v=1), state_names=("num", "den", "max"),
    compare_state=_wkv4_state_rows, loss_terms=_wkv4_loss_terms, interpreter=dict(max_len=16),
    tiny=dict(B=1, C=3, state=True), cases=(
        Case(dict(B=1, T=1, C=3)),
        Case(dict(B=2, T=7, C=5, state=True), low_precision=True),
        Case(dict(B=1, T=16, C=4)),
        Case(dict(B=2, T=37, C=6, state=True), low_precision=True),
        Case(dict(B=1, T=70, C=8, state=True)),
        Case(dict(B=2, T=40, C=6, state=True, key_scale=300.0), "keys+-300", **_LARGE_KEYS),
        Case(dict(B=2, T=40, C=6, state=True, keys="offset"), "keys=250+-1", **_LARGE_KEYS),
        Case(dict(B=2, T=40, C=6, state=True, keys="spikes"), "key spikes+-300", **_LARGE_KEYS),
        Case(dict(B=2, T=35, C=7, state=True, decay_scale=2.0, decays="steep"), "decay 0", "extreme"),
        Case(dict(B=2, T=35, C=7, state=True, decays="near 1"), "decay near 1", "extreme"),
    ), split=Case(dict(B=2, T=39, C=5, state=True), group="split"))
