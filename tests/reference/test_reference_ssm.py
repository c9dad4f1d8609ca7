"""reference/ssm.py against independent computations: series, eigendecompositions, closed forms, an ODE integrator,
and a plain per-step loop for the selective scan."""
import math

import numpy as np
import pytest

from seqmix.kernels.testing import REFERENCE_BUDGET, assert_close, rel_rms
from seqmix.reference import ssm


def random_stable(rng, n):
    """A random (N, N) matrix whose eigenvalues have real parts in [-2, -0.5] (well-conditioned eigenvectors)."""
    P = np.eye(n) + 0.3 * rng.standard_normal((n, n))
    lam = -rng.uniform(0.5, 2.0, n)
    return P @ np.diag(lam) @ np.linalg.inv(P)


# ---------------------------------------------------------------- matrix exponential

def test_expm_matches_taylor_series_for_small_norm(rng):
    A = rng.standard_normal((5, 5))
    A *= 0.5 / np.linalg.norm(A, 1)
    series, term = np.eye(5), np.eye(5)
    for k in range(1, 30):                       # the terms fall below 1e-40: the sum is exact in float64
        term = term @ A / k
        series = series + term
    assert_close(ssm.expm(A), series, REFERENCE_BUDGET, "expm vs Taylor series")


@pytest.mark.parametrize("kind", ["symmetric", "diagonalizable"])
def test_expm_matches_eigendecomposition(rng, kind):
    M = 2.0 * rng.standard_normal((6, 6))
    if kind == "symmetric":
        A = M + M.T
        lam, V = np.linalg.eigh(A)
        expected = V @ np.diag(np.exp(lam)) @ V.T
    else:
        A = M
        lam, P = np.linalg.eig(A)                # complex pairs: e^A = P e^Lambda P^-1 is real
        expected = (P @ np.diag(np.exp(lam)) @ np.linalg.inv(P)).real
    assert np.linalg.norm(A, 1) > ssm.THETA_13   # so that the squaring phase runs
    assert_close(ssm.expm(A), expected, REFERENCE_BUDGET, f"expm vs eigendecomposition ({kind})")


@pytest.mark.parametrize("lam", [0.0, -3.0, 2.5, -40.0])
@pytest.mark.parametrize("n", [2, 4])
def test_expm_jordan_block(lam, n):
    """A = lambda I + N, N nilpotent (ones above the diagonal): defective, no eigendecomposition exists.
    e^A = e^lambda sum_{k<n} N^k / k!, e.g. e^lambda [[1, 1], [0, 1]] for n = 2."""
    nil = np.eye(n, k=1)
    expected = math.exp(lam) * sum(np.linalg.matrix_power(nil, k) / math.factorial(k) for k in range(n))
    assert_close(ssm.expm(lam * np.eye(n) + nil), expected, REFERENCE_BUDGET, "expm of a Jordan block")


@pytest.mark.parametrize("a, d, b", [(-1.0, -1e4, 100.0), (-1.0, -1e3, 1e3), (1.0, -1e3, 100.0)])
def test_expm_stiff_triangular(a, d, b):
    """exp([[a, b], [0, d]]) = [[e^a, b (e^a - e^d) / (a - d)], [0, e^d]] for a != d.
    Norms up to 1e4 and eigenvalue ratios up to 1e4; beyond, the problem's own conditioning (||A|| times the unit
    roundoff) exceeds 1e-12."""
    expected = np.array([[math.exp(a), b * (math.exp(a) - math.exp(d)) / (a - d)], [0.0, math.exp(d)]])
    assert_close(ssm.expm(np.array([[a, b], [0.0, d]])), expected, REFERENCE_BUDGET, "expm of a stiff matrix")


def test_expm_stiff_rotated(rng):
    """Q diag(lambda) Q^T with eigenvalues from -1 to -1000: e^A = Q diag(e^lambda) Q^T."""
    Q, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    lam = np.array([-1.0, -10.0, -100.0, -1000.0])
    assert_close(ssm.expm(Q @ np.diag(lam) @ Q.T), Q @ np.diag(np.exp(lam)) @ Q.T, REFERENCE_BUDGET,
                 "expm of a rotated stiff matrix")


# ---------------------------------------------------------------- discretization

def rk4_piecewise_constant(A, B, u, delta, substeps, x0):
    """Integrate x' = A x + B u_k over [k delta, (k+1) delta) with classical RK4; the states at the step ends."""
    h = delta / substeps
    x, out = x0.copy(), []
    for uk in u:
        f = lambda x: A @ x + B * uk  # noqa: E731
        for _ in range(substeps):
            k1 = f(x)
            k2 = f(x + h / 2 * k1)
            k3 = f(x + h / 2 * k2)
            k4 = f(x + h * k3)
            x = x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        out.append(x)
    return np.array(out)


def test_zoh_is_exact_for_piecewise_constant_input(rng):
    """ZOH against RK4 with fine steps. RK4's own error is estimated by comparing m and 2m substeps (it shrinks 16x,
    so the 2m run is ~15x closer to the truth than the difference); ZOH must agree with the 2m run to within that
    estimate. Euler's B_bar (with the exact A_bar) fails the same check, so the check can fail."""
    A, B, x0 = random_stable(rng, 4), rng.standard_normal(4), rng.standard_normal(4)
    u, delta = rng.standard_normal(6), 0.3
    A_bar, B_bar = ssm.discretize_zoh(A, B, delta)
    x, zoh = x0, []
    for uk in u:
        x = A_bar @ x + B_bar * uk
        zoh.append(x)
    coarse, fine = (rk4_piecewise_constant(A, B, u, delta, m, x0) for m in (20, 40))
    rk4_error = rel_rms(coarse, fine)
    assert 1e-12 < rk4_error < 1e-7                      # the estimate is resolvable in float64
    assert rel_rms(np.array(zoh), fine) < rk4_error
    x, euler_b = x0, []
    for uk in u:
        x = A_bar @ x + delta * B * uk
        euler_b.append(x)
    assert rel_rms(np.array(euler_b), fine) > 100 * rk4_error


def test_zoh_augmented_equals_closed_form_and_diagonal_form(rng):
    """For invertible A: B_bar = A^-1 (e^{A delta} - I) B; for diagonal A also the expm1 form."""
    A, B, delta = random_stable(rng, 5), rng.standard_normal((5, 2)), 0.7
    A_bar, B_bar = ssm.discretize_zoh(A, B, delta)
    assert_close(A_bar, ssm.expm(delta * A), REFERENCE_BUDGET, "A_bar")
    assert_close(B_bar, np.linalg.solve(A, (ssm.expm(A * delta) - np.eye(5)) @ B), REFERENCE_BUDGET, "B_bar")
    a = -rng.uniform(0.1, 3.0, 5)
    A_bar, B_bar = ssm.discretize_zoh(np.diag(a), B, delta)
    a_bar, b_bar = ssm.discretize_zoh_diagonal(a, B, delta)
    assert_close(np.diag(A_bar), a_bar, REFERENCE_BUDGET, "diagonal A_bar")
    assert_close(A_bar - np.diag(np.diag(A_bar)), np.zeros((5, 5)), REFERENCE_BUDGET, "off-diagonal A_bar")
    assert_close(B_bar, b_bar, REFERENCE_BUDGET, "diagonal B_bar")
    assert_close(b_bar, ((np.exp(delta * a) - 1) / a)[:, None] * B, REFERENCE_BUDGET, "diagonal B_bar, closed form")


def test_zoh_singular_A(rng):
    """A = P diag(0, -1, -2.5) P^-1: along the zero eigenvalue the input integrates, B_bar -> delta B (the limit of
    (e^{lambda delta} - 1) / lambda); A = 0 gives A_bar = I, B_bar = delta B; a diagonal a with zeros likewise."""
    P = np.eye(3) + 0.3 * rng.standard_normal((3, 3))
    lam, B, delta = np.array([0.0, -1.0, -2.5]), rng.standard_normal(3), 0.4
    A_bar, B_bar = ssm.discretize_zoh(P @ np.diag(lam) @ np.linalg.inv(P), B, delta)
    scale = np.array([delta, np.expm1(-delta) / -1.0, np.expm1(-2.5 * delta) / -2.5])
    assert_close(A_bar, P @ np.diag(np.exp(lam * delta)) @ np.linalg.inv(P), REFERENCE_BUDGET, "A_bar")
    assert_close(B_bar, P @ (scale * np.linalg.solve(P, B)), REFERENCE_BUDGET, "B_bar")
    A_bar, B_bar = ssm.discretize_zoh(np.zeros((3, 3)), B, delta)
    assert_close(A_bar, np.eye(3), REFERENCE_BUDGET, "A_bar for A = 0")
    assert_close(B_bar, delta * B, REFERENCE_BUDGET, "B_bar for A = 0")
    a_bar, b_bar = ssm.discretize_zoh_diagonal(lam, B, delta)
    assert_close(b_bar, scale * B, REFERENCE_BUDGET, "diagonal B_bar with a zero")


def test_zoh_diagonal_tiny_delta_a(rng):
    """delta a ~ 1e-12: B_bar against the series delta (1 + x/2 + x^2/6) B, x = delta a (the next term is 1e-48
    relative). The textbook (exp(x) - 1) / a keeps only ~4 digits: exp(x) rounds to 1 + x with an absolute error of
    ~1e-16, i.e. 1e-4 relative to x."""
    delta = 0.1
    a = np.array([-1.0, 2.0, -0.5, 3.0]) * 1e-12 / delta
    B = rng.standard_normal(4)
    x = delta * a
    series = delta * (1 + x / 2 + x ** 2 / 6) * B
    _, b_bar = ssm.discretize_zoh_diagonal(a, B, delta)
    assert_close(b_bar, series, REFERENCE_BUDGET, "expm1 form")
    assert rel_rms((np.exp(x) - 1) / a * B, series) > 1e-6


def one_step_error(method, A, B, delta):
    A_bar, B_bar = method(A, B, delta)
    A_zoh, B_zoh = ssm.discretize_zoh(A, B, delta)
    return np.linalg.norm(A_bar - A_zoh) + np.linalg.norm(B_bar - B_zoh)


def error_at_time_one(method, A, B, delta, x0):
    """The state at t = 1, after 1/delta steps of a unit step input, against ZOH (exact for it)."""
    steps = round(1 / delta)
    u, C = np.ones((steps, 1)), np.eye(len(A))               # C = I: the outputs are the states
    x_method = ssm.ssm_recurrence(*method(A, B, delta), C, u, x0=x0)[0]
    x_zoh = ssm.ssm_recurrence(*ssm.discretize_zoh(A, B, delta), C, u, x0=x0)[0]
    return np.linalg.norm(x_method[-1] - x_zoh[-1])


@pytest.mark.parametrize("method, local_order", [(ssm.discretize_euler, 1), (ssm.discretize_bilinear, 2)])
def test_euler_and_bilinear_converge_to_zoh(rng, method, local_order):
    """Euler is first order and bilinear second: one step differs from ZOH by O(delta^{p+1}) (slope p + 1 on a log-log
    plot), and the accumulated difference at a fixed time t = 1, after 1/delta steps, by O(delta^p) (slope p)."""
    A, B, x0 = random_stable(rng, 4), rng.standard_normal((4, 1)), rng.standard_normal(4)
    deltas = 2.0 ** -np.arange(3, 9)
    one_step = [one_step_error(method, A, B, d) for d in deltas]
    at_time_one = [error_at_time_one(method, A, B, d, x0) for d in deltas]
    assert np.polyfit(np.log(deltas), np.log(one_step), 1)[0] == pytest.approx(local_order + 1, abs=0.1)
    assert np.polyfit(np.log(deltas), np.log(at_time_one), 1)[0] == pytest.approx(local_order, abs=0.1)


# ---------------------------------------------------------------- convolution and recurrence

@pytest.mark.parametrize("mimo", [False, True])
def test_convolution_kernel_equals_recurrence(rng, mimo):
    A_bar, _ = ssm.discretize_zoh(random_stable(rng, 4), np.zeros(4), 0.5)
    B_bar, C = (rng.standard_normal((4, 2)), rng.standard_normal((3, 4))) if mimo else \
        (rng.standard_normal(4), rng.standard_normal(4))
    u = rng.standard_normal((11, 2) if mimo else 11)
    D = rng.standard_normal((3, 2)) if mimo else 0.7
    y, _ = ssm.ssm_recurrence(A_bar, B_bar, C, u, D=D)
    K = ssm.ssm_kernel(A_bar, B_bar, C, 11)
    skip = u @ D.T if mimo else D * u
    assert_close(ssm.causal_convolution(K, u) + skip, y, REFERENCE_BUDGET, "K * u + D u vs recurrence")


def test_causal_convolution_matches_numpy_convolve(rng):
    K, u = rng.standard_normal(5), rng.standard_normal(9)      # a kernel shorter than the input
    assert_close(ssm.causal_convolution(K, u), np.convolve(K, u)[:9], REFERENCE_BUDGET, "causal convolution")


def test_recurrence_with_initial_state_and_split(rng):
    """x0 adds C A_bar^{k+1} x0 to y_k; feeding the sequence in two pieces with the returned state = whole."""
    A_bar = ssm.expm(0.3 * random_stable(rng, 3))
    B_bar, C, u, x0 = rng.standard_normal(3), rng.standard_normal(3), rng.standard_normal(8), rng.standard_normal(3)
    y, x_last = ssm.ssm_recurrence(A_bar, B_bar, C, u, D=0.2, x0=x0)
    free = [C @ np.linalg.matrix_power(A_bar, k + 1) @ x0 for k in range(8)]
    y0, _ = ssm.ssm_recurrence(A_bar, B_bar, C, u, D=0.2)
    assert_close(y, y0 + np.array(free), REFERENCE_BUDGET, "initial state term")
    y1, x1 = ssm.ssm_recurrence(A_bar, B_bar, C, u[:3], D=0.2, x0=x0)
    y2, x2 = ssm.ssm_recurrence(A_bar, B_bar, C, u[3:], D=0.2, x0=x1)
    assert_close(np.concatenate([y1, y2]), y, REFERENCE_BUDGET, "split outputs")
    assert_close(x2, x_last, REFERENCE_BUDGET, "split state")


# ---------------------------------------------------------------- selective scan

def per_step_selective_scan(u, delta, A, B, C, D, z, delta_bias, state, softplus, zoh_b):
    """One channel and one token at a time, with dense matrices: A_bar = expm(delta diag(A_d)) and, for ZOH, B_bar
    from the augmented exponential (discretize_zoh), so nothing is shared with the vectorized expm1 path."""
    batch, dim, T = u.shape
    N = A.shape[1]
    y, last = np.zeros((batch, dim, T)), np.zeros((batch, dim, N))
    for b in range(batch):
        for d in range(dim):
            x = np.zeros(N) if state is None else state[b, d].copy()
            for t in range(T):
                step = delta[b, d, t] + (0.0 if delta_bias is None else delta_bias[d])
                if softplus:
                    step = math.log1p(math.exp(step))
                A_bar = ssm.expm(step * np.diag(A[d]))
                B_bar = ssm.discretize_zoh(np.diag(A[d]), B[b, :, t], step)[1] if zoh_b else step * B[b, :, t]
                x = A_bar @ x + B_bar * u[b, d, t]
                out = C[b, :, t] @ x + (0.0 if D is None else D[d] * u[b, d, t])
                if z is not None:
                    out *= z[b, d, t] / (1 + math.exp(-z[b, d, t]))
                y[b, d, t] = out
            last[b, d] = x
    return y, last


def scan_inputs(rng, batch=2, dim=3, N=4, T=7):
    """Mamba-like inputs: A < 0 with one exact zero (the ZOH limit), positive raw delta."""
    A = -rng.uniform(0.2, 2.0, (dim, N))
    A[0, 1] = 0.0
    return dict(u=rng.standard_normal((batch, dim, T)), delta=rng.uniform(0.05, 1.0, (batch, dim, T)), A=A,
                B=rng.standard_normal((batch, N, T)), C=rng.standard_normal((batch, N, T)))


OPTIONS = {  # name: (D, z, delta_bias, softplus, state, zoh_b)
    "plain": (False, False, False, False, False, False),
    "D": (True, False, False, False, False, False),
    "z": (False, True, False, False, False, False),
    "bias_softplus": (False, False, True, True, False, False),
    "state": (False, False, False, False, True, False),
    "zoh_b": (False, False, False, False, False, True),
    "everything": (True, True, True, True, True, True),
}


@pytest.mark.parametrize("option", list(OPTIONS))
def test_selective_scan_matches_per_step_loop(rng, option):
    use_D, use_z, use_bias, softplus, use_state, zoh_b = OPTIONS[option]
    x = scan_inputs(rng)
    batch, dim, T = x["u"].shape
    N = x["A"].shape[1]
    extra = dict(D=rng.standard_normal(dim) if use_D else None,
                 z=rng.standard_normal((batch, dim, T)) if use_z else None,
                 delta_bias=rng.uniform(-1.0, 0.5, dim) if use_bias else None,
                 state=rng.standard_normal((batch, dim, N)) if use_state else None)
    y, last = ssm.selective_scan(**x, **extra, delta_softplus=softplus, zoh_b=zoh_b)
    y_loop, last_loop = per_step_selective_scan(**x, **extra, softplus=softplus, zoh_b=zoh_b)
    assert_close(y, y_loop, REFERENCE_BUDGET, "y")
    assert_close(last, last_loop, REFERENCE_BUDGET, "last state")


def test_selective_scan_zoh_b_differs_from_euler_b(rng):
    """The two B_bar agree to first order in delta A only: at delta ~ 0.5 they differ visibly."""
    x = scan_inputs(rng)
    assert rel_rms(ssm.selective_scan(**x, zoh_b=True)[0], ssm.selective_scan(**x)[0]) > 1e-2


@pytest.mark.parametrize("zoh_b", [False, True])
def test_selective_scan_split_equals_whole(rng, zoh_b):
    x = scan_inputs(rng, T=9)
    dim = x["A"].shape[0]
    common = dict(A=x["A"], D=rng.standard_normal(dim), delta_bias=rng.standard_normal(dim), delta_softplus=True,
                  zoh_b=zoh_b)
    time_args = {k: x[k] for k in ("u", "delta", "B", "C")}
    time_args["z"] = rng.standard_normal(x["u"].shape)
    y, last = ssm.selective_scan(**time_args, **common)
    state, pieces = None, []
    for sl in (slice(0, 1), slice(1, 5), slice(5, 9)):
        y_piece, state = ssm.selective_scan(**{k: v[..., sl] for k, v in time_args.items()}, **common, state=state)
        pieces.append(y_piece)
    assert_close(np.concatenate(pieces, axis=-1), y, REFERENCE_BUDGET, "split outputs")
    assert_close(state, last, REFERENCE_BUDGET, "split state")


def test_selective_scan_large_delta_forgets_the_past(rng):
    """delta A -> -inf: A_bar underflows to 0 (no NaN), and the state is the last input alone, delta B u."""
    x = scan_inputs(rng)
    x["A"][0, 1] = -1.0
    x["delta"] = np.full_like(x["u"], 1e4)
    _, last = ssm.selective_scan(**x)
    assert_close(last, 1e4 * x["B"][:, None, :, -1] * x["u"][:, :, -1, None], REFERENCE_BUDGET, "state")


# ---------------------------------------------------------------- bad input

I2 = np.eye(2)
SCAN = dict(u=np.ones((1, 2, 3)), delta=np.ones((1, 2, 3)), A=-np.ones((2, 4)), B=np.ones((1, 4, 3)),
            C=np.ones((1, 4, 3)))


@pytest.mark.parametrize("call, error, match", [
    (lambda: ssm.expm(np.ones((2, 3))), ValueError, "A must be a square matrix"),
    (lambda: ssm.expm([[1.0, np.nan], [0.0, 1.0]]), ValueError, "A must be finite"),
    (lambda: ssm.expm("eye"), TypeError, "A must be a real numeric array"),
    (lambda: ssm.expm(I2 * 1j), TypeError, "A must be a real numeric array"),
    (lambda: ssm.discretize_zoh(I2, np.ones(2), 0.0), ValueError, "delta must be a positive"),
    (lambda: ssm.discretize_zoh(I2, np.ones(2), np.nan), ValueError, "delta must be a positive"),
    (lambda: ssm.discretize_zoh(I2, np.ones(2), np.ones(2)), ValueError, "delta must be a scalar"),
    (lambda: ssm.discretize_zoh(I2, np.ones(3), 0.1), ValueError, r"B must have shape \(2,\)"),
    (lambda: ssm.discretize_bilinear(I2, None, 0.1), TypeError, "B must be"),
    (lambda: ssm.discretize_zoh_diagonal(I2, np.ones(2), 0.1), ValueError, r"a must have shape \(\*,\)"),
    (lambda: ssm.ssm_kernel(I2, np.ones(2), np.ones((1, 2)), 4), ValueError, "both be vectors"),
    (lambda: ssm.ssm_kernel(I2, np.ones(2), np.ones(2), 0), ValueError, "length must be a positive"),
    (lambda: ssm.ssm_recurrence(I2, np.ones(2), np.ones(2), np.ones((4, 1))), ValueError, "u must have shape"),
    (lambda: ssm.ssm_recurrence(I2, np.ones((2, 1)), np.ones((1, 2)), np.ones((4, 1)), D=1.0), ValueError,
     r"D must have shape \(1, 1\)"),
    (lambda: ssm.ssm_recurrence(I2, np.ones(2), np.ones(2), np.ones(4), x0=np.ones(3)), ValueError, "x0 must"),
    (lambda: ssm.causal_convolution(np.ones((3, 1, 2)), np.ones((4, 3))), ValueError, "K and u must"),
    (lambda: ssm.selective_scan(**{**SCAN, "delta": np.full((1, 2, 3), np.nan)}), ValueError, "delta must be finite"),
    (lambda: ssm.selective_scan(**{**SCAN, "delta": -np.ones((1, 2, 3))}), ValueError, "delta must be >= 0"),
    (lambda: ssm.selective_scan(**{**SCAN, "delta": np.ones((1, 2, 4))}), ValueError, r"delta must have shape"),
    (lambda: ssm.selective_scan(**{**SCAN, "A": -np.ones((3, 4))}), ValueError, r"A must have shape \(2, \*\)"),
    (lambda: ssm.selective_scan(**{**SCAN, "B": np.ones((1, 4, 2))}), ValueError, r"B must have shape \(1, 4, 3\)"),
    (lambda: ssm.selective_scan(**SCAN, state=np.ones((1, 2, 3))), ValueError, r"state must have shape \(1, 2, 4\)"),
    (lambda: ssm.selective_scan(**SCAN, z=np.ones((2, 3))), ValueError, "z must have shape"),
    (lambda: ssm.selective_scan(**{**SCAN, "u": None}), TypeError, "u must be a real numeric array"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
