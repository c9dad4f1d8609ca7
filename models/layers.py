"""Layers the models share."""
from __future__ import annotations

import torch

__all__ = ["token_shift"]


def token_shift(x: torch.Tensor, x_prev: torch.Tensor) -> torch.Tensor:
    """x_{t-1} for every t, with x_prev (B, C) standing before x_0 (cast to x's dtype).

    Args:
        x: (B, T, C). x_prev: (B, C), the input before x_0 (the state's token-shift part).

    Returns:
        (B, T, C).
    """
    if x.shape[1] == 1:                          # decoding: nothing to concatenate
        return x_prev[:, None].to(x.dtype)
    return torch.cat([x_prev[:, None].to(x.dtype), x[:, :-1]], dim=1)
