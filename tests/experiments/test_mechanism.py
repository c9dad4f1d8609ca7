"""experiments/mechanism.py reads what it claims: each quantity rebuilt another way."""
import math
import numpy as np
import torch

from seqmix.experiments import data, mechanism, zoo
from seqmix.kernels.testing import FP32_BUDGET, assert_close
from seqmix.reference import wkv7 as ref_wkv7


def test_attention_weights_rebuild_each_block_output():
    """weights @ v, heads joined, is the input of each block's output projection, which the model computed with
    its attention kernel; rows sum to 1 and nothing falls on a later position."""
    torch.manual_seed(0)
    model = zoo.build("attention", vocab_size=16, width=32, train_length=12).eval()
    ids = torch.randint(0, 16, (2, 12))
    caught_qkv, caught_out = [], []
    for block in model.blocks:
        block.qkv.register_forward_hook(lambda m, a, out: caught_qkv.append(out))
        block.out.register_forward_hook(lambda m, args, out: caught_out.append(args[0]))
    with torch.no_grad():
        model(ids)
    weights = mechanism.attention_weights(model, ids)
    for w, qkv, attended in zip(weights, caught_qkv[:2], caught_out[:2]):
        B, H, T, _ = w.shape
        v = qkv.view(B, T, 3, H, -1)[:, :, 2].transpose(1, 2).double()           # (B, H, T, d)
        assert_close((w.double() @ v).transpose(1, 2).reshape(B, T, -1), attended, FP32_BUDGET, "weights @ v")
        assert torch.allclose(w.sum(-1), torch.ones(B, H, T, dtype=w.dtype))
        assert (w.triu(1) == 0).all()


def test_recall_attention_measures_the_weight_on_the_queried_pair(monkeypatch):
    """With attention weights that put everything on position 2j + 1 of each query's pair, "value" is 1 and the
    rest 0; on position 2j, "key" is 1."""
    inputs, targets = data.mqar(np.random.default_rng(0), 3, seq_len=16, num_pairs=2, vocab_size=16)
    rows, cols = np.nonzero(targets != data.IGNORE)

    def fake(offset):
        w = torch.zeros(3, 2, 16, 16)
        for r, c in zip(rows, cols):
            j = int(np.flatnonzero(inputs[r, 0:4:2] == inputs[r, c])[0])
            w[r, :, c, 2 * j + offset] = 1
        return lambda model, ids: [w]

    monkeypatch.setattr(mechanism, "attention_weights", fake(1))
    found = mechanism.recall_attention(None, inputs, targets)
    assert np.allclose(found["value"], 1) and np.allclose(found["key"], 0) and np.allclose(found["other_values"], 0)
    monkeypatch.setattr(mechanism, "attention_weights", fake(0))
    found = mechanism.recall_attention(None, inputs, targets)
    assert np.allclose(found["key"], 1) and np.allclose(found["value"], 0)


def test_previous_token_attention_reads_a_values_weight_on_its_key(monkeypatch):
    """Head 0 puts everything on the previous token: weight 1; head 1 spreads evenly over the i + 1 positions it sees:
    the values at positions 1 and 3 put 1/2 and 1/4 on their keys, weight 3/8 = "uniform" (N = 2). A conv_first
    model's convolving block has no attention matrix: one per attending block."""
    T = 16
    w = torch.zeros(3, 2, T, T)
    w[:, 0, torch.arange(1, T), torch.arange(T - 1)] = 1
    w[:, 1] = torch.ones(T, T).tril() / torch.arange(1, T + 1)[:, None]
    monkeypatch.setattr(mechanism, "attention_weights", lambda model, ids: [w, torch.zeros_like(w)])
    inputs, _ = data.mqar(np.random.default_rng(0), 3, seq_len=T, num_pairs=2, vocab_size=16)
    found = mechanism.previous_token_attention(None, inputs, num_pairs=2)
    assert np.allclose(found["weight"], [1, 3 / 8]) and found["uniform"] == 3 / 8
    monkeypatch.undo()
    model = zoo.build("attention", vocab_size=16, width=32, train_length=12, conv_first=True).eval()
    assert len(mechanism.attention_weights(model, torch.randint(0, 16, (2, 12)))) == 1


def test_embeddings_alike_is_the_mean_cosine_over_pairs_of_distinct_tokens():
    """Three embeddings set by hand: e_1 = (1, 0), e_2 = (0, 2), e_3 = (1, 1): the cosines 0, 1/sqrt(2), 1/sqrt(2)
    average to sqrt(2)/3; the same vector for every token gives 1, and the other tokens' rows are not read."""
    model = zoo.build("attention", vocab_size=8, width=2, head_size=2, train_length=4)
    with torch.no_grad():
        model.emb.weight.fill_(5.0)
        model.emb.weight[1:4, :] = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    assert math.isclose(mechanism.embeddings_alike(model, [1, 2, 3]), math.sqrt(2) / 3, rel_tol=1e-6)
    with torch.no_grad():
        model.emb.weight[1:4, :] = torch.tensor([-0.5, 2.0])
    assert math.isclose(mechanism.embeddings_alike(model, range(1, 4)), 1.0, rel_tol=1e-6)


def test_rwkv7_readout_is_the_cosine_of_the_op_output_with_the_written_values():
    """The caught op output is the reference WKV-7 of the caught inputs, and the readout's (i, j) entry is the mean
    over heads of cos(y at the query of pair i, v at position 2j + 1), computed here in NumPy."""
    torch.manual_seed(1)
    model = zoo.build("rwkv7", vocab_size=16, width=32).eval()
    inputs, targets = data.mqar(np.random.default_rng(1), 1, seq_len=16, num_pairs=2, vocab_size=16)
    calls = []
    with torch.no_grad(), mechanism._caught_wkv7(calls):
        model(torch.from_numpy(inputs), backend="torch")
    assert len(calls) == 2
    got = mechanism.rwkv7_readout(model, inputs, targets)
    y, v = calls[-1]["y"][0].double().numpy(), calls[-1]["v"][0].double().numpy()     # (T, H, N)
    expected = np.zeros((2, 2))
    for col in np.flatnonzero(targets[0] != data.IGNORE):
        i = int(np.flatnonzero(inputs[0, 0:4:2] == inputs[0, col])[0])
        for j in range(2):
            a, b = y[col], v[2 * j + 1]
            expected[i, j] = np.mean((a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1))
    assert np.allclose(got, expected, atol=1e-6)


def test_caught_wkv7_output_is_the_reference_op():
    """What the wrapper keeps is the op's own call: the float64 reference on the caught inputs gives its output."""
    torch.manual_seed(2)
    model = zoo.build("rwkv7", vocab_size=16, width=32).eval()
    ids = torch.randint(0, 16, (1, 9))
    calls = []
    with torch.no_grad(), mechanism._caught_wkv7(calls):
        model(ids, backend="torch")
    for call in calls:
        args = [call[name].double().numpy() for name in ("r", "log_w", "k", "v", "a", "b")]
        y, _ = ref_wkv7.wkv7(*args, state=call["state"].double().numpy())
        assert_close(call["y"], y, FP32_BUDGET, "caught WKV-7 output")


def test_mamba_step_sizes_follow_the_step_bias():
    """delta = softplus(dt_proj(.) + bias) per channel: raising every bias raises every position's mean step."""
    torch.manual_seed(3)
    model = zoo.build("mamba", vocab_size=10, width=32).eval()
    inputs = np.random.default_rng(3).integers(0, 10, size=(2, 12))
    before = mechanism.mamba_step_sizes(model, inputs)
    with torch.no_grad():
        model.backbone.layers[0].mixer.dt_proj.bias += 1.0
    after = mechanism.mamba_step_sizes(model, inputs)
    assert before.shape == (2, 12) and (before > 0).all() and (after > before).all()


def test_rwkv7_transitions_are_the_eigenvalues_of_diag_w_plus_a_b():
    """Checked against NumPy's eigenvalues of G = diag(w) + a b^T built from the reference's pieces: one step of
    the reference WKV-7 from a state S with k = 0 gives S G, so G is read off the op itself."""
    torch.manual_seed(4)
    model = zoo.build("rwkv7", vocab_size=2, width=32, layers=1).eval()
    inputs = np.random.default_rng(4).integers(0, 2, size=(1, 5))
    calls = []
    with torch.no_grad(), mechanism._caught_wkv7(calls):
        model(torch.from_numpy(inputs), backend="torch")
    found = mechanism.rwkv7_transitions(model, inputs)[0]
    c = {k: v.double().numpy() for k, v in calls[0].items() if k in ("r", "log_w", "k", "v", "a", "b")}
    t, h = 3, 1
    N = c["r"].shape[-1]
    G = np.zeros((N, N))
    for row in range(N):                                    # S = e_row: one step with k = 0 gives row `row` of G
        S = np.zeros((1, 2, N, N))
        S[0, h, 0, row] = 1.0
        piece = {k: v[:, t:t + 1] for k, v in c.items()}
        piece["k"] = np.zeros_like(piece["k"])
        _, S1 = ref_wkv7.wkv7(piece["r"], piece["log_w"], piece["k"], piece["v"], piece["a"], piece["b"], state=S)
        G[row] = S1[0, h, 0]
    eig = np.linalg.eigvals(G)
    assert np.isclose(found["min_real"][0, t, h], eig.real.min(), atol=1e-5)
    assert np.isclose(found["max_abs"][0, t, h], np.abs(eig).max(), atol=1e-5)
