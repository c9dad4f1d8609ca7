"""The registry is the only list of ops: a made-up op (tests/helpers/ema_op.py: an exponential moving average,
s_t = a s_{t-1} + (1 - a) x_t, y_t = s_t) registered with ``registered`` and nothing else is run by the conformance
battery and its command line, the cross-check and the edge-case harness, and reaches the dispatcher; a wrong backend
for it fails the battery; and afterwards the registry holds what it held before. This is docs/architecture.md's
"Adding an op" checklist, proved for these harnesses; ``pytest --full --extra-op helpers.ema_op:SPEC`` registers the
same op
for the whole run, which proves it for every test that iterates the registry."""
import dataclasses
from contextlib import contextmanager, nullcontext

import numpy as np
import pytest
import torch

from helpers import edge_ops
from helpers.ema_op import SPEC, ema
from seqmix.conformance import Options, run
from seqmix.conformance.__main__ import parser
from seqmix.kernels import crosscheck
from seqmix.kernels.backends import BACKENDS, Call, dispatch
from seqmix.kernels.declarations import OPS
from seqmix.kernels.registry import REGISTRY, names, registered, spec
from seqmix.kernels.testing import rel_rms

BEFORE = names()     # the registry's ops as the run starts (with --extra-op, the made-up op among them)
# The repository's own ops: each lives in a package of seqmix.kernels (kernels/<op>/)
OWN = [op.name for op in REGISTRY if isinstance(op.module, str) and op.module.startswith("seqmix.kernels.")]


@contextmanager
def made_up_op():
    """The made-up op in the registry for the block: registered here, or already there for the whole run."""
    with nullcontext() if SPEC.name in names() else registered(SPEC):
        yield


# ------------------------------------------------------------------------------------------------------- the tests

def test_the_registry_holds_each_op_once_and_its_views_follow():
    assert len(OWN) >= 6 and len(set(names())) == len(names()) and names() == BEFORE
    assert list(OPS) == BEFORE and list(BACKENDS) == BEFORE


def test_each_spec_points_at_real_code():
    """Every name a spec gives resolves, and the battery's stateful agrees with the spec's family."""
    for op in REGISTRY:
        assert callable(op.function) and callable(op.get("reference")) and callable(op.get("naive"))
        assert op.get("battery").name == op.name and op.get("battery").stateful == op.stateful
        assert op.get("backends")[-1].name == "torch"


def test_a_made_up_op_runs_through_every_harness():
    with made_up_op():
        assert names().count("ema") == 1 and names()[:len(OWN)] == OWN
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
    assert names() == BEFORE


def test_a_wrong_backend_for_the_made_up_op_fails_the_battery():
    """The input weighed by 1 instead of 1 - a: the battery must say so (the harness can fail)."""
    def wrong(*args, **kwargs):
        return ema(*args, **kwargs, forget_the_input_weight=True)

    with made_up_op():
        report = run("ema", wrong, Options(dtypes=("fp32",)))
    assert report.checks and not report.ok
    assert names() == BEFORE


def test_registering_a_name_twice_is_refused_and_leaves_the_registry_as_it_was():
    with pytest.raises(ValueError, match="already registered"):
        with registered(dataclasses.replace(SPEC, name="wkv4")):
            pass
    assert names() == BEFORE and spec("wkv4").title == "RWKV-4 WKV"
