"""The family: every sequence mixer here is one recurrence with a different transition G_t, in NumPy float64.

    S_t = S_{t-1} G_t + v_t k_t^T,   y_t = S_t q_t

Glossary (name here -> symbol in the sources):
    B, T, H, N  batch, time, heads, head size (keys, values and queries all have N channels)
    q, k, v     query q_t, key k_t, value v_t                                             (B, T, H, N)
    S           state S_t, (B, H, N, N) indexed [value, key] as in reference/wkv7.py: row i maps a key to value
                channel i, so the transition G_t (N, N) acts on the key side, from the right
    y           output y_t = S_t q_t                                                      (B, T, H, N)

The rungs, each its own short loop below (no scale is applied to q or k inside; the sources' 1/sqrt(N), feature
maps and normalizations are the caller's):
    linear_attention   G_t = I                                   the state only adds
    retention          G_t = gamma I, gamma = exp(log_gamma)     a constant decay per head
    gla                G_t = diag(exp(log_g_t))                  a decay per key channel and step (RWKV-4's, RWKV-6's)
    ssd                G_t = exp(log_a_t) I                      one decay per head and step (Mamba-2)
    delta_rule         G_t = I - beta_t k_t k_t^T, v_t -> beta_t v_t     erase what k_t held, then write
    gated_delta_rule   G_t = alpha_t (I - beta_t k_t k_t^T), v_t -> beta_t v_t
    (wkv7)             G_t = diag(w_t) + a_t b_t^T               RWKV-7: every rung above is a setting of it

`as_wkv7` gives, for each rung, the arguments (r, log_w, k, v, a, b) of reference.wkv7.wkv7 that compute it; the
production op seqmix.kernels.wkv7.wkv7 takes the same arguments, so it runs every rung. Two older mechanisms sit
in the frame with per-channel heads (one head per channel, as many heads as channels): `rwkv4_via_wkv7` (a decay
per channel, a bonus u for the current token and no query) and `selective_scan_via_wkv7` (Mamba: one head of
value size 1 per inner channel d, G_t = diag(exp(delta_t[d] A[d])), k_t = delta_t[d] B_t, q_t = C_t, v_t = u_t[d]).
Softmax attention is the limit the family approximates: its "state" is every key and value so far, (t, N) each,
and it grows with the sequence; every rung here holds N x N numbers per head, whatever T is.

Decays: the log decays (log_gamma, log_g, log_a, log_alpha) take any finite real; 0 is a decay of exactly 1 (the
state keeps everything, as linear attention's), and a decay of 0 is reached by a very negative log decay (-1e4),
as in reference/wkv7.py, which refuses infinities.

Sources: linear attention, Katharopoulos et al. 2020 (arXiv:2006.16236); retention (RetNet), Sun et al. 2023
(arXiv:2307.08621); gated linear attention (GLA), Yang et al. 2023 (arXiv:2312.06635); state space duality (SSD,
Mamba-2), Dao and Gu 2024 (arXiv:2405.21060); the delta rule for linear attention (DeltaNet), Schlag et al. 2021
(arXiv:2102.11174) and Yang et al. 2024 (arXiv:2406.06484); the gated delta rule, Yang et al. 2024
(arXiv:2412.06464); RWKV-7 "Goose" (arXiv:2503.14456) for the diagonal-plus-rank-one transition.
"""
import numpy as np

from .wkv7 import wkv7

__all__ = ["linear_attention", "retention", "gla", "ssd", "delta_rule", "gated_delta_rule", "RUNGS", "as_wkv7",
           "rwkv4_via_wkv7", "selective_scan_via_wkv7"]


def _as_float(name, x):
    """x as a float64 array; a TypeError naming the argument for anything that is not real numbers."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name} must hold real numbers (a float or integer dtype), got dtype {arr.dtype}")
    return arr.astype(np.float64)


def _check(q, k, v, state, **params):
    """q, k, v as float64 (B, T, H, N), each parameter as float64 of its expected shape (given by a function of
    (B, T, H, N)), state (B, H, N, N) or None. Log decays (names starting with log_) must be finite.
    Returns (q, k, v, *params in order, S_0): S_0 a copy of the state, or zeros."""
    q, k, v = _as_float("q", q), _as_float("k", k), _as_float("v", v)
    if q.ndim != 4:
        raise ValueError(f"q must have shape (B, T, H, N), got {q.shape}")
    for name, x in (("k", k), ("v", v)):
        if x.shape != q.shape:
            raise ValueError(f"{name} must have the shape of q {q.shape}, got {x.shape}")
    B, T, H, N = q.shape
    checked = []
    for name, (value, shape_of, layout) in params.items():
        x = _as_float(name, value)
        if x.shape != shape_of(B, T, H, N):
            raise ValueError(f"{name} must have shape {layout} = {shape_of(B, T, H, N)}, got {x.shape}")
        if name.startswith("log_") and not np.isfinite(x).all():
            raise ValueError(f"{name} must be finite, got {np.isnan(x).sum()} NaN and {np.isinf(x).sum()} infinite "
                             "entries (a decay of 0 is reached by a very negative log decay such as -1e4)")
        checked.append(x)
    if state is None:
        S = np.zeros((B, H, N, N))
    else:
        S = _as_float("state", state).copy()
        if S.shape != (B, H, N, N):
            raise ValueError(f"state must have shape (B, H, N, N) = {(B, H, N, N)}, got {S.shape}")
    return (q, k, v, *checked, S)


def _per_head(B, T, H, N):
    return (H,)


def _per_step(B, T, H, N):
    return (B, T, H)


def _per_channel(B, T, H, N):
    return (B, T, H, N)


def _outer(v, k):
    """v k^T for every batch and head: (B, H, N), (B, H, N) -> (B, H, N, N) indexed [value, key]."""
    return v[..., :, None] * k[..., None, :]


def _read(S, q):
    """S q for every batch and head: (B, H, N, N), (B, H, N) -> (B, H, N)."""
    return np.einsum("bhvk,bhk->bhv", S, q)


def linear_attention(q, k, v, state=None):
    """Linear attention, G_t = I:  S_t = S_{t-1} + v_t k_t^T,  y_t = S_t q_t  (= sum_{s<=t} v_s (k_s . q_t)).

    Args:
        q, k, v (array): (B, T, H, N): query, key and value.
        state (array or None): (B, H, N, N) indexed [value, key]. Default: zeros.
    Returns:
        (y (B, T, H, N), state (B, H, N, N)): the output and the state after the last step.

    Source: Katharopoulos et al. 2020, "Transformers are RNNs" (arXiv:2006.16236), eq. 4-6, with the identity as
    feature map and no normalizer.
    """
    q, k, v, S = _check(q, k, v, state)
    y = np.empty(q.shape)
    for t in range(q.shape[1]):
        S = S + _outer(v[:, t], k[:, t])
        y[:, t] = _read(S, q[:, t])
    return y, S


def retention(q, k, v, log_gamma, state=None):
    """Retention, G_t = gamma I with one constant decay per head:  S_t = gamma S_{t-1} + v_t k_t^T,  y_t = S_t q_t.

    Args:
        q, k, v (array): (B, T, H, N): query, key and value.
        log_gamma (array): (H,), the log of each head's decay gamma = exp(log_gamma), finite.
        state (array or None): (B, H, N, N) indexed [value, key]. Default: zeros.
    Returns:
        (y (B, T, H, N), state (B, H, N, N)).

    Source: Sun et al. 2023, "Retentive Network" (arXiv:2307.08621), the recurrent form of retention, without its
    xPos rotation of q and k (a caller can rotate them first).
    """
    q, k, v, log_gamma, S = _check(q, k, v, state, log_gamma=(log_gamma, _per_head, "(H,)"))
    gamma = np.exp(log_gamma)[None, :, None, None]                       # (1, H, 1, 1)
    y = np.empty(q.shape)
    for t in range(q.shape[1]):
        S = gamma * S + _outer(v[:, t], k[:, t])
        y[:, t] = _read(S, q[:, t])
    return y, S


def gla(q, k, v, log_g, state=None):
    """Gated linear attention, G_t = diag(g_t), a decay per key channel and step:
    S_t = S_{t-1} diag(g_t) + v_t k_t^T,  y_t = S_t q_t,  g_t = exp(log_g_t).

    Args:
        q, k, v (array): (B, T, H, N): query, key and value.
        log_g (array): (B, T, H, N), the log of the decay of each key channel at each step, finite.
        state (array or None): (B, H, N, N) indexed [value, key]. Default: zeros.
    Returns:
        (y (B, T, H, N), state (B, H, N, N)).

    Source: Yang et al. 2023, "Gated Linear Attention Transformers with Hardware-Efficient Training"
    (arXiv:2312.06635), eq. 3 (their S is [key, value]; here its transpose).
    """
    q, k, v, log_g, S = _check(q, k, v, state, log_g=(log_g, _per_channel, "(B, T, H, N)"))
    g = np.exp(log_g)
    y = np.empty(q.shape)
    for t in range(q.shape[1]):
        S = S * g[:, t, :, None, :] + _outer(v[:, t], k[:, t])           # column j (key channel j) decays by g_t[j]
        y[:, t] = _read(S, q[:, t])
    return y, S


def ssd(q, k, v, log_a, state=None):
    """State space duality (Mamba-2), G_t = a_t I, one decay per head and step:
    S_t = a_t S_{t-1} + v_t k_t^T,  y_t = S_t q_t,  a_t = exp(log_a_t).

    Mamba-2 names them C (= q), B (= k, with its step size delta folded in), x (= v) and a_t = exp(delta_t A).

    Args:
        q, k, v (array): (B, T, H, N): query (C), key (delta B) and value (x).
        log_a (array): (B, T, H), the log of each head's decay at each step, finite.
        state (array or None): (B, H, N, N) indexed [value, key]. Default: zeros.
    Returns:
        (y (B, T, H, N), state (B, H, N, N)).

    Source: Dao and Gu 2024, "Transformers are SSMs" (arXiv:2405.21060), the SSD recurrence with scalar A_t.
    """
    q, k, v, log_a, S = _check(q, k, v, state, log_a=(log_a, _per_step, "(B, T, H)"))
    a = np.exp(log_a)
    y = np.empty(q.shape)
    for t in range(q.shape[1]):
        S = a[:, t, :, None, None] * S + _outer(v[:, t], k[:, t])
        y[:, t] = _read(S, q[:, t])
    return y, S


def delta_rule(q, k, v, beta, state=None):
    """The delta rule, G_t = I - beta_t k_t k_t^T:
    S_t = S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T = S_{t-1} + beta_t (v_t - S_{t-1} k_t) k_t^T,
    y_t = S_t q_t: replace the value stored under k_t by v_t, at the rate beta_t (one step of gradient descent
    on |S k_t - v_t|^2 / 2 with step size beta_t). Exact replacement needs a unit k_t and beta_t = 1.

    Args:
        q, k, v (array): (B, T, H, N): query, key and value.
        beta (array): (B, T, H), the writing strength of each head at each step (DeltaNet: in (0, 1)).
        state (array or None): (B, H, N, N) indexed [value, key]. Default: zeros.
    Returns:
        (y (B, T, H, N), state (B, H, N, N)).

    Source: Schlag et al. 2021, "Linear Transformers Are Secretly Fast Weight Programmers" (arXiv:2102.11174),
    and Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule over Sequence Length"
    (arXiv:2406.06484), eq. 1.
    """
    q, k, v, beta, S = _check(q, k, v, state, beta=(beta, _per_step, "(B, T, H)"))
    y = np.empty(q.shape)
    for t in range(q.shape[1]):
        kt, bt = k[:, t], beta[:, t, :, None]                            # (B, H, N), (B, H, 1)
        old = _read(S, kt)                                               # S_{t-1} k_t: what k_t reads now
        S = S + _outer(bt * (v[:, t] - old), kt)
        y[:, t] = _read(S, q[:, t])
    return y, S


def gated_delta_rule(q, k, v, log_alpha, beta, state=None):
    """The gated delta rule, G_t = alpha_t (I - beta_t k_t k_t^T):
    S_t = S_{t-1} alpha_t (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,  y_t = S_t q_t,  alpha_t = exp(log_alpha_t):
    decay everything by alpha_t (forget), then the delta rule's replacement (edit).

    Args:
        q, k, v (array): (B, T, H, N): query, key and value.
        log_alpha (array): (B, T, H), the log of each head's decay at each step, finite.
        beta (array): (B, T, H), the writing strength.
        state (array or None): (B, H, N, N) indexed [value, key]. Default: zeros.
    Returns:
        (y (B, T, H, N), state (B, H, N, N)).

    Source: Yang, Kautz and Hatamizadeh 2024, "Gated Delta Networks" (arXiv:2412.06464), eq. 10.
    """
    q, k, v, log_alpha, beta, S = _check(q, k, v, state, log_alpha=(log_alpha, _per_step, "(B, T, H)"),
                                         beta=(beta, _per_step, "(B, T, H)"))
    alpha = np.exp(log_alpha)
    y = np.empty(q.shape)
    for t in range(q.shape[1]):
        kt, bt = k[:, t], beta[:, t, :, None]                            # (B, H, N), (B, H, 1)
        S = alpha[:, t, :, None, None] * S                               # forget: S_{t-1} alpha_t
        S = S - _outer(bt * _read(S, kt), kt) + _outer(bt * v[:, t], kt)   # edit: (I - beta k k^T), + beta v k^T
        y[:, t] = _read(S, q[:, t])
    return y, S


RUNGS = {"linear_attention": linear_attention, "retention": retention, "gla": gla, "ssd": ssd,
         "delta_rule": delta_rule, "gated_delta_rule": gated_delta_rule}


def as_wkv7(rung, q, k, v, *params):
    """The arguments (r, log_w, k, v, a, b) of wkv7 (S_t = S_{t-1} (diag(exp(log_w_t)) + a_t b_t^T) + v_t k_t^T,
    y_t = S_t r_t) that compute the rung ``rung`` called with (q, k, v, *params): the one table of the family.

        rung               log_w                 a        b                      v          r
        linear_attention   0                     0        0                      v          q
        retention          log_gamma (per head)  0        0                      v          q
        gla                log_g                 0        0                      v          q
        ssd                log_a (per head)      0        0                      v          q
        delta_rule         0                     -k       beta k                 beta v     q
        gated_delta_rule   log_alpha (per head)  -k       alpha beta k           beta v     q

    (the gated delta rule: S alpha (I - beta k k^T) = S diag(alpha) + (S (-k)) (alpha beta k)^T.)
    The rest of the family in the same terms, with heads of their own shape:
        RWKV-7             its own arguments: log_w = -exp(w_raw), a = -kk, b = kk * icl       (reference.wkv7)
        RWKV-4             a head per channel, N = 1: log_w = w, k -> e^k, r = e^{-w}, the bonus added outside
                           (rwkv4_via_wkv7)
        Mamba's scan       a head per inner channel, values of size 1: log_w = delta A, k = delta B, r = C, a = b = 0
                           (selective_scan_via_wkv7)
        softmax attention  none: its state, every key and value so far, grows with t

    Args:
        rung (str): a key of RUNGS.
        q, k, v (array): (B, T, H, N).
        *params: the rung's own arguments after v, as its function takes them (log_gamma; log_g; log_a; beta;
            log_alpha, beta).
    Returns:
        (r, log_w, k, v, a, b): six float64 arrays of shape (B, T, H, N), in wkv7's order.
    """
    if rung not in RUNGS:
        raise ValueError(f"rung must be one of {sorted(RUNGS)}, got {rung!r}")
    specs = {"linear_attention": {}, "retention": {"log_gamma": (_per_head, "(H,)")},
             "gla": {"log_g": (_per_channel, "(B, T, H, N)")}, "ssd": {"log_a": (_per_step, "(B, T, H)")},
             "delta_rule": {"beta": (_per_step, "(B, T, H)")},
             "gated_delta_rule": {"log_alpha": (_per_step, "(B, T, H)"), "beta": (_per_step, "(B, T, H)")}}[rung]
    if len(params) != len(specs):
        raise TypeError(f"{rung} takes {len(specs)} argument(s) after v ({', '.join(specs) or 'none'}), "
                        f"got {len(params)}")
    q, k, v, *params, _ = _check(q, k, v, None, **{name: (p, *spec) for (name, spec), p in zip(specs.items(), params)})
    zero = np.zeros(q.shape)
    per_step = lambda x: np.broadcast_to(x[..., None], q.shape).copy()  # (B, T, H) -> (B, T, H, N)
    if rung == "linear_attention":
        return q, zero, k, v, zero, zero
    if rung == "retention":
        return q, np.broadcast_to(params[0][:, None], q.shape).copy(), k, v, zero, zero
    if rung == "gla":
        return q, params[0], k, v, zero, zero
    if rung == "ssd":
        return q, per_step(params[0]), k, v, zero, zero
    if rung == "delta_rule":
        beta = params[0][..., None]
        return q, zero, k, beta * v, -k, beta * k
    log_alpha, beta = params[0][..., None], params[1][..., None]
    return q, per_step(params[0]), k, beta * v, -k, np.exp(log_alpha) * beta * k


def rwkv4_via_wkv7(w, u, k, v):
    """RWKV-4's WKV as a member of the family, computed by wkv7: one head per channel c (H = C, N = 1), the
    decay G = e^{w_c} and the key e^{k_t[c]}, with no query; the output reads the state before this step's write
    plus the bonus e^{u + k_t} v_t:
        num_t = S_{t-1} + e^{u + k_t} v_t,  S_t = e^w S_{t-1} + e^{k_t} v_t,   (den: the same with v = 1)
        y_t = num_t / den_t.
    wkv7 reads S_t, so r = e^{-w} gives S_{t-1} + e^{-w} e^{k_t} v_t, and the bonus term adds the rest:
    num_t = e^{-w} S_t + (e^u - e^{-w}) e^{k_t} v_t.

    Unstabilized (exp(k) overflows for large k, as reference.wkv4.wkv4_recurrent): for showing the frame.

    Args:
        w, u (array): (C,), the per-step log decay (<= 0) and the bonus.
        k, v (array): (B, T, C).
    Returns:
        y (B, T, C), as reference.wkv4.wkv4's output.

    Source: the WKV of the RWKV-4 paper, Peng et al. 2023 (arXiv:2305.13048), eq. 14-16.
    """
    w, u, k, v = (_as_float(name, x) for name, x in (("w", w), ("u", u), ("k", k), ("v", v)))
    if k.ndim != 3 or v.shape != k.shape:
        raise ValueError(f"k and v must have one shape (B, T, C), got {k.shape} and {v.shape}")
    B, T, C = k.shape
    for name, x in (("w", w), ("u", u)):
        if x.shape != (C,):
            raise ValueError(f"{name} must have shape (C,) = {(C,)}, got {x.shape}")
    heads = lambda x: np.broadcast_to(x, (B, T, C))[..., None]         # (B, T, C) -> (B, T, H = C, N = 1)
    ek, zero = np.exp(k), np.zeros((B, T, C, 1))
    r = heads(np.exp(-w))
    bonus = (np.exp(u) - np.exp(-w)) * ek                                # (B, T, C)
    num = wkv7(r, heads(w), heads(ek), heads(v), zero, zero)[0][..., 0] + bonus * v
    den = wkv7(r, heads(w), heads(ek), heads(np.ones(C)), zero, zero)[0][..., 0] + bonus
    return num / den


def selective_scan_via_wkv7(u, delta, A, B, C, D=None):
    """Mamba's selective scan as a member of the family, computed by wkv7: one head per inner channel d (H = D),
    keys of size N (the state size), a value of size 1 (padded to N with zeros, as wkv7 takes square states):
        h_t[d] = h_{t-1}[d] diag(exp(delta_t[d] A[d])) + u_t[d] (delta_t[d] B_t)^T,   y_t[d] = h_t[d] C_t
    so G_t = diag(exp(delta_t[d] A[d])), k_t = delta_t[d] B_t, v_t = u_t[d], q_t = C_t (the SSD reading).

    Args:
        u, delta (array): (batch, D, T) in Mamba's layout (delta after any bias and softplus).
        A (array): (D, N). B, C (array): (batch, N, T). D (array or None): (D,), the skip term D u.
    Returns:
        y (batch, D, T), as reference.ssm.selective_scan's output (Mamba's B_bar = delta B, no z gate).

    Source: Gu and Dao 2023, "Mamba" (arXiv:2312.00752), Algorithm 2; the SSD reading of Dao and Gu 2024
    (arXiv:2405.21060).
    """
    u, delta, A, B, C = (_as_float(name, x) for name, x in (("u", u), ("delta", delta), ("A", A), ("B", B),
                                                              ("C", C)))
    if u.ndim != 3 or delta.shape != u.shape:
        raise ValueError(f"u and delta must have one shape (batch, D, T), got {u.shape} and {delta.shape}")
    batch, dim, T = u.shape
    if A.ndim != 2 or A.shape[0] != dim:
        raise ValueError(f"A must have shape (D, N) with D = {dim}, got {A.shape}")
    N = A.shape[1]
    for name, x in (("B", B), ("C", C)):
        if x.shape != (batch, N, T):
            raise ValueError(f"{name} must have shape (batch, N, T) = {(batch, N, T)}, got {x.shape}")
    dt = delta.transpose(0, 2, 1)[..., None]                             # (batch, T, D, 1)
    log_w = dt * A                                                       # (batch, T, D, N)
    k = dt * B.transpose(0, 2, 1)[:, :, None, :]                         # delta_t[d] B_t, (batch, T, D, N)
    r = np.broadcast_to(C.transpose(0, 2, 1)[:, :, None, :], k.shape)    # C_t for every head
    v = np.zeros(k.shape)
    v[..., 0] = u.transpose(0, 2, 1)                                     # the value, padded to N
    zero = np.zeros(k.shape)
    y = wkv7(r, log_w, k, v, zero, zero)[0][..., 0].transpose(0, 2, 1)  # (batch, D, T)
    if D is None:
        return y
    D = _as_float("D", D)
    if D.shape != (dim,):
        raise ValueError(f"D must have shape (D,) = {(dim,)}, got {D.shape}")
    return y + D[:, None] * u
