"""Draws the block diagrams that notebooks 03 (RWKV-4) and 06 (Mamba) show as images: boxes and arrows in matplotlib,
written as SVG beside this file. Run it after changing a diagram: `python notebooks/images/draw_block_diagrams.py`.

A box is (x, y, half width, half height); arrows run between points on box edges (left, right, top, bottom), with
optional corners, so every line is horizontal or vertical. The residual stream is drawn in blue."""
from pathlib import Path

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
plt.rcParams["svg.hashsalt"] = "seqmix"           # stable ids: the SVG changes only when the drawing does
plt.rcParams["svg.fonttype"] = "none"             # text stays text (smaller, searchable)
COLOURS = {"norm": "#e8eef7", "linear": "#fdf1d8", "op": "#e6f4e6", "state": "#f6e3e3", "plain": "white"}
INK, STREAM = "#444", "#1f4e9a"


def box(ax, x, y, label, kind="linear", width=1.0, height=0.44):
    ax.add_patch(plt.Rectangle((x - width / 2, y - height / 2), width, height, facecolor=COLOURS[kind],
                               edgecolor=INK, lw=0.9))
    ax.text(x, y, label, ha="center", va="center", fontsize=9.5)
    return x, y, width / 2, height / 2


def left(b, y=None):
    return b[0] - b[2], b[1] if y is None else y


def right(b, y=None):
    return b[0] + b[2], b[1] if y is None else y


def top(b, x=None):
    return b[0] if x is None else x, b[1] + b[3]


def bottom(b, x=None):
    return b[0] if x is None else x, b[1] - b[3]


def arrow(ax, *points, label=None, colour=INK, lw=0.9):
    """A polyline through the points, with an arrow head at the last; label above the last segment."""
    for p, q in zip(points[:-2], points[1:-1]):
        ax.plot([p[0], q[0]], [p[1], q[1]], color=colour, lw=lw)
    ax.annotate("", xy=points[-1], xytext=points[-2],
                arrowprops=dict(arrowstyle="-|>", color=colour, lw=lw, shrinkA=0, shrinkB=0))
    if label:
        (x0, y0), (x1, y1) = points[-2], points[-1]
        if x0 == x1:                                       # a vertical segment: the label to its right
            ax.text(x0 + 0.07, (y0 + y1) / 2, label, ha="left", va="center", fontsize=8.5, color="#333")
        else:
            ax.text((x0 + x1) / 2, max(y0, y1) + 0.05, label, ha="center", va="bottom", fontsize=8.5,
                    color="#333")


def canvas(width, height):
    fig, ax = plt.subplots(figsize=(width, height))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    return fig, ax


def sub_block(ax, y_stream, y0, norm, shift_note, rows, out_x):
    """A pre-norm sub-block: the stream at y_stream feeds norm -> token shift -> one mix and matrix per row; returns
    the boxes and the adder (at out_x on the stream)."""
    n = box(ax, 1.3, y0, norm, "norm", 0.7)
    s = box(ax, 2.75, y0, f"token shift\n({shift_note})", "state", 1.5)
    arrow(ax, (0.5, y_stream), (0.5, y0), left(n), colour=STREAM, lw=1.0)
    arrow(ax, right(n), left(s))
    boxes = {}
    for name, y in rows:
        m = box(ax, 4.55, y, f"mix μ{name}", "op", 1.0)
        w = box(ax, 5.75, y, f"W{name}", "linear", 0.65)
        arrow(ax, right(s), (3.8, s[1]), (3.8, y), left(m))
        arrow(ax, right(m), left(w))
        boxes[name] = w
    add = box(ax, out_x, y_stream, "+", "plain", 0.4, 0.4)
    return boxes, add


def rwkv4_block():
    fig, ax = canvas(12.4, 5.4)
    y1, y2 = 4.9, 2.05                                     # the stream before the time mix, before the channel mix
    ax.text(0.45, y1, "x(l-1)", ha="right", va="center", fontsize=10)
    ax.text(0.6, y1 + 0.25, "block 0: pre_ln first", fontsize=8.5, color="#555")
    w, add1 = sub_block(ax, y1, 3.75, "LN1", "att_x_prev", (("_r", 4.3), ("_k", 3.75), ("_v", 3.2)), 11.3)
    wkv = box(ax, 7.55, 3.475, "WKV(w, u)\nstate: num, den, max", "state", 1.9, 0.8)
    sig = box(ax, 7.55, 4.3, "σ(r)", "op", 0.7)
    mul = box(ax, 9.3, 4.3, "⊙", "op", 0.4)
    wo = box(ax, 10.3, 4.3, "W_o", "linear", 0.65)
    arrow(ax, right(w["_r"]), left(sig), label="r")
    arrow(ax, right(w["_k"]), left(wkv, 3.75), label="k")
    arrow(ax, right(w["_v"]), left(wkv, 3.2), label="v")
    arrow(ax, right(sig), left(mul))
    arrow(ax, right(wkv), (9.3, 3.475), bottom(mul))
    ax.text(8.6, 3.52, "wkv", fontsize=8.5, color="#333")
    arrow(ax, right(mul), left(wo))
    arrow(ax, right(wo), (11.3, 4.3), bottom(add1))
    arrow(ax, (0.5, y1), left(add1), colour=STREAM, lw=1.6)
    ax.text(5.9, y1 + 0.06, "residual", ha="center", va="bottom", fontsize=8.5, color=STREAM)
    # x' runs down the right edge, then back to the left as the second sub-block's stream
    arrow(ax, bottom(add1), (11.3, y2 + 0.55), (0.5, y2 + 0.55), (0.5, y2), colour=STREAM, lw=1.2)
    ax.text(11.4, 3.2, "x'", fontsize=10, color=STREAM)
    w2, add2 = sub_block(ax, y2, 0.95, "LN2", "ffn_x_prev", (("'_r", 1.45), ("'_k", 0.45)), 11.3)
    sig2 = box(ax, 7.55, 1.45, "σ(r')", "op", 0.7)
    relu = box(ax, 7.2, 0.45, "max(k', 0)²", "op", 1.1)
    wv = box(ax, 8.45, 0.45, "W'_v", "linear", 0.65)
    mul2 = box(ax, 9.3, 1.45, "⊙", "op", 0.4)
    arrow(ax, right(w2["'_r"]), left(sig2), label="r'")
    arrow(ax, right(w2["'_k"]), left(relu), label="k'")
    arrow(ax, right(relu), left(wv))
    arrow(ax, right(sig2), left(mul2))
    arrow(ax, right(wv), (9.3, 0.45), bottom(mul2))
    arrow(ax, right(mul2), (11.3, 1.45), bottom(add2))
    arrow(ax, (0.5, y2), left(add2), colour=STREAM, lw=1.6)
    arrow(ax, right(add2), (12.35, y2), colour=STREAM, lw=1.6)
    ax.text(12.35, y2 + 0.12, "x(l)", ha="right", va="bottom", fontsize=10)
    fig.savefig(HERE / "rwkv4_block.svg", bbox_inches="tight")
    plt.close(fig)


def mamba_block():
    fig, ax = canvas(12.4, 3.6)
    ys = 0.4                                               # the residual stream
    norm = box(ax, 1.3, 2.0, "RMSNorm", "norm", 0.95)
    inproj = box(ax, 2.65, 2.0, "in_proj", "linear", 0.85)
    conv = box(ax, 4.3, 2.6, "conv1d\n(window: state)", "state", 1.35, 0.6)
    silu1 = box(ax, 5.6, 2.6, "SiLU", "op", 0.6)
    xproj = box(ax, 7.3, 3.25, "x_proj → dt_low, B, C", "linear", 1.95)
    dt = box(ax, 10.0, 3.25, "dt_proj, softplus → Δ", "linear", 1.95)
    scan = box(ax, 8.65, 2.2, "scan(x'; A = -exp(A_log), Δ, B, C, D)\nstate: h", "state", 3.4, 0.6)
    silu2 = box(ax, 5.6, 1.2, "SiLU", "op", 0.6)
    mul = box(ax, 10.9, 1.2, "⊙", "op", 0.4)
    out = box(ax, 11.75, 1.2, "out_proj", "linear", 0.85)
    add = box(ax, 11.75, ys, "+", "plain", 0.4, 0.4)
    ax.text(0.45, ys, "x(l-1)", ha="right", va="center", fontsize=10)
    arrow(ax, (0.5, ys), (0.5, 2.0), left(norm), colour=STREAM, lw=1.0)
    arrow(ax, (0.5, ys), left(add), colour=STREAM, lw=1.6)
    ax.text(6.0, ys + 0.06, "residual", ha="center", va="bottom", fontsize=8.5, color=STREAM)
    arrow(ax, right(norm), left(inproj))
    arrow(ax, top(inproj), (2.65, 2.6), left(conv), label="x")
    arrow(ax, right(conv), left(silu1))
    arrow(ax, right(silu1), (6.1, 2.6), (6.1, 3.25), left(xproj), label="x'")
    arrow(ax, (6.1, 2.6), (6.1, 2.2), left(scan))
    arrow(ax, right(xproj), left(dt))
    arrow(ax, bottom(xproj, 7.3), top(scan, 7.3), label="B, C")
    arrow(ax, bottom(dt), top(scan, 10.0), label="Δ")
    arrow(ax, bottom(inproj), (2.65, 1.2), left(silu2), label="z")
    arrow(ax, right(silu2), left(mul))
    arrow(ax, right(scan), (10.9, 2.2), top(mul), label="y")
    arrow(ax, right(mul), left(out))
    arrow(ax, bottom(out), top(add))
    arrow(ax, right(add), (12.4, ys), colour=STREAM, lw=1.6)
    ax.text(12.4, ys + 0.12, "x(l)", ha="right", va="bottom", fontsize=10)
    fig.savefig(HERE / "mamba_block.svg", bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    rwkv4_block()
    mamba_block()
