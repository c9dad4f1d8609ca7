"""RWKV-4's WKV on the C loops of wkv4.c (backend="c"): the ctypes wrappers of its entry points, and the
autograd op that runs them for inference and training.

The forward runs once; when a gradient is wanted it also keeps what the C backward needs (three numbers per token, as
the Triton forward saves), and the backward walks time in reverse in C. Inputs reach the loops as fp32; outputs take
the values' dtype, states are fp32, and each gradient takes its input's dtype.
"""
from __future__ import annotations

import torch

from .. import native
from .._common import first_order_only
from ..native import call, floats, fp32, sum_rows

__all__ = ["Wkv4CFunction", "wkv4", "wkv4_forward", "wkv4_backward"]

ALIGN = 16               # channel blocks are multiples of this (whole vectors)


class Wkv4CFunction(torch.autograd.Function):
    """(w, u, k, v, num0, den0, max0) -> (y, num, den, max) on the C loops."""

    @staticmethod
    def forward(ctx, w, u, k, v, num0, den0, max0):
        fp32 = [native.fp32(x) for x in (w, u, k, v, num0, den0, max0)]
        y, state, saved = wkv4_forward(*fp32, save=True)
        ctx.save_for_backward(*fp32, *state[:2], *saved)
        ctx.dtypes = native.dtypes_of(w, u, k, v, num0, den0, max0)
        return (y.to(k.dtype), *state)

    @staticmethod
    @first_order_only
    def backward(ctx, gy, g_num, g_den, g_max):
        w, u, k, v, num0, den0, max0, num, den, *saved = ctx.saved_tensors
        grads = wkv4_backward(w, u, k, v, num0, den0, max0, num, den, saved, gy, g_num, g_den, g_max)
        return native.grads_as(grads, ctx.dtypes)


def wkv4(w, u, k, v, state, grad):
    """RWKV-4's WKV on the C loops (see kernels/wkv4/): (y in k's dtype, (num, den, max) fp32); differentiable when
    ``grad``."""
    if grad:
        y, *new_state = Wkv4CFunction.apply(w, u, k, v, *state)
        return y, tuple(new_state)
    y, new_state, _ = wkv4_forward(w, u, k, v, *state)
    return y.to(k.dtype), new_state


def _wkv4_block(B, C):
    """Channels per WKV-4 work item: blocks as wide as the thread count allows, since a narrow block walks memory
    with a stride of a whole row per token (measured 3x slower at 64 channels than at 768)."""
    per_row = -(-torch.get_num_threads() // B)                             # blocks per row to feed every thread
    return min(C, -(-C // per_row // ALIGN) * ALIGN)


def wkv4_forward(w, u, k, v, num0, den0, max0, save=False):
    """RWKV-4's WKV: w, u (C,); k, v (B, T, C); state (B, C) each -> (y (B, T, C), (num, den, max), saved); all fp32.
    ``saved``: what wkv4_backward needs (v - y, d, z per token; lag and bad per channel), None without ``save``.
    Work items are (batch row, channel block)."""
    w, u, k, v, num0, den0, max0 = map(fp32, (w, u, k, v, num0, den0, max0))
    B, T, C = k.shape
    block = _wkv4_block(B, C)
    y = floats(B, T, C)
    num, den, mx, lag = (floats(B, C) for _ in range(4))
    bad = torch.empty(B, C, dtype=torch.int32)
    per_token = [floats(B, T, C) for _ in range(3)] if save else [None] * 3
    call("wkv4_forward", B * -(-C // block), k.numel(), T=T, C=C, block=block, w=w, u=u, k=k, v=v, y=y, num0=num0,
         den0=den0, max0=max0, num_out=num, den_out=den, max_out=mx, lag_out=lag, bad_out=bad,
         **dict(zip(("vy_save", "d_save", "z_save"), per_token)))
    return y, (num, den, mx), ((*per_token, lag, bad) if save else None)


def wkv4_backward(w, u, k, v, num0, den0, max0, num, den, saved, gy, g_num, g_den, g_max):
    """The gradients of wkv4_forward (fp32 inputs, as it took them; num, den its final state, ``saved`` what it
    saved) for the cotangents gy (B, T, C) and g_num, g_den, g_max (B, C): (dw, du, dk, dv, dnum0, dden0, dmax0),
    fp32; dw and du summed over the batch in a fixed order."""
    gy, g_num, g_den, g_max = map(fp32, (gy, g_num, g_den, g_max))
    B, T, C = k.shape
    block = _wkv4_block(B, C)
    gk, gv = floats(B, T, C), floats(B, T, C)
    gw, gu, g_num0, g_den0, g_max0 = (floats(B, C) for _ in range(5))
    vy, d, z, lag, bad = saved
    call("wkv4_backward", B * -(-C // block), k.numel(), T=T, C=C, block=block, w=w, u=u, k=k, v=v, vy_save=vy,
         d_save=d, z_save=z, gy=gy, num0=num0, den0=den0, max0=max0, num=num, den=den, lag_in=lag, bad=bad,
         gnum=g_num, gden=g_den, gmax=g_max, gk=gk, gv=gv, gw_out=gw, gu_out=gu, gnum0=g_num0, gden0=g_den0,
         gmax0=g_max0)
    return sum_rows(gw), sum_rows(gu), gk, gv, g_num0, g_den0, g_max0


