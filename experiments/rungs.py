"""The rungs of the family (reference/family.py) as models the experiments train: RWKV-7 with its time mix's
transition replaced by a rung's, everything else RWKV-7's.

    S_t = S_{t-1} G_t + v_t k_t^T,  y_t = S_t r_t,  run by the production op kernels.wkv7 in its form
    S_t = S_{t-1} (diag(w_t) + a_t b_t^T) + v_t k_t^T

    arch               G_t                              made from the input as
    linear_attention   I                                (nothing: the state only adds)
    retention          gamma_h I, per head, constant    RetNet's gamma_h = 1 - 2^(-5 - h), fixed
    gla                diag(w_t), per key channel       RWKV-7's decay: log w = -e^-0.5 sigmoid(w0 + tanh(x w1) w2)
    delta_rule         I - beta_t k_t k_t^T             beta_t per head = the head's mean of RWKV-7's in-context
                                                        rate sigmoid(a0 + x a1 a2), in (0, 1)
    delta_rule_wide    the same, beta_t in (0, 2)       2 x that mean (Grazzi et al.: eigenvalues 1 - beta to -1)
    gated_delta_rule   alpha_t (I - beta_t k_t k_t^T)   alpha_t per head = exp(the head's mean of RWKV-7's log
                                                        decays); beta_t as the delta rule's

The rung's arguments go through ``as_wkv7``, the torch form of reference.family.as_wkv7's table (the tests hold
the two to the reference budget), and then the op. What stays RWKV-7's, initialization included
(zoo.rwkv7_training_init, whose parameters a rung takes over): the embedding and its norm, the block's norms, the
token shift and its mixes, the r, k, v projections, the per-head GroupNorm of the output, the gate, the output
projection, the channel mix and the head. What goes: RWKV-7's own transition (k_k, k_a, its diagonal-plus-rank-one
a and b), its value residual and its bonus term, so that the past reaches a token through the state and the token
shift alone. Keys are unit vectors per head for every rung (k / |k|): the delta rule needs them (I - beta k k^T then
has the eigenvalue 1 - beta along k and 1 elsewhere), and the other rungs take the same keys, so that the rungs
differ in their transition only. Queries (r) are not normalized, as in RWKV-7; the GroupNorm of the output stands
for linear attention's normalizer.

Sources: reference/family.py (the rungs, their papers); Grazzi et al. 2024, "Unlocking State-Tracking in Linear
RNNs Through Negative Eigenvalues" (arXiv:2411.12537) for beta in (0, 2); Sun et al. 2023 (RetNet,
arXiv:2307.08621) for the decays per head.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.wkv7 import wkv7
from ..models.layers import token_shift
from ..models.rwkv7 import Rwkv7, Rwkv7Config, log_decay

__all__ = ["RUNGS", "REFERENCE_RUNG", "RungConfig", "RungTimeMix", "as_wkv7", "as_rung", "retention_log_gamma"]

# arch -> (the reference rung it computes, beta's upper bound or None, the decay: None, "head", "channel", "step")
_SPEC = {"linear_attention": ("linear_attention", None, None),
         "retention": ("retention", None, "head"),
         "gla": ("gla", None, "channel"),
         "delta_rule": ("delta_rule", 1.0, None),
         "delta_rule_wide": ("delta_rule", 2.0, None),
         "gated_delta_rule": ("gated_delta_rule", 1.0, "step")}
RUNGS = tuple(_SPEC)
REFERENCE_RUNG = {arch: spec[0] for arch, spec in _SPEC.items()}     # arch -> the function of reference.family


@dataclass
class RungConfig(Rwkv7Config):
    """Rwkv7Config plus the rung its time mixes compute (one of RUNGS)."""
    rung: str = "linear_attention"

    def __post_init__(self):
        super().__post_init__()
        if self.rung not in _SPEC:
            raise ValueError(f"rung must be one of {RUNGS}, got {self.rung!r}")

    @property
    def time_mix_variant(self) -> str:
        """What models.rwkv7.step.variant reads: the C step computes RWKV-7's time mix, not a rung's."""
        return f"the family's rung {self.rung!r}"


def retention_log_gamma(heads: int) -> torch.Tensor:
    """RetNet's decays, log(1 - 2^(-5 - h)) for heads h = 0 .. H - 1 (memories of 32 to 32 * 2^(H-1) tokens)."""
    return torch.log1p(-torch.exp2(-5.0 - torch.arange(heads, dtype=torch.float64))).float()


def as_wkv7(rung: str, q, k, v, *params):
    """The arguments (r, log_w, k, v, a, b) of kernels.wkv7 that compute the reference rung ``rung`` (a key of
    reference.family.RUNGS) on torch tensors, differentiably: reference.family.as_wkv7's table, row for row.

        linear_attention   log_w 0; a = b = 0                  retention   log_w = log_gamma per head; a = b = 0
        gla                log_w = log_g; a = b = 0            ssd         log_w = log_a per head and step
        delta_rule         log_w 0; a = -k, b = beta k; v -> beta v
        gated_delta_rule   log_w = log_alpha; a = -k, b = alpha beta k; v -> beta v

    Args:
        q, k, v: (B, T, H, N). params: the rung's own, shaped as reference.family's functions take them.
    Returns:
        six tensors of shape (B, T, H, N) (some broadcast views).
    """
    zero = torch.zeros_like(q)
    per_step = lambda x: x[..., None].expand_as(q)                     # noqa: E731  (B, T, H) -> (B, T, H, N)
    if rung == "linear_attention":
        return q, zero, k, v, zero, zero
    if rung == "retention":
        return q, params[0][:, None].expand_as(q), k, v, zero, zero
    if rung == "gla":
        return q, params[0], k, v, zero, zero
    if rung == "ssd":
        return q, per_step(params[0]), k, v, zero, zero
    if rung == "delta_rule":
        beta = params[0][..., None]
        return q, zero, k, beta * v, -k, beta * k
    if rung == "gated_delta_rule":
        log_alpha, beta = params[0][..., None], params[1][..., None]
        return q, per_step(params[0]), k, beta * v, -k, torch.exp(log_alpha) * beta * k
    raise ValueError(f"rung must be a rung of reference.family, got {rung!r}")


class RungTimeMix(nn.Module):
    """A rung's time mix, with the parameters it takes over from an (initialized) RWKV-7 TimeMix: the token-shift
    mixes it uses, r, k, v, the gate, the output, ln_x, and the decay LoRA (w0, w1, w2) or the in-context rate's
    (a0, a1, a2) where the rung has a learned decay or beta. Called as RWKV-7's TimeMix is (Block.forward)."""

    def __init__(self, rung: str, source: nn.Module):
        super().__init__()
        self.rung = rung
        self.reference_rung, self.beta_max, self.decay = _SPEC[rung]
        H, N = source.r_k.shape
        mixes = "rkvg" + ("w" if self.decay in ("channel", "step") else "") + ("a" if self.beta_max else "")
        self.mixes = tuple(mixes)
        taken = [f"x_{c}" for c in mixes] + ["g1", "g2", "receptance", "key", "value", "output", "ln_x"]
        taken += ["w0", "w1", "w2"] if "w" in mixes else []
        taken += ["a0", "a1", "a2"] if "a" in mixes else []
        for name in taken:
            setattr(self, name, getattr(source, name))
        if self.decay == "head":
            self.register_buffer("log_gamma", retention_log_gamma(H))
        self.heads = (H, N)

    def arguments(self, x, x_prev):
        """From the layer-normed input x (B, T, C) and x_prev (B, C): r, unit k, v (B, T, H, N), the gate g (B, T, C)
        and the rung's own arguments (as reference.family's function of the rung takes them)."""
        B, T, C = x.shape
        heads = lambda z: z.reshape(B, T, *self.heads)                 # noqa: E731
        mix = torch.stack([getattr(self, f"x_{c}") for c in self.mixes])
        xs = dict(zip(self.mixes, torch.lerp(x, token_shift(x, x_prev), mix).unbind(0)))
        r, k, v = heads(self.receptance(xs["r"])), heads(self.key(xs["k"])), heads(self.value(xs["v"]))
        g = torch.sigmoid(xs["g"] @ self.g1) @ self.g2
        params = []
        if self.decay == "head":
            params.append(self.log_gamma)
        elif self.decay is not None:
            log_w = heads(log_decay(self.w0, torch.tanh(xs["w"] @ self.w1) @ self.w2))
            params.append(log_w if self.decay == "channel" else log_w.mean(-1))
        if self.beta_max:
            params.append(self.beta_max * heads(torch.sigmoid(self.a0 + xs["a"] @ self.a1 @ self.a2)).mean(-1))
        return r, F.normalize(k, dim=-1), v, g, tuple(params)

    def state_mix(self, r, k, v, params, kv, backend=None):
        """The rung through the production op: (y (B, T, H, N), state (B, H, N, N))."""
        return wkv7(*as_wkv7(self.reference_rung, r, k, v, *params), state=kv, backend=backend)

    def forward(self, x, x_prev, kv, v_first, backend=None):
        """As RWKV-7's TimeMix: (out (B, T, C), x_prev, kv, v_first), v_first passed on untouched."""
        B, T, C = x.shape
        r, k, v, g, params = self.arguments(x, x_prev)
        y, kv = self.state_mix(r, k, v, params, kv, backend)
        ln_x = self.ln_x
        y = torch.group_norm(y.reshape(B * T, C), ln_x.num_groups, ln_x.weight, ln_x.bias, ln_x.eps).view(B, T, C)
        return self.output(y * g), x[:, -1], kv, v_first


def as_rung(model: Rwkv7) -> Rwkv7:
    """``model`` (an Rwkv7 of a RungConfig, initialized) with each block's time mix replaced by the config's rung's,
    which takes over the parameters it uses (the rest are dropped), in place."""
    if not isinstance(model.config, RungConfig):
        raise TypeError(f"model must be an Rwkv7 of a RungConfig, got config {type(model.config).__name__}")
    for block in model.blocks:
        block.att = RungTimeMix(model.config.rung, block.att)
    return model
