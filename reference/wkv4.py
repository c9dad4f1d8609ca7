"""RWKV-4's WKV operator: the quadratic definition, the numerator/denominator recurrence, the max-tracked recurrence.

Glossary (source: the "Rwkv attention and the recurrent formulas" section of the Hugging Face RWKV page,
https://huggingface.co/docs/transformers/model_doc/rwkv; RWKV paper arXiv:2305.13048):

    k, v        K, V          keys and values, (B, T, C); one decay channel per channel c
    w           w             per-step log decay, (C,); w = -exp(time_decay) <= 0, so a token i steps back is
                              weighted e^{(i-1) w} (the page's W_i = (i-1) w); the RWKV/Mamba study notes write the
                              same weight as e^{-(t-1-i) w} with w >= 0 (see reference/ERRATA.md)
    u           u             the bonus of the current token, (C,) (`time_first`): W_0 = u
    num, den    N^, D^        numerator and denominator of the past, (B, C) (`numerator_state`, `denominator_state`)
    max         M             the running maximum exponent; the stable form keeps N^ e^{-M}, D^ e^{-M}
    y           wkv_t         the output, (B, T, C); RWKV multiplies it by sigmoid(r) afterwards (rwkv4.py)

    wkv_t = (sum_{i<t} e^{(t-1-i) w + k_i} v_i + e^{u + k_t} v_t) / (sum_{i<t} e^{(t-1-i) w + k_i} + e^{u + k_t})

It is softmax attention with scores (t-1-i) w + k_i instead of q_t . k_i; so the max-tracked recurrence is the
online softmax of attention.py, applied one key at a time.
NumPy only; float64 throughout.
"""
import numpy as np

__all__ = ["wkv4_quadratic", "wkv4_recurrent", "wkv4", "INITIAL_MAX"]

# The state's initial maximum. Hugging Face's CPU loop and CUDA kernel start from -1e38 (a finite "minus
# infinity" that keeps e^{M - q} = 0 without inf - inf = NaN); we keep its value so that states are interchangeable.
INITIAL_MAX = -1e38


def _check(w, u, k, v, state, n_state):
    w, u, k, v = (np.asarray(x, dtype=np.float64) for x in (w, u, k, v))
    if k.ndim != 3 or v.shape != k.shape:
        raise ValueError(f"k and v must both have shape (B, T, C), got k {k.shape} and v {v.shape}")
    B, T, C = k.shape
    for name, x in (("w", w), ("u", u)):
        if x.shape != (C,):
            raise ValueError(f"{name} must have shape ({C},), got {x.shape}")
    if np.isnan(w).any() or (w > 0).any():
        raise ValueError("w is the per-step log decay, -exp(time_decay): it must be <= 0 and not NaN")
    if state is not None:
        if len(state) != n_state or any(np.shape(s) != (B, C) for s in state):
            raise ValueError(f"state must be {n_state} arrays of shape ({B}, {C}), got "
                             f"{[np.shape(s) for s in state]}")
        state = tuple(np.array(s, dtype=np.float64) for s in state)
    return w, u, k, v, state


def wkv4_quadratic(w, u, k, v):
    """The definition, summed for every t from scratch: O(T^2) work.

        wkv_t = (sum_{i<t} e^{(t-1-i) w + k_i} v_i + e^{u + k_t} v_t) / (sum_{i<t} e^{(t-1-i) w + k_i} + e^{u + k_t})
    Overflows like the plain recurrence for large keys.

    Args:
        w (array): (C,), the per-step log decay, w = -exp(time_decay) <= 0.
        u (array): (C,), the current token's bonus.
        k, v (array): (B, T, C).
    Returns:
        array: wkv, (B, T, C).

    Source: the HF RWKV page ("the RWKV attention is given by"), with W_0 = u, W_i = (i-1) w.
    """
    w, u, k, v, _ = _check(w, u, k, v, None, 0)
    T = k.shape[1]
    t, i = np.arange(T)[:, None], np.arange(T)[None, :]
    lag = np.where(i < t, t - 1 - i, 0)                                  # (T, T) steps between key i and query t
    z = lag[..., None] * w + k[:, None, :, :]                            # (B, T, T, C) exponent (t-1-i) w + k_i
    z = np.where((i == t)[..., None], u + k[:, None, :, :], z)           # the current token gets u + k_t
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.where((i <= t)[..., None], np.exp(z), 0.0)                # (B, T, T, C), causal
        return (e * v[:, None, :, :]).sum(axis=2) / e.sum(axis=2)


def wkv4_recurrent(w, u, k, v, state=None):
    """The numerator/denominator recurrence, exactly as written:

        wkv_t = (num + e^{u + k_t} v_t) / (den + e^{u + k_t})
        num <- e^w num + e^{k_t} v_t,   den <- e^w den + e^{k_t}
    Overflows (inf, then NaN) once a key passes ~709: on purpose, to show why the stable form exists.

    Args:
        w, u, k, v: as in ``wkv4_quadratic``.
        state (tuple or None): (num, den), each (B, C). Default: zeros.
    Returns:
        (wkv (B, T, C), (num, den)): the output and the state after the last token.

    Source: the HF RWKV page (N^_{j+1} = e^{K_j} V_j + e^w N^_j, and likewise for D^).
    """
    w, u, k, v, state = _check(w, u, k, v, state, 2)
    num, den = state if state is not None else (np.zeros(k.shape[::2]), np.zeros(k.shape[::2]))
    y = np.empty_like(k)
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(k.shape[1]):
            bonus = np.exp(u + k[:, t])                                  # (B, C)
            y[:, t] = (num + bonus * v[:, t]) / (den + bonus)
            num = np.exp(w) * num + np.exp(k[:, t]) * v[:, t]
            den = np.exp(w) * den + np.exp(k[:, t])
    return y, (num, den)


def wkv4(w, u, k, v, state=None):
    """The max-tracked (stable) recurrence. num, den are kept divided by e^{max}; every exponent is <= 0.

        output:  q = max(max, u + k_t);  a = e^{max - q},  b = e^{u + k_t - q}
                 wkv_t = (a num + b v_t) / (a den + b)
        update:  q = max(max + w, k_t);  a = e^{max + w - q},  b = e^{k_t - q}
                 num <- a num + b v_t,  den <- a den + b,  max <- q

    Args:
        w, u, k, v: as in ``wkv4_quadratic``.
        state (tuple or None): (num, den, max), each (B, C), in Hugging Face's order and meaning. Default: (zeros,
            zeros, INITIAL_MAX).
    Returns:
        (wkv (B, T, C), (num, den, max)): the output and the state after the last token.

    Source: the HF RWKV page, last part of its attention section. The page writes the output step as
    e^{u + K_i - q} V_i + e^{M_i} N~_i: the second factor must be e^{M_i - q} (see reference/ERRATA.md).
    """
    w, u, k, v, state = _check(w, u, k, v, state, 3)
    B, T, C = k.shape
    num, den, mx = state if state is not None else (np.zeros((B, C)), np.zeros((B, C)), np.full((B, C), INITIAL_MAX))
    y = np.empty_like(k)
    for t in range(T):
        q = np.maximum(mx, u + k[:, t])
        a, b = np.exp(mx - q), np.exp(u + k[:, t] - q)
        y[:, t] = (a * num + b * v[:, t]) / (a * den + b)
        q = np.maximum(mx + w, k[:, t])
        a, b = np.exp(mx + w - q), np.exp(k[:, t] - q)
        num, den, mx = a * num + b * v[:, t], a * den + b, q
    return y, (num, den, mx)
