"""The registry and the dispatcher at their edges (reliability round 4's surviving mutants R2, R4, R5, B3, B4, B6
and its two unclear dispatcher errors): each test fails under its mutant."""
from pathlib import Path

import pytest
import torch

from seqmix.kernels import backends, c_abi, registry
from seqmix.kernels.backends import Call, default_backend, deprecated_chunked
from seqmix.kernels.wkv7 import wkv7
from seqmix.kernels.wkv7.c import MAX_HEAD

KERNELS = Path(registry.__file__).parent


def test_the_benchmarks_run_the_recurrences_first():
    """R2: gpu_check's parts run their most important rows first, so that a run cut short keeps them."""
    families = [op.family for op in registry.benchmarked()]
    assert "recurrence" in families and families != sorted(families, key=lambda f: f == "recurrence")
    first_other = next(i for i, f in enumerate(families) if f != "recurrence")
    assert all(f == "recurrence" for f in families[:first_other]) and "recurrence" not in families[first_other:]


def test_a_view_has_one_entry_per_op():
    """R4: len() of a view."""
    assert len(registry.view("battery")) == len(registry.names()) == len(list(registry.view("battery")))


def test_c_entries_are_what_each_ops_header_declares():
    """R5: a C entry point left out of an op's c_entries."""
    for op in registry.REGISTRY:
        if op.c_entries:
            declared = c_abi.table((KERNELS / op.stem / f"{op.stem}.h").read_text())
            assert set(op.c_entries) == {n for n in declared if n.endswith(("_forward", "_backward"))}, op.name


def test_the_c_loop_takes_its_documented_largest_head():
    """B3: N > MAX_HEAD made N >= MAX_HEAD (256, the loop's documented maximum, refused)."""
    torch.manual_seed(0)
    r, k, v = (torch.randn(1, 2, 1, MAX_HEAD) for _ in range(3))
    k = k / k.norm(dim=-1, keepdim=True)
    log_w = -torch.rand(1, 2, 1, MAX_HEAD)
    y, _ = wkv7(r, log_w, k, v, -0.5 * k, 0.5 * k, backend="c")
    expected, _ = wkv7(r, log_w, k, v, -0.5 * k, 0.5 * k, backend="torch")
    torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-5)


def test_no_backend_for_a_dtype_is_a_type_error_that_leads_with_the_dtype():
    """B4 (the last backend's refusal gives the error's class) and round 4's unclear error: the refusals of the
    four backends, CUDA-only and head sizes included, came before the dtype."""
    with pytest.raises(TypeError, match=r"^no backend of wkv7 takes this call: 'torch' takes dtypes .*got torch.int32"):
        default_backend("wkv7", "cpu", torch.int32)


def test_an_unknown_op_lists_the_ops():
    """Round 4's unclear error: a bare KeyError: 'nonexistent'."""
    with pytest.raises(KeyError, match=r"no op 'nonexistent' in the registry: \[.*'wkv7'"):
        default_backend("nonexistent", "cpu")
    assert "nonexistent" not in registry.view("backends")


def test_chunked_true_keeps_the_c_loop_on_a_cpu():
    """B6: chunked=True on CPU tensors ran the interpreted Triton kernel instead of C."""
    assert deprecated_chunked(Call("wkv7", torch.device("cpu"), torch.float32, {"N": 16}), "c") == "c"
    assert deprecated_chunked(Call("wkv7", torch.device("cpu"), torch.float32, {"N": 16}), "torch") == "torch"
    assert backends.NAMES[-1] == "c"
