"""RWKV-7's WKV's declaration: what the registry (kernels/registry.py) names of it besides its function and reference.
``BACKENDS``: its backends in the order backend=None tries them, with their limits; ``WKV7``: its battery
declaration (inputs, cases, budgets: kernels/declarations.py says what each field means); ``BENCHMARK``: what the
GPU benchmarks and the cost model read of it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import inputs as make
from ..backends import CLoops, Torch, Triton
from ..declarations import Case, Inputs, Op
from ..registry import Benchmark
from ..testing import FP32_CHUNKED_WKV7_BUDGET
from .c import MAX_HEAD
from .triton_chunked import CHUNKED_BLOCK_K, MAX_CHUNKED_HEAD

__all__ = ["WKV7", "BACKENDS", "BENCHMARK"]


def _triton_heads(call):
    N = call.facts.get("N", CHUNKED_BLOCK_K)          # not given (default_backend): taken as met
    if N < 4 or N & (N - 1):
        return f"needs a head size N that is a power of two >= 4, got N = {N}"
    return None


def _chunked_heads(call):
    N = call.facts.get("N", CHUNKED_BLOCK_K)          # not given (default_backend): taken as met
    if N < CHUNKED_BLOCK_K or N & (N - 1):
        return (f"needs a head size N that is a power of two >= {CHUNKED_BLOCK_K} (tl.dot's smallest tile), got "
                f"N = {N}; backend='triton' runs smaller heads step by step")
    if N > MAX_CHUNKED_HEAD:   # its kernels' AOT builds spill at larger heads (docs/gpu.md)
        return (f"takes head sizes N <= {MAX_CHUNKED_HEAD} (larger heads spill registers), got N = {N}; "
                "backend='triton' runs them step by step")
    return None


def _c_heads(call):
    N = call.facts.get("N", CHUNKED_BLOCK_K)          # not given (default_backend): taken as met
    if N > MAX_HEAD:   # the C loop keeps a row of the state in registers
        return f"takes head sizes N <= {MAX_HEAD}, got N = {N}"
    return None


BACKENDS = (Triton(_triton_heads, "CUDA tensors, N a power of two >= 4"),
            # after "triton", whose heads include its own: None picks it only where "triton" refuses
            Triton(_chunked_heads, f"CUDA tensors, N a power of two from {CHUNKED_BLOCK_K} to {MAX_CHUNKED_HEAD}",
                   name="triton_chunked"),
            CLoops(_c_heads, f"CPU tensors in fp32, fp16 or bf16, N <= {MAX_HEAD}, where the C loops build"),
            Torch())


def timed_inputs(generator, device, B, T, H, N):
    """RWKV-7 WKV inputs, as RWKV-7 makes them (benchmarks/run.py's too)."""
    def randn():
        return torch.randn(B, T, H, N, generator=generator, device=device)
    r, k, v = (randn() for _ in range(3))
    log_w = -torch.exp(-0.5 - F.softplus(-randn()))     # RWKV-7's decay, in (-e^-0.5, 0)
    kk = F.normalize(randn(), dim=-1)                    # the removal key: unit length
    return dict(r=r, log_w=log_w, k=k, v=v, a=-kk, b=kk * torch.sigmoid(randn()))


def _checked_inputs(rng, T, width):
    # as RWKV-7 makes them (a = -kk, b = kk * rate, kk unit-norm): a random a b^T grows the state without bound, to
    # inf within 300 steps in float64 too
    x, _ = make.rwkv7_inputs(rng, 2, T, 2, width, state=False)
    return x, {}


BENCHMARK = Benchmark(dict(B=1, T=2048, H=12, N=64), dict(B=1, T=16, H=2, N=16),
                      {"triton": ("wkv7_fwd ", ("wkv7_fwd ", "wkv7_bwd")),
                       "triton_chunked": ("wkv7_chunked_fwd", ("wkv7_chunked_",))}, timed_inputs, _checked_inputs,
                      # the Triton kernels' heads where the cases have others: the sequential kernels' power of
                      # two >= 4 (the cases' N = 5 becomes 4); the chunked kernels' from 16 (smaller heads run the
                      # sequential ones)
                      check_heads={"triton": (4, 8, 16, 64), "triton_chunked": (16, 64)},
                      fp32_budgets={"triton_chunked": FP32_CHUNKED_WKV7_BUDGET})

def _wkv7_inputs(rng, B, T, H, N, decay="mixed", state=False):
    (r, log_w, k, v, a, b), S0 = make.rwkv7_inputs(rng, B, T, H, N, decay, state)
    return Inputs(dict(r=r, log_w=log_w, k=k, v=v, a=a, b=b), {}, S0)


# No conditioning rule: the recurrence multiplies decays rather than subtracting large exponents, so fp32 rounds each
# step's factor by u relative (T u over a sequence: 4e-6 at T = 70), and the design's budget (1e-4) already allows
# chunked forms; log_w of -1e4 is a decay of 0 in any arithmetic. rwkv7-hf's and a BlinkDL-style fp32 loop pass it
# (tests/conformance/test_conformance_peers.py).
WKV7 = Op(
    "wkv7", ("r", "log_w", "k", "v", "a", "b"), _wkv7_inputs, head="N",
    conditioning=None,
    fp32_budget=FP32_CHUNKED_WKV7_BUDGET, time_axes=dict(r=1, log_w=1, k=1, v=1, a=1, b=1),
    interpreter=dict(max_len=7, parts=("shapes",)), tiny=dict(B=1, H=1, N=4, state=True), cases=(
        Case(dict(B=1, T=1, H=1, N=16, decay="strong")),
        Case(dict(B=2, T=7, H=2, N=4, state=True), low_precision=True),
        Case(dict(B=2, T=37, H=2, N=16, state=True), low_precision=True),
        Case(dict(B=1, T=70, H=1, N=64, decay="strong", state=True)),
        Case(dict(B=3, T=16, H=1, N=5, decay="weak"), "decay near 1"),
        Case(dict(B=1, T=40, H=2, N=8, decay="extreme", state=True), "decays to e^-1e4", "extreme"),
        Case(dict(B=1, T=40, H=1, N=16, decay="weak", state=True), "decay near 1", "extreme"),
    ), split=Case(dict(B=2, T=37, H=2, N=16, state=True), group="split"))
