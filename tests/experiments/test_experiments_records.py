"""The experiments' records and command lines against bad inputs (reliability round 4): rows carry their setup and a
run refuses another setup's (F2), another seed never replaces seed 0's shipped weights or report (F7), and a
mistake on the command line is one line, not a traceback (F9), with the file or row named."""
import json
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch

from seqmix.experiments import language_model as lm
from seqmix.experiments import records, recall, state_tracking, zoo
from seqmix.experiments.data import mqar
from seqmix.experiments.records import RESULTS, Results, control_verdict, setup_label
from seqmix.experiments.training import Budget, Run


def test_rows_carry_their_setup_and_a_run_refuses_another_setups_rows(tmp_path):
    Results(tmp_path, "x", "quick").add({"phase": "test", "arch": "a"})
    assert json.loads((tmp_path / "x.json").read_text())["rows"][0]["setup"] == "quick"
    assert Results(tmp_path, "x", "quick").find(arch="a")["setup"] == "quick"
    with pytest.raises(ValueError, match=r"x.json: holds rows of the quick setup, and this is a full run"):
        Results(tmp_path, "x", "full")
    assert len(Results(tmp_path, "x").rows) == 1            # a reader takes every row


def test_rows_without_a_setup_are_the_committed_full_runs():
    assert Results(RESULTS, lm.NAME, "full").rows
    with pytest.raises(ValueError, match="holds rows of the full setup, and this is a quick run"):
        Results(RESULTS, lm.NAME, "quick")


def test_an_edited_setup_gets_a_label_of_its_own():
    tiny = replace(lm.QUICK, seq_len=32)
    assert (setup_label(lm.FULL, lm.FULL, lm.QUICK), setup_label(lm.QUICK, lm.FULL, lm.QUICK)) == ("full", "quick")
    assert setup_label(tiny, lm.FULL, lm.QUICK).startswith("custom-")
    assert setup_label(tiny, lm.FULL, lm.QUICK) != setup_label(replace(tiny, seq_len=16), lm.FULL, lm.QUICK)


def test_a_quick_run_into_the_full_runs_folder_is_refused_not_reported(tmp_path, capsys):
    """F2: it used to train nothing, exit 0, and describe the quick setup over the full run's numbers."""
    shutil.copy(RESULTS / f"{lm.NAME}.json", tmp_path)
    assert lm.main(["--quick", "--no-progress", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{lm.NAME}.json: holds rows of the full setup, and this is a quick run" in err
    assert not (tmp_path / f"{lm.NAME}.md").exists()


def test_another_seed_keeps_seed_0s_weights_and_report(tmp_path):
    """F7: seed 1 into seed 0's folder rewrote weights/language_model/ and language_model.md for itself."""
    tiny = replace(lm.QUICK, models=(("rwkv4", 16, 1, 16),), lrs=(1e-2,), pilot_steps=1, valid_windows=2,
                   budget=Budget(steps=2, batch_size=2, warmup=0.5, eval_every=2), eval_bytes=4096, speed_steps=1,
                   generate_tokens=2, seq_len=32)
    lm.run(tiny, tmp_path, seed=0, progress=False)
    weights = tmp_path / "weights" / lm.NAME / "rwkv4" / "model.safetensors"
    before, report = weights.read_bytes(), (tmp_path / f"{lm.NAME}.md").read_text()
    results = lm.run(tiny, tmp_path, seed=1, progress=False)
    assert weights.read_bytes() == before
    assert (tmp_path / f"{lm.NAME}.md").read_text() == report
    seed1 = tmp_path / "weights" / f"{lm.NAME}-seed1" / "rwkv4" / "model.safetensors"
    assert seed1.exists() and seed1.read_bytes() != before
    assert (tmp_path / f"{lm.NAME}-seed1.md").exists()
    shipped = {r["seed"]: r["shipped"] for r in results.select(phase="final")}
    assert shipped[0] != shipped[1]


@pytest.mark.parametrize("content", ["", '{"rows": [', "[]", '{"experiment": "x"}', '{"rows": {"a": 1}}',
                                     '{"rows": ["a"]}'])
def test_a_damaged_results_file_is_named(tmp_path, content):
    (tmp_path / "x.json").write_text(content)
    with pytest.raises(ValueError, match=r"x.json: (not a results file|\"rows\" must be a list of objects)"):
        Results(tmp_path, "x")


def test_a_damaged_results_file_on_the_command_line_is_one_line(tmp_path, capsys):
    """F9: a JSONDecodeError traceback."""
    (tmp_path / f"{state_tracking.NAME}.json").write_text("")
    assert state_tracking.main(["--quick", "--no-progress", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("python -m seqmix.experiments.state_tracking: error: ") and err.count("\n") == 1
    assert "state_tracking.json: not a results file" in err


def test_out_naming_a_file_is_a_usage_error(tmp_path, capsys):
    """F9: FileExistsError / NotADirectoryError tracebacks."""
    (tmp_path / "f").write_text("")
    with pytest.raises(SystemExit) as exit_:
        lm.main(["--quick", "--out", str(tmp_path / "f")])
    assert exit_.value.code == 2 and "--out " in capsys.readouterr().err


def test_a_missing_field_names_the_file_and_the_row(tmp_path):
    """Round 4's bare KeyError: 'test_accuracy' from recall.control_holds (and 'test_bpb' from the report)."""
    results = Results(tmp_path, "recall", "quick")
    c = recall.QUICK.control
    for seed in range(c.seeds):
        results.add({"phase": "test", "arch": c.arch, "width": c.width, "pairs": c.pairs, "seed": seed})
    with pytest.raises(KeyError, match=r"recall.json: the row \(phase='test', .*\) has no 'test_accuracy' field"):
        recall.control_holds(Results(tmp_path, "recall"), recall.QUICK)


def test_a_control_verdict_takes_a_bool_or_none():
    assert control_verdict(True) == "holds"
    with pytest.raises(TypeError, match="holds must be True, False or None"):
        control_verdict("yes")


def _tiny_run(checkpoint):
    return Run(build=lambda: zoo.build("rwkv4", vocab_size=16, width=16, layers=1), forward=zoo.logits,
               sample=lambda rng, n: mqar(rng, n, seq_len=12, num_pairs=2, vocab_size=16), lr=1e-2,
               budget=Budget(steps=2, batch_size=4, eval_every=1), seed=0,
               valid=mqar(np.random.default_rng(9), 8, seq_len=12, num_pairs=2, vocab_size=16), checkpoint=checkpoint)


@pytest.mark.parametrize("damage", ["zero bytes", "a plain state dict"])
def test_an_unreadable_checkpoint_is_named(tmp_path, damage):
    """Round 4: EOFError: Ran out of input; KeyError: 'lr'."""
    path = tmp_path / "run.pt"
    if damage == "zero bytes":
        path.write_bytes(b"")
    else:
        torch.save({"w": torch.zeros(2)}, path)
    with pytest.raises(ValueError, match=r"checkpoint .*run.pt: (cannot be read|not a training run's checkpoint)"):
        _tiny_run(path)


def test_records_command_line_reports_what_the_run_raised(capsys):
    def run(*args):
        raise FileNotFoundError("somewhere: gone")
    assert records.command_line("doc", run, "full", "quick", ["--no-progress"]) == 1
    assert capsys.readouterr().err.endswith("error: somewhere: gone (--debug shows the traceback)\n")
    with pytest.raises(FileNotFoundError):
        records.command_line("doc", run, "full", "quick", ["--debug"])


# ----------------------------------------------------------------------------------------------------------------
# Round 4's surviving mutants of the experiments (C1, C7, C8, C10 above, L4, L5, L6)
# ----------------------------------------------------------------------------------------------------------------

def test_recall_control_holds_when_every_seed_is_exactly_at_the_bar(tmp_path):
    """C1: >= made >."""
    results, c = Results(tmp_path, "recall", "quick"), recall.QUICK.control
    for seed in range(c.seeds):
        results.add({"phase": "test", "arch": c.arch, "width": c.width, "pairs": c.pairs, "seed": seed,
                     "test_accuracy": recall.QUICK.control_accuracy})
    assert recall.control_holds(results, recall.QUICK) is True


def _parity_rows(tmp_path, test, long=None, seeds=3):
    setup = state_tracking.FULL
    results = Results(tmp_path, state_tracking.NAME, "full")
    far = f"accuracy_past_train_at_{4 * setup.train_len}"
    for seed in range(seeds):
        key = {"arch": "rwkv7_wide", "task": setup.tasks[0].name, "seed": seed}
        results.add({**key, "phase": "test", "test_accuracy": test, far: test})
        if long is not None:
            results.add({**key, "phase": "long", "test_accuracy": long, far: long, "warmup_steps": 75})
    return results, setup


def test_state_tracking_control_fails_when_the_long_runs_fail_too(tmp_path):
    """C7: a long run's mere presence counted as passing."""
    assert state_tracking.control_holds(*_parity_rows(tmp_path, 0.5, long=0.5)) is False
    assert state_tracking.control_holds(*_parity_rows(tmp_path / "b", 0.5, long=1.0)) is True


def test_state_tracking_control_is_not_finished_with_one_of_three_seeds(tmp_path):
    """C8: one seed of the three the full setup gives the control made a verdict."""
    assert state_tracking.FULL.tasks[0].seeds["rwkv7_wide"] == 3
    assert state_tracking.control_holds(*_parity_rows(tmp_path, 1.0, seeds=1)) is None


def test_state_tracking_control_waits_for_a_missed_seeds_longer_run(tmp_path):
    """A seed that missed the rule and whose longer run (the warmup kept) has not run leaves the verdict open (it read
    as failed), as recall's and the family's do; the report names the seed."""
    results, setup = _parity_rows(tmp_path, 1.0)
    results.rows[-1] = {**results.rows[-1], "test_accuracy": 0.5}         # seed 2 misses, no long run
    assert state_tracking.control_holds(results, setup) is None
    assert "seed 2 not yet with 4x the steps" in state_tracking._control_note(results, setup)
    results.rows.append({**results.rows[-1], "phase": "long", "warmup_steps": 75})    # its longer run misses too
    assert state_tracking.control_holds(results, setup) is False
    assert "seed 2 not even with 4x the steps" in state_tracking._control_note(results, setup)


def test_the_language_model_pilot_ranks_the_lowest_validation_loss_first():
    """L4: the rate chosen by the worst validation loss."""
    runs = []
    for loss in (2.0, 3.0):
        run = lm.LmRun.__new__(lm.LmRun)
        run.diverged, run.history, run.lr = False, [[10, 1.0, 0.5, loss]], loss
        runs.append(run)
    assert max(runs, key=lambda r: r.score).lr == 2.0


def test_round_as_stored_rounds_all_but_the_kept_parameters():
    """L5: the kept (fp32) parameters rounded and the others left."""
    torch.manual_seed(0)
    model = lm.build("rwkv4", 16, 1, 16, 32)
    for p in model.parameters():
        p.data.add_(torch.rand_like(p) * 1e-3)           # values fp16 cannot hold
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    lm.round_as_stored(model, "rwkv4")
    kept = [n for n in before if lm.keeps_fp32("rwkv4", n)]
    assert kept and len(kept) < len(before)
    for name, p in model.named_parameters():
        want = before[name] if name in kept else before[name].half().float()
        assert torch.equal(p, want) and not (name not in kept and torch.equal(p, before[name])), name


def test_bits_per_byte_of_ln_2_nats_is_one():
    """L6: nats / ln 10."""
    assert lm.bpb(float(np.log(2))) == pytest.approx(1.0, rel=1e-15)


def test_made_on_names_the_cpu_the_commit_and_uncommitted_code():
    row = {"env": {"cpu": "Intel(R) Xeon(R) Processor", "commit": "4ca5cf7" + "0" * 33 + "+changes"}}
    assert records.made_on(row) == "Intel Xeon, 4ca5cf7 with uncommitted changes"
    assert records.made_on({"env": {"cpu": "AMD EPYC", "commit": "501ec48" + "1" * 33}}) == "AMD EPYC, 501ec48"
    assert records.made_on({"phase": "bigram"}) == "-"
    rows = [{**row, "name": "a"}, {**row, "name": "a"}, {"env": {"cpu": "AMD EPYC", "commit": "abc"}, "name": "b"},
            {"name": "computed"}]
    section = records.provenance(rows, lambda r: r["name"])
    assert "| Intel Xeon, 4ca5cf7 with uncommitted changes | a |" in section and "| AMD EPYC, abc | b |" in section
    assert "computed" not in section and records.provenance([{"name": "x"}], lambda r: r["name"]) == ""


@pytest.mark.parametrize("name", ["recall", "recall_probes", "selective_copy", "selective_copy_probes",
                                  "state_tracking", "family_tasks", "extrapolation", "language_model",
                                  "language_model_probes", "lm_context"])
def test_every_committed_report_says_where_each_row_was_made(name):
    """The issue's rule: rows from another CPU or from uncommitted code are marked where they are read. Every
    committed row that records its environment has its place (CPU, commit, uncommitted changes) in its report: a
    language-model row in its seed's report (lm.per_seed)."""
    report = {"recall_probes": "recall", "selective_copy_probes": "selective_copy",
              "language_model_probes": "language_model"}.get(name, name)
    places = {}                                               # report file -> the places of the rows it reads
    for r in (r for r in Results(RESULTS, name).rows if r.get("env")):
        seed = r.get("seed", 0) if report == "language_model" else 0
        places.setdefault(lm.per_seed(report, seed), set()).add(records.made_on(r))
    assert places, name
    for file, wanted in places.items():
        text = (RESULTS / f"{file}.md").read_text()
        assert all(place in text for place in wanted), (file, sorted(p for p in wanted if p not in text))
