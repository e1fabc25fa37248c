"""Costs of the dataset features, each pair timed in one process (issue 16):

1. n = 8 samples of one prompt against 8 separate requests of it: prompt tokens computed
   (the samples fork the prompt's KV; separate requests share it only through the prefix
   cache) and generated tokens per second.
2. JSON-schema constrained generation against free generation on the same prompts:
   generated tokens per second, and the share of constrained outputs that parse and
   validate against the schema.
3. What one constrained request costs its free batch-mates: 16 free requests against 15
   free plus 1 constrained (all 64 tokens), mean time of a full step, next to the time
   the step spent on the mask (filling it, applying it, advancing the matcher).

    .venv/bin/python benchmarks/dataset_features.py [--model smollm2-135m] [--prompts 16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.make_chat_workload import read_turns
from cli.bench.machine import cpu_description
from worker.engine.llm_engine import LLMEngine
from worker.protocol.sampling_params import SamplingParams

ROUNDS = 5  # of the mixed-batch comparison
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


def full_steps(engine: LLMEngine, requests: list[tuple[str, list[int], SamplingParams]],
               rows: int) -> float:
    """Mean seconds of the decode steps that ran all ``rows`` sequences."""
    for rid, ids, params in requests:
        engine.add_request(rid, ids, params)
    times = []
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        _, stats = engine.step()
        if stats.num_decode_tokens == rows and not stats.num_prefill_tokens:
            times.append(time.perf_counter() - t0)
    return sum(times) / len(times)


class MaskClock:
    """Time spent on structured output inside steps: the masks and the matchers."""

    def __init__(self) -> None:
        import worker.engine.structured as structured
        from worker.engine.structured import Grammar

        self.seconds, self.steps = 0.0, 0  # steps: mask applications
        # grammar_masks binds structured.apply_masks when a step builds its constrain
        self._restore = [(structured, "apply_masks", structured.apply_masks),
                         (Grammar, "accept", Grammar.accept)]
        for owner, name, fn in self._restore:
            setattr(owner, name, self._timed(fn))

    def _timed(self, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
                # a step with constrained rows: apply_masks(logits, rows=rows), rows given
                self.steps += fn.__name__ == "apply_masks" and bool(kwargs.get("rows"))
        return timed

    def close(self) -> None:
        for owner, name, fn in self._restore:
            setattr(owner, name, fn)


def main() -> None:
    """Print the three comparisons as markdown tables."""
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

    # 3. a constrained row among free ones: its pattern allows no end before 64 tokens
    long = SamplingParams(temperature=0, max_tokens=64)
    only_free = [(f"f-{i}", x, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
                 for i, x in enumerate(ids[:16])]
    regex = {"type": "regex", "pattern": "[a-z ]{300,400}"}
    mixed = [*only_free[:15], ("g-15", ids[15 % len(ids)],
                               SamplingParams(**{**vars(long), "structured": regex}))]
    full_steps(engine, only_free[:2], 2)  # warm
    free_steps, mixed_steps = [], []
    clock = MaskClock()
    for r in range(ROUNDS):  # interleaved: drift of the machine hits both alike
        free_steps.append(full_steps(engine, [(f"r{r}{q}", x, p) for q, x, p in only_free], 16))
        mixed_steps.append(full_steps(engine, [(f"r{r}{q}", x, p) for q, x, p in mixed], 16))
    clock.close()
    free_step, mixed_step = statistics.median(free_steps), statistics.median(mixed_steps)
    per_step = clock.seconds / max(1, clock.steps)  # one mask and one advance per step
    print(f"\n| 16 rows per decode step (median of {ROUNDS} interleaved runs) | mean step ms "
          "(range) | of which structured output ms |")
    print("|---|---|---|")
    def spread(xs: list[float]) -> str:
        return f"{min(xs) * 1e3:.2f}-{max(xs) * 1e3:.2f}"

    print(f"| 16 free | {free_step * 1e3:.2f} ({spread(free_steps)}) | - |")
    print(f"| 15 free + 1 regex-constrained | {mixed_step * 1e3:.2f} ({spread(mixed_steps)}) "
          f"| {per_step * 1e3:.2f} |")
    print(f"step time added: {(mixed_step - free_step) * 1e3:.2f} ms against "
          f"{per_step * 1e3:.2f} ms spent on the mask and matcher")


if __name__ == "__main__":
    main()
