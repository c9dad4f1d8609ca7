"""The backward of ``wkv7(..., backend="triton_chunked")``: it mirrors the forward of kernels/wkv7/triton_chunked.py
(whose docstring has the glossary and the column split), reading only the fp32 state the forward stored at each
group's entry. Private: kernels/wkv7/__init__.py dispatches here.

Given dY (L, N_v) and G = dL/dS_L (N_v, N_k) of a sub-chunk, reverse-mode through the forward's lines (checked in
float64 against autograd of the step-by-step recurrence; the tests check the kernels against it), with
Z = a~ S_0^T + A_ak V and U = T_inv Z (rows u_i = S_{i-1} a_i):

    dU = Q_rb^T dY + B^ G^T,   dZ = T_inv^T dU,   dV = Q_rk^T dY + K^ G^T + A_ak^T dZ
    dA_ab = tril_{j<i}(dZ U^T)   (from d(M^{-1}) = -M^{-1} dM M^{-1}: T_inv^T dU Z^T T_inv^T = dZ U^T)
    dA_ak = tril_{j<i}(dZ V^T),   dQ_rb = tril_{j<=i}(dY U^T),   dQ_rk = tril_{j<=i}(dY V^T)
    dS_0 = G P^T + dY^T R = G diag(d) + (B^ G^T)^T W + dY^T (r~ + Q_rb W)

and into the inputs (the couplings' parts through the centred factors, m = c_L / 2):

    da_i = e^{c_{i-1}} (dZ S_0)_i + e^{c_{i-1} - m} (dA_ab b e^{m-c} + dA_ak k e^{m-c})_i
    dr_i = e^{c_i} (dY S_0)_i + e^{c_i - m} (dQ_rb b e^{m-c} + dQ_rk k e^{m-c})_i
    db_j = e^{m-c_j} (dA_ab^T a~ e^{-m} + dQ_rb^T r~ e^{-m})_j + e^{c_L - c_j} (U G)_j        (coupling + end part)
    dk_j = e^{m-c_j} (dA_ak^T a~ e^{-m} + dQ_rk^T r~ e^{-m})_j + e^{c_L - c_j} (V G)_j

Every exponential meets its input as x e^{+-c}, so the log decays' gradient needs only products with the raw inputs:
log_w_t enters c_i for i >= t (within its sub-chunk; the next sees it through d), c_{i-1} of a~_i for i > t, and
-c_j of B^, K^ for j >= t, whose c_L cancels it: their share is the sum over j < t. With dd = colsum(G * S_0):

    dlog_w_t = sum_{i>=t} (dr r - db_cpl b - dk_cpl k)_i + sum_{i>t} (da a)_i + sum_{j<t} (db_end b + dk_end k)_j
               + dd d

Over a group, G enters the last sub-chunk as dL/dS at the group's end and leaves each as its dS_0 (G P_s^T + dY_s^T
R_s); composed, dL/dS_G = G_end P_G^T + F_G with F_G = ((dY_4^T R_4) P_3^T + dY_3^T R_3) P_2^T ... The groups are
the forward's (group_size: GROUP sub-chunks for fp16/bf16 inputs, one for fp32). Kernels:

- wkv7_chunked_bwd_prep_kernel, grid (groups x B H, 2 N / COLUMNS): the lines of [P_G^T; F_G], walking the group's
  sub-chunks from the last, X <- X P_s^T + dY_s[:, lines]^T R_s, with X P_s^T = X diag(d) + (X B^^T) W (the
  forward's low-rank trick, transposed; P lines start at e_i without input, F lines at 0);
- wkv7_chunked_scan_kernel (the forward's), reversed: G <- G P_G^T + F_G from dL/dS_T, one product per group,
  storing dL/dS at each group's end; its last G is dS_0;
- with groups of several sub-chunks, wkv7_chunked_states_kernel and wkv7_chunked_dstates_kernel, grid
  (groups x B H, N / COLUMNS): the state entering every sub-chunk, walked forward from the stored group state on
  COLUMNS value rows (the forward prep's walk on its E lines, from S_G instead of 0), and dL/dS at every sub-chunk's
  end, walked back from the scan's (the prep's walk on value rows), into two scratch buffers (B H, sub-chunks, N, N).
  With groups of one the forward's group states and the scan's are these, and neither kernel runs;
- wkv7_chunked_bwd_kernel, grid (sub-chunks x B H): each sub-chunk's gradients from its S_0 and G, no chain between
  programs. Every tile is (16, 16): the couplings summed over blocks of 16 keys, then passes over blocks of 16 value
  rows, each with a loop over the key blocks inside: U = T_inv (a~ S_0^T + A_ak V); dZ and dv; the sums over value
  rows of dY S_0, colsum(G * S_0), V G, dZ S_0 and U G, kept as running sums in the rows of the five gradients'
  own buffer (no partial-sum buffer, no reduce; every thread loads a tile before any stores it: a barrier); dA and
  dQ (16, 16) in registers; then one loop over the key blocks per key-vector gradient, turning its running sum into
  it in place, dlog_w gathering its four shares. U, dZ and B^ G^T go from one pass to the next through three scratch
  slots of that buffer. No pass keeps more than a few tiles live: the first form of this kernel, one program per
  group with all value rows and (16, N) tiles, needed a 0.6-1.1 KB stack in fp32 at N = 64, and a walk over the
  group's sub-chunks inside the program made the compiler keep every loop-invariant tile live across it (0.5 KB).

A sub-chunk out of range or not finite (the forward's rule, v and dy counted among its inputs) takes its steps one
at a time: G <- (G + dy r^T) diag(w) + (G + dy r^T) b a^T, and the gradients follow wkv7_bwd_kernel's step, each
step's entering state re-run from S_0 on a block of 16 value rows (L (L - 1) / 2 steps: such sub-chunks are rare),
each step's shares added to the running sums.

AOT builds (triton 3.9, N = 64, 4 warps, registers / spill / stack bytes; tests/kernels/test_aot_wkv7_chunked.py):
the gradient kernel fp32 228 / 0 / 0 (sm_80), 225 / 0 / 0 (sm_90), bf16 and fp16 168 / 0 / 0; the prep fp32
214 / 0 / 0 and 231 / 0 / 0, bf16 and fp16 159-168 / 0 / 0; the state and dL/dS walks (bf16, fp16) 161-207 / 0 / 0;
the scan 96-130 / 0 / 0. Nothing here is timed on a GPU yet.
"""
from __future__ import annotations

import torch

from .._common import new_output, tl, triton
from ._triton_common import _checkpoint, _head_offsets, _step
from .triton_chunked import (CHUNK, _centred, _chunk_keys, _dot, _factored, _fdot, _group_map, _hats, _lines,
                             _load_chunk, _lower, _grouping, _parallel_launch_config, _precision, _program_group, _scan,
                             _store_chunk, _subchunk_lines, _total, _unit_lower_inverse, _vector, _wy)

__all__ = []   # private: the op is kernels/wkv7's wkv7 (backend="triton_chunked")


@triton.jit
def wkv7_chunked_states_kernel(
    r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr,  # (B, T, H, N) inputs of the forward, contiguous
    states_ptr,          # (B * H, n_groups, N, N) fp32: the state entering each group (the forward's)
    sub_ptr,             # (B * H, n_groups * GROUP, N, N) fp32 out: the state entering each sub-chunk
    T, H,                # sequence length, heads
    N: tl.constexpr,           # head size
    COLUMNS: tl.constexpr,     # value rows per program (the grid's second axis: N / COLUMNS)
    CHUNK: tl.constexpr,       # steps per sub-chunk
    GROUP: tl.constexpr,       # sub-chunks per group
    MAX_SPREAD: tl.constexpr,  # the widest spread of c that a sub-chunk takes in the factored form
    PRECISION: tl.constexpr,   # "tf32x3" or "tf32"
):
    """One (group, head, block of COLUMNS value rows) per program: S <- S P_s + E_s[rows] from S_G, storing S before
    each sub-chunk."""
    DT: tl.constexpr = r_ptr.dtype.element_ty
    pid_bh, g, n_groups = _program_group(T, CHUNK, GROUP)
    _, seq, stride_t = _head_offsets(pid_bh, T, H, N)
    keys = tl.arange(0, N)
    values = tl.program_id(1) * COLUMNS + tl.arange(0, COLUMNS)
    tile = values[:, None] * N + keys[None, :]
    X = tl.load(_checkpoint(states_ptr, pid_bh, n_groups, g, N) + tile)
    for s in range(GROUP):
        tl.store(_checkpoint(sub_ptr, pid_bh, n_groups * GROUP, g * GROUP + s, N) + tile, X)
        X = _subchunk_lines(X, r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr, seq, (g * GROUP + s) * CHUNK, T,
                            stride_t, keys, values, MAX_SPREAD, DT, PRECISION, CHUNK)[0]


@triton.jit
def _lines_back_stepwise(X, log_w_ptr, r_ptr, a_ptr, b_ptr, dy_ptr, seq, t0, T, stride_t, keys, values,
                         CHUNK: tl.constexpr):
    """One sub-chunk's steps from the last on lines X: X <- (X + dy[values] r^T) (diag(w) + b a^T) (values < 0 on
    P lines: no dy)."""
    for jj in range(CHUNK):
        t = t0 + CHUNK - 1 - jj
        off = seq + t * stride_t
        X += _vector(dy_ptr, off, values, t, T)[:, None] * _vector(r_ptr, off, keys, t, T)[None, :]
        xb = tl.sum(X * _vector(b_ptr, off, keys, t, T)[None, :], axis=1)
        X = X * tl.exp(_vector(log_w_ptr, off, keys, t, T))[None, :] + xb[:, None] * _vector(a_ptr, off, keys, t,
                                                                                              T)[None, :]
    return X


@triton.jit
def _lines_back(X, r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, dy_ptr, seq, t0, T, stride_t, keys, values,
                MAX_SPREAD: tl.constexpr, DT: tl.constexpr, PRECISION: tl.constexpr, CHUNK: tl.constexpr):
    """The sub-chunk at t0 backwards on lines X: X P^T + dY[:, values]^T R, factored or step by step."""
    r_t, a_t, b_hat, k_hat, d, e_m, spread_ok, total = _hats(r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, seq, t0, T,
                                                              stride_t, keys, MAX_SPREAD, CHUNK)
    dy = _load_chunk(dy_ptr, seq, t0, T, stride_t, values, CHUNK)             # 0 on P lines (values < 0)
    if _factored(spread_ok, total + _total(dy)):
        _, Q_rb, _, _, W = _wy(r_t, a_t, b_hat, k_hat, e_m, DT, PRECISION, CHUNK)
        # X P^T + dY^T R = X diag(d) + (X B^^T) W + dY^T (r~ + Q_rb W)
        X = (X * d + _fdot(_fdot(X, tl.trans(b_hat), PRECISION), W, PRECISION)
             + _fdot(tl.trans(dy), r_t + _fdot(Q_rb, W, PRECISION), PRECISION))
    else:
        X = _lines_back_stepwise(X, log_w_ptr, r_ptr, a_ptr, b_ptr, dy_ptr, seq, t0, T, stride_t, keys, values, CHUNK)
    return X


@triton.jit
def wkv7_chunked_dstates_kernel(
    r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr,  # (B, T, H, N) inputs of the forward, contiguous (v is not needed)
    dy_ptr,              # (B, T, H, N) gradient of y, contiguous, the input dtype
    dstates_ptr,         # (B * H, n_groups, N, N) fp32: dL/dS at each group's end (the reversed scan's)
    dsub_ptr,            # (B * H, n_groups * GROUP, N, N) fp32 out: dL/dS at each sub-chunk's end
    T, H,                # sequence length, heads
    N: tl.constexpr,           # head size
    COLUMNS: tl.constexpr,     # value rows per program (the grid's second axis: N / COLUMNS)
    CHUNK: tl.constexpr,       # steps per sub-chunk
    GROUP: tl.constexpr,       # sub-chunks per group
    MAX_SPREAD: tl.constexpr,  # the widest spread of c that a sub-chunk takes in the factored form
    PRECISION: tl.constexpr,   # "tf32x3" or "tf32"
):
    """One (group, head, block of COLUMNS value rows) per program, wkv7_chunked_states_kernel's mirror: from dL/dS
    at the group's end, G <- G P_s^T + dY_s[:, rows]^T R_s over its sub-chunks from the last (_lines_back), storing G
    at each sub-chunk's end."""
    DT: tl.constexpr = r_ptr.dtype.element_ty
    pid_bh, g, n_groups = _program_group(T, CHUNK, GROUP)
    _, seq, stride_t = _head_offsets(pid_bh, T, H, N)
    keys = tl.arange(0, N)
    values = tl.program_id(1) * COLUMNS + tl.arange(0, COLUMNS)
    tile = values[:, None] * N + keys[None, :]
    X = tl.load(_checkpoint(dstates_ptr, pid_bh, n_groups, g, N) + tile)
    for back in range(GROUP - 1):
        s = g * GROUP + GROUP - 1 - back
        tl.store(_checkpoint(dsub_ptr, pid_bh, n_groups * GROUP, s, N) + tile, X)
        X = _lines_back(X, r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, dy_ptr, seq, s * CHUNK, T, stride_t, keys, values,
                        MAX_SPREAD, DT, PRECISION, CHUNK)
    tl.store(_checkpoint(dsub_ptr, pid_bh, n_groups * GROUP, g * GROUP, N) + tile, X)


@triton.jit
def wkv7_chunked_bwd_prep_kernel(
    r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr,  # (B, T, H, N) inputs of the forward, contiguous (v is not needed)
    dy_ptr,              # (B, T, H, N) gradient of y, contiguous, the input dtype
    maps_ptr,            # (B * H, n_groups, 2 N, N) fp32 out: each group's [P_G^T; F_G]
    T, H,                # sequence length, heads
    N: tl.constexpr,           # head size
    COLUMNS: tl.constexpr,     # lines per program (the grid's second axis: 2 N / COLUMNS)
    CHUNK: tl.constexpr,       # steps per sub-chunk
    GROUP: tl.constexpr,       # sub-chunks per group
    MAX_SPREAD: tl.constexpr,  # the widest spread of c that a sub-chunk takes in the factored form
    PRECISION: tl.constexpr,   # "tf32x3" or "tf32"
):
    """One (group, head, block of COLUMNS lines) per program: the lines walk the group's sub-chunks from the last,
    X <- X P_s^T + dY_s[:, lines]^T R_s from e_i (P^T lines) or 0 (F lines)."""
    DT: tl.constexpr = r_ptr.dtype.element_ty
    pid_bh, g, n_groups = _program_group(T, CHUNK, GROUP)
    _, seq, stride_t = _head_offsets(pid_bh, T, H, N)
    keys = tl.arange(0, N)
    lines, values = _lines(N, COLUMNS)
    X = (lines[:, None] == keys[None, :]).to(tl.float32)
    for back in range(GROUP):
        X = _lines_back(X, r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, dy_ptr, seq, (g * GROUP + GROUP - 1 - back) * CHUNK,
                        T, stride_t, keys, values, MAX_SPREAD, DT, PRECISION, CHUNK)
    tl.store(_group_map(maps_ptr, pid_bh, n_groups, g, N) + lines[:, None] * N + keys[None, :], X)


@triton.jit
def _spread(c_hi, c_lo, total, c, x):
    """Running max(c, 0), min(c, 0) and a sum that is finite only while every input is (inf - inf = NaN): x's and
    c's, which sums log_w (the sum is the NaN test: tl.max and tl.min drop NaN; triton_chunked's _factored)."""
    c_hi = tl.maximum(c_hi, tl.max(tl.max(c, axis=1), axis=0))
    c_lo = tl.minimum(c_lo, tl.min(tl.min(c, axis=1), axis=0))
    return c_hi, c_lo, total + _total(x + c)


@triton.jit
def _couplings(r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr, dy_ptr, dkeys_ptr, numel, seq, t0, T, stride_t,
               N: tl.constexpr, MAX_SPREAD: tl.constexpr, CHUNK: tl.constexpr, DT: tl.constexpr,
               PRECISION: tl.constexpr):
    """The gradient kernel's first loop over blocks of CHUNK keys (and as many value columns): the couplings A_ab,
    A_ak, Q_rb, Q_rk (CHUNK, CHUNK, before their triangles), summed block by block from the centred factors; whether
    the sub-chunk takes the factored form (its spread of c, and every input and dy finite); and the sub-chunk's rows
    of the five key-vector slots zeroed, for the running sums."""
    A_ab = tl.zeros((CHUNK, CHUNK), dtype=tl.float32)
    A_ak = tl.zeros((CHUNK, CHUNK), dtype=tl.float32)
    Q_rb = tl.zeros((CHUNK, CHUNK), dtype=tl.float32)
    Q_rk = tl.zeros((CHUNK, CHUNK), dtype=tl.float32)
    zero = tl.zeros((CHUNK, CHUNK), dtype=tl.float32)
    c_hi = 0.0
    c_lo = 0.0
    total = 0.0
    for k0 in range(0, N, CHUNK):
        keys = k0 + tl.arange(0, CHUNK)
        r, k, a, b, c, c_prev, c_end = _chunk_keys(r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, seq, t0, T, stride_t, keys,
                                                   CHUNK)
        x = (r + k + a + b + _load_chunk(v_ptr, seq, t0, T, stride_t, keys, CHUNK)
             + _load_chunk(dy_ptr, seq, t0, T, stride_t, keys, CHUNK))         # keys as value columns here
        c_hi, c_lo, total = _spread(c_hi, c_lo, total, c, x)
        a_c, r_c, b_c, k_c = _centred(r, k, a, b, c, c_prev, c_end)
        A_ab += _dot(a_c, b_c, DT, PRECISION)
        A_ak += _dot(a_c, k_c, DT, PRECISION)
        Q_rb += _dot(r_c, b_c, DT, PRECISION)
        Q_rk += _dot(r_c, k_c, DT, PRECISION)
        _store_keys(dkeys_ptr, numel, zero, zero, zero, zero, zero, seq, t0, T, stride_t, keys, CHUNK)
    return A_ab, A_ak, Q_rb, Q_rk, (c_hi - c_lo <= MAX_SPREAD) & (total - total == 0.0)


@triton.jit
def _add_to_slots(dkeys_ptr, numel, dr, dlog_w, dk, da, db, seq, t0, T, stride_t, keys, CHUNK: tl.constexpr):
    """Adds (CHUNK, len(keys)) shares to the sub-chunk's running sums in the five key-vector slots. Every thread loads
    before any stores (the barrier): a tile's load and store need not give a thread the same elements."""
    dr += _load_chunk(dkeys_ptr, seq, t0, T, stride_t, keys, CHUNK)
    dlog_w += _load_chunk(dkeys_ptr + numel, seq, t0, T, stride_t, keys, CHUNK)
    dk += _load_chunk(dkeys_ptr + 2 * numel, seq, t0, T, stride_t, keys, CHUNK)
    da += _load_chunk(dkeys_ptr + 3 * numel, seq, t0, T, stride_t, keys, CHUNK)
    db += _load_chunk(dkeys_ptr + 4 * numel, seq, t0, T, stride_t, keys, CHUNK)
    tl.debug_barrier()
    _store_keys(dkeys_ptr, numel, dr, dlog_w, dk, da, db, seq, t0, T, stride_t, keys, CHUNK)


@triton.jit
def _store_keys(dkeys_ptr, numel, dr, dlog_w, dk, da, db, seq, t0, T, stride_t, keys, CHUNK: tl.constexpr):
    """Stores a sub-chunk's five key-vector tiles (CHUNK, len(keys)) into the (5, B, T, H, N) buffer."""
    _store_chunk(dkeys_ptr, dr, seq, t0, T, stride_t, keys, CHUNK)
    _store_chunk(dkeys_ptr + numel, dlog_w, seq, t0, T, stride_t, keys, CHUNK)
    _store_chunk(dkeys_ptr + 2 * numel, dk, seq, t0, T, stride_t, keys, CHUNK)
    _store_chunk(dkeys_ptr + 3 * numel, da, seq, t0, T, stride_t, keys, CHUNK)
    _store_chunk(dkeys_ptr + 4 * numel, db, seq, t0, T, stride_t, keys, CHUNK)


@triton.jit
def _solve_u(T_inv, A_ak, log_w_ptr, v_ptr, a_ptr, S_ptr, dkeys_ptr, numel, seq, t0, T, stride_t, values,
             N: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """One block of value rows: a~ S_0^T (CHUNK steps, CHUNK rows) summed over blocks of CHUNK keys, then
    U = T_inv (a~ S_0^T + A_ak V), stored in the scratch slot 5."""
    aS = tl.zeros((CHUNK, CHUNK), dtype=tl.float32)
    for k0 in range(0, N, CHUNK):
        keys = k0 + tl.arange(0, CHUNK)
        log_w = _load_chunk(log_w_ptr, seq, t0, T, stride_t, keys, CHUNK)
        a_t = _load_chunk(a_ptr, seq, t0, T, stride_t, keys, CHUNK) * tl.exp(tl.cumsum(log_w, axis=0) - log_w)
        aS += _fdot(a_t, tl.trans(tl.load(S_ptr + values[:, None] * N + keys[None, :])), PRECISION)
    U = _fdot(T_inv, aS + _fdot(A_ak, _load_chunk(v_ptr, seq, t0, T, stride_t, values, CHUNK), PRECISION), PRECISION)
    _store_chunk(dkeys_ptr + 5 * numel, U, seq, t0, T, stride_t, values, CHUNK)


@triton.jit
def _solve_dz(T_inv, A_ak, Q_rb, Q_rk, log_w_ptr, k_ptr, b_ptr, dy_ptr, G_ptr, dkeys_ptr, dv_ptr, numel, seq, t0, T,
              stride_t, values, N: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """One block of value rows: B^ G^T and K^ G^T (CHUNK steps, CHUNK rows) summed over blocks of CHUNK keys, then
    dZ = T_inv^T (Q_rb^T dY + B^ G^T) and dv = Q_rk^T dY + K^ G^T + A_ak^T dZ (stored); dZ and B^ G^T go to the
    scratch slots 6 and 7."""
    BG = tl.zeros((CHUNK, CHUNK), dtype=tl.float32)
    KG = tl.zeros((CHUNK, CHUNK), dtype=tl.float32)
    for k0 in range(0, N, CHUNK):
        keys = k0 + tl.arange(0, CHUNK)
        log_w = _load_chunk(log_w_ptr, seq, t0, T, stride_t, keys, CHUNK)
        to_end = tl.exp(tl.sum(log_w, axis=0)[None, :] - tl.cumsum(log_w, axis=0))     # e^{c_L - c_j}
        G_T = tl.trans(tl.load(G_ptr + values[:, None] * N + keys[None, :]))
        BG += _fdot(_load_chunk(b_ptr, seq, t0, T, stride_t, keys, CHUNK) * to_end, G_T, PRECISION)
        KG += _fdot(_load_chunk(k_ptr, seq, t0, T, stride_t, keys, CHUNK) * to_end, G_T, PRECISION)
    dy = _load_chunk(dy_ptr, seq, t0, T, stride_t, values, CHUNK)
    dZ = _fdot(tl.trans(T_inv), _fdot(tl.trans(Q_rb), dy, PRECISION) + BG, PRECISION)
    _store_chunk(dv_ptr, KG + _fdot(tl.trans(Q_rk), dy, PRECISION) + _fdot(tl.trans(A_ak), dZ, PRECISION), seq, t0,
                 T, stride_t, values, CHUNK)
    _store_chunk(dkeys_ptr + 6 * numel, dZ, seq, t0, T, stride_t, values, CHUNK)
    _store_chunk(dkeys_ptr + 7 * numel, BG, seq, t0, T, stride_t, values, CHUNK)


@triton.jit
def _block_shares(v_ptr, dy_ptr, S_ptr, G_ptr, dkeys_ptr, numel, seq, t0, T, stride_t, values, N: tl.constexpr,
                  CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """One block of value rows, over blocks of CHUNK keys: its shares of dY S_0, colsum(G * S_0) (on every row),
    V G, dZ S_0 and U G added to the running sums in the dr, dlog_w, dk, da and db slots (U, dZ from the scratch)."""
    v = _load_chunk(v_ptr, seq, t0, T, stride_t, values, CHUNK)
    dy = _load_chunk(dy_ptr, seq, t0, T, stride_t, values, CHUNK)
    U = _load_chunk(dkeys_ptr + 5 * numel, seq, t0, T, stride_t, values, CHUNK)
    dZ = _load_chunk(dkeys_ptr + 6 * numel, seq, t0, T, stride_t, values, CHUNK)
    for k0 in range(0, N, CHUNK):
        keys = k0 + tl.arange(0, CHUNK)
        tile = values[:, None] * N + keys[None, :]
        S0 = tl.load(S_ptr + tile)
        G = tl.load(G_ptr + tile)
        _add_to_slots(dkeys_ptr, numel, _fdot(dy, S0, PRECISION), tl.sum(G * S0, axis=0)[None, :],
                      _fdot(v, G, PRECISION), _fdot(dZ, S0, PRECISION), _fdot(U, G, PRECISION), seq, t0, T, stride_t,
                      keys, CHUNK)


@triton.jit
def _coupling_gradients(v_ptr, dy_ptr, dkeys_ptr, numel, seq, t0, T, stride_t, N: tl.constexpr, CHUNK: tl.constexpr,
                        PRECISION: tl.constexpr):
    """The couplings' gradients dZ U^T, dZ V^T, dY U^T, dY V^T (before their triangles), summed over the blocks of
    value rows, U and dZ read from the scratch slots."""
    dA_ab = tl.zeros((CHUNK, CHUNK), dtype=tl.float32)
    dA_ak = tl.zeros((CHUNK, CHUNK), dtype=tl.float32)
    dQ_rb = tl.zeros((CHUNK, CHUNK), dtype=tl.float32)
    dQ_rk = tl.zeros((CHUNK, CHUNK), dtype=tl.float32)
    for v0 in range(0, N, CHUNK):
        values = v0 + tl.arange(0, CHUNK)
        v_T = tl.trans(_load_chunk(v_ptr, seq, t0, T, stride_t, values, CHUNK))
        dy = _load_chunk(dy_ptr, seq, t0, T, stride_t, values, CHUNK)
        U_T = tl.trans(_load_chunk(dkeys_ptr + 5 * numel, seq, t0, T, stride_t, values, CHUNK))
        dZ = _load_chunk(dkeys_ptr + 6 * numel, seq, t0, T, stride_t, values, CHUNK)
        dA_ab += _fdot(dZ, U_T, PRECISION)
        dA_ak += _fdot(dZ, v_T, PRECISION)
        dQ_rb += _fdot(dy, U_T, PRECISION)
        dQ_rk += _fdot(dy, v_T, PRECISION)
    i = tl.arange(0, CHUNK)
    return _lower(dA_ab, i, True), _lower(dA_ak, i, True), _lower(dQ_rb, i, False), _lower(dQ_rk, i, False)


@triton.jit
def _finish_rows(d1, d2, slot_ptr, dlog_w_ptr, r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, seq, t0, T, stride_t,
                 N: tl.constexpr, CHUNK: tl.constexpr, IS_A: tl.constexpr, PRECISION: tl.constexpr):
    """da (IS_A: d1, d2 = dA_ab, dA_ak; the slot holds dZ S_0) or dr (dQ_rb, dQ_rk; dY S_0), in place over blocks
    of CHUNK keys: x_i e^{e_i} (slot)_i + e^{e_i - m} (d1 b e^{m-c} + d2 k e^{m-c})_i, e = c_{i-1} (da) or c_i (dr);
    their share of dlog_w added to its slot: sum_{i>t} (da a)_i, which also turns the slot's colsum(G * S_0) into
    its term dd d, or sum_{i>=t} (dr r)_i."""
    for k0 in range(0, N, CHUNK):
        keys = k0 + tl.arange(0, CHUNK)
        r, k, a, b, c, c_prev, c_end = _chunk_keys(r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, seq, t0, T, stride_t, keys,
                                                   CHUNK)
        _, _, b_c, k_c = _centred(r, k, a, b, c, c_prev, c_end)
        e = c_prev if IS_A else c
        x = a if IS_A else r
        grad = (_load_chunk(slot_ptr, seq, t0, T, stride_t, keys, CHUNK) * tl.exp(e)
                + (_fdot(d1, tl.trans(b_c), PRECISION) + _fdot(d2, tl.trans(k_c), PRECISION)) * tl.exp(e - 0.5 * c_end))
        dlog_w = _load_chunk(dlog_w_ptr, seq, t0, T, stride_t, keys, CHUNK)
        if IS_A:
            dlog_w = dlog_w * tl.exp(c_end) + tl.cumsum(grad * x, axis=0, reverse=True) - grad * x
        else:
            dlog_w += tl.cumsum(grad * x, axis=0, reverse=True)
        tl.debug_barrier()                       # every thread has read both slots before any is overwritten
        _store_chunk(slot_ptr, grad, seq, t0, T, stride_t, keys, CHUNK)
        _store_chunk(dlog_w_ptr, dlog_w, seq, t0, T, stride_t, keys, CHUNK)


@triton.jit
def _finish_columns(d1, d2, slot_ptr, dlog_w_ptr, r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, seq, t0, T, stride_t,
                    N: tl.constexpr, CHUNK: tl.constexpr, IS_B: tl.constexpr, PRECISION: tl.constexpr):
    """db (IS_B: d1, d2 = dA_ab, dQ_rb; the slot holds U G) or dk (dA_ak, dQ_rk; V G), in place over blocks of CHUNK
    keys: e^{m-c_j} (d1^T a~ e^{-m} + d2^T r~ e^{-m})_j (the coupling part) + e^{c_L - c_j} (slot)_j (the end part);
    their share of dlog_w added to its slot: -sum_{i>=t} (cpl x)_i + sum_{j<t} (end x)_j, x = b or k."""
    for k0 in range(0, N, CHUNK):
        keys = k0 + tl.arange(0, CHUNK)
        r, k, a, b, c, c_prev, c_end = _chunk_keys(r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, seq, t0, T, stride_t, keys,
                                                   CHUNK)
        a_c, r_c, _, _ = _centred(r, k, a, b, c, c_prev, c_end)
        x = b if IS_B else k
        cpl = (_fdot(tl.trans(d1), a_c, PRECISION) + _fdot(tl.trans(d2), r_c, PRECISION)) * tl.exp(0.5 * c_end - c)
        end = _load_chunk(slot_ptr, seq, t0, T, stride_t, keys, CHUNK) * tl.exp(c_end - c)
        dlog_w = (_load_chunk(dlog_w_ptr, seq, t0, T, stride_t, keys, CHUNK)
                  - tl.cumsum(cpl * x, axis=0, reverse=True) + tl.cumsum(end * x, axis=0) - end * x)
        tl.debug_barrier()                       # every thread has read both slots before any is overwritten
        _store_chunk(slot_ptr, cpl + end, seq, t0, T, stride_t, keys, CHUNK)
        _store_chunk(dlog_w_ptr, dlog_w, seq, t0, T, stride_t, keys, CHUNK)


@triton.jit
def _finish_keys(r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, dkeys_ptr, numel, seq, t0, T, stride_t, dA_ab, dA_ak, dQ_rb,
                 dQ_rk, N: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """The running sums in the slots turned into da, dr, db, dk and dlog_w in place, one gradient a loop over the key
    blocks (two of the couplings' gradients live in each), dlog_w gathering its four shares (module docstring)."""
    dlog_w_ptr = dkeys_ptr + numel
    _finish_rows(dA_ab, dA_ak, dkeys_ptr + 3 * numel, dlog_w_ptr, r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, seq, t0, T,
                 stride_t, N, CHUNK, True, PRECISION)
    _finish_rows(dQ_rb, dQ_rk, dkeys_ptr, dlog_w_ptr, r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, seq, t0, T, stride_t, N,
                 CHUNK, False, PRECISION)
    _finish_columns(dA_ab, dQ_rb, dkeys_ptr + 4 * numel, dlog_w_ptr, r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, seq, t0,
                    T, stride_t, N, CHUNK, True, PRECISION)
    _finish_columns(dA_ak, dQ_rk, dkeys_ptr + 2 * numel, dlog_w_ptr, r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, seq, t0,
                    T, stride_t, N, CHUNK, False, PRECISION)


@triton.jit
def _factored_gradients(A_ab, A_ak, Q_rb, Q_rk, r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr, dy_ptr, S_ptr, G_ptr,
                        dkeys_ptr, dv_ptr, numel, seq, t0, T, stride_t, N: tl.constexpr,
                        CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """A factored sub-chunk's gradients from its couplings (_couplings'), in passes over the blocks of CHUNK value
    rows (and, inside, of CHUNK keys) that each keep few (CHUNK, CHUNK) tiles live: U, then dZ and dv; the shares
    summed in the slots; the couplings' gradients; then the key-vector gradients, one a pass. Between passes a
    barrier: each reads what the one before stored."""
    i = tl.arange(0, CHUNK)
    T_inv = _unit_lower_inverse(_lower(A_ab, i, True), i, PRECISION, CHUNK)
    A_ak = _lower(A_ak, i, True)
    for v0 in range(0, N, CHUNK):
        _solve_u(T_inv, A_ak, log_w_ptr, v_ptr, a_ptr, S_ptr, dkeys_ptr, numel, seq, t0, T, stride_t,
                 v0 + tl.arange(0, CHUNK), N, CHUNK, PRECISION)
    for v0 in range(0, N, CHUNK):
        _solve_dz(T_inv, A_ak, _lower(Q_rb, i, False), _lower(Q_rk, i, False), log_w_ptr, k_ptr, b_ptr, dy_ptr, G_ptr,
                  dkeys_ptr, dv_ptr, numel, seq, t0, T, stride_t, v0 + tl.arange(0, CHUNK), N, CHUNK, PRECISION)
    for v0 in range(0, N, CHUNK):
        tl.debug_barrier()                       # the slots' zeros, the scratch and earlier blocks' sums are stored
        _block_shares(v_ptr, dy_ptr, S_ptr, G_ptr, dkeys_ptr, numel, seq, t0, T, stride_t, v0 + tl.arange(0, CHUNK), N,
                      CHUNK, PRECISION)
    dA_ab, dA_ak, dQ_rb, dQ_rk = _coupling_gradients(v_ptr, dy_ptr, dkeys_ptr, numel, seq, t0, T, stride_t, N, CHUNK,
                                                     PRECISION)
    tl.debug_barrier()
    _finish_keys(r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, dkeys_ptr, numel, seq, t0, T, stride_t, dA_ab, dA_ak, dQ_rb,
                 dQ_rk, N, CHUNK, PRECISION)


@triton.jit
def _add_to_rows(dkeys_ptr, numel, dr, dlog_w, dk, da, db, off, keys, t, T):
    """Adds one step's (N,) shares to its row of the five key-vector slots (every thread loads before any stores)."""
    dr += _vector(dkeys_ptr, off, keys, t, T)
    dlog_w += _vector(dkeys_ptr + numel, off, keys, t, T)
    dk += _vector(dkeys_ptr + 2 * numel, off, keys, t, T)
    da += _vector(dkeys_ptr + 3 * numel, off, keys, t, T)
    db += _vector(dkeys_ptr + 4 * numel, off, keys, t, T)
    tl.debug_barrier()
    live = keys * 0 + t < T
    tl.store(dkeys_ptr + off + keys, dr, mask=live)
    tl.store(dkeys_ptr + numel + off + keys, dlog_w, mask=live)
    tl.store(dkeys_ptr + 2 * numel + off + keys, dk, mask=live)
    tl.store(dkeys_ptr + 3 * numel + off + keys, da, mask=live)
    tl.store(dkeys_ptr + 4 * numel + off + keys, db, mask=live)


@triton.jit
def _rerun(S0, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr, seq, t0, t, T, stride_t, keys, values):
    """The state's rows entering step t, re-run from S0 (rows entering step t0)."""
    S = S0
    for s in range(t0, t):
        off = seq + s * stride_t
        S = _step(S, tl.exp(_vector(log_w_ptr, off, keys, s, T)), _vector(k_ptr, off, keys, s, T),
                  _vector(v_ptr, off, values, s, T), _vector(a_ptr, off, keys, s, T), _vector(b_ptr, off, keys, s, T))
    return S


@triton.jit
def _stepwise_block(S0, G, log_w_ptr, r_ptr, k_ptr, v_ptr, a_ptr, b_ptr, dy_ptr, dv_ptr, dkeys_ptr, numel, seq, t0, T,
                    stride_t, keys, values, CHUNK: tl.constexpr):
    """The steps of a sub-chunk from the last on one block of value rows (S0, G: its rows of S_0 and of dL/dS at the
    end), wkv7_bwd_kernel's formulas; each step's entering state re-run from S0. dv stored; the rows' shares of
    dr, dlog_w, dk, da, db added to the slots' running sums. Returns dL/dS_0's rows."""
    for jj in range(CHUNK):
        t = t0 + CHUNK - 1 - jj
        S_prev = _rerun(S0, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr, seq, t0, t, T, stride_t, keys, values)
        off = seq + t * stride_t
        w = tl.exp(_vector(log_w_ptr, off, keys, t, T))
        k, v = _vector(k_ptr, off, keys, t, T), _vector(v_ptr, off, values, t, T)
        a, b = _vector(a_ptr, off, keys, t, T), _vector(b_ptr, off, keys, t, T)
        dy = _vector(dy_ptr, off, values, t, T)
        sa = tl.sum(S_prev * a[None, :], axis=1)                      # S_{t-1} a_t
        # dr = S_t^T dy, with S_t = S_{t-1} diag(w) + sa b^T + v k^T expanded
        dr = w * tl.sum(S_prev * dy[:, None], axis=0) + b * tl.sum(sa * dy) + k * tl.sum(v * dy)
        G += dy[:, None] * _vector(r_ptr, off, keys, t, T)[None, :]    # y_t = S_t r_t
        q = tl.sum(G * b[None, :], axis=1)                            # G b_t = dL/d(S_{t-1} a_t)
        tl.store(dv_ptr + off + values, tl.sum(G * k[None, :], axis=1), mask=values * 0 + t < T)
        # dlog_w = w colsum(G S_{t-1}), dk = G^T v, da = S_{t-1}^T q, db = G^T (S_{t-1} a)
        _add_to_rows(dkeys_ptr, numel, dr, w * tl.sum(G * S_prev, axis=0), tl.sum(G * v[:, None], axis=0),
                     tl.sum(S_prev * q[:, None], axis=0), tl.sum(G * sa[:, None], axis=0), off, keys, t, T)
        G = G * w[None, :] + q[:, None] * a[None, :]                  # dL/dS_{t-1}
    return G


@triton.jit
def _stepwise_gradients(log_w_ptr, r_ptr, k_ptr, v_ptr, a_ptr, b_ptr, dy_ptr, S_ptr, G_ptr, dkeys_ptr, dv_ptr, numel,
                        seq, t0, T, stride_t, N: tl.constexpr, CHUNK: tl.constexpr):
    """A stepped sub-chunk's gradients, its value rows CHUNK at a time (_stepwise_block), the key-vector gradients
    summed over the blocks in the slots."""
    keys = tl.arange(0, N)
    for v0 in range(0, N, CHUNK):
        values = v0 + tl.arange(0, CHUNK)
        tile = values[:, None] * N + keys[None, :]
        tl.debug_barrier()                       # the slots' zeros and earlier blocks' sums are stored
        _stepwise_block(tl.load(S_ptr + tile), tl.load(G_ptr + tile), log_w_ptr, r_ptr, k_ptr, v_ptr, a_ptr, b_ptr,
                        dy_ptr, dv_ptr, dkeys_ptr, numel, seq, t0, T, stride_t, keys, values, CHUNK)


@triton.jit
def wkv7_chunked_bwd_kernel(
    r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr,  # (B, T, H, N) inputs of the forward, contiguous
    dy_ptr,              # (B, T, H, N) gradient of y, contiguous, the input dtype
    sub_ptr,             # (B * H, n_groups * GROUP, N, N) fp32: the state entering each sub-chunk
    dsub_ptr,            # (B * H, n_groups * GROUP, N, N) fp32: dL/dS at each sub-chunk's end
    dkeys_ptr,           # (8, B, T, H, N) fp32 out: dr, dlog_w, dk, da, db (running sums while the program runs),
                         # then a scratch: U, dZ, B^ G^T of the program's sub-chunk, by step and value row
    dv_ptr,              # (B, T, H, N) fp32 out: the gradient of v
    T, H,                # sequence length, heads
    N: tl.constexpr,           # head size, a power of two from 16 to 64
    CHUNK: tl.constexpr,       # steps per sub-chunk, 16: also the value rows and keys of every tile
    GROUP: tl.constexpr,       # sub-chunks per group: sub_ptr and dsub_ptr hold whole groups of a head
    MAX_SPREAD: tl.constexpr,  # the widest spread of c that a sub-chunk takes in the factored form
    PRECISION: tl.constexpr,   # "tf32x3" or "tf32"
):
    """One (sub-chunk, head) per program, no chain between them: its gradients from its entering state S_0 and
    G = dL/dS at its end. Every tile is (CHUNK, CHUNK) but the stepwise path's rows of the state (CHUNK, N)."""
    DT: tl.constexpr = r_ptr.dtype.element_ty
    pid_bh, s, n_sub = _program_group(T, CHUNK, 1)
    _, seq, stride_t = _head_offsets(pid_bh, T, H, N)
    numel = (tl.num_programs(0) // n_sub).to(tl.int64) * T * N   # B * T * H * N
    slots = tl.cdiv(n_sub, GROUP) * GROUP
    S_ptr = _checkpoint(sub_ptr, pid_bh, slots, s, N)
    G_ptr = _checkpoint(dsub_ptr, pid_bh, slots, s, N)
    t0 = s * CHUNK
    A_ab, A_ak, Q_rb, Q_rk, factored = _couplings(r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr, dy_ptr, dkeys_ptr,
                                                  numel, seq, t0, T, stride_t, N, MAX_SPREAD, CHUNK, DT, PRECISION)
    if factored:
        _factored_gradients(A_ab, A_ak, Q_rb, Q_rk, r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr, dy_ptr, S_ptr, G_ptr,
                            dkeys_ptr, dv_ptr, numel, seq, t0, T, stride_t, N, CHUNK, PRECISION)
    else:
        _stepwise_gradients(log_w_ptr, r_ptr, k_ptr, v_ptr, a_ptr, b_ptr, dy_ptr, S_ptr, G_ptr, dkeys_ptr, dv_ptr,
                            numel, seq, t0, T, stride_t, N, CHUNK)


def _chunked_bwd(r, log_w, k, v, a, b, states, dy, dstate, max_spread):
    """The chunked backward from the forward's group states (groups of group_size sub-chunks): the parallel prep, the
    reversed scan, with groups of several sub-chunks the state entering each and dL/dS at each one's end (with groups
    of one, the forward's and the scan's own), then every sub-chunk's gradients at once. Returns dkeys
    (5, B, T, H, N): dr, dlog_w, dk, da, db; dv; dS_0 (all fp32)."""
    B, T, H, N = r.shape
    cfg = _parallel_launch_config(N)
    group, n_sub, n_groups = _grouping(T, r.dtype)                 # the forward's
    assert states.shape[1] == n_groups, "the forward's groups are not the backward's"
    precision = _precision(r.dtype)
    shared = dict(N=N, CHUNK=CHUNK, GROUP=group, MAX_SPREAD=max_spread, PRECISION=precision, **cfg.options)
    walks = (B * H * n_groups, N // cfg["COLUMNS"])
    maps = new_output((B * H, n_groups, 2 * N, N), torch.float32, r.device)            # [P_G^T; F_G]
    wkv7_chunked_bwd_prep_kernel[(B * H * n_groups, 2 * N // cfg["COLUMNS"])](r, log_w, k, a, b, dy, maps, T, H,
                                                                            **shared, **cfg.blocks)
    dstates = new_output((B * H, n_groups, N, N), torch.float32, r.device)
    dstate0 = new_output((B, H, N, N), torch.float32, r.device)
    _scan(maps, dstate, dstates, dstate0, n_groups, True, precision)
    sub, dsub = states, dstates
    if group > 1:
        sub = new_output((B * H, n_groups * group, N, N), torch.float32, r.device)
        wkv7_chunked_states_kernel[walks](r, log_w, k, v, a, b, states, sub, T, H, **shared, **cfg.blocks)
        dsub = new_output((B * H, n_groups * group, N, N), torch.float32, r.device)
        wkv7_chunked_dstates_kernel[walks](r, log_w, k, a, b, dy, dstates, dsub, T, H, **shared, **cfg.blocks)
    dkeys = new_output((8, B, T, H, N), torch.float32, r.device)           # the five gradients, then a scratch
    dv = new_output((B, T, H, N), torch.float32, r.device)
    wkv7_chunked_bwd_kernel[(B * H * n_sub,)](r, log_w, k, v, a, b, dy, sub, dsub, dkeys, dv, T, H, **shared)
    return dkeys[:5], dv, dstate0


def chunked_aot_kernels(N, dtype, types, max_spread):
    """The chunked kernels' AOT builds (kernels/aot.py) at head size N for inputs of ``dtype`` ("fp32", "bf16" or
    "fp16"), with kernels/wkv7's argument types, at the group size the launcher takes for that dtype (group_size);
    labels start "wkv7_chunked_fwd" (the forward's three) or "wkv7_chunked_bwd" (the backward's four: three with
    groups of one, whose sub-chunk states are the forward's)."""
    from ..aot import AotKernel
    from .triton_chunked import (_scan_launch_config, group_size, wkv7_chunked_output_kernel, wkv7_chunked_prep_kernel,
                                 wkv7_chunked_scan_kernel)
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    parallel, scan = _parallel_launch_config(N), _scan_launch_config(N)
    common = {"N": N, "PRECISION": _precision(torch_dtype), "CHUNK": CHUNK,
              "GROUP": group_size(torch_dtype)}
    walks = {**common, **parallel.blocks, "MAX_SPREAD": max_spread}
    scans = {"N": N, "PRECISION": common["PRECISION"], **scan.blocks, "HAS_INIT": True}
    builds = [("wkv7_chunked_fwd_prep", wkv7_chunked_prep_kernel, walks, parallel),
              ("wkv7_chunked_fwd_scan", wkv7_chunked_scan_kernel, {**scans, "REVERSE": False}, scan),
              ("wkv7_chunked_fwd_output", wkv7_chunked_output_kernel, {**common, **parallel.blocks}, parallel),
              ("wkv7_chunked_bwd_prep", wkv7_chunked_bwd_prep_kernel, walks, parallel),
              ("wkv7_chunked_bwd_scan", wkv7_chunked_scan_kernel, {**scans, "REVERSE": True}, scan),
              ("wkv7_chunked_bwd_grads", wkv7_chunked_bwd_kernel, {**common, "MAX_SPREAD": max_spread}, parallel)]
    if common["GROUP"] > 1:
        builds += [("wkv7_chunked_bwd_states", wkv7_chunked_states_kernel, walks, parallel),
                   ("wkv7_chunked_bwd_dstates", wkv7_chunked_dstates_kernel, walks, parallel)]
    return [AotKernel(f"{label} N={N} {dtype}", fn, constexprs, types, "*fp32", cfg.num_warps, cfg.num_stages)
            for label, fn, constexprs, cfg in builds]
