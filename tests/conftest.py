"""Test set-up: the Triton interpreter on CPU, NaN-poisoned kernel outputs, seeded randomness."""
import seqmix

# The interpreter must be chosen before triton is first imported (the kernels import it).
seqmix.use_interpreter_without_gpu()

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from seqmix.kernels.testing import gpu_like_math, poisoned_outputs  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--gpu-math", action="store_true",
                     help="the Triton interpreter with a GPU's fp32 exp, division and dots (testing.gpu_like_math)")


@pytest.fixture(autouse=True)
def gpu_math(request):
    """With --gpu-math, every test runs with the interpreter's exp, division and dots rounded as on a GPU (at worst)."""
    if request.config.getoption("--gpu-math"):
        with gpu_like_math():
            yield
    else:
        yield


@pytest.fixture(autouse=True)
def poison_outputs():
    """Every kernel output buffer starts as NaN, so that an element a kernel skips fails the test."""
    with poisoned_outputs():
        yield


@pytest.fixture
def rng():
    return np.random.default_rng(20261122)
