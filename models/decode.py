"""A decoding step of a whole model in one call to the C library (kernels/decode.c): the models' forward takes it for
one token of one sequence on a CPU. Also RWKV-7's time mix after its matrix products in C (rwkv7_time_mix), which
its TimeMix takes for prompts on a CPU without gradients (``time_mix_path``).

Why: decoding reads every weight once per token. Written as torch ops, a step adds to that read about a thousand
small ops (layer norms, token-shift mixes, gates, the recurrence's step), each some microseconds of dispatch, which
cost 30-60% more than the read itself (benchmarks/results/models.md). kernels/decode.c does the step's matrix
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

Threads: torch's own OpenMP threads (kernels/decode.c says why). Like torch's parallel ops, the step cannot use
more than one thread in a child forked after the parent has used them (libgomp's threads do not survive a fork: a
torch matmul hangs there too); with one thread, as DataLoader workers have, it runs.

Each step reads the parameters' addresses afresh (a few hundred pointers, some microseconds), so a model whose
weights are replaced or moved needs nothing else; the recurrences' state is read from the tensors passed in and
written to new ones (the state passed in is never modified, as in the torch path).
"""
from __future__ import annotations

import ctypes

import torch

from seqmix.kernels import native
from seqmix.kernels._common import TORCH_DTYPES, needs_grad, new_output
from seqmix.kernels.backends import Backend, Call, Refusal, Unavailable, describe, dispatch

__all__ = ["CStep", "TorchOps", "STEP", "TIME_MIX", "step_path", "time_mix_path", "rwkv4_step", "rwkv7_step",
           "mamba_step", "rwkv7_time_mix"]

DTYPES = {torch.float32: 0, torch.bfloat16: 1}        # the weights' dtypes the C step reads (value: its bf16 flag)


def _bf16_flags(tensors) -> ctypes.Array:
    """Each tensor's dtype flag (DTYPES; None: 0) as a C array, beside the tensors' pointers."""
    return (ctypes.c_int64 * len(tensors))(*(0 if t is None else DTYPES[t.dtype] for t in tensors))


class CStep(Backend):
    """kernels/decode.c: a whole model's decoding step (``step=True``: one token of one sequence), or RWKV-7's time
    mix after its matrix products; inference on a CPU. Verifies a Call of ``step_path`` or ``time_mix_path``."""
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
        if f.get("output_hidden_states"):
            return Refusal("returns no hidden states")
        if self.step and f["tokens"] != (1, 1):
            return Refusal(f"takes one token of one sequence, input_ids of shape (1, 1), got {f['tokens']}")
        if call.asked not in (None, "c"):
            return Refusal(f"runs for backend None or 'c' only, got {call.asked!r}")
        if call.device.type != "cpu" or not f["weight_dtypes"] <= set(DTYPES):
            return Refusal(f"takes CPU weights in fp32 or bf16, got {call.device} and "
                           f"{sorted(str(d) for d in f['weight_dtypes'])}")
        if f.get("head_size", 0) > native.WKV7_MAX_HEAD:
            return Refusal(f"takes head sizes N <= {native.WKV7_MAX_HEAD}, got N = {f['head_size']}")
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
TIME_MIX = (CStep(step=False), TorchOps())     # RWKV-7's time mix after its matrix products


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
                      output_hidden_states=output_hidden_states)
    return dispatch(call, None, STEP)


def time_mix_path(att: torch.nn.Module, backend, *inputs: torch.Tensor) -> str:
    """Which path RWKV-7's time mix ``att`` takes after its matrix products: "c" (rwkv7_time_mix) or "ops". {TIME_MIX}

    Args:
        att: the TimeMix. backend: the forward's backend argument. inputs: every tensor the C code would read besides
            the parameters (None skipped), the state's kv included.

    Returns:
        "c" or "ops".
    """
    call = _path_call("rwkv7_time_mix", att, backend, inputs, head_size=att.r_k.shape[1],
                      wide_in_context_rate=att.wide_in_context_rate)
    return dispatch(call, None, TIME_MIX)


if step_path.__doc__:   # (python -OO drops docstrings) the order, in the dispatcher's words
    step_path.__doc__ = step_path.__doc__.replace("{STEP}", describe("decode_step", STEP, LEAD))
    time_mix_path.__doc__ = time_mix_path.__doc__.replace("{TIME_MIX}", describe("rwkv7_time_mix", TIME_MIX, LEAD))


def _pointers(tensors) -> ctypes.Array:
    """The tensors' addresses as a C array of pointers (None: NULL); each must be contiguous."""
    for t in tensors:
        if t is not None and not t.is_contiguous():
            raise ValueError(f"the C decoding step needs contiguous parameters (or, for a matrix, its transpose "
                             f"contiguous), got one of shape {tuple(t.shape)} and strides {t.stride()}; call "
                             f".contiguous() on it, or pass backend='torch'")
    return (ctypes.c_void_p * len(tensors))(*native._pointers(*tensors))


def _matrices(tensors) -> tuple[ctypes.Array, ctypes.Array, ctypes.Array]:
    """The weights' addresses as a C array of pointers (None: NULL), per weight whether it is stored as its
    transpose (a 2-D view whose .t() is contiguous: fla's RWKV-7 LoRA matrices, kernels/decode.c's matvec), and per
    weight its dtype flag. The callers pass the 2-D tensors the C code reads by element (Mamba's A_log, RWKV-7's r_k)
    contiguous."""
    flags = [int(t is not None and not t.is_contiguous() and t.dim() == 2 and t.t().is_contiguous()) for t in tensors]
    return (_pointers([t.t() if flag else t for t, flag in zip(tensors, flags)]),
            (ctypes.c_int64 * len(flags))(*flags), _bf16_flags(tensors))


def _call(entry: str, dims: tuple, eps: tuple, weights: list, embedding: torch.Tensor, state: list,
          new_state: list) -> torch.Tensor:
    """kernels/decode.c's ``entry`` on one token: the final norm's output (1, 1, C) in the model's dtype."""
    hidden = new_output((embedding.numel(),), torch.float32, embedding.device)
    status = getattr(native.library(), entry)(torch.get_num_threads(), (ctypes.c_int64 * len(dims))(*dims), *eps,
                                              *_matrices(weights), embedding.data_ptr(), _pointers(state),
                                              _pointers(new_state), hidden.data_ptr())
    native.check_status(status, entry)
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
    cfg, blocks = model.config, model.blocks
    state = model.initial_state(1) if state is None else state
    weights = [blocks[0].pre_ln.weight, blocks[0].pre_ln.bias]
    for block in blocks:
        att, ffn = block.attention, block.feed_forward
        weights += [block.ln1.weight, block.ln1.bias, block.ln2.weight, block.ln2.bias, att.time_decay,
                    att.time_first, att.time_mix_key, att.time_mix_value, att.time_mix_receptance, att.key.weight,
                    att.value.weight, att.receptance.weight, att.output.weight, ffn.time_mix_key,
                    ffn.time_mix_receptance, ffn.key.weight, ffn.receptance.weight, ffn.value.weight]
    weights += [model.ln_out.weight, model.ln_out.bias]
    embedding = model.embeddings.weight[token.reshape(())].contiguous()
    dims = (cfg.hidden_size, cfg.attention_hidden_size, cfg.intermediate_size, cfg.num_hidden_layers,
            rescale_every, DTYPES[embedding.dtype])
    state, new_state = _states(state, [torch.float32] * len(state))
    return _call("rwkv4_decode", dims, (cfg.layer_norm_epsilon,), weights, embedding, state, new_state), new_state


def _time_mix_params(att) -> list:
    """The per-channel parameters kernels/decode.c's rwkv7_time_mix reads, in its order (v0: None in block 0),
    contiguous (a copy of a few numbers where one is not)."""
    params = [att.w0, att.a0, getattr(att, "v0", None), att.k_k, att.k_a, att.r_k, att.ln_x.weight, att.ln_x.bias]
    return [None if p is None else p.contiguous() for p in params]


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
    new_state = native._initial_state(state, state.shape)
    out, params = new_output(r.shape, r.dtype, r.device), _time_mix_params(att)   # params: held for the call
    status = native.library().rwkv7_time_mix(torch.get_num_threads(), B, T, H, N, DTYPES[r.dtype],
                                             *native._pointers(*acts), _pointers(params), _bf16_flags(params),
                                             ctypes.c_float(att.ln_x.eps), *native._pointers(new_state, out))
    native.check_status(status, "rwkv7_time_mix", f"r_k of shape {tuple(att.r_k.shape)}")
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
    weights = [model.blocks[0].ln0.weight, model.blocks[0].ln0.bias]
    for block in model.blocks:
        att, ffn = block.att, block.ffn
        # the LoRA products x @ m as matrix-vector products m^T x (block 0 has no v1, v2)
        lora = [att.w1, att.w2, att.a1, att.a2, getattr(att, "v1", None), getattr(att, "v2", None), att.g1, att.g2]
        weights += [block.ln1.weight, block.ln1.bias, block.ln2.weight, block.ln2.bias, att.x_r, att.x_w, att.x_k,
                    att.x_v, att.x_a, att.x_g, *_time_mix_params(att), *(None if m is None else m.T for m in lora),
                    att.receptance.weight, att.key.weight, att.value.weight, att.output.weight, ffn.x_k,
                    ffn.key.weight, ffn.value.weight]
    weights += [model.ln_out.weight, model.ln_out.bias]
    embedding = model.emb.weight[token.reshape(())].contiguous()
    dims = (cfg.n_embd, cfg.n_head, cfg.head_size, cfg.dim_ffn, cfg.n_layer, cfg.decay_lora, cfg.a_lora,
            cfg.v_lora, cfg.gate_lora, DTYPES[embedding.dtype])
    # att_x_prev, ffn_x_prev in the activations' dtype (the embedding's), att_kv fp32
    state, new_state = _states([s for layer in state for s in layer],
                               [embedding.dtype, torch.float32, embedding.dtype] * len(state))
    hidden = _call("rwkv7_decode", dims, (cfg.layer_norm_epsilon, cfg.group_norm_epsilon), weights, embedding,
                   state, new_state)
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
    weights = []
    for layer in model.layers:
        m = layer.mixer
        weights += [layer.norm.weight, m.in_proj.weight, m.in_proj.bias, m.conv1d.weight.contiguous(),
                    m.conv1d.bias, m.x_proj.weight, m.dt_proj.weight, m.dt_proj.bias, m.A_log.contiguous(), m.D,
                    m.out_proj.weight, m.out_proj.bias]             # (read by element: contiguous, a copy if need be)
    weights.append(model.norm_f.weight)
    embedding = model.embeddings.weight[token.reshape(())].contiguous()
    dims = (cfg.hidden_size, cfg.intermediate_size, cfg.state_size, cfg.conv_kernel, cfg.time_step_rank,
            cfg.num_hidden_layers, DTYPES[embedding.dtype])
    state, new_state = _states([s for layer in state for s in layer], [torch.float32] * 2 * len(state))
    hidden = _call("mamba_decode", dims, (cfg.layer_norm_epsilon,), weights, embedding, state, new_state)
    return hidden, [tuple(new_state[i:i + 2]) for i in range(0, len(new_state), 2)]
