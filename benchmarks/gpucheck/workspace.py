"""What the sections share: random-weight checkpoints, the workload and one big engine.

Checkpoints are written into a temporary directory removed by ``close()`` (never into
the report directory: the Llama-3.2-1B one is 2.5 GB). The big engine (``plan.big_arch``
in ``plan.engine_dtype``, decode graphs on) serves the decode-graph, bandwidth and
throughput sections, so the model is loaded once.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.gpucheck.arch_models import build_random_checkpoint
from benchmarks.gpucheck.device import release_memory
from benchmarks.gpucheck.plan import Plan
from benchmarks.gpucheck.throughput import make_gpu_workload
from cli.bench.workload import BenchRequest


class Workspace:
    """Lazily built checkpoints, workload and engine of one run."""

    def __init__(self, plan: Plan, *, started: float | None = None) -> None:
        self.plan = plan
        self.deadline = (time.perf_counter() if started is None else started) + plan.budget_s
        self._tmp = tempfile.TemporaryDirectory(prefix="gpu_check-")
        self._paths: dict[str, str] = {}
        self._engine: Any = None
        self._workload: list[BenchRequest] | None = None

    def seconds_left(self) -> float:
        """Seconds of the run's budget that remain."""
        return self.deadline - time.perf_counter()

    def checkpoint(self, name: str) -> str:
        """Local directory of ``name``: a tiny test model, or an architecture of the plan."""
        if name not in self._paths:
            if name in self.plan.arch_configs:
                path = build_random_checkpoint(Path(self._tmp.name) / name,
                                               self.plan.arch_configs[name],
                                               seed=self.plan.seed, device=self.plan.device)
                self._paths[name] = str(path)
            else:
                from worker.engine.models.loader import resolve_checkpoint_dir

                self._paths[name] = str(resolve_checkpoint_dir(name))
        return self._paths[name]

    def workload(self) -> list[BenchRequest]:
        """The throughput workload, generated from the plan's seed over the big vocabulary."""
        if self._workload is None:
            plan = self.plan
            self._workload = make_gpu_workload(
                seed=plan.seed, num_requests=plan.num_requests, max_output=plan.max_output,
                vocab_size=plan.arch_configs[plan.big_arch]["vocab_size"], mu=plan.output_mu,
                min_output=plan.min_output, prompt_len=plan.prompt_len)
        return self._workload

    def kv_blocks(self) -> int:
        """Enough blocks for the whole workload at once and for the largest decode batch at
        the decode-graph and step-time contexts (one block each to spare)."""
        from cli.bench.runner import kv_blocks_for

        plan = self.plan
        context = max(plan.graphs_max_context, plan.step_context)
        decode = plan.max_num_seqs * -(-context // plan.block_size)
        return max(kv_blocks_for(self.workload(), plan.block_size, plan.slots), decode) + 1

    def engine(self) -> Any:
        """The big engine (built on first use)."""
        if self._engine is None:
            from worker.engine import EngineArgs, LLMEngine

            plan = self.plan
            self._engine = LLMEngine(EngineArgs(
                model=self.checkpoint(plan.big_arch), device=plan.device.type,
                dtype=plan.engine_dtype, attention_backend=plan.attention_backend,
                max_num_seqs=plan.max_num_seqs, max_model_len=plan.max_model_len,
                block_size=plan.block_size, num_kv_blocks=self.kv_blocks(),
                decode_graphs=True, seed=plan.seed))
        return self._engine

    def drop_engine(self) -> None:
        """Free the big engine (before loading a Hugging Face copy of the model)."""
        self._engine = None
        release_memory(self.plan.device)

    def close(self) -> None:
        """Free the engine and delete the checkpoints."""
        self.drop_engine()
        self._tmp.cleanup()
