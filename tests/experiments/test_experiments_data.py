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


@pytest.mark.parametrize("spacing, seq_len, num_pairs, vocab_size", [
    ("power_law", 64, 4, 128), ("power_law", 64, 16, 128), ("power_law", 17, 4, 10), ("power_law", 4, 1, 4),
    ("uniform", 64, 4, 128), ("uniform", 64, 16, 128), ("uniform", 12, 4, 10), ("uniform", 3, 1, 4)])
def test_mqar_every_query_has_its_key_and_value_earlier(spacing, seq_len, num_pairs, vocab_size):
    inputs, targets = data.mqar(gen(), 200, seq_len=seq_len, num_pairs=num_pairs, vocab_size=vocab_size,
                                spacing=spacing)
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


@pytest.mark.parametrize("spacing", data.MQAR_SPACINGS)
def test_mqar_queries_come_in_random_order_and_places(spacing):
    inputs, targets = data.mqar(gen(), 500, num_pairs=8, spacing=spacing)
    assert len(set(np.nonzero(targets != IGNORE)[1])) > 10              # queries asked in many places
    in_key_order = [list(x[y != IGNORE]) == list(x[0:16:2]) for x, y in zip(inputs, targets)]
    assert np.mean(in_key_order) < 0.01                                  # queries are not asked in key order


def test_mqar_is_reproducible_and_seed_dependent():
    a, b, c = (data.mqar(gen(s), 50) for s in (1, 1, 2))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], c[0])


def _gap_frequencies(gaps, space):
    return np.bincount(gaps.ravel(), minlength=space) / gaps.size


def test_mqar_power_law_gaps_follow_zoologys_draw():
    """The vectorized draw (Gumbel top-k) against Zoology's own, numpy's choice(space, k, replace=False, p=p) row by
    row: the frequency of each gap agrees within sampling noise (20000 rows each; 4 standard errors)."""
    space, k, power_a, n = 28, 4, 0.01, 20000
    p = power_a * np.arange(1, space + 1) ** (power_a - 1)
    p /= p.sum()
    rng = gen(3)
    theirs = np.stack([rng.choice(space, size=k, replace=False, p=p) for _ in range(n)])   # gap of key j, (n, k)
    inputs, targets = data.mqar(gen(4), n, seq_len=64, num_pairs=k)
    asked = inputs[:, None, 2 * k:] == inputs[:, 0:2 * k:2, None]           # (n, k, T - 2k): where key j is asked
    ours = np.argmax(asked, axis=2) // 2                                # query position of key j -> its gap
    for j in (0, k - 1):               # the first key's gap is drawn first (likelier small), as in Zoology's draw
        f_ours, f_theirs = _gap_frequencies(ours[:, j], space), _gap_frequencies(theirs[:, j], space)
        se = np.sqrt(f_theirs * (1 - f_theirs) / n) * np.sqrt(2)
        assert (np.abs(f_ours - f_theirs) <= 4 * se + 1e-4).all(), np.c_[f_ours, f_theirs]
    assert _gap_frequencies(ours, space)[0] > 5 * _gap_frequencies(ours, space)[-1]   # near gaps far likelier


def test_mqar_power_law_queries_come_sooner_than_uniform_ones():
    """The issue's measurement: at T = 64, N = 4 the mean key-to-query distance is 19.2 tokens under Zoology's
    spacing and 32.6 under the uniform one."""
    def mean_distance(spacing):
        x, y = data.mqar(gen(5), 5000, seq_len=64, num_pairs=4, spacing=spacing)
        rows, cols = np.nonzero(y != IGNORE)
        keys_at = np.argmax(x[rows, :8] == x[rows, cols][:, None], axis=1)
        return np.mean(cols - keys_at)
    assert mean_distance("power_law") == pytest.approx(19.2, abs=0.4)
    assert mean_distance("uniform") == pytest.approx(32.6, abs=0.4)


@pytest.mark.parametrize("kwargs, match", [(dict(num_pairs=30), "4 \\* num_pairs <= seq_len"),
                                           (dict(num_pairs=30, spacing="uniform"), "3 \\* num_pairs <= seq_len"),
                                           (dict(spacing="zipf"), "spacing must be one of"),
                                           (dict(power_a=0.0), "power_a must be > 0"),
                                           (dict(num_pairs=0), "num_pairs must be >= 1"),
                                           (dict(num_pairs=8, vocab_size=16), "must be < vocab_size / 2")])
def test_mqar_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        data.mqar(gen(), 2, **kwargs)


@pytest.mark.parametrize("modulus", [2, 3, 5])
def test_modular_sum_targets_are_the_running_sums(modulus):
    inputs, targets = data.modular_sum(gen(), 50, seq_len=40, modulus=modulus)
    assert inputs.shape == targets.shape == (50, 40) and inputs.dtype == targets.dtype == np.int64
    assert set(np.unique(inputs)) == set(range(modulus))
    for x, y in zip(inputs, targets):
        total = 0
        for t in range(40):                                        # the definition, one token at a time
            total = (total + int(x[t])) % modulus
            assert y[t] == total


@pytest.mark.parametrize("kwargs, match", [(dict(modulus=1), "modulus must be >= 2"),
                                           (dict(seq_len=0), "seq_len must be >= 1")])
def test_modular_sum_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        data.modular_sum(gen(), 2, **kwargs)


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
