"""The training recipe's settings the MQAR probes vary (issue 45: attention at N = 8, width 64): Zoology's optimizer
settings in training.Budget, the transformer's tied head and dropout, and a longer run keeping its warmup in steps."""
import numpy as np
import pytest
import torch

from seqmix.experiments import recall, zoo
from seqmix.experiments.data import mqar
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


@pytest.mark.parametrize("setting", [dict(tie_head=True), dict(dropout=0.1)])
def test_the_transformers_settings_are_attention_only(setting):
    with pytest.raises(ValueError, match="attention only"):
        zoo.build("rwkv4", vocab_size=16, width=16, **setting)


def test_dropout_out_of_range_is_refused():
    with pytest.raises(ValueError, match="dropout must be in"):
        zoo.build("attention", vocab_size=16, width=16, dropout=1.0)


def test_a_probe_refuses_an_unknown_recipe_setting(tmp_path):
    with pytest.raises(ValueError, match="recipe takes"):
        recall.probe(tmp_path, recall.QUICK, arch="attention", width=32, pairs=2, seq_len=16, head_size=16, lr=3e-3,
                     recipe={"momentum": 0.9})
