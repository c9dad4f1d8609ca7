"""What the kernel and reference test files share: the optional-Triton mark and backend list, and a spy on a module's
function. The input makers and the feeding of a sequence in pieces live in seqmix.kernels.inputs (the
conformance battery uses them too)."""
import pytest

from seqmix.kernels.testing import HAS_TRITON

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
# Parametrize a test over these: the Triton case is skipped where triton does not import.
BACKENDS = ["torch", pytest.param("triton", marks=needs_triton)]
# The recurrences (WKV-4, WKV-7, the selective scan) run on their C loops (kernels/<op>/<op>.c) too, forward and
# backward.
RECURRENCE_BACKENDS = [*BACKENDS, "c"]


def spy(monkeypatch, module, name):
    """Replace module.name by a wrapper that records what each call returns; returns the (live) list of returns."""
    returned, original = [], getattr(module, name)

    def wrapper(*args, **kwargs):
        returned.append(original(*args, **kwargs))
        return returned[-1]

    monkeypatch.setattr(module, name, wrapper)
    return returned
