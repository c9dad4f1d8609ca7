"""The exercises as a student meets them in the Lab (issue 44): each coding exercise is a stub to fill, a visible
check that says "not attempted yet" on the stub, and a collapsed solution that runs the same check ("correct");
a collapsed cell's first line, which the Lab shows, gives nothing away."""
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
IPYNB = sorted(NOTEBOOKS.glob("*.ipynb"))
STUB = re.compile(r"# Exercise (\d+):")
RUNS_CHECK = re.compile(r'exercise\("Exercise (\d+)"')
MIN_PER_NOTEBOOK, MIN_IN_ALL = 2, 12


def _cells(path):
    cells = json.loads(path.read_text())["cells"]
    for cell in cells:
        cell["text"] = "".join(cell["source"])
        cell["shown"] = "".join("".join(o.get("text", "")) for o in cell.get("outputs", ()))
        cell["hidden"] = bool(cell["metadata"].get("jupyter", {}).get("source_hidden"))
    return cells


def coding_exercises(path) -> dict:
    """{N: (stub, check, solution)} of the notebook's coding exercises (a cell missing: None)."""
    found = {}
    for i, cell in enumerate(cells := _cells(path)):
        stub = STUB.match(cell["text"]) if cell["cell_type"] == "code" and not cell["hidden"] else None
        if stub and "raise NotImplementedError" in cell["text"]:
            n = stub.group(1)
            later = [c for c in cells[i + 1:] if c["cell_type"] == "code" and RUNS_CHECK.search(c["text"])
                     and RUNS_CHECK.search(c["text"]).group(1) == n]
            check = next((c for c in later if not c["hidden"]), None)
            solution = next((c for c in later if c["hidden"]), None)
            found[n] = (cell, check, solution)
    return found


@pytest.mark.parametrize("path", IPYNB, ids=lambda p: p.stem)
def test_every_solution_opens_with_a_line_that_gives_nothing_away(path):
    for i, cell in enumerate(_cells(path)):
        if cell["hidden"]:
            assert cell["text"].splitlines()[0].strip() == "# Solution", \
                f"{path.stem} cell {i}: a collapsed cell's first line is {cell['text'].splitlines()[0]!r}"


@pytest.mark.parametrize("path", IPYNB, ids=lambda p: p.stem)
def test_coding_exercises_have_a_stub_a_visible_check_and_a_collapsed_solution(path):
    exercises = coding_exercises(path)
    assert len(exercises) >= MIN_PER_NOTEBOOK, f"{path.stem}: {len(exercises)} coding exercise(s)"
    for n, (stub, check, solution) in exercises.items():
        assert check is not None, f"{path.stem} exercise {n}: no visible cell runs its check"
        assert solution is not None, f"{path.stem} exercise {n}: no collapsed solution runs its check"
        assert "nbval-check-output" in check["metadata"].get("tags", ()), f"{path.stem} exercise {n}: check untagged"
        assert "nbval-check-output" in solution["metadata"].get("tags", ()), \
            f"{path.stem} exercise {n}: solution untagged"
        assert f"Exercise {n}: not attempted yet" in check["shown"], \
            f"{path.stem} exercise {n}: the stored check does not say 'not attempted yet' on the stub"
        assert f"Exercise {n}: correct" in solution["shown"], \
            f"{path.stem} exercise {n}: the stored solution does not pass its check"


def test_the_course_has_enough_coding_exercises():
    total = sum(len(coding_exercises(p)) for p in IPYNB)
    assert total >= MIN_IN_ALL, f"{total} coding exercises in all"
