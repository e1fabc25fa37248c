"""The StepStats of one step, from its plan, its timer and the scheduler's state after it."""

from __future__ import annotations

import time
from collections.abc import Iterable

from worker.engine.block_manager import BlockManager, num_released
from worker.engine.outputs import RequestOutput, StepStats
from worker.engine.scheduler import Scheduler
from worker.engine.sequence import Sequence
from worker.engine.step_plan import SchedulerOutput


def distinct_kv_tokens(holding: Iterable[Sequence], bm: BlockManager) -> int:
    """Tokens whose K/V sit in the holders' blocks, a block shared by several sequences (a
    cached prompt prefix, forked samples) counted once. Sharing is always a prefix of a
    block table, so each sequence is walked only over its shared head, from its first
    block not released out of a sliding window (released blocks' tokens are not counted).
    With a window, a holder behind another on a shared prefix may hold alone the blocks
    the other already released; the walk stops there, so the shared blocks after them
    count once per holder (an overcount of that case only, to keep the walk short)."""
    if not bm.num_shared and not bm.window:  # nothing shared, nothing released: a plain sum
        return sum(seq.num_computed_tokens for seq in holding)
    total = 0
    shared: dict[int, int] = {}  # shared block -> the most tokens any holder has in it
    bs = bm.block_size
    for seq in holding:
        table = seq.block_table
        first = num_released(table)
        total += max(0, seq.num_computed_tokens - first * bs)
        for j in range(first, len(table)):
            block = table[j]
            if bm.ref_counts[block] <= 1:
                break
            filled = min(bs, seq.num_computed_tokens - j * bs)
            if filled <= 0:
                break
            total -= filled
            shared[block] = max(shared.get(block, 0), filled)
    return total + sum(shared.values())


class StepTimer:
    """When a step began and how long its sections took: ``lap()`` ends one, in the order
    schedule, forward, sample (``StepStats.*_seconds``)."""

    __slots__ = ("_last", "laps", "paused", "start", "waiting_before")

    def __init__(self, waiting_before: int) -> None:
        self.start = time.time()  # wall clock, for StepStats.start_time and the requests
        self.waiting_before = waiting_before  # the waiting queue's length as the step began
        self.laps: list[float] = []  # seconds of each section ended so far
        self.paused = 0.0  # seconds left out of the sections (steps run inside this one)
        self._last = time.perf_counter()

    def lap(self) -> None:
        """End the current section."""
        now = time.perf_counter()
        self.laps.append(now - self._last)
        self._last = now

    def pause(self, seconds: float) -> None:
        """Leave ``seconds`` out of the current section: the step was paused that long
        while other steps ran (``LLMEngine.interjected_step``), which count them."""
        self._last += seconds
        self.paused += seconds


def step_work(plan: SchedulerOutput) -> tuple[dict[str, int], int]:
    """The rows each request computed in the step (samples of an n > 1 request summed
    under the request's id; pad rows left out): what ``step_cost.split_seconds`` splits
    the step's time by; and how many of them were interactive."""
    work: dict[str, int] = {}
    interactive = 0
    for s in plan.scheduled:
        if not s.is_pad:
            seq = s.seq
            rid = seq.group_id or seq.request_id
            work[rid] = work.get(rid, 0) + s.num_new_tokens
            if seq.service_class != "batch":
                interactive += s.num_new_tokens
    return work, interactive


def step_stats(
    step: int,
    plan: SchedulerOutput,
    scheduler: Scheduler,
    outputs: list[RequestOutput],
    timer: StepTimer,
    num_accepted: int,
) -> StepStats:
    """Counts of the step's rows by kind (see ``step_plan``), queues and KV after it."""
    schedule_s, forward_s, sample_s = timer.laps
    bm = scheduler.block_manager
    holding = (*scheduler.running, *scheduler.padding)
    work, interactive_rows = step_work(plan)
    return StepStats(
        step=step,
        num_running=len(scheduler.running),
        num_waiting=len(scheduler.waiting),
        num_prefill_tokens=plan.num_prefill_tokens,
        num_decode_tokens=plan.num_decode_tokens,
        kv_blocks_used=bm.num_used_blocks,
        kv_blocks_total=bm.num_blocks,
        num_preemptions=len(plan.preempted),
        num_admitted=plan.num_admitted,
        num_finished=sum(1 for o in outputs if o.finished),
        schedule_seconds=schedule_s,
        forward_seconds=forward_s,
        sample_seconds=sample_s,
        start_time=timer.start,
        num_cached_tokens=plan.num_cached_tokens,
        kv_tokens=distinct_kv_tokens(holding, bm),
        num_scheduled_seqs=len(plan.scheduled),
        num_waiting_before=timer.waiting_before,
        num_draft_tokens=plan.num_draft_tokens,
        num_accepted_tokens=num_accepted,
        num_verify_tokens=plan.num_verify_tokens,
        num_pad_rows=plan.num_pad_rows,
        num_running_interactive=sum(1 for s in scheduler.running if not s.is_batch),
        num_waiting_interactive=sum(1 for s in scheduler.waiting if not s.is_batch),
        num_interactive_tokens=interactive_rows,
        paused_seconds=timer.paused,
        work=work,
    )
