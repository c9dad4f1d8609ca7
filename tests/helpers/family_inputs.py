"""The family's test inputs, shared by tests/reference/test_reference_family.py and
tests/kernels/test_family_kernels.py."""
import numpy as np

__all__ = ["rung_inputs"]


def rung_inputs(rng, rung, B=2, T=9, H=3, N=4, state=True):
    """(q, k, v, params, S_0) for a rung: unit keys for the delta rules (their transitions are then contractions),
    decays in (0.37, 1), a random non-symmetric initial state (so that a transposed state shows)."""
    q, k, v = (rng.standard_normal((B, T, H, N)) for _ in range(3))
    if "delta" in rung:
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
    per_step = lambda: -rng.uniform(0.0, 1.0, (B, T, H))
    params = {"linear_attention": (), "retention": (-rng.uniform(0.0, 1.0, H),),
              "gla": (-rng.uniform(0.0, 1.0, (B, T, H, N)),), "ssd": (per_step(),),
              "delta_rule": (rng.uniform(0.0, 1.0, (B, T, H)),),
              "gated_delta_rule": (per_step(), rng.uniform(0.0, 1.0, (B, T, H)))}[rung]
    S0 = rng.standard_normal((B, H, N, N)) if state else None
    return q, k, v, params, S0
