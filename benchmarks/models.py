"""Whole models on a CPU: the memory a checkpoint costs to load, and prefill / decode speed beside the peers and beside
the limits of the hardware: ``python -m seqmix.benchmarks.models``.

    python -m seqmix.benchmarks.models                  1.5 GB checkpoints; 169M / 130M / 0.1B models (minutes)
    python -m seqmix.benchmarks.models --quick          tiny checkpoints and models (tests/benchmarks/)
    python -m seqmix.benchmarks.models --only memory    or --only speed; --out DIR, --threads N

Writes models.md and models.json to --out (default benchmarks/results, or benchmarks/results/quick with --quick).

Memory. For each model (RWKV-4 and Mamba in transformers' layout, RWKV-7 in flash-linear-attention's layout and as
a BlinkDL .pth) and for a sharded copy of the RWKV-4 directory, a synthetic bf16 checkpoint of a ~0.7B shape (about
1.5 GB) is written, then loaded by ``seqmix.models.cli.load_model`` in a fresh interpreter that has imported torch
and seqmix first. Peak = the resident high-water mark (VmHWM, reset through /proc/self/clear_refs just before the
load) above the resident set before it, from before the load until the model is built (before any forward), in the
stored dtype. The goal: within 1.2x of the file's size. A second figure, after one forward of one token, counts the
file's pages the model has then touched (mapped pages are resident once read).

Speed. Random weights at the published shapes (RWKV-4 169M: 12 x 768; Mamba 130M: 24 x 768; RWKV-7 0.1B: 12 x 768,
head 64), the same weights in every runtime, fp32 and bf16, torch's threads (--threads to change): prefill = one
call on a prompt of T tokens (logits of the last position only, as generation needs), decode = tokens fed one at a
time through the state (greedy). Peers: transformers' RwkvForCausalLM and MambaForCausalLM (their CPU paths, as a new
user runs them), BlinkDL's `rwkv` runtime for RWKV-7 (RWKV_JIT_ON=1, as its README advises). Limits, measured beside
them: one streaming pass over the weights a decode step must read (every matrix but the embedding: the memory-bound
floor of decoding), and the model's matmuls alone on the same T tokens (the compute floor of prefill). Runtimes are
the median of 5 runs; seqmix's and the limits' in alternating rounds (one after the other, the limits moved by up to
40% between runs of this benchmark). Goals: decode at least as fast as the fastest
peer and within 1.3x of the streaming pass; prefill at least as fast as the fastest peer and within 1.3x of the
matmuls alone.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..models import io
from ..models.mamba import MambaConfig, MambaForCausalLM
from ..models.rwkv4 import RwkvConfig, RwkvForCausalLM
from ..models.rwkv7 import Rwkv7, Rwkv7Config

__all__ = ["main", "write_checkpoint", "measure_load", "speed_rows", "SHAPES"]

RESULTS = Path(__file__).parent / "results"
MEMORY_GOAL, SPEED_GOAL = 1.2, 1.3


@dataclass
class Shape:
    cls: type
    config: object


# name -> (memory: a ~0.7B bf16 checkpoint of about 1.5 GB, speed: the published small model), and the quick ones
SHAPES = {
    "full": {
        "memory": {"rwkv4": Shape(RwkvForCausalLM,
                                  RwkvConfig(vocab_size=50277, hidden_size=1536, num_hidden_layers=20)),
                   "rwkv7": Shape(Rwkv7, Rwkv7Config(vocab_size=65536, n_embd=1536, n_layer=20, head_size=64)),
                   "mamba": Shape(MambaForCausalLM, MambaConfig(vocab_size=50280, hidden_size=1536,
                                                                num_hidden_layers=48))},
        "speed": {"rwkv4": Shape(RwkvForCausalLM, RwkvConfig(vocab_size=50277, hidden_size=768, num_hidden_layers=12)),
                  "rwkv7": Shape(Rwkv7, Rwkv7Config(vocab_size=65536, n_embd=768, n_layer=12, head_size=64)),
                  "mamba": Shape(MambaForCausalLM, MambaConfig(vocab_size=50280, hidden_size=768,
                                                               num_hidden_layers=24))},
        "prompt": 1024, "decode": 32},
    "quick": {
        "memory": {"rwkv4": Shape(RwkvForCausalLM, RwkvConfig(vocab_size=4096, hidden_size=512, num_hidden_layers=4)),
                   "rwkv7": Shape(Rwkv7, Rwkv7Config(vocab_size=4096, n_embd=512, n_layer=4, head_size=64)),
                   "mamba": Shape(MambaForCausalLM, MambaConfig(vocab_size=4096, hidden_size=512,
                                                                num_hidden_layers=8))},
        "speed": {"rwkv4": Shape(RwkvForCausalLM, RwkvConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2)),
                  "rwkv7": Shape(Rwkv7, Rwkv7Config(vocab_size=300, n_embd=128, n_layer=2, head_size=64)),
                  "mamba": Shape(MambaForCausalLM, MambaConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2))},
        "prompt": 16, "decode": 4},
}


# -------------------------------------------------------------------------------------------------- memory

def _random_model(shape: Shape, dtype: torch.dtype, seed: int = 0):
    """The model with random weights (std 0.02, norms 1) in ``dtype``, allocated once in that dtype."""
    with torch.device("meta"):
        model = shape.cls(shape.config).to(dtype)
    model = model.to_empty(device="cpu")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" in name or "norm" in name:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).mul_(0.02).to(dtype))
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model.eval()


def _shard(directory: Path, parts: int) -> None:
    """Split directory/model.safetensors into ``parts`` shards and an index, as transformers writes them."""
    tensors = io.load_state_dict(directory / "model.safetensors")
    names = list(tensors)
    weight_map = {}
    for n in range(parts):
        shard = f"model-{n + 1:05d}-of-{parts:05d}.safetensors"
        part = names[n * len(names) // parts:(n + 1) * len(names) // parts]
        io.save_state_dict({k: tensors[k] for k in part}, directory / shard)
        weight_map |= {k: shard for k in part}
    del tensors
    (directory / "model.safetensors").unlink()
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def write_checkpoint(kind: str, shape: Shape, root: Path) -> tuple[Path, int]:
    """Write the synthetic bf16 checkpoint of ``kind`` ("rwkv4", "mamba", "rwkv7" (fla layout), "rwkv7 .pth",
    "rwkv4 sharded"); returns (the path to load, its size in bytes)."""
    model = _random_model(shape, torch.bfloat16)
    root.mkdir(parents=True, exist_ok=True)
    path = root / kind.replace(" ", "_")
    if kind == "rwkv7 .pth":
        path = path.with_suffix(".pth")
        torch.save(model.state_dict(), path)
        return path, path.stat().st_size
    model.save_pretrained(path)
    del model
    if kind.endswith("sharded"):
        _shard(path, 4)
    return path, sum(f.stat().st_size for f in path.iterdir() if f.name != "config.json")


_LOAD_PROBE = """
import json, sys, time, torch
from seqmix.models.cli import load_model
def status(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key + ":"))
with torch.no_grad():          # the one-time costs (lazy imports, the C library) on a tiny checkpoint of the kind
    load_model(sys.argv[2]).generate(torch.zeros(1, 1, dtype=torch.long), max_new_tokens=0)
before = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")
start = time.perf_counter()
model = load_model(sys.argv[1])
seconds = time.perf_counter() - start
built = status("VmHWM") - before
with torch.no_grad():
    model.generate(torch.zeros(1, 1, dtype=torch.long), max_new_tokens=0)
print(json.dumps({"built": built, "after_forward": status("VmHWM") - before, "seconds": seconds,
                  "dtype": str(next(model.parameters()).dtype)}))
"""


def measure_load(path: Path, warmup: Path) -> dict:
    """Load ``path`` in a fresh interpreter, after loading (and running) the tiny checkpoint ``warmup`` of the same
    kind once: peak resident bytes above that point until the model is built, and after one forward of one token."""
    out = subprocess.run([sys.executable, "-c", _LOAD_PROBE, str(path), str(warmup)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def memory_rows(quick: bool) -> list[dict]:
    shapes = SHAPES["quick" if quick else "full"]["memory"]
    tiny = SHAPES["quick"]["speed"]
    kinds = {"rwkv4": "rwkv4", "rwkv4 sharded": "rwkv4", "rwkv7": "rwkv7", "rwkv7 .pth": "rwkv7", "mamba": "mamba"}
    rows = []
    with tempfile.TemporaryDirectory(prefix="seqmix-memory-") as root:
        for kind, model in kinds.items():
            warmup, _ = write_checkpoint(kind, tiny[model], Path(root) / "warmup")
            path, size = write_checkpoint(kind, shapes[model], Path(root))
            result = measure_load(path, warmup)
            rows.append({"checkpoint": kind, "file_bytes": size, **result, "ratio": result["built"] / size})
            print(f"memory {kind}: {rows[-1]['ratio']:.2f}x of {size / 2**20:.0f} MiB", file=sys.stderr)
    return rows


# --------------------------------------------------------------------------------------------------- speed

def _peer_env_rwkv():
    """BlinkDL's runtime, RWKV-7 mode, CPU, TorchScript on (rwkv.model reads these at import)."""
    os.environ.update({"RWKV_V7_ON": "1", "RWKV_JIT_ON": "1", "RWKV_CUDA_ON": "0"})
    module = importlib.import_module("rwkv.model")
    return module if hasattr(module, "RWKV_x070") else importlib.reload(module)


def _peers(kind: str, ours, dtype: torch.dtype, tmp: Path) -> dict:
    """label -> (prefill(ids) -> state, step(token id, state) -> state): the peers on our weights."""
    try:
        import transformers
    except ImportError:
        return {}
    if kind == "rwkv7":
        torch.save({k: v.float() for k, v in ours.state_dict().items()}, tmp / "peer.pth")
        strategy = {torch.float32: "cpu fp32", torch.bfloat16: "cpu bf16"}[dtype]
        peer = _peer_env_rwkv().RWKV_x070(model=str(tmp / "peer"), strategy=strategy)
        return {"BlinkDL rwkv": (lambda ids: peer.forward(ids[0].tolist(), None)[1],
                                 lambda tok, state: peer.forward(tok, state)[1])}
    hf_class, hf_config = {"rwkv4": (transformers.RwkvForCausalLM, transformers.RwkvConfig),
                           "mamba": (transformers.MambaForCausalLM, transformers.MambaConfig)}[kind]
    config = {k: v for k, v in vars(ours.config).items() if not k.startswith("_")}
    peer = hf_class(hf_config(**config)).to(dtype).eval()
    peer.load_state_dict(ours.state_dict(), strict=False)
    cache = "state" if kind == "rwkv4" else "cache_params"

    def prefill(ids):
        return getattr(peer(ids, use_cache=True, logits_to_keep=1), cache)

    def step(tok, state):
        out = peer(torch.tensor([[tok]]), use_cache=True, logits_to_keep=1, **{cache: state})
        out.logits.argmax()
        return getattr(out, cache)
    return {f"transformers {hf_class.__name__}": (prefill, step)}


def _ours(model) -> tuple:
    def prefill(ids):
        return model.step(ids, None, None)[1]

    def step(tok, state):
        logits, state = model.step(torch.tensor([[tok]]), state, None)
        logits.argmax()
        return state
    return prefill, step


def _read_weights(model) -> list[torch.Tensor]:
    """What a decode step must read: every parameter but the embedding (one row of it is gathered; a tied head
    reads it whole), once each."""
    embedding = next(m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding))
    seen, out = {embedding.data_ptr()} if not getattr(model.config, "tie_word_embeddings", False) else set(), []
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            out.append(p)
    return out


def _matmul_shapes(model) -> list[tuple[int, int]]:
    """(in, out) of every matrix product a forward does per token, but the head (prefill keeps one position)."""
    shapes = [(m.in_features, m.out_features) for name, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and not name.endswith(("head", "lm_head"))]
    # RWKV-7's LoRA matrices are parameters used as x @ W1 @ W2
    shapes += [tuple(p.shape) for name, p in model.named_parameters()
               if name.rsplit(".", 1)[-1] in ("w1", "w2", "a1", "a2", "v1", "v2", "g1", "g2")]
    return shapes


CLOCK = time.perf_counter      # --cpu-time: time.process_time (one thread on a busy machine)


def _rounds(fns: dict, runs: int) -> dict:
    """name -> (median seconds, spread (max - min) / median) of the functions, each warmed up once, then timed in
    ``runs`` alternating rounds: a runtime and its limit see the same machine (timed one after the other, the
    limits' medians moved by up to 40% between runs of this benchmark)."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            start = CLOCK()
            fn()
            times[name].append(CLOCK() - start)
    medians = {name: statistics.median(t) for name, t in times.items()}
    return {name: (medians[name], (max(t) - min(t)) / medians[name]) for name, t in times.items()}


def _decoding(prefill, step, ids, n_decode: int):
    """A function that decodes n_decode tokens (greedy, fixed ids) from the prompt's state."""
    state = prefill(ids)

    def decode():
        s = state
        for n in range(n_decode):
            s = step(n % 100, s)
    return decode


def speed_rows(quick: bool, threads: int | None = None) -> list[dict]:
    if threads:
        torch.set_num_threads(threads)
    setup = SHAPES["quick" if quick else "full"]
    T, n_decode, runs = setup["prompt"], setup["decode"], 1 if quick else 5
    ids = torch.randint(0, 300, (1, T), generator=torch.Generator().manual_seed(0))
    rows = []
    with tempfile.TemporaryDirectory(prefix="seqmix-speed-") as tmp, torch.no_grad():
        for kind, shape in setup["speed"].items():
            for dtype in (torch.float32, torch.bfloat16):
                ours = _random_model(shape, dtype)
                where = f"{kind} {str(dtype).removeprefix('torch.')}"
                # the limits. One read of every weight: a matrix-vector product per matrix (torch's fastest full
                # read of a matrix on a CPU, faster than sum), a sum per vector
                reads = [(w, torch.ones(w.shape[1], dtype=dtype)) if w.dim() == 2 else (w.reshape(-1), None)
                         for w in _read_weights(ours)]
                mats = [(torch.randn(T, i).to(dtype), torch.randn(i, o).to(dtype)) for i, o in _matmul_shapes(ours)]
                # (noqa: ruff 0.17 misreads the scope of a comprehension inside these lambdas; both names are set above)
                limits = {"one streaming pass over the weights": ("decode", 1, lambda: [
                              torch.mv(w, x) if x is not None else w.sum() for w, x in reads]),  # noqa: F821
                          "the matmuls alone": ("prefill", T, lambda: [x @ w for x, w in mats])}  # noqa: F821
                runtimes = {"seqmix": _ours(ours)} | _peers(kind, ours, dtype, Path(tmp))
                for label, (prefill, step) in runtimes.items():
                    # seqmix in rounds with the limits, each peer alone
                    phases = {"prefill": (T, lambda: prefill(ids)),
                              "decode": (n_decode, _decoding(prefill, step, ids, n_decode))}
                    for phase, (tokens, fn) in phases.items():
                        fns = {label: fn} | ({name: f for name, (p, _, f) in limits.items() if p == phase}
                                             if label == "seqmix" else {})
                        for name, (seconds, spread) in _rounds(fns, runs).items():
                            n = tokens if name == label else limits[name][1]
                            rows.append({"model": where, "runtime": name, f"{phase}_tok_s": n / seconds,
                                         f"{phase}_spread": spread})
                    mine = _merged([r for r in rows if (r["model"], r["runtime"]) == (where, label)])[0]
                    print(f"speed {where} {label}: {mine['prefill_tok_s']:.1f} / {mine['decode_tok_s']:.2f} tok/s",
                          file=sys.stderr)
                del ours, mats, reads
    return _merged(rows)


def _merged(rows: list[dict]) -> list[dict]:
    """One row per (model, runtime), its phases' numbers together, in the order first seen."""
    merged = {}
    for row in rows:
        merged.setdefault((row["model"], row["runtime"]), {}).update(row)
    return list(merged.values())


# -------------------------------------------------------------------------------------------------- report

def _fmt(x, spec=".1f"):
    return "" if x is None else format(x, spec)


def memory_table(rows: list[dict]) -> str:
    lines = ["| checkpoint (bf16) | file | peak until built | / file | goal <= 1.2x | after one token | load time |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['checkpoint']} | {r['file_bytes'] / 2**20:.0f} MiB | {r['built'] / 2**20:.0f} MiB | "
                     f"{r['ratio']:.2f}x | {'yes' if r['ratio'] <= MEMORY_GOAL else 'no'} | "
                     f"{r['after_forward'] / 2**20:.0f} MiB ({r['after_forward'] / r['file_bytes']:.2f}x) | "
                     f"{r['seconds']:.2f} s |")
    return "\n".join(lines)


def _goals(group: list[dict]) -> dict:
    """ours / the limits and the fastest peer, for both phases."""
    ours = next(r for r in group if r["runtime"] == "seqmix")
    peers = [r for r in group if r["runtime"] not in ("seqmix", "one streaming pass over the weights",
                                                         "the matmuls alone")]
    stream = next(r for r in group if r["runtime"] == "one streaming pass over the weights")
    matmuls = next(r for r in group if r["runtime"] == "the matmuls alone")
    out = {}
    for phase, limit in (("prefill", matmuls), ("decode", stream)):
        fastest = max((r[f"{phase}_tok_s"] for r in peers), default=None)
        vs_peer = ours[f"{phase}_tok_s"] / fastest if fastest else None
        vs_limit = limit[f"{phase}_tok_s"] / ours[f"{phase}_tok_s"]      # how many times slower than the limit
        met = (vs_peer is None or vs_peer >= 1) and vs_limit <= SPEED_GOAL
        out[phase] = (vs_peer, vs_limit, met)
    return out


def speed_table(rows: list[dict]) -> str:
    lines = ["| model, dtype | runtime | prefill tok/s | spread | decode tok/s | spread |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['runtime']} | {_fmt(r.get('prefill_tok_s'))} | "
                     f"{_fmt(r.get('prefill_spread'), '.0%')} | {_fmt(r.get('decode_tok_s'), '.2f')} | "
                     f"{_fmt(r.get('decode_spread'), '.0%')} |")
    lines += ["", "| model, dtype | prefill: ours / fastest peer | prefill: our time / the matmuls' | met (>= 1x, "
                  "<= 1.3x) | decode: ours / fastest peer | decode: our time / one streaming pass | met (>= 1x, "
                  "<= 1.3x) |", "|---|---|---|---|---|---|---|"]
    for model in dict.fromkeys(r["model"] for r in rows):
        goals = _goals([r for r in rows if r["model"] == model])
        cells = []
        for phase in ("prefill", "decode"):
            vs_peer, vs_limit, met = goals[phase]
            cells += [f"{_fmt(vs_peer, '.2f')}x" if vs_peer else "no peer", f"{vs_limit:.2f}x", "yes" if met else "no"]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Run the benchmarks (see the module docstring); returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny checkpoints and models: a smoke test")
    parser.add_argument("--only", choices=("memory", "speed"), help="one of the two parts")
    parser.add_argument("--out", type=Path, default=None, help="output folder")
    parser.add_argument("--threads", type=int, default=None, help="torch threads for the speed part")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time with the process's CPU time (with --threads 1 on a machine other jobs share)")
    args = parser.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.cpu_time else time.perf_counter
    out = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    # --only keeps the other part of an earlier run
    results = json.loads((out / "models.json").read_text()) if args.only and (out / "models.json").exists() else {}
    if args.only != "speed":
        results["memory"] = memory_rows(args.quick)
    if args.only != "memory":
        results["speed"] = speed_rows(args.quick, args.threads)
        results["speed_setup"] = {"threads": args.threads or torch.get_num_threads(), "torch": torch.__version__,
                                  "clock": "CPU time" if args.cpu_time else "wall time"}
    sections = []
    if "memory" in results:
        sections.append("## Loading a checkpoint: peak resident memory\n\n" + memory_table(results["memory"]))
    if "speed" in results:
        setup = results["speed_setup"]
        sections.append(f"## Whole-model speed ({setup['threads']} threads, {setup['clock']})\n\n"
                        + speed_table(results["speed"]))
    (out / "models.json").write_text(json.dumps(results, indent=1))
    (out / "models.md").write_text("\n\n".join(sections) + "\n")
    print("\n\n".join(sections))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
