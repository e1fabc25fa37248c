"""Generate the long-tail benchmark workload (deterministic, fixed seed).

    .venv/bin/python benchmarks/make_long_tail_workload.py            # rewrites long_tail_workload.jsonl
    .venv/bin/python benchmarks/make_long_tail_workload.py --check    # verifies the committed file

Few requests, widely spread output lengths: the end of every batch and the shape of
interactive traffic, where only a handful of sequences run per step and the per-step
floor decides the speed. 64 natural-language user turns written for this benchmark
(``workloads/long_tail_turns.txt``, none of them in the chat workload), after the chat
workload's shared system prompt, through SmolLM2-135M-Instruct's chat template. Output
lengths are spaced geometrically from 8 to 512 tokens (8 x 64^(i/63), rounded) and
shuffled with a fixed seed, used as ``max_tokens`` with ``ignore_eos``: submitted at once,
the run starts with 64 sequences and ends with one, the longest, decoding alone.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository

from benchmarks.make_chat_workload import chat_requests, generator_main, read_turns
from cli.bench.workload import BenchRequest

SEED = 28
SHORTEST, LONGEST = 8, 512
HERE = Path(__file__).resolve().parent
TURNS_PATH = HERE / "workloads" / "long_tail_turns.txt"
DEFAULT_PATH = HERE / "long_tail_workload.jsonl"


def output_lengths(count: int, seed: int = SEED) -> list[int]:
    """``count`` lengths from SHORTEST to LONGEST in geometric steps, in a seeded order."""
    ratio = LONGEST / SHORTEST
    lengths = [round(SHORTEST * ratio ** (i / (count - 1))) for i in range(count)]
    order = np.random.default_rng(seed).permutation(count)
    return [lengths[i] for i in order]


def make_long_tail_workload(tokenizer, seed: int = SEED) -> list[BenchRequest]:
    """One request per turn of ``long_tail_turns.txt``."""
    turns = read_turns(TURNS_PATH)
    return chat_requests(tokenizer, turns, output_lengths(len(turns), seed), "tail")


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check, verify) the long-tail workload file and print its statistics."""
    return generator_main(argv, description=__doc__.splitlines()[0], default_path=DEFAULT_PATH,
                          seed=SEED, build=make_long_tail_workload)


if __name__ == "__main__":
    sys.exit(main())
