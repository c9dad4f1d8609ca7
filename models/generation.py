"""Token-by-token generation through a recurrent state, shared by the RWKV-4, RWKV-7 and Mamba models.

The prompt is read once; every new token then costs one forward of one token through the state (never a re-read
of the prompt). Sampling: greedy (temperature 0), or temperature with nucleus (top-p) filtering.
Stop sequences end a row when its last tokens equal one of them, e.g. RWKV's "\\n\\n" = [187, 187] in the
GPT-NeoX tokenizer (https://huggingface.co/docs/transformers/model_doc/rwkv, RwkvStoppingCriteria).

    sample_next(logits, temperature, top_p, generator)   (B, V) -> (B,)
    continue_tokens(step, logits, state, last, ...)      yields (new ids (B,), state after reading them)
    generate(step, input_ids, max_new_tokens, ...)       (tokens (B, T + n), state), with stop sequences
"""
from __future__ import annotations

import math
from typing import Callable, Iterator, Sequence

import torch

__all__ = ["StepFn", "sample_next", "check_sampling", "check_prompt", "continue_tokens", "generate"]

# step(input_ids (B, t), state) -> (logits of the last position (B, vocab), new state)
StepFn = Callable[[torch.Tensor, object], tuple]


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)     # True is an int, but not a sampling option


def check_sampling(temperature, top_p) -> None:
    """Raise ValueError unless temperature is a number >= 0 and 0 < top_p <= 1 (NaN is neither, nor a bool)."""
    if not (_is_number(temperature) and temperature >= 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature!r}")
    if not (_is_number(top_p) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be a number in (0, 1], got {top_p!r}")


def sample_next(logits: torch.Tensor, temperature: float = 0.0, top_p: float = 1.0,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Pick the next token of every row.

    Args:
        logits: (B, V).
        temperature: 0 for the argmax; otherwise sample from softmax(logits / temperature). Any temperature > 0
            works: below float32's smallest normal (1.2e-38) it acts as that one, i.e. a draw among the tied
            largest logits.
        top_p: keep only the smallest set of most likely tokens whose probability reaches top_p (the most likely
            token is always kept).
        generator: a torch.Generator for reproducible draws.

    Returns:
        (B,) int64 token ids.
    """
    check_sampling(temperature, top_p)
    if temperature == 0:
        return logits.argmax(dim=-1)
    # Shifted by the max first, so that a tiny temperature gives -inf for the others and 0 for the max, not
    # inf - inf; and no smaller than float32 can hold (1e-50 would round to 0 and make 0 / 0).
    logits = logits.float()
    shifted = logits - logits.amax(dim=-1, keepdim=True)
    probs = torch.softmax(shifted / max(temperature, torch.finfo(torch.float32).tiny), dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    outside = sorted_p.cumsum(-1) - sorted_p >= top_p          # mass before this token already reaches top_p
    sorted_p = sorted_p.masked_fill(outside, 0.0)
    choice = torch.multinomial(sorted_p, 1, generator=generator)  # multinomial renormalizes
    return order.gather(-1, choice).squeeze(-1)


def check_prompt(input_ids, max_new_tokens) -> torch.Tensor:
    """input_ids (B, T) of any integer dtype, B, T >= 1, as int64; max_new_tokens an int >= 0."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must be an integer tensor, got "
                        f"{input_ids.dtype if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__}")
    if input_ids.dim() != 2 or min(input_ids.shape) < 1:
        raise ValueError(f"input_ids must have shape (B, T) with B >= 1 and T >= 1, got {tuple(input_ids.shape)}")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    return input_ids.long()


def _check_stop_sequences(stop_sequences, device) -> list[torch.Tensor]:
    """A list of non-empty token-id lists, as int64 tensors."""
    if isinstance(stop_sequences, torch.Tensor) or any(
            not isinstance(s, (list, tuple, torch.Tensor)) for s in stop_sequences):
        raise ValueError(f"stop_sequences must be a list of token-id lists, e.g. [[187, 187]], got {stop_sequences!r}")
    stops = [torch.as_tensor(s, dtype=torch.long, device=device) for s in stop_sequences]
    if any(s.dim() != 1 or s.numel() == 0 for s in stops):
        raise ValueError(f"each stop sequence must be a non-empty list of token ids, got {stop_sequences!r}")
    return stops


@torch.no_grad()
def continue_tokens(step: StepFn, logits: torch.Tensor, state, last: torch.Tensor, max_new_tokens: int,
                    temperature: float = 0.0, top_p: float = 1.0, generator=None,
                    finished: torch.Tensor | None = None) -> Iterator[tuple]:
    """Generate token by token from where a prompt left off: one step of one token per new token.

    Args:
        step: step(input_ids (B, t), state) -> (logits of the last position (B, V), state).
        logits: (B, V), what step returned for the prompt. state: the state it returned.
        last: (B,) the prompt's last ids (what a finished row repeats).
        max_new_tokens: how many tokens to produce (>= 0).
        temperature, top_p, generator: as for sample_next.
        finished: optional (B,) bool mask, read before each new token: rows where it is True repeat their last
            token instead of sampling (the caller may update it in place between tokens).

    Yields:
        (the new ids (B,) int64, the state after reading them), max_new_tokens times unless the caller stops.
    """
    check_sampling(temperature, top_p)
    for _ in range(max_new_tokens):
        nxt = sample_next(logits, temperature, top_p, generator)
        if finished is not None:
            nxt = torch.where(finished, last, nxt)
        logits, state = step(nxt[:, None], state)
        last = nxt
        yield nxt, state


@torch.no_grad()
def generate(step: StepFn, input_ids: torch.Tensor, max_new_tokens: int, state=None, temperature: float = 0.0,
             top_p: float = 1.0, stop_sequences: Sequence[Sequence[int]] = (), generator=None):
    """Continue ``input_ids`` (B, T) by up to ``max_new_tokens``: the prompt in one step, then continue_tokens.

    A row that has produced a stop sequence is finished: it is padded with its last token while other rows go on,
    and generation ends when every row is finished. The stop sequence itself is kept in the output.

    Args:
        step: step(input_ids (B, t), state) -> (logits of the last position (B, V), state).
        input_ids: (B, T) integer prompt (any integer dtype), B >= 1, T >= 1.
        max_new_tokens: how many tokens to add at most (>= 0).
        state: the state to start from (None: the model's initial state).
        temperature, top_p, generator: as for sample_next.
        stop_sequences: a list of non-empty token-id lists.

    Returns:
        (tokens (B, T + n) int64, the state after the last token).
    """
    input_ids = check_prompt(input_ids, max_new_tokens)
    check_sampling(temperature, top_p)
    stops = _check_stop_sequences(stop_sequences, input_ids.device)
    tokens, finished = input_ids, torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    logits, state = step(input_ids, state)
    for nxt, state in continue_tokens(step, logits, state, input_ids[:, -1], max_new_tokens, temperature, top_p,
                                      generator, finished):
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
        for s in stops:
            if tokens.shape[1] >= len(s):
                finished |= (tokens[:, -len(s):] == s).all(dim=1)
        if finished.all():
            break
    return tokens, state
