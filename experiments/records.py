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
import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

try:
    import fcntl                    # POSIX: Results.add locks its file; elsewhere, one writer at a time is the user's
except ImportError:
    fcntl = None

import numpy as np
import torch

from .. import __version__
from ..models.io import write_text_atomically

__all__ = ["RESULTS", "Results", "kept_long_runs", "rescued", "rescue_note", "warmup_cell", "environment",
           "markdown_table", "parse_args", "output_dir", "command_line", "fmt", "control_verdict", "row_setup",
           "setup_label", "made_on", "provenance", "all_hold", "Row"]

RESULTS = Path(__file__).resolve().parent / "results"      # committed; RESULTS / "quick" is git-ignored


class Results:
    """The rows of one experiment, kept in ``<out>/<name>.json``. Each finished run adds a row and the file is
    rewritten at once (models.io.atomic_write: an interrupted run never leaves half a file); a rerun finds the rows
    it has with ``find`` and skips that work.

    Every row carries the setup it was measured under (``"setup"``: "full", "quick", or "custom-<digest>" for an edited
    Setup: setup_label), so that a run never takes another setup's rows for its own: given ``setup``, the file is
    refused when it holds a row of another (a quick run pointed at the full run's folder used to train nothing and
    describe the full run's numbers as its own). Rows written before setups were recorded carry none: they are the
    committed full runs (quick runs go to a git-ignored folder), so they count as "full". Without ``setup`` (reading,
    plotting) every row is taken."""

    def __init__(self, out, name: str, setup: str | None = None):
        self.path = Path(out) / f"{name}.json"
        self.name, self.setup = name, setup
        self.rows = self._read() if self.path.exists() else []
        foreign = sorted({row_setup(row) for row in self.rows} - {setup}) if setup is not None else []
        if foreign:
            raise ValueError(f"{self.path}: holds rows of the {' and '.join(foreign)} setup, and this is a {setup} "
                             f"run: give it another --out, or move the file away to start afresh")

    def _read(self) -> list:
        try:
            rows = json.loads(self.path.read_text(encoding="utf-8"))["rows"]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, TypeError, KeyError) as e:
            raise ValueError(f"{self.path}: not a results file ({type(e).__name__}: {e}); expected "
                             f'{{"experiment": ..., "rows": [...]}}: move it away to start afresh') from None
        bad = rows if not isinstance(rows, list) else next((row for row in rows if not isinstance(row, dict)), None)
        if bad is not None:
            raise ValueError(f"{self.path}: \"rows\" must be a list of objects, got {type(rows).__name__} holding "
                             f"{bad!r:.60}" if bad is not rows else f"{self.path}: \"rows\" must be a list of "
                             f"objects, got {type(rows).__name__}")
        return [Row(row, self.path) for row in rows]

    def find(self, **key):
        """The first row whose fields equal every item of ``key``, or None."""
        return next((row for row in self.rows if all(row.get(k) == v for k, v in key.items())), None)

    def select(self, **key) -> list:
        return [row for row in self.rows if all(row.get(k) == v for k, v in key.items())]

    def add(self, row: dict) -> dict:
        """Append ``row`` to the file as it is now: under a lock, the rows another process wrote since this one read
        the file are read again first (two probes running side by side each kept the rows they started with, and
        the one that ended last wrote the other's row away)."""
        row = Row({**row, "setup": self.setup} if self.setup is not None else row, self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "w") as lock:
            if fcntl is not None:
                fcntl.flock(lock, fcntl.LOCK_EX)
            self.rows = (self._read() if self.path.exists() else []) + [row]
            write_text_atomically(self.path, json.dumps({"experiment": self.name, "rows": self.rows}, indent=1) + "\n")
        return row


def kept_long_runs(results: Results, **key) -> list:
    """The longer runs ("is it the budget?", phase "long") matching ``key`` that kept their warmup in steps
    (Budget.longer). A row without "warmup_steps" was made before that rule, its warmup stretched with the steps,
    which changed the schedule as well as the budget: it rescues no control."""
    return [row for row in results.select(phase="long", **key) if "warmup_steps" in row]


def rescued(long_rows: list, passes) -> bool | None:
    """A control seed that missed its rule within the budget: None while its longer run with the warmup kept has not
    run (kept_long_runs' rows), else whether that run meets the rule (``passes``: row -> bool)."""
    return None if not long_rows else any(passes(row) for row in long_rows)


def all_hold(verdicts) -> bool | None:
    """A control's verdict from its seeds' (True, False, or None: not run yet): False once one failed, else None
    while one is open (or there are none), else True."""
    verdicts = list(verdicts)
    return False if False in verdicts else None if None in verdicts or not verdicts else True


def rescue_note(seed_label: str, rescue: bool | None, factor: int) -> str:
    """A report's words for a missed control seed and its longer run (rescued's verdict)."""
    how = {None: "not yet", True: "only", False: "not even"}[rescue]
    return f"{seed_label} {how} with {factor}x the steps, the warmup kept"


def warmup_cell(row: dict, warmup_steps: int, factor: int):
    """A long run's warmup for a report's table: its steps, or the stretched warmup of a row made before the rule."""
    return row.get("warmup_steps", f"{factor * warmup_steps} (stretched)")


def row_setup(row: dict) -> str:
    """The setup a row was measured under ("full" for rows written before rows carried it)."""
    return row.get("setup", "full")


class Row(dict):
    """A row of a results file: a dict whose missing field is a KeyError naming the file and the row (a bare
    KeyError: 'test_bpb' from a report said neither)."""

    def __init__(self, fields=(), path=None):
        super().__init__(fields)
        self.path = path

    def __missing__(self, key):
        begins = ", ".join(f"{k}={v!r}" for k, v in list(self.items())[:4])
        raise KeyError(f"{self.path or 'a results file'}: the row ({begins}, ...) has no {key!r} field")


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


def made_on(row: dict) -> str:
    """Where a row was measured, for a report: the CPU's short name and the commit (7 digits), "with uncommitted
    changes" where the checkout differed from it ("-" for a row without an environment: computed, not trained)."""
    env = row.get("env")
    if not env:
        return "-"
    cpu = env.get("cpu", "unknown CPU").replace("(R)", "").replace(" Processor", "").strip()
    commit = str(env.get("commit", "unknown"))
    changed = commit.endswith("+changes")
    return f"{cpu}, {commit.removesuffix('+changes')[:7]}{' with uncommitted changes' if changed else ''}"


def provenance(rows: list, label) -> str:
    """A report's closing section: where its rows were made (made_on), each place with the rows made there
    (``label``: row -> a short name; each name once), so that rows from two CPUs, commits or uncommitted code are
    told apart where they are read."""
    places = {}
    for row in rows:
        if row.get("env"):
            places.setdefault(made_on(row), {}).setdefault(label(row), None)
    if not places:
        return ""
    table = [[place, "; ".join(names)] for place, names in places.items()]
    return ("\n## Where the rows were made\n\nThe CPU and commit each row records (bits differ across CPUs and "
            "commits: a row is evidence beside the rows made with it).\n\n"
            + markdown_table(["CPU, commit", "rows made there"], table))


def fmt(x, digits: int = 1) -> str:
    """A fraction as a percentage with ``digits`` decimals ("-" for None)."""
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def control_verdict(holds, failure: str = "FAILS") -> str:
    """What a results file says of its positive control: holds, fails (then the other rows are not to be read), or
    not finished (``holds`` None)."""
    if holds is not None and not isinstance(holds, bool):
        raise TypeError(f"holds must be True, False or None (not finished), got {holds!r}")
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
    parser.add_argument("--debug", action="store_true", help="on an error, show the full traceback, not one line")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out}: is a file, not a folder")
    return args


def output_dir(args) -> Path:
    return args.out if args.out is not None else RESULTS / "quick" if args.quick else RESULTS


def setup_label(setup, full, quick) -> str:
    """The label the rows of ``setup`` carry: "full", "quick", or for any other Setup (an edited or reduced one)
    "custom-" and a digest of its fields, so that two different setups never share rows."""
    if setup == full or setup == quick:
        return "full" if setup == full else "quick"
    return "custom-" + hashlib.sha256(repr(setup).encode()).hexdigest()[:10]


def command_line(doc: str, run, full, quick, argv=None) -> int:
    """What ``python -m seqmix.experiments.<name>`` does: parse_args, then run(full or quick setup, output_dir,
    seed, threads, progress). A mistake (a results file of another setup or damaged, an unreadable checkpoint, a
    folder that cannot be written) is one line on stderr and exit status 1; --debug shows the traceback."""
    args = parse_args(doc, argv)
    try:
        run(quick if args.quick else full, output_dir(args), args.seed, args.threads, args.progress)
    except (OSError, ValueError, TypeError, KeyError) as e:
        if args.debug:
            raise
        message = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        print(f"python -m {run.__module__}: error: {message} (--debug shows the traceback)", file=sys.stderr)
        return 1
    return 0
