"""ReRoPE and Leaky ReRoPE attention in O(T) memory: fused Triton kernels (forward, backward, decode) and a torch
path built from exact pieces of flash attention merged by their log-sum-exp.

    score_ij = (q_i * sigma_i) . R(-rel(i - j)) k_j * scale   (causal),   O = softmax(score) v
    rel(x) = min(x, w)                           (ReRoPE)
    rel(x) = x if x < w else w + (x - w) / k     (Leaky ReRoPE, k > 1)
    sigma_i = max(1, ln(i + 1) / ln L)           (log-n scaling, with train_length = L; 1 without)

Shapes: q, k, v (B, H, T, d), d even -> (B, H, T, d). Decode: q (B, H, 1, d) at position T - 1, k_cache and
v_cache (B, H, T, d) holding keys *before* RoPE -> (B, H, 1, d). Float64 truth: reference/rope.py
(attention_from_relative_positions is the per-pair definition; rerope_attention the source's two-pass form).
Source: Su Jianlin, https://spaces.ac.cn/archives/9708, section "计算".

Why the source says "twice, and no flash attention". RoPE reaches a relative position through absolute ones,
(R(i) q) . (R(j) k) = q . R(j - i) k, and min(i - j, w) is not linear in i - j. The source therefore builds two
score matrices, a1 = (R(i) q_i) . (R(j) k_j) used where i - j < w and a2 = (R(w) q_i) . k_j (Leaky:
(R((i - w)/k + w) q_i) . (R(j/k) k_j)) used where i - j >= w, and merges them: two T x T matrices.

What is done here instead. Each pair (i, j) needs exactly one of the two scores, and which one depends on i - j
only: a band of width w along the diagonal is "near" (RoPE), everything below it is "far". So:

* Triton (flash style): a program owns a tile of queries and walks the key tiles in three runs, classified from
  the tile corners: tiles entirely at distance >= w compute the far score only, tiles entirely at distance < w the
  RoPE score only, and the one or two tiles that straddle i - j = w compute both and pick per element. The cost
  is one attention plus a band of about two tiles per row, and nothing T x T exists.
  Rotations are applied to tiles in registers, with cos and sin read from a small table (paths x T x d/2, fp32,
  computed in float64 on the host, as RoPE implementations keep a cos/sin cache): exact to fp32 at any position,
  where an fp32 angle p * theta would lose digits as p grows.
  Backward (flash style, log-sum-exp saved): the rotated operands of both paths, (R q sigma scale)_near/far and
  (R k)_near/far, are formed once (O(T d), the values the forward built in registers; forming them in the loops
  as well made the backward spill registers). dS is the usual P * (dP - D); it splits by path, dS_near and dS_far.
  The gradient reaches each path's rotated query, dq_path = dS_path (R k)_path, and the raw query through the
  transposed rotation: rotations are orthogonal, R(a)^T = R(-a), so
      dq_i = sigma_i * scale * (R(-i) dq_near_i + R(-a_i) dq_far_i),   a_i = w  or  (i - w)/k + w
  (accumulated per path over the key tiles, rotated back once at the end), and likewise for k:
      dk_j = R(-j) dk_near_j + R(-j/k) dk_far_j                        (ReRoPE: dk_far_j, unrotated).
  Decode is the same kernel with one query row at position T - 1 (the other rows of its tile are masked: tl.dot
  takes at least 16): each cached (pre-RoPE) key is rotated on the fly in registers and no rotated copy of the
  cache is written (the backward, when asked for, is a prefill's).
  Dots take the input dtype with fp32 accumulation; fp32 inputs use IEEE fp32 products (input_precision="ieee",
  not TF32), so that the fp32 error budget holds on a GPU too.
* torch: the far part is an ordinary causal attention shifted by w (query i sees keys j <= i - w) of the
  far-rotated queries against the far-rotated keys; the near band is, in blocks of w rows, a causal attention inside
  each block plus a masked attention to the previous block (see ``_pieces``). Each piece is one call of a
  flash-attention kernel that also returns its log-sum-exp (CPU: aten's ``_scaled_dot_product_flash_attention_for_
  cpu``, the kernel behind scaled_dot_product_attention; other devices: the same in chunks of plain torch), and the
  pieces are merged exactly:   LSE = log(sum_p e^{LSE_p}),   O = sum_p e^{LSE_p - LSE} O_p.
  Memory is O(T d) (plus a (w, w) mask). The backward calls each piece's flash backward with the *merged* output and
  log-sum-exp, which gives exactly that piece's share of the gradient, then rotates back as above.
  Decode rotates the cache in chunks of keys (no copy of the whole cache), then one softmax.
"""
from __future__ import annotations

import math
import numbers
from collections import namedtuple

import torch

from seqmix.kernels._backend import check_backend_dtype, resolve_backend
from seqmix.kernels._common import (Launch, accumulation_dtype, check_devices, check_same_dtype, check_tensor,
                                    new_output, tl, triton)
from seqmix.kernels._flash import (block_d, check_triton_head_dim, flash_launch, load_row_stats, load_tile,
                                   online_softmax_step, softmax_tile_grad, store_tile)

LaunchConfigs = namedtuple("LaunchConfigs", "fwd dq dkdv")     # one per kernel
DECODE_CHUNK = 4096          # keys rotated at a time by the torch decode


def _launch_configs(head_dim: int, dtype: torch.dtype) -> LaunchConfigs:
    """Tiles of the three kernels for head size ``head_dim`` and inputs of ``dtype``: the largest found that compile
    without register spills on sm_80 and sm_90 (``python -m seqmix.kernels.aot``). Each query and key tile is held in two
    rotations and the backward keeps two gradient accumulators per tile, hence smaller tiles than attention's."""
    if dtype == torch.float32:
        return LaunchConfigs(flash_launch(32, 32, 8, 1), flash_launch(16, 16, 8, 2), flash_launch(16, 16, 8, 1))
    fwd = flash_launch(64, 32, 4, 2) if head_dim <= 64 else flash_launch(32, 32, 8, 2)
    return LaunchConfigs(fwd, flash_launch(16, 16, 8, 2), flash_launch(16, 16, 8, 2))



# ----------------------------------------------------------------------------------------------------------------
# The rotations: one table of cos and sin for every rotation ReRoPE applies, shared by both backends
# ----------------------------------------------------------------------------------------------------------------

NEAR, FAR_Q, FAR_K = 0, 1, 2      # the table's paths: RoPE's R(p); the far query's rotation; the far key's
# (the kernels spell them as literals 0, 1, 2: a Triton kernel reads no plain Python globals)


def _cos_sin(positions, d, base, dtype):
    """(2, n, d/2): cos and sin of positions * inv_freq, inv_freq_f = base^(-2f/d). The angles are float64 and
    rounded once to ``dtype``, so the values are as exact at position 10^5 as at 0 (an fp32 angle is not)."""
    inv_freq = float(base) ** (-torch.arange(0, d, 2, dtype=torch.float64, device=positions.device) / d)
    angle = positions.to(torch.float64)[:, None] * inv_freq
    return torch.stack((angle.cos(), angle.sin())).to(dtype)


def _rotation_table(T, d, window, leaky_k, base, dtype, device):
    """(paths, 2, T, d/2): [NEAR] position p; [FAR_Q] w for ReRoPE, (p - w)/k + w for Leaky; [FAR_K] p/k (Leaky
    only: ReRoPE's far key is not rotated)."""
    p = torch.arange(T, dtype=torch.float64, device=device)
    positions = [p, torch.full_like(p, float(window)) if leaky_k is None else (p - window) / leaky_k + window]
    if leaky_k is not None:
        positions.append(p / leaky_k)
    return torch.stack([_cos_sin(x, d, base, dtype) for x in positions])


# ----------------------------------------------------------------------------------------------------------------
# Triton building blocks. A rotated tile is kept as its two halves (x1, x2) = (x[:, :d/2], x[:, d/2:]): the
# rotate-half layout pairs dimension f with f + d/2, and q . k = q1 . k1 + q2 . k2.
# ----------------------------------------------------------------------------------------------------------------

@triton.jit
def _rotate_halves(x1, x2, cos, sin):
    """R x on the halves: (x1 cos - x2 sin, x2 cos + x1 sin). With -sin it is R^T x = R(-angle) x."""
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def _rotation(ROT, PATH: tl.constexpr, pos, T_k, freqs, HEAD_DIM: tl.constexpr):
    """cos and sin, (rows, BLOCK_F) fp32, of path PATH of the rotation table at positions ``pos`` (identity
    outside the table)."""
    half: tl.constexpr = HEAD_DIM // 2
    mask = (pos < T_k)[:, None] & (freqs < half)[None, :]
    ptrs = ROT + (PATH * 2 * T_k + pos[:, None]) * half + freqs[None, :]
    return tl.load(ptrs, mask=mask, other=1.0), tl.load(ptrs + T_k * half, mask=mask, other=0.0)


@triton.jit
def _load_halves(ptr, rows, n_rows, freqs, HEAD_DIM: tl.constexpr):
    """Both halves of rows ``rows`` of a (n_rows, HEAD_DIM) matrix, zero outside it."""
    mask = (rows < n_rows)[:, None] & (freqs < HEAD_DIM // 2)[None, :]
    ptrs = ptr + rows[:, None] * HEAD_DIM + freqs[None, :]
    return tl.load(ptrs, mask=mask, other=0.0), tl.load(ptrs + HEAD_DIM // 2, mask=mask, other=0.0)


@triton.jit
def _store_halves(ptr, x1, x2, rows, n_rows, freqs, HEAD_DIM: tl.constexpr):
    mask = (rows < n_rows)[:, None] & (freqs < HEAD_DIM // 2)[None, :]
    ptrs = ptr + rows[:, None] * HEAD_DIM + freqs[None, :]
    tl.store(ptrs, x1.to(ptr.dtype.element_ty), mask=mask)
    tl.store(ptrs + HEAD_DIM // 2, x2.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _query_scale(pos, inv_log_len, scale):
    """sigma_i * scale: the log-n factor max(1, ln(i + 1)/ln L) (1 when inv_log_len = 0) times the score scale."""
    return scale * tl.maximum(1.0, tl.log(pos.to(tl.float32) + 1.0) * inv_log_len)


@triton.jit
def _rotated_queries(Q, ROT, rows, T_q, T_k, freqs, inv_log_len, scale, HEAD_DIM: tl.constexpr):
    """The query tile times sigma_i * scale, rotated for both paths; halves in Q's dtype."""
    pos = (T_k - T_q) + rows
    q1, q2 = _load_halves(Q, rows, T_q, freqs, HEAD_DIM)
    sigma = _query_scale(pos, inv_log_len, scale)
    q1 = q1.to(tl.float32) * sigma[:, None]
    q2 = q2.to(tl.float32) * sigma[:, None]
    cos, sin = _rotation(ROT, 0, pos, T_k, freqs, HEAD_DIM)    # path NEAR
    q1n, q2n = _rotate_halves(q1, q2, cos, sin)
    cos, sin = _rotation(ROT, 1, pos, T_k, freqs, HEAD_DIM)    # path FAR_Q
    q1f, q2f = _rotate_halves(q1, q2, cos, sin)
    dtype = Q.dtype.element_ty
    return q1n.to(dtype), q2n.to(dtype), q1f.to(dtype), q2f.to(dtype)


@triton.jit
def _rotated_keys(K, ROT, cols, T_k, freqs,
                  HEAD_DIM: tl.constexpr, NEAR: tl.constexpr, FAR: tl.constexpr, LEAKY: tl.constexpr):
    """The key tile rotated for the paths it needs; halves in K's dtype. ReRoPE's far key is the raw key."""
    k1, k2 = _load_halves(K, cols, T_k, freqs, HEAD_DIM)
    k1 = k1.to(tl.float32)
    k2 = k2.to(tl.float32)
    k1n, k2n, k1f, k2f = k1, k2, k1, k2
    if NEAR:
        cos, sin = _rotation(ROT, 0, cols, T_k, freqs, HEAD_DIM)    # path NEAR
        k1n, k2n = _rotate_halves(k1, k2, cos, sin)
    if FAR and LEAKY:
        cos, sin = _rotation(ROT, 2, cols, T_k, freqs, HEAD_DIM)    # path FAR_K
        k1f, k2f = _rotate_halves(k1, k2, cos, sin)
    dtype = K.dtype.element_ty
    return k1n.to(dtype), k2n.to(dtype), k1f.to(dtype), k2f.to(dtype)


@triton.jit
def _pair_scores(q1n, q2n, q1f, q2f, k1n, k2n, k1f, k2f, pos_i, pos_j, T_k, window,
                 NEAR: tl.constexpr, FAR: tl.constexpr):
    """Scores of one (query tile, key tile) pair, and where the near path was taken.

    NEAR only: every pair is at distance < w; FAR only: every pair at distance >= w (so j < i and j < T_k: no
    mask); both: the tile straddles i - j = w and each element takes its own path. The tiles that can reach the
    diagonal or the end of the keys are NEAR ones; they mask j > i and j >= T_k with -inf.
    """
    dist = pos_i[:, None] - pos_j[None, :]
    is_near = dist < window
    if NEAR:
        s_near = tl.dot(q1n, tl.trans(k1n), input_precision="ieee")
        s_near = tl.dot(q2n, tl.trans(k2n), s_near, input_precision="ieee")
    if FAR:
        s_far = tl.dot(q1f, tl.trans(k1f), input_precision="ieee")
        s_far = tl.dot(q2f, tl.trans(k2f), s_far, input_precision="ieee")
    if NEAR and FAR:
        s = tl.where(is_near, s_near, s_far)
    elif NEAR:
        s = s_near
    else:
        s = s_far
    if NEAR:
        s = tl.where((dist >= 0) & (pos_j < T_k)[None, :], s, float("-inf"))
    return s, is_near


@triton.jit
def _path_grads(ds, is_near, NEAR: tl.constexpr, FAR: tl.constexpr):
    """dS split by path: (dS where near, dS where far); a tile on one path only passes dS through."""
    if NEAR and FAR:
        ds_near = tl.where(is_near, ds, 0.0)
        ds_far = ds - ds_near
    else:
        ds_near = ds
        ds_far = ds
    return ds_near, ds_far


@triton.jit
def _key_runs(start_m, T_q, T_k, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key-tile bounds for the query rows [start_m, start_m + BLOCK_M), first position c: far-only [0, far_end),
    straddling [far_end, near_start), near-only [near_start, end); keys after the last query are never seen."""
    c = (T_k - T_q) + start_m
    end = tl.minimum(T_k, c + BLOCK_M)
    # far-only tile [n, n + BLOCK_N): its nearest pair c - (n + BLOCK_N - 1) >= w
    far_end = (tl.maximum(c - window + 1, 0) // BLOCK_N) * BLOCK_N
    # near-only tile: its farthest pair (c + BLOCK_M - 1) - n < w
    near_start = tl.minimum(tl.cdiv(tl.maximum(c + BLOCK_M - window, 0), BLOCK_N) * BLOCK_N, end)
    return far_end, near_start, end


@triton.jit
def _query_runs(start_n, T_q, T_k, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query-tile bounds (row indices) for the keys [start_n, start_n + BLOCK_N): near-only [first, near_end),
    straddling [near_end, far_start), far-only [far_start, T_q); rows before the first key never see it."""
    q_offset = T_k - T_q
    first = (tl.maximum(start_n - q_offset, 0) // BLOCK_M) * BLOCK_M
    # near-only tile [m, m + BLOCK_M): its farthest pair (q_offset + m + BLOCK_M - 1) - start_n < w
    near_end = tl.maximum((tl.maximum(start_n + window - q_offset, 0) // BLOCK_M) * BLOCK_M, first)
    # far-only tile: its nearest pair (q_offset + m) - (start_n + BLOCK_N - 1) >= w
    far_start = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 + window - q_offset, 0), BLOCK_M) * BLOCK_M
    far_start = tl.minimum(tl.maximum(far_start, near_end), T_q)
    return first, tl.minimum(near_end, far_start), far_start


# ----------------------------------------------------------------------------------------------------------------
# Triton: one run of tiles of one class; each kernel below calls its run three times (far, straddling, near)
# ----------------------------------------------------------------------------------------------------------------

@triton.jit
def _fwd_run(acc, m_i, l_i, q1n, q2n, q1f, q2f, K, V, ROT, pos_i, lo, hi, T_k, window, freqs, dims,
             HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, NEAR: tl.constexpr, FAR: tl.constexpr,
             LEAKY: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        pos_j = start_n + tl.arange(0, BLOCK_N)
        k1n, k2n, k1f, k2f = _rotated_keys(K, ROT, pos_j, T_k, freqs, HEAD_DIM, NEAR, FAR, LEAKY)
        s, _ = _pair_scores(q1n, q2n, q1f, q2f, k1n, k2n, k1f, k2f, pos_i, pos_j, T_k, window, NEAR, FAR)
        m_i, l_i, acc = online_softmax_step(s, load_tile(V, pos_j, T_k, dims, HEAD_DIM), m_i, l_i, acc)
    return acc, m_i, l_i


@triton.jit
def _dq_run(dq1n, dq2n, dq1f, dq2f, q1n, q2n, q1f, q2f, do, lse, delta, K_NEAR, K_FAR, V, pos_i, lo, hi, T_k,
            window, freqs, dims, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, NEAR: tl.constexpr,
            FAR: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        pos_j = start_n + tl.arange(0, BLOCK_N)
        dp = tl.dot(do, tl.trans(load_tile(V, pos_j, T_k, dims, HEAD_DIM)), input_precision="ieee")
        # Both paths are read; in a run that needs one, the compiler drops the other's (unused) loads.
        k1n, k2n = _load_halves(K_NEAR, pos_j, T_k, freqs, HEAD_DIM)
        k1f, k2f = _load_halves(K_FAR, pos_j, T_k, freqs, HEAD_DIM)
        s, is_near = _pair_scores(q1n, q2n, q1f, q2f, k1n, k2n, k1f, k2f, pos_i, pos_j, T_k, window, NEAR, FAR)
        _, ds = softmax_tile_grad(s, lse, dp, delta)
        ds_near, ds_far = _path_grads(ds, is_near, NEAR, FAR)
        if NEAR:   # gradient w.r.t. the near-rotated query: dS_near (R k)_near
            dq1n += tl.dot(ds_near.to(k1n.dtype), k1n, input_precision="ieee")
            dq2n += tl.dot(ds_near.to(k2n.dtype), k2n, input_precision="ieee")
        if FAR:
            dq1f += tl.dot(ds_far.to(k1f.dtype), k1f, input_precision="ieee")
            dq2f += tl.dot(ds_far.to(k2f.dtype), k2f, input_precision="ieee")
    return dq1n, dq2n, dq1f, dq2f


@triton.jit
def _dkdv_run(dk1n, dk2n, dk1f, dk2f, dv, k1n, k2n, k1f, k2f, v, Q_NEAR, Q_FAR, DO, LSE, DELTA, pos_j, lo, hi,
              T_q, T_k, window, freqs, dims,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, NEAR: tl.constexpr, FAR: tl.constexpr):
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        q1n, q2n = _load_halves(Q_NEAR, rows, T_q, freqs, HEAD_DIM)
        q1f, q2f = _load_halves(Q_FAR, rows, T_q, freqs, HEAD_DIM)
        do = load_tile(DO, rows, T_q, dims, HEAD_DIM)
        lse, delta = load_row_stats(LSE, DELTA, rows, T_q)
        s, is_near = _pair_scores(q1n, q2n, q1f, q2f, k1n, k2n, k1f, k2f, (T_k - T_q) + rows, pos_j, T_k, window,
                                  NEAR, FAR)
        p, ds = softmax_tile_grad(s, lse, tl.dot(do, tl.trans(v), input_precision="ieee"), delta)
        dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision="ieee")
        ds_near, ds_far = _path_grads(ds, is_near, NEAR, FAR)
        if NEAR:   # gradient w.r.t. the near-rotated key: dS_near^T (R q sigma scale)_near
            dk1n += tl.dot(tl.trans(ds_near).to(q1n.dtype), q1n, input_precision="ieee")
            dk2n += tl.dot(tl.trans(ds_near).to(q2n.dtype), q2n, input_precision="ieee")
        if FAR:
            dk1f += tl.dot(tl.trans(ds_far).to(q1f.dtype), q1f, input_precision="ieee")
            dk2f += tl.dot(tl.trans(ds_far).to(q2f.dtype), q2f, input_precision="ieee")
    return dk1n, dk2n, dk1f, dk2f, dv


# ----------------------------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------------------------

@triton.jit
def rerope_fwd_kernel(
    Q,                          # (B*H, T_q, d) contiguous, input dtype, before RoPE
    K, V,                       # (B*H, T_k, d) contiguous, input dtype, K before RoPE
    O,                          # (B*H, T_q, d) output, input dtype
    LSE,                        # (B*H, T_q) fp32 output: each row's log-sum-exp, for the backward
    ROT,                        # (paths, 2, T_k, d/2) fp32: cos and sin of each path (_rotation_table)
    T_q, T_k,                   # queries are the last T_q of the T_k positions (prefill T_q = T_k, decode 1)
    window,                     # w >= 1: pairs at distance i - j < w take the near (RoPE) score
    inv_log_len,                # 1/ln(train_length) for log-n scaling, 0 without
    scale,                      # score scale
    HEAD_DIM: tl.constexpr,     # d
    BLOCK_F: tl.constexpr,      # d/2 rounded up to a power of two >= 16: one half of a rotated tile
    BLOCK_D: tl.constexpr,      # d rounded up to a power of two >= 16: a value tile
    BLOCK_M: tl.constexpr,      # query rows per program
    BLOCK_N: tl.constexpr,      # keys per tile of the inner loop
    LEAKY: tl.constexpr,        # Leaky ReRoPE: the far key is rotated (path FAR_K)
):
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    Q += bh * T_q * HEAD_DIM
    O += bh * T_q * HEAD_DIM
    LSE += bh * T_q
    K += bh * T_k * HEAD_DIM
    V += bh * T_k * HEAD_DIM
    rows = start_m + tl.arange(0, BLOCK_M)
    pos_i = (T_k - T_q) + rows
    freqs = tl.arange(0, BLOCK_F)
    dims = tl.arange(0, BLOCK_D)
    q1n, q2n, q1f, q2f = _rotated_queries(Q, ROT, rows, T_q, T_k, freqs, inv_log_len, scale, HEAD_DIM)
    far_end, near_start, end = _key_runs(start_m, T_q, T_k, window, BLOCK_M, BLOCK_N)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    # The first tile visited holds key 0, which every row sees: the running max is finite from then on.
    acc, m_i, l_i = _fwd_run(acc, m_i, l_i, q1n, q2n, q1f, q2f, K, V, ROT, pos_i, 0, far_end, T_k, window, freqs,
                             dims, HEAD_DIM, BLOCK_N, False, True, LEAKY)
    acc, m_i, l_i = _fwd_run(acc, m_i, l_i, q1n, q2n, q1f, q2f, K, V, ROT, pos_i, far_end, near_start, T_k, window,
                             freqs, dims, HEAD_DIM, BLOCK_N, True, True, LEAKY)
    acc, m_i, l_i = _fwd_run(acc, m_i, l_i, q1n, q2n, q1f, q2f, K, V, ROT, pos_i, near_start, end, T_k, window,
                             freqs, dims, HEAD_DIM, BLOCK_N, True, False, LEAKY)
    store_tile(O, acc / l_i[:, None], rows, T_q, dims, HEAD_DIM)
    tl.store(LSE + rows, m_i + tl.log(l_i), mask=rows < T_q)


@triton.jit
def rerope_bwd_dq_kernel(
    Q_NEAR, Q_FAR,              # (B*H, T_q, d) input dtype: the queries times sigma_i * scale, rotated per path
    K_NEAR, K_FAR,              # (B*H, T_k, d) input dtype: the keys rotated per path (ReRoPE's K_FAR is K)
    V, DO,                      # V (B*H, T_k, d); DO (B*H, T_q, d), the gradient of the output
    LSE, DELTA,                 # (B*H, T_q) fp32: forward log-sum-exp, D = rowsum(dO * O)
    DQ,                         # (B*H, T_q, d) output, input dtype: the gradient w.r.t. the raw queries
    ROT,                        # (paths, 2, T_k, d/2) fp32, to rotate the gradients back
    T_q, T_k, window, inv_log_len, scale,           # as in rerope_fwd_kernel
    HEAD_DIM: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,      # query rows per program
    BLOCK_N: tl.constexpr,      # keys per tile of the inner loop
    LEAKY: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    Q_NEAR += bh * T_q * HEAD_DIM
    Q_FAR += bh * T_q * HEAD_DIM
    DO += bh * T_q * HEAD_DIM
    DQ += bh * T_q * HEAD_DIM
    LSE += bh * T_q
    DELTA += bh * T_q
    K_NEAR += bh * T_k * HEAD_DIM
    K_FAR += bh * T_k * HEAD_DIM
    V += bh * T_k * HEAD_DIM
    rows = start_m + tl.arange(0, BLOCK_M)
    pos_i = (T_k - T_q) + rows
    freqs = tl.arange(0, BLOCK_F)
    dims = tl.arange(0, BLOCK_D)
    q1n, q2n = _load_halves(Q_NEAR, rows, T_q, freqs, HEAD_DIM)
    q1f, q2f = _load_halves(Q_FAR, rows, T_q, freqs, HEAD_DIM)
    do = load_tile(DO, rows, T_q, dims, HEAD_DIM)
    lse, delta = load_row_stats(LSE, DELTA, rows, T_q)
    far_end, near_start, end = _key_runs(start_m, T_q, T_k, window, BLOCK_M, BLOCK_N)
    dq1n = tl.zeros((BLOCK_M, BLOCK_F), tl.float32)      # gradient w.r.t. the near-rotated query (halves)
    dq2n = tl.zeros((BLOCK_M, BLOCK_F), tl.float32)
    dq1f = tl.zeros((BLOCK_M, BLOCK_F), tl.float32)      # ... w.r.t. the far-rotated query
    dq2f = tl.zeros((BLOCK_M, BLOCK_F), tl.float32)
    dq1n, dq2n, dq1f, dq2f = _dq_run(dq1n, dq2n, dq1f, dq2f, q1n, q2n, q1f, q2f, do, lse, delta, K_NEAR, K_FAR, V,
                                     pos_i, 0, far_end, T_k, window, freqs, dims, HEAD_DIM, BLOCK_N, False, True)
    dq1n, dq2n, dq1f, dq2f = _dq_run(dq1n, dq2n, dq1f, dq2f, q1n, q2n, q1f, q2f, do, lse, delta, K_NEAR, K_FAR, V,
                                     pos_i, far_end, near_start, T_k, window, freqs, dims, HEAD_DIM, BLOCK_N, True,
                                     True)
    dq1n, dq2n, dq1f, dq2f = _dq_run(dq1n, dq2n, dq1f, dq2f, q1n, q2n, q1f, q2f, do, lse, delta, K_NEAR, K_FAR, V,
                                     pos_i, near_start, end, T_k, window, freqs, dims, HEAD_DIM, BLOCK_N, True, False)
    # Back through the rotations (R^T: the same cos, -sin) and the scaling sigma_i * scale.
    cos, sin = _rotation(ROT, 0, pos_i, T_k, freqs, HEAD_DIM)    # path NEAR
    dq1n, dq2n = _rotate_halves(dq1n, dq2n, cos, -sin)
    cos, sin = _rotation(ROT, 1, pos_i, T_k, freqs, HEAD_DIM)    # path FAR_Q
    dq1f, dq2f = _rotate_halves(dq1f, dq2f, cos, -sin)
    sigma = _query_scale(pos_i, inv_log_len, scale)
    _store_halves(DQ, (dq1n + dq1f) * sigma[:, None], (dq2n + dq2f) * sigma[:, None], rows, T_q, freqs, HEAD_DIM)


@triton.jit
def rerope_bwd_dkdv_kernel(
    Q_NEAR, Q_FAR,              # (B*H, T_q, d) input dtype: the queries times sigma_i * scale, rotated per path
    K_NEAR, K_FAR,              # (B*H, T_k, d) input dtype: the keys rotated per path (ReRoPE's K_FAR is K)
    V, DO,                      # V (B*H, T_k, d); DO (B*H, T_q, d)
    LSE, DELTA,                 # (B*H, T_q) fp32
    DK, DV,                     # (B*H, T_k, d) outputs, input dtype: gradients w.r.t. the raw keys and values
    ROT,                        # (paths, 2, T_k, d/2) fp32
    T_q, T_k, window,           # as in rerope_fwd_kernel
    HEAD_DIM: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,      # query rows per tile of the inner loop
    BLOCK_N: tl.constexpr,      # keys per program
    LEAKY: tl.constexpr,
):
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1).to(tl.int64)
    Q_NEAR += bh * T_q * HEAD_DIM
    Q_FAR += bh * T_q * HEAD_DIM
    DO += bh * T_q * HEAD_DIM
    LSE += bh * T_q
    DELTA += bh * T_q
    K_NEAR += bh * T_k * HEAD_DIM
    K_FAR += bh * T_k * HEAD_DIM
    V += bh * T_k * HEAD_DIM
    DK += bh * T_k * HEAD_DIM
    DV += bh * T_k * HEAD_DIM
    pos_j = start_n + tl.arange(0, BLOCK_N)
    freqs = tl.arange(0, BLOCK_F)
    dims = tl.arange(0, BLOCK_D)
    k1n, k2n = _load_halves(K_NEAR, pos_j, T_k, freqs, HEAD_DIM)
    k1f, k2f = _load_halves(K_FAR, pos_j, T_k, freqs, HEAD_DIM)
    v = load_tile(V, pos_j, T_k, dims, HEAD_DIM)
    dk1n = tl.zeros((BLOCK_N, BLOCK_F), tl.float32)      # gradient w.r.t. the near-rotated key (halves)
    dk2n = tl.zeros((BLOCK_N, BLOCK_F), tl.float32)
    dk1f = tl.zeros((BLOCK_N, BLOCK_F), tl.float32)      # ... w.r.t. the far key
    dk2f = tl.zeros((BLOCK_N, BLOCK_F), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    first, near_end, far_start = _query_runs(start_n, T_q, T_k, window, BLOCK_M, BLOCK_N)
    dk1n, dk2n, dk1f, dk2f, dv = _dkdv_run(dk1n, dk2n, dk1f, dk2f, dv, k1n, k2n, k1f, k2f, v, Q_NEAR, Q_FAR, DO, LSE,
                                           DELTA, pos_j, first, near_end, T_q, T_k, window, freqs, dims, HEAD_DIM,
                                           BLOCK_M, True, False)
    dk1n, dk2n, dk1f, dk2f, dv = _dkdv_run(dk1n, dk2n, dk1f, dk2f, dv, k1n, k2n, k1f, k2f, v, Q_NEAR, Q_FAR, DO, LSE,
                                           DELTA, pos_j, near_end, far_start, T_q, T_k, window, freqs, dims,
                                           HEAD_DIM, BLOCK_M, True, True)
    dk1n, dk2n, dk1f, dk2f, dv = _dkdv_run(dk1n, dk2n, dk1f, dk2f, dv, k1n, k2n, k1f, k2f, v, Q_NEAR, Q_FAR, DO, LSE,
                                           DELTA, pos_j, far_start, T_q, T_q, T_k, window, freqs, dims, HEAD_DIM,
                                           BLOCK_M, False, True)
    cos, sin = _rotation(ROT, 0, pos_j, T_k, freqs, HEAD_DIM)    # path NEAR
    dk1n, dk2n = _rotate_halves(dk1n, dk2n, cos, -sin)
    if LEAKY:
        cos, sin = _rotation(ROT, 2, pos_j, T_k, freqs, HEAD_DIM)    # path FAR_K
        dk1f, dk2f = _rotate_halves(dk1f, dk2f, cos, -sin)
    _store_halves(DK, dk1n + dk1f, dk2n + dk2f, pos_j, T_k, freqs, HEAD_DIM)
    store_tile(DV, dv, pos_j, T_k, dims, HEAD_DIM)


# ----------------------------------------------------------------------------------------------------------------
# Triton: launch and autograd
# ----------------------------------------------------------------------------------------------------------------

def _constexprs(head_dim: int, cfg: Launch, leaky: bool) -> dict:
    return dict(HEAD_DIM=head_dim, BLOCK_F=block_d(head_dim // 2), BLOCK_D=block_d(head_dim), **cfg.blocks,
                LEAKY=leaky)


def _meta(head_dim: int, cfg: Launch, leaky: bool) -> dict:
    """The constexprs and launch options of one kernel call."""
    return dict(**_constexprs(head_dim, cfg, leaky), **cfg.options)


class _ReRoPETriton(torch.autograd.Function):
    """The fused kernels. q (B, H, T_q, d) are the last T_q positions of k, v (B, H, T_k, d); all contiguous."""

    @staticmethod
    def forward(ctx, q, k, v, window, leaky_k, train_length, scale, base):
        B, H, T_q, d = q.shape
        T_k = k.shape[2]
        ctx.configs = _launch_configs(d, q.dtype)
        cfg = ctx.configs.fwd
        rot = _rotation_table(T_k, d, window, leaky_k, base, torch.float32, q.device)
        o = new_output(q.shape, q.dtype, q.device)
        lse = new_output((B, H, T_q), torch.float32, q.device)
        ctx.args = (T_q, T_k, window, 0.0 if train_length is None else 1.0 / math.log(train_length), scale)
        ctx.leaky, ctx.train_length = leaky_k is not None, train_length
        rerope_fwd_kernel[(triton.cdiv(T_q, cfg["BLOCK_M"]), B * H)](q, k, v, o, lse, rot, *ctx.args,
                                                                  **_meta(d, cfg, ctx.leaky))
        ctx.save_for_backward(q, k, v, o, lse, rot)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, rot = ctx.saved_tensors
        B, H, T_q, d = q.shape
        T_k, scale = k.shape[2], ctx.args[-1]
        do = do.contiguous()
        delta = (do.float() * o.float()).sum(-1)                 # D_i = sum_c dO_ic O_ic, (B, H, T_q) fp32
        # The rotated operands of both paths, as the forward built them in registers (fp32, then the input dtype).
        q_scaled = _log_n(q.float(), T_k - T_q, ctx.train_length) * scale
        q_near, q_far = (_rotate(q_scaled, *rot[path, :, T_k - T_q:]).to(q.dtype) for path in (NEAR, FAR_Q))
        k_near = _rotate(k.float(), *rot[NEAR]).to(k.dtype)
        k_far = _rotate(k.float(), *rot[FAR_K]).to(k.dtype) if ctx.leaky else k
        dq = new_output(q.shape, q.dtype, q.device)
        dk = new_output(k.shape, k.dtype, k.device)
        dv = new_output(v.shape, v.dtype, v.device)
        operands = (q_near, q_far, k_near, k_far, v, do, lse, delta)
        cfg = ctx.configs.dq
        rerope_bwd_dq_kernel[(triton.cdiv(T_q, cfg["BLOCK_M"]), B * H)](*operands, dq, rot, *ctx.args,
                                                                     **_meta(d, cfg, ctx.leaky))
        cfg = ctx.configs.dkdv
        rerope_bwd_dkdv_kernel[(triton.cdiv(T_k, cfg["BLOCK_N"]), B * H)](*operands, dk, dv, rot, *ctx.args[:3],
                                                                       **_meta(d, cfg, ctx.leaky))
        return dq, dk, dv, None, None, None, None, None


def _rerope_triton(q, k, v, window, leaky_k, scale, train_length, base):
    return _ReRoPETriton.apply(q.contiguous(), k.contiguous(), v.contiguous(), window, leaky_k, train_length, scale,
                               base)


# ----------------------------------------------------------------------------------------------------------------
# torch: rotations and log-n
# ----------------------------------------------------------------------------------------------------------------

class _Rotate(torch.autograd.Function):
    """R x in the rotate-half layout: (x1 cos - x2 sin, x2 cos + x1 sin), written straight into one output (no
    temporaries: this runs on whole (B, H, T, d) tensors). (cos, -sin) gives R^T x, which is also the backward."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _Rotate.apply_to(x, cos, sin)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _Rotate.apply_to(grad, cos, -sin), None, None

    @staticmethod
    def apply_to(x, cos, sin):
        out = torch.empty_like(x)
        (x1, x2), (out1, out2) = x.chunk(2, dim=-1), out.chunk(2, dim=-1)
        torch.mul(x1, cos, out=out1).addcmul_(x2, sin, value=-1)
        torch.mul(x2, cos, out=out2).addcmul_(x1, sin)
        return out


_rotate = _Rotate.apply


def _log_n(x, first_position, train_length):
    """x (..., n, c) with row r multiplied by max(1, ln(p + 1)/ln L), p = first_position + r: log-n scaling of the
    queries (and of their gradient). x itself without train_length."""
    if train_length is None:
        return x
    p = torch.arange(first_position, first_position + x.shape[-2], dtype=torch.float64, device=x.device)
    return x * torch.clamp(torch.log1p(p) / math.log(train_length), min=1.0)[:, None].to(x.dtype)


# ----------------------------------------------------------------------------------------------------------------
# torch: pieces of flash attention with their log-sum-exp
# ----------------------------------------------------------------------------------------------------------------

Piece = namedtuple("Piece", "path kind rows keys")
Piece.__doc__ = """One exact block of ReRoPE's score matrix. ``rows(t)`` and ``keys(t)`` turn a (B, H, T, c) tensor
into the piece's (batch, heads, L, c) views of its query rows and of its key rows; ``path`` is "near" or "far";
``kind`` is "diagonal" or "far" (square, causal) or "previous" (key jj seen by row ii when jj >= ii)."""

MASK_ROWS = 256   # rows per "previous" piece: its mask is (MASK_ROWS, < w), not (w, w)


def _pieces(T, window):
    """The pieces that cover every pair j <= i exactly once (w = window, blocks of w rows, tm = w * (T // w)):

        far:        rows [w, T) against keys [0, T - w), causal: key j <= i - w               (i - j >= w)
        diagonal:   each full block against itself, and the tail [tm, T) against itself; causal   (i - j < w)
        previous:   rows r of each block b >= 1 (and of the tail) against keys r + 1 .. w - 1 of block b - 1,
                    which they see when i - j < w: key jj >= row ii, counted from row r0 and key r0 + 1
    Every piece is an ordinary attention and no (T, T) mask exists; the "previous" rows go in chunks of MASK_ROWS
    so that their masks stay small. The diagonal pieces hold every row exactly once and come first, so that they
    can initialize the output.
    """
    nb, tail = divmod(T, window)
    tm = nb * window

    def blocks(t):   # (B, H, T, c) -> (B*H, nb, w, c), a view
        return t[:, :, :tm].reshape(t.shape[0] * t.shape[1], nb, window, t.shape[-1])

    pieces = []
    if nb:
        pieces.append(Piece("near", "diagonal", blocks, blocks))
    if tail:
        pieces.append(Piece("near", "diagonal", lambda t: t[:, :, tm:], lambda t: t[:, :, tm:]))
    for r0 in range(0, window - 1, MASK_ROWS):
        r1 = min(r0 + MASK_ROWS, window - 1)
        if nb > 1:
            pieces.append(Piece("near", "previous", lambda t, r0=r0, r1=r1: blocks(t)[:, 1:, r0:r1],
                                lambda t, r0=r0: blocks(t)[:, :-1, r0 + 1:]))
        if nb and tail > r0:
            pieces.append(Piece("near", "previous", lambda t, r0=r0, r1=r1: t[:, :, tm + r0:min(tm + r1, T)],
                                lambda t, r0=r0: t[:, :, tm - window + r0 + 1:tm]))
    if T > window:
        pieces.append(Piece("far", "far", lambda t: t[:, :, window:], lambda t: t[:, :, :T - window]))
    return pieces


def _previous_block_mask(rows, keys, dtype, device):
    """Additive (rows, keys) mask of a "previous" piece: 0 where key jj >= row ii (within the window), else -inf."""
    return torch.full((rows, keys), float("-inf"), dtype=dtype, device=device).tril(-1)


def _piece_args(piece, qx, kx, v):
    """(q, k, v, causal, mask) of one piece, views into the path's rotated queries and keys."""
    q_rows, k_rows = piece.rows(qx), piece.keys(kx)
    mask = None
    if piece.kind == "previous":
        mask = _previous_block_mask(q_rows.shape[-2], k_rows.shape[-2], qx.dtype, qx.device)
    return q_rows, k_rows, piece.keys(v), piece.kind != "previous", mask


def _flash_with_lse(q, k, v, causal, mask, scale):
    """(O, LSE) of softmax(q k^T * scale + mask) v; q, k, v (B, H, L, d) views. CPU: aten's flash kernel."""
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=mask,
                                                                          scale=scale)
    return _chunked_with_lse(q, k, v, causal, mask, scale)


def _flash_backward(do, q, k, v, o, lse, causal, mask, scale):
    """(dq, dk, dv) of one piece, given the merged output o and log-sum-exp lse of its rows (so that
    P = e^{S - lse} and D = rowsum(do * o) are those of the whole softmax, not of the piece)."""
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            do, q, k, v, o, lse, 0.0, causal, attn_mask=mask, scale=scale)
    return _chunked_backward(do, q, k, v, o, lse, causal, mask, scale)


QUERY_CHUNK = 256   # rows per step of the chunked pieces: (QUERY_CHUNK, L) scores at a time


def _chunk_scores(q, k, start, causal, mask, scale):
    s = q @ k.transpose(-1, -2) * scale                                       # (B, H, c, L)
    if mask is not None:
        s = s + mask[start:start + q.shape[-2]]
    if causal:
        rows = torch.arange(start, start + q.shape[-2], device=q.device)[:, None]
        s = s.masked_fill(torch.arange(k.shape[-2], device=q.device)[None, :] > rows, float("-inf"))
    return s


def _chunked_with_lse(q, k, v, causal, mask, scale):
    """The same as the flash kernel, in chunks of query rows with plain torch ops (any device)."""
    o = torch.empty(q.shape[:-1] + v.shape[-1:], dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=q.dtype, device=q.device)
    for start in range(0, q.shape[-2], QUERY_CHUNK):
        s = _chunk_scores(q[..., start:start + QUERY_CHUNK, :], k, start, causal, mask, scale)
        lse[..., start:start + QUERY_CHUNK] = torch.logsumexp(s, -1)
        o[..., start:start + QUERY_CHUNK, :] = torch.softmax(s, -1) @ v
    return o, lse


def _chunked_backward(do, q, k, v, o, lse, causal, mask, scale):
    dq = torch.empty_like(q)
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    for start in range(0, q.shape[-2], QUERY_CHUNK):
        rows = slice(start, start + QUERY_CHUNK)
        s = _chunk_scores(q[..., rows, :], k, start, causal, mask, scale)
        p = torch.exp(s - lse[..., rows, None])
        dv += p.transpose(-1, -2) @ do[..., rows, :]
        ds = p * (do[..., rows, :] @ v.transpose(-1, -2) - (do[..., rows, :] * o[..., rows, :]).sum(-1, True))
        dq[..., rows, :] = ds @ k * scale
        dk += ds.transpose(-1, -2) @ q[..., rows, :] * scale
    return dq, dk, dv


# ----------------------------------------------------------------------------------------------------------------
# torch: prefill
# ----------------------------------------------------------------------------------------------------------------

class _ReRoPETorch(torch.autograd.Function):
    """The piecewise prefill; q, k, v (B, H, T, d). Works in float64 for float64 inputs, else fp32."""

    @staticmethod
    def _path_inputs(path, q, k, rot, train_length):
        """(rotated queries, rotated keys, (query rotation, key rotation or None)) of one path. The log-n factor
        sigma_i rides on the query's rotation (sigma R is still linear, and its transpose is sigma R^T)."""
        if path == "near":
            q_rot, k_rot = rot[NEAR], rot[NEAR]
        else:
            q_rot, k_rot = rot[FAR_Q], (rot[FAR_K] if len(rot) > FAR_K else None)
        q_rot = _log_n(q_rot, 0, train_length)
        return _rotate(q, *q_rot), (k if k_rot is None else _rotate(k, *k_rot)), (q_rot, k_rot)

    @staticmethod
    def forward(ctx, q, k, v, window, leaky_k, scale, train_length, base):
        compute = accumulation_dtype(q.dtype)
        q, k, v = (x.to(compute) for x in (q, k, v))
        B, H, T, d = q.shape
        rot = _rotation_table(T, d, window, leaky_k, base, compute, q.device)
        out = torch.empty((B, H, T, d), dtype=compute, device=q.device)
        lse = torch.empty((B, H, T, 1), dtype=compute, device=q.device)    # (..., 1): takes the same views as out
        pieces = _pieces(T, window)
        for path in ("near", "far"):
            qx, kx, _ = _ReRoPETorch._path_inputs(path, q, k, rot, train_length)
            for piece in (p for p in pieces if p.path == path):
                o_p, lse_p = _flash_with_lse(*_piece_args(piece, qx, kx, v), scale)
                out_rows, lse_rows = piece.rows(out), piece.rows(lse)[..., 0]
                if piece.kind == "diagonal":      # the first piece of each of its rows
                    out_rows.copy_(o_p)
                    lse_rows.copy_(lse_p)
                else:   # exact merge: LSE' = log(e^LSE + e^LSE_p), O' = O + e^{LSE_p - LSE'} (O_p - O)
                    merged = torch.logaddexp(lse_rows, lse_p)
                    out_rows.lerp_(o_p, torch.exp(lse_p - merged)[..., None])
                    lse_rows.copy_(merged)
            del qx, kx
        ctx.save_for_backward(q, k, v, out, lse, rot)
        ctx.args = (window, scale, train_length)
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse, rot = ctx.saved_tensors
        window, scale, train_length = ctx.args
        do = do.to(q.dtype).contiguous()
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        pieces = _pieces(q.shape[2], window)
        for path in ("near", "far"):
            qx, kx, (q_rot, k_rot) = _ReRoPETorch._path_inputs(path, q, k, rot, train_length)
            dqx, dkx = torch.zeros_like(qx), torch.zeros_like(kx)
            for piece in (p for p in pieces if p.path == path):
                q_p, k_p, v_p, causal, mask = _piece_args(piece, qx, kx, v)
                # With the merged out and lse, P = e^{S - LSE} and D = rowsum(dO * O) are the whole softmax's.
                gq, gk, gv = _flash_backward(piece.rows(do), q_p, k_p, v_p, piece.rows(out), piece.rows(lse)[..., 0],
                                             causal, mask, scale)
                piece.rows(dqx).add_(gq)
                piece.keys(dkx).add_(gk)
                piece.keys(dv).add_(gv)
            # Rotations are orthogonal: the gradient w.r.t. x of R x is R^T g = R(-angle) g.
            dq += _rotate(dqx, q_rot[0], -q_rot[1])
            dk += dkx if k_rot is None else _rotate(dkx, k_rot[0], -k_rot[1])
        return dq, dk, dv, None, None, None, None, None


def _rerope_torch(q, k, v, window, leaky_k, scale, train_length, base):
    return _ReRoPETorch.apply(q, k, v, window, leaky_k, scale, train_length, base).to(q.dtype)


# ----------------------------------------------------------------------------------------------------------------
# torch: decode
# ----------------------------------------------------------------------------------------------------------------

def _rerope_decode_torch(q, k_cache, v_cache, window, leaky_k, scale, train_length, base):
    """score_j = (q sigma) . R(-rel(T-1-j)) k_j * scale over the cache, DECODE_CHUNK keys rotated at a time."""
    dtype, compute = q.dtype, accumulation_dtype(q.dtype)
    T, d = k_cache.shape[2], q.shape[-1]
    q = _log_n(q.to(compute), T - 1, train_length)                              # (B, H, 1, d), at position T - 1
    scores = []
    for start in range(0, T, DECODE_CHUNK):
        dist = (T - 1) - torch.arange(start, min(start + DECODE_CHUNK, T), dtype=torch.float64, device=q.device)
        rel = (dist.clamp(max=window) if leaky_k is None
               else torch.where(dist < window, dist, window + (dist - window) / leaky_k))
        k_rot = _rotate(k_cache[:, :, start:start + DECODE_CHUNK].to(compute), *_cos_sin(-rel, d, base, compute))
        scores.append(q @ k_rot.transpose(-1, -2))                             # (B, H, 1, chunk)
    p = torch.softmax(torch.cat(scores, -1) * scale, -1)                        # (B, H, 1, T)
    out = sum(p[..., start:start + DECODE_CHUNK] @ v_cache[:, :, start:start + DECODE_CHUNK].to(compute)
              for start in range(0, T, DECODE_CHUNK))
    return out.to(dtype)


# ----------------------------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------------------------

def _check_options(window, leaky_k, scale, train_length, base, d):
    if isinstance(window, bool) or not isinstance(window, numbers.Integral):
        raise TypeError(f"window must be an int, got {type(window).__name__}")
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if leaky_k is not None and not (isinstance(leaky_k, numbers.Real) and 1 < leaky_k < math.inf):
        raise ValueError(f"leaky_k must be a finite number > 1 (None for ReRoPE), got {leaky_k!r}")
    if train_length is not None and not (isinstance(train_length, numbers.Real) and 2 <= train_length < math.inf):
        raise ValueError(f"train_length must be a finite number >= 2 (None: no log-n scaling), got {train_length!r}")
    if not (isinstance(base, numbers.Real) and 0 < base < math.inf):
        raise ValueError(f"base must be a finite number > 0, got {base!r}")
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if not (isinstance(scale, numbers.Real) and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number or None, got {scale!r}")
    return float(scale)


def _check_qkv(q, k, v, backend, what_q):
    """Shared checks: dtype, device, backend, an even head dim; returns the backend."""
    dtype = check_same_dtype(q=q, k=k, v=v)
    backend = resolve_backend(backend, check_devices(q=q, k=k, v=v))
    check_backend_dtype(backend, dtype)
    d = q.shape[-1]
    if d % 2:
        raise ValueError(f"RoPE needs an even head dim, got {what_q} with d = {d}")
    if backend == "triton":
        check_triton_head_dim(d)
    return backend


def rerope_attention(q, k, v, window, leaky_k=None, scale=None, train_length=None, backend=None, base=10000.0):
    """ReRoPE (leaky_k=None) or Leaky ReRoPE causal attention, memory O(T).

        score_ij = (q_i sigma_i) . R(-rel(i - j)) k_j * scale,  rel(x) = min(x, w) or (x < w ? x : w + (x - w)/k)
        sigma_i = max(1, ln(i + 1)/ln(train_length)) with train_length, else 1;  O = softmax(score) v
    q, k, v: (B, H, T, d) before any rotation, d even -> (B, H, T, d) in the input dtype. scale: 1/sqrt(d) unless
    given. window: int w >= 1. leaky_k: None or > 1. base: RoPE's base (inv_freq = base^(-2f/d)).
    backend "torch": exact flash-attention pieces merged by log-sum-exp; "triton": one fused kernel (16 <= d <= 128).
    Both differentiable. Same meaning as reference.rope.rerope_attention. Source: https://spaces.ac.cn/archives/9708.
    """
    check_tensor("q", q, (None, None, None, None))
    B, H, T, d = q.shape
    check_tensor("k", k, (B, H, T, d))
    check_tensor("v", v, (B, H, T, d))
    backend = _check_qkv(q, k, v, backend, f"q {tuple(q.shape)}")
    if T < 1:
        raise ValueError(f"q must hold at least one position, got shape {tuple(q.shape)}")
    scale = _check_options(window, leaky_k, scale, train_length, base, d)
    run = _rerope_torch if backend == "torch" else _rerope_triton
    return run(q, k, v, int(window), leaky_k, scale, train_length, base)


def rerope_decode(q, k_cache, v_cache, window, leaky_k=None, scale=None, train_length=None, backend=None,
                  base=10000.0):
    """One query at position T - 1 against a cache of T keys stored before RoPE, each rotated on the fly:

        score_j = (q sigma) . R(-rel(T - 1 - j)) k_j * scale,   O = softmax(score) v
    q: (B, H, 1, d); k_cache, v_cache: (B, H, T, d), T >= 1 (the cache includes the query's own key) ->
    (B, H, 1, d). Equals the last row of rerope_attention over the same T positions. Other arguments as there.
    backend "torch": the cache rotated DECODE_CHUNK keys at a time, no rotated copy of the whole cache; "triton":
    the fused kernel with one query row, keys rotated in registers. Source: https://spaces.ac.cn/archives/9708.
    """
    check_tensor("q", q, (None, None, 1, None))
    B, H, _, d = q.shape
    check_tensor("k_cache", k_cache, (B, H, None, d))
    T = k_cache.shape[2]
    check_tensor("v_cache", v_cache, (B, H, T, d))
    backend = _check_qkv(q, k_cache, v_cache, backend, f"q {tuple(q.shape)}")
    if T < 1:
        raise ValueError(f"k_cache must hold at least the query's own key (T >= 1), got shape {tuple(k_cache.shape)}")
    scale = _check_options(window, leaky_k, scale, train_length, base, d)
    run = _rerope_decode_torch if backend == "torch" else _rerope_triton
    return run(q, k_cache, v_cache, int(window), leaky_k, scale, train_length, base)


# ----------------------------------------------------------------------------------------------------------------
# Ahead-of-time build (python -m seqmix.kernels.aot)
# ----------------------------------------------------------------------------------------------------------------

def aot_kernels():
    from seqmix.kernels.aot import AOT_DTYPES, FLASH_ARG_TYPES, AotKernel
    kernels = []
    for d in (64, 128):
        for dtype, torch_dtype in AOT_DTYPES.items():
            configs = _launch_configs(d, torch_dtype)
            for leaky in (False, True):
                for fn, cfg in ((rerope_fwd_kernel, configs.fwd), (rerope_bwd_dq_kernel, configs.dq),
                                (rerope_bwd_dkdv_kernel, configs.dkdv)):
                    constexprs = _constexprs(d, cfg, leaky)
                    label = f"{fn.__name__.removesuffix('_kernel')} d={d} {dtype}{' leaky' if leaky else ''}"
                    kernels.append(AotKernel(label, fn, constexprs, FLASH_ARG_TYPES, "*" + dtype, cfg.num_warps,
                                             cfg.num_stages))
    return kernels
