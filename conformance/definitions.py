"""The float64 torch definitions moved to their ops' packages (kernels/<op>/naive.py), named by the op registry
(kernels/registry.py); this module keeps the old import working (code and notebooks import it from here)."""
from ..kernels.attention.naive import explicit_attention
from ..kernels.rerope.naive import rerope_attention, rerope_decode
from ..kernels.ssm.naive import selective_scan
from ..kernels.wkv4.naive import wkv4
from ..kernels.wkv7.naive import wkv7

__all__ = ["explicit_attention", "rerope_attention", "rerope_decode", "wkv4", "wkv7", "selective_scan"]
