"""RWKV-7 with the wide in-context rate, a = (1 + w) sigmoid(a0 + xa a1 a2) in (0, 1 + w) (the state-tracking
experiment's option, off by default): every path that runs RWKV-7 gives the reference's answer with it, and the
transition's eigenvalues then reach -1 and stay in [-1, 1]."""
from dataclasses import replace

import numpy as np
import pytest
import torch

from seqmix.kernels.testing import FP32_BUDGET, REFERENCE_BUDGET, assert_close
from seqmix.models.rwkv7 import Rwkv7
from seqmix.reference import rwkv7 as ref
from test_models_rwkv7 import CONFIG, V, assert_states_close, random_checkpoint

WIDE = replace(CONFIG, wide_in_context_rate=True)


@pytest.fixture(scope="module")
def weights():
    return random_checkpoint(seed=11)


@pytest.fixture(scope="module")
def params(weights):
    return {k: v.double().numpy() for k, v in weights.items()}


@pytest.fixture(scope="module")
def model(weights):
    m = Rwkv7(WIDE).eval()
    m.load_state_dict(weights)
    return m


def ids(seed, B, T):
    return np.random.default_rng(seed).integers(0, V, size=(B, T))


def test_the_option_changes_the_reference(params):
    """Not a no-op: the wide rate gives other logits than the published model on the same weights."""
    x = ids(0, 2, 6)
    wide, _ = ref.forward(params, x, wide_in_context_rate=True)
    published, _ = ref.forward(params, x)
    assert np.linalg.norm(wide - published) / np.linalg.norm(published) > 1e-2


def test_reference_rnn_mode_equals_gpt_mode(params):
    x = ids(1, 2, 7)
    logits, state = ref.forward(params, x, wide_in_context_rate=True)
    rnn_logits, rnn_state = ref.forward_rnn(params, x, wide_in_context_rate=True)
    assert_close(rnn_logits, logits, REFERENCE_BUDGET, "RNN-mode logits")
    assert_states_close(rnn_state, state, REFERENCE_BUDGET, "RNN-mode state")


@pytest.mark.parametrize("backend, grad", [(None, False), (None, True), ("torch", False), ("torch", True),
                                           ("c", False), ("c", True), ("triton", False)])
def test_model_matches_reference(model, params, backend, grad):
    """Without gradients, backend None and "c" would take the C time mix and the C decoding step, which compute
    the published a: the model must not use them with the option on. Every backend's WKV-7 op takes a and b as the
    time mix makes them (Triton under its interpreter on CPU tensors). Prompt, then one token, from a state."""
    prompt, token = ids(2, 1, 5), ids(3, 1, 1)
    logits, state = ref.forward(params, prompt, wide_in_context_rate=True)
    step_logits, step_state = ref.forward(params, token, state, wide_in_context_rate=True)
    with torch.set_grad_enabled(grad):
        got, got_state = model(torch.as_tensor(prompt), backend=backend)
        got_step, got_step_state = model(torch.as_tensor(token), got_state, backend=backend)
    assert_close(got, logits, FP32_BUDGET, "prompt logits")
    assert_close(got_step, step_logits, FP32_BUDGET, "one-token logits")
    assert_states_close(got_step_state, step_state, FP32_BUDGET, "state")


def test_save_pretrained_refuses_the_option(model, tmp_path):
    with pytest.raises(ValueError, match="wide_in_context_rate"):
        model.save_pretrained(tmp_path / "wide")


def transition(log_w, kk, a):
    """G = diag(w) - kk (a * kk)^T: S_t = S_{t-1} G_t + v_t k_t^T with the op's a = -kk, b = kk * a."""
    return np.diag(np.exp(log_w)) - np.outer(kk, a * kk)


def test_eigenvalues_reach_minus_one_and_stay_in_the_unit_disc():
    """Published a in (0, 1): the smallest eigenvalue stays above w_min - 1 = -0.455. Wide a up to 1 + w: it
    reaches -1 (a = 1 + w, kk along one channel) and no eigenvalue leaves the unit disc (random draws)."""
    rng = np.random.default_rng(0)
    log_w_min = -np.exp(-0.5)
    smallest, largest, published = 1.0, 0.0, 1.0
    for _ in range(3000):
        n = int(rng.integers(2, 9))
        log_w = log_w_min * rng.random(n)
        kk = rng.standard_normal(n)
        kk /= np.linalg.norm(kk)
        z = rng.normal(scale=4.0, size=n)
        eig = np.linalg.eigvals(transition(log_w, kk, ref.in_context_rate(z, log_w, wide=True)))
        smallest, largest = min(smallest, eig.real.min()), max(largest, np.abs(eig).max())
        eig = np.linalg.eigvals(transition(log_w, kk, ref.in_context_rate(z, log_w)))
        published = min(published, eig.real.min())
    assert largest <= 1 + 1e-12
    assert published > np.exp(log_w_min) - 1 - 1e-12
    corner = transition(np.full(2, log_w_min), np.array([1.0, 0.0]), np.full(2, 1 + np.exp(log_w_min)))
    assert np.isclose(np.linalg.eigvals(corner).real.min(), -1.0)
    assert smallest < -0.9
