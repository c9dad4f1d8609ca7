"""What every op shares: the optional Triton import, dtypes, input checks, output allocation, the launch type (a
leaf module: the backend choice, which needs the C loops, is ``_backend``).

Kernel modules write ``from __future__ import annotations`` and ``from seqmix.kernels._common import triton, tl``, so
that ``BLOCK: tl.constexpr`` is never evaluated and a module imports (torch backend only) where Triton is missing.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

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

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# float64 is accepted by the torch backend only: it is what gradcheck needs.
TORCH_DTYPES = FLOAT_DTYPES + (torch.float64,)

# Tests set this to True so that every output buffer starts as NaN: a kernel that skips an element then fails.
POISON_OUTPUTS = False


@dataclass(frozen=True)
class Launch:
    """How one Triton kernel is launched: its tile sizes, by the names of its constexprs (``{"BLOCK_M": 32, ...}``),
    and the compiler's num_warps and num_stages. ``kernel[grid](..., **launch.blocks, **launch.options)``; each
    module's ``aot_kernels`` compiles the same."""
    blocks: dict
    num_warps: int = 4
    num_stages: int = 3     # Triton's default on NVIDIA GPUs
    # Whether the compiler may contract a * b + c into one fma (enable_fp_fusion). Pinned, not left to Triton's
    # default, which 3.10 turns from on to off: a kernel whose rounding matters (WKV-4's two-sum) says so, and the
    # results stay the same bits across Triton versions. The interpreter never contracts.
    fp_fusion: bool = True

    def __getitem__(self, name: str) -> int:
        return self.blocks[name]

    @property
    def options(self) -> dict:
        return {"num_warps": self.num_warps, "num_stages": self.num_stages, "enable_fp_fusion": self.fp_fusion}


# Streaming multiprocessors of an H100 SXM: the recurrent forwards split their state until the grid has two
# programs per SM (where the math allows it), so that a batch of one still spreads over the whole GPU.
GPU_SMS = 132


def rows_per_program(rows: int, largest: int, smallest: int, sms: int = GPU_SMS) -> int:
    """State rows per program of a recurrence whose ``rows`` rows evolve independently: the largest power of two
    from ``largest`` down to ``smallest`` that still gives two programs per SM (``sms`` of them); ``smallest`` when
    none does."""
    block = largest
    while block > smallest and -(-rows // block) < 2 * sms:
        block //= 2
    return block


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype states and sums are kept in: float64 for float64 inputs (torch backend), fp32 for the others."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def new_output(shape, dtype, device) -> torch.Tensor:
    """An uninitialized output buffer (NaN-filled while ``POISON_OUTPUTS`` is set)."""
    if POISON_OUTPUTS:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


READ_VALUES_ON_HOST = True   # False: CPU tensors' values treated as a GPU's (kernels.testing.values_as_on_a_gpu)


def values_on_host(x: torch.Tensor) -> bool:
    """Whether checks of x's values may read them on the host: its memory is the host's (CPU), so reading costs no
    wait on a device."""
    return READ_VALUES_ON_HOST and x.device.type == "cpu"


def check_values(ok, message: str, details=lambda: "") -> None:
    """A check of input values (not shapes): ``ok()`` a boolean tensor, True when the inputs are fine. On the host
    a ValueError, ``message`` plus ``details()`` (which may read values); on a GPU a device-side assert
    (torch._assert_async) that fails the stream at its next sync: no wait on the device here, which would cost a
    host sync per call and break CUDA-graph capture."""
    result = ok()
    if values_on_host(result):
        if not bool(result):
            raise ValueError(message + details())
    else:
        torch._assert_async(result, message)


def first_order_only(backward):
    """For an autograd.Function whose backward computes its gradients outside autograd (the C loops, the Triton
    kernels, hand-written torch backwards): raise where a second-order gradient is asked for. Autograd runs a
    backward with grad mode on exactly when create_graph=True; the gradients returned would carry no graph, so a
    penalty built on them would add nothing without a word (torch's once_differentiable raises only where the
    incoming gradient requires grad: a penalty on the gradient of y.sum() still vanished). Double backward: the
    torch backends of wkv4, wkv7 and rerope_decode (README, "Edges")."""
    @functools.wraps(backward)
    def checked(ctx, *grads):
        if torch.is_grad_enabled():
            op = type(ctx).__name__.removesuffix("Backward")
            raise RuntimeError(f"{op} has no second-order gradients (its backward runs outside autograd), so "
                               "create_graph=True through it is refused; for a gradient penalty or a Hessian use "
                               "backend='torch' of wkv4, wkv7 or rerope_decode")
        return backward(ctx, *grads)
    return checked


def needs_grad(*tensors) -> bool:
    """Whether autograd will want gradients of any of ``tensors`` (None skipped)."""
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in tensors)


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


def all_finite(*tensors) -> bool:
    """Whether no tensor holds NaN or an infinity (read on the host): the torch backends' fast forms take finite
    inputs only (aten's fused attention drops a NaN score from its running max and returns finite rows where
    softmax is NaN; WKV-7's chunked products carry a non-finite input to its chunk's earlier steps)."""
    return all(bool(torch.isfinite(x).all()) for x in tensors)


def finite_log_decay(x: torch.Tensor) -> torch.Tensor:
    """A log decay (WKV-7's log_w, the scan's A) as every backend takes it: -inf, a decay of exactly 0, as the most
    negative finite number, so that e^x is 0 all the same and no sum or product of exponents makes inf - inf or
    0 * inf; +inf, an infinite growth, as NaN, which every backend carries alike."""
    return plus_inf_as_nan(x.clamp_min(torch.finfo(x.dtype).min))


def plus_inf_as_nan(x: torch.Tensor) -> torch.Tensor:
    """x with +inf as NaN: an exponent of +inf meets e^{inf - inf} in every backend's formulas, which the reference
    computes as NaN; carried as NaN, every backend gives that NaN alike."""
    return x.masked_fill(x == float("inf"), float("nan"))


def check_decay_dtype(name: str, x, dtype: torch.dtype) -> None:
    """A decay (or another per-channel parameter) may take the inputs' dtype or the accumulation dtype, fp32 beside
    fp16/bf16 inputs: models keep decays in fp32, where -exp(time_decay) does not overflow (the design's dtype rule)."""
    allowed = list(dict.fromkeys((dtype, accumulation_dtype(dtype))))
    if x is not None and x.dtype not in allowed:
        raise TypeError(f"{name} must have dtype {' or '.join(map(str, allowed))} (the inputs' or their accumulation "
                        f"dtype), got {x.dtype}")


def check_devices(**tensors) -> torch.device:
    """All given tensors (None skipped) on one device; returns it."""
    for name, x in tensors.items():
        if x is not None and not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    named = {k: v for k, v in tensors.items() if v is not None}
    devices = {v.device for v in named.values()}
    if len(devices) > 1:
        raise ValueError("inputs must be on one device, got " + ", ".join(f"{k}: {v.device}" for k, v in named.items()))
    device = devices.pop()
    if device.type == "meta":   # shapes without data: nothing to compute (models built on meta load weights first)
        raise ValueError(f"inputs must hold data, got tensors on the meta device ({', '.join(named)})")
    return device


def check_same_dtype(**tensors) -> torch.dtype:
    """All given float tensors (None skipped) of one dtype; returns it."""
    named = {k: v for k, v in tensors.items() if v is not None}
    dtypes = {v.dtype for v in named.values()}
    if len(dtypes) > 1:
        raise TypeError("inputs must share one dtype, got " + ", ".join(f"{k}: {v.dtype}" for k, v in named.items()))
    return dtypes.pop()
