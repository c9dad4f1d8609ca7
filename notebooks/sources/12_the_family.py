# %% [markdown]
# # 12 · The family: one recurrence, every mechanism, side by side
#
# Notebook 04 opened with a frame that every mechanism of this series fits:
#
# $$S_t = S_{t-1}\, G_t + v_t k_t^\top, \qquad y_t = S_t\, q_t ,$$
#
# a state per head indexed [value, key], one association written per token, read with a query, and a transition
# $G_t$ that says what happens to everything written before. This capstone runs every rung through three
# implementations and checks them against each other (section 1), sets the cost of the three ways to compute a rung
# side by side, as formulas and measured, which is why chunking exists (section 2), and closes the series with one
# table of what each state can and cannot do, quoting the experiments' committed results (section 3).
#
# | rung | $G_t$ | `reference.family` |
# |---|---|---|
# | linear attention | $I$ | `linear_attention(q, k, v)` |
# | retention (RetNet) | $\gamma I$, a constant per head | `retention(q, k, v, log_gamma)` |
# | gated linear attention (GLA); RWKV-4 and Mamba's scan with a head per channel | $\mathrm{diag}(g_t)$, per key channel and step | `gla(q, k, v, log_g)`; `rwkv4_via_wkv7`, `selective_scan_via_wkv7` |
# | SSD (Mamba-2) | $a_t I$, per head and step | `ssd(q, k, v, log_a)` |
# | delta rule | $I - \beta_t k_t k_t^\top$ (and the write is $\beta_t v_t k_t^\top$) | `delta_rule(q, k, v, beta)` |
# | gated delta rule | $\alpha_t (I - \beta_t k_t k_t^\top)$ (write $\beta_t v_t k_t^\top$) | `gated_delta_rule(q, k, v, log_alpha, beta)` |
# | RWKV-7 | $\mathrm{diag}(w_t) + a_t b_t^\top$ | `reference.wkv7.wkv7(r, log_w, k, v, a, b)` |
#
# Every rung is a setting of the last row: `as_wkv7` gives the arguments. Softmax attention is the limit the family
# approximates: its "state" is every key and value so far, and it grows with the sequence.
#
# **Sources.** The papers named in [`reference/family.py`](../reference/family.py)'s docstring: linear attention
# (arXiv:2006.16236), RetNet (arXiv:2307.08621), GLA (arXiv:2312.06635), Mamba-2's SSD (arXiv:2405.21060), DeltaNet
# (arXiv:2102.11174, arXiv:2406.06484), Gated DeltaNet (arXiv:2412.06464), RWKV-7 (arXiv:2503.14456).
#
# **Code used.** [`reference/family.py`](../reference/family.py) (the rungs, `as_wkv7`) and
# [`reference/wkv7.py`](../reference/wkv7.py) (NumPy, float64: the truth) · [`kernels/wkv7/`](../kernels/wkv7/__init__.py):
# the production op, backends `"torch"` (chunked WY form), `"c"` (a C loop), `"triton"` (the recurrence) and
# `"triton_chunked"` (the chunked form), the Triton ones under the interpreter without a GPU ·
# [`kernels/testing.py`](../kernels/testing.py): `check`, `exercise` and the error budgets.

# %%
import seqmix

MODE = seqmix.use_interpreter_without_gpu()    # without a GPU: TRITON_INTERPRET=1, before triton is imported

import time

import matplotlib.pyplot as plt
import numpy as np
import torch

from seqmix.kernels.testing import (FP32_BUDGET, FP32_CHUNKED_WKV7_BUDGET, REFERENCE_BUDGET, check, exercise,
                                    rel_rms)
from seqmix.kernels.wkv7 import wkv7 as production_wkv7
from seqmix.reference import family
from seqmix.reference.ssm import selective_scan
from seqmix.reference.wkv4 import wkv4
from seqmix.reference.wkv7 import wkv7

rng = np.random.default_rng(0)
print("Triton kernels run on:", MODE)

# %% [markdown]
# ## 1. Every rung, three implementations
#
# Inputs for one batch and one head of size $N = 16$ (the chunked Triton kernel's smallest), $T = 24$ steps (a chunk
# of 16 and a short one), unit keys (so that the delta rules' transitions are contractions), decays in $(0.37, 1)$,
# and a random initial state. Each rung runs (a) through its own loop in `reference.family`, (b) through
# `reference.wkv7` with `as_wkv7`'s arguments, in float64, and (c) through the production op in fp32 on four
# backends. Linear attention and the delta rule pass decays of exactly 1 (`log_w` $= 0$): every backend takes them
# as any other decay.

# %%
B, T, H, N = 1, 24, 1, 16
q, k, v = (rng.standard_normal((B, T, H, N)) for _ in range(3))
k /= np.linalg.norm(k, axis=-1, keepdims=True)
S0 = rng.standard_normal((B, H, N, N))
PARAMS = {"linear_attention": (), "retention": (np.log([0.9]),),
          "gla": (-rng.uniform(0, 1, (B, T, H, N)),), "ssd": (-rng.uniform(0, 1, (B, T, H)),),
          "delta_rule": (rng.uniform(0, 1, (B, T, H)),),
          "gated_delta_rule": (-rng.uniform(0, 1, (B, T, H)), rng.uniform(0, 1, (B, T, H)))}
BUDGETS = {"torch": FP32_CHUNKED_WKV7_BUDGET, "c": FP32_BUDGET, "triton": FP32_BUDGET,
           "triton_chunked": FP32_CHUNKED_WKV7_BUDGET}    # the chunked forms' longer chains of fp32 products

# %% tags=["nbval-check-output"]
errors = {}
for rung, params in PARAMS.items():
    y_loop, S_loop = family.RUNGS[rung](q, k, v, *params, state=S0)
    args = family.as_wkv7(rung, q, k, v, *params)
    y_ref, S_ref = wkv7(*args, state=S0)
    check(f"{rung:17s} loop vs reference.wkv7", np.concatenate([y_loop.ravel(), S_loop.ravel()]),
          np.concatenate([y_ref.ravel(), S_ref.ravel()]), REFERENCE_BUDGET)
    for backend, budget in BUDGETS.items():
        y, S = production_wkv7(*(torch.tensor(x, dtype=torch.float32) for x in args),
                               state=torch.tensor(S0, dtype=torch.float32), backend=backend)
        assert_y, assert_S = rel_rms(y.double().numpy(), y_loop), rel_rms(S.double().numpy(), S_loop)
        assert max(assert_y, assert_S) <= budget, f"{rung} on {backend}: {assert_y:.1e}, {assert_S:.1e}"
        errors[rung, backend] = max(assert_y, assert_S)
    print(f"{rung:17s} production wkv7 on {', '.join(BUDGETS)}: within budget: True")

# %% [markdown]
# The errors themselves, relative RMS of the fp32 output and final state against the rung's float64 loop (they vary
# a little from machine to machine, so this cell is not compared by the tests):

# %%
print(f"{'rung':17s}" + "".join(f"{b:>16s}" for b in BUDGETS))
for rung in PARAMS:
    print(f"{rung:17s}" + "".join(f"{errors[rung, b]:16.1e}" for b in BUDGETS))

# %% [markdown]
# The two older mechanisms sit in the frame with a head per channel (notebooks 02 and 06 derive them): RWKV-4 has a
# decay per channel, a bonus $u$ for the current token and no query ($q = e^{-w}$ reads the state before the write,
# and the bonus is added outside); Mamba's scan has one head per inner channel $d$, with
# $G_t = \mathrm{diag}(e^{\Delta_t[d] A[d]})$, $k_t = \Delta_t[d] B_t$, $q_t = C_t$ and a value of size 1, $u_t[d]$.
# Both are computed by `reference.wkv7` and checked against their own references.

# %% tags=["nbval-check-output"]
C = 6
w4, u4, k4, v4 = -rng.uniform(0.1, 1.0, C), rng.standard_normal(C), *rng.standard_normal((2, 1, 20, C))
check("RWKV-4 via wkv7 vs reference.wkv4", family.rwkv4_via_wkv7(w4, u4, k4, v4), wkv4(w4, u4, k4, v4)[0],
      REFERENCE_BUDGET)
scan = dict(u=rng.standard_normal((1, 3, 20)), delta=rng.uniform(0.05, 1.0, (1, 3, 20)),
            A=-rng.uniform(0.5, 16.0, (3, 4)), B=rng.standard_normal((1, 4, 20)), C=rng.standard_normal((1, 4, 20)),
            D=rng.standard_normal(3))
check("Mamba's scan via wkv7 vs reference.ssm.selective_scan", family.selective_scan_via_wkv7(**scan),
      selective_scan(**scan)[0], REFERENCE_BUDGET)

# %% [markdown]
# ## 2. Three ways to compute a rung, and why chunking exists
#
# Take retention ($G = \gamma I$, the simplest rung with a decay). The same outputs come three ways:
#
# - **recurrent**: the loop of `family.retention`, $T$ sequential steps, each $O(N^2)$ (decay the state, write
#   $v k^\top$, read $S q$): $O(T N^2)$ work, but every step waits for the one before;
# - **quadratic** (the attention-like parallel form): $y_t = \sum_{s \le t} \gamma^{t-s} (q_t \cdot k_s)\, v_s$,
#   that is $Y = (Q K^\top \odot D) V$ with the causal decay matrix $D_{ts} = \gamma^{t-s}$: one step of
#   $O(T^2 N)$ work, all of it matrix products, and no state;
# - **chunked**: cut time into chunks of $L$; inside a chunk the quadratic form ($L \times L$), between chunks the
#   state carries everything earlier. $T / L$ sequential steps with $O(T L N + T N^2)$ work.
#
# | form | sequential steps | work (retention; operations, a multiply-add counted as one) | memory besides inputs |
# |---|---|---|---|
# | recurrent | $T$ | $\approx 3 T N^2$ (decay and write $N^2$ each, read $N^2$) | $N^2$ |
# | chunked | $T / L$ | $\approx 2 T L N + 2 T N^2$ ($Q K^\top$ and its product with $V$ per chunk; $S$'s read and update) | $N^2 + L^2$ |
# | quadratic | 1 | $\approx 2 T^2 N$ ($Q K^\top$ and its product with $V$, half of it masked out) | $T^2$ |
#
# A GPU runs thousands of multiply-adds at once but a step that waits for the previous one cannot use them: the
# recurrent form is cheapest in work and longest in depth, the quadratic form the reverse, and chunks of a few dozen
# steps keep the work within a small factor of the recurrent form's while cutting the depth by $L$. On a CPU
# (below) the same holds in small: NumPy's matrix products amortize Python's per-step overhead. The chunked code
# is Exercise 1.

# %%
def retention_quadratic(q, k, v, gamma):
    """One head: q, k, v (T, N) -> y (T, N), y = (Q K^T * D) V with D_ts = gamma^(t - s) for s <= t, else 0."""
    t = np.arange(len(q))
    D = np.where(t[:, None] >= t[None, :], gamma ** (t[:, None] - t[None, :]).clip(0), 0.0)
    return (q @ k.T * D) @ v


def retention_recurrent(q, k, v, gamma):
    """One head: the loop, y_t = S_t q_t with S_t = gamma S_{t-1} + v_t k_t^T."""
    S, y = np.zeros((q.shape[1], q.shape[1])), np.empty(q.shape)
    for t in range(len(q)):
        S = gamma * S + np.outer(v[t], k[t])
        y[t] = S @ q[t]
    return y

# %% tags=["nbval-check-output"]
q1, k1, v1 = (rng.standard_normal((64, 8)) for _ in range(3))
gamma1 = 0.95
y_family = family.retention(*(x[None, :, None] for x in (q1, k1, v1)), np.log([gamma1]))[0][0, :, 0]
check("retention: quadratic form vs family.retention", retention_quadratic(q1, k1, v1, gamma1), y_family,
      REFERENCE_BUDGET)
check("retention: one-head loop vs family.retention", retention_recurrent(q1, k1, v1, gamma1), y_family,
      REFERENCE_BUDGET)

# %% [markdown]
# ## Exercises
#
# Each exercise has a solution in the collapsed cell below it (click the three dots to open it); it runs with the
# notebook, so it is checked too. In a coding exercise, fill in the stub, run it, then run the check cell under it:
# it says "not attempted yet" while the stub is untouched, "correct" when your code passes, and fails with the
# checks' message otherwise. (They sit here, before the measurements, because section 2 times Exercise 1's answer.)
#
# **1. Retention in chunks.** Write `retention_chunked(q, k, v, gamma, L)` for one head ($q, k, v$ of shape
# $(T, N)$, $T$ not necessarily a multiple of $L$). For each chunk with $S$ the state entering it and local steps
# $i, j = 0 \ldots L' - 1$: the outputs are $y_i = \gamma^{i+1} S q_i + \sum_{j \le i} \gamma^{i-j} (q_i \cdot k_j)
# v_j$ (the state's part, then the chunk's own quadratic form), and the state leaving it is
# $\gamma^{L'} S + \sum_j \gamma^{L'-1-j} v_j k_j^\top$. The check compares it with `family.retention` at chunk
# sizes 1, 5, 16 and $T$, on $T = 64$. Hint: the state's part of a whole chunk is one product,
# $(\gamma^{i+1} q_i)_i\, S^\top$; the state update is one too, $V^\top (\gamma^{L'-1-j} k_j)_j$.

# %%
# Exercise 1: retention in chunks
def retention_chunked(q, k, v, gamma, L):
    """One head: q, k, v (T, N) -> y (T, N), chunk by chunk (T / L sequential steps)."""
    raise NotImplementedError("Exercise 1: your code here")

# %% tags=["nbval-check-output"]
def checks_1():
    for L in (1, 5, 16, 64):
        check(f"retention_chunked, L = {L:2d}, vs family.retention", retention_chunked(q1, k1, v1, gamma1, L),
              y_family, REFERENCE_BUDGET)

exercise("Exercise 1", checks_1)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
def retention_chunked(q, k, v, gamma, L):
    """One head: q, k, v (T, N) -> y (T, N), chunk by chunk (T / L sequential steps)."""
    S, y = np.zeros((q.shape[1], q.shape[1])), np.empty(q.shape)
    for start in range(0, len(q), L):
        qc, kc, vc = q[start:start + L], k[start:start + L], v[start:start + L]
        n = len(qc)                                                   # L, or less for the last chunk
        up = gamma ** np.arange(1, n + 1)[:, None]                    # gamma^{i+1}: S entered i + 1 steps ago
        y[start:start + n] = (up * qc) @ S.T + retention_quadratic(qc, kc, vc, gamma)
        S = gamma**n * S + vc.T @ (gamma ** np.arange(n - 1, -1, -1)[:, None] * kc)   # gamma^{L'-1-j} v_j k_j^T
    return y

exercise("Exercise 1", checks_1)

# %% [markdown]
# **2. GLA's quadratic form.** With a decay per key channel, the quadratic form keeps a product of decays per
# channel inside the score: $y_t = \sum_{s \le t} \big(\sum_n q_t[n]\, k_s[n] \prod_{m = s+1}^{t} g_m[n]\big) v_s$.
# Write `gla_quadratic(q, k, v, log_g)` for one head ($q, k, v$, `log_g` of shape $(T, N)$, $g = e^{\log g}$), and
# see why the step $s$'s own decay is not in the product. The check compares it with `family.gla` (the loop).
# Hint: with $c_t = \sum_{m \le t} \log g_m$, the product is $e^{c_t - c_s}$; build the $(T, T, N)$ array of these
# exponents and mask $s > t$ before taking `exp` (it would overflow there).

# %%
# Exercise 2: GLA's quadratic form
def gla_quadratic(q, k, v, log_g):
    """One head: q, k, v, log_g (T, N) -> y (T, N) from the masked, decayed scores (no state)."""
    raise NotImplementedError("Exercise 2: your code here")

# %% tags=["nbval-check-output"]
log_g1 = -rng.uniform(0.0, 1.0, (64, 8))

def checks_2():
    y_loop = family.gla(*(x[None, :, None] for x in (q1, k1, v1, log_g1)))[0][0, :, 0]
    check("gla_quadratic vs family.gla", gla_quadratic(q1, k1, v1, log_g1), y_loop, REFERENCE_BUDGET)

exercise("Exercise 2", checks_2)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
def gla_quadratic(q, k, v, log_g):
    """One head: q, k, v, log_g (T, N) -> y (T, N) from the masked, decayed scores (no state)."""
    c = np.cumsum(log_g, axis=0)                                      # c_t = log g_1 + ... + log g_t
    t = np.arange(len(q))
    causal = (t[:, None] >= t[None, :])[:, :, None]                   # s <= t
    # step s's decay acted before v_s k_s^T was written: the product runs over m = s+1 .. t, i.e. c_t - c_s
    decay = np.exp(np.where(causal, c[:, None, :] - c[None, :, :], -np.inf))     # (T, T, N)
    scores = np.einsum("tn,sn,tsn->ts", q, k, decay)
    return scores @ v

exercise("Exercise 2", checks_2)

# %% [markdown]
# ### The three forms measured
#
# One head of retention at $N = 64$, $T$ from 256 to 2048, chunks of $L = 64$ (Exercise 1's solution): wall time,
# the best of 3 runs, side by side in one run. The machine is a shared 2-core CPU, so the absolute numbers vary
# from run to run and machine to machine; the slopes and the order are what to read. The recurrent form pays
# Python's per-step overhead $T$ times, the quadratic form pays $T^2$ work, the chunked form neither.

# %%
def best_of_3(fn, *args):
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return min(times)

N_cost, L_cost, gamma_cost = 64, 64, 0.99
T_all = [256, 512, 1024, 2048]
forms = {"recurrent": lambda q, k, v: retention_recurrent(q, k, v, gamma_cost),
         "chunked": lambda q, k, v: retention_chunked(q, k, v, gamma_cost, L_cost),
         "quadratic": lambda q, k, v: retention_quadratic(q, k, v, gamma_cost)}
work = {"recurrent": lambda T_: 3 * T_ * N_cost**2, "chunked": lambda T_: 2 * T_ * L_cost * N_cost + 2 * T_ * N_cost**2,
        "quadratic": lambda T_: 2 * T_**2 * N_cost}
steps = {"recurrent": lambda T_: T_, "chunked": lambda T_: T_ / L_cost, "quadratic": lambda T_: 1}
seconds = {name: [] for name in forms}
for T_ in T_all:
    x_ = [rng.standard_normal((T_, N_cost)) / np.sqrt(N_cost) for _ in range(3)]
    for name, fn in forms.items():
        seconds[name].append(best_of_3(fn, *x_))
print(f"{'T':>6s}" + "".join(f"{name:>26s}" for name in forms))
for i, T_ in enumerate(T_all):
    print(f"{T_:6d}" + "".join(f"{seconds[n][i] * 1e3:9.1f} ms {steps[n](T_):5.0f} st {work[n](T_):.1e}"
                               for n in forms))

# %%
fig, (ax_time, ax_work) = plt.subplots(1, 2, figsize=(11, 4))
for name in forms:
    ax_time.loglog(T_all, seconds[name], "o-", label=name)
    ax_work.loglog([steps[name](T_) for T_ in T_all], [work[name](T_) for T_ in T_all], "o-", label=name)
ax_time.set(xlabel="T", ylabel="seconds (best of 3, this CPU)", title=f"measured: one head, N = {N_cost}, L = {L_cost}")
ax_work.set(xlabel="sequential steps", ylabel="operations (formula)", title="depth against work, T = 256 ... 2048")
ax_time.legend()
ax_work.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# Left: the measured times. In the committed run the chunked form was the fastest at every $T$ and the quadratic
# form's time grew fastest with $T$ (its work grows as $T^2$); on a shared machine single points jump from run to
# run, so read the order rather than each point. Right: for the same $T$,
# the formulas: moving from the recurrent form to the chunked one divides the sequential steps by $L = 64$ for
# $(2 L N + 2 N^2) / (3 N^2) = 1.3$ times the work, and the quadratic form has a single step but work that grows as
# $T^2$. That trade is why every production kernel of a linear recurrence (the torch path and `triton_chunked`
# here, fla's kernels) is chunked, and why RWKV-7's chunked form needed the WY representation of notebook 04
# (section 6): its transitions are not multiples of $I$, so the chunk's product of transitions is not a number but
# a diagonal plus rank $L$.
#
# ## 3. The synthesis: what each state can do
#
# One row per mechanism, one column per property. The last four columns quote the project's experiments (2-layer
# models trained on this CPU; [docs/experiments.md](../docs/experiments.md) describes them, and notebook 09 walks
# through them): recall is multi-query associative recall with 4 pairs at width $C = 64$ and 128
# ([`recall.md`](../experiments/results/recall.md)); selection is selective copying, 64 positions
# ([`selective_copy.md`](../experiments/results/selective_copy.md)); parity is accuracy past the training length
# 64, at 256 ([`state_tracking.md`](../experiments/results/state_tracking.md)); extrapolation is next-character
# accuracy at 1x and 8x the training length ([`extrapolation.md`](../experiments/results/extrapolation.md), attention
# only); bits per byte is the test split of ~1M-parameter byte-level models on the standard library's sources
# ([`language_model.md`](../experiments/results/language_model.md)). The rungs in between (linear attention,
# retention, GLA, the delta rules) were trained as RWKV-7's frame with the rung's transition
# ([`family_tasks.md`](../experiments/results/family_tasks.md), one to three seeds, the table after this one): recall at
# $C = 64$ and parity where they ran; SSD and the other cells were not run, and say so rather than guess.
#
# | mechanism | state per head | sequential steps | parallel form | recall, 4 pairs ($C$ = 64 / 128) | selection | parity past 64 (at 256) | extrapolation (1x / 8x) | test bits per byte |
# |---|---|---|---|---|---|---|---|---|
# | softmax attention | every $k_s, v_s$: $2tN$, growing | 1 (all positions at once; $O(T^2 N)$ work) | itself (flash: key blocks) | 74.8% (3 seeds, 26.3-99.4%) / 99.3% | by content, exactly | 49.8% | RoPE 60.4% / 32.5%; ReRoPE (w = 64) 60.5% / 59.4% (8x: repeated text) | 1.917 |
# | linear attention ($I$) | $N^2$ | $T$, or $T / L$ chunked | quadratic, chunked | 99.8% (3 seeds, 99.75-99.83%) / not run | none (adds only) | 50.2% (1 seed; no sign flip) | not run | not run |
# | retention ($\gamma I$) | $N^2$ | $T$, or $T / L$ | quadratic, chunked | 99.8% (3 seeds, 99.6-99.95%) / not run | by age only | 49.9% (1 seed; no sign flip) | not run | not run |
# | GLA ($\mathrm{diag}(g_t)$) | $N^2$ | $T$, or $T / L$ | chunked | 99.8% (3 seeds, 99.7-99.9%) / not run | per channel and token | 50.1% (1 seed; no sign flip) | not run | not run |
# | RWKV-4 (diagonal, no query, a head per channel) | 2 numbers per channel (3 stored, with the running max) | $T$ | chunked (notebook 02) | 25.6% (3 seeds) / 54.3% | none (a fixed decay per channel) | 50.1% | - | 1.740 |
# | SSD, Mamba-2 ($a_t I$) | $N^2$ | $T$, or $T / L$ | chunked (SSD), scan | not run | per token | not run (no sign flip) | not run | not run |
# | Mamba's scan (diagonal, a head per channel) | $N$ per channel | $T$, or $\log T$ (parallel scan) | parallel scan (notebook 06) | 26.3% / 99.2% | 99.5% (time-invariant: 69.8%) | 50.0% | - | 1.809 |
# | delta rule ($I - \beta k k^\top$) | $N^2$ | $T$, or $T / L$ | chunked (WY) | $\beta < 1$: 99.7% (3 seeds, 99.6-99.7%), $\beta < 2$: 99.8% (1 seed) / not run | overwrites by key | $\beta < 1$: 49.7% (3 seeds, 49.5-49.9%); $\beta < 2$: 91.9% (3 seeds, 75.9-100.0%; the control holds here, two seeds with 4x the steps) | not run | not run |
# | gated delta rule | $N^2$ | $T$, or $T / L$ | chunked (WY) | 99.9% (1 seed) / not run | overwrites and forgets | 50.0% (1 seed; $\beta < 1$) | not run | not run |
# | RWKV-7 ($\mathrm{diag}(w) + a b^\top$) | $N^2$ | $T$, or $T / 16$ (`triton_chunked`) | chunked (WY, notebook 04) | 99.7% (3 seeds) / 100.0% | not run | 54.8% as published (3 seeds, 50.3-63.3%); wide rate 93.1% (82.9-98.9%) | - | 1.685 |
#
# A dash: the experiment does not apply (the recurrent models have no positions to extrapolate; their length
# behaviour is the parity column). What to read in it, as consequences of each state's shape: a state of $N^2$
# numbers that can overwrite by key (RWKV-7) recalls at width 64 where diagonal states (RWKV-4, Mamba) need more
# width, and attention, whose state grows, is the reference the others approximate; a transition with a negative
# eigenvalue (RWKV-7 with the wide rate) keeps parity past the training length where positive decays cannot; and an
# input-dependent decay (Mamba) selects what a time-invariant one cannot. On real text at this size all four
# trained models beat the bigram control (3.570 bits per byte), RWKV-7 first; notebook 09 and docs/experiments.md
# say how far one seed and a CPU budget carry these numbers. One limit to keep in view: recall's positive control
# (Zoology's attention, since the project's own attention failed it) holds at $N = 4$ and fails at $N = 8$ (one
# seed of three stays at chance with 4x the steps), so the recall column reads $N = 4$ as verdicts and $N = 8$ as
# what the runs measured. The softmax attention row's recall cell is the project's transformer; Zoology's shape
# learns $N = 4$ on every seed (the third with 4x the steps) and $N = 8$ on two of three.
#
# ### The rungs trained
#
# The rows behind the rung cells above: each rung as a model ([`experiments/rungs.py`](../experiments/rungs.py):
# RWKV-7's frame, embedding, norms, token shift, gate, channel mix and training start, with the rung's transition
# in its time mix, run by the production op), trained by
# [`experiments/family_tasks.py`](../experiments/family_tasks.py) on recall's MQAR and state tracking's parity with
# their data, budgets and training code, one rate per cell (the one the published RWKV-7 chose there, no sweep).
# This cell reads the committed [`family_tasks.json`](../experiments/results/family_tasks.json); it trains nothing.

# %% tags=["nbval-check-output"]
from seqmix.experiments import family_tasks
from seqmix.experiments.records import RESULTS, Results

family_rows = Results(RESULTS, "family_tasks").select(phase="test")
print(f"{'task':12s} {'model':17s} {'seed':>4s} {'rate':>7s} {'steps':>5s} {'test':>7s} {'past 64 at 256':>15s} "
      f"{'at 1024':>8s}")
for r in family_rows:
    parity = r["task"] == family_tasks.PARITY
    task = "parity" if parity else f"MQAR N = {r['pairs']}"
    past = [f"{100 * r[f'accuracy_past_train_at_{n}']:.1f}%" if parity else "-" for n in (256, 1024)]
    print(f"{task:12s} {r['arch']:17s} {r['seed']:4d} {r['lr']:7.2g} {r['steps']:5d} {100 * r['test_accuracy']:6.1f}% "
          f"{past[0]:>15s} {past[1]:>8s}")
for task, pairs in ((family_tasks.MQAR, 4), (family_tasks.MQAR, 8), (family_tasks.PARITY, None)):
    where = task if pairs is None else f"{task} N = {pairs}"        # MQAR's control is read per N
    print(f"positive control, {where}:", family_tasks.control_holds(Results(RESULTS, "family_tasks"),
                                                                   family_tasks.FULL, task, pairs))

# %% [markdown]
# ## Summary
#
# - Every mechanism of the series is $S_t = S_{t-1} G_t + v_t k_t^\top$, $y_t = S_t q_t$ with its own $G_t$, and
#   every rung is a setting of RWKV-7's $\mathrm{diag}(w_t) + a_t b_t^\top$: the one production op computes them all,
#   on every backend, within the fp32 budgets, decays of exactly 1 included.
# - The recurrent form is the least work and the longest chain; the quadratic form the shortest chain and
#   $O(T^2 N)$ work; chunks of $L$ steps cut the chain by $L$ for a small factor of work, which is why fast kernels
#   are chunked (measured above, on a CPU, in small).
# - What a state can do follows from its shape and its transition: its size bounds recall, an edit by key lets it
#   overwrite, an input-dependent decay lets it select, a negative eigenvalue lets it count.
