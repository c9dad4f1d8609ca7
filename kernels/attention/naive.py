"""Softmax attention written as plainly as torch allows, in float64 and differentiable: the gradients' yardstick.

The NumPy reference (seqmix.reference) is the truth for outputs and states but has no gradients. This definition
computes the same function with torch ops, written independently of the kernels (no chunks, no Triton tiles, no
saved statistics), so that autograd through it gives the true gradients of every input and of the initial state.
The tests check it against the NumPy reference to 1e-12 before trusting it. Its signature mirrors the op's (same
positional inputs, the same keyword options).
"""
from __future__ import annotations

import math

import torch

__all__ = ["explicit_attention"]


def _scale(scale, d):
    return 1 / math.sqrt(d) if scale is None else scale


def explicit_attention(q, k, v, *, causal=True, scale=None):
    """softmax(q k^T * scale + M) v, M = -inf above the diagonal when causal.

    Args:
        q, k, v: (B, H, T, d) float64 tensors.
        causal: mask keys after the query.
        scale: 1/sqrt(d) when None.
    Returns:
        (B, H, T, d).
    """
    T, d = q.shape[-2:]
    s = q @ k.transpose(-1, -2) * _scale(scale, d)                                            # (B, H, T, T)
    if causal:
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v
