"""What gpu_check checks: each Triton op against the float64 reference (the conformance battery) and against itself
(two runs, the same bits), the launches at the documented shape limits, and the first calls that pay the compiles.
``run`` is gpu_check's Run: device, shapes, deadline, and ``run.each``, which spreads items over worker processes.
"""
from __future__ import annotations

import functools
import time

import numpy as np
import torch

from .gpu_timing import COST_KERNELS, ENTRIES, VARIANTS, backward, describe, inputs_at, \
    op_function, seqmix_call

__all__ = ["BATTERY", "CHECKED", "HEAD_SIZES", "OPS", "TF32X3", "check_limits", "check_op", "compile_item",
           "correct_item", "determinism_item", "part_compile", "part_correct", "part_determinism", "part_limits"]

TF32X3 = " tf32x3"   # an op name's suffix: fp32 dots as set_fp32_dot_precision("tf32x3") makes them

# Each op on each Triton backend once: the entries of COST_KERNELS but the variants (other benchmark shapes of the
# same kernels, "attention d=128"); the checks choose their own shapes.
CHECKED = {name: entry for name, entry in ENTRIES.items() if name not in VARIANTS}

# check_op's ops: the names of CHECKED and BATTERY, and the flash ops again with tf32x3 dots.
OPS = (*CHECKED, *(name + TF32X3 for name, (op, _) in CHECKED.items() if op.family == "attention"))

# The battery's op of each Triton function checked (WKV-7's chunked form is a backend of its own).
BATTERY = {name: op.name for name, (op, _) in CHECKED.items()}

# Head sizes the Triton kernels take, where an op's cases have others (the op's Benchmark.check_heads, per backend)
HEAD_SIZES = {name: op.get("benchmark").check_heads[backend] for name, (op, backend) in CHECKED.items()
              if backend in op.get("benchmark").check_heads}


def _inputs(op: str, rng, T: int, width: int):
    """NumPy inputs and call options of a check_op op (without " tf32x3"), as its declaration makes them
    (``Benchmark.check``): T steps, ``width`` channels or head size."""
    if op not in ENTRIES:
        raise ValueError(f"unknown op {op!r}")
    return ENTRIES[op][0].get("benchmark").check(rng, T, width)


def _function(op: str):
    """The public function of a check_op op (" tf32x3" ops: the same function, run under that setting by _run)."""
    return op_function(op.removesuffix(TF32X3))


def _triton_function(name: str):
    """The seqmix op of a BATTERY name on the Triton backend, as the battery calls it."""
    return functools.partial(op_function(name), backend=_triton_backend(name))


def _triton_backend(op: str) -> str:
    """The Triton backend of a check_op op (WKV-7's chunked form is a backend of its own)."""
    return ENTRIES[op.removesuffix(TF32X3)][1]


def _run(op, arrays, options, backend, dtype, device):
    """Output and the gradients of <output, fixed cotangent> with respect to every input."""
    from ..kernels.attention import set_fp32_dot_precision
    x = [torch.tensor(a, dtype=dtype, device=device, requires_grad=True) for a in arrays]
    previous = set_fp32_dot_precision("tf32x3" if op.endswith(TF32X3) else "ieee")
    try:
        out = _function(op)(*x, backend=backend, **options)
    finally:
        set_fp32_dot_precision(previous)
    y = out[0] if isinstance(out, tuple) else out
    cotangent = torch.tensor(np.random.default_rng(1).normal(size=tuple(y.shape)), dtype=dtype, device=device)
    (y * cotangent).sum().backward()
    return [y.detach(), *(z.grad for z in x)]


def check_op(op: str, dtype=torch.float32, device="cuda", T: int = 300, width: int = 64) -> dict:
    """One op on ``device`` (Triton) against the torch backend in float64 on the CPU: the worst relative RMS error
    over the output and the gradients, the budget, and whether a second run gave the same bits."""
    from ..kernels.testing import FP16_BUDGET, FP32_BUDGET, rel_rms
    arrays, options = _inputs(op.removesuffix(TF32X3), np.random.default_rng(0), T, width)
    got = _run(op, arrays, options, _triton_backend(op), dtype, device)
    again = _run(op, arrays, options, _triton_backend(op), dtype, device)
    want = _run(op, arrays, options, "torch", torch.float64, "cpu")
    spec, backend = ENTRIES[op.removesuffix(TF32X3)]
    budget = (2e-2 if dtype == torch.bfloat16 else FP16_BUDGET if dtype == torch.float16
              else spec.get("benchmark").fp32_budgets.get(backend, FP32_BUDGET))
    error = max(rel_rms(g.cpu(), w) for g, w in zip(got, want))
    same = all(torch.equal(a, b) for a, b in zip(got, again))
    return {"op": op, "dtype": str(dtype).removeprefix("torch."), "error": error, "budget": budget,
            "deterministic": same, "ok": bool(np.isfinite(error) and error <= budget and same)}


def _same_tail(fn, tensors, channel_dims, out_dim, tail, **options) -> dict:
    """fn on the big tensors, and on their last ``tail`` channels alone (``channel_dims``: each tensor's channel
    dimension, None for one without channels): an offset that wraps past 2^31 reads or writes the wrong channels,
    which the relative RMS difference of those channels of the output shows (ok within the bf16 budget, 2e-2).
    Bit-equality is recorded too but not required: the launch configuration may differ with the channel count."""
    from ..kernels.testing import rel_rms
    full = fn(*tensors, **options)[0]
    last = lambda t, dim: t.narrow(dim, t.shape[dim] - tail, tail)  # noqa: E731
    alone = fn(*(t if dim is None else last(t, dim).contiguous() for t, dim in zip(tensors, channel_dims)),
               **options)[0]
    mine = last(full, out_dim)
    error = rel_rms(mine.double().cpu(), alone.double().cpu())
    return {"ok": bool(np.isfinite(error) and error <= 2e-2), "rel_rms": error, "bit_equal": torch.equal(mine, alone)}


def check_limits(device="cuda", small=False):
    """Launches at the documented limits (``small``: the same launches on tiny shapes, for --dry-run); yields
    rows: what, ok, and the error if it crashed."""
    from ..kernels.rerope import rerope_decode
    from ..kernels.ssm import selective_scan
    from ..kernels.wkv4 import wkv4
    g = torch.Generator(device=device).manual_seed(0)
    rand = lambda *shape, dtype=torch.bfloat16: torch.randn(*shape, generator=g, device=device, dtype=dtype)  # noqa
    B, H, T4, C, D, Ts = (2, 2, 5, 64, 32, 5) if small else (2048, 32, 524_289, 4096, 8192, 262_145)
    cases = {
        f"rerope decode, B = {B}, H = {H} (B H = {B * H:,})": lambda: {"ok": bool(rerope_decode(
            rand(B, H, 1, 64), rand(B, H, 64, 64), rand(B, H, 64, 64), 16, backend="triton").isfinite().all())},
        f"wkv4, T = {T4:,}, C = {C} (T C {'>' if T4 * C > 2**31 else '<'} 2^31), bf16": lambda: _same_tail(
            wkv4, [-rand(C).exp(), rand(C), rand(1, T4, C), rand(1, T4, C)], (0, 0, 2, 2), 2, 32, backend="triton"),
        f"selective scan, D = {D}, T = {Ts:,} (D T {'>' if D * Ts > 2**31 else '<'} 2^31), bf16": lambda: _same_tail(
            selective_scan, [rand(1, D, Ts), rand(1, D, Ts).abs(), -rand(D, 16, dtype=torch.float32).exp(),
                             rand(1, 16, Ts), rand(1, 16, Ts)], (1, 1, 0, None, None), 1, 16, backend="triton"),
    }
    for what, run in cases.items():
        try:
            yield {"what": what, **run()}
        except Exception as e:  # a crash is the finding to report
            yield {"what": what, "ok": False, "error": f"{type(e).__name__}: {str(e)[:200]}"}
        if device == "cuda":
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------- the parts


def part_compile(run, emit):
    """Each op's first forward and backward at the benchmark shapes, then its second: the first pays the compiles."""
    dtypes = ("fp32",) if run.dry else ("fp32", "bf16")   # a dry run: the code's walk, not its compiles
    run.each(emit, compile_item, [(op, dtype) for op in COST_KERNELS for dtype in dtypes if run.wants(op)])


def compile_item(run, op: str, dtype: str) -> dict:
    make, call = inputs_at(run, op, dtype), seqmix_call(run, op, "triton")
    torch.ones(1, device=run.device).sum().item()   # the process's CUDA start, out of the first call's time
    before, times = run.compiles.now(), []
    try:
        for _ in range(2):
            x = make(requires_grad=True)
            t0 = time.perf_counter()
            backward(call(x), x)
            run.sync()
            times.append(time.perf_counter() - t0)
        return {"op": op, "dtype": dtype, "first_s": times[0], "second_s": times[1], **run.compiles.since(before)}
    except Exception as e:
        return {"op": op, "dtype": dtype, "error": describe(e), **run.compiles.since(before)}


def part_correct(run, emit):
    """The conformance battery on each Triton op, one row per op and dtype."""
    # fp32 alone on a dry run: the interpreter is slow, and computes bf16 dots wrongly
    # (tests/conformance/test_conformance.py
    # runs the Triton ops at fp32 and fp16 there).
    dtypes = ("fp32",) if run.dry else ("fp32", "fp16", "bf16")
    run.each(emit, correct_item, [(name, dtype) for name in BATTERY for dtype in dtypes if run.wants(name)])


def correct_item(run, name: str, dtype: str) -> dict:
    from ..conformance import battery
    from ..kernels.testing import poisoned_outputs
    limits = dict(max_len=7, parts=("shapes",)) if run.dry else {}   # a dry run: a few short cases
    before, t0 = run.compiles.now(), time.perf_counter()
    options = battery.Options(dtypes=(dtype,), device=run.device, head_sizes=HEAD_SIZES.get(name), **limits)
    with poisoned_outputs():
        report = battery.run(BATTERY[name], _triton_function(name), options)
    graded = [r for r in report.rows if r.error is not None]
    worst = max(graded, key=lambda r: r.error / r.budget, default=None)
    failed = [r for r in report.rows if not r.passed]
    return {"op": name, "dtype": dtype, "checks": len(report.checks), "rows": len(report.rows),
            "failed": len(failed), "worst": worst and f"{worst.error:.2e} ({worst.what}, {worst.check})",
            "seconds": round(time.perf_counter() - t0, 2), **run.compiles.since(before), "ok": report.ok,
            "failures": [f"{r.check} {r.what}: {r.message or f'{r.error:.2e}'}" for r in failed]}


def part_determinism(run, emit):
    """check_op: each op twice at T = 300 (tiny on a dry run), the same bits, within budget of float64 torch."""
    dtypes = ("float32",) if run.dry else ("float32", "bfloat16")   # as part_correct
    run.each(emit, determinism_item, [(op, dtype) for op in OPS for dtype in dtypes
                                      if run.wants(op) and not (dtype == "bfloat16" and op.endswith(TF32X3))])


def determinism_item(run, op: str, dtype: str) -> dict:
    from ..kernels.testing import poisoned_outputs
    try:
        with poisoned_outputs():
            return check_op(op, getattr(torch, dtype), run.device, **(dict(T=5, width=16) if run.dry else {}))
    except Exception as e:
        return {"op": op, "dtype": dtype, "ok": False, "error": describe(e)}


def part_limits(run, emit):
    for row in check_limits(run.device, small=run.dry):
        emit(row)
        run.check_context(row["what"])
