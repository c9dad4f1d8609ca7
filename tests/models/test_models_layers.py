"""models/layers.py: the Linear whose one-row (decoding) input goes through torch.mv."""
import pytest
import torch
import torch.nn.functional as F

from seqmix.kernels.testing import BF16_BUDGET, FP32_BUDGET, assert_close
from seqmix.models.layers import Linear

BUDGET = {torch.float32: FP32_BUDGET, torch.bfloat16: BF16_BUDGET}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 24), (1, 24), (24,), (2, 1, 24), (1, 3, 24)])
def test_linear_equals_f_linear(dtype, bias, shape):
    """Every input shape (one row: the matrix-vector product; more: F.linear) against F.linear in float64, and the
    gradients of x, the weight and the bias through the one-row path."""
    torch.manual_seed(0)
    layer = Linear(24, 40, bias=bias).to(dtype)
    x = torch.randn(shape).to(dtype).requires_grad_()
    y = layer(x)
    assert y.shape == (*shape[:-1], 40) and y.dtype == dtype
    params = [layer.weight] + ([layer.bias] if bias else [])
    truth = F.linear(x.double(), *(p.double() for p in params))
    assert_close(y, truth, BUDGET[dtype], "y")
    dy = torch.randn_like(truth)
    grads = torch.autograd.grad((y.double() * dy).sum(), [x, *params])
    truths = torch.autograd.grad((truth * dy).sum(), [x, *params])
    for name, g, t in zip(("x", "weight", "bias"), grads, truths):
        assert_close(g, t, BUDGET[dtype], f"d{name}")
