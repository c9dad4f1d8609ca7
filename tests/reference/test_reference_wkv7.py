"""reference/wkv7.py: the recurrence, the transition-product definition and the chunked WY form agree; state passing;
the transition matrix of RWKV-7 is stable; the update is a step of online gradient descent; bad input is refused."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from seqmix.kernels.inputs import in_pieces, rwkv7_inputs, split_bounds
from seqmix.kernels.testing import REFERENCE_BUDGET, assert_close
from seqmix.reference.wkv7 import wkv7, wkv7_chunked, wkv7_transition_product


def generic_inputs(rng, B, T, H, N):
    """Any a, b (not RWKV-7's pairing): the formula does not need it. Small a, b keep the state bounded."""
    r, k, v = (rng.standard_normal((B, T, H, N)) for _ in range(3))
    a, b = (rng.standard_normal((B, T, H, N)) / N for _ in range(2))
    return (r, -rng.exponential(0.5, (B, T, H, N)), k, v, a, b), rng.standard_normal((B, H, N, N))


def assert_forms_agree(y, S, y_ref, S_ref, what):
    assert_close(y, y_ref, REFERENCE_BUDGET, f"{what}: y")
    assert_close(S, S_ref, REFERENCE_BUDGET, f"{what}: state")


@pytest.mark.parametrize("B, T, H, N", [(1, 1, 1, 3), (2, 13, 2, 4), (1, 33, 1, 5)])
@pytest.mark.parametrize("decay", ["strong", "weak", "mixed", "growing"])
@pytest.mark.parametrize("state", [False, True])
def test_recurrence_equals_transition_product(rng, B, T, H, N, decay, state):
    x, S0 = rwkv7_inputs(rng, B, T, H, N, decay, state)
    assert_forms_agree(*wkv7_transition_product(*x, state=S0), *wkv7(*x, state=S0), "transition product")


@pytest.mark.parametrize("B, T, H, N", [(1, 1, 1, 3), (2, 13, 2, 4), (1, 33, 1, 5)])
@pytest.mark.parametrize("chunk_size", [1, 3, 16, 64])
@pytest.mark.parametrize("decay", ["strong", "mixed", "growing"])
@pytest.mark.parametrize("state", [False, True])
def test_chunked_equals_recurrence(rng, B, T, H, N, chunk_size, decay, state):
    x, S0 = rwkv7_inputs(rng, B, T, H, N, decay, state)
    assert_forms_agree(*wkv7_chunked(*x, state=S0, chunk_size=chunk_size), *wkv7(*x, state=S0), "chunked")


@pytest.mark.parametrize("chunk_size", [1, 4, 7])
def test_forms_agree_for_any_a_b(rng, chunk_size):
    x, S0 = generic_inputs(rng, 2, 19, 2, 4)
    y, S = wkv7(*x, state=S0)
    assert_forms_agree(*wkv7_transition_product(*x, state=S0), y, S, "transition product")
    assert_forms_agree(*wkv7_chunked(*x, state=S0, chunk_size=chunk_size), y, S, "chunked")


def test_chunked_survives_decays_far_below_float_range(rng):
    """log_w = -1e4 (decay exp(-1e4) = 0 in float64): every exponential of the chunked form is a decay <= 1."""
    x, S0 = rwkv7_inputs(rng, 1, 20, 1, 4, "mixed", state=True)
    x[1][:, 5:9] = -1e4
    y, S = wkv7_chunked(*x, state=S0, chunk_size=16)
    assert np.isfinite(y).all() and np.isfinite(S).all()
    assert_forms_agree(y, S, *wkv7(*x, state=S0), "chunked, decays of 0")


@settings(deadline=None)
@given(T=st.integers(2, 30), cuts=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=3),
       chunk_size=st.sampled_from([1, 4, 16]), seed=st.integers(0, 2**32 - 1))
def test_split_sequence_equals_whole(T, cuts, chunk_size, seed):
    rng = np.random.default_rng(seed)
    x, S0 = rwkv7_inputs(rng, 2, T, 2, 3, "mixed", state=True)
    bounds = split_bounds(T, cuts)
    for form in (wkv7, lambda *x, state: wkv7_chunked(*x, state=state, chunk_size=chunk_size)):
        y_whole, S_whole = form(*x, state=S0)
        ys, S = in_pieces(lambda lo, hi, s: form(*(z[:, lo:hi] for z in x), state=s), bounds, S0)
        assert_forms_agree(np.concatenate(ys, axis=1), S, y_whole, S_whole, f"pieces {bounds}")


def test_rwkv7_transition_matrix_is_stable(rng):
    """P = diag(w) - kk (kk * icl)^T with unit kk, icl in (0, 1)^N, w in (0, 1)^N: every eigenvalue is real and in
    (-1, 1). Why: with D = diag(icl), D^(1/2) P D^(-1/2) = diag(w) - u u^T, u = D^(1/2) kk, is symmetric, and its
    eigenvalues lie between min(w) - |u|^2 > -1 and max(w) < 1 (|u|^2 = sum icl kk^2 < 1)."""
    largest = 0.0
    for _ in range(2000):
        N = int(rng.integers(2, 17))
        kk = rng.standard_normal(N)
        kk /= np.linalg.norm(kk)
        icl, w = rng.uniform(0.0, 1.0, N), np.exp(-np.exp(rng.uniform(-9.0, -0.5, N)))
        eig = np.linalg.eigvals(np.diag(w) + np.outer(-kk, kk * icl))
        assert np.abs(eig.imag).max() < 1e-9, eig
        largest = max(largest, np.abs(eig).max())
    assert largest < 1.0
    # The unit norm matters: a key of norm 1.5 with icl = 1 pushes an eigenvalue below -1.
    kk = 1.5 * np.eye(4)[0]
    assert np.abs(np.linalg.eigvals(np.diag(np.full(4, 0.9)) + np.outer(-kk, kk))).max() > 1.0


@pytest.mark.parametrize("key_scale", ["unit key, target v / eta", "key eta kappa, target v"])
def test_update_is_a_gradient_descent_step(rng, key_scale):
    """With w = 1, a = -kappa, b = eta kappa (|kappa| = 1), one step is S (I - eta kappa kappa^T) + v k^T.
    The gradient of L(S) = 1/2 |S kappa - target|^2 is (S kappa - target) kappa^T, so the step is exactly
        S - eta grad L,  target = v / eta   when k = kappa   (the post's a = -k, b = k eta), or
        S - eta grad L,  target = v         when k = eta kappa (the key scaled by the learning rate too)."""
    N, eta = 6, 0.3
    kappa = rng.standard_normal(N)
    kappa /= np.linalg.norm(kappa)
    v, S0 = rng.standard_normal(N), rng.standard_normal((N, N))
    k, target = (kappa, v / eta) if key_scale.startswith("unit") else (eta * kappa, v)
    step = [z.reshape(1, 1, 1, N) for z in (np.zeros(N), np.zeros(N), k, v, -kappa, eta * kappa)]
    _, S1 = wkv7(*step, state=S0.reshape(1, 1, N, N))

    def loss(S):
        return 0.5 * np.sum((S @ kappa - target) ** 2)

    grad = np.outer(S0 @ kappa - target, kappa)
    # the analytic gradient, checked by central differences (exact for a quadratic up to rounding)
    h, E = 1e-3, np.eye(N * N).reshape(N * N, N, N)
    numeric = np.array([(loss(S0 + h * e) - loss(S0 - h * e)) / (2 * h) for e in E]).reshape(N, N)
    assert_close(numeric, grad, 1e-8, "gradient of L by central differences")
    assert_close(S1[0, 0], S0 - eta * grad, REFERENCE_BUDGET, "one WKV-7 step vs one gradient step")


def test_more_negative_raw_w_forgets_less():
    """The post: "the smaller (more negative) w, the more is forgotten". The decay is exp(-exp(w_raw)), which grows
    towards 1 as w_raw falls: w_raw = -5 keeps e^{-e^{-5}} = 0.993 of the state per step, w_raw = -0.5 keeps 0.545."""
    N, T = 4, 10
    S0 = np.ones((1, 1, N, N))
    zeros = np.zeros((1, T, 1, N))
    kept = {}
    for w_raw in (-5.0, -0.5):
        _, S = wkv7(zeros, np.full((1, T, 1, N), -np.exp(w_raw)), zeros, zeros, zeros, zeros, state=S0)
        assert_close(S, S0 * np.exp(-np.exp(w_raw)) ** T, REFERENCE_BUDGET, "pure decay")
        kept[w_raw] = np.abs(S).sum() / np.abs(S0).sum()
    assert kept[-5.0] > 0.9 > 0.01 > kept[-0.5]


@pytest.mark.parametrize("form", [wkv7, wkv7_transition_product, wkv7_chunked])
def test_bad_input(rng, form):
    (r, log_w, k, v, a, b), S0 = rwkv7_inputs(rng, 1, 5, 2, 3, state=True)
    with pytest.raises(ValueError, match="k must have the shape of r"):
        form(r, log_w, k[:, :4], v, a, b)
    with pytest.raises(ValueError, match=r"r must have shape \(B, T, H, N\)"):
        form(r[0], log_w[0], k[0], v[0], a[0], b[0])
    with pytest.raises(ValueError, match=r"state must have shape \(B, H, N, N\) = \(1, 2, 3, 3\), got \(1, 2, 3, 4\)"):
        form(r, log_w, k, v, a, b, state=np.zeros((1, 2, 3, 4)))
    for bad in (np.nan, np.inf):
        poisoned = log_w.copy()
        poisoned[0, 2, 1, 0] = bad
        with pytest.raises(ValueError, match="log_w must be finite"):
            form(r, poisoned, k, v, a, b)


@pytest.mark.parametrize("form", [wkv7, wkv7_transition_product, wkv7_chunked])
def test_inputs_are_taken_as_float64(rng, form):
    """The reference's one input policy: anything np.asarray turns into float64 is computed in float64."""
    (r, log_w, k, v, a, b), S0 = rwkv7_inputs(rng, 1, 5, 2, 3, state=True)
    v32, S16 = v.astype(np.float32), S0.astype(np.float16)
    y, S = form(r, log_w, k, v32, a, b.tolist(), state=S16)
    y_expected, S_expected = form(r, log_w, k, v32.astype(np.float64), a, b, state=S16.astype(np.float64))
    assert y.dtype == S.dtype == np.float64
    assert_close(y, y_expected, REFERENCE_BUDGET, "y")
    assert_close(S, S_expected, REFERENCE_BUDGET, "state")


def test_bad_chunk_size(rng):
    x, _ = rwkv7_inputs(rng, 1, 5, 1, 3, state=False)
    for bad in (0, -2, 2.5):
        with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
            wkv7_chunked(*x, chunk_size=bad)
