"""The small functions the three reference models share: activations, the layer norm and the token shift.

One home for them, imported by rwkv4.py, rwkv7.py and mamba.py (each model already imports its op's file, so a model
is never a one-file copy). The op files keep their own one-line activations instead (ssm.py's softplus and silu), so
that each of them still runs copied alone. NumPy only; float64 throughout.
"""
import numpy as np

__all__ = ["softplus", "sigmoid", "silu", "layer_norm", "token_shift"]


def softplus(x):
    """softplus(x) = log(1 + e^x), elementwise, without overflow.

    Args:
        x (array): any shape.
    Returns:
        array: x's shape.
    """
    return np.logaddexp(0.0, x)


def sigmoid(x):
    """sigmoid(x) = 1 / (1 + e^{-x}) = e^{-softplus(-x)}, elementwise: softplus never overflows and keeps full
    relative precision for large negative x.

    Args:
        x (array): any shape.
    Returns:
        array: x's shape.
    """
    return np.exp(-softplus(-x))


def silu(x):
    """silu(x) = x sigmoid(x), elementwise (Mamba's activation).

    Args:
        x (array): any shape.
    Returns:
        array: x's shape.
    """
    return x * sigmoid(x)


def layer_norm(x, weight, bias, *, eps=1e-5):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis (torch.nn.LayerNorm).

    Args:
        x (array): (..., C).
        weight, bias (array): (C,).
        eps (float): added to the variance (RWKV-4 reads it from the config; RWKV-7 uses 1e-5). Default: 1e-5.
    Returns:
        array: x's shape.
    """
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def token_shift(x, x_prev):
    """xx_t = x_{t-1}, with x_{-1} = x_prev: the sequence shifted one step in time (RWKV's time shift).

    Args:
        x (array): (B, T, C).
        x_prev (array): (B, C), the input of the token before the first one.
    Returns:
        array: (B, T, C).
    """
    return np.concatenate([x_prev[:, None], x[:, :-1]], axis=1)
