# %% [markdown]
# # 01 · Causal softmax attention: the matrix form, the sums, the online form
#
# This notebook takes the attention formula every later notebook builds on and writes it four ways: the matrix form
# $\mathrm{softmax}(QK^\top/\sqrt d)\,V$ with its causal mask, the same thing as explicit sums (the form RWKV-4 will
# modify in notebook 02), the same sums with each row's maximum subtracted (why this is needed, and why it changes
# nothing), and the online form that streams over the keys with a running maximum and a running sum (how
# FlashAttention and RWKV-4's stable recurrence avoid overflow without ever seeing a whole row). Each form is checked
# against the float64 reference. Exercises close the notebook; an appendix runs the production path (the torch path
# and the Triton kernel) on the same inputs, outputs and gradients, against the same reference.
#
# **Sources.** The "Rwkv attention and the recurrent formulas" section of the Hugging Face RWKV page,
# https://huggingface.co/docs/transformers/model_doc/rwkv (matrix form, sums, max subtraction); FlashAttention,
# arXiv:2205.14135, https://arxiv.org/abs/2205.14135 (the online form, computed in tiles).
#
# **Code used.** [`reference/attention.py`](../reference/attention.py): `softmax_attention`, `attention_sums`,
# `online_softmax_attention` (NumPy, float64: the truth) ·
# [`kernels/attention/`](../kernels/attention/__init__.py): `attention` (backend `"torch"`: scaled dot-product attention;
# backend `"triton"`: a flash-style kernel) · [`kernels/testing.py`](../kernels/testing.py): `check` and the error
# budgets (relative RMS error against the float64 reference: 1e-12 between float64 forms, 1e-5 for fp32, 5e-3 for
# fp16 inputs).
#
# **Notation.** Letters here ($a$, $M$, $S$, $k$) mean other things in later notebooks: see the
# [notation crosswalk](notation.md).

# %%
import seqmix

MODE = seqmix.use_interpreter_without_gpu()    # no GPU: TRITON_INTERPRET=1 before triton

import matplotlib.pyplot as plt
import numpy as np
import torch

from seqmix.kernels.attention import attention
from seqmix.kernels.testing import FP16_BUDGET, FP32_BUDGET, REFERENCE_BUDGET, check, exercise, rel_rms
from seqmix.reference import attention as ref

rng = np.random.default_rng(0)
torch.manual_seed(0)
print("Triton kernels run on:", MODE)

# %% [markdown]
# ## 1. The matrix form
#
# The page starts from
#
# $$O = \mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt d}\right) V ,$$
#
# with $Q, K, V$ of shape $T \times d$: one row per position (batch and heads are further leading axes and change
# nothing). Spelled out for a language model, which must not look ahead:
#
# $$S = \frac{QK^\top}{\sqrt d}, \qquad M_{ij} = \begin{cases} 0 & j \le i \\ -\infty & j > i \end{cases}, \qquad
# P = \mathrm{softmax}_{\text{rows}}(S + M), \qquad O = P V .$$
#
# $S_{ij}$ says how well query $i$ matches key $j$; $P_{ij}$ turns each row into weights that are positive and sum
# to one; $O_i$ is the weighted average of the values. The mask sets $e^{-\infty} = 0$ for the future keys.

# %%
T, d = 10, 8
q, k, v = (rng.standard_normal((T, d)) for _ in range(3))    # each (T, d)

S = q @ k.T / np.sqrt(d)                      # (T, T) scores
M = np.triu(np.full((T, T), -np.inf), k=1)    # (T, T) causal mask: -inf above the diagonal
E = np.exp(S + M)                             # (T, T) exactly 0 above the diagonal
P = E / E.sum(axis=1, keepdims=True)          # (T, T) each row sums to 1
O_matrix = P @ v                              # (T, d)

# %% tags=["nbval-check-output"]
check("matrix form vs reference.softmax_attention", O_matrix, ref.softmax_attention(q, k, v),
      REFERENCE_BUDGET)
print("every row of P sums to 1:", bool(np.allclose(P.sum(axis=1), 1.0)))
print("P is exactly zero above the diagonal:", bool((np.triu(P, k=1) == 0).all()))

# %% [markdown]
# ## 2. What the causal mask guarantees
#
# Output $i$ depends on positions $0..i$ only. To see it, replace the keys and values of every position after $t$
# by new random ones: the outputs up to $t$ stay exactly what they were, the later ones change. Without the mask
# (`causal=False`) even the first output would move.

# %%
t = 4
k_new, v_new = k.copy(), v.copy()
k_new[t + 1:] = rng.standard_normal((T - t - 1, d))          # a different future
v_new[t + 1:] = rng.standard_normal((T - t - 1, d))
O_new = ref.softmax_attention(q, k_new, v_new)
O_new_unmasked = ref.softmax_attention(q, k_new, v_new, causal=False)

# %% tags=["nbval-check-output"]
check(f"causal outputs 0..{t} with a different future", O_new[: t + 1], O_matrix[: t + 1],
      REFERENCE_BUDGET)
print(f"causal outputs after {t} changed:", not np.allclose(O_new[t + 1:], O_matrix[t + 1:]))
print("without the mask, output 0 changed:",
      not np.allclose(O_new_unmasked[0], ref.softmax_attention(q, k, v, causal=False)[0]))

# %% [markdown]
# ## 3. Replacing the softmax by its value
#
# Writing the softmax out turns the matrix product into one weighted average per query (the page's sums, with
# $1$-based positions):
#
# $$O_i = \frac{\sum_{j=1}^{i} e^{\,q_i \cdot k_j / \sqrt d}\; v_j}{\sum_{j=1}^{i} e^{\,q_i \cdot k_j / \sqrt d}} .$$
#
# The mask has become the upper limit of the sums. This is the form RWKV-4 starts from: it keeps the weighted
# average and replaces the score $q_i \cdot k_j / \sqrt d$ by a decay plus a key (notebook 02).
#
# **Index convention.** The page counts positions from 1, so query $i$ sees the $i$ keys $1..i$. The code counts
# from 0, as Python does, so query $i$ sees the $i + 1$ keys $0..i$. From here on this notebook uses the code's
# 0-based positions.

# %%
O_sums = np.empty((T, d))
for i in range(T):
    e = np.exp(q[i] @ k[: i + 1].T / np.sqrt(d))             # (i + 1,) weights of the keys i sees
    O_sums[i] = e @ v[: i + 1] / e.sum()                     # (d,) their weighted average of values

# %% tags=["nbval-check-output"]
for what, expected in (("reference.attention_sums", ref.attention_sums(q, k, v)),
                       ("the matrix form", O_matrix)):
    check(f"explicit sums vs {what}", O_sums, expected, REFERENCE_BUDGET)

# %% [markdown]
# ## 4. Why each row's maximum is subtracted
#
# $e^x$ is finite only up to $x = \ln(\text{largest float})$: about 709.8 in float64, 88.7 in float32 and 11.1 in
# float16. A score past that gives $e^{s} = \infty$, and the ratio $\infty / \infty$ is NaN, although the true
# output is a perfectly ordinary weighted average of values. The sums as written, on scores of the order of a
# thousand:

# %%
for name, dtype in (("float64", np.float64), ("float32", np.float32), ("float16", np.float16)):
    print(f"e^x overflows {name} for x > {np.log(np.finfo(dtype).max):.1f}")

q_big = 400 * q                                              # scores of the order of a thousand
S_big = q_big @ k.T / np.sqrt(d)                             # (T, T)
print("largest score:", round(float(S_big.max()), 1))
with np.errstate(over="ignore", invalid="ignore"):
    O_unshifted = ref.attention_sums(q_big, k, v)            # the sums exactly as written
    print("unshifted row sums, first 3 rows:", np.exp(S_big + M).sum(axis=1)[:3])
nan_rows = int(np.isnan(O_unshifted).any(axis=1).sum())
print("rows of the unshifted sums that are NaN:", nan_rows, "of", T)

# %% [markdown]
# The cure: dividing the numerator and the denominator by the same $e^{m_i}$ changes nothing in exact arithmetic,
#
# $$\frac{e^{s_{ij}}}{\sum_{j' \le i} e^{s_{ij'}}} = \frac{e^{s_{ij} - m_i}}{\sum_{j' \le i} e^{s_{ij'} - m_i}},
# \qquad m_i = \max_{j \le i} s_{ij} .$$
#
# With $m_i$ the row's maximum every exponent is $\le 0$, and the largest term is exactly 1. Row $i$ sums $i + 1$
# terms (0-based, see section 3), each in $(0, 1]$, so its denominator lies in $[1, i + 1]$: nothing can overflow,
# and nothing underflows to a zero denominator.

# %%
m = (S_big + M).max(axis=1, keepdims=True)                   # (T, 1) m_i, the row's max over j <= i
E_big = np.exp(S_big + M - m)                                # (T, T) every exponent <= 0
O_shifted = E_big @ v / E_big.sum(axis=1, keepdims=True)     # (T, d)

m_small = (S + M).max(axis=1, keepdims=True)                 # the same shift on the ordinary scores
E_small = np.exp(S + M - m_small)
O_shifted_small = E_small @ v / E_small.sum(axis=1, keepdims=True)
print("shifted row sums, ordinary scores (row i in [1, i + 1]):", E_small.sum(axis=1).round(2))
print("shifted row sums, large scores (the largest term dominates):", E_big.sum(axis=1).round(2))

# %% tags=["nbval-check-output"]
check("shifted sums vs unshifted sums (ordinary scores)", O_shifted_small, O_sums, REFERENCE_BUDGET)
check("shifted sums vs reference.softmax_attention (large scores)", O_shifted,
      ref.softmax_attention(q_big, k, v), REFERENCE_BUDGET)
print("shifted output finite:", bool(np.isfinite(O_shifted).all()))


# %% [markdown]
# ## 5. The online (streaming) form
#
# Subtracting the maximum needs the whole row first. A long row (or one that arrives tile by tile, as in
# FlashAttention) can instead be streamed: keep the largest score seen so far $m$, the running sum
# $\ell = \sum e^{s_{ij} - m}$ and the running weighted sum $a = \sum e^{s_{ij} - m} v_j$ over the keys seen so far.
# When key $j$ arrives with score $s = s_{ij}$:
#
# $$m' = \max(m, s), \qquad \ell' = e^{m - m'}\,\ell + e^{s - m'}, \qquad a' = e^{m - m'}\,a + e^{s - m'}\,v_j ,$$
#
# and after the last visible key, $O_i = a / \ell$. Why it is right: if $\ell$ and $a$ are the sums over the keys
# seen so far, each relative to $m$, then multiplying them by $e^{m - m'}$ re-expresses them relative to $m'$, and the
# new key adds its own term; so the invariant holds after every key, and the ratio at the end is the softmax average.
# Start from $m = -\infty$, $\ell = 0$, $a = 0$ (then $e^{m - m'} = 0$). Every exponent is $\le 0$, whatever the
# scores. The same update applied to a block of keys at once (its maximum, then the block's sum) is what the reference
# and the Triton kernel do; RWKV-4's max-tracked recurrence (notebook 02) is this update with one key per time step.

# %%
def online_row(scores, values):
    # One query's output, streaming over its visible keys one by one. scores: (n,), values: (n, d).
    m, l, a = -np.inf, 0.0, np.zeros(values.shape[1])
    for s, v_j in zip(scores, values):
        m_new = max(m, s)
        rescale = np.exp(m - m_new)                          # e^{-inf} = 0 for the first key
        l = rescale * l + np.exp(s - m_new)
        a = rescale * a + np.exp(s - m_new) * v_j
        m = m_new
    return a / l

O_online = np.stack([online_row(S_big[i, : i + 1], v[: i + 1]) for i in range(T)])   # (T, d)

# %% tags=["nbval-check-output"]
check("online form, one key at a time vs shifted sums (large scores)", O_online, O_shifted,
      REFERENCE_BUDGET)
for block in (1, 3, 16):
    check(f"reference.online_softmax_attention block_size={block} vs matrix form (large scores)",
          ref.online_softmax_attention(q_big, k, v, block_size=block),
          ref.softmax_attention(q_big, k, v), REFERENCE_BUDGET)

# %% [markdown]
# ## 6. What the weights look like
#
# Each row of $P$ is one query's distribution over the keys it may see. Causal masking leaves the upper triangle
# empty; the first query can only look at itself (weight 1). Raising the scale (a lower softmax temperature)
# concentrates every row on its best-matching key. The limit is a hard arg-max: the output becomes one value vector,
# and the row's entropy $-\sum_j P_{ij} \ln P_{ij}$ falls from $\ln(i + 1)$ (uniform) to 0. Large scales are
# also where the unshifted sums of section 4 overflow; the right panel marks the scale at which the largest
# *visible* score passes float32's limit (a masked score never enters the sums).

# %%
T_plot = 16
qp, kp = rng.standard_normal((T_plot, 16)), rng.standard_normal((T_plot, 16))
visible = np.tril(np.ones((T_plot, T_plot), dtype=bool))

def weights(factor):
    # Causal softmax weights P at scale factor / sqrt(d): (T_plot, T_plot), NaN above the diagonal.
    s = np.where(visible, qp @ kp.T * factor / np.sqrt(16), -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return np.where(visible, p / p.sum(axis=1, keepdims=True), np.nan)

factors = np.geomspace(0.1, 100, 40)
def mean_entropy(p):
    # The mean over rows of -sum_j P_ij ln P_ij (0 ln 0 = 0).
    return np.nanmean(np.nansum(-p * np.log(np.maximum(p, 1e-300)), axis=1))

entropy = [mean_entropy(weights(f)) for f in factors]
# The largest visible score (j <= i): a masked score never enters the sums, so it cannot overflow them.
largest = [np.where(visible, qp @ kp.T * f / 4, -np.inf).max() for f in factors]

# %%
fig, axes = plt.subplots(1, 3, figsize=(10, 3.4), constrained_layout=True)
for ax, factor in zip(axes[:2], (1.0, 4.0)):
    image = ax.imshow(weights(factor), cmap="viridis", vmin=0, vmax=1)
    ax.set_title(f"weights $P_{{ij}}$, scale {factor:g}" + r"$/\sqrt{d}$")
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
fig.colorbar(image, ax=axes[:2], shrink=0.8, label="weight (row sums = 1)")
axes[2].semilogx(factors, entropy, label="mean row entropy")
uniform = np.mean(np.log(np.arange(1, T_plot + 1)))            # row i uniform over i + 1 keys
axes[2].axhline(uniform, color="grey", ls=":", label="uniform rows")
overflow = factors[np.argmax(np.array(largest) > np.log(np.finfo(np.float32).max))]
axes[2].axvline(overflow, color="red", ls="--", label="float32 $e^s$ overflows")
axes[2].set_xlabel(r"scale factor ($\times 1/\sqrt{d}$)")
axes[2].set_ylabel("entropy (nats)")
axes[2].set_title("peakier as the scale grows")
axes[2].legend(fontsize=9)
plt.show()

# %% [markdown]
# ## Summary
#
# - The matrix form, the explicit sums, the row-max-shifted sums and the online form are one function: they agree to
#   float64 rounding (budget 1e-12), and so does `reference/attention.py`.
# - The sums as written overflow once a score passes ~709.8 (float64; 88.7 in float32): subtracting the row's
#   maximum, or tracking it while streaming, removes the problem without changing the result.
# - The torch path and the Triton kernel reproduce the reference in fp32 (1e-5) and fp16 (5e-3), outputs and
#   gradients, causal and not (the appendix).
#
# Next: [02 · RWKV-4's WKV](02_rwkv4_wkv.ipynb) replaces the score $q_i \cdot k_j$ by a decay plus a key, which turns
# these sums into a recurrence.
#
# ## Exercises
#
# Each exercise has a solution in the collapsed cell below it (click the three dots to open it); it runs with the
# notebook, so it is checked too. In a coding exercise, fill in the stub, run it, then run the check cell under it:
# it says "not attempted yet" while the stub is untouched, "correct" when your code passes, and fails with the
# checks' message otherwise.
#
# **1. Which rows overflow?** With the scores of `100 * q` in float32, predict from the row maxima which rows of the
# unshifted sums give NaN. Then compute the sums in float32 and compare.

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
q32, k32, v32, M32 = (x.astype(np.float32) for x in (100 * q, k, v, M))
S32 = q32 @ k32.T / np.float32(np.sqrt(d))                        # (T, T) float32 scores
row_max = (S32 + M32).max(axis=1)                                 # (T,) over j <= i
predicted = np.flatnonzero(row_max > np.log(np.finfo(np.float32).max))
with np.errstate(over="ignore", invalid="ignore"):
    E32 = np.exp(S32 + M32)                                       # (T, T) float32
    O32 = E32 @ v32 / E32.sum(axis=1, keepdims=True)
print("rows predicted to overflow (max score > 88.7):", predicted.tolist())
print("rows that are NaN:", np.flatnonzero(np.isnan(O32).any(axis=1)).tolist())

# %% [markdown]
# **2. The arg-max limit.** As the scale grows, each output tends to the value of its best-matching *visible* key.
# Write `hard_attention(q, k, v)`, the limit itself: row $i$ of the output is $v_j$ for the $j \le i$ with the
# largest score $q_i \cdot k_j$. The check compares it with `ref.softmax_attention(..., scale=1e4 / sqrt(d))`, which
# subtracts the maximum and so never overflows. Hint: the mask $M$ of section 1 keeps the future out of an
# `argmax`.

# %%
# Exercise 2: the arg-max limit
def hard_attention(q, k, v):
    """Causal hard attention: (T, d) outputs, row i the value of the key j <= i that scores highest against q_i."""
    raise NotImplementedError("Exercise 2: your code here")

# %% tags=["nbval-check-output"]
def checks_2():
    check("hard_attention vs softmax at scale 1e4/sqrt(d)", hard_attention(q, k, v),
          ref.softmax_attention(q, k, v, scale=1e4 / np.sqrt(d)), REFERENCE_BUDGET)

exercise("Exercise 2", checks_2)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
def hard_attention(q, k, v):
    """Causal hard attention: (T, d) outputs, row i the value of the key j <= i that scores highest against q_i."""
    causal = np.triu(np.full((len(q), len(k)), -np.inf), k=1)     # without it the argmax may pick a future key
    best = (q @ k.T + causal).argmax(axis=1)                        # (T,) the scale does not move an argmax
    return v[best]

exercise("Exercise 2", checks_2)

# %% [markdown]
# **3. Changing the past.** Section 2 changed the future. Now change only key and value 6: which outputs move?

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
k_past, v_past = k.copy(), v.copy()
k_past[6], v_past[6] = rng.standard_normal(d), rng.standard_normal(d)
moved = ~np.isclose(ref.softmax_attention(q, k_past, v_past), O_matrix).all(axis=1)
print("outputs that moved:", np.flatnonzero(moved).tolist())   # every query that sees position 6

# %% [markdown]
# **4. Merging two partial results.** Section 5 streams one key at a time. FlashAttention's split-K decoding (and
# a kernel whose programs each own a block of keys) instead computes one query's state $(m, \ell, a)$ over each
# block separately, then merges them. Write `merge(state_1, state_2)`: given $(m_1, \ell_1, a_1)$ over one block of
# keys and $(m_2, \ell_2, a_2)$ over another, each relative to its own maximum, return the state over both. The
# check splits the last query's large scores (`S_big`, section 4) at every point, merges the two blocks' states and
# compares $a / \ell$ with the reference's output, and $m$ with the row's maximum. Hint: re-express both sums
# relative to the larger maximum, as the online update does.

# %%
# Exercise 4: merging two partial results
def merge(state_1, state_2):
    """(m, l, a) over two blocks of keys from each block's (m, l, a): m a scalar, l a scalar, a of shape (d,)."""
    raise NotImplementedError("Exercise 4: your code here")

# %% tags=["nbval-check-output"]
def block_state(scores, values):
    # One block's (m, l, a), computed directly from its scores (n,) and values (n, d).
    m = scores.max()
    e = np.exp(scores - m)
    return m, e.sum(), e @ values

def checks_4():
    scores, expected = S_big[T - 1], ref.softmax_attention(q_big, k, v)[T - 1]   # the last query sees all T keys
    merged = [merge(block_state(scores[:split], v[:split]), block_state(scores[split:], v[split:]))
              for split in range(1, T)]                                 # one (m, l, a) per split point
    check("merged a / l at every split vs reference.softmax_attention", np.stack([a / l for _, l, a in merged]),
          np.tile(expected, (T - 1, 1)), REFERENCE_BUDGET)
    assert all(m == scores.max() for m, _, _ in merged), "a merged m is not the row's maximum"

exercise("Exercise 4", checks_4)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
def merge(state_1, state_2):
    """(m, l, a) over two blocks of keys from each block's (m, l, a): m a scalar, l a scalar, a of shape (d,)."""
    (m_1, l_1, a_1), (m_2, l_2, a_2) = state_1, state_2
    m = max(m_1, m_2)
    r_1, r_2 = np.exp(m_1 - m), np.exp(m_2 - m)                     # each <= 1; adding l_1 + l_2 unscaled is wrong
    return m, r_1 * l_1 + r_2 * l_2, r_1 * a_1 + r_2 * a_2

exercise("Exercise 4", checks_4)

# %% [markdown]
# ## Appendix: the production path against the reference
#
# The notebook's lesson ends above. This appendix runs the kernels a model uses on the same kind of inputs, and
# checks them against the float64 reference (nbval checks these cells like the others).
#
# [`kernels.attention.attention`](../kernels/attention/__init__.py) takes `(B, H, T, d)` tensors. Backend `"torch"` calls
# torch's scaled dot-product attention; backend `"triton"` is a flash-style kernel: each program owns a tile of
# query rows and streams over key tiles with exactly the online update of section 5 (here under the Triton
# interpreter on the CPU, so the shapes are small). $T = 40$ on purpose: past one 32-token tile, so a program
# streams over more than one key tile (and the causal band crosses a tile), and not a multiple of the tile size. Both
# are run on the same inputs and compared with the float64 reference, causal and not, fp32 and fp16, and with scores
# past float32's overflow point.

# %%
B, H, T, d = 2, 2, 40, 16
q64, k64, v64 = (rng.standard_normal((B, H, T, d)) for _ in range(3))   # float64, (B, H, T, d)
BACKENDS = ("torch", "triton")

def run(backend, q, k, v, dtype=torch.float32, **options):
    # The kernel on (q, k, v) cast to dtype; returns the output as a tensor.
    q, k, v = (torch.tensor(x, dtype=dtype) for x in (q, k, v))
    return attention(q, k, v, backend=backend, **options)

def fp16_rounded(x):
    # What an fp16 input holds: the reference is computed on these values.
    return x.astype(np.float16).astype(np.float64)


# %% tags=["nbval-check-output"]
for backend in BACKENDS:
    check(f"{backend} fp32 causal", run(backend, q64, k64, v64),
          ref.softmax_attention(q64, k64, v64), FP32_BUDGET)
    check(f"{backend} fp32 not causal", run(backend, q64, k64, v64, causal=False),
          ref.softmax_attention(q64, k64, v64, causal=False), FP32_BUDGET)
    check(f"{backend} fp32 scores up to ~200 (past e^88.7)", run(backend, 60 * q64, k64, v64),
          ref.softmax_attention(60 * q64, k64, v64), FP32_BUDGET)
    q16, k16, v16 = (fp16_rounded(x) for x in (q64, k64, v64))
    check(f"{backend} fp16 causal", run(backend, q16, k16, v16, dtype=torch.float16),
          ref.softmax_attention(q16, k16, v16), FP16_BUDGET)


# %% [markdown]
# **Gradients.** The reference is NumPy and has no backward, so the float64 truth for the gradients is torch's
# autograd through the matrix form of section 1, written in torch (its forward is first checked against the
# reference). Both backends' fp32 gradients of $\sum O \odot G$, for a random upstream gradient $G$, must match it.

# %%
def matrix_form_torch(q, k, v):
    # Section 1 in torch: softmax(q k^T / sqrt(d) + M) v, for autograd in float64.
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    future = torch.ones(s.shape[-2:], dtype=torch.bool).triu(diagonal=1)
    return torch.softmax(s.masked_fill(future, float("-inf")), dim=-1) @ v

G = rng.standard_normal((B, H, T, d))                         # upstream gradient dLoss/dO

def gradients(fn, dtype):
    # d(sum(fn(q, k, v) * G)) / d(q, k, v), computed in dtype.
    leaves = [torch.tensor(x, dtype=dtype, requires_grad=True) for x in (q64, k64, v64)]
    fn(*leaves).backward(torch.tensor(G, dtype=dtype))
    return [x.grad for x in leaves]

expected_grads = gradients(matrix_form_torch, torch.float64)
backend_grads = {b: gradients(lambda q, k, v: attention(q, k, v, backend=b), torch.float32)
                 for b in BACKENDS}

# %% tags=["nbval-check-output"]
check("matrix form in torch float64 vs reference",
      matrix_form_torch(*map(torch.tensor, (q64, k64, v64))),
      ref.softmax_attention(q64, k64, v64), REFERENCE_BUDGET)
for backend in BACKENDS:
    for name, got, want in zip(("dq", "dk", "dv"), backend_grads[backend], expected_grads):
        check(f"{backend} fp32 {name}", got, want, FP32_BUDGET)

# %%
# The errors themselves (this cell is not compared: the numbers depend on the machine).
for backend in BACKENDS:
    err = rel_rms(run(backend, q64, k64, v64), ref.softmax_attention(q64, k64, v64))
    grad_err = max(rel_rms(g, e) for g, e in zip(backend_grads[backend], expected_grads))
    print(f"{backend:6s} fp32: output rel. RMS error {err:.1e}, worst gradient {grad_err:.1e}")
