"""The input makers moved down to ``seqmix.kernels.inputs``, beside the op registry that names them
(kernels/registry.py); this module keeps the old import working (code and notebooks import it from here)."""
from seqmix.kernels.inputs import *  # noqa: F401,F403
from seqmix.kernels.inputs import __all__  # noqa: F401
