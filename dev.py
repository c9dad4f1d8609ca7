#!/usr/bin/env python3
"""Set up and run the project from nothing: needs only Python 3.10+ with pip and venv.

    python3 dev.py lab       JupyterLab over the repository, opened on the course's start page (the main job)
    python3 dev.py test      the quick tier (minutes): every test not marked slow, notebook 01 under nbval
    python3 dev.py test --full
                             everything, as CI runs it: the slow tests (compiles, trains, the Lab in a browser, long
                             shapes) and every notebook under nbval
    python3 dev.py report    headless cross-check of every formula, as a table
    python3 dev.py constraints
                             write the venv's package versions to constraints.txt (after a green run on newer ones)
    python3 dev.py notebooks [NAME ...]
                             after editing notebooks/sources/NAME.py (the jupytext source): sync it into NAME.ipynb and
                             execute that top to bottom, as nbval and the Lab expect it (default: every notebook)

Each command creates ./.venv on first use and installs the project into it (dependencies: pyproject.toml), at
the versions of constraints.txt, the set CI is known to pass with, so that a new release of a dependency cannot turn
CI red overnight. To try the newest releases pyproject.toml allows: SEQMIX_CONSTRAINTS=none python3 dev.py test;
when they pass, `python3 dev.py constraints` records them in constraints.txt.

Torch: the project is tested with torch 2.13.0, which this script installs first unless SEQMIX_TORCH names another
requirement (for instance SEQMIX_TORCH="torch" for the newest release). On machines whose pip finds a local CPU
wheel of 2.13.0 that is the one taken; elsewhere pip takes PyPI's build (CUDA on Linux, which is what GPU users
want). A CPU-only machine elsewhere can pass SEQMIX_TORCH_INDEX=https://download.pytorch.org/whl/cpu to avoid the
multi-GB CUDA build. Once torch is in the venv, the project's range (torch>=2.3) is satisfied and nothing more is
fetched for it.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
CHROMIUM = "/usr/bin/chromium"                # Debian's, driven by the Lab's browser tests
PY = VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
TORCH = os.environ.get("SEQMIX_TORCH", "torch==2.13.0")
CONSTRAINTS = ROOT / "constraints.txt"
NEWEST = os.environ.get("SEQMIX_CONSTRAINTS") == "none"


def run(*cmd, **kw):
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.run(list(map(str, cmd)), check=True, cwd=ROOT, **kw)


def ensure_env():
    """Create .venv and install the project, once per version of pyproject.toml."""
    if not PY.exists():
        run(sys.executable, "-m", "venv", VENV)
    pins = b"newest" if NEWEST else CONSTRAINTS.read_bytes()
    stamp = VENV / ("installed-" + hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + pins
                                                 + TORCH.encode()).hexdigest()[:16])
    if stamp.exists():
        return
    pip = [PY, "-m", "pip", "install", "--progress-bar", "off"]
    index = os.environ.get("SEQMIX_TORCH_INDEX")
    run(*pip, TORCH, *(["--index-url", index] if index else []))
    # Newest: every dependency upgraded but torch, which stays the requirement installed above (SEQMIX_TORCH), as
    # this docstring promises; without it, "eager" would swap the CPU wheel for PyPI's multi-GB CUDA build.
    pinned = ["--upgrade", "--upgrade-strategy", "eager", TORCH] if NEWEST else ["-c", CONSTRAINTS]
    run(*pip, *pinned, "-e", ".[test,lab]")
    stamp.touch()


def write_constraints():
    """constraints.txt from the venv: every installed distribution but seqmix, torch without its local tag (+cpu)."""
    frozen = subprocess.run([PY, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True,
                            check=True).stdout.splitlines()
    pins = sorted((line.split("+")[0] for line in frozen if "==" in line and not line.startswith("seqmix==")),
                  key=str.lower)
    header = "# Versions CI is known to pass with (python3 dev.py constraints writes this file; see dev.py).\n"
    CONSTRAINTS.write_text(header + "\n".join(pins) + "\n")


def venv_env():
    """The venv's environment; without a CUDA GPU, Triton kernels run on CPU tensors under its interpreter."""
    env = dict(os.environ, PATH=f"{PY.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    has_cuda = subprocess.run([PY, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
                              cwd=ROOT).returncode == 0
    if not has_cuda:
        env.setdefault("TRITON_INTERPRET", "1")
    return env


COMMANDS = ("lab", "test", "report", "notebooks", "constraints")


def ensure_browser():
    """Debian's chromium for the Lab's browser tests (tests/repository/test_lab.py), installed with apt-get where it is
    missing and this user may (root, or sudo without a password); otherwise those tests skip and say why (in CI they
    fail)."""
    if os.access(CHROMIUM, os.X_OK) or not shutil.which("apt-get"):
        return
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"] if shutil.which("sudo") else None
    if sudo is None:
        return
    print("dev.py: installing chromium for the Lab's browser tests (apt-get install chromium)", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for step in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        if subprocess.run([*sudo, *step], env=env, stdout=subprocess.DEVNULL).returncode != 0:
            print("dev.py: could not install chromium; the browser tests will skip (fail in CI)", file=sys.stderr)
            return


def execute_notebooks(names, env):
    """Sync each notebook with its .py source (the newer wins), execute it in place, and sync the .py back."""
    paths = ([ROOT / "notebooks" / f"{Path(n).stem}.ipynb" for n in names]
             or sorted((ROOT / "notebooks").glob("*.ipynb")))
    for path in paths:
        source = path.parent / "sources" / f"{path.stem}.py"        # pyproject.toml's [tool.jupytext] pairing
        if not source.exists():
            raise SystemExit(f"no notebook source {source.relative_to(ROOT)}")
        run(PY, "-m", "jupytext", "--sync", source, env=env)
        run(PY, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", "--inplace",
            "--ExecutePreprocessor.timeout=900", "--ExecutePreprocessor.record_timing=False", path, env=env)
        strip_timings(path)
        run(PY, "-m", "jupytext", "--sync", path, env=env)


def strip_timings(path):
    """Drop the per-cell execution timestamps, which would make every run a diff."""
    notebook = json.loads(path.read_text())
    for cell in notebook["cells"]:
        cell.get("metadata", {}).pop("execution", None)
    path.write_text(json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def main(argv):
    what = argv[1] if len(argv) > 1 else "help"
    if what in ("help", "-h", "--help"):
        print(__doc__)
        return 0
    if what not in COMMANDS:
        print(f"dev.py: unknown command {what!r}; the commands are {', '.join(COMMANDS)}\n", file=sys.stderr)
        print(__doc__, file=sys.stderr)
        return 2
    ensure_env()
    env = venv_env()
    if what == "test":
        extra = argv[2:]
        if "--full" in extra:            # the quick tier deselects the Lab's browser tests (tests/conftest.py)
            ensure_browser()
        # tests/ and notebooks/ unless paths were given; tests/conftest.py reads --full and picks the tier.
        # --durations: the slowest tests, so that CI's time is watched as the suite grows
        paths = [] if any((ROOT / a.split("::")[0]).exists() for a in extra if not a.startswith("-")) \
            else ["tests", "notebooks"]
        run(PY, "-m", "pytest", "--nbval-lax", "--durations=20", *paths, *extra, env=env)
    elif what == "report":
        run(PY, "-m", "seqmix.kernels.crosscheck", *argv[2:], env=env)
    elif what == "notebooks":
        execute_notebooks(argv[2:], env)
    elif what == "constraints":
        write_constraints()
    elif not any((ROOT / "notebooks").glob("*.ipynb")):
        print("No notebooks yet: printing the headless cross-check report instead.", flush=True)
        run(PY, "-m", "seqmix.kernels.crosscheck", env=env)
    else:
        run(*lab_command(argv[2:]), env=env)
    return 0


def lab_command(extra=()):
    """JupyterLab serving the repository root, so that a notebook's links to ../reference, ../kernels, ../models,
    ERRATA.md and its images resolve, and opening on the course's start page, notebooks/README.md, rendered.
    Extra arguments go to `jupyter lab`."""
    write_lab_settings()
    # Jupyter refuses to run as root unless told; root is common in containers, where this is the only user.
    as_root = ["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    return [PY, "-m", "jupyter", "lab", f"--ServerApp.root_dir={ROOT}", f"--LabApp.default_url={LAB_HOME}",
            *as_root, *extra]


LAB_HOME = "/lab/tree/notebooks/README.md"   # where the Lab opens: the course's start page
# The Lab's settings for this venv (JupyterLab reads <prefix>/share/jupyter/lab/settings/overrides.json): a Markdown
# file opens rendered, so the start page reads as a page, not as its source.
LAB_SETTINGS = {"@jupyterlab/docmanager-extension:plugin": {"defaultViewers": {"markdown": "Markdown Preview"}}}


def write_lab_settings():
    path = VENV / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(LAB_SETTINGS, indent=1) + "\n")


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except subprocess.CalledProcessError as e:
        sys.exit(e.returncode)
