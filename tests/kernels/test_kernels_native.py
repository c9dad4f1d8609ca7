"""The C loops (backend="c", kernels/<op>/<op>.c, built by kernels/native.py): the C loops against the float64 truths
the op tests use, on outputs, final states and every gradient, over the chain's awkward cases: T = 1, odd sizes, initial
states, sequences fed in pieces, extreme inputs, fp16 and bf16 inputs, work split over 1 and 3 threads (the same bits);
NaN in, NaN out; how backend=None chooses them; the build and its cache; and issue 13's edge cases of the C loops."""
import ctypes
import multiprocessing
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._pytree import tree_leaves

from helpers.kernel_cases import RECURRENCE_BACKENDS
from seqmix.kernels.inputs import in_pieces, rwkv7_inputs, scan_inputs, split_bounds
from seqmix.kernels import c_abi, native, ssm
from seqmix.kernels.wkv7 import c as wkv7_c
from seqmix.kernels.declarations import call as call_op, state_tensors
from seqmix.kernels.registry import REGISTRY, spec
from seqmix.kernels.testing import HAS_TRITON
from seqmix.kernels.attention import attention
from seqmix.kernels.testing import FP16_BUDGET, FP32_BUDGET, assert_all_close, assert_close, fp32
from seqmix.kernels.wkv4 import INITIAL_MAX, wkv4
from seqmix.kernels.wkv7 import wkv7
from test_kernels_ssm import (CASES as SCAN_CASES, case_inputs, check_against_truth as scan_against_truth,
                              cotangents_for)
from test_kernels_wkv7 import GRAD_NAMES as WKV7_GRAD_NAMES, check_against_truth as wkv7_against_truth
from test_kernels_wkv4 import (GRAD_NAMES as WKV4_GRAD_NAMES, assert_state_close, check_forward as check_wkv4_forward,
                               loss_weights as wkv4_loss_weights, make_inputs as wkv4_inputs, run_dense as wkv4_dense,
                               run_reference as wkv4_reference, with_grads as wkv4_with_grads)

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

def check_wkv4(rng, w, u, k, v, state, budget, grads=WKV4_GRAD_NAMES):
    """Output and final state against the reference, then the gradients named by ``grads`` (of a loss on y and on
    what the final state represents) against float64 autograd of the definition; ``state`` None starts empty."""
    B, T, C = k.shape
    y, new_state = check_wkv4_forward(w, u, k, v, state, "c", budget)
    assert y.dtype == k.dtype and all(s.dtype == torch.float32 and s.shape == (B, C) for s in new_state)
    state = state or (torch.zeros(B, C), torch.zeros(B, C), torch.full((B, C), INITIAL_MAX))
    gy, g_state = wkv4_loss_weights(rng, B, T, C, invariant=True)
    gy = gy.to(k.dtype).double()                       # what reaches the op: dL/dy in y's dtype
    _, _, got = wkv4_with_grads(lambda *a: wkv4(*a, backend="c"), w, u, k, v, state, gy, g_state)
    _, _, expected = wkv4_with_grads(wkv4_dense, w, u, k, v, state, gy, g_state)
    assert all(g.dtype == x.dtype for g, x in zip(got, (w, u, k, v, *state)))
    keep = [WKV4_GRAD_NAMES.index(name) for name in grads]
    assert_all_close(grads, [got[i] for i in keep], [expected[i] for i in keep], budget)


@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize("B,T,C", [(1, 1, 3), (2, 7, 5), (1, 37, 40), (3, 16, 33)])   # 40, 33: partial blocks
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_wkv4(rng, B, T, C, with_state, dtype):
    check_wkv4(rng, *wkv4_inputs(rng, B, T, C, dtype=dtype, with_state=with_state), BUDGETS[dtype])


@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize("extreme", ["keys +-300", "keys 250 +-1", "steep decays and a decay of 0", "decays near 1",
                                     "dominant current token"])
def test_wkv4_extreme_inputs(rng, extreme):
    """Left out with keys of hundreds: d/dmax0, ~e^-200 formed from O(1) terms that cancel (see
    test_kernels_wkv4.test_large_keys). The dominant current token: u + 12 over the past, where autograd through the
    ratio y = num / den cancels (the torch backend's d/du loses 6e-3, issue 13's D9); the C loop saves v - y."""
    B, T, C = 2, 45, 7
    w, u, k, v, state = wkv4_inputs(rng, B, T, C, decay_scale=2.0, with_state=True)
    grads = WKV4_GRAD_NAMES
    if extreme == "keys +-300":
        k = torch.tensor(rng.uniform(-300, 300, (B, T, C)), dtype=torch.float32)
        grads = WKV4_GRAD_NAMES[:6]
    elif extreme == "keys 250 +-1":
        k = 250 + k
        grads = WKV4_GRAD_NAMES[:6]
    elif extreme == "decays near 1":
        w = w * 1e-6 / w.abs().mean()
    elif extreme == "dominant current token":
        u = u + 12
    else:
        w = torch.cat([w[:-1] * 50, torch.tensor([-1e4])])
    check_wkv4(rng, w, u, k, v, state, FP32_BUDGET, grads)


@pytest.mark.usefixtures("threads")
def test_wkv4_gradients_of_the_raw_state(rng):
    """A loss on the returned num, den and max themselves, not only on what they represent: the final max's own
    gradient reaches the initial max only where the final max is still the initial one's (mutant N04, d/dmax0
    always getting it, survived the max-invariant losses: 2.7 relative error here). Against the float64 torch
    backend."""
    w, u, k, v, state = wkv4_inputs(rng, 2, 7, 5, with_state=True)
    gy, g_state = wkv4_loss_weights(rng, 2, 7, 5)                 # raw: weights on num, den, max
    _, _, got = wkv4_with_grads(lambda *a: wkv4(*a, backend="c"), w, u, k, v, state, gy, g_state)
    _, _, expected = wkv4_with_grads(lambda *a: wkv4(*a, backend="torch"), *(x.double() for x in (w, u, k, v)),
                                     tuple(s.double() for s in state), gy, g_state)
    assert_all_close(WKV4_GRAD_NAMES, got, expected, FP32_BUDGET)


@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize("B,T,C", [(2, 0, 3), (0, 4, 3), (2, 4, 0)])
def test_wkv4_empty(rng, B, T, C):
    w, u, k, v, state = wkv4_inputs(rng, B, T, C, with_state=True)
    y, new_state = wkv4(w, u, k, v, state, backend="c")
    assert y.shape == (B, T, C) and all(torch.equal(a, b) for a, b in zip(new_state, state))


@pytest.mark.usefixtures("threads")
def test_wkv4_split_equals_whole(rng):
    """Fed in pieces: outputs, state and every gradient (through the states passed on) as the definition's."""
    B, T, C = 2, 39, 5
    w, u, k, v, state = wkv4_inputs(rng, B, T, C, with_state=True)
    bounds = split_bounds(T, rng.uniform(size=3))

    def pieces(w, u, k, v, state):
        ys, carried = in_pieces(lambda lo, hi, s: wkv4(w, u, k[:, lo:hi], v[:, lo:hi], s, backend="c"), bounds, state)
        return torch.cat(ys, 1), carried

    gy, g_state = wkv4_loss_weights(rng, B, T, C, invariant=True)
    y, carried, grads = wkv4_with_grads(pieces, w, u, k, v, state, gy, g_state)
    _, _, expected = wkv4_with_grads(wkv4_dense, w, u, k, v, state, gy, g_state)
    y_ref, state_ref = wkv4_reference(w, u, k, v, state)
    assert_close(y, y_ref, FP32_BUDGET, f"y from pieces {bounds}")
    assert_state_close(carried, state_ref, FP32_BUDGET, f"state after pieces {bounds}")
    assert_all_close(WKV4_GRAD_NAMES, grads, expected, FP32_BUDGET, f"pieces {bounds}")


# ------------------------------------------------------------------------------------------------------ WKV-7

@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize("shape, decay, with_state", [
    ((1, 1, 1, 16), "strong", False),        # T = 1
    ((2, 37, 3, 16), "mixed", True),         # batch > 1, odd T
    ((1, 33, 2, 64), "strong", True),        # head size 64, decays near 0.545
    ((3, 16, 1, 5), "weak", False),          # odd head size (the C loop takes any), decays near 1
    ((1, 40, 2, 8), "extreme", True),        # log decays down to -1e4
    ((1, 20, 1, 7), "growing", True),        # log_w > 0: the formula is defined for any real decay
    ((2, 48, 4, 32), "strong", True),        # the training shape's heads, three whole checkpoint intervals
    ((1, 3, 1, 256), "mixed", True),         # the largest head the loop takes: 16 vectors a row, no partial sums
    ((1, 5, 2, 40), "mixed", True),          # padded to 48: three vectors a row, partial sums over 2 keys
])
@pytest.mark.parametrize("dtype", DTYPES)
def test_wkv7(rng, shape, decay, with_state, dtype):
    """Output, final state and every gradient against float64 autograd of the recurrence."""
    wkv7_against_truth(rng, shape, decay, with_state, dtype, "c", BUDGETS[dtype])


@pytest.mark.usefixtures("threads")
def test_wkv7_split_equals_whole(rng):
    """Fed in pieces: the same loop over the same numbers, so outputs and state agree exactly with the whole; and
    every gradient, through the states passed on."""
    T = 41
    x_np, S0_np = rwkv7_inputs(rng, 2, T, 2, 16)
    x = [z.requires_grad_() for z in fp32(*x_np, S0_np)]
    bounds = split_bounds(T, rng.uniform(size=3))
    y_whole, S_whole = wkv7(*x[:6], state=x[6], backend="c")
    ys, S = in_pieces(lambda lo, hi, s: wkv7(*(z[:, lo:hi] for z in x[:6]), state=s, backend="c"), bounds, x[6])
    y = torch.cat(ys, 1)
    assert torch.equal(y, y_whole) and torch.equal(S, S_whole)
    gy, gS = torch.randn_like(y), torch.randn_like(S)
    whole = torch.autograd.grad((y_whole * gy).sum() + (S_whole * gS).sum(), x)
    split = torch.autograd.grad((y * gy).sum() + (S * gS).sum(), x)
    assert_all_close(WKV7_GRAD_NAMES, split, whole, FP32_BUDGET, f"pieces {bounds}")


def test_wkv7_head_limit_is_the_loops():
    """kernels/wkv7/c.py's MAX_HEAD, which routes larger heads to torch, is what wkv7.c's loops take."""
    assert native.library().wkv7_max_head_size() == wkv7_c.MAX_HEAD


def test_wkv7_heads_above_the_loops_limit(rng):
    """A head larger than the C loop takes (256) runs on torch under backend=None, and backend='c' says why not."""
    x = fp32(*rwkv7_inputs(rng, 1, 2, 1, 272)[0])
    y, S = wkv7(*x)
    y_torch, S_torch = wkv7(*x, backend="torch")
    assert torch.equal(y, y_torch) and torch.equal(S, S_torch)
    with pytest.raises(ValueError, match=r"backend='c' takes head sizes N <= 256, got N = 272"):
        wkv7(*x, backend="c")


# ------------------------------------------------------------------------------------------------ selective scan

# the Triton tests' cases, an odd state size (the C loop takes any N), and channels in groups of two blocks of eight
# for the backward (a batch of 4 gets 4 groups: 5 blocks make groups of 2, 2 and 1)
C_SCAN_CASES = {**SCAN_CASES, "N=7": dict(batch=2, dim=5, N=7, T=23, extras=("D", "z", "state")),
                "groups": dict(batch=4, dim=40, N=3, T=35, extras=("D", "z", "delta_bias", "state"), softplus=True)}


@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize("case", C_SCAN_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_selective_scan(rng, case, dtype):
    """Output, last state and every gradient against float64 autograd of a per-token loop; u, delta, B, C, z in the
    op's dtype; A, D, delta_bias fp32 (as Mamba keeps them); the state fp32."""
    inputs, softplus = case_inputs(rng, case, C_SCAN_CASES)
    scan_against_truth(inputs, softplus, cotangents_for(rng, inputs), BUDGETS[dtype], "c", dtype, torch.float32)


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

def small_calls(rng, T=6, batch=2):
    """One small call of each op, as (name, fn(backend, grad) -> (outputs, the input leaves)): WKV-4 on 33 channels,
    WKV-7 on 3 heads, the scan on 20 channels (3 blocks of 8) with every option."""
    w, u, k, v, _ = wkv4_inputs(rng, batch, T, 33)
    x7 = fp32(*rwkv7_inputs(rng, batch, T, 3, 4)[0])
    xs = {k: torch.tensor(a, dtype=torch.float32)
          for k, a in scan_inputs(rng, batch, 20, 4, T, extras=("D", "z", "delta_bias")).items()}
    runs = [("wkv4", (w, u, k, v), lambda backend, x: wkv4(*x, backend=backend)),
            ("wkv7", x7, lambda backend, x: wkv7(*x, backend=backend)),
            ("selective_scan", list(xs.values()),
             lambda backend, x: ssm.selective_scan(**dict(zip(xs, x)), delta_softplus=True, backend=backend))]

    def call(inputs, run):
        def fn(backend, grad):
            leaves = [t.detach().clone().requires_grad_(grad) for t in inputs]
            return run(backend, leaves), leaves
        return fn

    return [(name, call(inputs, run)) for name, inputs, run in runs]


def outputs_and_gradients(call, backend="c"):
    """The outputs of call(backend, True) and the gradients of a fixed random weighting of them."""
    outputs, leaves = call(backend, True)
    outputs = tree_leaves(outputs)
    weights = [torch.randn(o.shape, generator=torch.Generator().manual_seed(i)) for i, o in enumerate(outputs)]
    grads = torch.autograd.grad(sum((o * g).sum() for o, g in zip(outputs, weights)), leaves)
    return [o.detach() for o in outputs] + list(grads)


@pytest.mark.usefixtures("threads")
def test_default_backend_on_cpu(rng):
    """None takes the C loops, with a gradient wanted or not."""
    for name, call in small_calls(rng):
        for grad in (False, True):
            for got, want in zip(tree_leaves(call(None, grad)), tree_leaves(call("c", grad))):
                assert torch.equal(got, want) and got.requires_grad == want.requires_grad == grad, name


def test_same_numbers_whatever_the_threads(rng, monkeypatch):
    """The gradients that sum over batch rows, time or channels (w, u; A, D, delta's bias, B, C) are summed within
    each work item, then over work items in a fixed order: repeated runs give the same bits, with 1 thread or 3."""
    monkeypatch.setattr(native, "SERIAL_WORK", 0)
    before = torch.get_num_threads()
    try:
        for name, call in small_calls(rng, T=40, batch=7):
            runs = []
            for threads in (1, 3, 3, 1):
                torch.set_num_threads(threads)
                runs.append(outputs_and_gradients(call))
            for run in runs[1:]:
                assert all(torch.equal(a, b) for a, b in zip(run, runs[0])), name
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS[:2])
def test_gradients_agree_with_the_other_backends(rng, backend):
    """Outputs and gradients of the C loops against the torch and Triton backends', call by call (each is checked
    against float64 autograd of the definitions elsewhere; this compares the implementations directly)."""
    for name, call in small_calls(rng, T=21):
        got, want = outputs_and_gradients(call, "c"), outputs_and_gradients(call, backend)
        assert_all_close(range(len(want)), got, want, FP32_BUDGET, name)


def test_torch_threads_are_the_loops_threads(monkeypatch):
    """One setting for both: torch.set_num_threads(n) splits each C call into n ranges of work items."""
    monkeypatch.setattr(native, "SERIAL_WORK", 0)
    before, ranges = torch.get_num_threads(), []
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            ranges.clear()
            native._run(lambda first, last: ranges.append((first, last)) or 0, 10, 10)   # 0: STATUS_OK
            assert sorted(ranges) == [(10 * i // n, 10 * (i + 1) // n) for i in range(n)]
    finally:
        torch.set_num_threads(before)


@pytest.mark.usefixtures("threads")
def test_default_backend_without_the_c_loops(rng, monkeypatch):
    """Where they cannot be built, None takes the torch backend (and says so once) and "c" says why."""
    monkeypatch.setattr(native, "unavailable_reason", lambda: "no C compiler here")
    native._warn_once.cache_clear()
    calls = small_calls(rng)
    with pytest.warns(RuntimeWarning, match="run the slower torch backend on CPU: no C compiler here") as caught:
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
        native._build(["no-such-cc"])


def test_bad_input(rng):
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
            *[("selective_scan", name, (0, 1, 3), (0, 1, 3)) for name in ("u", "delta", "z")],
            ("selective_scan", "A", (1, 2), (0, 1, 0)),
            *[("selective_scan", name, (1,), (0, 1, 0)) for name in ("D", "delta_bias")],
            *[("selective_scan", name, (0, 2, 3), (0, slice(None), 3)) for name in ("B", "C")]]


@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize("op, name, where, reaches", nan_cases())
def test_nan_in_the_input_comes_out(rng, op, name, where, reaches):
    """The loops are built assuming finite numbers (-ffinite-math-only, see kernels/native.py), under which a NaN
    does not pass through comparisons and clamps; a NaN in any input must still reach the outputs it feeds, and the
    gradients."""
    op = spec(op)                        # its battery's tiny inputs (an initial state included) at T = 6
    battery = op.get("battery")
    x = battery.make(rng, T=6, **battery.tiny)
    tensors = {n: torch.tensor(a, dtype=torch.float32) for n, a in x.tensors.items()}
    tensors[name][where] = float("nan")
    leaves = [t.requires_grad_() for t in tensors.values()]
    state = state_tensors(x.state, torch.float32)
    y = call_op(battery, op.function, tensors, {**x.options, "backend": "c"}, state)[0]
    assert torch.isnan(y[reaches]).any()
    assert any(torch.isnan(g).any() for g in torch.autograd.grad(y.sum(), leaves))


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


# ------------------------------------------------------------------------------ edges (issue 13: D6, I4, D8, C1, C2)

@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
def test_wkv4_state_max_of_minus_inf(rng, backend):
    """D6: a state max of -inf means "nothing seen yet" (num = den = 0), as (0, 0, -1e38) does; the C loop made it
    all NaN. Every backend gives the reference's answer."""
    w, u, k, v, _ = wkv4_inputs(rng, 2, 9, 5)
    check_wkv4_forward(w, u, k, v, (torch.zeros(2, 5), torch.zeros(2, 5), torch.full((2, 5), -float("inf"))),
                       backend)


@pytest.mark.parametrize("backend", RECURRENCE_BACKENDS)
def test_wkv4_key_of_minus_inf(rng, backend):
    """D6: a key of -inf is a token of weight e^-inf = 0 (it adds nothing); the C loop made its channel NaN from
    there on. Every backend gives the reference's answer."""
    w, u, k, v, state = wkv4_inputs(rng, 2, 9, 5, with_state=True)
    k[1, 4, 2] = -float("inf")
    check_wkv4_forward(w, u, k, v, state, backend)


def test_wkv7_nan_in_r_reaches_y_t_alone(rng):
    """I4: r enters only y_t = S_t r_t, so a NaN in r_t makes y_t NaN (every value of that head) and nothing else;
    the C loop made the whole head NaN, and its state. Every backend agrees on where NaN appears."""
    x = fp32(*rwkv7_inputs(rng, 2, 7, 2, 4)[0])
    x[0][1, 3, 0, 2] = float("nan")
    where = torch.zeros(2, 7, 2, 4, dtype=torch.bool)
    where[1, 3, 0] = True
    for backend in ("torch", "c", *(["triton"] if HAS_TRITON else [])):
        y, S = wkv7(*x, backend=backend)
        assert torch.equal(torch.isnan(y), where) and torch.isfinite(S).all(), backend


@pytest.fixture
def tiny_sources(tmp_path):
    """A one-function stand-in for native.c: the builder tests check its file handling (cache, checksum, rename,
    compiler command), which does not depend on what it compiles; native.c itself is built and run by every C test."""
    source = tmp_path / "source" / "tiny.c"
    source.parent.mkdir()
    source.write_text("int tiny_answer(void) { return 42; }\n")
    return native.Sources("tiny", (source,), ())


def test_truncated_library_is_built_again(tmp_path, monkeypatch, tiny_sources):
    """D8: a cached library cut short (a full disk, an interrupted copy) killed the process with SIGBUS on its first
    call, and stayed. Its checksum no longer matches the one recorded at build time, so it is built again."""
    monkeypatch.setenv("SEQMIX_CACHE", str(tmp_path / "first"))
    built = Path(native._build(native.compiler(), tiny_sources))          # a whole library, and its checksum
    monkeypatch.setenv("SEQMIX_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    for name in (built.name, built.name + ".sha256"):
        shutil.copy(built.with_name(name), tmp_path / "cache" / name)
    whole = built.read_bytes()
    (tmp_path / "cache" / built.name).write_bytes(whole[: len(whole) // 2])
    path = native._build(native.compiler(), tiny_sources)
    assert path == tmp_path / "cache" / built.name and len(path.read_bytes()) == len(whole)
    load = subprocess.run([sys.executable, "-c", f"import ctypes; print(ctypes.CDLL({str(path)!r}).tiny_answer())"],
                          capture_output=True, text=True)
    assert load.returncode == 0 and load.stdout.strip() == "42"


def test_compiler_that_writes_nothing_is_named(tmp_path, monkeypatch):
    """C1: a "compiler" that exits 0 without output (CC=echo) gave a raw [Errno 2] about a temporary path."""
    monkeypatch.setenv("SEQMIX_CACHE", str(tmp_path))
    with pytest.raises(native.NativeUnavailable, match=r"'echo' reported success but wrote no native-\w+\.so"):
        native._build(["echo"])


def test_unusable_cache_directory_is_named(tmp_path, monkeypatch):
    """C1: a cache path that is a file (or unwritable) gave a raw [Errno 17] / [Errno 20]."""
    blocked = tmp_path / "a file"
    blocked.write_text("")
    monkeypatch.setenv("SEQMIX_CACHE", str(blocked / "cache"))
    with pytest.raises(native.NativeUnavailable, match="cache directory .*a file/cache .*set SEQMIX_CACHE"):
        native._build(native.compiler())


def test_compiler_command_with_arguments(tmp_path, monkeypatch, tiny_sources):
    """C2: CC holds a command, split as a shell splits it ("ccache gcc", "gcc -w"); it was taken for one file name
    and refused as "no working C compiler"."""
    monkeypatch.setenv("SEQMIX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", "cc -w")
    assert native.compiler() == ["cc", "-w"]
    assert native._build(native.compiler(), tiny_sources).parent == tmp_path / "cache"


def test_builds_at_once_leave_one_whole_library(tmp_path, monkeypatch, tiny_sources):
    """Two builds into an empty cache at once (pytest beside a notebook kernel): each goes to a temporary file that
    is renamed into place, so both return a whole library and nothing else is left behind."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("SEQMIX_CACHE", str(cache))
    with ThreadPoolExecutor(2) as pool:
        paths = list(pool.map(lambda _: native._build(native.compiler(), tiny_sources), range(2)))
    assert paths[0] == paths[1] and native._intact(paths[0], paths[0].with_name(paths[0].name + ".sha256"))
    assert sorted(p.name for p in cache.iterdir()) == [paths[0].name, paths[0].name + ".sha256"]


@pytest.mark.parametrize("decay", [-float("inf"), -1e37, -1e30])
def test_selective_scan_gradients_with_a_decay_of_zero(decay):
    """R1: A = -inf (a decay of exactly 0, documented) or |A| so large that delta A is far below e^-87. The backward
    multiplied its clamped e^{delta A} = e^-87 by A (-FLT_MAX for -inf) into an O(1) term of d/ddelta and
    d/ddelta_bias (relative errors 1-10). Every gradient within the fp32 budget of the torch backend in float64."""
    generator = torch.Generator().manual_seed(10)
    A = torch.tensor([[-1.0, decay, -2.0], [-0.5, -1.5, -3.0]])
    u, delta = torch.randn(2, 2, 5, generator=generator), torch.rand(2, 2, 5, generator=generator)
    B, C = torch.randn(2, 3, 5, generator=generator), torch.randn(2, 3, 5, generator=generator)
    bias, state = torch.rand(2, generator=generator), torch.randn(2, 2, 3, generator=generator)
    weights = torch.randn(2, 2, 5, generator=generator)
    grads = {}
    for backend, dtype in (("c", torch.float32), ("torch", torch.float64)):
        inputs = [x.to(dtype).requires_grad_() for x in (u, delta, A, B, C, bias, state)]
        y, last = ssm.selective_scan(*inputs[:5], delta_bias=inputs[5], delta_softplus=True, state=inputs[6],
                                     backend=backend)
        grads[backend] = torch.autograd.grad((y * weights.to(dtype)).sum() + last.sum(), inputs)
    for name, got, expected in zip(("u", "delta", "A", "B", "C", "delta_bias", "state"), *grads.values()):
        assert_close(got.double(), expected, FP32_BUDGET, f"d/d{name} with A = {decay}")


# -------------------------------------------------------------------------------------- status returns (issue 25)

def test_status_codes_mirror_native_h():
    """native.STATUS, the Python side of native.h's enum status, names the same codes."""
    text = (Path(native.__file__).parent / "native.h").read_text()
    enum = text[text.index("enum status {"):]
    enum = enum[:enum.index("}")]
    codes = {int(value): name.strip() for name, value in
             (item.split("=") for item in enum.removeprefix("enum status {").split(","))}
    assert codes == {0: "STATUS_OK", 1: "STATUS_NO_MEMORY", 2: "STATUS_HEAD_SIZE"}
    assert set(native.STATUS) == set(codes) - {0}


# ------------------------------------------------------------------------------- one signature table (issue 27)

def test_the_signature_table_is_the_header():
    """native.ENTRIES, from which the ctypes types come and by which the wrappers pass their arguments, is read from
    the headers: native.h's three shared entry points and each op's (kernels/<op>/<op>.h), with their argument
    names."""
    assert set(native.ENTRIES) == {"exp_array", "softplus_array", "sum_rows", "wkv4_forward", "wkv4_backward",
                                   "selective_scan_lanes", "selective_scan_forward", "selective_scan_backward",
                                   "wkv7_padded_size", "wkv7_max_head_size", "wkv7_forward", "wkv7_backward"}
    assert [p.name for p in native.ENTRIES["sum_rows"].params] == ["first", "last", "rows", "cols", "in", "out"]


def test_every_entry_point_of_native_c_is_in_the_table():
    """Every function native.c and the ops' loops export (a definition that is not static) is in the table, and so in
    native.h or the op's header, against which the compiler checks its definition."""
    sources = [path for path in native.KERNELS.files if path.suffix == ".c"]
    assert len(sources) == 1 + sum(1 for op in REGISTRY if op.c_entries)       # native.c and each op's loops
    defined = {name: entry for path in sources for name, entry in c_abi.prototypes(path.read_text()).items()}
    assert set(defined) == set(native.ENTRIES)
    assert all(str(defined[name]) == str(entry) for name, entry in native.ENTRIES.items())


def test_a_drift_between_table_and_header_is_seen():
    """The parser sees a changed type, a renamed argument and a dropped one."""
    text = native.HEADER.read_text()
    for old, new in (("int64_t cols, const float *in", "int64_t cols, const double *in"),
                     ("int64_t cols, const float *in", "int64_t columns, const float *in"),
                     ("int64_t rows, int64_t cols,", "int64_t rows,")):
        assert c_abi.prototypes(text.replace(old, new))["sum_rows"] != native.ENTRIES["sum_rows"], new


def test_the_library_is_typed_from_the_table():
    lib = native.library()
    for entry in native.ENTRIES.values():
        fn = getattr(lib, entry.name)
        assert fn.argtypes == entry.argtypes and fn.restype is c_abi.CTYPES[entry.restype], entry.name
    assert native.ENTRIES["wkv7_padded_size"].argtypes == [ctypes.c_int64]
    assert native.ENTRIES["exp_array"].argtypes == [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]


def test_a_call_by_name_says_what_is_missing_or_unknown():
    with pytest.raises(TypeError, match=r"sum_rows: missing arguments \['out'\], unknown arguments \['outs'\]"):
        native.ENTRIES["sum_rows"].arguments({"rows": 1, "cols": 1, "in": None, "outs": None}, skip=2)


@pytest.mark.parametrize("entry", ["wkv7_forward", "wkv7_backward"])
def test_a_head_the_loops_do_not_take_is_an_error(rng, entry):
    """native.c returned without a word for a head above 256, leaving its outputs unwritten (the public op routes such
    heads to torch; a direct call, or a future caller, got garbage)."""
    x = fp32(*rwkv7_inputs(rng, 1, 2, 1, 272)[0])
    with pytest.raises(ValueError, match=r"head size N <= 256 \(called with r of shape \(1, 2, 1, 272\)"):
        y, state, saved = wkv7_c.wkv7_forward(*x, None, save=entry == "wkv7_backward")
        wkv7_c.wkv7_backward(*x, saved, y, state)


OUT_OF_MEMORY = """
import resource, sys, torch
from seqmix.kernels.wkv7 import c as wkv7_c
from seqmix.models.rwkv7 import step
from seqmix.models.rwkv7 import Rwkv7, Rwkv7Config
torch.set_num_threads(1)                  # no OpenMP threads to start (their stacks need address space too)
if sys.argv[1] == "native":               # wkv7_backward's scratch: 4.7 MB at N = 256
    def inputs(N):
        x = [torch.randn(1, 2, 1, N) for _ in range(6)]
        y, state, saved = wkv7_c.wkv7_forward(*x, None, save=True)
        return x, saved, y, state
    call = lambda x, saved, y, state: wkv7_c.wkv7_backward(*x, saved, y, state)
else:                                     # rwkv7_time_mix's scratch: 7 x 128 tokens x N = 256 floats, 0.9 MB
    att = Rwkv7(Rwkv7Config(vocab_size=8, n_embd=256, n_layer=2, head_size=256, decay_lora=8, a_lora=8, v_lora=8,
                            gate_lora=8)).blocks[1].att
    inputs = lambda T: [torch.randn(1, T, 256) for _ in range(8)] + [torch.zeros(1, 1, 256, 256)]
    call = lambda *x: step.rwkv7_time_mix(att, *x)
call(*inputs(16))                         # small: every lazy initialization done, no large block freed
x = inputs(256 if sys.argv[1] == "native" else 128)
size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 20), resource.RLIM_INFINITY))   # 1 MB more: the outputs fit
try:
    call(*x)
except MemoryError as e:
    print("MemoryError:", e)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="an address-space limit (Linux)")
@pytest.mark.parametrize("where", ["native", "decode"])
def test_scratch_memory_that_cannot_be_had_is_a_memory_error(where):
    """aligned_alloc's and malloc's results were not checked in native.c (a NULL scratch written to) and the step's
    and time mix's statuses were one -1: in a child whose address space is capped just above what it holds, the
    C code's scratch allocation fails and Python raises MemoryError naming the entry point."""
    done = subprocess.run([sys.executable, "-c", OUT_OF_MEMORY, where], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    entry = "wkv7_backward" if where == "native" else "rwkv7_time_mix"
    assert f"MemoryError: {entry} could not allocate its scratch memory" in done.stdout
