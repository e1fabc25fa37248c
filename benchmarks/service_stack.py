"""A throwaway service for benchmarks: its own PostgreSQL database and Redis key prefix,
``inflight api`` and N ``inflight worker`` processes, all removed again at the end.

    with service_stack(model="tiny-llama", workers=2) as stack:
        client = stack.client()  # httpx.Client with the tenant's key
        ...
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


@dataclass
class ServiceStack:
    """What a running stack offers: its URLs, the tenant's key and the processes."""

    base_url: str
    api_key: str
    database_url: str
    redis_url: str
    prefix: str
    api: subprocess.Popen
    workers: list[subprocess.Popen] = field(default_factory=list)
    storage: Path | None = None  # the API's file storage directory

    def client(self, timeout: float = 60.0, api_key: str | None = None) -> httpx.Client:
        """An HTTP client for the API, authenticated as the stack's tenant (or with
        ``api_key``, another tenant's: ``new_api_key``)."""
        return httpx.Client(base_url=self.base_url, timeout=timeout,
                            headers={"Authorization": f"Bearer {api_key or self.api_key}"})


@contextlib.contextmanager
def throwaway_database(prefix: str = "inflight_bench") -> Iterator[str]:
    """A fresh PostgreSQL database on 127.0.0.1:5432 at the latest revision; its URL.
    Dropped afterwards (``WITH (FORCE)``, so lingering connections do not keep it)."""
    import psycopg

    from migrations.run import upgrade

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = f"postgresql://postgres@127.0.0.1:5432/{name}"
        upgrade(url=url)
        yield url
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def service_stack(*, model: str = "tiny-llama", workers: int = 1, api_workers: int = 1,
                  redis_url: str = "redis://127.0.0.1:6379/12", database_url: str | None = None,
                  beat_interval: float = 5.0, worker_args: tuple[str, ...] = (),
                  tenant: str = "bench", env: dict[str, str] | None = None,
                  log_dir: Path | None = None) -> Iterator[ServiceStack]:
    """Start the stack, wait until the API is ready, yield it; stop and remove everything
    on the way out (the database only if it was made here). ``env`` adds to the
    processes' environment (``INFLIGHT_*`` settings); with ``log_dir`` each process
    writes its output to ``<name>.log`` there."""
    from api.serve_thread import free_port

    prefix = f"inflight-bench-{uuid.uuid4().hex[:8]}"
    storage = Path(f"/tmp/{prefix}-files")
    procs: list[subprocess.Popen] = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
           "INFLIGHT_BEAT_INTERVAL": str(beat_interval), **(env or {})}
    database = (contextlib.nullcontext(database_url) if database_url is not None
                else throwaway_database())
    with database as db_url:
        try:
            key = _prepare_database(db_url, tenant)
            common = ["--database-url", db_url, "--redis-url", redis_url, "--prefix", prefix]
            port = free_port()
            procs.append(_start(["api", "--port", str(port), *common, "--storage-dir",
                                 str(storage), "--workers", str(api_workers), "--log-level",
                                 "warning"], env, log_dir, "api"))
            for i in range(workers):
                procs.append(_start(["worker", "--model", model, *common, "--name",
                                     f"bench-{i}", "--log-level", "WARNING", *worker_args], env,
                                    log_dir, f"worker-{i}"))
            stack = ServiceStack(base_url=f"http://127.0.0.1:{port}", api_key=key,
                                 database_url=db_url, redis_url=redis_url, prefix=prefix,
                                 api=procs[0], workers=procs[1:], storage=storage)
            _wait_ready(stack)
            yield stack
        finally:
            _stop(procs)
            _forget_keys(redis_url, prefix)
            shutil.rmtree(storage, ignore_errors=True)


def _start(args: list[str], env: dict[str, str], log_dir: Path | None = None,
           name: str = "") -> subprocess.Popen:
    if log_dir is None:
        return subprocess.Popen([sys.executable, "-m", "cli.main", *args], cwd=ROOT, env=env)
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"{name}.log", "ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-m", "cli.main", *args], cwd=ROOT, env=env,
                                stdout=log, stderr=subprocess.STDOUT)


def _prepare_database(db_url: str, tenant: str) -> str:
    """Migrate the database (a no-op when it is current) and return a new API key for
    ``tenant``."""
    from migrations.run import upgrade

    upgrade(url=db_url)
    return new_api_key(db_url, tenant)


def new_api_key(db_url: str, tenant: str) -> str:
    """A new API key for ``tenant`` in the stack's database."""
    from worker.store.crud.api_keys import create_api_key
    from worker.store.db import make_engine, make_session_factory

    engine = make_engine(url=db_url)
    try:
        with make_session_factory(engine=engine).begin() as s:
            _, key = create_api_key(session=s, tenant=tenant)
    finally:
        engine.dispose()
    return key


def _wait_ready(stack: ServiceStack, timeout: float = 600.0) -> None:
    """Until the API is ready and every worker serves its model (GET /v1/models counts it
    live): a request sent before would find no worker for its model (404). The first start
    on a machine builds the native kernels, hence the long timeout."""
    deadline = time.monotonic() + timeout
    with stack.client(timeout=5.0) as client:
        while True:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                if client.get("/readyz").status_code == 200:
                    served = client.get("/v1/models").json()["data"]
                    if sum(m.get("num_workers", 0) for m in served) >= len(stack.workers):
                        return
            for proc in (stack.api, *stack.workers):
                if proc.poll() is not None:
                    raise RuntimeError(f"a process of the stack exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError("the stack did not become ready (API, then every worker)")
            time.sleep(0.2)


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _forget_keys(redis_url: str, prefix: str) -> None:
    import redis

    from worker.queue.connection import make_redis
    from worker.queue.keys import QueueKeys
    from worker.queue.wipe import delete_deployment

    with contextlib.suppress(redis.RedisError):
        delete_deployment(redis_client=make_redis(url=redis_url), keys=QueueKeys(prefix=prefix))
