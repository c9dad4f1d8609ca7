"""The models the experiments train, at one width and depth, from the project's own modules:

    "attention"   experiments.transformer.Transformer (RoPE)        a KV cache that grows with T
    "attention_zoology"  the same Transformer in Zoology's shape (ZOOLOGY_ATTENTION): one head, no MLP, learned
                  positions, the head tied, dropout 0.1 on the attention weights
    "rwkv4"       models.rwkv4.RwkvForCausalLM                       WKV-4: a decayed sum, state 2 C (+ C maxima)
    "rwkv7"       models.rwkv7.Rwkv7 (BlinkDL's training start)      WKV-7: the delta rule, state C * head_size
    "mamba"       models.mamba.MambaForCausalLM (Mamba's training start) selective scan, state 2 C * state_size
    "mamba_lti"   the same Mamba with delta, B and C held constant  a time-invariant (LTI) SSM, same state
    "mamba_ungated", "mamba_lti_ungated"   the two without the block's gate (MambaConfig.gate = False): the
                  Mamba paper's "no gate" pair, S6 and S4 in its Table 1
    "linear_attention", "retention", "gla", "delta_rule", "delta_rule_wide", "gated_delta_rule"
                  the rungs of the family (experiments.rungs): RWKV-7 with a rung's transition in its time mix,
                  run by the WKV-7 op; state C * head_size, as RWKV-7's

The time-invariant model is the project's Mamba with one change: each block's x_proj, which makes (delta, B, C)
from the input at every step, is replaced by learned constants. The selective scan then runs the ZOH-discretized
diagonal system of notebook 06 with one fixed step size per channel: A_bar = exp(delta A), B_bar = delta B,
the same at every t, so that y = K * u with K_l = C A_bar^l B_bar (a convolution).
"""
from __future__ import annotations

import torch
from torch import nn

from . import rungs
from .transformer import Transformer, TransformerConfig
from ..models.mamba import MambaConfig, MambaForCausalLM
from ..models.rwkv4 import RwkvConfig, RwkvForCausalLM
from ..models.rwkv7 import Rwkv7, Rwkv7Config

__all__ = ["ARCHITECTURES", "ZOOLOGY_ATTENTION", "TimeInvariantProjection", "time_invariant_system",
           "rwkv7_training_init", "mamba_training_init", "build", "logits", "num_parameters", "state_size"]

_MAMBAS = {"mamba": (True, True), "mamba_lti": (False, True), "mamba_ungated": (True, False),
           "mamba_lti_ungated": (False, False)}    # arch -> (selective, gated)
ARCHITECTURES = ("attention", "attention_zoology", "rwkv4", "rwkv7", *_MAMBAS, *rungs.RUNGS)
# "attention_zoology": the attention model of Zoology's MQAR experiments (Arora et al. 2023; zoology/mixers/attention.py
# and its figure-2 configs), as far as the project's Transformer has its settings: one head as wide as the model,
# attention alone in each block (no MLP), learned absolute positions, the output head tied to the token embedding,
# dropout 0.1 on the attention weights. Left out: its biases, and its dropout 0.1 on the embedding alone (the
# Transformer's `dropout` drops the residual branches too). Issue 45's probes (experiments/results/recall_probes.json,
# N = 8, C = 64) measured two of these as needed there: without the attention weights' dropout, or with RoPE for the
# learned positions, the model stays at chance.
ZOOLOGY_ATTENTION = dict(channel_mix=False, positions="learned", tie_head=True, attention_dropout=0.1)


class TimeInvariantProjection(nn.Module):
    """Stands in for Mamba's x_proj: the same (B, T, rank + 2N) output (dt_low, B, C), but one learned vector for
    every position and sequence, so that delta, B and C no longer depend on the input."""

    def __init__(self, rank: int, state_size: int):
        super().__init__()
        # dt_low = 0 leaves delta = softplus(dt_proj.bias), Mamba's initial step sizes; B = 1; C ~ N(0, 1).
        self.value = nn.Parameter(torch.cat([torch.zeros(rank), torch.ones(state_size), torch.randn(state_size)]))

    def forward(self, u):                   # u (B, T, D) -> (B, T, rank + 2N)
        return self.value.to(u.dtype).expand(*u.shape[:-1], -1)


@torch.no_grad()
def rwkv7_training_init(model: Rwkv7) -> Rwkv7:
    """BlinkDL's start for training RWKV-7 from scratch (RWKV-LM, RWKV-v7/train_temp/src/model.py), in place.

    Rwkv7.reset_parameters is a plain N(0, 0.02^2) start, under which every channel's decay is about 0.74 per step:
    a memory of a few tokens, which recall cannot use. BlinkDL's start spreads, per layer l of L and channel i of C:
        decay:  w0_i = -7 + 5 (i / (C - 1))^(0.85 + sqrt(l / (L - 1))) + 0.5   (exp(-exp(w)) from ~1 to ~0.9)
        token-shift mixes 1 - (i / C)^p with p per mix and layer;  k_k = 0.85, k_a = 1, r_k = 0
        LoRAs: down-projections 0, up-projections orthogonal * 0.1;  a0 = 0 (a = 0.5), v0 = 1
        r, k, v: uniform(+-0.5 / sqrt(C)); the output projections of both mixes 0 (each block starts as identity)
        ln_x weight ((l + 1) / L)^0.7;  embeddings uniform(+-1e-4);  head orthogonal * 0.5 sqrt(V / C)
    """
    L, C = model.config.n_layer, model.config.n_embd
    ddd = (torch.arange(C) / C).view(1, 1, C)
    for layer, block in enumerate(model.blocks):
        att, ffn = block.att, block.ffn
        r01, r10 = layer / max(L - 1, 1), 1 - layer / L
        mixes = dict(x_r=0.2 * r10, x_w=0.9 * r10, x_k=0.9 * r10, x_v=0.4 * r10, x_a=0.9 * r10, x_g=0.2 * r10)
        extra = dict(x_k=0.4 * r01, x_v=0.6 * r01)
        for name, power in mixes.items():
            getattr(att, name).copy_(1 - (ddd ** power + extra.get(name, 0.0)))
        n = torch.arange(C) / (C - 1)
        att.w0.copy_((-7 + 5 * n ** (0.85 + r01 ** 0.5) + 0.5).view(1, 1, C))
        for c in "wavg":
            if hasattr(att, f"{c}1"):
                getattr(att, f"{c}1").zero_()
                nn.init.orthogonal_(getattr(att, f"{c}2"), gain=0.1)
        att.a0.zero_()
        if hasattr(att, "v0"):
            att.v0.fill_(1.0)
        att.k_k.fill_(0.85)
        att.k_a.fill_(1.0)
        att.r_k.zero_()
        for linear in (att.receptance, att.key, att.value, ffn.key):
            nn.init.uniform_(linear.weight, -0.5 / C ** 0.5, 0.5 / C ** 0.5)
        att.output.weight.zero_()
        ffn.value.weight.zero_()
        att.ln_x.weight.fill_(((layer + 1) / L) ** 0.7)
        ffn.x_k.copy_(1 - ddd ** (r10 ** 4))
    nn.init.uniform_(model.emb.weight, -1e-4, 1e-4)
    V = model.config.vocab_size
    nn.init.orthogonal_(model.head.weight, gain=0.5 * (V / C) ** 0.5 if V > C else 0.5)
    return model


@torch.no_grad()
def mamba_training_init(model: MambaForCausalLM) -> MambaForCausalLM:
    """The start of Mamba's own training code (mamba_ssm, models/mixer_seq_simple.py, _init_weights), in place, on
    top of MambaModel.reset_parameters (which sets the SSM part as Mamba does and leaves torch's defaults elsewhere):
        embeddings ~ N(0, 0.02^2)       torch's N(0, 1), tied to the head, starts at a loss near 60 (vocabulary 128)
        out_proj /= sqrt(layers)        the residual branches' outputs scaled down (rescale_prenorm_residual)
    """
    nn.init.normal_(model.backbone.embeddings.weight, std=0.02)
    for layer in model.backbone.layers:
        layer.mixer.out_proj.weight /= len(model.backbone.layers) ** 0.5
    return model


def build(arch: str, *, vocab_size: int, width: int, layers: int = 2, head_size: int = 16, state_size: int = 16,
          train_length: int = 64, channel_mix: bool = True, conv_first: bool = False,
          positions: str = "rope", freeze_embedding: bool = False, tie_head: bool = False,
          dropout: float = 0.0, attention_dropout: float = 0.0) -> nn.Module:
    """A freshly initialized model (seed torch first for a reproducible one).

    Args:
        arch: one of ARCHITECTURES ("attention_zoology" takes none of the attention-only settings below, and
            ignores head_size: its one head is as wide as the model).
        vocab_size, width (C), layers: as the names say; equal across architectures.
        head_size: attention's, RWKV-7's and the rungs' head size (C / head_size heads).
        state_size: Mamba's N.
        train_length: the transformer's training length (RoPE's log-n maxlen; unused at evaluation = training).
        channel_mix: False leaves out the transformer's MLP (attention alone in each block, as Zoology's models);
            attention only (the recurrent blocks keep theirs).
        conv_first: True makes the transformer's first block a gated short convolution (the Based paper's MQAR
            attention, a Hybrid of BaseConv and attention; TransformerConfig.conv_first); attention only.
        positions: "learned" gives the transformer learned absolute positions instead of RoPE (Zoology's attention;
            TransformerConfig.positions); attention only.
        freeze_embedding: True keeps the transformer's token embedding at its random start (it takes no gradient,
            and AdamW skips it); attention only.
        tie_head, dropout, attention_dropout: the transformer's head tied to its embedding, its dropout rate on
            the embedding and the residual branches, and on the attention weights (TransformerConfig); attention
            only.
    """
    for changed, setting in ((not channel_mix, "channel_mix=False"), (conv_first, "conv_first=True"),
                             (positions != "rope", f"positions={positions!r}"),
                             (freeze_embedding, "freeze_embedding"), (tie_head, "tie_head=True"),
                             (dropout != 0.0, f"dropout={dropout!r}"),
                             (attention_dropout != 0.0, f"attention_dropout={attention_dropout!r}")):
        if changed and arch != "attention":
            raise ValueError(f"{setting} is for attention only, got arch {arch!r}")
    if arch == "attention_zoology":         # one head of the model's width; ZOOLOGY_ATTENTION's settings
        return build("attention", vocab_size=vocab_size, width=width, layers=layers, head_size=width,
                     train_length=train_length, **ZOOLOGY_ATTENTION)
    if arch == "attention":
        model = Transformer(TransformerConfig(vocab_size, hidden_size=width, num_layers=layers, head_size=head_size,
                                              train_length=train_length, intermediate_size=None if channel_mix else 0,
                                              conv_first=conv_first, positions=positions, tie_head=tie_head,
                                              dropout=dropout, attention_dropout=attention_dropout))
        model.emb.weight.requires_grad_(not freeze_embedding)
        return model
    if arch == "rwkv4":
        return RwkvForCausalLM(RwkvConfig(vocab_size=vocab_size, hidden_size=width, num_hidden_layers=layers,
                                          rescale_every=0, context_length=train_length))
    if arch == "rwkv7":
        return rwkv7_training_init(Rwkv7(Rwkv7Config(vocab_size=vocab_size, n_embd=width, n_layer=layers,
                                                     head_size=head_size)))
    if arch in rungs.RUNGS:                 # RWKV-7's training start, then the rung takes over its time mixes
        return rungs.as_rung(rwkv7_training_init(Rwkv7(rungs.RungConfig(vocab_size=vocab_size, n_embd=width,
                                                                        n_layer=layers, head_size=head_size,
                                                                        rung=arch))))
    if arch in _MAMBAS:
        selective, gated = _MAMBAS[arch]
        model = mamba_training_init(MambaForCausalLM(MambaConfig(vocab_size=vocab_size, hidden_size=width,
                                                                 num_hidden_layers=layers, state_size=state_size,
                                                                 gate=gated)))
        if not selective:
            for layer in model.backbone.layers:
                layer.mixer.x_proj = TimeInvariantProjection(layer.mixer.time_step_rank, state_size)
        return model
    raise ValueError(f"arch must be one of {ARCHITECTURES}, got {arch!r}")


@torch.no_grad()
def time_invariant_system(mixer) -> tuple:
    """(delta (D,), A (D, N), B (N,), C (N,)): the constants the scan of a "mamba_lti" (or "mamba_lti_ungated")
    block runs with,
    delta = softplus(dt_proj(dt_low) + bias) and A = -exp(A_log), so that A_bar = exp(delta A), B_bar = delta B."""
    if not isinstance(mixer.x_proj, TimeInvariantProjection):
        raise TypeError(f"mixer must be a block of a 'mamba_lti' model, got x_proj {type(mixer.x_proj).__name__}")
    N = mixer.A_log.shape[1]
    dt_low, B, C = mixer.x_proj.value.detach().split([mixer.time_step_rank, N, N])
    delta = torch.nn.functional.softplus(mixer.dt_proj(dt_low))
    return delta, -torch.exp(mixer.A_log), B, C


def logits(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """(B, T, V) logits of any model built here (the project's models return an output object or a tuple)."""
    out = model(input_ids)
    if isinstance(out, torch.Tensor):
        return out
    return out.logits if hasattr(out, "logits") else out[0]


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def state_size(arch: str, *, width: int, head_size: int = 16, state_size: int = 16, seq_len: int = 64) -> int:
    """Numbers of recurrent state per layer that carry information about the past: attention's keys and values
    (2 C T at length T), WKV-4's numerator and denominator (2 C), WKV-7's matrices (C * head_size), Mamba's SSM
    state (2 C * N; the conv window adds 2 C * 3)."""
    sizes = {"attention": 2 * width * seq_len, "attention_zoology": 2 * width * seq_len, "rwkv4": 2 * width,
             "rwkv7": width * head_size,
             **{arch: width * head_size for arch in rungs.RUNGS},
             **{arch: 2 * width * state_size for arch in _MAMBAS}}
    if arch not in sizes:
        raise ValueError(f"arch must be one of {ARCHITECTURES}, got {arch!r}")
    return sizes[arch]
