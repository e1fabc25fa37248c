"""The worker process in four steps: connect (load the engine, open the stores, take a
consumer name, register), build (the threads around one shared ``WorkerRuntime``), serve
(run the engine loop on this thread until it drains or fails) and shut down (hand back or
write out what is left, stop the threads, record the stop)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from sqlalchemy.engine import Engine

from worker.protocol.request_error import InvalidRequestError
from worker.queue.connection import make_redis
from worker.queue.group import ensure_groups
from worker.queue.keys import QueueKeys
from worker.service.config import WorkerConfig
from worker.service.engine_api import EngineAPI, EngineBroken
from worker.service.engine_loop import EngineLoop
from worker.service.grammars import WorkerGrammars
from worker.service.intake import Intake
from worker.service.maintenance import Maintenance, move_old_keys
from worker.service.model_info import describe_engine
from worker.service.naming import acquire_name, release_name
from worker.service.observe import JobObserver
from worker.service.process_control import Flags, retry
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


@dataclass
class Connected:
    """What ``connect`` brought up: the engine, the runtime every thread keeps, and the
    SQL engine behind the runtime's sessions (disposed at the end)."""

    engine: EngineAPI
    rt: WorkerRuntime
    db: Engine


@dataclass
class Threads:
    """What ``build`` made around one runtime, not yet started."""

    observer: JobObserver
    writer: OutputWriter
    loop: EngineLoop
    grammars: WorkerGrammars
    intake: Intake
    maintenance: Maintenance

    def start(self) -> None:
        """Start the writer first (the others put to it), then maintenance and intake."""
        self.writer.start()
        self.maintenance.start()
        self.intake.start()

    def summary(self, rt: WorkerRuntime) -> dict[str, Any]:
        """The run's totals (``WorkerProcess.stats``)."""
        return {
            "worker_id": rt.worker_id,
            "consumer": rt.consumer,
            "received": self.intake.received,
            "replayed": self.intake.replayed,
            "claimed": self.intake.claimed,
            "skipped": self.intake.skipped,
            "dead_lettered": self.intake.dead_lettered,
            "finished": self.loop.counters.finished,
            "failed_early": self.loop.counters.failed,
            "written": self.writer.written,
            "handed_back": self.writer.handed_back,
            "transactions": self.writer.transactions,
            "steps": self.loop.counters.steps,
            "reconciled": self.maintenance.reconciled,
        }


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
        """Connect, build the threads, serve until drained or stopped, shut down; the exit
        code."""
        conn = self._connect()
        if conn is None:  # stopped while it waited for Redis or for its consumer name
            return 1 if self.flags.stop_now.is_set() else 0
        threads = self._build(conn)
        code = 2  # if an interrupt ends the loop (raised on once shut down)
        try:
            code = self._serve(threads)
        finally:
            code = self._shut_down(conn, threads, code)
        return code

    # -- connect ---------------------------------------------------------------------------
    def _connect(self) -> Connected | None:
        """Load the engine, open the stores, take a consumer name and register this run;
        None when a stop came while Redis was away or the name was held."""
        c = self.config
        if self.install_signals and threading.current_thread() is threading.main_thread():
            self.flags.install()
        engine = self._load_engine()
        db = make_engine(url=c.database_url)
        redis_client = make_redis(url=c.redis_url)
        keys = QueueKeys(prefix=c.prefix, group=c.group, model=c.model_id)
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
            redis_client.close()
            db.dispose()
            return None
        rt = WorkerRuntime(
            config=c,
            worker_id=f"{consumer}-{uuid.uuid4().hex[:8]}",
            consumer=consumer,
            lock_token=token,
            keys=keys,
            redis=redis_client,
            session_factory=make_session_factory(engine=db),
            flags=self.flags,
        )
        log.info("worker %s (consumer %s) starting", rt.worker_id, consumer)
        self._register(rt, engine)
        return Connected(engine=engine, rt=rt, db=db)

    def _load_engine(self) -> EngineAPI:
        c = self.config
        t0 = time.monotonic()
        try:
            engine = self.engine_factory(c)
        except (InvalidRequestError, OSError) as exc:
            raise EngineStartError(f"could not load the model {c.model!r}: {exc}") from exc
        log.info("engine %s ready in %.1fs", c.model, time.monotonic() - t0)
        return engine

    def _register(self, rt: WorkerRuntime, engine: EngineAPI) -> None:
        """This run's ``workers`` row, with what its engine serves; the consumer groups."""
        served = describe_engine(engine, rt.config.model, rt.config.model_id)

        def register() -> None:
            with rt.session_factory.begin() as s:
                register_worker(
                    session=s,
                    worker_id=rt.worker_id,
                    host=socket.gethostname(),
                    model=rt.config.model,
                    pid=os.getpid(),
                    info=served,
                )

        retry(register, what="register worker", stop=self.flags.draining)
        retry(lambda: ensure_groups(redis_client=rt.redis, keys=rt.keys),
              what="create the consumer groups", stop=self.flags.draining)
        try:  # an upgrade's leftovers; retried before each reconcile if this fails
            retry(lambda: move_old_keys(rt), what="move the old Redis keys",
                  stop=self.flags.draining)
        except Exception as exc:
            log.warning("moving the old Redis keys failed: %s: %s", type(exc).__name__, exc)

    # -- build -----------------------------------------------------------------------------
    def _build(self, conn: Connected) -> Threads:
        """The threads around the runtime: the writer first (the others put to it), the
        engine loop, then the intake (which asks the loop what it wants) and maintenance
        (which hands the loop cancels)."""
        rt, engine = conn.rt, conn.engine
        observer = JobObserver(rt.worker_id, redis_client=rt.redis, keys=rt.keys)
        self.writer = writer = OutputWriter(runtime=rt, observer=observer)
        self.loop = loop = EngineLoop(runtime=rt, engine=engine, writer=writer, observer=observer)
        observer.attach(loop.counters)
        grammars = WorkerGrammars.for_engine(engine, timeout_s=rt.config.grammar_timeout)
        return Threads(
            observer=observer,
            writer=writer,
            loop=loop,
            grammars=grammars,
            intake=Intake(runtime=rt, writer=writer, loop=loop, grammars=grammars),
            maintenance=Maintenance(runtime=rt, on_cancel=loop.request_cancel),
        )

    # -- serve -----------------------------------------------------------------------------
    def _serve(self, threads: Threads) -> int:
        """Start the threads and run the engine loop on this one until it drains (0), fails
        (2) or finds the engine broken (3)."""
        threads.start()
        try:
            threads.loop.run()
        except EngineBroken as exc:
            log.error("%s; exiting for the supervisor to restart this worker", exc)
            return 3
        except Exception:
            log.exception("engine loop failed; unfinished jobs stay pending for another worker")
            return 2
        return 0

    # -- shut down -------------------------------------------------------------------------
    def _shut_down(self, conn: Connected, threads: Threads, code: int) -> int:
        """Stop taking work, hand back (engine broken) or write out what is left, stop the
        threads, record the stop and close the stores; the exit code (1 after a stop at
        once, unless the loop gave another)."""
        rt = conn.rt
        self.flags.request_drain()
        threads.intake.join(10)
        if code == 3:
            threads.loop.hand_back_all()  # what the intake delivered before it stopped
        drain_s = rt.config.drain_timeout + 30
        if not self.flags.stop_now.is_set() and not threads.writer.close(timeout=drain_s):
            log.warning("writer did not finish; unwritten jobs stay pending in Redis")
        threads.loop.deltas.close()
        threads.grammars.close()
        threads.maintenance.close()
        threads.observer.detach()
        if self.flags.stop_now.is_set():
            code = code or 1
        self._record_stop(rt)
        self.stats = threads.summary(rt)
        log.info("worker %s stopped: %s", rt.worker_id, self.stats)
        rt.redis.close()
        conn.db.dispose()
        return code

    @staticmethod
    def _record_stop(rt: WorkerRuntime) -> None:
        """Mark the ``workers`` row stopped and give the consumer name back (best effort)."""
        try:
            with rt.session_factory.begin() as s:
                heartbeat(session=s, worker_id=rt.worker_id, status=WorkerStatus.STOPPED.value)
            release_name(redis_client=rt.redis, keys=rt.keys, name=rt.consumer, token=rt.lock_token)
        except Exception as exc:
            log.warning("could not record the stop: %s", exc)
