"""Small models trained on a CPU that reproduce what the sources and papers claim the formulas do.

    python -m seqmix.experiments.recall           MQAR: attention vs RWKV-4 vs RWKV-7 vs Mamba (Zoology)
    python -m seqmix.experiments.extrapolation    RoPE, PI, NTK, ReRoPE, Leaky ReRoPE, log n past the training length
    python -m seqmix.experiments.selective_copy   a time-invariant SSM vs Mamba's selective scan

Each takes --quick (a reduced run under a minute, written to experiments/results/quick, git-ignored) and --seed;
the full runs write experiments/results/<name>.json, <name>.md, <name>*.png and small trained weights, and resume
where they stopped. The pieces: data (the generators and the corpus), transformer (the position schemes), zoo (the
models), training (a run, evaluation, the learning-rate sweep), records (results files), plots.
"""

# Imported by its bare folder name (a checkout's root first on sys.path): the installed package of that name takes
# its place (seqmix.checkout says why). Without seqmix, or copied into another project, the folder stays itself.
if __name__ == "experiments":
    try:
        from seqmix.checkout import step_aside
    except ImportError:
        pass
    else:
        step_aside(__name__, __file__)
