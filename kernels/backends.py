"""Which backend runs a call: the one dispatcher.

A backend is an object that says whether it can take a call: ``verify(call)`` returns None, or the reason it
cannot (a ``Refusal``, worded to follow ``backend='name' ``), as flash-linear-attention's ``BaseBackend.verify``
does. Each op has an ordered tuple of backends, with its limits, in its package (kernels/<op>/spec.py;
``BACKENDS`` reads each op's through kernels/registry.py);
``dispatch`` is the only place that chooses:

* ``backend=None``: the first backend, in the op's order, whose ``verify_auto`` accepts the call. ``verify_auto``
  is ``verify`` plus what backend=None does not pick on its own: the Triton kernels run on CPU tensors only under
  the interpreter, a test tool, so None picks them for CUDA tensors only.
* ``backend="name"``: that backend, or an error that names the argument and gives the backend's reason
  (``backend='c' takes head sizes N <= 256, got N = 272``). A refusal of the shape is a ValueError, of the dtype
  a TypeError, of what is installed here (triton, the interpreter, a C compiler) a RuntimeError. Nothing falls back
  in silence.

``describe(op)`` words the order for the docstrings, which tests/kernels/test_backends.py checks against it. The models'
one-call C paths (models/decode.py) are backends of the same kind, chosen by the same ``dispatch``.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from . import native, registry
from ._common import FLOAT_DTYPES, HAS_TRITON, TORCH_DTYPES

__all__ = ["Call", "Refusal", "WrongDtype", "Unavailable", "Backend", "Torch", "Triton", "CLoops", "RECURRENCES",
           "BACKENDS", "NAMES", "dispatch", "default_backend", "deprecated_chunked", "describe",
           "refusals"]


@dataclass(frozen=True)
class Call:
    """What a backend needs to know of a call to say whether it takes it.

    op: the op's name (a key of BACKENDS, or a models/decode.py path); device and dtype: the inputs' (the values'
    dtype where decays may stay fp32); facts: the sizes and properties a backend's limits read (WKV-7's head size
    "N", the flash kernels' head dim "d", a model's weights' dtypes, ...); grad: whether a gradient is wanted;
    asked: the backend argument the caller was given (models pass theirs to the ops)."""
    op: str
    device: torch.device
    dtype: torch.dtype = torch.float32
    facts: dict = field(default_factory=dict)
    grad: bool = False
    asked: str | None = None


class Refusal(str):
    """Why a backend cannot take a call: a sentence that follows ``backend='name' ``, and the error it becomes when
    that backend was asked for by name."""
    error = ValueError


class WrongDtype(Refusal):
    error = TypeError


class Unavailable(Refusal):
    """What is missing here (triton, the interpreter, the C library), not in the call."""
    error = RuntimeError


class Backend:
    """A backend of one or more ops. ``name``: what ``backend=`` says; ``dtypes``: the input dtypes it takes;
    ``when``: how docstrings word where backend=None takes it; ``limit(call)``: the op's shape limit (None: none),
    a reason or None."""
    name = ""
    dtypes: tuple = FLOAT_DTYPES
    when = ""

    def __init__(self, limit=None, when: str | None = None):
        self.limit = limit
        if when is not None:
            self.when = when

    def verify(self, call: Call) -> Refusal | None:
        """None when this backend takes ``call`` asked for by name, else why not."""
        return self._dtype(call) or self._limit(call)

    def verify_auto(self, call: Call) -> Refusal | None:
        """None when backend=None may pick this backend for ``call``, else why not."""
        return self.verify(call)

    def _dtype(self, call):
        if call.dtype not in self.dtypes:
            return WrongDtype(f"takes dtypes {[str(d) for d in self.dtypes]}, got {call.dtype}")
        return None

    def _limit(self, call):
        reason = self.limit(call) if self.limit else None
        return Refusal(reason) if reason else None

    def __repr__(self):
        return f"<backend {self.name!r}>"


class Torch(Backend):
    """The torch path: every device and float dtype, float64 included (gradcheck)."""
    name = "torch"
    dtypes = TORCH_DTYPES
    when = "any other call"


class Triton(Backend):
    """The Triton kernels: CUDA tensors, or CPU tensors under the interpreter (TRITON_INTERPRET=1) when asked for by
    name."""
    name = "triton"
    when = "CUDA tensors"

    def __init__(self, limit=None, when=None, name="triton"):
        super().__init__(limit, when)
        self.name = name

    def verify(self, call):
        if not HAS_TRITON:
            return Unavailable("needs the triton package (pip install triton; Linux x86_64 only)")
        if call.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            return Unavailable("with CPU tensors runs under the Triton interpreter: set the environment variable "
                               "TRITON_INTERPRET=1 before triton is first imported (before importing kernels), or "
                               "pass CUDA tensors")
        return self._dtype(call) or self._limit(call)

    def verify_auto(self, call):
        if call.device.type != "cuda":
            return Refusal(f"is picked by backend=None for CUDA tensors only, got {call.device} (on CPU tensors it "
                           f"runs under the Triton interpreter when asked for by name)")
        return self.verify(call)


class CLoops(Backend):
    """The C loops of an op (kernels/<op>/<op>.c, built by kernels/native.py; CPU, forward and backward, with or
    without gradients)."""
    name = "c"
    when = "CPU tensors in fp32, fp16 or bf16 where the C loops build"

    def verify(self, call):
        if call.device.type != "cpu":
            return Refusal(f"takes CPU tensors, got {call.device}")
        if limited := self._limit(call):
            return limited
        if native.unavailable_reason():
            return Unavailable(f"is not available here: {native.unavailable_reason()}")
        return self._dtype(call)

    def verify_auto(self, call):
        if call.device.type != "cpu":
            return Refusal(f"takes CPU tensors, got {call.device}")
        if reason := self._dtype(call) or self._limit(call):
            return reason
        if not native.available():       # says once why not (a RuntimeWarning)
            return Unavailable(f"is not available here: {native.unavailable_reason()}")
        return None


# The backends of a recurrence with a Triton kernel and C loops and no limits of its own, in the order backend=None
# tries them (the first that takes the call runs it). An op with limits builds its own tuple in its spec.py
# (kernels/wkv7/spec.py); the flash ops' tuple is kernels/_flash.py's FLASH.
RECURRENCES = (Triton(), CLoops(), Torch())


BACKENDS: Mapping[str, tuple[Backend, ...]] = registry.view("backends")
NAMES = ("torch", "triton", "triton_chunked", "triton_merged", "c")


def dispatch(call: Call, backend: str | None = None, backends: tuple[Backend, ...] | None = None) -> str:
    """The name of the backend that runs ``call``.

    Args:
        call: the call (its op names its backends in BACKENDS, unless ``backends`` is given).
        backend: None (the first in order that takes the call) or a name of NAMES.
        backends: the candidates in order, for a path outside BACKENDS (models/decode.py's).
    Returns:
        the backend's name.
    Raises:
        ValueError: an unknown name, a backend the op does not have, or a refusal of the call's shape or device;
        TypeError: a refusal of its dtype; RuntimeError: a backend not available here. Each names the argument and
        gives the reason.
    """
    candidates = BACKENDS[call.op] if backends is None else backends
    if backend is None:
        reasons = []
        for b in candidates:
            reason = b.verify_auto(call)
            if reason is None:
                return b.name
            reasons.append(reason)
        # The last candidate is the most permissive (torch): its reason is the one to fix (a dtype no backend takes),
        # so it leads and gives the error's class; the others follow.
        others = "; ".join(f"{b.name!r} {r}" for b, r in zip(candidates[:-1], reasons[:-1]))
        raise reasons[-1].error(f"no backend of {call.op} takes this call: {candidates[-1].name!r} {reasons[-1]}"
                                + (f" (and {others})" if others else ""))
    if backend not in NAMES:
        raise ValueError(f"backend must be one of {NAMES} or None, got {backend!r}")
    chosen = next((b for b in candidates if b.name == backend), None)
    if chosen is None:
        having = [op for op, bs in BACKENDS.items() if any(b.name == backend for b in bs)]
        raise ValueError(f"backend={backend!r} exists for {', '.join(having)} only, not {call.op}")
    reason = chosen.verify(call)
    if reason is not None:
        raise reason.error(f"backend={backend!r} {reason}")
    return backend


def default_backend(op: str, device, dtype: torch.dtype = torch.float32, **facts) -> str:
    """The backend that backend=None picks for a call of ``op`` on ``device`` (for benchmarks and reports).

    Args:
        op: a key of BACKENDS. device: a torch.device or its name. dtype: the inputs' dtype.
        facts: the call's sizes (N, d); a limit whose size is not given is taken as met.
    Returns:
        the backend's name.
    """
    return dispatch(Call(op, torch.device(device), dtype, facts))


def deprecated_chunked(call: Call, backend: str) -> str:
    """wkv7's ``chunked=True`` (deprecated): where the dispatcher chose "triton", "triton_chunked" if it takes the
    call, as the flag did (smaller heads kept the sequential kernel). Goes with the flag.

    Args:
        call: the wkv7 call. backend: the dispatcher's choice.
    Returns:
        the backend's name.
    """
    if backend == "triton" and _backend(call.op, "triton_chunked").verify(call) is None:
        return "triton_chunked"
    return backend


def _backend(op: str, name: str) -> Backend:
    return next(b for b in BACKENDS[op] if b.name == name)


def refusals(call: Call, backends: tuple[Backend, ...] | None = None) -> dict:
    """What each backend of the call's op says of it, as backend=None reads them (for a reader who wants to know why
    a call runs where it does).

    Args:
        call: the call. backends: the candidates, for a path outside BACKENDS.
    Returns:
        {name: None or the reason}, in the order backend=None tries them.
    """
    return {b.name: b.verify_auto(call) for b in (BACKENDS[call.op] if backends is None else backends)}


def describe(op: str, backends: tuple[Backend, ...] | None = None,
             lead: str = "None runs the first that takes the call") -> str:
    """The sentence that docstrings carry for ``op`` (tests/kernels/test_backends.py checks each): the order
    backend=None
    tries.

    Args:
        op: a key of BACKENDS. backends: the candidates, for a path outside BACKENDS. lead: the sentence's opening.
    Returns:
        '<lead>, in this order: "name" (when), ..., "torch" (any other call).'
    """
    candidates = BACKENDS[op] if backends is None else backends
    return (f"{lead}, in this order: "
            + ", ".join(f'"{b.name}" ({b.when})' for b in candidates) + ".")

