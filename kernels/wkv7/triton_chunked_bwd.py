"""The backward of ``wkv7(..., backend="triton_chunked")``: the chunked backward of the previous design, kept while
the backward of issue 46 (a parallel prep, a serial pass of one product per 64-step group, every group's gradients
with all value rows in one program) is not free of spills (docs/wip/README.md). It reads the state entering every
16-step chunk, which the forward (kernels/wkv7/triton_chunked.py) stores when a gradient is wanted: its groups are then
single chunks (GROUP = 1), so that its group states are these chunk states. Private: kernels/wkv7/__init__.py
dispatches here.

Glossary: kernels/wkv7/triton_chunked.py's. Per chunk, with Z = a~ S_0^T + A_ak V and U = T_inv Z (rows
u_i = S_{i-1} a_i), Y = r~ S_0^T + Q_rb U + Q_rk V and S_L = S_0 diag(d) + U^T B^ + V^T K^. Given dY (L, N_v) and
G = dL/dS_L (N_v, N_k), reverse-mode through these lines (the derivation was checked in float64 against autograd of
the step-by-step recurrence; the tests check the kernels against it):

    dU = Q_rb^T dY + B^ G^T,   dZ = T_inv^T dU,   dV = Q_rk^T dY + K^ G^T + A_ak^T dZ
    dA_ab = tril_{j<i}(dZ U^T)   (from d(M^{-1}) = -M^{-1} dM M^{-1}: T_inv^T dU Z^T T_inv^T = dZ U^T)
    dA_ak = tril_{j<i}(dZ V^T),   dQ_rb = tril_{j<=i}(dY U^T),   dQ_rk = tril_{j<=i}(dY V^T)
    dS_0 = G diag(d) + dY^T r~ + dZ^T a~ = G diag(d) + (B^ G^T)^T W + dY^T (r~ + Q_rb W)

and into the inputs (the couplings' parts through the centred factors):

    da_i = e^{c_{i-1}} (dZ S_0)_i + e^{c_{i-1}} (dA_ab b e^{-c} + dA_ak k e^{-c})_i
    dr_i = e^{c_i} (dY S_0)_i + e^{c_i} (dQ_rb b e^{-c} + dQ_rk k e^{-c})_i
    db_j = e^{-c_j} (dA_ab^T a~ + dQ_rb^T r~)_j + e^{c_L - c_j} (U G)_j        (coupling part + end part)
    dk_j = e^{-c_j} (dA_ak^T a~ + dQ_rk^T r~)_j + e^{c_L - c_j} (V G)_j

Every exponential above meets its input as x e^{+-c}, so the log decays' gradient needs only products with the raw
inputs: log_w_t enters c_i for i >= t (within its chunk; the next chunk sees it through d), c_{i-1} of a~_i for i > t,
and -c_j of B^, K^ for j >= t, whose c_L cancels it: their share is the sum over j < t. With dd = colsum(G * S_0):

    dlog_w_t = sum_{i>=t} (dr r - db_cpl b - dk_cpl k)_i + sum_{i>t} (da a)_i + sum_{j<t} (db_end b + dk_end k)_j
               + dd d

Two kernels. wkv7_chunked_dstate_kernel is the only serial pass: per (batch, head, 16 value rows) it walks the
chunks from the last, storing each chunk's G and taking dS_0 by the last line above (it needs W and r~ + Q_rb W:
nothing of the states). wkv7_chunked_bwd_kernel then takes every (chunk, batch, head, 16 value rows) at once: the
chunk's S_0 is the one the forward saved, its G the first kernel's; nothing left is serial. dv is complete per
program; the key-vector gradients (dr, dlog_w, dk, da, db) are sums over value rows, stored per row block in a
(N / 16, 5, B, T, H, N) buffer and summed once by the wrapper, as the sequential backward does (no atomics). Every
tile is (16, 16), in loops over blocks of 16 keys, G kept in the dS_0 buffer between them: that is what keeps them
free of spills (fp32 inputs take IEEE products on 8 warps).

A chunk whose decays spread beyond the factored form's range or that holds an inf or NaN takes its steps one at a
time in both kernels, decided on the device: G is stepped back by G <- (G + dy r^T) diag(w) + (G + dy r^T) b a^T, and
the gradients follow wkv7_bwd_kernel's step, each step's entering state re-run from S_0 (a chunk's L (L - 1) / 2
steps: such chunks are rare), in registers: these paths have no products, so (16, N) tiles fit.

What an H100 measured for these two kernels (benchmarks/README.md, run 5): 1.17 ms (dstate) and 0.94 ms (bwd) in
bf16 at B 1, T 2048, H 12, N 64: 128 serial chunks whose couplings and inverse sit on the serial path, and a
(4, 5, B, T, H, N) partial-sum buffer.
"""
from __future__ import annotations

import torch

from .._common import Launch, new_output, tl, triton
from ._triton_common import _checkpoint, _head_offsets, _step
from .triton_chunked import CHUNK, CHUNKED_BLOCK_K, _centred, _chunk_keys, _load_chunk, _lower, _store_chunk, _vector

__all__ = []   # private: the op is kernels/wkv7's wkv7 (backend="triton_chunked")


@triton.jit
def _dot(x, y, DT: tl.constexpr):
    """x @ y accumulated in fp32. fp32 inputs (DT): fp32 products (no TF32: the factored couplings carry factors up
    to e^DECAY_RANGE); fp16 / bf16: operands rounded to DT, on the tensor cores."""
    if DT == tl.float32:
        return tl.dot(x, y, input_precision="ieee")
    else:
        return tl.dot(x.to(DT), y.to(DT), out_dtype=tl.float32)


@triton.jit
def _fdot(x, y, DT: tl.constexpr):
    """x @ y of fp32 operands accumulated in fp32, for every product that carries a state, the inverse or a result of
    other products: fp32 inputs (DT) take IEEE fp32 products, fp16 / bf16 inputs tf32 ones on the tensor cores.
    Rounded to fp16 instead, as they were, those operands cost the fp16 gradients on correlated keys (nearly parallel
    unit keys, weak decays) 30-100x the error the inputs' own rounding explains (review K1: d/db 1.4e-1 against
    1.1e-3); with tf32 operands, 7e-4."""
    if DT == tl.float32:
        return tl.dot(x, y, input_precision="ieee")
    else:
        return tl.dot(x, y, input_precision="tf32")


@triton.jit
def _start_rows(dst, src, rows, COPY: tl.constexpr, N: tl.constexpr, BLOCK_K: tl.constexpr):
    """This program's rows of an (N, N) matrix copied from src into the working buffer dst (zeros without COPY),
    BLOCK_K keys at a time."""
    for k0 in range(0, N, BLOCK_K):
        tile = rows[:, None] * N + (k0 + tl.arange(0, BLOCK_K))[None, :]
        if COPY:
            tl.store(dst + tile, tl.load(src + tile))
        else:
            tl.store(dst + tile, tl.zeros((rows.shape[0], BLOCK_K), dtype=tl.float32))


@triton.jit
def _add_couplings(A_ab, A_ak, Q_rb, Q_rk, r, k, a, b, c, c_prev, c_end, DT: tl.constexpr):
    """The couplings plus this key block's share (before their triangles are taken): a~ (b e^{-c})^T,
    a~ (k e^{-c})^T, r~ (b e^{-c})^T, r~ (k e^{-c})^T, each a product of centred factors."""
    a_c, r_c, b_c, k_c = _centred(r, k, a, b, c, c_prev, c_end)
    return (A_ab + _dot(a_c, b_c, DT), A_ak + _dot(a_c, k_c, DT), Q_rb + _dot(r_c, b_c, DT),
            Q_rk + _dot(r_c, k_c, DT))


@triton.jit
def _spread(c_hi, c_lo, total, c, x):
    """Running max(c, 0), min(c, 0) and a sum that is finite only while every input is (inf - inf = NaN): x's and c's,
    which sums log_w. The sum is the only NaN test: tl.max and tl.min drop NaN (maxnum on a GPU, fmax in the
    interpreter), so a NaN log_w (or +inf, which finite_log_decay makes NaN) passed the spread as in range, and its
    key's centring made the whole chunk NaN (review F1)."""
    c_hi = tl.maximum(c_hi, tl.max(tl.max(c, axis=1), axis=0))
    c_lo = tl.minimum(c_lo, tl.min(tl.min(c, axis=1), axis=0))
    return c_hi, c_lo, total + tl.sum(tl.sum(x + c, axis=1), axis=0)


@triton.jit
def _factored(c_hi, c_lo, total, MAX_SPREAD: tl.constexpr):
    """Whether a chunk takes the factored form: c spreads at most MAX_SPREAD (_factors_in_range) and every input is
    finite (0 * NaN in a chunk's products would reach its earlier steps)."""
    return (c_hi - c_lo <= MAX_SPREAD) & (total - total == 0.0)


@triton.jit
def _unit_lower_inverse(A, i, DT: tl.constexpr, CHUNK: tl.constexpr):
    """(I - A)^{-1} = (I + A)(I + A^2)(I + A^4)(I + A^8) for strictly lower-triangular A (CHUNK, CHUNK): A^16 = 0."""
    tl.static_assert(CHUNK == 16, "four factors (I + A^(2^m)) invert I - A only while A^16 = 0")
    inverse = (i[:, None] == i[None, :]).to(tl.float32) + A
    power = A
    for _ in tl.static_range(3):
        power = _fdot(power, power, DT)
        inverse += _fdot(inverse, power, DT)
    return inverse


@triton.jit
def _step_back(G, r, w, a, b, dy):
    """dL/dS_{t-1} from G = dL/dS_t (rows of both): y_t = S_t r_t adds dy r^T, then S_t = S_{t-1} diag(w) +
    (S_{t-1} a) b^T + v k^T gives (G + dy r^T)(diag(w) + b a^T). Returns (it, G + dy r^T, (G + dy r^T) b)."""
    G += dy[:, None] * r[None, :]
    q = tl.sum(G * b[None, :], axis=1)                                  # G b_t = dL/d(S_{t-1} a_t)
    return G * w[None, :] + q[:, None] * a[None, :], G, q


@triton.jit
def wkv7_chunked_dstate_kernel(
    r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr,  # (B, T, H, N) inputs of the forward, contiguous
    dy_ptr,              # (B, T, H, N) gradient of y, contiguous, input dtype
    dstate_ptr,          # (B, H, N, N) fp32 gradient of the final state, read when HAS_DSTATE
    dstates_ptr,         # (B * H, cdiv(T, CHUNK), N, N) fp32: dL/dS at each chunk's end
    dstate0_ptr,         # (B, H, N, N) fp32: G as it walks back (each program its rows), then dL/dS_0
    T, H,                # sequence length, heads
    N: tl.constexpr,         # head size, a power of two >= 16
    BLOCK_V: tl.constexpr,   # value rows per program, 16
    BLOCK_K: tl.constexpr,   # keys per step of the loops over keys, 16
    CHUNK: tl.constexpr,     # steps per chunk, 16: the forward's checkpoint interval
    MAX_SPREAD: tl.constexpr,  # the widest spread of c that a chunk takes in the factored form
    HAS_DSTATE: tl.constexpr,  # the final state has a gradient (else it is zero)
):
    """The serial pass of the chunked backward: G = dL/dS walked back chunk by chunk, dS_0 = G diag(d) +
    (B^ G^T)^T W + dY^T (r~ + Q_rb W) (module docstring), each chunk's G stored on the way. Like the forward, G lives
    in dstate0_ptr so that every product is of (16, 16) tiles."""
    DT: tl.constexpr = r_ptr.dtype.element_ty
    pid_bh = tl.program_id(0)
    pid_v = tl.program_id(1)
    rows = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    head_state, seq, stride_t = _head_offsets(pid_bh, T, H, N)
    _start_rows(dstate0_ptr + head_state, dstate_ptr + head_state, rows, HAS_DSTATE, N, BLOCK_K)   # dL/dS_T
    i = tl.arange(0, CHUNK)
    n_chunks = tl.cdiv(T, CHUNK)
    for back in range(n_chunks):
        chunk = n_chunks - 1 - back
        t0 = chunk * CHUNK
        tl.debug_barrier()                           # G stored by all threads is read below
        A_ab = tl.zeros((CHUNK, CHUNK), dtype=tl.float32)
        Q_rb = tl.zeros((CHUNK, CHUNK), dtype=tl.float32)
        BG = tl.zeros((CHUNK, BLOCK_V), dtype=tl.float32)   # B^ G^T
        c_hi = 0.0
        c_lo = 0.0
        total = 0.0
        for k0 in range(0, N, BLOCK_K):
            keys = k0 + tl.arange(0, BLOCK_K)
            tile = rows[:, None] * N + keys[None, :]
            G = tl.load(dstate0_ptr + head_state + tile)                    # (BLOCK_V, BLOCK_K)
            tl.store(_checkpoint(dstates_ptr, pid_bh, n_chunks, chunk, N) + tile, G)
            r, k, a, b, c, c_prev, c_end = _chunk_keys(r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, seq, t0, T, stride_t,
                                                       keys, CHUNK)
            c_hi, c_lo, total = _spread(c_hi, c_lo, total, c, r + k + a + b)
            # A_ak and Q_rk are not needed here (nor computed: the compiler drops what nothing reads)
            A_ab, _, Q_rb, _ = _add_couplings(A_ab, 0.0, Q_rb, 0.0, r, k, a, b, c, c_prev, c_end, DT)
            BG += _fdot(b * tl.exp(c_end - c), tl.trans(G), DT)
        dy = _load_chunk(dy_ptr, seq, t0, T, stride_t, rows, CHUNK)        # (CHUNK, BLOCK_V)
        v = _load_chunk(v_ptr, seq, t0, T, stride_t, rows, CHUNK)
        factored = _factored(c_hi, c_lo, total + tl.sum(tl.sum(v, axis=1), axis=0), MAX_SPREAD)
        tl.debug_barrier()                           # every thread has read G before it changes
        if factored:
            T_inv = _unit_lower_inverse(_lower(A_ab, i, True), i, DT, CHUNK)
            Q_rb = _lower(Q_rb, i, False)
            for k0 in range(0, N, BLOCK_K):
                keys = k0 + tl.arange(0, BLOCK_K)
                tile = rows[:, None] * N + keys[None, :]
                r, k, a, b, c, c_prev, c_end = _chunk_keys(r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, seq, t0, T,
                                                           stride_t, keys, CHUNK)
                W = _fdot(T_inv, a * tl.exp(c_prev), DT)                       # T_inv a~
                R = r * tl.exp(c) + _fdot(Q_rb, W, DT)                          # r~ + Q_rb W
                # dS_0 = G diag(d) + (B^ G^T)^T W + dY^T R
                G = tl.load(dstate0_ptr + head_state + tile) * tl.exp(c_end)
                G += _fdot(tl.trans(BG), W, DT) + _fdot(tl.trans(dy), R, DT)
                tl.store(dstate0_ptr + head_state + tile, G)
        else:                                        # step by step, G in registers
            keys = tl.arange(0, N)
            tile = rows[:, None] * N + keys[None, :]
            G = tl.load(dstate0_ptr + head_state + tile)
            for jj in range(CHUNK):
                t = t0 + CHUNK - 1 - jj
                off = seq + t * stride_t
                G, _, _ = _step_back(G, _vector(r_ptr, off, keys, t, T), tl.exp(_vector(log_w_ptr, off, keys, t, T)),
                                     _vector(a_ptr, off, keys, t, T), _vector(b_ptr, off, keys, t, T),
                                     _vector(dy_ptr, off, rows, t, T))
            tl.store(dstate0_ptr + head_state + tile, G)


@triton.jit
def _step_forward(S, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr, off, keys, rows, t, T):
    """Step t on rows S (BLOCK_V, N) of the state, from memory."""
    return _step(S, tl.exp(_vector(log_w_ptr, off, keys, t, T)), _vector(k_ptr, off, keys, t, T),
                 _vector(v_ptr, off, rows, t, T), _vector(a_ptr, off, keys, t, T), _vector(b_ptr, off, keys, t, T))


@triton.jit
def _stepwise_gradients(r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr, dy_ptr, dkeys_ptr, dv_ptr, S0, G, numel, seq,
                        stride_t, rows, t0, T, N: tl.constexpr, CHUNK: tl.constexpr):
    """The gradients of steps t0 .. t0 + CHUNK - 1 one at a time, walking back from G = dL/dS at the chunk's end,
    as wkv7_bwd_kernel takes them (its formulas); each step's entering state S_{t-1} is re-run from S0 (this
    program's rows, (BLOCK_V, N) in registers)."""
    keys = tl.arange(0, N)
    for jj in range(CHUNK):
        t = t0 + CHUNK - 1 - jj
        S_prev = S0
        for s in range(t0, t):
            S_prev = _step_forward(S_prev, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr, seq + s * stride_t, keys, rows, s, T)
        off = seq + t * stride_t
        w = tl.exp(_vector(log_w_ptr, off, keys, t, T))
        k, v = _vector(k_ptr, off, keys, t, T), _vector(v_ptr, off, rows, t, T)
        a, b = _vector(a_ptr, off, keys, t, T), _vector(b_ptr, off, keys, t, T)
        dy = _vector(dy_ptr, off, rows, t, T)
        sa = tl.sum(S_prev * a[None, :], axis=1)                      # S_{t-1} a_t
        # dr = S_t^T dy, with S_t = S_{t-1} diag(w) + sa b^T + v k^T expanded
        dr = w * tl.sum(S_prev * dy[:, None], axis=0) + b * tl.sum(sa * dy) + k * tl.sum(v * dy)
        G_prev, G, q = _step_back(G, _vector(r_ptr, off, keys, t, T), w, a, b, dy)   # G: dL/dS_t, with dy r^T
        # dr, dlog_w = w colsum(G S_{t-1}), dk = G^T v, da = S_{t-1}^T q, db = G^T (S_{t-1} a): this row block's share
        live = keys * 0 + t < T
        tl.store(dkeys_ptr + off + keys, dr, mask=live)
        tl.store(dkeys_ptr + numel + off + keys, w * tl.sum(G * S_prev, axis=0), mask=live)
        tl.store(dkeys_ptr + 2 * numel + off + keys, tl.sum(G * v[:, None], axis=0), mask=live)
        tl.store(dkeys_ptr + 3 * numel + off + keys, tl.sum(S_prev * q[:, None], axis=0), mask=live)
        tl.store(dkeys_ptr + 4 * numel + off + keys, tl.sum(G * sa[:, None], axis=0), mask=live)
        tl.store(dv_ptr + off + rows, tl.sum(G * k[None, :], axis=1), mask=rows * 0 + t < T)
        G = G_prev


@triton.jit
def _chunk_sums(r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, state0, dstate, seq, t0, T, stride_t, rows, N: tl.constexpr,
                BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr, DT: tl.constexpr):
    """wkv7_chunked_bwd_kernel's first loop over key blocks: the couplings A_ab, A_ak, Q_rb, Q_rk (CHUNK, CHUNK);
    a~ S_0^T, B^ G^T and K^ G^T (CHUNK, BLOCK_V) for this program's rows (state0, dstate: the chunk's entering state
    and the gradient of its final state); and the spread of c (c_hi, c_lo, total) that decides the factored form."""
    A_ab = tl.zeros((CHUNK, CHUNK), dtype=tl.float32)
    A_ak = tl.zeros((CHUNK, CHUNK), dtype=tl.float32)
    Q_rb = tl.zeros((CHUNK, CHUNK), dtype=tl.float32)
    Q_rk = tl.zeros((CHUNK, CHUNK), dtype=tl.float32)
    aS = tl.zeros((CHUNK, BLOCK_V), dtype=tl.float32)   # a~ S_0^T
    BG = tl.zeros((CHUNK, BLOCK_V), dtype=tl.float32)   # B^ G^T
    KG = tl.zeros((CHUNK, BLOCK_V), dtype=tl.float32)   # K^ G^T
    c_hi = 0.0
    c_lo = 0.0
    total = 0.0
    for k0 in range(0, N, BLOCK_K):
        keys = k0 + tl.arange(0, BLOCK_K)
        tile = rows[:, None] * N + keys[None, :]
        r, k, a, b, c, c_prev, c_end = _chunk_keys(r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, seq, t0, T, stride_t, keys,
                                                   CHUNK)
        c_hi, c_lo, total = _spread(c_hi, c_lo, total, c, r + k + a + b)
        A_ab, A_ak, Q_rb, Q_rk = _add_couplings(A_ab, A_ak, Q_rb, Q_rk, r, k, a, b, c, c_prev, c_end, DT)
        G_T = tl.trans(tl.load(dstate + tile))                          # (BLOCK_K, BLOCK_V)
        to_end = tl.exp(c_end - c)                                       # e^{c_L - c_j}
        aS += _fdot(a * tl.exp(c_prev), tl.trans(tl.load(state0 + tile)), DT)
        BG += _fdot(b * to_end, G_T, DT)
        KG += _fdot(k * to_end, G_T, DT)
    return A_ab, A_ak, Q_rb, Q_rk, aS, BG, KG, c_hi, c_lo, total


@triton.jit
def _factored_key_gradients(r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, dkeys_ptr, state0, dstate, numel, seq, t0, T,
                            stride_t, rows, U, v, dy, dZ, dA_ab, dA_ak, dQ_rb, dQ_rk, N: tl.constexpr,
                            BLOCK_K: tl.constexpr, CHUNK: tl.constexpr, DT: tl.constexpr):
    """wkv7_chunked_bwd_kernel's second loop over key blocks, in the factored form: from U, v, dy, dZ and the
    couplings' gradients, this program's rows' share of dr, dlog_w, dk, da, db, stored into dkeys_ptr."""
    for k0 in range(0, N, BLOCK_K):
        keys = k0 + tl.arange(0, BLOCK_K)
        tile = rows[:, None] * N + keys[None, :]
        r, k, a, b, c, c_prev, c_end = _chunk_keys(r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, seq, t0, T, stride_t,
                                                   keys, CHUNK)
        a_c, r_c, b_c, k_c = _centred(r, k, a, b, c, c_prev, c_end)
        m = 0.5 * c_end
        S0 = tl.load(state0 + tile)                                       # (BLOCK_V, BLOCK_K)
        G = tl.load(dstate + tile)
        to_end = tl.exp(c_end - c)
        da = (_fdot(dZ, S0, DT) * tl.exp(c_prev)
              + (_fdot(dA_ab, tl.trans(b_c), DT) + _fdot(dA_ak, tl.trans(k_c), DT)) * tl.exp(c_prev - m))
        dr = (_fdot(dy, S0, DT) * tl.exp(c)
              + (_fdot(dQ_rb, tl.trans(b_c), DT) + _fdot(dQ_rk, tl.trans(k_c), DT)) * tl.exp(c - m))
        up = tl.exp(m - c)
        db_cpl = (_fdot(tl.trans(dA_ab), a_c, DT) + _fdot(tl.trans(dQ_rb), r_c, DT)) * up
        dk_cpl = (_fdot(tl.trans(dA_ak), a_c, DT) + _fdot(tl.trans(dQ_rk), r_c, DT)) * up
        db_end = _fdot(U, G, DT) * to_end
        dk_end = _fdot(v, G, DT) * to_end
        # dlog_w_t = sum_{i>=t} (dr r - db_cpl b - dk_cpl k)_i + sum_{i>t} (da a)_i
        #            + sum_{j<t} (db_end b + dk_end k)_j + dd d,   dd = colsum(G * S_0)
        after = da * a
        before = db_end * b + dk_end * k
        dlog_w = (tl.cumsum(dr * r - db_cpl * b - dk_cpl * k + after, axis=0, reverse=True) - after
                  + tl.cumsum(before, axis=0) - before + (tl.sum(G * S0, axis=0)[None, :] * tl.exp(c_end)))
        _store_chunk(dkeys_ptr, dr, seq, t0, T, stride_t, keys, CHUNK)
        _store_chunk(dkeys_ptr + numel, dlog_w, seq, t0, T, stride_t, keys, CHUNK)
        _store_chunk(dkeys_ptr + 2 * numel, dk_cpl + dk_end, seq, t0, T, stride_t, keys, CHUNK)
        _store_chunk(dkeys_ptr + 3 * numel, da, seq, t0, T, stride_t, keys, CHUNK)
        _store_chunk(dkeys_ptr + 4 * numel, db_cpl + db_end, seq, t0, T, stride_t, keys, CHUNK)


@triton.jit
def wkv7_chunked_bwd_kernel(
    r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr,  # (B, T, H, N) inputs of the forward, contiguous
    dy_ptr,              # (B, T, H, N) gradient of y, contiguous, input dtype
    ckpt_ptr,            # (B * H, cdiv(T, CHUNK), N, N) fp32: the state entering each chunk (the forward's)
    dstates_ptr,         # (B * H, cdiv(T, CHUNK), N, N) fp32: dL/dS at each chunk's end (wkv7_chunked_dstate_kernel)
    dkeys_ptr,           # (N / BLOCK_V, 5, B, T, H, N) fp32: dr, dlog_w, dk, da, db, this program's rows' share
    dv_ptr,              # (B, T, H, N) fp32 gradient of v
    T, H,                # sequence length, heads
    N: tl.constexpr,         # head size, a power of two >= 16
    BLOCK_V: tl.constexpr,   # value rows per program, 16
    BLOCK_K: tl.constexpr,   # keys per step of the loops over keys, 16
    CHUNK: tl.constexpr,     # steps per chunk, 16: the forward's checkpoint interval
    MAX_SPREAD: tl.constexpr,  # the widest spread of c that a chunk takes in the factored form
):
    """One chunk's gradients (module docstring) from its entering state and the gradient of its final state: one
    program per (chunk, batch, head) on axis 0 (no grid limit of 65,535) and per 16 value rows on axis 1. A first
    loop over key blocks sums the couplings, a~ S_0^T, B^ G^T and K^ G^T; then U, dU, dZ, dV and the couplings'
    gradients; a second loop over key blocks takes the key-vector gradients."""
    DT: tl.constexpr = r_ptr.dtype.element_ty
    n_chunks = tl.cdiv(T, CHUNK)
    pid = tl.program_id(0)                           # (batch * H + head) * n_chunks + chunk
    pid_bh = pid // n_chunks
    chunk = pid % n_chunks
    pid_v = tl.program_id(1)
    t0 = chunk * CHUNK
    rows = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    _, seq, stride_t = _head_offsets(pid_bh, T, H, N)
    numel = (tl.num_programs(0) // n_chunks).to(tl.int64) * T * N   # B * T * H * N
    dkeys_ptr += pid_v * 5 * numel                                    # this row block's partial sums
    state0 = _checkpoint(ckpt_ptr, pid_bh, n_chunks, chunk, N)
    dstate = _checkpoint(dstates_ptr, pid_bh, n_chunks, chunk, N)
    i = tl.arange(0, CHUNK)
    A_ab, A_ak, Q_rb, Q_rk, aS, BG, KG, c_hi, c_lo, total = _chunk_sums(
        r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, state0, dstate, seq, t0, T, stride_t, rows, N, BLOCK_V, BLOCK_K, CHUNK,
        DT)
    v = _load_chunk(v_ptr, seq, t0, T, stride_t, rows, CHUNK)              # (CHUNK, BLOCK_V)
    dy = _load_chunk(dy_ptr, seq, t0, T, stride_t, rows, CHUNK)
    if _factored(c_hi, c_lo, total + tl.sum(tl.sum(v, axis=1), axis=0), MAX_SPREAD):
        A_ak = _lower(A_ak, i, True)
        Q_rb = _lower(Q_rb, i, False)
        Q_rk = _lower(Q_rk, i, False)
        T_inv = _unit_lower_inverse(_lower(A_ab, i, True), i, DT, CHUNK)
        U = _fdot(T_inv, aS + _fdot(A_ak, v, DT), DT)                          # T_inv Z
        dZ = _fdot(tl.trans(T_inv), _fdot(tl.trans(Q_rb), dy, DT) + BG, DT)    # T_inv^T dU, dU = Q_rb^T dY + B^ G^T
        # dV = Q_rk^T dY + K^ G^T + A_ak^T dZ
        _store_chunk(dv_ptr, _fdot(tl.trans(Q_rk), dy, DT) + KG + _fdot(tl.trans(A_ak), dZ, DT), seq, t0, T, stride_t,
                     rows, CHUNK)
        dA_ab = _lower(_fdot(dZ, tl.trans(U), DT), i, True)
        dA_ak = _lower(_fdot(dZ, tl.trans(v), DT), i, True)
        dQ_rb = _lower(_fdot(dy, tl.trans(U), DT), i, False)
        dQ_rk = _lower(_fdot(dy, tl.trans(v), DT), i, False)
        _factored_key_gradients(r_ptr, log_w_ptr, k_ptr, a_ptr, b_ptr, dkeys_ptr, state0, dstate, numel, seq, t0, T,
                                stride_t, rows, U, v, dy, dZ, dA_ab, dA_ak, dQ_rb, dQ_rk, N, BLOCK_K, CHUNK, DT)
    else:
        keys = tl.arange(0, N)
        tile = rows[:, None] * N + keys[None, :]
        _stepwise_gradients(r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr, dy_ptr, dkeys_ptr, dv_ptr,
                            tl.load(state0 + tile), tl.load(dstate + tile), numel, seq, stride_t, rows, t0, T, N,
                            CHUNK)


def _backward_launch_config(N) -> Launch:
    """The backward's: 16 value rows per program, tl.dot's smallest tile; its tiles are (16, 16), one element a
    thread over 8 warps (fp32 inputs at 4 warps need 168-255 registers and a stack)."""
    return Launch({"BLOCK_V": 16, "BLOCK_K": CHUNKED_BLOCK_K}, num_warps=8)


def _chunked_bwd(r, log_w, k, v, a, b, ckpt, dy, dstate, max_spread):
    """The chunked backward from the forward's chunk states: the serial pass over chunks, then every chunk's
    gradients at once; returns dkeys (N / 16, 5, B, T, H, N): per row block dr, dlog_w, dk, da, db, and dv, dS_0."""
    B, T, H, N = r.shape
    cfg = _backward_launch_config(N)
    n_chunks = triton.cdiv(T, CHUNK)
    blocks = N // cfg["BLOCK_V"]
    shared = dict(N=N, **cfg.blocks, CHUNK=CHUNK, MAX_SPREAD=max_spread, **cfg.options)
    dstates = new_output((B * H, n_chunks, N, N), torch.float32, r.device)
    dstate0 = new_output((B, H, N, N), torch.float32, r.device)
    wkv7_chunked_dstate_kernel[(B * H, blocks)](
        r, log_w, k, v, a, b, dy, dstate if dstate is not None else dstate0, dstates, dstate0, T, H,
        HAS_DSTATE=dstate is not None, **shared)
    dkeys = new_output((blocks, 5, B, T, H, N), torch.float32, r.device)
    dv = new_output((B, T, H, N), torch.float32, r.device)
    wkv7_chunked_bwd_kernel[(B * H * n_chunks, blocks)](r, log_w, k, v, a, b, dy, ckpt, dstates, dkeys, dv, T, H,
                                                        **shared)
    return dkeys, dv, dstate0


def chunked_aot_kernels(N, dtype, types, max_spread):
    """The chunked kernels' AOT builds (kernels/aot.py) at head size N for inputs of ``dtype`` ("fp32" or "bf16"),
    with kernels/wkv7's argument types: the forward's three, its prep and output kernels for each group size they
    run at (bf16: GROUP sub-chunks, and one with a gradient, labelled "grad"; fp32: one), and the backward's two."""
    from ..aot import AotKernel
    from .triton_chunked import (_parallel_launch_config, _precision, _scan_launch_config, group_size,
                                 wkv7_chunked_output_kernel, wkv7_chunked_prep_kernel, wkv7_chunked_scan_kernel)
    torch_dtype = torch.float32 if dtype == "fp32" else torch.bfloat16
    parallel, scan, backward = _parallel_launch_config(N), _scan_launch_config(N), _backward_launch_config(N)
    precision = _precision(torch_dtype)
    builds = [(f"wkv7_chunked_fwd_scan N={N} {dtype}", wkv7_chunked_scan_kernel,
               {"N": N, **scan.blocks, "HAS_INIT": True, "REVERSE": False, "PRECISION": precision}, scan)]
    sizes = {group_size(torch_dtype, True): " grad"}
    sizes[group_size(torch_dtype, False)] = ""          # fp32: one size, both uses
    for group, label in sizes.items():
        groups = {"N": N, **parallel.blocks, "CHUNK": CHUNK, "GROUP": group, "PRECISION": precision}
        builds += [(f"wkv7_chunked_fwd_prep{label} N={N} {dtype}", wkv7_chunked_prep_kernel,
                    {**groups, "MAX_SPREAD": max_spread}, parallel),
                   (f"wkv7_chunked_fwd_output{label} N={N} {dtype}", wkv7_chunked_output_kernel, groups, parallel)]
    chunks = {"N": N, **backward.blocks, "CHUNK": CHUNK, "MAX_SPREAD": max_spread}
    builds += [(f"wkv7_chunked_dstate N={N} {dtype}", wkv7_chunked_dstate_kernel, {**chunks, "HAS_DSTATE": True},
                backward),
               (f"wkv7_chunked_bwd N={N} {dtype}", wkv7_chunked_bwd_kernel, chunks, backward)]
    return [AotKernel(label, fn, constexprs, types, "*fp32", cfg.num_warps, cfg.num_stages)
            for label, fn, constexprs, cfg in builds]
