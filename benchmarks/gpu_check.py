"""The day a GPU is at hand: ``python -m seqmix.benchmarks.gpu_check`` checks the Triton path on it and writes one
report, ``benchmarks/results/gpu_check.md`` (``--out`` to change the folder). On a machine without CUDA it prints what
it would do and the pass criteria, and exits 0.

On a CUDA GPU, in order:
1. correct: each Triton op on the device (WKV-4, WKV-7 sequential and chunked, the selective scan, attention, ReRoPE
   prefill and decode; fp32, and bf16 where the op takes it; attention and ReRoPE in fp32 also with
   set_fp32_dot_precision("tf32x3"), whose rounding only a GPU computes), outputs and every gradient against the
   torch backend in float64 on the CPU, within the design's budgets (kernels.testing); the backward twice, bit for
   bit the same.
2. no crash at the documented limits (README, "Shape limits"): decode at B H = 65,536 (grid axis 0); WKV-4 at
   T C > 2^31 and the scan at D T > 2^31 (64-bit offsets): the last channels of the big launch must equal, bit for
   bit, a launch on those channels alone, whose offsets are small.
3. fast as predicted: ``python -m seqmix.benchmarks.run`` (every op beside its GPU peers where installed: fla's
   chunk_rwkv7, flash-attn or SDPA, mamba_ssm's selective scan), its measured / predicted column from the cost
   model (benchmarks/cost_model.py) per forward kernel.

Pass criteria (``CRITERIA``): every comparison of step 1 within budget and deterministic; every launch of step 2
finishes and matches; every kernel of step 3 within 2x of the cost model's prediction, or the report carries an
explanation for it (``--explain kernel=text``). The exit status is 0 only when all hold.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

__all__ = ["CRITERIA", "check_op", "main", "OPS"]

RESULTS = Path(__file__).parent / "results"
CRITERIA = (
    "correct: every Triton output and gradient on the GPU within the design's budget of the torch backend in float64 "
    "(fp32 1e-5, chunked WKV-7 1e-4, bf16 2e-2), and the backward bit for bit the same in two runs",
    "no crash at the documented limits: decode at B H = 65,536; WKV-4 at T C > 2^31; the scan at D T > 2^31; the "
    "big launches' last channels equal to a launch on those channels alone",
    "fast as predicted: each forward kernel's measured time within 2x of the cost model's prediction, or an "
    "explanation in the report",
)


def _decays(rng, shape):
    return -np.exp(rng.normal(size=shape) - 1.0)


def _inputs(op: str, rng, T: int, width: int):
    """NumPy inputs and call options of each op: T steps, ``width`` channels or head size."""
    if op == "wkv4":
        return [_decays(rng, width), rng.normal(size=width), *rng.normal(size=(2, 2, T, width))], {}
    if op in ("wkv7", "wkv7 chunked"):
        x = list(rng.normal(size=(6, 2, T, 2, width)) * 0.5)
        x[1] = _decays(rng, x[1].shape)
        return x, {"chunked": op == "wkv7 chunked"}
    if op == "selective_scan":
        return [*rng.normal(size=(2, 2, width, T)), _decays(rng, (width, 16)), *rng.normal(size=(2, 2, 16, T))], \
            {"delta_softplus": True}
    if op in ("attention", "rerope"):
        return list(rng.normal(size=(3, 2, 4, T, width))), ({"window": 8} if op == "rerope" else {})
    if op == "rerope decode":
        q = rng.normal(size=(2, 4, 1, width))
        return [q, *rng.normal(size=(2, 2, 4, T, width))], {"window": 8}
    raise ValueError(f"unknown op {op!r}")


def _function(op: str):
    """The public function of ``op`` (" tf32x3" ops: the same function, run under that setting by _run)."""
    op = op.removesuffix(TF32X3)
    from seqmix.kernels.attention import attention
    from seqmix.kernels.rerope import rerope_attention, rerope_decode
    from seqmix.kernels.ssm import selective_scan
    from seqmix.kernels.wkv4 import wkv4
    from seqmix.kernels.wkv7 import wkv7
    return {"wkv4": wkv4, "wkv7": wkv7, "wkv7 chunked": wkv7, "selective_scan": selective_scan,
            "attention": attention, "rerope": rerope_attention, "rerope decode": rerope_decode}[op]


TF32X3 = " tf32x3"   # an op name's suffix: fp32 dots as set_fp32_dot_precision("tf32x3") makes them
OPS = ("wkv4", "wkv7", "wkv7 chunked", "selective_scan", "attention", "rerope", "rerope decode",
       "attention" + TF32X3, "rerope" + TF32X3, "rerope decode" + TF32X3)


def _run(op, arrays, options, backend, dtype, device):
    """Output and the gradients of <output, fixed cotangent> with respect to every input."""
    from seqmix.kernels.attention import set_fp32_dot_precision
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
    over the output and the gradients, the budget, and whether a second backward gave the same bits."""
    from seqmix.kernels.testing import FP16_BUDGET, FP32_BUDGET, FP32_CHUNKED_WKV7_BUDGET, rel_rms
    arrays, options = _inputs(op.removesuffix(TF32X3), np.random.default_rng(0), T, width)
    got = _run(op, arrays, options, "triton", dtype, device)
    again = _run(op, arrays, options, "triton", dtype, device)
    want = _run(op, arrays, {k: v for k, v in options.items() if k != "chunked"}, "torch", torch.float64, "cpu")
    budget = (2e-2 if dtype == torch.bfloat16 else FP16_BUDGET if dtype == torch.float16
              else FP32_CHUNKED_WKV7_BUDGET if op == "wkv7 chunked" else FP32_BUDGET)
    error = max(rel_rms(g.cpu(), w) for g, w in zip(got, want))
    same = all(torch.equal(a, b) for a, b in zip(got, again))
    return {"op": op, "dtype": str(dtype).removeprefix("torch."), "error": error, "budget": budget,
            "deterministic": same, "ok": bool(np.isfinite(error) and error <= budget and same)}


def _same_tail(fn, tensors, channel_dims, out_dim, tail, **options) -> bool:
    """fn on the big tensors, and on their last ``tail`` channels alone (``channel_dims``: each tensor's channel
    dimension, None for one without channels): the same bits on those channels of the output."""
    full = fn(*tensors, **options)[0]
    last = lambda t, dim: t.narrow(dim, t.shape[dim] - tail, tail)  # noqa: E731
    alone = fn(*(t if dim is None else last(t, dim).contiguous() for t, dim in zip(tensors, channel_dims)),
               **options)[0]
    return torch.equal(last(full, out_dim), alone)


def check_limits(device="cuda") -> list[dict]:
    """Launches at the documented limits; each row: what, ok, and the error if it crashed."""
    from seqmix.kernels.rerope import rerope_decode
    from seqmix.kernels.ssm import selective_scan
    from seqmix.kernels.wkv4 import wkv4
    g = torch.Generator(device=device).manual_seed(0)
    rand = lambda *shape, dtype=torch.bfloat16: torch.randn(*shape, generator=g, device=device, dtype=dtype)  # noqa
    cases = {
        "rerope decode, B = 2048, H = 32 (B H = 65,536)": lambda: bool(rerope_decode(
            rand(2048, 32, 1, 64), rand(2048, 32, 64, 64), rand(2048, 32, 64, 64), 16, backend="triton").isfinite()
            .all()),
        "wkv4, T = 524,289, C = 4096 (T C > 2^31), bf16": lambda: _same_tail(
            wkv4, [-rand(4096).exp(), rand(4096), rand(1, 524_289, 4096), rand(1, 524_289, 4096)], (0, 0, 2, 2), 2,
            32, backend="triton"),
        "selective scan, D = 8192, T = 262,145 (D T > 2^31), bf16": lambda: _same_tail(
            selective_scan, [rand(1, 8192, 262_145), rand(1, 8192, 262_145).abs(),
                             -rand(8192, 16, dtype=torch.float32).exp(), rand(1, 16, 262_145), rand(1, 16, 262_145)],
            (1, 1, 0, None, None), 1, 16, backend="triton"),
    }
    rows = []
    for what, run in cases.items():
        try:
            rows.append({"what": what, "ok": run()})
        except Exception as e:  # a crash is the finding to report
            rows.append({"what": what, "ok": False, "error": f"{type(e).__name__}: {str(e)[:200]}"})
        torch.cuda.empty_cache()
    return rows


def _plan() -> str:
    steps = __doc__.split("On a CUDA GPU, in order:\n")[1].split("\n\nPass criteria")[0]
    return ("No CUDA device here: nothing was run. On a CUDA GPU this command would run, in order:\n" + steps
            + "\n\nPass criteria:\n" + "\n".join(f"- {c}" for c in CRITERIA)
            + f"\n\nIt would write {RESULTS / 'gpu_check.md'}.")


def _report(correct, limits, timings, explanations) -> tuple[str, bool]:
    lines = ["# GPU check", "", f"Device: {torch.cuda.get_device_name()}", "", "## Pass criteria", ""]
    lines += [f"- {c}" for c in CRITERIA]
    lines += ["", "## 1. Correct", "", "| op | dtype | worst rel RMS | budget | deterministic | ok |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {r['op']} | {r['dtype']} | {r['error']:.2e} | {r['budget']:.0e} | {r['deterministic']} | "
              f"{'yes' if r['ok'] else 'NO'} |" for r in correct]
    lines += ["", "## 2. Documented limits", "", "| launch | ok |", "|---|---|"]
    lines += [f"| {r['what']} | {'yes' if r['ok'] else 'NO ' + r.get('error', '')} |" for r in limits]
    lines += ["", "## 3. Measured / predicted (forward kernels)", "", "| kernel | measured / predicted | ok |",
              "|---|---|---|"]
    for kernel, ratio in timings.items():
        lines.append(f"| {kernel} | {ratio:.3g} | {'yes' if ratio <= 2 else explanations.get(kernel, 'NO')} |")
    passed = (all(r["ok"] for r in correct) and all(r["ok"] for r in limits)
              and all(r <= 2 or k in explanations for k, r in timings.items()))
    return "\n".join(lines + ["", "PASS" if passed else "FAIL"]) + "\n", passed


def _timings(out: Path) -> dict:
    """measured / predicted per forward kernel, from a run of benchmarks.run on this GPU."""
    import json
    subprocess.run([sys.executable, "-m", "seqmix.benchmarks.run", "--out", str(out / "benchmarks")], check=True)
    rows = json.loads((out / "benchmarks" / "results.json").read_text())["cost_model"]
    return {r["kernel"]: r["measured_s"] / r["predicted_s"] for r in rows if "measured_s" in r}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of gpu_check.md")
    parser.add_argument("--explain", action="append", default=[], metavar="KERNEL=TEXT",
                        help="why a kernel is more than 2x off its prediction (repeatable)")
    parser.add_argument("--skip-benchmarks", action="store_true", help="steps 1 and 2 only")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(_plan())
        return 0
    correct = [check_op(op, dtype) for op in OPS for dtype in (torch.float32, torch.bfloat16)
               if not (dtype == torch.bfloat16 and (op.startswith("selective") or op.endswith(TF32X3)))]
    limits = check_limits()
    timings = {} if args.skip_benchmarks else _timings(args.out)
    explanations = dict(e.split("=", 1) for e in args.explain)
    text, passed = _report(correct, limits, timings, explanations)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.md").write_text(text)
    print(text)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
