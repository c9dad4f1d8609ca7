"""Text in, text out: the tokenizers the checkpoints ship with, and generation that streams decoded text.

    load_tokenizer(spec)       "world": RWKV's World vocabulary as BlinkDL's `rwkv` package ships it (its
                               rwkv_vocab_v20230424.txt and trie tokenizer); a tokenizer.json (Hugging Face's
                               `tokenizers` library: GPT-NeoX for RWKV-4 Pile and Mamba); a World-format vocab .txt
    find_tokenizer(local_dir)  the tokenizer a model directory ships (tokenizer.json, else a World vocab), or None
    TextStream(step, tokenizer, prompt, ...)   iterate for the text as it is generated; then .state, .text, speeds

Nothing here writes a tokenizer: both libraries are optional (pyproject's `text` extra) and imported on first use.
Streaming holds back what is not yet text: bytes of an incomplete UTF-8 character (a token may end inside one; the
decoders show them as U+FFFD) and a tail that may be the start of the stop string.
"""
from __future__ import annotations

import ast
import os
import time

import torch

from .generation import check_prompt, continue_tokens

__all__ = ["load_tokenizer", "find_tokenizer", "TextStream", "WORLD_VOCAB"]

WORLD_VOCAB = "rwkv_vocab_v20230424.txt"       # the file name in the rwkv package and in RWKV-7 World directories
_REPLACEMENT = "\ufffd"


class _WorldTokenizer:
    """RWKV's World tokenizer: the `rwkv` package's trie over a vocabulary of byte strings. Ids missing from the
    vocabulary (0, end of text, and those above it) decode to nothing."""

    def __init__(self, vocab_file: str):
        from rwkv.rwkv_tokenizer import TRIE_TOKENIZER    # optional: pyproject's `text` extra
        self.name = vocab_file
        self._trie = TRIE_TOKENIZER(vocab_file)

    def encode(self, text: str) -> list[int]:
        try:
            return self._trie.encode(text)
        except UnboundLocalError:           # the rwkv trie's way of saying no token starts at some byte
            pass
        missing = next((repr(ch) for ch in text if not self._encodes(ch)), "a character")
        raise ValueError(f"{self.name}: the vocabulary has no token for {missing} in the text") from None

    def _encodes(self, ch: str) -> bool:
        try:
            self._trie.encode(ch)
            return True
        except UnboundLocalError:
            return False

    def decode(self, ids) -> str:
        return b"".join(self._trie.idx2token.get(int(i), b"") for i in ids).decode("utf-8", errors="replace")


class _HFTokenizer:
    """A tokenizer.json read by Hugging Face's `tokenizers` library."""

    def __init__(self, path: str):
        from tokenizers import Tokenizer                   # optional: pyproject's `text` extra
        self.name = path
        self._tok = Tokenizer.from_file(path)

    def encode(self, text: str) -> list[int]:
        try:
            return self._tok.encode(text, add_special_tokens=False).ids
        except Exception as e:              # tokenizers' own bare Exception, e.g. a WordLevel model without unk
            raise ValueError(f"{self.name}: cannot encode the text ({e})") from None

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


def _check_world_vocab(path: str) -> None:
    """The rwkv package evaluates every line of a vocabulary file as Python (eval): accept only files whose lines
    are `<id> <str or bytes literal> <length>`, checked with ast.literal_eval, so a vocab file cannot run code;
    and check what the package asserts without saying where (the length is the token's UTF-8 byte count, the file
    is UTF-8, it has a token at all), so that an error names the file and the line."""
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    if lines[-1] == b"":                    # the newline that ends the last line
        lines.pop()
    if not lines:
        raise ValueError(f"{path}: an empty World vocabulary (no token lines)")
    seen: dict[int, int] = {}
    for n, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}, line {n}: not UTF-8 ({e.reason} at byte {e.start})") from None
        try:
            token = ast.literal_eval(line[line.index(" "):line.rindex(" ")].strip())
            ok = line[:line.index(" ")].isdigit() and isinstance(token, (str, bytes))
        except (ValueError, SyntaxError):
            ok = False
        if not ok:
            raise ValueError(f"{path}, line {n}: not a World vocabulary line (<id> <str or bytes literal> "
                             f"<length>): {line[:60]!r}")
        length = len(token.encode("utf-8") if isinstance(token, str) else token)
        field = line[line.rindex(" ") + 1:].strip()        # the rwkv package reads it with int()
        if not field.isdigit() or int(field) != length:
            raise ValueError(f"{path}, line {n}: the length field should be the token's byte length, {length}: "
                             f"{line[:60]!r}")
        token_id = int(line[:line.index(" ")])
        if token_id in seen:               # the rwkv package keeps the later line: the earlier token would vanish
            raise ValueError(f"{path}, line {n}: id {token_id} again (first on line {seen[token_id]})")
        seen[token_id] = n


def load_tokenizer(spec):
    """A tokenizer with encode(text) -> list of ids and decode(ids) -> text.

    Args:
        spec: "world" (the World vocabulary the `rwkv` package ships, for RWKV-7 / RWKV "World" models), a path to
            a tokenizer.json (read with `tokenizers`), or a path to a World-format vocabulary .txt.

    Returns:
        the tokenizer.

    Raises:
        TypeError for a spec that is not a str or path; FileNotFoundError for a missing file; ValueError naming the
        file (and line) for a file that is neither, a World vocab that is empty, not UTF-8 or has a wrong length
        field. The tokenizer's encode raises ValueError naming its file for text it has no token for (a custom World
        vocab without some byte, a WordLevel tokenizer.json without an unknown token).
    """
    if spec == "world":
        import rwkv                                         # optional: pyproject's `text` extra
        return _WorldTokenizer(os.path.join(os.path.dirname(rwkv.__file__), WORLD_VOCAB))
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(f"tokenizer must be 'world' or the path of a tokenizer.json or a World vocab .txt, got "
                        f"{type(spec).__name__}")
    path = os.fspath(spec)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"tokenizer {path!r}: no such file (pass 'world', a tokenizer.json or a World vocab)")
    with open(path, "rb") as f:
        start = f.read(3)
    if start == b"\xef\xbb\xbf":                          # tokenizers says only "expected value at line 1 column 1"
        raise ValueError(f"{path}: starts with a UTF-8 byte order mark (BOM), which `tokenizers` and the World "
                         f"format do not read: save it as UTF-8 without a BOM")
    if path.lower().endswith(".json") or start.lstrip()[:1] == b"{":   # .JSON, or JSON under another name
        try:
            return _HFTokenizer(path)
        except Exception as e:                              # tokenizers raises its own Exception type
            raise ValueError(f"{path}: not a tokenizer.json that `tokenizers` can read ({e})") from None
    _check_world_vocab(path)
    return _WorldTokenizer(path)


def find_tokenizer(local_dir):
    """The tokenizer a model directory ships: tokenizer.json, else a World vocabulary (rwkv_vocab_v20230424.txt,
    as RWKV-7 World directories carry it), else None.

    Args:
        local_dir: a model directory.

    Returns:
        a tokenizer of load_tokenizer, or None.
    """
    for name in ("tokenizer.json", WORLD_VOCAB):
        path = os.path.join(os.fspath(local_dir), name)
        if os.path.isfile(path):
            return load_tokenizer(path)
    return None


def _stable_end(text: str, stop: str | None) -> int:
    """How much of the decoded text can be shown: not a trailing U+FFFD (an incomplete UTF-8 character, which the
    next token may complete) nor a tail that may be the start of the stop string."""
    end = len(text.rstrip(_REPLACEMENT))
    if stop:
        for n in range(min(len(stop) - 1, end), 0, -1):
            if text[end - n:end] == stop[:n]:
                return end - n
    return end


class TextStream:
    """Generated text as it is produced; iterate it once.

    Each step decodes every new token so far and yields the part of the text that can no longer change (see
    _stable_end). Generation ends after max_new_tokens, or when the decoded text contains ``stop``: the text is cut
    before it (the state has read the tokens that produced it).

    Args:
        step: step(input_ids (1, t), state) -> (logits (1, V), state), e.g. a model's bound step.
        tokenizer: a tokenizer of load_tokenizer.
        prompt: the text to continue; it must encode to one token at least (the model predicts from the last one,
            also when it continues a saved state).
        max_new_tokens: how many tokens to generate at most.
        temperature, top_p, generator: sampling, as in models/generation.py (temperature 0: greedy).
        stop: a string that ends generation when it appears in the decoded text (RWKV's "\\n\\n"), or None.
        state: a state to start from (e.g. models.io.load_state of a saved one), None for the initial state.

    After iteration: .text (everything generated, cut at the stop string), .tokens (generated ids), .state (after
    the last token), .prompt_tokens, .prefill_seconds, .decode_seconds, .prefill_tokens_per_s,
    .decode_tokens_per_s.
    """

    def __init__(self, step, tokenizer, prompt: str, max_new_tokens: int = 256, temperature: float = 0.0,
                 top_p: float = 1.0, stop: str | None = None, state=None, generator: torch.Generator | None = None):
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
        if stop is not None and (not isinstance(stop, str) or not stop):
            raise ValueError(f"stop must be a non-empty string or None, got {stop!r}")
        ids = tokenizer.encode(prompt)
        if not ids:
            raise ValueError(f"prompt {prompt!r} encodes to no tokens: give at least one character")
        self._input_ids = check_prompt(torch.tensor([ids]), max_new_tokens)
        self._step, self._tokenizer, self._stop = step, tokenizer, stop
        self._sampling = (max_new_tokens, temperature, top_p, generator)
        self.state, self.text, self.tokens = state, "", []
        self.prompt_tokens = len(ids)
        self.prefill_seconds = self.decode_seconds = 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else float("nan")

    @property
    def decode_tokens_per_s(self) -> float:
        return len(self.tokens) / self.decode_seconds if self.decode_seconds else float("nan")

    def __iter__(self):
        max_new_tokens, temperature, top_p, generator = self._sampling
        start = time.perf_counter()
        with torch.no_grad():
            logits, self.state = self._step(self._input_ids, self.state)
        self.prefill_seconds = time.perf_counter() - start
        tokens = continue_tokens(self._step, logits, self.state, self._input_ids[:, -1], max_new_tokens,
                                 temperature, top_p, generator)
        shown = 0
        while True:
            start = time.perf_counter()
            nxt = next(tokens, None)
            self.decode_seconds += time.perf_counter() - start
            if nxt is None:
                break
            self.tokens.append(int(nxt[0][0]))
            self.state = nxt[1]
            decoded = self._tokenizer.decode(self.tokens)
            cut = decoded.find(self._stop, max(0, shown - len(self._stop))) if self._stop else -1
            if cut >= 0:
                self.text = decoded[:cut]
                break
            self.text = decoded
            end = _stable_end(decoded, self._stop)
            if end > shown:
                yield decoded[shown:end]
                shown = end
        if len(self.text) > shown:
            yield self.text[shown:]
