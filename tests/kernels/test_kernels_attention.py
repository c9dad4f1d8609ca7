"""kernels.attention against the float64 reference (reference/attention.py) and float64 autograd.

Chain: reference (NumPy float64) -> torch backend (SDPA) -> Triton backend (flash kernels, under the interpreter
on CPU). Gradients are compared with autograd through the explicit float64 softmax(q k^T) v of
seqmix.kernels.attention.naive.
"""
import dataclasses

import numpy as np
import pytest
import torch

from helpers.kernel_cases import BACKENDS, needs_triton
from seqmix.kernels.attention.naive import explicit_attention
from seqmix.kernels import attention as attn
from seqmix.kernels.testing import FP16_BUDGET, FP32_BUDGET, assert_close
from helpers.qkv_check import check_qkv_op, qkv_inputs
from seqmix.reference.attention import softmax_attention

# (B, H, T, d): T = 1, T not a multiple of the 16-row tiles, a head dim that is not a power of two.
SHAPES = [(1, 1, 1, 16), (2, 1, 37, 16), (1, 2, 20, 24), (1, 1, 33, 32)]


@pytest.fixture
def tiles(monkeypatch):
    """Small tiles, so that the interpreter's short sequences still span several of them."""
    chosen = attn._launch_config

    def use(block_m=16, block_n=16):
        tiles = {"BLOCK_M": block_m, "BLOCK_N": block_n}
        monkeypatch.setattr(attn, "_launch_config", lambda *a: dataclasses.replace(chosen(*a), blocks=tiles))
    use()
    return use


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_matches_reference(rng, tiles, backend, shape, causal):
    q, k, v = qkv_inputs(rng, shape)
    expected = softmax_attention(q.numpy(), k.numpy(), v.numpy(), causal=causal)
    out = attn.attention(q.float(), k.float(), v.float(), causal=causal, backend=backend)
    assert out.dtype == torch.float32 and out.shape == shape
    assert_close(out, expected, FP32_BUDGET, f"{backend} output")


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", SHAPES[1:])   # T = 1: dq = dk = 0 exactly, no relative error to speak of
@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_match_float64_autograd(rng, tiles, backend, shape, causal):
    q, k, v = qkv_inputs(rng, shape)
    do = torch.tensor(rng.standard_normal(shape))
    check_qkv_op(lambda *a: attn.attention(*a, causal=causal, backend=backend),
                 lambda *a: explicit_attention(*a, causal=causal), q, k, v, do, torch.float32, FP32_BUDGET, backend)


@pytest.mark.parametrize("block_m, block_n", [(16, 32), (32, 16)])
@needs_triton
def test_triton_unequal_tiles(rng, tiles, block_m, block_n):
    """Query and key tiles of different sizes: the diagonal falls inside a tile, not on its corner."""
    tiles(block_m, block_n)
    shape = (1, 2, 41, 16)
    q, k, v = qkv_inputs(rng, shape)
    do = torch.tensor(rng.standard_normal(shape))
    check_qkv_op(lambda *a: attn.attention(*a, backend="triton"), lambda *a: explicit_attention(*a),
                 q, k, v, do, torch.float32, FP32_BUDGET, f"tiles {block_m}x{block_n}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp16_inputs(rng, tiles, backend):
    shape = (1, 2, 37, 32)
    q, k, v = (x.half().double() for x in qkv_inputs(rng, shape))     # exactly representable in fp16
    do = torch.tensor(rng.standard_normal(shape))
    check_qkv_op(lambda *a: attn.attention(*a, backend=backend), lambda *a: explicit_attention(*a),
                 q, k, v, do, torch.float16, FP16_BUDGET, f"fp16 {backend}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_scores_do_not_overflow(rng, tiles, backend):
    """Scores in the hundreds: e^s overflows fp32 past 88; the online softmax only sees e^{s - max} <= 1."""
    q, k, v = qkv_inputs(rng, (1, 1, 23, 16), spread=12.0)
    expected = softmax_attention(q.numpy(), k.numpy(), v.numpy())
    assert np.abs(q.numpy() @ k.numpy().swapaxes(-1, -2)).max() / 4 > 200
    assert_close(attn.attention(q.float(), k.float(), v.float(), backend=backend), expected, FP32_BUDGET)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scale_argument(rng, tiles, backend):
    q, k, v = qkv_inputs(rng, (1, 1, 19, 16))
    expected = softmax_attention(q.numpy(), k.numpy(), v.numpy(), scale=0.3)
    assert_close(attn.attention(q.float(), k.float(), v.float(), scale=0.3, backend=backend), expected,
                 FP32_BUDGET, backend)


def test_gradcheck_torch_backend(rng):
    q, k, v = (x.requires_grad_() for x in qkv_inputs(rng, (1, 2, 7, 4)))
    assert torch.autograd.gradcheck(lambda *a: attn.attention(*a, backend="torch"), (q, k, v))


def _bad(q=None, k=None, v=None, **kw):
    good = torch.zeros(1, 2, 8, 16)
    return lambda: attn.attention(good if q is None else q, good if k is None else k, good if v is None else v, **kw)


@pytest.mark.parametrize("call, error, match", [
    (_bad(q=torch.zeros(2, 8, 16)), ValueError, r"q must have shape \(\*, \*, \*, \*\)"),
    (_bad(k=torch.zeros(1, 2, 9, 16)), ValueError, r"k must have shape \(1, 2, 8, 16\)"),
    (_bad(v=torch.zeros(1, 2, 8, 8)), ValueError, r"v must have shape \(1, 2, 8, 16\)"),
    (_bad(k=torch.zeros(1, 2, 8, 16, dtype=torch.float16)), TypeError, "one dtype"),
    (_bad(q=np.zeros((1, 2, 8, 16))), TypeError, "q must be a torch.Tensor"),
    (_bad(q=torch.zeros(1, 2, 8, 16, dtype=torch.int32)), TypeError, "q must have dtype"),
    (_bad(q=torch.zeros(1, 2, 0, 16), k=torch.zeros(1, 2, 0, 16), v=torch.zeros(1, 2, 0, 16)), ValueError, "T >= 1"),
    (_bad(causal=1), TypeError, "causal must be a bool"),
    (_bad(scale=float("nan")), ValueError, "scale must be finite"),
    (_bad(backend="cuda"), ValueError, "backend must be one of"),
    pytest.param(_bad(q=torch.zeros(1, 2, 8, 8), k=torch.zeros(1, 2, 8, 8), v=torch.zeros(1, 2, 8, 8),
                      backend="triton"), ValueError, r"head dims d in \[16, 128\], got d = 8", marks=needs_triton),
    pytest.param(_bad(q=torch.zeros(1, 2, 8, 16).double(), k=torch.zeros(1, 2, 8, 16).double(),
                      v=torch.zeros(1, 2, 8, 16).double(), backend="triton"), TypeError,
                 "backend='triton' takes dtypes", marks=needs_triton),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
