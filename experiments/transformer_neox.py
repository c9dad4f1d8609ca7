"""The experiments' Transformer (experiments/transformer.py) in transformers' GPT-NeoX layout (GPTNeoXForCausalLM:
config.json + model.safetensors), the format in which the trained language model ships: save_neox writes it,
transformers' AutoModelForCausalLM reads it, and load_neox reads it back into a Transformer.

GPT-NeoX is the transformers architecture whose layer is this one term by term, once its switches are set:

    Transformer                                  GPT-NeoX, use_parallel_residual = False
    x = emb[ids]                                 gpt_neox.embed_in
    x += W_o attention(RoPE(W_qkv LN_1(x)))      attention.dense(attention(RoPE(query_key_value(input_layernorm(x)))))
    x += W_2 gelu(W_1 LN_2(x))                   mlp.dense_4h_to_h(gelu(mlp.dense_h_to_4h(post_attention_layernorm(x))))
    logits = head(LN(x))                         lm_head(final_layer_norm(x)), stored as embed_out (the Hub's name)

- RoPE: both rotate halves (channel f turns with channel f + d/2) by p theta_f, theta_f = base^(-2f/d), over the
  whole head (rotary_pct 1.0, rope_theta = base); attention's scale 1/sqrt(d) in both; causal.
- LayerNorm: eps 1e-5 with weight and bias in both; the activation is exact (erf) GELU in both ("gelu").
- Biases: attention_bias = False removes query_key_value's and dense's, which the Transformer does not have;
  GPT-NeoX's MLP always has biases, written as zeros (load_neox refuses a checkpoint where they are not zero).
- W_qkv's rows: the Transformer reads them as (3, H, d) (q of every head, then k, then v), GPT-NeoX as (H, 3, d)
  (q, k, v of head 0, then head 1, ...): the rows are permuted, nothing else changes.
- Dropout: the Transformer's dropout acts where GPT-NeoX's hidden_dropout does (the embedding and each branch's
  output), its attention_dropout where GPT-NeoX's does (the attention weights).
- A tied head (tie_head) is tie_word_embeddings; max_position_embeddings is train_length (RoPE itself has no limit).
What GPT-NeoX cannot express is refused with a ValueError naming the setting: a convolution block (conv_first),
learned positions (positions="learned"), log n scaling (log_n), a block without an MLP (intermediate_size=0).
One difference remains by construction: transformers computes RoPE's angles in fp32, the Transformer in float64
(kernels.rerope.apply_rope), a difference of order p * 1e-7 radians at position p.

Sources: transformers' models/gpt_neox (configuration_gpt_neox.py, modeling_gpt_neox.py; release 5.23 installed
here, whose conversion map renames embed_out to lm_head), https://github.com/huggingface/transformers.
"""
from __future__ import annotations

import torch

from ..models.io import load_pretrained_dir, save_pretrained_dir
from .transformer import Transformer, TransformerConfig

__all__ = ["NEOX_MODEL_TYPE", "neox_config", "config_from_neox", "to_neox", "from_neox", "save_neox", "load_neox"]

NEOX_MODEL_TYPE = "gpt_neox"
_LAYER_NORM_EPS = 1e-5                 # torch.nn.LayerNorm's default, which the Transformer uses
_BLOCK = {"ln1": "input_layernorm", "ln2": "post_attention_layernorm", "qkv": "attention.query_key_value",
          "out": "attention.dense", "up": "mlp.dense_h_to_4h", "down": "mlp.dense_4h_to_h"}
_OUTER = {"emb.weight": "gpt_neox.embed_in.weight", "ln_out.weight": "gpt_neox.final_layer_norm.weight",
          "ln_out.bias": "gpt_neox.final_layer_norm.bias", "head.weight": "embed_out.weight"}


def _check_expressible(config: TransformerConfig) -> None:
    for unsupported, setting in ((config.conv_first, "conv_first=True (a gated convolution as block 0)"),
                                 (config.positions != "rope", f"positions={config.positions!r}"),
                                 (config.log_n, "log_n=True (q scaled by ln n / ln L)"),
                                 (config.intermediate_size == 0, "intermediate_size=0 (blocks without an MLP)")):
        if unsupported:
            raise ValueError(f"GPT-NeoX's layout cannot express the Transformer setting {setting}; it has RoPE "
                             f"attention and an MLP in every block and nothing else")


def neox_config(config: TransformerConfig) -> dict:
    """The config.json of transformers' GPTNeoXForCausalLM for a Transformer of ``config``.

    Both spellings of RoPE's settings are written: rope_parameters (transformers 5) and rotary_pct /
    rotary_emb_base (transformers 4, which 5 reads when rope_parameters is absent).

    Raises:
        ValueError naming a setting GPT-NeoX cannot express (_check_expressible).
    """
    _check_expressible(config)
    return {"model_type": NEOX_MODEL_TYPE, "architectures": ["GPTNeoXForCausalLM"],
            "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
            "num_hidden_layers": config.num_layers, "num_attention_heads": config.hidden_size // config.head_size,
            "intermediate_size": config.intermediate_size, "hidden_act": "gelu", "layer_norm_eps": _LAYER_NORM_EPS,
            "use_parallel_residual": False, "attention_bias": False, "max_position_embeddings": config.train_length,
            "rope_parameters": {"rope_type": "default", "rope_theta": config.base, "partial_rotary_factor": 1.0},
            "rotary_pct": 1.0, "rotary_emb_base": config.base, "tie_word_embeddings": config.tie_head,
            "hidden_dropout": config.dropout, "attention_dropout": config.attention_dropout, "initializer_range": 0.02,
            "bos_token_id": 0, "eos_token_id": 0, "use_cache": True}


def config_from_neox(config: dict) -> TransformerConfig:
    """A TransformerConfig from a GPT-NeoX config.json (as neox_config writes it, or another with these settings).

    Raises:
        ValueError naming a setting the Transformer does not have (another model type, parallel residuals,
        attention biases, partial or scaled RoPE, another activation or LayerNorm eps).
    """
    if config.get("model_type") != NEOX_MODEL_TYPE:
        raise ValueError(f"config is for model_type {config.get('model_type')!r}, expected {NEOX_MODEL_TYPE!r}")
    rope = config.get("rope_parameters") or {"rope_type": "default", "rope_theta": config.get("rotary_emb_base"),
                                             "partial_rotary_factor": config.get("rotary_pct")}
    needed = {"use_parallel_residual": False, "attention_bias": False, "hidden_act": "gelu",
              "layer_norm_eps": _LAYER_NORM_EPS, "rope_type": "default", "partial_rotary_factor": 1.0}
    for key, wanted in needed.items():
        found = rope.get(key) if key in ("rope_type", "partial_rotary_factor") else config.get(key)
        if found != wanted:
            raise ValueError(f"config.json: {key} = {found!r} is not supported by the Transformer (needs {wanted!r})")
    C, heads = config["hidden_size"], config["num_attention_heads"]
    return TransformerConfig(config["vocab_size"], hidden_size=C, num_layers=config["num_hidden_layers"],
                             head_size=C // heads, intermediate_size=config["intermediate_size"],
                             train_length=config["max_position_embeddings"], base=float(rope["rope_theta"]),
                             tie_head=bool(config.get("tie_word_embeddings", False)),
                             dropout=float(config.get("hidden_dropout", 0.0)),
                             attention_dropout=float(config.get("attention_dropout", 0.0)))


def _qkv_rows(weight: torch.Tensor, heads: int, to_neox: bool) -> torch.Tensor:
    """W_qkv (3 C, C) with its rows read as (3, H, d) -> (H, 3, d) (to_neox) or back."""
    C = weight.shape[1]
    shape = (3, heads, C // heads, C) if to_neox else (heads, 3, C // heads, C)
    return weight.reshape(shape).transpose(0, 1).reshape(3 * C, C)


def _name_pairs(config: TransformerConfig):
    """(Transformer name, GPT-NeoX name) for every tensor the two share; the head left out where it is tied."""
    for ours, theirs in _OUTER.items():
        if not (ours == "head.weight" and config.tie_head):
            yield ours, theirs
    for i in range(config.num_layers):
        for ours, theirs in _BLOCK.items():
            for p in ("weight", "bias") if ours.startswith("ln") else ("weight",):
                yield f"blocks.{i}.{ours}.{p}", f"gpt_neox.layers.{i}.{theirs}.{p}"


def to_neox(state_dict: dict[str, torch.Tensor], config: TransformerConfig) -> dict[str, torch.Tensor]:
    """The Transformer's tensors under GPT-NeoX's names and layout, the MLP's zero biases added (same dtype)."""
    _check_expressible(config)
    heads = config.hidden_size // config.head_size
    out = {}
    for ours, theirs in _name_pairs(config):
        t = state_dict[ours]
        out[theirs] = _qkv_rows(t, heads, to_neox=True) if ours.endswith("qkv.weight") else t
    for i in range(config.num_layers):
        for name, width in (("dense_h_to_4h", config.intermediate_size), ("dense_4h_to_h", config.hidden_size)):
            out[f"gpt_neox.layers.{i}.mlp.{name}.bias"] = state_dict[f"blocks.{i}.up.weight"].new_zeros(width)
    return out


def from_neox(state_dict: dict[str, torch.Tensor], config: TransformerConfig) -> dict[str, torch.Tensor]:
    """GPT-NeoX's tensors under the Transformer's names (the MLP's biases, which must be zero, dropped).

    Raises:
        KeyError naming a missing tensor; ValueError naming a nonzero MLP bias.
    """
    theirs = {("embed_out." + k[len("lm_head."):] if k.startswith("lm_head.") else k): v   # transformers 5's name
              for k, v in state_dict.items()}
    heads = config.hidden_size // config.head_size
    out = {}
    for ours, name in _name_pairs(config):
        if name not in theirs:
            raise KeyError(f"GPT-NeoX checkpoint has no tensor {name!r} (the Transformer's {ours!r})")
        t = theirs[name]
        out[ours] = _qkv_rows(t, heads, to_neox=False) if ours.endswith("qkv.weight") else t
    for name, t in theirs.items():
        if name.endswith(("dense_h_to_4h.bias", "dense_4h_to_h.bias")) and bool(t.any()):
            raise ValueError(f"GPT-NeoX checkpoint: {name} is not zero; the Transformer's MLP has no biases")
    if config.tie_head:
        out["head.weight"] = out["emb.weight"]
    return out


def save_neox(model: Transformer, local_dir) -> None:
    """Write ``model`` (its tensors in their own dtypes) as a GPTNeoXForCausalLM directory: config.json and
    model.safetensors, atomically (models.io.save_pretrained_dir). Raises ValueError as neox_config does."""
    config = neox_config(model.config)
    save_pretrained_dir(local_dir, config, to_neox(model.state_dict(), model.config))


def load_neox(local_dir, dtype: torch.dtype = torch.float32) -> Transformer:
    """The Transformer saved in a GPT-NeoX directory (save_neox's, or another with the same settings), in
    ``dtype``, in eval mode. Raises ValueError / KeyError as config_from_neox and from_neox do."""
    config_dict, state_dict = load_pretrained_dir(local_dir)
    config = config_from_neox(config_dict)
    model = Transformer(config)
    model.load_state_dict({k: v.to(dtype) for k, v in from_neox(state_dict, config).items()})
    return model.to(dtype).eval()
