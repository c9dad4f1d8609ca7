"""The battery declarations of the ops moved to their packages (kernels/<op>/spec.py), named by the op registry
(kernels/registry.py); this module keeps the old import working (code and notebooks import it from here)."""
from seqmix.kernels.attention.spec import ATTENTION
from seqmix.kernels.declarations import OPS, Case, Inputs, Op, call
from seqmix.kernels.rerope.spec import REROPE_ATTENTION, REROPE_DECODE
from seqmix.kernels.ssm.spec import SELECTIVE_SCAN
from seqmix.kernels.wkv4.spec import WKV4
from seqmix.kernels.wkv7.spec import WKV7

__all__ = ["Case", "Inputs", "Op", "OPS", "call", "ATTENTION", "REROPE_ATTENTION", "REROPE_DECODE", "WKV4", "WKV7",
           "SELECTIVE_SCAN"]
