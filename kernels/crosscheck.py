"""Headless cross-check of every formula: ``python -m seqmix.kernels.crosscheck`` (or ``python3 dev.py report``).

Two parts, one table. First the float64 reference forms against each other (the explicit sums, the online and
chunked forms, the transition product, ZOH: the forms a notebook derives). Then every op of the registry
(kernels/registry.py) on each of its backends available here (Triton under the interpreter when there is no GPU;
the C loops where a C compiler builds them), in fp32 on one case of its battery declaration, against its float64
reference. One row per comparison with the relative RMS error, the max abs error and the budget. Exit status 1 if
any comparison is out of budget. The tests check much more (gradients, states, awkward shapes, bad input); this is
the one-screen summary.
"""
from __future__ import annotations

import sys

import numpy as np
import torch

from . import use_interpreter_without_gpu

MODE = use_interpreter_without_gpu()   # before anything imports triton

from ..reference import attention as ref_attention  # noqa: E402
from ..reference import rope as ref_rope  # noqa: E402
from ..reference import ssm as ref_ssm  # noqa: E402
from ..reference import wkv4 as ref_wkv4  # noqa: E402
from ..reference import wkv7 as ref_wkv7  # noqa: E402
from .declarations import call, state_tensors  # noqa: E402
from .registry import REGISTRY, OpSpec  # noqa: E402
from .testing import HAS_TRITON, REFERENCE_BUDGET, max_abs, rel_rms  # noqa: E402

__all__ = ["main", "available_backends", "crosscheck_case", "kernel_rows",
           "REFERENCE_FORMS"]


def available_backends(op: OpSpec) -> list[str]:
    """The op's backends that can run here, by name: each whose ``verify`` takes a CPU fp32 call (the Triton
    interpreter and the C loops where they exist), torch always."""
    from .backends import Call
    probe = Call(op.name, torch.device("cpu"), torch.float32)
    return [b.name for b in op.get("backends") if b.verify(probe) is None]


def crosscheck_case(battery):
    """The case the cross-check runs: the battery's split case (a long one with a state), else its first "shapes"
    case of at least 32 tokens, else its last case."""
    if battery.split is not None:
        return battery.split
    return next((c for c in battery.cases if c.group == "shapes" and c.params.get("T", 0) >= 32), battery.cases[-1])


def kernel_rows(op: OpSpec, rng):
    """(formula, computation, actual, expected, budget) of ``op`` on each available backend, in fp32, against its
    float64 reference: the output, and for a stateful op its final state's first part."""
    battery = op.get("battery")
    case = crosscheck_case(battery)
    x = battery.make(rng, **case.params)
    expected = call(battery, op.get("reference"), x.tensors, x.options, x.state)
    expected = expected[0] if battery.stateful else expected
    tensors = {n: torch.tensor(a, dtype=torch.float32) for n, a in x.tensors.items()}
    state = state_tensors(x.state, torch.float32)
    for backend in available_backends(op):
        actual = call(battery, op.function, tensors, {**x.options, "backend": backend}, state)
        actual = actual[0] if battery.stateful else actual
        yield op.title, f"kernel, {backend}", actual.double().numpy(), expected, battery.fp32_budget


# ---------------------------------------------------------------------------------- the reference forms, in float64

def attention_forms(rng):
    q, k, v = rng.normal(size=(3, 2, 2, 37, 16))
    truth = ref_attention.softmax_attention(q, k, v)
    yield "softmax attention", "explicit sums", ref_attention.attention_sums(q, k, v), truth, REFERENCE_BUDGET
    yield "softmax attention", "online form", ref_attention.online_softmax_attention(q, k, v, block_size=8), truth, \
        REFERENCE_BUDGET


def rope_forms(rng):
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


def wkv4_forms(rng):
    C = 12
    w, u = -np.exp(rng.normal(size=C)), rng.normal(size=C)
    k, v = rng.normal(size=(2, 2, 29, C)) * 3
    truth = ref_wkv4.wkv4_quadratic(w, u, k, v)
    yield "RWKV-4 WKV", "N/D recurrence", ref_wkv4.wkv4_recurrent(w, u, k, v)[0], truth, REFERENCE_BUDGET
    yield "RWKV-4 WKV", "max-tracked recurrence", ref_wkv4.wkv4(w, u, k, v)[0], truth, REFERENCE_BUDGET


def wkv7_forms(rng):
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


def ssm_forms(rng):
    A = rng.normal(size=(4, 4)) - 3 * np.eye(4)
    Bm = rng.normal(size=(4, 1))
    A_bar, B_bar = ref_ssm.discretize_zoh(A, Bm, 0.1)
    closed = np.linalg.solve(A, (ref_ssm.expm(0.1 * A) - np.eye(4)) @ Bm)
    yield "ZOH", "augmented expm vs A^-1 (e^{dA} - I) B", B_bar, closed, REFERENCE_BUDGET
    C, u = rng.normal(size=(1, 4)), rng.normal(size=(50, 1))
    y, _ = ref_ssm.ssm_recurrence(A_bar, B_bar, C, u)
    K = ref_ssm.ssm_kernel(A_bar, B_bar, C, 50)
    yield "SSM", "convolution kernel vs recurrence", ref_ssm.causal_convolution(K, u), y, REFERENCE_BUDGET


# The references' alternative forms, by formula (RoPE and ZOH are formulas without an op of their own); the ops
# themselves come from the registry.
REFERENCE_FORMS = (attention_forms, rope_forms, wkv4_forms, wkv7_forms, ssm_forms)


def all_rows(rng):
    """Every row: the reference forms, then each registered op on each backend available here."""
    for forms in REFERENCE_FORMS:
        yield from forms(rng)
    for op in REGISTRY:
        yield from kernel_rows(op, rng)


def main() -> int:
    rng = np.random.default_rng(0)
    print(f"Triton: {'not installed' if not HAS_TRITON else MODE}\n")
    header = f"| {'formula':<32} | {'computation':<40} | rel RMS  | max abs  | budget | ok |"
    print(header + "\n|" + "|".join("-" * (len(c) + 0) for c in header.split("|")[1:-1]) + "|")
    failures = 0
    for formula, what, actual, expected, budget in all_rows(rng):
        err, worst = rel_rms(actual, expected), max_abs(actual, expected)
        ok = bool(np.isfinite(err) and err <= budget)
        failures += not ok
        print(f"| {formula:<32} | {what:<40} | {err:.1e}  | {worst:.1e}  | {budget:.0e} | "
              f"{'yes' if ok else 'NO'} |", flush=True)
    print(f"\n{'all comparisons within budget' if not failures else f'{failures} comparisons OUT OF BUDGET'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
