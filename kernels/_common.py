"""What every op shares: the optional Triton import, backend choice, input checks, output allocation.

Kernel modules write ``from __future__ import annotations`` and ``from kernels._common import triton, tl``, so that
``BLOCK: tl.constexpr`` is never evaluated and a module imports (torch backend only) where Triton is missing.
"""
from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # Triton has wheels for Linux x86_64 only; the torch backend needs none of it.
    triton = tl = None

    class _NoTriton:
        """Stands in for ``triton`` so that ``@triton.jit`` leaves the function as it is."""

        @staticmethod
        def jit(fn=None, **_):
            return fn if fn is not None else (lambda f: f)

    triton = _NoTriton()
    HAS_TRITON = False
else:
    HAS_TRITON = True

BACKENDS = ("torch", "triton")
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# float64 is accepted by the torch backends only: it is what gradcheck needs.
TORCH_DTYPES = FLOAT_DTYPES + (torch.float64,)

# Tests set this to True so that every output buffer starts as NaN: a kernel that skips an element then fails.
POISON_OUTPUTS = False


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype states and sums are kept in: float64 for float64 inputs (torch backend), fp32 for the others."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def new_output(shape, dtype, device) -> torch.Tensor:
    """An uninitialized output buffer (NaN-filled while ``POISON_OUTPUTS`` is set)."""
    if POISON_OUTPUTS:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def resolve_backend(backend: str | None, device: torch.device) -> str:
    """None picks Triton for CUDA tensors and torch otherwise; 'triton' on CPU needs the interpreter."""
    if backend is None:
        return "triton" if device.type == "cuda" and HAS_TRITON else "torch"
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}")
    if backend == "triton":
        if not HAS_TRITON:
            raise RuntimeError("backend='triton' needs the triton package (pip install triton; Linux x86_64 only)")
        if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                "backend='triton' with CPU tensors runs under the Triton interpreter: set the environment variable "
                "TRITON_INTERPRET=1 before triton is first imported (before importing kernels), or pass CUDA tensors")
    return backend


def check_tensor(name: str, x, shape: tuple, dtypes=TORCH_DTYPES) -> torch.Tensor:
    """``x`` must be a tensor of one of ``dtypes`` whose shape matches ``shape`` (None matches any size)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {x.dtype}")
    if x.dim() != len(shape) or any(e is not None and e != s for e, s in zip(shape, x.shape)):
        want = "(" + ", ".join("*" if e is None else str(e) for e in shape) + ")"
        raise ValueError(f"{name} must have shape {want}, got {tuple(x.shape)}")
    return x


def check_devices(**tensors) -> torch.device:
    """All given tensors (None skipped) on one device; returns it."""
    named = {k: v for k, v in tensors.items() if v is not None}
    devices = {v.device for v in named.values()}
    if len(devices) > 1:
        raise ValueError("inputs must be on one device, got " + ", ".join(f"{k}: {v.device}" for k, v in named.items()))
    return devices.pop()


def check_same_dtype(**tensors) -> torch.dtype:
    """All given float tensors (None skipped) of one dtype; returns it."""
    named = {k: v for k, v in tensors.items() if v is not None}
    dtypes = {v.dtype for v in named.values()}
    if len(dtypes) > 1:
        raise TypeError("inputs must share one dtype, got " + ", ".join(f"{k}: {v.dtype}" for k, v in named.items()))
    return dtypes.pop()


def check_backend_dtype(backend: str, dtype: torch.dtype) -> None:
    """Triton kernels take fp32, fp16 and bf16; the torch backend also float64."""
    allowed = FLOAT_DTYPES if backend == "triton" else TORCH_DTYPES
    if dtype not in allowed:
        raise TypeError(f"backend={backend!r} takes dtypes {[str(d) for d in allowed]}, got {dtype}")
