"""Every op of kernels/ as the edge tests call it: tiny inputs (float64 NumPy), the reference's answer and a backend's
answer, both as a flat list of output arrays (output first, then the state's parts), so that a test can compare
where NaN appears, op by op, input by input, backend by backend."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from kernel_cases import HAS_TRITON
from seqmix.kernels.inputs import qkv_inputs, rwkv7_inputs, scan_inputs, wkv4_inputs
from seqmix.kernels import ssm
from seqmix.kernels.attention import attention
from seqmix.kernels.rerope import rerope_attention, rerope_decode
from seqmix.kernels.wkv4 import wkv4
from seqmix.kernels.wkv7 import wkv7
from seqmix.reference import attention as ref_attention, rope as ref_rope, ssm as ref_ssm, wkv4 as ref_wkv4
from seqmix.reference import wkv7 as ref_wkv7

TRITON = ["triton"] if HAS_TRITON else []
ATTENTION_OPS = ("attention", "rerope_attention", "rerope_decode")
WINDOW = 3   # ReRoPE's window: shorter than T, so that both the near and the far pieces are used


def _wkv4(rng, T):
    x, state = wkv4_inputs(rng, 1, T, 3, state=True)
    return {**x, "num": state[0], "den": state[1], "max": state[2]}


def _wkv7(rng, T):
    x, S = rwkv7_inputs(rng, 1, T, 1, 4)
    return {**dict(zip(("r", "log_w", "k", "v", "a", "b"), x)), "state": S}


def _scan(rng, T):
    return scan_inputs(rng, 1, 3, 4, T, extras=("D", "z", "delta_bias", "state"))


def _qkv(rng, T):
    return dict(zip("qkv", qkv_inputs(rng, (1, 1, T, 16))))


def _decode(rng, T):
    q, k, v = qkv_inputs(rng, (1, 1, T, 16))
    return {"q": q[:, :, -1:], "k_cache": k, "v_cache": v}


# op -> (input maker, reference(x) -> outputs, kernel(x as tensors, backend) -> outputs, backends)
OPS = {
    "wkv4": (_wkv4,
             lambda x: (lambda y, s: [y, *s])(*ref_wkv4.wkv4(x["w"], x["u"], x["k"], x["v"],
                                                            [x["num"], x["den"], x["max"]])),
             lambda x, backend: (lambda y, s: [y, *s])(*wkv4(x["w"], x["u"], x["k"], x["v"],
                                                            (x["num"], x["den"], x["max"]), backend=backend)),
             ["torch", "c", *TRITON]),
    "wkv7": (_wkv7,
             lambda x: list(ref_wkv7.wkv7(**x)),
             lambda x, backend: list(wkv7(**x, backend=backend)),
             ["torch", "c", *TRITON]),
    "wkv7 chunked": (_wkv7,
                     lambda x: list(ref_wkv7.wkv7(**x)),
                     lambda x, backend: list(wkv7(**x, backend=backend, chunked=True)),
                     TRITON),
    "selective_scan": (_scan,
                       lambda x: list(ref_ssm.selective_scan(**x, delta_softplus=True)),
                       lambda x, backend: list(ssm.selective_scan(**x, delta_softplus=True, backend=backend)),
                       ["torch", "c", *TRITON]),
    "attention": (_qkv,
                  lambda x: [ref_attention.softmax_attention(x["q"], x["k"], x["v"])],
                  lambda x, backend: [attention(x["q"], x["k"], x["v"], backend=backend)],
                  ["torch", *TRITON]),
    "rerope_attention": (_qkv,
                         lambda x: [ref_rope.rerope_attention(x["q"], x["k"], x["v"], WINDOW)],
                         lambda x, backend: [rerope_attention(x["q"], x["k"], x["v"], WINDOW, backend=backend)],
                         ["torch", *TRITON]),
    "rerope_decode": (_decode,
                      lambda x: [ref_rope.rerope_decode(x["q"], x["k_cache"], x["v_cache"], WINDOW)],
                      lambda x, backend: [rerope_decode(x["q"], x["k_cache"], x["v_cache"], WINDOW,
                                                        backend=backend)],
                      ["torch", *TRITON]),
}


def inputs(op, rng, T=5):
    """The op's inputs, float64 NumPy, by name."""
    return OPS[op][0](rng, T)


def run_reference(op, x):
    """The reference's outputs as float64 arrays; None where the reference refuses the input (ValueError)."""
    try:
        return [np.asarray(y, dtype=np.float64) for y in OPS[op][1](x)]
    except ValueError:
        return None


def run_kernel(op, x, backend):
    """The op on ``backend`` with fp32 tensors of ``x``; its outputs as float64 arrays."""
    return [y.double().numpy() for y in OPS[op][2]({n: torch.tensor(a, dtype=torch.float32) for n, a in x.items()},
                                                  backend)]


NONFINITE = {"NaN": np.nan, "+inf": np.inf, "-inf": -np.inf}


def _lane(op, name, index, shapes):
    """Masks (one per output) of what the C loops may turn to NaN for a non-finite input at ``index``: its lane (a
    channel of a batch row, a head, a scan channel) from the input's step on, and that lane's final state. The C
    loops mark a lane NaN from its first non-finite input on (kernels/native.c) where the reference may carry an
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
    if op in ATTENTION_OPS and any(name in ("v", "v_cache") or not np.isnan(x[name][index]) for name, index in entries):
        return   # a non-finite value, or an infinite query or key component: whether a weighted sum or a score meets
        # 0 * NaN, 0 * inf or inf - inf depends on the formulation (the reference's p @ v and the flash kernels' tile
        # products multiply the masked zero weights of earlier rows by the later values; the sums and rotations
        # differ in order), which the backends do not share: the op only has to run
    for i, (y, want) in enumerate(zip(got, truth)):
        missing = np.isnan(want) & ~np.isnan(y)
        assert not missing.any(), f"output {i}: finite where the truth is NaN at {np.argwhere(missing).tolist()}"
        extra = np.isnan(y) & np.isfinite(want) & ~lanes[i]
        assert not extra.any(), f"output {i}: NaN where the truth is finite at {np.argwhere(extra).tolist()}"
