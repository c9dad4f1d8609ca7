"""What every model's C path shares: a decoding step of a whole model in one call to a C library (a model's
<model>_step.c), which the models' forward takes for one token of one sequence on a CPU, and a model's part in C
(RWKV-7's time mix after its matrix products, models/rwkv7/rwkv7_time_mix.c), which its module takes for prompts on a
CPU without gradients. Each model owns its C step, its weight layout and its binding beside its torch modules
(models/<model>/step.py, <model>_step.c, <model>_step.h); this module is the machinery they share.

Why: decoding reads every weight once per token. Written as torch ops, a step adds to that read about a thousand
small ops (layer norms, token-shift mixes, gates, the recurrence's step), each some microseconds of dispatch, which
cost 30-60% more than the read itself (benchmarks/results/models.md). A C step does the step's matrix products at the
memory's speed and the rest in a few microseconds per layer, on torch's thread count (models/native/steps.h).

When: the dispatcher of kernels/backends.py decides, between two backends of the same kind as the ops' ("c", this
path, and "ops", the model's torch modules with each op on the forward's backend): ``step_path(model, input_ids,
state, backend)`` for a forward call, ``part_path`` for a model's part. "c" takes input_ids of shape (1, 1) (the step;
a part any) on a CPU, fp32 or bf16 weights (each tensor its own: a bf16 model may keep its decays fp32, as
transformers and fla do, and each weight reaches the C code with its own dtype flag), the state (if given) fp32 or
bf16, backend None or "c", the C library available, no gradient asked for (grad mode off, or no parameter or state
that requires one), no variant of the model its C code does not compute and no size beyond its limits (each model's
step.py says which: ``variant`` and ``limit``), and no hidden states asked for. Every other call runs the torch ops
(``CStep.verify`` says why, ``backends.refusals`` lists it). Both compute the same function: the step here in fp32
from the weights as stored (a bf16 model's torch ops round to bf16 after each op, so its logits differ by bf16's
rounding); tests/models/test_models_decode.py checks each model's step against its torch forward, float64 included.

The C side is written once per model: its header is the entry points' one signature table, from which their ctypes
types come and by which the calls pass arguments by name; its ``Layout`` lists its sizes and weights in the order
the C code reads them, from which ``weights_header`` generates the enums the C code reads (weights.h, written beside
the build), and ``Layout.sizes`` and ``Layout.pack`` the arrays it is passed. ``step_sources`` hands a model's C files
with models/native/steps.h and the kernels' C loops (which the steps run) to the kernels' builder
(kernels/native.py), which builds them into a library of the model's own.

Threads: torch's own OpenMP threads (models/native/steps.h says why). Like torch's parallel ops, the step cannot use
more than one thread in a child forked after the parent has used them (libgomp's threads do not survive a fork: a
torch matmul hangs there too); with one thread, as DataLoader workers have, it runs.

Each step reads the parameters' addresses afresh (a few hundred pointers, some microseconds), so a model whose
weights are replaced or moved needs nothing else; the recurrences' state is read from the tensors passed in and
written to new ones (the state passed in is never modified, as in the torch path).
"""
from __future__ import annotations

import ctypes
import importlib
from dataclasses import dataclass
from pathlib import Path

import torch

from ..kernels import c_abi, native
from ..kernels.backends import Backend, Call, Refusal, Unavailable, describe, dispatch
from ..kernels.shared import TORCH_DTYPES, needs_grad, new_output

__all__ = ["CStep", "TorchOps", "STEP", "PART", "LEAD", "step_path", "part_path", "Weight", "Layout", "weight",
           "weights_header", "step_sources", "entries", "library", "every_step", "invoke", "call_step", "step_states",
           "pointers", "bf16_flags", "DTYPES", "NATIVE"]

DTYPES = {torch.float32: 0, torch.bfloat16: 1}        # the weights' dtypes the C step reads (value: its bf16 flag)

NATIVE = Path(__file__).with_name("native")           # what every model's C step shares: steps.h


@dataclass(frozen=True)
class Weight:
    """A weight a C step reads: ``name`` (its enum in weights.h, after the layout's prefix) and ``path`` (attributes
    from the model, or from a block). ``optional``: absent (block 0's v0, v1, v2) gives NULL, as None does (a bias
    left out); ``transposed``: passed as its transpose (RWKV-7's LoRA products x @ m as m^T x); ``contiguous``: read
    by element, so passed as a contiguous copy where it is not one."""
    name: str
    path: str
    optional: bool = False
    transposed: bool = False
    contiguous: bool = False

    def of(self, module: torch.nn.Module):
        """This weight of ``module`` as the C code takes it (None: NULL)."""
        value = module
        for part in self.path.split("."):
            value = getattr(value, part, None) if self.optional else getattr(value, part)
            if value is None:
                return None
        value = value.T if self.transposed else value
        return value.contiguous() if self.contiguous else value


@dataclass(frozen=True)
class Layout:
    """A model's step as its C code reads it: its sizes (``dims``, the dims array's order), its weights in order:
    ``head`` (paths from the model) before the blocks, ``block`` (paths from each of the model's ``blocks``), ``tail``
    after; ``prefix`` names their enums in weights.h: <prefix>_DIM_<name> .. <prefix>_DIMS, <prefix>_HEAD_<name> ..
    <prefix>_HEAD, <prefix>_<name> .. <prefix>_WEIGHTS, <prefix>_TAIL_<name> .. <prefix>_TAIL."""
    prefix: str
    blocks: str
    dims: tuple[str, ...]
    head: tuple[Weight, ...]
    block: tuple[Weight, ...]
    tail: tuple[Weight, ...]

    def sizes(self, **named: int) -> list[int]:
        """The dims array from the sizes by name (each of ``dims``, no other)."""
        if set(named) != set(self.dims):
            raise TypeError(f"{self.prefix} dims: expected {list(self.dims)}, got {sorted(named)}")
        return [int(named[name]) for name in self.dims]

    def pack(self, model: torch.nn.Module) -> list:
        """The model's weights in this order (None: NULL)."""
        return [*(w.of(model) for w in self.head), *(w.of(b) for b in getattr(model, self.blocks) for w in self.block),
                *(w.of(model) for w in self.tail)]

    def enums(self) -> list[str]:
        """The four enums of weights.h for this layout."""
        return [_enum(f"{self.prefix}_DIM_", self.dims, f"{self.prefix}_DIMS"),
                _enum(f"{self.prefix}_HEAD_", [w.name for w in self.head], f"{self.prefix}_HEAD"),
                _enum(f"{self.prefix}_", [w.name for w in self.block], f"{self.prefix}_WEIGHTS"),
                _enum(f"{self.prefix}_TAIL_", [w.name for w in self.tail], f"{self.prefix}_TAIL")]


def _enum(prefix: str, names, count: str) -> str:
    """enum { <prefix><name>, ..., <count> }; wrapped at 120 columns."""
    lines, line = [], "enum {"
    for name in [prefix + name for name in names] + [count]:
        item = f" {name}," if name != count else f" {name} }};"
        if len(line) + len(item) > 120:
            lines.append(line)
            line = "      "
        line += item
    return "\n".join([*lines, line])


def weight(name: str, path: str, **how) -> Weight:
    """Weight(name, path, **how): a layout's table reads shorter with it."""
    return Weight(name, path, **how)



def weights_header(layouts, params: dict | None = None) -> str:
    """weights.h, which a model's C step includes: the enums of its ``layouts`` and of ``params`` ({prefix: weights}:
    a part's parameters, RWKV-7's MIX_*), generated from them."""
    enums = [_enum(f"{prefix}_", [w.name for w in weights], f"{prefix}_PARAMS") for prefix, weights in
             (params or {}).items()]
    enums += [e for layout in layouts for e in layout.enums()]
    return ("/* Generated by models/decode.py (weights_header) from a model's tables (its step.py's LAYOUT): its\n"
            " * weights in the order its step is passed them. Not a file of the repository: written beside each\n"
            " * build. */\n"
            "#ifndef SEQMIX_MODELS_WEIGHTS_H\n#define SEQMIX_MODELS_WEIGHTS_H\n\n" + "\n".join(enums) + "\n\n#endif\n")


def entries(header: Path) -> dict[str, c_abi.Entry]:
    """A model's C entry points, from its header (the one signature table, parsed by kernels/c_abi.py)."""
    return c_abi.table(header.read_text())


def step_sources(name: str, header: Path, c_files: tuple[Path, ...], layouts, params: dict | None = None
                 ) -> native.Sources:
    """A model's C library: its C files and header, with models/native/steps.h and the kernels' sources (the loops
    the steps run), and its weights.h generated from ``layouts`` and ``params`` (weights_header), for the kernels'
    builder; ``name`` names the cached library."""
    return native.Sources(name, (*native.KERNELS.files, NATIVE / "steps.h", header, *c_files),
                          tuple(entries(header).values()),
                          generated=(("weights.h", weights_header(layouts, params)),))


def library(sources: native.Sources) -> ctypes.CDLL:
    """A model's library, built on first use; raises native.NativeUnavailable when it cannot be had."""
    return native.load(sources)


def every_step() -> list[native.Sources]:
    """The library of every model that has a C step (a package of seqmix.models with a step.py), found by its
    folder: for a caller that builds them all at once (tests/conftest.py)."""
    folder = Path(__file__).parent
    return [importlib.import_module(f"{__package__}.{child.name}.step").SOURCES for child in sorted(folder.iterdir())
            if (child / "step.py").is_file()]


def invoke(sources: native.Sources, entry: str, inputs: str = "", **named) -> None:
    """The entry point ``entry`` of the library of ``sources`` with the arguments ``named`` (by their names in its
    table); raises what a non-zero status means, ``inputs`` naming the call's."""
    table = {e.name: e for e in sources.entries}
    status = getattr(library(sources), entry)(*table[entry].arguments(named))
    native.check_status(status, entry, inputs)


def bf16_flags(tensors) -> ctypes.Array:
    """Each tensor's dtype flag (DTYPES; None: 0) as a C array, beside the tensors' pointers."""
    return (ctypes.c_int64 * len(tensors))(*(0 if t is None else DTYPES[t.dtype] for t in tensors))


class CStep(Backend):
    """A model's C step: a whole model's decoding step (``step=True``: one token of one sequence), or a part of a
    model (RWKV-7's time mix after its matrix products); inference on a CPU. Verifies a Call of ``step_path`` or
    ``part_path``, whose facts carry the model's own ``variant`` and ``limit`` refusals (its step.py's)."""
    name = "c"

    def __init__(self, step: bool):
        super().__init__(when="one token of one sequence on a CPU, fp32 or bf16 weights and state, no gradient, "
                              "backend None or \"c\"" if step else
                              "a CPU, fp32 or bf16 weights, no gradient, backend None or \"c\"")
        self.step = step

    def verify(self, call):
        f = call.facts
        if f.get("variant"):             # a variant of the model its C code does not compute
            return Refusal(f["variant"])
        if f.get("output_hidden_states"):
            return Refusal("returns no hidden states")
        if self.step and f["tokens"] != (1, 1):
            return Refusal(f"takes one token of one sequence, input_ids of shape (1, 1), got {f['tokens']}")
        if call.asked not in (None, "c"):
            return Refusal(f"runs for backend None or 'c' only, got {call.asked!r}")
        if call.device.type != "cpu" or not f["weight_dtypes"] <= set(DTYPES):
            return Refusal(f"takes CPU weights in fp32 or bf16, got {call.device} and "
                           f"{sorted(str(d) for d in f['weight_dtypes'])}")
        if f.get("limit"):               # a size beyond what the model's C code takes
            return Refusal(f["limit"])
        if not native.available():       # says once why not (a RuntimeWarning)
            return Unavailable(f"is not available here: {native.unavailable_reason()}")
        if call.grad:   # the C code has no backward: every tensor that enters it, a state included, counts
            return Refusal("has no backward, and a gradient is wanted")
        if not f.get("state_dtypes", set()) <= set(DTYPES):
            return Refusal(f"takes a state in fp32 or bf16, got {sorted(str(d) for d in f['state_dtypes'])}")
        return None


class TorchOps(Backend):
    """The model's torch modules, each op on the forward's own backend (kernels/backends.py decides each)."""
    name = "ops"
    dtypes = TORCH_DTYPES
    when = "any other call: the torch modules, each op on its own backend"

    def verify(self, call):
        return None


LEAD = "A call takes the first path that takes it"   # describe()'s opening for these paths (no backend argument)
STEP = (CStep(step=True), TorchOps())          # a model's forward call
PART = (CStep(step=False), TorchOps())          # a model's part in C (RWKV-7's time mix after its matrix products)


def _path_call(op: str, module: torch.nn.Module, backend, tensors, **facts) -> Call:
    """The Call CStep verifies: the module's weights (device, dtypes), whether a gradient is wanted of them or of
    ``tensors``, the forward's backend argument, and ``facts``."""
    params = list(module.parameters())
    off_cpu = next((p.device for p in params if p.device.type != "cpu"), torch.device("cpu"))
    return Call(op, off_cpu, params[0].dtype if params else torch.float32,
                {"weight_dtypes": {p.dtype for p in params}, **facts}, needs_grad(*tensors, *params), backend)


def _leaves(state) -> list[torch.Tensor]:
    """The tensors of a state: a tensor, or nested lists and tuples of them."""
    if isinstance(state, torch.Tensor):
        return [state]
    return [leaf for part in state for leaf in _leaves(part)] if isinstance(state, (list, tuple)) else []


def step_path(model: torch.nn.Module, input_ids: torch.Tensor, state, backend, *, variant: str | None = None,
              limit: str | None = None, output_hidden_states: bool = False) -> str:
    """Which path a forward call of ``model`` on ``input_ids`` from ``state`` takes: "c" (one C call: the model's
    step.py) or "ops" (the torch modules). {STEP}

    Args:
        model: RwkvModel, Rwkv7 or MambaModel. input_ids: the checked token ids (B, T). state: the checked state,
            or None. backend: the forward's backend argument. variant, limit: the model's own refusals (its step.py's
            ``variant(config)`` and ``limit(config)``: None, or why its C code does not compute this model).
            output_hidden_states: whether they are asked for.

    Returns:
        "c" or "ops".
    """
    states = [] if state is None else _leaves(state)
    # the state among the inputs: a trainable state with frozen weights ("state tuning") needs the torch path
    call = _path_call("decode_step", model, backend, states, tokens=tuple(input_ids.shape),
                      state_dtypes={s.dtype for s in states}, variant=variant, limit=limit,
                      output_hidden_states=output_hidden_states)
    return dispatch(call, None, STEP)


def part_path(op: str, module: torch.nn.Module, backend, *inputs: torch.Tensor, variant: str | None = None,
              limit: str | None = None) -> str:
    """Which path a model's part ``module`` (called ``op``: "rwkv7_time_mix") takes: "c" or "ops". {PART}

    Args:
        op: the part's name. module: the part's module (its parameters). backend: the forward's backend argument.
        inputs: every tensor the C code would read besides the parameters (None skipped), a state included.
        variant, limit: the model's own refusals, as in step_path.

    Returns:
        "c" or "ops".
    """
    call = _path_call(op, module, backend, inputs, variant=variant, limit=limit)
    return dispatch(call, None, PART)


if step_path.__doc__:   # (python -OO drops docstrings) the order, in the dispatcher's words
    step_path.__doc__ = step_path.__doc__.replace("{STEP}", describe("decode_step", STEP, LEAD))
    part_path.__doc__ = part_path.__doc__.replace("{PART}", describe("model_part", PART, LEAD))


def pointers(tensors) -> ctypes.Array:
    """The tensors' addresses as a C array of pointers (None: NULL); each must be contiguous."""
    for t in tensors:
        if t is not None and not t.is_contiguous():
            raise ValueError(f"the C decoding step needs contiguous parameters (or, for a matrix, its transpose "
                             f"contiguous), got one of shape {tuple(t.shape)} and strides {t.stride()}; call "
                             f".contiguous() on it, or pass backend='torch'")
    return (ctypes.c_void_p * len(tensors))(*native.pointers(*tensors))


def _matrices(tensors) -> tuple[ctypes.Array, ctypes.Array, ctypes.Array]:
    """The weights' addresses as a C array of pointers (None: NULL), per weight whether it is stored as its
    transpose (a 2-D view whose .t() is contiguous: fla's RWKV-7 LoRA matrices, models/native/steps.h's matvec), and
    per weight its dtype flag. The 2-D tensors the C code reads by element (Mamba's A_log, RWKV-7's r_k) come
    contiguous (the model's LAYOUT says so)."""
    flags = [int(t is not None and not t.is_contiguous() and t.dim() == 2 and t.t().is_contiguous()) for t in tensors]
    return (pointers([t.t() if flag else t for t, flag in zip(tensors, flags)]),
            (ctypes.c_int64 * len(flags))(*flags), bf16_flags(tensors))


def call_step(sources: native.Sources, entry: str, dims: list, eps: dict, weights: list, embedding: torch.Tensor,
              state: list, new_state: list) -> torch.Tensor:
    """A model's decoding step ``entry`` (of the library of ``sources``) on one token (``eps``: its eps arguments by
    name): the final norm's output (1, 1, C) in the model's dtype."""
    hidden = new_output((embedding.numel(),), torch.float32, embedding.device)
    weight_pointers, transposed, weight_bf16 = _matrices(weights)
    invoke(sources, entry, threads=torch.get_num_threads(), dims=(ctypes.c_int64 * len(dims))(*dims), **eps,
           weights=weight_pointers, transposed=transposed, weight_bf16=weight_bf16, embedding=embedding,
           state_in=pointers(state), state_out=pointers(new_state), hidden=hidden)
    return hidden.to(embedding.dtype).view(1, 1, -1)


def step_states(tensors, dtypes) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The state's tensors as the step reads them, each in its dtype of ``dtypes`` (the C code reads each kind in one
    dtype, as the torch path returns it) and contiguous (the torch path's conv windows are views), and new ones of the
    same shapes for the step to write."""
    old = [t.to(dtype).contiguous() for t, dtype in zip(tensors, dtypes)]
    return old, [new_output(t.shape, t.dtype, t.device) for t in old]
