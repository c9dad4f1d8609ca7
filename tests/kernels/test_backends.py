"""kernels/backends.py, the one dispatcher: backend=None takes the first backend in the op's order that accepts the
call, a backend asked for by name raises with its reason, WKV-7's chunked form is the backend "triton_chunked" (the
old chunked=True still works, with a DeprecationWarning), the docstrings say what the dispatcher does, and nothing
outside it decides a backend."""
import importlib
import re
from pathlib import Path

import pytest
import torch

import seqmix.kernels.wkv7 as kw
from helpers.kernel_cases import needs_triton, spy
from seqmix.kernels import backends, native
from seqmix.kernels.wkv7 import c as wkv7_c
from seqmix.kernels.registry import REGISTRY
from seqmix.kernels.testing import FP32_BUDGET, HAS_TRITON, assert_close
from seqmix.kernels.wkv4 import wkv4
from seqmix.models import decode
from seqmix.models.mamba import MambaModel
from seqmix.models.rwkv4 import RwkvModel
from seqmix.models.rwkv7 import Rwkv7

ROOT = Path(__file__).resolve().parents[2]
CPU, CUDA = torch.device("cpu"), torch.device("cuda")
C_HERE = not native.unavailable_reason()
OPS = {op.name: op.function for op in REGISTRY}


def wkv7_inputs(N, T=3, dtype=torch.float32):
    torch.manual_seed(0)
    x = [0.3 * torch.randn(1, T, 2, N, dtype=dtype) for _ in range(6)]
    x[1] = -x[1].exp()
    return x


def names(op):
    return [b.name for b in backends.BACKENDS[op]]


# ------------------------------------------------------------------------------------------------ the order

# The place of each kind of backend in an order: the device's kernels first (Triton's forms take CUDA tensors only
# with backend=None), then the C loops, then torch, which takes every call. Each op's own order is its spec's (and the
# architecture page's table, checked below, spells each out).
RANK = {"triton": 0, "triton_chunked": 0, "triton_merged": 0, "c": 1, "torch": 2}


def test_every_op_has_its_order():
    assert list(backends.BACKENDS) == list(OPS)
    assert names("wkv7") == ["triton", "triton_chunked", "c", "torch"]
    for op in REGISTRY:
        order = names(op.name)
        assert len(set(order)) == len(order) and set(order) <= set(backends.NAMES), op.name
        assert [RANK[b] for b in order] == sorted(RANK[b] for b in order), op.name
        assert ("c" in order) == bool(op.c_entries)   # a C backend exactly where the op has C entry points
    assert all(names(op)[-1] == "torch" for op in OPS)   # the torch backend takes every call: None always finds one


@pytest.mark.parametrize("op", list(OPS))
def test_auto_pick_on_cpu_tensors(op):
    """On CPU tensors None never takes Triton (the interpreter is a test tool): the C loops where the op has them
    and they build, torch otherwise; float64 and heads above the C loop's limit go to torch."""
    facts = {"N": 64, "d": 64}
    expected = "c" if "c" in names(op) and C_HERE else "torch"
    assert backends.dispatch(backends.Call(op, CPU, torch.float32, facts)) == expected
    assert backends.dispatch(backends.Call(op, CPU, torch.float64, facts)) == "torch"
    said = backends.refusals(backends.Call(op, CPU, torch.float32, facts))
    assert list(said) == names(op)
    assert all("for CUDA tensors only" in said[n] for n in said if n.startswith("triton"))


def test_auto_pick_of_wkv7_heads_on_cpu():
    call = backends.Call("wkv7", CPU, torch.float32, {"N": wkv7_c.MAX_HEAD + 16})
    assert backends.dispatch(call) == "torch"
    assert backends.refusals(call)["c"] == f"takes head sizes N <= {wkv7_c.MAX_HEAD}, got N = 272"


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
def test_auto_pick_on_cuda_tensors():
    """No GPU is needed to ask: a Call only describes one. Triton where its kernels take the shape and dtype, torch
    where they do not (float64, head dims outside the flash kernels' range, WKV-7 heads not a power of two)."""
    assert backends.dispatch(backends.Call("wkv7", CUDA, torch.bfloat16, {"N": 64})) == "triton"   # not chunked
    assert backends.dispatch(backends.Call("wkv7", CUDA, torch.float32, {"N": 6})) == "torch"
    assert backends.dispatch(backends.Call("wkv4", CUDA, torch.float64)) == "torch"
    assert backends.dispatch(backends.Call("attention", CUDA, torch.float16, {"d": 64})) == "triton"
    assert backends.dispatch(backends.Call("attention", CUDA, torch.float16, {"d": 8})) == "torch"


def test_the_real_ops_follow_the_dispatcher(monkeypatch):
    """wkv7 on CPU tensors runs the backend the dispatcher names (spied on its answers)."""
    answers = spy(monkeypatch, kw, "dispatch")
    kw.wkv7(*wkv7_inputs(4))
    assert answers == ["c" if C_HERE else "torch"]


# ------------------------------------------------------------------------------------------------ refusals

def test_a_refusal_names_the_argument_and_gives_the_reason():
    x = wkv7_inputs(wkv7_c.MAX_HEAD + 16, T=2)
    with pytest.raises(ValueError, match=r"^backend='c' takes head sizes N <= 256, got N = 272$"):
        kw.wkv7(*x, backend="c")
    with pytest.raises(ValueError, match=r"^backend='triton_chunked' exists for wkv7 only, not wkv4$"):
        wkv4(torch.zeros(3) - 1, torch.zeros(3), torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), backend="triton_chunked")
    with pytest.raises(ValueError,
                       match=r"backend must be one of \('torch', 'triton', 'triton_chunked', 'triton_merged', 'c'\)"):
        kw.wkv7(*x, backend="chunked")
    with pytest.raises(TypeError, match=r"^backend='c' takes dtypes \['torch.float32', 'torch.float16', "):
        kw.wkv7(*wkv7_inputs(4, dtype=torch.float64), backend="c")


def test_a_refusal_of_what_is_not_installed_is_a_runtime_error(monkeypatch):
    monkeypatch.setattr(native, "unavailable_reason", lambda: "no C compiler here")
    with pytest.raises(RuntimeError, match="^backend='c' is not available here: no C compiler here$"):
        kw.wkv7(*wkv7_inputs(4), backend="c")


@needs_triton
def test_triton_chunked_refuses_small_heads():
    """Below tl.dot's 16 the chunked kernels cannot run: asked for by name, "triton_chunked" says so rather than
    running the sequential kernel in silence."""
    for N in (4, 8):
        with pytest.raises(ValueError, match=rf"^backend='triton_chunked' needs a head size N that is a power of two "
                                             rf">= 16 \(tl.dot's smallest tile\), got N = {N}; backend='triton' runs"):
            kw.wkv7(*wkv7_inputs(N), backend="triton_chunked")
    call = backends.Call("wkv7", CUDA, torch.float32, {"N": 24})
    assert "power of two >= 16" in backends.refusals(call)["triton_chunked"]


@needs_triton
def test_triton_chunked_runs_the_chunked_kernels(monkeypatch):
    launches = spy(monkeypatch, kw, "_chunked_fwd")
    x = wkv7_inputs(16, T=5)
    y, S = kw.wkv7(*x, backend="triton_chunked")
    assert len(launches) == 1
    y_seq, S_seq = kw.wkv7(*x, backend="triton")
    assert len(launches) == 1
    assert_close(y, y_seq.double(), FP32_BUDGET, "triton_chunked vs triton y")
    assert_close(S, S_seq.double(), FP32_BUDGET, "triton_chunked vs triton state")


# ------------------------------------------------------------------------------------------------ chunked=True

def test_chunked_true_is_deprecated_and_still_works():
    x = wkv7_inputs(4)
    with pytest.warns(DeprecationWarning, match='wkv7\\(chunked=True\\) is deprecated .* backend="triton_chunked"'):
        y, S = kw.wkv7(*x, chunked=True)          # on CPU tensors the flag never mattered
    y0, S0 = kw.wkv7(*x)
    assert torch.equal(y, y0) and torch.equal(S, S0)


@needs_triton
@pytest.mark.parametrize("N, chunked_kernel", [(16, True), (8, False)])
def test_chunked_true_keeps_its_meaning_on_triton(monkeypatch, N, chunked_kernel):
    """backend="triton", chunked=True: the chunked kernels from N = 16, the sequential ones below, as before."""
    launches = spy(monkeypatch, kw, "_chunked_fwd")
    with pytest.warns(DeprecationWarning):
        kw.wkv7(*wkv7_inputs(N), backend="triton", chunked=True)
    assert bool(launches) == chunked_kernel


# ------------------------------------------------------------------------------------------------ docstrings

def _words(text):
    return " ".join(text.split())


@pytest.mark.parametrize("op", list(OPS))
def test_op_docstrings_say_what_the_dispatcher_does(op):
    assert _words(backends.describe(op)) in _words(OPS[op].__doc__)


@pytest.mark.parametrize("model", [Rwkv7, RwkvModel, MambaModel])
def test_model_docstrings_say_what_the_dispatcher_does(model):
    step = _words(backends.describe("decode_step", decode.STEP, decode.LEAD))
    assert step in _words(model.forward.__doc__)
    assert step in _words(decode.step_path.__doc__)
    assert _words(backends.describe("model_part", decode.PART, decode.LEAD)) in _words(decode.part_path.__doc__)


def test_the_architecture_page_gives_the_dispatchers_order():
    """docs/architecture.md's table of orders, row by row, against BACKENDS."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## The dispatcher"):]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            ops_cell, order_cell = line.strip("|").split("|")
            for op in re.findall(r"`(\w+)`", ops_cell):
                rows[op] = re.findall(r'`"(\w+)"`', order_cell)
    # the repository's ops, each named by its package (a test's made-up op, given as objects, has no row)
    assert rows == {op.name: names(op.name) for op in REGISTRY if isinstance(op.module, str)}


# ------------------------------------------------------------------------------------------------ one place

# What used to decide a backend outside the dispatcher: these names must not come back.
OLD_DECIDERS = ("resolve_backend", "c_refuses", "_use_chunked_forward", "runs_in_c", "decode.fused",
                "check_triton_head_dim", "check_backend_dtype", "C_OPS")
# Where the signs of a decision may appear: the dispatcher, the models' C paths (backends of the same kind), and
# kernels/__init__.py, which sets TRITON_INTERPRET without choosing anything (tests may ask them, to skip).
ALLOWED = {"native.available(": {"kernels/backends.py", "models/decode.py"},
           'environ.get("TRITON_INTERPRET")': {"kernels/backends.py", "kernels/__init__.py"}}


def _sources():
    for folder in ("kernels", "models", "conformance", "benchmarks", "src", "experiments", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if (rel.startswith("benchmarks/results/") or rel == "tests/kernels/test_backends.py"
                    or any(part.startswith(".") for part in path.relative_to(ROOT).parts)):  # .ipynb_checkpoints
                continue
            yield rel, path.read_text()


def test_no_backend_is_decided_outside_the_dispatcher():
    found = []
    for rel, text in _sources():
        found += [f"{rel}: {name}" for name in OLD_DECIDERS if re.search(rf"\b{re.escape(name)}\b", text)]
        found += [f"{rel}: {sign}" for sign, where in ALLOWED.items()
                  if sign in text and rel not in where and not rel.startswith("tests/")]   # tests may ask, to skip
    assert not found, "a backend decided outside kernels/backends.py's dispatch: " + ", ".join(found)


@pytest.mark.parametrize("module", sorted({op.module if isinstance(op.module, str) else op.module.__module__
                                            for op in REGISTRY}))
def test_each_op_asks_the_dispatcher_once(module):
    text = Path(importlib.import_module(module).__file__).read_text()     # a package's: its __init__.py
    assert len(re.findall(r"\bdispatch\(", text)) == 1 and "Call(" in text
