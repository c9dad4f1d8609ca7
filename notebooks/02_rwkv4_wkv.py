# %% [markdown]
# # 02 · RWKV-4's WKV: from attention sums to a stable recurrence
#
# RWKV-4 keeps the weighted average of softmax attention but changes what weights it: instead of a query-key match
# $q_i \cdot k_j$, each channel weights a past token by a decay that depends only on how far back it is, times
# $e^{k_j}$. This notebook follows the Hugging Face page's derivation step by step: the sums with
# $e^{W_{i-j} + K_j}$, the decay profile that $w$ gives, the numerator/denominator recurrence that makes RWKV-4 an
# RNN, why that recurrence overflows (shown, in float64 and in float32), and the max-tracked recurrence that fixes
# it, including the page's misprinted output step. Then the torch path and the Triton kernel run on the same inputs
# and are checked against the float64 reference: outputs, states, a sequence fed in two pieces, huge keys, fp16, and
# gradients.
#
# **Sources.** The "Rwkv attention and the recurrent formulas" section of the Hugging Face RWKV page,
# https://huggingface.co/docs/transformers/model_doc/rwkv (the order followed here); the RWKV paper, arXiv:2305.13048,
# https://arxiv.org/abs/2305.13048; the RWKV/Mamba study notes in the source material (the same operator with the
# opposite sign convention for $w$). Errata 1 and 2 of [`reference/ERRATA.md`](../reference/ERRATA.md) are shown
# below.
#
# **Code used.** [`reference/wkv4.py`](../reference/wkv4.py): `wkv4_quadratic` (the definition), `wkv4_recurrent`
# (the numerator/denominator recurrence), `wkv4` (the max-tracked recurrence) ·
# [`kernels/wkv4.py`](../kernels/wkv4.py): `wkv4` (backend `"torch"`: a chunked form; backend `"triton"`: the
# max-tracked recurrence in a kernel, forward and backward) · [`kernels/testing.py`](../kernels/testing.py): `check`
# and the error budgets.

# %%
import seqmix

MODE = seqmix.use_interpreter_without_gpu()    # without a GPU: TRITON_INTERPRET=1, before triton is imported

import matplotlib.pyplot as plt
import numpy as np
import torch

from seqmix.kernels.testing import FP16_BUDGET, FP32_BUDGET, REFERENCE_BUDGET, check, rel_rms
from seqmix.kernels.wkv4 import wkv4 as wkv4_kernel
from seqmix.reference import wkv4 as ref

rng = np.random.default_rng(0)
torch.manual_seed(0)
print("Triton kernels run on:", MODE)

# %% [markdown]
# ## 1. From the attention sums to $e^{W_{i-j} + K_j}$
#
# Notebook 01 ended with causal attention as one weighted average per position,
# $O_i = \sum_{j \le i} e^{s_{ij}} v_j / \sum_{j \le i} e^{s_{ij}}$ with $s_{ij} = q_i \cdot k_j / \sqrt d$. RWKV-4
# keeps the average and replaces the score. Per channel (everything below is elementwise over the $C$ channels: no
# dot product), the page writes
#
# $$O_i = \sigma(R_i)\,\frac{\sum_{j=1}^{i} e^{W_{i-j} + K_j}\, V_j}{\sum_{j=1}^{i} e^{W_{i-j} + K_j}}, \qquad
# W_0 = u, \quad W_n = (n - 1)\,w \ \text{ for } n \ge 1 .$$
#
# The score $W_{i-j} + K_j$ depends on the query's position only through the distance $n = i - j$: the current token
# gets a learned bonus $u$ (`time_first`), the token one step back gets $W_1 = 0$, and each further step multiplies
# the weight by $e^{w}$. With $w = -e^{\tau} \le 0$ ($\tau$ is the checkpoint's `time_decay`) this is a decay. The receptance gate
# $\sigma(R_i)$ is applied afterwards by the time-mix block (notebook 03); the operator called WKV is the fraction.
# In the reference's 0-based notation: $\mathrm{wkv}_t = \dfrac{\sum_{i<t} e^{(t-1-i)w + k_i} v_i + e^{u + k_t} v_t}
# {\sum_{i<t} e^{(t-1-i)w + k_i} + e^{u + k_t}}$.

# %%
B, T, C = 2, 12, 4
time_decay = rng.standard_normal(C)                # (C,) the parameter a checkpoint stores
w = -np.exp(time_decay)                            # (C,) per-step log decay, <= 0
u = rng.standard_normal(C)                         # (C,) bonus of the current token (time_first)
k, v = rng.standard_normal((B, T, C)), rng.standard_normal((B, T, C))

def W(n):
    # The page's W_n for a key n steps back: u for the current token, (n - 1) w before it.
    return u if n == 0 else (n - 1) * w

wkv_sums = np.empty((B, T, C))
for i in range(T):
    e = np.exp(np.stack([W(i - j) + k[:, j] for j in range(i + 1)], axis=1))   # (B, i + 1, C)
    wkv_sums[:, i] = (e * v[:, : i + 1]).sum(axis=1) / e.sum(axis=1)

# %% tags=["nbval-check-output"]
check("the sums vs reference.wkv4_quadratic", wkv_sums, ref.wkv4_quadratic(w, u, k, v), REFERENCE_BUDGET)
lowest, highest = np.minimum.accumulate(v, axis=1), np.maximum.accumulate(v, axis=1)   # (B, T, C) over i <= t
print("each output lies between the smallest and largest value seen so far (up to rounding):",
      bool(((wkv_sums >= lowest - 1e-12) & (wkv_sums <= highest + 1e-12)).all()))

# %% [markdown]
# **The sign of $w$ (erratum 2).** The RWKV/Mamba study notes write the weight of a past token as
# $e^{-(t-1-i)w + k_i}$, with $w \ge 0$; the page (and this project) write $e^{(t-1-i)w + k_i}$ with $w \le 0$. They
# describe the same decay with opposite signs of $w$: the notes' $w$ is $e^{\tau}$, the page's is
# $-e^{\tau}$ ($\tau$ = `time_decay`). Mixing the two conventions turns the decay into growth, so the reference refuses a
# positive $w$.

# %%
w_notes = np.exp(time_decay)                       # the notes' convention: w >= 0, weight e^{-(t-1-i) w + k_i}
T_idx, I_idx = np.arange(T)[:, None], np.arange(T)[None, :]
lag = np.where(I_idx < T_idx, T_idx - 1 - I_idx, 0)[..., None]                # (T, T, 1) steps t-1-i
z_notes = np.where((I_idx < T_idx)[..., None], -lag * w_notes + k[:, None], u + k[:, None])   # (B, T, T, C)
e_notes = np.where((I_idx <= T_idx)[..., None], np.exp(z_notes), 0.0)
wkv_notes = (e_notes * v[:, None]).sum(axis=2) / e_notes.sum(axis=2)

try:
    ref.wkv4(-w, u, k, v)
except ValueError as error:
    print("reference.wkv4 with the notes' (positive) w:", error)

# %% tags=["nbval-check-output"]
check("the notes' formula with w_notes = -w vs the page's", wkv_notes, wkv_sums, REFERENCE_BUDGET)
print("the notes' weights e^{-n w} with the page's w (< 0) grow with the distance n:",
      bool(np.all(np.diff(np.exp(-np.arange(5)[:, None] * w), axis=0) > 0)))

# %% [markdown]
# **The decay profile.** A key $n \ge 1$ steps back is weighted $e^{(n-1)w}$ (times its own $e^{k}$); the current
# token $e^{u}$. On a log scale the profile is a straight line of slope $w$: $\tau$ (`time_decay`) sets, per
# channel, how long the channel remembers, from a few tokens to thousands. The current token's bonus $u$ sits apart
# from the line.

# %%
n = np.arange(0, 65)                                # steps back from the current token
bonus = 0.5                                         # an example u
fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
for td in (-5.0, -3.0, -1.0, 0.0, 1.0, 2.0):
    w_c = -np.exp(td)
    weight = np.where(n == 0, np.exp(bonus), np.exp(np.maximum(n - 1, 0) * w_c))
    for ax in axes:
        ax.plot(n, weight, marker=".", markersize=3, label=f"time_decay = {td:g}  (w = {w_c:.3g})")
axes[1].set_yscale("log")
axes[1].set_ylim(1e-12, 3)
for ax, scale in zip(axes, ("linear", "log")):
    ax.set_xlabel("steps back from the current token, n = t - i")
    ax.set_ylabel(r"weight $e^{W_n}$  ($W_0 = u = 0.5$, $W_n = (n-1)\,w$)")
    ax.set_title(f"RWKV-4 decay profile ({scale} scale)")
axes[0].legend(fontsize=8)
plt.show()


# %% [markdown]
# ## 2. The numerator/denominator recurrence
#
# Split the numerator into the current token and the past, $N_t = e^{u + k_t} v_t + \hat N_t$ with
# $\hat N_t = \sum_{i<t} e^{(t-1-i)w + k_i} v_i$, and likewise $D_t = e^{u + k_t} + \hat D_t$. Going from $t$ to
# $t+1$, every past term gets one more factor $e^{w}$ and token $t$ joins with exponent $0 \cdot w + k_t$:
#
# $$\hat N_{t+1} = e^{w}\,\hat N_t + e^{k_t} v_t, \qquad \hat D_{t+1} = e^{w}\,\hat D_t + e^{k_t}, \qquad
# \hat N_0 = \hat D_0 = 0, \qquad \mathrm{wkv}_t = \frac{\hat N_t + e^{u + k_t} v_t}{\hat D_t + e^{u + k_t}} .$$
#
# Two numbers per channel carry the whole past: RWKV-4 runs as an RNN at inference, with $O(1)$ work per token, and
# a sequence can be fed in pieces if the state $(\hat N, \hat D)$ is passed along.

# %%
def wkv_num_den(w, u, k, v):
    # The recurrence as written; computes in the dtype of its inputs (float64 here, float32 below).
    num, den = np.zeros_like(k[:, 0]), np.zeros_like(k[:, 0])          # (B, C) N^_0, D^_0
    out = np.empty_like(k)
    for t in range(k.shape[1]):
        bonus = np.exp(u + k[:, t])                                      # e^{u + k_t}
        out[:, t] = (num + bonus * v[:, t]) / (den + bonus)
        num = np.exp(w) * num + np.exp(k[:, t]) * v[:, t]
        den = np.exp(w) * den + np.exp(k[:, t])
    return out

wkv_rnn = wkv_num_den(w, u, k, v)
y_first, state = ref.wkv4_recurrent(w, u, k[:, :5], v[:, :5])              # the first 5 tokens, then the rest
y_rest, _ = ref.wkv4_recurrent(w, u, k[:, 5:], v[:, 5:], state=state)

# %% tags=["nbval-check-output"]
for what, actual, expected in (
    ("N/D recurrence vs the sums", wkv_rnn, wkv_sums),
    ("N/D recurrence vs reference.wkv4_recurrent", wkv_rnn, ref.wkv4_recurrent(w, u, k, v)[0]),
    ("reference.wkv4_recurrent fed in two pieces vs whole", np.concatenate([y_first, y_rest], axis=1), wkv_rnn),
):
    check(what, actual, expected, REFERENCE_BUDGET)

# %% [markdown]
# ## 3. Why it overflows
#
# The output is a weighted average of values, always between the smallest and largest $v$; but the recurrence
# stores the weights themselves. $e^{k_t}$ is infinite once $k_t > 709.8$ in float64, and once $k_t > 88.7$ in
# float32, the precision kernels run in; after that $\hat N$ and $\hat D$ are $\infty$ (or $\infty - \infty$) and the
# output is $\infty/\infty = $ NaN, for every later token too. Keys are the output of a linear layer: nothing bounds
# them. (Slow decay makes it worse: with $w$ near 0, $\hat D_t$ sums $e^{k_i}$ over the whole past.)
#
# Yet shifting every key of a channel by a constant $c$ changes nothing: numerator and denominator both gain the
# factor $e^{c}$,
#
# $$\mathrm{wkv}(k + c) = \mathrm{wkv}(k) ,$$
#
# so for keys shifted by 700 the exact answer is known, and the recurrence fails on it.

# %%
with np.errstate(over="ignore", invalid="ignore"):
    big64 = wkv_num_den(w, u, k + 710.0, v)                                       # float64, keys ~710
    big32 = wkv_num_den(*(x.astype(np.float32) for x in (w, u, k + 90.0, v)))      # float32, keys ~90
    fine32 = wkv_num_den(*(x.astype(np.float32) for x in (w, u, k, v)))            # float32, ordinary keys
for name, out in (("float64, keys + 710", big64), ("float32, keys + 90", big32), ("float32, ordinary keys", fine32)):
    bad = ~np.isfinite(out)
    print(f"{name:24s}: {bad.sum():3d} of {out.size} outputs are NaN or inf")
print("the float32 recurrence on ordinary keys, rel. error:", f"{rel_rms(fine32, wkv_sums):.1e}")


# %% [markdown]
# ## 4. The max-tracked (stable) recurrence
#
# The cure is the one of notebook 01: divide by the largest exponential. Keep, besides the state, the largest
# exponent $M_t$ among the terms of $\hat N_t$, and store $\tilde N_t = e^{-M_t}\hat N_t$,
# $\tilde D_t = e^{-M_t}\hat D_t$ (the page's notation). Every number stored is then at most about 1 in size.
#
# *Update.* $\hat N_{t+1} = e^{w}\hat N_t + e^{k_t} v_t = e^{w + M_t}\tilde N_t + e^{k_t} v_t$. Take
# $q = \max(w + M_t, k_t)$, the larger of the two exponents, as the new maximum and divide by $e^{q}$:
#
# $$\tilde N_{t+1} = e^{w + M_t - q}\,\tilde N_t + e^{k_t - q}\, v_t, \qquad
# \tilde D_{t+1} = e^{w + M_t - q}\,\tilde D_t + e^{k_t - q}, \qquad M_{t+1} = q .$$
#
# *Output.* $N_t = e^{u + k_t} v_t + e^{M_t}\tilde N_t$. With $q = \max(u + k_t, M_t)$, multiply numerator and
# denominator by $e^{-q}$ (the ratio does not change):
#
# $$\mathrm{wkv}_t = \frac{e^{u + k_t - q}\, v_t + e^{M_t - q}\,\tilde N_t}{e^{u + k_t - q} + e^{M_t - q}\,\tilde D_t} .$$
#
# Every exponent is $\le 0$ in both steps, and one of the two terms is exactly $e^0 = 1$: no overflow, and no
# denominator that underflows to zero. Before the first token $\tilde N = \tilde D = 0$ and $M = -10^{38}$ (the finite
# "minus infinity" of Hugging Face's code, so that $e^{M - q} = 0$ without $\infty - \infty$).

# %%
def output_step(num, den, mx, k_t, v_t):
    # wkv_t from the stable state (num = N~, den = D~, mx = M) and the current token, all exponents <= 0.
    q = np.maximum(u + k_t, mx)
    a, b = np.exp(mx - q), np.exp(u + k_t - q)
    return (a * num + b * v_t) / (a * den + b)

def wkv_stable(w, u, k, v, output=output_step):
    num, den, mx = np.zeros_like(k[:, 0]), np.zeros_like(k[:, 0]), np.full_like(k[:, 0], -1e38)  # (B, C) each
    out = np.empty_like(k)
    for t in range(k.shape[1]):
        out[:, t] = output(num, den, mx, k[:, t], v[:, t])
        q = np.maximum(w + mx, k[:, t])                                   # the update step
        a, b = np.exp(w + mx - q), np.exp(k[:, t] - q)
        num, den, mx = a * num + b * v[:, t], a * den + b, q
    return out


# %% tags=["nbval-check-output"]
for what, actual, expected in (
    ("stable recurrence vs the sums", wkv_stable(w, u, k, v), wkv_sums),
    ("stable recurrence vs reference.wkv4", wkv_stable(w, u, k, v), ref.wkv4(w, u, k, v)[0]),
    ("stable recurrence, keys + 700 vs the sums on the unshifted keys", wkv_stable(w, u, k + 700.0, v), wkv_sums),
    ("reference.wkv4, keys + 700 vs the sums on the unshifted keys", ref.wkv4(w, u, k + 700.0, v)[0], wkv_sums),
):
    check(what, actual, expected, REFERENCE_BUDGET)


# %% [markdown]
# **The page's output step (erratum 1).** The page prints the output step as
# $N_i = e^{u + K_i - q} V_i + e^{M_i}\,\tilde N_i$ (and the same for $D_i$), with $q = \max(u + K_i, M_i)$. Its two
# terms then carry different scales: the first is the true term times $e^{-q}$, the second the true $\hat N_i$
# itself. The ratio is not the WKV unless $q = 0$. With $e^{M_i - q}$ in place of $e^{M_i}$ both terms are the true
# ones times $e^{-q}$, which cancels. Numerically, as printed:

# %%
def output_step_as_printed(num, den, mx, k_t, v_t):
    q = np.maximum(u + k_t, mx)
    a, b = np.exp(mx), np.exp(u + k_t - q)                               # e^{M} where e^{M - q} is right
    return (a * num + b * v_t) / (a * den + b)

printed_error = rel_rms(wkv_stable(w, u, k, v, output=output_step_as_printed), wkv_sums)
corrected_error = rel_rms(wkv_stable(w, u, k, v), wkv_sums)
print(f"output step as printed: rel. RMS error {printed_error:.2f};  corrected: {corrected_error:.1e}")
assert printed_error > 0.05 and corrected_error <= REFERENCE_BUDGET

# %% [markdown]
# ## 5. The torch path and the Triton kernel against the reference
#
# [`kernels.wkv4.wkv4`](../kernels/wkv4.py) takes `w, u` of shape `(C,)` and `k, v` of shape `(B, T, C)`, and
# returns `(wkv, (num, den, max))` with the state in Hugging Face's layout (the $\tilde N, \tilde D, M$ above,
# fp32). Backend `"torch"` cuts time into chunks, runs the recurrence over the offsets of all chunks at once
# (each chunk scaled by its largest key) and carries the state from chunk to chunk; backend `"triton"`
# runs the max-tracked recurrence of section 4 in a kernel (here under the Triton interpreter on the CPU, so the
# shapes are small). Both run on the same inputs: outputs and final states, a sequence fed in two pieces, keys past
# float32's overflow point, and fp16.
#
# A third implementation, backend `"c"` ([`kernels/native.c`](../kernels/native.c)), is a compiled C loop that
# walks time once: the path for inference on a CPU. It is forward only (no gradients), and `backend=None` takes it
# on a CPU when no gradient is wanted. The forward checks below run it too, against the same reference and budgets.

# %%
B, T, C = 2, 24, 8
w64 = -np.exp(rng.standard_normal(C))
u64, k64, v64 = rng.standard_normal(C), rng.standard_normal((B, T, C)), rng.standard_normal((B, T, C))
BACKENDS = ("torch", "triton")
FORWARD_BACKENDS = BACKENDS + ("c",)                                      # "c": the C loop, forward only

def run(backend, w, u, k, v, dtype=torch.float32, state=None):
    # The kernel on float64 arrays cast to dtype; returns (wkv, (num, den, max)) as tensors.
    return wkv4_kernel(*(torch.tensor(x, dtype=dtype) for x in (w, u, k, v)), state=state, backend=backend)

def fp16_rounded(x):
    # What an fp16 input holds: the reference is computed on these values.
    return x.astype(np.float16).astype(np.float64)

expected, expected_state = ref.wkv4(w64, u64, k64, v64)
split = 10                                                                 # feed 10 tokens, then the other 14

# %% tags=["nbval-check-output"]
for backend in FORWARD_BACKENDS:
    y, state = run(backend, w64, u64, k64, v64)
    check(f"{backend} fp32 wkv", y, expected, FP32_BUDGET)
    for name, got, want in zip(("num", "den", "max"), state, expected_state):
        check(f"{backend} fp32 state {name}", got, want, FP32_BUDGET)
    y1, state1 = run(backend, w64, u64, k64[:, :split], v64[:, :split])
    y2, _ = run(backend, w64, u64, k64[:, split:], v64[:, split:], state=state1)
    check(f"{backend} fp32 fed in two pieces", torch.cat([y1, y2], dim=1), expected, FP32_BUDGET)
    check(f"{backend} fp32 keys + 100 (e^k past float32)", run(backend, w64, u64, k64 + 100.0, v64)[0],
          expected, FP32_BUDGET)
    w16, u16, k16, v16 = (fp16_rounded(x) for x in (w64, u64, k64, v64))
    check(f"{backend} fp16 wkv", run(backend, w16, u16, k16, v16, dtype=torch.float16)[0],
          ref.wkv4(w16, u16, k16, v16)[0], FP16_BUDGET)


# %% [markdown]
# **Gradients.** The float64 truth for the gradients is autograd through the definition written in torch: the
# scores $W_{t-i} + k_i$ in a $(T \times T)$ matrix per channel, a causal softmax over $i$, times $v$. That is the
# sums of section 1 seen as softmax attention (the forward is checked against the reference first). Both backends'
# fp32 gradients of $\sum \mathrm{wkv} \odot G$ with respect to $w, u, k, v$ must match it.

# %%
def definition_torch(w, u, k, v):
    # wkv as a causal softmax over the scores (t-1-i) w + k_i (i < t) and u + k_t (i = t); float64 autograd.
    T = k.shape[1]
    t, i = torch.arange(T)[:, None], torch.arange(T)[None, :]
    past = (t - 1 - i).clamp(min=0)[..., None] * w + k[:, None]            # (B, T, T, C)
    scores = torch.where((i == t)[..., None], u + k[:, None], past)
    scores = scores.masked_fill((i > t)[..., None], float("-inf"))          # causal
    return (torch.softmax(scores, dim=2) * v[:, None]).sum(dim=2)          # (B, T, C)

G = rng.standard_normal((B, T, C))                                          # upstream gradient dLoss/dwkv

def gradients(fn, dtype):
    leaves = [torch.tensor(x, dtype=dtype, requires_grad=True) for x in (w64, u64, k64, v64)]
    fn(*leaves).backward(torch.tensor(G, dtype=dtype))
    return [x.grad for x in leaves]

expected_grads = gradients(definition_torch, torch.float64)
backend_grads = {b: gradients(lambda *a: wkv4_kernel(*a, backend=b)[0], torch.float32) for b in BACKENDS}

# %% tags=["nbval-check-output"]
check("definition in torch float64 vs reference", definition_torch(*map(torch.tensor, (w64, u64, k64, v64))),
      expected, REFERENCE_BUDGET)
for backend in BACKENDS:
    for name, got, want in zip(("dw", "du", "dk", "dv"), backend_grads[backend], expected_grads):
        check(f"{backend} fp32 {name}", got, want, FP32_BUDGET)

# %%
# The errors themselves (this cell is not compared: the numbers depend on the machine).
for backend in FORWARD_BACKENDS:
    line = f"{backend:6s} fp32: wkv rel. RMS error {rel_rms(run(backend, w64, u64, k64, v64)[0], expected):.1e}"
    if backend in backend_grads:                                           # none for "c": forward only
        line += f", worst gradient {max(rel_rms(g, e) for g, e in zip(backend_grads[backend], expected_grads)):.1e}"
    print(line)

# %% [markdown]
# ## Summary
#
# - The page's sums, the notes' sums (with $w_\text{notes} = -w$), the numerator/denominator recurrence and the
#   max-tracked recurrence are one function; they agree to float64 rounding with `reference/wkv4.py`.
# - The plain recurrence stores $e^{k}$ and overflows for keys past 709.8 (float64) or 88.7 (float32); the
#   max-tracked one stores everything relative to the largest exponent and is exact for any keys, since
#   $\mathrm{wkv}(k + c) = \mathrm{wkv}(k)$.
# - The page's output step needs $e^{M_i - q}$, not $e^{M_i}$ (erratum 1).
# - The torch path and the Triton kernel match the reference in fp32 and fp16: outputs, states, pieces, huge keys
#   and gradients.
#
# Next: notebook 03 puts this operator into the RWKV-4 block, between token shift, the receptance gate and channel
# mixing.
