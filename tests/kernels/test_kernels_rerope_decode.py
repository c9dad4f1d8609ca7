"""ReRoPE decode's one-launch kernel (kernels/rerope/decode.py, backend "triton_merged") under the Triton interpreter
against the float64 reference (reference/rope.py: rerope_decode): ReRoPE and Leaky ReRoPE, caches shorter than, as
long as and longer than the window, lengths that are not a multiple of the key tile, log-n scaling, scale and base;
the cache split across programs and the slices merged by the last program of each head (through more than one step
of the merge's loop); fp32 and fp16 (the interpreter has no bf16); the arrival counters; gradients; the
dispatcher's choice. Non-finite inputs: tests/kernels/test_edges_kernels.py runs every backend of the registry,
this one included. The AOT build: tests/kernels/test_aot_rerope.py.
Tiles are 16 keys (monkeypatched) so that short caches span several tiles and slices."""
import dataclasses

import pytest
import torch

from helpers.kernel_cases import needs_triton, spy
from helpers.qkv_check import output_and_grads, qkv_inputs
from test_kernels_gpu_limits import programs_backwards  # noqa: F401 (a fixture)
from seqmix.kernels import backends, rerope
from seqmix.kernels.rerope import decode, fused
from seqmix.kernels.rerope.naive import rerope_attention as definition
from seqmix.kernels.testing import FP16_BUDGET, FP32_BUDGET, assert_all_close, assert_close
from seqmix.reference.rope import rerope_decode as reference

pytestmark = needs_triton

TILE = 16


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    """16-key tiles; returns a function that sets the SMs decode_splits aims at (two programs each) and the slices
    the merge reads per step."""
    chosen = decode.launch_config
    monkeypatch.setattr(decode, "launch_config",
                        lambda d, dtype: dataclasses.replace(chosen(d, dtype), blocks={"BLOCK_N": TILE}))

    def use(sms=132, merge_splits=decode.MERGE_SPLITS):
        monkeypatch.setattr(fused, "GPU_SMS", sms)
        monkeypatch.setattr(decode, "MERGE_SPLITS", merge_splits)
    return use


def _decode(q, k, v, window, dtype=torch.float32, **options):
    """The kernel on q's last row against the whole cache, inputs cast to ``dtype``."""
    return rerope.rerope_decode(q[:, :, -1:].to(dtype), k.to(dtype), v.to(dtype), window, backend="triton_merged",
                                **options)


def _expected(q, k, v, window, **options):
    """The float64 reference on the same (possibly rounded) inputs."""
    return reference(q[:, :, -1:].double().numpy(), k.double().numpy(), v.double().numpy(), window, **options)


# (T, window, leaky_k, train_length): the cache below, at and above the window, T = 1, window - 1, window, window + 1,
# lengths that are not a multiple of the 16-key tile, a window of 1 and one longer than the cache
CASES = [
    pytest.param(1, 3, None, None, id="T=1"),
    pytest.param(8, 9, None, None, id="T=w-1"),
    pytest.param(9, 9, 2.0, 8, id="T=w-leaky-logn"),
    pytest.param(10, 9, None, 4, id="T=w+1-logn"),
    pytest.param(37, 5, None, None, id="rerope-T=37"),
    pytest.param(37, 20, 4.0, 16, id="leaky-logn-T=37"),
    pytest.param(33, 1, None, 8, id="w=1-logn"),
    pytest.param(23, 40, 2.0, None, id="w>T-leaky"),
    pytest.param(64, 16, 1.5, 10, id="T=4-tiles-w=tile"),
]


@pytest.mark.parametrize("T, window, leaky_k, train_length", CASES)
@pytest.mark.parametrize("sms", [132, 1], ids=["split", "one-slice"])
def test_matches_the_reference_in_fp32(rng, monkeypatch, small_tiles, sms, T, window, leaky_k, train_length):
    """Split into as many 16-key slices as the cache has tiles (sms=132), or one slice per head (sms=1, B H = 2)."""
    small_tiles(sms)
    chosen = spy(monkeypatch, decode, "decode_splits")
    q, k, v = qkv_inputs(rng, (2, 1, T, 16))
    options = dict(leaky_k=leaky_k, train_length=train_length)
    out = _decode(q, k, v, window, **options)
    assert [s for _, s in chosen] == [-(-T // TILE) if sms > 1 else 1]
    assert out.shape == (2, 1, 1, 16) and out.dtype == torch.float32
    assert_close(out, _expected(q, k, v, window, **options), FP32_BUDGET, "triton_merged vs reference")


@pytest.mark.parametrize("merge_splits", [4, 16])
def test_the_merge_reads_its_slices_in_steps(rng, monkeypatch, small_tiles, merge_splits):
    """150 keys in 10 slices of 16: the merge's loop takes 3 steps of 4 slices (the last one half masked) or
    one of 16, with the same answer; the splits are what decode_splits says."""
    small_tiles(132, merge_splits)
    chosen = spy(monkeypatch, decode, "decode_splits")
    q, k, v = qkv_inputs(rng, (1, 1, 150, 16))
    out = _decode(q, k, v, 40, leaky_k=1.5, train_length=8)
    assert chosen == [(16, 10)]
    assert_close(out, _expected(q, k, v, 40, leaky_k=1.5, train_length=8), FP32_BUDGET, "10 slices")


@pytest.mark.parametrize("sms, splits", [(4, 4), (1, 1)])
def test_slices_of_several_tiles(rng, monkeypatch, small_tiles, sms, splits):
    """100 keys, B H = 2: 8 programs give slices of 32 keys (two tiles each; 32 + 32 + 32 + 4), 2 programs one
    slice of all seven tiles; the window's edge falls inside a slice."""
    small_tiles(sms)
    chosen = spy(monkeypatch, decode, "decode_splits")
    q, k, v = qkv_inputs(rng, (2, 1, 100, 16))
    out = _decode(q, k, v, 30, leaky_k=2.0)
    assert [s for _, s in chosen] == [splits]
    assert_close(out, _expected(q, k, v, 30, leaky_k=2.0), FP32_BUDGET, f"{splits} slices")


def test_scale_and_base(rng, small_tiles):
    q, k, v = qkv_inputs(rng, (1, 1, 25, 16))
    for options in (dict(scale=0.3, base=500.0), dict(scale=-0.7, leaky_k=3.0), dict(scale=0.0, train_length=4)):
        assert_close(_decode(q, k, v, 7, **options), _expected(q, k, v, 7, **options), FP32_BUDGET, str(options))


@pytest.mark.parametrize("T, window, leaky_k, train_length", [CASES[0], CASES[3], CASES[5], CASES[8]])
def test_matches_the_reference_in_fp16(rng, small_tiles, T, window, leaky_k, train_length):
    """fp16 inputs, fp32 products and sums, fp16 output; the reference gets the same rounded inputs."""
    q, k, v = (x.half().double() for x in qkv_inputs(rng, (2, 1, T, 32)))
    options = dict(leaky_k=leaky_k, train_length=train_length)
    out = _decode(q, k, v, window, torch.float16, **options)
    assert out.dtype == torch.float16
    assert_close(out, _expected(q, k, v, window, **options), FP16_BUDGET, "fp16")


def test_large_scores_do_not_overflow(rng, small_tiles):
    """Scores near 200 (e^200 overflows fp32): the running max keeps every exponent <= 0, slices and merge alike."""
    q, k, v = qkv_inputs(rng, (1, 1, 50, 16), spread=12.0)
    out = _decode(q, k, v, 6, train_length=4)
    assert_close(out, _expected(q, k, v, 6, train_length=4), FP32_BUDGET, "scores~200")


def test_the_arrival_counters_are_left_at_zero_and_reused(rng, small_tiles):
    """Each launch leaves its head's counter at 0 (so that the next launch finds its last program), the counters
    are shared by calls on one device and grown for more heads; the same call gives the same bits."""
    decode._ARRIVALS.clear()
    q, k, v = qkv_inputs(rng, (1, 2, 20, 16))
    first = _decode(q, k, v, 9)
    counters = decode._ARRIVALS[(torch.device("cpu"), None)]
    assert counters.numel() == 2 and (counters == 0).all()
    assert torch.equal(_decode(q, k, v, 9), first)
    assert decode._ARRIVALS[(torch.device("cpu"), None)] is counters
    _decode(*qkv_inputs(rng, (3, 1, 5, 16)), 9)                     # 3 heads: grown to twice 2
    assert decode._ARRIVALS[(torch.device("cpu"), None)].numel() == 4
    assert (decode._ARRIVALS[(torch.device("cpu"), None)] == 0).all()


@pytest.mark.usefixtures("programs_backwards")
def test_any_program_order_gives_the_same_bits(rng, monkeypatch, small_tiles):
    """The interpreter's programs run last first: slice 0 arrives last and merges, where in grid order slice 2
    does. The merge reads the slices in their order whoever runs it: the same bits (as on a GPU, where the order
    of arrival changes from run to run)."""
    q, k, v = qkv_inputs(rng, (1, 2, 40, 16))
    backwards = _decode(q, k, v, 9, leaky_k=2.0)
    tiles = decode.launch_config
    monkeypatch.undo()                                  # grid order again, the same 16-key tiles
    monkeypatch.setattr(decode, "launch_config", tiles)
    chosen = spy(monkeypatch, decode, "decode_splits")
    assert torch.equal(_decode(q, k, v, 9, leaky_k=2.0), backwards) and [s for _, s in chosen] == [3]


def test_gradients_are_the_triton_backends(rng, small_tiles):
    """The backward recomputes the "triton" forward's O and LSE and runs its backward kernels: its gradients to the
    bit, and the float64 definition's within the budget."""
    q, k, v = qkv_inputs(rng, (1, 1, 23, 16))
    do = torch.tensor(rng.standard_normal((1, 1, 1, 16)))
    opts = dict(leaky_k=4.0, train_length=16)
    inputs = (q[:, :, -1:].float(), k.float(), v.float())
    out, grads = output_and_grads(lambda *a: rerope.rerope_decode(*a, 9, backend="triton_merged", **opts), inputs, do)
    _, grads_triton = output_and_grads(lambda *a: rerope.rerope_decode(*a, 9, backend="triton", **opts), inputs, do)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_triton))
    _, grads_e = output_and_grads(lambda *a: definition(*a, 9, **opts)[:, :, -1:], (q, k, v), do)
    assert_all_close(("dq", "dk", "dv"), grads, (grads_e[0][:, :, -1:], *grads_e[1:]), FP32_BUDGET, "decode")


def test_the_dispatcher_picks_it_for_cuda_tensors():
    """None: "triton_merged" for CUDA tensors with d <= 128 (small heads too: no tl.dot), torch beyond; never on a
    CPU. Asked for by name above 128: the reason."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    for d in (8, 64, 128):
        assert backends.dispatch(backends.Call("rerope_decode", cuda, torch.bfloat16, {"d": d})) == "triton_merged"
    assert backends.dispatch(backends.Call("rerope_decode", cuda, torch.float32, {"d": 144})) == "torch"
    assert backends.dispatch(backends.Call("rerope_decode", cpu, torch.float32, {"d": 64})) == "torch"
    assert backends.dispatch(backends.Call("rerope_attention", cuda, torch.float32, {"d": 64})) == "triton"
    q = torch.zeros(1, 1, 1, 144)
    with pytest.raises(ValueError, match=r"backend='triton_merged' takes head dims d <= 128, got d = 144"):
        rerope.rerope_decode(q, q, q, 2, backend="triton_merged")
    with pytest.raises(ValueError, match=r"backend='triton_merged' exists for rerope_decode only"):
        rerope.rerope_attention(q, q, q, 2, backend="triton_merged")
