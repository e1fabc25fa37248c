"""One benchmark run: every selected configuration on the same workload, in one process.

Ratios are only ever taken between runs of the same invocation, so they share the
machine's state (other load, thermal, library versions).
"""

from __future__ import annotations

import datetime
import gc
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cli.allocator import release_free_memory
from cli.bench.machine import machine_description
from cli.bench.metrics import DEFINITIONS, fcfs_steps, ratio, static_steps
from cli.bench.report import agreement, ratios_of, targets_of
from cli.bench.workload import (
    DEFAULT_WORKLOAD,
    BenchRequest,
    fit_to_vocab,
    read_workload,
    static_utilization,
)


@dataclass(frozen=True)
class RunConfig:
    """A configuration to time: this engine (policy, slots, dtype), HF generate (batch
    size) or the peer system (vLLM, in its own environment)."""

    kind: str  # "engine" | "hf" | "peer"
    slots: int | None  # None: the engine's default max_num_seqs
    policy: str = "fcfs"
    speculative_tokens: int = 0  # n-gram drafts per sequence per step
    dtype: str | None = None  # None: the run's --dtype
    defaults: bool = False  # the engine exactly as LLM() builds it (KV size, prefix caching)


SPECULATIVE_TOKENS = 8
CONFIGS: dict[str, RunConfig] = {
    "inflight": RunConfig("engine", None, defaults=True),
    "inflight-bf16": RunConfig("engine", None, dtype="bfloat16", defaults=True),
    "static-16": RunConfig("engine", 16, "static"),
    # lockstep cohorts: a finished member keeps a pad row until its cohort ends, as HF does
    "static-padded-16": RunConfig("engine", 16, "static-padded"),
    "continuous-16": RunConfig("engine", 16, "fcfs"),
    "continuous-64": RunConfig("engine", 64, "fcfs"),
    "continuous-64+ngram": RunConfig("engine", 64, "fcfs", SPECULATIVE_TOKENS),
    "hf-16": RunConfig("hf", 16),
    "vllm": RunConfig("peer", None),
}
DEFAULT_CONFIGS = ["inflight", "inflight-bf16", "static-16", "continuous-16", "hf-16"]
COHORT = 16
OUTPUT_JSON = "bench.json"
OUTPUT_PNG = "bench_occupancy.png"


@dataclass
class BenchOptions:
    """What ``inflight bench`` was asked to do."""

    model: str = "smollm2-135m"
    workload: Path = DEFAULT_WORKLOAD
    out_dir: Path = Path("benchmarks/results")
    configs: list[str] = field(default_factory=lambda: list(DEFAULT_CONFIGS))
    limit: int | None = None
    dtype: str = "float32"
    threads: int | None = None
    num_kv_blocks: int | None = None  # None: enough for the whole workload at once
    peer_python: Path | None = None  # the vLLM environment's interpreter (None: default)
    peer_search: bool = False  # try the peer's preloads and batch settings, keep its fastest
    peer_memory_fraction: float | None = None  # the peer's share of memory (None: its script's)
    over_vllm_target: float = 1.5  # this workload's target for inflight / vllm
    command: str = ""


def kv_blocks_for(requests: list[BenchRequest], block_size: int, slots: int) -> int:
    """A pool that holds every request's prompt and output at once (no preemption)."""
    return sum(-(-(len(r.prompt_token_ids) + r.max_tokens) // block_size) for r in requests) + slots


def _workload_info(path: Path, requests: list[BenchRequest]) -> dict[str, Any]:
    outs = [r.max_tokens for r in requests]
    u = static_utilization(outs, COHORT)
    return {
        "path": str(path), "num_requests": len(requests),
        "prompt_tokens": sum(len(r.prompt_token_ids) for r in requests),
        "useful_tokens": sum(outs), "max_tokens_min": min(outs), "max_tokens_max": max(outs),
        "u_static": u, "ideal_speedup": 1 / u if u else None,
        "static_steps": static_steps(outs, COHORT), "fcfs_steps_16": fcfs_steps(outs, COHORT),
        "fcfs_step_bound": ratio(static_steps(outs, COHORT), fcfs_steps(outs, COHORT)),
    }


def _engine_groups(names: list[str]) -> list[tuple[tuple[bool, str | None], list[str]]]:
    """Engine configurations grouped by the engine they need (one load each), the engines
    as LLM() builds them first so their memory figures come before any larger pool."""
    groups: dict[tuple[bool, str | None], list[str]] = {}
    for name in names:
        cfg = CONFIGS[name]
        groups.setdefault((cfg.defaults, cfg.dtype), []).append(name)
    return sorted(groups.items(), key=lambda item: (not item[0][0], item[0][1] or ""))


def _build_engine(opts: BenchOptions, defaults: bool, dtype: str | None,
                  requests: list[BenchRequest], slots: int):
    from worker.engine.config import EngineArgs
    from worker.engine.llm_engine import LLMEngine

    args = EngineArgs(model=opts.model, dtype=dtype or opts.dtype, num_threads=opts.threads)
    if not defaults:  # a pool that holds the whole workload: a comparison of batching alone
        args = EngineArgs(model=opts.model, dtype=dtype or opts.dtype, num_threads=opts.threads,
                          max_num_seqs=slots,
                          num_kv_blocks=opts.num_kv_blocks or kv_blocks_for(requests, 16, slots))
    return LLMEngine(args)


def run_benchmark(opts: BenchOptions, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the selected configurations, write ``bench.json`` (and the occupancy PNG when
    both continuous-16 and static-16 ran) under ``opts.out_dir``; return the JSON data."""
    import torch
    from transformers import AutoConfig

    from cli.bench.engine_run import run_engine, warm_up
    from cli.bench.hf_run import load_hf_model, run_hf, warm_up_hf
    from cli.bench.peer_run import DEFAULT_PEER_PYTHON, PeerSettings, run_vllm, search_vllm
    from cli.bench.plot import MISSING_MATPLOTLIB, has_matplotlib, plot_occupancy
    from worker.engine.models.loader import resolve_checkpoint_dir

    unknown = [c for c in opts.configs if c not in CONFIGS]
    if unknown:
        raise ValueError(f"unknown configs {unknown}; choose from {list(CONFIGS)}")
    draw = {"continuous-16", "static-16"} <= set(opts.configs)
    if draw and not has_matplotlib():  # said before any run: the figures do not need it
        print(f"note: no occupancy plot this run ({MISSING_MATPLOTLIB})", file=sys.stderr)
        draw = False
    if opts.threads:
        torch.set_num_threads(opts.threads)
    requests = read_workload(opts.workload, opts.limit)
    if not requests:
        raise ValueError(f"{opts.workload}: no requests")
    model_dir = Path(resolve_checkpoint_dir(opts.model))
    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    requests = fit_to_vocab(requests, vocab)
    info = _workload_info(Path(opts.workload), requests)
    say(f"workload: {info['num_requests']} requests, {info['useful_tokens']} output tokens, "
        f"U_static={info['u_static']:.3f}, ideal 1/U_static={info['ideal_speedup']:.3f}, "
        f"FCFS step bound={info['fcfs_step_bound']:.3f}")
    runs: dict[str, dict[str, Any]] = {}
    tokens: dict[str, dict[str, list[int]]] = {}
    out_dir = Path(opts.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    def write() -> dict[str, Any]:
        """Write the JSON of the runs so far (after each run, so a long run leaves partial
        figures behind if it is stopped)."""
        exact = next((n for n in ("inflight", "continuous-64", "continuous-16") if n in tokens
                      and CONFIGS[n].dtype is None and opts.dtype == "float32"), None)
        for name in tokens:
            if exact is not None and name != exact:
                runs[name]["agreement"] = agreement(tokens[exact], tokens[name])
        ratios = ratios_of(runs, info["u_static"])
        result = {
            "command": opts.command,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "model": opts.model, "dtype": opts.dtype, "machine": machine_description(),
            "workload": info, "definitions": DEFINITIONS, "runs": runs, "ratios": ratios,
            "agreement_reference": exact,
            "targets": targets_of(runs, ratios, opts.over_vllm_target),
            "complete": all(c in runs for c in opts.configs),
        }
        (out_dir / OUTPUT_JSON).write_text(json.dumps(result, indent=1) + "\n",
                                           encoding="utf-8")
        return result

    engine_names = [c for c in opts.configs if CONFIGS[c].kind == "engine"]
    for (defaults, dtype), names in _engine_groups(engine_names):
        slots = max(CONFIGS[c].slots or 0 for c in names) or 1
        engine = _build_engine(opts, defaults, dtype, requests, slots)
        say(f"engine: {opts.model} {engine.dtype}, {engine.block_manager.num_blocks} KV blocks "
            f"of {engine.block_size}, max_num_seqs {engine.args.max_num_seqs}, prefix caching "
            f"{engine.args.enable_prefix_caching}, loaded in {engine.load_seconds:.1f}s; warming up")
        warm_up(engine, requests)
        for name in names:
            cfg = CONFIGS[name]
            say(f"running {name} ...")
            runs[name] = run_engine(engine, requests, name=name,
                                    max_num_seqs=cfg.slots or engine.args.max_num_seqs,
                                    policy=cfg.policy, speculative_tokens=cfg.speculative_tokens)
            runs[name]["dtype"] = str(engine.dtype).removeprefix("torch.")
            tokens[name] = runs[name].pop("token_ids")
            say(f"  {runs[name]['useful_tokens_per_s']:.1f} tok/s in "
                f"{runs[name]['wall_seconds']:.1f}s, {runs[name]['num_steps']} steps")
            write()
        del engine
        gc.collect()
        release_free_memory()  # the peer sizes its KV cache by the memory it finds free
    if "vllm" in opts.configs:
        say("running vllm (its own environment; load and compilation are not timed)"
            + (", searching its settings" if opts.peer_search else "") + " ...")

        def run_peer(settings: PeerSettings) -> tuple[dict[str, Any], dict[str, list[int]]]:
            return run_vllm(python=opts.peer_python or DEFAULT_PEER_PYTHON, model_dir=model_dir,
                            workload=Path(opts.workload), out_dir=out_dir, limit=opts.limit,
                            threads=opts.threads, settings=settings,
                            memory_fraction=opts.peer_memory_fraction)

        if opts.peer_search:
            runs["vllm"], tokens["vllm"] = search_vllm(run_peer, say)
        else:
            runs["vllm"], tokens["vllm"] = run_peer(PeerSettings())
        say(f"  {runs['vllm']['useful_tokens_per_s']:.1f} tok/s in "
            f"{runs['vllm']['wall_seconds']:.1f}s")
        write()
    if "hf-16" in opts.configs:
        model, pad_id = load_hf_model(opts.model, opts.dtype)
        warm_up_hf(model, requests, pad_id)
        say("running hf-16 ...")
        runs["hf-16"] = run_hf(model, requests, batch_size=CONFIGS["hf-16"].slots or 16,
                               pad_id=pad_id)
        say(f"  {runs['hf-16']['useful_tokens_per_s']:.1f} tok/s in "
            f"{runs['hf-16']['wall_seconds']:.1f}s")
        del model
        gc.collect()
    result = write()
    if draw:
        plot_occupancy(out_dir / OUTPUT_PNG, {
            "continuous-16": runs["continuous-16"]["occupancy"],
            "static-16": runs["static-16"]["occupancy"]},
            slots=16, title=f"{opts.model}, {info['num_requests']} requests: sequences per step")
    return result
