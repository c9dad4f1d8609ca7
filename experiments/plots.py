"""The experiments' figures, drawn from their results rows (matplotlib, no display needed)."""
from __future__ import annotations

import matplotlib
import numpy as np
from matplotlib.figure import Figure     # figures without pyplot: no backend is chosen, none is changed

__all__ = ["recall", "extrapolation", "selective_copy", "mean_and_range"]


def mean_and_range(values):
    """(mean, [[mean - min], [max - mean]]): a point and its error bar over seeds."""
    v = np.asarray(values, dtype=float)
    return v.mean(), [[v.mean() - v.min()], [v.max() - v.mean()]]


def _save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def recall(results, setup, path) -> None:
    """Test accuracy against width, one panel per number of pairs, a line per model (bars: min to max of seeds)."""
    fig = Figure(figsize=(4 * len(setup.pairs), 3.4))
    axes = fig.subplots(1, len(setup.pairs), squeeze=False)
    for ax, pairs in zip(axes[0], setup.pairs):
        for arch in setup.archs:
            points = [(w, [r["test_accuracy"] for r in results.select(phase="test", arch=arch, width=w, pairs=pairs)])
                      for w in setup.widths]
            points = [(w, acc) for w, acc in points if acc]
            if not points:
                continue
            means, bars = zip(*(mean_and_range(acc) for _, acc in points))
            ax.errorbar([w for w, _ in points], means, yerr=np.hstack(bars), marker="o", capsize=3, label=arch)
        ax.set(xscale="log", title=f"{pairs} key-value pairs", xlabel="width C", ylim=(-0.02, 1.02))
        ax.set_xticks(setup.widths, [str(w) for w in setup.widths])
        ax.minorticks_off()
    axes[0][0].set_ylabel("test accuracy")
    axes[0][-1].legend(fontsize=8)
    _save(fig, path)


def extrapolation(curves, lengths, path, title) -> None:
    """Accuracy against evaluation length (multiples of the training length), one panel per kind of sample.

    curves: {kind: {label: [accuracy per length]}}; a label ending in "-log n†" is drawn dashed, in the colour of
    the same scheme without it."""
    fig = Figure(figsize=(6 * len(curves), 4.2))
    axes = fig.subplots(1, len(curves), squeeze=False)
    colours = {}
    for ax, (kind, lines) in zip(axes[0], curves.items()):
        for label, acc in lines.items():
            base = label.removesuffix("-log n†")
            colour = colours.setdefault(base, matplotlib.colormaps["tab10"](len(colours) % 10))
            ax.plot(lengths, acc, marker="o", label=label, color=colour, linestyle="-" if base == label else "--")
        ax.set(xscale="log", title=f"{kind} text", xlabel="evaluation length (x training length)",
               ylabel="next-character accuracy")
        ax.set_xticks(lengths, [f"{x:g}x" for x in lengths])
        ax.minorticks_off()
    axes[0][-1].legend(fontsize=7, ncol=2)
    fig.suptitle(title)
    _save(fig, path)


def selective_copy(histories, path) -> None:
    """Validation accuracy during training, a line per run. histories: {label: [[step, loss, acc, val loss]]}."""
    fig = Figure(figsize=(6, 3.6))
    ax = fig.subplots()
    for label, history in histories.items():
        h = np.asarray(history, dtype=float)
        ax.plot(h[:, 0], h[:, 2], label=label)
    ax.set(xlabel="training step", ylabel="validation accuracy", ylim=(-0.02, 1.02), title="selective copying")
    ax.legend(fontsize=8)
    _save(fig, path)


def language_model(curves, control, path) -> None:
    """Validation bits per byte against tokens seen, a line per model; ``control`` (the bigram's bits per byte,
    or None) as a dashed horizontal line. curves: {label: [(tokens, bits per byte)]}."""
    fig = Figure(figsize=(7, 4.2))
    ax = fig.subplots()
    for label, points in curves.items():
        tokens, bits = zip(*points)
        ax.plot(tokens, bits, marker=".", label=label)
    if control is not None:
        ax.axhline(control, color="grey", linestyle="--", label="bigram (control)")
    ax.set(xlabel="training tokens seen", ylabel="validation bits per byte", title="byte-level language models")
    ax.legend(fontsize=8)
    _save(fig, path)
