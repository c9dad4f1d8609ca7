"""ReRoPE's prefill and decode by their per-pair definition, in float64 and differentiable: the gradients'
yardstick.

The NumPy reference (seqmix.reference) is the truth for outputs and states but has no gradients. This definition
computes the same function with torch ops, written independently of the kernels (no chunks, no Triton tiles, no
saved statistics), so that autograd through it gives the true gradients of every input and of the initial state.
The tests check it against the NumPy reference to 1e-12 before trusting it. Its signature mirrors the op's (same
positional inputs, the same keyword options).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ...reference.rope import log_n_scale, relative_positions

__all__ = ["rerope_attention", "rerope_decode"]


def _scale(scale, d):
    return 1 / math.sqrt(d) if scale is None else scale


def _rerope_scores(q, k, rel, positions, train_length, scale, base):
    """score_ij = (q_i sigma_i) . R(-rel_ij) k_j * scale, one rotated key per pair (i, j).

    q: (B, H, Tq, d) at 0-based ``positions`` (Tq,); k: (B, H, Tk, d); rel: (Tq, Tk) -> (B, H, Tq, Tk).
    sigma_i = max(1, ln(p_i + 1)/ln(train_length)) with train_length, else 1 (log-n scaling)."""
    d = q.shape[-1]
    if train_length is not None:
        q = q * torch.tensor(log_n_scale(positions, train_length), device=q.device)[:, None]
    rel = torch.as_tensor(rel, dtype=torch.float64, device=q.device)
    angle = -rel[..., None] * base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=q.device) / d)
    cos, sin = angle.cos(), angle.sin()                                                       # (Tq, Tk, d/2)
    k1, k2 = k[..., None, :, : d // 2], k[..., None, :, d // 2:]                              # (B, H, 1, Tk, d/2)
    k_rot = torch.cat((k1 * cos - k2 * sin, k2 * cos + k1 * sin), -1)                         # (B, H, Tq, Tk, d)
    return torch.einsum("bhid,bhijd->bhij", q, k_rot) * _scale(scale, d)


def _kind(leaky_k):
    return "rerope" if leaky_k is None else "leaky_rerope"


def rerope_attention(q, k, v, window, *, leaky_k=None, scale=None, train_length=None, base=10000.0):
    """ReRoPE (leaky_k=None) or Leaky ReRoPE prefill by its per-pair definition, causal:

        O_i = sum_{j<=i} softmax_j((q_i sigma_i) . R(-rel(i - j)) k_j * scale) v_j,
        rel(x) = min(x, w) (ReRoPE) or x if x < w else w + (x - w)/leaky_k (Leaky ReRoPE).

    Args:
        q, k, v: (B, H, T, d) float64, before any rotation; d even.
        window: w >= 1. leaky_k, scale, train_length, base: as in seqmix.kernels.rerope.
    Returns:
        (B, H, T, d).
    """
    T = q.shape[-2]
    rel = relative_positions(T, _kind(leaky_k), window=window, k=leaky_k)
    s = _rerope_scores(q, k, rel, np.arange(T), train_length, scale, base)
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v


def rerope_decode(q, k_cache, v_cache, window, *, leaky_k=None, scale=None, train_length=None, base=10000.0):
    """The last row of rerope_attention: one query at position T-1 against T keys stored before RoPE.

    Args:
        q: (B, H, 1, d); k_cache, v_cache: (B, H, T, d); float64. Options as in rerope_attention.
    Returns:
        (B, H, 1, d).
    """
    T = k_cache.shape[-2]
    rel = relative_positions(T, _kind(leaky_k), window=window, k=leaky_k)[-1:]                         # (1, T)
    s = _rerope_scores(q, k_cache, rel, np.array([T - 1]), train_length, scale, base)
    return torch.softmax(s, -1) @ v_cache
