"""torch models built on the ops: RWKV-4 (Hugging Face names), RWKV-7 (BlinkDL names), Mamba (Hugging Face names)."""
