"""The battery: plan the checks of an op, run each on a function under test, and compare with the float64 truth.

A check is one case at one dtype: its inputs are drawn in float64, rounded to the dtype (the decays and
parameters an op keeps in fp32 stay fp32), and both sides see the same rounded values: the reference
(seqmix.reference, NumPy float64) for outputs and final states, the definition (the op's naive.py,
float64 torch) for gradients. The function under test gets them on the chosen device, with requires_grad when
gradients are checked; the loss is <y, gy> + <state terms, gs> with random cotangents rounded to the output's and
the state's dtype. Every compared quantity becomes one Row: its relative RMS error ||a - b|| / ||b||, its max abs
error, the budget it was judged at, and whether it passed. A check whose call raises gives one failed row.

Two grades. The default asks "is this a correct implementation of the formula?": a check is judged at the design's
budget for its dtype, or, where the op has a conditioning rule (kernels/<op>/spec.py) and the check's inputs force
a larger error on any implementation in its arithmetic, at that error. ``strict`` judges every check at the design's
budget. A row over the design's budget and within the conditioned one is marked ``conditioned``: it passes the
default grade only.
"""
from __future__ import annotations

import traceback
import zlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from ..kernels.declarations import OPS, Case, Op, call, state_tensors
from ..kernels.inputs import in_pieces, split_bounds
from ..kernels.shared import accumulation_dtype
from ..kernels.testing import BF16_BUDGET, FP16_BUDGET, REFERENCE_BUDGET, f64, max_abs, rel_rms

__all__ = ["DTYPES", "PARTS", "Options", "Check", "Row", "Report", "budget", "plan", "run_check", "run"]

DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
PARTS = ("shapes", "split", "extreme")


@dataclass(frozen=True)
class Options:
    """Which checks to run and how.

    Args:
        dtypes: input dtypes, of "fp32", "fp16", "bf16", "fp64" (fp16/bf16 run on the cases marked for them).
        device: where the function under test gets its inputs ("cpu", "cuda", ...); the truth stays on the CPU.
        grad: check the gradients of every float input and of the initial state (False for a forward-only kernel).
        state: the function takes ``state=`` (False: cases drop their initial state and the split check is left out;
            a final state the function still returns is compared).
        parts: of "shapes" (awkward shapes), "split" (a sequence fed in pieces with the state passed on),
            "extreme" (the edges of the valid inputs).
        head_sizes: the head sizes (d, C or N: the op says which) the kernel takes; each case's is replaced by the
            nearest of these. None: the op's own.
        max_len: skip cases longer than this many tokens.
        only, skip: substrings of check ids ("wkv4/shapes/T=37,B=2,C=6,state/fp32") to keep or leave out.
        seed: inputs are drawn from (seed, check id), so a check sees the same inputs whatever else runs.
        strict: judge every quantity at the design's fixed budget, also where the op's conditioning rule allows
            more at the check's inputs (the default grade).
    """
    dtypes: tuple = ("fp32", "fp16", "bf16")
    device: str = "cpu"
    grad: bool = True
    state: bool = True
    parts: tuple = PARTS
    head_sizes: tuple | None = None
    max_len: int | None = None
    only: tuple = ()
    skip: tuple = ()
    seed: int = 0
    strict: bool = False

    @classmethod
    def for_function(cls, fn, **options) -> "Options":
        """Options for ``fn``: the defaults, updated by fn's ``conformance_options`` (an adapter of a peer that takes
        no initial state sets state=False there), then by ``options``."""
        return cls(**{**getattr(fn, "conformance_options", {}), **options})

    def __post_init__(self):
        for name, given, known in (("dtypes", self.dtypes, DTYPES), ("parts", self.parts, PARTS)):
            unknown = [x for x in given if x not in known]
            if unknown:
                raise ValueError(f"{name} must be among {list(known)}, got {unknown}")
        # A head size of 0 would compare empty tensors, and a negative seed is numpy's traceback: both usage errors.
        if self.head_sizes is not None and (not self.head_sizes or min(self.head_sizes) < 1):
            raise ValueError(f"head_sizes must be >= 1, got {list(self.head_sizes)}")
        if self.max_len is not None and self.max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {self.max_len}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")


@dataclass(frozen=True)
class Check:
    op: str
    case: Case
    dtype: str

    @property
    def id(self) -> str:
        return f"{self.op}/{self.case.group}/{self.case.name}/{self.dtype}"


@dataclass
class Row:
    """One compared quantity: error and max_abs are None where nothing could be compared (message says why).
    budget: the budget it was judged at (the grade's); design_budget: the design's for its dtype; conditioned: over
    the design's budget and within the one its inputs condition (passes the default grade, fails strict)."""
    check: str
    what: str
    shape: str
    dtype: str
    error: float | None
    max_abs: float | None
    budget: float
    passed: bool
    message: str = ""
    design_budget: float | None = None
    conditioned: bool = False


@dataclass
class Report:
    op: str
    options: Options
    rows: list = field(default_factory=list)
    checks: list = field(default_factory=list)
    skipped: list = field(default_factory=list)       # (check id, reason)

    @property
    def failed_checks(self) -> list:
        """Checks with a row out of budget, and checks that compared nothing (no comparison is never a pass)."""
        compared = {row.check for row in self.rows}
        return sorted({row.check for row in self.rows if not row.passed} | (set(self.checks) - compared))

    @property
    def conditioned_rows(self) -> list:
        """The rows over the design's budget and within the one their inputs condition."""
        return [row for row in self.rows if row.conditioned]

    @property
    def ok(self) -> bool:
        return bool(self.rows) and not self.failed_checks

    def as_dict(self) -> dict:
        return dict(op=self.op, options=asdict(self.options), rows=[asdict(r) for r in self.rows],
                    skipped=[dict(check=c, reason=r) for c, r in self.skipped])


def budget(op: Op, dtype: str) -> float:
    """The design's budget: fp64 1e-12, fp32 1e-5 (1e-4 for WKV-7, whose chunked forms are allowed), fp16 5e-3,
    bf16 2e-2; gradients the same."""
    return {"fp64": REFERENCE_BUDGET, "fp32": op.fp32_budget, "fp16": FP16_BUDGET, "bf16": BF16_BUDGET}[dtype]


@dataclass(frozen=True)
class _Grade:
    """The budgets of one check: the design's, the conditioned one (>= the design's), and which one judges."""
    design: float
    conditioned: float
    strict: bool

    @property
    def limit(self) -> float:
        return self.design if self.strict else self.conditioned


def _grade(op: Op, dtype: str, tensors: dict, state, strict: bool) -> _Grade:
    """The check's budgets: the conditioned one is max(the design's, op.conditioning(inputs) times the unit roundoff of
    the arithmetic: 2^-24 for fp32, fp16 and bf16 inputs, which accumulate in fp32; 2^-53 for fp64)."""
    design = budget(op, dtype)
    if op.conditioning is None:
        return _Grade(design, design, strict)
    roundoff = torch.finfo(accumulation_dtype(DTYPES[dtype])).eps / 2
    return _Grade(design, max(design, float(roundoff * op.conditioning(tensors, state))), strict)


def _fitted(op: Op, case: Case, options: Options) -> Case:
    """The case with the nearest head size the kernel takes, and without its initial state when it takes none."""
    params = dict(case.params)
    if options.head_sizes:
        params[op.head] = min(options.head_sizes, key=lambda h: (abs(h - params[op.head]), -h))
    if not options.state:
        params.pop("state", None)
        if "extras" in params:
            params["extras"] = tuple(x for x in params["extras"] if x != "state")
    return replace(case, params=params)


def plan(op_name: str, options: Options) -> tuple[list, list]:
    """(the checks to run, the (check id, reason) of those the options leave out)."""
    op = OPS[op_name]
    cases = [c for c in op.cases if c.group in options.parts]
    if op.split is not None and "split" in options.parts and options.state:
        cases.append(op.split)
    checks, skipped, seen = [], [], set()
    for case in (_fitted(op, c, options) for c in cases):
        for dtype in options.dtypes:
            check = Check(op.name, case, dtype)
            if check.id in seen or (dtype in ("fp16", "bf16") and not case.low_precision
                                    and case.group != "split"):
                continue
            seen.add(check.id)
            if options.max_len is not None and case.params["T"] > options.max_len:
                skipped.append((check.id, f"T = {case.params['T']} > max_len = {options.max_len}"))
            elif (options.only and not any(s in check.id for s in options.only)) or any(
                    s in check.id for s in options.skip):
                skipped.append((check.id, "left out by only/skip"))
            else:
                checks.append(check)
    return checks, skipped


def _leaves(state) -> list:
    return [] if state is None else list(state) if isinstance(state, (tuple, list)) else [state]


def _state_like(leaves, template):
    """leaves shaped as the op's state: a tuple when the template (the initial state) is one."""
    return tuple(leaves) if isinstance(template, tuple) else leaves[0]


def _outputs(op: Op, out):
    """(y, final state or None): a stateful op's function may return y alone (then it has no final state)."""
    if op.stateful and isinstance(out, (tuple, list)):
        return out[0], out[1]
    return out, None


def _run(op: Op, fn, check: Check, tensors: dict, options: dict, state, seed):
    """fn on the whole sequence, or (split checks) on pieces cut at three random points (drawn from the check's
    seed: the same for every run of the check), each from the state the last returned; returns (y, final state, a
    note on how it was fed)."""
    if check.case.group != "split":
        return (*_outputs(op, call(op, fn, tensors, options, state)), "")
    bounds = split_bounds(check.case.params["T"], np.random.default_rng(seed + [2]).uniform(size=3))

    def piece(lo, hi, s):
        sliced = {n: x.narrow(op.time_axes[n], lo, hi - lo) if n in op.time_axes else x for n, x in tensors.items()}
        return _outputs(op, call(op, fn, sliced, options, s))

    ys, s = in_pieces(piece, bounds, state)
    return torch.cat(ys, op.y_time_axis), s, f"pieces {bounds}"


def _failed(check: Check, what: str, grade: _Grade, message: str, shape: str = "") -> Row:
    """A row where nothing could be compared: a failure, whatever the grade."""
    return Row(check.id, what, shape, check.dtype, None, None, grade.limit, False, message, grade.design)


def _compare(check: Check, what: str, actual, expected, grade: _Grade, note: str = "", dtype=None) -> Row:
    """One quantity against its truth; ``dtype``: the torch dtype the actual must have (None: not checked). What
    the function returned that is not an array of numbers (a str, a generator) is a failed row, not an error."""
    b = f64(expected)
    row = _failed(check, what, grade, note, str(tuple(b.shape)))
    try:
        a = f64(actual)
    except Exception as e:                   # numpy's ValueError / TypeError, or what a strange object raises
        row.message = f"not an array of numbers: the function returned a {type(actual).__name__} ({_describe(e)})"
        return row
    if a.shape != b.shape:
        row.message = f"shape {tuple(a.shape)}, expected {tuple(b.shape)}"
    elif b.size == 0:
        row.message = "nothing to compare: the quantity is empty"
    elif dtype is not None and getattr(actual, "dtype", None) != dtype:
        row.message = f"dtype {getattr(actual, 'dtype', None)}, expected {dtype} (outputs take the values' dtype)"
    elif not np.isfinite(a).all():
        row.message = f"{int(a.size - np.isfinite(a).sum())} non-finite values"
    else:
        with np.errstate(over="ignore"):                  # finite values whose difference overflows: said below
            row.error, row.max_abs = rel_rms(a, b), max_abs(a, b)
        if not np.isfinite([row.error, row.max_abs]).all():
            row.error = row.max_abs = None
            row.message = "the difference from the truth overflows float64 (the error would be inf)"
            return row
        row.passed = row.error <= grade.limit
        row.conditioned = grade.design < row.error <= grade.conditioned
        if row.conditioned:
            row.message = "; ".join(filter(None, (note, (
                f"over the design's {grade.design:.0e}, within the budget conditioned on the inputs "
                f"{grade.conditioned:.1e}" + (": passes the default grade" if grade.strict else "")))))
    return row


def _loss(op: Op, y, state, cotangents):
    """<y, gy> + <terms(state), gs>, in float64 (the state's terms only where there is a state)."""
    gy, gs = cotangents                                # on the CPU: moved to the output's device (a GPU run)
    loss = (y.double() * gy.to(y.device)).sum()
    if state is not None:
        terms = op.loss_terms(_leaves(state)) if op.loss_terms else _leaves(state)
        loss = loss + sum((t.double() * g.to(t.device)).sum() for t, g in zip(terms, gs))
    return loss


def _gradients(op: Op, fn, tensors, state, options, cotangents, check, seed, device):
    """(names, gradients of the loss) for every float tensor and the initial state's tensors; None becomes zeros.
    None when the output does not require grad."""
    leaves = {n: x.detach().to(device).requires_grad_() for n, x in tensors.items()}
    state_leaves = [s.detach().to(device).requires_grad_() for s in _leaves(state)]
    y, s, _ = _run(op, fn, check, leaves, options, None if state is None else _state_like(state_leaves, state), seed)
    if not y.requires_grad:
        return None
    inputs = list(leaves.values()) + state_leaves
    grads = torch.autograd.grad(_loss(op, y, s, cotangents), inputs, allow_unused=True)
    names = list(leaves) + [f"{n}0" if len(state_leaves) > 1 else n for n in op.state_names[:len(state_leaves)]]
    return names, [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads)]


def run_check(op_name: str, fn, check: Check, options: Options) -> list:
    """The rows of one check: y, the final state's tensors, then (options.grad) every gradient."""
    op = OPS[op_name]
    dtype = DTYPES[check.dtype]
    state_dtype = accumulation_dtype(dtype)
    seed = [options.seed, zlib.crc32(check.id.encode())]
    x = op.make(np.random.default_rng(seed), **check.case.params)
    tensors = {n: torch.tensor(a, dtype=torch.float32 if n in op.fp32_params and dtype != torch.float64 else dtype)
               for n, a in x.tensors.items()}
    state = state_tensors(x.state, state_dtype)
    exact = {n: t.double() for n, t in tensors.items()}
    exact_state = None if state is None else _state_like([s.double() for s in _leaves(state)], state)
    expected = call(op, op.reference, {n: t.numpy() for n, t in exact.items()}, x.options,
                    None if state is None else _state_like([s.numpy() for s in _leaves(exact_state)], state))
    y_ref, s_ref = _outputs(op, expected)
    grade = _grade(op, check.dtype, {n: t.numpy() for n, t in exact.items()},
                   None if state is None else [t.numpy() for t in _leaves(exact_state)], options.strict)

    with torch.no_grad():
        try:
            y, s, note = _run(op, fn, check, {n: t.to(options.device) for n, t in tensors.items()}, x.options,
                              None if state is None else _state_like([t.to(options.device) for t in _leaves(state)],
                                                                     state), seed)
        except _KERNEL_ERRORS as e:                                      # the kernel's own error is the finding
            return [_failed(check, "call", grade, _describe(e))]
    rows = [_compare(check, "y", y, y_ref, grade, note, dtype=dtype)]
    wrong_state = _state_structure(op, s, s_ref)
    if op.stateful and (s is not None or options.state):
        if s is None:
            rows.append(_failed(check, "state", grade,
                                "the function returned no final state (options.state=False if it keeps none)"))
        elif wrong_state:
            rows.append(_failed(check, "state", grade, wrong_state))
        else:
            rows += _state_rows(op, check, s, s_ref, grade, note)
    if options.grad and wrong_state:                 # the loss weighs the state's tensors: they cannot be found
        rows.append(_failed(check, "gradients", grade, wrong_state))
    elif options.grad:
        state_terms = (op.loss_terms or list)([torch.tensor(t) for t in _leaves(s_ref)]) if s is not None else []
        rows += _gradient_rows(op, fn, check, (tensors, state), (exact, exact_state), x.options,
                               (y_ref.shape, [t.shape for t in state_terms]), seed, options.device, grade)
    return rows


def _state_rows(op: Op, check: Check, state, expected, grade: _Grade, note: str) -> list:
    """The final state's tensors against the reference's (a state of strings, say, is one failed row)."""
    try:
        actual = [f64(t) for t in _leaves(state)]
    except Exception as e:
        return [_failed(check, "state", grade, f"not an array of numbers in the final state ({_describe(e)})")]
    pairs = op.compare_state(actual, _leaves(expected)) if op.compare_state else zip(op.state_names, actual,
                                                                                   _leaves(expected))
    return [_compare(check, f"state {n}" if len(_leaves(expected)) > 1 else "state", a, e, grade, note)
            for n, a, e in pairs]


def _gradient_rows(op, fn, check, inputs, exact_inputs, options, shapes, seed, device, grade):
    """The gradients of the function under test against autograd through the float64 definition, from one loss
    with random cotangents of the given shapes (y's, the state terms'), rounded to y's dtype and the state's; judged
    as the check's outputs are (``grade``)."""
    rng = np.random.default_rng(seed + [1])
    dtype = DTYPES[check.dtype]
    gy = torch.tensor(rng.standard_normal(shapes[0])).to(dtype).double()
    gs = [torch.tensor(rng.standard_normal(shape)).to(accumulation_dtype(dtype)).double() for shape in shapes[1]]
    try:
        got = _gradients(op, fn, *inputs, options, (gy, gs), check, seed, device)
    except _KERNEL_ERRORS as e:
        return [_failed(check, "gradients", grade, _describe(e))]
    if got is None:
        return [_failed(check, "gradients", grade,
                        "the output does not require grad: options.grad=False (--no-grad) for a forward-only kernel")]
    names, grads = got
    _, truth = _gradients(op, op.definition, *exact_inputs, options, (gy, gs), check, seed, "cpu")
    return [_compare(check, f"d/d{n}", g, t, grade) for n, g, t in zip(names, grads, truth)
            if n not in check.case.ungraded]


# What a kernel may raise that fails its check: any error, and sys.exit (SystemExit), which would otherwise end the
# run with the kernel's exit code and no rows ("every check passed"). KeyboardInterrupt still interrupts.
_KERNEL_ERRORS = (Exception, SystemExit)


def _state_structure(op: Op, state, expected) -> str:
    """Why a final state cannot be compared as the op's (a stacked tensor where a tuple is due), or ""."""
    if state is None or expected is None or len(_leaves(state)) == len(_leaves(expected)):
        return ""
    got = (f"one tensor of shape {tuple(state.shape)}" if torch.is_tensor(state)
           else f"{len(_leaves(state))} tensors")
    shapes = ", ".join(str(tuple(np.shape(t))) for t in _leaves(expected))
    return (f"the final state is {got}; {op.name}'s state is a tuple of {len(_leaves(expected))} tensors "
            f"({', '.join(op.state_names)}) of shapes {shapes}")


def _describe(error: BaseException) -> str:
    """The error's type and first line; where it has no message (a bare assert), the line that raised it."""
    if isinstance(error, SystemExit):
        return f"SystemExit: the function called sys.exit({error.code!r})"
    text = str(error).strip().splitlines()
    if text:
        return f"{type(error).__name__}: {text[0]}"
    frame = traceback.extract_tb(error.__traceback__)[-1]
    return f"{type(error).__name__} at {Path(frame.filename).name}:{frame.lineno}: {frame.line}"


def run(op_name: str, fn, options: Options | None = None, on_check=None) -> Report:
    """Every planned check of ``op_name`` on ``fn``; on_check(index, count, check, rows) is called before each
    (rows None) and after it (the CLI's progress bar and table).

    Args:
        op_name: one of OPS (attention, rerope_attention, rerope_decode, wkv4, wkv7, selective_scan).
        fn: a function with the signature and conventions of seqmix.kernels' op of that name (or an adapter's).
        options: Options; None: Options.for_function(fn).
    Returns:
        Report with one Row per compared quantity.
    """
    if op_name not in OPS:
        raise ValueError(f"op must be one of {sorted(OPS)}, got {op_name!r}")
    options = options or Options.for_function(fn)
    checks, skipped = plan(op_name, options)
    report = Report(op_name, options, checks=[c.id for c in checks], skipped=skipped)
    for i, check in enumerate(checks):
        if on_check is not None:
            on_check(i, len(checks), check, None)
        rows = run_check(op_name, fn, check, options)
        report.rows += rows
        if on_check is not None:
            on_check(i, len(checks), check, rows)
    return report
