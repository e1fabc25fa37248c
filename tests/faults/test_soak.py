"""Soak: mixed traffic (jobs, webhooks to a local receiver, replays, cancels, refused
bodies, chat completions, batches with bad lines, batch cancels) against the real API,
worker, embedded control plane and beat, Redis and PostgreSQL, with short retention
settings (:mod:`benchmarks.soak`). Every bound must hold: nothing left open after the
drain, no row past its retention, no file without an owner, no staging file, no webhook
twice or past its attempts, no 5xx, every finished batch's lines each once in its files,
no descriptor leak.

The normal suite runs 45 s of traffic; ``make faults`` runs the hour
(``INFLIGHT_FAULT_SOAK_S=3600``, sampled every minute, figures and plot under
``INFLIGHT_FAULT_SOAK_OUT``, default ``out/soak``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.services

SOAK_S = float(os.environ.get("INFLIGHT_FAULT_SOAK_S", "45"))


@pytest.mark.timeout(SOAK_S + 1800)  # start-up, drain and the last retention run on top
def test_soak_stays_within_its_bounds(pg_available, redis_available, tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    from benchmarks.soak import SoakConfig, run_soak

    long = SOAK_S >= 600
    if long:  # the full run: retention in minutes, a sample a minute
        config = SoakConfig(duration_s=SOAK_S, sample_every_s=60.0, result_retention_s=300,
                            job_retention_s=600, batch_retention_s=900,
                            iteration_retention_s=600, retention_interval_s=60,
                            drain_s=300, out=Path(os.environ.get("INFLIGHT_FAULT_SOAK_OUT",
                                                                 "out/soak")))
    else:
        config = SoakConfig(duration_s=SOAK_S, sample_every_s=5.0, result_retention_s=5,
                            job_retention_s=10, batch_retention_s=15,
                            iteration_retention_s=10, retention_interval_s=3, drain_s=90,
                            out=tmp_path / "soak")
    report = run_soak(config)
    assert report.counts.get("jobs", 0) > 0 and report.counts.get("batches", 0) > 0
    assert report.webhooks["jobs_accepted"] > 0  # webhooks did reach the receiver
    assert report.final["rows_jobs"] < report.counts["jobs"]  # retention took ended rows
    assert report.violations == [], "\n".join(report.violations[:30])
