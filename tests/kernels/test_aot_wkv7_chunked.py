"""The chunked WKV-7 kernels (kernels/wkv7/triton_chunked*.py) compiled ahead of time for sm_80 and sm_90 (no GPU
needed), read where the interpreter cannot see: no spills and no stack; two programs per SM for the parallel kernels;
each product's matrix instruction; the serial pass's loads pipelined. Slow tier (it runs the AOT build); the build
of every kernel, with the other checks of all kernels, is tests/kernels/test_aot.py's."""
import os
import re
import subprocess
import sys

import pytest

from seqmix.kernels.aot import TARGETS, collect, loads_used_in_their_step
from seqmix.kernels.testing import HAS_TRITON

pytestmark = [pytest.mark.skipif(not HAS_TRITON, reason="triton has no wheel for this platform"),
              pytest.mark.timeout(1200)]

REGISTERS_PER_SM = 65536   # sm_80 and sm_90
# one program per group (and block of columns), or per sub-chunk (the gradients): no chain between them
PARALLEL = ("wkv7_chunked_fwd_prep", "wkv7_chunked_fwd_output", "wkv7_chunked_bwd_prep", "wkv7_chunked_bwd_states",
            "wkv7_chunked_bwd_dstates", "wkv7_chunked_bwd_grads")
SCANS = ("wkv7_chunked_fwd_scan", "wkv7_chunked_bwd_scan")   # the only serial passes: the forward's, the backward's
DTYPES = ("fp32", "bf16", "fp16")
ROW = re.compile(r"^(?P<label>\S.*?)\s+sm_(?P<arch>\d\d)\s+(?P<regs>\d+)\s+(?P<spill>\d+)\s+(?P<stack>\d+)\s+"
                 r"(?P<shared>\d+)\s+(?P<mma>\S+)\s+(?P<narrow>\d+)")


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """``python -m seqmix.kernels.aot --filter wkv7_chunked --asm DIR`` in a process without the interpreter:
    ({(label, arch): the row's fields}, the kernels' AotKernel by label, DIR with each build's TTGIR and PTX)."""
    asm = tmp_path_factory.mktemp("asm")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "seqmix.kernels.aot", "--asm", str(asm), "--filter", "wkv7_chunked"],
                         env=env, capture_output=True, text=True, timeout=1100)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    rows = {(m["label"], int(m["arch"])): m.groupdict() for line in run.stdout.splitlines() if (m := ROW.match(line))}
    kernels = {k.label: k for k in collect() if k.label.startswith("wkv7_chunked")}
    return rows, kernels, asm


def _text(asm, label, arch, ext):
    return (asm / f"{re.sub(r'[ =]', '_', label)}_sm{arch}.{ext}").read_text()


def test_every_chunked_kernel_builds_without_spills_or_stack(build):
    """Every chunked kernel, forward and backward, at every input dtype: fp32 takes groups of one sub-chunk (its
    backward then has no states or dL/dS walks: the forward's group states are its sub-chunk states), fp16 and bf16
    groups of GROUP, fp16 with its own MAX_SPREAD."""
    rows, kernels, _ = build
    names = {label.split(" N=")[0] for label in kernels}
    assert names == {*PARALLEL, *SCANS}, names
    for dtype in DTYPES:
        walks = {label.split(" N=")[0] for label in kernels if label.endswith(dtype)} & {"wkv7_chunked_bwd_states",
                                                                                           "wkv7_chunked_bwd_dstates"}
        assert len(walks) == (0 if dtype == "fp32" else 2), (dtype, walks)
    for label in kernels:
        for arch in TARGETS:
            row = rows[(label, arch)]
            assert (row["spill"], row["stack"]) == ("0", "0"), (label, arch, row)


def test_the_parallel_kernels_fit_two_programs_per_sm(build):
    """Registers x threads of a program at most half an SM's 65,536 registers: two programs resident per SM, so that
    one's loads overlap the other's products (the old chunked kernels took 199-234 registers at 8 warps: one)."""
    rows, kernels, _ = build
    parallel = [label for label in kernels if label.startswith(PARALLEL)]
    assert parallel
    for label in parallel:
        for arch in TARGETS:
            threads = 32 * kernels[label].num_warps
            row = rows[(label, arch)]
            assert 2 * int(row["regs"]) * threads <= REGISTERS_PER_SM, (label, arch, row)


def test_every_product_runs_on_the_tensor_cores(build):
    """Each kernel's tl.dot instruction kind, read in the PTX: the products are tf32x3 (fp32 inputs), tf32, bf16 or
    fp16 (fp16/bf16 inputs) on the tensor cores, mma.sync, or wgmma where a tile is 64 rows (the output kernel at
    sm_90 with four sub-chunks a program); never the FMA units, the backward's included."""
    rows, kernels, asm = build
    for label in kernels:
        for arch in TARGETS:
            mma = rows[(label, arch)]["mma"]
            ptx = _text(asm, label, arch, "ptx")
            if arch == 90 and label.startswith("wkv7_chunked_fwd_output N=") and label.endswith(("bf16", "fp16")):
                expected = {"wgmma"}
            else:
                expected = {"mma.sync", "wgmma"}
            assert mma in expected, (label, arch, mma)
            if label.endswith("fp32"):                        # tf32x3: every MMA on tf32 operands
                mmas = re.findall(r"\b(?:mma\.sync|wgmma\.mma_async)\.\S+", ptx)
                assert mmas and all("tf32" in m for m in mmas), (label, arch, mmas[:3])
            print(f"{label} sm_{arch}: {mma}")


def test_the_serial_pass_pipelines_its_loads(build):
    """The scan's step is one product: its map M_G must not wait a memory round trip. M_G is loaded in its own step
    and pipelined by the compiler (num_stages = 2: asynchronous copies into shared memory, cp.async in the PTX), the
    accumulator A_G loaded a step ahead by hand; no load of the loop is used in the step that issues it. The same
    kernel walks the forward's groups and, reversed, the backward's."""
    rows, kernels, asm = build
    scans = [label for label in kernels if label.startswith(SCANS)]
    assert scans and all(kernels[label].num_stages >= 2 for label in scans)
    for label in scans:
        for arch in TARGETS:
            ttgir = _text(asm, label, arch, "ttgir")
            assert loads_used_in_their_step(ttgir) == [], (label, arch, loads_used_in_their_step(ttgir))
            assert "async_copy_global_to_local" in ttgir, (label, arch)
            assert re.search(r"\bcp\.async\b", _text(asm, label, arch, "ptx")), (label, arch)
