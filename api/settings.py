"""API settings, read from the environment (``INFLIGHT_*``, ``DATABASE_URL``, ``REDIS_URL``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from worker.queue.connection import is_cluster_url, redis_url
from worker.store.db import database_url


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def _env_days(name: str, default: float | None) -> float | None:
    """A retention period in days: unset or empty gives ``default``; ``none``, ``never``
    or a negative number keep forever (None); 0 acts at the next run after a job ends."""
    value = (os.environ.get(name) or "").strip().lower()
    if not value:
        return default
    if value in ("none", "never"):
        return None
    days = float(value)
    return None if days < 0 else days


def _env_aliases(name: str) -> dict[str, str]:
    """``NAME=MODEL`` pairs separated by commas (ValueError naming a pair without ``=``)."""
    out: dict[str, str] = {}
    for pair in (os.environ.get(name) or "").split(","):
        if not pair.strip():
            continue
        alias, sep, model = pair.partition("=")
        if not sep or not alias.strip() or not model.strip():
            raise ValueError(f"{name}: {pair.strip()!r} is not NAME=MODEL")
        out[alias.strip()] = model.strip()
    return out


@dataclass
class Settings:
    """Everything that shapes one API process (sizes in bytes, times in seconds)."""

    database_url: str = field(default_factory=lambda: database_url())
    redis_url: str = field(default_factory=lambda: redis_url())
    prefix: str = "inflight"  # Redis key prefix, shared with the workers
    storage_dir: str = "inflight-files"  # uploaded and generated files
    # Models (api.control.models): a request naming no model runs on ``default_model``
    # (else on the one model the live workers serve); a request naming a model no worker
    # served within ``model_recent`` seconds is a 404, unless it is declared in ``models``
    # (or is the default), which queues it for a worker to come.
    # ``model_aliases``: names clients send -> the model they run on ("*": any name no
    # worker serves), for clients written against another service's model names.
    default_model: str | None = None
    models: tuple[str, ...] = ()
    model_aliases: dict[str, str] = field(default_factory=dict)
    model_recent: float = 3600.0
    model_name: str = "inflight"  # ``model`` in answers of rows from before jobs had a model
    max_body_bytes: int = 1 << 20  # JSON request bodies
    max_file_bytes: int = 200 << 20  # uploads (OpenAI's limit)
    max_prompt_tokens: int = 32_768  # estimated; token-id prompts are counted exactly
    max_tokens_limit: int = 8_192  # upper bound of max_tokens
    max_batch_lines: int = 50_000  # OpenAI's limit per batch
    max_batch_line_bytes: int = 1 << 20  # one batch input line; a longer one fails alone
    db_pool_size: int = 10
    celery_eager: bool = True  # run control-plane tasks in-process (the embedded default)
    broker_url: str | None = None  # default: redis_url
    beat_interval: float = 5.0  # embedded mode: how often the in-process beat ticks (0: off)
    expand_chunk: int = 500  # batch lines per transaction + XADD pipeline
    max_queue_depth: int = 1_000_000  # entries per stream before 429 (0: no bound)
    expand_lease: float = 60.0  # an expansion not renewed (per chunk) this long is dead
    # expansion runs without a committed chunk, and finalize runs, before the batch fails
    expand_max_attempts: int = 5
    finalize_max_attempts: int = 5
    webhook_max_attempts: int = 6
    webhook_backoff: float = 2.0  # first retry after this long, doubling
    webhook_timeout: float = 5.0
    iteration_retention_days: float = 7.0
    # Finished jobs (retention beat task; None keeps forever): their request body and
    # result (text, choices, error detail) are cleared after the first, their rows deleted
    # after the second, which must not be shorter.
    job_result_retention_days: float | None = 30.0
    job_retention_days: float | None = 90.0
    # Ended batches (rows and expansion progress) whose jobs are gone are deleted after
    # this (None keeps forever); not shorter than job_retention_days.
    batch_retention_days: float | None = 365.0
    retention_chunk: int = 1_000  # jobs (or batches) per retention transaction
    retention_interval: float = 3600.0  # seconds between runs of the retention beat task
    reconcile_grace: float = 30.0
    worker_timeout: float = 30.0
    auth_cache_ttl: float = 30.0
    max_model_len: int | None = None  # the served model's context; when set, enforced here
    operator_key: str | None = None  # guards /metrics and /v1/workers; unset: they answer 403
    docs_enabled: bool = True  # /docs, /redoc and /openapi.json
    # Per-tenant quotas (0 turns one off); answered with 429 and Retry-After.
    quota_queued_jobs: int = 100_000  # jobs queued or running
    quota_jobs_per_minute: int = 6_000  # jobs submitted through POST /v1/jobs
    quota_open_batches: int = 100  # batches not yet ended
    quota_stored_bytes: int = 10 << 30  # bytes of uploaded files
    # Webhook destinations that resolve to loopback, private, link-local or multicast
    # addresses are refused unless their host is named here (exact host names or IPs).
    webhook_allow_hosts: tuple[str, ...] = ()
    webhook_total_timeout: float = 10.0  # one delivery, connect to last byte
    grammar_check: bool = True  # compile structured-output constraints at submission
    # one submission compile (a slower constraint is a 400 grammar_too_complex), helper
    # processes compiling at once, and how long a check waits for one (then 503)
    grammar_timeout: float = 5.0
    grammar_concurrency: int = 2
    grammar_wait: float = 1.0
    # POST /v1/chat/completions and /v1/completions: longest wait for the job (then 504
    # and the job is cancelled, unless the request detached it)
    completion_timeout: float = 600.0
    # Estimates (api/control/estimate.py): the checkpoint whose tokenizer counts prompt
    # tokens (a --model spec or a checkpoint directory on this machine; unset or absent:
    # the UTF-8 bound), and whether POST /v1/batches refuses a window the estimate cannot
    # meet (400 completion_window_unmeetable) or admits it all the same (best effort)
    tokenizer: str | None = "smollm2-135m"
    deadline_admission: bool = True

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Settings from the environment; keyword arguments win."""
        s = cls(
            prefix=os.environ.get("INFLIGHT_PREFIX", "inflight"),
            storage_dir=os.environ.get("INFLIGHT_STORAGE_DIR", "inflight-files"),
            model_name=os.environ.get("INFLIGHT_MODEL_NAME", "inflight"),
            default_model=os.environ.get("INFLIGHT_DEFAULT_MODEL") or None,
            models=tuple(
                m.strip() for m in os.environ.get("INFLIGHT_MODELS", "").split(",") if m.strip()
            ),
            model_aliases=_env_aliases("INFLIGHT_MODEL_ALIASES"),
            model_recent=_env_float("INFLIGHT_MODEL_RECENT", 3600.0),
            max_body_bytes=_env_int("INFLIGHT_MAX_BODY_BYTES", 1 << 20),
            max_file_bytes=_env_int("INFLIGHT_MAX_FILE_BYTES", 200 << 20),
            max_prompt_tokens=_env_int("INFLIGHT_MAX_PROMPT_TOKENS", 32_768),
            max_tokens_limit=_env_int("INFLIGHT_MAX_TOKENS_LIMIT", 8_192),
            max_batch_lines=_env_int("INFLIGHT_MAX_BATCH_LINES", 50_000),
            max_batch_line_bytes=_env_int("INFLIGHT_MAX_BATCH_LINE_BYTES", 1 << 20),
            db_pool_size=_env_int("INFLIGHT_DB_POOL_SIZE", 10),
            celery_eager=_env_bool("INFLIGHT_CELERY_EAGER", True),
            broker_url=os.environ.get("CELERY_BROKER_URL") or None,
            beat_interval=_env_float("INFLIGHT_BEAT_INTERVAL", 5.0),
            expand_chunk=_env_int("INFLIGHT_EXPAND_CHUNK", 500),
            expand_lease=_env_float("INFLIGHT_EXPAND_LEASE", 60.0),
            expand_max_attempts=_env_int("INFLIGHT_EXPAND_MAX_ATTEMPTS", 5),
            finalize_max_attempts=_env_int("INFLIGHT_FINALIZE_MAX_ATTEMPTS", 5),
            max_queue_depth=_env_int("INFLIGHT_MAX_QUEUE_DEPTH", 1_000_000),
            webhook_max_attempts=_env_int("INFLIGHT_WEBHOOK_MAX_ATTEMPTS", 6),
            webhook_backoff=_env_float("INFLIGHT_WEBHOOK_BACKOFF", 2.0),
            iteration_retention_days=_env_float("INFLIGHT_ITERATION_RETENTION_DAYS", 7.0),
            job_result_retention_days=_env_days("INFLIGHT_JOB_RESULT_RETENTION_DAYS", 30.0),
            job_retention_days=_env_days("INFLIGHT_JOB_RETENTION_DAYS", 90.0),
            batch_retention_days=_env_days("INFLIGHT_BATCH_RETENTION_DAYS", 365.0),
            retention_interval=_env_float("INFLIGHT_RETENTION_INTERVAL", 3600.0),
            max_model_len=_env_int("INFLIGHT_MAX_MODEL_LEN", 0) or None,
            operator_key=os.environ.get("INFLIGHT_OPERATOR_KEY") or None,
            docs_enabled=_env_bool("INFLIGHT_DOCS", True),
            quota_queued_jobs=_env_int("INFLIGHT_QUOTA_QUEUED_JOBS", 100_000),
            quota_jobs_per_minute=_env_int("INFLIGHT_QUOTA_JOBS_PER_MINUTE", 6_000),
            quota_open_batches=_env_int("INFLIGHT_QUOTA_OPEN_BATCHES", 100),
            quota_stored_bytes=_env_int("INFLIGHT_QUOTA_STORED_BYTES", 10 << 30),
            webhook_allow_hosts=tuple(
                h.strip().lower()
                for h in os.environ.get("INFLIGHT_WEBHOOK_ALLOW_HOSTS", "").split(",")
                if h.strip()
            ),
            webhook_total_timeout=_env_float("INFLIGHT_WEBHOOK_TOTAL_TIMEOUT", 10.0),
            grammar_check=_env_bool("INFLIGHT_GRAMMAR_CHECK", True),
            grammar_timeout=_env_float("INFLIGHT_GRAMMAR_TIMEOUT", 5.0),
            grammar_concurrency=_env_int("INFLIGHT_GRAMMAR_CONCURRENCY", 2),
            grammar_wait=_env_float("INFLIGHT_GRAMMAR_WAIT", 1.0),
            completion_timeout=_env_float("INFLIGHT_COMPLETION_TIMEOUT", 600.0),
            tokenizer=os.environ.get("INFLIGHT_TOKENIZER", "smollm2-135m") or None,
            deadline_admission=_env_bool("INFLIGHT_DEADLINE_ADMISSION", True),
        )
        for name, value in overrides.items():
            if value is not None:
                setattr(s, name, value)
        s.check()
        return s

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Refuse settings that contradict each other (ValueError naming them)."""
        if not self.celery_eager and not self.broker_url and is_cluster_url(self.redis_url):
            raise ValueError(
                "REDIS_URL names a Redis Cluster, which Celery cannot use as its broker: set "
                "CELERY_BROKER_URL (a single Redis or another broker) for INFLIGHT_CELERY_EAGER=0"
            )
        result, row = self.job_result_retention_days, self.job_retention_days
        if row is not None and (result is None or row < result):
            raise ValueError(
                f"INFLIGHT_JOB_RETENTION_DAYS ({row}) must be at least "
                f"INFLIGHT_JOB_RESULT_RETENTION_DAYS ({'never' if result is None else result}): "
                "a finished job's row cannot go before its result does"
            )
        batch, jobs = self.batch_retention_days, self.job_retention_days
        if batch is not None and jobs is not None and batch < jobs:
            raise ValueError(
                f"INFLIGHT_BATCH_RETENTION_DAYS ({batch}) must be at least "
                f"INFLIGHT_JOB_RETENTION_DAYS ({jobs}): "
                "an ended batch's row cannot go before its jobs do"
            )

    @property
    def celery_broker(self) -> str:
        """Celery's broker: CELERY_BROKER_URL, else REDIS_URL (an in-memory one for the
        embedded, eager control plane when REDIS_URL is a cluster: nothing is sent)."""
        if self.broker_url:
            return self.broker_url
        return "memory://" if is_cluster_url(self.redis_url) else self.redis_url

    @property
    def declared_models(self) -> frozenset[str]:
        """The models requests may name while no worker serves them (queued for one)."""
        default = {self.default_model} if self.default_model else set()
        return frozenset(self.models) | default | set(self.model_aliases.values())

    @property
    def storage_path(self) -> Path:
        """The storage directory as a Path."""
        return Path(self.storage_dir)
