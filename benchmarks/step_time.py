"""Decode step time against batch size: where an engine step's time goes on this machine.

    python benchmarks/step_time.py [--model smollm2-135m] [--context 300] [--batches 1,16,64]
                                   [--attention-backend torch|cpu] [--no-prepack-weights]
                                   [--no-native-ops]

For each batch size, admits that many requests with ``--context``-token prompts, runs
their prefill, then times decode steps and prints ms/step, tokens/s and the step split:
linear layers, attention, KV write, sampler, building the step's input tensors, the
scheduler, and the rest of the forward (norms, RoPE, activations, Python between ops).
The split comes from timers wrapped around those functions in this script only; the
engine itself carries no instrumentation. ``--attention-backend torch
--no-prepack-weights`` reproduces the engine before the CPU work of issue 3.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from cli.bench.machine import cpu_description
from worker.engine import EngineArgs, LLMEngine, SamplingParams


def _timed(totals: dict[str, float], key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - t0

    return wrapper


def instrument(engine: LLMEngine, totals: dict[str, float]) -> None:
    """Wrap the engine's parts with timers that add into ``totals``."""
    runner = engine.runner
    backend = runner.backend
    runner.backend = type(backend)(
        name=backend.name,
        write_kv=_timed(totals, "kv_write", backend.write_kv),
        decode_attention=_timed(totals, "attention", backend.decode_attention),
        prefill_attention=_timed(totals, "attention", backend.prefill_attention),
    )
    for module in runner.model.modules():
        if not list(module.children()) and hasattr(module, "in_features"):  # Linear, PackedLinear
            module.forward = _timed(totals, "linear", module.forward)  # type: ignore[method-assign]
    runner.build_inputs = _timed(totals, "build_inputs", runner.build_inputs)  # type: ignore[method-assign]
    engine.sampler.sample = _timed(totals, "sampler", engine.sampler.sample)  # type: ignore[method-assign]


def main() -> None:
    """Print one JSON line per batch size."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--no-prepack-weights", dest="prepack", action="store_false", default=None)
    parser.add_argument("--no-native-ops", dest="native_ops", action="store_false",
                        help="torch's separate ops instead of the fused native norm/RoPE/SiLU")
    args = parser.parse_args()
    sizes = [int(b) for b in args.batches.split(",")]
    engine = LLMEngine(EngineArgs(
        model=args.model, max_num_seqs=max(sizes), num_threads=args.threads,
        attention_backend=args.attention_backend, prepack_weights=args.prepack))
    engine.runner.model.native_ops = args.native_ops
    totals: dict[str, float] = defaultdict(float)
    instrument(engine, totals)
    params = SamplingParams(temperature=0.0, max_tokens=args.steps + 4, ignore_eos=True)
    for n in sizes:
        for i in range(n):
            engine.add_request(f"{n}-{i}", [(j * 7 + i) % 3000 + 3 for j in range(args.context)], params)
        while True:  # prefill everything first
            _, stats = engine.step()
            if stats.num_prefill_tokens == 0 and stats.num_waiting == 0:
                break
        totals.clear()
        start = time.perf_counter()
        for _ in range(args.steps):
            _, stats = engine.step()
            totals["schedule"] += stats.schedule_seconds
            totals["forward"] += stats.forward_seconds
        per_step = (time.perf_counter() - start) / args.steps
        split = {k: totals[k] for k in ("linear", "attention", "kv_write", "sampler", "build_inputs", "schedule")}
        inner = sum(totals[k] for k in ("linear", "attention", "kv_write", "build_inputs"))
        split["rest_of_forward"] = totals["forward"] - inner
        split["other"] = per_step * args.steps - totals["forward"] - totals["sampler"] - totals["schedule"]
        print(json.dumps({
            "batch": n, "context": args.context, "backend": engine.runner.backend.name,
            "prepacked": engine.prepacked, "native_ops": args.native_ops,
            "cpu": cpu_description(), "ms_per_step": round(per_step * 1000, 1),
            "tokens_per_s": round(n / per_step, 1),
            "split_ms": {k: round(v / args.steps * 1000, 1) for k, v in split.items()},
        }), flush=True)
        while engine.has_unfinished_requests():
            engine.step()


if __name__ == "__main__":
    main()
