"""python -m seqmix.benchmarks.gpu_check: on a CPU it says what it would do and exits 0; --dry-run walks every part
here (Triton under the interpreter, a CPU timer) and writes the same files a GPU run writes; its correctness step
runs here too, on CPU tensors under the interpreter."""
import datetime
import json
import math
import re
import subprocess
import sys

import pytest
import torch

from helpers.kernel_cases import needs_triton
from seqmix.benchmarks import gpu_check, gpu_correct, gpu_profile, gpu_timing


def test_without_cuda_it_prints_the_plan_and_exits_0():
    run = subprocess.run([sys.executable, "-m", "seqmix.benchmarks.gpu_check"], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "No CUDA device here" in run.stdout
    for criterion in gpu_check.CRITERIA:
        assert criterion in run.stdout
    for step in ("0. compile", "1. correct", "2. no crash at the documented limits", "3. fast as predicted"):
        assert step in run.stdout


@needs_triton
@pytest.mark.parametrize("op", gpu_check.OPS)
def test_correctness_step_passes_on_the_interpreter(op):
    row = gpu_check.check_op(op, torch.float32, device="cpu", T=5, width=16)
    assert row["ok"], row


def _timestamp(text):
    return datetime.datetime.fromisoformat(text)


@needs_triton
@pytest.mark.timeout(900)
def test_dry_run_writes_every_part_in_order_with_timestamps(tmp_path):
    """End to end, as the GPU machine runs it (fewer ops: the interpreter is slow): both files, every part in the
    documented order, each with its start and end, rows from each, and the measured times beside the predictions."""
    run = subprocess.run([sys.executable, "-m", "seqmix.benchmarks.gpu_check", "--dry-run", "--out", str(tmp_path),
                          "--ops", "wkv4,rerope"], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    record = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [p["name"] for p in record["parts"]] == list(gpu_check.PARTS)
    for part in record["parts"]:   # the profile part is WKV-7's alone (test_the_profile_part_walks_on_a_dry_run)
        assert part["status"] == "ok" and (part["rows"] or part["name"] == "profile"), part
        assert _timestamp(part["started"]) <= _timestamp(part["ended"])
    assert record["verdict"] == "PASS" and record["finished"]
    rows = {p["name"]: p["rows"] for p in record["parts"]}
    # each op on each of its Triton backends once ("rerope_decode merged" is rerope_decode on "triton_merged")
    assert {r["op"] for r in rows["correct"]} == {name for name, (op, _) in gpu_timing.ENTRIES.items()
                                                  if op.stem in ("wkv4", "rerope") and name not in gpu_timing.VARIANTS}
    assert all(r["checks"] > 0 and r["ok"] for r in rows["correct"])
    floor = [r for r in rows["timing"] if r["op"] == "timing floor"]
    assert {r["impl"] for r in floor} == {"empty Triton kernel", "torch fill_ of one element"}
    assert {r["impl"] for r in rows["timing"] if r not in floor} == {"seqmix triton", "seqmix torch"}
    assert {r["impl"] for r in rows["peers"]} == {"two-pass ReRoPE (source)", "torch SDPA (default backend) + RoPE"}
    assert all(r["median_s"] > 0 for r in rows["timing"] + rows["peers"])
    forward = [r for r in rows["cost_model"] if r["mode"] == "forward"]
    assert forward and all(r["measured_s"] > 0 and r["predicted_s"] > 0 for r in forward)
    markdown = (tmp_path / "gpu_check.md").read_text()
    for part in gpu_check.PARTS:
        assert f"{gpu_check.STEPS[part]}. {part}" in markdown


def _main(tmp_path, *argv):
    return gpu_check.main(["--dry-run", "--out", str(tmp_path), *argv])


def _record(tmp_path):
    return json.loads((tmp_path / "gpu_check.json").read_text())


@needs_triton
def test_a_part_that_raises_is_recorded_and_the_later_parts_run(tmp_path, monkeypatch, capsys):
    def planted(run, emit):
        emit({"op": "wkv4", "ok": True})
        raise RuntimeError("planted failure")
    monkeypatch.setitem(gpu_check.PART_FUNCTIONS, "correct", planted)
    assert _main(tmp_path, "--parts", "correct,limits") == 1
    correct, limits = _record(tmp_path)["parts"]
    assert correct["status"] == "error" and "RuntimeError: planted failure" in correct["error"]
    assert correct["rows"] == [{"op": "wkv4", "ok": True}]          # what it had measured stays
    assert limits["status"] == "ok" and len(limits["rows"]) == 3 and all(r["ok"] for r in limits["rows"])
    assert "planted failure" in (tmp_path / "gpu_check.md").read_text()
    summary = capsys.readouterr().out.split("\n\npart")[-1]          # the table printed last
    assert re.search(r"^correct +error .* 1 +0$", summary, re.M) and re.search(r"^limits +ok .* 3 +0$", summary, re.M)


@needs_triton
def test_a_lost_cuda_context_restarts_the_run_for_the_remaining_parts(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check.Run, "context_lost", lambda self: True)
    restarted = []

    def execv(path, argv):
        restarted.append(argv)
        raise SystemExit(0)
    monkeypatch.setattr(gpu_check.os, "execv", execv)
    with pytest.raises(SystemExit):
        _main(tmp_path, "--parts", "limits,cost_model")
    assert restarted[0][-3:] == ["--parts", "cost_model", "--resume"] and "--dry-run" in restarted[0]
    (limits,) = _record(tmp_path)["parts"]
    assert limits["status"] == "context lost" and len(limits["rows"]) == 1


@needs_triton
def test_resume_appends_to_the_record(tmp_path):
    _main(tmp_path, "--parts", "limits")
    _main(tmp_path, "--parts", "cost_model", "--resume")
    assert [p["name"] for p in _record(tmp_path)["parts"]] == ["limits", "cost_model"]


@needs_triton
def test_rows_stop_when_the_budget_is_spent_and_the_cost_model_still_runs(tmp_path):
    assert _main(tmp_path, "--parts", "determinism,cost_model", "--ops", "wkv4", "--budget-s", "0") == 1
    determinism, cost = _record(tmp_path)["parts"]
    assert determinism["rows"] == [{"op": "wkv4", "dtype": "float32", "stopped": "time budget spent"}]
    assert cost["status"] == "ok" and cost["rows"]


@needs_triton
@pytest.mark.timeout(900)   # two processes that import torch: slow on a loaded machine
def test_worker_processes_return_their_rows(tmp_path):
    assert _main(tmp_path, "--parts", "determinism", "--ops", "wkv4,selective_scan", "--workers", "2") == 0
    rows = _record(tmp_path)["parts"][0]["rows"]
    assert sorted(r["op"] for r in rows) == ["selective_scan", "wkv4"] and all(r["ok"] for r in rows), rows


@needs_triton
def test_the_interpreter_counts_the_compiles_a_gpu_would_do():
    """One count per new specialization: the same launch again adds none, a T that is a multiple of 16 (a new
    divisibility) adds one."""
    run = gpu_check.Run(None, True, None, (), {"parts": []})
    call = gpu_timing.seqmix_call(run, "wkv4", "triton")

    def forward(T):
        with torch.no_grad():
            call({"w": -torch.rand(8), "u": torch.rand(8), "k": torch.rand(1, T, 8), "v": torch.rand(1, T, 8)})
    before = run.compiles.now()
    forward(5)
    assert run.compiles.since(before)["compiles"] == 1
    forward(5)
    assert run.compiles.since(before)["compiles"] == 1
    forward(32)
    assert run.compiles.since(before)["compiles"] == 2


def test_unknown_parts_are_refused(tmp_path):
    with pytest.raises(SystemExit):
        _main(tmp_path, "--parts", "correct,speed")


@pytest.mark.parametrize("argv, says", [(["--parts", ""], "--parts: no part given"),
                                        (["--explain", "foo"], "--explain takes KERNEL=TEXT, got 'foo'"),
                                        (["--budget-s", "nan"], "--budget-s must be a number of seconds >= 0"),
                                        (["--out", "FILE"], "is a file, not a folder")])
def test_bad_options_are_one_line_before_anything_runs(tmp_path, capsys, argv, says):
    """Round 4, F3 and F11: an empty --parts passed with no part run; --explain without '=' raised a ValueError
    traceback after every part had run; --out naming a file, FileExistsError."""
    (tmp_path / "f").write_text("")
    argv = [str(tmp_path / "f") if a == "FILE" else a for a in argv]
    with pytest.raises(SystemExit) as exit_:
        _main(tmp_path / "out", *argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and says in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_damaged_record_to_resume_is_named(tmp_path, capsys):
    (tmp_path / "gpu_check.json").write_text("{not json")
    with pytest.raises(SystemExit) as exit_:
        _main(tmp_path, "--parts", "limits", "--resume")
    assert exit_.value.code == 2 and "gpu_check.json is not a gpu_check record" in capsys.readouterr().err


def test_a_run_that_checked_nothing_fails(tmp_path, capsys):
    """F3: --ops matching no op gave PASS and exit 0 with zero rows."""
    assert _main(tmp_path, "--parts", "compile,correct", "--ops", "zzz") == 1
    assert _record(tmp_path)["verdict"].startswith("FAIL: nothing was checked")
    assert gpu_check._verdict({"parts": [], "dry_run": True}, {})[1] is False


def test_an_earlier_record_is_kept_not_replaced(tmp_path, capsys):
    """F8: a dry run (here with a typo in --ops) replaced a GPU run's gpu_check.json and .md as it started."""
    earlier = {"started": "2026-01-02T03:04:05Z", "device": "NVIDIA H100", "parts": [{"name": "correct", "rows": [1]}]}
    (tmp_path / "gpu_check.json").write_text(json.dumps(earlier))
    (tmp_path / "gpu_check.md").write_text("the GPU run")
    _main(tmp_path, "--parts", "compile", "--ops", "zzz")
    assert json.loads((tmp_path / "gpu_check.2026-01-02T03-04-05Z.json").read_text()) == earlier
    assert (tmp_path / "gpu_check.2026-01-02T03-04-05Z.md").read_text() == "the GPU run"
    assert _record(tmp_path)["device"] == "CPU (dry run)"
    _main(tmp_path, "--parts", "compile", "--ops", "zzz")           # and a second run keeps the first's
    assert len(list(tmp_path.glob("gpu_check.*.json"))) == 2


def test_a_dry_run_writes_apart_from_a_gpu_run_by_default(monkeypatch):
    seen = {}
    monkeypatch.setattr(gpu_check, "_keep_earlier_record", lambda out: seen.setdefault("out", out))
    monkeypatch.setattr(gpu_check, "Run", lambda *a, **k: (_ for _ in ()).throw(SystemExit(9)))
    with pytest.raises(SystemExit):
        gpu_check.main(["--dry-run", "--parts", "limits"])
    assert seen["out"] == gpu_check.RESULTS / "dry_run"


def test_attention_is_benchmarked_at_head_sizes_64_and_128_and_checked_once():
    """The issue's goal names d = 64 and 128: both are entries of the one list of shapes (the second a variant of
    the first, tiny on a dry run); the correctness checks, which choose their own shapes, run attention once."""
    assert gpu_timing.SHAPES["attention"] == dict(B=1, H=4, T=8192, d=64)
    assert gpu_timing.SHAPES["attention d=128"] == dict(B=1, H=4, T=8192, d=128)
    assert gpu_timing.DRY_SHAPES["attention d=128"]["d"] == 32
    assert gpu_timing.VARIANTS == ("attention d=128",)
    assert "attention d=128" in gpu_timing.COST_KERNELS
    assert not any(op.startswith("attention d=128") for op in (*gpu_correct.OPS, *gpu_correct.BATTERY))


@needs_triton
@pytest.mark.timeout(600)
def test_a_dry_run_times_models_and_compares_attention_at_d_128(tmp_path):
    """The compile, timing, cost-model and peers parts each carry rows of the entry "attention d=128", at its dry
    shape, forward and forward + backward, fp32 and bf16."""
    assert _main(tmp_path, "--parts", "compile,timing,cost_model,peers", "--ops", "attention d=128") == 0
    rows = {p["name"]: p["rows"] for p in _record(tmp_path)["parts"]}
    assert [(r["op"], r["compiles"]) for r in rows["compile"]] == [("attention d=128", 4)]
    modes, dtypes = {"forward", "forward+backward"}, {"fp32", "bf16"}
    timed = [r for r in rows["timing"] if r["op"] == "attention d=128"]
    assert {(r["impl"], r["dtype"], r["mode"]) for r in timed} == {
        (impl, dtype, mode) for impl in ("seqmix triton", "seqmix torch") for dtype in dtypes for mode in modes}
    assert all(r["shape"] == "B=1 H=2 T=32 d=32" and r["median_s"] > 0 for r in timed)
    assert {(r["op"], r["impl"], r["dtype"], r["mode"]) for r in rows["peers"]} == {
        ("attention d=128", "torch SDPA (default backend)", dtype, mode) for dtype in dtypes for mode in modes}
    assert all(r["median_s"] > 0 for r in rows["peers"])
    assert {(r["dtype"], r["mode"]) for r in rows["cost_model"]} == {(d, m) for d in dtypes for m in modes}
    assert all(r["op"] == "attention d=128" and r["shape"] == "B=1 H=2 T=32 d=32" and r["kernels"].startswith(
        "attention_fwd") and r["predicted_s"] > 0 and r["measured_s"] > 0 for r in rows["cost_model"])


@pytest.mark.slow   # a dry timing of WKV-7 under the interpreter: about 75 s here
def test_fla_s_fastest_form_is_timed_and_fp32_rows_name_their_products(tmp_path):
    """Issue 46: the timing times fla's chunk_rwkv7 also as fla's own layer calls it (safe gate, lower bound -e^-0.5,
    chunks of 64: its fastest form; skipped without a GPU), and every fp32 row says how its implementation multiplies:
    fla's Triton dots in TF32 (Triton's default), seqmix's WKV-7 in IEEE fp32, SDPA's fp32 default in 3xTF32."""
    assert gpu_timing.FLA_LOWER_BOUND == pytest.approx(-math.exp(-0.5))
    assert _main(tmp_path, "--parts", "timing,peers", "--ops", "wkv7") == 0
    rows = [r for p in _record(tmp_path)["parts"] for r in p["rows"] if r["op"] == "wkv7"]
    forms = {r["impl"] for r in rows if r["impl"].startswith("fla")}
    assert forms == {f"fla {form}" for form in gpu_timing.FLA_FORMS}
    assert all(r["fp32_products"] == ("tf32" if r["impl"].startswith("fla") else "ieee") for r in rows
               if r["dtype"] == "fp32") and all("fp32_products" not in r for r in rows if r["dtype"] == "bf16")
    assert gpu_timing.fp32_products("torch SDPA (default backend)", "attention") == "3xtf32"
    assert gpu_timing.fp32_products("seqmix triton", "attention") == "ieee"


@needs_triton
@pytest.mark.timeout(600)
def test_the_profile_part_walks_on_a_dry_run(tmp_path):
    """Without CUDA the profile part records our chunked WKV-7 kernels' launch grids at the dry shape (the forward's
    prep, scan and output, the backward's serial pass and per-chunk kernel, each with its programs), says that the
    CUDA times need a GPU, and skips fla; the launches' recorder leaves Triton as it found it."""
    from triton.runtime.interpreter import InterpretedFunction
    gpu_check._count_interpreted_launches()   # a dry run's compile counter wraps run for the process, on purpose
    run_before = InterpretedFunction.__dict__["run"]
    assert _main(tmp_path, "--parts", "profile", "--ops", "wkv7 chunked") == 0
    (part,) = _record(tmp_path)["parts"]
    assert part["name"] == "profile" and part["status"] == "ok"
    s = gpu_timing.DRY_SHAPES["wkv7 chunked"]
    heads, groups = s["B"] * s["H"], -(-s["T"] // 16)                  # fp32: groups of one 16-step sub-chunk
    programs = {"prep": heads * groups * 2 * s["N"] // 16, "scan": heads * s["N"] // 16,
                "output": heads * groups * s["N"] // 16, "bwd_prep": heads * groups * 2 * s["N"] // 16,
                "bwd": heads * groups}                                 # the gradients: one program a sub-chunk
    ours = [r for r in part["rows"] if r["impl"] == "seqmix wkv7 chunked"]
    forward = {f"wkv7_chunked_{k}_kernel" for k in ("prep", "scan", "output")}
    # the backward: its prep, the same scan reversed, the gradients (fp32 has no walks over a group: groups of one)
    assert {(r["mode"], r["kernel"]) for r in ours} == {
        *(("forward", k) for k in forward),
        *(("forward+backward", k) for k in forward | {"wkv7_chunked_bwd_prep_kernel", "wkv7_chunked_bwd_kernel"})}
    twice = ("forward+backward", "wkv7_chunked_scan_kernel")             # the forward's scan, then reversed
    assert all(r["op"] == "wkv7" and r["dtype"] == "fp32" and r["grid"]
               and r["calls_per_step"] == (2 if (r["mode"], r["kernel"]) == twice else 1)
               and r["programs"] == str(programs[r["kernel"][len("wkv7_chunked_"):-len("_kernel")]])
               and "need" in r["cuda_s"] for r in ours), ours
    for form in ("fla chunk_rwkv7", "fla chunk_rwkv7 layer form"):     # fla's default form and its layer's
        fla = [r for r in part["rows"] if r["impl"] == form]
        assert {r["mode"] for r in fla} == {"forward", "forward+backward"} and all("GPU" in r["skipped"] for r in fla)
    assert InterpretedFunction.__dict__["run"] is run_before
    assert "## 3. profile" in (tmp_path / "gpu_check.md").read_text()


@needs_triton
def test_the_profile_part_stops_at_the_deadline_and_waits_for_fla_s_autotuning(tmp_path):
    assert _main(tmp_path, "--parts", "profile", "--ops", "wkv7 chunked", "--budget-s", "0") == 1
    rows = _record(tmp_path)["parts"][0]["rows"]
    assert all(r["stopped"] == "time budget spent" for r in rows if r["impl"].startswith("seqmix")) and rows
    run = gpu_check.Run(None, True, gpu_profile.FLA_FIRST_CALL_S - 10, (), {"parts": []})
    why = gpu_profile._why_not                                          # fla's case, with 140 s left:
    assert "autotunes" in why(run, "fla chunk_rwkv7", len, timed=False)["stopped"]   # its first call here
    assert why(run, "fla chunk_rwkv7", len, timed=True) == {}                        # the peers part called it
    assert why(run, "fla chunk_rwkv7", "skipped: no fla", timed=False) == {"skipped": "skipped: no fla"}


@needs_triton
def test_a_profiled_case_gives_a_row_per_kernel_with_its_grid(monkeypatch):
    """The rows a GPU gives, from the profiler's times (faked here: a CPU build has no CUDA activity) and the grids of
    the launches: sorted by time, each with its share, ours with their programs, then the total."""
    run = gpu_check.Run(None, True, None, (), {"parts": []})
    call = gpu_timing.seqmix_call(run, "wkv7 chunked", "triton")
    make = gpu_timing.inputs_at(run, "wkv7 chunked", "fp32")
    fake = {"wkv7_chunked_scan_kernel": (5, 3e-3), "void at::native::fill_kernel": (10, 1e-3)}
    monkeypatch.setattr(gpu_profile, "_profiled", lambda step: (step(), fake)[1])
    run.dry = False                                   # past the dry run's return: the GPU's path, on the CPU
    monkeypatch.setattr(run, "sync", lambda: None)
    ours, fill, total = gpu_profile.profile_case(run, call, make, "forward")
    assert ours.pop("mean_s") == pytest.approx(6e-4)
    s = gpu_timing.DRY_SHAPES["wkv7 chunked"]                         # the serial pass: a head's 16 value rows each
    heads, row_blocks = s["B"] * s["H"], s["N"] // 16
    assert ours == {"kernel": "wkv7_chunked_scan_kernel", "calls": 5, "calls_per_step": 1, "total_s": 3e-3,
                    "share": 0.75, "grid": f"{heads}x{row_blocks}", "programs": str(heads * row_blocks)}
    assert fill["grid"] is None and fill["calls_per_step"] == 2 and fill["share"] == 0.25
    assert total["kernel"] == "(all kernels)" and total["calls"] == 15 and total["per_step_s"] == pytest.approx(8e-4)
    monkeypatch.setattr(gpu_profile, "_profiled", lambda step: {})
    assert "no CUDA kernel" in gpu_profile.profile_case(run, call, make, "forward")[0]["skipped"]


def test_kernel_times_sums_the_profiler_events_of_one_device():
    """Per name, the calls and total seconds of the profiler's events on one device (on a GPU: CUDA, the kernels)."""
    from torch.profiler import ProfilerActivity, profile
    x = torch.ones(64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            torch.add(x, x)
    times = gpu_profile.kernel_times(prof.events(), torch.autograd.DeviceType.CPU)
    calls, seconds = times["aten::add"]
    assert calls == 3 and 0 < seconds < 10
    assert gpu_profile.kernel_times(prof.events(), torch.autograd.DeviceType.CUDA) == {}


def test_launch_grids_are_read_as_programs():
    assert gpu_profile._grid([(24, 4), (24, 4)]) == {"grid": "24x4", "programs": "96"}
    assert gpu_profile._grid([(12, 4), (1536, 4)]) == {"grid": "12x4, 1536x4", "programs": "48, 6144"}
    assert gpu_profile._grid([lambda meta: (1,)]) == {"grid": None, "programs": None}
    grids = {"wkv7_chunked_fwd_kernel": [(12, 4)]}
    assert gpu_profile._launched_as("wkv7_chunked_fwd_kernel", grids) == [(12, 4)]
    assert gpu_profile._launched_as("void at::native::fill_kernel<float>", grids) == []


class _FakeCuda:
    """torch.cuda's Event and _sleep over a simulated GPU clock: the stream sleeps, then runs each queued call for
    ``gpu_s``; the host queues each call in ``host_s``. An event's time is when the GPU reaches it: never before the
    host has queued it, so a queue that runs dry shows the host's latency, as on a real GPU."""

    def __init__(self, gpu_s, host_s):
        self.gpu_s, self.host_s, self.host, self.gpu = gpu_s, host_s, 0.0, 0.0
        fake = self

        class Event:
            def __init__(self, enable_timing):
                self.at = None

            def record(self):
                fake.gpu = max(fake.gpu, fake.host)
                self.at = fake.gpu

            def query(self):
                return self.at <= fake.host       # the GPU has passed it by the host's present

            def synchronize(self):
                fake.host = max(fake.host, self.at)

            def elapsed_time(self, end):
                return (end.at - self.at) * 1e3   # milliseconds, as CUDA's

        self.Event = Event

    def _sleep(self, cycles):
        self.gpu = max(self.gpu, self.host) + cycles / 2e9

    def step(self):
        self.host += self.host_s
        self.gpu = max(self.gpu, self.host) + self.gpu_s


def test_queued_time_hides_the_launch_latency_that_a_single_call_measures():
    """A 10 us kernel behind 290 us of launch latency: one call alone measures about 300 us (the first GPU run's
    floor); queued behind a sleep long enough, the calls run back to back and measure 10 us each, unstarved."""
    cuda = _FakeCuda(gpu_s=10e-6, host_s=290e-6)
    got = gpu_timing.queued_time(cuda.step, per_call_s=300e-6, cuda=cuda)
    assert got["gpu_s"] == pytest.approx(10e-6, rel=1e-6) and got["gpu_starved"] == 0
    assert got["gpu_calls"] == round(0.005 / 300e-6)


def test_queued_time_says_when_the_queue_ran_dry_and_sleeps_longer():
    """Told a call takes 1 us when the host needs 290 us to queue it, the first sleep is too short: the GPU waits for
    the host (the time per call is the host's) and the repeat counts as starved; the sleep doubles until it holds."""
    cuda = _FakeCuda(gpu_s=10e-6, host_s=290e-6)
    got = gpu_timing.queued_time(cuda.step, per_call_s=1e-6, cuda=cuda, repeats=9)
    assert 1 <= got["gpu_starved"] < 9
    assert got["gpu_s"] == pytest.approx(10e-6, rel=1e-6)    # the median: most repeats held after the doubling


def test_warmers_wait_until_their_deadline_then_end_the_rest(tmp_path):
    """gpu_check's background first calls: a quick one is done, one past the deadline is ended there, and a failing
    one says so; the record and the report carry each, with its seconds."""
    import time
    run = gpu_check.Run(tmp_path, True, None, (), {"parts": [], "command": "c", "started": "s", "device": "d",
                                                   "versions": {}})
    calls = {("quick", "fp32"): (time.sleep, (0.1,)), ("slow", "bf16"): (time.sleep, (60,)),
             ("bad", "fp32"): (time.sleep, ("not a number",))}
    started = time.monotonic()
    warmers = gpu_check._Warmers(run, 8.0, calls)
    warmers.wait()
    assert time.monotonic() - started < 30
    rows = {r["impl"]: r for r in run.record["warm_up"]}
    assert rows["quick"]["status"] == "done" and rows["quick"]["seconds"] < 8
    assert rows["slow"]["status"].startswith("ended at the deadline") and rows["slow"]["seconds"] >= 8
    assert rows["bad"]["status"] == "failed (exit code 1)"
    assert "fla's first calls" in (tmp_path / "gpu_check.md").read_text()


def test_warm_peer_calls_the_peer_forward_and_backward_at_each_of_its_shapes():
    """gpu_check's background first call, run here on the dry shapes with a peer that runs on a CPU (SDPA beside
    attention at d = 64 and d = 128): forward and forward + backward at each, and nothing for an unknown peer."""
    assert gpu_timing.warm_peer("torch SDPA (default backend)", "fp32", device="cpu",
                                shapes=gpu_timing.DRY_SHAPES) == 4
    assert gpu_timing.warm_peer("no such peer", "fp32", device="cpu", shapes=gpu_timing.DRY_SHAPES) == 0
