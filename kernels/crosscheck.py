"""Headless cross-check of every formula: ``python -m seqmix.kernels.crosscheck`` (or ``python3 dev.py report``).

Runs each op on small seeded inputs: the float64 reference forms against each other, then the torch backend, the
Triton backend (under the interpreter when there is no GPU) and, for the recurrences, the C loops in fp32 against
the reference, and prints one table
row per comparison with the relative RMS error, the max abs error and the design's budget. Exit status 1 if any
comparison is out of budget. The tests check much more (gradients, states, awkward shapes, bad input); this is the
one-screen summary.
"""
from __future__ import annotations

import sys

import numpy as np

import seqmix

MODE = seqmix.use_interpreter_without_gpu()   # before anything imports triton

from seqmix.kernels import attention, native, rerope, ssm, wkv4, wkv7  # noqa: E402
from seqmix.kernels.testing import (FP32_BUDGET, FP32_CHUNKED_WKV7_BUDGET, HAS_TRITON, REFERENCE_BUDGET,  # noqa: E402
                                    fp32, max_abs, rel_rms)
from seqmix.reference import attention as ref_attention  # noqa: E402
from seqmix.reference import rope as ref_rope  # noqa: E402
from seqmix.reference import ssm as ref_ssm  # noqa: E402
from seqmix.reference import wkv4 as ref_wkv4  # noqa: E402
from seqmix.reference import wkv7 as ref_wkv7  # noqa: E402

__all__ = ["main"]

BACKENDS = ("torch", "triton") if HAS_TRITON else ("torch",)
# The recurrences also have C loops (kernels/native.c) where a C compiler builds them.
RECURRENCE_BACKENDS = BACKENDS + (() if native.unavailable_reason() else ("c",))


def attention_rows(rng):
    q, k, v = rng.normal(size=(3, 2, 2, 37, 16))
    truth = ref_attention.softmax_attention(q, k, v)
    yield "softmax attention", "explicit sums", ref_attention.attention_sums(q, k, v), truth, REFERENCE_BUDGET
    yield "softmax attention", "online form", ref_attention.online_softmax_attention(q, k, v, block_size=8), truth, \
        REFERENCE_BUDGET
    for backend in BACKENDS:
        yield "softmax attention", f"kernel, {backend}", attention.attention(*fp32(q, k, v), backend=backend), truth, \
            FP32_BUDGET


def rope_rows(rng):
    q, k, v = rng.normal(size=(3, 2, 2, 37, 16))
    pos = np.arange(37)
    truth = ref_attention.softmax_attention(ref_rope.apply_rope(q, pos), ref_rope.apply_rope(k, pos), v)
    rel = ref_rope.relative_positions(37, "rope")
    yield "RoPE", "per-pair definition", ref_rope.attention_from_relative_positions(q, k, v, rel), truth, \
        REFERENCE_BUDGET
    for leaky_k, name in ((None, "ReRoPE"), (8.0, "Leaky ReRoPE")):
        rel = ref_rope.relative_positions(37, "rerope" if leaky_k is None else "leaky_rerope", window=10, k=leaky_k)
        scaled_q = q * ref_rope.log_n_scale(pos, 16)[:, None]
        truth = ref_rope.attention_from_relative_positions(scaled_q, k, v, rel)
        prefill = ref_rope.rerope_attention(q, k, v, 10, leaky_k=leaky_k, train_length=16)
        yield name, "two-pass prefill", prefill, truth, REFERENCE_BUDGET
        decode = ref_rope.rerope_decode(q[..., -1:, :], k, v, 10, leaky_k=leaky_k, train_length=16)
        yield name, "one-pass decode", decode, truth[..., -1:, :], REFERENCE_BUDGET
        for backend in BACKENDS:
            out = rerope.rerope_attention(*fp32(q, k, v), 10, leaky_k=leaky_k, train_length=16, backend=backend)
            yield name, f"kernel prefill, {backend}", out, truth, FP32_BUDGET
            out = rerope.rerope_decode(*fp32(q[..., -1:, :], k, v), 10, leaky_k=leaky_k, train_length=16,
                                       backend=backend)
            yield name, f"kernel decode, {backend}", out, truth[..., -1:, :], FP32_BUDGET


def wkv4_rows(rng):
    C = 12
    w, u = -np.exp(rng.normal(size=C)), rng.normal(size=C)
    k, v = rng.normal(size=(2, 2, 29, C)) * 3
    truth = ref_wkv4.wkv4_quadratic(w, u, k, v)
    yield "RWKV-4 WKV", "N/D recurrence", ref_wkv4.wkv4_recurrent(w, u, k, v)[0], truth, REFERENCE_BUDGET
    yield "RWKV-4 WKV", "max-tracked recurrence", ref_wkv4.wkv4(w, u, k, v)[0], truth, REFERENCE_BUDGET
    k = rng.uniform(-300, 300, size=k.shape)                       # keys that overflow the plain forms
    truth = ref_wkv4.wkv4(w, u, k, v)[0]
    for backend in RECURRENCE_BACKENDS:
        yield "RWKV-4 WKV, keys in [-300, 300]", f"kernel, {backend}", \
            wkv4.wkv4(*fp32(w, u, k, v), backend=backend)[0], truth, FP32_BUDGET


def wkv7_rows(rng):
    B, T, H, N = 2, 37, 2, 16
    r, k, v = rng.normal(size=(3, B, T, H, N))
    log_w = -np.exp(rng.uniform(-6, -0.5, size=(B, T, H, N)))      # decays from 0.55 to ~1
    kk = rng.normal(size=(B, T, H, N))
    kk /= np.linalg.norm(kk, axis=-1, keepdims=True)
    icl = rng.uniform(0, 1, size=(B, T, H, N))
    args = (r, log_w, k, v, -kk, kk * icl)
    truth = ref_wkv7.wkv7(*args)[0]
    yield "RWKV-7 WKV", "transition product", ref_wkv7.wkv7_transition_product(*args)[0], truth, REFERENCE_BUDGET
    yield "RWKV-7 WKV", "chunked WY form", ref_wkv7.wkv7_chunked(*args, chunk_size=16)[0], truth, REFERENCE_BUDGET
    budgets = {"torch": FP32_CHUNKED_WKV7_BUDGET, "triton": FP32_BUDGET, "c": FP32_BUDGET}
    for backend in RECURRENCE_BACKENDS:
        yield "RWKV-7 WKV", f"kernel, {backend}", wkv7.wkv7(*fp32(*args), backend=backend)[0], truth, budgets[backend]


def ssm_rows(rng):
    A = rng.normal(size=(4, 4)) - 3 * np.eye(4)
    Bm = rng.normal(size=(4, 1))
    A_bar, B_bar = ref_ssm.discretize_zoh(A, Bm, 0.1)
    closed = np.linalg.solve(A, (ref_ssm.expm(0.1 * A) - np.eye(4)) @ Bm)
    yield "ZOH", "augmented expm vs A^-1 (e^{dA} - I) B", B_bar, closed, REFERENCE_BUDGET
    C, u = rng.normal(size=(1, 4)), rng.normal(size=(50, 1))
    y, _ = ref_ssm.ssm_recurrence(A_bar, B_bar, C, u)
    K = ref_ssm.ssm_kernel(A_bar, B_bar, C, 50)
    yield "SSM", "convolution kernel vs recurrence", ref_ssm.causal_convolution(K, u), y, REFERENCE_BUDGET
    batch, D, N, T = 2, 8, 16, 37
    u, z = rng.normal(size=(2, batch, D, T))
    delta = rng.normal(size=(batch, D, T))
    A = -np.exp(rng.normal(size=(D, N)))
    Bs, Cs = rng.normal(size=(2, batch, N, T))
    Dskip, bias = rng.normal(size=(2, D))
    truth = ref_ssm.selective_scan(u, delta, A, Bs, Cs, Dskip, z, bias, delta_softplus=True)[0]
    for backend in RECURRENCE_BACKENDS:
        out = ssm.selective_scan(*fp32(u, delta, A, Bs, Cs, Dskip, z, bias), delta_softplus=True, backend=backend)[0]
        yield "Mamba selective scan", f"kernel, {backend}", out, truth, FP32_BUDGET


def main() -> int:
    rng = np.random.default_rng(0)
    print(f"Triton: {'not installed' if not HAS_TRITON else MODE}\n")
    header = f"| {'formula':<32} | {'computation':<40} | rel RMS  | max abs  | budget | ok |"
    print(header + "\n|" + "|".join("-" * (len(c) + 0) for c in header.split("|")[1:-1]) + "|")
    failures = 0
    for rows in (attention_rows, rope_rows, wkv4_rows, wkv7_rows, ssm_rows):
        for formula, what, actual, expected, budget in rows(rng):
            err, worst = rel_rms(actual, expected), max_abs(actual, expected)
            ok = bool(np.isfinite(err) and err <= budget)
            failures += not ok
            print(f"| {formula:<32} | {what:<40} | {err:.1e}  | {worst:.1e}  | {budget:.0e} | "
                  f"{'yes' if ok else 'NO'} |", flush=True)
    print(f"\n{'all comparisons within budget' if not failures else f'{failures} comparisons OUT OF BUDGET'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
