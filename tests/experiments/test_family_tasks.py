"""experiments.family_tasks in its reduced setting: every job has its row, measured as recall's and state_tracking's
rows are, the controls hold, the report and figure are written, and a rerun trains nothing; the full plan is the
issue's (every rung on MQAR N = 4 and 8 and on parity, the controls, three seeds of the claims' cells)."""
import pytest

from seqmix.experiments import family_tasks, rungs, state_tracking
from seqmix.experiments.records import Results
from seqmix.experiments.training import Run

QUICK = family_tasks.QUICK


@pytest.fixture(scope="module")
def quick_family(tmp_path_factory):
    out = tmp_path_factory.mktemp("family")
    family_tasks.run(QUICK, out, progress=False)
    return out


def test_family_quick_rows_and_controls(quick_family):
    results = Results(quick_family, family_tasks.NAME)
    rows = results.select(phase="test")
    assert [(r["task"], r["arch"], r["seed"], r["lr"]) for r in rows] == [(j.task, j.arch, j.seed, j.lr)
                                                                          for j in QUICK.jobs]
    for r in rows:
        assert r["history"][-1][3] < r["history"][0][3]                # learned something
        assert {"commit", "cpu", "threads"} <= set(r["env"]) and r["train_cpu_seconds"] > 0
        if r["task"] == family_tasks.MQAR:
            assert r["test_queries"] == QUICK.recall.test_size * r["pairs"] and r["width"] == QUICK.width
        else:
            assert f"accuracy_past_train_at_{QUICK.tracking.test_lens[0]}" in r
    for task in (family_tasks.MQAR, family_tasks.PARITY):
        assert family_tasks.control_holds(results, QUICK, task) is True
    assert family_tasks.pending(results, QUICK) == []
    text = (quick_family / "family_tasks.md").read_text()
    assert text.count("**Positive control") == 2 and "holds" in text and "Nothing: every job" in text
    assert (quick_family / "family_tasks.png").stat().st_size > 1000


def test_family_control_rule_can_fail(quick_family):
    """A control row below its rule leaves the verdict open until its long run (4x the steps, the warmup kept) has
    run; that run's row decides it, and the report names the seed (the rule reads the rows, it is not hard-wired)."""
    results = Results(quick_family, family_tasks.NAME)
    row = results.find(phase="test", arch=state_tracking.CONTROL[0])
    far = f"accuracy_past_train_at_{4 * QUICK.tracking.train_len}"
    row[far] = 0.5
    assert family_tasks.control_holds(results, QUICK, family_tasks.PARITY) is None
    results.rows.append({**row, "phase": "long", far: 0.6, "warmup_steps": QUICK.tracking.budget.warmup_steps})
    assert family_tasks.control_holds(results, QUICK, family_tasks.PARITY) is False
    assert "seed 0 not even with 4x" in family_tasks._control_note(results, QUICK, family_tasks.PARITY, None)
    results.rows[-1][far] = 0.95
    assert family_tasks.control_holds(results, QUICK, family_tasks.PARITY) is True
    assert "seed 0 only with 4x" in family_tasks._control_note(results, QUICK, family_tasks.PARITY, None)
    assert family_tasks.control_holds(results, QUICK, family_tasks.MQAR) is True       # the other task untouched


def test_a_missed_control_seed_trains_4x_longer_with_its_warmup(quick_family, tmp_path, monkeypatch):
    """long_runs: only a control row that missed its rule trains again, LONG_FACTOR times the steps with the
    warmup kept in steps, and its row (phase "long") records that warmup; a second call trains nothing."""
    import shutil
    shutil.copy(quick_family / "family_tasks.json", tmp_path / "family_tasks.json")
    results = Results(tmp_path, family_tasks.NAME)
    far = f"accuracy_past_train_at_{4 * QUICK.tracking.train_len}"
    row = results.find(phase="test", arch=state_tracking.CONTROL[0])
    row[far] = 0.5
    trained = []

    def train_to(run, steps, progress=True):
        trained.append((run.label, steps, run.budget.warmup_steps))
        return run
    monkeypatch.setattr(Run, "train_to", train_to)
    monkeypatch.setattr(family_tasks, "_measure", lambda setup, job, run: {"test_accuracy": 1.0, far: 0.97})
    monkeypatch.setattr(Run, "summary", lambda run: {"lr": run.lr, "steps": run.budget.steps, "train_cpu_seconds": 1.0})
    family_tasks.long_runs(results, QUICK, tmp_path, {}, progress=False)
    budget = QUICK.tracking.budget
    assert trained == [(trained[0][0], family_tasks.LONG_FACTOR * budget.steps, budget.warmup_steps)]
    assert state_tracking.CONTROL[0] in trained[0][0]
    long = results.find(phase="long", arch=state_tracking.CONTROL[0])
    assert long["warmup_steps"] == budget.warmup_steps and long["steps"] == family_tasks.LONG_FACTOR * budget.steps
    family_tasks.long_runs(results, QUICK, tmp_path, {}, progress=False)
    assert len(trained) == 1


def test_family_rerun_trains_nothing(quick_family, monkeypatch):
    before = (quick_family / "family_tasks.json").read_text()
    monkeypatch.setattr(Run, "train_to", lambda *a, **k: pytest.fail("a rerun trained again"))
    family_tasks.run(QUICK, quick_family, progress=False)
    assert (quick_family / "family_tasks.json").read_text() == before


def test_the_full_plan_covers_the_issue():
    jobs = family_tasks.FULL.jobs
    cells = {(j.task, j.pairs, j.arch) for j in jobs}
    for arch in rungs.RUNGS:
        assert {("MQAR", 4, arch), ("MQAR", 8, arch), ("parity", None, arch)} <= cells
    for task, pairs, control in (("parity", None, "rwkv7_wide"), ("MQAR", 4, "attention_zoology"),
                                 ("MQAR", 8, "attention_zoology")):
        assert {j.seed for j in jobs if (j.task, j.pairs, j.arch) == (task, pairs, control)} == {0, 1, 2}
        for arch in family_tasks.CLAIMS[task]:
            rate = family_tasks.RWKV7_RATE[pairs or task]
            assert {j.seed for j in jobs if (j.task, j.pairs, j.arch, j.lr) == (task, pairs, arch, rate)} == {0, 1, 2}
    assert jobs[0] == family_tasks.Job("parity", "rwkv7_wide", family_tasks.CONTROL_RATE["parity"])
    assert len(set(jobs)) == len(jobs)
