"""The C build: the CPU path (backend="c") of the ops with C loops (kernels/<op>/<op>.c), forward and backward.

Why: on a CPU each recurrence costs a few multiply-adds and exponentials per element, and the chunked torch forms
spend their time in about twenty eager passes over memory (benchmarks/README.md measures them). A loop that walks
time once, vectorized over channels (WKV-4, the scan's groups of eight) or a head's values (WKV-7), does the work in
one pass: the role the Triton kernels play on a GPU. These loops run the same formulas as the Triton kernels, their
backwards included: a forward that will be differentiated saves what its backward needs (WKV-4 three numbers per
token; WKV-7 and the scan their state every CHECKPOINT steps), and the backward walks time in reverse.
Each op's c.py (kernels/<op>/c.py) makes them autograd ops; backend=None takes them on CPU tensors, for inference and
training alike.

Built on first use with the system C compiler (``$CC``, split as a shell splits it, else ``cc``) into a cache
directory (``$SEQMIX_CACHE``, else ``~/.cache/seqmix``), keyed by the source, the flags, the compiler and the CPU
(the build uses -march=native), with a checksum beside it that is checked before every load; and loaded with ctypes,
whose calls release the GIL. Threads: ``torch.set_num_threads(n)`` (or ``OMP_NUM_THREADS`` at start) sets torch's
threads and these loops' alike: work items (rows of the outer loops) are split over ``torch.get_num_threads()``
threads at each call. Every work item writes outputs of its own, and the sums over work items (the parameter
gradients' sums over batch rows) run afterwards in a fixed order (``sum_rows``), so results are the same bits with
any number of threads. ``SEQMIX_NATIVE=0`` turns the path off. Every function takes CPU tensors of any float dtype
and layout and hands the loops contiguous fp32 copies where needed; outputs, states and gradients are fp32.

The ABI is written once: ENTRIES holds each entry point's prototype as native.h declares it (c_abi.table; a test
checks the two agree), from which the library's argtypes and restype are set and by which the wrappers pass their
arguments by name; every entry point returns a status (native.h's enum status, mirrored by STATUS).

The builder takes other sources too (``Sources``, ``load``): the models' decoding steps (each model's
<model>_step.c, declared by its step.py through models/decode.py), a whole model's step in one call that runs
these loops at T = 1 between its matrix products, on OpenMP threads (-fopenmp: torch's own, see
models/native/steps.h), are built with these sources into a library of their own.

Flags: -O3 -march=native; -fno-math-errno and -fno-trapping-math (exp never sets errno, nothing traps);
-ffinite-math-only and -fno-signed-zeros, which GCC needs to turn the loops' comparisons into vector min/max and
blends (without them no loop with a clamp vectorizes). No -ffast-math: no reassociation (WKV-4's two-sum stays
exact) and no flush-to-zero. Under -ffinite-math-only a NaN no longer carries through comparisons, so the loops test
the bits of the inputs that meet one (the exponents' clamps, WKV-4's running maximum): from a non-finite one on,
what it reaches (a channel, a head) comes out NaN. Inputs that enter by products and sums only carry a NaN
themselves. Elsewhere a comparison keeps a NaN by the same bit test (native.h: relu, sigmoid, silu; the steps' e^ of
a weight and its key norm's clamp), or it would turn NaN into finite logits (`k > 0 ? k : 0` is 0 for a NaN, in IEEE
arithmetic too); tests/models/test_models_decode.py puts NaN in the decoding step's states and weights.
tests/kernels/test_kernels_native.py puts a NaN in each input of each op.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import subprocess
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from . import c_abi, registry
from ._common import new_output

__all__ = ["exp", "softplus", "sum_rows", "available", "unavailable_reason", "library", "load", "Sources", "KERNELS",
           "ENTRIES", "STATUS", "CHECKPOINT", "check_status", "call", "floats", "fp32", "pointers", "initial_state",
           "dtypes_of", "grads_as", "NativeUnavailable"]

SOURCE = Path(__file__).with_name("native.c")
HEADER = SOURCE.with_name("native.h")
# native.c's entry points: native.h is the one signature table (the compiler checks native.c's definitions against
# it, tests/kernels/test_kernels_native.py that every function native.c exports is declared there); ctypes' argtypes and
# restype come from its prototypes, and the wrappers pass arguments by name through them. Each op's loops have a
# header of their own in the op's package (kernels/<op>/<op>.h); ENTRIES, below, holds native.h's and theirs.
SHARED_ENTRIES = c_abi.table(HEADER.read_text())
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-ffinite-math-only",
         "-fno-signed-zeros", "-shared", "-fPIC")
# -fopenmp for the models' steps' threads (torch's libgomp, see models/native/steps.h); a compiler without OpenMP
# (Apple's clang) builds with -fopenmp-simd, the `omp simd` loops alone, and decoding steps run on one thread
OPENMP = ("-fopenmp", "-fopenmp-simd")
SERIAL_WORK = 1 << 15    # below this many elements per call, one thread: starting threads would cost more
CHECKPOINT = 16          # the loops that save states for their backward (WKV-7, the scan) keep one every this many
                         # steps; the backward re-runs at most this many steps from one, in memory that stays in cache
# native.h's enum status: every entry point returns one; 0 is STATUS_OK, and check_status raises for the others (an
# op whose loops return STATUS_HEAD_SIZE words its limit in its own table: kernels/wkv7/c.py)
STATUS = {1: (MemoryError, "could not allocate its scratch memory"),                      # STATUS_NO_MEMORY
          2: (ValueError, "does not take the head size it was given")}                    # STATUS_HEAD_SIZE


class NativeUnavailable(RuntimeError):
    """The C loops cannot be built or loaded here (the message says why)."""


def check_status(status: int, entry: str, inputs: str = "", meanings: dict | None = None) -> None:
    """Raise what a non-zero status from the C entry point ``entry`` means (``meanings``, STATUS by default),
    ``inputs`` naming what it was called with."""
    if status:
        error, meaning = (meanings or STATUS).get(status, (RuntimeError, f"returned the unknown status {status}"))
        raise error(f"{entry} {meaning}" + (f" (called with {inputs})" if inputs else ""))


def _cpu_identity() -> str:
    """What -march=native depends on: the CPU's feature flags where Linux lists them, else the machine type."""
    try:
        flags = [line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")]
    except OSError:
        flags = []
    return platform.machine() + (flags[0] if flags else platform.processor())


def compiler() -> list[str]:
    """The C compiler command: ``$CC`` split as a shell would ("ccache gcc" is a command with an argument), else cc."""
    return shlex.split(os.environ.get("CC", "")) or ["cc"]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _intact(library_path: Path, checksum: Path) -> bool:
    """Whether a cached library is whole: its checksum is the one its build recorded beside it. A file cut short (a
    full disk, an interrupted copy) would otherwise be loaded, and the process killed by SIGBUS on its first call."""
    try:
        return checksum.read_text().strip() == _digest(library_path)
    except (FileNotFoundError, NotADirectoryError):     # not built yet (or the cache is no directory: _build says)
        return False
    except OSError as e:
        raise NativeUnavailable(f"cannot read the cached C library {library_path} ({e.strerror})") from None


@dataclass(frozen=True)
class Sources:
    """A C library to build: ``name`` (its cached file's stem), the ``files`` it compiles (.c) and includes
    (headers; each file's folder is on the include path), headers ``generated`` from Python tables ((file name,
    text) pairs, written beside the build), and its entry points' signature table (c_abi.table), from which the
    loaded library's argtypes and restype are set. KERNELS is native.c's; models/decode.py declares the models'
    steps, whose library holds native.c too (the steps run its loops)."""
    name: str
    files: tuple[Path, ...]
    entries: tuple[c_abi.Entry, ...]
    generated: tuple[tuple[str, str], ...] = ()


def _op_files() -> tuple[Path, ...]:
    """The C loops of every op of the registry that has C entry points: kernels/<op>/<op>.c and its header."""
    folders = [Path(__file__).parent / op.stem for op in registry.REGISTRY if op.c_entries]
    return tuple(folder / f"{folder.name}{suffix}" for folder in folders for suffix in (".c", ".h"))


# native.c and every op's loops, one library; its signature table: native.h's entry points and each op header's
_OP_FILES = _op_files()
ENTRIES = {**SHARED_ENTRIES, **{name: entry for path in _OP_FILES if path.suffix == ".h"
                                for name, entry in c_abi.table(path.read_text()).items()}}
KERNELS = Sources("native", (SOURCE, HEADER, *_OP_FILES), tuple(ENTRIES.values()))


def _build(command: list[str], sources: Sources = KERNELS) -> Path:
    """Compile ``sources`` once per (sources, flags, compiler, CPU) and return the shared library's path. The build
    goes to a temporary file in the cache directory, renamed into place with its checksum: processes that build at
    once (pytest beside a notebook kernel) each see a whole library or none, and a damaged one is built again."""
    name = shlex.join(command)
    try:
        version = subprocess.run([*command, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise NativeUnavailable(f"no working C compiler {name!r} ({e}); install gcc or set CC") from None
    texts = [f"{path.name}\0{path.read_text()}" for path in sources.files]
    texts += [f"{file}\0{text}" for file, text in sources.generated]
    key = hashlib.sha256("\0".join([*texts, *FLAGS, *OPENMP, version, _cpu_identity()]).encode()).hexdigest()
    cache = Path(os.environ.get("SEQMIX_CACHE", Path.home() / ".cache" / "seqmix"))
    target = cache / f"{sources.name}-{key[:16]}.so"
    checksum = target.with_name(target.name + ".sha256")
    if _intact(target, checksum):
        return target
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            built, built_checksum = Path(tmp, target.name), Path(tmp, checksum.name)
            for file, text in sources.generated:
                Path(tmp, file).write_text(text)
            compiled = [str(s) for s in sources.files if s.suffix == ".c"]
            includes = [f"-I{folder}" for folder in dict.fromkeys([*(s.parent for s in sources.files), tmp])]
            for openmp in OPENMP:
                done = subprocess.run([*command, *FLAGS, openmp, *includes, *compiled, "-o", str(built)],
                                      capture_output=True, text=True)
                if done.returncode == 0:
                    break
            if done.returncode != 0:
                raise NativeUnavailable(f"C compiler {name!r} could not build {' and '.join(compiled)}:\n"
                                        f"{done.stderr[-2000:]}")
            if not built.is_file():
                raise NativeUnavailable(f"C compiler {name!r} reported success but wrote no {target.name}; "
                                        "set CC to a C compiler")
            built_checksum.write_text(_digest(built))
            os.replace(built, target)
            os.replace(built_checksum, checksum)
    except OSError as e:
        raise NativeUnavailable(f"cannot build the C library into the cache directory {cache} ({e.strerror or e}); "
                                "set SEQMIX_CACHE to a writable directory") from None
    return target


@lru_cache(maxsize=None)
def load(sources: Sources) -> ctypes.CDLL:
    """The library of ``sources``, built on first use, its entry points typed from their table; raises
    NativeUnavailable with the reason when it cannot be had."""
    if os.environ.get("SEQMIX_NATIVE", "1") == "0":
        raise NativeUnavailable("the C loops are turned off by SEQMIX_NATIVE=0")
    if platform.system() == "Windows":
        raise NativeUnavailable("the C loops are built with a Unix C compiler; not on Windows")
    path = _build(compiler(), sources)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise NativeUnavailable(f"cannot load the C library {path}: {e}") from None
    return c_abi.bind(lib, {entry.name: entry for entry in sources.entries})


def library() -> ctypes.CDLL:
    """native.c's library (KERNELS), built on first use; raises NativeUnavailable with the reason when it cannot be
    had."""
    return load(KERNELS)


@lru_cache(maxsize=None)
def unavailable_reason() -> str:
    """'' when the C loops build and load here, else why not."""
    try:
        library()
    except (NativeUnavailable, OSError) as e:     # OSError: native.c itself unreadable (the message names it)
        return str(e)
    return ""


@lru_cache(maxsize=None)
def _warn_once(reason: str) -> None:
    warnings.warn(f"kernels: the C loops are not available, so the recurrences run the slower torch backend on CPU: "
                  f"{reason}",
                  RuntimeWarning, stacklevel=4)


def available() -> bool:
    """Whether backend=None can take the C loops; says once why not (unless SEQMIX_NATIVE=0 asked for that)."""
    reason = unavailable_reason()
    if reason and os.environ.get("SEQMIX_NATIVE", "1") != "0":
        _warn_once(reason)
    return not reason


@lru_cache(maxsize=None)
def _pool(threads: int, pid: int) -> ThreadPoolExecutor:
    """One pool per thread count and process: a pool's threads do not survive a fork, so a forked child (a
    DataLoader worker, say) starts a pool of its own."""
    return ThreadPoolExecutor(threads, thread_name_prefix="seqmix-native")


def _run(fn, items: int, work: int, *args, inputs: str = "", meanings: dict | None = None) -> None:
    """fn(first, last, *args) over [0, items), split into one contiguous range per thread (ctypes releases the
    GIL during each call); raises what a non-zero status of fn means (check_status, ``inputs`` naming the call's).
    ``work``: elements touched, to keep small calls on one thread."""
    threads = min(torch.get_num_threads(), items)
    if threads <= 1 or work < SERIAL_WORK:
        statuses = [fn(0, items, *args)]
    else:
        bounds = [items * i // threads for i in range(threads + 1)]
        statuses = _pool(threads, os.getpid()).map(lambda i: fn(bounds[i], bounds[i + 1], *args), range(threads))
    check_status(max(statuses), fn.__name__, inputs, meanings)


def call(entry: str, items: int, work: int, inputs: str = "", meanings: dict | None = None, **named) -> None:
    """The entry point ``entry`` (of ENTRIES) over ``items`` work items split over the threads, its arguments after
    (first, last) given by their names; raises what a non-zero status means (``meanings``: STATUS by default),
    ``inputs`` naming the call's. ``work``: elements touched, to keep small calls on one thread."""
    _run(getattr(library(), entry), items, work, *ENTRIES[entry].arguments(named, skip=2), inputs=inputs,
         meanings=meanings)


def pointers(*tensors):
    """The tensors' data as C pointers; None stays None (NULL: an optional input left out)."""
    return [None if x is None else ctypes.c_void_p(x.data_ptr()) for x in tensors]


def fp32(x):
    """x as a contiguous fp32 tensor (x itself when it is one already); None stays None."""
    return None if x is None else x.float().contiguous()


def initial_state(state, shape):
    """The state the loop overwrites: a contiguous fp32 copy of ``state``, or zeros."""
    return torch.zeros(shape) if state is None else state.float().clone(memory_format=torch.contiguous_format)


def _fp32_on_cpu(function: str, x) -> torch.Tensor:
    """x as the C loops read it: a contiguous fp32 CPU tensor. Any other dtype is refused (a float64 buffer read as
    fp32 gave garbage; an fp16 one, written 4 bytes per 2-byte element, corrupted the heap)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"native.{function}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.float32:
        raise TypeError(f"native.{function}: x must have dtype torch.float32 (the C loops' type), got {x.dtype}; "
                        f"convert it with x.float()")
    if x.device.type != "cpu":
        raise ValueError(f"native.{function}: x must be on the CPU, got {x.device}")
    return x.contiguous()


def exp(x):
    """The loops' e^x (exp_clamped in native.c) on an fp32 CPU tensor: x clamped to [-87, 88], within 1 ulp.
    Raises TypeError naming x for any other dtype."""
    x = _fp32_on_cpu("exp", x)
    out = torch.empty_like(x)
    check_status(library().exp_array(*ENTRIES["exp_array"].arguments(dict(n=x.numel(), x=x, out=out))), "exp_array")
    return out


def softplus(x):
    """The scan's softplus (native.c) on an fp32 CPU tensor. Raises TypeError naming x for any other dtype."""
    x = _fp32_on_cpu("softplus", x)
    out = torch.empty_like(x)
    check_status(library().softplus_array(*ENTRIES["softplus_array"].arguments(dict(n=x.numel(), x=x, out=out))),
                 "softplus_array")
    return out


def sum_rows(x):
    """x (R, ...) summed over its first axis, the rows added in order whatever the thread count: the parameter
    gradients' sums over batch rows, so that a training run gives the same numbers with 1 thread or 8. x: fp32 on
    the CPU, at least 1-D (TypeError / ValueError naming x otherwise)."""
    x = _fp32_on_cpu("sum_rows", x)
    if x.dim() < 1:
        raise ValueError(f"native.sum_rows: x must have a first axis (rows) to sum over, got shape {tuple(x.shape)}")
    out = torch.empty(x.shape[1:])
    cols = out.numel()
    call("sum_rows", cols, x.numel(), rows=x.shape[0], cols=cols, out=out, **{"in": x})
    return out


def dtypes_of(*inputs):
    """The inputs' dtypes (None for an input left out): what an op's C autograd function gives its gradients."""
    return tuple(None if x is None else x.dtype for x in inputs)


def grads_as(grads, dtypes):
    """Each gradient in its input's dtype; None where the input is None."""
    return tuple(None if dtype is None else g.to(dtype) for g, dtype in zip(grads, dtypes))


def floats(*shape):
    """A new (uninitialized, or NaN-poisoned under the tests) fp32 CPU tensor of ``shape``: a loop's output."""
    return new_output(shape, torch.float32, torch.device("cpu"))
