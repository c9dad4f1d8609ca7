"""The float64 torch definitions moved down to ``seqmix.kernels.naive``, beside the op registry that names them
(kernels/registry.py); this module keeps the old import working (code and notebooks import it from here)."""
from seqmix.kernels.naive import *  # noqa: F401,F403
from seqmix.kernels.naive import __all__  # noqa: F401
