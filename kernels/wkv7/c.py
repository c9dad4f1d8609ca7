"""RWKV-7's WKV on the C loops of wkv7.c (backend="c"): the ctypes wrappers of its entry points, and the
autograd op that runs them for inference and training.

The forward runs once; when a gradient is wanted it also keeps the state every native.CHECKPOINT steps, and the
backward walks time in reverse in C. Inputs reach the loops as fp32; outputs take the values' dtype, states are fp32,
and each gradient takes its input's dtype.
"""
from __future__ import annotations

import torch

from .. import native
from .._common import first_order_only
from ..native import CHECKPOINT, call, floats, fp32, initial_state, library

__all__ = ["MAX_HEAD", "Wkv7CFunction", "wkv7", "wkv7_forward", "wkv7_backward"]

MAX_HEAD = 256           # the largest head the loops take (wkv7.c's MAX_V * VEC; tested to agree)
# what wkv7.c's STATUS_HEAD_SIZE means
STATUS = {**native.STATUS, 2: (ValueError, f"takes head size N <= {MAX_HEAD}")}


class Wkv7CFunction(torch.autograd.Function):
    """(r, log_w, k, v, a, b, state0 or None) -> (y, state) on the C loops."""

    @staticmethod
    def forward(ctx, r, log_w, k, v, a, b, state0):
        fp32 = [native.fp32(x) for x in (r, log_w, k, v, a, b)]
        y, state, saved = wkv7_forward(*fp32, state0, save=True)
        ctx.save_for_backward(*fp32, *saved)
        ctx.dtypes = native.dtypes_of(r, log_w, k, v, a, b, state0)
        return y.to(r.dtype), state

    @staticmethod
    @first_order_only
    def backward(ctx, dy, dstate):
        *x, ckpt, bad = ctx.saved_tensors
        return native.grads_as(wkv7_backward(*x, (ckpt, bad), dy, dstate), ctx.dtypes)


def wkv7(r, log_w, k, v, a, b, state, grad):
    """RWKV-7's WKV on the C loops (see kernels/wkv7/): (y in r's dtype, state fp32); differentiable when ``grad``."""
    if grad:
        return Wkv7CFunction.apply(r, log_w, k, v, a, b, state)
    y, new_state, _ = wkv7_forward(r, log_w, k, v, a, b, state)
    return y.to(r.dtype), new_state


def wkv7_forward(r, log_w, k, v, a, b, state, save=False):
    """S_t = S_{t-1} diag(e^{log_w_t}) + (S_{t-1} a_t) b_t^T + v_t k_t^T, y_t = S_t r_t: r, log_w, k, v, a, b
    (B, T, H, N); state (B, H, N, N) [value, key] or None -> (y (B, T, H, N), last state (B, H, N, N), saved);
    fp32. ``saved``: what wkv7_backward needs (checkpoints, bad heads), None without ``save``."""
    r, log_w, k, v, a, b = map(fp32, (r, log_w, k, v, a, b))
    B, T, H, N = r.shape
    y = floats(B, T, H, N)
    last = initial_state(state, (B, H, N, N))
    NP = library().wkv7_padded_size(N)         # the head size padded to whole vectors, as the loop keeps its state
    ckpt, bad = ((floats(B * H, -(-T // CHECKPOINT), NP, NP), torch.empty(B * H, dtype=torch.int32)) if save
                 else (None, None))
    call("wkv7_forward", B * H, B * T * H * N * N, f"r of shape {(B, T, H, N)}", STATUS, T=T, H=H, N=N, r=r,
         log_w=log_w, k=k, v=v, a=a, b=b, y=y, state=last, ck=CHECKPOINT, ckpt=ckpt, bad_out=bad)
    return y, last, ((ckpt, bad) if save else None)


def wkv7_backward(r, log_w, k, v, a, b, saved, dy, dstate):
    """The gradients of wkv7_forward (fp32 inputs, as it took them; ``saved`` what it saved) for the cotangents
    dy (B, T, H, N) and dstate (B, H, N, N): (dr, dlog_w, dk, dv, da, db, dstate0), fp32."""
    ckpt, bad = saved
    dy, dstate = fp32(dy), fp32(dstate)
    B, T, H, N = r.shape
    grads = {name: floats(B, T, H, N) for name in ("dr", "dlog_w", "dk", "dv", "da", "db")}
    dstate0 = floats(B, H, N, N)
    call("wkv7_backward", B * H, B * T * H * N * N, f"r of shape {(B, T, H, N)}", STATUS, T=T, H=H, N=N, r=r,
         log_w=log_w, k=k, v=v, a=a, b=b, dy=dy, dstate=dstate, ck=CHECKPOINT, ckpt=ckpt, bad=bad,
         dstate0=dstate0, **grads)
    return (*grads.values(), dstate0)
