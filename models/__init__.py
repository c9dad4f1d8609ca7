"""torch models built on the ops: RWKV-4 (Hugging Face names), RWKV-7 (BlinkDL names; flash-linear-attention's
Hugging Face layout read and written by models/rwkv7_fla.py), Mamba (Hugging Face names); weights I/O (io),
what the models share (base, layers), generation (generation), tokenizers and streamed text (text), and the
`python -m seqmix.generate` command (cli)."""

__all__ = ["base", "cli", "generation", "io", "layers", "mamba", "rwkv4", "rwkv7", "rwkv7_fla", "text"]
