"""seqmix: the sequence-mixing formulas of RWKV-4, RWKV-7, Mamba and ReRoPE, three times and cross-checked.

The package maps the repository's top-level folders (pyproject.toml, ``package-dir``):

    seqmix.reference    reference/     NumPy, float64: the truth
    seqmix.kernels      kernels/       torch + Triton (+ C loops on a CPU): the production ops
    seqmix.models       models/        RWKV-4, RWKV-7 and Mamba as torch modules, weights I/O, generation
    seqmix.benchmarks   benchmarks/    speed and memory against the peers; the GPU cost model

This folder (src/seqmix) holds only the package root, so that a checkout never shadows an installed copy.
The six ops are also reachable from here, imported on first use, so that ``import seqmix`` imports neither torch
nor triton: ``seqmix.wkv7(...)`` is ``seqmix.kernels.wkv7.wkv7(...)``.
"""
import importlib

from .kernels.registry import REGISTRY

__version__ = "0.2.0"

# name -> the module that defines it: each op of the registry (kernels/registry.py, which imports nothing heavy), and
# the interpreter switch
_LAZY = {**{op.name: op.module for op in REGISTRY}, "use_interpreter_without_gpu": "seqmix.kernels"}

__all__ = ["__version__", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'seqmix' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
