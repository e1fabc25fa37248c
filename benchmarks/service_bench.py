"""Service benchmark: end-to-end throughput through Redis and PostgreSQL against the
in-process engine on the same workload in the same run, and intake rate with a no-op model.

    .venv/bin/python benchmarks/service_bench.py --model tiny-llama

Needs Redis (127.0.0.1:6379) and PostgreSQL (127.0.0.1:5432, trust auth); it creates and
drops its own database and uses its own Redis key prefix.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.thread_cpu import ThreadCpu
from cli.worker_cmd import GIL_SWITCH_MS
from migrations.run import upgrade
from worker.engine.outputs import RequestMetrics, RequestOutput, StepStats
from worker.jobs.enqueue import enqueue
from worker.queue.connection import make_redis
from worker.queue.group import ensure_groups
from worker.queue.keys import QueueKeys
from worker.queue.wipe import delete_deployment
from worker.service.config import WorkerConfig
from worker.service.worker import WorkerProcess
from worker.store.crud.jobs import count_by_status
from worker.store.db import make_engine, make_session_factory
from worker.store.schemas import NewJob

PG = "postgresql://postgres@127.0.0.1:5432/"
POLL_S = 0.01  # completion poll (adds at most this much to a service run)


# -- a no-op engine, only for measuring intake ----------------------------------------------
class NoOpEngine:
    """Same API as LLMEngine; every request finishes in the step after it is added."""

    tokenizer = None  # outputs carry text; no logprobs are asked

    def __init__(self, max_num_seqs: int = 1024) -> None:
        self.max_num_seqs = max_num_seqs
        self.pending: dict[str, list[int]] = {}
        self.step_index = 0

    def tokenize(self, prompt: str | None = None, messages: list[dict] | None = None) -> list[int]:
        return [1, 2, 3]

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: Any = None, **kw: Any) -> None:
        self.pending[request_id] = prompt_token_ids

    def abort_request(self, request_id: str) -> None:
        self.pending.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.pending)

    def admission_capacity(self) -> int:
        return max(0, self.max_num_seqs - len(self.pending))

    def interjected_step(self) -> None:
        return None  # its steps are instant: nothing waits on one

    def step(self, between_layers: Callable[[], None] | None = None) -> tuple[list[RequestOutput], StepStats]:
        now, k = time.time(), self.step_index
        outs = [
            RequestOutput(request_id=rid, prompt=None, prompt_token_ids=ids, text="ok",
                          token_ids=[7], finish_reason="length", finished=True, new_token_ids=[7],
                          metrics=RequestMetrics(now, now, now, now, k, k))
            for rid, ids in self.pending.items()
        ]
        self.pending = {}
        stats = StepStats(step=k, num_running=0, num_waiting=0, num_prefill_tokens=0,
                          num_decode_tokens=0, kv_blocks_used=0, kv_blocks_total=0,
                          num_preemptions=0, num_admitted=len(outs), num_finished=len(outs),
                          schedule_seconds=0.0, forward_seconds=0.0, sample_seconds=0.0,
                          start_time=now)
        self.step_index += 1
        return outs, stats


# -- helpers ------------------------------------------------------------------------------------
def run_tenant() -> str:
    """A tenant of one run's own: it salts the prefix cache's hashes (see bench_throughput)."""
    return f"run-{uuid.uuid4().hex[:8]}"


class RowCount:
    """Counts the rows (prompt and decode tokens) ``engine.step`` computes from ``start()``
    on, by wrapping the engine's ``step`` (the in-process runs and the worker call the same)."""

    def __init__(self, engine: Any) -> None:
        self.total = 0
        self._step = engine.step
        engine.step = self._counted

    def start(self) -> None:
        self.total = 0

    def _counted(self, between_layers: Callable[[], None] | None = None) -> tuple[list[RequestOutput], StepStats]:
        outs, stats = self._step(between_layers)
        self.total += stats.num_prefill_tokens + stats.num_decode_tokens
        return outs, stats


class Env:
    """A throwaway PostgreSQL database and Redis prefix."""

    def __init__(self, redis_url: str) -> None:
        import psycopg

        self.name = f"inflight_bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(PG + "postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{self.name}"')
        self.url = PG + self.name
        upgrade(url=self.url)
        self.db = make_engine(url=self.url)
        self.sf = make_session_factory(engine=self.db)
        self.redis_url = redis_url
        self.redis = make_redis(url=redis_url)
        self.keys = QueueKeys(prefix=f"bench-{uuid.uuid4().hex[:8]}", model="bench-model")
        ensure_groups(redis_client=self.redis, keys=self.keys)

    def close(self) -> None:
        import psycopg

        delete_deployment(redis_client=self.redis, keys=self.keys)
        self.db.dispose()
        with psycopg.connect(PG + "postgres", autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def done(self) -> int:
        with self.sf() as s:
            c = count_by_status(session=s)
        return c.get("succeeded", 0) + c.get("failed", 0)


def run_worker(env: Env, engine: Any, n: int, **cfg: Any) -> tuple[float, dict]:
    """Run a worker in this process on ``engine`` until ``n`` jobs ended; seconds, stats.

    The worker runs on the main thread, as ``inflight worker`` does: torch's CPU kernels
    run markedly slower when called from a secondary thread (about 1.7x for a matmul on
    this machine), which would charge the service for a cost it does not have; and with
    its GIL switch interval (``GIL_SWITCH_MS``), restored afterwards.
    """
    config = WorkerConfig(database_url=env.url, redis_url=env.redis_url, prefix=env.keys.prefix,
                          served_model_name=env.keys.model, name=f"bench-{uuid.uuid4().hex[:6]}", reconcile_interval=3600, **cfg)
    worker = WorkerProcess(config, engine_factory=lambda c: engine, install_signals=False)
    finished_at: list[float] = []
    first_done: list[float] = []
    start_count = env.done()

    def watch() -> None:
        # The worker's own count of committed results, read in-process: polling the jobs
        # table instead (a GROUP BY at 10-50 Hz) loaded the database server on the cores the
        # measured worker needs. The count moves only after the results' transaction commits.
        left = n - start_count
        while (done := worker.results_written) < left:
            if not first_done and done > 0:
                first_done.append(time.perf_counter())
            time.sleep(POLL_S)
        finished_at.append(time.perf_counter())
        worker.stop()

    watcher = threading.Thread(target=watch, name="bench-watcher", daemon=True)
    t0 = time.perf_counter()
    watcher.start()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(GIL_SWITCH_MS / 1000)
    try:
        with ThreadCpu() as cpu:
            worker.run()
    finally:
        sys.setswitchinterval(interval)
    watcher.join(60)
    stats = dict(worker.stats)
    stats["thread_cpu_seconds"] = cpu.seconds
    if first_done:  # the steady rate, after start-up (engine, Redis group, registration)
        stats["seconds_after_first_result"] = finished_at[0] - first_done[0]
        stats["startup_seconds"] = first_done[0] - t0
    return finished_at[0] - t0, stats


def bench_throughput(args: argparse.Namespace, env: Env) -> dict:
    from cli.bench.workload import fit_to_vocab, read_workload
    from worker.engine import EngineArgs, LLMEngine, SamplingParams

    engine = LLMEngine(EngineArgs(model=args.model, max_num_seqs=args.max_num_seqs, num_threads=args.threads))
    reqs = fit_to_vocab(read_workload(args.workload), engine.runner.model.config.vocab_size)
    rows = RowCount(engine)  # rows each run computed, either path: both should compute the same

    # Every run, in-process or through the queue, is batch-class work of a tenant of its
    # own: the tenant salts the prefix cache's hashes, so no run reuses the blocks an
    # earlier run left cached (the engine is shared, and such hits cut an in-process run's
    # prompt rows by up to 15% in some runs and not in others), while the hits within a run
    # (a shared system prompt) are the same on both paths; and both paths take the same
    # admission rules (the worker passes the stream's class, in-process calls default to
    # interactive).
    def baseline() -> tuple[float, int]:
        rows.start()
        t0 = time.perf_counter()
        tenant = run_tenant()
        for r in reqs:
            engine.add_request(f"base-{uuid.uuid4().hex}", r.prompt_token_ids,
                               SamplingParams(max_tokens=r.max_tokens, temperature=0, ignore_eos=True),
                               tenant=tenant, service_class="batch")
        tokens = 0
        while engine.has_unfinished_requests():
            outs, _ = engine.step()
            tokens += sum(len(o.token_ids) for o in outs if o.finished)
        return time.perf_counter() - t0, tokens

    baseline()  # warm-up
    results: dict[str, list[float]] = {"engine": [], "service": []}
    details: list[dict[str, Any]] = []
    # Each service run is bracketed by engine runs and compared with their mean: the
    # engine's own speed drifts over minutes on this machine (it fell from 272 to 236 tok/s
    # over three back-to-back rounds), so an engine run only before each service run would
    # charge the drift to the service.
    before_secs, tokens = baseline()
    engine_rows = [rows.total]
    service_rows: list[int] = []
    for _ in range(args.rounds):
        tenant = run_tenant()
        jobs = [NewJob(request={"url": "/v1/completions", "body": {
            "prompt": r.prompt_token_ids, "max_tokens": r.max_tokens, "temperature": 0, "ignore_eos": True}},
            tenant=tenant)
            for r in reqs]
        before = env.done()
        enqueue(session_factory=env.sf, redis_client=env.redis, keys=env.keys, jobs=jobs)
        rows.start()
        secs, stats = run_worker(env, engine, before + len(jobs), prefetch=args.prefetch)
        service_rows.append(rows.total)
        details.append({k: stats.get(k) for k in ("steps", "transactions", "startup_seconds",
                                                   "seconds_after_first_result")}
                       | {"seconds": round(secs, 2), "engine_seconds_before": round(before_secs, 2),
                          "thread_cpu_seconds": stats["thread_cpu_seconds"],
                          "thread_cpu_ms_per_step": {
                              name: round(s * 1e3 / max(1, stats.get("steps") or 1), 2)
                              for name, s in stats["thread_cpu_seconds"].items()}})
        with env.db.connect() as c:
            from sqlalchemy import text
            svc_tokens = c.execute(text("SELECT sum(completion_tokens) FROM jobs WHERE id = ANY(:ids)"),
                                   {"ids": [j.id for j in jobs]}).scalar()
        assert svc_tokens == tokens, (svc_tokens, tokens)
        results["service"].append(svc_tokens / secs)
        after_secs, _ = baseline()
        engine_rows.append(rows.total)
        results["engine"].append(tokens / ((before_secs + after_secs) / 2))
        before_secs = after_secs
    # each service run over the mean of the engine runs just before and after it
    pairs = [round(a / b, 3) for a, b in zip(results["service"], results["engine"], strict=True)]
    eng = sorted(results["engine"])[len(results["engine"]) // 2]
    svc = sorted(results["service"])[len(results["service"]) // 2]
    return {"model": args.model, "requests": len(reqs), "tokens": tokens,
            "engine_tok_s": round(eng, 1), "service_tok_s": round(svc, 1), "ratio": round(svc / eng, 3),
            "round_ratios": pairs,
            "paired_ratio_median": sorted(pairs)[len(pairs) // 2],
            "rounds": {k: [round(x, 1) for x in v] for k, v in results.items()},
            "rows_computed": {"engine": engine_rows, "service": service_rows},
            "service_runs": details}


def bench_intake(args: argparse.Namespace, env: Env) -> dict:
    n = args.intake_jobs
    jobs = [NewJob(request={"url": "/v1/completions", "body": {"prompt": f"p{i}", "max_tokens": 1}})
            for i in range(n)]
    t0 = time.perf_counter()
    for i in range(0, n, 1000):
        enqueue(session_factory=env.sf, redis_client=env.redis, keys=env.keys, jobs=jobs[i:i + 1000])
    enq = time.perf_counter() - t0
    before = env.done()
    secs, stats = run_worker(env, NoOpEngine(args.noop_batch), before + n, prefetch=args.noop_batch,
                             write_traces=True)
    steady = stats.get("seconds_after_first_result")
    return {"jobs": n, "enqueue_jobs_s": round(n / enq), "consume_jobs_s": round(n / secs),
            "consume_jobs_s_after_first_result": round(n / steady) if steady else None,
            "worker_startup_s": round(stats.get("startup_seconds", 0.0), 2),
            "transactions": stats.get("transactions"), "steps": stats.get("steps")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--workload", default=str(Path(__file__).resolve().parent / "heavy_tailed.jsonl"))
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--prefetch", type=int, default=4)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--intake-jobs", type=int, default=20_000)
    p.add_argument("--noop-batch", type=int, default=1024)
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--skip-intake", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    out: dict[str, Any] = {}
    if not args.skip_intake:
        env = Env(args.redis_url)
        try:
            out["intake"] = bench_intake(args, env)
            print(json.dumps({"intake": out["intake"]}), flush=True)
        finally:
            env.close()
    if not args.skip_throughput:
        env = Env(args.redis_url)
        try:
            out["throughput"] = bench_throughput(args, env)
            print(json.dumps({"throughput": out["throughput"]}), flush=True)
        finally:
            env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
