# %% [markdown]
# # 09 · The formulas at work (1): associative recall and selective copying
#
# Notebooks 02 to 06 prove that each formula is computed right. This one shows what two of them are *for*, with
# small models trained from scratch on a CPU with the project's own ops and their backward. Two claims are tested:
#
# 1. **Recall needs a state that can be addressed.** On multi-query associative recall (MQAR), Zoology found that
#    attention solves the task at small width while recurrent models need a width that grows with the number of
#    key-value pairs; the RWKV-7 paper found that the delta rule recalls far better than a plain decayed sum.
# 2. **Selection needs a time-varying system.** On selective copying, the Mamba paper found that a time-invariant
#    SSM (a convolution) fails where the selective scan succeeds.
#
# A third experiment, **state tracking** (can a transition count parity?), is shown in section 7.
# Section 9 trains a small RWKV-7 on MQAR live, in well under a minute of one core, and opens it up; exercises close the
# notebook (one of them retrains that model with another state).
#
# Every model here but attention is one recurrence with a different transition, $S_t = S_{t-1} G_t + v_t k_t^\top$,
# $y_t = S_t q_t$ (notebook 04 opens with this frame, `seqmix.reference.family` writes each rung as its own loop,
# and the capstone, notebook 12, sets them side by side): RWKV-4 a diagonal $G$ with no query, RWKV-7 a diagonal plus
# rank one (the erase), Mamba a per-channel diagonal chosen by the input. Read the results below as consequences of each
# state's shape: what it can hold, and how it is addressed.
#
# Each experiment has a **positive control**: a setting whose answer the literature knows and which the project
# must get before any other row is read (Zoology's own attention model solving MQAR at N = 4 and N = 8; Mamba beating
# the time-invariant model on selective copying; RWKV-7 with eigenvalues down to -1 learning parity). The first edition of these experiments
# (batch 32, 500 steps) failed its control: attention stayed at chance, and the text read that as "attention
# cannot recall at this budget". Runs at batch 256 showed the cause (only N targets per sequence carry a loss: 128
# a step at batch 32 were too noisy for the induction circuit to form); the second edition's protocol follows
# from such measurements.
#
# The results below are the committed full runs (`python -m seqmix.experiments.recall`, `.selective_copy`,
# `.state_tracking`); this notebook reads them, re-evaluates the committed weights live, and runs reduced
# experiments (`--quick`) in a few seconds. Nothing here was tuned until it agreed with a paper: where it disagrees,
# the disagreement is reported. The full runs took core-hours; a "-" in a table is a model not trained there.
#
# **Sources.** Zoology, Arora et al. 2023, arXiv:2312.04927, https://arxiv.org/abs/2312.04927 (MQAR, section 3);
# Okpekpe and Orvieto 2025, arXiv:2508.19029, https://arxiv.org/abs/2508.19029 (recurrent models learn recall only in
# a narrow window of learning rates: hence a sweep per setting); RWKV-7 "Goose", arXiv:2503.14456,
# https://arxiv.org/abs/2503.14456; Mamba, Gu and Dao 2023, arXiv:2312.00752, https://arxiv.org/abs/2312.00752
# (selective copying, section 3.1).
#
# **Notation.** Letters here ($B$, $C$, $D$, $N$) mean other things in other notebooks: see the
# [notation crosswalk](notation.md).
#
# **Code used.** [`experiments/data.py`](../experiments/data.py): `mqar`, `selective_copying` ·
# [`experiments/zoo.py`](../experiments/zoo.py): `build` (the project's RWKV-4, RWKV-7, Mamba and a RoPE
# transformer on `kernels.attention`), `time_invariant_system`, `state_size` ·
# [`experiments/training.py`](../experiments/training.py): `Run`, `evaluate`, `extend_to_interior` ·
# [`experiments/mechanism.py`](../experiments/mechanism.py) ·
# [`experiments/recall.py`](../experiments/recall.py),
# [`experiments/selective_copy.py`](../experiments/selective_copy.py),
# [`experiments/state_tracking.py`](../experiments/state_tracking.py)
# · [`reference/ssm.py`](../reference/ssm.py): `ssm_kernel`, `causal_convolution` ·
# [`kernels/ssm/`](../kernels/ssm/__init__.py): `selective_scan`.

# %%
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import Image, Markdown, display

from seqmix.experiments import data, recall, selective_copy, zoo
from seqmix.experiments.records import RESULTS, Results
from seqmix.experiments.training import evaluate, setup_torch
from seqmix.kernels.ssm import selective_scan
from seqmix.kernels.testing import FP32_BUDGET, check
from seqmix.models.io import load_state_dict
from seqmix.reference import ssm as ref

setup_torch(1)            # one thread: the committed numbers were measured with one


# %% [markdown]
# ## 1. The task: multi-query associative recall
#
# A sequence holds $N$ key-value pairs, then every key again, once, in random order and at random places. At each
# queried key $k_i$ the model must output its value $v_i$:
#
# $$k_1\, v_1\, k_2\, v_2 \dots k_N\, v_N \;\big|\; 0 \dots k_a \dots 0 \dots k_b \dots \qquad
# \text{target at } k_i:\; v_i .$$
#
# Keys come from $[1, V/2)$ and values from $[V/2, V)$, all distinct in a sequence, so nothing but the context tells
# the answer: a model that has not stored the pairs is right with probability $1/N$ at best (it can learn that the
# answer is one of the values it saw). The queries' places follow Zoology's generator: the region after the pairs
# is cut into slots of two tokens and query $i$ takes slot $g_i$ with probability $\propto (g + 1)^{a - 1}$, $a =
# 0.01$, about $1/(g+1)$: most queries come soon after the pairs, as a repeated bigram does in text (a uniform
# spacing, the first edition's, puts a query 32.6 tokens after its key on average at $T = 64$, $N = 4$; this one
# 19.2). The runs use $V = 128$, $N = 4$ at $T = 64$ and $N = 8$ at $T = 128$, as Zoology grows them together. The
# generator's promise (every queried key, with its value right after it, sits earlier in the sequence) is checked
# on 10,000 sequences:

# %% tags=["nbval-check-output"]
inputs, targets = data.mqar(np.random.default_rng(0), 10_000, seq_len=64, num_pairs=8, vocab_size=128)
ok = True
for x, y in zip(inputs, targets):
    for t in np.flatnonzero(y != data.IGNORE):
        first = np.flatnonzero(x[:t] == x[t])                    # where the queried key was given
        ok &= len(first) == 1 and first[0] % 2 == 0 and x[first[0] + 1] == y[t]
print("every query's key-value pair is earlier in its sequence:", bool(ok))
print("one sequence:", " ".join(map(str, inputs[0])))
print("its targets: ", " ".join("." if v == data.IGNORE else str(v) for v in targets[0]))

# %% [markdown]
# ## 2. What each formula can store
#
# Recall is a question about the state: what a layer keeps of the past, and whether it can find one pair in it.
#
# * **Attention** ([notebook 01](01_softmax_attention.ipynb)) keeps every key and value, $2CT$ numbers, and finds a
#   pair by the score $q_t \cdot k_j$: a query that matches one key picks exactly its value. Two layers suffice
#   (one copies each key into its value's position, the next matches the query against it). The model here is a
#   small pre-LayerNorm transformer with RoPE, whose block [notebook 10](10_extrapolation.ipynb) draws (section 3).
# * **RWKV-4's WKV** ([notebook 02](02_rwkv4_wkv.ipynb)) keeps a numerator and a denominator per channel,
#   $a_t = e^{w} a_{t-1} + e^{k_t} v_t$, $b_t = e^{w} b_{t-1} + e^{k_t}$ (with $w = -e^{\tau} < 0$, the
#   project's convention), and reads $a/b$: a weighted *average* of
#   the past values, $2C$ numbers. The weights depend on each key's own strength and age, not on the query, so in
#   one channel the pairs blur into one mean. But a model has many channels, each with its own decay and key
#   strength, and a token shift that pairs each value with its key: different channels can hold different pairs.
#   The capacity grows with width, which is Zoology's claim and what section 5 measures.
# * **RWKV-7's delta rule** ([notebook 04](04_rwkv7_delta_rule.ipynb)) keeps a matrix per head,
#   $S_t = S_{t-1}(\mathrm{diag}(w_t) - \hat\kappa_t (\alpha_t \odot \hat\kappa_t)^\top) + v_t k_t^\top$ ($\alpha_t$
#   the in-context learning rate), read as
#   $y_t = S_t r_t$: an associative memory of $C \times$ head size numbers. Writing $v$ at key $k$ first removes what
#   was stored at $k$ (the $-\hat\kappa\hat\kappa^\top$ term), so pairs with different keys do not pile up. In the
#   idealized case (orthonormal keys, $\hat\kappa = k$, in-context rate 1, no decay) reading with $r = k_i$ returns
#   exactly $v_i$ for up to head-size pairs ([notebook 04](04_rwkv7_delta_rule.ipynb)); otherwise it returns $v_i$
#   plus interference from the other pairs, which training must keep small.
# * **Mamba** ([notebook 06](06_state_space_models.ipynb)) keeps $h_t = \bar A_t h_{t-1} + \bar B_t x_t$, $2CN$
#   numbers; its selection (input-dependent $\Delta$, $B$, $C$) decides what is written and read, but the state is a
#   sum, without the delta rule's erase.
#
# State per layer at width $C$ (head size 16, $N = 16$, attention at $T = 64$):

# %% tags=["nbval-check-output"]
for width in (32, 64, 128):
    print(f"C = {width:3d}: " + ", ".join(f"{arch} {zoo.state_size(arch, width=width):5d}"
                                         for arch in ("attention", "rwkv4", "rwkv7", "mamba")))

# %% [markdown]
# ## 3. The protocol, second edition
#
# Every model has 2 layers of width $C$, and all share the optimizer (AdamW with weight decay on weight matrices only,
# as Zoology's and BlinkDL's training code: none on Mamba's $A$ and $D$, norms, biases, RWKV's per-channel vectors),
# warmup then cosine decay, batch 256 and at most 1000 steps, with early stopping at 99.5% validation accuracy. The
# budget comes from measured runs, not guesses: at batch 32 attention stays at chance for 4000 steps; at batch 256 it
# passes 90% by step 300. Recurrent models learn recall only inside a narrow window of rates (Okpekpe and Orvieto), so
# the rate is swept: Zoology's grid $10^{-4} \dots 10^{-2}$ in four log steps, every rate trained to the end with the
# first seed at $C = 64$, **extended past an edge** whenever the winner sits on it (a winner on the edge means the best
# rate may lie outside). Other cells train at their model's chosen rate and its lower neighbour. The control is
# Zoology's attention model ("attention_zoology": one head as wide as the model, no MLP, learned positions, the head
# tied, dropout 0.1 on the attention weights) at $C = 64$ with $N = 4$ and $N = 8$, three seeds each; the project's
# own transformer ("attention": RoPE, heads of 16, an MLP) is a row like the others. Three seeds also for the
# headline cells (the project's attention, RWKV-7 and RWKV-4 at $C = 64$, $N = 4$), one elsewhere. A model that fails
# is trained again with four times the steps before its failure is blamed on anything, and only the steps change: the
# warmup keeps its 50 steps (runs made before that stretched it to 200, which changed the schedule too; they are
# marked "stretched"). The first edition's "budget" explanations are gone: a cell says what a run measured.
#
# ## 4. The results

# %%
def show(name):
    """A committed results table and its figures, or a note that the run has not written them yet."""
    if not (RESULTS / f"{name}.md").exists():
        print(f"{name}: no committed results yet (python -m seqmix.experiments.{name})")
        return
    display(Markdown((RESULTS / f"{name}.md").read_text()))
    for png in sorted(RESULTS.glob(f"{name}*.png")):
        display(Image(str(png)))


show("recall")

# %% [markdown]
# The mechanism figure (when its weights are committed): on the left, the trained attention's last layer from one
# held-out sequence; in the middle, for each head, how much weight a query puts on its pair's key, on its pair's
# value and on the other values. An **induction head** attends from the queried key to the token *after* that
# key's earlier occurrence, i.e. to the value, which it then copies: the orange bar. On the right, per layer,
# RWKV-7's state read at a query, $y_t = S_t r_t$, compared (cosine) with the value written at each pair: a
# diagonal that stands apart from the rest is an associative memory returning the right value. In the committed
# model it is layer 0's (negative: the sign is free, since the layer's group norm and output projection can flip
# it); layer 1's readout barely tells the pairs apart.
#
# The committed weights re-evaluated live: loaded into fresh models, they give the recorded test accuracy on the
# same held-out sequences, so anyone can check the table without retraining.

# %% tags=["nbval-check-output"]
found = Results(RESULTS, "recall")
setup = recall.FULL
for arch, width, pairs in setup.save:
    row = found.find(phase="test", arch=arch, width=width, pairs=pairs, seed=0)
    model = recall.load_model(setup, RESULTS, arch, width, pairs)
    if row is None or model is None:
        print(f"{arch} C={width} N={pairs}: not run yet")
        continue
    test = evaluate(zoo.logits, model, *recall._held_out(setup, recall.TEST, pairs, setup.test_size))
    # one query of 1000 sequences is 1 / (1000 N): a last-bit difference of another CPU may flip one argmax
    same = abs(test["accuracy"] - row["test_accuracy"]) <= 1 / row["test_queries"]
    print(f"{arch} C={width} N={pairs}: {100 * test['accuracy']:.1f}% ({'as recorded' if same else 'DIFFERS'})")

# %% [markdown]
# ## 5. What the recall results say
#
# The grid in one picture: each model's test accuracy against its width, one panel per number of pairs $N$, from the
# committed `recall.json`. A line joins the mean over seeds (three seeds in the control's cells, one elsewhere; the
# small dots are the seeds); a hollow circle is the same cell trained again with up to four times the steps and the
# same warmup, a hollow square the same with the warmup stretched fourfold too (the earlier rule); the dashed line is
# the plateau $1/N$ of a model that knows the answer is one of the values but not which.

# %%
archs = ("attention_zoology", "attention", "rwkv4", "rwkv7", "mamba")
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True, constrained_layout=True)
for ax, pairs in zip(axes, (4, 8)):
    for colour, arch in enumerate(archs):
        runs = [r for r in found.select(phase="test") if r["arch"] == arch and r["pairs"] == pairs]
        widths = sorted({r["width"] for r in runs})
        mean = [np.mean([r["test_accuracy"] for r in runs if r["width"] == w]) for w in widths]
        ax.plot(widths, mean, marker="o", color=f"C{colour}", label=arch)
        ax.scatter([r["width"] for r in runs], [r["test_accuracy"] for r in runs], s=10, color=f"C{colour}")
        longer = [r for r in found.select(phase="long") if r["arch"] == arch and r["pairs"] == pairs]
        for kept, marker in ((True, "o"), (False, "s")):   # the warmup kept in steps, or stretched with the steps
            rows = [r for r in longer if ("warmup_steps" in r) == kept]
            ax.scatter([1.05 * r["width"] for r in rows], [r["test_accuracy"] for r in rows], s=80, marker=marker,
                       facecolors="none", edgecolors=f"C{colour}", linewidths=1.5)
    ax.axhline(1 / pairs, color="k", ls="--", lw=0.8)
    ax.set(xscale="log", xlabel="width C", title=f"N = {pairs} pairs (chance 1/N = {1 / pairs:.1%})")
    ax.set_xticks([64, 128, 256], ["64", "128", "256"])
    ax.minorticks_off()
axes[0].set_ylabel("test accuracy (1000 steps)")
axes[0].scatter([], [], s=80, facecolors="none", edgecolors="gray", label="the same cell, up to 4x the steps")
axes[0].scatter([], [], s=80, marker="s", facecolors="none", edgecolors="gray", label="... the warmup stretched too")
axes[1].legend(*axes[0].get_legend_handles_labels(), fontsize=8, loc="center right")
plt.show()

# %% [markdown]
# The lessons, each with the cell that shows it:
#
# | lesson | measured (test accuracy) |
# |---|---|
# | the control, Zoology's attention, learns $N = 4$ at $C = 64$ on every seed, and $N = 8$ on two of three, where the project's attention fails $N = 8$ | $N = 4$: 98.8%, 98.8%, and 99.3% for the third seed with 4x the steps: **holds**; $N = 8$: 99.7%, 99.4%, the third seed 13.7% and 15.0% with 4x the steps: **fails**; with a constant rate that run reaches 99.8% |
# | attention needs enough scored targets per batch to form its induction circuit | the project's attention at batch 256: 98.9% and 99.4% on two seeds; the third 26% at 1000 steps, and 27.3% after 4000 with the same warmup |
# | a longer warmup is not a longer budget | the third seed's first 4x run, its warmup stretched from 50 to 200 steps, reached 99.7% by step 1950 |
# | the delta rule learns recall fast | RWKV-7 99.6% in 150 steps ($C = 64$, $N = 4$), every cell above 99% |
# | a decayed sum buys with width or steps what the delta rule has | RWKV-4 at $N = 4$: 26% at $C = 64$, 54% at 128, 98.5% at 256 in 1000 steps; 89.6% at 64 with 4000 (still rising) |
# | Mamba's failure at $C = 64$ is the budget's | 26.3% at $N = 4$ in 1000 steps; 99.2% with 4x the steps and the same warmup (stopped early at 1350) |
# | a failure is read only beside its longer run | Mamba and RWKV-4 at $N = 4$ learn with 4x the steps; attention's third seed does not |
#
# (Section 6's lesson, selection beats time invariance, and section 7's, a sign flip buys parity, complete the list.)
# In more detail:
#
# * **The control.** Zoology's own attention model (one head as wide as the model, no MLP, learned positions, the
#   head tied, dropout 0.1 on the attention weights) solves MQAR at $C = 64$. At $N = 4$ two seeds reach 98.8% in
#   1000 steps; the third stays on the plateau for all 1000 at every rate of the sweep and reaches 99.3% with four
#   times the steps and the same warmup, leaving the plateau at step 650-700, inside the first run's length (so the
#   longer run's slower decay, as for Mamba below, is not told apart from its steps). At $N = 8$, where the
#   project's attention never leaves chance, two seeds reach 99.7% and 99.4% in 700-900 steps; the third stays on
#   the plateau for 1000 steps, and with four times the steps and the same warmup for all 4000 (15.0%, its keys
#   collapsed). So the control **holds at $N = 4$ and fails at $N = 8$**: recall.md reads each $N$ on its own, the
#   $N = 4$ rows as claims and the $N = 8$ rows as measurements only. The third seed's failure is the schedule, and
#   two probes turn it on and off: with 16 times the steps (the cosine barely started) it leaves the plateau at step
#   2100-2250, inside the 4000; and the same 4000-step run with a constant rate instead of the cosine leaves it at
#   2600-2700 (99.8%). This seed needs its rate near the peak for over 2000 steps, and the cosine takes it away
#   (Zoology trains at a constant rate). The control's rule is not changed after the fact, so the verdict stands.
# * **The project's attention fails the control's rule**, which is why it is no longer the control. It solves MQAR at
#   $C = 64$, $N = 4$ once it is trained with batch 256, in 800-850 steps on two seeds. The third seed stays on the
#   plateau: leaving it means forming an induction circuit (a previous-token head in layer 0, then a head in layer 1
#   that attends from the queried key to the token after its earlier occurrence), and this seed does not form it in
#   1000 steps nor in 4000 with the same 50-step warmup (27.3%, its keys' embeddings collapsed). A first longer run
#   that also stretched the warmup to 200 steps had rescued it (99.7% by step 1950): that was the schedule, not the
#   steps. The mechanism figure shows the circuit in its first seed, which formed it: from a query, most of the last
#   layer's weight sits on its pair's *value*.
# * **RWKV-4 and Mamba at $C = 64$, $N = 4$**: at or below chance at every rate of the grid after 1000 steps
#   (RWKV-4's three seeds 25-26% at the chosen rate; Mamba 26.3%). RWKV-4's 4x run, the warmup kept, leaves the
#   plateau at step 1300 and reaches 89.6%, still rising: the decayed sum *can* hold the pairs here, and what
#   separates it from RWKV-7 is how fast it learns to. Mamba's leaves it at step 650 and stops early at 1350 steps
#   with 99.2%: at step 650 the short schedule has brought the rate down to 37% of its peak, the long one still
#   holds 95% (Okpekpe and Orvieto 2025 report a narrow window of rates for Mamba on MQAR). For both, the first 4x
#   runs (warmup stretched) were a little faster: the warmup helped, the steps did most of it.
# * **The rate window is real, and the grid must bracket it.** At $10^{-4}$ attention and RWKV-7 stay at $1/N$ for
#   1000 steps; at $10^{-2}$ attention stays at 27% while RWKV-7 is done in 150 steps, its best rate, on the
#   grid's edge: the grid was extended to $4.6 \cdot 10^{-2}$, which did worse, so $10^{-2}$ is interior now.
# * **Width 128** speeds every model up within 1000 steps: attention 99.3% (at a lower rate), RWKV-7 100% in 100
#   steps, Mamba 99.2% in 550, RWKV-4 54% (off the plateau, not finished). A wider state gives more room, and here
#   it also gives faster learning, which is not the same claim.
# * **$N = 8$.** RWKV-7 learns it at every width (99.9% within 200 steps); Mamba at $C = 64$ with 4x the steps
#   (99.5% with the warmup kept, in 2250 steps), not at 128 in 1000 steps (14%): width 128 does not buy in 1000 steps what four times
#   the steps bought at 64. RWKV-4's 4x run is at 36% and rising, and its failure is not read as capacity. Attention at width 64
#   stays at chance even with 4x the steps (14.2%; chance 12.5%), and learns at width 128 at the lower rate of its
#   sweep ($4.6 \cdot 10^{-4}$: 93.7% test accuracy in 1000 steps): the case study below.
# * **At one state size.** RWKV-7's state ($16C$ per layer) is eight times RWKV-4's ($2C$). RWKV-7 with heads of 2
#   keeps $2C$ numbers, as RWKV-4, and reaches 53% at $N = 4$, $C = 64$ in 1000 steps (a probe, one seed; its
#   neighbouring rates stay at chance or below), where RWKV-4 is at 26%: faster, not done. At $N = 8$ it ends at 16%
#   (chance 12.5%, RWKV-4 12%): neither learns 8 pairs at that state size within 1000 steps. A "-" at $C = 256$ is
#   a model not trained there: only RWKV-4 was below 98% at 128.
#
# ### Case study (optional): attention at $N = 8$, width 64
#
# Attention stays on the plateau at $N = 8$, $C = 64$ with every rate of its sweep and with 4x the steps: its loss
# sits on $\log 8 = 2.079$, the loss of a model that knows the answer is one of the 8 values in the context, and not
# which. What was measured alongside:
#
# * **The keys' embeddings collapse on the plateau.** The report's last column, "keys alike", is the mean cosine
#   between the embeddings of two distinct key tokens: about 0 at the random start. In the failed attention runs of
#   the report it is 0.86-0.97 (0.97 after 12x the steps), in the runs that learned 0.00-0.05; docs/experiments.md
#   lists it for every attention run (0.70-0.97 on the plateau, 0.05-0.37 in runs that learned; width 128 at
#   $N = 8$ ends at 0.37). Neither half of the induction circuit forms in the failed runs (the other two columns:
#   no previous-token head, nothing on the value).
# * **Freezing the token embedding at its random start**, and changing nothing else, learns $N = 8$: 99.6% test,
#   stopping early at 900 steps, with a previous-token head at 96% and the last layer 91% on the value.
# * **Changes that did not help** (the "Probes" table): one head of 64, no channel mix, $T = 64$, a short
#   convolution as block 0, learned positions instead of RoPE (4x the steps), the rates $10^{-2}$ and
#   $4.6 \cdot 10^{-4}$ with 4x the steps, and the budget up to 12x (14.7%).
#
# What this does and does not show: the collapse co-occurs with the plateau in every failed run, and a model that
# cannot collapse (the frozen embedding) learns. It does not show that the collapse *causes* the plateau: on a
# plateau where telling keys from values is all that lowers the loss, a collapse is what one would expect to follow,
# whatever keeps the model there, and a collapse can be left (Mamba's keys collapse on the plateau too and come apart
# as it learns). An independent, Zoology-style attention model learns this cell at vocabulary 128, so something in
# this setting, not attention as such, keeps it on the plateau. The probes since (one seed, rate $10^{-3}$, up to 2000
# steps; the "Probes" table):
#
# * the project's model with every one of Zoology's *training* settings (tied head, dropout, AdamW's betas, no
#   clipping or warmup, a constant rate): 13.9%. Not the recipe.
# * the project's model with dropout 0.1 on the *attention weights* (where Zoology drops, besides the embedding):
#   14.8%. Not that alone.
# * Zoology's model (one head of 64, no channel mix, learned positions, head tied, dropout 0.1) with the attention
#   weights' dropout, and the project's recipe: **99.7%**, stopping early at 1450 steps; the same model without
#   that dropout: 13.3% after 2000. Neither the tied head nor the
#   other dropout is needed (99.6% without each; 99.7% with the attention weights' dropout alone in that shape),
#   but with RoPE in place of the learned positions the same model stays at chance (14.0%).
#
# So in Zoology's model, dropping attention weights at random during training is what takes attention off the
# plateau: a head that cannot rely on any single key-value link keeps trying others, which is one plausible reading,
# not a measured one. It is not enough in the project's model, and which of Zoology's other settings it needs is
# the learned positions: both are needed, each turned off by a run. Heads of 16 and the channel mix
# were not tried with them. These probes are one seed each; the control now runs this model (section 5's first bullet),
# three seeds at $N = 8$.
#
# ## 6. Selective copying: why Mamba made the SSM selective
#
# $K$ symbols sit at random places among blanks in a context; after it come $K$ markers, at which the model must say
# the symbols in order. A time-invariant SSM is a convolution ([notebook 06](06_state_space_models.ipynb), section
# 5):
#
# $$y_t = \sum_{l \ge 0} \bar K_l\, u_{t-l}, \qquad \bar K_l = C \bar A^l \bar B, \qquad
# \bar A = e^{\Delta A},\; \bar B = \Delta B \text{ (Mamba's choice)},$$
#
# so it weighs a past token by *how far back* it is, never by *what* it is, and the symbols' distances change from
# sequence to sequence. Mamba makes $\Delta_t$, $B_t$, $C_t$ functions of the input: a blank can get $\Delta_t
# \approx 0$ (the state passes it by) and a symbol a large $\Delta_t$ (the state takes it in).
#
# The time-invariant model here is not a second implementation: it is the project's Mamba with $x$_proj (which
# makes $\Delta$, $B$, $C$ from the input) replaced by learned constants (`zoo.TimeInvariantProjection`), so both
# models have the same conv, gate, projections and scan, and nearly the same size. That its scan *is* the
# convolution above is checked on a time-invariant model (the committed one when there is one): the kernels'
# selective scan with its constants against the float64 reference's $\bar K$ and causal convolution.

# %% tags=["nbval-check-output"]
sc = selective_copy.FULL
regime = sc.regimes[0]
lti = zoo.build("mamba_lti", vocab_size=regime.vocab_size, width=sc.width)
if selective_copy.weights_path(RESULTS, "mamba_lti", regime).exists():
    lti.load_state_dict({k: v.float() for k, v in
                         load_state_dict(selective_copy.weights_path(RESULTS, "mamba_lti", regime)).items()})
mixer = lti.backbone.layers[0].mixer
delta, A, B, C = (t.double() for t in zoo.time_invariant_system(mixer))        # (D,), (D, N), (N,), (N,)
D, T = delta.shape[0], 72
u = torch.randn(1, D, T, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
y_scan, _ = selective_scan(u, delta[None, :, None].expand(1, D, T), A, B[None, :, None].expand(1, -1, T),
                           C[None, :, None].expand(1, -1, T), backend="torch")
K = np.stack([ref.ssm_kernel(np.diag(np.exp(delta[d].item() * A[d].numpy())), delta[d].item() * B.numpy(),
                             C.numpy(), T) for d in range(D)])                   # (D, T): K_l = C A_bar^l B_bar
y_conv = np.stack([ref.causal_convolution(K[d], u[0, d].numpy()) for d in range(D)])
check("LTI Mamba's scan = the reference convolution with K_l = C A_bar^l B_bar", y_scan[0], y_conv,
      FP32_BUDGET)

# %% [markdown]
# The results (both models' rates swept on full-length runs, three seeds in the control's regime), and, when the
# trained Mamba is committed, its first layer's step size $\Delta_t$ on symbols and on blanks before and after
# training: if selection is what solves the task, training separates the two (a large step writes the token into
# the state; a small one lets the state pass it by).

# %%
show("selective_copy")

# %% [markdown]
# * **The control holds.** With 4000 steps of 32 (800 in the first edition, where neither model had told symbols
#   from blanks), Mamba reaches 99.4%, 99.3% and 99.8% on three seeds and the time-invariant model 91.6%, 93.8% and
#   24.0% (its third seed stayed near chance for all 4000 steps at 1e-2; at 3.2e-3 it reaches 84.5%, near the
#   first seed's 88% at that rate in the sweep: the rate, not the seed): Mamba's worst seed above the
#   time-invariant model's best, the gap the paper reports at 4096 positions, here at 64.
# * The step-size figure: training separates Mamba's first-layer step on symbols from the step on blanks, but not as
#   "a large step on symbols": the channel-mean step, over tokens, peaks slightly *lower* on symbols (about
#   0.0138) than on blanks (0.0143). The selection is per channel, and a mean over channels hides which way each
#   one goes.
# * The time-invariant model is far above chance although it cannot weigh a token by what it is: the block around
#   the scan (the short convolution and the gate $\mathrm{SiLU}(z)$, both input-dependent) does part of the
#   selecting, as the paper's gated baselines (H3, the Mamba block with S4) also show.
# * **The gate-less pair** (`MambaConfig(gate=False)`: the same blocks without $\mathrm{SiLU}(z)$, the paper's table
#   1 rows S4 18.3% and S6 97.0%) checks that reading: without the gate the time-invariant model falls to 50-56%,
#   while the selective scan alone still solves the task (99.8% and 99.4%; its second seed stayed at chance for 4000
#   steps at 1e-2, and learns at the grid's lower rates, 99.3% at 3.2e-3 and 99.5% at 1e-3: the probes at the end
#   of the report above). The paper's ordering, at 64 positions instead of 4096.
# * **The harder regime, 256 positions and 16 tokens** (one seed): the time-invariant model falls to 37.6% (chance
#   1/16), Mamba keeps 97.9%. The gap widens as the context grows, the paper's reading; neither number has a longer
#   run beside it, so neither is read as a ceiling.
#
# ## 7. State tracking: can the transition count?
#
# Parity of a bit string is the simplest state a model can be asked to track: flip on a 1, keep on a 0. A linear
# recurrence $x_t = g(\text{token}_t)\, x_{t-1}$ does it exactly with $g(0) = 1$, $g(1) = -1$, and cannot with $g$ in
# $[0, 1]$: no product of numbers in $[0, 1]$ changes sign. RWKV-4's decay and Mamba's $e^{\Delta A}$ are such
# numbers; RWKV-7's transition $\mathrm{diag}(w_t) - \hat\kappa_t (\alpha_t \odot \hat\kappa_t)^\top$ has, with equal
# decays, an eigenvalue $w - \bar\alpha$ along $\hat\kappa$ ($\bar\alpha$ the $\hat\kappa^2$-weighted mean rate,
# [notebook 04](04_rwkv7_delta_rule.ipynb) section 8), which the published ranges keep above $-0.455$, and
# `Rwkv7Config(wide_in_context_rate=True)`, with $\alpha$ up to $1 + w$, lets reach $-1$ (Grazzi et al.,
# arXiv:2411.12537, https://arxiv.org/abs/2411.12537, on why transitions with eigenvalues in $[0, 1]$ cannot count
# parity, and on extending the range to $[-1, 1]$; Merrill et al., arXiv:2404.08819, https://arxiv.org/abs/2404.08819,
# on why diagonal SSMs cannot track permutations, assuming $\mathsf{TC}^0 \ne \mathsf{NC}^1$). The models train on
# sequences of 64 and are tested at 256 and 1024, past anything they saw.

# %%
show("state_tracking")

# %% [markdown]
# * **RWKV-7 with eigenvalues down to $-1$ learns parity and keeps it past the training length**: 100% at lengths up
#   to 64 on every seed; at the positions 65-256, 97.5% and 98.9% on two seeds after 1500 steps, and on the third
#   (82.9% at 1500 steps) 100% with four times the steps and the same 75-step warmup, which also keep 97.6% at
#   65-1024 (a first 4x run that stretched the warmup to 300 steps gave 100% and 99.7%: the steps, not the warmup,
#   rescued this seed). The control holds by its rule (every seed, within the budget or with the longer run).
# * **RWKV-7 as published learns parity only where it was trained**: 95-99.8% up to 64, 50-63% past it (chance is
#   50%). RWKV-4 (80% up to 64) and Mamba (77%), whose transitions cannot flip a sign, and attention (64%) fit the
#   training lengths partly (right on the first 24-32 positions, at chance from about 50) and are at chance past them.
# * Addition mod 3: every model fits the training lengths (89-99%) and loses it past them (33-49% at 256, chance
#   33%). Adding 1 mod 3 is a rotation by a third of a turn; a real eigenvalue cannot do it in one step, and no model
#   here finds another way that holds past the lengths it saw.
# * The flip, measured: the trained wide models' most negative eigenvalue on a step that reads a 1 is about $-0.990$
#   (the first two seeds, 1500 steps), $-0.9978$ (the third, 1500 steps) and $-0.9996$ (the third after 6000, in the
#   run with the stretched warmup). A
#   tracked sign shrinks as $|\lambda|^n$ over $n$ flips ($0.99^{500} \approx 0.007$, $0.9996^{500} \approx 0.82$),
#   which accounts for the first two seeds' fall at 1024 and the long run's hold there; it does not account for the
#   third seed's 82.9% at 256 after 1500 steps (its flip was already $-0.998$): that cause is not measured.
#
# ## 8. Reduced runs, live
#
# The same protocols at toy size, into a temporary folder (CI runs the same, and asserts each control):
# selective copying (`python -m seqmix.experiments.selective_copy --quick`) and state tracking (`--quick`: one
# layer of width 32, parity at length 16, tested at 64).

# %%
from seqmix.experiments import state_tracking  # noqa: E402

start = time.perf_counter()
with tempfile.TemporaryDirectory() as tmp:
    quick = selective_copy.run(selective_copy.QUICK, Path(tmp), progress=False)
    for r in quick.select(phase="test"):
        h = r["history"]
        print(f"selective copying, {r['arch']:9s} validation loss {h[0][3]:.2f} -> {h[-1][3]:.2f} in {r['steps']} "
              f"steps, test accuracy {100 * r['test_accuracy']:.1f}%")
    quick = state_tracking.run(state_tracking.QUICK, Path(tmp), progress=False)
    for r in quick.select(phase="test"):
        print(f"parity, {r['arch']:10s} at length 16: {100 * r['test_accuracy']:.1f}%, past 16 at length 64: "
              f"{100 * r['accuracy_past_train_at_64']:.1f}%")
print(f"{time.perf_counter() - start:.0f} s")

# %% [markdown]
# ## 9. A model you watch learn
#
# Everything above was trained elsewhere, for core-hours, and read back from JSON and weights. This section trains
# one model here, now, with the experiments' own pieces: the RWKV-7 of `zoo.build("rwkv7")` (2 layers, BlinkDL's
# training start) on MQAR from `data.mqar`, trained by `training.Run` (AdamW, warmup then cosine decay) at batch 32
# and a rate of $10^{-2}$, the top of Zoology's grid. It is smaller than the full runs so that it fits the
# notebook: width $C = 32$ (two heads of 16), $N = 4$ pairs in $T = 32$ tokens, vocabulary 64, 300 steps, 7 to 20 s of
# CPU time on this project's machines (the cell prints it). Every 25 steps it is scored on 256 held-out
# sequences, and the curve is redrawn.
#
# Three levels frame the curve. An untrained model spreads its guess over the whole vocabulary: about $1/V$. A model
# that has learned the task's format but stored nothing knows that the answer is one of the $N$ values in the
# context, and is right $1/N$ of the time: the plateau. Only a model that stores the pairs and finds one by its key
# climbs above it.

# %%
import copy  # noqa: E402
from functools import partial  # noqa: E402

from seqmix.experiments import mechanism, plots  # noqa: E402
from seqmix.experiments.data import TEST, VALID  # noqa: E402
from seqmix.experiments.training import Budget, Run  # noqa: E402

live_pairs, live_length, live_vocab = 4, 32, 64
live_task = partial(data.mqar, seq_len=live_length, num_pairs=live_pairs, vocab_size=live_vocab)
live = Run(build=partial(zoo.build, "rwkv7", vocab_size=live_vocab, width=32, train_length=live_length),
           forward=zoo.logits, sample=live_task, lr=1e-2, seed=0,
           budget=Budget(steps=300, batch_size=32, eval_every=25),
           valid=live_task(data.held_out_rng(VALID, live_pairs, live_length), 256))

fig, ax = plt.subplots(figsize=(6, 3.2))
shown = display(fig, display_id=True)
while live.step < live.budget.steps:
    live.train_to(live.step + live.budget.eval_every, progress=False)
    steps, accuracy = zip(*((h[0], h[2]) for h in live.history))
    ax.clear()
    ax.plot(steps, accuracy, marker="o", ms=3, label="RWKV-7, validation")
    ax.axhline(1 / live_pairs, color="k", ls="--", lw=0.8, label="1/N: the format, no pairs")
    ax.axhline(1 / live_vocab, color="k", ls=":", lw=0.8, label="1/V: untrained")
    ax.set(xlim=(0, live.budget.steps), ylim=(0, 1.02), xlabel="training step (batch 32)",
           ylabel="accuracy at the queries", title=f"MQAR, N = {live_pairs}, T = {live_length}: step {live.step}")
    ax.legend(fontsize=8, loc="center right")
    shown.update(fig)
plt.close(fig)
print(f"{live.step} steps in {live.cpu_seconds:.0f} s of CPU time ({live.seconds:.0f} s wall clock)")

# %% [markdown]
# The check: on 1000 test sequences that neither training nor validation drew, the trained model must be right at
# least 75% of the time, three times the plateau of a model that stored nothing. (Six seeds of this setting reached
# 87.5% to 100% in 300 steps on this project's machine; the margin is for other machines, whose last bits differ.)

# %% tags=["nbval-check-output"]
live_test = live_task(data.held_out_rng(TEST, live_pairs, live_length), 1000)
live_accuracy = evaluate(zoo.logits, live.model, *live_test)["accuracy"]
print(f"test accuracy at least 75% (the plateau 1/N = {1 / live_pairs:.0%}): {live_accuracy >= 0.75}")
assert live_accuracy >= 0.75, f"the live model did not learn recall: {live_accuracy:.1%}"

# %%
print(f"test accuracy: {100 * live_accuracy:.1f}%")           # the number itself (not compared)

# %% [markdown]
# **What it learned.** `mechanism.rwkv7_readout` runs the model on test sequences with each WKV-7 call caught, and at
# every query takes what the state returns, $y_t = S_t r_t$ (before the group norm), and compares it (cosine, averaged
# over heads and sequences) with the value $v$ the same layer wrote at each pair's value token: row $i$ is the query
# of pair $i$, column $j$ the value of pair $j$. A layer whose state works as an associative memory, reading back the
# value stored under the queried key, shows a diagonal that stands apart from the rest; its sign is free, since the
# group norm and the output projection after it can flip it. (Section 4's mechanism figure draws the same for the
# committed full-size model.)

# %%
readouts = [mechanism.rwkv7_readout(live.model, live_test[0][:200], live_test[1][:200], layer)
            for layer in range(len(live.model.blocks))]


def diagonal_contrast(readout):
    """|mean of the diagonal - mean off it|: how far the right pair's value stands apart from the others."""
    return abs(np.diag(readout).mean() - readout[~np.eye(len(readout), dtype=bool)].mean())


with tempfile.TemporaryDirectory() as tmp:
    plots.recall_mechanism(None, readouts, Path(tmp) / "live_readout.png")
    display(Image(str(Path(tmp) / "live_readout.png")))
print("contrast of the diagonal, per layer:", ", ".join(f"{diagonal_contrast(r):.2f}" for r in readouts))

# %% [markdown]
# A picture can mislead, so the reading is tested by surgery: in a copy of the trained model, zero one layer's
# time-mix output projection (`blocks[l].att.output.weight`), so that nothing its WKV-7 state returns reaches the
# rest of the model, and score the copy on the same test sequences. The check: cutting one of the two layers takes
# the accuracy below 50%, i.e. the model cannot recall without what that layer's state returns.

# %% tags=["nbval-check-output"]
cut_accuracy = []
for layer in range(len(live.model.blocks)):
    cut = copy.deepcopy(live.model)
    with torch.no_grad():
        cut.blocks[layer].att.output.weight.zero_()
    cut_accuracy.append(evaluate(zoo.logits, cut, *live_test)["accuracy"])
print("cutting one layer's time mix takes the accuracy below 50%:", min(cut_accuracy) < 0.5)
assert min(cut_accuracy) < 0.5, f"accuracy with each layer's time mix cut: {cut_accuracy}"

# %%
print("accuracy with the time mix of layer 0, 1 cut:", ", ".join(f"{100 * a:.1f}%" for a in cut_accuracy))

# %% [markdown]
# In the run committed with this notebook (seed 0), the memory is layer 0: its readout's diagonal stands apart
# (a contrast of about 0.5), cutting it leaves 24%, the plateau $1/N$ of a model that knows the format and stores
# nothing, and cutting layer 1 costs almost nothing. The solution is not unique. Six seeds of this setting, tried on
# this project's machine, reached 87.5% to 100% test accuracy in 300 steps; three put the memory in layer 0 and three
# in layer 1 (the cut said which: it left 3% to 24%), and the readout's diagonal stood out clearly in only two
# of them. The readout is one way of looking; the cut is the test.

# %% [markdown]
# ## 10. The family on the tasks
#
# The rungs of [notebook 12](12_the_family.ipynb)'s family (linear attention, a decay per head, a decay per key
# channel, the delta rule with $\beta$ up to 1 and up to 2, the gated delta rule) trained as models on this
# notebook's MQAR and section 7's parity: RWKV-7's frame with the rung's transition, run by the production WKV-7 op
# ([`experiments/family_tasks.py`](../experiments/family_tasks.py), rows in
# [`family_tasks.md`](../experiments/results/family_tasks.md)). One to three seeds per rung, at the rate the published
# RWKV-7 chose there; three seeds for each control, which runs here beside the rows it guards. Parity's control
# (RWKV-7, wide rate) missed its rule in 1500 steps on this machine on seeds 0 and 1 (84.0% and 87.7% at 4x the
# length, the rule 90%; 97.5% and 98.9% in state_tracking.json, made on another CPU), and seed 0 holds with 4x
# the steps (99.3%), as does seed 1 (100.0%): the control holds. MQAR's control, Zoology's attention, holds at
# $N = 4$ (seeds 0 and 1 with 4x the steps; seed 1's longer run stopped early at step 800, inside the budget it had
# missed, so its slower cosine rescued it, not its steps) and fails at $N = 8$ (seed 1 at chance, 15.0%, with 4x
# the steps; with a constant rate it learns: the cosine decay, section 5), as in section 5: the $N = 8$ rows are measurements, not verdicts. Every job of the plan has run.
#
# | task | model | test accuracy | parity past 64, at 256 / 1024 |
# |---|---|---|---|
# | parity | rwkv7_wide (control), seeds 0, 1, 2 | 100.0% each | 84.0%, 87.7%, 100.0% / 56.9%, 59.1%, 68.2% |
# | parity | rwkv7_wide (control), seeds 0 and 1, 4x the steps | 100.0% each | 99.3%, 100.0% / 73.4%, 68.4% |
# | parity | delta_rule, seeds 0, 1, 2 | 66.4%, 69.2%, 67.7% | 49.8%, 49.9%, 49.5% / 50.1%, 50.0%, 50.0% |
# | parity | delta_rule_wide, seeds 0, 1, 2 | 100.0% each | 100.0%, 99.8%, 75.9% / 98.9%, 92.8%, 52.4% |
# | parity | linear_attention, gla, retention, gated_delta_rule | 69.6%, 61.4%, 68.3%, 75.5% | 49.9-50.2% / 50.0-50.2% |
# | MQAR N = 4 | delta_rule, gla, linear_attention, retention (three seeds each) | 99.6-99.95% | - |
# | MQAR N = 4 | delta_rule_wide, gated_delta_rule | 99.8%, 99.85% | - |
# | MQAR N = 4 | attention_zoology (control), seeds 0, 1, 2; seeds 0 and 1 with 4x the steps | 29.2%, 94.8%, 99.2%; 99.4%, 99.7% | - |
# | MQAR N = 8 | delta_rule, gla, linear_attention, retention (three seeds each) | 99.2-100.0% | - |
# | MQAR N = 8 | delta_rule_wide, gated_delta_rule | 99.4%, 99.5% | - |
# | MQAR N = 8 | attention_zoology (control), seeds 0, 1, 2; seed 1 with 4x the steps | 99.8%, 13.7%, 99.4%; 15.0% | - |
#
# Read: with $\beta$ up to 2 the delta rule keeps parity far past the training length, with $\beta$ up to 1 it
# does not, nor does any rung whose transition's eigenvalues lie in $[0, 1]$ (Grazzi et al.; the delta rules on
# three seeds: with $\beta$ up to 2 it fits parity on all three and keeps it past the training length on two, the
# third falling to 75.9% at 256; the other rungs on one seed each); at
# $N = 4$ every rung recalls, decayed sums and linear attention included (and at $N = 8$ too, measured under a
# failing control), so the capacity limits the literature describes are not reached at this width and head size. [docs/experiments.md](../docs/experiments.md)
# reads the rows against the literature; notebook 12's synthesis table quotes them.

# %% [markdown]
# ## Summary
#
# * The positive controls are what make the other rows readable. RWKV-7's extended eigenvalue range buys parity past
#   the training length (two seeds of three at 1500 steps, the third with 6000): that control holds. Recall's control, Zoology's attention, learns $N = 4$ at width 64 on every seed (the
#   third with 4x the steps): it holds there. At $N = 8$ two seeds learn within 1000 steps and the third stays at
#   chance even with 4000: it fails there, so the $N = 8$ rows are measurements, not verdicts. Its cause is the
#   cosine decay: the same 4000 steps at a constant rate learn it.
#   The project's own attention solves MQAR on two seeds of three; its third stays at chance even with 4000 steps
#   and the same warmup, and it stays at chance at $N = 8$, where Zoology's shape learns.
# * A failure is read only beside its longer run: RWKV-4, at chance on MQAR after 1000 steps, reaches 89.6% with
#   4000 (the same warmup; still rising), and attention's third control seed does not leave chance even then.
# * Every cell of the grids has run; the runs are resumable, and the tables above say which cells are done.
# * `python -m seqmix.experiments.recall`, `.selective_copy` and `.state_tracking` resume where they stopped;
#   `--quick` runs in seconds to a minute.
#
# Next: [notebook 10](10_extrapolation.ipynb) trains a RoPE transformer and tests the ReRoPE post's table.

# %% [markdown]
# ## Exercises
#
# Each coding exercise has a stub to fill in (it raises `NotImplementedError` until you do), a check cell below it
# that says "not attempted yet", "correct" or what is off, and the solution in a collapsed cell starting
# `# Solution` (click the three dots to open it). Questions have their worked answer in a collapsed cell too.
#
# **1. The erase term, by hand.** Section 2 says that the delta rule removes what was stored at a key before it
# writes there, and a plain sum does not. Write the update of one head in NumPy, `delta_write(S, kappa, v)`
# $= S(I - \kappa\kappa^\top) + v\kappa^\top$ for a unit key $\kappa$ (state indexed [value, key], as
# `reference.wkv7`). The check stores four values at orthonormal keys, then a *new* value at the second key, and
# compares your state with `reference.wkv7`'s (no decay, $\log w = 0$; $a = -\kappa$, $b = \kappa$, $k = \kappa$)
# and what reading every key, $y = S\kappa_i$, returns with each key's latest value. Then try the plain sum
# $S + v\kappa^\top$ in your function: which check fails, and what does the sum return at the rewritten key?

# %%
# Exercise 1: the delta rule's write
def delta_write(S, kappa, v):
    """One head's state after writing value v at unit key kappa: S (I - kappa kappa^T) + v kappa^T."""
    raise NotImplementedError("Exercise 1: your code here")


# %% tags=["nbval-check-output"]
from seqmix.kernels.testing import REFERENCE_BUDGET, exercise
from seqmix.reference import wkv7 as ref7

rng = np.random.default_rng(0)
n = 8                                                          # the head size
keys = np.linalg.qr(rng.standard_normal((n, n)))[0][:, :4].T   # 4 orthonormal keys, one per row
values = rng.standard_normal((5, n))                           # the 5th: a new value for key 1
order = [0, 1, 2, 3, 1]                                        # the key of each write


def store(write):
    S = np.zeros((n, n))
    for key, value in zip(order, values):
        S = write(S, keys[key], value)
    return S


def checks_1():
    kappa = keys[order][None, :, None, :]                      # (B, T, H, N) = (1, 5, 1, 8)
    _, S_ref = ref7.wkv7(kappa, np.zeros_like(kappa), kappa, values[None, :, None, :], -kappa, kappa)
    check("delta_write, five writes, vs reference.wkv7's state", store(delta_write), S_ref[0, 0], REFERENCE_BUDGET)
    latest = values[[0, 4, 2, 3]]                              # key 1 now holds the 5th value
    check("reading each key returns its latest value", keys @ store(delta_write).T, latest, REFERENCE_BUDGET)


exercise("Exercise 1", checks_1)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# The plain sum keeps both writes at key 1: reading it returns the old value plus the new one, so the state check
# and the reading check both fail for it.
def delta_write(S, kappa, v):
    return S @ (np.eye(len(kappa)) - np.outer(kappa, kappa)) + np.outer(v, kappa)


read_sum = keys @ store(lambda S, kappa, v: S + np.outer(v, kappa)).T
check("plain sum at the rewritten key = old value + new value", read_sum[1], values[1] + values[4],
      REFERENCE_BUDGET)
exercise("Exercise 1", checks_1)

# %% [markdown]
# **2. Before training.** Run section 9's accuracy check and its readout on the model as it started:
# `torch.manual_seed(live.seed)` and then `live.build()` give the run's start. The check fails, and no layer's
# diagonal stands out. Its accuracy is not even the plateau's $1/N$: why, and what is it close to?

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# Untrained, the model spreads its guess over the whole vocabulary of 64 tokens, not over the 4 values in the
# context: it is right about 1/V of the time. Learning the format (the answer is a value seen) gives 1/N; only
# recall gives more.
torch.manual_seed(live.seed)
untrained = live.build()
start_accuracy = evaluate(zoo.logits, untrained, *live_test)["accuracy"]
start_contrast = max(diagonal_contrast(mechanism.rwkv7_readout(untrained, live_test[0][:200], live_test[1][:200],
                                                                layer)) for layer in range(len(untrained.blocks)))
print(f"untrained: accuracy at least 75%: {start_accuracy >= 0.75}; below 1/N: {start_accuracy < 1 / live_pairs}; "
      f"within a factor 3 of 1/V: {1 / (3 * live_vocab) < start_accuracy < 3 / live_vocab}")
print(f"untrained: every layer's contrast below 0.1: {start_contrast < 0.1}")
assert start_accuracy < 1 / live_pairs and start_contrast < 0.1

# %% [markdown]
# **3. Partial recall.** Cutting the memory layer in section 9 left the model near $1/N$, a memory of no pair. In
# between lies a state that keeps only the last $m$ pairs written (a decay that forgets the older ones) and, for a
# query it cannot place, guesses uniformly among the values it cannot place either. Derive its accuracy on MQAR with
# $N$ pairs, and write it as `partial_recall_accuracy(m, N)`. The check plays the rule on section 9's test
# sequences (for each query, which pair it asks for, scored 1 or the guess's chance) for $m = 0, \dots, N$. (Hint:
# each key is queried exactly once.)

# %%
# Exercise 3: the accuracy of a memory of the last m pairs
def partial_recall_accuracy(m, N):
    """Expected accuracy of a state that keeps the last m of N pairs and guesses among the values it lost."""
    raise NotImplementedError("Exercise 3: your code here")


# %% tags=["nbval-check-output"]
def checks_3():
    test_inputs, test_targets = live_test
    rows, cols = np.nonzero(test_targets != data.IGNORE)
    asked = np.array([np.flatnonzero(test_inputs[r, 0:2 * live_pairs:2] == test_inputs[r, c])[0]
                      for r, c in zip(rows, cols)])              # the pair each query asks for, 0 = written first
    for m in range(live_pairs + 1):
        remembered = asked >= live_pairs - m                      # one of the last m pairs written
        played = np.where(remembered, 1.0, 1.0 / max(live_pairs - m, 1)).mean()
        check(f"m = {m}: your formula vs the rule played on the test sequences", partial_recall_accuracy(m, live_pairs),
              played, REFERENCE_BUDGET)


exercise("Exercise 3", checks_3)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# Each key is queried once: m queries are answered right, and each of the other N - m has a 1 / (N - m) chance,
# so (m + 1) / N per sequence, and 1 from m = N - 1 on (the last pair left is the answer by elimination).
def partial_recall_accuracy(m, N):
    return min(1.0, (m + 1) / N)


exercise("Exercise 3", checks_3)

# %% [markdown]
# **4. Another rung, retrained live.** Section 9's model is RWKV-7, whose state is a matrix per head with the delta
# rule's erase. Swap it for RWKV-4 (`"rwkv4"`: a diagonal transition, no query, $2C$ numbers a layer) in the same
# 300-step run, everything else unchanged. Predict first, from section 5: in 300 steps at width 32, does RWKV-4
# leave the plateau $1/N$? Write your prediction as `my_prediction()`, returning `"plateau"` (below 50% test
# accuracy) or `"recall"` (at least 75%, section 9's bar). The check then trains the model (a few seconds), scores
# it on section 9's 1000 test sequences and compares. (Try `"mamba"` too, by changing `RUNG`: its run takes longer.)

# %%
# Exercise 4: predict, then retrain with another state
RUNG = "rwkv4"


def my_prediction():
    """'plateau' or 'recall': what RUNG reaches in section 9's 300 steps."""
    raise NotImplementedError("Exercise 4: your prediction here")


# %% tags=["nbval-check-output"]
def retrained(rung):
    """Section 9's run, the same data, rate, seed and budget, with another model."""
    run = Run(build=partial(zoo.build, rung, vocab_size=live_vocab, width=32, train_length=live_length),
              forward=zoo.logits, sample=live_task, lr=1e-2, seed=0,
              budget=Budget(steps=300, batch_size=32, eval_every=300), valid=live.valid)
    run.train_to(run.budget.steps, progress=False)
    return evaluate(zoo.logits, run.model, *live_test)["accuracy"]


def checks_4():
    predicted = my_prediction()
    assert predicted in ("plateau", "recall"), f"my_prediction() should return 'plateau' or 'recall', got {predicted!r}"
    accuracy = retrained(RUNG)
    measured = "recall" if accuracy >= 0.75 else "plateau" if accuracy < 0.5 else "in between"
    print(f"{RUNG} after 300 steps: {measured} (below 50%: {accuracy < 0.5}; at least 75%: {accuracy >= 0.75})")
    assert predicted == measured, f"you predicted {predicted!r}; the run says {measured!r}"


exercise("Exercise 4", checks_4)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# The plateau. Section 5: at C = 64, N = 4, RWKV-4 stays at chance for 1000 steps at every rate of the grid and needs
# 4000 to recall (89.6%). Here it has half the width and 300 steps: a decayed sum per channel can hold pairs only
# through many channels each keeping one, which takes width or long training, while RWKV-7's delta rule writes each
# pair at its own key from the start.
def my_prediction():
    return "plateau"


exercise("Exercise 4", checks_4)
