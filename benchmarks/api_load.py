"""Load check of the REST API: p50/p99 latency of job status queries
(``GET /v1/jobs/{id}``) with many concurrent pollers while a worker generates.

    .venv/bin/python benchmarks/api_load.py [--pollers 200] [--duration 20] [--jobs 300]

By default it creates a throwaway PostgreSQL database on 127.0.0.1:5432 (dropped at the
end) and uses a unique Redis key prefix; ``--database-url`` / ``--redis-url`` point it
elsewhere. It starts ``inflight api`` and ``inflight worker`` (tiny model) as subprocesses,
submits jobs, then polls random job ids from ``--pollers`` asyncio tasks for
``--duration`` seconds and prints the latency percentiles and throughput. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _poller(
    host: str, port: int, key: str, paths: list[str], stop_at: float, latencies: list[float]
) -> int:
    """One keep-alive HTTP/1.1 connection issuing GETs back to back (a minimal client, so
    the load generator's own overhead stays small); returns the number of errors."""
    reader, writer = await asyncio.open_connection(host, port)
    errors = 0
    try:
        while time.monotonic() < stop_at:
            path = random.choice(paths)
            t0 = time.perf_counter()
            writer.write(
                f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}"
                "\r\n\r\n".encode()
            )
            await writer.drain()
            status_line = await reader.readline()
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - t0)
            if b" 200 " not in status_line:
                errors += 1
    finally:
        writer.close()
    return errors


async def _poll(
    base: str, key: str, ids: list[str], pollers: int, duration: float, target: str = "job"
) -> tuple[list[float], int]:
    host, port = base.removeprefix("http://").split(":")
    paths = ["/healthz"] if target == "healthz" else [f"/v1/jobs/{i}" for i in ids]
    latencies: list[float] = []
    stop_at = time.monotonic() + duration
    errors = await asyncio.gather(
        *(_poller(host, int(port), key, paths, stop_at, latencies) for _ in range(pollers))
    )
    return latencies, sum(errors)


def _count(client: httpx.Client, status: str) -> int:
    n, offset = 0, 0
    while True:
        page = client.get(
            "/v1/jobs", params={"status": status, "limit": 1000, "offset": offset}
        ).json()
        n += len(page["data"])
        if not page["has_more"]:
            return n
        offset = page["next_offset"]


def main(argv: list[str] | None = None) -> int:
    """Run the load check; prints a report."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pollers", type=int, default=200)
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--jobs", type=int, default=300)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--api-workers", type=int, default=1, help="uvicorn processes")
    p.add_argument("--database-url", default=None)
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--no-worker", action="store_true", help="poll without a worker running")
    p.add_argument(
        "--target",
        choices=("job", "healthz"),
        default="job",
        help="poll job status (default) or /healthz (the HTTP stack alone)",
    )
    args = p.parse_args(argv)

    from api.serve_thread import free_port
    from migrations.run import upgrade
    from worker.store.crud.api_keys import create_api_key
    from worker.store.db import make_engine, make_session_factory

    made_db = None
    db_url = args.database_url
    if db_url is None:
        import psycopg

        made_db = f"inflight_load_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{made_db}"')
        db_url = f"postgresql://postgres@127.0.0.1:5432/{made_db}"
    prefix = f"inflight-load-{uuid.uuid4().hex[:8]}"
    port = args.port or free_port()
    storage = f"/tmp/{prefix}-files"
    procs: list[subprocess.Popen] = []
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "INFLIGHT_BEAT_INTERVAL": "5",
    }
    try:
        upgrade(url=db_url)
        engine = make_engine(url=db_url)
        with make_session_factory(engine=engine).begin() as s:
            _, key = create_api_key(session=s, tenant="load")
        engine.dispose()
        common = ["--database-url", db_url, "--redis-url", args.redis_url, "--prefix", prefix]
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "worker.cli.main",
                    "api",
                    "--port",
                    str(port),
                    *common,
                    "--storage-dir",
                    storage,
                    "--workers",
                    str(args.api_workers),
                    "--log-level",
                    "warning",
                ],
                cwd=ROOT,
                env=env,
            )
        )
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "worker.cli.main",
                    "worker" if not args.no_worker else "--help",
                    "--model",
                    args.model,
                    *common,
                    "--name",
                    "load-worker",
                    "--max-num-seqs",
                    "32",
                    "--num-kv-blocks",
                    "1024",
                    "--num-threads",
                    "1",
                    "--log-level",
                    "WARNING",
                ],
                cwd=ROOT,
                env=env,
            )
        )
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if client.get("/readyz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("the API did not become ready")
                time.sleep(0.2)
            ids = [
                client.post(
                    "/v1/jobs",
                    json={
                        "prompt": f"load {i}: once upon a time",
                        "max_tokens": args.max_tokens,
                        "ignore_eos": True,
                        "temperature": 0,
                    },
                ).json()["id"]
                for i in range(args.jobs)
            ]
            done_before = _count(client, "succeeded")
            print(
                f"submitted {len(ids)} jobs; polling with {args.pollers} concurrent pollers "
                f"for {args.duration:.0f}s while the worker runs ...",
                flush=True,
            )
            latencies, errors = asyncio.run(
                _poll(base, key, ids, args.pollers, args.duration, args.target)
            )
            done_after = _count(client, "succeeded")
        n = len(latencies)
        print(
            f"status queries: {n} in {args.duration:.0f}s = {n / args.duration:.0f} req/s, "
            f"errors {errors}"
        )
        print(
            f"latency ms: p50 {_pct(latencies, 0.5) * 1e3:.1f}  "
            f"p90 {_pct(latencies, 0.9) * 1e3:.1f}  p99 {_pct(latencies, 0.99) * 1e3:.1f}  "
            f"max {max(latencies) * 1e3:.1f}  mean {statistics.fmean(latencies) * 1e3:.1f}"
        )
        print(
            f"jobs finished by the worker during the polling: {done_after - done_before} "
            f"(total succeeded {done_after}/{len(ids)})"
        )
        print(
            f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
            f"api processes {args.api_workers}"
        )
        return 0
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        try:
            import redis

            r = redis.Redis.from_url(args.redis_url)
            for k in r.scan_iter(match=f"{prefix}:*", count=1000):
                r.delete(k)
        except Exception:
            pass
        if made_db:
            import psycopg

            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{made_db}" WITH (FORCE)')
        import shutil

        shutil.rmtree(storage, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
