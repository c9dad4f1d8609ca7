"""What the recurrent (kernels/wkv7/__init__.py) and the chunked (kernels/wkv7/triton_chunked.py) WKV-7 kernels
share: where a head's data lives. Inputs (B, T, H, N), states (B, H, N, N), saved states (B * H, count, N, N), all
contiguous."""
from __future__ import annotations

from .._common import tl, triton


@triton.jit
def _head_offsets(pid_bh, T, H, N: tl.constexpr):
    """Where head pid_bh = b H + h starts: in the (B, H, N, N) states, and at step 0 in the (B, T, H, N) inputs; and
    the inputs' stride from one step to the next."""
    bh = pid_bh.to(tl.int64)                         # every offset in int64: T H N passes 2^31 at long T
    heads = tl.cast(H, tl.int64)
    return bh * N * N, (bh // heads) * T * heads * N + (bh % heads) * N, heads * N


@triton.jit
def _checkpoint(ckpt_ptr, pid_bh, n_ckpt, index, N: tl.constexpr):
    """The (N, N) checkpoint ``index`` of head pid_bh in a (B * H, n_ckpt, N, N) buffer."""
    return ckpt_ptr + (pid_bh.to(tl.int64) * n_ckpt + index) * N * N


@triton.jit
def _step(S, w, k, v, a, b):
    """S diag(w) + (S a) b^T + v k^T for rows S (BLOCK_V, N) of the state."""
    sa = tl.sum(S * a[None, :], axis=1)
    return S * w[None, :] + sa[:, None] * b[None, :] + v[:, None] * k[None, :]
