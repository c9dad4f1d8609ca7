"""Every rung of reference/family.py is a setting of the production op seqmix.kernels.wkv7.wkv7: the arguments
`as_wkv7` gives, run in fp32 on each CPU backend (torch's chunked WY form, the C loop, the sequential Triton kernel
and the chunked one under the interpreter), agree with the rung's own float64 loop within the fp32 budget (1e-4 for
the chunked forms, as the design's budget for chunked WKV-7). T = 20 crosses a chunk boundary (16 steps), and an
initial state is carried in. Linear attention and the delta rule run with decays of exactly 1 (log_w = 0): every
backend takes them as it takes any other decay (no special case), which the runs here show."""
import pytest
import torch

from helpers.kernel_cases import needs_triton
from seqmix.kernels.testing import FP32_BUDGET, FP32_CHUNKED_WKV7_BUDGET, assert_close
from seqmix.kernels.wkv7 import wkv7
from seqmix.reference import family
from helpers.family_inputs import rung_inputs

BACKENDS = {"torch": FP32_CHUNKED_WKV7_BUDGET, "c": FP32_BUDGET,
            "triton": FP32_BUDGET, "triton_chunked": FP32_CHUNKED_WKV7_BUDGET}


# The sequential Triton kernel walks its 20 steps in the interpreter (3-5 s a rung here): the full tier's.
MARKS = {"torch": [], "c": [], "triton": [needs_triton, pytest.mark.slow], "triton_chunked": [needs_triton]}


@pytest.mark.parametrize("backend", [pytest.param(b, marks=MARKS[b]) for b in BACKENDS])
@pytest.mark.parametrize("rung", sorted(family.RUNGS))
def test_production_wkv7_runs_every_rung(rng, backend, rung):
    q, k, v, params, S0 = rung_inputs(rng, rung, B=1, T=20, H=2, N=16)
    y_ref, S_ref = family.RUNGS[rung](q, k, v, *params, state=S0)
    args = [torch.tensor(x, dtype=torch.float32) for x in family.as_wkv7(rung, q, k, v, *params)]
    if rung in ("linear_attention", "delta_rule"):
        assert (args[1] == 0).all()                                      # decays of exactly 1
    y, S = wkv7(*args, state=torch.tensor(S0, dtype=torch.float32), backend=backend)
    assert_close(y, y_ref, BACKENDS[backend], f"{rung} on {backend}: y")
    assert_close(S, S_ref, BACKENDS[backend], f"{rung} on {backend}: state")


@pytest.mark.parametrize("backend", ["torch", "c"])
def test_production_wkv7_carries_a_rung_across_a_split_sequence(rng, backend):
    q, k, v, params, S0 = rung_inputs(rng, "gated_delta_rule", B=1, T=20, H=2, N=16)
    y_ref, S_ref = family.gated_delta_rule(q, k, v, *params, state=S0)
    args = [torch.tensor(x, dtype=torch.float32) for x in family.as_wkv7("gated_delta_rule", q, k, v, *params)]
    S, ys = torch.tensor(S0, dtype=torch.float32), []
    for lo, hi in ((0, 7), (7, 20)):
        y, S = wkv7(*(x[:, lo:hi] for x in args), state=S, backend=backend)
        ys.append(y)
    assert_close(torch.cat(ys, 1), y_ref, FP32_CHUNKED_WKV7_BUDGET, f"{backend} in pieces: y")
    assert_close(S, S_ref, FP32_CHUNKED_WKV7_BUDGET, f"{backend} in pieces: state")


@pytest.mark.parametrize("backend", [pytest.param(b, marks=MARKS[b]) for b in BACKENDS])
def test_a_decay_of_zero_resets_the_state_on_every_backend(rng, backend):
    """SSD with log_a = -1e4 at step 5 (a decay of exp(-1e4) = 0: the rungs take finite log decays, as
    reference.wkv7 does): everything before step 5 is forgotten, so the outputs from step 5 on are those of the
    sequence started there from a zero state, on the reference and on each backend (whose torch and chunked paths
    take the couplings for such spreads by blocks, kernels/wkv7). Under the interpreter the chunked Triton kernel
    warns of overflow in exp: it evaluates the factored form too and keeps the stepwise one on the device."""
    q, k, v, (log_a,), S0 = rung_inputs(rng, "ssd", B=1, T=20, H=2, N=16)
    log_a[:, 5] = -1e4
    y_ref, S_ref = family.ssd(q, k, v, log_a, state=S0)
    y_fresh, S_fresh = family.ssd(q[:, 5:], k[:, 5:], v[:, 5:], log_a[:, 5:])
    assert_close(y_ref[:, 5:], y_fresh, 1e-12, "reference: outputs after the reset")
    assert_close(S_ref, S_fresh, 1e-12, "reference: state after the reset")
    args = [torch.tensor(x, dtype=torch.float32) for x in family.as_wkv7("ssd", q, k, v, log_a)]
    y, S = wkv7(*args, state=torch.tensor(S0, dtype=torch.float32), backend=backend)
    assert_close(y, y_ref, BACKENDS[backend], f"{backend}: y")
    assert_close(S, S_ref, BACKENDS[backend], f"{backend}: state")
