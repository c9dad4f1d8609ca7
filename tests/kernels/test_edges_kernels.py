"""Issue 13's kernel edges, one test per defect (its id in the test's name): decays of exactly 0, non-finite inputs,
scales <= 0, fp32 decays beside fp16 keys and values, state dtypes, clear errors, and the regimes in which the
mutation review's surviving mutants live (state max route, bonus above the cap, dominant current token, keys near
1e5). Every backend each concerns: torch, the C loops and Triton (under the interpreter, tiny shapes).
tests/kernels/test_edges_hypothesis.py feeds random non-finite inputs to every op."""
import numpy as np
import pytest
import torch

from helpers.edge_ops import NONFINITE, backends, call_kernel, check_nan_placement, inputs, names
from seqmix.kernels.declarations import call
from seqmix.kernels.registry import REGISTRY, spec
from helpers.kernel_cases import BACKENDS, RECURRENCE_BACKENDS, needs_triton
from seqmix.kernels import ssm
from seqmix.kernels.rerope import rerope_attention, rerope_decode
from seqmix.kernels.testing import FP16_BUDGET, FP32_BUDGET, assert_all_close, assert_close
from seqmix.kernels.wkv4 import wkv4
from seqmix.kernels.wkv7 import wkv7
from seqmix.models.rwkv4 import RwkvConfig, RwkvForCausalLM
from seqmix.reference import ssm as ref_ssm, wkv7 as ref_wkv7
from test_kernels_wkv4 import (GRAD_NAMES, assert_state_close, check_forward, loss_weights, make_inputs, run_dense,
                               run_reference as wkv4_reference, with_grads)


# ------------------------------------------------------------------------------------------ D1: a decay of exactly 0

@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
def test_d1_wkv4_decay_of_zero(rng, backend):
    """w = -inf (what -exp(time_decay) becomes once it overflows) is a decay of exactly 0: the reference's finite
    answer. Before: torch NaN at t = 0 and a NaN state, the C loop all NaN, Triton finite but 0.15 off."""
    w, u, k, v, state = make_inputs(rng, 2, 21, 4, with_state=True)
    w[[0, 2]] = -float("inf")
    check_forward(w, u, k, v, state, backend)
    check_forward(w, u, k, v, None, backend)
    grads = with_grads(lambda *a: wkv4(*a, backend=backend), w, u, k, v, state, *loss_weights(rng, 2, 21, 4))[2]
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
def test_d1_wkv7_decay_of_zero(rng, backend):
    """log_w = -inf in some entries is a decay of exactly 0, as log_w = -1e4 (e^-1e4 = 0 in float64) gives it in the
    reference (which takes finite log_w only). Before: the C loop made the head NaN."""
    x, S = rwkv7_case(rng)
    x[1][0, 2, 0, 1] = x[1][1, 4, 1, 3] = -np.inf
    y_ref, S_ref = ref_wkv7.wkv7(*[np.maximum(a, -1e4) for a in x[:2]], *x[2:], state=S)
    y, S_new = wkv7(*map(torch.tensor, x), state=torch.tensor(S), backend=backend)
    assert_all_close(("y", "state"), (y, S_new), (y_ref, S_ref), FP32_BUDGET)


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
def test_d1_scan_decay_of_zero(rng, backend):
    """A = -inf in some entries is a decay of exactly 0, as A = -1e30 gives it in the reference (which takes finite A
    only): e^{delta A} = 0 for a step delta > 0, and 1 for a step of 0 (where 0 * -inf would be NaN). The C loop
    takes the -inf itself (a bit test: it is compiled for finite math; passed on unread, the steps of 0 gave NaN)."""
    from seqmix.kernels.inputs import scan_inputs
    x = {n: a.astype(np.float32) for n, a in scan_inputs(rng, 2, 5, 4, 9, extras=("D", "state")).items()}
    x["A"][1, 2] = x["A"][4, 0] = -np.inf
    x["delta"][:, 1, 3] = x["delta"][1, 4, 2] = 0.0
    y_ref, S_ref = ref_ssm.selective_scan(**{**x, "A": np.maximum(x["A"], -1e30)})
    y, S = ssm.selective_scan(**{n: torch.tensor(a) for n, a in x.items()}, backend=backend)
    assert_all_close(("y", "state"), (y, S), (y_ref, S_ref), FP32_BUDGET)


def rwkv7_case(rng):
    from seqmix.kernels.inputs import rwkv7_inputs
    x, S = rwkv7_inputs(rng, 2, 7, 2, 4)
    return [a.astype(np.float32) for a in x], S.astype(np.float32)


# ------------------------------------------------------------------------- D2, I4, I5, mutant 31: non-finite inputs

CASES = [(op, name, value, backend) for op in names() for name in inputs(op, np.random.default_rng(0))
         for value in NONFINITE for backend in backends(op)]


@pytest.mark.parametrize("op,name,value,backend", CASES, ids=["-".join(c) for c in CASES])
def test_d2_nonfinite_input_gives_nan_where_the_reference_does(op, name, value, backend):
    """One NaN, +inf or -inf in one input of one op (mutant 31: +-inf, not only NaN, in every input): NaN wherever
    the reference has NaN (never a finite number: before, Triton's WKV-4 dropped a NaN key or bonus and returned
    finite garbage, aten's flash attention a finite row for a NaN query, and +inf keys, bonuses and state maxima
    gave a finite limit on torch and Triton), and NaN nowhere the input cannot reach: where the reference is
    non-finite, and for the C loops the input's lane (before, torch's chunked WKV-7 put NaN at the earlier steps of
    the input's chunk, I5, and the C loop's NaN r poisoned the head's state, I4). Where the reference refuses the
    input (WKV-7's non-finite log_w, the scan's non-finite delta, A, delta_bias), the torch backend's NaN is the
    yardstick."""
    x = inputs(op, np.random.default_rng(1))
    index = tuple(s // 2 for s in x[name].shape)
    x[name][index] = NONFINITE[value]
    check_nan_placement(op, x, [(name, index)], backend)


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
def test_d2_wkv4_nan_key_or_bonus_reaches_the_output(rng, backend):
    """D2 as the review found it: a NaN key makes its channel NaN from its token on, a NaN bonus the channel's whole
    output; Triton returned finite values for both."""
    w, u, k, v, _ = make_inputs(rng, 1, 6, 3)
    k[0, 2, 1] = float("nan")
    u[2] = float("nan")
    y = wkv4(w, u, k, v, backend=backend)[0]
    assert torch.isnan(y[0, 2:, 1]).all() and torch.isnan(y[0, :, 2]).all() and torch.isfinite(y[0, :2, 1]).all()


# ------------------------------------------------------------------------------------------------ D3: scale <= 0

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [0.0, -0.5])
@pytest.mark.parametrize("op", [op.name for op in REGISTRY if op.family == "attention"])
def test_d3_scale_not_positive(rng, op, scale, backend):
    """Causal attention and ReRoPE with scale 0 (uniform weights) or < 0 (anti-aligned): the reference's answer, and
    gradients that agree with Triton's. Before: NaN rows on the torch backend (aten scales after masking with -inf)."""
    battery = spec(op).get("battery")
    x = battery.make(rng, T=9, **{**battery.tiny, "H": 2})
    options = {**x.options, "scale": scale}
    leaves = {n: torch.tensor(a, dtype=torch.float32).requires_grad_() for n, a in x.tensors.items()}
    y = call(battery, spec(op).function, leaves, {**options, "backend": backend})
    assert_close(y, call(battery, spec(op).get("reference"), x.tensors, options), FP32_BUDGET, "y")
    if op == "attention":   # gradients against float64 autograd of the definition
        dense = [leaves[n].detach().double().requires_grad_() for n in "qkv"]
        scores = dense[0] @ dense[1].mT * scale + torch.full((9, 9), -torch.inf, dtype=torch.float64).triu(1)
        grads = torch.autograd.grad(y.double().sum(), [leaves[n] for n in "qkv"])
        expected = torch.autograd.grad((scores.softmax(-1) @ dense[2]).sum(), dense)
        assert_all_close(("dq", "dk", "dv"), grads, expected, FP32_BUDGET)


# ----------------------------------------------------------------------- D5: fp32 decays beside fp16 keys, values

@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
def test_d5_fp32_decays_beside_fp16_inputs(rng, backend):
    """WKV-4's w, u and WKV-7's log_w in fp32 beside fp16 keys and values: accepted, output in the values' dtype,
    within the fp16 budget; w below -65504 (time_decay > 11.09), -inf in fp16, is kept. Before: TypeError (one dtype)
    and, through a model's cast of w to fp16, NaN."""
    w, u, k, v, state = make_inputs(rng, 2, 9, 4, with_state=True)
    w[1] = -1e5
    y, new_state = wkv4(w, u, k.half(), v.half(), state, backend=backend)
    y_ref, state_ref = wkv4_reference(w, u, k.half(), v.half(), state)
    assert y.dtype == torch.float16
    assert_close(y, y_ref, FP16_BUDGET, "y")
    assert_state_close(new_state, state_ref, FP16_BUDGET, "state")
    x, S = rwkv7_case(rng)
    y, _ = wkv7(*(torch.tensor(a).to(torch.float32 if i == 1 else torch.float16) for i, a in enumerate(x)),
                state=torch.tensor(S), backend=backend)
    y_ref, _ = ref_wkv7.wkv7(*(torch.tensor(a).half().double().numpy() if i != 1 else a
                               for i, a in enumerate(x)), state=S)
    assert y.dtype == torch.float16
    assert_close(y, y_ref, FP16_BUDGET, "wkv7 y")


@pytest.mark.parametrize("backend", ["torch", "c"])
def test_d5_fp16_rwkv4_model_with_large_time_decay(backend):
    """An fp16 RWKV-4 with time_decay = 12 (fp16's -exp(12) = -inf) gives the fp32 model's logits, not NaN."""
    torch.manual_seed(0)
    model = RwkvForCausalLM(RwkvConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, attention_hidden_size=16,
                                       intermediate_size=32, context_length=64)).eval()
    with torch.no_grad():
        model.rwkv.blocks[0].attention.time_decay[3] = 12.0
    ids = torch.randint(0, 50, (2, 6))
    with torch.no_grad():
        want = model(ids, backend=backend).logits
        got = model.half()(ids, backend=backend).logits
    assert torch.isfinite(got).all()
    assert_close(got, want, FP16_BUDGET, "logits")


# ----------------------------------------------------------------------------------------- D6: state dtypes

@pytest.mark.parametrize("op", [op.name for op in REGISTRY if op.stateful])
def test_d6_states_of_another_dtype_are_refused(op):
    """States are fp32 (float64 beside float64 inputs): an fp16 state (in which RWKV-4's -1e38 is -inf) gets a
    TypeError naming it, on every backend."""
    x = inputs(op, np.random.default_rng(0))
    state_names = spec(op).get("battery").state_names
    for backend in backends(op):
        with pytest.raises(TypeError, match=r"state.*must have dtype"):
            t = {n: torch.tensor(a, dtype=torch.float16 if n in state_names else torch.float32) for n, a in x.items()}
            call_kernel(op, t, backend)


# ----------------------------------------------------------------------------------------------------- D4, D9

@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
@pytest.mark.parametrize("shift", [1e4, 1e5])
def test_d4_wkv4_keys_shifted_far(rng, backend, shift):
    """WKV is invariant to shifting every key: keys of U(-1, 1) + 1e4 or + 1e5 are as exact as U(-1, 1) (mutants
    41, 57: the final num, den follow the fp32 rounding of max), the state by what it represents; slow decays
    (|w| ~ 0.02), so that the past counts, and a chunk with a remainder. Before: torch 2.5e-5 and 6e-4 relative."""
    w, u, k, v, _ = make_inputs(rng, 2, 20, 4)
    w, k = w * 0.03, k + shift
    y, new_state = wkv4(w, u, k, v, backend=backend)
    y_ref, state_ref = wkv4_reference(w, u, k, v, None)
    assert_close(y, y_ref, FP32_BUDGET, "y")
    assert_state_close(new_state, state_ref, FP32_BUDGET, "state")


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
def test_m58_wkv4_gradients_with_keys_near_1e5(rng, backend):
    """Mutant 58: the backward's e^{err} on the final state's adjoints, which only keys whose fp32 ulp is large
    (1e5 + U(-1, 1)) can see; a loss on what the state represents."""
    w, u, _, v, state = make_inputs(rng, 2, 30, 4, with_state=True)
    k = torch.tensor(1e5 + rng.uniform(-1, 1, (2, 30, 4)), dtype=torch.float32)
    state = (state[0], state[1], state[2] + 1e5)
    gy, g_state = loss_weights(rng, 2, 30, 4, invariant=True)
    _, _, grads = with_grads(lambda *a: wkv4(*a, backend=backend), w, u, k, v, state, gy * 0, g_state)
    _, _, expected = with_grads(run_dense, w, u, k, v, state, gy * 0, g_state)
    assert_all_close(GRAD_NAMES[2:4], grads[2:4], expected[2:4], FP32_BUDGET)


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
def test_d9_m56_dominant_current_token_gradients(rng, backend):
    """u + 12: the current token dominates (y ~ v), every gradient against float64 autograd (mutant 56: v - y saved
    without cancellation). Before: torch's d/du 5.9e-3 relative."""
    w, u, k, v, state = make_inputs(rng, 2, 37, 6, with_state=True)
    u = u + 12
    gy, g_state = loss_weights(rng, 2, 37, 6)
    _, _, grads = with_grads(lambda *a: wkv4(*a, backend=backend), w, u, k, v, state, gy, g_state)
    _, _, expected = with_grads(run_dense, w, u, k, v, state, gy, g_state)
    assert_all_close(GRAD_NAMES, grads, expected, FP32_BUDGET)


# ------------------------------------------------------------------------------- mutants 17 and 43 (WKV-4)

@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
def test_m17_initial_state_sets_the_final_max(rng, backend):
    """Mutant 17: T = 3 and the state's max raised by 6, so that the final max comes from the initial state: all
    seven gradients of a loss on (y, num, den, max), d/dmax0 included."""
    w, u, k, v, state = make_inputs(rng, 2, 3, 5, with_state=True)
    w = w * 0.01
    state = (state[0], state[1], state[2] + 6)
    gy, g_state = loss_weights(rng, 2, 3, 5)
    y, new_state, grads = with_grads(lambda *a: wkv4(*a, backend=backend), w, u, k, v, state, gy, g_state)
    assert (new_state[2] > k.amax(1)).all()       # the state's max is the final max
    _, _, expected = with_grads(run_dense, w, u, k, v, state, gy, g_state)
    assert_all_close(GRAD_NAMES, grads, expected, FP32_BUDGET)


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
def test_m43_bonus_above_the_cap_with_distant_keys(rng, backend):
    """Mutant 43: u of 25 and 30 (above the torch path's BONUS_CAP, 20) and every third key 25 below the rest
    (inside KEY_RANGE, so that only the cap sends the column to the exact recurrence)."""
    w, u, k, v, state = make_inputs(rng, 2, 33, 4, with_state=True)
    u[1], u[3] = 25.0, 30.0
    k[:, ::3] -= 25.0
    check_forward(w, u, k, v, state, backend)


# ---------------------------------------------------------------------------------------- I3: negative delta

@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
def test_i3_negative_delta_is_refused(backend):
    """A negative step (delta + delta_bias < 0 without softplus) is refused, as the reference refuses it; with
    softplus every step is >= 0. Before: accepted, a growing state."""
    x = {n: torch.tensor(a, dtype=torch.float32) for n, a in inputs("selective_scan", np.random.default_rng(0)).items()}
    x["delta"][0, 1, 2] = -10.0 - x["delta_bias"][1]
    with pytest.raises(ValueError, match=r"delta must be >= 0 .*got min -10.0"):
        ssm.selective_scan(**x, backend=backend)
    ssm.selective_scan(**x, delta_softplus=True, backend=backend)


# ---------------------------------------------------------------------------------- C4, C5, C6, C14: messages

@pytest.mark.parametrize("state", [(torch.zeros(2, 2, 4, 4),), np.zeros((2, 2, 4, 4), dtype=np.float32)],
                         ids=["tuple", "numpy"])
def test_c4_wkv7_state_not_a_tensor(rng, state):
    """Before: AttributeError ('tuple' has no 'device'), and for a NumPy state a device mismatch 'cpu vs cpu'."""
    x, _ = rwkv7_case(rng)
    with pytest.raises(TypeError, match=f"state must be a torch.Tensor, got {type(state).__name__}"):
        wkv7(*map(torch.tensor, x), state=state)


@pytest.mark.parametrize("backend", BACKENDS)
def test_c5_rerope_head_dim_zero(backend):
    """Before: ZeroDivisionError (1 / sqrt(0)) on the torch backend."""
    q = torch.zeros(1, 1, 4, 0)
    with pytest.raises(ValueError, match=r"even head dim d >= 2, got q \(1, 1, 4, 0\)"):
        rerope_attention(q, q, q, 2, backend=backend)
    with pytest.raises(ValueError, match="even head dim d >= 2"):
        rerope_decode(q[:, :, :1], q, q, 2, backend=backend)


@pytest.mark.parametrize("op", names())
def test_c6_meta_tensors(op):
    """Tensors on the meta device (shapes without data): a ValueError that says so. Before: 'Tensor.item() cannot
    be called on meta tensors'."""
    x = {n: torch.tensor(a, dtype=torch.float32).to("meta") for n, a in inputs(op, np.random.default_rng(0)).items()}
    with pytest.raises(ValueError, match="meta device"):
        call_kernel(op, x, "torch")


def test_c14_scan_dtype_message():
    """Each allowed dtype named once. Before: 'torch.float32 (the inputs') or torch.float32'."""
    x = {n: torch.tensor(a, dtype=torch.float32) for n, a in inputs("selective_scan", np.random.default_rng(0)).items()}
    with pytest.raises(TypeError) as error:
        ssm.selective_scan(**{**x, "A": x["A"].double()})
    assert str(error.value).count("torch.float32") == 1 and "got torch.float64" in str(error.value)
    x16 = {n: (a if n in ("A", "D", "delta_bias", "state") else a.half()) for n, a in x.items()}
    with pytest.raises(TypeError, match=r"A must have dtype torch.float16 or torch.float32 .*got torch.float64"):
        ssm.selective_scan(**{**x16, "A": x["A"].double()})


CHUNKED_CASES = [(name, value) for name in inputs("wkv7", np.random.default_rng(0)) for value in NONFINITE]


@needs_triton
@pytest.mark.parametrize("name,value", CHUNKED_CASES, ids=["-".join(c) for c in CHUNKED_CASES])
def test_d2_chunked_wkv7_nonfinite_input_at_a_head_size_it_takes(name, value):
    """The non-finite cases above on backend="triton_chunked", which refuses their tiny head size (N = 4) and so was
    never tried there (review F1): N = 16, T = 20, the non-finite entry at step 10 of the first 16-step sub-chunk,
    so that a sub-chunk's products would carry it to steps 0-9."""
    x = inputs("wkv7", np.random.default_rng(1), T=20, N=16)
    index = tuple(s // 2 for s in x[name].shape)
    x[name][index] = NONFINITE[value]
    check_nan_placement("wkv7", x, [(name, index)], "triton_chunked")


@needs_triton
@pytest.mark.parametrize("value", ["NaN", "+inf"])
def test_f1_chunked_wkv7_nonfinite_log_decay_stays_in_its_steps(rng, value):
    """F1: a NaN or +inf log_w at step 20 of a 32-step input made the earlier steps of its 16-step chunk NaN on
    triton_chunked (its range check's max and min drop NaN, and its finiteness sum left log_w out), forward and
    backward; the step-by-step rule and every other backend keep steps 16-19 (outputs, and the gradient of r, which
    reads only the states up to its step) as without it."""
    from seqmix.kernels.inputs import rwkv7_inputs
    x, S = rwkv7_inputs(rng, 1, 32, 1, 16)
    S0 = torch.tensor(S, dtype=torch.float32)

    def run(x):
        x = [torch.tensor(a, dtype=torch.float32, requires_grad=True) for a in x]
        y = wkv7(*x, state=S0, backend="triton_chunked")[0]
        y.sum().backward()
        return y.detach(), x[0].grad

    clean_y, clean_dr = run(x)
    x[1][0, 20, 0, 3] = NONFINITE[value]
    y, dr = run(x)
    assert_close(y[:, :20], clean_y[:, :20], FP32_BUDGET, "the steps before the non-finite decay")
    assert torch.isnan(y[:, 20:]).all()
    assert_close(dr[:, :20], clean_dr[:, :20], FP32_BUDGET, "dr before the non-finite decay")


@needs_triton
def test_d2_chunked_triton_wkv7_nan_stays_in_its_steps(rng):
    """I5 on the chunked Triton form: a NaN key at step 9 of a 16-step chunk leaves steps 0-8 as without it."""
    from seqmix.kernels.inputs import rwkv7_inputs
    x, S = rwkv7_inputs(rng, 1, 20, 1, 16)
    x = [torch.tensor(a, dtype=torch.float32) for a in x]
    clean = wkv7(*x, state=torch.tensor(S, dtype=torch.float32), backend="triton", chunked=True)[0]
    x[2][0, 9, 0, 3] = float("nan")
    y = wkv7(*x, state=torch.tensor(S, dtype=torch.float32), backend="triton", chunked=True)[0]
    assert_close(y[:, :9], clean[:, :9], FP32_BUDGET, "the steps before the NaN")
    assert torch.isnan(y[:, 9:]).all()
