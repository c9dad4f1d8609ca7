"""The Triton kernels keep their budgets with a GPU's arithmetic: the interpreter's fp32 exp as ex2.approx of
x log2(e) and its division as div.full.f32, both biased 2 ulps upwards, and its fp32 IEEE dots as FMA chains in k
order (kernels.testing.gpu_like_math; the whole suite runs so with ``pytest --gpu-math``). Here, in CI, the GPU-like
dot itself, every Triton row of the cross-check report (each op's forward against the float64 reference) and the
gradients of the recurrences against the torch backend in float64."""
import numpy as np
import pytest
import torch

from helpers.kernel_cases import needs_triton
from seqmix.kernels import crosscheck
from seqmix.kernels.declarations import call, state_tensors
from seqmix.kernels.registry import REGISTRY
from seqmix.kernels.testing import (FP32_BUDGET, HAS_TRITON, assert_close, fma_chain_dot, gpu_like_dots,
                                    gpu_like_math, rel_rms)
from seqmix.kernels.wkv4 import wkv4

pytestmark = needs_triton

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _dot_kernel(a_ptr, b_ptr, acc_ptr, out_ptr,    # a (M, K), b (K, N), acc and out (M, N), fp32, row-major
                    M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
        rows, ks, cols = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
        a = tl.load(a_ptr + rows[:, None] * K + ks[None, :])
        b = tl.load(b_ptr + ks[:, None] * N + cols[None, :])
        acc = tl.load(acc_ptr + rows[:, None] * N + cols[None, :])
        tl.store(out_ptr + rows[:, None] * N + cols[None, :], tl.dot(a, b, acc, input_precision="ieee"))


def _triton_dot(a, b, acc):
    out = torch.empty(acc.shape, dtype=torch.float32)
    _dot_kernel[(1,)](*(torch.from_numpy(x) for x in (a, b, acc)), out, *a.shape, b.shape[1])
    return out.numpy()


def test_fma_chain_dot_rounds_once_per_multiply_add():
    """An FMA, not a product rounded and then added: (1 + 2^-12)^2 - (1 + 2^-11) = 2^-24 exactly; the product rounded
    to fp32 first is 1 + 2^-11 (2^-24 is half the spacing above 1, a tie rounded to even) and would give 0."""
    a = np.full((1, 1), 1 + 2.0 ** -12, np.float32)
    assert fma_chain_dot(a, a, np.full((1, 1), -(1 + 2.0 ** -11), np.float32))[0, 0] == 2.0 ** -24


def test_fma_chain_dot_bits_do_not_depend_on_the_tile(rng):
    """Scores tiled 16 x 32 and 32 x 16 are the whole product's to the bit (the property a flash backward's
    recomputation needs), and each is within the bound of K fused multiply-adds: |error| <= gamma_K (|a| |b|),
    gamma_K = K u / (1 - K u), u = 2^-24 (Higham, Accuracy and Stability of Numerical Algorithms, 3.1)."""
    a = (6 * rng.normal(size=(64, 8))).astype(np.float32)
    b = (6 * rng.normal(size=(8, 64))).astype(np.float32)
    whole = fma_chain_dot(a, b, np.zeros((64, 64), np.float32))
    for bm, bn in ((16, 32), (32, 16)):
        tiled = np.block([[fma_chain_dot(a[i:i + bm], b[:, j:j + bn], np.zeros((bm, bn), np.float32))
                           for j in range(0, 64, bn)] for i in range(0, 64, bm)])
        assert np.array_equal(tiled, whole), f"tiles {bm} x {bn}"
    u = 2.0 ** -24
    bound = 8 * u / (1 - 8 * u) * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64))
    assert np.all(np.abs(whole - a.astype(np.float64) @ b.astype(np.float64)) <= bound)


def test_gpu_like_dots_take_the_interpreters_fp32_dot(rng):
    """Inside gpu_like_dots (and so gpu_like_math) a Triton tl.dot in fp32 with input_precision="ieee" is
    fma_chain_dot to the bit; outside it the interpreter's own (the FMA case above tells them apart)."""
    a, b, acc = (rng.normal(size=shape).astype(np.float32) for shape in ((16, 16), (16, 32), (16, 32)))
    a[0, 0], b[0, 0], acc[0, 0] = 1 + 2.0 ** -12, 1 + 2.0 ** -12, -(1 + 2.0 ** -11)
    a[0, 1:], b[1:, 0] = 0.0, 0.0                      # element (0, 0) is the FMA case alone
    for gpu_like in (gpu_like_dots, gpu_like_math):
        with gpu_like():
            assert np.array_equal(_triton_dot(a, b, acc), fma_chain_dot(a, b, acc)), gpu_like.__name__
    assert _triton_dot(a, b, acc)[0, 0] == 0.0, "outside the block the interpreter rounds the product first"


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


# The ops with a Triton backend, from the registry (an op may have none: the made-up op of tests/helpers/ema_op.py)
WITH_TRITON = [op for op in REGISTRY if any(b.name.startswith("triton") for b in op.get("backends"))]


@pytest.mark.parametrize("op", WITH_TRITON, ids=lambda op: op.name)
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
