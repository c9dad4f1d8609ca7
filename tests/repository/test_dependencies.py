"""Every third-party package the code imports is declared in pyproject.toml where it is used: the package's
unconditional imports as runtime dependencies; imports inside a function or a try block (optional peers, extras)
as runtime or optional dependencies; tests' imports as runtime or test dependencies; notebooks' as runtime, test
or lab dependencies. And every declared dependency says why, on its line."""
import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# import name -> distribution name, where the two differ
DISTRIBUTION = {"yaml": "pyyaml", "PIL": "pillow", "fla": "fla-core", "sklearn": "scikit-learn",
                "markdown_it": "markdown-it-py", "IPython": "ipython"}


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


RUNTIME = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
EXTRAS = {extra: {_name(r) for r in reqs} for extra, reqs in PYPROJECT["project"]["optional-dependencies"].items()}
OPTIONAL = set().union(*EXTRAS.values())


def third_party_imports(path: Path):
    """(distribution, guarded) for each import of a package outside the standard library and the project; guarded
    when the import sits inside a function or a try block."""
    tree = ast.parse(path.read_text())
    # sibling modules; in tests/, the helpers' package and conftest.py (tests/ is on the path)
    local = {p.stem for p in path.parent.glob("*.py")} | {"helpers", "conftest"}
    guarded_nodes = {id(n) for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                            ast.Try))
                     for n in ast.walk(node) if n is not node}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top in {"seqmix", "__future__"} or top in local:
                continue
            yield DISTRIBUTION.get(top, top).lower().replace("_", "-"), id(node) in guarded_nodes


def package_files():
    dirs = PYPROJECT["tool"]["setuptools"]["package-dir"].values()
    return [f for d in dirs for f in (ROOT / d).rglob("*.py") if "results" not in f.parts]


def test_package_imports_are_declared():
    missing = [f"{f.relative_to(ROOT)}: {dist}" + (" (guarded)" if guarded else "")
               for f in package_files() for dist, guarded in third_party_imports(f)
               if dist not in RUNTIME and (not guarded or dist not in OPTIONAL)]
    assert not missing, "imported but not declared in pyproject.toml: " + ", ".join(missing)


@pytest.mark.parametrize("folder, extras", [("tests", ("test",)), ("notebooks", ("test", "lab"))])
def test_test_and_notebook_imports_are_declared(folder, extras):
    allowed = RUNTIME.union(*(EXTRAS[e] for e in extras))
    missing = [f"{f.relative_to(ROOT)}: {dist}" for f in (ROOT / folder).rglob("*.py")
               for dist, _ in third_party_imports(f) if dist not in allowed]
    assert not missing, f"imported but not in the runtime or {'/'.join(extras)} dependencies: " + ", ".join(missing)


def test_every_dependency_says_why():
    """Each requirement line of pyproject.toml carries a comment with its reason (on it or on the line above)."""
    lines = (ROOT / "pyproject.toml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("dependencies"))
    end = next(i for i, line in enumerate(lines) if line.startswith("[tool."))
    bare = [line.strip() for i, line in enumerate(lines[start:end], start)
            if re.match(r'\s+"[\w.-]+', line) and "#" not in line and not lines[i - 1].strip().startswith("#")]
    assert not bare, "dependencies without a reason: " + ", ".join(bare)
