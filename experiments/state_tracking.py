"""State tracking: parity and addition mod 3, trained at length 64, tested at 4x and 16x that length.

    python -m seqmix.experiments.state_tracking            the full run (resumable: rerun it to continue)
    python -m seqmix.experiments.state_tracking --quick    a reduced run, under a minute, into experiments/results/quick

The claim (the RWKV-7 paper, arXiv:2503.14456, on state tracking; Merrill et al., "The Illusion of State",
arXiv:2404.08819; Grazzi et al., arXiv:2411.12537): a linear recurrence whose transitions are diagonal with
eigenvalues in [0, 1] (RWKV-4's decay, Mamba's exp(delta A)) cannot track parity, since no product of such
transitions flips a sign; extending the eigenvalues to [-1, 1] lets linear RNNs learn it and keep it at lengths
never trained on. RWKV-7's transition diag(w) - kk (a * kk)^T reaches down to w - a: with the published in-context
rate a in (0, 1) and w > 0.545 no lower than -0.455 (notebook 04 derives it); with the wide rate a in (0, 1 + w)
(Rwkv7Config.wide_in_context_rate) down to -1.

Task (experiments.data.modular_sum): tokens uniform in [0, m), the target at every position the running sum mod m
(parity for m = 2). Trained on sequences of 64 (every prefix is scored, so every length up to 64 is seen), tested on
sequences of 256 and 1024: accuracy at the positions past 64, which no run saw, and at positions 1-64.

Models: "attention" (the project's RoPE transformer), "rwkv4", "mamba", "rwkv7" as published and "rwkv7_wide"; all
2 layers of width 64. Positive control: rwkv7_wide on parity, which must learn it (99% test accuracy at the training
length) and keep it at 4x the length (90%), as Grazzi et al.'s extended-range linear RNNs do. Each model's rate is
chosen on a validation set at the training length (full-length runs; the grid extended past an edge winner); three
seeds for the control, one elsewhere.

Writes state_tracking.json, state_tracking.md (the table, the published claims beside it), state_tracking.png
(accuracy against position, a panel per task) and the first seed's weights in weights/state_tracking/.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from seqmix.experiments import data, mechanism, plots, zoo
from seqmix.experiments.data import TEST, VALID
from seqmix.experiments.records import Results, command_line, control_verdict, environment, fmt, markdown_table
from seqmix.experiments.training import (Budget, Run, evaluate, round_to_fp16, save_fp16, torch_settings,
                                         sweep_then_seeds)
from seqmix.models.io import load_state_dict
from seqmix.models.rwkv7 import Rwkv7, Rwkv7Config

__all__ = ["Task", "Setup", "FULL", "QUICK", "ARCHS", "build", "run", "report", "control_holds",
           "position_accuracy", "weights_path", "main"]

NAME = "state_tracking"
ARCHS = ("rwkv7_wide", "rwkv7", "rwkv4", "mamba", "attention")
CONTROL = ("rwkv7_wide", 2)                  # (arch, modulus): the positive control
CONTROL_IN, CONTROL_OUT = 0.99, 0.90         # its test accuracy at the training length, and at 4x past it


@dataclass(frozen=True)
class Task:
    name: str
    modulus: int
    seeds: dict                              # arch -> seeds (1 for every arch not named)


@dataclass(frozen=True)
class Setup:
    archs: tuple
    tasks: tuple                             # the control's task first
    width: int
    layers: int
    train_len: int
    test_lens: tuple                         # lengths of the test sequences (multiples of train_len)
    lrs: tuple
    extend: float | None                     # the grid's ratio, to extend it past an edge winner (None: never)
    budget: Budget
    valid_size: int = 256
    test_size: int = 128


def build(arch: str, *, vocab_size: int, width: int, layers: int, train_length: int) -> torch.nn.Module:
    """zoo.build's models, plus "rwkv7_wide": RWKV-7 with the wide in-context rate (BlinkDL's training start)."""
    if arch == "rwkv7_wide":
        config = Rwkv7Config(vocab_size=vocab_size, n_embd=width, n_layer=layers, head_size=16,
                             wide_in_context_rate=True)
        return zoo.rwkv7_training_init(Rwkv7(config))
    return zoo.build(arch, vocab_size=vocab_size, width=width, layers=layers, train_length=train_length)


FULL = Setup(archs=ARCHS, tasks=(Task("parity", 2, {"rwkv7_wide": 3, "rwkv7": 3}), Task("addition mod 3", 3, {})),
             width=64, layers=2, train_len=64, test_lens=(256, 1024), lrs=(1e-3, 10 ** -2.5, 1e-2), extend=10 ** 0.5,
             budget=Budget(steps=1500, batch_size=64, eval_every=100, target=None))
QUICK = Setup(archs=("rwkv7_wide", "rwkv4"), tasks=(Task("parity", 2, {}),), width=32, layers=1, train_len=16,
              test_lens=(64,), lrs=(1e-2,), extend=None,
              budget=Budget(steps=150, batch_size=32, eval_every=50, target=None), valid_size=64, test_size=32)


def _held_out(setup: Setup, task: Task, split: int, size: int, length: int):
    return data.modular_sum(data.held_out_rng(split, task.modulus, length), size, seq_len=length,
                            modulus=task.modulus)


def _make_run(setup: Setup, out, task: Task, arch: str, seed: int, lr: float) -> Run:
    checkpoint = (out / "checkpoints" / NAME /
                  f"{arch}-m{task.modulus}-C{setup.width}-lr{lr:.3g}-s{seed}-{setup.budget.steps}.pt")
    return Run(build=partial(build, arch, vocab_size=task.modulus, width=setup.width, layers=setup.layers,
                             train_length=setup.train_len),
               forward=zoo.logits, sample=partial(data.modular_sum, seq_len=setup.train_len, modulus=task.modulus),
               lr=lr, budget=setup.budget, seed=seed,
               valid=_held_out(setup, task, VALID, setup.valid_size, setup.train_len),
               label=f"{arch} {task.name} lr={lr:.3g} seed={seed}", checkpoint=checkpoint)


@torch.no_grad()
def position_accuracy(model, inputs, targets, batch_size: int = 32) -> np.ndarray:
    """Accuracy at each position (T,), over the sequences of (inputs, targets) (n, T)."""
    model.eval()
    hits = np.zeros(inputs.shape[1])
    for i in range(0, len(inputs), batch_size):
        x = torch.from_numpy(inputs[i:i + batch_size])
        hits += (zoo.logits(model, x).argmax(-1).numpy() == targets[i:i + batch_size]).sum(0)
    return hits / len(inputs)


def weights_path(out, arch: str, task: Task):
    return out / "weights" / NAME / f"{arch}-m{task.modulus}.safetensors"


def _finish(setup: Setup, out, task: Task, first_seed: int, run: Run, key: dict) -> dict:
    """Round the weights to fp16 (as stored), test them at every length, save the first seed's."""
    round_to_fp16(run.model)
    fields = {"parameters": zoo.num_parameters(run.model)}
    test = evaluate(zoo.logits, run.model, *_held_out(setup, task, TEST, setup.test_size, setup.train_len))
    fields["test_accuracy"] = test["accuracy"]                  # at the training length
    for length in setup.test_lens:
        per_position = position_accuracy(run.model, *_held_out(setup, task, TEST, setup.test_size, length))
        fields[f"accuracy_past_train_at_{length}"] = float(per_position[setup.train_len:].mean())
        fields[f"accuracy_by_position_{length}"] = [round(float(a), 4) for a in per_position]
    if key["seed"] == first_seed:
        save_fp16(run.model, weights_path(out, key["arch"], task))
    return fields


def run(setup: Setup, out, seed: int = 0, threads: int = 1, progress: bool = True) -> Results:
    """Every (task, arch) not yet in <out>/state_tracking.json, the control first."""
    with torch_settings(threads):
        results, env = Results(out, NAME), environment(threads)
        for task in setup.tasks:
            for arch in setup.archs:
                sweep_then_seeds(results, dict(arch=arch, task=task.name, width=setup.width),
                                 partial(_make_run, setup, out, task, arch), setup.lrs, setup.budget, seed=seed,
                                 seeds=task.seeds.get(arch, 1), rungs=1,
                                 finish=partial(_finish, setup, out, task, seed), env=env, progress=progress,
                                 extend=setup.extend)
        report(results, setup, out)
        return results


def control_holds(results: Results, setup: Setup) -> bool | None:
    """rwkv7_wide learns parity (CONTROL_IN at the training length) and keeps it at 4x (CONTROL_OUT past it),
    with every seed (None: not run, or not part of this setup)."""
    task = next((t for t in setup.tasks if t.modulus == CONTROL[1]), None)
    if task is None or CONTROL[0] not in setup.archs:
        return None
    rows = results.select(phase="test", arch=CONTROL[0], task=task.name)
    if len(rows) < task.seeds.get(CONTROL[0], 1):
        return None
    length = 4 * setup.train_len
    return all(r["test_accuracy"] >= CONTROL_IN and r.get(f"accuracy_past_train_at_{length}", 0) >= CONTROL_OUT
               for r in rows)


def _mean(rows, field) -> str:
    values = [r[field] for r in rows if field in r]
    if not values:
        return "-"
    spread = f" ({fmt(min(values))} - {fmt(max(values))})" if len(values) > 1 else ""
    return fmt(np.mean(values)) + spread


def report(results: Results, setup: Setup, out) -> str:
    holds = control_holds(results, setup)
    verdict = control_verdict(holds)
    text = (f"# State tracking: can the transition count?\n\nTokens uniform in [0, m), the target at every position "
            f"the running sum mod m. {setup.layers} layer{'s' * (setup.layers > 1)} of width {setup.width}; trained on sequences of "
            f"{setup.train_len} for {setup.budget.steps} steps of {setup.budget.batch_size}; rate chosen on a "
            f"validation set at the training length from {', '.join(f'{lr:.2g}' for lr in setup.lrs)} (full runs, "
            f"the grid extended past an edge winner). Test: {setup.test_size} sequences per length; accuracy at "
            f"positions 1-{setup.train_len}, and at the positions past {setup.train_len} (never trained on) of "
            f"sequences of {' and '.join(map(str, setup.test_lens))}. Mean over seeds (min - max).\n\n"
            f"**Positive control** ({CONTROL[0]} on parity: {fmt(CONTROL_IN, 0)} at the training length, "
            f"{fmt(CONTROL_OUT, 0)} past it at 4x, every seed): {verdict}.\n")
    for task in setup.tasks:
        rows = []
        for arch in setup.archs:
            tests = results.select(phase="test", arch=arch, task=task.name)
            sweep = results.find(phase="sweep", arch=arch, task=task.name)
            if not tests:
                continue
            rows.append([arch, _mean(tests, "test_accuracy"),
                         *(_mean(tests, f"accuracy_past_train_at_{n}") for n in setup.test_lens),
                         f"{sweep['chosen_lr']:.2g}", len(tests)])
        text += (f"\n## {task.name}\n\n" + markdown_table(
            ["model", f"1-{setup.train_len}", *(f"past {setup.train_len}, at {n}" for n in setup.test_lens), "rate",
             "seeds"], rows))
    text += ("\nChance is 1/m. Published: diagonal transitions in [0, 1] (Mamba; RWKV-4's decay) fail parity, "
             "extended to [-1, 1] they learn it and extrapolate (Grazzi et al., arXiv:2411.12537).\n")
    (out / f"{NAME}.md").write_text(text)
    plots.state_tracking(results, setup, out / f"{NAME}.png")
    transition_figure(setup, out)
    return text


def transition_figure(setup: Setup, out, sequences: int = 8, length: int = 256) -> None:
    """state_tracking_transitions.png: the committed RWKV-7 (wide rate) parity model's transition eigenvalues on
    steps that keep and steps that flip (experiments.mechanism.rwkv7_transitions), on held-out sequences."""
    task = next((t for t in setup.tasks if t.modulus == 2), None)
    if task is None or not weights_path(out, CONTROL[0], task).exists():
        return
    model = build(CONTROL[0], vocab_size=2, width=setup.width, layers=setup.layers, train_length=setup.train_len)
    model.load_state_dict({k: v.float() for k, v in load_state_dict(weights_path(out, CONTROL[0], task)).items()})
    inputs, _ = _held_out(setup, task, TEST, sequences, length)
    plots.transition_eigenvalues(mechanism.rwkv7_transitions(model.eval(), inputs), inputs,
                                 out / f"{NAME}_transitions.png")


def main(argv=None) -> None:
    command_line(__doc__, run, FULL, QUICK, argv)


if __name__ == "__main__":
    main()
