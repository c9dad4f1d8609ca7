"""ReRoPE decode's one-launch kernel (kernels/rerope/decode.py) built ahead of time for sm_80 and sm_90 without a
GPU, as tests/kernels/test_aot.py builds every kernel, but on its own (its 12 builds, not the whole set): no spills,
no stack frame, the registers it takes; and what the interpreter, which runs the programs one after another, cannot
show: the order that lets the last program of a head read the other programs' slices on a GPU (every thread's
stores, a barrier, the arrival as an atomic add with acquire-release semantics at GPU scope, and the merge's loads
from L2)."""
import os
import re
import subprocess
import sys

import pytest

from seqmix.kernels.aot import TARGETS, collect
from test_aot import _asm, needs_build

LABEL = "rerope_decode_merged"


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """``python -m seqmix.kernels.aot --asm DIR --filter rerope_decode_merged``: (the run, DIR)."""
    asm = tmp_path_factory.mktemp("asm")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}   # compile for real, not interpret
    run = subprocess.run([sys.executable, "-m", "seqmix.kernels.aot", "--asm", str(asm), "--filter", LABEL], env=env,
                         capture_output=True, text=True, timeout=1200)
    return run, asm


def _rows(stdout):
    """{(label, arch): (regs, spill bytes, stack bytes)} of the build's table."""
    rows = {}
    for line in stdout.splitlines():
        m = re.match(r"(.+?)\s+sm_(\d\d)\s+(\d+)\s+(\d+)\s+(\d+)\s", line)
        if m:
            rows[(m.group(1).strip(), int(m.group(2)))] = tuple(int(m.group(i)) for i in (3, 4, 5))
    return rows


@needs_build
@pytest.mark.timeout(1300)
def test_the_decode_kernel_builds_without_spills_or_stack(build):
    run, _ = build
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    rows = _rows(run.stdout)
    labels = [k.label for k in collect() if k.label.startswith(LABEL)]
    assert len(labels) == 12                     # d = 64, 128; fp32, fp16, bf16; ReRoPE and Leaky
    for label in labels:
        for arch in TARGETS:
            regs, spill, stack = rows[(label, arch)]
            assert spill == 0 and stack == 0 and 0 < regs <= 255, (label, arch, rows[(label, arch)])
    print("\n".join(f"{label} sm_{arch}: {rows[(label, arch)][0]} registers" for label in labels for arch in TARGETS))


def _instructions(ptx):
    """The PTX's instructions without their predicates, in order."""
    return [re.sub(r"^@!?%p\d+\s+", "", line.strip()) for line in ptx.splitlines()
            if line.strip() and not line.strip().startswith(("//", ".", "$"))]


@needs_build
@pytest.mark.timeout(1300)
def test_the_last_program_reads_the_slices_after_they_are_visible(build):
    """Per build: the slice's stores, then bar.sync, then one atom.global.gpu.acq_rel.add (the arrival), then the
    merge's loads, every one ld.global.cg; no other atomic."""
    for name, ptx in _asm(build[1], LABEL, "ptx").items():
        code = _instructions(ptx)
        atomics = [i for i, line in enumerate(code) if line.startswith(("atom.", "red."))]
        assert len(atomics) == 1 and re.match(r"atom\.global\.gpu\.acq_rel\.add\.u32\b", code[atomics[0]]), name
        arrival = atomics[0]
        stores = [i for i, line in enumerate(code[:arrival]) if line.startswith("st.global")]
        assert stores and "bar.sync" in " ".join(code[stores[-1]:arrival]), f"{name}: no barrier before the arrival"
        after = [line for line in code[arrival:] if line.startswith("ld.global")]
        assert after and all(line.startswith("ld.global.cg") for line in after), f"{name}: {after[:3]}"
