"""Deadline misses and slack of a day of batches under arrival order and least slack: a
simulation on recorded step costs, with the ordering the workers use (it imports
``worker.queue.slack``: the lane rule and ``read_order``; nothing of it is written again).

    python -m benchmarks.deadline_sim                     # 1-8 workers, 5 seeds, a few seconds
    python -m benchmarks.deadline_sim --plot docs/deadline_sim.png --out results.json

**Work.** Batches arrive over one day (Poisson, busier in working hours: rate times
``1 + 0.8 sin``), each with a completion window of 1 h (30 %), 4 h (30 %) or 24 h (40 %)
and 20 to 2,000 lines (log-uniform); every line is a request of the chat workload
(``benchmarks/chat_workload.jsonl``: its prompt and its ``max_tokens`` of output, run to
the end as the benchmarks do), drawn at random. The day's work is ``--load`` worker-days
at full concurrency (3 by default: one or two workers cannot do it, eight have room).

**Workers.** Each runs up to ``--max-num-seqs`` requests at once (48); a request costs
its prompt rows and its output rows at the recorded step cost
(``benchmarks/step_costs.py``: ``step_s + prefill_s * prompt rows + decode_s * output
rows`` fitted to ``benchmarks/step_costs_smollm2.csv``, SmolLM2-135M on this machine),
its share of each step's fixed part falling with the number of sequences running. Time
moves in ticks of ``--tick`` seconds (30); in each, every worker spends its engine time on
the work in the order of its policy, going on to the next lane while it has time
(work-conserving), like the intake's reads; the order is computed afresh each tick from
the lanes' states, as the intake refreshes its own.

**Policies.** *arrival*: one stream in arrival order (the service before the lanes).
*least-slack*: the lanes of ``worker.queue.slack`` (a job to the lane of its deadline),
read by ``read_order`` at the fleet's measured rate (estimated work finished per
engine-second, smoothed as ``worker.service.dispatch`` does; none before the first tick:
earliest deadline first). *earliest-deadline*: the same lanes and ``read_order`` without
a rate (its work term left out), for reference.

**Deadlines.** A batch is due at its arrival plus its window; lines still queued then
expire (the service expires the batch and cancels them). A batch is *missed* when any line
expired. *Slack* is its deadline less the time its last line finished, over the batches
met.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.step_costs import StepCostModel, fit, read_rows
from worker.queue.slack import LaneState, lane_end, read_order

ROOT = Path(__file__).resolve().parent
DAY = 86400.0
WINDOWS = [(3600.0, 0.3), (4 * 3600.0, 0.3), (24 * 3600.0, 0.4)]
POLICIES = ("arrival", "least-slack", "earliest-deadline")
SMOOTHING = 0.3  # as worker.service.dispatch


@dataclass
class Batch:
    """One batch: when it came, when it is due, its lines and their mean prompt and output
    tokens; what is left of it as the simulation runs."""

    created: float
    window: float
    lines: int
    prompt: float
    output: float
    left: float = 0.0  # lines not yet run (fractions: a worker's tick ends inside a line)
    expired: float = 0.0
    finished: float | None = None

    @property
    def deadline(self) -> float:
        """When it is due: its arrival plus its window."""
        return self.created + self.window

    @property
    def estimate(self) -> float:
        """Estimated tokens per line, as ``worker.protocol.work_estimate`` counts them."""
        return self.prompt + self.output


@dataclass
class Lane:
    """A stream of batches in arrival order, with what was published into it."""

    name: str
    deadline: float
    batches: deque[Batch] = field(default_factory=deque)
    published: int = 0
    work: float = 0.0

    def state(self) -> LaneState:
        remaining = sum(math.ceil(b.left) for b in self.batches)
        return LaneState(stream=self.name, deadline=self.deadline, remaining=remaining,
                         undelivered=remaining, work_per_entry=self.work / max(self.published, 1))


def day_of_batches(seed: int, load: float, costs: StepCostModel, max_num_seqs: int,
                   requests: list[tuple[int, int]]) -> list[Batch]:
    """A day of batches whose work is ``load`` worker-days at full concurrency."""
    rng = random.Random(seed)
    batches: list[Batch] = []
    budget = load * DAY  # engine-seconds at max_num_seqs
    while budget > 0:
        window = rng.choices([w for w, _ in WINDOWS], weights=[p for _, p in WINDOWS])[0]
        lines = int(math.exp(rng.uniform(math.log(20), math.log(2000))))
        drawn = [rng.choice(requests) for _ in range(lines)]
        prompt = sum(p for p, _ in drawn) / lines
        output = sum(o for _, o in drawn) / lines
        batches.append(Batch(0.0, window, lines, prompt, output, left=float(lines)))
        budget -= lines * costs.line_seconds(prompt, output, max_num_seqs)
    # spread the arrivals over the day, busier in working hours (a thinned sine)
    for b, at in zip(batches, sorted(_diurnal_times(rng, len(batches))), strict=True):
        b.created = at
    return batches


def _diurnal_times(rng: random.Random, n: int) -> list[float]:
    out: list[float] = []
    while len(out) < n:
        t = rng.uniform(0, DAY)
        if rng.uniform(0, 1.8) <= 1 + 0.8 * math.sin(2 * math.pi * (t - 6 * 3600) / DAY):
            out.append(t)
    return out


def simulate(batches: list[Batch], policy: str, workers: int, costs: StepCostModel,
             max_num_seqs: int, tick: float) -> dict[str, Any]:
    """Run the day under ``policy`` with ``workers`` workers; the figures of the batches."""
    pending = sorted(batches, key=lambda b: b.created)
    for b in pending:
        b.left, b.expired, b.finished = float(b.lines), 0.0, None
    lanes: dict[str, Lane] = {}
    rate: float | None = None  # the fleet's estimated tokens per engine-second
    arrived = 0
    t = 0.0
    horizon = max(b.deadline for b in batches) + tick
    while t < horizon:
        while arrived < len(pending) and pending[arrived].created <= t:
            _publish(lanes, pending[arrived], policy)
            arrived += 1
        _expire(lanes, t)
        order = _order(lanes, policy, t, rate)
        queued = sum(b.left for lane in lanes.values() for b in lane.batches)
        concurrency = min(max_num_seqs, max(1.0, queued / workers))
        done_work = 0.0
        busy = 0.0
        for _ in range(workers):
            work, used = _work_a_tick(order, t, tick, concurrency, costs)
            done_work, busy = done_work + work, busy + used
        if busy > 0 and done_work > 0:
            sample = done_work / busy * workers  # each worker's rate, summed
            rate = sample if rate is None else SMOOTHING * sample + (1 - SMOOTHING) * rate
        for name in [n for n, lane in lanes.items() if not lane.batches]:
            del lanes[name]  # drained: the trim drops it
        t += tick
    return _figures(batches)


def _publish(lanes: dict[str, Lane], b: Batch, policy: str) -> None:
    name = "arrival" if policy == "arrival" else str(lane_end(b.deadline, b.created))
    lane = lanes.get(name)
    if lane is None:
        lane = lanes[name] = Lane(name, b.deadline)
    lane.deadline = min(lane.deadline, b.deadline)
    lane.batches.append(b)
    lane.published += b.lines
    lane.work += b.lines * b.estimate


def _expire(lanes: dict[str, Lane], now: float) -> None:
    """Lines still queued at their batch's deadline expire; finished batches leave."""
    for lane in lanes.values():
        for b in lane.batches:
            if b.deadline <= now and b.left > 0:
                b.expired, b.left = b.left, 0.0
        lane.batches = deque(b for b in lane.batches if b.left > 0)


def _order(lanes: dict[str, Lane], policy: str, now: float, rate: float | None) -> list[Lane]:
    if policy == "arrival":
        return list(lanes.values())
    states = read_order([lane.state() for lane in lanes.values()], now=now,
                        rate=rate if policy == "least-slack" else None)
    return [lanes[s.stream] for s in states]


def _work_a_tick(order: list[Lane], t: float, tick: float, concurrency: float,
                 costs: StepCostModel) -> tuple[float, float]:
    """One worker's tick: engine time spent down the order; (estimated work done, time used)."""
    left, work = tick, 0.0
    for lane in order:
        for b in lane.batches:
            if left <= 0:
                return work, tick
            if b.left <= 0:
                continue
            per_line = costs.line_seconds(b.prompt, b.output, concurrency)
            lines = min(b.left, left / per_line)
            b.left -= lines
            left -= lines * per_line
            work += lines * b.estimate
            if b.left <= 1e-9:
                b.left, b.finished = 0.0, t + (tick - left)
    return work, tick - left


def _figures(batches: list[Batch]) -> dict[str, Any]:
    met = [b for b in batches if b.expired == 0 and b.finished is not None]
    lines = sum(b.lines for b in batches)
    slack = [b.deadline - (b.finished or 0.0) for b in met]
    by_window = {}
    for w, _ in WINDOWS:
        of = [b for b in batches if b.window == w]
        spare = [b.deadline - (b.finished or 0.0) for b in of if b in met]
        by_window[f"{w / 3600:g}h"] = {"batches": len(of),
                                        "missed": sum(b.expired > 0 for b in of),
                                        "met": len(spare), "slack_s": sum(spare)}
    return {
        "batches": len(batches),
        "missed": len(batches) - len(met),
        "lines": lines,
        "expired_lines": round(sum(b.expired for b in batches)),
        "mean_slack_h": round(sum(slack) / len(slack) / 3600, 3) if slack else None,
        "min_slack_h": round(min(slack) / 3600, 3) if slack else None,
        "by_window": by_window,
    }


def run(*, seeds: int, load: float, max_num_seqs: int, tick: float, workers: range,
        costs_path: Path, workload: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every policy for every worker count over ``seeds`` days: the summed figures."""
    costs = fit(read_rows(costs_path))
    requests = [(len(r["prompt_token_ids"]), int(r["max_tokens"]))
                for r in map(json.loads, workload.read_text().splitlines())]
    days = [day_of_batches(s, load, costs, max_num_seqs, requests) for s in range(seeds)]
    results: dict[str, Any] = {
        "costs": {"file": costs_path.name, "step_s": costs.step_s, "prefill_s": costs.prefill_s,
                  "decode_s": costs.decode_s, "rows": costs.rows},
        "seeds": seeds, "load_worker_days": load, "max_num_seqs": max_num_seqs, "tick_s": tick,
        "batches": sum(len(d) for d in days), "runs": [],
    }
    for w in workers:
        for policy in POLICIES:
            total: dict[str, Any] = {"workers": w, "policy": policy}
            slacks, mins = [], []
            for day in days:
                f = simulate(day, policy, w, costs, max_num_seqs, tick)
                for k in ("batches", "missed", "lines", "expired_lines"):
                    total[k] = total.get(k, 0) + f[k]
                for name, v in f["by_window"].items():
                    agg = total.setdefault("by_window", {}).setdefault(
                        name, {"batches": 0, "missed": 0, "met": 0, "slack_s": 0.0})
                    for k in agg:
                        agg[k] += v[k]
                if f["mean_slack_h"] is not None:
                    slacks.append((f["mean_slack_h"], f["batches"] - f["missed"]))
                    mins.append(f["min_slack_h"])
            met = sum(n for _, n in slacks)
            total["mean_slack_h"] = round(sum(s * n for s, n in slacks) / met, 2) if met else None
            for agg in total["by_window"].values():
                agg["mean_slack_h"] = (round(agg["slack_s"] / agg["met"] / 3600, 2)
                                       if agg["met"] else None)
            total["min_slack_h"] = round(min(mins), 2) if mins else None
            results["runs"].append(total)
            log(f"{w} workers  {policy:17} missed {total['missed']:4}/{total['batches']}  "
                f"expired lines {100 * total['expired_lines'] / total['lines']:5.1f}%  "
                f"mean slack {total['mean_slack_h']} h")
    return results


def table(results: dict[str, Any]) -> str:
    """The results as a Markdown table."""
    out = ["| workers | policy | batches missed | lines expired | missed 1 h / 4 h / 24 h | "
           "mean slack of the met (h) | ... 1 h / 4 h / 24 h (h) |",
           "|---:|---|---:|---:|---|---:|---|"]
    for r in results["runs"]:
        bw = r["by_window"]
        per = " / ".join(f"{bw[k]['missed']}" for k in ("1h", "4h", "24h"))
        spare = " / ".join(f"{bw[k]['mean_slack_h']}" for k in ("1h", "4h", "24h"))
        out.append(f"| {r['workers']} | {r['policy']} | {r['missed']} of {r['batches']} "
                   f"({100 * r['missed'] / r['batches']:.1f} %) | "
                   f"{100 * r['expired_lines'] / r['lines']:.1f} % | {per} | "
                   f"{r['mean_slack_h']} | {spare} |")
    return "\n".join(out)


def plot(results: dict[str, Any], path: Path) -> None:
    """Misses and mean slack against the number of workers, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for policy in POLICIES:
        rows = [r for r in results["runs"] if r["policy"] == policy]
        ws = [r["workers"] for r in rows]
        ax1.plot(ws, [100 * r["missed"] / r["batches"] for r in rows], marker="o", label=policy)
        ax2.plot(ws, [r["mean_slack_h"] for r in rows], marker="o", label=policy)
    ax1.set(xlabel="workers", ylabel="batches missed (%)", title="Deadline misses")
    ax2.set(xlabel="workers", ylabel="hours", title="Mean slack of the batches met")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"A day of batches ({results['batches']} over {results['seeds']} seeds, "
                 f"{results['load_worker_days']:g} worker-days of work), recorded SmolLM2 "
                 "step costs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--load", type=float, default=3.0, help="the day's work in worker-days")
    p.add_argument("--max-num-seqs", type=int, default=48)
    p.add_argument("--tick", type=float, default=30.0)
    p.add_argument("--workers", type=int, default=8, help="simulate 1 to this many workers")
    p.add_argument("--costs", type=Path, default=ROOT / "step_costs_smollm2.csv")
    p.add_argument("--workload", type=Path, default=ROOT / "chat_workload.jsonl")
    p.add_argument("--plot", type=Path, default=None)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    t0 = time.perf_counter()
    results = run(seeds=args.seeds, load=args.load, max_num_seqs=args.max_num_seqs,
                  tick=args.tick, workers=range(1, args.workers + 1), costs_path=args.costs,
                  workload=args.workload)
    results["seconds"] = round(time.perf_counter() - t0, 1)
    print(table(results))
    print(f"({results['seconds']} s)")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
