"""A decoding step of a whole model in one call to the C library (models/native/decode.c): the models' forward takes
it for one token of one sequence on a CPU. Also RWKV-7's time mix after its matrix products in C
(models/native/rwkv7_time_mix.c), which its TimeMix takes for prompts on a CPU without gradients (``time_mix_path``).

Why: decoding reads every weight once per token. Written as torch ops, a step adds to that read about a thousand
small ops (layer norms, token-shift mixes, gates, the recurrence's step), each some microseconds of dispatch, which
cost 30-60% more than the read itself (benchmarks/results/models.md). models/native/decode.c does the step's matrix
products at the memory's speed and the rest in a few microseconds per layer, on torch's thread count.

When: the dispatcher of kernels/backends.py decides, between two backends of the same kind as the ops' ("c", this
path, and "ops", the model's torch modules with each op on the forward's backend): ``step_path(model, input_ids,
state, backend)`` for a forward call, ``time_mix_path`` for RWKV-7's time mix. "c" takes input_ids of shape (1, 1)
(the step; the time mix any) on a CPU, fp32 or bf16 weights (each tensor its own: a bf16 model may keep its decays
fp32, as transformers and fla do, and each weight reaches the C code with its own dtype flag), the state (if given)
fp32 or bf16, backend None or "c", the C library available, no gradient asked for (grad mode off, or no parameter or
state that requires one), the published RWKV-7 (not wide_in_context_rate) and no hidden states asked for. Every other
call runs the torch ops (``CStep.verify`` says why, ``backends.refusals`` lists it). Both compute the same function:
the step here in fp32 from the weights as stored (a bf16 model's torch ops round to bf16 after each op, so its logits
differ by bf16's rounding); tests/test_models_decode.py checks each model's step against its torch forward, float64
included.

The C side is written once: ENTRIES is parsed from models/native/decode.h, the entry points' one signature table,
from which their ctypes types come and by which the calls pass arguments by name;
LAYOUTS and TIME_MIX list each model's sizes and weights in the order the C code reads them, from which
``weights_header`` generates the enums the C code reads (weights.h, written beside the build), and ``Layout.sizes``
and ``Layout.pack`` the arrays it is passed. SOURCES hands models/native/ (with the kernels' C loops, which the
steps run) to the kernels' builder (kernels/native.py), which builds them into a library of their own.

Threads: torch's own OpenMP threads (models/native/decode.c says why). Like torch's parallel ops, the step cannot use
more than one thread in a child forked after the parent has used them (libgomp's threads do not survive a fork: a
torch matmul hangs there too); with one thread, as DataLoader workers have, it runs.

Each step reads the parameters' addresses afresh (a few hundred pointers, some microseconds), so a model whose
weights are replaced or moved needs nothing else; the recurrences' state is read from the tensors passed in and
written to new ones (the state passed in is never modified, as in the torch path).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch

from seqmix.kernels import c_abi, native
from seqmix.kernels.wkv7.c import MAX_HEAD as WKV7_MAX_HEAD
from seqmix.kernels.backends import Backend, Call, Refusal, Unavailable, describe, dispatch
from seqmix.kernels.shared import TORCH_DTYPES, needs_grad, new_output

__all__ = ["CStep", "TorchOps", "STEP", "TIME_MIX_PATH", "step_path", "time_mix_path", "rwkv4_step", "rwkv7_step",
           "mamba_step", "rwkv7_time_mix", "ENTRIES", "LAYOUTS", "TIME_MIX", "SOURCES", "Weight", "Layout",
           "weights_header", "library"]

DTYPES = {torch.float32: 0, torch.bfloat16: 1}        # the weights' dtypes the C step reads (value: its bf16 flag)

NATIVE = Path(__file__).with_name("native")
# The entry points of models/native/: decode.h is their one signature table (as native.h is the kernels')
ENTRIES = c_abi.table((NATIVE / "decode.h").read_text())


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


def _w(name: str, path: str, **how) -> Weight:
    return Weight(name, path, **how)


# RWKV-7's time mix's per-channel parameters (paths from a TimeMix), in the order rwkv7_time_mix reads them
TIME_MIX = (_w("W0", "w0", contiguous=True), _w("A0", "a0", contiguous=True),
            _w("V0", "v0", optional=True, contiguous=True), _w("K_K", "k_k", contiguous=True),
            _w("K_A", "k_a", contiguous=True), _w("R_K", "r_k", contiguous=True),
            _w("LN_X_W", "ln_x.weight", contiguous=True), _w("LN_X_B", "ln_x.bias", contiguous=True))

# Each model's step: its sizes (BF16: the embedding's dtype, the activations' and RWKV-7's x_prev states'), and its
# weights in the order the step reads them (transformers' names for RWKV-4 and Mamba, BlinkDL's for RWKV-7); a 2-D
# tensor the C code reads by element (Mamba's conv weight and A_log; RWKV-7's r_k) is contiguous
LAYOUTS = {
    "rwkv4": Layout("R4", "blocks", dims=("C", "A", "F", "L", "RESCALE_EVERY", "BF16"),
                    head=(_w("PRE_LN_W", "blocks.0.pre_ln.weight"), _w("PRE_LN_B", "blocks.0.pre_ln.bias")),
                    block=(_w("LN1_W", "ln1.weight"), _w("LN1_B", "ln1.bias"), _w("LN2_W", "ln2.weight"),
                           _w("LN2_B", "ln2.bias"), _w("DECAY", "attention.time_decay"),
                           _w("FIRST", "attention.time_first"), _w("MIX_K", "attention.time_mix_key"),
                           _w("MIX_V", "attention.time_mix_value"), _w("MIX_R", "attention.time_mix_receptance"),
                           _w("KEY", "attention.key.weight"), _w("VALUE", "attention.value.weight"),
                           _w("RECEPTANCE", "attention.receptance.weight"), _w("OUTPUT", "attention.output.weight"),
                           _w("FFN_MIX_K", "feed_forward.time_mix_key"),
                           _w("FFN_MIX_R", "feed_forward.time_mix_receptance"),
                           _w("FFN_KEY", "feed_forward.key.weight"),
                           _w("FFN_RECEPTANCE", "feed_forward.receptance.weight"),
                           _w("FFN_VALUE", "feed_forward.value.weight")),
                    tail=(_w("LN_OUT_W", "ln_out.weight"), _w("LN_OUT_B", "ln_out.bias"))),
    "rwkv7": Layout("R7", "blocks", dims=("C", "H", "N", "F", "L", "DW", "DA", "DV", "DG", "BF16"),
                    head=(_w("LN0_W", "blocks.0.ln0.weight"), _w("LN0_B", "blocks.0.ln0.bias")),
                    block=(_w("LN1_W", "ln1.weight"), _w("LN1_B", "ln1.bias"), _w("LN2_W", "ln2.weight"),
                           _w("LN2_B", "ln2.bias"), _w("X_R", "att.x_r"), _w("X_W", "att.x_w"),
                           _w("X_K", "att.x_k"), _w("X_V", "att.x_v"), _w("X_A", "att.x_a"), _w("X_G", "att.x_g"),
                           *(Weight(w.name, "att." + w.path, w.optional, w.transposed, w.contiguous)
                             for w in TIME_MIX),
                           _w("W1", "att.w1", transposed=True), _w("W2", "att.w2", transposed=True),
                           _w("A1", "att.a1", transposed=True), _w("A2", "att.a2", transposed=True),
                           _w("V1", "att.v1", optional=True, transposed=True),
                           _w("V2", "att.v2", optional=True, transposed=True),
                           _w("G1", "att.g1", transposed=True), _w("G2", "att.g2", transposed=True),
                           _w("RECEPTANCE", "att.receptance.weight"), _w("KEY", "att.key.weight"),
                           _w("VALUE", "att.value.weight"), _w("OUTPUT", "att.output.weight"),
                           _w("FFN_X_K", "ffn.x_k"), _w("FFN_KEY", "ffn.key.weight"),
                           _w("FFN_VALUE", "ffn.value.weight")),
                    tail=(_w("LN_OUT_W", "ln_out.weight"), _w("LN_OUT_B", "ln_out.bias"))),
    "mamba": Layout("M", "layers", dims=("C", "D", "N", "K", "R", "L", "BF16"), head=(),
                    block=(_w("NORM", "norm.weight"), _w("IN_PROJ", "mixer.in_proj.weight"),
                           _w("IN_PROJ_B", "mixer.in_proj.bias"),
                           _w("CONV", "mixer.conv1d.weight", contiguous=True), _w("CONV_B", "mixer.conv1d.bias"),
                           _w("X_PROJ", "mixer.x_proj.weight"), _w("DT_PROJ", "mixer.dt_proj.weight"),
                           _w("DT_PROJ_B", "mixer.dt_proj.bias"), _w("A_LOG", "mixer.A_log", contiguous=True),
                           _w("D", "mixer.D"), _w("OUT_PROJ", "mixer.out_proj.weight"),
                           _w("OUT_PROJ_B", "mixer.out_proj.bias")),
                    tail=(_w("NORM_F_W", "norm_f.weight"),)),
}


def weights_header() -> str:
    """weights.h, which models/native/ includes: the enums of LAYOUTS and TIME_MIX (MIX_*), generated from them."""
    enums = [_enum("MIX_", [w.name for w in TIME_MIX], "MIX_PARAMS")]
    enums += [e for layout in LAYOUTS.values() for e in layout.enums()]
    return ("/* Generated by models/decode.py (weights_header) from its tables LAYOUTS and TIME_MIX: each model's\n"
            " * weights in the order its step is passed them. Not a file of the repository: written beside each\n"
            " * build. */\n"
            "#ifndef SEQMIX_MODELS_WEIGHTS_H\n#define SEQMIX_MODELS_WEIGHTS_H\n\n" + "\n".join(enums) + "\n\n#endif\n")


# The library of the steps: models/native/ with the kernels' C sources (the loops the steps run), by their builder
SOURCES = native.Sources("decode", (*native.KERNELS.files, *(NATIVE / name for name in
                                                              ("steps.h", "decode.h", "decode.c", "rwkv7_time_mix.c"))),
                         tuple(ENTRIES.values()), generated=(("weights.h", weights_header()),))


def library() -> ctypes.CDLL:
    """The steps' library (SOURCES), built on first use; raises native.NativeUnavailable when it cannot be had."""
    return native.load(SOURCES)


def _invoke(entry: str, inputs: str = "", **named) -> None:
    """The entry point ``entry`` with the arguments ``named`` (by their names in ENTRIES); raises what a non-zero
    status means, ``inputs`` naming the call's."""
    status = getattr(library(), entry)(*ENTRIES[entry].arguments(named))
    native.check_status(status, entry, inputs)


def _bf16_flags(tensors) -> ctypes.Array:
    """Each tensor's dtype flag (DTYPES; None: 0) as a C array, beside the tensors' pointers."""
    return (ctypes.c_int64 * len(tensors))(*(0 if t is None else DTYPES[t.dtype] for t in tensors))


class CStep(Backend):
    """models/native/decode.c: a whole model's decoding step (``step=True``: one token of one sequence), or RWKV-7's
    time mix after its matrix products; inference on a CPU. Verifies a Call of ``step_path`` or ``time_mix_path``."""
    name = "c"

    def __init__(self, step: bool):
        super().__init__(when="one token of one sequence on a CPU, fp32 or bf16 weights and state, no gradient, "
                              "backend None or \"c\"" if step else
                              "a CPU, fp32 or bf16 weights, no gradient, backend None or \"c\"")
        self.step = step

    def verify(self, call):
        f = call.facts
        if f.get("wide_in_context_rate"):
            return Refusal("computes the published RWKV-7 only, not wide_in_context_rate")
        if f.get("gate") is False:
            return Refusal("computes Mamba's gated block only, not gate=False")
        if f.get("output_hidden_states"):
            return Refusal("returns no hidden states")
        if self.step and f["tokens"] != (1, 1):
            return Refusal(f"takes one token of one sequence, input_ids of shape (1, 1), got {f['tokens']}")
        if call.asked not in (None, "c"):
            return Refusal(f"runs for backend None or 'c' only, got {call.asked!r}")
        if call.device.type != "cpu" or not f["weight_dtypes"] <= set(DTYPES):
            return Refusal(f"takes CPU weights in fp32 or bf16, got {call.device} and "
                           f"{sorted(str(d) for d in f['weight_dtypes'])}")
        if f.get("head_size", 0) > WKV7_MAX_HEAD:
            return Refusal(f"takes head sizes N <= {WKV7_MAX_HEAD}, got N = {f['head_size']}")
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
TIME_MIX_PATH = (CStep(step=False), TorchOps())   # RWKV-7's time mix after its matrix products


def _path_call(op: str, module: torch.nn.Module, backend, tensors, **facts) -> Call:
    """The Call CStep verifies: the module's weights (device, dtypes), whether a gradient is wanted of them or of
    ``tensors``, the forward's backend argument, and ``facts``."""
    params = list(module.parameters())
    off_cpu = next((p.device for p in params if p.device.type != "cpu"), torch.device("cpu"))
    return Call(op, off_cpu, params[0].dtype if params else torch.float32,
                {"weight_dtypes": {p.dtype for p in params}, **facts}, needs_grad(*tensors, *params), backend)


def step_path(model: torch.nn.Module, input_ids: torch.Tensor, state, backend, *,
              output_hidden_states: bool = False) -> str:
    """Which path a forward call of ``model`` on ``input_ids`` from ``state`` takes: "c" (one C call, rwkv4_step,
    rwkv7_step or mamba_step) or "ops" (the torch modules). {STEP}

    Args:
        model: RwkvModel, Rwkv7 or MambaModel. input_ids: the checked token ids (B, T). state: the checked state,
            or None. backend: the forward's backend argument. output_hidden_states: whether they are asked for.

    Returns:
        "c" or "ops".
    """
    states = [] if state is None else torch.utils._pytree.tree_leaves(state)
    config = model.config
    # the state among the inputs: a trainable state with frozen weights ("state tuning") needs the torch path
    call = _path_call("decode_step", model, backend, states, tokens=tuple(input_ids.shape),
                      state_dtypes={s.dtype for s in states}, head_size=getattr(config, "head_size", 0),
                      wide_in_context_rate=getattr(config, "wide_in_context_rate", False),
                      gate=getattr(config, "gate", True),
                      output_hidden_states=output_hidden_states)
    return dispatch(call, None, STEP)


def time_mix_path(att: torch.nn.Module, backend, *inputs: torch.Tensor) -> str:
    """Which path RWKV-7's time mix ``att`` takes after its matrix products: "c" (rwkv7_time_mix) or "ops".
    {TIME_MIX_PATH}

    Args:
        att: the TimeMix. backend: the forward's backend argument. inputs: every tensor the C code would read besides
            the parameters (None skipped), the state's kv included.

    Returns:
        "c" or "ops".
    """
    call = _path_call("rwkv7_time_mix", att, backend, inputs, head_size=att.r_k.shape[1],
                      wide_in_context_rate=att.wide_in_context_rate)
    return dispatch(call, None, TIME_MIX_PATH)


if step_path.__doc__:   # (python -OO drops docstrings) the order, in the dispatcher's words
    step_path.__doc__ = step_path.__doc__.replace("{STEP}", describe("decode_step", STEP, LEAD))
    time_mix_path.__doc__ = time_mix_path.__doc__.replace("{TIME_MIX_PATH}",
                                                          describe("rwkv7_time_mix", TIME_MIX_PATH, LEAD))


def _pointers(tensors) -> ctypes.Array:
    """The tensors' addresses as a C array of pointers (None: NULL); each must be contiguous."""
    for t in tensors:
        if t is not None and not t.is_contiguous():
            raise ValueError(f"the C decoding step needs contiguous parameters (or, for a matrix, its transpose "
                             f"contiguous), got one of shape {tuple(t.shape)} and strides {t.stride()}; call "
                             f".contiguous() on it, or pass backend='torch'")
    return (ctypes.c_void_p * len(tensors))(*native.pointers(*tensors))


def _matrices(tensors) -> tuple[ctypes.Array, ctypes.Array, ctypes.Array]:
    """The weights' addresses as a C array of pointers (None: NULL), per weight whether it is stored as its
    transpose (a 2-D view whose .t() is contiguous: fla's RWKV-7 LoRA matrices, models/native/decode.c's matvec), and
    per weight its dtype flag. The 2-D tensors the C code reads by element (Mamba's A_log, RWKV-7's r_k) come
    contiguous (LAYOUTS says so)."""
    flags = [int(t is not None and not t.is_contiguous() and t.dim() == 2 and t.t().is_contiguous()) for t in tensors]
    return (_pointers([t.t() if flag else t for t, flag in zip(tensors, flags)]),
            (ctypes.c_int64 * len(flags))(*flags), _bf16_flags(tensors))


def _call(entry: str, dims: list, eps: dict, weights: list, embedding: torch.Tensor, state: list,
          new_state: list) -> torch.Tensor:
    """models/native/decode.c's ``entry`` on one token (``eps``: its eps arguments by name): the final norm's output
    (1, 1, C) in the model's dtype."""
    hidden = new_output((embedding.numel(),), torch.float32, embedding.device)
    pointers, transposed, weight_bf16 = _matrices(weights)
    _invoke(entry, threads=torch.get_num_threads(), dims=(ctypes.c_int64 * len(dims))(*dims), **eps,
            weights=pointers, transposed=transposed, weight_bf16=weight_bf16, embedding=embedding,
            state_in=_pointers(state), state_out=_pointers(new_state), hidden=hidden)
    return hidden.to(embedding.dtype).view(1, 1, -1)


def _states(tensors, dtypes) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The state's tensors as the step reads them, each in its dtype of ``dtypes`` (the C code reads each kind in one
    dtype, as the torch path returns it) and contiguous (the torch path's conv windows are views), and new ones of the
    same shapes for the step to write."""
    old = [t.to(dtype).contiguous() for t, dtype in zip(tensors, dtypes)]
    return old, [new_output(t.shape, t.dtype, t.device) for t in old]


def rwkv4_step(model, token: torch.Tensor, state: list[torch.Tensor] | None, rescale_every: int
               ) -> tuple[torch.Tensor, list]:
    """One token through RwkvModel (models/rwkv4.py) in C.

    Args:
        model: the RwkvModel. token: (1, 1) token id. state: the five (1, C or A, L) fp32 tensors, or None.
        rescale_every: as the forward rescales (0 in training mode: never).

    Returns:
        (ln_out's output (1, 1, C) in the model's dtype, the new state: five new tensors).
    """
    cfg = model.config
    state = model.initial_state(1) if state is None else state
    weights = LAYOUTS["rwkv4"].pack(model)
    embedding = model.embeddings.weight[token.reshape(())].contiguous()
    dims = LAYOUTS["rwkv4"].sizes(C=cfg.hidden_size, A=cfg.attention_hidden_size, F=cfg.intermediate_size,
                                  L=cfg.num_hidden_layers, RESCALE_EVERY=rescale_every, BF16=DTYPES[embedding.dtype])
    state, new_state = _states(state, [torch.float32] * len(state))
    hidden = _call("rwkv4_decode", dims, dict(eps=cfg.layer_norm_epsilon), weights, embedding, state, new_state)
    return hidden, new_state


def rwkv7_time_mix(att, r, k, v, v_first, wl, al, vl, g, state) -> tuple[torch.Tensor, torch.Tensor]:
    """RWKV-7's time mix between its matrix products (models/rwkv7.py's TimeMix._mix, the same arguments) in C: one
    pass per (batch row, head) over its tokens, the recurrence included, on torch's thread count.

    Args:
        att: the TimeMix. r, k, v, wl, al, g: (B, T, C), read in r's dtype; v_first, vl: the same, or None in
            block 0. state: (B, H, N, N) fp32.

    Returns:
        (GroupNorm(y) + bonus, times g: (B, T, C) in the model's dtype; the new state (B, H, N, N) fp32).
    """
    B, T, C = r.shape
    H, N = att.r_k.shape
    acts = [None if t is None else t.to(r.dtype).contiguous() for t in (r, k, v, v_first, wl, al, vl, g)]
    new_state = native.initial_state(state, state.shape)
    out, params = new_output(r.shape, r.dtype, r.device), [w.of(att) for w in TIME_MIX]   # params: held for the call
    _invoke("rwkv7_time_mix", f"r_k of shape {tuple(att.r_k.shape)}", threads=torch.get_num_threads(), B=B, T=T, H=H,
            N=N, act_bf16=DTYPES[r.dtype], **dict(zip(("r", "k", "v", "v_first", "wl", "al", "vl", "g"), acts)),
            params=_pointers(params), params_bf16=_bf16_flags(params), group_eps=att.ln_x.eps, state=new_state,
            out=out)
    return out, new_state


def rwkv7_step(model, token: torch.Tensor, state: list | None) -> tuple[torch.Tensor, list]:
    """One token through Rwkv7 (models/rwkv7.py) in C, up to ln_out.

    Args:
        model: the Rwkv7. token: (1, 1) token id. state: per layer (att_x_prev (1, C) in the model's dtype, att_kv
            (1, H, N, N) fp32, ffn_x_prev (1, C)), or None.

    Returns:
        (ln_out's output (1, 1, C) in the model's dtype, the new state: new tensors, the same layout).
    """
    cfg = model.config
    state = model.initial_state(1) if state is None else state
    weights = LAYOUTS["rwkv7"].pack(model)
    embedding = model.emb.weight[token.reshape(())].contiguous()
    dims = LAYOUTS["rwkv7"].sizes(C=cfg.n_embd, H=cfg.n_head, N=cfg.head_size, F=cfg.dim_ffn, L=cfg.n_layer,
                                  DW=cfg.decay_lora, DA=cfg.a_lora, DV=cfg.v_lora, DG=cfg.gate_lora,
                                  BF16=DTYPES[embedding.dtype])
    # att_x_prev, ffn_x_prev in the activations' dtype (the embedding's), att_kv fp32
    state, new_state = _states([s for layer in state for s in layer],
                               [embedding.dtype, torch.float32, embedding.dtype] * len(state))
    hidden = _call("rwkv7_decode", dims, dict(eps=cfg.layer_norm_epsilon, group_eps=cfg.group_norm_epsilon), weights,
                   embedding, state, new_state)
    return hidden, [tuple(new_state[i:i + 3]) for i in range(0, len(new_state), 3)]


def mamba_step(model, token: torch.Tensor, state: list | None) -> tuple[torch.Tensor, list]:
    """One token through MambaModel (models/mamba.py) in C, up to norm_f.

    Args:
        model: the MambaModel. token: (1, 1) token id. state: per block (conv window (1, D, K - 1), h (1, D, N)),
            fp32, or None.

    Returns:
        (norm_f's output (1, 1, C) in the model's dtype, the new state: new tensors, the same layout).
    """
    cfg = model.config
    state = model.initial_state(1) if state is None else state
    weights = LAYOUTS["mamba"].pack(model)
    embedding = model.embeddings.weight[token.reshape(())].contiguous()
    dims = LAYOUTS["mamba"].sizes(C=cfg.hidden_size, D=cfg.intermediate_size, N=cfg.state_size, K=cfg.conv_kernel,
                                  R=cfg.time_step_rank, L=cfg.num_hidden_layers, BF16=DTYPES[embedding.dtype])
    state, new_state = _states([s for layer in state for s in layer], [torch.float32] * 2 * len(state))
    hidden = _call("mamba_decode", dims, dict(eps=cfg.layer_norm_epsilon), weights, embedding, state, new_state)
    return hidden, [tuple(new_state[i:i + 2]) for i in range(0, len(new_state), 2)]
