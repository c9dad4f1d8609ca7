"""A GPU cost model of the Triton kernels: bytes and FLOPs per token from each kernel's loop structure, arithmetic
intensity, and the time an H100 SXM would need by the roofline; beside them registers, spills and shared memory
from the ahead-of-time build (``kernels.aot``). ``python -m seqmix.benchmarks.cost_model`` prints the table.

What is counted, for one launch at the shape given:
- bytes issued: every element a ``tl.load`` or ``tl.store`` touches, at its dtype's size, as the loops issue them
  (a tile that several programs load counts once per program); masked-off lanes are not counted. DRAM bytes: each
  tensor element once (inputs read, outputs written); the re-reads in between are taken to hit L2 (50 MB), which
  holds them at these shapes (the K, V of one head, B and C of the scan, one step's r, k, a, b of WKV-7).
- dot FLOPs: 2 M N K per ``tl.dot`` of (M, K) x (K, N) tiles, padded sizes included.
- other FLOPs: elementwise fp32 work, 1 per add, multiply, max, compare or select (counts per element are written
  beside each model); transcendentals (exp, log) apart: they run on the special-function units.
- serial steps: iterations of the loop-carried recurrence each program walks in order (the recurrent kernels).

Predicted time = the largest of three bounds, and the table says which binds:
- memory: DRAM bytes / 3.35 TB/s;
- compute, the largest of: dot FLOPs at the rate the compiled instruction reaches (``dot_rate``: 35% of the 990
  TFLOP/s bf16 peak on wgmma and on mma.sync alike, FlashAttention-2's class, where Triton's flash kernels sit (the
  FlashAttention-3 paper's H100 chart at d = 128, 8k: Triton 392, FA2 370 TFLOP/s; FA3's 75% takes warp
  specialization that these kernels lack); fp32 dots with tf32x3 at the same share of the tf32 peak (495 TFLOP/s)
  divided by their three products; Triton's FMA lowering of fp32 IEEE dots 25% of the 67 TFLOP/s FMA peak, its
  operands re-read from shared memory: assumed, to be measured); other FLOPs / 33.5 T/s (an add, multiply, compare
  or select is one lane-op, not half an FMA); transcendentals / 4.2 T/s (16 per SM per clock, 132 SMs, 1.98 GHz);
- latency: serial steps x the time one step waits (``Step``: its dependent chain, reductions across warps about
  0.1 us, within one warp about 0.075 us, a dependent special-function op about 10 ns, a dependent tile product
  its MMA latency plus a conversion through shared memory, about 0.07 us; and a DRAM round trip, about 0.5 us, for
  its loads), times the waves of programs when there are more than the GPU holds at once (by warps, and by
  registers where the AOT build gives them). The recurrent kernels prefetch: step t + 1's loads are issued before
  step t's arithmetic, so two round trips overlap and a step takes max(chain, (round trip + chain) / 2) rather than
  round trip + chain; what remains is half a round trip per step (a deeper prefetch would hide more) and the chain
  itself. The recurrent kernels (few programs, T steps each) are bound by it at the benchmark's shapes. The chunked
  WKV-7's step is a chunk: its dependent tile products, its reductions across warps and the key-block loads that it
  uses in the iteration that issues them (not pipelined: a round trip each). The flash kernels' serial steps are the
  key (or query) tiles of their longest program (under a causal mask the last query tile walks every key tile):
  each tile's work at one SM's share of the rates above, one unit after the other (scores, softmax and the value
  product depend on each other), its loads num_stages - 1 tiles ahead;
- a grid of fewer programs than SMs reaches only that share of the bandwidth and compute (an SM per program: the
  unsplit ReRoPE decode at B H = 4 had 4 programs on 132 SMs);
- every kernel launch takes at least the launch floor, 1.9 us of GPU time (an empty kernel, measured on the H100):
  a call's further launches (ReRoPE decode's merge of its splits, torch operations) add one floor each.
The constants marked "assumed" are estimates from the GPU's documented latencies, not measurements:
``python -m seqmix.benchmarks.gpu_check`` measures them the day a GPU is at hand.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass

from ..kernels.aot import AOT_DTYPES
from ..kernels.registry import benchmarked
from ..kernels.shared import block_d

H100 = {"name": "H100 SXM", "bandwidth": 3.35e12,
        "fp32": 67e12,                   # FLOP/s, an FMA counted as 2: 132 SMs x 128 lanes x 2 x 1.98 GHz
        "fp32_ops": 132 * 128 * 1.98e9,  # other lane-ops per second (add, multiply, compare, select): half of that
        "tensor": 990e12,                # dense bf16/fp16 peak (NVIDIA's figure)
        "tf32_tensor": 495e12,           # dense tf32 peak: half the 16-bit one
        # Reached by Triton's flash kernels on wgmma: FlashAttention-2's class, 35% (arXiv:2407.08608's H100 chart,
        # d = 128, 8k: Triton 392, FA2 370 TFLOP/s); FA3's 75% (740) takes warp specialization. On the H100 (run 5)
        # seqmix's bf16 forward and SDPA's flash backend both took 218 us at B H = 4: the tile chain binds there.
        "wgmma": 0.35 * 990e12,
        "mma.sync": 0.35 * 990e12,       # reached by mma.sync on sm_90: FlashAttention-2's 35% there (same paper)
        "fma_dot": 0.25 * 67e12,         # Triton's FMA lowering of fp32 dots (assumed: shared-memory bound)
        "sfu": 16 * 132 * 1.98e9,
        "sms": 132, "warps_per_sm": 64, "programs_per_sm": 32,
        "dram_latency": 0.5e-6,          # a dependent load's round trip from DRAM under load (assumed)
        "reduce_latency": 0.1e-6,        # a reduction across warps: shuffles, shared memory, a barrier (assumed)
        "warp_reduce_latency": 0.075e-6,  # a reduction within one warp: 5 shuffle rounds of ~30 cycles (assumed)
        "sfu_latency": 10e-9,            # one dependent MUFU op (ex2, rcp) with its FMAs (assumed)
        # one dependent tile product: an mma.sync's latency (about 35 cycles) and its operands' conversion through
        # shared memory (a store, a barrier and a load, about 100 cycles) (assumed; the chain probe measures it)
        "dot_latency": 0.07e-6,
        "launch_floor": 1.9e-6}          # an empty kernel's GPU time (measured, run 4)
ARCH = 90
DTYPE_BYTES = {name: dtype.itemsize for name, dtype in AOT_DTYPES.items()}


# op stem -> the function that models its kernels (each registers itself with @models_of), read by MODEL_BUILDERS
_BUILDERS = {}


def models_of(stem: str):
    """Registers the decorated function as the cost model of the kernels of the op package ``stem``."""
    def register(build):
        _BUILDERS[stem] = build
        return build
    return register


@dataclass
class Cost:
    bytes: float = 0.0
    dot_flops: float = 0.0
    flops: float = 0.0
    transcendentals: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.bytes + other.bytes, self.dot_flops + other.dot_flops, self.flops + other.flops,
                    self.transcendentals + other.transcendentals)

    def __mul__(self, n: float) -> Cost:
        return Cost(self.bytes * n, self.dot_flops * n, self.flops * n, self.transcendentals * n)

    __rmul__ = __mul__


@dataclass
class Step:
    """What one serial step of a recurrent kernel waits for: DRAM round trips for its loads, reductions (across
    warps, or within one warp when ``warp_reductions``), dependent special-function ops, dependent tile products
    (``dots``: each an MMA's latency and a conversion through shared memory), and ``work`` done by one program on
    its SM (a flash kernel's tile: its dots at ``dot_rate`` FLOP/s, the whole GPU's, its other FLOPs and
    transcendentals at the GPU's rates too, each on one SM's share of them, one after the other). With ``prefetch``
    = P the loads are issued P steps ahead: P + 1 round trips overlap, and a step takes max(chain, (round trips +
    chain) / (P + 1)). ``starts``: pipeline starts per step (a walk's first load waits in full: the backwards start
    two walks per checkpoint run)."""
    round_trips: float = 0.0
    reductions: float = 0.0
    sfu: float = 0.0
    prefetch: int = 0
    warp_reductions: bool = False
    starts: float = 0.0
    dots: float = 0.0
    work: Cost = None

    def seconds(self, hw, dot_rate: float | None = None) -> float:
        reduce = hw["warp_reduce_latency" if self.warp_reductions else "reduce_latency"]
        chain = self.reductions * reduce + self.sfu * hw["sfu_latency"] + self.dots * hw["dot_latency"]
        if self.work is not None:
            chain += hw["sms"] * (self.work.dot_flops / dot_rate + self.work.flops / hw["fp32_ops"]
                                  + self.work.transcendentals / hw["sfu"])
        memory = self.round_trips * hw["dram_latency"]
        return max(chain, (memory + chain) / (self.prefetch + 1)) + self.starts * hw["dram_latency"]


@dataclass
class Model:
    """One kernel at one shape: what a launch costs and how it is laid out."""
    op: str                 # the benchmark op it belongs to (run.py's Op.name)
    aot_label: str          # the kernel's label in its module's aot_kernels()
    shape: str
    tokens: int             # B T
    dtype: str
    cost: Cost
    programs: int
    serial_steps: int       # loop-carried steps per program (0: none)
    forward: bool           # the kernel a forward (inference) call runs
    dram_bytes: float       # each tensor element read or written once: what must cross DRAM
    notes: str = ""
    step: Step = None       # what each serial step waits for (None: no serial chain)
    num_warps: int = 4      # per program: how many programs the GPU holds at once
    dot_unit: str = None    # the dots' instruction where it does not follow the dtype ("none": FMA units)
    dots: str = None        # "tf32x3": fp32 dots as three tf32 products (attention's forward on sm_90)
    launches: int = 1       # kernel launches per call, each at least the launch floor


def _mma(dtype: str, mma: str | None, dots: str | None = None) -> str:
    """The instruction: ``mma`` as the AOT build reports it (wgmma, mma.sync or none: FMA units); without it, from
    the dtype: fp32 IEEE dots on the FMA units, bf16/fp16 and fp32 with tf32x3 taken as mma.sync (the smaller
    tiles')."""
    if mma is None:
        return "none" if dtype == "fp32" and dots != "tf32x3" else "mma.sync"
    return mma


def _products(dtype: str, dots: str | None) -> int:
    """Tensor-core products per product of the dots: 3 for fp32 with tf32x3, else 1."""
    return 3 if dtype == "fp32" and dots == "tf32x3" else 1


def dot_rate(dtype: str, mma: str | None = None, hw=H100, dots: str | None = None) -> tuple[float, str]:
    """FLOP/s that the kernels' tl.dot reaches and the instruction it runs on (``_mma``). fp32 dots on tensor cores
    take tf32 operands, at the tf32 peak's share, and ``dots`` = "tf32x3" three products per product."""
    mma = _mma(dtype, mma, dots)
    if mma == "none":
        return hw["fma_dot"], "FMA-unit dots"
    if dtype == "fp32":
        return (hw[mma] * hw["tf32_tensor"] / hw["tensor"] / _products(dtype, dots),
                f"tensor cores ({mma}, {dots or 'tf32'})")
    return hw[mma], f"tensor cores ({mma})"


def latency(m: Model, hw=H100, mma: str | None = None, regs: int | None = None) -> float:
    """Seconds the serial chain takes: steps x one step's wait, once per wave of programs. The GPU holds as many
    programs per SM as its warps allow, and its 65,536 registers where ``regs`` (per thread, from the AOT build)
    is given. A flash kernel's chain (a Step with ``work``) is its longest program's, once: the other programs are
    shorter and fill the other slots meanwhile (the compute bound counts them all)."""
    if m.step is None or not m.serial_steps:
        return 0.0
    if m.step.work is not None:
        return m.serial_steps * m.step.seconds(hw, dot_rate(m.dtype, m.dot_unit or mma, hw, m.dots)[0])
    per_sm = min(hw["programs_per_sm"], hw["warps_per_sm"] // m.num_warps)
    if regs:
        per_sm = max(1, min(per_sm, 65536 // (regs * 32 * m.num_warps)))
    step = m.step.seconds(hw, dot_rate(m.dtype, m.dot_unit or mma, hw, m.dots)[0])
    return m.serial_steps * step * _cdiv(m.programs, hw["sms"] * per_sm)


def predict(cost: Cost, dtype: str, dram_bytes: float, hw=H100, mma: str | None = None,
            latency_s: float = 0.0, programs: int | None = None, dots: str | None = None,
            launches: int = 0) -> tuple[float, str]:
    """Predicted time in seconds and what binds it: memory (DRAM bytes; re-reads beyond them hit L2), a compute
    unit (dots at ``dot_rate``, other ops, special functions), latency (``latency_s``, the serial chain) or the
    launch floors. A grid of ``programs`` < SMs reaches that share of the GPU's bandwidth and compute. ``launches``
    kernel launches (0: none counted, the roofline) take at least one launch floor each: the first kernel's time is
    at least one, each further launch adds one."""
    rate, unit = dot_rate(dtype, mma, hw, dots)
    share = min(1.0, programs / hw["sms"]) if programs else 1.0
    throughput = {"memory": dram_bytes / hw["bandwidth"], "fp32 units": cost.flops / hw["fp32_ops"],
                  "special functions": cost.transcendentals / hw["sfu"], unit: cost.dot_flops / rate}
    times = {**{what: t / share for what, t in throughput.items()}, "latency": latency_s}
    bound = max(times, key=times.get)
    if not launches:
        return times[bound], bound
    floor = hw["launch_floor"]
    total = max(times[bound], floor) + (launches - 1) * floor
    return total, "launch floors" if launches * floor > times[bound] else bound


def predicted(m: Model, mma: str | None = None, regs: int | None = None, hw=H100) -> tuple[float, str]:
    """What the table predicts for one model: ``mma`` and ``regs`` as the AOT build reports them for sm_90
    (None: the model's own instruction, or the dtype's); its serial chain, grid, dot precision and launches."""
    mma = m.dot_unit or mma
    return predict(m.cost, m.dtype, m.dram_bytes, hw, mma, latency(m, hw, mma, regs), m.programs, m.dots,
                   m.launches)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ----------------------------------------------------------------------------------------------------------------
# RWKV-4 (kernels/wkv4/): one program per (batch, BLOCK_C channels), a loop over T tokens
# ----------------------------------------------------------------------------------------------------------------

def wkv4_fwd(B, T, C, dtype, save):
    """wkv4_fwd_kernel. Per (token, channel): loads k, v; stores y (with SAVE also v - y, d and z, fp32).
    Output: d = (anchor - k) + lag w - u (4), the two clamped exponents (min, negate, min: 3; 2 exp), z (2),
    y (4): 13 FLOPs. SAVE: a (den v - num) / z (4). Update: d (4), the two exponents (3; 2 exp), num (3), den (2),
    kept (1), anchor and lag (3): 16 FLOPs. Per (batch, channel) once: loads w, u and the initial (num, den, max);
    the two-sum rounding of the final max (6) and e^err (2 exp); stores the final (num, den, max), with SAVE lag."""
    s = DTYPE_BYTES[dtype]
    per_step = Cost(bytes=3 * s + (12 if save else 0), flops=29 + (4 if save else 0), transcendentals=4)
    per_row = Cost(bytes=2 * s + 12 + 12 + (4 if save else 0), flops=8, transcendentals=2)
    return (T * per_step + per_row) * (B * C)


def wkv4_bwd(B, T, C, dtype):
    """wkv4_bwd_kernel. Per (token, channel): loads v, gy (input dtype), v - y, d, z (fp32); stores gk, gv.
    d_next (1), into_next (2 + exp), decay (1 + exp), past (2 + exp), cur (4 + exp), g_bonus (1), gv (2), gk (8),
    gu (1), gw (4), bn, bd (2 each), an (3), ad (5): 38 FLOPs and 4 exp. Per (batch, channel) once: loads w, u,
    one key, max0, g_num, g_den, g_max, the final num, den, lag, the initial num, den; stores gw, gu, gnum0,
    gden0, gmax0; about 20 FLOPs and 3 exp."""
    s = DTYPE_BYTES[dtype]
    per_step = Cost(bytes=4 * s + 12, flops=38, transcendentals=4)
    per_row = Cost(bytes=3 * s + 36 + 20, flops=20, transcendentals=3)
    return (T * per_step + per_row) * (B * C)


@models_of("wkv4")
def wkv4_models(B=4, T=2048, C=768):
    from ..kernels.wkv4 import triton_launch
    launch, grid = triton_launch(B, C)
    programs = math.prod(grid)
    shape = f"B={B} T={T} C={C}"
    out = []
    for dtype in ("fp32", "bf16"):
        # every element is touched once (w and u once per batch row: negligible), so DRAM bytes = issued bytes
        for label, cost, forward in ((f"wkv4_fwd C={C} {dtype}", wkv4_fwd(B, T, C, dtype, False), True),
                                     (f"wkv4_fwd_save C={C} {dtype}", wkv4_fwd(B, T, C, dtype, True), False),
                                     (f"wkv4_bwd C={C} {dtype}", wkv4_bwd(B, T, C, dtype), False)):
            # a step: k, v (backward: five vectors) loaded one step ahead (a round trip, overlapping the previous
            # step's), then the exponentials and the division in a dependent chain (4 MUFU ops forward, 5
            # backward); one thread per channel. Splitting channels further would leave lanes idle and shorten no
            # chain: each channel's is as long in a warp of 32 as alone.
            step = Step(round_trips=1, sfu=5 if "bwd" in label else 4, prefetch=1)
            out.append(Model("wkv4", label, shape, B * T, dtype, cost, programs, T, forward, cost.bytes, step=step,
                             num_warps=launch.num_warps))
    return out


# ----------------------------------------------------------------------------------------------------------------
# RWKV-7 (kernels/wkv7/): one program per (batch, head, BLOCK_V value rows of S), rows (BLOCK_V, N) in registers
# ----------------------------------------------------------------------------------------------------------------

def wkv7_fwd(B, T, H, N, dtype, block_v, programs, ck, save):
    """wkv7_fwd_kernel. Per (token, program): loads r, log_w, k, a, b (N each: every program of a head loads them)
    and v (BLOCK_V); stores y (BLOCK_V); N exp for w. Per (token, state element): S a (2), S w + sa b + v k (5),
    S r (2) = 9 FLOPs. With SAVE_CKPT the state is stored every ck = CHECKPOINT steps. Per program: the final state
    stored (the benchmark passes no initial state, so none is loaded)."""
    s = DTYPE_BYTES[dtype]
    total = (T * Cost(bytes=5 * N * s + 2 * block_v * s, transcendentals=N)) * programs
    total += Cost(flops=9 * T * B * H * N * N, bytes=B * H * N * N * 4 * (1 + (_cdiv(T, ck) if save else 0)))
    return total


def wkv7_bwd(B, T, H, N, dtype, block_v, programs, ck):
    """wkv7_bwd_kernel: per run of ck = CHECKPOINT steps the forward again from the checkpoint (loads as the
    forward, stores each entering state to the scratch buffer; 7 FLOPs per state element), then the run in reverse:
    loads the scratch state, the step's vectors and dy; stores this program's share of the 5 key-vector gradients
    (N fp32 each, into its own slice; the wrapper sums the N / BLOCK_V slices) and dv (BLOCK_V). Per state element:
    S a (2), the reductions for dr, dlog_w, dk, da, db, dv (2 each), G += dy r (2), q = G b (2), G w + q a (3) = 21
    FLOPs. N exp per token and program in each pass."""
    s = DTYPE_BYTES[dtype]
    tile = block_v * N * 4
    recompute = Cost(bytes=tile + 5 * N * s + block_v * s, transcendentals=N)
    backward = Cost(bytes=tile + 5 * N * s + 2 * block_v * s + 5 * N * 4 + block_v * 4, transcendentals=N)
    total = (T * (recompute + backward)) * programs
    total += Cost(flops=(7 + 21) * T * B * H * N * N, bytes=B * H * N * N * 4 * (_cdiv(T, ck) + 2))
    return total


def wkv7_chunked_fwd_prep(T, N, dtype, ck, group, columns):
    """wkv7_chunked_prep_kernel, per program (a group of ``group`` sub-chunks of CK steps, one head, ``columns`` lines
    of [P_G; E_G]), per sub-chunk: loads r, log_w, k, a, b (CK, N) and v (CK, columns); 5 CK N exp; products: the four
    couplings (2 CK CK N each), the inverse's 6 (2 CK^3), W and Q_rb W (2 CK CK N each), U0 (2 of 2 CK CK columns),
    the output rows R X^T, Q_rb U0, Q_rk V (2 CK N columns + 2 of 2 CK CK columns), the lines' update X W^T, (.) B^,
    V^T K^ (3 of 2 columns CK N); stores the output rows (CK columns fp32); per group its lines (columns N fp32)."""
    s = DTYPE_BYTES[dtype]
    per_sub = Cost(bytes=(5 * N + columns) * ck * s + ck * columns * 4, transcendentals=5 * ck * N, flops=12 * ck * N,
                   dot_flops=6 * 2 * ck * ck * N + 6 * 2 * ck ** 3 + 4 * 2 * ck * ck * columns
                   + 4 * 2 * ck * N * columns)
    return group * per_sub + Cost(bytes=columns * N * 4)


def wkv7_chunked_fwd_scan(N, rows):
    """wkv7_chunked_scan_kernel, per step (a group) and program of ``rows`` rows: loads M_G (N N fp32) and its rows
    of A_G, stores its rows of the entering state; one product of 2 rows N N."""
    return Cost(bytes=(N * N + 2 * rows * N) * 4, dot_flops=2 * rows * N * N)


def wkv7_chunked_fwd_output(N, dtype, steps, columns):
    """wkv7_chunked_output_kernel, per program (a group's ``steps`` steps, ``columns`` values): loads R' (steps N fp32),
    Y0' (steps columns fp32), the group state's rows (columns N fp32), stores y (steps columns); one product of
    2 steps N columns."""
    return Cost(bytes=(steps * N + steps * columns + columns * N) * 4 + steps * columns * DTYPE_BYTES[dtype],
                dot_flops=2 * steps * N * columns)


def wkv7_chunked_bwd_prep(T, N, dtype, ck, group, columns):
    """wkv7_chunked_bwd_prep_kernel, per program (a group of ``group`` sub-chunks, one head, ``columns`` lines of
    [P_G^T; F_G]), per sub-chunk: loads r, log_w, k, a, b (CK, N) and dy (CK, columns); 5 CK N exp; products: two
    couplings (A_ab, Q_rb: 2 CK CK N each), the inverse's 6 (2 CK^3), W and Q_rb W (2 CK CK N each), the lines'
    update X B^^T, (.) W, dY^T R (3 of 2 columns CK N); per group stores its lines (columns N fp32)."""
    s = DTYPE_BYTES[dtype]
    per_sub = Cost(bytes=(5 * N + columns) * ck * s, transcendentals=5 * ck * N, flops=12 * ck * N,
                   dot_flops=4 * 2 * ck * ck * N + 6 * 2 * ck ** 3 + 3 * 2 * ck * N * columns)
    return group * per_sub + Cost(bytes=columns * N * 4)


def wkv7_chunked_bwd_states(T, N, dtype, ck, group, columns):
    """wkv7_chunked_states_kernel (groups of several sub-chunks), per program (a group, one head, ``columns`` value
    rows): loads the group's state rows (columns N fp32); per sub-chunk stores the rows entering it (columns N fp32),
    loads r, log_w, k, a, b (CK, N) and v (CK, columns); 5 CK N exp; products: two couplings (A_ab, A_ak), the
    inverse's 6, W (2 CK CK N), U0 (2 of 2 CK CK columns), X W^T, (.) B^, V^T K^ (3 of 2 columns CK N)."""
    s = DTYPE_BYTES[dtype]
    per_sub = Cost(bytes=(5 * N + columns) * ck * s + columns * N * 4, transcendentals=5 * ck * N, flops=12 * ck * N,
                   dot_flops=3 * 2 * ck * ck * N + 6 * 2 * ck ** 3 + 2 * 2 * ck * ck * columns
                   + 3 * 2 * ck * N * columns)
    return group * per_sub + Cost(bytes=columns * N * 4)


def wkv7_chunked_bwd_grads(N, dtype, ck):
    """wkv7_chunked_bwd_kernel, per program (one sub-chunk of CK steps, one head), b = N / CK blocks of keys and of
    value rows, every tile (CK, CK), a "product" 2 CK^3 FLOPs. Its passes: the couplings (per key block loads r,
    log_w, k, a, b, v, dy, zeroes the five slots' tiles, 3 tile exps, 4 products), the inverse (6 products); U (per
    value block and key block loads log_w, a, S_0, 1 exp, 1 product; per value block v, 2 products, stores U); dZ and
    dv (per value and key block loads log_w, b, k, G, 1 exp, 2 products; per value block dy, 4 products, stores dv,
    dZ, B^ G^T); the shares (per value block loads v, dy, U, dZ; per value and key block S_0, G, the 5 slots' tiles
    loaded and stored, 4 products and a column sum); the couplings' gradients (per value block the same four loads,
    4 products); the key-vector gradients (4 loops over the key blocks, each loading r, log_w, k, a, b and two slots,
    storing two, 2 products, about 4 tile exps and 12 FLOPs an element). About 10 FLOPs an element of a tile per
    key block (couplings), 15 per value and key block (scalings, the slots' sums), 48 per key block (the gradients'
    scalings and sums)."""
    s, b, tile = DTYPE_BYTES[dtype], N // ck, ck * ck
    loads = (b * (7 * s + 5 * 4) + b * b * (2 * s + 4) + b * (s + 4) + b * b * (3 * s + 4) + b * (s + 3 * 4)
             + b * (2 * s + 2 * 4) + b * b * (2 * 4 + 10 * 4) + b * (2 * s + 2 * 4) + 4 * b * (5 * s + 4 * 4))
    products = 7 * b * b + 22 * b + 6
    return Cost(bytes=loads * tile, transcendentals=(2 * b * b + 19 * b) * tile, flops=(15 * b * b + 58 * b) * tile,
                dot_flops=products * 2 * ck ** 3)


def wkv7_chunked_bwd_step(N, ck):
    """The gradient kernel's one step (its whole program; the programs have no chain between them, so it waits once
    per wave): a DRAM round trip per iteration of each loop over blocks (b = N / CK: the couplings' b, U's, dZ's and
    the shares' b (b + 1), the couplings' gradients' b, the key-vector gradients' 4 b: 3 b^2 + 9 b; the AOT build at
    N = 64 pipelines some of their loads, this counts none), reductions across warps (the spread check's 6 per key
    block, a column sum per value and key block: 6 b + b^2) and dependent products (the accumulations' chains and
    the inverse: 3 b^2 + 11 b + 6)."""
    b = N // ck
    return Step(round_trips=3 * b * b + 9 * b, reductions=6 * b + b * b, dots=3 * b * b + 11 * b + 6)


@models_of("wkv7")
def wkv7_models(B=1, T=2048, H=12, N=64):
    from ..kernels.wkv7 import CHECKPOINT, triton_launch
    from ..kernels.wkv7.triton_chunked import CHUNK, SCAN_ROWS, group_size
    cfg, grid = triton_launch(B, H, N, "bwd")
    columns = triton_launch(B, H, N, "chunked")[0]["COLUMNS"]
    grads_warps = triton_launch(B, H, N, "chunked_bwd")[0].num_warps
    fwd_cfg, fwd_grid = triton_launch(B, H, N, "fwd")
    block_v, fwd_v = cfg["BLOCK_V"], fwd_cfg["BLOCK_V"]
    programs, fwd_programs = math.prod(grid), math.prod(fwd_grid)
    fwd_label = "wkv7_fwd" if fwd_cfg == cfg else f"wkv7_fwd B*H={B * H}"   # kernels/wkv7/ aot_kernels
    shape = f"B={B} T={T} H={H} N={N}"
    n_chunks = _cdiv(T, CHECKPOINT)
    out = []
    for dtype in ("fp32", "bf16"):
        s, seq, state = DTYPE_BYTES[dtype], B * T * H * N, B * H * N * N * 4
        # DRAM: the six inputs and y; bwd also dy, dv, the five key gradients' N / BLOCK_V partial slices (written,
        # read by the wrapper's sum) and their sum, the checkpoints; the scratch buffer (64 KB per program) stays in L2
        bwd_dram = seq * (7 * s + 4 + 5 * 4 * (2 * (N // block_v) + 1))
        # Steps: the sequential forward loads its step's vectors one step ahead (a round trip overlapping the
        # previous step's), then S a and S r, two reductions in a row (within one warp at the split configuration:
        # 4 value rows of N = 64); the backward alternates a recompute step (S a) and a reverse step (S_{t-1} a,
        # dr's sums, q = G b, then G), 1 and 4 reductions: 2.5 on average over its 2 T steps, each of its two walks
        # per checkpoint run starting with a full round trip. The chunked kernels: _wkv7_chunked_forward and
        # _wkv7_chunked_backward.
        out += [Model("wkv7", f"{fwd_label} N={N} {dtype}", shape, B * T, dtype,
                      wkv7_fwd(B, T, H, N, dtype, fwd_v, fwd_programs, CHECKPOINT, False), fwd_programs, T, True,
                      7 * seq * s + state, "inference (no checkpoints); the AOT build is of the checkpointing variant",
                      step=Step(1, 2, 1, prefetch=1, warp_reductions=fwd_cfg.num_warps == 1),
                      num_warps=fwd_cfg.num_warps),
                Model("wkv7", f"wkv7_bwd N={N} {dtype}", shape, B * T, dtype,
                      wkv7_bwd(B, T, H, N, dtype, block_v, programs, CHECKPOINT), programs, 2 * T, False,
                      bwd_dram + state * (n_chunks + 2),
                      step=Step(1, 2.5, 1, prefetch=1, starts=1 / CHECKPOINT), num_warps=cfg.num_warps)]
        group = group_size(AOT_DTYPES[dtype])
        out += _wkv7_chunked_forward(B, T, H, N, dtype, columns, group, CHUNK, SCAN_ROWS, shape)
        out += _wkv7_chunked_backward(B, T, H, N, dtype, columns, group, CHUNK, SCAN_ROWS, shape, grads_warps)
    return out


def _wkv7_chunked_backward(B, T, H, N, dtype, columns, group, ck, rows, shape, grads_warps):
    """The chunked WKV-7 backward's kernels (groups of ``group`` sub-chunks, the forward's), one Model each: the prep
    of [P_G^T; F_G], the reversed scan (the forward's kernel: its step one product and a round trip a step ahead),
    with groups of several sub-chunks the walks of the state and of dL/dS over each group, and the gradient kernel,
    one program per sub-chunk and head: its serial chain is one step (wkv7_chunked_bwd_step), once per wave. Their
    DRAM: the inputs (and dy) each reads, the maps, the states they read and write; the gradient kernel's dv and
    five gradients, its running sums and its scratch (U, dZ, B^ G^T) in L2."""
    n_sub = _cdiv(T, ck)
    n_groups = _cdiv(n_sub, group)
    seq, state = B * T * H * N * DTYPE_BYTES[dtype], B * H * N * N * 4
    maps = B * H * n_groups * 2 * N * N * 4
    prep = B * H * n_groups * 2 * N // columns
    scan = B * H * N // rows
    grads = B * H * n_sub
    out = [Model("wkv7", f"wkv7_chunked_bwd_prep N={N} {dtype}", shape, B * T, dtype,
                 wkv7_chunked_bwd_prep(T, N, dtype, ck, group, columns) * prep, prep, 0, False, 6 * seq + maps,
                 "the chunked backward's parallel prep"),
           Model("wkv7", f"wkv7_chunked_bwd_scan N={N} {dtype}", shape, B * T, dtype,
                 wkv7_chunked_fwd_scan(N, rows) * (scan * n_groups), scan, n_groups, False, maps + 2 * state,
                 "the chunked backward's serial pass", step=Step(1, dots=1, prefetch=1))]
    if group > 1:
        walks = B * H * n_groups * N // columns
        # the dL/dS walk: the prep's work on value rows over all but a group's first sub-chunk, storing every one's
        dstates = (wkv7_chunked_bwd_prep(T, N, dtype, ck, group - 1, columns)
                   + Cost(bytes=(group - 1) * columns * N * 4))
        for label, cost in (("states", wkv7_chunked_bwd_states(T, N, dtype, ck, group, columns)),
                            ("dstates", dstates)):
            out.append(Model("wkv7", f"wkv7_chunked_bwd_{label} N={N} {dtype}", shape, B * T, dtype, cost * walks,
                             walks, 0, False, 6 * seq + n_groups * state + n_groups * group * state,
                             "the chunked backward's walk over each group's sub-chunks"))
    out.append(Model("wkv7", f"wkv7_chunked_bwd_grads N={N} {dtype}", shape, B * T, dtype,
                     wkv7_chunked_bwd_grads(N, dtype, ck) * grads, grads, 1, False,
                     7 * seq + B * T * H * N * 4 * 6 + 2 * n_groups * group * state,
                     "the chunked backward's gradients, every sub-chunk at once", step=wkv7_chunked_bwd_step(N, ck),
                     num_warps=grads_warps))
    return out


def _wkv7_chunked_forward(B, T, H, N, dtype, columns, group, ck, rows, shape):
    """The chunked WKV-7 forward's three kernels at inference (groups of ``group`` sub-chunks: the dtype's), one
    Model each: the prep's and the output's programs have no serial chain; the scan walks the groups, each step one
    product (an MMA's latency and a conversion through shared memory) and one round trip for the next group's map,
    issued a step ahead (num_stages = 2): a step's product is too short to hide more than its own share of it."""
    n_groups = _cdiv(_cdiv(T, ck), group)
    seq, state = B * T * H * N * DTYPE_BYTES[dtype], B * H * N * N * 4
    maps = B * H * n_groups * 2 * N * N * 4
    rows_bytes = B * H * n_groups * group * ck * 2 * N * 4
    prep = B * H * n_groups * 2 * N // columns
    scan = B * H * N // rows
    output = B * H * n_groups * N // columns
    return [Model("wkv7", f"wkv7_chunked_fwd_prep N={N} {dtype}", shape, B * T, dtype,
                  wkv7_chunked_fwd_prep(T, N, dtype, ck, group, columns) * prep, prep, 0, True,
                  6 * seq + maps + rows_bytes, "the chunked forward's parallel prep"),
            Model("wkv7", f"wkv7_chunked_fwd_scan N={N} {dtype}", shape, B * T, dtype,
                  wkv7_chunked_fwd_scan(N, rows) * (scan * n_groups), scan, n_groups, True, maps + 2 * state,
                  "the chunked forward's serial pass", step=Step(1, dots=1, prefetch=1)),
            Model("wkv7", f"wkv7_chunked_fwd_output N={N} {dtype}", shape, B * T, dtype,
                  wkv7_chunked_fwd_output(N, dtype, group * ck, columns) * output, output, 0, True,
                  rows_bytes + seq + B * H * n_groups * N * N * 4, "the chunked forward's outputs")]


# ----------------------------------------------------------------------------------------------------------------
# Mamba selective scan (kernels/ssm/): one program per (batch, BLOCK_D channels), state (BLOCK_D, N) in registers
# ----------------------------------------------------------------------------------------------------------------

def ssm_fwd(B, T, D, N, dtype, block_d, programs, checkpoint):
    """selective_scan_fwd_kernel. Per (token, program): loads u (input dtype) and delta (fp32) for BLOCK_D channels,
    B_t and C_t (input dtype) for N states; stores y (fp32) for BLOCK_D channels. Per (token, channel, state): dt A (1),
    exp (1 transcendental), exp * x (1), dt u B (1, dt u once per channel), add (1), x C (1), the sum over n (1):
    6 FLOPs. Per run of CHECKPOINT tokens: a checkpoint of the state stored (BLOCK_D N fp32); per program: A, the
    initial state, the last state."""
    s = DTYPE_BYTES[dtype]
    per_step_program = Cost(bytes=block_d * (s + 4 + 4) + 2 * N * s)     # masked lanes (channels >= D) are few
    per_element_step = Cost(flops=6, transcendentals=1)
    total = (T * per_step_program) * programs + (T * per_element_step) * (B * D * N)
    total += Cost(bytes=_cdiv(T, checkpoint) * B * D * N * 4 + 3 * B * D * N * 4)
    total += Cost(flops=T * B * D)                                       # dt * u once per (token, channel)
    return total


def ssm_bwd(B, T, D, N, dtype, block_d, block_n, programs, checkpoint):
    """selective_scan_bwd_kernel: per run of CHECKPOINT tokens, the forward recurrence again from the checkpoint
    (loads u, delta, B; stores x_{t-1} into the scratch buffer), then the run backwards: loads x_{t-1} back, u, delta,
    B, C, dy; stores this channel block's share of dB, dC (N values each, its own slice; the wrapper sums the
    D / BLOCK_D slices), du, ddelta. Per (token,
    channel, state): recompute 4 FLOPs + 1 exp, backward: alpha (1 + 1 exp), x (3), lam (2), dC term (2), dB term
    (2), lam B (2), grad_a (2), dA (2), ddelta sum (2), nu (1) = 19 FLOPs + 1 exp."""
    s = DTYPE_BYTES[dtype]
    recompute = Cost(bytes=block_d * (s + 4) + N * s + block_d * block_n * 4)
    backward = Cost(bytes=block_d * block_n * 4 + block_d * (s + 4 + 4) + 2 * N * s + 2 * N * 4 + block_d * 8)
    total = (T * (recompute + backward)) * programs
    total += (T * Cost(flops=4 + 19, transcendentals=2)) * (B * D * N)
    total += Cost(bytes=_cdiv(T, checkpoint) * B * D * N * 4 + 4 * B * D * N * 4)
    return total


@models_of("ssm")
def ssm_models(B=1, T=2048, D=1536, N=16):
    from ..kernels.ssm import checkpoint_interval, triton_launch
    (cfg, grid), (fwd_cfg, fwd_grid) = triton_launch(B, D, N, "bwd"), triton_launch(B, D, N, "fwd")
    checkpoint = checkpoint_interval(T)
    programs, fwd_programs = math.prod(grid), math.prod(fwd_grid)
    shape = f"B={B} T={T} D={D} N={N}"
    args = (B, T, D, N)
    fwd_args = (fwd_cfg["BLOCK_D"], fwd_programs, checkpoint)
    bwd_args = (cfg["BLOCK_D"], cfg["BLOCK_N"], programs, checkpoint)
    out = []
    for dtype in ("fp32", "bf16"):
        s, states = DTYPE_BYTES[dtype], B * D * N * 4
        # DRAM: u, delta, y (and dy, du, ddelta) once, B and C once (every program loads them: L2), checkpoints,
        # A and the states; the backward's dB, dC slices (written, read by the wrapper's sum) and their sums; its
        # scratch stays in L2
        slices = _cdiv(D, cfg["BLOCK_D"])
        # Steps: u, delta, B (C) loaded one step ahead (a round trip overlapping the previous step's) and one
        # exponential; the forward's y sums over the states (a reduction: within one warp at the split
        # configuration, 4 channels), the backward alternates a recompute step (none) and a reverse step (y's,
        # dB's, dC's and ddelta's sums: 3 in a row): 1.5 on average over its 2 T steps, each of its two walks per
        # run starting with a full round trip
        out += [Model("ssm", f"selective_scan_fwd D={D} N={N} {dtype}", shape, B * T, dtype,
                      ssm_fwd(*args, dtype, *fwd_args), fwd_programs, T, True,
                      B * D * T * (s + 8) + 2 * B * N * T * s + states * (_cdiv(T, checkpoint) + 3),
                      step=Step(1, 1, 1, prefetch=1, warp_reductions=fwd_cfg.num_warps == 1),
                      num_warps=fwd_cfg.num_warps),
                Model("ssm", f"selective_scan_bwd D={D} N={N} {dtype}", shape, B * T, dtype,
                      ssm_bwd(*args, dtype, *bwd_args), programs, 2 * T, False,
                      B * D * T * (s + 16) + 2 * B * N * T * (s + 4 * (2 * slices + 1))
                      + states * (_cdiv(T, checkpoint) + 4),
                      step=Step(1, 1.5, 1, prefetch=1, starts=1 / checkpoint), num_warps=cfg.num_warps)]
    return out


# ----------------------------------------------------------------------------------------------------------------
# Flash-style attention (kernels/attention/) and ReRoPE (kernels/rerope/fused.py): tiles of queries against key tiles
# ----------------------------------------------------------------------------------------------------------------

# Per score of a tile: scale, the causal/length mask (2 compares, and, select), running max, subtract, row sum:
# 8 FLOPs and 1 exp. Per tile row: the rescale factor (1 exp) and its multiply into the accumulator (BLOCK_D).
SCORE_FLOPS, SCORE_EXP = 8, 1


def _rows(lo: int, hi: int, limit: int) -> int:
    """Rows of [lo, hi) that exist (< limit): what a masked tile load reads."""
    return max(0, min(hi, limit) - lo)


def _key_tiles(lo: int, hi: int, block: int, T: int) -> tuple[int, int]:
    """(tiles, rows loaded) of the loop ``for start in range(lo, hi, block)`` over rows < T."""
    n = max(0, _cdiv(hi - lo, block))
    return n, _rows(lo, lo + n * block, T)


def _softmax_tile(bm, bn, bd):
    return Cost(flops=bm * bn * SCORE_FLOPS + bm * bd + 2 * bm, transcendentals=bm * bn * SCORE_EXP + bm)


def tf32x3_split(dots, *shapes) -> Cost:
    """The elementwise work of tf32x3 dots of (M, K) x (K, N) ``shapes`` (Triton's lowering, its PTX read in
    tests/kernels/test_aot.py): per operand element a cvt.rna.tf32 and the remainder's subtraction (2); per output
    element the NaN check and select of the middle sum and the accumulator's add (3). Counted for every dot of every
    tile (an operand the compiler hoists out of the loop, q, would be split once). Nothing for other dots."""
    if dots != "tf32x3":
        return Cost()
    return Cost(flops=sum(2 * (m * k + k * n) + 3 * m * n for m, k, n in shapes))


def _attention_fwd_program(start, T, d, dtype, bm, bn, dots):
    """One program of attention_fwd_kernel, causal, for the query tile at ``start``: (its Cost, its key tiles)."""
    s, bd = DTYPE_BYTES[dtype], block_d(d)
    rows = _rows(start, start + bm, T)
    tiles, keys = _key_tiles(0, min(start + bm, T), bn, T)
    per_tile = (Cost(dot_flops=2 * 2 * bm * bn * bd) + _softmax_tile(bm, bn, bd)
                + tf32x3_split(dots, (bm, bd, bn), (bm, bn, bd)))
    once = Cost(bytes=2 * rows * d * s + rows * 4 + 2 * keys * d * s, flops=rows * d, transcendentals=bm)
    return once + tiles * per_tile, tiles


def attention_fwd(BH, T, d, dtype, bm, bn, dots=None):
    """attention_fwd_kernel, causal: a program per BLOCK_M queries loads q, walks key tiles [0, end) loading k, v;
    per tile 2 dots (q k^T and p v) of BLOCK_M x BLOCK_N x BLOCK_D (with tf32x3, their operands split:
    tf32x3_split); stores O and LSE (1 log per row)."""
    return sum((_attention_fwd_program(start, T, d, dtype, bm, bn, dots)[0] for start in range(0, T, bm)),
               Cost()) * BH


def _attention_dq_program(start, T, d, dtype, bm, bn):
    s, bd = DTYPE_BYTES[dtype], block_d(d)
    rows = _rows(start, start + bm, T)
    tiles, keys = _key_tiles(0, min(start + bm, T), bn, T)
    per_tile = Cost(dot_flops=3 * 2 * bm * bn * bd, flops=bm * bn * (SCORE_FLOPS + 3), transcendentals=bm * bn)
    return Cost(bytes=3 * rows * d * s + 8 * rows + 2 * keys * d * s, flops=rows * d) + tiles * per_tile, tiles


def attention_bwd_dq(BH, T, d, dtype, bm, bn):
    """attention_bwd_dq_kernel: per query tile loads q, dO, LSE, D; per key tile loads k, v and does 3 dots
    (q k^T, dO v^T, dS k); P = exp(S - LSE) and dS = P (dP - D): 8 + 3 FLOPs and 1 exp per score; stores dq."""
    return sum((_attention_dq_program(start, T, d, dtype, bm, bn)[0] for start in range(0, T, bm)), Cost()) * BH


def _attention_dkdv_program(start, T, d, dtype, bm, bn):
    s, bd = DTYPE_BYTES[dtype], block_d(d)
    keys = _rows(start, start + bn, T)
    tiles, rows = _key_tiles((start // bm) * bm, T, bm, T)
    per_tile = Cost(dot_flops=4 * 2 * bm * bn * bd, flops=bm * bn * (SCORE_FLOPS + 3), transcendentals=bm * bn)
    return Cost(bytes=4 * keys * d * s + 2 * rows * d * s + 8 * rows, flops=2 * keys * d) + tiles * per_tile, tiles


def attention_bwd_dkdv(BH, T, d, dtype, bm, bn):
    """attention_bwd_dkdv_kernel: per key tile loads k, v; per query tile from the diagonal on loads q, dO, LSE, D
    and does 4 dots (q k^T, dO v^T, P^T dO, dS^T q); stores dk, dv."""
    return sum((_attention_dkdv_program(start, T, d, dtype, bm, bn)[0] for start in range(0, T, bn)), Cost()) * BH


def _last_tile(T: int, block: int) -> int:
    """Where the last tile of ``block`` rows starts."""
    return (_cdiv(T, block) - 1) * block


def tile_chain(program: tuple[Cost, int], cfg) -> tuple[int, Step]:
    """(serial steps, Step) of a flash kernel from its longest program (its Cost, its tiles): each tile that
    program's work per tile, its loads issued num_stages - 1 tiles ahead (a round trip each)."""
    cost, tiles = program
    return tiles, Step(round_trips=1, prefetch=cfg.num_stages - 1, work=cost * (1 / max(tiles, 1)))


def _flash_configs(op, d, dtype):
    """The launch configurations (fwd, bwd_dq, bwd_dkdv) the op's dispatcher picks for head size d and this dtype
    on an H100 (sm_90), and the forward's fp32 dots there (attention: tf32x3 by default; ReRoPE: IEEE)."""
    torch_dtype = AOT_DTYPES[dtype]
    if op == "rerope":
        from ..kernels.rerope import fused as module
        dots = None
    else:
        from ..kernels import attention as module
        dots = module.kernel_dots("fwd", torch_dtype, ARCH) if dtype == "fp32" else None
    return tuple(module.launch_config(kernel, d, torch_dtype) for kernel in module.KERNELS), dots


def _flash_models(op, shape, B, H, T, d, dtype, cfgs, table_bytes, costs, chains=(None, None, None), dots=None):
    """fwd, bwd_dq, bwd_dkdv of a flash-style op. DRAM: each of q, k, v, O (fwd), q, k, v, dO, dq (dq),
    q, k, v, dO, dk, dv (dkdv) once, the fp32 LSE and D rows, and any table: the K and V tiles that every query
    tile reads again (T d per head: a few MB) come from L2. ``chains``: each kernel's longest program (its Cost and
    tiles: tile_chain), or None; ``dots``: the forward's fp32 dots ("tf32x3" labels its build so)."""
    s, seq, rows = DTYPE_BYTES[dtype], B * H * T * d, B * H * T * 4
    fwd, dq, dkdv = cfgs
    kinds = (("fwd", fwd["BLOCK_M"], True, 4 * seq * s + rows),
             ("bwd_dq", dq["BLOCK_M"], False, 5 * seq * s + 2 * rows),
             ("bwd_dkdv", dkdv["BLOCK_N"], False, 6 * seq * s + 2 * rows))
    out = []
    for (kind, block, forward, dram), cost, cfg, chain in zip(kinds, costs, cfgs, chains):
        steps, step = tile_chain(chain, cfg) if chain else (0, None)
        kernel_dots = dots if forward else None
        suffix = f" {kernel_dots}" if kernel_dots == "tf32x3" else ""
        out.append(Model(op, f"{op}_{kind} d={d} {dtype}{suffix}", shape, B * T, dtype, cost,
                         B * H * _cdiv(T, block), steps, forward, dram + table_bytes, step=step,
                         num_warps=cfg.num_warps, dots=kernel_dots))
    return out


@models_of("attention")
def attention_models(B=1, H=4, T=8192, d=64):
    shape = f"B={B} H={H} T={T} d={d}"
    out = []
    for dtype in ("fp32", "bf16"):
        cfgs, dots = _flash_configs("attention", d, dtype)
        fwd, dq, dkdv = ((c["BLOCK_M"], c["BLOCK_N"]) for c in cfgs)
        costs = [attention_fwd(B * H, T, d, dtype, *fwd, dots), attention_bwd_dq(B * H, T, d, dtype, *dq),
                 attention_bwd_dkdv(B * H, T, d, dtype, *dkdv)]
        # the longest programs: the last query tile (causal: it walks every key tile), the first key tile (every
        # query tile sees it)
        chains = (_attention_fwd_program(_last_tile(T, fwd[0]), T, d, dtype, *fwd, dots),
                  _attention_dq_program(_last_tile(T, dq[0]), T, d, dtype, *dq),
                  _attention_dkdv_program(0, T, d, dtype, *dkdv))
        out += _flash_models("attention", shape, B, H, T, d, dtype, cfgs, 0, costs, chains, dots)
    return out


def _rerope_key_runs(c, T, w, bm, bn):
    """kernels/rerope/fused.py's _key_runs for a query tile starting at c (prefill): far-only, straddling, near-only."""
    end = min(T, c + bm)
    far_end = (max(c - w + 1, 0) // bn) * bn
    near_start = min(_cdiv(max(c + bm - w, 0), bn) * bn, end)
    return ((0, far_end, False, True), (far_end, near_start, True, True), (near_start, end, True, False))


def _rerope_query_runs(start_n, T, w, bm, bn):
    """kernels/rerope/fused.py's _query_runs for a key tile starting at start_n (prefill): near-only, both, far-only."""
    first = (start_n // bm) * bm
    near_end = max((max(start_n + w, 0) // bm) * bm, first)
    far_start = min(max(_cdiv(max(start_n + bn - 1 + w, 0), bm) * bm, near_end), T)
    return ((first, min(near_end, far_start), True, False), (min(near_end, far_start), far_start, True, True),
            (far_start, T, False, True))


def _rotation(rows, d):
    """One rotate-half rotation of ``rows`` rows (``_rotation`` + ``_rotate_halves``): cos and sin loaded from the
    fp32 rotation table (rows x d/2 each), 4 multiplies and 2 adds per pair of dimensions."""
    return Cost(bytes=rows * d * 4, flops=rows * (d // 2) * 6)


def _rerope_query_tile(c, T, d, dtype, bm, bn, w, keys=(0, None)):
    """One query tile of rerope_fwd_kernel starting at position c, over the keys [keys[0], keys[1]) (the split's
    slice in decode; all of them by default): loads q, takes log-n (1 log per row), rotates q twice (near and
    far); per key tile of each run loads k, rotates it for the near path (the far key is the raw key), loads v,
    2 dots per path (the two halves, d/2 each) and the p v dot; stores O, LSE (1 log per row)."""
    s = DTYPE_BYTES[dtype]
    bf, bd = block_d(d // 2), block_d(d)
    first, last = keys[0], T if keys[1] is None else keys[1]
    rows = _rows(c, c + bm, T)
    total = Cost(bytes=2 * rows * d * s + rows * 4, flops=3 * bm * bd + 4 * bm, transcendentals=2 * bm)
    total += 2 * _rotation(bm, d)
    for lo, hi, near, far in _rerope_key_runs(c, T, w, bm, bn):
        tiles, loaded = _key_tiles(max(lo, first), min(hi, last), bn, T)
        paths = near + far
        per_tile = Cost(dot_flops=paths * 2 * 2 * bm * bn * bf + 2 * bm * bn * bd,
                        flops=bm * bn * (near and far)) + _softmax_tile(bm, bn, bd)
        if near:
            per_tile += _rotation(bn, d)
        total += tiles * per_tile + Cost(bytes=2 * loaded * d * s)
    return total


def _rerope_tiles(c, T, w, bm, bn, keys=(0, None)):
    """Key tiles the query tile at c walks (its three runs; in decode only the split's slice of keys)."""
    first, last = keys[0], T if keys[1] is None else keys[1]
    runs = _rerope_key_runs(c, T, w, bm, bn)
    return sum(_key_tiles(max(lo, first), min(hi, last), bn, T)[0] for lo, hi, _, _ in runs)


def rerope_fwd(BH, T, d, dtype, bm, bn, w):
    """rerope_fwd_kernel (ReRoPE, not leaky), prefill: every query tile (_rerope_query_tile)."""
    return sum((_rerope_query_tile(c, T, d, dtype, bm, bn, w) for c in range(0, T, bm)), Cost()) * BH


def rerope_decode(BH, T, d, dtype, bm, bn, w, per_split):
    """rerope_fwd_kernel with one query at T - 1 in a tile of bm rows (ReRoPE, not leaky), flash-decoding: each
    slice of per_split keys is a program (_rerope_query_tile over its slice; its O stored in fp32), then the merge
    reads the splits' O and LSE and writes O (about 4 FLOPs and 1 exp per split and column). The splits' O is
    counted at the input dtype's size (it is fp32: a few bytes per split)."""
    splits = _cdiv(T, per_split)
    total = sum((_rerope_query_tile(T - 1, T, d, dtype, bm, bn, w, (lo, lo + per_split))
                 for lo in range(0, T, per_split)), Cost())
    total += Cost(bytes=splits * (d + 1) * 4 + d * DTYPE_BYTES[dtype], flops=4 * splits * d,
                  transcendentals=splits * d) if splits > 1 else Cost()
    return total * BH


def rerope_bwd_dq(BH, T, d, dtype, bm, bn, w):
    """rerope_bwd_dq_kernel: as the forward's walk, plus loads of dO, LSE, D; per key tile the dP dot, and per
    path the score dots and 2 dq dots; at the end both rotations undone (2 rotations), dq stored."""
    s = DTYPE_BYTES[dtype]
    bf, bd = block_d(d // 2), block_d(d)
    total = Cost()
    for c in range(0, T, bm):
        rows = _rows(c, c + bm, T)
        total += Cost(bytes=3 * rows * d * s + 8 * rows, flops=3 * bm * bd + 4 * bm, transcendentals=2 * bm)
        total += 4 * _rotation(bm, d)
        for lo, hi, near, far in _rerope_key_runs(c, T, w, bm, bn):
            tiles, keys = _key_tiles(lo, hi, bn, T)
            paths = near + far
            per_tile = Cost(dot_flops=paths * 4 * 2 * bm * bn * bf + 2 * bm * bn * bd,
                            flops=bm * bn * (SCORE_FLOPS + 3 + 2 * (near and far)), transcendentals=bm * bn)
            if near:
                per_tile += _rotation(bn, d)
            total += tiles * per_tile + Cost(bytes=2 * keys * d * s)
    return total * BH


def rerope_bwd_dkdv(BH, T, d, dtype, bm, bn, w):
    """rerope_bwd_dkdv_kernel: per key tile loads k, v, rotates k (near); per query tile of each run loads q, dO,
    LSE, D, recomputes log-n and the query rotations of the run's paths, the dP and dv dots, per path the score
    dots and 2 dk dots; at the end the near rotation undone, dk and dv stored."""
    s = DTYPE_BYTES[dtype]
    bf, bd = block_d(d // 2), block_d(d)
    total = Cost()
    for start in range(0, T, bn):
        keys = _rows(start, start + bn, T)
        total += Cost(bytes=4 * keys * d * s) + 2 * _rotation(bn, d)
        for lo, hi, near, far in _rerope_query_runs(start, T, w, bm, bn):
            tiles, rows = _key_tiles(lo, hi, bm, T)
            paths = near + far
            per_tile = (Cost(dot_flops=paths * 4 * 2 * bm * bn * bf + 2 * 2 * bm * bn * bd,
                             flops=bm * bn * (SCORE_FLOPS + 3 + 2 * (near and far)) + 3 * bm * bf,
                             transcendentals=bm * bn + bm) + paths * _rotation(bm, d))
            total += tiles * per_tile + Cost(bytes=2 * rows * d * s + 8 * rows)
    return total * BH


@models_of("rerope")
def rerope_models(B=1, H=4, T=8192, d=64, w=512):
    shape = f"B={B} H={H} T={T} d={d} w={w}"
    out = []
    for dtype in ("fp32", "bf16"):
        cfgs, _ = _flash_configs("rerope", d, dtype)
        costs = [fn(B * H, T, d, dtype, c["BLOCK_M"], c["BLOCK_N"], w)
                 for fn, c in zip((rerope_fwd, rerope_bwd_dq, rerope_bwd_dkdv), cfgs)]
        # the forward's longest program: the last query tile, over every key tile (the backwards: not modelled yet)
        bm, bn = cfgs[0]["BLOCK_M"], cfgs[0]["BLOCK_N"]
        c = _last_tile(T, bm)
        chains = ((_rerope_query_tile(c, T, d, dtype, bm, bn, w), _rerope_tiles(c, T, w, bm, bn)), None, None)
        # the rotation table (paths NEAR and FAR_Q, cos and sin, T x d/2 fp32) is read once for all heads
        out += _flash_models("rerope", shape, B, H, T, d, dtype, cfgs, 2 * 2 * T * (d // 2) * 4, costs, chains)
        out.append(_rerope_decode_model(B, H, T, d, dtype, w))
        out.append(_rerope_decode_merged_model(B, H, T, d, dtype, w))
    return out


def _rerope_decode_model(B, H, T, d, dtype, w):
    """Decode of one token against a cache of T keys (ReRoPE): flash-decoding's programs, beside the unsplit
    kernel's prediction (one program per head, as before: B H of the 132 SMs). DRAM: K and V once, the table rows
    the near band and the query read (NEAR for about w keys, FAR_Q), the splits' partial results."""
    from ..kernels.rerope.fused import decode_splits, launch_config
    cfg = launch_config("decode", d, AOT_DTYPES[dtype])
    per_split, splits = decode_splits(T, B * H, cfg["BLOCK_N"])
    s = DTYPE_BYTES[dtype]
    dram = B * H * (2 * T * d * s + splits * (d + 1) * 4) + 2 * 2 * (w + cfg["BLOCK_N"]) * (d // 2) * 4
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    cost = rerope_decode(B * H, T, d, dtype, bm, bn, w, per_split)
    unsplit = predict(rerope_decode(B * H, T, d, dtype, bm, bn, w, T), dtype, dram, programs=B * H)[0]
    # the longest split: the last (it holds the near band); its tiles wait on their loads num_stages - 1 ahead
    lo = (splits - 1) * per_split
    steps, step = tile_chain((_rerope_query_tile(T - 1, T, d, dtype, bm, bn, w, (lo, lo + per_split)),
                              _rerope_tiles(T - 1, T, w, bm, bn, (lo, lo + per_split))), cfg)
    return Model("rerope", f"rerope_decode d={d} {dtype}", f"B={B} H={H} T_k={T} d={d} w={w}", B, dtype, cost,
                 B * H * splits, steps, True, dram,
                 f"{splits} splits of {per_split} keys, {decode_launches(dtype, splits)} launches; unsplit: "
                 f"{_us(unsplit)} us", step=step, num_warps=cfg.num_warps, launches=decode_launches(dtype, splits))


def decode_launches(dtype: str, splits: int) -> int:
    """Kernel launches of one ReRoPE decode call: the split kernel, then (with more than one split) fused._merge_splits
    in torch: torch.logsumexp's 9 (amax, abs, eq, masked_fill, sub, exp, sum, log, add: ATen's
    logsumexp_out_impl), then sub, exp, mul and sum, and the cast to a 16-bit dtype (the GPU review's count)."""
    return 1 + (9 + 4 + (dtype != "fp32") if splits > 1 else 0)


def rerope_decode_merged(BH, T, d, dtype, bn, w, per_split):
    """rerope_decode_merged_kernel (kernels/rerope/decode.py; ReRoPE, not leaky): per program of a slice of per_split
    keys, q loaded, log-n (1 log), q rotated twice; per key tile of its runs k and v loaded, k rotated for the near
    path, per path d products and d adds per key (no tl.dot: one row), the band's select, the online softmax (max,
    subtract, sum: 4 per key, 1 exp) and p v (2 per key and column); O_s (fp32) and LSE_s (1 log) stored, one atomic.
    The last program of each head merges: LSE_s read twice, O_s once, 3 FLOPs and 1 exp per slice and column."""
    s, bd = DTYPE_BYTES[dtype], block_d(d)
    splits = _cdiv(T, per_split)
    total = Cost()
    for lo in range(0, T, per_split):
        total += Cost(bytes=d * s + (d + 1) * 4 + 4, flops=3 * d + 4, transcendentals=2) + 2 * _rotation(1, d)
        for run_lo, run_hi, near, far in _rerope_key_runs(T - 1, T, w, 1, bn):
            tiles, loaded = _key_tiles(max(run_lo, lo), min(run_hi, lo + per_split), bn, T)
            per_tile = Cost(flops=bn * (2 * d * (near + far) + (near and far) + 4) + 2 * bn * bd + bd,
                            transcendentals=bn + 1) + (_rotation(bn, d) if near else Cost())
            total += tiles * per_tile + Cost(bytes=2 * loaded * d * s)
    total += Cost(bytes=splits * (d + 2) * 4 + d * s, flops=3 * splits * d, transcendentals=splits)
    return total * BH


def _rerope_decode_merged_model(B, H, T, d, dtype, w):
    """Decode on the backend "triton_merged": one launch that reads K and V once, the splits' merge in the same
    kernel. DRAM: K and V, the query and the output, the table rows the near band and the query read, the slices'
    O_s and LSE_s written and read back once. No serial chain is modelled (the 2 key tiles a program walks at the
    benchmark's shape and the merge's dependent loads are not in the prediction: the first GPU run of this kernel
    measures how far they take it from bytes / bandwidth); its one launch takes at least the launch floor, as every
    kernel's."""
    from ..kernels.rerope.decode import launch_config
    from ..kernels.rerope.fused import decode_splits
    bn = launch_config(d, AOT_DTYPES[dtype])["BLOCK_N"]
    per_split, splits = decode_splits(T, B * H, bn)
    s = DTYPE_BYTES[dtype]
    dram = (B * H * (2 * T * d * s + 2 * d * s + 2 * splits * (d + 1) * 4)
            + 2 * 2 * (w + bn) * (d // 2) * 4)
    cost = rerope_decode_merged(B * H, T, d, dtype, bn, w, per_split)
    return Model("rerope", f"rerope_decode_merged d={d} {dtype}", f"B={B} H={H} T_k={T} d={d} w={w}", B, dtype, cost,
                 B * H * splits, 0, True, dram,
                 f"one launch: {splits} splits of {per_split} keys, merged in the kernel",
                 num_warps=launch_config(d, AOT_DTYPES[dtype]).num_warps, dot_unit="none")


# ----------------------------------------------------------------------------------------------------------------
# Collecting, compiling, reporting
# ----------------------------------------------------------------------------------------------------------------

# Each benchmarked op's builder, by the op's stem ("rerope" for both ReRoPE ops), in the registry's benchmark order
MODEL_BUILDERS = {stem: _BUILDERS[stem] for stem in dict.fromkeys(op.stem for op in benchmarked())}


def models() -> tuple[list[Model], list[str]]:
    """Every kernel's model whose module exists, and a note for each that does not."""
    out, missing = [], []
    for op, build in MODEL_BUILDERS.items():
        try:
            out += build()
        except ImportError as e:
            missing.append(f"{op}: {e}")
    return out, missing


def aot_figures(labels: list[str]) -> dict:
    """Registers, spills and shared memory for sm_90 of the kernels with these labels, compiled in a fresh process
    without TRITON_INTERPRET (the JIT must be real to build for a GPU target)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "seqmix.benchmarks.cost_model", "--aot-json", json.dumps(labels)],
                          capture_output=True, text=True, env=env,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _compile_labels(labels: list[str]) -> dict:
    from ..kernels.aot import collect, compile_one
    wanted = set(labels)
    result = {}
    for k in collect():
        if k.label in wanted:
            try:
                figures = compile_one(k, ARCH)
                result[k.label] = {key: value for key, value in figures.items() if key not in ("ptx", "ttgir")}
            except Exception as e:  # a compile error is a figure to show
                result[k.label] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"}
    return result


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _us(s: float) -> str:
    return f"{s * 1e6:.3g}"


def _aot_cells(figures: dict | None, compiled: bool, aot: dict) -> list[str]:
    """regs, spill, stack, shared for one kernel, or why they are missing."""
    if not compiled:
        return ["not built", "", "", ""]
    if "error" in aot:
        return ["AOT build failed", "", "", ""]
    if figures is None:
        return ["not in aot_kernels()", "", "", ""]
    if "error" in figures:
        return [figures["error"], "", "", ""]
    return [str(figures[key]) for key in ("regs", "spill_bytes", "stack", "shared")]


def report(compile_aot: bool = True, measured: list[dict] | None = None) -> dict:
    """The markdown table and its rows. ``measured``: benchmark rows (on a GPU) to set beside the predictions of
    the forward kernels at the same shapes."""
    mods, missing = models()
    aot = aot_figures([m.aot_label for m in mods]) if compile_aot and mods else {}
    rows = []
    for m in mods:
        figures = aot.get(m.aot_label) or {}
        mma = figures.get("mma", m.dot_unit) if m.dot_unit is None else m.dot_unit
        regs = figures.get("regs")
        wait = latency(m, mma=mma, regs=regs)
        t, bound = predicted(m, mma, regs)
        roofline, _ = predict(m.cost, m.dtype, m.dram_bytes, mma=mma, dots=m.dots)
        c = m.cost
        row = {"op": m.op, "kernel": m.aot_label, "shape": m.shape, "dtype": m.dtype, "forward": m.forward,
               "bytes_per_token": c.bytes / m.tokens, "dram_bytes_per_token": m.dram_bytes / m.tokens,
               "dot_flops_per_token": c.dot_flops / m.tokens,
               "flops_per_token": c.flops / m.tokens, "transcendentals_per_token": c.transcendentals / m.tokens,
               "intensity": (c.dot_flops + c.flops) / m.dram_bytes, "predicted_s": t, "bound": bound,
               "roofline_s": roofline, "latency_s": wait, "mma": mma or "-",
               "programs": m.programs, "serial_steps": m.serial_steps, "aot": aot.get(m.aot_label)}
        if measured and m.forward and m.dtype == "fp32":
            hit = [r for r in measured if r["op"] == m.op and r["impl"] == "seqmix triton" and r["status"] == "ok"
                   and f"T={r['T']}" in m.shape.split()]
            if hit:
                row["measured_s"] = hit[0]["median_s"]
        rows.append(row)
    lines = [f"Predicted for an {H100['name']}: {H100['bandwidth'] / 1e12:.3g} TB/s; dots at "
             f"{H100['wgmma'] / 1e12:.0f} TFLOP/s (wgmma), {H100['mma.sync'] / 1e12:.0f} (mma.sync), "
             f"{dot_rate('fp32', 'wgmma', dots='tf32x3')[0] / 1e12:.1f} (fp32 with tf32x3), "
             f"{H100['fma_dot'] / 1e12:.1f} (FMA units: fp32 IEEE dots); other fp32 ops {H100['fp32_ops'] / 1e12:.1f} "
             f"T/s; special functions {H100['sfu'] / 1e12:.1f} T/s; latency per serial step from a DRAM round trip "
             f"({H100['dram_latency'] * 1e6:.2g} us), reductions across warps ({H100['reduce_latency'] * 1e6:.2g} us), "
             f"dependent tile products ({H100['dot_latency'] * 1e6:.2g} us) and special-function ops; a flash "
             f"kernel's serial steps are its longest program's tiles, each at one SM's share. Predicted = the "
             f"largest of memory, compute and latency, at least a launch floor ({H100['launch_floor'] * 1e6:.2g} us) "
             f"per launch; roofline = without latency and launches. MMA, registers (they set the waves of programs), "
             f"spills, stack and shared memory from `kernels.aot` for sm_{ARCH}. Per token = per (batch, position).",
             "",
             "| kernel | shape | bytes/token: issued, DRAM | FLOP/token (dot + other) | exp, log /token | "
             "FLOP/DRAM byte | roofline | latency | predicted | bound | programs x serial steps | mma | regs | "
             "spill B | stack B | shared B |" + (" measured / predicted |" if measured else ""),
             "|" + "---|" * (16 + bool(measured))]
    for r in rows:
        lines.append(f"| {r['kernel']} | {r['shape']} | {_fmt(r['bytes_per_token'])}, "
                     f"{_fmt(r['dram_bytes_per_token'])} | "
                     f"{_fmt(r['dot_flops_per_token'])} + {_fmt(r['flops_per_token'])} | "
                     f"{_fmt(r['transcendentals_per_token'])} | {r['intensity']:.3g} | {_us(r['roofline_s'])} us | "
                     f"{_us(r['latency_s']) + ' us' if r['latency_s'] else '-'} | {_us(r['predicted_s'])} us | "
                     f"{r['bound']} | {r['programs']} x {r['serial_steps'] or '-'} | {r['mma']} | "
                     + " | ".join(_aot_cells(r["aot"], compile_aot, aot)) + " |"
                     + ((f" {r['measured_s'] / r['predicted_s']:.3g} |" if "measured_s" in r else " |")
                        if measured else ""))
    noted = [m for m in mods if m.notes]
    if noted:
        lines += ["", "Notes:"] + [f"- {m.aot_label}: {m.notes}" for m in noted]
    if "error" in aot:
        lines.append(f"\nThe AOT build failed: {aot['error']}")
    lines += [f"\nNo model yet: {m}" for m in missing]
    return {"markdown": "\n".join(lines), "rows": rows}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--aot-json"]:
        print(json.dumps(_compile_labels(json.loads(argv[1]))))
        return 0
    print(report(compile_aot="--no-aot" not in argv)["markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
