"""Why selection: selective copying with a time-invariant SSM and with Mamba's selective scan, at equal size.

    python -m seqmix.experiments.selective_copy            the full run (resumable: rerun it to continue)
    python -m seqmix.experiments.selective_copy --quick    a reduced run, under a minute, into experiments/results/quick

The task of the Mamba paper (Gu and Dao 2023, arXiv:2312.00752, section 3.1): symbols scattered at random positions
among blanks, then markers at which the model must say the symbols in order (experiments.data.selective_copying).
Both models are the project's Mamba (2 layers, width 64, N = 16, the same conv, gate and projections); in
"mamba_lti" delta, B and C are learned constants instead of functions of the input (experiments.zoo), so its scan
is a linear time-invariant system, a convolution with K_l = C A_bar^l B_bar: it can weigh a past token only by how
far back it is, never by what it is. The notes' point (the convolution view needs a time-invariant system) and
Mamba's reason to give it up, in numbers. Each model's rate is swept (successive halving on a validation set,
first seed), then three seeds train at it; reported: per-symbol accuracy on held-out sequences.

Writes selective_copy.json, selective_copy.md, selective_copy.png (validation accuracy during training) and the
first seed's weights of both models in weights/selective_copy/ (fp16; the test numbers are measured on them).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from seqmix.experiments import data, plots, zoo
from seqmix.experiments.data import TEST, VALID
from seqmix.experiments.records import Results, command_line, environment, fmt, markdown_table
from seqmix.experiments.training import (Budget, Run, evaluate, round_to_fp16, save_fp16, torch_settings,
                                         sweep_then_seeds)

__all__ = ["Setup", "FULL", "QUICK", "run", "report", "weights_path", "held_out", "main"]

NAME = "selective_copy"


@dataclass(frozen=True)
class Setup:
    archs: tuple
    width: int
    lrs: tuple
    budget: Budget
    context_len: int = 64
    num_tokens: int = 8
    num_symbols: int = 8
    seeds: int = 3
    rungs: int = 3
    valid_size: int = 256
    test_size: int = 1000

    @property
    def vocab_size(self) -> int:
        return self.num_symbols + 2          # the symbols, the blank, the marker


FULL = Setup(archs=("mamba_lti", "mamba"), width=64, lrs=(1e-3, 3e-3, 1e-2, 3e-2),
             budget=Budget(steps=800, batch_size=32, eval_every=50, target=0.99))
QUICK = Setup(archs=("mamba_lti", "mamba"), width=32, lrs=(1e-2,), context_len=16, num_tokens=4, num_symbols=4,
              budget=Budget(steps=60, batch_size=16, eval_every=20, target=0.99), seeds=1, rungs=1,
              valid_size=64, test_size=128)


def held_out(setup: Setup, split: int, size: int):
    """The validation (split 1) or test (split 2) sequences, the same on every run."""
    return data.selective_copying(data.held_out_rng(split), size, context_len=setup.context_len,
                                  num_tokens=setup.num_tokens, num_symbols=setup.num_symbols)


def _make_run(setup: Setup, arch: str, seed: int, lr: float) -> Run:
    return Run(build=partial(zoo.build, arch, vocab_size=setup.vocab_size, width=setup.width), forward=zoo.logits,
               sample=partial(data.selective_copying, context_len=setup.context_len, num_tokens=setup.num_tokens,
                              num_symbols=setup.num_symbols),
               lr=lr, budget=setup.budget, seed=seed, valid=held_out(setup, VALID, setup.valid_size),
               label=f"{arch} lr={lr:g} seed={seed}")


def weights_path(out, arch: str):
    return out / "weights" / NAME / f"{arch}.safetensors"


def _finish(setup: Setup, out, first_seed: int, run: Run, key: dict) -> dict:
    """Round the weights to fp16 (as stored), test them, save the first seed's."""
    round_to_fp16(run.model)
    test = evaluate(zoo.logits, run.model, *held_out(setup, TEST, setup.test_size))
    if key["seed"] == first_seed:
        save_fp16(run.model, weights_path(out, key["arch"]))
    return {"test_accuracy": test["accuracy"], "test_loss": test["loss"], "test_symbols": test["count"],
            "parameters": zoo.num_parameters(run.model)}


def run(setup: Setup, out, seed: int = 0, threads: int = 1, progress: bool = True) -> Results:
    with torch_settings(threads):
        results, env = Results(out, NAME), environment(threads)
        for arch in setup.archs:
            sweep_then_seeds(results, dict(arch=arch, width=setup.width), partial(_make_run, setup, arch), setup.lrs,
                             setup.budget, seed=seed, seeds=setup.seeds, rungs=setup.rungs,
                             finish=partial(_finish, setup, out, seed), env=env, progress=progress)
        report(results, setup, out)
        return results


def report(results: Results, setup: Setup, out) -> str:
    rows, histories = [], {}
    for arch in setup.archs:
        tests = results.select(phase="test", arch=arch, width=setup.width)[:setup.seeds]
        sweep = results.find(phase="sweep", arch=arch, width=setup.width)
        if not tests:
            continue
        acc = [r["test_accuracy"] for r in tests]
        rows.append([arch, fmt(np.mean(acc)), " / ".join(fmt(a) for a in acc), f"{sweep['chosen_lr']:g}",
                     tests[0]["parameters"], " / ".join(str(r["steps"]) for r in tests)])
        histories.update({f"{arch} seed {r['seed']}": r["history"] for r in tests})
    text = (f"# Selective copying: a time-invariant SSM vs Mamba's selective scan\n\n{setup.num_tokens} symbols "
            f"(of {setup.num_symbols}) at random places in {setup.context_len} positions, to be said in order after "
            f"them; 2 layers, width {setup.width}, N = 16. Per-symbol accuracy on {setup.test_size} held-out "
            f"sequences; {setup.budget.steps} steps of {setup.budget.batch_size} at most (early stop at "
            f"{fmt(setup.budget.target, 0)}); the rate chosen from {', '.join(f'{lr:g}' for lr in setup.lrs)}.\n\n")
    text += markdown_table(["model", "test accuracy (mean)", "per seed", "rate", "parameters", "steps per seed"], rows)
    (out / f"{NAME}.md").write_text(text)
    plots.selective_copy(histories, out / f"{NAME}.png")
    return text


def main(argv=None) -> None:
    command_line(__doc__, run, FULL, QUICK, argv)


if __name__ == "__main__":
    main()
