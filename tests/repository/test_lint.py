"""`ruff check` passes over the package, dev.py and the tests, with the rules pyproject.toml's [tool.ruff] selects
(pyflakes' unused and undefined names, pycodestyle's errors and warnings, lines of at most 120 columns)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUFF = Path(sys.executable).with_name("ruff")
CHECKED = ["reference", "kernels", "models", "conformance", "experiments", "benchmarks", "src", "tests", "dev.py"]


def ruff(*arguments, source: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(RUFF), "check", "--no-cache", "--output-format", "concise", *arguments], cwd=ROOT,
                          input=source, capture_output=True, text=True, timeout=300)


def test_ruff_passes():
    done = ruff(*CHECKED)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_ruff_sees_a_long_line_and_an_unused_import():
    """The configuration read is pyproject.toml's (a source given as a file of tests/), and it checks widths."""
    done = ruff("--stdin-filename", "tests/probe.py", "-", source="import os\n\nx = '" + "a" * 130 + "'\n")
    assert done.returncode != 0
    assert "F401" in done.stdout and "E501" in done.stdout, done.stdout
