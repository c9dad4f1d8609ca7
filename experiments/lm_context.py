"""What the shipped language models are worth: beside general-purpose compressors on the same bytes, and with the
recurrent state carried through the whole text instead of restarted every 256 bytes.

    python -m seqmix.experiments.lm_context            the shipped models of experiments/results (minutes)
    python -m seqmix.experiments.lm_context --quick    tiny untrained models on a few KB (seconds), into results/quick

Two questions the language-model report (language_model.md) leaves open:
1. An honest anchor. The bigram (3.57 bits per byte) is a low bar; a compressor is the usual one. gzip -9, bzip2 -9
   and xz -9 (Python's gzip, bz2 and lzma modules) and zstd -19 (the zstd command where it is installed, else "-")
   on exactly the bytes the models are scored on, as 8 x compressed size / size. A compressor reads the whole text.
2. What recurrence buys. The report scores every byte with at most 255 bytes before it (consecutive windows of the
   training length, each from the initial state). A recurrent model can read on: here the text is read whole, in
   chunks of `chunk` bytes with the state carried from chunk to chunk, so every byte is predicted from everything
   before it, as a compressor's is. Reported: bits per byte both ways, and bits per byte against the position in
   the file (lm_context.png): the windowed curve stops falling at the window; a state that keeps using context
   keeps falling.

Texts: the stdlib corpus's test split (experiments.data.stdlib_corpus, the report's: its files in name order, joined
by blank lines), and a held-out set from outside the standard library: .py files of an installed package the
project depends on (HELD_OUT), tests excluded, ASCII, at most MAX_FILE bytes each (so that no one data table fills
the set), taken in the order of the SHA-256 of their names (a spread over the package that no one chose) until
held_out_bytes are gathered, joined the same way; every file's SHA-256 is recorded, so that another version shows.

Writes lm_context.json (a row per text: sizes, the compressors, per model both ways, the files), lm_context.md and
lm_context.png.
"""
from __future__ import annotations

import bz2
import gzip
import hashlib
import importlib.util
import lzma
import math
import shutil
import subprocess
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from seqmix.experiments import data, plots
from seqmix.experiments.records import RESULTS, Results, command_line, environment, markdown_table, provenance
from seqmix.experiments.training import torch_settings
from seqmix.models.cli import load_model
from seqmix.models.rwkv7 import Rwkv7

__all__ = ["Setup", "FULL", "QUICK", "HELD_OUT", "COMPRESSORS", "compressed_bpb", "stream_nll", "window_nll",
           "positions_in_files", "held_out_files", "run", "report", "merged", "main"]

NAME = "lm_context"
LN2 = math.log(2)
SEPARATOR = b"\n\n"                       # how data.stdlib_corpus joins a split's files
HELD_OUT = "numpy"                        # a dependency of the project, so installed wherever the project is
MAX_FILE = 65536
SHIPPED = ("rwkv4", "rwkv7", "mamba")


@dataclass(frozen=True)
class Setup:
    """models: the folder of the shipped model directories (None: tiny untrained stand-ins, the quick run's);
    more: (folder, label) of other shipped models (language_model.probe's longer runs), read where the folder
    exists, each of its model directories listed as "<arch> (<label>)"; window: the report's evaluation window (the
    training length); chunk: bytes per forward when the text is read whole (the state carried across); max_bytes:
    at most this many bytes of each text (None: all of it); held_out_bytes: the held-out set's size (files in name
    order until it is reached)."""
    models: Path | None
    more: tuple = ()
    window: int = 256
    chunk: int = 2048
    max_bytes: int | None = None
    held_out_bytes: int = 200_000


FULL = Setup(models=RESULTS / "weights" / "language_model",
             more=((RESULTS / "weights" / "language_model-3x", "3x the steps"),))
QUICK = Setup(models=None, window=32, chunk=48, max_bytes=3000, held_out_bytes=3000)


# ---------------------------------------------------------------------------------------------------------------
# Compressors: bits per byte = 8 x compressed bytes / bytes
# ---------------------------------------------------------------------------------------------------------------

def _zstd(raw: bytes) -> bytes | None:
    """zstd -19 through the command (Python 3.11 has no zstd module); None where the command is not installed."""
    if shutil.which("zstd") is None:
        return None
    return subprocess.run(["zstd", "-19", "-q", "-c"], input=raw, capture_output=True, check=True).stdout


COMPRESSORS = {"gzip -9": lambda raw: gzip.compress(raw, 9, mtime=0), "bzip2 -9": lambda raw: bz2.compress(raw, 9),
               "xz -9": lambda raw: lzma.compress(raw, preset=9), "zstd -19": _zstd}


def compressed_bpb(text: bytes) -> dict:
    """{compressor: bits per byte of ``text`` (None: that compressor is not installed)}."""
    sizes = {name: compress(text) for name, compress in COMPRESSORS.items()}
    return {name: None if packed is None else 8 * len(packed) / len(text) for name, packed in sizes.items()}


# ---------------------------------------------------------------------------------------------------------------
# The models, both ways: nats of every byte after the first
# ---------------------------------------------------------------------------------------------------------------

def _logits_and_state(model, ids, state):
    """(logits (1, T, 256), state after ids): Rwkv7 returns them as a pair, the transformers-style models as an
    output object (use_cache=True: with the state)."""
    if isinstance(model, Rwkv7):
        return model(ids, state=state)
    out = model(ids, state=state, use_cache=True)
    return out.logits, out.state


def _nll(logits, targets):
    return torch.nn.functional.cross_entropy(logits[0].double(), targets[0], reduction="none")


@torch.no_grad()
def stream_nll(model, text: bytes, chunk: int) -> np.ndarray:
    """The text read whole: ``chunk`` bytes a forward, the state carried, so byte p is predicted from bytes
    0 .. p-1. Returns the nats of bytes 1 .. len(text) - 1, (len(text) - 1,) float64."""
    ids = torch.tensor(list(text), dtype=torch.int64)[None]
    state, nll = None, []
    for start in range(0, ids.shape[1] - 1, chunk):
        piece = ids[:, start:start + chunk + 1]
        logits, state = _logits_and_state(model, piece[:, :-1], state)
        nll.append(_nll(logits, piece[:, 1:]))
    return torch.cat(nll).numpy()


@torch.no_grad()
def window_nll(model, text: bytes, window: int) -> np.ndarray:
    """The report's way: consecutive windows of ``window`` bytes, each from the initial state, so byte p is
    predicted from the (p - 1) mod window + 1 bytes since its window began. Same shape as stream_nll (the last,
    shorter window included)."""
    ids = torch.tensor(list(text), dtype=torch.int64)[None]
    nll = []
    for start in range(0, ids.shape[1] - 1, window):
        piece = ids[:, start:start + window + 1]
        nll.append(_nll(_logits_and_state(model, piece[:, :-1], None)[0], piece[:, 1:]))
    return torch.cat(nll).numpy()


def positions_in_files(sizes: list) -> np.ndarray:
    """For the files of ``sizes`` joined by SEPARATOR: the position within its own file of each byte after the
    first (the separator's bytes count as the end of the file before them), (total - 1,) int64."""
    spans = [size + len(SEPARATOR) for size in sizes[:-1]] + [sizes[-1]]
    return np.concatenate([np.arange(span) for span in spans])[1:]


# ---------------------------------------------------------------------------------------------------------------
# Texts
# ---------------------------------------------------------------------------------------------------------------

def held_out_files(limit: int) -> list:
    """[(name, bytes)] of the held-out package's .py files: tests excluded, ASCII, at most MAX_FILE bytes, in the
    order of sha256(name), until ``limit`` bytes are gathered."""
    spec = importlib.util.find_spec(HELD_OUT)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"the held-out package {HELD_OUT!r} is not installed")
    root = Path(next(iter(spec.submodule_search_locations)))
    names = sorted((path.relative_to(root.parent).as_posix() for path in root.rglob("*.py")
                    if "tests" not in path.relative_to(root).parts), key=lambda n: hashlib.sha256(n.encode()).digest())
    files, total = [], 0
    for name in names:
        raw = (root.parent / name).read_bytes()
        if not raw or len(raw) > MAX_FILE or not raw.isascii():
            continue
        files.append((name, raw))
        total += len(raw)
        if total >= limit:
            break
    return files


def _stdlib_test_files() -> list:
    corpus = data.stdlib_corpus()
    folder = Path(sysconfig.get_paths()["stdlib"])                  # where data.stdlib_corpus reads
    files = [(f.name, (folder / f.name).read_bytes()) for f in corpus.files if f.split == "test"]
    if SEPARATOR.join(raw for _, raw in files) != corpus.texts["test"]:
        raise AssertionError("the test split is not its files joined by blank lines")
    return files


def _cut(files: list, limit: int | None) -> list:
    """The files up to ``limit`` bytes in all (the last one cut), so a quick run reads a few KB."""
    if limit is None:
        return files
    kept, total = [], 0
    for name, raw in files:
        if total >= limit:
            break
        kept.append((name, raw[:limit - total]))
        total += len(kept[-1][1]) + len(SEPARATOR)
    return kept


# ---------------------------------------------------------------------------------------------------------------
# The run and its report
# ---------------------------------------------------------------------------------------------------------------

def _sources(setup: Setup) -> list:
    """[(weights, label, folder)]: the shipped models (label None; folder None: the quick run's untrained ones), then
    each folder of setup.more that exists. ``weights`` (the folder's name) keys the rows."""
    first = [(setup.models.name if setup.models else "untrained", None, setup.models)]
    return first + [(folder.name, label, folder) for folder, label in setup.more if folder.is_dir()]


def _models(setup: Setup, folder: Path | None) -> dict:
    """arch -> model in fp32, eval mode: the model directories in ``folder`` (setup.models' must hold every one of
    SHIPPED), or (None) tiny untrained models, the quick run's."""
    if folder is None:
        from seqmix.experiments import language_model
        torch.manual_seed(0)
        return {arch: language_model.build(arch, *spec, seq_len=setup.window).eval()
                for arch, *spec in language_model.QUICK.models if arch in SHIPPED}
    archs = SHIPPED if folder == setup.models else [a for a in SHIPPED if (folder / a).is_dir()]
    return {arch: load_model(folder / arch, "float32").eval() for arch in archs}


def _bpb_by_position(nll: np.ndarray, positions: np.ndarray, edges: np.ndarray) -> list:
    """[bits per byte of the bytes whose position lies in [edges[i], edges[i + 1])] (None for an empty bin)."""
    bins = np.digitize(positions, edges) - 1
    return [float(nll[bins == i].mean() / LN2) if (bins == i).any() else None for i in range(len(edges) - 1)]


def run(setup: Setup, out, seed: int = 0, threads: int = 1, progress: bool = True) -> Results:
    """Every (text, folder of models) not yet in <out>/lm_context.json: the compressors, then each model both
    ways."""
    out = Path(out)
    texts = {"stdlib test split": _stdlib_test_files(), f"held out: {HELD_OUT}": held_out_files(setup.held_out_bytes)}
    results = Results(out, NAME)
    with torch_settings(threads):
        for weights, label, folder in _sources(setup):
            _read_texts(setup, results, texts, weights, label, folder, threads, progress)
    report(results, setup, out)
    return results


def _read_texts(setup: Setup, results: Results, texts: dict, weights: str, label: str | None, folder: Path | None,
                threads: int, progress: bool) -> None:
    """One folder's models on every text not yet read with them (models loaded only if one is missing)."""
    models = None
    for name, files in texts.items():
        files = _cut(files, setup.max_bytes)
        text = SEPARATOR.join(raw for _, raw in files)
        key = dict(text=name, bytes=len(text), window=setup.window, chunk=setup.chunk, weights=weights)
        if results.find(**key):
            continue
        models = models or _models(setup, folder)
        positions = positions_in_files([len(raw) for _, raw in files])
        edges = np.unique(np.geomspace(1, max(2, positions.max() + 1), 24).astype(int))
        row = {**key, "label": label, "compressors": compressed_bpb(text), "position_edges": edges.tolist(),
               "models": {}}
        for arch, model in models.items():
            if progress:
                print(f"lm_context: {arch} on {name} ({len(text):,} bytes)", flush=True)
            windowed, whole = window_nll(model, text, setup.window), stream_nll(model, text, setup.chunk)
            row["models"][arch] = {"window_bpb": float(windowed.mean() / LN2),
                                   "stream_bpb": float(whole.mean() / LN2),
                                   "window_by_position": _bpb_by_position(windowed, positions, edges),
                                   "stream_by_position": _bpb_by_position(whole, positions, edges)}
        row["files"] = [{"name": n, "size": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
                        for n, raw in files]
        results.add({**row, "env": environment(threads)})


def report(results: Results, setup: Setup, out) -> str:
    """lm_context.md (a table per text) and lm_context.png (bits per byte against the position in the file)."""
    lines = [f"# The language models beside compressors, and reading whole texts\n\n"
             f"Bits per byte on the same bytes. Windowed: consecutive windows of {setup.window} bytes, each from the "
             f"initial state (language_model.md's protocol); whole text: read in chunks of {setup.chunk} bytes with "
             f"the state carried, so every byte is predicted from everything before it, as a compressor reads. "
             f"Compressors: 8 x compressed size / size. A model with a label in brackets is another run's "
             f"(language_model.md's longer runs).\n"]
    texts = merged(results.rows)
    for row in texts:
        best = min((row["compressors"][c], c) for c in COMPRESSORS if row["compressors"][c] is not None)
        table = [[arch, f"{m['window_bpb']:.3f}", f"{m['stream_bpb']:.3f}",
                  "yes" if m["stream_bpb"] < best[0] else "no"] for arch, m in row["models"].items()]
        table += [[name, "-", "-" if value is None else f"{value:.3f}", "(anchor)"]
                  for name, value in row["compressors"].items()]
        lines += [f"\n## {row['text']} ({row['bytes']:,} bytes, {len(row['files'])} files)\n\n",
                  markdown_table(["model or compressor", f"windowed ({setup.window})", "whole text",
                                  f"beats {best[1]} ({best[0]:.3f})"], table)]
    lines.append(provenance(results.rows, lambda r: f"{r['text']} ({r.get('weights', 'language_model')})"))
    text = "".join(lines)
    Path(out, f"{NAME}.md").write_text(text)
    plots.lm_context(texts, Path(out, f"{NAME}.png"))
    return text


def merged(rows: list) -> list:
    """One row per text: the first folder's row (its compressors) with every other folder's models added as
    "<arch> (<label>)"; the rows of one text must have read the same files (names, sizes, SHA-256)."""
    texts = {}
    for row in rows:
        key, label = (row["text"], row["bytes"]), row.get("label")
        models = {arch if label is None else f"{arch} ({label})": m for arch, m in row["models"].items()}
        if key not in texts:
            texts[key] = {**row, "models": models}
        elif row["files"] != texts[key]["files"]:
            raise ValueError(f"{row['text']}: the rows of two folders read different files")
        else:
            texts[key]["models"].update(models)
    return list(texts.values())


def main(argv=None) -> None:
    command_line(__doc__, run, FULL, QUICK, argv)


if __name__ == "__main__":
    main()
