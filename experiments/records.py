"""Where results go: one JSON file of rows per experiment, rewritten after every finished run, plus the
environment each row was measured in, markdown tables, and the command line every experiment shares.

    Results(out, name)          <out>/<name>.json: {"experiment": name, "rows": [...]}; find(**key), add(row)
    environment(threads)        commit, versions, CPU, threads
    markdown_table(header, rows)
    parse_args(doc, argv)       --quick, --seed, --out, --threads
    output_dir(args)            experiments/results, or experiments/results/quick (git-ignored) with --quick
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from .. import __version__

__all__ = ["RESULTS", "Results", "environment", "markdown_table", "parse_args", "output_dir", "command_line", "fmt",
           "control_verdict"]

RESULTS = Path(__file__).resolve().parent / "results"      # committed; RESULTS / "quick" is git-ignored


class Results:
    """The rows of one experiment, kept in ``<out>/<name>.json``. Each finished run adds a row and the file is
    rewritten at once (through a temporary file and a rename, so an interrupted run never leaves half a file);
    a rerun finds the rows it has with ``find`` and skips that work."""

    def __init__(self, out, name: str):
        self.path = Path(out) / f"{name}.json"
        self.name = name
        self.rows = json.loads(self.path.read_text())["rows"] if self.path.exists() else []

    def find(self, **key):
        """The first row whose fields equal every item of ``key``, or None."""
        return next((row for row in self.rows if all(row.get(k) == v for k, v in key.items())), None)

    def select(self, **key) -> list:
        return [row for row in self.rows if all(row.get(k) == v for k, v in key.items())]

    def add(self, row: dict) -> dict:
        self.rows.append(row)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"experiment": self.name, "rows": self.rows}, indent=1) + "\n")
        os.replace(tmp, self.path)
        return row


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> str:
    """The checkout's commit (with "+changes" when files differ from it), or "unknown" outside a git checkout."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def environment(threads: int) -> dict:
    """What a row was measured with: commit, versions, CPU, threads."""
    return {"commit": _commit(), "seqmix": __version__, "python": platform.python_version(),
            "torch": torch.__version__, "numpy": np.__version__, "cpu": _cpu(), "cpu_count": os.cpu_count(),
            "threads": threads, "platform": platform.platform()}


def fmt(x, digits: int = 1) -> str:
    """A fraction as a percentage with ``digits`` decimals ("-" for None)."""
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def control_verdict(holds, failure: str = "FAILS") -> str:
    """What a results file says of its positive control: holds, fails (then the other rows are not to be read), or
    not finished (``holds`` None)."""
    return {None: "has not finished yet: the other rows are not to be read", True: "holds",
            False: f"{failure}: the other rows are not to be read"}[holds]


def markdown_table(header, rows) -> str:
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def parse_args(doc: str, argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="a reduced run (under a minute) written to experiments/results/quick (git-ignored)")
    parser.add_argument("--seed", type=int, default=0, help="the first seed; the runs use seed, seed + 1, ...")
    parser.add_argument("--out", type=Path, default=None,
                        help="the results folder (default experiments/results, or its quick/ with --quick)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (results repeat for one count)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    return args


def output_dir(args) -> Path:
    return args.out if args.out is not None else RESULTS / "quick" if args.quick else RESULTS


def command_line(doc: str, run, full, quick, argv=None) -> None:
    """What ``python -m seqmix.experiments.<name>`` does: parse_args, then run(full or quick setup, output_dir,
    seed, threads, progress)."""
    args = parse_args(doc, argv)
    run(quick if args.quick else full, output_dir(args), args.seed, args.threads, args.progress)
