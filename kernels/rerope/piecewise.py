"""ReRoPE's torch path: exact pieces of flash attention, merged by their log-sum-exp (prefill), and the cache rotated
in chunks of keys (decode). The public functions and the reason for two scores are in the package's docstring.

The far part is an ordinary causal attention shifted by w (query i sees keys j <= i - w) of the far-rotated queries
against the far-rotated keys; the near band is, in blocks of w rows, a causal attention inside each block plus a
masked attention to the previous block (see ``_pieces``). Each piece is one call of a flash-attention kernel that
also returns its log-sum-exp (CPU: aten's ``_scaled_dot_product_flash_attention_for_cpu``, the kernel behind
scaled_dot_product_attention; other devices: the same in chunks of plain torch), and the pieces are merged exactly:
    LSE = log(sum_p e^{LSE_p}),   O = sum_p e^{LSE_p - LSE} O_p.
Memory is O(T d) (plus a (w, w) mask). The backward calls each piece's flash backward with the *merged* output and
log-sum-exp, which gives exactly that piece's share of the gradient, then rotates back:
    dq_i = sigma_i * scale * (R(-i) dq_near_i + R(-a_i) dq_far_i),   dk_j = R(-j) dk_near_j + R(-j/k) dk_far_j.
Decode rotates the cache in chunks of keys (no copy of the whole cache), then one softmax.
"""
from __future__ import annotations

from collections import namedtuple

import torch

from .._common import accumulation_dtype, all_finite, first_order_only
from .rotation import FAR_K, FAR_Q, NEAR, cos_sin, log_n, rotate, rotation_table

__all__ = ["ReropeTorchFunction", "rerope_torch", "rerope_decode_torch"]

DECODE_CHUNK = 4096          # keys rotated at a time by the decode


# ----------------------------------------------------------------------------------------------------------------
# Pieces of flash attention, with their log-sum-exp
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
    """(O, LSE) of softmax(q k^T * scale + mask) v; q, k, v (B, H, L, d) views. CPU: aten's flash kernel, for
    finite inputs (it drops a NaN score from its running max, and returns finite rows where softmax has NaN)."""
    if q.device.type == "cpu" and all_finite(q, k, v):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=mask,
                                                                          scale=scale)
    return _chunked_with_lse(q, k, v, causal, mask, scale)


def _flash_backward(do, q, k, v, o, lse, causal, mask, scale):
    """(dq, dk, dv) of one piece, given the merged output o and log-sum-exp lse of its rows (so that
    P = e^{S - lse} and D = rowsum(do * o) are those of the whole softmax, not of the piece)."""
    if q.device.type == "cpu" and all_finite(q, k, v):
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
# Autograd
# ----------------------------------------------------------------------------------------------------------------

class ReropeTorchFunction(torch.autograd.Function):
    """The piecewise prefill; q, k, v (B, H, T, d). Works in float64 for float64 inputs, else fp32."""

    @staticmethod
    def _path_inputs(path, q, k, rot, train_length):
        """(rotated queries, rotated keys, (query rotation, key rotation or None)) of one path. The log-n factor
        sigma_i rides on the query's rotation (sigma R is still linear, and its transpose is sigma R^T)."""
        if path == "near":
            q_rot, k_rot = rot[NEAR], rot[NEAR]
        else:
            q_rot, k_rot = rot[FAR_Q], (rot[FAR_K] if len(rot) > FAR_K else None)
        q_rot = log_n(q_rot, 0, train_length)
        return rotate(q, *q_rot), (k if k_rot is None else rotate(k, *k_rot)), (q_rot, k_rot)

    @staticmethod
    def forward(ctx, q, k, v, window, leaky_k, scale, train_length, base):
        compute = accumulation_dtype(q.dtype)
        q, k, v = (x.to(compute) for x in (q, k, v))
        B, H, T, d = q.shape
        rot = rotation_table(T, d, window, leaky_k, base, compute, q.device)
        out = torch.empty((B, H, T, d), dtype=compute, device=q.device)
        lse = torch.empty((B, H, T, 1), dtype=compute, device=q.device)    # (..., 1): takes the same views as out
        pieces = _pieces(T, window)
        for path in ("near", "far"):
            qx, kx, _ = ReropeTorchFunction._path_inputs(path, q, k, rot, train_length)
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
    @first_order_only
    def backward(ctx, do):
        q, k, v, out, lse, rot = ctx.saved_tensors
        window, scale, train_length = ctx.args
        do = do.to(q.dtype).contiguous()
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        pieces = _pieces(q.shape[2], window)
        for path in ("near", "far"):
            qx, kx, (q_rot, k_rot) = ReropeTorchFunction._path_inputs(path, q, k, rot, train_length)
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
            dq += rotate(dqx, q_rot[0], -q_rot[1])
            dk += dkx if k_rot is None else rotate(dkx, k_rot[0], -k_rot[1])
        return dq, dk, dv, None, None, None, None, None


def rerope_torch(q, k, v, window, leaky_k, scale, train_length, base):
    """The piecewise prefill in the input dtype (computed in fp32, or float64 for float64 inputs)."""
    return ReropeTorchFunction.apply(q, k, v, window, leaky_k, scale, train_length, base).to(q.dtype)


# ----------------------------------------------------------------------------------------------------------------
# Decode
# ----------------------------------------------------------------------------------------------------------------

def rerope_decode_torch(q, k_cache, v_cache, window, leaky_k, scale, train_length, base):
    """score_j = (q sigma) . R(-rel(T-1-j)) k_j * scale over the cache, DECODE_CHUNK keys rotated at a time."""
    dtype, compute = q.dtype, accumulation_dtype(q.dtype)
    T, d = k_cache.shape[2], q.shape[-1]
    q = log_n(q.to(compute), T - 1, train_length)                              # (B, H, 1, d), at position T - 1
    scores = []
    for start in range(0, T, DECODE_CHUNK):
        dist = (T - 1) - torch.arange(start, min(start + DECODE_CHUNK, T), dtype=torch.float64, device=q.device)
        rel = (dist.clamp(max=window) if leaky_k is None
               else torch.where(dist < window, dist, window + (dist - window) / leaky_k))
        k_rot = rotate(k_cache[:, :, start:start + DECODE_CHUNK].to(compute), *cos_sin(-rel, d, base, compute))
        scores.append(q @ k_rot.transpose(-1, -2))                             # (B, H, 1, chunk)
    p = torch.softmax(torch.cat(scores, -1) * scale, -1)                        # (B, H, 1, T)
    out = sum(p[..., start:start + DECODE_CHUNK] @ v_cache[:, :, start:start + DECODE_CHUNK].to(compute)
              for start in range(0, T, DECODE_CHUNK))
    return out.to(dtype)
