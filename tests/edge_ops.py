"""Every op of kernels/ as the edge tests call it: tiny inputs (float64 NumPy), the reference's answer and a backend's
answer, both as a flat list of output arrays (output first, then the state's parts), so that a test can compare
where NaN appears, op by op, input by input, backend by backend."""
from __future__ import annotations

import numpy as np
import torch

from kernel_cases import HAS_TRITON
from seqmix.conformance.cases import qkv_inputs, rwkv7_inputs, scan_inputs, wkv4_inputs
from seqmix.kernels import ssm
from seqmix.kernels.attention import attention
from seqmix.kernels.rerope import rerope_attention, rerope_decode
from seqmix.kernels.wkv4 import wkv4
from seqmix.kernels.wkv7 import wkv7
from seqmix.reference import attention as ref_attention, rope as ref_rope, ssm as ref_ssm, wkv4 as ref_wkv4
from seqmix.reference import wkv7 as ref_wkv7

TRITON = ["triton"] if HAS_TRITON else []
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


def run_kernel(op, x, backend, dtype=torch.float32, grad=False):
    """The op on ``backend``, inputs as ``dtype`` tensors (states fp32); its outputs as float64 arrays, and, when
    ``grad``, the gradients of the sum of the outputs' finite entries in every input (by name)."""
    state_names = {"num", "den", "max", "state"}
    t = {n: torch.tensor(a, dtype=torch.float32 if n in state_names else dtype).requires_grad_(grad)
         for n, a in x.items()}
    outputs = OPS[op][2](t, backend)
    arrays = [y.detach().double().numpy() for y in outputs]
    if not grad:
        return arrays
    loss = sum(torch.where(torch.isfinite(y), y, 0.0).double().sum() for y in outputs)
    names = list(t)
    return arrays, dict(zip(names, torch.autograd.grad(loss, [t[n] for n in names], allow_unused=True)))
