"""Recorded engine step costs, in the rows of the ``iterations`` table (what every worker
writes per step: ``worker.service.observe.trace_row``), and the step-cost model fitted to
them, which ``benchmarks/deadline_sim.py`` runs on.

    python -m benchmarks.step_costs record -o benchmarks/step_costs_smollm2.csv
        # a short run of the engine on the chat workload (96 requests, up to 48 at once)
    python -m benchmarks.step_costs export --database-url URL [--worker ID] -o FILE.csv
        # the iterations a deployment's workers wrote (the same columns)

The model: a step costs ``step_s + prefill_s * prompt rows + decode_s * output rows``, a
least-squares fit over the rows (the fixed part is what a step costs whatever it computes,
so a token's share falls as more sequences share the steps).
"""

from __future__ import annotations

import argparse
import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COLUMNS = ["worker_id", "step", "num_running", "num_waiting", "num_prefill_tokens",
           "num_decode_tokens", "schedule_ms", "forward_ms", "sample_ms"]
ROOT = Path(__file__).resolve().parent


@dataclass(frozen=True)
class StepCostModel:
    """``step_s + prefill_s * prompt rows + decode_s * output rows`` seconds per step."""

    step_s: float
    prefill_s: float
    decode_s: float
    rows: int  # how many recorded steps it was fitted to

    def step_seconds(self, prefill: float, decode: float) -> float:
        """The time of one step computing ``prefill`` prompt rows and ``decode`` output rows."""
        return self.step_s + self.prefill_s * prefill + self.decode_s * decode

    def line_seconds(self, prompt: float, output: float, concurrency: float) -> float:
        """Engine time one request takes, its prompt computed and ``output`` tokens decoded in
        steps it shares with ``concurrency`` sequences (its share of each step's fixed part)."""
        k = max(1.0, concurrency)
        return self.prefill_s * prompt + output * (self.step_s / k + self.decode_s)


def fit(rows: list[dict[str, Any]]) -> StepCostModel:
    """The step-cost model of recorded rows, in two fits: the fixed part and the cost per
    output row through the median time of the steps of each output-row count that
    computed no prompt rows (weighted by how many there were: a step slowed by another
    process on the machine moves a median little), then the cost per prompt row from the
    others, less what the first fit gives them. Coefficients are kept non-negative."""
    import statistics

    import numpy as np

    def seconds(r: dict[str, Any]) -> float:
        return (float(r["schedule_ms"]) + float(r["forward_ms"]) + float(r["sample_ms"])) / 1000

    decode: dict[int, list[float]] = {}
    for r in rows:
        if int(r["num_prefill_tokens"]) == 0:
            decode.setdefault(int(r["num_decode_tokens"]), []).append(seconds(r))
    prefill = [r for r in rows if int(r["num_prefill_tokens"]) > 0]
    weight = np.sqrt([len(v) for v in decode.values()])  # (counts,)
    x = np.array([[1.0, float(k)] for k in decode]) * weight[:, None]  # (counts, 2)
    y = np.array([statistics.median(v) for v in decode.values()]) * weight  # (counts,)
    (step_s, decode_s), *_ = np.linalg.lstsq(x, y, rcond=None)
    step_s, decode_s = max(float(step_s), 0.0), max(float(decode_s), 0.0)
    left = [seconds(r) - step_s - decode_s * float(r["num_decode_tokens"]) for r in prefill]
    rows_p = [float(r["num_prefill_tokens"]) for r in prefill]
    prefill_s = max(sum(a * b for a, b in zip(left, rows_p, strict=True))
                    / max(sum(b * b for b in rows_p), 1e-12), 0.0)
    return StepCostModel(step_s, prefill_s, decode_s, len(rows))


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a recorded step-cost CSV."""
    with path.open() as f:
        return list(csv.DictReader(f))


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write iteration rows (the ``COLUMNS``) as CSV."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()
                        if k in COLUMNS})


def record(model: str, requests: int, max_num_seqs: int, workload: Path) -> list[dict[str, Any]]:
    """Run the engine on the first ``requests`` prompts of ``workload`` (all added at once,
    outputs of the workload's lengths, so the batch ramps down from ``max_num_seqs``) and
    return each step as the worker writes it to ``iterations``."""
    from worker.engine import EngineArgs, LLMEngine, SamplingParams
    from worker.service.observe import trace_row

    engine = LLMEngine(EngineArgs(model=model, max_num_seqs=max_num_seqs))
    items = [json.loads(line) for line in workload.read_text().splitlines()[:requests]]
    engine.add_request("warmup", items[0]["prompt_token_ids"][:16],
                       SamplingParams(max_tokens=4, temperature=0.0))
    while engine.has_unfinished_requests():
        engine.step()
    for item in items:
        engine.add_request(item["id"], item["prompt_token_ids"],
                           SamplingParams(max_tokens=item["max_tokens"], temperature=0.0,
                                          ignore_eos=True))
    rows = []
    while engine.has_unfinished_requests():
        _, stats = engine.step()
        rows.append(trace_row(f"record-{model}", stats))
    return rows


def export(database_url: str, worker: str | None) -> list[dict[str, Any]]:
    """The ``iterations`` rows of a deployment (of one worker, when given), oldest first."""
    from sqlalchemy import select

    from worker.store.db import make_engine, make_session_factory
    from worker.store.models import Iteration

    db = make_engine(url=database_url)
    try:
        with make_session_factory(engine=db)() as s:
            stmt = select(Iteration).order_by(Iteration.time)
            if worker:
                stmt = stmt.where(Iteration.worker_id == worker)
            return [{c: getattr(row, c) for c in COLUMNS} for row in s.scalars(stmt)]
    finally:
        db.dispose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("record", help="record step costs from a short engine run")
    r.add_argument("--model", default="smollm2-135m")
    r.add_argument("--requests", type=int, default=96)
    r.add_argument("--max-num-seqs", type=int, default=48)
    r.add_argument("--workload", type=Path, default=ROOT / "chat_workload.jsonl")
    e = sub.add_parser("export", help="the iterations table of a deployment")
    e.add_argument("--database-url", required=True)
    e.add_argument("--worker", default=None)
    for q in (r, e):
        q.add_argument("-o", "--out", type=Path, required=True)
    args = p.parse_args()
    if args.what == "record":
        rows = record(args.model, args.requests, args.max_num_seqs, args.workload)
    else:
        rows = export(args.database_url, args.worker)
    write_rows(args.out, rows)
    m = fit(read_rows(args.out))
    print(json.dumps({"rows": m.rows, "step_s": m.step_s, "prefill_s": m.prefill_s,
                      "decode_s": m.decode_s, "out": str(args.out)}))


if __name__ == "__main__":
    main()
