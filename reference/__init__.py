"""The truth: every formula in NumPy, float64, written to be read and copied.

Each module imports only NumPy, the standard library and (where a model needs an op) a sibling module here, by a
relative import (`from .wkv4 import wkv4`), so that the folder copied into another project under any name still
imports; the models share their small functions through functional.py. Every function takes array-likes and
computes in float64: inputs are converted with np.asarray(x, dtype=np.float64), whatever their dtype (one input
policy throughout).
"""

# Imported by its bare folder name (a checkout's root first on sys.path): the installed package of that name takes
# its place (seqmix.checkout says why). Without seqmix, or copied into another project, the folder stays itself.
if __name__ == "reference":
    try:
        from seqmix.checkout import step_aside
    except ImportError:
        pass
    else:
        step_aside(__name__, __file__)
