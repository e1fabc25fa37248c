"""benchmarks/deadline_sim.py and benchmarks/step_costs.py: the simulation orders lanes with
the workers' own functions, its books balance, and the step-cost fit recovers a model."""

from __future__ import annotations

import random
from pathlib import Path

from benchmarks import deadline_sim
from benchmarks.step_costs import StepCostModel, fit, read_rows, write_rows
from worker.queue import slack


def test_the_simulation_uses_the_workers_order_and_its_books_balance() -> None:
    assert deadline_sim.read_order is slack.read_order  # imported, not written again
    assert deadline_sim.lane_end is slack.lane_end
    root = Path(deadline_sim.__file__).parent
    results = deadline_sim.run(seeds=1, load=1.5, max_num_seqs=48, tick=60.0,
                               workers=range(1, 3), costs_path=root / "step_costs_smollm2.csv",
                               workload=root / "chat_workload.jsonl", log=lambda _: None)
    runs = {(r["workers"], r["policy"]): r for r in results["runs"]}
    assert len(runs) == 2 * len(deadline_sim.POLICIES)
    for r in runs.values():
        assert r["batches"] == results["batches"]
        assert sum(v["batches"] for v in r["by_window"].values()) == r["batches"]
        assert sum(v["missed"] for v in r["by_window"].values()) == r["missed"]
        assert (r["expired_lines"] > 0) == (r["missed"] > 0) and r["expired_lines"] <= r["lines"]
    # one worker cannot do 1.5 worker-days in a day; least slack loses fewer batches
    assert 0 < runs[(1, "least-slack")]["missed"] < runs[(1, "arrival")]["missed"]
    assert "| 1 | least-slack |" in deadline_sim.table(results)


def test_the_step_cost_fit_recovers_a_model(tmp_path: Path) -> None:
    truth = StepCostModel(step_s=0.05, prefill_s=0.0004, decode_s=0.002, rows=0)
    rng = random.Random(0)
    rows = []
    for step in range(400):
        prefill = rng.choice([0, 0, 0, rng.randint(16, 512)])
        decode = rng.randint(1, 64)
        noisy = truth.step_seconds(prefill, decode) * (1 + (0.8 if step % 17 == 0 else 0.0))
        rows.append({"worker_id": "w", "step": step, "num_running": decode, "num_waiting": 0,
                     "num_prefill_tokens": prefill, "num_decode_tokens": decode,
                     "schedule_ms": 0.0, "forward_ms": noisy * 1000, "sample_ms": 0.0})
    write_rows(tmp_path / "costs.csv", rows)
    got = fit(read_rows(tmp_path / "costs.csv"))
    assert got.rows == 400
    assert abs(got.step_s - truth.step_s) < 0.005 and abs(got.decode_s - truth.decode_s) < 2e-4
    assert abs(got.prefill_s - truth.prefill_s) < 1e-4
