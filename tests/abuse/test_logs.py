"""No prompt or result text in logs: a failed statement's error, which is what gets
logged, carries no bound parameters."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import IntegrityError

pytestmark = pytest.mark.services

SECRET = "the-patients-name-is-jane-doe"


def test_failed_commit_error_hides_bound_values(api_db_url: str) -> None:
    from worker.store.crud.job_status import create_jobs
    from worker.store.db import make_engine, make_session_factory
    from worker.store.schemas import NewJob

    engine = make_engine(url=api_db_url)
    sf = make_session_factory(engine=engine)
    job = NewJob(request={"url": "/v1/completions", "body": {"prompt": SECRET}}, id="job-dup-1")
    try:
        with sf.begin() as s:
            create_jobs(session=s, jobs=[job])
        with pytest.raises(IntegrityError) as info, sf.begin() as s:
            create_jobs(session=s, jobs=[job])
        assert SECRET not in str(info.value)
        assert "hidden due to hide_parameters" in str(info.value)
    finally:
        from sqlalchemy import text

        with engine.begin() as conn:
            conn.execute(text("DELETE FROM jobs WHERE id = 'job-dup-1'"))
        engine.dispose()
