"""No module but the registry spells out a list of ops: a tuple, list or set literal, or a dict's keys, holding three or
more op names or op-module names ("wkv4", "rerope", "ssm", ...) fails here. A harness that needs every op, or a
subset ("the recurrences", "the ops with a C loop"), reads kernels/registry.py (REGISTRY, an OpSpec's family,
stateful, c_entries, stem). Exempt: the registry itself and ``__all__`` (a module's own exported names, which may
coincide with ops')."""
from __future__ import annotations

import ast
from pathlib import Path

from seqmix.kernels.registry import REGISTRY

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("kernels", "conformance", "benchmarks", "src", "tests")
# The registry, and this file (whose planted example spells ops on purpose).
EXEMPT = {"kernels/registry.py", "tests/repository/test_op_lists.py"}
# Tables that stay, each with its reason (docs/architecture.md, "Adding an op"): per-op test content that no
# property of a spec gives, which a new op may add a row to but does not need to.
ALLOWED: dict[str, str] = {
    "tests/kernels/test_kernels_gpu_limits.py:68":
        "BIG: per kernel, the shape that pushes its own grid axis past 65,535",
    "tests/kernels/test_second_order.py:21": "OPS: raw, unconstrained inputs per op (and WKV-7 at two head sizes) for "
                                     "gradgradcheck",
    "tests/kernels/test_second_order.py:60": "FIRST_ORDER: which (op, backend) pairs have a first-order-only backward, "
                                     "case by case",
}


def op_words() -> set[str]:
    """The ops' names and their modules' names below seqmix.kernels ("rerope", "rerope.fused", "ssm", ...)."""
    words = {op.name for op in REGISTRY} | {op.stem for op in REGISTRY}
    words |= {m.removeprefix("seqmix.kernels.") for op in REGISTRY for m in op.aot_modules}
    return words


def _exported(tree) -> set[int]:
    """The ids of the literals assigned to __all__."""
    return {id(node.value) for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AugAssign))
            and any(isinstance(t, ast.Name) and t.id == "__all__"
                    for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))}


def op_lists(source: str, words: set[str] | None = None) -> list[tuple[int, list[str]]]:
    """(line, the op names) of each literal in ``source`` that spells out three or more ops."""
    words = op_words() if words is None else words
    tree = ast.parse(source)
    exported = _exported(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None]
        else:
            continue
        named = sorted({e.value for e in items if isinstance(e, ast.Constant) and e.value in words})
        if len(named) >= 3 and id(node) not in exported:
            found.append((node.lineno, named))
    return found


def test_no_module_outside_the_registry_lists_the_ops():
    hits = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in EXEMPT or ".ipynb_checkpoints" in rel:
                continue
            hits += [f"{rel}:{line} {names}" for line, names in op_lists(path.read_text())
                     if f"{rel}:{line}" not in ALLOWED]
    assert not hits, "lists of ops outside kernels/registry.py (read REGISTRY instead):\n" + "\n".join(hits)


def test_the_check_catches_a_planted_list():
    planted = '''
MODULES = ("attention", "rerope.fused", "wkv4")
TABLE = {"wkv4": 1, "wkv7": 2, "selective_scan": 3, "other": 4}
TWO = ("wkv4", "wkv7")
__all__ = ["wkv4", "wkv7", "selective_scan"]
'''
    assert op_lists(planted) == [(2, ["attention", "rerope.fused", "wkv4"]), (3, ["selective_scan", "wkv4", "wkv7"])]
