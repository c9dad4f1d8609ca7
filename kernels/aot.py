"""Ahead-of-time GPU build of every Triton kernel, without a GPU: ``python -m seqmix.kernels.aot``.

Triton compiles for a named target (``GPUTarget("cuda", 80 | 90, 32)``) on any machine: Python source -> Triton IR ->
PTX -> cubin (ptxas ships with triton). ``cuobjdump --dump-resource-usage`` on the cubin then reports what the
kernel would take on the GPU: registers per thread, local memory (LOCAL: register spills), stack and static shared
memory. This proves that each kernel builds for sm_80 (A100) and sm_90 (H100) at the configurations the dispatcher
picks, and that none spills.

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

__all__ = ["AotKernel", "collect", "compile_one", "main", "AOT_DTYPES", "FLASH_ARG_TYPES", "TARGETS"]

MODULES = tuple(f"seqmix.kernels.{op}" for op in ("attention", "rerope.fused", "wkv4", "wkv7", "ssm"))
TARGETS = (80, 90)
# The input dtypes of the flash kernels' builds (the recurrences' take fp32 and bf16), by their Triton names.
AOT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# Argument types of the flash kernels (attention, rerope), by name; every other argument is a pointer to the input
# dtype.
FLASH_ARG_TYPES = dict(lse_ptr="*fp32", delta_ptr="*fp32", rot_ptr="*fp32", T="i32", T_q="i32", T_k="i32",
                       window="i32", scale="fp32", inv_log_len="fp32")


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

    @property
    def signature(self) -> dict:
        """Every argument's Triton type, 'constexpr' for the constexprs."""
        return {a: "constexpr" if a in self.constexprs else self.types.get(a, self.default_type)
                for a in self.fn.arg_names}


def _cuobjdump() -> Path:
    import triton
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def compile_one(k: AotKernel, arch: int) -> dict:
    """Compile ``k`` for sm_<arch>; returns registers, spills (local memory bytes), stack and shared memory."""
    import triton
    from triton.backends.compiler import GPUTarget
    if type(k.fn).__name__ == "InterpretedFunction":
        raise RuntimeError("the kernels were defined under TRITON_INTERPRET=1; run `python -m seqmix.kernels.aot` "
                           "in a process without it")
    src = triton.compiler.ASTSource(fn=k.fn, signature=k.signature, constexprs=k.constexprs)
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": k.num_warps, "num_stages": k.num_stages})
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([str(_cuobjdump()), "--dump-resource-usage", str(cubin)],
                               capture_output=True, text=True, check=True).stdout
    fields = dict(re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", usage))
    return {"regs": int(fields["REG"]), "spill_bytes": int(fields["LOCAL"]), "stack": int(fields["STACK"]),
            "static_shared": int(fields["SHARED"]), "shared": int(compiled.metadata.shared)}


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
    parser.add_argument("--filter", default="", help="only kernels whose label contains this text")
    args = parser.parse_args(argv)
    failures = 0
    header = f"{'kernel':<44} {'arch':>5} {'regs':>5} {'spill B':>8} {'stack B':>8} {'shared B':>9}"
    print(header + "\n" + "-" * len(header), flush=True)
    for k in collect():
        if args.filter not in k.label:
            continue
        for arch in TARGETS:
            try:
                r = compile_one(k, arch)
            except Exception as e:  # a compile error is a result to report, then fail on
                failures += 1
                print(f"{k.label:<44} sm_{arch:<2} COMPILE ERROR: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                continue
            bad = r["spill_bytes"] > 0 or r["stack"] > 0
            failures += bad
            print(f"{k.label:<44} sm_{arch:<2} {r['regs']:>5} {r['spill_bytes']:>8} {r['stack']:>8} "
                  f"{r['shared']:>9}" + ("  SPILLS" if bad else ""), flush=True)
    print("\n" + (f"FAILED: {failures} kernel builds failed or spilled" if failures
                  else "all kernels built without spills"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
