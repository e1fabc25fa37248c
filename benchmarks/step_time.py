"""Decode step time against batch size: where an engine step's time goes on this machine.

    python benchmarks/step_time.py [--model smollm2-135m] [--context 300] [--batches 1,16,64]

For each batch size, admits that many requests with ``--context``-token prompts, runs
their prefill, then times decode steps and prints ms/step, tokens/s and the step split.
"""

from __future__ import annotations

import argparse
import json
import time

from worker.engine import EngineArgs, LLMEngine, SamplingParams


def main() -> None:
    """Print one JSON line per batch size."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    sizes = [int(b) for b in args.batches.split(",")]
    engine = LLMEngine(EngineArgs(model=args.model, max_num_seqs=max(sizes), num_threads=args.threads))
    params = SamplingParams(temperature=0.0, max_tokens=args.steps + 4, ignore_eos=True)
    for n in sizes:
        for i in range(n):
            engine.add_request(f"{n}-{i}", [(j * 7 + i) % 3000 + 3 for j in range(args.context)], params)
        while True:  # prefill everything first
            _, stats = engine.step()
            if stats.num_prefill_tokens == 0 and stats.num_waiting == 0:
                break
        start = time.perf_counter()
        split = {"schedule": 0.0, "forward": 0.0, "sample": 0.0}
        for _ in range(args.steps):
            _, stats = engine.step()
            split["schedule"] += stats.schedule_seconds
            split["forward"] += stats.forward_seconds
            split["sample"] += stats.sample_seconds
        per_step = (time.perf_counter() - start) / args.steps
        print(json.dumps({
            "batch": n, "context": args.context, "ms_per_step": round(per_step * 1000, 1),
            "tokens_per_s": round(n / per_step, 1),
            "split_ms": {k: round(v / args.steps * 1000, 1) for k, v in split.items()},
        }), flush=True)
        while engine.has_unfinished_requests():
            engine.step()


if __name__ == "__main__":
    main()
