"""What a benchmark run concludes: ratios between its runs, agreement of their outputs,
the targets of the issues that asked for them, and the printed summary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cli.bench.metrics import ratio

TARGETS = {"fraction_of_ideal": 0.85, "slot_utilization_steady": 0.97, "kv_waste": 0.04,
           "over_hf": 5.5, "over_vllm": 1.5, "peak_rss_bytes": 2 * 10**9}
AGREEMENT_PREFIX = 16  # tokens compared per request for "agreement with the exact output"
PAIRS = [("continuous-16", "static-16"), ("continuous-16", "static-padded-16"),
         ("static-16", "static-padded-16"), ("continuous-64", "static-16"),
         ("continuous-64", "continuous-16"), ("continuous-64+ngram", "continuous-64"),
         ("inflight-bf16", "inflight")]
BASELINES = ("vllm", "hf-16")


def _pairs(names: Sequence[str]) -> list[tuple[str, str]]:
    pairs = [(a, b) for a, b in PAIRS if a in names and b in names]
    for base in BASELINES:
        if base in names:
            pairs += [(n, base) for n in names if n != base and n not in BASELINES]
    if "vllm" in names and "hf-16" in names:
        pairs.append(("vllm", "hf-16"))
    return pairs


def ratios_of(runs: Mapping[str, dict[str, Any]], u_static: float) -> dict[str, float | None]:
    """Useful tokens/s of each run over each baseline (vLLM, HF) and of the listed pairs,
    on wall-clock and on CPU time."""
    pairs = _pairs(list(runs))
    tps = {name: run["useful_tokens_per_s"] for name, run in runs.items()}
    out = {f"{a} / {b}": ratio(tps[a], tps[b]) for a, b in pairs}
    # The same ratios on CPU time: less sensitive to other load when running on one thread.
    cpu = {name: run["useful_tokens"] / run["cpu_seconds"] for name, run in runs.items()
           if run.get("cpu_seconds")}
    out.update({f"{a} / {b} (CPU time)": ratio(cpu[a], cpu[b]) for a, b in pairs
                if a in cpu and b in cpu})
    for static in ("static-16", "static-padded-16"):  # ideal speed-up: 1 / U_static
        measured = out.get(f"continuous-16 / {static}")
        if measured is not None:
            out[f"continuous-16 / {static} as a fraction of ideal"] = measured * u_static
    return out


def agreement(reference: Mapping[str, Sequence[int]], other: Mapping[str, Sequence[int]],
              prefix: int = AGREEMENT_PREFIX) -> float | None:
    """Share of requests whose first ``prefix`` output tokens equal the reference's."""
    common = [rid for rid in reference if rid in other]
    if not common:
        return None
    same = sum(list(reference[rid][:prefix]) == list(other[rid][:prefix]) for rid in common)
    return same / len(common)


def targets_of(runs: Mapping[str, dict[str, Any]], ratios: Mapping[str, float | None],
               over_vllm: float = TARGETS["over_vllm"]) -> dict[str, dict[str, Any]]:
    """Each target that this run's configurations can answer, with its value
    (``over_vllm``: the workload's own target over the peer)."""
    targets: dict[str, dict[str, Any]] = {}

    def add(name: str, value: float | None, threshold: float, met: bool | None = None) -> None:
        if value is not None:
            targets[name] = {"value": value, "threshold": threshold,
                             "met": value >= threshold if met is None else met}

    for static in ("static-16", "static-padded-16"):
        add(f"continuous-16 over {static} >= 0.85 of 1/U_static",
            ratios.get(f"continuous-16 / {static} as a fraction of ideal"),
            TARGETS["fraction_of_ideal"])
    add(f"inflight over vllm >= {over_vllm:g}", ratios.get("inflight / vllm"), over_vllm)
    for name in ("continuous-64", "continuous-64+ngram"):
        add(f"{name} over hf-16 >= 5.5", ratios.get(f"{name} / hf-16"), TARGETS["over_hf"])
    if "inflight" in runs and runs["inflight"].get("peak_rss_bytes"):
        rss = runs["inflight"]["peak_rss_bytes"]
        add("inflight peak RSS <= 2 GB", rss, TARGETS["peak_rss_bytes"],
            met=rss <= TARGETS["peak_rss_bytes"])
    for name, run in runs.items():
        if run["kind"] != "engine" or run["policy"].startswith("static"):
            continue
        steady = run["slot_utilization_steady"]
        # Only meaningful when requests outnumber slots: otherwise the queue is non-empty
        # only while the token budget spreads the first prefills over a few steps.
        if steady is not None and run["num_requests"] > run["max_num_seqs"]:
            add(f"{name} steady slot utilization >= 0.97", steady,
                TARGETS["slot_utilization_steady"])
        if run["kv_waste"] is not None:
            add(f"{name} KV waste < 0.04", run["kv_waste"], TARGETS["kv_waste"],
                met=run["kv_waste"] < TARGETS["kv_waste"])
    return targets


def format_report(result: dict[str, Any]) -> str:
    """The human-readable summary printed at the end of a run."""
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    cpu = result["machine"]["cpu"]
    lines = [f"machine: {cpu['model']} ({', '.join(cpu['vector_extensions']) or 'no AVX2'}), "
             f"{result['machine']['cpu_count']} CPUs, native kernel "
             f"{result['machine']['native_kernel_isa']}, allocator "
             f"{result['machine'].get('allocator', 'system')}",
             f"{'config':<21}{'tok/s':>9}{'wall s':>9}{'steps':>7}{'util':>8}{'steady':>8}"
             f"{'KV waste':>10}{'sched':>8}{'ms/step':>9}{'RSS MB':>8}{'agree':>8}"]
    for name, r in result["runs"].items():
        rss = r.get("peak_rss_bytes")
        lines.append(
            f"{name:<21}{r['useful_tokens_per_s']:>9.1f}{r['wall_seconds']:>9.1f}"
            f"{num(r.get('num_steps'), 'd'):>7}{pct(r.get('slot_utilization')):>8}"
            f"{pct(r.get('slot_utilization_steady')):>8}{pct(r.get('kv_waste')):>10}"
            f"{pct(r.get('scheduler_overhead')):>8}{num(r.get('mean_step_ms'), '.1f'):>9}"
            f"{'-' if not rss else f'{rss / 2**20:.0f}':>8}{pct(r.get('agreement')):>8}")
        if r.get("draft_tokens"):
            lines.append(f"{'':<21}drafts {r['draft_tokens']}, accepted "
                         f"{r['accepted_draft_tokens']} ({pct(r['accepted_draft_tokens'] / r['draft_tokens'])})")
    search = result["runs"].get("vllm", {}).get("search")
    if search:
        lines.append(f"vllm at its best of {len(search['tries'])} settings: {search['best']}")
    w = result["workload"]
    lines.append(f"U_static={w['u_static']:.3f}  ideal 1/U_static={w['ideal_speedup']:.3f}  "
                 f"FCFS step bound={w['fcfs_step_bound']:.3f}")
    lines += [f"{k:<50}{v:>8.3f}" for k, v in result["ratios"].items() if v is not None]
    for k, t in result["targets"].items():
        lines.append(f"target {k}: {t['value']:.3f} ({'met' if t['met'] else 'MISSED'})")
    return "\n".join(lines)
