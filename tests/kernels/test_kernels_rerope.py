"""kernels.rerope against the per-pair definition score_ij = (q_i sigma_i) . R(-rel(i - j)) k_j.

Chain: reference/rope.py (NumPy float64: attention_from_relative_positions, rerope_attention, rerope_decode) ->
the float64 torch per-pair definition of seqmix.kernels.rerope.naive (for autograd; checked here against the
reference to 1e-12)
-> torch backend (flash pieces merged by log-sum-exp) -> Triton backend (fused kernels under the interpreter, with
16-row tiles so that short sequences exercise far, straddling and near tiles).
"""
import dataclasses

import numpy as np
import pytest
import torch
from torch.utils._pytree import tree_leaves
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.kernel_cases import BACKENDS, needs_triton, spy
from seqmix.kernels.rerope.naive import rerope_attention as definition
from seqmix.kernels import rerope
from seqmix.kernels.rerope import fused, piecewise, rotation
from seqmix.kernels.testing import FP16_BUDGET, FP32_BUDGET, REFERENCE_BUDGET, assert_all_close, assert_close
from helpers.qkv_check import check_qkv_op, qkv_inputs, output_and_grads
from seqmix.kernels.attention import attention
from seqmix.reference.rope import (apply_rope, attention_from_relative_positions, log_n_scale, relative_positions,
                                   rerope_attention, rerope_decode)

# (T, d, window, leaky_k, train_length); tiles are 16 x 16 unless a test says otherwise.
CASES = [
    pytest.param(37, 16, 5, None, None, id="w<tile"),
    pytest.param(37, 32, 20, 4.0, 16, id="w>tile-leaky-logn"),
    pytest.param(33, 16, 1, None, 8, id="w=1-logn"),
    pytest.param(40, 16, 50, 2.0, None, id="w>T-leaky"),
    pytest.param(29, 32, 16, None, 4, id="w=tile-logn"),
    pytest.param(45, 16, 7, 1.5, 10, id="leaky-w<tile-logn"),
]


@pytest.fixture(autouse=True)
def tiles(monkeypatch):
    """16-row tiles for the interpreter; call with other sizes to change them."""
    chosen = fused._launch_config

    def use(block_m=16, block_n=16):
        tiles = {"BLOCK_M": block_m, "BLOCK_N": block_n}
        monkeypatch.setattr(fused, "_launch_config", lambda *a: dataclasses.replace(chosen(*a), blocks=tiles))
    use()
    return use


def _check_prefill(rng, shape, window, leaky_k, train_length, backend, dtype, budget, what, inputs=None):
    """rerope_attention against the float64 definition, outputs and gradients, for one random output gradient."""
    q, k, v = qkv_inputs(rng, shape) if inputs is None else inputs
    do = torch.tensor(rng.standard_normal(shape))
    options = dict(leaky_k=leaky_k, train_length=train_length, backend=backend)
    check_qkv_op(lambda *a: rerope.rerope_attention(*a, window, **options),
                 lambda *a: definition(*a, window, leaky_k=leaky_k, train_length=train_length), q, k, v, do, dtype,
                 budget, what)


@pytest.mark.parametrize("T, d, window, leaky_k, train_length", CASES)
def test_definition_here_matches_the_reference(rng, T, d, window, leaky_k, train_length):
    """The torch definition used for gradients == reference's per-pair definition == the source's two-pass form."""
    q, k, v = qkv_inputs(rng, (2, 1, T, d))
    mine = definition(q, k, v, window, leaky_k=leaky_k, train_length=train_length)
    q_scaled = q.numpy() * (1 if train_length is None else log_n_scale(np.arange(T), train_length)[:, None])
    rel = relative_positions(T, "rerope" if leaky_k is None else "leaky_rerope", window=window, k=leaky_k)
    assert_close(mine, attention_from_relative_positions(q_scaled, k.numpy(), v.numpy(), rel), REFERENCE_BUDGET)
    assert_close(mine, rerope_attention(q.numpy(), k.numpy(), v.numpy(), window, leaky_k=leaky_k,
                                        train_length=train_length), REFERENCE_BUDGET)


@pytest.mark.parametrize("T, d, window, leaky_k, train_length", CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_outputs_and_gradients(rng, backend, T, d, window, leaky_k, train_length):
    _check_prefill(rng, (1, 2, T, d), window, leaky_k, train_length, backend, torch.float32, FP32_BUDGET, backend)


@pytest.mark.parametrize("mask_rows", [4, piecewise.MASK_ROWS])
@pytest.mark.parametrize("T, d, window, leaky_k, train_length", CASES[:3])
def test_torch_backend_is_exact_in_float64(rng, monkeypatch, T, d, window, leaky_k, train_length, mask_rows):
    """The pieces and their log-sum-exp merge are exact: float64 in, the definition out to 1e-12."""
    monkeypatch.setattr(piecewise, "MASK_ROWS", mask_rows)
    _check_prefill(rng, (2, 2, T, d), window, leaky_k, train_length, "torch", torch.float64, REFERENCE_BUDGET,
                   "float64")


@pytest.mark.parametrize("backend", BACKENDS)
def test_single_position(rng, backend):
    q, k, v = qkv_inputs(rng, (1, 2, 1, 16))
    out = rerope.rerope_attention(q.float(), k.float(), v.float(), 3, backend=backend)
    assert_close(out, v, FP32_BUDGET)          # one key: softmax = 1


@pytest.mark.parametrize("block_m, block_n", [(16, 32), (32, 16)])
@needs_triton
def test_triton_unequal_tiles(rng, tiles, block_m, block_n):
    """Query and key tiles of different sizes: the window's edge and the diagonal cut tiles off their corners."""
    tiles(block_m, block_n)
    _check_prefill(rng, (1, 2, 43, 16), 9, 3.0, 12, "triton", torch.float32, FP32_BUDGET,
                   f"tiles {block_m}x{block_n}")


DECODE_CASES = [
    pytest.param(37, 16, 5, None, None, id="rerope"),
    pytest.param(37, 32, 20, 4.0, 16, id="leaky-logn"),
    pytest.param(23, 16, 40, 2.0, 8, id="w>T"),
    pytest.param(1, 16, 3, None, None, id="T=1"),
]


@pytest.mark.parametrize("T, d, window, leaky_k, train_length", DECODE_CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_is_the_last_row_of_prefill(rng, backend, T, d, window, leaky_k, train_length):
    q, k, v = qkv_inputs(rng, (2, 1, T, d))
    do = torch.tensor(rng.standard_normal((2, 1, 1, d)))
    expected = rerope_decode(q[:, :, -1:].numpy(), k.numpy(), v.numpy(), window, leaky_k=leaky_k,
                             train_length=train_length)
    opts = dict(leaky_k=leaky_k, train_length=train_length, backend=backend)
    q32, k32, v32 = q.float(), k.float(), v.float()
    out, grads = output_and_grads(lambda *a: rerope.rerope_decode(*a, window, **opts), (q32[:, :, -1:], k32, v32), do)
    assert out.shape == (2, 1, 1, d)
    assert_close(out, expected, FP32_BUDGET, "decode vs reference")
    assert_close(out, rerope.rerope_attention(q32, k32, v32, window, **opts)[:, :, -1:], FP32_BUDGET,
                 "decode vs last prefill row")
    if T > 1:   # with one key, dq and dk are exactly zero: nothing relative to compare
        _, grads_e = output_and_grads(
            lambda *a: definition(*a, window, leaky_k=leaky_k, train_length=train_length)[:, :, -1:], (q, k, v), do)
        expected_grads = (grads_e[0][:, :, -1:], *grads_e[1:])   # dq: of the last query only
        assert_all_close(("dq", "dk", "dv"), grads, expected_grads, FP32_BUDGET, "decode")


@needs_triton
@pytest.mark.parametrize("T, window, leaky_k, sms, splits", [
    (1, 3, None, 132, 1),          # one key: one split
    (37, 5, None, 132, 3),         # odd T: slices of 16 keys, the last of 5
    (37, 20, 4.0, 1, 1),           # a GPU of one SM: B H = 2 programs are enough, the unsplit path
    (100, 30, 2.0, 4, 4),          # 8 programs: slices of 32 keys, T not a multiple of them (32 + 32 + 32 + 4)
    (300, 40, None, 132, 19),      # a long cache, one 16-key tile a slice
    (300, 40, 1.5, 132, 19),
])
def test_triton_decode_splits_the_cache(rng, monkeypatch, T, window, leaky_k, sms, splits):
    """Flash-decoding: slices of the cache on separate programs, their partial softmaxes merged; equal to the
    float64 reference and to the last row of the Triton prefill, with and without splits."""
    monkeypatch.setattr(fused, "GPU_SMS", sms)
    chosen = spy(monkeypatch, fused, "_decode_splits")
    q, k, v = (x.float() for x in qkv_inputs(rng, (2, 1, T, 16)))
    out = rerope.rerope_decode(q[:, :, -1:], k, v, window, leaky_k=leaky_k, train_length=8, backend="triton")
    assert [split for _, split in chosen] == [splits]
    expected = rerope_decode(q[:, :, -1:].double().numpy(), k.double().numpy(), v.double().numpy(), window,
                             leaky_k=leaky_k, train_length=8)
    assert_close(out, expected, FP32_BUDGET, "decode vs reference")
    prefill = rerope.rerope_attention(q, k, v, window, leaky_k=leaky_k, train_length=8, backend="triton")
    assert_close(out, prefill[:, :, -1:], FP32_BUDGET, "decode vs last prefill row")


@needs_triton
def test_triton_rotation_table_is_built_once_and_grown(rng, monkeypatch):
    """The fp32 table is cached by (d, window, leaky_k, base, device) and shared across calls (layers, steps): a
    decoder growing from 10 to 14 keys builds it twice (10, then 20 positions), not once a call; a longer table
    gives the same rows; built under inference mode it can still be saved for a training step's backward."""
    monkeypatch.setattr(rotation, "_TABLES", {})
    builds = spy(monkeypatch, rotation, "rotation_table")
    q, k, v = (x.float() for x in qkv_inputs(rng, (1, 2, 14, 16)))
    with torch.inference_mode():
        for T in range(10, 15):
            for _layer in range(2):
                rerope.rerope_decode(q[:, :, T - 1:T], k[:, :, :T], v[:, :, :T], 5, backend="triton")
    assert [table.shape[2] for table in builds] == [10, 20]
    assert_close(builds[1][:, :, :10], builds[0], REFERENCE_BUDGET, "rows of the grown table")
    out, grads = output_and_grads(lambda *a: rerope.rerope_attention(*a, 5, backend="triton"), (q, k, v),
                                  torch.ones_like(q))
    assert len(builds) == 2 and all(torch.isfinite(g).all() for g in grads)
    rerope.rerope_decode(q[:, :, -1:], k, v, 5, leaky_k=2.0, backend="triton")   # another table: another key
    assert len(builds) == 3


def test_torch_decode_rotates_the_cache_in_chunks(rng, monkeypatch):
    monkeypatch.setattr(piecewise, "DECODE_CHUNK", 8)
    q, k, v = qkv_inputs(rng, (1, 2, 29, 16))
    expected = rerope_decode(q[:, :, -1:].numpy(), k.numpy(), v.numpy(), 6, leaky_k=2.5, train_length=4)
    out = rerope.rerope_decode(q[:, :, -1:], k, v, 6, leaky_k=2.5, train_length=4, backend="torch")
    assert_close(out, expected, REFERENCE_BUDGET)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp16_inputs(rng, backend):
    shape = (1, 2, 37, 32)
    exact = [x.half().double() for x in qkv_inputs(rng, shape)]                 # exactly representable in fp16
    _check_prefill(rng, shape, 9, 4.0, 16, backend, torch.float16, FP16_BUDGET, f"fp16 {backend}", inputs=exact)


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_scores_do_not_overflow(rng, backend):
    """Scores in the hundreds (e^s overflows fp32 past 88), with log-n scaling on top."""
    T, d, window = 30, 16, 6
    q, k, v = qkv_inputs(rng, (1, 1, T, d), spread=12.0)
    out = rerope.rerope_attention(q.float(), k.float(), v.float(), window, train_length=4, backend=backend)
    assert_close(out, rerope_attention(q.numpy(), k.numpy(), v.numpy(), window, train_length=4), FP32_BUDGET)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scale_and_base_arguments(rng, backend):
    T, d, window, leaky_k = 26, 16, 6, 3.0
    q, k, v = qkv_inputs(rng, (1, 2, T, d))
    expected = definition(q, k, v, window, leaky_k=leaky_k, scale=0.3, base=500.0)
    out = rerope.rerope_attention(q.float(), k.float(), v.float(), window, leaky_k=leaky_k, scale=0.3, backend=backend,
                                  base=500.0)
    assert_close(out, expected, FP32_BUDGET)
    out = rerope.rerope_decode(q[:, :, -1:].float(), k.float(), v.float(), window, leaky_k=leaky_k, scale=0.3,
                               backend=backend, base=500.0)
    assert_close(out, expected[:, :, -1:], FP32_BUDGET, "decode")


@pytest.mark.parametrize("leaky_k", [None, 2.0])
def test_gradcheck_torch_backend(rng, leaky_k):
    q, k, v = (x.requires_grad_() for x in qkv_inputs(rng, (1, 1, 9, 4)))
    assert torch.autograd.gradcheck(
        lambda *a: rerope.rerope_attention(*a, 3, leaky_k=leaky_k, train_length=4, backend="torch"), (q, k, v),
        fast_mode=True)


def test_chunked_pieces_match_the_definition(rng, monkeypatch):
    """The device-independent pieces (plain torch, chunks of query rows) that non-CPU tensors use."""
    monkeypatch.setattr(piecewise, "_flash_with_lse", piecewise._chunked_with_lse)
    monkeypatch.setattr(piecewise, "_flash_backward", piecewise._chunked_backward)
    monkeypatch.setattr(piecewise, "QUERY_CHUNK", 8)
    _check_prefill(rng, (1, 2, 37, 16), 9, 3.0, 8, "torch", torch.float64, REFERENCE_BUDGET, "chunked pieces")


@pytest.mark.parametrize("mask_rows", [3, piecewise.MASK_ROWS])
@pytest.mark.parametrize("T", range(1, 21))
def test_pieces_cover_every_causal_pair_once_on_its_path(monkeypatch, T, mask_rows):
    """Feed positions through each piece's views and its own mask: every pair j <= i is seen exactly once, by the
    path that rel(i - j) calls for (near: i - j < w)."""
    monkeypatch.setattr(piecewise, "MASK_ROWS", mask_rows)
    positions = torch.arange(T, dtype=torch.float64)[None, None, :, None]          # (1, 1, T, 1)
    for window in range(1, T + 3):
        count = torch.zeros(T, T, dtype=torch.long)
        for piece in piecewise._pieces(T, window):
            i, j, _, causal, mask = piecewise._piece_args(piece, positions, positions, positions)
            i, j = i[..., 0].long().flatten(0, -2), j[..., 0].long().flatten(0, -2)   # (pieces, L), (pieces, S)
            seen = torch.ones(i.shape[-1], j.shape[-1], dtype=torch.bool)
            seen = seen.tril() if causal else seen
            seen = seen if mask is None else seen & (mask == 0)
            for ib, jb in zip(i, j):
                ii, jj = torch.meshgrid(ib, jb, indexing="ij")
                ii, jj = ii[seen], jj[seen]
                assert ((ii - jj < window) == (piece.path == "near")).all(), (T, window, piece.kind)
                count.index_put_((ii, jj), torch.ones_like(ii), accumulate=True)
        assert torch.equal(count, torch.ones(T, T, dtype=torch.long).tril()), (T, window)


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor any aten op returns."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.numel = max([self.numel] + [t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor)])
        return out


@pytest.mark.parametrize("leaky_k", [None, 4.0])
def test_torch_prefill_memory_is_linear_in_T(rng, leaky_k):
    """No tensor of the forward or backward grows like T x T: the largest is the rotation table (<= 3 T d)."""
    T, d = 512, 16
    q, k, v = (x.float().requires_grad_() for x in qkv_inputs(rng, (1, 1, T, d)))
    with _LargestTensor() as largest:
        rerope.rerope_attention(q, k, v, 64, leaky_k=leaky_k, train_length=128, backend="torch").sum().backward()
    assert largest.numel <= 3 * T * d < T * T // 10


def _call(fn="rerope_attention", **overrides):
    """A call that is valid except for ``overrides``."""
    x = torch.zeros(1, 2, 8, 16)
    args = dict(q=x, k=x, v=x, window=4) if fn == "rerope_attention" else dict(q=x[:, :, :1], k_cache=x,
                                                                                   v_cache=x, window=4)
    args.update(overrides)
    return lambda: getattr(rerope, fn)(**args)


@pytest.mark.parametrize("call, error, match", [
    (_call(window=0), ValueError, "window must be >= 1, got 0"),
    (_call(window=2.5), TypeError, "window must be an int, got float"),
    (_call(window=True), TypeError, "window must be an int, got bool"),
    (_call(leaky_k=1.0), ValueError, r"leaky_k must be a finite number > 1 \(None for ReRoPE\), got 1.0"),
    (_call(leaky_k=float("inf")), ValueError, "leaky_k must be a finite number > 1"),
    (_call(train_length=1), ValueError, "train_length must be a finite number >= 2"),
    (_call(scale=float("nan")), ValueError, "scale must be a finite number"),
    (_call(base=0.0), ValueError, "base must be a finite number > 0"),
    (_call(k=torch.zeros(1, 2, 9, 16)), ValueError, r"k must have shape \(1, 2, 8, 16\), got \(1, 2, 9, 16\)"),
    (_call(v=torch.zeros(1, 2, 8, 8)), ValueError, r"v must have shape \(1, 2, 8, 16\)"),
    (_call(q=torch.zeros(1, 2, 0, 16), k=torch.zeros(1, 2, 0, 16), v=torch.zeros(1, 2, 0, 16)), ValueError,
     "at least one position"),
    (_call(q=torch.zeros(1, 2, 8, 15), k=torch.zeros(1, 2, 8, 15), v=torch.zeros(1, 2, 8, 15)), ValueError,
     "even head dim"),
    (_call(k=torch.zeros(1, 2, 8, 16).half()), TypeError, "one dtype"),
    pytest.param(_call(q=torch.zeros(1, 2, 8, 8), k=torch.zeros(1, 2, 8, 8), v=torch.zeros(1, 2, 8, 8),
                       backend="triton"), ValueError, r"head dims d in \[16, 128\], got d = 8", marks=needs_triton),
    pytest.param(_call(q=torch.zeros(1, 2, 8, 16).double(), k=torch.zeros(1, 2, 8, 16).double(),
                       v=torch.zeros(1, 2, 8, 16).double(), backend="triton"), TypeError,
                 "backend='triton' takes dtypes", marks=needs_triton),
    (_call("rerope_decode", q=torch.zeros(1, 2, 2, 16)), ValueError, r"q must have shape \(\*, \*, 1, \*\)"),
    (_call("rerope_decode", k_cache=torch.zeros(1, 2, 0, 16), v_cache=torch.zeros(1, 2, 0, 16)), ValueError,
     r"k_cache must hold at least the query's own key \(T >= 1\)"),
    (_call("rerope_decode", v_cache=torch.zeros(1, 2, 7, 16)), ValueError,
     r"v_cache must have shape \(1, 2, 8, 16\), got \(1, 2, 7, 16\)"),
    (_call("rerope_decode", k_cache=torch.zeros(2, 2, 8, 16), v_cache=torch.zeros(2, 2, 8, 16)), ValueError,
     r"k_cache must have shape \(1, 2, \*, 16\)"),
    (_call("rerope_decode", leaky_k=0.5), ValueError, "leaky_k must be a finite number > 1"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ----------------------------------------------------------------------------------------------------------------
# apply_rope and log_n_scaling: RoPE, position interpolation and NTK-aware RoPE built from plain attention
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("T, d, scale_k, base", [(1, 4, 1.0, 10000.0), (13, 16, 1.0, 10000.0),
                                                 (21, 8, 3.5, 10000.0), (16, 32, 1.0, 10000.0 * 8 ** (32 / 30))])
@pytest.mark.parametrize("dtype, budget", [(torch.float64, REFERENCE_BUDGET), (torch.float32, FP32_BUDGET)])
def test_apply_rope_matches_the_reference(rng, T, d, scale_k, base, dtype, budget):
    """Fractional positions (p / k: position interpolation) and a scaled base (NTK-aware), as the reference."""
    x = rng.standard_normal((2, 3, T, d))
    positions = np.arange(T) / scale_k
    out = rerope.apply_rope(torch.tensor(x, dtype=dtype), torch.tensor(positions), base=base)
    assert out.dtype == dtype and out.shape == x.shape
    assert_close(out, apply_rope(x, positions, base=base), budget)


def test_apply_rope_gradcheck(rng):
    x = torch.tensor(rng.standard_normal((1, 2, 7, 6)), requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: rerope.apply_rope(t, torch.arange(7) * 0.75, base=50.0), (x,))


@pytest.mark.parametrize("kind, k", [("rope", None), ("pi", 2.5)])
def test_attention_of_rotated_rows_is_the_relative_position_definition(rng, kind, k):
    """attention(R(p/k) q, R(p/k) k, v) = softmax(q_i . R(-rel_ij) k_j) v with rel = (i - j)/k: RoPE's identity, at
    fractional positions too; with the log-n factor on the queries."""
    T, d, L = 19, 8, 6
    q, kk, v = qkv_inputs(rng, (1, 2, T, d))
    positions = torch.arange(T, dtype=torch.float64) / (k or 1)
    qx = rerope.log_n_scaling(rerope.apply_rope(q, positions), L)
    out = attention(qx, rerope.apply_rope(kk, positions), v, backend="torch")
    expected = attention_from_relative_positions(q.numpy() * log_n_scale(np.arange(T), L)[:, None], kk.numpy(),
                                                 v.numpy(), relative_positions(T, kind, k=k))
    assert_close(out, expected, REFERENCE_BUDGET)


def test_rope_is_rerope_with_the_window_at_the_length(rng):
    T, d = 23, 16
    q, k, v = qkv_inputs(rng, (2, 2, T, d))
    positions = torch.arange(T)
    out = attention(rerope.apply_rope(q, positions, base=300.0), rerope.apply_rope(k, positions, base=300.0), v,
                    backend="torch")
    assert_close(out, rerope.rerope_attention(q, k, v, T, base=300.0, backend="torch"), REFERENCE_BUDGET)


@pytest.mark.parametrize("first_position", [0, 5])
def test_log_n_scaling_matches_the_reference(rng, first_position):
    q = torch.tensor(rng.standard_normal((2, 9, 4)))
    out = rerope.log_n_scaling(q, 3, first_position=first_position)
    expected = q.numpy() * log_n_scale(np.arange(first_position, first_position + 9), 3)[:, None]
    assert_close(out, expected, REFERENCE_BUDGET)
    assert rerope.log_n_scaling(q, None) is q


@pytest.mark.parametrize("call, error, match", [
    (lambda: rerope.apply_rope(torch.zeros(4, 5), torch.arange(4)), ValueError, "even head dim"),
    (lambda: rerope.apply_rope(torch.zeros(4, 6), torch.arange(5)), ValueError, r"positions must have shape \(4,\)"),
    (lambda: rerope.apply_rope(torch.zeros(6), torch.arange(6)), ValueError, r"x must have shape \(\*, \*\)"),
    (lambda: rerope.apply_rope(torch.zeros(2, 6), [0.0, float("nan")]), ValueError, "positions must be finite"),
    (lambda: rerope.apply_rope(torch.zeros(2, 6), [0, 1], base=0.0), ValueError, "base must be a finite number > 0"),
    (lambda: rerope.apply_rope(np.zeros((2, 6)), [0, 1]), TypeError, "x must be a torch.Tensor"),
    (lambda: rerope.log_n_scaling(torch.zeros(3, 4), 1), ValueError, "train_length must be a finite number >= 2"),
    (lambda: rerope.log_n_scaling(torch.zeros(3, 4), 4, first_position=-1), ValueError, "first_position"),
])
def test_rope_helpers_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
