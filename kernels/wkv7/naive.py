"""RWKV-7's WKV one token at a time, in float64 and differentiable: the gradients' yardstick.

The NumPy reference (seqmix.reference) is the truth for outputs and states but has no gradients. This definition
computes the same function with torch ops, written independently of the kernels (no chunks, no Triton tiles, no
saved statistics), so that autograd through it gives the true gradients of every input and of the initial state.
The tests check it against the NumPy reference to 1e-12 before trusting it. Its signature mirrors the op's (same
positional inputs, the same keyword options, ``state=None`` in and ``(y, state)`` out).
"""
from __future__ import annotations

import torch

__all__ = ["wkv7"]


def wkv7(r, log_w, k, v, a, b, *, state=None):
    """RWKV-7's generalized delta rule, one token at a time:

        S_t = S_{t-1} diag(exp(log_w_t)) + (S_{t-1} a_t) b_t^T + v_t k_t^T,   y_t = S_t r_t.

    Args:
        r, log_w, k, v, a, b: (B, T, H, N) float64.
        state: (B, H, N, N) indexed [value, key]; None is zeros.
    Returns:
        (y (B, T, H, N), S_T (B, H, N, N)).
    """
    B, T, H, N = r.shape
    S = torch.zeros(B, H, N, N, dtype=r.dtype, device=r.device) if state is None else state
    ys = []
    for t in range(T):
        Sa = (S @ a[:, t, :, :, None]).squeeze(-1)                                             # (B, H, N)
        S = (S * log_w[:, t, :, None, :].exp() + Sa[..., None] * b[:, t, :, None, :]
             + v[:, t, :, :, None] * k[:, t, :, None, :])
        ys.append((S @ r[:, t, :, :, None]).squeeze(-1))
    return torch.stack(ys, 1), S
