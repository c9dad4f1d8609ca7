"""The Triton kernels keep their budgets with a GPU's arithmetic: the interpreter's fp32 exp as ex2.approx of
x log2(e) and its division as div.full.f32, both biased 2 ulps upwards (kernels.testing.gpu_like_math; the whole
suite runs so with ``pytest --gpu-math``). Here, in CI, every Triton row of the cross-check report (each op's
forward against the float64 reference) and the gradients of the recurrences against the torch backend in float64."""
import numpy as np
import pytest
import torch

from kernel_cases import needs_triton
from seqmix.kernels import crosscheck
from seqmix.kernels.ssm import selective_scan
from seqmix.kernels.testing import FP32_BUDGET, assert_close, gpu_like_math, rel_rms
from seqmix.kernels.wkv4 import wkv4
from seqmix.kernels.wkv7 import wkv7

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


@pytest.mark.parametrize("rows", [crosscheck.attention_rows, crosscheck.rope_rows, crosscheck.wkv4_rows,
                                  crosscheck.wkv7_rows, crosscheck.ssm_rows], ids=lambda f: f.__name__)
def test_cross_check_holds_with_gpu_like_math(rows):
    checked = 0
    with gpu_like_math():
        for formula, what, actual, expected, budget in rows(np.random.default_rng(0)):
            if "triton" in what.lower():
                checked += 1
                err = rel_rms(actual, expected)
                assert np.isfinite(err) and err <= budget, f"{formula}, {what}: {err:.2e} > {budget:.0e}"
    assert checked, "no Triton row: the cross-check's labels changed"


def _wkv4_args(rng):
    return [-np.exp(rng.normal(size=8)), rng.normal(size=8), *rng.normal(size=(2, 2, 9, 8))]


def _wkv7_args(rng):
    x = list(rng.normal(size=(6, 1, 19, 2, 16)))
    x[1] = -np.exp(x[1] - 1.0)                       # log decays <= 0
    return [z * 0.5 for z in x]


def _scan_args(rng):
    u, delta = rng.normal(size=(2, 1, 16, 11))
    return [u, delta, -np.exp(rng.normal(size=(16, 4))), *rng.normal(size=(2, 1, 4, 11))]

GRADIENT_OPS = {"wkv4": (wkv4, _wkv4_args, {}), "wkv7": (wkv7, _wkv7_args, {}),
                "wkv7 chunked": (wkv7, _wkv7_args, {"chunked": True}),
                "selective_scan": (selective_scan, _scan_args, {"delta_softplus": True})}


@pytest.mark.parametrize("op", GRADIENT_OPS)
def test_gradients_hold_with_gpu_like_math(rng, op):
    """The Triton backward (fp32, GPU-like exp and division) against the torch backend in float64."""
    fn, make, options = GRADIENT_OPS[op]
    arrays = make(rng)
    grads = {}
    for backend, dtype in (("triton", torch.float32), ("torch", torch.float64)):
        x = [torch.tensor(a, dtype=dtype, requires_grad=True) for a in arrays]
        with gpu_like_math():
            y = fn(*x, backend=backend, **options)[0]
        cotangent = torch.tensor(np.random.default_rng(1).normal(size=tuple(y.shape)), dtype=dtype)
        with gpu_like_math():
            (y * cotangent).sum().backward()
        grads[backend] = [z.grad for z in x]
    for i, (got, want) in enumerate(zip(grads["triton"], grads["torch"])):
        assert_close(got, want, FP32_BUDGET, f"{op} gradient {i}")
