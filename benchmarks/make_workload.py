"""Generate the fixed heavy-tailed engine benchmark workload (deterministic, fixed seed).

    .venv/bin/python benchmarks/make_workload.py            # rewrites heavy_tailed.jsonl
    .venv/bin/python benchmarks/make_workload.py --check    # verifies the committed file

64 requests. Prompts: 20 to 200 token ids (uniform lengths), ids drawn uniformly from
[32, 49152) (SmolLM2's vocabulary, past its special tokens; the content does not change
the compute). Output lengths: lognormal(mu=4.4, sigma=1.0) rounded and clipped to
[8, 512], used as max_tokens with ignore_eos, so every request produces exactly that many
tokens. U_static for cohorts of 16 is printed: 0.307 for seed 7, the first seed whose
U_static rounds to 0.31 (the seed was picked by that rule alone).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from cli.bench.workload import (
    BenchRequest,
    static_utilization,
    write_or_check,
)

SEED = 7  # the first seed >= 0 whose U_static rounds to 0.31
NUM_REQUESTS = 64
PROMPT_LEN = (20, 200)
TOKEN_ID_RANGE = (32, 49152)
LOGNORMAL_MU = 4.4
LOGNORMAL_SIGMA = 1.0
OUTPUT_CLIP = (8, 512)
COHORT = 16
DEFAULT_PATH = Path(__file__).resolve().parent / "heavy_tailed.jsonl"


def make_workload(seed: int = SEED, num_requests: int = NUM_REQUESTS) -> list[BenchRequest]:
    """The workload's requests; the same seed always gives the same list."""
    rng = np.random.default_rng(seed)
    prompt_lens = rng.integers(PROMPT_LEN[0], PROMPT_LEN[1] + 1, size=num_requests)
    outputs = np.clip(np.rint(rng.lognormal(LOGNORMAL_MU, LOGNORMAL_SIGMA, size=num_requests)),
                      *OUTPUT_CLIP).astype(int)
    requests = []
    for i, (n_prompt, n_out) in enumerate(zip(prompt_lens, outputs, strict=True)):
        ids = rng.integers(*TOKEN_ID_RANGE, size=int(n_prompt)).tolist()
        requests.append(BenchRequest(f"req-{i:02d}", [int(t) for t in ids], int(n_out)))
    return requests


def describe(requests: list[BenchRequest]) -> str:
    """One paragraph of workload statistics, U_static and the ideal speed-up 1/U_static."""
    outs = [r.max_tokens for r in requests]
    prompts = [len(r.prompt_token_ids) for r in requests]
    u = static_utilization(outs, COHORT)
    return (f"{len(requests)} requests; prompt tokens {min(prompts)}-{max(prompts)} "
            f"(sum {sum(prompts)}); output tokens {min(outs)}-{max(outs)}, "
            f"median {int(np.median(outs))}, mean {np.mean(outs):.1f}, sum {sum(outs)}; "
            f"cohort maxima {[max(outs[i:i + COHORT]) for i in range(0, len(outs), COHORT)]}; "
            f"U_static(cohorts of {COHORT}) = {u:.4f}, ideal 1/U_static = {1 / u:.3f}")


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check, verify) the workload file and print its statistics."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_PATH)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--check", action="store_true",
                        help="verify that --out equals a fresh generation; write nothing")
    args = parser.parse_args(argv)
    requests = make_workload(args.seed)
    if not write_or_check(args.out, requests, check=args.check,
                          source=f"make_workload(seed={args.seed})"):
        return 1
    print(f"{args.out}: {describe(requests)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
