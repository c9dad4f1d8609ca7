"""flash-linear-attention's RWKV7ForCausalLM (a test dependency) as a peer that runs on a CPU.

fla's RWKV-7 layer calls Triton kernels, which need a GPU (there is no CPU driver). Inside ``cpu_reference_ops()``
the layer's module-level names point to fla's own torch reference forms instead, so that what runs is fla's code,
with nothing of ours: its naive generalized-delta-rule recurrence (dplr_recurrence, which scales q by N^-1/2, so
r is passed in multiplied by N^1/2: RWKV-7 uses scale 1), gate_output_correction_ref, torch_addcmul_rwkv7,
k_update_ref, and token_shift_ref (a plain shift; no cache: the peer reads whole sequences).
"""
import contextlib
import warnings
from unittest import mock

import torch


def _token_shift(x, cu_seqlens=None, cache=None, output_cache=False, **_):
    from fla.modules.token_shift import token_shift_ref
    assert cache is None and cu_seqlens is None, "the CPU peer reads whole sequences only"
    delta = token_shift_ref(x)
    return (delta, x[:, -1:]) if output_cache else delta


def _recurrence(r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=True, **_):
    """fla's (B, T, H, N) layout into dplr_recurrence's (B, H, T, N) and back."""
    from fla.ops.generalized_delta_rule.dplr.naive import dplr_recurrence
    N = r.shape[-1]
    q, k, v, a, b, w = (x.transpose(1, 2) for x in (r * (scale * N ** 0.5), k, v, a, b, w))
    o, S = dplr_recurrence(q, k, v, a, b, w, initial_state, output_final_state)
    return o.transpose(1, 2), S


def _mul_recurrence(r, w, k, v, kk, a, scale=1.0, initial_state=None, output_final_state=True, **_):
    return _recurrence(r, w, k, v, -kk, kk * a, scale, initial_state, output_final_state)


@contextlib.contextmanager
def cpu_reference_ops():
    """fla's RWKV-7 layer and block with their Triton ops replaced by fla's torch reference forms."""
    import fla.layers.rwkv7 as layer
    import fla.models.rwkv7.modeling_rwkv7 as modeling
    from fla.ops.rwkv7.fused_addcmul import torch_addcmul_rwkv7
    from fla.ops.rwkv7.fused_k_update import k_update_ref
    from fla.ops.rwkv7.gate_output_correction import gate_output_correction_ref
    with mock.patch.multiple(layer, token_shift=_token_shift, chunk_rwkv7=_recurrence,
                             fused_mul_recurrent_rwkv7=_mul_recurrence, fused_addcmul_rwkv7=torch_addcmul_rwkv7,
                             fused_k_rwkv7=k_update_ref, gate_output_correction=gate_output_correction_ref), \
            mock.patch.object(modeling, "token_shift", _token_shift), warnings.catch_warnings():
        warnings.simplefilter("ignore")          # fla warns that its RWKV-7 may differ from BlinkDL's
        yield


def make_model(seed, **config):
    """A random fla RWKV7ForCausalLM (torch LayerNorm and GroupNorm, fuse_norm=False), weights at scales where every
    part of the model matters (as tests/models/test_models_rwkv7.py draws them for BlinkDL's names)."""
    from fla.models.rwkv7 import RWKV7Config, RWKV7ForCausalLM
    with cpu_reference_ops():
        model = RWKV7ForCausalLM(RWKV7Config(fuse_norm=False, fuse_cross_entropy=False, **config)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "norm.bias")):
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(("x_r", "x_w", "x_k", "x_v", "x_a", "x_g")):
                p.copy_(torch.rand(p.shape, generator=g))
            elif name.endswith("w_lora.lora.2.bias"):                   # BlinkDL's w0
                p.copy_(torch.rand(p.shape, generator=g) * 7 - 6)
            elif name.endswith(".k_k"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif name.endswith(".k_a"):
                p.copy_(1.5 * torch.rand(p.shape, generator=g))
            elif name.endswith(".r_k"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1 or name.endswith("embeddings.weight"):     # LoRA biases a0, v0; embeddings
                p.copy_(torch.randn(p.shape, generator=g))
            else:                                                         # Linear (out, in)
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    return model


def logits(model, input_ids):
    with cpu_reference_ops(), torch.no_grad():
        return model(input_ids, use_cache=False).logits
