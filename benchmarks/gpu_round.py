"""The GPU run of issue 46: ``python -m seqmix.benchmarks.gpu_round --out DIR`` runs, in the order of the GPU
review's section 4 (2026-12-05), each part time-boxed, and writes DIR/gpu_round.json, DIR/gpu_round.md and
DIR/gpu_round.rows.jsonl, rewritten as rows come, so that a run killed at its limit keeps what it measured.

1. env (this process): the device and its facts (name, SMs, L2, memory, clocks, driver), the versions.
2. Phase 1, fla's autotuning in the background: fla's first calls of its two chunk forms (autotuning for minutes,
   its choices kept on disk) run in processes of their own, one per (form, dtype), both shapes, while the
   foreground checks correctness (gpu_correct, in worker processes): compile (each op's first calls), correct (the
   conformance battery on every op and Triton backend against float64: the chunked WKV-7 and every ReRoPE decode
   backend included), determinism. Phase 1 ends at --warm-wait-s; fla's processes still running then are ended, so
   that no autotuning shares the GPU with a timing.
3. Phase 2, every timing with the GPU to itself (benchmarks/gpu_round_parts.py): fla, chain, decode, attn32,
   flash_rate, profile.
Last, the goals read off the rows (GOALS): each ratio measured side by side in this run, met or not, or not measured.

Each part runs in a process of its own (a new session, killed with its workers at its box's end, so that a hung
compile or a lost CUDA context costs that part alone), until its mark on the plan (PLAN: cumulative shares of
--budget-s; a part that ends early leaves its time to the next). Rows go to gpu_round.rows.jsonl as they come, one
JSON object a line, which this process folds into the record. Without CUDA it prints the plan and exits 0;
``--dry`` runs the whole sequence on the CPU at tiny shapes under the Triton interpreter (fla skipped, with the
reason), into benchmarks/results/dry_run/gpu_round unless --out says otherwise. docs/gpu.md gives the device command.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..models.io import write_text_atomically

__all__ = ["GOALS", "PHASE1", "PHASE2", "PLAN", "goals", "main", "read_rows", "render"]

RESULTS = Path(__file__).parent / "results"
PHASE1 = ("compile", "correct", "determinism")
PHASE2 = ("fla", "chain", "decode", "attn32", "flash_rate", "profile")
# (part, the mark by which it must end: a share of the budget from the start). Phase 1 ends at --warm-wait-s
# (default WARM_SHARE of the budget), whatever its marks say.
PLAN = (("compile", 0.12), ("correct", 0.35), ("determinism", 0.5),
        ("fla", 0.7), ("chain", 0.75), ("decode", 0.8), ("attn32", 0.88), ("flash_rate", 0.93), ("profile", 1.0))
WARM_SHARE = 0.5        # run 4: fla's first calls of one form took over 200 s; phase 2 needs about 180 s
GRACE_S = 15.0          # after its mark, a part's process is killed (it stops starting rows at the mark)
FILES = ("gpu_round.json", "gpu_round.md", "gpu_round.rows.jsonl")

# (name, part, what is compared, the limit on the ratio)
GOALS = (
    ("WKV-7 chunked forward / fla's fastest form", "fla", "forward", 1.0),
    ("WKV-7 chunked forward + backward / fla's fastest form", "fla", "forward+backward", 1.2),
    ("ReRoPE decode measured / cost model", "decode", "forward", 2.0),
    ("fp32 flash forward / SDPA fp32", "attn32", "forward", 1.3),
)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# ---------------------------------------------------------------------------------------------------- rows


def append_row(out: Path, event: dict):
    """One event (a part's begin, row or end) appended to gpu_round.rows.jsonl and flushed to disk."""
    with open(out / "gpu_round.rows.jsonl", "a") as f:
        f.write(json.dumps(event, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_rows(out: Path) -> list:
    """The events of gpu_round.rows.jsonl; a last line cut short by a kill is left out."""
    path, events = out / "gpu_round.rows.jsonl", []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return events


def fold(record: dict, events: list) -> dict:
    """record with "parts" rebuilt from the events, in the order the parts began."""
    parts = {}
    for e in events:
        part = parts.setdefault(e["part"], {"name": e["part"], "started": None, "ended": None, "seconds": None,
                                            "status": "not started", "rows": []})
        if e["event"] == "begin":
            part.update(started=e["time"], budget_s=e.get("budget_s"), status="running")
        elif e["event"] == "row":
            part["rows"].append(e["row"])
        elif e["event"] == "end":
            part.update(ended=e["time"], seconds=e.get("seconds"), status=e["status"],
                        **({"error": e["error"]} if e.get("error") else {}))
    return {**record, "parts": list(parts.values())}


# ---------------------------------------------------------------------------------------------------- one part


def run_part(name: str, out: Path, dry: bool, until: float, ops: tuple, workers: int) -> int:
    """The child's side (--child NAME): run one part until the wall-clock time ``until``, appending its events."""
    import traceback

    from . import gpu_correct, gpu_round_parts
    from .gpu_check import ContextLost, Run
    def compile_all(run, emit):     # the ops' first calls, then the chain probe's (its box in phase 2 is short)
        gpu_correct.part_compile(run, emit)
        gpu_round_parts.warm_chain(run, emit)
    functions = {"compile": compile_all, "correct": gpu_correct.part_correct,
                 "determinism": gpu_correct.part_determinism, **gpu_round_parts.PARTS}
    run = Run(out, dry, max(0.0, until - time.time()), ops, {"parts": []}, workers)
    append_row(out, {"event": "begin", "part": name, "time": _now(), "budget_s": round(until - time.time(), 1),
                     "pid": os.getpid()})
    t0, status, error = time.monotonic(), "ok", ""

    def emit(row: dict):
        append_row(out, {"event": "row", "part": name, "row": row})
        print(f"[{name}] " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                       for k, v in row.items()), flush=True)
    try:
        functions[name](run, emit)
    except ContextLost as e:
        status, error = "context lost", str(e)
    except Exception as e:   # a finding: recorded, and the next part runs in a fresh process
        status, error = "error", "".join(traceback.format_exception(e))[-3000:]
    append_row(out, {"event": "end", "part": name, "time": _now(), "seconds": round(time.monotonic() - t0, 2),
                     "status": status, "error": error})
    return 0


def _spawn_part(args, name: str, until: float) -> subprocess.Popen:
    argv = [sys.executable, "-m", "seqmix.benchmarks.gpu_round", "--child", name, "--until", repr(until),
            "--out", str(args.out), "--workers", str(args.workers), *(["--dry"] if args.dry else []),
            *(["--ops", args.ops] if args.ops else [])]
    return subprocess.Popen(argv, start_new_session=True)     # its own group: killed with its worker processes


def _ended(out: Path, name: str) -> bool:
    return any(e["event"] == "end" and e["part"] == name for e in read_rows(out))


class Stopped(Exception):
    """The run was told to stop (SIGTERM: the device command's ``timeout``)."""


def _stop(signum, frame):
    raise Stopped(f"signal {signal.Signals(signum).name}")


def _wait_part(proc: subprocess.Popen, name: str, until: float, out: Path, refresh) -> None:
    """Wait for a part's process until its mark plus GRACE_S, re-rendering the record as its rows come; past that,
    or when the run is stopped, kill its process group and record it as killed."""
    try:
        _watch(proc, name, until, out, refresh)
    except Stopped as e:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if not _ended(out, name):       # (a part that had ended, its process not yet gone, keeps its end)
            append_row(out, {"event": "end", "part": name, "time": _now(), "status": "killed: the run was stopped",
                             "error": f"{e}: its process group was killed"})
        raise
    finally:
        refresh()


def _watch(proc: subprocess.Popen, name: str, until: float, out: Path, refresh) -> None:
    size = -1
    while proc.poll() is None:
        if time.time() > until + GRACE_S:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            append_row(out, {"event": "end", "part": name, "time": _now(), "status": "killed at its time box",
                             "error": f"still running {GRACE_S:.0f} s after its mark; its process group was killed"})
            break
        path = out / "gpu_round.rows.jsonl"
        if path.exists() and path.stat().st_size != size:
            size = path.stat().st_size
            refresh()
        time.sleep(1.0)
    else:   # ended by itself: a crash before its end event still gets one
        if not _ended(out, name):
            append_row(out, {"event": "end", "part": name, "time": _now(), "status": "error",
                             "error": f"its process exited with code {proc.returncode} before ending the part"})


# ---------------------------------------------------------------------------------------------------- fla's warm-up


class Warmers:
    """One spawned process per call, started with the run; ``stop`` waits for them until ``until`` (wall clock), ends
    the rest, and returns a row per process. ``calls``: {(impl, dtype): (function, args)}, by default
    gpu_round_parts.warm_fla on each (fla form, dtype) of ``cases`` at each of ``shapes``."""

    def __init__(self, cases: list, shapes: list, calls: dict | None = None):
        import multiprocessing

        from .gpu_round_parts import warm_fla
        if calls is None:
            calls = {case: (warm_fla, (*case, shapes)) for case in cases}
        self.started = time.time()
        self.procs = {}
        for case, (function, call_args) in calls.items():
            proc = multiprocessing.get_context("spawn").Process(target=function, args=call_args, daemon=True)
            proc.start()
            self.procs[case] = proc

    def stop(self, until: float) -> list:
        rows = []
        for (impl, dtype), proc in self.procs.items():
            proc.join(max(0.0, until - time.time()))
            if proc.is_alive():
                proc.kill()
                proc.join()
                status = "ended at --warm-wait-s (the fla part autotunes what is left, in its time box)"
            else:
                status = "done" if proc.exitcode == 0 else f"failed (exit code {proc.exitcode})"
            rows.append({"impl": impl, "dtype": dtype, "status": status,
                         "seconds_from_start": round(time.time() - self.started, 1)})
        return rows


def _fla_cases(dry: bool) -> tuple[list, str]:
    """(the (form, dtype) pairs to warm, or [] and why not)."""
    if dry:
        return [], "a dry run: fla's kernels need a GPU"
    try:
        import fla.ops.rwkv7  # noqa: F401
    except Exception as e:
        return [], f"fla does not import: {type(e).__name__}: {e}"
    return [(f"fla {form}", dtype) for form in ("chunk_rwkv7", "chunk_rwkv7 layer form")
            for dtype in ("bf16", "fp32")], ""


# ---------------------------------------------------------------------------------------------------- env


def environment(dry: bool) -> dict:
    """The device and its facts, the versions, the host: what each number of this run was measured on."""
    import torch

    from .gpu_check import _versions
    facts = {"versions": _versions(), "cpus": os.cpu_count(), "platform": platform.platform()}
    if dry:
        return {**facts, "device": "CPU (dry run: Triton interpreter, CPU timer)"}
    p = torch.cuda.get_device_properties(0)
    facts.update(device=p.name, capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
                 memory_gib=round(p.total_memory / 2**30, 1), l2_mb=round(getattr(p, "L2_cache_size", 0) / 1e6, 1),
                 cuda=torch.version.cuda)
    query = "driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,pstate"
    try:
        smi = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv"], capture_output=True, text=True,
                             timeout=30)
        facts["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        facts["nvidia_smi"] = f"{type(e).__name__}: {e}"
    return facts


# ---------------------------------------------------------------------------------------------------- goals


def _seconds(row: dict):
    return row.get("gpu_s", row.get("median_s"))


def goals(record: dict) -> list:
    """One row per goal and case: the ratio measured in this run, the limit, and met (True, False, or None: not
    measured, with why)."""
    rows = {p["name"]: p["rows"] for p in record["parts"]}
    found = []
    for name, part, mode, limit in GOALS:
        for case, ratio, why in _ratios(rows.get(part, []), part, mode):
            met = None if ratio is None or record["dry_run"] else ratio <= limit
            why = why or ("a dry run: the interpreter's times on a CPU say nothing of a GPU's" if record["dry_run"]
                          else "")
            found.append({"goal": name, "case": case, "ratio": ratio, "limit": limit, "met": met,
                          **({"why": why} if why else {})})
    return found


def _ratios(rows: list, part: str, mode: str):
    """(case, ratio or None, why not) for one goal's rows."""
    timed = [r for r in rows if r.get("mode") == mode]
    if part == "decode":
        for r in timed:
            if r["impl"] != "seqmix torch":
                yield f"{r['impl']} {r['dtype']}", r.get("ratio"), _why_not(r)
        return
    cases = {}
    for r in timed:
        cases.setdefault((r["shape"], r["dtype"]), []).append(r)
    for (shape, dtype), group in cases.items():
        if part == "fla" and dtype != "bf16":
            continue                            # the goal is bf16; fp32 rows compare unequal products
        ours = [r for r in group if r["impl"] == ("seqmix triton_chunked" if part == "fla" else r["impl"])
                and r["impl"].startswith("seqmix")]
        peers = [r for r in group if not r["impl"].startswith("seqmix")]
        best = min((r for r in peers if _seconds(r)), key=_seconds, default=None)
        for r in ours:
            label = f"{shape} {dtype}" + ("" if part == "fla" else f" {r['impl']}")
            if best is None:
                yield label, None, "no peer measured: " + ("; ".join(filter(None, map(_why_not, peers))) or "none")
            elif not _seconds(r):
                yield label, None, _why_not(r)
            else:
                yield f"{label} (against {best['impl']})", _seconds(r) / _seconds(best), ""


def _why_not(row: dict) -> str:
    return next((f"{k}: {row[k]}" for k in ("skipped", "stopped", "error") if row.get(k)), "")


# ---------------------------------------------------------------------------------------------------- the report


def render(record: dict) -> str:
    """gpu_round.md: the header and the environment, the goals, fla's warm-up, then each part's rows."""
    from .gpu_check import _table
    env = record["environment"]
    lines = ["# GPU run (issue 46)", "", f"Device: {env.get('device')}; versions {env.get('versions')}", "",
             f"Command: `{record['command']}`; started {record['started']}"
             + (f", finished {record['finished']}" if record.get("finished") else " (not finished)")
             + f"; budget {record['budget_s']} s, "
             + (f"phase 1 until {record['warm_wait_s']} s" if record["warm_wait_s"] else "no fla warm-up")
             + (f"; **stopped**: {record['stopped']}" if record.get("stopped") else ""), "",
             "Times: `gpu_s` is the GPU's own time per call (calls queued behind a sleep), `median_s` one call's "
             "with its launch; ratios are taken on `gpu_s`, both sides measured in this run.", "",
             "## Environment", "", *_table([{"fact": k, "value": v} for k, v in env.items()]),
             "", "## Goals", "", *_table(goals(record))]
    if record.get("warm_up"):
        lines += ["", "## fla's first calls, in the background during phase 1", "", *_table(record["warm_up"])]
    for part in record["parts"]:
        lines += ["", f"## {part['name']}", "", f"{part['status']}: started {part['started']}, ended "
                  f"{part['ended']}, {part['seconds']} s (time box {part.get('budget_s')} s)"]
        if part.get("error"):
            lines += ["", "```", part["error"], "```"]
        lines += _table(part["rows"])
    return "\n".join(lines) + "\n"


def _write(out: Path, record: dict) -> dict:
    record = fold(record, read_rows(out))
    record["goals"] = goals(record)
    write_text_atomically(out / "gpu_round.json", json.dumps(record, indent=1, default=str))
    write_text_atomically(out / "gpu_round.md", render(record))
    return record


def summary(record: dict) -> str:
    """The end of the output (a device reply carries its last 12,000 characters): each part, then the goals."""
    lines = [f"{'part':<12} {'status':<24} {'seconds':>8} {'rows':>5} {'not ok':>6}"]
    for p in record["parts"]:
        bad = sum(1 for r in p["rows"]    # (a determinism row's "error" is a number: its error against float64)
                  if r.get("ok") is False or "stopped" in r or isinstance(r.get("error"), str))
        lines.append(f"{p['name']:<12} {p['status'][:24]:<24} {p['seconds'] or 0:>8.1f} {len(p['rows']):>5} {bad:>6}")
    lines += ["", "goals:"] + [f"  {g['goal']}, {g['case']}: " + ("not measured (" + g.get("why", "") + ")"
                                                                    if g["met"] is None else
                                                                    f"{g['ratio']:.3g}x (limit {g['limit']}x) "
                                                                    + ("met" if g["met"] else "MISSED"))
                               for g in record["goals"]]
    return "\n".join(lines)


def plan_text(plan: dict, budget_s: float, warm_s: float | None) -> str:
    """The plan, printed first: each part and the second by which it ends."""
    phase1 = f"phase 1 until {warm_s:.0f} s, fla autotuning beside it" if warm_s else "no fla warm-up"
    return (f"Plan for --budget-s {budget_s:.0f} ({phase1}):\n"
            + "\n".join(f"  {name:<12} until {at:6.0f} s" for name, at in plan.items()))


# ---------------------------------------------------------------------------------------------------- the run


def marks(parts: list, budget_s: float, warm_s: float | None) -> dict:
    """{part: seconds from the start by which it must end}: PLAN's shares of the chosen parts, scaled to the
    budget; the phase-1 parts end by warm_s where fla's warm-up runs beside them."""
    shares, last = {}, 0.0
    for name, mark in PLAN:
        shares[name], last = mark - last, mark
    total, at, found = sum(shares[p] for p in parts), 0.0, {}
    for p in parts:
        at += shares[p] / total * budget_s
        found[p] = min(at, warm_s) if warm_s is not None and p in PHASE1 else at
    return found


def orchestrate(args, parts: list) -> dict:
    start = time.time()
    _keep_earlier_record(args.out)
    record = {"command": " ".join(["python -m seqmix.benchmarks.gpu_round", *args.argv]), "started": _now(),
              "finished": None, "dry_run": args.dry, "budget_s": args.budget_s, "parts_asked": parts,
              "environment": environment(args.dry), "parts": []}
    cases, why = _fla_cases(args.dry) if set(parts) & set(PHASE1) and set(parts) & {"fla", "profile"} else ([], "")
    warm_s = (args.warm_wait_s if args.warm_wait_s is not None else WARM_SHARE * args.budget_s) if cases else None
    record.update(warm_wait_s=warm_s, plan=marks(parts, args.budget_s, warm_s),
                  **({"warm_up_skipped": why} if why else {}))
    print(plan_text(record["plan"], args.budget_s, warm_s), flush=True)
    signal.signal(signal.SIGTERM, _stop)     # the device command's timeout: stop the part, write, summarize
    warmers = Warmers(cases, [s for s in _wkv7_shapes(args.dry)]) if cases else None
    _write(args.out, record)
    try:
        for name in parts:
            if warmers and name in PHASE2:
                record["warm_up"] = warmers.stop(start + warm_s)
                warmers = None
            until = start + record["plan"][name]
            if time.time() >= until:
                append_row(args.out, {"event": "end", "part": name, "time": _now(),
                                      "status": "not started: no time left"})
                continue
            print(f"== {name}: until {until - start:.0f} s from the start", flush=True)
            _wait_part(_spawn_part(args, name, until), name, until, args.out, lambda: _write(args.out, record))
        record["finished"] = _now()
    except Stopped as e:
        record["stopped"] = f"{e} at {_now()}, {time.time() - start:.0f} s from the start"
    if warmers:
        record["warm_up"] = warmers.stop(time.time())
    return _write(args.out, record)


def _keep_earlier_record(out: Path):
    """Rename the files an earlier run left in ``out`` to gpu_round.<its start>.*, so that no run (a dry run, a
    typo) replaces a GPU run's record."""
    if not (out / FILES[0]).exists():
        for name in FILES[1:]:
            (out / name).unlink(missing_ok=True)        # pieces of a run that wrote no record: nothing to keep
        return
    try:
        stamp = str(json.loads((out / FILES[0]).read_text()).get("started") or "")
    except (OSError, ValueError, AttributeError):
        stamp = ""
    stamp = "".join(c if c.isalnum() else "-" for c in stamp) or str(int(time.time()))
    for name in FILES:
        if (out / name).exists():
            os.replace(out / name, out / name.replace("gpu_round.", f"gpu_round.{stamp}.", 1))
    print(f"kept the earlier record in {out} as gpu_round.{stamp}.*", flush=True)


def _wkv7_shapes(dry: bool) -> list:
    from .gpu_round_parts import DRY_WKV7_SHAPES, WKV7_SHAPES
    return list((DRY_WKV7_SHAPES if dry else WKV7_SHAPES).values())


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="the record's folder (default benchmarks/results/gpu/run7; "
                        "benchmarks/results/dry_run/gpu_round for --dry)")
    parser.add_argument("--dry", action="store_true", help="the whole sequence on the CPU, tiny shapes, interpreter")
    parser.add_argument("--budget-s", type=float, help="seconds for the whole run (default 480; 1800 for --dry)")
    parser.add_argument("--warm-wait-s", type=float, help="the end of phase 1, seconds from the start (default "
                        f"{WARM_SHARE} of the budget)")
    all_parts = [p for p, _ in PLAN]
    parser.add_argument("--parts", default=",".join(all_parts), help=f"comma-separated, of {', '.join(all_parts)}")
    parser.add_argument("--ops", default="", help="phase 1: only the ops whose name contains one of these "
                        "comma-separated substrings")
    parser.add_argument("--workers", type=int, help="phase 1's worker processes (default: CPUs - 6, at most 10; "
                        "1 on --dry)")
    parser.add_argument("--child", help=argparse.SUPPRESS)    # a part's process
    parser.add_argument("--until", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = argv
    parts = [p for p in args.parts.split(",") if p]
    if not parts or set(parts) - set(all_parts):
        parser.error(f"--parts: choose among {', '.join(all_parts)}, got {args.parts!r}")
    parts = [p for p in all_parts if p in parts]              # always in the plan's order
    if args.budget_s is not None and not args.budget_s > 0:
        parser.error(f"--budget-s must be a number of seconds > 0, got {args.budget_s}")
    if args.out is None:
        args.out = RESULTS / "dry_run" / "gpu_round" if args.dry else RESULTS / "gpu" / "run7"
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out}: is a file, not a folder")
    args.budget_s = args.budget_s or (1800.0 if args.dry else 480.0)
    args.workers = args.workers or (1 if args.dry else max(1, min(10, (os.cpu_count() or 1) - 6)))
    if args.dry:
        from ..kernels import use_interpreter_without_gpu
        use_interpreter_without_gpu()     # before anything imports triton; the parts' processes inherit it
    if args.child:
        ops = tuple(s for s in args.ops.split(",") if s)
        return run_part(args.child, args.out, args.dry, args.until, ops, args.workers)
    import torch
    if not args.dry and not torch.cuda.is_available():
        print("No CUDA device here: nothing was run (--dry runs the whole sequence on the CPU).\n"
              + plan_text(marks(parts, args.budget_s, WARM_SHARE * args.budget_s), args.budget_s,
                          WARM_SHARE * args.budget_s))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    record = orchestrate(args, parts)
    print(f"\n{summary(record)}\nWrote {', '.join(str(args.out / f) for f in FILES)}"
          + (f"\nStopped: {record['stopped']}" if record.get("stopped") else ""), flush=True)
    return 1 if record.get("stopped") else 0


if __name__ == "__main__":
    sys.exit(main())
