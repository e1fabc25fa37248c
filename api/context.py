"""The resources one API (or control-plane) process holds: SQL engine, Redis, storage."""

from __future__ import annotations

from dataclasses import dataclass, field

import redis
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from api.grammar_check import GrammarChecker
from api.model_cache import ModelCache
from api.settings import Settings
from api.storage import Storage
from api.tokenizer import PromptCounter
from worker.engine.grammar_service import GrammarService
from worker.queue.keys import QueueKeys


@dataclass
class Context:
    """What routers and control-plane tasks use. Built by :func:`make_context`."""

    settings: Settings
    engine: Engine
    session_factory: sessionmaker[Session]
    redis: redis.Redis
    keys: QueueKeys
    storage: Storage
    read_session_factory: sessionmaker[Session] | None = None
    grammar: GrammarChecker = field(default_factory=GrammarChecker)  # started on first use
    models: ModelCache = field(default_factory=ModelCache)  # which models workers served
    # exact prompt tokens for the estimates (the tokenizer is read on first use)
    prompt_tokens: PromptCounter = field(default_factory=lambda: PromptCounter(None))

    @property
    def reads(self) -> sessionmaker[Session]:
        """Sessions for single-statement reads: autocommit, so no BEGIN/ROLLBACK round trips."""
        return self.read_session_factory or self.session_factory

    def close(self) -> None:
        """Release the connection pools and stop the grammar helper."""
        self.engine.dispose()
        self.redis.close()
        self.grammar.close()

    def check_structured(self, spec: dict[str, object] | None, *, patient: bool = False) -> None:
        """400 unless the grammar library compiles the constraint within the bound, 503
        when every compile slot stays busy (see grammar_check); ``patient``: a batch
        expansion, which waits for a slot instead."""
        if self.settings.grammar_check:
            self.grammar.check(spec, patient=patient)


def make_context(settings: Settings) -> Context:
    """Create the pools (no connection is opened until first use)."""
    from worker.queue.connection import make_redis
    from worker.store.db import make_engine, make_session_factory

    engine = make_engine(url=settings.database_url, pool_size=settings.db_pool_size)
    return Context(
        settings=settings,
        engine=engine,
        session_factory=make_session_factory(engine=engine),
        redis=make_redis(url=settings.redis_url),
        # a model's keys are keys.for_model(model); with a default model, keys.model is it
        keys=QueueKeys(prefix=settings.prefix, model=settings.default_model),
        storage=Storage(settings.storage_path),
        read_session_factory=make_session_factory(
            engine=engine.execution_options(isolation_level="AUTOCOMMIT")
        ),
        grammar=GrammarChecker(GrammarService(
            timeout_s=settings.grammar_timeout, max_concurrent=settings.grammar_concurrency,
            wait_s=settings.grammar_wait,
        )),
        prompt_tokens=PromptCounter(settings.tokenizer),
    )
