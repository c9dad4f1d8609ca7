"""The experiments' data: seeded generators for two synthetic tasks and a character corpus nobody here wrote.

    mqar(rng, n, ...)               multi-query associative recall (Zoology, arXiv:2312.04927, section 3),
                                    its query spacing (power law, as Zoology) or uniform
    selective_copying(rng, n, ...)  selective copying (Mamba, arXiv:2312.00752, section 3.1 and figure 2)
    modular_sum(rng, n, ...)        state tracking: the running sum mod m (parity for m = 2)
    stdlib_corpus()                 the bytes of the running Python's own standard-library .py files, split by file
    lm_windows(data, rng, n, T)     next-character (inputs, targets) windows of a corpus split
    long_samples(data, rng, n, ...) the long evaluation samples of the ReRoPE post: repeated and non-repeated text

Every generator returns (inputs, targets): int64 arrays (n, T); targets[:, t] is the token the model should
predict at position t (having seen inputs[:, :t + 1]), or IGNORE where nothing is scored. The same rng state
gives the same arrays (numpy's Generator is reproducible across platforms for these calls).
"""
from __future__ import annotations

import hashlib
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["IGNORE", "VALID", "TEST", "held_out_rng", "MQAR_SPACINGS", "mqar", "selective_copying", "modular_sum",
           "CorpusFile", "StdlibCorpus", "stdlib_corpus", "split_of", "lm_windows", "long_samples"]

IGNORE = -100      # a target that is not scored (torch's cross_entropy ignore_index)
VALID, TEST = 1, 2  # the held-out sets' data streams (a run's training stream is its seed's)


def held_out_rng(split: int, *key: int) -> np.random.Generator:
    """The generator of a held-out set: ``split`` (VALID or TEST) and the set's own key (a size, a length), apart
    from every training seed's stream.

    Args:
        split: VALID or TEST. key: integers that tell the set from the others of its split.

    Returns:
        numpy Generator seeded with [1000, split, *key].
    """
    return np.random.default_rng([1000, split, *key])


def _distinct(rng, n, low, high, k):
    """(n, k) ints, each row k distinct values from [low, high) in random order."""
    return np.argsort(rng.random((n, high - low)), axis=1)[:, :k] + low


MQAR_SPACINGS = ("power_law", "uniform")


def _power_law_gaps(rng, n, space, k, power_a):
    """(n, k) distinct gaps from [0, space), drawn without replacement with P(gap = g) proportional to
    (g + 1)^(power_a - 1), as Zoology draws them (numpy's choice(space, k, replace=False, p=p), row by row). The
    Gumbel top-k trick gives that same distribution in one vectorized call: the k largest of log p_g + Gumbel noise
    are a draw of k items without replacement, each next one with probability proportional to p among the rest."""
    log_p = (power_a - 1) * np.log(np.arange(1, space + 1))
    noisy = log_p + rng.gumbel(size=(n, space))
    return np.argsort(-noisy, axis=1)[:, :k]


def mqar(rng, n, *, seq_len=64, num_pairs=8, vocab_size=128, spacing="power_law", power_a=0.01):
    """Multi-query associative recall: N key-value pairs, then each key queried once, in random order.

        inputs:   k_1 v_1 k_2 v_2 ... k_N v_N | 0 .. k_a .. 0 .. k_b .. 0 ...
        targets:  IGNORE everywhere but at each query k_i, where it is v_i
    Keys are distinct, from [1, V/2); values distinct, from [V/2, V); 0 is the blank between queries. Every query
    key sits in the first 2N positions followed by its value, so the answer is always in the context.

    Where the queries go (``spacing``):
        "power_law"  Zoology's generator (zoology/data/multiquery_ar.py, arXiv:2312.04927 section 3 and its
                     figure 2, random_non_queries=False): the query region after the pairs is cut into slots of two
                     positions; query i sits at the start of slot g_i, the gaps g_i distinct with
                     P(g) proportional to (g + 1)^(power_a - 1). With power_a = 0.01 that is about 1/(g + 1): most
                     queries come soon after the pairs, as a repeated bigram does in text. The default.
        "uniform"    N distinct positions anywhere after the pairs, equally likely: a harder variant (at T = 64,
                     N = 4 the mean distance from a key to its query is 32.6 tokens against 19.2 under the power
                     law), the project's generator until the experiments' second edition.

    Args:
        rng: a numpy Generator.
        n: number of sequences.
        seq_len: T; needs 3 N <= T ("uniform"), 4 N <= T ("power_law": N slots of two).
        num_pairs: N.
        vocab_size: V; needs N < V/2.
        spacing: "power_law" or "uniform".
        power_a: the power law's a (1.0 makes the slots equally likely); "power_law" only.
    Returns:
        (inputs, targets): int64 arrays (n, T).
    """
    if spacing not in MQAR_SPACINGS:
        raise ValueError(f"spacing must be one of {MQAR_SPACINGS}, got {spacing!r}")
    half = vocab_size // 2
    context = 2 * num_pairs
    slots = (seq_len - context) // 2 if spacing == "power_law" else seq_len - context
    if num_pairs < 1 or num_pairs > slots:
        need = "4 * num_pairs <= seq_len" if spacing == "power_law" else "3 * num_pairs <= seq_len"
        raise ValueError(f"num_pairs must be >= 1 with {need} ({seq_len}) for spacing {spacing!r}, got {num_pairs}")
    if num_pairs > half - 1:
        raise ValueError(f"num_pairs ({num_pairs}) must be < vocab_size / 2 ({vocab_size} / 2): keys are distinct")
    if not power_a > 0:
        raise ValueError(f"power_a must be > 0, got {power_a}")
    keys = _distinct(rng, n, 1, half, num_pairs)                                   # (n, N)
    values = _distinct(rng, n, half, vocab_size, num_pairs)                       # (n, N)
    if spacing == "power_law":
        positions = context + 2 * _power_law_gaps(rng, n, slots, num_pairs, power_a)   # (n, N) query positions
    else:
        positions = _distinct(rng, n, context, seq_len, num_pairs)
    inputs = np.zeros((n, seq_len), dtype=np.int64)
    targets = np.full((n, seq_len), IGNORE, dtype=np.int64)
    inputs[:, 0:context:2], inputs[:, 1:context:2] = keys, values
    rows = np.arange(n)[:, None]
    inputs[rows, positions] = keys
    targets[rows, positions] = values
    return inputs, targets


def selective_copying(rng, n, *, context_len=64, num_tokens=8, num_symbols=8):
    """Selective copying: K symbols scattered at random positions among blanks; after the context, K markers,
    at which the model must output the K symbols in their order.

        inputs:   0 0 s_1 0 0 0 s_2 s_3 0 ... 0 | m m ... m          (context_len, then K markers m)
        targets:  IGNORE over the context          s_1 s_2 ... s_K
    Symbols are drawn (with repetition) from [1, S]; 0 is the blank (the paper's noise token) and S + 1 the marker.
    The positions change from sequence to sequence, so no fixed delay (no time-invariant convolution) reads them out.

    Args:
        rng: a numpy Generator.
        n: number of sequences.
        context_len: positions holding the symbols and blanks; needs K <= context_len.
        num_tokens: K, the symbols to copy.
        num_symbols: S.
    Returns:
        (inputs, targets): int64 arrays (n, context_len + K); the vocabulary is S + 2 tokens.
    """
    if not 1 <= num_tokens <= context_len:
        raise ValueError(f"num_tokens must be in [1, context_len = {context_len}], got {num_tokens}")
    if num_symbols < 1:
        raise ValueError(f"num_symbols must be >= 1, got {num_symbols}")
    symbols = rng.integers(1, num_symbols + 1, size=(n, num_tokens))
    positions = np.sort(_distinct(rng, n, 0, context_len, num_tokens), axis=1)   # (n, K), increasing
    inputs = np.zeros((n, context_len + num_tokens), dtype=np.int64)
    inputs[np.arange(n)[:, None], positions] = symbols
    inputs[:, context_len:] = num_symbols + 1
    targets = np.full_like(inputs, IGNORE)
    targets[:, context_len:] = symbols
    return inputs, targets


def modular_sum(rng, n, *, seq_len=64, modulus=2):
    """State tracking: the running sum of the tokens mod m, at every position (parity for m = 2).

        inputs:   x_1 x_2 ... x_T            each uniform in [0, m)
        targets:  y_t = (x_1 + ... + x_t) mod m, at every t
    The group Z_m is abelian, so a linear recurrence can track it with a transition per token, but only if its
    eigenvalues can rotate or flip signs: a product of diagonal decays in [0, 1] cannot count parity (Merrill et
    al., arXiv:2404.08819; Grazzi et al., arXiv:2411.12537, who train on this task). Every prefix is scored, so a
    model trained at length T has seen every length up to T.

    Args:
        rng: a numpy Generator.
        n: number of sequences.
        seq_len: T.
        modulus: m >= 2; the vocabulary is the m residues.
    Returns:
        (inputs, targets): int64 arrays (n, T).
    """
    if modulus < 2:
        raise ValueError(f"modulus must be >= 2, got {modulus}")
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    inputs = rng.integers(0, modulus, size=(n, seq_len))
    return inputs, np.cumsum(inputs, axis=1) % modulus


# ----------------------------------------------------------------------------------------------------------------
# The character corpus: the standard library's own sources
# ----------------------------------------------------------------------------------------------------------------

SPLITS = ("train", "validation", "test")


def split_of(name: str) -> str:
    """A file's split from its name alone (so that a file added in another Python version moves no other):
    the first 32 bits of sha256(name) mod 10: 0 test, 1 validation, else train."""
    bucket = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % 10
    return SPLITS[2] if bucket == 0 else SPLITS[1] if bucket == 1 else SPLITS[0]


@dataclass(frozen=True)
class CorpusFile:
    name: str        # path relative to the standard library's folder
    sha256: str
    size: int        # bytes
    split: str


@dataclass(frozen=True)
class StdlibCorpus:
    """The files of the corpus and the bytes of each split (the split's files in name order, joined by blank
    lines). ``manifest()`` is what results record: the Python version, the rule, every file with its SHA-256."""
    python_version: str
    files: tuple
    texts: dict

    def split(self, name: str) -> np.ndarray:
        """The bytes of split ``name`` ("train", "validation" or "test") as a uint8 array."""
        if name not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {name!r}")
        return np.frombuffer(self.texts[name], dtype=np.uint8)

    def manifest(self) -> dict:
        return {"python_version": self.python_version,
                "rule": "every *.py directly in the standard library's folder, split by sha256(name): "
                        "0 test, 1 validation, 2-9 train (first 32 bits mod 10); bytes, vocabulary 256",
                "sizes": {s: len(self.texts[s]) for s in SPLITS},
                "files": [vars(f) for f in self.files]}


def stdlib_corpus(folder=None) -> StdlibCorpus:
    """The corpus of the running Python: every ``*.py`` directly in its standard-library folder (no packages, no
    tests, no site-packages), read as bytes.

    Args:
        folder: another folder of .py files to use instead (tests); default sysconfig's "stdlib" path.
    Returns:
        a StdlibCorpus; the same Python installation always gives the same one.
    """
    folder = Path(folder or sysconfig.get_paths()["stdlib"])
    files, parts = [], {s: [] for s in SPLITS}
    for path in sorted(folder.glob("*.py")):
        raw = path.read_bytes()
        f = CorpusFile(path.name, hashlib.sha256(raw).hexdigest(), len(raw), split_of(path.name))
        files.append(f)
        parts[f.split].append(raw)
    empty = [s for s in SPLITS if not parts[s]]
    if empty:
        raise ValueError(f"{folder}: no .py files fall in split(s) {empty}")
    version = ".".join(map(str, sys.version_info[:3]))
    return StdlibCorpus(version, tuple(files), {s: b"\n\n".join(parts[s]) for s in SPLITS})


def lm_windows(data, rng, n, length):
    """n random windows of a byte array for next-character prediction: (inputs, targets), each (n, length),
    targets[:, t] = inputs[:, t + 1] (the window is length + 1 bytes long)."""
    if len(data) < length + 1:
        raise ValueError(f"data holds {len(data)} bytes, fewer than a window of {length + 1}")
    starts = rng.integers(0, len(data) - length, size=n)
    windows = np.stack([data[s:s + length + 1] for s in starts]).astype(np.int64)
    return windows[:, :-1], windows[:, 1:]


def long_samples(data, rng, n, length, *, period=None):
    """The two kinds of long evaluation sample of the ReRoPE post (https://spaces.ac.cn/archives/9708, its tables'
    "重复" and "不重复" columns): (inputs, targets) (n, length) for next-character prediction.

    Args:
        data: a byte array (a corpus split).
        rng: a numpy Generator (picks the start of each sample).
        n: number of samples.
        length: the evaluation length.
        period: None for non-repeated text (one contiguous stretch); else repeated text: a stretch of ``period``
            characters said again and again up to ``length``, so that past the first period every character can be
            copied from one period earlier.
    """
    if period is None:
        return lm_windows(data, rng, n, length)
    if period < 1:
        raise ValueError(f"period must be >= 1, got {period}")
    stretch, _ = lm_windows(data, rng, n, period)                                    # (n, period)
    tiled = np.tile(stretch, (1, -(-(length + 1) // period)))[:, :length + 1]
    return tiled[:, :-1], tiled[:, 1:]
