"""kernels/wkv4/: the chain reference (NumPy float64) -> torch backend -> Triton (interpreter on CPU) -> C loops.

Outputs and final states are checked against reference/wkv4.py; gradients against float64 autograd through
seqmix.kernels.wkv4.naive.wkv4, which writes every exponent of the definition at once (no recurrence, no chunks), each
row shifted by its own maximum. States are compared by what they represent (num e^max, den e^max): a max rounded
differently to fp32 rescales num and den without changing the sums, so they are compared after rescaling to the
reference's max, and the max itself separately.
"""
import numpy as np
import pytest
import torch

from helpers.kernel_cases import RECURRENCE_BACKENDS, needs_triton, spy
from seqmix.kernels.wkv4 import naive as definitions
from seqmix.kernels.inputs import spiky_keys, wkv4_inputs
from seqmix.kernels.wkv4.spec import WKV4
from seqmix.kernels import wkv4 as wkv4_module
from seqmix.kernels.testing import (FP16_BUDGET, FP32_BUDGET, REFERENCE_BUDGET, accumulation_dtype, assert_all_close,
                                    assert_close, f64)
from seqmix.kernels.wkv4 import INITIAL_MAX, wkv4
from seqmix.reference import wkv4 as ref

BUDGETS = {torch.float32: FP32_BUDGET, torch.float16: FP16_BUDGET}
# The gradients with_grads returns, in its order.
GRAD_NAMES = ("d/dw", "d/du", "d/dk", "d/dv", "d/dnum0", "d/dden0", "d/dmax0")


def make_inputs(rng, B, T, C, dtype=torch.float32, key_scale=1.0, decay_scale=1.0, with_state=False):
    """w, u, k, v (and a state left by a random 5-token prefix, or None) in ``dtype``: what both sides see."""
    x, state = wkv4_inputs(rng, B, T, C, key_scale=key_scale, decay_scale=decay_scale, state=with_state)
    w, u, k, v = (torch.tensor(x[n], dtype=dtype) for n in "wukv")
    if state is not None:
        state = tuple(torch.tensor(s, dtype=accumulation_dtype(dtype)) for s in state)
    return w, u, k, v, state


def run_reference(w, u, k, v, state):
    return ref.wkv4(f64(w), f64(u), f64(k), f64(v), None if state is None else [f64(s) for s in state])


def assert_state_close(state, expected, budget, what):
    """(num, den, max) against the reference's as the conformance battery compares them: the represented sums
    num e^max, den e^max, then max itself."""
    names, actual, wanted = zip(*WKV4.compare_state([f64(s) for s in state], expected))
    assert_all_close(names, actual, wanted, budget, f"{what}:")


def check_forward(w, u, k, v, state, backend, budget=FP32_BUDGET):
    """wkv4 on ``backend`` against the reference: the output and what the final state represents."""
    y, new_state = wkv4(w, u, k, v, state, backend=backend)
    y_ref, state_ref = run_reference(w, u, k, v, state)
    assert_close(y, y_ref, budget, "y")
    assert_state_close(new_state, state_ref, budget, "final state")
    return y, new_state


def with_grads(fn, w, u, k, v, state, gy, g_state):
    """fn's outputs and the gradients in (w, u, k, v, num0, den0, max0) of sum(gy y) + sum(g_state . state terms).

    g_state["weights"] weigh (num, den, max) themselves or, when g_state["invariant"], num / den and max + log den:
    what the state represents, independent of how max was rounded.
    """
    leaves = [x.detach().clone().requires_grad_() for x in (w, u, k, v, *state)]
    y, (num, den, mx) = fn(*leaves[:4], tuple(leaves[4:]))
    terms = WKV4.loss_terms((num, den, mx)) if g_state["invariant"] else (num, den, mx)
    loss = (y.double() * gy).sum() + sum((s.double() * g).sum() for s, g in zip(terms, g_state["weights"]))
    return y, (num, den, mx), torch.autograd.grad(loss, leaves)


def loss_weights(rng, B, T, C, invariant=False):
    weights = [torch.tensor(rng.normal(size=(B, C))) for _ in range(2 if invariant else 3)]
    return torch.tensor(rng.normal(size=(B, T, C))), {"invariant": invariant, "weights": weights}


def run_dense(w, u, k, v, state):
    return definitions.wkv4(*(x.double() for x in (w, u, k, v)), state=tuple(s.double() for s in state))


SHAPES = [(1, 1, 3), (2, 7, 5), (1, 16, 4), (2, 37, 6)]   # T = 1; odd; one whole chunk; chunks and a remainder


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
@pytest.mark.parametrize("B,T,C", SHAPES)
@pytest.mark.parametrize("with_state", [False, True])
def test_matches_reference(rng, backend, B, T, C, with_state):
    w, u, k, v, state = make_inputs(rng, B, T, C, with_state=with_state)
    y, new_state = wkv4(w, u, k, v, state, backend=backend)
    y_ref, state_ref = run_reference(w, u, k, v, state)
    assert y.dtype == torch.float32 and all(s.dtype == torch.float32 and s.shape == (B, C) for s in new_state)
    assert_close(y, y_ref, FP32_BUDGET, "y")
    assert_state_close(new_state, state_ref, FP32_BUDGET, "final state")


@pytest.mark.parametrize("key_scale", [1.0, 300.0])
def test_dense_matches_reference(rng, key_scale):
    """The gradients' yardstick agrees with the reference first."""
    w, u, k, v, state = make_inputs(rng, 2, 23, 4, dtype=torch.float64, key_scale=key_scale, with_state=True)
    y, (num, den, mx) = run_dense(w, u, k, v, state)
    y_ref, state_ref = run_reference(w, u, k, v, state)
    assert_close(y, y_ref, REFERENCE_BUDGET, "y")
    assert_all_close(("num", "den", "max"), (num, den, mx), state_ref, REFERENCE_BUDGET)


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
@pytest.mark.parametrize("B,T,C,dtype", [(1, 1, 3, torch.float32), (2, 37, 6, torch.float32),
                                         (2, 21, 5, torch.float16)])
def test_gradients(rng, backend, B, T, C, dtype):
    """All seven gradients of a loss on y and on each of num, den, max against float64 autograd of the definition."""
    w, u, k, v, state = make_inputs(rng, B, T, C, dtype=dtype, with_state=True)
    gy, g_state = loss_weights(rng, B, T, C)
    y, new_state, grads = with_grads(lambda *a: wkv4(*a, backend=backend), w, u, k, v, state, gy, g_state)
    _, _, expected = with_grads(run_dense, w, u, k, v, state, gy, g_state)
    assert y.dtype == dtype and all(g.dtype == x.dtype for g, x in zip(grads, (w, u, k, v, *state)))
    assert_all_close(GRAD_NAMES, grads, expected, BUDGETS[dtype])


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
@pytest.mark.parametrize("keys", ["uniform +-300", "250 + uniform +-1", "spikes of +-300"])
def test_large_keys(rng, backend, keys):
    """Keys of several hundred: e^k overflows fp32 (and the plain sums overflow float64), the stable forms stay
    exact. Around 250 fp32 keeps about 2e-5 of absolute precision, so exponents must be formed as differences.
    Left out: d/dmax0. The initial state (max ~1) is swamped by these keys, so y hardly depends on its scale and that
    gradient is ~e^-200, formed as num0 g_num0 + den0 g_den0 from O(1) terms that cancel (fp32 leaves ~1e-8)."""
    B, T, C = 2, 40, 6
    w, u, _, v, state = make_inputs(rng, B, T, C, with_state=True)
    k = {"uniform +-300": lambda: rng.uniform(-300, 300, size=(B, T, C)),
         "250 + uniform +-1": lambda: 250 + rng.uniform(-1, 1, size=(B, T, C)),
         "spikes of +-300": lambda: spiky_keys(rng, (B, T, C))}[keys]()
    k = torch.tensor(k, dtype=torch.float32)
    y, new_state = wkv4(w, u, k, v, state, backend=backend)
    y_ref, state_ref = run_reference(w, u, k, v, state)
    assert_close(y, y_ref, FP32_BUDGET, "y")
    assert_state_close(new_state, state_ref, FP32_BUDGET, "final state")
    gy, g_state = loss_weights(rng, B, T, C, invariant=True)
    _, _, grads = with_grads(lambda *a: wkv4(*a, backend=backend), w, u, k, v, state, gy, g_state)
    _, _, expected = with_grads(run_dense, w, u, k, v, state, gy, g_state)
    assert_all_close(GRAD_NAMES[:6], grads[:6], expected[:6], FP32_BUDGET)   # all but d/dmax0


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
@pytest.mark.parametrize("decays", ["steep", "near 1"])
def test_extreme_decays(rng, backend, decays):
    """Steep: |w| spread as e^(2 N(0, 1) - 0.5) (0.01 to 13 with the tests' seed) and one channel at -1e4 (a decay of
    0 per step, spans far below e^-3000 over a chunk). Near 1: |w| of about 1e-6, so that nothing fades within the
    sequence."""
    w, u, k, v, state = make_inputs(rng, 2, 35, 7, decay_scale=2.0, with_state=True)
    w = torch.cat([w[:-1], torch.tensor([-1e4])]) if decays == "steep" else w * 1e-6 / w.abs().mean()
    check_forward(w, u, k, v, state, backend)


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
def test_split_equals_whole(rng, backend):
    """Fed in pieces with the returned state (random cut points) = fed whole = the reference."""
    B, T, C = 2, 39, 5
    w, u, k, v, state = make_inputs(rng, B, T, C, with_state=True)
    cuts = np.sort(rng.choice(np.arange(1, T), size=3, replace=False))
    ys, carried = [], state
    for piece in np.split(np.arange(T), cuts):
        y, carried = wkv4(w, u, k[:, piece], v[:, piece], carried, backend=backend)
        ys.append(y)
    y_ref, state_ref = run_reference(w, u, k, v, state)
    assert_close(torch.cat(ys, 1), y_ref, FP32_BUDGET, "y from pieces")
    assert_state_close(carried, state_ref, FP32_BUDGET, "state after the pieces")


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
def test_state_is_hugging_faces(rng, backend):
    """Our state, handed to reference/wkv4.py (HF's layout and meaning), continues the sequence there."""
    B, T, C, cut = 2, 30, 4, 17
    w, u, k, v, _ = make_inputs(rng, B, T, C)
    _, state = wkv4(w, u, k[:, :cut], v[:, :cut], backend=backend)
    y_rest, _ = ref.wkv4(f64(w), f64(u), f64(k[:, cut:]), f64(v[:, cut:]), [f64(s) for s in state])
    assert_close(y_rest, run_reference(w, u, k, v, None)[0][:, cut:], FP32_BUDGET, "continued in the reference")


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
def test_fp16(rng, backend):
    w, u, k, v, state = make_inputs(rng, 2, 21, 5, dtype=torch.float16, with_state=True)
    y, new_state = wkv4(w, u, k, v, state, backend=backend)
    assert y.dtype == torch.float16 and all(s.dtype == torch.float32 for s in new_state)
    y_ref, state_ref = run_reference(w, u, k, v, state)
    assert_close(y, y_ref, FP16_BUDGET, "y")
    assert_state_close(new_state, state_ref, FP16_BUDGET, "final state")


def test_float64_torch(rng):
    w, u, k, v, state = make_inputs(rng, 2, 37, 5, dtype=torch.float64, with_state=True)
    y, new_state = wkv4(w, u, k, v, state, backend="torch")
    assert y.dtype == torch.float64 and all(s.dtype == torch.float64 for s in new_state)
    y_ref, state_ref = run_reference(w, u, k, v, state)
    assert_close(y, y_ref, REFERENCE_BUDGET, "y")
    assert_state_close(new_state, state_ref, REFERENCE_BUDGET, "final state")


@pytest.mark.parametrize("redone,key_scale,steep_w", [(False, 1.0, None), (True, 100.0, None), (False, 1.0, -5.0)],
                         ids=["in-chunk recurrence", "columns", "in-chunk recurrence, steep"])
def test_gradcheck_torch(rng, monkeypatch, redone, key_scale, steep_w):
    """torch.autograd.gradcheck in float64 through each way the torch backend computes rows: the in-chunk
    recurrence (with moderate and with steep decays), and (batch, chunk, channel) columns redone token by token
    for their key spread."""
    redone_rows = spy(monkeypatch, wkv4_module, "_stable_steps")
    w, u, k, v, state = make_inputs(rng, 2, 18, 2, dtype=torch.float64, key_scale=key_scale, decay_scale=0.3,
                                    with_state=True)   # one chunk and a remainder
    if steep_w is not None:
        w[0] = steep_w

    def op(w, u, k, v, num, den, mx):
        y, new_state = wkv4(w, u, k, v, (num, den, mx), backend="torch")
        return y, *new_state

    assert torch.autograd.gradcheck(op, [x.requires_grad_() for x in (w, u, k, v, *state)], fast_mode=True)
    assert bool(redone_rows) == redone


def test_long_sequence_torch(rng, monkeypatch):
    """Several blocks of chunks, a shorter last chunk, a steep channel and spiky keys, against the reference and
    float64 autograd."""
    redone_rows = spy(monkeypatch, wkv4_module, "_stable_steps")
    B, T, C = 1, 2 * wkv4_module.BLOCK + wkv4_module.CHUNK + 5, 4
    w, u, _, v, state = make_inputs(rng, B, T, C, decay_scale=0.3, with_state=True)
    w[0] = -5.0
    k = torch.tensor(spiky_keys(rng, (B, T, C)), dtype=torch.float32)
    y, new_state = wkv4(w, u, k, v, state, backend="torch")
    y_ref, state_ref = run_reference(w, u, k, v, state)
    assert_close(y, y_ref, FP32_BUDGET, "y")
    assert_state_close(new_state, state_ref, FP32_BUDGET, "final state")
    gy, g_state = loss_weights(rng, B, T, C, invariant=True)
    _, _, grads = with_grads(lambda *a: wkv4(*a, backend="torch"), w, u, k, v, state, gy, g_state)
    _, _, expected = with_grads(run_dense, w, u, k, v, state, gy, g_state)
    assert_all_close(GRAD_NAMES, grads, expected, FP32_BUDGET)
    assert redone_rows


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
def test_empty_sequence(rng, backend):
    w, u, k, v, state = make_inputs(rng, 2, 0, 3, with_state=True)
    y, new_state = wkv4(w, u, k, v, state, backend=backend)
    assert y.shape == (2, 0, 3) and all(torch.equal(a, b) for a, b in zip(new_state, state))
    _, (num, den, mx) = wkv4(w, u, k, v, backend=backend)
    assert not num.any() and not den.any() and (mx == INITIAL_MAX).all()


def with_entry(x, index, value):
    x = x.clone()
    x[index] = value
    return x


BAD_INPUTS = {   # what changes in the arguments -> the error and what its message must say
    "k not 3-D": (lambda a: dict(k=a["k"][0]), ValueError, r"k must have shape \(\*, \*, \*\), got \(5, 3\)"),
    "v shape": (lambda a: dict(v=a["v"][:, :4]), ValueError, r"v must have shape \(2, 5, 3\), got \(2, 4, 3\)"),
    "w shape": (lambda a: dict(w=a["w"][:2]), ValueError, r"w must have shape \(3\), got \(2,\)"),
    "u shape": (lambda a: dict(u=a["u"][None]), ValueError, r"u must have shape \(3\), got \(1, 3\)"),
    "integer k": (lambda a: dict(k=a["k"].long()), TypeError, "k must have dtype in"),
    "mixed dtypes": (lambda a: dict(v=a["v"].half()), TypeError, "inputs must share one dtype.*v: torch.float16"),
    "positive w": (lambda a: dict(w=with_entry(a["w"], 1, 0.5)), ValueError, "w is the per-step log decay.*max 0.5"),
    "NaN w": (lambda a: dict(w=with_entry(a["w"], 0, float("nan"))), ValueError, "w is the per-step log.*1 NaN"),
    "state of two": (lambda a: dict(state=a["state"][:2]), ValueError, "state must be a tuple"),
    "state shape": (lambda a: dict(state=(a["state"][0][:1], *a["state"][1:])), ValueError,
                    r"state\[0\] \(num\) must have shape \(2, 3\)"),
    "state dtype": (lambda a: dict(state=(a["state"][0], a["state"][1].half(), a["state"][2])), TypeError,
                    r"state\[1\] \(den\) must have dtype"),
    "mixed devices": (lambda a: dict(v=a["v"].to("meta")), ValueError, "one device.*v: meta"),
    "unknown backend": (lambda a: dict(backend="cuda"), ValueError, "backend must be one of"),
    "float64 on Triton": pytest.param(
        lambda a: dict(**{n: a[n].double() for n in "wukv"}, state=None, backend="triton"), TypeError,
        "backend='triton' takes dtypes", marks=needs_triton),
}


@pytest.mark.parametrize("change,error,message", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input(rng, change, error, message):
    w, u, k, v, state = make_inputs(rng, 2, 5, 3, with_state=True)
    args = dict(w=w, u=u, k=k, v=v, state=state, backend="torch")
    with pytest.raises(error, match=message):
        wkv4(**(args | change(args)))
