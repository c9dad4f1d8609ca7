"""Ahead-of-time GPU build of every Triton kernel, without a GPU: ``python -m seqmix.kernels.aot``.

Triton compiles for a named target (``GPUTarget("cuda", 80 | 90, 32)``) on any machine: Python source -> Triton IR ->
PTX -> cubin (ptxas ships with triton). ``cuobjdump --dump-resource-usage`` on the cubin then reports what the
kernel would take on the GPU: registers per thread, local memory (LOCAL: register spills), stack and static shared
memory. This proves that each kernel builds for sm_80 (A100) and sm_90 (H100) at the configurations the dispatcher
picks, and that none spills.

The build is the one the JIT makes for the usual launch: torch allocates 16-byte-aligned tensors and the sizes are
multiples of 16, so the JIT marks every pointer and integer argument ``tt.divisibility = 16`` (vector loads, cp.async
pipelining, fewer registers); :func:`compile_one` does the same (``RUNTIME_HINTS``). The table also says which
matrix instruction the kernel's dots became (``mma``: wgmma on sm_90 at large enough tiles, mma.sync, or none: FMA
lowering), and how many offsets are computed in 32 bits from the size arguments and then widened (``i32 offs``, see
:func:`narrow_offsets`): such an offset wraps once a product of sizes passes 2^31, a failure for the kernels that
promise 64-bit offsets (``AotKernel.wide_offsets``: the recurrences, whose T C or D T reach 2^31 at long T).

Each kernel module offers ``aot_kernels()``: a list of :class:`AotKernel`, built from the same launch-configuration
function its dispatcher uses, for representative shapes (head size 64 and 128, channels 768 and 4096).
Exit status: 0 when everything compiled without spills, 1 otherwise.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .registry import REGISTRY

__all__ = ["AotKernel", "collect", "compile_one", "main", "mma_kind", "narrow_offsets", "loads_used_in_their_step",
           "fp32_dot_variants",
           "AOT_DTYPES", "FLASH_ARG_TYPES", "RUNTIME_HINTS", "TARGETS"]

# The modules that build the ops' Triton kernels, as the registry names them (once each: both ReRoPE ops share one).
MODULES = tuple(dict.fromkeys(module for op in REGISTRY for module in op.aot_modules))
TARGETS = (80, 90)
# The input dtypes of the flash kernels' builds (the recurrences' take fp32 and bf16), by their Triton names.
AOT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# Argument types of the flash kernels (attention, rerope), by name; every other argument is a pointer to the input
# dtype.
FLASH_ARG_TYPES = dict(lse_ptr="*fp32", delta_ptr="*fp32", rot_ptr="*fp32", T="i32", T_q="i32", T_k="i32",
                       rot_len="i32", keys_per_split="i32", window="i32", scale="fp32", inv_log_len="fp32")
# The JIT's specialization of 16-byte-aligned pointers and of integers that are multiples of 16 (triton's
# BaseBackend.parse_attr), given to every pointer and i32 argument.
RUNTIME_HINTS = [["tt.divisibility", 16]]


def fp32_dot_variants(kernel: str, dtype: str, tf32x3: bool = True) -> list[tuple[str, dict]]:
    """(label suffix, constexprs) of the builds of one flash kernel: as the dispatcher launches it by default, and
    for the fp32 forward (and decode) also with set_fp32_dot_precision("tf32x3") where the kernel takes it."""
    default = [("", {})]
    if tf32x3 and dtype == "fp32" and kernel in ("fwd", "decode"):
        return default + [(" tf32x3", {"DOT": "tf32x3"})]
    return default


@dataclass
class AotKernel:
    """One kernel at one configuration: the values of its constexprs, and the Triton types ('*fp32', 'i32', ...) of
    its other arguments: ``types[name]`` where given, ``default_type`` for the rest."""
    label: str          # what the row says, e.g. "wkv4_fwd C=768 fp32"
    fn: object          # the @triton.jit function
    constexprs: dict
    types: dict
    default_type: str
    num_warps: int = 4
    num_stages: int = 3
    fp_fusion: bool = True    # enable_fp_fusion, pinned as in Launch
    # Every offset formed in 64 bits (a 32-bit one, see narrow_offsets, fails the build). The flash kernels say
    # False: their offsets inside one head are 32-bit by design, which limits T d below 2^31 (README: shape limits).
    wide_offsets: bool = True
    # The targets it is built for: a configuration that only one architecture launches (the fp32 attention forward
    # with tf32x3 on sm_90's wgmma tiles) names it.
    targets: tuple = TARGETS

    @property
    def signature(self) -> dict:
        """Every argument's Triton type, 'constexpr' for the constexprs."""
        return {a: "constexpr" if a in self.constexprs else self.types.get(a, self.default_type)
                for a in self.fn.arg_names}


def _cuobjdump() -> Path:
    import triton
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def mma_kind(ptx: str) -> str:
    """The matrix instruction the kernel's dots compiled to: "wgmma" (Hopper's warpgroup MMA), "mma.sync" (Ampere's,
    also what sm_90 gets from tiles too small for wgmma) or "none" (FMA units)."""
    return "wgmma" if "wgmma.mma_async" in ptx else "mma.sync" if re.search(r"\bmma\.sync\b", ptx) else "none"


def loads_used_in_their_step(ttgir: str) -> list[str]:
    """The loads of the innermost loops (a recurrence's steps) whose values the same iteration uses: not software
    pipelined, so each step waits a memory round trip for them. A load pipelined by hand is a loop variable: its
    value goes to the loop's ``scf.yield`` and is used in the next iteration. (TTGIR indents a region's body by two
    spaces more than the line that opens it, and closes it at the opening line's indentation.)"""
    lines = ttgir.splitlines()
    indent = [len(line) - len(line.lstrip()) for line in lines]
    unpipelined = []
    for i, line in enumerate(lines):
        if " scf.for " not in line:
            continue
        end = next((j for j in range(i + 1, len(lines)) if indent[j] <= indent[i]), len(lines))
        body = lines[i + 1:end]
        if any(" scf.for " in b for b in body):
            continue                                 # not innermost: its loads start an inner loop's pipeline
        yielded = {name for b in body if b.lstrip().startswith("scf.yield") and len(b) - len(b.lstrip()) ==
                   indent[i] + 2 for name in re.findall(r"%[\w#]+", b.split(":")[0])}
        unpipelined += [m.group(1) for b in body if (m := re.match(r"\s*(%[\w#]+) = tt\.load\b", b))
                        and m.group(1) not in yielded]
    return unpipelined


_I32_ARITH = re.compile(r"^\s*(?:add|sub|mul|mad|shl)(?:\.lo)?\.[sub]32\s+(%r\d+),\s*(.*);")
_MOV32 = re.compile(r"^\s*mov\.[ub]32\s+(%r\d+),\s*(%r\d+);")
_WIDEN = re.compile(r"^\s*(?:cvt\.[su]64\.[su]32|mul\.wide\.[su]32)\s+%rd\d+,\s*(%r\d+)")


def narrow_offsets(ptx: str) -> list[str]:
    """The PTX lines that widen to 64 bits a value computed in 32-bit integer arithmetic from a size argument (an
    i32 kernel parameter): an offset such as ``t * C``, formed in 32 bits, wraps before it is widened once the
    product passes 2^31. LLVM often strength-reduces ``t * C`` in a loop into ``off += C``, so adds and shifts
    count as well as multiplies; divisions and comparisons end the chain (their results are no larger)."""
    lines = ptx.splitlines()
    params = {m for line in lines for m in re.findall(r"\.param \.u32 (\w+)", line)}
    sizes = {m.group(1) for line in lines
             if (m := re.match(r"^\s*ld\.param\.[bsu]32\s+(%r\d+),\s*\[(\w+)\]", line)) and m.group(2) in params}
    derived = set()                        # registers computed by 32-bit arithmetic from a size
    # a - (a / b) * b is a % b, below b whatever a is: LLVM computes i % H so even from int64 operands
    quotients = {m.group(1): (m.group(2), m.group(3)) for line in lines
                 if (m := re.match(r"^\s*div\.[su]32\s+(%r\d+),\s*(%r\d+),\s*(%r\d+);", line))}
    multiples = {m.group(1): quotients[q][0] for line in lines
                 if (m := re.match(r"^\s*mul\.lo\.[su]32\s+(%r\d+),\s*(%r\d+),\s*(%r\d+);", line))
                 for q, b in ((m.group(2), m.group(3)), (m.group(3), m.group(2))) if quotients.get(q, (0, 0))[1] == b}
    remainders = {m.group(1) for line in lines
                  if (m := re.match(r"^\s*sub\.[su]32\s+(%r\d+),\s*(%r\d+),\s*(%r\d+);", line))
                  and multiples.get(m.group(3)) == m.group(2)}
    changed = True
    while changed:                         # to a fixed point: a loop carries its values round (off += C)
        changed = False
        for line in lines:
            if m := _I32_ARITH.match(line):
                grows = bool(set(re.findall(r"%r\d+", m.group(2))) & (sizes | derived))
            elif m := _MOV32.match(line):
                grows = m.group(2) in derived
                if m.group(2) in sizes and m.group(1) not in sizes:
                    sizes.add(m.group(1))
                    changed = True
            if m and grows and m.group(1) not in derived | remainders:
                derived.add(m.group(1))
                changed = True
    return [line.strip() for line in lines if (m := _WIDEN.match(line)) and m.group(1) in derived]


def compile_one(k: AotKernel, arch: int) -> dict:
    """Compile ``k`` for sm_<arch> as the JIT does for aligned tensors and sizes that are multiples of 16; returns
    registers, spills (local memory bytes), stack, shared memory, the MMA instruction and the 32-bit offsets."""
    import triton
    from triton.backends.compiler import GPUTarget
    if type(k.fn).__name__ == "InterpretedFunction":
        raise RuntimeError("the kernels were defined under TRITON_INTERPRET=1; run `python -m seqmix.kernels.aot` "
                           "in a process without it")
    hinted = {(i,): RUNTIME_HINTS for i, (name, ty) in enumerate(k.signature.items())
              if ty.startswith("*") or ty == "i32"}
    src = triton.compiler.ASTSource(fn=k.fn, signature=k.signature, constexprs=k.constexprs, attrs=hinted)
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": k.num_warps, "num_stages": k.num_stages,
                                       "enable_fp_fusion": k.fp_fusion})
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([str(_cuobjdump()), "--dump-resource-usage", str(cubin)],
                               capture_output=True, text=True, check=True).stdout
    fields = dict(re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", usage))
    ptx = compiled.asm["ptx"]
    return {"regs": int(fields["REG"]), "spill_bytes": int(fields["LOCAL"]), "stack": int(fields["STACK"]),
            "static_shared": int(fields["SHARED"]), "shared": int(compiled.metadata.shared), "mma": mma_kind(ptx),
            "narrow_offsets": narrow_offsets(ptx), "ptx": ptx, "ttgir": compiled.asm["ttgir"]}


def collect() -> list[AotKernel]:
    """Every kernel module's AOT configurations."""
    return [k for name in MODULES for k in importlib.import_module(name).aot_kernels()]


def main(argv=None) -> int:
    """The command line: compile every kernel (or those matching --filter) for each target and print a table."""
    # Compilation for a GPU target needs the real JIT, not the interpreter; the kernels read this when they first
    # import triton (in collect, below). Done here, not at import, so that importing this module changes nothing.
    if "triton" not in sys.modules:
        os.environ.pop("TRITON_INTERPRET", None)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--filter", action="append", default=[],
                        help="only kernels whose label contains this text (repeated: any of the texts)")
    parser.add_argument("--asm", type=Path, help="write each build's TTGIR and PTX into this folder "
                                                 "(<label>_sm<arch>.ttgir / .ptx, spaces and = as _)")
    args = parser.parse_args(argv)
    failures = 0
    header = (f"{'kernel':<44} {'arch':>5} {'regs':>5} {'spill B':>8} {'stack B':>8} {'shared B':>9} {'mma':>8} "
              f"{'i32 offs':>8}")
    print(header + "\n" + "-" * len(header), flush=True)
    for k in collect():
        if args.filter and not any(text in k.label for text in args.filter):
            continue
        for arch in k.targets:
            try:
                r = compile_one(k, arch)
            except Exception as e:  # a compile error is a result to report, then fail on
                failures += 1
                print(f"{k.label:<44} sm_{arch:<2} COMPILE ERROR: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                continue
            if args.asm:
                args.asm.mkdir(parents=True, exist_ok=True)
                stem = re.sub(r"[ =]", "_", k.label) + f"_sm{arch}"
                for ext in ("ttgir", "ptx"):
                    (args.asm / f"{stem}.{ext}").write_text(r[ext])
            problems = [what for what, bad in (("SPILLS", r["spill_bytes"] > 0 or r["stack"] > 0),
                                               ("32-BIT OFFSETS", k.wide_offsets and r["narrow_offsets"])) if bad]
            failures += bool(problems)
            print(f"{k.label:<44} sm_{arch:<2} {r['regs']:>5} {r['spill_bytes']:>8} {r['stack']:>8} "
                  f"{r['shared']:>9} {r['mma']:>8} {len(r['narrow_offsets']):>8}"
                  + "".join("  " + p for p in problems), flush=True)
    print("\n" + (f"FAILED: {failures} kernel builds failed, spilled or formed offsets in 32 bits" if failures
                  else "all kernels built without spills, every offset in 64 bits"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
