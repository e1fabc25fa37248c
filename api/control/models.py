"""Which model a request runs on: the rules of the submission path (``new_job``), the
batch routes and ``inflight enqueue``, in one place.

- A request that names a model runs on it when a worker served it within
  ``INFLIGHT_MODEL_RECENT`` seconds (live or not: a model whose workers restart keeps its
  traffic queued), or when the operator declared it (``INFLIGHT_MODELS``, or it is
  ``INFLIGHT_DEFAULT_MODEL``), which queues it for a worker to come. Any other name is a
  404 ``model_not_found`` that lists the models there are: nothing is queued that no
  worker would read. Unless the operator aliased it (``INFLIGHT_MODEL_ALIASES``,
  ``NAME=MODEL`` pairs; ``*=MODEL`` for every name no worker serves, for clients that send
  another service's model names): then it runs on that model, which its answers name.
- A request that names none runs on the deployment's default model:
  ``INFLIGHT_DEFAULT_MODEL`` when set, else the one model the live workers serve (else the
  one served recently or declared). Where there are several, it is a 400
  ``model_required``; where there is none, a 404 ``model_not_found``. A deployment of one
  model therefore keeps taking requests that name none, as before models were routed.
- The lines of a batch (and of ``inflight enqueue --model``) run on the batch's model: a
  line naming none runs on it, a line naming another is that line's 400 ``model_mismatch``
  (the batch goes on; OpenAI's batches are of one model too).
"""

from __future__ import annotations

from api.context import Context
from api.control.input_lines import first_line_model
from api.errors import ApiError, model_not_found
from worker.store.crud.served_models import ModelsSeen

_SHOWN = 10  # models named in an error message at most


def _seen(ctx: Context, wanted: str | None = None) -> ModelsSeen:
    s = ctx.settings
    return ctx.models.seen(ctx.reads, live_s=s.worker_timeout, recent_s=s.model_recent,
                           wanted=wanted)


def _listed(models: set[str] | frozenset[str]) -> str:
    names = sorted(models)
    shown = ", ".join(repr(m) for m in names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def known_models(ctx: Context) -> list[str]:
    """Every model requests may name now: served recently, or declared."""
    return sorted(_seen(ctx).recent | ctx.settings.declared_models)


def known_model(ctx: Context, model: str) -> bool:
    """Whether requests may name ``model``: declared, or served recently."""
    return model in ctx.settings.declared_models or model in _seen(ctx, model).recent


def default_model(ctx: Context) -> str:
    """The model a request that names none runs on (404 when there is none, 400 when it
    is not one model)."""
    s = ctx.settings
    if s.default_model:
        return s.default_model
    seen = _seen(ctx)
    for candidates in (seen.live, seen.recent | s.declared_models):
        if len(candidates) == 1:
            return next(iter(candidates))
        if len(candidates) > 1:
            raise ApiError(
                400,
                f"this deployment serves several models ({_listed(candidates)}) and no "
                "default one (INFLIGHT_DEFAULT_MODEL): name one in model",
                code="model_required",
                param="model",
            )
    raise ApiError(
        404,
        "the request names no model, no worker served one recently and no default model is "
        "set (INFLIGHT_DEFAULT_MODEL): name a model, or start a worker",
        code="model_not_found",
        param="model",
    )


def resolve_model(ctx: Context, named: str | None, *, batch_model: str | None = None) -> str:
    """The model a request naming ``named`` (None: none) runs on; ``batch_model``: the
    model of the batch it is a line of. Raises the ApiError the API answers."""
    if batch_model is not None:
        if named is None or named == batch_model:
            return batch_model
        raise ApiError(
            400,
            f"the line names model {named!r}; every line of this batch runs on "
            f"{batch_model!r} (a batch is of one model: give each model its own batch)",
            code="model_mismatch",
            param="model",
        )
    if named is None:
        return default_model(ctx)
    if known_model(ctx, named):
        return named
    aliases = ctx.settings.model_aliases
    if named in aliases or "*" in aliases:
        return aliases.get(named) or aliases["*"]
    there = _seen(ctx).live | ctx.settings.declared_models
    raise model_not_found(named, f"; served now: {_listed(there)}" if there else "")


def model_of_batch_file(ctx: Context, path: str) -> str:
    """The model of a batch whose input file is ``path``: the model its first request
    names, resolved as a request's is, or the default model where it names none."""
    named = first_line_model(path, max_bytes=ctx.settings.max_batch_line_bytes)
    try:
        return resolve_model(ctx, named)
    except ApiError as exc:
        exc.message = f"the batch's first request: {exc.message}"
        raise
