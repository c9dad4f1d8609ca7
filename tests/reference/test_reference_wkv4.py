"""RWKV-4 WKV: definition == N/D recurrence == stable recurrence; the plain one overflows for large keys while
the stable one stays exact; a sequence fed in pieces equals the whole."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqmix.kernels.testing import REFERENCE_BUDGET, assert_close, rel_rms
from seqmix.reference.wkv4 import INITIAL_MAX, wkv4, wkv4_quadratic, wkv4_recurrent


def inputs(rng, B=2, T=11, C=5, key_scale=1.0):
    w = -np.exp(rng.normal(size=C))               # w = -exp(time_decay) < 0
    return w, rng.normal(size=C), rng.normal(size=(B, T, C)) * key_scale, rng.normal(size=(B, T, C))


def log_sum_exp_definition(w, u, k, v):
    """The definition evaluated per (b, t, c) as a softmax over the exponents, with the max subtracted:
    written from the formula, independently of the three forms under test."""
    B, T, C = k.shape
    y = np.empty_like(k)
    for t in range(T):
        z = np.concatenate([(t - 1 - np.arange(t))[None, :, None] * w + k[:, :t], (u + k[:, t])[:, None]], axis=1)
        p = np.exp(z - z.max(axis=1, keepdims=True))                       # (B, t+1, C)
        y[:, t] = (p * v[:, : t + 1]).sum(1) / p.sum(1)
    return y


@pytest.mark.parametrize("T", [1, 2, 11, 40])
def test_three_forms_agree_on_moderate_keys(rng, T):
    w, u, k, v = inputs(rng, T=T, key_scale=3.0)
    expected = wkv4_quadratic(w, u, k, v)
    assert_close(wkv4_recurrent(w, u, k, v)[0], expected, REFERENCE_BUDGET, "N/D recurrence")
    assert_close(wkv4(w, u, k, v)[0], expected, REFERENCE_BUDGET, "stable recurrence")
    assert_close(log_sum_exp_definition(w, u, k, v), expected, REFERENCE_BUDGET, "log-sum-exp definition")


def test_stable_state_is_the_scaled_nd_state(rng):
    """HF's meaning of the state: num = N^ e^{-max}, den = D^ e^{-max}."""
    w, u, k, v = inputs(rng, T=9)
    num, den = wkv4_recurrent(w, u, k, v)[1]
    snum, sden, smax = wkv4(w, u, k, v)[1]
    assert_close(snum * np.exp(smax), num, REFERENCE_BUDGET, "num")
    assert_close(sden * np.exp(smax), den, REFERENCE_BUDGET, "den")


def test_plain_recurrence_overflows_where_the_stable_one_stays_exact(rng):
    w, u, k, v = inputs(rng, T=24, key_scale=1.0)
    k = rng.uniform(-300, 300, size=k.shape)
    k[:, 5] = 800.0                                   # e^800 is inf in float64
    with np.errstate(all="ignore"):
        plain = wkv4_recurrent(w, u, k, v)[0]
    assert not np.isfinite(plain).all()               # inf / inf = NaN from t = 5 on
    stable, (num, den, mx) = wkv4(w, u, k, v)
    assert np.isfinite(stable).all() and np.isfinite(num).all() and np.isfinite(den).all()
    assert_close(stable, log_sum_exp_definition(w, u, k, v), REFERENCE_BUDGET, "stable vs log-sum-exp definition")


def test_output_is_a_convex_combination_of_values(rng):
    w, u, k, v = inputs(rng, T=15, key_scale=50.0)
    y = wkv4(w, u, k, v)[0]
    run_min = np.minimum.accumulate(v, axis=1)
    run_max = np.maximum.accumulate(v, axis=1)
    assert (y >= run_min - 1e-12).all() and (y <= run_max + 1e-12).all()


# The plain recurrence gets small keys (it overflows otherwise); the stable one gets large ones.
@pytest.mark.parametrize("fn,key_scale", [(wkv4_recurrent, 2.0), (wkv4, 100.0)])
@settings(deadline=None)
@given(T=st.integers(2, 30), data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_state_passing_over_random_splits(fn, key_scale, T, data, seed):
    w, u, k, v = inputs(np.random.default_rng(seed), T=T, key_scale=key_scale)
    cuts = sorted(data.draw(st.sets(st.integers(1, T - 1), max_size=4)))
    whole, whole_state = fn(w, u, k, v)
    state, pieces = None, []
    for a, b in zip([0] + cuts, cuts + [T]):
        y, state = fn(w, u, k[:, a:b], v[:, a:b], state)
        pieces.append(y)
    assert_close(np.concatenate(pieces, axis=1), whole, REFERENCE_BUDGET, "pieces")
    for s, ws in zip(state, whole_state):
        assert_close(s, ws, REFERENCE_BUDGET, "final state")


def test_initial_state_follows_hugging_face():
    w, u = -np.ones(3), np.zeros(3)
    k, v = np.zeros((1, 1, 3)), np.ones((1, 1, 3))
    _, (num, den, mx) = wkv4(w, u, k, v)
    # One token from the initial state (0, 0, -1e38): max = k_0, num = v_0, den = 1.
    np.testing.assert_array_equal(mx, 0.0)
    np.testing.assert_array_equal(num, 1.0)
    np.testing.assert_array_equal(den, 1.0)
    assert INITIAL_MAX == -1e38


@pytest.mark.parametrize("change,exc", [
    (lambda a: a.update(w=-a["w"]), ValueError),                   # positive log decay
    (lambda a: a["w"].__setitem__(0, np.nan), ValueError),
    (lambda a: a.update(u=a["u"][:-1]), ValueError),
    (lambda a: a.update(v=a["v"][:, :-1]), ValueError),
    (lambda a: a.update(k=a["k"][0]), ValueError),
    (lambda a: a.update(state=(np.zeros((2, 5)),) * 2), ValueError),   # stable form needs three arrays
    (lambda a: a.update(state=(np.zeros((2, 4)),) * 3), ValueError),
])
def test_bad_input(rng, change, exc):
    args = dict(zip("wukv", inputs(rng)), state=None)
    change(args)
    with pytest.raises(exc):
        wkv4(**args)


def test_source_output_step_as_printed_is_wrong(rng):
    """ERRATA: the HF page writes N_i = e^{u+K_i-q} V_i + e^{M_i} N~_i (and likewise D_i). The two terms then carry
    different scales (e^{-q} and 1), so the ratio is not wkv; with e^{M_i - q} it is."""
    w, u, k, v = inputs(rng, T=6, key_scale=3.0)
    _, (num, den, mx) = wkv4(w, u, k[:, :5], v[:, :5])          # state after 5 tokens: N~, D~, M
    kt, vt = k[:, 5], v[:, 5]
    q = np.maximum(u + kt, mx)
    as_printed = (np.exp(u + kt - q) * vt + np.exp(mx) * num) / (np.exp(u + kt - q) + np.exp(mx) * den)
    corrected = (np.exp(u + kt - q) * vt + np.exp(mx - q) * num) / (np.exp(u + kt - q) + np.exp(mx - q) * den)
    expected = wkv4_quadratic(w, u, k, v)[:, 5]
    assert_close(corrected, expected, REFERENCE_BUDGET, "corrected output step")
    assert rel_rms(as_printed, expected) > 1e-3
