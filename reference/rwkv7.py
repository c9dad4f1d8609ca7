"""The RWKV-7 "Goose" language model in NumPy float64: time mix, channel mix, block, model; GPT and RNN mode.

Glossary (name here -> symbol in the sources; `params` keys are those of a BlinkDL RWKV-7 `.pth`):
    B, T, C, H, N, L, V  batch, time, channels (n_embd = H * N), heads (n_head), head size, layers, vocabulary
    F, D_w, D_a, D_v, D_g  channel-mix width (dim_ffn), LoRA widths of the decay, the in-context learning rate,
                the value residual and the gate
    params      dict key -> float64 array, keyed and shaped like the checkpoint (see `checkpoint_shapes`)
    x           residual stream (B, T, C); the mixes read layer-normed copies of it
    x_prev      the layer-normed input of the token before the first one (B, C): the token-shift state
    xx          x_{t-1} - x_t (B, T, C), `time_shift(x) - x` in the post
    x_r ... x_g six token-shift mixes att.x_r, x_w, x_k, x_v, x_a, x_g (1, 1, C): xr = x + xx * x_r etc.
    r, k, v     receptance (the query), key, value (B, T, C), from att.receptance / key / value
    w           raw decay -softplus(-(w0 + tanh(xw w1) w2)) - 0.5, soft-clamped into (-inf, -0.5)
    log_w       -exp(w), the log of the decay exp(-exp(w)) in (exp(-exp(-0.5)), 1) = (0.545.., 1)
    v_first     layer 0's value of the same token (B, T, C); later layers pull their v towards it by the
                gate sigmoid(v0 + xv v1 v2) (the "value residual")
    a           in-context learning rate sigmoid(a0 + xa a1 a2), in (0, 1) (B, T, C); `a` in BlinkDL's code,
                not the `a` of the op. With wide_in_context_rate: (1 + exp(log_w)) sigmoid(a0 + xa a1 a2), in
                (0, 1 + w) per channel, so that the transition's eigenvalues reach down to -1 (`in_context_rate`)
    g           output gate sigmoid(xg g1) g2 (B, T, C)
    kk          the key to replace: k * k_k, L2-normalized per head (B, T, C)
    k~          the key written: k * (1 + (a - 1) * k_a)
    S           the WKV state of each head, (B, H, N, N) indexed [value, key] (att_kv)
    wkv7        the op S_t = S_{t-1} diag(exp(log_w_t)) + (S_{t-1} a_t) b_t^T + v_t k_t^T, y_t = S_t r_t,
                called with a = -kk, b = kk * a (reference/wkv7.py)
    ln_x        GroupNorm of the op's output, one group per head, eps 64e-5
    r_k         (H, N) bonus weights: y += (sum_n r k~ r_k) v, per head
    state       list of L tuples (att_x_prev (B, C), att_kv (B, H, N, N), ffn_x_prev (B, C))

GPT mode (`forward`) runs a whole sequence through each layer; RNN mode (`forward_rnn`) feeds one token at a
time with the state in between. Both give the same logits: everything that links a token to earlier ones is
in the state (v_first is per token, not carried).

Sources: the RWKV-7 architecture post https://www.cnblogs.com/Ctrl-cCtrl-v/p/18906192 (time mix and channel
mix code walk-through, GPT and RNN modes), the RWKV-7 "Goose" paper arXiv:2503.14456, and the checkpoint
layout read by BlinkDL's `rwkv` package (RWKV_x070).
"""
import re

import numpy as np

from .functional import layer_norm, sigmoid, softplus, token_shift
from .wkv7 import wkv7

__all__ = ["forward", "forward_rnn", "initial_state", "num_layers", "check_params", "checkpoint_shapes", "time_mix",
           "channel_mix", "log_decay", "in_context_rate"]

LAYER_NORM_EPS = 1e-5
GROUP_NORM_EPS = 64e-5     # ln_x, per head


def checkpoint_shapes(V, C, H, L, F, D_w, D_a, D_v, D_g):
    """{key: shape} of a BlinkDL RWKV-7 checkpoint. v0, v1, v2 exist from block 1 on (block 0 makes v_first);
    ln0 on block 0 only. Linear weights are (out, in) as in torch.nn.Linear; LoRA matrices are (in, out).

    Args:
        V, C, H, L (int): vocabulary, channels, heads, layers (glossary).
        F, D_w, D_a, D_v, D_g (int): the channel mix's width and the four LoRA widths.
    Returns:
        dict: key -> shape.
    """
    N = C // H
    shapes = {"emb.weight": (V, C), "ln_out.weight": (C,), "ln_out.bias": (C,), "head.weight": (V, C),
              "blocks.0.ln0.weight": (C,), "blocks.0.ln0.bias": (C,)}
    for i in range(L):
        att = {f"x_{c}": (1, 1, C) for c in "rwkvag"}
        att.update(w0=(1, 1, C), w1=(C, D_w), w2=(D_w, C), a0=(1, 1, C), a1=(C, D_a), a2=(D_a, C),
                   g1=(C, D_g), g2=(D_g, C), k_k=(1, 1, C), k_a=(1, 1, C), r_k=(H, N))
        if i > 0:
            att.update(v0=(1, 1, C), v1=(C, D_v), v2=(D_v, C))
        att.update({f"{m}.weight": (C, C) for m in ("receptance", "key", "value", "output")})
        att.update({"ln_x.weight": (C,), "ln_x.bias": (C,)})
        shapes.update({f"blocks.{i}.att.{n}": s for n, s in att.items()})
        shapes.update({f"blocks.{i}.ffn.x_k": (1, 1, C), f"blocks.{i}.ffn.key.weight": (F, C),
                       f"blocks.{i}.ffn.value.weight": (C, F)})
        shapes.update({f"blocks.{i}.{n}.{wb}": (C,) for n in ("ln1", "ln2") for wb in ("weight", "bias")})
    return shapes


def _param(params, key):
    if key not in params:
        raise ValueError(f"params has no {key!r} (a BlinkDL RWKV-7 checkpoint has it)")
    return params[key]


def check_params(params):
    """Every tensor of the checkpoint present, in its shape. The sizes are read from emb.weight, blocks.0.att.r_k
    (H, N), ffn.key.weight and the LoRA matrices. Other keys (such as the unused blocks.0.att.v0/v1/v2 some
    checkpoints carry) are ignored.

    Args:
        params (dict): key -> array (``forward``).
    Returns:
        (V, C, H, N, L).
    """
    V, C = np.shape(_param(params, "emb.weight"))
    H, N = np.shape(_param(params, "blocks.0.att.r_k"))
    L = num_layers(params)
    width = {key: np.shape(_param(params, key))[-1]                      # LoRA widths: (C, D) matrices
             for key in ("blocks.0.att.w1", "blocks.0.att.a1", "blocks.0.att.g1") + ("blocks.1.att.v1",) * (L > 1)}
    shapes = checkpoint_shapes(V, C, H, L, F=np.shape(_param(params, "blocks.0.ffn.key.weight"))[0],
                               D_w=width["blocks.0.att.w1"], D_a=width["blocks.0.att.a1"],
                               D_v=width.get("blocks.1.att.v1", 0), D_g=width["blocks.0.att.g1"])
    if H * N != C:
        raise ValueError(f"blocks.0.att.r_k has shape {(H, N)}: H * N must equal n_embd = {C}")
    for key, shape in shapes.items():
        if np.shape(_param(params, key)) != shape:
            raise ValueError(f"params[{key!r}] must have shape {shape}, got {np.shape(params[key])}")
    return V, C, H, N, L


def num_layers(params):
    """L, the number of blocks: one more than the largest i of the "blocks.<i>." keys.

    Args:
        params (dict): the checkpoint's parameters.
    Returns:
        int.
    """
    return 1 + max(int(m.group(1)) for m in map(re.compile(r"blocks\.(\d+)\.").match, params) if m)


def initial_state(params, batch):
    """The state before any token: zeros for every layer.

    Args:
        params (dict): the checkpoint's parameters (``forward``); the sizes are read from them.
        batch (int): B.
    Returns:
        list: L tuples (att_x_prev (B, C), att_kv (B, H, N, N), ffn_x_prev (B, C)).
    """
    C = np.shape(_param(params, "emb.weight"))[1]
    H, N = np.shape(_param(params, "blocks.0.att.r_k"))
    return [(np.zeros((batch, C)), np.zeros((batch, H, N, N)), np.zeros((batch, C)))
            for _ in range(num_layers(params))]


def log_decay(xw, w0, w1, w2):
    """log_w = -exp(w), w = -softplus(-(w0 + tanh(xw w1) w2)) - 0.5 in (-inf, -0.5): the decay exp(log_w) =
    exp(-exp(w)) lies in (exp(-exp(-0.5)), 1). A more negative w forgets less.

    Args:
        xw (array): (B, T, C), the decay's token-shift mix.
        w0 (array): (1, 1, C); w1 (C, D_w) and w2 (D_w, C): the LoRA.
    Returns:
        array: log_w, (B, T, C).

    Source: the post's `w = -F.softplus(-(self.w0 + torch.tanh(xw @ self.w1) @ self.w2)) - 0.5`."""
    w = -softplus(-(w0 + np.tanh(xw @ w1) @ w2)) - 0.5                   # (B, T, C)
    return -np.exp(w)


def in_context_rate(z, log_w, wide=False):
    """a = sigmoid(z) as published, in (0, 1); wide: a = (1 + w) sigmoid(z) with w = exp(log_w), in (0, 1 + w).

    Why the wide range: the op's transition G_t = diag(w_t) - kk_t (a_t * kk_t)^T (kk unit length) has, along kk
    for a decay w the same in every channel, the eigenvalue w - a and w elsewhere. With a < 1 and w > exp(-exp(-0.5))
    = 0.545 no eigenvalue lies below -0.455, so a product of transitions never flips a sign and parity cannot be
    counted (Grazzi et al., arXiv:2411.12537; Merrill et al., arXiv:2404.08819); a up to 1 + w reaches -1 and no
    further (a larger a would let the state grow). Off by default: the published model has a in (0, 1).

    Args:
        z (array): a0 + xa a1 a2, (B, T, C).
        log_w (array): the same step's log decay, (B, T, C); read only when wide.
        wide (bool): the wider range.
    Returns:
        array: a, (B, T, C).
    """
    return (1 + np.exp(log_w)) * sigmoid(z) if wide else sigmoid(z)


def time_mix(p, x, x_prev, S, v_first, H, wide_in_context_rate=False):
    """out = output((GroupNorm_heads(wkv7(r, log_w, k~, v, -kk, kk * a)) + (sum r k~ r_k) v) * g).

    Args:
        p (dict): one block's att.* params without the prefix.
        x (array): (B, T, C), layer-normed.
        x_prev (array): (B, C), the token-shift state.
        S (array): (B, H, N, N) indexed [value, key].
        v_first (array or None): layer 0's value (B, T, C), or None in layer 0, which makes it.
        H (int): heads.
        wide_in_context_rate (bool): a in (0, 1 + w) instead of (0, 1) (``in_context_rate``).
    Returns:
        (out (B, T, C), x_prev (B, C), S, v_first): the new states, and v_first.

    Source: RWKV_Tmix_x070.forward as walked through in the post.
    """
    B, T, C = x.shape
    heads = lambda z: z.reshape(B, T, H, C // H)                         # noqa: E731  (B, T, C) -> (B, T, H, N)
    xx = token_shift(x, x_prev) - x                                      # (B, T, C)
    xr, xw, xk, xv, xa, xg = (x + xx * p[f"x_{c}"] for c in "rwkvag")    # (B, T, C) each
    r = xr @ p["receptance.weight"].T                                    # (B, T, C)
    log_w = log_decay(xw, p["w0"], p["w1"], p["w2"])                     # (B, T, C)
    k = xk @ p["key.weight"].T                                           # (B, T, C)
    v = xv @ p["value.weight"].T                                         # (B, T, C)
    if v_first is None:
        v_first = v                                                      # layer 0: this token's value
    else:
        v = v + (v_first - v) * sigmoid(p["v0"] + (xv @ p["v1"]) @ p["v2"])
    a = in_context_rate(p["a0"] + (xa @ p["a1"]) @ p["a2"], log_w, wide_in_context_rate)   # (B, T, C)
    g = sigmoid(xg @ p["g1"]) @ p["g2"]                                  # (B, T, C)
    kk = heads(k * p["k_k"])                                             # (B, T, H, N)
    kk = kk / np.maximum(np.linalg.norm(kk, axis=-1, keepdims=True), 1e-12)  # unit length per head
    k = k * (1 + (a - 1) * p["k_a"])                                     # (B, T, C)
    y, S = wkv7(heads(r), heads(log_w), heads(k), heads(v), -kk, kk * heads(a), S)   # (B, T, H, N)
    y = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + GROUP_NORM_EPS)
    y = y.reshape(B, T, C) * p["ln_x.weight"] + p["ln_x.bias"]           # GroupNorm, one group per head
    bonus = (heads(r) * heads(k) * p["r_k"]).sum(-1, keepdims=True) * heads(v)   # (B, T, H, N)
    y = y + bonus.reshape(B, T, C)
    return (y * g) @ p["output.weight"].T, x[:, -1], S, v_first


def channel_mix(p, x, x_prev):
    """out = value(relu(key(x + (x_{t-1} - x) * x_k))^2).

    Args:
        p (dict): one block's ffn.* params without the prefix.
        x (array): (B, T, C), layer-normed.
        x_prev (array): (B, C), the token-shift state.
    Returns:
        (out (B, T, C), x_prev (B, C)).

    Source: RWKV_CMix_x070 in the post.
    """
    xk = x + (token_shift(x, x_prev) - x) * p["x_k"]                     # (B, T, C)
    k = np.maximum(xk @ p["key.weight"].T, 0.0) ** 2                     # (B, T, F), squared ReLU
    return k @ p["value.weight"].T, x[:, -1]


def _block_params(params, prefix):
    return {key[len(prefix):]: x for key, x in params.items() if key.startswith(prefix)}


def _check_input_ids(input_ids, V):
    ids = np.asarray(input_ids)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"input_ids must be integers, got dtype {ids.dtype}")
    if ids.ndim != 2 or ids.shape[1] < 1:
        raise ValueError(f"input_ids must have shape (B, T) with T >= 1, got {ids.shape}")
    if ids.min() < 0 or ids.max() >= V:
        raise ValueError(f"input_ids must lie in [0, {V}) (the vocabulary size), got values from {ids.min()} "
                         f"to {ids.max()}")
    return ids


def _check_state(state, B, C, H, N, L):
    """The state as a list of L tuples of float64 arrays of their shapes."""
    if not isinstance(state, (list, tuple)) or len(state) != L:
        raise ValueError(f"state must be a list of {L} tuples (att_x_prev, att_kv, ffn_x_prev), got {state!r:.80}")
    checked = []
    for i, layer in enumerate(state):
        layer = tuple(np.asarray(x, dtype=np.float64) for x in layer)
        for name, x, shape in zip(("att_x_prev", "att_kv", "ffn_x_prev"), layer, ((B, C), (B, H, N, N), (B, C))):
            if x.shape != shape:
                raise ValueError(f"state[{i}] {name} must have shape {shape}, got {x.shape}")
        checked.append(layer)
    return checked


def forward(params, input_ids, state=None, *, wide_in_context_rate=False):
    """GPT mode: logits = head(LN_out(x_L)), x_{i+1} = x_i' + CMix(LN2(x_i')), x_i' = x_i + TMix(LN1(x_i)),
    x_0 = LN0(emb[input_ids]); each time mix runs the whole sequence through the WKV-7 op.

    Args:
        params (dict): a BlinkDL RWKV-7 checkpoint, key -> array (see ``checkpoint_shapes``); taken as float64.
        input_ids (array): (B, T) integers in [0, V).
        state (list or None): L tuples (att_x_prev (B, C), att_kv (B, H, N, N), ffn_x_prev (B, C)).
            Default: ``initial_state``.
        wide_in_context_rate (bool): a in (0, 1 + w), not (0, 1) (``in_context_rate``); not the published model.
    Returns:
        (logits (B, T, V), state after the last token).

    Source: the post's block structure (ln0 on block 0, then ln1 -> time mix, ln2 -> channel mix, residuals).
    """
    V, C, H, N, L = check_params(params)
    params = {key: np.asarray(x, dtype=np.float64) for key, x in params.items()}
    ids = _check_input_ids(input_ids, V)
    B = ids.shape[0]
    state = _check_state(initial_state(params, B) if state is None else state, B, C, H, N, L)

    def ln(z, name):
        return layer_norm(z, params[f"{name}.weight"], params[f"{name}.bias"], eps=LAYER_NORM_EPS)

    x = ln(params["emb.weight"][ids], "blocks.0.ln0")                    # (B, T, C)
    v_first, new_state = None, []
    for i in range(L):
        att_x_prev, S, ffn_x_prev = state[i]
        dx, att_x_prev, S, v_first = time_mix(_block_params(params, f"blocks.{i}.att."),
                                              ln(x, f"blocks.{i}.ln1"), att_x_prev, S, v_first, H,
                                              wide_in_context_rate)
        x = x + dx
        dx, ffn_x_prev = channel_mix(_block_params(params, f"blocks.{i}.ffn."), ln(x, f"blocks.{i}.ln2"),
                                     ffn_x_prev)
        x = x + dx
        new_state.append((att_x_prev, S, ffn_x_prev))
    return ln(x, "ln_out") @ params["head.weight"].T, new_state          # (B, T, V)


def forward_rnn(params, input_ids, state=None, *, wide_in_context_rate=False):
    """RNN mode: ``forward`` on one token at a time, the state carried from each step to the next (the post's
    rwkv_v7_demo_rnn.py against rwkv_v7_demo.py).

    Args:
        params, input_ids, state, wide_in_context_rate: as in ``forward``.
    Returns:
        (logits (B, T, V), state after the last token), as ``forward``.
    """
    ids = _check_input_ids(input_ids, np.shape(_param(params, "emb.weight"))[0])
    logits = []
    for t in range(ids.shape[1]):
        step_logits, state = forward(params, ids[:, t:t + 1], state, wide_in_context_rate=wide_in_context_rate)
        logits.append(step_logits)
    return np.concatenate(logits, axis=1), state
