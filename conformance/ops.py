"""The battery declarations of the ops moved down to ``seqmix.kernels.declarations``, beside the op registry that names them
(kernels/registry.py); this module keeps the old import working (code and notebooks import it from here)."""
from seqmix.kernels.declarations import *  # noqa: F401,F403
from seqmix.kernels.declarations import __all__  # noqa: F401
