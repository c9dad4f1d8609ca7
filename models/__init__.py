"""torch models built on the ops: RWKV-4 (Hugging Face names), RWKV-7 (BlinkDL names; flash-linear-attention's
Hugging Face layout read and written by models/rwkv7_fla.py), Mamba (Hugging Face names); weights I/O (io),
what the models share (base, layers), generation (generation), tokenizers and streamed text (text), and the
`python -m seqmix.generate` command (cli)."""

# Imported by its bare folder name (a checkout's root first on sys.path): the installed package of that name takes
# its place (seqmix.checkout says why). Without seqmix, or copied into another project, the folder stays itself.
if __name__ == "models":
    try:
        from seqmix.checkout import step_aside
    except ImportError:
        pass
    else:
        step_aside(__name__, __file__)

__all__ = ["base", "cli", "generation", "io", "layers", "mamba", "rwkv4", "rwkv7", "rwkv7_fla", "text"]
