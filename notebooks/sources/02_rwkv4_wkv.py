# %% [markdown]
# # 02 · RWKV-4's WKV: from attention sums to a stable recurrence
#
# RWKV-4 keeps the weighted average of softmax attention but changes what weights it: instead of a query-key match
# $q_i \cdot k_j$, each channel weights a past token by a decay that depends only on how far back it is, times
# $e^{k_j}$. This notebook follows the Hugging Face page's derivation step by step: the sums with
# $e^{W_{i-j} + K_j}$, the decay profile that $w$ gives, the numerator/denominator recurrence that makes RWKV-4 an
# RNN, why that recurrence overflows (shown, in float64 and in float32), and the max-tracked recurrence that fixes
# it, including the page's misprinted output step and the starting value it leaves out, and how the recurrence's
# backward is derived (the same recurrence, transposed, run backward in time). Exercises close the notebook; an appendix runs the production path (the torch path, the Triton kernel and the C loop) on the same
# inputs against the float64 reference: outputs, states, a sequence fed in two pieces, huge keys, fp16, gradients.
#
# **Sources.** The "Rwkv attention and the recurrent formulas" section of the Hugging Face RWKV page,
# https://huggingface.co/docs/transformers/model_doc/rwkv (the order followed here); the RWKV paper, arXiv:2305.13048,
# https://arxiv.org/abs/2305.13048; the RWKV/Mamba study notes in the source material (the same operator with the
# opposite sign convention for $w$). Errata 1, 2, 21 and 22 of [`reference/ERRATA.md`](../reference/ERRATA.md) are
# shown below.
#
# **Code used.** [`reference/wkv4.py`](../reference/wkv4.py): `wkv4_quadratic` (the definition), `wkv4_recurrent`
# (the numerator/denominator recurrence), `wkv4` (the max-tracked recurrence) ·
# [`kernels/wkv4/`](../kernels/wkv4/__init__.py): `wkv4` (backend `"torch"`: a chunked form; backend `"triton"`: the
# max-tracked recurrence in a kernel, forward and backward; backend `"c"`: a C loop, forward and backward) ·
# [`kernels/testing.py`](../kernels/testing.py): `check` and the error budgets.
#
# **Notation.** $w$, $k$, $u$, $D$, $N$ and $M$ mean other things in other notebooks: see the
# [notation crosswalk](notation.md).

# %%
import seqmix

MODE = seqmix.use_interpreter_without_gpu()    # no GPU: TRITON_INTERPRET=1 before triton

import matplotlib.pyplot as plt
import numpy as np
import torch

from seqmix.kernels.testing import FP16_BUDGET, FP32_BUDGET, REFERENCE_BUDGET, check, exercise, rel_rms
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
# The page calls $W$ "a new vector that represents the position". It is indexed by the distance $n = i - j$, not by
# the position, and it has one entry per channel at each distance. The current token gets a learned bonus $u$
# (`time_first`), the token one step back gets $W_1 = 0$, and each further step multiplies the weight by $e^{w}$.
# The page says $u$ and $w$ are "called in the code `time_first` and `time_decay`". That holds for $u$ only. The
# checkpoint stores $\tau$ = `time_decay`, and the code uses $w = -e^{\tau} < 0$ (erratum 21). So $w$ is strictly
# negative, and the weights decay. The receptance gate $\sigma(R_i)$ is applied afterwards by the time-mix block
# (notebook 03); the operator called WKV is the fraction. In the reference's 0-based notation:
#
# $$\mathrm{wkv}_t = \frac{\sum_{i<t} e^{(t-1-i)w + k_i} v_i + e^{u + k_t} v_t}{\sum_{i<t} e^{(t-1-i)w + k_i}
# + e^{u + k_t}} .$$

# %%
B, T, C = 2, 12, 4
time_decay = rng.standard_normal(C)                # (C,) tau, the parameter a checkpoint stores
w = -np.exp(time_decay)                            # (C,) per-step log decay, < 0
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
check("the sums vs reference.wkv4_quadratic", wkv_sums, ref.wkv4_quadratic(w, u, k, v),
      REFERENCE_BUDGET)
lowest = np.minimum.accumulate(v, axis=1)          # (B, T, C) the smallest value over i <= t
highest = np.maximum.accumulate(v, axis=1)
inside = (wkv_sums >= lowest - 1e-12) & (wkv_sums <= highest + 1e-12)
print("each output lies between the smallest and largest value seen so far:", bool(inside.all()))

# %% [markdown]
# **The sign of $w$ (erratum 2).** The RWKV/Mamba study notes write the weight of a past token as
# $e^{-(t-1-i)w + k_i}$, with $w > 0$; the page's formula (and this project) write $e^{(t-1-i)w + k_i}$ with
# $w < 0$. They describe the same decay with opposite signs of $w$: the notes' $w$ is $e^{\tau}$, the code's is
# $-e^{\tau}$ ($\tau$ = `time_decay`). Mixing the two conventions turns the decay into growth, so the reference
# refuses a positive $w$. The notes' sums, written with their own sign:

# %%
w_notes = np.exp(time_decay)                  # the notes' convention: w > 0, e^{-(t-1-i) w + k_i}
t_idx, i_idx = np.arange(T)[:, None], np.arange(T)[None, :]
past = (i_idx < t_idx)[..., None]                                              # (T, T, 1) i < t
lag = np.where(i_idx < t_idx, t_idx - 1 - i_idx, 0)[..., None]                 # (T, T, 1) t-1-i
z_notes = np.where(past, -lag * w_notes + k[:, None], u + k[:, None])          # (B, T, T, C)
e_notes = np.where((i_idx <= t_idx)[..., None], np.exp(z_notes), 0.0)
wkv_notes = (e_notes * v[:, None]).sum(axis=2) / e_notes.sum(axis=2)

try:
    ref.wkv4(-w, u, k, v)
except ValueError as error:
    print("reference.wkv4 with the notes' (positive) w:", error)

# %% tags=["nbval-check-output"]
check("the notes' formula with w_notes = -w vs the page's", wkv_notes, wkv_sums, REFERENCE_BUDGET)
grows = np.diff(np.exp(-np.arange(5)[:, None] * w), axis=0) > 0
print("the notes' weights e^{-n w} with the page's w (< 0) grow with the distance n:",
      bool(grows.all()))

# %% [markdown]
# **The decay profile.** A key $n \ge 1$ steps back is weighted $e^{(n-1)w}$ (times its own $e^{k}$); the current
# token $e^{u}$. On a log scale the profile is a straight line of slope $w$: $\tau$ (`time_decay`) sets, per
# channel, how long the channel remembers: its half-life, $\ln 2 / |w|$ steps, runs from a tenth of a token
# ($\tau = 2$, $w = -7.4$) to about a hundred ($\tau = -5$) over the plotted range, which is also RWKV-4's
# initialization range; longer memories need $\tau$ below $-5$ (a thousand steps, $\tau \approx -7.3$). The current
# token's bonus $e^u$ is not on that line: it is drawn as its own marker at $n = 0$.

# %%
n = np.arange(1, 65)                                # steps back from the current token, n >= 1
bonus = 0.5                                         # an example u
fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
for td in (-5.0, -3.0, -1.0, 0.0, 1.0, 2.0):
    w_c = -np.exp(td)
    for ax in axes:
        ax.plot(n, np.exp((n - 1) * w_c), marker=".", markersize=3,
                label=f"time_decay = {td:g}  (w = {w_c:.3g})")
for ax in axes:
    ax.plot([0], [np.exp(bonus)], "k*", markersize=11, label=f"current token: $e^u$, u = {bonus}")
    ax.set_xlabel("steps back from the current token, n = t - i")
    ax.set_ylabel(r"weight $e^{W_n}$ ($W_n = (n-1)\,w$)")
axes[1].set_yscale("log")
axes[1].set_ylim(1e-12, 3)
axes[0].set_title("RWKV-4 decay profile (linear scale)")
axes[1].set_title("log scale: straight lines of slope w")
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
#
# **Where this sits in the family.** Every recurrent mechanism of this series is one recurrence,
# $S_t = S_{t-1} G_t + v_t k_t^\top$, $y_t = S_t q_t$, with a matrix state and a different transition $G_t$
# (notebook 04 opens with the table). RWKV-4 is its simplest decaying rung. Take the key vector $e^{k_t}$
# (elementwise) and the transition $G = \mathrm{diag}(e^{w})$, constant in time: $\hat N$ is the *diagonal* of $S$,
# channel $c$ keeping only value $c$ times key $c$. There is no query: channel $c$'s output reads its own entry, so
# it cannot choose among the keys it stored (why recall needs width, notebook 09). The denominator $\hat D$ is the
# same recurrence with every value 1, and the bonus $u$ adds the current token outside the state. RWKV-7 (04, 05)
# keeps the whole matrix and a query.

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
y_first, state = ref.wkv4_recurrent(w, u, k[:, :5], v[:, :5])      # the first 5 tokens,
y_rest, _ = ref.wkv4_recurrent(w, u, k[:, 5:], v[:, 5:], state=state)   # then the rest
y_pieces = np.concatenate([y_first, y_rest], axis=1)

# %% tags=["nbval-check-output"]
for what, actual, expected in (
    ("N/D recurrence vs the sums", wkv_rnn, wkv_sums),
    ("N/D recurrence vs reference.wkv4_recurrent", wkv_rnn, ref.wkv4_recurrent(w, u, k, v)[0]),
    ("reference.wkv4_recurrent fed in two pieces vs whole", y_pieces, wkv_rnn),
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
def in_float32(*arrays):
    return [x.astype(np.float32) for x in arrays]

with np.errstate(over="ignore", invalid="ignore"):
    runs = {"float64, keys + 710": wkv_num_den(w, u, k + 710.0, v),
            "float32, keys + 90": wkv_num_den(*in_float32(w, u, k + 90.0, v)),
            "float32, ordinary keys": wkv_num_den(*in_float32(w, u, k, v))}
for name, out in runs.items():
    print(f"{name:24s}: {(~np.isfinite(out)).sum():3d} of {out.size} outputs are NaN or inf")
fine32_error = rel_rms(runs["float32, ordinary keys"], wkv_sums)
print(f"the float32 recurrence on ordinary keys, rel. error: {fine32_error:.1e}")


# %% [markdown]
# ## 4. The max-tracked (stable) recurrence
#
# The cure is the one of notebook 01: divide by the largest exponential. Keep, besides the state, the largest
# exponent $M_t$ among the terms of $\hat N_t$, and store $\tilde N_t = e^{-M_t}\hat N_t$,
# $\tilde D_t = e^{-M_t}\hat D_t$ (the page's notation).
#
# *Update.* $\hat N_{t+1} = e^{w}\hat N_t + e^{k_t} v_t = e^{w + M_t}\tilde N_t + e^{k_t} v_t$. Take
# $q = \max(w + M_t, k_t)$, the larger of the two exponents, as the new maximum and divide by $e^{q}$:
#
# $$\tilde N_{t+1} = e^{w + M_t - q}\,\tilde N_t + e^{k_t - q}\, v_t, \qquad
# \tilde D_{t+1} = e^{w + M_t - q}\,\tilde D_t + e^{k_t - q}, \qquad M_{t+1} = q .$$

# %%
def update_step(num, den, mx, k_t, v_t):
    # (N~, D~, M) at t + 1 from (N~, D~, M) at t and token t; both exponents <= 0.
    q = np.maximum(w + mx, k_t)
    a, b = np.exp(w + mx - q), np.exp(k_t - q)
    return a * num + b * v_t, a * den + b, q

# %% [markdown]
# *Output.* $N_t = e^{u + k_t} v_t + e^{M_t}\tilde N_t$. With $q = \max(u + k_t, M_t)$, multiply numerator and
# denominator by $e^{-q}$ (the ratio does not change):
#
# $$\mathrm{wkv}_t = \frac{e^{u + k_t - q}\, v_t + e^{M_t - q}\,\tilde N_t}{e^{u + k_t - q} + e^{M_t - q}\,\tilde D_t} .$$

# %%
def output_step(num, den, mx, k_t, v_t):
    # wkv_t from the stable state (num = N~, den = D~, mx = M) and token t; both exponents <= 0.
    q = np.maximum(u + k_t, mx)
    a, b = np.exp(mx - q), np.exp(u + k_t - q)
    return (a * num + b * v_t) / (a * den + b)

# %% [markdown]
# *Start.* Before the first token $\tilde N = \tilde D = 0$, and $M_0$ must be "minus infinity", so that the first
# update gives $M_1 = k_0$ and nothing else. The page never says what $M_0$ is (erratum 22). The reference takes
# $-10^{38}$, as transformers' CPU loop and CUDA kernel do; transformers' `RwkvModel` itself starts its state at
# $-10^{30}$. Both are far below any key, and give the same result. A finite value keeps $e^{M - q} = 0$ without
# the $\infty - \infty$ that an exact $-\infty$ would risk.
#
# Every exponent is $\le 0$ in both steps, and one of the two terms is exactly $e^0 = 1$. So nothing overflows,
# and no denominator underflows to zero. The stored numbers are not small, though: $\tilde D$ is a sum of terms up
# to 1, and grows to about $1 / (1 - e^{w})$ when the keys stay level and the decay is slow (the cell after the
# next one shows 149). What the cure bounds is the exponents, not the state.

# %%
def wkv_stable(w, u, k, v, output=output_step, initial_max=ref.INITIAL_MAX):
    num, den = np.zeros_like(k[:, 0]), np.zeros_like(k[:, 0])          # (B, C) N~_0, D~_0
    mx = np.full_like(k[:, 0], initial_max)                              # (B, C) M_0
    out = np.empty_like(k)
    for t in range(k.shape[1]):
        out[:, t] = output(num, den, mx, k[:, t], v[:, t])
        num, den, mx = update_step(num, den, mx, k[:, t], v[:, t])
    return out


# %% tags=["nbval-check-output"]
for what, actual, expected in (
    ("stable recurrence vs the sums", wkv_stable(w, u, k, v), wkv_sums),
    ("stable recurrence vs reference.wkv4", wkv_stable(w, u, k, v), ref.wkv4(w, u, k, v)[0]),
    ("stable recurrence, keys + 700 vs the sums", wkv_stable(w, u, k + 700.0, v), wkv_sums),
    ("reference.wkv4, keys + 700 vs the sums", ref.wkv4(w, u, k + 700.0, v)[0], wkv_sums),
    ("stable recurrence from M_0 = -1e30 (RwkvModel's start)",
     wkv_stable(w, u, k, v, initial_max=-1e30), wkv_sums),
):
    check(what, actual, expected, REFERENCE_BUDGET)
with np.errstate(over="ignore", invalid="ignore"):
    too_high = wkv_stable(w, u, k, v, initial_max=800.0)
print("from M_0 = 800 instead (above the keys), outputs that are NaN:",
      int(np.isnan(too_high).sum()), "of", too_high.size)

# %% [markdown]
# How large the stored numbers get: one channel with $\tau = -5$ ($w = -0.0067$), level keys $k = 0$ and values
# $v = 3$, for 2000 tokens. $M$ stays at 0, and $\tilde D_t$ is the geometric sum $\sum_{j<t} e^{jw}$, which tends
# to $1/(1 - e^{w}) \approx 149$; $\tilde N = 3\tilde D$.

# %% tags=["nbval-check-output"]
w_slow = -np.exp(np.array([-5.0]))                                     # (1,)
steps = 2000
_, (num_slow, den_slow, max_slow) = ref.wkv4(w_slow, np.zeros(1), np.zeros((1, steps, 1)),
                                              np.full((1, steps, 1), 3.0))
geometric = (1 - np.exp(steps * w_slow)) / (1 - np.exp(w_slow))       # sum_{j < steps} e^{j w}
print(f"M = {max_slow.item():g}, D~ = {den_slow.item():.1f}, N~ = {num_slow.item():.1f}, "
      f"1 / (1 - e^w) = {1 / (1 - np.exp(w_slow.item())):.1f}")
check("D~ vs the geometric sum", den_slow.ravel(), geometric, REFERENCE_BUDGET)

# %% [markdown]
# **Watching the state through a spike.** One channel ($\tau = -1$, $w = -0.37$) reads 60 ordinary keys, one of
# which, at $t = 20$, is $+50$. Left: the key and the tracked maximum $M_t$; right: $\tilde N_t$, $\tilde D_t$ and,
# for contrast, the plain $\hat D_t$ of section 2 (log scale). At the spike $M$ jumps to 50 and $\tilde D$ is
# rescaled to about 1: the old sum is multiplied by $e^{w + M - 50} \approx e^{-50}$, and the spike's own term is
# $e^0 = 1$. Then $M$ falls by $|w|$ per step, $M_{t+1} = \max(w + M_t, k_t)$, as the spike fades at the same rate,
# and $\tilde D$ stays near 1 until $M$ meets the ordinary keys again. The plain $\hat D$ jumps by $e^{50}$.

# %%
T_spike, spike_at = 60, 20
w_one = np.array([-np.exp(-1.0)])                                      # (1,) tau = -1
k_spike = rng.standard_normal((1, T_spike, 1))
k_spike[0, spike_at] += 50.0
v_spike = rng.standard_normal((1, T_spike, 1))
tracked, state_t = [], None
for t in range(T_spike):                                               # the state after each token, by the reference
    _, state_t = ref.wkv4(w_one, np.zeros(1), k_spike[:, t:t + 1], v_spike[:, t:t + 1], state=state_t)
    tracked.append([x.item() for x in state_t])
num_t, den_t, max_t = np.array(tracked).T                               # N~, D~, M after tokens 0..t
plain_den = np.array([np.sum(np.exp((t - np.arange(t + 1)) * w_one + k_spike[0, : t + 1, 0]))
                      for t in range(T_spike)])                         # D^ after tokens 0..t, as a sum

fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), constrained_layout=True)
axes[0].plot(k_spike.ravel(), ".", color="grey", label="key $k_t$")
axes[0].plot(max_t, label=r"tracked maximum $M_{t+1}$")
axes[1].semilogy(np.abs(num_t), label=r"$|\tilde N_{t+1}|$")
axes[1].semilogy(den_t, label=r"$\tilde D_{t+1}$")
axes[1].semilogy(plain_den, ":", label=r"plain $\hat D_{t+1}$ (section 2)")
for ax, title in zip(axes, ("the maximum jumps, then falls at slope w", "the stored sums stay O(1)")):
    ax.axvline(spike_at, color="red", lw=0.8, ls="--")
    ax.set_xlabel("token t")
    ax.set_title(title)
    ax.legend(fontsize=8)
plt.show()

# %% tags=["nbval-check-output"]
check("D~ e^M vs the plain D^, every step", den_t * np.exp(max_t), plain_den, REFERENCE_BUDGET)
print(f"M at the spike: {max_t[spike_at]:.2f} (the key {k_spike[0, spike_at, 0]:.2f}); "
      f"D~ there: {den_t[spike_at]:.3f}; M drops by |w| = {-w_one.item():.3f} a step after it:",
      bool(np.allclose(np.diff(max_t[spike_at:spike_at + 10]), w_one)))


# %% [markdown]
# **The page's output step (erratum 1).** The page prints the output step as
# $N_i = e^{u + K_i - q} V_i + e^{M_i}\,\tilde N_i$ (and the same for $D_i$), with $q = \max(u + K_i, M_i)$. Its two
# terms then carry different scales: the first is the true term times $e^{-q}$, the second the true $\hat N_i$
# itself. The ratio is not the WKV unless $q = 0$. With $e^{M_i - q}$ in place of $e^{M_i}$ both terms are the true
# ones times $e^{-q}$, which cancels. Numerically, as printed:

# %%
def output_step_as_printed(num, den, mx, k_t, v_t):
    q = np.maximum(u + k_t, mx)
    a, b = np.exp(mx), np.exp(u + k_t - q)                       # e^{M} where e^{M - q} is right
    return (a * num + b * v_t) / (a * den + b)

printed_error = rel_rms(wkv_stable(w, u, k, v, output=output_step_as_printed), wkv_sums)
corrected_error = rel_rms(wkv_stable(w, u, k, v), wkv_sums)
print(f"output step as printed: rel. RMS error {printed_error:.2f}; "
      f"corrected: {corrected_error:.1e}")
assert printed_error > 0.05 and corrected_error <= REFERENCE_BUDGET

# %% [markdown]
# ## 5. How a backward is derived: the recurrence, transposed, run backward in time
#
# Training needs $\partial L / \partial (w, u, k, v)$ for a loss $L$ of the outputs. Autograd through the loop would
# store every step's state; a kernel instead derives the backward by hand. The rule for any linear recurrence: if the
# state goes forward as $S_t = S_{t-1} G_t + (\text{input}_t)$ and the loss reads $S_t$, the *adjoint*
# $\bar S_t = \partial L / \partial S_t$ goes backward as
#
# $$\bar S_{t-1} = \bar S_t\, G_t^\top + \frac{\partial \ell_{t-1}}{\partial S_{t-1}},$$
#
# the same recurrence with the transition transposed, run from the last step to the first, where $\ell_{t-1}$ is
# what step $t-1$'s output contributes. Each input's gradient is then read off at the step where it entered. (In
# the frame's matrix form this is $dS_{t-1} = dS_t G_t^\top + \dots$; 08 shows how kernels store checkpoints of the
# forward state for it.)
#
# For WKV-4 the transition is the scalar $e^{w}$ per channel, so transposing changes nothing. Write
# $b_t = e^{u + k_t}$, $\mathrm{den}_t = \hat D_t + b_t$, $y_t = \mathrm{wkv}_t$ and $g_t = \partial L / \partial y_t$.
# Since $y_t = (\hat N_t + b_t v_t) / \mathrm{den}_t$, the adjoints $\bar N_t = \partial L / \partial \hat N_t$ and
# $\bar D_t = \partial L / \partial \hat D_t$ obey
#
# $$\bar N_t = e^{w}\, \bar N_{t+1} + \frac{g_t}{\mathrm{den}_t}, \qquad
# \bar D_t = e^{w}\, \bar D_{t+1} - \frac{g_t\, y_t}{\mathrm{den}_t}, \qquad \bar N_T = \bar D_T = 0,$$
#
# and $v_t$, which enters $y_t$ through $b_t v_t$ and $\hat N_{t+1}$ through $e^{k_t} v_t$, gets
#
# $$\frac{\partial L}{\partial v_t} = \frac{g_t\, b_t}{\mathrm{den}_t} + e^{k_t}\, \bar N_{t+1} .$$
#
# Exercise 4 asks for the other three gradients and checks them against autograd. Autograd's float64 truth is
# taken through the definition, written in torch: the scores $W_{t-i} + k_i$ in a $(T \times T)$ matrix per
# channel, a causal softmax over $i$, times $v$ (the sums of section 1 seen as softmax attention). Its forward
# is checked against the reference first.

# %%
def definition_torch(w, u, k, v):
    # wkv as a causal softmax over the scores (t-1-i) w + k_i (i < t) and u + k_t (i = t).
    T = k.shape[1]
    t, i = torch.arange(T)[:, None], torch.arange(T)[None, :]
    past = (t - 1 - i).clamp(min=0)[..., None] * w + k[:, None]            # (B, T, T, C)
    scores = torch.where((i == t)[..., None], u + k[:, None], past)
    scores = scores.masked_fill((i > t)[..., None], float("-inf"))          # causal
    return (torch.softmax(scores, dim=2) * v[:, None]).sum(dim=2)          # (B, T, C)

def autograd_of_definition(w, u, k, v, g):
    # d(sum(wkv * g)) / d(w, u, k, v) in float64, by autograd through the definition.
    leaves = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (w, u, k, v)]
    definition_torch(*leaves).backward(torch.tensor(g))
    return [x.grad.numpy() for x in leaves]

g = rng.standard_normal((B, T, C))                    # an upstream gradient dL/dwkv for section 1's inputs

# %% tags=["nbval-check-output"]
check("definition in torch float64 vs reference.wkv4",
      definition_torch(*map(torch.tensor, (w, u, k, v))), ref.wkv4(w, u, k, v)[0], REFERENCE_BUDGET)

# %% [markdown]
# ## Summary
#
# - The page's sums, the notes' sums (with $w_\text{notes} = -w$), the numerator/denominator recurrence and the
#   max-tracked recurrence are one function; they agree to float64 rounding with `reference/wkv4.py`.
# - $w = -e^{\tau} < 0$ with $\tau$ = `time_decay` (not $\tau$ itself, as the page says); the notes use $+e^{\tau}$.
# - The plain recurrence stores $e^{k}$ and overflows for keys past 709.8 (float64) or 88.7 (float32); the
#   max-tracked one stores everything relative to the largest exponent and is exact for any keys, since
#   $\mathrm{wkv}(k + c) = \mathrm{wkv}(k)$. It bounds the exponents ($\le 0$), not the stored sums, and it needs a
#   start $M_0$ far below the keys, which the page leaves out.
# - The page's output step needs $e^{M_i - q}$, not $e^{M_i}$ (erratum 1).
# - In the family $S_t = S_{t-1} G_t + v_t k_t^\top$ (notebook 04), RWKV-4 is the diagonal, query-free rung:
#   $G = \mathrm{diag}(e^{w})$, each channel keeping its own value times its own key.
# - A linear recurrence's backward is the same recurrence, transposed, run backward in time (section 5;
#   exercise 4 writes WKV-4's and checks it against autograd).
# - The torch path, the Triton kernel and the C loop match the reference in fp32 and fp16: outputs, states, pieces,
#   huge keys and gradients (the appendix).
#
# Next: [03 · The RWKV-4 model](03_rwkv4_model.ipynb) puts this operator into the RWKV-4 block, between token
# shift, the receptance gate and channel mixing.
#
# ## Exercises
#
# Each exercise has a solution in the collapsed cell below it (click the three dots to open it); it runs with the
# notebook, so it is checked too. In a coding exercise, fill in the stub, run it, then run the check cell under it:
# it says "not attempted yet" while the stub is untouched, "correct" when your code passes, and fails with the
# checks' message otherwise.
#
# **1. No decay, no bonus.** With $u = 0$ and $w = 0$, what does WKV compute? Check your answer against
# `ref.wkv4`.

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# Every weight is e^{k_i}: wkv_t is the e^k-weighted running mean of the values seen so far.
zero = np.zeros(C)
running_mean = np.cumsum(np.exp(k) * v, axis=1) / np.cumsum(np.exp(k), axis=1)   # (B, T, C)
check("wkv4 with u = w = 0 vs the e^k-weighted running mean", ref.wkv4(zero, zero, k, v)[0],
      running_mean, REFERENCE_BUDGET)

# %% [markdown]
# **2. A channel's memory.** Write `tau_for_half_life(n)`: the `time_decay` $\tau$ that makes a token $n$ steps back
# weigh exactly half as much as the token one step back. The check runs the reference's WKV on a key pulse and reads
# the weights off it, for several $n$. Then: which of the six curves in the decay-profile plot remember at least
# that much at $n = 100$?

# %%
# Exercise 2: a channel's memory
def tau_for_half_life(n):
    """time_decay tau (a float) such that a key n >= 2 steps back weighs half the key 1 step back."""
    raise NotImplementedError("Exercise 2: your code here")

# %% tags=["nbval-check-output"]
def weight_steps_back(tau, n):
    # The weight of a key n steps back relative to one 1 step back, read off reference.wkv4: with v = 1 at that key
    # and 0 elsewhere, and all keys 0, the output at t is the key's weight over the sum of all weights.
    T_read = n + 1                                           # the key at position 0, read at t = n
    out = [ref.wkv4(-np.exp(np.array([tau])), np.zeros(1), np.zeros((1, T_read, 1)),
                    np.eye(T_read)[None, :, i:i + 1])[0][0, -1, 0] for i in (0, T_read - 2)]
    return out[0] / out[1]                                   # (key n back) / (key 1 back): the sums cancel

def checks_2():
    for n in (2, 10, 100, 1000):
        check(f"weight {n} steps back / weight 1 step back at your tau", weight_steps_back(tau_for_half_life(n), n),
              0.5, REFERENCE_BUDGET)

exercise("Exercise 2", checks_2)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
def tau_for_half_life(n):
    """time_decay tau (a float) such that a key n >= 2 steps back weighs half the key 1 step back."""
    w_half = np.log(0.5) / (n - 1)             # e^{(n - 1) w} = 1/2; n - 1 steps of decay separate the two keys
    return float(np.log(-w_half))              # w = -e^tau

tau_half = tau_for_half_life(100)
print(f"n = 100: tau = {tau_half:.2f}; the curves that remember at least that much: "
      f"{[td for td in (-5.0, -3.0, -1.0, 0.0, 1.0, 2.0) if td <= tau_half]}")
exercise("Exercise 2", checks_2)

# %% [markdown]
# **3. The state carries the past.** Feed `ref.wkv4` the keys and values in three pieces (4, 1 and 7 tokens),
# passing the state from piece to piece, and compare with the whole. Then start the last piece from a fresh state:
# how far off is it?

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
pieces, piece_state, start = [], None, 0
for size in (4, 1, 7):
    y_piece, piece_state = ref.wkv4(w, u, k[:, start:start + size], v[:, start:start + size],
                                    state=piece_state)
    pieces.append(y_piece)
    start += size
check("three pieces with the state vs whole", np.concatenate(pieces, axis=1), wkv_sums,
      REFERENCE_BUDGET)
fresh = ref.wkv4(w, u, k[:, 5:], v[:, 5:])[0]
print("the last piece from a fresh state differs by more than 1%:",
      rel_rms(fresh, wkv_sums[:, 5:]) > 0.01)

# %% [markdown]
# **4. The backward, by the adjoint recurrence.** Write `wkv4_backward(w, u, k, v, g)`, the gradients of
# $L = \sum_{b,t,c} \mathrm{wkv} \odot g$ with respect to $w, u$ (shape `(C,)`) and $k, v$ (shape `(B, T, C)`), in
# float64, with section 5's method: a forward loop that keeps $\hat N_t$, $\hat D_t$, $\mathrm{den}_t$ and $y_t$, then
# one loop from $t = T - 1$ down to 0 that carries $\bar N, \bar D$. The check compares all four with autograd
# through the definition (section 5), on section 1's inputs. Hints: $k_t$ enters three places ($b_t$ twice, through
# $y_t$'s numerator and denominator, and $e^{k_t}$ into $\hat N_{t+1}$ and $\hat D_{t+1}$); $u$ enters only $b_t$, and
# $\partial y_t / \partial b_t = (v_t - y_t) / \mathrm{den}_t$; $w$ enters every step's $e^{w}\hat N_t$ and
# $e^{w}\hat D_t$; sum $u$'s and $w$'s gradients over batch and time.

# %%
# Exercise 4: the backward, by the adjoint recurrence
def wkv4_backward(w, u, k, v, g):
    """(dw, du, dk, dv): the gradients of sum(wkv4(w, u, k, v) * g), by a forward loop and a backward loop."""
    raise NotImplementedError("Exercise 4: your code here")

# %% tags=["nbval-check-output"]
def checks_4():
    got = wkv4_backward(w, u, k, v, g)
    for name, mine, truth in zip(("dw", "du", "dk", "dv"), got, autograd_of_definition(w, u, k, v, g)):
        check(f"your {name} vs autograd through the definition", mine, truth, REFERENCE_BUDGET)

exercise("Exercise 4", checks_4)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
def wkv4_backward(w, u, k, v, g):
    """(dw, du, dk, dv): the gradients of sum(wkv4(w, u, k, v) * g), by a forward loop and a backward loop."""
    decay, T = np.exp(w), k.shape[1]
    num, den = np.zeros((k.shape[0], T + 1, k.shape[2])), np.zeros((k.shape[0], T + 1, k.shape[2]))
    bonus, ek = np.exp(u + k), np.exp(k)                                     # b_t, e^{k_t}: (B, T, C)
    for t in range(T):                                                       # the forward, keeping the states
        num[:, t + 1] = decay * num[:, t] + ek[:, t] * v[:, t]
        den[:, t + 1] = decay * den[:, t] + ek[:, t]
    total = den[:, :T] + bonus                                               # den_t
    y = (num[:, :T] + bonus * v) / total
    dk, dv, db = np.empty_like(k), np.empty_like(v), g * (v - y) / total     # db: dL/db_t
    bar_num, bar_den = np.zeros_like(k[:, 0]), np.zeros_like(k[:, 0])        # N-bar_{t+1}, D-bar_{t+1}; 0 at T
    dw = np.zeros_like(w)
    for t in reversed(range(T)):
        dv[:, t] = g[:, t] * bonus[:, t] / total[:, t] + ek[:, t] * bar_num
        dk[:, t] = db[:, t] * bonus[:, t] + ek[:, t] * (bar_num * v[:, t] + bar_den)
        dw += (decay * (bar_num * num[:, t] + bar_den * den[:, t])).sum(axis=0)
        bar_num = decay * bar_num + g[:, t] / total[:, t]                     # the transposed recurrence
        bar_den = decay * bar_den - g[:, t] * y[:, t] / total[:, t]
    return dw, (db * bonus).sum(axis=(0, 1)), dk, dv

exercise("Exercise 4", checks_4)

# %% [markdown]
# ## Appendix: the production path against the reference
#
# The notebook's lesson ends above. This appendix runs the kernels a model uses on the same kind of inputs, and
# checks them against the float64 reference (nbval checks these cells like the others).
#
# [`kernels.wkv4.wkv4`](../kernels/wkv4/__init__.py) takes `w, u` of shape `(C,)` and `k, v` of shape `(B, T, C)`, and
# returns `(wkv, (num, den, max))` with the state in Hugging Face's layout (the $\tilde N, \tilde D, M$ above,
# fp32). Backend `"torch"` cuts time into chunks, runs the recurrence over the offsets of all chunks at once
# (each chunk scaled by its largest key) and carries the state from chunk to chunk; backend `"triton"`
# runs the max-tracked recurrence of section 4 in a kernel (here under the Triton interpreter on the CPU, so the
# shapes are small). Both run on the same inputs: outputs and final states, a sequence fed in two pieces, keys past
# float32's overflow point, and fp16.
#
# A third implementation, backend `"c"` ([`kernels/wkv4/wkv4.c`](../kernels/wkv4/wkv4.c)), is a compiled C loop that
# walks time once, with a backward that walks it back ([`kernels/wkv4/c.py`](../kernels/wkv4/c.py)): the CPU path
# for inference and training alike, which `backend=None` takes for CPU tensors whether or not a gradient is wanted.
# Every check below runs it too, gradients included, against the same reference and budgets.

# %%
B, T, C = 2, 24, 8
w64 = -np.exp(rng.standard_normal(C))
u64 = rng.standard_normal(C)
k64, v64 = rng.standard_normal((B, T, C)), rng.standard_normal((B, T, C))
BACKENDS = ("torch", "triton", "c")                   # "c": the C loop, forward and backward

def run(backend, w, u, k, v, dtype=torch.float32, state=None):
    # The kernel on float64 arrays cast to dtype; returns (wkv, (num, den, max)) as tensors.
    tensors = (torch.tensor(x, dtype=dtype) for x in (w, u, k, v))
    return wkv4_kernel(*tensors, state=state, backend=backend)

def fp16_rounded(x):
    # What an fp16 input holds: the reference is computed on these values.
    return x.astype(np.float16).astype(np.float64)

expected, expected_state = ref.wkv4(w64, u64, k64, v64)
split = 10                                            # feed 10 tokens, then the other 14

# %% tags=["nbval-check-output"]
for backend in BACKENDS:
    y, state = run(backend, w64, u64, k64, v64)
    check(f"{backend} fp32 wkv", y, expected, FP32_BUDGET)
    for name, got, want in zip(("num", "den", "max"), state, expected_state):
        check(f"{backend} fp32 state {name}", got, want, FP32_BUDGET)
    y1, state1 = run(backend, w64, u64, k64[:, :split], v64[:, :split])
    y2, _ = run(backend, w64, u64, k64[:, split:], v64[:, split:], state=state1)
    check(f"{backend} fp32 fed in two pieces", torch.cat([y1, y2], dim=1), expected, FP32_BUDGET)
    check(f"{backend} fp32 keys + 100 (e^k past float32)",
          run(backend, w64, u64, k64 + 100.0, v64)[0], expected, FP32_BUDGET)
    w16, u16, k16, v16 = (fp16_rounded(x) for x in (w64, u64, k64, v64))
    check(f"{backend} fp16 wkv", run(backend, w16, u16, k16, v16, dtype=torch.float16)[0],
          ref.wkv4(w16, u16, k16, v16)[0], FP16_BUDGET)


# %% [markdown]
# **Gradients.** The float64 truth for the gradients is autograd through the definition written in torch
# (`definition_torch`, section 5; checked against the reference there, and again here on these inputs). The three
# backends' fp32 gradients of $\sum \mathrm{wkv} \odot G$ with respect to $w, u, k, v$ must match it.

# %%
G = rng.standard_normal((B, T, C))                    # upstream gradient dLoss/dwkv

def gradients(fn, dtype):
    leaves = [torch.tensor(x, dtype=dtype, requires_grad=True) for x in (w64, u64, k64, v64)]
    fn(*leaves).backward(torch.tensor(G, dtype=dtype))
    return [x.grad for x in leaves]

expected_grads = gradients(definition_torch, torch.float64)
backend_grads = {b: gradients(lambda *a: wkv4_kernel(*a, backend=b)[0], torch.float32)
                 for b in BACKENDS}

# %% tags=["nbval-check-output"]
check("definition in torch float64 vs reference",
      definition_torch(*map(torch.tensor, (w64, u64, k64, v64))), expected, REFERENCE_BUDGET)
for backend in BACKENDS:
    for name, got, want in zip(("dw", "du", "dk", "dv"), backend_grads[backend], expected_grads):
        check(f"{backend} fp32 {name}", got, want, FP32_BUDGET)

# %%
# The errors themselves (this cell is not compared: the numbers depend on the machine).
for backend in BACKENDS:
    error = rel_rms(run(backend, w64, u64, k64, v64)[0], expected)
    worst = max(rel_rms(g, e) for g, e in zip(backend_grads[backend], expected_grads))
    print(f"{backend:6s} fp32: wkv rel. RMS error {error:.1e}, worst gradient {worst:.1e}")
