"""Decode attention of the native CPU kernel per instruction-set build, against the torch
reference, on one synthetic paged batch (one layer of SmolLM2's shape: 9 query heads,
3 KV heads, head_dim 64).

    python benchmarks/attention_isa.py [--seqs 256] [--context 150] [--threads 2]

Prints one JSON line per build this CPU runs, and one for the reference: ms per call.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from cli.bench.machine import cpu_description
from kernels import cpu_native, reference


def _time(fn, repeats: int) -> float:
    for _ in range(2):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1000


def main() -> None:
    """Time every build and the reference on the same batch."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=256)
    parser.add_argument("--context", type=int, default=150)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's tests/
    from tests.kernels.paged_batch import make_paged_batch

    torch.set_num_threads(args.threads)
    batch = make_paged_batch([args.context] * args.seqs, 16, 3, 64, seed=1)
    k, v = batch.k_cache.nan_to_num(0), batch.v_cache.nan_to_num(0)
    query = torch.randn(args.seqs, 9, 64)
    common = {"seqs": args.seqs, "context": args.context, "threads": args.threads,
              "cpu": cpu_description()}
    for isa in cpu_native.supported_isas():
        ext = cpu_native.load_extension(isa)
        ms = _time(lambda ext=ext: cpu_native.decode_attention(
            query, k, v, batch.block_tables, batch.context_lens, 0.125, ext=ext), args.repeats)
        print(json.dumps({"build": isa, "ms_per_call": round(ms, 2), **common}), flush=True)
    ms = _time(lambda: reference.decode_attention(
        query, k, v, batch.block_tables, batch.context_lens, 0.125), 3)
    print(json.dumps({"build": "torch reference", "ms_per_call": round(ms, 2), **common}))


if __name__ == "__main__":
    main()
