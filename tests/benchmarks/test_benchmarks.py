"""benchmarks/: the peers compute what the ops compute, the harness runs end to end at tiny shapes and writes its
report, the memory probe sees torch's allocations, and the cost model's counts match hand counts. No timing is
asserted: speed is what the benchmarks report, not what tests check."""
import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from seqmix.benchmarks import cost_model, peers, run
from seqmix.kernels.inputs import rwkv7_inputs
from seqmix.kernels import attention
from seqmix.kernels.testing import FP32_BUDGET, assert_close, fp32
from seqmix.reference import attention as ref_attention
from seqmix.reference import rope as ref_rope
from seqmix.reference import ssm as ref_ssm
from seqmix.reference import wkv4 as ref_wkv4
from seqmix.reference import wkv7 as ref_wkv7

needs_transformers = pytest.mark.skipif(not peers.HAS_TRANSFORMERS, reason="transformers is not installed")


@needs_transformers
def test_hf_wkv4_matches_the_reference(rng):
    B, T, C = 2, 9, 5
    w, u = -np.exp(rng.normal(size=C)), rng.normal(size=C)
    k, v = rng.normal(size=(B, T, C)), rng.normal(size=(B, T, C))
    expected, _ = ref_wkv4.wkv4(w, u, k, v)
    assert_close(peers.hf_wkv4(*fp32(w, u, k, v)), expected, FP32_BUDGET, "transformers' RWKV-4 loop")


@needs_transformers
def test_hf_selective_scan_matches_the_reference(rng):
    B, D, N, T = 2, 3, 4, 7
    u, delta, z = (rng.normal(size=(B, D, T)) for _ in range(3))
    A = -np.exp(rng.normal(size=(D, N)))
    Bm, Cm = rng.normal(size=(B, N, T)), rng.normal(size=(B, N, T))
    D_skip, delta_bias = rng.normal(size=D), rng.normal(size=D)
    expected, _ = ref_ssm.selective_scan(u, delta, A, Bm, Cm, D=D_skip, z=z, delta_bias=delta_bias,
                                         delta_softplus=True)
    actual = peers.hf_selective_scan(*fp32(u, delta, A, Bm, Cm, D_skip, z, delta_bias))
    assert_close(actual, expected, FP32_BUDGET, "transformers' Mamba scan")


def test_wkv7_per_token_matches_the_reference(rng):
    x, _ = rwkv7_inputs(rng, 2, 6, 2, 4, state=False)
    expected, _ = ref_wkv7.wkv7(*x)
    assert_close(peers.wkv7_per_token(*fp32(*x)), expected, FP32_BUDGET, "per-token WKV-7")


@pytest.mark.parametrize("T, window", [(1, 1), (9, 3), (12, 20)])
def test_rerope_two_pass_matches_the_reference(rng, T, window):
    q, k, v = (rng.normal(size=(2, 3, T, 8)) for _ in range(3))
    expected = ref_rope.rerope_attention(q, k, v, window)
    assert_close(peers.rerope_two_pass(*fp32(q, k, v), window), expected, FP32_BUDGET, "two-pass ReRoPE")


def test_sdpa_rope_is_causal_attention_after_rope(rng):
    T = 11
    q, k, v = (rng.normal(size=(1, 2, T, 8)) for _ in range(3))
    pos = np.arange(T)
    expected = ref_attention.softmax_attention(ref_rope.apply_rope(q, pos), ref_rope.apply_rope(k, pos), v)
    assert_close(peers.sdpa_rope(*fp32(q, k, v)), expected, FP32_BUDGET, "SDPA + RoPE")


def test_streaming_pass_copies_its_first_tensor():
    x, y = torch.randn(3, 4), torch.randn(5)
    out = peers.streaming_pass(x, y)
    assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()


def test_peak_memory_sees_a_torch_allocation():
    """The probe behind the memory column: a call that holds a 64 MiB tensor peaks at 64 MiB above its inputs."""
    if run.DEVICE.type != "cpu":
        pytest.skip("the resident-memory probe is the CPU one (CUDA uses torch.cuda's counters)")
    run.map_large_blocks()                           # as each benchmark worker does
    size = 64 * 2**20
    result = run.measure(lambda x: torch.ones(size // 4) + x["a"], {"a": torch.zeros(1)}, 1, 1, 0.0)
    # torch.ones and the sum: two 64 MiB tensors, the first freed after the add. Linux batches its resident-page
    # counters per thread (up to 64 pages each), so the figure is good to about a MiB.
    assert 2 * size - 2**20 <= result["peak_bytes"] < 2 * size + 8 * 2**20, result["peak_bytes"]


def test_a_case_slower_than_its_budget_gets_one_timed_run():
    """The time cap: a case whose warm-up outlasts the budget is timed once; one that fits is timed min_runs times
    at least."""
    slow = run.measure(lambda x: time.sleep(0.05), {}, 3, 15, 0.01)
    fast = run.measure(lambda x: None, {}, 3, 15, 0.01)
    assert len(slow["times"]) == 1 and slow["times"][0] >= 0.05
    assert 3 <= len(fast["times"]) <= 15


def test_quick_run_writes_the_report(tmp_path):
    """The whole harness at tiny shapes: every case runs (or is skipped for a stated reason), and the report,
    the plot and the JSON are written. No number is checked: the timings of a shared CPU mean nothing here."""
    assert run.main(["--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    errors = [r for r in data["rows"] if r["status"].startswith("error")]
    assert not errors, errors
    ops = run.all_ops(quick=True)
    assert {r["op"] for r in data["rows"]} == {op.name for op in ops}
    ok = [r for r in data["rows"] if r["status"] == "ok"]
    assert ok and all(r["runs"] >= 2 and r["median_s"] > 0 and r["peak_bytes"] >= 0 for r in ok)
    report = (tmp_path / "results.md").read_text()
    for heading in ("## Headline", "## Training: forward + backward", "## Linear ops", "## Time and memory against T",
                    "## GPU cost model"):
        assert heading in report
    for op in ops:
        assert f"| {op.title}, {op.shape}, T=" in report
    assert (tmp_path / "scaling.png").stat().st_size > 10_000


def test_cost_model_wkv4_forward_hand_count():
    """B = 1, T = 2, C = 1, fp32, no saving. Bytes: per step k, v read and y written (12) twice = 24; w, u once
    (8); the state read (12) and written (12) = 24: 56. FLOPs: per step 13 for the output and 16 for the update,
    twice = 58, plus 8 for the final max's rounding: 66. Exponentials: 4 per step, twice, plus e^err twice: 10."""
    c = cost_model.wkv4_fwd(1, 2, 1, "fp32", save=False)
    assert (c.bytes, c.flops, c.dot_flops, c.transcendentals) == (56, 66, 0, 10)


def test_cost_model_attention_forward_hand_count():
    """One head, T = 2, d = 16, tiles 64 x 64, fp32: one query tile of 2 real rows and one key tile.
    Bytes: q and O (2 rows x 16 x 4 each = 256), LSE (2 x 4 = 8), k and v (2 rows x 16 x 4 each = 256): 520.
    Dots: q k^T and p v, each 2 x 64 x 64 x 16 = 131072: 262144 (padded tiles compute in full)."""
    c = cost_model.attention_fwd(1, 2, 16, "fp32", 64, 64)
    assert c.bytes == 520 and c.dot_flops == 262144


def test_cost_model_tf32x3_split_hand_count():
    """The same tile with tf32x3 dots: the same dot FLOPs, and the split's elementwise work. q k^T is (64, 16) x
    (16, 64): 2 x (64 x 16 + 16 x 64) = 4096 (a cvt.rna.tf32 and a subtraction per operand element) + 3 x 64 x 64 =
    12288 (the middle sum's NaN check and select, the accumulator's add, per output element) = 16384; p v is
    (64, 64) x (64, 16): 2 x (64 x 64 + 64 x 16) = 10240 + 3 x 64 x 16 = 3072 = 13312; 29696 in all."""
    ieee = cost_model.attention_fwd(1, 2, 16, "fp32", 64, 64)
    tf32x3 = cost_model.attention_fwd(1, 2, 16, "fp32", 64, 64, "tf32x3")
    assert tf32x3.dot_flops == ieee.dot_flops and tf32x3.flops - ieee.flops == 29696


def _attention_model(label):
    return next(m for m in cost_model.attention_models(1, 4, 8192, 64) if m.aot_label == label)


def test_bf16_flash_forward_is_bound_by_its_longest_tile_chain():
    """B 1, H 4, T 8192, d 64, bf16; tiles 128 x 64 at 8 warps, 3 stages (kernels/attention). The last query tile
    walks 8192 / 64 = 128 key tiles. Per tile: 2 dots of 2 x 128 x 64 x 64 = 2,097,152 FLOP at one SM's share of
    35% of 990 TFLOP/s (346.5 / 132 = 2.625 TFLOP/s); 128 x 64 x 8 (scores) + 128 x 64 (the rescale) + 2 x 128, plus
    the program's one division per output (128 x 64) spread over its 128 tiles: 74,048 lane-ops at one SM's
    128 x 1.98 G/s; 128 x 64 + 128 exp, plus the program's 128 logs / 128 tiles: 8321 at 16 x 1.98 G/s; the loads,
    3 stages ahead, hide under it. The roofline: query tile i walks 2 (i + 1) key tiles, i = 0 .. 63, in 4 heads:
    16,640 tiles, 34.9 GFLOP at 346.5 TFLOP/s, 101 us, under the chain's 173 us."""
    m = _attention_model("attention_fwd d=64 bf16")
    sm = cost_model.H100["sms"]
    per_tile = (2_097_152 / (0.35 * 990e12 / sm) + 74_048 / (128 * 1.98e9) + 8321 / (16 * 1.98e9))
    assert (m.programs, m.serial_steps) == (4 * 8192 // 128, 128)
    assert cost_model.latency(m, mma="wgmma") == pytest.approx(128 * per_tile)
    t, bound = cost_model.predicted(m, mma="wgmma", regs=114)
    assert bound == "latency" and t == pytest.approx(128 * per_tile)
    # key tiles walked: query tile i (128 rows) walks 2 (i + 1) tiles of 64 keys, i = 0 .. 63, in 4 heads
    tiles = 4 * sum(2 * (i + 1) for i in range(64))
    assert m.cost.dot_flops == tiles * 2_097_152
    assert cost_model.predict(m.cost, "bf16", m.dram_bytes, mma="wgmma")[0] == \
        pytest.approx(tiles * 2_097_152 / (0.35 * 990e12))
    # the H100 (run 5) took 218 us for this call, seqmix's kernel and SDPA's flash backend alike: within 2x
    assert 0.5 < 218e-6 / t < 2


def test_fp32_flash_forward_on_sm90_is_priced_as_tf32x3_on_wgmma():
    """fp32 on an H100: tf32x3 on 64 x 32 tiles (the default there). Dots: query tile i (64 rows) walks 2 (i + 1)
    key tiles of 32, i = 0 .. 127, in 4 heads, each 2 x 2 x 64 x 32 x 64 = 524,288 FLOP, at 35% of the 495 TFLOP/s
    tf32 peak over 3 products = 57.75 TFLOP/s: compute-bound there. The last query tile walks 256 key tiles."""
    m = _attention_model("attention_fwd d=64 fp32 tf32x3")
    assert (m.dots, m.programs, m.serial_steps) == ("tf32x3", 4 * 8192 // 64, 256)
    tiles = 4 * sum(2 * (i + 1) for i in range(128))
    assert m.cost.dot_flops == tiles * 524_288
    t, bound = cost_model.predicted(m, mma="wgmma", regs=174)
    assert bound == "tensor cores (wgmma, tf32x3)"
    assert t == pytest.approx(tiles * 524_288 / (0.35 * 495e12 / 3))
    # IEEE (the setting "ieee", and below sm_90): the FMA units' 25% of 67 TFLOP/s on 32 x 32 tiles
    previous = attention.set_fp32_dot_precision("ieee")
    try:
        ieee = _attention_model("attention_fwd d=64 fp32")
    finally:
        attention.set_fp32_dot_precision(previous)
    assert ieee.dots == "ieee" and cost_model.predicted(ieee, mma="none")[1] == "FMA-unit dots"


def test_chunked_wkv7_step_is_its_loads_reductions_and_dependent_products():
    """Chunked WKV-7, B 1, T 2048, H 12, N 64. The forward's serial pass (the scan) walks groups of 4 sub-chunks of
    16 steps in bf16 (2048 / 64 = 32 groups; fp32: groups of one, 128), one program per 16 rows of a head's state
    (12 x 64 / 16 = 48, one wave); a step is one dependent product (0.07 us) and the next group's map, loaded a step
    ahead: one DRAM round trip (0.5 us) over two steps, (0.5 + 0.07) / 2 = 0.285 us. The backward's scan is the same
    kernel over the same groups, reversed. The preps, the outputs and the backward's walks over a group have no
    serial chain. The gradient kernel: one program of 4 warps per sub-chunk and head (128 x 12 = 1536), one step
    each of b = 4 key (and value) blocks: 3 b^2 + 9 b = 84 round trips, 6 b + b^2 = 40 reductions and
    3 b^2 + 11 b + 6 = 98 dependent products, 84 x 0.5 + 40 x 0.1 + 98 x 0.07 = 52.86 us; at its build's 168
    registers three programs fit an SM (168 x 32 x 4 = 21,504 of 65,536 registers): 1536 / (132 x 3) -> 4 waves."""
    models = {m.aot_label: m for m in cost_model.wkv7_models(1, 2048, 12, 64)}
    scan, grads = models["wkv7_chunked_fwd_scan N=64 bf16"], models["wkv7_chunked_bwd_grads N=64 bf16"]
    back = models["wkv7_chunked_bwd_scan N=64 bf16"]
    assert (scan.programs, scan.serial_steps, grads.programs, grads.num_warps) == (48, 32, 1536, 4)
    assert (back.programs, back.serial_steps) == (48, 32)
    assert models["wkv7_chunked_fwd_scan N=64 fp32"].serial_steps == 128
    assert models["wkv7_chunked_bwd_scan N=64 fp32"].serial_steps == 128
    assert cost_model.latency(scan) == pytest.approx(32 * (0.5 + 0.07) / 2 * 1e-6)
    assert cost_model.latency(back) == cost_model.latency(scan)
    parallel = [f"wkv7_chunked_{part} N=64 bf16" for part in ("fwd_prep", "fwd_output", "bwd_prep", "bwd_states",
                                                              "bwd_dstates")]
    for label in parallel:
        assert not models[label].serial_steps and cost_model.latency(models[label]) == 0.0
    assert "wkv7_chunked_bwd_states N=64 fp32" not in models     # fp32: groups of one, the forward's states
    step = (84 * 0.5 + 40 * 0.1 + 98 * 0.07) * 1e-6
    assert cost_model.latency(grads, regs=168) == pytest.approx(4 * step)
    # by warps alone 16 programs fit an SM: 1536 / (132 x 16) -> one wave
    assert cost_model.latency(grads) == pytest.approx(step)


def test_decode_pays_a_launch_floor_per_kernel():
    """ReRoPE decode, B H = 4, 8192 keys, d 64, bf16: the split kernel and the torch merge's 14 kernels
    (torch.logsumexp's 9, sub, exp, mul, sum, the cast to bf16), each at least 1.9 us. DRAM: K and V (2 x 8192 x 64
    x 2 bytes) and the 64 splits' O and LSE (64 x 65 x 4) per head, 4 heads, + the table rows ((512 + 64) keys x 32
    x 4 bytes, cos and sin, 2 paths) = 8,750,080 bytes, 2.61 us: the floors bind, 2.61 + 14 x 1.9 us. fp32 has no
    cast: 14 launches."""
    decode = next(m for m in cost_model.rerope_models() if m.aot_label == "rerope_decode d=64 bf16")
    assert decode.launches == 15 and decode.dram_bytes == 8_750_080
    t, bound = cost_model.predicted(decode, mma="mma.sync")
    assert bound == "launch floors" and t == pytest.approx(8_750_080 / 3.35e12 + 14 * 1.9e-6)
    assert cost_model.decode_launches("fp32", 64) == 14 and cost_model.decode_launches("bf16", 1) == 1


@pytest.mark.parametrize("path", ["attention/__init__.py", "rerope/fused.py", "_flash.py"])
def test_the_flash_kernels_ask_for_the_dot_precision_the_cost_model_assumes(path):
    """cost_model prices fp32 dots as the launchers ask for them (tf32x3 for attention's forward on sm_90, IEEE
    products on the FMA units elsewhere): every tl.dot takes the DOT constexpr, which the launchers set from the
    setting, "auto" by default."""
    source = Path(__file__).resolve().parents[2].joinpath("kernels", path).read_text()
    calls = re.findall(r"tl\.dot\((.*)", source)
    assert calls and all("input_precision=DOT" in call for call in calls)
    previous = attention.set_fp32_dot_precision("ieee")
    attention.set_fp32_dot_precision(previous)
    assert previous == "auto"


def test_roofline_picks_the_binding_resource():
    hw = cost_model.H100
    assert cost_model.predict(cost_model.Cost(), "fp32", dram_bytes=hw["bandwidth"]) == (1.0, "memory")
    # bytes issued beyond the DRAM bytes (re-reads that L2 serves) do not enter the memory time
    assert cost_model.predict(cost_model.Cost(bytes=10 * hw["bandwidth"]), "fp32", hw["bandwidth"])[0] == 1.0
    # dots at the rate their compiled instruction reaches: wgmma, mma.sync (also the guess for bf16 without a
    # build), the FMA units for fp32 IEEE dots; 35% of 990 TFLOP/s on either tensor-core instruction (FA2's class)
    assert cost_model.predict(cost_model.Cost(dot_flops=346.5e12), "bf16", 0.0, mma="wgmma") == \
        (pytest.approx(1.0), "tensor cores (wgmma)")
    assert cost_model.predict(cost_model.Cost(dot_flops=346.5e12), "bf16", 0.0) == \
        (pytest.approx(1.0), "tensor cores (mma.sync)")
    assert cost_model.predict(cost_model.Cost(dot_flops=hw["fma_dot"]), "fp32", 0.0) == (1.0, "FMA-unit dots")
    # fp32 with tf32x3: 35% of the 495 TFLOP/s tf32 peak, three products per product: 57.75 TFLOP/s
    assert cost_model.predict(cost_model.Cost(dot_flops=57.75e12), "fp32", 0.0, mma="wgmma", dots="tf32x3") == \
        (pytest.approx(1.0), "tensor cores (wgmma, tf32x3)")
    assert hw["wgmma"] < hw["tensor"] and hw["mma.sync"] <= hw["wgmma"] and hw["fma_dot"] < hw["fp32"]
    # an add, multiply, compare or select is one lane-op: half the FMA rate in FLOP/s
    t, bound = cost_model.predict(cost_model.Cost(flops=hw["fp32"]), "fp32", 0.0)
    assert bound == "fp32 units" and t == pytest.approx(2.0, rel=0.01)
    t, bound = cost_model.predict(cost_model.Cost(flops=hw["fp32_ops"], transcendentals=2 * hw["sfu"]), "fp32", 0.0)
    assert (t, bound) == (2.0, "special functions")
    assert cost_model.predict(cost_model.Cost(flops=hw["fp32_ops"]), "fp32", 0.0, latency_s=3.0) == (3.0, "latency")


def test_latency_of_the_recurrences_hand_count():
    """WKV-4 forward, B = 4, T = 2048, C = 768: 96 one-warp programs (one wave: an H100 holds 132 x 32), each
    step a DRAM round trip (0.5 us) and 4 dependent MUFU ops (10 ns each), the loads issued one step ahead so that
    two round trips overlap: 2048 x (0.5 + 0.04) / 2 us = 553 us, latency-bound (the roofline says 22.6 us; without
    the prefetch it was 2048 x 0.54 us). 5000 programs take two waves."""
    fwd = next(m for m in cost_model.wkv4_models(4, 2048, 768) if m.aot_label == "wkv4_fwd C=768 fp32")
    assert (fwd.programs, fwd.serial_steps, fwd.num_warps) == (96, 2048, 1)
    assert cost_model.latency(fwd) == pytest.approx(2048 * 0.27e-6)
    # a step's chain longer than the round trip binds alone; a walk's first load waits in full
    hw = cost_model.H100
    assert cost_model.Step(round_trips=1, sfu=60, prefetch=1).seconds(hw) == pytest.approx(0.6e-6)
    assert cost_model.Step(round_trips=1, reductions=1, prefetch=1, warp_reductions=True, starts=0.5).seconds(hw) \
        == pytest.approx((0.5 + 0.075) / 2 * 1e-6 + 0.25e-6)
    assert cost_model.predict(fwd.cost, "fp32", fwd.dram_bytes, latency_s=cost_model.latency(fwd))[1] == "latency"
    fwd.programs = 5000
    assert cost_model.latency(fwd) == pytest.approx(2 * 2048 * 0.27e-6)


def test_a_small_grid_reaches_its_share_of_the_gpu():
    """Bytes that take 1 s over the whole GPU take 132 / 4 s on 4 programs (4 SMs); 132 programs or more, 1 s.
    ReRoPE decode at B H = 4 over 8192 keys: the unsplit kernel's 4 programs against flash-decoding's 256."""
    hw = cost_model.H100
    assert cost_model.predict(cost_model.Cost(), "fp32", hw["bandwidth"], programs=4)[0] == pytest.approx(33.0)
    assert cost_model.predict(cost_model.Cost(), "fp32", hw["bandwidth"], programs=500)[0] == pytest.approx(1.0)
    decode = next(m for m in cost_model.rerope_models() if m.aot_label == "rerope_decode d=64 bf16")
    assert decode.programs == 256 and decode.notes.startswith("64 splits of 128 keys")


def test_the_one_launch_decode_is_modelled_as_k_and_v_read_once():
    """ReRoPE decode on "triton_merged" (kernels/rerope/decode.py): one launch of B H x splits programs whose DRAM
    traffic is K and V once plus under 0.5 MB (query, output, the fp32 table rows of the near band, the slices'
    partial results: 64 x 65 fp32 per head), priced as bytes / bandwidth; its label is one the AOT build makes, so
    the table shows its registers."""
    from seqmix.kernels.rerope.decode import aot_kernels
    labels = {k.label for k in aot_kernels()}
    for dtype, size in (("fp32", 4), ("bf16", 2)):
        m = next(m for m in cost_model.rerope_models() if m.aot_label == f"rerope_decode_merged d=64 {dtype}")
        kv = 2 * 4 * 8192 * 64 * size
        assert m.aot_label in labels and m.programs == 256 and m.forward and m.serial_steps == 0
        assert kv < m.dram_bytes < kv + 0.5e6
        assert cost_model.predict(m.cost, dtype, m.dram_bytes, mma=m.dot_unit, programs=m.programs) == \
            (pytest.approx(m.dram_bytes / cost_model.H100["bandwidth"]), "memory")


def test_model_benchmarks_quick(tmp_path):
    """benchmarks/models.py at tiny sizes, end to end: the CI variant of the memory goal (a checkpoint loads in a
    fresh process within 1.2x of its size until the model is built; all five layouts, sharded included) and a speed
    table with every runtime, limit and goal row."""
    from seqmix.benchmarks import models as model_bench
    assert model_bench.main(["--quick", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "models.json").read_text())
    assert [r["checkpoint"] for r in results["memory"]] == ["rwkv4", "rwkv4 sharded", "rwkv7", "rwkv7 .pth", "mamba"]
    for row in results["memory"]:
        assert row["ratio"] <= model_bench.MEMORY_GOAL, row
        assert row["dtype"] == "torch.bfloat16"                   # loaded as stored
    report = (tmp_path / "models.md").read_text()
    for model in ("rwkv4", "rwkv7", "mamba"):
        for dtype in ("float32", "bfloat16"):
            runtimes = {r["runtime"] for r in results["speed"] if r["model"] == f"{model} {dtype}"}
            assert {"seqmix", "one streaming pass over the weights", "the matmuls alone"} < runtimes
            assert re.search(rf"\| {model} {dtype} \| [\d.]+x \| [\d.]+x \| (yes|no) \|", report)


def test_training_ratios_quick(tmp_path):
    """benchmarks/training.py at tiny shapes: the three ops ran on the C loops and the torch backend in alternating
    rounds, and training.json / training.md hold their ratios. No ratio is checked against a target: speed is what
    the benchmark reports, not what a test asserts."""
    from seqmix.benchmarks import training
    assert training.main(["--quick", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "training.json").read_text())
    assert [r["op"] for r in result["rows"]] == ["wkv4_train", "wkv7_train", "ssm_train"]
    for row in result["rows"]:
        for clock in ("wall", "cpu"):
            times = row[f"times_{clock}"]
            assert set(times) == {"c", "torch"} and all(len(t) == 2 for t in times.values()), row
            assert all(x > 0 for x in times["c"] + times["torch"]), row
            ratios = [t / c for t, c in zip(times["torch"], times["c"])]
            assert row[f"ratio_{clock}"] == pytest.approx(float(np.median(ratios))), row
        assert row["met"] == (row["ratio_wall"] >= row["target"])
    report = (tmp_path / "training.md").read_text()
    for row in result["rows"]:
        assert re.search(rf"\| {re.escape(row['title'])}, {re.escape(row['shape'])} \| .* \| "
                         rf"{row['ratio_wall']:.2f}x \| {row['ratio_cpu']:.2f}x \| >= ", report), row["op"]
