"""One benchmark run: every selected configuration on the same workload, in one process.

Ratios are only ever taken between runs of the same invocation, so they share the
machine's state (other load, thermal, library versions).
"""

from __future__ import annotations

import datetime
import gc
import json
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker.engine.bench.metrics import DEFINITIONS, fcfs_steps, ratio, static_steps
from worker.engine.bench.workload import (
    DEFAULT_WORKLOAD,
    BenchRequest,
    fit_to_vocab,
    read_workload,
    static_utilization,
)


@dataclass(frozen=True)
class RunConfig:
    """A configuration to time: this engine (policy, slots) or HF generate (batch size)."""

    kind: str  # "engine" | "hf"
    slots: int
    policy: str = "fcfs"
    speculative_tokens: int = 0  # n-gram drafts per sequence per step


SPECULATIVE_TOKENS = 8
CONFIGS: dict[str, RunConfig] = {
    "static-16": RunConfig("engine", 16, "static"),
    "continuous-16": RunConfig("engine", 16, "fcfs"),
    "continuous-64": RunConfig("engine", 64, "fcfs"),
    "continuous-64+ngram": RunConfig("engine", 64, "fcfs", SPECULATIVE_TOKENS),
    "hf-16": RunConfig("hf", 16),
}
COHORT = 16
TARGETS = {"fraction_of_ideal": 0.85, "slot_utilization_steady": 0.97, "kv_waste": 0.04,
           "over_hf": 5.5}
OUTPUT_JSON = "bench.json"
OUTPUT_PNG = "bench_occupancy.png"


@dataclass
class BenchOptions:
    """What ``inflight bench`` was asked to do."""

    model: str = "smollm2-135m"
    workload: Path = DEFAULT_WORKLOAD
    out_dir: Path = Path("benchmarks/results")
    configs: list[str] = field(default_factory=lambda: list(CONFIGS))
    limit: int | None = None
    dtype: str = "float32"
    threads: int | None = None
    num_kv_blocks: int | None = None  # None: enough for the whole workload at once
    command: str = ""


def kv_blocks_for(requests: list[BenchRequest], block_size: int, slots: int) -> int:
    """A pool that holds every request's prompt and output at once (no preemption)."""
    return sum(-(-(len(r.prompt_token_ids) + r.max_tokens) // block_size) for r in requests) + slots


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _machine() -> dict[str, Any]:
    import torch
    import transformers

    return {"platform": platform.platform(), "processor": platform.processor() or None,
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


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


def _ratios(runs: dict[str, dict[str, Any]], u_static: float) -> dict[str, float | None]:
    tps = {name: run["useful_tokens_per_s"] for name, run in runs.items()}
    pairs = [("continuous-16", "static-16"), ("continuous-64", "static-16"),
             ("continuous-16", "hf-16"), ("continuous-64", "hf-16"), ("static-16", "hf-16"),
             ("continuous-64", "continuous-16"), ("continuous-64+ngram", "hf-16"),
             ("continuous-64+ngram", "continuous-64")]
    out = {f"{a} / {b}": ratio(tps[a], tps[b]) for a, b in pairs if a in tps and b in tps}
    # The same ratios on CPU time: less sensitive to other load when running on one thread.
    cpu = {name: run["useful_tokens"] / run["cpu_seconds"] for name, run in runs.items()
           if run.get("cpu_seconds")}
    out.update({f"{a} / {b} (CPU time)": ratio(cpu[a], cpu[b]) for a, b in pairs
                if a in cpu and b in cpu})
    if "continuous-16 / static-16" in out and out["continuous-16 / static-16"] is not None:
        out["continuous-16 / static-16 as a fraction of ideal"] = (
            out["continuous-16 / static-16"] * u_static)
    return out


def _targets(runs: dict[str, dict[str, Any]], ratios: dict[str, float | None]
             ) -> dict[str, dict[str, Any]]:
    targets: dict[str, dict[str, Any]] = {}
    frac = ratios.get("continuous-16 / static-16 as a fraction of ideal")
    if frac is not None:
        targets["continuous-16 over static-16 >= 0.85 of 1/U_static"] = {
            "value": frac, "threshold": TARGETS["fraction_of_ideal"],
            "met": frac >= TARGETS["fraction_of_ideal"]}
    for name in ("continuous-64", "continuous-64+ngram"):
        over_hf = ratios.get(f"{name} / hf-16")
        if over_hf is not None:
            targets[f"{name} over hf-16 >= 5.5"] = {
                "value": over_hf, "threshold": TARGETS["over_hf"],
                "met": over_hf >= TARGETS["over_hf"]}
    for name, run in runs.items():
        if run["kind"] != "engine" or run["policy"] == "static":
            continue
        steady = run["slot_utilization_steady"]
        # Only meaningful when requests outnumber slots: otherwise the queue is non-empty
        # only while the token budget spreads the first prefills over a few steps.
        if steady is not None and run["num_requests"] > run["max_num_seqs"]:
            targets[f"{name} steady slot utilization >= 0.97"] = {
                "value": steady, "threshold": TARGETS["slot_utilization_steady"],
                "met": steady >= TARGETS["slot_utilization_steady"]}
        if run["kv_waste"] is not None:
            targets[f"{name} KV waste < 0.04"] = {
                "value": run["kv_waste"], "threshold": TARGETS["kv_waste"],
                "met": run["kv_waste"] < TARGETS["kv_waste"]}
    return targets


def run_benchmark(opts: BenchOptions, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the selected configurations, write ``bench.json`` (and the occupancy PNG when
    both continuous-16 and static-16 ran) under ``opts.out_dir``; return the JSON data."""
    import torch
    from transformers import AutoConfig

    from worker.engine.bench.engine_run import run_engine, warm_up
    from worker.engine.bench.hf_run import load_hf_model, run_hf, warm_up_hf
    from worker.engine.bench.plot import plot_occupancy
    from worker.engine.config import EngineArgs
    from worker.engine.llm_engine import LLMEngine
    from worker.engine.models.loader import resolve_checkpoint_dir

    unknown = [c for c in opts.configs if c not in CONFIGS]
    if unknown:
        raise ValueError(f"unknown configs {unknown}; choose from {list(CONFIGS)}")
    if opts.threads:
        torch.set_num_threads(opts.threads)
    requests = read_workload(opts.workload, opts.limit)
    if not requests:
        raise ValueError(f"{opts.workload}: no requests")
    vocab = AutoConfig.from_pretrained(resolve_checkpoint_dir(opts.model)).vocab_size
    requests = fit_to_vocab(requests, vocab)
    info = _workload_info(Path(opts.workload), requests)
    say(f"workload: {info['num_requests']} requests, {info['useful_tokens']} output tokens, "
        f"U_static={info['u_static']:.3f}, ideal 1/U_static={info['ideal_speedup']:.3f}, "
        f"FCFS step bound={info['fcfs_step_bound']:.3f}")
    runs: dict[str, dict[str, Any]] = {}
    out_dir = Path(opts.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    def write() -> dict[str, Any]:
        """Write the JSON of the runs so far (after each run, so a long run leaves partial
        figures behind if it is stopped)."""
        ratios = _ratios(runs, info["u_static"])
        result = {
            "command": opts.command,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "model": opts.model, "dtype": opts.dtype, "machine": _machine(),
            "workload": info, "definitions": DEFINITIONS, "runs": runs, "ratios": ratios,
            "targets": _targets(runs, ratios),
            "complete": all(c in runs for c in opts.configs),
        }
        (out_dir / OUTPUT_JSON).write_text(json.dumps(result, indent=1) + "\n",
                                           encoding="utf-8")
        return result

    engine_names = [c for c in opts.configs if CONFIGS[c].kind == "engine"]
    if engine_names:
        slots = max(CONFIGS[c].slots for c in engine_names)
        engine = LLMEngine(EngineArgs(
            model=opts.model, dtype=opts.dtype, max_num_seqs=slots, num_threads=opts.threads,
            num_kv_blocks=opts.num_kv_blocks or kv_blocks_for(requests, 16, slots)))
        say(f"engine: {opts.model} {engine.dtype}, {engine.block_manager.num_blocks} KV blocks "
            f"of {engine.block_size}, loaded in {engine.load_seconds:.1f}s; warming up")
        warm_up(engine, requests)
        for name in engine_names:
            cfg = CONFIGS[name]
            say(f"running {name} ...")
            runs[name] = run_engine(engine, requests, name=name, max_num_seqs=cfg.slots,
                                    policy=cfg.policy, speculative_tokens=cfg.speculative_tokens)
            runs[name]["peak_rss_bytes"] = peak_rss_bytes()  # the engine's, before HF loads
            say(f"  {runs[name]['useful_tokens_per_s']:.1f} tok/s in "
                f"{runs[name]['wall_seconds']:.1f}s, {runs[name]['num_steps']} steps")
            write()
        del engine
        gc.collect()
    if "hf-16" in opts.configs:
        model, pad_id = load_hf_model(opts.model, opts.dtype)
        warm_up_hf(model, requests, pad_id)
        say("running hf-16 ...")
        runs["hf-16"] = run_hf(model, requests, batch_size=CONFIGS["hf-16"].slots, pad_id=pad_id)
        say(f"  {runs['hf-16']['useful_tokens_per_s']:.1f} tok/s in "
            f"{runs['hf-16']['wall_seconds']:.1f}s")
        del model
        gc.collect()
    result = write()
    if "continuous-16" in runs and "static-16" in runs:
        plot_occupancy(out_dir / OUTPUT_PNG, {
            "continuous-16": runs["continuous-16"]["occupancy"],
            "static-16": runs["static-16"]["occupancy"]},
            slots=16, title=f"{opts.model}, {info['num_requests']} requests: sequences per step")
    return result


def format_report(result: dict[str, Any]) -> str:
    """The human-readable summary printed at the end of a run."""
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    lines = [f"{'config':<21}{'tok/s':>9}{'wall s':>9}{'steps':>7}{'util':>8}{'steady':>8}"
             f"{'KV waste':>10}{'sched':>8}{'ms/step':>9}{'RSS MB':>8}"]
    for name, r in result["runs"].items():
        rss = r.get("peak_rss_bytes")
        lines.append(
            f"{name:<21}{r['useful_tokens_per_s']:>9.1f}{r['wall_seconds']:>9.1f}"
            f"{r['num_steps']:>7}{pct(r.get('slot_utilization')):>8}"
            f"{pct(r.get('slot_utilization_steady')):>8}{pct(r.get('kv_waste')):>10}"
            f"{pct(r.get('scheduler_overhead')):>8}{r['mean_step_ms'] or 0:>9.1f}"
            f"{'-' if rss is None else f'{rss / 2**20:.0f}':>8}")
        if r.get("draft_tokens"):
            lines.append(f"{'':<21}drafts {r['draft_tokens']}, accepted "
                         f"{r['accepted_draft_tokens']} ({pct(r['accepted_draft_tokens'] / r['draft_tokens'])})")
    w = result["workload"]
    lines.append(f"U_static={w['u_static']:.3f}  ideal 1/U_static={w['ideal_speedup']:.3f}  "
                 f"FCFS step bound={w['fcfs_step_bound']:.3f}")
    lines += [f"{k:<50}{v:>8.3f}" for k, v in result["ratios"].items() if v is not None]
    for k, t in result["targets"].items():
        lines.append(f"target {k}: {t['value']:.3f} ({'met' if t['met'] else 'MISSED'})")
    return "\n".join(lines)
