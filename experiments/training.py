"""Training and evaluation shared by the experiments: one run, its evaluation, and the learning-rate sweep.

    Run(build, forward, sample, lr, budget, seed, valid)   one model trained with AdamW, resumable step by step
                                                           (and across processes from its checkpoint file)
    decay_groups(model, weight_decay)                      AdamW's groups: decay on weight matrices only
    evaluate(forward, model, inputs, targets)              accuracy and loss over the scored targets
    successive_halving(make_run, lrs, budget)              the sweep: every rate trained a little, the better half
                                                           trained further, until one is left (trained to the end)
    extend_to_interior(winner, runs, make_run, ...)        more rates past the grid's edge while the winner sits there
    sweep_then_seeds(results, setting, make_run, ...)      the sweep with the first seed, then the other seeds at the
                                                           chosen rate; resumable

A run is deterministic given its seed (data from numpy's Generator seeded with it, weights from torch's seeded RNG,
one fixed thread count); timings are the only thing that varies. The schedule (linear warmup, then cosine decay to
a tenth) spans the whole budget, so that training a run to an early rung and then on to the end is the same run as
training it to the end at once: successive halving continues the survivors instead of restarting them.
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm          # text bars (tqdm.auto warns in a notebook without ipywidgets)

from .data import IGNORE
from ..models.io import atomic_write, save_state_dict

__all__ = ["Budget", "Run", "decay_groups", "evaluate", "successive_halving", "extend_to_interior",
           "sweep_then_seeds", "setup_torch", "torch_settings", "round_to_fp16", "save_fp16"]


@contextmanager
def torch_settings(threads: int):
    """setup_torch(threads) for the duration of a with-block, then denormals back on (torch's default) and torch's
    thread count as it was: the flush-to-zero flag outlives the block otherwise and changes every later float
    computation of the process, NumPy's too (kernel tests run after an experiment saw exp and softplus lose their
    last bits). The flag is per thread and a new thread inherits it: OpenMP workers started inside the block (threads
    > 1) keep it, so run multi-threaded experiments in a process of their own (the command line does)."""
    before = torch.get_num_threads()
    setup_torch(threads)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(before)


def setup_torch(threads: int) -> None:
    """One fixed thread count (results then repeat bit for bit) and denormals flushed to zero: the backward of a
    decaying recurrence makes numbers below 1e-38 whose CPU arithmetic is some 100 times slower (measured: a Mamba
    training step at width 128 went from 4.4 s to 0.4 s); flushing them changes results by less than 1e-38."""
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)


@dataclass(frozen=True)
class Budget:
    """steps; batch_size; warmup: the fraction of steps with a linear warmup (0: none, the first update at the peak
    rate); eval_every: steps between validation evaluations; target: stop once validation accuracy reaches it
    (None: never); weight_decay; clip: the gradient norm clipped to (None: no clipping); final_lr: the cosine's end,
    as a fraction of the peak rate (1: a constant rate after the warmup); beta2: AdamW's second-moment decay
    (BlinkDL's and this project's 0.98; torch's and Zoology's default 0.999); decay_all: weight decay on every
    parameter, as Zoology's optimizer, instead of decay_groups' matrices only.

    ``longer(factor)`` is the same recipe run factor times longer: the warmup keeps its length in steps (a warmup
    stretched with the run is a change of schedule, not of budget), the cosine stretches to the new end."""
    steps: int
    batch_size: int
    warmup: float = 0.05
    eval_every: int = 50
    target: float | None = None
    weight_decay: float = 0.1
    clip: float | None = 1.0
    final_lr: float = 0.1
    beta2: float = 0.98
    decay_all: bool = False

    def longer(self, factor: int) -> "Budget":
        return replace(self, steps=factor * self.steps, warmup=self.warmup / factor)

    @property
    def warmup_steps(self) -> int:
        return round(self.warmup * self.steps)

    def lr_at(self, step: int, peak: float) -> float:
        """The rate for update number ``step`` (0-based)."""
        warm = max(1, self.warmup_steps)
        if step < warm:
            return peak * (step + 1) / warm
        progress = (step - warm) / max(1, self.steps - warm)
        return peak * (self.final_lr + (1 - self.final_lr) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _loss_and_hits(logits, targets):
    """Mean cross-entropy over the scored targets (!= IGNORE), and the number of them predicted right."""
    logits = logits.float().reshape(-1, logits.shape[-1])
    targets = targets.reshape(-1)
    loss = F.cross_entropy(logits, targets, ignore_index=IGNORE)
    scored = targets != IGNORE
    return loss, int((logits.argmax(-1)[scored] == targets[scored]).sum())


@torch.no_grad()
def evaluate(forward: Callable, model, inputs, targets, batch_size: int = 64) -> dict:
    """{"accuracy", "loss", "count"} over every scored target of (inputs, targets) (numpy or torch (n, T))."""
    was_training = model.training
    model.eval()
    inputs, targets = torch.as_tensor(inputs), torch.as_tensor(targets)
    total_loss, hits, count = 0.0, 0, 0
    for i in range(0, len(inputs), batch_size):
        y = targets[i:i + batch_size]
        n = int((y != IGNORE).sum())
        loss, h = _loss_and_hits(forward(model, inputs[i:i + batch_size]), y)
        total_loss, hits, count = total_loss + float(loss) * n, hits + h, count + n
    model.train(was_training)
    return {"accuracy": hits / count, "loss": total_loss / count, "count": count}


def decay_groups(model, weight_decay: float) -> list:
    """AdamW's parameter groups as the anchors form them: weight decay on the matrices of linear layers, embeddings,
    heads and convolutions (a parameter named ``*.weight`` with two or more dimensions of size > 1), none on
    anything else: norms' weights and biases, biases, Mamba's A_log and D (mamba_ssm marks them _no_weight_decay),
    RWKV's per-channel decays, bonuses, token-shift mixes and LoRA factors (BlinkDL's trainer decays only 2-D
    ``.weight`` tensors). Decaying A_log pulls every channel's A = -exp(A_log) toward -1, i.e. toward one memory
    length, which is what selectivity is meant to tune.

    Returns:
        [{"params": decayed, "weight_decay": weight_decay}, {"params": the rest, "weight_decay": 0.0}]
    """
    decayed, rest = [], []
    for name, p in model.named_parameters():
        matrix = name.endswith(".weight") and p.squeeze().dim() >= 2
        (decayed if matrix else rest).append(p)
    return [{"params": decayed, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


@dataclass
class Run:
    """One training run; ``train_to(step)`` advances it and may be called again to go further.

    build: () -> a new model (called after torch.manual_seed(seed)). forward: (model, input_ids) -> logits.
    sample: (rng, n) -> (inputs, targets) numpy arrays. valid: (inputs, targets) for evaluation and early stopping.
    """
    build: Callable
    forward: Callable
    sample: Callable
    lr: float
    budget: Budget
    seed: int
    valid: tuple
    label: str = ""
    checkpoint: Path | None = None     # where the run saves itself at each validation, and resumes from if present
    step: int = 0
    stopped: bool = False              # reached budget.target
    diverged: bool = False             # the training loss became inf or nan; the run stopped there
    seconds: float = 0.0               # training time (evaluations excluded), wall clock
    cpu_seconds: float = 0.0           # the same in CPU time of this process (what a busy machine does not inflate)
    tokens: int = 0
    # [step, train loss, validation accuracy, validation loss] from step 0 (no train loss there: None); a diverged
    # run ends with [step, None, None, None]
    history: list = field(default_factory=list)

    def __post_init__(self):
        torch.manual_seed(self.seed)
        self.model = self.build()
        self.rng = np.random.default_rng([self.seed, 1])            # the training data stream
        # torch's own random draws in training (dropout) come from this run's generator state, swapped in for each
        # step (_own_torch_rng): not from whatever the global generator holds when the run trains, which depends
        # on what the process built or ran before (a sweep builds its runs before training them) and is lost on
        # a resume
        self.torch_rng = torch.Generator().manual_seed(int(np.random.SeedSequence([self.seed, 2])
                                                           .generate_state(1)[0])).get_state()
        groups = ([{"params": list(self.model.parameters()), "weight_decay": self.budget.weight_decay}]
                  if self.budget.decay_all else decay_groups(self.model, self.budget.weight_decay))
        self.optimizer = torch.optim.AdamW(groups, lr=self.lr, betas=(0.9, self.budget.beta2))
        if self.checkpoint is not None and Path(self.checkpoint).exists():
            self._load(Path(self.checkpoint))

    _RESUMED = ("step", "stopped", "diverged", "seconds", "cpu_seconds", "tokens", "history", "torch_rng")

    def _save(self) -> None:
        """Model, optimizer, data stream and progress, written through a temporary file and a rename (a run stopped
        mid-write keeps its previous checkpoint). Resuming from it continues the same run: the same next batch,
        the same dropout, the same update, hence the same bits at the same thread count."""
        path = Path(self.checkpoint)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "rng": self.rng.bit_generator.state, "lr": self.lr, "seed": self.seed,
                 **{k: getattr(self, k) for k in self._RESUMED}}
        with atomic_write(path) as tmp:
            torch.save(state, tmp)

    def _load(self, path: Path) -> None:
        try:
            state = torch.load(path, weights_only=False)
        except Exception as e:                   # torch raises EOFError, RuntimeError, UnpicklingError, ...
            raise ValueError(f"checkpoint {path}: cannot be read ({type(e).__name__}: {e}); remove it to start the "
                             f"run afresh") from None
        if isinstance(state, dict) and "history" in state and "torch_rng" not in state:
            state["torch_rng"] = self.torch_rng   # a checkpoint from before the run kept torch's stream: from here
        missing = [k for k in ("model", "optimizer", "rng", "lr", "seed", *self._RESUMED)
                   if not isinstance(state, dict) or k not in state]
        if missing:
            raise ValueError(f"checkpoint {path}: not a training run's checkpoint (no {', '.join(missing)}); remove "
                             f"it to start the run afresh")
        if (state["lr"], state["seed"]) != (self.lr, self.seed):
            raise ValueError(f"checkpoint {path} is of a run with lr {state['lr']} and seed {state['seed']}, "
                             f"not lr {self.lr} and seed {self.seed}")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.bit_generator.state = state["rng"]
        for k in self._RESUMED:
            setattr(self, k, state[k])

    def train_to(self, step: int, progress: bool = True) -> "Run":
        """Train until update ``step`` (at most budget.steps) or until validation accuracy reaches the target."""
        step = min(step, self.budget.steps)
        if not self.history:
            self._validate(None)                                        # where the run starts: step 0
        bar = tqdm(total=step, initial=self.step, desc=self.label, leave=False, disable=not progress,
                   dynamic_ncols=True)
        while self.step < step and not (self.stopped or self.diverged):
            start, start_cpu = time.perf_counter(), time.process_time()
            x, y = (torch.from_numpy(a) for a in self.sample(self.rng, self.budget.batch_size))
            for group in self.optimizer.param_groups:
                group["lr"] = self.budget.lr_at(self.step, self.lr)
            self.model.train()
            with self._own_torch_rng():
                loss, _ = _loss_and_hits(self.forward(self.model, x), y)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
            if self.budget.clip is not None:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.budget.clip)
            self.optimizer.step()
            self.seconds += time.perf_counter() - start
            self.cpu_seconds += time.process_time() - start_cpu
            self.tokens += x.numel()
            self.step += 1
            loss = loss.item()
            if not math.isfinite(loss):
                self.diverged = True                                    # nothing more to learn
                self.history.append([self.step, None, None, None])
                if self.checkpoint is not None:
                    self._save()
                break
            if self.step % self.budget.eval_every == 0 or self.step == step:
                self._validate(loss)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{self.tokens / self.seconds:.0f}",
                            val=f"{self.history[-1][2]:.3f}" if self.history else "-")
        bar.close()
        return self

    @contextmanager
    def _own_torch_rng(self):
        """torch's global CPU generator set to this run's state for the block, the run's state advanced by what it
        drew, and the global state put back after."""
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self.torch_rng)
            yield
            self.torch_rng = torch.get_rng_state()

    def _validate(self, loss: float | None) -> None:
        metrics = evaluate(self.forward, self.model, *self.valid)
        self.history.append([self.step, loss, metrics["accuracy"], metrics["loss"]])
        if self.budget.target is not None and metrics["accuracy"] >= self.budget.target:
            self.stopped = True
        if self.checkpoint is not None:
            self._save()

    @property
    def score(self) -> tuple:
        """What the sweep ranks by (higher is better): the last validation accuracy, then fewer steps to get there,
        then a lower validation loss. A diverged run ranks last."""
        if self.diverged:
            return (-1.0, 0, -math.inf)
        _, _, accuracy, val_loss = self.history[-1]
        return (min(accuracy, self.budget.target or 1.0), -self.step, -val_loss)

    def summary(self) -> dict:
        """What a results row records of the run."""
        last = self.history[-1] if self.history else [0, None, None, None]
        return {"lr": self.lr, "steps": self.step, "reached_target": self.stopped, "diverged": self.diverged,
                "train_loss": last[1], "valid_accuracy": last[2], "valid_loss": last[3],
                "train_seconds": round(self.seconds, 2), "train_cpu_seconds": round(self.cpu_seconds, 2),
                "tokens_per_second": round(self.tokens / max(self.seconds, 1e-9)),
                "history": self.history}


def successive_halving(make_run: Callable, lrs, budget: Budget, rungs: int = 3, progress: bool = True):
    """The learning-rate sweep: train a run per rate to budget.steps / 2^(rungs - 1), keep the better half (ranked
    by Run.score on the validation set), train those twice as far, and so on; the last one left is trained to
    budget.steps. Every run has the same seed, hence the same data and starting weights.

    Args:
        make_run: lr -> a new Run.
        lrs: the rates to try.
        budget: the full budget of the winner.
        rungs: the number of halvings + 1.
    Returns:
        (winner, runs): the Run trained to the end, and every Run (as far as each got), in the order of lrs.
    """
    runs = [make_run(lr) for lr in lrs]
    alive = list(runs)
    for rung in range(rungs):
        last = rung == rungs - 1 or len(alive) == 1
        target = budget.steps if last else max(1, budget.steps >> (rungs - 1 - rung))
        for run in alive:
            run.train_to(target, progress)
        alive.sort(key=lambda r: r.score, reverse=True)
        if last:
            break
        alive = alive[:max(1, len(alive) // 2)]
    return alive[0], runs


def extend_to_interior(winner, runs: list, make_run: Callable, budget: Budget, *, factor: float, bounds=(1e-5, 0.1),
                       floor: float = -math.inf, progress: bool = True):
    """The rate grid must bracket the optimum: while the winner sits on the grid's edge (its smallest or largest
    rate), train the next rate beyond that edge (lr / factor or lr * factor, within ``bounds``) to the end and
    rank again. A winner on an edge means the best rate may lie outside the grid; this reports it rather than
    choosing it. A winner whose validation accuracy is below ``floor`` (no rate left chance) won on noise, and
    no edge is extended for it.

    Returns:
        (winner, runs): the best Run and every Run tried, the added ones last.
    """
    while winner.score[0] >= floor:
        lrs = sorted(r.lr for r in runs)
        if winner.lr == lrs[0] and lrs[0] / factor >= bounds[0] * (1 - 1e-9):
            lr = lrs[0] / factor
        elif winner.lr == lrs[-1] and lrs[-1] * factor <= bounds[1] * (1 + 1e-9):
            lr = lrs[-1] * factor
        else:
            return winner, runs
        added = make_run(lr).train_to(budget.steps, progress)
        runs = [*runs, added]
        winner = max(winner, added, key=lambda r: r.score)
    return winner, runs


def sweep_then_seeds(results, setting: dict, make_run: Callable, lrs, budget: Budget, *, seed: int, seeds: int,
                     rungs: int, finish: Callable, env: dict, progress: bool = True, extend: float | None = None,
                     extend_floor: float = -math.inf) -> None:
    """The protocol of the synthetic-task experiments, for one setting: the learning-rate sweep with the first seed
    (successive halving on the validation set, rungs = 1 trains every rate to the end; then, with ``extend``, the
    grid extended until its winner is interior: extend_to_interior), whose winner, trained to the end, is that
    seed's final run; then the other seeds at the chosen rate. Rows already in ``results`` are skipped, so an
    interrupted run resumes (and each Run resumes from its own checkpoint where make_run gives it one).

    Args:
        results: records.Results. setting: the row fields that name the setting (e.g. arch, width, pairs).
        make_run: (seed, lr) -> a new Run. lrs, budget, rungs: the sweep's. seed: the first seed; seeds: how many.
        finish: (run, key) -> the fields of the final run's row (its test metrics); key = setting plus the seed.
        env: records.environment(...), recorded in every row.
        extend: the factor between neighbouring rates, to extend the grid past an edge winner; None: never.
        extend_floor: extend only for a winner at or above this validation accuracy (extend_to_interior's floor).
    """
    sweep = results.find(phase="sweep", seed=seed, **setting)
    if sweep is None:
        winner, runs = successive_halving(lambda lr: make_run(seed, lr), lrs, budget, rungs, progress)
        if extend is not None:
            winner, runs = extend_to_interior(winner, runs, lambda lr: make_run(seed, lr), budget, factor=extend,
                                              floor=extend_floor, progress=progress)
        sweep = results.add({**setting, "phase": "sweep", "seed": seed, "chosen_lr": winner.lr,
                             "runs": [r.summary() for r in runs], "env": env})
        results.add({**setting, "phase": "test", "seed": seed, **winner.summary(),
                     **finish(winner, {**setting, "seed": seed}), "env": env})
    for s in range(seed, seed + seeds):
        if results.find(phase="test", seed=s, **setting) is None:
            final = make_run(s, sweep["chosen_lr"]).train_to(budget.steps, progress)
            results.add({**setting, "phase": "test", "seed": s, **final.summary(),
                         **finish(final, {**setting, "seed": s}), "env": env})


def round_to_fp16(model) -> None:
    """Round every parameter to fp16 and back, in place: the weights as they are stored (results are measured on
    these, so that the committed weights give the committed numbers)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())


def save_fp16(model, path) -> None:
    """The model's weights as the experiments commit them: fp16 safetensors at ``path`` (its folder made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    save_state_dict({k: v.half() for k, v in model.state_dict().items()}, path)
