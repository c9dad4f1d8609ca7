"""Edges shared by the three models (the bad-input review's model items): any integer dtype of token ids (C12),
batch 0 (C11), logits_to_keep < 0 (I11), state dtypes other than fp32 / float64 (D6)."""
import pytest
import torch

from seqmix.kernels.testing import BF16_BUDGET, FP32_BUDGET, assert_close
from seqmix.models.mamba import MambaConfig, MambaForCausalLM
from seqmix.models.rwkv4 import RwkvConfig, RwkvForCausalLM
from seqmix.models.rwkv7 import Rwkv7, Rwkv7Config

V = 67


def rwkv4():
    return RwkvForCausalLM(RwkvConfig(vocab_size=V, hidden_size=16, num_hidden_layers=2))


def mamba():
    return MambaForCausalLM(MambaConfig(vocab_size=V, hidden_size=16, state_size=4, num_hidden_layers=2))


def rwkv7():
    return Rwkv7(Rwkv7Config(vocab_size=V, n_embd=32, n_layer=2, head_size=16))


MODELS = {"rwkv4": rwkv4, "mamba": mamba, "rwkv7": rwkv7}


def run(model, ids, **kw):
    """logits of any of the three (Rwkv7 returns a pair, the others a CausalLMOutput)."""
    with torch.no_grad():
        out = model(ids, backend="torch", **kw)
    return out[0] if isinstance(out, tuple) else out.logits


@pytest.fixture(params=MODELS.values(), ids=MODELS.keys())
def model(request):
    torch.manual_seed(0)
    return request.param().eval()


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32])
def test_any_integer_dtype_of_token_ids(model, dtype):
    """C12: int8/int16/uint8 ids passed the check, then failed in nn.Embedding ("Expected Long, Int")."""
    ids = torch.tensor([[1, 60, 7, 0]])
    assert torch.equal(run(model, ids.to(dtype)), run(model, ids))
    tokens, _ = model.generate(ids.to(dtype), max_new_tokens=2, backend="torch")
    assert tokens.dtype == torch.int64 and torch.equal(tokens[:, :4], ids)


def test_batch_of_zero_rows_is_refused(model):
    """C11: B = 0 failed inside torch's min()."""
    for call in (lambda: run(model, torch.zeros(0, 3, dtype=torch.long)),
                 lambda: model.generate(torch.zeros(0, 3, dtype=torch.long), 2)):
        with pytest.raises(ValueError, match=r"input_ids must have shape \(B, T\) with B >= 1"):
            call()


@pytest.mark.parametrize("keep", [-1, 1.5, True])
def test_negative_logits_to_keep_is_refused(model, keep):
    """I11: logits_to_keep = -1 silently returned T - 1 positions."""
    with pytest.raises(ValueError, match="logits_to_keep must be an int >= 0"):
        run(model, torch.tensor([[1, 2, 3]]), logits_to_keep=keep)


def test_logits_to_keep_keeps_the_last_positions(model):
    """The head's matrix product runs on 2 rows against 5: another shape, which may round differently on another
    CPU (2.4e-7 measured), so the promise is agreement within the fp32 budget, not the same bits."""
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    kept, full = run(model, ids, logits_to_keep=2), run(model, ids)
    assert kept.shape == (1, 2, V)
    assert_close(kept, full[:, -2:], FP32_BUDGET, "logits_to_keep=2 against the last two of all")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int32])
def test_state_dtypes_other_than_fp32_and_float64_are_refused(model, dtype):
    """D6: initial_state(B, dtype=torch.float16) stored RWKV-4's -1e38 as -inf, and the C loop made NaN of it."""
    with pytest.raises(TypeError, match="state dtype must be torch.float32 or torch.float64"):
        model.initial_state(2, dtype=dtype)
    state = model.initial_state(1)
    half = [tuple(t.to(dtype) if t.dtype == torch.float32 else t for t in layer) if isinstance(layer, tuple)
            else layer.to(dtype) for layer in state]
    with pytest.raises(TypeError, match="dtype"):
        run(model, torch.tensor([[1, 2]]), state=half)


def test_float64_state_is_accepted(model):
    ids = torch.tensor([[1, 2, 3]])
    assert_close(run(model, ids, state=model.initial_state(1, dtype=torch.float64)), run(model, ids), FP32_BUDGET,
                 "logits from a float64 initial state")


def test_rwkv7_head_size_1_at_one_token():
    """A group norm over one value per group (head size 1, B * T = 1) raised torch's "Expected more than 1 value
    per channel"; it is defined (the value minus its own mean is 0: the output is the bias), as the reference
    computes it."""
    import numpy as np
    from seqmix.reference import rwkv7 as ref
    torch.manual_seed(0)
    model = Rwkv7(Rwkv7Config(vocab_size=V, n_embd=4, n_layer=2, head_size=1)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))          # every weight away from its init (ln_x's bias off 0)
    ids = np.array([[5]])
    params = {k: v.double().numpy() for k, v in model.state_dict().items()}
    assert_close(run(model, torch.as_tensor(ids)), ref.forward(params, ids)[0], FP32_BUDGET, "head size 1, one token")


@pytest.mark.parametrize("r_k_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("backend, grad", [(None, False), (None, True), ("torch", False)])
def test_rwkv7_bonus_weights_in_another_dtype(r_k_dtype, backend, grad):
    """The review's r_k item: a bf16 RWKV-7 whose r_k is stored fp16 (KeyError in the C time mix) or fp32 (a dtype
    error in the output projection on the torch path) gives the logits of r_k in bf16, within the bf16 budget."""
    torch.manual_seed(0)
    model = rwkv7().eval().bfloat16()
    ids = torch.tensor([[1, 60, 7, 0, 5]])
    with torch.no_grad():
        expected = run(model, ids)
    for block in model.blocks:
        block.att.r_k.data = block.att.r_k.data.to(r_k_dtype)
    with torch.set_grad_enabled(grad):
        got = model(ids, backend=backend)[0]
    assert got.dtype == torch.bfloat16
    assert_close(got.float(), expected.float(), BF16_BUDGET, f"logits with r_k in {r_k_dtype}")
