"""Causal softmax attention: the matrix form, the explicit sums and the online form agree; only the online form
survives huge scores."""
import numpy as np
import pytest

from seqmix.kernels.testing import REFERENCE_BUDGET, assert_close
from seqmix.reference.attention import (attention_from_scores, attention_sums, online_softmax_attention,
                                        softmax_attention)


def qkv(rng, *shape, dv=None, scale=1.0):
    *lead, T, d = shape
    return (rng.normal(size=shape) * scale, rng.normal(size=shape) * scale,
            rng.normal(size=(*lead, T, dv or d)))


def loop_attention(q, k, v, scale):
    """Per query, per key, with the standard library's math only: a fourth, independent form."""
    import math
    T = q.shape[0]
    out = np.zeros((T, v.shape[1]))
    for i in range(T):
        s = [scale * float(q[i] @ k[j]) for j in range(i + 1)]
        m = max(s)
        e = [math.exp(x - m) for x in s]
        out[i] = sum(ej * v[j] for j, ej in enumerate(e)) / sum(e)
    return out


@pytest.mark.parametrize("T", [1, 2, 7, 33])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_three_forms_agree(rng, T, block_size):
    q, k, v = qkv(rng, 2, 3, T, 8, dv=5)
    expected = softmax_attention(q, k, v)
    assert_close(attention_sums(q, k, v), expected, REFERENCE_BUDGET, "explicit sums")
    assert_close(online_softmax_attention(q, k, v, block_size=block_size), expected, REFERENCE_BUDGET, "online form")
    assert_close(expected[1, 2], loop_attention(q[1, 2], k[1, 2], v[1, 2], 1 / np.sqrt(8)), REFERENCE_BUDGET,
                 "scalar loop")


def test_first_row_is_first_value_and_noncausal_differs(rng):
    q, k, v = qkv(rng, 6, 4)
    out = softmax_attention(q, k, v)
    np.testing.assert_array_equal(out[0], v[0])          # position 0 can only attend to itself
    full = softmax_attention(q, k, v, causal=False)
    assert_close(full[-1], out[-1], REFERENCE_BUDGET, "last row sees everything either way")
    assert not np.allclose(full[0], out[0])


def test_explicit_sums_overflow_where_online_form_survives(rng):
    """Scores around 1e4: e^{s} is inf in float64, so the sums give NaN; the running max keeps every exponent <= 0."""
    q, k, v = qkv(rng, 12, 4, scale=100.0)              # |q.k| ~ 1e4 * 0.5 with the 1/sqrt(d) scale
    s = q @ k.T / 2
    assert np.abs(s).max() > 1e3
    assert not np.isfinite(attention_sums(q, k, v)).all()
    out = online_softmax_attention(q, k, v, block_size=5)
    assert np.isfinite(out).all()
    # At such scores the softmax is (almost) a hard argmax: row i returns v at argmax_{j<=i} s_ij.
    hard = np.array([v[np.argmax(s[i, : i + 1])] for i in range(12)])
    assert_close(out, hard, 1e-6, "online form vs argmax limit")
    assert_close(out, softmax_attention(q, k, v), REFERENCE_BUDGET, "online vs matrix form")


def test_scale_argument(rng):
    q, k, v = qkv(rng, 5, 4)
    assert_close(softmax_attention(q, k, v, scale=0.3), softmax_attention(q * 0.3 * 2, k, v), REFERENCE_BUDGET,
                 "scale multiplies the scores")


def test_attention_from_scores_aligns_decode_mask_bottom_right(rng):
    """With fewer queries than keys, the queries are the last positions: query 0 of 2 sees keys 0..S-2."""
    s, v = rng.normal(size=(2, 5)), rng.normal(size=(5, 3))
    out = attention_from_scores(s, v, causal=True)
    p = np.exp(s[0, :4]) / np.exp(s[0, :4]).sum()
    assert_close(out[0], p @ v[:4], REFERENCE_BUDGET, "first query")


@pytest.mark.parametrize("bad", [
    lambda q, k, v: softmax_attention(q, k[..., :3], v),
    lambda q, k, v: softmax_attention(q, k, v[:-1]),
    lambda q, k, v: online_softmax_attention(q, k, v, block_size=0),
    lambda q, k, v: attention_from_scores(q @ k.T, v[:-1]),
])
def test_bad_input(rng, bad):
    with pytest.raises(ValueError):
        bad(*qkv(rng, 6, 4))
