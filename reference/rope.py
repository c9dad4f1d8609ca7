"""RoPE and its rectified variants: relative-position matrices, attention from them, ReRoPE prefill and decode.

Glossary (source: Su Jianlin, "Transformer upgrade path 12: ReRoPE with infinite extrapolation?",
https://spaces.ac.cn/archives/9708, and RoPE, arXiv:2104.09864):

    x, q, k, v      x, q, k, v     (..., T, d) rows are positions 0..T-1; d is even
    R(p)            R^p            RoPE's rotation by position p (may be fractional): dimension i is paired with
                                   i + d/2 ("rotate-half" layout) and the pair turns by angle p * inv_freq_i
    inv_freq_i      theta_i        base^(-2i/d), i = 0 .. d/2 - 1
    rel_ij          matrix entry   the relative position used between query i and key j, f(i - j)
    w               w              ReRoPE's window: inside it (i - j < w) positions are exact
    k (leaky_k)     k              Leaky ReRoPE's slope outside the window is 1/k (k > 1); ReRoPE is k -> infinity
    L (train_length) maxlen        the training length of log-n scaling: q_n is multiplied by max(1, log_L n)
    s (scale)       --             NTK-aware scaling's length factor (the source names the method, without formula)

Key identity: (R(i) q) . (R(j) k) = q . R(j - i) k, so RoPE attention depends on i - j only. A relative-position
matrix that is not linear in i - j (ReRoPE) cannot be had from one rotation per row: the source computes the
scores twice (inside and outside the window) and merges them; decoding rotates each cached key instead.
NumPy only (plus the sibling attention.py for the softmax); float64 throughout.
"""
import numpy as np

from .attention import attention_from_scores, resolve_scale

__all__ = ["apply_rope", "ntk_scaled_base", "relative_positions", "rectify", "attention_from_relative_positions",
           "log_n_scale", "rerope_attention", "rerope_decode", "RELATIVE_KINDS"]

RELATIVE_KINDS = ("rope", "pi", "leaky_rerope", "rerope")


def _inv_freq(d, base):
    if d % 2:
        raise ValueError(f"RoPE needs an even head dimension, got d = {d}")
    return float(base) ** (-np.arange(0, d, 2) / d)                     # (d/2,)


def _rotate(x, angle):
    """R x for the rotate-half layout: pair (x_i, x_{i+d/2}) turns by angle_i. angle: (..., d/2) broadcastable."""
    h = x.shape[-1] // 2
    x1, x2, c, s = x[..., :h], x[..., h:], np.cos(angle), np.sin(angle)
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def apply_rope(x, positions, *, base=10000.0):
    """R(p_t) x_t: rotate each row of x by its position; inv_freq_i = base^(-2i/d), rotate-half layout (dim i paired
    with i + d/2).

    Args:
        x (array): (..., T, d), d even.
        positions (array): (T,) or broadcastable to x.shape[:-1]; fractional positions are allowed (position
            interpolation uses them).
        base (float): RoPE's base. Default: 10000.0.
    Returns:
        array: (..., T, d).

    Source: RoPE (arXiv:2104.09864); the layout is the one of GPT-NeoX / LLaMA implementations.
    """
    x = np.asarray(x, dtype=np.float64)
    inv_freq = _inv_freq(x.shape[-1], base)
    pos = np.asarray(positions, dtype=np.float64)
    return _rotate(x, pos[..., None] * inv_freq)                       # (..., T, d)


def ntk_scaled_base(d, scale, *, base=10000.0):
    """base * s^(d / (d - 2)): NTK-aware scaled RoPE is RoPE with this base, for contexts s times the training length.

    Pair i then turns by p * theta_i * s^(-2i / (d - 2)): the fastest pair (i = 0) exactly as in training
    (extrapolation), the slowest (i = d/2 - 1) as under position interpolation by s (p / s), the pairs between by a
    factor in between ("high frequencies extrapolate, low frequencies interpolate"). Use it as
    apply_rope(x, positions, base=ntk_scaled_base(d, s)).

    Args:
        d (int): the even head dimension, >= 4.
        scale (float): s >= 1, the context length over the training length (1 gives base back).
        base (float): RoPE's base. Default: 10000.
    Returns:
        float: the scaled base.

    Source: bloc97's "NTK-aware Scaled RoPE" (reddit.com/r/LocalLLaMA, 2023), which the ReRoPE post
    (https://spaces.ac.cn/archives/9708) names as its predecessor; that post's tables also list "fixed" and "mixed"
    variants from https://spaces.ac.cn/archives/9706, which are not this function.
    """
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 4 or d % 2:
        raise ValueError(f"d must be an even head dimension >= 4, got {d!r}")
    if not np.isfinite(scale) or scale < 1:
        raise ValueError(f"scale must be a finite length factor >= 1, got {scale!r}")
    return float(base) * float(scale) ** (d / (d - 2))


def relative_positions(n, kind, *, window=None, k=None):
    """The (n, n) matrix rel_ij = f(i - j) of the source, for every i, j (causal attention masks j > i).

        "rope":          f(x) = x
        "pi":            f(x) = x / k                      (position interpolation)
        "leaky_rerope":  f(x) = x if x < w else w + (x - w) / k
        "rerope":        f(x) = min(x, w)                  (the k -> infinity limit)

    Args:
        n (int): the number of positions.
        kind (str): one of RELATIVE_KINDS, above.
        window (int or None): w, for "leaky_rerope" and "rerope" (>= 1).
        k (float or None): the slope's divisor, for "pi" (> 0) and "leaky_rerope" (> 1).
    Returns:
        array: (n, n).

    Source: the four matrices of https://spaces.ac.cn/archives/9708 (its PI matrix repeats (L-1)/k in its last
    row; f(x) = x/k is what position interpolation means: see reference/ERRATA.md).
    """
    if kind not in RELATIVE_KINDS:
        raise ValueError(f"kind must be one of {RELATIVE_KINDS}, got {kind!r}")
    if kind in ("leaky_rerope", "rerope") and (window is None or window < 1):
        raise ValueError(f"kind={kind!r} needs window >= 1, got {window}")
    if kind in ("pi", "leaky_rerope") and (k is None or k <= (1 if kind == "leaky_rerope" else 0)):
        raise ValueError(f"kind={kind!r} needs k > {1 if kind == 'leaky_rerope' else 0}, got {k}")
    x = np.subtract.outer(np.arange(n), np.arange(n)).astype(np.float64)   # (n, n) i - j
    if kind == "rope":
        return x
    if kind == "pi":
        return x / k
    return rectify(x, window, leaky_k=k if kind == "leaky_rerope" else None)


def rectify(x, window, *, leaky_k=None):
    """ReRoPE's map of a distance x = i - j: min(x, w); Leaky ReRoPE's: x if x < w else w + (x - w)/k.

    Args:
        x (array): distances, any shape.
        window (int): w.
        leaky_k (float or None): k > 1 for Leaky ReRoPE; None for ReRoPE. Default: None.
    Returns:
        array: x's shape.
    """
    x = np.asarray(x, dtype=np.float64)
    if leaky_k is None:
        return np.minimum(x, window)
    return np.where(x < window, x, window + (x - window) / leaky_k)


def attention_from_relative_positions(q, k, v, rel, *, scale=None, causal=True, base=10000.0):
    """The definition: score_ij = q_i . R(-rel_ij) k_j * scale, then (causal) softmax, times v.

    Builds every rotated key pair by pair: O(T^2 d) memory, meant for checking, not for speed.

    Args:
        q, k (array): (..., T, d), before any rotation.
        v (array): (..., T, dv).
        rel (array): (T, T), the relative position of each (query, key) pair (``relative_positions``).
        scale (float or None): multiplies every score. Default: 1/sqrt(d).
        causal (bool): mask the keys after each query. Default: True.
        base (float): RoPE's base. Default: 10000.0.
    Returns:
        array: (..., T, dv).

    Source: https://spaces.ac.cn/archives/9708 (a_ij = q_i^T R^{j-i} k_j, with j - i replaced by -rel_ij).
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    T, d = q.shape[-2:]
    rel = np.asarray(rel, dtype=np.float64)
    if rel.shape != (T, T):
        raise ValueError(f"rel must have shape ({T}, {T}), got {rel.shape}")
    k_rot = _rotate(k[..., None, :, :], -rel[..., None] * _inv_freq(d, base))   # (..., T_i, T_j, d)
    s = np.einsum("...id,...ijd->...ij", q, k_rot)                             # (..., T, T)
    return attention_from_scores(s * resolve_scale(scale, d), v, causal=causal)


def log_n_scale(positions, train_length):
    """max(1, ln(p + 1) / ln(L)): log-n scaling of the query at 0-based position p (the source's q_n, n = p + 1).

    Args:
        positions (array): 0-based positions p, any shape.
        train_length (float): L >= 2, the training length.
    Returns:
        array: positions' shape.
    """
    if train_length is None or train_length < 2:
        raise ValueError(f"train_length must be >= 2, got {train_length}")
    return np.maximum(1.0, np.log(np.asarray(positions, dtype=np.float64) + 1) / np.log(train_length))


def _check_rerope(q, k, v, window, leaky_k):
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    if q.ndim < 2 or k.shape[:-2] != q.shape[:-2] or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"q (..., Tq, d) and k (..., T, d) disagree: q {q.shape}, k {k.shape}")
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"v must have shape {k.shape[:-1]} + (dv,), got {v.shape}")
    if window is None or window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if leaky_k is not None and not leaky_k > 1:
        raise ValueError(f"leaky_k must be > 1 (None for ReRoPE), got {leaky_k}")
    return q, k, v


def rerope_attention(q, k, v, window, *, leaky_k=None, scale=None, train_length=None, base=10000.0):
    """ReRoPE (leaky_k=None) or Leaky ReRoPE prefill, computed as the source does: two score matrices, merged.

        a1_ij = (R(i) q_i) . (R(j) k_j)                                  (plain RoPE, used where i - j < w)
        a2_ij = (R(w) q_i) . k_j                                         (ReRoPE, used where i - j >= w)
        a2_ij = (R((i - w)/k + w) q_i) . (R(j/k) k_j)                    (Leaky ReRoPE)
    With train_length = L, q_i is first multiplied by max(1, ln(i + 1)/ln L) (log-n scaling). Causal.

    Args:
        q, k (array): (..., T, d), before any rotation, d even.
        v (array): (..., T, dv).
        window (int): w >= 1.
        leaky_k (float or None): k > 1 for Leaky ReRoPE; None for ReRoPE. Default: None.
        scale (float or None): multiplies every score. Default: 1/sqrt(d).
        train_length (float or None): L >= 2 turns on log-n scaling. Default: None.
        base (float): RoPE's base. Default: 10000.0.
    Returns:
        array: (..., T, dv).

    Source: https://spaces.ac.cn/archives/9708, section "计算" (computation).
    """
    q, k, v = _check_rerope(q, k, v, window, leaky_k)
    T, d = q.shape[-2:]
    pos = np.arange(T, dtype=np.float64)
    if train_length is not None:
        q = q * log_n_scale(pos, train_length)[:, None]
    a1 = apply_rope(q, pos, base=base) @ np.swapaxes(apply_rope(k, pos, base=base), -1, -2)  # (..., T, T)
    if leaky_k is None:
        a2 = apply_rope(q, np.full(T, float(window)), base=base) @ np.swapaxes(k, -1, -2)
    else:
        a2 = (apply_rope(q, (pos - window) / leaky_k + window, base=base)
              @ np.swapaxes(apply_rope(k, pos / leaky_k, base=base), -1, -2))
    inside = np.subtract.outer(pos, pos) < window                                         # (T, T)
    s = np.where(inside, a1, a2) * resolve_scale(scale, d)
    return attention_from_scores(s, v, causal=True)


def rerope_decode(q, k_cache, v_cache, window, *, leaky_k=None, scale=None, train_length=None, base=10000.0):
    """One query at position T-1 against T cached keys stored before RoPE, each rotated on the fly:

        score_j = q . R(-rel(T-1-j)) k_j,  rel(x) = min(x, w)  or  x if x < w else w + (x - w)/k  (Leaky)
    The source writes the rotation as R^{max(j-i, -w)} (ReRoPE) and R^{max(j-i, (j-i+w)/k - w)} (Leaky): the same.
    Equals the last row of rerope_attention on the same sequence.

    Args:
        q (array): (..., 1, d), before rotation.
        k_cache (array): (..., T, d), the keys before RoPE, the query's own included.
        v_cache (array): (..., T, dv).
        window, leaky_k, scale, train_length, base: as in ``rerope_attention``.
    Returns:
        array: (..., 1, dv).

    Source: https://spaces.ac.cn/archives/9708.
    """
    q, k, v = _check_rerope(q, k_cache, v_cache, window, leaky_k)
    if q.shape[-2] != 1:
        raise ValueError(f"q must hold one query, shape (..., 1, d), got {q.shape}")
    T, d = k.shape[-2:]
    if train_length is not None:
        q = q * log_n_scale(T - 1, train_length)
    x = (T - 1) - np.arange(T, dtype=np.float64)                                          # (T,) i - j
    k_rot = _rotate(k, -rectify(x, window, leaky_k=leaky_k)[:, None] * _inv_freq(d, base))   # (..., T, d)
    s = q @ np.swapaxes(k_rot, -1, -2) * resolve_scale(scale, d)                              # (..., 1, T)
    return attention_from_scores(s, v, causal=False)
