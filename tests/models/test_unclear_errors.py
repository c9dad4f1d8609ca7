"""Round 4's unclear errors, each now naming the argument, the file or the value (the experiments' ones are in
tests/experiments/test_experiments_records.py): generate's --seed, a tokenizer file with a BOM, under an upper-case
.JSON, a
World vocabulary with an id twice, conformance's --device."""
import pytest

from seqmix.conformance.__main__ import main as conformance_main
from seqmix.experiments.records import RESULTS
from seqmix.models import cli
from seqmix.models.text import load_tokenizer

SHIPPED_TOKENIZER = RESULTS / "weights" / "language_model" / "tokenizer.json"


def test_a_seed_past_what_torch_takes_names_the_option(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([str(SHIPPED_TOKENIZER.parent / "rwkv4"), "--prompt", "x", "--seed", str(2 ** 70)])
    assert exit_.value.code == 2 and "--seed must lie in [-2**63, 2**64)" in capsys.readouterr().err


def test_a_tokenizer_json_with_a_byte_order_mark_says_so(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(b"\xef\xbb\xbf" + SHIPPED_TOKENIZER.read_bytes())
    with pytest.raises(ValueError, match="tokenizer.json: starts with a UTF-8 byte order mark"):
        load_tokenizer(path)


def test_an_upper_case_json_tokenizer_is_read_as_json(tmp_path):
    """It was read as a World vocabulary: "not a World vocabulary line: '{'"."""
    path = tmp_path / "TOKENIZER.JSON"
    path.write_bytes(SHIPPED_TOKENIZER.read_bytes())
    assert load_tokenizer(path).encode("ab") == load_tokenizer(SHIPPED_TOKENIZER).encode("ab")


def test_a_world_vocabulary_with_an_id_twice_names_the_lines(tmp_path):
    """It said "the vocabulary has no token for 'a'" although 'a' was there (the later line replaced it)."""
    path = tmp_path / "vocab.txt"
    path.write_text("1 'a' 1\n2 'b' 1\n1 'c' 1\n")
    with pytest.raises(ValueError, match=r"vocab.txt, line 3: id 1 again \(first on line 1\)"):
        load_tokenizer(path)


@pytest.mark.parametrize("device", ["foo", "cuda:99"])
def test_a_device_torch_cannot_use_is_a_usage_error(capsys, device):
    """It failed every check as the function's fault (exit 1)."""
    assert conformance_main(["wkv4", "seqmix.kernels.wkv4:wkv4", "--device", device]) == 2
    captured = capsys.readouterr()
    assert f"--device {device}: not a device this torch can use" in captured.err and captured.out == ""
