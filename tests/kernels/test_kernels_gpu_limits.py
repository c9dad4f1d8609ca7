"""What the interpreter cannot see of a real GPU, checked on a CPU: the launch grids every Triton wrapper computes fit
CUDA's limits at the documented shapes (B H on grid axis 0, up to 2^31 - 1; axes 1 and 2 at most 65,535); the
backward kernels' gradients do not depend on the order the programs run in (no atomic sums: a GPU runs programs in
any order, the interpreter one after another, so the tests run them backwards too); and the wrappers never wait on
the device (no .item(), .cpu(), .tolist() or bool() of a tensor: each is a host sync, which CUDA-graph capture
refuses). The PTX side (no atomics, barriers, 64-bit offsets) is in test_aot.py."""
import functools

import numpy as np
import pytest
import torch

from helpers.kernel_cases import needs_triton
from seqmix.kernels.attention import attention
from seqmix.kernels.rerope import rerope_attention, rerope_decode
from seqmix.kernels.ssm import selective_scan
from seqmix.kernels.wkv4 import wkv4
from seqmix.kernels.wkv7 import wkv7
from seqmix.kernels.declarations import state_tensors
from seqmix.kernels.declarations import call
from seqmix.kernels.registry import REGISTRY
from seqmix.kernels.testing import HAS_TRITON, values_as_on_a_gpu

pytestmark = needs_triton

GRID_AXIS_LIMITS = (2**31 - 1, 65535, 65535)   # CUDA's maximum grid size per axis


def _kernel_modules():
    """The modules that hold the ops' Triton kernels: those the registry names for the AOT build and every module of
    seqmix.kernels they import (wkv7's chunked kernels live in modules of their own, imported by its launchers)."""
    import importlib
    import sys
    for name in (m for op in REGISTRY for m in op.aot_modules):
        importlib.import_module(name)
    return [module for name, module in list(sys.modules.items())
            if name.startswith("seqmix.kernels.") and module is not None
            and any(attr.endswith("_kernel") and hasattr(getattr(module, attr), "fn") for attr in dir(module))]


@pytest.fixture
def launches(monkeypatch):
    """Every Triton kernel of the op modules replaced by a recorder of its launch grids that runs nothing: the
    shapes below are too large for the interpreter, and only the grids are checked."""
    grids = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            grids.append((self.name, tuple(grid)))
            return lambda *args, **kwargs: None

    for module in _kernel_modules():
        for name in dir(module):
            if name.endswith("_kernel") and hasattr(getattr(module, name), "fn"):
                monkeypatch.setattr(module, name, Recorder(name))
    return grids


def _inputs(*shapes):
    torch.manual_seed(0)
    return [(torch.rand(shape) * 0.5 - 0.5).requires_grad_() for shape in shapes]


# Each op at a shape whose batch * heads (or batch) passes 65,535: decode at B = 2048, H = 32 is the review's case.
BIG = {
    "attention": lambda: attention(*_inputs(*[(2048, 32, 1, 16)] * 3), backend="triton"),
    "rerope_attention": lambda: rerope_attention(*_inputs(*[(2048, 32, 1, 16)] * 3), 4, backend="triton"),
    "rerope_decode": lambda: rerope_decode(*_inputs((2048, 32, 1, 16), (2048, 32, 3, 16), (2048, 32, 3, 16)), 2,
                                           backend="triton"),
    "wkv4": lambda: wkv4(*_inputs((4,), (4,), (70000, 1, 4), (70000, 1, 4)), backend="triton")[0],
    "wkv7": lambda: wkv7(*_inputs(*[(2048, 1, 32, 4)] * 6), backend="triton")[0],
    "wkv7 chunked": lambda: wkv7(*_inputs(*[(2048, 33, 32, 16)] * 6), backend="triton", chunked=True)[0],
    "selective_scan": lambda: selective_scan(*_inputs((70000, 2, 1), (70000, 2, 1), (2, 2), (70000, 2, 1),
                                                      (70000, 2, 1)), delta_softplus=True, backend="triton"),
}


@pytest.mark.parametrize("op", BIG)
def test_launch_grids_fit_cuda_limits(launches, op):
    out = BIG[op]()
    out[0].sum().backward() if isinstance(out, tuple) else out.sum().backward()
    assert launches, f"{op} launched no Triton kernel"
    kernels = {name for name, _ in launches}
    assert any("bwd" in name for name in kernels), f"{op}: the backward launched nothing: {kernels}"
    for name, grid in launches:
        assert len(grid) <= 3 and all(1 <= n <= limit for n, limit in zip(grid, GRID_AXIS_LIMITS)), \
            f"{op}: {name} launched on grid {grid}, beyond CUDA's limits {GRID_AXIS_LIMITS}"


@pytest.fixture
def programs_backwards(monkeypatch):
    """The interpreter runs the programs of each launch in reverse order (last program first)."""
    from triton.runtime.interpreter import interpreter_builder
    forward = type(interpreter_builder).set_grid_idx

    def backwards(self, x, y, z):
        nx, ny, nz = self.grid_dim
        forward(self, nx - 1 - x, ny - 1 - y, nz - 1 - z)

    monkeypatch.setattr(type(interpreter_builder), "set_grid_idx", backwards)


def _wkv7_grads(chunked=False):
    rng = np.random.default_rng(7)
    x = [torch.tensor(rng.standard_normal((1, 5, 1, 64)), dtype=torch.float32) for _ in range(6)]
    x[1] = -torch.exp(x[1]) * 0.3                     # log decay <= 0
    x = [z.requires_grad_() for z in x]
    y, S = wkv7(*x, backend="triton", chunked=chunked)
    (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().add_((S * S).sum()).backward()
    return [z.grad for z in x]


def _scan_grads():
    rng = np.random.default_rng(8)
    u, delta, B, C = (torch.tensor(rng.standard_normal(s), dtype=torch.float32).requires_grad_()
                      for s in ((1, 64, 7), (1, 64, 7), (1, 16, 7), (1, 16, 7)))
    A = torch.tensor(-np.exp(rng.standard_normal((64, 16))), dtype=torch.float32).requires_grad_()
    y, _ = selective_scan(u, delta, A, B, C, delta_softplus=True, backend="triton")
    (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
    return [z.grad for z in (u, delta, A, B, C)]


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("grads", [_wkv7_grads, functools.partial(_wkv7_grads, chunked=True), _scan_grads],
                         ids=["wkv7", "wkv7 chunked", "selective_scan"])
def test_gradients_do_not_depend_on_program_order(request, grads):
    """Four programs share each key gradient (wkv7: N = 64 in row blocks of 16; the scan: D = 64 in channel blocks of
    16): summed atomically, their order would show in the last bits."""
    first, again = grads(), grads()
    request.getfixturevalue("programs_backwards")
    backwards = grads()
    for i, (a, b, c) in enumerate(zip(first, again, backwards)):
        assert torch.equal(a, b), f"gradient {i} differs between two runs"
        assert torch.equal(a, c), f"gradient {i} differs when the programs run in reverse order"


SYNCS = ("item", "cpu", "tolist", "numpy", "__bool__", "__int__", "__float__")   # each waits for the device


@pytest.fixture
def no_host_syncs(monkeypatch):
    """The wrappers' own code (not the kernels, which the interpreter runs on the host) may not read a tensor's
    values on the host; tensors are treated as a GPU's (kernels.testing.values_as_on_a_gpu). Yields a context
    manager under which making a tensor from host data (torch.tensor(list), x[[0, 2]]: aten.lift_fresh) fails too:
    on a GPU that tensor's copy from pageable memory waits for the device (the first GPU run found one in WKV-7's
    backward, once per call)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from triton.runtime.interpreter import GridExecutor
    armed = [True]

    class NoTensorsFromHost(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if armed[0] and func is torch.ops.aten.lift_fresh.default:
                raise AssertionError("a tensor made from host data in a wrapper: a host sync on a GPU")
            return func(*args, **(kwargs or {}))

    def raiser(name):
        original = getattr(torch.Tensor, name)

        def sync(self, *args, **kwargs):
            if armed[0]:
                raise AssertionError(f"Tensor.{name}() in a wrapper: a host sync on a GPU")
            return original(self, *args, **kwargs)
        return sync

    launch = GridExecutor.__call__

    def unarmed(self, *args, **kwargs):
        """A kernel launch, with the syncs allowed: the interpreter reads its tensors on the host."""
        armed[0] = False
        try:
            return launch(self, *args, **kwargs)
        finally:
            armed[0] = True

    monkeypatch.setattr(GridExecutor, "__call__", unarmed)
    for name in SYNCS:
        monkeypatch.setattr(torch.Tensor, name, raiser(name))
    with values_as_on_a_gpu():
        yield NoTensorsFromHost         # with no_host_syncs(): ...
    armed[0] = False


def _small(*shapes):
    torch.manual_seed(1)
    return [(torch.rand(shape) - 0.5).requires_grad_() for shape in shapes]


# Every op on each of its Triton backends, at its battery's tiny sizes with head size 16 (the chunked kernels' least).
NO_SYNC_CALLS = [pytest.param(op, backend.name, id=f"{op.name}-{backend.name}") for op in REGISTRY
                 for backend in op.get("backends") if backend.name.startswith("triton")]


@pytest.mark.parametrize("op, backend", NO_SYNC_CALLS)
def test_wrappers_do_not_wait_on_the_device(no_host_syncs, op, backend):
    """Forward and backward: no .item(), .cpu(), bool(tensor), ..., no tensor made from host data, in the wrappers
    (wkv4's decay check is a device-side assert on a GPU; wkv7's chunked forward picks each chunk's form in the
    kernel)."""
    battery = op.get("battery")
    x = battery.make(np.random.default_rng(1), T=3, **{**battery.tiny, battery.head: 16})
    tensors = {n: torch.tensor(a, dtype=torch.float32).requires_grad_() for n, a in x.tensors.items()}
    states = state_tensors(x.state, torch.float32)
    with no_host_syncs():
        out = call(battery, op.function, tensors, {**x.options, "backend": backend}, states)
        (out[0] if battery.stateful else out).sum().backward()
