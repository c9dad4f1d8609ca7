"""BlinkDL's `rwkv` package (a test dependency) in RWKV-7 mode, for the tests that compare with it.

rwkv.model decides at import time, from environment variables, whether RWKV-7 exists and how it runs, so the
variables are set first and the import happens on call, not at the top of a file. A copy imported earlier without
them (another test module) is re-executed. The variables are restored afterwards."""
import importlib
import os

# RWKV-7 on, no CUDA kernel, no TorchScript for the v4 code.
PEER_ENV = {"RWKV_V7_ON": "1", "RWKV_JIT_ON": "0", "RWKV_CUDA_ON": "0"}


def rwkv7_class():
    """rwkv.model.RWKV_x070, imported with PEER_ENV."""
    saved = {k: os.environ.get(k) for k in PEER_ENV}
    os.environ.update(PEER_ENV)
    try:
        peer_model = importlib.import_module("rwkv.model")
        if not hasattr(peer_model, "RWKV_x070"):
            peer_model = importlib.reload(peer_model)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v
    return peer_model.RWKV_x070
