"""The RWKV-7 model: reference (NumPy float64) vs torch model vs the peer, BlinkDL's own runtime.

The peer is the `rwkv` package (https://pypi.org/project/rwkv/, a test-only dependency) in RWKV-7 mode, on the
CPU in fp32, run on a random `.pth` that these tests write with the tensor names and shapes of a BlinkDL RWKV-7
checkpoint. Sizes are tiny and all different (C = 48, 3 heads of 16, F = 112, LoRA widths 8, 12, 6, 10), so that
a transposed or swapped tensor cannot go unnoticed.
"""
import copy
import json
from functools import partial

import numpy as np
import pytest
import torch

from helpers import blinkdl_peer
from helpers import fla_peer
from helpers import hf_peer
from seqmix.models.io import save_state_dict
from seqmix.models.rwkv7 import Rwkv7, Rwkv7Config
from seqmix.kernels.testing import FP16_BUDGET, FP32_BUDGET, REFERENCE_BUDGET, assert_close, rel_rms
from seqmix.reference import rwkv7 as ref

V, C, H, N, L, F_FFN = 67, 48, 3, 16, 3, 112
LORA = dict(D_w=8, D_a=12, D_v=6, D_g=10)
CONFIG = Rwkv7Config(vocab_size=V, n_embd=C, n_layer=L, head_size=N, dim_ffn=F_FFN, decay_lora=LORA["D_w"],
                     a_lora=LORA["D_a"], v_lora=LORA["D_v"], gate_lora=LORA["D_g"])
STATE_NAMES = ("att_x_prev", "att_kv", "ffn_x_prev")
# The peer scripts its RWKV-7 functions with torch.jit.script, which torch now flags as deprecated.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


def random_checkpoint(seed):
    """name -> fp32 tensor for every entry of the reference's checkpoint table, at scales where every part of
    the model matters: decays spread over (0.55, 1), LoRA outputs O(1), logits O(1)."""
    g = np.random.default_rng(seed)
    sd = {}
    for name, shape in ref.checkpoint_shapes(V, C, H, L, F_FFN, **LORA).items():
        leaf = name.split(".")[-2] if name.endswith((".weight", ".bias")) else name.split(".")[-1]
        if leaf.startswith("ln"):
            x = (1.0 if name.endswith("weight") else 0.0) + 0.2 * g.standard_normal(shape)
        elif leaf in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g"):
            x = g.uniform(0.0, 1.0, shape)
        elif leaf == "w0":
            x = g.uniform(-6.0, 1.0, shape)
        elif leaf in ("a0", "v0", "emb"):
            x = g.standard_normal(shape)
        elif leaf == "k_k":
            x = g.uniform(0.5, 1.5, shape)
        elif leaf == "k_a":
            x = g.uniform(0.0, 1.5, shape)
        elif leaf == "r_k":
            x = 0.5 * g.standard_normal(shape)
        else:                                   # matrices: LoRA (in, out), Linear (out, in)
            fan_in = shape[1] if name.endswith(".weight") else shape[0]
            x = g.standard_normal(shape) / np.sqrt(fan_in)
        sd[name] = torch.tensor(x, dtype=torch.float32)
    return sd


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("rwkv7") / "random.pth"
    torch.save(random_checkpoint(seed=7), path)
    return path


@pytest.fixture(scope="module")
def params(checkpoint):
    return {k: v.double().numpy() for k, v in torch.load(checkpoint, weights_only=True).items()}


@pytest.fixture(scope="module")
def model(checkpoint):
    return Rwkv7.from_checkpoint(checkpoint)


@pytest.fixture(scope="module")
def peer_class():
    return blinkdl_peer.rwkv7_class()


def load_peer(peer_class, path):
    return peer_class(model=str(path)[:-len(".pth")], strategy="cpu fp32")


@pytest.fixture(scope="module")
def peer(peer_class, checkpoint):
    return load_peer(peer_class, checkpoint)


def peer_run(peer, ids, state=None):
    """The peer on one row of token ids (it has no batch): (logits (T, V), flat state list, 3 per layer)."""
    state = None if state is None else [s.clone() for s in state]     # it replaces list entries in place
    if len(ids) == 1:
        logits, state = peer.forward(int(ids[0]), state)
        return logits[None], state
    return peer.forward([int(i) for i in ids], state, full_output=True)


def peer_state_as_ours(flat):
    """The peer's [att_x_prev (C,), att_kv (H, N, N), ffn_x_prev (C,)] * L as our per-layer tuples, batch 1."""
    return [tuple(x[None] for x in flat[3 * i:3 * i + 3]) for i in range(L)]


assert_states_close = partial(hf_peer.assert_states_close, names=STATE_NAMES)


def token_ids(rng, B, T):
    return rng.integers(0, V, size=(B, T))


# ---------------------------------------------------------------------------------------------- layout

def test_checkpoint_layout_agrees_between_reference_and_torch_model():
    expected = ref.checkpoint_shapes(V, C, H, L, F_FFN, **LORA)
    fresh = Rwkv7(CONFIG)
    assert {k: tuple(v.shape) for k, v in fresh.state_dict().items()} == expected
    assert torch.isfinite(fresh(torch.zeros(1, 2, dtype=torch.int64))[0]).all()   # a fresh model runs


def test_config_is_read_from_the_checkpoint(model):
    assert model.config == CONFIG


# ------------------------------------------------------------------------------------ reference vs peer

@pytest.mark.parametrize("T", [1, 2, 11])
def test_reference_matches_peer(params, peer, rng, T):
    ids = token_ids(rng, 1, T)
    logits, state = ref.forward(params, ids)
    peer_logits, peer_state = peer_run(peer, ids[0])
    assert_close(peer_logits, logits[0], FP32_BUDGET, "peer logits")
    assert_states_close(peer_state_as_ours(peer_state), state, FP32_BUDGET, "peer state")


def test_reference_matches_peer_from_a_given_state(params, peer, rng):
    prefix, ids = token_ids(rng, 1, 5), token_ids(rng, 1, 6)
    _, state = ref.forward(params, prefix)
    logits, state = ref.forward(params, ids, state)
    _, peer_state = peer_run(peer, prefix[0])
    peer_logits, peer_state = peer_run(peer, ids[0], peer_state)
    assert_close(peer_logits, logits[0], FP32_BUDGET, "peer logits")
    assert_states_close(peer_state_as_ours(peer_state), state, FP32_BUDGET, "peer state")


def test_decay_is_soft_clamped_and_forgets_less_as_w_falls():
    """exp(log_w) = exp(-exp(w)), w = -softplus(-w0) - 0.5 < -0.5: the decay lies in [exp(-exp(-0.5)), 1] and
    grows towards 1 (forgets less) as w0, hence w, falls."""
    w0 = np.linspace(-20.0, 20.0, 81)[None, None, :]                    # (1, 1, 81)
    zeros = np.zeros((81, 3))
    log_w = ref.log_decay(np.zeros((1, 1, 81)), w0, zeros, zeros.T)
    decay = np.exp(log_w)
    assert np.all(log_w < 0) and np.all(decay >= np.exp(-np.exp(-0.5)))
    assert np.all(np.diff(log_w[0, 0]) < 0)                             # higher w0: faster forgetting


# ------------------------------------------------------------------------- GPT mode, RNN mode, pieces

def test_reference_rnn_mode_equals_gpt_mode(params, rng):
    ids = token_ids(rng, 2, 9)
    logits, state = ref.forward(params, ids)
    rnn_logits, rnn_state = ref.forward_rnn(params, ids)
    assert_close(rnn_logits, logits, REFERENCE_BUDGET, "RNN-mode logits")
    assert_states_close(rnn_state, state, REFERENCE_BUDGET, "RNN-mode state")


@pytest.mark.parametrize("pieces", [(1, 8), (4, 1, 4), (3, 3, 3)])
def test_reference_sequence_in_pieces(params, rng, pieces):
    ids = token_ids(rng, 2, sum(pieces))
    logits, state = ref.forward(params, ids)
    parts, piece_state, start = [], None, 0
    for n in pieces:
        part, piece_state = ref.forward(params, ids[:, start:start + n], piece_state)
        parts.append(part)
        start += n
    assert_close(np.concatenate(parts, axis=1), logits, REFERENCE_BUDGET, "logits in pieces")
    assert_states_close(piece_state, state, REFERENCE_BUDGET, "state in pieces")


@pytest.mark.parametrize("pieces", [(9,), (1,) * 9, (4, 1, 4)])
def test_model_sequence_in_pieces_and_token_by_token(model, rng, pieces):
    ids = torch.as_tensor(token_ids(rng, 2, sum(pieces)))
    logits, state = model(ids, backend="torch")
    parts, piece_state = [], None
    for chunk in ids.split(list(pieces), dim=1):
        part, piece_state = model(chunk, piece_state, backend="torch")
        parts.append(part)
    assert_close(torch.cat(parts, dim=1), logits, FP32_BUDGET, "logits in pieces")
    assert_states_close(piece_state, state, FP32_BUDGET, "state in pieces")


# --------------------------------------------------------------------------- torch model vs reference

def run_with_prefix(forward, prefix, ids):
    """Read a prefix, then ids from the state it leaves: exercises a non-zero initial state."""
    _, state = forward(prefix, None)
    return forward(ids, state)


@pytest.mark.parametrize("B,T", [(1, 1), (2, 7)])
def test_model_matches_reference(model, params, rng, B, T):
    prefix, ids = token_ids(rng, B, 3), token_ids(rng, B, T)
    logits, state = run_with_prefix(lambda x, s: ref.forward(params, x, s), prefix, ids)
    got_logits, got_state = run_with_prefix(lambda x, s: model(torch.as_tensor(x), s, backend="torch"), prefix, ids)
    assert got_logits.dtype == torch.float32 and all(layer[1].dtype == torch.float32 for layer in got_state)
    assert_close(got_logits, logits, FP32_BUDGET, "logits")
    assert_states_close(got_state, state, FP32_BUDGET, "state")


def test_model_in_float64_matches_reference(model, params, rng):
    ids = token_ids(rng, 2, 6)
    logits, state = ref.forward(params, ids)
    got_logits, got_state = copy.deepcopy(model).double()(torch.as_tensor(ids), backend="torch")
    assert_close(got_logits, logits, REFERENCE_BUDGET, "float64 logits")
    assert_states_close(got_state, state, REFERENCE_BUDGET, "float64 state")


def test_model_in_fp16_matches_reference_on_the_same_weights(model, params, rng):
    ids = token_ids(rng, 1, 6)
    half = copy.deepcopy(model).half()
    rounded = {k: v.astype(np.float16).astype(np.float64) for k, v in params.items()}
    logits, _ = ref.forward(rounded, ids)
    got_logits, got_state = half(torch.as_tensor(ids), backend="torch")
    assert got_logits.dtype == torch.float16 and got_state[0][1].dtype == torch.float32
    assert_close(got_logits, logits, FP16_BUDGET, "fp16 logits")


def test_model_with_the_triton_backend(model, params, rng):
    ids = token_ids(rng, 1, 5)
    prefix = token_ids(rng, 1, 2)
    logits, state = run_with_prefix(lambda x, s: ref.forward(params, x, s), prefix, ids)
    got_logits, got_state = run_with_prefix(lambda x, s: model(torch.as_tensor(x), s, backend="triton"), prefix, ids)
    assert_close(got_logits, logits, FP32_BUDGET, "logits, triton backend")
    assert_states_close(got_state, state, FP32_BUDGET, "state, triton backend")


def test_gradients_through_the_model(model, rng):
    """gradcheck in float64 of a scalar of the logits with respect to a few parameters of every kind."""
    m = copy.deepcopy(model).double()
    names = ["blocks.0.att.x_a", "blocks.1.att.w0", "blocks.1.att.k_k", "blocks.2.att.r_k", "blocks.2.att.v0"]
    ids = torch.as_tensor(token_ids(rng, 1, 4))
    weights = torch.as_tensor(rng.standard_normal((1, 4, V)))
    inputs = [m.get_parameter(n).detach().clone().requires_grad_() for n in names]

    def scalar(*tensors):
        logits, _ = torch.func.functional_call(m, dict(zip(names, tensors)), (ids,), {"backend": "torch"})
        return (logits * weights).sum()

    assert torch.autograd.gradcheck(scalar, inputs, fast_mode=True)


# ------------------------------------------------------------------------------ torch model vs peer

def test_model_matches_peer(model, peer, rng):
    prefix, ids = token_ids(rng, 1, 4), token_ids(rng, 1, 8)
    got_logits, got_state = run_with_prefix(lambda x, s: model(torch.as_tensor(x), s, backend="torch"), prefix, ids)
    _, peer_state = peer_run(peer, prefix[0])
    peer_logits, peer_state = peer_run(peer, ids[0], peer_state)
    assert_close(got_logits[0], peer_logits, FP32_BUDGET, "logits vs peer")
    assert_states_close(got_state, peer_state_as_ours(peer_state), FP32_BUDGET, "state vs peer")


# ---------------------------------------------------------------------------------- save / load

def test_checkpoint_round_trip(model, peer, peer_class, tmp_path, rng):
    """Our state_dict saved as a .pth loads back into our model and into the peer, with the same logits."""
    path = tmp_path / "saved.pth"
    torch.save(model.state_dict(), path)
    reloaded = Rwkv7.from_checkpoint(path)
    ids = torch.as_tensor(token_ids(rng, 1, 6))
    logits, _ = model(ids, backend="torch")
    assert torch.equal(reloaded(ids, backend="torch")[0], logits)
    peer_logits, _ = peer_run(load_peer(peer_class, path), ids[0].tolist())
    assert torch.equal(peer_logits, peer_run(peer, ids[0].tolist())[0])
    assert_close(logits[0], peer_logits, FP32_BUDGET, "logits vs peer on the saved checkpoint")


def test_unused_block0_value_lora_is_ignored(model, tmp_path, rng):
    """Some BlinkDL checkpoints carry blocks.0.att.v0/v1/v2, which layer 0 (the maker of v_first) never uses."""
    sd = dict(model.state_dict())
    sd.update({"blocks.0.att.v0": torch.ones(1, 1, C), "blocks.0.att.v1": torch.ones(C, LORA["D_v"]),
               "blocks.0.att.v2": torch.ones(LORA["D_v"], C)})
    path = tmp_path / "with_v0.pth"
    torch.save(sd, path)
    ids = torch.as_tensor(token_ids(rng, 1, 4))
    assert torch.equal(Rwkv7.from_checkpoint(path)(ids, backend="torch")[0], model(ids, backend="torch")[0])


def test_state_round_trip(model, tmp_path, rng):
    ids = torch.as_tensor(token_ids(rng, 2, 8))
    logits, state = model(ids, backend="torch")
    _, half_state = model(ids[:, :5], backend="torch")
    torch.save(half_state, tmp_path / "state.pt")
    loaded = torch.load(tmp_path / "state.pt", weights_only=True)
    rest_logits, rest_state = model(ids[:, 5:], loaded, backend="torch")
    assert_close(rest_logits, logits[:, 5:], FP32_BUDGET, "logits after a saved state")
    assert_states_close(rest_state, state, FP32_BUDGET, "state after a saved state")


# ------------------------------------------------------------------------------------- generation

def peer_greedy(peer, prompt, n):
    """The peer's own greedy continuation: argmax of its logits, one forward per new token."""
    logits, state = peer.forward([int(t) for t in prompt], None)
    out = []
    for _ in range(n):
        top2 = logits.topk(2).values
        assert top2[0] - top2[1] > 1e-4, "near-tie in the peer's logits: the comparison would be fragile"
        out.append(int(logits.argmax()))
        logits, state = peer.forward(out[-1], state)
    return out


def test_greedy_generation_reproduces_peer(model, peer, rng):
    prompts = token_ids(rng, 2, 5)
    expected = [peer_greedy(peer, p, 10) for p in prompts]
    with hf_peer.input_lengths(model) as calls:
        out, _ = model.generate(torch.as_tensor(prompts), max_new_tokens=10, backend="torch")
    assert out[:, 5:].tolist() == expected
    assert calls == [5] + [1] * 10                      # the prompt once, then one token per step


def test_generation_stops_at_a_stop_sequence(model, peer, rng):
    prompt = token_ids(rng, 1, 4)
    expected = peer_greedy(peer, prompt[0], 12)
    stop = expected[5:7]
    end = next(i + 2 for i in range(len(expected)) if expected[i:i + 2] == stop)   # first occurrence
    out, _ = model.generate(torch.as_tensor(prompt), max_new_tokens=12, stop_sequences=[stop], backend="torch")
    assert out[0, 4:].tolist() == expected[:end]


def test_sampled_tokens_lie_in_the_peers_nucleus(model, peer, rng):
    """temperature/top-p: each sampled token is in the smallest set of the peer's most likely tokens (at that
    temperature) whose probability reaches top_p; the same generator seed gives the same continuation."""
    temperature, top_p, n = 1.5, 0.8, 10
    prompt = token_ids(rng, 1, 4)
    sample = lambda seed: model.generate(torch.as_tensor(prompt), n, temperature=temperature, top_p=top_p,  # noqa
                                         generator=torch.Generator().manual_seed(seed), backend="torch")[0][0]
    out = sample(3)
    assert torch.equal(out, sample(3))
    logits, state = peer.forward(prompt[0].tolist(), None)
    sizes = []
    for tok in out[4:].tolist():
        p, order = torch.softmax(logits.double() / temperature, -1).sort(descending=True)
        nucleus = order[(p.cumsum(0) - p) < top_p].tolist()
        assert tok in nucleus
        sizes.append(len(nucleus))
        logits, state = peer.forward(tok, state)
    assert max(sizes) > 1                               # the test sampled, not just took the argmax


# ------------------------------------------------------------------------------------- bad input

def corrupt(sd, how, key):
    sd = dict(sd)
    if how == "missing":
        del sd[key]
    elif how == "transposed":
        sd[key] = sd[key].T
    else:                                               # one channel too many in the last dimension
        shape = tuple(sd[key].shape)
        sd[key] = torch.zeros(shape[:-1] + (shape[-1] + 1,))
    return sd


@pytest.mark.parametrize("how,key", [
    ("missing", "blocks.1.att.v2"), ("missing", "head.weight"), ("missing", "blocks.0.ln0.bias"),
    ("missing", "blocks.2.ffn.x_k"), ("missing", "blocks.0.att.r_k"),
    ("misshapen", "blocks.1.att.k_a"), ("misshapen", "blocks.2.att.w1"), ("transposed", "blocks.0.ffn.value.weight"),
    ("transposed", "blocks.2.att.r_k"), ("misshapen", "ln_out.weight"),
])
def test_bad_checkpoint_names_the_tensor(checkpoint, tmp_path, how, key):
    sd = corrupt(torch.load(checkpoint, weights_only=True), how, key)
    path = tmp_path / "bad.pth"
    torch.save(sd, path)
    with pytest.raises((KeyError, ValueError), match=key.replace(".", r"\.")):
        Rwkv7.from_checkpoint(path)
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        ref.forward({k: v.double().numpy() for k, v in sd.items()}, np.zeros((1, 2), dtype=np.int64))


@pytest.mark.parametrize("ids", [[[0, V]], [[-1, 3]], [[1, 2, 3]][0], [[]]])
def test_bad_token_ids_are_refused(model, params, ids):
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.tensor(ids, dtype=torch.int64).reshape(np.shape(ids)))
    with pytest.raises(ValueError, match="input_ids"):
        ref.forward(params, np.array(ids, dtype=np.int64).reshape(np.shape(ids)))


def test_float_token_ids_are_refused(model, params):
    with pytest.raises(TypeError, match="input_ids"):
        model(torch.zeros(1, 3))
    with pytest.raises(TypeError, match="input_ids"):
        ref.forward(params, np.zeros((1, 3)))


def test_bad_state_is_refused(model, params, rng):
    ids = token_ids(rng, 2, 3)
    _, state = model(torch.as_tensor(ids), backend="torch")
    with pytest.raises(ValueError, match="state"):
        model(torch.as_tensor(ids[:1]), state)                          # batch 2 state for batch 1
    with pytest.raises(ValueError, match="state"):
        model(torch.as_tensor(ids), state[:-1])                         # a layer short
    _, ref_state = ref.forward(params, ids)
    with pytest.raises(ValueError, match="att_kv"):
        ref.forward(params, ids, [(x, kv[..., :-1], f) for x, kv, f in ref_state])


# ---------------------------------------------- flash-linear-attention's Hugging Face layout (fla as the peer)

# head_dim 64: fla's group-norm eps is head_dim * norm_eps, BlinkDL's 64e-5, equal only there.
FLA_CONFIG = dict(vocab_size=97, hidden_size=128, num_hidden_layers=3, head_dim=64, intermediate_size=200,
                  decay_low_rank_dim=8, a_low_rank_dim=12, v_low_rank_dim=6, gate_low_rank_dim=10)


@pytest.fixture(scope="module")
def fla_dir(tmp_path_factory):
    """A random fla RWKV7ForCausalLM saved by fla's own save_pretrained, and the model."""
    path = tmp_path_factory.mktemp("fla")
    model = fla_peer.make_model(seed=11, **FLA_CONFIG)
    model.save_pretrained(path)
    return path, model


def fla_ids(seed, B=2, T=9):
    return torch.randint(0, FLA_CONFIG["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


def test_fla_layout_loads_with_fla_logits(fla_dir):
    path, fla_model = fla_dir
    ours = Rwkv7.from_pretrained(path)
    assert ours.config.n_layer == 3 and ours.config.dim_ffn == 200 and ours.config.v_lora == 6
    ids = fla_ids(1)
    with torch.no_grad():
        logits, _ = ours(ids, backend="torch")
    assert_close(logits, fla_peer.logits(fla_model, ids), FP32_BUDGET, "ours (fla layout) vs fla")


def test_fla_layout_agrees_with_blinkdl_runtime(fla_dir, peer_class, tmp_path):
    """The same weights in BlinkDL's names (our map's output) give BlinkDL's runtime the logits fla gives."""
    path, fla_model = fla_dir
    ours = Rwkv7.from_pretrained(path)
    torch.save({k: v.contiguous() for k, v in ours.state_dict().items()}, tmp_path / "blink.pth")
    ids = fla_ids(2, B=1, T=7)
    peer_logits, _ = peer_run(load_peer(peer_class, tmp_path / "blink.pth"), ids[0])
    assert_close(peer_logits, fla_peer.logits(fla_model, ids)[0], FP32_BUDGET, "BlinkDL's runtime vs fla")
    with torch.no_grad():
        assert_close(ours(ids, backend="torch")[0][0], peer_logits, FP32_BUDGET, "ours vs BlinkDL's runtime")


def test_save_pretrained_writes_what_fla_loads(fla_dir, tmp_path):
    """Our save_pretrained (the map read backwards) read by fla's own from_pretrained: the same model."""
    from fla.models.rwkv7 import RWKV7ForCausalLM
    path, fla_model = fla_dir
    Rwkv7.from_pretrained(path).save_pretrained(tmp_path)
    with fla_peer.cpu_reference_ops():
        reread = RWKV7ForCausalLM.from_pretrained(tmp_path, fuse_norm=False, fuse_cross_entropy=False).eval()
    expected = fla_model.state_dict()
    assert reread.state_dict().keys() == expected.keys()
    for name, tensor in reread.state_dict().items():
        assert torch.equal(tensor, expected[name]), name


def test_fla_layout_in_bf16_loads_as_stored(fla_dir, tmp_path):
    """A bf16 checkpoint stays bf16 (no fp32 detour). A whole model computed in bf16 drifts past the ops' bf16
    budget (2e-2) from the same weights run in fp32, fla's own bf16 run as much as ours: ours stays within 1.5x of
    fla's drift, and in fp32 on the bf16 weights it matches fla's fp32 run to the fp32 budget."""
    path, fla_model = fla_dir
    half = copy.deepcopy(fla_model).to(torch.bfloat16)
    half.save_pretrained(tmp_path)
    ours = Rwkv7.from_pretrained(tmp_path)
    assert {p.dtype for p in ours.parameters()} == {torch.bfloat16}
    ids = fla_ids(3)
    with torch.no_grad():
        logits, state = ours(ids, backend="torch")
    assert logits.dtype == torch.bfloat16 and state[0][1].dtype == torch.float32
    in_fp32 = fla_peer.logits(copy.deepcopy(half).float(), ids)
    fla_drift = rel_rms(fla_peer.logits(half, ids), in_fp32)
    assert rel_rms(logits, in_fp32) <= 1.5 * fla_drift, (rel_rms(logits, in_fp32), fla_drift)
    with torch.no_grad():
        fp32_logits, _ = Rwkv7.from_pretrained(tmp_path, dtype="float32")(ids, backend="torch")
    assert_close(fp32_logits, in_fp32, FP32_BUDGET, "fp32 on the bf16 weights vs fla")


def test_fla_options_rwkv7_lacks_are_refused(fla_dir, tmp_path):
    path, _ = fla_dir
    config = json.loads((path / "config.json").read_text())
    (tmp_path / "model.safetensors").symlink_to(path / "model.safetensors")
    for key, value in [("attn", {"layers": [1], "num_heads": 2}), ("hidden_act", "gelu"), ("norm_first", False),
                       ("tie_word_embeddings", True), ("value_dim", 256), ("model_type", "rwkv6")]:
        (tmp_path / "config.json").write_text(json.dumps(config | {key: value}))
        with pytest.raises(ValueError, match=key if key != "model_type" else "rwkv6"):
            Rwkv7.from_pretrained(tmp_path)


def test_unknown_tensor_in_fla_layout_is_named(fla_dir, tmp_path):
    path, fla_model = fla_dir
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    save_state_dict(dict(fla_model.state_dict()) | {"model.layers.1.attn.x_x": torch.zeros(6, 128)},
                    tmp_path / "model.safetensors")
    with pytest.raises(KeyError, match=r"model\.layers\.1\.attn\.x_x"):
        Rwkv7.from_pretrained(tmp_path)
