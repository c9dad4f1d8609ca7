"""Random inputs as the models make them, in float64 NumPy, and sequences cut into pieces: what the conformance
battery and the kernel tests share.

Every maker takes a ``numpy.random.Generator`` and returns float64 arrays; callers round them to the dtype under
test (and feed the reference the rounded values, so that input rounding is not counted against a kernel).
"""
from __future__ import annotations

import numpy as np

from ..reference import wkv4 as ref_wkv4

__all__ = ["W_RAW", "qkv_inputs", "wkv4_inputs", "spiky_keys", "rwkv7_inputs", "scan_inputs", "split_bounds",
           "in_pieces"]

# The range of w_raw (log_w = -exp(w_raw)) per decay: "strong" (decays near 0.545, RWKV-7's strongest), "weak"
# (near 1), "mixed", "extreme" (log_w down to -1e4: decays far below fp32's range, which chunked kernels' factored
# couplings cannot take).
W_RAW = {"strong": (-0.6, -0.5), "weak": (-9.0, -8.0), "mixed": (-9.0, -0.5), "extreme": (-9.0, 9.2)}


def qkv_inputs(rng, shape, spread=1.0):
    """[q, k, v]: standard normals times ``spread``, each of ``shape``."""
    return [rng.standard_normal(shape) * spread for _ in range(3)]


def wkv4_inputs(rng, B, T, C, *, key_scale=1.0, decay_scale=1.0, state=False):
    """RWKV-4's w, u, k, v as a dict and an initial state (num, den, max) or None.

    w = -exp(decay_scale N(0, 1) - 0.5) (decays e^w from ~0 to ~1), u = 0.5 N(0, 1), keys uniform in
    [-key_scale, key_scale], values standard normal; the state is what the reference leaves after a random
    5-token prefix (so that num, den and max are consistent, as a model's state is)."""
    x = dict(w=-np.exp(decay_scale * rng.normal(size=C) - 0.5), u=0.5 * rng.normal(size=C),
             k=key_scale * rng.uniform(-1, 1, size=(B, T, C)), v=rng.normal(size=(B, T, C)))
    if not state:
        return x, None
    prefix = key_scale * rng.uniform(-1, 1, size=(B, 5, C)), rng.normal(size=(B, 5, C))
    return x, tuple(ref_wkv4.wkv4(x["w"], x["u"], *prefix)[1])


def spiky_keys(rng, shape):
    """Keys uniform in [-1, 1] with about 3% of them at +300 or -300: a chunked kernel sees chunks of ordinary keys
    beside chunks whose keys span 600."""
    k = rng.uniform(-1, 1, size=shape)
    spikes = rng.random(size=shape) < 0.03
    k[spikes] = 300.0 * rng.choice([-1.0, 1.0], size=int(spikes.sum()))
    return k


def rwkv7_inputs(rng, B, T, H, N, decay="mixed", state=True):
    """[r, log_w, k, v, a, b] as RWKV-7 makes them (a = -kk, b = kk * icl with kk unit-norm per head and icl in
    (0, 1)), each (B, T, H, N), and an initial state (B, H, N, N) (None unless ``state``).
    decay: a key of W_RAW, or "growing" (log_w in (0, 0.1): the formula is defined for any real log_w)."""
    shape = (B, T, H, N)
    r, k, v = (rng.standard_normal(shape) for _ in range(3))
    kk = rng.standard_normal(shape)
    kk /= np.linalg.norm(kk, axis=-1, keepdims=True)
    icl = rng.uniform(0.0, 1.0, shape)
    log_w = rng.uniform(0.0, 0.1, shape) if decay == "growing" else -np.exp(rng.uniform(*W_RAW[decay], shape))
    S0 = rng.standard_normal((B, H, N, N)) if state else None
    return [r, log_w, k, v, -kk, kk * icl], S0


def scan_inputs(rng, batch, dim, N, T, extras=(), delta_scale=1.0):
    """Mamba-like inputs of the selective scan as a dict: A in [-16, -0.5] (its init range -1..-N), raw delta
    uniform in delta_scale * [0.05, 1]. extras: any of "D", "z", "delta_bias", "state"."""
    x = dict(u=rng.standard_normal((batch, dim, T)),
             delta=delta_scale * rng.uniform(0.05, 1.0, (batch, dim, T)),
             A=-rng.uniform(0.5, 16.0, (dim, N)),
             B=rng.standard_normal((batch, N, T)), C=rng.standard_normal((batch, N, T)))
    shapes = dict(D=(dim,), z=(batch, dim, T), delta_bias=(dim,), state=(batch, dim, N))
    for name in extras:
        x[name] = rng.standard_normal(shapes[name])
    return x


def log_decays(rng, shape):
    """Negative log decays -e^{x - 1}, x standard normal (the GPU checks' WKV-4 w and scan A)."""
    return -np.exp(rng.normal(size=shape) - 1.0)


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
