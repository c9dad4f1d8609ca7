"""The C loops of kernels/native.c: the CPU inference path (backend="c") of wkv4, wkv7 and selective_scan.

Why: on a CPU each recurrence costs a few multiply-adds and exponentials per element, and the chunked torch forms
spend their time in about twenty eager passes over memory (benchmarks/README.md measures them). A loop that walks
time once, vectorized over channels (WKV-4, the scan's groups of eight) or a head's values (WKV-7), does the work in
one pass: the role the Triton kernels play on a GPU. These loops run the same formulas as the Triton forwards; they
have no backward, so the ops take them only when no gradient is needed (backend=None picks them then; the chunked
torch path runs otherwise).

Built on first use with the system C compiler (``$CC``, else ``cc``) into a cache directory (``$SEQMIX_CACHE``,
else ``~/.cache/seqmix``), keyed by the source, the flags, the compiler and the CPU (the build uses -march=native),
and loaded with ctypes, whose calls release the GIL: work items (rows of the outer loops) are split over
``torch.get_num_threads()`` threads. ``SEQMIX_NATIVE=0`` turns the path off. Every function takes CPU tensors of
any float dtype and layout and hands the loops contiguous fp32 copies where needed; outputs and states are fp32.

Flags: -O3 -march=native; -fno-math-errno and -fno-trapping-math (exp never sets errno, nothing traps);
-ffinite-math-only and -fno-signed-zeros, which GCC needs to turn the loops' comparisons into vector min/max and
blends (without them no loop with a clamp vectorizes). No -ffast-math: no reassociation (WKV-4's two-sum stays
exact) and no flush-to-zero. Under -ffinite-math-only a NaN no longer carries through comparisons, so the loops
test the bits of the inputs that meet one (the exponents' clamps, WKV-4's running maximum): from a non-finite one
on, what it reaches (a channel, a head) comes out NaN. Inputs that enter by products and sums only carry a NaN
themselves. tests/test_kernels_native.py puts a NaN in each input of each op.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import torch

from seqmix.kernels._common import new_output

__all__ = ["wkv4_forward", "wkv7_forward", "selective_scan_forward", "exp", "softplus", "available",
           "unavailable_reason", "library", "NativeUnavailable"]

SOURCE = Path(__file__).with_name("native.c")
FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno", "-fno-trapping-math", "-ffinite-math-only",
         "-fno-signed-zeros", "-shared", "-fPIC")
SERIAL_WORK = 1 << 15    # below this many elements per call, one thread: starting threads would cost more
ALIGN = 16               # WKV-4 channel blocks are multiples of this (whole vectors)


class NativeUnavailable(RuntimeError):
    """The C loops cannot be built or loaded here (the message says why)."""


def _cpu_identity() -> str:
    """What -march=native depends on: the CPU's feature flags where Linux lists them, else the machine type."""
    try:
        flags = [line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")]
    except OSError:
        flags = []
    return platform.machine() + (flags[0] if flags else platform.processor())


def _build(compiler: str) -> Path:
    """Compile native.c once per (source, flags, compiler, CPU) and return the shared library's path."""
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise NativeUnavailable(f"no working C compiler {compiler!r} ({e}); install gcc or set CC") from None
    key = hashlib.sha256("\0".join([SOURCE.read_text(), *FLAGS, version, _cpu_identity()]).encode()).hexdigest()
    cache = Path(os.environ.get("SEQMIX_CACHE", Path.home() / ".cache" / "seqmix"))
    target = cache / f"native-{key[:16]}.so"
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:     # built aside, then renamed: concurrent builds are safe
        built = Path(tmp) / target.name
        done = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(built)], capture_output=True, text=True)
        if done.returncode != 0:
            raise NativeUnavailable(f"{compiler} could not build {SOURCE.name}:\n{done.stderr[-2000:]}")
        os.replace(built, target)
    return target


@lru_cache(maxsize=None)
def library() -> ctypes.CDLL:
    """The loaded library, built on first use; raises NativeUnavailable with the reason when it cannot be had."""
    if os.environ.get("SEQMIX_NATIVE", "1") == "0":
        raise NativeUnavailable("the C loops are turned off by SEQMIX_NATIVE=0")
    if platform.system() == "Windows":
        raise NativeUnavailable("the C loops are built with a Unix C compiler; not on Windows")
    lib = ctypes.CDLL(str(_build(os.environ.get("CC", "cc"))))
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.wkv4_forward.argtypes = [i64] * 5 + [ptr] * 13
    lib.selective_scan_forward.argtypes = [i64] * 6 + [ptr] * 10
    lib.wkv7_forward.argtypes = [i64] * 5 + [ptr] * 9
    lib.exp_array.argtypes = lib.softplus_array.argtypes = [i64, ptr, ptr]
    lib.selective_scan_lanes.restype = i64
    return lib


@lru_cache(maxsize=None)
def unavailable_reason() -> str:
    """'' when the C loops build and load here, else why not."""
    try:
        library()
    except (NativeUnavailable, OSError) as e:
        return str(e)
    return ""


@lru_cache(maxsize=None)
def _warn_once(reason: str) -> None:
    warnings.warn(f"kernels: the C loops are not available, so CPU inference runs the slower torch backend: {reason}",
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


def _run(fn, items: int, work: int, *args) -> None:
    """fn(first, last, *args) over [0, items), split into one contiguous range per thread (ctypes releases the
    GIL during each call). ``work``: elements touched, to keep small calls on one thread."""
    threads = min(torch.get_num_threads(), items)
    if threads <= 1 or work < SERIAL_WORK:
        fn(0, items, *args)
        return
    bounds = [items * i // threads for i in range(threads + 1)]
    list(_pool(threads, os.getpid()).map(lambda i: fn(bounds[i], bounds[i + 1], *args), range(threads)))


def _pointers(*tensors):
    """The tensors' data as C pointers; None stays None (NULL: an optional input left out)."""
    return [None if x is None else ctypes.c_void_p(x.data_ptr()) for x in tensors]


def _fp32(x):
    """x as a contiguous fp32 tensor (x itself when it is one already); None stays None."""
    return None if x is None else x.float().contiguous()


def _initial_state(state, shape):
    """The state the loop overwrites: a contiguous fp32 copy of ``state``, or zeros."""
    return torch.zeros(shape) if state is None else state.float().clone(memory_format=torch.contiguous_format)


def exp(x):
    """The loops' e^x (exp_clamped in native.c) on a contiguous fp32 tensor: x clamped to [-87, 88], within 1 ulp."""
    out = torch.empty_like(x)
    library().exp_array(x.numel(), *_pointers(x, out))
    return out


def softplus(x):
    """The scan's softplus (native.c) on a contiguous fp32 tensor."""
    out = torch.empty_like(x)
    library().softplus_array(x.numel(), *_pointers(x, out))
    return out


def wkv4_forward(w, u, k, v, num0, den0, max0):
    """RWKV-4's WKV: w, u (C,); k, v (B, T, C); state (B, C) each -> (y (B, T, C), (num, den, max)); all fp32.
    Work items are (batch row, channel block); blocks are as wide as the thread count allows, since a narrow block
    walks memory with a stride of a whole row per token (measured 3x slower at 64 channels than at 768)."""
    w, u, k, v, num0, den0, max0 = map(_fp32, (w, u, k, v, num0, den0, max0))
    B, T, C = k.shape
    per_row = -(-torch.get_num_threads() // B)                             # blocks per row to feed every thread
    block = min(C, -(-C // per_row // ALIGN) * ALIGN)
    blocks = -(-C // block)
    y = new_output((B, T, C), torch.float32, k.device)
    num, den, mx = (new_output((B, C), torch.float32, k.device) for _ in range(3))
    lag, bad = torch.empty(B, C), torch.empty(B, C, dtype=torch.int32)             # scratch
    _run(library().wkv4_forward, B * blocks, k.numel(), T, C, block,
         *_pointers(w, u, k, v, y, num0, den0, max0, num, den, mx, lag, bad))
    return y, (num, den, mx)


def selective_scan_forward(u, delta, A, B, C, D, z, delta_bias, delta_softplus, state):
    """delta <- softplus(delta + delta_bias) (when asked), x_t = e^{delta_t A} x_{t-1} + delta_t B_t u_t,
    y_t = (C_t . x_t + D u_t) silu(z_t): u, delta, z (batch, D, T); A (D, N); B, C (batch, N, T); D, delta_bias (D,);
    D, z, delta_bias and state (batch, D, N) may be None -> (y (batch, D, T), last state (batch, D, N)); fp32."""
    u, delta, A, D, z, delta_bias = map(_fp32, (u, delta, A, D, z, delta_bias))
    batch, dim, T = u.shape
    N = A.shape[1]
    y = new_output((batch, dim, T), torch.float32, u.device)
    last = _initial_state(state, (batch, dim, N))
    Bt, Ct = (x.float().transpose(1, 2).contiguous() for x in (B, C))       # (batch, T, N): a token's N adjacent
    lanes = library().selective_scan_lanes()                                  # channels per work item
    _run(library().selective_scan_forward, batch * -(-dim // lanes), batch * dim * T * N, dim, T, N,
         int(delta_softplus), *_pointers(u, delta, delta_bias, A, Bt, Ct, D, z, y, last))
    return y, last


def wkv7_forward(r, log_w, k, v, a, b, state):
    """S_t = S_{t-1} diag(e^{log_w_t}) + (S_{t-1} a_t) b_t^T + v_t k_t^T, y_t = S_t r_t: r, log_w, k, v, a, b
    (B, T, H, N); state (B, H, N, N) [value, key] or None -> (y (B, T, H, N), last state (B, H, N, N)); fp32."""
    r, log_w, k, v, a, b = map(_fp32, (r, log_w, k, v, a, b))
    B, T, H, N = r.shape
    y = new_output((B, T, H, N), torch.float32, r.device)
    last = _initial_state(state, (B, H, N, N))
    scratch = torch.empty(B, H, N * N + N)                                  # per head: S transposed, e^{log_w}
    _run(library().wkv7_forward, B * H, B * T * H * N * N, T, H, N,
         *_pointers(r, log_w, k, v, a, b, y, last, scratch))
    return y, last
