"""ReRoPE's Triton path: fused flash-style kernels (forward, backward, decode) that never form a T x T matrix. The
public functions and the reason for two scores are in the package's docstring.

A program owns a tile of queries and walks the key tiles in three runs, classified from the tile corners: tiles
entirely at distance >= w compute the far score only (FAR_ONLY), tiles entirely at distance < w the RoPE score only
(NEAR_ONLY), and the one or two tiles that straddle i - j = w compute both and pick per element (BAND). The cost is
one attention plus a band of about two tiles per row. Rotations are applied to tiles in registers, with cos and sin
read from a small table (rotation.py: paths x T x d/2, fp32, computed in float64 on the host, as RoPE
implementations keep a cos/sin cache): exact to fp32 at any position, where an fp32 angle p * theta would lose
digits as p grows.

Backward (flash style, log-sum-exp saved): the rotated operands of both paths, (R q sigma scale)_near/far and
(R k)_near/far, are formed once (O(T d), the values the forward built in registers; forming them in the loops as
well made the backward spill registers). dS is the usual P * (dP - D); it splits by path, dS_near and dS_far. The
gradient reaches each path's rotated query, dq_path = dS_path (R k)_path, and the raw query through the transposed
rotation: rotations are orthogonal, R(a)^T = R(-a), so
    dq_i = sigma_i * scale * (R(-i) dq_near_i + R(-a_i) dq_far_i),   a_i = w  or  (i - w)/k + w
(accumulated per path over the key tiles, rotated back once at the end), and likewise for k:
    dk_j = R(-j) dk_near_j + R(-j/k) dk_far_j                        (ReRoPE: dk_far_j, unrotated).

Decode is the same forward kernel with one query row at position T - 1, in a tile of 16 rows (tl.dot's smallest;
the other rows are masked), split across the cache as flash-decoding does: program (b h, 0, s) walks the s-th slice
of keys (_decode_splits: enough slices for two programs per SM, each a whole number of key tiles) and writes its own
softmax, O_s and LSE_s in fp32; _merge_splits combines them, O = sum_s e^{LSE_s - LSE} O_s with LSE = logsumexp_s
LSE_s, in a fixed order, in torch (backend "triton"; decode.py's "triton_merged", which backend=None runs, merges
inside its kernel instead). Each cached (pre-RoPE) key is rotated on the fly in registers and no rotated copy of the
cache is written (the backward, when asked for, is a prefill's). The cos/sin table is built once per (head dim,
window, leaky_k, base, device) and grown by doubling (rotation.cached_rotation_table): every layer and step shares
it; the kernels take its length (rot_len) apart from T_k.

Dots take the input dtype with fp32 accumulation; fp32 inputs use IEEE fp32 products (input_precision="ieee", not
TF32), so that the fp32 error budget holds on a GPU too; set_fp32_dot_precision("tf32x3") (kernels/_flash.py) moves
the forward's and decode's (d <= TF32X3_HEAD_DIM) to tensor cores, three tf32 products each, within the same budget.
"""
from __future__ import annotations

import math

import torch

from .._common import GPU_SMS, Launch, first_order_only, new_output, tl, triton
from .._flash import (block_d, dot_precision, flash_delta, flash_grid, flash_head, flash_launch,
                      load_row_stats, load_tile, online_softmax_step, softmax_tile_grad, store_tile)
from .rotation import FAR_K, FAR_Q, NEAR, cached_rotation_table

__all__ = ["ReropeFunction", "rerope_triton", "aot_kernels", "launch_config", "decode_splits"]

KERNELS = ("fwd", "dq", "dkdv")   # the three kernels, each with its own launch configuration


def _launch_config(kernel: str, head_dim: int, dtype: torch.dtype) -> Launch:
    """Tiles of ``kernel`` (one of KERNELS, or "decode": the forward with one query) for head size ``head_dim`` and
    inputs of ``dtype``, chosen on the build the JIT makes for aligned tensors (``python -m seqmix.kernels.aot``): the
    largest tried that compile without spills or stack on sm_80 and sm_90 (Leaky ReRoPE, the larger variant). Each query
    and key tile is held in two rotations and the backward keeps two gradient accumulators per tile, hence smaller tiles
    than attention's; tiles of 64 query rows compile to wgmma on sm_90."""
    # decode: one live query row, tl.dot's smallest tile; fp32 with its forward's tiles at d <= 64 but two stages (the
    # GPU review's advice: the next key tile loads while this one is used; built without spills up to 251 registers)
    if kernel == "decode":
        return flash_launch(16, 32, 8, 2) if dtype == torch.float32 else flash_launch(16, 64, 4, 2)
    if dtype == torch.float32:
        if kernel == "fwd":
            return flash_launch(16, 32, 8, 1) if head_dim <= 64 else flash_launch(32, 32, 8, 1)
        if kernel == "dkdv":
            return flash_launch(32, 16, 4, 1) if head_dim <= 64 else flash_launch(32, 16, 8, 1)
        return flash_launch(16, 16, 8, 2)
    if kernel == "fwd":
        return flash_launch(64, 32, 4, 2)
    if head_dim <= 64:
        return flash_launch(64, 32, 8, 2) if kernel == "dq" else flash_launch(32, 32, 4, 2)
    return flash_launch(16, 16, 8, 2)


def launch_config(kernel: str, head_dim: int, dtype: torch.dtype) -> Launch:
    """The tiles and compiler options of one Triton kernel, as its launcher picks them; the cost model
    (benchmarks/cost_model.py) reads them.

    Args:
        kernel: one of KERNELS ("fwd", "dq", "dkdv") or "decode". head_dim: d. dtype: the inputs' dtype.

    Returns:
        The Launch (tile sizes by constexpr name, num_warps, num_stages).
    """
    return _launch_config(kernel, head_dim, dtype)


def _constexpr(value):
    """A module-level constant that a Triton kernel may read (it reads no plain Python globals); the value itself
    where Triton is missing."""
    return value if tl is None else tl.constexpr(value)


# The rotation table's paths, for the kernels.
PATH_NEAR, PATH_FAR_Q, PATH_FAR_K = (_constexpr(path) for path in (NEAR, FAR_Q, FAR_K))
# A run's class, as the Triton tutorial's STAGE: RUN & 1 computes the far score, RUN & 2 the near (RoPE) one.
FAR_ONLY, NEAR_ONLY, BAND = (_constexpr(run) for run in (1, 2, 3))


# ----------------------------------------------------------------------------------------------------------------
# Building blocks. A rotated tile is kept as its two halves (x1, x2) = (x[:, :d/2], x[:, d/2:]): the rotate-half
# layout pairs dimension f with f + d/2, and q . k = q1 . k1 + q2 . k2.
# ----------------------------------------------------------------------------------------------------------------

@triton.jit
def _rotate_halves(x1, x2, cos, sin):
    """R x on the halves: (x1 cos - x2 sin, x2 cos + x1 sin). With -sin it is R^T x = R(-angle) x."""
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def _rotation(rot_ptr, PATH: tl.constexpr, pos, T_k, rot_len, freqs, HEAD_DIM: tl.constexpr):
    """cos and sin, (rows, BLOCK_F) fp32, of path PATH of the rotation table (paths, 2, rot_len, d/2) at positions
    ``pos`` (identity from T_k on: rows past the sequence). The table is cached and may be longer than T_k."""
    half: tl.constexpr = HEAD_DIM // 2
    mask = (pos < T_k)[:, None] & (freqs < half)[None, :]
    ptrs = rot_ptr + (PATH * 2 * rot_len + pos[:, None]) * half + freqs[None, :]
    return tl.load(ptrs, mask=mask, other=1.0), tl.load(ptrs + rot_len * half, mask=mask, other=0.0)


@triton.jit
def _load_halves(ptr, rows, n_rows, freqs, HEAD_DIM: tl.constexpr):
    """Both halves of rows ``rows`` of a (n_rows, HEAD_DIM) matrix, zero outside it."""
    mask = (rows < n_rows)[:, None] & (freqs < HEAD_DIM // 2)[None, :]
    ptrs = ptr + rows[:, None] * HEAD_DIM + freqs[None, :]
    return tl.load(ptrs, mask=mask, other=0.0), tl.load(ptrs + HEAD_DIM // 2, mask=mask, other=0.0)


@triton.jit
def _store_halves(ptr, x1, x2, rows, n_rows, freqs, HEAD_DIM: tl.constexpr):
    """The halves x1, x2 into rows ``rows`` of a (n_rows, HEAD_DIM) matrix, in its dtype."""
    mask = (rows < n_rows)[:, None] & (freqs < HEAD_DIM // 2)[None, :]
    ptrs = ptr + rows[:, None] * HEAD_DIM + freqs[None, :]
    tl.store(ptrs, x1.to(ptr.dtype.element_ty), mask=mask)
    tl.store(ptrs + HEAD_DIM // 2, x2.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _query_scale(pos, inv_log_len, scale):
    """sigma_i * scale: the log-n factor max(1, ln(i + 1)/ln L) (1 when inv_log_len = 0) times the score scale."""
    return scale * tl.maximum(1.0, tl.log(pos.to(tl.float32) + 1.0) * inv_log_len)


@triton.jit
def _head_offsets(T_q, T_k, HEAD_DIM: tl.constexpr):
    """Where this program's (batch, head) starts: in the (B*H, T_q, d) query-side tensors, in the (B*H, T_q) row
    statistics and in the (B*H, T_k, d) key-side tensors."""
    bh = flash_head()
    return bh * T_q * HEAD_DIM, bh * T_q, bh * T_k * HEAD_DIM


@triton.jit
def _bwd_operands(q_near_ptr, q_far_ptr, k_near_ptr, k_far_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr,
                  T_q, T_k, HEAD_DIM: tl.constexpr):
    """The two backward kernels' shared operands, moved to this program's (batch, head); and the offsets of its
    query-side and key-side rows, for the gradients."""
    seq_q, seq_row, seq_k = _head_offsets(T_q, T_k, HEAD_DIM)
    return (q_near_ptr + seq_q, q_far_ptr + seq_q, k_near_ptr + seq_k, k_far_ptr + seq_k, v_ptr + seq_k,
            do_ptr + seq_q, lse_ptr + seq_row, delta_ptr + seq_row, seq_q, seq_k)


@triton.jit
def _rotated_queries(q_ptr, rot_ptr, rows, T_q, T_k, rot_len, freqs, inv_log_len, scale, HEAD_DIM: tl.constexpr):
    """The query tile times sigma_i * scale, rotated for both paths; halves in q's dtype."""
    pos = (T_k - T_q) + rows
    q1, q2 = _load_halves(q_ptr, rows, T_q, freqs, HEAD_DIM)
    sigma = _query_scale(pos, inv_log_len, scale)
    q1 = q1.to(tl.float32) * sigma[:, None]
    q2 = q2.to(tl.float32) * sigma[:, None]
    cos, sin = _rotation(rot_ptr, PATH_NEAR, pos, T_k, rot_len, freqs, HEAD_DIM)
    q1n, q2n = _rotate_halves(q1, q2, cos, sin)
    cos, sin = _rotation(rot_ptr, PATH_FAR_Q, pos, T_k, rot_len, freqs, HEAD_DIM)
    q1f, q2f = _rotate_halves(q1, q2, cos, sin)
    dtype = q_ptr.dtype.element_ty
    return q1n.to(dtype), q2n.to(dtype), q1f.to(dtype), q2f.to(dtype)


@triton.jit
def _rotated_keys(k_ptr, rot_ptr, cols, T_k, rot_len, freqs, HEAD_DIM: tl.constexpr, RUN: tl.constexpr,
                  LEAKY: tl.constexpr):
    """The key tile rotated for the paths its run needs; halves in k's dtype. ReRoPE's far key is the raw key."""
    k1, k2 = _load_halves(k_ptr, cols, T_k, freqs, HEAD_DIM)
    k1 = k1.to(tl.float32)
    k2 = k2.to(tl.float32)
    k1n, k2n, k1f, k2f = k1, k2, k1, k2
    if RUN & 2:
        cos, sin = _rotation(rot_ptr, PATH_NEAR, cols, T_k, rot_len, freqs, HEAD_DIM)
        k1n, k2n = _rotate_halves(k1, k2, cos, sin)
    if (RUN & 1) and LEAKY:
        cos, sin = _rotation(rot_ptr, PATH_FAR_K, cols, T_k, rot_len, freqs, HEAD_DIM)
        k1f, k2f = _rotate_halves(k1, k2, cos, sin)
    dtype = k_ptr.dtype.element_ty
    return k1n.to(dtype), k2n.to(dtype), k1f.to(dtype), k2f.to(dtype)


@triton.jit
def _pair_scores(q1n, q2n, q1f, q2f, k1n, k2n, k1f, k2f, pos_i, pos_j, T_k, window, RUN: tl.constexpr,
                 DOT: tl.constexpr):
    """Scores of one (query tile, key tile) pair, and where the near path was taken.

    NEAR_ONLY: every pair is at distance < w; FAR_ONLY: every pair at distance >= w (so j < i and j < T_k: no
    mask); BAND: the tile straddles i - j = w and each element takes its own path. The tiles that can reach the
    diagonal or the end of the keys compute the near score; they mask j > i and j >= T_k with -inf.
    """
    dist = pos_i[:, None] - pos_j[None, :]
    is_near = dist < window
    if RUN & 2:
        s_near = tl.dot(q1n, tl.trans(k1n), input_precision=DOT)
        s_near = tl.dot(q2n, tl.trans(k2n), s_near, input_precision=DOT)
    if RUN & 1:
        s_far = tl.dot(q1f, tl.trans(k1f), input_precision=DOT)
        s_far = tl.dot(q2f, tl.trans(k2f), s_far, input_precision=DOT)
    if RUN == BAND:
        s = tl.where(is_near, s_near, s_far)
    elif RUN == NEAR_ONLY:
        s = s_near
    else:
        s = s_far
    if RUN & 2:
        s = tl.where((dist >= 0) & (pos_j < T_k)[None, :], s, float("-inf"))
    return s, is_near


@triton.jit
def _path_grads(ds, is_near, RUN: tl.constexpr):
    """dS split by path: (dS where near, dS where far); a run on one path only passes dS through."""
    if RUN == BAND:
        ds_near = tl.where(is_near, ds, 0.0)
        ds_far = ds - ds_near
    else:
        ds_near = ds
        ds_far = ds
    return ds_near, ds_far


@triton.jit
def _key_runs(start_m, T_q, T_k, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key-tile bounds for the query rows [start_m, start_m + BLOCK_M), first position c: FAR_ONLY [0, far_end),
    BAND [far_end, near_start), NEAR_ONLY [near_start, end); keys after the last query are never seen."""
    c = (T_k - T_q) + start_m
    end = tl.minimum(T_k, c + BLOCK_M)
    # far-only tile [n, n + BLOCK_N): its nearest pair c - (n + BLOCK_N - 1) >= w
    far_end = (tl.maximum(c - window + 1, 0) // BLOCK_N) * BLOCK_N
    # near-only tile: its farthest pair (c + BLOCK_M - 1) - n < w
    near_start = tl.minimum(tl.cdiv(tl.maximum(c + BLOCK_M - window, 0), BLOCK_N) * BLOCK_N, end)
    return far_end, near_start, end


@triton.jit
def _query_runs(start_n, T_q, T_k, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query-tile bounds (row indices) for the keys [start_n, start_n + BLOCK_N): NEAR_ONLY [first, near_end),
    BAND [near_end, far_start), FAR_ONLY [far_start, T_q); rows before the first key never see it."""
    q_offset = T_k - T_q
    first = (tl.maximum(start_n - q_offset, 0) // BLOCK_M) * BLOCK_M
    # near-only tile [m, m + BLOCK_M): its farthest pair (q_offset + m + BLOCK_M - 1) - start_n < w
    near_end = tl.maximum((tl.maximum(start_n + window - q_offset, 0) // BLOCK_M) * BLOCK_M, first)
    # far-only tile: its nearest pair (q_offset + m) - (start_n + BLOCK_N - 1) >= w
    far_start = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 + window - q_offset, 0), BLOCK_M) * BLOCK_M
    far_start = tl.minimum(tl.maximum(far_start, near_end), T_q)
    return first, tl.minimum(near_end, far_start), far_start


# ----------------------------------------------------------------------------------------------------------------
# One run of tiles of one class, [lo, hi): each kernel below calls its run three times (FAR_ONLY, BAND, NEAR_ONLY)
# ----------------------------------------------------------------------------------------------------------------

@triton.jit
def _fwd_run(acc, m_i, l_i,                            # the running softmax state of the query tile
             q1n, q2n, q1f, q2f,                       # the query tile, rotated for both paths (halves)
             k_ptr, v_ptr, rot_ptr, pos_i, T_k, rot_len, window,
             freqs, dims, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, LEAKY: tl.constexpr,
             lo, hi, RUN: tl.constexpr, DOT: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        pos_j = start_n + tl.arange(0, BLOCK_N)
        k1n, k2n, k1f, k2f = _rotated_keys(k_ptr, rot_ptr, pos_j, T_k, rot_len, freqs, HEAD_DIM, RUN, LEAKY)
        s, _ = _pair_scores(q1n, q2n, q1f, q2f, k1n, k2n, k1f, k2f, pos_i, pos_j, T_k, window, RUN, DOT)
        m_i, l_i, acc = online_softmax_step(s, load_tile(v_ptr, pos_j, T_k, dims, HEAD_DIM), m_i, l_i, acc, DOT)
    return acc, m_i, l_i


@triton.jit
def _dq_run(dq1n, dq2n, dq1f, dq2f,                    # the gradients w.r.t. the rotated queries (halves)
            q1n, q2n, q1f, q2f, do, lse, delta,        # the query tile's operands
            k_near_ptr, k_far_ptr, v_ptr, pos_i, T_k, window,
            freqs, dims, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
            lo, hi, RUN: tl.constexpr, DOT: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        pos_j = start_n + tl.arange(0, BLOCK_N)
        dp = tl.dot(do, tl.trans(load_tile(v_ptr, pos_j, T_k, dims, HEAD_DIM)), input_precision=DOT)
        # Both paths are read; in a run that needs one, the compiler drops the other's (unused) loads.
        k1n, k2n = _load_halves(k_near_ptr, pos_j, T_k, freqs, HEAD_DIM)
        k1f, k2f = _load_halves(k_far_ptr, pos_j, T_k, freqs, HEAD_DIM)
        s, is_near = _pair_scores(q1n, q2n, q1f, q2f, k1n, k2n, k1f, k2f, pos_i, pos_j, T_k, window, RUN, DOT)
        _, ds = softmax_tile_grad(s, lse, dp, delta)
        ds_near, ds_far = _path_grads(ds, is_near, RUN)
        if RUN & 2:   # gradient w.r.t. the near-rotated query: dS_near (R k)_near
            dq1n += tl.dot(ds_near.to(k1n.dtype), k1n, input_precision=DOT)
            dq2n += tl.dot(ds_near.to(k2n.dtype), k2n, input_precision=DOT)
        if RUN & 1:
            dq1f += tl.dot(ds_far.to(k1f.dtype), k1f, input_precision=DOT)
            dq2f += tl.dot(ds_far.to(k2f.dtype), k2f, input_precision=DOT)
    return dq1n, dq2n, dq1f, dq2f


@triton.jit
def _dkdv_run(dk1n, dk2n, dk1f, dk2f, dv,              # the gradients w.r.t. the rotated keys (halves) and v
              k1n, k2n, k1f, k2f, v,                   # the key tile's operands
              q_near_ptr, q_far_ptr, do_ptr, lse_ptr, delta_ptr, pos_j, T_q, T_k, window,
              freqs, dims, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
              lo, hi, RUN: tl.constexpr, DOT: tl.constexpr):
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        q1n, q2n = _load_halves(q_near_ptr, rows, T_q, freqs, HEAD_DIM)
        q1f, q2f = _load_halves(q_far_ptr, rows, T_q, freqs, HEAD_DIM)
        do = load_tile(do_ptr, rows, T_q, dims, HEAD_DIM)
        lse, delta = load_row_stats(lse_ptr, delta_ptr, rows, T_q)
        s, is_near = _pair_scores(q1n, q2n, q1f, q2f, k1n, k2n, k1f, k2f, (T_k - T_q) + rows, pos_j, T_k, window,
                                  RUN, DOT)
        p, ds = softmax_tile_grad(s, lse, tl.dot(do, tl.trans(v), input_precision=DOT), delta)
        dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=DOT)
        ds_near, ds_far = _path_grads(ds, is_near, RUN)
        if RUN & 2:   # gradient w.r.t. the near-rotated key: dS_near^T (R q sigma scale)_near
            dk1n += tl.dot(tl.trans(ds_near).to(q1n.dtype), q1n, input_precision=DOT)
            dk2n += tl.dot(tl.trans(ds_near).to(q2n.dtype), q2n, input_precision=DOT)
        if RUN & 1:
            dk1f += tl.dot(tl.trans(ds_far).to(q1f.dtype), q1f, input_precision=DOT)
            dk2f += tl.dot(tl.trans(ds_far).to(q2f.dtype), q2f, input_precision=DOT)
    return dk1n, dk2n, dk1f, dk2f, dv


# ----------------------------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------------------------

@triton.jit
def rerope_fwd_kernel(
    q_ptr,                      # (B*H, T_q, d) contiguous, input dtype, before RoPE
    k_ptr, v_ptr,               # (B*H, T_k, d) contiguous, input dtype, k before RoPE
    o_ptr,                      # (B*H, T_q, d) output, input dtype
    lse_ptr,                    # (B*H, T_q) fp32 output: each row's log-sum-exp, for the backward
    rot_ptr,                    # (paths, 2, rot_len, d/2) fp32: cos and sin of each path (rotation_table), cached
    T_q, T_k,                   # queries are the last T_q of the T_k positions (prefill T_q = T_k, decode 1)
    rot_len,                    # positions in the rotation table, >= T_k: its stride from cos to sin and by path
    keys_per_split,             # with SPLIT: keys of program_id(2)'s slice, a multiple of BLOCK_N
    window,                     # w >= 1: pairs at distance i - j < w take the near (RoPE) score
    inv_log_len,                # 1/ln(train_length) for log-n scaling, 0 without
    scale,                      # score scale
    HEAD_DIM: tl.constexpr,     # d
    BLOCK_F: tl.constexpr,      # d/2 rounded up to a power of two >= 16: one half of a rotated tile
    BLOCK_D: tl.constexpr,      # d rounded up to a power of two >= 16: a value tile
    BLOCK_M: tl.constexpr,      # query rows per program
    BLOCK_N: tl.constexpr,      # keys per tile of the inner loop
    LEAKY: tl.constexpr,        # Leaky ReRoPE: the far key is rotated (path FAR_K)
    DOT: tl.constexpr,          # input_precision of the dots: "ieee" or "tf32x3" for fp32 (_flash.dot_precision)
    SPLIT: tl.constexpr,        # flash-decoding: program_id(2) takes one slice of the keys (decode, T_q = 1)
):
    start_m = tl.program_id(1) * BLOCK_M
    seq_q, _, seq_k = _head_offsets(T_q, T_k, HEAD_DIM)
    k_ptr += seq_k
    v_ptr += seq_k
    if SPLIT:   # this program's slice of the keys and its rows of the (B*H, splits, T_q) partial outputs
        split_lo = tl.program_id(2) * keys_per_split
        split_hi = split_lo + keys_per_split
        out_row = (flash_head() * tl.num_programs(2) + tl.program_id(2)) * T_q
    else:
        split_lo = 0
        split_hi = T_k
        out_row = flash_head() * T_q
    rows = start_m + tl.arange(0, BLOCK_M)
    pos_i = (T_k - T_q) + rows
    freqs = tl.arange(0, BLOCK_F)
    dims = tl.arange(0, BLOCK_D)
    q1n, q2n, q1f, q2f = _rotated_queries(q_ptr + seq_q, rot_ptr, rows, T_q, T_k, rot_len, freqs, inv_log_len,
                                          scale, HEAD_DIM)
    far_end, near_start, end = _key_runs(start_m, T_q, T_k, window, BLOCK_M, BLOCK_N)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    # Each run cut to the split's slice (its bounds are multiples of BLOCK_N, as the runs' are). The first tile
    # visited holds the slice's first key, which every row sees (prefill: key 0; decode: one row at T_k - 1, which
    # sees every key): the running max is finite from then on.
    acc, m_i, l_i = _fwd_run(acc, m_i, l_i, q1n, q2n, q1f, q2f,
                             k_ptr, v_ptr, rot_ptr, pos_i, T_k, rot_len, window,
                             freqs, dims, HEAD_DIM, BLOCK_N, LEAKY,
                             split_lo, tl.minimum(far_end, split_hi), FAR_ONLY, DOT)
    acc, m_i, l_i = _fwd_run(acc, m_i, l_i, q1n, q2n, q1f, q2f,
                             k_ptr, v_ptr, rot_ptr, pos_i, T_k, rot_len, window,
                             freqs, dims, HEAD_DIM, BLOCK_N, LEAKY,
                             tl.maximum(far_end, split_lo), tl.minimum(near_start, split_hi), BAND, DOT)
    acc, m_i, l_i = _fwd_run(acc, m_i, l_i, q1n, q2n, q1f, q2f,
                             k_ptr, v_ptr, rot_ptr, pos_i, T_k, rot_len, window,
                             freqs, dims, HEAD_DIM, BLOCK_N, LEAKY,
                             tl.maximum(near_start, split_lo), tl.minimum(end, split_hi), NEAR_ONLY, DOT)
    store_tile(o_ptr + out_row * HEAD_DIM, acc / l_i[:, None], rows, T_q, dims, HEAD_DIM)
    tl.store(lse_ptr + out_row + rows, m_i + tl.log(l_i), mask=rows < T_q)


@triton.jit
def rerope_operands_kernel(
    q_ptr,                      # (B*H, T_q, d) contiguous, input dtype, before RoPE
    k_ptr,                      # (B*H, T_k, d) contiguous, input dtype, before RoPE
    q_near_ptr, q_far_ptr,      # (B*H, T_q, d) out, input dtype: the queries times sigma_i * scale, rotated per path
    k_near_ptr, k_far_ptr,      # (B*H, T_k, d) out, input dtype: the keys rotated per path (k_far written if LEAKY)
    rot_ptr, T_q, T_k, rot_len, inv_log_len, scale,  # as in rerope_fwd_kernel
    HEAD_DIM: tl.constexpr,     # d
    BLOCK_F: tl.constexpr,      # d/2 rounded up to a power of two >= 16
    BLOCK: tl.constexpr,        # rows per program (of the queries and of the keys)
    LEAKY: tl.constexpr,        # Leaky ReRoPE: the far key is rotated (path FAR_K)
):
    """The backward's operands, rotated and scaled by the forward's own functions (_rotated_queries, _rotated_keys):
    the scores the backward recomputes are then the forward's to the bit, so P = e^{S - LSE} keeps the forward's
    normalization. Computed apart (in torch: sigma in float64, then q * sigma * scale), they differed by an ulp,
    which at scores near 500 moved P by 3e-5 relative and d/dv out of the fp32 budget. "To the bit" needs dots whose
    element does not depend on the tile's shape (the backward's tiles are not the forward's): true of a GPU's fp32
    FMA chain, not of every CPU's BLAS under the Triton interpreter (kernels/testing.py, fma_chain_dot)."""
    seq_q, _, seq_k = _head_offsets(T_q, T_k, HEAD_DIM)
    start = tl.program_id(1) * BLOCK
    rows = start + tl.arange(0, BLOCK)
    freqs = tl.arange(0, BLOCK_F)
    if start < T_q:
        q1n, q2n, q1f, q2f = _rotated_queries(q_ptr + seq_q, rot_ptr, rows, T_q, T_k, rot_len, freqs, inv_log_len,
                                              scale, HEAD_DIM)
        _store_halves(q_near_ptr + seq_q, q1n, q2n, rows, T_q, freqs, HEAD_DIM)
        _store_halves(q_far_ptr + seq_q, q1f, q2f, rows, T_q, freqs, HEAD_DIM)
    if start < T_k:
        k1n, k2n, k1f, k2f = _rotated_keys(k_ptr + seq_k, rot_ptr, rows, T_k, rot_len, freqs, HEAD_DIM, 3, LEAKY)
        _store_halves(k_near_ptr + seq_k, k1n, k2n, rows, T_k, freqs, HEAD_DIM)
        if LEAKY:
            _store_halves(k_far_ptr + seq_k, k1f, k2f, rows, T_k, freqs, HEAD_DIM)


@triton.jit
def rerope_bwd_dq_kernel(
    q_near_ptr, q_far_ptr,      # (B*H, T_q, d) input dtype: the queries times sigma_i * scale, rotated per path
    k_near_ptr, k_far_ptr,      # (B*H, T_k, d) input dtype: the keys rotated per path (ReRoPE's k_far is k)
    v_ptr, do_ptr,              # v (B*H, T_k, d); do (B*H, T_q, d), the gradient of the output
    lse_ptr, delta_ptr,         # (B*H, T_q) fp32: forward log-sum-exp, D = rowsum(dO * O)
    dq_ptr,                     # (B*H, T_q, d) output, input dtype: the gradient w.r.t. the raw queries
    rot_ptr,                    # (paths, 2, rot_len, d/2) fp32, to rotate the gradients back
    T_q, T_k, rot_len, window, inv_log_len, scale,  # as in rerope_fwd_kernel
    HEAD_DIM: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,      # query rows per program
    BLOCK_N: tl.constexpr,      # keys per tile of the inner loop
    LEAKY: tl.constexpr,
    DOT: tl.constexpr,          # input_precision of the dots (_flash.dot_precision)
):
    start_m = tl.program_id(1) * BLOCK_M
    (q_near_ptr, q_far_ptr, k_near_ptr, k_far_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr,
     seq_q, _) = _bwd_operands(q_near_ptr, q_far_ptr, k_near_ptr, k_far_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr,
                               T_q, T_k, HEAD_DIM)
    rows = start_m + tl.arange(0, BLOCK_M)
    pos_i = (T_k - T_q) + rows
    freqs = tl.arange(0, BLOCK_F)
    dims = tl.arange(0, BLOCK_D)
    q1n, q2n = _load_halves(q_near_ptr, rows, T_q, freqs, HEAD_DIM)
    q1f, q2f = _load_halves(q_far_ptr, rows, T_q, freqs, HEAD_DIM)
    do = load_tile(do_ptr, rows, T_q, dims, HEAD_DIM)
    lse, delta = load_row_stats(lse_ptr, delta_ptr, rows, T_q)
    far_end, near_start, end = _key_runs(start_m, T_q, T_k, window, BLOCK_M, BLOCK_N)
    dq1n = tl.zeros((BLOCK_M, BLOCK_F), tl.float32)      # gradient w.r.t. the near-rotated query (halves)
    dq2n = tl.zeros((BLOCK_M, BLOCK_F), tl.float32)
    dq1f = tl.zeros((BLOCK_M, BLOCK_F), tl.float32)      # ... w.r.t. the far-rotated query
    dq2f = tl.zeros((BLOCK_M, BLOCK_F), tl.float32)
    dq1n, dq2n, dq1f, dq2f = _dq_run(dq1n, dq2n, dq1f, dq2f, q1n, q2n, q1f, q2f, do, lse, delta,
                                     k_near_ptr, k_far_ptr, v_ptr, pos_i, T_k, window,
                                     freqs, dims, HEAD_DIM, BLOCK_N,
                                     0, far_end, FAR_ONLY, DOT)
    dq1n, dq2n, dq1f, dq2f = _dq_run(dq1n, dq2n, dq1f, dq2f, q1n, q2n, q1f, q2f, do, lse, delta,
                                     k_near_ptr, k_far_ptr, v_ptr, pos_i, T_k, window,
                                     freqs, dims, HEAD_DIM, BLOCK_N,
                                     far_end, near_start, BAND, DOT)
    dq1n, dq2n, dq1f, dq2f = _dq_run(dq1n, dq2n, dq1f, dq2f, q1n, q2n, q1f, q2f, do, lse, delta,
                                     k_near_ptr, k_far_ptr, v_ptr, pos_i, T_k, window,
                                     freqs, dims, HEAD_DIM, BLOCK_N,
                                     near_start, end, NEAR_ONLY, DOT)
    # Back through the rotations (R^T: the same cos, -sin) and the scaling sigma_i * scale.
    cos, sin = _rotation(rot_ptr, PATH_NEAR, pos_i, T_k, rot_len, freqs, HEAD_DIM)
    dq1n, dq2n = _rotate_halves(dq1n, dq2n, cos, -sin)
    cos, sin = _rotation(rot_ptr, PATH_FAR_Q, pos_i, T_k, rot_len, freqs, HEAD_DIM)
    dq1f, dq2f = _rotate_halves(dq1f, dq2f, cos, -sin)
    sigma = _query_scale(pos_i, inv_log_len, scale)
    _store_halves(dq_ptr + seq_q, (dq1n + dq1f) * sigma[:, None], (dq2n + dq2f) * sigma[:, None], rows, T_q, freqs,
                  HEAD_DIM)


@triton.jit
def rerope_bwd_dkdv_kernel(
    q_near_ptr, q_far_ptr,      # (B*H, T_q, d) input dtype: the queries times sigma_i * scale, rotated per path
    k_near_ptr, k_far_ptr,      # (B*H, T_k, d) input dtype: the keys rotated per path (ReRoPE's k_far is k)
    v_ptr, do_ptr,              # v (B*H, T_k, d); do (B*H, T_q, d)
    lse_ptr, delta_ptr,         # (B*H, T_q) fp32
    dk_ptr, dv_ptr,             # (B*H, T_k, d) outputs, input dtype: gradients w.r.t. the raw keys and values
    rot_ptr,                    # (paths, 2, rot_len, d/2) fp32
    T_q, T_k, rot_len, window,  # as in rerope_fwd_kernel
    HEAD_DIM: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,      # query rows per tile of the inner loop
    BLOCK_N: tl.constexpr,      # keys per program
    LEAKY: tl.constexpr,
    DOT: tl.constexpr,          # input_precision of the dots (_flash.dot_precision)
):
    start_n = tl.program_id(1) * BLOCK_N
    (q_near_ptr, q_far_ptr, k_near_ptr, k_far_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr,
     _, seq_k) = _bwd_operands(q_near_ptr, q_far_ptr, k_near_ptr, k_far_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr,
                               T_q, T_k, HEAD_DIM)
    pos_j = start_n + tl.arange(0, BLOCK_N)
    freqs = tl.arange(0, BLOCK_F)
    dims = tl.arange(0, BLOCK_D)
    k1n, k2n = _load_halves(k_near_ptr, pos_j, T_k, freqs, HEAD_DIM)
    k1f, k2f = _load_halves(k_far_ptr, pos_j, T_k, freqs, HEAD_DIM)
    v = load_tile(v_ptr, pos_j, T_k, dims, HEAD_DIM)
    dk1n = tl.zeros((BLOCK_N, BLOCK_F), tl.float32)      # gradient w.r.t. the near-rotated key (halves)
    dk2n = tl.zeros((BLOCK_N, BLOCK_F), tl.float32)
    dk1f = tl.zeros((BLOCK_N, BLOCK_F), tl.float32)      # ... w.r.t. the far key
    dk2f = tl.zeros((BLOCK_N, BLOCK_F), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    first, near_end, far_start = _query_runs(start_n, T_q, T_k, window, BLOCK_M, BLOCK_N)
    dk1n, dk2n, dk1f, dk2f, dv = _dkdv_run(dk1n, dk2n, dk1f, dk2f, dv, k1n, k2n, k1f, k2f, v,
                                           q_near_ptr, q_far_ptr, do_ptr, lse_ptr, delta_ptr, pos_j, T_q, T_k, window,
                                           freqs, dims, HEAD_DIM, BLOCK_M,
                                           first, near_end, NEAR_ONLY, DOT)
    dk1n, dk2n, dk1f, dk2f, dv = _dkdv_run(dk1n, dk2n, dk1f, dk2f, dv, k1n, k2n, k1f, k2f, v,
                                           q_near_ptr, q_far_ptr, do_ptr, lse_ptr, delta_ptr, pos_j, T_q, T_k, window,
                                           freqs, dims, HEAD_DIM, BLOCK_M,
                                           near_end, far_start, BAND, DOT)
    dk1n, dk2n, dk1f, dk2f, dv = _dkdv_run(dk1n, dk2n, dk1f, dk2f, dv, k1n, k2n, k1f, k2f, v,
                                           q_near_ptr, q_far_ptr, do_ptr, lse_ptr, delta_ptr, pos_j, T_q, T_k, window,
                                           freqs, dims, HEAD_DIM, BLOCK_M,
                                           far_start, T_q, FAR_ONLY, DOT)
    cos, sin = _rotation(rot_ptr, PATH_NEAR, pos_j, T_k, rot_len, freqs, HEAD_DIM)
    dk1n, dk2n = _rotate_halves(dk1n, dk2n, cos, -sin)
    if LEAKY:
        cos, sin = _rotation(rot_ptr, PATH_FAR_K, pos_j, T_k, rot_len, freqs, HEAD_DIM)
        dk1f, dk2f = _rotate_halves(dk1f, dk2f, cos, -sin)
    _store_halves(dk_ptr + seq_k, dk1n + dk1f, dk2n + dk2f, pos_j, T_k, freqs, HEAD_DIM)
    store_tile(dv_ptr + seq_k, dv, pos_j, T_k, dims, HEAD_DIM)


# ----------------------------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------------------------

# Head sizes up to which the fp32 kernels take set_fp32_dot_precision("tf32x3"): at 128 the three products' operand
# halves need a stack on sm_90 at every tile tried (16-32 x 16-32, 4-8 warps), so those keep IEEE products.
TF32X3_HEAD_DIM = 64


def _constexprs(kernel: str, head_dim: int, cfg: Launch, leaky: bool, dtype: torch.dtype) -> dict:
    split = {"SPLIT": kernel == "decode"} if kernel in ("fwd", "decode") else {}
    dot = dot_precision(dtype, kernel) if head_dim <= TF32X3_HEAD_DIM else "ieee"
    return dict(HEAD_DIM=head_dim, BLOCK_F=block_d(head_dim // 2), BLOCK_D=block_d(head_dim), **cfg.blocks,
                LEAKY=leaky, DOT=dot, **split)


def _options(kernel: str, head_dim: int, dtype: torch.dtype, leaky: bool) -> dict:
    """The constexprs and launch options of one kernel call."""
    cfg = _launch_config(kernel, head_dim, dtype)
    return dict(**_constexprs(kernel, head_dim, cfg, leaky, dtype), **cfg.options)


def _inv_log_len(train_length) -> float:
    return 0.0 if train_length is None else 1.0 / math.log(train_length)


def _decode_splits(T_k: int, batch_heads: int, block_n: int) -> tuple[int, int]:
    """Flash-decoding: (keys per program, splits) for one query per (batch, head) over T_k keys. Enough slices of
    the cache for two programs per SM (B H = 32: 9 slices), none smaller than one key tile and none empty."""
    splits = max(1, min(triton.cdiv(2 * GPU_SMS, batch_heads), triton.cdiv(T_k, block_n)))
    per_split = triton.cdiv(triton.cdiv(T_k, splits), block_n) * block_n
    return per_split, triton.cdiv(T_k, per_split)


def decode_splits(T_k: int, batch_heads: int, block_n: int) -> tuple[int, int]:
    """How the decode kernel splits a cache of T_k keys (flash-decoding); the cost model reads it.

    Args:
        T_k: keys in the cache. batch_heads: B H. block_n: the key tile (the decode launch's BLOCK_N).

    Returns:
        (keys per program, splits).
    """
    return _decode_splits(T_k, batch_heads, block_n)


def _merge_splits(o, lse):
    """O and LSE from the splits' own (B, H, splits, T_q, d), (B, H, splits, T_q), fp32: the softmax over all keys
    is the splits' softmaxes weighted by e^{LSE_s - LSE}, LSE = logsumexp_s LSE_s (torch's reductions, in the same
    order every run)."""
    total = torch.logsumexp(lse, dim=2)
    return (o * torch.exp(lse - total[:, :, None])[..., None]).sum(2), total


def rerope_fwd(q, k, v, rot, window, leaky, train_length, scale):
    """Runs the forward kernel: q (B, H, T_q, d) the last T_q positions of k, v (B, H, T_k, d), all contiguous;
    rot the rotation table (at least T_k positions). Returns O and each row's log-sum-exp. Decode (T_q = 1) splits
    the cache across programs (the grid's third axis) and merges their partial results."""
    B, H, T_q, d = q.shape
    T_k = k.shape[2]
    opts = _options("decode" if T_q == 1 else "fwd", d, q.dtype, leaky)
    per_split, splits = (_decode_splits(T_k, B * H, opts["BLOCK_N"]) if T_q == 1
                         else (triton.cdiv(T_k, opts["BLOCK_N"]) * opts["BLOCK_N"], 1))
    o = new_output((B, H, splits, T_q, d), q.dtype if splits == 1 else torch.float32, q.device)
    lse = new_output((B, H, splits, T_q), torch.float32, q.device)
    rerope_fwd_kernel[(*flash_grid(T_q, opts["BLOCK_M"], B * H), splits)](
        q, k, v, o, lse, rot, T_q, T_k, rot.shape[2], per_split, window, _inv_log_len(train_length), scale, **opts)
    if splits == 1:
        return o[:, :, 0], lse[:, :, 0]
    o, lse = _merge_splits(o, lse)
    return o.to(q.dtype), lse


OPERANDS_BLOCK = 64   # rows of the queries and of the keys per program of rerope_operands_kernel


def _operands_constexprs(head_dim: int, leaky: bool) -> dict:
    return dict(HEAD_DIM=head_dim, BLOCK_F=block_d(head_dim // 2), BLOCK=OPERANDS_BLOCK, LEAKY=leaky)


def rerope_bwd(q, k, v, o, lse, rot, do, window, leaky, train_length, scale):
    """Runs the two backward kernels on the forward's inputs and outputs; returns dq, dk, dv."""
    B, H, T_q, d = q.shape
    T_k = k.shape[2]
    do = do.contiguous()
    delta = flash_delta(o, do)                               # D_i = sum_c dO_ic O_ic, (B, H, T_q) fp32
    # The rotated operands of both paths, built by the forward's own functions (rerope_operands_kernel says why).
    q_near, q_far = (new_output(q.shape, q.dtype, q.device) for _ in range(2))
    k_near = new_output(k.shape, k.dtype, k.device)
    k_far = new_output(k.shape, k.dtype, k.device) if leaky else k
    rerope_operands_kernel[flash_grid(max(T_q, T_k), OPERANDS_BLOCK, B * H)](
        q, k, q_near, q_far, k_near, k_far, rot, T_q, T_k, rot.shape[2], _inv_log_len(train_length), scale,
        **_operands_constexprs(d, leaky))
    dq = new_output(q.shape, q.dtype, q.device)
    dk = new_output(k.shape, k.dtype, k.device)
    dv = new_output(v.shape, v.dtype, v.device)
    operands = (q_near, q_far, k_near, k_far, v, do, lse, delta)
    opts = _options("dq", d, q.dtype, leaky)
    rerope_bwd_dq_kernel[flash_grid(T_q, opts["BLOCK_M"], B * H)](
        *operands, dq, rot, T_q, T_k, rot.shape[2], window, _inv_log_len(train_length), scale, **opts)
    opts = _options("dkdv", d, q.dtype, leaky)
    rerope_bwd_dkdv_kernel[flash_grid(T_k, opts["BLOCK_N"], B * H)](
        *operands, dk, dv, rot, T_q, T_k, rot.shape[2], window, **opts)
    return dq, dk, dv


# ----------------------------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------------------------

class ReropeFunction(torch.autograd.Function):
    """The fused kernels. q (B, H, T_q, d) are the last T_q positions of k, v (B, H, T_k, d); all contiguous."""

    @staticmethod
    def forward(ctx, q, k, v, window, leaky_k, scale, train_length, base):
        rot = cached_rotation_table(k.shape[2], q.shape[-1], window, leaky_k, base, q.device)
        o, lse = rerope_fwd(q, k, v, rot, window, leaky_k is not None, train_length, scale)
        ctx.save_for_backward(q, k, v, o, lse, rot)
        ctx.args = (window, leaky_k is not None, train_length, scale)
        return o

    @staticmethod
    @first_order_only
    def backward(ctx, do):
        return (*rerope_bwd(*ctx.saved_tensors, do, *ctx.args), None, None, None, None, None)


def rerope_triton(q, k, v, window, leaky_k, scale, train_length, base):
    """Prefill (T_q = T_k) or decode (T_q = 1): q (B, H, T_q, d), k, v (B, H, T_k, d), options checked."""
    return ReropeFunction.apply(q.contiguous(), k.contiguous(), v.contiguous(), window, leaky_k, scale, train_length,
                                base)


# ----------------------------------------------------------------------------------------------------------------
# Ahead-of-time build (python -m seqmix.kernels.aot)
# ----------------------------------------------------------------------------------------------------------------

def aot_kernels():
    """The three kernels, ReRoPE and Leaky, at head size 64 and 128 in fp32, fp16 and bf16; decode: the forward at
    its launch configuration, writing its split's fp32 partial output; and the backward's rotated operands
    (rerope_operands_kernel, at the default launch options). The fp32 forward also with tf32x3 dots."""
    from ..aot import AOT_DTYPES, FLASH_ARG_TYPES, AotKernel, fp32_dot_variants
    variants = [(kernel, fn, fn.__name__.removesuffix("_kernel"))
                for kernel, fn in zip(KERNELS, (rerope_fwd_kernel, rerope_bwd_dq_kernel, rerope_bwd_dkdv_kernel))]
    variants.append(("decode", rerope_fwd_kernel, "rerope_decode"))
    kernels = []
    for d in (64, 128):
        for dtype, torch_dtype in AOT_DTYPES.items():
            for leaky in (False, True):
                for kernel, fn, label in variants:
                    cfg = _launch_config(kernel, d, torch_dtype)
                    types = {**FLASH_ARG_TYPES, "o_ptr": "*fp32"} if kernel == "decode" else FLASH_ARG_TYPES
                    constexprs = _constexprs(kernel, d, cfg, leaky, torch_dtype)
                    kernels += [AotKernel(f"{label} d={d} {dtype}{' leaky' if leaky else ''}{suffix}", fn,
                                          {**constexprs, **dot}, types, "*" + dtype, cfg.num_warps, cfg.num_stages,
                                          wide_offsets=False)
                                for suffix, dot in fp32_dot_variants(kernel, dtype, d <= TF32X3_HEAD_DIM)]
                kernels.append(AotKernel(f"rerope_operands d={d} {dtype}{' leaky' if leaky else ''}",
                                         rerope_operands_kernel, _operands_constexprs(d, leaky), FLASH_ARG_TYPES,
                                         "*" + dtype, wide_offsets=False))
    return kernels
