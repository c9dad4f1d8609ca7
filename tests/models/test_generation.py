"""Generation through a state: greedy, sampling, top-p, stop sequences, one step per new token."""
import math

import pytest
import torch

from seqmix.models.generation import generate, sample_next

V = 10


def counting_step(calls):
    """A toy model whose state is the last token; it strongly prefers last + 1 (mod V)."""
    def step(tokens, state):
        calls.append(tokens.shape[1])
        last = tokens[:, -1]
        return 5.0 * torch.nn.functional.one_hot((last + 1) % V, V).float(), last
    return step


def test_greedy_reads_the_prompt_once_then_one_token_per_step():
    calls = []
    out, state = generate(counting_step(calls), torch.tensor([[0, 1, 2], [7, 7, 7]]), max_new_tokens=4)
    assert out.tolist() == [[0, 1, 2, 3, 4, 5, 6], [7, 7, 7, 8, 9, 0, 1]]
    assert calls == [3, 1, 1, 1, 1]              # the prompt once, then each new token once
    assert state.tolist() == [6, 1]              # the state has read every returned token


def test_stop_sequence_finishes_rows_independently():
    out, _ = generate(counting_step([]), torch.tensor([[2], [6]]), max_new_tokens=8, stop_sequences=[[4, 5]])
    # Row 0 produces 3, 4, 5 and is finished (then padded with 5); row 1 runs 7, 8, 9, 0, 1, 2, 3, 4 and
    # stops for the budget, one token short of its own [4, 5].
    assert out[0].tolist() == [2, 3, 4, 5, 5, 5, 5, 5, 5]
    assert out[1].tolist() == [6, 7, 8, 9, 0, 1, 2, 3, 4]


def test_generation_ends_when_all_rows_stop():
    calls = []
    out, _ = generate(counting_step(calls), torch.tensor([[5]]), max_new_tokens=50, stop_sequences=[[7, 8]])
    assert out.tolist() == [[5, 6, 7, 8]] and len(calls) == 4


def test_sampling_frequencies_follow_the_tempered_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    g = torch.Generator().manual_seed(0)
    n = 20000
    draws = torch.stack([sample_next(logits, temperature=2.0, generator=g) for _ in range(n)]).flatten()
    p = torch.softmax(logits[0] / 2.0, dim=0)
    for tok in range(4):
        freq = (draws == tok).float().mean()
        assert abs(freq - p[tok]) < 5 * math.sqrt(p[tok] * (1 - p[tok]) / n)   # 5 standard errors


def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(1)
    draws = {int(sample_next(logits, temperature=1.0, top_p=0.7, generator=g)) for _ in range(500)}
    assert draws == {0, 1}                       # 0.5 < 0.7 <= 0.5 + 0.3
    assert {int(sample_next(logits, 1.0, top_p=0.01, generator=g)) for _ in range(50)} == {0}


@pytest.mark.parametrize("kw", [dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5)])
def test_bad_sampling_arguments(kw):
    with pytest.raises(ValueError):
        sample_next(torch.zeros(1, 3), **kw)


def test_bad_prompt():
    with pytest.raises(ValueError):
        generate(counting_step([]), torch.tensor([1, 2]), 3)


def test_a_stop_sequence_must_match_whole():
    """[5, 5] is never produced (the toy model counts 4, 5, 6): matching any one position would stop at the
    first 5; the row goes on to the budget."""
    out, _ = generate(counting_step([]), torch.tensor([[2]]), max_new_tokens=8, stop_sequences=[[5, 5]])
    assert out.tolist() == [[2, 3, 4, 5, 6, 7, 8, 9, 0]]


@pytest.mark.parametrize("stops,message", [([[]], "non-empty"), ([1, 2], "list of token-id lists"),
                                           ([[1, 2], 3], "list of token-id lists"), (torch.tensor([1]), "lists")])
def test_malformed_stop_sequences_are_refused(stops, message):
    """C13: [[]] gave a shape mismatch, a flat [1, 2] "len() of a 0-d tensor"."""
    with pytest.raises(ValueError, match=message):
        generate(counting_step([]), torch.tensor([[1]]), 3, stop_sequences=stops)


@pytest.mark.parametrize("kw", [dict(temperature=float("nan")), dict(temperature=float("inf")),
                                dict(top_p=float("nan")), dict(temperature="1")])
def test_nan_sampling_arguments_are_refused(kw):
    """C13: temperature NaN reached torch.multinomial and failed there."""
    with pytest.raises(ValueError, match=next(iter(kw))):
        generate(counting_step([]), torch.tensor([[1]]), 3, **kw)


def test_batch_of_zero_rows_is_refused():
    """C11: generate with B = 0 failed in torch's min()."""
    with pytest.raises(ValueError, match=r"input_ids must have shape \(B, T\) with B >= 1"):
        generate(counting_step([]), torch.zeros(0, 3, dtype=torch.long), 3)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32])
def test_any_integer_dtype_of_prompt(dtype):
    out, _ = generate(counting_step([]), torch.tensor([[0, 1, 2]], dtype=dtype), max_new_tokens=2)
    assert out.dtype == torch.int64 and out.tolist() == [[0, 1, 2, 3, 4]]


@pytest.mark.parametrize("temperature", [1e-40, 1e-50, 5e-324])
def test_tiny_temperature_draws_the_largest_logit(temperature):
    """temperature 1e-40 made logits / temperature inf and multinomial failed on NaN ("probability tensor contains
    inf/nan"); the limit is a draw among the largest logits (here two tied ones, each drawn)."""
    logits = torch.tensor([[1.0, 3.0, -2.0, 3.0], [500.0, 0.0, 0.0, 0.0]])
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([sample_next(logits, temperature=temperature, generator=g) for _ in range(200)])
    assert set(draws[:, 0].tolist()) == {1, 3} and set(draws[:, 1].tolist()) == {0}


@pytest.mark.parametrize("kw", [dict(top_p=True), dict(temperature=True), dict(temperature=False)])
def test_bool_sampling_arguments_are_refused(kw):
    """top_p=True was taken as 1.0: a bool is a flag, not a probability, most likely a mistake."""
    with pytest.raises(ValueError, match=next(iter(kw))):
        sample_next(torch.zeros(1, 3), **kw)
