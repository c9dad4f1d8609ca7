"""The package as people install it: one import name (seqmix) over the charter's folders, imports that form a DAG
pointing downward (reference <- kernels <- models <- experiments, conformance <- benchmarks), no bare generic names,
reference files that run alone, and an install that coexists with another distribution's top-level `kernels`."""
from __future__ import annotations

import ast
import importlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

from seqmix.kernels.registry import REGISTRY

ROOT = Path(__file__).resolve().parents[2]


def package_dirs() -> dict[str, Path]:
    """seqmix.<sub> -> its folder, as pyproject.toml maps them."""
    text = (ROOT / "pyproject.toml").read_text()
    line = re.search(r"^package-dir = \{(.*)\}$", text, re.M).group(1)
    return {name: ROOT / folder for name, folder in re.findall(r'"([\w.]+)" = "([\w./]+)"', line)}


def modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    out = {}
    dirs = package_dirs()
    for pkg, folder in dirs.items():
        for f in folder.rglob("*.py"):
            rel = f.relative_to(folder).with_suffix("").parts
            # not importable, so not shipped: the Lab's .ipynb_checkpoints copies, say
            if any(part in {"__pycache__", "results"} or not part.isidentifier() for part in rel):
                continue
            name = ".".join((pkg, *rel))
            # a subfolder mapped on its own (seqmix.kernels under the root package) is listed once, by its own entry
            if not any(other != pkg and other.startswith(pkg + ".") and f.is_relative_to(d)
                       for other, d in dirs.items()):
                out[name.removesuffix(".__init__")] = f
    return out


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The package modules that `path` imports (at module level or inside functions)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(path, name, set(mods)) for name, path in mods.items()}


def test_package_dirs_cover_the_charter_folders():
    dirs = package_dirs()
    assert dirs["seqmix.reference"] == ROOT / "reference"
    assert dirs["seqmix.kernels"] == ROOT / "kernels"
    assert dirs["seqmix.models"] == ROOT / "models"
    assert all(d.is_dir() for d in dirs.values()), dirs
    listed = re.search(r"^packages = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    subpackages = {m for m, f in modules().items() if f.name == "__init__.py"}
    assert subpackages == set(re.findall(r'"([\w.]+)"', listed)), "pyproject's packages list is out of date"


def test_imports_form_a_dag():
    graph = import_graph()
    seen, on_path = set(), []

    def visit(node):
        if node in on_path:
            cycle = on_path[on_path.index(node):] + [node]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if node in seen:
            return
        on_path.append(node)
        for nxt in sorted(graph[node]):
            visit(nxt)
        on_path.pop()
        seen.add(node)

    for node in sorted(graph):
        visit(node)


# Which way imports point (reference < kernels < models < conformance, experiments < benchmarks; benchmarks above
# conformance: gpu_check runs the conformance battery on the GPU) is import-linter's contracts,
# tests/repository/test_layers.py.


# The op modules (or packages) below seqmix.kernels, from the registry: "rerope" for both ReRoPE ops.
OPS = tuple(dict.fromkeys(op.stem for op in REGISTRY))


def cross_op_imports(graph: dict[str, set[str]]) -> list[str]:
    """The imports from one op's module (or package) of another op's: what they share belongs in a private module."""
    def op_of(module):
        parts = module.split(".")
        return parts[2] if len(parts) > 2 and parts[1] == "kernels" and parts[2] in OPS else None

    return [f"{m} imports {t}" for m, targets in graph.items() for t in targets
            if op_of(m) and op_of(t) and op_of(t) != op_of(m)]


def test_no_op_module_imports_another():
    assert not cross_op_imports(import_graph())


def test_cross_op_check_catches_one():
    graph = {"seqmix.kernels.rerope.fused": {"seqmix.kernels.attention", "seqmix.kernels._flash"},
             "seqmix.kernels.rerope": {"seqmix.kernels.rerope.fused"}, "seqmix.models.rwkv7": {"seqmix.kernels.wkv7"}}
    assert cross_op_imports(graph) == ["seqmix.kernels.rerope.fused imports seqmix.kernels.attention"]


PRIVATE_KERNELS = re.compile(r"^\s*(?:from seqmix\.kernels(?:\.\w+)* import .*\b_(?:common|backend|flash)\b|"
                             r"(?:from|import) seqmix\.kernels\._\w+)", re.M)


def test_tests_and_benchmarks_use_the_public_testing_module():
    """HAS_TRITON, the state dtype, the backend choice and poisoned outputs come from seqmix.kernels.testing (and
    what models and benchmarks share with the kernels from seqmix.kernels.shared), never from a private module."""
    files = [*(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py")]
    hits = [f"{f.relative_to(ROOT)}: {m.group(0).strip()}" for f in files
            for m in PRIVATE_KERNELS.finditer(f.read_text())]
    assert not hits, hits


def test_private_import_check_catches_one():
    assert PRIVATE_KERNELS.search("from seqmix.kernels._common import HAS_TRITON\n")
    assert PRIVATE_KERNELS.search("from seqmix.kernels import _common  # noqa\n")
    assert not PRIVATE_KERNELS.search("from seqmix.kernels.testing import HAS_TRITON\n")


# No private (_) name crosses a package: what seqmix.models needs of seqmix.kernels is public there (in __all__), or
# the owner answers the question (kernels/<op>.py's triton_launch for the cost model). Within a package, and in tests
# (which may reach into the module they test), private access is fine.

def owning_package(name: str) -> str:
    """The package (seqmix.kernels, seqmix.models, ..., or seqmix itself) that a dotted name lies in."""
    return max((p for p in package_dirs() if name == p or name.startswith(p + ".")), key=len)


def private_part(dotted: str) -> str | None:
    """The first _-prefixed (not dunder) part of a dotted name below its package: seqmix.kernels._common.x ->
    _common, seqmix.kernels.wkv4._grid -> _grid, seqmix.kernels.wkv4.wkv4 -> None."""
    below = dotted[len(owning_package(dotted)):].split(".")
    return next((p for p in below if p.startswith("_") and not p.startswith("__")), None)


def private_definitions() -> dict[str, set[str]]:
    """Each _-prefixed name defined in the package's code (def, class, assignment, attribute store, import alias) ->
    the packages that define it."""
    defined = {}
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.name] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else
                     [node.id] if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) else
                     [node.attr] if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) else
                     [node.asname or node.name.split(".")[0]] if isinstance(node, ast.alias) else [])
            for n in names:
                if n.startswith("_") and not n.startswith("__"):
                    defined.setdefault(n, set()).add(owning_package(name))
    return defined


def private_accesses(source: str, name: str, defined: dict[str, set[str]], is_package: bool = False) -> list[str]:
    """What module ``name`` (its code: ``source``) uses of another package's private names:

    - an import of a private module or name (``from seqmix.kernels._common import x``, ``... wkv4 import _grid``);
    - an attribute, or getattr/hasattr/setattr with a constant name, on a module or object imported from another
      package (``wkv4._grid``, ``seqmix.kernels.wkv4._grid``, ``getattr(native, "_pointers")``);
    - a string naming one (``importlib.import_module("seqmix.kernels._common")``);
    - ``x._name`` where the check cannot know what x is (``model._step``, ``module._launch_config`` in a loop): when
      ``_name`` is defined (``defined``: private_definitions()) in another package and nowhere in this one.
    Each hit reads "line N: what".
    """
    here = owning_package(name)
    tree = ast.parse(source)
    bound, hits = {}, []

    def crosses(dotted):
        return dotted.startswith("seqmix") and owning_package(dotted) != here and private_part(dotted)

    def unknown(attr, line):
        if attr.startswith("_") and not attr.startswith("__") and defined.get(attr, {here}) - {here} and \
                here not in defined.get(attr, set()):
            hits.append(f"line {line}: ?.{attr} ({attr} is private to {', '.join(sorted(defined[attr]))})")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                hits += [f"line {node.lineno}: import {a.name}"] if crosses(a.name) else []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:   # as imports_of resolves them
                package = name if is_package else name.rpartition(".")[0]
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for a in node.names:
                bound[a.asname or a.name] = f"{base}.{a.name}"
                hits += [f"line {node.lineno}: from {base} import {a.name}"] if crosses(f"{base}.{a.name}") else []

    def dotted(e):
        if isinstance(e, ast.Name):
            return bound.get(e.id)
        if isinstance(e, ast.Attribute):
            d = dotted(e.value)
            return d and f"{d}.{e.attr}"
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            d = dotted(node)
            if d:
                hits += [f"line {node.lineno}: {d}"] if crosses(d) else []
            elif not (isinstance(node.value, ast.Name) and node.value.id in bound):
                unknown(node.attr, node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            d = dotted(node.args[0])
            if d:
                full = f"{d}.{node.args[1].value}"
                hits += [f"line {node.lineno}: {node.func.id}({d}, {node.args[1].value!r})"] if crosses(full) else []
            else:
                unknown(node.args[1].value, node.lineno)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and re.fullmatch(r"seqmix(?:\.\w+)+", node.value) and crosses(node.value)):
            hits.append(f"line {node.lineno}: {node.value!r}")
    return sorted(set(hits), key=lambda h: int(h.split()[1].rstrip(":")))


def test_no_private_name_crosses_a_package():
    defined = private_definitions()
    hits = [f"{name}, {hit}" for name, path in sorted(modules().items())
            for hit in private_accesses(path.read_text(), name, defined, path.name == "__init__.py")]
    assert not hits, hits


def test_private_access_check_catches_one():
    defined = {"_launch_config": {"seqmix.kernels"}, "_step": {"seqmix.models", "seqmix.reference"},
               "_own": {"seqmix.benchmarks", "seqmix.kernels"}}
    crossing = {
        "from seqmix.kernels._common import check_tensor\n": "from seqmix.kernels._common import check_tensor",
        "from seqmix.kernels import _flash\n": "from seqmix.kernels import _flash",
        "from seqmix.kernels.wkv4 import _grid\n": "from seqmix.kernels.wkv4 import _grid",
        "import seqmix.kernels.wkv4 as k\nk._grid(1, 2, None)\n": "seqmix.kernels.wkv4._grid",
        "import seqmix.kernels.wkv4\nseqmix.kernels.wkv4._grid(1, 2, None)\n": "seqmix.kernels.wkv4._grid",
        "from seqmix.kernels import wkv4\ncfg = wkv4._launch_config(64)\n": "seqmix.kernels.wkv4._launch_config",
        "from seqmix.models import rwkv7\nrwkv7.Rwkv7._step\n": "seqmix.models.rwkv7.Rwkv7._step",
        "from seqmix.kernels import wkv4\nf = getattr(wkv4, '_grid')\n": "getattr(seqmix.kernels.wkv4, '_grid')",
        "import importlib\nimportlib.import_module('seqmix.kernels._common')\n": "'seqmix.kernels._common'",
        "def f(modules):\n    return [m._launch_config(64) for m in modules]\n": "?._launch_config",
        "def f(model):\n    return model._step(None, None, None)\n": "?._step",
        "from ..kernels import _common\n": "from seqmix.kernels import _common",   # relative, from seqmix.benchmarks
    }
    for source, what in crossing.items():
        hits = private_accesses(source, "seqmix.benchmarks.cost_model", defined)
        assert len(hits) == 1 and what in hits[0], (source, hits)
    fine = [
        "from seqmix.kernels.shared import check_tensor\nfrom seqmix.kernels import wkv4\nwkv4.triton_launch(1, 64)\n",
        "import os\nos._exit(0)\n",                            # not a seqmix name
        "def f(pool):\n    return pool._processes\n",          # not defined in any package
        "def f(x):\n    return x._own\n",                      # defined in this package too
        "from seqmix.kernels import wkv4\nwkv4.__name__\n",    # dunder
    ]
    for source in fine:
        assert not private_accesses(source, "seqmix.benchmarks.cost_model", defined), source
    # the same access from inside the owning package is fine
    assert not private_accesses("from seqmix.kernels._common import check_tensor\n", "seqmix.kernels.wkv4", defined)
    assert not private_accesses("def f(m):\n    return m._launch_config(64)\n", "seqmix.kernels.aot", defined)


def test_every_public_module_of_kernels_and_reference_declares_its_names():
    """__all__ in each module whose name has no leading underscore, and every name in it importable from there."""
    missing, undefined = [], []
    for name, path in sorted(modules().items()):
        if name.split(".")[1:2] not in (["kernels"], ["reference"]) or name.rpartition(".")[2].startswith("_"):
            continue
        module = importlib.import_module(name)
        if not hasattr(module, "__all__"):
            body = ast.parse(path.read_text()).body
            if any(not isinstance(node, ast.Expr) and not _is_step_aside(node) for node in body):
                missing.append(name)   # (an __init__ of a docstring and the step-aside exports nothing)
            continue
        undefined += [f"{name}.{n}" for n in module.__all__ if not hasattr(module, n)]
    assert not missing and not undefined, (missing, undefined)


DOCUMENTED = [*dict.fromkeys(op.module if isinstance(op.module, str) else op.module.__module__ for op in REGISTRY),
              *(m for m in modules() if m.startswith("seqmix.reference."))]


@pytest.mark.parametrize("name", DOCUMENTED)
def test_public_ops_and_reference_functions_have_args_and_returns(name):
    """fla's layout: every public op and reference function documents its arguments and what it returns."""
    module = importlib.import_module(name)
    functions = [getattr(module, n) for n in module.__all__]
    functions = [f for f in functions if callable(f) and not isinstance(f, type)]
    assert functions
    bare = [f.__name__ for f in functions if not all(part in (f.__doc__ or "") for part in ("Args:", "Returns:"))]
    assert not bare, bare


def test_reference_imports_numpy_and_its_siblings_only():
    stdlib = set(sys.stdlib_module_names)
    for name, path in modules().items():
        if not name.startswith("seqmix.reference"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                    [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            for m in mods:
                assert m.split(".")[0] in stdlib | {"numpy"} or m.startswith("seqmix.reference"), f"{path}: {m}"


def project_files():
    """Every tracked or new text file of the project that holds code or commands."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / f for f in listed if f.endswith((".py", ".ipynb", ".md", ".toml", ".yml", ".cfg", ".txt"))
            or f.startswith(".ci/")]


BARE = re.compile(r"^\s*(?:from (?:kernels|reference|benchmarks|models)\b[\w.]* import|"
                  r"import (?:kernels|reference|benchmarks|models)\b)|-m (?:kernels|benchmarks|models)\.", re.M)


def test_no_bare_generic_import_names():
    """Nothing in the project imports or runs the folders by their bare names (they are seqmix.* only)."""
    hits = []
    for f in project_files():
        if not f.exists() or f.name == "CHANGELOG.md":   # the migration note names the old imports on purpose
            continue
        text = f.read_text(errors="replace")
        if f.suffix == ".ipynb":
            text = "\n".join("".join(c.get("source", [])) for c in json.loads(text)["cells"])
        hits += [f"{f.relative_to(ROOT)}: {m.group(0).strip()}" for m in BARE.finditer(text)]
    assert not hits, hits


def test_bare_import_check_catches_one():
    assert BARE.search("x = 1\nfrom kernels.wkv4 import wkv4\n")
    assert BARE.search("    import reference\n")
    assert BARE.search("python -m " + "kernels.aot")   # split, so that this file passes its own check
    assert not BARE.search("from seqmix.kernels.wkv4 import wkv4\nimport seqmix.reference\n")


# Sibling-free reference files, each with a call that exercises it (g: a NumPy random generator).
REFERENCE_ALONE = {
    "attention.py": "m.softmax_attention(*g.normal(size=(3, 5, 4)))",
    "functional.py": "m.layer_norm(m.token_shift(g.normal(size=(1, 5, 4)), g.normal(size=(1, 4))),"
                     " m.silu(np.ones(4)), np.zeros(4))",
    "wkv4.py": "m.wkv4(-np.ones(4), np.zeros(4), *g.normal(size=(2, 1, 5, 4)))",
    "wkv7.py": "m.wkv7(*g.normal(size=(1, 1, 5, 2, 3)), -np.ones((1, 5, 2, 3)), *g.normal(size=(2, 1, 5, 2, 3)),"
               " -np.ones((1, 5, 2, 3)) * 0.1, np.ones((1, 5, 2, 3)) * 0.1)",
    "ssm.py": "m.selective_scan(g.normal(size=(1, 3, 5)), np.ones((1, 3, 5)), -np.ones((3, 2)),"
              " *g.normal(size=(2, 1, 2, 5)))",
}


def test_every_sibling_free_reference_file_is_listed():
    free = {f.name for f in (ROOT / "reference").glob("*.py")
            if f.name != "__init__.py" and not _imports_a_sibling(f)}
    assert free == set(REFERENCE_ALONE)


def _imports_a_sibling(path) -> bool:
    """Whether a reference file imports another one (relatively, as reference/ does, or by the package's name)."""
    return any(isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("seqmix"))
               for node in ast.walk(ast.parse(path.read_text())))


@pytest.mark.parametrize("name", sorted(REFERENCE_ALONE))
def test_reference_file_runs_alone_with_numpy(tmp_path, name):
    """Copied into an empty folder and run where torch, triton and seqmix cannot be imported."""
    shutil.copy(ROOT / "reference" / name, tmp_path / name)
    script = textwrap.dedent(f"""
        import importlib.util, sys
        for blocked in ("torch", "triton", "seqmix", "scipy"):
            sys.modules[blocked] = None
        import numpy as np
        spec = importlib.util.spec_from_file_location("copied", {str(tmp_path / name)!r})
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        g = np.random.default_rng(0)
        out = {REFERENCE_ALONE[name]}
        first = out[0] if isinstance(out, tuple) else out
        assert first.dtype == np.float64 and first.size and np.isfinite(first).all()
        print("ran")
        """)
    run = subprocess.run([sys.executable, "-I", "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "ran", run.stderr


# A distribution that owns the top-level package `kernels`, as Hugging Face's does. Its package sits under src/: a
# `kernels` folder in the directory a wheel is built in would be found by setuptools' plugins before the installed
# one (Hugging Face's `kernels` registers an egg_info writer, kernels._internals.locking).
STAND_IN = {
    "pyproject.toml": '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n'
                      '[project]\nname = "kernels-stand-in"\nversion = "1.0"\n'
                      '[tool.setuptools]\npackages = ["kernels"]\npackage-dir = {"" = "src"}\n',
    "src/kernels/__init__.py": "from kernels._common import MARK\n",
    "src/kernels/_common.py": "MARK = 'stand-in'\n",
}


def _pip(venv_python: Path, *args):
    """pip of this interpreter, installing into the scratch venv (no network: --no-deps, local wheels)."""
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv_python), "--disable-pip-version-check",
                    "-q", *args], check=True, capture_output=True)


def _wheel(source: Path, out: Path, editable: bool) -> Path:
    """A wheel of source built with this interpreter's setuptools (an editable one: PEP 660's hook)."""
    hook = "build_editable" if editable else "build_wheel"
    script = f"import setuptools.build_meta as b; print(b.{hook}({str(out)!r}))"
    built = subprocess.run([sys.executable, "-c", script], cwd=source, capture_output=True, text=True, check=True)
    return out / built.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("editable", [False, True], ids=["wheel", "editable"])
def test_install_beside_another_kernels_package(tmp_path, editable):
    """seqmix installed next to a distribution owning `kernels`: both import; uninstalling seqmix leaves the other
    intact."""
    stand_in = tmp_path / "stand_in"
    for rel, text in STAND_IN.items():
        (stand_in / rel).parent.mkdir(parents=True, exist_ok=True)
        (stand_in / rel).write_text(text)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    _pip(python, "install", "--no-deps", str(_wheel(stand_in, wheels, False)))
    source = ROOT
    if not editable:   # build from a copy, so that the checkout gets no build/ folder
        source = tmp_path / "src"
        shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info",
                                                                     "__pycache__", "notebooks", "tests",
                                                                     ".ipynb_checkpoints"))
    _pip(python, "install", "--no-deps", str(_wheel(source, wheels, editable)))
    shutil.rmtree(ROOT / "build", ignore_errors=True) if editable else None
    # numpy from this environment, behind the scratch venv's own site-packages (a .pth file there, not PYTHONPATH,
    # which would come first: this environment has Hugging Face's kernels, which would win over the stand-in)
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "host_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    check = ("import kernels, seqmix, seqmix.kernels, seqmix.reference.wkv4 as r; "
             "assert kernels.MARK == 'stand-in', kernels.__file__; "
             "assert seqmix.kernels.__file__ != kernels.__file__; "
             "print(seqmix.__version__, r.wkv4.__name__)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([str(python), "-c", check], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    _pip(python, "uninstall", "-y", "seqmix")
    after = subprocess.run([str(python), "-c", "import kernels; print(kernels.MARK)"], cwd=tmp_path,
                           capture_output=True, text=True)
    assert after.stdout.strip() == "stand-in", after.stderr
    gone = subprocess.run([str(python), "-c", "import seqmix.kernels"], cwd=tmp_path, capture_output=True, text=True)
    assert gone.returncode != 0


# The charter's folders by their bare names, from the repository root (`python -m` and `python -c` put the working
# directory first on sys.path): each steps aside (seqmix.checkout), so that the name gives what it gives elsewhere.
BARE_NAMES = sorted(folder.name for folder in package_dirs().values() if folder.parent == ROOT)


def _is_step_aside(node) -> bool:
    """Whether a module-level statement is the folders' `if __name__ == "<folder>":` step-aside."""
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def _stand_ins(site: Path, names) -> Path:
    """A site folder with a package of each name, as another distribution installs it, with a submodule."""
    for name in names:
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text(f"from {name}._mark import MARK\n")
        (site / name / "_mark.py").write_text(f"MARK = 'stand-in {name}'\n")
    return site


def _python(code: str, cwd: Path, path: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"PYTHONPATH": str(path)} if path else {})
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, env=env)


def test_bare_names_cover_the_charter_folders():
    assert BARE_NAMES == ["benchmarks", "conformance", "experiments", "kernels", "models", "reference"]


def test_bare_folder_names_from_the_root_give_the_installed_packages(tmp_path):
    """With another distribution's `kernels` (Hugging Face's, which transformers imports), `reference`, ... on
    sys.path behind the checkout's root, each bare name gives that package (its submodules too), while seqmix.<name>
    stays ours."""
    site = _stand_ins(tmp_path / "site", BARE_NAMES)
    code = textwrap.dedent(f"""
        import importlib, seqmix.kernels
        for name in {BARE_NAMES!r}:
            module = importlib.import_module(name)
            assert module.MARK == "stand-in " + name, (name, module.__file__)
            assert importlib.import_module(name + "._mark").MARK == module.MARK
            ours = importlib.import_module("seqmix." + name)
            assert ours is not module and ours.__file__ == {str(ROOT)!r} + "/" + name + "/__init__.py", ours
        from seqmix.kernels.wkv7 import wkv7
        from seqmix.reference.wkv4 import wkv4
        print("stood aside")
        """)
    run = _python(code, ROOT, site)
    assert run.returncode == 0 and run.stdout.strip() == "stood aside", run.stderr[-3000:]


@pytest.mark.parametrize("name", BARE_NAMES)
def test_a_bare_folder_name_imports_from_the_root_what_it_imports_elsewhere(tmp_path, name):
    """One installed in this environment (Hugging Face's `kernels` with newer transformers): that one, from the root
    and elsewhere. None: elsewhere a ModuleNotFoundError, from the root the folder itself, as before (transformers
    imports a name that find_spec finds, to read its version, and catches no ImportError)."""
    code = f"import importlib.util; print(importlib.util.find_spec({name!r}) and importlib.import_module({name!r}))"
    here, elsewhere = _python(code, ROOT), _python(code, tmp_path)
    assert here.returncode == elsewhere.returncode == 0, here.stderr[-3000:] + elsewhere.stderr[-3000:]
    if elsewhere.stdout.strip() == "None":
        assert str(ROOT / name / "__init__.py") in here.stdout, here.stdout
    else:
        assert here.stdout == elsewhere.stdout


def test_the_reference_folder_copied_under_its_own_name_stays_itself(tmp_path):
    """reference/ copied into another project as reference/: imported there by that name (with seqmix importable
    and without it), it is the copy, not stepped aside (only a seqmix checkout's folders step aside)."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "reference", project / "reference", ignore=shutil.ignore_patterns("__pycache__", ".*"))
    for block in ("", "import sys; sys.modules['seqmix'] = None; "):
        run = _python(block + "import importlib; print(importlib.import_module('reference.wkv4').__file__)", project)
        assert run.returncode == 0, run.stderr[-3000:]
        assert Path(run.stdout.strip()) == project / "reference" / "wkv4.py"


def test_transformers_modeling_utils_imports_from_the_root():
    """What failed with transformers 5.25, which imports Hugging Face's `kernels` from transformers.modeling_utils."""
    run = _python("import transformers.modeling_utils, seqmix.models.rwkv4; print('imported')", ROOT)
    assert run.returncode == 0 and run.stdout.strip() == "imported", run.stderr[-3000:]


WHEEL_RUNS_A_C_OP = """
import sys, torch
from seqmix.kernels import native
from seqmix.models.rwkv7 import step
sources = [*native.KERNELS.files, *step.SOURCES.files]
assert all(f.is_file() and f.is_relative_to(sys.prefix) for f in sources), sources   # the wheel's own copies
x = torch.linspace(-5.0, 5.0, 11)
assert torch.allclose(native.exp(x), torch.exp(x), rtol=1e-6)
print(native.library()._name)
"""


@pytest.mark.skipif(not shutil.which((shlex.split(os.environ.get("CC", "")) or ["cc"])[0]),
                    reason="no C compiler ($CC, else cc) to build the C loops with")
def test_the_wheel_ships_the_c_sources_and_runs_a_c_op(tmp_path):
    """A wheel (not an editable install) holds every C source the builder compiles (kernels/native.c and .h, each op's
    loops in kernels/<op>/; the
    models' steps, models/native/), and installed into a fresh venv it builds the C loops from its own copies, into
    an empty cache, and runs one."""
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__",
                                                                 "notebooks", "tests"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = _wheel(source, wheels, False)
    with zipfile.ZipFile(wheel) as z:
        shipped = set(z.namelist())
    c_sources = [f for f in [*(ROOT / "kernels").rglob("*"), *(ROOT / "models").rglob("*")] if f.suffix in (".c", ".h")
                 and ".ipynb_checkpoints" not in f.parts]     # the Lab's copies of a file it opened, git-ignored
    missing = [str(f.relative_to(ROOT)) for f in c_sources
               if f"seqmix/{f.relative_to(ROOT).as_posix()}" not in shipped]
    assert c_sources and not missing, f"C sources left out of the wheel: {missing}"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    _pip(venv / "bin" / "python", "install", "--no-deps", str(wheel))
    env = {k: v for k, v in os.environ.items() if k != "SEQMIX_NATIVE"}
    # numpy and torch from this environment, behind the scratch venv's own site-packages
    env.update(PYTHONPATH=sysconfig.get_paths()["purelib"], SEQMIX_CACHE=str(tmp_path / "cache"))
    run = subprocess.run([str(venv / "bin" / "python"), "-c", WHEEL_RUNS_A_C_OP], cwd=tmp_path, capture_output=True,
                         text=True, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert Path(run.stdout.strip()).parent == tmp_path / "cache"


def test_version_is_one_string():
    import seqmix
    assert re.fullmatch(r"\d+\.\d+\.\d+", seqmix.__version__)
    from importlib.metadata import version
    assert version("seqmix") == seqmix.__version__


def test_importing_seqmix_imports_neither_torch_nor_triton():
    run = subprocess.run([sys.executable, "-c", "import sys, seqmix; print('torch' in sys.modules, "
                          "'triton' in sys.modules, callable(seqmix.wkv7))"], capture_output=True, text=True)
    assert run.stdout.split()[:2] == ["False", "False"], run.stderr


def test_reference_folder_imports_under_another_name(tmp_path):
    """reference/ copied whole into another project, under another name, imports without seqmix, torch or triton."""
    shutil.copytree(ROOT / "reference", tmp_path / "myref", ignore=shutil.ignore_patterns("__pycache__", ".*"))
    names = sorted(f.stem for f in (ROOT / "reference").glob("*.py") if f.stem != "__init__")
    script = textwrap.dedent(f"""
        import importlib, sys
        sys.path.insert(0, {str(tmp_path)!r})
        for blocked in ("torch", "triton", "seqmix"):
            sys.modules[blocked] = None
        for name in {names!r}:
            importlib.import_module("myref." + name)
        print("imported")
        """)
    run = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "imported", run.stderr
