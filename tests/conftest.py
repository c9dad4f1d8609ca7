"""Test set-up: the Triton interpreter on CPU, NaN-poisoned kernel outputs, seeded randomness."""
import seqmix

# The interpreter must be chosen before triton is first imported (the kernels import it).
seqmix.use_interpreter_without_gpu()

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from seqmix.kernels.testing import poisoned_outputs  # noqa: E402


@pytest.fixture(autouse=True)
def poison_outputs():
    """Every kernel output buffer starts as NaN, so that an element a kernel skips fails the test."""
    with poisoned_outputs():
        yield


@pytest.fixture
def rng():
    return np.random.default_rng(20261122)
