# %% [markdown]
# # 05 · The RWKV-7 model: time mix with v_first, a, g, kk and the bonus; GPT mode and RNN mode
#
# Notebook 04 took RWKV-7's state update apart. This one builds the model that feeds it, following the RWKV-7 post's
# walk through BlinkDL's `RWKV_Tmix_x070` and `RWKV_CMix_x070`: the token shift and its six mixes; the receptance, the
# decay (soft-clamped, so that every decay lies in $(0.545, 1)$), key and value; `v_first`, the value residual that
# later layers pull their values towards; the in-context learning rate `a`, the output gate `g`, the key to remove `kk`
# and the key to write; the op call; the per-head GroupNorm and the "bonus" term; the channel mix (and how it compares
# with a transformer's FFN); the blocks and the model (with a block diagram). Each piece is written out in NumPy under
# its formula and checked against `reference/rwkv7.py`. Then the post's two ways of running the model: GPT mode (the
# whole sequence through each layer) and RNN mode, written here as its own program (one token at a time, vector
# operations and a state), which give the same logits; BlinkDL's own runtime as independent evidence; two silent traps
# when a state moves between runtimes (its orientation, and $w$ against $\log w$); the state over time (its size, its
# rank); the study notes' reflection that RWKV is a Transformer and an RNN at once, set against what the notebooks
# showed; and, to close, the project's own trained RWKV-7: its decays and in-context rates on real Python, how good it
# is (bits per byte against a bigram and against gzip, bzip2 and xz), and text it writes, greedy and sampled. An
# appendix checks the torch model, with the op on its torch path and on the Triton kernel, against the reference.
#
# **Sources.** The RWKV-7 architecture post, https://www.cnblogs.com/Ctrl-cCtrl-v/p/18906192 (the time-mix and
# channel-mix code walk-through, GPT and RNN mode: the order followed here; errata 17, 18, 19 and 20 of
# [`reference/ERRATA.md`](../reference/ERRATA.md) are about it); RWKV-7 "Goose", arXiv:2503.14456,
# https://arxiv.org/abs/2503.14456; BlinkDL's `rwkv` package (https://pypi.org/project/rwkv/), the runtime the
# post's demo scripts come from.
#
# **Notation.** The post writes `a` for two things: the in-context learning rate (here $\alpha$) and the op's vector
# $a$ ($= -\hat\kappa$); and $w$ for the raw decay (here $\omega$), the decay and its log. The
# [notation crosswalk](notation.md) lists these and the other clashes across notebooks.
#
# **Code used.** [`reference/rwkv7.py`](../reference/rwkv7.py): `log_decay`, `time_mix`, `channel_mix`, `forward`
# (GPT mode), `forward_rnn`, `checkpoint_shapes` (NumPy, float64: the truth) ·
# [`reference/wkv7.py`](../reference/wkv7.py): `wkv7` (notebook 04) · [`models/rwkv7/`](../models/rwkv7/__init__.py):
# `Rwkv7Config`, `Rwkv7` (torch, BlinkDL's parameter names; the op from [`kernels/wkv7/`](../kernels/wkv7/__init__.py)
# with backend `"torch"` or `"triton"`; `generate`) · [`kernels/testing.py`](../kernels/testing.py): `check` and
# the error budgets.

# %%
import seqmix

# without a GPU: TRITON_INTERPRET=1, before triton is imported
MODE = seqmix.use_interpreter_without_gpu()

import warnings

import matplotlib.pyplot as plt
import numpy as np
import torch

from seqmix.kernels.testing import FP32_BUDGET, REFERENCE_BUDGET, check, rel_rms
from seqmix.reference import rwkv7 as ref
from seqmix.reference.functional import layer_norm
from seqmix.reference.wkv7 import wkv7 as wkv7_reference

rng = np.random.default_rng(0)
torch.manual_seed(0)
print("Triton kernels run on:", MODE)


# %% [markdown]
# ## 0. A tiny model with random weights
#
# No checkpoint is downloaded: the weights are drawn here, one float64 array per entry of a BlinkDL RWKV-7 `.pth`
# (names and shapes from `reference.rwkv7.checkpoint_shapes`), at scales where every part of the model matters. The
# sizes are small and all different: $C = 16$ channels in $H = 2$ heads of $N = 8$, $L = 3$ layers, a channel-mix
# width $F = 40$, a vocabulary of $V = 50$, and LoRA widths 4 (decay), 5 (learning rate), 6 (value residual) and 7
# (gate). The reference takes the arrays; the torch model of the appendix loads them in fp32.

# %%
V, C, H, L, F = 50, 16, 2, 3, 40
N = C // H
LORA = dict(D_w=4, D_a=5, D_v=6, D_g=7)

def draw(name, shape):
    # One tensor of the checkpoint, by the kind its name says.
    kind = name.split(".")[-2] if name.endswith((".weight", ".bias")) else name.split(".")[-1]
    if kind.startswith("ln"):
        return (1.0 if name.endswith("weight") else 0.0) + 0.2 * rng.standard_normal(shape)
    if kind in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g"):
        return rng.uniform(0.0, 1.0, shape)
    if kind == "w0":
        return rng.uniform(-6.0, 1.0, shape)
    if kind in ("a0", "v0", "emb"):
        return rng.standard_normal(shape)
    if kind == "k_k":
        return rng.uniform(0.5, 1.5, shape)
    if kind == "k_a":
        return rng.uniform(0.0, 1.5, shape)
    if kind == "r_k":
        return 0.5 * rng.standard_normal(shape)
    fan_in = shape[1] if name.endswith(".weight") else shape[0]  # Linear (out, in); LoRA (in, out)
    return rng.standard_normal(shape) / np.sqrt(fan_in)

shapes = ref.checkpoint_shapes(V, C, H, L, F, **LORA)
params = {name: draw(name, shape) for name, shape in shapes.items()}

def block(prefix):
    # One block's tensors without their prefix, e.g. block("blocks.1.att.")["w0"].
    return {name[len(prefix):]: a for name, a in params.items() if name.startswith(prefix)}

att0, att1 = block("blocks.0.att."), block("blocks.1.att.")
for name, a in att1.items():
    print(f"blocks.1.att.{name:18s} {a.shape}")


# %% [markdown]
# ## 1. Token shift, six times
#
# RWKV-7 writes the token shift as a difference, $\Delta_t = x_{t-1} - x_t$ (`xx = time_shift(x) - x`), and mixes
#
# $$x^{c}_t = x_t + \Delta_t \odot \mu_c = (1 - \mu_c) \odot x_t + \mu_c \odot x_{t-1}, \qquad
# c \in \{r, w, k, v, a, g\} .$$
#
# It is RWKV-4's interpolation with the roles of $\mu$ and $1 - \mu$ swapped: here $\mu = 0$ sees only the current
# token. There are six mixes, one per vector made from the input: $x^r, x^w, x^k, x^v, x^a, x^g$ for the receptance,
# decay, key, value, learning rate and gate (checkpoint names `x_r` ... `x_g`). As in RWKV-4, the input before the
# first token comes from the state (zero at the start).

# %%
def token_shift_mixes(p, x, x_prev):
    # The six mixes x + (x_{t-1} - x_t) * mu_c; x (B, T, C), x_prev (B, C): the input before the
    # first token.
    xx = np.concatenate([x_prev[:, None], x[:, :-1]], axis=1) - x          # x_{t-1} - x_t
    return {c: x + xx * p[f"x_{c}"] for c in "rwkvag"}                     # (B, T, C) each

x_demo, prev_demo = rng.standard_normal((1, 3, C)), rng.standard_normal((1, C))
ends = {mu: token_shift_mixes({f"x_{c}": mu for c in "rwkvag"}, x_demo, prev_demo)["r"]
        for mu in (0.0, 1.0)}  # x^r at mu = 0 and mu = 1

# %% tags=["nbval-check-output"]
check("mu = 0: the current token", ends[0.0], x_demo, REFERENCE_BUDGET)
check("mu = 1: the token before (the state's at t = 0)", ends[1.0],
      np.concatenate([prev_demo[:, None], x_demo[:, :-1]], axis=1), REFERENCE_BUDGET)

# %% [markdown]
# ## 2. Receptance, decay, key, value
#
# $$r = W_r x^r, \qquad k = W_k x^k, \qquad v = W_v x^v, \qquad
# \omega = -\mathrm{softplus}\!\left(-\left(w_0 + \tanh(x^w W_1)\, W_2\right)\right) - 0.5, \qquad
# \log w = -e^{\omega} .$$
#
# The decay comes from a low-rank (LoRA) map of $x^w$, offset per channel by $w_0$. $-\mathrm{softplus}(-z)$ is a soft
# $\min(z, 0)$, so $\omega < -0.5$ always, and the decay that multiplies the state, $e^{\log w} = e^{-e^{\omega}}$,
# always lies in $(e^{-e^{-0.5}}, 1) = (0.545, 1)$: a channel can forget fast, but never wipes the state in one step.

# %%
def receptance_decay_key_value(p, mixes):
    # r, log w, k, v, each (B, T, C).
    r = mixes["r"] @ p["receptance.weight"].T
    omega = -np.logaddexp(0.0, -(p["w0"] + np.tanh(mixes["w"] @ p["w1"]) @ p["w2"])) - 0.5
    k = mixes["k"] @ p["key.weight"].T
    v = mixes["v"] @ p["value.weight"].T
    return r, -np.exp(omega), k, v

x1 = rng.standard_normal((2, 8, C))  # a layer-normed input to layer 1
x_prev1 = rng.standard_normal((2, C))
mixes1 = token_shift_mixes(att1, x1, x_prev1)
r1, log_w1, k1, v1 = receptance_decay_key_value(att1, mixes1)

# %% tags=["nbval-check-output"]
check("log w vs reference.log_decay", log_w1,
      ref.log_decay(mixes1["w"], att1["w0"], att1["w1"], att1["w2"]), REFERENCE_BUDGET)
decay1 = np.exp(log_w1)
print("every decay e^(log w) in (0.545, 1):", bool(((decay1 > 0.545) & (decay1 < 1)).all()))

# %% [markdown]
# **Erratum 18.** The post says $w_t$ is negative because it is produced by `exp(-exp(...))`, and that "the smaller
# (more negative) $w$, the more is forgotten". The decay $e^{-e^{\omega}}$ is positive, in $(0, 1)$; what is negative
# is $\omega$ (below $-0.5$, the code's `w`) and the log decay $-e^{\omega}$ that the design passes to the op as
# `log_w`. And the forgetting claim holds for the log decay, not for $\omega$: a more negative $\omega$ makes
# $-e^{\omega}$ *closer* to 0 and the decay closer to 1, so the channel forgets *less*. The plot shows the three
# quantities against the LoRA's output $z$.

# %%
z = np.linspace(-8, 6, 400)
omega = -np.logaddexp(0.0, -z) - 0.5                                   # -softplus(-z) - 0.5
fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), constrained_layout=True)
axes[0].plot(z, omega, label=r"$\omega = -\mathrm{softplus}(-z) - 0.5$")
axes[0].plot(z, -np.exp(omega), label=r"log decay $-e^{\omega}$ (the op's log_w)")
axes[0].axhline(-0.5, color="grey", lw=0.8, ls="--")
axes[0].set_xlabel(r"$z = w_0 + \tanh(x^w W_1) W_2$")
axes[0].set_ylabel("value")
axes[0].set_title(r"$\omega$ and the log decay: both negative")
axes[0].legend(fontsize=8)
axes[1].plot(z, np.exp(-np.exp(omega)), color="C2", label=r"decay $e^{-e^{\omega}}$")
axes[1].axhline(np.exp(-np.exp(-0.5)), color="grey", lw=0.8, ls="--",
                label=r"$e^{-e^{-0.5}} = 0.545$")
axes[1].axhline(1.0, color="grey", lw=0.8)
axes[1].set_xlabel(r"$z = w_0 + \tanh(x^w W_1) W_2$")
axes[1].set_ylabel("factor multiplying the state")
axes[1].set_title(r"the decay: in (0.545, 1); lower $\omega$, less forgetting")
axes[1].legend(fontsize=8)
plt.show()

# %% tags=["nbval-check-output"]
decay = np.exp(-np.exp(omega))
print("as omega falls, the decay rises towards 1 (forgets less):",
      bool((np.diff(decay) * np.diff(omega) < 0).all()))
print("as the log decay falls, the decay falls (forgets more):",
      bool((np.diff(decay) * np.diff(-np.exp(omega)) > 0).all()))


# %% [markdown]
# ## 3. v_first: the value residual
#
# Layer 0 keeps its values as `v_first`. Every later layer moves its own value towards layer 0's, per channel, by a
# gate made from its input:
#
# $$v \leftarrow v + \left(v_{\text{first}} - v\right) \odot \sigma\!\left(v_0 + x^v V_1 V_2\right) .$$
#
# The gate interpolates between the layer's own value (gate 0) and layer 0's value of the same token (gate 1).

# %%
def sigmoid(z_):
    return 1 / (1 + np.exp(-z_))

def value_residual(p, v, v_first, xv):
    # Layer 0 (v_first None) makes v_first; later layers pull v towards it. -> (v, v_first)
    if v_first is None:
        return v, v
    return v + (v_first - v) * sigmoid(p["v0"] + xv @ p["v1"] @ p["v2"]), v_first


# %% [markdown]
# **Erratum 17.** The post says `v_first` is the value of the *first token* of the first layer, and likens it to an
# initial state or a `[CLS]` token that keeps "initial information" of the sequence. It is the value of the first
# *layer*, at every token: a $(B, T, C)$ tensor, and position $t$ of a later layer mixes with position $t$ of layer 0.
# Information moves along the sequence only through the token shift and the state. Below, the token at position 0 is
# changed: `v_first` changes at positions 0 and 1 (position 1 sees position 0 through the token shift) and nowhere
# else. Under the post's reading every position would change.

# %%
B, T = 2, 8
ids = rng.integers(0, V, (B, T))

def ln(z_, name):
    # The layer norm named `name` (its weight and bias from params), over the last axis.
    return layer_norm(z_, params[f"{name}.weight"], params[f"{name}.bias"])

def v_first_of(ids):
    # layer 0's time-mix input
    x0 = ln(ln(params["emb.weight"][ids], "blocks.0.ln0"), "blocks.0.ln1")
    mixes = token_shift_mixes(att0, x0, np.zeros((len(ids), C)))
    return receptance_decay_key_value(att0, mixes)[3]                      # (B, T, C): layer 0's v

changed = ids.copy()
changed[:, 0] = (ids[:, 0] + 1) % V
v_first, v_first_changed = v_first_of(ids), v_first_of(changed)
layer0_input = ln(ln(params["emb.weight"][ids], "blocks.0.ln0"), "blocks.0.ln1")
ref_v_first = ref.time_mix(att0, layer0_input, np.zeros((B, C)), np.zeros((B, H, N, N)), None, H)[3]

# %% tags=["nbval-check-output"]
check("v_first (layer 0's value) vs what reference.time_mix returns for layer 0", v_first,
      ref_v_first, REFERENCE_BUDGET)
moved = np.abs(v_first_changed - v_first).max(axis=(0, 2)) > 0  # (T,) which positions changed
print("v_first has shape (B, T, C):", v_first.shape == (B, T, C))
print("positions of v_first that change with token 0:", np.flatnonzero(moved).tolist())

# %%
fig, ax = plt.subplots(figsize=(7.5, 3.2), constrained_layout=True)
image = ax.imshow(np.abs(v_first_changed - v_first)[0].T, aspect="auto", cmap="Greys")
ax.set_xlabel("position $t$")
ax.set_ylabel("channel")
ax.set_title("|change of v_first| when the token at position 0 changes (batch row 0)")
fig.colorbar(image, ax=ax, label="absolute change")
plt.show()

# %% [markdown]
# ## 4. a, g, kk and the key written
#
# $$\alpha = \sigma\!\left(a_0 + x^a A_1 A_2\right) \in (0, 1)^C, \qquad g = \sigma\!\left(x^g G_1\right) G_2, \qquad
# \hat\kappa = \frac{k \odot k_k}{\lVert k \odot k_k \rVert}\ \text{(per head)}, \qquad
# \tilde k = k \odot \left(1 + (\alpha - 1) \odot k_a\right) .$$
#
# - $\alpha$ (`a` in BlinkDL's code) is the *in-context learning rate* of notebook 04: how much of what the state
#   returns for $\hat\kappa$ is removed.
# - $g$ is an output gate (a LoRA with a sigmoid in the middle, no offset): it scales the time mix's output per
#   channel.
# - $\hat\kappa$ (`kk`) is the key whose old content is removed: the key, rescaled per channel by $k_k$, at unit
#   length per head. The unit length is what keeps the transition's eigenvalues in $(-1, 1)$ (notebook 04).
# - $\tilde k$ is the key written: with $k_a = 1$ it is $\alpha \odot k$ (the write scaled by the learning rate, as in
#   a gradient step $\eta\, v k^\top$), with $k_a = 0$ the key itself; $k_a$ is learned per channel.

# %%
def heads(z_):
    return z_.reshape(*z_.shape[:-1], H, N)                                # (..., C) -> (..., H, N)

def rate_gate_keys(p, k, mixes):
    # alpha, g, kk (per head, unit length), k~.
    alpha = sigmoid(p["a0"] + mixes["a"] @ p["a1"] @ p["a2"])  # in-context learning rate
    g = sigmoid(mixes["g"] @ p["g1"]) @ p["g2"]                            # output gate
    kk = heads(k * p["k_k"])
    kk = kk / np.linalg.norm(kk, axis=-1, keepdims=True)                   # unit length per head
    return alpha, g, kk, k * (1 + (alpha - 1) * p["k_a"])


# %% [markdown]
# The op is then called as `RWKV7_OP(r, w, k, v, -kk, kk * a)`: $a = -\hat\kappa$, $b = \hat\kappa \odot \alpha$
# (erratum 19: the post's formula says $a = -k$, $b = k\eta$; the code it shows passes the normalized key and the
# learning rate, as here):
#
# $$S_t = S_{t-1}\,\mathrm{diag}(w_t) - \left(S_{t-1}\hat\kappa_t\right)\left(\hat\kappa_t \odot \alpha_t\right)^\top
# + v_t \tilde k_t^\top, \qquad y_t = S_t r_t .$$
#
# The function takes the key to remove as an argument, so that section 9 can run the post's $a = -k$, $b = k\eta$
# through the same model.

# %%
def op_call(r, log_w, k_written, v, removed, alpha, S):
    # The WKV-7 op with a = -removed, b = removed * alpha (RWKV-7: removed = kk). -> (y (B, T, H,
    # N), S)
    a, b = -removed, removed * heads(alpha)
    return wkv7_reference(heads(r), heads(log_w), heads(k_written), heads(v), a, b, S)


# %% [markdown]
# ## 5. GroupNorm, the bonus, the gate
#
# The op's output is normalized per head (`ln_x`, a GroupNorm with one group per head and $\epsilon = 64 \cdot
# 10^{-5}$). Then the "bonus": the current token's value, weighted per head by a learned match of receptance and key,
#
# $$o_t = W_o\left(\left(\mathrm{GN}(y_t) + \left(\textstyle\sum_{n \in \text{head}} r_{t,n}\,\tilde k_{t,n}\,
# (r_k)_n\right) v_t\right) \odot g_t\right) .$$
#
# The current token already reaches $y_t$ through the state ($v_t \tilde k_t^\top$ is in $S_t$); the bonus adds a
# second, direct path for it that bypasses the normalization, the counterpart of RWKV-4's bonus $u$ for the current
# token.

# %%
def norm_bonus_gate(p, y, r, k_written, v, g):
    # GroupNorm per head
    y = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 64e-5)
    y = y.reshape(g.shape) * p["ln_x.weight"] + p["ln_x.bias"]
    bonus = (heads(r) * heads(k_written) * p["r_k"]).sum(-1, keepdims=True) * heads(v)
    return ((y + bonus.reshape(g.shape)) * g) @ p["output.weight"].T        # (B, T, C)


# %% [markdown]
# The whole time mix is the five steps in a row. Against `reference.rwkv7.time_mix` on layer 1 (which has a value
# residual), from a non-zero state:

# %%
def time_mix(p, x, x_prev, S, v_first, post_ab=False):
    # -> (out (B, T, C), new x_prev, new S, v_first); post_ab: the post's a = -k, b = k * alpha.
    mixes = token_shift_mixes(p, x, x_prev)
    r, log_w, k, v = receptance_decay_key_value(p, mixes)
    v, v_first = value_residual(p, v, v_first, mixes["v"])
    alpha, g, kk, k_written = rate_gate_keys(p, k, mixes)
    y, S = op_call(r, log_w, k_written, v, heads(k) if post_ab else kk, alpha, S)
    return norm_bonus_gate(p, y, r, k_written, v, g), x[:, -1], S, v_first

S1 = 0.3 * rng.standard_normal((B, H, N, N))
out, new_x_prev, new_S, _ = time_mix(att1, x1, x_prev1, S1, v_first)
ref_out, ref_x_prev, ref_S, ref_v_first_passed = ref.time_mix(att1, x1, x_prev1, S1, v_first, H)

# %% tags=["nbval-check-output"]
for what, actual, expected in (
    ("time mix of layer 1 vs reference.time_mix", out, ref_out),
    ("its new token-shift state", new_x_prev, ref_x_prev),
    ("its new WKV state (B, H, N, N)", new_S, ref_S),
    ("v_first passed on unchanged", ref_v_first_passed, v_first),
):
    check(what, actual, expected, REFERENCE_BUDGET)

# %% [markdown]
# The post's reading of `v_first` (erratum 17), run through the same layer: every position mixes with layer 0's value
# of token 0. It is a different model:

# %%
first_token_only = np.broadcast_to(v_first[:, :1], v_first.shape)
post_out = time_mix(att1, x1, x_prev1, S1, first_token_only)[0]
print(f"v_first as 'the first token's value': rel. RMS difference from the reference's output "
      f"{rel_rms(post_out, ref_out):.2f}")


# %% [markdown]
# ## 6. Channel mix
#
# The channel mix is RWKV-4's without the receptance gate: one token shift, a squared ReLU over $F$ channels, back to
# $C$:
#
# $$o'_t = W'_v \max\!\left(W'_k\left(x_t + (x_{t-1} - x_t) \odot \mu'_k\right), 0\right)^2 .$$
#
# The post gives the width `dim_ffn` as usually $4 \times$ `n_embd` (here $F = 40$ for $C = 16$, a tiny model's
# choice).

# %%
ffn1 = block("blocks.1.ffn.")

def channel_mix(p, x, x_prev):
    xk = x + (np.concatenate([x_prev[:, None], x[:, :-1]], axis=1) - x) * p["x_k"]
    return np.maximum(xk @ p["key.weight"].T, 0.0) ** 2 @ p["value.weight"].T, x[:, -1]


# %% tags=["nbval-check-output"]
names = ("channel mix vs reference.channel_mix", "its new token-shift state")
ours, theirs = channel_mix(ffn1, x1, x_prev1), ref.channel_mix(ffn1, x1, x_prev1)
for what, actual, expected in zip(names, ours, theirs):
    check(what, actual, expected, REFERENCE_BUDGET)

# %% [markdown]
# **Against a transformer's FFN.** The post's comparison table sets ReLU$^2$ against GELU or Swish, two linear layers
# against two, an explicit time difference (the token shift) against none, and a parameter count "lower (it depends
# on `dim_ffn`)" against "higher". The first three hold. With $\mu'_k = 0$ the channel mix *is* an FFN, one token at
# a time, with a squared ReLU and no biases; its $\mu'_k$ mixes in the previous token, so it is not purely a
# per-token (position-wise) operation. The parameter claim does not hold as stated: at the same width the count is
# the same,
# $2CF$ (plus $C$ for $\mu'_k$; a GPT-2 FFN adds $F + C$ biases); only a gated FFN (SwiGLU, three matrices) has more
# at the same $F$, and LLaMA shrinks its $F$ to $\tfrac{8}{3}C$ to match. Counted for $C = 768$, $F = 4C$:

# %%
C_big, F_big = 768, 4 * 768
counts = {"RWKV-7 channel mix (key, value, x_k)": 2 * C_big * F_big + C_big,
          "GPT-2 FFN (two Linear with biases, GELU)": 2 * C_big * F_big + F_big + C_big,
          "SwiGLU FFN at the same F (three matrices)": 3 * C_big * F_big,
          "LLaMA's SwiGLU at F = 8C/3": 3 * C_big * (8 * C_big // 3)}
for name, n_params in counts.items():
    print(f"{name:45s} {n_params:>10,d}")
no_shift = dict(ffn1, x_k=np.zeros_like(ffn1["x_k"]))
per_token_ffn = np.maximum(x1 @ ffn1["key.weight"].T, 0.0) ** 2 @ ffn1["value.weight"].T

# %% tags=["nbval-check-output"]
check("channel mix with x_k = 0 vs a per-token FFN relu(x W_k^T)^2 W_v^T",
      channel_mix(no_shift, x1, x_prev1)[0], per_token_ffn, REFERENCE_BUDGET)

# %% [markdown]
# ## 7. The model
#
# $$x = \mathrm{LN}_0\left(E[\text{ids}]\right); \quad \text{per layer: } x \leftarrow x +
# \mathrm{TimeMix}(\mathrm{LN}_1(x)), \ \ x \leftarrow x + \mathrm{ChannelMix}(\mathrm{LN}_2(x)); \quad
# \text{logits} = \mathrm{LN}_{\text{out}}(x)\, W_{\text{head}}^\top .$$
#
# Layer 0 makes `v_first` (it has no value residual of its own) and hands it to every later layer. The state is, per
# layer, `(att_x_prev (B, C), att_kv (B, H, N, N), ffn_x_prev (B, C))`: the two token-shift inputs and the WKV matrix.
# `v_first` is not part of it: it belongs to each token, and is recomputed from the token by layer 0.
#
# The block as a diagram (as notebook 06 draws Mamba's and notebook 03 RWKV-4's). The residual stream runs along the
# top. Each of the six token-shift mixes feeds one vector; the op takes $r$, $\log w$, $\tilde k$, $v$ and the pair
# $a = -\hat\kappa$ (`kk`), $b = \hat\kappa \odot \alpha$, and reads and returns the state $S$; its output is
# normalized per head, gets the bonus, is gated by $g$ and projected by $W_o$. `v_first` is layer 0's own $v$
# (layer 0 has no value residual); every later layer pulls its $v$ towards it (section 3). The channel mix has no
# receptance gate, unlike RWKV-4's (notebook 03).
#
# ![One RWKV-7 block: LN1 and the token shift feed six mixes; r, log w, kk, k~ and v go into the WKV-7 op, whose
# output is group-normed per head, gets the bonus, is gated by g, projected by W_o and added to the residual; then
# LN2, a token shift, W_k, a squared ReLU and W_v, added to the residual](images/rwkv7_block.png)
#
# (Drawn by [`images/diagrams.py`](images/diagrams.py) from `reference/rwkv7.py`'s `time_mix` and `channel_mix`.)

# %%
def zero_state(batch):
    # Per layer (att_x_prev (B, C), att_kv (B, H, N, N), ffn_x_prev (B, C)), all zeros.
    return [(np.zeros((batch, C)), np.zeros((batch, H, N, N)), np.zeros((batch, C)))
            for _ in range(L)]

def forward(params, ids, state=None, post_ab=False):
    # GPT mode: (logits (B, T, V), state); post_ab: the post's a = -k, b = k * alpha in every time
    # mix.
    state = state or zero_state(ids.shape[0])
    x = ln(params["emb.weight"][ids], "blocks.0.ln0")
    v_first, new_state = None, []
    for i, (att_x_prev, S, ffn_x_prev) in enumerate(state):
        att, ffn = block(f"blocks.{i}.att."), block(f"blocks.{i}.ffn.")
        x_att = ln(x, f"blocks.{i}.ln1")
        dx, att_x_prev, S, v_first = time_mix(att, x_att, att_x_prev, S, v_first, post_ab)
        x = x + dx
        dx, ffn_x_prev = channel_mix(ffn, ln(x, f"blocks.{i}.ln2"), ffn_x_prev)
        x = x + dx
        new_state.append((att_x_prev, S, ffn_x_prev))
    return ln(x, "ln_out") @ params["head.weight"].T, new_state

logits, state = forward(params, ids)
ref_logits, ref_state = ref.forward(params, ids)

# %% tags=["nbval-check-output"]
check("model vs reference.forward: logits", logits, ref_logits, REFERENCE_BUDGET)
for i, (layer, ref_layer) in enumerate(zip(state, ref_state)):
    for name, got, want in zip(("att_x_prev", "att_kv", "ffn_x_prev"), layer, ref_layer):
        check(f"layer {i} state {name} {got.shape}", got, want, REFERENCE_BUDGET)


# %% [markdown]
# ## 8. GPT mode and RNN mode
#
# The post describes two ways to run the same weights (BlinkDL's `rwkv_v7_demo.py` and `rwkv_v7_demo_rnn.py`):
#
# - **GPT mode**: each layer takes the whole sequence at once, like a transformer; the op runs over all $T$ tokens
#   (as a chunked computation on fast kernels). Good for reading a prompt (prefill). That is `forward` above.
# - **RNN mode**: one token at a time; each layer reads its state and returns the new one. Good for generating, where
#   tokens come one by one.
#
# RNN mode is a different program, not GPT mode called on one token: there is no time axis, every quantity is a
# vector of $C$ numbers, and each head's state is updated with one outer product per term,
# `state = state * w + state @ ab + vk`, as in the post's `RWKV7_OP` loop. Written out below in that form (as
# BlinkDL's runtime writes it), with one more difference: the decay is computed as $e^{-e^{-0.5}\,\sigma(z)}$,
# which equals $e^{-e^{\omega}}$ because $-\mathrm{softplus}(-z) = \log\sigma(z)$ (exercise 2). First the vectors of
# one token:

# %%
def vectors_one(p, x, x_prev, v_first):
    # One token: x, x_prev (C,) -> r, w (the decay itself), k~, v, kk (H, N), alpha, g; v_first
    # (C,) or None.
    xx = x_prev - x
    xr, xw, xk, xv, xa, xg = (x + xx * p[f"x_{c}"].ravel() for c in "rwkvag")
    r, k, v = xr @ p["receptance.weight"].T, xk @ p["key.weight"].T, xv @ p["value.weight"].T
    w = np.exp(-np.exp(-0.5) * sigmoid(p["w0"].ravel() + np.tanh(xw @ p["w1"]) @ p["w2"]))
    alpha = sigmoid(p["a0"].ravel() + xa @ p["a1"] @ p["a2"])
    g = sigmoid(xg @ p["g1"]) @ p["g2"]
    kk = (k * p["k_k"].ravel()).reshape(H, N)
    kk = kk / np.linalg.norm(kk, axis=1, keepdims=True)
    k = k * (1 + (alpha - 1) * p["k_a"].ravel())
    if v_first is None:
        v_first = v
    else:
        v = v + (v_first - v) * sigmoid(p["v0"].ravel() + xv @ p["v1"] @ p["v2"])
    return r, w, k, v, kk, alpha, g, v_first


# %% [markdown]
# Then the state update of each head, the output and the rest of the block, for one token:

# %%
def time_mix_one(p, x, x_prev, S, v_first):
    # S: (H, N, N) -> (out (C,), new x_prev, new S, v_first).
    r, w, k, v, kk, alpha, g, v_first = vectors_one(p, x, x_prev, v_first)
    vk = v.reshape(H, N, 1) @ k.reshape(H, 1, N)                             # v k~^T per head
    ab = -kk[:, :, None] @ (kk * alpha.reshape(H, N))[:, None, :]             # a b^T per head
    S = S * w.reshape(H, 1, N) + S @ ab + vk
    y = (S @ r.reshape(H, N, 1))[..., 0]                                     # (H, N)
    y = (y - y.mean(1, keepdims=True)) / np.sqrt(y.var(1, keepdims=True) + 64e-5)
    y = y.ravel() * p["ln_x.weight"] + p["ln_x.bias"]
    y = y + (((r * k).reshape(H, N) * p["r_k"]).sum(1, keepdims=True) * v.reshape(H, N)).ravel()
    return (y * g) @ p["output.weight"].T, x, S, v_first

def forward_one(params, token, state):
    # RNN mode: one token id and the per-layer state [(x_prev (C,), S (H, N, N), ffn x_prev (C,))].
    x = ln(params["emb.weight"][token], "blocks.0.ln0")
    v_first, new_state = None, []
    for i, (att_x_prev, S, ffn_x_prev) in enumerate(state):
        att, ffn = block(f"blocks.{i}.att."), block(f"blocks.{i}.ffn.")
        x_att = ln(x, f"blocks.{i}.ln1")
        dx, att_x_prev, S, v_first = time_mix_one(att, x_att, att_x_prev, S, v_first)
        x = x + dx
        xn = ln(x, f"blocks.{i}.ln2")
        xk = xn + (ffn_x_prev - xn) * ffn["x_k"].ravel()
        x = x + np.maximum(xk @ ffn["key.weight"].T, 0.0) ** 2 @ ffn["value.weight"].T
        new_state.append((att_x_prev, S, xn))
    return ln(x, "ln_out") @ params["head.weight"].T, new_state


# %% [markdown]
# Both modes compute the same function: everything that links a token to earlier ones (the two token shifts, the WKV
# state) is in the state, and `v_first` belongs to the token. So the RNN program, fed the tokens one by one, must
# give GPT mode's logits and final state:

# %%
rnn_logits = np.empty_like(ref_logits)
rnn_states = []
for b in range(B):
    step_state = [(np.zeros(C), np.zeros((H, N, N)), np.zeros(C)) for _ in range(L)]
    for t in range(T):
        rnn_logits[b, t], step_state = forward_one(params, ids[b, t], step_state)
    rnn_states.append(step_state)

def batched(states):
    # Per-row states of the RNN program -> the (B, ...) layout of GPT mode.
    return [tuple(np.stack([row[i][j] for row in states]) for j in range(3)) for i in range(L)]

# %% tags=["nbval-check-output"]
check("RNN program, token by token vs GPT mode (reference.forward): logits", rnn_logits, ref_logits,
      REFERENCE_BUDGET)
for i, (layer, gpt_layer) in enumerate(zip(batched(rnn_states), ref_state)):
    for name, got, want in zip(("att_x_prev", "att_kv", "ffn_x_prev"), layer, gpt_layer):
        check(f"RNN program vs GPT mode: layer {i} {name}", got, want, REFERENCE_BUDGET)

# %% [markdown]
# **What `reference.rwkv7.forward_rnn` checks.** The reference's own "RNN mode" is `forward` called on one token at a
# time, the state carried between calls. Comparing it with GPT mode checks that the state carries everything (and
# that a GPT-mode prompt can be continued in RNN mode, which BlinkDL's `rwkv_v7_demo_fast.py` does), but it runs the
# same code both ways; the program above is the check of RNN mode as a program. The post adds that GPT mode needs no
# state and has to recompute every token when generating. It need not: the same forward returns the state after the
# last token, so a prompt read in GPT mode can be continued token by token.

# %%
rnn_ref_logits, rnn_ref_state = ref.forward_rnn(params, ids)  # forward, one token at a time
prefill_logits, prefill_state = ref.forward(params, ids[:, :5])  # GPT mode for a 5-token prompt
# ... then one token at a time
mixed_logits, mixed_state = ref.forward_rnn(params, ids[:, 5:], prefill_state)

def flat(state):
    # A state as one vector (for one agreement number over all its parts).
    return np.concatenate([np.asarray(s, dtype=np.float64).ravel()
                           for layer in state for s in layer])

# %% tags=["nbval-check-output"]
check("reference.forward_rnn vs GPT mode: logits", rnn_ref_logits, ref_logits, REFERENCE_BUDGET)
check("prompt in GPT mode, then token by token vs GPT mode: logits",
      np.concatenate([prefill_logits, mixed_logits], axis=1), ref_logits, REFERENCE_BUDGET)
check("prompt in GPT mode, then token by token vs GPT mode: state", flat(mixed_state),
      flat(ref_state), REFERENCE_BUDGET)

# %% [markdown]
# **Independent evidence: BlinkDL's runtime.** Everything above is this project's reading of the post. The `rwkv`
# package is BlinkDL's own runtime, the one the post's demo scripts come from; its RWKV-7 mode has both programs:
# `forward(token, state)` runs its RNN program, `forward(tokens, state, full_output=True)` its GPT mode. It loads
# the same weights from a `.pth` file (written to a temporary folder here) and runs them in fp32. It also settles
# one of the post's side claims: the post says the head size $N$ is "fixed at 64". That is the setting of the
# released models (erratum 20); the runtime reads $N$ from the checkpoint (the shape of `r_k`), and runs this one,
# with $N = 8$, as well. The cell skips, with a message, where `rwkv` is not installed (it is a test dependency of
# this project; `tests/models/test_models_rwkv7.py` compares the two at length).

# %%
import contextlib
import importlib
import importlib.util
import io
import os
import tempfile

def blinkdl_runtime(params):
    # BlinkDL's RWKV_x070 on these weights (fp32, CPU); its RWKV-7 mode is chosen by environment
    # variables.
    os.environ.update(RWKV_V7_ON="1", RWKV_JIT_ON="0", RWKV_CUDA_ON="0")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            tempfile.TemporaryDirectory() as folder:
        warnings.simplefilter("ignore")  # torch.jit.script is deprecated, says torch
        runtime = importlib.import_module("rwkv.model")
        weights = {n: torch.tensor(a, dtype=torch.float32) for n, a in params.items()}
        torch.save(weights, f"{folder}/w.pth")
        return runtime.RWKV_x070(model=f"{folder}/w", strategy="cpu fp32")

if importlib.util.find_spec("rwkv") is None:
    print("the rwkv package is not installed: skipped "
          "(tests/models/test_models_rwkv7.py compares against it)")
else:
    peer = blinkdl_runtime(params)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peer_gpt, _ = peer.forward([int(i) for i in ids[0]], None, full_output=True)
        peer_state, peer_rnn = None, []
        for token in ids[0]:
            step_logits, peer_state = peer.forward(int(token), peer_state)
            peer_rnn.append(step_logits)
    check("BlinkDL's runtime, GPT mode (fp32) vs reference.forward", peer_gpt, ref_logits[0],
          FP32_BUDGET)
    check("BlinkDL's runtime, RNN program (fp32) vs reference.forward", torch.stack(peer_rnn),
          ref_logits[0], FP32_BUDGET)
    print("head size N read from the checkpoint:", peer.head_size)

# %% [markdown]
# ### Handing a state to another runtime: two silent traps
#
# A state is portable: a prompt read by one runtime can be continued by another, which is how a server hands a
# conversation from a GPU prefill to a CPU decoder. But RWKV-7's runtimes disagree on two conventions, and neither
# disagreement raises an error:
#
# - **Orientation.** BlinkDL's runtime (and `reference.wkv7` here) stores each head's $S$ as [value, key], so that
#   $y = S r$; flash-linear-attention and transformers' rwkv7-hf store it as [key, value], $y = S^\top r$. Both are
#   $N \times N$: a state handed across without a transpose has the right shape and the wrong meaning.
# - **The decay's form.** BlinkDL's RNN program passes the decay $w$ itself (`state * w` above); fla's kernels take
#   its log, as `reference.wkv7` does. A $w$ in $(0.545, 1)$ passed as a log decay becomes a factor $e^{w} > 1$
#   at every step: the state grows instead of fading.
#
# Below, the reference reads the first 10 tokens of a sequence, and a "[key, value] runtime" (the reference with its
# state transposed on the way in and out, which is all that convention is) continues from its state, once with the
# transpose at the boundary and once without; then the decay is passed as $w$ instead of $\log w$.

# %%
rng_trap = np.random.default_rng(11)
T_trap = 20
trap = [rng_trap.standard_normal((1, T_trap, H, N)) for _ in range(6)]           # r, log_w, k, v, a, b
trap[1] = -np.exp(rng_trap.uniform(-3.0, 0.0, (1, T_trap, H, N)))                 # log w < 0: decays in (0, 1)
kk_trap = trap[4] / np.linalg.norm(trap[4], axis=-1, keepdims=True)
trap[4], trap[5] = -kk_trap, kk_trap * sigmoid(trap[5])                           # a = -kk, b = kk * alpha
first, rest = [x[:, :10] for x in trap], [x[:, 10:] for x in trap]

def key_value_runtime(r, log_w, k, v, a, b, state_kv):
    # A runtime that keeps S as [key, value]: the same recurrence, its state transposed at its boundary.
    y, S_vk = wkv7_reference(r, log_w, k, v, a, b, state=state_kv.swapaxes(-1, -2))
    return y, S_vk.swapaxes(-1, -2)

y_whole = wkv7_reference(*trap)[0][:, 10:]                                        # one runtime, start to end
S_first = wkv7_reference(*first)[1]                                               # [value, key]
y_transposed = key_value_runtime(*rest, S_first.swapaxes(-1, -2))[0]             # the fix: transpose at the hand-over
y_as_is = key_value_runtime(*rest, S_first)[0]                                    # the trap: same shape, no error
y_w_as_log = wkv7_reference(*rest[:1], np.exp(rest[1]), *rest[2:], state=S_first)[0]

# %% tags=["nbval-check-output"]
check("state handed over transposed ([value, key] -> [key, value]) vs one runtime", y_transposed, y_whole,
      REFERENCE_BUDGET)
print("state handed over as it is: output off by more than 10% (relative RMS):", rel_rms(y_as_is, y_whole) > 0.1)
print("w passed where log w is expected: output off by more than 10%:", rel_rms(y_w_as_log, y_whole) > 0.1)

# %%
print(f"relative RMS error: untransposed state {rel_rms(y_as_is, y_whole):.2f}, w as log w "
      f"{rel_rms(y_w_as_log, y_whole):.2f}")

# %% [markdown]
# The fix is at the boundary, once: transpose the state's last two axes when it crosses between a [value, key] and a
# [key, value] runtime, and pass $\log w$ (or $w$) as the receiving op expects. A symmetric test state hides the
# first trap (here the random one does not), and short sequences with decays near 1 blur the second: test a
# hand-over with random states and decays well below 1. The models of this project load both files
# (`from_pretrained`, fla's names; `from_checkpoint`, BlinkDL's) into one layout, so the traps arise only when a state
# leaves the project.
#
# ## 9. The state over time
#
# Below, the size of each layer's WKV state $\lVert S_t \rVert$ (over both heads) while the model reads 200 random
# tokens one at a time, and, dashed, the same model with the post's $a = -k$, $b = k\eta$ ($\eta = \alpha$, the key
# not normalized; erratum 19). With RWKV-7's $a, b$ the state grows while the memory fills, then wanders at the size of
# a few dozen writes: no transition has an eigenvalue outside $(-1, 1)$ (notebook 04), the removal takes out what the
# state returns for each new key, and the decays, in $(0.545, 1)$, fade the rest. This is one run, not a bound
# (notebook 04 shows that a single transition can lengthen a row a little). With the post's $a, b$ the same weights
# grow by orders of magnitude, layer 0's state past $10^{12}$ within a hundred tokens.

# %%
long_ids = rng.integers(0, V, (1, 200))
norms = {False: [], True: []}
with np.errstate(over="ignore", invalid="ignore"):
    for post_ab, sizes in norms.items():
        step_state = None
        for t in range(long_ids.shape[1]):
            # one token at a time
            _, step_state = forward(params, long_ids[:, t:t + 1], step_state, post_ab)
            sizes.append([np.linalg.norm(layer[1]) for layer in step_state])
fig, ax = plt.subplots(figsize=(7.5, 3.8), constrained_layout=True)
for i in range(L):
    ax.semilogy(np.arange(1, 201), np.array(norms[False])[:, i], color=f"C{i}",
                label=f"layer {i}, RWKV-7")
    ax.semilogy(np.arange(1, 201), np.array(norms[True])[:, i], "--", color=f"C{i}",
                label=rf"layer {i}, the post's $a = -k$, $b = k\eta$")
ax.set_ylim(0.1, 1e12)
ax.set_xlabel("tokens read")
ax.set_ylabel(r"$\Vert S_t \Vert$ (att_kv)")
ax.set_title("the WKV state of each layer while reading")
ax.legend(fontsize=7, ncol=2)
plt.show()

# %% tags=["nbval-check-output"]
print("RWKV-7: every layer's |S_t| below 100 over the 200 tokens:",
      bool(np.array(norms[False]).max() < 100))
post_sizes = np.array(norms[True])
print("the post's a, b: some layer past 1e6 or not finite:", bool(~np.isfinite(post_sizes).all() or
                                                                   np.nanmax(post_sizes) > 1e6))

# %% [markdown]
# **"Low-rank"? (erratum 20)** The post calls $S_t$ "a low-rank state matrix". From a zero state each token adds at most one to its
# rank (the transition $\mathrm{diag}(w) + ab^\top$ does not raise it, the write $v\tilde k^\top$ adds one), so for the
# first $N - 1$ tokens it is low-rank; after that it is full rank, $N$, like any generic matrix. What is low-rank in
# RWKV-7 are the LoRA maps that make $\omega$, $\alpha$, $g$ and the value-residual gate, and the *change* each
# transition makes to the identity-like decay, rank one. The rank of layer 0's first head over the first 12 tokens:

# %%
rank_state, ranks = None, []
for t in range(12):
    _, rank_state = forward(params, long_ids[:, t:t + 1], rank_state)
    ranks.append(int(np.linalg.matrix_rank(rank_state[0][1][0, 0])))

# %% tags=["nbval-check-output"]
print(f"rank of S_t (N = {N}), t = 1..12:", ranks)


# %% [markdown]
# ## 10. Reflections: a Transformer and an RNN at once
#
# The study notes close their RWKV part with a reflection: RWKV is a Transformer and an RNN combined; $r$ acts as a
# gate, the WKV replaces the costly attention by something like a linear recurrence (its output at $t$ fuses
# everything from tokens $1 \ldots t-1$ with $v_t$), and the whole "stays linear". What notebooks 02 to 05 showed
# makes each part precise for RWKV-7:
#
# - **The Transformer half.** The block has a Transformer's shape (the diagram of section 7): pre-norm residual
#   sub-blocks, one that mixes tokens and one that mixes channels (a squared-ReLU FFN, section 6). GPT mode
#   (section 8) runs each layer over the whole sequence at once, and training does so too, through the chunked form
#   of notebook 04, section 6.
# - **The RNN half.** RNN mode (section 8) gives the same logits from a state of fixed size, $2C + H N^2$ numbers per
#   layer however long the text (below); notebook 03 measured what that saves against attention.
# - **The gate.** In RWKV-4, $\sigma(r)$ gates the WKV's average (notebook 03). In RWKV-7, $r$ has become the query
#   that reads the matrix memory, $y = S r$, and the gating has moved to $g$.
# - **"Stays linear".** Every nonlinearity (the sigmoids, softplus, tanh, ReLU$^2$, the norms) acts on what goes into
#   the recurrence or on what comes out of it, never between two steps of the state: $S_t = S_{t-1} G_t + v_t
#   \tilde k_t^\top$ with $G_t$ made from the layer's input ($x_t$ and $x_{t-1}$, through the token shift), never
#   from the state $S$. So the op's outputs are affine in the state it starts from,
#   checked below, and that is what lets a product of transitions (notebook 04, sections 5 and 6) replace the loop,
#   and the cost grow linearly in $T$.
#
# What the combination does not remove is the RNN's small memory: the state holds $N^2$ numbers per head, the delta
# rule (notebook 04) decides what to overwrite, and notebook 09 measures how much it can recall. And "linear" does
# not mean "weak": a transition with a negative eigenvalue can flip a sign, which RWKV-4's and Mamba's decays cannot
# (notebook 04, section 8).

# %%
rng_op = np.random.default_rng(7)                                     # its own draws: later cells keep rng's
op_inputs = [rng_op.standard_normal((1, 6, H, N)) for _ in range(6)]
op_inputs[1] = -np.exp(op_inputs[1])                                   # log_w < 0
kk_op = op_inputs[4] / np.linalg.norm(op_inputs[4], axis=-1, keepdims=True)
op_inputs[4], op_inputs[5] = -kk_op, kk_op * sigmoid(op_inputs[5])     # a = -kk, b = kk * alpha
S_a, S_b = rng_op.standard_normal((2, 1, H, N, N))
y_of = {name: wkv7_reference(*op_inputs, state=S_)[0]
        for name, S_ in (("0", np.zeros_like(S_a)), ("a", S_a), ("b", S_b), ("a + b", S_a + S_b))}
state_sizes = {t: sum(s.size for s in forward(params, ids[:1, :t])[1][0]) for t in (1, T)}

# %% tags=["nbval-check-output"]
check("y(S_a + S_b) - y(0) vs (y(S_a) - y(0)) + (y(S_b) - y(0)): affine in the initial state",
      y_of["a + b"] - y_of["0"], (y_of["a"] - y_of["0"]) + (y_of["b"] - y_of["0"]), REFERENCE_BUDGET)
print(f"numbers in one layer's state after 1 token and after {T}:", list(state_sizes.values()),
      f"= 2C + H N^2 = {2 * C + H * N * N}")

# %% [markdown]
# ## 11. What a trained model learned
#
# Every weight above was drawn at random. The project also trains an RWKV-7 of its own: a byte-level language model
# (vocabulary 256, one token per byte; BlinkDL's head size 64) trained on the Python standard library's `.py` sources
# by `python -m seqmix.experiments.language_model` (its docstring gives the sizes and the protocol; its report,
# `experiments/results/language_model.md`, the losses). It ships twice: as a flash-linear-attention
# `RWKV7ForCausalLM` directory (`config.json`, `model.safetensors`, `tokenizer.json` whose ids are the byte values),
# which `Rwkv7.from_pretrained` reads, and as a BlinkDL `.pth`, which `Rwkv7.from_checkpoint` reads. Both are
# loaded here; they must give the same logits, and the same as the float64 reference on the stored values.
#
# Then the model reads a few lines of real Python, and each layer's inputs are caught on their way into the time
# mix (a forward pre-hook on `blocks[i].att`: the layer-normed $x$ and the state's $x_{t-1}$). From them, sections 1,
# 2 and 4 give what the op receives at every token and channel: the decay $w_t = e^{-e^{\omega_t}}$, in
# $(0.545, 1)$, and the in-context learning rate $\alpha_t = \sigma(a_0 + x^a_t A_1 A_2)$, in $(0, 1)$. A decay near
# 1 keeps what the state holds in that channel; near 0.545 it loses almost half of it at that token. A rate near 1
# replaces what the state returns for the removal key $\hat\kappa_t$; near 0 it only adds.

# %%
from pathlib import Path

from seqmix.models.rwkv7 import Rwkv7

REPO = Path(seqmix.kernels.__file__).resolve().parents[1]
LM_WEIGHTS = REPO / "experiments" / "results" / "weights" / "language_model"

trained = Rwkv7.from_pretrained(LM_WEIGHTS / "rwkv7", dtype=torch.float32).eval()
trained_pth = Rwkv7.from_checkpoint(LM_WEIGHTS / "rwkv7.pth", dtype=torch.float32).eval()
tc = trained.config
print(f"trained RWKV-7: C = {tc.n_embd} (H = {tc.n_head}, N = {tc.head_size}), L = {tc.n_layer}, "
      f"V = {tc.vocab_size}, {sum(p.numel() for p in trained.parameters()):,} parameters")

lm_source = "import os\n\ndef read(path):\n    with open(path) as f:\n        return f.read()\n"
lm_ids = np.array([trained.tokenizer.encode(lm_source)])                  # (1, T): the bytes
caught = {}                                                                # layer -> (x, x_prev)

def catch(layer):
    def hook(module, args):
        caught[layer] = tuple(a.detach().double().numpy() for a in args[:2])
    return hook

hooks = [b.att.register_forward_pre_hook(catch(i)) for i, b in enumerate(trained.blocks)]
with torch.no_grad():
    lm_logits, _ = trained(torch.as_tensor(lm_ids), backend="torch")
    pth_logits, _ = trained_pth(torch.as_tensor(lm_ids), backend="torch")
for h in hooks:
    h.remove()
trained_params = {name: p.detach().double().numpy() for name, p in trained.state_dict().items()}
lm_ref_logits = ref.forward(trained_params, lm_ids)[0]

def decays_and_rates(layer):
    # w_t = e^(log w_t) and alpha_t, each (T, C), of one layer on the prompt (sections 1, 2 and 4).
    p = {name[len(f"blocks.{layer}.att."):]: a for name, a in trained_params.items()
         if name.startswith(f"blocks.{layer}.att.")}
    x_l, x_prev_l = caught[layer]
    mixes_l = token_shift_mixes(p, x_l, x_prev_l)
    log_w_l = receptance_decay_key_value(p, mixes_l)[1]
    z_a = p["a0"] + mixes_l["a"] @ p["a1"] @ p["a2"]
    return {"log_w": log_w_l, "w": np.exp(log_w_l)[0], "alpha": sigmoid(z_a)[0], "z_a": z_a,
            "ref_log_w": ref.log_decay(mixes_l["w"], p["w0"], p["w1"], p["w2"])}

learned = [decays_and_rates(i) for i in range(tc.n_layer)]

# %% tags=["nbval-check-output"]
check("trained RWKV-7: the BlinkDL .pth (from_checkpoint) vs the fla directory (from_pretrained): logits",
      pth_logits, lm_logits, FP32_BUDGET)
check("trained RWKV-7 (torch, fp32) vs the float64 reference on its stored weights: logits", lm_logits,
      lm_ref_logits, FP32_BUDGET)
for i, got in enumerate(learned):
    check(f"layer {i}: log w written out (section 2) vs reference.log_decay", got["log_w"], got["ref_log_w"],
          REFERENCE_BUDGET)
    check(f"layer {i}: alpha written out (section 4) vs reference.in_context_rate", got["alpha"],
          ref.in_context_rate(got["z_a"], got["log_w"])[0], REFERENCE_BUDGET)
w_all = np.stack([got["w"] for got in learned])                           # (L, T, C)
alpha_all = np.stack([got["alpha"] for got in learned])
print("one decay and one rate per layer, token and channel:",
      w_all.shape == alpha_all.shape == (tc.n_layer, lm_ids.shape[1], tc.n_embd))
print("every decay within [0.545, 1]:", bool(((w_all >= np.exp(-np.exp(-0.5))) & (w_all <= 1)).all()))
print("every in-context rate within [0, 1]:", bool(((alpha_all >= 0) & (alpha_all <= 1)).all()))

# %%
def char_labels(text):
    # One label per byte-token: the character, with the invisible ones made visible.
    return [{"\n": "\u23ce", " ": "\u2423"}.get(ch, ch) for ch in text]

labels = char_labels(lm_source)
show_layer = tc.n_layer - 1
fig, axes = plt.subplots(3, 1, figsize=(12, 9.5), constrained_layout=True)
for ax, (name, values, cmap) in zip(axes[:2], (
        (fr"decay $w_t$ (layer {show_layer})", learned[show_layer]["w"], "viridis"),
        (fr"in-context learning rate $\alpha_t$ (layer {show_layer})", learned[show_layer]["alpha"], "magma"))):
    image = ax.imshow(values.T, aspect="auto", cmap=cmap, interpolation="nearest")
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylabel("channel")
    ax.set_title(name, fontsize=10)
    fig.colorbar(image, ax=ax, pad=0.01)
for i in range(tc.n_layer):
    axes[2].plot(w_all[i].mean(-1), marker=".", label=f"layer {i}: mean decay")
    axes[2].plot(alpha_all[i].mean(-1), ls="--", color=f"C{i}", lw=0.9, label=f"layer {i}: mean rate")
axes[2].set_xticks(range(len(labels)), labels, fontsize=7)
axes[2].set_xlim(-0.5, len(labels) - 0.5)
axes[2].set_ylabel("mean over channels")
axes[2].set_title("every layer: channel-mean decay (solid) and in-context rate (dashed) per token", fontsize=10)
axes[2].legend(fontsize=7, ncol=tc.n_layer, loc="lower right")
plt.show()

# %%
# The numbers behind the plot (not compared: they are the trained model's).
for i in range(tc.n_layer):
    mean_w, mean_a = w_all[i].mean(-1), alpha_all[i].mean(-1)
    forget, replace = np.argsort(mean_w)[:3], np.argsort(mean_a)[::-1][:3]
    print(f"layer {i}: decays {w_all[i].min():.3f} to {w_all[i].max():.4f} (mean {w_all[i].mean():.3f}), "
          f"rates {alpha_all[i].min():.2f} to {alpha_all[i].max():.2f} (mean {alpha_all[i].mean():.2f}); "
          f"most forgetting at {[labels[t] for t in forget]}, highest rate at {[labels[t] for t in replace]}")
spread = np.stack([w_all.std(axis=1).mean(-1), w_all.std(axis=2).mean(-1)], axis=1)   # (L, 2)
for i, (over_tokens, over_channels) in enumerate(spread):
    print(f"layer {i}: the decay varies by {over_tokens:.3f} from token to token (std over tokens, "
          f"mean over channels), by {over_channels:.3f} from channel to channel")

# %% [markdown]
# RWKV-4's decay (notebook 03) is one number per channel, the same at every token; here the decay and the rate are made
# from the layer's input at the token and the one before (the token shift; above layer 0 that input already carries what
# earlier layers read), so the heatmaps can vary along the text as well as across the channels. Read them column by
# column: a column of low decays is a token at which the layer clears part of its state; a column of high rates is one
# at which it overwrites what it stored under that key rather than adding to it. The last lines above say how much of
# the variation is across tokens and how much across channels, and at which characters each layer forgets most.
#
# Last, the trained model continues a prompt through its state (RNN mode, section 8), greedily, up to the end of the
# line. From a shell: `python -m seqmix.generate experiments/results/weights/language_model/rwkv7 --prompt "def "`
# (or the `.pth`, with `--tokenizer experiments/results/weights/language_model/tokenizer.json`).

# %%
lm_prompt = "def "
lm_stream = trained.generate_text(lm_prompt, max_new_tokens=80, stop="\n")
print(repr(lm_prompt + "".join(lm_stream)))

# %% tags=["nbval-check-output"]
print("the continuation is text, one line at most:", isinstance(lm_stream.text, str) and "\n" not in lm_stream.text)
print("tokens generated, within the limit:", 0 < len(lm_stream.tokens) <= 80)

# %% [markdown]
# **How good is it, read honestly.** This is the one place in the series that says how good the trained language
# models are. The measure is bits per byte on the test split (files the models never trained on): the average
# $-\log_2 p$ of each next byte. A model that knew nothing would need 8 bits; the bigram control of the report
# (the next byte from the previous one alone, counted on the train split) needs 3.57. General-purpose compressors are
# the other honest yardstick: `gzip -9`, `bzip2 -9` and `xz -9` on the same bytes, computed here with Python's
# `gzip`, `bz2` and `lzma` modules (the size of the compressed file, in bits, per byte; a compressor adapts to the
# text as it reads it, while the models bring what they learned on the train split).

# %%
import bz2
import gzip
import json
import lzma

from seqmix.experiments import data as lm_data
from seqmix.experiments import language_model
from seqmix.experiments.records import Results

lm_rows = Results(REPO / "experiments" / "results", language_model.NAME)
test_bpb = {arch: r["test_bpb"] for arch, r in language_model.final_runs(lm_rows, seed=0).items()}  # the table's seed
test_bpb["bigram (add-one)"] = lm_rows.find(phase="bigram")["test_bpb"]
corpus = lm_data.stdlib_corpus()
committed = json.loads((REPO / "experiments" / "results" / "stdlib_corpus.json").read_text())
test_bytes = corpus.split("test").tobytes()
print("this Python's test split is the committed one:", corpus.manifest()["files"] == committed["files"],
      f"({len(test_bytes):,} bytes)")
compressors = {"gzip -9": gzip.compress(test_bytes, compresslevel=9), "bzip2 -9": bz2.compress(test_bytes, 9),
               "xz -9": lzma.compress(test_bytes, preset=9)}
for name, packed in compressors.items():
    test_bpb[name] = 8 * len(packed) / len(test_bytes)
for name, bpb in sorted(test_bpb.items(), key=lambda item: item[1]):
    source = "computed here" if name in compressors else "committed report"
    print(f"{name:18s} {bpb:.3f} bits per byte   ({source})")

# %% [markdown]
# Read the list from the top. RWKV-7, the best of the four models of about a million parameters, needs 1.685 bits
# per byte, less than half the bigram's 3.57: it has learned far more than which byte follows which. But `xz -9`
# does slightly better (1.673 on this split), `bzip2 -9` about as well (1.690), and RWKV-4 (1.740), Mamba (1.809)
# and attention (1.917) sit between those and `gzip -9` (1.959). At this size and budget (8 million training bytes,
# minutes of CPU), a neural model of code predicts about as well as a good compressor, not better. Trained three
# times as long (24.6 million bytes, about three CPU-hours: the experiments' longer run, in docs/experiments.md),
# the same model gets 1.590 and passes `xz -9`; reading whole files with its state carried past the window, 1.479,
# and it beats `xz -9` on code from outside the standard library too. Models a hundred to a thousand times larger,
# trained far longer, beat compressors by a wide margin; these are teaching models, and the comparison keeps them
# honest. The numbers above are one training seed's; two more seeds, each choosing its own rates, keep the order
# RWKV-7, RWKV-4, Mamba, attention on every seed, RWKV-7 at 1.661 to 1.685 (docs/experiments.md, "Three seeds").
#
# Greedy decoding (above) repeats the most likely line; the text a model *is* shows better when sampled. Below, a
# fixed seed, a temperature of 0.8 and nucleus sampling (top-p 0.95: only the most likely bytes that together hold
# 95% of the probability): the output depends on the machine's last bits, so it is shown, not compared.

# %%
sampled = trained.generate_text("def ", max_new_tokens=240, temperature=0.8, top_p=0.95,
                                generator=torch.Generator().manual_seed(0))
print("def " + "".join(sampled))

# %% [markdown]
# ## Summary
#
# - RWKV-7's time mix makes six token-shifted mixes, and from them $r$, a decay soft-clamped into $(0.545, 1)$ (the
#   log decay is the negative one, and a lower $\omega$ forgets *less*: erratum 18), $k$, $v$, the learning rate
#   $\alpha$, the gate $g$, the unit removal key $\hat\kappa$ and the written key $\tilde k$; calls the op with
#   $a = -\hat\kappa$, $b = \hat\kappa \odot \alpha$ (not the post's $a = -k$, $b = k\eta$, whose state blows up:
#   erratum 19); normalizes per head, adds the bonus $(\sum r \tilde k r_k)\, v$, and gates with $g$. Written out
#   step by step, it agrees with `reference/rwkv7.py`.
# - `v_first` is layer 0's value at every token, $(B, T, C)$, not the first token's (erratum 17): changing token 0
#   changes it at positions 0 and 1 only.
# - The channel mix is a squared-ReLU FFN with a token shift; at the same width it has as many parameters as a
#   transformer's FFN, not fewer.
# - GPT mode and RNN mode, written as two programs (a sequence through each layer; one token of vectors through the
#   state), give the same logits and states, and so does BlinkDL's runtime, both ways, on the same weights (with
#   $N = 8$: the head size is a setting, not fixed at 64). A state handed to a runtime of the other orientation
#   ([value, key] against [key, value]) or with $w$ where $\log w$ is expected gives wrong output without an error;
#   the fix is a transpose (or a log) at the boundary.
# - Section 7 draws the block; section 10 reads it as the notes' "Transformer + RNN": a Transformer's block shape and
#   GPT mode, an RNN's fixed state and RNN mode, the gate moved from $r$ to $g$, and a recurrence that stays linear
#   in the state (checked: the op is affine in its initial state).
# - The state is a full-rank $N \times N$ matrix per head after $N$ tokens ("low-rank" only before that); in this
#   run it stays the size of a few dozen writes.
# - The project's own trained RWKV-7 (a byte-level model of the standard library's sources) loads from both of its
#   files, the fla directory and the BlinkDL `.pth`, with the same logits as each other and as the float64 reference.
#   On real Python its decays $w_t \in (0.545, 1)$ and in-context rates $\alpha_t \in (0, 1)$ change from token to
#   token and channel to channel (section 11 plots them). Its test bits per byte, 1.685, are less than half the
#   bigram's and about those of `xz -9` on the same bytes (1.673): a teaching model, as good as a good compressor.
#
# Next: notebook 06 turns to state space models and Mamba.
#
# ## Exercises
#
# Each coding exercise has a stub to fill in (it raises `NotImplementedError` until you do), a check cell below it
# that says "not attempted yet", "correct" or what is off, and the solution in a collapsed cell starting
# `# Solution` (click the three dots to open it). Questions have their worked answer in a collapsed cell too.
#
# **1. How long a channel remembers.** Section 2's decay $w = e^{-e^{\omega}}$, $\omega = -\mathrm{softplus}(-z) -
# 0.5$, multiplies the state once per token. Write `half_life(z)`: the number of tokens (a real number) after which a
# channel whose LoRA output is $z$ keeps half of what it holds, for an array of $z$. The check compares it with the
# half-lives that `reference.log_decay`'s log decays give, over $z \in [-12, 8]$, and prints the shortest half-life
# any channel can have. Before running it: is there a longest? (Hint: $w^n = 1/2$.)

# %%
# Exercise 1: the decay's half-life
def half_life(z):
    """Tokens until the decay exp(-exp(omega(z))) has multiplied the state down to one half; z an array."""
    raise NotImplementedError("Exercise 1: your code here")


# %% tags=["nbval-check-output"]
from seqmix.kernels.testing import exercise


def checks_1():
    z_grid = np.linspace(-12.0, 8.0, 201)
    zero_lora = np.zeros((len(z_grid), 1))
    log_w_ref = ref.log_decay(np.zeros((1, 1, len(z_grid))), z_grid[None, None], zero_lora, zero_lora.T)[0, 0]
    check("half_life vs -ln 2 / log w from reference.log_decay", half_life(z_grid), -np.log(2.0) / log_w_ref,
          REFERENCE_BUDGET)
    print(f"shortest half-life, as z grows: {half_life(np.array([50.0]))[0]:.3f} tokens")


exercise("Exercise 1", checks_1)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# w^n = 1/2 gives n = ln 2 / (-log w) = ln 2 / e^omega. As z grows, omega -> -0.5 and the half-life falls to
# ln 2 / e^-0.5 = 1.14 tokens: no channel loses half its state in less than about one token. As z falls, omega -> -inf
# and the half-life grows without bound (e^-omega): there is no longest; z = -12 already gives about 186,000 tokens.
def half_life(z):
    omega = -np.logaddexp(0.0, -z) - 0.5
    return np.log(2.0) / np.exp(omega)


exercise("Exercise 1", checks_1)

# %% [markdown]
# **2. Two ways to write the decay.** BlinkDL's RNN program computes the decay as $e^{-e^{-0.5}\sigma(z)}$, the post's
# code as $e^{-e^{\omega}}$ with $\omega = -\mathrm{softplus}(-z) - 0.5$. Show they are equal (on paper, then
# numerically).

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# -softplus(-z) = -log(1 + e^-z) = log(sigmoid(z)), so e^omega = e^-0.5 sigmoid(z), and the decays agree.
z_grid = np.linspace(-30, 30, 601)
post_decay = np.exp(-np.exp(-np.logaddexp(0.0, -z_grid) - 0.5))
blinkdl_decay = np.exp(-np.exp(-0.5) * sigmoid(z_grid))
check("exp(-e^-0.5 sigmoid(z)) vs exp(-exp(-softplus(-z) - 0.5))", blinkdl_decay, post_decay,
      REFERENCE_BUDGET)

# %% [markdown]
# **3. Where a token reaches v_first.** Change the token at position 3 instead of position 0 in section 3: which
# positions of `v_first` change, and why?

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# Positions 3 and 4: token 3 is the input at 3, and the token shift shows it to position 4. Nothing else.
changed3 = ids.copy()
changed3[:, 3] = (ids[:, 3] + 1) % V
moved3 = np.abs(v_first_of(changed3) - v_first).max(axis=(0, 2)) > 0
print("positions of v_first that change with token 3:", np.flatnonzero(moved3).tolist())

# %% [markdown]
# **4. Per head, or all at once?** The op's output is normalized per head (section 5). Write that normalization as a
# function `per_head(y, eps=64e-5)` of the op's output $y$, $(B, T, H, N)$: each head's $N$ numbers shifted to mean 0
# and scaled to variance 1 (with `eps` added to the variance), without the weights and bias, which come after. The
# check puts it into a time mix built from the pieces of sections 1 to 5 (`time_mix_with_norm`) and compares layer
# 1's output with `reference.time_mix`; it also runs the same time mix with one group over all $C$ channels, which
# must fail. Why does each head get its own?

# %%
# Exercise 4: the per-head norm
def per_head(y, eps=64e-5):
    """y (B, T, H, N) normalized over each head's N numbers: mean 0, variance 1 (eps added to the variance)."""
    raise NotImplementedError("Exercise 4: your code here")


# %% tags=["nbval-check-output"]
def one_group(y, eps=64e-5):
    flat = y.reshape(*y.shape[:-2], -1)                                 # (B, T, C): all heads together
    return ((flat - flat.mean(-1, keepdims=True)) / np.sqrt(flat.var(-1, keepdims=True) + eps)).reshape(y.shape)


def time_mix_with_norm(p, x, x_prev, S, v_first, norm):
    mixes = token_shift_mixes(p, x, x_prev)
    r, log_w, k, v = receptance_decay_key_value(p, mixes)
    v, v_first = value_residual(p, v, v_first, mixes["v"])
    alpha, g, kk, k_written = rate_gate_keys(p, k, mixes)
    y = op_call(r, log_w, k_written, v, kk, alpha, S)[0]
    y = norm(y).reshape(g.shape) * p["ln_x.weight"] + p["ln_x.bias"]
    bonus = (heads(r) * heads(k_written) * p["r_k"]).sum(-1, keepdims=True) * heads(v)
    return ((y + bonus.reshape(g.shape)) * g) @ p["output.weight"].T


def checks_4():
    check("time mix with your per-head norm vs reference.time_mix",
          time_mix_with_norm(att1, x1, x_prev1, S1, v_first, per_head), ref_out, REFERENCE_BUDGET)
    one = time_mix_with_norm(att1, x1, x_prev1, S1, v_first, one_group)
    print("with one group over C the time mix misses reference.time_mix by more than 1%:", rel_rms(one, ref_out) > 0.01)
    assert rel_rms(one, ref_out) > 0.01


exercise("Exercise 4", checks_4)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# Each head is its own memory, with its own decays and keys, so its output has its own scale; one group would let
# a loud head set the scale of the quiet ones.
def per_head(y, eps=64e-5):
    return (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + eps)


exercise("Exercise 4", checks_4)

# %% [markdown]
# ## Appendix: the production path against the reference
#
# The rest of this notebook is not about the math: it checks that the code people run gives the reference's
# numbers. nbval runs and checks it like the cells above.
#
# [`Rwkv7`](../models/rwkv7/__init__.py) holds the same weights (fp32) under BlinkDL's names:
# `model(input_ids, state=None, backend=None)` returns `(logits, state)`, the state a list of per-layer tuples as above
# (the WKV state in fp32). `backend` chooses how the op runs: the chunked torch path or the Triton kernel (under the
# interpreter here). Both run on the same ids, after a 3-token prefix that leaves a non-zero state, in GPT mode and in
# RNN mode, and greedy generation (which reads the prompt once, then one token at a time through the state) must
# pick the tokens that the float64 reference picks when it re-reads the whole text at every step.

# %%
from seqmix.models.rwkv7 import Rwkv7, Rwkv7Config

model = Rwkv7(Rwkv7Config(vocab_size=V, n_embd=C, n_layer=L, head_size=N, dim_ffn=F,
                          decay_lora=LORA["D_w"], a_lora=LORA["D_a"], v_lora=LORA["D_v"],
                          gate_lora=LORA["D_g"]))
model.load_state_dict({name: torch.tensor(a, dtype=torch.float32) for name, a in params.items()})
BACKENDS = ("torch", "triton")
prefix = rng.integers(0, V, (B, 3))
ref_after, ref_state_after = ref.forward(params, ids, ref.forward(params, prefix)[1])

runs = {}
with torch.no_grad():
    for backend in BACKENDS:
        _, prefix_state = model(torch.as_tensor(prefix), backend=backend)
        gpt = model(torch.as_tensor(ids), prefix_state, backend=backend)
        rnn_state, rnn_steps = prefix_state, []
        for t in range(T):
            token = torch.as_tensor(ids[:, t:t + 1])
            step_logits, rnn_state = model(token, rnn_state, backend=backend)
            rnn_steps.append(step_logits)
        runs[backend] = gpt, (torch.cat(rnn_steps, dim=1), rnn_state)


# %% tags=["nbval-check-output"]
for backend in BACKENDS:
    (gpt_logits_t, gpt_state_t), (rnn_logits_t, rnn_state_t) = runs[backend]
    check(f"{backend} fp32 GPT mode: logits", gpt_logits_t, ref_after, FP32_BUDGET)
    check(f"{backend} fp32 GPT mode: state", flat(gpt_state_t), flat(ref_state_after), FP32_BUDGET)
    check(f"{backend} fp32 RNN mode: logits", rnn_logits_t, ref_after, FP32_BUDGET)
    check(f"{backend} fp32 RNN mode: state", flat(rnn_state_t), flat(ref_state_after), FP32_BUDGET)

# %%
prompt = ids[:1, :4]                                                   # (1, 4)

def greedy_by_rereading(prompt, n):
    tokens = prompt
    for _ in range(n):
        tokens = np.concatenate([tokens, ref.forward(params, tokens)[0][:, -1:].argmax(-1)], axis=1)
    return tokens

continuation = greedy_by_rereading(prompt, 8)
print("greedy continuation (reference, re-reading):", continuation[0, 4:].tolist())

# %% tags=["nbval-check-output"]
for backend in BACKENDS:
    generated, _ = model.generate(torch.as_tensor(prompt), max_new_tokens=8, backend=backend)
    print(f"{backend}: generate through the state picks the reference's tokens:",
          generated.tolist() == continuation.tolist())

# %%
# The errors themselves (this cell is not compared: the numbers depend on the machine).
for backend in BACKENDS:
    (gpt_logits_t, gpt_state_t), (rnn_logits_t, _) = runs[backend]
    print(f"{backend:6s} fp32: GPT-mode logits rel. RMS error "
          f"{rel_rms(gpt_logits_t, ref_after):.1e}, "
          f"state {rel_rms(flat(gpt_state_t), flat(ref_state_after)):.1e}, "
          f"RNN-mode logits {rel_rms(rnn_logits_t, ref_after):.1e}")
