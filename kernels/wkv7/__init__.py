"""RWKV-7's WKV (the generalized delta rule): a chunked torch path and Triton forward/backward kernels, with autograd
(and, on a CPU, the recurrence and its backward as C loops: kernels/wkv7/c.py).

    S_t = S_{t-1} diag(w_t) + (S_{t-1} a_t) b_t^T + v_t k_t^T,   w_t = exp(log_w_t),   y_t = S_t r_t

Shapes: r, log_w, k, v, a, b (B, T, H, N) -> y (B, T, H, N); state (B, H, N, N) indexed [value, key], fp32
(float64 for float64 inputs). log_w is the log decay, -exp(w) for BlinkDL's raw w, so <= 0 in RWKV-7; the kernels
compute any finite log_w, and are overflow-free for log_w <= 0 (decays in (0, 1]). Float64 truth, with the
glossary: reference/wkv7.py. Sources: the RWKV-7 post https://www.cnblogs.com/Ctrl-cCtrl-v/p/18906192 and
RWKV-7 "Goose", arXiv:2503.14456.

Torch path: the chunked WY / UT-transform form (reference/wkv7.py's ``wkv7_chunked`` derives it). Cut time into
chunks of L = 16 steps; c_i is the cumulative log decay from the chunk's start and S_0 the state entering it.
For all chunks at once: the (L, L) couplings A_ab, A_ak (j < i) and Q_rb, Q_rk (j <= i), entries
sum_n x_i[n] y_j[n] exp(c_i[n] - c_j[n]) (c_{i-1} for A); the inverse of the unit lower-triangular I - A_ab by
forward substitution over halves (the UT transform), which gives W = (I - A_ab)^{-1} (a_i e^{c_{i-1}})_i, the chunk's WY
factor (P_1 ... P_L = diag(e^{c_L}) + W^T B^), and U0 = (I - A_ab)^{-1} A_ak V. Then a loop over chunks (T / L
steps, none over tokens) with matmuls of (L, N) by (N, N):

    U = W S_0^T + U0 (row i: u_i = S_{i-1} a_i),   Y = (R~ + Q_rb W) S_0^T + Q_rb U0 + Q_rk V,
    S_L = S_0 diag(e^{c_L}) + U^T B^ + V^T K^      (R~_i = r_i e^{c_i}, B^_j = b_j e^{c_L - c_j}, same for K^)

Work is linear in T. Numerics of the couplings: the fast way factors exp(c_i - c_j) = e^{c_i} e^{-c_j}, one
matmul of (L, N) by (N, L) per coupling. But e^{-c_j} grows with the decay accumulated inside the chunk (by
e^{0.61} a step at RWKV-7's strongest decay, 0.545: e^{39} over 64 steps, inf in fp32 after ~145 steps, and
after a few steps of stronger decays), its product with a tiny e^{c_i} then loses everything, and the rounding
of c (relative to |c|) becomes a relative error of the factor. So the factored form runs only when every chunk's
spread of c is at most DECAY_RANGE = 20 (factors below e^20, error within ~20 fp32 roundings); RWKV-7's decays give at
most 0.61 L = 9.7 at L = 16, so trained models always take it. Otherwise `_block_couplings` builds the couplings
from blocks doubling in size, each pair of blocks factored at the step between them with log decays summed
locally: every exponential is a decay (<= 1 for log_w <= 0), none overflows and no large sums cancel, however
strong the decays. The other exponentials are decays too, summed from the chunk's start (e^{c_i}) or back from
its end (B^, K^). Gradients come from autograd through these operations (a graph of O(T N (1 + N / L)) floats).

Triton path: a sequential scan. One program per (batch, head, block of value rows) holds its rows of S in fp32
registers (rows of S evolve independently: row i of S diag(w) + (S a) b^T + v k^T needs only row i) and walks time.
The forward splits the rows by the grid: 16 per program, down to 4 at small B H (two programs per SM where it can:
B = 1, H = 12, N = 64 gives 192 one-warp programs, whose sums over keys are shuffles within the warp). Both
kernels issue step t + 1's (backward: t - 1's) loads before step t's arithmetic. What stays serial: T steps of each
row block (the backward: 2 T, a recompute and a reverse walk per checkpoint run), each a chain of two reductions
over keys (S a, then S r; the backward's several).
The forward saves the state every CHECKPOINT = 16 steps when a gradient is wanted. The backward walks these runs of
steps from the last: it reloads the run's checkpoint, re-runs it forward to store each step's entering state in a
scratch buffer, then walks the run in reverse with G = dL/dS_t:

    G += dy_t r_t^T;  dr_t = S_t^T dy_t;  dv_t = G k_t;  dk_t = G^T v_t;  q = G b_t;  db_t = G^T (S_{t-1} a_t);
    da_t = S_{t-1}^T q;  dlog_w_t = w_t * colsum(G * S_{t-1});  G <- G diag(w_t) + q a_t^T   (= dL/dS_{t-1})

The key-vector gradients (dr, dk, da, db, dlog_w) are sums over value rows: each program stores its rows' share in
its own slice of a (N / BLOCK_V, 5, B, T, H, N) buffer, which the wrapper sums once. No atomics: on a GPU an atomic
add is a memory fence (acq_rel, the default) and its order changes the last bits from run to run; the partial sums
make the gradients the same bit for bit in every run, for N / BLOCK_V (4 at N = 64, 8 at N = 128) times the memory
of the five gradients while the backward runs. T need not be a multiple of anything: steps past T read log_w = 0 and
zeros elsewhere, which leaves the state unchanged.

Chunked Triton path (wkv7(..., backend="triton_chunked"), kernels/wkv7/triton_chunked.py, whose docstring derives
it): each 16-step sub-chunk of the torch path's factored WY form becomes an affine map of its entering state,
S_end = S_0 P + E, computed for every sub-chunk at once in a parallel kernel, whose programs each compose 16 rows of
a group's map (the grid's column axis), so that no (N, N) matrix sits in one program's registers; the only serial
pass is S <- S P_G + E_G, one (16, N) x (N, N) product per group of 4 sub-chunks (fp16/bf16) or of one (fp32); the
outputs then come from the group states in parallel. The forward stores only the state entering each group (fp32).
The backward (kernels/wkv7/triton_chunked_bwd.py) mirrors it: a parallel prep of the maps dL/dS_start = dL/dS_end
P_G^T + F_G, the same serial scan reversed (one product per group), then every 16-step sub-chunk's gradients at
once, in (16, 16) tiles. With fp16/bf16 inputs the couplings' products take the input dtype on the tensor cores, and
everything that carries a state or the inverse tf32 operands; fp32 inputs tf32x3 (three tf32 products) in every
product, forward and backward. It takes head sizes from 16 to 64 (backend="triton", the
sequential kernels, runs the others: at N = 128 the fp32 scan's AOT build spills). Each sub-chunk picks its form on
the device: within _factors_in_range's DECAY_RANGE and finite (RWKV-7's decays always are), the factored form;
otherwise its 16 steps one at a time. The wrappers read no values (no host sync: CUDA graphs can capture them).
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from . import c as c_loops
from .._common import (Launch, accumulation_dtype, all_finite, check_decay_dtype, check_devices,
                       check_same_dtype, check_tensor, finite_log_decay, first_order_only, needs_grad,
                       new_output, rows_per_program, tl, triton)
from ._triton_common import _checkpoint, _head_offsets, _step
from ..backends import Call, deprecated_chunked, dispatch
from .triton_chunked import MAX_CHUNKED_HEAD, _chunked_fwd, _parallel_launch_config
from .triton_chunked_bwd import _chunked_bwd, chunked_aot_kernels

__all__ = ["wkv7", "triton_launch"]

CHUNK = 16          # torch path: steps per chunk (a power of two, for the halving in _block_couplings)
DECAY_RANGE = 20.0  # the widest spread of log decay inside a chunk that the factored couplings take (torch, Triton)
FP16_DECAY_RANGE = 10.0   # the chunked Triton kernels' with fp16 inputs: e^{c} factors in fp16's range (RWKV-7: 9.7)
CHECKPOINT = 16     # Triton path: steps between saved states; the backward re-runs at most this many steps


# ----------------------------------------------------------------------------------------------------------------
# Torch path
# ----------------------------------------------------------------------------------------------------------------

def _block_couplings(x, ys, log_w, inclusive):
    """[C_s for y_s in ys], C_s[..., i, j] = sum_n x[..., i, n] y_s[..., j, n] exp(D_ij[n]) for j <= i (inclusive)
    or j < i, else 0; D_ij = log_w summed over steps j+1 .. i (inclusive) or j+1 .. i-1: c_i - c_j or c_{i-1} - c_j.

    x, y_s, log_w: (..., L, N), L a power of two -> each C_s (..., L, L). The lower triangle is the two diagonal
    half-blocks (the same, recursively) and the quadrant of rows i after the middle step e and columns j <= e,
    whose decay splits at e into log_w summed over j+1 .. e and over e+1 .. i (or i-1). Both sums are local (no
    difference of two large cumulative sums, which would cancel) and both exponentials are decays (<= 1 for
    log_w <= 0), so nothing overflows, however strong the decays.
    """
    L = x.shape[-2]
    if L == 1:
        return [(x * y).sum(-1, keepdim=True) if inclusive else torch.zeros_like(x[..., :1]) for y in ys]
    h = L // 2
    halves = lambda t: t.unflatten(-2, (2, h))                          # (..., 2, h, N): the halves as a batch
    inner = _block_couplings(halves(x), [halves(y) for y in ys], halves(log_w), inclusive)
    first, second = log_w[..., :h, :], log_w[..., h:, :]
    to_e = F.pad(first[..., 1:, :].flip(-2).cumsum(-2).flip(-2), (0, 0, 0, 1))    # steps j+1 .. e, (..., h, N)
    from_e = second.cumsum(-2) if inclusive else F.pad(second[..., :-1, :].cumsum(-2), (0, 0, 1, 0))  # e+1 .. i
    left = x[..., h:, :] * torch.exp(from_e)                             # (..., h, N)
    out = []
    for y, halves_c in zip(ys, inner):
        quadrant = left @ (y[..., :h, :] * torch.exp(to_e)).transpose(-1, -2)          # (..., h, h)
        upper = torch.cat([halves_c[..., 0, :, :], torch.zeros_like(quadrant)], -1)
        lower = torch.cat([quadrant, halves_c[..., 1, :, :]], -1)
        out.append(torch.cat([upper, lower], -2))                        # (..., L, L)
    return out


def _unit_lower_inverse(A):
    """(I - A)^{-1} for strictly lower-triangular A (..., L, L), L a power of two: forward substitution by halves,
    [[X, 0], [-A21, Z]]^{-1} = [[X^-1, 0], [Z^-1 A21 X^-1, Z^-1]], the two diagonal halves inverted together."""
    L = A.shape[-1]
    if L == 1:
        return torch.ones_like(A)
    h = L // 2
    inverses = _unit_lower_inverse(torch.stack([A[..., :h, :h], A[..., h:, h:]], -3))   # (..., 2, h, h)
    X_inv, Z_inv = inverses.unbind(-3)
    return torch.cat([torch.cat([X_inv, torch.zeros_like(X_inv)], -1),
                      torch.cat([Z_inv @ A[..., h:, :h] @ X_inv, Z_inv], -1)], -2)


def _factors_in_range(c):
    """Whether every chunk's couplings may take the factored form exp(c_i - c_j) = e^{c_i} e^{-c_j}: c, the
    cumulative log decays from each chunk's start (any layout), spans at most DECAY_RANGE. Every chunk's c, and 0,
    lie in [min(c, 0), max(c, 0)], a bound on its spread."""
    lo, hi = c.aminmax()
    return (hi.clamp(min=0) - lo.clamp(max=0)).item() <= DECAY_RANGE


def _add_matmul(C, A, B):
    """C + A @ B for (chunks, BH, ., .) tensors, without a temporary for A @ B."""
    return torch.baddbmm(C.flatten(0, 1), A.flatten(0, 1), B.flatten(0, 1)).view(C.shape)


def _wkv7_steps(r, log_w, k, v, a, b, state):
    """The recurrence step by step, for inputs holding NaN or an infinity: the chunked form's products over a chunk
    (0 * NaN = NaN) would carry a non-finite input to its chunk's earlier steps; step by step, NaN reaches what
    it reaches in the reference."""
    ys = []
    for t in range(r.shape[1]):
        S_a = (state @ a[:, t, :, :, None])                                        # (B, H, N, 1)
        state = (state * torch.exp(log_w[:, t, :, None, :]) + S_a * b[:, t, :, None, :]
                 + v[:, t, :, :, None] * k[:, t, :, None, :])
        ys.append((state @ r[:, t, :, :, None])[..., 0])                         # (B, H, N)
    return torch.stack(ys, 1), state


def _wkv7_torch(r, log_w, k, v, a, b, state):
    """The chunked form in the compute dtype (fp32, or float64); returns (y, state). Differentiable by autograd.
    Inputs that are not all finite take the step-by-step recurrence (_wkv7_steps)."""
    if not all_finite(r, log_w, k, v, a, b, state):
        return _wkv7_steps(r, log_w, k, v, a, b, state)
    B, T, H, N = r.shape
    L = CHUNK
    pad = -T % L                     # padded steps: log_w = 0 and zeros elsewhere leave the state as it is
    chunks = (T + pad) // L

    def to_chunks(x):                # (B, T, H, N) -> (chunks, B H, L, N), a strided view where no padding is needed
        x = F.pad(x, (0, 0, 0, 0, 0, pad)) if pad else x
        return x.view(B, chunks, L, H, N).permute(1, 0, 3, 2, 4).reshape(chunks, B * H, L, N)

    # CPU matmuls copy strided operands, so every matmul operand is made contiguous once. A product takes the layout
    # of its first operand, which is why the contiguous factor comes first below.
    r, log_w, k, a, b = map(to_chunks, (r, log_w, k, a, b))
    v = to_chunks(v).contiguous()
    c = log_w.cumsum(-2)                                                 # c_i, (chunks, BH, L, N), contiguous
    decay = torch.exp(c[..., -1:, :])                                    # e^{c_L}, (chunks, BH, 1, N)
    e_c = torch.exp(c)
    a_t = F.pad(e_c[..., :-1, :], (0, 0, 1, 0), value=1.0) * a          # a_i e^{c_{i-1}}
    r_t = e_c * r                                                        # r_i e^{c_i}
    if _factors_in_range(c):
        e_neg = torch.reciprocal(e_c)                                    # e^{-c_j}, below e^DECAY_RANGE
        b_s, k_s = e_neg * b, e_neg * k                                  # b_j e^{-c_j}, k_j e^{-c_j}
        A_ab, A_ak = (a_t @ b_s.mT).tril(-1), (a_t @ k_s.mT).tril(-1)    # (chunks, BH, L, L)
        Q_rb, Q_rk = (r_t @ b_s.mT).tril(), (r_t @ k_s.mT).tril()
        b_hat, k_hat = b_s * decay, k_s * decay                          # b_j e^{c_L - c_j}, k_j e^{c_L - c_j}
    else:
        A_ab, A_ak = _block_couplings(a, [b, k], log_w, inclusive=False)
        Q_rb, Q_rk = _block_couplings(r, [b, k], log_w, inclusive=True)
        to_end = torch.exp(F.pad(log_w[..., 1:, :].flip(-2).cumsum(-2).flip(-2), (0, 0, 0, 1)))  # summed back
        b_hat, k_hat = to_end * b, to_end * k                            # from the end: no c_L - c_j cancelling
    T_inv = _unit_lower_inverse(A_ab)                                    # (I - A_ab)^{-1}
    W = T_inv @ a_t                                                      # (chunks, BH, L, N)
    U0 = (T_inv @ A_ak) @ v
    R = _add_matmul(r_t, Q_rb, W)                                        # R~ + Q_rb W
    Y0 = _add_matmul(Q_rb @ U0, Q_rk, v)                                 # Q_rb U0 + Q_rk V
    # The loop carries S^T (keys x values): every product then takes its operands as stored.
    bk_T = torch.cat([b_hat.mT, k_hat.mT], -1)                           # [B^; K^]^T, (chunks, BH, N, 2L)
    decay = decay.mT                                                     # (chunks, BH, N, 1): scales rows of S^T
    S_T = state.reshape(B * H, N, N).mT
    ys = []
    for i in range(chunks):
        ys.append(torch.baddbmm(Y0[i], R[i], S_T))                       # (BH, L, N)
        U = torch.baddbmm(U0[i], W[i], S_T)                              # rows u_j = S_{j-1} a_j
        S_T = torch.baddbmm(S_T * decay[i], bk_T[i], torch.cat([U, v[i]], -2))   # diag(d) S^T + B^T U + K^T V
    y = torch.stack(ys).view(chunks, B, H, L, N).permute(1, 0, 3, 2, 4).reshape(B, chunks * L, H, N)[:, :T]
    return y, S_T.mT.reshape(B, H, N, N).contiguous()


# ----------------------------------------------------------------------------------------------------------------
# Triton path
# ----------------------------------------------------------------------------------------------------------------

@triton.jit
def _issue_step(r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr, off, keys, rows, t, start, T):
    """Step t's loads, raw (input dtype): r, log_w, k, a, b at `keys` (N,) and v at `rows` (BLOCK_V,), with the masks
    (start <= t < T) for keys and rows. A step past T reads log_w = 0 and zeros: w = 1, and the step changes nothing.
    The sequential kernels issue step t + 1's (or t - 1's) loads before step t's arithmetic and take them with
    _take_step in the next step (software pipelining: two memory round trips overlap)."""
    key_live = (keys * 0 + t < T) & (keys * 0 + t >= start)   # tensors: the interpreter takes no scalar mask
    row_live = (rows * 0 + t < T) & (rows * 0 + t >= start)
    return (tl.load(r_ptr + off + keys, mask=key_live, other=0.0),
            tl.load(log_w_ptr + off + keys, mask=key_live, other=0.0),
            tl.load(k_ptr + off + keys, mask=key_live, other=0.0),
            tl.load(v_ptr + off + rows, mask=row_live, other=0.0),
            tl.load(a_ptr + off + keys, mask=key_live, other=0.0),
            tl.load(b_ptr + off + keys, mask=key_live, other=0.0),
            key_live, row_live)


@triton.jit
def _take_step(r, log_w, k, v, a, b):
    """The loads of _issue_step as fp32, with w = exp(log_w)."""
    return (r.to(tl.float32), tl.exp(log_w.to(tl.float32)), k.to(tl.float32), v.to(tl.float32), a.to(tl.float32),
            b.to(tl.float32))


@triton.jit
def wkv7_fwd_kernel(
    r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr,  # (B, T, H, N) inputs, contiguous, one float dtype
    state0_ptr,          # (B, H, N, N) fp32 initial state, read when HAS_STATE0
    y_ptr,               # (B, T, H, N) output, input dtype
    state_ptr,           # (B, H, N, N) fp32 final state
    ckpt_ptr,            # (B * H, cdiv(T, CHECKPOINT), N, N) fp32: states entering steps 0, CHECKPOINT, ... (SAVE_CKPT)
    T, H,                # sequence length, heads
    N: tl.constexpr,         # head size, a power of two
    BLOCK_V: tl.constexpr,   # value rows (of S) per program
    CHECKPOINT: tl.constexpr,  # steps between saved states
    HAS_STATE0: tl.constexpr,  # start from state0 (else from zeros)
    SAVE_CKPT: tl.constexpr,   # write the checkpoints (a gradient will be wanted)
):
    pid_bh = tl.program_id(0)                        # batch * H + head
    pid_v = tl.program_id(1)                         # block of value rows
    rows = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    keys = tl.arange(0, N)
    tile = rows[:, None] * N + keys[None, :]         # this program's part of one (N, N) state
    head_state, seq, stride_t = _head_offsets(pid_bh, T, H, N)
    if HAS_STATE0:
        S = tl.load(state0_ptr + head_state + tile)
    else:
        S = tl.zeros((BLOCK_V, N), dtype=tl.float32)
    n_ckpt = tl.cdiv(T, CHECKPOINT)
    nxt = _issue_step(r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr, seq, keys, rows, 0, 0, T)
    for t in range(T):
        if SAVE_CKPT:
            if t % CHECKPOINT == 0:
                tl.store(_checkpoint(ckpt_ptr, pid_bh, n_ckpt, t // CHECKPOINT, N) + tile, S)
        off = seq + t * stride_t
        r, log_w, k, v, a, b, _, _ = nxt
        nxt = _issue_step(r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr, off + stride_t, keys, rows, t + 1, 0, T)
        r, w, k, v, a, b = _take_step(r, log_w, k, v, a, b)
        S = _step(S, w, k, v, a, b)
        y = tl.sum(S * r[None, :], axis=1)
        tl.store(y_ptr + off + rows, y.to(y_ptr.dtype.element_ty))
    tl.store(state_ptr + head_state + tile, S)


@triton.jit
def wkv7_bwd_kernel(
    r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr,  # (B, T, H, N) inputs of the forward, contiguous
    dy_ptr,              # (B, T, H, N) gradient of y, contiguous, input dtype
    dstate_ptr,          # (B, H, N, N) fp32 gradient of the final state, read when HAS_DSTATE
    ckpt_ptr,            # (B * H, cdiv(T, CHECKPOINT), N, N) fp32 checkpoints saved by the forward
    scratch_ptr,         # (B * H * N / BLOCK_V, CHECKPOINT, BLOCK_V, N) fp32: each program's states in one chunk
    dkeys_ptr,           # (N / BLOCK_V, 5, B, T, H, N) fp32: dr, dlog_w, dk, da, db, this program's rows' share
    dv_ptr,              # (B, T, H, N) fp32 gradient of v
    dstate0_ptr,         # (B, H, N, N) fp32 gradient of the initial state
    T, H,                # sequence length, heads
    N: tl.constexpr,         # head size, a power of two
    BLOCK_V: tl.constexpr,   # value rows per program
    CHECKPOINT: tl.constexpr,  # steps between the forward's saved states
    HAS_DSTATE: tl.constexpr,  # the final state has a gradient (else it is zero)
):
    pid_bh = tl.program_id(0)
    pid_v = tl.program_id(1)
    rows = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    keys = tl.arange(0, N)
    tile = rows[:, None] * N + keys[None, :]
    local = tl.arange(0, BLOCK_V)[:, None] * N + keys[None, :]       # a tile of the scratch buffer
    head_state, seq, stride_t = _head_offsets(pid_bh, T, H, N)
    numel = tl.num_programs(0).to(tl.int64) * T * N                   # B * T * H * N
    dkeys_ptr += pid_v * 5 * numel                                    # this row block's partial sums
    scratch = scratch_ptr + (pid_bh.to(tl.int64) * tl.num_programs(1) + pid_v) * CHECKPOINT * BLOCK_V * N
    if HAS_DSTATE:
        G = tl.load(dstate_ptr + head_state + tile)                   # dL/dS_T
    else:
        G = tl.zeros((BLOCK_V, N), dtype=tl.float32)
    n_ckpt = tl.cdiv(T, CHECKPOINT)
    for back in range(n_ckpt):
        chunk = n_ckpt - 1 - back
        # Re-run the chunk from its checkpoint, keeping the state that enters each of its steps.
        S = tl.load(_checkpoint(ckpt_ptr, pid_bh, n_ckpt, chunk, N) + tile)
        t0 = chunk * CHECKPOINT
        # Both walks software-pipelined: step t +- 1's loads are issued before step t's arithmetic.
        nxt = _issue_step(r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr, seq + t0 * stride_t, keys, rows, t0, t0, T)
        for j in range(CHECKPOINT):
            t = t0 + j
            off = seq + t * stride_t
            tl.store(scratch + j * BLOCK_V * N + local, S)
            r, log_w, k, v, a, b, _, _ = nxt
            nxt = _issue_step(r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr, off + stride_t, keys, rows, t + 1, t0,
                              tl.minimum(T, t0 + CHECKPOINT))
            r, w, k, v, a, b = _take_step(r, log_w, k, v, a, b)
            S = _step(S, w, k, v, a, b)
        tl.debug_barrier()           # the scratch written by all threads is read back below
        last = t0 + CHECKPOINT - 1
        nxt = _issue_step(r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr, seq + last * stride_t, keys, rows, last, t0, T)
        dy_next = tl.load(dy_ptr + seq + last * stride_t + rows, mask=rows * 0 + last < T, other=0.0)
        S_prev_next = tl.load(scratch + (CHECKPOINT - 1) * BLOCK_V * N + local)
        for jj in range(CHECKPOINT):
            j = CHECKPOINT - 1 - jj
            t = t0 + j
            off = seq + t * stride_t
            r, log_w, k, v, a, b, key_live, row_live = nxt
            dy, S_prev = dy_next, S_prev_next
            # step t - 1's loads, none before the run's start (the scratch then holds the previous run's states)
            nxt = _issue_step(r_ptr, log_w_ptr, k_ptr, v_ptr, a_ptr, b_ptr, off - stride_t, keys, rows, t - 1, t0, T)
            dy_next = tl.load(dy_ptr + off - stride_t + rows, mask=(rows * 0 + t - 1 < T) & (rows * 0 + j > 0),
                              other=0.0)
            S_prev_next = tl.load(scratch + (j - 1) * BLOCK_V * N + local, mask=local * 0 + j > 0, other=0.0)
            r, w, k, v, a, b = _take_step(r, log_w, k, v, a, b)
            dy = dy.to(tl.float32)
            sa = tl.sum(S_prev * a[None, :], axis=1)                  # S_{t-1} a_t
            # dr = S_t^T dy, with S_t = S_{t-1} diag(w) + sa b^T + v k^T expanded (S_t is never formed)
            dr = w * tl.sum(S_prev * dy[:, None], axis=0) + b * tl.sum(sa * dy) + k * tl.sum(v * dy)
            G += dy[:, None] * r[None, :]                              # y_t = S_t r_t
            q = tl.sum(G * b[None, :], axis=1)                         # G b_t = dL/d(S_{t-1} a_t)
            tl.store(dkeys_ptr + off + keys, dr, mask=key_live)
            tl.store(dkeys_ptr + numel + off + keys, w * tl.sum(G * S_prev, axis=0), mask=key_live)     # dlog_w
            tl.store(dkeys_ptr + 2 * numel + off + keys, tl.sum(G * v[:, None], axis=0), mask=key_live)  # dk
            tl.store(dkeys_ptr + 3 * numel + off + keys, tl.sum(S_prev * q[:, None], axis=0), mask=key_live)  # da
            tl.store(dkeys_ptr + 4 * numel + off + keys, tl.sum(G * sa[:, None], axis=0), mask=key_live)  # db
            tl.store(dv_ptr + off + rows, tl.sum(G * k[None, :], axis=1), mask=row_live)
            G = G * w[None, :] + q[:, None] * a[None, :]               # dL/dS_{t-1}
        tl.debug_barrier()           # done reading the scratch before the previous chunk overwrites it
    tl.store(dstate0_ptr + head_state + tile, G)


def _launch_config(N, heads=None) -> Launch:
    """16 value rows per program (half the rows of smaller heads, so that a head always spans two programs or more);
    a (16, N) fp32 tile over 4 warps is 8 (N = 64) or 16 (N = 128) registers a thread. With ``heads`` (B H: the
    sequential forward) fewer rows, down to 4, until the grid has two programs per SM (B = 1, H = 12, N = 64: 4 rows,
    192 programs instead of 48), on fewer warps (4 x 64: one warp, whose reductions over keys are shuffles, with no
    barrier between warps). The backward keeps 16 rows: its key-vector partial sums grow as N / BLOCK_V."""
    rows = min(16, N // 2)
    if heads is None:
        return Launch({"BLOCK_V": rows}, num_warps=4)
    rows = rows_per_program(heads * N, rows, min(4, rows))
    return Launch({"BLOCK_V": rows}, num_warps=max(1, min(4, rows * N // 256)))



def _grid(B, H, N, cfg: Launch):
    """One program per (batch, head) and block of BLOCK_V value rows."""
    return (B * H, N // cfg["BLOCK_V"])


def triton_launch(B: int, H: int, N: int, kernel: str) -> tuple[Launch, tuple[int, int]]:
    """A Triton kernel's launch for B H heads of size N, as the launchers make it; the cost model
    (benchmarks/cost_model.py) reads it.

    Args:
        B: batch. H: heads. N: head size.
        kernel: "fwd" (the sequential forward, fewer rows a program when the grid is small), "bwd" (its backward),
            "chunked" (the "triton_chunked" backend's parallel forward kernels: per group, its grid's second axis;
            the scan's is its own) or "chunked_bwd" (that backend's gradient kernel: one program per sub-chunk and
            head; its prep and its walks over a group take the "chunked" launch, its scan the forward's).

    Returns:
        (launch, grid): the tile sizes and compiler options, and the programs per grid axis (per group or chunk on
        the first axis for the chunked kernels: B H).
    """
    if kernel == "fwd":
        cfg = _launch_config(N, B * H)
    elif kernel == "bwd":
        cfg = _launch_config(N)
    elif kernel == "chunked":
        cfg = _parallel_launch_config(N)
        return cfg, (B * H, 2 * N // cfg["COLUMNS"])
    elif kernel == "chunked_bwd":
        return _parallel_launch_config(N), (B * H, 1)
    else:
        raise ValueError(f'kernel must be "fwd", "bwd", "chunked" or "chunked_bwd", got {kernel!r}')
    return cfg, _grid(B, H, N, cfg)


def _max_spread(dtype):
    """The widest spread of c a chunk takes in the chunked kernels' factored form, for inputs of this dtype."""
    return FP16_DECAY_RANGE if dtype == torch.float16 else DECAY_RANGE


def wkv7_fwd(r, log_w, k, v, a, b, state0, save_checkpoints, chunked):
    """Runs the sequential or the chunked forward kernel (``chunked``: the "triton_chunked" backend, which
    kernels/wkv7/spec.py gives heads N >= 16 only; the chunked kernels decide each chunk's form on the device, decays
    out of range taking their steps one at a time); returns y, the final state and the checkpoints (the state
    itself, unwritten, without ``save_checkpoints``)."""
    B, T, H, N = r.shape
    y = new_output((B, T, H, N), r.dtype, r.device)
    state = new_output((B, H, N, N), torch.float32, r.device)
    if chunked:
        return y, state, _chunked_fwd(r, log_w, k, v, a, b, state0, y, state, _max_spread(r.dtype))
    ckpt = (new_output((B * H, triton.cdiv(T, CHECKPOINT), N, N), torch.float32, r.device) if save_checkpoints
            else state)                              # not written without SAVE_CKPT
    cfg = _launch_config(N, B * H)
    wkv7_fwd_kernel[_grid(B, H, N, cfg)](
        r, log_w, k, v, a, b, state0 if state0 is not None else state, y, state, ckpt, T, H,
        N=N, **cfg.blocks, CHECKPOINT=CHECKPOINT, HAS_STATE0=state0 is not None, SAVE_CKPT=save_checkpoints,
        **cfg.options)
    return y, state, ckpt


def wkv7_bwd(r, log_w, k, v, a, b, ckpt, dy, dstate):
    """Runs the backward kernel from the forward's checkpoints; returns the gradients of (r, log_w, k, v, a, b) and
    of the initial state."""
    B, T, H, N = r.shape
    cfg = _launch_config(N)
    grid = _grid(B, H, N, cfg)
    scratch = torch.empty((grid[0] * grid[1], CHECKPOINT, cfg["BLOCK_V"], N), dtype=torch.float32,
                          device=r.device)
    # Every row block stores its share of the key-vector gradients; one sum over the blocks, in a fixed order.
    dkeys = new_output((grid[1], 5, B, T, H, N), torch.float32, r.device)
    dv = new_output((B, T, H, N), torch.float32, r.device)
    dstate0 = new_output((B, H, N, N), torch.float32, r.device)
    wkv7_bwd_kernel[grid](
        r, log_w, k, v, a, b, dy, dstate if dstate is not None else dstate0, ckpt, scratch, dkeys, dv, dstate0, T, H,
        N=N, **cfg.blocks, CHECKPOINT=CHECKPOINT, HAS_DSTATE=dstate is not None, **cfg.options)
    return _gradients(dkeys.sum(0), dv, dstate0, r.dtype, log_w.dtype)   # the row blocks' shares, in a fixed order


def _gradients(keys, dv, dstate0, dtype, log_w_dtype):
    """The gradients of (r, log_w, k, v, a, b) and the initial state from a backward's buffers: keys (5, B, T, H, N),
    dr, dlog_w, dk, da, db; dv; dS_0."""
    # keys[i] one by one: indexing with a list makes an index tensor on the host, whose copy to the GPU (from
    # pageable memory) blocks the host until the GPU is idle, once per backward (the first GPU run measured it)
    dr, dk, da, db = (keys[i].to(dtype) for i in (0, 2, 3, 4))
    return dr, keys[1].to(log_w_dtype), dk, dv.to(dtype), da, db, dstate0


# ----------------------------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------------------------

class Wkv7Function(torch.autograd.Function):
    """Triton forward (saving a checkpoint every CHECKPOINT steps) and Triton backward, sequential or chunked as the
    forward; used when a gradient is wanted (wkv7 calls the forward alone otherwise, as wkv4 does)."""

    @staticmethod
    def forward(ctx, r, log_w, k, v, a, b, state0, chunked):
        ctx.set_materialize_grads(False)
        y, state, ckpt = wkv7_fwd(r, log_w, k, v, a, b, state0, save_checkpoints=True, chunked=chunked)
        ctx.save_for_backward(r, log_w, k, v, a, b, ckpt)
        ctx.chunked = chunked
        return y, state

    @staticmethod
    @first_order_only
    def backward(ctx, dy, dstate):
        r, log_w, k, v, a, b, ckpt = ctx.saved_tensors
        dy = torch.zeros_like(r) if dy is None else dy.contiguous()
        dstate = None if dstate is None else dstate.contiguous().float()
        if ctx.chunked:
            grads = _gradients(*_chunked_bwd(r, log_w, k, v, a, b, ckpt, dy, dstate, _max_spread(r.dtype)), r.dtype,
                               log_w.dtype)
        else:
            grads = wkv7_bwd(r, log_w, k, v, a, b, ckpt, dy, dstate)
        return grads[:6] + (grads[6] if ctx.needs_input_grad[6] else None, None)


# ----------------------------------------------------------------------------------------------------------------
# Public op
# ----------------------------------------------------------------------------------------------------------------

def wkv7(r, log_w, k, v, a, b, state=None, *, backend=None, chunked=False):
    """S_t = S_{t-1} diag(exp(log_w_t)) + (S_{t-1} a_t) b_t^T + v_t k_t^T,  y_t = S_t r_t.

    Feeding a sequence in pieces, each with the state the last returned, gives the same as feeding it whole.
    Differentiable on every backend with respect to every input and the initial state.

    Args:
        r, k, v, a, b (torch.Tensor): (B, T, H, N), T >= 1: receptance, key, value and the rank-one correction.
        log_w (torch.Tensor): (B, T, H, N), the log decay (-exp(w) for BlinkDL's raw w); -inf is a decay of exactly
            0. r, k, v, a, b share one dtype: fp32, fp16 or bf16 (float64 too on the torch backend); log_w takes
            that dtype or fp32.
        state (torch.Tensor or None): (B, H, N, N) indexed [value, key], fp32 (float64 with float64 inputs).
            Default: zeros.
        backend (str or None): "torch" (the chunked WY form), "triton" (the recurrence step by step, N a power of
            two >= 4; on CPU tensors it needs TRITON_INTERPRET=1 before triton is imported), "triton_chunked" (the
            chunked WY form on Triton, for N a power of two from 16 to 64: every 16-step sub-chunk's map of the
            state in parallel, a serial pass of one product per group of 64 steps (fp16/bf16 inference; 16 steps
            for fp32 and with a gradient), the outputs in parallel; the backward a serial pass over chunks of 16,
            then every chunk at once; the products on the tensor cores; a sub-chunk whose log decays spread beyond
            DECAY_RANGE, never with RWKV-7's, or that holds inf or NaN takes its 16 steps one at a time, decided on
            the device), "c" (kernels/wkv7/wkv7.c, CPU, N <= 256) or None. None runs the first that takes the
            call, in this order: "triton" (CUDA tensors, N a power of two >= 4), "triton_chunked" (CUDA tensors, N
            a power of two from 16 to 64), "c" (CPU tensors in fp32, fp16 or bf16, N <= 256, where the C loops
            build), "torch" (any other call). A backend named here that cannot take the call raises with its
            reason (kernels/backends.py). Default: None.
        chunked (bool): deprecated, to be removed in the next version: use backend="triton_chunked". True turns
            a "triton" choice into "triton_chunked" where that takes the call (N >= 16), as it always did.
            Default: False.
    Returns:
        (y (B, T, H, N) in the input dtype, state (B, H, N, N) after the last step, fp32 or float64).

    Notes: "triton_chunked" is not timed on a GPU here: which is faster depends on the GPU, the batch and T.
    Source: the RWKV-7 post https://www.cnblogs.com/Ctrl-cCtrl-v/p/18906192 and arXiv:2503.14456.
    """
    check_tensor("r", r, (None, None, None, None))
    B, T, H, N = r.shape
    if min(B, T, H, N) < 1:
        raise ValueError(f"r must have shape (B, T, H, N) with every size >= 1, got {tuple(r.shape)}")
    for name, x in (("log_w", log_w), ("k", k), ("v", v), ("a", a), ("b", b)):
        check_tensor(name, x, (B, T, H, N))
    dtype = check_same_dtype(r=r, k=k, v=v, a=a, b=b)
    check_decay_dtype("log_w", log_w, dtype)
    device = check_devices(r=r, log_w=log_w, k=k, v=v, a=a, b=b, state=state)
    grad = needs_grad(r, log_w, k, v, a, b, state)
    if not isinstance(chunked, bool):
        raise TypeError(f"chunked must be True or False, got {chunked!r}")
    call = Call("wkv7", device, dtype, {"N": N}, grad)
    backend = dispatch(call, backend)
    if chunked:
        # attributed to the caller, as deprecations are (notebook 04, whose cell output it would have joined, now
        # names the backend)
        warnings.warn('wkv7(chunked=True) is deprecated and goes in the next version: pass backend="triton_chunked"',
                      DeprecationWarning, stacklevel=2)
        backend = deprecated_chunked(call, backend)
    state_dtype = accumulation_dtype(dtype)
    if state is not None:
        check_tensor("state", state, (B, H, N, N), dtypes=(state_dtype,))
    if backend == "c":                # the loop takes log_w = -inf (a decay of 0) itself
        return c_loops.wkv7(r, log_w, k, v, a, b, state, grad)
    log_w = finite_log_decay(log_w)   # -inf: a decay of exactly 0 (the reference takes finite log_w only)
    if backend == "torch":
        if state is None:
            state = torch.zeros((B, H, N, N), dtype=state_dtype, device=device)
        y, state = _wkv7_torch(*(x.to(state_dtype) for x in (r, log_w, k, v, a, b)), state)
        return y.to(dtype), state
    args = (*(x.contiguous() for x in (r, log_w, k, v, a, b)), None if state is None else state.contiguous())
    chunked = backend == "triton_chunked"
    if grad:
        return Wkv7Function.apply(*args, chunked)
    y, state, _ = wkv7_fwd(*args, save_checkpoints=False, chunked=chunked)   # inference: no checkpoints
    return y, state


# ----------------------------------------------------------------------------------------------------------------
# Ahead-of-time build (python -m seqmix.kernels.aot)
# ----------------------------------------------------------------------------------------------------------------

SMALL_GRID_HEADS = 12   # B H of the AOT build's split forward: batch 1 of a 12-head model (RWKV-7 0.1B)


def aot_kernels():
    """The sequential forward (with checkpoints) and backward, and the chunked kernels, at head size 64 and 128, fp32
    and bf16 inputs (the chunked kernels at N = 64 only, and for fp16 too); the sequential forward also at
    B H = SMALL_GRID_HEADS, where it splits the state further."""
    from ..aot import AotKernel
    kernels = []
    for N in (64, 128):
        for dtype in ("fp32", "bf16"):
            # pointers in the input dtype; the others are fp32 (states, the chunked maps, partial sums of gradients)
            types = {**{a: f"*{dtype}" for a in ("r_ptr", "log_w_ptr", "k_ptr", "v_ptr", "a_ptr", "b_ptr", "y_ptr",
                                                 "dy_ptr")}, "T": "i32", "H": "i32", "n_groups": "i32"}
            forward = {"HAS_STATE0": True, "SAVE_CKPT": True}
            for fn, label, constexprs, cfg in (
                    (wkv7_fwd_kernel, "wkv7_fwd", {"N": N, **forward, "CHECKPOINT": CHECKPOINT}, _launch_config(N)),
                    (wkv7_fwd_kernel, f"wkv7_fwd B*H={SMALL_GRID_HEADS}",
                     {"N": N, **forward, "CHECKPOINT": CHECKPOINT}, _launch_config(N, SMALL_GRID_HEADS)),
                    (wkv7_bwd_kernel, "wkv7_bwd", {"N": N, "HAS_DSTATE": True, "CHECKPOINT": CHECKPOINT},
                     _launch_config(N))):
                constexprs = {**cfg.blocks, **constexprs}
                kernels.append(AotKernel(f"{label} N={N} {dtype}", fn, constexprs, types, "*fp32", cfg.num_warps,
                                         cfg.num_stages))
            if N <= MAX_CHUNKED_HEAD:   # the chunked backend refuses larger heads (kernels/wkv7/spec.py)
                kernels += chunked_aot_kernels(N, dtype, types, DECAY_RANGE)
                if dtype == "bf16":     # fp16: the chunked kernels again, at fp16's MAX_SPREAD
                    fp16 = {name: "*fp16" if kind == "*bf16" else kind for name, kind in types.items()}
                    kernels += chunked_aot_kernels(N, "fp16", fp16, FP16_DECAY_RANGE)
    return kernels
