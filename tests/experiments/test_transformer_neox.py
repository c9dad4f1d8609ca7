"""The experiments' Transformer in transformers' GPT-NeoX layout (experiments/transformer_neox.py): a random
Transformer exported by save_neox, read by transformers' AutoModelForCausalLM (the peer's own forward, an
independent check of the name map, the row permutation of W_qkv, RoPE's pairing and every switch of the config),
and by load_neox (bit for bit); the settings GPT-NeoX cannot express, refused by name."""
import math

import pytest
import torch

from seqmix.experiments import language_model as lm
from seqmix.experiments import transformer_neox as neox
from seqmix.experiments.transformer import Transformer, TransformerConfig
from seqmix.kernels.testing import FP32_BUDGET, assert_close
from seqmix.models.io import load_pretrained_dir, save_pretrained_dir

transformers = pytest.importorskip("transformers")


@torch.no_grad()
def random_transformer(seed=0, **fields) -> Transformer:
    """A Transformer with every parameter random at a scale where each term shows in the logits (the training
    start's 0.02 would leave attention nearly uniform and the norms at 1 and 0)."""
    torch.manual_seed(seed)
    model = Transformer(TransformerConfig(256, **fields)).eval()
    for name, p in model.named_parameters():
        if p.dim() == 2:
            p.normal_(std=1.0 / math.sqrt(p.shape[1]))
        else:                                                # LayerNorm weights around 1, biases around 0
            p.normal_(mean=float(name.endswith("weight")), std=0.3)
    return model


def peer_logits(folder, ids):
    peer = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert type(peer).__name__ == "GPTNeoXForCausalLM"
    with torch.no_grad():
        return peer(ids).logits


def exported_and_compared(tmp_path, model, ids, what):
    neox.save_neox(model, tmp_path)
    with torch.no_grad():
        ours = model(ids)
    return assert_close(peer_logits(tmp_path, ids), ours, FP32_BUDGET, what)


@pytest.mark.parametrize("fields", [
    dict(hidden_size=48, num_layers=2, head_size=16, train_length=64),
    dict(hidden_size=48, num_layers=2, head_size=24, train_length=64, base=500.0, tie_head=True),
    dict(hidden_size=32, num_layers=1, head_size=8, intermediate_size=40, train_length=16, dropout=0.1,
         attention_dropout=0.2),
])
def test_transformers_runs_the_exported_transformer(tmp_path, fields):
    """Logits within the fp32 budget on random bytes, past the training length too (RoPE has no limit)."""
    model = random_transformer(**fields)
    ids = torch.randint(0, 256, (3, 2 * fields["train_length"] + 3), generator=torch.Generator().manual_seed(1))
    exported_and_compared(tmp_path, model, ids, f"transformers' GPT-NeoX vs the Transformer, {fields}")


def test_the_language_models_transformer_at_its_training_length(tmp_path):
    """The full run's transformer (C 120, 5 layers, head size 40) at T = its training length (256), random."""
    arch, width, layers, head_size = next(spec for spec in lm.FULL.models if spec[0] == "attention")
    model = random_transformer(hidden_size=width, num_layers=layers, head_size=head_size,
                               train_length=lm.FULL.seq_len)
    ids = torch.randint(0, 256, (2, lm.FULL.seq_len), generator=torch.Generator().manual_seed(2))
    exported_and_compared(tmp_path, model, ids, "the language model's transformer, T = 256")


def test_without_the_row_permutation_the_peer_disagrees(tmp_path):
    """The check can fail: W_qkv written in the Transformer's own row order gives other logits."""
    model = random_transformer(hidden_size=48, num_layers=2, head_size=16, train_length=32)
    neox.save_neox(model, tmp_path)
    config, tensors = load_pretrained_dir(tmp_path)
    for i in range(2):
        tensors[f"gpt_neox.layers.{i}.attention.query_key_value.weight"] = model.blocks[i].qkv.weight.detach()
    save_pretrained_dir(tmp_path, config, dict(tensors))
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = model(ids)
    with pytest.raises(AssertionError, match="relative RMS error"):
        assert_close(peer_logits(tmp_path, ids), ours, FP32_BUDGET)


@pytest.mark.parametrize("tie_head", [False, True])
def test_load_neox_reads_back_every_tensor_bit_for_bit(tmp_path, tie_head):
    model = random_transformer(hidden_size=32, num_layers=2, head_size=16, train_length=16, tie_head=tie_head)
    neox.save_neox(model, tmp_path)
    back = neox.load_neox(tmp_path)
    assert back.config == model.config
    ours = model.state_dict()
    assert back.state_dict().keys() == ours.keys()
    for name, t in back.state_dict().items():
        assert torch.equal(t, ours[name]), name
    assert (back.head.weight is back.emb.weight) == tie_head


def test_stored_dtypes_are_kept(tmp_path):
    """An fp16 model (as language_model ships it) is written fp16, the MLP's zero biases too."""
    model = random_transformer(hidden_size=32, num_layers=1, head_size=16, train_length=16).half()
    neox.save_neox(model, tmp_path)
    config, tensors = load_pretrained_dir(tmp_path)
    assert {t.dtype for t in tensors.values()} == {torch.float16}
    assert config["model_type"] == "gpt_neox" and config["use_parallel_residual"] is False


@pytest.mark.parametrize("fields, named", [
    (dict(conv_first=True), "conv_first"), (dict(positions="learned"), "positions='learned'"),
    (dict(log_n=True), "log_n"), (dict(intermediate_size=0), "intermediate_size=0"),
])
def test_settings_gpt_neox_cannot_express_are_refused_by_name(tmp_path, fields, named):
    model = Transformer(TransformerConfig(256, hidden_size=32, num_layers=2, head_size=16, **fields))
    with pytest.raises(ValueError, match=named):
        neox.save_neox(model, tmp_path)
    assert not (tmp_path / "config.json").exists()


@pytest.mark.parametrize("key, value", [("use_parallel_residual", True), ("attention_bias", True),
                                        ("hidden_act", "gelu_new"), ("layer_norm_eps", 1e-6),
                                        ("model_type", "llama")])
def test_a_gpt_neox_the_transformer_does_not_match_is_refused(key, value):
    config = neox.neox_config(TransformerConfig(256, hidden_size=32, num_layers=1, head_size=16))
    assert neox.config_from_neox(config) == TransformerConfig(256, hidden_size=32, num_layers=1, head_size=16,
                                                              train_length=128)
    with pytest.raises(ValueError, match=key):
        neox.config_from_neox({**config, key: value})


def test_partial_rotary_is_refused():
    config = neox.neox_config(TransformerConfig(256, hidden_size=32, num_layers=1, head_size=16))
    config["rope_parameters"] = {**config["rope_parameters"], "partial_rotary_factor": 0.25}
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        neox.config_from_neox(config)


def test_a_nonzero_mlp_bias_is_refused(tmp_path):
    model = random_transformer(hidden_size=32, num_layers=1, head_size=16, train_length=16)
    neox.save_neox(model, tmp_path)
    config, tensors = load_pretrained_dir(tmp_path)
    tensors = dict(tensors)
    tensors["gpt_neox.layers.0.mlp.dense_4h_to_h.bias"] = torch.ones(32)
    save_pretrained_dir(tmp_path, config, tensors)
    with pytest.raises(ValueError, match="dense_4h_to_h.bias is not zero"):
        neox.load_neox(tmp_path)
