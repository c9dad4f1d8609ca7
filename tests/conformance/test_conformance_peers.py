"""The battery on real code nobody here wrote, through the adapters: transformers' RWKV-4 and Mamba loops, fla's naive
generalized-delta-rule forms and attention, rwkv7-hf's recurrence (all test dependencies), fla's Triton RWKV-7 ops
where they run, and a loop in BlinkDL's convention.

Each peer's verdict is pinned, in the default grade and, where it differs, in the strict one: one that passes must
keep passing, and one that fails fails exactly the checks that README's "Peers checked" table lists with the command
that reproduces them, so that the table stays true when a peer's new release changes its behaviour.
"""
import importlib
from functools import partial

import pytest
import torch

from seqmix.conformance import Options, run
from seqmix.conformance.adapters import ADAPTERS, blinkdl, fla, fla_attention, rwkv7_hf, transformers_mamba, \
    transformers_rwkv4


def failed_checks(report) -> set:
    return {row.check for row in report.rows if not row.passed}


def peer(module, name):
    """module.name, or a skip that says why it cannot be had here."""
    try:
        return getattr(importlib.import_module(module), name)
    except Exception as e:                                               # ImportError, or a GPU-only import
        pytest.skip(f"{module} does not import here ({type(e).__name__}: {e}); install the test extra")


def test_transformers_rwkv4_passes_and_fails_strict_at_keys_of_several_hundred():
    """rwkv_linear_attention_cpu passes the default grade; --strict fails it on the checks with keys of several
    hundred: it forms exponents as differences of fp32 numbers near 300 (k + u - max), whose rounding (2e-5
    absolute) becomes 1e-5 to 1e-4 relative error in y, the state and the gradients, what fp32 arithmetic of the
    formula must be allowed there (ops.py's WKV-4 rule: 40 * 300 * 2^-24 = 7.2e-4); seqmix's kernels keep 1e-7
    there (tests/conformance/test_conformance.py holds them to --strict)."""
    fn = peer("transformers.models.rwkv.modeling_rwkv", "rwkv_linear_attention_cpu")
    report = run("wkv4", transformers_rwkv4(fn))
    assert report.ok, failed_checks(report)
    large_keys = {f"wkv4/extreme/T=40,B=2,C=6,state,{label}/fp32"
                  for label in ("keys+-300", "keys=250+-1", "key spikes+-300")}
    strict = run("wkv4", transformers_rwkv4(fn), Options(strict=True))
    assert {"wkv4/extreme/T=40,B=2,C=6,state,keys+-300/fp32"} <= failed_checks(strict) <= large_keys
    assert failed_checks(strict) == {r.check for r in report.conditioned_rows}
    worst = {r.what: r.error for r in strict.rows if r.check.endswith("keys+-300/fp32")}
    assert worst["y"] > 1e-5 and worst["state num"] > 5e-5


def test_transformers_mamba_scan_computes_the_scan_but_promotes_y_to_fp32():
    """mamba_selective_scan's values pass every check; its y comes back fp32 for fp16/bf16 inputs where D and
    delta_bias are fp32 (as Mamba keeps them): scan_output + hidden_states * D promotes, where the design gives
    y the values' dtype."""
    fn = peer("transformers.models.mamba.modeling_mamba", "mamba_selective_scan")
    report = run("selective_scan", transformers_mamba(fn))
    assert not report.options.state
    assert failed_checks(report) == {f"selective_scan/shapes/T=21,B=2,D=18,N=5,+D,+z,+delta_bias,softplus/{dtype}"
                                     for dtype in ("fp16", "bf16")}
    assert {(r.what, r.message) for r in report.rows if not r.passed} == {
        ("y", f"dtype torch.float32, expected torch.{name} (outputs take the values' dtype)")
        for name in ("float16", "bfloat16")}


def test_fla_naive_dplr_recurrence_passes():
    fn = peer("fla.ops.generalized_delta_rule.dplr.naive", "dplr_recurrence")
    report = run("wkv7", ADAPTERS["fla-dplr"].wrap(fn))
    assert report.ok, failed_checks(report)


def test_fla_naive_dplr_chunkwise_takes_whole_chunks_only():
    """dplr_chunkwise asserts T % chunk_size == 0 (32 by default): every case of the battery has another T, so each
    check fails at the call; with chunk_size=16 the one case of T = 16 passes."""
    fn = peer("fla.ops.generalized_delta_rule.dplr.naive", "dplr_chunkwise")
    report = run("wkv7", ADAPTERS["fla-dplr"].wrap(fn), Options(dtypes=("fp32",)))
    assert all(r.what == "call" and "assert l % chunk_size == 0" in r.message for r in report.rows)
    assert failed_checks(report) == set(report.checks)
    report = run("wkv7", ADAPTERS["fla-dplr"].wrap(partial(fn, chunk_size=16)), Options(only=("T=16,",)))
    assert report.ok, failed_checks(report)


def test_fla_naive_attention_passes():
    fn = peer("fla.ops.attn.naive", "naive_parallel_attn")
    report = run("attention", fla_attention(fn))
    assert report.ok, failed_checks(report)


@pytest.mark.parametrize("name", ["chunk_rwkv7", "fused_recurrent_rwkv7"])
def test_fla_triton_rwkv7(name):
    """fla's RWKV-7 ops are Triton kernels that ask Triton for a GPU driver, even under TRITON_INTERPRET=1: skipped
    without one, run in full with one."""
    fn = fla(peer("fla.ops.rwkv7", name))
    x = [torch.zeros(1, 2, 1, 16) for _ in range(6)]
    try:
        fn(*x)
    except RuntimeError as e:
        pytest.skip(f"fla.ops.rwkv7.{name} needs a GPU here: {e}")
    report = run("wkv7", fn, Options(head_sizes=(16, 64)))
    assert report.ok, failed_checks(report)


def test_rwkv7_hf_recurrence_passes():
    fn = peer("rwkv7_hf.ops_rwkv7", "rwkv7_recurrent")
    report = run("wkv7", rwkv7_hf(fn), Options(dtypes=("fp32",)))   # a Python loop per sample and token
    assert report.ok, failed_checks(report)


HEAD_SIZE = 16


def blinkdl_style_op(r, w, k, v, a, b, state=None):
    """RWKV-7 as BlinkDL's CPU reference writes it (written here, after RWKV-LM's RWKV7_OP): (B, T, C) inputs, a
    global head size, w raw (decay exp(-exp(w))), the state [value, key] updated as S w + S a b^T + v k^T."""
    B, T, C = r.shape
    H, N, dtype = C // HEAD_SIZE, HEAD_SIZE, r.dtype
    r, w, k, v, a, b = (x.view(B, T, H, N).float() for x in (r, w, k, v, a, b))
    w = torch.exp(-torch.exp(w))
    S = torch.zeros(B, H, N, N) if state is None else state
    out = []
    for t in range(T):
        S = (S * w[:, t, :, None, :] + S @ a[:, t, :, :, None] @ b[:, t, :, None, :]
             + v[:, t, :, :, None] @ k[:, t, :, None, :])
        out.append((S @ r[:, t, :, :, None]).view(B, H * N))
    return torch.stack(out, 1).to(dtype), S


def test_blinkdl_convention_through_its_adapter():
    report = run("wkv7", blinkdl(blinkdl_style_op), Options(head_sizes=(HEAD_SIZE,)))
    assert report.ok, failed_checks(report)
