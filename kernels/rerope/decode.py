"""ReRoPE decode in one launch (backend "triton_merged"): the cache split across programs as flash-decoding does,
and the splits' merge done by the last program of each (batch, head) to finish, in the same kernel.

One query at position i = T - 1 against the T cached keys, stored before RoPE:

    score_j = (R(p_near) q sigma scale) . (R(j) k_j)                 where i - j < w   (near: RoPE)
    score_j = (R(p_far) q sigma scale) . (R(f_j) k_j)                 where i - j >= w  (far)
    p_near = i;  ReRoPE: p_far = w, f_j = 0;  Leaky: p_far = (i - w)/k + w, f_j = j/k
    O = sum_j e^{score_j - LSE} v_j,   LSE = log sum_j e^{score_j}

Program (b h, s) walks the s-th slice of keys [s K, s K + K), K = keys_per_split, in tiles of BLOCK_N keys, each
rotated in registers for the path(s) its tile needs (far only, the tile that straddles i - j = w, near only:
fused._key_runs with one query row), keeping its own online softmax (m_s, l_s, acc_s). It writes its slice's
softmax, O_s = acc_s / l_s and LSE_s = m_s + log l_s (fp32), then adds 1 to its head's arrival counter. The program
that finds the counter at splits - 1 is the last of its head: every other slice is written, and it merges them,

    O = sum_s e^{LSE_s - LSE} O_s,   LSE = M + log sum_s e^{LSE_s - M},  M = max_s LSE_s,

reading the slices in order s = 0, 1, ... (the same sums in the same order whichever program comes last: the result
is the same bits every run), stores O in the input dtype and sets the counter back to 0 for the next launch.

Why it replaces the "triton" backend's decode (fused.py): that one ran the prefill kernel with one live row in a
16-row tile (tl.dot's smallest: 15 rows of dot work wasted, on the FMA units for fp32) and merged the splits in torch,
about 14 small kernels (logsumexp alone is 9) at about 2 us each: most of its measured 45-68 us
(/work/shared/reviews/gpu-round-2.md, 3a). Here the scores are one row: elementwise products summed over the head
dim, no tl.dot; K and V are read once, and the merge adds only the splits' (d + 1) fp32 numbers per head.

Ordering on a GPU. The slices' stores are made visible before the counter moves, and the last program reads what the
others wrote, with the pattern of CUTLASS's semaphore: a barrier (tl.debug_barrier) so that every thread's stores
come before the arrival; the arrival an atomic add with acq_rel semantics at GPU scope (release: this program's
stores; acquire: the others', for the last); the merge's loads with cache_modifier ".cg" (from L2, not a stale L1).
tests/kernels/test_aot_rerope.py reads the order (bar.sync, atom.acq_rel.gpu, ld.global.cg) in the PTX. The counters
are one int32 per (batch, head), cached per device and stream (a launch leaves them at 0; two streams never share
one). Under the interpreter the programs run one after another, and the last of a head is its last slice.

Non-finite scores behave as in the "triton" backend (the same online softmax, the same merge): +inf or NaN make the
output NaN, -inf is a weight of 0, and a slice whose every score is -inf (only infinite keys make one) makes the row
NaN (e^{-inf - -inf}), as the "triton" backend's slices do.

The backward (a gradient through decode is rare: a probe, a test) is the "triton" backend's: fused.rerope_fwd
recomputes O and LSE with the scores its backward kernels recompute, then fused.rerope_bwd; the gradients are that
backend's to the bit. Own scores would differ from the backward's in their last bits (a sum over d in another
order), which at scores near 200 moves P = e^{S - LSE} by more than the fp32 budget.
"""
from __future__ import annotations

import torch

from .._common import Launch, first_order_only, new_output, tl, triton
from .._flash import block_d, flash_head
from .fused import (BAND, FAR_ONLY, NEAR_ONLY, _inv_log_len, _key_runs, _rotated_keys, _rotated_queries,
                    decode_splits, rerope_bwd, rerope_fwd)
from .rotation import cached_rotation_table

__all__ = ["ReropeDecodeFunction", "rerope_decode_merged", "launch_config", "aot_kernels", "MERGE_SPLITS"]

MERGE_SPLITS = 16   # slices the merge reads per step: (16, d) fp32, whatever the number of slices


def launch_config(head_dim: int, dtype: torch.dtype) -> Launch:
    """Keys per tile, warps and pipeline stages of rerope_decode_merged_kernel for head size ``head_dim`` (any input
    dtype: the products are fp32 lanes, no tensor cores): chosen on the AOT build for sm_90 (no spills, no stack;
    tests/kernels/test_aot_rerope.py). Two stages: the next tile's keys and values are loaded during this one's
    arithmetic (the review's advice for the fp32 decode as well).

    Args:
        head_dim: d. dtype: the inputs' dtype (the same tiles for all three).
    Returns:
        The Launch (BLOCK_N, num_warps, num_stages).
    """
    return Launch({"BLOCK_N": 64 if head_dim <= 64 else 32}, num_warps=4, num_stages=2)


@triton.jit
def _decode_scores(q1n, q2n, q1f, q2f, k1n, k2n, k1f, k2f, pos_j, T_k, window, RUN: tl.constexpr):
    """The scores (BLOCK_N,) of one key tile for the query at T_k - 1: fp32 products of the rotated halves summed
    over d, per path as in fused._pair_scores (the query halves are (1, BLOCK_F) rows, broadcast over the keys).
    Tiles that reach the end of the cache mask keys j >= T_k with -inf."""
    if RUN & 2:
        s_near = tl.sum(q1n.to(tl.float32) * k1n.to(tl.float32) + q2n.to(tl.float32) * k2n.to(tl.float32), 1)
    if RUN & 1:
        s_far = tl.sum(q1f.to(tl.float32) * k1f.to(tl.float32) + q2f.to(tl.float32) * k2f.to(tl.float32), 1)
    if RUN == BAND:
        s = tl.where((T_k - 1 - pos_j) < window, s_near, s_far)
    elif RUN == NEAR_ONLY:
        s = s_near
    else:
        s = s_far
    if RUN & 2:
        s = tl.where(pos_j < T_k, s, float("-inf"))
    return s


@triton.jit
def _decode_run(acc, m_i, l_i,                      # the slice's running softmax: (BLOCK_D,), scalar, scalar
                q1n, q2n, q1f, q2f,                 # the query, rotated for both paths: (1, BLOCK_F) halves
                k_ptr, v_ptr, rot_ptr, T_k, rot_len, window,
                freqs, dims, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, LEAKY: tl.constexpr,
                lo, hi, RUN: tl.constexpr):
    """One run of key tiles [lo, hi) of one class: the online softmax of _flash.online_softmax_step for one row,
        m' = max(m, max_j s_j);  l' = e^{m - m'} l + sum_j e^{s_j - m'};
        acc' = e^{m - m'} acc + sum_j e^{s_j - m'} v_j.
    The slice's first tile holds its first key, a real one, so m is finite from then on (finite inputs)."""
    for start_n in range(lo, hi, BLOCK_N):
        pos_j = start_n + tl.arange(0, BLOCK_N)
        k1n, k2n, k1f, k2f = _rotated_keys(k_ptr, rot_ptr, pos_j, T_k, rot_len, freqs, HEAD_DIM, RUN, LEAKY)
        s = _decode_scores(q1n, q2n, q1f, q2f, k1n, k2n, k1f, k2f, pos_j, T_k, window, RUN)
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        v = tl.load(v_ptr + pos_j[:, None] * HEAD_DIM + dims[None, :],
                    mask=(pos_j < T_k)[:, None] & (dims < HEAD_DIM)[None, :], other=0.0)
        l_i = l_i * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _merge_slices(o_ptr, lse_ptr, n_splits, dims, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_S: tl.constexpr):
    """O (BLOCK_D,) from one head's slices O_s (n_splits, d) and LSE_s (n_splits,), fp32, read BLOCK_S at a time in
    order: O = sum_s e^{LSE_s - M} O_s / sum_s e^{LSE_s - M}, M = max_s LSE_s (slices past the last are LSE -inf,
    O 0: weight 0). A NaN LSE_s makes every column NaN. The loads go to L2 (".cg"): other programs wrote them."""
    top = tl.full((BLOCK_S,), float("-inf"), tl.float32)
    for s0 in range(0, n_splits, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        top = tl.maximum(top, tl.load(lse_ptr + s, mask=s < n_splits, other=float("-inf"), cache_modifier=".cg"))
    m = tl.max(top, 0)
    total = tl.zeros((BLOCK_S,), tl.float32)
    acc = tl.zeros((BLOCK_S, BLOCK_D), tl.float32)
    for s0 in range(0, n_splits, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        lse = tl.load(lse_ptr + s, mask=s < n_splits, other=float("-inf"), cache_modifier=".cg")
        o = tl.load(o_ptr + s[:, None] * HEAD_DIM + dims[None, :],
                    mask=(s < n_splits)[:, None] & (dims < HEAD_DIM)[None, :], other=0.0, cache_modifier=".cg")
        w = tl.exp(lse - m)
        total += w
        acc += w[:, None] * o
    return tl.sum(acc, 0) / tl.sum(total, 0)


@triton.jit
def rerope_decode_merged_kernel(
    q_ptr,                      # (B*H, 1, d) contiguous, input dtype, before RoPE: the query at position T_k - 1
    k_ptr, v_ptr,               # (B*H, T_k, d) contiguous, input dtype, k before RoPE: the cache, own key included
    o_ptr,                      # (B*H, 1, d) output, input dtype
    o_split_ptr,                # (B*H, splits, d) fp32 scratch: each slice's softmax O_s
    lse_split_ptr,              # (B*H, splits) fp32 scratch: each slice's LSE_s
    arrivals_ptr,               # (B*H,) int32, 0 on entry and on exit: slices of the head finished so far
    rot_ptr,                    # (paths, 2, rot_len, d/2) fp32: cos and sin of each path (rotation.rotation_table)
    T_k,                        # cached keys, >= 1
    rot_len,                    # positions in the rotation table, >= T_k
    keys_per_split,             # keys of each program's slice, a multiple of BLOCK_N
    window,                     # w >= 1: keys at distance T_k - 1 - j < w take the near (RoPE) score
    inv_log_len,                # 1/ln(train_length) for log-n scaling, 0 without
    scale,                      # score scale
    HEAD_DIM: tl.constexpr,     # d
    BLOCK_F: tl.constexpr,      # d/2 rounded up to a power of two >= 16: one half of a rotated row
    BLOCK_D: tl.constexpr,      # d rounded up to a power of two >= 16: a value row
    BLOCK_N: tl.constexpr,      # keys per tile
    BLOCK_S: tl.constexpr,      # slices the merge reads per step (MERGE_SPLITS)
    LEAKY: tl.constexpr,        # Leaky ReRoPE: the far key is rotated (path FAR_K)
):
    bh = flash_head()
    split = tl.program_id(1)
    n_splits = tl.num_programs(1)
    k_ptr += bh * T_k * HEAD_DIM
    v_ptr += bh * T_k * HEAD_DIM
    freqs = tl.arange(0, BLOCK_F)
    dims = tl.arange(0, BLOCK_D)
    # The query as a one-row tile, rotated and scaled by the prefill's own function (the same operands)
    q1n, q2n, q1f, q2f = _rotated_queries(q_ptr + bh * HEAD_DIM, rot_ptr, tl.arange(0, 1), 1, T_k, rot_len, freqs,
                                          inv_log_len, scale, HEAD_DIM)
    far_end, near_start, end = _key_runs(0, 1, T_k, window, 1, BLOCK_N)
    lo = split * keys_per_split
    hi = lo + keys_per_split
    acc = tl.zeros((BLOCK_D,), tl.float32)
    m_i = tl.max(tl.full((BLOCK_N,), float("-inf"), tl.float32), 0)     # a scalar -inf, as tl.max makes them
    l_i = tl.sum(tl.zeros((BLOCK_N,), tl.float32), 0)
    acc, m_i, l_i = _decode_run(acc, m_i, l_i, q1n, q2n, q1f, q2f, k_ptr, v_ptr, rot_ptr, T_k, rot_len, window,
                                freqs, dims, HEAD_DIM, BLOCK_N, LEAKY,
                                lo, tl.minimum(far_end, hi), FAR_ONLY)
    acc, m_i, l_i = _decode_run(acc, m_i, l_i, q1n, q2n, q1f, q2f, k_ptr, v_ptr, rot_ptr, T_k, rot_len, window,
                                freqs, dims, HEAD_DIM, BLOCK_N, LEAKY,
                                tl.maximum(far_end, lo), tl.minimum(near_start, hi), BAND)
    acc, m_i, l_i = _decode_run(acc, m_i, l_i, q1n, q2n, q1f, q2f, k_ptr, v_ptr, rot_ptr, T_k, rot_len, window,
                                freqs, dims, HEAD_DIM, BLOCK_N, LEAKY,
                                tl.maximum(near_start, lo), tl.minimum(end, hi), NEAR_ONLY)
    slot = bh * n_splits + split
    tl.store(o_split_ptr + slot * HEAD_DIM + dims, acc / l_i, mask=dims < HEAD_DIM)
    tl.store(lse_split_ptr + slot, m_i + tl.log(l_i))
    # Every thread's stores before the arrival; the last to arrive merges (module docstring, "Ordering on a GPU").
    tl.debug_barrier()
    arrived = tl.atomic_add(arrivals_ptr + bh, 1, sem="acq_rel", scope="gpu")
    if arrived == n_splits - 1:
        o = _merge_slices(o_split_ptr + bh * n_splits * HEAD_DIM, lse_split_ptr + bh * n_splits, n_splits, dims,
                          HEAD_DIM, BLOCK_D, BLOCK_S)
        tl.store(o_ptr + bh * HEAD_DIM + dims, o.to(o_ptr.dtype.element_ty), mask=dims < HEAD_DIM)
        tl.store(arrivals_ptr + bh, 0)


# ----------------------------------------------------------------------------------------------------------------
# Launcher, autograd
# ----------------------------------------------------------------------------------------------------------------

# The arrival counters, by (device, stream): int32 zeros, at least one per (batch, head) asked for so far; each
# launch leaves its counters at zero, so the next launch on the same stream reuses them.
_ARRIVALS: dict = {}


def _arrival_counters(n: int, device: torch.device) -> torch.Tensor:
    """(n,) int32 counters at zero for one launch on ``device``'s current stream, grown by doubling."""
    stream = torch.cuda.current_stream(device).stream_id if device.type == "cuda" else None
    key = (device, stream)
    counters = _ARRIVALS.get(key)
    if counters is None or counters.numel() < n:
        length = n if counters is None else max(n, 2 * counters.numel())
        with torch.inference_mode(False), torch.no_grad():
            counters = torch.zeros(length, dtype=torch.int32, device=device)
        _ARRIVALS[key] = counters
    return counters


def _constexprs(head_dim: int, leaky: bool, cfg: Launch) -> dict:
    return dict(HEAD_DIM=head_dim, BLOCK_F=block_d(head_dim // 2), BLOCK_D=block_d(head_dim), **cfg.blocks,
                BLOCK_S=MERGE_SPLITS, LEAKY=leaky)


def rerope_decode_merged_fwd(q, k, v, rot, window, leaky, train_length, scale):
    """Runs rerope_decode_merged_kernel: q (B, H, 1, d), k, v (B, H, T_k, d), contiguous; rot the rotation table
    (at least T_k positions). Returns O (B, H, 1, d) in q's dtype."""
    B, H, _, d = q.shape
    T_k = k.shape[2]
    cfg = launch_config(d, q.dtype)
    per_split, splits = decode_splits(T_k, B * H, cfg["BLOCK_N"])
    o = new_output(q.shape, q.dtype, q.device)
    o_split = new_output((B * H, splits, d), torch.float32, q.device)
    lse_split = new_output((B * H, splits), torch.float32, q.device)
    rerope_decode_merged_kernel[(B * H, splits)](
        q, k, v, o, o_split, lse_split, _arrival_counters(B * H, q.device), rot, T_k, rot.shape[2], per_split,
        window, _inv_log_len(train_length), scale, **_constexprs(d, leaky, cfg), **cfg.options)
    return o


class ReropeDecodeFunction(torch.autograd.Function):
    """Decode on rerope_decode_merged_kernel; the backward is the "triton" backend's (module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, window, leaky_k, scale, train_length, base):
        rot = cached_rotation_table(k.shape[2], q.shape[-1], window, leaky_k, base, q.device)
        ctx.save_for_backward(q, k, v, rot)
        ctx.args = (window, leaky_k is not None, train_length, scale)
        return rerope_decode_merged_fwd(q, k, v, rot, *ctx.args)

    @staticmethod
    @first_order_only
    def backward(ctx, do):
        q, k, v, rot = ctx.saved_tensors
        o, lse = rerope_fwd(q, k, v, rot, *ctx.args)
        return (*rerope_bwd(q, k, v, o, lse, rot, do, *ctx.args), None, None, None, None, None)


def rerope_decode_merged(q, k, v, window, leaky_k, scale, train_length, base):
    """Decode, q (B, H, 1, d), k, v (B, H, T_k, d), options checked (rerope_decode's backend "triton_merged")."""
    return ReropeDecodeFunction.apply(q.contiguous(), k.contiguous(), v.contiguous(), window, leaky_k, scale,
                                      train_length, base)


# ----------------------------------------------------------------------------------------------------------------
# Ahead-of-time build (python -m seqmix.kernels.aot)
# ----------------------------------------------------------------------------------------------------------------

def aot_kernels():
    """rerope_decode_merged_kernel, ReRoPE and Leaky, at head size 64 and 128 in fp32, fp16 and bf16, at the launch
    configuration of launch_config."""
    from ..aot import AOT_DTYPES, FLASH_ARG_TYPES, AotKernel
    types = {**FLASH_ARG_TYPES, "o_split_ptr": "*fp32", "lse_split_ptr": "*fp32", "arrivals_ptr": "*i32"}
    kernels = []
    for d in (64, 128):
        for dtype, torch_dtype in AOT_DTYPES.items():
            cfg = launch_config(d, torch_dtype)
            for leaky in (False, True):
                kernels.append(AotKernel(f"rerope_decode_merged d={d} {dtype}{' leaky' if leaky else ''}",
                                         rerope_decode_merged_kernel, _constexprs(d, leaky, cfg), types,
                                         "*" + dtype, cfg.num_warps, cfg.num_stages, wide_offsets=False))
    return kernels
