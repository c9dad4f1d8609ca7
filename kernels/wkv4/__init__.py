"""RWKV-4's WKV operator: a chunked torch path and Triton forward/backward kernels, exact for keys of any size
(and, on a CPU, the Triton kernels' recurrences as C loops, forward and backward: kernels/wkv4/c.py).

    wkv_t = (sum_{i<t} e^{(t-1-i) w + k_i} v_i + e^{u + k_t} v_t) / (sum_{i<t} e^{(t-1-i) w + k_i} + e^{u + k_t})

Shapes: w, u (C,); k, v (B, T, C) -> wkv (B, T, C); state (num, den, max), each (B, C) fp32, in Hugging Face's
order and meaning: num = N^ e^{-max}, den = D^ e^{-max}, where N^, D^ are the numerator and denominator sums of the
tokens seen so far and max is the largest exponent among their terms (-1e38 before any token), so that a state of
this op and one of transformers' ``rwkv_linear_attention_cpu`` are interchangeable. w is the per-step log decay,
w = -exp(time_decay) <= 0. Float64 truth: reference/wkv4.py. Source: the "Rwkv attention and the recurrent
formulas" section of https://huggingface.co/docs/transformers/model_doc/rwkv; RWKV paper arXiv:2305.13048.

Torch path (chunked). Cut time into chunks of L tokens and take every chunk's rows relative to e^K, K its largest
key, so that each term is a number of at most 1 times a decay: with E_j = e^{k_j - K}, the sums over the chunk's
past tokens P_tau = sum_{j<tau} e^{(tau-1-j) w} (E_j v_j, E_j) follow the recurrence

    P_0 = 0,   P_{tau+1} = e^w P_tau + (E_tau v_tau, E_tau),

which runs over the L offsets of all chunks at once (one multiply-add over (B, chunks, C) per offset). Every factor
is <= 1, so nothing overflows, whatever the decay: steep decays simply fade the past. Row tau is then P_tau, plus
e^u (E_tau v_tau, E_tau) for the current token, plus e^{max + tau w - K} (num, den) for the state carried into the
chunk, and wkv is their ratio. Between chunks (num, den, max) advance in closed form: max' = max(max + L w, nu)
(nu = max_j k_j + (L-1-j) w, the chunk's largest term at its end) and P_L comes in scaled by e^{K - nu}, exact
whatever the keys: the largest term is kept at e^0 and anything that underflows is below fp32's resolution next to
it. The rows are exact only while the chunk's keys (and u + keys) lie within e^-KEY_RANGE of K; the rows of other
(batch, chunk, channel) columns (keys of several hundred) come from the max-tracked recurrence over the chunk's L
offsets, all such columns at once, and their chunk sums from the terms e^{k_j + (L-1-j) w - nu}. Exponent
differences are formed from differences of nearby numbers (key - the chunk's largest key, max - max), which keeps
fp32's relative precision for keys of several hundred. Python loops run over chunks (a few (B, C) operations
each), over blocks of BLOCK tokens and over the L offsets of a chunk; none over tokens.

Triton path. One program per (batch, block of channels) walks time with the max-tracked recurrence in fp32
registers; max is kept as the exponent that set it plus a count of decays (anchor + lag w), for the same precision
reason. Both kernels are software-pipelined: step t + 1's loads are issued before step t's arithmetic (loop variables),
so two memory round trips overlap and a step waits about half of one, plus its chain of exponentials and the division.
What stays serial: the T steps of each channel. Channels per program are not split further: one thread per channel, and
a warp of 32 channels walks its steps as fast as one channel would. The forward saves, per token, v_t - y_t,
d_t = max_t - (u + k_t) and z_t = Z_t e^{-max(max_t, u + k_t)}, where Z_t = D^_t + e^{u + k_t} is the output's
denominator. The backward walks time in reverse with the adjoints of the represented sums and of their w-derivatives,

    A_N(t) = dL/dN^_t = gy_t / Z_t + e^w A_N(t+1),   A_D(t) = -gy_t y_t / Z_t + e^w A_D(t+1),
    B(t) = e^w (B(t+1) + A(t+1)),

kept multiplied by e^{max_t}, so that every factor is one of the forward's exponentials (<= 1), rebuilt from d_t
and z_t. Then dL/dv_i = e^{k_i} A_N(i+1) + gy_i e^{u+k_i}/Z_i, dL/dk_i = e^{k_i} (A_N(i+1) v_i + A_D(i+1)) +
gy_i e^{u+k_i} (v_i - y_i)/Z_i, dL/du = sum_i gy_i e^{u+k_i} (v_i - y_i)/Z_i,
dL/dw = sum_i e^{k_i} (B_N(i+1) v_i + B_D(i+1)) + B_N(0) N^_0 + B_D(0) D^_0.

Gradients of the state. The state is a redundant representation: (num e^{-d}, den e^{-d}, max + d) means the same
sums. For the initial state, dL/dnum_0 = e^{max_0} A_N(0), dL/dden_0 = e^{max_0} A_D(0), and
dL/dmax_0 = num_0 dL/dnum_0 + den_0 dL/dden_0 (moving max_0 rescales the sums it stands for; it is not zero),
plus the route below. The final max is itself an output, max_T = max(max_0 + T w, max_i k_i + (T-1-i) w). Its
effective gradient g_max - num_T g_num - den_T g_den (the returned num_T, den_T are divided by e^{max_T}) flows to
the term that attains the maximum: k_i, and w with weight T-1-i; or max_0, and w with weight T. This is what
autograd through the stable recurrence gives (away from ties); for a loss of y alone the route carries zero.
"""
from __future__ import annotations

import torch

from . import c as c_loops
from .._common import (Launch, accumulation_dtype, check_decay_dtype, check_devices, check_same_dtype,
                       check_tensor, check_values, first_order_only, needs_grad, new_output,
                       plus_inf_as_nan, tl, triton)
from ..backends import Call, dispatch

__all__ = ["wkv4", "INITIAL_MAX", "triton_launch"]

# The state's maximum before any token: HF's CPU loop and CUDA kernel start from this finite "minus infinity"
# (e^{max - q} = 0 without inf - inf); keeping it makes states interchangeable with transformers'.
INITIAL_MAX = -1e38

# The torch path's chunks and the bounds of its exponents.
CHUNK = 16          # tokens per chunk: the in-chunk recurrence runs over these L offsets, all chunks at once
BLOCK = 256         # tokens per call of the chunked computation, so that its intermediates stay in cache
KEY_RANGE = 30.0    # a chunk's rows come from the in-chunk recurrence when its keys (and u + keys) lie within
                    # e^-KEY_RANGE of its largest key; other (batch, chunk, channel) columns are redone one by one
DECAY_FLOOR = 55.0  # e^w is taken as at least e^-55: past terms (>= e^-KEY_RANGE) times it stay normal fp32 numbers,
                    # and what the floor adds is below e^-(55 - KEY_RANGE) = 1e-11 of the row's current term
FLOOR = 60.0        # exponents are clamped at -FLOOR (see below)
STATE_FLOOR = 80.0  # the same for the carried state's factor: rows span down to e^-KEY_RANGE, and 80 - 30 leaves e^-50
BONUS_CAP = 20.0    # e^u is formed directly; u above it (never in trained models) is redone
W_FLOOR = -1e30     # w below this (down to -inf, a decay of exactly 0) is taken as W_FLOOR: e^w = 0 all the same,
                    # and lag * w stays finite in fp32 for 2^24 steps and more
STATE_CAP = 60.0    # a state more than e^STATE_CAP above a chunk's own terms swamps them; capped against overflow
# Why a floor: on x86, torch.exp of a large negative number, and arithmetic on the denormals it yields, are 50-500
# times slower than normal. e^-60 is still a normal fp32 number, and a term below e^-60 of the largest term of its
# sum is below fp32's resolution there.


def _exp(x, high=None, floor=FLOOR):
    """e^x with x clamped to [-floor, high]: no denormals (see FLOOR), no overflow."""
    return torch.clamp(x, -floor, high).exp_()


# ----------------------------------------------------------------------------------------------------------------
# Torch path
# ----------------------------------------------------------------------------------------------------------------

def _stable_steps(w, u, k, v, num, den, mx):
    """The max-tracked recurrence over the L offsets of the chunks the in-chunk recurrence cannot take.

    k, v (..., L, X) with time on axis -2; w, u, num, den, mx broadcast against k[..., 0, :]. Returns each row's
    numerator and denominator (shaped like k), both divided by e^{the row's largest exponent}. Like the Triton
    kernel, the scale max is kept as the exponent that set it (anchor) and the steps since (lag), so that exponent
    differences come from key differences.
    """
    anchor, lag = mx, torch.zeros_like(mx)
    nums, dens = [], []
    for tau in range(k.shape[-2]):
        kt, vt = k[..., tau, :], v[..., tau, :]
        none = kt == -float("inf")                              # e^{-inf} = 0, not the floor's e^-60
        gap = (anchor - kt) + lag * w                           # max - k
        d = gap - u                                             # max - (u + k): past against the current token
        a, e = _exp(d, 0.0), _exp(-d, 0.0).masked_fill(none, 0.0)
        nums.append(torch.addcmul(e * vt, a, num))
        dens.append(torch.addcmul(e, a, den))
        d = gap + w                                             # (max + w) - k: decayed past against the new key
        a, e = _exp(d, 0.0), _exp(-d, 0.0).masked_fill(none, 0.0)
        num, den = torch.addcmul(e * vt, a, num), torch.addcmul(e, a, den)
        kept = d >= 0
        anchor, lag = torch.where(kept, anchor, kt), torch.where(kept, lag + 1, 0.0)
    return torch.stack(nums, -2), torch.stack(dens, -2)


def _torch_chunks(w, u, k, v, num, den, mx):
    """WKV over n chunks of L tokens: k, v (B, n, L, C); w, u (C,); state (B, C) -> (wkv (B, n, L, C), the final
    state).

    See the module docstring for the algebra. K's reference is detached (it cancels from every result); the maxima
    at chunk boundaries stay attached, since the last one is an output. Exponent differences are formed from
    differences of nearby numbers (key - largest key, max - max), which keeps fp32's relative precision for keys
    of several hundred.
    """
    B, n, L, C = k.shape
    # (B, n, 1, C) the chunk's largest key, NaN left out: a NaN key makes its own row and the later ones NaN, not
    # the chunk's earlier rows
    K = k.detach().masked_fill(k.isnan(), -float("inf")).amax(2, keepdim=True)
    K = K.masked_fill(K == -float("inf"), 0.0)     # keys all -inf (or NaN): any finite reference cancels, -inf's NaNs
    kK = k - K                                                            # (B, n, L, C) k_j - K <= 0
    E = _exp(kK).masked_fill(k == -float("inf"), 0.0)    # e^{k_j - K}; a key of -inf adds nothing (not the floor's)
    XE = torch.stack((E * v, E))                                          # (2, B, n, L, C) the terms of num, den
    # In-chunk sums over j < tau from a zero state: P_0 = 0, P_{tau+1} = e^w P_tau + XE_tau, all chunks at once.
    decay = _exp(w, floor=DECAY_FLOOR)                                    # (C,)
    sums = [torch.zeros_like(XE[:, :, :, 0])]                             # (2, B, n, C) each
    for tau in range(L):
        sums.append(torch.addcmul(XE[:, :, :, tau], decay, sums[-1]))
    # The chunk's largest term at its end, nu = K + max_j (k_j - K + (L-1-j) w): HF's max of the chunk alone
    # (attached: it can become the state's max).
    lag_to_end = torch.arange(L - 1, -1, -1, dtype=k.dtype, device=k.device)[:, None] * w   # (L, C) (L-1-j) w
    G = kK + lag_to_end                                                   # (B, n, L, C)
    nu_rel = G.amax(2)                                                    # (B, n, C) nu - K
    totals = sums[-1] * _exp(-nu_rel, KEY_RANGE)                              # (2, B, n, C) the chunk's sums / e^nu

    spread = kK.detach().amin(2) + u.detach().clamp_max(0)                # (B, n, C) smallest exponent - K
    redo = (spread < -KEY_RANGE) | (u.detach() > BONUS_CAP)                   # (B, n, C)
    any_redo = bool(redo.any())
    if any_redo:
        bi, ni, ci = redo.nonzero(as_tuple=True)                          # (F,) each: batch, chunk, channel
        column = lambda x: x[bi, ni, :, ci]                               # noqa: E731  (F, L)
        G_col = column(G)                                                 # -inf for a key of -inf: a zero term
        e = _exp(G_col - nu_rel[bi, ni, ci, None]).masked_fill(G_col == -float("inf"), 0.0)   # (F, L) over the largest
        totals[:, bi, ni, ci] = torch.stack(((e * column(v)).sum(1), e.sum(1)))

    # The maxima at chunk boundaries, HF's: max' = max(max + L w, nu), and (num, den) carried in closed form. nu is
    # rounded to fp32 (an ulp of 1e-3 at keys of 1e4): the chunk's totals come in scaled by e^{nu - max'} times
    # e^{the rounding error}, as the Triton kernel's two-sum does (max + L w needs none: keep takes the difference
    # of the maxima).
    K, Lw = K.squeeze(2), L * w
    nu = K + nu_rel                                                       # (B, n, C)
    back = nu - K
    nu_err = ((K - (nu - back)) + (nu_rel - back)).detach()               # (K + nu_rel) - nu, exactly
    nu_err = nu_err.masked_fill(nu == -float("inf"), 0.0)                 # a chunk of -inf keys: nothing to round
    maxima = [mx]
    for i in range(n):
        maxima.append(torch.maximum(maxima[-1] + Lw, nu[:, i]))
    maxima = torch.stack(maxima, 1)                                       # (B, n + 1, C)
    start, end = maxima[:, :-1], maxima[:, 1:]
    keep = _exp((start - end) + Lw)                                       # (B, n, C) e^{max_n + L w - max_{n+1}}
    added = _exp((nu - end) + nu_err) * totals                            # (2, B, n, C) e^{nu - max_{n+1}} totals
    carried = [torch.stack((num, den))]                                   # (2, B, C) each
    for i in range(n):
        carried.append(torch.addcmul(added[:, :, i], keep[:, i], carried[-1]))
    state = (carried[-1][0], carried[-1][1], maxima[:, -1])
    carried = torch.stack(carried[:-1], 2)                                # (2, B, n, C) at each chunk's start

    # Rows relative to e^K: past tokens P_tau and the state e^{max + tau w - K} (num, den), then the current token
    # of weight e^u E_tau.
    offsets = torch.arange(L, dtype=k.dtype, device=k.device)[:, None] * w                     # (L, C) tau w
    state_scale = _exp((start - K).unsqueeze(2) + offsets, STATE_CAP, STATE_FLOOR)             # (B, n, L, C)
    past = torch.stack(sums[:-1], 3).addcmul_(state_scale, carried.unsqueeze(3))               # (2, B, n, L, C)
    y = _CurrentTokenRatio.apply(past[0], past[1], _exp(u, BONUS_CAP) * E, v)                  # (B, n, L, C)

    if any_redo:
        exact = _stable_steps(w[ci, None], u[ci, None], column(k)[..., None], column(v)[..., None],
                              carried[0][bi, ni, ci, None], carried[1][bi, ni, ci, None], start[bi, ni, ci, None])
        y = y.index_put((bi[:, None], ni[:, None], torch.arange(L, device=k.device), ci[:, None]),
                        (exact[0] / exact[1])[..., 0])
    return y, state


class _CurrentTokenRatio(torch.autograd.Function):
    """y = (P_num + c v) / (P_den + c): a row's past P (its chunk's earlier tokens and the carried state) and its
    current token's weight c = e^{u + k - K}. The backward forms dy/dc = (v - y) / Z as (P_den v - P_num) / Z^2,
    without the cancellation of autograd through the ratio when the current token dominates (y ~ v), as the Triton
    kernel saves v - y."""

    @staticmethod
    def forward(ctx, p_num, p_den, c, v):
        ctx.save_for_backward(p_num, p_den, c, v)
        return (p_num + c * v) / (p_den + c)

    @staticmethod
    def backward(ctx, gy):
        p_num, p_den, c, v = ctx.saved_tensors
        z = p_den + c
        g = gy / z
        return g, -g * (p_num + c * v) / z, g * (p_den * v - p_num) / z, g * c


def _wkv4_torch(w, u, k, v, num, den, mx):
    """The chunked path over a whole sequence, BLOCK tokens at a time (full chunks), then the last T % CHUNK tokens
    as one shorter chunk."""
    B, T, C = k.shape
    n = T // CHUNK
    segments = [(first, min(first + BLOCK, n * CHUNK), CHUNK) for first in range(0, n * CHUNK, BLOCK)]
    segments += [(n * CHUNK, T, T - n * CHUNK)] if T > n * CHUNK else []
    ys, state = [], (num, den, mx)
    for first, end, L in segments:
        chunks = lambda x: x[:, first:end].reshape(B, (end - first) // L, L, C)   # noqa: E731
        y, state = _torch_chunks(w, u, chunks(k), chunks(v), *state)
        ys.append(y.reshape(B, end - first, C))
    return (ys[0] if len(ys) == 1 else torch.cat(ys, 1)), state


# ----------------------------------------------------------------------------------------------------------------
# Triton path
# ----------------------------------------------------------------------------------------------------------------

def _launch_config(C: int) -> Launch:
    """One thread per channel: 32 channels (one warp) per program, fewer when C is smaller. FP contraction off:
    _rounded_max's two-sum takes each product and sum rounded on its own, as the interpreter computes them; with
    contraction the compiler fuses lag * w into the adds (Triton 3.9's default, not 3.10's), and the forward's and
    the backward's roundings of the state's max are another's than the tests check."""
    return Launch({"BLOCK_C": min(32, triton.next_power_of_2(C))}, num_warps=1, fp_fusion=False)


@triton.jit
def _exp_nonpositive(x):
    """e^{min(x, 0)}, NaN for NaN x: tl.minimum's default drops a NaN (as fmin does), which would turn a NaN key or
    bonus into a weight of 1 and the output into finite garbage; every other backend carries the NaN on."""
    return tl.exp(tl.minimum(x, 0.0, propagate_nan=tl.PropagateNan.ALL))


@triton.jit
def _rounded_max(anchor, lag, w):
    """max = anchor + lag w rounded to fp32, and the rounding error (anchor + lag w) - max (Knuth's two-sum)."""
    drift = lag * w
    mx = anchor + drift
    back = mx - anchor
    return mx, (anchor - (mx - back)) + (drift - back)


@triton.jit
def wkv4_fwd_kernel(
    w_ptr, u_ptr,                    # (C,) fp32 per-step log decay w <= 0 and current-token bonus u
    k_ptr, v_ptr,                    # (B, T, C) keys and values, contiguous, input dtype
    y_ptr,                           # (B, T, C) output wkv, input dtype
    num0_ptr, den0_ptr, max0_ptr,    # (B, C) fp32 initial state (num, den, max), read only
    num_ptr, den_ptr, max_ptr,       # (B, C) fp32 final state, written
    vy_ptr, d_ptr, z_ptr,            # (B, T, C) fp32, written when SAVE: v_t - y_t, d_t, z_t (module docstring)
    lag_ptr,                         # (B, C) fp32, written when SAVE: steps since the final max's term (T: the state's)
    T, C,                            # sequence length, channels
    SAVE: tl.constexpr,              # keep what the backward needs
    BLOCK_C: tl.constexpr,           # channels per program
):
    b = tl.program_id(0).to(tl.int64)                # int64: every offset below is, as T C passes 2^31 at long T
    cs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = cs < C
    w = tl.load(w_ptr + cs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + cs, mask=mask, other=0.0).to(tl.float32)
    num = tl.load(num0_ptr + b * C + cs, mask=mask, other=0.0)
    den = tl.load(den0_ptr + b * C + cs, mask=mask, other=0.0)
    # The scale max = anchor + lag * w: the exponent that set it and the steps since. Differences of exponents are
    # then formed from differences of keys, so keys of several hundred keep fp32's relative precision.
    anchor = tl.load(max0_ptr + b * C + cs, mask=mask, other=0.0)
    lag = tl.zeros([BLOCK_C], dtype=tl.float32)                # exact integers up to 2^24 tokens
    seq = b * T * C + cs                             # this batch row's channels at step 0
    stride_t = tl.cast(C, tl.int64)                  # from one step to the next
    # Software pipelining: step t + 1's k, v are loaded (raw, in the input dtype) before step t's arithmetic and
    # carried as loop variables, so that a step waits for its exponentials, not for a memory round trip. (The
    # masks are tensors, cs * 0 + t: the interpreter takes no scalar mask.)
    k_next = tl.load(k_ptr + seq, mask=mask & (cs * 0 < T), other=0.0)
    v_next = tl.load(v_ptr + seq, mask=mask & (cs * 0 < T), other=0.0)
    for t in range(T):
        off = seq + t * stride_t
        k, v = k_next, v_next
        k_next = tl.load(k_ptr + off + stride_t, mask=mask & (cs * 0 + t + 1 < T), other=0.0)
        v_next = tl.load(v_ptr + off + stride_t, mask=mask & (cs * 0 + t + 1 < T), other=0.0)
        k = k.to(tl.float32)
        k = tl.where(k == float("inf"), float("nan"), k)   # e^{inf - inf}: the reference's NaN, not a limit
        v = v.to(tl.float32)
        # output: the past (num, den at scale e^max) against the current token e^{u + k}; q = the larger exponent
        d = (anchor - k) + lag * w - u                      # max - (u + k)
        a = _exp_nonpositive(d)                             # e^{max - q}
        e = _exp_nonpositive(-d)                            # e^{u + k - q}
        z = a * den + e                                     # Z_t e^{-q}, Z_t = D^_t + e^{u + k_t}
        y = (a * num + e * v) / z
        tl.store(y_ptr + off, y.to(y_ptr.dtype.element_ty), mask=mask)
        if SAVE:
            tl.store(vy_ptr + off, a * (den * v - num) / z, mask=mask)         # v - y without cancellation
            tl.store(d_ptr + off, d, mask=mask)
            tl.store(z_ptr + off, z, mask=mask)
        # update: decay the past by e^w and add e^k; d = (max + w) - k decides which is the new scale
        d = (anchor - k) + (lag + 1.0) * w
        a = _exp_nonpositive(d)
        e = _exp_nonpositive(-d)
        num = a * num + e * v
        den = a * den + e
        kept = d >= 0.0
        anchor = tl.where(d != d, d, tl.where(kept, anchor, k))   # a NaN max stays NaN, as in the recurrence
        lag = tl.where(kept, lag + 1.0, 0.0)
    # max is returned rounded to fp32; num, den follow the rounding exactly
    mx, err = _rounded_max(anchor, lag, w)
    tl.store(num_ptr + b * C + cs, num * tl.exp(err), mask=mask)
    tl.store(den_ptr + b * C + cs, den * tl.exp(err), mask=mask)
    tl.store(max_ptr + b * C + cs, mx, mask=mask)
    if SAVE:
        tl.store(lag_ptr + b * C + cs, lag, mask=mask)


@triton.jit
def _load_bwd_step(v_ptr, gy_ptr, vy_ptr, d_ptr, z_ptr, off, live):
    """The backward's loads of one step, raw (v, gy in the input dtype): v, gy, v - y, d, z (1 where not live, so
    that the division by it stays finite)."""
    return (tl.load(v_ptr + off, mask=live, other=0.0), tl.load(gy_ptr + off, mask=live, other=0.0),
            tl.load(vy_ptr + off, mask=live, other=0.0), tl.load(d_ptr + off, mask=live, other=0.0),
            tl.load(z_ptr + off, mask=live, other=1.0))


@triton.jit
def wkv4_bwd_kernel(
    w_ptr, u_ptr, k_ptr, v_ptr,      # the forward's inputs: (C,), (C,) fp32; (B, T, C), (B, T, C), input dtype
    vy_ptr, d_ptr, z_ptr,            # (B, T, C) fp32 saved by the forward
    gy_ptr,                          # (B, T, C) dL/dy, input dtype
    num0_ptr, den0_ptr, max0_ptr,    # (B, C) fp32 initial state
    num_ptr, den_ptr,                # (B, C) fp32 final num, den
    lag_ptr,                         # (B, C) fp32 steps since the final max's term was set (T: the initial state's)
    gnum_ptr, gden_ptr, gmax_ptr,    # (B, C) fp32 dL/d(final num, den, max)
    gk_ptr, gv_ptr,                  # (B, T, C) outputs dL/dk, dL/dv, input dtype
    gw_ptr, gu_ptr,                  # (B, C) fp32 outputs: this batch row's share of dL/dw, dL/du
    gnum0_ptr, gden0_ptr, gmax0_ptr,  # (B, C) fp32 outputs dL/d(initial num, den, max)
    T, C,                            # sequence length, channels
    BLOCK_C: tl.constexpr,           # channels per program
):
    b = tl.program_id(0).to(tl.int64)                # int64 offsets, as in the forward
    cs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = cs < C
    sc = b * C + cs
    seq = b * T * C + cs
    stride_t = tl.cast(C, tl.int64)
    w = tl.load(w_ptr + cs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + cs, mask=mask, other=0.0).to(tl.float32)
    max0 = tl.load(max0_ptr + sc, mask=mask, other=0.0)
    g_num = tl.load(gnum_ptr + sc, mask=mask, other=0.0)
    g_den = tl.load(gden_ptr + sc, mask=mask, other=0.0)
    # the final max's own gradient, less what the returned num, den (divided by e^max) pass to it
    g_top = (tl.load(gmax_ptr + sc, mask=mask, other=0.0) - g_num * tl.load(num_ptr + sc, mask=mask, other=0.0)
             - g_den * tl.load(den_ptr + sc, mask=mask, other=0.0))
    # the final max's term: token T-1-lag, or the initial state's when lag = T; redo the forward's rounding of it,
    # since the returned num, den were scaled by e^err
    lag = tl.load(lag_ptr + sc, mask=mask, other=0.0)
    from_token = lag < T
    anchor = tl.load(k_ptr + seq + (T - 1 - lag).to(tl.int64) * stride_t, mask=mask & from_token, other=0.0)
    _, err = _rounded_max(tl.where(from_token, anchor.to(tl.float32), max0), lag, w)
    # Adjoints of N^_t, D^_t (an, ad) and of their w-derivatives (bn, bd), times e^{max_t}: the forward's max before
    # token t. Every factor below is a forward exponential (<= 1) rebuilt from d_t and z_t.
    an = g_num * tl.exp(err)
    ad = g_den * tl.exp(err)
    bn = tl.zeros([BLOCK_C], dtype=tl.float32)
    bd = tl.zeros([BLOCK_C], dtype=tl.float32)
    gw = tl.zeros([BLOCK_C], dtype=tl.float32)
    gu = tl.zeros([BLOCK_C], dtype=tl.float32)
    # Software pipelining, as in the forward: step t - 1's five vectors are loaded before step t's arithmetic.
    nxt = _load_bwd_step(v_ptr, gy_ptr, vy_ptr, d_ptr, z_ptr, seq + (T - 1) * stride_t, mask & (cs * 0 < T))
    for i in range(T):
        t = T - 1 - i
        off = seq + t * stride_t
        v, gy, vy, d, z = nxt
        nxt = _load_bwd_step(v_ptr, gy_ptr, vy_ptr, d_ptr, z_ptr, off - stride_t, mask & (cs * 0 + i + 1 < T))
        v = v.to(tl.float32)
        gy = gy.to(tl.float32)
        d_next = d + (u + w)                                # (max_t + w) - k_t
        into_next = _exp_nonpositive(-d_next)               # e^{k_t - max_{t+1}}
        decay = _exp_nonpositive(d_next)                    # e^{max_t + w - max_{t+1}}
        past = _exp_nonpositive(d) / z                      # e^{max_t} / Z_t
        cur = gy * _exp_nonpositive(-d) / z                 # gy_t e^{u + k_t} / Z_t
        g_bonus = cur * vy                                  # dL/d(u + k_t) through y_t
        gv = into_next * an + cur
        gk = into_next * (an * v + ad) + g_bonus + tl.where(lag == T - 1 - t, g_top, 0.0)
        gu += g_bonus
        gw += into_next * (bn * v + bd)
        tl.store(gk_ptr + off, gk.to(gk_ptr.dtype.element_ty), mask=mask)
        tl.store(gv_ptr + off, gv.to(gv_ptr.dtype.element_ty), mask=mask)
        # A(t) = gy_t / Z_t (and -gy_t y_t / Z_t) + e^w A(t+1);  B(t) = e^w (B(t+1) + A(t+1))
        bn = decay * (bn + an)
        bd = decay * (bd + ad)
        an = decay * an + past * gy
        ad = decay * ad - past * gy * (v - vy)
    num0 = tl.load(num0_ptr + sc, mask=mask, other=0.0)
    den0 = tl.load(den0_ptr + sc, mask=mask, other=0.0)
    gw += bn * num0 + bd * den0 + lag * g_top                # the initial state's decay, then d max_T / dw
    tl.store(gw_ptr + sc, gw, mask=mask)
    tl.store(gu_ptr + sc, gu, mask=mask)
    tl.store(gnum0_ptr + sc, an, mask=mask)
    tl.store(gden0_ptr + sc, ad, mask=mask)
    tl.store(gmax0_ptr + sc, an * num0 + ad * den0 + tl.where(from_token, 0.0, g_top), mask=mask)


def _grid(B, C, cfg: Launch):
    """One program per (batch row, block of BLOCK_C channels)."""
    return (B, triton.cdiv(C, cfg["BLOCK_C"]))


def triton_launch(B: int, C: int) -> tuple[Launch, tuple[int, int]]:
    """The Triton kernels' launch (forward and backward alike) for B rows of C channels, as the launchers make it;
    the cost model (benchmarks/cost_model.py) reads it.

    Args:
        B: batch rows. C: channels.

    Returns:
        (launch, grid): the tile sizes and compiler options, and the programs per grid axis.
    """
    cfg = _launch_config(C)
    return cfg, _grid(B, C, cfg)


def wkv4_fwd(w, u, k, v, num0, den0, max0, save: bool):
    """Runs the forward kernel; returns y, the final state and (when ``save``) what the backward needs."""
    B, T, C = k.shape
    cfg = _launch_config(C)
    y = new_output((B, T, C), k.dtype, k.device)
    state = tuple(new_output((B, C), torch.float32, k.device) for _ in range(3))
    if save:
        saved = (*(new_output((B, T, C), torch.float32, k.device) for _ in range(3)),
                 new_output((B, C), torch.float32, k.device))
    else:
        saved = (y,) * 4   # never written
    wkv4_fwd_kernel[_grid(B, C, cfg)](w, u, k, v, y, num0, den0, max0, *state, *saved, T, C,
                                      SAVE=save, **cfg.blocks, **cfg.options)
    return y, state, (saved if save else None)


def wkv4_bwd(w, u, k, v, num0, den0, max0, num, den, vy, d, z, lag, gy, g_num, g_den, g_max):
    """Runs the backward kernel on what wkv4_fwd saved; returns the gradients of (w, u, k, v, num0, den0, max0)."""
    B, T, C = k.shape
    cfg = _launch_config(C)
    gk, gv = (new_output((B, T, C), k.dtype, k.device) for _ in range(2))
    gw, gu, g_num0, g_den0, g_max0 = (new_output((B, C), torch.float32, k.device) for _ in range(5))
    wkv4_bwd_kernel[_grid(B, C, cfg)](
        w, u, k, v, vy, d, z, gy.contiguous(), num0, den0, max0, num, den, lag,
        g_num.contiguous(), g_den.contiguous(), g_max.contiguous(), gk, gv, gw, gu, g_num0, g_den0, g_max0,
        T, C, **cfg.blocks, **cfg.options)
    return gw.sum(0).to(w.dtype), gu.sum(0).to(u.dtype), gk, gv, g_num0, g_den0, g_max0


# ----------------------------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------------------------

class Wkv4Function(torch.autograd.Function):
    """The Triton kernels as an autograd op: (w, u, k, v, num0, den0, max0) -> (y, num, den, max)."""

    @staticmethod
    def forward(ctx, w, u, k, v, num0, den0, max0):
        y, state, saved = wkv4_fwd(w, u, k, v, num0, den0, max0, save=True)
        ctx.save_for_backward(w, u, k, v, num0, den0, max0, state[0], state[1], *saved)
        return (y, *state)

    @staticmethod
    @first_order_only
    def backward(ctx, gy, g_num, g_den, g_max):
        return wkv4_bwd(*ctx.saved_tensors, gy, g_num, g_den, g_max)


# ----------------------------------------------------------------------------------------------------------------
# Public op
# ----------------------------------------------------------------------------------------------------------------

def wkv4(w, u, k, v, state=None, *, backend=None):
    """RWKV-4's WKV with a max-tracked state, differentiable in every input (state included):

        wkv_t = (e^{max + t w} num + sum_{i<t} e^{(t-1-i) w + k_i} v_i + e^{u + k_t} v_t)
              / (e^{max + t w} den + sum_{i<t} e^{(t-1-i) w + k_i} + e^{u + k_t})

    Args:
        w (torch.Tensor): (C,), the per-step log decay, w = -exp(time_decay) <= 0.
        u (torch.Tensor): (C,), the current token's bonus (time_first).
        k, v (torch.Tensor): (B, T, C), one dtype: fp32, fp16 or bf16 (float64 too on the torch backend). w and u
            take that dtype or fp32 (models keep them fp32); they enter the kernels as fp32 (float64 with float64
            k, v), and w = -inf (a decay of exactly 0) is defined.
        state (tuple or None): (num, den, max), each (B, C), fp32 (float64 for float64 inputs), in Hugging Face's
            layout. Default: (0, 0, INITIAL_MAX = -1e38).
        backend (str or None): "torch", "triton", "c" (kernels/wkv4/wkv4.c, CPU) or None. None runs the first that
            takes the call, in this order: "triton" (CUDA tensors), "c" (CPU tensors in fp32, fp16 or bf16 where the
            C loops build), "torch" (any other call). A backend named here that cannot take the call raises with its
            reason (kernels/backends.py). Default: None.
    Returns:
        (wkv (B, T, C) in the input dtype, (num, den, max)): feed the state back to continue the sequence.

    Source: the attention section of https://huggingface.co/docs/transformers/model_doc/rwkv.
    """
    k = check_tensor("k", k, (None, None, None))
    B, T, C = k.shape
    v = check_tensor("v", v, (B, T, C))
    w = check_tensor("w", w, (C,))
    u = check_tensor("u", u, (C,))
    dtype = check_same_dtype(k=k, v=v)
    check_decay_dtype("w", w, dtype)
    check_decay_dtype("u", u, dtype)
    state_dtype = accumulation_dtype(dtype)
    if state is not None:
        if not isinstance(state, (tuple, list)) or len(state) != 3:
            got = type(state).__name__ + (f" of length {len(state)}" if isinstance(state, (tuple, list)) else "")
            raise ValueError(f"state must be a tuple (num, den, max) of three ({B}, {C}) tensors, got {got}")
        state = tuple(check_tensor(f"state[{i}] ({name})", s, (B, C), (state_dtype,))
                      for i, (name, s) in enumerate(zip(("num", "den", "max"), state)))
    device = check_devices(w=w, u=u, k=k, v=v, **({} if state is None else dict(zip(("num", "den", "max"), state))))
    grad = needs_grad(w, u, k, v, *(state or ()))
    backend = dispatch(Call("wkv4", device, dtype, grad=grad), backend)
    check_values(lambda: (w <= 0).all(),    # False for NaN too
                 "w is the per-step log decay, w = -exp(time_decay): every entry must be <= 0 and not NaN",
                 lambda: f"; got max {w.max().item()} and {int(torch.isnan(w).sum())} NaN")
    # w and u enter every backend in the state's dtype (an fp16 -exp(time_decay) overflows from time_decay > 11.09);
    # w = -inf (a decay of exactly 0) as W_FLOOR, which decays as completely and keeps (steps) * w finite.
    # u = +inf, or a state max of +inf, gives the reference's e^{inf - inf} = NaN on every backend, not a limit.
    w, u = w.to(state_dtype).clamp_min(W_FLOOR), plus_inf_as_nan(u.to(state_dtype))
    if state is None:
        zeros = torch.zeros(B, C, dtype=state_dtype, device=device)
        state = (zeros, zeros.clone(), torch.full((B, C), INITIAL_MAX, dtype=state_dtype, device=device))
    state = (*state[:2], plus_inf_as_nan(state[2]))
    if k.numel() == 0:   # no tokens, rows or channels: nothing to compute, the state stays
        return k.new_empty((B, T, C)), state

    if backend == "torch":
        y, new_state = _wkv4_torch(w, u, k.to(state_dtype), v.to(state_dtype), *state)
        return y.to(dtype), new_state
    if backend == "c":
        return c_loops.wkv4(w, u, k, v, state, grad)
    args = (w.contiguous(), u.contiguous(), k.contiguous(), v.contiguous(), *(s.contiguous() for s in state))
    if grad:
        y, *new_state = Wkv4Function.apply(*args)
    else:
        y, new_state, _ = wkv4_fwd(*args, save=False)
    return y, tuple(new_state)


# ----------------------------------------------------------------------------------------------------------------
# Ahead-of-time build (python -m seqmix.kernels.aot)
# ----------------------------------------------------------------------------------------------------------------

def aot_kernels():
    """The forward (with and without saving for the backward) and backward kernels at C = 768 and 4096."""
    from ..aot import AotKernel
    kernels = []
    for C in (768, 4096):
        cfg = _launch_config(C)
        for dtype in ("fp32", "bf16"):
            # pointers in the input dtype; the others are fp32 (w, u as wkv4 passes them, states, saved values)
            types = {**{a: f"*{dtype}" for a in ("k_ptr", "v_ptr", "y_ptr", "gy_ptr", "gk_ptr", "gv_ptr")},
                     "T": "i32", "C": "i32"}
            for fn, label, constexprs in ((wkv4_fwd_kernel, "wkv4_fwd", {"SAVE": False}),
                                          (wkv4_fwd_kernel, "wkv4_fwd_save", {"SAVE": True}),
                                          (wkv4_bwd_kernel, "wkv4_bwd", {})):
                kernels.append(AotKernel(f"{label} C={C} {dtype}", fn, {**constexprs, **cfg.blocks}, types, "*fp32",
                                         cfg.num_warps, cfg.num_stages, cfg.fp_fusion))
    return kernels
