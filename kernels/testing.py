"""Agreement metrics shared by the tests, the notebooks and the cross-check report, and what tests and benchmarks
need to know of the kernels' set-up, and ``gpu_like_math``: the interpreter's exp, division and fp32 dots as a GPU
rounds them.

The design's measure: relative RMS error ||a - b|| / ||b|| against the reference b, plus max abs error.
Accepts NumPy arrays and torch tensors (compared in float64).

Also here, from the private modules, so that nothing outside kernels/ imports those: ``HAS_TRITON`` (whether triton
imports), ``accumulation_dtype`` (the dtype states take for inputs of a dtype), ``default_backend`` (the one
backend=None picks, kernels/backends.py) and ``poisoned_outputs`` (NaN-filled output buffers). The first three are
looked up on first use, so that importing this module does not import triton
(``seqmix.use_interpreter_without_gpu()`` must come first).
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch

__all__ = ["fp32", "f64", "rel_rms", "max_abs", "assert_close", "assert_all_close", "check", "exercise",
           "REFERENCE_BUDGET",
           "FP32_BUDGET", "FP32_CHUNKED_WKV7_BUDGET", "FP16_BUDGET", "poisoned_outputs", "gpu_like_math",
           "gpu_like_dots", "fma_chain_dot", "values_as_on_a_gpu",
           "HAS_TRITON", "accumulation_dtype", "default_backend"]   # noqa: F822  (the last three: __getattr__ below)

_FROM_KERNELS = {"HAS_TRITON": "seqmix.kernels._common", "accumulation_dtype": "seqmix.kernels._common",
                 "default_backend": "seqmix.kernels.backends"}


def __getattr__(name: str):
    """HAS_TRITON, accumulation_dtype and default_backend, imported when first asked for (they import triton)."""
    if name in _FROM_KERNELS:
        import importlib
        return getattr(importlib.import_module(_FROM_KERNELS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@contextlib.contextmanager
def poisoned_outputs():
    """Inside the block every output buffer the ops allocate starts as NaN, so that an element a kernel skips shows
    up as a non-finite output (tests/conftest.py turns it on for every test)."""
    from . import _common
    before = _common.POISON_OUTPUTS
    _common.POISON_OUTPUTS = True
    try:
        yield
    finally:
        _common.POISON_OUTPUTS = before


@contextlib.contextmanager
def values_as_on_a_gpu():
    """Inside the block the wrappers treat CPU tensors' values as a GPU's: their checks of values run as device-side
    asserts instead of reading the values on the host (the tests of host syncs use it)."""
    from . import _common
    before = _common.READ_VALUES_ON_HOST
    _common.READ_VALUES_ON_HOST = False
    try:
        yield
    finally:
        _common.READ_VALUES_ON_HOST = before


GPU_MATH_ULPS = 2   # the documented error bound of ex2.approx.f32 and div.full.f32 (PTX ISA), taken at its worst
_LOG2E = np.float32(1.4426950408889634)


def _ulps_up(fn, ulps):
    """fn, with each finite nonzero fp32 result moved ``ulps`` units in the last place towards +inf."""
    def biased(*args):
        out = fn(*args)
        if out.dtype == np.float32:
            moved = np.isfinite(out) & (out != 0)
            for _ in range(ulps):
                out = np.where(moved, np.nextafter(out, np.float32(np.inf)), out)
        return out
    return biased


def _ex2_approx(x):
    """e^x as the GPU computes tl.exp in fp32: 2^(x log2 e), the product rounded to fp32 first."""
    if x.dtype != np.float32:
        return np.exp(x)
    return np.exp2((x * _LOG2E).astype(np.float32))


def fma_chain_dot(a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """acc + a @ b for fp32 a (..., M, K), b (..., K, N), acc (..., M, N), as Triton computes an fp32 dot with
    input_precision="ieee" on an NVIDIA GPU (its FMA lowering, convertFMADot: one fused multiply-add per k, in order,
    into the accumulator): acc <- fma(a_mk, b_kn, acc). Each element's bits then depend on its row of a and column
    of b only, not on the tile's shape. NumPy's matmul (the interpreter's tl.dot) calls the BLAS, whose kernels may
    round an element differently by the shape of the call: OpenBLAS 0.3.31's Haswell kernel did for 709 of 4096
    scores tiled 16 x 32 against 32 x 16 at K = 8. The FMA is emulated in float64: the fp32 product is exact there
    and the sum is rounded to float64, then to fp32; that equals the FMA's one rounding except where the float64 sum
    lands exactly halfway between two fp32 numbers (rare, and the same for every tile shape)."""
    out = acc.astype(np.float32)
    for kk in range(a.shape[-1]):
        out = (a[..., :, kk, None].astype(np.float64) * b[..., None, kk, :].astype(np.float64)
               + out.astype(np.float64)).astype(np.float32)
    return out


def _gpu_like_dot(original):
    """The interpreter's create_dot with fp32 "ieee" dots as fma_chain_dot; every other dot as before."""
    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if (str(input_precision).upper().endswith("IEEE")
                and a.data.dtype == b.data.dtype == d.data.dtype == np.float32):
            from triton.runtime.interpreter import TensorHandle
            return TensorHandle(fma_chain_dot(a.data, b.data, d.data), d.dtype.scalar)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)
    return create_dot


@contextlib.contextmanager
def gpu_like_dots():
    """Inside the block the Triton interpreter computes fp32 IEEE dots as a GPU does (fma_chain_dot), so that a
    score's bits do not depend on the tile it is computed in; exp and division stay as they are. Needs
    TRITON_INTERPRET=1."""
    from triton.runtime import interpreter
    builder = interpreter.InterpreterBuilder
    saved = builder.create_dot
    builder.create_dot = _gpu_like_dot(saved)
    try:
        yield
    finally:
        builder.create_dot = saved


@contextlib.contextmanager
def gpu_like_math(ulps: int = GPU_MATH_ULPS):
    """Inside the block the Triton interpreter computes fp32 ``tl.exp`` as a GPU does, ex2.approx(fl(x log2 e)), and
    fp32 division as div.full.f32, each result then biased ``ulps`` units in the last place upwards (their error
    bound, at its worst), and fp32 IEEE dots as an FMA chain in k order (gpu_like_dots). Outside it the interpreter
    rounds exp and division correctly (np.exp, np.divide), more accurately than any GPU, and its dots round as the
    CPU's BLAS does; a kernel test that passes in this mode keeps its budget on one (the review's method,
    /work/shared/reviews/gpu-path.md). Needs TRITON_INTERPRET=1; ``pytest --gpu-math`` runs every test in it."""
    from triton.runtime import interpreter
    builder = interpreter.InterpreterBuilder
    saved = builder.create_exp, builder.create_fdiv
    builder.create_exp = lambda self, arg: self.unary_op(arg, _ulps_up(_ex2_approx, ulps))
    builder.create_fdiv = lambda self, lhs, rhs: self.binary_op(lhs, rhs, _ulps_up(np.divide, ulps))
    try:
        with gpu_like_dots():
            yield
    finally:
        builder.create_exp, builder.create_fdiv = saved


def fp32(*arrays) -> list:
    """Each array as an fp32 torch tensor."""
    return [torch.tensor(a, dtype=torch.float32) for a in arrays]


def f64(x) -> np.ndarray:
    """A NumPy float64 array of x (a torch tensor, detached and moved to the CPU, or anything array-like)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def rel_rms(actual, expected) -> float:
    """||actual - expected||_2 / ||expected||_2 (the plain norm of the difference when expected is all zero)."""
    a, b = f64(actual), f64(expected)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    den = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / (den if den > 0 else 1.0))


def max_abs(actual, expected) -> float:
    """max |actual - expected| (0 for empty arrays)."""
    a, b = f64(actual), f64(expected)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def assert_close(actual, expected, budget: float, what: str = "value") -> float:
    """Fails unless both are finite and rel_rms(actual, expected) <= budget; returns the error."""
    a, b = f64(actual), f64(expected)
    if not np.isfinite(b).all():
        raise AssertionError(f"{what}: the expected value has non-finite entries")
    if not np.isfinite(a).all():
        raise AssertionError(f"{what}: {np.size(a) - np.isfinite(a).sum()} non-finite entries")
    err = rel_rms(a, b)
    if not err <= budget:
        raise AssertionError(f"{what}: relative RMS error {err:.3e} > budget {budget:.1e} "
                             f"(max abs error {max_abs(a, b):.3e})")
    return err


def assert_all_close(names, actual, expected, budget: float, what: str = "") -> list:
    """assert_close on each pair of ``actual`` and ``expected`` (e.g. every gradient), named by ``names`` in the
    messages ('<what> <name>', or '<name>' without what); the three must have one length. Returns the errors."""
    names, actual, expected = list(names), list(actual), list(expected)
    if not len(names) == len(actual) == len(expected):
        raise AssertionError(f"{what or 'assert_all_close'}: {len(names)} names for {len(actual)} values and "
                             f"{len(expected)} expected values")
    return [assert_close(a, e, budget, f"{what} {name}" if what else name)
            for name, a, e in zip(names, actual, expected)]

# The design's error budgets (relative RMS error against the float64 reference).
REFERENCE_BUDGET = 1e-12   # one float64 form of a formula against another
FP32_BUDGET = 1e-5         # torch or Triton in fp32, outputs and gradients
FP32_CHUNKED_WKV7_BUDGET = 1e-4
FP16_BUDGET = 5e-3         # fp16 inputs, fp32 accumulation
BF16_BUDGET = 2e-2         # bf16 inputs (8 bits of mantissa), fp32 accumulation


def check(what: str, actual, expected, budget: float) -> None:
    """assert_close, then print one line that does not depend on the machine (nbval compares it):
    '<what>: agree within <budget>: True'. Returns nothing, so that a notebook cell ending in check(...) shows
    only that line (use rel_rms for the number itself)."""
    assert_close(actual, expected, budget, what)
    print(f"{what}: agree within {budget:.0e}: True")


NOT_ATTEMPTED = "not attempted yet (fill in the cell above, run it, then run this cell again)"


def exercise(name: str, checks) -> None:
    """Run a notebook exercise's checks on the student's code and say how it went, in one line nbval can compare.

    ``checks`` is a function of no arguments that calls the student's code and asserts (``check``,
    ``assert_close``, ``assert``). While the student's cell is still the stub (it raises NotImplementedError) this
    prints '<name>: not attempted yet ...', so a notebook stays green before anyone writes a line; once the checks
    pass it prints '<name>: correct'; a wrong answer raises the checks' AssertionError, so the cell fails as a test
    does and its message says what is off. Returns nothing, so that a cell ending in exercise(...) shows only that
    line."""
    try:
        checks()
    except NotImplementedError:
        print(f"{name}: {NOT_ATTEMPTED}")
        return
    print(f"{name}: correct")
