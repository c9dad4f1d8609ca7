"""The check the attention and ReRoPE kernel tests share: an op's output and its gradients with respect to q, k and v
against autograd through a float64 definition (the op's naive.py)."""
import torch

from seqmix.kernels import inputs as cases
from seqmix.kernels.testing import assert_all_close, assert_close


def qkv_inputs(rng, shape, spread=1.0):
    """q, k, v: float64 tensors of standard normals times ``spread``."""
    return [torch.tensor(x) for x in cases.qkv_inputs(rng, shape, spread)]


def output_and_grads(fn, inputs, do):
    """fn(*inputs) and the gradients of <fn(*inputs), do> with respect to every input."""
    inputs = [x.detach().requires_grad_() for x in inputs]
    out = fn(*inputs)
    return out, torch.autograd.grad(out, inputs, do.to(out.dtype))


def check_qkv_op(op, definition, q, k, v, do, dtype, budget, what):
    """op on (q, k, v) cast to ``dtype`` against ``definition`` on the float64 (q, k, v): the output and dq, dk, dv
    keep the input dtype and agree within ``budget``."""
    out_e, grads_e = output_and_grads(definition, (q, k, v), do)
    out, grads = output_and_grads(op, [x.to(dtype) for x in (q, k, v)], do)
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    assert_close(out, out_e, budget, f"{what} output")
    assert_all_close(("dq", "dk", "dv"), grads, grads_e, budget, what)
