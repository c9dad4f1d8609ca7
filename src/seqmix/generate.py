"""`python -m seqmix.generate PATH --prompt "..."`: stream a model's continuation of a prompt (seqmix.models.cli).

    python -m seqmix.generate path/to/model_dir --prompt "The Eiffel tower is in" --max-new-tokens 50
    python -m seqmix.generate RWKV-x070-World.pth --tokenizer world --prompt "User: hi\n\nAssistant:" --stop '\n\n'
"""
from .models.cli import load_model, main

__all__ = ["load_model", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
