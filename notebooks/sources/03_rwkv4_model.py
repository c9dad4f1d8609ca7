# %% [markdown]
# # 03 · The RWKV-4 model: token shift, time mix, channel mix, blocks, state and generation
#
# Notebook 02 built the WKV operator. This one builds the language model around it, in the order of the RWKV-4 part
# of the RWKV/Mamba study notes. First, why a recurrent model at all (the notes' motivation, with one measurement of
# attention's cost); then token shift, the time-mix sub-block (receptance, key, value, WKV, output gate), the
# channel-mix sub-block (squared ReLU, gate), a residual block (drawn), and the whole model with embeddings, final
# LayerNorm and head. Each piece is written out in NumPy, then checked against `reference/rwkv4.py`.
#
# Then the Hugging Face page's example (a sequence fed whole or in pieces with the state), the independent evidence
# (transformers' own `RwkvForCausalLM` on the same weights), generation through the state, and the project's own
# trained RWKV-4: how little its decays moved from where training started, and a line of text it writes. Section 10,
# optional on a first reading, goes through the page's configuration field by field (errata 4 to 8).
# Exercises close the notebook; an appendix runs the production path (the torch model with the WKV on its torch path
# and on the Triton kernel) against the float64 reference: hidden states, logits, states, pieces and gradients.
#
# **Sources.** The Hugging Face RWKV page, https://huggingface.co/docs/transformers/model_doc/rwkv (the model's
# weight names, configuration and state layout, the usage example with `state=`, the `RwkvStoppingCriteria` for
# `"\n\n"`); the RWKV-4 part of the RWKV/Mamba study notes in the source material (token shift, time mixing, channel
# mixing: the order followed here); the RWKV paper, arXiv:2305.13048, https://arxiv.org/abs/2305.13048. Errata 3 to 8
# of [`reference/ERRATA.md`](../reference/ERRATA.md) are shown below.
#
# **Code used.** [`reference/rwkv4.py`](../reference/rwkv4.py): `token_shift`, `mix`, `time_mix`, `channel_mix`,
# `block`, `forward`, `logits` (NumPy, float64: the truth) · [`reference/wkv4.py`](../reference/wkv4.py): `wkv4`
# (notebook 02) · [`models/rwkv4/`](../models/rwkv4/__init__.py): `RwkvConfig`, `RwkvModel`,
# `RwkvForCausalLM` (torch, transformers' parameter names; the WKV from [`kernels/wkv4/`](../kernels/wkv4/__init__.py) with
# backend `"torch"` or `"triton"`) · [`models/generation.py`](../models/generation.py): `generate`
# (greedy or sampled, stop sequences) · [`kernels/testing.py`](../kernels/testing.py): `check` and the error budgets.
#
# **Notation.** $x$, $u$, $w$, $k$, $L$ mean other things in other notebooks: see the
# [notation crosswalk](notation.md).

# %%
import seqmix

MODE = seqmix.use_interpreter_without_gpu()    # no GPU: TRITON_INTERPRET=1 before triton

import warnings

import matplotlib.pyplot as plt
import numpy as np
import torch

from seqmix.kernels.testing import FP32_BUDGET, REFERENCE_BUDGET, check, exercise, rel_rms
from seqmix.models.rwkv4 import RwkvConfig, RwkvForCausalLM
from seqmix.reference import rwkv4 as ref
from seqmix.reference.wkv4 import wkv4 as wkv4_reference

rng = np.random.default_rng(0)
torch.manual_seed(0)
print("Triton kernels run on:", MODE)

# %% [markdown]
# ## Why a recurrent model at all
#
# The study notes open their RWKV part with the two models it sits between. A recurrent network (RNN) carries a
# fixed-size state from token to token: cheap per token, but that state is a small memory for a long text, its
# gradients pass through one nonlinear step per token and tend to vanish over long distances, and its training
# cannot run the positions in parallel, since each step waits for the previous one. A Transformer sees every earlier
# token directly and trains all positions at once, but it pays for it: every token scores every earlier one, so the
# work grows as $\Theta(n^2)$ in the sequence length $n$ ($\Theta(n)$ per generated token), and the cache carried to
# the next token (every key and value so far) grows as $\Theta(n)$, against the RNN's $O(1)$. The memory need not
# grow as $n^2$: notebook 01's online form, and the project's flash-style Triton kernel, never hold the $n \times n$
# score matrix. Only the naive matrix form does.
#
# RWKV keeps the RNN's fixed state and its recurrence is linear, so an old token reaches the output with the weight
# $e^{(t-1-i)w}$. The signal and its gradient still fade with the distance: linearity does not remove vanishing
# gradients. But they fade at a rate each channel learns, with no $\tanh'$ factor or recurrent-matrix spectrum in
# between, and channels with $w$ near 0 keep them over long spans. A linear recurrence can also be written for all
# positions at once (the WKV's definition in notebook 02, the chunked kernels of notebook 08), so training runs in
# parallel. What stays is the small memory: notebook 09 measures it.
#
# The contrast in numbers, with the project's own float64 references ($d = C = 16$, one sequence): what each carries
# to the next token, and the peak memory NumPy allocates (measured with `tracemalloc`) for the naive matrix form of
# causal softmax attention over $n$ tokens against the WKV recurrence of notebook 02 over the same keys and values.

# %%
import tracemalloc

from seqmix.reference.attention import softmax_attention

def peak_bytes(fn):
    # Largest amount of memory allocated while fn() runs (NumPy arrays included).
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak

lengths = np.array([128, 256, 512, 1024, 2048])
rng_memory = np.random.default_rng(1)             # its own draws: the model below keeps those of rng
peaks = {"softmax attention": [], "WKV recurrence": []}    # attention: reference's matrix form (T x T scores)
for n in lengths:
    q_n, k_n, v_n = (rng_memory.standard_normal((1, n, 16)) for _ in range(3))   # made before measuring
    peaks["softmax attention"].append(peak_bytes(lambda: softmax_attention(q_n, k_n, v_n)))
    peaks["WKV recurrence"].append(peak_bytes(lambda: wkv4_reference(-np.ones(16), np.zeros(16), k_n, v_n)))
slopes = {name: np.polyfit(np.log(lengths), np.log(p), 1)[0] for name, p in peaks.items()}

fig, ax = plt.subplots(figsize=(7, 3.5), constrained_layout=True)
for name, p in peaks.items():
    ax.loglog(lengths, np.array(p) / 2**20, "o-", label=f"{name} (slope {slopes[name]:.2f})")
ax.set_xticks(lengths, [str(n) for n in lengths], minor=False)
ax.minorticks_off()
ax.set_xlabel("sequence length n")
ax.set_ylabel("peak memory (MiB)")
ax.set_title("peak memory: attention's naive matrix form against the WKV recurrence, d = 16")
ax.legend()
plt.show()

# %% tags=["nbval-check-output"]
print(f"carried to the next token at n = 2048: attention {2 * 2048 * 16} numbers (every key and value), "
      f"the WKV {3 * 16} (num, den, max)")
print("the naive matrix form's memory grows as n^2 (log-log slope within 0.2 of 2):",
      bool(abs(slopes["softmax attention"] - 2) < 0.2))
print("the recurrence's grows as n (its outputs; slope within 0.2 of 1):",
      bool(abs(slopes["WKV recurrence"] - 1) < 0.2))

# %% [markdown]
# ## 0. A tiny model with random weights
#
# No checkpoint is downloaded: the weights are drawn here, at scales where every part of the model matters (decays
# $e^{-e^{\tau}}$ with $\tau \sim N(0, 1)$, mixes $\mu \in (0, 1)$, linear layers of unit gain). The sizes are small
# and different from each other, so that a transposed matrix cannot go unnoticed: $C = 16$ channels, a channel-mix
# width $F = 40$, $L = 3$ blocks, and a vocabulary of $V = 200$ tokens, large enough to hold the ids 187 of the
# page's stop sequence (section 8). The weights are one dict of float64 arrays named like the state dict of
# transformers' `RwkvForCausalLM`; the reference takes the `rwkv.` part (the names of `RwkvModel`) and the head, the
# torch model loads all of it (in fp32).

# %%
config = RwkvConfig(vocab_size=200, hidden_size=16, num_hidden_layers=3, intermediate_size=40,
                    context_length=64)
C, F = config.hidden_size, config.intermediate_size
L, V = config.num_hidden_layers, config.vocab_size

def draw(name, shape):
    # One weight of the model, by the kind its name says.
    kind = name.split(".")[-2] if name.endswith((".weight", ".bias")) else name.split(".")[-1]
    if kind in ("pre_ln", "ln1", "ln2", "ln_out"):
        return (1.0 if name.endswith("weight") else 0.0) + 0.2 * rng.standard_normal(shape)
    if kind.startswith("time_mix"):
        return rng.uniform(0.0, 1.0, shape)
    if kind in ("time_decay", "time_first", "embeddings"):
        return rng.standard_normal(shape)
    return rng.standard_normal(shape) / np.sqrt(shape[1])          # a Linear (out, in): unit gain

# %%
def drawn_weights(config_):
    # Every weight of an RwkvForCausalLM for config_, drawn (float64, transformers' names).
    shapes = {name: tuple(t.shape) for name, t in RwkvForCausalLM(config_).state_dict().items()}
    return {name: draw(name, shape) for name, shape in shapes.items()}

def model_with(config_, weights_):
    # An RwkvForCausalLM for config_, in eval mode, holding weights_ in fp32.
    m = RwkvForCausalLM(config_).eval()
    m.load_checkpoint({name: torch.tensor(a, dtype=torch.float32) for name, a in weights_.items()})
    return m

def base_params(weights_):
    # The reference's params: the "rwkv." part of the weights, named as in RwkvModel.
    return {name[len("rwkv."):]: a for name, a in weights_.items() if name.startswith("rwkv.")}

def layer_params(params_, i):
    # Block i's weights, named as inside the block ("ln1.weight", "attention.key.weight", ...).
    prefix = f"blocks.{i}."
    return {name[len(prefix):]: a for name, a in params_.items() if name.startswith(prefix)}

weights = drawn_weights(config)
model = model_with(config, weights)
params, head = base_params(weights), weights["head.weight"]           # head: (V, C)
p0 = layer_params(params, 0)
for name, a in p0.items():
    print(f"blocks.0.{name:38s} {a.shape}")

# %% [markdown]
# ## 1. Token shift
#
# Every sub-block starts by looking one token back. Per channel, it mixes the current input $x_t$ with the previous
# one, $x_{t-1}$, with a learned weight $\mu \in [0, 1]$ (one per channel and per use):
#
# $$\mathrm{mix}_\mu(x)_t = \mu \odot x_t + (1 - \mu) \odot x_{t-1} .$$
#
# $\mu = 1$ sees only the current token, $\mu = 0$ only the previous one. Before the first token of a sequence,
# $x_{t-1}$ is the last input of the previous call: zero at the start, and part of the model's state when a sequence
# is fed in pieces. Shifting by one is the whole of it: a "convolution" of width two, cheap, and it gives every
# channel a glimpse of the previous token before any recurrence runs.

# %%
B, T = 2, 9
x = rng.standard_normal((B, T, C))
x_prev = rng.standard_normal((B, C))                      # the input before x_0, from a state
mu = rng.uniform(0.0, 1.0, C)                                          # (C,)

shifted = np.concatenate([x_prev[:, None], x[:, :-1]], axis=1)        # (B, T, C) x_{t-1}
mixed = mu * x + (1 - mu) * shifted

# %% tags=["nbval-check-output"]
for what, actual, expected in (
    ("token shift vs reference.token_shift", shifted, ref.token_shift(x, x_prev)),
    ("mix vs reference.mix", mixed, ref.mix(x, shifted, mu.reshape(1, 1, C))),
):
    check(what, actual, expected, REFERENCE_BUDGET)

# %% [markdown]
# What a reader should see: a step in one channel's input becomes a step of two stairs, of heights $\mu$ and 1, so
# that a channel with a small $\mu$ lags one token behind.

# %%
t = np.arange(12)
step = (t >= 5).astype(float)                             # one channel: 0, then 1 from t = 5 on
step_prev = np.concatenate([[0.0], step[:-1]])
fig, ax = plt.subplots(figsize=(7, 3.5), constrained_layout=True)
for m in (1.0, 0.75, 0.25, 0.0):
    ax.step(t, m * step + (1 - m) * step_prev, where="mid", label=rf"$\mu$ = {m:g}")
ax.set_xlabel("position t")
ax.set_ylabel(r"$\mu x_t + (1 - \mu) x_{t-1}$")
ax.set_title("token shift: a step in the input, mixed with its previous value")
ax.legend()
plt.show()


# %% [markdown]
# One helper for the rest of the notebook, the formula above on stored $\mu$'s:

# %%
def mixed(p, x, xx, name):
    # mu * x_t + (1 - mu) * x_{t-1} with the mu stored as p[name] (shape (1, 1, C)).
    mu = p[name].reshape(-1)                                           # (C,)
    return mu * x + (1 - mu) * xx


# %% [markdown]
# ## 2. Time mix
#
# The time-mix sub-block makes three vectors from three differently mixed copies of the input, each with its own
# matrix:
#
# $$r_t = W_r\,\mathrm{mix}_{\mu_r}(x)_t, \qquad k_t = W_k\,\mathrm{mix}_{\mu_k}(x)_t, \qquad
# v_t = W_v\,\mathrm{mix}_{\mu_v}(x)_t .$$

# %%
def receptance_key_value(p, x, x_prev, key="attention.key.weight", value="attention.value.weight"):
    # r, k, v, each (B, T, C); key and value name the matrices that make k and v (erratum 3 below).
    xx = np.concatenate([x_prev[:, None], x[:, :-1]], axis=1)          # (B, T, C) x_{t-1}
    r = mixed(p, x, xx, "attention.time_mix_receptance") @ p["attention.receptance.weight"].T
    k = mixed(p, x, xx, "attention.time_mix_key") @ p[key].T
    v = mixed(p, x, xx, "attention.time_mix_value") @ p[value].T
    return r, k, v


# %% [markdown]
# Keys and values go through the WKV of notebook 02, with the per-step log decay $w = -e^{\tau}$ ($\tau$ =
# `time_decay`) and the bonus $u$ (`time_first`). Its state $(\tilde N, \tilde D, M)$ comes in and goes out:
#
# $$\mathrm{wkv}_t = \frac{\sum_{i<t} e^{(t-1-i)w + k_i} v_i + e^{u + k_t} v_t}{\sum_{i<t} e^{(t-1-i)w + k_i}
# + e^{u + k_t}} .$$

# %%
def wkv(p, k, v, wkv_state):
    # (wkv (B, T, C), new state (num, den, max)) from keys, values and the state before them.
    w = -np.exp(p["attention.time_decay"])                     # (C,) per-step log decay, < 0
    return wkv4_reference(w, p["attention.time_first"], k, v, wkv_state)   # notebook 02


# %% [markdown]
# $\mathrm{wkv}_t$ is an average of past values, so it cannot say *whether* the past is relevant to this token; the
# receptance gate $\sigma(r_t) \in (0, 1)$ does, per channel. Then the output matrix:
#
# $$o_t = W_o\left(\sigma(r_t) \odot \mathrm{wkv}_t\right) .$$

# %%
def gate_and_output(p, r, wkv_t):
    # W_o (sigma(r) * wkv), (B, T, C).
    return (1 / (1 + np.exp(-r)) * wkv_t) @ p["attention.output.weight"].T


def time_mix(p, x, x_prev, wkv_state, **matrices):
    # The sub-block: (output, its last input for the next token shift, the new WKV state).
    r, k, v = receptance_key_value(p, x, x_prev, **matrices)
    wkv_t, wkv_state = wkv(p, k, v, wkv_state)
    return gate_and_output(p, r, wkv_t), x[:, -1], wkv_state


num0, den0 = rng.standard_normal((B, C)), rng.uniform(0.5, 2.0, (B, C))
wkv_state0 = (num0, den0, rng.standard_normal((B, C)))                # a state (num, den, max)
out, new_x_prev, new_wkv_state = time_mix(p0, x, x_prev, wkv_state0)
ref_out, ref_x_prev, ref_wkv_state = ref.time_mix(p0, x, x_prev, wkv_state0)

# %% tags=["nbval-check-output"]
check("time mix vs reference.time_mix", out, ref_out, REFERENCE_BUDGET)
check("its new token-shift state (the last input)", new_x_prev, ref_x_prev, REFERENCE_BUDGET)
for name, got, want in zip(("num", "den", "max"), new_wkv_state, ref_wkv_state):
    check(f"its new WKV state {name}", got, want, REFERENCE_BUDGET)

# %% [markdown]
# **Erratum 3.** The study notes write $k_t = W_r(\mu_k \odot x_t + (1 - \mu_k) \odot x_{t-1})$ and
# $v_t = W_r(\ldots)$: the receptance matrix in all three lines, a copy-paste slip. Each of $r, k, v$ has its own
# matrix: the checkpoints store `receptance`, `key` and `value` weights, and the RWKV paper's time-mixing equations
# write $W_r, W_k, W_v$. Run as written, the notes' lines give another output, one that no longer reads the key and
# value matrices at all:

# %%
W_r = "attention.receptance.weight"
notes = dict(key=W_r, value=W_r)                                      # W_r, three times
notes_out = time_mix(p0, x, x_prev, wkv_state0, **notes)[0]
other_kv = dict(p0, **{"attention.key.weight": rng.standard_normal((C, C)),
                       "attention.value.weight": rng.standard_normal((C, C))})
print("the notes' time mix against the reference's: rel. RMS difference",
      f"{rel_rms(notes_out, ref_out):.2f}")
print("with the notes' lines, other key and value matrices change nothing:",
      np.array_equal(notes_out, time_mix(other_kv, x, x_prev, wkv_state0, **notes)[0]))


# %% [markdown]
# ## 3. Channel mix
#
# The second sub-block mixes channels within a token (a feed-forward layer), again after a token shift with its own
# $\mu$'s. The key is widened to $F$ channels, passed through a squared ReLU, and projected back; a receptance gates
# the result:
#
# $$r'_t = W'_r\,\mathrm{mix}_{\mu'_r}(x)_t, \qquad k'_t = W'_k\,\mathrm{mix}_{\mu'_k}(x)_t \in \mathbb{R}^F, \qquad
# o'_t = \sigma(r'_t) \odot W'_v \max(k'_t, 0)^2 .$$
#
# It carries one thing across calls: its last input, for the next token shift.

# %%
def channel_mix(p, x, x_prev):
    xx = np.concatenate([x_prev[:, None], x[:, :-1]], axis=1)          # (B, T, C) x_{t-1}
    r = mixed(p, x, xx, "feed_forward.time_mix_receptance") @ p["feed_forward.receptance.weight"].T
    k = mixed(p, x, xx, "feed_forward.time_mix_key") @ p["feed_forward.key.weight"].T   # (B, T, F)
    squared = np.maximum(k, 0.0) ** 2 @ p["feed_forward.value.weight"].T             # (B, T, C)
    return 1 / (1 + np.exp(-r)) * squared, x[:, -1]


# %% tags=["nbval-check-output"]
names = ("channel mix vs reference.channel_mix", "its new token-shift state")
ours, reference = channel_mix(p0, x, x_prev), ref.channel_mix(p0, x, x_prev)
for what, actual, expected in zip(names, ours, reference):
    check(what, actual, expected, REFERENCE_BUDGET)


# %% [markdown]
# ## 4. A block
#
# A block wraps both sub-blocks in pre-norm residual connections. Block 0 first normalizes the embeddings
# (`pre_ln`):
#
# $$x \leftarrow \mathrm{LN}_0(x) \ \ (\text{block 0 only}), \qquad
# x \leftarrow x + \mathrm{TimeMix}(\mathrm{LN}_1(x)), \qquad x \leftarrow x + \mathrm{ChannelMix}(\mathrm{LN}_2(x)),$$
#
# with $\mathrm{LN}(x) = \dfrac{x - \bar x}{\sqrt{\mathrm{var}(x) + \epsilon}} \odot \gamma + \beta$ over the channels.
# Note where the token shifts look: at the *normalized* input of each sub-block, so the state keeps
# $\mathrm{LN}_1(x)$ and $\mathrm{LN}_2(x)$ of the last token. A block's state is five vectors per sequence: the
# channel mix's last input, the time mix's last input, and the WKV's $(\tilde N, \tilde D, M)$, in the order
# transformers uses.
#
# The block as a diagram, drawn like notebook 06's Mamba block. The residual stream runs along the top; each
# sub-block reads a LayerNorm of it and adds its output back at `+`. Under each token shift, in brackets, the state
# entry that holds the previous token's normalized input; the WKV reads and returns the state $(\tilde N, \tilde D, M)$
# (`num, den, max`). Green boxes carry state from token to token; `*` is the elementwise product.
#
# ![The RWKV-4 block: LN1, token shift, three mixes and matrices into r, k, v; WKV and the gate sigma(r), W_o, added
# to the stream; then LN2, token shift, the channel mix's gate and squared ReLU, added again](images/rwkv4_block.png)
#
# RWKV-4 has no normalization inside the time mix: $\mathrm{wkv}_t$ is already an average of values, and the
# receptance gate $\sigma(r)$ scales it. Notebook 05 draws RWKV-7's block, which adds a per-head GroupNorm there.

# %%
def layer_norm(x, weight, bias, eps=1e-5):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * weight + bias

def block(p, x, layer_state):
    ffn_prev, att_prev, *wkv_state = layer_state
    if "pre_ln.weight" in p:                                           # block 0
        x = layer_norm(x, p["pre_ln.weight"], p["pre_ln.bias"])
    x_ln1 = layer_norm(x, p["ln1.weight"], p["ln1.bias"])
    dx, att_prev, wkv_state = time_mix(p, x_ln1, att_prev, tuple(wkv_state))
    x = x + dx
    dx, ffn_prev = channel_mix(p, layer_norm(x, p["ln2.weight"], p["ln2.bias"]), ffn_prev)
    return x + dx, (ffn_prev, att_prev, *wkv_state)

layer_state0 = (rng.standard_normal((B, C)), x_prev) + wkv_state0
got, got_state = block(p0, x, layer_state0)
want, want_state = ref.block(p0, x, layer_state0)

# %% tags=["nbval-check-output"]
check("block vs reference.block", got, want, REFERENCE_BUDGET)
for name, g, w_ in zip(ref.STATE_NAMES, got_state, want_state):
    check(f"its new state {name}", g, w_, REFERENCE_BUDGET)


# %% [markdown]
# ## 5. The model
#
# Embedding lookup, the $L$ blocks, a final LayerNorm, and (for a language model) a head that maps the last hidden
# state to one logit per token of the vocabulary:
#
# $$h = \mathrm{LN}_{\text{out}}\left(\mathrm{Block}_{L-1} \circ \cdots \circ
# \mathrm{Block}_0\left(E[\text{ids}]\right)\right), \qquad \text{logits} = h\, W_{\text{head}}^\top .$$
#
# The model's state stacks the blocks' states: five arrays of shape $(B, C, L)$, entry $[\ldots, i]$ for block $i$,
# in transformers' order `ffn_x_prev, att_x_prev, att_num, att_den, att_max`; before the first token all are zero
# except the WKV maximum, at $-10^{38}$ (notebook 02). At inference transformers also halves the residual stream
# every `rescale_every` = 6 blocks; with 3 blocks that never happens here, and section 10 runs it on 7 blocks.

# %%
def forward(params, ids, state=None):
    if state is None:
        state = ref.initial_state(params, ids.shape[0])
    x = params["embeddings.weight"][ids]                              # (B, T, C)
    new_state = [s.copy() for s in state]
    for i in range(L):
        x, layer_state = block(layer_params(params, i), x, [s[..., i] for s in state])
        for s, layer_s in zip(new_state, layer_state):
            s[..., i] = layer_s
    return layer_norm(x, params["ln_out.weight"], params["ln_out.bias"]), tuple(new_state)

ids = rng.integers(0, V, (B, T))
hidden, state = forward(params, ids)
ref_hidden, ref_state = ref.forward(params, ids)

# %% tags=["nbval-check-output"]
check("model vs reference.forward (hidden states)", hidden, ref_hidden, REFERENCE_BUDGET)
check("logits vs reference.logits", hidden @ head.T, ref.logits(head, ref_hidden), REFERENCE_BUDGET)
for name, g, w_ in zip(ref.STATE_NAMES, state, ref_state):
    check(f"state {name} {g.shape}", g, w_, REFERENCE_BUDGET)


# %% [markdown]
# ## 6. Whole or in pieces: the page's example
#
# The page's usage example feeds "This is an example." to the model whole, then feeds its first two tokens, and the
# rest with the state the first call returned, and finds the same hidden states. Everything a token needs from
# earlier tokens is in the state: per block, the two last inputs (token shift) and the WKV's
# $(\tilde N, \tilde D, M)$. So a sequence can be fed in any pieces, down to one token at a time (an RNN), and the
# result is that of the whole. Without the state, the second piece starts from nothing and its outputs differ.

# %%
def in_pieces(params, ids, sizes, carry_state=True):
    # Feed ids in pieces of these sizes; carry the state from piece to piece, or start each anew.
    outputs, piece_state, start = [], None, 0
    for n in sizes:
        out, new_state = ref.forward(params, ids[:, start:start + n], piece_state)
        outputs.append(out)
        piece_state, start = (new_state if carry_state else None), start + n
    return np.concatenate(outputs, axis=1), new_state

two_pieces, two_pieces_state = in_pieces(params, ids, [2, T - 2])
one_at_a_time, one_at_a_time_state = in_pieces(params, ids, [1] * T)
no_state = in_pieces(params, ids, [2, T - 2], carry_state=False)[0]

# %% tags=["nbval-check-output"]
check("ids[:, :2], then ids[:, 2:] with the state, vs whole", two_pieces, ref_hidden,
      REFERENCE_BUDGET)
check("one token at a time vs whole", one_at_a_time, ref_hidden, REFERENCE_BUDGET)
for name, g, w_ in zip(ref.STATE_NAMES, one_at_a_time_state, ref_state):
    check(f"final state {name}, one token at a time vs whole", g, w_, REFERENCE_BUDGET)
print("the second piece without the state differs from the whole:",
      rel_rms(no_state[:, 2:], ref_hidden[:, 2:]) > 0.01)


# %% [markdown]
# With the state, the pieces give the whole's hidden states at every position; here the error is exactly zero, since
# the same float64 operations run in the same order. Without the state, the second piece starts wrong, and the error
# fades only as slowly as the model forgets: the channels with slow decays remember the missing first tokens for
# the whole sequence.

# %%
def error_per_position(a, b):
    # (T,) relative error at each position, over batch and channels.
    return np.linalg.norm(a - b, axis=(0, 2)) / np.linalg.norm(b, axis=(0, 2))

long_ids = rng.integers(0, V, (B, 40))
long_whole = ref.forward(params, long_ids)[0]
with_state = in_pieces(params, long_ids, [2, 38])[0]
without_state = in_pieces(params, long_ids, [2, 38], carry_state=False)[0]
print("largest error with the state:", np.abs(with_state - long_whole).max())

fig, ax = plt.subplots(figsize=(8, 3.6), constrained_layout=True)
positions = np.arange(2, 40)
ax.semilogy(positions, error_per_position(without_state, long_whole)[2:], "o-", ms=3)
ax.set_xlabel("position t (the second piece starts at t = 2)")
ax.set_ylabel("relative error vs whole")
ax.set_title("the second piece fed without the state: how slowly the missing past is forgotten")
plt.show()

# %% [markdown]
# ## 7. The independent evidence: transformers' `RwkvForCausalLM`
#
# Sections 1 to 6 check a NumPy model written here against the NumPy reference: the same reading of the sources,
# typed twice. The independent check is the implementation people run. transformers' `RwkvForCausalLM` loads the
# same weights under the same names (the state dict of section 0), and its logits and state match the float64
# reference. The two page errata it embodies show too: its `ln_out` keeps eps 1e-5, and its hidden states hold no
# embeddings entry. transformers is a test dependency of this project
# (`tests/models/test_models_rwkv4.py` makes the same comparison on more configurations). Without it, the cell says so
# and skips.

# %%
ids_t = torch.as_tensor(ids)
sizes = dict(vocab_size=V, hidden_size=C, num_hidden_layers=L, intermediate_size=F)

# %% tags=["nbval-check-output"]
try:
    with warnings.catch_warnings():                  # tqdm (transformers imports it) warns
        warnings.simplefilter("ignore")              # when ipywidgets is missing
        import transformers
except ImportError:
    transformers = None
    print("transformers is not installed (pip install transformers): comparison skipped")
if transformers is not None:
    peer_config = transformers.RwkvConfig(**sizes, layer_norm_epsilon=1e-2)
    peer = transformers.RwkvForCausalLM(peer_config).eval()
    peer.load_state_dict({name: torch.tensor(a, dtype=torch.float32)
                          for name, a in weights.items()})
    with torch.no_grad():
        theirs = peer(ids_t, use_cache=True, output_hidden_states=True)
    eps_hidden, eps_state = ref.forward(params, ids, eps=1e-2)
    check("transformers' logits vs the reference", theirs.logits, ref.logits(head, eps_hidden),
          FP32_BUDGET)
    for name, got, want in zip(ref.STATE_NAMES, theirs.state, eps_state):
        check(f"transformers' state {name}", got, want, FP32_BUDGET)
    print("transformers with layer_norm_epsilon = 0.01: eps of ln_out", peer.rwkv.ln_out.eps,
          f"; {len(theirs.hidden_states)} hidden states for {L} blocks")

# %% [markdown]
# ### The forward's other arguments, and two traps (errata 25 and 26)
#
# The page's `forward` also takes `inputs_embeds`, `attention_mask`, `output_attentions` and `return_dict`. The
# project's torch model takes none of them, so they are shown on transformers' own `RwkvModel` (default
# $\epsilon$), holding the reference's weights (the `rwkv.` part of section 0's dict):
#
# - `inputs_embeds` $(B, T, C)$: vectors in place of ids, skipping the embedding lookup; $E[\text{ids}]$ gives
#   the output of the ids.
# - `return_dict=False`: a plain tuple `(last_hidden_state, state, hidden_states, attentions)`, leaving out the
#   entries not asked for.
# - **`attention_mask` is ignored (erratum 25).** The page: "Mask to avoid performing attention on padding token
#   indices". transformers' `RwkvModel.forward` only logs that it "was passed, but it is unused in this model"
#   (`modeling_rwkv.py`) and runs the recurrence over every position. So a left-padded batch is not masked: the
#   pads enter the state, and the real tokens' outputs differ from those of the same tokens run alone. To batch
#   texts of different lengths, pad on the right and read each row only up to its length (its final state then
#   includes the pads), or run the rows one at a time.
# - **`attentions` are not attention weights (erratum 26).** The page: one tensor per layer of shape
#   (batch, num_heads, T, T), "attentions weights after the attention softmax". RWKV has no attention matrix;
#   transformers returns each block's time-mix output, $(B, T, C)$, before the residual add. Checked for block 0
#   against the time mix of section 2.

# %% tags=["nbval-check-output"]
if transformers is not None:
    hf = transformers.RwkvModel(transformers.RwkvConfig(**sizes)).eval()
    hf.load_state_dict({name: torch.tensor(a, dtype=torch.float32) for name, a in params.items()})
    padded = ids_t.clone()
    padded[1, :3] = 0                                          # row 1: three pads, then the last six tokens
    mask = torch.ones_like(padded)
    mask[1, :3] = 0
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()                # its "unused" notice is erratum 25 itself
    with torch.no_grad():
        by_ids = hf(ids_t)
        by_embeds = hf(inputs_embeds=torch.tensor(params["embeddings.weight"][ids], dtype=torch.float32))
        as_tuple = hf(ids_t, output_hidden_states=True, output_attentions=True, return_dict=False)
        masked, unmasked = hf(padded, attention_mask=mask), hf(padded)
        alone = hf(padded[1:, 3:])                             # the six tokens without the pads
    transformers.logging.set_verbosity(verbosity)
    check("inputs_embeds = E[ids] vs input_ids", by_embeds.last_hidden_state, by_ids.last_hidden_state,
          FP32_BUDGET)
    print("return_dict=False:", type(as_tuple).__name__, "of", [type(e).__name__ for e in as_tuple])
    print("attention_mask changes nothing (bit for bit):",
          torch.equal(masked.last_hidden_state, unmasked.last_hidden_state))
    print("so the padded row's tokens differ from the same tokens alone:",
          rel_rms(masked.last_hidden_state[1:, 3:], alone.last_hidden_state) > 0.01)
    attentions = as_tuple[3]
    print(f"attentions: {len(attentions)} tensors of shape {tuple(attentions[0].shape)} = (B, T, C),",
          "not (B, heads, T, T)")
    empty = ref.initial_state(params, B)                       # block 0 starts from the empty state
    time_mix_in = layer_norm(layer_norm(params["embeddings.weight"][ids], p0["pre_ln.weight"], p0["pre_ln.bias"]),
                             p0["ln1.weight"], p0["ln1.bias"])
    check("attentions[0] vs block 0's time mix (section 2)", attentions[0],
          time_mix(p0, time_mix_in, empty[1][..., 0], tuple(s[..., 0] for s in empty[2:]))[0], FP32_BUDGET)

# %% [markdown]
# ## 8. Generation, and the stop on "\n\n"
#
# `model.generate(input_ids, max_new_tokens, ...)` reads the prompt once, then feeds each new token alone, with the
# state: one token's work per new token, however long the text. Greedy decoding (temperature 0) must pick the same
# tokens as the float64 reference re-reading the whole text at every step (no state at all).
#
# The page stops generation at `"\n\n"` with a `StoppingCriteria` that looks for the ids `[187, 187]` (the GPT-NeoX
# tokenizer writes `"\n"` as 187) among the last two tokens. Here `stop_sequences=[[187, 187]]` does the same. A random
# model has no reason to emit 187 twice, so the cell after the next one makes it do so by construction: token ids are
# only labels, and swapping two rows of the embedding and the head (with the same swap in the prompt) gives the same
# model with two tokens renamed. The model's greedy continuation below repeats one token (66, 66); renamed to 187, that
# pair is the stop.

# %%
BACKENDS = ("torch", "triton")
prompt = np.array([[94, 102, 151, 190, 6]])                # (1, 5), token ids (no tokenizer here)

def greedy_by_rereading(weights_, prompt, n):
    # The reference, without any state: re-read the whole text for every new token.
    tokens = prompt
    for _ in range(n):
        hidden_ = ref.forward(base_params(weights_), tokens)[0]
        last = ref.logits(weights_["head.weight"], hidden_)[:, -1]     # (1, V)
        tokens = np.concatenate([tokens, last.argmax(-1)[:, None]], axis=1)
    return tokens

continuation = greedy_by_rereading(weights, prompt, 24)
print("greedy continuation:", continuation[0, 5:].tolist())

# %% tags=["nbval-check-output"]
for backend in BACKENDS:
    generated, _ = model.generate(torch.as_tensor(prompt), max_new_tokens=24, backend=backend)
    print(f"{backend}: generate through the state picks the reference's tokens:",
          generated.tolist() == continuation.tolist())

# %%
new_tokens = continuation[0, 5:]
doubled = next(tok for a, tok in zip(new_tokens, new_tokens[1:]) if a == tok)   # the first repeat
rename = np.arange(V)
rename[[doubled, 187]] = rename[[187, doubled]]                        # swap the two ids
renamed = dict(weights, **{"rwkv.embeddings.weight": weights["rwkv.embeddings.weight"][rename],
                           "head.weight": weights["head.weight"][rename]})
renamed_model = model_with(config, renamed)
renamed_prompt = torch.as_tensor(rename[prompt])
print(f"token {doubled} is now called 187, and 187 is called {doubled}")
print("renamed prompt:", renamed_prompt[0].tolist())

# %% tags=["nbval-check-output"]
with torch.no_grad():
    renamed_back = renamed_model(renamed_prompt).logits[..., rename]
    same = rel_rms(renamed_back, model(torch.as_tensor(prompt)).logits) < 1e-6
print("the renamed model is the same model (logits agree after renaming back):", bool(same))
free, _ = renamed_model.generate(renamed_prompt, max_new_tokens=24, backend="torch")
stopped, _ = renamed_model.generate(renamed_prompt, max_new_tokens=24, stop_sequences=[[187, 187]],
                                    backend="triton")
print("without a stop sequence:", free[0, 5:].tolist())
print("stop at [187, 187]:     ", stopped[0, 5:].tolist())
print("it stops right after the first 187, 187:", stopped[0, -2:].tolist() == [187, 187] and
      stopped.tolist()[0] == free.tolist()[0][:stopped.shape[1]])

# %% [markdown]
# One difference from the page's criterion shows with a batch. The page's `__call__` returns `eos_sequence in
# last_2_ids`: one answer for the whole batch, so generation ends for every row as soon as *any* row ends in
# `"\n\n"`. [`generation.generate`](../models/generation.py) ends each row on its own: a finished row is padded
# with its last token while the others go on, and generation ends when all rows have finished (or at
# `max_new_tokens`). Below, row 0 stops after its `187, 187` and row 1, whose continuation never has the same token
# twice in a row, runs to the limit.

# %% tags=["nbval-check-output"]
batch = torch.cat([renamed_prompt, torch.as_tensor([[5, 77, 140, 31, 9]])])
rows, _ = renamed_model.generate(batch, max_new_tokens=24, stop_sequences=[[187, 187]],
                                 backend="torch")
for i, row in enumerate(rows[:, 5:].tolist()):
    print(f"row {i}:", row)
n_stopped = stopped.shape[1]
print("row 0 equals the single-row run, then is padded with 187:",
      rows[0, :n_stopped].tolist() == stopped[0].tolist()
      and bool((rows[0, n_stopped:] == 187).all()))

# %% [markdown]
# ## 9. What a trained model learned
#
# Every weight above was drawn at random. The project also trains an RWKV-4 of its own: a byte-level language model
# (vocabulary 256, one token per byte) trained on the Python standard library's `.py` sources by
# `python -m seqmix.experiments.language_model` (its docstring gives the sizes and the protocol; its report,
# `experiments/results/language_model.md`, the losses: 1.740 bits per byte on the test split, against 3.570 for a
# bigram model of the same bytes; 2000 steps of 16 windows of 256 bytes). It ships as transformers writes an `RwkvForCausalLM`: a
# directory with `config.json`, `model.safetensors` (fp16, the decays kept fp32) and a `tokenizer.json` whose ids
# are the byte values. [`RwkvForCausalLM.from_pretrained`](../models/rwkv4/__init__.py) reads it without transformers; the
# tokenizer found beside the weights becomes `model.tokenizer`.
#
# What the WKV of notebook 02 learns is one decay per channel and layer: the past is weighed by $e^{(t-1-i)w}$ with
# $w = -e^{\tau}$, $\tau$ the checkpoint's `time_decay`. A channel's *half-life* is the number of tokens after which
# an old token's weight has halved: $e^{n w} = \tfrac12$ at
#
# $$n_{1/2} = \frac{\ln 2}{e^{\tau}}\ \text{tokens}.$$
#
# Training starts from `RwkvModel.reset_parameters`, which is not random here: $\tau$ spreads evenly from $-5$
# (a half-life of about 100 tokens) to $3$ (a small fraction of a token) across the channels, the same in every
# layer. A model built fresh with the trained model's configuration (seed fixed) shows that start. The loaded model
# is checked first against the float64 reference of this notebook, on the same stored values.
#
# **BlinkDL's start differs by layer.** RWKV-4's own training code (BlinkDL's RWKV-LM, the init transformers'
# `RwkvPreTrainedModel` copies) spreads the same range, $-5$ to $3$, but bends it by depth: channel $h$ of $C$ in
# layer $l$ of $L$ starts at
#
# $$\tau_h = -5 + 8 \left(\frac{h}{C - 1}\right)^{0.7 + 1.3\, l / (L - 1)} .$$
#
# In layer 0 the exponent is 0.7, which lifts the curve: most channels start fast (short memories). In the last
# layer it is 2, which keeps most channels near $-5$: long memories. The project's start is the exponent 1 in every
# layer, the straight line between the two. The plot below draws BlinkDL's first and last layer beside it.

# %%
from pathlib import Path

REPO = Path(seqmix.kernels.__file__).resolve().parents[1]
LM_WEIGHTS = REPO / "experiments" / "results" / "weights" / "language_model"

trained = RwkvForCausalLM.from_pretrained(LM_WEIGHTS / "rwkv4", dtype=torch.float32).eval()
torch.manual_seed(0)
untrained = RwkvForCausalLM(trained.config).eval()         # where training started
tc = trained.config
print(f"trained RWKV-4: C = {tc.hidden_size}, L = {tc.num_hidden_layers}, V = {tc.vocab_size}, "
      f"{sum(p.numel() for p in trained.parameters()):,} parameters; tokenizer: {trained.tokenizer is not None}")

source_line = "def area(width, height):\n    return width * height\n"
source_ids = np.array([trained.tokenizer.encode(source_line)])          # (1, T): the bytes
trained_weights = {name: p.detach().double().numpy() for name, p in trained.state_dict().items()}
trained_ref_hidden = ref.forward(base_params(trained_weights), source_ids, rescale_every=tc.rescale_every,
                                 eps=tc.layer_norm_epsilon)[0]
with torch.no_grad():
    trained_logits = trained(torch.as_tensor(source_ids)).logits

def half_lives(m):
    # (L, C): ln 2 / e^tau, in tokens, per layer and channel.
    return np.stack([np.log(2) / np.exp(b.attention.time_decay.detach().double().numpy())
                     for b in m.rwkv.blocks])

learned_half, initial_half = half_lives(trained), half_lives(untrained)

# %% tags=["nbval-check-output"]
check("trained model (torch, fp32) vs the float64 reference on its stored weights: logits", trained_logits,
      ref.logits(trained_weights["head.weight"], trained_ref_hidden), FP32_BUDGET)
log_decays = np.stack([-np.exp(b.attention.time_decay.detach().double().numpy()) for b in trained.rwkv.blocks])
print("one half-life per layer and channel, (L, C):",
      learned_half.shape == initial_half.shape == (tc.num_hidden_layers, tc.attention_hidden_size))
print("every log decay w = -e^tau is negative and finite, so every decay e^w lies in (0, 1):",
      bool(np.isfinite(log_decays).all() and (log_decays < 0).all()))
print("every half-life is positive and finite:", bool(np.isfinite(learned_half).all() and (learned_half > 0).all()))
print("the start is the same in every layer:", bool((initial_half == initial_half[0]).all()))

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
channels = np.arange(learned_half.shape[1])
for i, row in enumerate(learned_half):
    axes[0].semilogy(channels, row, ".", ms=4, label=f"layer {i}, trained")
    axes[1].semilogy(np.sort(row)[::-1], label=f"layer {i}, trained")
for ax in axes:
    ax.semilogy(channels, initial_half[0] if ax is axes[0] else np.sort(initial_half[0])[::-1], "k--", lw=1,
                label="start (every layer)")
    ax.axhline(1.0, color="grey", lw=0.6)
    ax.set_ylabel("half-life (tokens)")
    ax.legend(fontsize=7)
axes[0].set_xlabel("channel")
axes[0].set_title(r"half-life $\ln 2 / e^{\tau}$ of each channel")
axes[1].set_xlabel("rank within the layer (longest first)")
blinkdl = [np.log(2) / np.exp(-5 + 8 * np.linspace(0, 1, learned_half.shape[1]) ** (0.7 + 1.3 * r)) for r in (0, 1)]
for r, curve, style in zip(("first", "last"), blinkdl, (":", "-.")):
    axes[1].semilogy(curve, "grey", ls=style, lw=1, label=f"BlinkDL's start, {r} layer")   # sorted: h ascending
axes[1].legend(fontsize=7)
axes[1].set_title("the same, sorted per layer")
plt.show()

# %%
# The numbers behind the plot (not compared: they are the trained model's).
for i, (row, start) in enumerate(zip(learned_half, initial_half)):
    moved = np.abs(np.log(row / start))
    print(f"layer {i}: half-lives {row.min():.3g} to {row.max():.3g} tokens (median {np.median(row):.3g}; "
          f"start {start.min():.3g} to {start.max():.3g}); "
          f"{(row > 1).mean():.0%} of channels remember past one token; "
          f"median change {np.exp(np.median(moved)):.2f}x")

# %% [markdown]
# A half-life below one token means the channel's WKV is almost the current token alone (its bonus $u$ against a
# past that fades within a step); a half-life of tens or hundreds of tokens is a running average over the line or
# the function so far.
#
# **What the plot shows: the decays barely moved.** Every layer's curve lies on the dashed start, and the numbers
# above say by how much: the median channel's half-life changed by a factor of 1.25 to 1.30, and the range
# (0.03 to 164 tokens) is the start's (0.03 to 103) stretched a little at the long end. At this budget (2000 steps)
# the spectrum of memory lengths is the one the initialization set, not one training found. So there is no structure
# here to read into layers. This is why the start matters: BlinkDL's per-layer curves, and Mamba's $\Delta$ and $A$
# initialization in notebook 06, decide which memory lengths a small model has at all.
#
# Last, the trained model continues a prompt through its state (section 8's `generate`, here as
# `generate_text`, which encodes the prompt with the tokenizer and decodes the bytes as they arrive), greedily, up to
# the end of the line. The same from a shell: `python -m seqmix.generate
# experiments/results/weights/language_model/rwkv4 --prompt "def "`.

# %%
prompt_text = "def "
stream = trained.generate_text(prompt_text, max_new_tokens=80, stop="\n")
print(repr(prompt_text + "".join(stream)))

# %% tags=["nbval-check-output"]
print("the continuation is text, one line at most:", isinstance(stream.text, str) and "\n" not in stream.text)
print("tokens generated, within the limit:", 0 < len(stream.tokens) <= 80)

# %% [markdown]
# ## 10. Optional: the page's configuration and API, field by field
#
# Reference material a first reading can skip (the exercises do not need it, apart from exercise 3's `rescale_every`,
# which the model above does in section 5). The page lists `RwkvConfig`'s fields without showing what they do. Each
# one here, on
# small models, with the places where the page and transformers' code disagree (errata 4 to 8). The torch model
# (`models/rwkv4/`) follows the code, so that checkpoints behave as in transformers.
#
# | field (default) | what it does |
# |---|---|
# | `vocab_size` (50277), `hidden_size` (4096), `num_hidden_layers` (32) | $V$, $C$, $L$ |
# | `intermediate_size` (4 × `hidden_size`) | $F$, the channel mix's width |
# | `attention_hidden_size` (`hidden_size`) | the width of $r, k, v$ and of the WKV state (erratum 4) |
# | `layer_norm_epsilon` (1e-5) | $\epsilon$ of `pre_ln`, `ln1`, `ln2`, but not of `ln_out` (erratum 5) |
# | `rescale_every` (6) | at inference, halve the residual stream after every 6th block |
# | `tie_word_embeddings` (False) | whether the head *is* the embedding matrix (erratum 7) |
# | `context_length` (1024) | the longest sequence one call of transformers' CUDA kernel takes; nothing else |
# | `bos_token_id`, `eos_token_id` (0), `use_cache` (True) | for generation; whether `state` is returned |
#
# **`context_length`: "any length".** The page says RWKV "can deal with sentence of any length (even if the model
# uses a fixed context length for training)". Nothing in the model reads `context_length`: the same weights with
# `context_length` 8 or 64 give the same output on 40 tokens, bit for bit.

# %%
with torch.no_grad():
    outputs = [model_with(RwkvConfig(**sizes, context_length=n), weights).rwkv(torch.as_tensor(long_ids))
               for n in (8, 64)]
print("context_length 8 and 64, 40 tokens, same hidden states:",
      torch.equal(outputs[0].last_hidden_state, outputs[1].last_hidden_state))

# %% [markdown]
# **`attention_hidden_size` (erratum 4).** Time mix's $r, k, v$ may be narrower or wider than the residual stream:
# $W_r, W_k, W_v$ are `attention_hidden_size` $\times$ $C$, and $W_o$ maps back. The page gives all five state
# tensors the shape (batch, `hidden_size`, layers). The three WKV tensors have `attention_hidden_size` channels;
# only the two token-shift inputs are `hidden_size` wide. (transformers builds its state with `hidden_size`, and
# fails with a state when the two differ.) Here with 24 against $C = 16$, checked against the reference, whole and
# in two pieces:

# %%
wide_config = RwkvConfig(**dict(sizes, num_hidden_layers=2), attention_hidden_size=24)
wide_weights = drawn_weights(wide_config)
wide_model, wide_params = model_with(wide_config, wide_weights), base_params(wide_weights)
with torch.no_grad():
    wide_out = wide_model.rwkv(ids_t)
    wide_first = wide_model.rwkv(ids_t[:, :4])
    wide_rest = wide_model.rwkv(ids_t[:, 4:], state=wide_first.state)
for name, s in zip(ref.STATE_NAMES, wide_out.state):
    print(f"{name:10s} {tuple(s.shape)}")

# %% tags=["nbval-check-output"]
wide_hidden = ref.forward(wide_params, ids)[0]
check("attention_hidden_size 24: model vs reference", wide_out.last_hidden_state, wide_hidden,
      FP32_BUDGET)
wide_pieces = torch.cat([wide_first.last_hidden_state, wide_rest.last_hidden_state], dim=1)
check("attention_hidden_size 24: two pieces with the state vs whole", wide_pieces, wide_hidden,
      FP32_BUDGET)

# %% [markdown]
# **`layer_norm_epsilon` (erratum 5).** The page: "the epsilon to use in the layer normalization layers". In
# transformers' code the blocks' `pre_ln`, `ln1` and `ln2` take it, but the final `ln_out` is built with torch's
# default, 1e-5, whatever the config says. With $\epsilon$ = 0.01 the difference shows: the model's last hidden
# state is `ln_out` with 1e-5 applied to the last block's output, not with 0.01.

# %%
eps_model = model_with(RwkvConfig(**sizes, layer_norm_epsilon=1e-2), weights)
block0 = eps_model.rwkv.blocks[0]
print("eps of ln1 and ln2 in block 0:", block0.ln1.eps, block0.ln2.eps,
      "; eps of ln_out:", eps_model.rwkv.ln_out.eps)
with torch.no_grad():
    eps_out = eps_model.rwkv(ids_t, output_hidden_states=True)
last_block = eps_out.hidden_states[-2].double().numpy()               # (B, T, C) before ln_out

# %% tags=["nbval-check-output"]
ln_out = (params["ln_out.weight"], params["ln_out.bias"])
check("last hidden state vs ln_out with eps 1e-5", eps_out.last_hidden_state,
      layer_norm(last_block, *ln_out, eps=1e-5), FP32_BUDGET)
with_config_eps = layer_norm(last_block, *ln_out, eps=1e-2)
print("and not ln_out with layer_norm_epsilon = 0.01:",
      rel_rms(eps_out.last_hidden_state, with_config_eps) > 100 * FP32_BUDGET)
check("the model with eps 0.01 vs reference.forward(eps=0.01)", eps_out.last_hidden_state,
      ref.forward(params, ids, eps=1e-2)[0], FP32_BUDGET)

# %% [markdown]
# **`output_hidden_states` (erratum 6).** The page: one hidden state "for the output of the embeddings", plus one
# per layer. The code returns the output of each block (after any rescaling), then `ln_out`'s output: $L + 1$
# entries, none of them the embeddings.

# %% tags=["nbval-check-output"]
with torch.no_grad():
    states = model.rwkv(ids_t, output_hidden_states=True).hidden_states
embedded = params["embeddings.weight"][ids]                           # (B, T, C)
block0_out = ref.block(p0, embedded, [s[..., 0] for s in ref.initial_state(params, B)])[0]
print(f"{len(states)} hidden states for L = {L} blocks; the first is the embeddings:",
      rel_rms(states[0], embedded) < FP32_BUDGET)
check("the first hidden state vs block 0's output", states[0], block0_out, FP32_BUDGET)
check("the last hidden state vs ln_out's output", states[-1], ref_hidden, FP32_BUDGET)

# %% [markdown]
# **`rescale_every`.** "At inference, the hidden states (and weights of the corresponding output layers) are divided
# by 2 every `rescale_every` layer", so that fp16 activations do not overflow in deep models. With the default 6 it
# needs at least 7 blocks to act; here $L = 7$. In eval mode the residual stream is halved after block 5, and block 6
# adds its outputs at half scale, so every later hidden state is half the training-mode one. The final LayerNorm
# undoes the scale: the output changes only through the LayerNorm's $\epsilon$.

# %%
deep_config = RwkvConfig(**dict(sizes, num_hidden_layers=7))           # rescale_every = 6
deep_weights = drawn_weights(deep_config)
deep_model, deep_params = model_with(deep_config, deep_weights), base_params(deep_weights)
with torch.no_grad():
    inference = deep_model.rwkv(ids_t, output_hidden_states=True)
    training = deep_model.train().rwkv(ids_t, output_hidden_states=True)
deep_model.eval()
ratios = [float(a.norm() / b.norm())
          for a, b in zip(inference.hidden_states, training.hidden_states)]

# %% tags=["nbval-check-output"]
print("norm of each block's output, inference over training:", np.round(ratios[:-1], 3))
print("final output, inference vs training: rel. difference below 1e-3:",
      rel_rms(inference.last_hidden_state, training.last_hidden_state) < 1e-3)
check("inference vs reference.forward(rescale_every=6)", inference.last_hidden_state,
      ref.forward(deep_params, ids, rescale_every=6)[0], FP32_BUDGET)
check("training vs reference.forward(rescale_every=0)", training.last_hidden_state,
      ref.forward(deep_params, ids, rescale_every=0)[0], FP32_BUDGET)

# %% [markdown]
# **`tie_word_embeddings` (erratum 7).** The page describes `RwkvForCausalLM` as having a "linear layer with weights
# tied to the input embeddings", but the config's own default is False: the head is its own matrix unless the config
# ties it.

# %%
tied_model = RwkvForCausalLM(RwkvConfig(**sizes, tie_word_embeddings=True))
print("default tie_word_embeddings:", RwkvConfig().tie_word_embeddings)
print("head is the embedding matrix, default config:",
      model.head.weight is model.rwkv.embeddings.weight)
print("head is the embedding matrix, tie_word_embeddings=True:",
      tied_model.head.weight is tied_model.rwkv.embeddings.weight)

# %% [markdown]
# **`labels`, shifted inside the model.** The page: "the labels are shifted inside the model, i.e. you can set
# `labels = input_ids`". The logits at position $t$ predict token $t + 1$, so the loss is the mean over
# $t < T - 1$ of $-\log \mathrm{softmax}(\text{logits}_t)[\text{labels}_{t+1}]$, skipping labels of $-100$. By hand,
# in NumPy from the reference's logits, against the model's `loss`:

# %%
labels = ids_t.clone()
labels[0, 3] = -100                                                    # one label ignored
with torch.no_grad():
    loss = model(ids_t, labels=labels).loss
logits64 = ref.logits(head, ref_hidden)                                # (B, T, V)
log_probs = logits64 - np.log(np.exp(logits64).sum(-1, keepdims=True))
targets = labels[:, 1:].numpy()                                        # (B, T - 1) token t + 1
kept = targets != -100
picked = np.take_along_axis(log_probs[:, :-1], np.maximum(targets, 0)[..., None], axis=-1)[..., 0]
by_hand = -picked[kept].mean()

# %% tags=["nbval-check-output"]
check("the model's loss vs the shifted cross-entropy by hand", loss, by_hand, FP32_BUDGET)
print(f"positions in the loss: {kept.sum()} = B (T - 1) - 1 ignored = {B * (T - 1) - 1}")

# %% [markdown]
# **The label range (erratum 8).** The page says labels lie in `[-100, 0, ..., config.vocab_size]`; the largest
# valid label is `vocab_size - 1`, since the logits have `vocab_size` entries.

# %%
for label in (V - 1, V):
    try:
        model(ids_t, labels=torch.full_like(ids_t, label))
        print(f"label {label}: accepted")
    except ValueError as error:
        print(f"label {label}: {error}")

# %% [markdown]
# **`logits_to_keep`.** Generation needs only the last position's logits; `logits_to_keep=n` computes the head for
# the last $n$ positions only (0, the default, keeps all). With a vocabulary of 50277 that saves most of the head's
# work and memory.

# %% tags=["nbval-check-output"]
with torch.no_grad():
    every = model(ids_t).logits                                        # (B, T, V)
    last = model(ids_t, logits_to_keep=1).logits                       # (B, 1, V)
print("shapes:", tuple(every.shape), tuple(last.shape))
check("logits_to_keep=1 vs the last position of all logits", last, every[:, -1:], FP32_BUDGET)

# %% [markdown]
# ## Summary
#
# - An RNN carries a fixed state but trains step by step; attention trains in parallel, but its work grows as $n^2$
#   and the cache it carries to the next token as $n$ (the $n^2$ memory is only the naive matrix form's: measured,
#   slope 2 against the recurrence's 1). RWKV's linear recurrence keeps the fixed state and trains in parallel; an
#   old token's signal and gradient still fade, at a rate each channel learns.
# - Token shift mixes each channel of $x_t$ with $x_{t-1}$ by a learned $\mu$; time mix gates the WKV of
#   notebook 02 with $\sigma(r)$; channel mix is a gated squared-ReLU feed-forward layer; a block wraps both in
#   pre-norm residuals (section 4 draws the block). Written out here, each agrees with `reference/rwkv4.py` to
#   float64 rounding.
# - $k$ and $v$ have their own matrices $W_k$, $W_v$; the study notes' $W_r$ in all three lines would leave the
#   checkpoint's key and value weights unused (erratum 3).
# - The state (five arrays $(B, \cdot, L)$: two token-shift inputs of width $C$ and the WKV's
#   $\tilde N, \tilde D, M$ of width `attention_hidden_size`) holds everything a token needs from the past: feeding a
#   sequence whole, in two pieces (the page's example) or one token at a time gives the same output; dropping the
#   state does not. `context_length` limits nothing.
# - The page's configuration, run (section 10, optional): `layer_norm_epsilon` skips `ln_out`, `hidden_states` has no embeddings entry,
#   the head is tied only on request, labels are shifted inside and end at `vocab_size - 1`, `rescale_every` halves
#   the stream at inference without changing the output beyond $\epsilon$, `logits_to_keep` trims the head.
# - transformers' own `RwkvForCausalLM` on the same weights matches the float64 reference: the independent evidence
#   that this is RWKV-4. Its `forward` ignores `attention_mask` (a padded batch is not masked: erratum 25), and its
#   `attentions` are each block's time-mix output $(B, T, C)$, not attention weights (erratum 26). The torch model,
#   with the WKV on its torch path or on the Triton kernel, matches it too (the appendix). Generation through the state picks the tokens that re-reading the whole text picks, and stops
#   at `[187, 187]` (`"\n\n"`), row by row.
# - The project's own trained RWKV-4 (a byte-level model of the standard library's sources) loads with
#   `from_pretrained`, matches the float64 reference on its stored weights (1.740 bits per byte on test, the bigram
#   3.570), and writes a line of Python-looking text from `"def "`. Its decays barely moved from the evenly spread
#   start (median change 1.3x): the initialization set its memory lengths. BlinkDL's start bends the spread by layer
#   (short memories first, long ones last).
#
# Next: [04 · RWKV-7's delta rule](04_rwkv7_delta_rule.ipynb) replaces RWKV-4's two numbers per channel by a
# matrix per head. The bridge: write RWKV-4's numerator as a matrix state $S_t = S_{t-1} G + v_t \tilde k_t^\top$
# with $\tilde k_t = e^{k_t}$ and $G = \mathrm{diag}(e^{w})$, and RWKV-4 keeps only its diagonal, each channel its
# own value times its own key, and reads it without a query. Linear attention keeps the whole $C \times C$ matrix
# ($G = I$) and reads it with a query $q_t$; RWKV-7 keeps the whole matrix per head, decays it and erases from it.
# Notebook 04 opens with this family.
#
# ## Exercises
#
# Each exercise has a solution in the collapsed cell below it (click the three dots to open it); it runs with the
# notebook, so it is checked too. In a coding exercise, fill in the stub, run it, then run the check cell under it:
# it says "not attempted yet" while the stub is untouched, "correct" when your code passes, and fails with the
# checks' message otherwise.
#
# **1. No token shift.** Set every $\mu$ to 1. Which two of the five state arrays stop mattering? Check it: feed
# the second piece with those two arrays replaced by zeros.

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# With mu = 1, mix(x) = x_t: the previous input is never read,
# so ffn_x_prev and att_x_prev do not matter.
no_shift = {name: (np.ones_like(a) if ".time_mix_" in name else a) for name, a in params.items()}
first_out, first_state = ref.forward(no_shift, ids[:, :2])
zeroed = (np.zeros_like(first_state[0]), np.zeros_like(first_state[1])) + tuple(first_state[2:])
rest_out = ref.forward(no_shift, ids[:, 2:], zeroed)[0]
check("mu = 1: second piece with ffn_x_prev, att_x_prev zeroed vs whole",
      np.concatenate([first_out, rest_out], axis=1), ref.forward(no_shift, ids)[0],
      REFERENCE_BUDGET)
p_first, p_state = ref.forward(params, ids[:, :2])
p_zeroed = (np.zeros_like(p_state[0]), np.zeros_like(p_state[1])) + tuple(p_state[2:])
print("with the drawn mu, zeroing them changes the output:",
      rel_rms(ref.forward(params, ids[:, 2:], p_zeroed)[0], ref_hidden[:, 2:]) > 1e-3)

# %% [markdown]
# **2. The loss of knowing nothing.** What next-token loss does a model whose head is all zeros have? Predict it,
# then check with `labels=`.

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# Zero logits are a uniform distribution over the V tokens: the loss is ln V whatever the labels.
blank = model_with(config, dict(weights, **{"head.weight": np.zeros_like(head)}))
with torch.no_grad():
    blank_loss = blank(ids_t, labels=ids_t).loss
check(f"loss with a zero head vs ln V = ln {V}", blank_loss, np.log(V), FP32_BUDGET)

# %% [markdown]
# **3. Why rescaling is (almost) free.** Section 10 (optional) found the final output of the 7-block model nearly unchanged
# by `rescale_every`. Where does the small difference come from? Make the blocks' LayerNorm $\epsilon$ tiny with
# `ref.forward(..., eps=...)` and see which part of the difference is left.

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# LN(x / 2) = LN(x) only when eps = 0: the halving changes eps / var(x).
# ln_out keeps eps = 1e-5 (erratum 5), so some difference stays even with a tiny block eps.
def rescaling_effect(eps):
    on = ref.forward(deep_params, ids, eps=eps, rescale_every=6)[0]
    off = ref.forward(deep_params, ids, eps=eps, rescale_every=0)[0]
    return rel_rms(on, off)

print("rescaling changes the output less with a tiny block eps:",
      rescaling_effect(1e-12) < rescaling_effect(1e-5))
print("but not to zero (ln_out's eps stays 1e-5):", rescaling_effect(1e-12) > 1e-12)

# %% [markdown]
# **4. Your own WKV in the block.** Write `wkv_quadratic(p, k, v)`: section 2's formula as a weighted average over
# a $(T, T)$ table of weights, for a sequence that starts from the empty state (weights $e^{(t-1-i)w + k_i}$ for
# $i < t$, $e^{u + k_t}$ for $i = t$, 0 after), with $w = -e^{\tau}$ and $u$ read from `p` as `wkv` (section 2) reads
# them. The check puts it in the time mix in place of the reference's WKV, from the empty state, and compares with
# `ref.time_mix`. Then (in the solution) give the current token the weight $e^{w + k_t}$, as if $u = w$: the check
# fails. Why is $u$ a parameter of its own?

# %%
# Exercise 4: your own WKV in the block
def wkv_quadratic(p, k, v):
    """WKV of keys and values k, v (B, T, C) from the empty state, as a (T, T) table of weights per channel."""
    raise NotImplementedError("Exercise 4: your code here")

# %% tags=["nbval-check-output"]
empty_state = ref.initial_state(params, B)
zero_prev, empty_wkv = empty_state[1][..., 0], tuple(s[..., 0] for s in empty_state[2:])
r_e, k_e, v_e = receptance_key_value(p0, x, zero_prev)                      # section 2's r, k, v of block 0
expected_mix = ref.time_mix(p0, x, zero_prev, empty_wkv)[0]

def checks_4():
    check("time mix with your wkv_quadratic vs reference.time_mix",
          gate_and_output(p0, r_e, wkv_quadratic(p0, k_e, v_e)), expected_mix, REFERENCE_BUDGET)

exercise("Exercise 4", checks_4)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
def wkv_quadratic(p, k, v):
    """WKV of keys and values k, v (B, T, C) from the empty state, as a (T, T) table of weights per channel."""
    w, u = -np.exp(p["attention.time_decay"]), p["attention.time_first"]
    lag = np.arange(k.shape[1])[:, None] - 1 - np.arange(k.shape[1])[None, :]   # (T, T): t - 1 - i
    exponent = np.where(lag[..., None] >= 0, lag[..., None] * w, -np.inf)       # (T, T, C): 0 weight for i >= t
    weights = np.exp(exponent + k[:, None])                                      # (B, T, T, C)
    t_idx = np.arange(k.shape[1])
    weights[:, t_idx, t_idx] = np.exp(u + k)                                     # i = t: the bonus
    return (weights * v[:, None]).sum(2) / weights.sum(2)

# u is how much the current token counts against the decayed past: without it (u = w), the token is weighted as if
# it were one step old, and the check fails.
no_bonus = dict(p0, **{"attention.time_first": -np.exp(p0["attention.time_decay"])})   # u = w
try:
    check("the same with u = w", gate_and_output(p0, r_e, wkv_quadratic(no_bonus, k_e, v_e)), expected_mix,
          REFERENCE_BUDGET)
except AssertionError:
    print("the same with u = w: the check fails")
exercise("Exercise 4", checks_4)

# %% [markdown]
# **5. Generation through the state.** Section 8's `greedy_by_rereading` re-reads the whole text for every new
# token: $O(T)$ work per token. Write `greedy_through_state(weights_, prompt, n)`, which reads the prompt once with
# `ref.forward` and then feeds each new token alone with the state it returned, as `model.generate` does: $O(1)$
# work per token. It returns the prompt and the $n$ new tokens, shape `(1, 5 + n)` for section 8's prompt. The check
# compares its tokens with the re-reading's. Hint: `ref.forward(params, ids, state)` returns `(hidden, state)`;
# `ref.logits(head, hidden)[:, -1]` are the last position's logits; `base_params(weights_)` and
# `weights_["head.weight"]` split the weights as the reference wants them.

# %%
# Exercise 5: generation through the state
def greedy_through_state(weights_, prompt, n):
    """prompt (1, T0) followed by n greedy tokens, (1, T0 + n): the prompt read once, then one token at a time."""
    raise NotImplementedError("Exercise 5: your code here")

# %% tags=["nbval-check-output"]
def checks_5():
    mine = np.asarray(greedy_through_state(weights, prompt, 12))
    assert mine.tolist() == continuation[:, :5 + 12].tolist(), (
        f"your tokens {mine[0, 5:].tolist()} differ from the re-reading's {continuation[0, 5:17].tolist()}")
    print("your tokens vs greedy_by_rereading: the same 12 tokens")

exercise("Exercise 5", checks_5)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
def greedy_through_state(weights_, prompt, n):
    """prompt (1, T0) followed by n greedy tokens, (1, T0 + n): the prompt read once, then one token at a time."""
    params_, head_ = base_params(weights_), weights_["head.weight"]
    hidden_, state_ = ref.forward(params_, prompt)                        # the prompt, once
    tokens = [prompt]
    for _ in range(n):
        next_token = ref.logits(head_, hidden_)[:, -1].argmax(-1)[:, None]   # (1, 1)
        tokens.append(next_token)
        hidden_, state_ = ref.forward(params_, next_token, state_)       # one token, with the state
    return np.concatenate(tokens, axis=1)

exercise("Exercise 5", checks_5)

# %% [markdown]
# ## Appendix: the production path against the reference
#
# The notebook's lesson ends above. This appendix runs the torch model a user runs, with the WKV on each backend,
# and checks it against the float64 reference (nbval checks these cells like the others).
#
# [`RwkvForCausalLM`](../models/rwkv4/__init__.py) holds the same weights (in fp32) under the same names. Its base
# model, `model.rwkv(input_ids, state=None, backend=None)`, returns the hidden states after `ln_out` and the state
# (five fp32 tensors $(B, C, L)$, transformers' layout); `model(...)` adds the logits. The LayerNorms, mixes and
# linear layers are torch; `backend` chooses how the WKV runs: the chunked torch path, or the Triton kernel (here
# under the interpreter). Both run on the same ids and the same initial state, and are checked against the float64
# reference: hidden states, logits, the five state arrays, and the page's example itself (two tokens, then the rest
# with `outputs.state`).

# %%
prefix = rng.integers(0, V, (B, 3))                   # read first: a non-trivial initial state
ref_prefix_state = ref.forward(params, prefix)[1]
ref_hidden_after, ref_state_after = ref.forward(params, ids, ref_prefix_state)

runs = {}
with torch.no_grad():
    for backend in BACKENDS:
        prefix_state = model(torch.as_tensor(prefix), backend=backend).state
        out = model.rwkv(ids_t, state=prefix_state, backend=backend)
        logits = model(ids_t, state=prefix_state, backend=backend).logits
        one = model.rwkv(ids_t[:, :2], backend=backend)                # the page's example
        two = model.rwkv(ids_t[:, 2:], state=one.state, backend=backend)
        pieces = torch.cat([one.last_hidden_state, two.last_hidden_state], dim=1)
        runs[backend] = out, logits, pieces

# %% tags=["nbval-check-output"]
for backend in BACKENDS:
    out, logits, pieces = runs[backend]
    check(f"{backend} fp32 hidden states", out.last_hidden_state, ref_hidden_after, FP32_BUDGET)
    check(f"{backend} fp32 logits", logits, ref.logits(head, ref_hidden_after), FP32_BUDGET)
    for name, got, want in zip(ref.STATE_NAMES, out.state, ref_state_after):
        check(f"{backend} fp32 state {name}", got, want, FP32_BUDGET)
    check(f"{backend} fp32 the page's example: two pieces vs whole (reference)", pieces, ref_hidden,
          FP32_BUDGET)


# %% [markdown]
# **Gradients.** Training goes through the same graph. The next-token loss (`labels=input_ids`), differentiated with
# respect to every weight: the fp32 gradients of both backends against those of the same model in float64 on the
# torch backend (a chunked WKV, another algorithm than the kernel's recurrence, in double precision). The worst of the
# weight tensors is reported.

# %%
def loss_gradients(m, backend):
    m.zero_grad()
    m(ids_t, labels=ids_t, backend=backend).loss.backward()
    return {name: p.grad.clone() for name, p in m.named_parameters()}

model64 = RwkvForCausalLM(config).double().eval()
model64.load_checkpoint({name: torch.tensor(a) for name, a in weights.items()})
expected_grads = loss_gradients(model64, "torch")
grads = {backend: loss_gradients(model, backend) for backend in BACKENDS}

# %% tags=["nbval-check-output"]
for backend in BACKENDS:
    worst = max(expected_grads, key=lambda n: rel_rms(grads[backend][n], expected_grads[n]))
    check(f"{backend} fp32 loss gradient, worst of {len(expected_grads)} weights",
          grads[backend][worst], expected_grads[worst], FP32_BUDGET)

# %%
# The errors themselves (this cell is not compared: the numbers depend on the machine).
for backend in BACKENDS:
    out, logits, _ = runs[backend]
    grad_err = max(rel_rms(grads[backend][n], expected_grads[n]) for n in expected_grads)
    hidden_err = rel_rms(out.last_hidden_state, ref_hidden_after)
    logits_err = rel_rms(logits, ref.logits(head, ref_hidden_after))
    print(f"{backend:6s} fp32: hidden rel. RMS error {hidden_err:.1e}, logits {logits_err:.1e}, "
          f"worst gradient {grad_err:.1e}")
