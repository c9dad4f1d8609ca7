"""The RWKV-4 model: reference (NumPy float64) vs torch model vs the peer, transformers' RwkvForCausalLM.

The peer runs on the CPU in fp32 with random weights these tests draw (at scales where every part of the model
matters: decays e^{-exp(N(0, 1))}, O(1) activations). Sizes are tiny and different from each other (C = 16,
F = 40, V = 67, L = 3) so that a transposed or swapped tensor cannot go unnoticed.

Two peer bugs shape these tests (both in transformers 5.23's modeling_rwkv.py, reported to the lead):
- one token with a state and batch B > 1 broadcasts (B, 1, C) against (1, B, C) into a (B, B, C) "sequence", so
  the peer's own state path is only used here with batch 1 or with pieces longer than one token; greedy
  continuations of the peer are computed by re-reading the whole sequence, which has no state at all;
- at the first eval-mode forward the peer divides its weights in place (rescale_every), so its state dict is
  copied before it ever runs.
"""
import subprocess
import sys
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
from seqmix.models.generation import sample_next
from seqmix.models.rwkv4 import STATE_NAMES, RwkvConfig, RwkvForCausalLM, RwkvModel
from seqmix.kernels.testing import FP32_BUDGET, assert_close, rel_rms
from seqmix.reference import rwkv4 as ref

SMALL = dict(vocab_size=67, context_length=64, hidden_size=16, num_hidden_layers=3, intermediate_size=40)
B, T = 2, 9


def randomize(model, seed):
    """Draw every parameter of an RWKV-4 model (ours or transformers', same names)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.split(".")[-2] if name.endswith((".weight", ".bias")) else name.split(".")[-1]
            if leaf in ("pre_ln", "ln1", "ln2", "ln_out"):
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn(p.shape, generator=g))
            elif leaf.startswith("time_mix"):
                p.copy_(torch.rand(p.shape, generator=g))
            elif leaf in ("time_decay", "time_first", "embeddings"):
                p.copy_(torch.randn(p.shape, generator=g))
            else:                                                   # Linear (out, in)
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    return model


def make_models(seed=0, **overrides):
    """(peer in eval mode, a clean copy of its state dict, our RwkvForCausalLM loaded from it, config dict)."""
    config = dict(SMALL, **overrides)
    peer = transformers.RwkvForCausalLM(transformers.RwkvConfig(**config))
    return (*make_peer_and_ours(peer, RwkvForCausalLM, RwkvConfig(**config), randomize, seed), config)


def reference_params(state_dict):
    """The reference's params (RwkvModel names) and head from a RwkvForCausalLM state dict."""
    params = {k[len("rwkv."):]: v.double().numpy() for k, v in state_dict.items() if k.startswith("rwkv.")}
    return params, state_dict["head.weight"].double().numpy()


def reference_logits(state_dict, config, ids, state=None, rescale_every=None):
    params, head = reference_params(state_dict)
    if rescale_every is None:
        rescale_every = config.get("rescale_every", 6)
    hidden, state = ref.forward(params, ids.numpy(), state, eps=config.get("layer_norm_epsilon", 1e-5),
                                rescale_every=rescale_every)
    return ref.logits(head, hidden), state


def tokens(seed, batch=B, length=T):
    return random_tokens(seed, batch, length, SMALL["vocab_size"])


CONFIGS = {
    "no-rescale": {},                                               # rescale_every = 6 > depth: never applies
    "rescale-every-block": dict(rescale_every=1, layer_norm_epsilon=1e-3),
    "rescale-every-2-tied": dict(rescale_every=2, tie_word_embeddings=True),
}


@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_reference_and_torch_model_match_the_peer(overrides):
    peer, state_dict, ours, config = make_models(**overrides)
    check_against_peer_and_reference(peer, ours, tokens(1), partial(reference_logits, state_dict, config),
                                     lambda out: out.state, config["num_hidden_layers"], STATE_NAMES)


def test_rescaling_is_visible_and_only_at_inference():
    """With rescale_every = 1 and eps = 1e-3 the rescaled model differs from the plain one by far more than the
    budget (so the comparisons above can tell them apart); in training mode neither model rescales."""
    overrides = CONFIGS["rescale-every-block"]
    peer, state_dict, ours, config = make_models(**overrides)
    ids = tokens(2)
    rescaled, _ = reference_logits(state_dict, config, ids)
    plain, _ = reference_logits(state_dict, config, ids, rescale_every=0)
    assert rel_rms(rescaled, plain) > 100 * FP32_BUDGET
    peer.train()
    ours.train()
    with torch.no_grad():
        assert_close(ours(ids).logits, plain, FP32_BUDGET, "torch (training mode) vs reference without rescaling")
        assert_close(peer(ids).logits, plain, FP32_BUDGET, "peer (training mode) vs reference without rescaling")


@pytest.mark.parametrize("cuts", [(1,), (4,), (1, 2, 6)], ids=str)
def test_pieces_with_the_state_equal_the_whole(cuts):
    _, state_dict, ours, config = make_models(**CONFIGS["rescale-every-2-tied"])
    check_pieces_equal_whole(ours, tokens(3), cuts, partial(reference_logits, state_dict, config), STATE_NAMES)


def test_the_peer_continues_from_our_state():
    """Our state has the peer's layout: the peer, given it, continues a sequence as if it had read the start."""
    peer, _, ours, _ = make_models(**CONFIGS["no-rescale"])
    ids = tokens(4)
    with torch.no_grad():
        state = ours(ids[:, :4]).state
        theirs = peer(ids[:, 4:], state=[s.clone() for s in state], use_cache=True)   # the peer writes into it
        whole = peer(ids, use_cache=True)
    assert_close(theirs.logits, whole.logits[:, 4:], FP32_BUDGET, "peer logits from our state")


def test_attention_hidden_size_other_than_hidden_size():
    """attention_hidden_size = 24 != hidden_size = 16: the WKV state is (B, 24, L). The states against the
    reference only: transformers sizes its state buffers by hidden_size and fails with a state (it runs without)."""
    peer, state_dict, ours, config = make_models(attention_hidden_size=24, rescale_every=2)
    assert state_dict["rwkv.blocks.0.attention.key.weight"].shape == (24, 16)
    ids = tokens(5)
    ref_logits, ref_state = reference_logits(state_dict, config, ids)
    with torch.no_grad():
        assert_close(peer(ids, use_cache=False).logits, ref_logits, FP32_BUDGET, "peer (no state) logits")
        whole = ours(ids)
        first = ours(ids[:, :3])
        second = ours(ids[:, 3:], state=first.state)
    assert [tuple(s.shape) for s in whole.state] == [(B, 16, 3)] * 2 + [(B, 24, 3)] * 3
    assert_close(whole.logits, ref_logits, FP32_BUDGET, "logits")
    assert_close(torch.cat([first.logits, second.logits], dim=1), ref_logits, FP32_BUDGET, "logits in pieces")
    assert_states_close(second.state, ref_state, FP32_BUDGET, "state", STATE_NAMES)


def test_float64_model_matches_the_reference_to_rounding():
    _, state_dict, ours, config = make_models(**CONFIGS["rescale-every-block"])
    check_float64_copy(ours, tokens(6), partial(reference_logits, state_dict, config), STATE_NAMES)


def test_fp16_model_within_the_fp16_budget():
    _, state_dict, ours, config = make_models(**CONFIGS["rescale-every-2-tied"])
    check_fp16_copy(ours, tokens(7), partial(reference_logits, state_dict, config))


def test_training_loss_and_gradients_match_the_peer():
    peer, _, ours, _ = make_models(**CONFIGS["rescale-every-2-tied"])
    ids = tokens(8)
    labels = ids.clone()
    labels[0, :4] = -100                                            # ignored positions
    check_training_step(peer, ours, ids, labels)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("writer", ["ours", "peer", "torch.save"])
def test_checkpoint_round_trips(writer, tied, tmp_path):
    # the peer saves before any forward: its weights are not rescaled yet
    peer, state_dict, ours, _ = make_models(tie_word_embeddings=tied)
    check_checkpoint_round_trip(writer, peer, state_dict, ours,
                                (RwkvForCausalLM, RwkvModel, transformers.RwkvForCausalLM), "rwkv", tmp_path,
                                tokens(9))


def test_greedy_generation_matches_the_peer_with_one_token_per_step():
    peer, _, ours, _ = make_models(**CONFIGS["rescale-every-2-tied"])
    prompt = tokens(10, length=5)
    with input_lengths(ours.rwkv) as lengths:
        out, state = ours.generate(prompt, max_new_tokens=8)
    assert torch.equal(out, peer_greedy(peer, prompt, 8))
    assert lengths[0] == 5 and set(lengths[1:]) == {1}              # the prompt once, then one token per step
    with torch.no_grad():                                           # the state has read every returned token
        assert_close(state[2], ours(out).state[2], FP32_BUDGET, "state after generation")


def test_sampling_follows_the_peer_distribution_step_by_step():
    """With the same seed, sampling through our state draws what sample_next draws from the peer's logits of the
    re-read sequence (temperature 0.8, top-p 0.9)."""
    peer, _, ours, _ = make_models(**CONFIGS["no-rescale"])
    prompt = tokens(11, length=4)
    out, _ = ours.generate(prompt, 10, temperature=0.8, top_p=0.9, generator=torch.Generator().manual_seed(3))
    g, ids = torch.Generator().manual_seed(3), prompt
    with torch.no_grad():
        for _ in range(10):
            nxt = sample_next(peer(ids, use_cache=False).logits[:, -1], 0.8, 0.9, g)
            ids = torch.cat([ids, nxt[:, None]], dim=1)
    assert torch.equal(out, ids)


def test_generation_stops_after_a_stop_sequence():
    """The stop sequence is two tokens the greedy continuation produces: generation ends right after them."""
    peer, _, ours, _ = make_models(**CONFIGS["no-rescale"])
    prompt = tokens(12, batch=1, length=3)
    greedy = peer_greedy(peer, prompt, 10)[0].tolist()
    stop = greedy[6:8]
    end = next(n for n in range(4, len(greedy) + 1) if greedy[n - 2:n] == stop)   # first time it is produced
    out, _ = ours.generate(prompt, max_new_tokens=10, stop_sequences=[stop])
    assert out[0].tolist() == greedy[:end]


def test_triton_backend_model():
    _, state_dict, ours, config = make_models(**CONFIGS["rescale-every-2-tied"])
    ids = tokens(13, length=6)
    ref_logits, ref_state = reference_logits(state_dict, config, ids)
    with torch.no_grad():
        first = ours(ids[:, :2], backend="triton")
        second = ours(ids[:, 2:], state=first.state, backend="triton")
    assert_close(torch.cat([first.logits, second.logits], dim=1), ref_logits, FP32_BUDGET, "triton logits")
    assert_states_close(second.state, ref_state, FP32_BUDGET, "triton", STATE_NAMES)


def test_use_cache_false_returns_no_state():
    _, _, ours, _ = make_models()
    with torch.no_grad():
        assert ours(tokens(14), use_cache=False).state is None


def test_bad_token_ids_are_refused():
    _, state_dict, ours, _ = make_models()
    params, _ = reference_params(state_dict)
    for bad in (torch.tensor([[0, 67]]), torch.tensor([[-1, 3]])):
        with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 67\)"):
            ours(bad)
        with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 67\)"):
            ref.forward(params, bad.numpy())
    with pytest.raises(TypeError, match="input_ids must be an integer tensor"):
        ours(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"input_ids must have shape \(B, T\)"):
        ours(torch.zeros(3, dtype=torch.long))


def test_bad_state_is_refused():
    _, _, ours, _ = make_models()
    with torch.no_grad():
        state = ours(tokens(15)).state
    with pytest.raises(ValueError, match=r"state\[3\] \(att_den\) must have shape \(2, 16, 3\)"):
        ours(tokens(15), state=state[:3] + [state[3][..., :2], state[4]])
    with pytest.raises(ValueError, match="state must be a list of 5 tensors"):
        ours(tokens(15), state=state[:4])
    with pytest.raises(ValueError, match="state must be 5 arrays"):
        ref.forward(reference_params(ours.state_dict())[0], tokens(15).numpy(), [s.numpy() for s in state[:4]])


@pytest.mark.parametrize("damage", ["missing", "misshapen", "unexpected"])
def test_bad_checkpoint_names_the_tensor(damage, tmp_path):
    _, state_dict, ours, _ = make_models()
    name = "rwkv.blocks.1.attention.time_first"
    if damage == "missing":
        del state_dict[name]
        error, message = KeyError, f"missing tensor '{name}'"
    elif damage == "misshapen":
        state_dict[name] = torch.zeros(15)
        error, message = ValueError, rf"'{name}' has shape \(15,\), expected \(16,\)"
    else:
        state_dict["rwkv.blocks.7.ln1.weight"] = torch.zeros(16)
        error, message = KeyError, "unexpected tensor.*rwkv.blocks.7.ln1.weight"
    ours.save_pretrained(tmp_path)
    save_state_dict(state_dict, tmp_path / "model.safetensors")
    with pytest.raises(error, match=message):
        RwkvForCausalLM.from_pretrained(tmp_path)


def test_config_of_another_model_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "mamba", "hidden_size": 16}')
    save_state_dict({}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="model_type 'mamba', expected 'rwkv'"):
        RwkvForCausalLM.from_pretrained(tmp_path)


def test_from_pretrained_needs_no_transformers(tmp_path):
    """A fresh interpreter in which `import transformers` fails reads the peer's saved directory (and imports the
    Mamba model too); its logits are ours."""
    peer, _, ours, _ = make_models()
    peer.save_pretrained(tmp_path)
    ids = tokens(17)
    torch.save(ids, tmp_path / "ids.pt")
    script = (
        "import sys; sys.modules['transformers'] = None\n"           # makes `import transformers` raise
        "import torch\n"
        "import seqmix.models.mamba\n"
        "from seqmix.models.rwkv4 import RwkvForCausalLM\n"
        f"d = {str(tmp_path)!r}\n"
        "model = RwkvForCausalLM.from_pretrained(d)\n"
        "with torch.no_grad():\n"
        "    torch.save(model(torch.load(d + '/ids.pt')).logits, d + '/logits.pt')\n")
    subprocess.run([sys.executable, "-c", script], check=True)
    with torch.no_grad():
        assert torch.equal(torch.load(tmp_path / "logits.pt"), ours(ids).logits)
