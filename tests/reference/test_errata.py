"""Source slips of reference/ERRATA.md (entries 21 to 26) shown numerically: each test computes what the source
wrote and what is right, and finds them apart where the erratum says they are.

Entries 1 to 20 are shown by the tests their entries name.
"""
import numpy as np
import pytest
import torch
import transformers
import transformers.models.rwkv.modeling_rwkv as hf_rwkv

from seqmix.kernels.testing import FP32_BUDGET, REFERENCE_BUDGET, assert_close, rel_rms
from seqmix.reference import rwkv7 as ref7
from seqmix.reference import wkv4 as ref4


def wkv4_inputs(rng, B=2, T=9, C=4):
    time_decay = rng.standard_normal(C)
    return time_decay, rng.standard_normal(C), rng.standard_normal((B, T, C)), rng.standard_normal((B, T, C))


def test_21_hf_w_is_minus_exp_of_time_decay(rng):
    """[HF] calls w `time_decay`; transformers' own loop uses w = -exp(time_decay)."""
    time_decay, u, k, v = wkv4_inputs(rng)
    time_decay = -np.abs(time_decay)                               # so that w = time_decay is allowed too
    theirs = hf_rwkv.rwkv_linear_attention_cpu(*(torch.tensor(x) for x in (time_decay, u, k, v)))[0]
    assert_close(theirs, ref4.wkv4(-np.exp(time_decay), u, k, v)[0], FP32_BUDGET,        # its state is fp32
                 "transformers vs the reference with w = -exp(time_decay)")
    assert rel_rms(theirs, ref4.wkv4(time_decay, u, k, v)[0]) > 1e-3, "w = time_decay, as the page says"


@pytest.mark.parametrize("initial_max", [-1e38, -1e30, -50.0])
def test_22_stable_recurrence_from_any_start_below_the_keys(rng, initial_max):
    """[HF] never defines M_0. Any start far below the keys gives the definition's result: transformers' CPU loop
    starts from -1e38, its RwkvModel's state from -1e30 (modeling_rwkv.py)."""
    time_decay, u, k, v = wkv4_inputs(rng)
    w = -np.exp(time_decay)
    zeros = np.zeros(k[:, 0].shape)
    state = (zeros, zeros, np.full(zeros.shape, initial_max))
    assert_close(ref4.wkv4(w, u, k, v, state=state)[0], ref4.wkv4_quadratic(w, u, k, v), REFERENCE_BUDGET,
                 f"stable recurrence from M_0 = {initial_max:g} vs the definition")
    theirs = hf_rwkv.rwkv_linear_attention_cpu(*(torch.tensor(x) for x in (time_decay, u, k, v)),
                                               state=[torch.tensor(s) for s in state])[0]
    assert_close(theirs, ref4.wkv4_quadratic(w, u, k, v), FP32_BUDGET, "transformers from the same start")


def test_22_a_start_above_the_keys_fails(rng):
    """M_0 is not arbitrary: from above the keys e^{k - M} underflows to 0 and the output is 0/0."""
    time_decay, u, k, v = wkv4_inputs(rng)
    zeros = np.zeros(k[:, 0].shape)
    with np.errstate(invalid="ignore"):
        y, _ = ref4.wkv4(-np.exp(time_decay), u, k, v, state=(zeros, zeros, np.full(zeros.shape, 800.0)))
    assert np.isnan(y).all()


def test_23_zh_translation_expansion_ends_in_v1(rng):
    """[HF zh] writes N^_i = e^{K_{i-1}} V_{i-1} + e^{w + K_{i-2}} V_{i-2} + ... + e^{(i-2) w + K_1} V_{i-1}: the
    last value should be V_1 (as in the English page). Checked against the recurrence N^_{j+1} = e^{K_j} V_j +
    e^w N^_j, 1-based as on the page."""
    time_decay, _, k, v = wkv4_inputs(rng, B=1, C=3)
    w, K, V = -np.exp(time_decay), k[0], v[0]                      # K_j = K[j - 1]
    i = K.shape[0]
    recurrent = np.zeros(3)
    for j in range(1, i):                                          # N^_1 = 0, ..., N^_i
        recurrent = np.exp(K[j - 1]) * V[j - 1] + np.exp(w) * recurrent

    def expansion(last_value):
        terms = [np.exp((i - 1 - j) * w + K[j - 1]) * V[j - 1] for j in range(2, i)]
        return sum(terms) + np.exp((i - 2) * w + K[0]) * last_value

    assert_close(expansion(V[0]), recurrent, REFERENCE_BUDGET, "the English page's expansion (V_1)")
    assert rel_rms(expansion(V[i - 2]), recurrent) > 1e-3, "the translation's expansion (V_{i-1})"


def test_24_rwkv7_channel_mix_has_no_fewer_parameters_than_an_ffn():
    """[RWKV-7] The post's table gives RWKV_CMix 'fewer parameters' than a standard FFN. With dim_ffn = 4C it has
    the same two C x 4C matrices (both bias-free) plus the token-shift mix x_k: C more."""
    C = 64
    shapes = ref7.checkpoint_shapes(V=100, C=C, H=1, L=1, F=4 * C, D_w=8, D_a=8, D_v=8, D_g=8)
    cmix = sum(int(np.prod(shape)) for name, shape in shapes.items() if name.startswith("blocks.0.ffn."))
    ffn = 2 * C * 4 * C                                            # Linear(C, 4C) and Linear(4C, C), no bias
    assert cmix == ffn + C


def tiny_hf_rwkv(L=2):
    """transformers' own RwkvModel, tiny, with every weight redrawn so that no part of it is zero at init."""
    torch.manual_seed(0)
    config = transformers.RwkvConfig(vocab_size=50, hidden_size=8, num_hidden_layers=L, intermediate_size=16)
    model = transformers.RwkvModel(config).eval()
    with torch.no_grad():
        for weight in model.parameters():
            weight.copy_(0.5 * torch.randn_like(weight))
    return model


def test_25_hf_rwkv_ignores_attention_mask():
    """[HF] documents attention_mask ('mask to avoid performing attention on padding token indices'); transformers'
    RwkvModel only logs that it is unused (modeling_rwkv.py), so a left-padded row is not masked: the pads enter the
    state. If transformers starts masking, the first assertion fails and erratum 25 must be revisited."""
    model = tiny_hf_rwkv()
    ids = torch.randint(1, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    ids[1, :3] = 0                                                 # row 1: three pads, then six tokens
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    with torch.no_grad():
        masked = model(ids, attention_mask=mask).last_hidden_state
        unmasked = model(ids).last_hidden_state
        alone = model(ids[1:, 3:]).last_hidden_state               # the six tokens without the pads
    assert torch.equal(masked, unmasked), "attention_mask changed the output: transformers now uses it"
    assert rel_rms(masked[1:, 3:], alone) > 1e-3, "the pads did not reach the real tokens"


def test_26_hf_rwkv_attentions_are_each_blocks_time_mix_output():
    """[HF] says `attentions` holds, per layer, weights 'after the attention softmax' of shape (batch, num_heads,
    T, T). transformers returns each block's time-mix output, (batch, T, hidden_size) (modeling_rwkv.py,
    RwkvBlock.forward). Checked against the reference's time mix on block 0's normalized input."""
    from seqmix.reference import rwkv4 as ref_rwkv4

    model = tiny_hf_rwkv()
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        attentions = model(ids, output_attentions=True).attentions
    assert len(attentions) == 2 and all(a.shape == (2, 7, 8) for a in attentions)
    params = {name: w.double().numpy() for name, w in model.state_dict().items()}
    p0 = {name[len("blocks.0."):]: w for name, w in params.items() if name.startswith("blocks.0.")}

    def ln(x, name):
        return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * p0[f"{name}.weight"] \
            + p0[f"{name}.bias"]

    state = [s[..., 0] for s in ref_rwkv4.initial_state(params, 2)]   # ffn_x_prev, att_x_prev, num, den, max
    time_mix_in = ln(ln(params["embeddings.weight"][ids.numpy()], "pre_ln"), "ln1")
    expected = ref_rwkv4.time_mix(p0, time_mix_in, state[1], tuple(state[2:]))[0]
    assert_close(attentions[0], expected, FP32_BUDGET, "attentions[0] vs block 0's time-mix output")
