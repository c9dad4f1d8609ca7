"""models/decode.py and each model's C step (models/<model>/step.py, <model>_step.c; RWKV-7's rwkv7_time_mix.c): a
decoding step of a whole model as one C call,
against the models' own torch forward in float64 (an independent computation: torch ops, the float64 backends of the
ops), on awkward sizes (widths that are no multiple of a vector, an odd number of heads, a head padded inside the
WKV-7 loop, RWKV-4's attention size != hidden size with rescaling, Mamba with every bias and a channel count that is
no multiple of the scan's lanes), from the initial state and from states the torch path made, with 1 and 2 threads."""
from __future__ import annotations

import contextlib
import copy
import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._pytree import tree_leaves

from seqmix.kernels import c_abi, native
from seqmix.kernels.wkv7 import c as wkv7_c
from seqmix.kernels.testing import BF16_BUDGET, FP32_BUDGET, assert_close, rel_rms
from seqmix.models import decode
from seqmix.models.mamba import step as mamba_step
from seqmix.models.rwkv4 import step as rwkv4_step
from seqmix.models.rwkv7 import step as rwkv7_step
from seqmix.models.mamba import MambaConfig, MambaForCausalLM
from seqmix.models.rwkv4 import RwkvConfig, RwkvForCausalLM
from seqmix.models.rwkv7 import Rwkv7, Rwkv7Config

pytestmark = pytest.mark.skipif(not native.available(), reason=f"C loops unavailable: {native.unavailable_reason()}")

VOCAB = 50
MODELS = {   # (config options: a test's own, over these)
    "rwkv4": lambda **options: RwkvForCausalLM(RwkvConfig(**{
        **dict(vocab_size=VOCAB, hidden_size=40, num_hidden_layers=4, attention_hidden_size=24,
               intermediate_size=56, rescale_every=2), **options})),
    "rwkv7": lambda **options: Rwkv7(Rwkv7Config(**{
        **dict(vocab_size=VOCAB, n_embd=72, n_layer=3, head_size=24, dim_ffn=88, decay_lora=12, a_lora=8,
               v_lora=20, gate_lora=36), **options})),
    "mamba": lambda **options: MambaForCausalLM(MambaConfig(**{
        **dict(vocab_size=VOCAB, hidden_size=21, num_hidden_layers=3, state_size=5, conv_kernel=3,
               time_step_rank=3, use_bias=True), **options})),
}
# Each model's C step: its layout, its library (models/<model>/step.py)
STEPS = {"rwkv4": rwkv4_step, "rwkv7": rwkv7_step, "mamba": mamba_step}


@contextlib.contextmanager
def num_threads(n: int):
    """torch's (and so the C step's) thread count set to n inside the block."""
    threads = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def make(kind: str, dtype=torch.float32, seed: int = 0, **options):
    """The model (config ``options`` over MODELS') with its initialization spread by noise (so that no weight is a
    constant), in eval mode."""
    torch.manual_seed(seed)
    model = MODELS[kind](**options)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.to(dtype).eval()


def run(model, ids, state=None, **kwargs):
    """(logits, state) of a forward call, for all three models."""
    out = model(ids, state=state, **kwargs)
    return out if isinstance(out, tuple) else (out.logits, out.state)


@pytest.fixture
def count_steps(monkeypatch):
    """How many forward calls ran as one C step."""
    calls = []
    original = decode.call_step

    def counted(*args):
        calls.append(args[1])                 # the entry point's name
        return original(*args)
    monkeypatch.setattr(decode, "call_step", counted)
    return calls


def pieces(model, ids):
    """Token 0 from no state (a C step), tokens 1-3 as one call (the torch path, from the C step's state), then the
    rest one at a time (C steps, the first from the torch path's state): the logits of every position."""
    with torch.no_grad():
        logits, state = run(model, ids[:, :1])
        out = [logits]
        logits, state = run(model, ids[:, 1:4], state)
        out.append(logits)
        for t in range(4, ids.shape[1]):
            logits, state = run(model, ids[:, t:t + 1], state)
            out.append(logits)
    return torch.cat(out, dim=1), state


@pytest.mark.parametrize("dtype, budget", [(torch.float32, FP32_BUDGET), (torch.bfloat16, BF16_BUDGET)])
@pytest.mark.parametrize("kind", MODELS)
def test_decoding_steps_match_the_float64_forward(kind, dtype, budget, count_steps):
    model = make(kind, dtype)
    ids = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(1))
    logits, _ = pieces(model, ids)
    assert count_steps == [f"{kind}_decode"] * 6                      # token 0 and tokens 4-8
    with torch.no_grad():
        expected, _ = run(copy.deepcopy(model).double(), ids)             # the same (rounded) weights
    assert_close(logits.double(), expected, budget, f"{kind} {dtype} logits")


@pytest.mark.parametrize("kind", MODELS)
def test_a_bf16_step_computes_in_fp32(kind):
    """The C step widens bf16 weights and keeps fp32 throughout (only the logits are rounded, by the head), where the
    torch ops round to bf16 after each op: its error against float64 is the smaller."""
    model = make(kind, torch.bfloat16)
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected, state = run(copy.deepcopy(model).double(), ids[:, :5])
        expected, _ = run(copy.deepcopy(model).double(), ids[:, 5:], state)
        _, state = run(model, ids[:, :5])
        fused, _ = run(model, ids[:, 5:], state)
        torch_ops, _ = run(model, ids[:, 5:], state, backend="torch")
    assert rel_rms(fused, expected) < rel_rms(torch_ops, expected)


@pytest.mark.parametrize("kind", MODELS)
def test_results_do_not_depend_on_the_thread_count(kind):
    """The C code promises the same bits with any thread count: every token a C step (the state never leaves it),
    the states compared bit for bit. The logits come from torch's head matmul, whose split over threads is torch's
    and not promised (nor were the torch ops of a prompt, which this compared bit for bit): within the fp32 budget."""
    model = make(kind)
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(3))
    results = []
    for n in (1, 2, 3):
        state, logits = None, []
        with num_threads(n), torch.no_grad():
            for t in range(ids.shape[1]):
                out, state = run(model, ids[:, t:t + 1], state)
                logits.append(out)
        results.append((torch.cat(logits, 1), torch.cat([s.flatten() for s in tree_leaves(state)])))
    for logits, state in results[1:]:
        assert torch.equal(state, results[0][1])
        assert_close(logits, results[0][0], FP32_BUDGET, f"{kind} logits")


def test_rwkv7_prompt_time_mix_does_not_depend_on_the_thread_count():
    """The prompt's C time mix, its (batch row, head) items split over 1, 2 or 3 threads: the same bits."""
    att = make("rwkv7").blocks[1].att
    generator = torch.Generator().manual_seed(13)
    acts = [torch.randn(2, 5, 72, generator=generator) for _ in range(8)]
    kv = torch.randn(2, 3, 24, 24, generator=generator)
    results = []
    for n in (1, 2, 3):
        with num_threads(n):
            results.append(torch.cat([t.flatten() for t in rwkv7_step.rwkv7_time_mix(att, *acts, kv)]))
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])


@pytest.mark.parametrize("kind", MODELS)
def test_the_state_passed_in_is_not_modified(kind):
    model = make(kind)
    with torch.no_grad():
        _, state = run(model, torch.tensor([[3, 4]]))
        before = copy.deepcopy(state)
        run(model, torch.tensor([[5]]), state)
    for a, b in zip(tree_leaves(state), tree_leaves(before)):
        assert torch.equal(a, b)


def test_rwkv4_step_in_training_mode_does_not_rescale():
    """transformers rescales in eval mode only; so does the C step (rescale_every = 2 here)."""
    model = make("rwkv4").train()
    ids = torch.tensor([[7]])
    with torch.no_grad():
        fused, _ = run(model, ids)
        expected, _ = run(copy.deepcopy(model).double(), ids)
    assert_close(fused.double(), expected, FP32_BUDGET, "logits in training mode")


# (Rwkv7 reads a float64 state's att_kv as fp32, its kv_dtype, whichever path runs: no case of its own)
@pytest.mark.parametrize("kind, how", [(kind, how) for kind in MODELS
                                       for how in ("backend torch", "two sequences", "two tokens", "float64", "float16",
                                                   "gradients", "float64 state")
                                       if (kind, how) != ("rwkv7", "float64 state")])
def test_other_calls_run_the_torch_ops(kind, how, count_steps):
    model = make(kind, {"float64": torch.float64, "float16": torch.float16}.get(how, torch.float32))
    ids = {"two sequences": torch.tensor([[1], [2]]),
           "two tokens": torch.tensor([[1, 2]])}.get(how, torch.tensor([[1]]))
    state = None
    if how == "float64 state":
        state = model.initial_state(1, dtype=torch.float64)
    with torch.set_grad_enabled(how == "gradients"):
        logits, _ = run(model, ids, state, backend="torch" if how == "backend torch" else None)
    assert count_steps == []
    if how == "gradients":
        logits.sum().backward()
        assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_a_head_larger_than_the_loops_take_runs_the_torch_ops(count_steps):
    model = Rwkv7(Rwkv7Config(vocab_size=VOCAB, n_embd=wkv7_c.MAX_HEAD + 16, n_layer=1,
                              head_size=wkv7_c.MAX_HEAD + 16, decay_lora=8, a_lora=8, gate_lora=8)).eval()
    with torch.no_grad():
        run(model, torch.tensor([[1]]))
    assert count_steps == []


@pytest.mark.parametrize("kind", MODELS)
def test_matrices_stored_transposed(kind, count_steps):
    """Every matrix held as a transposed view (as fla's RWKV-7 layout gives the LoRA matrices, models/rwkv7_fla.py):
    the C step reads it as stored and still matches the float64 forward."""
    model = make(kind)
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            if p.dim() == 2 and min(p.shape) > 1:
                setattr(module, name, torch.nn.Parameter(p.detach().t().contiguous().t()))
    assert any(not p.is_contiguous() for p in model.parameters())
    ids = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(5))
    logits, _ = pieces(model, ids)
    assert len(count_steps) == 6
    with torch.no_grad():
        expected, _ = run(copy.deepcopy(model).double(), ids)
    assert_close(logits.double(), expected, FP32_BUDGET, f"{kind} logits, matrices stored transposed")


def test_a_strided_parameter_is_named():
    model = make("rwkv7")
    weight = model.blocks[0].att.key.weight
    model.blocks[0].att.key.weight = torch.nn.Parameter(torch.cat([weight.detach()] * 2, dim=1)[:, ::2])
    with torch.no_grad(), pytest.raises(ValueError, match=r"contiguous .*shape \(72, 72\)"):
        run(model, torch.tensor([[1]]))


@pytest.mark.parametrize("dtype, budget", [(torch.float32, FP32_BUDGET), (torch.bfloat16, BF16_BUDGET)])
@pytest.mark.parametrize("T", [1, 5, 130])                # 130: two of the C time mix's chunks of 128 tokens
def test_rwkv7_prompt_time_mix_in_c(dtype, budget, T, monkeypatch):
    """A prompt of two sequences from a state that is not zero: each TimeMix's work after its matrix products runs
    in C (rwkv7_time_mix of models/rwkv7/step.py, once per layer), and the logits and state match the float64 torch
    forward."""
    calls = []
    original = rwkv7_step.rwkv7_time_mix
    monkeypatch.setattr(rwkv7_step, "rwkv7_time_mix", lambda *args: calls.append(1) or original(*args))
    model = make("rwkv7", dtype)
    generator = torch.Generator().manual_seed(4)
    start = torch.randint(0, VOCAB, (2, 3), generator=generator)
    ids = torch.randint(0, VOCAB, (2, T), generator=generator)
    reference = copy.deepcopy(model).double()
    with torch.no_grad():
        _, state = run(model, start, backend="torch")
        logits, new_state = run(model, ids, state)
        expected, expected_state = run(reference, ids, [tuple(s.double() for s in layer) for layer in state])
    assert len(calls) == model.config.n_layer
    assert_close(logits.double(), expected, budget, "logits")
    assert_close(torch.cat([s.flatten() for s in tree_leaves(new_state)]).double(),
                 torch.cat([s.flatten() for s in tree_leaves(expected_state)]), budget, "state")


def test_a_compiler_without_openmp_builds_a_library_that_decodes_alike(tmp_path):
    """Where -fopenmp fails (Apple's clang), the build retries without it (native.OPENMP) and the steps run on one
    thread: the same logits, to the bit, as the OpenMP build here with two threads. Run in a fresh interpreter with
    its own cache directory, the first flag replaced by one no compiler knows."""
    script = """
import json, sys, torch
sys.path.insert(0, "tests"); sys.path.insert(0, "tests/models")
from seqmix.kernels import c_abi, native
native.OPENMP = ("-fno-such-flag-seqmix",) + native.OPENMP[1:]
from test_models_decode import make, pieces
torch.set_num_threads(2)
logits, _ = pieces(make("rwkv7"), torch.arange(6)[None] % 50)
print(json.dumps(logits.flatten().tolist()))
"""
    env = dict(os.environ, SEQMIX_CACHE=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(list(tmp_path.glob("native-*.so"))) == 1
    with num_threads(2):
        logits, _ = pieces(make("rwkv7"), torch.arange(6)[None] % 50)
    assert torch.equal(torch.tensor(json.loads(done.stdout)), logits.flatten())


def _decode_in_child(model, ids, expected):
    torch.set_num_threads(1)          # as DataLoader workers do: libgomp's threads do not survive a fork
    os._exit(0 if torch.equal(pieces(model, ids)[0], expected) else 1)


def test_a_forked_child_on_one_thread_decodes_alike():
    """After the parent has decoded on OpenMP threads, a forked child (on one thread, as torch's own parallel ops need
    it there too: with two, a child hangs in libgomp on a torch matmul as on this step) gets the same logits."""
    model, ids = make("rwkv7"), torch.arange(6)[None] % VOCAB
    with num_threads(2):
        expected, _ = pieces(model, ids)
    child = multiprocessing.get_context("fork").Process(target=_decode_in_child, args=(model, ids, expected))
    child.start()
    child.join(timeout=60)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0


def _poisoned(kind, where):
    """The model and a state (from two tokens on the torch path) with a NaN or +inf put at ``where``: a state
    tensor's first number ("state i") or a parameter's ("param name")."""
    model = make(kind)
    with torch.no_grad():
        _, state = run(model, torch.tensor([[3, 4]]), backend="torch")
        state = copy.deepcopy(state)
        what, name, value = where
        target = tree_leaves(state)[name] if what == "state" else model.get_parameter(name)
        target[(0,) * target.dim()] = value
    return model, state


NONFINITE_CASES = [  # kind, (where, which, value): each where a comparison or clamp once dropped the NaN
    ("rwkv4", ("state", 0, float("nan"))), ("rwkv4", ("state", 0, float("inf"))),            # ffn_x_prev: ReLU
    ("rwkv4", ("param", "rwkv.blocks.1.feed_forward.key.weight", float("nan"))),
    ("rwkv4", ("param", "rwkv.blocks.1.attention.receptance.weight", float("nan"))),          # sigmoid(r)
    ("rwkv4", ("param", "rwkv.blocks.1.feed_forward.receptance.weight", float("nan"))),
    ("rwkv7", ("state", 2, float("nan"))), ("rwkv7", ("state", 2, float("inf"))),            # ffn_x_prev: ReLU
    ("rwkv7", ("param", "blocks.1.ffn.key.weight", float("nan"))),
    ("rwkv7", ("param", "blocks.1.att.g1", float("nan"))),                                    # sigmoid gate
    ("rwkv7", ("param", "blocks.1.att.w1", float("nan"))),                                    # tanh
    ("mamba", ("state", 0, float("nan"))), ("mamba", ("state", 1, float("nan"))),
    ("mamba", ("param", "backbone.layers.1.mixer.A_log", float("nan"))),                      # e^A_log
]


@pytest.mark.parametrize("kind, where", NONFINITE_CASES, ids=[f"{k}-{w[0]}-{w[1]}-{w[2]}" for k, w in NONFINITE_CASES])
def test_nonfinite_inputs_give_nan_where_the_torch_ops_do(kind, where, count_steps):
    """The design's rule, NaN at the same places on every backend, for the C step: models/native/ is built with
    -ffinite-math-only, under which a ReLU written as `k > 0 ? k k : 0` or a clamp before e^x turned NaN and +inf
    into finite logits."""
    model, state = _poisoned(kind, where)
    with torch.no_grad():
        fused, fused_state = run(model, torch.tensor([[5]]), state)
        expected, expected_state = run(model, torch.tensor([[5]]), state, backend="torch")
    assert count_steps == [f"{kind}_decode"]
    assert torch.isnan(expected).any()          # the case means something: the torch ops give NaN here
    assert torch.equal(torch.isnan(fused), torch.isnan(expected))
    for a, b in zip(tree_leaves(fused_state), tree_leaves(expected_state)):   # the scan's C loop makes a whole
        assert torch.isnan(a)[torch.isnan(b)].all()                           # channel NaN (kernels/<op>/<op>.c)


def mixed(kind):
    """The model in bf16 with the parameters it keeps fp32 (keep_in_fp32: RWKV-4's time_decay and time_first, as
    transformers keeps them; Mamba's A_log, D and dt_proj.bias; RWKV-7's w0, w1, w2) in fp32, as from_pretrained
    loads such a checkpoint."""
    model = make(kind, torch.bfloat16)
    for name, p in model.named_parameters():
        if model.keeps_fp32(name):
            p.data = p.data.float()
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16, torch.float32}
    return model


@pytest.mark.parametrize("kind", MODELS)
def test_parameters_of_mixed_dtypes(kind, count_steps):
    """Each weight reaches the C step with its own dtype flag: one flag for all read the fp32 decays as bf16 (logits
    3-9% off) and a bf16 tensor as fp32, past its end. The step within bf16's budget of the float64 forward of the
    same weights, and of the torch path."""
    model = mixed(kind)
    ids = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(6))
    logits, state = pieces(model, ids)
    assert count_steps == [f"{kind}_decode"] * 4
    with torch.no_grad():
        expected, expected_state = run(copy.deepcopy(model).double(), ids)
        torch_ops, _ = run(model, ids, backend="torch")
    assert_close(logits.double(), expected, BF16_BUDGET, f"{kind} logits, decays fp32")
    assert_close(torch.cat([s.flatten() for s in tree_leaves(state)]).double(),
                 torch.cat([s.flatten() for s in tree_leaves(expected_state)]), BF16_BUDGET, f"{kind} state")
    assert_close(logits.double(), torch_ops.double(), BF16_BUDGET, f"{kind} logits against the torch path")


def test_rwkv7_prompt_time_mix_with_decays_fp32():
    """The prompt's C time mix reads each of its per-channel parameters with its own dtype (it read all with r_k's)."""
    model = mixed("rwkv7")
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        logits, state = run(model, ids)
        expected, expected_state = run(copy.deepcopy(model).double(), ids)
    assert_close(logits.double(), expected, BF16_BUDGET, "logits")
    assert_close(torch.cat([s.flatten() for s in tree_leaves(state)]).double(),
                 torch.cat([s.flatten() for s in tree_leaves(expected_state)]), BF16_BUDGET, "state")


@pytest.mark.parametrize("T", [1, 4])                   # 1: the one-token step; 4: RWKV-7's prompt time mix
@pytest.mark.parametrize("kind", MODELS)
def test_state_tuning_gradients(kind, T):
    """Frozen weights and a trainable initial state ("state tuning"): the C paths decided "no gradient" from the
    weights and x alone, so the state got none (or a wrong one). Gradients of every state tensor as backend="torch"
    gives them."""
    model = make(kind).requires_grad_(False)
    ids = torch.randint(0, VOCAB, (1, T), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        _, start = run(model, torch.tensor([[3, 4]]), backend="torch")
    weights = torch.randn(1, T, VOCAB, generator=torch.Generator().manual_seed(9))
    grads = {}
    for backend in (None, "torch"):
        state = copy.deepcopy(start)
        leaves = tree_leaves(state)
        for s in leaves:
            s.requires_grad_()
        logits, _ = run(model, ids, state, backend=backend)
        grads[backend] = torch.autograd.grad((logits * weights).sum(), leaves, allow_unused=True)
    for i, (got, expected) in enumerate(zip(grads[None], grads["torch"])):
        if expected is None:
            assert got is None, f"state tensor {i}"
            continue
        assert got is not None, f"state tensor {i} got no gradient"
        assert_close(got.double(), expected.double(), FP32_BUDGET, f"{kind} T={T} gradient of state tensor {i}")


@pytest.mark.parametrize("kind", MODELS)
def test_a_step_with_another_layer_norm_eps(kind, count_steps):
    """layer_norm_epsilon = 0.1, far from the default 1e-5: the blocks' norms take it, and RWKV-4's ln_out keeps
    1e-5 as transformers builds it (mutant D04, the C step's ln_out taking the config's eps, survived every test
    model at 1e-5: 0.92 relative error here)."""
    model = make(kind, layer_norm_epsilon=0.1)
    ids = torch.tensor([[7]])
    with torch.no_grad():
        fused, _ = run(model, ids)
        expected, _ = run(copy.deepcopy(model).double(), ids)
    assert count_steps == [f"{kind}_decode"]
    assert_close(fused.double(), expected, FP32_BUDGET, f"{kind} logits at eps 0.1")


# ------------------------------------------------------------------------------- one signature table (issue 27)

@pytest.mark.parametrize("kind", MODELS)
def test_the_signature_table_is_the_header(kind):
    """A model's library's entries, from which the ctypes types come and by which the calls pass their arguments,
    are the very prototypes of its header (models/<model>/<model>_step.h); and every function its C files export is
    declared there (or, the time mix's items, which only rwkv7_step.c calls, beside that call)."""
    sources = STEPS[kind].SOURCES
    header = next(f for f in sources.files if f.name == f"{kind}_step.h")
    declared = c_abi.prototypes(header.read_text())
    entries = {e.name: str(e) for e in sources.entries}
    assert {name: str(e) for name, e in declared.items()} == entries
    own = [f for f in sources.files if f.suffix == ".c" and f.parent == header.parent]
    assert own and not list(decode.NATIVE.glob("*.c"))    # each model's C is its own; models/native/ holds a header
    defined = {name: str(e) for source in own for name, e in c_abi.prototypes(source.read_text()).items()}
    assert set(defined) - {"time_mix_items"} == set(entries)
    assert all(defined[name] == entry for name, entry in entries.items())


@pytest.mark.parametrize("kind", MODELS)
def test_the_weights_passed_are_the_layouts(kind):
    """Layout.pack passes each weight its table names, in the table's order (the order of the enums weights.h
    generates from it): head, then each block's, then tail."""
    model = make(kind)
    base = model.rwkv if kind == "rwkv4" else model.backbone if kind == "mamba" else model
    layout = STEPS[kind].LAYOUT
    packed = layout.pack(base)
    blocks = getattr(base, layout.blocks)
    assert len(packed) == len(layout.head) + len(blocks) * len(layout.block) + len(layout.tail)
    expected = [(base, w) for w in layout.head] + [(b, w) for b in blocks for w in layout.block] + \
               [(base, w) for w in layout.tail]
    for tensor, (module, weight) in zip(packed, expected):
        try:
            named = module.get_parameter(weight.path)
        except AttributeError:
            named = None
        assert (tensor is None) == (named is None), weight.path
        if named is not None:
            assert torch.equal(tensor, named.T if weight.transposed else named), weight.path


def test_weights_h_is_generated_from_the_layouts():
    """Every weight of the tables has its enum in weights.h, in the table's order, and the time mix's params are a
    block's (the C code's _Static_assert relies on it)."""
    for step in STEPS.values():
        layout, header = step.LAYOUT, dict(step.SOURCES.generated)["weights.h"]
        for prefix, weights in ((f"{layout.prefix}_HEAD_", layout.head), (f"{layout.prefix}_", layout.block),
                                (f"{layout.prefix}_TAIL_", layout.tail)):
            places = [header.index(f" {prefix}{w.name},") for w in weights]
            assert places == sorted(places), prefix
    r7 = [(w.name, w.path) for w in rwkv7_step.LAYOUT.block]
    start = r7.index(("W0", "att.w0"))
    assert r7[start:start + len(rwkv7_step.TIME_MIX)] == [(w.name, "att." + w.path) for w in rwkv7_step.TIME_MIX]


def test_the_sizes_are_passed_by_name():
    """A step's dims array is built from its sizes by name (Layout.sizes, in the order of weights.h's *_DIM_ enums);
    a size left out or unknown is an error, not a shifted array."""
    layout = mamba_step.LAYOUT
    sizes = dict(C=1, D=2, N=3, K=4, R=5, L=6, BF16=0)
    assert layout.sizes(**sizes) == [1, 2, 3, 4, 5, 6, 0]
    enum = "enum { M_DIM_C, M_DIM_D, M_DIM_N, M_DIM_K, M_DIM_R, M_DIM_L, M_DIM_BF16, M_DIMS };"
    assert enum in decode.weights_header([layout])
    with pytest.raises(TypeError, match="M dims: expected"):
        layout.sizes(**{**sizes, "E": 1})
