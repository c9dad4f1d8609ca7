"""The experiments' models: the transformer's position schemes against the relative-position definition of
reference/rope.py, the time-invariant Mamba against a convolution built by reference/ssm.py, the model zoo."""
import math

import numpy as np
import pytest
import torch

import seqmix.models.mamba as mamba
from helpers.qkv_check import qkv_inputs
from seqmix.experiments import zoo
from seqmix.experiments.transformer import PositionScheme, Transformer, TransformerConfig
from seqmix.kernels.ssm import selective_scan
from seqmix.kernels.testing import FP32_BUDGET, REFERENCE_BUDGET, assert_close
from seqmix.reference.rope import attention_from_relative_positions, log_n_scale, relative_positions
from seqmix.reference.ssm import causal_convolution, ssm_kernel


L, BASE = 8, 10000.0


@pytest.mark.parametrize("T", [5, 8, 29])
@pytest.mark.parametrize("scheme, rel, base, dagger", [
    (PositionScheme("rope"), lambda T: relative_positions(T, "rope"), lambda T, d: BASE, False),
    (PositionScheme("pi"), lambda T: relative_positions(T, "pi", k=max(1, T / L)), lambda T, d: BASE, False),
    (PositionScheme("ntk"), lambda T: relative_positions(T, "rope"),
     lambda T, d: BASE * max(1, T / L) ** (d / (d - 2)), False),
    (PositionScheme("rerope", window=3), lambda T: relative_positions(T, "rerope", window=3), lambda T, d: BASE,
     False),
    (PositionScheme("leaky_rerope", window=4, leaky_k=16.0, log_n=True),
     lambda T: relative_positions(T, "leaky_rerope", window=4, k=16.0), lambda T, d: BASE, True),
    (PositionScheme("pi", log_n=True), lambda T: relative_positions(T, "pi", k=max(1, T / L)), lambda T, d: BASE,
     True),
])
def test_scheme_is_its_relative_position_matrix(rng, T, scheme, rel, base, dagger):
    """Each scheme's attention is softmax(q_i . R(-rel_ij) k_j) v with the post's matrix, PI and NTK scaled by
    s = max(1, T / L) (1 at the training length: every scheme is the trained model there), log n† on q."""
    q, k, v = qkv_inputs(rng, (1, 2, T, 8))
    out = scheme.attend(q, k, v, L, BASE)
    q_ref = q.numpy() * (log_n_scale(np.arange(T), L)[:, None] if dagger else 1)
    expected = attention_from_relative_positions(q_ref, k.numpy(), v.numpy(), rel(T), base=base(T, 8))
    assert_close(out, expected, REFERENCE_BUDGET)


def test_scheme_names_follow_the_post():
    assert PositionScheme("rerope", window=32, log_n=True).name == "ReRoPE-w32-log n†"
    assert PositionScheme("leaky_rerope", window=64, leaky_k=16.0).name == "Leaky ReRoPE-w64-k16"
    assert PositionScheme("ntk").name == "NTK-old"
    with pytest.raises(ValueError, match="window is needed by ReRoPE"):
        PositionScheme("rope", window=4)
    with pytest.raises(ValueError, match="leaky_k is needed by Leaky ReRoPE only"):
        PositionScheme("leaky_rerope", window=4)
    with pytest.raises(ValueError, match="kind must be one of"):
        PositionScheme("alibi")


def test_trained_log_n_scales_every_query_by_ln_n_over_ln_L(rng, monkeypatch):
    """config.log_n: q_n * ln n / ln L at every position (position 1 attends with q = 0), not the clamped log n†."""
    torch.manual_seed(0)
    plain = Transformer(TransformerConfig(16, hidden_size=16, num_layers=1, head_size=8, train_length=L))
    scaled = Transformer(TransformerConfig(16, hidden_size=16, num_layers=1, head_size=8, train_length=L, log_n=True))
    scaled.load_state_dict(plain.state_dict())
    queries, original = [], PositionScheme.attend

    def recording(self, q, k, v, *args):
        queries.append(q)
        return original(self, q, k, v, *args)

    monkeypatch.setattr(PositionScheme, "attend", recording)
    ids = torch.tensor(rng.integers(0, 16, (1, 12)))
    plain(ids)
    scaled(ids)
    factor = torch.log(torch.arange(1, 13, dtype=torch.float64)) / math.log(L)
    assert_close(queries[1], queries[0] * factor.float()[:, None], FP32_BUDGET)
    with pytest.raises(ValueError, match="log n† .* trained without log n"):
        scaled(ids, PositionScheme("rope", log_n=True))


@pytest.mark.parametrize("arch", zoo.ARCHITECTURES)
def test_every_model_gives_logits_and_gradients(arch):
    torch.manual_seed(0)
    model = zoo.build(arch, vocab_size=20, width=32, layers=2)
    ids = torch.randint(0, 20, (2, 11))
    out = zoo.logits(model, ids)
    assert out.shape == (2, 11, 20) and torch.isfinite(out).all()
    out.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
    assert zoo.num_parameters(model) == sum(p.numel() for p in model.parameters())


def test_time_invariant_mamba_is_a_convolution(rng):
    """The LTI block's scan (the project's selective scan with delta, B, C held constant) equals the causal
    convolution with K_l = C A_bar^l B_bar, per channel, built by the reference from the same constants."""
    torch.manual_seed(0)
    model = zoo.build("mamba_lti", vocab_size=10, width=8, layers=1, state_size=4)
    mixer = model.backbone.layers[0].mixer
    with torch.no_grad():
        mixer.x_proj.value.normal_()
    delta, A, B, C = (x.double() for x in zoo.time_invariant_system(mixer))
    D, N, T = A.shape[0], A.shape[1], 23
    u = torch.tensor(rng.standard_normal((1, D, T)))
    y, _ = selective_scan(u, delta[None, :, None].expand(1, D, T), A, B[None, :, None].expand(1, N, T),
                          C[None, :, None].expand(1, N, T), backend="torch")
    for d in range(D):
        A_bar = np.diag(np.exp(delta[d].item() * A[d].numpy()))
        K = ssm_kernel(A_bar, delta[d].item() * B.numpy(), C.numpy(), T)
        assert_close(y[0, d], causal_convolution(K, u[0, d].numpy()), REFERENCE_BUDGET)


def test_time_invariant_mamba_runs_the_scan_on_those_constants(monkeypatch):
    """What the model's block hands the project's scan: delta (after bias and softplus), B and C equal to
    time_invariant_system's, at every position and in every sequence."""
    torch.manual_seed(0)
    model = zoo.build("mamba_lti", vocab_size=10, width=8, layers=1, state_size=4)
    mixer = model.backbone.layers[0].mixer
    with torch.no_grad():
        mixer.x_proj.value.normal_()
    calls, original = [], mamba.selective_scan

    def recording(u, delta, A, B, C, **kw):
        calls.append((torch.nn.functional.softplus(delta + kw["delta_bias"][:, None]), A, B, C))
        return original(u, delta, A, B, C, **kw)

    monkeypatch.setattr(mamba, "selective_scan", recording)
    model(torch.randint(0, 10, (3, 9)))
    delta, A, B, C = zoo.time_invariant_system(mixer)
    seen_delta, seen_A, seen_B, seen_C = calls[0]
    assert_close(seen_delta, delta[None, :, None].expand(3, -1, 9), FP32_BUDGET)
    assert torch.equal(seen_A, A)
    assert torch.equal(seen_B, B[None, :, None].expand(3, -1, 9))
    assert torch.equal(seen_C, C[None, :, None].expand(3, -1, 9))


def test_time_invariant_projection_ignores_its_input():
    torch.manual_seed(0)
    model = zoo.build("mamba_lti", vocab_size=10, width=8, layers=1)
    proj = model.backbone.layers[0].mixer.x_proj
    out = proj(torch.randn(3, 5, 16))
    assert out.shape == (3, 5, proj.value.numel()) and (out == proj.value).all()
    with pytest.raises(TypeError, match="mamba_lti"):
        zoo.time_invariant_system(zoo.build("mamba", vocab_size=10, width=8, layers=1).backbone.layers[0].mixer)


def test_rwkv7_training_init_spreads_the_decays():
    torch.manual_seed(0)
    model = zoo.build("rwkv7", vocab_size=10, width=32, layers=2)
    decay = torch.exp(-torch.exp(-torch.nn.functional.softplus(-model.blocks[0].att.w0) - 0.5)).flatten()
    assert decay.max() > 0.99 and decay.min() < 0.95           # slow and fast channels
    assert (model.blocks[1].att.output.weight == 0).all()


def test_state_sizes_and_bad_arch():
    assert zoo.state_size("rwkv7", width=64, head_size=16) == 1024
    assert zoo.state_size("rwkv4", width=64) == 128
    with pytest.raises(ValueError, match="arch must be one of"):
        zoo.build("lstm", vocab_size=10, width=8)


@pytest.mark.parametrize("arch, selective", [("mamba_ungated", True), ("mamba_lti_ungated", False)])
def test_the_gate_less_pair_runs_the_scan_without_a_gate(monkeypatch, arch, selective):
    """The Mamba paper's "no gate" rows: in_proj makes x_in alone and the scan gets no z; the gated models give it
    z. The selective one keeps its input-dependent x_proj, the time-invariant one the constants."""
    torch.manual_seed(0)
    gated = zoo.build(arch.removesuffix("_ungated"), vocab_size=10, width=8, layers=1, state_size=4)
    ungated = zoo.build(arch, vocab_size=10, width=8, layers=1, state_size=4)
    D = gated.backbone.layers[0].mixer.D.numel()
    assert gated.backbone.layers[0].mixer.in_proj.weight.shape[0] == 2 * D
    assert ungated.backbone.layers[0].mixer.in_proj.weight.shape[0] == D
    assert isinstance(ungated.backbone.layers[0].mixer.x_proj, zoo.TimeInvariantProjection) is not selective
    seen, original = [], mamba.selective_scan
    monkeypatch.setattr(mamba, "selective_scan", lambda *a, **kw: seen.append(kw["z"]) or original(*a, **kw))
    for model in (gated, ungated):
        model(torch.randint(0, 10, (2, 7)))
    assert seen[0] is not None and seen[0].shape == (2, D, 7) and seen[1] is None


def test_the_c_decoding_step_refuses_a_gate_less_mamba(monkeypatch):
    """The C step computes the gated block only: a gate-less model's one-token call takes the torch ops, a gated
    one's the C step where the C library builds (seen through the model's own forward, which asks its step.py)."""
    from seqmix.kernels import native
    from seqmix.models.mamba import step
    calls = []
    original = step.mamba_step
    monkeypatch.setattr(step, "mamba_step", lambda *args: calls.append(args) or original(*args))
    torch.manual_seed(0)
    token = torch.tensor([[3]])
    with torch.no_grad():
        zoo.build("mamba_ungated", vocab_size=10, width=8, layers=1, state_size=4).eval()(token)
        assert not calls
        zoo.build("mamba", vocab_size=10, width=8, layers=1, state_size=4).eval()(token)
        assert len(calls) == (1 if native.available() else 0)
