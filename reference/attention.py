"""Causal softmax attention, three ways: matrix form, explicit sums, online (streaming) form.

Glossary (source: the "Rwkv attention and the recurrent formulas" section of the Hugging Face RWKV page,
https://huggingface.co/docs/transformers/model_doc/rwkv):

    q, k, v   Q, K, V       queries, keys (..., T, d) and values (..., T, dv); one row per position
    scale     1/sqrt(d)     multiplies every score q_i . k_j
    s         Q K^T scale   the scores, s_ij; causal: only j <= i count
    O         O             the output (..., T, dv)
    m, l      (running)     the online form's running maximum of the scores and running sum of e^{s - m}

The online form is the stable-softmax trick applied while streaming over keys: keep the largest score seen so far,
m, and rescale what was accumulated whenever m grows. RWKV-4's max-tracked WKV (wkv4.py) is the same trick.
FlashAttention (arXiv:2205.14135) computes attention this way in tiles.
NumPy only; float64 throughout.
"""
import numpy as np

__all__ = ["softmax_attention", "attention_from_scores", "attention_sums", "online_softmax_attention", "resolve_scale"]


def _check_qkv(q, k, v):
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    if q.ndim < 2 or q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape (..., T, d), got q {q.shape} and k {k.shape}")
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"v must have shape {k.shape[:-1]} + (dv,), got {v.shape}")
    return q, k, v


def resolve_scale(scale, d):
    """The score scale: 1/sqrt(d) unless given.

    Args:
        scale (float or None): the scale asked for.
        d (int): the head dimension.
    Returns:
        float.
    """
    return 1.0 / np.sqrt(d) if scale is None else float(scale)


def softmax_attention(q, k, v, *, causal=True, scale=None):
    """O = softmax(Q K^T * scale + M) V, with M_ij = -inf for j > i when causal.

    The softmax subtracts each row's maximum before exponentiating, which changes nothing in exact arithmetic and
    keeps e^{s} from overflowing.

    Args:
        q, k (array): (..., T, d).
        v (array): (..., T, dv).
        causal (bool): mask the keys after each query. Default: True.
        scale (float or None): multiplies every score. Default: 1/sqrt(d).
    Returns:
        array: O, (..., T, dv).

    Source: HF RWKV page, first equation of its attention section.
    """
    q, k, v = _check_qkv(q, k, v)
    return attention_from_scores(q @ np.swapaxes(k, -1, -2) * resolve_scale(scale, q.shape[-1]), v, causal=causal)


def attention_from_scores(s, v, *, causal=True):
    """O = softmax(s + M) v for a given score matrix s; when causal, M_ij = -inf where j > i + S - T.

    The T queries are the last T of the S positions (T = S in prefill, T = 1 in decoding), so the causal mask is
    aligned to the bottom right. The row maximum is subtracted before exponentiating (stable softmax). Shared by
    every attention here whose scores are built some other way (RoPE, ReRoPE in rope.py).

    Args:
        s (array): the scores, (..., T, S).
        v (array): (..., S, dv).
        causal (bool): mask the keys after each query. Default: True.
    Returns:
        array: O, (..., T, dv).
    """
    s, v = np.asarray(s, dtype=np.float64), np.asarray(v, dtype=np.float64)
    if s.ndim < 2 or s.shape[-1] != v.shape[-2]:
        raise ValueError(f"s (..., T, S) and v (..., S, dv) disagree on S: s {s.shape}, v {v.shape}")
    if causal:
        T, S = s.shape[-2:]
        s = np.where(np.tril(np.ones((T, S), dtype=bool), k=S - T), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))                  # (..., T, S)
    return (p / p.sum(axis=-1, keepdims=True)) @ v                # (..., T, dv)


def attention_sums(q, k, v, *, scale=None):
    """O_i = sum_{j<=i} e^{s_ij} v_j / sum_{j<=i} e^{s_ij}, s_ij = q_i . k_j * scale: the softmax replaced by its
    value.

    Causal. Deliberately unstabilized, as the source writes it: e^{s_ij} overflows to inf once a score passes ~709,
    and the output becomes NaN.

    Args:
        q, k (array): (..., T, d).
        v (array): (..., T, dv).
        scale (float or None): multiplies every score. Default: 1/sqrt(d).
    Returns:
        array: O, (..., T, dv).

    Source: HF RWKV page, "Replacing the softmax by its value gives".
    """
    q, k, v = _check_qkv(q, k, v)
    c = resolve_scale(scale, q.shape[-1])
    out = np.empty(q.shape[:-1] + v.shape[-1:])
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(q.shape[-2]):
            e = np.exp(np.einsum("...d,...jd->...j", q[..., i, :], k[..., : i + 1, :]) * c)   # (..., i+1)
            out[..., i, :] = np.einsum("...j,...jv->...v", e, v[..., : i + 1, :]) / e.sum(-1, keepdims=True)
    return out


def online_softmax_attention(q, k, v, *, block_size=16, scale=None):
    """Causal attention streamed over key blocks with a running max m and running sum l.

    For each new block of scores s (j <= i only):
        m' = max(m, max_j s_ij)
        l' = e^{m - m'} l + sum_j e^{s_ij - m'}
        a' = e^{m - m'} a + sum_j e^{s_ij - m'} v_j
    and finally O_i = a / l. Every exponent is <= 0, so nothing overflows, whatever the scores.

    Args:
        q, k (array): (..., T, d).
        v (array): (..., T, dv).
        block_size (int): keys per block, >= 1. Default: 16.
        scale (float or None): multiplies every score. Default: 1/sqrt(d).
    Returns:
        array: O, (..., T, dv).

    Source: the stable-softmax note of the HF RWKV page, applied block by block as in FlashAttention
    (arXiv:2205.14135).
    """
    q, k, v = _check_qkv(q, k, v)
    if int(block_size) < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    T, c = q.shape[-2], resolve_scale(scale, q.shape[-1])
    m = np.full(q.shape[:-1], -np.inf)                  # (..., T) running max
    l = np.zeros(q.shape[:-1])                          # (..., T) running sum of e^{s - m}
    acc = np.zeros(q.shape[:-1] + v.shape[-1:])         # (..., T, dv) running sum of e^{s - m} v
    rows = np.arange(T)[:, None]
    for start in range(0, T, block_size):
        cols = np.arange(start, min(start + block_size, T))[None, :]
        s = q @ np.swapaxes(k[..., cols[0], :], -1, -2) * c               # (..., T, blk)
        s = np.where(cols <= rows, s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1))                            # (..., T)
        seen = np.isfinite(m_new)                       # rows with at least one key so far (j <= i)
        alpha = np.where(seen, np.exp(m - np.where(seen, m_new, 0.0)), 0.0)
        p = np.where(seen[..., None], np.exp(s - np.where(seen, m_new, 0.0)[..., None]), 0.0)
        l = alpha * l + p.sum(axis=-1)
        acc = alpha[..., None] * acc + p @ v[..., cols[0], :]
        m = m_new
    return acc / l[..., None]
