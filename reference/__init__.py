"""The truth: every formula in NumPy, float64, written to be read and copied.

Each module imports only NumPy, the standard library and (where a model needs an op) a sibling module here, by a
relative import (`from .wkv4 import wkv4`), so that the folder copied into another project under any name still
imports; the models share their small functions through functional.py. Every function takes array-likes and
computes in float64: inputs are converted with np.asarray(x, dtype=np.float64), whatever their dtype (one input
policy throughout).
"""

# Imported by its bare folder name (a checkout's root first on sys.path): the installed package of that name takes
# its place (the checkout's src/seqmix/checkout.py says why). That file is run from its path with the standard
# library's importlib, so that this folder imports nothing but NumPy and the standard library; copied into another
# project, where there is no such file, the folder stays itself.
if __name__ == "reference":
    import importlib.util as _importlib_util
    from pathlib import Path as _Path

    _checkout = _Path(__file__).resolve().parent.parent / "src" / "seqmix" / "checkout.py"
    if _checkout.is_file():
        _spec = _importlib_util.spec_from_file_location("_seqmix_checkout", _checkout)
        _module = _importlib_util.module_from_spec(_spec)
        _spec.loader.exec_module(_module)
        _module.step_aside(__name__, __file__)
