"""Worker configuration: one dataclass, filled from flags and environment by the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from worker.engine.grammar_service import DEFAULT_TIMEOUT_S
from worker.service.model_info import model_id_for


@dataclass
class WorkerConfig:
    """Everything that shapes one worker process (times in seconds unless named _ms)."""

    database_url: str
    redis_url: str
    model: str = "smollm2-135m"
    # the model id clients name, the streams it reads (``{prefix:<id>}:jobs:...``) and what
    # it registers; None: the --model spec, or a local path's name (model_info.model_id_for)
    served_model_name: str | None = None
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    name: str | None = None  # consumer name; None: the host name (first free of host, host-1, ...)
    prefix: str = "inflight"  # Redis key prefix
    group: str = "workers"
    prefetch: int = 4  # jobs read beyond what the engine can admit now, so slots never idle
    # past this many deliveries a job is dead-lettered even without proof it is the poison:
    # room for the bisection of a full batch of suspects (256 -> 1 in 8 halvings, plus one)
    max_deliveries: int = 10
    claim_idle_ms: int = 60_000  # entries idle this long belong to a dead worker
    claim_interval: float = 5.0
    heartbeat_interval: float = 2.0
    lock_ttl: float = 15.0  # consumer-name lock; a kill -9 frees the name after this long
    reconcile_interval: float = 30.0
    reconcile_grace: float = 30.0  # jobs queued more recently than this are left to the producer
    worker_timeout: float = 30.0  # a worker silent this long is dead (for the reconciler)
    trim_interval: float = 30.0
    cancel_poll_interval: float = 0.2
    trace_flush_interval: float = 1.0  # step traces alone are committed at most this often
    trace_flush_rows: int = 256  # ... or once this many are buffered
    drain_timeout: float = 30.0  # SIGTERM: finish in-flight work for at most this long
    write_traces: bool = True
    max_unwritten: int = 10_000  # stop reading while this many results wait for the store
    # one structured-output grammar compile, in the intake's helper process; a job whose
    # grammar takes longer fails alone (worker.service.grammars)
    grammar_timeout: float = DEFAULT_TIMEOUT_S

    @property
    def model_id(self) -> str:
        """The id of the model this worker serves (``served_model_name``, else the spec's)."""
        return self.served_model_name or model_id_for(self.model)
