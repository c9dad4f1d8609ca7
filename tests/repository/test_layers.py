"""The layers are import-linter contracts (pyproject.toml, [tool.importlinter]): `lint-imports` keeps every one.

lint-imports finds a package by its folder, and pyproject.toml's package-dir maps seqmix's subpackages onto the
charter's top-level folders (seqmix.kernels is kernels/, not src/seqmix/kernels/). So the check lays those folders
under one seqmix/ folder, as an installed wheel lays them, and runs lint-imports there: the graph it reads is the
package's own, every import inside functions included. A planted upward import shows that the check can fail.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def package_dirs() -> dict[str, Path]:
    """seqmix.<sub> -> its folder, as pyproject.toml maps them."""
    line = re.search(r"^package-dir = \{(.*)\}$", (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    return {name: ROOT / folder for name, folder in re.findall(r'"([\w.]+)" = "([\w./]+)"', line)}


def lay_out(target: Path) -> Path:
    """The package's .py files under target/seqmix/, each folder where package-dir puts it; returns target."""
    for name, folder in package_dirs().items():
        place = target.joinpath(*name.split("."))
        for source in folder.rglob("*.py"):
            relative = source.relative_to(folder)
            if not all(part.isidentifier() for part in relative.with_suffix("").parts):
                continue                  # not importable (the Lab's .ipynb_checkpoints copies): not shipped
            if name == "seqmix" and len(relative.parts) > 1:
                continue                  # the root's folder holds the root's own modules only
            (place / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, place / relative)
    return target


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(tree))
    return subprocess.run([str(LINT_IMPORTS), str(ROOT / "pyproject.toml"), "--no-cache", "--no-logo"], cwd=tree,
                          env=env, capture_output=True, text=True, timeout=600)


def contracts() -> list[str]:
    """The contracts' names, as pyproject.toml's [tool.importlinter] section lists them."""
    text = (ROOT / "pyproject.toml").read_text()
    return re.findall(r'^name = "(.*)"$', text[text.index("[tool.importlinter]"):], re.M)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return lay_out(tmp_path_factory.mktemp("layout"))


def test_every_contract_is_kept(tree):
    done = lint_imports(tree)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert f"Contracts: {len(contracts())} kept, 0 broken." in done.stdout
    assert len(contracts()) >= 5       # layers, reference alone, registry light, ops apart, shared parts op-free


def test_an_upward_import_breaks_the_layers(tree, tmp_path):
    """kernels/ importing models/ (the kind of tie the registry once hid in a string) is caught, and named."""
    planted = lay_out(tmp_path)
    backends = planted / "seqmix" / "kernels" / "backends.py"
    backends.write_text(backends.read_text() + "\n\ndef _upward():\n    from seqmix.models import decode\n")
    done = lint_imports(planted)
    assert done.returncode != 0
    assert "Layers: reference < kernels < models" in done.stdout and "BROKEN" in done.stdout
    assert "seqmix.kernels.backends -> seqmix.models.decode" in done.stdout


def test_an_op_importing_another_op_is_caught(tmp_path):
    planted = lay_out(tmp_path)
    spec = planted / "seqmix" / "kernels" / "rerope" / "spec.py"
    spec.write_text(spec.read_text() + "\nfrom ..attention.spec import ATTENTION  # noqa: E402\n")
    done = lint_imports(planted)
    assert done.returncode != 0 and "An op's package stands alone" in done.stdout, done.stdout[-3000:]
