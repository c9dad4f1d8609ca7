"""kernels/ssm/: the chain reference (NumPy float64) -> torch backend -> Triton (interpreter on CPU) -> C loops, on
outputs, final states and the gradients of every input. Gradients are checked against torch autograd through the
plain per-token loop of seqmix.kernels.ssm.naive (float64), which shares no code with any backend."""
import pytest
import torch

from helpers.kernel_cases import RECURRENCE_BACKENDS, needs_triton, spy
from seqmix.kernels.inputs import scan_inputs as make_inputs
from seqmix.kernels.ssm.naive import selective_scan as loop_scan
from seqmix.kernels import ssm
from seqmix.kernels.testing import (FP16_BUDGET, FP32_BUDGET, REFERENCE_BUDGET, accumulation_dtype, assert_all_close,
                                    assert_close)
from seqmix.reference import ssm as ref

TENSORS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "state")


def dtypes_for(names, dtype, param_dtype=None):
    """The dtype of each input: dtype for the sequence tensors, param_dtype (default dtype) for A, D and delta_bias,
    fp32 for the state (float64 with float64 inputs)."""
    state_dtype = accumulation_dtype(dtype)
    params = ("A", "D", "delta_bias")
    return {k: state_dtype if k == "state" else (param_dtype or dtype) if k in params else dtype for k in names}


def run(fn, inputs, softplus, cotangents, dtypes=None, **kw):
    """Outputs and gradients (of sum(y * gy) + sum(last * gl)) of fn, on the inputs cast to dtypes (default float64)."""
    dtypes = dtypes or dtypes_for(inputs, torch.float64)
    args = {k: torch.tensor(v, dtype=dtypes[k], requires_grad=True) for k, v in inputs.items()}
    y, last = fn(**args, delta_softplus=softplus, **kw)
    gy, gl = cotangents
    loss = (y.double() * gy).sum() + (last.double() * gl).sum()
    grads = torch.autograd.grad(loss, list(args.values()))
    return y, last, dict(zip(args, grads))


def truth(inputs, softplus, cotangents, dtypes=None):
    """The reference's outputs (NumPy, float64) and the loop's gradients (float64), from the inputs as rounded to
    dtypes (default: not rounded)."""
    dtypes = dtypes or dtypes_for(inputs, torch.float64)
    rounded = {k: torch.tensor(v, dtype=dtypes[k]).double().numpy() for k, v in inputs.items()}
    y, last = ref.selective_scan(**rounded, delta_softplus=softplus)
    _, _, grads = run(loop_scan, rounded, softplus, cotangents)
    return y, last, grads


def cotangents_for(rng, inputs):
    batch, dim, T = inputs["u"].shape
    N = inputs["A"].shape[1]
    return torch.tensor(rng.standard_normal((batch, dim, T))), torch.tensor(rng.standard_normal((batch, dim, N)))


def check_against_truth(inputs, softplus, cotangents, budget, backend, dtype=torch.float64, param_dtype=None):
    """The backend at dtype against the truth from the same rounded inputs: outputs, state, every gradient. The
    output's cotangent reaches the kernel rounded to the output dtype, so the truth gets it rounded the same way."""
    dtypes = dtypes_for(inputs, dtype, param_dtype)
    gy, gl = cotangents
    cotangents = gy.to(dtype).double(), gl.to(dtypes_for(["state"], dtype)["state"]).double()
    y_ref, last_ref, grads_ref = truth(inputs, softplus, cotangents, dtypes)
    y, last, grads = run(ssm.selective_scan, inputs, softplus, cotangents, dtypes, backend=backend)
    assert y.dtype == dtype
    assert last.dtype == dtypes_for(["state"], dtype)["state"]
    assert_close(y, y_ref, budget, "y")
    assert_close(last, last_ref, budget, "last state")
    assert_all_close([f"d{name}" for name in grads], grads.values(), [grads_ref[name] for name in grads], budget)


@pytest.fixture
def chunks_per_block(monkeypatch):
    """chunks_per_block(k, batch, dim, N): the torch backend then makes blocks of k chunks of CHUNK tokens, so
    that a short sequence crosses both chunk and block boundaries (by default it fits one block)."""
    def set_chunks(k, batch, dim, N):
        monkeypatch.setattr(ssm, "BLOCK_ELEMENTS", k * ssm.CHUNK * batch * dim * N)
    return set_chunks


# The shapes the interpreter also runs (small: it is slow). "awkward": two blocks of channels with the second
# partly masked (BLOCK_D = 16), N = 5 (padded to 8), T = 21 (Triton chunks of 8: 8 + 8 + 5; torch: 16 + 5 padded).
CASES = {
    "T1": dict(batch=1, dim=3, N=16, T=1, extras=("D", "z")),
    "plain": dict(batch=1, dim=4, N=16, T=19),
    "awkward": dict(batch=2, dim=18, N=5, T=21, extras=("D", "z", "delta_bias", "state"), softplus=True),
    "large_delta": dict(batch=1, dim=4, N=16, T=13, extras=("delta_bias",), softplus=True, delta_scale=50.0),
}
# torch backend only: 5 chunks, in blocks of 2 + 2 + 1 chunks (the last one partly padding)
LONG = dict(batch=2, dim=3, N=4, T=75, extras=("D", "z", "delta_bias", "state"), softplus=True)


def case_inputs(rng, case, cases=CASES):
    c = dict(LONG if case == "long" else cases[case])
    softplus = c.pop("softplus", False)
    return make_inputs(rng, **c), softplus


def test_loop_scan_matches_reference(rng):
    """The gradient oracle computes the same function as the reference."""
    inputs, softplus = case_inputs(rng, "awkward")
    y_loop, last_loop = loop_scan(**{k: torch.tensor(v) for k, v in inputs.items()}, delta_softplus=softplus)
    y_ref, last_ref = ref.selective_scan(**inputs, delta_softplus=softplus)
    assert_close(y_loop, y_ref, REFERENCE_BUDGET, "y")
    assert_close(last_loop, last_ref, REFERENCE_BUDGET, "last state")


@pytest.mark.parametrize("case", list(CASES) + ["long"])
def test_torch_backend_float64(rng, chunks_per_block, case):
    inputs, softplus = case_inputs(rng, case)
    batch, dim, _ = inputs["u"].shape
    chunks_per_block(2, batch, dim, inputs["A"].shape[1])
    cot = cotangents_for(rng, inputs)
    check_against_truth(inputs, softplus, cot, REFERENCE_BUDGET, "torch")


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_fp32(rng, backend, case):
    inputs, softplus = case_inputs(rng, case)
    cot = cotangents_for(rng, inputs)
    check_against_truth(inputs, softplus, cot, FP32_BUDGET, backend, torch.float32)


@needs_triton
@pytest.mark.parametrize("sms, block_d", [(132, 4), (1, 16)])
def test_triton_forward_splits_channels_by_the_grid(rng, monkeypatch, sms, block_d):
    """The forward's channels per program follow batch * D: at a small grid 4 (two blocks and a masked third at
    D = 9), on a GPU of one SM the backward's 16; the results are the same at each (the backward keeps 16)."""
    split = ssm.rows_per_program
    monkeypatch.setattr(ssm, "rows_per_program", lambda *args: split(*args, sms=sms))
    configs = spy(monkeypatch, ssm, "_launch_config")
    inputs = make_inputs(rng, batch=2, dim=9, N=5, T=11, extras=("D", "delta_bias", "state"))
    check_against_truth(inputs, True, cotangents_for(rng, inputs), FP32_BUDGET, "triton", torch.float32)
    assert [c["BLOCK_D"] for c in configs] == [block_d, 16]


@pytest.mark.parametrize("backend, dtype", [("torch", torch.float16), ("torch", torch.bfloat16),
                                            pytest.param("triton", torch.float16, marks=needs_triton),
                                            ("c", torch.float16), ("c", torch.bfloat16)])
def test_half_precision(rng, backend, dtype):
    """fp16/bf16 sequence inputs with fp32 parameters (A, D, delta_bias), as Mamba keeps them; the truth is computed
    from the same rounded inputs, so the budget measures the kernel, not the rounding of its inputs."""
    inputs, softplus = case_inputs(rng, "awkward")
    cot = cotangents_for(rng, inputs)
    check_against_truth(inputs, softplus, cot, FP16_BUDGET, backend, dtype, param_dtype=torch.float32)


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
def test_split_sequence_equals_whole(rng, chunks_per_block, backend):
    """Outputs, final state and every gradient (through the state passed between the pieces) as for the whole."""
    inputs = make_inputs(rng, 2, 3, 16, 13, extras=("D", "z", "delta_bias", "state"))
    chunks_per_block(1, 2, 3, 16)
    per_token = ("u", "delta", "B", "C", "z")
    args = {k: torch.tensor(v, dtype=torch.float32, requires_grad=True) for k, v in inputs.items()}
    gy, gl = (g.float() for g in cotangents_for(rng, inputs))
    y, last = ssm.selective_scan(**args, delta_softplus=True, backend=backend)
    grads = torch.autograd.grad((y * gy).sum() + (last * gl).sum(), list(args.values()))
    state, pieces = args["state"], []
    for sl in (slice(0, 1), slice(1, 9), slice(9, 13)):
        piece = {k: (v[..., sl] if k in per_token else v) for k, v in args.items() if k != "state"}
        y_piece, state = ssm.selective_scan(**piece, state=state, delta_softplus=True, backend=backend)
        pieces.append(y_piece)
    y_split = torch.cat(pieces, dim=-1)
    assert_close(y_split, y, FP32_BUDGET, "split outputs")
    assert_close(state, last, FP32_BUDGET, "split state")
    grads_split = torch.autograd.grad((y_split * gy).sum() + (state * gl).sum(), list(args.values()))
    assert_all_close([f"d{name}" for name in args], grads_split, grads, FP32_BUDGET, "split")


def test_gradcheck_torch_backend(rng, chunks_per_block):
    """Finite differences in float64, every option on, over 3 chunks in blocks of 2 + 1."""
    inputs = make_inputs(rng, 1, 2, 3, 35, extras=("D", "z", "delta_bias", "state"))
    chunks_per_block(2, 1, 2, 3)
    args = tuple(torch.tensor(inputs[k], requires_grad=True) for k in TENSORS)

    def fn(*tensors):
        return ssm.selective_scan(**dict(zip(TENSORS, tensors)), delta_softplus=True, backend="torch")

    assert torch.autograd.gradcheck(fn, args)


def test_large_delta_forgets_the_past(rng):
    """delta in [30, 60] (after softplus) and A <= -2: exp(delta A) <= e^-60 underflows the past away and the state
    is the last input alone, delta B u: no overflow, no NaN, on the torch backend at full block size."""
    inputs = make_inputs(rng, 1, 8, 16, 300)
    inputs["delta"] = rng.uniform(30.0, 60.0, inputs["u"].shape)
    inputs["A"] = -rng.uniform(2.0, 16.0, inputs["A"].shape)
    args = {k: torch.tensor(v, dtype=torch.float32) for k, v in inputs.items()}
    _, last = ssm.selective_scan(**args, delta_softplus=True, backend="torch")
    step = torch.nn.functional.softplus(args["delta"][..., -1])
    assert_close(last, step[..., None] * args["B"][:, None, :, -1] * args["u"][..., -1, None], FP32_BUDGET, "state")


def good_args():
    return dict(u=torch.ones(1, 2, 3), delta=torch.ones(1, 2, 3), A=-torch.ones(2, 4), B=torch.ones(1, 4, 3),
                C=torch.ones(1, 4, 3))


@pytest.mark.parametrize("change, error, match", [
    (dict(u=torch.ones(2, 3)), ValueError, r"u must have shape \(\*, \*, \*\)"),
    (dict(u=torch.ones(1, 2, 0), delta=torch.ones(1, 2, 0), B=torch.ones(1, 4, 0), C=torch.ones(1, 4, 0)),
     ValueError, "every size >= 1"),
    (dict(delta=torch.ones(1, 2, 4)), ValueError, r"delta must have shape \(1, 2, 3\)"),
    (dict(A=-torch.ones(3, 4)), ValueError, r"A must have shape \(2, \*\)"),
    (dict(B=torch.ones(1, 5, 3)), ValueError, r"B must have shape \(1, 4, 3\)"),
    (dict(C=torch.ones(1, 4)), ValueError, r"C must have shape \(1, 4, 3\)"),
    (dict(D=torch.ones(3)), ValueError, r"D must have shape \(2\)"),
    (dict(z=torch.ones(1, 3, 3)), ValueError, r"z must have shape \(1, 2, 3\)"),
    (dict(delta_bias=torch.ones(2, 1)), ValueError, r"delta_bias must have shape \(2\)"),
    (dict(state=torch.ones(1, 2, 3)), ValueError, r"state must have shape \(1, 2, 4\)"),
    (dict(u=[[[1.0]]]), TypeError, "u must be a torch.Tensor"),
    (dict(u=torch.ones(1, 2, 3, dtype=torch.int32)), TypeError, "u must have dtype in"),
    (dict(B=torch.ones(1, 4, 3, dtype=torch.float16)), TypeError, "inputs must share one dtype"),
    (dict(A=-torch.ones(2, 4, dtype=torch.float64)), TypeError, r"A must have dtype torch.float32 \(the inputs"),
    (dict(state=torch.ones(1, 2, 4, dtype=torch.float64)), TypeError, "state must have dtype torch.float32"),
    (dict(C=torch.ones(1, 4, 3, device="meta")), ValueError, "inputs must be on one device"),
    (dict(delta_softplus=1), TypeError, "delta_softplus must be a bool"),
    (dict(backend="cuda"), ValueError, "backend must be one of"),
])
def test_bad_input(change, error, match):
    with pytest.raises(error, match=match):
        ssm.selective_scan(**{**good_args(), **change})


@needs_triton
def test_triton_rejects_float64():
    args = {k: v.double() for k, v in good_args().items()}
    with pytest.raises(TypeError, match="backend='triton' takes dtypes"):
        ssm.selective_scan(**args, backend="triton")
