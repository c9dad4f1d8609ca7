"""Test set-up: the Triton interpreter on CPU, NaN-poisoned kernel outputs, seeded randomness."""
import os

import torch

# The interpreter must be chosen before triton is first imported (kernels/ imports it).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from kernels import _common  # noqa: E402


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    """Every kernel output buffer starts as NaN, so that an element a kernel skips fails the test."""
    monkeypatch.setattr(_common, "POISON_OUTPUTS", True)


@pytest.fixture
def rng():
    return np.random.default_rng(20261122)
