"""The Mamba language model: RMSNorm, in_proj, causal conv1d, SiLU, selective SSM, gate, out_proj, residual.

Glossary (sources: the Mamba part of the RWKV/Mamba study notes in the source material, Algorithms 1 and 2;
Mamba, arXiv:2312.00752; weight names and layout of transformers' MambaModel):

    x (residual)    T_{l-1}     the residual stream, (B, T, C); C = hidden_size
    xz              Linear^x, Linear^z of Algorithm 2: in_proj, (B, T, 2D); D = intermediate_size = expand * C
    u               x'          SiLU(causal depthwise conv1d(x)), the SSM input, (B, D, T) (Mamba's channel-first
                                layout, that of reference/ssm.py)
    z               z           the gate branch, (B, D, T); the SSM output is multiplied by SiLU(z)
    dt_low          --          x_proj's first R = time_step_rank outputs, (B, T, R)
    delta           Delta       softplus(dt_proj(dt_low)): dt_proj's weight (D, R) then its bias, (B, D, T)
    B, C (SSM)      B, C        x_proj's next N and last N outputs (input-dependent), (B, N, T); N = state_size
    A               A           -exp(A_log), (D, N): one real negative diagonal per channel
    p["D"]          D           the skip term D * u (the parameter mixer.D, not the width D), (D,)
    K                           conv_kernel, the width of the causal convolution
    conv window     --          the last K - 1 inputs of the convolution, (B, D, K - 1): its state
    h               h           the SSM state, (B, D, N)

A block (Algorithm 2): x + out_proj(SSM(u) * SiLU(z)) with u, z from in_proj(RMSNorm(x)). The model: embeddings,
blocks, norm_f (RMSNorm). Model state: a list with one (conv window (B, D, K - 1), h (B, D, N)) per block;
feeding a prompt and then tokens one at a time with the state equals feeding the whole sequence.
The notes call Algorithm 2's first step a layer normalization: Mamba uses RMSNorm (no mean, no bias).
NumPy only (plus the siblings ssm.py for the selective scan and functional.py for SiLU); float64 throughout.
"""
import numpy as np

from .functional import silu
from .ssm import selective_scan

__all__ = ["forward", "initial_state", "num_layers", "mixer", "causal_conv1d", "rms_norm"]


def rms_norm(x, weight, *, eps):
    """x / sqrt(mean(x^2) + eps) * weight over the last axis.

    Args:
        x (array): (..., C).
        weight (array): (C,).
        eps (float): added to the mean square.
    Returns:
        array: x's shape.
    """
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * weight


def causal_conv1d(x, weight, bias, window):
    """y_t = bias + sum_{j=0}^{K-1} weight[:, 0, j] * x_{t-K+1+j} per channel, the inputs before t = 0 taken from
    window (zeros at the start of a sequence). This is PyTorch's depthwise Conv1d with K - 1 zeros of padding on
    the left, cut to T outputs (transformers' MambaMixer).

    Args:
        x (array): (B, D, T).
        weight (array): (D, 1, K), as stored.
        bias (array or None): (D,).
        window (array): (B, D, K - 1), the inputs before x.
    Returns:
        (y (B, D, T), the new window: the last K - 1 inputs).
    """
    K, T = weight.shape[-1], x.shape[-1]
    padded = np.concatenate([window, x], axis=-1)                        # (B, D, K - 1 + T)
    y = sum(weight[:, 0, j, None] * padded[..., j:j + T] for j in range(K))   # (B, D, T)
    if bias is not None:
        y = y + bias[:, None]
    return y, padded[..., padded.shape[-1] - (K - 1):]


def mixer(p, x, layer_state):
    """The mixer of one block (Algorithms 1 and 2 after the norm):

        x_in, z = in_proj(x);   u = SiLU(conv1d(x_in));   dt_low, B, C = x_proj(u)
        delta = softplus(dt_proj(dt_low));   A = -exp(A_log)
        h_t = exp(delta_t A) h_{t-1} + delta_t B_t u_t;   y_t = C_t h_t + D u_t      (selective scan)
        out = out_proj(y * SiLU(z))

    Args:
        p (dict): one block's parameters without the "layers.i.mixer." prefix.
        x (array): (B, T, C), after the norm.
        layer_state (tuple): (conv window (B, D, K - 1), h (B, D, N)).
    Returns:
        (out (B, T, C), layer_state).

    Source: the notes' Algorithms 1 and 2 (A_bar = exp(Delta A), not Delta A: reference/ERRATA.md); names and
    the time_step_rank split of x_proj as in transformers' MambaMixer.
    """
    window, h = layer_state
    D, N = p["A_log"].shape
    R = p["dt_proj.weight"].shape[1]                                     # time_step_rank
    xz = x @ p["in_proj.weight"].T + p.get("in_proj.bias", 0.0)          # (B, T, 2D)
    x_in, z = xz[..., :D].transpose(0, 2, 1), xz[..., D:].transpose(0, 2, 1)   # (B, D, T) each
    conv, window = causal_conv1d(x_in, p["conv1d.weight"], p.get("conv1d.bias"), window)
    u = silu(conv)                                                       # (B, D, T)
    dbc = u.transpose(0, 2, 1) @ p["x_proj.weight"].T                    # (B, T, R + 2N)
    dt_low, B, C = dbc[..., :R], dbc[..., R:R + N], dbc[..., R + N:]
    delta = (dt_low @ p["dt_proj.weight"].T).transpose(0, 2, 1)          # (B, D, T), bias added in the scan
    A = -np.exp(p["A_log"])                                              # (D, N)
    y, h = selective_scan(u, delta, A, B.transpose(0, 2, 1), C.transpose(0, 2, 1), D=p["D"], z=z,
                          delta_bias=p["dt_proj.bias"], delta_softplus=True, state=h)   # (B, D, T)
    out = y.transpose(0, 2, 1) @ p["out_proj.weight"].T + p.get("out_proj.bias", 0.0)  # (B, T, C)
    return out, (window, h)


def initial_state(params, batch):
    """The state before any token: an empty (zero) conv window and h = 0 for every block.

    Args:
        params (dict): the model's parameters (``forward``); the sizes are read from them.
        batch (int): B.
    Returns:
        list: L tuples (conv window (B, D, K - 1), h (B, D, N)).
    """
    state = []
    for i in range(num_layers(params)):
        D, K = params[f"layers.{i}.mixer.conv1d.weight"].shape[::2]
        N = params[f"layers.{i}.mixer.A_log"].shape[1]
        state.append((np.zeros((batch, D, K - 1)), np.zeros((batch, D, N))))
    return state


def _shapes(state):
    """The shapes of a state, pair by pair (for checking one)."""
    return [tuple(np.shape(a) for a in pair) for pair in state]


def num_layers(params):
    """L, the number of blocks: the count of "layers.<i>.norm.weight" entries.

    Args:
        params (dict): the model's parameters.
    Returns:
        int.
    """
    return sum(1 for name in params if name.startswith("layers.") and name.endswith(".norm.weight"))


def forward(params, input_ids, state=None, *, eps=1e-5):
    """hidden = norm_f(blocks(embeddings[input_ids])), block: x = x + mixer(RMSNorm(x)).

    The logits of MambaForCausalLM are hidden @ lm_head^T (lm_head = the embedding matrix when tied, the default).

    Args:
        params (dict): name -> array, keyed like transformers.MambaModel.state_dict() ("embeddings.weight",
            "layers.0.norm.weight", "layers.0.mixer.in_proj.weight", ..., "norm_f.weight"); taken as float64.
        input_ids (array): (B, T) integers.
        state (list or None): per block (conv window (B, D, K - 1), h (B, D, N)), as a previous call returned.
            Default: ``initial_state``.
        eps (float): the RMSNorms' eps (layer_norm_epsilon). Default: 1e-5.
    Returns:
        (hidden (B, T, C), state).

    Source: transformers' MambaModel (structure, names); the notes' Algorithm 2 for the block.
    """
    params = {name: np.asarray(a, dtype=np.float64) for name, a in params.items()}
    embeddings = params["embeddings.weight"]                             # (V, C)
    ids = np.asarray(input_ids)
    if ids.ndim != 2 or ids.shape[1] < 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"input_ids must be integers of shape (B, T) with T >= 1, got {ids.dtype} {ids.shape}")
    vocab = embeddings.shape[0]
    if ids.min() < 0 or ids.max() >= vocab:
        raise ValueError(f"input_ids must lie in [0, {vocab}), got values in [{ids.min()}, {ids.max()}]")
    expected = initial_state(params, ids.shape[0])
    if state is None:
        state = expected
    elif _shapes(state) != _shapes(expected):
        raise ValueError(f"state must be one (conv window, h) pair per block, of shapes {_shapes(expected)}, "
                         f"got {_shapes(state)}")

    x = embeddings[ids]                                                  # (B, T, C)
    new_state = []
    for i, layer_state in enumerate(state):
        prefix = f"layers.{i}.mixer."
        p = {name[len(prefix):]: a for name, a in params.items() if name.startswith(prefix)}
        out, layer_state = mixer(p, rms_norm(x, params[f"layers.{i}.norm.weight"], eps=eps), layer_state)
        x = x + out                                                      # (B, T, C)
        new_state.append(layer_state)
    return rms_norm(x, params["norm_f.weight"], eps=eps), new_state
