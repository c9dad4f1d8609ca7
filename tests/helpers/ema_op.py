"""A made-up op, complete as a package of kernels/ would hold it: an exponential moving average,
s_t = a s_{t-1} + (1 - a) x_t, y_t = s_t. Its float64 reference, its naive torch form, its public function with one
backend (torch), its battery declaration, and the ``OpSpec`` that registers it: docs/architecture.md's "Adding an
op" in one file, to copy. tests/kernels/test_registry.py registers it around one test; ``pytest --extra-op
ema_op:SPEC`` registers it for the whole run (tests/conftest.py), so that every harness that iterates the
registry, at collection time too, runs it beside the repository's ops."""
from __future__ import annotations

import numpy as np
import torch

from seqmix.kernels.backends import Call, Torch, dispatch
from seqmix.kernels.declarations import Case, Inputs, Op
from seqmix.kernels.registry import OpSpec
from seqmix.kernels.shared import accumulation_dtype, check_devices, check_tensor

__all__ = ["ema_reference", "ema_naive", "ema", "EMA", "SPEC"]


def ema_reference(x, a, *, state=None):
    """s_t = a s_{t-1} + (1 - a) x_t, y_t = s_t, in float64 NumPy.

    Args:
        x: (B, T, C) inputs. a: (C,) decays in (0, 1). state: (B, C), or None (zeros).
    Returns:
        (y (B, T, C), the last state (B, C)).
    """
    s = np.zeros((x.shape[0], x.shape[2])) if state is None else np.array(state, dtype=np.float64)
    y = np.empty(x.shape)
    for t in range(x.shape[1]):
        s = a * s + (1 - a) * x[:, t]
        y[:, t] = s
    return y, s


def ema_naive(x, a, *, state=None):
    """float64 torch, differentiable: the closed form y_t = a^{t+1} s_0 + sum_{i<=t} a^{t-i} (1 - a) x_i.

    Args:
        x: (B, T, C) float64. a: (C,). state: (B, C) or None.
    Returns:
        (y (B, T, C), the last state).
    """
    T = x.shape[1]
    steps = torch.arange(T, dtype=x.dtype)
    powers = a[None, None, :] ** (steps[:, None, None] - steps[None, :, None]).clamp(min=0)   # (t, i, C)
    weights = torch.where((steps[:, None] >= steps[None, :])[..., None], powers * (1 - a), 0)
    y = torch.einsum("tic,bic->btc", weights, x)
    if state is not None:
        y = y + a[None, None, :] ** (steps[None, :, None] + 1) * state[:, None, :]
    return y, y[:, -1]


def ema(x, a, *, state=None, backend=None, forget_the_input_weight=False):
    """s_t = a s_{t-1} + (1 - a) x_t, y_t = s_t, on the op's one backend, torch: a loop over time in fp32 (float64
    beside float64 inputs). ``forget_the_input_weight``: a planted bug (the input weighed by 1), which the battery
    must reject.

    Args:
        x: (B, T, C). a: (C,). state: (B, C) fp32 (float64 beside float64 inputs) or None.
        backend: None or "torch". None runs the first that takes the call, in this order: "torch" (any other call).
    Returns:
        (y (B, T, C) in x's dtype, the last state).
    """
    check_devices(x=x, a=a, state=state)                   # a meta tensor is refused here, as by every op
    dispatch(Call("ema", x.device, x.dtype), backend)
    acc = accumulation_dtype(x.dtype)
    if state is not None:
        check_tensor("state", state, (x.shape[0], x.shape[2]), dtypes=(acc,))
    a = a.to(acc)
    s = x.new_zeros((x.shape[0], x.shape[2]), dtype=acc) if state is None else state
    weight = 1 if forget_the_input_weight else 1 - a
    ys = []
    for t in range(x.shape[1]):
        s = a * s + weight * x[:, t].to(acc)
        ys.append(s)
    return torch.stack(ys, 1).to(x.dtype), s


def ema_inputs(rng, B, T, C, state=False):
    x = rng.normal(size=(B, T, C))
    a = rng.uniform(0.1, 0.9, size=C)
    return Inputs(dict(x=x, a=a), {}, rng.normal(size=(B, C)) if state else None)


EMA = Op("ema", ("x", "a"), ema_inputs, head="C", conditioning=None, time_axes=dict(x=1),
         tiny=dict(B=1, C=3, state=True), cases=(
             Case(dict(B=1, T=1, C=3)),
             Case(dict(B=2, T=9, C=4, state=True), low_precision=True),
         ), split=Case(dict(B=2, T=13, C=3, state=True), group="split"))

SPEC = OpSpec("ema", "moving average", ema, ema_reference, ema_naive, EMA, (Torch(),), "recurrence")
