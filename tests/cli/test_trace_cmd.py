"""``inflight trace``: a job's timeline and per-phase batch statistics from the jobs and
iterations tables (SQLite built by the migrations, rows with known values)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from cli.main import main
from worker.store.crud.job_trace import job_trace
from worker.store.db import make_engine, make_session_factory
from worker.store.models import Iteration, Job

T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
KV_TOTAL = 100
# step: (running, waiting, kv blocks used, preemptions); step s starts at T0 + s * 100 ms
STEPS = {
    1: (1, 0, 10, 0), 2: (2, 0, 20, 0), 3: (2, 1, 30, 0), 4: (3, 1, 40, 1),
    5: (4, 0, 50, 0), 6: (4, 0, 60, 0), 7: (5, 0, 70, 0), 8: (5, 0, 80, 2),
    9: (4, 0, 70, 0), 10: (3, 0, 60, 0), 11: (2, 0, 50, 0), 12: (1, 0, 40, 0),
}  # fmt: skip


def at(seconds: float) -> datetime:
    return T0 + timedelta(milliseconds=round(seconds * 1000))


def iteration(worker: str, step: int) -> Iteration:
    running, waiting, kv, preempt = STEPS[step]
    return Iteration(
        worker_id=worker, step=step, time=at(step / 10), num_running=running,
        num_waiting=waiting, num_prefill_tokens=16 if step in (5, 6) else 0,
        num_decode_tokens=running, kv_blocks_used=kv, kv_blocks_total=KV_TOTAL,
        num_preemptions=preempt, num_admitted=0, num_finished=0, schedule_ms=0.5,
        forward_ms=float(step), sample_ms=0.5,
    )  # fmt: skip


def job(job_id: str, **kw) -> Job:
    defaults = dict(request={"url": "/v1/completions", "body": {"prompt": "x"}},
                    queued_at=T0, status="succeeded", attempts=1)  # fmt: skip
    defaults.update(kw)
    return Job(id=job_id, **defaults)


@pytest.fixture
def db_url(tmp_path) -> str:
    """A migrated SQLite file holding two workers' steps and the jobs below.

    The traced job ``job_t`` on w1 is queued at 0.25 s, waits through steps 3-4, prefills
    in steps 5-6 (first token at 0.65 s, during step 6), decodes in steps 7-10 and ends at
    1.05 s with 5 tokens. Others on w1: A (steps 1-6), B (2-12), C (8-9), D (11-12); E runs
    on w2; Q is still queued; R is running on w1 since 0.95 s."""
    from migrations.run import upgrade

    url = f"sqlite:///{tmp_path / 'trace.db'}"
    upgrade(url=url)
    engine = make_engine(url=url)
    with make_session_factory(engine=engine).begin() as s:
        s.add_all([iteration("w1", i) for i in STEPS])
        s.add_all([iteration("w2", i) for i in STEPS])
        s.add_all([
            job("job_t", worker_id="w1", queued_at=at(0.25), started_at=at(0.5),
                first_token_at=at(0.65), finished_at=at(1.05), first_step=5, last_step=10,
                prompt_tokens=30, completion_tokens=5, finish_reason="length"),
            job("job_a", worker_id="w1", first_step=1, last_step=6, completion_tokens=6),
            job("job_b", worker_id="w1", first_step=2, last_step=12, completion_tokens=11),
            job("job_c", worker_id="w1", first_step=8, last_step=9, completion_tokens=2),
            job("job_d", worker_id="w1", first_step=11, last_step=12, completion_tokens=2),
            job("job_e", worker_id="w2", first_step=1, last_step=12, completion_tokens=12),
            job("job_q", status="queued", attempts=0),
            job("job_r", status="running", worker_id="w1", started_at=at(0.95)),
        ])  # fmt: skip
    engine.dispose()
    return url


def trace_of(url: str, job_id: str):
    engine = make_engine(url=url)
    try:
        with make_session_factory(engine=engine)() as s:
            return job_trace(session=s, job_id=job_id, longest=5)
    finally:
        engine.dispose()


def test_phase_stats_of_a_finished_job(db_url: str) -> None:
    t = trace_of(db_url, "job_t")
    assert t is not None
    assert [p.name for p in t.phases] == ["queue", "prefill", "decode"]
    assert t.queue_wait_s == pytest.approx(0.25)
    assert t.ttft_s == pytest.approx(0.40)
    assert t.prefill_s == pytest.approx(0.15)
    assert t.tpot_s == pytest.approx(0.10)  # (1.05 - 0.65) / (5 - 1)
    assert t.e2e_s == pytest.approx(0.80)

    queue, prefill, decode = t.phases
    assert (queue.first_step, queue.last_step, queue.steps) == (3, 4, 2)
    assert (queue.mean_running, queue.max_running) == (2.5, 3)
    assert (queue.mean_waiting, queue.max_waiting) == (1.0, 1)
    assert (queue.mean_kv_used, queue.max_kv_used, queue.kv_total) == (35.0, 40, KV_TOTAL)
    assert queue.mean_kv_use == pytest.approx(0.35)
    assert queue.preemptions == 1
    assert (queue.overlapping, [j.id for j in queue.longest]) == (2, ["job_b", "job_a"])

    assert (prefill.first_step, prefill.last_step, prefill.steps) == (5, 6, 2)
    assert (prefill.mean_running, prefill.max_running) == (4.0, 4)
    assert prefill.prefill_tokens == 32
    assert prefill.mean_step_ms == pytest.approx(6.5)  # (0.5 + 5 + 0.5 + 0.5 + 6 + 0.5) / 2
    assert prefill.start == at(0.5) and prefill.end == at(0.6)
    assert (prefill.overlapping, [j.id for j in prefill.longest]) == (2, ["job_b", "job_a"])

    assert (decode.first_step, decode.last_step, decode.steps) == (7, 10, 4)
    assert (decode.mean_running, decode.max_running) == (4.25, 5)  # 5, 5, 4, 3
    assert (decode.mean_kv_used, decode.max_kv_used) == (70.0, 80)
    assert decode.max_kv_use == pytest.approx(0.80)
    assert decode.preemptions == 2
    assert (decode.prefill_tokens, decode.decode_tokens) == (0, 17)
    assert decode.mean_step_ms == pytest.approx(9.5)
    assert decode.max_step_ms == pytest.approx(11.0)
    assert (decode.overlapping, [j.id for j in decode.longest]) == (2, ["job_b", "job_c"])
    assert decode.longest[0].steps == 11
    assert t.notes == []


def test_queued_running_and_unknown_jobs(db_url: str) -> None:
    queued = trace_of(db_url, "job_q")
    assert queued is not None and not queued.started and queued.phases == []
    running = trace_of(db_url, "job_r")
    assert running is not None
    assert [p.name for p in running.phases] == ["queue", "running"]
    run_phase = running.phase("running")
    assert run_phase is not None
    assert (run_phase.first_step, run_phase.last_step) == (10, 12)
    # jobs overlapping steps 10..12 on w1: t (5-10), b (2-12), d (11-12)
    assert run_phase.overlapping == 3
    assert {j.id for j in run_phase.longest} == {"job_t", "job_b", "job_d"}
    assert any("still running" in n for n in running.notes)
    assert trace_of(db_url, "job_nope") is None


def test_cli_text_json_and_errors(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "job_t", "--database-url", db_url]) == 0
    out = capsys.readouterr().out
    assert "job job_t" in out and "worker       w1" in out
    assert "time to first token 400.0 ms" in out
    assert "time per output token 100.0 ms" in out
    assert "decode: 2 other jobs; longest: job_b (11 steps, 11 out tokens), job_c" in out

    assert main(["trace", "job_t", "--json", "--database-url", db_url]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["worker_id"] == "w1" and data["first_step"] == 5
    decode = data["phases"][2]
    assert decode["name"] == "decode" and decode["mean_running"] == 4.25
    assert [j["id"] for j in decode["longest"]] == ["job_b", "job_c"]

    assert main(["trace", "job_q", "--database-url", db_url]) == 0
    assert "not started yet (status queued, queued " in capsys.readouterr().out

    assert main(["trace", "job_nope", "--database-url", db_url]) == 1
    assert "no job 'job_nope'" in capsys.readouterr().err


def test_plot_writes_a_png(db_url: str, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "trace.png"
    assert main(["trace", "job_t", "--plot", str(png), "--database-url", db_url]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 5000
    # a job that has not started has nothing to draw
    assert main(["trace", "job_q", "--plot", str(tmp_path / "q.png"),
                 "--database-url", db_url]) == 1  # fmt: skip
    assert "has not started" in capsys.readouterr().err
    assert not (tmp_path / "q.png").exists()


def test_rows_older_than_the_job_are_flagged(tmp_path) -> None:
    from migrations.run import upgrade

    url = f"sqlite:///{tmp_path / 'restart.db'}"
    upgrade(url=url)
    engine = make_engine(url=url)
    with make_session_factory(engine=engine).begin() as s:
        s.add_all([iteration("w1", i) for i in STEPS])  # steps of an earlier process
        s.add(job("job_late", worker_id="w1", queued_at=at(3600), started_at=at(3601),
                  first_token_at=at(3601.5), finished_at=at(3602), first_step=2,
                  last_step=4, completion_tokens=3))  # fmt: skip
    engine.dispose()
    t = trace_of(url, "job_late")
    assert t is not None
    assert any("reused step numbers" in n for n in t.notes)
