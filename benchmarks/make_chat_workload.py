"""Generate the realistic chat benchmark workload (deterministic, fixed seed).

    .venv/bin/python benchmarks/make_chat_workload.py            # rewrites chat_workload.jsonl
    .venv/bin/python benchmarks/make_chat_workload.py --check    # verifies the committed file

Every request is one natural-language user turn from ``workloads/chat_turns.txt`` (263
turns written for this benchmark: coding, science, history, cooking, travel, writing,
money, health, everyday advice), after one shared system prompt, rendered through
SmolLM2-135M-Instruct's chat template with the generation prompt. The shared system prompt
is what real chat traffic looks like and what prefix caching is for; every system in the
benchmark gets the same token ids.

Output lengths are the heavy-tailed distribution of ``make_workload.py`` (lognormal
mu 4.4, sigma 1.0, rounded, clipped to [8, 512]), drawn with their own seed and used as
``max_tokens`` with ``ignore_eos``, so every system produces exactly the same number of
tokens per request.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from cli.bench.workload import BenchRequest, write_or_check

SEED = 12
LOGNORMAL_MU = 4.4
LOGNORMAL_SIGMA = 1.0
OUTPUT_CLIP = (8, 512)
MODEL = "smollm2-135m"
HERE = Path(__file__).resolve().parent
TURNS_PATH = HERE / "workloads" / "chat_turns.txt"
DEFAULT_PATH = HERE / "chat_workload.jsonl"
SYSTEM_PROMPT = (
    "You are Inflight Assistant, a helpful, patient and accurate assistant. Answer the "
    "user's question clearly and in plain language. When the question is technical, give "
    "a short explanation first and then a concrete example. When you are not sure, say so "
    "instead of guessing. Keep a friendly tone, avoid jargon unless the user uses it "
    "first, and format lists with one item per line."
)


def read_turns(path: Path = TURNS_PATH) -> list[str]:
    """The user turns, one per non-empty line, in file order."""
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def output_lengths(count: int, seed: int = SEED) -> list[int]:
    """``count`` heavy-tailed output lengths; the same seed always gives the same list."""
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(LOGNORMAL_MU, LOGNORMAL_SIGMA, size=count)
    return [int(n) for n in np.clip(np.rint(raw), *OUTPUT_CLIP)]


def make_chat_workload(tokenizer, seed: int = SEED) -> list[BenchRequest]:
    """One request per user turn: system prompt + turn through the chat template."""
    turns = read_turns()
    return chat_requests(tokenizer, turns, output_lengths(len(turns), seed), "chat")


def chat_requests(tokenizer, turns: list[str], lengths: list[int], name: str) -> list[BenchRequest]:
    """One request per user turn, after the shared system prompt, through the chat
    template with the generation prompt; ids ``<name>-000``, ``<name>-001``, ..."""
    requests = []
    for i, (turn, n_out) in enumerate(zip(turns, lengths, strict=True)):
        messages = [{"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": turn}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding in newer releases
            ids = ids["input_ids"]
        requests.append(BenchRequest(f"{name}-{i:03d}", [int(t) for t in ids], n_out))
    return requests


def describe(requests: list[BenchRequest]) -> str:
    """One line of workload statistics."""
    outs = [r.max_tokens for r in requests]
    prompts = [len(r.prompt_token_ids) for r in requests]
    return (f"{len(requests)} requests; prompt tokens {min(prompts)}-{max(prompts)} "
            f"(sum {sum(prompts)}); output tokens {min(outs)}-{max(outs)}, "
            f"median {int(np.median(outs))}, mean {np.mean(outs):.1f}, sum {sum(outs)}")


def generator_main(argv: list[str] | None, *, description: str, default_path: Path, seed: int,
                   build: Callable[[Any, int], list[BenchRequest]]) -> int:
    """The command line of a chat-template workload generator: write (or with --check,
    verify) ``build(tokenizer, seed)``'s requests and print their statistics."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=default_path)
    parser.add_argument("--seed", type=int, default=seed)
    parser.add_argument("--check", action="store_true",
                        help="verify that --out equals a fresh generation; write nothing")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from worker.engine.models.loader import resolve_checkpoint_dir

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_checkpoint_dir(MODEL)))
    requests = build(tokenizer, args.seed)
    if not write_or_check(args.out, requests, check=args.check,
                          source=f"{build.__name__}(seed={args.seed})"):
        return 1
    print(f"{args.out}: {describe(requests)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check, verify) the chat workload file and print its statistics."""
    return generator_main(argv, description=__doc__.splitlines()[0], default_path=DEFAULT_PATH,
                          seed=SEED, build=make_chat_workload)


if __name__ == "__main__":
    sys.exit(main())
