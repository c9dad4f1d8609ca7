"""python -m seqmix.benchmarks.gpu_check: on a CPU it says what it would do and exits 0; --dry-run walks every part
here (Triton under the interpreter, a CPU timer) and writes the same files a GPU run writes; its correctness step
runs here too, on CPU tensors under the interpreter."""
import datetime
import json
import re
import subprocess
import sys

import pytest
import torch

from kernel_cases import needs_triton
from seqmix.benchmarks import gpu_check, gpu_timing
from seqmix.kernels.registry import REGISTRY


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
    for part in record["parts"]:
        assert part["status"] == "ok" and part["rows"], part
        assert _timestamp(part["started"]) <= _timestamp(part["ended"])
    assert record["verdict"] == "PASS" and record["finished"]
    rows = {p["name"]: p["rows"] for p in record["parts"]}
    assert {r["op"] for r in rows["correct"]} == {op.name for op in REGISTRY if op.stem in ("wkv4", "rerope")}
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
