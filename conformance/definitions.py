"""The float64 torch definitions moved down to ``seqmix.kernels.naive``, beside the op registry that names them
(kernels/registry.py); this module keeps the old import working (code and notebooks import it from here)."""
from seqmix.kernels.naive import (explicit_attention, rerope_attention, rerope_decode, wkv4, wkv7, selective_scan)

__all__ = ["explicit_attention", "rerope_attention", "rerope_decode", "wkv4", "wkv7", "selective_scan"]
