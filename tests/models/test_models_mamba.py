"""The Mamba model: reference (NumPy float64) vs torch model vs the peer, transformers' MambaForCausalLM.

The peer runs on the CPU in fp32 (its pure-torch fallbacks of causal_conv1d and the selective scan) with random
weights these tests draw (O(1) activations, step sizes softplus(-2 +- 0.5), A from -0.5 to -8). Sizes are tiny
and different from each other (C = 16, D = 32, N = 5, V = 67, L = 3, and time_step_rank 3 in one config) so that
a transposed or swapped tensor cannot go unnoticed.

The peer keeps K inputs in its conv cache (ours: the K - 1 that are used again) and restarts its SSM from zero
whenever a cached call has more than one token, so it is compared with us on prefill-then-one-token decoding;
arbitrary splits of a sequence are checked against the whole sequence.
"""
from functools import partial

import pytest
import torch
import transformers

from helpers.hf_peer import (assert_states_close, check_against_peer_and_reference, check_checkpoint_round_trip,
                             check_float64_copy, check_fp16_copy, check_pieces_equal_whole, check_training_step,
                             input_lengths, peer_greedy)
from helpers.hf_peer import make_models as make_peer_and_ours
from helpers.hf_peer import tokens as random_tokens
from seqmix.models.io import save_state_dict
from seqmix.models.mamba import MambaConfig, MambaForCausalLM, MambaModel
from seqmix.kernels.testing import FP32_BUDGET, assert_close
from seqmix.reference import mamba as ref

STATE_NAMES = ("conv window", "h")                   # the tensors of one block's state
SMALL = dict(vocab_size=67, hidden_size=16, state_size=5, num_hidden_layers=3, expand=2)
B, T = 2, 9
CONFIGS = {
    "defaults-tied": {},                                            # K = 4, time_step_rank = ceil(16/16) = 1
    "biases-K3-rank3-untied": dict(use_bias=True, conv_kernel=3, time_step_rank=3, tie_word_embeddings=False,
                                   layer_norm_epsilon=1e-3),
    "no-conv-bias-K2": dict(use_conv_bias=False, conv_kernel=2),
}


def randomize(model, seed):
    """Draw every parameter of a Mamba model (ours or transformers', same names)."""
    g = torch.Generator().manual_seed(seed)

    def randn(shape):
        return torch.randn(shape, generator=g)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "norm_f.weight")):
                p.copy_(1.0 + 0.2 * randn(p.shape))
            elif name.endswith("A_log"):
                p.copy_(torch.log(0.5 + 7.5 * torch.rand(p.shape, generator=g)))
            elif name.endswith("dt_proj.bias"):
                p.copy_(-2.0 + 0.5 * randn(p.shape))
            elif name.endswith((".D", "embeddings.weight")):
                p.copy_(randn(p.shape))
            elif name.endswith(".bias"):
                p.copy_(0.2 * randn(p.shape))
            else:                                                   # Linear (out, in); conv1d (D, 1, K)
                p.copy_(randn(p.shape) / (p.shape[-1] if p.dim() == 3 else p.shape[1]) ** 0.5)
    return model


def make_models(seed=0, **overrides):
    """(peer in eval mode, a copy of its state dict, our MambaForCausalLM loaded from it, config dict)."""
    config = dict(SMALL, **overrides)
    peer = transformers.MambaForCausalLM(transformers.MambaConfig(**config))
    return (*make_peer_and_ours(peer, MambaForCausalLM, MambaConfig(**config), randomize, seed), config)


def reference_logits(state_dict, config, ids, state=None):
    params = {k[len("backbone."):]: v.double().numpy() for k, v in state_dict.items() if k.startswith("backbone.")}
    hidden, state = ref.forward(params, ids.numpy(), state, eps=config.get("layer_norm_epsilon", 1e-5))
    return hidden @ state_dict["lm_head.weight"].double().numpy().T, state


def tokens(seed, batch=B, length=T):
    return random_tokens(seed, batch, length, SMALL["vocab_size"])


def peer_states(cache, num_layers):
    """The peer's cache as our state: (the last K - 1 conv inputs, h) per block."""
    return [(cache.get_conv_state(i)[..., 1:], cache.get_recurrent_state(i)) for i in range(num_layers)]


@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_reference_and_torch_model_match_the_peer(overrides):
    peer, state_dict, ours, config = make_models(**overrides)
    check_against_peer_and_reference(peer, ours, tokens(1), partial(reference_logits, state_dict, config),
                                     lambda out: peer_states(out.cache_params, config["num_hidden_layers"]),
                                     config["num_hidden_layers"], STATE_NAMES)


def test_prefill_then_decode_equals_the_whole_and_the_peer():
    peer, state_dict, ours, config = make_models(**CONFIGS["biases-K3-rank3-untied"])
    ids, prefill = tokens(2), 4
    ref_logits, ref_state = reference_logits(state_dict, config, ids)
    with torch.no_grad():
        mine = ours(ids[:, :prefill])
        theirs = peer(ids[:, :prefill], use_cache=True)
        my_logits, their_logits = [mine.logits], [theirs.logits]
        for t in range(prefill, T):
            mine = ours(ids[:, t:t + 1], state=mine.state)
            theirs = peer(ids[:, t:t + 1], cache_params=theirs.cache_params, use_cache=True)
            my_logits.append(mine.logits)
            their_logits.append(theirs.logits)
    assert_close(torch.cat(my_logits, dim=1), ref_logits, FP32_BUDGET, "torch decoding vs reference whole")
    assert_close(torch.cat(their_logits, dim=1), ref_logits, FP32_BUDGET, "peer decoding vs reference whole")
    assert_states_close(mine.state, ref_state, FP32_BUDGET, "torch after decoding", STATE_NAMES)
    assert_states_close(peer_states(theirs.cache_params, 3), ref_state, FP32_BUDGET, "peer after decoding",
                        STATE_NAMES)


@pytest.mark.parametrize("cuts", [(1,), (2,), (3, 4, 7)], ids=str)
def test_pieces_with_the_state_equal_the_whole(cuts):
    """Any split, pieces of several tokens included (the peer cannot: it restarts its SSM on such pieces)."""
    _, state_dict, ours, config = make_models(**CONFIGS["defaults-tied"])
    check_pieces_equal_whole(ours, tokens(3), cuts, partial(reference_logits, state_dict, config), STATE_NAMES)


def test_float64_model_matches_the_reference_to_rounding():
    _, state_dict, ours, config = make_models(**CONFIGS["biases-K3-rank3-untied"])
    check_float64_copy(ours, tokens(4), partial(reference_logits, state_dict, config), STATE_NAMES)


def test_fp16_model_within_the_fp16_budget():
    _, state_dict, ours, config = make_models(**CONFIGS["defaults-tied"])
    check_fp16_copy(ours, tokens(5), partial(reference_logits, state_dict, config))


def test_training_loss_and_gradients_match_the_peer():
    peer, _, ours, _ = make_models(**CONFIGS["biases-K3-rank3-untied"])
    ids = tokens(6)
    labels = ids.clone()
    labels[1, 2:5] = -100                                           # ignored positions
    check_training_step(peer, ours, ids, labels)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("writer", ["ours", "peer", "torch.save"])
def test_checkpoint_round_trips(writer, tied, tmp_path):
    peer, state_dict, ours, _ = make_models(tie_word_embeddings=tied)
    check_checkpoint_round_trip(writer, peer, state_dict, ours,
                                (MambaForCausalLM, MambaModel, transformers.MambaForCausalLM), "backbone",
                                tmp_path, tokens(7))


def test_greedy_generation_matches_the_peer_with_one_token_per_step():
    peer, _, ours, _ = make_models(**CONFIGS["biases-K3-rank3-untied"])
    prompt = tokens(8, length=5)
    with input_lengths(ours.backbone) as lengths:
        out, _ = ours.generate(prompt, max_new_tokens=8)
    assert torch.equal(out, peer_greedy(peer, prompt, 8))
    assert lengths[0] == 5 and set(lengths[1:]) == {1}              # the prompt once, then one token per step


def test_triton_backend_model():
    _, state_dict, ours, config = make_models(**CONFIGS["biases-K3-rank3-untied"])
    ids = tokens(9, length=6)
    ref_logits, ref_state = reference_logits(state_dict, config, ids)
    with torch.no_grad():
        first = ours(ids[:, :4], backend="triton")
        second = ours(ids[:, 4:5], state=first.state, backend="triton")
        third = ours(ids[:, 5:], state=second.state, backend="triton")
    logits = torch.cat([first.logits, second.logits, third.logits], dim=1)
    assert_close(logits, ref_logits, FP32_BUDGET, "triton logits")
    assert_states_close(third.state, ref_state, FP32_BUDGET, "triton", STATE_NAMES)


def test_bad_token_ids_are_refused():
    _, state_dict, ours, config = make_models()
    for bad in (torch.tensor([[0, 67]]), torch.tensor([[-1, 3]])):
        with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 67\)"):
            ours(bad)
        with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 67\)"):
            reference_logits(state_dict, config, bad)
    with pytest.raises(TypeError, match="input_ids must be an integer tensor"):
        ours(torch.zeros(1, 3))


def test_bad_state_is_refused():
    _, state_dict, ours, config = make_models()
    with torch.no_grad():
        state = ours(tokens(10)).state
    bad = list(state)
    bad[1] = (state[1][0][..., :2], state[1][1])
    with pytest.raises(ValueError, match=r"state\[1\]\[0\] \(conv window\) must have shape \(2, 32, 3\)"):
        ours(tokens(10), state=bad)
    with pytest.raises(ValueError, match="state must be a list of 3 .conv window, h. pairs"):
        ours(tokens(10), state=state[:2])
    with pytest.raises(ValueError, match="state must be one .conv window, h. pair per block"):
        reference_logits(state_dict, config, tokens(10), [tuple(s.numpy() for s in pair) for pair in bad])


@pytest.mark.parametrize("damage", ["missing", "misshapen"])
def test_bad_checkpoint_names_the_tensor(damage, tmp_path):
    _, state_dict, ours, _ = make_models()
    name = "backbone.layers.2.mixer.x_proj.weight"
    if damage == "missing":
        del state_dict[name]
        error, message = KeyError, f"missing tensor '{name}'"
    else:
        state_dict[name] = state_dict[name].T.contiguous()
        error, message = ValueError, rf"'{name}' has shape \(32, 11\), expected \(11, 32\)"
    ours.save_pretrained(tmp_path)
    save_state_dict(state_dict, tmp_path / "model.safetensors")
    with pytest.raises(error, match=message):
        MambaForCausalLM.from_pretrained(tmp_path)


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="hidden_act: only 'silu'"):
        MambaConfig(**SMALL, hidden_act="gelu")
