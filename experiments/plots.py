"""The experiments' figures, drawn from their results rows (matplotlib, no display needed)."""
from __future__ import annotations

import matplotlib
import numpy as np
from matplotlib.figure import Figure     # figures without pyplot: no backend is chosen, none is changed

__all__ = ["recall", "extrapolation", "selective_copy", "state_tracking", "recall_mechanism", "step_sizes",
           "transition_eigenvalues", "language_model", "mean_and_range"]


def mean_and_range(values):
    """(mean, [[mean - min], [max - mean]]): a point and its error bar over seeds."""
    v = np.asarray(values, dtype=float)
    return v.mean(), [[v.mean() - v.min()], [v.max() - v.mean()]]


def _save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def recall(results, archs, widths: dict, path) -> None:
    """Test accuracy against width, one panel per number of pairs, a line per model (bars: min to max of seeds).
    widths: pairs -> the widths of that panel."""
    fig = Figure(figsize=(4.2 * len(widths), 3.4))
    axes = fig.subplots(1, len(widths), squeeze=False)
    for ax, (pairs, panel) in zip(axes[0], widths.items()):
        for arch in archs:
            points = [(w, [r["test_accuracy"] for r in results.select(phase="test", arch=arch, width=w, pairs=pairs)])
                      for w in panel]
            points = [(w, acc) for w, acc in points if acc]
            if not points:
                continue
            means, bars = zip(*(mean_and_range(acc) for _, acc in points))
            ax.errorbar([w for w, _ in points], means, yerr=np.hstack(bars), marker="o", capsize=3, label=arch)
        ax.axhline(1 / pairs, color="grey", linewidth=0.8, linestyle=":")      # chance among the N values shown
        ax.set(xscale="log", title=f"{pairs} key-value pairs", xlabel="width C", ylim=(-0.02, 1.02))
        ax.set_xticks(panel, [str(w) for w in panel])
        ax.minorticks_off()
    axes[0][0].set_ylabel("test accuracy")
    axes[0][0].legend(fontsize=8)
    _save(fig, path)


def extrapolation(curves, lengths, path, title) -> None:
    """Accuracy against evaluation length (multiples of the training length), one panel per kind of sample.

    curves: {kind: {label: [accuracy per length]}}; a label ending in "-log n†" is drawn dashed, in the colour of
    the same scheme without it."""
    fig = Figure(figsize=(5.6 * len(curves), 4.2))
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
    """Validation accuracy during training, a panel per regime, a colour per model, a line style per seed.
    histories: {(arch, regime, seed): [[step, loss, acc, val loss], ...]}."""
    regimes = list(dict.fromkeys(regime for _, regime, _ in histories))
    archs = list(dict.fromkeys(arch for arch, _, _ in histories))
    fig = Figure(figsize=(5.5 * max(len(regimes), 1), 3.6))          # two panels: 1210 px at dpi 110
    axes = fig.subplots(1, max(len(regimes), 1), squeeze=False)[0]
    styles = ("-", "--", ":", "-.")
    for (arch, regime, seed), history in histories.items():
        h = np.asarray(history, dtype=float)
        axes[regimes.index(regime)].plot(h[:, 0], h[:, 2], color=matplotlib.colormaps["tab10"](archs.index(arch)),
                                         linestyle=styles[seed % len(styles)],
                                         label=arch if seed == min(s for a, r, s in histories if a == arch) else None)
    for ax, regime in zip(axes, regimes):
        ax.set(xlabel="training step", ylabel="validation accuracy", ylim=(-0.02, 1.02), title=regime)
        ax.legend(fontsize=8, title="line style: seed 0, 1, 2", title_fontsize=8)
    _save(fig, path)


def state_tracking(results, setup, path, bin_size: int = 16) -> None:
    """Accuracy against position at the longest test length (means over bins of ``bin_size`` positions), a panel per
    task, a line per model (its first seed); the training length marked."""
    length = max(setup.test_lens)
    fig = Figure(figsize=(5.2 * len(setup.tasks), 3.6))
    axes = fig.subplots(1, len(setup.tasks), squeeze=False)
    for ax, task in zip(axes[0], setup.tasks):
        for arch in setup.archs:
            row = results.find(phase="test", arch=arch, task=task.name)
            if row is None:
                continue
            acc = np.asarray(row[f"accuracy_by_position_{length}"])
            binned = acc[:len(acc) // bin_size * bin_size].reshape(-1, bin_size).mean(1)
            ax.plot((np.arange(len(binned)) + 0.5) * bin_size, binned, label=arch)
        ax.axvline(setup.train_len, color="grey", linewidth=0.8, linestyle=":")
        ax.axhline(1 / task.modulus, color="grey", linewidth=0.8)
        ax.set(xscale="log", title=task.name, xlabel="position (dotted: the training length)", ylim=(-0.02, 1.02))
    axes[0][0].set_ylabel("accuracy")
    axes[0][-1].legend(fontsize=8)
    _save(fig, path)


def recall_mechanism(attention: dict | None, readouts: list | None, path) -> None:
    """Left: the trained attention's last layer from one sequence (the head with the most weight on the queried
    pair's value). Next: per head, the mean weight a query puts on its pair's key, its value and the other values.
    Then, per RWKV-7 layer, its readout: cos(S r at the query of pair i, v written at pair j); an associative
    memory gives a diagonal apart from the rest (its sign is free: the layer's output projection can flip it)."""
    readouts = readouts or []
    panels = (attention is not None) * 2 + len(readouts)
    fig = Figure(figsize=(2.8 * panels, 3.2))
    axes = list(fig.subplots(1, panels, squeeze=False)[0])
    if attention is not None:
        ax = axes.pop(0)
        ax.imshow(attention["example"], cmap="magma", vmin=0, vmax=1)
        ax.set(title=f"attention, last layer, head {attention['best_head']}", xlabel="key position j",
               ylabel="query position i")
        ax = axes.pop(0)
        heads = np.arange(len(attention["value"]))
        for offset, (name, values) in zip((-0.27, 0, 0.27), (("its key", attention["key"]),
                                                             ("its value", attention["value"]),
                                                             ("other values", attention["other_values"]))):
            ax.bar(heads + offset, values, width=0.27, label=name)
        ax.set(title="weight from a query to ...", xlabel="head of the last layer", ylim=(0, 1))
        ax.set_xticks(heads)
        ax.legend(fontsize=7)
    for layer, readout in enumerate(readouts):
        ax = axes.pop(0)
        image = ax.imshow(readout, cmap="RdBu_r", vmin=-0.5, vmax=0.5)
        ax.set_xticks(range(len(readout)))
        ax.set_yticks(range(len(readout)))
        ax.set(title=f"RWKV-7 layer {layer}: cos(S r, v)", xlabel="value of pair j", ylabel="query of pair i")
    if readouts:
        fig.colorbar(image, ax=ax, fraction=0.046)
    _save(fig, path)


def step_sizes(before, after, symbols, path) -> None:
    """Mamba's first-layer mean delta_t on symbols and on blanks, before and after training (histograms)."""
    fig = Figure(figsize=(8, 3.2))
    axes = fig.subplots(1, 2, sharey=True)
    for ax, steps, title in zip(axes, (before, after), ("at initialization", "trained")):
        bins = np.linspace(min(before.min(), after.min()), max(before.max(), after.max()), 40)
        ax.hist(steps[~symbols], bins=bins, alpha=0.6, density=True, label="blanks")
        ax.hist(steps[symbols], bins=bins, alpha=0.6, density=True, label="symbols")
        ax.set(title=f"Mamba layer 0, {title}", xlabel=r"mean $\Delta_t$ over channels")
    axes[0].set_ylabel("density")
    axes[1].legend(fontsize=8)
    _save(fig, path)


def transition_eigenvalues(layers: list, tokens, path) -> None:
    """RWKV-7's transition on parity, a panel per layer: the smallest real eigenvalue of each step's transition on
    steps that read a 0 and on steps that read a 1 (histograms over steps and heads)."""
    fig = Figure(figsize=(4.2 * len(layers), 3.2))
    axes = fig.subplots(1, len(layers), squeeze=False)[0]
    bins = np.linspace(-1.05, 1.05, 43)
    for i, (ax, layer) in enumerate(zip(axes, layers)):
        for value, name in ((0, "token 0 (keep)"), (1, "token 1 (flip)")):
            ax.hist(layer["min_real"][tokens == value].ravel(), bins=bins, alpha=0.6, density=True, label=name)
        ax.axvline(-1, color="grey", linewidth=0.8, linestyle=":")
        ax.set(title=f"layer {i}", xlabel="smallest real eigenvalue of G_t")
    axes[0].set_ylabel("density")
    axes[-1].legend(fontsize=8)
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


def lm_context(rows, path) -> None:
    """Bits per byte against the position in the file (log scale), windowed (dashed) and the whole text read with
    the state carried (solid), one colour per model, one panel per text; the best compressor as a grey line."""
    fig = Figure(figsize=(5.5 * len(rows), 4.2))                   # at most 1250 px wide at 110 dpi
    for ax, row in zip(fig.subplots(1, len(rows), squeeze=False)[0], rows):
        edges = np.array(row["position_edges"], dtype=float)
        centres = np.sqrt(edges[:-1] * edges[1:])
        for i, (arch, m) in enumerate(row["models"].items()):
            for key, style, label in (("stream_by_position", "-", "whole text"), ("window_by_position", "--",
                                                                                  "windowed")):
                ys = np.array([np.nan if y is None else y for y in m[key]])
                ax.plot(centres, ys, style, color=f"C{i}", label=f"{arch}, {label}")
        best = min((v, c) for c, v in row["compressors"].items() if v is not None)
        ax.axhline(best[0], color="0.5", lw=1, label=f"{best[1]} (whole text)")
        ax.set(xscale="log", xlabel="position in the file (bytes)", ylabel="bits per byte", title=row["text"])
        ax.legend(fontsize=7)
    _save(fig, path)
