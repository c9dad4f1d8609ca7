"""set_fp32_dot_precision("tf32x3"): fp32 dots of the attention and ReRoPE kernels on tensor cores, three tf32
products each (attention's forward takes it by default on sm_90). The interpreter computes every tl.dot as a plain
fp32 matmul whatever input_precision says, so the rounding is checked here by emulation: the float64 definitions with
every matrix product replaced by what the tensor cores compute (operands rounded to fp32, each split into tf32 parts,
tf32 products, fp32 sums); and the Triton forward itself, on the tiles sm_90 launches, with the interpreter's tf32x3
dots replaced by Triton's three-product decomposition (tf32x3_interpreter_dots). The AOT build
(tests/kernels/test_aot.py) shows the fp32 forwards built with it on tensor cores (wgmma on sm_90's tiles, mma.sync
on sm_80's), with tf32 operands, three per product."""
import contextlib

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.kernel_cases import needs_triton, spy
from helpers.qkv_check import qkv_inputs
from seqmix.kernels.attention.naive import explicit_attention
from seqmix.kernels.rerope import naive as rerope_naive
from seqmix.kernels import attention, rerope
from seqmix.kernels.rerope import fused
from seqmix.kernels.testing import FP32_BUDGET, assert_close, max_abs, rel_rms
from seqmix.reference.attention import softmax_attention


def _tf32(x):
    """x (fp32) rounded to tf32's 10-bit mantissa, to nearest with ties away from zero (PTX cvt.rna.tf32.f32)."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


class TensorCoreProducts(TorchDispatchMode):
    """Every float64 mm / bmm computed as the GPU would at ``precision``: "ieee" (fp32 products and sums), "tf32"
    (one product of tf32-rounded operands) or "tf32x3" (a_h b_l + a_l b_h + a_h b_h, x_h = tf32(x),
    x_l = tf32(x - x_h)); tf32 products are exact in fp32, the sums are fp32."""

    def __init__(self, precision):
        super().__init__()
        self.precision, self.products = precision, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.bmm.default) and args[0].dtype == torch.float64:
            self.products += 1
            a, b = (x.float() for x in args)
            if self.precision == "ieee":
                return func(a, b).double()
            a_h, b_h = _tf32(a), _tf32(b)
            if self.precision == "tf32":
                return func(a_h, b_h).double()
            return (func(a_h, _tf32(b - b_h)) + func(_tf32(a - a_h), b_h) + func(a_h, b_h)).double()
        return func(*args, **(kwargs or {}))


def _emulated_error(op, inputs, precision):
    """Relative RMS error of ``op`` with its products emulated at ``precision``, against float64."""
    truth = op(*inputs)
    with TensorCoreProducts(precision) as mode:
        out = op(*inputs)
    assert mode.products >= 2                      # the score and the value products were emulated
    return rel_rms(out, truth)


# The shapes of the kernel tests (tests/kernels/test_kernels_attention.py, tests/kernels/test_kernels_rerope.py), head
# sizes 16 to 128, and one with scores three times larger.
OPS = {
    "attention T=37 d=16": (lambda q, k, v: explicit_attention(q, k, v, causal=True), (2, 2, 37, 16), 1.0),
    "attention T=130 d=128": (lambda q, k, v: explicit_attention(q, k, v, causal=True), (1, 2, 130, 128), 1.0),
    "rerope T=37 d=32 leaky logn": (lambda q, k, v: rerope_naive.rerope_attention(q, k, v, 20, leaky_k=4.0,
                                                                                   train_length=16),
                                    (1, 2, 37, 32), 1.0),
    "rerope T=45 d=64 spread 3": (lambda q, k, v: rerope_naive.rerope_attention(q, k, v, 7), (1, 2, 45, 64), 3.0),
    "rerope decode T=300 d=64": (lambda q, k, v: rerope_naive.rerope_decode(q[:, :, -1:], k, v, 40, leaky_k=1.5),
                                 (1, 2, 300, 64), 1.0),
}


@pytest.mark.parametrize("name", list(OPS))
def test_tf32x3_products_keep_the_fp32_budget(rng, name):
    """tf32x3 lands within the fp32 budget, beside fp32 products; one tf32 product alone does not (the emulation
    can tell them apart)."""
    op, shape, spread = OPS[name]
    inputs = qkv_inputs(rng, shape, spread)
    ieee, tf32x3, tf32 = (_emulated_error(op, inputs, p) for p in ("ieee", "tf32x3", "tf32"))
    assert tf32x3 < FP32_BUDGET / 10, (ieee, tf32x3)
    assert tf32x3 < 3 * ieee + 1e-7, (ieee, tf32x3)
    assert tf32 > FP32_BUDGET, tf32


def test_tf32_rounding():
    """1 + 2^-11 is a tie between tf32 neighbours 1 and 1 + 2^-10: away from zero; 1 + 2^-12 rounds down."""
    x = torch.tensor([1 + 2 ** -11, 1 + 2 ** -12, -(1 + 2 ** -11), 3.0], dtype=torch.float32)
    assert _tf32(x).tolist() == [1 + 2 ** -10, 1.0, -(1 + 2 ** -10), 3.0]


@pytest.fixture
def tf32x3():
    previous = attention.set_fp32_dot_precision("tf32x3")
    yield
    attention.set_fp32_dot_precision(previous)


@needs_triton
def test_the_setting_reaches_the_kernels(rng, monkeypatch, tf32x3):
    """Under the interpreter (plain fp32 dots) the forward kernels run with DOT = "tf32x3" for fp32 and "ieee" for
    fp16, and give the definitions' results: the option is wired, not its rounding (see the module docstring)."""
    asked = spy(monkeypatch, attention, "dot_precision")
    asked_rerope = spy(monkeypatch, fused, "dot_precision")
    q, k, v = (x.float() for x in qkv_inputs(rng, (1, 2, 21, 16)))
    q64, k64, v64 = (x.double() for x in (q, k, v))
    assert_close(attention.attention(q, k, v, backend="triton"), explicit_attention(q64, k64, v64, causal=True),
                 FP32_BUDGET, "attention")
    assert_close(rerope.rerope_attention(q, k, v, 5, backend="triton"), rerope_naive.rerope_attention(q64, k64, v64, 5),
                 FP32_BUDGET, "rerope")
    rerope.rerope_attention(q.half(), k.half(), v.half(), 5, backend="triton")
    assert asked == ["tf32x3"] and asked_rerope == ["tf32x3", "ieee"]


def test_bad_precision():
    with pytest.raises(ValueError, match=r"precision must be one of \('auto', 'ieee', 'tf32x3'\), got 'tf32'"):
        rerope.set_fp32_dot_precision("tf32")
    assert attention.set_fp32_dot_precision("auto") == "auto"      # the default, left unchanged


def test_auto_takes_tf32x3_for_the_fp32_forward_on_sm90():
    """"auto" (the default): attention's fp32 forward on Hopper's tiles with tf32x3; IEEE on sm_80, on architectures
    no build has checked, on the CPU and in the backwards; ReRoPE keeps IEEE; an explicit setting applies on every
    architecture (on sm_90's tiles only there)."""
    f32 = torch.float32
    assert [attention.kernel_dots("fwd", f32, arch) for arch in (None, 80, 86, 90, 100)] == \
        ["ieee", "ieee", "ieee", "tf32x3", "ieee"]
    assert [attention.kernel_dots(k, f32, 90) for k in ("dq", "dkdv")] == ["ieee", "ieee"]
    assert attention.kernel_dots("fwd", torch.bfloat16, 90) == "ieee"
    assert fused.dot_precision(f32, "fwd") == "ieee"
    assert attention.launch_config("fwd", 64, f32).blocks == {"BLOCK_M": 64, "BLOCK_N": 32}
    assert attention.launch_config("fwd", 128, f32).blocks == {"BLOCK_M": 64, "BLOCK_N": 16}
    assert attention.launch_config("fwd", 64, f32, arch=80).blocks == {"BLOCK_M": 32, "BLOCK_N": 32}
    previous = attention.set_fp32_dot_precision("ieee")
    try:
        assert attention.kernel_dots("fwd", f32, 90) == "ieee"
        assert attention.launch_config("fwd", 64, f32).blocks == {"BLOCK_M": 32, "BLOCK_N": 32}
        attention.set_fp32_dot_precision("tf32x3")
        assert attention.kernel_dots("fwd", f32, 80) == "tf32x3"
        assert attention.launch_config("fwd", 64, f32, arch=80).blocks == {"BLOCK_M": 32, "BLOCK_N": 32}
    finally:
        attention.set_fp32_dot_precision(previous)


def _tf32_truncated(x):
    """x (fp32) as the tensor cores read an fp32 register given as a tf32 operand: its low 13 mantissa bits dropped."""
    return (x.view(np.int32) & np.int32(~0x1FFF)).view(np.float32)


def _tf32_rna(x):
    """x (fp32) rounded to tf32 as cvt.rna.tf32.f32 does (to nearest, ties away from zero); NumPy's _tf32."""
    return ((x.view(np.int32) + np.int32(0x1000)) & np.int32(~0x1FFF)).view(np.float32)


def tf32x3_products(a, b, c, products=3):
    """acc c + a @ b as Triton lowers an fp32 dot with input_precision="tf32x3" (its F32DotTC pass, as the PTX of
    tests/kernels/test_aot.py shows: one cvt.rna.tf32 per operand element, the remainders as they are): x_h =
    cvt.rna(x), x_l = x - x_h (exact), d1 = a_l b_h, d2 = a_h b_l + d1, its NaNs zeroed (an infinite operand's
    remainder is NaN), d3 = a_h b_h + d2, then + c; each product of tf32 operands (the remainders truncated to tf32)
    is exact in fp32, the sums fp32. ``products`` = 1 keeps a_h b_h alone: one tf32 product, which must miss the
    budget (the mutation that shows the emulation is what the tests see)."""
    a_h, b_h = _tf32_rna(a), _tf32_rna(b)
    out = np.zeros(c.shape, np.float32)
    if products == 3:
        a_l, b_l = _tf32_truncated(a - a_h), _tf32_truncated(b - b_h)
        out = np.matmul(a_h, b_l) + np.matmul(a_l, b_h)
        out = np.where(np.isnan(out), np.float32(0), out)
    return (np.matmul(a_h, b_h) + out) + c


@contextlib.contextmanager
def tf32x3_interpreter_dots(products=3):
    """Inside the block the Triton interpreter computes fp32 dots with input_precision="tf32x3" as tf32x3_products;
    every other dot as before. Needs TRITON_INTERPRET=1."""
    from triton.runtime import interpreter
    builder = interpreter.InterpreterBuilder
    saved = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if (str(input_precision).upper().endswith("TF32X3")
                and a.data.dtype == b.data.dtype == d.data.dtype == np.float32):
            return interpreter.TensorHandle(tf32x3_products(a.data, b.data, d.data, products), d.dtype.scalar)
        return saved(self, a, b, d, input_precision, max_num_imprecise_acc)

    builder.create_dot = create_dot
    try:
        yield
    finally:
        builder.create_dot = saved


def test_tf32x3_products_emulate_three_tf32_products():
    """a = 1 + 2^-12 + 2^-20, b = 1 + 2^-13: a_h = b_h = 1 (the rest is under half of tf32's 2^-10), a_l = 2^-12 +
    2^-20, b_l = 2^-13. Three products sum to 1 + 2^-12 + 2^-13 + 2^-20, the fp32 rounding of a b (the dropped
    a_l b_l = 2^-25 + 2^-33 is under half an fp32 ulp); one tf32 product gives 1. An infinite operand gives inf,
    not the NaN of inf times its remainder (inf - inf)."""
    a = np.array([[1 + 2 ** -12 + 2 ** -20]], np.float32)
    b = np.array([[1 + 2 ** -13]], np.float32)
    zero = np.zeros((1, 1), np.float32)
    assert tf32x3_products(a, b, zero)[0, 0] == np.float32(1 + 2 ** -12 + 2 ** -13 + 2 ** -20)
    assert tf32x3_products(a, b, zero)[0, 0] == np.float32(np.float64(a[0, 0]) * np.float64(b[0, 0]))
    assert tf32x3_products(a, b, zero, products=1)[0, 0] == 1.0
    with np.errstate(invalid="ignore"):
        assert tf32x3_products(np.array([[np.inf]], np.float32), b, zero)[0, 0] == np.inf


# (d, T) on sm_90's tiles (64 x 32 for d <= 64, 64 x 16 above): T not a multiple of either tile, two query tiles,
# a head size that is not a power of two
TILE_CASES = [(64, 77), (128, 70), (96, 33)]


@needs_triton
@pytest.mark.parametrize("d, T", TILE_CASES)
def test_sm90_tiles_with_tf32x3_keep_the_fp32_budget(rng, monkeypatch, tf32x3, d, T):
    """The Triton forward on the tiles sm_90 launches (the interpreter takes sm_90's), its dots computed as Triton's
    tf32x3 lowering computes them: within the fp32 budget against the float64 reference (relative RMS and max abs
    error); with one tf32 product instead, not (the emulation is what the kernel ran)."""
    chosen = spy(monkeypatch, attention, "_launch_config")
    q, k, v = qkv_inputs(rng, (1, 2, T, d))
    expected = softmax_attention(q.numpy(), k.numpy(), v.numpy())
    with tf32x3_interpreter_dots():
        out = attention.attention(q.float(), k.float(), v.float(), backend="triton")
    assert chosen[0].blocks == {"BLOCK_M": 64, "BLOCK_N": 32 if d <= 64 else 16}
    assert_close(out, expected, FP32_BUDGET, f"tf32x3 d={d} T={T}")
    assert max_abs(out, expected) < FP32_BUDGET
    with tf32x3_interpreter_dots(products=1):
        one = attention.attention(q.float(), k.float(), v.float(), backend="triton")
    assert rel_rms(one, expected) > FP32_BUDGET
