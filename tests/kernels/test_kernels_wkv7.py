"""kernels/wkv7/ against the float64 truth: outputs, final states and every gradient (the initial state's too), on
the torch backend (chunked WY form) and the Triton backend (under the interpreter on CPU). Gradients come from
autograd through the per-token recurrence of seqmix.kernels.wkv7.naive, checked against the NumPy reference
first."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import seqmix.kernels.wkv7 as kw
import seqmix.kernels.wkv7.triton_chunked as chunked_kernels
from helpers.kernel_cases import needs_triton, spy
from seqmix.kernels.wkv7 import naive as definitions
from seqmix.kernels.backends import Call, deprecated_chunked, refusals
from seqmix.kernels.inputs import in_pieces, rwkv7_inputs, split_bounds
from seqmix.kernels.testing import (FP16_BUDGET, FP32_BUDGET, FP32_CHUNKED_WKV7_BUDGET, REFERENCE_BUDGET,
                                    accumulation_dtype, assert_all_close, assert_close, fp32)
from seqmix.reference.wkv7 import wkv7 as reference_wkv7

# The gradients' names: of r, log_w, k, v, a, b and the initial state.
GRAD_NAMES = ("dr", "dlog_w", "dk", "dv", "da", "db", "dstate")


def truth(x, S0, with_state, dtype, state_dtype):
    """Output, final state and gradients of <y, gy> + <S_T, gS> in float64, from inputs and cotangents rounded to
    the kernel's dtypes (so that only the kernel's own error is measured). Returns (x, y, S, grads, gy, gS)."""
    x = [torch.tensor(z).to(dtype).double().requires_grad_() for z in x]
    S0 = (torch.tensor(S0).to(state_dtype).double().requires_grad_() if with_state
          else torch.zeros(S0.shape, dtype=torch.float64))
    y, S = definitions.wkv7(*x, state=S0)
    y_np, S_np = reference_wkv7(*(z.detach().numpy() for z in x), state=S0.detach().numpy())
    assert_close(y, y_np, REFERENCE_BUDGET, "torch recurrence vs reference: y")
    assert_close(S, S_np, REFERENCE_BUDGET, "torch recurrence vs reference: state")
    gen = torch.Generator().manual_seed(7)
    gy = torch.randn(y.shape, generator=gen, dtype=torch.float64).to(dtype).double()
    gS = torch.randn(S.shape, generator=gen, dtype=torch.float64).to(state_dtype).double()
    grads = torch.autograd.grad((y * gy).sum() + (S * gS).sum(), x + ([S0] if with_state else []))
    return x, y, S, grads, gy, gS


def check_against_truth(rng, shape, decay, with_state, dtype, backend, budget, **options):
    check_inputs_against_truth(*rwkv7_inputs(rng, *shape, decay), with_state, dtype, backend, budget, **options)


def check_inputs_against_truth(x_np, S0_np, with_state, dtype, backend, budget, **options):
    state_dtype = accumulation_dtype(dtype)
    x64, y_true, S_true, grads_true, gy, gS = truth(x_np, S0_np, with_state, dtype, state_dtype)
    x = [z.detach().to(dtype).requires_grad_() for z in x64]
    S0 = torch.tensor(S0_np, dtype=state_dtype, requires_grad=True) if with_state else None
    y, S = kw.wkv7(*x, state=S0, backend=backend, **options)
    assert y.dtype == dtype and S.dtype == state_dtype
    assert_close(y, y_true, budget, f"{backend} y")
    assert_close(S, S_true, budget, f"{backend} final state")
    grads = torch.autograd.grad((y * gy.to(dtype)).sum() + (S * gS.to(state_dtype)).sum(),
                                x + ([S0] if with_state else []))
    assert_all_close(GRAD_NAMES[:len(grads_true)], grads, grads_true, budget, backend)


# ----------------------------------------------------------------------------------------------------------------
# torch backend
# ----------------------------------------------------------------------------------------------------------------

@pytest.fixture(params=["factored", "blocks"])
def couplings(request, monkeypatch):
    """Run a test on both ways of building the in-chunk couplings: a DECAY_RANGE below every spread forces the
    blocks."""
    if request.param == "blocks":
        monkeypatch.setattr(kw, "DECAY_RANGE", -1.0)
    return request.param


@pytest.mark.parametrize("shape, decay, with_state", [
    ((1, 1, 1, 16), "strong", False),        # T = 1
    ((2, 37, 3, 16), "mixed", True),         # T not a multiple of the chunk, batch > 1
    ((1, 33, 2, 64), "strong", True),        # head size 64, decays near 0.545
    ((3, 16, 1, 5), "weak", False),          # one whole chunk, decays near 1, odd head size
    ((1, 40, 1, 8), "weak", True),
])
def test_torch_fp32(rng, couplings, shape, decay, with_state):
    check_against_truth(rng, shape, decay, with_state, torch.float32, "torch", FP32_CHUNKED_WKV7_BUDGET)


@pytest.mark.parametrize("shape", [(1, 1, 1, 4), (2, 21, 2, 5), (1, 35, 1, 8)])
def test_torch_float64(rng, couplings, shape):
    check_against_truth(rng, shape, "mixed", True, torch.float64, "torch", REFERENCE_BUDGET)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_torch_half(rng, dtype):
    check_against_truth(rng, (2, 19, 2, 16), "mixed", True, dtype, "torch", FP16_BUDGET)


@pytest.mark.parametrize("dtype, budget", [(torch.float64, REFERENCE_BUDGET),
                                           (torch.float32, FP32_CHUNKED_WKV7_BUDGET)])
def test_torch_extreme_decays_take_the_block_couplings(rng, monkeypatch, dtype, budget):
    """Decays down to exp(-1e4): the spread of c inside a chunk exceeds DECAY_RANGE, so the blocks are used (the
    factored form would overflow: e^{-c} = inf), and the result stays exact."""
    calls = spy(monkeypatch, kw, "_block_couplings")
    check_against_truth(rng, (1, 40, 2, 8), "extreme", True, dtype, "torch", budget)
    assert calls


@pytest.mark.parametrize("shape, fast_mode", [((1, 3, 1, 2), False), ((1, 18, 1, 3), True)])
def test_torch_gradcheck(couplings, shape, fast_mode):
    gen = torch.Generator().manual_seed(3)
    B, T, H, N = shape
    x = [torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(6)]
    x[1] = -torch.exp(x[1])                                              # log decays
    x[4], x[5] = x[4] / N, x[5] / N
    S0 = torch.randn((B, H, N, N), generator=gen, dtype=torch.float64)
    inputs = [z.requires_grad_() for z in x + [S0]]
    assert torch.autograd.gradcheck(lambda *z: kw.wkv7(*z[:6], state=z[6], backend="torch"), inputs,
                                    fast_mode=fast_mode)


@settings(deadline=None)
@given(T=st.integers(2, 50), cuts=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=3),
       seed=st.integers(0, 2**32 - 1))
def test_torch_split_sequence_equals_whole(T, cuts, seed):
    rng = np.random.default_rng(seed)
    x_np, S0_np = rwkv7_inputs(rng, 2, T, 2, 4)
    x, S0 = [torch.tensor(z) for z in x_np], torch.tensor(S0_np)
    y_whole, S_whole = kw.wkv7(*x, state=S0, backend="torch")
    bounds = split_bounds(T, cuts)
    ys, S = in_pieces(lambda lo, hi, s: kw.wkv7(*(z[:, lo:hi] for z in x), state=s, backend="torch"), bounds, S0)
    assert_close(torch.cat(ys, 1), y_whole, REFERENCE_BUDGET, f"y in pieces {bounds}")
    assert_close(S, S_whole, REFERENCE_BUDGET, f"state in pieces {bounds}")


# ----------------------------------------------------------------------------------------------------------------
# Triton backend (interpreter): tiny shapes, the interpreter runs every program step by step
# ----------------------------------------------------------------------------------------------------------------

@pytest.fixture(params=[False, True], ids=["sequential", "chunked"])
def chunked(request, monkeypatch):
    """Run a Triton test on both forward kernels: the sequential one (the default) and the chunked one (it takes
    every case it is used on: head sizes >= 16, RWKV-7's decays), the latter through the deprecated chunked=True
    (tests/kernels/test_backends.py runs backend="triton_chunked" itself). The backward kernel is the same for both."""
    launches = spy(monkeypatch, kw, "_chunked_fwd")
    yield request.param
    assert bool(launches) == request.param


@pytest.mark.parametrize("shape, decay, with_state", [
    ((2, 20, 1, 16), "mixed", True),         # batch > 1, T past one checkpoint interval and not a multiple of it
    ((1, 1, 1, 16), "strong", False),        # T = 1
    ((1, 17, 2, 16), "weak", True),          # odd T, two heads
    ((1, 5, 1, 64), "strong", True),         # head size 64
    ((1, 18, 1, 16), "growing", True),       # log_w > 0 (a growing state): the formula is defined for any log_w
])
@needs_triton
def test_triton_fp32(rng, chunked, shape, decay, with_state):
    check_against_truth(rng, shape, decay, with_state, torch.float32, "triton", FP32_BUDGET, chunked=chunked)


@needs_triton
def test_triton_chunked_with_correlated_keys_and_weak_decays():
    """In-chunk couplings A of (I - A)^{-1} that stay large up to A^8: unit keys kk that nearly agree (a = -kk,
    b = 0.9 kk), decays near 1, T = 32. With random keys A^8 is about 0, and mutant C01 (the UT inverse without its
    (I + A^8) factor) survived every test: 5.9e3 relative error here."""
    gen = np.random.default_rng(12)
    T, N = 32, 16
    kk = np.ones(N) + 0.1 * gen.normal(size=(1, T, 1, N))
    kk /= np.linalg.norm(kk, axis=-1, keepdims=True)
    r, k, v = (gen.normal(size=(1, T, 1, N)) for _ in range(3))
    log_w = -1e-3 * gen.uniform(size=(1, T, 1, N))
    x = [r, log_w, k, v, -kk, 0.9 * kk]
    check_inputs_against_truth(x, gen.normal(size=(1, 1, N, N)), True, torch.float32, "triton",
                               FP32_CHUNKED_WKV7_BUDGET, chunked=True)


@needs_triton
@pytest.mark.parametrize("seed", [0, 1])
def test_triton_chunked_fp16_gradients_with_correlated_keys_within_budget(seed):
    """K1: fp16 inputs with nearly parallel unit keys and weak decays (B 1, T 29, H 2, N 16, a state). The chunked
    kernels rounded every product's operands to fp16, the states and the inverse among them: d/db 1.4e-1 and
    1.6e-1 here, d/da 4e-2 (budget 5e-3), where moving the inputs by half an fp16 ulp moves the float64 gradients
    by at most 1.4e-3 (the conditioning). With fp32 (tf32 on a GPU) operands beyond the raw inputs' couplings, at
    most 7.3e-4."""
    gen = np.random.default_rng(seed)
    T, H, N = 29, 2, 16
    kk = np.ones(N) + 0.1 * gen.normal(size=(1, T, H, N))
    kk /= np.linalg.norm(kk, axis=-1, keepdims=True)
    r, k, v = (gen.normal(size=(1, T, H, N)) for _ in range(3))
    log_w = -1e-3 * gen.uniform(size=(1, T, H, N))
    check_inputs_against_truth([r, log_w, k, v, -kk, 0.9 * kk], gen.normal(size=(1, H, N, N)), True, torch.float16,
                               "triton_chunked", FP16_BUDGET)


@needs_triton
@pytest.mark.parametrize("sms, block_v", [(132, 4), (1, 8)])
def test_triton_forward_splits_value_rows_by_the_grid(rng, monkeypatch, sms, block_v):
    """The sequential forward's value rows per program follow B H: at a small grid 4 (four programs a head at
    N = 16), on a GPU of one SM N / 2 = 8; the results are the same at each (the backward keeps 8)."""
    split = kw.rows_per_program
    monkeypatch.setattr(kw, "rows_per_program", lambda *args: split(*args, sms=sms))
    configs = spy(monkeypatch, kw, "_launch_config")
    check_against_truth(rng, (1, 19, 2, 16), "mixed", True, torch.float32, "triton", FP32_BUDGET)
    assert [c["BLOCK_V"] for c in configs] == [block_v, 8]


@needs_triton
@pytest.mark.parametrize("decay, N, chunked_kernel", [("extreme", 16, True), ("mixed", 8, False)])
def test_triton_chunked_forward_takes_any_decay(rng, monkeypatch, decay, N, chunked_kernel):
    """With chunked=True: decays down to exp(-1e4) (the factored couplings would need e^{-c} = inf) run on the
    chunked kernel, whose chunks out of range take their steps one at a time; head sizes below tl.dot's 16 run on
    the sequential kernel."""
    launches = spy(monkeypatch, kw, "_chunked_fwd")
    check_against_truth(rng, (1, 40, 2, N), decay, True, torch.float32, "triton", FP32_BUDGET, chunked=True)
    assert bool(launches) == chunked_kernel


@needs_triton
def test_triton_chunked_forward_mixes_factored_and_stepwise_chunks(rng):
    """One launch, three chunks: the middle one's decays are far out of DECAY_RANGE (e^{-c} overflows: its steps
    go one at a time), the others within it (factored); y and the state against the float64 reference."""
    x_np, S0_np = rwkv7_inputs(rng, 1, 40, 2, 16)
    x_np[1][:, 16:32] *= 1e4                          # log_w: decays down to e^{-1e4} in steps 16 .. 31
    x, (S0,) = fp32(*x_np), fp32(S0_np)
    y, S = kw.wkv7(*x, state=S0, backend="triton", chunked=True)
    y_ref, S_ref = reference_wkv7(*(z.double().numpy() for z in x), state=S0.double().numpy())
    assert_close(y, y_ref, FP32_BUDGET, "y")
    assert_close(S, S_ref, FP32_BUDGET, "state")


BOUNDARY_LENGTHS = [1, 15, 16, 17, 63, 64, 65, 130]   # around one sub-chunk (16), one group (64); 130: 2 groups + 2


@needs_triton
@pytest.mark.parametrize("with_state", [False, True], ids=["zero state", "initial state"])
@pytest.mark.parametrize("T", [T if T in (1, 17, 65) else pytest.param(T, marks=pytest.mark.slow)
                               for T in BOUNDARY_LENGTHS])
def test_triton_chunked_inference_at_sub_chunk_and_group_boundaries(rng, monkeypatch, T, with_state):
    """Without a gradient the chunked forward composes GROUP = 4 sub-chunks of 16 steps into each step of its serial
    pass (fp16/bf16 inputs; fp32 inputs here too, as the fp16 ones would, so that the composition is measured at
    fp32's accuracy; the spy counts the groups); y and the final state against the float64 reference, within the
    chunked WKV-7 budget. The quick tier takes 1, 17 and 65 (the interpreter: 5 s a case here)."""
    monkeypatch.setattr(chunked_kernels, "group_size", lambda dtype: chunked_kernels.GROUP)
    groups = spy(monkeypatch, kw, "_chunked_fwd")
    x_np, S0_np = rwkv7_inputs(rng, 1, T, 2, 16)
    x = fp32(*x_np)
    S0 = fp32(S0_np)[0] if with_state else None
    y, S = kw.wkv7(*x, state=S0, backend="triton_chunked")
    y_ref, S_ref = reference_wkv7(*x_np, state=S0_np if with_state else None)
    assert_close(y, y_ref, FP32_CHUNKED_WKV7_BUDGET, "y")
    assert_close(S, S_ref, FP32_CHUNKED_WKV7_BUDGET, "state")
    (states,) = groups
    assert states.shape == (2, -(-T // 64), 16, 16)


@needs_triton
@pytest.mark.parametrize("dtype, budget, steps", [(torch.float16, FP16_BUDGET, 64), (torch.float32,
                                                                                    FP32_CHUNKED_WKV7_BUDGET, 16)])
def test_triton_chunked_inference_groups_by_dtype(rng, monkeypatch, dtype, budget, steps):
    """As the launcher chooses: fp16/bf16 inputs take groups of 64 steps, fp32 inputs of 16 (group_size says why);
    T = 70 spans two groups either way."""
    groups = spy(monkeypatch, kw, "_chunked_fwd")
    x_np, S0_np = rwkv7_inputs(rng, 1, 70, 1, 16)
    x_np = [np.asarray(torch.tensor(z).to(dtype).double()) for z in x_np]      # the reference takes the same inputs
    y, S = kw.wkv7(*(torch.tensor(z, dtype=dtype) for z in x_np), state=fp32(S0_np)[0], backend="triton_chunked")
    y_ref, S_ref = reference_wkv7(*x_np, state=S0_np)
    assert_close(y, y_ref, budget, "y")
    assert_close(S, S_ref, budget, "state")
    (states,) = groups
    assert states.shape == (1, -(-70 // steps), 16, 16)


@needs_triton
@pytest.mark.parametrize("with_state", [False, True], ids=["zero state", "initial state"])
@pytest.mark.parametrize("T, group", [
    pytest.param(T, group, id=f"{T}-groups of {group}",
                 marks=() if T in (1, 17) or (group > 1 and T == 65) else pytest.mark.slow)
    for group in (1, chunked_kernels.GROUP) for T in BOUNDARY_LENGTHS])
def test_triton_chunked_gradients_at_sub_chunk_and_group_boundaries(rng, monkeypatch, T, group, with_state):
    """y, the final state and every gradient, the initial state's too, against autograd of the float64 recurrence,
    with the forward's groups (and so the backward's) of one sub-chunk (fp32's, group_size) and of GROUP (fp16's and
    bf16's: the backward then walks the state and dL/dS over each group's sub-chunks in its own kernels), both at
    fp32's accuracy here; the spy counts the groups. The quick tier takes T = 1 and 17, and 65 with groups of GROUP
    (a whole group and one step; the interpreter: 5-10 s a case)."""
    monkeypatch.setattr(chunked_kernels, "group_size", lambda dtype: group)
    groups = spy(monkeypatch, kw, "_chunked_fwd")
    check_against_truth(rng, (1, T, 1, 16), "mixed", with_state, torch.float32, "triton_chunked",
                        FP32_CHUNKED_WKV7_BUDGET)
    (states,) = groups
    assert states.shape == (1, -(-T // (16 * group)), 16, 16)


@needs_triton
def test_triton_chunked_refuses_heads_past_its_largest():
    """N = 128: the chunked kernels' AOT builds spill there (docs/gpu.md), so backend="triton_chunked" refuses it by
    name, backend=None never picks it there (the sequential kernels take the call) and the deprecated chunked=True
    keeps "triton"; at N = 64 it still turns "triton" into "triton_chunked"."""
    x = [torch.zeros(1, 2, 1, 2 * kw.MAX_CHUNKED_HEAD) for _ in range(6)]
    with pytest.raises(ValueError, match=rf"^backend='triton_chunked' takes head sizes N <= {kw.MAX_CHUNKED_HEAD} "
                                         rf"\(larger heads spill registers\), got N = {2 * kw.MAX_CHUNKED_HEAD}; "):
        kw.wkv7(*x, backend="triton_chunked")
    cuda = torch.device("cuda")
    call = Call("wkv7", cuda, torch.float32, {"N": 2 * kw.MAX_CHUNKED_HEAD})
    says = refusals(call)
    assert says["triton"] is None and "N <= 64" in says["triton_chunked"]
    assert deprecated_chunked(call, "triton") == "triton"
    assert deprecated_chunked(Call("wkv7", cuda, torch.float32, {"N": kw.MAX_CHUNKED_HEAD}), "triton") == \
        "triton_chunked"


@needs_triton
def test_triton_fp16(rng, chunked):
    check_against_truth(rng, (1, 19, 1, 16), "mixed", True, torch.float16, "triton", FP16_BUDGET, chunked=chunked)


@needs_triton
def test_triton_split_sequence_equals_whole(rng, chunked):
    x_np, S0_np = rwkv7_inputs(rng, 1, 21, 1, 16)
    x, (S0,) = fp32(*x_np), fp32(S0_np)
    y_whole, S_whole = kw.wkv7(*x, state=S0, backend="triton", chunked=chunked)
    y1, S1 = kw.wkv7(*(z[:, :8] for z in x), state=S0, backend="triton", chunked=chunked)
    y2, S2 = kw.wkv7(*(z[:, 8:] for z in x), state=S1, backend="triton", chunked=chunked)
    assert_close(torch.cat([y1, y2], 1), y_whole, FP32_BUDGET, "y in pieces")
    assert_close(S2, S_whole, FP32_BUDGET, "state in pieces")


@needs_triton
def test_triton_gradient_of_final_state_only(rng, chunked):
    """A loss of the final state alone (y unused): the backward gets no gradient for y."""
    x_np, S0_np = rwkv7_inputs(rng, 1, 6, 1, 16)
    x = [torch.tensor(z, dtype=torch.float32, requires_grad=True) for z in x_np]
    S0 = torch.tensor(S0_np, dtype=torch.float32, requires_grad=True)
    _, S = kw.wkv7(*x, state=S0, backend="triton", chunked=chunked)
    grads = torch.autograd.grad(S.square().sum(), x + [S0])
    x64 = [z.detach().double().requires_grad_() for z in x + [S0]]
    _, S_true = definitions.wkv7(*x64[:6], state=x64[6])
    grads_true = torch.autograd.grad(S_true.square().sum(), x64, allow_unused=True, materialize_grads=True)
    assert_all_close(GRAD_NAMES, grads, grads_true, FP32_BUDGET)


# ----------------------------------------------------------------------------------------------------------------
# Triton chunked backward (kernels/wkv7/triton_chunked_bwd.py): every test counts its launches, so that none
# passes on the sequential backward
# ----------------------------------------------------------------------------------------------------------------

@pytest.fixture
def chunked_backward(monkeypatch):
    """The chunked backward's calls; the test asserts how many it expects."""
    return spy(monkeypatch, kw, "_chunked_bwd")


def chunked_grads(x_np, S0_np, dtype=torch.float32, pieces=(None,), **options):
    """y, the final state and the gradients of <y, gy> + <S_T, gS> (gy, gS fixed random) of every input and the
    initial state, the sequence fed in pieces (bounds; (None,): whole) on the chunked Triton path (or ``options``)."""
    x = [torch.tensor(z, dtype=dtype, requires_grad=True) for z in x_np]
    S0 = torch.tensor(S0_np, dtype=torch.float32, requires_grad=True)
    bounds = [0, *(b for b in pieces if b is not None), x[0].shape[1]]
    ys, S = in_pieces(lambda lo, hi, s: kw.wkv7(*(z[:, lo:hi] for z in x), state=s,
                                                **(options or dict(backend="triton", chunked=True))), bounds, S0)
    y = torch.cat(ys, 1)
    gen = torch.Generator().manual_seed(5)
    gy, gS = torch.randn(y.shape, generator=gen).to(dtype), torch.randn(S.shape, generator=gen)
    return y, S, torch.autograd.grad((y * gy).sum() + (S * gS).sum(), x + [S0])


@pytest.mark.parametrize("shape, decay, with_state", [
    ((1, 1, 1, 16), "strong", True),         # T = 1
    ((2, 17, 1, 16), "mixed", True),         # odd T, batch > 1
    ((1, 37, 2, 32), "strong", True),        # T not a multiple of the chunk; two row blocks, two key blocks
    ((1, 32, 1, 16), "weak", False),         # whole chunks, no initial state
    ((1, 20, 1, 16), "growing", True),       # log_w > 0
])
@needs_triton
def test_triton_chunked_backward(rng, chunked_backward, shape, decay, with_state):
    """Every gradient (the initial state's too) against autograd of the float64 recurrence."""
    check_against_truth(rng, shape, decay, with_state, torch.float32, "triton", FP32_CHUNKED_WKV7_BUDGET,
                        chunked=True)
    assert len(chunked_backward) == 1


@pytest.mark.parametrize("shape, decay", [((1, 37, 1, 32), "strong"), ((2, 19, 1, 16), "mixed")])
@needs_triton
def test_triton_chunked_backward_fp16(rng, monkeypatch, chunked_backward, shape, decay):
    """fp16 inputs: every product on the tensor cores' path (operands rounded to fp16, fp32 sums; the interpreter
    rounds them the same way), within the fp16 budget; the forward's groups, and so the backward's, of GROUP
    sub-chunks (group_size), as without a gradient."""
    groups = spy(monkeypatch, kw, "_chunked_fwd")
    check_against_truth(rng, shape, decay, True, torch.float16, "triton", FP16_BUDGET, chunked=True)
    assert len(chunked_backward) == 1
    (states,) = groups
    assert states.shape[1] == -(-shape[1] // (16 * chunked_kernels.GROUP))


@needs_triton
def test_triton_chunked_fp16_keeps_factors_in_range(rng, chunked_backward):
    """fp16 at RWKV-7's strongest decays (spread 9.7 a chunk) with keys of size ~8: uncentred, k_j e^{-c_j} would
    reach 8 e^{9.7} > 65504 (inf in fp16); the centred factors stay within e^{+-4.9}."""
    x_np, S0_np = rwkv7_inputs(rng, 1, 32, 1, 16, "strong")
    x_np[1][:] = -np.exp(-0.5)                       # log_w: the strongest decay, 0.545, at every step
    x_np[2] = 8.0 * np.sign(x_np[2])
    check_inputs_against_truth(x_np, S0_np, True, torch.float16, "triton", FP16_BUDGET, chunked=True)
    assert len(chunked_backward) == 1


@needs_triton
@pytest.mark.slow   # the Triton interpreter beyond tiny shapes (no rule of tests/conftest.py can see it)
def test_triton_chunked_backward_matches_sequential_and_torch(rng, chunked_backward):
    """The same gradients from the chunked backward, the sequential Triton backward and autograd through the torch
    path's chunked form."""
    x_np, S0_np = rwkv7_inputs(rng, 2, 21, 2, 16, "strong")
    _, _, chunked = chunked_grads(x_np, S0_np)
    assert len(chunked_backward) == 1
    for name, options in (("sequential", dict(backend="triton")), ("torch", dict(backend="torch"))):
        _, _, other = chunked_grads(x_np, S0_np, **options)
        assert_all_close(GRAD_NAMES, chunked, other, FP32_CHUNKED_WKV7_BUDGET, f"chunked vs {name}")
    assert len(chunked_backward) == 1


@pytest.mark.parametrize("cuts", [(8,), (16, 21)])
@needs_triton
def test_triton_chunked_split_sequence_gradients_equal_whole(rng, chunked_backward, cuts):
    """Two or three calls, each from the state the last returned, give the whole call's outputs and gradients (cuts
    inside a chunk and on a chunk's edge)."""
    x_np, S0_np = rwkv7_inputs(rng, 1, 37, 1, 16)
    y_whole, S_whole, whole = chunked_grads(x_np, S0_np)
    y, S, pieces = chunked_grads(x_np, S0_np, pieces=cuts)
    assert len(chunked_backward) == 2 + len(cuts)
    assert_close(y, y_whole, FP32_CHUNKED_WKV7_BUDGET, "y in pieces")
    assert_close(S, S_whole, FP32_CHUNKED_WKV7_BUDGET, "state in pieces")
    assert_all_close(GRAD_NAMES, pieces, whole, FP32_CHUNKED_WKV7_BUDGET, f"in pieces at {cuts}")


@needs_triton
@pytest.mark.slow   # the Triton interpreter beyond tiny shapes (no rule of tests/conftest.py can see it)
@pytest.mark.parametrize("group", [1, chunked_kernels.GROUP], ids=["groups of one", "groups of GROUP"])
def test_triton_chunked_backward_steps_through_out_of_range_chunks(rng, monkeypatch, chunked_backward, group):
    """One launch, three chunks: the middle one's decays reach e^{-1e4} (its spread is far beyond DECAY_RANGE: every
    backward kernel takes its steps one at a time), the others are factored; every gradient against the truth, with
    groups of one sub-chunk and of GROUP (the middle one then inside a group: the walks of the state and of dL/dS
    over the group step through it too)."""
    monkeypatch.setattr(chunked_kernels, "group_size", lambda dtype: group)
    x_np, S0_np = rwkv7_inputs(rng, 1, 40, 2, 16)
    x_np[1][:, 16:32] *= 1e4
    check_inputs_against_truth(x_np, S0_np, True, torch.float32, "triton", FP32_CHUNKED_WKV7_BUDGET, chunked=True)
    assert len(chunked_backward) == 1


@needs_triton
@pytest.mark.slow   # the Triton interpreter beyond tiny shapes (no rule of tests/conftest.py can see it)
@pytest.mark.parametrize("group", [1, chunked_kernels.GROUP], ids=["groups of one", "groups of GROUP"])
def test_triton_chunked_backward_steps_every_chunk(rng, monkeypatch, chunked_backward, group):
    """DECAY_RANGE below every spread: every chunk of the forward and of every backward kernel goes step by step (two
    row blocks, T not a multiple of the chunk), in groups of one sub-chunk and of GROUP."""
    monkeypatch.setattr(kw, "DECAY_RANGE", -1.0)
    monkeypatch.setattr(chunked_kernels, "group_size", lambda dtype: group)
    check_against_truth(rng, (1, 21, 1, 32), "mixed", True, torch.float32, "triton", FP32_CHUNKED_WKV7_BUDGET,
                        chunked=True)
    assert len(chunked_backward) == 1


# ----------------------------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------------------------

def small_inputs(dtype=torch.float32, N=4):
    x = [torch.randn(1, 3, 2, N, dtype=dtype) for _ in range(6)]
    x[1] = -x[1].exp()
    return x


def test_bad_input():
    x = small_inputs()
    with pytest.raises(ValueError, match=r"k must have shape \(1, 3, 2, 4\), got \(1, 3, 2, 5\)"):
        kw.wkv7(x[0], x[1], torch.zeros(1, 3, 2, 5), *x[3:])
    with pytest.raises(ValueError, match=r"r must have shape \(\*, \*, \*, \*\), got \(3, 2, 4\)"):
        kw.wkv7(*(z[0] for z in x))
    with pytest.raises(ValueError, match="every size >= 1"):
        kw.wkv7(*(z[:, :0] for z in x))
    with pytest.raises(ValueError, match=r"state must have shape \(1, 2, 4, 4\), got \(1, 2, 4, 5\)"):
        kw.wkv7(*x, state=torch.zeros(1, 2, 4, 5))
    with pytest.raises(TypeError, match="state must have dtype in"):
        kw.wkv7(*x, state=torch.zeros(1, 2, 4, 4, dtype=torch.float16))
    with pytest.raises(TypeError, match="inputs must share one dtype"):
        kw.wkv7(*x[:5], x[5].double())
    with pytest.raises(TypeError, match="v must have dtype in"):
        kw.wkv7(*x[:3], x[3].to(torch.int32), *x[4:])
    with pytest.raises(TypeError, match="a must be a torch.Tensor, got ndarray"):
        kw.wkv7(*x[:4], x[4].numpy(), x[5])
    with pytest.raises(ValueError, match="inputs must be on one device"):
        kw.wkv7(*x[:5], x[5].to("meta"))
    with pytest.raises(ValueError, match="backend must be one of"):
        kw.wkv7(*x, backend="cuda")
    with pytest.raises(TypeError, match="chunked must be True or False, got 'yes'"):
        kw.wkv7(*x, chunked="yes")


@needs_triton   # without triton, backend='triton' is refused before these checks
def test_bad_input_triton():
    with pytest.raises(TypeError, match="backend='triton' takes dtypes"):
        kw.wkv7(*small_inputs(torch.float64), backend="triton")
    with pytest.raises(ValueError, match="power of two >= 4, got N = 6"):
        kw.wkv7(*small_inputs(N=6), backend="triton")


@needs_triton
def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        kw.wkv7(*small_inputs(), backend="triton")
