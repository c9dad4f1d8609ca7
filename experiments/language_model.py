"""The project's own small language models: four byte-level models of about one million parameters each, trained
alike on the standard library's sources, against a bigram control.

    python -m seqmix.experiments.language_model            the full run, about two core-hours (FULL; resumable:
                                                           rerun it to continue), into experiments/results
    python -m seqmix.experiments.language_model --quick    tiny models, about 20 CPU seconds (a minute or more of
                                                           wall clock on a busy machine), into experiments/results/quick
    (--seed, --threads, --out, --no-progress: experiments.records.parse_args)

The models (experiments.zoo, vocabulary 256: the bytes), widths and depths chosen so that the full run's parameter
counts agree within 10% (0.92M to 0.98M; the quick run's tiny models do not: its RWKV-7, at head size 64, has
162k parameters against 41k to 48k); printed, and recorded as the "size" rows:
    rwkv4      models.rwkv4.RwkvForCausalLM (transformers' names)
    rwkv7      models.rwkv7.Rwkv7 (BlinkDL's names, BlinkDL's training init; head size 64, BlinkDL's and fla's)
    mamba      models.mamba.MambaForCausalLM (transformers' names, Mamba's training init; twice the layers, as
               Mamba pairs one mixer block against a transformer's attention + MLP)
    attention  experiments.transformer.Transformer (RoPE), shipped in transformers' GPT-NeoX layout
               (experiments.transformer_neox)

Data: experiments.data.stdlib_corpus() (the running Python's Lib/*.py, split by file name; its manifest with every
file's SHA-256 is written to stdlib_corpus.json). Training samples random windows of the train split; the
validation curve is measured on fixed random windows of the validation split; the final numbers are over whole
splits (or their first eval_bytes bytes), cut into consecutive windows, so that every byte but the first is
predicted once.

Protocol, the same for the four: AdamW (experiments.training: decay on weight matrices only), linear warmup then
cosine decay, the same token budget. The learning rate of each model is chosen on validation loss from a pilot:
every rate of the grid trained pilot_steps steps (a schedule of its own), the grid extended past an edge winner
(training.extend_to_interior); the winner's rate is then trained for the full budget. A run checkpoints itself at
each validation under <out>/checkpoints/language_model/ and resumes from there; finished phases are rows of
language_model.json and are skipped on a rerun.

The control: a bigram model of the train split's bytes with add-one smoothing,
P(b | a) = (n(a, b) + 1) / (n(a) + 256); its bits per byte on a split are computed exactly (every predicted byte).
Every model of the full run is meant to beat it; the report's "beats bigram" column says whether it did (in the
quick run the tiny transformer does not).

Glossary: bpb, bits per byte = cross-entropy in nats / ln 2 (a byte-level model predicts one byte per token);
tokens seen = steps * batch_size * seq_len; CPU tokens/s = tokens / time.process_time() of the training steps (the
machine is shared, so wall-clock speeds vary; CPU time does not), on --threads threads (default 1).

Written into the output folder: language_model.json (a row per finished phase: bigram, size, speed, pilot, final),
language_model.md (the table, greedy samples, the comparison with the papers), language_model.png (validation bits
per byte against tokens seen), stdlib_corpus.json, and the shipped weights (weights/language_model/), fp16 with the
decays kept fp32 as the peers keep them (KEEP_FP32, the models' keep_in_fp32, which their loaders keep fp32), every
number of the report measured on exactly these stored values:
    rwkv4/           a transformers RwkvForCausalLM directory (config.json, model.safetensors, tokenizer.json)
    mamba/           a transformers MambaForCausalLM directory
    rwkv7/           a flash-linear-attention RWKV7ForCausalLM directory
    rwkv7.pth        the same RWKV-7 as a BlinkDL checkpoint; tokenizer.json beside it
    attention/       the transformer as a transformers GPTNeoXForCausalLM directory (experiments.transformer_neox;
                     read back into a Transformer by its load_neox)
Another --seed k writes its own language_model-seed<k>.md, .png and weights/language_model-seed<k>/ (rows of every
seed share language_model.json, keyed by seed), so it never replaces seed 0's committed files; seed 0's report
(language_model.md) reads every seed whose four final runs have run in "The ranking over seeds".
tokenizer.json (the `tokenizers` library): a byte-level BPE without merges whose ids are the 256 byte values; no
special tokens (the configs' bos/eos/pad id 0 is the NUL byte, which no .py file of the corpus contains).
Try one (the full run's weights are committed; --quick writes under results/quick/):
python -m seqmix.generate experiments/results/weights/language_model/rwkv7 --prompt "def "
"""
from __future__ import annotations

import copy
import json
import math
import sys
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np
import torch

from . import data, plots, zoo
from .records import Results, command_line, environment, made_on, markdown_table, provenance, setup_label
from .transformer_neox import save_neox
from .training import Budget, Run, decay_groups, evaluate, extend_to_interior, torch_settings
from ..models.base import kept_name
from ..models.cli import load_model
from ..models.io import atomic_write, save_state_dict, write_text_atomically
from ..models.mamba import MambaForCausalLM
from ..models.rwkv4 import RwkvForCausalLM
from ..models.rwkv7 import Rwkv7

__all__ = ["Setup", "FULL", "QUICK", "ARCHS", "KEEP_FP32", "BigramModel", "byte_tokenizer", "build", "bpb",
           "keeps_fp32", "as_stored", "round_as_stored", "ship", "consecutive_windows", "measure_speed",
           "generation_speed", "run", "probe", "report", "main"]

NAME = "language_model"
ARCHS = ("rwkv4", "rwkv7", "mamba", "attention")
SHIPPED = ARCHS
VOCAB = 256
LN2 = math.log(2)
# Parameters stored fp32 beside the fp16 rest, as the peers keep them: each model's own keep_in_fp32 (RWKV-4's decay
# and bonus, Mamba's A_log, D and delta's bias, RWKV-7's decay: w0 and its LoRA w1, w2), the parameters its
# loaders keep fp32. Matched as the last parts of a state-dict name (models.base.kept_name).
KEEP_FP32 = {"rwkv4": RwkvForCausalLM.keep_in_fp32, "mamba": MambaForCausalLM.keep_in_fp32,
             "rwkv7": Rwkv7.keep_in_fp32, "attention": ()}
STORED_DTYPE = torch.float16


@dataclass(frozen=True)
class Setup:
    """models: (arch, width C, layers, head size) per model (the head size is attention's and RWKV-7's).
    seq_len: training and evaluation window. budget: the final runs' (the same for every model).
    lrs: the pilot's grid; pilot_steps: each pilot run's steps (its own warmup and cosine); extend: the factor for
    extending the grid past an edge winner (None: never). valid_windows: windows of the validation curve.
    eval_bytes: the final bits per byte over the first eval_bytes bytes of each split (None: the whole split).
    speed_steps: training steps timed per model before training (the "speed" rows)."""
    models: tuple
    seq_len: int
    budget: Budget
    lrs: tuple
    pilot_steps: int
    extend: float | None = 2.0
    valid_windows: int = 64
    eval_bytes: int | None = None
    speed_steps: int = 5
    generate_tokens: int = 64
    note: str = ""

    def pilot_budget(self) -> Budget:
        return Budget(steps=self.pilot_steps, batch_size=self.budget.batch_size,
                      eval_every=self.pilot_steps, weight_decay=self.budget.weight_decay)

    def tokens_per_step(self) -> int:
        return self.budget.batch_size * self.seq_len


# Sized from training speed measured here (measure_speed, 3 steps after a warm-up, one thread, tokens per CPU
# second by time.process_time, the machine loaded by other work): rwkv4 9.9k, rwkv7 6.7k, mamba 4.9k, attention
# 9.9k. Per model: 3 pilot rates x 200 steps + 2000 final steps, 4096 tokens a step = 10.6M tokens; over the four
# 10.6M x (1/9.9k + 1/6.7k + 1/4.9k + 1/9.9k) s = 5900 CPU s = 1.64 core-hours, plus evaluations (about 0.1) and
# each grid extension a pilot adds (0.05 to 0.12 each): about two core-hours.
FULL = Setup(models=(("rwkv4", 128, 4, 64), ("rwkv7", 128, 4, 64), ("mamba", 128, 8, 64), ("attention", 120, 5, 40)),
             seq_len=256, budget=Budget(steps=2000, batch_size=16, warmup=0.02, eval_every=100),
             lrs=(1e-3, 3e-3, 9e-3), pilot_steps=200, extend=3.0)
QUICK = Setup(models=(("rwkv4", 32, 2, 16), ("rwkv7", 64, 2, 64), ("mamba", 32, 4, 16), ("attention", 32, 2, 16)),
              seq_len=64, budget=Budget(steps=150, batch_size=8, warmup=0.05, eval_every=50), lrs=(1e-2, 3e-2),
              pilot_steps=10, extend=None, valid_windows=16, eval_bytes=8192, speed_steps=2, generate_tokens=16)


# ---------------------------------------------------------------------------------------------------------------
# The control, the tokenizer, the models
# ---------------------------------------------------------------------------------------------------------------

class BigramModel:
    """P(b | a) = (n(a, b) + alpha) / (n(a) + 256 alpha), n counted over consecutive bytes of ``train``."""

    def __init__(self, train: np.ndarray, alpha: float = 1.0):
        counts = np.zeros((VOCAB, VOCAB))
        np.add.at(counts, (train[:-1], train[1:]), 1)
        self.log2_p = np.log2((counts + alpha) / (counts.sum(1, keepdims=True) + VOCAB * alpha))   # [a, b]

    def bits_per_byte(self, inputs: np.ndarray, targets: np.ndarray) -> float:
        """The mean of -log2 P(target | input) over every pair (exact, no sampling)."""
        return float(-self.log2_p[inputs, targets].mean())


def _bytes_to_unicode() -> dict:
    """GPT-2's map of the 256 bytes to printable characters (what the `tokenizers` ByteLevel pre-tokenizer uses)."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_tokenizer():
    """A `tokenizers` Tokenizer whose ids are the byte values 0..255 of the UTF-8 text: byte-level BPE with the
    256 single-byte tokens and no merges, no normalizer, no special tokens; decoding joins the bytes (an incomplete
    UTF-8 character decodes to U+FFFD)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def build(arch: str, width: int, layers: int, head_size: int, seq_len: int):
    """A fresh byte-level model of experiments.zoo (seed torch first)."""
    return zoo.build(arch, vocab_size=VOCAB, width=width, layers=layers, head_size=head_size,
                     train_length=seq_len)


def _forward(model, ids):
    return zoo.logits(model, ids)


def bpb(nats: float) -> float:
    return nats / LN2


def keeps_fp32(arch: str, name: str) -> bool:
    """Whether parameter ``name`` (the model's own state-dict name) is shipped fp32 (KEEP_FP32)."""
    return kept_name(name, KEEP_FP32[arch])


@torch.no_grad()
def as_stored(model, arch: str):
    """A copy of ``model`` in the shipped dtypes: fp16, the KEEP_FP32 parameters fp32."""
    stored = copy.deepcopy(model)
    for name, p in stored.named_parameters():
        p.data = p.data.float() if keeps_fp32(arch, name) else p.data.to(STORED_DTYPE)
    return stored


@torch.no_grad()
def round_as_stored(model, arch: str) -> None:
    """In place: every parameter rounded as it is shipped (fp16, KEEP_FP32 ones kept), in fp32."""
    for name, p in model.named_parameters():
        if not keeps_fp32(arch, name):
            p.copy_(p.to(STORED_DTYPE).float())


def per_seed(name: str, seed: int) -> str:
    """The name of a seed's files: seed 0's (the committed run's) as they always were, another seed's with
    "-seed<k>", so that a run with another seed into the same folder never replaces seed 0's weights or report."""
    return name if seed == 0 else f"{name}-seed{seed}"


def ship(model, arch: str, folder: Path) -> list:
    """Write ``model`` (fp32, already rounded) in its ecosystem's formats into ``folder``; the paths written. Every
    file through models.io.atomic_write."""
    folder.mkdir(parents=True, exist_ok=True)
    stored = as_stored(model, arch)
    tokenizer = byte_tokenizer()
    if arch == "attention":                              # no save_pretrained of its own: GPT-NeoX's layout
        save_neox(stored, folder / arch)
    else:
        stored.save_pretrained(folder / arch)
    _save_tokenizer(tokenizer, folder / arch / "tokenizer.json")
    written = [folder / arch]
    if arch == "rwkv7":                                  # BlinkDL's .pth: the model's own names, torch's format
        save_state_dict(stored.state_dict(), folder / "rwkv7.pth")
        _save_tokenizer(tokenizer, folder / "tokenizer.json")
        written += [folder / "rwkv7.pth", folder / "tokenizer.json"]
    return written


def _save_tokenizer(tokenizer, path: Path) -> None:
    with atomic_write(path) as tmp:
        tokenizer.save(tmp)


# ---------------------------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------------------------

def measure_speed(setup: Setup, spec: tuple, corpus, steps: int | None = None) -> dict:
    """Training tokens per second of one model at its size (forward, backward, AdamW step), over ``steps`` steps
    after one warm-up step: CPU time (time.process_time) and wall clock."""
    arch, width, layers, head_size = spec
    torch.manual_seed(0)
    model = build(arch, width, layers, head_size, setup.seq_len)
    optimizer = torch.optim.AdamW(decay_groups(model, 0.1), lr=1e-4)
    rng = np.random.default_rng(0)
    steps = steps or setup.speed_steps
    cpu = wall = 0.0
    for i in range(steps + 1):
        x, y = (torch.from_numpy(a) for a in data.lm_windows(corpus.split("train"), rng, setup.budget.batch_size,
                                                              setup.seq_len))
        start, start_cpu = time.perf_counter(), time.process_time()
        loss = torch.nn.functional.cross_entropy(_forward(model, x).float().reshape(-1, VOCAB), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if i:                                            # the first step warms caches and allocators up
            cpu += time.process_time() - start_cpu
            wall += time.perf_counter() - start
    tokens = steps * setup.tokens_per_step()
    return {"steps": steps, "tokens_per_cpu_second": round(tokens / cpu), "tokens_per_second": round(tokens / wall)}


def consecutive_windows(split: np.ndarray, length: int, limit: int | None = None):
    """(inputs, targets) (n, length) covering split[:limit] in consecutive windows: every byte after the first is
    a target once (a last partial window is left out)."""
    split = split[:limit] if limit else split
    n = (len(split) - 1) // length
    if n < 1:
        raise ValueError(f"a split of {len(split)} bytes holds no window of {length + 1}")
    x = split[:n * length].astype(np.int64).reshape(n, length)
    y = split[1:n * length + 1].astype(np.int64).reshape(n, length)
    return x, y


@torch.no_grad()
def generation_speed(model, arch: str, prompt: str, tokens: int) -> dict:
    """Greedy decoding speed (tokens/s, wall clock, on the run's threads: one by default). A shipped model is read
    back from its directory in fp32 (models.cli.load_model, with its tokenizer.json) and decodes through
    generate_text, its state carried from token to token; the transformer, which has no KV cache here, reruns the
    whole prefix for every new token (its row says so). ``model``: the shipped directory, or the transformer itself."""
    if arch != "attention":
        loaded = load_model(model, "float32")
        stream = loaded.generate_text(prompt, loaded.tokenizer, max_new_tokens=tokens, temperature=0.0)
        text = "".join(stream)
        return {"tokens_per_second": round(stream.decode_tokens_per_s, 1), "sample": prompt + text,
                "how": "recurrent state, fp32"}
    ids = torch.tensor([list(prompt.encode())])
    start = time.perf_counter()
    for _ in range(tokens):
        ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], 1)
    seconds = time.perf_counter() - start
    return {"tokens_per_second": round(tokens / seconds, 1),
            "sample": bytes(ids[0].tolist()).decode("utf-8", errors="replace"),
            "how": "whole prefix per token (no KV cache), fp32"}


# ---------------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------------

class LmRun(Run):
    """A Run ranked by validation loss (lower is better) instead of accuracy; a diverged run ranks last."""

    @property
    def score(self) -> tuple:
        if self.diverged:
            return (-math.inf,)
        return (-self.history[-1][3],)


def _make_run(setup: Setup, spec: tuple, corpus, valid, out: Path, seed: int, phase: str, lr: float) -> LmRun:
    arch, width, layers, head_size = spec
    budget = setup.pilot_budget() if phase == "pilot" else setup.budget
    checkpoint = out / "checkpoints" / NAME / f"{arch}-C{width}-L{layers}-{phase}{budget.steps}-lr{lr:.3g}-s{seed}.pt"
    train = corpus.split("train")
    return LmRun(build=partial(build, arch, width, layers, head_size, setup.seq_len), forward=_forward,
                 sample=lambda rng, n: data.lm_windows(train, rng, n, setup.seq_len), lr=lr, budget=budget,
                 seed=seed, valid=valid, label=f"{arch} {phase} lr={lr:.3g}", checkpoint=checkpoint)


def _pilot(results, setup, spec, make_run, seed, env, progress) -> float:
    arch = spec[0]
    row = results.find(phase="pilot", arch=arch, seed=seed)
    if row is None:
        runs = [make_run("pilot", lr).train_to(setup.pilot_steps, progress) for lr in setup.lrs]
        winner = max(runs, key=lambda r: r.score)
        if setup.extend is not None:
            winner, runs = extend_to_interior(winner, runs, partial(make_run, "pilot"), setup.pilot_budget(),
                                              factor=setup.extend, progress=progress)
        row = results.add({"phase": "pilot", "arch": arch, "seed": seed, "chosen_lr": winner.lr,
                           "runs": [r.summary() for r in runs], "env": env})
    return row["chosen_lr"]


def _held_out(setup: Setup, corpus) -> dict:
    """The final measurement's windows of each held-out split (consecutive_windows)."""
    return {s: consecutive_windows(corpus.split(s), setup.seq_len, setup.eval_bytes) for s in ("validation", "test")}


def _valid_curve(setup: Setup, corpus):
    """The fixed random windows of the validation split that every run's validation curve is measured on."""
    return data.lm_windows(corpus.split("validation"), data.held_out_rng(data.VALID), setup.valid_windows,
                           setup.seq_len)


def _final_metrics(model, arch: str, held_out: dict) -> dict:
    """Bits per byte of each held-out split, measured on the weights as shipped (rounded in place first)."""
    round_as_stored(model, arch)
    model.eval()
    return {f"{s}_bpb": bpb(evaluate(_forward, model, *held_out[s], batch_size=16)["loss"]) for s in held_out}


def run(setup: Setup, out, seed: int = 0, threads: int = 1, progress: bool = True) -> Results:
    out = Path(out)
    with torch_settings(threads):
        corpus = data.stdlib_corpus()
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomically(out / "stdlib_corpus.json", json.dumps(corpus.manifest(), indent=1) + "\n")
        results = Results(out, NAME, setup_label(setup, FULL, QUICK))
        env = environment(threads)
        held_out = _held_out(setup, corpus)
        if results.find(phase="bigram") is None:
            bigram = BigramModel(corpus.split("train"))
            results.add({"phase": "bigram", "alpha": 1.0,
                         **{f"{s}_bpb": bigram.bits_per_byte(*held_out[s]) for s in held_out},
                         **{f"{s}_bytes": int(held_out[s][1].size) for s in held_out}})
        for spec in setup.models:
            arch, width, layers, head_size = spec
            if results.find(phase="size", arch=arch) is None:
                torch.manual_seed(0)
                params = zoo.num_parameters(build(arch, width, layers, head_size, setup.seq_len))
                results.add({"phase": "size", "arch": arch, "width": width, "layers": layers,
                             "head_size": head_size, "parameters": params})
            if results.find(phase="speed", arch=arch) is None:
                results.add({"phase": "speed", "arch": arch, **measure_speed(setup, spec, corpus), "env": env})
        for row in results.select(phase="size"):
            print(f"{row['arch']:>9}: {row['parameters']:,} parameters (C {row['width']}, {row['layers']} layers)")
        valid = _valid_curve(setup, corpus)
        for spec in setup.models:
            arch = spec[0]
            if results.find(phase="final", arch=arch, seed=seed) is not None:
                continue
            make_run = partial(_make_run, setup, spec, corpus, valid, out, seed)
            weights = out / "weights" / per_seed(NAME, seed)
            lr = _pilot(results, setup, spec, make_run, seed, env, progress)
            final = make_run("final", lr).train_to(setup.budget.steps, progress)
            metrics = _final_metrics(final.model, arch, held_out)
            model = final.model
            row = {"phase": "final", "arch": arch, "seed": seed, **final.summary(), **metrics,
                   "train_tokens": final.tokens,
                   "train_tokens_per_cpu_second": round(final.tokens / max(final.cpu_seconds, 1e-9))}
            if arch in SHIPPED:
                row["shipped"] = [str(p.relative_to(out)) for p in ship(model, arch, weights)]
            shipped = weights / arch if arch != "attention" else model   # models.cli reads the recurrent three
            row["generation"] = generation_speed(shipped, arch, "def ", setup.generate_tokens)
            results.add({**row, "env": env})
        report(results, setup, out, seed)
        return results


PROBES = "language_model_probes"


def probe(out, *, arch: str, lr: float | None = None, factor: int = 1, seed: int = 0, setup: Setup | None = None,
          threads: int = 1, progress: bool = True) -> dict:
    """Why does one model trail another, and what does a longer run buy? A final run of ``arch`` (setup's size,
    data and measurement) at a rate of one's choosing (None: its final run's, the pilot's choice), over ``factor``
    times the budget's steps with the warmup kept in steps (Budget.longer), so that two models can be compared at the
    same rate, or one model at a larger budget. Its row (phase "probe", or "long" with its factor: validation and
    test bits per byte, the validation curve) goes to <out>/language_model_probes.json and the report lists it; a
    row already there is returned, not run again (a stopped run resumes from its checkpoint, which a final run at the
    same rate, seed and steps shares). A longer run is shipped as the finals are, into
    weights/language_model-<factor>x/ (weights/language_model-seed<k>-<factor>x/ for another seed), where
    lm_context reads it whole; a probe at 1x ships nothing."""
    setup = setup or FULL
    spec = next((m for m in setup.models if m[0] == arch), None)
    if spec is None:
        raise ValueError(f"arch must be one of {[m[0] for m in setup.models]}, got {arch!r}")
    if not (isinstance(factor, int) and factor >= 1):
        raise ValueError(f"factor must be a whole number >= 1, got {factor!r}")
    out = Path(out)
    if lr is None:
        final = Results(out, NAME).find(phase="final", arch=arch, seed=seed)
        if final is None:
            raise ValueError(f"lr=None takes {arch}'s final rate, and {out / NAME}.json has no final run of seed "
                             f"{seed}: give lr")
        lr = final["lr"]
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr!r}")
    results = Results(out, PROBES, setup_label(setup, FULL, QUICK))
    key = dict(phase="probe", arch=arch, lr=lr, seed=seed) if factor == 1 else dict(
        phase="long", arch=arch, lr=lr, seed=seed, factor=factor)
    done = results.find(**key)
    if done is not None:
        return done
    env = environment(threads)
    longer = replace(setup, budget=setup.budget.longer(factor))
    with torch_settings(threads):
        corpus = data.stdlib_corpus()
        run = _make_run(longer, spec, corpus, _valid_curve(setup, corpus), out, seed, "final", lr)
        run.train_to(longer.budget.steps, progress)
        row = {**key, **run.summary(), **_final_metrics(run.model, arch, _held_out(setup, corpus)),
               "warmup_steps": longer.budget.warmup_steps, "train_tokens": run.tokens,
               "train_tokens_per_cpu_second": round(run.tokens / max(run.cpu_seconds, 1e-9))}
        if factor > 1:
            folder = longer_weights(out, seed, factor)
            row["shipped"] = [str(p.relative_to(out)) for p in ship(run.model, arch, folder)]
        return results.add({**row, "env": env})


def longer_weights(out, seed: int, factor: int) -> Path:
    """The folder a run of ``factor`` times the steps is shipped into (probe)."""
    return Path(out) / "weights" / f"{per_seed(NAME, seed)}-{factor}x"


# ---------------------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------------------

# What the papers' language-modelling comparisons at scale say, as (better, worse, source): the slot paragraph
# checks each against the measured test bits per byte.
CLAIMS = (
    ("mamba", "attention", "Mamba (arXiv:2312.00752, figure 4: the Pile, 125M to 1.3B parameters, equal tokens): "
                           "Mamba matches or beats the strongest transformer recipe (Transformer++)"),
    ("mamba", "rwkv4", "Mamba (same figure): Mamba's perplexity below RWKV(-4)'s"),
    ("rwkv7", "rwkv4", "RWKV-7 (arXiv:2503.14456): RWKV-7 ahead of the earlier RWKV generations at equal size"),
)


def final_runs(results: Results, seed: int = 0) -> dict:
    """Each model's final run of ``seed`` (model -> row; a later row of a model replaces an earlier one): the rows
    the report of that seed reads. Rows of every seed share language_model.json, so a reader names its seed."""
    return {r["arch"]: r for r in results.select(phase="final", seed=seed)}


def _ranking(finals: dict) -> str:
    """The models of ``finals`` by test bits per byte, best first: "rwkv7 < rwkv4 < ..."."""
    return " < ".join(sorted(finals, key=lambda a: finals[a]["test_bpb"]))


def _agrees(finals: dict, better: str, worse: str) -> bool:
    """Whether a paper's claim (``better`` below ``worse`` in test bits per byte) holds in ``finals``."""
    return finals[better]["test_bpb"] < finals[worse]["test_bpb"]


def _literature_paragraph(finals: dict) -> str:
    if set(finals) != set(ARCHS):
        return ("*Placeholder: the comparison with the Mamba and RWKV-7 papers' language-modelling results is "
                "written once all four models have measured results.*")
    lines = [f"Measured ranking by test bits per byte (best first): {_ranking(finals)}. Against the papers, which "
             f"train models 100 to 1000 times larger on far more tokens:"]
    for better, worse, source in CLAIMS:
        lines.append(f"- {source}: {'agrees' if _agrees(finals, better, worse) else 'disagrees'} here ({better} "
                     f"{finals[better]['test_bpb']:.3f} vs {worse} {finals[worse]['test_bpb']:.3f} bits per byte).")
    return "\n".join(lines)


def _seeds_section(results: Results, probes: list = ()) -> str:
    """The ranking over seeds: each model's test bits per byte on every seed whose four final runs have all run
    (its rate beside it: each seed's pilot chooses its own), their mean and spread, the ranking per seed, each
    paper's claim counted over the seeds, and its gap per seed at equal rates (``probes``: rate-probe rows of any
    seed); "" with fewer than two such seeds."""
    by_seed = {s: final_runs(results, s) for s in {r["seed"] for r in results.select(phase="final")}}
    seeds = sorted(s for s, rows in by_seed.items() if set(rows) == set(ARCHS))
    if len(seeds) < 2:
        return ""
    test = {a: [by_seed[s][a]["test_bpb"] for s in seeds] for a in ARCHS}
    rows = [[a, *(f"{b:.3f} ({by_seed[s][a]['lr']:.3g})" for s, b in zip(seeds, test[a])),
             f"{np.mean(test[a]):.3f}", f"{max(test[a]) - min(test[a]):.3f}"]
            for a in sorted(ARCHS, key=lambda a: np.mean(test[a]))]
    orders = [f"seed {s}: {_ranking(by_seed[s])}" for s in seeds]
    claims = [f"- {source}: agrees on {sum(_agrees(by_seed[s], b, w) for s in seeds)} of {len(seeds)} seeds."
              for b, w, source in CLAIMS]
    places = [f"seed {s}: {'; '.join(sorted({made_on(by_seed[s][a]) for a in ARCHS}))}" for s in seeds]
    return ("\n## The ranking over seeds\n\n"
            f"Every seed runs the whole protocol (its own pilots, hence possibly its own rates, in brackets) with the "
            f"same data and budget; test bits per byte of seeds {', '.join(map(str, seeds))}, their mean and their "
            f"spread (max - min), best mean first.\n\n"
            + markdown_table(["model", *(f"seed {s} (rate)" for s in seeds), "mean", "spread"], rows)
            + "\nRanking per seed (best first): " + "; ".join(orders) + ".\n\nThe papers' claims (above), per seed:\n"
            + "\n".join(claims) + "\n" + _equal_rates(by_seed, probes, seeds)
            + "\nMade on (CPU, commit): " + "; ".join(places) + ".\n")


def _rate(row: dict) -> float:
    """A row's rate as the reports compare it: rates computed on a grid (9e-3 * 3 = 0.026999999999999996) and rates
    typed by hand (0.027) are the same rate."""
    return round(row["lr"], 12)


def _equal_rates(by_seed: dict, probes: list, seeds: list) -> str:
    """Each paper's claim per seed at every rate where both of its models have a row of that seed (a final run or a
    rate probe): the gap, worse minus better in test bits per byte, so that a positive gap is the paper's order."""
    runs = {(s, a, _rate(r)): r for s in seeds for a, r in by_seed[s].items()}
    runs.update({(r["seed"], r["arch"], _rate(r)): r for r in probes if r["seed"] in seeds})
    rows = []
    for better, worse, _ in CLAIMS:
        for lr in sorted({lr for _, a, lr in runs if a == better} & {lr for _, a, lr in runs if a == worse}):
            gaps = [runs[s, worse, lr]["test_bpb"] - runs[s, better, lr]["test_bpb"]
                    if (s, better, lr) in runs and (s, worse, lr) in runs else None for s in seeds]
            if any(g is not None for g in gaps):
                rows.append([f"{better} below {worse}", f"{lr:.3g}",
                             *("-" if g is None else f"{g:+.3f}" if round(g, 3) else "0.000" for g in gaps)])
    if not rows:
        return ""
    return (f"\nThe same claims at equal rates (per seed, the final runs and the rate probes of {PROBES}.json): the "
            "gap, worse minus better in test bits per byte, positive in the paper's order; a gap within about 0.01 "
            "is within what a same-seed rerun moves.\n\n"
            + markdown_table(["claim", "rate", *(f"seed {s}" for s in seeds)], rows))


def report(results: Results, setup: Setup, out, seed: int = 0) -> str:
    """language_model.md (the table and the literature slot) and language_model.png (validation curves), of
    ``seed``'s runs (another seed's: language_model-seed<k>.md and .png, per_seed)."""
    out = Path(out)
    bigram = results.find(phase="bigram")
    sizes = {r["arch"]: r for r in results.select(phase="size")}
    speeds = {r["arch"]: r for r in results.select(phase="speed")}
    finals = final_runs(results, seed)
    pilots = {r["arch"]: r for r in results.select(phase="pilot", seed=seed)}
    tps = setup.tokens_per_step()
    rows = []
    for arch in ARCHS:
        f, size, speed = finals.get(arch), sizes.get(arch), speeds.get(arch)
        pilot = pilots.get(arch)
        rows.append([arch, f"{size['parameters']:,}" if size else "-",
                     f"{speed['tokens_per_cpu_second']:,}" if speed else "-",
                     ", ".join(f"{r['lr']:.3g}" for r in pilot["runs"]) if pilot else "-",
                     f"{f['lr']:.3g}" if f else "-", f"{f['train_tokens']:,}" if f else "-",
                     f"{f['train_tokens_per_cpu_second']:,}" if f else "-",
                     f"{f['validation_bpb']:.3f}" if f else "-", f"{f['test_bpb']:.3f}" if f else "-",
                     ("yes" if f["validation_bpb"] < bigram["validation_bpb"] and f["test_bpb"] < bigram["test_bpb"]
                      else "no") if f and bigram else "-",
                     f"{f['generation']['tokens_per_second']:g}" if f else "-"])
    if bigram:
        rows.append(["bigram (add-one)", f"{VOCAB * VOCAB:,} counts", "-", "-", "-", "-", "-",
                     f"{bigram['validation_bpb']:.3f}", f"{bigram['test_bpb']:.3f}", "(control)", "-"])
    b = setup.budget
    span = "the whole split" if setup.eval_bytes is None else f"the first {setup.eval_bytes:,} bytes of each split"
    extended = "" if setup.extend is None else ", the grid extended past an edge winner"
    counts = [r["parameters"] for r in sizes.values()]
    size = ("of about equal size" if counts and max(counts) <= 1.1 * min(counts) else
            "of unequal sizes (see the parameters column)")
    threads = sorted({r["env"]["threads"] for r in [*speeds.values(), *finals.values()] if "env" in r}) or [1]
    thread_text = "one thread" if threads == [1] else f"{'/'.join(map(str, threads))} threads"
    text = (f"# Small byte-level language models on the standard library's sources\n\n"
            f"Four models {size}, vocabulary 256 (bytes), trained alike: {b.steps} steps of "
            f"{b.batch_size} windows of {setup.seq_len} bytes ({b.steps * tps:,} tokens), AdamW, warmup then cosine; "
            f"each at the rate its pilot chose on validation loss ({setup.pilot_steps} steps per rate{extended}). "
            f"Bits per byte over {span} (every byte after the first predicted once), measured on the shipped "
            f"weights (fp16, decays fp32). The control is a bigram model of the train split with add-one "
            f"smoothing, computed exactly. CPU tokens/s: tokens per second of process CPU time, {thread_text} (the "
            f"machine is shared; wall clock varies). Generation: greedy, {thread_text}, wall clock. {setup.note}\n\n")
    text += markdown_table(["model", "parameters", "speed probe (tokens/CPU s)", "pilot rates", "chosen rate",
                            "tokens", "training tokens/CPU s", "validation bpb", "test bpb", "beats bigram",
                            "generation tokens/s"], rows)
    samples = [f"- {a}: `{finals[a]['generation']['sample']!r}` ({finals[a]['generation']['how']})"
               for a in ARCHS if a in finals]
    if samples:
        text += "\nGreedy continuations of \"def \":\n\n" + "\n".join(samples) + "\n"
    text += "\n## Against the papers\n\n" + _literature_paragraph(finals) + "\n"
    probe_rows = Results(out, PROBES)
    if seed == 0:                                           # the committed report reads every seed's finals
        text += _seeds_section(results, probe_rows.select(phase="probe"))
    probes = probe_rows.select(phase="probe", seed=seed)
    longs = probe_rows.select(phase="long", seed=seed)
    text += _probes_section(probes, finals) + _longs_section(longs, finals, seed)
    text += provenance([r for r in results.rows if r.get("seed", seed) == seed] + probes + longs,
                       lambda r: f"{r['arch']} ({r['phase']})")
    write_text_atomically(out / f"{per_seed(NAME, seed)}.md", text)
    curves = {a: [(step * tps, bpb(loss)) for step, _, _, loss in finals[a]["history"] if loss is not None]
              for a in ARCHS if a in finals}
    plots.language_model(curves, bigram["validation_bpb"] if bigram else None, out / f"{per_seed(NAME, seed)}.png")
    return text


def _probes_section(probes: list, finals: dict) -> str:
    """The report's section of the rate probes, beside the final runs at the same rates ("" without probes)."""
    if not probes:
        return ""
    rows = [[r["arch"], f"{r['lr']:.3g}", f"{finals[r['arch']]['lr']:.3g}" if r["arch"] in finals else "-",
            f"{r['validation_bpb']:.3f}", f"{r['test_bpb']:.3f}", made_on(r)] for r in probes]
    rows += [[a, f"{f['lr']:.3g}", f"{f['lr']:.3g}", f"{f['validation_bpb']:.3f}", f"{f['test_bpb']:.3f}",
              made_on(f)] for a, f in finals.items() if any(r["arch"] != a and _rate(r) == _rate(f) for r in probes)]
    return ("\n## Probes: a model at another model's rate\n\n"
            f"Outside the table (`language_model.probe`; rows in {PROBES}.json): the same size, data, budget and "
            "measurement, the rate set by hand instead of by the pilot; with the final runs at the same rates "
            "beside them, so that models can be compared at equal rates. Two rows made on different CPUs or "
            "commits (last column) also differ by what a same-seed rerun moves, beside the rate's effect (the "
            "transformer's same-seed rerun moved test bits per byte by 0.012).\n\n"
            + markdown_table(["model", "rate", "its pilot's rate", "validation bpb", "test bpb",
                              "made on (CPU, commit)"], rows))


def _longs_section(longs: list, finals: dict, seed: int) -> str:
    """The report's section of the longer runs, beside the final runs at the table's steps ("" without any)."""
    if not longs:
        return ""
    rows = [[r["arch"], f"{r['lr']:.3g}", f"{r['factor']}x: {r['steps']:,}", f"{r['warmup_steps']:,}",
            f"{r['train_tokens']:,}", f"{r['validation_bpb']:.3f}", f"{r['test_bpb']:.3f}",
             f"{finals[r['arch']]['validation_bpb']:.3f} / {finals[r['arch']]['test_bpb']:.3f}"
             if r["arch"] in finals else "-"] for r in longs]
    return ("\n## Longer runs: what more steps buy\n\n"
            f"Outside the table (`language_model.probe` with a factor; rows in {PROBES}.json, weights in "
            f"weights/{per_seed(NAME, seed)}-<factor>x/, which lm_context reads whole): the same size, data and "
            "measurement, more steps, the warmup kept at the table's length in steps, the cosine stretched.\n\n"
            + markdown_table(["model", "rate", "steps", "warmup steps", "tokens", "validation bpb", "test bpb",
                              "at the table's steps (validation / test)"], rows))


def main(argv=None) -> int:
    return command_line(__doc__, run, FULL, QUICK, argv)


if __name__ == "__main__":
    sys.exit(main())
