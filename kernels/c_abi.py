"""The C libraries' ABI, each entry point written once: its prototype (return type, argument names and types, as C
writes it), from which ctypes' argtypes and restype are built and by which a call passes its arguments by name.
Every entry point returns a status (native.h's enum status, which kernels/native.py's STATUS mirrors) or a size.

A library declares its entry points with ``table(text)``, the text being the prototypes as its header has them
(kernels/native.py's ENTRIES, models/decode.py's ENTRIES). tests/kernels/test_kernels_native.py parses the headers with
``prototypes`` and checks that they declare what the tables say, and the C compiler checks each definition against
its header, so the Python side, the headers and the definitions cannot drift apart.
"""
from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass

__all__ = ["Param", "Entry", "prototypes", "table", "bind"]

# C type -> ctypes type; every pointer is a c_void_p (a tensor's data_ptr(), a ctypes array, or None for NULL)
CTYPES = {"int": ctypes.c_int, "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64, "float": ctypes.c_float,
          "double": ctypes.c_double, "void": None}

@dataclass(frozen=True)
class Param:
    """One argument of an entry point: its name and its C type, spelled as ``prototypes`` normalizes it
    ("const float *", "int64_t")."""
    name: str
    type: str

    @property
    def ctype(self):
        return ctypes.c_void_p if self.type.endswith("*") else CTYPES[self.type]


@dataclass(frozen=True)
class Entry:
    """An entry point: ``restype name(params)``."""
    name: str
    restype: str
    params: tuple[Param, ...]

    @property
    def argtypes(self) -> list:
        return [p.ctype for p in self.params]

    def arguments(self, named: dict, skip: int = 0) -> list:
        """The values of ``named`` (argument name -> value) in the entry point's order, from its ``skip``-th
        argument on; a tensor becomes its data pointer (pointer arguments only), None stays None (NULL). Raises
        TypeError naming what is missing or unknown."""
        names = [p.name for p in self.params[skip:]]
        if set(named) != set(names):
            missing, unknown = [n for n in names if n not in named], sorted(set(named) - set(names))
            raise TypeError(f"{self.name}: missing arguments {missing}, unknown arguments {unknown}")
        out = []
        for p in self.params[skip:]:
            value = named[p.name]
            if p.type.endswith("*") and hasattr(value, "data_ptr"):
                value = value.data_ptr()
            out.append(value)
        return out

    def __str__(self) -> str:
        params = ", ".join(f"{p.type}{'' if p.type.endswith('*') else ' '}{p.name}" for p in self.params)
        return f"{self.restype} {self.name}({params or 'void'})"


def _normalize(ctype: str) -> str:
    """A C type spelled one way: single spaces, and "*" after a space ("const float *", "float **")."""
    ctype = re.sub(r"\s*\*\s*", " *", ctype.strip())
    return re.sub(r"\s+", " ", ctype).replace("* *", "**").strip()


def _param(text: str) -> Param:
    match = re.fullmatch(r"(.*?[\s*])(\w+)", text.strip(), re.S)
    if not match:
        raise ValueError(f"cannot read the C parameter {text.strip()!r}: a type then a name")
    return Param(match.group(2), _normalize(match.group(1)))


def _top_level(text: str) -> str:
    """``text`` without comments, preprocessor lines and the bodies of braces (each body ends a statement)."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    out, depth = [], 0
    for char in text:
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                out.append(";")
        elif depth == 0:
            out.append(char)
    return "".join(out)


def prototypes(text: str) -> dict[str, Entry]:
    """The function prototypes ``text`` (a C header) declares, by name: every top-level declaration
    ``type name(params);`` that is not static (inline helpers and their bodies are left out)."""
    found = {}
    for statement in _top_level(text).split(";"):
        statement = " ".join(statement.split())
        match = re.fullmatch(r"([\w\s*]*?[\s*])(\w+)\s*\((.*)\)", statement)
        if not match or re.match(r"(static|typedef|enum|struct)\b", statement):
            continue
        restype, name, params = match.groups()
        params = params.strip()
        found[name] = Entry(name, _normalize(restype),
                            () if params in ("", "void") else tuple(_param(p) for p in params.split(",")))
    return found


def table(text: str) -> dict[str, Entry]:
    """A library's signature table from its prototypes, written as its header writes them (``;`` after each)."""
    entries = prototypes(text)
    if not entries:
        raise ValueError("no prototypes in the signature table")
    return entries


def bind(lib: ctypes.CDLL, entries: dict[str, Entry]) -> ctypes.CDLL:
    """Set each entry point's argtypes and restype on ``lib`` from its table; returns lib."""
    for entry in entries.values():
        fn = getattr(lib, entry.name)
        fn.argtypes, fn.restype = entry.argtypes, CTYPES[entry.restype]
    return lib
