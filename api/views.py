"""Rows to JSON objects (OpenAI shapes for files, batches and models; the job object is
ours)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from worker.protocol.openai_batch import (
    CHAT_ENDPOINT,
    Sample,
    build_response_body,
    choice_from_stored,
    split_stored,
)
from worker.store.crud.served_models import ServedModel
from worker.store.crud.usage import UsageTotals
from worker.store.models import ApiJob, Batch, Job, StoredFile


def epoch(ts: datetime | None) -> int | None:
    """Seconds since the epoch (OpenAI's timestamps), or None."""
    return int(ts.timestamp()) if ts is not None else None


def _epoch_f(ts: datetime | None) -> float | None:
    return round(ts.timestamp(), 6) if ts is not None else None


def response_body(job: Job, *, model_name: str) -> dict[str, Any] | None:
    """The OpenAI response body of a succeeded job (None otherwise), from what the worker
    stored: every sample, with logprobs where the request asked for them. Rows written
    before samples were stored give choice 0 from their text. The request is not parsed.
    None too once retention cleared the result (``result_expired_at``)."""
    if job.status != "succeeded" or job.result_expired_at is not None:
        return None
    endpoint, body = split_stored(job.request)
    if job.choices:
        samples = [choice_from_stored(c) for c in job.choices]
    else:
        samples = [Sample(text=job.text or "", finish_reason=job.finish_reason)]
    return build_response_body(
        is_chat=endpoint == CHAT_ENDPOINT,
        request_id=job.id,
        model=job_model(job, body, model_name),
        choices=samples,
        prompt_tokens=job.prompt_tokens or 0,
        completion_tokens=job.completion_tokens or 0,
        created=epoch(job.finished_at) or 0,
        with_logprobs=any(c.logprobs is not None for c in samples),
    )


def job_model(job: Job, body: dict[str, Any], model_name: str) -> str:
    """The model a job ran on: its row's (every job since revision 0014), else, for an
    older row, the model its request named, else ``model_name``."""
    return job.model or str(body.get("model") or model_name)


def usage(job: Job) -> dict[str, int] | None:
    """Token usage, once known."""
    if job.prompt_tokens is None and job.completion_tokens is None:
        return None
    p, c = job.prompt_tokens or 0, job.completion_tokens or 0
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def job_usage(job: Job) -> dict[str, Any] | None:
    """The job object's usage: the tokens, the prompt tokens the prefix cache served
    (``prompt_tokens_details.cached_tokens``, as OpenAI's) and the job's engine-seconds
    (its share of the wall time of the engine steps it computed in); null until known."""
    tokens = usage(job)
    if tokens is None:
        return None
    return {
        **tokens,
        "prompt_tokens_details": {"cached_tokens": job.cached_tokens or 0},
        "engine_seconds": job.engine_seconds,
    }


def job_view(
    job: Job, *, model_name: str, meta: ApiJob | None = None, full: bool = True,
    request: tuple[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The job object: status, timeline, result and usage. ``request``: the stored request
    as (endpoint, body) when the caller has it in hand (a submission), else split here."""
    endpoint, body = request or split_stored(job.request)
    out: dict[str, Any] = {
        "id": job.id,
        "object": "job",
        "status": job.status,
        "endpoint": endpoint,
        "custom_id": job.custom_id,
        "batch_id": job.batch_id,
        "priority": job.priority,
        "queue_class": job.queue_class,
        "deadline": epoch(job.deadline),
        "model": job_model(job, body, model_name),
        "created_at": epoch(job.queued_at),
        "timeline": {
            "queued_at": _epoch_f(job.queued_at),
            "started_at": _epoch_f(job.started_at),
            "first_token_at": _epoch_f(job.first_token_at),
            "finished_at": _epoch_f(job.finished_at),
        },
        "attempts": job.attempts,
        "metadata": body.get("metadata"),
        "user": body.get("user"),
        "worker_id": job.worker_id,
        "isolation": job.isolation,
        "usage": job_usage(job),
        "error": (
            {"message": job.error, "type": "job_error", "code": job.status} if job.error else None
        ),
        # when retention cleared the request body and result (then ``result`` and
        # ``error`` are null however the job ended); null while they are stored
        "result_expired_at": epoch(job.result_expired_at),
    }
    if full:
        out["result"] = response_body(job, model_name=model_name)
        out["engine_steps"] = (
            {"first": job.first_step, "last": job.last_step} if job.first_step is not None else None
        )
    if meta is not None:
        out["callback_url"] = meta.callback_url
        out["webhook"] = (
            {
                "state": meta.webhook_state,
                "attempts": meta.webhook_attempts,
                "last_error": meta.webhook_error,
            }
            if meta.callback_url
            else None
        )
    return out


def file_view(row: StoredFile) -> dict[str, Any]:
    """The OpenAI File object."""
    return {
        "id": row.id,
        "object": "file",
        "bytes": row.bytes,
        "created_at": epoch(row.created_at),
        "filename": row.filename,
        "purpose": row.purpose,
        "status": "processed",
        "expires_at": epoch(row.expires_at),
    }


def usage_view(totals: UsageTotals) -> dict[str, Any]:
    """OpenAI's usage object of a batch (``input_tokens``, ``output_tokens``,
    ``total_tokens`` and their details: the prompt tokens the prefix cache served as
    ``cached_tokens``; ``reasoning_tokens`` 0, as the engine tells no reasoning apart),
    plus ``engine_seconds`` (the jobs' shares of the engine steps' wall time)."""
    return {
        "input_tokens": totals.input_tokens,
        "input_tokens_details": {"cached_tokens": totals.cached_tokens},
        "output_tokens": totals.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": totals.input_tokens + totals.output_tokens,
        "engine_seconds": round(totals.engine_seconds, 6),
    }


def batch_view(
    batch: Batch, counts: dict[str, int] | None = None, usage: UsageTotals | None = None
) -> dict[str, Any]:
    """The OpenAI Batch object; ``counts`` overrides the stored request counts, ``usage``
    the usage stored when it was finalized (null until then, unless given)."""
    if usage is None and batch.usage is not None:
        usage = UsageTotals.from_dict(batch.usage)
    c = counts or {
        "total": batch.request_total,
        "completed": batch.request_completed,
        "failed": batch.request_failed,
    }
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "model": batch.model,
        "errors": ({"object": "list", "data": batch.errors} if batch.errors else None),
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": epoch(batch.created_at),
        "in_progress_at": epoch(batch.in_progress_at),
        "expires_at": epoch(batch.expires_at),
        "finalizing_at": epoch(batch.finalizing_at),
        "completed_at": epoch(batch.completed_at),
        "failed_at": epoch(batch.failed_at),
        "expired_at": epoch(batch.expired_at),
        "cancelling_at": epoch(batch.cancelling_at),
        "cancelled_at": epoch(batch.cancelled_at),
        "request_counts": c,
        "metadata": batch.metadata_,
        "output_expires_after": (
            {"anchor": "created_at", "seconds": batch.output_expires_after}
            if batch.output_expires_after
            else None
        ),
        "retry_of": batch.retry_of,
        "usage": usage_view(usage) if usage is not None else None,
        # re-estimated by the beat while it runs (api/control/estimate.py); null when no
        # live worker's throughput is known
        "estimated_completion_at": epoch(batch.estimated_completion_at),
        "callback_url": batch.callback_url,
        "webhook": (
            {"state": batch.webhook_state, "attempts": batch.webhook_attempts,
             "last_error": batch.webhook_error}
            if batch.callback_url else None
        ),
    }


def model_view(model: ServedModel, *, worker_ids: bool = False) -> dict[str, Any]:
    """The OpenAI Model object, plus what the workers serving it registered: architecture
    (``architectures[0]``), ``model_type``, ``dtype``, ``max_model_len``, how many live
    workers serve it and when one of them was last seen. Worker ids name hosts, so only
    operators see them (``worker_ids=True``: ``inflight models``, ``/v1/workers``)."""
    view: dict[str, Any] = {
        "id": model.id,
        "object": "model",
        "created": epoch(model.created),
        "owned_by": "inflight",
        "architecture": model.architecture,
        "model_type": model.model_type,
        "dtype": model.dtype,
        "max_model_len": model.max_model_len,
        "num_workers": len(model.workers),
        "last_seen_at": epoch(model.last_seen),
    }
    if worker_ids:
        view["workers"] = model.workers
    return view


def model_list_view(models: list[ServedModel], *, worker_ids: bool = False) -> dict[str, Any]:
    """The OpenAI model list."""
    return {"object": "list", "data": [model_view(m, worker_ids=worker_ids) for m in models]}
