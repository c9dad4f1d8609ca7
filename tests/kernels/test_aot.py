"""Every Triton kernel compiles ahead of time for sm_80 and sm_90 (no GPU needed), the way the JIT builds it for
aligned tensors: no spills, the recurrences' offsets in 64 bits; and what the interpreter cannot show, read in the
compiled code: no atomics in the backwards, the scan backward's scratch fenced by barriers, WKV-4 built without FP
contraction, the recurrences' steps software-pipelined."""
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

import torch

from seqmix.kernels import attention
from seqmix.kernels.aot import collect, loads_used_in_their_step, mma_kind, narrow_offsets
from seqmix.kernels.testing import HAS_TRITON

needs_build = pytest.mark.skipif(not HAS_TRITON, reason="triton has no wheel for this platform")


def build_groups(labels, workers: int) -> list[list[str]]:
    """The kernels' labels in ``workers`` groups of --filter texts, one text per kernel family ("wkv4_fwd ", with its
    space: "wkv4_fwd_save" is another), balanced by count; each label matches exactly one text."""
    families = {}
    for label in labels:
        families.setdefault(label.split()[0] + " ", []).append(label)
    groups = [[] for _ in range(workers)]
    sizes = [0] * workers
    for text, members in sorted(families.items(), key=lambda item: -len(item[1])):
        i = sizes.index(min(sizes))
        groups[i].append(text)
        sizes[i] += len(members)
    assert all(sum(text in label for text in families) == 1 for label in labels), "a label in two families"
    return [g for g in groups if g]


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """``python -m seqmix.kernels.aot --asm DIR``, each kernel built once, in one process per core (the build is
    serial and CPU-bound: two processes take about half the time on two cores): (the runs' combined output and
    exit status, DIR with every build's TTGIR and PTX)."""
    asm = tmp_path_factory.mktemp("asm")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}   # compile for real, not interpret
    groups = build_groups([k.label for k in collect()], min(os.cpu_count() or 1, 2))

    def one(texts):
        filters = [arg for text in texts for arg in ("--filter", text)]
        return subprocess.run([sys.executable, "-m", "seqmix.kernels.aot", "--asm", str(asm), *filters], env=env,
                              capture_output=True, text=True, timeout=1800)

    with ThreadPoolExecutor(len(groups)) as pool:
        runs = list(pool.map(one, groups))
    run = subprocess.CompletedProcess([r.args for r in runs], max(r.returncode for r in runs),
                                      "".join(r.stdout for r in runs), "".join(r.stderr for r in runs))
    return run, asm


def test_build_groups_cover_every_kernel_once():
    labels = ["wkv4_fwd C=768 fp32", "wkv4_fwd_save C=768 fp32", "wkv4_fwd C=768 bf16", "attention_fwd d=64 fp32"]
    groups = build_groups(labels, 2)
    texts = [t for g in groups for t in g]
    assert sorted(texts) == ["attention_fwd ", "wkv4_fwd ", "wkv4_fwd_save "]
    assert all(sum(t in label for t in texts) == 1 for label in labels)
    assert [sorted(g) for g in build_groups(labels, 1)] == [["attention_fwd ", "wkv4_fwd ", "wkv4_fwd_save "]]
    assert [len(g) for g in groups] == [1, 2]        # wkv4_fwd's two kernels alone, the two others together


def _asm(asm, prefix, ext):
    """{file name: text} of the builds whose label starts with ``prefix``."""
    files = {p.name: p.read_text() for p in sorted(asm.glob(f"{prefix}*.{ext}"))}
    assert files, f"no {ext} of {prefix} kernels in {asm}"
    return files


@needs_build
@pytest.mark.timeout(1900)   # a cold build of every kernel takes about 5 minutes here; the subprocess has 1800 s
def test_every_kernel_builds_for_sm80_and_sm90_without_spills(build):
    run, _ = build
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "not written yet" not in run.stdout, run.stdout
    rows = [line for line in run.stdout.splitlines() if re.search(r"\bsm_\d\d\b", line)]
    for kernel in collect():
        for arch in kernel.targets:
            assert any(r.startswith(kernel.label + " ") and f"sm_{arch}" in r.split() for r in rows), \
                f"{kernel.label} was not built for sm_{arch}"
    assert all(r.split()[-2] in ("wgmma", "mma.sync", "none") for r in rows), "a row names no MMA kind"
    bf16_attention = [r for r in rows if r.startswith("attention_fwd") and " bf16 " in r]
    assert bf16_attention and all(r.split()[-2] != "none" for r in bf16_attention), bf16_attention


@needs_build
@pytest.mark.timeout(1900)
@pytest.mark.parametrize("prefix", ["wkv4_", "wkv7_", "selective_scan_"])
def test_recurrences_form_every_offset_in_64_bits(build, prefix):
    """T C (wkv4), D T (the scan) and B T H N (wkv7) pass 2^31 at long T: no offset may be formed in 32 bits."""
    for name, ptx in _asm(build[1], prefix, "ptx").items():
        assert narrow_offsets(ptx) == [], f"{name}: 32-bit offsets {narrow_offsets(ptx)[:5]}"


@needs_build
@pytest.mark.timeout(1900)
@pytest.mark.parametrize("prefix", ["wkv7_bwd", "wkv7_chunked", "selective_scan_bwd"])
def test_backwards_use_no_atomics(build, prefix):
    """An atomic add with the default acq_rel order is a fence and an L1 flush per call, and its order changes the
    gradients' last bits: the backwards store per-program partial sums instead."""
    for name, ptx in _asm(build[1], prefix, "ptx").items():
        atomics = [line.strip() for line in ptx.splitlines() if re.match(r"\s*(?:@%p\d+\s+)?(?:atom|red)\.", line)]
        assert atomics == [], f"{name}: {atomics[:3]}"


@needs_build
@pytest.mark.timeout(1900)
def test_scan_backward_fences_its_scratch(build):
    """The scratch is stored by every thread and read back in another layout's threads: a barrier after the stores
    and one before the next run overwrites it (TTGIR: ttg.barrier, gpu.barrier before Triton 3.9, which
    tl.debug_barrier becomes; the reductions' own synchronisation appears only later, in the LLVM IR)."""
    for name, ttgir in _asm(build[1], "selective_scan_bwd", "ttgir").items():
        assert len(re.findall(r"\b(?:ttg|gpu)\.barrier\b", ttgir)) >= 2, name


@needs_build
@pytest.mark.timeout(1900)
def test_wkv4_is_built_without_fp_contraction(build):
    """_rounded_max's two-sum takes each product and sum rounded on its own: no fma in the WKV-4 kernels."""
    for name, ptx in _asm(build[1], "wkv4_", "ptx").items():
        assert "fma.rn" not in ptx, name


@needs_build
@pytest.mark.timeout(1900)
@pytest.mark.parametrize("prefix", ["wkv4_", "wkv7_fwd", "wkv7_bwd", "selective_scan_"])
def test_recurrent_steps_do_not_wait_for_their_loads(build, prefix):
    """Every load of a recurrence's step is issued one step ahead (a loop variable, yielded to the next iteration),
    so that no step waits a memory round trip; main before the prefetch had every load used in its own step."""
    for name, ttgir in _asm(build[1], prefix, "ttgir").items():
        assert loads_used_in_their_step(ttgir) == [], f"{name}: {loads_used_in_their_step(ttgir)}"


# A row of the build's table: label, arch, regs, spill B, stack B, shared B, mma, i32 offs
BUILD_ROW = re.compile(r"^(?P<label>.+?)\s+sm_(?P<arch>\d+)\s+(?P<regs>\d+)\s+(?P<spill>\d+)\s+(?P<stack>\d+)\s+"
                       r"(?P<shared>\d+)\s+(?P<mma>\S+)\s+\d+")


def build_rows(stdout: str) -> dict:
    """{(label, arch): the row's fields} of the build's table."""
    return {(m["label"], int(m["arch"])): m.groupdict() for line in stdout.splitlines() if (m := BUILD_ROW.match(line))}


def test_build_rows_reads_a_label_with_spaces():
    line = "attention_fwd d=64 fp32 tf32x3 ieee-tiles    sm_80   128        0        8     24576 mma.sync        0"
    row = build_rows(line)[("attention_fwd d=64 fp32 tf32x3 ieee-tiles", 80)]
    assert (row["regs"], row["spill"], row["stack"], row["mma"]) == ("128", "0", "8", "mma.sync")


@pytest.mark.parametrize("d, tiles", [(64, {"BLOCK_M": 64, "BLOCK_N": 32}), (128, {"BLOCK_M": 64, "BLOCK_N": 16})])
def test_the_fp32_forward_on_sm90_is_the_tf32x3_build(d, tiles):
    """What the dispatcher launches for fp32 on an H100 by default (tf32x3 on sm_90's tiles) is the build
    "attention_fwd d=<d> fp32 tf32x3", made for sm_90 alone (sm_80 builds these tiles with a stack)."""
    cfg = attention.launch_config("fwd", d, torch.float32, arch=90)
    assert cfg.blocks == tiles
    built = next(k for k in collect() if k.label == f"attention_fwd d={d} fp32 tf32x3")
    assert built.constexprs == dict(HEAD_DIM=d, BLOCK_D=d, **tiles, CAUSAL=True, DOT="tf32x3")
    assert (built.num_warps, built.num_stages, built.targets) == (cfg.num_warps, cfg.num_stages, (90,))


@needs_build
@pytest.mark.timeout(1900)
@pytest.mark.parametrize("d", [64, 128])
def test_fp32_forward_builds_on_wgmma_without_stack_on_sm90(build, d):
    """The review (gpu-round-2 3b) found tf32x3 tiles that Hopper's tensor cores take without a stack: 64 x 32 at 4
    warps for d = 64, 64 x 16 for d = 128 (64 x 64 and 64 x 32 there need 24-48 B of stack). The sm_90 build of each
    has no spill, no stack, and its dots are wgmma."""
    row = build_rows(build[0].stdout)[(f"attention_fwd d={d} fp32 tf32x3", 90)]
    assert (row["spill"], row["stack"], row["mma"]) == ("0", "0", "wgmma"), row
    assert int(row["regs"]) <= 255


# wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 (sm_90), mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32
MMA = re.compile(r"\b(?:wgmma\.mma_async\.sync|mma\.sync)\.aligned\.\S+")


@needs_build
@pytest.mark.timeout(1900)
def test_tf32x3_dots_are_three_tf32_mma_per_product(build):
    """The fp32 forwards built with tf32x3 multiply on tensor cores (wgmma on sm_90's tiles, mma.sync on the IEEE
    tiles and in ReRoPE), every MMA on tf32 operands, three per product: three times the MMAs of the same kernel built
    with one tf32 product (compiled here, in a process without the interpreter). The interpreter computes such dots
    as plain fp32 and cannot show it."""
    ptx = _asm(build[1], "attention_fwd_d_64_fp32_tf32x3", "ptx")
    ptx.update(_asm(build[1], "rerope_", "ptx"))
    tf32x3 = {name: MMA.findall(text) for name, text in ptx.items() if "tf32x3" in name}
    assert tf32x3 and all(mmas and all(".tf32.tf32" in m for m in mmas) for mmas in tf32x3.values()), tf32x3
    assert all(m.startswith("wgmma") for m in tf32x3["attention_fwd_d_64_fp32_tf32x3_sm90.ptx"])
    script = ("import dataclasses, re\n"
              "from seqmix.kernels.aot import collect, compile_one\n"
              "k = next(k for k in collect() if k.label == 'attention_fwd d=64 fp32 tf32x3')\n"
              "one = dataclasses.replace(k, constexprs={**k.constexprs, 'DOT': 'tf32'})\n"
              f"print(len(re.findall({MMA.pattern!r}, compile_one(one, 90)['ptx'])))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert len(tf32x3["attention_fwd_d_64_fp32_tf32x3_sm90.ptx"]) == 3 * int(run.stdout.split()[-1])


STEP_LOOP = """
    %x0 = tt.load %p0 : tensor<32x!tt.ptr<f32>>
    %r:2 = scf.for %t = %c0 to %T step %c1 iter_args(%acc = %z, %nx = %x0) -> (tensor<32xf32>, tensor<32xf32>) {
      %now = tt.load %p1 : tensor<32x!tt.ptr<f32>>
      %next = tt.load %p2 : tensor<32x!tt.ptr<f32>>
      %s = arith.addf %acc, %nx : tensor<32xf32>
      %s2 = arith.addf %s, %now : tensor<32xf32>
      scf.yield %s2, %next : tensor<32xf32>, tensor<32xf32>
    } loc(#loc1)
"""


def test_loads_used_in_their_step_finds_a_load_used_at_once():
    """%now is used in the step that loads it (a round trip per step); %next is carried to the next step; %x0,
    outside the loop, starts the pipeline. An outer loop's loads (they start an inner loop's) are not steps."""
    assert loads_used_in_their_step(STEP_LOOP) == ["%now"]
    outer = "  %o = scf.for %c = %a to %b step %d {\n" + STEP_LOOP.replace("\n    ", "\n      ") + "  }\n"
    assert loads_used_in_their_step(outer) == ["%now"]


WIDENED_LOOP_OFFSET = """
    .param .u32 k_param_1
    ld.param.b32 %r2, [k_param_1];
    mov.b32 %r51, 0;
$L__BB0_2:
    cvt.s64.s32 %rd32, %r51;
    add.s32 %r51, %r51, %r2;
"""


def test_narrow_offsets_finds_a_32_bit_offset_carried_round_a_loop():
    """t * C strength-reduced to off += C in 32 bits, then widened: what wkv4's PTX did before its offsets went to
    64 bits. The same in 64 bits, a widened size itself, and a remainder i % H are fine."""
    assert narrow_offsets(WIDENED_LOOP_OFFSET) == ["cvt.s64.s32 %rd32, %r51;"]
    wide = WIDENED_LOOP_OFFSET.replace("cvt.s64.s32 %rd32, %r51;\n    add.s32 %r51, %r51, %r2;",
                                       "cvt.s64.s32 %rd2, %r2;\n    add.s64 %rd51, %rd51, %rd2;")
    assert narrow_offsets(wide) == []
    remainder = WIDENED_LOOP_OFFSET.replace("cvt.s64.s32 %rd32, %r51;\n    add.s32 %r51, %r51, %r2;",
                                            "div.s32 %r8, %r7, %r2;\n    mul.lo.s32 %r9, %r8, %r2;\n"
                                            "    sub.s32 %r10, %r7, %r9;\n    cvt.u64.u32 %rd3, %r10;")
    assert narrow_offsets(remainder) == []


def test_mma_kind_names_the_matrix_instruction():
    assert mma_kind("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {...}") == "wgmma"
    assert mma_kind("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {...}") == "mma.sync"
    assert mma_kind("fma.rn.f32 %r1, %r2, %r3, %r4;") == "none"


@needs_build
def test_every_triton_kernel_of_the_registry_is_built():
    """Each module the registry names for the AOT build (OpSpec.aot_modules) builds every @triton.jit ``*_kernel``
    it defines or imports: a kernel added to an op (rerope_operands_kernel, say) cannot be left out of the build."""
    import importlib

    import triton

    from seqmix.kernels.aot import MODULES

    built = {kernel.fn for kernel in collect()}
    missing = [f"{module}.{name}" for module in MODULES
               for name, fn in vars(importlib.import_module(module)).items()
               if isinstance(fn, triton.runtime.JITFunction) and name.endswith("_kernel") and fn not in built]
    assert not missing, f"not in any aot_kernels(): {missing}"
