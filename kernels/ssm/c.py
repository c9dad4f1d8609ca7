"""Mamba's selective scan on the C loops of ssm.c (backend="c"), the whole op (delta's bias and softplus, the
scan, the skip D u and the gate silu(z)): the ctypes wrappers of its entry points, and the autograd op that runs them
for inference and training.

The forward runs once; when a gradient is wanted it also keeps the state every native.CHECKPOINT steps, and the
backward walks time in reverse in C. Inputs reach the loops as fp32; outputs take the values' dtype, states are fp32,
and each gradient takes its input's dtype.
"""
from __future__ import annotations

import torch

from .. import native
from .._common import first_order_only
from ..native import CHECKPOINT, call, floats, fp32, initial_state, library, sum_rows

__all__ = ["SelectiveScanCFunction", "selective_scan", "selective_scan_forward", "selective_scan_backward"]

GROUPS_PER_CALL = 16     # the backward: work items per call where the batch alone gives fewer


class SelectiveScanCFunction(torch.autograd.Function):
    """(u, delta, A, B, C, D, z, delta_bias, state0, delta_softplus) -> (y, last state) on the C loops: the whole op
    (delta's bias and softplus, the scan, the skip D u and the gate silu(z)); D, z, delta_bias, state0 may be None."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, state0, delta_softplus):
        fp32 = [native.fp32(x) for x in (u, delta, A, D, z, delta_bias)]
        y, last, saved = selective_scan_forward(*fp32[:3], B, C, *fp32[3:], delta_softplus, state0, save=True)
        ctx.save_for_backward(*fp32, *saved)
        ctx.dtypes, ctx.delta_softplus = native.dtypes_of(u, delta, A, B, C, D, z, delta_bias, state0), delta_softplus
        return y.to(u.dtype), last

    @staticmethod
    @first_order_only
    def backward(ctx, dy, dlast):
        u, delta, A, D, z, delta_bias, *saved = ctx.saved_tensors
        du, ddelta, dA, dB, dC, dD, dz, dbias, dstate = selective_scan_backward(
            u, delta, A, D, z, delta_bias, ctx.delta_softplus, saved, dy, dlast)
        return (*native.grads_as((du, ddelta, dA, dB, dC, dD, dz, dbias, dstate), ctx.dtypes), None)


def selective_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, state, grad):
    """Mamba's selective scan on the C loops, the whole op (see kernels/ssm/): (y in u's dtype, last state fp32);
    differentiable when ``grad``."""
    if grad:
        return SelectiveScanCFunction.apply(u, delta, A, B, C, D, z, delta_bias, state, delta_softplus)
    y, last, _ = selective_scan_forward(u, delta, A, B, C, D, z, delta_bias, delta_softplus, state)
    return y.to(u.dtype), last


def _scan_groups(batch, blocks):
    """Blocks of channels per work item of the scan's backward, from the shapes alone (never the thread count, so
    that dB and dC are summed in one order): one group per batch row when there are rows enough to share out,
    else up to GROUPS_PER_CALL groups in all."""
    per_row = min(blocks, -(-GROUPS_PER_CALL // batch))
    return -(-blocks // per_row)


def selective_scan_forward(u, delta, A, B, C, D, z, delta_bias, delta_softplus, state, save=False):
    """delta <- softplus(delta + delta_bias) (when asked), x_t = e^{delta_t A} x_{t-1} + delta_t B_t u_t,
    y_t = (C_t . x_t + D u_t) silu(z_t): u, delta, z (batch, D, T); A (D, N); B, C (batch, N, T); D, delta_bias (D,);
    D, z, delta_bias and state (batch, D, N) may be None -> (y (batch, D, T), last state (batch, D, N), saved); fp32.
    ``saved``: what selective_scan_backward needs (B and C time-major, checkpoints, bad lanes), None without
    ``save``."""
    u, delta, A, D, z, delta_bias = map(fp32, (u, delta, A, D, z, delta_bias))
    batch, dim, T = u.shape
    N = A.shape[1]
    y = floats(batch, dim, T)
    last = initial_state(state, (batch, dim, N))
    Bt, Ct = (x.float().transpose(1, 2).contiguous() for x in (B, C))       # (batch, T, N): a token's N adjacent
    lanes = library().selective_scan_lanes()                                  # channels per work item
    items = batch * -(-dim // lanes)
    ckpt, bad = ((floats(items, -(-T // CHECKPOINT), N, lanes), torch.empty(items, lanes, dtype=torch.int32))
                 if save else (None, None))
    call("selective_scan_forward", items, batch * dim * T * N, D=dim, T=T, N=N, delta_softplus=int(delta_softplus),
         u=u, delta=delta, delta_bias=delta_bias, A=A, Bt=Bt, Ct=Ct, Dskip=D, z=z, y=y, state=last, ck=CHECKPOINT,
         ckpt=ckpt, bad_out=bad)
    return y, last, ((Bt, Ct, ckpt, bad) if save else None)


def selective_scan_backward(u, delta, A, D, z, delta_bias, delta_softplus, saved, dy, dlast):
    """The gradients of selective_scan_forward (fp32 inputs, as it took them; ``saved`` what it saved) for the
    cotangents dy (batch, D, T) and dlast (batch, D, N): (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, dstate), fp32,
    None for D, z, delta_bias where they were None; dA, dD, ddelta_bias summed over the batch, dB, dC over the
    channels, each in a fixed order."""
    Bt, Ct, ckpt, bad = saved
    dy, dlast = fp32(dy), fp32(dlast)
    batch, dim, T = u.shape
    N = A.shape[1]
    lanes = library().selective_scan_lanes()
    blocks = -(-dim // lanes)
    per_group = _scan_groups(batch, blocks)
    groups = -(-blocks // per_group)
    du, ddelta, dz = floats(batch, dim, T), floats(batch, dim, T), None if z is None else floats(batch, dim, T)
    dA, dstate = floats(batch, dim, N), floats(batch, dim, N)
    dD, dbias = floats(batch, dim), floats(batch, dim)
    dB, dC = floats(batch, groups, T, N), floats(batch, groups, T, N)        # each group's channels' share
    call("selective_scan_backward", batch * groups, batch * dim * T * N, D=dim, T=T, N=N,
         delta_softplus=int(delta_softplus), per_group=per_group, u=u, delta=delta, delta_bias=delta_bias, A=A,
         Bt=Bt, Ct=Ct, Dskip=D, z=z, ck=CHECKPOINT, ckpt=ckpt, bad_in=bad, dy=dy, dlast=dlast, du=du,
         ddelta=ddelta, dz=dz, dA_part=dA, dB_part=dB, dC_part=dC, dD_part=dD, dbias_part=dbias, dstate=dstate)
    dB, dC = ((x[:, 0] if groups == 1 else sum_rows(x.transpose(0, 1))).transpose(1, 2) for x in (dB, dC))
    return (du, ddelta, sum_rows(dA), dB, dC, None if D is None else sum_rows(dD), dz,
            None if delta_bias is None else sum_rows(dbias), dstate)


