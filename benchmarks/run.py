"""Every op beside what a user would otherwise run, and beside one streaming pass: ``python -m seqmix.benchmarks.run``.

    python -m seqmix.benchmarks.run              full shapes, T = 1k .. 16k (about 10 minutes on 2 CPU cores)
    python -m seqmix.benchmarks.run --quick      tiny shapes, a few seconds (the smoke test runs this)
    python -m seqmix.benchmarks.run --ops wkv4,rerope --out /tmp/bench

Writes to ``--out`` (default benchmarks/results, or benchmarks/results/quick with --quick): results.md (the
headline table, the targets, time and memory against T, the GPU cost model), scaling.png (log-log time and memory
against T) and results.json (every sample).

Method. On a CPU each (op, implementation, T) runs in processes of its own (forked from a server process that
imported everything), so that one case's memory cannot hide in another's. Peak memory comes from one process: the
op runs once to warm up, then once more, and the peak is that run's resident high-water mark (VmHWM, reset through
/proc/self/clear_refs just before it) above what was resident before; glibc is told there to map every block of
64 KiB or more on its own, so freed tensors leave the resident set at once. Times come from a second process with
glibc's defaults: one warm-up, then n runs (at least 3, more while they fit in a few seconds); the table gives the
median and the spread (max - min) / median. With CUDA, every case runs in this process and memory is torch.cuda's
peak allocation above the inputs. Everything runs under torch.no_grad(). See README.md.
"""
from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from . import cost_model, peers
from ..kernels.ssm import spec as ssm_spec
from ..kernels.testing import default_backend
from ..kernels.wkv4 import spec as wkv4_spec
from ..kernels.wkv7 import spec as wkv7_spec
from ..models.mamba import MambaConfig, MambaForCausalLM

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
RESULTS = Path(__file__).parent / "results"
FULL_T = (1024, 2048, 4096, 8192, 16384)
QUICK_T = (64, 128)


@dataclass
class Impl:
    label: str
    kind: str                      # "seqmix", "peer" or "floor"
    fn: Callable | None            # inputs (dict) -> output; None when it cannot run here (see ``skip``)
    skip: str = ""                 # why it does not run at all
    max_T: int | None = None       # larger T are skipped (quadratic memory), with ``max_T_reason``
    max_T_reason: str = ""


@dataclass
class Target:
    """A goal from the production issues: other / seqmix (time or peak memory) must be >= ``at_least``."""
    impl: str
    metric: str                    # "time" or "memory"
    at_least: float
    text: str


@dataclass
class Op:
    name: str
    title: str
    shape: str                     # the fixed dimensions, e.g. "B=4, C=768"
    make: Callable[[int], dict]    # T -> the inputs, keyed like the seqmix function's arguments
    impls: list[Impl]
    headline_T: int
    linear: bool                   # linear in T (a per-token cost that should not grow)
    targets: list[Target] = field(default_factory=list)
    sweep: bool = True             # measured at every T of the run (else at headline_T alone)

    @property
    def ours(self) -> str:
        """The seqmix row the targets are read against: the first, what backend=None runs here (see _seqmix_impls)."""
        return next(i.label for i in self.impls if i.kind == "seqmix")


def _kernel(module: str, function: str):
    """The seqmix op, or the reason it cannot be had (its file is being written in parallel with this one)."""
    try:
        return getattr(importlib.import_module(f"seqmix.kernels.{module}"), function), ""
    except ModuleNotFoundError as e:
        if e.name != f"kernels.{module}":
            raise
        return None, f"kernels/{module}.py does not exist yet"
    except Exception as e:  # a module mid-edit: report it as a row, measure the rest
        return None, f"kernels/{module}.py fails to import: {type(e).__name__}: {e}"


def _backends(function: str) -> tuple:
    """The backend that backend=None picks here (kernels/backends.py's dispatcher), then the torch backend beside it
    when that is another one."""
    default = default_backend(function, DEVICE)
    return (default, "torch") if default != "torch" else ("torch",)


def _seqmix_impls(module: str, function: str, call: Callable) -> list[Impl]:
    """``call(fn, inputs, backend)`` runs the op, on each of _backends(function)."""
    fn, why = _kernel(module, function)
    return [Impl(f"seqmix {b}", "seqmix", fn and (lambda x, b=b: call(fn, x, b)), why) for b in _backends(function)]


def _hf_impl(label: str, fn: Callable) -> Impl:
    if peers.HAS_TRANSFORMERS:
        return Impl(label, "peer", fn)
    return Impl(label, "peer", None, "transformers is not installed")


def _randn(gen, *shape):
    return torch.randn(*shape, generator=gen, device=DEVICE)


def _generator():
    return torch.Generator(DEVICE).manual_seed(0)


def wkv4_inputs(B: int, C: int) -> Callable[[int], dict]:
    """T -> RWKV-4 WKV inputs of B rows and C channels (the op's benchmark inputs, kernels/wkv4/spec.py)."""
    return lambda T: wkv4_spec.timed_inputs(_generator(), DEVICE, B=B, T=T, C=C)


def wkv7_inputs(B: int, H: int, N: int) -> Callable[[int], dict]:
    """T -> RWKV-7 WKV inputs, as RWKV-7 makes them (the op's benchmark inputs, kernels/wkv7/spec.py)."""
    return lambda T: wkv7_spec.timed_inputs(_generator(), DEVICE, B=B, T=T, H=H, N=N)


def ssm_inputs(B: int, D: int, N: int) -> Callable[[int], dict]:
    """T -> selective-scan inputs with Mamba's initialization of A and delta's bias (kernels/ssm/spec.py)."""
    return lambda T: ssm_spec.timed_inputs(_generator(), DEVICE, B=B, T=T, D=D, N=N)


WKV4_CALL = lambda f, x, b: f(x["w"], x["u"], x["k"], x["v"], backend=b)   # noqa: E731
WKV7_CALL = lambda f, x, b: f(**x, backend=b)                               # noqa: E731
SSM_CALL = lambda f, x, b: f(**x, delta_softplus=True, backend=b)           # noqa: E731


def make_ops(quick: bool) -> list[Op]:
    """The ops at the targets' shapes (issue 3 and 4), or at tiny shapes with ``quick``."""
    T_attention = QUICK_T[-1] if quick else 8192     # the headline T of the targets
    T_recurrent = QUICK_T[-1] if quick else 2048

    B4, C4 = (1, 16) if quick else (4, 768)
    make_wkv4 = wkv4_inputs(B4, C4)
    B7, H7, N7 = (1, 2, 8) if quick else (1, 12, 64)
    make_wkv7 = wkv7_inputs(B7, H7, N7)
    Bs, Ds, Ns = (1, 16, 4) if quick else (1, 1536, 16)
    make_ssm = ssm_inputs(Bs, Ds, Ns)

    Ba, Ha, da, window = (1, 2, 16, 16) if quick else (1, 4, 64, 512)

    def make_qkv(T):
        g = _generator()
        return dict(q=_randn(g, Ba, Ha, T, da), k=_randn(g, Ba, Ha, T, da), v=_randn(g, Ba, Ha, T, da))

    return [
        Op("wkv4", "RWKV-4 WKV", f"B={B4}, C={C4}", make_wkv4, [
            *_seqmix_impls("wkv4", "wkv4", WKV4_CALL),
            _hf_impl("transformers rwkv_linear_attention_cpu", lambda x: peers.hf_wkv4(**x)),
            Impl("one streaming pass", "floor", lambda x: peers.streaming_pass(x["k"], x["v"], x["w"], x["u"])),
        ], T_recurrent, True, [
            Target("transformers rwkv_linear_attention_cpu", "time", 20, ">= 20x faster"),
            Target("one streaming pass", "time", 0.1, "within 10x"),
        ]),
        Op("wkv7", "RWKV-7 WKV", f"B={B7}, H={H7}, N={N7}", make_wkv7, [
            *_seqmix_impls("wkv7", "wkv7", WKV7_CALL),
            Impl("per-token loop (torch)", "peer", lambda x: peers.wkv7_per_token(**x)),
            Impl("one streaming pass", "floor", lambda x: peers.streaming_pass(*x.values())),
        ], T_recurrent, True, [
            Target("per-token loop (torch)", "time", 10, ">= 10x faster"),
        ]),
        Op("ssm", "Mamba selective scan", f"B={Bs}, D={Ds}, N={Ns}", make_ssm, [
            *_seqmix_impls("ssm", "selective_scan", SSM_CALL),
            _hf_impl("transformers mamba_selective_scan", lambda x: peers.hf_selective_scan(**x)),
            Impl("one streaming pass", "floor", lambda x: peers.streaming_pass(*x.values())),
        ], T_recurrent, True, [
            Target("transformers mamba_selective_scan", "time", 20, ">= 20x faster"),
        ]),
        Op("rerope", "ReRoPE prefill", f"B={Ba}, H={Ha}, d={da}, w={window}", make_qkv, [
            *_seqmix_impls("rerope", "rerope_attention", lambda f, x, b: f(**x, window=window, backend=b)),
            Impl("SDPA + RoPE", "peer", lambda x: peers.sdpa_rope(**x)),
            Impl("two-pass (source)", "peer", lambda x: peers.rerope_two_pass(**x, window=window),
                 max_T=T_attention,
                 max_T_reason="two (H, T, T) fp32 score matrices and their merge: ~17 GB at T=16384"),
            Impl("one streaming pass", "floor", lambda x: peers.streaming_pass(*x.values())),
        ], T_attention, False, [
            Target("SDPA + RoPE", "time", 0.5, "at most 2x the time"),
            Target("SDPA + RoPE", "memory", 0.5, "at most 2x the memory"),
            Target("two-pass (source)", "time", 10, ">= 10x faster"),
            Target("two-pass (source)", "memory", 10, ">= 10x less memory"),
        ]),
        Op("attention", "causal softmax attention", f"B={Ba}, H={Ha}, d={da}", make_qkv, [
            *_seqmix_impls("attention", "attention", lambda f, x, b: f(**x, causal=True, backend=b)),
            Impl("SDPA", "peer", lambda x: F.scaled_dot_product_attention(x["q"], x["k"], x["v"], is_causal=True)),
            Impl("one streaming pass", "floor", lambda x: peers.streaming_pass(*x.values())),
        ], T_attention, False),
    ]


def all_ops(quick: bool) -> list[Op]:
    """The forward ops, then the training ops."""
    return make_ops(quick) + make_training_ops(quick)


def _forward_backward(call: Callable[[dict], object]) -> Callable[[dict], None]:
    """inputs -> None: call(inputs) with every input a leaf that wants its gradient, then the backward of its output
    (the first, for ops that return a state too) for a cotangent of ones."""
    def run(inputs):
        with torch.enable_grad():
            y = call({k: x.detach().requires_grad_() for k, x in inputs.items()})
            y = y[0] if isinstance(y, tuple) else y
            y.backward(torch.ones_like(y))
    return run


def _training(impls: list[Impl]) -> list[Impl]:
    """The same rows, each timing forward + backward (see _forward_backward)."""
    return [replace(impl, fn=impl.fn and _forward_backward(impl.fn)) for impl in impls]


@lru_cache(maxsize=None)
def _mamba(backend: str, hidden: int, state_size: int, layers: int, vocab: int):
    """A Mamba language model and its AdamW optimizer, built once per process (each case has a process of its own)."""
    torch.manual_seed(0)
    config = MambaConfig(vocab_size=vocab, hidden_size=hidden, state_size=state_size, num_hidden_layers=layers)
    model = MambaForCausalLM(config).to(DEVICE)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _mamba_step(ids: torch.Tensor, backend: str, shape: tuple) -> None:
    """One training step of _mamba(backend, *shape): the next-token loss on ids, its backward, AdamW's update."""
    model, optimizer = _mamba(backend, *shape)
    with torch.enable_grad():
        loss = model(ids, labels=ids, backend=backend).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def make_training_ops(quick: bool) -> list[Op]:
    """Forward + backward of the recurrences (issue 18) on the C loops, the torch backend and autograd through the
    peers' per-token loops: at the training shapes (batch 32, 128 tokens, the layers of a width-128 model: RWKV-4
    C = 128, RWKV-7 4 heads of 32, Mamba D = 256, N = 16) and at the forward benchmark's shapes (T = 2048); and a
    whole Mamba training step (2 layers, width 128, D = 256, N = 16, AdamW). Tiny shapes with ``quick``."""
    T_train, T_long = (32, 64) if quick else (128, 2048)
    B = 2 if quick else 32
    wkv4_shapes = [(B, 8), (1, 16)] if quick else [(B, 128), (4, 768)]
    wkv7_shapes = [(B, 2, 8), (1, 2, 8)] if quick else [(B, 4, 32), (1, 12, 64)]
    ssm_shapes = [(B, 16, 4), (1, 16, 4)] if quick else [(B, 256, 16), (1, 1536, 16)]
    ops = []
    for T, suffix, s4, s7, ss in zip((T_train, T_long), ("", "_long"), wkv4_shapes, wkv7_shapes, ssm_shapes):
        ops += [
            Op(f"wkv4_train{suffix}", "RWKV-4 WKV, forward + backward", "B={}, C={}".format(*s4), wkv4_inputs(*s4),
               _training([*_seqmix_impls("wkv4", "wkv4", WKV4_CALL),
                          _hf_impl("transformers rwkv_linear_attention_cpu", lambda x: peers.hf_wkv4(**x))]),
               T, False, [Target("seqmix torch", "time", 2, ">= 2x faster")], sweep=False),
            Op(f"wkv7_train{suffix}", "RWKV-7 WKV, forward + backward", "B={}, H={}, N={}".format(*s7),
               wkv7_inputs(*s7),
               _training([*_seqmix_impls("wkv7", "wkv7", WKV7_CALL),
                          Impl("per-token loop (torch)", "peer", lambda x: peers.wkv7_per_token(**x))]),
               T, False, [Target("seqmix torch", "time", 4, ">= 4x faster")], sweep=False),
            Op(f"ssm_train{suffix}", "Mamba selective scan, forward + backward", "B={}, D={}, N={}".format(*ss),
               ssm_inputs(*ss),
               _training([*_seqmix_impls("ssm", "selective_scan", SSM_CALL),
                          _hf_impl("transformers mamba_selective_scan", lambda x: peers.hf_selective_scan(**x))]),
               T, False, [Target("seqmix torch", "time", 4, ">= 4x faster")], sweep=False),
        ]
    shape = (16, 4, 2, 256) if quick else (128, 16, 2, 256)      # width, N, layers, vocabulary; D = 2 x width
    ops.append(Op(
        "mamba_step", "Mamba training step (2 layers, AdamW)",
        f"B={B}, width={shape[0]}, D={2 * shape[0]}, N={shape[1]}, vocabulary {shape[3]}",
        lambda T: {"ids": torch.randint(0, shape[3], (B, T), generator=_generator(), device=DEVICE)},
        [Impl(f"seqmix {b}", "seqmix", lambda x, b=b: _mamba_step(x["ids"], b, shape))
         for b in _backends("selective_scan")],
        T_train, False, [Target("seqmix torch", "time", 3, ">= 3x faster")], sweep=False))
    return ops


# ----------------------------------------------------------------------------------------------------------------
# Measuring one case
# ----------------------------------------------------------------------------------------------------------------

def _sync():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def _proc_status(key: str) -> int:
    """A /proc/self/status figure (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _memory_in_use() -> int:
    return torch.cuda.memory_allocated() if DEVICE.type == "cuda" else _proc_status("VmRSS")


def _reset_peak():
    if DEVICE.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    else:
        with open("/proc/self/clear_refs", "w") as f:    # "5": the resident high-water mark restarts from now
            f.write("5")


def _peak_memory() -> int:
    return torch.cuda.max_memory_allocated() if DEVICE.type == "cuda" else _proc_status("VmHWM")


def _timed(fn, inputs) -> float:
    _sync()
    start = time.perf_counter()
    fn(inputs)
    _sync()
    return time.perf_counter() - start


def measure(fn, inputs, min_runs: int, max_runs: int, budget_s: float) -> dict:
    """Warm up once, then time ``min_runs`` to ``max_runs`` runs (as many as fit in ``budget_s``); a case whose
    warm-up alone took longer than ``budget_s`` (autograd through a peer's per-token loop at T = 2048: a minute a
    run) gets one timed run. The peak memory above the inputs is that of the first timed run."""
    with torch.no_grad():
        warm_up = _timed(fn, inputs)
        before = _memory_in_use()
        _reset_peak()
        times = [_timed(fn, inputs)]
        peak = _peak_memory() - before
        runs = 1 if 0 < budget_s < warm_up else max(min_runs, min(max_runs, int(budget_s / times[0])))
        times += [_timed(fn, inputs) for _ in range(runs - 1)]
    return {"times": times, "peak_bytes": peak}


def measure_interleaved(fns: dict, inputs, min_rounds: int, max_rounds: int, budget_s: float) -> dict:
    """Each of ``fns`` (label -> fn) warmed up once, then timed in rounds, one run of each per round, so that a
    machine whose load changes slows them alike: ``min_rounds`` to ``max_rounds`` rounds (as many as fit in
    ``budget_s``). Returns label -> times."""
    times = {label: [] for label in fns}
    with torch.no_grad():
        for fn in fns.values():
            fn(inputs)
        while True:
            for label, fn in fns.items():
                times[label].append(_timed(fn, inputs))
            rounds = len(times[label])
            if rounds >= max_rounds or rounds >= max(min_rounds, budget_s / sum(t[0] for t in times.values())):
                return times


def _runs(quick: bool, interleaved: bool = False) -> tuple:
    """(min runs, max runs, seconds): how many timed runs a case gets (interleaved: how many rounds)."""
    return (2, 2, 0.0) if quick else (5, 15, 6.0) if interleaved else (3, 15, 3.0)


def _case(op: Op, impl: Impl, T: int, quick: bool, threads: int | None, runs=None) -> dict:
    if threads:
        torch.set_num_threads(threads)
    inputs = op.make(T)
    return measure(impl.fn, inputs, *(runs or _runs(quick)))


def map_large_blocks() -> None:
    """glibc: every block >= 64 KiB gets its own mapping, unmapped on free, so the resident set follows the live
    tensors (by default freed blocks may stay resident and hide later allocations from the peak). That makes every
    large allocation a system call and its pages fresh faults, so the timed runs go in another process with glibc's
    defaults: otherwise the setting slows down implementations with large temporaries."""
    ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 16)       # -3 = M_MMAP_THRESHOLD


def _job(job: dict) -> dict:
    """One case, in a process of its own: its result, or its error. job["measure"] is "memory" (one run, for the
    peak), "time" (the timed runs) or "interleaved" (the timed runs of the implementations job["impls"], in rounds:
    see measure_interleaved)."""
    if job["measure"] == "memory":
        map_large_blocks()
    op = next(op for op in all_ops(job["quick"]) if op.name == job["op"])
    try:
        if job["measure"] == "interleaved":
            if job["threads"]:
                torch.set_num_threads(job["threads"])
            fns = {impl.label: impl.fn for impl in op.impls if impl.label in job["impls"]}
            return {"times": measure_interleaved(fns, op.make(job["T"]), *_runs(job["quick"], interleaved=True))}
        impl = next(impl for impl in op.impls if impl.label == job["impl"])
        return _case(op, impl, job["T"], job["quick"], job["threads"],
                     runs=(1, 1, 0.0) if job["measure"] == "memory" else None)
    except Exception as e:  # any failure is a result to report in the table
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}


def serve() -> None:
    """The case server (``--serve``): it has imported torch, transformers and the kernels once and never runs a
    torch op itself, so it can fork a fresh child per case (a fork of a process whose OpenMP threads have run can
    hang; a new interpreter per case would re-import transformers, seconds each). One JSON job per line on stdin,
    one JSON result per line on stdout."""
    results = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)                                  # anything else printed, here or in a child, goes to stderr
    make_ops(False)                                # imports the kernel modules once, for every child
    for line in sys.stdin:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            with os.fdopen(write_end, "w") as f:
                json.dump(_job(json.loads(line)), f)
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end) as f:
            text = f.read()
        _, status = os.waitpid(pid, 0)
        if not text:
            why = (f"killed by {signal.Signals(os.WTERMSIG(status)).name}" if os.WIFSIGNALED(status)
                   else f"exit status {os.waitstatus_to_exitcode(status)}")
            text = json.dumps({"error": f"the worker died ({why}; out of memory?)"})
        results.write(text + "\n")
        results.flush()


_server = None


def _ask_server(job: dict) -> dict:
    """One job for the case server (started on first use), its result."""
    global _server
    if _server is None:
        _server = subprocess.Popen([sys.executable, "-m", "seqmix.benchmarks.run", "--serve"], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
    _server.stdin.write(json.dumps(job) + "\n")
    _server.stdin.flush()
    return json.loads(_server.stdout.readline())


def _isolated(op: Op, impl: Impl, T: int, quick: bool, threads: int | None, times=None) -> dict:
    """The peak memory from one process, the times from another (see _job), unless ``times`` were measured."""
    result = {} if times is None else {"times": times}
    for what, key in (("memory", "peak_bytes"), ("time", "times"))[:1 if times else 2]:
        part = _ask_server({"op": op.name, "impl": impl.label, "T": T, "quick": quick, "threads": threads,
                            "measure": what})
        if "error" in part:
            return part
        result[key] = part[key]
    return result


def interleaved_times(op: Op, T: int, quick: bool, threads: int | None) -> dict:
    """The times of op's seqmix rows on a CPU, measured in rounds in one process (label -> times; {} with fewer than
    two rows or on a GPU): a training op's targets compare these rows, and a shared machine's load moves
    separately measured rows apart (see README.md)."""
    labels = [impl.label for impl in op.impls if impl.kind == "seqmix" and impl.fn is not None]
    if DEVICE.type != "cpu" or len(labels) < 2:
        return {}
    result = _ask_server({"op": op.name, "impls": labels, "T": T, "quick": quick, "threads": threads,
                          "measure": "interleaved"})
    return result.get("times", {})


def _in_process(op: Op, impl: Impl, T: int, quick: bool, threads: int | None) -> dict:
    try:
        return _case(op, impl, T, quick, threads)
    except torch.cuda.OutOfMemoryError as e:
        return {"error": f"OutOfMemoryError: {str(e).splitlines()[0]}"}


def run_case(op: Op, impl: Impl, T: int, quick: bool, threads: int | None = None, times=None) -> dict:
    """One row: impl of op at T. ``times``: its times if they were measured already (interleaved_times)."""
    row = {"op": op.name, "impl": impl.label, "kind": impl.kind, "T": T, "shape": op.shape}
    if impl.fn is None:
        return {**row, "status": f"skipped: {impl.skip}"}
    if impl.max_T is not None and T > impl.max_T:
        return {**row, "status": f"skipped: {impl.max_T_reason}"}
    result = (_isolated(op, impl, T, quick, threads, times) if DEVICE.type == "cpu"
              else _in_process(op, impl, T, quick, threads))
    if "error" in result:
        return {**row, "status": "error: " + result["error"]}
    times = sorted(result["times"])
    median = statistics.median(times)
    return {**row, "status": "ok", "median_s": median, "spread": (times[-1] - times[0]) / median,
            "runs": len(times), "peak_bytes": result["peak_bytes"], "times": result["times"]}


# ----------------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------------

def _fmt_time(s: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s * 1e9:.3g} ns"


def _fmt_bytes(b: float) -> str:
    return f"{b / 2**20:.1f} MiB"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}x"


def _row(rows, op, impl, T):
    return next((r for r in rows if r["op"] == op and r["impl"] == impl and r["T"] == T), None)


def _ok(r):
    return r is not None and r["status"] == "ok"


def _other_over_seqmix(ours, other, metric):
    key = "median_s" if metric == "time" else "peak_bytes"
    if not (_ok(ours) and _ok(other)) or ours[key] <= 0:
        return None
    return other[key] / ours[key]


def headline(ops: list[Op], rows: list[dict]) -> tuple[str, list[dict]]:
    """The table of each op at its headline T: its seqmix rows (``op.ours`` first), then every other implementation,
    with ratios to ``op.ours``."""
    lines = ["| op, shape | implementation | median time | spread | peak memory | time: it / seqmix | "
             "memory: it / seqmix | target for seqmix | met |", "|" + "---|" * 9]
    checks = []
    for op in ops:
        T = op.headline_T
        ours = _row(rows, op.name, op.ours, T)
        for i, impl in enumerate(op.impls):
            r = _row(rows, op.name, impl.label, T)
            where = f"{op.title}, {op.shape}, T={T}" if i == 0 else ""
            name = f"**{impl.label}**" if impl.kind == "seqmix" else impl.label
            if not _ok(r):
                lines.append(f"| {where} | {name} | {r['status'] if r else 'not measured'} | | | | | | |")
                continue
            t_ratio, m_ratio = (_other_over_seqmix(ours, r, m) for m in ("time", "memory"))
            goals, met = [], []
            for tg in (tg for tg in op.targets if tg.impl == impl.label):
                ratio = t_ratio if tg.metric == "time" else m_ratio
                ok = None if ratio is None else ratio >= tg.at_least
                checks.append({"op": op.name, "T": T, "vs": impl.label, "metric": tg.metric, "target": tg.text,
                               "ratio": ratio, "met": ok})
                goals.append(f"{tg.text} ({tg.metric})")
                met.append({True: "yes", False: "**NO**", None: "not measured"}[ok])
            show = impl.label != op.ours
            lines.append(f"| {where} | {name} | {_fmt_time(r['median_s'])} (n={r['runs']}) | {r['spread']:.0%} | "
                         f"{_fmt_bytes(r['peak_bytes'])} | {_ratio(t_ratio) if show else ''} | "
                         f"{_ratio(m_ratio) if show else ''} | {'; '.join(goals)} | {'; '.join(met)} |")
    return "\n".join(lines), checks


def per_token_growth(ops: list[Op], rows: list[dict], Ts) -> tuple[str, list[dict]]:
    """Time per token at the largest T up to 8192 over that at the smallest: a linear op keeps it <= 1.5."""
    lo, hi = Ts[0], max(t for t in Ts if t <= 8192)
    lines = [f"| op, shape | per token at T={lo} | per token at T={hi} | ratio | target | met |", "|" + "---|" * 6]
    checks = []
    for op in (op for op in ops if op.linear):
        a, b = _row(rows, op.name, op.ours, lo), _row(rows, op.name, op.ours, hi)
        if not (_ok(a) and _ok(b)):
            lines.append(f"| {op.title}, {op.shape} | not measured | | | <= 1.5 | |")
            continue
        per_a, per_b = a["median_s"] / lo, b["median_s"] / hi
        ok = per_b / per_a <= 1.5
        checks.append({"op": op.name, "T": hi, "vs": f"{op.ours} at T={lo}", "metric": "time per token",
                       "target": "<= 1.5x", "ratio": per_b / per_a, "met": ok})
        lines.append(f"| {op.title}, {op.shape} | {_fmt_time(per_a)} | {_fmt_time(per_b)} | {per_b / per_a:.3g}x | "
                     f"<= 1.5x | {'yes' if ok else '**NO**'} |")
    return "\n".join(lines), checks


def scaling_tables(ops: list[Op], rows: list[dict], Ts) -> str:
    parts = []
    for op in ops:
        head = "| T | " + " | ".join(i.label for i in op.impls) + " |"
        lines = [f"**{op.title}, {op.shape}**: median time (spread), peak memory above the inputs", "",
                 head, "|" + "---|" * (len(op.impls) + 1)]
        for T in Ts:
            cells = []
            for impl in op.impls:
                r = _row(rows, op.name, impl.label, T)
                cells.append(f"{_fmt_time(r['median_s'])} ({r['spread']:.0%}), {_fmt_bytes(r['peak_bytes'])}"
                             if _ok(r) else r["status"].split(":")[0])
            lines.append(f"| {T} | " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def plot(ops: list[Op], rows: list[dict], path: Path, where: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(ops), figsize=(4.2 * len(ops), 7.5), squeeze=False)
    for col, op in enumerate(ops):
        for impl in op.impls:
            pts = [r for r in rows if r["op"] == op.name and r["impl"] == impl.label and _ok(r)]
            if not pts:
                continue
            style = dict(marker="o", label=impl.label, linestyle="--" if impl.kind == "floor" else "-",
                         linewidth=2.5 if impl.kind == "seqmix" else 1.2)
            Ts = [r["T"] for r in pts]
            axes[0, col].plot(Ts, [r["median_s"] for r in pts], **style)
            mem = [(r["T"], r["peak_bytes"] / 2**20) for r in pts if r["peak_bytes"] > 0]   # log axis: > 0 only
            if mem:
                axes[1, col].plot(*zip(*mem), **style)
        if not axes[1, col].get_lines():
            axes[1, col].text(0.5, 0.5, "no peak above the inputs\nwithin the probe's ~1 MiB", ha="center",
                              transform=axes[1, col].transAxes)
        for row, ylabel in ((0, "median time (s)"), (1, "peak memory above inputs (MiB)")):
            ax = axes[row, col]
            _guides(ax)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length T (tokens)")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
        axes[0, col].set_title(f"{op.title}\n{op.shape}", fontsize=10)
        axes[0, col].legend(fontsize=7)
    fig.suptitle(f"time and memory against T, log-log; dotted guides: slope 1 (linear) and slope 2 (quadratic)\n"
                 f"{where}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _guides(ax):
    """Dotted lines of slope 1 and 2 through the first point of the first curve, to read growth off the plot."""
    lines = ax.get_lines()
    if not lines:
        return
    x, y = lines[0].get_xdata(), lines[0].get_ydata()
    xs = [x[0], x[-1]]
    for power in (1, 2):
        ax.plot(xs, [y[0] * (t / x[0]) ** power for t in xs], ":", color="gray", linewidth=1)


def machine(threads: int) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    where = torch.cuda.get_device_name() if DEVICE.type == "cuda" else f"{cpu}, {os.cpu_count()} cores"
    tf = peers.transformers_version()
    return (f"{where}; torch {torch.__version__} ({threads} threads), "
            f"transformers {tf}, Python {platform.python_version()}")


def measure_ops(ops: list[Op], Ts, quick: bool, threads: int | None) -> list[dict]:
    """Every case of ``ops`` (a sweep op at each T of ``Ts``, another at its headline T, its implementations
    interleaved), each printed as it finishes: the rows of results.json."""
    rows = []
    for op in ops:
        for T in (Ts if op.sweep else (op.headline_T,)):
            shared = {} if op.sweep else interleaved_times(op, T, quick, threads)
            for impl in op.impls:
                rows.append(run_case(op, impl, T, quick, threads, shared.get(impl.label)))
                r = rows[-1]
                print(f"{op.name:<10} T={T:<6} {impl.label:<42} "
                      + (f"{_fmt_time(r['median_s']):>10} ±{r['spread']:.0%}  {_fmt_bytes(r['peak_bytes'])}"
                         if _ok(r) else r["status"]), flush=True)
    return rows


def write_report(out: Path, ops: list[Op], rows: list[dict], run_info: dict, Ts, quick: bool,
                 from_json: bool) -> None:
    """results.md (the tables, the targets missed, the cost model), results.json and, with forward ops, scaling.png
    in ``out``, from the measured ``rows``; then prints where they went and the targets missed."""
    forward, training = [op for op in ops if op.sweep], [op for op in ops if not op.sweep]
    table, checks = headline(forward, rows)
    training_table, training_checks = headline(training, rows)
    growth, growth_checks = per_token_growth(forward, rows, Ts)
    checks += training_checks + growth_checks
    # the cost model is of the Triton kernels the forward ops run: a run of training ops alone leaves it out
    costs = (cost_model.report(compile_aot=not quick, measured=rows if DEVICE.type == "cuda" else None)
             if forward else {"markdown": "", "rows": []})
    missed = [c for c in checks if c["met"] is False]
    sections = {
        "Headline": [table] if forward else [],
        "Training: forward + backward": [training_table] if training else [],
        "Linear ops: time per token as T grows": [growth] if forward else [],
        "Targets missed": ["\n".join(f"- {c['op']} vs {c['vs']} at T={c['T']}: {c['metric']} ratio "
                                     f"{_ratio(c['ratio'])}, target {c['target']}" for c in missed) or "None."],
        "Time and memory against T": ["![scaling](scaling.png)", scaling_tables(forward, rows, Ts)] if forward else [],
        "GPU cost model of the Triton kernels": [costs["markdown"]] if forward else [],
    }
    md = [f"# Benchmarks\n\n`{run_info['command']}` on {run_info['machine']}, {run_info['date']}; "
          f"{run_info['seconds']} s." + (f" Report rewritten from results.json on {time.strftime('%Y-%m-%d %H:%M')}."
                                        if from_json else ""),
          "Median of n runs after one warm-up; spread = (max - min) / median; peak memory = resident memory "
          "(CPU) or allocated memory (CUDA) above the inputs during one call; fp32; torch.no_grad() but for the "
          "training table (forward + backward; a training step). "
          "Ratios are the other implementation's figure over seqmix's: above 1, seqmix is faster or smaller."
          + (" **Quick mode: tiny shapes, not the targets' shapes; the target checks below mean nothing.**"
             if quick else ""),
          *(part for title, parts in sections.items() if parts for part in (f"## {title}", *parts))]
    (out / "results.md").write_text("\n\n".join(md) + "\n")
    (out / "results.json").write_text(json.dumps({"run": run_info, "rows": rows, "checks": checks,
                                                  "cost_model": costs["rows"]}, indent=1))
    if forward:
        plot(forward, rows, out / "scaling.png", run_info["machine"])
    print(f"\nwrote {out / 'results.md'}, {out / 'results.json'}" + (f", {out / 'scaling.png'}" if forward else ""))
    print("\n".join(f"MISSED: {c['op']} vs {c['vs']}: {c['metric']} {_ratio(c['ratio'])}, target {c['target']}"
                    for c in missed))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes (T = 64, 128): a smoke test, no AOT build")
    parser.add_argument("--ops", default="", help="comma-separated subset of: wkv4, wkv7, ssm, rerope, attention, "
                        "wkv4_train, wkv7_train, ssm_train (each also _long), mamba_step")
    parser.add_argument("--out", type=Path, default=None, help="output folder")
    parser.add_argument("--from-json", action="store_true",
                        help="measure nothing: rewrite the report from the results.json in --out (cost model rebuilt)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)   # the case server, see serve()
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads in every case (default: torch's own choice; 1 with --quick)")
    args = parser.parse_args(argv)
    if args.serve:
        serve()
        return 0
    out = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    Ts = QUICK_T if args.quick else FULL_T
    threads = args.threads or (1 if args.quick else None)
    ops = all_ops(args.quick)
    if args.ops:
        wanted = args.ops.split(",")
        unknown = set(wanted) - {op.name for op in ops}
        if unknown:
            parser.error(f"unknown ops {sorted(unknown)}; choose from {[op.name for op in ops]}")
        ops = [op for op in ops if op.name in wanted]

    started = time.perf_counter()
    if args.from_json:       # re-report earlier measurements, e.g. with a cost model updated for changed kernels
        stored = json.loads((out / "results.json").read_text())
        names = {o.name for o in ops}
        rows = [r for r in stored["rows"] if r["op"] in names]
        run_info = stored["run"]
    else:
        rows = measure_ops(ops, Ts, args.quick, threads)
        arguments = argv if argv is not None else sys.argv[1:]
        run_info = {"command": " ".join(["python -m seqmix.benchmarks.run", *arguments]),
                    "machine": machine(threads or torch.get_num_threads()), "date": time.strftime("%Y-%m-%d"),
                    "seconds": round(time.perf_counter() - started)}
    write_report(out, ops, rows, run_info, Ts, args.quick, args.from_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
