# %% [markdown]
# # 05 · The RWKV-7 model: time mix with v_first, a, g, kk and the bonus; GPT mode and RNN mode
#
# Notebook 04 took RWKV-7's state update apart. This one builds the model that feeds it, following the RWKV-7 post's
# walk through BlinkDL's `RWKV_Tmix_x070` and `RWKV_CMix_x070`: the token shift and its six mixes; the receptance,
# the decay (soft-clamped, so that every decay lies in $(0.545, 1)$), key and value; `v_first`, the value residual
# that later layers pull their values towards; the in-context learning rate `a`, the output gate `g`, the key to
# remove `kk` and the key to write; the op call; the per-head GroupNorm and the "bonus" term; the channel mix; the
# blocks and the model. Each is written out in NumPy and checked against `reference/rwkv7.py`. Then the post's two
# ways of running the model: GPT mode (the whole sequence through each layer) and RNN mode (one token at a time with a
# state), which give the same logits, and mix (a prompt in GPT mode, then tokens in RNN mode). Last, the torch model,
# with its WKV on the torch path and on the Triton kernel, against the reference.
#
# **Sources.** The RWKV-7 architecture post, https://www.cnblogs.com/Ctrl-cCtrl-v/p/18906192 (the time-mix and
# channel-mix code walk-through, GPT and RNN mode: the order followed here; errata 17, 18 and 19 of
# [`reference/ERRATA.md`](../reference/ERRATA.md) are about it); RWKV-7 "Goose", arXiv:2503.14456,
# https://arxiv.org/abs/2503.14456.
#
# **Code used.** [`reference/rwkv7.py`](../reference/rwkv7.py): `log_decay`, `time_mix`, `channel_mix`, `forward`
# (GPT mode), `forward_rnn` (RNN mode), `checkpoint_shapes` (NumPy, float64: the truth) ·
# [`reference/wkv7.py`](../reference/wkv7.py): `wkv7` (notebook 04) · [`models/rwkv7.py`](../models/rwkv7.py):
# `Rwkv7Config`, `Rwkv7` (torch, BlinkDL's parameter names; the op from [`kernels/wkv7.py`](../kernels/wkv7.py) with
# backend `"torch"` or `"triton"`; `generate`) · [`kernels/testing.py`](../kernels/testing.py): `check` and the error
# budgets.

# %%
import seqmix

MODE = seqmix.use_interpreter_without_gpu()    # without a GPU: TRITON_INTERPRET=1, before triton is imported

import matplotlib.pyplot as plt
import numpy as np
import torch

from seqmix.models.rwkv7 import Rwkv7, Rwkv7Config
from seqmix.kernels.testing import FP32_BUDGET, REFERENCE_BUDGET, check, rel_rms
from seqmix.reference import rwkv7 as ref
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
# (gate). The reference takes the arrays; the torch model loads them in fp32.

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
    fan_in = shape[1] if name.endswith(".weight") else shape[0]       # Linear (out, in); LoRA (in, out)
    return rng.standard_normal(shape) / np.sqrt(fan_in)

params = {name: draw(name, shape) for name, shape in ref.checkpoint_shapes(V, C, H, L, F, **LORA).items()}
model = Rwkv7(Rwkv7Config(vocab_size=V, n_embd=C, n_layer=L, head_size=N, dim_ffn=F, decay_lora=LORA["D_w"],
                          a_lora=LORA["D_a"], v_lora=LORA["D_v"], gate_lora=LORA["D_g"]))
model.load_state_dict({name: torch.tensor(a, dtype=torch.float32) for name, a in params.items()})
att1 = {name[len("blocks.1.att."):]: a for name, a in params.items() if name.startswith("blocks.1.att.")}
for name, a in att1.items():
    print(f"blocks.1.att.{name:18s} {a.shape}")

# %% [markdown]
# ## 1. Token shift, six times
#
# RWKV-7 writes the token shift as a difference: $\Delta_t = x_{t-1} - x_t$ (`xx = time_shift(x) - x`), and mixes
# $x_t + \Delta_t \odot \mu = (1 - \mu) \odot x_t + \mu \odot x_{t-1}$. It is RWKV-4's interpolation with the roles of
# $\mu$ and $1 - \mu$ swapped: here $\mu = 0$ sees only the current token. There are six mixes, one per vector made
# from the input: $x^r, x^w, x^k, x^v, x^a, x^g$ for the receptance, decay, key, value, learning rate and gate
# (checkpoint names `x_r` ... `x_g`). As in RWKV-4, the input before the first token comes from the state (zero at the
# start).
#
# ## 2. Receptance, decay, key, value
#
# $$r = W_r x^r, \qquad k = W_k x^k, \qquad v = W_v x^v, \qquad
# \omega = -\mathrm{softplus}\!\left(-\left(w_0 + \tanh(x^w W_1)\, W_2\right)\right) - 0.5, \qquad
# \log w = -e^{\omega} .$$
#
# The decay comes from a low-rank (LoRA) map of $x^w$, offset per channel by $w_0$. $-\mathrm{softplus}(-z)$ is a soft
# $\min(z, 0)$, so $\omega < -0.5$ always, and the decay that multiplies the state, $e^{\log w} = e^{-e^{\omega}}$,
# always lies in $(e^{-e^{-0.5}}, 1) = (0.545, 1)$: a channel can forget fast, but never wipes the state in one step.
#
# **Erratum 18.** The post says $w_t$ is negative because it is produced by `exp(-exp(...))`. The decay
# $e^{-e^{\omega}}$ is positive, in $(0, 1)$; what is negative is $\omega$ (below $-0.5$) and the log decay $-e^{\omega}$
# that the design passes to the op as `log_w`. The plot shows the three quantities against the LoRA's output $z$.

# %%
z = np.linspace(-8, 6, 400)
omega = -np.logaddexp(0.0, -z) - 0.5                                   # -softplus(-z) - 0.5
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
axes[0].plot(z, omega, label=r"$\omega = -\mathrm{softplus}(-z) - 0.5$")
axes[0].plot(z, -np.exp(omega), label=r"log decay $-e^{\omega}$ (the op's log_w)")
axes[0].axhline(-0.5, color="grey", lw=0.8, ls="--")
axes[0].set_xlabel(r"$z = w_0 + \tanh(x^w W_1) W_2$")
axes[0].set_ylabel("value")
axes[0].set_title(r"$\omega$ and the log decay: both negative")
axes[0].legend(fontsize=8)
axes[1].plot(z, np.exp(-np.exp(omega)), color="C2", label=r"decay $e^{-e^{\omega}}$")
axes[1].axhline(np.exp(-np.exp(-0.5)), color="grey", lw=0.8, ls="--", label=r"$e^{-e^{-0.5}} = 0.545$")
axes[1].axhline(1.0, color="grey", lw=0.8)
axes[1].set_xlabel(r"$z = w_0 + \tanh(x^w W_1) W_2$")
axes[1].set_ylabel("factor multiplying the state")
axes[1].set_title("the decay: in (0.545, 1)")
axes[1].legend(fontsize=8)
plt.show()

# %% [markdown]
# ## 3. v_first: the value residual
#
# Layer 0 keeps its values as `v_first`. Every later layer moves its own value towards layer 0's, per channel, by a
# gate made from its input:
#
# $$v \leftarrow v + \left(v_{\text{first}} - v\right) \odot \sigma\!\left(v_0 + x^v V_1 V_2\right) .$$
#
# The gate interpolates between the layer's own value (gate 0) and layer 0's value of the same token (gate 1).
#
# **Erratum 17.** The post says `v_first` is the value of the *first token* of the first layer, and likens it to an
# initial state or a `[CLS]` token that keeps "initial information" of the sequence. It is the value of the first
# *layer*, at every token: a $(B, T, C)$ tensor, and position $t$ of a later layer mixes with position $t$ of layer 0.
# Information moves along the sequence only through the token shift and the state. Below, the token at position 0 is
# changed: `v_first` changes at positions 0 and 1 (position 1 sees position 0 through the token shift) and nowhere
# else. Under the post's reading every position would change.

# %%
B, T = 2, 8
ids = rng.integers(0, V, (B, T))
ln = lambda z_, name: ref.layer_norm(z_, params[f"{name}.weight"], params[f"{name}.bias"])   # noqa: E731
att0 = {name[len("blocks.0.att."):]: a for name, a in params.items() if name.startswith("blocks.0.att.")}

def v_first_of(ids):
    x0 = ln(ln(params["emb.weight"][ids], "blocks.0.ln0"), "blocks.0.ln1")   # layer 0's time-mix input
    x_prev = np.zeros((ids.shape[0], C))
    xv = x0 + (np.concatenate([x_prev[:, None], x0[:, :-1]], axis=1) - x0) * att0["x_v"]
    return xv @ att0["value.weight"].T                                  # (B, T, C): layer 0's v

changed = ids.copy()
changed[:, 0] = (ids[:, 0] + 1) % V
v_first, v_first_changed = v_first_of(ids), v_first_of(changed)
S_zero = np.zeros((B, H, N, N))
ref_v_first = ref.time_mix(att0, ln(ln(params["emb.weight"][ids], "blocks.0.ln0"), "blocks.0.ln1"),
                           np.zeros((B, C)), S_zero, None, H)[3]

# %% tags=["nbval-check-output"]
check("v_first (layer 0's value) vs what reference.time_mix returns for layer 0", v_first, ref_v_first,
      REFERENCE_BUDGET)
moved = np.abs(v_first_changed - v_first).max(axis=(0, 2)) > 0         # (T,) which positions changed
print("v_first has shape (B, T, C):", v_first.shape == (B, T, C))
print("positions of v_first that change with token 0:", np.flatnonzero(moved).tolist())

# %%
fig, ax = plt.subplots(figsize=(7.5, 3.2), constrained_layout=True)
image = ax.imshow(np.abs(v_first_changed - v_first)[0].T, aspect="auto", cmap="Greys")
ax.set_xlabel("position t")
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
#
# The op is then called as `RWKV7_OP(r, w, k, v, -kk, kk * a)`: $a = -\hat\kappa$, $b = \hat\kappa \odot \alpha$
# (erratum 19: the post's formula says $a = -k$, $b = k\eta$; the code it shows passes the normalized key and the
# learning rate, as here):
#
# $$S_t = S_{t-1}\,\mathrm{diag}(w_t) - \left(S_{t-1}\hat\kappa_t\right)\left(\hat\kappa_t \odot \alpha_t\right)^\top
# + v_t \tilde k_t^\top, \qquad y_t = S_t r_t .$$
#
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
# token. The whole time mix, written out, against `reference.rwkv7.time_mix` on layer 1 (which has a value residual),
# from a non-zero state:

# %%
def sigmoid(z_):
    return 1 / (1 + np.exp(-z_))

def time_mix(p, x, x_prev, S, v_first):
    heads = lambda z_: z_.reshape(B, -1, H, N)                          # noqa: E731  (B, T, C) -> (B, T, H, N)
    xx = np.concatenate([x_prev[:, None], x[:, :-1]], axis=1) - x      # x_{t-1} - x_t
    xr, xw, xk, xv, xa, xg = (x + xx * p[f"x_{c}"] for c in "rwkvag")  # the six mixes
    r = xr @ p["receptance.weight"].T
    omega = -np.logaddexp(0.0, -(p["w0"] + np.tanh(xw @ p["w1"]) @ p["w2"])) - 0.5
    log_w = -np.exp(omega)
    k = xk @ p["key.weight"].T
    v = xv @ p["value.weight"].T
    if v_first is None:                                                 # layer 0 makes v_first
        v_first = v
    else:                                                               # later layers: the value residual
        v = v + (v_first - v) * sigmoid(p["v0"] + xv @ p["v1"] @ p["v2"])
    alpha = sigmoid(p["a0"] + xa @ p["a1"] @ p["a2"])                  # in-context learning rate
    g = sigmoid(xg @ p["g1"]) @ p["g2"]                                 # output gate
    kk = heads(k * p["k_k"])
    kk = kk / np.linalg.norm(kk, axis=-1, keepdims=True)                # unit length per head
    k_written = k * (1 + (alpha - 1) * p["k_a"])
    y, S = wkv7_reference(heads(r), heads(log_w), heads(k_written), heads(v), -kk, kk * heads(alpha), S)
    y = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 64e-5)   # GroupNorm per head
    y = y.reshape(x.shape) * p["ln_x.weight"] + p["ln_x.bias"]
    bonus = (heads(r) * heads(k_written) * p["r_k"]).sum(-1, keepdims=True) * heads(v)
    return (y + bonus.reshape(x.shape)) * g @ p["output.weight"].T, x[:, -1], S, v_first

x1 = rng.standard_normal((B, T, C))                                    # a layer-normed input to layer 1
x_prev1 = rng.standard_normal((B, C))
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

# %%
ffn1 = {name[len("blocks.1.ffn."):]: a for name, a in params.items() if name.startswith("blocks.1.ffn.")}

def channel_mix(p, x, x_prev):
    xk = x + (np.concatenate([x_prev[:, None], x[:, :-1]], axis=1) - x) * p["x_k"]
    return np.maximum(xk @ p["key.weight"].T, 0.0) ** 2 @ p["value.weight"].T, x[:, -1]


# %% tags=["nbval-check-output"]
for what, actual, expected in zip(("channel mix vs reference.channel_mix", "its new token-shift state"),
                                  channel_mix(ffn1, x1, x_prev1), ref.channel_mix(ffn1, x1, x_prev1)):
    check(what, actual, expected, REFERENCE_BUDGET)


# %% [markdown]
# ## 7. The model
#
# $$x = \mathrm{LN}_0\left(E[\text{ids}]\right); \quad \text{per layer: } x \leftarrow x + \mathrm{TimeMix}(\mathrm{LN}_1(x)),
# \ \ x \leftarrow x + \mathrm{ChannelMix}(\mathrm{LN}_2(x)); \quad \text{logits} = \mathrm{LN}_{\text{out}}(x)\,
# W_{\text{head}}^\top .$$
#
# Layer 0 makes `v_first` (it has no value residual of its own) and hands it to every later layer. The state is, per
# layer, `(att_x_prev (B, C), att_kv (B, H, N, N), ffn_x_prev (B, C))`: the two token-shift inputs and the WKV matrix.
# `v_first` is not part of it: it belongs to each token, and is recomputed from the token by layer 0.

# %%
def forward(params, ids, state=None):
    state = state or ref.zero_state(ids.shape[0], C, H, L)
    x = ln(params["emb.weight"][ids], "blocks.0.ln0")
    v_first, new_state = None, []
    for i, (att_x_prev, S, ffn_x_prev) in enumerate(state):
        att = {name[len(f"blocks.{i}.att."):]: a for name, a in params.items() if name.startswith(f"blocks.{i}.att.")}
        ffn = {name[len(f"blocks.{i}.ffn."):]: a for name, a in params.items() if name.startswith(f"blocks.{i}.ffn.")}
        dx, att_x_prev, S, v_first = time_mix(att, ln(x, f"blocks.{i}.ln1"), att_x_prev, S, v_first)
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
#   (as a chunked computation on fast kernels). Good for reading a prompt (prefill).
# - **RNN mode**: one token at a time; each layer reads its state and returns the new one. Good for generating, where
#   tokens come one by one.
#
# Both compute the same function: everything that links a token to earlier ones (the two token shifts, the WKV state)
# is in the state, and `v_first` belongs to the token. The post adds that GPT mode needs no state and has to recompute
# every token when generating. It need not: the same forward returns the state after the last token, so a prompt read
# in GPT mode can be continued in RNN mode (the combination of BlinkDL's `rwkv_v7_demo_fast.py`). All three, against
# each other:

# %%
gpt_logits, gpt_state = ref.forward(params, ids)                      # GPT mode
rnn_logits, rnn_state = ref.forward_rnn(params, ids)                  # RNN mode
prefill_logits, prefill_state = ref.forward(params, ids[:, :5])        # GPT mode for a 5-token prompt ...
mixed_logits, mixed_state = ref.forward_rnn(params, ids[:, 5:], prefill_state)   # ... then RNN mode

# %% tags=["nbval-check-output"]
check("RNN mode vs GPT mode: logits", rnn_logits, gpt_logits, REFERENCE_BUDGET)
check("prompt in GPT mode, then RNN mode vs GPT mode: logits",
      np.concatenate([prefill_logits, mixed_logits], axis=1), gpt_logits, REFERENCE_BUDGET)
for mode, final_state in (("RNN mode", rnn_state), ("GPT then RNN", mixed_state)):
    for i, (layer, gpt_layer) in enumerate(zip(final_state, gpt_state)):
        check(f"{mode}: final state of layer {i} vs GPT mode", np.concatenate([s.ravel() for s in layer]),
              np.concatenate([s.ravel() for s in gpt_layer]), REFERENCE_BUDGET)

# %% [markdown]
# What a reader should see: the state is all the past a layer keeps, and it stays bounded. Below, the size of each
# layer's WKV state $\lVert S_t \rVert$ (over both heads) while the model reads 200 random tokens in RNN mode: it
# grows while the memory fills, then wanders at the size of a few dozen writes. No transition has an eigenvalue
# outside $(-1, 1)$ (notebook 04); the removal takes out what the state returns for each new key, and the decays, in $(0.545, 1)$, fade the rest
# (slowly in the channels whose decay is near 1, which keep it growing a little).

# %%
long_ids = rng.integers(0, V, (1, 200))
step_state, norms = None, []
for t in range(long_ids.shape[1]):
    _, step_state = ref.forward(params, long_ids[:, t:t + 1], step_state)   # one token: RNN mode
    norms.append([np.linalg.norm(layer[1]) for layer in step_state])
fig, ax = plt.subplots(figsize=(7.5, 3.6), constrained_layout=True)
for i, layer_norms in enumerate(np.array(norms).T):
    ax.plot(np.arange(1, 201), layer_norms, label=f"layer {i}")
ax.set_xlabel("tokens read")
ax.set_ylabel(r"$\Vert S_t \Vert$ (att_kv)")
ax.set_title("the WKV state of each layer while reading, RNN mode")
ax.legend()
plt.show()

# %% [markdown]
# ## 9. The torch model and the Triton kernel against the reference
#
# [`Rwkv7`](../models/rwkv7.py) holds the same weights (fp32) under BlinkDL's names:
# `model(input_ids, state=None, backend=None)` returns `(logits, state)`, the state a list of per-layer tuples as above
# (the WKV state in fp32). `backend` chooses how the op runs: the chunked torch path or the Triton kernel (under the
# interpreter here). Both run on the same ids, after a 3-token prefix that leaves a non-zero state, in GPT mode and in
# RNN mode, and greedy generation (which reads the prompt once, then one token at a time through the state) must
# pick the tokens that the float64 reference picks when it re-reads the whole text at every step.

# %%
BACKENDS = ("torch", "triton")
prefix = rng.integers(0, V, (B, 3))
ref_after, ref_state_after = ref.forward(params, ids, ref.forward(params, prefix)[1])

def flat(state):
    # A state as one vector (for one agreement number over all its parts).
    return np.concatenate([np.asarray(s, dtype=np.float64).ravel() for layer in state for s in layer])

runs = {}
with torch.no_grad():
    for backend in BACKENDS:
        _, prefix_state = model(torch.as_tensor(prefix), backend=backend)
        gpt = model(torch.as_tensor(ids), prefix_state, backend=backend)
        rnn_state, rnn_steps = prefix_state, []
        for t in range(T):
            step_logits, rnn_state = model(torch.as_tensor(ids[:, t:t + 1]), rnn_state, backend=backend)
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
    print(f"{backend:6s} fp32: GPT-mode logits rel. RMS error {rel_rms(gpt_logits_t, ref_after):.1e}, "
          f"state {rel_rms(flat(gpt_state_t), flat(ref_state_after)):.1e}, "
          f"RNN-mode logits {rel_rms(rnn_logits_t, ref_after):.1e}")

# %% [markdown]
# ## Summary
#
# - RWKV-7's time mix makes six token-shifted mixes, and from them $r$, a decay soft-clamped into $(0.545, 1)$ (the
#   log decay is the negative one, erratum 18), $k$, $v$, the learning rate $\alpha$, the gate $g$, the unit removal
#   key $\hat\kappa$ and the written key $\tilde k$; calls the op with $a = -\hat\kappa$, $b = \hat\kappa \odot
#   \alpha$ (not the post's $a = -k$, $b = k\eta$: erratum 19); normalizes per head, adds the bonus
#   $(\sum r \tilde k r_k)\, v$, and gates with $g$. Written out, it agrees with `reference/rwkv7.py`.
# - `v_first` is layer 0's value at every token, $(B, T, C)$, not the first token's (erratum 17): changing token 0
#   changes it at positions 0 and 1 only.
# - GPT mode, RNN mode, and a GPT-mode prompt continued in RNN mode give the same logits and states; GPT mode
#   returns a state too.
# - The torch model, with the op on its torch path or on the Triton kernel, matches the reference in fp32 in both
#   modes, and generation through the state picks the tokens of re-reading.
#
# Next: notebook 06 turns to state space models and Mamba's selective scan.
