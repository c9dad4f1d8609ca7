"""kernels/native.c (backend="c"): the C loops against the float64 references, on outputs and final states (they
have no backward), over the chain's awkward cases: T = 1, odd sizes, initial states, sequences fed in pieces,
extreme inputs, fp16 and bf16 inputs, work split over threads; and how backend=None chooses them."""
import multiprocessing
import os

import numpy as np
import pytest
import torch
from torch.utils._pytree import tree_leaves

from seqmix.conformance.cases import in_pieces, rwkv7_inputs, scan_inputs, split_bounds
from seqmix.kernels import native, ssm
from seqmix.kernels.attention import attention
from seqmix.kernels.testing import FP16_BUDGET, FP32_BUDGET, assert_close, fp32
from seqmix.kernels.wkv4 import wkv4
from seqmix.kernels.wkv7 import wkv7
from seqmix.reference import ssm as ssm_ref
from seqmix.reference.wkv7 import wkv7 as reference_wkv7
from test_kernels_ssm import CASES as SCAN_CASES, case_inputs, dtypes_for
from test_kernels_wkv4 import assert_state_close, make_inputs as wkv4_inputs, run_reference as wkv4_reference

# bf16, which the C loops take on a CPU (the Triton interpreter cannot): its outputs are rounded to 8 bits, an RMS
# error of 1e-3 to 2e-3 (1.7e-3 measured on WKV-4), within the half-precision budget; the reference sees the same
# rounded inputs.
BUDGETS = {torch.float32: FP32_BUDGET, torch.float16: FP16_BUDGET, torch.bfloat16: FP16_BUDGET}
DTYPES = list(BUDGETS)


def test_the_c_loops_build_here():
    """Every machine that runs these tests has a C compiler (CI installs none and needs none): the tests below skip
    nothing."""
    assert native.unavailable_reason() == ""


def test_exp_is_within_one_ulp():
    """The one approximation in the loops: e^x by range reduction and a degree-7 polynomial, against float64 over its
    whole range, at every 1/64 and at random points; and the clamp outside [-87, 88]."""
    x = torch.cat([torch.arange(-87 * 64, 88 * 64 + 1) / 64.0, torch.empty(100_000).uniform_(-87.0, 88.0)])
    got, want = native.exp(x).double(), torch.exp(x.double())
    ulp = (torch.nextafter(want.float(), torch.tensor(float("inf"))) - want.float()).double()
    assert ((got - want).abs() / ulp).max() <= 1.0
    assert torch.equal(native.exp(torch.tensor([-1e4, 1e4])), native.exp(torch.tensor([-87.0, 88.0])))


def test_softplus_is_within_four_ulp():
    """The scan's softplus, log1p(e^-|x|) by the atanh series (3.1 ulp measured; torch's fp32 softplus: 1.5), against
    float64; below x = -87, where softplus(x) ~ e^x is denormal, its e^x is clamped: off by at most e^-87."""
    x = torch.cat([torch.arange(-100 * 64, 100 * 64 + 1) / 64.0, 5 * torch.randn(100_000)])
    got, want = native.softplus(x).double(), torch.nn.functional.softplus(x.double(), threshold=1e9)
    ulp = (torch.nextafter(want.float(), torch.tensor(float("inf"))) - want.float()).double()
    normal = x > -87
    assert ((got - want).abs() / ulp)[normal].max() <= 4.0
    assert (got - want)[~normal].abs().max() <= np.exp(-87.0)


@pytest.fixture(params=[1, 3], ids=lambda n: f"{n} threads")
def threads(request, monkeypatch):
    """Each op test with one thread and with three, and no minimum of work per call, so that the work items are split
    into ranges (and WKV-4's channels into blocks) even at these sizes."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    monkeypatch.setattr(native, "SERIAL_WORK", 0)
    yield request.param
    torch.set_num_threads(before)


# ------------------------------------------------------------------------------------------------------ WKV-4

@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize("B,T,C", [(1, 1, 3), (2, 7, 5), (1, 37, 40), (3, 16, 33)])   # 40, 33: partial blocks
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_wkv4(rng, B, T, C, with_state, dtype):
    w, u, k, v, state = wkv4_inputs(rng, B, T, C, dtype=dtype, with_state=with_state)
    y, new_state = wkv4(w, u, k, v, state, backend="c")
    y_ref, state_ref = wkv4_reference(w, u, k, v, state)
    assert y.dtype == dtype and all(s.dtype == torch.float32 and s.shape == (B, C) for s in new_state)
    assert_close(y, y_ref, BUDGETS[dtype], "y")
    assert_state_close(new_state, state_ref, BUDGETS[dtype], "final state")


@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize("extreme", ["keys +-300", "keys 250 +-1", "steep decays and a decay of 0", "decays near 1"])
def test_wkv4_extreme_inputs(rng, extreme):
    B, T, C = 2, 45, 7
    w, u, k, v, state = wkv4_inputs(rng, B, T, C, decay_scale=2.0, with_state=True)
    if extreme == "keys +-300":
        k = torch.tensor(rng.uniform(-300, 300, (B, T, C)), dtype=torch.float32)
    elif extreme == "keys 250 +-1":
        k = 250 + k
    elif extreme == "decays near 1":
        w = w * 1e-6 / w.abs().mean()
    else:
        w = torch.cat([w[:-1] * 50, torch.tensor([-1e4])])
    y, new_state = wkv4(w, u, k, v, state, backend="c")
    y_ref, state_ref = wkv4_reference(w, u, k, v, state)
    assert_close(y, y_ref, FP32_BUDGET, "y")
    assert_state_close(new_state, state_ref, FP32_BUDGET, "final state")


@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize("B,T,C", [(2, 0, 3), (0, 4, 3), (2, 4, 0)])
def test_wkv4_empty(rng, B, T, C):
    w, u, k, v, state = wkv4_inputs(rng, B, T, C, with_state=True)
    y, new_state = wkv4(w, u, k, v, state, backend="c")
    assert y.shape == (B, T, C) and all(torch.equal(a, b) for a, b in zip(new_state, state))


@pytest.mark.usefixtures("threads")
def test_wkv4_split_equals_whole(rng):
    B, T, C = 2, 39, 5
    w, u, k, v, state = wkv4_inputs(rng, B, T, C, with_state=True)
    bounds = split_bounds(T, rng.uniform(size=3))
    ys, carried = in_pieces(lambda lo, hi, s: wkv4(w, u, k[:, lo:hi], v[:, lo:hi], s, backend="c"), bounds, state)
    y_ref, state_ref = wkv4_reference(w, u, k, v, state)
    assert_close(torch.cat(ys, 1), y_ref, FP32_BUDGET, f"y from pieces {bounds}")
    assert_state_close(carried, state_ref, FP32_BUDGET, f"state after pieces {bounds}")


# ------------------------------------------------------------------------------------------------------ WKV-7

@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize("shape, decay, with_state", [
    ((1, 1, 1, 16), "strong", False),        # T = 1
    ((2, 37, 3, 16), "mixed", True),         # batch > 1, odd T
    ((1, 33, 2, 64), "strong", True),        # head size 64, decays near 0.545
    ((3, 16, 1, 5), "weak", False),          # odd head size (the C loop takes any), decays near 1
    ((1, 40, 2, 8), "extreme", True),        # log decays down to -1e4
    ((1, 20, 1, 7), "growing", True),        # log_w > 0: the formula is defined for any real decay
])
@pytest.mark.parametrize("dtype", DTYPES)
def test_wkv7(rng, shape, decay, with_state, dtype):
    x_np, S0_np = rwkv7_inputs(rng, *shape, decay, state=with_state)
    x = [torch.tensor(z).to(dtype) for z in x_np]
    S0 = None if S0_np is None else torch.tensor(S0_np, dtype=torch.float32)
    y, S = wkv7(*x, state=S0, backend="c")
    y_ref, S_ref = reference_wkv7(*(z.double().numpy() for z in x), None if S0 is None else S0.double().numpy())
    assert y.dtype == dtype and S.dtype == torch.float32
    assert_close(y, y_ref, BUDGETS[dtype], "y")
    assert_close(S, S_ref, BUDGETS[dtype], "final state")


@pytest.mark.usefixtures("threads")
def test_wkv7_split_equals_whole(rng):
    T = 41
    x_np, S0_np = rwkv7_inputs(rng, 2, T, 2, 16)
    x, (S0,) = fp32(*x_np), fp32(S0_np)
    y_whole, S_whole = wkv7(*x, state=S0, backend="c")
    ys, S = in_pieces(lambda lo, hi, s: wkv7(*(z[:, lo:hi] for z in x), state=s, backend="c"),
                      split_bounds(T, rng.uniform(size=3)), S0)
    # the same loop over the same numbers: pieces and whole agree exactly
    assert torch.equal(torch.cat(ys, 1), y_whole) and torch.equal(S, S_whole)


# ------------------------------------------------------------------------------------------------ selective scan

# the Triton tests' cases, and an odd state size (the C loop takes any N)
C_SCAN_CASES = {**SCAN_CASES, "N=7": dict(batch=2, dim=5, N=7, T=23, extras=("D", "z", "state"))}


@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize("case", C_SCAN_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_selective_scan(rng, case, dtype):
    inputs, softplus = case_inputs(rng, case, C_SCAN_CASES)
    # u, delta, B, C, z in the op's dtype; A, D, delta_bias fp32 (as Mamba keeps them); the state fp32
    dtypes = dtypes_for(inputs, dtype, torch.float32)
    x = {k: torch.tensor(a, dtype=dtypes[k]) for k, a in inputs.items()}
    y, last = ssm.selective_scan(**x, delta_softplus=softplus, backend="c")
    y_ref, last_ref = ssm_ref.selective_scan(**{k: t.double().numpy() for k, t in x.items()}, delta_softplus=softplus)
    assert y.dtype == dtype and last.dtype == torch.float32
    assert_close(y, y_ref, BUDGETS[dtype], "y")
    assert_close(last, last_ref, BUDGETS[dtype], "last state")


@pytest.mark.usefixtures("threads")
def test_selective_scan_split_equals_whole(rng):
    inputs = {k: torch.tensor(a, dtype=torch.float32)
              for k, a in scan_inputs(rng, 2, 6, 4, 30, extras=("D", "z", "delta_bias", "state")).items()}
    y_whole, last_whole = ssm.selective_scan(**inputs, delta_softplus=True, backend="c")

    def piece(lo, hi, state):
        sliced = {k: a[..., lo:hi] if k in ("u", "delta", "B", "C", "z") else a for k, a in inputs.items()}
        return ssm.selective_scan(**sliced | {"state": state}, delta_softplus=True, backend="c")

    ys, state = in_pieces(piece, split_bounds(30, rng.uniform(size=3)), inputs["state"])
    # the same loop over the same numbers: pieces and whole agree exactly
    assert torch.equal(torch.cat(ys, -1), y_whole) and torch.equal(state, last_whole)


# ------------------------------------------------------------------------------------------- every op, the choice

def small_calls(rng):
    """One small call of each op with the C loops, as (name, fn(backend, grad) -> outputs)."""
    w, u, k, v, _ = wkv4_inputs(rng, 1, 9, 3)
    x7 = fp32(*rwkv7_inputs(rng, 1, 5, 2, 4)[0])
    xs = {k: torch.tensor(a, dtype=torch.float32) for k, a in scan_inputs(rng, 1, 3, 4, 6, extras=("D",)).items()}

    def leaves(tensors, grad):
        return [t.detach().clone().requires_grad_(grad) for t in tensors]

    return [
        ("wkv4", lambda backend, grad: wkv4(*leaves((w, u, k, v), grad), backend=backend)),
        ("wkv7", lambda backend, grad: wkv7(*leaves(x7, grad), backend=backend)),
        ("selective_scan", lambda backend, grad: ssm.selective_scan(**dict(zip(xs, leaves(xs.values(), grad))),
                                                                     backend=backend)),
    ]


@pytest.mark.usefixtures("threads")
def test_default_backend_on_cpu(rng):
    """None takes the C loops when no gradient is wanted, the torch backend when one is."""
    for name, call in small_calls(rng):
        for got, want in zip(tree_leaves(call(None, False)), tree_leaves(call("c", False))):
            assert torch.equal(got, want), name
        for got, want in zip(tree_leaves(call(None, True)), tree_leaves(call("torch", True))):
            assert torch.equal(got, want) and got.requires_grad == want.requires_grad, name


@pytest.mark.usefixtures("threads")
def test_default_backend_without_the_c_loops(rng, monkeypatch):
    """Where they cannot be built, None takes the torch backend (and says so once) and "c" says why."""
    monkeypatch.setattr(native, "unavailable_reason", lambda: "no C compiler here")
    native._warn_once.cache_clear()
    calls = small_calls(rng)
    with pytest.warns(RuntimeWarning, match="runs the slower torch backend: no C compiler here") as caught:
        outputs = [tree_leaves(call(None, False)) for _, call in calls]
    assert len(caught) == 1
    for (name, call), got_outputs in zip(calls, outputs):
        for got, want in zip(got_outputs, tree_leaves(call("torch", False))):
            assert torch.equal(got, want), name
        with pytest.raises(RuntimeError, match="backend='c' is not available here: no C compiler here"):
            call("c", False)


def test_no_compiler_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQMIX_CACHE", str(tmp_path))
    with pytest.raises(native.NativeUnavailable, match="no working C compiler 'no-such-cc'"):
        native._build("no-such-cc")


def test_bad_input(rng):
    for name, call in small_calls(rng):
        with pytest.raises(ValueError, match="backend='c' is forward only"):
            call("c", True)
    with torch.no_grad():
        w, u, k, v, _ = wkv4_inputs(rng, 1, 4, 3, dtype=torch.float64)
        with pytest.raises(TypeError, match="backend='c' takes dtypes"):
            wkv4(w, u, k, v, backend="c")
        q = torch.randn(1, 1, 4, 8)
        with pytest.raises(ValueError, match="backend='c' exists for wkv4, wkv7, selective_scan only"):
            attention(q, q, q, backend="c")


def nan_cases():
    """(op, input, index of the NaN put in, index of an output that must then be NaN)."""
    return [("wkv4", "k", (0, 2, 1), (0, 2, 1)), ("wkv4", "v", (0, 2, 1), (0, 2, 1)), ("wkv4", "u", (1,), (0, 0, 1)),
            *[("wkv7", name, (0, 2, 0, 1), (0, 2, 0)) for name in ("r", "log_w", "k", "v", "a", "b")],
            *[("ssm", name, (0, 1, 3), (0, 1, 3)) for name in ("u", "delta", "z")], ("ssm", "A", (1, 2), (0, 1, 0)),
            *[("ssm", name, (1,), (0, 1, 0)) for name in ("D", "delta_bias")],
            *[("ssm", name, (0, 2, 3), (0, slice(None), 3)) for name in ("B", "C")]]


@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize("op, name, where, reaches", nan_cases())
def test_nan_in_the_input_comes_out(rng, op, name, where, reaches):
    """The loops are built assuming finite numbers (-ffinite-math-only, see kernels/native.py), under which a NaN
    does not pass through comparisons and clamps; a NaN in any input must still reach the outputs it feeds."""
    w, u, k, v, _ = wkv4_inputs(rng, 1, 6, 3)
    names7 = ("r", "log_w", "k", "v", "a", "b")
    x7 = dict(zip(names7, fp32(*rwkv7_inputs(rng, 1, 5, 1, 4)[0])))
    xs = {k: torch.tensor(a, dtype=torch.float32)
          for k, a in scan_inputs(rng, 1, 3, 4, 6, extras=("D", "z", "delta_bias")).items()}
    inputs = {"wkv4": dict(w=w, u=u, k=k, v=v), "wkv7": x7, "ssm": dict(xs, delta_softplus=True)}[op]
    inputs[name][where] = float("nan")
    run = {"wkv4": wkv4, "wkv7": wkv7, "ssm": ssm.selective_scan}[op]
    y = run(**inputs, backend="c")[0]
    assert torch.isnan(y[reaches]).any()


def _same_in_child(inputs, expected):
    os._exit(0 if torch.equal(wkv4(*inputs, backend="c")[0], expected) else 1)


@pytest.mark.usefixtures("threads")
def test_threads_after_a_fork(rng):
    """A forked child (a DataLoader worker, say) runs the loops on threads, after its parent has: same result, no
    hang."""
    inputs = wkv4_inputs(rng, 2, 30, 40)[:4]
    expected = wkv4(*inputs, backend="c")[0]              # the parent's pool exists now
    child = multiprocessing.get_context("fork").Process(target=_same_in_child, args=(inputs, expected))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
