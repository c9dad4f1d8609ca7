"""kernels/native.py's public helpers refuse what the C loops cannot read (round 4's F4), and kernels/testing.py's
GPU-like arithmetic keeps its order and its bias (round 4's surviving mutants T1, T5)."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from seqmix.kernels import native, testing


@pytest.mark.parametrize("helper", ["exp", "softplus", "sum_rows"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16, torch.int32])
def test_the_c_helpers_refuse_a_dtype_they_do_not_take(helper, dtype):
    """float64 read as fp32 gave garbage (exp(-3) = 3e-10); fp16 written as fp32 corrupted the heap."""
    x = torch.linspace(-3, 3, 8).reshape(2, 4).to(dtype)
    with pytest.raises(TypeError, match=rf"native.{helper}: x must have dtype torch.float32 .*got {dtype}"):
        getattr(native, helper)(x)


def test_fp16_softplus_no_longer_corrupts_the_heap():
    """In a child process: the old failure was an abort (free(): invalid next size)."""
    script = ("import torch\nfrom seqmix.kernels import native\ntry:\n    native.softplus(torch.linspace(-3, 3, 8)"
              ".half())\nexcept TypeError as e:\n    print('refused')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "refused", done.stderr[-1000:]


def test_the_c_helpers_agree_with_torch_on_what_they_take():
    x = torch.linspace(-3, 3, 12).reshape(3, 4)
    torch.testing.assert_close(native.exp(x.t()), torch.exp(x.t()), rtol=2e-7, atol=0)    # a strided view too
    torch.testing.assert_close(native.softplus(x), torch.nn.functional.softplus(x), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(native.sum_rows(x), x.sum(0), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="native.sum_rows: x must have a first axis"):
        native.sum_rows(torch.tensor(1.0))
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got ndarray"):
        native.exp(np.zeros(3, np.float32))


def test_the_fma_chain_adds_in_k_order():
    """T1: the chain run in reversed k order. Products spread over 2^-20..2^20 make the order show in fp32."""
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((4, 16)) * 2.0 ** rng.integers(-20, 21, (4, 16))).astype(np.float32)
    b = rng.standard_normal((16, 3)).astype(np.float32)
    acc = np.zeros((4, 3), np.float32)

    def chain(order):
        out = acc.copy()
        for kk in order:        # fp32 products are exact in float64; one rounding per multiply-add, as an FMA
            out = (a[:, kk, None].astype(np.float64) * b[kk].astype(np.float64) + out).astype(np.float32)
        return out
    forward, backward = chain(range(16)), chain(reversed(range(16)))
    assert not np.array_equal(forward, backward)                    # the inputs tell the two orders apart
    assert np.array_equal(testing.fma_chain_dot(a, b, acc), forward)


def test_gpu_like_exp_is_biased_upward_as_documented():
    """T5: the ulps moved towards -inf."""
    x = np.linspace(-20, 20, 101, dtype=np.float32)
    exact = testing._ex2_approx(x)                 # private: the tested helper's own parts
    biased = testing._ulps_up(testing._ex2_approx, testing.GPU_MATH_ULPS)(x)
    assert (biased > exact).all()
    assert np.array_equal(biased, np.nextafter(np.nextafter(exact, np.float32(np.inf)), np.float32(np.inf)))
