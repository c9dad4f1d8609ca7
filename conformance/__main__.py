"""python -m seqmix.conformance OP MODULE:FUNCTION [options]: the reference battery on someone else's kernel.

Prints one line per compared quantity (check, what, shape, dtype, relative RMS error, max abs error, budget,
result), a progress bar on stderr while it runs, and a summary line. MODULE is a module on the Python path
(``my_package.kernels``) or a file (``my_wkv4.py``).

Exit codes:
    0  every check ran and every quantity was within its budget (the design's under --strict, else the one its
       inputs condition where the op has a conditioning rule)
    1  at least one quantity was out of budget, non-finite, of the wrong shape, or the function raised
    2  usage error: unknown op or adapter, an adapter for another op, MODULE:FUNCTION not importable (or raising
       as it is imported), an option out of range, a --json path in a folder that does not exist
    3  the options left no check to run
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path

from ..kernels import use_interpreter_without_gpu

use_interpreter_without_gpu()   # a Triton kernel on CPU tensors needs it before anything imports triton

import torch  # noqa: E402

from .adapters import ADAPTERS  # noqa: E402
from .battery import DTYPES, PARTS, Options, run  # noqa: E402
from ..kernels.declarations import OPS  # noqa: E402
from ..models.io import write_text_atomically  # noqa: E402
from .report import HEADER, as_json, format_row, progress, summary  # noqa: E402

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOTHING_RAN = 0, 1, 2, 3
PROG = "python -m seqmix.conformance"


def usage_error(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return EXIT_USAGE


def load_function(spec: str):
    """MODULE:FUNCTION, MODULE a dotted module name (from the current directory too) or a .py file."""
    module_name, sep, name = spec.rpartition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"expected MODULE:FUNCTION, got {spec!r}")
    if module_name.endswith(".py"):
        path = Path(module_name)
        loader = importlib.util.spec_from_file_location(path.stem, path)
        if loader is None or not path.is_file():
            raise ValueError(f"no such file: {module_name}")
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
    else:
        sys.path.insert(0, str(Path.cwd()))
        module = importlib.import_module(module_name)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{module_name} has no function {name!r}")
    return fn


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("op", choices=sorted(OPS), help="the op the function implements")
    p.add_argument("function", help="MODULE:FUNCTION (or path/to/file.py:FUNCTION)")
    p.add_argument("--adapter", choices=sorted(ADAPTERS),
                   help="the function's convention, if not seqmix's: " + "; ".join(
                       f"{n} ({a.op}): {a.summary}" for n, a in sorted(ADAPTERS.items())))
    p.add_argument("--device", help="device of the inputs the function gets (default cpu)")
    p.add_argument("--no-grad", dest="grad", action="store_false", default=None,
                   help="a forward-only kernel: do not check gradients")
    p.add_argument("--no-state", dest="state", action="store_false", default=None,
                   help="the function takes no state= (cases drop their initial state; no split check)")
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES), help="input dtypes (default fp32 fp16 bf16)")
    p.add_argument("--parts", nargs="+", choices=PARTS, help="which groups of checks (default all)")
    p.add_argument("--head-sizes", nargs="+", type=int, help="the head sizes the kernel takes (d, C or N)")
    p.add_argument("--max-len", type=int, help="skip cases longer than this many tokens")
    p.add_argument("--only", nargs="+", help="run only checks whose id contains one of these")
    p.add_argument("--skip", nargs="+", help="leave out checks whose id contains one of these")
    p.add_argument("--seed", type=int, help="seed of the inputs (default 0)")
    p.add_argument("--strict", action="store_true", default=None,
                   help="judge every quantity at the design's fixed budget, also where the op's conditioning rule "
                        "allows more at the inputs (the default grade; conformance/README.md)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON (conformance/README.md)")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    # Checked before the run: a report that cannot be written would otherwise fail after all the work.
    if args.json and not Path(args.json).parent.is_dir():
        return usage_error(f"--json: no such folder: {Path(args.json).parent}")
    if args.json and Path(args.json).is_dir():
        return usage_error(f"--json {args.json}: is a folder, not a file name")
    if args.device is not None:
        try:                              # a device this torch cannot use would fail every check as the kernel's
            torch.empty(1, device=args.device)
        except (RuntimeError, AssertionError) as e:
            return usage_error(f"--device {args.device}: not a device this torch can use ({str(e).splitlines()[0]})")
    try:
        fn = load_function(args.function)
    except (ValueError, ImportError, OSError, SyntaxError) as e:
        return usage_error(f"cannot load {args.function}: {e}")
    except (Exception, SystemExit) as e:                        # the module itself raised as it was imported
        return usage_error(f"cannot load {args.function}: {type(e).__name__}: {e}")
    if args.adapter:
        adapter = ADAPTERS[args.adapter]
        if adapter.op != args.op:
            return usage_error(f"adapter {args.adapter} is for {adapter.op}, not {args.op}")
        fn = adapter.wrap(fn)
    given = dict(device=args.device, grad=args.grad, state=args.state, seed=args.seed, max_len=args.max_len,
                 strict=args.strict,
                 **{k: tuple(v) for k, v in dict(dtypes=args.dtypes, parts=args.parts, head_sizes=args.head_sizes,
                                                only=args.only, skip=args.skip).items() if v})
    try:
        options = Options.for_function(fn, **{k: v for k, v in given.items() if v is not None})
    except ValueError as e:                                     # an option out of range (--head-sizes 0, --seed -1)
        return usage_error(str(e))
    bar = sys.stderr.isatty()
    print(HEADER, flush=True)

    def show(i, total, check, rows):
        if bar:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
        if rows is None and bar:
            print(progress(i, total, check.id), end="", file=sys.stderr, flush=True)
        for row in rows or ():
            print(format_row(row), flush=True)

    report = run(args.op, fn, options, on_check=show)
    if bar:
        print("\r\033[K", end="", file=sys.stderr, flush=True)
    print(summary(report), flush=True)
    if args.json:
        write_text_atomically(args.json, as_json(report, args.function, args.adapter) + "\n")
    if not report.checks:
        return EXIT_NOTHING_RAN
    return EXIT_FAILED if report.failed_checks else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
