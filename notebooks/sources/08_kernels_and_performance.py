# %% [markdown]
# # 08 · Kernels and performance: from a formula to a Triton program, and what it costs
#
# The earlier notebooks checked every Triton kernel against the float64 reference, but ran each one as a black box.
# This one opens two of them. How a Triton program maps onto a formula: the launch grid and the program ids, the
# blocks of lanes with their masks, the recurrent state kept in registers across a sequential loop over time; shown
# on the RWKV-4 WKV forward kernel (one program per batch row and block of channels) and the RWKV-7 forward kernel
# (one program per batch row, head and block of rows of the state), each launched here by hand, with different block
# sizes, against the reference. Then what the CPU run is and is not: the Triton interpreter against the compiled GPU
# build, which `python -m seqmix.kernels.aot` produces without a GPU (registers and spills per kernel). Last, the
# benchmarks: the stored results of `python -m seqmix.benchmarks.run` (ratios against what a user would otherwise
# run, time per token against sequence length, the GPU cost model, with the bytes per token counted by hand), which
# every claim here rests on, and a small live timing, labelled as indicative. Exercises close the notebook.
#
# **Sources.** The Triton language and its programming model, https://triton-lang.org (program ids, blocks, the
# interpreter); the formulas are those of notebooks 02 (RWKV-4 WKV, after the Hugging Face RWKV page,
# https://huggingface.co/docs/transformers/model_doc/rwkv) and 04 (RWKV-7, after
# https://www.cnblogs.com/Ctrl-cCtrl-v/p/18906192 and arXiv:2503.14456). FlashAttention, arXiv:2205.14135,
# https://arxiv.org/abs/2205.14135, for why memory traffic rather than arithmetic sets the speed of such kernels.
#
# **Code used.** [`kernels/wkv4/`](../kernels/wkv4/__init__.py): `wkv4_fwd_kernel`, `_launch_config` ·
# [`kernels/wkv7/`](../kernels/wkv7/__init__.py): `wkv7_fwd_kernel`, `_step`, `_launch_config` ·
# [`kernels/aot.py`](../kernels/aot.py): the ahead-of-time GPU build · [`benchmarks/`](../benchmarks/README.md):
# `run.py`, `cost_model.py` and the stored `results/` · [`reference/wkv4.py`](../reference/wkv4.py),
# [`reference/wkv7.py`](../reference/wkv7.py): the truth · [`kernels/testing.py`](../kernels/testing.py): `check` and
# the error budgets.

# %%
import seqmix

MODE = seqmix.use_interpreter_without_gpu()    # without a GPU: TRITON_INTERPRET=1, before triton is imported

import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
import triton

import seqmix.kernels.wkv4 as k4
import seqmix.kernels.wkv7 as k7
from seqmix.kernels.testing import FP32_BUDGET, REFERENCE_BUDGET, check, rel_rms
from seqmix.reference import wkv4 as ref4
from seqmix.reference import wkv7 as ref7

REPO = Path(seqmix.kernels.__file__).resolve().parents[1]
rng = np.random.default_rng(0)
torch.manual_seed(0)
print("Triton kernels run on:", MODE)

# %% [markdown]
# ## 1. A Triton program
#
# A Triton kernel is a function that describes **one program** of a grid. Launching it, `kernel[grid](args...)`,
# runs one instance per point of the grid, each knowing its coordinates through `tl.program_id(axis)`. Inside, the
# unit of work is a **block**: `tl.arange(0, BLOCK)` is a vector of BLOCK lanes, and every operation on it acts on all
# lanes at once (on a GPU the lanes are spread over the threads of the program's warps). Memory is read and written
# through pointers plus block offsets, `tl.load(ptr + offsets, mask=...)`, with a mask for the lanes that fall past
# the end of the data. Block sizes are `tl.constexpr`: fixed at compile time, one compiled kernel per value. Values
# that live across the iterations of a loop inside the program stay in registers, unless the compiler runs out of
# them and spills some to local memory (section 4 reads the spills).
#
# So a formula becomes a kernel by choosing what one program owns (which outputs, which slice of the state), what is a
# block (the lanes computed together), and what is a loop (here: time, which a recurrence must walk in order).
#
# ## 2. The RWKV-4 WKV forward kernel
#
# Notebook 02's stable recurrence is independent per channel and per batch row: channel $c$ of sequence $b$ needs only
# its own $k_{b,t,c}, v_{b,t,c}$, the parameters $w_c, u_c$, and its own state $(\tilde N, \tilde D, M)$. So:
#
# | formula | kernel |
# |---|---|
# | one sequence $b$ | `b = tl.program_id(0)` |
# | a block of channels | `cs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)`, `mask = cs < C` |
# | $w_c, u_c$ | loaded once, before the loop |
# | the state $\tilde N, \tilde D, M$ | `num`, `den` and the pair `anchor`, `lag` ($M$ = anchor + lag $\cdot w$): registers for the whole sequence |
# | $t = 0, 1, \ldots, T-1$ | `for t in range(T)`: load $k_t, v_t$, the output step, store $y_t$, the update step |
# | the final state | stored once, after the loop |
#
# The output step is the corrected one of notebook 02, with $q = \max(u + k_t, M)$ kept implicit: `d` $= M - (u + k_t)$,
# and `tl.exp(tl.minimum(d, 0))`, `tl.exp(tl.minimum(-d, 0))` are $e^{M - q}$ and $e^{u + k_t - q}$, one of them exactly 1.
# The update step is the same with $M + w$ against $k_t$. Per token and channel the program reads two numbers and writes
# one; the state never leaves the registers. The source:

# %%
print(inspect.getsource(k4.wkv4_fwd_kernel.fn))

# %% [markdown]
# The dispatcher's launch configuration: one channel per thread, 32 channels (one warp) per program, fewer when $C$ is
# smaller; the grid is (batch rows, blocks of channels). For $B = 2$, $C = 40$ that is a $2 \times 2$ grid, and the
# second block of channels has 24 masked lanes (channels 40 to 63 do not exist). The picture, then the kernel launched
# by hand, exactly as `kernels.wkv4.wkv4` launches it, against `reference.wkv4`:

# %%
B, T, C = 2, 20, 40
launch = k4._launch_config(C)
grid = (B, triton.cdiv(C, launch["BLOCK_C"]))
print(f"launch config for C = {C}: {launch}; grid = {grid}: {grid[0] * grid[1]} programs, each walks T = {T} steps")

lanes = np.arange(grid[1] * launch["BLOCK_C"])                            # every lane of every channel block
program = np.array([[b * grid[1] + lane // launch["BLOCK_C"] for lane in lanes] for b in range(B)], dtype=float)
program[:, lanes >= C] = np.nan                                        # masked lanes
fig, ax = plt.subplots(figsize=(10, 2.4), constrained_layout=True)
ax.imshow(program, aspect="auto", cmap="tab10", vmin=0, vmax=9, interpolation="nearest")
ax.axvspan(C - 0.5, lanes[-1] + 0.5, color="lightgrey", hatch="//", alpha=0.5, label="masked lanes (channel >= C)")
for b in range(B):
    for j in range(grid[1]):
        first, last = j * launch["BLOCK_C"], min((j + 1) * launch["BLOCK_C"], C)  # the lanes it really has
        ax.text((first + last) / 2 - 0.5, b, f"program\n({b}, {j})", ha="center", va="center", fontsize=8)
ax.set_yticks(range(B))
ax.set_xlabel("channel (lane of the block)")
ax.set_ylabel("batch row b")
ax.set_title("WKV-4 forward: which program computes which (b, channel); each loops over t with its state in registers")
ax.legend(loc="upper right", fontsize=8)
plt.show()

# %%
w = -np.exp(rng.standard_normal(C))
u, k, v = rng.standard_normal(C), rng.standard_normal((B, T, C)), rng.standard_normal((B, T, C))
expected, (expected_num, expected_den, expected_max) = ref4.wkv4(w, u, k, v)

def launch_wkv4(block_c):
    # The forward kernel launched by hand: inputs fp32, state from nothing, nothing saved for a backward.
    w_, u_, k_, v_ = (torch.tensor(z, dtype=torch.float32) for z in (w, u, k, v))
    y = torch.empty(B, T, C)
    num0, den0, max0 = torch.zeros(B, C), torch.zeros(B, C), torch.full((B, C), k4.INITIAL_MAX)
    num, den, mx = torch.empty(B, C), torch.empty(B, C), torch.empty(B, C)
    unused = y                                                         # the SAVE pointers: not written when SAVE=False
    k4.wkv4_fwd_kernel[(B, triton.cdiv(C, block_c))](
        w_, u_, k_, v_, y, num0, den0, max0, num, den, mx, unused, unused, unused, unused, T, C,
        SAVE=False, BLOCK_C=block_c, num_warps=1)
    return y, num, den, mx


# %% tags=["nbval-check-output"]
for block_c in (launch["BLOCK_C"], 8, 64):
    y, num, den, mx = launch_wkv4(block_c)
    check(f"WKV-4 kernel by hand, BLOCK_C = {block_c:2d} ({triton.cdiv(C, block_c)} blocks): y", y, expected, FP32_BUDGET)
    for name, got, want in (("num", num, expected_num), ("den", den, expected_den), ("max", mx, expected_max)):
        check(f"WKV-4 kernel by hand, BLOCK_C = {block_c:2d}: state {name}", got, want, FP32_BUDGET)

# %% [markdown]
# The block size changes how the channels are dealt out, not what any channel computes: each lane runs the same
# recurrence. That independence is what makes the kernel parallel over $B \times C$, and also its limit: at most
# $B \cdot C$ lanes work at once, each on $T$ steps in a row (section 5 comes back to this).
#
# ## 3. The RWKV-7 forward kernel: rows of the state
#
# RWKV-7's state is an $N \times N$ matrix per head, and the update couples its entries:
# $S\,\mathrm{diag}(w) + (S a)\, b^\top + v k^\top$. But only within a row. Row $i$ of the new state is
# $S_{i,:} \odot w + (S_{i,:} \cdot a)\, b + v_i\, k$: it needs row $i$ of the old state, $v_i$, and the key-side
# vectors $w, a, b, k$, which every row shares. Rows evolve independently, and so do the outputs:
# $y_{t,i} = S_{t,i,:} \cdot r_t$. The kernel gives each program a block of `BLOCK_V` rows of one head of one sequence:
#
# | formula | kernel |
# |---|---|
# | sequence $b$ and head $h$ | `pid_bh = tl.program_id(0)` ($= b \cdot H + h$) |
# | rows $i$ of $S$ (value channels) | `rows = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)` |
# | key channels $j$ | `keys = tl.arange(0, N)`: all of them, a (BLOCK_V, N) tile |
# | $S_t$ (those rows) | `S`: a (BLOCK_V, N) fp32 tile in registers for the whole sequence |
# | the update | `_step`: `S * w[None, :] + sa[:, None] * b[None, :] + v[:, None] * k[None, :]`, `sa` $= S a$ by a row sum |
# | $y_t = S_t r_t$ | `tl.sum(S * r[None, :], axis=1)` |
#
# Each program reloads the key-side vectors $r, w, k, a, b$ (those are shared) and its own slice of $v$. First the
# independence of the rows: one step computed as the kernel computes it, block of rows by block of rows, in NumPy
# with the kernel's own expressions, against one step of `reference.wkv7` on the whole state (an independent
# implementation, with its own $r$: a block that needed another block's rows would fail this). Then the kernel's
# update and forward loop; then the kernel launched by hand with several `BLOCK_V`, against `reference.wkv7`.

# %%
N, BLOCK_V = 8, 4
S = rng.standard_normal((N, N))                                   # one head's state, [value, key]
r7, k7_, v7, a7, b7 = (rng.standard_normal(N) for _ in range(5))
log_w7 = -np.exp(rng.standard_normal(N))                          # decays exp(log_w7) in (0, 1)
w7 = np.exp(log_w7)

def kernel_step(S_rows, v_rows):
    # One step for a block of rows, with _step's and the output's expressions: (new rows, their y).
    sa = (S_rows * a7[None, :]).sum(axis=1)                   # tl.sum(S * a[None, :], axis=1)
    S_rows = S_rows * w7[None, :] + sa[:, None] * b7[None, :] + v_rows[:, None] * k7_[None, :]
    return S_rows, (S_rows * r7[None, :]).sum(axis=1)         # tl.sum(S * r[None, :], axis=1)

blocks = [kernel_step(S[i:i + BLOCK_V], v7[i:i + BLOCK_V]) for i in range(0, N, BLOCK_V)]
S_blocks, y_blocks = np.concatenate([b[0] for b in blocks]), np.concatenate([b[1] for b in blocks])
one_step = [x[None, None, None] for x in (r7, log_w7, k7_, v7, a7, b7)]   # each (1, 1, 1, N)
y_ref, S_ref = ref7.wkv7(*one_step, state=S[None, None])

# %% tags=["nbval-check-output"]
check(f"one step in blocks of {BLOCK_V} rows vs reference.wkv7: state", S_blocks, S_ref[0, 0],
      REFERENCE_BUDGET)
check(f"one step in blocks of {BLOCK_V} rows vs reference.wkv7: y = S r", y_blocks, y_ref[0, 0, 0],
      REFERENCE_BUDGET)

# %%
print(inspect.getsource(k7._step.fn))
source = inspect.getsource(k7.wkv7_fwd_kernel.fn)
print(source[source.index("    pid_bh"):])                              # the body, after the commented arguments

# %%
B7, T7, H = 2, 16, 2
x7 = dict(r=rng.standard_normal((B7, T7, H, N)), log_w=-np.exp(rng.uniform(-8.0, -0.5, (B7, T7, H, N))),
          k=rng.standard_normal((B7, T7, H, N)), v=rng.standard_normal((B7, T7, H, N)))
kk = rng.standard_normal((B7, T7, H, N))
kk /= np.linalg.norm(kk, axis=-1, keepdims=True)
x7.update(a=-kk, b=kk * rng.uniform(0.0, 1.0, (B7, T7, H, N)))
S7 = rng.standard_normal((B7, H, N, N))
y7_ref, S7_ref = ref7.wkv7(*(x7[n] for n in ("r", "log_w", "k", "v", "a", "b")), state=S7)

def launch_wkv7(block_v):
    # The forward kernel by hand: a program per (batch * head, block of block_v rows); from S7, no checkpoints.
    inputs = [torch.tensor(x7[n], dtype=torch.float32) for n in ("r", "log_w", "k", "v", "a", "b")]
    y, state = torch.empty(B7, T7, H, N), torch.empty(B7, H, N, N)
    k7.wkv7_fwd_kernel[(B7 * H, N // block_v)](
        *inputs, torch.tensor(S7, dtype=torch.float32), y, state, state, T7, H,
        N=N, BLOCK_V=block_v, CHECKPOINT=k7.CHECKPOINT, HAS_STATE0=True, SAVE_CKPT=False, num_warps=4)
    return y, state

print("the dispatcher's launch for N = 8:", k7._launch_config(N), "and for N = 64:", k7._launch_config(64))

# %% tags=["nbval-check-output"]
for block_v in (4, 2, 8):
    y, state = launch_wkv7(block_v)
    programs = B7 * H * (N // block_v)
    check(f"WKV-7 kernel by hand, BLOCK_V = {block_v} ({programs:2d} programs): y", y, y7_ref, FP32_BUDGET)
    check(f"WKV-7 kernel by hand, BLOCK_V = {block_v} ({programs:2d} programs): state", state, S7_ref, FP32_BUDGET)

# %% [markdown]
# On a GPU the choice of `BLOCK_V` trades parallelism against registers: a (BLOCK_V, N) fp32 tile over `num_warps`
# warps of 32 threads costs BLOCK_V $\cdot$ N / (32 $\cdot$ num_warps) registers per thread for $S$ alone. The
# dispatcher takes 16 rows and 4 warps: 8 registers a thread at $N = 64$, 16 at $N = 128$, and $N / 16$ programs per
# head; the forward takes fewer rows (down to 4, on one warp) when $B H$ is too small to give two programs per SM of an
# H100. The backward kernel walks time in reverse and needs the state at every step: it stores one every 16 steps
# (`CHECKPOINT`) in the forward and recomputes the steps in between.
#
# ## 4. The interpreter and the compiled build
#
# With `TRITON_INTERPRET=1` (which `seqmix.use_interpreter_without_gpu()` sets when there is no GPU), `@triton.jit`
# returns an interpreted function: a launch runs the programs of the grid one after another in Python, and each `tl`
# operation becomes a NumPy operation on the whole block. This checks what the kernel computes: its indexing, masks,
# arithmetic and control flow. It does not show speed (it is thousands of times slower than the compiled kernel),
# concurrency (programs never overlap, so atomics and races are not exercised as on a GPU), register pressure, or
# some dtypes (NumPy has no bfloat16).
#
# The compiled path lowers the same Python function to Triton's IR, then LLVM IR, PTX, and a cubin for one GPU
# architecture. None of that needs a GPU, only the compiler that ships with triton: `python -m seqmix.kernels.aot` compiles
# every kernel for sm_80 (A100) and sm_90 (H100) at the configurations the dispatchers choose, and reads the
# resources of each cubin with `cuobjdump`. Run here for the two forward kernels above, in a separate process (the
# compiled path needs triton imported without the interpreter):

# %%
environment = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
aot_script = ("from seqmix.kernels import aot\n"
              "for label in ('wkv4_fwd C=768 fp32', 'wkv7_fwd N=64 fp32'):\n"
              "    aot.main(['--filter', label])\n")
started = time.perf_counter()
aot_run = subprocess.run([sys.executable, "-c", aot_script], cwd=REPO, env=environment, capture_output=True, text=True)
print(aot_run.stdout)
print(f"(exit status {aot_run.returncode}; {time.perf_counter() - started:.0f} s, compiling included)")

# %% [markdown]
# How to read it: `regs` are the registers each thread holds; `spill B` (local memory) would be registers that did not
# fit and went to memory: 0 means the state stays in registers, as intended. (The WKV-7 forward's few bytes of shared
# memory are for its reductions across warps, the row sums $S a$ and $S r$.) A GPU's register file is 64K 32-bit registers per SM, so a kernel at 40-60
# registers a thread leaves room for many programs per SM at once. Within a program, each time step's loads are issued
# one step ahead (the values of step $t + 1$ are loop variables while step $t$ computes), so a step does not wait a
# whole memory round trip.
#
# ## 5. The benchmarks
#
# `python -m seqmix.benchmarks.run` times every op beside what a user would otherwise run (transformers' loops for RWKV-4
# and Mamba, a per-token loop for RWKV-7, `scaled_dot_product_attention`), beside one streaming pass over the same
# tensors (the least memory traffic any implementation must pay), at $T$ = 1k to 16k, and writes
# `benchmarks/results/` (see [`benchmarks/README.md`](../benchmarks/README.md) for the method). Running it takes
# about ten minutes on this machine, so the notebook reads the stored results instead. They come from a 2-core CPU
# (no GPU): the torch backend, not the Triton kernels.

# %%
results = json.loads((REPO / "benchmarks" / "results" / "results.json").read_text())
run = results["run"]
print(f"{run['command']}  ({run['date']}, {run['seconds'] / 60:.0f} min)")
print("machine:", run["machine"])
print()
print(f"{'op':7s} {'T':>6s}  {'against':40s} {'metric':15s} {'ratio':>8s}  target            met")
for c in results["checks"]:
    print(f"{c['op']:7s} {c['T']:>6d}  {c['vs']:40s} {c['metric']:15s} {c['ratio']:>7.3g}x  {c['target']:17s} {c['met']}")

# %% [markdown]
# A ratio is the other implementation's time (or memory) over seqmix's: above 1, seqmix is faster (or smaller). The
# "time per token" rows compare $T$ = 8192 with $T$ = 1024: all three recurrent ops are linear in $T$. The targets are
# read against what `backend=None` runs for inference on a CPU: for the three recurrences that is the C loop of
# `kernels/<op>/<op>.c` ("seqmix c"), which walks time once like the Triton kernels do on a GPU. The chunked torch
# backend ("seqmix torch", the one that also differentiates) is measured beside it: in eager torch the chunked forms
# are about twenty passes over memory each, and the benchmarks' README explains in numbers why no rearrangement of
# them reached the targets. The time per token against $T$, drawn from the stored samples (one colour per
# implementation in every panel; in the attention panel "seqmix torch" *is* torch's SDPA, so the two lines
# coincide):

# %%
OPS = {"wkv4": "RWKV-4 WKV", "wkv7": "RWKV-7 WKV", "ssm": "selective scan",
       "rerope": "ReRoPE prefill", "attention": "causal attention (seqmix torch = SDPA)"}
# One colour per implementation in every panel; every other implementation is the op's peer, in C2.
STYLE = {"seqmix c": ("C0", "o-"), "seqmix torch": ("C1", "o-"), "one streaming pass": ("k", ":"),
         "two-pass (source)": ("C3", "s--")}
# Two rows of three at 10 inches: the figure stays under 1250 px wide (the project's limit) with readable labels.
fig, axes = plt.subplots(2, 3, figsize=(10, 6.4), constrained_layout=True)
lines = {}                                          # label -> a line, for one shared legend
for ax, (op, title) in zip(axes.flat, OPS.items()):
    rows = [r for r in results["rows"] if r["op"] == op and r["status"] == "ok"]
    for impl in dict.fromkeys(r["impl"] for r in rows):
        points = sorted((r["T"], r["median_s"] / r["T"]) for r in rows if r["impl"] == impl)
        colour, style = STYLE.get(impl, ("C2", "s--"))
        lines[impl], = ax.loglog(*zip(*points), style, color=colour, ms=4)
    ax.set_title(f"{title}\n{rows[0]['shape']}", fontsize=10)
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("median time per token (s)")
key = axes.flat[-1]
key.axis("off")
key.legend(lines.values(), lines.keys(), loc="center", fontsize=8.5,
           title="stored results (CPU, fp32)\nflat = linear in T;\nattention, ReRoPE: quadratic")
plt.show()

# %% [markdown]
# The benchmark's own figure, time and memory against $T$, is stored as
# [`benchmarks/results/scaling.png`](../benchmarks/results/scaling.png):
#
# ![time and memory against T](../benchmarks/results/scaling.png)
#
# **The GPU cost model.** With no GPU to time the Triton kernels, `benchmarks/cost_model.py` counts, from each
# kernel's own loops, the bytes it moves and the operations it does per token, and predicts an H100 time as the larger
# of memory time (bytes / 3.35 TB/s) and compute time, for the whole shape; registers and spills come from the
# AOT build of section 4.
# For the WKV-4 forward the count can be done by hand: per token and channel the program reads $k_t$ and $v_t$ and
# writes $y_t$, 4 bytes each in fp32, while the state stays in registers,
#
# $$\text{bytes per token} \approx 3 \cdot 4\,C = 12\,C = 9216 \ \text{ for } C = 768 ,$$
#
# plus the parameters and the state, read and written once per sequence (exercise 2 accounts for them). The forward
# kernels:

# %%
print(f"{'kernel':30s} {'shape':28s} {'bytes/token':>11s} {'FLOP/byte':>9s} {'predicted':>10s} {'bound':>24s} "
      f"{'programs x steps':>17s} {'regs':>5s} {'spill B':>7s}")
for m in results["cost_model"]:
    if m["forward"]:
        steps = f"{m['programs']} x {m['serial_steps'] or '-'}"
        print(f"{m['kernel']:30s} {m['shape']:28s} {m['bytes_per_token']:>11,.0f} {m['intensity']:>9.3g} "
              f"{m['predicted_s'] * 1e6:>8.3g}us {m['bound']:>24s} {steps:>17s} {m['aot']['regs']:>5d} "
              f"{m['aot']['spill_bytes']:>7d}")


# %% [markdown]
# How to read it: `FLOP/byte` is the kernel's arithmetic intensity; against the H100's balance point (67 fp32
# TFLOP/s over 3.35 TB/s, about 20 operations per byte, far higher for tensor-core products), it says whether memory
# traffic or arithmetic should set the time, and `bound` names the resource that does in the model. The IO-aware view
# is FlashAttention's: count the bytes first. `programs x steps` is the other limit of the recurrent kernels: they
# launch only as many programs as batch rows times channel blocks (or heads times row blocks), each walking its $T$
# steps in order; at small batch that is far fewer than a GPU needs in flight to reach its bandwidth, so the
# prediction is a floor that a latency-bound kernel will not reach, and the chunked forms (more arithmetic, fewer
# sequential steps) are the way past it.
#
# **Measured on a GPU since.** `python -m seqmix.benchmarks.gpu_check` ran on an H200 (2026-11-27) and an H100
# (2026-11-28); its records are in `benchmarks/results/gpu/`, read in
# [benchmarks/README.md](../benchmarks/README.md). The H100 run timed each kernel as the GPU spends it (calls queued
# behind a sleep, so that the host's launch latency, about 40 us a call there, does not show). Its cost-model part
# sets the prediction above beside each measured forward and forward + backward; the model claims 2x:

# %%
gpu_record = json.loads((REPO / "benchmarks/results/gpu/run4/gpu_check.json").read_text())
print(gpu_record["device"], {k: gpu_record["versions"][k] for k in ("torch", "triton")})
costed = [r for part in gpu_record["parts"] if part["name"] == "cost_model" for r in part["rows"] if r["measured_s"]]
print(f"{'op':16s} {'dtype':5s} {'mode':17s} {'predicted':>10s} {'measured':>10s} {'measured / predicted':>21s}")
for r in costed:
    print(f"{r['op']:16s} {r['dtype']:5s} {r['mode']:17s} {r['predicted_s'] * 1e3:>8.3g}ms {r['measured_s'] * 1e3:>8.3g}ms "
          f"{r['ratio']:>20.2f}x")
fig, ax = plt.subplots(figsize=(6.5, 5))
line = np.array([1e-6, 1e-1])
ax.fill_between(line, line / 2, line * 2, color="0.85", label="within 2x", zorder=0)
ax.plot(line, line, "k-", lw=0.8, label="measured = predicted", zorder=1)
for mode, marker in (("forward", "o"), ("forward+backward", "s")):
    for dtype, color in (("fp32", "C0"), ("bf16", "C3")):
        pts = [(r["predicted_s"], r["measured_s"]) for r in costed if r["mode"] == mode and r["dtype"] == dtype]
        ax.scatter(*zip(*pts), marker=marker, color=color, label=f"{dtype} {mode}", zorder=2)
ax.set(xscale="log", yscale="log", xlabel="predicted (s)", ylabel="measured on an H100 (s)",
       title="The cost model against the GPU, every Triton kernel")
ax.legend(fontsize=8)
plt.show()
# the claims in the text below, checked against the record
ratio = {(r["op"], r["dtype"], r["mode"]): r["ratio"] for r in costed}
assert all(ratio[(op, dt, "forward")] < 2 for op in ("wkv4", "wkv7", "selective_scan") for dt in ("fp32", "bf16"))
assert all(ratio[("wkv7 chunked", dt, "forward")] > 4 for dt in ("fp32", "bf16"))

# %% [markdown]
# Within 2x: the three recurrences, forward (the scan a little faster than predicted, WKV-4 and the sequential WKV-7
# 1.4-1.8x slower): their latency model, a memory round trip and a chain of exponentials per step, holds. Off: the
# chunked WKV-7 (4.3-4.8x: its serial pass over chunks also solves each chunk, which the model does not price, and
# which fla's `chunk_rwkv7`, 3.3-3.5x faster, does in parallel kernels before a pass that only carries the state);
# the bf16 flash kernels (4-5x: SDPA's flash backend takes the same time as ours at this shape, so the wgmma peak the
# model assumes is not reached with 4 heads); the fp32 flash kernels (about 3x); ReRoPE decode (8-17x: a call is six
# kernels, each at least an empty kernel's 2 us). A prediction is a floor to reason with, not a measurement. (The
# WKV-7 forward + backward rows predate a fix, measured in the next run, that took 13-26% off them: the backward
# had waited for the GPU once a call.)
#
# **A live timing (indicative).** Measured now on this machine, one thread, small shapes and growing $T$: RWKV-7's WKV
# on the torch path (chunked) and in the C loop (`backend="c"`), against the recurrence one token at a time in torch.
# Absolute numbers depend on the machine and its load; the shape of the curves is the point: all three are linear in
# $T$; the chunked form does its work in fewer, larger operations than the token loop, and the C loop does the token
# loop's own arithmetic without an operation per step. The Triton interpreter on one small case is
# timed too, to show why it is a correctness tool.

# %%
def per_token_loop(r, log_w, k, v, a, b, S):
    # The recurrence one token at a time in torch: what the chunked form replaces.
    ys = []
    for t in range(r.shape[1]):
        sa = (S @ a[:, t, :, :, None])[..., 0]
        S = S * log_w[:, t, :, None, :].exp() + sa[..., None] * b[:, t, :, None, :] + v[:, t, :, :, None] * k[:, t, :, None, :]
        ys.append((S @ r[:, t, :, :, None])[..., 0])
    return torch.stack(ys, dim=1), S

def make_inputs(T_, H_=4, N_=32):
    r, k, v = (torch.randn(1, T_, H_, N_) for _ in range(3))
    kk_ = torch.nn.functional.normalize(torch.randn(1, T_, H_, N_), dim=-1)
    return r, -torch.exp(torch.empty(1, T_, H_, N_).uniform_(-8.0, -0.5)), k, v, -kk_, kk_ * torch.rand(1, T_, H_, N_)

def best_of(fn, repeats=3):
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)

threads = torch.get_num_threads()
torch.set_num_threads(1)
lengths = (64, 128, 256, 512, 1024)
timings = {"chunked (torch backend)": [], "C loop (backend='c')": [], "per-token loop (torch)": []}
with torch.no_grad():
    for T_ in lengths:
        inputs = make_inputs(T_)
        S_ = torch.zeros(1, 4, 32, 32)
        timings["chunked (torch backend)"].append(best_of(lambda: k7.wkv7(*inputs, state=S_, backend="torch")) / T_)
        timings["C loop (backend='c')"].append(best_of(lambda: k7.wkv7(*inputs, state=S_, backend="c")) / T_)
        timings["per-token loop (torch)"].append(best_of(lambda: per_token_loop(*inputs, S_)) / T_)
    small = make_inputs(16, 1, 8)
    interpreter_time = best_of(lambda: k7.wkv7(*small, backend="triton"), 1)
    torch_small_time = best_of(lambda: k7.wkv7(*small, backend="torch"), 3)
torch.set_num_threads(threads)
print(f"Triton interpreter, T = 16, H = 1, N = 8: {interpreter_time * 1e3:.0f} ms; "
      f"torch backend: {torch_small_time * 1e3:.1f} ms (indicative)")

# %%
fig, ax = plt.subplots(figsize=(7.5, 3.8), constrained_layout=True)
for name, per_token in timings.items():
    ax.loglog(lengths, np.array(per_token) * 1e6, "o-", label=name)
ax.set_xlabel("sequence length T (B = 1, H = 4, N = 32)")
ax.set_ylabel("time per token (us), best of 3")
ax.set_title("RWKV-7 WKV on this CPU, now (indicative)")
ax.legend()
plt.show()
for name in ("chunked (torch backend)", "C loop (backend='c')"):
    ratio = np.array(timings["per-token loop (torch)"]) / np.array(timings[name])
    print(f"per-token loop / {name}, by T:", ", ".join(f"{T_}: {q:.1f}x" for T_, q in zip(lengths, ratio)))

# %% [markdown]
# ## 6. Whole models on a CPU
#
# A model adds to its recurrence the matrix products and a trail of small operations around them (norms, token-shift
# mixes, gates). Two limits bound a whole model on a CPU: decoding a token must read every weight once (one
# streaming pass over them), and a prompt must do the model's matrix products. `python -m seqmix.benchmarks.models`
# times the three models at their published small shapes (random weights) beside those limits and beside the
# runtimes a user would otherwise run; the notebook reads its stored results. Decoding one token is one C call
# (`models/decode.py`, `models/<model>/<model>_step.c`): the matrix-vector products at the memory's speed and the rest in a few
# microseconds a layer. Below, each runtime's time over its limit: 1 is the limit, the dashed line the goal (1.3x).

# %%
speed = json.loads((REPO / "benchmarks" / "results" / "models.json").read_text())["speed"]
LIMITS = {"prefill": "the matmuls alone", "decode": "one streaming pass over the weights"}
groups = list(dict.fromkeys(r["model"] for r in speed))
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
for ax, (phase, limit_name) in zip(axes, LIMITS.items()):
    for g, group in enumerate(groups):
        rows = {r["runtime"]: r[f"{phase}_tok_s"] for r in speed if r["model"] == group and f"{phase}_tok_s" in r}
        limit = rows.pop(limit_name)
        peers = {name: tok_s for name, tok_s in rows.items() if name != "seqmix"}
        fastest_peer = max(peers.values())
        for offset, (label, tok_s) in enumerate((("seqmix", rows["seqmix"]), ("fastest peer", fastest_peer))):
            ax.bar(g + 0.4 * offset - 0.2, limit / tok_s, width=0.4, color=f"C{offset}",
                   label=label if g == 0 else None)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(1.3, color="k", ls="--", lw=0.8)
    ax.set_xticks(range(len(groups)), [g.replace("float32", "fp32").replace("bfloat16", "bf16") for g in groups],
                  rotation=30)
    ax.set_ylabel(f"time / {limit_name}")
    if phase == "prefill":
        ax.set_yscale("log")                        # the peers' prompts take up to 60x the matmuls
    ax.set_title(f"{phase} (T = {1024 if phase == 'prefill' else 1} per call)")
    ax.legend()
plt.show()
for group in groups:
    rows = {r["runtime"]: r for r in speed if r["model"] == group}
    print(f"{group:15s} decode {rows['seqmix']['decode_tok_s']:6.1f} tok/s, one read of the weights "
          f"{rows[LIMITS['decode']]['decode_tok_s']:6.1f}/s; prefill {rows['seqmix']['prefill_tok_s']:7.1f} tok/s, "
          f"the matmuls alone {rows[LIMITS['prefill']]['prefill_tok_s']:7.1f} tok/s")

# %% [markdown]
# How to read it: decoding sits at the read of the weights in fp32, and below it in bf16, where the C step reads bf16
# weights faster than torch's own matrix-vector product (the limit measured here); the peers spend the difference in
# per-operation overhead. A prompt stays within the goal for the RWKV models in fp32; in bf16 the matrix products run
# on the CPU's bf16 matrix instructions, 4-5x faster than fp32's, while the recurrence and the elementwise work do not
# get faster, and Mamba's scan computes 16 exponentials per channel per token: its time alone is about that of the
# matmuls in fp32. [`benchmarks/README.md`](../benchmarks/README.md) breaks each prompt down by part.

# %% [markdown]
# ## Summary
#
# - A Triton kernel describes one program of a grid; the formula decides what a program owns. WKV-4: a batch row and
#   a block of channels, its three state numbers per channel in registers, a loop over time. WKV-7: a batch row, a head
#   and a block of rows of the $N \times N$ state, because rows of the state evolve independently (checked
#   against one step of `reference.wkv7`).
# - Launched by hand with other block sizes, both kernels still agree with the float64 reference: the block size deals
#   out the work, it does not change what is computed.
# - The interpreter checks the arithmetic and indexing of a kernel on a CPU; the AOT build (`python -m seqmix.kernels.aot`)
#   compiles the same kernels for sm_80 and sm_90 and shows their registers, with no spills.
# - The stored benchmarks: the recurrent ops are linear in $T$; on a CPU their inference runs C loops
#   (`kernels/<op>/<op>.c`) that walk time once, as the Triton kernels do on a GPU, and meet the speed targets that the
#   torch backend's chunked forms (eager torch, many passes over memory) miss, for reasons the benchmarks' README
#   gives in numbers; the cost model predicts each Triton kernel's H100 time from its
#   bytes and operations (for the WKV-4 forward, $12\,C$ bytes per token, counted by hand), a floor for the recurrent
#   kernels, which at small batch are limited by how few programs walk time in parallel.
# - Whole models: decoding a token on a CPU is one C call at the speed of one read of the weights; a prompt is within
#   1.3x of its matrix products for the RWKV models in fp32, and further from them where the matrix products get
#   faster (bf16) or the recurrence is heavy (Mamba's scan).
#
# ## Exercises
#
# Each coding exercise has a stub to fill in (it raises `NotImplementedError` until you do), a check cell below it
# that says "not attempted yet", "correct" or what is off, and the solution in a collapsed cell starting
# `# Solution` (click the three dots to open it). Questions have their worked answer in a collapsed cell too.
#
# **1. Programs and masked lanes.** Write `launch_counts(B, C)`: how many programs the WKV-4 forward launches for
# batch $B$ and $C$ channels, and how many of their lanes are masked (fall past channel $C - 1$). The programs'
# width is the launch configuration's `BLOCK_C`, `k4._launch_config(C)["BLOCK_C"]`; one program per sequence and
# block of channels. The check counts lanes one by one for several shapes and compares the programs for the
# benchmark's shape ($B = 4$, $C = 768$) with the cost model's.

# %%
# Exercise 1: programs and masked lanes
def launch_counts(B, C):
    """(programs, masked lanes) of the WKV-4 forward for B sequences of C channels."""
    raise NotImplementedError("Exercise 1: your code here")


# %% tags=["nbval-check-output"]
from seqmix.kernels.testing import exercise

stored = next(m for m in results["cost_model"] if m["kernel"] == "wkv4_fwd C=768 fp32")


def checks_1():
    for B_, C_ in ((4, 768), (1, 100), (3, 33), (2, 1)):
        block_c = k4._launch_config(C_)["BLOCK_C"]
        lanes = [(b, pid * block_c + lane) for b in range(B_) for pid in range(-(-C_ // block_c))
                 for lane in range(block_c)]                       # every lane of every program, one by one
        expected = (len(lanes) // block_c, sum(channel >= C_ for _, channel in lanes))
        assert launch_counts(B_, C_) == expected, f"B = {B_}, C = {C_}: {launch_counts(B_, C_)}, counted {expected}"
    assert launch_counts(4, 768)[0] == stored["programs"], "B = 4, C = 768: not the cost model's programs"
    print("programs and masked lanes as counted, and the cost model's programs for B = 4, C = 768")


exercise("Exercise 1", checks_1)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# One program per sequence and block of BLOCK_C channels; the last block's lanes past C are masked.
def launch_counts(B, C):
    block_c = k4._launch_config(C)["BLOCK_C"]                   # channels per program
    blocks = triton.cdiv(C, block_c)
    return B * blocks, B * (blocks * block_c - C)


for B_, C_ in ((4, 768), (1, 100)):
    print(f"B = {B_}, C = {C_}: (programs, masked lanes) = {launch_counts(B_, C_)}")
exercise("Exercise 1", checks_1)

# %% [markdown]
# **2. Bytes per token, to the byte.** The cost model gives 9228 bytes per token for the WKV-4 forward at
# $B = 4$, $T = 2048$, $C = 768$, fp32, 12 more than $12\,C$. Account for the 12: what else does each program read or
# write, once per sequence?

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# Once per sequence and channel: w and u read, the state (num, den, max) read and written:
# 8 numbers of 4 bytes, spread over the T tokens of the sequence.
B_, T_, C_ = 4, 2048, 768
per_token = 3 * 4 * C_ + 8 * 4 * C_ / T_
print(f"12 C + 32 C / T = {12 * C_} + {8 * 4 * C_ / T_:g} = {per_token:g} bytes per token")
check("bytes per token by hand vs the stored cost model", per_token, stored["bytes_per_token"],
      REFERENCE_BUDGET)

# %% [markdown]
# **3. Registers for the state tile.** The WKV-7 forward holds a (BLOCK_V, N) fp32 tile of $S$ over `num_warps`
# warps of 32 threads. For $B = 1$, $H = 12$, $N = 64$ (the benchmark's shape), the dispatcher's forward launch is
# `k7._launch_config(64, heads=12)`. How many registers per thread does the tile take with it, and with BLOCK_V = 32
# on 4 warps? How many programs does it launch? Compare with the cost model's `programs × steps` for
# `wkv7_fwd B*H=12 N=64 fp32`.

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
launch7 = k7._launch_config(64, heads=1 * 12)
for rows_, warps_ in ((launch7["BLOCK_V"], launch7.num_warps), (32, 4)):
    registers = rows_ * 64 // (32 * warps_)
    print(f"BLOCK_V = {rows_}, {warps_} warp(s), N = 64: {registers} registers a thread for S")
stored7 = next(m for m in results["cost_model"] if m["kernel"] == "wkv7_fwd B*H=12 N=64 fp32")
programs7 = 1 * 12 * 64 // launch7["BLOCK_V"]
print(f"programs: B H N / BLOCK_V = {programs7}; stored: {stored7['programs']} "
      f"x {stored7['serial_steps']} steps (T = 2048)")
assert programs7 == stored7["programs"]

# %% [markdown]
# **4. Columns are not rows.** Section 3 split the state by rows. Split it by *columns* (key channels) instead:
# write `column_block_step(S_cols, cols, sa)`, the new columns `cols` of $S$ from the block's old columns `S_cols`
# (every row), with section 3's expressions, where `sa` is the row sum $S a$ the step needs. The check runs it
# twice on section 3's state: with each block's own partial sum (`S_cols @ a7[cols]`, all a program holding those
# columns could compute alone), which must miss `reference.wkv7`'s step, and with the full $S a$ (what programs would
# have to exchange), which must match it. Before running: which term needs the columns the block does not have?

# %%
# Exercise 4: a step of WKV-7 on a block of columns
def column_block_step(S_cols, cols, sa):
    """S_new[:, cols] given S_cols = S[:, cols] and sa, the row sums S a to use (N,)."""
    raise NotImplementedError("Exercise 4: your code here")


# %% tags=["nbval-check-output"]
def checks_4():
    blocks = [slice(j, j + BLOCK_V) for j in range(0, N, BLOCK_V)]
    partial = np.concatenate([column_block_step(S[:, c], c, S[:, c] @ a7[c]) for c in blocks], axis=1)
    error = rel_rms(partial, S_ref[0, 0])
    print(f"each block with its own partial S a misses reference.wkv7 by more than 1%: {error > 0.01}")
    assert error > 0.01, "with partial sums the blocks should not reproduce the step"
    exchanged = np.concatenate([column_block_step(S[:, c], c, S @ a7) for c in blocks], axis=1)
    check("blocks of columns with the full S a vs reference.wkv7", exchanged, S_ref[0, 0], REFERENCE_BUDGET)


exercise("Exercise 4", checks_4)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["nbval-check-output"]
# Solution
# A block of columns j: S[:, j] w_j + (S a) b_j + v k_j. The row sum S a runs over every column, so a block that
# sums only its own columns gets a partial S a and the step is wrong. Programs would have to add their partial sums
# (a reduction across programs) before every step, which is why the kernel splits by rows.
def column_block_step(S_cols, cols, sa):
    return S_cols * w7[None, cols] + sa[:, None] * b7[None, cols] + v7[:, None] * k7_[None, cols]


exercise("Exercise 4", checks_4)
