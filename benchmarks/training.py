"""The C loops' training speed against the torch backend, as three ratios: ``python -m seqmix.benchmarks.training``.

    python -m seqmix.benchmarks.training             the experiments' shapes, 2 threads (a few minutes)
    python -m seqmix.benchmarks.training --quick     tiny shapes, 2 rounds, into benchmarks/results/quick/ (the test)

Forward + backward of WKV-4, WKV-7 and the selective scan at the experiments' training shapes (batch 32, 128
tokens; RWKV-4 C = 128, RWKV-7 4 heads of 32, Mamba D = 256, N = 16: run.py's training ops, same inputs), on
what backend=None runs on a CPU (the C loops) and on the torch backend. Issue 42 found these ratios halved for the
scan with no test or benchmark failing; this module keeps them in one small file, training.json (+ training.md),
so that the next regression shows in its diff.

Method. One process; the two backends of an op run in alternating rounds (C, torch, C, torch, ...), each round
timed by the wall clock and by the process's CPU time, so that a change in the machine's load slows both alike. The
ratio is the median over rounds of (torch's time / C's time) in the same round; the per-backend medians are given
beside it. A shared machine moves wall times a lot (torch's OpenMP threads wait at each barrier for a core the
scheduler gave away), so the report also gives the CPU-time ratio and the load average before and after: with
``--threads 1`` the CPU-time ratio is the figure least moved by other jobs. The targets are issue 18's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from . import run

OPS = ("wkv4_train", "wkv7_train", "ssm_train")
TARGETS = {"wkv4_train": 2.0, "wkv7_train": 4.0, "ssm_train": 4.0}     # issue 18: C at least this much faster


def _load() -> str:
    """The load average over 1, 5 and 15 minutes (what else the machine ran), or "unknown"."""
    try:
        return ", ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _timed(fn, inputs) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one fn(inputs)."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn(inputs)
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(op: run.Op, rounds: int) -> dict:
    """op's C and torch rows (run.py's forward + backward), warmed up once, then timed in ``rounds`` alternating
    rounds: per backend the times, and the round-by-round ratios torch / C."""
    impls = {impl.label.split()[-1]: impl.fn for impl in op.impls if impl.kind == "seqmix"}
    if set(impls) != {"c", "torch"} or None in impls.values():
        raise RuntimeError(f"{op.name}: the C loops are not what backend=None runs here ({sorted(impls)})")
    inputs = op.make(op.headline_T)
    for fn in impls.values():
        fn(inputs)
    times = {(backend, clock): [] for backend in impls for clock in ("wall", "cpu")}
    for _ in range(rounds):
        for backend, fn in impls.items():
            wall, cpu = _timed(fn, inputs)
            times[backend, "wall"].append(wall)
            times[backend, "cpu"].append(cpu)
    row = {"op": op.name, "title": op.title, "shape": f"{op.shape}, T={op.headline_T}", "rounds": rounds,
           "target": TARGETS[op.name]}
    for clock in ("wall", "cpu"):
        ratios = [t / c for t, c in zip(times["torch", clock], times["c", clock])]
        row[f"ratio_{clock}"] = statistics.median(ratios)
        for backend in impls:
            row[f"{backend}_{clock}_s"] = statistics.median(times[backend, clock])
        row[f"times_{clock}"] = {backend: times[backend, clock] for backend in impls}
    row["met"] = row["ratio_wall"] >= row["target"]
    return row


def report(result: dict) -> str:
    """training.md: one table of the three ratios."""
    info = result["run"]
    lines = [
        "# Training speed: the C loops against the torch backend",
        "",
        f"`{info['command']}` on {info['machine']}; {info['date']}; load average {info['load_before']} before, "
        f"{info['load_after']} after (1, 5, 15 minutes); {info['seconds']} s.",
        "",
        "Forward + backward, fp32; C and torch timed in alternating rounds in one process; the ratio is the median "
        "of the rounds' torch / C (wall clock; the CPU-time ratio beside it). See the module's docstring.",
        "",
        "| op, shape | C loops (wall) | torch backend (wall) | ratio (wall) | ratio (CPU time) | target | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(f"| {r['title']}, {r['shape']} | {run._fmt_time(r['c_wall_s'])} | "
                     f"{run._fmt_time(r['torch_wall_s'])} | {r['ratio_wall']:.2f}x | {r['ratio_cpu']:.2f}x | "
                     f">= {r['target']:g}x | {'yes' if r['met'] else '**no**'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 2 rounds: a smoke test")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds per op (default 15; 2 quick)")
    parser.add_argument("--threads", type=int, default=2, help="torch's and the C loops' threads (default 2)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default benchmarks/results, or benchmarks/results/quick with --quick)")
    args = parser.parse_args(argv)
    if args.threads < 1 or (args.rounds is not None and args.rounds < 1):
        parser.error("--threads and --rounds take a positive number")
    rounds = args.rounds or (2 if args.quick else 15)
    out = args.out or (run.RESULTS / "quick" if args.quick else run.RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    load_before, started = _load(), time.perf_counter()
    ops = {op.name: op for op in run.make_training_ops(args.quick)}
    rows = []
    for name in OPS:
        rows.append(measure(ops[name], rounds))
        print(f"{name}: {rows[-1]['ratio_wall']:.2f}x (wall), {rows[-1]['ratio_cpu']:.2f}x (CPU time)", flush=True)
    arguments = argv if argv is not None else sys.argv[1:]
    result = {"run": {"command": " ".join(["python -m seqmix.benchmarks.training", *arguments]),
                      "machine": run.machine(args.threads), "date": time.strftime("%Y-%m-%d"),
                      "threads": args.threads, "load_before": load_before, "load_after": _load(),
                      "seconds": round(time.perf_counter() - started)},
              "rows": rows}
    (out / "training.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "training.md").write_text(report(result))
    print(f"wrote {out / 'training.json'}, {out / 'training.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
