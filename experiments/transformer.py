"""A small causal transformer on the project's attention ops, with every position scheme of the ReRoPE post.

    x = emb[ids];  per layer:  x += W_o attend(q, k, v);  x += W_2 gelu(W_1 LN(x));   logits = head(LN(x))
    q, k, v = heads of W_qkv LN(x)  (B, H, T, d)

With conv_first (the Based paper's MQAR attention, a Hybrid of BaseConv and MHA), block 0 mixes tokens with a gated
short convolution instead of attending: h = LN(x), x += conv_3(h) * (W h + b) + h (conv_3 causal, depthwise,
kernel 3), the previous-token half of an induction head built in.

With positions="learned" (Zoology's attention, as GPT-2) the model has no RoPE: a learned vector per position, up to
train_length, is added to each token's embedding, and attention compares q and k as they are. Such a model runs at
its training length or below, under the default scheme only.

How a scheme attends (T the evaluated length, L = train_length, s = max(1, T / L), d the head size):

    RoPE          attention(R(p) q, R(p) k, v)                                   p = 0 .. T-1
    PI            attention(R(p / s) q, R(p / s) k, v)                           positions squeezed into [0, L)
    NTK-old       attention(R(p) q, R(p) k, v) with base * s^(d / (d - 2))       the lowest frequency squeezed by s
    ReRoPE        rerope_attention(q, k, v, w)                                   rel = min(i - j, w)
    Leaky ReRoPE  rerope_attention(q, k, v, w, leaky_k=k)                        rel = i - j below w, then slope 1/k
    log n (†)     q_n * max(1, ln n / ln L), applied at evaluation only (the model was trained without it)
    log n         q_n * ln n / ln L at every position, in training and evaluation (config.log_n)

R is kernels.rerope.apply_rope; attention is kernels.attention.attention; rerope_attention is the project's
O(T)-memory ReRoPE. PI's and NTK's factor s follows the evaluated length (1 at or below L), so that every scheme is
the trained model at 1x. Sources: https://spaces.ac.cn/archives/9708 (the schemes, the log n and log n† rows),
Position Interpolation (arXiv:2306.15595), NTK-aware scaled RoPE (https://spaces.ac.cn/archives/9675, the post's
"-old"), log n scaling (https://spaces.ac.cn/archives/8823).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.attention import attention
from ..kernels.rerope import apply_rope, log_n_scaling, rerope_attention

__all__ = ["SCHEME_KINDS", "POSITIONS", "PositionScheme", "TransformerConfig", "Transformer", "dropped_attention"]

SCHEME_KINDS = ("rope", "pi", "ntk", "rerope", "leaky_rerope")
POSITIONS = ("rope", "learned")      # how a Transformer is told positions in training (TransformerConfig.positions)
_NAMES = {"rope": "RoPE", "pi": "PI", "ntk": "NTK-old", "rerope": "ReRoPE", "leaky_rerope": "Leaky ReRoPE"}


@dataclass(frozen=True)
class PositionScheme:
    """How attention sees positions at evaluation (training always uses RoPE).

    kind: one of SCHEME_KINDS. window: w (ReRoPE, Leaky ReRoPE). leaky_k: k (Leaky ReRoPE). log_n: the post's
    log n† (scaling at evaluation only, for a model trained without it)."""
    kind: str = "rope"
    window: int | None = None
    leaky_k: float | None = None
    log_n: bool = False

    def __post_init__(self):
        if self.kind not in SCHEME_KINDS:
            raise ValueError(f"kind must be one of {SCHEME_KINDS}, got {self.kind!r}")
        rectified = self.kind in ("rerope", "leaky_rerope")
        if rectified != (self.window is not None):
            raise ValueError(f"window is needed by ReRoPE and Leaky ReRoPE only; got kind={self.kind!r}, "
                             f"window={self.window!r}")
        if (self.kind == "leaky_rerope") != (self.leaky_k is not None):
            raise ValueError(f"leaky_k is needed by Leaky ReRoPE only; got kind={self.kind!r}, "
                             f"leaky_k={self.leaky_k!r}")

    @property
    def name(self) -> str:
        """The post's way of naming it: e.g. "ReRoPE-w32-log n†", "Leaky ReRoPE-w32-k16"."""
        parts = [_NAMES[self.kind]]
        if self.window is not None:
            parts.append(f"w{self.window}")
        if self.leaky_k is not None:
            parts.append(f"k{self.leaky_k:g}")
        return "-".join(parts) + ("-log n†" if self.log_n else "")

    def attend(self, q, k, v, train_length: int, base: float, mix=attention):
        """Causal attention of (B, H, T, d) q, k, v under this scheme -> (B, H, T, d); ``mix``: the attention of
        the rotated q, k and v (dropped_attention in training with attention_dropout; the rectified kinds take
        only the default)."""
        T, d = q.shape[-2:]
        if self.log_n:
            q = log_n_scaling(q, train_length)
        if self.kind in ("rerope", "leaky_rerope"):
            if mix is not attention:
                raise ValueError(f"{self.name} attends with its own kernel; attention_dropout is for training under "
                                 f"RoPE or learned positions")
            return rerope_attention(q, k, v, self.window, leaky_k=self.leaky_k, base=base)
        s = max(1.0, T / train_length)
        positions = torch.arange(T, dtype=torch.float64) / (s if self.kind == "pi" else 1.0)
        if self.kind == "ntk":
            base = base * s ** (d / (d - 2))
        return mix(apply_rope(q, positions, base=base), apply_rope(k, positions, base=base), v)


def dropped_attention(q, k, v, p: float):
    """Causal softmax attention of (B, H, T, d) q, k, v with dropout at rate ``p`` on its weights, as GPT-2's and
    Zoology's attention in training (attn_pdrop): softmax(q k^T / sqrt(d)) has each entry zeroed with probability p
    and the rest scaled by 1 / (1 - p), then multiplies v. torch's SDPA draws the mask; at p = 0 it is attention."""
    return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)


@dataclass
class TransformerConfig:
    """vocab_size; hidden_size C; num_layers; head_size d (C / d heads); intermediate_size (default 4 C; 0: no
    channel mix, attention alone in each block, as Zoology's MQAR models);
    train_length L (log n's maxlen, and the length PI and NTK scale from); log_n: trained with q_n * ln n / ln L
    (the post's "log n" rows); base: RoPE's base; conv_first: block 0 a gated short convolution instead of
    attention (the Based paper's MQAR attention model, a Hybrid of BaseConv and MHA; see the module's docstring);
    positions: "rope" (rotary, the default) or "learned" (absolute, one vector per position up to train_length,
    added to the embedding; Zoology's attention); tie_head: the output head shares the token embedding's matrix
    (Zoology's and GPT-2's); dropout: the rate of dropout on the embedding and on each residual branch's output
    (GPT-2's resid_pdrop and embd_pdrop); attention_dropout: the rate of dropout on the attention weights, in
    training (GPT-2's attn_pdrop; Zoology drops the embedding and the attention weights at 0.1)."""
    vocab_size: int
    hidden_size: int = 128
    num_layers: int = 2
    head_size: int = 32
    intermediate_size: int | None = None
    train_length: int = 128
    log_n: bool = False
    base: float = 10000.0
    conv_first: bool = False
    positions: str = "rope"
    tie_head: bool = False
    dropout: float = 0.0
    attention_dropout: float = 0.0

    def __post_init__(self):
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        if self.hidden_size % self.head_size or self.head_size % 2:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be a multiple of an even head_size "
                             f"({self.head_size})")
        if self.conv_first and self.num_layers < 2:
            raise ValueError(f"conv_first needs num_layers >= 2 (block 0 convolves, the rest attend), got "
                             f"{self.num_layers}")
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {self.positions!r}")
        if self.positions == "learned" and self.log_n:
            raise ValueError("log_n scales RoPE's attention; a model with positions='learned' has no RoPE")
        for name in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)!r}")


class _GatedShortConv(nn.Module):
    """Zoology's BaseConv with kernel 3 (zoology/mixers/base_conv.py): conv_3(h) * (W h + b) + h, the convolution
    causal and depthwise (one 3-tap filter per channel)."""

    def __init__(self, C: int, kernel: int = 3):
        super().__init__()
        self.conv = nn.Conv1d(C, C, kernel, groups=C, padding=kernel - 1)
        self.proj = nn.Linear(C, C)

    def forward(self, h):                                            # (B, T, C)
        conv = self.conv(h.transpose(1, 2))[..., :h.shape[1]].transpose(1, 2)   # causal: the first T outputs
        return conv * self.proj(h) + h


class _Block(nn.Module):
    def __init__(self, c: TransformerConfig, conv: bool = False):
        super().__init__()
        C, self.head_size = c.hidden_size, c.head_size
        self.ln1 = nn.LayerNorm(C)
        self.short_conv = _GatedShortConv(C) if conv else None
        if not conv:
            self.qkv = nn.Linear(C, 3 * C, bias=False)
            self.out = nn.Linear(C, C, bias=False)
        self.channel_mix = c.intermediate_size > 0
        if self.channel_mix:                                        # its norm too: an unused one takes no gradient
            self.ln2 = nn.LayerNorm(C)
            self.up = nn.Linear(C, c.intermediate_size, bias=False)
            self.down = nn.Linear(c.intermediate_size, C, bias=False)
        self.drop = nn.Dropout(c.dropout)                           # on each branch's output (identity at 0)

    def forward(self, x, attend):
        mixed = self.short_conv(self.ln1(x)) if self.short_conv is not None else self._attend(self.ln1(x), attend)
        x = x + self.drop(mixed)
        return x + self.drop(self.down(F.gelu(self.up(self.ln2(x))))) if self.channel_mix else x

    def _attend(self, h, attend):
        B, T, C = h.shape
        q, k, v = self.qkv(h).view(B, T, 3, -1, self.head_size).permute(2, 0, 3, 1, 4)            # (B, H, T, d)
        return self.out(attend(q, k, v).transpose(1, 2).reshape(B, T, C))


class Transformer(nn.Module):
    """A causal character- or token-level transformer: model(input_ids (B, T), scheme) -> logits (B, T, V)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.emb = nn.Embedding(config.vocab_size, config.hidden_size)
        learned = config.positions == "learned"
        self.pos_emb = nn.Embedding(config.train_length, config.hidden_size) if learned else None
        self.blocks = nn.ModuleList(_Block(config, conv=config.conv_first and i == 0) for i in range(config.num_layers))
        self.ln_out = nn.LayerNorm(config.hidden_size)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.drop = nn.Dropout(config.dropout)
        self.reset_parameters()
        if config.tie_head:
            self.head.weight = self.emb.weight                              # one (V, C) matrix, read both ways

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02):
        """GPT-2's start: N(0, std^2) weights, the residual outputs scaled by 1/sqrt(2 layers); unit norms."""
        for name, p in self.named_parameters():
            if p.dim() == 2:
                scale = 1 / math.sqrt(2 * self.config.num_layers) if name.endswith(("out.weight", "down.weight")) else 1
                nn.init.normal_(p, std=std * scale)

    def forward(self, input_ids, scheme: PositionScheme = PositionScheme()):
        c = self.config
        if scheme.log_n and c.log_n:
            raise ValueError("log n† (scaling at evaluation only) is for a model trained without log n; this one "
                             "was trained with it")

        if self.pos_emb is not None:
            if scheme != PositionScheme():
                raise ValueError(f"scheme {scheme.name} rotates q and k; a model with positions='learned' runs under "
                                 f"the default scheme only")
            if input_ids.shape[1] > c.train_length:
                raise ValueError(f"input_ids has {input_ids.shape[1]} positions; a model with positions='learned' "
                                 f"has {c.train_length} (its train_length)")

        dropped = self.training and c.attention_dropout > 0
        mix = partial(dropped_attention, p=c.attention_dropout) if dropped else attention

        def attend(q, k, v):
            if self.pos_emb is not None:
                return mix(q, k, v)
            if c.log_n:   # the entropy-invariant factor ln n / ln L at every position n = 1 .. T
                n = torch.arange(1, q.shape[-2] + 1, dtype=torch.float64)
                q = q * (torch.log(n) / math.log(c.train_length)).to(q.dtype)[:, None]
            return scheme.attend(q, k, v, c.train_length, c.base, mix)

        x = self.emb(input_ids)                                             # (B, T, C)
        if self.pos_emb is not None:
            x = x + self.pos_emb.weight[:input_ids.shape[1]]
        x = self.drop(x)
        for block in self.blocks:
            x = block(x, attend)
        return self.head(self.ln_out(x))
