"""Time one engine configuration on a workload, keeping a record of every step.

One engine serves every configuration: ``configure`` installs a fresh scheduler with the
configuration's slot count and policy over the engine's (drained) block manager, so the
model is loaded once and every run starts from an empty KV pool.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from cli.bench.machine import RssSampler
from cli.bench.metrics import StepRecord, summarize_steps
from cli.bench.workload import BenchRequest
from worker.engine.llm_engine import LLMEngine
from worker.engine.scheduler import Scheduler
from worker.engine.speculation import NgramSpeculator
from worker.protocol.sampling_params import SamplingParams


def configure(engine: LLMEngine, *, max_num_seqs: int, policy: str,
              speculative_tokens: int = 0) -> Scheduler:
    """Give ``engine`` a new scheduler with ``max_num_seqs`` slots and ``policy``, and
    n-gram drafts of ``speculative_tokens`` per sequence (0: none)."""
    if engine.has_unfinished_requests() or engine.block_manager.num_used_blocks:
        raise RuntimeError("the engine must be drained before it is reconfigured")
    scheduler = Scheduler(
        block_manager=engine.block_manager,
        stop_checker=engine.scheduler.stop_checker,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=engine.args.max_num_batched_tokens,
        policy=policy,
        enable_chunked_prefill=engine.args.enable_chunked_prefill,
    )
    engine.scheduler = scheduler
    engine.speculator = None
    if speculative_tokens:
        engine.speculator = NgramSpeculator(
            num_tokens=speculative_tokens, max_rows=engine.args.speculative_max_rows)
    return scheduler


def _params(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def warm_up(engine: LLMEngine, requests: Sequence[BenchRequest], *, max_num_seqs: int = 16,
            max_tokens: int = 4) -> None:
    """Run the first ``max_num_seqs`` prompts for a few tokens (prefill and decode paths)."""
    configure(engine, max_num_seqs=max_num_seqs, policy="fcfs")
    for i, r in enumerate(requests[:max_num_seqs]):
        engine.add_request(f"warmup-{i}", r.prompt_token_ids, _params(max_tokens))
    while engine.has_unfinished_requests():
        engine.step()


def _record(stats: Any, wall: float) -> StepRecord:
    return StepRecord(
        scheduled=stats.num_scheduled_seqs - stats.num_pad_rows,  # pad rows are no work
        waiting_before=stats.num_waiting_before,
        prefill_tokens=stats.num_prefill_tokens, decode_tokens=stats.num_decode_tokens,
        kv_blocks_used=stats.kv_blocks_used, kv_tokens=stats.kv_tokens,
        schedule_seconds=stats.schedule_seconds, forward_seconds=stats.forward_seconds,
        sample_seconds=stats.sample_seconds, wall_seconds=wall,
        preemptions=stats.num_preemptions, draft_tokens=stats.num_draft_tokens,
        accepted_tokens=stats.num_accepted_tokens,
    )


def run_engine(engine: LLMEngine, requests: Sequence[BenchRequest], *, name: str,
               max_num_seqs: int, policy: str, speculative_tokens: int = 0) -> dict[str, Any]:
    """Run every request to its max_tokens under one configuration; figures and per-step
    occupancy of the run."""
    configure(engine, max_num_seqs=max_num_seqs, policy=policy,
              speculative_tokens=speculative_tokens)
    token_ids: dict[str, list[int]] = {}
    steps: list[StepRecord] = []
    with RssSampler() as rss:
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        for r in requests:
            engine.add_request(f"{name}-{r.id}", r.prompt_token_ids, _params(r.max_tokens))
        while engine.has_unfinished_requests():
            ts = time.perf_counter()
            outputs, stats = engine.step()
            steps.append(_record(stats, time.perf_counter() - ts))
            for o in outputs:
                if o.finished:
                    token_ids[o.request_id.removeprefix(f"{name}-")] = list(o.token_ids)
        seconds = time.perf_counter() - t0
        cpu_seconds = time.process_time() - cpu0
    generated = sum(len(t) for t in token_ids.values())
    preemptions = sum(s.preemptions for s in steps)
    drafted = sum(s.draft_tokens for s in steps)
    accepted = sum(s.accepted_tokens for s in steps)
    expected = sum(r.max_tokens for r in requests)
    if generated != expected:
        raise RuntimeError(f"{name}: generated {generated} tokens, expected {expected}")
    return {
        "kind": "engine",
        "policy": policy,
        "max_num_seqs": max_num_seqs,
        "num_requests": len(requests),
        "useful_tokens": generated,
        "wall_seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "useful_tokens_per_s": generated / seconds,
        "num_preemptions": preemptions,
        "speculative_tokens": speculative_tokens,
        "draft_tokens": drafted,
        "accepted_draft_tokens": accepted,
        **summarize_steps(steps, max_num_seqs=max_num_seqs, block_size=engine.block_size),
        "occupancy": [s.scheduled for s in steps],
        "waiting": [s.waiting_before for s in steps],
        "peak_rss_bytes": rss.peak,  # the whole process during this run (model, pool, steps)
        "prefix_caching": engine.args.enable_prefix_caching,
        "token_ids": token_ids,  # per request id; the runner keeps them out of the JSON
    }
