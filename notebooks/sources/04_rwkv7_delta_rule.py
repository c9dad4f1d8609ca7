# %% [markdown]
# # 04 · RWKV-7's state: the generalized delta rule
#
# RWKV-4 carried two numbers per channel from token to token. RWKV-7 carries a matrix per head, and updates it with
#
# $$S_t = S_{t-1}\,\mathrm{diag}(w_t) + (S_{t-1} a_t)\, b_t^\top + v_t k_t^\top, \qquad y_t = S_t\, r_t .$$
#
# Section 0 places it in the frame every mechanism of this series fits, $S_t = S_{t-1} G_t + v_t k_t^\top$, with a
# table of what each transition $G_t$ can and cannot do. Then this notebook follows the RWKV-7 post's account of
# that update: what the state is (and its shape); the update
# term by term (forgetting, correcting, writing); the reading of the update as one step of online gradient descent on
# "make $S k$ return $v$"; why the transition $\mathrm{diag}(w_t) + a_t b_t^\top$ never amplifies the state (its
# eigenvalues stay inside the unit disc, shown by a short proof and a plot, and what goes wrong with the post's
# $a = -k$, $b = k\eta$); the same recurrence without recursion (a product of transition matrices); and the chunked
# "WY" form that fast kernels use, derived and checked. Heatmaps of the state over time show the delta rule replace a
# stored association where plain accumulation would blur it. Last, why those eigenvalues may be negative (down to
# -0.455 as published, to -1 with a wider learning rate), and what a sign flip buys: counting parity, the smallest
# state-tracking task, which positive decays cannot do. An appendix runs the torch path, the Triton kernel and the
# C loop on the same inputs and checks them against the float64 reference: outputs, states, pieces, fp16 and
# gradients.
#
# **Sources.** The RWKV-7 architecture post, https://www.cnblogs.com/Ctrl-cCtrl-v/p/18906192 (the state, its update
# and the meaning of each term: the order followed here; errata 16, 18 and 19 of
# [`reference/ERRATA.md`](../reference/ERRATA.md) are about it); RWKV-7 "Goose", arXiv:2503.14456,
# https://arxiv.org/abs/2503.14456 (the generalized delta rule, its chunked form); DeltaNet's parallel form,
# arXiv:2406.06484, https://arxiv.org/abs/2406.06484 (the WY representation of a product of rank-one updates).
#
# **Notation.** The post's $a$ is both the op's vector $a$ (here $-\hat\kappa$) and the learning rate (here $\alpha$);
# $w$ is the decay here but a window in notebook 07; $D$ below is a diagonal matrix, not Mamba's skip. The
# [notation crosswalk](notation.md) lists these clashes across the notebooks.
#
# **Code used.** [`reference/wkv7.py`](../reference/wkv7.py): `wkv7` (the recurrence), `wkv7_transition_product`
# (the non-recursive definition), `wkv7_chunked` (the WY form) (NumPy, float64: the truth) ·
# [`kernels/wkv7/`](../kernels/wkv7/__init__.py): `wkv7` (backend `"torch"`: the chunked WY form; backend `"triton"`: the
# recurrence in a kernel that keeps rows of the state in registers, forward and backward; backend `"c"`: a C loop,
# forward and backward) · [`reference/rwkv7.py`](../reference/rwkv7.py): `in_context_rate` (section 8) ·
# [`reference/family.py`](../reference/family.py): the frame's rungs and `as_wkv7` (section 0) ·
# [`kernels/testing.py`](../kernels/testing.py): `check` and the error budgets.

# %%
import seqmix

# without a GPU: TRITON_INTERPRET=1, before triton is imported
MODE = seqmix.use_interpreter_without_gpu()

import math
from functools import reduce

import matplotlib.pyplot as plt
import numpy as np
import torch

from seqmix.kernels.testing import (FP16_BUDGET, FP32_BUDGET, FP32_CHUNKED_WKV7_BUDGET,
                                    REFERENCE_BUDGET, check, exercise, rel_rms)
from seqmix.reference import wkv7 as ref

rng = np.random.default_rng(0)
torch.manual_seed(0)
print("Triton kernels run on:", MODE)

# %% [markdown]
# ## 0. The frame: one state, many transitions
#
# Before RWKV-7's own update, the frame that every mechanism in this series fits. Each keeps a matrix state per head,
# indexed [value, key], writes one association $v_t k_t^\top$ per token, reads it with a query, and differs only in
# the transition $G_t$ that acts on the old state before the write:
#
# $$S_t = S_{t-1}\, G_t + v_t k_t^\top, \qquad y_t = S_t\, q_t .$$
#
# A write $v k^\top$ under a unit key is read back by $q = k$ (section 1 checks it). $G_t$ decides what happens to
# everything stored earlier: kept ($G = I$), faded (a decay), or edited (a rank-one term that takes out what a key
# reads now). [`reference/family.py`](../reference/family.py) writes each rung as its own short loop, and
# `as_wkv7` gives the arguments of RWKV-7's op that compute it, so the one production kernel runs them all (notebook
# 12 does, on every backend). Its state holds $N^2$ numbers per head at any length.
#
# | rung (source) | $G_t$ | what the state holds | numbers per head | can | cannot |
# |---|---|---|---|---|---|
# | softmax attention (the limit) | none: no fixed state | every $k_s, v_s$ so far | $2tN$, growing | recall any pair exactly | stay $O(1)$ per token |
# | linear attention | $I$ | the sum of every $v_s k_s^\top$ | $N^2$ | recall up to $N$ orthogonal keys | forget; overwrite a key |
# | retention (RetNet) | $\gamma I$, a constant per head | the sum, older writes faded by age | $N^2$ | forget by age | forget by content |
# | GLA | $\mathrm{diag}(g_t)$, per key channel and step | the sum, each key channel faded at its own rate | $N^2$ | choose what to fade, per token | flip a sign (eigenvalues in $(0, 1]$) |
# | RWKV-4 (a head per channel, no query); Mamba's scan (a head per channel, values of size 1) | diagonal: $e^{w}$, fixed (RWKV-4); $\mathrm{diag}(e^{\Delta_t A})$, by input (Mamba) | per channel: a decayed sum (RWKV-4: and its normalizer) | 2 (RWKV-4), $N$ (Mamba) per channel | fade (Mamba: select by input) | flip a sign; recall at small width |
# | SSD (Mamba-2) | $a_t I$, per head and step | the sum, faded as the input decides | $N^2$ | select what to keep | flip a sign |
# | delta rule | $I - \beta_t k_t k_t^\top$ | a key-value map: a write replaces what $k_t$ read | $N^2$ | overwrite a key; flip a sign with $\beta > 1$ | forget what is not overwritten |
# | gated delta rule | $\alpha_t (I - \beta_t k_t k_t^\top)$ | the map, faded | $N^2$ | overwrite and forget | (as the delta rule, plus decay) |
# | RWKV-7 | $\mathrm{diag}(w_t) + a_t b_t^\top$ | the map, faded per key channel | $N^2$ | all of the above; eigenvalues down to $-0.455$ (published), $-1$ (wide rate, section 8) | hold more than $N^2$ numbers |
#
# What the trained models did (2-layer models of width $C$, the project's experiments,
# [docs/experiments.md](../docs/experiments.md)): on associative recall with 4 pairs
# ([`recall.md`](../experiments/results/recall.md)) RWKV-7 reaches 99.7% at $C = 64$ where RWKV-4 (25.6%) and Mamba
# (26.3%) stay near chance and need width (Mamba 99.2% at $C = 128$, RWKV-4 98.5% at $C = 256$); on parity
# ([`state_tracking.md`](../experiments/results/state_tracking.md)) only RWKV-7 with the wide rate, whose transitions
# reach $-1$, keeps the answer past the training length (93.1% at 256), while RWKV-4 and Mamba, whose decays cannot
# flip a sign, sit at 50%. The other rungs (linear attention, retention, GLA, SSD, the two delta rules) have not been
# trained on these tasks yet. Notebook 09 reads these results as consequences of each state's shape.
#
# Each rung below runs through its own loop and through `reference.wkv7` with `as_wkv7`'s arguments; they agree to
# float64 rounding. Linear attention's and the delta rule's decays are exactly 1 (`log_w` $= 0$).

# %%
from seqmix.reference import family

Bf, Tf, Hf, Nf = 1, 12, 2, 4
q_f, k_f, v_f = (rng.standard_normal((Bf, Tf, Hf, Nf)) for _ in range(3))
k_f /= np.linalg.norm(k_f, axis=-1, keepdims=True)                     # unit keys: the delta rules replace exactly
rung_params = {"linear_attention": (), "retention": (np.log([0.9, 0.5]),),          # log_gamma (H,)
               "gla": (-rng.uniform(0, 1, (Bf, Tf, Hf, Nf)),),                      # log_g (B, T, H, N)
               "ssd": (-rng.uniform(0, 1, (Bf, Tf, Hf)),),                          # log_a (B, T, H)
               "delta_rule": (rng.uniform(0, 1, (Bf, Tf, Hf)),),                    # beta (B, T, H)
               "gated_delta_rule": (-rng.uniform(0, 1, (Bf, Tf, Hf)), rng.uniform(0, 1, (Bf, Tf, Hf)))}

# %% tags=["nbval-check-output"]
for rung, params in rung_params.items():
    y_loop, S_loop = family.RUNGS[rung](q_f, k_f, v_f, *params)
    r_, log_w_, k_, v_, a_, b_ = family.as_wkv7(rung, q_f, k_f, v_f, *params)
    check(f"{rung:17s} its loop vs reference.wkv7 (log_w = 0: {bool((log_w_ == 0).all())!s:5})",
          y_loop, ref.wkv7(r_, log_w_, k_, v_, a_, b_)[0], REFERENCE_BUDGET)

# %% [markdown]
# ## 1. The state: a matrix per head
#
# The post calls the state "a three-dimensional tensor $(B, H, N, N)$". It has four dimensions (erratum 16): batch,
# head, and an $N \times N$ matrix per head. The matrix is indexed [value, key]: it maps a vector in key space to one
# in value space, and the output reads it with the receptance, $y_t = S_t r_t$, as attention reads values with a query.
# One write $v k^\top$ with a unit key $k$ stores an association: reading with $r = k$ returns $v$, reading with any
# $r$ orthogonal to $k$ returns nothing. That is the state's job: a small key-value memory, $N^2$ numbers per head,
# however long the text.

# %%
N = 8
key = rng.standard_normal(N)
key /= np.linalg.norm(key)                                             # a unit key
value = rng.standard_normal(N)
S_one = np.outer(value, key)                                           # (N, N) [value, key]: v k^T
orthogonal = rng.standard_normal(N)
orthogonal -= (orthogonal @ key) * key  # remove the component along the key

# %% tags=["nbval-check-output"]
check("reading v k^T with r = k returns v", S_one @ key, value, REFERENCE_BUDGET)
print("reading it with r orthogonal to k returns 0:",
      bool(np.abs(S_one @ orthogonal).max() < 1e-12))


# %% [markdown]
# ## 2. The update, term by term
#
# The post writes the update with row vectors, $S_t = S_{t-1}\,\mathrm{diag}(w_t) + S_{t-1} a_t^\top b_t +
# v_t^\top k_t$, and BlinkDL's loop as `state = state * w + state @ a @ b + v @ k` (there $a$ is a column, $b$ a row).
# With column vectors it is the formula at the top. Three terms:
#
# 1. **Forgetting**, $S_{t-1}\,\mathrm{diag}(w_t)$: column $j$ of the state (everything stored under key channel $j$)
#    is multiplied by $w_{t,j} \in (0, 1)$. The decay depends on the token (it is computed from the input) and on the
#    channel.
# 2. **Correcting**, $(S_{t-1} a_t)\, b_t^\top$: RWKV-7 passes $a_t = -\hat\kappa_t$ and
#    $b_t = \hat\kappa_t \odot \alpha_t$, where $\hat\kappa_t$ is a unit-length key and $\alpha_t \in (0, 1)^N$ the
#    *in-context learning rate*. Then $S_{t-1}\hat\kappa_t$ is what the memory currently returns for that key, and
#    the term removes it, a fraction $\alpha$ per channel: $-\left(S_{t-1}\hat\kappa_t\right)
#    \left(\hat\kappa_t \odot \alpha_t\right)^\top$.
# 3. **Writing**, $v_t k_t^\top$: the new association.
#
# **The decay (erratum 18).** The post says $w_t$ is negative because it is made by `exp(-exp(...))`. What
# multiplies the state is $e^{-e^{\omega}}$, which lies in $(0, 1)$: it is the model's raw $\omega$ (soft-clamped
# below $-0.5$) and the log decay $-e^{\omega}$ that are negative. So the decay lies in $(e^{-e^{-0.5}}, 1) =
# (0.545, 1)$. The design passes the log decay, `log_w` $= -e^{\omega}$, to the op.
#
# **$a$ and $b$ (erratum 19).** The post writes $a = -k$, $b = k\eta$, with the key $k$ itself; the code it walks
# through passes `-kk, kk * a`: the key that is *removed* is `kk`, the key times `k_k` normalized to unit length per
# head, and `a` is the learning rate $\alpha$. Section 4 shows why the unit length matters.
#
# Below, inputs made as RWKV-7 makes them (random, not from a model: notebook 05 makes them from one), and the
# update run in the post's own form, one head and one token at a time.

# %%
def rwkv7_inputs(B, T, H, N):
    # r, log_w, k, v, a, b as RWKV-7 makes them: log_w = -exp(omega), omega < -0.5; a = -kk, b = kk
    # * alpha.
    r, k, v = (rng.standard_normal((B, T, H, N)) for _ in range(3))
    omega = -0.5 - np.logaddexp(0.0, rng.normal(2.0, 2.0, (B, T, H, N)))   # soft-clamped below -0.5
    kk = rng.standard_normal((B, T, H, N))
    kk /= np.linalg.norm(kk, axis=-1, keepdims=True)                   # unit length per head
    alpha = rng.uniform(0.0, 1.0, (B, T, H, N))                        # in-context learning rate
    return dict(r=r, log_w=-np.exp(omega), k=k, v=v, a=-kk, b=kk * alpha)

B, T, H = 2, 24, 2
x = rwkv7_inputs(B, T, H, N)
S0 = rng.standard_normal((B, H, N, N))                                 # an initial state
decay = np.exp(x["log_w"])
print(f"log decay in [{x['log_w'].min():.3g}, {x['log_w'].max():.3g}] (negative); "
      f"decay exp(log_w) in [{decay.min():.3f}, {decay.max():.5f}], inside (0.545, 1)")


# %%
ARGS_POST = ("log_w", "r", "k", "v", "a", "b")

def update_as_in_the_post(x, S0):
    # state = state * w + state @ a @ b + v @ k, with a, v columns and b, k rows; one head, one
    # token at a time.
    y = np.empty_like(x["r"])
    S_final = np.empty_like(S0)
    for bi in range(B):
        for h in range(H):
            state = S0[bi, h].copy()
            for t in range(T):
                log_w, r, k, v, a, b = (x[name][bi, t, h] for name in ARGS_POST)
                w = np.exp(log_w)
                a, b, v, k = a[:, None], b[None, :], v[:, None], k[None, :]     # columns and rows
                state = state * w[None, :] + state @ a @ b + v @ k
                y[bi, t, h] = state @ r
            S_final[bi, h] = state
    return y, S_final

ARGS = ("r", "log_w", "k", "v", "a", "b")
y_post, S_post = update_as_in_the_post(x, S0)
y_ref, S_ref = ref.wkv7(*(x[n] for n in ARGS), state=S0)

# %% tags=["nbval-check-output"]
for what, actual, expected in (("the post's update: y vs reference.wkv7", y_post, y_ref),
                               ("the post's update: final state vs reference.wkv7", S_post, S_ref)):
    check(what, actual, expected, REFERENCE_BUDGET)

# %% [markdown]
# ## 3. The update as online gradient descent
#
# The post reads the update as "online learning": the state is trained, while the model reads, to map keys to
# values. Take the regression loss of one pair, $\ell(S) = \tfrac12\,\lVert S k - v\rVert^2$. Its gradient is
# $\nabla_S \ell = (S k - v)\,k^\top$, and one gradient step with learning rate $\eta$ is
#
# $$S - \eta\,(S k - v)\,k^\top = S\left(I - \eta\, k k^\top\right) + \eta\, v k^\top .$$
#
# That is the update with no decay ($w = 1$), $a = -k$, $b = \eta k$ and the value written $\eta v$: the correction
# term is the gradient's $S k k^\top$ part, the write its $v k^\top$ part. For a unit key, one step shrinks the
# retrieval error by exactly $1 - \eta$: $S' k - v = (1 - \eta)(S k - v)$. RWKV-7 generalizes the step: a decay
# $\mathrm{diag}(w_t)$ in front (weight decay, per channel), a learning rate $\alpha_t$ per channel, and the key
# removed ($\hat\kappa$) allowed to differ from the key written ($k$); hence "generalized delta rule". (The delta rule
# is the classical name of this step: the change is proportional to the error $v - S k$, the "delta".) Linear
# attention, by contrast, only adds $v k^\top$: it never corrects, so storing a second value under the same key adds
# the two.

# %%
S = rng.standard_normal((N, N))
eta = 0.3
loss = lambda S_: 0.5 * np.sum((S_ @ key - value) ** 2)               # noqa: E731
h = 1e-6
units = np.eye(N * N).reshape(N * N, N, N)  # E_ij: one entry 1, the rest 0
numerical_gradient = np.array([(loss(S + h * E) - loss(S - h * E)) / (2 * h)
                               for E in units]).reshape(N, N)          # central differences
gradient_step = S - eta * np.outer(S @ key - value, key)

def one(z):
    return np.asarray(z, dtype=float).reshape(1, 1, 1, N)              # (B, T, H, N) = (1, 1, 1, N)

step_inputs = (key, np.zeros(N), key, eta * value, -key, eta * key)       # r, log_w, k, v, a, b
_, S_step = ref.wkv7(*map(one, step_inputs), state=S[None, None])

# %% tags=["nbval-check-output"]
for what, actual, expected, budget in (
    ("(S k - v) k^T vs the gradient by finite differences", np.outer(S @ key - value, key),
     numerical_gradient, 1e-8),
    ("one step of reference.wkv7 (w = 1, a = -k, b = eta k, eta v) vs the gradient step",
     S_step[0, 0], gradient_step, REFERENCE_BUDGET),
    ("retrieval error after the step vs (1 - eta) times before", S_step[0, 0] @ key - value,
     (1 - eta) * (S @ key - value), REFERENCE_BUDGET),
):
    check(what, actual, expected, budget)

# %% [markdown]
# What a reader should see: four key-value pairs (orthonormal keys) presented over and over, and the retrieval error
# $\lVert S k_i - v_i \rVert$ after each step. The delta rule drives it down geometrically, faster for a larger $\eta$;
# after step 41 the value of pair 0 changes, and the delta rule learns the new one the next time pair 0 comes. The
# additive update (linear attention) holds $n\eta v_i$ after $n$ presentations: right only if $n\eta$ happens to be
# 1, then ever more wrong, and a changed value is added to the old one rather than replacing it. Every step is one
# call of `reference.wkv7` with the state passed on. With $\eta = 1$ a pair is learned exactly the first time it
# comes (the error drops to rounding, below the plot's lower edge at $10^{-6}$), and a changed value the next time.

# %%
pairs = 4
keys = np.linalg.qr(rng.standard_normal((N, N)))[0][:, :pairs].T      # (4, N) orthonormal keys
values = rng.standard_normal((pairs, N))
new_value0 = rng.standard_normal(N)

def retrieval_errors(eta, delta_rule, steps=80):
    state, errors, vals = np.zeros((1, 1, N, N)), [], values.copy()
    for t in range(steps):
        if t == 41:
            vals[0] = new_value0                                        # pair 0 gets a new value
        k, v = keys[t % pairs], vals[t % pairs]
        a, b = (-k, eta * k) if delta_rule else (np.zeros(N), np.zeros(N))
        _, state = ref.wkv7(one(k), one(np.zeros(N)), one(k), one(eta * v), one(a), one(b),
                            state=state)
        # mean of the pairs
        errors.append(np.linalg.norm(state[0, 0] @ keys.T - vals.T, axis=0).mean())
    return np.array(errors)

fig, ax = plt.subplots(figsize=(8, 4), constrained_layout=True)
for eta_ in (0.2, 0.5, 1.0):
    ax.semilogy(np.arange(1, 81), retrieval_errors(eta_, True),
                label=rf"delta rule, $\eta$ = {eta_}")
ax.semilogy(np.arange(1, 81), retrieval_errors(0.3, False), "k--",
            label=r"additive: $S \leftarrow S + \eta\,v k^\top$, $\eta$ = 0.3")
ax.axvline(41.5, color="grey", lw=0.8)
ax.text(42.5, 3e-6, "pair 0 gets\na new value", fontsize=8)
ax.set_ylim(1e-6, 30)
ax.set_xlabel("step (the four pairs presented in turn)")
ax.set_ylabel(r"mean retrieval error $\Vert S k_i - v_i \Vert$")
ax.set_title("the update as online gradient descent on $\\frac{1}{2}\\Vert S k - v \\Vert^2$")
ax.legend(fontsize=8)
plt.show()


# %% [markdown]
# ## 4. The transition's eigenvalues stay in the unit disc
#
# Write the update as $S_t = S_{t-1} P_t + v_t k_t^\top$ with the transition $P_t = \mathrm{diag}(w_t) + a_t b_t^\top$.
# What the state held at time $s$ reaches time $t$ multiplied by $P_{s+1} \cdots P_t$; if a transition had an eigenvalue
# of modulus above 1, a run of similar tokens would amplify old content without bound. RWKV-7's choice rules that out.
# With $a = -\hat\kappa$, $b = \hat\kappa \odot \alpha$, $\lVert\hat\kappa\rVert = 1$, $\alpha \in (0, 1)^N$,
# $w \in (0, 1)^N$, let $D = \mathrm{diag}(\sqrt{\alpha})$ and $z = D\hat\kappa$. Then
#
# $$D\,P\,D^{-1} = \mathrm{diag}(w) - D\hat\kappa\,\left(\hat\kappa \odot \alpha\right)^\top D^{-1}
# = \mathrm{diag}(w) - z z^\top ,$$
#
# a symmetric matrix, so the eigenvalues of $P$ are real. Subtracting $z z^\top \succeq 0$ can only lower them: the
# largest is at most $\max_j w_j < 1$. And it lowers them by at most $\lVert z\rVert^2 =
# \sum_j \alpha_j \hat\kappa_j^2 < \sum_j \hat\kappa_j^2 = 1$: the smallest is above $\min_j w_j - 1 > -1$. Every
# eigenvalue of every RWKV-7 transition lies in $(-1, 1)$. (Section 8 narrows this with the published parameter
# ranges, and says why the negative end matters.)
#
# The post's $a = -k$, $b = k\eta$ with a key of any length gives $\lVert z\rVert^2 = \sum_j \eta_j k_j^2$, which is as
# large as the key is long: eigenvalues far below $-1$, and a state that flips sign and grows at every step. For
# contrast, a generalized delta rule with unrelated $a$ and $b$ has complex eigenvalues, some outside the disc too.
#
# What the proof rules out is the runaway of a transition that repeats, as the post's does below. It does not bound
# every product of different transitions. A single $P_t$ is not symmetric, and its norm can slightly exceed 1 (the
# largest is printed below), so one step may lengthen a row of the state. The long run after the plot shows what
# happens in practice.

# %%
def transitions(kind, count=400):
    # Random transitions diag(w) + a b^T of one kind, as (count, N, N).
    w = np.exp(-np.exp(-0.5 - np.logaddexp(0.0, rng.normal(2.0, 2.0, (count, N)))))
    k = rng.standard_normal((count, N))
    if kind == "rwkv7":
        kk = k / np.linalg.norm(k, axis=1, keepdims=True)
        a, b = -kk, kk * rng.uniform(0.0, 1.0, (count, N))
    elif kind == "post":  # a = -k, b = k * eta, k not normalized
        a, b = -k, k * rng.uniform(0.0, 1.0, (count, N))
    else:                                                              # a and b unrelated
        a, b = (rng.standard_normal((count, N)) / np.sqrt(N) for _ in range(2))
    return w[:, :, None] * np.eye(N) + a[:, :, None] * b[:, None, :]

KINDS = {"rwkv7": r"RWKV-7: $a = -\hat\kappa$, $b = \hat\kappa \odot \alpha$",
         "post": r"the post: $a = -k$, $b = k\eta$",
         "unrelated": r"$a$, $b$ unrelated"}
P = {kind: transitions(kind) for kind in KINDS}
eigenvalues = {kind: np.linalg.eigvals(P[kind]) for kind in KINDS}

# %% tags=["nbval-check-output"]
rwkv7_eigs = eigenvalues["rwkv7"]
print("RWKV-7 transitions: every eigenvalue real:", bool(np.abs(rwkv7_eigs.imag).max() < 1e-9))
print("RWKV-7 transitions: every eigenvalue in (-1, 1):", bool(np.abs(rwkv7_eigs).max() < 1))
print("the post's a = -k, b = k eta: some eigenvalue of modulus > 1:",
      bool(np.abs(eigenvalues["post"]).max() > 1))

# %% [markdown]
# The similarity behind the proof, checked on one transition, and the largest norm $\lVert P_t \rVert_2$ among the
# RWKV-7 transitions drawn (machine-independent enough to print here, but not compared):

# %%
w1 = np.exp(-np.exp(-0.5 - np.logaddexp(0.0, rng.normal(2.0, 2.0, N))))
kk1 = rng.standard_normal(N)
kk1 /= np.linalg.norm(kk1)
alpha1 = rng.uniform(0.0, 1.0, N)
P1 = np.diag(w1) + np.outer(-kk1, kk1 * alpha1)
D1 = np.diag(np.sqrt(alpha1))
z1 = D1 @ kk1
largest_norm = np.linalg.norm(P["rwkv7"], 2, axis=(1, 2)).max()
print(f"largest spectral norm of the {len(P['rwkv7'])} RWKV-7 transitions: {largest_norm:.3f}")

# %% tags=["nbval-check-output"]
check("D P D^-1 vs diag(w) - z z^T", D1 @ P1 @ np.linalg.inv(D1), np.diag(w1) - np.outer(z1, z1),
      REFERENCE_BUDGET)
print("so P has real eigenvalues:", bool(np.abs(np.linalg.eigvals(P1).imag).max() < 1e-12))

# %%
fig, axes = plt.subplots(1, 3, figsize=(10, 3.6), constrained_layout=True)
circle = np.exp(1j * np.linspace(0, 2 * np.pi, 200))
for ax, (kind, title) in zip(axes, KINDS.items()):
    e = eigenvalues[kind].ravel()
    ax.plot(circle.real, circle.imag, "k-", lw=0.8, label="unit circle")
    ax.plot(e.real, e.imag, ".", ms=3, alpha=0.4, label="eigenvalues")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("real part")
    ax.set_ylabel("imaginary part")
    ax.set_xlim(-2.5, 2.7)
    ax.set_ylim(-1.6, 1.6)
    ax.set_aspect("equal")
    ax.text(0.02, 0.03, f"{(np.abs(e) > 1).mean():.0%} outside the unit disc\n"
            f"real parts from {e.real.min():.2g} to {e.real.max():.2g}",
            transform=ax.transAxes, fontsize=8)
axes[0].legend(loc="upper left", fontsize=8)
fig.suptitle(r"eigenvalues of 400 transitions diag(w) + a b$^\top$ each (N = 8)")
plt.show()

# %% [markdown]
# The consequence over a long run: 300 tokens through one head, keys and values of unit size, from the same random
# draws, once with RWKV-7's $a, b$ and once with the post's.

# %%
long = rwkv7_inputs(1, 300, 1, N)
# the post's a = -k, b = k eta
post = dict(long, a=-long["k"], b=long["k"] * rng.uniform(0.0, 1.0, long["k"].shape))
with np.errstate(over="ignore", invalid="ignore"):
    state_norms = {name: [np.linalg.norm(ref.wkv7(*(inputs[n][:, :t] for n in ARGS))[1])
                          for t in (10, 100, 300)]
                   for name, inputs in (("RWKV-7", long), ("the post", post))}
for name, norms in state_norms.items():
    print(f"{name:9s}: |S_t| at t = 10, 100, 300:", ", ".join(f"{n:.3g}" for n in norms))

# %% tags=["nbval-check-output"]
print("RWKV-7's state in this run (one run, not a bound): |S| < 100 at t = 300:",
      bool(state_norms["RWKV-7"][-1] < 100))
print("the post's a = -k, b = k eta: |S| past 1e20 or not finite by t = 300:",
      bool(not np.isfinite(state_norms["the post"][-1]) or state_norms["the post"][-1] > 1e20))


# %% [markdown]
# ## 5. Without recursion: a product of transitions
#
# Unrolling $S_t = S_{t-1}P_t + v_t k_t^\top$ from $S_0$:
#
# $$S_t = S_0\, P_1 P_2 \cdots P_t + \sum_{s=1}^{t} v_s k_s^\top\, P_{s+1} \cdots P_t, \qquad y_t = S_t r_t .$$
#
# A token's write reaches every later token through the product of the transitions in between: where RWKV-4 had a
# scalar weight $e^{(t-1-s)w}$ per channel, RWKV-7 has an $N \times N$ matrix. Written out below for one head, as a
# definition (it costs $O(T^2 N^3)$: for checking only), against `reference.wkv7_transition_product` and the
# recurrence.

# %%
def by_products(x, S0, bi, h):
    P_ = [np.diag(np.exp(x["log_w"][bi, t, h])) + np.outer(x["a"][bi, t, h], x["b"][bi, t, h])
          for t in range(T)]                                            # the transitions P_1 .. P_T
    eye = np.eye(N)
    ys = []
    for t in range(1, T + 1):                                          # 1-based as in the formula
        S_t = S0[bi, h] @ reduce(np.matmul, P_[:t], eye)
        writes = (np.outer(x["v"][bi, s - 1, h], x["k"][bi, s - 1, h]) for s in range(1, t + 1))
        S_t = S_t + sum(vk @ reduce(np.matmul, P_[s:t], eye)
                        for s, vk in enumerate(writes, start=1))
        ys.append(S_t @ x["r"][bi, t - 1, h])
    return np.array(ys), S_t

y_products, S_products = by_products(x, S0, 1, 0)                     # batch row 1, head 0
y_tp, S_tp = ref.wkv7_transition_product(*(x[n] for n in ARGS), state=S0)

# %% tags=["nbval-check-output"]
for what, actual, expected in (
    ("products of transitions (one head) vs reference.wkv7: y", y_products, y_ref[1, :, 0]),
    ("products of transitions (one head) vs reference.wkv7: state", S_products, S_ref[1, 0]),
    ("reference.wkv7_transition_product vs reference.wkv7: y", y_tp, y_ref),
    ("reference.wkv7_transition_product vs reference.wkv7: state", S_tp, S_ref),
):
    check(what, actual, expected, REFERENCE_BUDGET)


# %% [markdown]
# ## 6. The chunked WY form
#
# The recurrence is sequential: $T$ steps, each a rank-one update of an $N \times N$ matrix. Fast kernels cut time into
# chunks of $L$ steps and do the work inside a chunk with matrix products. Three steps get there; each is checked on
# one chunk of one head before the next.
#
# **Step 1: unroll the chunk.** Let $S_0$ be the state that enters the chunk, $c_i = \sum_{m \le i} \log w_m$ the
# cumulative log decay ($c_0 = 0$), and $u_i = S_{i-1} a_i$ the vector the correction term uses. If the $u_i$ were
# known, the chunk would be as easy as linear attention with decay:
#
# $$S_i = S_0\,\mathrm{diag}(e^{c_i}) + \sum_{j \le i} \left(u_j b_j^\top + v_j k_j^\top\right)\mathrm{diag}(e^{c_i - c_j}) .$$
#
# Checked with the $u_i$ taken from running the recurrence:

# %%
L = 6
# one chunk, one head: (L, N)
lw, a, b, k_c, v_c = (x[n][0, :L, 0] for n in ("log_w", "a", "b", "k", "v"))
S_in = S0[0, 0]  # the state entering the chunk
c = np.cumsum(lw, axis=0)                                              # c_1 .. c_L
c_prev = np.vstack([np.zeros(N), c[:-1]])                              # c_0 .. c_{L-1}
S_run, u_run, S_steps = S_in, [], []
for i in range(L):                                                     # the recurrence, keeping u_i
    u_run.append(S_run @ a[i])
    S_run = S_run * np.exp(lw[i]) + np.outer(u_run[-1], b[i]) + np.outer(v_c[i], k_c[i])
    S_steps.append(S_run)

def unrolled(i, u):
    # S_i from S_0 and u_1 .. u_i (0-based i: the state after step i + 1).
    decay = np.exp(c[i] - c[:i + 1])                                   # (i + 1, N): e^{c_i - c_j}
    return S_in * np.exp(c[i]) + (u[:i + 1, :, None] * (b[:i + 1] * decay)[:, None, :]).sum(0) \
        + (v_c[:i + 1, :, None] * (k_c[:i + 1] * decay)[:, None, :]).sum(0)

# %% tags=["nbval-check-output"]
check("step 1: S_i unrolled, with the recurrence's u_i, vs the recurrence",
      np.array([unrolled(i, np.array(u_run)) for i in range(L)]), np.array(S_steps),
      REFERENCE_BUDGET)

# %% [markdown]
# **Step 2: find the $u_i$ without the recurrence.** Multiplying step 1's formula (at $i - 1$) by $a_i$ gives an
# equation for the $u$'s themselves:
#
# $$u_i = S_0\left(a_i \odot e^{c_{i-1}}\right) + \sum_{j < i} \left(A_{ab}\right)_{ij}\, u_j + \left(A_{ak}\right)_{ij}\, v_j,
# \qquad \left(A_{xy}\right)_{ij} = \sum_n x_{i,n}\, y_{j,n}\, e^{c_{i-1,n} - c_{j,n}} \ (j < i),$$
#
# a unit lower-triangular linear system $(I - A_{ab})\,U = \tilde A\, S_0^\top + A_{ak} V$ in the $L$ rows $u_i$
# ($\tilde A_i = a_i \odot e^{c_{i-1}}$), solved by forward substitution (or by inverting $I - A_{ab}$: the
# "UT transform"). The couplings $A_{ab}$, $A_{ak}$ are $L \times L$ matrices: products a tensor core can do.

# %%
def coupling(x_, y_):
    # (A_xy)_ij = sum_n x_in y_jn e^{c_{i-1,n} - c_{j,n}} for j < i, 0 elsewhere: (L, L).
    below = np.tril(np.ones((L, L), dtype=bool), -1)[:, :, None]         # j < i
    exponent = np.where(below, c_prev[:, None, :] - c[None, :, :], -np.inf)   # <= 0 where used
    return np.einsum("in,jn,ijn->ij", x_, y_, np.exp(exponent))

A_ab, A_ak = coupling(a, b), coupling(a, k_c)
A_tilde = a * np.exp(c_prev)                                           # (L, N) rows a_i e^{c_{i-1}}
rhs = A_tilde @ S_in.T + A_ak @ v_c                                    # (L, N)
U = np.empty((L, N))
for i in range(L):                                                     # forward substitution
    U[i] = rhs[i] + A_ab[i, :i] @ U[:i]

# %% tags=["nbval-check-output"]
check("step 2: u_i from (I - A_ab) U = A~ S_0^T + A_ak V vs the recurrence's", U, np.array(u_run),
      REFERENCE_BUDGET)

# %% [markdown]
# **Step 3: the chunk's end as a product.** Splitting the solution into the part that is linear in $S_0$ and the rest,
# $U = W S_0^\top + U_0$ with $(I - A_{ab})\,W = \tilde A$, gives the state at the chunk's end,
#
# $$S_L = S_0\,\underbrace{\left(\mathrm{diag}(e^{c_L}) + W^\top \hat B\right)}_{=\,P_1 \cdots P_L} + U_0^\top \hat B
# + V^\top \hat K, \qquad \hat B_j = b_j \odot e^{c_L - c_j}, \quad \hat K_j = k_j \odot e^{c_L - c_j} .$$
#
# The product of $L$ transitions "diagonal plus rank one" is a diagonal plus a rank-$L$ correction, stored as two
# $L \times N$ matrices $W$ and $\hat B$: the WY representation (as for products of Householder reflections). Every
# exponent above is a decay from a later step back to an earlier one ($\le 0$), so nothing overflows.

# %%
W = np.empty((L, N))
U0 = np.empty((L, N))
for i in range(L):  # the same forward substitution, twice
    W[i] = A_tilde[i] + A_ab[i, :i] @ W[:i]
    U0[i] = (A_ak @ v_c)[i] + A_ab[i, :i] @ U0[:i]
B_hat, K_hat = b * np.exp(c[-1] - c), k_c * np.exp(c[-1] - c)          # (L, N) each
wy_product = np.diag(np.exp(c[-1])) + W.T @ B_hat                      # (N, N)
direct_product = reduce(np.matmul, [np.diag(np.exp(lw[i])) + np.outer(a[i], b[i])
                                    for i in range(L)])                # P_1 ... P_L
S_end = S_in @ wy_product + U0.T @ B_hat + v_c.T @ K_hat

# %% tags=["nbval-check-output"]
check("step 3: WY form diag(e^{c_L}) + W^T B^ vs P_1 ... P_L", wy_product, direct_product,
      REFERENCE_BUDGET)
check("step 3: S_L = S_0 (WY product) + U_0^T B^ + V^T K^ vs the recurrence", S_end, S_steps[-1],
      REFERENCE_BUDGET)

# %% [markdown]
# `reference.wkv7_chunked` runs the three steps chunk after chunk, the end state of one entering the next. With
# $T = 24$, chunks of 5 leave a short last chunk and chunks of 16 one of 8: the form needs no multiple.

# %% tags=["nbval-check-output"]
for chunk_size in (1, 5, 16, T):
    y_c, S_c = ref.wkv7_chunked(*(x[n] for n in ARGS), state=S0, chunk_size=chunk_size)
    check(f"reference.wkv7_chunked, chunk {chunk_size:2d} vs the recurrence: y", y_c, y_ref,
          REFERENCE_BUDGET)
    check(f"reference.wkv7_chunked, chunk {chunk_size:2d} vs the recurrence: state", S_c, S_ref,
          REFERENCE_BUDGET)

# %% [markdown]
# What the chunking buys: the sequential dependency runs over $T / L$ chunks instead of $T$ tokens, and the work
# inside a chunk is matrix products ($L \times L$ couplings, $L \times N$ by $N \times N$) that a GPU's tensor cores or
# a CPU's BLAS run well. The torch path of `kernels/wkv7/` is this form.
#
# The figure draws it. Left: the $T \times T$ coupling of every step with the steps before it (which $u_j$, $v_j$
# step $i$ depends on), cut into $L \times L$ blocks. Only the diagonal blocks (dark) are solved as triangular
# systems, inside a chunk; every block below them (light) is never formed: its whole effect reaches the later
# chunk through the $N \times N$ state that enters it. Right: the cost of one head, counted with the formulas of
# steps 1-3 (multiply-adds: four $L \times L$ couplings, the triangular solve, $A_{ak} V$ and the outputs' three
# $L \times L$ products, $9 L^2 N$ a chunk; four products with the state, $4 L N^2$, the way the kernels update it),
# so $T (9 L N + 4 N^2)$ in all over $T / L$ sequential steps. $L = 1$ is the recurrence ($T$ steps of $O(N^2)$),
# $L = T$ the quadratic form (one step, $O(T^2 N)$ work); at $N = 64$, $L = 16$ cuts the sequential depth 16 times
# for 1.5 times the work. Notebook 12 measures it.

# %%
from matplotlib.colors import ListedColormap

T_fig, L_fig = 64, 16
i_fig, j_fig = np.indices((T_fig, T_fig))
in_chunk = (i_fig // L_fig == j_fig // L_fig) & (j_fig < i_fig)                # solved inside a chunk
fig, (ax_blocks, ax_cost) = plt.subplots(1, 2, figsize=(11, 4.2))
ax_blocks.imshow(np.where(in_chunk, 2, j_fig < i_fig), cmap=ListedColormap(["white", "#c6dbef", "#08519c"]))
for edge in np.arange(0, T_fig + 1, L_fig) - 0.5:
    ax_blocks.axhline(edge, color="grey", lw=0.8)
    ax_blocks.axvline(edge, color="grey", lw=0.8)
ax_blocks.set(title=f"T = {T_fig}: the coupling in {L_fig} x {L_fig} blocks\ndark: triangular solve; light: carried by S",
              xlabel="earlier step j", ylabel="step i")
T_cost, N_cost, L_all = 1024, 64, 2 ** np.arange(11)
steps, work = T_cost / L_all, T_cost * (9 * L_all * N_cost + 4 * N_cost**2)
ax_cost.loglog(steps, work, "o-")
for L_, s_, w_ in zip(L_all, steps, work):
    ax_cost.annotate(f"L={L_}", (s_, w_), textcoords="offset points", xytext=(4, 4), fontsize=8)
ax_cost.set(title=f"one head, T = {T_cost}, N = {N_cost}", xlabel="sequential steps T / L",
            ylabel="multiply-adds T (9 L N + 4 N^2)")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 7. The state over time
#
# What a reader should see: one head's state $S_t$ (rows: value channels, columns: key channels) while a short stream
# of pairs is written. The keys are the unit vectors $e_0, e_1, e_2, e_3$, so column $j$ is the value stored under
# key $j$ (any orthonormal keys would do; these keep the picture readable). Steps 1 to 4 write keys 0 to 3; step 5
# writes key 0 again with a new value, step 6 key 2. With the delta rule ($a = -k$, $b = k$, $\alpha = 1$) the
# column is replaced; with plain accumulation ($a = b = 0$, linear attention) the new value is added to the old one.
# No decay here ($w = 1$), to isolate the correction and the write. The top strip shows the values written; the
# heatmaps show steps 4 to 6, the two rules and their difference (which appears only where a key was written twice).

# %%
N_show = 4
stream_keys = [0, 1, 2, 3, 0, 2]  # key e_j written at each step
stream_values = rng.standard_normal((len(stream_keys), N_show))
unit = np.eye(N_show)

def states_over_time(delta_rule):
    state, states = np.zeros((1, 1, N_show, N_show)), []
    for j, v in zip(stream_keys, stream_values):
        as_input = lambda z: z.reshape(1, 1, 1, N_show)                # noqa: E731
        k = unit[j]
        a, b = (-k, k) if delta_rule else (0 * k, 0 * k)
        _, state = ref.wkv7(*(as_input(z) for z in (k, 0 * k, k, v, a, b)), state=state)
        states.append(state[0, 0])
    return states

delta_states, additive_states = states_over_time(True), states_over_time(False)

# %%
shown = (3, 4, 5)                                                      # steps 4, 5, 6 (0-based)
rows = {"delta rule": delta_states, "additive": additive_states,
        "delta rule - additive": [d_ - a_ for d_, a_ in zip(delta_states, additive_states)]}
limit = np.abs(np.array(additive_states)).max()
fig = plt.figure(figsize=(9, 9.5), constrained_layout=True)
grid = fig.add_gridspec(4, 3, height_ratios=[0.8, 1, 1, 1])
strip = fig.add_subplot(grid[0, :])
strip.imshow(stream_values.T, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
strip.set_xticks(range(len(stream_keys)),
                 [f"step {t + 1}: key {j}" for t, j in enumerate(stream_keys)])
strip.set_ylabel("value channel")
strip.set_title("the values written (one column per step)", fontsize=10)
for row, (name, states) in enumerate(rows.items(), start=1):
    for col, t in enumerate(shown):
        ax = fig.add_subplot(grid[row, col])
        image = ax.imshow(states[t], cmap="RdBu_r", vmin=-limit, vmax=limit)
        ax.set_title(f"{name}, after step {t + 1}", fontsize=9)
        ax.set_xticks(range(N_show))
        ax.set_yticks(range(N_show))
        if row == 3:
            ax.set_xlabel("key channel")
        if col == 0:
            ax.set_ylabel("value channel")
fig.colorbar(image, ax=fig.axes, shrink=0.5, label="state entry S[value, key]")
plt.show()

# %% tags=["nbval-check-output"]
latest = {j: v for j, v in zip(stream_keys, stream_values)}  # the last value written under each key
summed = {j: sum(v for jj, v in zip(stream_keys, stream_values) if jj == j) for j in latest}
for j in sorted(latest):
    check(f"delta rule: column {j} vs the last value written under key {j}", delta_states[-1][:, j],
          latest[j], REFERENCE_BUDGET)
    check(f"additive: column {j} vs the sum of the values written under key {j}",
          additive_states[-1][:, j], summed[j], REFERENCE_BUDGET)

# %% [markdown]
# ## 8. Negative eigenvalues, and what they buy
#
# Section 4 put every eigenvalue of a transition inside $(-1, 1)$. The ranges the published model gives its
# parameters narrow that interval, and its lower end is negative: a transition can flip the sign of what the state
# holds along one direction. No RWKV-4 or Mamba transition can. This section derives the interval, checks it, and
# shows with a toy why a sign flip is what counting needs.
#
# **The transition, in the model's terms.** With the op's $a = -\hat\kappa$ and $b = \hat\kappa \odot \alpha$, the
# update $S_t = S_{t-1} G_t + v_t k_t^\top$ has the transition
#
# $$G_t = \mathrm{diag}(w_t) - \hat\kappa_t \left(\alpha_t \odot \hat\kappa_t\right)^\top .$$
#
# The published model makes $w = e^{-e^{-0.5}\sigma(\cdot)} \in (e^{-e^{-0.5}}, 1) = (0.545, 1)$ (notebook 05,
# exercise 2, shows this is the post's $e^{-e^{\omega}}$) and $\alpha = \sigma(\cdot) \in (0, 1)$. Checked: one step
# of `reference.wkv7` that writes nothing ($k = 0$) takes a random state $S$ to $S\,G$.

# %%
from seqmix.reference.functional import sigmoid
from seqmix.reference.rwkv7 import in_context_rate

def transition(w, kk, alpha):
    # G = diag(w) - kk (alpha * kk)^T: the op's diag(w) + a b^T with a = -kk, b = kk * alpha.
    return np.diag(w) - np.outer(kk, alpha * kk)

def published_draws(count, spread=3.0):
    # w = exp(-e^-0.5 sigmoid(z)) in (0.545, 1), a unit kk, alpha = sigmoid(z'): (count, N) each.
    w_ = np.exp(-np.exp(-0.5) * sigmoid(rng.normal(0.0, spread, (count, N))))
    kk_ = rng.standard_normal((count, N))
    kk_ /= np.linalg.norm(kk_, axis=1, keepdims=True)
    return w_, kk_, sigmoid(rng.normal(0.0, spread, (count, N)))

(w8,), (kk8,), (alpha8,) = published_draws(1)
S8 = rng.standard_normal((N, N))
no_write = (np.zeros(N), np.log(w8), np.zeros(N), np.zeros(N), -kk8, kk8 * alpha8)   # r, log_w, k, v, a, b
_, S8_next = ref.wkv7(*map(one, no_write), state=S8[None, None])

# %% tags=["nbval-check-output"]
check("one step of reference.wkv7 with k = 0 vs S G", S8_next[0, 0], S8 @ transition(w8, kk8, alpha8),
      REFERENCE_BUDGET)

# %% [markdown]
# **The range, equal decays first.** Let every channel have the same decay $w$. A vector $x$ orthogonal to
# $\alpha \odot \hat\kappa$ is only decayed, $G x = w x$: that gives $N - 1$ eigenvalues equal to $w$. Along
# $\hat\kappa$,
#
# $$G \hat\kappa = w\,\hat\kappa - \hat\kappa \sum_j \alpha_j \hat\kappa_j^2 = (w - \bar\alpha)\,\hat\kappa, \qquad
# \bar\alpha = \sum_j \alpha_j \hat\kappa_j^2 ,$$
#
# where $\bar\alpha$ is a weighted mean of the rates (the weights $\hat\kappa_j^2$ sum to 1), so it lies in $(0, 1)$.
# With $w \in (0.545, 1)$ the eigenvalue along $\hat\kappa$ lies in $(0.545 - 1,\, 1) = (-0.455,\, 1)$.
#
# **Any decays.** Section 4's similarity makes $G$ similar to $\mathrm{diag}(w) - z z^\top$ with
# $z = \sqrt{\alpha} \odot \hat\kappa$ and $\lVert z\rVert^2 = \bar\alpha$. Subtracting the positive semidefinite
# $z z^\top$, of norm $\bar\alpha < 1$, moves every eigenvalue down by at most $\bar\alpha$ (Weyl's inequality), so
# the spectrum lies in $(\min_j w_j - 1,\, \max_j w_j) \subset (-0.455,\, 1)$. Checked: the equal-decay eigenvalue
# $w - \bar\alpha$ on one transition, then the interval on 20000 random transitions drawn with the published ranges
# (wide spreads of the sigmoids' inputs, so that some draws come near the ends).

# %%
w_eq = np.full(N, w8[0])                                               # one decay for every channel
alpha_bar = (alpha8 * kk8**2).sum()
G_eq = transition(w_eq, kk8, alpha8)

w_p, kk_p, alpha_p = published_draws(20000)
G_published = w_p[:, :, None] * np.eye(N) - kk_p[:, :, None] * (alpha_p * kk_p)[:, None, :]
eig_published = np.linalg.eigvals(G_published)

# %% tags=["nbval-check-output"]
check("G kk vs (w - alpha_bar) kk, equal decays", G_eq @ kk8, (w8[0] - alpha_bar) * kk8, REFERENCE_BUDGET)
print("published ranges: every eigenvalue real:", bool(np.abs(eig_published.imag).max() < 1e-9))
print("published ranges: every eigenvalue in (-0.455, 1):",
      bool(eig_published.real.min() > np.exp(-np.exp(-0.5)) - 1 and eig_published.real.max() < 1))
print("published ranges: some eigenvalues negative:", bool((eig_published.real < 0).any()))

# %% [markdown]
# **The wide rate.** `Rwkv7Config(wide_in_context_rate=True)` (not the published model) makes the rate
# $\alpha = (1 + w)\,\sigma(\cdot) \in (0, 1 + w)$ per channel: `reference.rwkv7.in_context_rate(z, log_w, wide=True)`.
# With equal decays the eigenvalue along $\hat\kappa$ becomes $w - \bar\alpha > w - (1 + w) = -1$. For any decays,
# $G + I$ is similar to $\mathrm{diag}(1 + w) - z z^\top$, which is positive definite exactly when
# $z^\top \mathrm{diag}(1 + w)^{-1} z = \sum_j \frac{\alpha_j}{1 + w_j}\,\hat\kappa_j^2 < 1$, and with
# $\alpha_j < 1 + w_j$ that sum is below $\sum_j \hat\kappa_j^2 = 1$. So every eigenvalue lies in $(-1, 1)$: a sign flip
# can be nearly lossless, and since the top of the interval is still $\max_j w_j < 1$ the state still cannot grow.
# The same numerical check, on the same decays and keys with the rate made wide from the same kind of draws:

# %%
z_wide = rng.normal(0.0, 3.0, w_p.shape)
alpha_w = in_context_rate(z_wide, np.log(w_p), wide=True)              # (1 + w) sigmoid(z), in (0, 1 + w)
G_wide = w_p[:, :, None] * np.eye(N) - kk_p[:, :, None] * (alpha_w * kk_p)[:, None, :]
eig_wide = np.linalg.eigvals(G_wide)

# %% tags=["nbval-check-output"]
print("wide rate: alpha in (0, 1 + w):", bool(((alpha_w > 0) & (alpha_w < 1 + w_p)).all()))
print("wide rate: every eigenvalue real and in (-1, 1):",
      bool(np.abs(eig_wide.imag).max() < 1e-9 and np.abs(eig_wide.real).max() < 1))
print("wide rate: some eigenvalues below -0.455:", bool(eig_wide.real.min() < np.exp(-np.exp(-0.5)) - 1))

# %% [markdown]
# What a reader should see: the published ranges leave a thin negative tail that stops short of $-0.455$; the wide
# rate stretches it towards $-1$. RWKV-4's and Mamba's transitions are diagonal with entries in $(0, 1)$: their
# eigenvalues sit in the shaded band, and none is negative.

# %%
fig, ax = plt.subplots(figsize=(9, 3.4), constrained_layout=True)
bins = np.linspace(-1.05, 1.05, 106)
ax.axvspan(0, 1, color="0.9", label="RWKV-4, Mamba: (0, 1)")
ax.hist(eig_published.real.ravel(), bins=bins, alpha=0.7, label=r"RWKV-7 as published: $\alpha \in (0, 1)$")
ax.hist(eig_wide.real.ravel(), bins=bins, alpha=0.5, label=r"wide rate: $\alpha \in (0, 1 + w)$")
for edge, text in ((np.exp(-np.exp(-0.5)) - 1, "-0.455"), (-1.0, "-1")):
    ax.axvline(edge, color="k", lw=0.8, ls="--")
    ax.text(edge + 0.01, 0.5, text, transform=ax.get_xaxis_transform(), fontsize=8)
ax.set_yscale("log")
ax.set_xlabel("eigenvalue of the transition G (all real)")
ax.set_ylabel("count (log scale)")
ax.set_title(f"eigenvalues of {len(w_p)} random transitions (N = {N})")
ax.legend(fontsize=8, loc="upper left")
plt.show()
print(f"published: {(eig_published.real < 0).mean():.1%} negative, smallest {eig_published.real.min():.3f}; "
      f"wide: {(eig_wide.real < 0).mean():.1%} negative, smallest {eig_wide.real.min():.3f}")

# %% [markdown]
# **Why a sign matters: parity.** Parity (is the number of 1s among the tokens so far odd?) is the smallest
# state-tracking problem: the answer depends on every token, and one token flips it. Take the one-dimensional linear
# recurrence
#
# $$x_t = g(\text{token}_t)\, x_{t-1}, \qquad x_0 = 1 .$$
#
# With $g(0) = 1$, $g(1) = -1$, $x_T = (-1)^{n}$ where $n$ is the number of 1s: its sign is the parity, exactly, at
# any length. With $g$ restricted to $[0, 1]$, as for a positive decay, $x_T = g(0)^{T-n} g(1)^{n} \ge 0$ has no sign
# to give, and for a fixed $T$ it is monotone in $n$. A readout that thresholds $x_T$ (a linear layer and a sign)
# therefore answers "is $n \le m$?" for some $m$, which matches the parity on only about half of the counts on each
# side of the cut. The best cut's accuracy follows from the binomial distribution of $n$; a brute-force search over $g$ and
# thresholds on every string of length 8 finds the same value, and nothing better.

# %%
def run_recurrence(bits, g0, g1):
    # x_T of x_t = g(token_t) x_{t-1}, x_0 = 1, for each row of bits (count, T).
    x_ = np.ones(len(bits))
    for column in bits.T:
        x_ = np.where(column == 1, g1, g0) * x_
    return x_

def best_cut_accuracy(T_):
    # Best accuracy of "odd iff n <= m" (or its opposite) over m, with n ~ Binomial(T_, 1/2).
    p = np.array([math.comb(T_, n) for n in range(T_ + 1)]) / 2.0**T_
    odd = np.arange(T_ + 1) % 2 == 1
    right = np.cumsum(p * odd) + (p[~odd].sum() - np.cumsum(p * ~odd))   # odd for n <= m, even for n > m
    return max(right.max(), (1 - right).max())

def brute_force_accuracy(T_, grid=np.linspace(0.0, 1.0, 11)):
    # Every string of length T_, every (g0, g1) on the grid, every threshold and direction.
    bits = (np.arange(2**T_)[:, None] >> np.arange(T_)) & 1
    odd = bits.sum(1) % 2 == 1
    best = 0.0
    for g0 in grid:
        for g1 in grid:
            x_T = run_recurrence(bits, g0, g1)
            values = np.unique(x_T)
            for theta in np.concatenate([[values[0] - 1], (values[:-1] + values[1:]) / 2]):
                right = ((x_T > theta) == odd).mean()
                best = max(best, right, 1 - right)
    return best

random_bits = rng.integers(0, 2, (2000, 1000))
random_odd = random_bits.sum(1) % 2 == 1

# %% tags=["nbval-check-output"]
print("g(0) = 1, g(1) = -1: sign of x_T is the parity at T = 1000, every string:",
      bool(((run_recurrence(random_bits, 1.0, -1.0) < 0) == random_odd).all()))
check("g in [0, 1]: brute-force best accuracy at T = 8 vs the best cut", brute_force_accuracy(8),
      best_cut_accuracy(8), REFERENCE_BUDGET)
for T_ in (2, 8, 32, 128, 1000):
    print(f"g in [0, 1], best threshold on x_T, T = {T_:4d}: accuracy {best_cut_accuracy(T_):.3f}")

# %% [markdown]
# The best a positive $g$ can do falls to a coin toss as the sequence grows ($0.5 + O(1/\sqrt{T})$). (A readout other
# than a threshold could still decode $n$ from $g(1)^n$ in exact arithmetic; in finite precision it cannot, once
# $g(1)^n$ rounds away: the setting of the results below.) RWKV-7's published range sits in between: a flip is
# possible, but along $\hat\kappa$ it multiplies by at most $0.455$ in size, so a parity flag kept that way fades
# like $0.455^n$ and sinks below fp32's rounding of anything of size 1 after about 20 flips; with the wide rate a
# flip can have size near 1.
# Exercise 4 builds that flag out of `reference.wkv7` itself.
#
# **The literature.** Grazzi et al., "Unlocking State-Tracking in Linear RNNs Through Negative Eigenvalues",
# arXiv:2411.12537 (https://arxiv.org/abs/2411.12537), prove that a finite-precision linear RNN whose transitions
# have only positive eigenvalues cannot solve parity, and find that extending the range to $[-1, 1]$ lets such models
# learn it; Merrill et al., "The Illusion of State in State-Space Models", arXiv:2404.08819
# (https://arxiv.org/abs/2404.08819), show that state-space models such as Mamba, with diagonal transitions, stay in
# the same complexity class as transformers ($\mathsf{TC}^0$) and so, assuming $\mathsf{TC}^0 \ne \mathsf{NC}^1$ (the
# standard conjecture), cannot express harder state tracking (composing permutations) unless their transitions become
# input-dependent and non-diagonal. The RWKV-7
# paper, arXiv:2503.14456, claims in its abstract that RWKV-7 can track state and recognize every regular language
# while still training in parallel, beyond what transformers can do under standard complexity conjectures; its
# transitions are diagonal plus rank one, not diagonal, and their eigenvalues can be negative. (Which parameter
# ranges the paper's constructions need is not checked here.)
#
# ### What the range buys: the trained result
#
# The project's state-tracking experiment (`python -m seqmix.experiments.state_tracking`; the committed results in
# [`experiments/results/state_tracking.md`](../experiments/results/state_tracking.md), walked through in
# [notebook 09](09_recall_and_selection.ipynb), section 7) trains 2-layer models on parity at length 64 and tests
# them at 256 and 1024. With the wide rate RWKV-7 gets 100% up to 64 on three seeds and keeps 97.5%, 98.9% and
# 82.9% at positions 65-256 after 1500 steps (the third seed 100% with 6000 steps); as published it fits the training
# lengths (95-99.8%) and is near chance past them (50-63% at 256, 50-53% at 1024; notebook 09, section 7, reads
# the table), as are RWKV-4 and Mamba (50%), whose decays cannot flip a sign. The
# trained wide models flip with an eigenvalue of about $-0.99$ on the steps that read a 1, so at 1024 the tracked
# sign has shrunk to $0.99^{n}$ after $n$ flips and the accuracy falls to 57-67%; the seed trained 4x longer flips
# at $-0.9996$ and keeps 99.7% at 1024: the range buys the flip, and training moves it towards $-1$.

# %% [markdown]
# ## Summary
#
# - Every mechanism of the series is $S_t = S_{t-1} G_t + v_t k_t^\top$, $y_t = S_t q_t$ with its own transition
#   $G_t$ (section 0): $I$, a decay, a decay per key channel, a rank-one edit, or RWKV-7's diagonal plus rank one,
#   of which all the others are settings.
# - The state is an $N \times N$ matrix per head (four dimensions with batch and head, not three: erratum 16), a
#   key-value memory read by $y_t = S_t r_t$.
# - The update forgets per key channel (decays in $(0.545, 1)$: it is the log decay that is negative, erratum 18),
#   removes what the memory returns for the unit key $\hat\kappa$ at the rate $\alpha$, and writes $v k^\top$; run in
#   the post's own form it agrees with `reference/wkv7.py`.
# - With $w = 1$, $a = -k$, $b = \eta k$ it is one gradient step on $\tfrac12\lVert Sk - v\rVert^2$: the delta rule,
#   which replaces a stored value where linear attention adds to it (plot and heatmaps).
# - RWKV-7's $a = -\hat\kappa$, $b = \hat\kappa \odot \alpha$ with a unit $\hat\kappa$ makes every transition similar
#   to a symmetric matrix with eigenvalues in $(-1, 1)$; the post's $a = -k$, $b = k\eta$ with an unnormalized key does
#   not, and its state blows up (erratum 19).
# - The product-of-transitions definition and the chunked WY form (unrolled chunk, triangular system for the $u_i$,
#   the chunk's product as diagonal plus rank $L$) give the recurrence's result to float64 rounding. The appendix
#   holds the torch path (WY form) and the Triton kernel (recurrence, and chunked) to it in fp32 and fp16, in pieces,
#   with gradients.
# - With the published ranges ($w > 0.545$, $\alpha < 1$) the transitions' eigenvalues lie in $(-0.455, 1)$, and the
#   wide rate $\alpha < 1 + w$ stretches that to $(-1, 1)$. A negative eigenvalue flips a sign, which positive
#   diagonal decays (RWKV-4, Mamba) never can; a one-dimensional recurrence with $g(1) = -1$ counts parity at any
#   length, while with $g \in [0, 1]$ the best threshold falls to a coin toss. Section 8 reports the trained
#   comparison: with the wide rate, RWKV-7 keeps parity at 4x the training length (and at 16x with a longer run); as
#   published, and RWKV-4 and Mamba, near chance past it.
#
# Next: notebook 05 builds the RWKV-7 model around this op, where $r, w, k, v, \hat\kappa, \alpha$ come from.
#
# ## Exercises
#
# Each exercise has a solution in the collapsed cell below it (click the three dots to open it); it runs with the
# notebook, so it is checked too. In a coding exercise, fill in the stub, run it, then run the check cell under it:
# it says "not attempted yet" while the stub is untouched, "correct" when your code passes, and fails with the
# checks' message otherwise.
#
# **1. An unnormalized removal key.** Redo section 4's RWKV-7 transitions with $2\hat\kappa$ in place of $\hat\kappa$
# (so $\lVert z\rVert^2$ can reach 4). Where do the eigenvalues go?

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# ||z||^2 = sum_j alpha_j (2 kk_j)^2 is up to 4: the smallest eigenvalue can go down to min w - 4 < -1.
w_ex = np.exp(-np.exp(-0.5 - np.logaddexp(0.0, rng.normal(2.0, 2.0, (400, N)))))
kk_ex = rng.standard_normal((400, N))
kk_ex /= np.linalg.norm(kk_ex, axis=1, keepdims=True)
alpha_ex = rng.uniform(0.0, 1.0, (400, N))
a_doubled, b_doubled = -2 * kk_ex, 2 * kk_ex * alpha_ex
P_doubled = w_ex[:, :, None] * np.eye(N) + a_doubled[:, :, None] * b_doubled[:, None, :]
eig_doubled = np.linalg.eigvals(P_doubled)
print("still real:", bool(np.abs(eig_doubled.imag).max() < 1e-9), "; all below 1:",
      bool(eig_doubled.real.max() < 1), "; some below -1:", bool(eig_doubled.real.min() < -1))

# %% [markdown]
# **2. One-step chunks.** Write section 6's $W$, $\hat B$ and the WY product for $L = 1$ by hand. Why is it the
# transition $P_1$ itself?

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# L = 1: W_1 = a_1 e^{c_0} = a_1 and B^_1 = b_1 e^{c_1 - c_1} = b_1, so diag(e^{c_1}) + W^T B^ = diag(w_1) + a_1 b_1^T.
W_1, B_hat_1 = a[:1] * np.exp(0.0), b[:1] * np.exp(c[0] - c[0])
check("WY product for L = 1 vs the transition P_1", np.diag(np.exp(c[0])) + W_1.T @ B_hat_1,
      np.diag(np.exp(lw[0])) + np.outer(a[0], b[0]), REFERENCE_BUDGET)

# %% [markdown]
# **3. Why $w \in (0, 1)$ alone is not enough.** With $w = (0.9, 0.9)$, find $a$ and $b$ that give the transition
# $\mathrm{diag}(w) + ab^\top$ an eigenvalue above 1. What does RWKV-7's choice of $a$ and $b$ do to the same
# eigenvalue?

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# With equal decays w, diag(w) + a b^T has eigenvalues w (N - 1 times) and w + b.a. Any b.a > 0.1 breaks out:
a_ex = b_ex = np.array([np.sqrt(0.5), 0.0])
P_ex = np.diag([0.9, 0.9]) + np.outer(a_ex, b_ex)
print("eigenvalues with a = b = (0.71, 0):", np.round(np.linalg.eigvals(P_ex), 3))
# RWKV-7: b.a = -(kk * alpha).kk = -sum_j alpha_j kk_j^2, in (-1, 0): the eigenvalue w + b.a stays in (-1, 1).
b_dot_a = -(kk_ex * alpha_ex * kk_ex).sum(1)
print("RWKV-7's b.a over the 400 draws lies in (-1, 0):",
      bool(((b_dot_a > -1) & (b_dot_a < 0)).all()))

# %% [markdown]
# **4. A parity flag in the state.** Take one head with $N = 2$, the state $S_0 = e_0 e_0^\top$, and read it with
# $r = e_0$, so that $y_t = (S_t)_{00}$ is a flag. Write `flag_inputs(bits, rate)`: the op's inputs
# `r, log_w, k, v, a, b`, each of shape $(1, T, 1, 2)$, for a string of $T$ bits. A 0 leaves the state alone (decay
# 1, nothing removed, nothing written); a 1 decays channel 0 by the smallest published decay, `W_FLIP` $= 0.545$,
# and removes along $\hat\kappa = e_0$ at the rate `rate` ($a = -e_0$, $b = $ `rate` $e_0$). The check runs your
# inputs through `reference.wkv7` on 300 random bits: with the wide rate's limit $\alpha = 1 + w$, $y_t$ must be
# $(-1)^{\text{number of 1s so far}}$ exactly; with the published ceiling $\alpha = 1$ it must be
# $(-0.455)^{\text{number of 1s so far}}$, computed directly. Then: why does the flag fail as a parity flag at
# $\alpha = 1$, and how small is it at the end? Hint: along $e_0$ the transition is the number $w - \alpha$.

# %%
# Exercise 4: a parity flag in the state
W_FLIP = np.exp(-np.exp(-0.5))                                         # the smallest published decay, 0.545

def flag_inputs(bits, rate):
    """[r, log_w, k, v, a, b], each (1, T, 1, 2), for bits (T,) of 0s and 1s and the removal rate `rate`."""
    raise NotImplementedError("Exercise 4: your code here")

# %% tags=["nbval-check-output"]
flag_bits = rng.integers(0, 2, 300)
flag_state = np.array([[1.0, 0.0], [0.0, 0.0]])[None, None]           # S_0 = e_0 e_0^T, (1, 1, 2, 2)

def flag(rate):
    return ref.wkv7(*flag_inputs(flag_bits, rate), state=flag_state)[0][0, :, 0, 0]   # y_t = (S_t)_00

def checks_4():
    ones_so_far = np.cumsum(flag_bits)
    check("alpha = 1 + w: y_t vs (-1)^(1s so far)", flag(1 + W_FLIP), (-1.0) ** ones_so_far, REFERENCE_BUDGET)
    check("alpha = 1: y_t vs (w - 1)^(1s so far)", flag(1.0), (W_FLIP - 1.0) ** ones_so_far, REFERENCE_BUDGET)

exercise("Exercise 4", checks_4)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
def flag_inputs(bits, rate):
    """[r, log_w, k, v, a, b], each (1, T, 1, 2), for bits (T,) of 0s and 1s and the removal rate `rate`."""
    T_, e0 = len(bits), np.array([1.0, 0.0])
    one_bits = bits[:, None] == 1                                      # (T, 1)
    log_w = np.where(one_bits, np.log([W_FLIP, 1.0]), 0.0)             # a 0: decay 1 (log_w = 0)
    a_, b_ = np.where(one_bits, -e0, 0.0), np.where(one_bits, rate * e0, 0.0)
    r_, zeros = np.tile(e0, (T_, 1)), np.zeros((T_, 2))
    return [z_.reshape(1, T_, 1, 2) for z_ in (r_, log_w, zeros, zeros, a_, b_)]   # r, log_w, k, v, a, b

exercise("Exercise 4", checks_4)
# A 1 multiplies the flag by w - alpha, the eigenvalue along kk = e_0. At the wide limit 0.545 - 1.545 = -1: an
# exact flip at any length. At the published ceiling 0.545 - 1 = -0.455: the sign still flips, but the size shrinks
# by 0.455 per 1, so a parity read as "y_t = +-1" fails, and in fp32 the flag is lost below rounding after ~20 flips.
print(f"alpha = 1: |y_T| = 0.455^{flag_bits.sum()} = {abs(flag(1.0)[-1]):.0e}")

# %% [markdown]
# **5. The gated delta rule as a setting of RWKV-7's op.** Section 0's table says the gated delta rule,
# $S_t = S_{t-1}\,\alpha_t (I - \beta_t k_t k_t^\top) + \beta_t v_t k_t^\top$, is RWKV-7's recurrence with some
# `log_w`, `a`, `b` and value. Write `gated_delta_as_wkv7(q, k, v, log_alpha, beta)`, returning the six arguments
# `r, log_w, k, v, a, b` of `reference.wkv7.wkv7`, each $(B, T, H, N)$, from $q, k, v$ of shape $(B, T, H, N)$ and
# `log_alpha`, `beta` of shape $(B, T, H)$ (one per head and step). The check runs them through `reference.wkv7`
# from a random initial state and compares with `family.gated_delta_rule`'s own loop. Hint: expand
# $S \alpha (I - \beta k k^\top)$ into $S\,\mathrm{diag}(\cdot) + (S a) b^\top$, and see where $\beta$ must go so
# that the write is $\beta v k^\top$; a per-head number becomes an $N$-vector with `x[..., None]`.

# %%
# Exercise 5: the gated delta rule as a setting of wkv7
def gated_delta_as_wkv7(q, k, v, log_alpha, beta):
    """(r, log_w, k, v, a, b) of wkv7, each (B, T, H, N), that compute the gated delta rule."""
    raise NotImplementedError("Exercise 5: your code here")

# %% tags=["nbval-check-output"]
def checks_5():
    q_, k_, v_, (log_alpha_, beta_) = q_f, k_f, v_f, rung_params["gated_delta_rule"]
    S_start = rng.standard_normal((Bf, Hf, Nf, Nf))                    # not symmetric: a transposed state shows
    y_, S_ = ref.wkv7(*gated_delta_as_wkv7(q_, k_, v_, log_alpha_, beta_), state=S_start)
    y_loop, S_loop = family.gated_delta_rule(q_, k_, v_, log_alpha_, beta_, state=S_start)
    check("wkv7 with your arguments vs the gated delta rule's loop: y", y_, y_loop, REFERENCE_BUDGET)
    check("wkv7 with your arguments vs the gated delta rule's loop: state", S_, S_loop, REFERENCE_BUDGET)

exercise("Exercise 5", checks_5)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
def gated_delta_as_wkv7(q, k, v, log_alpha, beta):
    """(r, log_w, k, v, a, b) of wkv7, each (B, T, H, N), that compute the gated delta rule."""
    # S alpha (I - beta k k^T) = S diag(alpha) + (S (-k)) (alpha beta k)^T, and the write beta v k^T = (beta v) k^T.
    alpha, beta = np.exp(log_alpha)[..., None], beta[..., None]       # (B, T, H, 1): one number per head and step
    log_w = np.broadcast_to(log_alpha[..., None], q.shape)
    return q, log_w, k, beta * v, -k, alpha * beta * k

exercise("Exercise 5", checks_5)

# %% [markdown]
# ## Appendix: the production path against the reference
#
# The rest of this notebook is not about the math: it checks that the code people run gives the reference's
# numbers. nbval runs and checks it like the cells above.
#
# [`kernels.wkv7.wkv7`](../kernels/wkv7/__init__.py) takes `r, log_w, k, v, a, b` of shape `(B, T, H, N)` and an optional state
# `(B, H, N, N)` (fp32), and returns `(y, state)`. Backend `"torch"` is the chunked WY form of section 6 (chunks of 16,
# in fp32, with its own budget, 1e-4, for the longer chains of fp32 products); backend `"triton"` runs the recurrence
# in a kernel, one program per (batch and head, block of value rows), the rows of the state in registers (notebook 08
# takes the kernel apart). Both run on the inputs of section 2 ($T = 24$: one chunk and a half), from the same initial
# state: outputs and final states, the sequence fed in two pieces, and fp16. Backend `"triton_chunked"` runs the
# chunked WY form on Triton as well, in a kernel that walks chunks of 16 steps with products of (16, 16) tiles
# ($T/16$ serial steps instead of $T$), and a chunked backward ([`kernels/wkv7/triton_chunked.py`](../kernels/wkv7/triton_chunked.py)
# derives it: one serial pass carries $\partial L / \partial S$ back chunk by chunk, then every chunk's gradients come
# at once, in matrix products); it takes head sizes from 16, so it is checked on inputs of its own after these.
#
# A third implementation, backend `"c"` ([`kernels/wkv7/wkv7.c`](../kernels/wkv7/wkv7.c)), is a compiled C loop that
# walks time once, forward and backward ([`kernels/wkv7/c.py`](../kernels/wkv7/c.py)): `backend=None` takes it for
# CPU tensors in fp32, fp16 or bf16, for inference and for training alike. It runs the recurrence, like the Triton
# kernel, and the checks below hold it to the same reference and the same budgets (fp32: 1e-5), gradients included.

# %%
from seqmix.kernels.wkv7 import wkv7 as wkv7_kernel

BACKENDS = {"torch": FP32_CHUNKED_WKV7_BUDGET, "triton": FP32_BUDGET, "c": FP32_BUDGET}
split = 10  # feed 10 tokens, then the other 14

def run(backend, inputs, state, dtype=torch.float32):
    # The kernel on float64 arrays cast to dtype, from a state (fp32); returns (y, state) as
    # tensors.
    return wkv7_kernel(*(torch.tensor(inputs[n], dtype=dtype) for n in ARGS),
                       state=torch.as_tensor(state, dtype=torch.float32), backend=backend)

def fp16_rounded(inputs):
    # What fp16 inputs hold: the reference is computed on these values.
    return {n: z.astype(np.float16).astype(np.float64) for n, z in inputs.items()}

x16 = fp16_rounded(x)
y16_ref = ref.wkv7(*(x16[n] for n in ARGS), state=S0.astype(np.float32).astype(np.float64))[0]
first = {n: z[:, :split] for n, z in x.items()}
rest = {n: z[:, split:] for n, z in x.items()}
runs = {}
for backend in BACKENDS:
    y1, state1 = run(backend, first, S0)
    runs[backend] = dict(whole=run(backend, x, S0), pieces=(y1, *run(backend, rest, state1)),
                         fp16=run(backend, x16, S0, torch.float16))

# %% tags=["nbval-check-output"]
for backend, budget in BACKENDS.items():
    (y, state), (y1, y2, state2) = runs[backend]["whole"], runs[backend]["pieces"]
    y16 = runs[backend]["fp16"][0]
    check(f"{backend} fp32 y", y, y_ref, budget)
    check(f"{backend} fp32 final state", state, S_ref, budget)
    check(f"{backend} fp32 fed in two pieces: y", torch.cat([y1, y2], dim=1), y_ref, budget)
    check(f"{backend} fp32 fed in two pieces: state", state2, S_ref, budget)
    check(f"{backend} fp16 y", y16, y16_ref, FP16_BUDGET)

# %% tags=["nbval-check-output"]
# The chunked Triton forward on inputs of head size 16 (tl.dot's smallest tile), against the reference.
x_wide, S0_wide = rwkv7_inputs(1, T, 1, 16), rng.standard_normal((1, 1, 16, 16))
S0_wide_fp32 = S0_wide.astype(np.float32).astype(np.float64)  # the state the kernel is given
y_wide_ref, S_wide_ref = ref.wkv7(*(x_wide[n] for n in ARGS), state=S0_wide_fp32)
for backend in ("triton", "triton_chunked"):
    y_wide, S_wide = wkv7_kernel(*(torch.tensor(x_wide[n], dtype=torch.float32) for n in ARGS),
                                 state=torch.tensor(S0_wide, dtype=torch.float32), backend=backend)
    name = "chunked" if backend == "triton_chunked" else "sequential"
    check(f"triton {name} N = 16 y", y_wide, y_wide_ref, FP32_BUDGET)
    check(f"triton {name} N = 16 final state", S_wide, S_wide_ref, FP32_BUDGET)


# %% [markdown]
# **Gradients.** The float64 truth is autograd through the recurrence written in torch below, one token at a time
# (checked against the reference first). The three backends' fp32 gradients of
# $\sum y \odot G + \sum S_T \odot G_S$ with respect to all six inputs and the initial state must match it.

# %%
def recurrence_torch(r, log_w, k, v, a, b, S):
    ys = []
    for t in range(r.shape[1]):
        Sa = (S @ a[:, t, :, :, None])[..., 0]                          # (B, H, N) S a
        decay, vk = log_w[:, t, :, None, :].exp(), v[:, t, :, :, None] * k[:, t, :, None, :]
        S = S * decay + Sa[..., None] * b[:, t, :, None, :] + vk
        ys.append((S @ r[:, t, :, :, None])[..., 0])
    return torch.stack(ys, dim=1), S

G, G_S = rng.standard_normal((B, T, H, N)), rng.standard_normal((B, H, N, N))

def gradients(fn, dtype, inputs=x, state=S0, cotangents=(G, G_S)):
    leaves = [torch.tensor(inputs[n], dtype=dtype, requires_grad=True) for n in ARGS]
    state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    state0 = torch.tensor(state, dtype=state_dtype, requires_grad=True)
    y, S_T = fn(*leaves, state0)
    objective = (y * torch.tensor(cotangents[0], dtype=dtype)).sum()
    objective = objective + (S_T * torch.tensor(cotangents[1], dtype=S_T.dtype)).sum()
    objective.backward()
    return [z.grad for z in leaves + [state0]]

expected_grads = gradients(recurrence_torch, torch.float64)
def kernel_output(backend):
    return lambda *z: wkv7_kernel(*z[:6], state=z[6], backend=backend)

backend_grads = {b_: gradients(kernel_output(b_), torch.float32) for b_ in BACKENDS}

# %% tags=["nbval-check-output"]
y_torch64, S_torch64 = recurrence_torch(*(torch.tensor(x[n]) for n in ARGS), torch.tensor(S0))
check("recurrence in torch float64 vs reference: y", y_torch64, y_ref, REFERENCE_BUDGET)
for backend, budget in BACKENDS.items():
    grad_names = [f"d{n}" for n in ARGS] + ["dstate"]
    for name, got, want in zip(grad_names, backend_grads[backend], expected_grads):
        check(f"{backend} fp32 {name}", got, want, budget)

# %% tags=["nbval-check-output"]
# The chunked Triton backward on the head-size-16 inputs, against the same float64 autograd: its own budget, 1e-4,
# as the torch path's chunked form.
rng_wide = np.random.default_rng(16)
cotangents_wide = rng_wide.standard_normal(y_wide_ref.shape), rng_wide.standard_normal(S_wide_ref.shape)
wide = dict(inputs=x_wide, state=S0_wide_fp32, cotangents=cotangents_wide)
expected_wide = gradients(recurrence_torch, torch.float64, **wide)
chunked_wide = gradients(lambda *z: wkv7_kernel(*z[:6], state=z[6], backend="triton_chunked"), torch.float32,
                         **wide)
for name, got, want in zip([f"d{n}" for n in ARGS] + ["dstate"], chunked_wide, expected_wide):
    check(f"triton chunked N = 16 fp32 {name}", got, want, FP32_CHUNKED_WKV7_BUDGET)

# %%
# The errors themselves (this cell is not compared: the numbers depend on the machine).
for backend in BACKENDS:
    worst = max(rel_rms(g, e) for g, e in zip(backend_grads[backend], expected_grads))
    print(f"{backend:6s} fp32: y rel. RMS error {rel_rms(runs[backend]['whole'][0], y_ref):.1e}, "
          f"worst gradient {worst:.1e}")

