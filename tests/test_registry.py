"""The registry is the only list of ops: a made-up op (an exponential moving average, s_t = a s_{t-1} + (1 - a) x_t,
y_t = s_t) registered with ``registered`` and nothing else is run by the conformance battery and its command line, the
cross-check and the edge-case harness, and reaches the dispatcher; a wrong backend for it fails the battery; and
afterwards the registry holds the six ops again. This is docs/architecture.md's "Adding an op" checklist, proved."""
import numpy as np
import pytest
import torch

import edge_ops
from seqmix.conformance import Options, run
from seqmix.conformance.__main__ import parser
from seqmix.kernels import crosscheck
from seqmix.kernels.backends import BACKENDS, Call, Torch, dispatch
from seqmix.kernels.declarations import OPS, Case, Inputs, Op
from seqmix.kernels.registry import REGISTRY, OpSpec, names, registered, spec
from seqmix.kernels.testing import rel_rms

SIX = names()     # as the registry declares them, before any test registers an op


# ------------------------------------------------------------------------- the made-up op, as its package would be

def ema_reference(x, a, *, state=None):
    """float64 NumPy. x (B, T, C), a (C,) in (0, 1), state (B, C) or None (zeros); returns (y, last state)."""
    s = np.zeros((x.shape[0], x.shape[2])) if state is None else np.array(state, dtype=np.float64)
    y = np.empty(x.shape)
    for t in range(x.shape[1]):
        s = a * s + (1 - a) * x[:, t]
        y[:, t] = s
    return y, s


def ema_naive(x, a, *, state=None):
    """float64 torch, differentiable: the closed form y_t = a^{t+1} s_0 + sum_{i<=t} a^{t-i} (1 - a) x_i."""
    T = x.shape[1]
    steps = torch.arange(T, dtype=x.dtype)
    powers = a[None, None, :] ** (steps[:, None, None] - steps[None, :, None]).clamp(min=0)   # (t, i, C)
    weights = torch.where((steps[:, None] >= steps[None, :])[..., None], powers * (1 - a), 0)
    y = torch.einsum("tic,bic->btc", weights, x)
    if state is not None:
        y = y + a[None, None, :] ** (steps[None, :, None] + 1) * state[:, None, :]
    return y, y[:, -1]


def ema(x, a, *, state=None, backend=None, forget_the_input_weight=False):
    """The op's one backend, torch: a loop over time in fp32 (float64 beside float64 inputs)."""
    dispatch(Call("ema", x.device, x.dtype), backend)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    a = a.to(acc)
    s = x.new_zeros((x.shape[0], x.shape[2]), dtype=acc) if state is None else state
    weight = 1 if forget_the_input_weight else 1 - a
    ys = []
    for t in range(x.shape[1]):
        s = a * s + weight * x[:, t].to(acc)
        ys.append(s)
    return torch.stack(ys, 1).to(x.dtype), s


def ema_inputs(rng, B, T, C, state=False):
    x = rng.normal(size=(B, T, C))
    a = rng.uniform(0.1, 0.9, size=C)
    return Inputs(dict(x=x, a=a), {}, rng.normal(size=(B, C)) if state else None)


EMA = Op("ema", ("x", "a"), ema_inputs, head="C", conditioning=None, time_axes=dict(x=1),
         tiny=dict(B=1, C=3, state=True), cases=(
             Case(dict(B=1, T=1, C=3)),
             Case(dict(B=2, T=9, C=4, state=True), low_precision=True),
         ), split=Case(dict(B=2, T=13, C=3, state=True), group="split"))

SPEC = OpSpec("ema", "moving average", ema, ema_reference, ema_naive, EMA, (Torch(),), "recurrence")


# ------------------------------------------------------------------------------------------------------- the tests

def test_the_registry_holds_the_six_ops():
    assert len(SIX) == 6 and names() == SIX
    assert list(OPS) == SIX and list(BACKENDS) == SIX


def test_each_spec_points_at_real_code():
    """Every name a spec gives resolves, and the battery's stateful agrees with the spec's family."""
    for op in REGISTRY:
        assert callable(op.function) and callable(op.get("reference")) and callable(op.get("naive"))
        assert op.get("battery").name == op.name and op.get("battery").stateful == op.stateful
        assert op.get("backends")[-1].name == "torch"


def test_a_made_up_op_runs_through_every_harness():
    with registered(SPEC):
        assert names() == SIX + ["ema"]
        assert dispatch(Call("ema", torch.device("cpu"))) == "torch"
        assert "ema" in parser().parse_args(["ema", "m:f"]).op
        report = run("ema", ema, Options())
        assert report.checks and report.ok, [r for r in report.rows if not r.passed]
        assert {c.split("/")[1] for c in report.checks} == {"shapes", "split"}
        rows = [r for r in crosscheck.all_rows(np.random.default_rng(0)) if r[0] == "moving average"]
        assert [r[1] for r in rows] == ["kernel, torch"]
        assert all(rel_rms(actual, expected) <= budget for _, _, actual, expected, budget in rows)
        assert "ema" in edge_ops.names() and edge_ops.backends("ema") == ["torch"]
        for name in edge_ops.inputs("ema", np.random.default_rng(0)):      # every input, every non-finite value
            for value in edge_ops.NONFINITE:
                x = edge_ops.inputs("ema", np.random.default_rng(1))
                index = tuple(s // 2 for s in x[name].shape)
                x[name][index] = edge_ops.NONFINITE[value]
                with np.errstate(invalid="ignore"):                         # inf - inf in the reference: NaN
                    edge_ops.check_nan_placement("ema", x, [(name, index)], "torch")
    assert names() == SIX


def test_a_wrong_backend_for_the_made_up_op_fails_the_battery():
    """The input weighed by 1 instead of 1 - a: the battery must say so (the harness can fail)."""
    def wrong(*args, **kwargs):
        return ema(*args, **kwargs, forget_the_input_weight=True)

    with registered(SPEC):
        report = run("ema", wrong, Options(dtypes=("fp32",)))
    assert report.checks and not report.ok
    assert names() == SIX


def test_registering_a_name_twice_is_refused_and_leaves_the_registry_as_it_was():
    with pytest.raises(ValueError, match="already registered"):
        with registered(OpSpec("wkv4", "", ema, ema_reference, ema_naive, EMA, (Torch(),), "recurrence")):
            pass
    assert names() == SIX and spec("wkv4").title == "RWKV-4 WKV"
