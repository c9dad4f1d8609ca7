"""Mamba's selective scan on torch tensors: a chunked torch implementation and Triton kernels, with autograd.

For every batch b, channel d (of D), state index n (of N) and token t:

    delta <- softplus(delta + delta_bias)                    (each when asked for)
    x_t = exp(delta_t A) x_{t-1} + delta_t B_t u_t           (A diagonal: one number A[d, n] per state)
    y_t = sum_n C_t x_t + D u_t,   times silu(z_t) when z is given

Shapes, as in Mamba: u, delta, z (batch, D, T); A (D, N); B, C (batch, N, T); D, delta_bias (D,); state and the
returned last_state (batch, D, N). The float64 truth is reference/ssm.py (`selective_scan`). Source: Mamba
(arXiv:2312.00752), section 3 and Algorithm 2.

How it is split up. delta_bias, softplus, the skip D u and the gate are elementwise over (batch, D, T) and run as
ordinary torch ops on the torch and Triton backends (autograd differentiates them); the C loops of kernels/ssm/ssm.c
(backend="c", CPU) do them, and the scan, in their one pass forward and one backward. The scan proper,
(u, delta, A, B, C, state) -> (C_t . x_t, last state), is one torch.autograd.Function with two implementations:

- torch: chunks of CHUNK tokens, grouped into blocks of up to BLOCK_ELEMENTS per (tokens, batch, D, N) tensor
  that are processed one after the other (so memory is bounded whatever T is, and time is linear in T). Within a
  block: (1) the recurrence runs over the positions of a chunk from a zero entering state, each step updating
  every chunk of the block at once, which gives each chunk's exit state; (2) the state entering each chunk follows
  with one step per chunk, through the chunk's whole decay exp(A sum of delta) (log space: with A <= 0, Mamba's
  A = -exp(A_log), the exponent is <= 0 and nothing overflows whatever delta is); (3) the recurrence runs over the
  positions again, now from each chunk's true entering state, all chunks at once. Step (3) replaces the per-position
  decays exp(A cumulative sum of delta) of the textbook chunked scan: one multiply-add per state element instead of
  a product, an exponential and a multiply-add, with the same factors <= 1. The backward pass saves only the state
  at each block's start and recomputes a block's states when it gets to it.
- triton: one program per (batch, block of BLOCK_D channels); the state (BLOCK_D, N) lives in registers and the
  program walks time sequentially, step t + 1's loads issued before step t's arithmetic. The forward takes 16
  channels per program, down to 4 at small batch * D (two programs per SM where it can: batch 1, D = 1536 gives 384
  one-warp programs); what stays serial is each channel's T steps (an exponential and a sum over the N states). The
  forward kernel stores the state every CHECKPOINT tokens (~ sqrt(T)); the backward kernel walks these runs in reverse,
  recomputes a run's states from its checkpoint into a scratch buffer, then walks the run backwards. Extra memory:
  batch * D * N * (T / CHECKPOINT + CHECKPOINT) fp32, about 2 sqrt(T) states per channel instead of T. dB and dC sum
  over channels: each program stores its block's share in its own slice of (batch, D / BLOCK_D, N, T) buffers, summed
  once by the wrapper (batch * D * T * N / BLOCK_D fp32 each, the size of u at N = 16). No atomics: on a GPU each would
  be a memory fence on addresses all D / BLOCK_D programs of a row share, and their order would change the last bits
  from run to run; these gradients are the same bit for bit in every run.

States and accumulation are fp32 (float64 for float64 inputs on the torch backend); outputs take the input dtype.
A, D and delta_bias may be fp32 while the sequence inputs are fp16/bf16 (Mamba keeps these parameters in fp32).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import c as c_loops
from .._common import (Launch, accumulation_dtype, check_decay_dtype, check_devices, check_same_dtype,
                       check_tensor, check_values, finite_log_decay, first_order_only, needs_grad,
                       new_output, rows_per_program, tl, triton)
from ..backends import Call, dispatch

__all__ = ["selective_scan", "triton_launch", "checkpoint_interval"]

CHUNK = 16                 # torch backend: tokens per chunk (the length of the in-chunk loop)
BLOCK_ELEMENTS = 1 << 21   # torch backend: a block holds as many chunks as keep (tokens, batch, D, N) under this


# ----------------------------------------------------------------------------------------------------------------
# Torch path
# ----------------------------------------------------------------------------------------------------------------

def _to_chunks(x: torch.Tensor) -> torch.Tensor:
    """(batch, K, n CHUNK) -> (CHUNK, batch, n, K), contiguous: one slice holds one position of every chunk."""
    batch, K, t = x.shape
    return x.reshape(batch, K, t // CHUNK, CHUNK).permute(3, 0, 2, 1).contiguous()


def _from_chunks(x: torch.Tensor) -> torch.Tensor:
    """(CHUNK, batch, n, K) -> (batch, K, n CHUNK)."""
    L, batch, n, K = x.shape
    return x.permute(1, 3, 2, 0).reshape(batch, K, n * L)


def _chunked_scan(alpha, chunk_decay, hbuf, h0, reverse):
    """h_t = alpha_t h_{t-1} + w_t (reverse: h_t = alpha_t h_{t+1} + w_t), alpha_t = exp(delta_t A), t = c L + l.

    alpha: (L, batch, n, D, N); chunk_decay: (batch, n, D, N), exp(A times the sum of delta over each chunk), the
    product of its alphas. hbuf: (L + 1, batch, n, D, N): on entry its step slots (forward 1..L, reverse 0..L-1)
    hold w; on return they hold h, and the spare slot holds each chunk's entering state (forward: slot 0, the state
    before the chunk; reverse: slot L, the state after it). So forward hbuf[:-1] is h_{t-1} and reverse hbuf[1:] is
    h_{t+1}, at every t. h0: (batch, D, N), the state entering the block. Returns the state leaving it.
    """
    L, n = alpha.shape[0], alpha.shape[2]
    order = range(L - 1, -1, -1) if reverse else range(L)
    steps = hbuf[:-1] if reverse else hbuf[1:]                   # (L, batch, n, D, N)
    entry = hbuf[L] if reverse else hbuf[0]                      # (batch, n, D, N)
    # 1. each chunk's exit state from a zero entering state: L steps, each over every chunk of the block at once
    exit_state = steps[order[0]]
    for l in order[1:]:
        exit_state = torch.addcmul(steps[l], alpha[l], exit_state)
    # 2. the entering states, one chunk after the other: the true entry, decayed over the chunk, plus that exit
    h = h0
    for c in (range(n - 1, -1, -1) if reverse else range(n)):
        entry[:, c] = h
        h = torch.addcmul(exit_state[:, c], chunk_decay[:, c], h)
    # 3. the states, from each chunk's true entering state: L steps again, over every chunk at once
    before = entry
    for l in order:
        before = torch.addcmul(steps[l], alpha[l], before, out=steps[l])
    return h


def _block_states(u, delta, A, B, h0):
    """One block (batch, ., t), t a multiple of CHUNK, in chunk layout: delta (L, batch, n, D), alpha, each
    chunk's whole decay (see _chunked_scan; the backward's reverse scan takes it too), the states (hbuf) and the
    state after the block."""
    dl = _to_chunks(delta)                                       # (L, batch, n, D)
    alpha = torch.exp(dl[..., None] * A)                         # (L, batch, n, D, N)
    # The decay over a whole chunk in log space: A times the sum of delta, <= 1 whatever delta is (A <= 0).
    chunk_decay = torch.exp(dl.sum(0)[..., None] * A)           # (batch, n, D, N)
    hbuf = alpha.new_empty((CHUNK + 1,) + alpha.shape[1:])
    torch.mul((dl * _to_chunks(u))[..., None], _to_chunks(B)[:, :, :, None, :], out=hbuf[1:])   # w = delta u B
    h = _chunked_scan(alpha, chunk_decay, hbuf, h0, reverse=False)
    return dl, alpha, chunk_decay, hbuf, h


def _padded(compute, *tensors):
    """In the compute dtype, padded with zeros to a multiple of CHUNK tokens: a step with delta = 0 and u = 0
    leaves the state as it is, so the padding changes nothing."""
    pad = -tensors[0].shape[-1] % CHUNK
    return [F.pad(x.to(compute), (0, pad)) if pad else x.to(compute) for x in tensors]


def _block_slices(batch, dim, T, N):
    """Blocks of whole chunks, each with at most BLOCK_ELEMENTS per (tokens, batch, D, N) tensor (at least a chunk)."""
    step = CHUNK * max(1, BLOCK_ELEMENTS // (CHUNK * batch * dim * N))
    return [slice(t0, t0 + step) for t0 in range(0, T, step)]


def _selective_scan_torch_fwd(u, delta, A, B, C, state):
    """(y (batch, D, T), last state (batch, D, N), the state before each block (blocks, batch, D, N))."""
    batch, dim, T = u.shape
    u, delta, B, C = _padded(A.dtype, u, delta, B, C)
    y = new_output((batch, dim, u.shape[-1]), A.dtype, u.device)
    h = torch.zeros(batch, dim, A.shape[1], dtype=A.dtype, device=u.device) if state is None else state
    checkpoints = []
    for sl in _block_slices(batch, dim, u.shape[-1], A.shape[1]):
        checkpoints.append(h)
        *_, hbuf, h = _block_states(u[..., sl], delta[..., sl], A, B[..., sl], h)
        y[..., sl] = _from_chunks(torch.einsum("lbcdn,lbcn->lbcd", hbuf[1:], _to_chunks(C[..., sl])))   # C_t . x_t
    return y[..., :T], h, torch.stack(checkpoints)


def _selective_scan_torch_bwd(u, delta, A, B, C, checkpoints, dy, dlast):
    """Gradients of the scan, block by block from the last. With lambda_t = dL/dx_t (all paths) and
    nu_t = alpha_t lambda_t (what reaches x_{t-1}):

        nu_t = alpha_t (nu_{t+1} + dy_t C_t)    a reverse scan, nu after the last token = dlast
        lambda_t = dy_t C_t + nu_{t+1}
        dC_t = sum_d dy_t x_t          dB_t = sum_d lambda_t delta_t u_t       du_t = delta_t sum_n lambda_t B_t
        d(delta_t A) = lambda_t alpha_t x_{t-1}  -> ddelta_t = sum_n (that) A + u_t sum_n lambda_t B_t,
                                                    dA = sum_{b, t} (that) delta_t
        dstate = nu at the first token.
    """
    batch, dim, T = u.shape
    u, delta, B, C, dy = _padded(A.dtype, u, delta, B, C, dy)
    du, ddelta, dB, dC = (new_output(x.shape, x.dtype, x.device) for x in (u, delta, B, C))
    dA = torch.zeros_like(A)
    nu = dlast.to(A.dtype)
    for sl, h0 in reversed(list(zip(_block_slices(batch, dim, u.shape[-1], A.shape[1]), checkpoints))):
        dl, alpha, chunk_decay, xbuf, _ = _block_states(u[..., sl], delta[..., sl], A, B[..., sl], h0)
        ul, Bl, dyl = (_to_chunks(x[..., sl]) for x in (u, B, dy))             # (L, batch, n, D or N)
        g = dyl[..., None] * _to_chunks(C[..., sl])[:, :, :, None, :]            # dy_t C_t: (L, batch, n, D, N)
        nubuf = torch.empty_like(xbuf)
        torch.mul(alpha, g, out=nubuf[:-1])
        nu = _chunked_scan(alpha, chunk_decay, nubuf, nu, reverse=True)
        lam = nubuf[1:].add_(g)                                                  # lambda_t = dy_t C_t + nu_{t+1}
        lam_B = torch.einsum("lbcdn,lbcn->lbcd", lam, Bl)                       # sum_n lambda_t B_t
        dC[..., sl] = _from_chunks(torch.einsum("lbcd,lbcdn->lbcn", dyl, xbuf[1:]))
        dB[..., sl] = _from_chunks(torch.einsum("lbcd,lbcdn->lbcn", dl * ul, lam))
        du[..., sl] = _from_chunks(lam_B * dl)
        grad_a = lam.mul_(alpha).mul_(xbuf[:-1])                                # dL/d(delta_t A): (L, batch, n, D, N)
        ddelta[..., sl] = _from_chunks(torch.einsum("lbcdn,dn->lbcd", grad_a, A) + lam_B * ul)
        dA += torch.einsum("lbcdn,lbcd->dn", grad_a, dl)
    return du[..., :T], ddelta[..., :T], dA, dB[..., :T], dC[..., :T], nu


# ----------------------------------------------------------------------------------------------------------------
# Triton path
# ----------------------------------------------------------------------------------------------------------------

@triton.jit
def _load_step(u_ptr, delta_ptr, B_ptr, C_ptr, seq, bc, t, mask_d, mask_n, end, start=0):
    """Step t's u, delta (BLOCK_D channels) and B_t, C_t (BLOCK_N states), raw (u, B, C in the input dtype); zeros
    unless start <= t < end. The masks are tensors (offs * 0 + t): the interpreter takes no scalar mask."""
    live_d = mask_d & (seq * 0 + t < end) & (seq * 0 + t >= start)
    live_n = mask_n & (bc * 0 + t < end) & (bc * 0 + t >= start)
    return (tl.load(u_ptr + seq + t, mask=live_d, other=0.0), tl.load(delta_ptr + seq + t, mask=live_d, other=0.0),
            tl.load(B_ptr + bc + t, mask=live_n, other=0.0), tl.load(C_ptr + bc + t, mask=live_n, other=0.0))


@triton.jit
def selective_scan_fwd_kernel(
    u_ptr,        # (batch, D, T) input u, fp32/fp16/bf16
    delta_ptr,    # (batch, D, T) fp32 step sizes (delta_bias and softplus already applied)
    A_ptr,        # (D, N) fp32
    B_ptr,        # (batch, N, T), u's dtype
    C_ptr,        # (batch, N, T), u's dtype
    state_ptr,    # (batch, D, N) fp32 state before the first token; read only when HAS_STATE
    y_ptr,        # (batch, D, T) fp32 out: C_t . x_t
    last_ptr,     # (batch, D, N) fp32 out: the state after the last token
    ckpt_ptr,     # (batch, n_ckpt, D, N) fp32 out: the state before each run of CHECKPOINT tokens
    dim, T, N,    # sizes: channels D, tokens, state size
    CHECKPOINT,   # tokens between saved states
    HAS_STATE: tl.constexpr,
    BLOCK_D: tl.constexpr,   # channels per program
    BLOCK_N: tl.constexpr,   # N rounded up to a power of two
):
    pid_b = tl.program_id(0).to(tl.int64)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    mask_d, mask_n = offs_d < dim, offs_n < N
    mask_dn = mask_d[:, None] & mask_n[None, :]
    dn = offs_d[:, None].to(tl.int64) * N + offs_n[None, :]      # offsets in a (D, N) matrix
    A = tl.load(A_ptr + dn, mask=mask_dn, other=0.0)
    if HAS_STATE:
        x = tl.load(state_ptr + pid_b * dim * N + dn, mask=mask_dn, other=0.0)
    else:
        x = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)
    # int64 row starts: D T passes 2^31 at long T (D = 8192 from T = 262,144)
    seq = pid_b * dim * T + offs_d.to(tl.int64) * T              # row starts in (batch, D, T) tensors
    bc = pid_b * N * T + offs_n.to(tl.int64) * T                 # row starts in (batch, N, T) tensors
    run = tl.cast(CHECKPOINT, tl.int64)                          # int64 token counters too, as every offset
    n_ckpt = tl.cdiv(T, run)
    # Software pipelining: step t + 1's u, delta, B, C are loaded before step t's arithmetic and carried as loop
    # variables (raw, in the input dtype), so that a step waits for its exponential, not for a memory round trip.
    nxt = _load_step(u_ptr, delta_ptr, B_ptr, C_ptr, seq, bc, 0, mask_d, mask_n, T)
    for c in range(n_ckpt):
        tl.store(ckpt_ptr + (pid_b * n_ckpt + c) * dim * N + dn, x, mask=mask_dn)
        for t in range(c * run, tl.minimum(c * run + run, T)):
            u, dt, Bt, Ct = nxt
            nxt = _load_step(u_ptr, delta_ptr, B_ptr, C_ptr, seq, bc, t + 1, mask_d, mask_n, T)
            u = u.to(tl.float32)
            Bt = Bt.to(tl.float32)
            x = tl.exp(dt[:, None] * A) * x + (dt * u)[:, None] * Bt[None, :]
            tl.store(y_ptr + seq + t, tl.sum(x * Ct.to(tl.float32)[None, :], axis=1), mask=mask_d)
    tl.store(last_ptr + pid_b * dim * N + dn, x, mask=mask_dn)


@triton.jit
def selective_scan_bwd_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr,   # the forward inputs, as in selective_scan_fwd_kernel
    ckpt_ptr,     # (batch, n_ckpt, D, N) fp32: the saved states, from the forward kernel
    dy_ptr,       # (batch, D, T) fp32 gradient of y
    dlast_ptr,    # (batch, D, N) fp32 gradient of the last state
    scratch_ptr,  # (batch, D blocks, CHECKPOINT, BLOCK_D, BLOCK_N) fp32 workspace: one run's states x_{t-1}
    du_ptr,       # (batch, D, T) fp32 out
    ddelta_ptr,   # (batch, D, T) fp32 out
    dA_ptr,       # (batch, D, N) fp32 out: this batch's share of dA (the caller sums over batch)
    dB_ptr,       # (batch, D blocks, N, T) fp32 out: this block of channels' share of dB
    dC_ptr,       # (batch, D blocks, N, T) fp32 out: likewise of dC
    dstate_ptr,   # (batch, D, N) fp32 out: gradient of the state before the first token
    dim, T, N,    # sizes
    CHECKPOINT,   # tokens between saved states, as in the forward call
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_b = tl.program_id(0).to(tl.int64)
    pid_d = tl.program_id(1)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    mask_d, mask_n = offs_d < dim, offs_n < N
    mask_dn = mask_d[:, None] & mask_n[None, :]
    dn = offs_d[:, None].to(tl.int64) * N + offs_n[None, :]
    A = tl.load(A_ptr + dn, mask=mask_dn, other=0.0)
    seq = pid_b * dim * T + offs_d.to(tl.int64) * T              # int64, as in the forward
    bc = pid_b * N * T + offs_n.to(tl.int64) * T
    partial = (pid_b * tl.num_programs(1) + pid_d) * N * T + offs_n.to(tl.int64) * T   # rows of dB, dC's slice
    scratch = (scratch_ptr + (pid_b * tl.num_programs(1) + pid_d) * CHECKPOINT * BLOCK_D * BLOCK_N
               + tl.arange(0, BLOCK_D)[:, None] * BLOCK_N + offs_n[None, :])
    nu = tl.load(dlast_ptr + pid_b * dim * N + dn, mask=mask_dn, other=0.0)   # dL/dx_t via the later tokens
    dA = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)
    run = tl.cast(CHECKPOINT, tl.int64)                          # int64 token counters, as in the forward
    n_ckpt = tl.cdiv(T, run)
    for i in range(n_ckpt):
        c = n_ckpt - 1 - i
        t0 = c * run
        length = tl.minimum(run, T - t0)
        # recompute the run's states from its checkpoint; keep x_{t-1} for every t
        x = tl.load(ckpt_ptr + (pid_b * n_ckpt + c) * dim * N + dn, mask=mask_dn, other=0.0)
        # each walk pipelined as the forward's, step t +- 1's loads issued before step t's arithmetic
        nxt = _load_step(u_ptr, delta_ptr, B_ptr, C_ptr, seq, bc, t0, mask_d, mask_n, T)
        for t in range(t0, t0 + length):
            tl.store(scratch + (t - t0) * BLOCK_D * BLOCK_N, x)
            u, dt, Bt, _ = nxt
            nxt = _load_step(u_ptr, delta_ptr, B_ptr, C_ptr, seq, bc, t + 1, mask_d, mask_n, t0 + length)
            x = tl.exp(dt[:, None] * A) * x + (dt * u.to(tl.float32))[:, None] * Bt.to(tl.float32)[None, :]
        tl.debug_barrier()    # the scratch stored by all threads is read below, in whatever layout the compiler picks
        # walk the run backwards
        last = t0 + length - 1
        nxt = _load_step(u_ptr, delta_ptr, B_ptr, C_ptr, seq, bc, last, mask_d, mask_n, T)
        dy_next = tl.load(dy_ptr + seq + last, mask=mask_d, other=0.0)
        x_prev_next = tl.load(scratch + (length - 1) * BLOCK_D * BLOCK_N)
        for j in range(length):
            t = last - j
            u, dt, Bt, Ct = nxt
            dy, x_prev = dy_next, x_prev_next
            nxt = _load_step(u_ptr, delta_ptr, B_ptr, C_ptr, seq, bc, t - 1, mask_d, mask_n, t0 + length, t0)
            dy_next = tl.load(dy_ptr + seq + t - 1, mask=mask_d & (seq * 0 + t - 1 >= t0), other=0.0)
            x_prev_next = tl.load(scratch + (t - 1 - t0) * BLOCK_D * BLOCK_N, mask=dn * 0 + j + 1 < length, other=0.0)
            u = u.to(tl.float32)
            Bt = Bt.to(tl.float32)
            Ct = Ct.to(tl.float32)
            alpha = tl.exp(dt[:, None] * A)
            x = alpha * x_prev + (dt * u)[:, None] * Bt[None, :]
            lam = nu + dy[:, None] * Ct[None, :]                  # dL/dx_t
            tl.store(dC_ptr + partial + t, tl.sum(dy[:, None] * x, axis=0), mask=mask_n)
            tl.store(dB_ptr + partial + t, tl.sum(lam * (dt * u)[:, None], axis=0), mask=mask_n)
            lam_B = tl.sum(lam * Bt[None, :], axis=1)
            grad_a = lam * alpha * x_prev                         # dL/d(delta_t A)
            dA += grad_a * dt[:, None]
            tl.store(du_ptr + seq + t, lam_B * dt, mask=mask_d)
            tl.store(ddelta_ptr + seq + t, tl.sum(grad_a * A, axis=1) + lam_B * u, mask=mask_d)
            nu = alpha * lam
        tl.debug_barrier()    # every thread has read the scratch before the previous run overwrites it
    tl.store(dA_ptr + pid_b * dim * N + dn, dA, mask=mask_dn)
    tl.store(dstate_ptr + pid_b * dim * N + dn, nu, mask=mask_dn)


def _launch_config(N: int, rows=None) -> Launch:
    """16 channels per program (BLOCK_D); BLOCK_N, N rounded up to a power of two. A (16, 16) state tile over 4 warps
    is 2 elements per thread: 56-80 registers (fewer warps cost more registers, up to 255 at 1 warp). With ``rows``
    (batch D: the forward) fewer channels, down to 4, until the grid has two programs per SM (batch 1, D = 1536:
    4 channels, 384 programs instead of 96), on fewer warps (4 x 16: one warp, whose sums over the states are
    shuffles). The backward keeps 16 channels: its dB, dC partial sums grow as D / BLOCK_D."""
    block_n = triton.next_power_of_2(N)
    block_d = 16 if rows is None else rows_per_program(rows, 16, 4)
    return Launch({"BLOCK_D": block_d, "BLOCK_N": block_n}, num_warps=max(1, min(4, block_d * block_n // 64)))


def _checkpoint_interval(T: int) -> int:
    """Tokens between saved states, ~sqrt(T) (8 to 256): the checkpoints and the scratch then cost about the same."""
    return min(256, max(8, triton.next_power_of_2(math.isqrt(T))))


def _grid(batch, dim, cfg: Launch):
    """One program per (batch, block of BLOCK_D channels)."""
    return (batch, triton.cdiv(dim, cfg["BLOCK_D"]))


def triton_launch(batch: int, dim: int, N: int, kernel: str) -> tuple[Launch, tuple[int, int]]:
    """A Triton kernel's launch for ``batch`` rows of ``dim`` channels with states of size N, as the launchers make
    it; the cost model (benchmarks/cost_model.py) reads it.

    Args:
        batch: B. dim: D, the channels. N: the state size.
        kernel: "fwd" (fewer channels a program when the grid is small) or "bwd".

    Returns:
        (launch, grid): the tile sizes and compiler options, and the programs per grid axis.
    """
    if kernel not in ("fwd", "bwd"):
        raise ValueError(f'kernel must be "fwd" or "bwd", got {kernel!r}')
    cfg = _launch_config(N, batch * dim) if kernel == "fwd" else _launch_config(N)
    return cfg, _grid(batch, dim, cfg)


def checkpoint_interval(T: int) -> int:
    """Tokens between the states the Triton forward saves for the backward (about sqrt(T), 8 to 256).

    Args:
        T: the sequence length.

    Returns:
        The interval, a power of two.
    """
    return _checkpoint_interval(T)


def selective_scan_fwd(u, delta, A, B, C, state):
    """Runs the forward kernel; returns y (C_t . x_t), the last state and the checkpoints the backward starts from."""
    batch, dim, T = u.shape
    N = A.shape[1]
    cfg, checkpoint = _launch_config(N, batch * dim), _checkpoint_interval(T)
    y = new_output((batch, dim, T), torch.float32, u.device)
    last = new_output((batch, dim, N), torch.float32, u.device)
    checkpoints = new_output((batch, triton.cdiv(T, checkpoint), dim, N), torch.float32, u.device)
    selective_scan_fwd_kernel[_grid(batch, dim, cfg)](
        u, delta, A, B, C, last if state is None else state, y, last, checkpoints, dim, T, N, checkpoint,
        HAS_STATE=state is not None, **cfg.blocks, **cfg.options)
    return y, last, checkpoints


def selective_scan_bwd(u, delta, A, B, C, checkpoints, dy, dlast):
    """Runs the backward kernel from the forward's checkpoints; returns the gradients of (u, delta, A, B, C) and of
    the initial state."""
    batch, dim, T = u.shape
    N = A.shape[1]
    cfg, checkpoint = _launch_config(N), _checkpoint_interval(T)
    grid = _grid(batch, dim, cfg)
    scratch = torch.empty((batch, grid[1], checkpoint, cfg["BLOCK_D"], cfg["BLOCK_N"]), dtype=torch.float32,
                          device=u.device)
    du, ddelta = (new_output((batch, dim, T), torch.float32, u.device) for _ in range(2))
    dA_per_batch, dstate = (new_output((batch, dim, N), torch.float32, u.device) for _ in range(2))
    dB, dC = (new_output((batch, grid[1], N, T), torch.float32, u.device) for _ in range(2))   # per channel block
    selective_scan_bwd_kernel[grid](
        u, delta, A, B, C, checkpoints, dy.float().contiguous(), dlast.float().contiguous(), scratch,
        du, ddelta, dA_per_batch, dB, dC, dstate, dim, T, N, checkpoint, **cfg.blocks, **cfg.options)
    return du, ddelta, dA_per_batch.sum(0), dB.sum(1), dC.sum(1), dstate


# ----------------------------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------------------------

class SelectiveScanFunction(torch.autograd.Function):
    """(u, delta, A, B, C, state) -> (y, last state): y_t = C_t . x_t, x_t = exp(delta_t A) x_{t-1} + delta_t B_t u_t.
    delta and A come in the compute dtype (fp32, or float64), u, B, C in the input dtype; state is None (zero) or
    in the compute dtype. y and the last state come out in the compute dtype."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, state, backend):
        run = _selective_scan_torch_fwd if backend == "torch" else selective_scan_fwd
        y, last, checkpoints = run(u, delta, A, B, C, state)
        ctx.save_for_backward(u, delta, A, B, C, checkpoints)
        ctx.backend, ctx.has_state = backend, state is not None
        return y, last

    @staticmethod
    @first_order_only
    def backward(ctx, dy, dlast):
        u, delta, A, B, C, checkpoints = ctx.saved_tensors
        run = _selective_scan_torch_bwd if ctx.backend == "torch" else selective_scan_bwd
        du, ddelta, dA, dB, dC, dstate = run(u, delta, A, B, C, checkpoints, dy.contiguous(), dlast.contiguous())
        return (du.to(u.dtype), ddelta.to(delta.dtype), dA.to(A.dtype), dB.to(B.dtype), dC.to(C.dtype),
                dstate if ctx.has_state else None, None)


# ----------------------------------------------------------------------------------------------------------------
# Public op
# ----------------------------------------------------------------------------------------------------------------

def _check_scan_shapes(u, delta, A, B, C, D, z, delta_bias, state, delta_softplus):
    """What selective_scan takes: u (batch, D, T) and A (D, N) with every size >= 1, the other tensors' shapes to
    match (the optional ones where given), and a bool delta_softplus; raises ValueError or TypeError."""
    check_tensor("u", u, (None, None, None))
    batch, dim, T = u.shape
    if min(batch, dim, T) < 1:
        raise ValueError(f"u must have shape (batch, D, T) with every size >= 1, got {tuple(u.shape)}")
    check_tensor("delta", delta, (batch, dim, T))
    check_tensor("A", A, (dim, None))
    N = A.shape[1]
    if N < 1:
        raise ValueError(f"A must have shape ({dim}, N) with N >= 1, got {tuple(A.shape)}")
    check_tensor("B", B, (batch, N, T))
    check_tensor("C", C, (batch, N, T))
    optional = {"D": (D, (dim,)), "z": (z, (batch, dim, T)), "delta_bias": (delta_bias, (dim,)),
                "state": (state, (batch, dim, N))}
    for name, (x, shape) in optional.items():
        if x is not None:
            check_tensor(name, x, shape)
    if not isinstance(delta_softplus, bool):
        raise TypeError(f"delta_softplus must be a bool, got {type(delta_softplus).__name__}")


def _check_nonnegative_steps(delta, delta_bias, compute):
    """Without softplus, the steps delta (+ delta_bias) must be >= 0, as the reference requires; a NaN step passes on,
    as the reference carries it."""
    step = delta if delta_bias is None else delta.to(compute) + delta_bias.to(compute)[:, None]
    check_values(lambda: ~(step < 0).any(),
                 "delta must be >= 0 (a step size) after delta_bias (delta_softplus=False)",
                 lambda: f", got min {step.min().item()}")


def _scan_steps(delta, delta_bias, delta_softplus, compute):
    """The steps the torch and Triton paths scan with: delta + delta_bias, softplus'd when asked, in ``compute``."""
    dt = delta.to(compute)
    if delta_bias is not None:
        dt = dt + delta_bias.to(compute)[:, None]
    if delta_softplus:
        # Above the threshold softplus(x) is taken as x; at torch's default, 20, that is off by e^-20 = 2e-9, which
        # float64 sees. At 40 it is off by 4e-18, and exp(40) is still far from overflowing fp32.
        dt = F.softplus(dt, threshold=40.0)
    return dt


def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, *, delta_softplus=False, state=None,
                   backend=None):
    """Mamba's selective scan: x_t = exp(delta_t A) x_{t-1} + delta_t B_t u_t, y_t = C_t . x_t + D u_t, times
    silu(z_t) when z is given; delta <- softplus(delta + delta_bias) first when asked.

    Differentiable in every tensor argument on every backend.

    Args:
        u, delta (torch.Tensor): (batch, D, T), the input and the step sizes.
        A (torch.Tensor): (D, N), one diagonal state matrix per channel (Mamba's -exp(A_log)).
        B, C (torch.Tensor): (batch, N, T). u, delta, B, C (and z) share one dtype: fp32, fp16 or bf16 (float64
            too on the torch backend); A, D and delta_bias take that dtype or fp32.
        D (torch.Tensor or None): (D,), the skip term D u. Default: none.
        z (torch.Tensor or None): (batch, D, T), the gate. Default: none.
        delta_bias (torch.Tensor or None): (D,), added to delta. Default: none.
        delta_softplus (bool): take softplus(delta + delta_bias). Default: False.
        state (torch.Tensor or None): (batch, D, N), the x before the first token, fp32 (float64 for float64
            inputs). Default: zeros.
        backend (str or None): "torch", "triton" (on CPU tensors the Triton interpreter, TRITON_INTERPRET=1), "c"
            (kernels/ssm/ssm.c, CPU) or None. None runs the first that takes the call, in this order: "triton" (CUDA
            tensors), "c" (CPU tensors in fp32, fp16 or bf16 where the C loops build), "torch" (any other call). A
            backend named here that cannot take the call raises with its reason (kernels/backends.py).
            Default: None.
    Returns:
        (y (batch, D, T) in the input dtype, last_state (batch, D, N) fp32, float64 for float64 inputs): feed
        last_state back as state to continue the sequence.

    Source: Mamba (arXiv:2312.00752), Algorithm 2.
    """
    _check_scan_shapes(u, delta, A, B, C, D, z, delta_bias, state, delta_softplus)
    device = check_devices(u=u, delta=delta, A=A, B=B, C=C, D=D, z=z, delta_bias=delta_bias, state=state)
    dtype = check_same_dtype(u=u, delta=delta, B=B, C=C, z=z)
    grad = needs_grad(u, delta, A, B, C, D, z, delta_bias, state)
    backend = dispatch(Call("selective_scan", device, dtype, grad=grad), backend)
    compute = accumulation_dtype(dtype)
    for name, x in (("A", A), ("D", D), ("delta_bias", delta_bias)):
        check_decay_dtype(name, x, dtype)
    if state is not None and state.dtype != compute:
        raise TypeError(f"state must have dtype {compute} (states are kept in {compute} for {dtype} inputs), "
                        f"got {state.dtype}")

    if not delta_softplus:   # softplus makes every step >= 0; without it, refuse what the reference refuses
        _check_nonnegative_steps(delta, delta_bias, compute)
    if backend == "c":   # the whole op in the loop: bias, softplus, scan, skip and gate; A = -inf too
        return c_loops.selective_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, state, grad)
    # A = -inf, a decay of exactly 0 (the reference takes finite A only): e^{delta A} = 0 whatever the step, also
    # at delta = 0 (the torch path's padding), where 0 * -inf would be NaN
    A = finite_log_decay(A)
    dt = _scan_steps(delta, delta_bias, delta_softplus, compute)
    y, last = SelectiveScanFunction.apply(u.contiguous(), dt.contiguous(), A.to(compute).contiguous(), B.contiguous(),
                                   C.contiguous(), None if state is None else state.contiguous(), backend)
    if D is not None:
        y = y + D.to(compute)[:, None] * u.to(compute)
    if z is not None:
        y = y * F.silu(z.to(compute))
    return y.to(dtype), last


# ----------------------------------------------------------------------------------------------------------------
# Ahead-of-time build (python -m seqmix.kernels.aot)
# ----------------------------------------------------------------------------------------------------------------

def aot_kernels():
    """Forward and backward kernels at Mamba sizes (D = 1536 and 8192, N = 16, T = 2048), fp32 and bf16 inputs, at
    the configurations the dispatcher picks for batch 1 (the forward's channels per program follow batch * D). D and T
    are runtime arguments: the compiled kernel depends only on the launch configuration and the dtypes."""
    from ..aot import AotKernel
    kernels = []
    for dim in (1536, 8192):
        for dtype in ("fp32", "bf16"):
            # u, B, C in the input dtype; every other pointer fp32
            types = {"u_ptr": f"*{dtype}", "B_ptr": f"*{dtype}", "C_ptr": f"*{dtype}",
                     "dim": "i32", "T": "i32", "N": "i32", "CHECKPOINT": "i32"}
            for fn, label, flags, cfg in ((selective_scan_fwd_kernel, "selective_scan_fwd", {"HAS_STATE": True},
                                           _launch_config(16, dim)),
                                          (selective_scan_bwd_kernel, "selective_scan_bwd", {}, _launch_config(16))):
                kernels.append(AotKernel(f"{label} D={dim} N=16 {dtype}", fn, {**flags, **cfg.blocks}, types,
                                         "*fp32", cfg.num_warps, cfg.num_stages))
    return kernels
