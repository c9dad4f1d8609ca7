"""Softmax attention: a flash-style Triton kernel (forward and backward) and a torch path (SDPA).

    O = softmax(Q K^T * scale + M) V,   M_ij = -inf where j > i (causal), else 0

Shapes: q, k, v (B, H, T, d) -> O (B, H, T, d). Float64 truth: reference/attention.py.

Forward (FlashAttention, arXiv:2205.14135): a program owns BLOCK_M query rows and streams over key tiles, never
holding more than one (BLOCK_M, BLOCK_N) tile of scores. The softmax is computed online: a running row maximum m,
a running sum l of e^{s - m} and an accumulator acc of e^{s - m} v, rescaled by e^{m_old - m_new} whenever the
maximum grows (``online_softmax_step``). This is the trick of RWKV-4's max-tracked WKV (reference/wkv4.py keeps a
running maximum p of the exponents and rescales its numerator and denominator by e^{p_old - p_new}): one stable
streaming softmax, here over key tiles, there over time steps. Under a causal mask the tiles above the diagonal
are never visited. The row's log-sum-exp LSE = m + log l is saved for the backward.

Backward: with P = e^{S - LSE} recomputed tile by tile and D_i = sum_c dO_ic O_ic (= sum_j P_ij dP_ij),
    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - D),   dQ = dS K * scale,   dK = dS^T Q * scale.
One kernel gives each program a key tile and accumulates its dK, dV over the query tiles that see it; another gives
each program a query tile and accumulates its dQ. Neither needs atomics.

Dots take the input dtype with fp32 accumulation. fp32 inputs multiply in one of two ways (kernels/_flash.py), both
within the fp32 budget (1e-5) against float64; TF32 alone (10-bit mantissa) would not be. On Hopper (sm_90) the
forward's dots are "tf32x3" by default: three tf32 tensor-core products per product, SDPA's own fp32
arithmetic, on tiles of 64 query rows (one warpgroup's wgmma) that build without a stack (TF32X3_TILES). Elsewhere,
and in the backwards, IEEE fp32 products on the FMA units (input_precision="ieee"); set_fp32_dot_precision picks
either everywhere. Under the interpreter every dot is plain fp32, whatever the precision asked for.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._common import (Launch, accumulation_dtype, all_finite, check_devices, check_same_dtype,
                       check_tensor, first_order_only, new_output, tl, triton)
from .._flash import (block_d, dot_precision, flash_delta, flash_grid,
                      flash_head, flash_launch, load_row_stats, load_tile, online_softmax_step,
                      positive_scale, set_fp32_dot_precision, softmax_tile_grad, store_tile)
from ..backends import Call, dispatch

__all__ = ["attention", "set_fp32_dot_precision", "launch_config"]


# ----------------------------------------------------------------------------------------------------------------
# Triton path
# ----------------------------------------------------------------------------------------------------------------

KERNELS = ("fwd", "dq", "dkdv")   # the three kernels, each with its own launch configuration

# The architecture whose fp32 forward takes tf32x3 on TF32X3_TILES by default: Hopper's wgmma multiplies a
# warpgroup's 64 rows at once. On sm_80 the d = 128 tiles build with a 240-416 byte stack (mma.sync, 255 registers),
# so Ampere keeps IEEE products by default and the IEEE tiles when tf32x3 is asked for; so do the architectures no
# build has checked (sm_100 and later, whose tensor cores Triton drives otherwise).
TF32X3_ARCH = 90
# The fp32 forward's tiles with tf32x3 on sm_90, by the head size they serve up to, as (BLOCK_M, BLOCK_N, warps,
# stages): the largest that build without a stack there (triton 3.9, aligned tensors). d <= 64: 64 x 32, 174
# registers (64 x 64 needs 24 B of stack); d <= 128: 64 x 16, 225 registers (64 x 32 needs 48 B).
TF32X3_TILES = {64: (64, 32, 4, 3), 128: (64, 16, 4, 2)}


def device_arch(device: torch.device) -> int | None:
    """The sm_ number of a CUDA device (80 for an A100, 90 for an H100); None for a CPU (the interpreter)."""
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def kernel_dots(kernel: str, dtype: torch.dtype, arch: int | None) -> str:
    """The DOT constexpr of ``kernel`` for inputs of ``dtype`` on sm_<arch> (None: the interpreter) under the
    current set_fp32_dot_precision: "auto" gives the fp32 forward tf32x3 on TF32X3_ARCH, "ieee" elsewhere."""
    auto = "tf32x3" if arch == TF32X3_ARCH else "ieee"
    return dot_precision(dtype, kernel, auto)


def _launch_config(kernel: str, head_dim: int, dtype: torch.dtype, dot: str = "ieee", arch: int | None = None
                   ) -> Launch:
    """Tiles of ``kernel`` (one of KERNELS) for head size ``head_dim``, inputs of ``dtype`` and dots ``dot`` on
    sm_<arch> (None: the interpreter, which takes sm_90's), chosen on the build the JIT makes for aligned tensors
    (``python -m seqmix.kernels.aot``): the largest tried that compile without spills or stack. fp16/bf16 tiles of
    64 rows and more compile to Hopper's wgmma on sm_90 (mma.sync on sm_80), and so do the fp32 forward's with
    tf32x3 (TF32X3_TILES); IEEE fp32 operands on the FMA units take twice the registers of 16-bit ones, hence
    16-32 rows.
    """
    if dtype == torch.float32:
        if kernel == "fwd" and dot == "tf32x3" and arch in (None, TF32X3_ARCH):
            return flash_launch(*TF32X3_TILES[64 if head_dim <= 64 else 128])
        if head_dim <= 64:
            return flash_launch(32, 32, 8, 1)
        return flash_launch(16, 16, 8, 1) if kernel == "dkdv" else flash_launch(16, 32, 8, 1)
    if kernel == "fwd":
        return flash_launch(128, 64, 8, 3)
    if kernel == "dkdv" and head_dim <= 64:
        return flash_launch(64, 32, 4, 2)
    return flash_launch(64, 64, 8, 2)


def launch_config(kernel: str, head_dim: int, dtype: torch.dtype, arch: int = TF32X3_ARCH) -> Launch:
    """The tiles and compiler options of one Triton kernel, as its launcher picks them on sm_<arch> under the
    current set_fp32_dot_precision; the cost model (benchmarks/cost_model.py) reads them.

    Args:
        kernel: one of KERNELS ("fwd", "dq", "dkdv"). head_dim: d. dtype: the inputs' dtype. arch: the GPU's sm_
            number (default 90, the H100 the cost model prices).

    Returns:
        The Launch (tile sizes by constexpr name, num_warps, num_stages).
    """
    return _launch_config(kernel, head_dim, dtype, kernel_dots(kernel, dtype, arch), arch)


@triton.jit
def _scores(q, k, rows, cols, T, scale, CAUSAL: tl.constexpr, DOT: tl.constexpr):
    """s = q k^T * scale for one tile, -inf where the key is past the end or (causal) after the query."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT) * scale
    valid = (cols < T)[None, :]
    if CAUSAL:
        valid = valid & (cols[None, :] <= rows[:, None])
    return tl.where(valid, s, float("-inf"))


@triton.jit
def attention_fwd_kernel(
    q_ptr, k_ptr, v_ptr,        # (B*H, T, d) contiguous, input dtype
    o_ptr,                      # (B*H, T, d) output, input dtype
    lse_ptr,                    # (B*H, T) fp32 output: log-sum-exp of each row's scores, for the backward
    T,                          # sequence length
    scale,                      # score scale (1/sqrt(d) unless given)
    HEAD_DIM: tl.constexpr,     # d
    BLOCK_D: tl.constexpr,      # d rounded up to a power of two; the extra columns are masked
    BLOCK_M: tl.constexpr,      # query rows per program
    BLOCK_N: tl.constexpr,      # keys per tile of the inner loop
    CAUSAL: tl.constexpr,       # mask j > i and skip the tiles above the diagonal
    DOT: tl.constexpr,          # input_precision of the dots: "ieee" or "tf32x3" for fp32 (_flash.dot_precision)
):
    start_m = tl.program_id(1) * BLOCK_M
    seq = flash_head() * T * HEAD_DIM                          # this (batch, head)'s first element
    rows = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    q = load_tile(q_ptr + seq, rows, T, dims, HEAD_DIM)

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    end = T
    if CAUSAL:  # keys after the tile's last row are never seen: the tiles above the diagonal are skipped
        end = tl.minimum(start_m + BLOCK_M, T)
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = load_tile(k_ptr + seq, cols, T, dims, HEAD_DIM)
        v = load_tile(v_ptr + seq, cols, T, dims, HEAD_DIM)
        s = _scores(q, k, rows, cols, T, scale, CAUSAL, DOT)
        m_i, l_i, acc = online_softmax_step(s, v, m_i, l_i, acc, DOT)

    store_tile(o_ptr + seq, acc / l_i[:, None], rows, T, dims, HEAD_DIM)
    tl.store(lse_ptr + flash_head() * T + rows, m_i + tl.log(l_i), mask=rows < T)


@triton.jit
def attention_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr,  # (B*H, T, d) contiguous, input dtype; do_ptr: the gradient of the output
    lse_ptr, delta_ptr,         # (B*H, T) fp32: the forward's log-sum-exp, and D = rowsum(dO * O)
    dk_ptr, dv_ptr,             # (B*H, T, d) outputs, input dtype
    T, scale,                   # sequence length, score scale
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,  # d and its power-of-two padding
    BLOCK_M: tl.constexpr,      # query rows per tile of the inner loop
    BLOCK_N: tl.constexpr,      # keys per program
    CAUSAL: tl.constexpr,
    DOT: tl.constexpr,
):
    start_n = tl.program_id(1) * BLOCK_N
    bh = flash_head()
    seq = bh * T * HEAD_DIM
    cols = start_n + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    k = load_tile(k_ptr + seq, cols, T, dims, HEAD_DIM)
    v = load_tile(v_ptr + seq, cols, T, dims, HEAD_DIM)
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    first = 0
    if CAUSAL:  # queries before this key tile never see it
        first = (start_n // BLOCK_M) * BLOCK_M
    for start_m in range(first, T, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        q = load_tile(q_ptr + seq, rows, T, dims, HEAD_DIM)
        do = load_tile(do_ptr + seq, rows, T, dims, HEAD_DIM)
        lse, delta = load_row_stats(lse_ptr + bh * T, delta_ptr + bh * T, rows, T)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT)
        p, ds = softmax_tile_grad(_scores(q, k, rows, cols, T, scale, CAUSAL, DOT), lse, dp, delta)
        dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=DOT)
        dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=DOT)
    store_tile(dk_ptr + seq, dk * scale, cols, T, dims, HEAD_DIM)
    store_tile(dv_ptr + seq, dv, cols, T, dims, HEAD_DIM)


@triton.jit
def attention_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr,  # (B*H, T, d) contiguous, input dtype
    lse_ptr, delta_ptr,         # (B*H, T) fp32
    dq_ptr,                     # (B*H, T, d) output, input dtype
    T, scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,      # query rows per program
    BLOCK_N: tl.constexpr,      # keys per tile of the inner loop
    CAUSAL: tl.constexpr,
    DOT: tl.constexpr,
):
    start_m = tl.program_id(1) * BLOCK_M
    bh = flash_head()
    seq = bh * T * HEAD_DIM
    rows = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    q = load_tile(q_ptr + seq, rows, T, dims, HEAD_DIM)
    do = load_tile(do_ptr + seq, rows, T, dims, HEAD_DIM)
    lse, delta = load_row_stats(lse_ptr + bh * T, delta_ptr + bh * T, rows, T)
    dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    end = T
    if CAUSAL:
        end = tl.minimum(start_m + BLOCK_M, T)
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = load_tile(k_ptr + seq, cols, T, dims, HEAD_DIM)
        v = load_tile(v_ptr + seq, cols, T, dims, HEAD_DIM)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT)
        _, ds = softmax_tile_grad(_scores(q, k, rows, cols, T, scale, CAUSAL, DOT), lse, dp, delta)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT)
    store_tile(dq_ptr + seq, dq * scale, rows, T, dims, HEAD_DIM)


def _constexprs(head_dim: int, cfg: Launch, causal: bool, dot: str) -> dict:
    return dict(HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim), **cfg.blocks, CAUSAL=causal, DOT=dot)


def _launch(kernel: str, q: torch.Tensor, causal: bool) -> tuple[Launch, dict]:
    """The launch configuration and constexprs of ``kernel`` for q's head size, dtype and device."""
    arch = device_arch(q.device)
    dot = kernel_dots(kernel, q.dtype, arch)
    cfg = _launch_config(kernel, q.shape[-1], q.dtype, dot, arch)
    return cfg, _constexprs(q.shape[-1], cfg, causal, dot)


def attention_fwd(q, k, v, causal, scale):
    """Runs the forward kernel on contiguous (B, H, T, d) q, k, v; returns O and each row's log-sum-exp."""
    B, H, T = q.shape[:3]
    cfg, constexprs = _launch("fwd", q, causal)
    o = new_output(q.shape, q.dtype, q.device)
    lse = new_output((B, H, T), torch.float32, q.device)
    attention_fwd_kernel[flash_grid(T, cfg["BLOCK_M"], B * H)](
        q, k, v, o, lse, T, scale, **constexprs, **cfg.options)
    return o, lse


def attention_bwd(q, k, v, o, lse, do, causal, scale):
    """Runs the two backward kernels; returns dq, dk, dv."""
    B, H, T = q.shape[:3]
    do = do.contiguous()
    delta = flash_delta(o, do)                                   # D_i = sum_c dO_ic O_ic, (B, H, T) fp32
    dq, dk, dv = (new_output(q.shape, q.dtype, q.device) for _ in range(3))
    cfg, constexprs = _launch("dkdv", q, causal)
    attention_bwd_dkdv_kernel[flash_grid(T, cfg["BLOCK_N"], B * H)](
        q, k, v, do, lse, delta, dk, dv, T, scale, **constexprs, **cfg.options)
    cfg, constexprs = _launch("dq", q, causal)
    attention_bwd_dq_kernel[flash_grid(T, cfg["BLOCK_M"], B * H)](
        q, k, v, do, lse, delta, dq, T, scale, **constexprs, **cfg.options)
    return dq, dk, dv


# ----------------------------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------------------------

class AttentionFunction(torch.autograd.Function):
    """The flash kernels; q, k, v contiguous (B, H, T, d)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        o, lse = attention_fwd(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    @first_order_only
    def backward(ctx, do):
        return (*attention_bwd(*ctx.saved_tensors, do, ctx.causal, ctx.scale), None, None)


# ----------------------------------------------------------------------------------------------------------------
# Public op
# ----------------------------------------------------------------------------------------------------------------

def _attention_written_out(q, k, v, causal, scale):
    """softmax(q k^T * scale + M) v as the reference writes it, the mask applied by replacing scores: the torch
    backend's path for inputs holding NaN or an infinity (see _common.all_finite), so that NaN lands where it does
    in the reference."""
    x = [t.to(accumulation_dtype(q.dtype)) for t in (q, k, v)]
    s = x[0] @ x[1].mT * scale                                               # (B, H, T, T)
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), -math.inf)
    return (s.softmax(-1) @ x[2]).to(q.dtype)


def attention(q, k, v, *, causal=True, scale=None, backend=None):
    """O = softmax(q k^T * scale + M) v, M = -inf above the diagonal when causal.

    Args:
        q, k, v (torch.Tensor): (B, H, T, d), one dtype: fp32, fp16 or bf16 (float64 too on the torch backend).
        causal (bool): mask the keys after each query. Default: True.
        scale (float or None): multiplies every score. Default: 1/sqrt(d).
        backend (str or None): "torch" (torch.nn.functional.scaled_dot_product_attention, any d), "triton" (the
            flash kernels above, 16 <= d <= 128; on CPU tensors under TRITON_INTERPRET=1) or None. None runs the
            first that takes the call, in this order: "triton" (CUDA tensors, 16 <= d <= 128), "torch" (any other
            call). A backend named here that cannot take the call raises with its reason (kernels/backends.py).
            Default: None.
    Returns:
        torch.Tensor: O, (B, H, T, d), in the input dtype; differentiable on both backends.

    Source: FlashAttention (arXiv:2205.14135); the float64 forms are in reference/attention.py.
    """
    check_tensor("q", q, (None, None, None, None))
    B, H, T, d = q.shape
    check_tensor("k", k, (B, H, T, d))
    check_tensor("v", v, (B, H, T, d))
    dtype = check_same_dtype(q=q, k=k, v=v)
    backend = dispatch(Call("attention", check_devices(q=q, k=k, v=v), dtype, {"d": d}), backend)
    if T < 1 or d < 1:
        raise ValueError(f"q must have T >= 1 and d >= 1, got shape {tuple(q.shape)}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    if backend == "torch":
        if not all_finite(q, k, v):
            return _attention_written_out(q, k, v, causal, scale)
        q, scale = positive_scale(q, scale)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    return AttentionFunction.apply(q.contiguous(), k.contiguous(), v.contiguous(), causal, scale)


# ----------------------------------------------------------------------------------------------------------------
# Ahead-of-time build (python -m seqmix.kernels.aot)
# ----------------------------------------------------------------------------------------------------------------

def _aot_variants(kernel: str, head_dim: int, dtype: torch.dtype) -> list[tuple[str, str, Launch, tuple]]:
    """(label suffix, DOT, launch, targets) of one kernel's builds: as launched on sm_80 (and by "ieee" anywhere);
    for the fp32 forward also with tf32x3, on sm_90's tiles (its default there: built for sm_90 only) and on the IEEE
    tiles that sm_80 takes for it."""
    from ..aot import TARGETS
    ieee = ("", "ieee", _launch_config(kernel, head_dim, dtype, "ieee", 80), TARGETS)
    if dtype != torch.float32 or kernel != "fwd":
        return [ieee]
    below = [arch for arch in TARGETS if arch < TF32X3_ARCH]
    return [ieee, (" tf32x3", "tf32x3", _launch_config(kernel, head_dim, dtype, "tf32x3", TF32X3_ARCH),
                   (TF32X3_ARCH,)),
            (" tf32x3 ieee-tiles", "tf32x3", _launch_config(kernel, head_dim, dtype, "tf32x3", below[0]),
             tuple(below))]


def aot_kernels():
    """The three kernels at head size 64 and 128 in fp32, fp16 and bf16; the fp32 forward also with tf32x3 dots, on
    sm_90's tiles (for sm_90) and on the IEEE tiles (for sm_80)."""
    from ..aot import AOT_DTYPES, FLASH_ARG_TYPES, AotKernel
    kernels = []
    for d in (64, 128):
        for dtype, torch_dtype in AOT_DTYPES.items():
            fns = (attention_fwd_kernel, attention_bwd_dq_kernel, attention_bwd_dkdv_kernel)
            for kernel, fn in zip(KERNELS, fns):
                label = f"{fn.__name__.removesuffix('_kernel')} d={d} {dtype}"
                kernels += [AotKernel(label + suffix, fn, _constexprs(d, cfg, True, dot), FLASH_ARG_TYPES,
                                      "*" + dtype, cfg.num_warps, cfg.num_stages, wide_offsets=False,
                                      targets=targets)
                            for suffix, dot, cfg, targets in _aot_variants(kernel, d, torch_dtype)]
    return kernels
