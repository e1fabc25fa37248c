"""Write a checkpoint of a real model's shape with seeded random weights (no download), for
``inflight bench --model DIR`` against vLLM on the same files.

Usage: ``.venv/bin/python -m benchmarks.make_arch_checkpoint qwen3-0.6b /tmp/qwen3-0.6b``; the shapes
are ``benchmarks/gpucheck/arch_models.py``'s ``BENCH_ARCHS`` (configs copied from the
published ``config.json``; ``qwen3-moe-small`` is Qwen3-30B-A3B cut to 6 layers and 32
experts, ``qwen3-moe-12l`` the same with 12 layers). Weights are bf16 (the engines convert
them to the run's ``--dtype``), the tokenizer is the tiny test one (the bench's workloads
are token ids, mapped into the vocabulary), so greedy output is meaningless text of the
requested length (``ignore_eos``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.gpucheck.arch_models import BENCH_ARCHS, build_random_checkpoint


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("arch", choices=sorted(BENCH_ARCHS))
    p.add_argument("directory", type=Path)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if (args.directory / "config.json").is_file():
        print(f"{args.directory}: already written")
        return 0
    build_random_checkpoint(args.directory, BENCH_ARCHS[args.arch], seed=args.seed,
                            device=torch.device("cpu"))
    size = sum(f.stat().st_size for f in args.directory.glob("*.safetensors"))
    print(f"{args.directory}: {args.arch}, {size / 2**30:.2f} GiB of bf16 weights")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
