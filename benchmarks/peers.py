"""What a user would run instead of seqmix, measured beside it by benchmarks/run.py.

Each peer takes the same tensors as the seqmix op it stands beside and returns that op's output (checked in
tests/benchmarks/test_benchmarks.py), so the two do the same work:

- ``hf_wkv4``: transformers' own CPU loop for RWKV-4, ``rwkv_linear_attention_cpu`` (one Python step per token).
- ``hf_selective_scan``: transformers' Mamba scan, ``mamba_selective_scan`` in ``modeling_mamba`` (since
  transformers 5 the loop that ``MambaMixer.slow_forward`` held lives in this function, which ``MambaMixer.forward``
  calls when the ``mamba_ssm`` package is absent). It is called as is, with its default sequential path.
- ``wkv7_per_token``: the RWKV-7 recurrence one token at a time, as BlinkDL's CPU reference ``RWKV7_OP`` and the
  rwkv7-hf reference run it. They form the N x N matrix a b^T first and multiply the state by it (N^3 per head and
  token); this loop computes (S a) b^T instead (N^2), so it is the faster loop and the ratio against it is the
  cautious one.
- ``sdpa_rope``: plain RoPE on q and k, then ``torch.nn.functional.scaled_dot_product_attention`` (what a model
  without ReRoPE runs; ReRoPE has to come close to it).
- ``rerope_two_pass``: the source's ReRoPE prefill (https://spaces.ac.cn/archives/9708): two full T x T score
  matrices, one with RoPE at the true positions and one with the query rotated by the window, merged with where,
  then a causal softmax.
- ``streaming_pass``: the physical limit measurable here: each input read once and one output written once.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

try:  # a benchmark-only dependency: without it the transformers rows are marked as skipped
    import transformers
    from transformers.models.mamba.modeling_mamba import mamba_selective_scan
    from transformers.models.rwkv.modeling_rwkv import rwkv_linear_attention_cpu
    # Each benchmark process would otherwise warn that mamba_ssm is absent: its torch fallback is the peer here.
    transformers.logging.set_verbosity_error()
except ImportError:
    transformers = None
HAS_TRANSFORMERS = transformers is not None


def transformers_version() -> str:
    return transformers.__version__ if HAS_TRANSFORMERS else "not installed"


def hf_wkv4(w, u, k, v):
    """transformers' RWKV-4 CPU loop on seqmix's inputs: it takes the raw parameter time_decay, w = -exp(time_decay)."""
    y, _ = rwkv_linear_attention_cpu(torch.log(-w), u, k, v)
    return y


def hf_selective_scan(u, delta, A, B, C, D, z, delta_bias):
    """transformers' Mamba scan; same layout as seqmix: u, delta, z (B, D, T); B, C (B, N, T); A (D, N)."""
    return mamba_selective_scan(u, delta, A, B, C, D=D, z=z, delta_bias=delta_bias, delta_softplus=True)


def wkv7_per_token(r, log_w, k, v, a, b):
    """S_t = S_{t-1} diag(exp(log_w_t)) + (S_{t-1} a_t) b_t^T + v_t k_t^T, y_t = S_t r_t, one token per step.

    All inputs (B, T, H, N); the state S (B, H, N, N) is indexed [value, key], fp32.
    """
    batch, T, H, N = r.shape
    S = torch.zeros(batch, H, N, N, dtype=torch.float32, device=r.device)
    w = torch.exp(log_w.float())
    y = torch.empty_like(r)
    for t in range(T):
        r_t, k_t, v_t, a_t, b_t = (x[:, t, :, :, None].float() for x in (r, k, v, a, b))   # (B, H, N, 1)
        S = S * w[:, t, :, None, :] + (S @ a_t) @ b_t.mT + v_t @ k_t.mT                       # (B, H, N, N)
        y[:, t] = (S @ r_t)[..., 0].to(y.dtype)
    return y


def _rope(x, positions, base=10000.0):
    """RoPE, rotate-half layout (dimension i paired with i + d/2), as the seqmix reference defines it."""
    d = x.shape[-1]
    inv_freq = base ** (-torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)   # (d/2,)
    angle = positions.float()[:, None] * inv_freq                                          # (T, d/2)
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def sdpa_rope(q, k, v):
    """Causal attention with plain RoPE: rotate q and k by their positions, then PyTorch's fused SDPA."""
    pos = torch.arange(q.shape[-2], device=q.device)
    return F.scaled_dot_product_attention(_rope(q, pos), _rope(k, pos), v, is_causal=True)


def rerope_two_pass(q, k, v, window):
    """The source's ReRoPE prefill: a1 = RoPE scores, a2 = (R(w) q) . k, where(i - j < w, a1, a2), causal softmax.

    q, k, v (B, H, T, d); two (B, H, T, T) score matrices live at once.
    """
    T, d = q.shape[-2:]
    pos = torch.arange(T, device=q.device)
    a1 = _rope(q, pos) @ _rope(k, pos).mT                                    # (B, H, T, T)
    a2 = _rope(q, torch.full_like(pos, window)) @ k.mT                       # (B, H, T, T)
    distance = pos[:, None] - pos[None, :]                                   # (T, T) i - j
    scores = torch.where(distance < window, a1, a2) * d ** -0.5
    scores = scores.masked_fill(distance < 0, float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v


def streaming_pass(out_like, *others):
    """One pass over the tensors: ``out_like`` (shaped like the op's output) copied once, every other input read
    once. No op on these tensors can move less memory."""
    out = out_like.clone()
    for x in others:
        x.sum()
    return out
