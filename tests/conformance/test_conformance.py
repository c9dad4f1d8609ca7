"""seqmix.conformance on our own kernels: every backend passes, in the strict grade (the design's fixed budgets, with
no allowance for ill-conditioned inputs), deliberately broken variants are rejected where (and
only where) the breakage shows, and the entry points behave as documented: the plan's options, pytest_cases, the
CLI's table, exit codes and JSON report (validated against conformance/report.schema.json)."""
import inspect
import json
import subprocess
import sys
from functools import partial
from pathlib import Path

import jsonschema
import pytest
import torch

from helpers.kernel_cases import needs_triton
from seqmix.conformance import PARTS, Check, Options, Report, plan, pytest_cases, run, run_check
from seqmix.conformance.__main__ import main as cli_main
from seqmix.kernels.declarations import OPS, Case
from seqmix.conformance.report import progress
from seqmix.kernels import native
from seqmix.kernels.attention import attention
from seqmix.kernels.registry import REGISTRY
from seqmix.kernels.rerope import rerope_attention
from seqmix.kernels.ssm import selective_scan
from seqmix.kernels.wkv4 import wkv4
from seqmix.kernels.wkv7 import wkv7

ROOT = Path(__file__).resolve().parents[2]
OURS = {op.name: op.function for op in REGISTRY}
DEFINITIONS = {op.name: op.get("naive") for op in REGISTRY}
WITH_C_LOOPS = [op.name for op in REGISTRY if op.c_entries]
WITH_TRITON = [op.name for op in REGISTRY if any(b.name == "triton" for b in op.get("backends"))]
FLASH_OPS = [op.name for op in REGISTRY if op.family == "attention"]


def failures(report) -> dict:
    """group/case/dtype -> the names of the rows out of budget."""
    out = {}
    for row in report.rows:
        if not row.passed:
            out.setdefault(row.check.split("/", 1)[1], []).append(row.what)
    return out


def assert_ok(report):
    assert report.rows and report.ok, failures(report)


@pytest.mark.parametrize("op", list(OPS))
def test_definitions_compute_the_references(op):
    """The gradients' yardstick is the references' function: run as a kernel in float64, within 1e-12."""
    assert_ok(run(op, DEFINITIONS[op], Options(dtypes=("fp64",), grad=False, strict=True)))


@pytest.mark.parametrize("op", list(OPS))
def test_torch_backend_conforms(op):
    """Every check at fp32, fp16 and bf16, with gradients (float64 to 1e-12 is each kernel test's)."""
    assert_ok(run(op, partial(OURS[op], backend="torch"), Options(strict=True)))


@pytest.mark.skipif(bool(native.unavailable_reason()), reason="the C loops did not build here")
@pytest.mark.parametrize("op", WITH_C_LOOPS)
def test_c_loops_conform(op):
    """Every check at fp32, fp16 and bf16, with gradients (the C loops have a backward)."""
    assert_ok(run(op, partial(OURS[op], backend="c"), Options(strict=True)))


# The Triton interpreter runs a program step by step: tiny shapes only (each op's Op.interpreter), head size 16 (its
# kernels' smallest tile).
@needs_triton
@pytest.mark.parametrize("op", WITH_TRITON)
def test_triton_backend_conforms_on_tiny_shapes(op):
    options = Options(dtypes=("fp32", "fp16"), head_sizes=(16,), strict=True, **OPS[op].interpreter)
    report = run(op, partial(OURS[op], backend="triton"), options)
    assert len(report.checks) >= 3
    assert_ok(report)


@needs_triton
@pytest.mark.parametrize("op", FLASH_OPS)
def test_triton_flash_kernels_conform_at_saturated_scores(op):
    """The battery's scores~200 case (T = 23 or 30), past the tiny shapes above, in fp32. The first GPU run found the
    ReRoPE kernels' d/dv 4-6e-5 there (the design's budget 1e-5), the interpreter the same: their backward rebuilt the
    rotated, log-n-scaled operands in torch, an ulp off the forward's, so P = e^{S - LSE} lost the forward's
    normalization at scores near 500. The fix recomputes the forward's scores to the bit, which holds where a dot's
    element does not depend on the tile's shape, as on a GPU (an FMA chain in k order). The interpreter's NumPy
    matmul is the BLAS's and need not: on an AVX2-only CPU (OpenBLAS's Haswell kernel) the dkdv kernel's 32 x 16
    tiles rounded scores otherwise than the forward's 16 x 32 and d/dv came to 2.0e-5, 6e-7 with the forward's tiles
    or with GPU-like dots. So the kernels run here with a GPU's dots (gpu_like_dots), then with its exp and division
    as well (gpu_like_math)."""
    from seqmix.kernels.testing import gpu_like_dots, gpu_like_math
    options = Options(dtypes=("fp32",), head_sizes=(16,), parts=("extreme",), only=("scores~200",), strict=True)
    for gpu_like in (gpu_like_dots, gpu_like_math):
        with gpu_like():
            assert_ok(run(op, partial(OURS[op], backend="triton"), options))


# ----------------------------------------------------------------------------------------------------------------
# Broken variants of our kernels: each must be rejected exactly where its breakage shows
# ----------------------------------------------------------------------------------------------------------------

def wkv4_decays_one_step_too_many(w, u, k, v, state=None):
    """Past token i weighs e^{(t-i) w + k_i} instead of e^{(t-1-i) w + k_i} (u, k shifted: the bonus stays right)."""
    return wkv4(w, u - w, k + w, v, state=state, backend="torch")


def wkv7_decays_by_the_previous_token(r, log_w, k, v, a, b, state=None):
    """Step t multiplies the state by token t-1's decay (an index off by one)."""
    return wkv7(r, torch.cat([log_w[:, :1], log_w[:, :-1]], 1), k, v, a, b, state=state, backend="torch")


def wkv7_drops_the_state_gradient(r, log_w, k, v, a, b, state=None):
    """Right values, but no gradient flows into the state passed in."""
    return wkv7(r, log_w, k, v, a, b, state=None if state is None else state.detach(), backend="torch")


def scan_drops_the_skip_gradient(u, delta, A, B, C, D=None, **options):
    """Right values, but the D u term has no gradient with respect to D."""
    return selective_scan(u, delta, A, B, C, D=None if D is None else D.detach(), **options, backend="torch")


def scan_forgets_the_state(u, delta, A, B, C, state=None, **options):
    """Takes state= and ignores it: every call starts from zeros."""
    return selective_scan(u, delta, A, B, C, **options, backend="torch")


def attention_scaled_by_one_over_d(q, k, v, causal=True, scale=None):
    """The default scale 1/d instead of 1/sqrt(d)."""
    return attention(q, k, v, causal=causal, scale=1 / q.shape[-1] if scale is None else scale, backend="torch")


def rerope_window_one_too_wide(q, k, v, window, **options):
    return rerope_attention(q, k, v, window=window + 1, **options, backend="torch")


# (op, broken function, the cases it still passes, the only rows that may fail (None: any)); WKV-7's per-token
# definition is the slowest truth, so its variants run without the extreme cases.
BROKEN = {
    "decay one step late (WKV-4)": ("wkv4", wkv4_decays_one_step_too_many, [], None),
    "decay off by one token (WKV-7)": ("wkv7", wkv7_decays_by_the_previous_token, ["shapes/T=1,N=16"], None),
    "state gradient dropped (WKV-7)": ("wkv7", wkv7_drops_the_state_gradient,
                                       ["shapes/T=1,N=16", "shapes/T=16,B=3,N=5,decay near 1"],
                                       {"d/dstate", "d/dr", "d/dlog_w", "d/dk", "d/dv", "d/da", "d/db"}),
    "skip gradient dropped (scan)": ("selective_scan", scan_drops_the_skip_gradient,
                                     ["shapes/T=19,D=4,N=16", "shapes/T=37,B=2,D=3,N=8,state",
                                      "extreme/T=13,D=4,N=16,+delta_bias,softplus,delta~50"], {"d/dD"}),
    "state not carried (scan)": ("selective_scan", scan_forgets_the_state,
                                 ["shapes/T=1,D=3,N=16,+D,+z", "shapes/T=19,D=4,N=16",
                                  "extreme/T=13,D=4,N=16,+delta_bias,softplus,delta~50"], None),
    "scale 1/d (attention)": ("attention", attention_scaled_by_one_over_d,
                              ["shapes/T=1,d=16", "shapes/T=19,d=16,scale=0.3"], None),
    "window one too wide (ReRoPE)": ("rerope_attention", rerope_window_one_too_wide,
                                     ["shapes/T=1,d=16,w=3", "shapes/T=23,d=16,w=40,leaky=2.0,L=8"], None),
}


@pytest.mark.parametrize("op, broken, still_passing, may_fail", BROKEN.values(), ids=BROKEN.keys())
def test_broken_variants_are_rejected(op, broken, still_passing, may_fail):
    """Every check fails except those where the breakage cannot show (T = 1, a window wider than the sequence, no
    state or no D to differentiate); a breakage of the gradients alone fails gradient rows only."""
    report = run(op, broken, Options(dtypes=("fp32",), parts=("shapes", "split") if op == "wkv7" else PARTS))
    failed = failures(report)
    passing = [c.split("/", 1)[1].removesuffix("/fp32") for c in report.checks
               if c.split("/", 1)[1] not in failed]
    assert passing == still_passing
    if may_fail is not None:
        assert {what for rows in failed.values() for what in rows} <= may_fail


# ----------------------------------------------------------------------------------------------------------------
# Options and entry points
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op, dtype, limit", [("attention", "fp32", 1e-5), ("attention", "fp16", 5e-3),
                                              ("attention", "bf16", 2e-2), ("wkv7", "fp32", 1e-4)])
def test_the_budget_is_the_designs(op, dtype, limit):
    """An output off by a factor 1 + 2 budget fails, one off by 1 + budget / 2 passes (on top of our kernel's own
    error, which is far smaller)."""
    def scaled(factor):
        def fn(*args, **options):
            out = OURS[op](*args, **options, backend="torch")
            return (out[0] * factor, out[1]) if isinstance(out, tuple) else out * factor
        return fn

    options = Options(dtypes=(dtype,), grad=False, only=("T=37,B=2",))
    assert failures(run(op, scaled(1 + 2 * limit), options)) and run(op, scaled(1 + limit / 2), options).ok


def test_plan_follows_the_options():
    checks, _ = plan("wkv7", Options())
    ids = [c.id for c in checks]
    assert len(ids) == len(set(ids)) and "wkv7/split/T=37,B=2,H=2,N=16,state/bf16" in ids
    assert {c.case.params["N"] for c in checks} == {4, 5, 8, 16, 64}
    checks, skipped = plan("wkv7", Options(head_sizes=(16, 64), max_len=37, state=False, dtypes=("fp32",),
                                           skip=("extreme",)))
    assert {c.case.params["N"] for c in checks} == {16}          # 4, 5 and 8 become 16; 64 only at T = 70
    assert not any(c.case.group == "split" or c.case.params.get("state") for c in checks)
    assert ("wkv7/shapes/T=70,N=64/fp32", "T = 70 > max_len = 37") in skipped
    assert all(c.case.group == "shapes" for c in checks)
    with pytest.raises(ValueError, match=r"dtypes must be among .*, got \['fp8'\]"):
        Options(dtypes=("fp8",))


def test_an_adapters_defaults_apply_unless_overridden():
    def fn(*args, **kwargs):
        raise AssertionError("not called")
    fn.conformance_options = {"state": False}
    assert not Options.for_function(fn).state and Options.for_function(fn, state=True).state


def test_a_kernel_that_raises_fails_with_its_message():
    def refuses_long_sequences(w, u, k, v, state=None):
        if k.shape[1] > 16:
            raise ValueError("T > 16 is not supported")
        return wkv4(w, u, k, v, state=state, backend="torch")

    report = run("wkv4", refuses_long_sequences, Options(dtypes=("fp32",), parts=("shapes",)))
    rows = [r for r in report.rows if not r.passed]
    assert {r.check for r in rows} == {"wkv4/shapes/T=37,B=2,C=6,state/fp32", "wkv4/shapes/T=70,C=8,state/fp32"}
    assert all(r.what == "call" and r.message == "ValueError: T > 16 is not supported" for r in rows)


def test_a_forward_only_kernel_needs_no_grad():
    fn = partial(wkv4, backend="torch")
    forward_only = lambda *a, **kw: tuple(x.detach() if torch.is_tensor(x) else x for x in fn(*a, **kw))  # noqa: E731
    report = run("wkv4", forward_only, Options(dtypes=("fp32",), only=("T=7,",)))
    assert [(r.what, r.passed) for r in report.rows if r.what == "gradients"] == [("gradients", False)]
    assert_ok(run("wkv4", forward_only, Options(dtypes=("fp32",), only=("T=7,",), grad=False)))


def test_pytest_cases_run_one_check_each():
    params = pytest_cases("wkv4", partial(wkv4, backend="torch"), dtypes=("fp32",), only=("T=16",))
    assert [p.id for p in params] == ["wkv4/shapes/T=16,C=4/fp32"]
    params[0].values[0]()
    broken = pytest_cases("wkv4", wkv4_decays_one_step_too_many, dtypes=("fp32",), only=("T=16",))
    with pytest.raises(AssertionError, match=r"wkv4/shapes/T=16,C=4/fp32:\n  y: relative RMS error .* > budget"):
        broken[0].values[0]()


def main(*args) -> int:
    """The CLI in this process: its exit code."""
    try:
        return cli_main([str(a) for a in args])
    except SystemExit as e:                                              # argparse's usage errors
        return e.code


def test_cli_table_summary_exit_codes_and_json(tmp_path, monkeypatch, capsys):
    module = tmp_path / "student.py"
    module.write_text("from seqmix.kernels.wkv4 import wkv4\n\n"
                      "def good(w, u, k, v, state=None):\n    return wkv4(w, u, k, v, state=state, backend='torch')\n\n"
                      "def no_state(w, u, k, v, state=None):\n    return wkv4(w, u, k, v, backend='torch')\n")
    fast = ["--dtypes", "fp32", "--parts", "shapes", "split"]
    good = subprocess.run([sys.executable, "-m", "seqmix.conformance", "wkv4", f"{module}:good", *fast, "--json",
                           tmp_path / "good.json"], capture_output=True, text=True, cwd=ROOT)
    assert good.returncode == 0, good.stdout[-2000:] + good.stderr[-2000:]
    lines = good.stdout.splitlines()
    assert lines[0].split() == ["check", "what", "shape", "dtype", "rel", "RMS", "max", "abs", "budget", "result"]
    assert lines[1].split()[:4] == ["wkv4/shapes/T=1,C=3/fp32", "y", "(1,", "1,"] and lines[1].endswith("pass")
    # 8 quantities without a state (y, num, den, max, 4 gradients), 11 with one (3 more gradients): 2 * 8 + 4 * 11
    assert lines[-1] == "wkv4: 6 checks, 60 quantities compared, 60 within budget, 0 not: passed"
    monkeypatch.chdir(tmp_path)                                          # MODULE:FUNCTION from the current directory
    assert main("wkv4", "student:no_state", *fast, "--json", tmp_path / "bad.json") == 1
    assert capsys.readouterr().out.splitlines()[-1].endswith("FAILED")
    schema = json.loads((ROOT / "conformance" / "report.schema.json").read_text())
    for name, ok in (("good.json", True), ("bad.json", False)):
        doc = json.loads((tmp_path / name).read_text())
        jsonschema.validate(doc, schema)
        assert doc["summary"]["ok"] is ok and len(doc["rows"]) == doc["summary"]["rows"]
    failed = {r["check"] for r in json.loads((tmp_path / "bad.json").read_text())["rows"] if not r["passed"]}
    assert failed == {"wkv4/shapes/T=7,B=2,C=5,state/fp32", "wkv4/shapes/T=37,B=2,C=6,state/fp32",
                      "wkv4/shapes/T=70,C=8,state/fp32", "wkv4/split/T=39,B=2,C=5,state/fp32"}
    assert main("wkv4", "student:good", "--only", "no such check") == 3


def test_progress_bar():
    assert progress(0, 30, "a") == f"[{'.' * 30}]  0/30 a"
    assert progress(9, 30, "wkv4/shapes/T=1,C=3/fp32") == f"[{'#' * 9}{'.' * 21}]  9/30 wkv4/shapes/T=1,C=3/fp32"
    assert progress(30, 30, "b") == f"[{'#' * 30}] 30/30 b"


@pytest.mark.parametrize("args, message", [
    (["wkv4", "no_such_module:fn"], "cannot load no_such_module:fn: No module named 'no_such_module'"),
    (["wkv4", "seqmix.kernels.wkv4:no_such_fn"], "has no function 'no_such_fn'"),
    (["wkv4", "seqmix.kernels.wkv4"], "expected MODULE:FUNCTION"),
    (["wkv4", "no_such_file.py:fn"], "no such file: no_such_file.py"),
    (["wkv4", "seqmix.kernels.wkv4:wkv4", "--adapter", "fla"], "adapter fla is for wkv7, not wkv4"),
    (["wkv5", "seqmix.kernels.wkv4:wkv4"], "invalid choice: 'wkv5'"),
    (["wkv4", "seqmix.kernels.wkv4:wkv4", "--head-sizes", "0"], "head_sizes must be >= 1, got [0]"),
    (["wkv4", "seqmix.kernels.wkv4:wkv4", "--max-len", "0"], "max_len must be >= 1, got 0"),
    (["wkv4", "seqmix.kernels.wkv4:wkv4", "--seed", "-1"], "seed must be >= 0, got -1"),
])
def test_cli_usage_errors_exit_2(capsys, args, message):
    assert main(*args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_check_that_compared_nothing_fails():
    """Round 4's mutant G4: failed_checks without "checks that compared nothing"."""
    report = Report("wkv4", Options(), rows=[], checks=["wkv4/shapes/T=1,C=3/fp32"])
    assert report.failed_checks == ["wkv4/shapes/T=1,C=3/fp32"] and not report.ok


def test_json_naming_a_folder_is_a_usage_error_before_the_run(tmp_path, capsys):
    """Round 4, F10: the check (parent.is_dir()) passed and IsADirectoryError came after the whole run."""
    assert main("wkv4", "seqmix.kernels.wkv4:wkv4", "--json", tmp_path) == 2
    captured = capsys.readouterr()
    assert "is a folder, not a file name" in captured.err and captured.out == ""


@pytest.mark.parametrize("returned", ['"y"', "(x for x in [1])", '("y", "s")', 'k, ["a", "b", "c"]'])
def test_a_function_returning_no_tensors_fails_its_rows(returned):
    """Round 4, F10: a str or a generator raised inside the comparison, outside the try that turns a kernel's error
    into a failed row: a traceback, no report."""
    namespace = {}
    exec(f"def f(w, u, k, v, state=None):\n    return {returned}", namespace)
    report = run("wkv4", namespace["f"], Options(dtypes=("fp32",), only=("T=7,",)))
    assert report.rows and not any(r.passed for r in report.rows if r.what in ("y", "state"))
    assert any("not an array of numbers" in r.message for r in report.rows)


def test_an_error_that_overflows_still_writes_the_json_report(tmp_path, monkeypatch):
    """Round 4, F10: an fp64 output scaled by 1e300 made the error inf, and json's allow_nan=False raised after the
    run: the report CI reads was not written."""
    (tmp_path / "huge.py").write_text("from seqmix.kernels.wkv4 import wkv4\n\ndef f(w, u, k, v, state=None):\n"
                                      "    y, s = wkv4(w, u, k, v, state, backend='torch')\n    return y * 1e300, s\n")
    monkeypatch.chdir(tmp_path)
    assert main("wkv4", "huge:f", "--dtypes", "fp64", "--parts", "shapes", "--only", "T=7,B=2,C=5", "--json",
                tmp_path / "r.json") == 1
    doc = json.loads((tmp_path / "r.json").read_text())
    jsonschema.validate(doc, json.loads((ROOT / "conformance" / "report.schema.json").read_text()))
    y = next(r for r in doc["rows"] if r["what"] == "y")
    assert y["passed"] is False and y["error"] is None and "overflows float64" in y["message"]


# ----------------------------------------------------------------------------------------------------------------
# Runs that check nothing never pass (R7), and the CLI's mistakes are one line
# ----------------------------------------------------------------------------------------------------------------

def test_a_kernel_that_calls_sys_exit_fails_its_checks(tmp_path, monkeypatch, capsys):
    """SystemExit from the kernel is a failure of the check that called it, not a run ended with exit 0."""
    (tmp_path / "quitter.py").write_text("import sys\n\ndef wkv4(w, u, k, v, state=None):\n    sys.exit(0)\n")
    monkeypatch.chdir(tmp_path)
    assert main("wkv4", "quitter:wkv4", "--dtypes", "fp32", "--parts", "shapes") == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1].endswith("FAILED") and "the function called sys.exit(0)" in out[1]


def test_keyboard_interrupt_still_interrupts():
    def interrupted(w, u, k, v, state=None):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run("wkv4", interrupted, Options(dtypes=("fp32",), only=("T=1,",)))


def test_an_empty_quantity_is_not_a_pass():
    """Nothing compared is a failure: a case of C = 0 gives empty tensors, whose error would be 0."""
    check = Check("wkv4", Case(dict(B=1, T=3, C=0)), "fp32")
    rows = run_check("wkv4", partial(wkv4, backend="torch"), check, Options(grad=False))
    assert rows and not any(r.passed for r in rows)
    assert all("nothing to compare" in r.message for r in rows)


def test_outputs_take_the_values_dtype():
    """A float64 y for fp32 inputs fails, with a message saying so, however close its values."""
    def promotes(w, u, k, v, state=None):
        y, s = wkv4(w, u, k, v, state=state, backend="torch")
        return y.double(), s

    report = run("wkv4", promotes, Options(dtypes=("fp32",), only=("T=7,",), grad=False))
    assert [(r.what, r.message) for r in report.rows if not r.passed] == [
        ("y", "dtype torch.float64, expected torch.float32 (outputs take the values' dtype)")]


def test_a_state_stacked_into_one_tensor_is_named_as_such():
    def stacks(w, u, k, v, state=None):
        y, s = wkv4(w, u, k, v, state=None if state is None else tuple(state), backend="torch")
        return y, torch.stack(s)

    report = run("wkv4", stacks, Options(dtypes=("fp32",), only=("T=7,",), parts=("shapes",)))
    messages = {r.message for r in report.rows if not r.passed}
    assert messages == {"the final state is one tensor of shape (3, 2, 5); wkv4's state is a tuple of 3 tensors "
                        "(num, den, max) of shapes (2, 5), (2, 5), (2, 5)"}, messages


def test_a_module_that_raises_at_import_is_a_usage_error(tmp_path, capsys):
    module = tmp_path / "broken.py"
    module.write_text("raise RuntimeError('needs a GPU')\n")
    assert main("wkv4", f"{module}:wkv4") == 2
    assert capsys.readouterr().err.splitlines() == [
        f"python -m seqmix.conformance: cannot load {module}:wkv4: RuntimeError: needs a GPU"]


def test_json_into_a_missing_folder_is_refused_before_the_run(tmp_path, capsys):
    assert main("wkv4", "seqmix.kernels.wkv4:wkv4", "--json", tmp_path / "no" / "report.json") == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [
        f"python -m seqmix.conformance: --json: no such folder: {tmp_path / 'no'}"]


# ----------------------------------------------------------------------------------------------------------------
# Two grades: the default budget follows from the inputs where an op says how; --strict keeps the design's
# ----------------------------------------------------------------------------------------------------------------

def textbook_wkv4(w, u, k, v, state=None, *, track_max=True, decay_steps=1):
    """RWKV-4's WKV as transformers' CUDA kernel and rwkv_linear_attention_cpu compute it, in fp32: num and den kept
    divided by e^max, every exponent an fp32 difference. track_max=False: the plain num/den recurrence (max stays
    0); decay_steps=2: a bug, the past decays twice per token."""
    B, T, C = k.shape
    w, u, k, v = (x.float() for x in (w, u, k, v))
    num, den, mx = state if state is not None else (torch.zeros(B, C), torch.zeros(B, C), torch.full((B, C), -1e38))
    if not track_max:
        num, den, mx = num * torch.exp(mx), den * torch.exp(mx), torch.zeros(B, C)
    ys = []
    for t in range(T):
        q = torch.maximum(mx, u + k[:, t]) if track_max else mx
        a, b = torch.exp(mx - q), torch.exp(u + k[:, t] - q)
        ys.append((a * num + b * v[:, t]) / (a * den + b))
        q = torch.maximum(mx + decay_steps * w, k[:, t]) if track_max else mx
        a, b = torch.exp(mx + decay_steps * w - q), torch.exp(k[:, t] - q)
        num, den, mx = a * num + b * v[:, t], a * den + b, q
    return torch.stack(ys, 1).to(k.dtype), (num, den, mx)


LARGE_KEYS = {f"wkv4/extreme/T=40,B=2,C=6,state,{label}/fp32" for label in ("keys+-300", "keys=250+-1",
                                                                            "key spikes+-300")}


def test_the_textbook_fp32_wkv4_passes_by_default_and_fails_strict():
    """Its errors at keys of several hundred (1e-5 to 2e-4) are what fp32 exponents near 300 give: it passes the
    default grade there, at the budget T 2^-24 max|k| (T = 40, keys of +-300: 7.2e-4), and fails --strict (1e-5)
    on those checks only."""
    default = run("wkv4", textbook_wkv4, Options(dtypes=("fp32",)))
    assert_ok(default)
    conditioned = {r.check for r in default.rows if r.conditioned}
    assert "wkv4/extreme/T=40,B=2,C=6,state,keys+-300/fp32" in conditioned <= LARGE_KEYS
    budgets = {r.budget for r in default.rows if r.check.endswith("keys+-300/fp32")}
    assert len(budgets) == 1 and 40 * 2 ** -24 * 299 < budgets.pop() < 40 * 2 ** -24 * 302   # |k|, |u + k| ~ 300
    strict = run("wkv4", textbook_wkv4, Options(dtypes=("fp32",), strict=True))
    assert set(strict.failed_checks) == conditioned
    assert {r.budget for r in strict.rows} == {1e-5}


@pytest.mark.parametrize("broken, fails_on", [
    (partial(textbook_wkv4, track_max=False), LARGE_KEYS),       # e^300 overflows fp32: inf / inf
    (partial(textbook_wkv4, decay_steps=2), None),               # wrong everywhere the past counts
], ids=["no max tracking", "decay applied twice"])
def test_the_conditioned_budget_still_rejects_wrong_kernels(broken, fails_on):
    report = run("wkv4", broken, Options(dtypes=("fp32",)))
    failed = set(report.failed_checks)
    if fails_on is not None:
        assert fails_on <= failed
        assert any("non-finite" in r.message for r in report.rows if r.check in fails_on)
    else:
        assert len(failed) >= len(report.checks) - 1                  # all but T = 1, which has no past


def test_ops_without_a_conditioning_rule_keep_the_designs_budget():
    report = run("attention", partial(attention, backend="torch"), Options(dtypes=("fp32",), grad=False))
    assert {r.budget for r in report.rows} == {1e-5} and OPS["attention"].conditioning is None


def test_the_cli_grades_and_says_which_rows_passed_only_conditioned(tmp_path, capsys):
    module = tmp_path / "textbook.py"
    module.write_text(f"import torch\n\n\n{inspect.getsource(textbook_wkv4)}")
    args = ("wkv4", f"{module}:textbook_wkv4", "--dtypes", "fp32", "--only", "keys+-300", "--no-grad")
    assert main(*args, "--json", tmp_path / "default.json") == 0
    out = capsys.readouterr().out.splitlines()
    assert "only within the budget conditioned on the inputs" in out[-1] and out[-1].endswith("passed")
    assert any("over the design's 1e-05" in line for line in out[1:-1])
    assert main(*args, "--strict", "--json", tmp_path / "strict.json") == 1
    assert capsys.readouterr().out.splitlines()[-1].endswith("FAILED (strict)")
    schema = json.loads((ROOT / "conformance" / "report.schema.json").read_text())
    for name, ok in (("default.json", True), ("strict.json", False)):
        doc = json.loads((tmp_path / name).read_text())
        jsonschema.validate(doc, schema)
        assert doc["summary"]["ok"] is ok and doc["summary"]["conditioned_rows"] > 0
        assert doc["options"]["strict"] is (name == "strict.json")


def test_gradient_loss_takes_the_outputs_device():
    """The cotangents are drawn on the CPU; a kernel's output on another device (a GPU: the first H200 run failed
    every gradient check with "Expected all tensors to be on the same device") must get them on its own. The meta
    device stands in for the GPU here."""
    from seqmix.conformance.battery import _loss
    from seqmix.kernels.declarations import OPS
    y = torch.zeros(2, 3, device="meta")
    state = (torch.zeros(2, device="meta"), torch.zeros(2, device="meta"), torch.zeros(2, device="meta"))
    cotangents = (torch.ones(2, 3, dtype=torch.float64), [torch.ones(2, dtype=torch.float64)] * 3)
    assert _loss(OPS["attention"], y, None, cotangents).device.type == "meta"
    assert _loss(OPS["wkv4"], y, state, cotangents).device.type == "meta"
