"""Text in, text out (models/text.py, models/cli.py): tokenizers found beside the weights or named, streamed decoding
that holds back incomplete UTF-8 and a possible start of the stop string, the state saved and resumed, and the
`python -m seqmix.generate` command, on tiny random checkpoints with tokenizers these tests write."""
import re
import subprocess
import sys

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from seqmix.models.cli import load_model
from seqmix.models.io import load_state, save_state
from seqmix.models.rwkv4 import RwkvConfig, RwkvForCausalLM
from seqmix.models.rwkv7 import Rwkv7, Rwkv7Config
from seqmix.models.text import TextStream, find_tokenizer, load_tokenizer

CORPUS = ["The quick brown fox jumps over the lazy dog.", "Café crème brûlée, naïve façade.", "日本語のテキスト。",
          "RWKV reads text one token at a time,\n\nand keeps a state."] * 20


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random RWKV-4 saved with a byte-level BPE tokenizer.json trained here (multi-byte characters split
    across tokens)."""
    path = tmp_path_factory.mktemp("rwkv4_text")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(path / "tokenizer.json"))
    torch.manual_seed(5)
    model = RwkvForCausalLM(RwkvConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2))
    model.save_pretrained(path)
    return path


def scripted_step(ids):
    """A toy model that says ``ids`` in order (greedy), whatever it reads; its state counts the steps."""
    def step(input_ids, state):
        n = 0 if state is None else state
        return 10.0 * torch.nn.functional.one_hot(torch.tensor([ids[min(n, len(ids) - 1)]]), 65536).float(), n + 1
    return step


@pytest.fixture(scope="module")
def world():
    return load_tokenizer("world")


def world_ids(world, *pieces: bytes):
    """World ids of raw byte strings, one token each (single bytes are ids 1 ... 256)."""
    return [world._trie.token2idx[p] for p in pieces]


def stream(world, ids, stop=None, **kw):
    return TextStream(scripted_step(ids), world, "x", max_new_tokens=len(ids), stop=stop, **kw)


# ------------------------------------------------------------------------------------------- tokenizers

def test_world_tokenizer_round_trip(world):
    text = "Hello, world! Ünïcödé 日本\n\n"
    ids = world.encode(text)
    assert len(ids) < len(text.encode()) and world.decode(ids) == text


def test_directory_tokenizer_is_picked_up(model_dir):
    model = RwkvForCausalLM.from_pretrained(model_dir)
    assert model.tokenizer is not None and model.tokenizer.name.endswith("tokenizer.json")
    assert model.tokenizer.decode(model.tokenizer.encode(CORPUS[1])) == CORPUS[1]
    assert type(load_model(model_dir)) is RwkvForCausalLM and load_model(model_dir).tokenizer is not None


WORDS = ["Hello", " world", "\n\n", "é"]


def write_world_vocab(path):
    """A small vocabulary in the World file format (<id> <repr of str or bytes> <byte length>): the 256 single
    bytes as ids 1 ... 256, then WORDS."""
    lines = [f"{i + 1} {bytes([i])!r} 1" for i in range(256)]
    lines += [f"{257 + n} {w!r} {len(w.encode())}" for n, w in enumerate(WORDS)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_world_vocab_file_beside_the_weights(tmp_path):
    """An RWKV-7 World directory carries rwkv_vocab_v20230424.txt; a vocab line that is not a literal is refused
    (the rwkv package would eval it)."""
    write_world_vocab(tmp_path / "rwkv_vocab_v20230424.txt")
    tok = find_tokenizer(tmp_path)
    assert tok.encode("Hello world\n\né!") == [257, 258, 259, 260, ord("!") + 1]
    assert tok.decode([257, 0, 258, 99999]) == "Hello world"        # ids outside the vocabulary: nothing
    (tmp_path / "bad.txt").write_text("1 __import__('os').system('true') 1\n")
    with pytest.raises(ValueError, match=r"bad\.txt, line 1: not a World vocabulary line"):
        load_tokenizer(tmp_path / "bad.txt")


def test_missing_tokenizer_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_tokenizer(tmp_path / "nope.json")
    (tmp_path / "broken.json").write_text("{}")
    with pytest.raises(ValueError, match=r"broken\.json: not a tokenizer\.json"):
        load_tokenizer(tmp_path / "broken.json")


# ---------------------------------------------------------------------------------------- streaming

def test_incomplete_utf8_is_held_back(world):
    """'é' is two bytes, two tokens here: nothing is shown after the first, 'é' after the second."""
    pieces = list(stream(world, world_ids(world, b"a", b"\xc3", b"\xa9", b"b")))
    assert pieces == ["a", "é", "b"]


def test_stop_string_across_tokens_ends_and_is_cut(world):
    s = stream(world, world_ids(world, b"x", b"\n", b"\n", b"y", b"z"), stop="\n\n")
    assert list(s) == ["x"] and s.text == "x" and len(s.tokens) == 3 and s.state == 4


def test_a_partial_stop_string_is_shown_once_it_cannot_stop(world):
    s = stream(world, world_ids(world, b"x", b"\n", b"y", b"\n"), stop="\n\n")
    pieces = list(s)
    assert pieces == ["x", "\ny", "\n"] and s.text == "x\ny\n"


def test_stream_matches_generate_and_decode(model_dir):
    model = RwkvForCausalLM.from_pretrained(model_dir)
    prompt = "The quick"
    s = model.generate_text(prompt, max_new_tokens=12)
    pieces = list(s)
    tokens, _ = model.generate(torch.tensor([model.tokenizer.encode(prompt)]), 12)
    new = tokens[0, -12:].tolist()
    assert s.tokens == new and "".join(pieces) == s.text == model.tokenizer.decode(new)
    assert s.prompt_tokens == len(model.tokenizer.encode(prompt))
    assert s.prefill_tokens_per_s > 0 and s.decode_tokens_per_s > 0


def test_state_saved_to_disk_and_resumed(model_dir, tmp_path):
    """A prompt read once, its state saved; continuing from the loaded state with a second prompt generates what
    reading both prompts' tokens in one go generates."""
    model = RwkvForCausalLM.from_pretrained(model_dir)
    first, second = "Café crème", " and keeps"
    read = model.generate_text(first, max_new_tokens=0)
    assert list(read) == [] and read.tokens == []
    save_state(read.state, tmp_path / "first.state")
    resumed = model.generate_text(second, max_new_tokens=8, state=load_state(tmp_path / "first.state"))
    list(resumed)
    ids = model.tokenizer.encode(first) + model.tokenizer.encode(second)
    tokens, _ = model.generate(torch.tensor([ids]), 8)
    assert resumed.tokens == tokens[0, len(ids):].tolist()


def test_text_generation_needs_a_tokenizer(world):
    model = Rwkv7(Rwkv7Config(vocab_size=67, n_embd=32, n_layer=1, head_size=16))
    with pytest.raises(ValueError, match="needs a tokenizer"):
        model.generate_text("hi")
    with pytest.raises(ValueError, match="encodes to no tokens"):
        model.generate_text("", tokenizer=world)


# --------------------------------------------------------------------------------------------- the command

def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "seqmix.generate", *map(str, args)], capture_output=True,
                          text=True, check=True)


SPEEDS = re.compile(r"prefill: (\d+) tokens, [\d.]+ tokens/s; decode: (\d+) tokens, [\d.]+ tokens/s")


def test_command_streams_what_the_python_api_streams(model_dir, tmp_path):
    model = RwkvForCausalLM.from_pretrained(model_dir)
    expected = model.generate_text("RWKV reads", max_new_tokens=10)
    list(expected)
    out = run_cli(model_dir, "--prompt", "RWKV reads", "--max-new-tokens", 10, "--temperature", 0,
                  "--save-state", tmp_path / "s.state")
    assert out.stdout == expected.text + "\n"
    assert SPEEDS.search(out.stderr).groups() == (str(expected.prompt_tokens), "10")
    resumed = run_cli(model_dir, "--prompt", " text", "--max-new-tokens", 5, "--temperature", 0,
                      "--state", tmp_path / "s.state")
    continued = model.generate_text(" text", max_new_tokens=5, state=expected.state)
    assert resumed.stdout == "".join(continued) + "\n"


def test_command_on_a_blinkdl_pth_with_a_world_vocab_file(tmp_path):
    torch.manual_seed(3)
    model = Rwkv7(Rwkv7Config(vocab_size=261, n_embd=32, n_layer=2, head_size=16)).eval()
    torch.save(model.state_dict(), tmp_path / "tiny.pth")
    vocab = write_world_vocab(tmp_path / "vocab.txt")
    out = run_cli(tmp_path / "tiny.pth", "--tokenizer", vocab, "--prompt", "Hello", "--max-new-tokens", 6,
                  "--temperature", 1.0, "--top-p", 0.9, "--seed", 4, "--stop", r"\n\n")
    again = model.generate_text("Hello", load_tokenizer(vocab), max_new_tokens=6, temperature=1.0, top_p=0.9,
                                stop="\n\n", generator=torch.Generator().manual_seed(4))
    assert out.stdout == "".join(again) + "\n"
    assert SPEEDS.search(out.stderr)
    no_tokenizer = subprocess.run([sys.executable, "-m", "seqmix.generate", str(tmp_path / "tiny.pth"),
                                   "--prompt", "x"], capture_output=True, text=True)
    assert no_tokenizer.returncode != 0 and "pass --tokenizer world" in no_tokenizer.stderr


# ------------------------------------------------------------------------------------- bad tokenizer files

@pytest.mark.parametrize("line,message", [
    ("257 'Hello' 4", r"line 257: the length field should be the token's byte length, 5"),
    ("257 'é' 1", r"line 257: the length field should be the token's byte length, 2"),
    ("257 'Hello' five", r"line 257: the length field should be the token's byte length, 5"),
    ("257 'Hello' ", r"line 257: the length field should be the token's byte length, 5"),
])
def test_world_vocab_length_field_is_checked(tmp_path, line, message):
    """A wrong length gave the rwkv package's bare AssertionError, a non-numeric one int()'s error; neither named
    the file or the line."""
    lines = write_world_vocab(tmp_path / "v.txt").read_text(encoding="utf-8").splitlines()
    (tmp_path / "v.txt").write_text("\n".join(lines[:256] + [line] + lines[257:]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"v\.txt, " + message):
        load_tokenizer(tmp_path / "v.txt")


def test_world_vocab_not_utf8_or_empty(tmp_path):
    """Latin-1 bytes gave a UnicodeDecodeError without the file's name; an empty file made a tokenizer that encodes
    nothing (every prompt then "encodes to no tokens"): both refused, naming the file."""
    path = write_world_vocab(tmp_path / "v.txt")
    path.write_bytes(path.read_bytes() + "261 'café' 5\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"v\.txt, line 261: not UTF-8"):
        load_tokenizer(path)
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match=r"empty\.txt: an empty World vocabulary"):
        load_tokenizer(tmp_path / "empty.txt")


def test_text_the_vocab_cannot_encode_is_named(tmp_path):
    """A custom vocab without some byte: the rwkv trie raised UnboundLocalError."""
    lines = [f"{n + 1} {w!r} {len(w.encode())}" for n, w in enumerate(["a", "b", "ab"])]
    (tmp_path / "ab.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    tok = load_tokenizer(tmp_path / "ab.txt")
    assert tok.encode("abba") == [3, 2, 1]
    with pytest.raises(ValueError, match=r"ab\.txt: the vocabulary has no token for 'é' in the text"):
        tok.encode("abé")


def test_tokenizer_spec_of_another_type(tmp_path):
    """load_tokenizer(None) raised os.fspath's TypeError, which does not say what is expected."""
    with pytest.raises(TypeError, match=r"tokenizer must be 'world' or the path of a tokenizer\.json or a World "
                                        r"vocab \.txt, got NoneType"):
        load_tokenizer(None)


def test_word_level_tokenizer_without_unk(tmp_path):
    """tokenizers raises a bare Exception ("Missing [UNK] token") for a word it does not know: a ValueError naming
    the file."""
    tok = Tokenizer(models.WordLevel({"a": 0, "b": 1}))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "words.json"))
    loaded = load_tokenizer(tmp_path / "words.json")
    assert loaded.encode("a b a") == [0, 1, 0]
    with pytest.raises(ValueError, match=r"words\.json: cannot encode the text \(.*UNK"):
        loaded.encode("a c")


# ----------------------------------------------------------------------------------- the command's errors

@pytest.fixture(scope="module")
def mistakes(tmp_path_factory, model_dir):
    """Files a user may wrongly pass: a folder without config.json, an unknown model_type, damaged files, a state
    of another model, a World vocab with only a and b."""
    d = tmp_path_factory.mktemp("mistakes")
    (d / "empty").mkdir()
    (d / "gpt2").mkdir()
    (d / "gpt2" / "config.json").write_text('{"model_type": "gpt2"}')
    (d / "junk.pth").write_bytes(b"PK\x03\x04 junk")
    (d / "broken.json").write_text("{}")
    (d / "junk.state").write_bytes(b"junk")
    save_state(RwkvForCausalLM(RwkvConfig(vocab_size=11, hidden_size=8, num_hidden_layers=1)).initial_state(1),
               d / "other.state")
    (d / "ab.txt").write_text("1 'a' 1\n2 'b' 1\n", encoding="utf-8")
    torch.save(Rwkv7(Rwkv7Config(vocab_size=11, n_embd=16, n_layer=1, head_size=16)).state_dict(), d / "tiny.pth")
    return d


# (what the user got wrong, arguments with {model} and {d} for the fixtures' paths, exit status, the line says)
CLI_MISTAKES = [
    ("no prompt", ["{model}"], 2, "the following arguments are required: --prompt"),
    ("negative temperature", ["{model}", "--prompt", "x", "--temperature", "-1"], 2, "temperature must be"),
    ("NaN temperature", ["{model}", "--prompt", "x", "--temperature", "nan"], 2, "temperature must be"),
    ("top-p above 1", ["{model}", "--prompt", "x", "--top-p", "1.5"], 2, r"top_p must be a number in \(0, 1\]"),
    ("negative token count", ["{model}", "--prompt", "x", "--max-new-tokens", "-1"], 2,
     "--max-new-tokens must be >= 0"),
    ("unknown dtype", ["{model}", "--prompt", "x", "--dtype", "float8"], 2, "argument --dtype: invalid choice"),
    ("state into a missing folder", ["{model}", "--prompt", "x", "--save-state", "{d}/no/such/s.state"], 2,
     "--save-state .*: no such folder"),
    ("no tokenizer", ["{d}/tiny.pth", "--prompt", "x"], 2, "no tokenizer beside the weights; pass --tokenizer"),
    ("missing model", ["{d}/nope", "--prompt", "x"], 1, "neither a checkpoint file nor a model directory"),
    ("folder without config", ["{d}/empty", "--prompt", "x"], 1, "neither a checkpoint file nor a model directory"),
    ("unknown model_type", ["{d}/gpt2", "--prompt", "x"], 1, "model_type 'gpt2' is not one of"),
    ("damaged checkpoint", ["{d}/junk.pth", "--prompt", "x"], 1, r"junk\.pth: a torch zip checkpoint that is"),
    ("missing tokenizer", ["{model}", "--prompt", "x", "--tokenizer", "{d}/nope.json"], 1, "no such file"),
    ("damaged tokenizer", ["{model}", "--prompt", "x", "--tokenizer", "{d}/broken.json"], 1,
     r"broken\.json: not a tokenizer\.json"),
    ("damaged state", ["{model}", "--prompt", "x", "--state", "{d}/junk.state"], 1, "cannot be read as a saved state"),
    ("state of another model", ["{model}", "--prompt", "x", "--state", "{d}/other.state"], 1,
     r"state\[0\] \(ffn_x_prev\) must have shape"),
    ("unknown backend", ["{model}", "--prompt", "x", "--backend", "cuda"], 1, "backend must be one of"),
    ("text the vocab lacks", ["{d}/tiny.pth", "--tokenizer", "{d}/ab.txt", "--prompt", "abc"], 1,
     "the vocabulary has no token for 'c'"),
    ("empty prompt", ["{model}", "--prompt", ""], 1, "encodes to no tokens"),
]


def run_main(args):
    from seqmix.models.cli import main
    try:
        return main(args)
    except SystemExit as e:              # argparse's errors exit from inside
        return e.code


@pytest.mark.parametrize("args,status,says", [c[1:] for c in CLI_MISTAKES], ids=[c[0] for c in CLI_MISTAKES])
def test_command_mistakes_are_one_line(model_dir, mistakes, capsys, args, status, says):
    """Each printed a traceback (cli.py had no handler; argparse printed its usage block too): now one line on
    stderr, nothing generated, exit status 2 for a bad option, 1 otherwise."""
    code = run_main([a.format(model=model_dir, d=mistakes) for a in args])
    out, err = capsys.readouterr()
    assert (code, out) == (status, "") and err.count("\n") == 1, err
    assert err.startswith("python -m seqmix.generate: error: ") and re.search(says, err), err


def test_command_debug_shows_the_traceback(tmp_path):
    """--debug: the traceback, for a bug report; without it one line (through the real command, not main)."""
    args = [sys.executable, "-m", "seqmix.generate", str(tmp_path / "nope"), "--prompt", "x"]
    plain = subprocess.run(args, capture_output=True, text=True)
    assert plain.returncode == 1 and plain.stderr.count("\n") == 1 and "Traceback" not in plain.stderr
    debug = subprocess.run(args + ["--debug"], capture_output=True, text=True)
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.rstrip().splitlines()[-1].startswith("FileNotFoundError: ")
