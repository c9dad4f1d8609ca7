"""seqmix.conformance: the float64 reference battery, for kernels other people write.

    python -m seqmix.conformance wkv4 my_package.kernels:my_wkv4

runs every check of an op on a function with the signature and conventions of ``seqmix.kernels.<op>`` (or, with
``--adapter``, those of fla, BlinkDL or transformers) and prints one row per compared quantity. In Python:

    from seqmix.conformance import Options, run
    report = run("wkv4", my_wkv4, Options(dtypes=("fp32",)))
    assert report.ok, report.failed_checks

and in a pytest suite: ``@pytest.mark.parametrize("check", pytest_cases("wkv4", my_wkv4))``, then ``check()``.
conformance/README.md documents the checks, the adapters, the CLI's exit codes and the JSON schema.
"""

# Imported by its bare folder name (a checkout's root first on sys.path): the installed package of that name takes
# its place (seqmix.checkout says why). Without seqmix, or copied into another project, the folder stays itself.
if __name__ == "conformance":
    try:
        from seqmix.checkout import step_aside
    except ImportError:
        pass
    else:
        step_aside(__name__, __file__)
import importlib

# name -> the module that defines it, imported on first use: ``python -m seqmix.conformance`` must be able to turn
# on Triton's interpreter (on a machine without a GPU) before anything imports triton.
_LAZY = {**{name: "seqmix.conformance.battery" for name in
            ("DTYPES", "PARTS", "Check", "Options", "Report", "Row", "plan", "run", "run_check")},
         "OPS": "seqmix.kernels.declarations", "ADAPTERS": "seqmix.conformance.adapters"}

__all__ = [*_LAZY, "pytest_cases"]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'seqmix.conformance' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def pytest_cases(op: str, fn, **options) -> list:
    """The checks of ``op`` on ``fn`` as pytest parameters, one per check, with readable ids
    ("wkv4/shapes/T=37,B=2,C=6,state/fp32"); each value is a function that runs its check and raises
    AssertionError naming every quantity out of budget.

    Args:
        op: one of OPS.
        fn: the function under test (or an adapter's wrapper of it).
        **options: fields of Options (dtypes, device, grad, state, parts, head_sizes, max_len, only, skip, seed,
            strict).
    Returns:
        a list of pytest.param.
    """
    import pytest

    from .battery import Options, plan

    opts = Options.for_function(fn, **options)
    checks, _ = plan(op, opts)
    return [pytest.param(_Assertion(op, fn, check, opts), id=check.id) for check in checks]


class _Assertion:
    """Runs one check and raises AssertionError listing the rows out of budget."""

    def __init__(self, op, fn, check, options):
        self.op, self.fn, self.check, self.options = op, fn, check, options

    def __call__(self):
        from .battery import run_check

        failed = [r for r in run_check(self.op, self.fn, self.check, self.options) if not r.passed]
        if failed:
            raise AssertionError(f"{self.check.id}:\n" + "\n".join(
                f"  {r.what}: " + (f"relative RMS error {r.error:.2e} > budget {r.budget:.0e}" if r.error is not None
                                   else r.message) for r in failed))

    def __repr__(self):
        return self.check.id
