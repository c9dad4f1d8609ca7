"""Nothing lost on a save (reliability round 4, F5 and F6): every writer goes through models.io.atomic_write, a
temporary file in the same folder moved into place with os.replace, so a failed write leaves the old file and a
save over the file a model is memory-mapped from works; `python -m seqmix.generate --save-state` refuses the
model's own files."""
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest
import torch

from seqmix.experiments.records import RESULTS
from seqmix.models import cli, io

SHIPPED_PTH = RESULTS / "weights" / "language_model" / "rwkv7.pth"
SHIPPED_DIR = RESULTS / "weights" / "language_model" / "rwkv4"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text("old")
    with pytest.raises(RuntimeError, match="half-way"):
        with io.atomic_write(path) as tmp:
            open(tmp, "w").write("new, half")
            raise RuntimeError("failed half-way")
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["rows.json"]


def test_a_written_file_has_the_permissions_open_would_give_it(tmp_path):
    """mkstemp makes 0600 files: a results file moved into place as such would hide from the other readers."""
    umask = os.umask(0o022)
    try:
        io.write_text_atomically(tmp_path / "new.md", "x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE(os.stat(tmp_path / "new.md").st_mode) == 0o644
    os.chmod(tmp_path / "new.md", 0o640)
    io.write_text_atomically(tmp_path / "new.md", "y")
    assert stat.S_IMODE(os.stat(tmp_path / "new.md").st_mode) == 0o640


def test_a_write_into_a_missing_folder_or_onto_a_folder_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not an existing folder"):
        io.write_text_atomically(tmp_path / "no" / "x.json", "x")
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="is not an existing folder"):
        io.write_text_atomically(tmp_path / "file" / "x.json", "x")
    with pytest.raises(IsADirectoryError, match="is a folder"):
        io.write_text_atomically(tmp_path, "x")


def test_saving_over_the_memory_mapped_checkpoint_a_model_came_from_keeps_it(tmp_path):
    """F5: torch.save onto the .pth the model is still mapped from truncated the pages it then read (SIGBUS, the
    checkpoint left at 15 kB). save_state_dict writes torch's format for .pth, through a temporary file: the old
    file's pages live on until unmapped. In a child process: the old failure was a signal."""
    path = tmp_path / "m.pth"
    shutil.copy(SHIPPED_PTH, path)
    script = textwrap.dedent(f"""
        import torch
        from seqmix.models.io import save_state_dict
        from seqmix.models.rwkv7 import Rwkv7
        model = Rwkv7.from_checkpoint({str(path)!r})
        expected = {{k: v.clone() for k, v in model.state_dict().items()}}
        save_state_dict(model.state_dict(), {str(path)!r})
        again = Rwkv7.from_checkpoint({str(path)!r}).state_dict()
        assert again.keys() == expected.keys()
        assert all(again[k].dtype == v.dtype and torch.equal(again[k], v) for k, v in expected.items())
        print("reloaded")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "reloaded" in done.stdout
    with open(path, "rb") as f:
        assert f.read(4) == b"PK\x03\x04"              # torch's zip format, what a BlinkDL .pth is


def test_save_state_dict_writes_safetensors_for_any_other_name(tmp_path):
    io.save_state_dict({"a": torch.arange(3.0)}, tmp_path / "w.safetensors")
    assert torch.equal(io.load_state_dict(tmp_path / "w.safetensors")["a"], torch.arange(3.0))


def test_save_state_over_the_state_it_continues_from(tmp_path):
    path = tmp_path / "chat.state"
    io.save_state([torch.ones(2)], path)
    state = io.load_state(path)
    io.save_state([state[0] + 1], path)
    assert torch.equal(io.load_state(path)[0], torch.full((2,), 2.0))


@pytest.mark.parametrize("target", ["the .pth", "a file of the model directory"])
def test_save_state_onto_the_model_is_refused_before_anything_runs(tmp_path, capsys, target):
    """F6: --save-state naming the model's .pth replaced 2 MB of weights with a 136 kB state, exit 0."""
    if target == "the .pth":
        model = tmp_path / "m.pth"
        shutil.copy(SHIPPED_PTH, model)
        save = model
    else:
        model = tmp_path / "rwkv4"
        shutil.copytree(SHIPPED_DIR, model)
        save = model / "model.safetensors"
    before = save.read_bytes()
    with pytest.raises(SystemExit) as exit_:
        cli.main([str(model), "--prompt", "def ", "--max-new-tokens", "1", "--save-state", str(save)])
    assert exit_.value.code == 2
    assert "would replace the weights" in capsys.readouterr().err
    assert save.read_bytes() == before


def test_a_new_state_file_in_the_model_directory_is_allowed(tmp_path, capsys):
    model = tmp_path / "rwkv4"
    shutil.copytree(SHIPPED_DIR, model)
    assert cli.main([str(model), "--prompt", "def ", "--max-new-tokens", "1", "--temperature", "0",
                     "--save-state", str(model / "chat.state")]) == 0
    assert isinstance(io.load_state(model / "chat.state"), list)
