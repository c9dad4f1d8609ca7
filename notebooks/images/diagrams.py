"""Draw the course's block diagrams as PNGs beside this file (run: python notebooks/images/diagrams.py).

Images, not ASCII: a diagram of 100+ columns wraps into fragments in a Lab window of common width. Each box is a
bordered text; each arrow runs from one side of a box to a side of another (l, r, t, b), or to a point, so arrows
meet the boxes' edges whatever the text's width.
"""
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

HERE = Path(__file__).resolve().parent
DPI = 100                                   # 12 inches: 1200 px, inside the 1250 px a Lab shows unscaled
RESIDUAL, OP, MIX = "#fdf0d5", "#e3f1e3", "#eef3fb"
SIDE = {"l": (0, 0.5), "r": (1, 0.5), "t": (0.5, 1), "b": (0.5, 0)}
LEAVE = {"l": 180, "r": 0, "t": 90, "b": 270}


class Diagram:
    def __init__(self, height, title):
        self.fig, self.ax = plt.subplots(figsize=(12, height), dpi=DPI)
        self.ax.set(xlim=(0, 100), ylim=(-4, 100))
        self.ax.axis("off")
        self.ax.set_title(title, fontsize=11)
        self.boxes = {}

    def box(self, name, x, y, text, colour=MIX):
        self.boxes[name] = self.ax.text(x, y, text, ha="center", va="center", fontsize=9, zorder=3,
                                        bbox=dict(boxstyle="round,pad=0.35", fc=colour, ec="#445"))

    def tall(self, x0, y0, x1, y1, text, colour=OP):
        """A box over a data rectangle, for many arrows into one side."""
        self.ax.add_patch(FancyBboxPatch((x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0.3", fc=colour, ec="#445"))
        self.ax.text((x0 + x1) / 2, (y0 + y1) / 2, text, ha="center", va="center", fontsize=9)

    def arrow(self, start, end, sides="rl", label=None, rad=None):
        """start, end: a box's name (sides[0], sides[1] say which side) or an (x, y) point in data coordinates."""
        ends = []
        for which, side in zip((start, end), sides):
            ends.append((SIDE[side], self.boxes[which]) if isinstance(which, str) else (which, "data"))
        (xy0, c0), (xy1, c1) = ends
        a, b = LEAVE[sides[0]], (LEAVE[sides[1]] + 180) % 360
        style = (f"arc3,rad={rad}" if rad is not None else "arc3" if a == b and sides in ("rl", "lr", "tb", "bt")
                 else f"angle,angleA={a},angleB={b}" if (a - b) % 180 else f"arc,angleA={a},angleB={b},armA=12,"
                 f"armB=12,rad=0")
        self.ax.annotate("", xy=xy1, xycoords=c1, xytext=xy0, textcoords=c0, zorder=2,
                         arrowprops=dict(arrowstyle="-|>", color="#334", lw=1, shrinkA=0, shrinkB=0,
                                         connectionstyle=style))
        if label:
            self.ax.text(*label, ha="center", fontsize=8, color="#556")

    def note(self, x, y, text):
        self.ax.text(x, y, text, ha="left", va="center", fontsize=8, color="#556")

    def save(self, name):
        self.fig.savefig(HERE / name, dpi=DPI, bbox_inches="tight")
        plt.close(self.fig)


def rwkv7_block():
    """One RWKV-7 block (reference/rwkv7.py, notebook 05 §7): time mix, then channel mix, each on a residual."""
    d = Diagram(7.2, "One RWKV-7 block: the time mix (top), the channel mix (bottom row)")
    d.box("x", 6, 97, "x (from layer l-1;\nlayer 0: ln0 first)", RESIDUAL)
    d.box("ln1", 6, 78, "LN1")
    d.box("shift", 6, 60, "token shift\n(att_x_prev):\nsix mixes")
    rows = {"r": (90, "W_r -> r"), "w": (81, "LoRA, soft clamp -> log w"), "a": (72, "LoRA, sigmoid -> alpha"),
            "k": (63, "W_k -> k"), "v": (45, "W_v -> v"), "g": (27, "LoRA, sigmoid -> g")}
    for name, (y, text) in rows.items():
        d.box("x" + name, 21, y, f"x^{name}")
        d.box(name, 36, y, text)
        d.arrow("shift", "x" + name, "rl")
        d.arrow("x" + name, name)
    d.box("kk", 58, 63, "kk = k * k_k, unit per head;\na = -kk, b = kk * alpha")
    d.box("kt", 58, 54, "k~ = k * (1 + (alpha - 1) * k_a)")
    d.box("vres", 58, 45, "v pulled toward v_first")
    d.box("vfirst", 58, 35, "v_first (layer 0's v)", RESIDUAL)
    d.tall(74, 40, 81, 93, "WKV-7\n\nreads and\nwrites the\nstate S\n(N x N\nper head)")
    for start in ("r", "w"):
        d.arrow(start, (73.7, rows[start][0]), "rl")
    for start, y in (("kk", 63), ("kt", 54), ("vres", 45)):
        d.arrow(start, (73.7, y), "rl")
    d.arrow("k", "kk")
    d.arrow("k", "kt", "rl")
    d.arrow("v", "vres")
    d.arrow("vfirst", "vres", "tb")
    d.note(43, 76.5, "(alpha: into b and k~)")
    d.box("gn", 91, 86, "GroupNorm\nper head (ln_x)")
    d.box("bonus", 91, 68, "+ (sum r k~ r_k) v\n(the bonus)")
    d.box("gate", 91, 27, "* g")
    d.box("wo", 91, 20, "W_o")
    d.box("add1", 98.5, 16, "+", RESIDUAL)
    d.arrow((81.3, 86), "gn", "rl")
    d.arrow("gn", "bonus", "bt")
    d.arrow("bonus", "gate", "bt")
    d.arrow("g", "gate")
    d.arrow("gate", "wo", "bt")
    d.arrow("wo", "add1", "rt")
    d.arrow("x", "add1", "rt", label=(60, 99, "residual"))
    d.arrow("x", "ln1", "bt")
    d.arrow("ln1", "shift", "bt")
    row = 7
    d.box("x1", 5, row, "x' (the + above)", RESIDUAL)
    for name, x, text in (("ln2", 19, "LN2"), ("shift2", 30, "token shift\n(ffn_x_prev)"), ("fk", 44, "W_k"),
                          ("relu", 56, "max(., 0)^2"), ("fv", 68, "W_v"), ("add2", 80, "+"),
                          ("out", 91, "x (to layer l+1)")):
        d.box(name, x, row, text, RESIDUAL if name in ("add2", "out") else MIX)
    for a, b in (("x1", "ln2"), ("ln2", "shift2"), ("shift2", "fk"), ("fk", "relu"), ("relu", "fv"), ("fv", "add2"),
                 ("add2", "out")):
        d.arrow(a, b)
    d.arrow("x1", "add2", "bb", rad=0.1)
    d.note(2, 16, "channel mix: no receptance\ngate (unlike RWKV-4)")
    d.save("rwkv7_block.png")


def transformer_block():
    """The control of notebooks 09 and 10 (experiments/transformer.py): pre-LN, RoPE in attention, a GELU MLP."""
    d = Diagram(4.4, "The transformer control (experiments/transformer.py): one block, repeated per layer")
    d.box("emb", 7, 90, "token ids ->\nembedding E", RESIDUAL)
    d.box("x", 7, 62, "x", RESIDUAL)
    chain = (("ln1", 20, "LN"), ("qkv", 34, "W_qkv -> q, k, v\n(H heads of d)"),
             ("rope", 52, "RoPE on q and k\n(or PI, NTK, ReRoPE;\nlog n scales q)"),
             ("att", 70, "causal softmax\nattention per head"), ("wo", 83, "W_o"), ("add1", 94, "+"))
    for name, x, text in chain:
        d.box(name, x, 62, text, OP if name == "att" else RESIDUAL if name == "add1" else MIX)
    d.arrow("emb", "x", "bt")
    for (a, *_), (b, *_) in zip(((("x",),) + chain)[:-1], chain):
        d.arrow(a, b)
    d.arrow("x", "add1", "tt", rad=-0.12)
    d.box("x1", 7, 20, "x'", RESIDUAL)
    d.arrow("add1", "x1", "bt", rad=-0.05)
    chain2 = (("ln2", 20, "LN"), ("up", 36, "W_1 (C -> 4C)"), ("gelu", 52, "GELU"), ("down", 68, "W_2 (4C -> C)"),
              ("add2", 83, "+"), ("head", 94, "next block,\nor LN -> head"))
    for name, x, text in chain2:
        d.box(name, x, 20, text, RESIDUAL if name == "add2" else MIX)
    for (a, *_), (b, *_) in zip(((("x1",),) + chain2)[:-1], chain2):
        d.arrow(a, b)
    d.arrow("x1", "add2", "bb", rad=0.12)
    d.save("transformer_block.png")


def rwkv4_block():
    """One RWKV-4 block (reference/rwkv4.py, notebook 03 section 4): time mix, then channel mix, each on a residual.
    Green (OP) boxes carry state from token to token."""
    d = Diagram(5.6, "One RWKV-4 block: the time mix (top), the channel mix (bottom)")
    d.box("x", 5, 95, "x (from layer l-1;\nlayer 0: pre_ln first)", RESIDUAL)
    d.box("ln1", 5, 72, "LN1")
    d.box("shift", 18, 72, "token shift\n(att_x_prev)", OP)
    for name, y in (("r", 84), ("k", 72), ("v", 60)):
        d.box("mix" + name, 33, y, f"mix mu_{name}")
        d.box("W" + name, 45, y, f"W_{name} -> {name}")
        d.arrow("shift", "mix" + name, "rl")
        d.arrow("mix" + name, "W" + name)
    d.box("sig", 62, 84, "sigmoid(r)")
    d.tall(56, 56, 68, 76, "WKV(w, u)\nstate: num,\nden, max")
    d.arrow("Wk", (55.7, 72), "rl")
    d.arrow("Wv", (55.7, 60), "rl")
    d.arrow("Wr", "sig")
    d.box("mul", 76, 84, "*")
    d.arrow("sig", "mul")
    d.arrow((68.3, 66), "mul", "rb", label=(73, 62, "wkv"))
    d.box("wo", 86, 84, "W_o")
    d.box("add1", 96, 95, "+", RESIDUAL)
    d.arrow("mul", "wo")
    d.arrow("wo", "add1", "rb")
    d.arrow("x", "add1", label=(50, 97, "residual"))
    d.arrow("x", "ln1", "bt")
    d.arrow("ln1", "shift")
    d.box("x1", 5, 38, "x' (the + above)", RESIDUAL)
    d.box("ln2", 5, 16, "LN2")
    d.box("shift2", 18, 16, "token shift\n(ffn_x_prev)", OP)
    for name, y in (("r", 24), ("k", 8)):
        d.box("mix2" + name, 33, y, f"mix mu'_{name}")
        d.box("W2" + name, 45, y, f"W'_{name} -> {name}'")
        d.arrow("shift2", "mix2" + name, "rl")
        d.arrow("mix2" + name, "W2" + name)
    d.box("sig2", 62, 24, "sigmoid(r')")
    d.box("relu", 60, 8, "max(k', 0)^2")
    d.box("wv2", 72, 8, "W'_v")
    d.box("mul2", 76, 24, "*")
    d.box("add2", 90, 38, "+", RESIDUAL)
    d.box("out", 97, 16, "x (to\nlayer l+1)", RESIDUAL)
    for a, b in (("W2r", "sig2"), ("W2k", "relu"), ("relu", "wv2"), ("sig2", "mul2"), ("ln2", "shift2")):
        d.arrow(a, b)
    d.arrow("wv2", "mul2", "rb")
    d.arrow("mul2", "add2", "rb")
    d.arrow("x1", "add2", label=(50, 40, "residual"))
    d.arrow("x1", "ln2", "bt")
    d.arrow("add2", "out", "rt")
    d.save("rwkv4_block.png")


def mamba_block():
    """One Mamba block (reference/mamba.py, notebook 06 section 7). Green (OP) boxes carry state from token to token:
    the convolution's window and the scan's h."""
    d = Diagram(4.2, "One Mamba block (Algorithm 2)")
    d.box("x", 5, 4, "x (from\nlayer l-1)", RESIDUAL)
    d.box("norm", 5, 55, "RMSNorm")
    d.box("inproj", 17, 55, "in_proj")
    d.box("conv", 31, 72, "conv1d\n(window: state)", OP)
    d.box("silu1", 43, 72, "SiLU -> x'")
    d.box("xproj", 57, 92, "x_proj -> dt_low, B, C")
    d.box("dt", 80, 92, "dt_proj, softplus -> Delta")
    d.tall(52, 62, 86, 76, "scan(x'; A = -exp(A_log), Delta, B, C, D)\nstate: h")
    d.box("silu2", 43, 35, "SiLU(z)")
    d.box("mul", 86, 35, "*")
    d.box("out", 86, 18, "out_proj")
    d.box("add", 97, 18, "+", RESIDUAL)
    d.box("next", 97, 50, "x (to\nlayer l+1)", RESIDUAL)
    d.arrow("x", "norm", "tb")
    d.arrow("norm", "inproj")
    d.arrow("inproj", "conv", "tl", label=(22, 74, "x"))
    d.arrow("conv", "silu1")
    d.arrow("silu1", "xproj", "tl")
    d.arrow("silu1", (51.7, 69), "rl")
    d.arrow("xproj", "dt")
    d.arrow("xproj", (57, 76.3), "bt", label=(60, 81, "B, C"))
    d.arrow("dt", (80, 76.3), "bt", label=(83, 81, "Delta"))
    d.arrow("inproj", "silu2", "bl", label=(22, 37, "z"))
    d.arrow("silu2", "mul")
    d.arrow((86.3, 69), "mul", "rt", label=(89, 52, "y"))
    d.arrow("mul", "out", "bt")
    d.arrow("out", "add")
    d.arrow("add", "next", "tb")
    d.arrow("x", "add", "rb", label=(50, 6, "residual"))
    d.save("mamba_block.png")


if __name__ == "__main__":
    rwkv7_block()
    transformer_block()
    rwkv4_block()
    mamba_block()
