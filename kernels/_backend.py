"""Which backend a call runs on: torch, Triton or the C loops (``native``), and the dtypes each takes."""
from __future__ import annotations

import os

import torch

from seqmix.kernels import native
from seqmix.kernels._common import FLOAT_DTYPES, HAS_TRITON, TORCH_DTYPES

BACKENDS = ("torch", "triton", "c")
# The ops that have C loops (kernels/native.c): the recurrences, forward and backward.
C_OPS = ("wkv4", "wkv7", "selective_scan")


def resolve_backend(backend: str | None, device: torch.device, op: str = "", dtype: torch.dtype = torch.float32,
                    c_refuses: str = "") -> str:
    """The backend a call runs on. None picks Triton for CUDA tensors; for CPU tensors, the C loops when ``op``
    has them (C_OPS), the dtype is fp32, fp16 or bf16, they take the call's shape (``c_refuses``: why not, empty
    when they do) and they build here (for inference and training alike); the torch backend otherwise. 'triton' on
    CPU needs the interpreter; 'c' with ``c_refuses`` is a ValueError that says why."""
    if backend is None:
        if device.type == "cuda" and HAS_TRITON:
            return "triton"
        if op in C_OPS and device.type == "cpu" and dtype in backend_dtypes("c") and not c_refuses:
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
        if c_refuses:
            raise ValueError(f"backend='c' {c_refuses}")
        if native.unavailable_reason():
            raise RuntimeError(f"backend='c' is not available here: {native.unavailable_reason()}")
    return backend


def backend_dtypes(backend: str) -> tuple:
    """Triton kernels and C loops take fp32, fp16 and bf16; the torch backend also float64."""
    return TORCH_DTYPES if backend == "torch" else FLOAT_DTYPES


def check_backend_dtype(backend: str, dtype: torch.dtype) -> None:
    allowed = backend_dtypes(backend)
    if dtype not in allowed:
        raise TypeError(f"backend={backend!r} takes dtypes {[str(d) for d in allowed]}, got {dtype}")
