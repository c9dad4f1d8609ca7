"""How a report is shown: one table line per compared quantity, a progress bar, a summary line, and the JSON
document (schema: conformance/report.schema.json, versioned by SCHEMA)."""
from __future__ import annotations

import json
import platform
import sys

import torch

from .. import __version__
from .battery import Report, Row

__all__ = ["SCHEMA", "HEADER", "format_row", "progress", "summary", "as_json"]

# Bumped when a field changes meaning or disappears (adding a field keeps the version). 2: a row's budget is the one
# it was judged at, conditioned on the inputs unless options.strict (1: always the design's).
SCHEMA = "seqmix.conformance.report/2"

HEADER = (f"{'check':<64} {'what':<10} {'shape':<18} {'dtype':<5} {'rel RMS':>8} {'max abs':>8} {'budget':>6} "
          f"result")


def _number(x: float | None) -> str:
    return f"{x:8.1e}" if x is not None else f"{'-':>8}"


def format_row(row: Row) -> str:
    """'wkv4/shapes/T=37,B=2,C=6,state/fp32  y  (2, 37, 6)  fp32  3.1e-07  2.4e-06  1e-05  pass', then the
    row's message where it has one."""
    line = (f"{row.check:<64} {row.what:<10} {row.shape:<18} {row.dtype:<5} {_number(row.error)} "
            f"{_number(row.max_abs)} {row.budget:6.0e} {'pass' if row.passed else 'FAIL'}")
    return line + (f"  {row.message}" if row.message else "")


def progress(done: int, total: int, label: str, width: int = 30) -> str:
    """'[#########.....................]  9/30 label' (the CLI redraws it on stderr)."""
    filled = width * done // max(total, 1)
    return f"[{'#' * filled}{'.' * (width - filled)}] {done:>{len(str(total))}}/{total} {label}"


def _count(n: int, noun: str, plural: str = "") -> str:
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def summary(report: Report) -> str:
    """One line: what ran, what failed (and how many quantities passed only at the budget their inputs condition, or
    under --strict failed only the design's), what was left out, the verdict (and its grade when strict)."""
    failed_rows = sum(not r.passed for r in report.rows)
    conditioned = len(report.conditioned_rows)
    strict = report.options.strict
    line = (f"{report.op}: {_count(len(report.checks), 'check')}, "
            f"{_count(len(report.rows), 'quantity', 'quantities')} compared, "
            f"{len(report.rows) - failed_rows} within budget")
    if conditioned and not strict:
        line += f" ({conditioned} only within the budget conditioned on the inputs)"
    line += f", {failed_rows} not"
    if report.failed_checks:
        line += f" (in {_count(len(report.failed_checks), 'check')}"
        line += f"; {conditioned} within the budget conditioned on the inputs)" if conditioned and strict else ")"
    if report.skipped:
        line += f"; {_count(len(report.skipped), 'check')} left out by the options"
    verdict = "FAILED" if report.failed_checks else "passed" if report.rows else "NOTHING RAN"
    return f"{line}: {verdict}" + (" (strict)" if strict else "")


def as_json(report: Report, function: str, adapter: str | None) -> str:
    """The report as the versioned JSON document CI reads."""
    failed_rows = sum(not r.passed for r in report.rows)
    doc = dict(schema=SCHEMA, seqmix_version=__version__, function=function, adapter=adapter,
               environment=dict(python=platform.python_version(), torch=torch.__version__, platform=sys.platform),
               summary=dict(ok=report.ok, checks=len(report.checks), failed_checks=len(report.failed_checks),
                            skipped_checks=len(report.skipped), rows=len(report.rows), failed_rows=failed_rows,
                            conditioned_rows=len(report.conditioned_rows)),
               **report.as_dict())
    doc["options"] = {k: list(v) if isinstance(v, tuple) else v for k, v in doc["options"].items()}
    return json.dumps(doc, indent=1, allow_nan=False)
