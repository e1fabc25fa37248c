"""One command that proves the GPU path: kernels, graphs, parity, throughput, bandwidth.

    python benchmarks/gpu_check.py OUT_DIR                         # on a CUDA machine
    python benchmarks/gpu_check.py OUT_DIR --device cpu --quick    # the same, tiny, on CPU

Needs only torch, triton and transformers (pytest too for the two test sections, else
they are skipped with the reason); no Redis, SQL, network or model download. Writes
``gpu_check.json`` and ``gpu_check.md`` into OUT_DIR. Sections run in turn, each timed;
one that fails is recorded and the next one still runs. The exit status is 0 when no
section failed. See docs/kernels.md ("Checking a GPU machine").
"""

from __future__ import annotations

import argparse
import datetime
import functools
import shlex
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("kernel_tests", "gpu_tests", "parity", "decode_graphs", "bandwidth", "throughput")
TITLES = {"kernel_tests": "Triton kernel tests on CUDA", "gpu_tests": "Engine tests marked gpu",
          "parity": "Greedy parity against HF generate", "decode_graphs": "CUDA-graph decode",
          "bandwidth": "Decode attention and decode step bandwidth",
          "throughput": "Throughput on the heavy-tailed workload"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="where gpu_check.json and .md are written")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (the CPU/CI run)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="seconds the run may take (default 450)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.sections = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(args.sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {list(SECTIONS)}")
    return args


def goals_table(sections: list[dict[str, Any]], on_gpu: bool) -> list[dict[str, Any]]:
    """The issue's goals against the figures measured (meaningful on a GPU only)."""
    from benchmarks.gpucheck.sections import GOALS

    found: dict[str, float] = {}
    for s in sections:
        found.update(s["figures"].get("goals", {}))
    rows = []
    for name, target in GOALS.items():
        value = found.get(name)
        at_most = "(at most)" in name
        met = None if value is None or not on_gpu else (
            value <= target if at_most else value >= target)
        rows.append({"goal": name, "target": target, "value": value, "met": met})
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every selected section in turn; the result written as JSON and Markdown."""
    import torch

    from benchmarks.gpucheck import device as dev
    from benchmarks.gpucheck import report, sections
    from benchmarks.gpucheck.plan import DEFAULT_BUDGET_S, make_plan
    from benchmarks.gpucheck.workspace import Workspace

    name = args.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    device = torch.device(name)
    plan = make_plan(device, quick=args.quick, budget_s=args.budget_s or DEFAULT_BUDGET_S,
                     seed=args.seed)
    bodies = {"kernel_tests": sections.kernel_tests, "gpu_tests": sections.gpu_tests,
              "parity": sections.parity_checks, "decode_graphs": sections.decode_graphs,
              "bandwidth": sections.bandwidth_figures, "throughput": sections.throughput_runs}
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    start = time.perf_counter()
    workspace = Workspace(plan, started=start)
    results = []
    try:
        for key in args.sections:
            left = workspace.seconds_left()
            skip = None
            if left < plan.min_seconds.get(key, 0):
                skip = f"out of the time budget ({left:.0f}s left of {plan.budget_s:.0f}s)"
            print(f"[gpu_check] {key} ...", flush=True)
            body = functools.partial(bodies[key], ws=workspace)
            results.append(report.run_section(key, TITLES[key], body, skip_reason=skip))
            print(f"[gpu_check] {key}: {results[-1]['status']} in {results[-1]['seconds']:.1f}s",
                  flush=True)
    finally:
        workspace.close()
    result = {
        "tool": "benchmarks/gpu_check.py", "command": shlex.join(sys.argv),
        "started": started, "seconds": round(time.perf_counter() - start, 1),
        "budget_s": plan.budget_s, "quick": plan.quick, "device": dev.describe(device),
        "gpu_figures": device.type == "cuda",
        "status": report.overall_status(results), "sections": results,
        "goals": goals_table(results, device.type == "cuda"),
    }
    report.write_reports(args.out_dir, result)
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the check; exit status 0 when no section failed."""
    args = parse_args(argv)
    if str(REPO_ROOT) not in sys.path:  # run as a file: make the repository importable
        sys.path.insert(0, str(REPO_ROOT))
    result = run(args)
    print(f"[gpu_check] {result['status']} in {result['seconds']:.0f}s; report in {args.out_dir}")
    return 0 if result["status"] == "passed" else 1


if __name__ == "__main__":
    sys.exit(main())
