"""The chain probe of the GPU run (benchmarks/gpu_round.py, part ``chain``): the serial floor of the chunked WKV-7's
redesign, a kernel that does nothing but its state pass, S <- S P_n + E_n over n steps (docs: the GPU review of
2026-12-05, section 2d).

Each program holds BV rows of an (N, N) fp32 state in registers and walks the steps in order: per step it loads the
transition P_n (N, N) and its rows of the input term E_n (BV, N), and makes one product with E_n as the accumulator.
What the variants change is what the review's table lists: the rows per program (BV 16 on mma.sync or 64 on wgmma),
the products' operands (bf16, tf32, tf32x3 or IEEE fp32), the compiler's pipelining depth (num_stages) and whether
E_{n+1} is loaded by hand before step n's product (the compiler's pipelining covers P, not E, the accumulator).
Time per step is read from two lengths, (t(n_long) - t(n_short)) / (n_long - n_short), so that the launch and the
first and last loads drop out; each variant's result is compared with a float64 loop, which shows what its operands'
rounding costs over the walk.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

__all__ = ["ChainVariant", "VARIANTS", "chain", "chain_inputs", "chain_reference"]


@dataclass(frozen=True)
class ChainVariant:
    """One configuration of the probe: BV value rows per program, DOT the products' operands ("bf16", "tf32",
    "tf32x3", "ieee"), STAGES the loop's num_stages, PREFETCH whether E_{n+1} is loaded before step n's product."""
    block_v: int
    dot: str
    stages: int
    prefetch: bool
    num_warps: int = 4

    @property
    def name(self) -> str:
        return f"BV={self.block_v} {self.dot} stages={self.stages} {'E prefetched' if self.prefetch else 'E in step'}"


# The review's table (section 2d), less the builds it rejected (BV 64 with IEEE products needs a stack; with tf32x3 it
# sits at the register limit)
VARIANTS = (
    ChainVariant(16, "bf16", 1, False), ChainVariant(16, "bf16", 2, False), ChainVariant(16, "bf16", 2, True),
    ChainVariant(16, "tf32", 2, True), ChainVariant(16, "tf32x3", 2, True), ChainVariant(16, "ieee", 2, True),
    ChainVariant(64, "bf16", 2, True), ChainVariant(64, "tf32", 2, True),
)


@functools.cache
def _kernel():
    """The probe's Triton kernel (built on first use, so that importing this module does not import triton)."""
    import triton
    import triton.language as tl

    @triton.jit
    def chain_kernel(s0_ptr, p_ptr, e_ptr, out_ptr, n_steps, N: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr,
                     STAGES: tl.constexpr, PREFETCH: tl.constexpr):
        head = tl.program_id(0).to(tl.int64)
        rows = tl.program_id(1) * BV + tl.arange(0, BV)
        cols = tl.arange(0, N)
        tile = rows[:, None] * N + cols[None, :]                    # this program's rows of an (N, N) matrix
        square = tl.arange(0, N)[:, None] * N + cols[None, :]       # all of it
        base = head * n_steps * N * N
        s = tl.load(s0_ptr + head * N * N + tile)
        # masks of the tile's shape (tile < N N always): all true while steps remain, all false past the last
        e_next = tl.load(e_ptr + base + tile, mask=tile < n_steps * N * N, other=0.0)
        for n in tl.range(0, n_steps, num_stages=STAGES):
            step = base + n * N * N                                 # int64: base is
            p = tl.load(p_ptr + step + square)
            if PREFETCH:                # E_{n+1} in flight while step n multiplies
                e = e_next
                e_next = tl.load(e_ptr + step + N * N + tile, mask=tile < (n_steps - 1 - n) * N * N,
                                 other=0.0)
            else:
                e = tl.load(e_ptr + step + tile)
            if DOT == "bf16":
                s = tl.dot(s.to(tl.bfloat16), p.to(tl.bfloat16), acc=e)
            else:
                s = tl.dot(s, p, acc=e, input_precision=DOT)
        tl.store(out_ptr + head * N * N + tile, s)
    return chain_kernel


def chain_inputs(heads: int, n_steps: int, N: int, device, seed: int = 0) -> tuple:
    """(S_0, P, E): fp32, S_0 (heads, N, N), P and E (heads, n_steps, N, N). P = 0.4 I + 0.2 G / sqrt(N) (G standard
    normal), a contraction of norm about 0.8, so that the state neither grows nor dies over the walk, as RWKV-7's
    decays keep it; E at the scale of one step's input."""
    g = torch.Generator(device).manual_seed(seed)
    eye = torch.eye(N, device=device)
    p = 0.4 * eye + 0.2 * torch.randn(heads, n_steps, N, N, generator=g, device=device) / N ** 0.5
    e = torch.randn(heads, n_steps, N, N, generator=g, device=device) / N ** 0.5
    s0 = torch.randn(heads, N, N, generator=g, device=device)
    return s0, p.contiguous(), e.contiguous()


def chain(variant: ChainVariant, s0, p, e) -> torch.Tensor:
    """The probe's final state, S_n = (...((S_0 P_1 + E_1) P_2 + E_2)...) P_n + E_n, per head."""
    heads, N = s0.shape[0], s0.shape[-1]
    if N % variant.block_v:
        raise ValueError(f"N = {N} must be a multiple of the variant's BV = {variant.block_v}")
    out = torch.empty_like(s0)
    _kernel()[(heads, N // variant.block_v)](s0, p, e, out, p.shape[1], N=N, BV=variant.block_v, DOT=variant.dot,
                                              STAGES=variant.stages, PREFETCH=variant.prefetch,
                                              num_warps=variant.num_warps)
    return out


def chain_reference(s0, p, e) -> torch.Tensor:
    """The same walk in float64."""
    s = s0.double()
    for n in range(p.shape[1]):
        s = s @ p[:, n].double() + e[:, n].double()
    return s
