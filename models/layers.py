"""Layers the models share."""
from __future__ import annotations

import torch

__all__ = ["token_shift"]


def token_shift(x: torch.Tensor, x_prev: torch.Tensor) -> torch.Tensor:
    """x_{t-1} for every t, with x_prev (B, C) standing before x_0 (cast to x's dtype). x: (B, T, C)."""
    return torch.cat([x_prev[:, None].to(x.dtype), x[:, :-1]], dim=1)
