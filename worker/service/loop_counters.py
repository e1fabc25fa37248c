"""What the engine loop counts: plain attributes updated once per step by the loop's thread
and read by the observable metrics (``worker.telemetry.metrics.EngineSource``) and the
worker's exit summary."""

from __future__ import annotations

from dataclasses import dataclass

from worker.engine.outputs import RequestOutput, StepStats


@dataclass
class LoopCounters:
    """Running totals of one engine loop."""

    steps: int = 0
    finished: int = 0  # jobs whose engine output ended (any status)
    failed: int = 0  # jobs failed before or without an engine output
    generated_tokens: int = 0
    preemptions_total: int = 0
    cached_prompt_tokens: int = 0
    computed_prompt_tokens: int = 0
    isolated_runs: int = 0  # suspect cohorts run beside the batch, groups run alone
    last_stats: StepStats | None = None

    def note_step(self, outputs: list[RequestOutput], stats: StepStats) -> None:
        """Count one successful step."""
        self.steps += 1
        self.last_stats = stats
        # new tokens of this step (several per output when drafts were accepted)
        self.generated_tokens += sum(len(o.new_token_ids) for o in outputs)
        self.preemptions_total += stats.num_preemptions
        self.cached_prompt_tokens += stats.num_cached_tokens
        self.computed_prompt_tokens += stats.num_prefill_tokens
