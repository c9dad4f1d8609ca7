"""reference/family.py: each rung's loop against the frame written with explicit (N, N) transition matrices, against
reference.wkv7 through `as_wkv7` and against the quadratic (attention-like) form where the rung has one; the state
carried across a split sequence; RWKV-4 and Mamba's scan placed in the frame against their own references; what
each rung can and cannot store; bad input refused by name."""
import numpy as np
import pytest

from helpers.family_inputs import rung_inputs
from seqmix.kernels.inputs import split_bounds
from seqmix.kernels.testing import REFERENCE_BUDGET, assert_close
from seqmix.kernels.inputs import scan_inputs
from seqmix.reference import family
from seqmix.reference.ssm import selective_scan
from seqmix.reference.wkv4 import wkv4
from seqmix.reference.wkv7 import wkv7


def explicit_transitions(rung, k, params):
    """G_t as (B, T, H, N, N) matrices and the factor c_t (B, T, H, 1) that scales v_t, written from the frame's
    definitions (not from the rungs' code): S_t = S_{t-1} G_t + c_t v_t k_t^T."""
    B, T, H, N = k.shape
    eye = np.broadcast_to(np.eye(N), (B, T, H, N, N))
    kk = k[..., :, None] * k[..., None, :]                               # k k^T
    one = np.ones((B, T, H, 1))
    if rung == "linear_attention":
        return eye, one
    if rung == "retention":
        return np.exp(params[0])[:, None, None] * eye, one
    if rung == "gla":
        return np.exp(params[0])[..., None, :] * eye, one                # diag(g_t)
    if rung == "ssd":
        return np.exp(params[0])[..., None, None] * eye, one
    if rung == "delta_rule":
        beta = params[0][..., None, None]
        return eye - beta * kk, params[0][..., None]
    alpha, beta = np.exp(params[0])[..., None, None], params[1][..., None, None]
    return alpha * (eye - beta * kk), params[1][..., None]


def frame(q, k, v, G, c, S0):
    """S_t = S_{t-1} G_t + c_t v_t k_t^T, y_t = S_t q_t with matrix products, one (batch, head) at a time."""
    B, T, H, N = q.shape
    S = np.zeros((B, H, N, N)) if S0 is None else S0.copy()
    y = np.empty(q.shape)
    for b in range(B):
        for h in range(H):
            for t in range(T):
                S[b, h] = S[b, h] @ G[b, t, h] + c[b, t, h] * np.outer(v[b, t, h], k[b, t, h])
                y[b, t, h] = S[b, h] @ q[b, t, h]
    return y, S


def assert_same(got, want, what):
    assert_close(got[0], want[0], REFERENCE_BUDGET, f"{what}: y")
    assert_close(got[1], want[1], REFERENCE_BUDGET, f"{what}: state")


@pytest.mark.parametrize("rung", sorted(family.RUNGS))
@pytest.mark.parametrize("with_state", [False, True])
def test_rung_is_the_frame_with_its_transition(rng, rung, with_state):
    q, k, v, params, S0 = rung_inputs(rng, rung, state=with_state)
    got = family.RUNGS[rung](q, k, v, *params, state=S0)
    assert_same(got, frame(q, k, v, *explicit_transitions(rung, k, params), S0), rung)


@pytest.mark.parametrize("rung", sorted(family.RUNGS))
def test_rung_is_a_setting_of_wkv7(rng, rung):
    q, k, v, params, S0 = rung_inputs(rng, rung)
    args = family.as_wkv7(rung, q, k, v, *params)
    assert len(args) == 6 and all(x.shape == q.shape and x.dtype == np.float64 for x in args)
    assert_same(family.RUNGS[rung](q, k, v, *params, state=S0), wkv7(*args, state=S0), f"{rung} vs wkv7")


@pytest.mark.parametrize("rung", sorted(family.RUNGS))
def test_state_carried_across_a_split_sequence(rng, rung):
    q, k, v, params, S0 = rung_inputs(rng, rung, T=13)
    fn = family.RUNGS[rung]
    whole = fn(q, k, v, *params, state=S0)
    S, ys = S0, []
    for lo, hi in zip(*(lambda b: (b[:-1], b[1:]))(split_bounds(13, [0.2, 0.7]))):
        cut = lambda x: x if x.ndim == 1 else x[:, lo:hi]                # log_gamma (H,) is not per step
        y, S = fn(*(cut(x) for x in (q, k, v, *params)), state=S)
        ys.append(y)
    assert_same((np.concatenate(ys, axis=1), S), whole, f"{rung} in pieces")


def decay_products(log_decay):
    """D[b, t, s, h, n] = exp(sum of log_decay over steps s+1 .. t) for s <= t, else 0; log_decay (B, T, H, N)."""
    c = np.cumsum(log_decay, axis=1)
    T = log_decay.shape[1]
    causal = np.tril(np.ones((T, T), dtype=bool))[None, :, :, None, None]
    return np.where(causal, np.exp(c[:, :, None] - c[:, None, :]), 0.0)


@pytest.mark.parametrize("rung", ["linear_attention", "retention", "gla", "ssd"])
def test_diagonal_rungs_equal_their_quadratic_form(rng, rung):
    """y_t = sum_{s<=t} v_s sum_n q_t[n] k_s[n] prod_{m=s+1..t} g_m[n]: the masked, decayed attention form (no
    state), the parallel form of every diagonal rung. Zero initial state."""
    q, k, v, params, _ = rung_inputs(rng, rung, state=False)
    log_decay = {"linear_attention": lambda: np.zeros(q.shape),
                 "retention": lambda: np.broadcast_to(params[0][:, None], q.shape),
                 "gla": lambda: params[0], "ssd": lambda: np.broadcast_to(params[0][..., None], q.shape)}[rung]()
    scores = np.einsum("bthn,bshn,btshn->bhts", q, k, decay_products(log_decay))    # (B, H, T, T), causal
    y_quadratic = np.einsum("bhts,bshv->bthv", scores, v)
    assert_close(family.RUNGS[rung](q, k, v, *params)[0], y_quadratic, REFERENCE_BUDGET, f"{rung} quadratic form")


def test_delta_rule_with_unit_key_and_beta_one_replaces_the_value(rng):
    """With |k| = 1 and beta = 1 the state then reads exactly v under k (the old value is erased), and keys
    orthogonal to k read what they read before; linear attention under the same writes reads the old value
    plus the new one."""
    N = 4
    q, k, v, _, S0 = rung_inputs(rng, "delta_rule", B=1, T=1, H=1, N=N)
    S = family.delta_rule(q, k, v, np.ones((1, 1, 1)), state=S0)[1][0, 0]
    key, other = k[0, 0, 0], np.linalg.qr(np.column_stack([k[0, 0, 0], rng.standard_normal((N, N - 1))]))[0][:, 1]
    np.testing.assert_allclose(S @ key, v[0, 0, 0], atol=1e-12)
    np.testing.assert_allclose(S @ other, S0[0, 0] @ other, atol=1e-12)
    S_lin = family.linear_attention(q, k, v, state=S0)[1][0, 0]
    np.testing.assert_allclose(S_lin @ key, S0[0, 0] @ key + v[0, 0, 0], atol=1e-12)


def test_delta_rule_transition_flips_a_sign_only_with_beta_above_one(rng):
    """The eigenvalue of I - beta k k^T along a unit k is 1 - beta: negative (a sign flip, what parity needs) only
    for beta in (1, 2]; the diagonal rungs' eigenvalues are decays in (0, 1]."""
    k = rng.standard_normal(5)
    k /= np.linalg.norm(k)
    for beta in (0.5, 1.0, 1.5, 2.0):
        G, _ = explicit_transitions("delta_rule", k[None, None, None], (np.full((1, 1, 1), beta),))
        assert np.linalg.eigvalsh(G[0, 0, 0]).min() == pytest.approx(1 - beta, abs=1e-12)


def test_rwkv4_is_a_per_channel_rung_of_wkv7(rng):
    C = 6
    w, u = -rng.uniform(0.1, 1.0, C), rng.standard_normal(C)
    k, v = rng.standard_normal((2, 2, 11, C))
    assert_close(family.rwkv4_via_wkv7(w, u, k, v), wkv4(w, u, k, v)[0], REFERENCE_BUDGET, "RWKV-4 via wkv7")


@pytest.mark.parametrize("with_D", [False, True])
def test_selective_scan_is_a_per_channel_rung_of_wkv7(rng, with_D):
    x = scan_inputs(rng, 2, 3, 4, 10, extras=("D",) if with_D else ())
    assert_close(family.selective_scan_via_wkv7(**x), selective_scan(**x)[0], REFERENCE_BUDGET, "scan via wkv7")


@pytest.mark.parametrize("call, match", [
    (lambda q, p: family.linear_attention(q[0], q, q), r"q must have shape \(B, T, H, N\), got \(9, 3, 4\)"),
    (lambda q, p: family.linear_attention(q, q[:, :5], q), r"k must have the shape of q"),
    (lambda q, p: family.retention(q, q, q, np.zeros(4)), r"log_gamma must have shape \(H,\) = \(3,\), got \(4,\)"),
    (lambda q, p: family.gla(q, q, q, np.zeros((2, 9, 3))), r"log_g must have shape \(B, T, H, N\)"),
    (lambda q, p: family.ssd(q, q, q, np.zeros((2, 9, 3, 4))), r"log_a must have shape \(B, T, H\)"),
    (lambda q, p: family.ssd(q, q, q, np.full((2, 9, 3), np.nan)), r"log_a must be finite, got 54 NaN"),
    (lambda q, p: family.gated_delta_rule(q, q, q, p, np.zeros(3)), r"beta must have shape \(B, T, H\)"),
    (lambda q, p: family.delta_rule(q, q, q, p, state=np.zeros((2, 3, 4, 5))), r"state must have shape"),
    (lambda q, p: family.as_wkv7("mamba", q, q, q), r"rung must be one of"),
    (lambda q, p: family.selective_scan_via_wkv7(*np.zeros((2, 1, 3, 5)), np.zeros((3, 2)), *np.zeros((2, 1, 2, 5)),
                                                 D=np.zeros(2)), r"D must have shape \(D,\) = \(3,\)"),
])
def test_bad_input_is_refused_by_name(call, match):
    q = np.zeros((2, 9, 3, 4))
    with pytest.raises(ValueError, match=match):
        call(q, np.zeros((2, 9, 3)))


def test_bad_dtype_and_argument_count_are_refused_by_name():
    q = np.zeros((1, 2, 1, 3))
    with pytest.raises(TypeError, match="v must hold real numbers.*complex128"):
        family.linear_attention(q, q, q.astype(complex))
    with pytest.raises(TypeError, match="delta_rule takes 1 argument"):
        family.as_wkv7("delta_rule", q, q, q)
