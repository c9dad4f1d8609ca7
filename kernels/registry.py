"""The ops of seqmix, declared once: ``REGISTRY`` is the only list of ops, and every harness iterates it.

Each op has one ``OpSpec``: its name and title, its public function, its float64 reference, its naive torch form,
its battery declaration (inputs, cases, budgets: ``kernels/declarations.py``), its backends in the order
``backend=None`` tries them (``kernels/backends.py``), the kernel modules that hold its Triton kernels (the AOT
build), its C entry points, and what the GPU benchmarks read of it. The lazy facade (``seqmix.wkv7``), the AOT
build, the cross-check, the conformance battery and its command line, the edge cases, gpu_check, the benchmarks,
the cost model and the tests read it.

What a spec points at is named as ``"module:attribute"`` and imported on first use (``OpSpec.get``), so that
importing the registry imports neither torch nor triton: ``import seqmix`` reads it. A test may give the objects
themselves instead (tests/kernels/test_registry.py registers a made-up op with ``registered``).

Subsets are properties of a spec, never lists of names: ``family`` ("attention": the flash-kernel ops; "recurrence":
the stateful scans), ``c_entries`` (empty: no C loop), ``module`` (the kernel module, whose stem, "rerope" for both
ReRoPE ops, keys the benchmarks' shapes and the cost model).
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["Benchmark", "OpSpec", "REGISTRY", "register", "unregister", "registered", "spec", "names", "load", "view",
           "benchmarked"]


def load(where):
    """The object named by ``"module:attribute"`` (imported now), or ``where`` itself when it is not a string."""
    if not isinstance(where, str):
        return where
    module, _, attribute = where.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _no_options(shape: dict) -> dict:
    return {}


@dataclass(frozen=True)
class Benchmark:
    """What the GPU benchmarks (benchmarks/gpu_timing.py, gpu_correct.py, gpu_check) and the cost model read of an
    op, declared in its package (kernels/<op>/spec.py; the cost model's builders register themselves in
    benchmarks/cost_model.py by the op's stem), so that no benchmark branches on an op's name. Fields:

    shape, dry_shape: the benchmark's sizes and gpu_check --dry-run's (the two ReRoPE ops share theirs);
    kernels: per Triton backend, the AOT labels' prefixes of its forward kernel and of its training kernels (forward
        and backward), as the cost model names them;
    inputs: ``inputs(generator, device, **shape)``, the timed inputs (a dict by name) at a shape;
    fp32: the inputs that stay fp32 beside bf16 ones (the decays and parameters the models keep in fp32);
    options: ``options(shape)``, the call's options at a shape (the models' settings);
    check: ``check(rng, T, width)``, gpu_correct's float64 NumPy inputs (in the op's order) and options: T steps,
        ``width`` channels or head size;
    check_heads: per Triton backend, the head sizes gpu_correct's battery runs where the op's cases have others;
    fp32_budgets: per Triton backend, gpu_correct's fp32 budget where it is not the design's 1e-5;
    variants: more shapes of the same kernels, each timed, compiled and modelled as an entry of its own whose name
        ends in the variant's ("attention d=128"), by that name: the sizes it changes in shape and in dry_shape."""
    shape: dict
    dry_shape: dict
    kernels: dict
    inputs: Callable
    check: Callable
    fp32: tuple = ()
    options: Callable = _no_options
    check_heads: dict = field(default_factory=dict)
    fp32_budgets: dict = field(default_factory=dict)
    variants: dict = field(default_factory=dict)


@dataclass(frozen=True)
class OpSpec:
    """One op. Fields that name code hold ``"module:attribute"`` (or, in tests, the object); ``get(field)`` loads it.

    name: the public function's name, and the op's everywhere (``backend`` errors, conformance's command line);
    title: what a report's row calls the formula; module: the kernel module that defines ``name`` (in a test, the
    function itself);
    reference: the float64 NumPy form; naive: the float64 torch form (autograd's yardstick for gradients);
    battery: the battery declaration (a ``seqmix.kernels.declarations.Op``); backends: the tuple of backend objects
    in the order backend=None tries them; family: "attention" or "recurrence"; aot_modules: the modules whose
    ``aot_kernels()`` build this op's Triton kernels (the AOT build); c_entries: its C entry points (declared in
    its package's <stem>.h, whose loops kernels/native.py builds); benchmark: what the GPU benchmarks read, a
    ``Benchmark`` (None: the op is not benchmarked).
    """
    name: str
    title: str
    module: str
    reference: object
    naive: object
    battery: object
    backends: object
    family: str
    aot_modules: tuple = ()
    c_entries: tuple = ()
    benchmark: object = None

    def get(self, field: str):
        """The object a field names, imported on first use: ``spec("wkv4").get("reference")``."""
        return load(getattr(self, field))

    @property
    def function(self):
        """The public op (imports its module, and so torch)."""
        return load(self.module if callable(self.module) else f"{self.module}:{self.name}")

    @property
    def stem(self) -> str:
        """The kernel module's name below seqmix.kernels: "wkv4", "rerope" (both ReRoPE ops), "ssm"; the key of the
        benchmarks' shapes and the cost model's builders."""
        return self.name if callable(self.module) else self.module.split(".")[2]

    @property
    def stateful(self) -> bool:
        return self.family == "recurrence"


# Each op lives in its package, kernels/<stem>/: its public function (the package), its declaration (spec.py: the
# backends with their limits, the battery declaration, the benchmark) and its naive form (naive.py); an op with C
# loops also holds them there (<stem>.c, <stem>.h, c.py), and kernels/native.py builds them from c_entries.
REGISTRY: list[OpSpec] = [
    OpSpec("attention", "softmax attention", "seqmix.kernels.attention", "seqmix.reference.attention:softmax_attention",
           naive="seqmix.kernels.attention.naive:explicit_attention", battery="seqmix.kernels.attention.spec:ATTENTION",
           backends="seqmix.kernels.attention.spec:BACKENDS", family="attention",
           aot_modules=("seqmix.kernels.attention",), benchmark="seqmix.kernels.attention.spec:BENCHMARK"),
    OpSpec("rerope_attention", "ReRoPE prefill", "seqmix.kernels.rerope", "seqmix.reference.rope:rerope_attention",
           naive="seqmix.kernels.rerope.naive:rerope_attention", battery="seqmix.kernels.rerope.spec:REROPE_ATTENTION",
           backends="seqmix.kernels.rerope.spec:BACKENDS", family="attention",
           aot_modules=("seqmix.kernels.rerope.fused",), benchmark="seqmix.kernels.rerope.spec:PREFILL_BENCHMARK"),
    OpSpec("rerope_decode", "ReRoPE decode", "seqmix.kernels.rerope", "seqmix.reference.rope:rerope_decode",
           naive="seqmix.kernels.rerope.naive:rerope_decode", battery="seqmix.kernels.rerope.spec:REROPE_DECODE",
           backends="seqmix.kernels.rerope.spec:DECODE_BACKENDS", family="attention",
           aot_modules=("seqmix.kernels.rerope.fused", "seqmix.kernels.rerope.decode"),
           benchmark="seqmix.kernels.rerope.spec:DECODE_BENCHMARK"),
    OpSpec("wkv4", "RWKV-4 WKV", "seqmix.kernels.wkv4", "seqmix.reference.wkv4:wkv4",
           naive="seqmix.kernels.wkv4.naive:wkv4", battery="seqmix.kernels.wkv4.spec:WKV4",
           backends="seqmix.kernels.wkv4.spec:BACKENDS", family="recurrence", aot_modules=("seqmix.kernels.wkv4",),
           c_entries=("wkv4_forward", "wkv4_backward"), benchmark="seqmix.kernels.wkv4.spec:BENCHMARK"),
    OpSpec("wkv7", "RWKV-7 WKV", "seqmix.kernels.wkv7", "seqmix.reference.wkv7:wkv7",
           naive="seqmix.kernels.wkv7.naive:wkv7", battery="seqmix.kernels.wkv7.spec:WKV7",
           backends="seqmix.kernels.wkv7.spec:BACKENDS", family="recurrence", aot_modules=("seqmix.kernels.wkv7",),
           c_entries=("wkv7_forward", "wkv7_backward"), benchmark="seqmix.kernels.wkv7.spec:BENCHMARK"),
    OpSpec("selective_scan", "Mamba selective scan", "seqmix.kernels.ssm", "seqmix.reference.ssm:selective_scan",
           naive="seqmix.kernels.ssm.naive:selective_scan", battery="seqmix.kernels.ssm.spec:SELECTIVE_SCAN",
           backends="seqmix.kernels.ssm.spec:BACKENDS", family="recurrence", aot_modules=("seqmix.kernels.ssm",),
           c_entries=("selective_scan_forward", "selective_scan_backward"),
           benchmark="seqmix.kernels.ssm.spec:BENCHMARK"),
]


class _View(Mapping):
    """op name -> a field of its spec, loaded; read from REGISTRY at each look-up (see ``view``)."""

    def __init__(self, field: str):
        self.field = field

    def __getitem__(self, name):
        return spec(name).get(self.field)           # spec's KeyError lists the ops

    def __iter__(self):
        return iter(names())

    def __len__(self):
        return len(REGISTRY)


def view(field: str) -> Mapping:
    """A live mapping of every op's ``field`` (loaded on look-up): an op registered later is in it. The dispatcher's
    ``BACKENDS`` is ``view("backends")``, the battery's ``OPS`` is ``view("battery")``."""
    return _View(field)


def names() -> list[str]:
    """The ops' names, in the registry's order."""
    return [s.name for s in REGISTRY]


def benchmarked() -> list[OpSpec]:
    """The ops the GPU benchmarks run (those with a ``benchmark``), the recurrences first: gpu_check's parts run
    their most important rows first, so that a run cut short keeps them."""
    return sorted((op for op in REGISTRY if op.benchmark is not None), key=lambda op: op.family != "recurrence")


def spec(name: str) -> OpSpec:
    """The op called ``name``; a KeyError that lists the ops when there is none."""
    for s in REGISTRY:
        if s.name == name:
            return s
    raise KeyError(f"no op {name!r} in the registry: {names()}")


def register(new: OpSpec) -> OpSpec:
    """Adds ``new`` at the end of REGISTRY (its name must be new)."""
    if new.name in names():
        raise ValueError(f"op {new.name!r} is already registered")
    REGISTRY.append(new)
    return new


def unregister(name: str) -> None:
    REGISTRY.remove(spec(name))


@contextmanager
def registered(new: OpSpec):
    """``with registered(OpSpec(...)):`` the op is in REGISTRY, and out again afterwards (for tests)."""
    register(new)
    try:
        yield new
    finally:
        unregister(new.name)
