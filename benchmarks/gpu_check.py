"""The first run on a GPU: ``python -m seqmix.benchmarks.gpu_check --out DIR`` checks the Triton path on it and
writes ``DIR/gpu_check.md`` and ``DIR/gpu_check.json`` (default DIR: benchmarks/results), rewritten after every row,
so that a run cut short still leaves what it had measured, each part with its start and end times. A record an
earlier run left in DIR is kept: renamed gpu_check.<its start>.json / .md before the new run writes. On a machine
without CUDA it prints what it would do and the pass criteria, and exits 0; ``--dry-run`` walks every part there on
tiny shapes (Triton under its interpreter, a CPU timer instead of CUDA events) and writes the same files, by
default into benchmarks/results/dry_run (git-ignored), never beside a GPU run's. A run that checked nothing (no
part, or --ops matching no op) fails.

On a CUDA GPU, in order (``--parts`` runs a subset; the most important first, for a run cut short):
0. compile: each op's first forward and backward at the benchmark shapes, fp32 and bf16, against its second call:
   Triton compiles every kernel variant on first use; the compiles are counted and timed through Triton's JIT hooks.
1. correct: the conformance battery (seqmix.conformance) on each Triton op on the device (attention, ReRoPE prefill
   and decode, WKV-4, WKV-7 sequential and chunked, the selective scan), fp32, fp16 and bf16, outputs, final states
   and every gradient against the float64 reference, within the design's budgets, on awkward shapes (T = 1, odd T,
   a sequence fed in pieces with the state passed on, the edges of the valid inputs); outputs NaN-poisoned.
   Determinism: each op at T = 300 (attention and ReRoPE in fp32 also with set_fp32_dot_precision("tf32x3")) run
   twice, bit for bit the same, within budget of the torch backend in float64.
2. no crash at the documented limits (README, "Shape limits"): decode at B H = 65,536 (grid axis 0); WKV-4 at
   T C > 2^31 and the scan at D T > 2^31 (64-bit offsets): the last channels of the big launch must equal, bit for
   bit, a launch on those channels alone, whose offsets are small.
3. fast as predicted (parts timing, cost_model, peers): seqmix's Triton and torch backends at the benchmark shapes
   (benchmarks/README.md), fp32 and bf16, forward and forward + backward, timed with CUDA events (warm-up, median of
   repeats); the cost model's prediction (benchmarks/cost_model.py) beside each Triton time; then, in the same
   process, what a GPU user would otherwise run: torch SDPA (flash backend in bf16) with RoPE, the two-pass ReRoPE,
   fla's chunk_rwkv7 and fused_recurrent_rwkv7 (where fla imports; it autotunes on first use, hence last).
   Attention is timed, modelled and set beside SDPA at head size d = 64 and d = 128 (the entry "attention d=128").
   Last (part profile, benchmarks/gpu_profile.py), the least important: torch.profiler's CUDA activity over a few
   forward and forward + backward calls of the chunked WKV-7 and of fla's chunk_rwkv7 at the WKV-7 benchmark shape,
   one row per kernel (calls, total and mean CUDA time) with our kernels' launch grids beside the SM count: why the
   chunked forward ran 1.7-1.9x fla's in the first run.

Pass criteria (``CRITERIA``): every comparison of step 1 within budget and deterministic; every launch of step 2
finishes and matches; every op's Triton forward within 2x of the cost model's prediction, or the report carries an
explanation for it (``--explain OP=TEXT``). The exit status is 0 only when all hold. A part that raises is recorded
and the next one starts; a lost CUDA context (an illegal address) restarts the run in a fresh process for the parts
left; the parts compile, correct and determinism run their items in worker processes (``--workers``), so that
Triton's compiles, one thread each, run in parallel.

The GPU machine's one command, with ``carry: ["benchmarks/wheels"]`` and ``timeout_s: 360`` (benchmarks/README.md,
"The first GPU run", says how to fetch the wheels first and what to run after a fix):

    set -o pipefail; python3 -m pip install -q --no-index --no-deps --target /tmp/site benchmarks/wheels/*.whl &&
    export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 && python3 -m pip install -q --no-deps --no-build-isolation -e . ||
    exit 1; nvidia-smi; python3 -m seqmix.benchmarks.gpu_check --out $OUT --budget-s 240 2>&1 | tee $OUT/gpu_check.log
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import torch

from . import gpu_correct, gpu_profile, gpu_timing
from ..models.io import write_text_atomically
from .gpu_correct import OPS, check_limits, check_op

__all__ = ["CRITERIA", "OPS", "PARTS", "check_limits", "check_op", "main"]

RESULTS = Path(__file__).parent / "results"

CRITERIA = (
    "correct: every Triton output, final state and gradient on the GPU within the design's budget of the float64 "
    "reference (fp32 1e-5, WKV-7 1e-4, fp16 5e-3, bf16 2e-2), and two runs bit for bit the same",
    "no crash at the documented limits: decode at B H = 65,536; WKV-4 at T C > 2^31; the scan at D T > 2^31; the "
    "big launches' last channels equal to a launch on those channels alone",
    "fast as predicted: each forward kernel's measured time within 2x of the cost model's prediction, or an "
    "explanation in the report",
)

# The parts in the order they run: the most important first, for a run cut short.
PARTS = ("compile", "correct", "determinism", "limits", "timing", "cost_model", "peers", "profile")
STEPS = {"compile": "0", "correct": "1", "determinism": "1", "limits": "2", "timing": "3", "cost_model": "3",
         "peers": "3", "profile": "3"}
PART_FUNCTIONS = {"compile": gpu_correct.part_compile, "correct": gpu_correct.part_correct,
                  "determinism": gpu_correct.part_determinism, "limits": gpu_correct.part_limits,
                  "timing": gpu_timing.part_timing, "cost_model": gpu_timing.part_cost_model,
                  "peers": gpu_timing.part_peers, "profile": gpu_profile.part_profile}
BENCHMARKS = ("timing", "cost_model", "peers", "profile")   # the parts --skip-benchmarks leaves out


# ---------------------------------------------------------------------------------------------------- the run


class ContextLost(RuntimeError):
    """The CUDA context is broken (an illegal address, a device-side assert): every later CUDA call fails, so the
    remaining parts must run in a fresh process."""


class Run:
    """What the parts share: the device, the shapes, the deadline, and the record they write row by row."""

    def __init__(self, out: Path, dry: bool, budget_s: float | None, ops: tuple, record: dict, workers: int = 1):
        self.out, self.dry, self.ops, self.record, self.workers = out, dry, ops, record, workers
        self.device = "cpu" if dry else "cuda"
        self.shapes = gpu_timing.DRY_SHAPES if dry else gpu_timing.SHAPES
        self.deadline = None if budget_s is None else time.monotonic() + budget_s
        self.compiles = _CompileCounter(dry)

    def wants(self, op: str) -> bool:
        return not self.ops or any(s in op for s in self.ops)

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def seconds_left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def sync(self):
        if not self.dry:
            torch.cuda.synchronize()

    def context_lost(self) -> bool:
        """Whether a tiny CUDA op still runs (never on a dry run)."""
        if self.dry:
            return False
        try:
            (torch.ones(1, device="cuda") + 1).item()
            return False
        except Exception:
            return True

    def check_context(self, where: str):
        if self.context_lost():
            raise ContextLost(f"the CUDA context was lost at {where}")

    def each(self, emit, item, items: list):
        """emit(item(self, *args)) for each args of items: in self.workers processes at once where that is > 1
        (Triton's compiles, single-threaded, then run in parallel and fill its cache on disk, which this process
        reads later; a broken CUDA context spoils one worker, not the run), else here, in order."""
        if self.workers <= 1 or len(items) <= 1:
            for args in items:
                if self.out_of_time():
                    emit({"op": args[0], "dtype": args[1], "stopped": "time budget spent"})
                    continue
                try:
                    emit(item(self, *args))
                except Exception as e:   # as a worker's error: a row, and the next item
                    emit({"op": args[0], "dtype": args[1], "error": gpu_timing.describe(e)})
                self.check_context(" ".join(args))
            return
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed
        # spawn: CUDA cannot be used in a forked child. A worker takes the next item when it is done (one process per
        # item, max_tasks_per_child=1, would start a replacement after each, importing torch again even at the end).
        pool = ProcessPoolExecutor(min(self.workers, len(items)), multiprocessing.get_context("spawn"),
                                   initializer=_worker_init, initargs=(self.dry,))
        futures = {pool.submit(_worker, item.__module__, item.__name__, args): args for args in items}
        try:
            for done in as_completed(futures, timeout=self.seconds_left()):
                try:
                    emit(done.result())
                except Exception as e:   # the worker died (a crash in a kernel, say): the others go on
                    emit({"op": futures[done][0], "dtype": futures[done][1], "error": gpu_timing.describe(e)})
        except TimeoutError:
            for future, args in futures.items():
                if not future.done():
                    emit({"op": args[0], "dtype": args[1], "stopped": "time budget spent"})
        finally:
            # Every item is done or given up: end the workers rather than wait for their exit, which a broken CUDA
            # context can hang (and which took minutes on a loaded CPU here). No public way to stop a worker.
            for process in list((pool._processes or {}).values()):
                process.kill()
            pool.shutdown(wait=True, cancel_futures=True)

    # The record: {"parts": [{"name", "started", "ended", "seconds", "status", "rows", ...}], ...}, written whole to
    # gpu_check.json and gpu_check.md after every change (a few kB: rewriting is cheap, and a killed run keeps all).
    def begin(self, name: str) -> dict:
        part = {"name": name, "started": _now(), "ended": None, "seconds": None, "status": "running", "rows": []}
        self.record["parts"].append(part)
        self._t0 = time.monotonic()
        self.write()
        return part

    def end(self, part: dict, status: str, error: str = ""):
        part.update(ended=_now(), seconds=round(time.monotonic() - self._t0, 3), status=status,
                    **({"error": error} if error else {}))
        self.write()

    def add(self, part: dict, row: dict):
        part["rows"].append(row)
        print(f"[{part['name']}] " + ", ".join(f"{k}={_cell(v)}" for k, v in row.items()), flush=True)
        self.write()

    def write(self):
        self.out.mkdir(parents=True, exist_ok=True)
        for name, text in (("gpu_check.json", json.dumps(self.record, indent=1, default=str)),
                           ("gpu_check.md", render(self.record))):
            write_text_atomically(self.out / name, text)


class _Warmers:
    """fla's first calls (gpu_timing.warm_peer), each (implementation, dtype) in a spawned process started with the
    run: fla autotunes on its first call for minutes, and keeps its choice on disk, so these processes do it while
    the correctness parts run, and the peers and profile parts find it done. ``wait`` (before the first benchmark
    part) waits for them until wait_s after their start and then ends the rest, so that no autotuning shares the GPU
    with a timing; record["warm_up"] says what each did (a case ended early autotunes again in the peers part, under
    its budget)."""

    def __init__(self, run: Run, wait_s: float, calls: dict | None = None):
        """calls: {(impl, dtype): (function, args)} to run each in a process (default: gpu_timing.warm_peer on each
        case of gpu_timing.peer_first_calls)."""
        import multiprocessing
        import threading
        if calls is None:
            calls = {case: (gpu_timing.warm_peer, case) for case in gpu_timing.peer_first_calls(run)}
        self.run, self.procs, self.ended = run, {}, {}
        self.started = time.monotonic()
        self.deadline = self.started + wait_s
        for case, (function, args) in calls.items():
            proc = multiprocessing.get_context("spawn").Process(target=function, args=args, daemon=True)
            proc.start()
            self.procs[case] = proc
            # a thread per process notes when it ends (the main thread is busy with the correctness parts then)
            threading.Thread(target=lambda c=case, p=proc: (p.join(), self.ended.setdefault(c, time.monotonic())),
                             daemon=True).start()

    def wait(self):
        if not self.procs:
            return
        for proc in self.procs.values():
            proc.join(max(0.0, self.deadline - time.monotonic()))
        rows = []
        for (impl, dtype), proc in self.procs.items():
            if proc.is_alive():
                proc.kill()
                proc.join()
                status = "ended at the deadline (--warm-wait-s)"
            else:
                status = "done" if proc.exitcode == 0 else f"failed (exit code {proc.exitcode})"
            end = self.ended.get((impl, dtype), time.monotonic())
            rows.append({"impl": impl, "dtype": dtype, "status": status, "seconds": round(end - self.started, 1)})
        self.run.record["warm_up"] = rows
        self.procs = {}
        self.run.write()


_WORKER: Run | None = None


def _worker_init(dry: bool):
    global _WORKER
    if dry:
        from ..kernels import use_interpreter_without_gpu
        use_interpreter_without_gpu()
    _WORKER = Run(None, dry, None, (), {"parts": []})


def _worker(module: str, item: str, args: tuple) -> dict:
    import importlib
    if _WORKER.context_lost():   # by this worker's last item: say so, rather than fail this one's every call
        raise ContextLost("this worker's CUDA context was lost by an item before this one")
    return getattr(importlib.import_module(module), item)(_WORKER, *args)


class _CompileCounter:
    """Triton compiles and their seconds. On a GPU through Triton's JIT hooks (triton.knobs, Triton >= 3.4); under the
    interpreter nothing compiles, so it counts the launches' distinct specializations as the JIT would key them
    (each argument's dtype, an integer's being 1 or a multiple of 16, the constexprs): the compiles a GPU would do."""

    def __init__(self, dry: bool):
        self.dry, self.count, self.seconds, self._started = dry, 0, 0.0, None
        if dry:
            _count_interpreted_launches()
            return
        try:
            from triton import knobs
        except ImportError:             # older Triton: compiles are not counted (the first calls' times still say)
            self.count = None
            return
        knobs.runtime.jit_cache_hook = self._before
        knobs.runtime.jit_post_compile_hook = self._after

    def _before(self, **_):
        self._started = time.perf_counter()
        return False                    # False: compile as usual (True would skip the compile)

    def _after(self, **_):
        self.count += 1
        self.seconds += time.perf_counter() - self._started

    def now(self) -> tuple:
        return (len(_INTERPRETED), 0.0) if self.dry else (self.count, self.seconds)

    def since(self, before: tuple) -> dict:
        if self.count is None:
            return {}
        count, seconds = self.now()
        return {"compiles": count - before[0], "compile_s": round(seconds - before[1], 2)}


# (kernel, specialization) of every launch under the interpreter in this process, as a GPU's JIT would cache them.
_INTERPRETED: set = set()


def _count_interpreted_launches():
    """Make the interpreter record each launch's specialization in _INTERPRETED (once per process)."""
    from triton.runtime.interpreter import InterpretedFunction
    original = InterpretedFunction.run
    if getattr(original, "counted", False):
        return

    def run(fn, *args, **kwargs):
        _INTERPRETED.add((fn.fn.__name__, _specialization(fn.fn, args, kwargs)))
        return original(fn, *args, **kwargs)
    run.counted = True
    InterpretedFunction.run = run


def _specialization(fn, args, kwargs) -> tuple:
    """The JIT's key of a launch, near enough: tensors by dtype and 16-byte alignment, integers by 1 / multiple of
    16 / other / 64-bit, constexprs (annotated tl.constexpr, and keyword options) by value."""
    import inspect
    params = list(inspect.signature(fn).parameters.values())

    def kind(value, constexpr):
        if isinstance(value, torch.Tensor):
            return str(value.dtype), value.data_ptr() % 16 == 0
        if isinstance(value, bool) or constexpr or not isinstance(value, int):
            return repr(value) if not isinstance(value, float) else "f32"
        return 1 if value == 1 else "i64" if abs(value) >= 2**31 else "d16" if value % 16 == 0 else "i32"
    constexpr = [p.name for p in params if "constexpr" in str(p.annotation)]
    options = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}   # the launch's, not the kernel's
    named = dict(zip((p.name for p in params), args), **options)
    return tuple((k, kind(v, k in constexpr or k not in {p.name for p in params})) for k, v in sorted(named.items()))


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _cell(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


# ---------------------------------------------------------------------------------------------------- the report


def render(record: dict) -> str:
    """gpu_check.md: the header, then each part's rows as a table."""
    lines = ["# GPU check", "", f"Device: {record['device']}; {record['versions']}", "",
             f"Command: `{record['command']}`; started {record['started']}"
             + (f", finished {record['finished']}" if record.get("finished") else " (not finished)"), "",
             "## Pass criteria", "", *[f"- {c}" for c in CRITERIA]]
    if record.get("verdict"):
        lines += ["", f"**{record['verdict']}**"]
    lines += [f"- {op} is off its prediction because {why}" for op, why in record.get("explanations", {}).items()]
    if record.get("warm_up"):
        lines += ["", "## fla's first calls, in the background during steps 0-2 (seconds from their start)", "",
                  *_table(record["warm_up"])]
    for part in record["parts"]:
        lines += ["", f"## {STEPS[part['name']]}. {part['name']}", "",
                  f"{part['status']}: started {part['started']}, ended {part['ended']}, {part['seconds']} s"]
        if part.get("error"):
            lines += ["", "```", part["error"], "```"]
        lines += _table(part["rows"])
    return "\n".join(lines) + "\n"


def _table(rows: list) -> list:
    """A markdown table of dict rows, its columns the keys in order of first appearance ([] for no rows)."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    if not columns:
        return []
    return ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
            *["| " + " | ".join(_short(_cell(row.get(c, ""))).replace("|", "/") for c in columns) + " |"
              for row in rows]]


def _short(text: str, limit: int = 400) -> str:
    """A table cell cut to ``limit`` characters (the JSON keeps all of it: every failure of a battery row, say)."""
    return text if len(text) <= limit else text[:limit] + f" ... ({len(text) - limit} more characters in the JSON)"


def summary(record: dict) -> str:
    """One line per part, for the end of the output (a device reply carries the output's last 12,000 characters)."""
    lines = [f"{'part':<12} {'status':<13} {'seconds':>8} {'rows':>5} {'not ok':>6}"]
    for p in record["parts"]:
        bad = sum(1 for r in p["rows"] if r.get("ok") is False or "stopped" in r or isinstance(r.get("error"), str))
        lines.append(f"{p['name']:<12} {p['status']:<13} {p['seconds'] or 0:>8.1f} {len(p['rows']):>5} {bad:>6}")
    return "\n".join(lines)


def _verdict(record: dict, explanations: dict) -> tuple[str, bool]:
    """PASS when some part gave rows (a run that checked nothing fails), no part failed, no row failed, erred or
    was stopped (a peer's error is its own), and every op's forward is within 2x of its prediction or explained
    (not asked of a dry run: the interpreter's times say nothing of a GPU's)."""
    problems = [f"{p['name']}: {p['status']}" for p in record["parts"] if p["status"] != "ok"]
    if not any(p["rows"] for p in record["parts"]):
        problems.append("nothing was checked (no part gave a row: --parts named none, or --ops matched no op)")
    problems += [f"{p['name']}: {r.get('op', r.get('what'))} {r.get('dtype', '')} {r.get('impl', '')}".rstrip()
                 for p in record["parts"] for r in p["rows"] if r.get("ok") is False or "stopped" in r
                 or (isinstance(r.get("error"), str) and r.get("impl", "seqmix").startswith("seqmix"))]
    problems += [f"cost_model: {r['op']} {r['dtype']} {r['ratio']:.3g}x" for p in record["parts"]
                 if p["name"] == "cost_model" and not record["dry_run"] for r in p["rows"]
                 if r["mode"] == "forward" and r["ratio"]
                 and r["ratio"] > 2 and r["op"] not in explanations]
    if problems:
        return "FAIL: " + "; ".join(problems[:20]), False
    return "PASS", True


def _plan() -> str:
    steps = __doc__.split("(``--parts`` runs a subset; the most important first, for a run cut short):\n")[1]
    steps = steps.split("\n\nPass criteria")[0]
    return ("No CUDA device here: nothing was run (--dry-run walks every part on tiny shapes). On a CUDA GPU this "
            "command would run, in order:\n" + steps + "\n\nPass criteria:\n" + "\n".join(f"- {c}" for c in CRITERIA)
            + f"\n\nIt would write {RESULTS / 'gpu_check.md'} and gpu_check.json.")


def _versions() -> dict:
    import importlib.metadata as md
    found = {}
    for name in ("torch", "triton", "numpy", "fla-core"):
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            found[name] = None
    return {"python": platform.python_version(), **found}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder of gpu_check.md and gpu_check.json (default "
                        "benchmarks/results, and benchmarks/results/dry_run for a dry run)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--ops", default="", help="comma-separated substrings: only the ops that contain one")
    parser.add_argument("--dry-run", action="store_true", help="every part on tiny shapes on the CPU")
    parser.add_argument("--budget-s", type=float, help="stop starting new rows after this many seconds")
    parser.add_argument("--workers", type=int, help="processes for compile, correct and determinism (default: "
                        "the CPU count - 2, at most 12, on a GPU; 1, this process, on a dry run)")
    parser.add_argument("--explain", action="append", default=[], metavar="KERNEL=TEXT",
                        help="why an op's forward is more than 2x off its prediction (repeatable)")
    parser.add_argument("--skip-benchmarks", action="store_true", help=f"leave out {', '.join(BENCHMARKS)}")
    parser.add_argument("--warm-wait-s", type=float, default=240.0, help="how long after the start the first "
                        "benchmark part waits for fla's first calls, autotuning in the background (default 240)")
    parser.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)   # a restart after a lost context
    args = parser.parse_args(argv)
    parts = _check_options(parser, args)
    if args.skip_benchmarks:
        parts = [p for p in parts if p not in BENCHMARKS]
    if args.dry_run:
        from ..kernels import use_interpreter_without_gpu
        use_interpreter_without_gpu()   # before anything imports triton
    elif not torch.cuda.is_available():
        print(_plan())
        return 0
    json_path = args.out / "gpu_check.json"
    record = _resumed(parser, json_path) if args.resume and json_path.exists() else {
        "command": " ".join(["python -m seqmix.benchmarks.gpu_check", *argv]), "started": _now(), "finished": None,
        "device": "CPU (dry run)" if args.dry_run else torch.cuda.get_device_name(), "dry_run": args.dry_run,
        "versions": _versions(), "parts": []}
    if not args.resume:
        _keep_earlier_record(args.out)
    workers = args.workers or (1 if args.dry_run else max(1, min(12, (os.cpu_count() or 1) - 2)))
    run = Run(args.out, args.dry_run, args.budget_s, tuple(s for s in args.ops.split(",") if s), record, workers)
    warmers = _Warmers(run, args.warm_wait_s) if {"peers", "profile"} & set(parts) else None
    for i, name in enumerate(parts):
        if warmers and name in BENCHMARKS:
            warmers.wait()              # before any timing: their autotuning must not share the GPU with it
        part = run.begin(name)
        try:
            PART_FUNCTIONS[name](run, lambda row: run.add(part, row))
            run.end(part, "ok")
        except ContextLost as e:
            run.end(part, "context lost", str(e))
            rest = parts[i + 1:]
            if rest:   # the remaining parts in a fresh process: this one's CUDA context fails every call now
                if warmers:
                    warmers.wait()
                print(f"{e}: restarting for {', '.join(rest)}", flush=True)
                os.execv(sys.executable, [sys.executable, "-m", "seqmix.benchmarks.gpu_check", *_without(argv),
                                          "--parts", ",".join(rest), "--resume"])
        except Exception as e:   # a part that raises is a finding; the later parts still run
            run.end(part, "error", "".join(traceback.format_exception(e))[-3000:])
    record["finished"] = _now()
    record["explanations"] = dict(e.split("=", 1) for e in args.explain)      # each checked by _check_options
    verdict, passed = _verdict(record, record["explanations"])
    record["verdict"] = verdict
    run.write()
    print(f"\n{summary(record)}\n\n{verdict}\nWrote {args.out / 'gpu_check.md'} and {json_path}")
    return 0 if passed else 1


def _check_options(parser, args) -> list:
    """The parts to run; every option checked before anything runs (parser.error: one line, exit 2)."""
    parts = [p for p in args.parts.split(",") if p]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"--parts: unknown {unknown}; choose among {', '.join(PARTS)}")
    if not parts:
        parser.error(f"--parts: no part given; choose among {', '.join(PARTS)}")
    bad = [e for e in args.explain if "=" not in e or not e.split("=", 1)[0].strip()]
    if bad:
        parser.error(f"--explain takes KERNEL=TEXT, got {bad[0]!r}")
    if args.out is None:
        args.out = RESULTS / "dry_run" if args.dry_run else RESULTS
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out}: is a file, not a folder")
    if args.budget_s is not None and not args.budget_s >= 0:
        parser.error(f"--budget-s must be a number of seconds >= 0, got {args.budget_s}")
    return parts


def _resumed(parser, json_path: Path) -> dict:
    """The record a restart continues (--resume), or parser.error naming the file when it is damaged."""
    try:
        record = json.loads(json_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        parser.error(f"--resume: {json_path} is not a gpu_check record ({type(e).__name__}: {e})")
    if not isinstance(record, dict) or not isinstance(record.get("parts"), list):
        parser.error(f"--resume: {json_path} is not a gpu_check record (no list of parts)")
    return record


def _keep_earlier_record(out: Path) -> None:
    """Rename a record an earlier run left in ``out`` to gpu_check.<its start>.json / .md, so that a new run (a dry
    run, a typo in --ops, a run that fails) never replaces a GPU run's results."""
    old = out / "gpu_check.json"
    if not old.exists():
        return
    try:
        started = str(json.loads(old.read_text()).get("started") or "")
    except (OSError, ValueError, AttributeError):
        started = ""
    stamp = "".join(c if c.isalnum() else "-" for c in started) or str(int(old.stat().st_mtime))
    name, n = f"gpu_check.{stamp}", 1
    while any((out / f"{name}{suffix}").exists() for suffix in (".json", ".md")):
        name, n = f"gpu_check.{stamp}-{n}", n + 1
    for suffix in (".json", ".md"):
        if (out / f"gpu_check{suffix}").exists():
            os.replace(out / f"gpu_check{suffix}", out / f"{name}{suffix}")
    print(f"kept the earlier record in {out} as {name}.json and .md", flush=True)


def _without(argv: list) -> list:
    """argv without --parts and --resume (a restart gives its own)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--parts":
            skip = True
        elif not (a.startswith("--parts=") or a == "--resume"):
            out.append(a)
    return out


if __name__ == "__main__":
    sys.exit(main())
