"""RoPE and ReRoPE: relative-position property, the four matrices, definition == two-pass prefill == decode."""
import numpy as np
import pytest

from seqmix.kernels.testing import REFERENCE_BUDGET, assert_close
from seqmix.reference.attention import softmax_attention
from seqmix.reference.rope import (apply_rope, attention_from_relative_positions, log_n_scale, ntk_scaled_base,
                                   relative_positions, rerope_attention, rerope_decode)


def rotation_matrix(p, d, base=10000.0, ntk_scale=1.0):
    """R(p) built as an explicit d x d matrix of 2 x 2 rotations on pairs (i, i + d/2): independent of _rotate.
    ntk_scale = s slows pair i by s^(2i / (d - 2)) (NTK-aware scaling written per pair, not through the base)."""
    R = np.zeros((d, d))
    for i in range(d // 2):
        a = p * base ** (-2 * i / d) / ntk_scale ** (2 * i / (d - 2))
        j = i + d // 2
        R[i, i], R[i, j], R[j, i], R[j, j] = np.cos(a), -np.sin(a), np.sin(a), np.cos(a)
    return R


def test_apply_rope_is_the_rotation_matrix(rng):
    x = rng.normal(size=(5, 8))
    pos = np.array([0, 1, 2.5, 17, 300])
    expected = np.stack([rotation_matrix(p, 8) @ x[t] for t, p in enumerate(pos)])
    assert_close(apply_rope(x, pos), expected, REFERENCE_BUDGET, "apply_rope")


@pytest.mark.parametrize("d,scale", [(4, 2.0), (8, 4.0), (64, 8.0), (16, 1.0)])
def test_ntk_scaled_base_extrapolates_the_fastest_pair_and_interpolates_the_slowest(rng, d, scale):
    x = rng.normal(size=(6, d))
    pos = np.array([0, 1, 5.5, 17, 300, 4095])
    rotated = apply_rope(x, pos, base=ntk_scaled_base(d, scale))
    per_pair = np.stack([rotation_matrix(p, d, ntk_scale=scale) @ x[t] for t, p in enumerate(pos)])
    assert_close(rotated, per_pair, REFERENCE_BUDGET, "NTK base vs per-pair slowing")
    fast, slow = [0, d // 2], [d // 2 - 1, d - 1]                       # the fastest and the slowest pair
    assert_close(rotated[:, fast], apply_rope(x, pos)[:, fast], REFERENCE_BUDGET, "fastest pair: plain RoPE")
    assert_close(rotated[:, slow], apply_rope(x, pos / scale)[:, slow], REFERENCE_BUDGET, "slowest pair: PI")


def test_scores_depend_only_on_distance(rng):
    """(R_i q).(R_j k) is the same for every pair with the same i - j, and equals q . R(j - i) k."""
    q, k = rng.normal(size=(2, 16))
    for i, j in [(3, 1), (10, 8), (102, 100), (2.5, 0.5)]:
        s = apply_rope(q, i) @ apply_rope(k, j)
        assert abs(s - q @ rotation_matrix(j - i, 16) @ k) < 1e-12 * np.linalg.norm(q) * np.linalg.norm(k)
        assert abs(s - apply_rope(q, 2) @ apply_rope(k, 0)) < 1e-12 * np.linalg.norm(q) * np.linalg.norm(k)


@pytest.mark.parametrize("kind,window,k,f", [
    ("rope", None, None, lambda x: x),
    ("pi", None, 4.0, lambda x: x / 4.0),
    ("leaky_rerope", 3, 8.0, lambda x: x if x < 3 else 3 + (x - 3) / 8.0),
    ("rerope", 3, None, lambda x: min(x, 3)),
])
def test_relative_position_matrices_match_their_formula(kind, window, k, f):
    n = 9
    rel = relative_positions(n, kind, window=window, k=k)
    expected = np.array([[f(i - j) for j in range(n)] for i in range(n)], dtype=float)
    np.testing.assert_array_equal(rel, expected)
    # The PI matrix's last row is (L-1)/k, (L-2)/k, ...: the source's repeated (L-1)/k is a typo (ERRATA.md).
    if kind == "pi":
        assert rel[-1, 1] == (n - 2) / k


def test_leaky_rerope_tends_to_rerope():
    np.testing.assert_allclose(relative_positions(40, "leaky_rerope", window=5, k=1e12),
                               relative_positions(40, "rerope", window=5), atol=1e-9)


def test_definition_with_rope_matrix_is_plain_rope_attention(rng):
    q, k, v = rng.normal(size=(3, 2, 13, 8))
    pos = np.arange(13)
    expected = softmax_attention(apply_rope(q, pos), apply_rope(k, pos), v)
    assert_close(attention_from_relative_positions(q, k, v, relative_positions(13, "rope")), expected,
                 REFERENCE_BUDGET, "definition vs RoPE attention")


def test_definition_with_pi_matrix_is_rope_at_scaled_positions(rng):
    q, k, v = rng.normal(size=(3, 11, 8))
    pos = np.arange(11) / 4.0
    expected = softmax_attention(apply_rope(q, pos), apply_rope(k, pos), v)
    assert_close(attention_from_relative_positions(q, k, v, relative_positions(11, "pi", k=4.0)), expected,
                 REFERENCE_BUDGET, "definition vs position interpolation")


CASES = [(window, leaky_k, L) for window in (1, 3, 7, 40) for leaky_k in (None, 2.0, 16.0) for L in (None, 5)]


@pytest.mark.parametrize("window,leaky_k,train_length", CASES)
def test_two_pass_prefill_and_decode_match_the_definition(rng, window, leaky_k, train_length):
    T = 17
    q, k, v = rng.normal(size=(3, 2, T, 8))
    kind = "rerope" if leaky_k is None else "leaky_rerope"
    rel = relative_positions(T, kind, window=window, k=leaky_k)
    scaled_q = q * (log_n_scale(np.arange(T), train_length)[:, None] if train_length else 1.0)
    expected = attention_from_relative_positions(scaled_q, k, v, rel)
    prefill = rerope_attention(q, k, v, window, leaky_k=leaky_k, train_length=train_length)
    assert_close(prefill, expected, REFERENCE_BUDGET, "two-pass prefill vs definition")
    for t in (1, 9, T):   # decode at every cache length equals that row of the prefill
        decode = rerope_decode(q[:, t - 1: t], k[:, :t], v[:, :t], window, leaky_k=leaky_k, train_length=train_length)
        assert_close(decode, prefill[:, t - 1: t], REFERENCE_BUDGET, f"decode at T={t}")


def test_window_beyond_length_is_plain_rope(rng):
    q, k, v = rng.normal(size=(3, 10, 8))
    pos = np.arange(10)
    assert_close(rerope_attention(q, k, v, window=10), softmax_attention(apply_rope(q, pos), apply_rope(k, pos), v),
                 REFERENCE_BUDGET, "w >= T")


def test_log_n_scale():
    np.testing.assert_allclose(log_n_scale([0, 3, 15, 63], 16), [1, 1, 1, np.log(64) / np.log(16)])


@pytest.mark.parametrize("call", [
    lambda q, k, v: rerope_attention(q, k, v, window=0),
    lambda q, k, v: rerope_attention(q, k, v, window=2, leaky_k=1.0),
    lambda q, k, v: rerope_attention(q, k[:, :, :4], v, window=2),
    lambda q, k, v: rerope_decode(q, k, v, window=2),                      # more than one query
    lambda q, k, v: apply_rope(q[..., :7], np.arange(6)),                 # odd head dimension
    lambda q, k, v: relative_positions(4, "alibi"),
    lambda q, k, v: relative_positions(4, "rerope"),
    lambda q, k, v: attention_from_relative_positions(q, k, v, np.zeros((5, 5))),
    lambda q, k, v: log_n_scale([1], 1),
    lambda q, k, v: ntk_scaled_base(2, 4.0),                              # d / (d - 2) undefined
    lambda q, k, v: ntk_scaled_base(7, 4.0),
    lambda q, k, v: ntk_scaled_base(8, 0.5),                              # a factor below 1
    lambda q, k, v: ntk_scaled_base(8, float("nan")),
])
def test_bad_input(rng, call):
    with pytest.raises(ValueError):
        call(*rng.normal(size=(3, 2, 6, 8)))


def test_source_rerope_far_score_identity(rng):
    """ERRATA: the source writes a2_ij = (R^w q_i)^T k_j = q_i^T R^w k_j. Transposing a rotation reverses it, so the
    right-hand side is q_i^T R^{-w} k_j (the computed left-hand side, which the reference uses, is right)."""
    q, k = rng.normal(size=(2, 16))
    w = 7
    computed = apply_rope(q, w) @ k
    assert abs(computed - q @ rotation_matrix(-w, 16) @ k) < 1e-12 * np.linalg.norm(q) * np.linalg.norm(k)
    assert abs(computed - q @ rotation_matrix(w, 16) @ k) > 1e-2 * np.linalg.norm(q) * np.linalg.norm(k)
