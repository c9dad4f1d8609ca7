"""Token-by-token generation through a recurrent state, shared by the RWKV-4, RWKV-7 and Mamba models.

The prompt is read once; every new token then costs one forward of one token through the state (never a re-read
of the prompt). Sampling: greedy (temperature 0), or temperature with nucleus (top-p) filtering.
Stop sequences end a row when its last tokens equal one of them, e.g. RWKV's "\\n\\n" = [187, 187] in the
GPT-NeoX tokenizer (https://huggingface.co/docs/transformers/model_doc/rwkv, RwkvStoppingCriteria).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

# step(tokens (B, t), state) -> (logits of the last position (B, vocab), new state)
StepFn = Callable[[torch.Tensor, object], tuple]


def sample_next(logits: torch.Tensor, temperature: float = 0.0, top_p: float = 1.0,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, V) logits -> (B,) token ids. temperature 0: argmax. Otherwise softmax(logits / temperature) restricted
    to the smallest set of tokens whose probability reaches top_p (the most likely token is always kept)."""
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got temperature={temperature}, top_p={top_p}")
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    outside = sorted_p.cumsum(-1) - sorted_p >= top_p          # mass before this token already reaches top_p
    sorted_p = sorted_p.masked_fill(outside, 0.0)
    choice = torch.multinomial(sorted_p, 1, generator=generator)  # multinomial renormalizes
    return order.gather(-1, choice).squeeze(-1)


@torch.no_grad()
def generate(step: StepFn, input_ids: torch.Tensor, max_new_tokens: int, state=None, temperature: float = 0.0,
             top_p: float = 1.0, stop_sequences: Sequence[Sequence[int]] = (), generator=None):
    """Continue ``input_ids`` (B, T) by up to ``max_new_tokens``; returns (tokens (B, T + n), state).

    A row that has produced a stop sequence is finished: it is padded with its last token while other rows go on,
    and generation ends when every row is finished. The stop sequence itself is kept in the output.
    """
    if input_ids.dim() != 2 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must have shape (B, T) with T >= 1, got {tuple(input_ids.shape)}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    stops = [torch.as_tensor(s, dtype=input_ids.dtype, device=input_ids.device) for s in stop_sequences]
    tokens, finished = input_ids, torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    logits, state = step(input_ids, state)
    for _ in range(max_new_tokens):
        nxt = torch.where(finished, tokens[:, -1], sample_next(logits, temperature, top_p, generator))
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
        logits, state = step(nxt[:, None], state)
        for s in stops:
            if tokens.shape[1] >= len(s):
                finished |= (tokens[:, -len(s):] == s).all(dim=1)
        if finished.all():
            break
    return tokens, state
