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

BACKENDS = ("torch", "triton", "c")
# The ops that have C loops (kernels/native.c): the recurrences, forward only.
C_OPS = ("wkv4", "wkv7", "selective_scan")
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# float64 is accepted by the torch backend only: it is what gradcheck needs.
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


def needs_grad(*tensors) -> bool:
    """Whether autograd will want gradients of any of ``tensors`` (None skipped)."""
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in tensors)


def resolve_backend(backend: str | None, device: torch.device, op: str = "", dtype: torch.dtype = torch.float32,
                    grad: bool = False) -> str:
    """The backend a call runs on. None picks Triton for CUDA tensors; for CPU tensors, the C loops when ``op``
    has them (C_OPS), no gradient is wanted (``grad``), the dtype is fp32, fp16 or bf16 and they build here; the
    torch backend otherwise. 'triton' on CPU needs the interpreter; 'c' is forward only."""
    if backend is None:
        if device.type == "cuda" and HAS_TRITON:
            return "triton"
        if op in C_OPS and device.type == "cpu" and not grad and dtype in backend_dtypes("c"):
            from kernels import native
            if native.available():
                return "c"
        return "torch"
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}")
    if backend == "triton":
        if not HAS_TRITON:
            raise RuntimeError("backend='triton' needs the triton package (pip install triton; Linux x86_64 only)")
        if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                "backend='triton' with CPU tensors runs under the Triton interpreter: set the environment variable "
                "TRITON_INTERPRET=1 before triton is first imported (before importing kernels), or pass CUDA tensors")
    if backend == "c":
        if op not in C_OPS:
            raise ValueError(f"backend='c' exists for {', '.join(C_OPS)} only, not {op or 'this op'}")
        if device.type != "cpu":
            raise ValueError(f"backend='c' takes CPU tensors, got {device}")
        if grad:
            raise ValueError("backend='c' is forward only (no autograd): call it under torch.no_grad() or on tensors "
                             "that do not require grad, or use backend='torch' for gradients")
        from kernels import native
        if native.unavailable_reason():
            raise RuntimeError(f"backend='c' is not available here: {native.unavailable_reason()}")
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


def backend_dtypes(backend: str) -> tuple:
    """Triton kernels and C loops take fp32, fp16 and bf16; the torch backend also float64."""
    return TORCH_DTYPES if backend == "torch" else FLOAT_DTYPES


def check_backend_dtype(backend: str, dtype: torch.dtype) -> None:
    allowed = backend_dtypes(backend)
    if dtype not in allowed:
        raise TypeError(f"backend={backend!r} takes dtypes {[str(d) for d in allowed]}, got {dtype}")
