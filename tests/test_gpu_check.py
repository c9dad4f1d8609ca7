"""python -m seqmix.benchmarks.gpu_check: on a CPU it says what it would do and exits 0; its correctness step runs
here too, on CPU tensors under the interpreter."""
import subprocess
import sys

import pytest
import torch

from kernel_cases import needs_triton
from seqmix.benchmarks import gpu_check


def test_without_cuda_it_prints_the_plan_and_exits_0():
    run = subprocess.run([sys.executable, "-m", "seqmix.benchmarks.gpu_check"], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "No CUDA device here" in run.stdout
    for criterion in gpu_check.CRITERIA:
        assert criterion in run.stdout
    for step in ("1. correct", "2. no crash at the documented limits", "3. fast as predicted"):
        assert step in run.stdout


@needs_triton
@pytest.mark.parametrize("op", gpu_check.OPS)
def test_correctness_step_passes_on_the_interpreter(op):
    row = gpu_check.check_op(op, torch.float32, device="cpu", T=5, width=16)
    assert row["ok"], row
