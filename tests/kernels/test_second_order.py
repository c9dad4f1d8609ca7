"""Second-order gradients (issue 25, R2): the autograd Functions whose backward runs outside autograd (the C loops,
the Triton kernels, the hand-written torch backwards of the scan and ReRoPE's prefill) refuse create_graph=True with
a clear error, where they dropped a gradient penalty without a word; the torch backends that are plain torch ops
(WKV-4, WKV-7, ReRoPE's decode) stay twice differentiable. Triton under its interpreter, at tiny shapes."""
import pytest
import torch
import torch.nn.functional as F

from helpers.kernel_cases import needs_triton
from seqmix.kernels import native
from seqmix.kernels.attention import attention
from seqmix.kernels.rerope import rerope_attention, rerope_decode
from seqmix.kernels.ssm import selective_scan
from seqmix.kernels.testing import FP32_BUDGET, assert_close
from seqmix.kernels.wkv4 import wkv4
from seqmix.kernels.wkv7 import wkv7

needs_c = pytest.mark.skipif(not native.available(), reason="the C loops are unavailable")

# op: (its output from raw inputs, which carry no constraint, for a backend; the raw inputs' shapes)
OPS = {
    "wkv4": (lambda w, u, k, v, backend: wkv4(-torch.exp(w), u, k, v, backend=backend)[0],
             [(3,), (3,), (1, 4, 3), (1, 4, 3)]),
    "wkv7 N=8": (lambda r, w, k, v, a, b, backend: wkv7(r, -torch.exp(w), k, v, a, b, backend=backend)[0],
                 [(1, 4, 1, 8)] * 6),
    "wkv7 N=16": (lambda r, w, k, v, a, b, backend: wkv7(r, -torch.exp(w), k, v, a, b, backend=backend)[0],
                  [(1, 4, 1, 16)] * 6),                          # Triton: the chunked kernels (N >= 16)
    "selective_scan": (lambda u, d, A, B, C, backend: selective_scan(u, F.softplus(d), -torch.exp(A), B, C,
                                                                     backend=backend)[0],
                       [(1, 2, 4), (1, 2, 4), (2, 3), (1, 3, 4), (1, 3, 4)]),
    "attention": (lambda q, k, v, backend: attention(q, k, v, backend=backend), [(1, 1, 4, 16)] * 3),
    "rerope_attention": (lambda q, k, v, backend: rerope_attention(q, k, v, 2, backend=backend), [(1, 1, 4, 16)] * 3),
    "rerope_decode": (lambda q, k, v, backend: rerope_decode(q, k, v, 2, backend=backend),
                      [(1, 1, 1, 4), (1, 1, 5, 4), (1, 1, 5, 4)]),
}


def inputs(op, dtype=torch.float32):
    generator = torch.Generator().manual_seed(11)
    return [(0.5 * torch.randn(shape, generator=generator)).to(dtype).requires_grad_() for shape in OPS[op][1]]


def penalty_on_the_gradient_of_the_sum(op, backend):
    """loss + |dL/dx|^2 with L = sum(y): the incoming gradient requires none, where torch's once_differentiable
    lets the penalty vanish without an error."""
    x = inputs(op)
    y = OPS[op][0](*x, backend)
    grads = torch.autograd.grad(y.sum(), x, create_graph=True)
    (y.square().sum() + sum(g.square().sum() for g in grads)).backward()


def gradient_of_a_penalty(op, backend):
    x = inputs(op)
    grads = torch.autograd.grad(OPS[op][0](*x, backend).square().sum(), x, create_graph=True)
    torch.autograd.grad(sum(g.square().sum() for g in grads), x)


FIRST_ORDER = ([pytest.param(op, "c", marks=needs_c) for op in ("wkv4", "wkv7 N=8", "selective_scan")]
               + [pytest.param(op, "triton", marks=needs_triton)
                  for op in ("wkv4", "wkv7 N=8", "wkv7 N=16", "selective_scan", "attention", "rerope_attention")]
               + [("selective_scan", "torch"), ("rerope_attention", "torch")])


@pytest.mark.parametrize("use", [penalty_on_the_gradient_of_the_sum, gradient_of_a_penalty])
@pytest.mark.parametrize("op, backend", FIRST_ORDER)
def test_second_order_use_is_refused(op, backend, use):
    with pytest.raises(RuntimeError, match="has no second-order gradients"):
        use(op, backend)


@pytest.mark.parametrize("use", [penalty_on_the_gradient_of_the_sum, gradient_of_a_penalty])
def test_attention_on_the_torch_backend_refuses_too(use):
    """aten's flash attention, which the torch backend calls, has no double backward: torch raises."""
    with pytest.raises(RuntimeError, match="not implemented"):
        use("attention", "torch")


# wkv7 at N = 8 twice differentiated takes 30 s on a quiet 2-core machine: the full tier only
@pytest.mark.parametrize("op", ["wkv4", pytest.param("wkv7 N=8", marks=pytest.mark.slow), "rerope_decode"])
def test_torch_backends_are_twice_differentiable(op):
    """Against finite differences of the first-order gradients, in float64."""
    f = OPS[op][0]
    assert torch.autograd.gradgradcheck(lambda *x: f(*x, "torch"), inputs(op, torch.float64))


@pytest.mark.parametrize("op, backend", [pytest.param("wkv4", "c", marks=needs_c),
                                         pytest.param("wkv4", "triton", marks=needs_triton)])
def test_first_order_gradients_still_flow(op, backend):
    """The refusal is for create_graph=True only: plain backward through the same Functions still gives the float64
    torch backend's gradients."""
    grads = []
    for b, dtype in ((backend, torch.float32), ("torch", torch.float64)):
        x = inputs(op, dtype)
        OPS[op][0](*x, b).square().sum().backward()
        grads.append(torch.cat([t.grad.flatten() for t in x]).double())
    assert_close(*grads, FP32_BUDGET, f"{op} gradients on {backend}")
