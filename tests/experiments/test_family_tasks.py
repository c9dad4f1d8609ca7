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
    """A control row below its rule makes the verdict False (the rule reads the rows, it is not hard-wired)."""
    results = Results(quick_family, family_tasks.NAME)
    row = results.find(phase="test", arch=state_tracking.CONTROL[0])
    row[f"accuracy_past_train_at_{4 * QUICK.tracking.train_len}"] = 0.5
    assert family_tasks.control_holds(results, QUICK, family_tasks.PARITY) is False


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
    assert ("MQAR", 4, "attention") in cells and ("parity", None, "rwkv7_wide") in cells
    for task, pairs in (("parity", None), ("MQAR", 4)):
        for arch in family_tasks.CLAIMS[task]:
            rate = family_tasks.RWKV7_RATE[pairs or task]
            assert {j.seed for j in jobs if (j.task, j.pairs, j.arch, j.lr) == (task, pairs, arch, rate)} == {0, 1, 2}
    assert len(set(jobs)) == len(jobs)
