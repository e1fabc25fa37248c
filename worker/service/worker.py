"""The worker process: wires intake, engine loop, output writer and maintenance together."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis

from worker.protocol.request_error import InvalidRequestError
from worker.queue.connection import make_redis
from worker.queue.group import ensure_groups
from worker.queue.keys import QueueKeys
from worker.service.config import WorkerConfig
from worker.service.engine_api import EngineAPI
from worker.service.engine_health import EngineBroken
from worker.service.engine_loop import EngineLoop
from worker.service.flags import Flags
from worker.service.grammars import WorkerGrammars
from worker.service.intake import Intake
from worker.service.maintenance import Maintenance
from worker.service.model_info import describe_engine
from worker.service.naming import acquire_name, release_name
from worker.service.observe import JobObserver
from worker.service.retry import retry
from worker.service.runtime import WorkerRuntime
from worker.service.writer import OutputWriter
from worker.store.crud.workers import heartbeat, register_worker
from worker.store.db import make_engine, make_session_factory
from worker.store.models import WorkerStatus

log = logging.getLogger(__name__)


class EngineStartError(RuntimeError):
    """The worker's engine could not be built (bad model spec or engine arguments, an
    unreadable checkpoint); the message says which model and why."""


def default_engine_factory(config: WorkerConfig) -> EngineAPI:
    """Build the real engine (imports torch; only here, when a worker starts)."""
    from worker.engine import EngineArgs, LLMEngine

    return LLMEngine(EngineArgs(model=config.model, **config.engine_kwargs))


class WorkerProcess:
    """One worker process. ``run()`` returns the exit code: 0 after a clean drain, 1 after
    a second signal (stop at once), 2 when the engine loop failed, 3 when the engine broke
    (every held job was handed back unfailed)."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        engine_factory: Callable[[WorkerConfig], EngineAPI] | None = None,
        install_signals: bool = True,
    ) -> None:
        self.config = config
        self.engine_factory = engine_factory or default_engine_factory
        self.install_signals = install_signals
        self.flags = Flags()
        self.stats: dict[str, Any] = {}
        self.loop: EngineLoop | None = None
        self.writer: OutputWriter | None = None

    @property
    def results_written(self) -> int:
        """Job results committed to the store by this run so far (0 before it starts)."""
        return self.writer.written if self.writer is not None else 0

    def stop(self) -> None:
        """Ask the worker to drain (as SIGTERM does)."""
        self.flags.request_drain()

    def run(self) -> int:
        """Start everything, run the engine loop on this thread, shut down; exit code."""
        c = self.config
        if self.install_signals and threading.current_thread() is threading.main_thread():
            self.flags.install()
        t0 = time.monotonic()
        try:
            engine = self.engine_factory(c)
        except (InvalidRequestError, OSError) as exc:
            raise EngineStartError(f"could not load the model {c.model!r}: {exc}") from exc
        log.info("engine %s ready in %.1fs", c.model, time.monotonic() - t0)
        served = describe_engine(engine, c.model)  # what the workers row says it serves
        db = make_engine(url=c.database_url)
        session_factory = make_session_factory(engine=db)
        redis_client = make_redis(url=c.redis_url)
        keys = QueueKeys(prefix=c.prefix, group=c.group)
        try:  # Redis may be down (or restarting) as the worker starts: wait for it
            consumer, token = retry(
                lambda: acquire_name(
                    redis_client=redis_client,
                    keys=keys,
                    name=c.name,
                    ttl_s=c.lock_ttl,
                    stop=self.flags.draining,
                ),
                what="take a consumer name",
                stop=self.flags.draining,
            )
        except (InterruptedError, redis.RedisError):
            if not self.flags.draining.is_set():
                raise
            return 1 if self.flags.stop_now.is_set() else 0
        worker_id = f"{consumer}-{uuid.uuid4().hex[:8]}"
        log.info("worker %s (consumer %s) starting", worker_id, consumer)

        def _register() -> None:
            with session_factory.begin() as s:
                register_worker(
                    session=s,
                    worker_id=worker_id,
                    host=socket.gethostname(),
                    model=c.model,
                    pid=os.getpid(),
                    info=served,
                )

        retry(_register, what="register worker", stop=self.flags.draining)
        retry(lambda: ensure_groups(redis_client=redis_client, keys=keys),
              what="create the consumer groups", stop=self.flags.draining)

        rt = WorkerRuntime(
            config=c,
            worker_id=worker_id,
            consumer=consumer,
            keys=keys,
            redis=redis_client,
            session_factory=session_factory,
            flags=self.flags,
        )
        observer = JobObserver(worker_id, redis_client=redis_client, keys=keys)
        writer = OutputWriter(
            runtime=rt,
            observer=observer,
            trace_flush_interval=c.trace_flush_interval,
            trace_flush_rows=c.trace_flush_rows,
        )
        self.writer = writer
        intake: Intake | None = None
        loop = EngineLoop(
            engine=engine,
            runtime=rt,
            writer=writer,
            on_drain=lambda: intake.join(10) if intake else None,
            observer=observer,
        )
        self.loop = loop
        observer.attach(loop.counters)
        grammars = WorkerGrammars.for_engine(engine, timeout_s=c.grammar_timeout)
        intake = Intake(runtime=rt, writer=writer, loop=loop, grammars=grammars)
        maintenance = Maintenance(runtime=rt, lock_token=token, on_cancel=loop.request_cancel)
        writer.start()
        maintenance.start()
        intake.start()
        code = 0
        try:
            loop.run()
        except EngineBroken as exc:
            log.error("%s; exiting for the supervisor to restart this worker", exc)
            code = 3
        except Exception:
            log.exception("engine loop failed; unfinished jobs stay pending for another worker")
            code = 2
        finally:
            self.flags.request_drain()
            intake.join(10)
            if code == 3:
                loop.hand_back_all()  # what the intake delivered before it stopped
            if not self.flags.stop_now.is_set() and not writer.close(timeout=c.drain_timeout + 30):
                log.warning("writer did not finish; unwritten jobs stay pending in Redis")
            loop.deltas.close()
            grammars.close()
            maintenance.close()
            observer.detach()
            if self.flags.stop_now.is_set():
                code = code or 1
            try:
                with session_factory.begin() as s:
                    heartbeat(session=s, worker_id=worker_id, status=WorkerStatus.STOPPED.value)
                release_name(redis_client=redis_client, keys=keys, name=consumer, token=token)
            except Exception as exc:
                log.warning("could not record the stop: %s", exc)
            self.stats = {
                "worker_id": worker_id,
                "consumer": consumer,
                "received": intake.received,
                "replayed": intake.replayed,
                "claimed": intake.claimed,
                "skipped": intake.skipped,
                "dead_lettered": intake.dead_lettered,
                "finished": loop.counters.finished,
                "failed_early": loop.counters.failed,
                "written": writer.written,
                "handed_back": writer.handed_back,
                "transactions": writer.transactions,
                "steps": loop.counters.steps,
                "reconciled": maintenance.reconciled,
            }
            log.info("worker %s stopped: %s", worker_id, self.stats)
            redis_client.close()
            db.dispose()
        return code
