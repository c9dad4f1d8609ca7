"""The battery declarations of the ops moved down to ``seqmix.kernels.declarations``, beside the op registry that
names them (kernels/registry.py); this module keeps the old import working (code and notebooks import it from here)."""
from seqmix.kernels.declarations import (Case, Inputs, Op, OPS, call, ATTENTION, REROPE_ATTENTION, REROPE_DECODE, WKV4,
    WKV7, SELECTIVE_SCAN)

__all__ = ["Case", "Inputs", "Op", "OPS", "call", "ATTENTION", "REROPE_ATTENTION", "REROPE_DECODE", "WKV4", "WKV7",
           "SELECTIVE_SCAN"]
