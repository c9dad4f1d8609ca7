"""The six ops written as plainly as torch allows, in float64 and differentiable: the gradients' yardstick.

The NumPy references (seqmix.reference) are the truth for outputs and states but have no gradients. These
definitions compute the same functions with torch ops, written independently of the kernels (no chunks, no Triton
tiles, no saved statistics), so that autograd through them gives the true gradients of every input and of the
initial state. Each is checked against the NumPy reference to 1e-12 by the tests (tests/test_conformance*.py and
the kernel tests) before it is trusted. Signatures mirror the ops in seqmix.kernels (same positional inputs, the
same keyword options, ``state=None`` in and ``(y, state)`` out for the recurrences).

Glossary (the ops' own, see each function): q, k, v queries, keys, values; w, u RWKV-4's per-step log decay and
bonus; r, log_w, a, b RWKV-7's receptance, log decay and the delta rule's vectors; u, delta, A, B, C, D, z the
selective scan's input, step, state matrix, input and output projections, skip and gate.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from seqmix.reference.rope import log_n_scale, relative_positions
from seqmix.reference.wkv4 import INITIAL_MAX

__all__ = ["explicit_attention", "rerope_attention", "rerope_decode", "wkv4", "wkv7", "selective_scan"]


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
