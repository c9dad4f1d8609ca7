"""The C loops (kernels/native.py) as autograd ops: what backend="c" runs, for inference and for training.

Each op's forward runs the C forward once; when a gradient is wanted it also keeps what the C backward needs (WKV-4:
three numbers per token, as the Triton forward saves; WKV-7 and the scan: the state every native.CHECKPOINT steps),
and the backward walks time in reverse in C. Inputs reach the loops as fp32 (native.py converts them); outputs take
the values' dtype, states are fp32, and each gradient takes its input's dtype.
"""
from __future__ import annotations

import torch

from seqmix.kernels import native
from seqmix.kernels._common import first_order_only


def _dtypes(*inputs):
    """The inputs' dtypes (None for an input left out), for the gradients."""
    return tuple(None if x is None else x.dtype for x in inputs)


def _grads_as(grads, dtypes):
    """Each gradient in its input's dtype; None where the input is None."""
    return tuple(None if dtype is None else g.to(dtype) for g, dtype in zip(grads, dtypes))


class Wkv4CFunction(torch.autograd.Function):
    """(w, u, k, v, num0, den0, max0) -> (y, num, den, max) on the C loops."""

    @staticmethod
    def forward(ctx, w, u, k, v, num0, den0, max0):
        fp32 = [native.fp32(x) for x in (w, u, k, v, num0, den0, max0)]
        y, state, saved = native.wkv4_forward(*fp32, save=True)
        ctx.save_for_backward(*fp32, *state[:2], *saved)
        ctx.dtypes = _dtypes(w, u, k, v, num0, den0, max0)
        return (y.to(k.dtype), *state)

    @staticmethod
    @first_order_only
    def backward(ctx, gy, g_num, g_den, g_max):
        w, u, k, v, num0, den0, max0, num, den, *saved = ctx.saved_tensors
        grads = native.wkv4_backward(w, u, k, v, num0, den0, max0, num, den, saved, gy, g_num, g_den, g_max)
        return _grads_as(grads, ctx.dtypes)


class Wkv7CFunction(torch.autograd.Function):
    """(r, log_w, k, v, a, b, state0 or None) -> (y, state) on the C loops."""

    @staticmethod
    def forward(ctx, r, log_w, k, v, a, b, state0):
        fp32 = [native.fp32(x) for x in (r, log_w, k, v, a, b)]
        y, state, saved = native.wkv7_forward(*fp32, state0, save=True)
        ctx.save_for_backward(*fp32, *saved)
        ctx.dtypes = _dtypes(r, log_w, k, v, a, b, state0)
        return y.to(r.dtype), state

    @staticmethod
    @first_order_only
    def backward(ctx, dy, dstate):
        *x, ckpt, bad = ctx.saved_tensors
        return _grads_as(native.wkv7_backward(*x, (ckpt, bad), dy, dstate), ctx.dtypes)


class SelectiveScanCFunction(torch.autograd.Function):
    """(u, delta, A, B, C, D, z, delta_bias, state0, delta_softplus) -> (y, last state) on the C loops: the whole op
    (delta's bias and softplus, the scan, the skip D u and the gate silu(z)); D, z, delta_bias, state0 may be None."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, state0, delta_softplus):
        fp32 = [native.fp32(x) for x in (u, delta, A, D, z, delta_bias)]
        y, last, saved = native.selective_scan_forward(*fp32[:3], B, C, *fp32[3:], delta_softplus, state0, save=True)
        ctx.save_for_backward(*fp32, *saved)
        ctx.dtypes, ctx.delta_softplus = _dtypes(u, delta, A, B, C, D, z, delta_bias, state0), delta_softplus
        return y.to(u.dtype), last

    @staticmethod
    @first_order_only
    def backward(ctx, dy, dlast):
        u, delta, A, D, z, delta_bias, *saved = ctx.saved_tensors
        du, ddelta, dA, dB, dC, dD, dz, dbias, dstate = native.selective_scan_backward(
            u, delta, A, D, z, delta_bias, ctx.delta_softplus, saved, dy, dlast)
        return (*_grads_as((du, ddelta, dA, dB, dC, dD, dz, dbias, dstate), ctx.dtypes), None)


def wkv4(w, u, k, v, state, grad):
    """RWKV-4's WKV on the C loops (see kernels/wkv4.py): (y in k's dtype, (num, den, max) fp32); differentiable when
    ``grad``."""
    if grad:
        y, *new_state = Wkv4CFunction.apply(w, u, k, v, *state)
        return y, tuple(new_state)
    y, new_state, _ = native.wkv4_forward(w, u, k, v, *state)
    return y.to(k.dtype), new_state


def wkv7(r, log_w, k, v, a, b, state, grad):
    """RWKV-7's WKV on the C loops (see kernels/wkv7.py): (y in r's dtype, state fp32); differentiable when ``grad``."""
    if grad:
        return Wkv7CFunction.apply(r, log_w, k, v, a, b, state)
    y, new_state, _ = native.wkv7_forward(r, log_w, k, v, a, b, state)
    return y.to(r.dtype), new_state


def selective_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, state, grad):
    """Mamba's selective scan on the C loops, the whole op (see kernels/ssm.py): (y in u's dtype, last state fp32);
    differentiable when ``grad``."""
    if grad:
        return SelectiveScanCFunction.apply(u, delta, A, B, C, D, z, delta_bias, state, delta_softplus)
    y, last, _ = native.selective_scan_forward(u, delta, A, B, C, D, z, delta_bias, delta_softplus, state)
    return y.to(u.dtype), last
