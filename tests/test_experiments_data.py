"""The experiments' data generators and corpus (experiments/data.py), on their own."""
import hashlib
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from seqmix.experiments import data
from seqmix.experiments.data import IGNORE


def gen(seed=0):
    return np.random.default_rng(seed)


@pytest.mark.parametrize("seq_len, num_pairs, vocab_size", [(64, 4, 128), (64, 16, 128), (12, 4, 10), (3, 1, 4)])
def test_mqar_every_query_has_its_key_and_value_earlier(seq_len, num_pairs, vocab_size):
    inputs, targets = data.mqar(gen(), 200, seq_len=seq_len, num_pairs=num_pairs, vocab_size=vocab_size)
    assert inputs.shape == targets.shape == (200, seq_len) and inputs.dtype == targets.dtype == np.int64
    half = vocab_size // 2
    for x, y in zip(inputs, targets):
        keys, values = x[0:2 * num_pairs:2], x[1:2 * num_pairs:2]
        assert len(set(keys)) == num_pairs and ((1 <= keys) & (keys < half)).all()
        assert len(set(values)) == num_pairs and ((half <= values) & (values < vocab_size)).all()
        queries = np.flatnonzero(y != IGNORE)
        assert len(queries) == num_pairs and (queries >= 2 * num_pairs).all()
        assert sorted(x[queries]) == sorted(keys)                       # each key asked once
        for t in queries:
            first = np.flatnonzero(x[:t] == x[t])                       # the key's earlier occurrence ...
            assert len(first) == 1 and first[0] % 2 == 0 and first[0] < 2 * num_pairs
            assert x[first[0] + 1] == y[t]                              # ... is followed by the answer
        blanks = np.setdiff1d(np.arange(2 * num_pairs, seq_len), queries)
        assert (x[blanks] == 0).all()


def test_mqar_queries_come_in_random_order_and_places():
    inputs, targets = data.mqar(gen(), 500, num_pairs=8)
    first_query = [x[np.flatnonzero(y != IGNORE)[0]] for x, y in zip(inputs, targets)]
    assert len({int(np.flatnonzero(y != IGNORE)[0]) for y in targets}) > 10
    assert np.mean([q == x[0] for q, x in zip(first_query, inputs)]) < 0.3    # not always the first key


def test_mqar_is_reproducible_and_seed_dependent():
    a, b, c = (data.mqar(gen(s), 50) for s in (1, 1, 2))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], c[0])


@pytest.mark.parametrize("kwargs, match", [(dict(num_pairs=30), "3 \\* num_pairs <= seq_len"),
                                           (dict(num_pairs=0), "num_pairs must be >= 1"),
                                           (dict(num_pairs=8, vocab_size=16), "must be < vocab_size / 2")])
def test_mqar_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        data.mqar(gen(), 2, **kwargs)


def test_selective_copying_targets_are_the_symbols_in_order():
    inputs, targets = data.selective_copying(gen(), 300, context_len=20, num_tokens=5, num_symbols=6)
    assert inputs.shape == targets.shape == (300, 25)
    assert (inputs[:, 20:] == 7).all() and (targets[:, :20] == IGNORE).all()
    for x, y in zip(inputs, targets):
        symbols = x[:20][x[:20] != 0]
        assert len(symbols) == 5 and ((1 <= symbols) & (symbols <= 6)).all()
        assert np.array_equal(y[20:], symbols)
    places = {tuple(np.flatnonzero(x[:20])) for x in inputs}
    assert len(places) > 250                    # the places change from sequence to sequence: selective


def test_selective_copying_is_reproducible_and_checks_its_arguments():
    a, b = data.selective_copying(gen(3), 10), data.selective_copying(gen(3), 10)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="num_tokens must be in"):
        data.selective_copying(gen(), 2, context_len=4, num_tokens=5)


# ----------------------------------------------------------------------------------------------------------------
# The corpus
# ----------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def corpus():
    return data.stdlib_corpus()


def test_stdlib_corpus_split_is_disjoint_and_covers_every_file(corpus):
    names = [f.name for f in corpus.files]
    assert len(names) == len(set(names)) > 100
    by_split = {s: {f.name for f in corpus.files if f.split == s} for s in data.SPLITS}
    assert all(by_split.values())
    assert not (by_split["train"] & by_split["validation"] or by_split["train"] & by_split["test"]
                or by_split["validation"] & by_split["test"])
    assert set().union(*by_split.values()) == set(names)
    total = sum(f.size for f in corpus.files)
    sizes = {s: len(corpus.split(s)) for s in data.SPLITS}
    assert sum(sizes.values()) == total + 2 * sum(len(v) - 1 for v in by_split.values())   # the joins
    assert sizes["train"] > 0.6 * total and sizes["test"] > 0.03 * total


def test_stdlib_corpus_is_reproducible_and_its_manifest_holds_the_sums(corpus):
    again = data.stdlib_corpus()
    assert again.manifest() == corpus.manifest()
    assert all(np.array_equal(again.split(s), corpus.split(s)) for s in data.SPLITS)
    manifest = corpus.manifest()
    assert manifest["python_version"].count(".") == 2
    folder = Path(sysconfig.get_paths()["stdlib"])
    for f in manifest["files"][:20]:
        assert hashlib.sha256((folder / f["name"]).read_bytes()).hexdigest() == f["sha256"]


def test_split_follows_the_name_only(tmp_path):
    """A file's split depends on its name alone: adding files moves no other file."""
    for i in range(40):
        (tmp_path / f"m{i}.py").write_text(f"x = {i}\n")
    first = {f.name: f.split for f in data.stdlib_corpus(tmp_path).files}
    for i in range(40, 60):
        (tmp_path / f"m{i}.py").write_text(f"y = {i}\n")
    second = {f.name: f.split for f in data.stdlib_corpus(tmp_path).files}
    assert all(second[name] == split for name, split in first.items())
    assert first == {name: data.split_of(name) for name in first}
    counts = [list(second.values()).count(s) for s in data.SPLITS]
    assert counts[0] > counts[1] and counts[0] > counts[2]


def test_corpus_without_a_split_is_an_error(tmp_path):
    (tmp_path / "only.py").write_text("pass\n")
    with pytest.raises(ValueError, match="no .py files fall in split"):
        data.stdlib_corpus(tmp_path)


def test_lm_windows_predict_the_next_byte():
    stream = np.arange(100, dtype=np.uint8)
    x, y = data.lm_windows(stream, gen(), 7, 10)
    assert x.shape == y.shape == (7, 10)
    assert np.array_equal(y, x + 1) and np.array_equal(x[:, 1:], y[:, :-1])
    with pytest.raises(ValueError, match="fewer than a window"):
        data.lm_windows(stream, gen(), 1, 100)


def test_long_samples_repeated_and_not():
    stream = gen(1).integers(0, 256, 5000).astype(np.uint8)
    x, y = data.long_samples(stream, gen(2), 3, 40, period=12)
    assert x.shape == y.shape == (3, 40)
    assert np.array_equal(x[:, 12:], x[:, :-12]) and np.array_equal(y[:, :-1], x[:, 1:])
    assert np.array_equal(y[:, 11], x[:, 0])                     # the stretch starts over
    x, y = data.long_samples(stream, gen(2), 3, 40)
    assert not np.array_equal(x[:, 12:], x[:, :-12]) and np.array_equal(y[:, :-1], x[:, 1:])
