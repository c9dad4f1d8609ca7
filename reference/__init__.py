"""The truth: every formula in NumPy, float64, written to be read and copied.

Each module imports only NumPy, the standard library and (where a model needs an op) a sibling module here.
"""
