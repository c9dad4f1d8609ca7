"""RWKV-7's WKV in chunks, on Triton: the forward of ``wkv7(..., backend="triton_chunked")`` (issue 46's design) and
the pieces its backward (kernels/wkv7/triton_chunked_bwd.py) shares, beside the recurrent (sequential) kernels of
kernels/wkv7/__init__.py, as fla keeps fused_recurrent beside chunk. Private: kernels/wkv7/__init__.py dispatches here.

Glossary (kernels/wkv7/__init__.py's docstring derives the WY form): a sub-chunk is L = CHUNK = 16 steps; S_0 the
state (N_v, N_k) = (value, key) entering it; c_i = log_w_1 + ... + log_w_i (c_0 = 0) its cumulative log decays,
d = e^{c_L}; a~_i = a_i e^{c_{i-1}}, r~_i = r_i e^{c_i} (rows of (L, N) matrices), B^_j = b_j e^{c_L - c_j}, K^ alike;
the couplings A_ab = tril_{j<i}(a~ (b e^{-c})^T), A_ak alike with k, Q_rb = tril_{j<=i}(r~ (b e^{-c})^T), Q_rk alike;
T_inv = (I - A_ab)^{-1}, W = T_inv a~, U0 = T_inv A_ak V. A sub-chunk is then an affine map of its entering state:

    S_L = S_0 P + E,   P = diag(d) + W^T B^,   E = U0^T B^ + V^T K^          (N, N) each
    Y = R S_0^T + Y0,  R = r~ + Q_rb W,        Y0 = Q_rb U0 + Q_rk V          (L, N) each

GROUP = 4 sub-chunks compose into a 64-step group: P_G = P_1 P_2 P_3 P_4, E_G = ((E_1 P_2 + E_2) P_3 + E_3) P_4 + E_4,
and sub-chunk s's outputs read the group's entering state S_G through R'_s = R_s (P_1 ... P_{s-1})^T and
Y0'_s = Y0_s + R_s (E_1 ... composed up to s - 1)^T: Y_s = R'_s S_G^T + Y0'_s. Three kernels, one of them serial:

- wkv7_chunked_prep_kernel, grid (groups x B H, 2 N / COLUMNS): every sub-chunk's maps, in parallel, composed.
- wkv7_chunked_scan_kernel, grid (B H, N / SCAN_ROWS): S <- S P_G + E_G, one product per group (T / 64 serial
  steps), storing the fp32 state entering each group; the backward reads those, and nothing else of the forward.
- wkv7_chunked_output_kernel, grid (groups x B H, N / COLUMNS): Y = R' S_G^T + Y0', one (64, N) x (N, COLUMNS)
  product a program.

Stored: [P_G; E_G] (B H, groups, 2 N, N) and the rows [R' | Y0'] (B H, steps, 2 N), fp32, while the forward runs;
after it, only the fp32 state entering each group. GROUP = 4 is for fp16/bf16 inputs, with or without a gradient
(the backward, kernels/wkv7/triton_chunked_bwd.py, walks the state and dL/dS over each group's sub-chunks itself);
fp32 inputs take groups of one sub-chunk (group_size: the fp32 prep with four sub-chunks a program needed an 8-byte
stack on sm_80, the backward's walks over a group 56-104 bytes on sm_90).

The column split. P_G and E_G are N x N, and (N, N) fp32 tiles do not fit one program's registers beside the
sub-chunk's (16, N) tiles: the first form of this kernel, with all of P, E, P_G, E_G in one program, needed 0.2-1.8 KB
stack frames at N = 64. But composing maps is a product from the left: a block X of rows of the partial
composition goes through each sub-chunk alone, X <- X P_s + E_s[rows], and P_s is diag(d) plus a rank-16 term, so

    X P_s = X diag(d) + (X W^T) B^        ((COLUMNS, N) x (N, 16), then (COLUMNS, 16) x (16, N))

never forms P_s. Rows of P_G are such a walk from rows of the identity without input; rows of E_G a walk from zero
with the input term E_s[rows] = U0[:, rows]^T B^ + V[:, rows]^T K^, whose U0[:, rows] = T_inv A_ak V[:, rows] needs
those value columns only. So the prep kernel stacks [P_G; E_G] (2 N, N) and gives each program COLUMNS of its rows
(its "lines"): a P line starts at e_i, an E line at 0 with V's column. The same walk gives the output rows: the P
lines' R_s X^T are R'_s's columns, the E lines' R_s X^T + Y0_s[:, rows] Y0'_s's. Every program recomputes its
group's couplings and inverse (the (16, N) x (N, 16) products and the inverse's six (16, 16) ones): 2 N / COLUMNS
times the sub-chunk work of a program that took all lines, traded for (COLUMNS, N) tiles in registers and
2 N / COLUMNS times the programs. A sub-chunk out of the factored form's range (below) takes its 16 steps one at a
time on the lines: X <- X diag(w) + (X a) b^T (+ v[rows] k^T on E lines), reading X r_j after step j.

Centred factors. Each coupling factors exp(c_i - c_j) as e^{c_i - m} e^{m - c_j} with m = c_L / 2 per key: for
decays <= 1, c runs from 0 down to c_L, so both factors lie within e^{+-spread/2}, e^{+-4.9} at RWKV-7's strongest
decays (spread 0.61 L = 9.7). A sub-chunk whose spread of c passes MAX_SPREAD (kernels/wkv7's DECAY_RANGE = 20,
FP16_DECAY_RANGE = 10 for fp16 inputs), or that holds an inf or a NaN in what a program reads of it, takes its 16 steps
one at a time, decided on the device: its non-finite values then reach only the steps after them, as in the
step-by-step rule. The check sums the inputs (a NaN or inf makes the sum non-finite), because tl.max and tl.min drop
NaN. A non-finite output or final state is stored as NaN: the products add a non-finite state's terms in another
order than the steps, so where the steps make inf - inf = NaN they may make +-inf.

Precision. The couplings, products of raw inputs (_dot), take their operands in the input dtype on the tensor cores
for fp16/bf16 inputs; everything that carries a state or the inverse (_fdot) takes fp32 operands, tf32 for fp16/bf16
inputs (fp16 operands there cost the fp16 gradients on correlated keys 30-100x their conditioning, review K1). fp32
inputs take tf32x3 in every product (three tf32 MMAs: fp32's accuracy on the tensor cores; one tf32 product misses
WKV-7's fp32 budget of 1e-4 at T = 2048, per the GPU review's rounding experiment).

fla's default chunk_rwkv7 takes chunks of 16 and walks T / 16 of them serially; its layer's form (safe_gate,
lower_bound, chunk_size 64) walks T / 64. Nothing here is timed on a GPU yet.
"""
from __future__ import annotations

import torch

from .._common import Launch, new_output, tl, triton
from ._triton_common import _checkpoint, _head_offsets

__all__ = []   # private: the op is kernels/wkv7's wkv7 (backend="triton_chunked")

CHUNK = 16                # steps per sub-chunk: tl.dot's smallest tile
GROUP = 4                 # sub-chunks per group: the serial pass takes one product per GROUP * CHUNK steps
CHUNKED_BLOCK_K = 16      # the least head size the chunked kernels take (tl.dot's smallest tile)
MAX_CHUNKED_HEAD = 64     # the largest: at N = 128 the AOT builds spill (docs/gpu.md), so the backend refuses it
COLUMNS = 16              # lines of [P_G; E_G] (and columns of y) per program of the parallel kernels
SCAN_ROWS = 16            # rows of the state per program of the scan
PARALLEL_WARPS = 4        # warps of the parallel kernels' programs: (16, N) tiles of 8 registers a thread at N = 64


@triton.jit
def _dot(x, y, DT: tl.constexpr, PRECISION: tl.constexpr):
    """x @ y of raw inputs, accumulated in fp32: fp16 / bf16 inputs (DT) take their operands rounded to DT, on the
    tensor cores; fp32 inputs the fp32 products' PRECISION."""
    if DT == tl.float32:
        return tl.dot(x, y, input_precision=PRECISION)
    else:
        return tl.dot(x.to(DT), y.to(DT), out_dtype=tl.float32)


@triton.jit
def _fdot(x, y, PRECISION: tl.constexpr):
    """x @ y with fp32 operands (states, the inverse, the composition): PRECISION "tf32x3" (fp32 inputs) or "tf32"."""
    return tl.dot(x, y, input_precision=PRECISION)


@triton.jit
def _nan_unless_finite(x):
    """x with every inf as NaN (module docstring)."""
    return tl.where(tl.abs(x) < float("inf"), x, float("nan"))


@triton.jit
def _load_chunk(ptr, off, t0, T, stride_t, cols, CHUNK: tl.constexpr):
    """Steps t0 .. t0 + CHUNK - 1 of one head at columns cols, as a (CHUNK, len(cols)) fp32 tile; steps past T and
    columns below 0 read 0."""
    steps = t0 + tl.arange(0, CHUNK)
    live = (steps < T)[:, None] & (cols[None, :] >= 0)
    return tl.load(ptr + off + steps[:, None] * stride_t + cols[None, :], mask=live, other=0.0).to(tl.float32)


@triton.jit
def _store_chunk(ptr, x, off, t0, T, stride_t, cols, CHUNK: tl.constexpr):
    """Stores the (CHUNK, len(cols)) tile x at steps t0 .. t0 + CHUNK - 1 (those before T), columns cols >= 0."""
    steps = t0 + tl.arange(0, CHUNK)
    tl.store(ptr + off + steps[:, None] * stride_t + cols[None, :], x.to(ptr.dtype.element_ty),
             mask=(steps < T)[:, None] & (cols[None, :] >= 0))


@triton.jit
def _vector(ptr, off, cols, t, T):
    """Step t's values at cols as fp32 (0 from T on, and at columns below 0): the step-by-step paths' loads."""
    return tl.load(ptr + off + cols, mask=(cols >= 0) & (cols * 0 + t < T), other=0.0).to(tl.float32)


@triton.jit
def _chunk_keys(r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, seq, t0, T, stride_t, keys, CHUNK: tl.constexpr):
    """One sub-chunk's key-side inputs as (CHUNK, N) fp32 tiles, 0 past T: r, k, a, b and c_i, c_{i-1}, with c_L as
    (1, N)."""
    log_w = _load_chunk(log_w_ptr, seq, t0, T, stride_t, keys, CHUNK)
    c = tl.cumsum(log_w, axis=0)
    r = _load_chunk(r_ptr, seq, t0, T, stride_t, keys, CHUNK)
    k = _load_chunk(k_ptr, seq, t0, T, stride_t, keys, CHUNK)
    a = _load_chunk(a_ptr, seq, t0, T, stride_t, keys, CHUNK)
    b = _load_chunk(b_ptr, seq, t0, T, stride_t, keys, CHUNK)
    return r, k, a, b, c, c - log_w, tl.sum(log_w, axis=0)[None, :]


@triton.jit
def _centred(r, k, a, b, c, c_prev, c_end):
    """The couplings' factors from the raw inputs, centred at m = c_L / 2: a_i e^{c_{i-1} - m}, r_i e^{c_i - m}
    (CHUNK, N) and (b_j e^{m - c_j})^T, (k_j e^{m - c_j})^T (N, CHUNK)."""
    m = 0.5 * c_end
    up = tl.exp(m - c)
    return a * tl.exp(c_prev - m), r * tl.exp(c - m), tl.trans(b * up), tl.trans(k * up)


@triton.jit
def _hats(r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, seq, t0, T, stride_t, keys, MAX_SPREAD: tl.constexpr,
          CHUNK: tl.constexpr):
    """One sub-chunk's key side as the factored form uses it, (CHUNK, N) fp32 tiles, 0 past T: r~, a~, B^, K^, with
    d = e^{c_L} and e^{-m} = e^{-c_L / 2} as (1, N); and whether its spread of c is within MAX_SPREAD, and the sum of
    its inputs (non-finite if one is; _factored). The centred factors are the tiles times e^{-m}: a_i e^{c_{i-1} - m},
    r_i e^{c_i - m}, b_j e^{m - c_j} = B^_j e^{-m} (m - c_L = -m), k_j e^{m - c_j}. Only these four tiles stay live,
    not the raw inputs and c besides."""
    log_w = _load_chunk(log_w_ptr, seq, t0, T, stride_t, keys, CHUNK)
    c = tl.cumsum(log_w, axis=0)
    c_end = tl.sum(log_w, axis=0)[None, :]
    c_hi = tl.maximum(tl.max(tl.max(c, axis=1), axis=0), 0.0)
    c_lo = tl.minimum(tl.min(tl.min(c, axis=1), axis=0), 0.0)
    r = _load_chunk(r_ptr, seq, t0, T, stride_t, keys, CHUNK)
    k = _load_chunk(k_ptr, seq, t0, T, stride_t, keys, CHUNK)
    a = _load_chunk(a_ptr, seq, t0, T, stride_t, keys, CHUNK)
    b = _load_chunk(b_ptr, seq, t0, T, stride_t, keys, CHUNK)
    total = _total(r + k + a + b + c)
    to_end = tl.exp(c_end - c)                                                 # e^{c_L - c_j}
    return (r * tl.exp(c), a * tl.exp(c - log_w), b * to_end, k * to_end, tl.exp(c_end), tl.exp(-0.5 * c_end),
            c_hi - c_lo <= MAX_SPREAD, total)


@triton.jit
def _factored(spread_ok, total):
    """Whether a sub-chunk takes the factored form: its c spreads at most MAX_SPREAD (with 0: kernels/wkv7's
    _factors_in_range) and ``total``, the sum of what the program reads of it, is finite (inf - inf is NaN). The sum
    is the NaN test: tl.max and tl.min drop NaN (maxnum on a GPU, fmax in the interpreter)."""
    return spread_ok & (total - total == 0.0)


@triton.jit
def _lower(A, i, STRICT: tl.constexpr):
    """A's lower triangle: j < i (STRICT) or j <= i."""
    if STRICT:
        return tl.where(i[None, :] < i[:, None], A, 0.0)
    else:
        return tl.where(i[None, :] <= i[:, None], A, 0.0)


@triton.jit
def _unit_lower_inverse(A, i, PRECISION: tl.constexpr, CHUNK: tl.constexpr):
    """(I - A)^{-1} = (I + A)(I + A^2)(I + A^4)(I + A^8) for strictly lower-triangular A (CHUNK, CHUNK): A^16 = 0.
    fp32 operands: the inverse carries every row of the sub-chunk's solve."""
    tl.static_assert(CHUNK == 16, "four factors (I + A^(2^m)) invert I - A only while A^16 = 0")
    inverse = (i[:, None] == i[None, :]).to(tl.float32) + A
    power = A
    for _ in tl.static_range(3):
        power = _fdot(power, power, PRECISION)
        inverse += _fdot(inverse, power, PRECISION)
    return inverse


@triton.jit
def _total(x):
    """The sum of a 2-D tile's entries."""
    return tl.sum(tl.sum(x, axis=1), axis=0)


@triton.jit
def _wy(r_t, a_t, b_hat, k_hat, e_m, DT: tl.constexpr, PRECISION: tl.constexpr, CHUNK: tl.constexpr):
    """A factored sub-chunk's couplings A_ak, Q_rb, Q_rk (CHUNK, CHUNK), T_inv = (I - A_ab)^{-1} and W = T_inv a~
    (CHUNK, N), from _hats' tiles."""
    i = tl.arange(0, CHUNK)
    a_c, r_c = a_t * e_m, r_t * e_m
    b_c, k_c = tl.trans(b_hat * e_m), tl.trans(k_hat * e_m)
    # the four couplings before the inverse: their (CHUNK, N) operands, the largest of the kernel's, die together
    A_ab = _lower(_dot(a_c, b_c, DT, PRECISION), i, True)
    A_ak = _lower(_dot(a_c, k_c, DT, PRECISION), i, True)
    Q_rb = _lower(_dot(r_c, b_c, DT, PRECISION), i, False)
    Q_rk = _lower(_dot(r_c, k_c, DT, PRECISION), i, False)
    T_inv = _unit_lower_inverse(A_ab, i, PRECISION, CHUNK)
    return A_ak, Q_rb, Q_rk, T_inv, _fdot(T_inv, a_t, PRECISION)


@triton.jit
def _lines_factored(X, r_t, a_t, b_hat, k_hat, d, e_m, v, DT: tl.constexpr, PRECISION: tl.constexpr,
                    CHUNK: tl.constexpr):
    """One factored sub-chunk on lines X (COLUMNS, N) of the partial composition, v (CHUNK, COLUMNS) their value
    columns (0 on P lines): returns (X P + E[lines], the output rows R X^T + Y0[:, lines] (CHUNK, COLUMNS))."""
    A_ak, Q_rb, Q_rk, T_inv, W = _wy(r_t, a_t, b_hat, k_hat, e_m, DT, PRECISION, CHUNK)
    U0 = _fdot(T_inv, _fdot(A_ak, v, PRECISION), PRECISION)                    # T_inv A_ak V[:, lines]
    R = r_t + _fdot(Q_rb, W, PRECISION)                                        # r~ + Q_rb W
    out = _fdot(R, tl.trans(X), PRECISION) + _fdot(Q_rb, U0, PRECISION) + _fdot(Q_rk, v, PRECISION)
    # X P + E[lines] = X diag(d) + (X W^T + U0^T) B^ + V^T K^
    X = (X * d + _fdot(_fdot(X, tl.trans(W), PRECISION) + tl.trans(U0), b_hat, PRECISION)
         + _fdot(tl.trans(v), k_hat, PRECISION))
    return X, out


@triton.jit
def _lines_stepwise(X, log_w_ptr, r_ptr, k_ptr, a_ptr, b_ptr, v_ptr, seq, t0, T, stride_t, keys, values,
                    CHUNK: tl.constexpr):
    """One sub-chunk's steps one at a time on lines X (COLUMNS, N): X <- X diag(w) + (X a) b^T + v[values] k^T
    (values < 0 on P lines: no input), the output row j = X r_j read after step j. Returns (X, rows (CHUNK,
    COLUMNS))."""
    i = tl.arange(0, CHUNK)
    out = tl.zeros((CHUNK, values.shape[0]), dtype=tl.float32)
    for j in range(CHUNK):
        t = t0 + j
        off = seq + t * stride_t
        a, b = _vector(a_ptr, off, keys, t, T), _vector(b_ptr, off, keys, t, T)
        xa = tl.sum(X * a[None, :], axis=1)
        X = (X * tl.exp(_vector(log_w_ptr, off, keys, t, T))[None, :] + xa[:, None] * b[None, :]
             + _vector(v_ptr, off, values, t, T)[:, None] * _vector(k_ptr, off, keys, t, T)[None, :])
        read = tl.sum(X * _vector(r_ptr, off, keys, t, T)[None, :], axis=1)
        out = tl.where(i[:, None] == j, read[None, :], out)
    return X, out


@triton.jit
def _subchunk_lines(X, r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr, seq, t0, T, stride_t, keys, values,
                    MAX_SPREAD: tl.constexpr, DT: tl.constexpr, PRECISION: tl.constexpr, CHUNK: tl.constexpr):
    """The sub-chunk at t0 on lines X: factored, or step by step where _factored says no. Returns (X, out rows)."""
    r_t, a_t, b_hat, k_hat, d, e_m, spread_ok, total = _hats(r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, seq, t0, T,
                                                              stride_t, keys, MAX_SPREAD, CHUNK)
    v = _load_chunk(v_ptr, seq, t0, T, stride_t, values, CHUNK)              # 0 on P lines (values < 0)
    if _factored(spread_ok, total + _total(v)):
        X, out = _lines_factored(X, r_t, a_t, b_hat, k_hat, d, e_m, v, DT, PRECISION, CHUNK)
    else:
        X, out = _lines_stepwise(X, log_w_ptr, r_ptr, k_ptr, a_ptr, b_ptr, v_ptr, seq, t0, T, stride_t, keys, values,
                                 CHUNK)
    return X, out


@triton.jit
def _program_group(T, CHUNK: tl.constexpr, GROUP: tl.constexpr):
    """(head b H + h, group, groups per head) of a program whose grid's first axis is (B H groups)."""
    n_groups = tl.cdiv(T, CHUNK * GROUP)
    pid = tl.program_id(0)
    return pid // n_groups, pid % n_groups, n_groups


@triton.jit
def _group_map(maps_ptr, pid_bh, n_groups, g, N: tl.constexpr):
    """Group g's stacked (2 N, N) map of head pid_bh in a (B * H, n_groups, 2 N, N) buffer."""
    return maps_ptr + (pid_bh.to(tl.int64) * n_groups + g) * 2 * N * N


@triton.jit
def _lines(N: tl.constexpr, COLUMNS: tl.constexpr):
    """This program's lines of the stacked [P_G; E_G] (2 N, N), the grid's second axis counting blocks of COLUMNS,
    and their value indices (line - N: below 0 on P lines)."""
    lines = tl.program_id(1) * COLUMNS + tl.arange(0, COLUMNS)
    return lines, lines - N


@triton.jit
def wkv7_chunked_prep_kernel(
    r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr,  # (B, T, H, N) inputs, contiguous, one float dtype (log_w fp32 or it)
    maps_ptr,            # (B * H, n_groups, 2 N, N) fp32 out: each group's [P_G; E_G]
    rows_ptr,            # (B * H, n_groups * GROUP * CHUNK, 2 N) fp32 out: each step's [R' | Y0'] row
    T, H,                # sequence length, heads
    N: tl.constexpr,           # head size, a power of two >= 16
    COLUMNS: tl.constexpr,     # lines per program (the grid's second axis: 2 N / COLUMNS)
    CHUNK: tl.constexpr,       # steps per sub-chunk, 16
    GROUP: tl.constexpr,       # sub-chunks per group
    MAX_SPREAD: tl.constexpr,  # the widest spread of c that a sub-chunk takes in the factored form
    PRECISION: tl.constexpr,   # the fp32 products': "tf32x3" (fp32 inputs) or "tf32"
):
    """One (group, head, block of COLUMNS lines) per program: the lines walk the group's sub-chunks in order,
    X <- X P_s + E_s[lines] from e_i (P lines) or 0 (E lines); before sub-chunk s, R_s X^T (+ Y0_s) are the columns
    of its output rows [R'_s | Y0'_s]; after the last, X is the lines of [P_G; E_G]."""
    DT: tl.constexpr = r_ptr.dtype.element_ty
    pid_bh, g, n_groups = _program_group(T, CHUNK, GROUP)
    _, seq, stride_t = _head_offsets(pid_bh, T, H, N)
    keys = tl.arange(0, N)
    lines, values = _lines(N, COLUMNS)
    X = (lines[:, None] == keys[None, :]).to(tl.float32)                       # e_i on P lines, 0 on E lines
    steps = tl.arange(0, CHUNK)
    row0 = (pid_bh.to(tl.int64) * n_groups + g) * GROUP * CHUNK
    for s in range(GROUP):
        X, out = _subchunk_lines(X, r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr, seq, (g * GROUP + s) * CHUNK, T,
                                 stride_t, keys, values, MAX_SPREAD, DT, PRECISION, CHUNK)
        tl.store(rows_ptr + (row0 + s * CHUNK + steps[:, None]) * 2 * N + lines[None, :], out)
    tl.store(_group_map(maps_ptr, pid_bh, n_groups, g, N) + lines[:, None] * N + keys[None, :], X)


@triton.jit
def wkv7_chunked_scan_kernel(
    maps_ptr,            # (B * H, n_groups, 2 N, N) fp32: each group's [M_G; A_G], X_out = X M_G + A_G
    init_ptr,            # (B, H, N, N) fp32: X entering the walk, read when HAS_INIT (else zeros)
    states_ptr,          # (B * H, n_groups, N, N) fp32 out: X where the walk enters each group
    final_ptr,           # (B, H, N, N) fp32 out: X after the walk
    n_groups,            # groups per head
    N: tl.constexpr,           # head size
    ROWS: tl.constexpr,        # rows of X per program (the grid's second axis: N / ROWS)
    HAS_INIT: tl.constexpr,    # whether init_ptr holds X's start
    REVERSE: tl.constexpr,     # walk from the last group (the backward's dL/dS)
    PRECISION: tl.constexpr,   # "tf32x3" or "tf32"
):
    """The only serial pass: X <- X M_G + A_G over the groups, rows of X evolving independently. The forward walks
    S <- S P_G + E_G; the backward, from the last group, G <- G P_G^T + F_G (its prep stores P_G^T as M_G). One
    product a step; M_G is loaded in its own step, which the compiler pipelines (num_stages = 2: the load of the
    next step's M_G goes to shared memory while this step multiplies); A_G, the product's accumulator, which the
    compiler does not pipeline, is loaded a step ahead by hand."""
    pid_bh = tl.program_id(0)
    n_groups = tl.cast(n_groups, tl.int64)   # the groups' offsets in 64 bits, as every offset here
    rows = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    keys = tl.arange(0, N)
    tile = rows[:, None] * N + keys[None, :]
    square = keys[:, None] * N + keys[None, :]
    head = pid_bh.to(tl.int64) * N * N
    if HAS_INIT:
        X = tl.load(init_ptr + head + tile)
    else:
        X = tl.zeros((ROWS, N), dtype=tl.float32)
    first = n_groups - 1 if REVERSE else 0
    A = tl.load(_group_map(maps_ptr, pid_bh, n_groups, first, N) + N * N + tile)
    for step in range(n_groups):
        g = n_groups - 1 - step if REVERSE else step
        after = g - 1 if REVERSE else g + 1
        A_next = tl.load(_group_map(maps_ptr, pid_bh, n_groups, after, N) + N * N + tile,
                         mask=tile * 0 + step + 1 < n_groups, other=0.0)   # a tensor mask (interpreter)
        M = tl.load(_group_map(maps_ptr, pid_bh, n_groups, g, N) + square)
        tl.store(_checkpoint(states_ptr, pid_bh, n_groups, g, N) + tile, X)
        X = _fdot(X, M, PRECISION) + A
        A = A_next
    tl.store(final_ptr + head + tile, _nan_unless_finite(X))


@triton.jit
def wkv7_chunked_output_kernel(
    rows_ptr,            # (B * H, n_groups * GROUP * CHUNK, 2 N) fp32: the prep kernel's [R' | Y0'] rows
    states_ptr,          # (B * H, n_groups, N, N) fp32: the state entering each group
    y_ptr,               # (B, T, H, N) out, the input dtype
    T, H,                # sequence length, heads
    N: tl.constexpr,           # head size
    COLUMNS: tl.constexpr,     # columns of y per program (the grid's second axis: N / COLUMNS)
    CHUNK: tl.constexpr,       # steps per sub-chunk
    GROUP: tl.constexpr,       # sub-chunks per group: a program's rows are the group's GROUP * CHUNK steps
    PRECISION: tl.constexpr,   # "tf32x3" or "tf32"
):
    """One (group, head, block of COLUMNS values) per program: Y[:, values] = R' S_G[values]^T + Y0'[:, values]."""
    pid_bh, g, n_groups = _program_group(T, CHUNK, GROUP)
    _, seq, stride_t = _head_offsets(pid_bh, T, H, N)
    keys = tl.arange(0, N)
    values = tl.program_id(1) * COLUMNS + tl.arange(0, COLUMNS)
    steps = tl.arange(0, GROUP * CHUNK)
    row = ((pid_bh.to(tl.int64) * n_groups + g) * GROUP * CHUNK + steps[:, None]) * 2 * N
    S = tl.load(_checkpoint(states_ptr, pid_bh, n_groups, g, N) + values[:, None] * N + keys[None, :])
    Y = _fdot(tl.load(rows_ptr + row + keys[None, :]), tl.trans(S), PRECISION) + tl.load(rows_ptr + row + N
                                                                                         + values[None, :])
    _store_chunk(y_ptr, _nan_unless_finite(Y), seq, g * GROUP * CHUNK, T, stride_t, values, GROUP * CHUNK)


def _precision(dtype) -> str:
    """The fp32 products' input precision: tf32x3 for fp32 inputs (fp32's accuracy on the tensor cores; one tf32
    product misses their budget, 1e-4), tf32 for fp16 and bf16 (inside their budgets with room)."""
    return "tf32x3" if dtype == torch.float32 else "tf32"


def _parallel_launch_config(N) -> Launch:
    """The parallel kernels' (prep, output): COLUMNS lines or values a program, PARALLEL_WARPS warps."""
    return Launch({"COLUMNS": min(COLUMNS, N)}, num_warps=PARALLEL_WARPS)


def group_size(dtype) -> int:
    """Sub-chunks per group, the forward's and the backward's: GROUP for fp16/bf16 inputs; 1 for fp32 inputs (their
    prep kernel with GROUP sub-chunks a program needs an 8-byte stack on sm_80, the backward's prep 56 bytes and its
    sub-chunk states kernel 104 on sm_90: their tf32x3 products split every operand in two; with one, none, and the
    forward's group states are the backward's sub-chunk states)."""
    return 1 if dtype == torch.float32 else GROUP


def _scan_launch_config(N) -> Launch:
    """The scan's: SCAN_ROWS rows of the state a program, 4 warps, two stages (the next group's map loads while this
    one multiplies)."""
    return Launch({"ROWS": min(SCAN_ROWS, N)}, num_warps=4, num_stages=2)


def _sizes(T, group):
    """(sub-chunks, groups) of a sequence of T steps, ``group`` sub-chunks a group."""
    n_sub = triton.cdiv(T, CHUNK)
    return n_sub, triton.cdiv(n_sub, group)


def _grouping(T, dtype):
    """(sub-chunks per group, sub-chunks, groups) of T steps of inputs of ``dtype``, the forward's and the backward's
    (group_size, looked up here when called: tests replace it)."""
    group = group_size(dtype)
    return (group, *_sizes(T, group))


def _scan(maps, init, states, final, n_groups, reverse, precision):
    """Launches the scan over maps (B * H, n_groups, 2 N, N) from init (or zeros), into states and final."""
    N = maps.shape[-1]
    cfg = _scan_launch_config(N)
    wkv7_chunked_scan_kernel[(maps.shape[0], N // cfg["ROWS"])](
        maps, init if init is not None else final, states, final, n_groups, N=N, **cfg.blocks,
        HAS_INIT=init is not None, REVERSE=reverse, PRECISION=precision, **cfg.options)


def _chunked_fwd(r, log_w, k, v, a, b, state0, y, state, max_spread):
    """Launches the chunked forward into y and state; returns the state entering each group (B * H, groups, N, N),
    which the output kernel reads, and the backward (kernels/wkv7/triton_chunked_bwd.py) after it. max_spread: the
    widest spread of c a sub-chunk takes in the factored form."""
    B, T, H, N = r.shape
    cfg = _parallel_launch_config(N)
    group, _, n_groups = _grouping(T, r.dtype)
    precision = _precision(r.dtype)
    shared = dict(N=N, CHUNK=CHUNK, GROUP=group, PRECISION=precision, **cfg.blocks)
    maps = new_output((B * H, n_groups, 2 * N, N), torch.float32, r.device)                # [P_G; E_G]
    rows = new_output((B * H, n_groups * group * CHUNK, 2 * N), torch.float32, r.device)  # [R' | Y0']
    states = new_output((B * H, n_groups, N, N), torch.float32, r.device)
    wkv7_chunked_prep_kernel[(B * H * n_groups, 2 * N // cfg["COLUMNS"])](r, log_w, k, v, a, b, maps, rows, T, H,
                                                                        MAX_SPREAD=max_spread, **shared,
                                                                        **cfg.options)
    _scan(maps, state0, states, state, n_groups, False, precision)
    wkv7_chunked_output_kernel[(B * H * n_groups, N // cfg["COLUMNS"])](rows, states, y, T, H, **shared,
                                                                      **cfg.options)
    return states
