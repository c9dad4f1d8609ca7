"""The RWKV-4 language model: token shift, time mix (WKV), channel mix, blocks, ln_out, head.

Glossary (sources: the Hugging Face RWKV page, https://huggingface.co/docs/transformers/model_doc/rwkv, whose
weight names and state layout this file uses; the RWKV-4 part of the RWKV/Mamba study notes in the source material;
RWKV paper arXiv:2305.13048):

    x               x_t         the residual stream, (B, T, C); C = hidden_size
    x_prev          x_{t-1}     the block input of the previous token, (B, C): the token-shift state
    xx              x_{t-1}     x shifted one step in time (x_prev first), (B, T, C)
    mu_r, mu_k, mu_v  mu        time_mix_receptance / _key / _value: per channel, x mixed with xx
    r, k, v         r, k, v     receptance, key, value, (B, T, A); A = attention_hidden_size (C by default)
    w               w           per-step log decay of the WKV, -exp(time_decay), (A,)
    u               u           the bonus of the current token, time_first, (A,)
    wkv             wkv_t       the WKV average of past values (reference/wkv4.py), (B, T, A)
    num, den, max   N~, D~, M   the WKV state (reference/wkv4.py), each (B, A)
    F                           intermediate_size, the width of the channel mix (4 C by default)

A block: x = pre_ln(x) on block 0 only; x = x + time_mix(ln1(x)); x = x + channel_mix(ln2(x)).
The model: embedding, blocks, ln_out; the language-model head is logits = ln_out(x) head^T.

Model state: five arrays of shape (B, C, L), L the number of blocks, in the order transformers' RwkvModel returns
them: ffn_x_prev, att_x_prev, att_num, att_den, att_max (entry [..., i] belongs to block i). With
attention_hidden_size A != C the three WKV arrays are (B, A, L).

Rescaling (RwkvConfig.rescale_every = n > 0, at inference): transformers divides the weights attention.output and
feed_forward.value of block i by 2^(i // n) and the residual stream by 2 after every n-th block, so that fp16 does
not overflow. LayerNorm undoes a scale, so this changes the result only through the LayerNorms' eps.
NumPy only (plus the siblings wkv4.py, and functional.py for the layer norm, the token shift and the sigmoid);
float64 throughout.
"""
import numpy as np

from .functional import layer_norm, sigmoid, token_shift
from .wkv4 import INITIAL_MAX, wkv4

__all__ = ["forward", "logits", "initial_state", "num_layers", "block", "time_mix", "channel_mix", "mix",
           "STATE_NAMES"]

STATE_NAMES = ("ffn_x_prev", "att_x_prev", "att_num", "att_den", "att_max")
# transformers builds ln_out as nn.LayerNorm(hidden_size): the default eps, whatever layer_norm_epsilon says.
LN_OUT_EPS = 1e-5


def mix(x, xx, mu):
    """mu * x_t + (1 - mu) * x_{t-1}, per channel.

    Args:
        x, xx (array): (B, T, C), the sequence and the sequence shifted one step (``token_shift``).
        mu (array): (1, 1, C) as stored, or (C,).
    Returns:
        array: (B, T, C).
    """
    mu = np.reshape(mu, -1)
    return mu * x + (1 - mu) * xx


def time_mix(p, x, x_prev, wkv_state):
    """out_t = W_o (sigmoid(r_t) * wkv_t), with

        r_t = W_r mix(x_t, x_{t-1}, mu_r),  k_t = W_k mix(..., mu_k),  v_t = W_v mix(..., mu_v)
        wkv_t = WKV(w = -exp(time_decay), u = time_first, k, v)

    Args:
        p (dict): one block's parameters without the "blocks.i." prefix.
        x (array): (B, T, C), after ln1.
        x_prev (array): (B, C), the token-shift state.
        wkv_state (tuple): (num, den, max), each (B, A).
    Returns:
        (out (B, T, C), x_prev (B, C), wkv_state): the new states.

    Source: the HF page (the RWKV attention O_i = sigmoid(R_i) N_i / D_i) and the study notes' time-mixing steps;
    the notes write W_r for all three projections: k and v have their own W_k, W_v (reference/ERRATA.md).
    """
    xx = token_shift(x, x_prev)                                          # (B, T, C)
    r = mix(x, xx, p["attention.time_mix_receptance"]) @ p["attention.receptance.weight"].T  # (B, T, A)
    k = mix(x, xx, p["attention.time_mix_key"]) @ p["attention.key.weight"].T                # (B, T, A)
    v = mix(x, xx, p["attention.time_mix_value"]) @ p["attention.value.weight"].T            # (B, T, A)
    w = -np.exp(p["attention.time_decay"])                               # (A,) log decay per step, < 0
    wkv, wkv_state = wkv4(w, p["attention.time_first"], k, v, wkv_state)  # (B, T, A)
    return (sigmoid(r) * wkv) @ p["attention.output.weight"].T, x[:, -1], wkv_state   # (B, T, C)


def channel_mix(p, x, x_prev):
    """out_t = sigmoid(r_t) * (W_v max(k_t, 0)^2), with

        r_t = W_r mix(x_t, x_{t-1}, mu_r)   (C outputs),   k_t = W_k mix(x_t, x_{t-1}, mu_k)   (F outputs)

    Args:
        p (dict): one block's parameters without the "blocks.i." prefix.
        x (array): (B, T, C), after ln2.
        x_prev (array): (B, C), the token-shift state.
    Returns:
        (out (B, T, C), x_prev (B, C)).

    Source: the study notes' channel-mixing steps (squared ReLU, sigmoid gate); HF's RwkvFeedForward names.
    """
    xx = token_shift(x, x_prev)                                          # (B, T, C)
    r = mix(x, xx, p["feed_forward.time_mix_receptance"]) @ p["feed_forward.receptance.weight"].T  # (B, T, C)
    k = mix(x, xx, p["feed_forward.time_mix_key"]) @ p["feed_forward.key.weight"].T                # (B, T, F)
    v = np.maximum(k, 0.0) ** 2 @ p["feed_forward.value.weight"].T       # (B, T, C) squared ReLU
    return sigmoid(r) * v, x[:, -1]


def block(p, x, layer_state, *, eps=1e-5, branch_scale=1.0):
    """x = pre_ln(x) (block 0 only); x += branch_scale * time_mix(ln1(x)); x += branch_scale * channel_mix(ln2(x)).

    Args:
        p (dict): one block's parameters without the "blocks.i." prefix.
        x (array): (B, T, C).
        layer_state (sequence): the five state entries of this block: ffn_x_prev, att_x_prev (B, C); att_num,
            att_den, att_max (B, A).
        eps (float): the LayerNorms' eps. Default: 1e-5.
        branch_scale (float): 2^-(i // n), the rescaling of the output weights at inference (module docstring).
            Default: 1.0.
    Returns:
        (x (B, T, C), layer_state).

    Source: HF's RwkvBlock structure (pre-LN on block 0, pre-norm residual sub-blocks).
    """
    ffn_prev, att_prev, *wkv_state = layer_state
    if "pre_ln.weight" in p:
        x = layer_norm(x, p["pre_ln.weight"], p["pre_ln.bias"], eps=eps)
    dx, att_prev, wkv_state = time_mix(p, layer_norm(x, p["ln1.weight"], p["ln1.bias"], eps=eps), att_prev, wkv_state)
    x = x + branch_scale * dx
    dx, ffn_prev = channel_mix(p, layer_norm(x, p["ln2.weight"], p["ln2.bias"], eps=eps), ffn_prev)
    x = x + branch_scale * dx
    return x, (ffn_prev, att_prev, *wkv_state)


def initial_state(params, batch):
    """The state before any token: zeros, and the WKV max at "minus infinity" (reference/wkv4.py).

    Args:
        params (dict): the model's parameters (``forward``); the sizes are read from them.
        batch (int): B.
    Returns:
        tuple: the five arrays of the module docstring, (B, C, L) or (B, A, L), in transformers' order.
    """
    C = np.shape(params["embeddings.weight"])[1]
    A = np.shape(params["blocks.0.attention.time_decay"])[0]
    L = num_layers(params)
    state = [np.zeros((batch, c, L)) for c in (C, C, A, A, A)]
    state[4][:] = INITIAL_MAX
    return tuple(state)


def num_layers(params):
    """L, the number of blocks: the count of "blocks.<i>.ln1.weight" entries.

    Args:
        params (dict): the model's parameters.
    Returns:
        int.
    """
    return sum(1 for name in params if name.startswith("blocks.") and name.endswith(".ln1.weight"))


def forward(params, input_ids, state=None, *, eps=1e-5, rescale_every=6):
    """hidden = ln_out(blocks(embeddings[input_ids])), the blocks reading and returning the recurrent state.

    Feeding a sequence in pieces, passing the state on, gives the whole's result.

    Args:
        params (dict): name -> array, keyed like transformers.RwkvModel.state_dict() ("embeddings.weight",
            "blocks.0.pre_ln.weight", "blocks.0.attention.time_decay", ..., "ln_out.bias"); taken as float64.
        input_ids (array): (B, T) integers.
        state (tuple or None): the five (B, C, L) arrays of the module docstring, in transformers' order.
            Default: ``initial_state``.
        eps (float): the blocks' LayerNorm eps (layer_norm_epsilon; ln_out always uses 1e-5, as in transformers).
            Default: 1e-5.
        rescale_every (int): RwkvConfig.rescale_every (transformers' default; <= 0 turns rescaling off). Default: 6.
    Returns:
        (hidden (B, T, C), state).

    Source: HF's RwkvModel (structure, names, state layout, rescaling at inference).
    """
    params = {name: np.asarray(a, dtype=np.float64) for name, a in params.items()}
    embeddings = params["embeddings.weight"]                             # (V, C)
    vocab, L = embeddings.shape[0], num_layers(params)
    ids = np.asarray(input_ids)
    if ids.ndim != 2 or ids.shape[1] < 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"input_ids must be integers of shape (B, T) with T >= 1, got {ids.dtype} {ids.shape}")
    if ids.min() < 0 or ids.max() >= vocab:
        raise ValueError(f"input_ids must lie in [0, {vocab}), got values in [{ids.min()}, {ids.max()}]")
    B = ids.shape[0]
    expected = initial_state(params, B)
    if state is None:
        state = expected
    elif len(state) != 5 or any(np.shape(s) != e.shape for s, e in zip(state, expected)):
        raise ValueError(f"state must be 5 arrays {STATE_NAMES} of shapes {[e.shape for e in expected]}, got "
                         f"{[np.shape(s) for s in state]}")
    state = [np.array(s, dtype=np.float64) for s in state]               # a copy: the caller's state is kept

    x = embeddings[ids]                                                  # (B, T, C)
    for i in range(L):
        prefix = f"blocks.{i}."
        p = {name[len(prefix):]: a for name, a in params.items() if name.startswith(prefix)}
        branch_scale = 0.5 ** (i // rescale_every) if rescale_every > 0 else 1.0
        x, layer_state = block(p, x, [s[..., i] for s in state], eps=eps, branch_scale=branch_scale)
        for s, layer_s in zip(state, layer_state):
            s[..., i] = layer_s
        if rescale_every > 0 and (i + 1) % rescale_every == 0:
            x = x / 2
    return layer_norm(x, params["ln_out.weight"], params["ln_out.bias"], eps=LN_OUT_EPS), tuple(state)


def logits(head_weight, hidden):
    """logits = hidden head^T.

    Args:
        head_weight (array): (V, C), RwkvForCausalLM's "head.weight" (the embedding matrix when tie_word_embeddings).
        hidden (array): (B, T, C), from ``forward``.
    Returns:
        array: (B, T, V).
    """
    return hidden @ np.asarray(head_weight, dtype=np.float64).T
