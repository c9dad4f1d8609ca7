"""The C loops of kernels/native.c: the CPU path (backend="c") of wkv4, wkv7 and selective_scan, forward and backward.

Why: on a CPU each recurrence costs a few multiply-adds and exponentials per element, and the chunked torch forms
spend their time in about twenty eager passes over memory (benchmarks/README.md measures them). A loop that walks
time once, vectorized over channels (WKV-4, the scan's groups of eight) or a head's values (WKV-7), does the work in
one pass: the role the Triton kernels play on a GPU. These loops run the same formulas as the Triton kernels, their
backwards included: a forward that will be differentiated saves what its backward needs (WKV-4 three numbers per
token; WKV-7 and the scan their state every CHECKPOINT steps), and the backward walks time in reverse.
kernels/_native_autograd.py makes them autograd ops; backend=None takes them on CPU tensors, for inference and
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

The builder takes other sources too (``Sources``, ``load``): the models' decoding steps (models/native/, declared
by models/decode.py), a whole model's step in one call that runs these loops at T = 1 between its matrix products,
on OpenMP threads (-fopenmp: torch's own, see models/native/decode.c), are built with native.c into a library of
their own.

Flags: -O3 -march=native; -fno-math-errno and -fno-trapping-math (exp never sets errno, nothing traps);
-ffinite-math-only and -fno-signed-zeros, which GCC needs to turn the loops' comparisons into vector min/max and
blends (without them no loop with a clamp vectorizes). No -ffast-math: no reassociation (WKV-4's two-sum stays
exact) and no flush-to-zero. Under -ffinite-math-only a NaN no longer carries through comparisons, so the loops test
the bits of the inputs that meet one (the exponents' clamps, WKV-4's running maximum): from a non-finite one on,
what it reaches (a channel, a head) comes out NaN. Inputs that enter by products and sums only carry a NaN
themselves. Elsewhere a comparison keeps a NaN by the same bit test (native.h: relu, sigmoid, silu; the steps' e^ of
a weight and its key norm's clamp), or it would turn NaN into finite logits (`k > 0 ? k : 0` is 0 for a NaN, in IEEE
arithmetic too); tests/test_models_decode.py puts NaN in the decoding step's states and weights.
tests/test_kernels_native.py puts a NaN in each input of each op.
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

from seqmix.kernels import c_abi
from seqmix.kernels._common import new_output

__all__ = ["wkv4_forward", "wkv7_forward", "selective_scan_forward", "exp", "softplus", "available",
           "unavailable_reason", "library", "load", "Sources", "KERNELS", "ENTRIES", "STATUS", "check_status",
           "pointers", "initial_state", "NativeUnavailable"]

SOURCE = Path(__file__).with_name("native.c")
HEADER = SOURCE.with_name("native.h")
# native.c's entry points: native.h is the one signature table (the compiler checks native.c's definitions against
# it, tests/test_kernels_native.py that every function native.c exports is declared there); ctypes' argtypes and
# restype come from its prototypes, and the wrappers below pass arguments by name through them
ENTRIES = c_abi.table(HEADER.read_text())
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-ffinite-math-only",
         "-fno-signed-zeros", "-shared", "-fPIC")
# -fopenmp for the models' steps' threads (torch's libgomp, see models/native/decode.c); a compiler without OpenMP
# (Apple's clang) builds with -fopenmp-simd, the `omp simd` loops alone, and decoding steps run on one thread
OPENMP = ("-fopenmp", "-fopenmp-simd")
SERIAL_WORK = 1 << 15    # below this many elements per call, one thread: starting threads would cost more
ALIGN = 16               # WKV-4 channel blocks are multiples of this (whole vectors)
CHECKPOINT = 16          # WKV-7 and the scan keep their state every this many steps for the backward, which re-runs
                         # at most this many steps from one, in memory that stays in cache
GROUPS_PER_CALL = 16     # the scan's backward: work items per call where the batch alone gives fewer
WKV7_MAX_HEAD = 256      # the largest WKV-7 head the loops take (native.c's MAX_V * VEC; tested to agree)
# native.h's enum status: every entry point returns one; 0 is STATUS_OK, and check_status raises for the others
STATUS = {1: (MemoryError, "could not allocate its scratch memory"),                      # STATUS_NO_MEMORY
          2: (ValueError, f"takes head size N <= {WKV7_MAX_HEAD}")}                       # STATUS_HEAD_SIZE


class NativeUnavailable(RuntimeError):
    """The C loops cannot be built or loaded here (the message says why)."""


def check_status(status: int, entry: str, inputs: str = "") -> None:
    """Raise what a non-zero status from the C entry point ``entry`` means (STATUS), ``inputs`` naming what it
    was called with."""
    if status:
        error, meaning = STATUS.get(status, (RuntimeError, f"returned the unknown status {status}"))
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


KERNELS = Sources("native", (SOURCE, HEADER), tuple(ENTRIES.values()))


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


def _run(fn, items: int, work: int, *args, inputs: str = "") -> None:
    """fn(first, last, *args) over [0, items), split into one contiguous range per thread (ctypes releases the
    GIL during each call); raises what a non-zero status of fn means (check_status, ``inputs`` naming the call's).
    ``work``: elements touched, to keep small calls on one thread."""
    threads = min(torch.get_num_threads(), items)
    if threads <= 1 or work < SERIAL_WORK:
        statuses = [fn(0, items, *args)]
    else:
        bounds = [items * i // threads for i in range(threads + 1)]
        statuses = _pool(threads, os.getpid()).map(lambda i: fn(bounds[i], bounds[i + 1], *args), range(threads))
    check_status(max(statuses), fn.__name__, inputs)


def _call(entry: str, items: int, work: int, inputs: str = "", **named) -> None:
    """_run of the entry point ``entry``, its arguments after (first, last) given by their names in ENTRIES."""
    _run(getattr(library(), entry), items, work, *ENTRIES[entry].arguments(named, skip=2), inputs=inputs)


def pointers(*tensors):
    """The tensors' data as C pointers; None stays None (NULL: an optional input left out)."""
    return [None if x is None else ctypes.c_void_p(x.data_ptr()) for x in tensors]


def fp32(x):
    """x as a contiguous fp32 tensor (x itself when it is one already); None stays None."""
    return None if x is None else x.float().contiguous()


def initial_state(state, shape):
    """The state the loop overwrites: a contiguous fp32 copy of ``state``, or zeros."""
    return torch.zeros(shape) if state is None else state.float().clone(memory_format=torch.contiguous_format)


def exp(x):
    """The loops' e^x (exp_clamped in native.c) on a contiguous fp32 tensor: x clamped to [-87, 88], within 1 ulp."""
    out = torch.empty_like(x)
    check_status(library().exp_array(*ENTRIES["exp_array"].arguments(dict(n=x.numel(), x=x, out=out))), "exp_array")
    return out


def softplus(x):
    """The scan's softplus (native.c) on a contiguous fp32 tensor."""
    out = torch.empty_like(x)
    check_status(library().softplus_array(*ENTRIES["softplus_array"].arguments(dict(n=x.numel(), x=x, out=out))),
                 "softplus_array")
    return out


def sum_rows(x):
    """x (R, ...) summed over its first axis, the rows added in order whatever the thread count: the parameter
    gradients' sums over batch rows, so that a training run gives the same numbers with 1 thread or 8."""
    x = x.contiguous()
    out = torch.empty(x.shape[1:])
    cols = out.numel()
    _call("sum_rows", cols, x.numel(), rows=x.shape[0], cols=cols, out=out, **{"in": x})
    return out


def _floats(*shape):
    return new_output(shape, torch.float32, torch.device("cpu"))


def _wkv4_block(B, C):
    """Channels per WKV-4 work item: blocks as wide as the thread count allows, since a narrow block walks memory
    with a stride of a whole row per token (measured 3x slower at 64 channels than at 768)."""
    per_row = -(-torch.get_num_threads() // B)                             # blocks per row to feed every thread
    return min(C, -(-C // per_row // ALIGN) * ALIGN)


def wkv4_forward(w, u, k, v, num0, den0, max0, save=False):
    """RWKV-4's WKV: w, u (C,); k, v (B, T, C); state (B, C) each -> (y (B, T, C), (num, den, max), saved); all fp32.
    ``saved``: what wkv4_backward needs (v - y, d, z per token; lag and bad per channel), None without ``save``.
    Work items are (batch row, channel block)."""
    w, u, k, v, num0, den0, max0 = map(fp32, (w, u, k, v, num0, den0, max0))
    B, T, C = k.shape
    block = _wkv4_block(B, C)
    y = _floats(B, T, C)
    num, den, mx, lag = (_floats(B, C) for _ in range(4))
    bad = torch.empty(B, C, dtype=torch.int32)
    per_token = [_floats(B, T, C) for _ in range(3)] if save else [None] * 3
    _call("wkv4_forward", B * -(-C // block), k.numel(), T=T, C=C, block=block, w=w, u=u, k=k, v=v, y=y, num0=num0,
         den0=den0, max0=max0, num_out=num, den_out=den, max_out=mx, lag_out=lag, bad_out=bad,
         **dict(zip(("vy_save", "d_save", "z_save"), per_token)))
    return y, (num, den, mx), ((*per_token, lag, bad) if save else None)


def wkv4_backward(w, u, k, v, num0, den0, max0, num, den, saved, gy, g_num, g_den, g_max):
    """The gradients of wkv4_forward (fp32 inputs, as it took them; num, den its final state, ``saved`` what it
    saved) for the cotangents gy (B, T, C) and g_num, g_den, g_max (B, C): (dw, du, dk, dv, dnum0, dden0, dmax0),
    fp32; dw and du summed over the batch in a fixed order."""
    gy, g_num, g_den, g_max = map(fp32, (gy, g_num, g_den, g_max))
    B, T, C = k.shape
    block = _wkv4_block(B, C)
    gk, gv = _floats(B, T, C), _floats(B, T, C)
    gw, gu, g_num0, g_den0, g_max0 = (_floats(B, C) for _ in range(5))
    vy, d, z, lag, bad = saved
    _call("wkv4_backward", B * -(-C // block), k.numel(), T=T, C=C, block=block, w=w, u=u, k=k, v=v, vy_save=vy,
         d_save=d, z_save=z, gy=gy, num0=num0, den0=den0, max0=max0, num=num, den=den, lag_in=lag, bad=bad,
         gnum=g_num, gden=g_den, gmax=g_max, gk=gk, gv=gv, gw_out=gw, gu_out=gu, gnum0=g_num0, gden0=g_den0,
         gmax0=g_max0)
    return sum_rows(gw), sum_rows(gu), gk, gv, g_num0, g_den0, g_max0


def _scan_groups(batch, blocks):
    """Blocks of channels per work item of the scan's backward, from the shapes alone (never the thread count, so
    that dB and dC are summed in one order): one group per batch row when there are rows enough to share out,
    else up to GROUPS_PER_CALL groups in all."""
    per_row = min(blocks, -(-GROUPS_PER_CALL // batch))
    return -(-blocks // per_row)


def selective_scan_forward(u, delta, A, B, C, D, z, delta_bias, delta_softplus, state, save=False):
    """delta <- softplus(delta + delta_bias) (when asked), x_t = e^{delta_t A} x_{t-1} + delta_t B_t u_t,
    y_t = (C_t . x_t + D u_t) silu(z_t): u, delta, z (batch, D, T); A (D, N); B, C (batch, N, T); D, delta_bias (D,);
    D, z, delta_bias and state (batch, D, N) may be None -> (y (batch, D, T), last state (batch, D, N), saved); fp32.
    ``saved``: what selective_scan_backward needs (B and C time-major, checkpoints, bad lanes), None without
    ``save``."""
    u, delta, A, D, z, delta_bias = map(fp32, (u, delta, A, D, z, delta_bias))
    batch, dim, T = u.shape
    N = A.shape[1]
    y = _floats(batch, dim, T)
    last = initial_state(state, (batch, dim, N))
    Bt, Ct = (x.float().transpose(1, 2).contiguous() for x in (B, C))       # (batch, T, N): a token's N adjacent
    lanes = library().selective_scan_lanes()                                  # channels per work item
    items = batch * -(-dim // lanes)
    ckpt, bad = ((_floats(items, -(-T // CHECKPOINT), N, lanes), torch.empty(items, lanes, dtype=torch.int32))
                 if save else (None, None))
    _call("selective_scan_forward", items, batch * dim * T * N, D=dim, T=T, N=N, delta_softplus=int(delta_softplus),
         u=u, delta=delta, delta_bias=delta_bias, A=A, Bt=Bt, Ct=Ct, Dskip=D, z=z, y=y, state=last, ck=CHECKPOINT,
         ckpt=ckpt, bad_out=bad)
    return y, last, ((Bt, Ct, ckpt, bad) if save else None)


def selective_scan_backward(u, delta, A, D, z, delta_bias, delta_softplus, saved, dy, dlast):
    """The gradients of selective_scan_forward (fp32 inputs, as it took them; ``saved`` what it saved) for the
    cotangents dy (batch, D, T) and dlast (batch, D, N): (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, dstate), fp32,
    None for D, z, delta_bias where they were None; dA, dD, ddelta_bias summed over the batch, dB, dC over the
    channels, each in a fixed order."""
    Bt, Ct, ckpt, bad = saved
    dy, dlast = fp32(dy), fp32(dlast)
    batch, dim, T = u.shape
    N = A.shape[1]
    lanes = library().selective_scan_lanes()
    blocks = -(-dim // lanes)
    per_group = _scan_groups(batch, blocks)
    groups = -(-blocks // per_group)
    du, ddelta, dz = _floats(batch, dim, T), _floats(batch, dim, T), None if z is None else _floats(batch, dim, T)
    dA, dstate = _floats(batch, dim, N), _floats(batch, dim, N)
    dD, dbias = _floats(batch, dim), _floats(batch, dim)
    dB, dC = _floats(batch, groups, T, N), _floats(batch, groups, T, N)        # each group's channels' share
    _call("selective_scan_backward", batch * groups, batch * dim * T * N, D=dim, T=T, N=N,
         delta_softplus=int(delta_softplus), per_group=per_group, u=u, delta=delta, delta_bias=delta_bias, A=A,
         Bt=Bt, Ct=Ct, Dskip=D, z=z, ck=CHECKPOINT, ckpt=ckpt, bad_in=bad, dy=dy, dlast=dlast, du=du,
         ddelta=ddelta, dz=dz, dA_part=dA, dB_part=dB, dC_part=dC, dD_part=dD, dbias_part=dbias, dstate=dstate)
    dB, dC = ((x[:, 0] if groups == 1 else sum_rows(x.transpose(0, 1))).transpose(1, 2) for x in (dB, dC))
    return (du, ddelta, sum_rows(dA), dB, dC, None if D is None else sum_rows(dD), dz,
            None if delta_bias is None else sum_rows(dbias), dstate)


def wkv7_forward(r, log_w, k, v, a, b, state, save=False):
    """S_t = S_{t-1} diag(e^{log_w_t}) + (S_{t-1} a_t) b_t^T + v_t k_t^T, y_t = S_t r_t: r, log_w, k, v, a, b
    (B, T, H, N); state (B, H, N, N) [value, key] or None -> (y (B, T, H, N), last state (B, H, N, N), saved);
    fp32. ``saved``: what wkv7_backward needs (checkpoints, bad heads), None without ``save``."""
    r, log_w, k, v, a, b = map(fp32, (r, log_w, k, v, a, b))
    B, T, H, N = r.shape
    y = _floats(B, T, H, N)
    last = initial_state(state, (B, H, N, N))
    NP = library().wkv7_padded_size(N)         # the head size padded to whole vectors, as the loop keeps its state
    ckpt, bad = ((_floats(B * H, -(-T // CHECKPOINT), NP, NP), torch.empty(B * H, dtype=torch.int32)) if save
                 else (None, None))
    _call("wkv7_forward", B * H, B * T * H * N * N, f"r of shape {(B, T, H, N)}", T=T, H=H, N=N, r=r, log_w=log_w,
         k=k, v=v, a=a, b=b, y=y, state=last, ck=CHECKPOINT, ckpt=ckpt, bad_out=bad)
    return y, last, ((ckpt, bad) if save else None)


def wkv7_backward(r, log_w, k, v, a, b, saved, dy, dstate):
    """The gradients of wkv7_forward (fp32 inputs, as it took them; ``saved`` what it saved) for the cotangents
    dy (B, T, H, N) and dstate (B, H, N, N): (dr, dlog_w, dk, dv, da, db, dstate0), fp32."""
    ckpt, bad = saved
    dy, dstate = fp32(dy), fp32(dstate)
    B, T, H, N = r.shape
    grads = {name: _floats(B, T, H, N) for name in ("dr", "dlog_w", "dk", "dv", "da", "db")}
    dstate0 = _floats(B, H, N, N)
    _call("wkv7_backward", B * H, B * T * H * N * N, f"r of shape {(B, T, H, N)}", T=T, H=H, N=N, r=r, log_w=log_w,
         k=k, v=v, a=a, b=b, dy=dy, dstate=dstate, ck=CHECKPOINT, ckpt=ckpt, bad=bad, dstate0=dstate0, **grads)
    return (*grads.values(), dstate0)
