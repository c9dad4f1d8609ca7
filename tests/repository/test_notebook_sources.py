"""Each notebook is paired with a jupytext percent-format source (notebooks/sources/NN_name.py), the text a review
reads; the executed .ipynb is what nbval runs and JupyterLab opens. The two must hold the same cells.

After editing a .py source: `python3 dev.py notebooks NN_name` syncs the pair and executes the notebook."""
import json
from pathlib import Path

import jupytext
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
SOURCES = NOTEBOOKS / "sources"            # pyproject.toml's [tool.jupytext] pairing: out of the Lab's file list
IPYNB = sorted(NOTEBOOKS.glob("*.ipynb"))


def source_of(path):
    return SOURCES / f"{path.stem}.py"


def cells(notebook):
    """(kind, source, tags) of every cell: what the pair must agree on (outputs live in the .ipynb only)."""
    return [(c.cell_type, c.source.strip(), tuple(c.metadata.get("tags", ()))) for c in notebook.cells]


def test_every_notebook_has_a_source_and_every_source_a_notebook():
    assert IPYNB
    assert {p.stem for p in IPYNB} == {p.stem for p in SOURCES.glob("*.py")}
    assert not list(NOTEBOOKS.glob("*.py")), "a .py beside the notebooks: sources go in notebooks/sources/"


@pytest.mark.parametrize("path", IPYNB, ids=lambda p: p.stem)
def test_notebook_and_source_hold_the_same_cells(path):
    ipynb = cells(jupytext.read(path))
    source = cells(jupytext.read(source_of(path)))
    for i, (a, b) in enumerate(zip(ipynb, source)):
        assert a == b, f"cell {i} differs between {path.name} and its .py: run python3 dev.py notebooks {path.stem}"
    assert len(ipynb) == len(source), f"{path.name} and its .py have {len(ipynb)} and {len(source)} cells"


@pytest.mark.parametrize("path", IPYNB, ids=lambda p: p.stem)
def test_checked_cells_are_tagged_not_commented(path):
    """nbval's checks are cell tags (nbval-check-output), not comments a student reads as code."""
    notebook = jupytext.read(path)
    assert not [c for c in notebook.cells if "NBVAL" in c.source]
    assert any("nbval-check-output" in c.metadata.get("tags", ()) for c in notebook.cells)


@pytest.mark.parametrize("path", IPYNB, ids=lambda p: p.stem)
def test_solution_cells_hide_their_output_too(path):
    """A solution cell (source collapsed) collapses its output as well, or the answer prints in plain sight; both
    the executed notebook and its .py source must say so."""
    for notebook in (json.loads(path.read_text()), jupytext.read(source_of(path))):
        for i, cell in enumerate(notebook["cells"]):
            hidden = cell["metadata"].get("jupyter", {})
            if hidden.get("source_hidden"):
                assert hidden.get("outputs_hidden"), f"{path.stem} cell {i}: a solution cell shows its output"


@pytest.mark.parametrize("path", IPYNB, ids=lambda p: p.stem)
def test_every_notebook_has_exercises_with_solutions(path):
    """README says every notebook ends with exercises whose solutions are collapsed cells: a "## Exercises" section
    with at least two solution cells (source hidden, and output: the test above) after its heading."""
    notebook = jupytext.read(source_of(path))
    headings = [i for i, c in enumerate(notebook.cells)
                if c.cell_type == "markdown" and "## Exercises" in (line.strip() for line in c.source.splitlines())]
    assert headings, f"{path.stem} has no '## Exercises' section"
    solutions = [c for c in notebook.cells[headings[0]:] if c.metadata.get("jupyter", {}).get("source_hidden")]
    assert len(solutions) >= 2, f"{path.stem}: {len(solutions)} solution cell(s) after '## Exercises', fewer than 2"


# Notebooks that show the project's trained language models (issue 28), and the files each reads
SHOWS_TRAINED = {"03_rwkv4_model": ("rwkv4",), "05_rwkv7_model": ("rwkv7", "rwkv7.pth"),
                 "06_state_space_models": ("mamba",)}


@pytest.mark.parametrize("stem", sorted(SHOWS_TRAINED))
def test_trained_model_sections_read_what_the_experiment_ships(stem, tmp_path):
    """Notebooks 03, 05 and 06 load the trained language models from experiments/results/weights/language_model/:
    the names they read are the names experiments.language_model.ship writes (shipped here for tiny models)."""
    lm = pytest.importorskip("seqmix.experiments.language_model")
    import torch

    source = (SOURCES / f"{stem}.py").read_text()
    assert f'LM_WEIGHTS = REPO / "experiments" / "results" / "weights" / "{lm.NAME}"' in source
    for name in SHOWS_TRAINED[stem]:
        arch = name.split(".")[0]
        torch.manual_seed(0)
        written = lm.ship(lm.build(arch, 64, 1, 64, 16), arch, tmp_path)     # head size 64: fla's layout
        assert tmp_path / name in written, f"ship({arch!r}) wrote {written}, not {name}"
        assert f'LM_WEIGHTS / "{name}"' in source, f"{stem} does not read {name}"
