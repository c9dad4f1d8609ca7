"""What gpu_check times, and the cost model beside it: the ops at the benchmark shapes (benchmarks/README.md), on the
Triton and torch backends and beside what a GPU user would otherwise run, timed with CUDA events; and the inputs and
calls at those shapes that gpu_check's compile part uses too. ``run`` is gpu_check's Run: device, shapes, deadline.
"""
from __future__ import annotations

import functools
import statistics
import time
from types import SimpleNamespace

import torch

from ..kernels.registry import benchmarked

__all__ = ["COST_KERNELS", "DRY_SHAPES", "ENTRIES", "FLA_FORMS", "FLA_LOWER_BOUND", "SHAPES", "VARIANTS", "backward",
           "describe", "fp32_products", "inputs_at", "op_function", "part_cost_model", "part_peers", "part_timing",
           "peer_first_calls", "queued_time", "seqmix_call", "time_step", "warm_peer"]



FLA_LOWER_BOUND = -0.6065306597126334    # -e^-0.5: fla's layer's lower_bound for RWKV-7's log decays
# fla's RWKV-7 forms timed beside seqmix's: the default chunk_rwkv7 (chunks of 16), the form fla's own layer calls
# (the fastest; "within Nx of fla" means of whichever chunk form is faster) and the recurrent form (inference only)
FLA_FORMS = ("chunk_rwkv7", "chunk_rwkv7 layer form", "fused_recurrent_rwkv7")


def _entries():
    """(name, op, backend, shape, dry shape) of each benchmarked op on each of its Triton backends, at its benchmark
    shape and then at each of its variants (registry.Benchmark): the name the rows carry is the op's name on
    "triton", else the op's name and the backend's algorithm ("wkv7 chunked" on "triton_chunked"), then the variant's
    ("attention d=128"); recurrences first (registry.benchmarked)."""
    for op in benchmarked():
        bench = op.get("benchmark")
        for backend in bench.kernels:
            name = op.name if backend == "triton" else f"{op.name} {backend.removeprefix('triton_')}"
            yield name, op, backend, bench.shape, bench.dry_shape, False
            for variant, (sizes, dry_sizes) in bench.variants.items():
                yield (f"{name} {variant}", op, backend, {**bench.shape, **sizes}, {**bench.dry_shape, **dry_sizes},
                       True)


# Each entry's op and Triton backend; its shape (benchmarks/README.md, the cost model's defaults) and the tiny one of
# --dry-run, as the registry declares them: one list of shapes, which every part reads by the entry's name.
ENTRIES = {name: (op, backend) for name, op, backend, *_ in _entries()}
SHAPES = {name: shape for name, _, _, shape, _, _ in _entries()}
DRY_SHAPES = {name: dry for name, _, _, _, dry, _ in _entries()}
# The entries that are a variant's: other shapes of an entry's kernels. The correctness checks (gpu_correct) run each
# op and backend once, on their own shapes, and leave these out.
VARIANTS = tuple(name for name, *_, variant in _entries() if variant)

# The cost model's kernels of each entry: (the forward's label prefix, the training kernels' prefixes).
COST_KERNELS = {name: op.get("benchmark").kernels[backend] for name, (op, backend) in ENTRIES.items()}


def part_timing(run, emit):
    """seqmix's Triton and torch backends at the benchmark shapes, forward and forward + backward: CUDA events (a CPU
    timer on a dry run), warm-up, then the median of repeats; first the floor of this timing itself."""
    _floor(run, emit)
    cases = [case for case in _timing_cases(run) if case[4].startswith("seqmix")]
    _timed(run, emit, sorted(cases, key=lambda case: case[4] != "seqmix triton"))   # Triton first: the cost model's


def _floor(run, emit):
    """The shortest time this timing can report: a Triton kernel that stores one number, and torch filling one
    element, timed as the ops are. The first GPU run found every fast op near 0.29 ms whatever its work; a floor
    near that time says the rows there measure the timing, not the kernels."""
    x = torch.zeros(1, device=run.device)
    steps = {"empty Triton kernel": lambda: _empty_kernel()[(1,)](x),
             "torch fill_ of one element": lambda: x.fill_(1.0)}
    for impl, step in steps.items():
        row = {"op": "timing floor", "shape": "1 element", "dtype": "fp32", "impl": impl, "mode": "forward"}
        try:
            row.update(time_step(step, run))
        except Exception as e:
            row["error"] = describe(e)
        emit(row)


@functools.cache
def _empty_kernel():
    """A Triton kernel that stores 1.0 into its argument's first element: no work but its launch (built on first use,
    so that importing this module does not import triton)."""
    import triton
    import triton.language as tl

    @triton.jit
    def empty_kernel(x_ptr):              # x_ptr: one fp32 element, written so the launch cannot be elided
        tl.store(x_ptr, 1.0)
    return empty_kernel


def part_peers(run, emit):
    """What a GPU user would otherwise run, timed as part_timing times seqmix: after the cost model, since fla
    autotunes its kernels on their first call (a run cut short there keeps seqmix's rows and the predictions)."""
    _timed(run, emit, [case for case in _timing_cases(run) if not case[4].startswith("seqmix")])


def fp32_products(impl: str, op: str) -> str:
    """The arithmetic of an implementation's fp32 matrix products, which the fp32 rows carry, since the rows of one
    dtype compare unequal accuracy: fla's Triton kernels leave tl.dot at Triton's default input precision, TF32
    (fla-core 0.6.0; its safe-gate form says so too); SDPA's fp32 default backend (memory-efficient) multiplies with
    CUTLASS's OpMultiplyAddFastF32, three TF32 products per product; seqmix's WKV-7 and recurrences take IEEE fp32
    products, its flash kernels' forwards what they take on this device under set_fp32_dot_precision (attention's:
    tf32x3 on sm_90 by default)."""
    if impl.startswith("fla"):
        return "tf32"
    if impl.startswith("torch SDPA") and "default" in impl:
        return "3xtf32"
    if impl.startswith("seqmix triton") and op.startswith(("attention", "rerope")):
        from ..kernels import attention
        from ..kernels.rerope.fused import dot_precision
        # the forward's DOT on this device under the setting in force ("auto": tf32x3 for attention on sm_90)
        arch = attention.device_arch(torch.device("cuda")) if torch.cuda.is_available() else None
        if op.startswith("attention"):
            return attention.kernel_dots("fwd", torch.float32, arch)
        return dot_precision(torch.float32, "fwd")
    return "ieee"


def _timed(run, emit, cases):
    for op, dtype, make, call, impl, mode in cases:
        row = {"op": op, "shape": _shape_text(run, op), "dtype": dtype, "impl": impl, "mode": mode,
               **({"fp32_products": fp32_products(impl, op)} if dtype == "fp32" else {})}
        if run.out_of_time():
            emit({**row, "stopped": "time budget spent"})
            continue
        if isinstance(call, str):       # a peer that cannot run here: why
            emit({**row, "skipped": call})
            continue
        try:
            x = make(requires_grad=mode != "forward")
            step = ((lambda: backward(call(x), x)) if mode != "forward"
                    else torch.no_grad()(lambda: call(x)))
            row.update(time_step(step, run))
        except Exception as e:
            row["error"] = describe(e)
        emit(row)
        run.check_context(f"{op} {impl}")
        if not run.dry:
            torch.cuda.empty_cache()


def part_cost_model(run, emit):
    """The cost model's prediction for each Triton kernel beside the time measured by the timing part (this run's,
    or an earlier one's in the same --out folder): forward alone, and the training kernels' sum beside forward +
    backward."""
    from . import cost_model
    mma = _aot_mma(run, cost_model)
    # the GPU's own time where the timing part queued the calls (queued_time), else one call's
    measured = {(r["op"], r["dtype"], r["mode"]): r.get("gpu_s", r["median_s"]) for p in run.record["parts"]
                if p["name"] == "timing" for r in p["rows"] if r.get("impl") == "seqmix triton" and "median_s" in r}
    for op, (forward, training) in COST_KERNELS.items():
        if not run.wants(op):
            continue
        models = _models(cost_model, op, run.shapes[op])
        for dtype in ("fp32", "bf16"):
            for mode, prefixes in (("forward", (forward,)), ("forward+backward", training)):
                picked = [m for m in models if m.dtype == dtype and m.aot_label.startswith(prefixes)]
                if not picked:
                    continue
                predicted = sum(_predict(cost_model, m, mma.get(m.aot_label)) for m in picked)
                got = measured.get((op, dtype, mode))
                kernels = " + ".join(m.aot_label.split()[0] for m in picked)
                emit({"op": op, "dtype": dtype, "mode": mode, "kernels": kernels,
                      "shape": picked[0].shape, "mma": ", ".join(mma.get(m.aot_label, "-") for m in picked),
                      "predicted_s": predicted, "measured_s": got, "ratio": got / predicted if got else None})


def _models(cost_model, op: str, shape: dict) -> list:
    """The cost model's models of the kernels of an entry's op module at ``shape``."""
    return cost_model.MODEL_BUILDERS[_model_op(op)](**shape)


def _predict(cost_model, m, mma: str | None) -> float:
    """Seconds as cost_model.report predicts them: the MMA instruction as the AOT build reports it, else the
    model's own (m.dot_unit, or the dtype's default: FMA units for fp32, mma.sync below)."""
    return cost_model.predicted(m, mma)[0]


def _aot_mma(run, cost_model) -> dict:
    """{label: the MMA instruction} of the bf16 kernels with dots (flash kernels, chunked WKV-7) at the benchmark
    shapes, from kernels.aot's sm_90 build as cost_model.report reads it (wgmma where the tiles allow, which the
    dtype alone would price as mma.sync): about 10 builds in a subprocess. Not on a dry run (the shapes differ from
    aot_kernels()'), nor with under a minute left."""
    left = run.seconds_left()
    if run.dry or (left is not None and left < 60):
        return {}
    models = [m for op, shape in run.shapes.items() for m in _models(cost_model, op, shape)]
    labels = list(dict.fromkeys(m.aot_label for m in models if m.dtype == "bf16" and m.aot_label.startswith(
        ("attention", "rerope", "wkv7_chunked"))))
    figures = cost_model.aot_figures(labels)
    return {label: f["mma"] for label, f in figures.items() if isinstance(f, dict) and "mma" in f}


# ---------------------------------------------------------------------------------------------------- the ops


def op_function(op: str):
    """The public seqmix function of an op of COST_KERNELS (WKV-7's chunked form: wkv7, backend="triton_chunked")."""
    return ENTRIES[op][0].function


def _model_op(op: str) -> str:
    return ENTRIES[op][0].stem


def _shape_text(run, op: str) -> str:
    return " ".join(f"{k}={v}" for k, v in run.shapes[op].items())


def inputs_at(run, op: str, dtype: str):
    """requires_grad -> the op's inputs at its benchmark shape, as its declaration makes them (kernels/<op>/spec.py,
    ``Benchmark.inputs``; benchmarks/run.py's too), in ``dtype`` (the decays and parameters the models keep in fp32,
    ``Benchmark.fp32``, stay fp32)."""
    bench = ENTRIES[op][0].get("benchmark")
    dt = getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[dtype])
    keep = bench.fp32
    base = bench.inputs(torch.Generator(run.device).manual_seed(0), run.device, **run.shapes[op])

    def make(requires_grad=False):
        return {n: t.to(run.device, t.dtype if n in keep else dt).detach().requires_grad_(requires_grad)
                for n, t in base.items()}
    return make


def seqmix_call(run, op: str, backend: str):
    """x -> the seqmix op on ``backend``, called as benchmarks/run.py calls it ("wkv7 chunked" on "triton" is the
    backend "triton_chunked")."""
    spec, triton_backend = ENTRIES[op]
    backend = triton_backend if backend == "triton" else backend
    options = spec.get("benchmark").options(run.shapes[op])   # the models': Mamba's softplus, ReRoPE's window
    return lambda x: spec.function(**x, **options, backend=backend)


def _timing_cases(run):
    """(op, dtype, make, call, implementation, mode): seqmix's Triton and torch backends, then the peers."""
    from . import peers
    fla, why_not_fla = _fla()
    for op in COST_KERNELS:
        kind, w = ENTRIES[op][0].name, run.shapes[op].get("w")   # the op's name ("attention" for "attention d=128")
        for dtype in ("fp32", "bf16"):
            if not run.wants(op):
                continue
            make = inputs_at(run, op, dtype)
            flash = _flash if dtype == "bf16" and not run.dry else (lambda f: f)
            sdpa = "torch SDPA (flash)" if flash is _flash else "torch SDPA (default backend)"
            impls = [("seqmix triton", seqmix_call(run, op, "triton")),
                     ("seqmix torch", None if op == "wkv7 chunked" else seqmix_call(run, op, "torch"))]
            if kind == "attention":
                impls.append((sdpa, flash(lambda x: torch.nn.functional.scaled_dot_product_attention(
                    x["q"], x["k"], x["v"], is_causal=True))))
            if kind == "rerope_attention":
                impls += [(sdpa + " + RoPE", flash(lambda x: peers.sdpa_rope(**x))),
                          ("two-pass ReRoPE (source)", lambda x, w=w: peers.rerope_two_pass(**x, window=w))]
            if op == "wkv7":                    # the sequential entry; "wkv7 chunked" has the same peers
                # the adapters take seqmix's arguments positionally or by name; the timer passes them by name
                impls += [(f"fla {name}", fla and (lambda x, f=fla[name]: f(**x)))
                          for name in FLA_FORMS]
            for impl, call in impls:
                if impl == "seqmix torch" and call is None:
                    continue                    # the torch backend has no chunked form: it is the "wkv7" row
                for mode in ("forward", "forward+backward"):
                    if mode != "forward" and (kind == "rerope_decode" or impl.startswith("two-pass")
                                              or impl == "fla fused_recurrent_rwkv7"):
                        continue                # inference alone: decode; the two-pass prefill; fla's fused
                        # recurrent form, which has no backward (NotImplementedError: "only for inference")
                    yield op, dtype, make, call or why_not_fla, impl, mode


def peer_first_calls(run) -> list:
    """(impl, dtype) of the peers whose first call autotunes for minutes (fla's: over 120 s for chunk_rwkv7's forward
    and backward in run 3), which gpu_check warms in processes of their own while the correctness parts run."""
    fla, _ = _fla()
    if run.dry or not fla:
        return []
    return list(dict.fromkeys((impl, dtype) for _, dtype, _, _, impl, _ in _timing_cases(run)
                              if impl.startswith("fla")))


def warm_peer(impl: str, dtype: str, device: str = "cuda", shapes: dict | None = None) -> int:
    """Call the peer ``impl`` once forward and once forward + backward at its benchmark shape (``shapes``: SHAPES)
    in ``dtype``, in a process of its own: fla's autotuner keeps what it chose on disk (fla-core's
    cache_results=True, Triton's cache folder), where the peers part's process then finds it instead of autotuning
    again. Returns the number of calls made."""
    # what _timing_cases reads of gpu_check's Run (not imported: gpu_check imports this module)
    run = SimpleNamespace(shapes=shapes or SHAPES, device=device, dry=device == "cpu", wants=lambda op: True)
    calls = 0
    for _, case_dtype, make, call, case_impl, mode in _timing_cases(run):
        if (case_impl, case_dtype) == (impl, dtype) and not isinstance(call, str):   # str: why it cannot run
            x = make(requires_grad=mode != "forward")
            if mode == "forward":
                with torch.no_grad():
                    call(x)
            else:
                backward(call(x), x)
            calls += 1
    if device != "cpu":
        torch.cuda.synchronize()
    return calls


def _fla():
    """fla's RWKV-7 Triton ops adapted to seqmix's signature, or None and why not (not installed, or a dry run:
    they need a GPU)."""
    if not torch.cuda.is_available():
        return None, "skipped: fla's Triton kernels need a GPU"
    try:
        from fla.ops.rwkv7 import chunk_rwkv7, fused_recurrent_rwkv7
    except Exception as e:   # not carried, or it does not import on this torch / triton
        return None, f"skipped: fla does not import: {describe(e)}"
    from ..conformance.adapters import fla
    # fla's fastest form, as its own layer (fla/layers/rwkv7.py) calls it: the safe gate (log decays above
    # FLA_LOWER_BOUND, which the benchmark's inputs keep: benchmarks/run.py draws log_w in (-e^-0.5, 0)) with chunks
    # of 64, tensor-core solves and T / 64 serial steps; the default form takes chunks of 16 (T / 16 serial steps)
    layer_form = functools.partial(chunk_rwkv7, safe_gate=True, lower_bound=FLA_LOWER_BOUND, chunk_size=64)
    return {"chunk_rwkv7": fla(chunk_rwkv7), "chunk_rwkv7 layer form": fla(layer_form),
            "fused_recurrent_rwkv7": fla(fused_recurrent_rwkv7)}, ""


def _flash(fn):
    """fn with torch SDPA restricted to its flash backend (what a GPU user's bf16 attention runs)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def flash(x):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return fn(x)
    return flash


def backward(out, x):
    """Backward of <y, ones> (y: the output, or a stateful op's first result); clears x's grads first."""
    for t in x.values():
        t.grad = None
    y = out[0] if isinstance(out, tuple) else out
    y.backward(torch.ones_like(y))


def time_step(step, run, budget_s: float = 0.3, min_runs: int = 5, max_runs: int = 100) -> dict:
    """Median seconds of ``step`` after 3 warm-up calls: CUDA events around each call on a GPU, at least min_runs,
    then more while the budget lasts. A dry run walks the same loop with a CPU timer, one warm-up and two runs."""
    if run.dry:
        budget_s, min_runs = 0.0, 2
    for _ in range(1 if run.dry else 3):
        step()
    run.sync()
    times, stop = [], time.perf_counter() + budget_s
    while len(times) < min_runs or (len(times) < max_runs and time.perf_counter() < stop):
        if run.dry:
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        else:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    median = statistics.median(times)
    row = {"median_s": median, "n": len(times), "spread": (max(times) - min(times)) / median}
    if not run.dry:
        row.update(queued_time(step, median))
    return row


def queued_time(step, per_call_s: float, repeats: int = 5, cuda=torch.cuda) -> dict:
    """The GPU's own seconds per call of ``step``, the host's launch latency hidden: the stream first sleeps
    (torch.cuda._sleep) while the host queues k calls between two events, so that the GPU runs them back to back.

    Why: the first GPU run timed every fast op near 0.29 ms, whatever its work (an empty kernel's launch, timed
    alone, is the floor that median_s cannot go below); queued, a call costs what the GPU spends on it. The sleep is
    3x what k calls took each, timed alone (at most 0.2 s); where the GPU had already passed the first event when
    the host finished queueing (``start.query()``), the launches may have starved it: the sleep doubles and the
    repeat counts in ``gpu_starved`` (a step that synchronizes, such as one that reads a value back, starves it
    every time).
    Returns: {"gpu_s": the median over repeats of the seconds per call, "gpu_calls": k, "gpu_starved": repeats
    whose queue ran dry}."""
    calls = max(1, min(50, round(0.005 / max(per_call_s, 1e-6))))      # about 5 ms of calls per repeat
    sleep_s = min(0.2, 3 * calls * per_call_s + 0.002)
    times, starved = [], 0
    for _ in range(repeats):
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        cuda._sleep(int(sleep_s * 2e9))                     # cycles: at most 2 GHz, so at least sleep_s
        start.record()
        for _ in range(calls):
            step()
        end.record()
        if start.query():                                   # the sleep ended before the queue was full
            starved += 1
            sleep_s = min(0.2, 2 * sleep_s)
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    return {"gpu_s": statistics.median(times), "gpu_calls": calls, "gpu_starved": starved}


def describe(e: Exception) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
