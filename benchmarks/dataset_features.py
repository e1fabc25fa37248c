"""Costs of the dataset features, each pair timed in one process (issue 16):

1. n = 8 samples of one prompt against 8 separate requests of it: prompt tokens computed
   (the samples fork the prompt's KV; separate requests share it only through the prefix
   cache) and generated tokens per second.
2. JSON-schema constrained generation against free generation on the same prompts:
   generated tokens per second, and the share of constrained outputs that parse and
   validate against the schema.

    .venv/bin/python benchmarks/dataset_features.py [--model smollm2-135m] [--prompts 16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness.machine import cpu_description
from benchmarks.make_chat_workload import read_turns
from worker.engine.llm_engine import LLMEngine
from worker.protocol.sampling_params import SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"enum": ["science", "history", "code", "cooking", "other"]},
        "difficulty": {"type": "integer", "minimum": 1, "maximum": 5},
        "needs_followup": {"type": "boolean"},
    },
    "required": ["topic", "difficulty", "needs_followup"],
    "additionalProperties": False,
}


def _valid(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return (isinstance(value, dict) and set(value) == set(SCHEMA["required"])
            and value["topic"] in SCHEMA["properties"]["topic"]["enum"]
            and isinstance(value["difficulty"], int) and 1 <= value["difficulty"] <= 5
            and isinstance(value["needs_followup"], bool))


def run(engine: LLMEngine, requests: list[tuple[str, list[int], SamplingParams]]) -> dict[str, Any]:
    """Drain ``requests``; wall time, generated tokens, prompt tokens computed, outputs."""
    for rid, ids, params in requests:
        engine.add_request(rid, ids, params)
    done: dict[str, Any] = {}
    prefill = generated = 0
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        outputs, stats = engine.step()
        prefill += stats.num_prefill_tokens
        for o in outputs:
            generated += len(o.new_token_ids)
            if o.finished:
                done[o.request_id] = o
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "generated": generated, "tok_s": generated / wall,
            "prefill_tokens": prefill, "outputs": done}


def main() -> None:
    """Print both comparisons as markdown tables."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--prompts", type=int, default=16)
    args = p.parse_args()
    engine = LLMEngine(model=args.model)
    turns = read_turns()[: args.prompts]
    ids = [engine.tokenize(messages=[{"role": "user", "content": t}]) for t in turns]
    warm = SamplingParams(temperature=0, max_tokens=4)
    run(engine, [("warm", ids[0], warm)])
    cpu = cpu_description()
    print(f"CPU {cpu['model']} ({', '.join(cpu['vector_extensions'])}), {os.cpu_count()} cores, "
          f"{args.model}, {len(turns)} chat prompts")

    sample = SamplingParams(temperature=1.0, max_tokens=64, ignore_eos=True)
    forked = run(engine, [(f"n8-{i}", x, SamplingParams(**{**vars(sample), "n": 8, "seed": i}))
                          for i, x in enumerate(ids)])
    separate = run(engine, [(f"sep-{i}-{k}", x, SamplingParams(**{**vars(sample), "seed": 8 * i + k}))
                            for i, x in enumerate(ids) for k in range(8)])
    print("\n| 8 samples per prompt | prompt tokens computed | generated tok/s | wall s |")
    print("|---|---|---|---|")
    for name, r in (("n = 8 (forked)", forked), ("8 separate requests", separate)):
        print(f"| {name} | {r['prefill_tokens']} | {r['tok_s']:.1f} | {r['wall_s']:.1f} |")

    ask = ("Classify this question as JSON with topic, difficulty (1-5) and needs_followup: ")
    json_ids = [engine.tokenize(messages=[{"role": "user", "content": ask + t}]) for t in turns]
    free = run(engine, [(f"free-{i}", x, SamplingParams(temperature=0, max_tokens=128))
                        for i, x in enumerate(json_ids)])
    constrained = run(engine, [
        (f"json-{i}", x, SamplingParams(temperature=0, max_tokens=128,
                                        structured={"type": "json_schema", "schema": SCHEMA}))
        for i, x in enumerate(json_ids)])
    print("\n| same prompts, greedy | generated tok/s | wall s | outputs valid against the schema |")
    print("|---|---|---|---|")
    for name, r in (("free", free), ("JSON-schema constrained", constrained)):
        valid = sum(_valid(o.text) for o in r["outputs"].values())
        print(f"| {name} | {r['tok_s']:.1f} | {r['wall_s']:.1f} | {valid}/{len(r['outputs'])} |")


if __name__ == "__main__":
    main()
