"""The rungs as zoo models (experiments.rungs): each layer's state mix, run by the production WKV-7 op in fp32, equals
the rung's float64 loop of reference/family.py on the layer's own arguments; the torch table equals the reference's
as_wkv7; each rung's constraints hold (what is held at 0 or 1, the ranges of beta and the decays, unit keys); and the
model never takes RWKV-7's C step, which computes another time mix."""
import copy
from functools import lru_cache

import numpy as np
import pytest
import torch

from seqmix.experiments import rungs, zoo
from seqmix.kernels.testing import FP32_BUDGET, FP32_CHUNKED_WKV7_BUDGET, REFERENCE_BUDGET, assert_close
from seqmix.models.rwkv7 import step
from seqmix.reference import family
from helpers.family_inputs import rung_inputs

BUDGETS = {"c": FP32_BUDGET, "torch": FP32_CHUNKED_WKV7_BUDGET}


@lru_cache(maxsize=None)
def _model(arch):
    torch.manual_seed(0)
    return zoo.build(arch, vocab_size=10, width=32, layers=1, head_size=8)


def _layer(arch, shift=0.3, a0=None):
    """The first time mix of a small rung model, its parameters moved off the training start (so that no rung's
    numbers are special), and random inputs: (time mix, x (B, T, C), x_prev (B, C))."""
    att = copy.deepcopy(_model(arch).blocks[0].att)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in att.parameters():
            p.add_(shift * torch.randn_like(p))
        if a0 is not None:                    # beta = beta_max sigmoid(a0) at every step: the LoRA's part zeroed
            att.a0.fill_(a0)
            att.a2.zero_()
    return att, torch.randn(2, 20, 32), torch.randn(2, 32)


def _numpy(*tensors):
    return [t.detach().double().numpy() for t in tensors]


@pytest.mark.parametrize("backend", sorted(BUDGETS))
@pytest.mark.parametrize("arch", rungs.RUNGS)
def test_each_rung_layer_computes_its_reference_rung(arch, backend):
    """T = 20 crosses the chunked form's 16-step chunk; an initial state is carried in."""
    att, x, x_prev = _layer(arch)
    r, k, v, _, params = att.arguments(x, x_prev)
    S0 = torch.randn(2, 4, 8, 8)
    y, S = att.state_mix(r, k, v, params, S0, backend=backend)
    y_ref, S_ref = family.RUNGS[rungs.REFERENCE_RUNG[arch]](*_numpy(r, k, v), *_numpy(*params), state=_numpy(S0)[0])
    assert_close(y, y_ref, BUDGETS[backend], f"{arch} on {backend}: y")
    assert_close(S, S_ref, BUDGETS[backend], f"{arch} on {backend}: state")


@pytest.mark.parametrize("rung", sorted(family.RUNGS))
def test_the_torch_table_is_the_reference_table(rng, rung):
    q, k, v, params, _ = rung_inputs(rng, rung, B=2, T=5, H=3, N=4, state=False)
    ours = rungs.as_wkv7(rung, *(torch.tensor(x) for x in (q, k, v, *params)))
    theirs = family.as_wkv7(rung, q, k, v, *params)
    for name, a, b in zip(("r", "log_w", "k", "v", "a", "b"), ours, theirs):
        assert a.shape == b.shape, name
        assert_close(a, b, REFERENCE_BUDGET, f"{rung}: {name}")
    with pytest.raises(ValueError, match="rung"):
        rungs.as_wkv7("softmax", *(torch.tensor(x) for x in (q, k, v)))


def _wkv7_arguments(arch, **kw):
    att, x, x_prev = _layer(arch, **kw)
    r, k, v, _, params = att.arguments(x, x_prev)
    return (r, k, v, params), rungs.as_wkv7(att.reference_rung, r, k, v, *params)


def test_every_rung_takes_unit_keys():
    for arch in rungs.RUNGS:
        (_, k, _, _), _ = _wkv7_arguments(arch)
        assert_close(k.norm(dim=-1), torch.ones(k.shape[:-1]), FP32_BUDGET, arch)


def test_linear_attention_keeps_everything_and_only_adds():
    (_, k, v, params), (_, log_w, k7, v7, a, b) = _wkv7_arguments("linear_attention")
    assert params == () and (log_w == 0).all() and (a == 0).all() and (b == 0).all()
    assert torch.equal(k7, k) and torch.equal(v7, v)


def test_retention_decays_each_head_by_retnets_constant():
    (_, _, _, (log_gamma,)), (_, log_w, _, _, a, b) = _wkv7_arguments("retention")
    gamma = 1 - 2.0 ** (-5 - np.arange(4))
    assert_close(torch.exp(log_gamma), gamma, FP32_BUDGET, "gamma")
    assert torch.equal(log_w, log_gamma[:, None].expand(log_w.shape))     # the same at every step and channel
    assert (a == 0).all() and (b == 0).all()
    layer = _layer("retention")[0]
    assert "log_gamma" in dict(layer.named_buffers()) and "log_gamma" not in dict(layer.named_parameters())


def test_gla_decays_each_key_channel_in_rwkv7s_range():
    (_, _, _, (log_g,)), (_, log_w, _, _, a, b) = _wkv7_arguments("gla", shift=1.0)
    assert log_g.shape == (2, 20, 4, 8) and torch.equal(log_w, log_g)
    assert (log_w < 0).all() and (log_w > -np.exp(-0.5)).all()
    assert (log_w.std(-1) > 0).all()                                    # the channels of a head differ
    assert (a == 0).all() and (b == 0).all()


@pytest.mark.parametrize("arch, beta_max", [("delta_rule", 1.0), ("delta_rule_wide", 2.0)])
def test_the_delta_rules_beta_spans_its_range(arch, beta_max):
    """beta = beta_max sigmoid(.) in (0, beta_max): with the in-context rate's bias at +8, beta_max (1 - 3.4e-4),
    at -8 beta_max 3.4e-4; the op gets a = -k, b = beta k, v -> beta v, and no decay."""
    for a0, edge in ((8.0, beta_max), (-8.0, 0.0)):
        (_, k, v, (beta,)), (_, log_w, k7, v7, a, b) = _wkv7_arguments(arch, a0=a0)
        assert (beta > 0).all() and (beta < beta_max).all()
        assert_close(beta, torch.full(beta.shape, edge + (-1 if edge else 1) * beta_max * 3.3535e-4), 1e-5, arch)
        assert (log_w == 0).all() and torch.equal(a, -k) and torch.equal(k7, k)
        assert torch.equal(b, beta[..., None] * k) and torch.equal(v7, beta[..., None] * v)


@pytest.mark.parametrize("arch, lowest", [("delta_rule", 0.0), ("delta_rule_wide", -1.0)])
def test_the_delta_rules_transition_eigenvalues(arch, lowest):
    """G = diag(w) + a b^T = I - beta k k^T has the eigenvalue 1 - beta along k and 1 on the rest: in (0, 1] with
    beta in (0, 1), down to -1 with beta in (0, 2) (Grazzi et al.)."""
    (_, _, _, (beta,)), (_, log_w, _, _, a, b) = _wkv7_arguments(arch, a0=8.0)
    G = torch.diag_embed(torch.exp(log_w[0, 3, 1])).double() + a[0, 3, 1, :, None].double() * b[0, 3, 1, None].double()
    eigenvalues = torch.linalg.eigvalsh(G)
    expected = torch.tensor([1 - beta[0, 3, 1].item(), *[1.0] * 7], dtype=torch.float64)
    assert_close(eigenvalues, expected.sort().values.numpy(), 1e-6, arch)
    assert abs(eigenvalues.min().item() - lowest) < 1e-3


def test_the_gated_delta_rule_decays_each_head_and_writes_with_beta():
    (_, k, v, (log_alpha, beta)), (_, log_w, _, v7, a, b) = _wkv7_arguments("gated_delta_rule", shift=1.0)
    assert log_alpha.shape == beta.shape == (2, 20, 4)
    assert (log_alpha < 0).all() and (log_alpha > -np.exp(-0.5)).all()
    assert (beta > 0).all() and (beta < 1).all()
    assert torch.equal(log_w, log_alpha[..., None].expand(log_w.shape)) and torch.equal(a, -k)
    assert_close(b, (torch.exp(log_alpha) * beta)[..., None] * k, FP32_BUDGET, "b")


def test_a_rung_model_never_takes_rwkv7s_c_step():
    """One token of one sequence on a CPU without gradients is RWKV-7's C step, which computes RWKV-7's own time
    mix: a rung model refuses it (step.variant) and gives its sequence's logits token by token."""
    torch.manual_seed(0)
    model = zoo.build("delta_rule_wide", vocab_size=10, width=32, layers=2, head_size=8).eval()
    assert "delta_rule_wide" in step.variant(model.config)
    ids = torch.randint(0, 10, (1, 6))
    with torch.no_grad():
        whole, _ = model(ids)
        state, steps = None, []
        for t in range(6):
            logits, state = model(ids[:, t:t + 1], state)
            steps.append(logits)
    assert_close(torch.cat(steps, 1), whole.double().numpy(), FP32_CHUNKED_WKV7_BUDGET, "token by token")


def test_a_rung_config_names_a_rung():
    with pytest.raises(ValueError, match="rung must be one of"):
        rungs.RungConfig(vocab_size=10, n_embd=32, n_layer=1, head_size=8, rung="softmax")
    with pytest.raises(TypeError, match="RungConfig"):
        rungs.as_rung(zoo.build("rwkv7", vocab_size=10, width=32, layers=1, head_size=8))
