"""The two tiers of tests/conftest.py: the rules that mark a test slow by what its code does, and the guard that fails
a test not marked slow that starts a C build or the AOT build. (The code samples below are split where whole they
would match a rule, which reads this file's own tests too.)"""
import importlib.util
import subprocess
import sys
from pathlib import Path

import conftest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[2]


def reason(code: str):
    return next((why for pattern, why in conftest.SLOW_CODE if pattern.search(code)), None)


def test_the_rules_read_what_a_test_does():
    said = {
        'subprocess.run([sys.executable, "' + '-m", "seqmix.kernels.aot", "--asm", str(asm)])': "runs the AOT build",
        'monkeypatch.setenv("SEQMIX' + '_CACHE", str(tmp_path))': "builds C into a fresh cache",
        "path = native._bu" + "ild(native.compiler(), sources)": "builds C into a fresh cache",
        'subprocess.run([sys.executable, "' + '-m", "seqmix.generate", path])': "spawns a command",
        "process = subprocess.Pop" + "en(command, cwd=ROOT)": "starts a server",
        "from play" + "wright.sync_api import sync_playwright": "drives a browser",
        'selective_copy.main(["--qu' + 'ick", "--out", str(tmp_path)])': "trains",
        "lm.run(lm.QU" + "ICK, out, progress=False)": "trains",
    }
    for code, why in said.items():
        assert reason(code) == why, code
    for quick in ('subprocess.run([sys.executable, "-I", "-c", script])', "y, s = wkv7(r, w, k, v, a, b)",
                  "quickly = True", 'run(["cc", "--version"])'):
        assert reason(quick) is None, quick


def test_a_test_is_read_with_its_fixtures_and_the_helpers_it_calls():
    """The code a rule reads: the test, the fixtures it uses, and the module's functions these call, transitively
    (test_text's CLI tests spawn through run_cli)."""
    spec = importlib.util.spec_from_file_location("test_text", Path(__file__).parents[1] / "models" / "test_text.py")
    test_text = sys.modules.get("test_text") or importlib.util.module_from_spec(spec)
    if "test_text" not in sys.modules:
        spec.loader.exec_module(test_text)
    code = conftest._code_of(test_text.test_command_streams_what_the_python_api_streams, test_text, ())
    assert "def run_cli" in code and reason(code) == "spawns a command"
    assert reason(conftest._code_of(test_text.test_world_tokenizer_round_trip, test_text, ())) is None


class _Item:
    nodeid = "tests/test_made_up.py::test_it"

    def __init__(self, slow: bool):
        self.slow = slow

    def get_closest_marker(self, name):
        return object() if self.slow and name == "slow" else None


def test_the_guard_fails_an_unmarked_test_that_builds_c_or_runs_the_aot_build():
    compile_c = ["cc", "-O3", "-shared", "-fPIC", "tiny.c", "-o", "tiny.so"]
    aot = [sys.executable] + ["-m", "seqmix.kernels." + "aot", "--asm", "out"]
    assert conftest.spawned_build(compile_c) == "builds C"
    assert conftest.spawned_build(aot) == "runs the AOT build"
    for fine in (["cc", "--version"], [sys.executable, "-c", "print(1)"], "git status"):
        assert conftest.spawned_build(fine) is None
    for started in ([compile_c], [aot], [["cc", "--version"], compile_c]):
        try:
            conftest.check_not_slow(_Item(slow=False), started)
        except conftest.pytest.fail.Exception as e:
            assert "is not marked slow" in str(e)
        else:
            raise AssertionError(f"the guard let {started} pass unmarked")
        conftest.check_not_slow(_Item(slow=True), started)
    conftest.check_not_slow(_Item(slow=False), [["cc", "--version"]])


def test_the_guard_sees_the_processes_a_test_starts():
    subprocess.run(["true", "seqmix-tier-probe"], check=True)
    assert ["true", "seqmix-tier-probe"] in [list(args) for args in conftest._STARTED]


def test_the_tier_picks_the_hypothesis_profile_and_the_notebook(request):
    full = conftest.full_tier(request.config)
    assert settings.default.max_examples == (25 if full else 5)
    assert (ROOT / "notebooks" / conftest.QUICK_NOTEBOOK).is_file()


def test_ci_runs_the_full_tier_and_the_readme_shows_both():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "python3 dev.py test --full" in ci
    assert "python3 dev.py test --full" in readme and "python3 dev.py test " in readme
