"""Time to drain N jobs when the worker is killed with -9 part-way, against the same N jobs
with no kill, in one run (the figures of docs/reliability.md, issue 18).

    .venv/bin/python benchmarks/kill_drain.py --jobs 60 500

Each run starts ``inflight worker`` as a real process on a fresh database and Redis prefix,
enqueues N chat prompts (``benchmarks/workloads/chat_turns.txt``, fixed output length), and
times from the worker's start to the last result. A kill run kills the worker with -9 once
it has run a third of the steps the same N took without a kill (so mid-generation, whatever
N) and starts it again under the same name (a supervisor's restart: the new process replays
what the dead one held); ``--kills`` does that several times, each after a further share. Reported: wall time, the last worker's mean
batch size (``iterations.num_running``), and how many jobs ran more than once.

Needs Redis (127.0.0.1:6379) and PostgreSQL (127.0.0.1:5432, trust auth).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.make_chat_workload import read_turns  # noqa: E402
from cli.bench.machine import cpu_description  # noqa: E402
from migrations.run import upgrade  # noqa: E402
from worker.jobs.enqueue import enqueue  # noqa: E402
from worker.queue.connection import make_redis  # noqa: E402
from worker.queue.group import ensure_groups  # noqa: E402
from worker.queue.keys import QueueKeys  # noqa: E402
from worker.queue.wipe import delete_deployment  # noqa: E402
from worker.service.model_info import model_id_for  # noqa: E402
from worker.store.crud.jobs import count_by_status  # noqa: E402
from worker.store.db import make_engine, make_session_factory  # noqa: E402
from worker.store.models import Iteration, Job  # noqa: E402
from worker.store.schemas import NewJob  # noqa: E402

PG = "postgresql://postgres@127.0.0.1:5432/"
REDIS = "redis://127.0.0.1:6379/0"


def _jobs(n: int, max_tokens: int) -> list[NewJob]:
    prompts = read_turns()
    return [
        NewJob(request={"url": "/v1/chat/completions", "body": {
            "messages": [{"role": "user", "content": prompts[i % len(prompts)]}],
            "max_tokens": max_tokens, "ignore_eos": True}})
        for i in range(n)
    ]  # fmt: skip


def run_once(n: int, kills: int, steps: int, args: argparse.Namespace) -> dict[str, float]:
    """Drain ``n`` jobs with ``kills`` kill -9 restarts on the way, spread over ``steps``
    engine steps (those of the run without a kill); returns the figures."""
    import psycopg

    db = f"inflight_killbench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG + "postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    url = PG + db
    keys = QueueKeys(prefix=f"killbench-{uuid.uuid4().hex[:8]}", model=model_id_for(args.model))
    redis_client = make_redis(url=REDIS)
    engine = make_engine(url=url)
    try:
        upgrade(url=url)
        sessions = make_session_factory(engine=engine)
        ensure_groups(redis_client=redis_client, keys=keys)
        enqueue(session_factory=sessions, redis_client=redis_client, keys=keys,
                jobs=_jobs(n, args.max_tokens))

        def steps_traced() -> int:
            with sessions() as s:
                return s.query(Iteration).count()

        def done() -> int:
            with sessions() as s:
                counts = count_by_status(session=s)
            return sum(counts.get(k, 0) for k in ("succeeded", "failed", "cancelled"))

        def start() -> subprocess.Popen:
            cmd = [sys.executable, "-m", "cli.main", "worker", "--database-url", url,
                   "--redis-url", REDIS, "--prefix", keys.prefix, "--name", "drain",
                   "--model", args.model, "--max-num-seqs", str(args.max_num_seqs),
                   "--lock-ttl", "1.5", "--log-level", "WARNING"]
            return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, env=os.environ.copy())

        t0 = time.monotonic()
        worker = start()
        for k in range(kills):
            target = steps * (k + 1) // (kills + 2)
            while steps_traced() < target:
                time.sleep(0.05)
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            worker = start()
        while done() < n:
            time.sleep(0.05)
        wall = time.monotonic() - t0
        worker.send_signal(signal.SIGTERM)
        worker.wait(120)
        with sessions() as s:
            rows = s.query(Iteration.worker_id, Iteration.num_running, Iteration.time).all()
            reran = s.query(Job).filter(Job.attempts > 1).count()
        last_worker = max(rows, key=lambda r: r[2])[0]
        last = [r[1] for r in rows if r[0] == last_worker]
        return {"wall_s": wall, "last_mean_running": statistics.fmean(last),
                "last_steps": len(last), "reran": reran}
    finally:
        delete_deployment(redis_client=redis_client, keys=keys)
        engine.dispose()
        with psycopg.connect(PG + "postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def main() -> None:
    """Run every N with no kill and with ``--kills`` kills; print one table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, nargs="+", default=[60, 500])
    p.add_argument("--kills", type=int, default=1)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args()
    cpu = cpu_description()
    print(f"CPU {cpu['model']} ({', '.join(cpu['vector_extensions'])}), {os.cpu_count()} cores")
    print(f"model {args.model}, max_num_seqs {args.max_num_seqs}, {args.max_tokens} tokens each")
    print("| N | kills | wall s | last worker mean batch | last worker steps | jobs run twice |")
    print("|---|---|---|---|---|---|")
    from kernels import cpu_fused, cpu_native

    cpu_native.load_extension()  # built once here, so no run pays the first compile
    cpu_fused.native_ops()
    for n in args.jobs:
        steps = 0
        for kills in (0, args.kills):
            r = run_once(n, kills, steps, args)
            steps = steps or int(r["last_steps"])
            print(f"| {n} | {kills} | {r['wall_s']:.1f} | {r['last_mean_running']:.1f} | "
                  f"{r['last_steps']:.0f} | {r['reran']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
