# %% [markdown]
# # 07 · ReRoPE: rectified rotary positions, two-pass prefill, one-pass decode, and what the post measured
#
# RoPE makes attention depend on the distance $i - j$ between a query and a key, and a model trained on sequences of
# length $L$ has never seen a distance beyond $L$. ReRoPE (Su Jianlin) keeps every distance inside a window $w$ exact
# and clamps the rest to $w$; Leaky ReRoPE lets them grow slowly (slope $1/k$) instead. This notebook follows the
# post: RoPE; its two earlier fixes for longer texts, position interpolation and NTK-aware scaling; Leaky ReRoPE
# and ReRoPE as maps $f$ of the distance (the picture behind the names), with the conditions on $w$ and $k$; why a
# clamped distance cannot come from one rotation per position, and the two attention passes the post computes
# instead; the one-pass formula for decoding with a cache of un-rotated keys; log-n scaling of the queries; the
# post's result tables, with reading notes; and why a fused kernel costs one attention plus a band, not two
# attentions. An appendix checks the fused kernel (torch path and Triton) against the per-pair definition.
#
# **Sources.** Su Jianlin, "Transformer upgrade path 12: ReRoPE with infinite extrapolation?",
# https://spaces.ac.cn/archives/9708 (the order followed here; erratum 9 of
# [`reference/ERRATA.md`](../reference/ERRATA.md), and erratum 10, a sign slip shown in section 5); RoPE,
# arXiv:2104.09864, https://arxiv.org/abs/2104.09864; NTK-aware scaled RoPE, bloc97 (2023), which the post names as
# its predecessor. The toy-scale reproduction of the post's experiment is
# [notebook 10](10_extrapolation.ipynb).
#
# **Notation.** The post's $k$ is two things: the keys $k_j$ and the PI/Leaky factor $k$ (the code calls the factor
# `k_slope` or `leaky_k`); its $w$ is a window here, while in notebooks 02 to 05 $w$ is a decay. The
# [notation crosswalk](notation.md) lists these and the other clashes.
#
# **Code used.** [`reference/rope.py`](../reference/rope.py): `apply_rope`, `ntk_scaled_base`, `relative_positions`,
# `rectify`, `attention_from_relative_positions` (the definition, pair by pair), `rerope_attention` (the post's two
# passes), `rerope_decode`, `log_n_scale` (NumPy, float64: the truth) ·
# [`reference/attention.py`](../reference/attention.py): `softmax_attention` ·
# [`kernels/rerope/`](../kernels/rerope/__init__.py): `rerope_attention`, `rerope_decode` (backend `"torch"`: exact
# flash-attention pieces merged by log-sum-exp; backend `"triton"`: one fused kernel, forward, backward and decode)
# · [`kernels/testing.py`](../kernels/testing.py): `check` and the error budgets.

# %%
import seqmix

# without a GPU: TRITON_INTERPRET=1, before triton is imported
MODE = seqmix.use_interpreter_without_gpu()

import matplotlib.pyplot as plt
import numpy as np
import torch

from seqmix.kernels.testing import FP16_BUDGET, FP32_BUDGET, REFERENCE_BUDGET, check, rel_rms
from seqmix.reference import attention as ref_attention, rope as ref

rng = np.random.default_rng(0)
torch.manual_seed(0)
print("Triton kernels run on:", MODE)


# %% [markdown]
# ## 1. RoPE: absolute rotations, relative scores
#
# RoPE rotates each query and key by an angle proportional to its position. With head dimension $d$, dimension $f$ is
# paired with $f + d/2$ (the "rotate-half" layout of GPT-NeoX and LLaMA), and pair $f$ turns by $p\,\theta_f$,
# $\theta_f = \text{base}^{-2f/d}$. Written with complex numbers, $z_f = x_f + \mathrm{i}\,x_{f+d/2}$, the rotation
# $\mathcal{R}^p$ is $z_f \mapsto e^{\mathrm{i} p\theta_f} z_f$. Rotations compose and are orthogonal,
# $(\mathcal{R}^{i})^\top \mathcal{R}^{j} = \mathcal{R}^{j - i}$, so the score of a rotated pair depends only on the
# distance:
#
# $$\left(\mathcal{R}^{i} q_i\right)^\top \left(\mathcal{R}^{j} k_j\right) = q_i^\top \mathcal{R}^{\,j - i}\, k_j .$$
#
# Attention with RoPE is therefore attention with the relative-position matrix $\text{rel}_{ij} = i - j$: every key
# is rotated by $-\text{rel}_{ij}$ relative to its query. `attention_from_relative_positions` computes exactly that,
# pair by pair, for any matrix $\text{rel}$: it is the definition everything below is checked against.

# %%
T, d = 12, 8
theta = 10000.0 ** (-np.arange(0, d, 2) / d)                   # (d/2,) theta_f

def rotate(x, positions):
    # R^p x via complex numbers: pair (x_f, x_{f+d/2}) is z_f = x_f + i x_{f+d/2}, multiplied by
    # e^{i p theta_f}.
    h = x.shape[-1] // 2
    z = (x[..., :h] + 1j * x[..., h:]) * np.exp(1j * np.multiply.outer(positions, theta))
    return np.concatenate([z.real, z.imag], axis=-1)

q, k, v = (rng.standard_normal((T, d)) for _ in range(3))
pos = np.arange(T, dtype=float)
scores_absolute = rotate(q, pos) @ rotate(k, pos).T  # (R^i q_i) . (R^j k_j)
# q_i . R^{j-i} k_j
scores_relative = np.array([[q[i] @ rotate(k[j], j - i) for j in range(T)] for i in range(T)])

# %% tags=["nbval-check-output"]
for what, actual, expected in (
    ("complex-number rotation vs reference.apply_rope", rotate(q, pos), ref.apply_rope(q, pos)),
    ("(R^i q_i) . (R^j k_j) vs q_i . R^{j-i} k_j", scores_absolute, scores_relative),
    ("RoPE attention vs the definition with rel = i - j",
     ref_attention.softmax_attention(ref.apply_rope(q, pos), ref.apply_rope(k, pos), v),
     ref.attention_from_relative_positions(q, k, v, ref.relative_positions(T, "rope"))),
):
    check(what, actual, expected, REFERENCE_BUDGET)


# %% [markdown]
# ## 2. Beyond the training length: extrapolation and position interpolation
#
# Run a RoPE model on a text longer than its training length $L$ and the attention matrix holds distances it never
# saw: $\text{rel}_{ij} = i - j$ reaches $L_\text{test} - 1$. That is *direct extrapolation*, and it usually goes
# badly. *Position interpolation* (PI) runs RoPE at positions $p/k$ instead, which makes the matrix
#
# $$\text{rel}_{ij} = \frac{i - j}{k}, \qquad k \ge \frac{L_\text{test} - 1}{L - 1}$$
#
# so that no distance exceeds what training saw. The price, in the post's words, is that positions get "crowded":
# neighbours are now $1/k$ apart, and the model needs some fine-tuning to work again; far fewer steps, though, than
# learning to extrapolate (networks interpolate better than they extrapolate). The post also looks at the methods
# through *locality*: a language model leans most on nearby tokens. Extrapolation keeps the distances near 0 as they
# were (locality kept), but adds untrained large ones; PI adds none, but compresses the distances near 0 to $1/k$
# (locality disturbed), which is why it does not work without fine-tuning.
#
# **The PI matrix as printed (erratum 9).** The post's PI matrix ends with the row
# $\frac{L-1}{k}, \frac{L-1}{k}, \dots$; its second entry must be $\frac{L-2}{k}$. Position interpolation means running
# RoPE at positions $p/k$, so the matrix is $(i - j)/k$, constant along each diagonal. Running RoPE at positions
# $p / k$ gives exactly the attention of the $x/k$ matrix; the printed entry belongs to no assignment of positions
# and changes the last row's output:

# %%
k_slope = 4.0
pi_attention = ref_attention.softmax_attention(rotate(q, pos / k_slope), rotate(k, pos / k_slope),
                                               v)                   # RoPE at positions p / k
rel_pi = ref.relative_positions(T, "pi", k=k_slope)
rel_printed = rel_pi.copy()
rel_printed[T - 1, 1] = (T - 1) / k_slope  # the post's last row: (L-1)/k, (L-1)/k, ...

# %% tags=["nbval-check-output"]
check("RoPE at positions p/k vs the definition with (i - j)/k", pi_attention,
      ref.attention_from_relative_positions(q, k, v, rel_pi), REFERENCE_BUDGET)
print("the printed matrix is constant along its diagonals:",
      bool(rel_printed[T - 1, 1] == rel_printed[T - 2, 0]))

# %%
printed_row = ref.attention_from_relative_positions(q, k, v, rel_printed)[T - 1]
printed_error = rel_rms(printed_row, pi_attention[T - 1])
print(f"last row of the output with the printed PI matrix: rel. error {printed_error:.1e}")
assert printed_error > 1e-3

# %% [markdown]
# ## 3. NTK-aware scaled RoPE
#
# The post's predecessor, which it names without a formula, takes a third way: leave the positions alone and change
# RoPE's base, so that each pair of dimensions is slowed by its own factor. For a text $s$ times the training
# length,
#
# $$\text{base}' = \text{base} \cdot s^{d/(d-2)} \quad\Longrightarrow\quad
# \theta'_f = \theta_f\, s^{-2f/(d-2)}, \qquad f = 0, \dots, \tfrac{d}{2} - 1 .$$
#
# The fastest pair ($f = 0$) turns exactly as in training: it *extrapolates*. The slowest ($f = d/2 - 1$) turns $s$
# times slower: it is *interpolated*, as by PI. The pairs between get a factor in between. This is the post's "high
# frequencies extrapolate, low frequencies interpolate", which "spreads the extrapolation pressure over every
# dimension". Why it works without fine-tuning: a fast pair has turned through every angle many times within the
# training length, so a larger position shows it no new angle; only the slow pairs, which never completed a turn in
# training, would meet new angles, and those are the ones slowed down. Locality is kept too: neighbours are told
# apart by the fast pairs, which are left as they were. Its limit, per the post: it still relies on some
# extrapolation (the middle pairs), and in the post's tests its long-context results stayed short of the training
# results.
#
# `reference.rope.ntk_scaled_base(d, s)` returns $\text{base}'$; the rotation is then plain `apply_rope` with it.
# Checked against the notebook's complex rotation with the slowed $\theta'_f$ written per pair:

# %%
d_ntk, s_ntk = 64, 8.0
pair = np.arange(d_ntk // 2)                                            # f = 0 .. d/2 - 1
theta_ntk = 10000.0 ** (-2 * pair / d_ntk) * s_ntk ** (-2 * pair / (d_ntk - 2))   # theta'_f
x_ntk, p_ntk = rng.standard_normal((5, d_ntk)), np.array([0.0, 1.0, 100.0, 511.0, 4095.0])
z_ntk = x_ntk[:, :d_ntk // 2] + 1j * x_ntk[:, d_ntk // 2:]  # pair f as a complex number
z_ntk = z_ntk * np.exp(1j * np.outer(p_ntk, theta_ntk))
ntk_rotated = ref.apply_rope(x_ntk, p_ntk, base=ref.ntk_scaled_base(d_ntk, s_ntk))

# %% tags=["nbval-check-output"]
check("apply_rope with ntk_scaled_base vs each pair slowed by s^(2f/(d-2))", ntk_rotated,
      np.concatenate([z_ntk.real, z_ntk.imag], axis=-1), REFERENCE_BUDGET)
fast, slow = [0, d_ntk // 2], [d_ntk // 2 - 1, d_ntk - 1]  # the fastest and the slowest pair
check("fastest pair: as plain RoPE (extrapolation)", ntk_rotated[:, fast],
      ref.apply_rope(x_ntk, p_ntk)[:, fast], REFERENCE_BUDGET)
check("slowest pair: as RoPE at positions p/s (interpolation)", ntk_rotated[:, slow],
      ref.apply_rope(x_ntk, p_ntk / s_ntk)[:, slow], REFERENCE_BUDGET)

# %% [markdown]
# The picture: for each pair $f$ (head dimension 64, training length 512, texts of 4096, $s = 8$), the largest angle
# it turns through. Where the training curve lies above one full turn ($2\pi$), the pair has seen every angle and
# extrapolating it is harmless; below, larger positions mean angles never seen. RoPE at 4096 goes 8 times past the
# training curve for every pair; PI stays on it for every pair (and slows the fast ones for nothing); NTK follows
# RoPE on the fast pairs and PI on the slowest.

# %%
L_train, L_test = 512, 4096
theta_f = 10000.0 ** (-np.arange(0, d_ntk, 2) / d_ntk)                   # (d/2,) plain RoPE
f_index = np.arange(d_ntk // 2)
fig, ax = plt.subplots(figsize=(7.5, 4), constrained_layout=True)
ax.semilogy(f_index, L_train * theta_f, "k-", lw=2,
            label=f"seen in training (positions < {L_train})")
ax.semilogy(f_index, L_test * theta_f, "--", label=f"RoPE at {L_test} (extrapolation)")
ax.semilogy(f_index, L_test * theta_f / s_ntk, ":", lw=2.5, label=f"PI, k = {s_ntk:g}")
ax.semilogy(f_index, L_test * theta_ntk, marker=".", label=f"NTK-aware, s = {s_ntk:g}")
ax.axhline(2 * np.pi, color="grey", lw=0.8)
ax.text(0.5, 2 * np.pi * 1.3, r"one full turn, $2\pi$", fontsize=8, color="grey")
ax.set_xlabel(r"pair $f$ (fast $\to$ slow)")
ax.set_ylabel("largest angle reached (radians)")
ax.set_title("How far each pair of dimensions turns")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## 4. Leaky ReRoPE and ReRoPE
#
# The post's own fix combines extrapolation and interpolation directly: inside a window $w$ keep the distances as
# they are (locality exact), outside it let them grow by $1/k$ per token. Each scheme is a function $f$ of the
# distance $x = i - j \ge 0$ (the causal part; $j > i$ is masked):
#
# | scheme | $\text{rel}_{ij} = f(i - j)$ | largest entry for length $L$ |
# |---|---|---|
# | RoPE | $x$ | $L - 1$: beyond the training length once $L$ is |
# | position interpolation (PI) | $x / k$ | $(L-1)/k$: in range, but neighbours are now $1/k$ apart |
# | Leaky ReRoPE | $x$ if $x < w$, else $w + (x - w)/k$ | $w + (L-1-w)/k$: exact nearby, squeezed far away |
# | ReRoPE | $\min(x, w)$ | $w$, whatever $L$ is (the $k \to \infty$ limit of Leaky ReRoPE) |
#
# As matrices, for $L = 8$, $w = 3$ and $k = 2$ (the post draws them for a general $L$):

# %%
def show_causal(rel):
    # The lower triangle, row by row, as the post draws its matrices (j > i is masked).
    for i, row in enumerate(rel):
        print("  ".join(f"{v:>3g}" for v in row[:i + 1]))

print("Leaky ReRoPE, w = 3, k = 2:")
show_causal(ref.relative_positions(8, "leaky_rerope", window=3, k=2.0))
print("ReRoPE, w = 3:")
show_causal(ref.relative_positions(8, "rerope", window=3))

# %% [markdown]
# As maps of the distance, the names explain themselves: ReRoPE, Leaky ReRoPE and RoPE are to each other what ReLU,
# Leaky ReLU and the identity are (mirrored: flat beyond $w$ instead of below 0). The left panel runs to the post's
# test length 4096 with its training length 512; the right one zooms in on the first 64 distances, where locality
# lives. NTK-aware scaling is no single $f$: each pair gets its own slope, from 1 (fastest) to $1/s$ (slowest), the
# shaded band.

# %%
w_plot, k_leaky, k_pi = 256, 16.0, 8.0
maps = {"RoPE: $x$": lambda x: x, f"PI: $x/k$, $k = {k_pi:g}$": lambda x: x / k_pi,
        f"Leaky ReRoPE: $w = {w_plot}$, $k = {k_leaky:g}$":
            lambda x: ref.rectify(x, w_plot, leaky_k=k_leaky),
        f"ReRoPE: $\\min(x, w)$, $w = {w_plot}$": lambda x: ref.rectify(x, w_plot)}
fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
for ax, x_max in zip(axes, (L_test, 64)):
    x_line = np.linspace(0, x_max, 400)
    ax.fill_between(x_line, x_line / s_ntk, x_line, color="C4", alpha=0.15,
                    label=f"NTK-aware, $s = {s_ntk:g}$: one slope per pair")
    for name, f in maps.items():
        ax.plot(x_line, f(x_line), label=name)
    ax.set_xlabel("distance $x = i - j$")
    ax.set_ylabel(r"relative position used, $f(x)$")
axes[0].axhline(L_train - 1, color="k", ls=":",
                label=f"largest distance in training ({L_train - 1})")
axes[0].set_ylim(0, 1.25 * L_train)
axes[0].set_title(f"up to the test length {L_test}")
axes[1].set_title("near the diagonal: locality (RoPE, Leaky ReRoPE, ReRoPE coincide)", fontsize=10)
axes[1].legend(*axes[0].get_legend_handles_labels(), fontsize=8, loc="upper left")
plt.show()

# %% [markdown]
# **The conditions on $w$ and $k$.** The post: as long as $w$ is below the training length, $k$ can be chosen so that
# no position exceeds the training length, while locality stays exact. For a text of length $L$ and a training
# length $L_\text{train}$ (so distances up to $L_\text{train} - 1$ were seen), the largest Leaky distance
# $w + (L - 1 - w)/k$ stays in range when
#
# $$w < L_\text{train} - 1 \qquad\text{and}\qquad k \ge \frac{L - 1 - w}{L_\text{train} - 1 - w} .$$
#
# ReRoPE ($k \to \infty$) needs only the first, for every $L$: that is the "infinite" of the post's title. A finite
# $k$ has a finite reach, which grows with $k$. For the post's setting:

# %%
def smallest_leaky_k(w, L, L_train):
    # The smallest k that keeps Leaky ReRoPE's largest distance w + (L - 1 - w)/k within L_train -
    # 1.
    return (L - 1 - w) / (L_train - 1 - w)

for w_ in (128, 256):
    print(f"L_train = 512, L = 4096, w = {w_}: k >= {smallest_leaky_k(w_, L_test, L_train):.2f}")
print(f"PI for the same lengths: k >= {(L_test - 1) / (L_train - 1):.2f}")

# %% tags=["nbval-check-output"]
L, w, k_def = 32, 8, 4.0
causal = np.tril(np.ones((L, L), dtype=bool))
x = np.arange(L, dtype=float)
formulas = {"rope": x, "pi": x / k_def, "leaky_rerope": np.where(x < w, x, w + (x - w) / k_def),
            "rerope": np.minimum(x, w)}
distance = np.subtract.outer(np.arange(L), np.arange(L))
for kind, f in formulas.items():
    rel = ref.relative_positions(L, kind, window=w, k=k_def)
    check(f"{kind}: every entry is f(i - j)", rel[causal], f[distance][causal], REFERENCE_BUDGET)
reach = ref.rectify(np.array([L_test - 1.0]), 256, leaky_k=smallest_leaky_k(256, L_test, L_train))[0]
print("Leaky ReRoPE at the smallest k reaches exactly L_train - 1:",
      bool(np.isclose(reach, L_train - 1)))


# %% [markdown]
# ## 5. Why two passes: the post's prefill
#
# A rotation per position can only produce distances linear in $i - j$: that is what section 1 used. $\min(i-j, w)$
# is piecewise linear, so the post computes the score matrix twice, each pass linear, and merges them:
#
# $$a^{(1)}_{ij} = \left(\mathcal{R}^{i} q_i\right)^\top \left(\mathcal{R}^{j} k_j\right) = q_i^\top \mathcal{R}^{\,j-i} k_j
# \qquad \text{(plain RoPE, distance } i - j\text{)}$$
#
# $$a^{(2)}_{ij} = \left(\mathcal{R}^{w} q_i\right)^\top k_j = q_i^\top \mathcal{R}^{-w} k_j \quad \text{(ReRoPE)}, \qquad
# a^{(2)}_{ij} = \left(\mathcal{R}^{(i-w)/k + w} q_i\right)^\top \left(\mathcal{R}^{j/k} k_j\right) =
# q_i^\top \mathcal{R}^{(j-i+w)/k - w} k_j \quad \text{(Leaky)}$$
#
# $$a_{ij} = a^{(1)}_{ij} \text{ if } i - j < w, \qquad a_{ij} = a^{(2)}_{ij} \text{ if } i - j \ge w .$$
#
# In the second pass every query is rotated by the same $w$ and the keys not at all, so the distance is $w$ for
# every pair; for Leaky ReRoPE the exponent $(j - i + w)/k - w = -\left(w + (i - j - w)/k\right)$ is minus the leaky
# distance. Both passes are full $T \times T$ matrices: twice the work of attention, and no stock flash-attention
# kernel computes this merge (the post says as much).
#
# **A sign slip in the post.** For ReRoPE the post writes $a^{(2)}_{ij} = (\mathcal{R}^w q_i)^\top k_j =
# q_i^\top \mathcal{R}^{w} k_j$. Transposing a rotation reverses it, so the right side must be
# $q_i^\top \mathcal{R}^{-w} k_j$, as in its own $a^{(1)}$ identity and its decode formula below. The left side (what is
# computed) is right:

# %%
lhs = rotate(q, np.full(T, float(w))) @ k.T  # (R^w q_i) . k_j: what the post computes
rhs_as_printed = q @ rotate(k, np.full(T, float(w))).T                 # q_i . R^{w} k_j
rhs_correct = q @ rotate(k, np.full(T, -float(w))).T                   # q_i . R^{-w} k_j
print(f"(R^w q) . k  vs  q . R^w k: rel. difference {rel_rms(rhs_as_printed, lhs):.2f}")
assert rel_rms(rhs_as_printed, lhs) > 0.1

# %% tags=["nbval-check-output"]
check("(R^w q_i) . k_j vs q_i . R^{-w} k_j", lhs, rhs_correct, REFERENCE_BUDGET)
print("(R^w q_i) . k_j equals q_i . R^{w} k_j as printed:", bool(np.allclose(lhs, rhs_as_printed)))


# %%
def rerope_two_pass(q, k, v, window, leaky_k=None):
    # The post's prefill: two score matrices, merged at i - j = w, then the causal softmax.
    T, d = q.shape
    p = np.arange(T, dtype=float)
    a1 = rotate(q, p) @ rotate(k, p).T  # (T, T) distance i - j
    if leaky_k is None:
        a2 = rotate(q, np.full(T, float(window))) @ k.T                           # distance w
    else:
        # distance w + (i-j-w)/k
        a2 = rotate(q, (p - window) / leaky_k + window) @ rotate(k, p / leaky_k).T
    near = np.subtract.outer(p, p) < window
    return ref_attention.attention_from_scores(np.where(near, a1, a2) / np.sqrt(d), v)

window = 4
prefill = rerope_two_pass(q, k, v, window)
prefill_leaky = rerope_two_pass(q, k, v, window, leaky_k=k_slope)

# %% tags=["nbval-check-output"]
rel_rerope = ref.relative_positions(T, "rerope", window=window)
rel_leaky = ref.relative_positions(T, "leaky_rerope", window=window, k=k_slope)
for what, actual, expected in (
    ("ReRoPE two passes vs the definition",
     prefill, ref.attention_from_relative_positions(q, k, v, rel_rerope)),
    ("ReRoPE two passes vs reference.rerope_attention", prefill,
     ref.rerope_attention(q, k, v, window)),
    ("Leaky ReRoPE two passes vs the definition", prefill_leaky,
     ref.attention_from_relative_positions(q, k, v, rel_leaky)),
    ("Leaky ReRoPE two passes vs reference.rerope_attention", prefill_leaky,
     ref.rerope_attention(q, k, v, window, leaky_k=k_slope)),
):
    check(what, actual, expected, REFERENCE_BUDGET)


# %% [markdown]
# ## 6. One pass for decoding
#
# Since the distance is not linear, a key cannot be stored rotated once and for all: the cache holds keys *before*
# RoPE. The good news, in the post's words, is that while decoding the query is a single row ($i = T - 1$), so each
# cached key can be rotated by exactly the amount its distance calls for, and one attention row suffices:
#
# $$a_{ij} = q_i^\top\left(\mathcal{R}^{\max(j - i,\, -w)} k_j\right) \ \text{(ReRoPE)}, \qquad
# a_{ij} = q_i^\top\left(\mathcal{R}^{\max(j - i,\, (j - i + w)/k - w)} k_j\right) \ \text{(Leaky)} .$$
#
# Both exponents are $-\text{rel}(i - j)$, with $x = i - j$: for ReRoPE, $\max(-x, -w) = -\min(x, w)$. For Leaky
# ReRoPE the two candidates differ by $-x - \left((w - x)/k - w\right) = (w - x)(1 - 1/k)$, which is positive exactly
# when $x < w$ *provided $k > 1$*: the max then picks $-x$ inside the window and the leaky branch outside. The post
# leaves $k > 1$ implicit (a slope $1/k$ below 1 is the point of the method); with $k < 1$ the sign flips and the
# max picks the wrong branch on both sides of the window (exercise 2). The reference refuses `leaky_k <= 1`.
# Decoding token by token then reproduces the prefill row by row.

# %%
def decode(q_i, k_cache, v_cache, window, leaky_k=None):
    # One query at position i = len(k_cache) - 1 against un-rotated cached keys, one softmax row.
    i = len(k_cache) - 1
    j_minus_i = np.arange(len(k_cache)) - i
    if leaky_k is None:
        exponent = np.maximum(j_minus_i, -window)
    else:
        exponent = np.maximum(j_minus_i, (j_minus_i + window) / leaky_k - window)
    s = np.array([q_i @ rotate(k_j, e) for k_j, e in zip(k_cache, exponent)]) / np.sqrt(len(q_i))
    p = np.exp(s - s.max())
    return p @ v_cache / p.sum()

decoded = np.stack([decode(q[i], k[: i + 1], v[: i + 1], window) for i in range(T)])  # (T, d)
decoded_leaky = np.stack([decode(q[i], k[: i + 1], v[: i + 1], window, k_slope) for i in range(T)])

# %% tags=["nbval-check-output"]
for what, actual, expected in (
    ("ReRoPE: decoding token by token vs the two-pass prefill", decoded, prefill),
    ("Leaky ReRoPE: decoding token by token vs the two-pass prefill", decoded_leaky, prefill_leaky),
    ("ReRoPE: last step vs reference.rerope_decode", decoded[-1:],
     ref.rerope_decode(q[-1:], k, v, window)),
):
    check(what, actual, expected, REFERENCE_BUDGET)


# %% [markdown]
# ## 7. Log-n scaling
#
# The post's best results also multiply every query by $\max(1, \log_{L} n)$, $n$ the 1-based position and $L$ the
# training length:
#
# $$q_n \;\leftarrow\; \max\!\left(1, \frac{\ln n}{\ln L}\right) q_n .$$
#
# Nothing changes up to the training length; beyond it the scores grow like $\log n$. A query that sees $n$ keys
# spreads its softmax over more candidates as $n$ grows, so its entropy rises; a larger scale sharpens the softmax
# and counters that rise (for the random inputs below, the entropy stays near its value at the training length).
#
# The post's tables have two variants. $\log n^\dagger$: the model was trained without the factor (like LLaMA) and
# each $q_n$ is multiplied by $\max(1, \log_{\text{maxlen}} n)$ at test time only; this is the formula the post
# gives, and the one used here. $\log n$: the factor was already used in pretraining; for that variant the post gives
# no formula. Below: the factor, and the entropy of attention rows of random queries and keys with and without it
# (training length 64 here, to keep the sums small).

# %%
L_short = 64                                            # a short training length
T_long, d_long = 1024, 16
k_long = 1.5 * rng.standard_normal((T_long, d_long))
factor = ref.log_n_scale(np.arange(T_long), L_short)  # (T,) by 0-based position
rows = np.unique(np.geomspace(1, T_long, 40).astype(int)) - 1

queries = 1.5 * rng.standard_normal((256, d_long))  # many queries per position: an average

def row_entropy(i, scale_q):
    # Mean entropy of the softmax rows of the queries at 0-based position i (they see keys 0..i).
    s = (scale_q * queries) @ k_long[: i + 1].T / np.sqrt(d_long)             # (256, i + 1)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return -(p * np.log(p)).sum(axis=1).mean()

fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), constrained_layout=True)
axes[0].semilogx(np.arange(1, T_long + 1), factor)
axes[0].axvline(L_short, color="gray", ls=":", label=f"training length L = {L_short}")
axes[0].set_xlabel("position n (1-based)")
axes[0].set_ylabel("max(1, ln n / ln L)")
axes[0].set_title("Log-n scaling factor of the query")
axes[0].legend()
axes[1].semilogx(rows + 1, [row_entropy(i, 1.0) for i in rows], marker=".",
                 label="without log-n scaling")
axes[1].semilogx(rows + 1, [row_entropy(i, factor[i]) for i in rows], marker=".",
                 label="with log-n scaling")
axes[1].semilogx(rows + 1, np.log(rows + 1), "--", color="gray", label="ln n (uniform weights)")
axes[1].axvline(L_short, color="gray", ls=":")
axes[1].set_xlabel("position n (1-based): number of keys seen")
axes[1].set_ylabel("mean entropy of an attention row (nats)")
axes[1].set_title("Random q, k: row entropy against position")
axes[1].legend()
plt.show()

# %% tags=["nbval-check-output"]
# L = 6: the factor acts at T = 12
own_factor = np.maximum(1.0, np.log(np.arange(1, T + 1)) / np.log(6))
check("log-n: reference.rerope_attention(train_length) vs two passes on scaled queries",
      ref.rerope_attention(q, k, v, window, train_length=6),
      rerope_two_pass(own_factor[:, None] * q, k, v, window), REFERENCE_BUDGET)
print("the factor is 1 up to the training length:", bool((factor[:L_short] == 1).all()))


# %% [markdown]
# ## 8. What the post measured
#
# Everything above is *how* ReRoPE computes; the post's experiments say *whether* it works. Its main model is a
# 100M-parameter GAU language model trained on texts of 512 tokens, in the setting of the author's previous post
# (https://spaces.ac.cn/archives/9706), and tested, without any fine-tuning, at 512 and at 4096 tokens. The
# numbers are the post's percentages (higher is better; the metric and the two 4096 test sets, "repeated" and
# "non-repeated", are defined in that earlier post, not in this one). NTK-RoPE's "old", "fixed" and "mixed" are
# variants defined there too; $\log n^\dagger$ and $\log n$ are the two log-n variants of section 7.
#
# **Table 1: main results** (the post's first table)
#
# | method | 512 (training) | 4096 repeated | 4096 non-repeated |
# |---|---|---|---|
# | Baseline (RoPE, direct extrapolation) | 49.41% | 24.17% | 23.16% |
# | Baseline-$\log n$ | 49.40% | 24.60% | 24.02% |
# | PI-RoPE | 49.41% | 15.04% | 13.54% |
# | PI-RoPE-$\log n$ | 49.40% | 14.99% | 16.51% |
# | NTK-RoPE-old | 49.41% | 51.28% | 39.27% |
# | NTK-RoPE-$\log n$-old | 49.40% | 61.71% | 43.75% |
# | NTK-RoPE-fixed | 49.41% | 51.86% | 39.61% |
# | NTK-RoPE-$\log n^\dagger$-fixed | 49.41% | 55.94% | 41.11% |
# | NTK-RoPE-$\log n$-fixed | 49.40% | 62.85% | 44.14% |
# | NTK-RoPE-mixed | 49.41% | 53.09% | 40.12% |
# | NTK-RoPE-$\log n^\dagger$-mixed | 49.41% | 59.11% | 42.38% |
# | NTK-RoPE-$\log n$-mixed | 49.40% | 68.91% | 45.41% |
# | ReRoPE-w256 | 49.41% | 77.90% | 48.48% |
# | ReRoPE-w256-$\log n^\dagger$ | 49.41% | 82.40% | 48.85% |
# | ReRoPE-w256-$\log n$ | 49.40% | **85.12%** | **49.07%** |
# | HFWA (trained from scratch for length) | 48.70% | 80.84% | 48.15% |
#
# Reading notes:
#
# - **The 512 column measures the trained model, not the scheme.** Every row reads 49.41% (49.40% for the model
#   trained with $\log n$), to the hundredth, and so does ReRoPE with $w = 64$ in Table 2, which would clamp most of
#   the pairs of a 512-token text. A scheme that changed the scores could not leave every row equal to the
#   hundredth: the column depends only on which model was trained, so it evaluates each model at its training
#   length as trained, without the scheme, and says nothing about what a scheme costs there. That cost is small
#   but not zero: notebook 10's toy run, which does apply each scheme at 1x, gives ReRoPE-w32 60.28% against RoPE's
#   60.43%, and the post's Table 4 (below) gives a loss of 1.4996 for ReRoPE against 1.4967 at the training length.
# - **Beyond it, the ranking follows the locality argument of sections 2 and 3.** Direct extrapolation halves the
#   score (24%); PI without fine-tuning does worse still (15%), as the post predicts for a method that disturbs
#   locality; NTK-aware scaling, which keeps locality and extrapolates little, roughly doubles the baseline; ReRoPE,
#   which keeps locality exactly and never extrapolates, is best: with $\log n$, on the non-repeated texts, within
#   half a point of its score at the training length (49.07% against 49.40%).
# - **Log-n scaling helps nearly everywhere**, with two exceptions: PI's repeated column, and, barely, ReRoPE-w512
#   with $\log n^\dagger$ in Table 2 below (7.08% against 7.09% repeated, 8.25% = 8.25% non-repeated). It helps
#   most when it was already used in training ($\log n$ above $\log n^\dagger$ in every group that has both).
# - **ReRoPE beats HFWA**, a model the author designed and trained from scratch for length generalization, without
#   any training of its own.
#
# **Table 2: the window** (ReRoPE at several $w$, the post's second table)
#
# | $w$ | variant | 512 (training) | 4096 repeated | 4096 non-repeated |
# |---|---|---|---|---|
# | 64 | plain / $\log n^\dagger$ / $\log n$ | 49.41 / 49.41 / 49.40% | 69.39 / 78.58 / 84.38% | 45.19 / 47.42 / 48.14% |
# | 128 | plain / $\log n^\dagger$ / $\log n$ | 49.41 / 49.41 / 49.40% | 76.11 / 82.28 / **85.47**% | 47.82 / 48.78 / 48.87% |
# | 256 | plain / $\log n^\dagger$ / $\log n$ | 49.41 / 49.41 / 49.40% | 77.90 / 82.40 / 85.12% | 48.48 / 48.85 / **49.07**% |
# | 384 | plain / $\log n^\dagger$ / $\log n$ | 49.41 / 49.41 / 49.40% | 70.72 / 76.42 / 83.24% | 48.15 / 48.31 / 48.62% |
# | 512 | plain / $\log n^\dagger$ / $\log n$ | 49.41 / 49.41 / 49.40% | 7.09 / 7.08 / 15.84% | 8.25 / 8.25 / 10.83% |
#
# - **Robust in $w$, best at a quarter to a half of the training length** (128 to 256 of 512), as the post says.
# - **$w$ equal to the training length fails**, far below even the baseline (7 to 16% against 24%). The post reports
#   it without comment; a reading: with $w = 512$ every key more than 512 tokens back sits at distance exactly 512,
#   which a model trained on 512 tokens (distances 0 to 511) has never seen, so ReRoPE turns into extrapolation again,
#   for thousands of keys at once. Hence the condition $w < L_\text{train}$ of section 4, and the margin that the
#   best values leave.
#
# **Table 3: Leaky ReRoPE against ReRoPE** (all with $\log n$, the post's third table)
#
# | method | 512 (training) | 4096 repeated | 4096 non-repeated |
# |---|---|---|---|
# | ReRoPE-w128 | 49.40% | **85.47%** | 48.87% |
# | Leaky ReRoPE-w128-k64 | 49.40% | 85.29% | 48.96% |
# | Leaky ReRoPE-w128-k32 | 49.40% | 85.31% | 49.03% |
# | Leaky ReRoPE-w128-k16 | 49.40% | 85.15% | **49.10%** |
# | Leaky ReRoPE-w128-k8 | 49.40% | 80.00% | 48.11% |
# | ReRoPE-w256 | 49.40% | 85.12% | 49.07% |
# | Leaky ReRoPE-w256-k64 | 49.40% | 84.60% | 49.03% |
# | Leaky ReRoPE-w256-k32 | 49.40% | 84.30% | 48.97% |
# | Leaky ReRoPE-w256-k16 | 49.40% | 83.59% | 48.87% |
# | Leaky ReRoPE-w256-k8 | 49.40% | 69.80% | 45.72% |
#
# - **A tuned Leaky ReRoPE can edge past ReRoPE, barely** (49.10% against 48.87% at $w = 128$). The post's verdict:
#   since a finite $k$ has a finite reach (section 4) and the final length of a generation is not known in advance,
#   the safe choice is ReRoPE.
# - **$k = 8$ is where it breaks, and section 4's condition says why**: at 4096 tokens, $k = 8$ pushes the largest
#   distance past what training saw, for both windows; every other row stays within it. Computed:

# %% tags=["nbval-check-output"]
for w_ in (128, 256):
    for k_ in (64, 32, 16, 8):
        reach = ref.rectify(np.array([L_test - 1.0]), w_, leaky_k=float(k_))[0]
        print(f"Leaky ReRoPE w = {w_}, k = {k_:2d}: largest distance at 4096 = {reach:6.1f}, "
              f"within training (<= {L_train - 1}): {reach <= L_train - 1}")

# %% [markdown]
# **Table 4: a real LLM** (llama2-13b, loss, lower is better; the post's last table)
#
# | method | 4096 (training) | 8192 | 16384 |
# |---|---|---|---|
# | RoPE | 1.4967 | 8.8615 | - |
# | NTK-RoPE | 1.6081 | 1.5417 | 1.5163 |
# | ReRoPE | 1.4996 | 1.4267 | 1.4001 |
#
# - **Plain RoPE collapses** one step past its training length (loss 8.86 at 8192).
# - **NTK-RoPE pays at the training length** (1.61 against 1.50). A reading (the post does not say): applied at every
#   length, its rescaled base changes the angles of the slow pairs even on texts the model was trained for.
# - **ReRoPE keeps the training loss at 4096** (1.4996 against 1.4967) **and improves with length** (1.43, then
#   1.40): "longer context, lower loss", as more context should help to predict the next token.
#
# The post adds a chat test of an OpenBuddy LLaMA2-13b fine-tune up to 20k tokens (an impression, no numbers) and
# its code at https://github.com/bojone/rerope. A toy-scale version of Table 1 and Table 2, trained and tested on
# this machine, is [notebook 10](10_extrapolation.ipynb).


# %% [markdown]
# ## 9. Why a fused kernel costs one attention plus a band
#
# The post's prefill computes two full score matrices. But each pair $(i, j)$ needs only one of them, and which
# one depends on $i - j$ alone: pairs with $i - j < w$ (a band of width $w$ along the diagonal) take the RoPE score,
# all others the clamped one. A fused kernel, flash-attention style (the Triton kernel of the appendix), gives each program a tile of $B_M$ query rows
# and walks the key tiles of $B_N$ keys, classifying each tile from its corners:
#
# - *far only*: every pair has $i - j \ge w$: compute $a^{(2)}$ only;
# - *near only*: every pair has $i - j < w$: compute $a^{(1)}$ only;
# - *straddling*: the edge $i - j = w$ crosses the tile: compute both and pick per element.
#
# Only straddling tiles cost double, and the edge $i - j = w$ is a line parallel to the diagonal: over the $B_M$
# rows of a query tile it crosses $B_M/B_N$ key tiles (one more when it is not aligned with the tiles), whatever $T$
# and $w$ are. So the work is one causal attention plus
# $O(T)$ extra tiles (a band along the edge), against twice the attention for the post's two passes. The count
# below uses the kernel's tiles for $d \le 64$ ($B_M = 64$, $B_N = 32$) and $w = 256$ (the post's best window).

# %%
BM, BN = 64, 32  # the kernel's tiles for head size <= 64 (kernels/rerope/fused.py)

def score_tiles(T, window):
    # (tiles of one causal attention, tiles the fused kernel computes, of which straddling) for a
    # length T.
    attention = fused = straddling = 0
    for c in range(0, T, BM):                                       # query rows c .. c + BM - 1
        last_row = min(c + BM, T) - 1
        for n in range(0, last_row + 1, BN):  # key tiles with at least one j <= i
            last_key = min(n + BN, T) - 1
            # smallest and largest i - j in the tile
            nearest, farthest = max(c - last_key, 0), last_row - n
            both = nearest < window <= farthest
            attention += 1
            fused += 2 if both else 1
            straddling += both
    return attention, fused, straddling

lengths = 2 ** np.arange(9, 16)                                     # 512 .. 32768
counts = np.array([score_tiles(int(t), 256) for t in lengths])
for t, (att, fused, strad) in zip(lengths[::2], counts[::2]):
    print(f"T = {t:6d}: causal attention {att:7d} tiles, fused ReRoPE {fused:7d} "
          f"(+{strad} straddling), "
          f"two passes {2 * att:7d}")

fig, ax = plt.subplots(figsize=(7, 4))
ax.semilogx(lengths, counts[:, 1] / counts[:, 0], marker="o",
            label="fused kernel (one attention + a band)")
ax.semilogx(lengths, np.full(len(lengths), 2.0), "--", label="the post's two passes")
ax.axhline(1.0, color="gray", ls=":", label="one causal attention")
ax.set_xlabel("sequence length T")
ax.set_ylabel("score tiles computed / tiles of one causal attention")
ax.set_title("ReRoPE prefill cost (w = 256, tiles 64 x 32)")
ax.set_ylim(0.9, 2.1)
ax.legend()
plt.show()

# %% [markdown]
# The classification itself, for $T = 1024$ and $w = 256$: each cell of the picture is one $64 \times 32$ tile of
# the causal score matrix (query rows down, keys across). The tiles right of the diagonal hold only masked pairs and
# are never visited; the straddling tiles, the only ones computed twice, form a band along the edge $i - j = w$: two
# key tiles per query tile here ($B_M / B_N$, since $w$ is a multiple of the tiles; one more when it is not).

# %%
from matplotlib.colors import ListedColormap

def tile_map(T, window):
    # One entry per (query tile, key tile): 0 skipped (masked), 1 far only, 2 near only, 3 straddling.
    kinds = np.zeros((T // BM, T // BN), dtype=int)
    for c in range(0, T, BM):
        for n in range(0, c + BM, BN):
            nearest, farthest = max(c - (n + BN - 1), 0), c + BM - 1 - n
            kinds[c // BM, n // BN] = 3 if nearest < window <= farthest else 2 if farthest < window else 1
    return kinds

fig, ax = plt.subplots(figsize=(7, 4.2))
ax.imshow(tile_map(1024, 256), cmap=ListedColormap(["white", "C0", "C1", "C3"]), vmin=0, vmax=3,
          extent=(0, 1024, 1024, 0), interpolation="nearest")
edge, = ax.plot([0, 1024 - 256], [256, 1024], "k--", lw=1)
ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in ("C0", "C1", "C3")] + [edge],
          labels=["far only: the clamped score", "near only: the RoPE score", "straddling: both", "i - j = w"],
          loc="upper right", fontsize=8)
ax.set(xlabel="key position j (tiles of 32)", ylabel="query position i (tiles of 64)",
       title="Fused ReRoPE's tiles, T = 1024, w = 256")
plt.show()

# %%
straddling_per_query_tile = counts[:, 2] / np.ceil(lengths / BM)
print("straddling key tiles per query tile, T = 512 .. 32768:",
      ", ".join(f"{x:.2f}" for x in straddling_per_query_tile))
assert (straddling_per_query_tile <= BM / BN + 1).all()


# %% [markdown]
# ## Summary
#
# - RoPE's relative positions are linear in $i - j$. Position interpolation scales them by $1/k$ (the PI matrix is
#   $(i - j)/k$ throughout, erratum 9) and breaks locality; NTK-aware scaling rescales the base,
#   $\text{base}\cdot s^{d/(d-2)}$, so that fast pairs extrapolate and slow pairs interpolate; Leaky ReRoPE and ReRoPE
#   keep distances below $w$ exact and squeeze ($1/k$) or clamp the rest: ReLU-like maps of the distance. Leaky
#   ReRoPE stays within the training range for $w < L_\text{train} - 1$ and $k \ge (L - 1 - w)/(L_\text{train} - 1 -
#   w)$; ReRoPE for every length.
# - The post's two passes (with $\mathcal{R}^{-w}$ on the right side of its ReRoPE identity), the one-pass decode
#   (which needs $k > 1$ for Leaky ReRoPE) and log-n scaling all match the per-pair definition to float64 rounding,
#   and decoding token by token reproduces the prefill.
# - The post's tables: without fine-tuning ReRoPE beats PI, NTK-aware scaling and even HFWA trained for length; the
#   window is best at a quarter to a half of the training length and fails at the training length itself; Leaky
#   ReRoPE's $k = 8$ rows fail exactly where the $k$ condition does; on llama2-13b the loss falls with length.
# - Per tile, only the edge $i - j = w$ needs both scores: a fused kernel costs one causal attention plus a band of
#   straddling tiles, which tends to 1x attention as $T$ grows, against 2x for the post's two passes. The appendix
#   checks such a kernel (torch path and Triton) against the definition.
#
# Next: notebook 08 takes the kernels apart.
#
# ## Exercises
#
# Each coding exercise has a stub to fill in (it raises `NotImplementedError` until you do), a check cell below it
# that says "not attempted yet", "correct" or what is off, and the solution in a collapsed cell starting
# `# Solution` (click the three dots to open it). Questions have their worked answer in a collapsed cell too.
#
# **1. The reach of a finite $k$.** For Leaky ReRoPE with window $w$, slope $1/k$ and a training length
# $L_\text{train}$, the longest text whose distances all stay within the training range follows from section 4's
# condition, solved for $L$. Write it as `longest_text(w, k, L_train)` (an integer). The check finds the answer by
# brute force with `ref.rectify` (the length $n$ that stays in range while $n + 1$ does not) for the post's
# $w = 128$, $k = 16$, $L_\text{train} = 512$ and two other settings.

# %%
# Exercise 1: the reach of Leaky ReRoPE
def longest_text(w, k, L_train):
    """The largest length L whose every distance 0 .. L - 1 Leaky ReRoPE maps to at most L_train - 1."""
    raise NotImplementedError("Exercise 1: your code here")


# %% tags=["nbval-check-output"]
from seqmix.kernels.testing import exercise


def checks_1():
    for w_, k_, train in ((128, 16.0, 512), (64, 4.0, 256), (200, 7.0, 512)):
        n = longest_text(w_, k_, train)
        in_range = [ref.rectify(np.array([m - 1.0]), w_, leaky_k=k_)[0] <= train - 1 for m in (n, n + 1)]
        assert in_range == [True, False], f"w = {w_}, k = {k_:g}, L_train = {train}: {n} is not the longest"
        print(f"w = {w_}, k = {k_:g}, L_train = {train}: brute force agrees")


exercise("Exercise 1", checks_1)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# w + (L - 1 - w) / k <= L_train - 1  <=>  L <= 1 + w + k (L_train - 1 - w); for the post's setting, 6257.
def longest_text(w, k, L_train):
    return int(np.floor(1 + w + k * (L_train - 1 - w)))


print("longest text at w = 128, k = 16, L_train = 512:", longest_text(128, 16.0, 512))
exercise("Exercise 1", checks_1)

# %% [markdown]
# **2. Classify a tile.** Section 9's fused kernel decides, for a tile of $B_M$ query rows starting at row $c$ and
# $B_N$ keys starting at key $n$, which scores it needs. Write `tile_kind(c, n, window)` returning `"far"` (every
# pair has $i - j \ge w$), `"near"` (every causal pair has $i - j < w$) or `"straddling"`, from the tile's corners
# only (no loop over its pairs). The check classifies every visited tile of $T = 512$ for several windows by brute
# force, pair by pair. (Hint: the smallest $i - j$ is at the top-right corner, clipped at 0 by the causal mask; the
# largest at the bottom-left.)

# %%
# Exercise 2: classify a tile
def tile_kind(c, n, window):
    """'far', 'near' or 'straddling' for query rows c .. c + BM - 1 and keys n .. n + BN - 1."""
    raise NotImplementedError("Exercise 2: your code here")


# %% tags=["nbval-check-output"]
def checks_2():
    T_tiles = 512
    for window_ in (1, 31, 64, 100, 256):
        for c in range(0, T_tiles, BM):
            for n in range(0, c + BM, BN):
                i, j = np.meshgrid(np.arange(c, c + BM), np.arange(n, n + BN), indexing="ij")
                distances = (i - j)[i >= j]                         # the tile's causal pairs
                truth = ("far" if (distances >= window_).all() else "near" if (distances < window_).all()
                         else "straddling")
                got = tile_kind(c, n, window_)
                assert got == truth, f"w = {window_}, rows from {c}, keys from {n}: {got!r}, brute force {truth!r}"
    print("every tile of T = 512 for w = 1, 31, 64, 100, 256: as brute force")


exercise("Exercise 2", checks_2)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# Only the extremes of i - j matter: the edge i - j = w crosses the tile exactly when they lie on both sides of it.
def tile_kind(c, n, window):
    nearest, farthest = max(c - (n + BN - 1), 0), c + BM - 1 - n
    return "far" if nearest >= window else "near" if farthest < window else "straddling"


exercise("Exercise 2", checks_2)

# %% [markdown]
# **3. Why the decode needs $k > 1$.** Take $k = 0.5$ in section 6's `decode` and compare its last row with the
# definition's for the same $f$ (`ref.rectify` accepts any $k$). Which branch does the max pick, inside and outside
# the window?

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# With k < 1, (w - x)(1 - 1/k) changes sign: the max picks the leaky branch inside the window and -x outside.
k_bad, T_ex = 0.5, len(q)
distances = np.subtract.outer(np.arange(T_ex), np.arange(T_ex)).astype(float)   # i - j
rel_bad = ref.rectify(distances, window, leaky_k=k_bad)
wanted = ref.attention_from_relative_positions(q, k, v, rel_bad)[-1]
decoded_bad = decode(q[-1], k, v, window, leaky_k=k_bad)
print(f"k = 0.5: decode vs the definition, rel. difference {rel_rms(decoded_bad, wanted):.2f}")
x_ex = np.arange(8.0)
picked = np.maximum(-x_ex, (window - x_ex) / k_bad - window)
print("exponent the max picks for x = 0..7:", picked.tolist())
print("minus the map f(x) it should be:    ", (0.0 - ref.rectify(x_ex, window, leaky_k=k_bad)).tolist())

# %% [markdown]
# **4. Which pairs NTK really changes.** For $d = 64$, training length 512 and $s = 8$: which pairs completed at
# least one full turn during training ($512\,\theta_f \ge 2\pi$)? By how much does NTK-aware scaling slow the
# first pair that did not?

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# Pairs with 512 theta_f >= 2 pi have seen every angle; NTK slows pair f by s^(2f / (d - 2)).
turned = L_train * theta_f >= 2 * np.pi
first_slow = int(np.argmin(turned))
print("pairs that completed a full turn in training: 0 ..", first_slow - 1)
slowdown = s_ntk ** (2 * first_slow / (d_ntk - 2))
print(f"pair {first_slow} is slowed by {slowdown:.2f} (the slowest by {s_ntk:g})")

# %% [markdown]
# ## Appendix: the production path against the reference
#
# The rest of this notebook is not about the math: it checks that the code people run gives the definition's
# numbers. nbval runs and checks it like the cells above.
#
# [`kernels.rerope.rerope_attention`](../kernels/rerope/__init__.py) computes the same attention in $O(T)$ memory, without
# either $T \times T$ matrix: backend `"torch"` assembles it from exact flash-attention pieces (the far part, the
# diagonal blocks, the previous blocks) merged by their log-sum-exp; backend `"triton"` is one fused kernel (here
# under the Triton interpreter on the CPU). Both take `(B, H, T, d)` tensors. They are checked against the float64
# *definition* (`attention_from_relative_positions`, the per-pair rotation), not against the two-pass form they
# replace. $T = 160$ with $w = 40$ makes the Triton kernel meet all three kinds of key tiles of section 9 (far only,
# near only, straddling the window's edge). Decode has a third backend, `"triton_merged"` (what `backend=None`
# runs on a GPU): one launch in which programs take slices of the cache and the last one of each head merges them by
# their log-sum-exp.

# %%
from seqmix.kernels.rerope import rerope_attention as rerope_kernel
from seqmix.kernels.rerope import rerope_decode as rerope_decode_kernel


B, H, T, d = 1, 1, 160, 16
window, leaky_k, train_length = 40, 4.0, 64
q64, k64, v64 = (rng.standard_normal((B, H, T, d)) for _ in range(3))
BACKENDS = ("torch", "triton")

def definition(q, k, v, leaky_k=None, train_length=None):
    # The per-pair definition, with the log-n factor applied to the queries first.
    if train_length is not None:
        q = q * ref.log_n_scale(np.arange(q.shape[-2]), train_length)[:, None]
    kind = "rerope" if leaky_k is None else "leaky_rerope"
    rel = ref.relative_positions(q.shape[-2], kind, window=window, k=leaky_k)
    return ref.attention_from_relative_positions(q, k, v, rel)

def run(backend, q, k, v, dtype=torch.float32, **options):
    q, k, v = (torch.tensor(x, dtype=dtype) for x in (q, k, v))
    return rerope_kernel(q, k, v, window, backend=backend, **options)

def run_decode(backend, q, k, v, **options):
    q_last, k_cache, v_cache = (torch.tensor(x, dtype=torch.float32) for x in (q[:, :, -1:], k, v))
    return rerope_decode_kernel(q_last, k_cache, v_cache, window, backend=backend, **options)

def fp16_rounded(x):
    return x.astype(np.float16).astype(np.float64)

expected = definition(q64, k64, v64)
expected_leaky_logn = definition(q64, k64, v64, leaky_k, train_length)

# %% tags=["nbval-check-output"]
q16, k16, v16 = (fp16_rounded(x) for x in (q64, k64, v64))
for backend in BACKENDS:
    leaky_logn = dict(leaky_k=leaky_k, train_length=train_length)
    check(f"{backend} fp32 ReRoPE", run(backend, q64, k64, v64), expected, FP32_BUDGET)
    check(f"{backend} fp32 Leaky ReRoPE + log-n", run(backend, q64, k64, v64, **leaky_logn),
          expected_leaky_logn, FP32_BUDGET)
    check(f"{backend} fp32 decode (ReRoPE)", run_decode(backend, q64, k64, v64),
          expected[:, :, -1:], FP32_BUDGET)
    decoded_leaky_logn = run_decode(backend, q64, k64, v64, **leaky_logn)
    check(f"{backend} fp32 decode (Leaky + log-n)", decoded_leaky_logn,
          expected_leaky_logn[:, :, -1:], FP32_BUDGET)
    check(f"{backend} fp16 ReRoPE", run(backend, q16, k16, v16, dtype=torch.float16),
          definition(q16, k16, v16), FP16_BUDGET)
check("triton_merged fp32 decode (ReRoPE)", run_decode("triton_merged", q64, k64, v64),
      expected[:, :, -1:], FP32_BUDGET)
check("triton_merged fp32 decode (Leaky + log-n)", run_decode("triton_merged", q64, k64, v64, **leaky_logn),
      expected_leaky_logn[:, :, -1:], FP32_BUDGET)


# %% [markdown]
# **Gradients.** The float64 truth for the gradients is autograd through the definition written in torch: every key
# rotated by $-\text{rel}_{ij}$ for every query, a $(T, T, d)$ tensor, then the causal softmax (its forward is first
# checked against the reference). Both backends' fp32 gradients of $\sum O \odot G$ (Leaky ReRoPE with log-n
# scaling, the path with the most pieces) must match it.

# %%
def definition_torch(q, k, v):
    # Leaky ReRoPE + log-n by the definition, in torch: score_ij = (sigma_i q_i) . R^{-rel_ij} k_j
    # / sqrt(d).
    T, d = q.shape[-2:]
    sigma = torch.tensor(ref.log_n_scale(np.arange(T), train_length))[:, None]
    rel = torch.tensor(ref.relative_positions(T, "leaky_rerope", window=window, k=leaky_k))
    angle = -rel[..., None] * torch.tensor(10000.0 ** (-np.arange(0, d, 2) / d))       # (T, T, d/2)
    k1, k2 = k[..., None, :, : d // 2], k[..., None, :, d // 2:]  # (..., 1, T, d/2)
    cos, sin = angle.cos(), angle.sin()
    k_rot = torch.cat([k1 * cos - k2 * sin, k2 * cos + k1 * sin], dim=-1)
    s = torch.einsum("...id,...ijd->...ij", sigma * q, k_rot) / d ** 0.5
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v

G = rng.standard_normal((B, H, T, d))

def gradients(fn, dtype):
    leaves = [torch.tensor(x, dtype=dtype, requires_grad=True) for x in (q64, k64, v64)]
    fn(*leaves).backward(torch.tensor(G, dtype=dtype))
    return [x.grad for x in leaves]

expected_grads = gradients(definition_torch, torch.float64)
def kernel_output(backend):
    return lambda q, k, v: rerope_kernel(q, k, v, window, leaky_k=leaky_k,
                                         train_length=train_length, backend=backend)

backend_grads = {b: gradients(kernel_output(b), torch.float32) for b in BACKENDS}

# %% tags=["nbval-check-output"]
definition64 = definition_torch(*map(torch.tensor, (q64, k64, v64)))
check("definition in torch float64 vs reference", definition64, expected_leaky_logn,
      REFERENCE_BUDGET)
for backend in BACKENDS:
    for name, got, want in zip(("dq", "dk", "dv"), backend_grads[backend], expected_grads):
        check(f"{backend} fp32 {name}", got, want, FP32_BUDGET)

# %%
# The errors themselves (this cell is not compared: the numbers depend on the machine).
for backend in BACKENDS:
    err = rel_rms(run(backend, q64, k64, v64), expected)
    grad_err = max(rel_rms(g, e) for g, e in zip(backend_grads[backend], expected_grads))
    print(f"{backend:6s} fp32: ReRoPE rel. RMS error {err:.1e}, worst gradient {grad_err:.1e}")
