"""Random non-finite inputs into every op (issue 13): hypothesis draws an op, a sequence length, a seed for the
ordinary inputs and one to three entries of any inputs set to NaN, +inf or -inf, and every backend must put NaN where
the float64 reference does (edge_ops.check_nan_placement). Tiny shapes and a fixed example count keep it within a
minute, Triton included (under the interpreter). The other inputs stay of moderate size, where the float64
reference is exact (it is not for keys near 1e30: k + w rounds to k)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from helpers.edge_ops import NONFINITE, backends, check_nan_placement, inputs, names


@st.composite
def nonfinite_case(draw, op):
    x = inputs(op, np.random.default_rng(draw(st.integers(0, 2**16))), T=draw(st.integers(1, 7)))
    entries = []
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(sorted(x)))
        index = tuple(draw(st.integers(0, s - 1)) for s in x[name].shape)
        x[name][index] = NONFINITE[draw(st.sampled_from(sorted(NONFINITE)))]
        entries.append((name, index))
    return x, entries


@pytest.mark.parametrize("op", names())
@settings(deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_nonfinite_inputs_give_nan_where_the_reference_does(op, data):
    x, entries = data.draw(nonfinite_case(op))
    for backend in backends(op):
        check_nan_placement(op, x, entries, backend)
