"""The building blocks of the flash-style kernels (attention.py and rerope/fused.py): the online softmax step, the
softmax gradient of a tile, tile loads and stores, and the head-size and scale rules those kernels share.

A private module, so that no op module serves as another op's helper library.
"""
from __future__ import annotations

import torch

from ._common import Launch, new_output, tl, triton
from .backends import Torch, Triton

# The flash kernels hold a (tile, d) block per operand: 16 <= d <= 128 (FLASH's Triton backend refuses the others).
MIN_TRITON_HEAD_DIM, MAX_TRITON_HEAD_DIM = 16, 128


def _head_dim(call):
    d = call.facts.get("d", MIN_TRITON_HEAD_DIM)      # not given (default_backend): taken as met
    if not MIN_TRITON_HEAD_DIM <= d <= MAX_TRITON_HEAD_DIM:
        return f"takes head dims d in [{MIN_TRITON_HEAD_DIM}, {MAX_TRITON_HEAD_DIM}], got d = {d}"
    return None


# The flash ops' battery cases with saturated scores (kernels/attention/spec.py, kernels/rerope/spec.py):
# Scores in the hundreds (e^s overflows fp32 past 88: the outputs check that a kernel never forms it) make each row's
# softmax nearly one-hot, so dq and dk are differences of nearly equal terms, e^-100 of the gradient's scale in exact
# arithmetic: fp32's rounding dominates them in any kernel. They are not compared there (dv is), and are elsewhere.
SATURATED = dict(group="extreme", ungraded=("q", "k", "k_cache"))

# The flash ops' backends (attention, ReRoPE's two), in the order backend=None tries them
FLASH = (Triton(_head_dim, f"CUDA tensors, {MIN_TRITON_HEAD_DIM} <= d <= {MAX_TRITON_HEAD_DIM}"), Torch())


def positive_scale(q, scale: float):
    """(q', scale') with q' . k scale' = q . k scale and scale' > 0, for the torch backend: aten's flash kernels
    scale the scores after masking them with -inf, so that a scale <= 0 turns masked scores into NaN (0 * -inf) or
    +inf. A scale of 0 makes every score 0 (q 0, which keeps a non-finite q's NaN, as the reference's 0 * inf)."""
    if scale > 0:
        return q, scale
    return (-q, -scale) if scale < 0 else (q * 0, 1.0)


# How the flash kernels (attention, ReRoPE) multiply fp32 tiles: "ieee", fp32 products on the FMA units, or "tf32x3",
# on tensor cores: each operand x split into a tf32 high part x_h = tf32(x) and a remainder x_l = x - x_h that the
# tensor cores read as tf32, a b ~ a_h b_l + a_l b_h + a_h b_h (three tf32 products summed in fp32; a_l b_l, of
# relative size 2^-22, is dropped). "auto", the default, leaves the choice to each op: attention's forward takes
# tf32x3 on Hopper (sm_90, kernels/attention), every other flash kernel "ieee". 16-bit inputs always take
# their own tensor-core products.
FP32_DOT_PRECISIONS = ("auto", "ieee", "tf32x3")
_fp32_dots = "auto"


def set_fp32_dot_precision(precision: str) -> str:
    """Choose the products of fp32 dots in the attention and ReRoPE Triton kernels, for the calls that follow.

    Args:
        precision (str): "auto" (the default: attention's forward "tf32x3" on sm_90, on tiles that
            Hopper's wgmma takes; "ieee" everywhere else), "ieee" (fp32 products on the FMA units, the fp32 budget
            1e-5 on any GPU) or "tf32x3" (three tf32 tensor-core products per product; emulated on the tests' shapes
            it keeps the fp32 budget, errors of about 1e-7 against float64 as "ieee"; one tf32 product alone gives
            4e-4). The forward kernels take it (attention; ReRoPE's forward and decode at head sizes up to 64,
            rerope.fused.TF32X3_HEAD_DIM: larger ones would need a stack); the backwards keep "ieee".
    Returns:
        str: the previous setting, to restore it.
    """
    global _fp32_dots
    if precision not in FP32_DOT_PRECISIONS:
        raise ValueError(f"precision must be one of {FP32_DOT_PRECISIONS}, got {precision!r}")
    previous, _fp32_dots = _fp32_dots, precision
    return previous


def dot_precision(dtype: torch.dtype, kernel: str, auto: str = "ieee") -> str:
    """The DOT constexpr of flash kernel ``kernel`` ("fwd", "decode", "dq", "dkdv") for inputs of ``dtype``: the
    setting for the fp32 forwards (``auto``, the op's own choice, where it is "auto"); "ieee" for the backwards (with
    tf32x3 ReRoPE's dK dV kernel needs a stack, and training keeps one rule) and for 16-bit inputs (unused there: so
    that the setting compiles no new variants)."""
    if dtype != torch.float32 or kernel not in ("fwd", "decode"):
        return "ieee"
    return auto if _fp32_dots == "auto" else _fp32_dots


def flash_launch(block_m: int, block_n: int, num_warps: int, num_stages: int) -> Launch:
    """A flash kernel's launch: BLOCK_M query rows and BLOCK_N keys per tile."""
    return Launch({"BLOCK_M": block_m, "BLOCK_N": block_n}, num_warps, num_stages)


def flash_grid(n_rows: int, block: int, batch_heads: int) -> tuple:
    """One program per (batch, head) and tile of ``block`` rows: (B H, cdiv(n_rows, block)). B H goes on grid axis 0,
    which CUDA allows up to 2^31 - 1 programs; axis 1 allows 65,535 (B H = 65,536 is decode at B = 2048, H = 32),
    where the tiles (n_rows / block) stay far below it. The kernels read the head from program_id(0) (flash_head)
    and the tile from program_id(1)."""
    return (batch_heads, triton.cdiv(n_rows, block))


@triton.jit
def flash_head():
    """This program's (batch, head) index, int64: the offsets built from it pass 2^31."""
    return tl.program_id(0).to(tl.int64)


def block_d(head_dim: int) -> int:
    """The head dimension rounded up to a power of two (tl.arange needs one); extra columns are masked."""
    return max(16, triton.next_power_of_2(head_dim))


@triton.jit
def online_softmax_step(s, v, m_i, l_i, acc, DOT: tl.constexpr):
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
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT)
    return m_new, l_i, acc


@triton.jit
def softmax_tile_grad(s, lse, dp, delta):
    """P = e^{S - LSE} and dS = P * (dP - D) for one tile, dP = dO V^T; masked scores (-inf) give P = dS = 0."""
    p = tl.exp(s - lse[:, None])
    return p, p * (dp - delta[:, None])


@triton.jit
def load_row_stats(lse_ptr, delta_ptr, rows, n_rows):
    """The forward's log-sum-exp and D = rowsum(dO * O) of query rows; rows past the end get LSE = inf (so P = 0)
    and D = 0."""
    lse = tl.load(lse_ptr + rows, mask=rows < n_rows, other=float("inf"))
    delta = tl.load(delta_ptr + rows, mask=rows < n_rows, other=0.0)
    return lse, delta


@triton.jit
def load_tile(ptr, rows, n_rows, cols, n_cols):
    """x[rows, cols] of a row-major (n_rows, n_cols) matrix; zero outside it."""
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    return tl.load(ptr + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.0)


@triton.jit
def store_tile(ptr, x, rows, n_rows, cols, n_cols):
    """x into [rows, cols] of a row-major (n_rows, n_cols) matrix, in its dtype; nothing outside it."""
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    tl.store(ptr + rows[:, None] * n_cols + cols[None, :], x.to(ptr.dtype.element_ty), mask=mask)


DELTA_ROWS = 64   # rows per program of flash_delta_kernel


@triton.jit
def flash_delta_kernel(
    o_ptr, do_ptr,              # (rows, d) contiguous: every (batch, head)'s rows one after the other, input dtype
    delta_ptr,                  # (rows,) fp32 output
    n_rows,                     # B H T_q
    HEAD_DIM: tl.constexpr,     # d
    BLOCK_D: tl.constexpr,      # d rounded up to a power of two
    BLOCK_M: tl.constexpr,      # rows per program
):
    """D_i = sum_c dO_ic O_ic in fp32, read once from O and dO in their dtype (no fp32 copies of either)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)    # int64: B H T d passes 2^31
    dims = tl.arange(0, BLOCK_D)
    o = load_tile(o_ptr, rows, n_rows, dims, HEAD_DIM).to(tl.float32)
    do = load_tile(do_ptr, rows, n_rows, dims, HEAD_DIM).to(tl.float32)
    tl.store(delta_ptr + rows, tl.sum(o * do, axis=1), mask=rows < n_rows)


def flash_delta(o, do):
    """D = rowsum(dO * O), (B, H, T) fp32, for contiguous (B, H, T, d) o and do: the flash backwards' first step."""
    B, H, T, d = o.shape
    delta = new_output((B, H, T), torch.float32, o.device)
    flash_delta_kernel[(triton.cdiv(B * H * T, DELTA_ROWS),)](o, do, delta, B * H * T, HEAD_DIM=d,
                                                               BLOCK_D=block_d(d), BLOCK_M=DELTA_ROWS)
    return delta
