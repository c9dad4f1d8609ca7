"""Test set-up: the Triton interpreter on CPU, NaN-poisoned kernel outputs, seeded randomness, and the two tiers.

Tiers. `python3 dev.py test` is the quick tier: every test not marked ``slow``, notebook 01 under nbval, hypothesis's
``quick`` profile. `python3 dev.py test --full` (pytest's ``--full``, or SEQMIX_FULL=1) runs everything, every notebook,
with the ``full`` profile; CI runs it. ``-m slow`` runs the slow tests alone.

A test is ``slow`` by rule, not by name (slow_reason): when its code (the test function, the fixtures it uses and the
helpers of its module that these call) runs the AOT build, builds C into a fresh cache, spawns a command
(``[sys.executable, "-m", ...]``), starts a server, drives a browser or trains (a ``--quick`` run); or when it is a
notebook other than QUICK_NOTEBOOK. Where no rule can see it (the Triton interpreter on long shapes), the test says
``@pytest.mark.slow`` itself. A guard checks the rules at run time: a test not marked slow that starts the C compiler
or the AOT build fails (spawned_build); and the quick tier lists the tests that took over SLOW_SECONDS unmarked.
"""
import ast
import inspect
import os
import re
import sys
import textwrap
from functools import lru_cache

# The peers' torch.compile'd helpers (fla's activations and token shift) run eagerly in the tests: on a CPU, inductor
# builds C++ (a compiler with -shared) on a cold cache, so that a test's time, and the guard below, would depend on
# what an earlier run left in that cache (a fresh machine failed four fla tests as "builds C but is not marked slow").
# The project itself compiles nothing with torch.compile. Set before torch._dynamo is first imported (it reads this
# once); the commands the tests start inherit it.
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import seqmix  # noqa: E402

# The interpreter must be chosen before triton is first imported (the kernels import it).
seqmix.use_interpreter_without_gpu()

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from seqmix.kernels.testing import gpu_like_math, poisoned_outputs  # noqa: E402

settings.register_profile("quick", max_examples=5, deadline=None)
settings.register_profile("full", max_examples=25, deadline=None)

QUICK_NOTEBOOK = "01_softmax_attention.ipynb"   # the shortest (19 s): the quick tier still executes one notebook
SLOW_SECONDS = 5.0

# (pattern in a test's code, why that makes it slow)
SLOW_CODE = (
    (re.compile(r'"-m",\s*"seqmix\.kernels\.aot"'), "runs the AOT build"),
    (re.compile(r"\bSEQMIX_CACHE\b|\b_build\("), "builds C into a fresh cache"),
    (re.compile(r'\[sys\.executable,\s*"-m"'), "spawns a command"),
    (re.compile(r"subprocess\.Popen\("), "starts a server"),
    (re.compile(r"\bplaywright\b"), "drives a browser"),
    (re.compile(r"--quick\b|\bQUICK\b|\bquick=True"), "trains"),
)


def pytest_addoption(parser):
    parser.addoption("--gpu-math", action="store_true",
                     help="the Triton interpreter with a GPU's fp32 exp, division and dots (testing.gpu_like_math)")
    parser.addoption("--full", action="store_true",
                     help="the full tier: the slow tests too (compiles, trains, browser, notebooks, long shapes)")
    parser.addoption("--extra-op", action="append", default=[], metavar="MODULE:SPEC",
                     help="register this OpSpec for the whole run, before collection, so that every test that "
                          "iterates the registry runs it too (helpers.ema_op:SPEC, the made-up op of "
                          "docs/architecture.md)")


def full_tier(config) -> bool:
    return config.getoption("--full") or os.environ.get("SEQMIX_FULL") == "1" or "slow" in (config.option.markexpr
                                                                                           or "")


def pytest_configure(config):
    settings.load_profile("full" if full_tier(config) else "quick")
    from seqmix.kernels import registry
    for where in config.getoption("--extra-op"):         # before collection: parametrized modules see the op too
        registry.register(registry.load(where))
    # The project's C libraries are built (or found in the cache) once, before any test: a test that then starts the
    # compiler builds C of its own, which makes it slow (the guard below).
    from seqmix.kernels import native
    if not native.unavailable_reason():
        from seqmix.models import decode
        try:
            for sources in decode.every_step():
                decode.library(sources)
        except native.NativeUnavailable:      # the tests of the models' C steps say why
            pass


# ------------------------------------------------------------------------------------------------- slow, by rule

def _source(obj) -> str:
    try:
        return textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError):
        return ""


@lru_cache(maxsize=None)
def _module_functions(module) -> dict:
    return {name: fn for name, fn in vars(module).items() if inspect.isfunction(fn) and fn.__module__ ==
            module.__name__}


@lru_cache(maxsize=None)
def _code_of(function, module, fixtures: tuple) -> str:
    """The test's own code, its fixtures' (also those asked for by name, getfixturevalue), and that of the module's
    functions these call by name, transitively."""
    texts, seen = [], set()
    pending = [function, *fixtures]
    helpers = _module_functions(module) if module else {}
    while pending:
        fn = pending.pop()
        if fn in seen:
            continue
        seen.add(fn)
        text = _source(fn)
        texts.append(text)
        try:
            names = {node.id for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Name)}
        except SyntaxError:
            names = set()
        pending += [helpers[name] for name in names if name in helpers]
    return "\n".join(texts)


def slow_reason(item) -> str | None:
    """Why a collected test is slow by rule, or None."""
    if item.nodeid.endswith(".ipynb") or ".ipynb::" in item.nodeid:
        return None if item.path.name == QUICK_NOTEBOOK else "executes a notebook"
    function = getattr(item, "function", None)
    if function is None:
        return None
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs if info else {}
    fixtures = tuple(d.func for defs in definitions.values() for d in defs)
    code = _code_of(function, getattr(item, "module", None), fixtures)
    asked = set(re.findall(r'getfixturevalue\("(\w+)"\)', code))   # fixtures asked for by name
    manager = item.session._fixturemanager
    for name in asked:
        code += "\n" + "\n".join(_source(d.func) for d in manager.getfixturedefs(name, item) or ())
    return next((why for pattern, why in SLOW_CODE if pattern.search(code)), None)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        why = slow_reason(item)
        if why and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow(reason=why))
    if full_tier(config):
        return
    quick = [item for item in items if not item.get_closest_marker("slow")]
    left = [item for item in items if item.get_closest_marker("slow")]
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = quick
        config._seqmix_slow_left = len(left)


def pytest_report_header(config):
    if full_tier(config):
        return "seqmix: the full tier (slow tests, every notebook, hypothesis profile 'full')"
    return ("seqmix: the quick tier (slow tests deselected; python3 dev.py test --full runs everything), "
            "hypothesis profile 'quick'")


# ------------------------------------------------------------------------------------- the guard, at run time

def spawned_build(args) -> str | None:
    """What a started process does that only a slow test may: 'builds C' (a compiler called with -shared) or 'runs
    the AOT build' (python -m seqmix.kernels.aot). ``args``: the process's argument list (or command string)."""
    argv = args.split() if isinstance(args, (str, bytes)) else [os.fsdecode(a) for a in args]
    if "-shared" in argv:
        return "builds C"
    if "seqmix.kernels.aot" in argv and "-m" in argv:
        return "runs the AOT build"
    return None


_STARTED: list = []   # the argument lists of the processes started since the current test phase began


def _audit(event, args):
    if event == "subprocess.Popen":
        _STARTED.append(args[1])


sys.addaudithook(_audit)


def check_not_slow(item, started) -> None:
    """Fail a test not marked slow that started a C build or the AOT build."""
    builds = sorted({what for args in started if (what := spawned_build(args))})
    if builds and not item.get_closest_marker("slow"):
        pytest.fail(f"{item.nodeid} {' and '.join(builds)} but is not marked slow: give it code that a rule of "
                    "tests/conftest.py (SLOW_CODE) sees, or @pytest.mark.slow", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    _STARTED.clear()
    result = yield
    check_not_slow(item, _STARTED)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    _STARTED.clear()
    result = yield
    check_not_slow(item, _STARTED)
    return result


def pytest_terminal_summary(terminalreporter, config):
    if full_tier(config):
        return
    left = getattr(config, "_seqmix_slow_left", 0)
    if left:
        terminalreporter.write_line(f"seqmix quick tier: {left} slow tests left for python3 dev.py test --full")
    long = [(r.duration, r.nodeid) for r in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get(
        "failed", []) if r.when == "call" and r.duration > SLOW_SECONDS]
    for duration, nodeid in sorted(long, reverse=True):
        terminalreporter.write_line(f"seqmix quick tier: {nodeid} took {duration:.1f} s unmarked (rule or "
                                    "@pytest.mark.slow?)")


# ----------------------------------------------------------------------------------------------------- fixtures

@pytest.fixture(autouse=True)
def gpu_math(request):
    """With --gpu-math, every test runs with the interpreter's exp, division and dots rounded as on a GPU (at worst)."""
    if request.config.getoption("--gpu-math"):
        with gpu_like_math():
            yield
    else:
        yield


@pytest.fixture(autouse=True)
def poison_outputs():
    """Every kernel output buffer starts as NaN, so that an element a kernel skips fails the test."""
    with poisoned_outputs():
        yield


@pytest.fixture
def rng():
    return np.random.default_rng(20261122)
