"""RWKV-7 in flash-linear-attention's Hugging Face layout (its RWKV7ForCausalLM: config.json + safetensors), mapped
to and from BlinkDL's names, which Rwkv7 uses. Rwkv7.from_pretrained / save_pretrained read and write it.

The name map, written once (both directions read _RULES); i is a block index, C = hidden_size, D a LoRA width:

    flash-linear-attention                      BlinkDL (Rwkv7)                 tensor
    model.embeddings.weight                     emb.weight                      same
    model.layers.0.pre_norm.{weight,bias}       blocks.0.ln0.*                  same
    model.layers.i.attn_norm.*, ffn_norm.*      blocks.i.ln1.*, ln2.*           same
    model.layers.i.attn.x_{r,w,k,v,a,g}         blocks.i.att.x_*                same, (1, 1, C)
    model.layers.i.attn.{k_k,k_a}               blocks.i.att.{k_k,k_a}          (C,) <-> (1, 1, C)
    model.layers.i.attn.r_k                     blocks.i.att.r_k                same, (H, N)
    model.layers.i.attn.{r,k,v,o}_proj.weight   blocks.i.att.{receptance,key,value,output}.weight   same
    model.layers.i.attn.{w,a,v,g}_lora.lora.0.weight   blocks.i.att.{w,a,v,g}1  transposed, (D, C) <-> (C, D)
    model.layers.i.attn.{w,a,v,g}_lora.lora.2.weight   blocks.i.att.{w,a,v,g}2  transposed, (C, D) <-> (D, C)
    model.layers.i.attn.{w,a,v}_lora.lora.2.bias       blocks.i.att.{w,a,v}0    (C,) <-> (1, 1, C)
    model.layers.i.attn.g_norm.*                blocks.i.att.ln_x.*             same
    model.layers.i.ffn.x_k                      blocks.i.ffn.x_k                (C,) <-> (1, 1, C)
    model.layers.i.ffn.{key,value}.weight       blocks.i.ffn.{key,value}.weight same
    model.norm.*                                ln_out.*                        same
    lm_head.weight                              head.weight                     same

The math is the same on both sides: fla's LoRA is Linear(C, D) -> activation -> Linear(D, C) with the bias
holding BlinkDL's x0 vector (so lora.0.weight is w1^T, lora.2.weight is w2^T); its log decay
-exp(-0.5) sigmoid(w_lora(x)) equals BlinkDL's -exp(-softplus(-(w0 + tanh(x w1) w2)) - 0.5); its group norm's eps is
head_dim * norm_eps (BlinkDL: 64e-5, the same for head size 64). Sources: flash-linear-attention's
fla/models/rwkv7 and fla/layers/rwkv7.py (https://github.com/fla-org/flash-linear-attention), BlinkDL's
RWKV-v7 code (https://github.com/BlinkDL/RWKV-LM).
"""
from __future__ import annotations

import functools
import re

import torch

__all__ = ["fla_to_blink", "blink_to_fla", "config_from_fla", "config_to_fla", "FLA_MODEL_TYPE"]

FLA_MODEL_TYPE = "rwkv7"
# fla's RWKV7Config defaults for the fields a config.json may leave out.
_FLA_DEFAULTS = dict(hidden_size=2048, hidden_ratio=4, intermediate_size=None, num_hidden_layers=24, head_dim=64,
                     num_heads=None, decay_low_rank_dim=64, gate_low_rank_dim=128, a_low_rank_dim=64,
                     v_low_rank_dim=16, hidden_act="sqrelu", norm_first=True, norm_bias=True, norm_eps=1e-5,
                     attn=None, tie_word_embeddings=False, vocab_size=32000, value_dim=None)

# (fla name, BlinkDL name, how the tensor changes from fla to BlinkDL). A {field} stands for any value of
# _FIELDS[field]; the same value on both sides.
_RULES = [
    ("model.embeddings.weight", "emb.weight", "same"),
    ("model.layers.0.pre_norm.{p}", "blocks.0.ln0.{p}", "same"),
    ("model.layers.{i}.attn_norm.{p}", "blocks.{i}.ln1.{p}", "same"),
    ("model.layers.{i}.ffn_norm.{p}", "blocks.{i}.ln2.{p}", "same"),
    ("model.layers.{i}.attn.x_{x}", "blocks.{i}.att.x_{x}", "same"),
    ("model.layers.{i}.attn.{kk}", "blocks.{i}.att.{kk}", "vector"),
    ("model.layers.{i}.attn.r_k", "blocks.{i}.att.r_k", "same"),
    ("model.layers.{i}.attn.r_proj.weight", "blocks.{i}.att.receptance.weight", "same"),
    ("model.layers.{i}.attn.k_proj.weight", "blocks.{i}.att.key.weight", "same"),
    ("model.layers.{i}.attn.v_proj.weight", "blocks.{i}.att.value.weight", "same"),
    ("model.layers.{i}.attn.o_proj.weight", "blocks.{i}.att.output.weight", "same"),
    ("model.layers.{i}.attn.{lora}_lora.lora.0.weight", "blocks.{i}.att.{lora}1", "transposed"),
    ("model.layers.{i}.attn.{lora}_lora.lora.2.weight", "blocks.{i}.att.{lora}2", "transposed"),
    ("model.layers.{i}.attn.{bias}_lora.lora.2.bias", "blocks.{i}.att.{bias}0", "vector"),
    ("model.layers.{i}.attn.g_norm.{p}", "blocks.{i}.att.ln_x.{p}", "same"),
    ("model.layers.{i}.ffn.x_k", "blocks.{i}.ffn.x_k", "vector"),
    ("model.layers.{i}.ffn.{kv}.weight", "blocks.{i}.ffn.{kv}.weight", "same"),
    ("model.norm.{p}", "ln_out.{p}", "same"),
    ("lm_head.weight", "head.weight", "same"),
]
_FIELDS = {"i": r"\d+", "p": "weight|bias", "x": "[rwkvag]", "kk": "k_k|k_a", "lora": "[wavg]", "bias": "[wav]",
           "kv": "key|value"}


@functools.lru_cache(maxsize=None)
def _regex(template: str) -> re.Pattern:
    """A name template as a regex with one named group per {field}."""
    parts = re.split(r"\{(\w+)\}", template)        # literal, field, literal, field, ...
    return re.compile("".join(re.escape(part) if n % 2 == 0 else f"(?P<{part}>{_FIELDS[part]})"
                              for n, part in enumerate(parts)))


def _convert(state_dict: dict, to_blink: bool) -> dict:
    """Rename (and reshape or transpose) every tensor by _RULES, read fla -> BlinkDL or the other way."""
    out = {}
    for name, tensor in state_dict.items():
        for fla, blink, how in _RULES:
            source, target = (fla, blink) if to_blink else (blink, fla)
            match = _regex(source).fullmatch(name)
            if match:
                break
        else:
            side = "flash-linear-attention" if to_blink else "Rwkv7"
            raise KeyError(f"{side} checkpoint has a tensor the RWKV-7 name map does not know: {name!r}")
        if how == "transposed":
            tensor = tensor.T
        elif how == "vector":
            tensor = tensor.reshape(1, 1, -1) if to_blink else tensor.reshape(-1)
        out[target.format(**match.groupdict())] = tensor
    return out


def fla_to_blink(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """flash-linear-attention's RWKV7ForCausalLM tensors under BlinkDL's names and shapes (views, no copies).

    Args:
        state_dict: name -> tensor as fla saves it.

    Returns:
        name -> tensor as Rwkv7 (and a BlinkDL .pth) holds it.

    Raises:
        KeyError naming a tensor the map does not know.
    """
    return _convert(state_dict, to_blink=True)


def blink_to_fla(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rwkv7's (BlinkDL's) tensors under flash-linear-attention's names and shapes, for save_pretrained.

    Args:
        state_dict: name -> tensor as Rwkv7 holds it.

    Returns:
        name -> tensor as fla's RWKV7ForCausalLM loads it.
    """
    return _convert(state_dict, to_blink=False)


def config_from_fla(config: dict) -> dict:
    """Rwkv7Config's fields from flash-linear-attention's RWKV7Config (config.json).

    Args:
        config: the parsed config.json, model_type "rwkv7".

    Returns:
        keyword arguments of Rwkv7Config.

    Raises:
        ValueError for another model type, or an option Rwkv7 does not have (hybrid attention layers, value_dim
        other than hidden_size, tied embeddings, another activation, post-norm or bias-free norms).
    """
    if config.get("model_type") != FLA_MODEL_TYPE:
        raise ValueError(f"config is for model_type {config.get('model_type')!r}, expected {FLA_MODEL_TYPE!r} "
                         f"(flash-linear-attention's RWKV7ForCausalLM)")
    c = _FLA_DEFAULTS | {k: v for k, v in config.items() if k in _FLA_DEFAULTS}
    C = c["hidden_size"]
    unsupported = {"attn": None, "hidden_act": "sqrelu", "norm_first": True, "norm_bias": True,
                   "tie_word_embeddings": False}
    for key, wanted in unsupported.items():
        if c[key] != wanted:
            raise ValueError(f"config.json: {key} = {c[key]!r} is not supported by Rwkv7 (needs {wanted!r})")
    if c["value_dim"] not in (None, C) and c["value_dim"] != [C] * c["num_hidden_layers"]:
        raise ValueError(f"config.json: value_dim = {c['value_dim']!r} is not supported by Rwkv7 (needs hidden_size)")
    head_size = c["head_dim"]
    if head_size is None:                     # fla then takes the head size from num_heads
        n = c["num_heads"]
        if not (isinstance(n, int) and not isinstance(n, bool) and n > 0 and isinstance(C, int) and C % n == 0):
            raise ValueError(f"config.json: head_dim is null, so num_heads must be a positive int dividing "
                             f"hidden_size = {C!r}; got num_heads = {n!r}")
        head_size = C // n
    dim_ffn = c["intermediate_size"]
    if dim_ffn is None:                       # fla rounds hidden_ratio * C up to a multiple of 32 (ratio null: 4)
        ratio = 4 if c["hidden_ratio"] is None else c["hidden_ratio"]
        if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not ratio > 0:
            raise ValueError(f"config.json: intermediate_size is null, so hidden_ratio must be a number > 0; got "
                             f"hidden_ratio = {ratio!r}")
        dim_ffn = 32 * -(-int(C * ratio) // 32)
    return dict(vocab_size=c["vocab_size"], n_embd=C, n_layer=c["num_hidden_layers"], head_size=head_size,
                dim_ffn=dim_ffn, decay_lora=c["decay_low_rank_dim"], a_lora=c["a_low_rank_dim"],
                v_lora=c["v_low_rank_dim"], gate_lora=c["gate_low_rank_dim"], layer_norm_epsilon=c["norm_eps"],
                group_norm_epsilon=head_size * c["norm_eps"])


def config_to_fla(config) -> dict:
    """flash-linear-attention's config.json for an Rwkv7Config.

    Args:
        config: an Rwkv7Config.

    Returns:
        the config.json dict fla's RWKV7ForCausalLM reads.

    Raises:
        ValueError if the group norm's eps is not head_size * layer_norm_epsilon (fla ties the two).
    """
    if abs(config.group_norm_epsilon - config.head_size * config.layer_norm_epsilon) > 1e-12:
        raise ValueError(f"flash-linear-attention's layout ties the group norm's eps to head_size * norm_eps; this "
                         f"model has group_norm_epsilon = {config.group_norm_epsilon}, head_size * "
                         f"layer_norm_epsilon = {config.head_size * config.layer_norm_epsilon}")
    return _FLA_DEFAULTS | dict(
        model_type=FLA_MODEL_TYPE, architectures=["RWKV7ForCausalLM"], vocab_size=config.vocab_size,
        hidden_size=config.n_embd, num_hidden_layers=config.n_layer, head_dim=config.head_size,
        num_heads=config.n_head, intermediate_size=config.dim_ffn, decay_low_rank_dim=config.decay_lora,
        a_low_rank_dim=config.a_lora, v_low_rank_dim=config.v_lora, gate_low_rank_dim=config.gate_lora,
        norm_eps=config.layer_norm_epsilon)
