"""`python -m seqmix.generate PATH --prompt "..."`: load a checkpoint, stream its continuation of a prompt.

    load_model(path, dtype=None)   a model directory (config.json's model_type: "rwkv" -> RwkvForCausalLM, "mamba" ->
                                   MambaForCausalLM, "rwkv7" -> Rwkv7 in flash-linear-attention's layout) or a
                                   BlinkDL RWKV-7 .pth / .safetensors file -> the model, in eval mode
    main(argv)                     the command line (--help lists the options)

The text is written to stdout as it is generated (models/text.py holds back incomplete UTF-8 characters and a
possible start of the stop string); prefill and decode speeds go to stderr at the end. The recurrent state can be
saved after the run (--save-state) and a later run can start from it (--state): RWKV users keep a long prompt's
state and reuse it without reading the prompt again. A mistake (a bad option, a missing or damaged file) is one line
on stderr, exit status 2 for a bad option and 1 otherwise; --debug shows the traceback instead.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

from .base import MODEL_DTYPES
from .generation import check_sampling
from .io import load_state, read_json, save_state
from .mamba import MambaForCausalLM
from .rwkv4 import RwkvForCausalLM
from .rwkv7 import Rwkv7
from .rwkv7_fla import FLA_MODEL_TYPE
from .text import load_tokenizer

__all__ = ["load_model", "main", "MODEL_TYPES"]

# config.json's model_type -> the class whose from_pretrained reads the directory
MODEL_TYPES = {"rwkv": RwkvForCausalLM, "mamba": MambaForCausalLM, FLA_MODEL_TYPE: Rwkv7}


def load_model(path, dtype=None):
    """The model stored at ``path``, built without allocating its weights twice (models/base.py).

    Args:
        path: a model directory with config.json (model_type "rwkv", "mamba" or "rwkv7", the last in
            flash-linear-attention's layout), or a BlinkDL RWKV-7 checkpoint file (.pth, .safetensors).
        dtype: None or "auto" for the stored dtype, else a torch.dtype or its name ("float32", "bfloat16").

    Returns:
        the model in eval mode; ``model.tokenizer`` is the directory's tokenizer, or None.
    """
    path = os.fspath(path)
    if os.path.isfile(path):
        return Rwkv7.from_checkpoint(path, dtype)
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"{path}: neither a checkpoint file nor a model directory with config.json")
    model_type = read_json(config_path, "a config object").get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"{config_path}: model_type {model_type!r} is not one of {sorted(MODEL_TYPES)}")
    return MODEL_TYPES[model_type].from_pretrained(path, dtype)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # One line, without argparse's usage block: the mistake is what the user needs to see.
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m seqmix.generate", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                epilog="A mistake (a missing file, a bad option) is reported in one line on stderr, with exit status "
                       "2 for a bad option and 1 for anything else; --debug shows the full traceback instead.")
    p.add_argument("path", help="a model directory (config.json + weights) or a BlinkDL RWKV-7 .pth")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--tokenizer", help="'world' (RWKV's World vocabulary, from the rwkv package), a tokenizer.json "
                                       "or a World vocab .txt; default: the one beside the weights")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    p.add_argument("--top-p", type=float, default=0.7, help="nucleus sampling")
    p.add_argument("--stop", help=r"stop when the text contains this string (\n and \t are read as escapes), "
                                  r"e.g. '\n\n'")
    p.add_argument("--seed", type=int, help="seed of the sampler, for a reproducible run")
    p.add_argument("--dtype", default="auto", choices=["auto"] + [str(d).removeprefix("torch.") for d in MODEL_DTYPES],
                   help="auto: as stored")
    p.add_argument("--state", help="start from a state saved by --save-state (the prompt then continues it)")
    p.add_argument("--save-state", help="save the state after the run (prompt and generated text) to this file")
    p.add_argument("--backend", help="the ops' backend: c, torch or triton (default: the device's)")
    p.add_argument("--debug", action="store_true", help="on an error, show the full traceback, not one line")
    return p


def _check_options(parser, args) -> None:
    """Refuse bad option values before anything is loaded or generated (parser.error: one line, exit 2)."""
    try:
        check_sampling(args.temperature, args.top_p)
    except ValueError as e:
        parser.error(str(e))
    if args.max_new_tokens < 0:
        parser.error(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    if args.seed is not None and not -2 ** 63 <= args.seed < 2 ** 64:       # what torch.Generator takes
        parser.error(f"--seed must lie in [-2**63, 2**64), got {args.seed}")
    if args.save_state:                # found out only after generating otherwise
        folder = os.path.dirname(os.path.abspath(args.save_state))
        if not os.path.isdir(folder):
            parser.error(f"--save-state {args.save_state}: no such folder {folder}")
        if os.path.isdir(args.save_state):
            parser.error(f"--save-state {args.save_state}: is a folder, not a file name")
        if _is_model_file(args.save_state, args.path, args.state):
            parser.error(f"--save-state {args.save_state}: is the model's own file ({args.path}); saving the state "
                         f"there would replace the weights")


def _is_model_file(candidate: str, model_path: str, state: str | None) -> bool:
    """Whether ``candidate`` is the model checkpoint itself, or a file that already exists in its model directory
    (weights, config, tokenizer: a state written there replaces one of them). The --state file, which a run may
    continue in place, is allowed."""
    candidate, model_path = os.path.realpath(candidate), os.path.realpath(model_path)
    if state is not None and candidate == os.path.realpath(state):
        return False
    if os.path.isdir(model_path):
        return os.path.dirname(candidate) == model_path and os.path.exists(candidate)
    return candidate == model_path


def _one_line(error: BaseException) -> str:
    """The error's message on one line (a KeyError's str is its repr: take the message itself)."""
    message = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    return " ".join(line.strip() for line in message.splitlines() if line.strip()) or type(error).__name__


def main(argv=None) -> int:
    """Run the command line (see _parser, or --help).

    Args:
        argv: the arguments (default sys.argv[1:]).

    Returns:
        the exit code: 0, or 1 after an error reported in one line on stderr. Bad options exit with status 2
        (SystemExit, as argparse does); --debug lets the error propagate with its traceback.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    _check_options(parser, args)
    try:
        return _run(parser, args)
    except Exception as e:             # a missing or damaged file, a prompt the vocabulary cannot encode, ...
        if args.debug:
            raise
        print(f"{parser.prog}: error: {_one_line(e)} (--debug shows the traceback)", file=sys.stderr)
        return 1


def _run(parser, args) -> int:
    state = load_state(args.state) if args.state else None      # before the model: a bad file fails fast
    model = load_model(args.path, args.dtype)
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else model.tokenizer
    if tokenizer is None:
        parser.error(f"{args.path}: no tokenizer beside the weights; pass --tokenizer world or a tokenizer file")
    stop = args.stop.replace("\\n", "\n").replace("\\t", "\t") if args.stop else None
    stream = model.generate_text(
        args.prompt, tokenizer, backend=args.backend, max_new_tokens=args.max_new_tokens,
        temperature=args.temperature, top_p=args.top_p, stop=stop, state=state,
        generator=torch.Generator().manual_seed(args.seed) if args.seed is not None else None)
    for piece in stream:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    if args.save_state:
        save_state(stream.state, args.save_state)
    print(f"prefill: {stream.prompt_tokens} tokens, {stream.prefill_tokens_per_s:.1f} tokens/s; "
          f"decode: {len(stream.tokens)} tokens, {stream.decode_tokens_per_s:.1f} tokens/s", file=sys.stderr)
    return 0
