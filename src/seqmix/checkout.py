"""The checkout's folders under their bare names: step aside for the installed packages of those names.

In a checkout, `python -m ...` and `python -c ...` put the working directory first on sys.path. From the repository
root, `import kernels` would then find the folder kernels/ (a regular package, which is seqmix.kernels) before the
installed distribution of that name: Hugging Face's `kernels`, which transformers imports, so that transformers
itself failed to import from the root. reference, models, benchmarks, experiments and conformance are names other
distributions use too. Each mapped folder's __init__.py therefore calls `step_aside` first when it runs under its
bare name, and the import gives what the same name finds on the rest of sys.path. Where it finds nothing, the folder
stays what the import found (as before), rather than raising ModuleNotFoundError: transformers asks whether `kernels`
is installed with importlib.util.find_spec (which finds the folder) and then, finding no version in any metadata,
imports it to read one, catching no ImportError, so that raising here broke `import transformers.modeling_utils`
from the root with transformers 5.23 and no `kernels` installed. Under seqmix.<name> (the editable install, the
wheel) nothing changes.

Why not folders without __init__.py (namespace portions, which lose to a regular package later on sys.path): the
__init__ files hold API (seqmix.kernels.use_interpreter_without_gpu, seqmix.conformance's lazy names), and with no
other package of the name, `import kernels` would still succeed, as an empty namespace package.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

__all__ = ["step_aside"]


def step_aside(name: str, init_file: str) -> None:
    """Put the package that ``name`` finds outside this checkout in sys.modules[name] (the import system returns what
    sys.modules holds once the calling __init__.py ends), where there is one.

    ``init_file``: the calling folder's __init__.py. A folder outside a seqmix checkout (reference/ copied into
    another project under its own name) is left alone.
    """
    folder = Path(init_file).resolve().parent
    root = folder.parent
    if not (root / "src" / "seqmix" / "checkout.py").is_file():
        return
    spec = _find_elsewhere(name, folder, [entry for entry in sys.path if _resolved(entry) != root])
    if spec is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def _resolved(entry) -> Path | None:
    """A sys.path entry as an absolute path ('' is the working directory); None for what is not a path."""
    try:
        return Path(entry or os.getcwd()).resolve()
    except (TypeError, OSError):
        return None


def _find_elsewhere(name: str, folder: Path, path: list) -> importlib.machinery.ModuleSpec | None:
    """The spec the import system would give ``name`` on ``path``: the path finder there, any other finder on
    sys.meta_path as it stands (an editable install's, say), never one that points back into ``folder``."""
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        spec = find_spec(name, path if finder is importlib.machinery.PathFinder else None)
        if spec is not None and not _inside(spec, folder):
            return spec
    return None


def _inside(spec: importlib.machinery.ModuleSpec, folder: Path) -> bool:
    places = [spec.origin] if spec.origin and spec.has_location else []
    places += list(spec.submodule_search_locations or [])
    return any(Path(p).resolve().is_relative_to(folder) for p in places)
