"""The training recipe's settings the MQAR probes vary (issue 45: attention at N = 8, width 64): Zoology's optimizer
settings in training.Budget, the transformer's tied head, its dropout (on the residual branches, and on the attention
weights as Zoology's), and a longer run keeping its warmup in steps."""
import numpy as np
import pytest
import torch

from seqmix.experiments import recall, zoo
from seqmix.experiments.data import mqar
from seqmix.experiments.transformer import PositionScheme, dropped_attention
from seqmix.kernels.attention import attention
from seqmix.reference.attention import softmax_attention
from seqmix.experiments.training import Budget, Run


def _run(budget, **build):
    return Run(build=lambda: zoo.build("attention", vocab_size=16, width=16, layers=2, **build), forward=zoo.logits,
               sample=lambda rng, n: mqar(rng, n, seq_len=12, num_pairs=2, vocab_size=16), lr=1e-2, budget=budget,
               seed=0, valid=mqar(np.random.default_rng(9), 8, seq_len=12, num_pairs=2, vocab_size=16))


def test_a_longer_run_keeps_the_warmup_in_steps_and_stretches_the_cosine():
    b = Budget(steps=1000, batch_size=1, warmup=0.05)
    long = b.longer(4)
    assert (long.steps, long.warmup_steps) == (4000, 50)
    assert long.lr_at(49, 1.0) == b.lr_at(49, 1.0) == 1.0               # the same warmup, step for step
    # halfway through the cosine (0.1 + 0.9 / 2 of the peak): 950 / 2 steps after the warmup, 3950 / 2 in the long run
    assert long.lr_at(50 + 1975, 1.0) == pytest.approx(0.55) == b.lr_at(50 + 475, 1.0)


def test_no_warmup_and_a_constant_rate():
    b = Budget(steps=100, batch_size=1, warmup=0.0, final_lr=1.0)
    assert [b.lr_at(s, 2e-3) for s in (0, 1, 50, 99)] == [2e-3] * 4


def test_the_optimizer_takes_the_recipe():
    default, zoology = _run(Budget(steps=2, batch_size=2)), _run(Budget(steps=2, batch_size=2, beta2=0.999,
                                                                          decay_all=True))
    assert [g["betas"] for g in default.optimizer.param_groups] == [(0.9, 0.98)] * 2
    assert [g["weight_decay"] for g in default.optimizer.param_groups] == [0.1, 0.0]
    assert [(g["betas"], g["weight_decay"]) for g in zoology.optimizer.param_groups] == [((0.9, 0.999), 0.1)]
    assert len(zoology.optimizer.param_groups[0]["params"]) == len(list(zoology.model.parameters()))


def test_no_clipping_lets_a_large_gradient_through(monkeypatch):
    """clip=None skips clip_grad_norm_; the default clips at 1."""
    calls = []
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda params, norm: calls.append(norm))
    _run(Budget(steps=2, batch_size=2, eval_every=2)).train_to(2, progress=False)
    _run(Budget(steps=2, batch_size=2, eval_every=2, clip=None)).train_to(2, progress=False)
    assert calls == [1.0, 1.0]


def test_a_tied_head_reads_the_embedding_and_dropout_is_off_in_evaluation():
    torch.manual_seed(0)
    tied = zoo.build("attention", vocab_size=16, width=16, tie_head=True, dropout=0.5)
    assert tied.head.weight is tied.emb.weight
    assert zoo.num_parameters(tied) == zoo.num_parameters(zoo.build("attention", vocab_size=16, width=16)) - 16 * 16
    ids = torch.randint(0, 16, (2, 8))
    tied.eval()
    assert torch.equal(tied(ids), tied(ids))                  # evaluation: deterministic
    tied.train()
    assert not torch.equal(tied(ids), tied(ids))              # training: dropped at random


@pytest.mark.parametrize("setting", [dict(tie_head=True), dict(dropout=0.1), dict(attention_dropout=0.1)])
def test_the_transformers_settings_are_attention_only(setting):
    with pytest.raises(ValueError, match="attention only"):
        zoo.build("rwkv4", vocab_size=16, width=16, **setting)
    with pytest.raises(ValueError, match="attention only"):          # the Zoology preset fixes its own settings
        zoo.build("attention_zoology", vocab_size=16, width=16, **setting)


def test_zoology_attention_is_the_transformer_in_zoologys_shape():
    """recall's control: one head as wide as the model, no MLP, learned positions, the head tied to the embedding,
    dropout 0.1 on the attention weights and nowhere else; head_size does not change it."""
    model = zoo.build("attention_zoology", vocab_size=16, width=24, layers=2, head_size=8, train_length=12)
    c = model.config
    assert (c.hidden_size // c.head_size, c.head_size, c.intermediate_size, c.positions) == (1, 24, 0, "learned")
    assert (c.tie_head, c.dropout, c.attention_dropout, c.num_layers) == (True, 0.0, 0.1, 2)
    assert model.head.weight is model.emb.weight
    same = zoo.build("attention", vocab_size=16, width=24, layers=2, head_size=24, train_length=12,
                     **zoo.ZOOLOGY_ATTENTION)
    assert zoo.num_parameters(model) == zoo.num_parameters(same)
    assert zoo.state_size("attention_zoology", width=24, seq_len=12) == 2 * 24 * 12


@pytest.mark.parametrize("name", ["dropout", "attention_dropout"])
def test_dropout_out_of_range_is_refused(name):
    with pytest.raises(ValueError, match=f"^{name} must be in"):
        zoo.build("attention", vocab_size=16, width=16, **{name: 1.0})


def _qkv(B=2, H=2, T=7, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, d, generator=g, dtype=torch.float64) for _ in range(3)]


def test_dropped_attention_at_rate_zero_is_causal_attention():
    """Against the float64 reference (an independent softmax), within the fp32 budget's scale in float64."""
    q, k, v = _qkv()
    want = torch.from_numpy(softmax_attention(q.numpy(), k.numpy(), v.numpy()))
    assert torch.allclose(dropped_attention(q, k, v, 0.0), want, rtol=0, atol=1e-12)


def test_dropped_attention_is_unbiased_and_drops_whole_weights():
    """Inverted dropout on the weights: the mean over many masks is the undropped output (the standard error of a
    mean of 4000 draws bounds the gap); one draw at p = 0.5 at the first position (a single weight, 1) gives v_0 / 0.5
    or 0, nothing between."""
    q, k, v = _qkv()
    torch.manual_seed(0)
    draws = torch.stack([dropped_attention(q, k, v, 0.3) for _ in range(4000)])
    exact = attention(q, k, v)
    stderr = draws.std(0) / 4000 ** 0.5
    assert ((draws.mean(0) - exact).abs() <= 5 * stderr + 1e-12).all()
    assert not torch.equal(draws[0], draws[1])
    first = torch.stack([dropped_attention(q, k, v, 0.5)[..., 0, :] for _ in range(200)])   # (200, B, H, d)
    kept = (first == 2 * v[..., 0, :]).all(-1)
    assert (kept | (first == 0).all(-1)).all() and 0 < kept.float().mean() < 1


def test_attention_dropout_acts_in_training_only():
    """Evaluation: the same logits as the model without it (same weights); training: masks drawn on the weights."""
    torch.manual_seed(0)
    dropped = zoo.build("attention", vocab_size=16, width=16, attention_dropout=0.5)
    plain = zoo.build("attention", vocab_size=16, width=16)
    plain.load_state_dict(dropped.state_dict())
    ids = torch.randint(0, 16, (2, 8))
    dropped.eval(), plain.eval()
    assert torch.equal(dropped(ids), plain(ids))
    dropped.train(), plain.train()
    assert torch.equal(plain(ids), plain(ids)) and not torch.equal(dropped(ids), dropped(ids))
    learned = zoo.build("attention", vocab_size=16, width=16, positions="learned", attention_dropout=0.5).train()
    assert not torch.equal(learned(ids), learned(ids))


def test_a_rectified_scheme_refuses_dropped_weights():
    q, k, v = _qkv(d=8)
    with pytest.raises(ValueError, match="attention_dropout"):
        PositionScheme("rerope", window=4).attend(q, k, v, 8, 10000.0, mix=lambda *a: dropped_attention(*a, 0.1))


def test_a_probe_refuses_an_unknown_recipe_setting(tmp_path):
    with pytest.raises(ValueError, match="recipe takes"):
        recall.probe(tmp_path, recall.QUICK, arch="attention", width=32, pairs=2, seq_len=16, head_size=16, lr=3e-3,
                     recipe={"momentum": 0.9})
