"""Production path: torch + Triton implementations of the sequence-mixing ops.

One package per op (``attention``, ``rerope``, ``wkv4``, ``wkv7``, ``ssm``: kernels/<op>/ holds the op's public
function, its backends, its declaration in spec.py and its naive form); each exposes one public function with a
``backend`` argument, and ``backends`` is the one dispatcher that says which runs (None: the first backend in the
op's order that takes the call; a backend named that cannot raises with its reason). kernels/ itself keeps what every
op shares: the registry, the dispatcher, the C build, the testing helpers. Triton is optional: without it the torch
backend works.
To run the Triton kernels on CPU tensors, set ``TRITON_INTERPRET=1`` before anything imports triton.
"""

# Imported by its bare folder name (a checkout's root first on sys.path): the installed package of that name takes
# its place (seqmix.checkout says why). Without seqmix, or copied into another project, the folder stays itself.
if __name__ == "kernels":
    try:
        from seqmix.checkout import step_aside
    except ImportError:
        pass
    else:
        step_aside(__name__, __file__)

import os as _os

__all__ = ["use_interpreter_without_gpu"]


def use_interpreter_without_gpu() -> str:
    """Set TRITON_INTERPRET=1 when no CUDA GPU is present, so that backend='triton' runs on CPU tensors.

    Call it before anything imports triton (the first cell of a notebook, the top of a script); returns
    "interpreter" or "gpu". Importing ``kernels`` itself does not import triton.
    """
    import sys

    import torch
    if torch.cuda.is_available():
        return "gpu"
    if "triton" in sys.modules and _os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("triton was imported before TRITON_INTERPRET=1 was set: restart the kernel and call "
                           "seqmix.use_interpreter_without_gpu() first")
    _os.environ["TRITON_INTERPRET"] = "1"
    return "interpreter"
