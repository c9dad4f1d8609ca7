"""The input makers moved down to ``seqmix.kernels.inputs``, beside the op registry that names them
(kernels/registry.py); this module keeps the old import working (code and notebooks import it from here)."""
from ..kernels.inputs import (W_RAW, qkv_inputs, wkv4_inputs, spiky_keys, rwkv7_inputs, scan_inputs, split_bounds,
in_pieces)

__all__ = ["W_RAW", "qkv_inputs", "wkv4_inputs", "spiky_keys", "rwkv7_inputs", "scan_inputs", "split_bounds",
           "in_pieces"]
