"""ReRoPE and Leaky ReRoPE attention in O(T) memory: fused Triton kernels (forward, backward, decode) and a torch
path built from exact pieces of flash attention merged by their log-sum-exp.

    score_ij = (q_i * sigma_i) . R(-rel(i - j)) k_j * scale   (causal),   O = softmax(score) v
    rel(x) = min(x, w)                           (ReRoPE)
    rel(x) = x if x < w else w + (x - w) / k     (Leaky ReRoPE, k > 1)
    sigma_i = max(1, ln(i + 1) / ln L)           (log-n scaling, with train_length = L; 1 without)

Shapes: q, k, v (B, H, T, d), d even -> (B, H, T, d). Decode: q (B, H, 1, d) at position T - 1, k_cache and
v_cache (B, H, T, d) holding keys *before* RoPE -> (B, H, 1, d). Float64 truth: reference/rope.py
(attention_from_relative_positions is the per-pair definition; rerope_attention the source's two-pass form).
Source: Su Jianlin, https://spaces.ac.cn/archives/9708, section "计算".

Why the source says "twice, and no flash attention". RoPE reaches a relative position through absolute ones,
(R(i) q) . (R(j) k) = q . R(j - i) k, and min(i - j, w) is not linear in i - j. The source therefore builds two
score matrices, a1 = (R(i) q_i) . (R(j) k_j) used where i - j < w and a2 = (R(w) q_i) . k_j (Leaky:
(R((i - w)/k + w) q_i) . (R(j/k) k_j)) used where i - j >= w, and merges them: two T x T matrices.

What is done here instead. Each pair (i, j) needs exactly one of the two scores, and which one depends on i - j
only: a band of width w along the diagonal is "near" (RoPE), everything below it is "far". So:

* Triton (fused.py, flash style): a program owns a tile of queries and walks the key tiles in three runs classified
  from the tile corners (far only, the band that straddles i - j = w, near only); the cost is one attention plus a
  band of about two tiles per row, and nothing T x T exists. Decode ("triton") is the same kernel with one query
  row, its slices of the cache merged in torch.
* Triton decode in one launch (decode.py, backend "triton_merged", what None runs on CUDA tensors): one query row
  scored by fp32 products summed over d, the cache split across programs, the slices merged by the last program of
  each head in the same kernel.
* torch (piecewise.py): the far part and the near band are ordinary attentions on blocks of rows ("pieces"), each
  one call of a flash-attention kernel that also returns its log-sum-exp, merged exactly by their log-sum-exp.
  Decode rotates the cache in chunks of keys.
The rotations both paths apply (tables of cos and sin, computed in float64) are in rotation.py.
"""
from __future__ import annotations

import math
import numbers

import torch

from .._common import accumulation_dtype, check_devices, check_same_dtype, check_tensor
from .._flash import positive_scale, set_fp32_dot_precision
from ..backends import Call, dispatch
from .decode import rerope_decode_merged
from .fused import rerope_triton
from .piecewise import rerope_decode_torch, rerope_torch
from .rotation import cos_sin, log_n, rotate

__all__ = ["rerope_attention", "rerope_decode", "apply_rope", "log_n_scaling", "set_fp32_dot_precision"]


def _check_options(window, leaky_k, scale, train_length, base, d):
    if isinstance(window, bool) or not isinstance(window, numbers.Integral):
        raise TypeError(f"window must be an int, got {type(window).__name__}")
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if leaky_k is not None and not (isinstance(leaky_k, numbers.Real) and 1 < leaky_k < math.inf):
        raise ValueError(f"leaky_k must be a finite number > 1 (None for ReRoPE), got {leaky_k!r}")
    if train_length is not None and not (isinstance(train_length, numbers.Real) and 2 <= train_length < math.inf):
        raise ValueError(f"train_length must be a finite number >= 2 (None: no log-n scaling), got {train_length!r}")
    if not (isinstance(base, numbers.Real) and 0 < base < math.inf):
        raise ValueError(f"base must be a finite number > 0, got {base!r}")
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if not (isinstance(scale, numbers.Real) and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number or None, got {scale!r}")
    return float(scale)


def _checked_run(op, torch_path, q, k, v, window, leaky_k, scale, train_length, base, backend):
    """What prefill and decode share, once their shapes are checked: dtype, device, an even head dim, the backend,
    the options; then ``torch_path`` or the fused kernels."""
    dtype = check_same_dtype(q=q, k=k, v=v)
    device = check_devices(q=q, k=k, v=v)
    d = q.shape[-1]
    if d % 2 or d < 2:
        raise ValueError(f"RoPE needs an even head dim d >= 2, got q {tuple(q.shape)} with d = {d}")
    backend = dispatch(Call(op, device, dtype, {"d": d}), backend)
    scale = _check_options(window, leaky_k, scale, train_length, base, d)
    if backend == "triton":
        return rerope_triton(q, k, v, int(window), leaky_k, scale, train_length, base)
    if backend == "triton_merged":
        return rerope_decode_merged(q, k, v, int(window), leaky_k, scale, train_length, base)
    q, scale = positive_scale(q, scale)
    return torch_path(q, k, v, int(window), leaky_k, scale, train_length, base)


def rerope_attention(q, k, v, window, *, leaky_k=None, scale=None, train_length=None, base=10000.0, backend=None):
    """ReRoPE (leaky_k=None) or Leaky ReRoPE causal attention, memory O(T).

        score_ij = (q_i sigma_i) . R(-rel(i - j)) k_j * scale,  rel(x) = min(x, w) or (x < w ? x : w + (x - w)/k)
        sigma_i = max(1, ln(i + 1)/ln(train_length)) with train_length, else 1;  O = softmax(score) v
    The same meaning as reference.rope.rerope_attention; differentiable on both backends.

    Args:
        q, k, v (torch.Tensor): (B, H, T, d), before any rotation, d even; one dtype: fp32, fp16 or bf16 (float64
            too on the torch backend).
        window (int): w >= 1.
        leaky_k (float or None): k > 1 for Leaky ReRoPE; None for ReRoPE. Default: None.
        scale (float or None): multiplies every score. Default: 1/sqrt(d).
        train_length (float or None): L >= 2 turns on log-n scaling. Default: None.
        base (float): RoPE's base, inv_freq = base^(-2f/d). Default: 10000.0.
        backend (str or None): "torch" (exact flash-attention pieces merged by log-sum-exp), "triton" (one fused
            kernel, 16 <= d <= 128) or None. None runs the first that takes the call, in this order: "triton" (CUDA
            tensors, 16 <= d <= 128), "torch" (any other call). A backend named here that cannot take the call
            raises with its reason (kernels/backends.py). Default: None.
    Returns:
        torch.Tensor: (B, H, T, d), in the input dtype.

    Source: https://spaces.ac.cn/archives/9708.
    """
    check_tensor("q", q, (None, None, None, None))
    B, H, T, d = q.shape
    check_tensor("k", k, (B, H, T, d))
    check_tensor("v", v, (B, H, T, d))
    if T < 1:
        raise ValueError(f"q must hold at least one position, got shape {tuple(q.shape)}")
    return _checked_run("rerope_attention", rerope_torch, q, k, v, window, leaky_k, scale, train_length, base, backend)


def rerope_decode(q, k_cache, v_cache, window, *, leaky_k=None, scale=None, train_length=None, base=10000.0,
                  backend=None):
    """One query at position T - 1 against a cache of T keys stored before RoPE, each rotated on the fly:

        score_j = (q sigma) . R(-rel(T - 1 - j)) k_j * scale,   O = softmax(score) v
    Equals the last row of rerope_attention over the same T positions.

    Args:
        q (torch.Tensor): (B, H, 1, d), before rotation.
        k_cache, v_cache (torch.Tensor): (B, H, T, d), T >= 1, the keys before RoPE; the cache includes the
            query's own key.
        window, leaky_k, scale, train_length, base: as in ``rerope_attention``.
        backend (str or None): "triton_merged" (decode.py: one launch, the cache split across programs and the
            splits merged by the last program of each head; keys rotated in registers, d <= 128), "triton" (the
            prefill's kernel with one query row, the splits merged by torch, 16 <= d <= 128), "torch" (the cache
            rotated piecewise.DECODE_CHUNK keys at a time, no rotated copy of the whole cache) or None. None runs the
            first that takes the call, in this order: "triton_merged" (CUDA tensors, d <= 128), "triton" (CUDA
            tensors, 16 <= d <= 128), "torch" (any other call). A backend named here that cannot take the call raises
            with its reason (kernels/backends.py). Gradients: "triton_merged" takes the "triton" backward (it
            recomputes that forward's O and LSE). Default: None.
    Returns:
        torch.Tensor: (B, H, 1, d), in the input dtype.

    Source: https://spaces.ac.cn/archives/9708.
    """
    check_tensor("q", q, (None, None, 1, None))
    B, H, _, d = q.shape
    check_tensor("k_cache", k_cache, (B, H, None, d))
    T = k_cache.shape[2]
    check_tensor("v_cache", v_cache, (B, H, T, d))
    if T < 1:
        raise ValueError(f"k_cache must hold at least the query's own key (T >= 1), got shape {tuple(k_cache.shape)}")
    return _checked_run("rerope_decode", rerope_decode_torch, q, k_cache, v_cache, window, leaky_k, scale, train_length,
                        base, backend)


def _check_rows(name, x):
    """x must be a float tensor of rows (..., T, d), at least 2-D."""
    check_tensor(name, x, (None,) * (max(x.dim(), 2) if isinstance(x, torch.Tensor) else 2))


def apply_rope(x, positions, *, base=10000.0):
    """R(p_t) x_t: each row of x rotated by its own position, for RoPE attention built from ``attention`` (RoPE,
    position interpolation and NTK-aware RoPE, which rerope_attention cannot express).

        (R(p) x)_f = x_f cos(p theta_f) - x_{f+d/2} sin(p theta_f),  (R(p) x)_{f+d/2} = x_{f+d/2} cos + x_f sin,
        theta_f = base^(-2f/d)
    Same meaning as reference.rope.apply_rope; differentiable in x.

    Args:
        x (torch.Tensor): (..., T, d), d even, a float dtype.
        positions: (T,) numbers, one per row of x; fractional allowed (position interpolation divides them by k).
        base (float): RoPE's base (NTK-aware scaling enlarges it). Default: 10000.0.
    Returns:
        torch.Tensor: x's shape and dtype, rotated in fp32 (float64 for float64 x), the angles in float64.

    Source: RoPE (arXiv:2104.09864), in the rotate-half layout of https://spaces.ac.cn/archives/9708's code.
    """
    _check_rows("x", x)
    T, d = x.shape[-2:]
    if d % 2:
        raise ValueError(f"RoPE needs an even head dim, got x with d = {d}")
    positions = torch.as_tensor(positions, dtype=torch.float64, device=x.device)
    if positions.shape != (T,):
        raise ValueError(f"positions must have shape ({T},) (one per row of x), got {tuple(positions.shape)}")
    if not torch.isfinite(positions).all():
        raise ValueError("positions must be finite")
    _check_options(1, None, None, None, base, d)
    compute = accumulation_dtype(x.dtype)
    cos, sin = cos_sin(positions, d, base, compute)
    return rotate(x.to(compute), cos, sin).to(x.dtype)


def log_n_scaling(q, train_length, *, first_position=0):
    """q_n * max(1, ln(n) / ln(L)): the source's log-n scaling of the query at 1-based position n, the rows of q
    being positions first_position, first_position + 1, ... (0-based, n = position + 1). rerope_attention applies
    the same factor itself when given train_length. Same meaning as reference.rope.log_n_scale.

    Args:
        q (torch.Tensor): (..., T, d), a float dtype.
        train_length (float or None): L >= 2; None returns q as is.
        first_position (int): the 0-based position of q's first row. Default: 0.
    Returns:
        torch.Tensor: q's shape and dtype, differentiable.

    Source: https://spaces.ac.cn/archives/9708 (log n), after arXiv:2202.12172.
    """
    _check_rows("q", q)
    _check_options(1, None, None, train_length, 10000.0, q.shape[-1])
    if isinstance(first_position, bool) or not isinstance(first_position, numbers.Integral) or first_position < 0:
        raise ValueError(f"first_position must be an int >= 0, got {first_position!r}")
    return log_n(q, int(first_position), train_length)
