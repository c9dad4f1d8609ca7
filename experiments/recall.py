"""Multi-query associative recall (MQAR): softmax attention vs RWKV-4 vs RWKV-7 vs Mamba at equal width and depth.

    python -m seqmix.experiments.recall            the full run (resumable: rerun it to continue)
    python -m seqmix.experiments.recall --quick    a reduced run, under a minute, into experiments/results/quick

The task of Zoology (Arora et al. 2023, arXiv:2312.04927): N key-value pairs, then the keys again in random order;
at each, the model must output its value (experiments.data.mqar). Every model has 2 layers of width C; the
grid is C in (32, 64, 128) x N in (4, 8, 16) at sequence length 64, vocabulary 128. All runs share the optimizer
(AdamW, warmup then cosine), the batch and the step budget, and stop early at 99% validation accuracy.

The rate is swept per model and setting, as Zoology does (recurrent models learn recall only in a narrow window of
rates: Okpekpe and Orvieto 2025, arXiv:2508.19029): successive halving over the rates on a validation set with the
first seed (training.successive_halving); its winner, trained to the end, is the first seed's final run. Two more
seeds train at the chosen rate. Reported: accuracy on held-out sequences (a test set no run saw), all three seeds.

Writes recall.json (a row per sweep and per final run, with the environment), recall.md (the tables) and
recall.png (accuracy against width, one panel per N, as Zoology's figure), and the first seed's weights at width 64
in weights/recall/ (fp16 safetensors; the test numbers are measured on these rounded weights).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from seqmix.experiments import data, plots, zoo
from seqmix.experiments.data import TEST, VALID
from seqmix.experiments.records import Results, command_line, environment, fmt, markdown_table
from seqmix.experiments.training import (Budget, Run, evaluate, round_to_fp16, save_fp16, torch_settings,
                                         sweep_then_seeds)

__all__ = ["Setup", "FULL", "QUICK", "run", "long_runs", "report", "weights_path", "main"]

NAME = "recall"


@dataclass(frozen=True)
class Setup:
    archs: tuple
    widths: tuple
    pairs: tuple
    lrs: tuple
    budget: Budget
    seeds: int = 3
    rungs: int = 3
    seq_len: int = 64
    vocab_size: int = 128
    valid_size: int = 256
    test_size: int = 1000
    save_width: int | None = 64
    long_setting: tuple | None = None     # (width, pairs) where each model also trains long_factor times longer
    long_factor: int = 4
    note: str = ""                        # what the budget cut, said in recall.md


# Cut to what two shared CPU cores train in about an hour (the issue asked for widths 32, 64, 128 and gave no step
# count): width 128 is left out (it costs 63% of a step over all widths), 500 steps, rates 1e-3, 3e-3, 1e-2 with one
# halving at 250 steps. Every setting's first seed runs before any second seed, so a cut-short run still fills
# the whole table.
FULL = Setup(archs=("attention", "rwkv4", "rwkv7", "mamba"), widths=(32, 64), pairs=(4, 8, 16),
             lrs=(1e-3, 3e-3, 1e-2), budget=Budget(steps=500, batch_size=32, eval_every=50, target=0.99), rungs=2,
             long_setting=(64, 4),
             note="Cut to the budget of two shared CPU cores (about an hour for all three experiments): width 128 "
                  "left out (the issue asked for 32, 64 and 128), 500 steps, three rates with one halving. ")
QUICK = Setup(archs=("attention", "rwkv4", "rwkv7", "mamba"), widths=(32,), pairs=(4,), lrs=(3e-3, 1e-2),
              budget=Budget(steps=40, batch_size=16, eval_every=20, target=0.99), seeds=1, rungs=2,
              valid_size=64, test_size=128, save_width=32, long_setting=(32, 4), long_factor=2)


def _held_out(setup: Setup, split: int, pairs: int, size: int):
    return data.mqar(data.held_out_rng(split, pairs), size, seq_len=setup.seq_len, num_pairs=pairs,
                     vocab_size=setup.vocab_size)


def _make_run(setup: Setup, arch: str, width: int, pairs: int, seed: int, lr: float) -> Run:
    return Run(build=partial(zoo.build, arch, vocab_size=setup.vocab_size, width=width, train_length=setup.seq_len),
               forward=zoo.logits,
               sample=partial(data.mqar, seq_len=setup.seq_len, num_pairs=pairs, vocab_size=setup.vocab_size),
               lr=lr, budget=setup.budget, seed=seed, valid=_held_out(setup, VALID, pairs, setup.valid_size),
               label=f"{arch} C={width} N={pairs} lr={lr:g} seed={seed}")


def _finish(setup: Setup, out, first_seed: int, run: Run, key: dict) -> dict:
    """Round the run's weights to fp16 (as stored), test them, and save them for the first seed at save_width."""
    round_to_fp16(run.model)
    test = evaluate(zoo.logits, run.model, *_held_out(setup, TEST, key["pairs"], setup.test_size))
    if key["width"] == setup.save_width and key["seed"] == first_seed:
        save_fp16(run.model, weights_path(out, key["arch"], key["width"], key["pairs"]))
    return {"test_accuracy": test["accuracy"], "test_loss": test["loss"], "test_queries": test["count"],
            "parameters": zoo.num_parameters(run.model)}


def weights_path(out, arch: str, width: int, pairs: int):
    return out / "weights" / NAME / f"{arch}-C{width}-N{pairs}.safetensors"


def run(setup: Setup, out, seed: int = 0, threads: int = 1, progress: bool = True) -> Results:
    """Every setting of ``setup`` not yet in <out>/recall.json: its sweep, then its seeds' final runs."""
    with torch_settings(threads):
        results, env = Results(out, NAME), environment(threads)

        def every_setting(seeds):
            for pairs in setup.pairs:
                for width in setup.widths:
                    for arch in setup.archs:
                        sweep_then_seeds(results, dict(arch=arch, width=width, pairs=pairs),
                                         partial(_make_run, setup, arch, width, pairs), setup.lrs, setup.budget,
                                         seed=seed, seeds=seeds, rungs=setup.rungs,
                                         finish=partial(_finish, setup, out, seed), env=env, progress=progress)

        every_setting(1)              # the first seed everywhere (the sweeps), then the longer runs, then the others
        if setup.long_setting is not None:
            long_runs(results, setup, env, seed, progress)
        every_setting(setup.seeds)
        report(results, setup, out)
        return results


def long_runs(results: Results, setup: Setup, env: dict, seed: int = 0, progress: bool = True) -> None:
    """Is it the budget? At setup.long_setting = (width, pairs), each model (first seed, its chosen rate) trains
    long_factor times the budget, the schedule stretched to match; rows of phase "long". Needs the setting's sweeps."""
    width, pairs = setup.long_setting
    budget = replace(setup.budget, steps=setup.long_factor * setup.budget.steps)
    for arch in setup.archs:
        sweep = results.find(phase="sweep", arch=arch, width=width, pairs=pairs, seed=seed)
        if sweep is None or results.find(phase="long", arch=arch, width=width, pairs=pairs, seed=seed) is not None:
            continue
        run = _make_run(replace(setup, budget=budget), arch, width, pairs, seed, sweep["chosen_lr"])
        round_to_fp16(run.train_to(budget.steps, progress).model)          # as the final runs are measured
        test = evaluate(zoo.logits, run.model, *_held_out(setup, TEST, pairs, setup.test_size))
        results.add({"arch": arch, "width": width, "pairs": pairs, "phase": "long", "seed": seed, **run.summary(),
                     "test_accuracy": test["accuracy"], "test_queries": test["count"], "env": env})


def _test_accuracies(results: Results, setup: Setup, **setting) -> list:
    return [r["test_accuracy"] for r in results.select(phase="test", **setting)][:setup.seeds]


def report(results: Results, setup: Setup, out) -> str:
    """recall.md and recall.png from the rows."""
    lines = [f"# Multi-query associative recall (MQAR)\n\nTest accuracy on {setup.test_size} held-out sequences "
             f"per setting (length {setup.seq_len}, vocabulary {setup.vocab_size}, 2 layers): mean of "
             f"{setup.seeds} seeds (min - max). Budget: {setup.budget.steps} steps of {setup.budget.batch_size} "
             f"sequences, early stop at {fmt(setup.budget.target, 0)} validation accuracy; rate chosen per "
             f"setting from {', '.join(f'{lr:g}' for lr in setup.lrs)} by successive halving. {setup.note}\n"]
    for pairs in setup.pairs:
        rows = []
        for arch in setup.archs:
            cells = []
            for width in setup.widths:
                acc = _test_accuracies(results, setup, arch=arch, width=width, pairs=pairs)
                sweep = results.find(phase="sweep", arch=arch, width=width, pairs=pairs)
                seeds = "" if len(acc) == setup.seeds else f", {len(acc)} seed{'s' * (len(acc) > 1)}"
                cells.append("-" if not acc else f"{fmt(np.mean(acc))} ({fmt(min(acc), 0)} - {fmt(max(acc), 0)}) "
                             f"lr {sweep['chosen_lr']:g}{seeds}")
            rows.append([arch, *cells])
        lines += [f"\n## {pairs} key-value pairs\n\n", markdown_table(["model", *(f"C = {w}" for w in setup.widths)],
                                                                   rows)]
    if setup.long_setting is not None:
        width, pairs = setup.long_setting
        rows = [[r["arch"], f"{r['lr']:g}", r["steps"], fmt(r["test_accuracy"]),
                 fmt(next(iter(_test_accuracies(results, setup, arch=r["arch"], width=width, pairs=pairs)), None))]
                for r in results.select(phase="long", width=width, pairs=pairs)]
        lines += [f"\n## Is it the budget? {setup.long_factor} times the steps at C = {width}, N = {pairs}\n\n"
                  f"The first seed at its chosen rate, trained for up to {setup.long_factor * setup.budget.steps} "
                  f"steps (the schedule stretched to match; early stop as above).\n\n",
                  markdown_table(["model", "rate", "steps", "test accuracy", f"at {setup.budget.steps} steps"], rows)]
    text = "".join(lines)
    (out / f"{NAME}.md").write_text(text)
    plots.recall(results, setup, out / f"{NAME}.png")
    return text


def main(argv=None) -> None:
    command_line(__doc__, run, FULL, QUICK, argv)


if __name__ == "__main__":
    main()
