"""State space models: the continuous SSM, the matrix exponential, three discretizations (ZOH, Euler, bilinear),
the convolution kernel, the recurrence, and Mamba's selective scan.

Glossary (sources: the Mamba/SSM part of the RWKV/Mamba study notes in the source material; Mamba,
arXiv:2312.00752; S4, arXiv:2111.00396). The notes call the state h(t) and the input x(t) in their first
equations, then x and u from the ZOH section on; this file uses x (state) and u (input) throughout, as S4 does.

    code      notes            Mamba paper   meaning
    x         h(t), x_k        h             hidden state, (N,) per channel
    u         x(t), u_k        x             input
    y         y(t)             y             output
    A         A                A             state matrix (N, N); in Mamba diagonal: one row (N,) per channel, (D, N)
    B, C      B, C             B, C          input and output matrices
    D         -                D             skip term y += D u (left out by the notes)
    delta     Delta            Delta         step size; in Mamba one per channel and per token, (batch, D, T)
    A_bar     A-bar            A-bar         discrete state matrix, exp(delta A)
    B_bar     B-bar            B-bar         discrete input matrix
    K         K-bar            K-bar         convolution kernel (C B_bar, C A_bar B_bar, C A_bar^2 B_bar, ...)
    z         z                z             Mamba's gate: the output is multiplied by silu(z)
    N         N, K (Algs.)     N             state size
    D (dim)   P (Algs.)        D             Mamba's channels (inner dim), each an independent SSM
    T         N (Algs.), M     L             sequence length (the notes' Algorithms 1-2 call it N, their kernel M)

Continuous model: x'(t) = A x(t) + B u(t), y(t) = C x(t) + D u(t).
Discrete model:   x_k = A_bar x_{k-1} + B_bar u_k,   y_k = C x_k + D u_k.

Where the notes differ from the math, this file follows the math: the notes write y(t) = C h'(t) (it is C h(t));
their matrix-exponential series sums over i but writes A^k / k!; their Algorithm 1 writes A_bar = Delta (x) A,
which lacks the exponential (A_bar = exp(Delta A)), and B_bar = Delta (x) B, which is Euler's B_bar (what Mamba's
code uses, not the exact ZOH one; `zoh_b=True` below gives the exact one).
NumPy only; float64 throughout.
"""
import math

import numpy as np

__all__ = ["expm", "discretize_zoh", "discretize_zoh_diagonal", "discretize_euler", "discretize_bilinear",
           "ssm_kernel", "causal_convolution", "ssm_recurrence", "selective_scan"]

# Scaling and squaring with a [13/13] Pade approximant (Higham 2005, "The scaling and squaring method for the matrix
# exponential revisited"): for ||X||_1 <= THETA_13 the approximant is exact to double precision (backward error).
THETA_13 = 5.371920351148152
# Pade [m/m] of e^X: p(X) / p(-X), p(X) = sum_j c_j X^j, c_j = (2m - j)! m! / ((2m)! j! (m - j)!).
PADE_13 = [math.factorial(26 - j) * math.factorial(13)
           / (math.factorial(26) * math.factorial(j) * math.factorial(13 - j)) for j in range(14)]


def _array(name, x):
    """x as a float64 array; TypeError naming the argument when it is not a real numeric array."""
    if x is None or isinstance(x, (str, bytes)) or np.iscomplexobj(x):
        raise TypeError(f"{name} must be a real numeric array, got {type(x).__name__}")
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real numeric array, got {type(x).__name__}") from None


def _checked(name, x, shape):
    """x as a float64 array of shape `shape` (None matches any size); ValueError naming the argument otherwise."""
    x = _array(name, x)
    if x.ndim != len(shape) or any(e is not None and e != s for e, s in zip(shape, x.shape)):
        want = "(" + ", ".join("*" if e is None else str(e) for e in shape) + ("," if len(shape) == 1 else "") + ")"
        raise ValueError(f"{name} must have shape {want}, got {x.shape}")
    return x


def _square(name, A):
    A = _array(name, A)
    if A.ndim != 2 or A.shape[0] != A.shape[1] or A.shape[0] == 0:
        raise ValueError(f"{name} must be a square matrix (N, N) with N >= 1, got shape {A.shape}")
    if not np.isfinite(A).all():
        raise ValueError(f"{name} must be finite")
    return A


def _step(delta):
    """delta as a positive finite float (a step size)."""
    d = _array("delta", delta)
    if d.ndim != 0:
        raise ValueError(f"delta must be a scalar, got shape {d.shape}")
    if not (np.isfinite(d) and d > 0):
        raise ValueError(f"delta must be a positive finite step, got {float(d)}")
    return float(d)


def _input_matrix(A, B):
    """B of shape (N,) (one input) or (N, M) (M inputs), N = A's size."""
    B = _array("B", B)
    if B.ndim not in (1, 2) or B.shape[0] != A.shape[0]:
        raise ValueError(f"B must have shape ({A.shape[0]},) or ({A.shape[0]}, M), got {B.shape}")
    if not np.isfinite(B).all():
        raise ValueError("B must be finite")
    return B


def _zoh_input_scale(a, delta):
    """(exp(delta a) - 1) / a, elementwise, = delta where a == 0 (its limit); expm1 keeps it exact for tiny delta a."""
    zero = a == 0
    with np.errstate(over="ignore"):   # exp(delta a) overflows for large positive delta a: so does the true value
        return np.where(zero, delta, np.expm1(delta * a) / np.where(zero, 1.0, a))


def expm(A):
    """e^A = sum_{k>=0} A^k / k!, by scaling and squaring: e^A = r(A / 2^s)^(2^s), r the [13/13] Pade approximant.

    s is the smallest integer with ||A / 2^s||_1 <= THETA_13, so that r is exact to double precision;
    r(X) = q(X)^-1 p(X) with p(X) = sum_j c_j X^j (even part V, odd part U) and q(X) = p(-X) = V - U. Works for any
    square matrix: no eigendecomposition, so defective (Jordan) and stiff matrices are fine.

    Args:
        A (array): (N, N), finite.
    Returns:
        array: e^A, (N, N).

    Source: the series and the diagonal case are in the notes ("matrix exponential"); the algorithm is Higham (2005).
    """
    A = _square("A", A)
    norm = np.linalg.norm(A, 1)
    s = max(0, math.ceil(math.log2(norm / THETA_13))) if norm > 0 else 0
    X = A / 2.0 ** s                                  # (N, N), ||X||_1 <= THETA_13
    power = np.eye(len(A))                            # X^j
    even, odd = np.zeros_like(A), np.zeros_like(A)    # V = sum_{j even} c_j X^j, U = sum_{j odd} c_j X^j
    for j, c in enumerate(PADE_13):
        if j % 2 == 0:
            even += c * power
        else:
            odd += c * power
        power = power @ X
    E = np.linalg.solve(even - odd, even + odd)       # r(X) = (V - U)^-1 (V + U)
    for _ in range(s):
        E = E @ E                                     # e^{2X} = (e^X)^2
    return E


def discretize_zoh(A, B, delta):
    """Zero-order hold: A_bar = e^{delta A}, B_bar = int_0^delta e^{A tau} d tau B, both from one exponential:

        expm([[A, B], [0, 0]] delta) = [[A_bar, B_bar], [0, I]].

    Exact when u is constant over each step. No A^-1: singular A is fine (where A = 0, B_bar = delta B).

    Args:
        A (array): (N, N).
        B (array): (N,) (one input) or (N, M) (M inputs).
        delta (float): the step, > 0.
    Returns:
        (A_bar (N, N), B_bar shaped like B).

    Source: the notes' ZOH section (A_bar = e^{Delta A}, B_bar as an integral, A^-1 (e^{A Delta} - I) B when A is
    invertible); the augmented matrix is Van Loan's (1978) way to compute the integral.
    """
    A = _square("A", A)
    B = _input_matrix(A, B)
    delta = _step(delta)
    B2 = B.reshape(len(A), -1)                        # (N, M)
    N, M = B2.shape
    aug = np.zeros((N + M, N + M))                    # (N + M, N + M)
    aug[:N, :N] = A
    aug[:N, N:] = B2
    E = expm(aug * delta)
    return E[:N, :N], E[:N, N:].reshape(B.shape)


def discretize_zoh_diagonal(a, B, delta):
    """ZOH for diagonal A = diag(a): A_bar = exp(delta a), B_bar = (exp(delta a) - 1) / a * B (delta B where a = 0).

    The division is done with expm1, so B_bar keeps full precision when delta a is tiny (exp(x) - 1 would lose the
    digits of x).

    Args:
        a (array): (N,), the diagonal of A.
        B, delta: as in ``discretize_zoh``.
    Returns:
        (A_bar (N,) (the diagonal), B_bar shaped like B).

    Source: the notes' closed form A^-1 (e^{A Delta} - I) B, with A diagonal; Mamba (arXiv:2312.00752), eq. (4).
    """
    a = _checked("a", a, (None,))
    if not np.isfinite(a).all():
        raise ValueError("a must be finite")
    B = _input_matrix(np.diag(a), B)
    delta = _step(delta)
    scale = _zoh_input_scale(a, delta)                # (N,)
    return np.exp(delta * a), scale.reshape((-1,) + (1,) * (B.ndim - 1)) * B


def discretize_euler(A, B, delta):
    """Forward Euler: A_bar = I + delta A, B_bar = delta B. First order: one step is off by O(delta^2).

    Args:
        A, B, delta: as in ``discretize_zoh``.
    Returns:
        (A_bar (N, N), B_bar shaped like B).

    Source: S4 (arXiv:2111.00396), section 2, for contrast with ZOH and bilinear.
    """
    A = _square("A", A)
    B = _input_matrix(A, B)
    delta = _step(delta)
    return np.eye(len(A)) + delta * A, delta * B


def discretize_bilinear(A, B, delta):
    """Bilinear (Tustin): A_bar = (I - delta/2 A)^-1 (I + delta/2 A), B_bar = (I - delta/2 A)^-1 delta B.

    Second order: one step is off by O(delta^3).

    Args:
        A, B, delta: as in ``discretize_zoh``.
    Returns:
        (A_bar (N, N), B_bar shaped like B).

    Source: S4 (arXiv:2111.00396), eq. (3).
    """
    A = _square("A", A)
    B = _input_matrix(A, B)
    delta = _step(delta)
    half = np.eye(len(A)) - delta / 2 * A             # (N, N)
    return np.linalg.solve(half, np.eye(len(A)) + delta / 2 * A), np.linalg.solve(half, delta * B)


def _as_mimo(B, C, A_size):
    """The single-input single-output form (B (N,), C (N,)) as M = P = 1; checks that B and C match each other."""
    B, C = _array("B_bar", B), _array("C", C)
    if B.ndim == 1 and C.ndim == 1:
        if B.shape != (A_size,) or C.shape != (A_size,):
            raise ValueError(f"B_bar and C must have shape ({A_size},), got {B.shape} and {C.shape}")
        return B[:, None], C[None, :], True
    if B.ndim == 2 and C.ndim == 2:
        if B.shape[0] != A_size or C.shape[1] != A_size:
            raise ValueError(f"B_bar must have shape ({A_size}, M) and C shape (P, {A_size}), "
                             f"got {B.shape} and {C.shape}")
        return B, C, False
    raise ValueError(f"B_bar and C must both be vectors (single input, single output) or both matrices "
                     f"(N, M) and (P, N), got {B.shape} and {C.shape}")


def ssm_kernel(A_bar, B_bar, C, length):
    """K = (C B_bar, C A_bar B_bar, C A_bar^2 B_bar, ..., C A_bar^{L-1} B_bar), K_k = C A_bar^k B_bar.

    With it, y = causal_convolution(K, u) equals the recurrence from a zero state (without D).

    Args:
        A_bar (array): (N, N).
        B_bar (array): (N,) single input, or (N, M).
        C (array): (N,) single output (with B_bar (N,)), or (P, N).
        length (int): L >= 1.
    Returns:
        array: K, (L,) single input/output, else (L, P, M).

    Source: the notes' "recursion" section (their K-bar, M = length); S4 (arXiv:2111.00396), eq. (5).
    """
    A_bar = _square("A_bar", A_bar)
    B_bar, C, siso = _as_mimo(B_bar, C, len(A_bar))
    if int(length) != length or length < 1:
        raise ValueError(f"length must be a positive integer, got {length}")
    K = np.empty((int(length), C.shape[0], B_bar.shape[1]))   # (L, P, M)
    v = B_bar                                                # (N, M): A_bar^k B_bar
    for k in range(int(length)):
        K[k] = C @ v
        v = A_bar @ v
    return K[:, 0, 0] if siso else K


def causal_convolution(K, u):
    """y_k = sum_{j=0}^{min(k, L-1)} K_j u_{k-j}: the causal convolution y = K * u.

    Any L: taps beyond T - 1 never reach an output.

    Args:
        K (array): (L,) single channel, or (L, P, M).
        u (array): (T,) single channel, or (T, M).
    Returns:
        array: y, (T,) single channel, else (T, P).

    Source: the notes' y = x * K-bar (their x is the input); S4, eq. (5).
    """
    K, u = _array("K", K), _array("u", u)
    if K.ndim == 1 and u.ndim == 1:
        return causal_convolution(K[:, None, None], u[:, None])[:, 0]
    if K.ndim != 3 or u.ndim != 2 or K.shape[2] != u.shape[1]:
        raise ValueError(f"K and u must have shapes (L,) and (T,), or (L, P, M) and (T, M), "
                         f"got {K.shape} and {u.shape}")
    T = u.shape[0]
    y = np.zeros((T, K.shape[1]))                            # (T, P)
    for j in range(min(len(K), T)):
        y[j:] += u[:T - j] @ K[j].T                          # lag j: u_{k-j} reaches y_k
    return y


def ssm_recurrence(A_bar, B_bar, C, u, D=None, x0=None):
    """x_k = A_bar x_{k-1} + B_bar u_k, y_k = C x_k + D u_k, from x_{-1} = x0 (zero by default).

    Feeding x_last back as x0 continues the sequence.

    Args:
        A_bar (array): (N, N).
        B_bar, C (array): (N,) and (N,) single input/output, or (N, M) and (P, N).
        u (array): (T,) single input, or (T, M).
        D (array or None): a scalar single input/output, or (P, M). Default: 0.
        x0 (array or None): (N,), the state before the first input. Default: zeros.
    Returns:
        (y (T,) or (T, P), x_last (N,)).

    Source: the notes' discrete recursion x_{k+1} = A_bar x_k + B_bar u_k; S4, eq. (3).
    """
    A_bar = _square("A_bar", A_bar)
    N = len(A_bar)
    B_bar, C, siso = _as_mimo(B_bar, C, N)
    P, M = C.shape[0], B_bar.shape[1]
    u = _checked("u", u, (None,) if siso else (None, M)).reshape(-1, M)    # (T, M)
    D = np.zeros((P, M)) if D is None else _checked("D", D, () if siso else (P, M)).reshape(P, M)
    x = np.zeros(N) if x0 is None else _checked("x0", x0, (N,))
    y = np.empty((len(u), P))                                # (T, P)
    for k in range(len(u)):
        x = A_bar @ x + B_bar @ u[k]                         # (N,)
        y[k] = C @ x + D @ u[k]
    return (y[:, 0] if siso else y), x


# The scan's own activations: the models' copies live in functional.py; these keep this file runnable alone.
def _softplus(x):
    """log(1 + e^x), without overflow."""
    return np.logaddexp(0.0, x)


def _silu(x):
    """x sigmoid(x), sigmoid(x) = e^{-softplus(-x)}: softplus never overflows and keeps full relative precision for
    large negative x."""
    return x * np.exp(-_softplus(-x))


def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, *, delta_softplus=False, state=None,
                   zoh_b=False):
    """Mamba's selective scan, for every batch b, channel d, state index n and token t:

        delta <- softplus(delta + delta_bias)                  (the bias and softplus when asked for)
        x_t = exp(delta_t A) x_{t-1} + B_bar_t u_t             per (b, d, n): A_bar = exp(delta A), diagonal A
        B_bar_t = delta_t B_t                                  Mamba (Euler / "simplified" ZOH for B)
                = (exp(delta_t A) - 1) / A * B_t                exact ZOH when zoh_b (delta_t B_t where A = 0)
        y_t = sum_n C_t x_t + D u_t,   times silu(z_t) when z is given.
    delta must be finite and, after bias and softplus, >= 0.

    Args:
        u (array): (batch, D, T), the input.
        delta (array): (batch, D, T), the step sizes.
        A (array): (D, N), one diagonal state matrix per channel.
        B, C (array): (batch, N, T), shared by all channels, different per token: the "selection".
        D (array or None): (D,), the skip term D u. Default: none.
        z (array or None): (batch, D, T), the gate. Default: none.
        delta_bias (array or None): (D,), added to delta. Default: none.
        delta_softplus (bool): take softplus(delta + delta_bias). Default: False.
        state (array or None): (batch, D, N), the x before the first token. Default: zeros.
        zoh_b (bool): the exact ZOH B_bar instead of Mamba's delta B. Default: False.
    Returns:
        (y (batch, D, T), last_state (batch, D, N)); feed last_state back as state to continue the sequence.

    Source: Mamba (arXiv:2312.00752), Algorithm 2 and section 3, and its reference selective_scan_ref; the notes'
    Algorithm 1 (with the exp that it leaves out of A_bar) and Algorithm 2 (gate y * silu(z)).
    """
    u = _checked("u", u, (None, None, None))
    batch, dim, T = u.shape
    delta = _checked("delta", delta, (batch, dim, T))
    A = _checked("A", A, (dim, None))
    N = A.shape[1]
    B = _checked("B", B, (batch, N, T))
    C = _checked("C", C, (batch, N, T))
    D = None if D is None else _checked("D", D, (dim,))
    z = None if z is None else _checked("z", z, (batch, dim, T))
    delta_bias = None if delta_bias is None else _checked("delta_bias", delta_bias, (dim,))
    state = None if state is None else _checked("state", state, (batch, dim, N))
    for name, x in (("delta", delta), ("A", A), ("delta_bias", delta_bias)):
        if x is not None and not np.isfinite(x).all():
            raise ValueError(f"{name} must be finite")
    if delta_bias is not None:
        delta = delta + delta_bias[:, None]                  # (batch, D, T)
    if delta_softplus:
        delta = _softplus(delta)
    if (delta < 0).any():
        raise ValueError(f"delta must be >= 0 (a step size) after delta_bias and softplus, got min {delta.min()}")
    x = np.zeros((batch, dim, N)) if state is None else state.copy()    # (batch, D, N)
    y = np.empty((batch, dim, T))
    for t in range(T):
        step = delta[:, :, t, None]                                     # (batch, D, 1)
        scale = _zoh_input_scale(A, step) if zoh_b else step            # (batch, D, N) or (batch, D, 1)
        x = np.exp(step * A) * x + scale * B[:, None, :, t] * u[:, :, t, None]
        y[:, :, t] = np.einsum("bdn,bn->bd", x, C[:, :, t])
    if D is not None:
        y = y + D[:, None] * u
    if z is not None:
        y = y * _silu(z)
    return y, x
