"""The battery declarations of the ops moved to their packages (kernels/<op>/spec.py), named by the op registry
(kernels/registry.py); this module keeps the old import working (code and notebooks import it from here)."""
from ..kernels.attention.spec import ATTENTION
from ..kernels.declarations import OPS, Case, Inputs, Op, call
from ..kernels.rerope.spec import REROPE_ATTENTION, REROPE_DECODE
from ..kernels.ssm.spec import SELECTIVE_SCAN
from ..kernels.wkv4.spec import WKV4
from ..kernels.wkv7.spec import WKV7

__all__ = ["Case", "Inputs", "Op", "OPS", "call", "ATTENTION", "REROPE_ATTENTION", "REROPE_DECODE", "WKV4", "WKV7",
           "SELECTIVE_SCAN"]
