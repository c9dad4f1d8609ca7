"""No function in the package runs over 80 lines: long functions hide where one step ends and the next begins, so
they are split into named helpers that say what each part does (issue 27; the architecture review counted them).
Python is measured with ast (from the `def` line, or its first decorator, to the last line of the body); C with a
brace-matching scan of kernels/native.c, the ops' loops (kernels/*/*.c) and the models' steps (models/*/*.c) (from the
line of the name to the closing brace).
The few functions kept whole on purpose are in ALLOWED, each with its reason.

Run as a script (`python tests/repository/test_function_length.py`) to list every function over the limit."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 80
PY_FOLDERS = ("reference", "kernels", "models", "conformance", "benchmarks", "experiments", "src")
C_FILES = ("kernels/native.c", "kernels/*/*.c", "models/*/*.c")

# "path:function" -> why it stays whole. Empty today: the C loops were split into static always-inline helpers (the
# same floating-point instructions, outputs bit-identical) and the Triton kernels into @triton.jit helpers, which
# Triton inlines (the PTX of wkv7_chunked_bwd_kernel stayed the same). A kernel that cannot be split without
# changing its code goes here, with that reason.
ALLOWED = {
}


def _skipped(rel):
    parts = Path(rel).parts
    return (rel.startswith(("benchmarks/results/", "experiments/results/"))
            or any(part.startswith(".") for part in parts))     # .ipynb_checkpoints copies of old modules


def python_functions():
    """Yields (path, qualified name, first line, number of lines) for every function and method."""
    for folder in PY_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if _skipped(rel):
                continue
            tree = ast.parse(path.read_text(), filename=rel)
            yield from _walk(rel, tree, "")


def _walk(rel, node, prefix):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = prefix + child.name
            if not isinstance(child, ast.ClassDef):
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                yield rel, name, first, child.end_lineno - first + 1
            yield from _walk(rel, child, name + ".")
        else:
            yield from _walk(rel, child, prefix)


def _blank_comments_and_strings(text):
    """The C source with comments, string and character literals replaced by spaces (newlines kept)."""
    pattern = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def c_functions():
    """Yields (path, name, first line, number of lines) for every function definition: a `{` at file scope whose
    text before it ends with `name(...)` (so not a struct, an enum or an initializer)."""
    for pattern in C_FILES:
        for path in sorted(ROOT.glob(pattern)):
            rel = path.relative_to(ROOT).as_posix()
            text = _blank_comments_and_strings(path.read_text())
            depth, start = 0, 0
            for i, ch in enumerate(text):
                if ch == "{":
                    if depth == 0:
                        head = text[start:i]
                        match = re.search(r"(\w+)\s*\((?:[^()]|\([^()]*\))*\)\s*$", head)
                        opening = (i, match) if match and not re.search(r"=\s*$", head) else None
                    depth += 1
                elif ch == "}":
                    depth -= 1
                    if depth == 0:
                        if opening:
                            name_at = start + opening[1].start(1)
                            first = text.count("\n", 0, name_at) + 1
                            yield rel, opening[1].group(1), first, text.count("\n", 0, i) + 2 - first
                        start = i + 1
                elif ch == ";" and depth == 0:
                    start = i + 1


def too_long():
    found = [(f"{rel}:{name}", first, n) for rel, name, first, n in python_functions() if n > LIMIT]
    found += [(f"{rel}:{name}", first, n) for rel, name, first, n in c_functions() if n > LIMIT]
    return found


def test_the_scans_find_functions_in_both_languages():
    py, c = list(python_functions()), list(c_functions())
    assert any(name == "selective_scan" and rel == "reference/ssm.py" for rel, name, _, _ in py)
    assert any(name == "selective_scan_backward" and rel == "kernels/ssm/ssm.c" for rel, name, _, _ in c)
    assert any(name == "rwkv7_run" for rel, name, _, _ in c)
    assert all(n >= 1 for *_, n in py + c)


def test_no_function_runs_over_80_lines():
    found = [f"{where} ({n} lines, from line {first})" for where, first, n in too_long() if where not in ALLOWED]
    assert not found, (f"functions over {LIMIT} lines: split them where a reader would (named helpers), or add "
                       "them to ALLOWED with the reason: " + ", ".join(found))


def test_the_allow_list_names_only_long_functions():
    long = {where for where, _, _ in too_long()}
    stale = [where for where in ALLOWED if where not in long]
    assert not stale, f"ALLOWED names functions no longer over {LIMIT} lines (drop them): {stale}"


if __name__ == "__main__":
    for where, first, n in sorted(too_long(), key=lambda row: -row[2]):
        print(f"{n:4d}  {where}  (line {first}){'  [allowed]' if where in ALLOWED else ''}")
