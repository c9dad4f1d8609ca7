"""Layers the models share."""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["Linear", "linear", "token_shift"]


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


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, but a single row of input (a decoding step of one sequence) on a CPU goes through torch.mv: it reads
    the weight once at the memory's speed, where F.linear's product of a one-row matrix is slower (bf16: 1.4x-1.75x
    at RWKV-4 169M's matrices and head, fp32: about 5%, one thread), and decoding is reading the weights.

    Args:
        x: (..., in_features). weight: (out_features, in_features). bias: (out_features,) or None.

    Returns:
        (..., out_features).
    """
    if x.numel() != weight.shape[1] or x.device.type != "cpu":
        return F.linear(x, weight, bias)
    y = torch.mv(weight, x.reshape(-1))                                            # (out_features,)
    if bias is not None:
        y = y + bias
    return y.view(*x.shape[:-1], weight.shape[0])


class Linear(torch.nn.Linear):
    """torch.nn.Linear (the same parameters and names) computed by ``linear``: torch.mv for a decoding step.

    Args:
        in_features, out_features, bias, device, dtype: as torch.nn.Linear's.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
