"""Throughput on a seeded heavy-tailed workload: this engine against Hugging Face.

The workload follows benchmarks/make_workload.py (uniform prompt lengths, lognormal
output lengths, ``ignore_eos``) scaled up: more requests and outputs clipped at
``max_output`` (1,024 on a GPU). It is generated from its seed each run, never stored.

Runs, one after another in this process, each over the whole workload unless its time
cap ends it early (then only the finished requests count and the run says so):

- this engine, continuous batching, with and without CUDA graphs;
- this engine, padded static batching: the ``static-padded`` policy where the engine has
  one; otherwise emulated with the ``static`` policy by giving every member of a cohort
  its cohort's longest ``max_tokens`` (rows keep decoding as padding), counting only each
  request's own tokens as useful;
- HF static ``generate`` on left-padded cohorts (padding rows computed, not counted);
- HF continuous batching (``continuous_batching_context_manager``) with per-request
  ``max_new_tokens``, where the installed transformers has it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from cli.bench.workload import BenchRequest, cohorts

DROPPED_KEYS = ("occupancy", "waiting")  # per-step lists: too long for the report


def make_gpu_workload(*, seed: int, num_requests: int, vocab_size: int, max_output: int,
                      prompt_len: tuple[int, int] = (20, 200), mu: float = 4.4,
                      sigma: float = 1.0, min_output: int = 8) -> list[BenchRequest]:
    """Seeded requests: prompt lengths uniform in ``prompt_len``, outputs
    lognormal(mu, sigma) clipped to [min_output, max_output]."""
    rng = np.random.default_rng(seed)
    prompt_lens = rng.integers(prompt_len[0], prompt_len[1] + 1, size=num_requests)
    outputs = np.clip(np.rint(rng.lognormal(mu, sigma, size=num_requests)),
                      min_output, max_output).astype(int)
    low = min(32, vocab_size // 2)  # past the special tokens of real vocabularies
    return [BenchRequest(f"req-{i:03d}", rng.integers(low, vocab_size, size=int(n)).tolist(),
                         int(out)) for i, (n, out) in enumerate(zip(prompt_lens, outputs,
                                                                    strict=True))]


def workload_summary(requests: Sequence[BenchRequest]) -> dict[str, Any]:
    """Counts and output-length statistics of the workload."""
    outs = [r.max_tokens for r in requests]
    return {"num_requests": len(requests), "useful_tokens": sum(outs),
            "prompt_tokens": sum(len(r.prompt_token_ids) for r in requests),
            "max_tokens_min": min(outs), "max_tokens_median": int(np.median(outs)),
            "max_tokens_max": max(outs)}


def padded_to_cohort_max(requests: Sequence[BenchRequest], slots: int) -> list[BenchRequest]:
    """Each request's ``max_tokens`` raised to its cohort's longest (padded lockstep)."""
    padded = []
    for cohort in cohorts(requests, slots):
        longest = max(r.max_tokens for r in cohort)
        padded += [BenchRequest(r.id, r.prompt_token_ids, longest) for r in cohort]
    return padded


@contextlib.contextmanager
def decode_graphs_disabled(engine: Any) -> Iterator[None]:
    """The engine's decode steps run eagerly inside the block (its graphs stay captured)."""
    graphs = engine.runner.decode_graphs
    engine.runner.decode_graphs = None
    try:
        yield
    finally:
        engine.runner.decode_graphs = graphs


@contextlib.contextmanager
def torch_ops_installed(engine: Any) -> Iterator[None]:
    """The engine's steps run with the torch element-wise ops inside the block, through
    decode graphs captured so (``bandwidth.torch_layer_ops``) in place of its own."""
    from benchmarks.gpucheck.bandwidth import torch_layer_ops

    runner = engine.runner
    own = runner.decode_graphs
    with torch_layer_ops(engine) as graphs:
        runner.decode_graphs = graphs
        try:
            yield
        finally:
            runner.decode_graphs = own


class DeviceBusy:
    """How long the device worked during an engine run: each step's forward and sampling
    bracketed by CUDA events (on the CPU, by the clock: there the host is the device), the
    intervals summed once the run is over. An interval counts whatever the stream did
    between its two events, gaps of a host still launching included, so the figure is an
    upper bound of the device's busy time; against the run's wall time it says how long
    the device waited for the host at least (``fraction`` well below 1: host-bound)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.cuda = engine.device.type == "cuda"
        self.intervals: list[tuple[Any, Any]] = []

    def _mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _bracketed(self, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = self._mark()
            try:
                return fn(*args, **kwargs)
            finally:
                self.intervals.append((start, self._mark()))
        return wrapper

    @contextlib.contextmanager
    def measuring(self) -> Iterator[None]:
        """Bracket the runner's forward and the sampler inside the block."""
        runner, sampler = self.engine.runner, self.engine.sampler
        execute, sample = runner.execute, sampler.sample
        runner.execute, sampler.sample = self._bracketed(execute), self._bracketed(sample)
        try:
            yield
        finally:
            runner.execute, sampler.sample = execute, sample

    def seconds(self) -> float:
        """The summed intervals (waits for the device once, after the run)."""
        if not self.cuda:
            return sum(end - start for start, end in self.intervals)
        torch.cuda.synchronize()
        return sum(start.elapsed_time(end) for start, end in self.intervals) / 1e3


def run_engine_config(engine: Any, requests: Sequence[BenchRequest], *, name: str, slots: int,
                      policy: str, graphs: bool, torch_ops: bool = False) -> dict[str, Any]:
    """One engine run through cli.bench's runner; per-step lists dropped. ``torch_ops``:
    with the torch element-wise ops instead of the device's fused ones (with graphs only).
    ``device_busy_seconds`` and ``device_busy_fraction``: :class:`DeviceBusy` over the run."""
    from cli.bench.engine_run import run_engine

    if torch_ops and not graphs:
        raise ValueError("torch_ops is compared with graphs only")
    context: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if not graphs:
        context = decode_graphs_disabled(engine)
    elif torch_ops:
        context = torch_ops_installed(engine)
    busy = DeviceBusy(engine)
    with context, busy.measuring():
        result = run_engine(engine, requests, name=name, max_num_seqs=slots, policy=policy)
        result["decode_graphs"] = graphs and engine.runner.decode_graphs is not None
    result["device_busy_seconds"] = busy.seconds()
    result["device_busy_fraction"] = result["device_busy_seconds"] / result["wall_seconds"]
    for key in DROPPED_KEYS:
        result.pop(key, None)
    result["element_wise_ops"] = "torch" if torch_ops else "fused"
    return result


def run_engine_padded_static(engine: Any, requests: Sequence[BenchRequest], *, slots: int,
                             has_policy: bool) -> dict[str, Any]:
    """Padded static batching: the engine's policy, or the emulation (module docstring)."""
    if has_policy:
        result = run_engine_config(engine, requests, name="static-padded", slots=slots,
                                   policy="static-padded", graphs=True)
        result["emulated"] = False
        return result
    padded = padded_to_cohort_max(requests, slots)
    result = run_engine_config(engine, padded, name="static-padded", slots=slots,
                               policy="static", graphs=True)
    computed = result["useful_tokens"]
    useful = sum(r.max_tokens for r in requests)
    result.update(emulated=True, computed_tokens=computed, useful_tokens=useful,
                  useful_tokens_per_s=useful / result["wall_seconds"],
                  useful_fraction=useful / computed)
    return result


def _left_padded(batch: Sequence[BenchRequest], pad_id: int, device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r.prompt_token_ids) for r in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)  # [batch, width]
    mask = torch.zeros((len(batch), width), dtype=torch.long)  # [batch, width]
    for row, r in enumerate(batch):
        n = len(r.prompt_token_ids)
        ids[row, width - n:] = torch.tensor(r.prompt_token_ids)
        mask[row, width - n:] = 1
    return ids.to(device), mask.to(device)


def run_hf_static(model: Any, requests: Sequence[BenchRequest], *, batch_size: int,
                  time_cap_s: float) -> dict[str, Any]:
    """HF ``generate`` over left-padded cohorts in workload order, until the time cap."""
    pad = model.config.pad_token_id or 0
    useful = computed = steps = kv_held = kv_used = done = 0
    start = time.perf_counter()
    for batch in cohorts(requests, batch_size):
        if time.perf_counter() - start > time_cap_s:
            break
        ids, mask = _left_padded(batch, pad, model.device)
        new = max(r.max_tokens for r in batch)
        with torch.inference_mode():
            model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, eos_token_id=[], pad_token_id=pad)
        useful += sum(r.max_tokens for r in batch)
        computed += len(batch) * new
        steps += new
        kv_held += len(batch) * (ids.shape[1] + new)
        kv_used += sum(len(r.prompt_token_ids) + r.max_tokens for r in batch)
        done += len(batch)
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
    seconds = time.perf_counter() - start
    return {"kind": "hf-static", "batch_size": batch_size, "finished_requests": done,
            "complete": done == len(requests), "useful_tokens": useful, "wall_seconds": seconds,
            "useful_tokens_per_s": useful / seconds if seconds else None, "num_steps": steps,
            "mean_step_ms": 1000 * seconds / steps if steps else None,
            "slot_utilization": useful / computed if computed else None,
            "kv_waste": 1 - kv_used / kv_held if kv_held else None}


def hf_continuous_available() -> bool:
    """Whether the installed transformers has continuous batching."""
    from transformers import GenerationMixin

    return hasattr(GenerationMixin, "continuous_batching_context_manager")


def run_hf_continuous(model: Any, requests: Sequence[BenchRequest], *, max_batch: int,
                      block_size: int, num_blocks: int, time_cap_s: float) -> dict[str, Any]:
    """HF continuous batching with each request's own ``max_new_tokens``; EOS disabled."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    on_cuda = model.device.type == "cuda"
    gen_config = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0,
                                  max_new_tokens=max(r.max_tokens for r in requests))
    cb_config = ContinuousBatchingConfig(page_size=block_size, num_blocks=num_blocks,
                                         max_requests_per_batch=max_batch,
                                         use_cuda_graph=on_cuda, allow_block_sharing=False)
    expected = {r.id: r.max_tokens for r in requests}
    useful = finished = wrong_lengths = 0
    start = time.perf_counter()
    with model.continuous_batching_context_manager(
            generation_config=gen_config, continuous_batching_config=cb_config,
            warmup=on_cuda) as manager:
        start = time.perf_counter()  # warm-up (graph capture) excluded, as for the engine
        for r in requests:
            manager.add_request(r.prompt_token_ids, request_id=r.id, max_new_tokens=r.max_tokens,
                                eos_token_id=-1)
        while finished < len(requests) and time.perf_counter() - start < time_cap_s:
            result = manager.get_result(timeout=1)
            if result is None:
                if not manager.is_running():
                    raise RuntimeError("HF continuous batching stopped before finishing")
                continue
            if result.is_finished():
                finished += 1
                useful += len(result.generated_tokens)
                wrong_lengths += len(result.generated_tokens) != expected[result.request_id]
        seconds = time.perf_counter() - start
    return {"kind": "hf-continuous", "max_batch": max_batch, "finished_requests": finished,
            "complete": finished == len(requests), "useful_tokens": useful,
            "wrong_lengths": wrong_lengths, "wall_seconds": seconds, "useful_tokens_per_s": useful / seconds if seconds else None,
            "cuda_graphs": on_cuda}
