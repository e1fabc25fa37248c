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
import sys
import time

import httpx

from benchmarks.service_stack import service_stack


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
    n, after = 0, None
    while True:
        params: dict[str, str | int] = {"status": status, "limit": 1000}
        if after:
            params["after"] = after
        page = client.get("/v1/jobs", params=params).json()
        n += len(page["data"])
        if not page["has_more"]:
            return n
        after = page["last_id"]


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
    p.add_argument("--no-worker", action="store_true", help="poll without a worker running")
    p.add_argument(
        "--target",
        choices=("job", "healthz"),
        default="job",
        help="poll job status (default) or /healthz (the HTTP stack alone)",
    )
    args = p.parse_args(argv)

    worker_args = ("--max-num-seqs", "32", "--num-kv-blocks", "1024", "--num-threads", "1")
    with service_stack(model=args.model, workers=0 if args.no_worker else 1,
                       api_workers=args.api_workers, redis_url=args.redis_url,
                       database_url=args.database_url, worker_args=worker_args,
                       tenant="load") as stack:
        base, key = stack.base_url, stack.api_key
        with stack.client(timeout=30) as client:
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


if __name__ == "__main__":
    sys.exit(main())
