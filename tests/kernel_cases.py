"""What the kernel and reference test files share: the optional-Triton mark and backend list, the RWKV-7 input maker,
the cut points of a sequence fed in pieces and the feeding, and a spy on a module's function."""
import numpy as np
import pytest

from seqmix.kernels.testing import HAS_TRITON

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
# Parametrize a test over these: the Triton case is skipped where triton does not import.
BACKENDS = ["torch", pytest.param("triton", marks=needs_triton)]

# The range of w_raw (log_w = -exp(w_raw)) per decay: "strong" (decays near 0.545, RWKV-7's strongest), "weak"
# (near 1), "mixed", "extreme" (log_w down to -1e4: decays far below fp32's range, which wkv7's factored couplings
# cannot take).
W_RAW = {"strong": (-0.6, -0.5), "weak": (-9.0, -8.0), "mixed": (-9.0, -0.5), "extreme": (-9.0, 9.2)}


def rwkv7_inputs(rng, B, T, H, N, decay="mixed", state=True):
    """float64 NumPy inputs [r, log_w, k, v, a, b] as RWKV-7 makes them (a = -kk, b = kk * icl with kk unit-norm per
    head and icl in (0, 1)), and an initial state (B, H, N, N) (None unless ``state``).
    decay: a key of W_RAW, or "growing" (log_w in (0, 0.1): the formula is defined for any real log_w)."""
    shape = (B, T, H, N)
    r, k, v = (rng.standard_normal(shape) for _ in range(3))
    kk = rng.standard_normal(shape)
    kk /= np.linalg.norm(kk, axis=-1, keepdims=True)
    icl = rng.uniform(0.0, 1.0, shape)
    log_w = rng.uniform(0.0, 0.1, shape) if decay == "growing" else -np.exp(rng.uniform(*W_RAW[decay], shape))
    S0 = rng.standard_normal((B, H, N, N)) if state else None
    return [r, log_w, k, v, -kk, kk * icl], S0


def split_bounds(T, cuts):
    """[0, ..., T]: the bounds of the pieces a sequence of T >= 2 tokens is fed in, cut at the fractions ``cuts`` of
    T (each cut moved into [1, T - 1], duplicates dropped: no piece is empty)."""
    return [0] + sorted({min(T - 1, max(1, int(c * T))) for c in cuts}) + [T]


def in_pieces(run, bounds, state):
    """run(lo, hi, state) -> (y, state) for each piece [lo, hi) of ``bounds`` in turn, each from the state the last
    one returned; returns (the pieces' outputs, the final state)."""
    ys = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        y, state = run(lo, hi, state)
        ys.append(y)
    return ys, state


def spy(monkeypatch, module, name):
    """Replace module.name by a wrapper that records what each call returns; returns the (live) list of returns."""
    returned, original = [], getattr(module, name)

    def wrapper(*args, **kwargs):
        returned.append(original(*args, **kwargs))
        return returned[-1]

    monkeypatch.setattr(module, name, wrapper)
    return returned
