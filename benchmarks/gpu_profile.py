"""gpu_check's profile part: where the chunked WKV-7's time goes, kernel by kernel, beside fla's ``chunk_rwkv7``.

The first GPU run (benchmarks/README.md) measured seqmix's chunked WKV-7 forward at 1.7-1.9x fla's chunk_rwkv7
(fp32, B 1, T 2048, H 12, N 64); the suspected cause is its launch, not its arithmetic: the forward's serial pass
over T / 16 chunks runs one program per head and 16 value rows, B H N / 16 = 48 programs on an H100's 132 SMs. This
part measures it: torch.profiler's CUDA activity over a few forward and forward + backward calls of both, at the
WKV-7 benchmark shape, fp32 then bf16; one row per kernel name with its calls, total and mean CUDA time and its share
of the case's kernel time, and the launch grid (number of programs) of each Triton launch whose grid is a tuple
(seqmix's wrappers pass tuples; fla's kernels too, where their launchers do), beside the device's SM count.

On a dry run (no CUDA) it walks the same cases: our kernels' grids at the dry shapes, each row saying that the
profiler's CUDA times need a CUDA device. fla's first call in a process autotunes for minutes (over 120 s in run 3):
a case of fla that the peers part did not time in this process starts only with FLA_FIRST_CALL_S left.
"""
from __future__ import annotations

import contextlib
import math

import torch

from .gpu_timing import _fla, _shape_text, backward, describe, inputs_at, seqmix_call

__all__ = ["ENTRY", "FLA_FIRST_CALL_S", "STEPS", "kernel_times", "launches", "part_profile", "profile_case"]

ENTRY = "wkv7 chunked"          # gpu_timing's entry profiled (the shape is the WKV-7 benchmark's)
STEPS = 5                       # calls profiled per case, after two warm-up calls
FLA_FIRST_CALL_S = 150.0        # time left that an fla case not yet timed in this process needs to start
NO_CUDA = "no CUDA device: the profiler's CUDA times need one (grids as launched at the dry shape)"


def part_profile(run, emit):
    """For each dtype, implementation and mode: one row per kernel (see the module's docstring)."""
    if not run.wants(ENTRY):
        return
    fla, why_not_fla = _fla()
    timed = {(r["impl"], r["dtype"], r["mode"]) for p in run.record["parts"] if p["name"] == "peers"
             for r in p["rows"] if "median_s" in r}
    sms = None if run.dry else torch.cuda.get_device_properties(run.device).multi_processor_count
    for dtype in ("fp32",) if run.dry else ("fp32", "bf16"):   # a dry run: the interpreter's bf16 dots are wrong
        make = inputs_at(run, ENTRY, dtype)
        impls = {"seqmix wkv7 chunked": seqmix_call(run, ENTRY, "triton"),
                 **{f"fla {form}": fla and (lambda x, f=fla[form]: f(**x)) or why_not_fla
                    for form in ("chunk_rwkv7", "chunk_rwkv7 layer form")}}
        for impl, call in impls.items():
            for mode in ("forward", "forward+backward"):
                case = {"op": "wkv7", "shape": _shape_text(run, ENTRY), "dtype": dtype, "impl": impl, "mode": mode}
                why = _why_not(run, impl, call, (impl, dtype, mode) in timed)
                if why:
                    emit({**case, **why})
                    continue
                try:
                    rows = profile_case(run, call, make, mode)
                except Exception as e:
                    rows = [{"error": describe(e)}]
                for row in rows:
                    emit({**case, **row, **({"sms": sms} if sms else {})})
                run.check_context(f"profile {impl} {dtype} {mode}")


def _why_not(run, impl: str, call, timed: bool) -> dict:
    """{"skipped" or "stopped": why} for a case that does not run now, else {}."""
    if isinstance(call, str):
        return {"skipped": call}
    if run.out_of_time():
        return {"stopped": "time budget spent"}
    left = run.seconds_left()
    if impl.startswith("fla") and not timed and left is not None and left < FLA_FIRST_CALL_S:
        return {"stopped": f"fla's first call autotunes for minutes; {left:.0f} s left"}
    return {}


def profile_case(run, call, make, mode: str) -> list[dict]:
    """Rows of one case: a first call whose Triton launches' grids are recorded, a second, then STEPS calls under
    torch.profiler (CUDA activity): per kernel name, its calls, total and mean seconds and share of the kernels' time,
    and its grid where one was recorded; last a row "(all kernels)". On a dry run, the grids alone."""
    x = make(requires_grad=mode != "forward")
    step = (lambda: backward(call(x), x)) if mode != "forward" else torch.no_grad()(lambda: call(x))
    with launches() as grids:
        step()
    if run.dry:
        return [{"kernel": name, "calls_per_step": len(g), **_grid(g), "cuda_s": NO_CUDA} for name, g in grids.items()]
    step()
    run.sync()
    times = _profiled(step)
    if not times:   # not a fault of the kernels: say so without failing the run
        return [{"skipped": "the profiler recorded no CUDA kernel (no CUPTI activity on this machine?)"}]
    total = sum(t for _, t in times.values())
    rows = [{"kernel": name[:120], "calls": n, "calls_per_step": n / STEPS, "total_s": t, "mean_s": t / n,
             "share": t / total, **_grid(_launched_as(name, grids))}
            for name, (n, t) in sorted(times.items(), key=lambda item: -item[1][1])]
    calls = sum(n for n, _ in times.values())
    return rows + [{"kernel": "(all kernels)", "calls": calls, "calls_per_step": calls / STEPS, "total_s": total,
                    "mean_s": total / calls, "per_step_s": total / STEPS, "share": 1.0}]


def _profiled(step) -> dict:
    """kernel_times of STEPS calls of ``step`` under torch.profiler's CUDA activity."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
    return kernel_times(prof.events(), torch.autograd.DeviceType.CUDA)


def kernel_times(events, device_type) -> dict:
    """{name: (calls, total seconds)} of the profiler's events (``prof.events()``) on ``device_type``: on CUDA the
    kernels, copies and fills that ran on the device."""
    found = {}
    for e in events:
        if e.device_type == device_type:
            n, t = found.get(e.name, (0, 0.0))
            found[e.name] = (n + 1, t + e.time_range.elapsed_us() / 1e6)
    return found


def _launched_as(name: str, grids: dict) -> list:
    """The grids recorded for the profiler's kernel ``name``: the Triton function of that name, else the one with the
    longest name that it contains (a compiler may decorate the name); [] for kernels not launched by Triton."""
    return grids.get(max((k for k in grids if k in name), key=len, default=None), [])   # the name itself is longest


def _grid(grids: list) -> dict:
    """"grid" and "programs" of a kernel's launches: each distinct tuple grid, and its number of programs."""
    shapes = list(dict.fromkeys(tuple(g) for g in grids if isinstance(g, (tuple, list))))
    if not shapes:
        return {"grid": None, "programs": None}
    return {"grid": ", ".join("x".join(map(str, g)) for g in shapes),
            "programs": ", ".join(str(math.prod(g)) for g in shapes)}


@contextlib.contextmanager
def launches():
    """{kernel name: [grid of each launch]} of the Triton launches made inside the block (``kernel[grid](...)``
    calls ``run(..., grid=grid)`` of the JIT's or the interpreter's function, whichever the kernels are); the
    functions' own run is put back on leaving."""
    from triton.runtime.jit import JITFunction
    classes = [JITFunction]
    with contextlib.suppress(ImportError):
        from triton.runtime.interpreter import InterpretedFunction
        classes.append(InterpretedFunction)
    seen: dict = {}

    def recording(original):
        def run(fn, *args, grid, **kwargs):
            seen.setdefault(fn.fn.__name__, []).append(grid)
            return original(fn, *args, grid=grid, **kwargs)
        return run
    originals = {cls: cls.__dict__["run"] for cls in classes if "run" in cls.__dict__}
    for cls, original in originals.items():
        cls.run = recording(original)
    try:
        yield seen
    finally:
        for cls, original in originals.items():
            cls.run = original
