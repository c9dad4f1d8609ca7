"""Mamba's selective scan one token at a time, in float64 and differentiable: the gradients' yardstick.

The NumPy reference (seqmix.reference) is the truth for outputs and states but has no gradients. This definition
computes the same function with torch ops, written independently of the kernels (no chunks, no Triton tiles, no
saved statistics), so that autograd through it gives the true gradients of every input and of the initial state.
The tests check it against the NumPy reference to 1e-12 before trusting it. Its signature mirrors the op's (same
positional inputs, the same keyword options, ``state=None`` in and ``(y, state)`` out).
"""
from __future__ import annotations

import torch

__all__ = ["selective_scan"]


def selective_scan(u, delta, A, B, C, *, D=None, z=None, delta_bias=None, delta_softplus=False, state=None):
    """Mamba's selective scan token by token:

        dt = softplus(delta + delta_bias) (or delta + delta_bias),
        x_t = exp(dt_t A) x_{t-1} + dt_t B_t u_t,   y_t = C_t . x_t + D u_t,   y_t *= silu(z_t).

    Args:
        u, delta, z: (batch, D, T); A: (D, N); B, C: (batch, N, T); D, delta_bias: (D,); float64.
        state: (batch, D, N); None is zeros.
    Returns:
        (y (batch, D, T), x_T (batch, D, N)).
    """
    dt = delta if delta_bias is None else delta + delta_bias[:, None]
    if delta_softplus:
        dt = torch.logaddexp(dt, torch.zeros_like(dt))
    x = torch.zeros(u.shape[0], u.shape[1], A.shape[1], dtype=u.dtype, device=u.device) if state is None else state
    ys = []
    for t in range(u.shape[-1]):
        x = torch.exp(dt[..., t, None] * A) * x + (dt[..., t] * u[..., t])[..., None] * B[:, None, :, t]
        ys.append((x * C[:, None, :, t]).sum(-1))
    y = torch.stack(ys, dim=-1)
    if D is not None:
        y = y + D[:, None] * u
    if z is not None:
        y = y * z * torch.sigmoid(z)
    return y, x
