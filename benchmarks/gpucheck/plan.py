"""How big each section is: sized for one H200 within the budget, or tiny with ``--quick``.

The GPU sizes are estimates made without a GPU (no run has been timed yet); every run
re-checks the remaining budget before each section and caps the Hugging Face runs, so a
slow machine skips or shortens work (recorded) instead of overrunning.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from benchmarks.gpucheck.arch_models import ARCHS, quick_shape

DEFAULT_BUDGET_S = 450  # the limit is 8 minutes on one H200; this leaves a margin


@dataclass
class Plan:
    """Sizes and options of one run."""

    device: torch.device
    quick: bool
    budget_s: float
    seed: int = 0
    attention_backend: str | None = None  # None: the device's default (Triton on CUDA)
    engine_dtype: str = "bfloat16"
    arch_configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    big_arch: str = "llama-3.2-1b"  # decode graphs, step times and throughput run on it
    max_num_seqs: int = 256
    max_model_len: int = 2048
    block_size: int = 16
    # pytest subprocesses
    kernel_tests_timeout_s: float = 240  # 117 tests did not finish in 200 s on one process
    gpu_tests_timeout_s: float = 150
    # parity
    parity_models: list[str] = field(default_factory=list)
    parity_dtypes: tuple[str, ...] = ("bfloat16", "float32")
    parity_prompts: int = 4
    parity_prompt_len: tuple[int, int] = (8, 64)
    parity_new_tokens: int = 32
    # decode graphs
    graphs_max_context: int = 512
    graphs_time_iters: int = 5
    # bandwidth
    copy_bytes: int = 2**30
    attention_shapes: list[tuple[int, int]] = field(default_factory=list)  # (batch, context)
    step_batches: list[int] = field(default_factory=list)
    step_context: int = 512
    timing_iters: int = 20
    # throughput
    num_requests: int = 256
    max_output: int = 1024
    output_mu: float = 4.4
    min_output: int = 8
    prompt_len: tuple[int, int] = (20, 200)
    slots: int = 128
    hf_time_cap_s: float = 75
    # sections that need at least this much of the budget left to start
    min_seconds: dict[str, float] = field(default_factory=dict)


def make_plan(device: torch.device, *, quick: bool, budget_s: float, seed: int = 0) -> Plan:
    """The GPU plan, or the tiny one for ``--quick`` (CPU: torch attention, fp32 engine)."""
    plan = Plan(device=device, quick=quick, budget_s=budget_s, seed=seed,
                arch_configs=dict(ARCHS),
                parity_models=["tiny-llama", "tiny-qwen2", *ARCHS],
                attention_shapes=[(64, 1024), (256, 1024), (64, 4096), (16, 8192)],
                step_batches=[1, 8, 64, 256],  # issue 28 asks for 1, 8 and 64
                min_seconds={"decode_graphs": 30, "parity": 60, "bandwidth": 20,
                             "throughput": 90})
    if device.type == "cpu":
        plan.attention_backend = "torch"
        plan.engine_dtype = "float32"
    if quick:
        plan.arch_configs = {name: quick_shape(cfg) for name, cfg in ARCHS.items()}
        plan.max_num_seqs, plan.max_model_len = 8, 256
        # tiny-qwen2 is left out: the Qwen2.5 shape at test size covers the same code.
        plan.parity_models = ["tiny-llama", *ARCHS]
        plan.parity_prompts, plan.parity_prompt_len, plan.parity_new_tokens = 2, (3, 12), 5
        plan.graphs_max_context, plan.graphs_time_iters = 48, 0
        plan.copy_bytes, plan.timing_iters = 8 * 2**20, 3
        plan.attention_shapes, plan.step_batches, plan.step_context = [(4, 64)], [1, 4, 8], 48
        plan.num_requests, plan.max_output, plan.output_mu = 10, 16, 1.8
        plan.min_output, plan.prompt_len, plan.slots = 2, (3, 16), 4
        plan.hf_time_cap_s = 30
        plan.min_seconds = {}
    return plan
