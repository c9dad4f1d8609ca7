"""Layers the models share."""
from __future__ import annotations

import torch

__all__ = ["Linear", "token_shift"]


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


class Linear(torch.nn.Linear):
    """torch.nn.Linear (the same parameters and names) that computes a single row of input, a decoding step of one
    sequence, as a matrix-vector product on a CPU: torch.mv reads the weight once at the memory's speed, where
    F.linear's product of a one-row matrix is slower (bf16: 1.4x-1.75x slower at RWKV-4 169M's matrices and head,
    fp32: about 5%, measured with one thread), and decoding is reading the weights.

    Args:
        in_features, out_features, bias, device, dtype: as torch.nn.Linear's.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() != self.in_features or x.device.type != "cpu":
            return super().forward(x)
        y = torch.mv(self.weight, x.reshape(-1))                                   # (out_features,)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)
