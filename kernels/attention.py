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

Dots take the input dtype with fp32 accumulation. fp32 inputs use IEEE fp32 products (input_precision="ieee"), so
that the fp32 error budget (1e-5) holds on a GPU too; TF32 (10-bit mantissa) would not. Under the interpreter every
dot is exact fp32.
"""
from __future__ import annotations

import math
from collections import namedtuple

import torch
import torch.nn.functional as F

from seqmix.kernels._backend import check_backend_dtype, resolve_backend
from seqmix.kernels._common import check_devices, check_same_dtype, check_tensor, new_output, tl, triton

# Tile sizes and launch parameters of the three kernels; ``aot_kernels`` compiles exactly these.
LaunchConfig = namedtuple("LaunchConfig", "block_m block_n num_warps num_stages")

MIN_TRITON_HEAD_DIM, MAX_TRITON_HEAD_DIM = 16, 128
AOT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _launch_config(head_dim: int, dtype: torch.dtype) -> LaunchConfig:
    """Tiles for head size ``head_dim`` and inputs of ``dtype``: the largest that compile without register spills
    on sm_80 and sm_90 (``python -m seqmix.kernels.aot``); fp32 operands take twice the registers of fp16 ones."""
    if dtype == torch.float32:
        return LaunchConfig(32, 32, 8, 1) if head_dim <= 64 else LaunchConfig(16, 32, 8, 1)
    return LaunchConfig(64, 32, 4, 2) if head_dim <= 64 else LaunchConfig(32, 32, 4, 2)


def check_triton_head_dim(d: int) -> None:
    """The flash kernels here and in rerope.py hold a (tile, d) block per operand: 16 <= d <= 128."""
    if not MIN_TRITON_HEAD_DIM <= d <= MAX_TRITON_HEAD_DIM:
        raise ValueError(f"backend='triton' takes head dims d in [{MIN_TRITON_HEAD_DIM}, {MAX_TRITON_HEAD_DIM}], "
                         f"got d = {d}")


def block_d(head_dim: int) -> int:
    """The head dimension rounded up to a power of two (tl.arange needs one); extra columns are masked."""
    return max(16, triton.next_power_of_2(head_dim))


# ----------------------------------------------------------------------------------------------------------------
# Triton: building blocks shared with kernels/rerope.py
# ----------------------------------------------------------------------------------------------------------------

@triton.jit
def online_softmax_step(s, v, m_i, l_i, acc):
    """Fold one tile of scores s (BLOCK_M, BLOCK_N) and its values v (BLOCK_N, BLOCK_D) into the running state.

    m' = max(m, max_j s_ij);  l' = e^{m - m'} l + sum_j e^{s_ij - m'};  acc' = e^{m - m'} acc + e^{s - m'} v.
    The same update as RWKV-4's max-tracked WKV step (reference/wkv4.py), there one time step at a time.
    Every exponent is <= 0. Masked scores are -inf and contribute e^{-inf} = 0; the first tile a row sees holds
    at least one unmasked score (key 0), so m is finite from then on and m - m' is never inf - inf.
    """
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp(m_i - m_new)                               # rescales what was accumulated under the old max
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    return m_new, l_i, acc


@triton.jit
def softmax_tile_grad(s, lse, dp, delta):
    """P = e^{S - LSE} and dS = P * (dP - D) for one tile, dP = dO V^T; masked scores (-inf) give P = dS = 0."""
    p = tl.exp(s - lse[:, None])
    return p, p * (dp - delta[:, None])


@triton.jit
def load_row_stats(LSE, DELTA, rows, n_rows):
    """The forward's log-sum-exp and D = rowsum(dO * O) of query rows; rows past the end get LSE = inf (so P = 0)
    and D = 0."""
    lse = tl.load(LSE + rows, mask=rows < n_rows, other=float("inf"))
    delta = tl.load(DELTA + rows, mask=rows < n_rows, other=0.0)
    return lse, delta


@triton.jit
def load_tile(ptr, rows, n_rows, cols, n_cols):
    """x[rows, cols] of a row-major (n_rows, n_cols) matrix; zero outside it."""
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    return tl.load(ptr + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.0)


@triton.jit
def store_tile(ptr, x, rows, n_rows, cols, n_cols):
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    tl.store(ptr + rows[:, None] * n_cols + cols[None, :], x.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _scores(q, k, rows, cols, T, scale, CAUSAL: tl.constexpr):
    """s = q k^T * scale for one tile, -inf where the key is past the end or (causal) after the query."""
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
    valid = (cols < T)[None, :]
    if CAUSAL:
        valid = valid & (cols[None, :] <= rows[:, None])
    return tl.where(valid, s, float("-inf"))


# ----------------------------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------------------------

@triton.jit
def attention_fwd_kernel(
    Q, K, V,                    # (B*H, T, d) contiguous, input dtype
    O,                          # (B*H, T, d) output, input dtype
    LSE,                        # (B*H, T) fp32 output: log-sum-exp of each row's scores, for the backward
    T,                          # sequence length
    scale,                      # score scale (1/sqrt(d) unless given)
    HEAD_DIM: tl.constexpr,     # d
    BLOCK_D: tl.constexpr,      # d rounded up to a power of two; the extra columns are masked
    BLOCK_M: tl.constexpr,      # query rows per program
    BLOCK_N: tl.constexpr,      # keys per tile of the inner loop
    CAUSAL: tl.constexpr,       # mask j > i and skip the tiles above the diagonal
):
    start_m = tl.program_id(0) * BLOCK_M
    base = tl.program_id(1).to(tl.int64) * T * HEAD_DIM        # this (batch, head)'s first element
    rows = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    q = load_tile(Q + base, rows, T, dims, HEAD_DIM)

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    end = T
    if CAUSAL:  # keys after the tile's last row are never seen: the tiles above the diagonal are skipped
        end = tl.minimum(start_m + BLOCK_M, T)
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = load_tile(K + base, cols, T, dims, HEAD_DIM)
        v = load_tile(V + base, cols, T, dims, HEAD_DIM)
        s = _scores(q, k, rows, cols, T, scale, CAUSAL)
        m_i, l_i, acc = online_softmax_step(s, v, m_i, l_i, acc)

    store_tile(O + base, acc / l_i[:, None], rows, T, dims, HEAD_DIM)
    tl.store(LSE + tl.program_id(1).to(tl.int64) * T + rows, m_i + tl.log(l_i), mask=rows < T)


@triton.jit
def attention_bwd_dkdv_kernel(
    Q, K, V, DO,                # (B*H, T, d) contiguous, input dtype; DO is the gradient of the output
    LSE, DELTA,                 # (B*H, T) fp32: the forward's log-sum-exp, and D = rowsum(dO * O)
    DK, DV,                     # (B*H, T, d) outputs, input dtype
    T, scale,                   # sequence length, score scale
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,  # d and its power-of-two padding
    BLOCK_M: tl.constexpr,      # query rows per tile of the inner loop
    BLOCK_N: tl.constexpr,      # keys per program
    CAUSAL: tl.constexpr,
):
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1).to(tl.int64)
    base = bh * T * HEAD_DIM
    cols = start_n + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    k = load_tile(K + base, cols, T, dims, HEAD_DIM)
    v = load_tile(V + base, cols, T, dims, HEAD_DIM)
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    first = 0
    if CAUSAL:  # queries before this key tile never see it
        first = (start_n // BLOCK_M) * BLOCK_M
    for start_m in range(first, T, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        q = load_tile(Q + base, rows, T, dims, HEAD_DIM)
        do = load_tile(DO + base, rows, T, dims, HEAD_DIM)
        lse, delta = load_row_stats(LSE + bh * T, DELTA + bh * T, rows, T)
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        p, ds = softmax_tile_grad(_scores(q, k, rows, cols, T, scale, CAUSAL), lse, dp, delta)
        dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision="ieee")
        dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision="ieee")
    store_tile(DK + base, dk * scale, cols, T, dims, HEAD_DIM)
    store_tile(DV + base, dv, cols, T, dims, HEAD_DIM)


@triton.jit
def attention_bwd_dq_kernel(
    Q, K, V, DO,                # (B*H, T, d) contiguous, input dtype
    LSE, DELTA,                 # (B*H, T) fp32
    DQ,                         # (B*H, T, d) output, input dtype
    T, scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,      # query rows per program
    BLOCK_N: tl.constexpr,      # keys per tile of the inner loop
    CAUSAL: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    base = bh * T * HEAD_DIM
    rows = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    q = load_tile(Q + base, rows, T, dims, HEAD_DIM)
    do = load_tile(DO + base, rows, T, dims, HEAD_DIM)
    lse, delta = load_row_stats(LSE + bh * T, DELTA + bh * T, rows, T)
    dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    end = T
    if CAUSAL:
        end = tl.minimum(start_m + BLOCK_M, T)
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = load_tile(K + base, cols, T, dims, HEAD_DIM)
        v = load_tile(V + base, cols, T, dims, HEAD_DIM)
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        _, ds = softmax_tile_grad(_scores(q, k, rows, cols, T, scale, CAUSAL), lse, dp, delta)
        dq += tl.dot(ds.to(k.dtype), k, input_precision="ieee")
    store_tile(DQ + base, dq * scale, rows, T, dims, HEAD_DIM)


# ----------------------------------------------------------------------------------------------------------------
# Triton: launch and autograd
# ----------------------------------------------------------------------------------------------------------------

def _constexprs(head_dim: int, cfg: LaunchConfig, causal: bool) -> dict:
    return dict(HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                CAUSAL=causal)


class _AttentionTriton(torch.autograd.Function):
    """The flash kernels; q, k, v contiguous (B, H, T, d)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        B, H, T, d = q.shape
        cfg = _launch_config(d, q.dtype)
        o = new_output(q.shape, q.dtype, q.device)
        lse = new_output((B, H, T), torch.float32, q.device)
        attention_fwd_kernel[(triton.cdiv(T, cfg.block_m), B * H)](
            q, k, v, o, lse, T, scale, **_constexprs(d, cfg, causal),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        B, H, T, d = q.shape
        cfg = _launch_config(d, q.dtype)
        do = do.contiguous()
        delta = (do.float() * o.float()).sum(-1)                 # D_i = sum_c dO_ic O_ic, (B, H, T) fp32
        dq, dk, dv = (new_output(q.shape, q.dtype, q.device) for _ in range(3))
        meta = dict(**_constexprs(d, cfg, ctx.causal), num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        attention_bwd_dkdv_kernel[(triton.cdiv(T, cfg.block_n), B * H)](
            q, k, v, do, lse, delta, dk, dv, T, ctx.scale, **meta)
        attention_bwd_dq_kernel[(triton.cdiv(T, cfg.block_m), B * H)](
            q, k, v, do, lse, delta, dq, T, ctx.scale, **meta)
        return dq, dk, dv, None, None


# ----------------------------------------------------------------------------------------------------------------
# Public function
# ----------------------------------------------------------------------------------------------------------------

def attention(q, k, v, causal=True, scale=None, backend=None):
    """O = softmax(q k^T * scale + M) v, M = -inf above the diagonal when causal.

    q, k, v: (B, H, T, d) -> (B, H, T, d), in the input dtype. scale defaults to 1/sqrt(d).
    backend "torch": torch.nn.functional.scaled_dot_product_attention (any d; float64 too). backend "triton": the
    flash kernels above (16 <= d <= 128). Differentiable on both. Source: FlashAttention (arXiv:2205.14135); the
    float64 forms are in reference/attention.py.
    """
    check_tensor("q", q, (None, None, None, None))
    B, H, T, d = q.shape
    check_tensor("k", k, (B, H, T, d))
    check_tensor("v", v, (B, H, T, d))
    dtype = check_same_dtype(q=q, k=k, v=v)
    backend = resolve_backend(backend, check_devices(q=q, k=k, v=v))
    check_backend_dtype(backend, dtype)
    if T < 1 or d < 1:
        raise ValueError(f"q must have T >= 1 and d >= 1, got shape {tuple(q.shape)}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    if backend == "torch":
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    check_triton_head_dim(d)
    return _AttentionTriton.apply(q.contiguous(), k.contiguous(), v.contiguous(), causal, scale)


# ----------------------------------------------------------------------------------------------------------------
# Ahead-of-time build (python -m seqmix.kernels.aot)
# ----------------------------------------------------------------------------------------------------------------

# Argument types of the kernels here and in rerope.py, by name; every other argument is a tensor of the input dtype.
AOT_ARG_TYPES = dict(LSE="*fp32", DELTA="*fp32", ROT="*fp32", T="i32", T_q="i32", T_k="i32", window="i32",
                     scale="fp32", inv_log_len="fp32")


def aot_kernels():
    from seqmix.kernels.aot import AotKernel
    kernels = []
    for d in (64, 128):
        for dtype, torch_dtype in AOT_DTYPES.items():
            cfg = _launch_config(d, torch_dtype)
            constexprs = _constexprs(d, cfg, True)
            for fn in (attention_fwd_kernel, attention_bwd_dkdv_kernel, attention_bwd_dq_kernel):
                kernels.append(AotKernel(f"{fn.__name__.removesuffix('_kernel')} d={d} {dtype}", fn, constexprs,
                                         AOT_ARG_TYPES, "*" + dtype, cfg.num_warps, cfg.num_stages))
    return kernels
