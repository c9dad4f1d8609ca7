"""Each op's battery declaration (conformance's, the cross-check's and the edge cases' inputs). What the battery
knows about each op: its inputs, how to make them, how to compare and weigh its state, and the
cases it is checked on. Each Op is the battery part of one op's declaration in the registry (kernels/registry.py,
``OpSpec.battery``), which also names its float64 reference and torch definition (``Op.reference`` and
``Op.definition`` read them from there).

A function under test is called as the op in seqmix.kernels is: the positional tensors in the op's order, every
other tensor and option by keyword, ``state=`` only when a case has an initial state; a stateful op returns
``(y, state)``. Cases carry readable names (``T=37,B=2,C=6,state``); ``shapes`` cases cover T = 1, odd T, T not a
multiple of 16 or 64, B > 1, several head sizes and initial states; ``extreme`` cases the edges of the valid range.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

import seqmix.kernels.inputs as make
from seqmix.kernels import registry
from seqmix.kernels.testing import FP32_BUDGET, FP32_CHUNKED_WKV7_BUDGET

__all__ = ["Case", "Inputs", "Op", "OPS", "call", "state_tensors", "ATTENTION", "REROPE_ATTENTION", "REROPE_DECODE", "WKV4", "WKV7",
           "SELECTIVE_SCAN"]


@dataclass(frozen=True)
class Case:
    """One input configuration. params: the maker's arguments (sizes by their usual letters: B, H, T, d, C, N, and D
    the scan's channels); label: what is extreme about it; low_precision: also run at fp16/bf16; ungraded: inputs
    whose gradient is not compared here (ill-conditioned; the op says why)."""
    params: dict
    label: str = ""
    group: str = "shapes"
    low_precision: bool = False
    ungraded: tuple = ()

    @property
    def name(self) -> str:
        """Readable and unique within an op: 'T=37,B=2,C=6,state', 'T=40,C=6,state,keys+-300'."""
        p = self.params
        parts = [f"{k}={p[k]}" for k in _SIZES if k in p and not (k in ("B", "H") and p[k] == 1)]
        parts += [f"{short}={p[k]}" for k, short in _OPTIONS.items() if p.get(k) is not None]
        parts += [x if x == "state" else f"+{x}" for x in p.get("extras", ())]
        parts += [flag for flag in ("state", "softplus") if p.get(flag)] + ([self.label] if self.label else [])
        return ",".join(parts)


_SIZES = ("T", "B", "H", "D", "N", "C", "d")
_OPTIONS = {"window": "w", "leaky_k": "leaky", "train_length": "L", "causal": "causal", "scale": "scale"}


@dataclass(frozen=True)
class Inputs:
    """float64 inputs: tensors (positional ones first, in the op's order), options (keyword, not tensors), and an
    initial state (an array, a tuple of arrays, or None)."""
    tensors: dict
    options: dict = field(default_factory=dict)
    state: object = None


@dataclass(frozen=True)
class Op:
    """An op as the battery sees it. time_axes: the time axis of each per-token tensor (empty: not stateful);
    head: the case parameter that is the head size; conditioning: the op's conditioning rule, or None where it has
    none (every check keeps the design's budget): conditioning(tensors, state), of the check's rounded inputs as
    float64 NumPy, is the relative error the inputs force on any implementation of the formula, in units of the
    unit roundoff of its arithmetic (2^-24 in fp32); the default grade judges the check at max(the design's budget,
    that error), --strict at the design's; fp32_params: tensors kept fp32 beside fp16/bf16 inputs; state_names:
    the state's tensors; compare_state / loss_terms: what of a state is compared and weighed in the gradients' loss
    (default: the tensors themselves); interpreter: the Options (max_len, parts) that keep a run of the Triton
    kernels under the interpreter short (the tests' tiny shapes); tiny: the maker's arguments but T of the smallest
    inputs, with an initial state where the op has one, that the edge-case tests (tests/edge_ops.py) perturb."""
    name: str
    positional: tuple
    make: Callable
    cases: tuple
    head: str
    conditioning: Callable | None
    fp32_budget: float = FP32_BUDGET
    time_axes: dict = field(default_factory=dict)
    y_time_axis: int = 1
    state_names: tuple = ("state",)
    fp32_params: tuple = ()
    split: Case | None = None
    compare_state: Callable = None
    loss_terms: Callable = None
    interpreter: dict = field(default_factory=dict)
    tiny: dict = field(default_factory=dict)

    @property
    def stateful(self) -> bool:
        return bool(self.time_axes)

    @property
    def reference(self) -> Callable:
        """The float64 NumPy form, as the registry names it for this op (declared there once)."""
        return registry.spec(self.name).get("reference")

    @property
    def definition(self) -> Callable:
        """The float64 torch form (the registry's ``naive``), autograd's yardstick for the gradients."""
        return registry.spec(self.name).get("naive")


def state_tensors(state, dtype: torch.dtype):
    """A battery's initial state (None, an array, or a tuple of arrays) as tensors of ``dtype``, its structure kept."""
    if state is None:
        return None
    if isinstance(state, (tuple, list)):
        return tuple(torch.tensor(s, dtype=dtype) for s in state)
    return torch.tensor(state, dtype=dtype)


def call(op: Op, fn, tensors: dict, options: dict, state=None):
    """fn called as ``op`` is: positional tensors in order, the other tensors and options by keyword, and
    ``state=`` when there is one."""
    keyword = {n: x for n, x in tensors.items() if n not in op.positional}
    return fn(*(tensors[n] for n in op.positional), **keyword, **options, **({} if state is None else {"state": state}))


def _given(**options):
    """The options that differ from the op's defaults (None): a kernel without an option runs every other case."""
    return {k: v for k, v in options.items() if v is not None}


# ---------------------------------------------------------------------------------------------------- attention

# Scores in the hundreds (e^s overflows fp32 past 88: the outputs check that a kernel never forms it) make each row's
# softmax nearly one-hot, so dq and dk are differences of nearly equal terms, e^-100 of the gradient's scale in exact
# arithmetic: fp32's rounding dominates them in any kernel. They are not compared there (dv is), and are elsewhere.
_SATURATED = dict(group="extreme", ungraded=("q", "k", "k_cache"))

def _attention_inputs(rng, B, H, T, d, causal=None, scale=None, spread=1.0):
    q, k, v = make.qkv_inputs(rng, (B, H, T, d), spread)
    return Inputs(dict(q=q, k=k, v=v), _given(causal=causal, scale=scale))


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
        Case(dict(B=1, H=1, T=23, d=16, spread=12.0), "scores~200", **_SATURATED),
    ))


# No conditioning rule: a score is rounded to u |s| (1.2e-5 at scores of 200), but where scores are that large the
# softmax is nearly one-hot and y moves only with the few scores near each row's top; dq and dk, which that
# rounding does dominate, are not compared there (_SATURATED). fla's naive fp32 attention passes the design's budget
# at every case, scores of 200 included (tests/test_conformance_peers.py). The same holds for ReRoPE below.


# -------------------------------------------------------------------------------------------- ReRoPE prefill, decode

def _rerope_inputs(rng, B, H, T, d, window, leaky_k=None, train_length=None, spread=1.0, decode=False):
    q, k, v = make.qkv_inputs(rng, (B, H, T, d), spread)
    options = dict(window=window, **_given(leaky_k=leaky_k, train_length=train_length))
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
            case(B=1, H=1, T=30, d=16, window=6, train_length=4, spread=12.0, label="scores~200", **_SATURATED))


_REROPE_COMMON = dict(make=_rerope_inputs, head="d", conditioning=None, interpreter=dict(max_len=7))
# tiny: a window shorter than T, so that both the near and the far pieces are used
REROPE_ATTENTION = Op("rerope_attention", ("q", "k", "v"), cases=_rerope_cases(False),
                      tiny=dict(B=1, H=1, d=16, window=3), **_REROPE_COMMON)
REROPE_DECODE = Op("rerope_decode", ("q", "k_cache", "v_cache"), cases=_rerope_cases(True),
                   tiny=dict(B=1, H=1, d=16, window=3, decode=True), **_REROPE_COMMON)


# ------------------------------------------------------------------------------------------------------- RWKV-4

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


# ------------------------------------------------------------------------------------------------------- RWKV-7

def _wkv7_inputs(rng, B, T, H, N, decay="mixed", state=False):
    (r, log_w, k, v, a, b), S0 = make.rwkv7_inputs(rng, B, T, H, N, decay, state)
    return Inputs(dict(r=r, log_w=log_w, k=k, v=v, a=a, b=b), {}, S0)


# No conditioning rule: the recurrence multiplies decays rather than subtracting large exponents, so fp32 rounds each
# step's factor by u relative (T u over a sequence: 4e-6 at T = 70), and the design's budget (1e-4) already allows
# chunked forms; log_w of -1e4 is a decay of 0 in any arithmetic. rwkv7-hf's and a BlinkDL-style fp32 loop pass it
# (tests/test_conformance_peers.py).
WKV7 = Op(
    "wkv7", ("r", "log_w", "k", "v", "a", "b"), _wkv7_inputs, head="N",
    conditioning=None,
    fp32_budget=FP32_CHUNKED_WKV7_BUDGET, time_axes=dict(r=1, log_w=1, k=1, v=1, a=1, b=1),
    interpreter=dict(max_len=7, parts=("shapes",)), tiny=dict(B=1, H=1, N=4, state=True), cases=(
        Case(dict(B=1, T=1, H=1, N=16, decay="strong")),
        Case(dict(B=2, T=7, H=2, N=4, state=True), low_precision=True),
        Case(dict(B=2, T=37, H=2, N=16, state=True), low_precision=True),
        Case(dict(B=1, T=70, H=1, N=64, decay="strong", state=True)),
        Case(dict(B=3, T=16, H=1, N=5, decay="weak"), "decay near 1"),
        Case(dict(B=1, T=40, H=2, N=8, decay="extreme", state=True), "decays to e^-1e4", "extreme"),
        Case(dict(B=1, T=40, H=1, N=16, decay="weak", state=True), "decay near 1", "extreme"),
    ), split=Case(dict(B=2, T=37, H=2, N=16, state=True), group="split"))


# ----------------------------------------------------------------------------------------------- selective scan

def _scan_inputs(rng, B, D, N, T, extras=(), softplus=None, delta_scale=1.0):
    x = make.scan_inputs(rng, B, D, N, T, extras, delta_scale)
    state = x.pop("state", None)
    return Inputs(x, _given(delta_softplus=softplus), state)


# No conditioning rule: exp(delta A) is formed from delta A of at most 800 (delta ~50), whose e^-800 is 0 in any
# arithmetic, or from small products (delta ~1e-4) rounded to u relative; transformers' fp32 scan passes the
# design's budget at every case (tests/test_conformance_peers.py).
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

# op name -> its Op, read from the registry (kernels/registry.py, OpSpec.battery) at each look-up, so that an op
# registered there (a test's made-up one) is in the battery too.
OPS = registry.view("battery")
