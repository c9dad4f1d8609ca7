"""How the trained models solve their tasks, read from their weights: not only a number, the mechanism.

    attention_weights(model, input_ids)       a Transformer's attention matrices, recomputed from its q and k
    recall_attention(model, inputs, targets)  MQAR: how much each last-layer head puts on the queried key's pair
    previous_token_attention(model, inputs)   MQAR: how much each first-layer head puts on a value's own key
    embeddings_alike(model, tokens)           MQAR: the mean cosine between distinct tokens' embeddings (the keys')
    rwkv7_readout(model, inputs, targets)     MQAR: cos(S_t r_t at a query, v written at each pair's value)
    mamba_step_sizes(model, inputs)           selective copying: the first layer's mean delta_t at each position
    rwkv7_transitions(model, inputs)          state tracking: the eigenvalues of RWKV-7's transition at each step

Each returns arrays a figure can show (experiments.plots draws them); each is checked in
tests/experiments/test_mechanism.py
against an independent computation (the attention output rebuilt from the weights; the readout of a state built
by hand).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from unittest import mock

import numpy as np
import torch

from .data import IGNORE
from ..kernels.rerope import apply_rope
from ..models import rwkv7 as rwkv7_module

__all__ = ["attention_weights", "recall_attention", "previous_token_attention", "embeddings_alike", "rwkv7_readout",
           "mamba_step_sizes", "rwkv7_transitions"]


@torch.no_grad()
def attention_weights(model, input_ids: torch.Tensor) -> list:
    """softmax(R(i) q_i . R(j) k_j / sqrt(d)) over j <= i, per attention layer: a list of (B, H, T, T) tensors of
    the experiments' Transformer (RoPE, as trained; experiments/transformer.py; q_i . k_j for a model with learned
    positions, which has no R), from q and k caught at each block that attends (a conv_first model's block 0
    convolves and has none)."""
    caught = []
    hooks = [b.qkv.register_forward_hook(lambda m, args, out: caught.append(out))
             for b in model.blocks if b.short_conv is None]
    try:
        model(input_ids)
    finally:
        for h in hooks:
            h.remove()
    B, T = input_ids.shape
    d, base = model.config.head_size, model.config.base
    positions = torch.arange(T, dtype=torch.float64)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    weights = []
    for qkv in caught:
        q, k, _ = qkv.view(B, T, 3, -1, d).permute(2, 0, 3, 1, 4)                 # (B, H, T, d) each
        if model.config.positions == "rope":
            q, k = apply_rope(q, positions, base=base), apply_rope(k, positions, base=base)
        scores = q @ k.transpose(-1, -2)
        weights.append(torch.softmax((scores / math.sqrt(d)).masked_fill(~mask, -math.inf), dim=-1))
    return weights


def _pairs(inputs: np.ndarray, targets: np.ndarray):
    """For each query of an MQAR batch: (row, query position, index j of its pair in the context)."""
    rows, cols = np.nonzero(targets != IGNORE)
    n_pairs = int((targets[0] != IGNORE).sum())
    keys = inputs[:, 0:2 * n_pairs:2]                                           # (n, N)
    j = np.argmax(keys[rows] == inputs[rows, cols][:, None], axis=1)
    return rows, cols, j, n_pairs


def recall_attention(model, inputs: np.ndarray, targets: np.ndarray) -> dict:
    """Where the last layer looks from each query: per head, the mean weight on the queried key's position (2j), on
    its value's (2j + 1), and on the other pairs' values; "best_head" has the most on the value.

    Returns:
        {"key": (H,), "value": (H,), "other_values": (H,), "best_head": int, "example": (T, T) of that head on
        the first sequence}.
    """
    last = attention_weights(model, torch.from_numpy(inputs))[-1].numpy()      # (B, H, T, T)
    rows, cols, j, n_pairs = _pairs(inputs, targets)
    at_queries = last[rows, :, cols]                                            # (queries, H, T)
    key = at_queries[np.arange(len(rows)), :, 2 * j].mean(0)
    value = at_queries[np.arange(len(rows)), :, 2 * j + 1].mean(0)
    all_values = at_queries[:, :, 1:2 * n_pairs:2].sum(-1).mean(0)
    best = int(np.argmax(value))
    return {"key": key, "value": value, "other_values": all_values - value, "best_head": best,
            "example": last[0, best]}


def previous_token_attention(model, inputs: np.ndarray, num_pairs: int) -> dict:
    """The first half of an induction circuit: from each value in the context (position 2j + 1), the first attention
    layer's weight on its own key (2j, the previous token), per head, averaged over pairs and sequences. A head that
    copies the key into its value's position puts nearly all of it there; attention spread evenly over the 2j + 2
    positions a value sees puts 1/(2j + 2) there, on average "uniform".

    Returns:
        {"weight": (H,), "uniform": mean over j < num_pairs of 1/(2j + 2)}.
    """
    first = attention_weights(model, torch.from_numpy(inputs))[0].numpy()      # (B, H, T, T)
    values = np.arange(1, 2 * num_pairs, 2)
    return {"weight": first[:, :, values, values - 1].mean(axis=(0, 2)),
            "uniform": float(np.mean(1 / (values + 1)))}


@torch.no_grad()
def embeddings_alike(model, tokens) -> float:
    """How alike a Transformer's token embeddings of ``tokens`` are: the mean cosine similarity over pairs of distinct
    tokens, cos(e_a, e_b) = e_a . e_b / (|e_a| |e_b|). Random vectors give about 0; embeddings collapsed onto one
    shared direction give nearly 1, and a query can no longer tell one key from another by its embedding."""
    unit = torch.nn.functional.normalize(model.emb.weight[torch.as_tensor(list(tokens))].double(), dim=1)  # (n, C)
    cos = unit @ unit.T                                                        # (n, n), ones on the diagonal
    n = len(unit)
    return float((cos.sum() - n) / (n * (n - 1)))


@contextmanager
def _caught_wkv7(calls: list):
    """The WKV-7 op of models.rwkv7, wrapped so that each call's inputs and output are kept in ``calls``."""
    op = rwkv7_module.wkv7

    def catching(r, log_w, k, v, a, b, state=None, backend=None):
        y, s = op(r, log_w, k, v, a, b, state=state, backend=backend)
        calls.append({"r": r, "log_w": log_w, "k": k, "v": v, "a": a, "b": b, "state": state, "y": y})
        return y, s

    with mock.patch.object(rwkv7_module, "wkv7", catching):
        yield


@torch.no_grad()
def rwkv7_readout(model, inputs: np.ndarray, targets: np.ndarray, layer: int = -1) -> np.ndarray:
    """The value RWKV-7's state returns when read with a key: at each query t, y_t = S_t r_t of layer ``layer``
    (the WKV-7 op's output, before its group norm), against v_s, the value written at each pair's value position
    s = 2j + 1; cosine similarity, per head, averaged over heads and queries.

    Returns:
        (N, N): mean cos(y at the query of pair i, v at the value of pair j); a delta rule that stores and
        returns each pair's value gives a bright diagonal.
    """
    calls = []
    with _caught_wkv7(calls):
        model(torch.from_numpy(inputs), backend="torch")                        # the C time mix calls no op
    y, v = calls[layer]["y"].double(), calls[layer]["v"].double()               # (B, T, H, N)
    rows, cols, j, n_pairs = _pairs(inputs, targets)
    out = np.zeros((n_pairs, n_pairs))
    count = np.zeros(n_pairs)
    for row, col, i in zip(rows, cols, j):
        written = v[row, 1:2 * n_pairs:2]                                       # (N pairs, H, N)
        cos = torch.nn.functional.cosine_similarity(y[row, col][None], written, dim=-1)   # (N pairs, H)
        out[i] += cos.mean(-1).numpy()
        count[i] += 1
    return out / np.maximum(count, 1)[:, None]


@torch.no_grad()
def mamba_step_sizes(model, inputs: np.ndarray) -> np.ndarray:
    """delta_t = softplus(dt_proj(x_proj(x)_dt) + bias) of the first Mamba layer, averaged over channels: (n, T)."""
    caught = {}
    first = model.backbone.layers[0].mixer
    hook = first.x_proj.register_forward_hook(lambda module, args, out: caught.update(x_proj=out))
    try:
        model(torch.from_numpy(inputs))
    finally:
        hook.remove()
    dt_low = caught["x_proj"][..., :first.time_step_rank]                       # (n, T, rank)
    return torch.nn.functional.softplus(first.dt_proj(dt_low)).mean(-1).numpy()


@torch.no_grad()
def rwkv7_transitions(model, inputs: np.ndarray) -> list:
    """The eigenvalues of each step's transition G_t = diag(w_t) + a_t b_t^T of every RWKV-7 layer and head (the op's
    S_t = S_{t-1} G_t + v_t k_t^T, with the model's a = -kk, b = kk * in-context rate): a sign flip needs one near -1,
    and a tracked sign survives n flips only as |lambda|^n.

    Returns:
        per layer, {"min_real": (n, T, H) the smallest real part, "max_abs": (n, T, H) the largest modulus}.
    """
    calls = []
    with _caught_wkv7(calls):
        model(torch.from_numpy(inputs), backend="torch")
    found = []
    for call in calls:
        w = torch.exp(call["log_w"].double())                                  # (n, T, H, N)
        G = torch.diag_embed(w) + call["a"].double()[..., :, None] * call["b"].double()[..., None, :]
        eig = torch.linalg.eigvals(G)                                          # (n, T, H, N)
        found.append({"min_real": eig.real.min(-1).values.numpy(), "max_abs": eig.abs().max(-1).values.numpy()})
    return found
