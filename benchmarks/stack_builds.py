"""The decode stack (``kernels/csrc/decoder_cpu.cpp``) built with different compile-time
settings, timed against each other on one running batch in alternating rounds.

    python benchmarks/stack_builds.py [--model smollm2-135m] [--batches 1,8,64]
        [--variant ATTN_PREFETCH_BLOCKS=4] [--variant LINEAR_MC_ROWS=256+ATTN_PULL_MAX_TOKENS=0]
        [--steps 8] [--rounds 5] [--context 300] [--threads 2] [--json out.json]

Where ``benchmarks/linear_builds.py`` times the linear kernel alone, this times whole decode
steps of the engine: the stack includes the linear, attention and element-wise sources, so
a ``--variant`` may set any of their macros (``+``-joined ``NAME=VALUE``, over the shipped
flags for this CPU). Per batch size, ``B`` requests of ``--context`` prompt tokens are
prefilled once; then every round runs ``--steps`` decode steps with each build in turn
(one untimed step after each swap), so every build sees the same sequences at nearly the
same lengths, and the row gives each build's steps' mean ms per round and the median of
its per-round ratio to the default's. On a virtual machine whose read rate moves from
minute to minute, only these paired ratios mean anything.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from types import ModuleType
from typing import Any

from benchmarks.linear_builds import variant_build_name, variant_flags
from benchmarks.step_floor import admit_and_prefill
from cli.bench.machine import cpu_description
from kernels import cpu_decoder, cpu_linear, cpu_native
from worker.engine import EngineArgs, LLMEngine
from worker.engine.models.native_stack import NativeDecodeStack


def build_stack(variant: str, isa: str) -> ModuleType:
    """The decode stack's module built for ``isa`` with ``variant``'s macros ("default": as
    shipped)."""
    if variant == "default":
        return cpu_decoder.load(isa)
    flags = cpu_linear.chosen_build_flags() + variant_flags(variant)  # the variant's macros last
    return cpu_native.build(variant_build_name("decoder", variant), "decoder_cpu.cpp", isa, flags)


def alternate(engine: LLMEngine, stacks: dict[str, Any], batch: int, context: int, steps: int,
              rounds: int) -> dict[str, list[float]]:
    """Each build's mean ms per decode step in every round, ``batch`` sequences running in
    every timed step (checked); the requests are aborted after the rounds."""
    model = engine.runner.model
    native = model.native_stack
    if not isinstance(native, NativeDecodeStack):
        raise RuntimeError("this model and engine take no native decode stack")
    # the prompts' prefill may let the first sequences decode a few tokens early
    ids = admit_and_prefill(engine, batch, context, id_prefix="stack-",
                            max_tokens=(steps + 1) * rounds * len(stacks) + 64)
    times: dict[str, list[float]] = {name: [] for name in stacks}
    for _ in range(rounds):
        for name, stack in stacks.items():
            native.stack = stack
            engine.step()  # untimed: the first step after a swap finds the other build's caches
            start = time.perf_counter()
            for _ in range(steps):
                _, stats = engine.step()
                if stats.num_decode_tokens != batch:
                    raise RuntimeError(f"a timed step ran {stats.num_decode_tokens} of {batch} sequences")
            times[name].append((time.perf_counter() - start) / steps * 1e3)
    for request_id in ids:
        engine.abort_request(request_id)
    while engine.has_unfinished_requests():
        engine.step()
    return times


def main() -> None:
    """Time every build at every batch size; print and optionally save the rows."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    sizes = [int(b) for b in args.batches.split(",")]
    names = ["default", *args.variant]
    longest = args.context + (args.steps + 1) * args.rounds * len(names) + 64
    engine = LLMEngine(EngineArgs(model=args.model, max_num_seqs=max(sizes), num_threads=args.threads,
                                  max_num_batched_tokens=max(4096, args.context * 8),
                                  num_kv_blocks=max(sizes) * -(-longest // 16) + 64))
    isa = cpu_native.default_isa()
    stacks: dict[str, Any] = {}
    for name in names:  # one stack object per build, over the engine's weights and caches
        stacks[name] = NativeDecodeStack(engine.runner.model, engine.runner.kv_caches,
                                         build_stack(name, isa)).stack
    results = []
    for batch in sizes:
        times = alternate(engine, stacks, batch, args.context, args.steps, args.rounds)
        ratios = {name: statistics.median(t / d for t, d in zip(times[name], times["default"], strict=True))
                  for name in names}
        row = {"batch": batch, "ms_per_round": {n: [round(t, 2) for t in times[n]] for n in names},
               "median_ratio_to_default": {n: round(r, 3) for n, r in ratios.items()}}
        results.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        report = {"model": args.model, "isa": isa, "threads": args.threads, "context": args.context,
                  "steps": args.steps, "rounds": args.rounds, "cpu": cpu_description(), "results": results}
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1)


if __name__ == "__main__":
    main()
