"""RWKV-7 WKV ("generalized delta rule"): one recurrence computed three ways, in NumPy float64.

Glossary (name here -> symbol in the sources):
    B, T, H, N  batch, time, heads, head size (keys and values both have N channels)
    r           receptance r_t, the query read out of the state                       (B, T, H, N)
    log_w       log of the per-key decay: the decay is w_t = exp(log_w_t), the diagonal of diag(w_t).
                BlinkDL's code passes a raw w and decays by exp(-exp(w)), so log_w = -exp(w_raw) <= 0;
                in RWKV-7 w_raw < -0.5, so the decay lies in (exp(-exp(-0.5)), 1) = (0.545.., 1)  (B, T, H, N)
    k, v        key k_t and value v_t                                                  (B, T, H, N)
    a, b        the rank-one correction a_t b_t^T; RWKV-7 passes a = -kk, b = kk * icl, where kk is the
                unit-norm key and icl the in-context learning rate in (0, 1) (`a` in BlinkDL's code)  (B, T, H, N)
    S           state S_t, (B, H, N, N) indexed [value, key]: row i maps a key to value channel i
    P_t         transition matrix diag(w_t) + a_t b_t^T, (N, N)
    y           output y_t = S_t r_t                                                    (B, T, H, N)
  chunked form only:
    L           chunk length; c the cumulative log decay inside a chunk, c_i = log_w_1 + ... + log_w_i
    A_ab, A_ak  strictly lower-triangular (L, L) couplings of a_i with the b_j, k_j before it
    Q_rb, Q_rk  lower-triangular (L, L) couplings of r_i with the b_j, k_j up to it
    W, U0       solutions of the in-chunk triangular system (the UT transform); W gives the WY form of the
                chunk's transition product P_1 ... P_L = diag(exp(c_L)) + W^T (b_j * exp(c_L - c_j))_j

The recurrence (column vectors; the post writes the same with row vectors, S a^T b + v^T k):
    S_t = S_{t-1} diag(w_t) + (S_{t-1} a_t) b_t^T + v_t k_t^T,   y_t = S_t r_t

Sources: the RWKV-7 architecture post https://www.cnblogs.com/Ctrl-cCtrl-v/p/18906192 (state update, the
meaning of a = -kk and b = kk * icl, w = exp(-exp(w_raw))), and the RWKV-7 "Goose" paper arXiv:2503.14456
(the generalized delta rule and its chunked form).
"""
import numpy as np

__all__ = ["wkv7", "wkv7_transition_product", "wkv7_chunked"]


def _check_inputs(r, log_w, k, v, a, b, state):
    """The six inputs as float64 arrays of one shape (B, T, H, N), state (B, H, N, N) or None; log_w finite.
    Returns them in that order, state last."""
    named = {name: np.asarray(x, dtype=np.float64) for name, x in dict(r=r, log_w=log_w, k=k, v=v, a=a, b=b).items()}
    r, log_w = named["r"], named["log_w"]
    state = None if state is None else np.asarray(state, dtype=np.float64)
    if r.ndim != 4:
        raise ValueError(f"r must have shape (B, T, H, N), got {r.shape}")
    for name in ("log_w", "k", "v", "a", "b"):
        if named[name].shape != r.shape:
            raise ValueError(f"{name} must have the shape of r {r.shape}, got {named[name].shape}")
    B, T, H, N = r.shape
    if state is not None and state.shape != (B, H, N, N):
        raise ValueError(f"state must have shape (B, H, N, N) = {(B, H, N, N)}, got {state.shape}")
    if not np.isfinite(log_w).all():
        raise ValueError(f"log_w must be finite, got {np.isnan(log_w).sum()} NaN and {np.isinf(log_w).sum()} infinite "
                         "entries (a decay exp(log_w) of 0 is reached by a very negative log_w such as -1e4)")
    return (*named.values(), state)


def _initial_state(state, B, H, N):
    return np.zeros((B, H, N, N)) if state is None else state.copy()


def wkv7(r, log_w, k, v, a, b, state=None):
    """S_t = S_{t-1} diag(exp(log_w_t)) + (S_{t-1} a_t) b_t^T + v_t k_t^T,  y_t = S_t r_t,  one step at a time.

    log_w may be any finite real (the formula is defined for all: log_w > 0 makes the state grow); RWKV-7 feeds
    log_w = -exp(w_raw) < 0, so the decays exp(log_w) lie in (0, 1). NaN or infinity in log_w raises ValueError.

    Args:
        r, k, v, a, b (array): (B, T, H, N): receptance, key, value and the rank-one correction a b^T.
        log_w (array): (B, T, H, N), the log of the per-key decay.
        state (array or None): (B, H, N, N) indexed [value, key]. Default: zeros.
    Returns:
        (y (B, T, H, N), state (B, H, N, N)): the output and the state after the last step.

    Source: the state update of the RWKV-7 post (S_t = S_{t-1} diag(w_t) + S_{t-1} a_t^T b_t + v_t^T k_t in its
    row-vector notation) and arXiv:2503.14456, section 4.
    """
    r, log_w, k, v, a, b, state = _check_inputs(r, log_w, k, v, a, b, state)
    B, T, H, N = r.shape
    S = _initial_state(state, B, H, N)                                   # (B, H, N, N)
    w = np.exp(log_w)                                                    # (B, T, H, N)
    y = np.empty((B, T, H, N))
    for t in range(T):
        Sa = np.einsum("bhvk,bhk->bhv", S, a[:, t])                     # (B, H, N) = S_{t-1} a_t
        S = (S * w[:, t, :, None, :]                                     # decay each key column
             + Sa[..., None] * b[:, t, :, None, :]                       # (S a) b^T
             + v[:, t, :, :, None] * k[:, t, :, None, :])                # v k^T
        y[:, t] = np.einsum("bhvk,bhk->bhv", S, r[:, t])                # (B, H, N) = S_t r_t
    return y, S


def wkv7_transition_product(r, log_w, k, v, a, b, state=None):
    """S_t = S_0 P_1 ... P_t + sum_{s=1..t} v_s k_s^T P_{s+1} ... P_t,  P_s = diag(exp(log_w_s)) + a_s b_s^T,
    y_t = S_t r_t: the closed form of the recurrence, no state carried from step to step.

    Costs O(T^2) matrix products: for checking, not for use.

    Args:
        r, log_w, k, v, a, b, state: as in ``wkv7``.
    Returns:
        (y (B, T, H, N), state (B, H, N, N)), as ``wkv7``.

    Source: unrolling the recurrence of the RWKV-7 post; arXiv:2503.14456 writes the same product of
    transition matrices diag(w_t) + a_t b_t^T.
    """
    r, log_w, k, v, a, b, state = _check_inputs(r, log_w, k, v, a, b, state)
    B, T, H, N = r.shape
    S0 = _initial_state(state, B, H, N)                                  # (B, H, N, N)
    P = np.zeros((B, T, H, N, N))
    P[..., np.arange(N), np.arange(N)] = np.exp(log_w)                  # diag(w_s)
    P += a[..., :, None] * b[..., None, :]                               # + a_s b_s^T, (B, T, H, N, N)
    vk = v[..., :, None] * k[..., None, :]                               # v_s k_s^T, (B, T, H, N, N)
    y = np.empty((B, T, H, N))
    S = S0                                                               # the result when T = 0
    for t in range(T):
        tail = np.broadcast_to(np.eye(N), (B, H, N, N))                  # P_{s+1} ... P_t, empty for s = t
        S = np.zeros((B, H, N, N))
        for s in range(t, -1, -1):
            S = S + vk[:, s] @ tail
            tail = P[:, s] @ tail                                        # now P_s ... P_t
        S = S + S0 @ tail                                                # tail = P_1 ... P_t
        y[:, t] = np.einsum("bhvk,bhk->bhv", S, r[:, t])
    return y, S


def _pair_decay(log_w):
    """exp(sum of log_w over steps j+1 .. i) for j <= i, else 0: (B, H, L, L, N) from log_w (B, H, L, N). Each
    exponent sums its own steps: as a difference of two cumulative sums (c_i - c_j) it would cancel, and one decay
    of e^-1e4 early in a chunk would leave errors of 1e4 eps in every later pair."""
    L = log_w.shape[2]
    i, j, m = np.ogrid[:L, :L, :L]
    in_segment = ((j < m) & (m <= i)).astype(log_w.dtype)                         # (L, L, L): steps of pair (i, j)
    below = np.tril(np.ones((L, L), dtype=bool))[:, :, None]                       # (L, L, 1)
    exponent = np.einsum("ijm,bhmn->bhijn", in_segment, log_w)                     # (B, H, L, L, N)
    return np.exp(np.where(below, exponent, -np.inf))


def _forward_substitution(A, rhs):
    """X with (I - A) X = rhs for strictly lower-triangular A (B, H, L, L): X_i = rhs_i + sum_{j<i} A_ij X_j."""
    X = rhs.copy()                                                       # (B, H, L, M)
    for i in range(1, A.shape[2]):
        X[:, :, i] += np.einsum("bhj,bhjm->bhm", A[:, :, i, :i], X[:, :, :i])
    return X


def wkv7_chunked(r, log_w, k, v, a, b, state=None, *, chunk_size=16):
    """The chunked (WY / UT-transform) form of `wkv7`. Inside a chunk of L steps, with S_0 the state entering it,
    c_i = log_w_1 + ... + log_w_i and u_i = S_{i-1} a_i:
        S_i = S_0 diag(e^{c_i}) + sum_{j<=i} (u_j b_j^T + v_j k_j^T) diag(e^{c_i - c_j})
        u_i = S_0 (a_i e^{c_{i-1}}) + sum_{j<i} A_ab[i,j] u_j + A_ak[i,j] v_j,
            A_xy[i,j] = sum_n x_i[n] y_j[n] e^{c_{i-1}[n] - c_j[n]}  (j < i)
    which is the unit lower-triangular system (I - A_ab) U = A~ S_0^T + A_ak V. Solving it for the two parts,
    (I - A_ab) [W | U0] = [A~ | A_ak V] (forward substitution), gives U = W S_0^T + U0 and
        S_L = S_0 M + U0^T B^ + V^T K^,   M = diag(e^{c_L}) + W^T B^ = P_1 ... P_L  (the WY form),
        Y   = (R~ + Q_rb W) S_0^T + Q_rb U0 + Q_rk V,   Q_xy[i,j] = sum_n x_i[n] y_j[n] e^{c_i[n] - c_j[n]} (j <= i)
    where A~_i = a_i e^{c_{i-1}}, R~_i = r_i e^{c_i}, B^_j = b_j e^{c_L - c_j}, K^_j = k_j e^{c_L - c_j}.
    Every exponent is a decay from a later step back to an earlier one (<= 0 when log_w <= 0): nothing overflows.

    Args:
        r, log_w, k, v, a, b, state: as in ``wkv7``.
        chunk_size (int): L >= 1; T need not be a multiple of it (the last chunk is short). Default: 16.
    Returns:
        (y (B, T, H, N), state (B, H, N, N)), as ``wkv7``.

    Source: the chunked form of the generalized delta rule, arXiv:2503.14456 (which follows the WY
    representation used by DeltaNet kernels); derived here from the recurrence.
    """
    r, log_w, k, v, a, b, state = _check_inputs(r, log_w, k, v, a, b, state)
    B, T, H, N = r.shape
    if not (isinstance(chunk_size, (int, np.integer)) and chunk_size >= 1):
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    S = _initial_state(state, B, H, N)                                   # (B, H, N, N)
    y = np.empty((B, T, H, N))
    for start in range(0, T, chunk_size):
        rc, lwc, kc, vc, ac, bc = (x[:, start:start + chunk_size].transpose(0, 2, 1, 3)
                                   for x in (r, log_w, k, v, a, b))      # (B, H, L, N) each
        c = np.cumsum(lwc, axis=2)                                       # c_i, (B, H, L, N)
        c_prev = np.concatenate([np.zeros_like(c[:, :, :1]), c[:, :, :-1]], axis=2)  # c_{i-1}, c_0 = 0
        c_last = c[:, :, -1:]                                            # c_L, (B, H, 1, N)
        D_incl = _pair_decay(lwc)                                        # e^{c_i - c_j}, (B, H, L, L, N)
        D_strict = np.concatenate([np.zeros_like(D_incl[:, :, :1]), D_incl[:, :, :-1]], axis=2)  # e^{c_{i-1} - c_j}
        A_ab = np.einsum("bhin,bhijn,bhjn->bhij", ac, D_strict, bc)     # (B, H, L, L)
        A_ak = np.einsum("bhin,bhijn,bhjn->bhij", ac, D_strict, kc)     # (B, H, L, L)
        Q_rb = np.einsum("bhin,bhijn,bhjn->bhij", rc, D_incl, bc)       # (B, H, L, L)
        Q_rk = np.einsum("bhin,bhijn,bhjn->bhij", rc, D_incl, kc)       # (B, H, L, L)
        rhs = np.concatenate([ac * np.exp(c_prev), A_ak @ vc], axis=-1)  # [A~ | A_ak V], (B, H, L, 2N)
        X = _forward_substitution(A_ab, rhs)                             # (B, H, L, 2N)
        W, U0 = X[..., :N], X[..., N:]                                   # (B, H, L, N) each
        decay_to_end = D_incl[:, :, -1]                                  # e^{c_L - c_j}, (B, H, L, N)
        b_hat, k_hat = bc * decay_to_end, kc * decay_to_end              # (B, H, L, N) each
        r_tilde = rc * np.exp(c)                                         # (B, H, L, N)
        y_chunk = ((r_tilde + Q_rb @ W) @ S.transpose(0, 1, 3, 2)       # (B, H, L, N)
                   + Q_rb @ U0 + Q_rk @ vc)
        y[:, start:start + chunk_size] = y_chunk.transpose(0, 2, 1, 3)
        M = np.exp(c_last[:, :, 0])[..., None] * np.eye(N) + W.transpose(0, 1, 3, 2) @ b_hat   # (B, H, N, N)
        S = S @ M + U0.transpose(0, 1, 3, 2) @ b_hat + vc.transpose(0, 1, 3, 2) @ k_hat   # (B, H, N, N)
    return y, S
