"""Memory-bound figures: decode attention against a copy, decode steps against weight streaming.

Decode attention must read every cached K and V row of the batch once, so its achieved
bandwidth (those bytes over its time) is compared with a same-device copy measured in
the same run (bytes read + written over its time). A decode step of a small batch must
read every weight once, so its time is compared with the weight-streaming bound:
bytes of weights / measured copy bandwidth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from benchmarks.gpucheck.arch_models import weight_bytes
from benchmarks.gpucheck.device import time_ms
from benchmarks.gpucheck.graphs import DecodeStep, random_decode_step
from kernels import AttentionBackend


def paged_kv(batch: int, context: int, *, num_kv_heads: int, head_dim: int, block_size: int,
             dtype: torch.dtype, device: torch.device
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random K/V caches holding ``batch`` contexts of ``context`` tokens in shuffled blocks,
    their block table and context lengths."""
    per_seq = -(-context // block_size)
    num_blocks = batch * per_seq
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, device=device).to(dtype)
    v_cache = torch.randn(shape, device=device).to(dtype)
    table = torch.randperm(num_blocks, device=device).view(batch, per_seq)  # [batch, per_seq]
    lens = torch.full((batch,), context, dtype=torch.long, device=device)
    return k_cache, v_cache, table, lens


def decode_attention_bandwidth(backend: AttentionBackend, *, batch: int, context: int,
                               num_heads: int, num_kv_heads: int, head_dim: int,
                               block_size: int, dtype: torch.dtype, device: torch.device,
                               iters: int, flush: torch.Tensor | None) -> dict[str, Any]:
    """Median time of one decode attention call and the GB/s of its K/V reads."""
    k_cache, v_cache, table, lens = paged_kv(batch, context, num_kv_heads=num_kv_heads,
                                             head_dim=head_dim, block_size=block_size,
                                             dtype=dtype, device=device)
    query = torch.randn(batch, num_heads, head_dim, device=device).to(dtype)
    scale = head_dim**-0.5
    ms = time_ms(lambda: backend.decode_attention(query, k_cache, v_cache, table, lens, scale),
                 device, iters=iters, flush=flush)
    kv_bytes = 2 * batch * context * num_kv_heads * head_dim * k_cache.element_size()
    return {"batch": batch, "context": context, "ms": ms, "kv_bytes": kv_bytes,
            "gb_per_s": kv_bytes / ms / 1e6}


def _decode_forward(runner: Any, step: DecodeStep, graphs: Any = None
                    ) -> tuple[Callable[[], torch.Tensor], bool]:
    """The engine's forward for ``step``: ``graphs`` (default: the engine's decode graphs)
    when they fit, else eager."""
    graphs = graphs if graphs is not None else runner.decode_graphs
    if graphs is not None and graphs.fits(step.meta.num_seqs, step.meta.block_tables.shape[1]):
        return (lambda: graphs.run(step.input_ids, step.meta)), True
    return (lambda: runner.model(step.input_ids, step.meta, runner.kv_caches,
                                 runner.backend)), False


@contextmanager
def torch_layer_ops(engine: Any) -> Iterator[Any]:
    """The engine's model with its element-wise ops as the torch reference ops (several
    kernels each) instead of the device's fused ones, and decode graphs captured so: the
    other side of an A/B of those ops in one run. The model is given its ops back after."""
    from worker.engine.decode_graphs import DecodeGraphs

    runner = engine.runner
    model = runner.model
    saved = model.native_ops
    model.native_ops = False
    try:
        graphs = runner.decode_graphs
        if graphs is not None:
            graphs = DecodeGraphs(model=model, kv_caches=runner.kv_caches, backend=runner.backend,
                                  device=runner.device, max_batch=graphs.ladder[-1],
                                  max_blocks_per_seq=graphs.block_tables.shape[1])
            graphs.capture()
        yield graphs
    finally:
        model.native_ops = saved


def kernels_per_call(forward: Callable[[], Any], device: torch.device, calls: int = 5
                     ) -> dict[str, float] | None:
    """GPU kernels one call of ``forward`` launches and their summed time (torch.profiler;
    a graph replay's kernels count one by one); None off CUDA."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    forward()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            forward()
        torch.cuda.synchronize(device)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy_us = sum(e.device_time for e in kernels)
    return {"kernels": len(kernels) / calls, "kernel_ms": busy_us / calls / 1e3}


@torch.inference_mode()
def decode_step_times(engine: Any, batches: list[int], *, context: int, iters: int,
                      copy_gbs: float, flush: torch.Tensor | None, graphs: Any = None
                      ) -> list[dict[str, Any]]:
    """The engine's forward for a decode step of each batch size (through ``graphs``,
    default the engine's decode graphs, when they fit) against the weight-streaming bound,
    with the kernels each step launches and their summed time where a profile could be read."""
    runner = engine.runner
    model = runner.model
    bound_ms = weight_bytes(model) / copy_gbs / 1e6
    rows = []
    for batch in batches:
        step = random_decode_step(batch, num_blocks=runner.k_pool.shape[1],
                                  block_size=runner.block_size, max_context=context,
                                  vocab_size=model.config.vocab_size, device=runner.device,
                                  seed=batch)
        forward, graphed = _decode_forward(runner, step, graphs)
        ms = time_ms(forward, runner.device, iters=iters, flush=flush)
        row: dict[str, Any] = {
            "batch": batch, "mean_context": float(step.meta.context_lens.float().mean()),
            "step_ms": ms, "weight_bound_ms": bound_ms, "over_bound": ms / bound_ms,
            "graphs": graphed}
        try:
            row["profile"] = kernels_per_call(forward, runner.device)
        except Exception as exc:  # a profiler that cannot read the device: say so, keep the times
            row["profile"] = {"error": f"{type(exc).__name__}: {exc}"}
        rows.append(row)
    return rows
