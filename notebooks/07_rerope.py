# %% [markdown]
# # 07 · ReRoPE: rectified rotary positions, two-pass prefill, one-pass decode
#
# RoPE makes attention depend on the distance $i - j$ between a query and a key, and a model trained on sequences of
# length $L$ has never seen a distance beyond $L$. ReRoPE (Su Jianlin) keeps every distance inside a window $w$ exact
# and clamps the rest to $w$; Leaky ReRoPE lets them grow slowly (slope $1/k$) instead. This notebook follows the
# source: the relative-position matrices of RoPE, position interpolation, Leaky ReRoPE and ReRoPE (as heatmaps); why
# a clamped distance cannot come from one rotation per position, and the two attention passes the source computes
# instead; the one-pass formula for decoding with a cache of un-rotated keys; log-n scaling of the queries. Then the
# fused kernel (torch path and Triton) is checked against the per-pair definition, outputs, decode and gradients,
# and a tile count shows why its cost is one attention plus a band, not two attentions.
#
# **Sources.** Su Jianlin, "Transformer upgrade path 12: ReRoPE with infinite extrapolation?",
# https://spaces.ac.cn/archives/9708 (the order followed here; erratum 9 of
# [`reference/ERRATA.md`](../reference/ERRATA.md), and erratum 10, a sign slip shown in section 3); RoPE, arXiv:2104.09864,
# https://arxiv.org/abs/2104.09864.
#
# **Code used.** [`reference/rope.py`](../reference/rope.py): `apply_rope`, `relative_positions`,
# `attention_from_relative_positions` (the definition, pair by pair), `rerope_attention` (the source's two passes),
# `rerope_decode`, `log_n_scale` (NumPy, float64: the truth) · [`reference/attention.py`](../reference/attention.py):
# `softmax_attention` · [`kernels/rerope/`](../kernels/rerope/): `rerope_attention`, `rerope_decode` (backend
# `"torch"`: exact flash-attention pieces merged by log-sum-exp; backend `"triton"`: one fused kernel, forward,
# backward and decode) · [`kernels/testing.py`](../kernels/testing.py): `check` and the error budgets.

# %%
import seqmix

MODE = seqmix.use_interpreter_without_gpu()    # without a GPU: TRITON_INTERPRET=1, before triton is imported

import matplotlib.pyplot as plt
import numpy as np
import torch

from seqmix.kernels.rerope import rerope_attention as rerope_kernel, rerope_decode as rerope_decode_kernel
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
    # R^p x via complex numbers: pair (x_f, x_{f+d/2}) is z_f = x_f + i x_{f+d/2}, multiplied by e^{i p theta_f}.
    h = x.shape[-1] // 2
    z = (x[..., :h] + 1j * x[..., h:]) * np.exp(1j * np.multiply.outer(positions, theta))
    return np.concatenate([z.real, z.imag], axis=-1)

q, k, v = (rng.standard_normal((T, d)) for _ in range(3))
pos = np.arange(T, dtype=float)
scores_absolute = rotate(q, pos) @ rotate(k, pos).T                                  # (R^i q_i) . (R^j k_j)
scores_relative = np.array([[q[i] @ rotate(k[j], j - i) for j in range(T)] for i in range(T)])   # q_i . R^{j-i} k_j

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
# ## 2. Four relative-position matrices
#
# Each scheme is a function $f$ of the distance $x = i - j \ge 0$ (the causal part; $j > i$ is masked):
#
# | scheme | $\text{rel}_{ij} = f(i - j)$ | largest entry for length $L$ |
# |---|---|---|
# | RoPE | $x$ | $L - 1$: beyond the training length once $L$ is |
# | position interpolation (PI) | $x / k$ | $(L-1)/k$: squeezed into range, but neighbours are now $1/k$ apart |
# | Leaky ReRoPE | $x$ if $x < w$, else $w + (x - w)/k$ | $w + (L-1-w)/k$: exact nearby, squeezed far away |
# | ReRoPE | $\min(x, w)$ | $w$, whatever $L$ is (the $k \to \infty$ limit of Leaky ReRoPE) |
#
# The source's point: RoPE extrapolates badly because far entries exceed anything seen in training; PI avoids that
# but blurs the local distances that language modelling relies on most; (Leaky) ReRoPE keeps the window exact and
# never (ReRoPE) or slowly (Leaky) exceeds $w$. The names echo ReLU and Leaky ReLU against a linear function.

# %%
L, w, k_slope = 32, 8, 4.0
matrices = {
    "RoPE: x": ref.relative_positions(L, "rope"),
    f"PI: x / k  (k = {k_slope:g})": ref.relative_positions(L, "pi", k=k_slope),
    f"Leaky ReRoPE (w = {w}, k = {k_slope:g})": ref.relative_positions(L, "leaky_rerope", window=w, k=k_slope),
    f"ReRoPE: min(x, w)  (w = {w})": ref.relative_positions(L, "rerope", window=w),
}
causal = np.tril(np.ones((L, L), dtype=bool))
fig, axes = plt.subplots(1, 4, figsize=(16, 4.2), constrained_layout=True)
for ax, (title, rel) in zip(axes, matrices.items()):
    image = ax.imshow(np.where(causal, rel, np.nan), cmap="magma", vmin=0, vmax=L - 1)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
fig.colorbar(image, ax=axes, shrink=0.85, label="relative position rel_ij used by the rotation")
plt.show()

x = np.arange(L, dtype=float)
print("ReRoPE row", L - 1, ":", matrices[f"ReRoPE: min(x, w)  (w = {w})"][L - 1, ::4])

# %% tags=["nbval-check-output"]
formulas = {"rope": x, "pi": x / k_slope, "leaky_rerope": np.where(x < w, x, w + (x - w) / k_slope),
            "rerope": np.minimum(x, w)}
for kind, f in formulas.items():
    rel = ref.relative_positions(L, kind, window=w, k=k_slope)
    check(f"{kind}: every entry is f(i - j)", rel[causal], f[np.subtract.outer(np.arange(L), np.arange(L))][causal],
          REFERENCE_BUDGET)

# %% [markdown]
# **The PI matrix as printed (erratum 9).** The source's PI matrix ends with the row
# $\frac{L-1}{k}, \frac{L-1}{k}, \dots$; its second entry must be $\frac{L-2}{k}$. Position interpolation means running
# RoPE at positions $p/k$, so the matrix is $(i - j)/k$, constant along each diagonal. Running RoPE at positions
# $p / k$ gives exactly the attention of the $x/k$ matrix; the printed entry belongs to no assignment of positions
# and changes the last row's output:

# %%
pi_attention = ref_attention.softmax_attention(rotate(q, pos / k_slope), rotate(k, pos / k_slope), v)
rel_pi = ref.relative_positions(T, "pi", k=k_slope)
rel_printed = rel_pi.copy()
rel_printed[T - 1, 1] = (T - 1) / k_slope                           # the source's last row: (L-1)/k, (L-1)/k, ...

# %% tags=["nbval-check-output"]
check("RoPE at positions p/k vs the definition with (i - j)/k", pi_attention,
      ref.attention_from_relative_positions(q, k, v, rel_pi), REFERENCE_BUDGET)
print("the printed matrix is constant along its diagonals:", bool(rel_printed[T - 1, 1] == rel_printed[T - 2, 0]))

# %%
printed_error = rel_rms(ref.attention_from_relative_positions(q, k, v, rel_printed)[T - 1], pi_attention[T - 1])
print(f"last row of the output with the printed PI matrix: rel. error {printed_error:.1e}")
assert printed_error > 1e-3

# %% [markdown]
# ## 3. Why two passes: the source's prefill
#
# A rotation per position can only produce distances linear in $i - j$: that is what section 1 used. $\min(i-j, w)$
# is piecewise linear, so the source computes the score matrix twice, each pass linear, and merges them:
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
# kernel computes this merge (the source says as much).
#
# **A sign slip in the source.** For ReRoPE the source writes $a^{(2)}_{ij} = (\mathcal{R}^w q_i)^\top k_j =
# q_i^\top \mathcal{R}^{w} k_j$. Transposing a rotation reverses it, so the right side must be
# $q_i^\top \mathcal{R}^{-w} k_j$, as in its own $a^{(1)}$ identity and its decode formula below. The left side (what is
# computed) is right:

# %%
lhs = rotate(q, np.full(T, float(w))) @ k.T                            # (R^w q_i) . k_j: what the source computes
rhs_as_printed = q @ rotate(k, np.full(T, float(w))).T                 # q_i . R^{w} k_j
rhs_correct = q @ rotate(k, np.full(T, -float(w))).T                   # q_i . R^{-w} k_j
print(f"(R^w q) . k  vs  q . R^w k: rel. difference {rel_rms(rhs_as_printed, lhs):.2f}")
assert rel_rms(rhs_as_printed, lhs) > 0.1

# %% tags=["nbval-check-output"]
check("(R^w q_i) . k_j vs q_i . R^{-w} k_j", lhs, rhs_correct, REFERENCE_BUDGET)
print("(R^w q_i) . k_j equals q_i . R^{w} k_j as printed:", bool(np.allclose(lhs, rhs_as_printed)))


# %%
def rerope_two_pass(q, k, v, window, leaky_k=None):
    # The source's prefill: two score matrices, merged at i - j = w, then the causal softmax.
    T, d = q.shape
    p = np.arange(T, dtype=float)
    a1 = rotate(q, p) @ rotate(k, p).T                                            # (T, T) distance i - j
    if leaky_k is None:
        a2 = rotate(q, np.full(T, float(window))) @ k.T                           # distance w
    else:
        a2 = rotate(q, (p - window) / leaky_k + window) @ rotate(k, p / leaky_k).T  # distance w + (i-j-w)/k
    near = np.subtract.outer(p, p) < window
    return ref_attention.attention_from_scores(np.where(near, a1, a2) / np.sqrt(d), v)

window = 4
prefill = rerope_two_pass(q, k, v, window)
prefill_leaky = rerope_two_pass(q, k, v, window, leaky_k=k_slope)

# %% tags=["nbval-check-output"]
for what, actual, expected in (
    ("ReRoPE two passes vs the definition",
     prefill, ref.attention_from_relative_positions(q, k, v, ref.relative_positions(T, "rerope", window=window))),
    ("ReRoPE two passes vs reference.rerope_attention", prefill, ref.rerope_attention(q, k, v, window)),
    ("Leaky ReRoPE two passes vs the definition", prefill_leaky, ref.attention_from_relative_positions(
        q, k, v, ref.relative_positions(T, "leaky_rerope", window=window, k=k_slope))),
    ("Leaky ReRoPE two passes vs reference.rerope_attention", prefill_leaky,
     ref.rerope_attention(q, k, v, window, leaky_k=k_slope)),
):
    check(what, actual, expected, REFERENCE_BUDGET)


# %% [markdown]
# ## 4. One pass for decoding
#
# Since the distance is not linear, a key cannot be stored rotated once and for all: the cache holds keys *before*
# RoPE. The good news, in the source's words, is that while decoding the query is a single row ($i = T - 1$), so each
# cached key can be rotated by exactly the amount its distance calls for, and one attention row suffices:
#
# $$a_{ij} = q_i^\top\left(\mathcal{R}^{\max(j - i,\, -w)} k_j\right) \ \text{(ReRoPE)}, \qquad
# a_{ij} = q_i^\top\left(\mathcal{R}^{\max(j - i,\, (j - i + w)/k - w)} k_j\right) \ \text{(Leaky)} .$$
#
# Both exponents are $-\text{rel}(i - j)$: $\max(-x, -w) = -\min(x, w)$, and for Leaky ReRoPE
# $-x - \left((w - x)/k - w\right) = (w - x)(1 - 1/k)$ is positive exactly when $x < w$. Decoding token by token then
# reproduces the prefill row by row.

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

decoded = np.stack([decode(q[i], k[: i + 1], v[: i + 1], window) for i in range(T)])            # (T, d)
decoded_leaky = np.stack([decode(q[i], k[: i + 1], v[: i + 1], window, k_slope) for i in range(T)])

# %% tags=["nbval-check-output"]
for what, actual, expected in (
    ("ReRoPE: decoding token by token vs the two-pass prefill", decoded, prefill),
    ("Leaky ReRoPE: decoding token by token vs the two-pass prefill", decoded_leaky, prefill_leaky),
    ("ReRoPE: last step vs reference.rerope_decode", decoded[-1:], ref.rerope_decode(q[-1:], k, v, window)),
):
    check(what, actual, expected, REFERENCE_BUDGET)

# %% [markdown]
# ## 5. Log-n scaling
#
# The source's best results also multiply every query by $\max(1, \log_{L} n)$, $n$ the 1-based position and $L$ the
# training length:
#
# $$q_n \;\leftarrow\; \max\!\left(1, \frac{\ln n}{\ln L}\right) q_n .$$
#
# Nothing changes up to the training length; beyond it the scores grow like $\log n$. A query that sees $n$ keys
# spreads its softmax over more candidates as $n$ grows, so its entropy rises; a larger scale sharpens the softmax
# and counters that rise (for the random inputs below, the entropy stays near its value at the training length). (The source's experiments use it both added at test time only, $\log n^\dagger$, and trained
# with; the formula is the same.) Below: the factor, and the entropy of attention rows of random queries and keys
# with and without it.

# %%
L_train = 64
T_long, d_long = 1024, 16
k_long = 1.5 * rng.standard_normal((T_long, d_long))
factor = ref.log_n_scale(np.arange(T_long), L_train)                          # (T,) by 0-based position
rows = np.unique(np.geomspace(1, T_long, 40).astype(int)) - 1

queries = 1.5 * rng.standard_normal((256, d_long))                           # many queries per position: an average

def row_entropy(i, scale_q):
    # Mean entropy of the softmax rows of the queries at 0-based position i (they see keys 0..i).
    s = (scale_q * queries) @ k_long[: i + 1].T / np.sqrt(d_long)             # (256, i + 1)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return -(p * np.log(p)).sum(axis=1).mean()

fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
axes[0].semilogx(np.arange(1, T_long + 1), factor)
axes[0].axvline(L_train, color="gray", ls=":", label=f"training length L = {L_train}")
axes[0].set_xlabel("position n (1-based)")
axes[0].set_ylabel("max(1, ln n / ln L)")
axes[0].set_title("Log-n scaling factor of the query")
axes[0].legend()
axes[1].semilogx(rows + 1, [row_entropy(i, 1.0) for i in rows], marker=".", label="without log-n scaling")
axes[1].semilogx(rows + 1, [row_entropy(i, factor[i]) for i in rows], marker=".", label="with log-n scaling")
axes[1].semilogx(rows + 1, np.log(rows + 1), "--", color="gray", label="ln n (uniform weights)")
axes[1].axvline(L_train, color="gray", ls=":")
axes[1].set_xlabel("position n (1-based): number of keys seen")
axes[1].set_ylabel("mean entropy of an attention row (nats)")
axes[1].set_title("Random q, k: row entropy against position")
axes[1].legend()
plt.show()

# %% tags=["nbval-check-output"]
own_factor = np.maximum(1.0, np.log(np.arange(1, T + 1)) / np.log(6))      # L = 6 so that the factor acts at T = 12
check("log-n: reference.rerope_attention(train_length) vs two passes on scaled queries",
      ref.rerope_attention(q, k, v, window, train_length=6), rerope_two_pass(own_factor[:, None] * q, k, v, window),
      REFERENCE_BUDGET)
print("the factor is 1 up to the training length:", bool((factor[:L_train] == 1).all()))

# %% [markdown]
# ## 6. The fused kernel against the definition
#
# [`kernels.rerope.rerope_attention`](../kernels/rerope/) computes the same attention in $O(T)$ memory, without
# either $T \times T$ matrix: backend `"torch"` assembles it from exact flash-attention pieces (the far part, the
# diagonal blocks, the previous blocks) merged by their log-sum-exp; backend `"triton"` is one fused kernel (here
# under the Triton interpreter on the CPU). Both take `(B, H, T, d)` tensors. They are checked against the float64
# *definition* (`attention_from_relative_positions`, the per-pair rotation), not against the two-pass form they
# replace. $T = 160$ with $w = 40$ makes the Triton kernel meet all three kinds of key tiles of section 7 (far only,
# near only, straddling the window's edge).

# %%
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
    return rerope_kernel(*(torch.tensor(x, dtype=dtype) for x in (q, k, v)), window, backend=backend, **options)

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
    check(f"{backend} fp32 ReRoPE", run(backend, q64, k64, v64), expected, FP32_BUDGET)
    check(f"{backend} fp32 Leaky ReRoPE + log-n", run(backend, q64, k64, v64, leaky_k=leaky_k,
          train_length=train_length), expected_leaky_logn, FP32_BUDGET)
    check(f"{backend} fp32 decode (ReRoPE)", run_decode(backend, q64, k64, v64), expected[:, :, -1:], FP32_BUDGET)
    check(f"{backend} fp32 decode (Leaky + log-n)", run_decode(backend, q64, k64, v64, leaky_k=leaky_k,
          train_length=train_length), expected_leaky_logn[:, :, -1:], FP32_BUDGET)
    check(f"{backend} fp16 ReRoPE", run(backend, q16, k16, v16, dtype=torch.float16), definition(q16, k16, v16),
          FP16_BUDGET)


# %% [markdown]
# **Gradients.** The float64 truth for the gradients is autograd through the definition written in torch: every key
# rotated by $-\text{rel}_{ij}$ for every query, a $(T, T, d)$ tensor, then the causal softmax (its forward is first
# checked against the reference). Both backends' fp32 gradients of $\sum O \odot G$ (Leaky ReRoPE with log-n
# scaling, the path with the most pieces) must match it.

# %%
def definition_torch(q, k, v):
    # Leaky ReRoPE + log-n by the definition, in torch: score_ij = (sigma_i q_i) . R^{-rel_ij} k_j / sqrt(d).
    T, d = q.shape[-2:]
    sigma = torch.tensor(ref.log_n_scale(np.arange(T), train_length))[:, None]
    rel = torch.tensor(ref.relative_positions(T, "leaky_rerope", window=window, k=leaky_k))
    angle = -rel[..., None] * torch.tensor(10000.0 ** (-np.arange(0, d, 2) / d))       # (T, T, d/2)
    k1, k2 = k[..., None, :, : d // 2], k[..., None, :, d // 2:]                         # (..., 1, T, d/2)
    k_rot = torch.cat([k1 * angle.cos() - k2 * angle.sin(), k2 * angle.cos() + k1 * angle.sin()], dim=-1)
    s = torch.einsum("...id,...ijd->...ij", sigma * q, k_rot) / d ** 0.5
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v

G = rng.standard_normal((B, H, T, d))

def gradients(fn, dtype):
    leaves = [torch.tensor(x, dtype=dtype, requires_grad=True) for x in (q64, k64, v64)]
    fn(*leaves).backward(torch.tensor(G, dtype=dtype))
    return [x.grad for x in leaves]

expected_grads = gradients(definition_torch, torch.float64)
backend_grads = {b: gradients(lambda q, k, v: rerope_kernel(q, k, v, window, leaky_k=leaky_k,
                                                            train_length=train_length, backend=b), torch.float32)
                 for b in BACKENDS}

# %% tags=["nbval-check-output"]
check("definition in torch float64 vs reference", definition_torch(*map(torch.tensor, (q64, k64, v64))),
      expected_leaky_logn, REFERENCE_BUDGET)
for backend in BACKENDS:
    for name, got, want in zip(("dq", "dk", "dv"), backend_grads[backend], expected_grads):
        check(f"{backend} fp32 {name}", got, want, FP32_BUDGET)

# %%
# The errors themselves (this cell is not compared: the numbers depend on the machine).
for backend in BACKENDS:
    err = rel_rms(run(backend, q64, k64, v64), expected)
    grad_err = max(rel_rms(g, e) for g, e in zip(backend_grads[backend], expected_grads))
    print(f"{backend:6s} fp32: ReRoPE rel. RMS error {err:.1e}, worst gradient {grad_err:.1e}")

# %% [markdown]
# ## 7. Why the fused kernel costs one attention plus a band
#
# The source's prefill computes two full score matrices. But each pair $(i, j)$ needs only one of them, and which
# one depends on $i - j$ alone: pairs with $i - j < w$ (a band of width $w$ along the diagonal) take the RoPE score,
# all others the clamped one. The Triton kernel, flash-attention style, gives each program a tile of $B_M$ query rows
# and walks the key tiles of $B_N$ keys, classifying each tile from its corners:
#
# - *far only*: every pair has $i - j \ge w$: compute $a^{(2)}$ only;
# - *near only*: every pair has $i - j < w$: compute $a^{(1)}$ only;
# - *straddling*: the edge $i - j = w$ crosses the tile: compute both and pick per element.
#
# Only straddling tiles cost double, and the edge $i - j = w$ is a line parallel to the diagonal: over the $B_M$
# rows of a query tile it crosses $B_M/B_N$ key tiles (one more when it is not aligned with the tiles), whatever $T$
# and $w$ are. So the work is one causal attention plus
# $O(T)$ extra tiles (a band along the edge), against twice the attention for the source's two passes. The count
# below uses the kernel's tiles for $d \le 64$ ($B_M = 64$, $B_N = 32$) and $w = 256$ (the source's best window).

# %%
BM, BN = 64, 32                                # the kernel's tiles for head size <= 64 (kernels/rerope/fused.py)

def score_tiles(T, window):
    # (tiles of one causal attention, tiles the fused kernel computes, of which straddling) for a length T.
    attention = fused = straddling = 0
    for c in range(0, T, BM):                                       # query rows c .. c + BM - 1
        last_row = min(c + BM, T) - 1
        for n in range(0, last_row + 1, BN):                        # key tiles with at least one j <= i
            last_key = min(n + BN, T) - 1
            nearest, farthest = max(c - last_key, 0), last_row - n  # smallest and largest i - j in the tile
            both = nearest < window <= farthest
            attention += 1
            fused += 2 if both else 1
            straddling += both
    return attention, fused, straddling

lengths = 2 ** np.arange(9, 16)                                     # 512 .. 32768
counts = np.array([score_tiles(int(t), 256) for t in lengths])
for t, (att, fused, strad) in zip(lengths[::2], counts[::2]):
    print(f"T = {t:6d}: causal attention {att:7d} tiles, fused ReRoPE {fused:7d} (+{strad} straddling), "
          f"two passes {2 * att:7d}")

fig, ax = plt.subplots(figsize=(7, 4))
ax.semilogx(lengths, counts[:, 1] / counts[:, 0], marker="o", label="fused kernel (one attention + a band)")
ax.semilogx(lengths, np.full(len(lengths), 2.0), "--", label="the source's two passes")
ax.axhline(1.0, color="gray", ls=":", label="one causal attention")
ax.set_xlabel("sequence length T")
ax.set_ylabel("score tiles computed / tiles of one causal attention")
ax.set_title("ReRoPE prefill cost (w = 256, tiles 64 x 32)")
ax.set_ylim(0.9, 2.1)
ax.legend()
plt.show()

# %%
straddling_per_query_tile = counts[:, 2] / np.ceil(lengths / BM)
print("straddling key tiles per query tile, T = 512 .. 32768:", ", ".join(f"{x:.2f}" for x in straddling_per_query_tile))
assert (straddling_per_query_tile <= BM / BN + 1).all()

# %% [markdown]
# ## Summary
#
# - RoPE's relative positions are linear in $i - j$; PI scales them, Leaky ReRoPE and ReRoPE clamp them beyond a
#   window $w$. The PI matrix is $(i - j)/k$ throughout (erratum 9), and the source's ReRoPE identity needs
#   $\mathcal{R}^{-w}$ on the right side.
# - The source's two passes, the one-pass decode and log-n scaling all match the per-pair definition to float64
#   rounding, and decoding token by token reproduces the prefill.
# - The torch path and the fused Triton kernel match the definition in fp32 and fp16, prefill and decode, outputs
#   and gradients, in $O(T)$ memory.
# - Per tile, only the edge $i - j = w$ needs both scores: the cost is one causal attention plus a band of
#   straddling tiles, which tends to 1x attention as $T$ grows, against 2x for the source's two passes.
