"""The parts of the GPU run (benchmarks/gpu_round.py) after its correctness phase: each a function ``part(run, emit)``
that emits one row (a dict) per measurement, with the GPU to itself. ``run`` is gpu_check's Run (device, shapes,
deadline, dry); the timings are gpu_timing's (CUDA events, then the GPU's own time of calls queued behind a sleep,
``gpu_s``), side by side in one process, so that their ratios compare like with like.

- fla: the chunked WKV-7 (backend "triton_chunked") and the sequential one ("triton") beside fla's two chunk forms
  (``chunk_rwkv7`` as the benchmark called it, chunks of 16; and as fla's own layer calls it, the safe gate with
  chunks of 64), forward and forward + backward, bf16 and fp32, at B 1 T 2048 H 12 and B 4 T 4096 H 32 (N 64); then
  each form's error against float64 at the first shape;
- chain: the redesign's serial floor (benchmarks/gpu_chain.py);
- decode: ReRoPE decode on each of its Triton backends beside the cost model's prediction, and its kernels one by one;
- attn32: the fp32 flash forward with each fp32 product setting (set_fp32_dot_precision) beside SDPA's fp32;
- flash_rate: the bf16 flash kernels at a shape that fills the GPU, beside SDPA's flash backend, in TFLOP/s;
- profile: the chunked WKV-7 and fla's forms kernel by kernel (gpu_profile).
"""
from __future__ import annotations

import copy

import torch

from . import gpu_profile, gpu_timing
from .gpu_timing import backward, describe, inputs_at, seqmix_call, time_step

__all__ = ["PARTS", "WKV7_SHAPES", "FLASH_RATE_SHAPES", "at_shapes", "fla_forms", "part_attn32", "part_chain",
           "part_decode", "part_fla", "part_flash_rate", "part_profile", "warm_chain", "warm_fla", "wkv7_shapes"]

# The two WKV-7 shapes (N = 64), and gpu_round --dry's tiny ones
WKV7_SHAPES = {"B1 T2048 H12": dict(B=1, T=2048, H=12, N=64), "B4 T4096 H32": dict(B=4, T=4096, H=32, N=64)}
DRY_WKV7_SHAPES = {"B1 T16 H2": dict(B=1, T=16, H=2, N=16), "B2 T32 H2": dict(B=2, T=32, H=2, N=16)}
# flash_rate: B H = 128 heads of T = 4096, 4096 query tiles of 128 rows, about 31 per SM on an H100
FLASH_RATE_SHAPES = {"attention": dict(B=4, H=32, T=4096, d=64), "attention d=128": dict(B=4, H=32, T=4096, d=128)}
DRY_BF16 = "a dry run's Triton interpreter computes bf16 tl.dot wrongly (benchmarks/README.md)"
DRY_SEQUENTIAL = "a dry run leaves the sequential kernel out: the interpreter walks its T steps at seconds a call"
FP32_PRECISIONS = ("ieee", "tf32x3")    # set_fp32_dot_precision's explicit settings, timed beside the default


def wkv7_shapes(run) -> dict:
    return DRY_WKV7_SHAPES if run.dry else WKV7_SHAPES


def at_shapes(run, **shapes):
    """A copy of ``run`` whose shapes of the named entries are the given ones (gpu_timing reads run.shapes)."""
    view = copy.copy(run)
    view.shapes = {**run.shapes, **shapes}
    return view


def fla_forms(run) -> dict:
    """{"fla chunk_rwkv7": call, "fla chunk_rwkv7 layer form": call}, or each mapped to why it cannot run (a dry
    run, fla missing)."""
    fla, why = gpu_timing._fla()
    names = ("chunk_rwkv7", "chunk_rwkv7 layer form")
    return {f"fla {n}": (lambda x, f=fla[n]: f(**x)) if fla else why.removeprefix("skipped: ") for n in names}


def _time(run, row: dict, make, call, mode: str) -> dict:
    """row with the timing of ``call`` (gpu_timing.time_step), or why not: skipped (call is a reason), stopped
    (the part's time box is spent) or the error."""
    if isinstance(call, str):
        return {**row, "skipped": call}
    if run.out_of_time():
        return {**row, "stopped": "time box spent"}
    try:
        x = make(requires_grad=mode != "forward")
        step = (lambda: backward(call(x), x)) if mode != "forward" else torch.no_grad()(lambda: call(x))
        row = {**row, **time_step(step, run)}
    except Exception as e:
        row = {**row, "error": describe(e)}
    if not run.dry:
        torch.cuda.empty_cache()
    return row


def part_fla(run, emit):
    """seqmix's chunked and sequential WKV-7 beside fla's chunk forms, both shapes, bf16 first, then fp32 (labelled
    with their products: fla's fp32 dots are tf32); then the forms' errors against float64 at the first shape."""
    forms = fla_forms(run)
    for dtype in ("bf16", "fp32"):                  # the goals' dtype first, at both shapes
        for label, shape in wkv7_shapes(run).items():
            view = at_shapes(run, **{"wkv7": shape, "wkv7 chunked": shape})
            make = inputs_at(view, "wkv7", dtype)
            impls = {"seqmix triton_chunked": seqmix_call(view, "wkv7 chunked", "triton"), **forms,
                     "seqmix triton": seqmix_call(view, "wkv7", "triton")}
            for impl, call in impls.items():
                if run.dry and dtype == "bf16" and "chunked" in impl:
                    call = DRY_BF16
                if run.dry and impl == "seqmix triton":
                    call = DRY_SEQUENTIAL
                for mode in ("forward", "forward+backward"):
                    row = {"op": "wkv7", "shape": label, "dtype": dtype, "impl": impl, "mode": mode,
                           **({"fp32_products": gpu_timing.fp32_products(impl, "wkv7")} if dtype == "fp32" else {})}
                    emit(_time(view, row, make, call, mode))
                run.check_context(f"fla {label} {dtype} {impl}")
    first, shape = next(iter(wkv7_shapes(run).items()))
    view = at_shapes(run, **{"wkv7": shape, "wkv7 chunked": shape})
    for dtype in ("bf16", "fp32"):
        impls = {"seqmix triton_chunked": seqmix_call(view, "wkv7 chunked", "triton"), **forms}
        for impl, call in impls.items():
            row = {"op": "wkv7", "shape": first, "dtype": dtype, "impl": impl, "mode": "error vs float64"}
            if run.dry and dtype == "bf16" and "chunked" in impl:
                call = DRY_BF16
            emit({**row, **_errors(view, call, dtype)})


def _errors(run, call, dtype: str) -> dict:
    """Relative RMS errors of the output, the final state and each input's gradient of <y, c> (c a fixed random
    cotangent) against the torch backend in float64 on the same device and inputs."""
    from ..kernels.testing import rel_rms
    from ..kernels.wkv7 import wkv7
    if isinstance(call, str):
        return {"skipped": call}
    if run.out_of_time():
        return {"stopped": "time box spent"}
    try:
        x = inputs_at(run, "wkv7", dtype)(requires_grad=True)
        x64 = {n: t.detach().double().requires_grad_(True) for n, t in x.items()}
        got, want = call(x), wkv7(**x64, backend="torch")
        c = torch.randn(got[0].shape, generator=torch.Generator(run.device).manual_seed(1), device=run.device)
        (got[0].float() * c).sum().backward()
        (want[0] * c.double()).sum().backward()
        grads = {f"d{n}": rel_rms(x[n].grad.cpu(), x64[n].grad.cpu()) for n in x}
        worst = max(grads, key=grads.get)
        return {"y_rel_rms": rel_rms(got[0].detach().cpu(), want[0].detach().cpu()),
                "state_rel_rms": rel_rms(got[1].detach().cpu(), want[1].detach().cpu()),
                "grad_rel_rms_max": grads[worst], "grad_worst": worst}
    except Exception as e:
        return {"error": describe(e)}


def warm_fla(impl: str, dtype: str, shapes: list) -> None:
    """fla's first calls of one form in one dtype at each WKV-7 shape, forward and forward + backward (gpu_timing.
    warm_peer), in a process gpu_round starts for it: fla's autotuner keeps its choices on disk, where the fla part
    then finds them."""
    for shape in shapes:
        gpu_timing.warm_peer(impl, dtype, "cuda", {**gpu_timing.SHAPES, "wkv7": shape})


def part_chain(run, emit):
    """The chain probe: each variant at two lengths (the redesign's 32 serial steps of T 2048 / 64, and 128),
    B H = 12 and 128 heads (the two WKV-7 shapes), N = 64; per-step time from the difference; error vs float64."""
    from .gpu_chain import VARIANTS, chain, chain_inputs, chain_reference
    from ..kernels.testing import rel_rms
    N, lengths, head_counts = (16, (4, 8), (2,)) if run.dry else (64, (32, 128), (12, 128))
    for heads in head_counts:
        inputs = {n: chain_inputs(heads, n, N, run.device) for n in lengths}
        for v in VARIANTS:
            row = {"op": "chain", "variant": v.name, "heads": heads, "N": N}
            why = DRY_BF16 if run.dry and v.dot == "bf16" else (
                f"skipped: N = {N} is not a multiple of BV" if N % v.block_v else None)
            if why:
                emit({**row, "skipped": why})
                continue
            times = {}
            for n in lengths:
                timed = _time(run, {**row, "steps": n}, lambda requires_grad: inputs[n], lambda x, v=v: chain(v, *x),
                              "forward")
                if "median_s" in timed:
                    out = chain(v, *inputs[n])
                    timed["rel_rms_vs_float64"] = rel_rms(out.cpu(), chain_reference(*inputs[n]).cpu())
                    times[n] = timed.get("gpu_s", timed["median_s"])
                emit(timed)
            if len(times) == 2:
                (n0, t0), (n1, t1) = sorted(times.items())
                emit({**row, "steps": f"{n1} - {n0}", "per_step_s": (t1 - t0) / (n1 - n0)})
            run.check_context(f"chain {v.name}")


def warm_chain(run, emit):
    """Each chain variant's first call, at the probe's N and a length of the same specialization (a multiple of 16):
    Triton compiles it during phase 1 and keeps it on disk, so that the chain part's short box times, not compiles."""
    import time

    from .gpu_chain import VARIANTS, chain, chain_inputs
    N = 16 if run.dry else 64
    x = chain_inputs(1, 16, N, run.device)
    for v in VARIANTS:
        if (run.dry and v.dot == "bf16") or N % v.block_v or run.out_of_time():
            continue
        t0 = time.perf_counter()
        try:
            chain(v, *x)
            run.sync()
            emit({"op": "chain", "variant": v.name, "first_s": time.perf_counter() - t0})
        except Exception as e:
            emit({"op": "chain", "variant": v.name, "error": describe(e)})


def part_decode(run, emit):
    """ReRoPE decode at its benchmark shape on each Triton backend, fp32 and bf16: the time, the cost model's
    prediction and their ratio (the goal: within 2x), then each call's kernels (torch.profiler; grids alone on a
    dry run)."""
    from . import cost_model
    op = "rerope_decode"
    spec = gpu_timing.ENTRIES[op][0]
    kernels = spec.get("benchmark").kernels        # {Triton backend: (its forward's model label prefix, ...)}
    models = gpu_timing._models(cost_model, op, run.shapes[op])
    predicted = {}          # (backend, dtype): the sum over the models of the backend's kernels
    for backend, (prefix, _) in kernels.items():
        for m in models:
            if m.aot_label.startswith(prefix):
                key = (backend, m.dtype)
                predicted[key] = predicted.get(key, 0.0) + gpu_timing._predict(cost_model, m, None)
    backends = list(kernels)
    for dtype in ("bf16", "fp32"):
        make = inputs_at(run, op, dtype)
        options = spec.get("benchmark").options(run.shapes[op])
        for backend in [*backends, "torch"]:
            call = (lambda x, b=backend: spec.function(**x, **options, backend=b))
            if run.dry and dtype == "bf16" and backend != "torch":
                call = DRY_BF16
            row = _time(run, {"op": op, "shape": gpu_timing._shape_text(run, op), "dtype": dtype,
                              "impl": f"seqmix {backend}", "mode": "forward"}, make, call, "forward")
            if (backend, dtype) in predicted:
                measured, model = row.get("gpu_s", row.get("median_s")), predicted[(backend, dtype)]
                row.update(predicted_s=model, ratio=measured / model if measured else None)
            emit(row)
            if "median_s" in row and backend != "torch":
                _profile_rows(run, emit, {k: row[k] for k in ("op", "dtype", "impl")}, call, make, "forward")
            run.check_context(f"decode {backend} {dtype}")


def _profile_rows(run, emit, case: dict, call, make, mode: str):
    try:
        rows = gpu_profile.profile_case(run, call, make, mode)
    except Exception as e:
        rows = [{"error": describe(e)}]
    for r in rows:
        emit({**case, "mode": f"{mode} kernels", **r})


def part_attn32(run, emit):
    """The fp32 flash forward (and forward + backward) at d = 64 and 128 with each fp32 product setting, beside
    SDPA's default fp32 backend (CUTLASS's three-tf32 products); each row names the forward's tiles as the launcher
    picks them under that setting."""
    from ..kernels.attention import launch_config, set_fp32_dot_precision
    default = set_fp32_dot_precision("ieee")       # the setting in force, read by setting it back at once
    set_fp32_dot_precision(default)
    for entry in ("attention", "attention d=128"):
        shape, make = run.shapes[entry], inputs_at(run, entry, "fp32")
        impls = {f"seqmix triton ({p}{', the default' if p == default else ''})": (p, seqmix_call(run, entry, "triton"))
                 for p in dict.fromkeys((default, *FP32_PRECISIONS))}
        impls["torch SDPA (default backend)"] = (None, _sdpa)
        for impl, (precision, call) in impls.items():
            for mode in ("forward", "forward+backward"):
                row = {"op": "attention", "shape": gpu_timing._shape_text(run, entry), "dtype": "fp32", "impl": impl,
                       "mode": mode, "fp32_products": precision or "3xtf32"}
                previous = set_fp32_dot_precision(precision) if precision else None
                try:
                    if precision:       # what the setting resolves to on this device ("auto": tf32x3 on sm_90)
                        row["fp32_products"] = gpu_timing.fp32_products("seqmix triton", entry)
                        row["launch"] = _launch(launch_config, shape["d"])
                    emit(_time(run, row, make, call, mode))
                finally:
                    if previous:
                        set_fp32_dot_precision(previous)
            run.check_context(f"attn32 {entry} {impl}")


def _launch(launch_config, d: int) -> str:
    """The fp32 forward's tiles at head size d under the setting in force (the launcher's public choice)."""
    try:
        return str(launch_config("fwd", d, torch.float32))
    except Exception as e:
        return describe(e)


def part_flash_rate(run, emit):
    """The bf16 flash forward and forward + backward at a shape that fills the GPU (FLASH_RATE_SHAPES), beside SDPA's
    flash backend: the achieved causal TFLOP/s (forward 2 B H T^2 d, forward + backward 3.5x that), which calibrates
    the cost model's rate for Triton's wgmma flash kernels. fp32 and the tiny shapes on a dry run."""
    dtype = "fp32" if run.dry else "bf16"
    shapes = {e: run.shapes[e] for e in FLASH_RATE_SHAPES} if run.dry else FLASH_RATE_SHAPES
    view = at_shapes(run, **shapes)
    flash = (lambda f: f) if run.dry else gpu_timing._flash
    for entry, s in shapes.items():
        make = inputs_at(view, entry, dtype)
        impls = {"seqmix triton": seqmix_call(view, entry, "triton"),
                 "torch SDPA" + (" (default backend)" if run.dry else " (flash)"): flash(_sdpa)}
        for impl, call in impls.items():
            for mode, factor in (("forward", 1.0), ("forward+backward", 3.5)):
                row = _time(view, {"op": "attention", "shape": gpu_timing._shape_text(view, entry), "dtype": dtype,
                                   "impl": impl, "mode": mode}, make, call, mode)
                seconds = row.get("gpu_s", row.get("median_s"))
                if seconds:
                    row["tflops"] = factor * 2 * s["B"] * s["H"] * s["T"] ** 2 * s["d"] / seconds / 1e12
                emit(row)
            run.check_context(f"flash_rate {entry} {impl}")


def _sdpa(x):
    return torch.nn.functional.scaled_dot_product_attention(x["q"], x["k"], x["v"], is_causal=True)


def part_profile(run, emit):
    """The chunked WKV-7 and fla's two chunk forms, kernel by kernel, at the first WKV-7 shape (bf16; fp32 on a dry
    run), forward and forward + backward: gpu_profile.profile_case's rows (calls, CUDA time, share, grid)."""
    label, shape = next(iter(wkv7_shapes(run).items()))
    view = at_shapes(run, **{"wkv7": shape, "wkv7 chunked": shape})
    dtype = "fp32" if run.dry else "bf16"
    make = inputs_at(view, "wkv7", dtype)
    impls = {"seqmix triton_chunked": seqmix_call(view, "wkv7 chunked", "triton"), **fla_forms(run)}
    for impl, call in impls.items():
        for mode in ("forward", "forward+backward"):
            case = {"op": "wkv7", "shape": label, "dtype": dtype, "impl": impl}
            if isinstance(call, str) or run.out_of_time():
                emit({**case, "mode": mode, **({"skipped": call} if isinstance(call, str)
                                               else {"stopped": "time box spent"})})
                continue
            _profile_rows(view, emit, case, call, make, mode)
            run.check_context(f"profile {impl} {mode}")


# The timed parts in the order they run (the review's section 4, most important first)
PARTS = {"fla": part_fla, "chain": part_chain, "decode": part_decode, "attn32": part_attn32,
         "flash_rate": part_flash_rate, "profile": part_profile}
