"""Engines for the fault tests: the tiny model paced so a test can act while jobs run, and
the same engine turned sticky-broken (every step raises after the first N)."""

from __future__ import annotations

import time

from worker.service.config import WorkerConfig


def paced_tiny(config: WorkerConfig, *, step_s: float = 0.02, fail_after: int | None = None):
    """tiny-llama sleeping ``step_s`` per step; with ``fail_after``, every step after that
    many raises (a broken device: the engine fails whatever it runs)."""
    from worker.engine import EngineArgs, LLMEngine

    class PacedEngine(LLMEngine):
        steps_done = 0

        def step(self, between_layers=None):
            if fail_after is not None and self.steps_done >= fail_after:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            self.steps_done += 1
            time.sleep(step_s)
            return super().step(between_layers)

    return PacedEngine(
        EngineArgs(model="tiny-llama", max_num_seqs=8, num_kv_blocks=64, max_model_len=256,
                   attention_backend="torch")  # no native kernel build: starts fast anywhere
    )
