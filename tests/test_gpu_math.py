"""The Triton kernels keep their budgets with a GPU's arithmetic: the interpreter's fp32 exp as ex2.approx of
x log2(e) and its division as div.full.f32, both biased 2 ulps upwards (kernels.testing.gpu_like_math; the whole
suite runs so with ``pytest --gpu-math``). Here, in CI, every Triton row of the cross-check report (each op's
forward against the float64 reference) and the gradients of the recurrences against the torch backend in float64."""
import numpy as np
import pytest
import torch

from kernel_cases import needs_triton
from seqmix.kernels import crosscheck
from seqmix.kernels.declarations import call, state_tensors
from seqmix.kernels.registry import REGISTRY
from seqmix.kernels.testing import FP32_BUDGET, assert_close, gpu_like_math, rel_rms
from seqmix.kernels.wkv4 import wkv4

pytestmark = needs_triton


def test_gpu_like_math_changes_exp_and_division(rng):
    """The mode takes effect: WKV-4 (exp and division every step) gives other bits, within the fp32 budget."""
    w, u = -np.exp(rng.normal(size=8)), rng.normal(size=8)
    k, v = rng.normal(size=(2, 2, 9, 8))
    args = [torch.tensor(x, dtype=torch.float32) for x in (w, u, k, v)]
    exact = wkv4(*args, backend="triton")[0]
    with gpu_like_math():
        approx = wkv4(*args, backend="triton")[0]
    assert not torch.equal(exact, approx)
    assert_close(approx, exact, FP32_BUDGET, "wkv4 with GPU-like exp and division")


@pytest.mark.parametrize("op", REGISTRY, ids=lambda op: op.name)
def test_cross_check_holds_with_gpu_like_math(op):
    checked = 0
    with gpu_like_math():
        for formula, what, actual, expected, budget in crosscheck.kernel_rows(op, np.random.default_rng(0)):
            if "triton" in what.lower():
                checked += 1
                err = rel_rms(actual, expected)
                assert np.isfinite(err) and err <= budget, f"{formula}, {what}: {err:.2e} > {budget:.0e}"
    assert checked, "no Triton row: the cross-check's labels changed"


# Each recurrence's Triton backends (WKV-7's chunked form is a backend of its own), from the registry.
TRITON_BACKWARDS = [pytest.param(op, backend.name, id=f"{op.name}-{backend.name}") for op in REGISTRY
                    if op.family == "recurrence" for backend in op.get("backends") if backend.name.startswith("triton")]


@pytest.mark.parametrize("op, backend", TRITON_BACKWARDS)
def test_gradients_hold_with_gpu_like_math(op, backend):
    """The Triton backward (fp32, GPU-like exp and division) against the torch backend in float64, on the
    cross-check's case of the op's battery (its initial state included, not differentiated)."""
    battery = op.get("battery")
    x = battery.make(np.random.default_rng(0), **crosscheck.crosscheck_case(battery).params)
    grads = {}
    for name, dtype in ((backend, torch.float32), ("torch", torch.float64)):
        tensors = {n: torch.tensor(a, dtype=dtype, requires_grad=True) for n, a in x.tensors.items()}
        state = state_tensors(x.state, dtype)     # fp32 beside fp32 inputs, float64 beside float64
        with gpu_like_math():
            y = call(battery, op.function, tensors, {**x.options, "backend": name}, state)[0]
        cotangent = torch.tensor(np.random.default_rng(1).normal(size=tuple(y.shape)), dtype=dtype)
        with gpu_like_math():
            (y * cotangent).sum().backward()
        grads[name] = {n: t.grad for n, t in tensors.items()}
    for n, got in grads[backend].items():
        assert_close(got, grads["torch"][n], FP32_BUDGET, f"{op.name} on {backend}: d/d{n}")
