"""RWKV-4's WKV written as plainly as torch allows, in float64 and differentiable: the gradients' yardstick.

The NumPy reference (seqmix.reference) is the truth for outputs and states but has no gradients. This definition
computes the same function with torch ops, written independently of the kernels (no chunks, no Triton tiles, no
saved statistics), so that autograd through it gives the true gradients of every input and of the initial state.
The tests check it against the NumPy reference to 1e-12 before trusting it. Its signature mirrors the op's (same
positional inputs, the same keyword options, ``state=None`` in and ``(y, state)`` out).
"""
from __future__ import annotations

import torch

from ...reference.wkv4 import INITIAL_MAX

__all__ = ["wkv4"]


def wkv4(w, u, k, v, *, state=None):
    """RWKV-4's WKV with every exponent of the definition written at once (no recurrence), each row shifted by its
    own maximum. For every query time t (and t = T for the final state) the terms are

        state  max_0 + t w      (weights num_0, den_0)
        token  (t-1-i) w + k_i  for i < t   (weights v_i, 1)
        bonus  u + k_t          for t < T   (weights v_t, 1)

    y_t = sum(weights_v e^z) / sum(weights_1 e^z); row T gives the final state, its maximum the state's max
    (Hugging Face's meaning: the largest exponent seen).

    Args:
        w, u: (C,); k, v: (B, T, C); float64.
        state: (num, den, max), each (B, C); None is (0, 0, -1e38).
    Returns:
        (y (B, T, C), (num, den, max)).
    """
    B, T, C = k.shape
    if state is None:
        zeros = torch.zeros(B, C, dtype=k.dtype, device=k.device)
        state = (zeros, zeros, torch.full_like(zeros, INITIAL_MAX))
    num0, den0, max0 = state
    t = torch.arange(T + 1, dtype=k.dtype, device=k.device)[:, None]                         # (T+1, 1) query times
    i = torch.arange(T, dtype=k.dtype, device=k.device)[None, :]                             # (1, T) key times
    minus_inf = torch.tensor(-torch.inf, dtype=k.dtype, device=k.device)
    tokens = torch.where((i < t)[..., None], (t - 1 - i)[..., None] * w + k[:, None], minus_inf)   # (B, T+1, T, C)
    bonus = torch.cat([u + k, minus_inf.expand(B, 1, C)], 1)                                 # (B, T+1, C)
    z = torch.cat([(max0[:, None] + t * w)[:, :, None], tokens, bonus[:, :, None]], 2)       # (B, T+1, T+2, C)
    top = z.amax(2, keepdim=True)
    p = torch.exp(z - top)

    def weighted(of_state, of_tokens):                                                        # -> (B, T+1, C)
        per_term = torch.cat([of_state[:, None, None].expand(B, T + 1, 1, C),
                              of_tokens[:, None].expand(B, T + 1, T, C),
                              torch.cat([of_tokens, of_tokens[:, :1]], 1)[:, :, None]], 2)   # row T's bonus: e^-inf
        return (p * per_term).sum(2)

    num, den = weighted(num0, v), weighted(den0, torch.ones_like(v))
    return num[:, :T] / den[:, :T], (num[:, T], den[:, T], top[:, T, 0])
