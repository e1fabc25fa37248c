"""Time the Triton paged-attention kernels on a CUDA GPU and compare with the copy bandwidth.

Usage: ``python benchmarks/kernel_bench.py [--dtype bf16] [--iters 50] ...`` (``--help`` lists all).

Every timing is the median of ``--iters`` launches measured with CUDA events, each launch
preceded by an untimed write of a buffer larger than L2 so no launch reads a warm cache.
The yardstick is a device-to-device copy of a large buffer measured in the same run:
decode and write_kv are memory-bound, so "% of copy" (bytes they must move over their time,
against the copy's bytes read + written over its time) says how close they get to the
memory system's practical limit. Prefill is compute-bound and is also reported in TFLOP/s.
Before timing, each kernel is checked against the pure-torch reference on a small input.

CUDA only: without a CUDA device the script says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
L2_FLUSH_BYTES = 256 * 2**20


@dataclass
class Shape:
    """Model attention shape shared by every benchmark in a run."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    @property
    def elem(self) -> int:
        """Bytes per element."""
        return torch.tensor([], dtype=self.dtype).element_size()


def time_cuda(fn: Callable[[], object], iters: int, warmup: int, flush: torch.Tensor) -> float:
    """Median milliseconds of ``fn`` over ``iters`` launches (CUDA events, L2 flushed)."""
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for start, end in zip(starts, ends, strict=True):
        flush.zero_()  # untimed: evicts the previous launch's data from L2
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))


def copy_bandwidth(iters: int, warmup: int, flush: torch.Tensor) -> float:
    """GB/s of a 1 GiB device-to-device copy (bytes read + bytes written over time)."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_cuda(lambda: dst.copy_(src), iters, warmup, flush)
    return 2 * src.numel() / ms / 1e6


def paged_cache(
    shape: Shape, context_lens: list[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random K/V caches holding ``context_lens`` tokens in shuffled blocks, and the table."""
    blocks = [-(-n // shape.block_size) for n in context_lens]
    num_blocks, max_blocks = sum(blocks), max(blocks)
    cache_shape = (num_blocks, shape.block_size, shape.num_kv_heads, shape.head_dim)
    k_cache = torch.randn(cache_shape, device="cuda").to(shape.dtype)
    v_cache = torch.randn(cache_shape, device="cuda").to(shape.dtype)
    order = torch.randperm(num_blocks, device="cuda")
    table = torch.zeros(len(context_lens), max_blocks, dtype=torch.int32, device="cuda")
    start = 0
    for i, nb in enumerate(blocks):
        table[i, :nb] = order[start : start + nb]
        start += nb
    lens = torch.tensor(context_lens, dtype=torch.int32, device="cuda")
    return k_cache, v_cache, table, lens


def check_against_reference(shape: Shape) -> None:
    """Each Triton kernel agrees with kernels/reference.py on a small ragged batch."""
    from kernels import reference
    from kernels.triton_backend import TRITON_BACKEND as tri

    lens = [1, 17, 300, 2100]
    k_cache, v_cache, table, ctx = paged_cache(shape, lens)
    scale = shape.head_dim**-0.5
    atol = 1e-4 if shape.dtype == torch.float32 else 2e-2
    q = torch.randn(len(lens), shape.num_heads, shape.head_dim, device="cuda").to(shape.dtype)
    got = tri.decode_attention(q, k_cache, v_cache, table, ctx, scale)
    want = reference.decode_attention(q, k_cache, v_cache, table, ctx, scale)
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=atol)
    q_lens = [1, 17, 100, 64]
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], device="cuda")
    qp = torch.randn(sum(q_lens), shape.num_heads, shape.head_dim, device="cuda").to(shape.dtype)
    got = tri.prefill_attention(qp, k_cache, v_cache, table, cu, ctx, scale)
    want = reference.prefill_attention(qp, k_cache, v_cache, table, cu, ctx, scale)
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=atol)
    slots = torch.randperm(k_cache.shape[0] * shape.block_size, device="cuda")[:64]
    kv = torch.randn(64, shape.num_kv_heads, shape.head_dim, device="cuda").to(shape.dtype)
    k2, v2 = k_cache.clone(), v_cache.clone()
    tri.write_kv(kv, kv, k_cache, v_cache, slots)
    reference.write_kv(kv, kv, k2, v2, slots)
    torch.testing.assert_close(k_cache, k2, atol=0, rtol=0)


def bench_decode(
    shape: Shape,
    batches: list[int],
    contexts: list[int],
    args: argparse.Namespace,
    flush: torch.Tensor,
    copy_gbs: float,
) -> None:
    """Decode: one query per sequence over ``context`` cached tokens, every batch size."""
    from kernels.triton_decode_attention import choose_partition_size, decode_attention

    print(
        f"\n{'decode':<8}{'batch':>6}{'context':>9}{'splits':>8}{'us':>10}{'GB/s':>9}{'% copy':>8}"
    )
    scale = shape.head_dim**-0.5
    for context in contexts:
        for batch in batches:
            kv_bytes = 2 * batch * context * shape.num_kv_heads * shape.head_dim * shape.elem
            if kv_bytes > args.max_cache_gib * 2**30:
                print(f"{'':<8}{batch:>6}{context:>9}  skipped: cache over --max-cache-gib")
                continue
            k_cache, v_cache, table, lens = paged_cache(shape, [context] * batch)
            q = torch.randn(batch, shape.num_heads, shape.head_dim, device="cuda")
            q = q.to(shape.dtype)
            out = torch.empty_like(q)
            ms = time_cuda(
                partial(decode_attention, q, k_cache, v_cache, table, lens, scale, out=out),
                args.iters,
                args.warmup,
                flush,
            )
            moved = kv_bytes + 2 * q.numel() * shape.elem + table.numel() * 4
            gbs = moved / ms / 1e6
            max_context = table.shape[1] * shape.block_size
            size = choose_partition_size(batch, shape.num_kv_heads, max_context, q.device)
            splits = -(-max_context // size)
            print(
                f"{'':<8}{batch:>6}{context:>9}{splits:>8}{ms * 1e3:>10.1f}"
                f"{gbs:>9.0f}{100 * gbs / copy_gbs:>7.0f}%"
            )
            del k_cache, v_cache


def bench_write_kv(
    shape: Shape,
    token_counts: list[int],
    args: argparse.Namespace,
    flush: torch.Tensor,
    copy_gbs: float,
) -> None:
    """write_kv of ``tokens`` new tokens into scattered slots of a large cache."""
    from kernels.triton_write_kv import write_kv

    print(f"\n{'write_kv':<8}{'tokens':>8}{'us':>10}{'GB/s':>9}{'% copy':>8}")
    num_blocks = max(token_counts) // shape.block_size * 4 + 16
    cache_shape = (num_blocks, shape.block_size, shape.num_kv_heads, shape.head_dim)
    k_cache = torch.empty(cache_shape, dtype=shape.dtype, device="cuda")
    v_cache = torch.empty_like(k_cache)
    for tokens in token_counts:
        key = torch.randn(tokens, shape.num_kv_heads, shape.head_dim, device="cuda")
        key = key.to(shape.dtype)
        value = torch.randn_like(key)
        slots = torch.randperm(num_blocks * shape.block_size, device="cuda")[:tokens]
        ms = time_cuda(
            partial(write_kv, key, value, k_cache, v_cache, slots),
            args.iters,
            args.warmup,
            flush,
        )
        moved = 2 * 2 * key.numel() * shape.elem + slots.numel() * 8  # K, V read + written
        gbs = moved / ms / 1e6
        print(f"{'':<8}{tokens:>8}{ms * 1e3:>10.1f}{gbs:>9.0f}{100 * gbs / copy_gbs:>7.0f}%")


def bench_prefill(
    shape: Shape,
    layouts: list[tuple[int, int, int]],
    args: argparse.Namespace,
    flush: torch.Tensor,
) -> None:
    """Prefill of ``seqs`` chunks of ``q_len`` queries after ``prefix`` cached tokens each.

    Compute-bound: TFLOP/s is the figure of merit; GB/s (K/V and Q/O once) is for context.
    """
    from kernels.triton_prefill_attention import prefill_attention

    print(
        f"\n{'prefill':<8}{'seqs':>6}{'q_len':>7}{'prefix':>8}{'us':>10}{'TFLOP/s':>9}{'GB/s':>8}"
    )
    scale = shape.head_dim**-0.5
    for seqs, q_len, prefix in layouts:
        context = prefix + q_len
        k_cache, v_cache, table, lens = paged_cache(shape, [context] * seqs)
        q = torch.randn(seqs * q_len, shape.num_heads, shape.head_dim, device="cuda")
        q = q.to(shape.dtype)
        cu = torch.arange(0, seqs + 1, device="cuda", dtype=torch.int32) * q_len
        out = torch.empty_like(q)
        ms = time_cuda(
            partial(prefill_attention, q, k_cache, v_cache, table, cu, lens, scale, out=out),
            args.iters,
            args.warmup,
            flush,
        )
        # Query i sees prefix + i + 1 keys; 2 matmuls of 2 flops per multiply-add.
        pairs = seqs * (q_len * prefix + q_len * (q_len + 1) // 2)
        flops = 4 * pairs * shape.num_heads * shape.head_dim
        kv_bytes = 2 * seqs * context * shape.num_kv_heads * shape.head_dim * shape.elem
        gbs = (kv_bytes + 2 * q.numel() * shape.elem) / ms / 1e6
        print(
            f"{'':<8}{seqs:>6}{q_len:>7}{prefix:>8}{ms * 1e3:>10.1f}"
            f"{flops / ms / 1e9:>9.1f}{gbs:>8.0f}"
        )
        del k_cache, v_cache


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--num-heads", type=int, default=32)
    p.add_argument("--num-kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--max-cache-gib", type=float, default=40.0, help="skip bigger decode caches")
    p.add_argument("--skip-engine", action="store_true", help="kernels only, no end-to-end run")
    p.add_argument("--engine-model", default="smollm2-135m")
    p.add_argument("--engine-out", default="benchmarks/results/gpu")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run every benchmark; returns the process exit status."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if not torch.cuda.is_available():
        print(
            "benchmarks/kernel_bench.py needs a CUDA GPU (the Triton kernels run on CUDA); none found."
        )
        return 2
    torch.manual_seed(0)
    shape = Shape(
        args.num_heads, args.num_kv_heads, args.head_dim, args.block_size, DTYPES[args.dtype]
    )
    print(
        f"device: {torch.cuda.get_device_name()}  dtype: {args.dtype}  heads: "
        f"{shape.num_heads}/{shape.num_kv_heads} kv  head_dim: {shape.head_dim}  "
        f"block_size: {shape.block_size}  median of {args.iters}"
    )
    check_against_reference(shape)
    print("correctness vs kernels/reference.py: ok")
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    copy_gbs = copy_bandwidth(args.iters, args.warmup, flush)
    print(f"device-to-device copy (1 GiB, read + write): {copy_gbs:.0f} GB/s")
    bench_decode(shape, args.batches, args.contexts, args, flush, copy_gbs)
    bench_write_kv(shape, sorted({*args.batches, 2048, 8192}), args, flush, copy_gbs)
    layouts = [(1, 2048, 0), (1, 4096, 0), (4, 1024, 0), (8, 512, 2048), (1, 512, 8192)]
    bench_prefill(shape, layouts, args, flush)
    if not args.skip_engine:
        bench_engine(args)
    return 0


def bench_engine(args: argparse.Namespace) -> None:
    """End-to-end engine tokens/s on SmolLM2 for the heavy-tailed workload (bf16, Triton,
    decode CUDA graphs), continuous with 16 and 64 slots against its static policy."""
    from cli.bench.report import format_report
    from cli.bench.runner import BenchOptions, run_benchmark

    opts = BenchOptions(
        model=args.engine_model, dtype="bfloat16", out_dir=Path(args.engine_out),
        configs=["static-16", "continuous-16", "continuous-64", "hf-16"],
        command="python benchmarks/kernel_bench.py",
    )
    print(format_report(run_benchmark(opts)))


if __name__ == "__main__":
    sys.exit(main())
