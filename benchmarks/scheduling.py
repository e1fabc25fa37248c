"""Scheduling benchmarks of issue 5, each measured against its own baseline in one run.

    python benchmarks/scheduling.py prefix-cache   # 64 requests sharing a 512-token system prompt
    python benchmarks/scheduling.py chunked-prefill  # a 4,000-token prompt arriving mid-decode

Prints one JSON object per benchmark; ``--out FILE`` also writes them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from worker.engine import EngineArgs, LLMEngine, SamplingParams


def _prompt(engine: LLMEngine, num_tokens: int, seed: int) -> list[int]:
    """Deterministic real-text tokens, cut to ``num_tokens``."""
    text = (
        "You are a careful assistant. Answer briefly, cite the rule you used, and never "
        "invent facts. Rule " + " ".join(f"{seed}-{i}: be kind and precise." for i in range(num_tokens))
    )
    return engine.tokenize(prompt=text)[:num_tokens]


def prefix_cache(model: str, threads: int | None) -> dict[str, Any]:
    """Prefill tokens computed and throughput, prefix caching off vs on."""
    result: dict[str, Any] = {"benchmark": "prefix-cache", "model": model, "requests": 64}
    for caching in (False, True):
        engine = LLMEngine(EngineArgs(model=model, enable_prefix_caching=caching, max_num_seqs=64,
                                      num_threads=threads))
        system = _prompt(engine, 512, seed=0)
        prompts = [system + _prompt(engine, 20, seed=i + 1) for i in range(64)]
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        engine.add_request("warmup", prompts[0][-40:], SamplingParams(max_tokens=2, temperature=0.0))
        while engine.has_unfinished_requests():
            engine.step()
        start = time.perf_counter()
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", p, params)
        prefill = cached = generated = 0
        while engine.has_unfinished_requests():
            outputs, stats = engine.step()
            prefill += stats.num_prefill_tokens
            cached += stats.num_cached_tokens
            generated += sum(len(o.new_token_ids) for o in outputs)
        seconds = time.perf_counter() - start
        result["on" if caching else "off"] = {
            "prefill_tokens_computed": prefill, "cached_tokens": cached,
            "seconds": round(seconds, 2), "output_tokens_per_s": round(generated / seconds, 2),
        }
    off, on = result["off"], result["on"]
    result["prefill_tokens_drop"] = round(1 - on["prefill_tokens_computed"] / off["prefill_tokens_computed"], 4)
    result["throughput_ratio"] = round(on["output_tokens_per_s"] / off["output_tokens_per_s"], 2)
    return result


def chunked_prefill(model: str, threads: int | None, long_prompt: int = 4000) -> dict[str, Any]:
    """Inter-token latency of 32 decoding sequences while a long prompt arrives."""
    result: dict[str, Any] = {"benchmark": "chunked-prefill", "model": model, "decoding": 32,
                              "long_prompt_tokens": long_prompt}
    for chunked in (False, True):
        engine = LLMEngine(EngineArgs(
            model=model, enable_chunked_prefill=chunked, max_num_seqs=64, num_threads=threads,
            max_num_batched_tokens=512 if chunked else long_prompt + 64,
        ))
        for i in range(32):
            engine.add_request(f"d{i}", _prompt(engine, 32, seed=i), SamplingParams(
                temperature=0.0, max_tokens=48, ignore_eos=True))
        latencies: list[float] = []
        last_token: dict[str, float] = {}
        step = 0
        while engine.has_unfinished_requests():
            if step == 8:
                engine.add_request("long", _prompt(engine, long_prompt, seed=99), SamplingParams(
                    temperature=0.0, max_tokens=4, ignore_eos=True))
            outputs, _ = engine.step()
            now = time.perf_counter()
            for out in outputs:
                if out.request_id.startswith("d") and out.new_token_ids:
                    if out.request_id in last_token:
                        latencies.append(now - last_token[out.request_id])
                    last_token[out.request_id] = now
            step += 1
        latencies.sort()
        result["chunked" if chunked else "unchunked"] = {
            "itl_p50_ms": round(1000 * statistics.median(latencies), 1),
            "itl_p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 1),
            "itl_max_ms": round(1000 * latencies[-1], 1),
        }
    result["p99_ratio_unchunked_over_chunked"] = round(
        result["unchunked"]["itl_p99_ms"] / result["chunked"]["itl_p99_ms"], 2)
    return result


def main() -> None:
    """Run the chosen benchmarks and print their JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", nargs="+", choices=["prefix-cache", "chunked-prefill"])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = []
    for name in args.which:
        fn = prefix_cache if name == "prefix-cache" else chunked_prefill
        results.append(fn(args.model, args.threads))
        print(json.dumps(results[-1], indent=2), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
