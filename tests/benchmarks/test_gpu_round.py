"""python -m seqmix.benchmarks.gpu_round: the GPU run of issue 46. Its dry mode runs the whole sequence here (the
Triton interpreter, tiny shapes, fla skipped with the reason) and writes the record a GPU run writes; a run killed
part-way keeps the rows it had; the goals are read off the rows as the ratios measured side by side."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers.kernel_cases import needs_triton
from seqmix.benchmarks import gpu_round
from seqmix.benchmarks.gpu_round_parts import PARTS as TIMED_PARTS

OUTCOMES = ("median_s", "skipped", "stopped", "error", "kernel", "per_step_s", "y_rel_rms", "first_s")


def _dry(tmp_path, *argv):
    return [sys.executable, "-m", "seqmix.benchmarks.gpu_round", "--dry", "--out", str(tmp_path), "--ops", "wkv4",
            *argv]


@needs_triton
@pytest.mark.timeout(1500)
def test_the_dry_run_writes_every_part_in_the_plans_order(tmp_path):
    done = subprocess.run(_dry(tmp_path), capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((tmp_path / "gpu_round.json").read_text())
    assert [p["name"] for p in record["parts"]] == [name for name, _ in gpu_round.PLAN]
    assert record["finished"] and record["dry_run"] and record["environment"]["versions"]["torch"]
    for part in record["parts"]:
        assert part["status"] == "ok" and part["rows"] and part["started"] <= part["ended"], part
        for row in part["rows"]:
            assert any(k in row for k in OUTCOMES + ("ok",)), (part["name"], row)
    rows = {p["name"]: p["rows"] for p in record["parts"]}
    assert {r["impl"] for r in rows["fla"]} == {"seqmix triton_chunked", "seqmix triton", "fla chunk_rwkv7",
                                                "fla chunk_rwkv7 layer form"}
    assert all("need a GPU" in r["skipped"] for r in rows["fla"] if r["impl"].startswith("fla"))
    timed = [r for r in rows["fla"] if r["impl"] == "seqmix triton_chunked" and r["dtype"] == "fp32"]
    assert len(timed) == 5 and all(r.get("median_s", 0) > 0 or r.get("y_rel_rms", 1) < 1e-4 for r in timed)
    assert any("per_step_s" in r for r in rows["chain"]) and any("kernel" in r for r in rows["decode"])
    assert any(r.get("op") == "chain" and r["first_s"] > 0 for r in rows["compile"])   # compiled in phase 1
    # every goal has its rows, none judged on a dry run
    assert {g["goal"] for g in record["goals"]} == {name for name, *_ in gpu_round.GOALS}
    assert all(g["met"] is None and g["why"] for g in record["goals"])
    markdown = (tmp_path / "gpu_round.md").read_text()
    assert "## Goals" in markdown and all(f"## {name}\n" in markdown for name, _ in gpu_round.PLAN)
    assert "goals:" in done.stdout.split("part ")[-1]          # the summary, printed last


def _events(tmp_path):
    return gpu_round.read_rows(tmp_path)


def _json_rows(tmp_path, part):
    """The rows gpu_round.json holds for ``part`` (none while the file is absent or being rewritten)."""
    try:
        record = json.loads((tmp_path / "gpu_round.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return []
    return [row for p in record.get("parts", []) if p["name"] == part for row in p["rows"]]


@needs_triton
@pytest.mark.timeout(900)
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_run_killed_part_way_keeps_the_rows_it_had(tmp_path, how):
    """Killed once its last part began: by the device command's ``timeout`` (SIGTERM to the run alone), it ends the
    running part's processes, writes its record and exits 1; by the device's own limit (SIGKILL to everything), the
    JSON, rewritten as rows come, still holds the parts that ended and the running part's rows so far."""
    proc = subprocess.Popen(_dry(tmp_path, "--parts", "chain,decode,attn32"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.time() + 800
        while time.time() < deadline and not any(e["event"] == "begin" and e["part"] == "attn32"
                                                 for e in _events(tmp_path)):
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.2)
        if how == signal.SIGTERM:
            proc.send_signal(how)
            assert proc.wait(timeout=120) == 1
            assert "Stopped: signal SIGTERM" in proc.stdout.read()
        else:   # once the running part has a row, it is paused (a dry part ends within 2 s, the kill must find
            # it running) and the parent's refresh (every second) folds its rows into the JSON
            while time.time() < deadline and not any(e["event"] == "row" and e["part"] == "attn32"
                                                     for e in _events(tmp_path)):
                time.sleep(0.2)
            os.kill(next(e["pid"] for e in _events(tmp_path) if e["event"] == "begin" and e["part"] == "attn32"),
                    signal.SIGSTOP)
            while time.time() < deadline and not _json_rows(tmp_path, "attn32"):
                time.sleep(0.2)
            os.killpg(proc.pid, how)
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
        proc.wait()
        running = [e["pid"] for e in _events(tmp_path) if e["event"] == "begin"
                   and not any(f["event"] == "end" and f["part"] == e["part"] for f in _events(tmp_path))]
        for pid in running:     # each part's process leads a session of its own: end it too
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    record = json.loads((tmp_path / "gpu_round.json").read_text())
    chain = record["parts"][0]
    assert chain["name"] == "chain" and chain["status"] == "ok" and not record["finished"]
    assert chain["rows"] == [e["row"] for e in _events(tmp_path) if e["event"] == "row" and e["part"] == "chain"]
    assert any("per_step_s" in r for r in chain["rows"])
    if how == signal.SIGKILL:   # the running part's rows as far as they had come
        assert record["parts"][-1]["name"] == "attn32" and record["parts"][-1]["rows"]
    if how == signal.SIGTERM:
        assert record["stopped"].startswith("signal SIGTERM") and not running
        assert [p["status"] for p in record["parts"]] == ["ok", "ok", "killed: the run was stopped"]


def test_a_line_cut_short_by_a_kill_is_left_out(tmp_path):
    gpu_round.append_row(tmp_path, {"event": "begin", "part": "chain", "time": "t0"})
    gpu_round.append_row(tmp_path, {"event": "row", "part": "chain", "row": {"median_s": 1.0}})
    with open(tmp_path / "gpu_round.rows.jsonl", "a") as f:
        f.write('{"event": "row", "part": "chain", "ro')
    record = gpu_round.fold({}, gpu_round.read_rows(tmp_path))
    assert record["parts"] == [{"name": "chain", "started": "t0", "ended": None, "seconds": None, "status": "running",
                                "budget_s": None, "rows": [{"median_s": 1.0}]}]


def _fla_row(impl, mode, gpu_s, shape="B1 T2048 H12", dtype="bf16"):
    return {"op": "wkv7", "shape": shape, "dtype": dtype, "impl": impl, "mode": mode, "median_s": 1.0, "gpu_s": gpu_s}


def test_the_goals_take_fla_s_fastest_form_and_the_limits():
    fla = [_fla_row("seqmix triton_chunked", "forward", 0.3), _fla_row("seqmix triton", "forward", 0.1),
           _fla_row("fla chunk_rwkv7", "forward", 0.4), _fla_row("fla chunk_rwkv7 layer form", "forward", 0.2),
           _fla_row("seqmix triton_chunked", "forward+backward", 0.5),
           {**_fla_row("fla chunk_rwkv7", "forward+backward", None), "skipped": "no fla"},
           _fla_row("fla chunk_rwkv7 layer form", "forward+backward", 0.5),
           _fla_row("seqmix triton_chunked", "forward", 0.1, dtype="fp32"), _fla_row("fla chunk_rwkv7", "forward", 1,
                                                                                     dtype="fp32")]
    decode = [{"impl": "seqmix triton", "dtype": "bf16", "mode": "forward", "ratio": 1.9},
              {"impl": "seqmix torch", "dtype": "bf16", "mode": "forward", "gpu_s": 1.0},
              {"impl": "seqmix triton", "dtype": "fp32", "mode": "forward", "skipped": "why"}]
    record = {"dry_run": False, "parts": [{"name": "fla", "rows": fla}, {"name": "decode", "rows": decode}]}
    forward_goal, training_goal, decode_goal, _ = (name for name, *_ in gpu_round.GOALS)
    found = {(g["goal"], g["case"].split(" (")[0]): g for g in gpu_round.goals(record)}
    forward = found[(forward_goal, "B1 T2048 H12 bf16")]
    assert forward["ratio"] == pytest.approx(1.5) and forward["met"] is False and "layer form" in forward["case"]
    training = found[(training_goal, "B1 T2048 H12 bf16")]
    assert training["ratio"] == pytest.approx(1.0) and training["met"] is True
    assert not any(case.endswith("fp32") for goal, case in found if goal != decode_goal)   # the goal is bf16's
    assert found[(decode_goal, "seqmix triton bf16")]["met"] is True
    fp32 = found[(decode_goal, "seqmix triton fp32")]
    assert fp32["met"] is None and fp32["why"] == "skipped: why"
    assert (decode_goal, "seqmix torch bf16") not in found
    assert not any(g["met"] is not None for g in gpu_round.goals({**record, "dry_run": True}))


def test_the_plan_gives_each_part_its_share_and_ends_phase_1_at_the_warm_up():
    full = gpu_round.marks([p for p, _ in gpu_round.PLAN], 480.0, 200.0)
    assert list(full) == [p for p, _ in gpu_round.PLAN] and full["profile"] == pytest.approx(480.0)
    assert full["determinism"] == 200.0 and full["fla"] == pytest.approx(0.7 * 480)
    some = gpu_round.marks(["chain", "decode"], 100.0, None)
    assert some["decode"] == pytest.approx(100.0) and some["chain"] == pytest.approx(50.0)
    assert set(TIMED_PARTS) == set(gpu_round.PHASE2)


@pytest.mark.slow       # 8 s: the end of phase 1 leaves a spawned process room to start on a loaded machine
def test_fla_s_warm_up_processes_end_at_the_end_of_phase_1():
    """A quick one is done, one past the end of phase 1 is ended there, a failing one says so."""
    calls = {("quick", "fp32"): (time.sleep, (0.1,)), ("slow", "bf16"): (time.sleep, (60,)),
             ("bad", "fp32"): (time.sleep, ("not a number",))}
    warmers = gpu_round.Warmers([], [], calls)
    rows = {r["impl"]: r for r in warmers.stop(warmers.started + 8)}
    assert time.time() - warmers.started < 30
    assert rows["quick"]["status"] == "done" and rows["slow"]["status"].startswith("ended at --warm-wait-s")
    assert rows["slow"]["seconds_from_start"] >= 8 and rows["bad"]["status"] == "failed (exit code 1)"


def test_the_earlier_record_in_the_folder_is_kept(tmp_path):
    (tmp_path / "gpu_round.json").write_text('{"started": "2026-12-06T07:00:00+00:00"}')
    (tmp_path / "gpu_round.md").write_text("earlier")
    gpu_round._keep_earlier_record(tmp_path)
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == ["gpu_round.2026-12-06T07-00-00-00-00.json", "gpu_round.2026-12-06T07-00-00-00-00.md"]


def test_without_cuda_it_prints_the_plan_and_exits_0(capsys):
    assert gpu_round.main([]) == 0
    out = capsys.readouterr().out
    assert "No CUDA device here" in out and all(name in out for name, _ in gpu_round.PLAN)


def test_bad_options_are_one_line(tmp_path):
    for argv in (["--parts", "chain,speed"], ["--budget-s", "0"], ["--out", str(tmp_path / "f")]):
        (tmp_path / "f").write_text("")
        with pytest.raises(SystemExit) as e:
            gpu_round.main(["--dry", *argv])
        assert e.value.code == 2
