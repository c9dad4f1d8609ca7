"""experiments.lm_context: the language models beside compressors, and reading a whole text with the state carried."""
import gzip
import json

import numpy as np
import pytest
import torch

from seqmix.experiments import language_model, lm_context


@pytest.fixture(scope="module")
def models():
    """The quick run's tiny models, every weight perturbed: RWKV-7's training start zeroes its output projections
    (each block starts as the identity), which would make the context invisible."""
    torch.manual_seed(0)
    built = {arch: language_model.build(arch, *spec, seq_len=16).eval()
             for arch, *spec in language_model.QUICK.models if arch in lm_context.SHIPPED}
    with torch.no_grad():
        for model in built.values():
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
    return built


TEXT = b"def f(x):\n    return x + 1\n\n\nclass A:\n    pass\n" * 3


@pytest.mark.parametrize("arch", lm_context.SHIPPED)
def test_reading_in_chunks_with_the_state_carried_is_reading_at_once(models, arch):
    """Nothing is lost when the text is split: any chunk size gives the one-forward answer (fp32 budget)."""
    whole = lm_context.stream_nll(models[arch], TEXT, chunk=len(TEXT))
    for chunk in (5, 50):
        np.testing.assert_allclose(lm_context.stream_nll(models[arch], TEXT, chunk), whole, rtol=1e-5, atol=1e-5)
    assert whole.shape == (len(TEXT) - 1,)


@pytest.mark.parametrize("arch", lm_context.SHIPPED)
def test_windows_restart_the_state(models, arch):
    """A window as long as the text is the stream; shorter windows agree with it in the first window only."""
    model = models[arch]
    stream = lm_context.stream_nll(model, TEXT, chunk=len(TEXT))
    np.testing.assert_allclose(lm_context.window_nll(model, TEXT, len(TEXT)), stream, rtol=1e-5, atol=1e-5)
    windowed = lm_context.window_nll(model, TEXT, 10)
    np.testing.assert_allclose(windowed[:10], stream[:10], rtol=1e-5, atol=1e-5)    # the first window: the same
    assert not np.allclose(windowed[10:], stream[10:])                               # later ones: restarted


def test_positions_restart_at_every_file():
    sizes = [3, 1, 4]                       # joined: 3 + 2, 1 + 2, 4 bytes; the first byte is not predicted
    assert lm_context.positions_in_files(sizes).tolist() == [1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]


def test_compressed_bits_per_byte_is_eight_times_the_ratio():
    text = bytes(range(256)) * 8
    found = lm_context.compressed_bpb(text)
    assert found["gzip -9"] == 8 * len(gzip.compress(text, 9, mtime=0)) / len(text)
    assert all(v is None or 0 < v < 8 for v in found.values())


def test_the_quick_run_writes_its_rows_and_report(tmp_path):
    lm_context.run(lm_context.QUICK, tmp_path, progress=False)
    rows = json.loads((tmp_path / "lm_context.json").read_text())["rows"]
    assert [r["text"] for r in rows] == ["stdlib test split", f"held out: {lm_context.HELD_OUT}"]
    for row in rows:
        assert set(row["models"]) == set(lm_context.SHIPPED)
        assert set(row["compressors"]) == set(lm_context.COMPRESSORS)
        assert len(row["models"]["rwkv7"]["stream_by_position"]) == len(row["position_edges"]) - 1
    assert (tmp_path / "lm_context.png").stat().st_size > 0
    assert "beats" in (tmp_path / "lm_context.md").read_text()


def test_another_folders_models_join_each_texts_table(tmp_path):
    """Setup.more: the models of another folder (here the quick run's own untrained RWKV-7, shipped, so fp16) are
    read on the same texts as rows of their own, keyed by the folder, and each text's table lists them as
    "<arch> (<label>)" beside the first folder's; a folder that does not exist is passed over; rows of one text that
    read different files are refused."""
    from dataclasses import replace
    folder = tmp_path / "weights" / "again"
    language_model.ship(lm_context._models(lm_context.QUICK, None)["rwkv7"], "rwkv7", folder)
    setup = replace(lm_context.QUICK, more=((folder, "again"), (tmp_path / "absent", "never")))
    lm_context.run(setup, tmp_path / "out", progress=False)
    rows = json.loads((tmp_path / "out" / "lm_context.json").read_text())["rows"]
    assert [(r["weights"], r["label"]) for r in rows] == [("untrained", None)] * 2 + [("again", "again")] * 2
    assert all(set(r["models"]) == {"rwkv7"} for r in rows[2:])
    text = (tmp_path / "out" / "lm_context.md").read_text()
    for base, other in zip(rows[:2], rows[2:]):
        table = text.split(f"## {base['text']}")[1].split("##")[0]
        found, shipped = base["models"]["rwkv7"], other["models"]["rwkv7"]
        assert (f"| rwkv7 (again) | {shipped['window_bpb']:.3f} | {shipped['stream_bpb']:.3f} |" in table
                and "| rwkv4 |" in table and "never" not in table)
        for way in ("window_bpb", "stream_bpb"):          # the same model, its weights rounded to fp16
            assert shipped[way] != found[way] and abs(shipped[way] - found[way]) < 1e-3 * found[way]
    other = {**rows[2], "files": rows[2]["files"][1:]}
    with pytest.raises(ValueError, match="read different files"):
        lm_context.merged([rows[0], other])
