"""The rotations ReRoPE applies, shared by both paths: one table of cos and sin per rotation, the rotation of whole
tensors (with its backward) and the log-n scaling of the queries.

The rotate-half layout pairs dimension f with f + d/2 (as RoPE implementations store it): R(angle) x =
(x1 cos - x2 sin, x2 cos + x1 sin) on the halves x1 = x[..., :d/2], x2 = x[..., d/2:], angle_f = p * base^(-2f/d).
"""
from __future__ import annotations

import math

import torch

__all__ = ["NEAR", "FAR_Q", "FAR_K", "cos_sin", "rotation_table", "cached_rotation_table", "rotate", "log_n"]

NEAR, FAR_Q, FAR_K = 0, 1, 2      # the table's paths: RoPE's R(p); the far query's rotation; the far key's


def cos_sin(positions, d, base, dtype):
    """(2, n, d/2): cos and sin of positions * inv_freq, inv_freq_f = base^(-2f/d). The angles are float64 and
    rounded once to ``dtype``, so the values are as exact at position 10^5 as at 0 (an fp32 angle is not)."""
    inv_freq = float(base) ** (-torch.arange(0, d, 2, dtype=torch.float64, device=positions.device) / d)
    angle = positions.to(torch.float64)[:, None] * inv_freq
    return torch.stack((angle.cos(), angle.sin())).to(dtype)


def rotation_table(T, d, window, leaky_k, base, dtype, device):
    """(paths, 2, T, d/2): [NEAR] position p; [FAR_Q] w for ReRoPE, (p - w)/k + w for Leaky; [FAR_K] p/k (Leaky
    only: ReRoPE's far key is not rotated)."""
    p = torch.arange(T, dtype=torch.float64, device=device)
    positions = [p, torch.full_like(p, float(window)) if leaky_k is None else (p - window) / leaky_k + window]
    if leaky_k is not None:
        positions.append(p / leaky_k)
    return torch.stack([cos_sin(x, d, base, dtype) for x in positions])


# The fused kernels' fp32 tables, by what determines them: (head dim, window, leaky_k, base, device). Each holds at
# least the longest sequence asked for so far; every layer and every decoding step of a model shares it.
_TABLES: dict = {}


def cached_rotation_table(T, d, window, leaky_k, base, device):
    """rotation_table in fp32 with at least T positions (more when a longer one was built before): built once per
    (d, window, leaky_k, base, device), rebuilt at twice the length (or T) when a longer one is needed, so that a
    decoder growing one token a step rebuilds it log2(T) times. Rows are the same at any length: a row is its
    position's float64 angles rounded once. Built outside inference mode and autograd, so that training may save
    it."""
    key = (d, window, leaky_k, float(base), torch.device(device))
    table = _TABLES.get(key)
    if table is None or table.shape[2] < T:
        length = T if table is None else max(T, 2 * table.shape[2])
        with torch.inference_mode(False), torch.no_grad():
            table = rotation_table(length, d, window, leaky_k, base, torch.float32, device)
        _TABLES[key] = table
    return table


class _Rotate(torch.autograd.Function):
    """R x in the rotate-half layout: (x1 cos - x2 sin, x2 cos + x1 sin), written straight into one output (no
    temporaries: this runs on whole (B, H, T, d) tensors). (cos, -sin) gives R^T x, which is also the backward: a
    rotation again, by this Function, so that it is differentiable any number of times (apply_to's out= writes are
    not)."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _Rotate.apply_to(x, cos, sin)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _Rotate.apply(grad, cos, -sin), None, None

    @staticmethod
    def apply_to(x, cos, sin):
        out = torch.empty_like(x)
        (x1, x2), (out1, out2) = x.chunk(2, dim=-1), out.chunk(2, dim=-1)
        torch.mul(x1, cos, out=out1).addcmul_(x2, sin, value=-1)
        torch.mul(x2, cos, out=out2).addcmul_(x1, sin)
        return out


def rotate(x, cos, sin):
    """R x of x (..., n, d), cos and sin (n, d/2) (from ``rotation_table`` or ``cos_sin``), differentiable in x;
    rotate(x, cos, -sin) is R^T x = R(-angle) x."""
    return _Rotate.apply(x, cos, sin)


def log_n(x, first_position, train_length):
    """x (..., n, c) with row r multiplied by max(1, ln(p + 1)/ln L), p = first_position + r: log-n scaling of the
    queries (and of their gradient). x itself without train_length."""
    if train_length is None:
        return x
    p = torch.arange(first_position, first_position + x.shape[-2], dtype=torch.float64, device=x.device)
    return x * torch.clamp(torch.log1p(p) / math.log(train_length), min=1.0)[:, None].to(x.dtype)
