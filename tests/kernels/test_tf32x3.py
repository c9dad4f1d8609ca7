"""set_fp32_dot_precision("tf32x3"): fp32 dots of the attention and ReRoPE kernels on tensor cores, three tf32
products each. The interpreter computes every tl.dot as a plain fp32 matmul whatever input_precision says, so a
Triton test proves the option is passed through, not its rounding. The rounding is checked here by emulation: the
float64 definitions with every matrix product replaced by what the tensor cores compute (operands rounded to fp32,
each split into tf32 parts, tf32 products, fp32 sums); and in the AOT build (tests/kernels/test_aot.py): the fp32
forwards
built with it compile to mma.sync on tf32 operands, three per product."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.kernel_cases import needs_triton, spy
from helpers.qkv_check import qkv_inputs
from seqmix.kernels.attention.naive import explicit_attention
from seqmix.kernels.rerope import naive as rerope_naive
from seqmix.kernels import attention, rerope
from seqmix.kernels.rerope import fused
from seqmix.kernels.testing import FP32_BUDGET, assert_close, rel_rms


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
    with pytest.raises(ValueError, match=r"precision must be one of \('ieee', 'tf32x3'\), got 'tf32'"):
        rerope.set_fp32_dot_precision("tf32")
    assert attention.set_fp32_dot_precision("ieee") == "ieee"      # the default, left unchanged
