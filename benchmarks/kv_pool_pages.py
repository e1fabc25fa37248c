"""Decode attention over KV pools whose memory was mapped in different ways, timed against
each other in paired rounds in one process.

    python -m benchmarks.kv_pool_pages [--batches 1,8,64] [--context 300] [--layers 30]
        [--blocks 1456] [--rounds 9] [--threads 2] [--json out.json]

Each pool is one layer's K and V caches of SmolLM2-135M's shape ([blocks, 16, 3, 64] fp32),
``--layers`` of them per kind, every page written (as in a pool that has served a while).
The kinds: ``shipped`` (``kv_pool_tensor``: a private map asking for transparent huge
pages), ``shared`` (an anonymous map as Python makes it by default, MAP_SHARED: what the
engine used before), ``private`` (a private map of 4 KB pages) and ``shipped_again`` (a
second pool of the shipped kind, the control: how far two like pools differ). Per batch size
``B`` every sequence's ``--context`` keys sit in randomly placed blocks; a round runs, for
each kind in turn, one decode attention call per layer with 14 MB of other memory read
before each (a layer's weights, as the step's linears read them, evicting the page tables
the walk used), after a 256 MB write that pushes the pools out of the caches. The row gives
each kind's median ms over the layers and the median of its per-round ratio to ``shared``.
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import statistics
import time
from pathlib import Path

import torch

from cli.bench.machine import cpu_description
from kernels import cpu_native
from worker.engine.model_runner import kv_pool_tensor

BLOCK_SIZE, KV_HEADS, HEAD_DIM, HEADS = 16, 3, 64, 9  # SmolLM2-135M
KINDS = ("shared", "private", "shipped", "shipped_again")


def pool(kind: str, blocks: int) -> torch.Tensor:
    """One layer's cache [blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM] of ``kind``, every page written."""
    shape = (blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    if kind.startswith("shipped"):
        cache = kv_pool_tensor(shape, torch.float32, torch.device("cpu"))
    else:
        flags = (mmap.MAP_SHARED if kind == "shared" else mmap.MAP_PRIVATE) | mmap.MAP_ANONYMOUS
        region = mmap.mmap(-1, math.prod(shape) * 4, flags=flags)
        cache = torch.frombuffer(region, dtype=torch.float32, count=math.prod(shape)).view(shape)
    return cache.normal_()


def huge_pages_kib() -> int:
    """This process's anonymous memory held in transparent huge pages (0 where unknown)."""
    rollup = Path("/proc/self/smaps_rollup")
    if not rollup.exists():
        return 0
    for line in rollup.read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def time_kinds(pools: dict[str, list[tuple[torch.Tensor, torch.Tensor]]], batch: int, context: int,
               rounds: int, seed: int = 0) -> dict[str, list[float]]:
    """Each kind's ms for one decode attention call per layer, in every round."""
    ext = cpu_native.load_extension()
    blocks = next(iter(pools.values()))[0][0].shape[0]
    per_seq = -(-context // BLOCK_SIZE)
    if batch * per_seq > blocks:
        raise ValueError(f"{batch} x {context} keys need {batch * per_seq} blocks; the pools hold {blocks}")
    generator = torch.Generator().manual_seed(seed)
    tables = torch.randperm(blocks, generator=generator)[: batch * per_seq].view(batch, per_seq)
    lens = torch.full((batch,), context, dtype=torch.int64)
    cu_q = torch.arange(batch + 1, dtype=torch.int64)  # one query per sequence
    query = torch.randn(batch, HEADS, HEAD_DIM, generator=generator)
    layers = len(next(iter(pools.values())))
    weights = torch.ones(layers, 14 * 2**20 // 4)  # [layers, 14 MB]: one layer's linears each
    evict = torch.empty(256 * 2**20 // 4)
    times: dict[str, list[float]] = {kind: [] for kind in pools}
    for r in range(rounds):
        for kind, caches in pools.items():
            evict.fill_(float(r))
            total = 0.0
            for layer, (k_cache, v_cache) in enumerate(caches):
                weights[layer].sum()
                start = time.perf_counter()
                ext.paged_attention(query, k_cache, v_cache, tables, cu_q, lens, HEAD_DIM ** -0.5, 0, 0.0)
                total += time.perf_counter() - start
            times[kind].append(total * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--blocks", type=int, default=1456, help="blocks per layer and cache (18 MB: 1 GiB a kind)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pools = {kind: [(pool(kind, args.blocks), pool(kind, args.blocks)) for _ in range(args.layers)]
             for kind in KINDS}
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    header = {"cpu": cpu_description(), "threads": args.threads, "context": args.context,
              "layers": args.layers, "blocks": args.blocks, "rounds": args.rounds,
              "thp_mode": thp.read_text().strip() if thp.exists() else None,
              "anon_huge_pages_kib": huge_pages_kib()}
    print(json.dumps(header), flush=True)
    results = []
    for batch in map(int, args.batches.split(",")):
        times = time_kinds(pools, batch, args.context, args.rounds)
        row = {"batch": batch,
               "median_ms": {k: round(statistics.median(t), 3) for k, t in times.items()},
               "median_ratio_to_shared": {k: round(statistics.median(a / b for a, b in zip(t, times["shared"],
                                                                                                strict=True)), 3)
                                          for k, t in times.items()}}
        results.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({**header, "results": results}, indent=1))


if __name__ == "__main__":
    main()
