"""Per-step records of an engine run and the figures derived from them (no torch).

Definitions (also written into the JSON under ``definitions``):

- useful tokens/s: tokens generated for the requests / wall time of the run (engine
  creation and warm-up excluded);
- slot utilization of a step: sequences that computed a token in it (decode or prefill)
  / max_num_seqs; "steady" averages the steps that began with a non-empty waiting queue;
- KV waste of a step: (kv_blocks_used * block_size - kv_tokens) / (kv_blocks_used *
  block_size), averaged over steps weighted by kv_blocks_used;
- scheduler overhead: sum(schedule_seconds) / sum(step wall time).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DEFINITIONS = {
    "useful_tokens_per_s": "tokens generated for the requests (each request's max_tokens; "
                           "padding excluded) / wall time of the run; engine or model creation "
                           "and the warm-up are excluded",
    "slot_utilization": "per step: sequences that computed a token (decode or prefill chunk) "
                        "/ max_num_seqs; mean over all steps",
    "slot_utilization_steady": "the same, averaged over the steps that began with a non-empty "
                               "waiting queue (steady state)",
    "kv_waste": "per step: (kv_blocks_used * block_size - kv_tokens) / (kv_blocks_used * "
                "block_size), averaged over steps weighted by kv_blocks_used",
    "scheduler_overhead": "sum(schedule_seconds) / sum(step wall time)",
    "step_time_split": "shares of the summed step wall time spent in schedule, forward, "
                       "sample (incl. stop checks and eviction) and other (the rest of step())",
    "u_static": "sum(max_tokens) / sum over cohorts of 16 (workload order) of 16 * max(max_tokens "
                "in cohort): the slot utilization of request-level batching",
    "ideal_speedup": "1 / u_static: continuous over static if every slot-step were useful and "
                     "steps cost the same",
    "fcfs_step_bound": "static steps / continuous steps for this workload in FCFS order with "
                       "one token per slot-step (simulated): what continuous can reach when "
                       "steps cost the same, drain tail included",
}


@dataclass
class StepRecord:
    """What the benchmark keeps of one engine step."""

    scheduled: int  # sequences that computed a token in the step
    waiting_before: int  # waiting queue length when the step began
    prefill_tokens: int
    decode_tokens: int
    kv_blocks_used: int
    kv_tokens: int
    schedule_seconds: float
    forward_seconds: float
    sample_seconds: float
    wall_seconds: float  # engine.step() as timed by the caller
    preemptions: int = 0
    draft_tokens: int = 0  # n-gram draft tokens checked in the step
    accepted_tokens: int = 0  # of which accepted


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize_steps(steps: Sequence[StepRecord], *, max_num_seqs: int, block_size: int
                    ) -> dict[str, Any]:
    """Slot utilization, KV waste, scheduler overhead and the step-time split of a run."""
    util = [s.scheduled / max_num_seqs for s in steps]
    steady = [u for u, s in zip(util, steps, strict=True) if s.waiting_before > 0]
    allocated = sum(s.kv_blocks_used * block_size for s in steps)
    unwritten = sum(s.kv_blocks_used * block_size - s.kv_tokens for s in steps)
    wall = sum(s.wall_seconds for s in steps)
    sched = sum(s.schedule_seconds for s in steps)
    fwd = sum(s.forward_seconds for s in steps)
    sample = sum(s.sample_seconds for s in steps)
    split = ({"schedule": sched / wall, "forward": fwd / wall, "sample": sample / wall,
              "other": max(0.0, wall - sched - fwd - sample) / wall} if wall > 0 else {})
    return {
        "num_steps": len(steps),
        "num_steady_steps": len(steady),
        "slot_utilization": _mean(util),
        "slot_utilization_steady": _mean(steady),
        "kv_waste": unwritten / allocated if allocated else None,
        "scheduler_overhead": sched / wall if wall > 0 else None,
        "mean_step_ms": 1000 * wall / len(steps) if steps else None,
        "step_time_split": split,
        "prefill_tokens": sum(s.prefill_tokens for s in steps),
        "decode_tokens": sum(s.decode_tokens for s in steps),
    }


def fcfs_steps(max_tokens: Sequence[int], slots: int) -> int:
    """Steps continuous batching needs in FCFS order when each request takes exactly
    ``max_tokens`` steps in a slot and a freed slot is refilled on the next step."""
    free_at = [0] * slots
    end = 0
    for n in max_tokens:
        i = min(range(slots), key=free_at.__getitem__)
        free_at[i] += n
        end = max(end, free_at[i])
    return end


def static_steps(max_tokens: Sequence[int], slots: int) -> int:
    """Steps request-level batching needs: each cohort runs to its longest member."""
    return sum(max(max_tokens[i:i + slots]) for i in range(0, len(max_tokens), slots))


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is zero."""
    if a is None or b is None or b == 0:
        return None
    return a / b
