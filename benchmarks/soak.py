"""Soak: mixed traffic for a while against the real services (``inflight api`` with its
embedded Celery control plane and beat, ``inflight worker`` on the tiny model, a Redis of
its own, a throwaway PostgreSQL database), sampling every interval what could grow:
Redis memory and keys, SQL rows and bytes per table, RSS and open file descriptors of
each process, files in storage. Retention runs with short settings, so what is bounded
shows its bound within the run. At the end the traffic stops, the backlog drains, and
:func:`bounds` lists every bound the run broke.

    python benchmarks/soak.py --duration 3600 --sample-every 60 --out out/soak

writes ``samples.jsonl``, ``report.json`` and ``soak.png`` there."""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from the checkout
    sys.path.insert(0, str(ROOT))

from benchmarks.service_stack import service_stack  # noqa: E402
from benchmarks.soak_sample import Sampler, plot, table  # noqa: E402
from benchmarks.soak_traffic import Receiver, Traffic  # noqa: E402

DAY = 86_400.0
WORKER_ARGS = ("--max-num-seqs", "16", "--num-kv-blocks", "512", "--num-threads", "1",
               "--trim-interval", "5", "--log-level", "INFO")
"""The tiny model's worker, small: the machine is shared with the API and the client."""


@dataclass
class SoakConfig:
    """A run's length, pace and the retention settings it runs the services with."""

    duration_s: float = 60.0
    sample_every_s: float = 10.0
    actions_per_s: float = 3.0
    seed: int = 0
    # retention, in seconds (the services take days: converted)
    result_retention_s: float = 10.0
    job_retention_s: float = 20.0
    batch_retention_s: float = 30.0
    iteration_retention_s: float = 20.0
    retention_interval_s: float = 5.0
    drain_s: float = 120.0  # longest wait for the backlog after the traffic stops
    startup_s: float = 600.0  # longest wait for a worker to serve the model
    workers: int = 1
    out: Path | None = None
    batch_lines: tuple[int, int] = (3, 16)

    def service_env(self) -> dict[str, str]:
        """The ``INFLIGHT_*`` settings of the run."""
        return {
            "INFLIGHT_JOB_RESULT_RETENTION_DAYS": repr(self.result_retention_s / DAY),
            "INFLIGHT_JOB_RETENTION_DAYS": repr(self.job_retention_s / DAY),
            "INFLIGHT_BATCH_RETENTION_DAYS": repr(self.batch_retention_s / DAY),
            "INFLIGHT_ITERATION_RETENTION_DAYS": repr(self.iteration_retention_s / DAY),
            "INFLIGHT_RETENTION_INTERVAL": repr(self.retention_interval_s),
            "INFLIGHT_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
            "INFLIGHT_WEBHOOK_MAX_ATTEMPTS": "3",
            "INFLIGHT_WEBHOOK_BACKOFF": "1",
            "INFLIGHT_WEBHOOK_TOTAL_TIMEOUT": "5",
            "INFLIGHT_EXPAND_CHUNK": "8",
        }


@dataclass
class SoakReport:
    """What a run saw: the samples, the traffic's counts, what broke."""

    config: dict[str, Any]
    samples: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)
    webhooks: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    final: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """A redis-server of the run's own (INFO memory is then the run's alone)."""
    port = _free_port()
    workdir = Path(tempfile.mkdtemp(prefix="inflight-soak-redis-"))
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--save", "",
                             "--appendonly", "no", "--dir", str(workdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def _second_key(database_url: str, tenant: str) -> str:
    from worker.store.crud.api_keys import create_api_key
    from worker.store.db import make_engine, make_session_factory

    engine = make_engine(url=database_url)
    try:
        with make_session_factory(engine=engine).begin() as s:
            return create_api_key(session=s, tenant=tenant)[1]
    finally:
        engine.dispose()


class _Ticker:
    """Samples on a thread of its own every ``every`` seconds."""

    def __init__(self, sampler: Sampler, every: float, out: Path | None) -> None:
        self.sampler, self.every, self.out = sampler, every, out
        self.samples: list[dict[str, Any]] = []
        self.phase = "traffic"
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def start(self) -> None:
        self.sampler.started = time.monotonic()
        self.take()
        self._thread.start()

    def take(self) -> dict[str, Any]:
        with self._lock:
            row = {**self.sampler.sample(), "phase": self.phase}
            self.samples.append(row)
            if self.out is not None:
                with open(self.out / "samples.jsonl", "a") as f:
                    f.write(json.dumps(row) + "\n")
            return row

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.take()
            except Exception as exc:  # a sample that failed is a gap, not the end of the run
                print(f"soak: sample failed: {exc}", file=sys.stderr)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def run_soak(config: SoakConfig) -> SoakReport:
    """Run the soak; the report lists its samples and every bound it broke."""
    report = SoakReport(config={k: (str(v) if isinstance(v, Path) else v)
                                for k, v in asdict(config).items()})
    if config.out is not None:
        config.out.mkdir(parents=True, exist_ok=True)
        (config.out / "samples.jsonl").unlink(missing_ok=True)
    receiver = Receiver()
    with private_redis() as redis_url, service_stack(
        model="tiny-llama", workers=config.workers, redis_url=redis_url, beat_interval=1.0,
        env=config.service_env(), tenant="soak-a", worker_args=WORKER_ARGS,
        log_dir=config.out / "logs" if config.out is not None else None,
    ) as stack:
        processes = {"api": stack.api.pid,
                     **{f"worker{i}": w.pid for i, w in enumerate(stack.workers)}}
        sampler = Sampler(redis_url=redis_url, database_url=stack.database_url,
                          prefix=stack.prefix, processes=processes, storage=stack.storage)
        traffic = Traffic(base_url=stack.base_url,
                          keys=[stack.api_key, _second_key(stack.database_url, "soak-b")],
                          receiver=receiver, dead_port=_free_port(), seed=config.seed,
                          batch_lines=config.batch_lines)
        ticker = _Ticker(sampler, config.sample_every_s, config.out)
        try:
            traffic.wait_for_model(config.startup_s)
            ticker.start()
            _drive(traffic, config)
            ticker.phase = "drain"
            _drain(traffic, sampler, config)
            # one more retention run after everything ended
            time.sleep(config.job_retention_s + 2 * config.retention_interval_s)
            ticker.phase = "final"
            report.final = ticker.take()
        finally:
            ticker.stop()
            traffic.close()
            receiver.close()
        report.samples = ticker.samples
        report.counts = dict(traffic.counts)
        report.statuses = {str(k): v for k, v in sorted(traffic.statuses.items())}
        report.webhooks = {"jobs_accepted": len(receiver.accepted),
                           "twice_accepted": sum(1 for n in receiver.accepted.values() if n > 1),
                           "refused_answers": sum(receiver.refused.values())}
        report.errors = traffic.errors
        report.final.update(_final_sql(stack.database_url, config))
        sampler.close()
    report.violations = bounds(report, config)
    if config.out is not None:
        (config.out / "report.json").write_text(json.dumps(asdict(report), indent=1))
        plot(report.samples, config.out / "soak.png",
             f"soak: {config.duration_s / 60:.0f} min, {report.counts.get('jobs', 0)} jobs, "
             f"{report.counts.get('batches', 0)} batches")
    return report


def _drive(traffic: Traffic, config: SoakConfig) -> None:
    """The traffic, paced at ``actions_per_s``, with the batches looked at every 2 s."""
    start = time.monotonic()
    next_check = start
    n = 0
    while (now := time.monotonic()) - start < config.duration_s:
        traffic.step()
        n += 1
        if now >= next_check:
            traffic.check_batches()
            next_check = now + 2.0
        lag = start + n / config.actions_per_s - time.monotonic()
        if lag > 0:
            time.sleep(lag)


def _drain(traffic: Traffic, sampler: Sampler, config: SoakConfig) -> None:
    """Wait until no batch is open, no job is open and no webhook is pending."""
    deadline = time.monotonic() + config.drain_s
    while time.monotonic() < deadline:
        open_batches = traffic.check_batches()
        sql = sampler._sql()
        if not open_batches and not sql["open_jobs"] and not sql["pending_webhooks"]:
            return
        time.sleep(1.0)
    traffic.errors.append("the backlog did not drain: "
                          f"{len(traffic.open_batches)} batches open, {sampler._sql()}")


def _final_sql(database_url: str, config: SoakConfig) -> dict[str, Any]:
    """Rows retention should have taken by now (older than its setting plus two runs of
    the retention task and a margin), and webhook deliveries by outcome."""
    import psycopg

    margin = 2 * config.retention_interval_s + 30
    with psycopg.connect(database_url, autocommit=True) as conn:
        def one(sql: str, *args: Any) -> int:
            return int(conn.execute(sql, args).fetchone()[0])  # type: ignore[index]

        # with autovacuum off the space of deleted rows is never reused: the tables' bytes
        # then grow with the traffic while their rows stay bounded
        autovacuum = conn.execute("SHOW autovacuum").fetchone()[0]  # type: ignore[index]
        return {
            "postgres_autovacuum": autovacuum,
            "jobs_past_retention": one(
                "SELECT count(*) FROM jobs WHERE finished_at < now() - make_interval(secs => %s)",
                config.job_retention_s + margin),
            "results_past_retention": one(
                "SELECT count(*) FROM jobs WHERE result_expired_at IS NULL AND "
                "finished_at < now() - make_interval(secs => %s)",
                config.result_retention_s + margin),
            "batches_past_retention": one(
                "SELECT count(*) FROM batches WHERE coalesce(completed_at, failed_at, "
                "expired_at, cancelled_at) < now() - make_interval(secs => %s)",
                config.batch_retention_s + config.job_retention_s + margin),
            "iterations_past_retention": one(
                "SELECT count(*) FROM iterations WHERE time < now() - make_interval(secs => %s)",
                config.iteration_retention_s + margin),
            "files_without_expiry": one("SELECT count(*) FROM files WHERE expires_at IS NULL"),
            "files_past_expiry": one(
                "SELECT count(*) FROM files WHERE expires_at < now() - interval '120 seconds'"),
            "open_jobs": one("SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')"),
            "open_batches": one("SELECT count(*) FROM batches WHERE status NOT IN "
                                "('completed', 'failed', 'expired', 'cancelled')"),
            "webhooks_pending": one(
                "SELECT count(*) FROM api_jobs WHERE webhook_state = 'pending'"),
            "webhooks_over_max_attempts": one(
                "SELECT count(*) FROM api_jobs WHERE webhook_attempts > 3"),
        }


def bounds(report: SoakReport, config: SoakConfig) -> list[str]:
    """Every bound the run broke, in words (empty: none)."""
    broken = [f"API error: {e}" for e in report.errors]
    f = report.final
    for key in ("jobs_past_retention", "results_past_retention", "batches_past_retention",
                "iterations_past_retention", "files_without_expiry", "files_past_expiry",
                "open_jobs", "open_batches", "webhooks_pending", "webhooks_over_max_attempts"):
        if f.get(key):
            broken.append(f"{key}: {f[key]}")
    if report.webhooks.get("twice_accepted"):
        broken.append(f"webhooks delivered twice: {report.webhooks['twice_accepted']}")
    if f.get("staging_files"):
        broken.append(f"staging files left: {f['staging_files']}")
    if f.get("redis_stream_entries", 0) > 0:
        broken.append(f"Redis stream entries left after the drain: {f['redis_stream_entries']}")
    traffic = [s for s in report.samples if s.get("phase") == "traffic"]
    if len(traffic) >= 4:
        warm = traffic[len(traffic) // 4]  # after start-up (imports, caches, pools)
        for name in (k for k in warm if k.startswith("fds_") and not k.endswith("_tree")):
            top = max(s[name] for s in report.samples[report.samples.index(warm):])
            if top > warm[name] + 64:
                broken.append(f"{name}: {warm[name]} open after start-up, up to {top} later")
    return broken


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=3600.0, help="seconds of traffic")
    p.add_argument("--sample-every", type=float, default=60.0)
    p.add_argument("--rate", type=float, default=3.0, help="client actions per second")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--job-retention", type=float, default=600.0, help="seconds")
    p.add_argument("--out", type=Path, default=Path("out/soak"))
    args = p.parse_args(argv)
    r = args.job_retention
    config = SoakConfig(duration_s=args.duration, sample_every_s=args.sample_every,
                        actions_per_s=args.rate, seed=args.seed, result_retention_s=r / 2,
                        job_retention_s=r, batch_retention_s=r * 1.5,
                        iteration_retention_s=r, retention_interval_s=max(5.0, r / 10),
                        drain_s=300.0, out=args.out)
    report = run_soak(config)
    n = len(report.samples)
    marks = [report.samples[int(i * (n - 1) / 6)]["t"] for i in range(7)] if n else []
    print(table(report.samples, marks))
    print(json.dumps({"counts": report.counts, "statuses": report.statuses,
                      "webhooks": report.webhooks, "final": {
                          k: v for k, v in report.final.items() if not isinstance(v, dict)}},
                     indent=1))
    for v in report.violations:
        print("BOUND BROKEN:", v)
    return 1 if report.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
