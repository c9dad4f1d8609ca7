"""What a battery declaration is (conformance's, the cross-check's and the edge cases' inputs): what the battery
knows about an op: its inputs, how to make them, how to compare and weigh its state, and the cases it is checked on.
Each op declares its ``Op`` in its package (kernels/<op>/spec.py); the registry (kernels/registry.py,
``OpSpec.battery``) names it, with the op's float64 reference and torch definition (``Op.reference`` and
``Op.definition`` read them from there).

A function under test is called as the op in seqmix.kernels is: the positional tensors in the op's order, every
other tensor and option by keyword, ``state=`` only when a case has an initial state; a stateful op returns
``(y, state)``. Cases carry readable names (``T=37,B=2,C=6,state``); ``shapes`` cases cover T = 1, odd T, T not a
multiple of 16 or 64, B > 1, several head sizes and initial states; ``extreme`` cases the edges of the valid range.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from . import registry
from .testing import FP32_BUDGET

__all__ = ["Case", "Inputs", "Op", "OPS", "call", "given", "state_tensors"]


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
    inputs, with an initial state where the op has one, that the edge-case tests (tests/helpers/edge_ops.py) perturb."""
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


def given(**options):
    """The options that differ from the op's defaults (None): a kernel without an option runs every other case."""
    return {k: v for k, v in options.items() if v is not None}


# op name -> its Op, read from the registry (kernels/registry.py, OpSpec.battery) at each look-up, so that an op
# registered there (a test's made-up one) is in the battery too.
OPS = registry.view("battery")
