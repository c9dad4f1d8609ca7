"""Every op of the registry as the edge tests call it: tiny inputs (float64 NumPy, the op's battery declaration at
its ``tiny`` sizes), the reference's answer and a backend's answer, both as a flat list of output arrays (output
first, then the state's parts), so that a test can compare where NaN appears, op by op, input by input, backend by
backend. An op registered later (tests/kernels/test_registry.py's) is covered as well: everything here reads the
registry
when called."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from seqmix.kernels.backends import Call
from seqmix.kernels.declarations import call
from seqmix.kernels.registry import REGISTRY, spec


def names() -> list[str]:
    """The ops, in the registry's order."""
    return [op.name for op in REGISTRY]


def _tiny(op):
    battery = spec(op).get("battery")
    return battery, battery.tiny


def inputs(op, rng, T=5, **sizes):
    """The op's inputs, float64 NumPy, by name: its tensors, then its initial state's parts by their state names
    (WKV-4's num, den, max; "state" for the others). ``sizes`` override the tiny ones (a head size a backend
    takes: WKV-7's chunked kernels need N >= 16)."""
    battery, tiny = _tiny(op)
    x = battery.make(rng, T=T, **{**tiny, **sizes})
    return {**x.tensors, **_state_parts(battery, x.state)}


def _state_parts(battery, state) -> dict:
    if state is None:
        return {}
    return dict(zip(battery.state_names, state if isinstance(state, (tuple, list)) else (state,)))


def _options(battery, tiny) -> dict:
    """The tiny case's options (ReRoPE's window, the scan's softplus): they do not depend on the inputs' values."""
    return battery.make(np.random.default_rng(0), T=2, **tiny).options


def _split(battery, x):
    """x -> (tensors, state): the state's parts back into the op's state (a tuple, one tensor, or None)."""
    tensors = {n: a for n, a in x.items() if n not in battery.state_names}
    parts = [x[n] for n in battery.state_names if n in x]
    state = None if not parts else tuple(parts) if len(battery.state_names) > 1 else parts[0]
    return tensors, state


def _flat(battery, out) -> list:
    if not battery.stateful:
        return [out]
    y, state = out
    return [y, *(state if isinstance(state, (tuple, list)) else (state,))]


def call_kernel(op, x, backend):
    """The op on ``backend`` with the tensors of ``x`` as given; its outputs, flat."""
    battery, tiny = _tiny(op)
    tensors, state = _split(battery, x)
    return _flat(battery, call(battery, spec(op).function, tensors, {**_options(battery, tiny), "backend": backend},
                               state))


def backends(op) -> list[str]:
    """The op's backends that take its tiny inputs here (fp32 CPU tensors; Triton under the interpreter where it is
    installed, the C loops where they build), by name."""
    battery, tiny = _tiny(op)
    probe = Call(op, torch.device("cpu"), torch.float32, {battery.head: tiny.get(battery.head)})
    return [b.name for b in spec(op).get("backends") if b.verify(probe) is None]


def run_reference(op, x):
    """The reference's outputs as float64 arrays; None where the reference refuses the input (ValueError)."""
    battery, tiny = _tiny(op)
    tensors, state = _split(battery, x)
    try:
        out = call(battery, spec(op).get("reference"), tensors, _options(battery, tiny), state)
    except ValueError:
        return None
    return [np.asarray(y, dtype=np.float64) for y in _flat(battery, out)]


def run_kernel(op, x, backend):
    """The op on ``backend`` with fp32 tensors of ``x``; its outputs as float64 arrays."""
    return [y.double().numpy() for y in call_kernel(op, {n: torch.tensor(a, dtype=torch.float32)
                                                         for n, a in x.items()}, backend)]


NONFINITE = {"NaN": np.nan, "+inf": np.inf, "-inf": -np.inf}


def _lane(op, name, index, shapes):
    """Masks (one per output) of what the C loops may turn to NaN for a non-finite input at ``index``: its lane (a
    channel of a batch row, a head, a scan channel) from the input's step on, and that lane's final state. The C
    loops mark a lane NaN from its first non-finite input on (kernels/<op>/<op>.c) where the reference may carry an
    infinity, or leave a sum the input does not enter (WKV-4's den) finite."""
    masks = [np.zeros(s, dtype=bool) for s in shapes]
    everything = slice(None)
    if op == "wkv4":
        b, t, c = {3: index, 1: (everything, 0, index[0])}.get(len(index), (index[0], 0, index[-1]))
        masks[0][b, t:, c] = True
        for m in masks[1:]:
            m[b, c] = True
    elif op == "wkv7":
        b, t, h = (index[0], 0, index[1]) if name == "state" else index[:3]
        masks[0][b, t:, h] = masks[1][b, h] = True
    else:   # selective_scan: (batch, D, T) inputs, A (D, N), D and delta_bias (D,), B and C (batch, N, T), state
        if name in ("A", "D", "delta_bias"):
            b, d, t = everything, index[0], 0
        elif name in ("B", "C"):
            b, d, t = index[0], everything, index[2]
        else:
            b, d, t = (index[0], index[1], 0) if name == "state" else index
        masks[0][b, d, t:] = masks[1][b, d] = True
    return masks


def check_nan_placement(op, x, entries, backend):
    """x holds non-finite values at ``entries`` [(input name, index)]: ``backend`` has NaN wherever the reference
    has NaN (never a finite number where the truth is undefined), and NaN only where the reference is non-finite or,
    on the C loops, in the entries' lanes. Where the reference refuses the input (WKV-7's non-finite log_w, the
    scan's non-finite delta, A, delta_bias), the torch backend's answer is the yardstick; where that is a clear
    error, every backend gives it."""
    truth = run_reference(op, x)
    if truth is None:
        try:
            truth = run_kernel(op, x, "torch")
        except ValueError as refused:   # WKV-4's w = NaN or +inf
            with pytest.raises(ValueError, match=re.escape(str(refused).split(":")[0])):
                run_kernel(op, x, backend)
            return
    got = run_kernel(op, x, backend)
    lanes = [np.zeros(y.shape, dtype=bool) for y in got]
    if backend == "c":
        for name, index in entries:
            lanes = [a | b for a, b in zip(lanes, _lane(op, name, index, [y.shape for y in got]))]
    if spec(op).family == "attention" and any(name in ("v", "v_cache") or not np.isnan(x[name][index])
                                              for name, index in entries):
        return   # a non-finite value, or an infinite query or key component: whether a weighted sum or a score meets
        # 0 * NaN, 0 * inf or inf - inf depends on the formulation (the reference's p @ v and the flash kernels' tile
        # products multiply the masked zero weights of earlier rows by the later values; the sums and rotations
        # differ in order), which the backends do not share: the op only has to run
    for i, (y, want) in enumerate(zip(got, truth)):
        missing = np.isnan(want) & ~np.isnan(y)
        assert not missing.any(), f"output {i}: finite where the truth is NaN at {np.argwhere(missing).tolist()}"
        extra = np.isnan(y) & np.isfinite(want) & ~lanes[i]
        assert not extra.any(), f"output {i}: NaN where the truth is finite at {np.argwhere(extra).tolist()}"
